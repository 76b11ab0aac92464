/*
 * server/daemon/probes.c: the small GET routes: /health, /ready, /v1/models,
 * /v1/models/{id}, /version and /metrics (the page metrics.c renders, with
 * the process's numbers gathered here).
 */
#include "daemon/daemon.h"
#include "server.h"
#include "version.h"

#include <ctype.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#ifndef GPT2D_BUILD_VERSION
#define GPT2D_BUILD_VERSION "dev"
#endif
#ifndef GPT2D_BUILD_TYPE
#define GPT2D_BUILD_TYPE "unknown"
#endif
#ifndef GPT2D_BUILD_SANITIZE
#define GPT2D_BUILD_SANITIZE "unknown"
#endif

const char *srv_version(void)
{
    return GPT2D_BUILD_VERSION;
}

const char *srv_commit(void)
{
    return GPT2D_COMMIT[0] != '\0' && GPT2D_COMMIT[0] != '@' ? GPT2D_COMMIT : "unknown";
}

const char *srv_buildtype(void)
{
    return GPT2D_BUILD_TYPE;
}

void srv_print_version(void)
{
    printf("gpt2d %s (%s, %s)\n", srv_version(), srv_commit(), srv_buildtype());
}

enum MHD_Result probe_health(srv_req *r)
{
    return http_send_json(r, 200, "{\"status\":\"ok\"}", NULL);
}

enum MHD_Result probe_ready(srv_req *r)
{
    return r->s->api->draining ? http_send_json(r, 503, "{\"status\":\"draining\"}", NULL)
                               : http_send_json(r, 200, "{\"status\":\"ready\"}", NULL);
}

/* Who made a served checkpoint: its gpt2d.owned_by, else gpt2d. */
static const char *model_owner(const eng_model *m)
{
    const char *o = eng_model_about(m)->owned_by;
    return o[0] != '\0' ? o : "gpt2d";
}

/* One model object, OpenAI's shape, with gpt2d's `dtype` and `layout` (the
 * weights' format and layout), `kernels` (the kernel path they take on this
 * CPU), `weights` (random, trained or unknown), `description`
 * (srv_model_description) and `max_model_len` (its context, vLLM's name);
 * id is the name asked for. */
static json_t *model_json(const eng_model *m, const char *id)
{
    char d[sizeof eng_model_about(m)->description + 64];
    srv_model_description(m, d, sizeof d);
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:s, s:s, s:s, s:s, s:I}", "id", id, "object",
                     "model", "created", (json_int_t)0, "owned_by", model_owner(m), "dtype",
                     eng_model_dtype(m), "layout", eng_model_layout(m), "kernels",
                     eng_model_kernels(m), "weights", eng_model_about(m)->weights, "description", d,
                     "max_model_len", (json_int_t)eng_model_config(m)->n_ctx);
}

/* A LoRA adapter's model object: vLLM's shape, parent the base's id. */
static json_t *adapter_json(const srv *s, const adp_entry *e, const char *id)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:s, s:I, s:I}", "id", id, "object", "model",
                     "created", (json_int_t)0, "owned_by", model_owner(s->api->model), "parent",
                     s->cfg.model_name, "kind", "lora", "rank", (json_int_t)eng_adapter_rank(e->a),
                     "max_model_len", (json_int_t)eng_model_config(s->api->model)->n_ctx);
}

enum MHD_Result probe_models(srv_req *r)
{
    const srv_api *a = r->s->api;
    json_t *o = json_pack("{s:s, s:[o]}", "object", "list", "data",
                          model_json(a->model, r->s->cfg.model_name));
    json_t *data = json_object_get(o, "data");
    for (size_t i = 1; o != NULL && i < a->nckpt; i++)
        json_array_append_new(data, model_json(a->ckpt[i].model, a->ckpt[i].name));
    for (size_t i = 0; o != NULL && i < adp_count(r->s); i++) {
        const adp_entry *e = adp_at(r->s, i);
        json_array_append_new(data, adapter_json(r->s, e, e->name));
    }
    return http_send_obj(r, o);
}

enum MHD_Result probe_model(srv_req *r)
{
    static const char prefix[] = "/v1/models/";
    /* The route sees the path as sent: %XX-decode the id (a NUL or a bad
     * escape is no model's name). */
    const char *raw = r->url + sizeof prefix - 1;
    char id[sizeof r->s->cfg.model_names[0]];
    size_t n = 0;
    int ok = 1;
    for (const char *p = raw; *p != '\0' && ok; p++) {
        unsigned v = (unsigned char)*p;
        if (*p == '%') {
            ok = isxdigit((unsigned char)p[1]) && isxdigit((unsigned char)p[2]);
            if (!ok) break;
            char hex[3] = {p[1], p[2], '\0'};
            v = (unsigned)strtoul(hex, NULL, 16);
            p += 2;
        }
        ok = v != 0 && n + 1 < sizeof id;
        if (ok) id[n++] = (char)v;
    }
    id[n] = '\0';
    if (!ok) {
        snprintf(id, sizeof id, "%.100s", raw);
        return http_send_error(r, 404, "invalid_request_error", "model_not_found", "model", NULL,
                               "The model '%s' does not exist; this server serves '%s'", id,
                               r->s->cfg.model_name);
    }
    const srv_ckpt *c = ckpt_find(r->s, id);
    const adp_entry *e = c != NULL ? NULL : adp_find(r->s, id);
    if (c == NULL && e == NULL) /* the words of adp_pick's 404 */
        return http_send_error(r, 404, "invalid_request_error", "model_not_found", "model", NULL,
                               "The model '%s' does not exist; this server serves '%s'%s", id,
                               r->s->cfg.model_name, ckpt_others_words(r->s));
    return http_send_obj(r, e != NULL ? adapter_json(r->s, e, id) : model_json(c->model, id));
}

