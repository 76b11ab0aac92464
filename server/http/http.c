/*
 * server/http/http.c: a request's life on its connection. libmicrohttpd calls
 * on_request first with the headers (the head phase), then with each piece
 * of the body, then once with none (dispatch through the route table), and
 * again each time a suspended connection is resumed (the continuation set
 * before it was suspended runs). on_completed ends it: the access line,
 * the route's closed hook (a client that goes away cancels what runs for
 * it), and the connection's reference released (req.c).
 */
#include "http/http.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* X-Request-Id: the client's when sane (1-128 printable ASCII bytes, no
 * space), else one of ours. */
static void set_request_id(srv_req *r)
{
    const char *v = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "X-Request-Id");
    if (http_request_id_ok(v)) {
        snprintf(r->req_id, sizeof r->req_id, "%s", v);
        return;
    }
    snprintf(r->req_id, sizeof r->req_id, "req-%llx%06llx", (unsigned long long)r->created,
             (unsigned long long)(r->s->next_id & 0xFFFFFF));
}

/* MHD_get_connection_values: keeps the last X-Forwarded-For field (a
 * proxy that adds a field of its own, rather than appending to the
 * client's, leaves the client's first). */
static enum MHD_Result last_xff(void *cls, enum MHD_ValueKind kind, const char *key,
                                const char *value)
{
    (void)kind;
    if (value != NULL && strcasecmp(key, "X-Forwarded-For") == 0) *(const char **)cls = value;
    return MHD_YES;
}

/* The client's address into r->client: the peer's, or, when the peer is a
 * trusted proxy, the rightmost X-Forwarded-For entry that is not itself a
 * trusted proxy (the entries left of it are the client's word, not the
 * proxy's), in the last X-Forwarded-For field. An entry that is not an
 * address ends the walk. */
static void set_client(srv_req *r)
{
    srv_conn *c = r->conn_rec;
    snprintf(r->client, sizeof r->client, "-");
    if (c == NULL || c->family == 0) return;
    int family = c->family;
    unsigned char addr[16];
    memcpy(addr, c->addr, sizeof addr);
    const char *xff = NULL;
    if (c->trusted) MHD_get_connection_values(r->conn, MHD_HEADER_KIND, last_xff, &xff);
    if (xff != NULL) {
        const cfg_config *cfg = &r->s->cfg;
        const char *end = xff + strlen(xff);
        while (end > xff) {
            const char *e = end;
            while (e > xff && (e[-1] == ' ' || e[-1] == '\t')) e--;
            const char *b = e;
            while (b > xff && b[-1] != ',') b--;
            const char *p = b;
            while (p < e && (*p == ' ' || *p == '\t')) p++;
            int f2;
            unsigned char a2[16];
            if (!conn_addr_parse(p, (size_t)(e - p), &f2, a2)) break;
            family = f2;
            memcpy(addr, a2, sizeof addr);
            if (!cfg_nets_contain(cfg->trusted_nets, cfg->n_trusted_nets, f2, a2)) break;
            end = b > xff ? b - 1 : b;
        }
    }
    conn_addr_text(family, addr, r->client, sizeof r->client);
    /* The tenant when no API key is configured: the client's address
     * (FNV-1a over the family and the address bytes); head_checks puts a
     * key's index in its place. */
    uint64_t h = UINT64_C(14695981039346656037) ^ (uint64_t)(unsigned)family;
    for (size_t i = 0; i < sizeof addr; i++) {
        h *= UINT64_C(1099511628211);
        h ^= addr[i];
    }
    r->tenant = h;
}

static enum MHD_Result count_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                 const char *value)
{
    (void)kind;
    size_t *n = cls;
    *n += strlen(key) + (value ? strlen(value) + 1 : 0) + 1; /* "key=value&" */
    return MHD_YES;
}

/* 414 or 431 in the JSON envelope for a head over our limits; MHD_YES when
 * it is within them. */
static enum MHD_Result head_size_checks(srv_req *r, const char *url)
{
    size_t target = strlen(url);
    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, count_arg, &target);
    if (target > SRV_MAX_TARGET)
        return http_send_error(r, 414, "invalid_request_error", NULL, NULL, NULL,
                               "The request target is %zu bytes; the limit is %u", target,
                               SRV_MAX_TARGET);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    if (ci != NULL && ci->header_size > SRV_MAX_HEAD)
        return http_send_error(r, 431, "invalid_request_error", NULL, NULL, NULL,
                               "The request head is %zu bytes; the limit is %u", ci->header_size,
                               SRV_MAX_HEAD);
    return MHD_YES;
}

