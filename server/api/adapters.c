/*
 * server/api/adapters.c: LoRA adapters by name (issue 36). The table of
 * resident adapters (srv_api.adapters: lora_modules' at start-up and after
 * SIGHUP, and those POST /v1/load_lora_adapter loaded), a request's
 * `model` resolved to the base or one of them (adp_pick), and vLLM's load
 * and unload routes.
 *
 * A name is served plain, as vLLM serves it ("pirate"), and also as
 * "<base name>:<adapter>" ("gpt2d-tiny:pirate"). An adapter is an engine
 * object with a reference count (eng_adapter): the table holds one, a
 * request that picked it one (its cmpl_job, until it is freed) and each
 * engine sequence one, so unloading takes it out of the table at once and
 * the sequences that use it finish with it.
 *
 * Loading reads and validates the folder on libuv's work queue
 * (uv_queue_work: the loop thread keeps serving; a step runs on another
 * of its threads), and the route's connection is suspended meanwhile.
 * lora_path must resolve, symbolic links followed (realpath), inside
 * lora_dir, as must the two files read from it.
 */
#include "api/api.h"
#include "errbuf.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* A load on the work queue: from the route (r) or from lora_modules (r
 * NULL: start-up's are synchronous, SIGHUP's are not). */
struct adp_job {
    uv_work_t w;
    srv *s;
    srv_req *r;
    const eng_model *model;
    size_t max_rank;
    int from_config;
    char name[CFG_LORA_NAME_MAX];
    char path[CFG_STR_MAX];
    /* The result: */
    eng_adapter *a;
    eng_status st;
    int status; /* the route's HTTP status */
    int done;   /* route_after ran (a resume before it: the shutdown's) */
    char err[512];
    double seconds;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

size_t adp_count(const srv *s)
{
    return s->api->nadapters;
}

const adp_entry *adp_at(const srv *s, size_t i)
{
    return s->api->adapters[i];
}

/* The entry named name (plain, or "<base name>:<adapter>"), or NULL. */
static adp_entry *find(const srv *s, const char *name)
{
    const char *colon = strrchr(name, ':');
    if (colon != NULL) {
        char base[sizeof s->cfg.model_name];
        size_t n = (size_t)(colon - name);
        if (n >= sizeof base) return NULL;
        memcpy(base, name, n);
        base[n] = '\0';
        if (!cfg_model_name_ok(&s->cfg, base)) return NULL;
        name = colon + 1;
    }
    for (size_t i = 0; i < s->api->nadapters; i++)
        if (strcmp(s->api->adapters[i]->name, name) == 0) return s->api->adapters[i];
    return NULL;
}

const adp_entry *adp_find(const srv *s, const char *name)
{
    return find(s, name);
}

int adp_pick(srv_req *r, const char *model, enum MHD_Result *rc)
{
    srv *s = r->s;
    if (model == NULL || cfg_model_name_ok(&s->cfg, model)) {
        s->api->ckpt[0].requests++;
        return 1;
    }
    srv_ckpt *c = ckpt_find(s, model); /* another checkpoint */
    if (c != NULL) {
        r->cmpl->ckpt = c;
        snprintf(r->cmpl->model, sizeof r->cmpl->model, "%s", c->name);
        c->requests++;
        return 1;
    }
    adp_entry *e = find(s, model);
    if (e == NULL) {
        *rc = http_send_error(r, 404, "invalid_request_error", "model_not_found", "model", NULL,
                              "The model '%s' does not exist; this server serves '%s'%s", model,
                              s->cfg.model_name, ckpt_others_words(s));
        return 0;
    }
    r->cmpl->adapter = eng_adapter_ref(e->a); /* job_free drops it */
    snprintf(r->cmpl->model, sizeof r->cmpl->model, "%s", e->name);
    e->requests++;
    s->api->ckpt[0].requests++; /* its base's */
    return 1;
}

const char *adp_model_name(const srv_req *r)
{
    return r->cmpl != NULL && r->cmpl->model[0] != '\0' ? r->cmpl->model : r->s->cfg.model_name;
}

/* Takes a's entry out of the table; the sequences using it keep it. */
static void remove_at(srv *s, size_t i)
{
    srv_api *api = s->api;
    adp_entry *e = api->adapters[i];
    eng_adapter_free(e->a);
    free(e);
    memmove(api->adapters + i, api->adapters + i + 1,
            (api->nadapters - i - 1) * sizeof *api->adapters);
    api->nadapters--;
}

static size_t index_of(const srv *s, const char *name)
{
    for (size_t i = 0; i < s->api->nadapters; i++)
        if (strcmp(s->api->adapters[i]->name, name) == 0) return i;
    return SIZE_MAX;
}

/* Puts j's adapter in the table under j's name (replacing one of that
 * name: a SIGHUP that changed its folder); 0, or -1 with j->err. */
static int install(srv *s, struct adp_job *j)
{
    srv_api *api = s->api;
    size_t at = index_of(s, j->name);
    if (at == SIZE_MAX && api->nadapters >= s->cfg.max_loras) {
        j->status = 400;
        snprintf(j->err, sizeof j->err,
                 "%zu LoRA adapters are loaded, the limit (max_loras); unload one first",
                 api->nadapters);
        return -1;
    }
    adp_entry *e = calloc(1, sizeof *e);
    if (e == NULL) {
        j->status = 500;
        snprintf(j->err, sizeof j->err, "out of memory");
        return -1;
    }
    snprintf(e->name, sizeof e->name, "%s", j->name);
    snprintf(e->path, sizeof e->path, "%s", j->path);
    e->a = j->a;
    j->a = NULL;
    e->from_config = j->from_config;
    e->load_seconds = j->seconds;
    if (at != SIZE_MAX) {
        eng_adapter_free(api->adapters[at]->a);
        free(api->adapters[at]);
        api->adapters[at] = e;
    } else {
        api->adapters[api->nadapters++] = e;
    }
    return 0;
}

/* The load itself, wherever it runs: reads and validates, checks the rank. */
static void load(struct adp_job *j)
{
    double t0 = now_s();
    j->st = eng_adapter_load(j->model, j->path, ENG_ADAPTER_F32, &j->a, j->err, sizeof j->err);
    if (j->st == ENG_OK && eng_adapter_rank(j->a) > j->max_rank) {
        snprintf(j->err, sizeof j->err, "%.300s: rank %zu is above max_lora_rank %zu", j->path,
                 eng_adapter_rank(j->a), j->max_rank);
        eng_adapter_free(j->a);
        j->a = NULL;
        j->st = ENG_EFORMAT;
    }
    j->status = j->st == ENG_OK ? 200 : j->st == ENG_ENOMEM ? 500 : 400;
    j->seconds = now_s() - t0;
}

static void work_cb(uv_work_t *w)
{
    load(w->data);
}

static struct adp_job *job_new(srv *s, const char *name, const char *path, int from_config)
{
    struct adp_job *j = calloc(1, sizeof *j);
    if (j == NULL) return NULL;
    j->s = s;
    j->model = s->api->model;
    j->max_rank = s->cfg.max_lora_rank;
    j->from_config = from_config;
    snprintf(j->name, sizeof j->name, "%s", name);
    snprintf(j->path, sizeof j->path, "%s", path);
    j->w.data = j;
    return j;
}

static void job_free(struct adp_job *j)
{
    if (j == NULL) return;
    eng_adapter_free(j->a);
    free(j);
}

static void log_loaded(const struct adp_job *j, const char *why)
{
    const adp_entry *e = NULL;
    for (size_t i = 0; i < j->s->api->nadapters; i++)
        if (strcmp(j->s->api->adapters[i]->name, j->name) == 0) e = j->s->api->adapters[i];
    if (e == NULL) return;
    log_line("info",
             "%s: LoRA adapter '%s' loaded from %s (rank %zu, scaling %g, %.1f MiB, %.0f ms)", why,
             e->name, e->path, eng_adapter_rank(e->a), (double)eng_adapter_scaling(e->a),
             (double)eng_adapter_bytes(e->a) / 1048576.0, e->load_seconds * 1e3);
}

/* ---- lora_modules: start-up and SIGHUP ------------------------------------ */

int adp_start(srv *s, char *err, size_t errlen)
{
    size_t n = 0;
    cfg_lora_module *mods = calloc(s->cfg.max_loras, sizeof *mods);
    if (mods == NULL) return ERRBUF_FAIL(err, errlen, -1, "out of memory");
    if (cfg_lora_modules_parse(s->cfg.lora_modules, mods, s->cfg.max_loras, &n, err, errlen)
        != CFG_OK) {
        free(mods);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        struct adp_job *j = job_new(s, mods[i].name, mods[i].dir, 1);
        if (j == NULL) {
            free(mods);
            return ERRBUF_FAIL(err, errlen, -1, "out of memory");
        }
        load(j);
        if (j->st != ENG_OK || install(s, j) != 0) {
            errbuf_set(err, errlen, "lora_modules: %s: %s", mods[i].name, j->err);
            job_free(j);
            free(mods);
            return -1;
        }
        log_loaded(j, "lora_modules");
        job_free(j);
    }
    free(mods);
    return 0;
}

static void reload_after(uv_work_t *w, int status)
{
    struct adp_job *j = w->data;
    srv *s = j->s;
    s->api->adp_loading--;
    if (status != 0 || j->st != ENG_OK)
        log_line("error", "SIGHUP: LoRA adapter '%s' not loaded from %s: %s", j->name, j->path,
                 status != 0 ? "cancelled" : j->err);
    else if (install(s, j) != 0)
        log_line("error", "SIGHUP: LoRA adapter '%s' not loaded: %s", j->name, j->err);
    else
        log_loaded(j, "SIGHUP");
    job_free(j);
}

void adp_reload(srv *s)
{
    size_t n = 0;
    char err[512];
    cfg_lora_module *mods = calloc(s->cfg.max_loras, sizeof *mods);
    if (mods == NULL
        || cfg_lora_modules_parse(s->cfg.lora_modules, mods, s->cfg.max_loras, &n, err, sizeof err)
               != CFG_OK) {
        log_line("error", "SIGHUP: lora_modules unchanged: %s", mods ? err : "out of memory");
        free(mods);
        return;
    }
    /* lora_modules' adapters no longer listed go; those loaded by the
     * route stay. */
    for (size_t i = s->api->nadapters; i-- > 0;) {
        const adp_entry *e = s->api->adapters[i];
        int listed = 0;
        for (size_t k = 0; k < n && !listed; k++) listed = strcmp(mods[k].name, e->name) == 0;
        if (e->from_config && !listed) {
            log_line("info", "SIGHUP: LoRA adapter '%s' unloaded (no longer in lora_modules)",
                     e->name);
            remove_at(s, i);
        }
    }
    /* New names, and names whose folder changed, load off the loop. */
    for (size_t k = 0; k < n; k++) {
        const adp_entry *e = find(s, mods[k].name);
        if (e != NULL && strcmp(e->path, mods[k].dir) == 0) continue;
        struct adp_job *j = job_new(s, mods[k].name, mods[k].dir, 1);
        if (j == NULL || uv_queue_work(s->loop, &j->w, work_cb, reload_after) != 0) {
            log_line("error", "SIGHUP: LoRA adapter '%s' not loaded: cannot queue it",
                     mods[k].name);
            job_free(j);
            continue;
        }
        s->api->adp_loading++;
    }
    free(mods);
}

void adp_free_all(srv *s)
{
    while (s->api->nadapters > 0) remove_at(s, s->api->nadapters - 1);
}

/* ---- POST /v1/load_lora_adapter, POST /v1/unload_lora_adapter -------------- */

static void route_free(srv_req *r)
{
    job_free(r->adp);
    r->adp = NULL;
}

static const srv_req_ops adp_ops = {.free = route_free};

/* 404 unless lora_dir is set: the routes are off. */
static enum MHD_Result off(srv_req *r)
{
    return http_send_error(r, 404, "invalid_request_error", "not_found", NULL, NULL,
                           "Loading and unloading LoRA adapters at run time is off on this "
                           "server (lora_dir is not set)");
}

/* The body's string member key, or NULL (*rc: the 400). */
static const char *body_string(srv_req *r, json_t *body, const char *key, enum MHD_Result *rc)
{
    const json_t *v = json_object_get(body, key);
    if (!json_is_string(v)) {
        *rc = http_send_error(r, 400, "invalid_request_error", NULL, key, NULL,
                              "'%s' must be a string", key);
        return NULL;
    }
    return json_string_value(v);
}

static json_t *parse_body(srv_req *r, enum MHD_Result *rc)
{
    json_t *body = r->body ? json_loadb(r->body, r->body_len, JSON_REJECT_DUPLICATES, NULL) : NULL;
    if (!json_is_object(body)) {
        json_decref(body);
        *rc = http_send_error(r, 400, "invalid_request_error", NULL, NULL, NULL,
                              "The body must be a JSON object");
        return NULL;
    }
    return body;
}

/* Where path resolves (symbolic links followed): 1 inside root (itself
 * resolved), 0 outside or unreadable, -1 nowhere (no such file); the
 * resolved path in out. */
static int where(const char *root, const char *path, char *out)
{
    errno = 0;
    if (realpath(path, out) == NULL) return errno == ENOENT ? -1 : 0;
    size_t n = strlen(root);
    return strcmp(root, "/") == 0
           || (strncmp(out, root, n) == 0 && (out[n] == '\0' || out[n] == '/'));
}

static enum MHD_Result load_answer(srv_req *r)
{
    struct adp_job *j = r->adp;
    if (!j->done) /* resumed by the shutdown while the load still ran */
        return http_send_error(r, 503, "server_error", "server_shutting_down", NULL, NULL,
                               "The server is shutting down; the LoRA adapter was not loaded");
    if (j->status != 200)
        return http_send_error(r, j->status, "invalid_request_error", NULL, "lora_path", NULL, "%s",
                               j->err);
    const adp_entry *e = find(r->s, j->name);
    char msg[160];
    snprintf(msg, sizeof msg, "Success: LoRA adapter '%s' added successfully.", j->name);
    json_t *o =
        json_pack("{s:s, s:s, s:I, s:f}", "message", msg, "lora_name", j->name, "rank",
                  (json_int_t)(e ? eng_adapter_rank(e->a) : 0), "load_ms", j->seconds * 1e3);
    if (o == NULL) return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "no memory");
    return http_send_obj(r, o);
}