enum MHD_Result probe_version(srv_req *r)
{
    const srv *s = r->s;
    char d[sizeof eng_model_about(s->api->model)->description + 64];
    srv_model_description(s->api->model, d, sizeof d);
    json_t *o =
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "version",
                  srv_version(), "commit", srv_commit(), "buildtype", srv_buildtype(), "sanitize",
                  GPT2D_BUILD_SANITIZE, "kernels", eng_model_kernels(s->api->model), "model",
                  s->cfg.model_name, "dtype", eng_model_dtype(s->api->model), "layout",
                  eng_model_layout(s->api->model), "tls", tls_built() ? "gnutls" : "none", "scheme",
                  s->tls != NULL ? "https" : "http", "owned_by", model_owner(s->api->model),
                  "weights", eng_model_about(s->api->model)->weights, "description", d);
    return http_send_obj(r, o);
}

/* The process's numbers for /metrics (Linux /proc; -1 where unknown). */
static void process_info(const srv *s, met_info *info)
{
    info->version = srv_version();
    info->commit = srv_commit();
    info->buildtype = srv_buildtype();
    info->kernels = eng_model_kernels(s->api->model);
    info->tls = tls_built() ? "gnutls" : "none";
    info->model = s->cfg.model_name;
    info->dtype = eng_model_dtype(s->api->model);
    info->layout = eng_model_layout(s->api->model);
    info->start_time = s->daemon->started_wall;
    info->responses_stored = rs_count(s->api->resp_store);
    info->responses_store_bytes = rs_bytes(s->api->resp_store);
    gram_cache_usage(s->api->gcache, &info->structured_cache_entries,
                     &info->structured_cache_bytes);
    struct rusage ru;
    info->cpu_seconds = getrusage(RUSAGE_SELF, &ru) == 0
                            ? (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6
                                  + (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6
                            : -1;
    info->resident_bytes = info->virtual_bytes = -1;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f != NULL) {
        unsigned long long size, resident;
        if (fscanf(f, "%llu %llu", &size, &resident) == 2) {
            double page = (double)sysconf(_SC_PAGESIZE);
            info->virtual_bytes = (double)size * page;
            info->resident_bytes = (double)resident * page;
        }
        fclose(f);
    }
    info->open_fds = -1;
    DIR *d = opendir("/proc/self/fd");
    if (d != NULL) {
        double n = 0;
        while (readdir(d) != NULL) n++;
        closedir(d);
        info->open_fds = n - 3; /* ".", ".." and the directory's own descriptor */
    }
    struct rlimit rl;
    info->max_fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                        ? (double)rl.rlim_cur
                        : -1;
}

/* GET /metrics: Prometheus text format. */
enum MHD_Result probe_metrics(srv_req *r)
{
    met_info info;
    process_info(r->s, &info);
    size_t nl = adp_count(r->s);
    const char **names = calloc(nl + 1, sizeof *names);
    uint64_t *reqs = calloc(nl + 1, sizeof *reqs);
    size_t *running = calloc(nl + 1, sizeof *running), *bytes = calloc(nl + 1, sizeof *bytes);
    for (size_t i = 0; names && reqs && running && bytes && i < nl; i++) {
        const adp_entry *e = adp_at(r->s, i);
        names[i] = e->name;
        reqs[i] = e->requests;
        running[i] = eng_adapter_users(e->a);
        bytes[i] = eng_adapter_bytes(e->a);
    }
    info.nlora = names && reqs && running && bytes ? nl : 0;
    info.lora_name = names;
    info.lora_requests = reqs;
    info.lora_running = running;
    info.lora_bytes = bytes;
    const srv_api *a = r->s->api;
    const char *mnames[SRV_MAX_CKPT];
    eng_sched_stats mstats[SRV_MAX_CKPT];
    uint64_t mreqs[SRV_MAX_CKPT];
    size_t mbytes[SRV_MAX_CKPT];
    for (size_t i = 0; i < a->nckpt; i++) {
        mnames[i] = ckpt_name(r->s, &a->ckpt[i]);
        eng_sched_stats_get(a->ckpt[i].sched, &mstats[i]);
        mreqs[i] = a->ckpt[i].requests;
        mbytes[i] = eng_model_weight_bytes(a->ckpt[i].model);
    }
    info.nmodels = a->nckpt;
    info.model_name = mnames;
    info.model_stats = mstats;
    info.model_requests = mreqs;
    info.model_weight_bytes = mbytes;
    char *buf;
    size_t len;
    int failed = met_render(&r->s->met, &r->s->api->met, &info, &buf, &len);
    free(names);
    free(reqs);
    free(running);
    free(bytes);
    if (failed != 0)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    http_req_set_state(r, HTTP_REQ_FINISHED);
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(buf);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4");
    http_resp_headers(r, resp, 200);
    enum MHD_Result rc = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    return rc;
}