/* A header value with a control byte (C0 other than HTAB, or DEL; a NUL
 * shows as a value shorter than libmicrohttpd measured it): RFC 9110 5.5
 * has no room for one, and a NUL would cut the value short for whoever
 * reads it as a C string (the API key). The first such header's name into
 * cls (a char[64]). */
static enum MHD_Result control_byte(void *cls, enum MHD_ValueKind kind, const char *key,
                                    size_t key_size, const char *value, size_t value_size)
{
    (void)kind;
    char *bad = cls;
    int found = value != NULL && strlen(value) != value_size;
    for (size_t i = 0; value != NULL && !found && i < value_size; i++) {
        unsigned char ch = (unsigned char)value[i];
        found = (ch < 0x20 && ch != '\t') || ch == 0x7F;
    }
    if (!found) return MHD_YES;
    log_escape(key, key_size < 40 ? key_size : 40, bad, 64);
    return MHD_NO;
}

/* MHD_get_connection_values: counts the Host headers into cls (unsigned). */
static enum MHD_Result count_host(void *cls, enum MHD_ValueKind kind, const char *key,
                                  const char *value)
{
    (void)kind;
    (void)value;
    if (strcasecmp(key, "Host") == 0) (*(unsigned *)cls)++;
    return MHD_YES;
}

typedef struct {
    unsigned n_length; /* Content-Length headers */
    int length_differs;
    const char *length;
    unsigned n_te; /* Transfer-Encoding headers */
    const char *te;
} framing;

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    (void)kind;
    framing *f = cls;
    if (value == NULL) value = "";
    if (strcasecmp(key, "Content-Length") == 0) {
        if (f->n_length++ > 0 && strcmp(f->length, value) != 0) f->length_differs = 1;
        f->length = value;
    } else if (strcasecmp(key, "Transfer-Encoding") == 0) {
        f->n_te++;
        f->te = value;
    }
    return MHD_YES;
}

/* A Host header that RFC 9112 3.2 says a server must answer 400: more
 * than one (libmicrohttpd would hand us the first, a proxy in front may
 * have routed by another), or none on HTTP/1.1 and later (HTTP/1.0 needs
 * none). Counted as a Host refusal, as allowed_hosts' 421; MHD_YES when
 * the Host is well formed. */
static enum MHD_Result host_checks(srv_req *r, const char *version)
{
    unsigned n = 0;
    MHD_get_connection_values(r->conn, MHD_HEADER_KIND, count_host, &n);
    if (n == 1 || (n == 0 && strcmp(version, MHD_HTTP_VERSION_1_0) == 0)) return MHD_YES;
    const char *what = n == 0 ? "an HTTP/1.1 request without Host" : "several Host headers";
    srv_conn *c = r->conn_rec;
    if (c != NULL)
        conn_note_refused(r->s, c->family, c->addr, MET_REFUSED_HOST, what);
    else
        met_count_refused(&r->s->met, MET_REFUSED_HOST);
    log_line("debug", "refused %s request_id=%s", what, r->req_id);
    if (n == 0)
        return http_send_error(r, 400, "invalid_request_error", NULL, NULL, NULL,
                               "An %s request needs a Host header", version);
    return http_send_error(r, 400, "invalid_request_error", NULL, NULL, NULL,
                           "The request has %u Host headers; it may have one", n);
}

/* What the head alone decides, before any body byte is read (and before
 * libmicrohttpd would send 100 Continue), after the head's size, in this
 * order: the body's
 * framing (RFC 9112 6.3: conflicting lengths are refused, not guessed), the
 * Host (one, or none on HTTP/1.0; then allowed_hosts), the Origin
 * (cors_origins), an OPTIONS preflight, the API key, the route, and a
 * declared length over max_body_bytes. MHD_YES with r still in HEAD: read
 * the body. */