static void route_after(uv_work_t *w, int status)
{
    struct adp_job *j = w->data;
    srv *s = j->s;
    srv_req *r = j->r;
    s->api->adp_loading--;
    j->done = 1;
    if (status != 0) {
        j->status = 503;
        snprintf(j->err, sizeof j->err, "the load was cancelled (shutting down)");
    } else if (j->st == ENG_OK && index_of(s, j->name) != SIZE_MAX) { /* loaded meanwhile */
        j->status = 400;
        snprintf(j->err, sizeof j->err, "The LoRA adapter '%s' is already loaded; unload it first",
                 j->name);
    } else if (j->st == ENG_OK && install(s, j) == 0) {
        log_loaded(j, "POST /v1/load_lora_adapter");
    }
    http_resume(r); /* load_answer, if the client is still there */
    http_req_release(r);
    loop_mhd_run(s);
}

enum MHD_Result adp_route_load(srv_req *r)
{
    srv *s = r->s;
    if (s->cfg.lora_dir[0] == '\0') return off(r);
    enum MHD_Result rc;
    json_t *body = parse_body(r, &rc);
    if (body == NULL) return rc;
    const char *name = body_string(r, body, "lora_name", &rc);
    const char *path = name ? body_string(r, body, "lora_path", &rc) : NULL;
    char root[PATH_MAX], full[PATH_MAX + CFG_STR_MAX], real[PATH_MAX], file[PATH_MAX + 64];
    if (path == NULL) goto done;
    if (!cfg_lora_name_ok(name) || ckpt_find(s, name) != NULL) {
        rc = http_send_error(r, 400, "invalid_request_error", NULL, "lora_name", NULL,
                             "'%.100s' is not an adapter name (1 to %d letters, digits, '.', '_' "
                             "and '-', not the model's name)",
                             name, CFG_LORA_NAME_MAX - 1);
        goto done;
    }
    if (find(s, name) != NULL) {
        rc = http_send_error(r, 400, "invalid_request_error", NULL, "lora_name", NULL,
                             "The LoRA adapter '%s' is already loaded; unload it first", name);
        goto done;
    }
    if (s->api->nadapters + s->api->adp_loading >= s->cfg.max_loras) {
        rc = http_send_error(r, 400, "invalid_request_error", NULL, "lora_name", NULL,
                             "%zu LoRA adapters are loaded or loading, the limit (max_loras); "
                             "unload one first",
                             s->api->nadapters + s->api->adp_loading);
        goto done;
    }
    /* A relative lora_path is under lora_dir; either way it must resolve
     * there, and so must the two files the load reads. */
    if (realpath(s->cfg.lora_dir, root) == NULL) {
        rc = http_send_error(r, 500, "server_error", NULL, NULL, NULL,
                             "lora_dir cannot be resolved: %s", strerror(errno));
        goto done;
    }
    snprintf(full, sizeof full, "%s%s%s", path[0] == '/' ? "" : s->cfg.lora_dir,
             path[0] == '/' ? "" : "/", path);
    struct stat st;
    int ok = where(root, full, real) == 1 && stat(real, &st) == 0 && S_ISDIR(st.st_mode);
    for (int f = 0; ok && f < 2; f++) {
        char fr[PATH_MAX];
        snprintf(file, sizeof file, "%s/%s", real, f ? LORA_WEIGHTS_FILE : LORA_CONFIG_FILE);
        ok = where(root, file, fr) != 0; /* missing: the load says so */
    }
    if (!ok) {
        rc = http_send_error(r, 400, "invalid_request_error", NULL, "lora_path", NULL,
                             "lora_path '%.200s' is not a folder inside lora_dir (symbolic links "
                             "are followed)",
                             path);
        goto done;
    }
    struct adp_job *j = job_new(s, name, real, 0);
    if (j == NULL) {
        rc = http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
        goto done;
    }
    j->r = r;
    r->adp = j;
    r->ops = &adp_ops;
    if (uv_queue_work(s->loop, &j->w, work_cb, route_after) != 0) {
        rc = http_send_error(r, 500, "server_error", NULL, NULL, NULL, "cannot queue the load");
        goto done;
    }
    s->api->adp_loading++;
    http_req_hold(r); /* route_after releases it */
    http_req_set_state(r, HTTP_REQ_TOKENIZING);
    http_suspend(r, load_answer);
    rc = MHD_YES;
done:
    json_decref(body);
    return rc;
}

enum MHD_Result adp_route_unload(srv_req *r)
{
    srv *s = r->s;
    if (s->cfg.lora_dir[0] == '\0') return off(r);
    enum MHD_Result rc;
    json_t *body = parse_body(r, &rc);
    if (body == NULL) return rc;
    const char *name = body_string(r, body, "lora_name", &rc);
    if (name != NULL) {
        size_t at = index_of(s, name);
        if (at == SIZE_MAX) {
            rc = http_send_error(r, 404, "invalid_request_error", "model_not_found", "lora_name",
                                 NULL, "No LoRA adapter named '%.100s' is loaded", name);
        } else {
            size_t users = eng_adapter_users(s->api->adapters[at]->a);
            char msg[200];
            snprintf(msg, sizeof msg, "Success: LoRA adapter '%s' removed successfully.", name);
            log_line("info",
                     "LoRA adapter '%s' unloaded (%zu requests and sequences using it finish "
                     "with it)",
                     name, users);
            remove_at(s, at);
            rc = http_send_obj(
                r, json_pack("{s:s, s:I}", "message", msg, "in_use", (json_int_t)users));
        }
    }
    json_decref(body);
    return rc;
}
