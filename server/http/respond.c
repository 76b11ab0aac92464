/*
 * server/http/respond.c: responses, and the one table from the statuses of the
 * engine, the tokenizer and the configuration to an HTTP status and an
 * OpenAI error. Every response of a request goes through here, which moves
 * the request to FINISHED.
 */
#include "http/error_json.h"
#include "http/http.h"
#include "tokenizer.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const http_status_map status_table[] = {
    {HTTP_SRC_ENG, ENG_EFULL, 429, "rate_limit_exceeded", "rate_limit_exceeded", 1},
    {HTTP_SRC_ENG, ENG_ETOOBIG, 400, "invalid_request_error", "context_length_exceeded", 0},
    {HTTP_SRC_ENG, ENG_EINVAL, 400, "invalid_request_error", NULL, 0},
    {HTTP_SRC_ENG, ENG_ENOMEM, 500, "server_error", NULL, 0},
    {HTTP_SRC_BPE, BPE_EUNKNOWN, 400, "invalid_request_error", NULL, 0},
    {HTTP_SRC_BPE, BPE_ETOOBIG, 400, "invalid_request_error", NULL, 0},
    {HTTP_SRC_BPE, BPE_ENOMEM, 500, "server_error", NULL, 0},
    {HTTP_SRC_CFG, CFG_ESYNTAX, 400, "invalid_request_error", NULL, 0},
    {HTTP_SRC_CFG, CFG_EKEY, 400, "invalid_request_error", NULL, 0},
    {HTTP_SRC_CFG, CFG_EVALUE, 400, "invalid_request_error", NULL, 0},
};

static const http_status_map status_other = {HTTP_SRC_ENG, 0, 500, "server_error", NULL, 0};

const http_status_map *http_status_of(http_src src, int code)
{
    for (size_t i = 0; i < sizeof status_table / sizeof status_table[0]; i++)
        if (status_table[i].src == src && status_table[i].code == code) return &status_table[i];
    return &status_other;
}

void http_resp_headers(const srv_req *r, struct MHD_Response *resp, unsigned status)
{
    MHD_add_response_header(resp, "X-Request-Id", r->req_id);
    if (r->origin[0] != '\0') {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->origin);
        MHD_add_response_header(resp, "Access-Control-Expose-Headers", "X-Request-Id, Retry-After");
        MHD_add_response_header(resp, "Vary", "Origin");
    }
    if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    if (status == 405) {
        char allow[128];
        http_route_allow(r->s->routes, r->s->nroutes, r->url, allow, sizeof allow);
        MHD_add_response_header(resp, "Allow", allow);
    }
}

enum MHD_Result http_send_preflight(srv_req *r)
{
    http_req_set_state(r, HTTP_REQ_FINISHED);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (resp == NULL) return MHD_NO;
    char allow[128];
    http_route_allow(r->s->routes, r->s->nroutes, r->url, allow, sizeof allow);
    MHD_add_response_header(resp, "Allow", allow);
    if (r->origin[0] != '\0') {
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", allow);
        MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                "Authorization, Content-Type, X-Request-Id");
        MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    }
    http_resp_headers(r, resp, 204);
    enum MHD_Result rc = MHD_queue_response(r->conn, 204, resp);
    MHD_destroy_response(resp);
    return rc;
}

enum MHD_Result http_send_json(srv_req *r, unsigned status, const char *body,
                               const char *retry_after)
{
    http_req_set_state(r, HTTP_REQ_FINISHED);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (resp == NULL) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    if (retry_after != NULL) MHD_add_response_header(resp, "Retry-After", retry_after);
    http_resp_headers(r, resp, status);
    enum MHD_Result rc = MHD_queue_response(r->conn, status, resp);
    MHD_destroy_response(resp);
    return rc;
}

enum MHD_Result http_send_error(srv_req *r, int status, const char *type, const char *code,
                                const char *param, const char *retry_after, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char msg[512], par[64]; /* the sizes of api/oai.h's oai_error: the same cuts */
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(par, sizeof par, "%s", param ? param : "");
    http_error_sanitize(msg);
    http_error_sanitize(par);
    char *js = http_error_json(type, code, par, msg);
    enum MHD_Result rc =
        http_send_json(r, (unsigned)status, js ? js : "{\"error\":{}}", retry_after);
    free(js);
    return rc;
}

enum MHD_Result http_send_status(srv_req *r, http_src src, int code, const char *param,
                                 const char *msg)
{
    const http_status_map *m = http_status_of(src, code);
    char ra[16];
    if (m->retry) http_retry_after(r->s, ra, sizeof ra);
    /* A server's failure names no parameter of the request. */
    return http_send_error(r, m->http, m->type, m->ecode, m->http >= 500 ? NULL : param,
                           m->retry ? ra : NULL, "%s", msg);
}

enum MHD_Result http_send_obj(srv_req *r, json_t *obj)
{
    char *js = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (js == NULL)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    enum MHD_Result rc = http_send_json(r, 200, js, NULL);
    free(js);
    return rc;
}

/* The time the queue ahead needs at the measured step rate, at least a
 * second, at most a minute. */
void http_retry_after(const srv *s, char *buf, size_t len)
{
    double step = s->load_step_s > 0 ? s->load_step_s : 0.05;
    double secs = (double)(s->load_queued + 1) * step * 16;
    if (secs < 1) secs = 1;
    if (secs > 60) secs = 60;
    snprintf(buf, len, "%.0f", secs);
}