static enum MHD_Result head_checks(srv_req *r, const char *method, const char *version)
{
    srv *s = r->s;
    char bad[64] = "";
    MHD_get_connection_values_n(r->conn, MHD_HEADER_KIND, control_byte, bad);
    if (bad[0] != '\0')
        return http_send_error(r, 400, "invalid_request_error", NULL, NULL, NULL,
                               "The header %s has a control byte in its value", bad);
    framing f = {0};
    MHD_get_connection_values(r->conn, MHD_HEADER_KIND, framing_header, &f);
    if (f.length_differs)
        return http_send_error(r, 400, "invalid_request_error", NULL, NULL, NULL,
                               "Conflicting Content-Length headers");
    if (f.n_te > 0 && f.n_length > 0)
        return http_send_error(r, 400, "invalid_request_error", NULL, NULL, NULL,
                               "Both Transfer-Encoding and Content-Length were sent");
    if (f.n_te > 1 || (f.n_te == 1 && strcasecmp(f.te, "chunked") != 0))
        return http_send_error(r, 501, "invalid_request_error", NULL, NULL, NULL,
                               "Transfer-Encoding '%s' is not supported (only chunked)",
                               f.n_te > 1 ? "(several headers)" : f.te);
    enum MHD_Result rc = host_checks(r, version);
    if (r->state != HTTP_REQ_HEAD) return rc;
    /* DNS rebinding: a page whose name now resolves to this server sends
     * its own name as Host (allowed_hosts). */
    const char *host = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Host");
    if (!http_host_allowed(s->cfg.allowed_hosts, s->bind_loopback, host)) {
        srv_conn *c = r->conn_rec;
        char esc[128];
        log_escape(host, strnlen(host, 60), esc, sizeof esc);
        if (c != NULL)
            conn_note_refused(s, c->family, c->addr, MET_REFUSED_HOST,
                              "a Host not in allowed_hosts");
        else
            met_count_refused(&s->met, MET_REFUSED_HOST);
        log_line("debug", "refused Host '%s' (allowed_hosts) request_id=%s", esc, r->req_id);
        return http_send_error(r, 421, "invalid_request_error", "host_not_allowed", NULL, NULL,
                               "Host '%.100s' is not served here (allowed_hosts)", host);
    }
    /* A browser's cross-origin request (or a DNS-rebound page) carries
     * Origin: refused unless cors_origins allows it. */
    const char *origin = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Origin");
    if (origin != NULL) {
        if (strlen(origin) >= sizeof r->origin
            || !(http_origin_allowed(s->cfg.cors_origins, origin)
                 || http_origin_same_host(origin, host)))
            return http_send_error(r, 403, "invalid_request_error", "origin_not_allowed", NULL,
                                   NULL, "Origin '%.200s' is not allowed (cors_origins)", origin);
        snprintf(r->origin, sizeof r->origin, "%s", origin);
    }
    /* A preflight carries no credentials: OPTIONS on a known path needs no
     * key. */
    if (strcmp(method, "OPTIONS") == 0 && r->route_result != HTTP_ROUTE_NOT_FOUND)
        return http_send_preflight(r);
    /* An unknown route needs a key too: a keyless client learns nothing. */
    int needs_key = r->route == NULL || r->route->needs_key;
    int key = needs_key ? http_key_ok(
                  &s->cfg, MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Authorization"))
                        : 0;
    if (needs_key && key == 0)
        return http_send_error(r, 401, "invalid_request_error", "invalid_api_key", NULL, NULL,
                               "Incorrect or missing API key (Authorization: Bearer ...)");
    /* Each key caches its prompts apart (docs/operations.md, tenants), owns
     * its stored responses whatever the cache does, and is a tenant: its
     * sequences are admitted fairly beside the other keys' (the engine sees
     * the key's index, never the key). */
    if (key > 0 && s->cfg.n_api_keys > 0) {
        r->key_id = http_key_salt(s->salt_secret, s->cfg.api_keys[key - 1]);
        r->tenant = (uint64_t)key;
        if (!s->cfg.prefix_cache_shared_across_keys) r->cache_tenant = r->key_id;
    }
    if (r->route_result == HTTP_ROUTE_NOT_FOUND)
        return http_send_error(r, 404, "invalid_request_error", NULL, NULL, NULL,
                               "Unknown route %s %s", r->method, r->url);
    if (r->route_result == HTTP_ROUTE_BAD_METHOD)
        return http_send_error(r, 405, "invalid_request_error", NULL, NULL, NULL,
                               "Method %s is not allowed on %s", r->method, r->url);
    if (f.n_length > 0) {
        /* libmicrohttpd has checked that it is all digits and fits 64 bits. */
        unsigned long long len = strtoull(f.length, NULL, 10);
        if (len > s->cfg.max_body_bytes)
            return http_send_error(r, 413, "invalid_request_error", NULL, NULL, NULL,
                                   "The request body (Content-Length %llu) is over the limit of "
                                   "%zu bytes",
                                   len, s->cfg.max_body_bytes);
    }
    return MHD_YES;
}

/* Whether the head announces a body: a Content-Length other than 0, or a
 * Transfer-Encoding. */
static int body_declared(struct MHD_Connection *conn)
{
    const char *len = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    if (MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Transfer-Encoding") != NULL) return 1;
    return len != NULL && strspn(len, "0") != strlen(len);
}

/* The head phase: the first call, with the headers and before any body
 * byte. */
static enum MHD_Result on_head(srv *s, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version, void **con_cls)
{
    srv_req *r = calloc(1, sizeof *r);
    if (r == NULL) return MHD_NO;
    r->s = s;
    r->conn = conn;
    r->refs = 1; /* the connection's, released by on_completed */
    r->state = HTTP_REQ_HEAD;
    r->t_start = log_now();
    r->t_progress = r->t_start;
    r->conn_rec = conn_of(conn);
    if (r->conn_rec != NULL) r->conn_rec->req = r;
    r->created = (long long)time(NULL);
    set_request_id(r);
    set_client(r);
    snprintf(r->id, sizeof r->id, "cmpl-%llx%06llx", (unsigned long long)r->created,
             (unsigned long long)(s->next_id++ & 0xFFFFFF));
    snprintf(r->method, sizeof r->method, "%s", method);
    snprintf(r->url, sizeof r->url, "%s", url);
    r->route_result = http_route_find(s->routes, s->nroutes, method, url, &r->route);
    s->active++;
    *con_cls = r;
    enum MHD_Result rc = head_size_checks(r, url);
    if (r->state == HTTP_REQ_HEAD) rc = head_checks(r, method, version);
    /* Answered from the head with a body on its way: libmicrohttpd sends
     * the answer, then closes without reading the body; the close lingers
     * (conn.c) so that the client reads the answer, not a reset. */
    if (r->state != HTTP_REQ_HEAD && r->conn_rec != NULL && body_declared(conn))
        conn_answered_early(r->conn_rec);
    return rc;
}

/* A piece of the body. A chunked body (no declared length) that passes
 * max_body_bytes is refused at once: libmicrohttpd takes no response until
 * the body's end, which the client may never send, so the 413 is written
 * on the socket and the connection lingers, then closes (conn.c);
 * untracked connections read the rest and get it from dispatch. */
static void on_body(srv_req *r, const char *data, size_t n)
{
    assert(r->state == HTTP_REQ_BODY);
    r->t_progress = log_now();
    if (r->too_large) {
        r->dropped += n; /* after conn_refuse's 413: the linger's bytes */
        if (r->conn_rec != NULL) conn_note_dropped(r->conn_rec, r->dropped);
        return;
    }
    if (r->body_oom) return;
    if (r->body_len + n > r->s->cfg.max_body_bytes) {
        r->too_large = 1;
        /* Over HTTPS nothing can be written beside libmicrohttpd: the rest
         * is read and dropped (body_timeout and body_min_rate still bound
         * it), and dispatch answers 413. */
        if (r->conn_rec != NULL && r->s->tls == NULL) {
            char msg[160];
            snprintf(msg, sizeof msg, "The request body is over the limit of %zu bytes",
                     r->s->cfg.max_body_bytes);
            conn_refuse(r->conn_rec, 413, "Content Too Large", msg);
        }
    } else if (http_append(&r->body, &r->body_len, &r->body_cap, data, n) != 0) {
        r->body_oom = 1;
    }
}

/* The whole request is in (the head passed head_checks): the body's limits
 * (a chunked body has no declared length), then the route's handler. */
static enum MHD_Result dispatch(srv_req *r)
{
    assert(r->state == HTTP_REQ_BODY);
    assert(r->route_result == HTTP_ROUTE_FOUND);
    if (r->body_oom)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL,
                               "Out of memory while reading the request body");
    if (r->too_large)
        return http_send_error(r, 413, "invalid_request_error", NULL, NULL, NULL,
                               "The request body is over the limit of %zu bytes",
                               r->s->cfg.max_body_bytes);
    return r->route->handler(r);
}

enum MHD_Result http_on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                const char *method, const char *version, const char *upload_data,
                                size_t *upload_data_size, void **con_cls)
{
    srv_req *r = *con_cls;
    if (r == NULL) {
        /* Refused at accept (its answer is written) or closed: no request. */
        srv_conn *c = conn_of(conn);
        if (c != NULL && c->closing) return MHD_NO;
        return on_head(cls, conn, url, method, version, con_cls);
    }
    if (r->state == HTTP_REQ_HEAD) http_req_set_state(r, HTTP_REQ_BODY);
    if (*upload_data_size > 0) {
        on_body(r, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (r->cont != NULL) { /* resumed: go on where the request left off */
        http_cont k = r->cont;
        r->cont = NULL;
        return k(r);
    }
    if (r->state != HTTP_REQ_BODY) { /* answered: nothing more to do */
        assert(r->state == HTTP_REQ_FINISHED || r->state == HTTP_REQ_STREAMING);
        return MHD_YES;
    }
    return dispatch(r);
}

void *http_on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    (void)cls;
    /* A target over SRV_MAX_TARGET is refused here, before libmicrohttpd
     * splits its query into arguments in the connection's memory pool: a
     * query of a few thousand short arguments does not fit there, and
     * libmicrohttpd would close the connection without a status. The 414
     * goes on the socket (conn.c), and the request never reaches
     * on_request (its connection is closing). */
    size_t n = strlen(uri);
    srv_conn *c = conn_of(conn);
    if (n > SRV_MAX_TARGET && c != NULL && !c->closing) {
        char msg[128];
        snprintf(msg, sizeof msg, "The request target is %zu bytes; the limit is %u", n,
                 SRV_MAX_TARGET);
        conn_refuse_linger(c, 414, "URI Too Long", msg);
    }
    return NULL; /* no request yet: on_head makes it once the head is in */
}

/* A request libmicrohttpd answered itself after its request line (a
 * malformed Content-Length: 400, one over 64 bits: 413), before any call of
 * on_request: its access line, without a request id (its answer has
 * none). A head cut short has no answer and no line here. */
static void on_completed_unseen(srv *s, struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_HTTP_STATUS);
    if (ci == NULL || ci->http_status == 0) return;
    log_access_conn(NULL, ci->http_status, 0.0);
    met_count_request(&s->met, "-", ci->http_status, 0);
}

