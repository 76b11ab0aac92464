/*
 * server/probes.c: the small GET routes: /health, /ready, /v1/models and
 * /metrics (the page metrics.c renders).
 */
#include "internal.h"

#include <stdlib.h>

enum MHD_Result probe_health(srv_req *r)
{
    return http_send_json(r, 200, "{\"status\":\"ok\"}", NULL);
}

enum MHD_Result probe_ready(srv_req *r)
{
    return r->s->draining ? http_send_json(r, 503, "{\"status\":\"draining\"}", NULL)
                          : http_send_json(r, 200, "{\"status\":\"ready\"}", NULL);
}

enum MHD_Result probe_models(srv_req *r)
{
    json_t *o = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id",
                          r->s->cfg.model_name, "object", "model", "created", (json_int_t)0,
                          "owned_by", "gpt2d");
    return http_send_obj(r, o);
}

/* GET /metrics: Prometheus text format. */
enum MHD_Result probe_metrics(srv_req *r)
{
    eng_sched_stats st;
    eng_sched_stats_get(r->s->sched, &st);
    char *buf;
    size_t len;
    if (met_render(&r->s->met, &st, &buf, &len) != 0)
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