void http_on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                       enum MHD_RequestTerminationCode toe)
{
    srv_req *r = *con_cls;
    if (r == NULL) {
        on_completed_unseen(cls, conn);
        return;
    }
    srv *s = r->s;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_HTTP_STATUS);
    unsigned status = ci ? ci->http_status : 0;
    int aborted = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK;
    if (r->conn_status != 0) { /* conn.c answered it (408, 413) and closed it */
        status = r->conn_status;
        aborted = 0;
    }
    size_t prompt_tokens = 0, completion_tokens = 0;
    if (r->ops != NULL && r->ops->usage != NULL)
        r->ops->usage(r, &prompt_tokens, &completion_tokens);
    double now = log_now();
    log_access_rec a = {.method = r->method,
                        .url = r->url,
                        .id = r->kind == R_COMPLETIONS ? r->id : NULL, /* ids: only answers' */
                        .req_id = r->req_id,
                        .status = status,
                        .prompt_tokens = prompt_tokens,
                        .completion_tokens = completion_tokens,
                        .duration_s = now - r->t_start,
                        .ttft_s = r->t_first > 0 ? r->t_first - r->t_start : 0.0,
                        .cut = r->cut,
                        .aborted = aborted,
                        .client = r->client};
    log_access(&a);
    met_count_request(&s->met, r->url, status, aborted);
    if (strcmp(r->url, "/v1/completions") == 0) met_observe(&s->met.duration, now - r->t_start);
    if (r->kind == R_COMPLETIONS) { /* /tokenize's tokens are not served ones */
        s->met.prompt_tokens += prompt_tokens;
        s->met.completion_tokens += completion_tokens;
    }
    if (aborted || (r->state != HTTP_REQ_FINISHED && r->state != HTTP_REQ_STREAMING))
        http_req_set_state(r, HTTP_REQ_ABORTED);
    else if (r->state == HTTP_REQ_STREAMING)
        http_req_set_state(r, HTTP_REQ_FINISHED);
    r->conn = NULL;            /* the connection is done with r: its reference goes below */
    if (r->conn_rec != NULL) { /* the connection waits for its next head now */
        conn_request_done(r->conn_rec);
        r->conn_rec = NULL;
    }
    r->cont = NULL;
    r->suspended = 0;
    *con_cls = NULL;
    /* The client went away (or the response is sent): the route stops what
     * still runs for r (a cancel may deliver DONE at once, which releases
     * that sequence's reference; the connection's is still held). */
    if (r->ops != NULL && r->ops->closed != NULL) r->ops->closed(r);
    http_req_release(r);
}
