/*
 * server/http/http.h: the HTTP layer, the bottom of server/ (STYLE.md
 * Part 3). A request's way through its files, top down:
 *
 *   http.c     on_request/on_completed: the head phase, the body, dispatch
 *              through the route table (the API layer's handlers, by
 *              pointer), the access line
 *   conn.c     the connections: head and body deadlines, the
 *              max_connections policy (idle ones closed first)
 *   respond.c  responses, and the one table from engine/tokenizer/config
 *              status to HTTP status and OpenAI error
 *   router.c   the {method, path, handler, needs_key} table lookup; the API
 *              key and Origin checks
 *   req.c      the request record: its state machine, suspend and resume,
 *              its ids, its reference count (freed in one place)
 *   loop.c     libmicrohttpd's epoll fd and timer in libuv
 *   tls.c      HTTPS: the certificate each handshake gets, swapped on
 *              SIGHUP, a retired one freed once no connection can hold it
 *   log.c      log lines and the access log
 *   counters.c what this layer counts for /metrics (the daemon renders it)
 *   error_json.c the JSON error body (error_json.h; the API layer's
 *              oai_error writes it too)
 *
 * The API layer (server/api/) sits above: it calls respond.c and req.c,
 * and hears from this layer only through what it registered on the way
 * down: the route table's handlers, a request's continuation (http_cont)
 * and its hooks (srv_req_ops).
 *
 * Each layer owns its state: struct srv (below) holds only what this
 * layer needs; the API layer's is struct srv_api (api/api.h), the
 * daemon's struct srv_daemon (daemon/daemon.h). srv points up to them
 * only as opaque pointers (srv.api, srv.daemon), and this header
 * includes nothing from api/ or daemon/ (tests/check_server_layers.py
 * fails on such an include).
 *
 * Thread: the loop thread.
 *
 * Prefixes: srv_ (this layer's state, srv_req), http_ (requests, routing,
 * responses), conn_ (connections), loop_ (libmicrohttpd in libuv), log_,
 * tls_ (HTTPS), met_ (the counters).
 */
#ifndef GPT2D_SERVER_HTTP_H
#define GPT2D_SERVER_HTTP_H

#include "config.h"
#include "engine.h"

#include <assert.h>
#include <jansson.h>
#include <microhttpd.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

/* The request head: a target (path and query) longer than SRV_MAX_TARGET
 * bytes is 414, a head larger than SRV_MAX_HEAD bytes 431, both in the JSON
 * envelope. libmicrohttpd answers by itself (its HTML) only a head that
 * does not fit its per-connection memory pool, SRV_CONN_POOL_BYTES: the
 * pool is 4x our head limit so that what we refuse reaches us first (the
 * pool also holds the parsed header list). Each kept-alive connection pins
 * its pool (libmicrohttpd zeroes it between requests). */
#define SRV_MAX_TARGET (8u * 1024u)
#define SRV_MAX_HEAD (32u * 1024u)
#define SRV_CONN_POOL_BYTES (128u * 1024u)
/* The longest cache_salt a request may give: api/oai.h's
 * OAI_MAX_CACHE_SALT, which its parser enforces (completions.c asserts
 * that the two agree); http_cache_salt reads no more. */
#define HTTP_MAX_CACHE_SALT 256

typedef struct srv srv;
typedef struct srv_req srv_req;
/* The state of the layers above (api/api.h, daemon/daemon.h): opaque here. */
struct srv_api;
struct srv_daemon;

/* ---- counters.c: what this layer counts for /metrics ---------------------- */

/* The daemon renders these (daemon/metrics.c), beside the API layer's
 * (api.h's cmpl_metrics). Pure; loop thread only. */
#define MET_BUCKETS 14
#define MET_ROUTES 15   /* met_routes, and "other" */
#define MET_STATUSES 17 /* met_statuses, and "other" */

typedef struct {
    const double *bounds;
    uint64_t counts[MET_BUCKETS]; /* non-cumulative; printed cumulative */
    uint64_t count;
    double sum;
} met_hist;

/* Why a connection or request was refused before any route ran
 * (gpt2d_connections_refused_total{reason}): met_refused_name's labels in
 * this order. */
typedef enum {
    MET_REFUSED_PER_IP,          /* over max_connections_per_ip: 429           */
    MET_REFUSED_MAX_CONNECTIONS, /* over max_connections, none idle: 503       */
    MET_REFUSED_DRAINING,        /* a completion while the server drains: 503  */
    MET_REFUSED_SHUTDOWN,        /* unanswered when the drain ended: 503       */
    MET_REFUSED_TIMEOUT,         /* a head or body past its deadline: 408      */
    MET_REFUSED_HOST,            /* a Host not in allowed_hosts: 421; none on
                                  * HTTP/1.1, or several: 400                  */
    MET_REFUSED_N
} met_refused;

/* The requests by route and status, the refusals, the tokens of finished
 * requests (their usage hook) and the completions' durations. */
typedef struct {
    uint64_t requests[MET_ROUTES][MET_STATUSES]; /* the last column: others */
    uint64_t refused[MET_REFUSED_N];
    uint64_t prompt_tokens, completion_tokens, aborted;
    met_hist duration;
} http_metrics;

/* The route label of requests' first index ("other" last), and the status
 * of its second (0 last: "other"). */
extern const char *const met_routes[MET_ROUTES];
extern const unsigned met_statuses[MET_STATUSES];

void met_observe(met_hist *h, double v);
/* Counts one finished request by route (its URL) and HTTP status. */
void met_count_request(http_metrics *m, const char *url, unsigned status, int aborted);
/* Counts one refusal. */
void met_count_refused(http_metrics *m, met_refused why);
/* The label value of why ("per_ip", ...). */
const char *met_refused_name(met_refused why);

/* The refusals of one address (conn.c): the first is logged at once, the
 * rest summed up in one line per CONN_REFUSE_LOG_S (no log flood). family
 * 0: every address that found the table full. */
typedef struct {
    int used, family;
    unsigned char addr[16];
    met_refused why;
    double since;
    unsigned long long count; /* refused since `since`, not yet logged */
} conn_refuse_log;
#define CONN_REFUSE_LOG_SLOTS 16
#define CONN_REFUSE_LOG_S 10.0
typedef struct srv_conn srv_conn;
typedef struct conn_drain conn_drain;
typedef struct tls_state tls_state;
struct tok_job;
struct cmpl_job;

/* ---- log.c --------------------------------------------------------------- */

/* One line per event on stderr (see log.c for the format); level is
 * "error", "warn", "info" or "debug". */
void log_line(const char *level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* ONE when n is 1, else MANY: a count in a log line in a user's words
 * ("1 request", "2 requests"). */
static inline const char *log_plural(size_t n, const char *one, const char *many)
{
    return n == 1 ? one : many;
}
/* in[0..n) made safe for one log line into out (outlen bytes, always
 * terminated): control bytes (C0, DEL), bytes that are not valid UTF-8
 * and the backslash become \xNN, and so does each byte of the characters
 * that break or reorder a line though valid UTF-8 (the C1 controls
 * U+0080..U+009F, U+2028, U+2029, and the bidirectional controls U+061C,
 * U+200E, U+200F, U+202A..U+202E, U+2066..U+2069); other valid UTF-8 is
 * kept. Stops before an escape or a character that would not fit.
 * Returns the bytes written. */
size_t log_escape(const char *in, size_t n, char *out, size_t outlen);
/* A start-up failure: "gpt2d serve: message" at error priority. */
void log_fatal(const char *msg);
/* Sets the most verbose level written (an unknown name is "info"). */
void log_set_level(const char *level);
/* Whether stderr is the journal ("<PRIORITY>" line prefixes instead of a
 * time stamp); set once at start-up, before any thread. */
void log_set_journal(int on);
/* What the access log line of a finished request says (http.c fills it). */
typedef struct {
    const char *method, *url, *req_id;
    const char *id; /* the answer's id (cmpl-..., chatcmpl-..., resp_...); NULL: none */
    unsigned status;
    size_t prompt_tokens, completion_tokens;
    double duration_s; /* the head to the end */
    double ttft_s;     /* the head to the first generated token; 0: none */
    int cut;           /* ended by the end of a drain */
    int aborted;
    const char *client; /* the client's address (NULL: not known) */
} log_access_rec;

/* The access log line of a finished request. */
void log_access(const log_access_rec *a);
/* The access log line of a response conn.c wrote itself on a connection
 * without a request (a head's 408, max_connections' 503), or one
 * libmicrohttpd wrote (req_id NULL: "-"): no method, no target, duration_s
 * since the connection (or its head) started. */
void log_access_conn(const char *req_id, unsigned status, double duration_s);
/* CLOCK_MONOTONIC in seconds. */
double log_now(void);

/* ---- req.c: the request record, its state machine and its lifetime ------- */

typedef enum {
    HTTP_REQ_HEAD,       /* the headers are in; no body byte yet (first call) */
    HTTP_REQ_BODY,       /* reading the body, then dispatching the route      */
    HTTP_REQ_TOKENIZING, /* on the work queue; suspended                       */
    HTTP_REQ_QUEUED,     /* engine requests submitted; suspended, no event yet */
    HTTP_REQ_RUNNING,    /* events arriving; suspended until the last DONE     */
    HTTP_REQ_STREAMING,  /* the SSE response is queued; the reader drains it   */
    HTTP_REQ_FINISHED,   /* a whole response is queued (or sent)               */
    HTTP_REQ_ABORTED,    /* the connection ended before the answer was sent    */
    HTTP_REQ_NSTATES
} http_state;

/* What on_request runs when a suspended connection is resumed. */
typedef enum MHD_Result (*http_cont)(srv_req *r);

/* Whether from -> to is a transition of the machine (docs/architecture.md). */
int http_state_legal(http_state from, http_state to);
const char *http_state_name(http_state st);
/* The one place a request changes state; asserts that the move is legal. */
void http_req_set_state(srv_req *r, http_state to);
/* Suspends r's connection; on resume, on_request runs cont (NULL: a stream
 * whose content reader is called again instead). */
void http_suspend(srv_req *r, http_cont cont);
/* Resumes r's connection if it is suspended and still open. */
void http_resume(srv_req *r);
/* ---- router.c (pure) ------------------------------------------------------ */

typedef enum MHD_Result (*http_handler)(srv_req *r);

typedef struct {
    const char *method; /* "GET", "POST" */
    const char *path;   /* matched whole, or as a prefix (below) */
    http_handler handler;
    int needs_key; /* an API key is required (when any is configured) */
    int prefix;    /* path is a prefix: "/v1/models/" matches "/v1/models/x"
                    * (at least one byte more), not "/v1/models/" itself */
} http_route;

typedef enum {
    HTTP_ROUTE_FOUND,      /* *out: the entry                                */
    HTTP_ROUTE_BAD_METHOD, /* *out: the first entry of the path (405)        */
    HTTP_ROUTE_NOT_FOUND   /* *out: NULL (404)                               */
} http_route_result;

/* HEAD finds the GET entry of a path. */
http_route_result http_route_find(const http_route *table, size_t n, const char *method,
                                  const char *path, const http_route **out);
/* The Allow header of path (405): its entries' methods, HEAD after GET, and
 * OPTIONS, into buf (truncated to len). */
void http_route_allow(const http_route *table, size_t n, const char *path, char *buf, size_t len);
/* Whether the Authorization header value auth presents one of cfg's API
 * keys ("Bearer KEY", the scheme in any case): 0 if not, else 1 + the
 * index of the key in cfg->api_keys; always 1 when none is configured.
 * Constant time in the keys. */
int http_key_ok(const cfg_config *cfg, const char *auth);
/* SipHash-2-4 of p[0..n) under the 128-bit key k. */
uint64_t http_siphash(const uint64_t k[2], const void *p, size_t n);
/* The prefix cache salt of API key `key` (a tenant), under the process's
 * secret (srv.salt_secret): never 0, and it reveals nothing of the key. */
uint64_t http_key_salt(const uint64_t secret[2], const char *key);
/* The engine's cache_salt of a request: tenant (http_key_salt, or 0 for
 * the common partition) alone when salt is NULL, else mixed with the
 * request's cache_salt salt[0..n) (at most HTTP_MAX_CACHE_SALT bytes;
 * never 0). */
uint64_t http_cache_salt(const uint64_t secret[2], uint64_t tenant, const char *salt, size_t n);
/* Whether origin (an Origin header) is in list (cors_origins: origins
 * separated by commas and spaces, compared whole; "*" allows any). */
int http_origin_allowed(const char *list, const char *origin);
/* Whether origin is this server itself as the browser reached it
 * ("http://" + the Host header) with an IP address or localhost for a host
 * name: the playground page's own calls. A host name is not enough (DNS
 * rebinding): list it in cors_origins. */
int http_origin_same_host(const char *origin, const char *host);
/* Whether a request with this Host header (NULL: none) may be served:
 * its name (any port) is in list (allowed_hosts: names separated by commas
 * and spaces, compared without case; "[::1]" with brackets; "*": any).
 * An empty list means localhost, 127.0.0.1 and [::1] on a loopback bind
 * (a DNS-rebound page carries its own name), any Host elsewhere. No Host
 * (HTTP/1.0) is allowed. */
int http_host_allowed(const char *list, int loopback_bind, const char *host);
/* ---- respond.c ------------------------------------------------------------ */

typedef enum { HTTP_SRC_ENG, HTTP_SRC_BPE, HTTP_SRC_CFG } http_src;

/* How a status of the engine, the tokenizer or the configuration reaches a
 * client. */
typedef struct {
    http_src src;
    int code;          /* eng_status, bpe_status or cfg_status */
    int http;          /* HTTP status */
    const char *type;  /* OpenAI error type */
    const char *ecode; /* OpenAI error code, or NULL */
    int retry;         /* send Retry-After */
} http_status_map;

/* The entry for code of src (a status not in the table: 500 server_error). */
const http_status_map *http_status_of(http_src src, int code);

/* The headers every response of r carries: X-Request-Id, CORS for an
 * allowed Origin, WWW-Authenticate on 401, Allow on 405. */
void http_resp_headers(const srv_req *r, struct MHD_Response *resp, unsigned status);
/* The 204 answer to OPTIONS on a known path (a CORS preflight when r has
 * an allowed Origin). */
enum MHD_Result http_send_preflight(srv_req *r);
enum MHD_Result http_send_json(srv_req *r, unsigned status, const char *body,
                               const char *retry_after);
enum MHD_Result http_send_error(srv_req *r, int status, const char *type, const char *code,
                                const char *param, const char *retry_after, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 7, 8)))
#endif
    ;
/* An error from the status table; param may be NULL. */
enum MHD_Result http_send_status(srv_req *r, http_src src, int code, const char *param,
                                 const char *msg);
/* A 200 with obj as compact JSON; takes obj's reference (NULL: 500). */
enum MHD_Result http_send_obj(srv_req *r, json_t *obj);
/* Retry-After for 429/503 from the scheduler's step rate. */
void http_retry_after(const srv *s, char *buf, size_t len);
/* ---- The request --------------------------------------------------------- */

typedef enum { R_UNKNOWN, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE } srv_kind;

/* What the route that took a request registers on it (the way news comes
 * back up from this layer). Each may be NULL. */
typedef struct {
    /* libmicrohttpd ended r's request (the answer is sent, or the client
     * left): stop what still works for r (cancel, leave queues). r still
     * holds the connection's reference during the call. */
    void (*closed)(srv_req *r);
    /* The prompt and completion tokens so far (the access line, metrics). */
    void (*usage)(const srv_req *r, size_t *prompt, size_t *completion);
    /* Frees what the route attached to r (its jobs), at the last release. */
    void (*free)(srv_req *r);
} srv_req_ops;

/* One HTTP request: its connection, state, continuation, route, ids, body
 * and timings. The work a route does for it is in jobs of their own
 * (server/api/: tok, cmpl), which this layer does not look into. */
struct srv_req {
    srv *s;
    struct MHD_Connection *conn; /* NULL once libmicrohttpd ended it (on_completed) */
    srv_conn *conn_rec;          /* its connection's record (NULL once it is done) */
    http_state state;
    http_cont cont; /* set by http_suspend, run by on_request on resume */
    int suspended;  /* libmicrohttpd's view of the connection */
    /* The one lifetime rule: a reference for each user, the connection
     * (from the head to on_completed), the tokenizer job while a tokenizer
     * thread holds it, and each live engine sequence; the last
     * http_req_release frees r. */
    unsigned refs;
    const srv_req_ops *ops; /* the route's hooks; NULL: none */
    char method[8], url[64];
    char req_id[132]; /* X-Request-Id: the client's (sane) or generated */
    char origin[256]; /* an allowed Origin (CORS headers on every response) */
    char client[48];  /* the client's address: the peer's, or from a trusted
                       * proxy the rightmost untrusted X-Forwarded-For entry */
    /* The head phase's decision (http.c): the route entry (NULL: none) and
     * whether the method matched it. */
    const http_route *route;
    http_route_result route_result;
    srv_kind kind;
    /* The prefix cache partition of the matched API key (http_key_salt); 0:
     * no key configured, or prefix_cache_shared_across_keys. */
    uint64_t cache_tenant;
    /* The matched API key's keyed hash (http_key_salt), whatever
     * prefix_cache_shared_across_keys says: what owns a stored response.
     * 0: no key configured. */
    uint64_t key_id;
    /* Whose sequences these are, for fair admission (eng_request.tenant):
     * the API key's index when keys are configured, else a hash of the
     * client's address. */
    uint64_t tenant;
    char id[40]; /* the answer's id: cmpl-..., chatcmpl-... */
    long long created;
    char *body;
    size_t body_len, body_cap;
    int too_large, body_oom;
    size_t dropped;        /* body bytes read and dropped after too_large */
    double t_start;        /* the head */
    double t_first;        /* the first generated token (0: none yet) */
    double t_progress;     /* the head, or the last body byte (body_timeout) */
    int cut;               /* ended by the end of a drain (access line: cut=shutdown) */
    unsigned conn_status;  /* a status conn.c wrote itself before closing (408, 413) */
    struct tok_job *tok;   /* the tokenizer job (api/tokenize.c), or NULL */
    struct cmpl_job *cmpl; /* the completion job (api/cmpl_job.c), or NULL */
    struct adp_job *adp;   /* a LoRA adapter's load (api/adapters.c), or NULL */
};

/* Whether v is an X-Request-Id to echo: 1-128 bytes, each printable ASCII
 * other than space. */
int http_request_id_ok(const char *v);
/* A new X-Request-Id ("req-" + hex) into buf, for a response without a
 * request (conn.c). */
void http_request_id_new(srv *s, char *buf, size_t len);
/* Whether r's client has closed its connection (or it failed): a
 * non-blocking peek at its socket reads its end of stream or an error.
 * Bytes waiting (a pipelined request) are no close; nor is a connection
 * without a socket here. Over HTTPS the client's FIN is the close, bytes
 * waiting or not (its close_notify comes first). For a suspended request,
 * which libmicrohttpd does not watch. */
int http_peer_closed(const srv_req *r);
/* libmicrohttpd's idle timeout of r's connection: seconds without any
 * byte sent or received before it closes the connection (0: none), counted
 * from now. A stream that its client stops reading sends nothing; its
 * policy (stream_stall_timeout) bounds it instead, and once it has ended,
 * its client gets this long to read the ending. No connection: nothing. */
void http_conn_timeout(srv_req *r, unsigned seconds);
/* Takes one more reference to r (a tokenizer thread, an engine sequence). */
void http_req_hold(srv_req *r);
/* Drops one reference; the last frees r (its ops' free, then the record):
 * the one place a request is freed. */
void http_req_release(srv_req *r);
/* Appends n bytes to a growing NUL-terminated buffer; 0 or -1 (no memory). */
int http_append(char **buf, size_t *len, size_t *cap, const char *p, size_t n);

/* libmicrohttpd's callbacks (MHD_start_daemon; http.c). */
enum MHD_Result http_on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                const char *method, const char *version, const char *upload_data,
                                size_t *upload_data_size, void **con_cls);
void http_on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                       enum MHD_RequestTerminationCode toe);
/* MHD_OPTION_URI_LOG_CALLBACK, at a request line: returns NULL (on_head
 * makes the request). Its use is that libmicrohttpd then calls
 * on_completed for the requests it answers itself too, so that they have
 * an access line. */
void *http_on_uri(void *cls, const char *uri, struct MHD_Connection *conn);

/* ---- The HTTP layer's state (daemon.c makes it) ----------------------------- */

/* The daemon makes this, the API layer's struct srv_api and its own
 * struct srv_daemon, and links them: api and daemon point up, opaque here
 * (this layer never looks into them); they are how an upper layer's code,
 * given a request or the srv, finds its own state (r->s->api). */
struct srv {
    cfg_config cfg;
    uv_loop_t *loop;
    struct MHD_Daemon *mhd;
    uv_poll_t poll;
    uv_timer_t timer;
    /* loop.c: when libmicrohttpd's timer was last armed with 0 (uv_now). */
    uint64_t mhd_zero_at;
    int mhd_zero_armed;
    /* The engine's load as the API layer last saw it (after each step):
     * requests waiting for admission, over every checkpoint, and the last
     * step's seconds; Retry-After reads them (respond.c). */
    size_t load_queued;
    double load_step_s;
    uint64_t next_id;
    /* The key of the prefix cache salts (router.c), random at start-up and
     * never written anywhere. */
    uint64_t salt_secret[2];
    size_t active; /* requests alive */
    /* The connections (conn.c): every accepted one, newest first. */
    srv_conn *conns;
    size_t nconns, nconns_closing;
    /* The lingering reads of closed connections (conn.c), at most
     * CONN_DRAIN_MAX. */
    conn_drain *drains;
    size_t ndrains;
    uv_timer_t sweep;
    double sweep_last; /* when conn_on_sweep last ran */
    /* The routes (daemon.c builds them from the configuration). */
    const http_route *routes;
    size_t nroutes;
    http_metrics met; /* loop thread only */
    /* The loop's handles are closed and the loop is ending (the daemon's
     * lifecycle.c sets it): libmicrohttpd is not run again. */
    int closed;
    /* conn.c: refusals' log lines, summed up per address. */
    conn_refuse_log refuse_log[CONN_REFUSE_LOG_SLOTS];
    /* Whether the listening socket is bound to a loopback address (the
     * default allowed_hosts; daemon.c). */
    int bind_loopback;
    /* HTTPS (tls.c): the certificates; NULL when serving plain HTTP. */
    tls_state *tls;
    /* The layers above (daemon.c links them). */
    struct srv_api *api;       /* api/api.h */
    struct srv_daemon *daemon; /* daemon/daemon.h */
};
/* ---- conn.c: connections ------------------------------------------------ */

/* One accepted connection (loop thread; freed when libmicrohttpd closes it). */
struct srv_conn {
    srv *s;
    struct MHD_Connection *conn;
    int fd;
    double t_ready; /* accepted, or its last request ended */
    size_t served;  /* requests ended on it */
    srv_req *req;   /* the request in progress; NULL between requests */
    int closing;    /* shut down here; libmicrohttpd closes it next */
    /* Answered before its request's body was read (a refusal at accept, a
     * 413 or 401 from the head, a 413 in the middle of a chunked body):
     * when the answer went (0: not so). From then, for refusal_linger, what
     * the client still sends is read and dropped, by libmicrohttpd while
     * it holds the connection and by a conn_drain once it has closed it,
     * so that the client reads the answer rather than a reset for the
     * request bytes it sent (nginx's lingering close). */
    double t_linger;
    /* The peer's address (family 4 or 6; an IPv4-mapped IPv6 address is
     * 4; 0: not IP) and whether it is in trusted_proxies. */
    int family, trusted;
    unsigned char addr[16];
    /* Keep-alive: when the last byte before t_ready arrived (the kernel's
     * TCP_INFO; < 0: unknown, not TCP), and when the next head's first byte
     * came (0: none yet; conn_note_recv), which starts its deadline. */
    double t_recv, t_head;
    /* HTTPS: the certificate generation when it was accepted (tls.c). */
    uint64_t tls_gen;
    srv_conn *prev, *next;
};

/* What a connection is waiting for, and until when (log_now() seconds). */
typedef enum {
    CONN_WAIT_NONE, /* nothing bounded here: a request is being answered   */
    CONN_WAIT_HEAD, /* a head: request_header_timeout from the connection's
                     * start, or (keep-alive) from the head's first byte   */
    CONN_WAIT_IDLE, /* keep-alive, no byte yet: connection_timeout         */
    CONN_WAIT_BODY, /* the next body byte: body_timeout                    */
    CONN_WAIT_RATE  /* the body so far: body_timeout + its bytes at
                     * body_min_rate, from the head                        */
} conn_wait;

typedef struct {
    conn_wait kind;
    double at;
} conn_deadline;

#define CONN_SWEEP_MS 200
/* Connections libmicrohttpd accepts past max_connections, each answered
 * and closed (conn_on_notify; lingering for refusal_linger while fewer
 * than half of these linger, conn.c); LimitNOFILE must cover
 * max_connections + this. */
#define SRV_CONN_HEADROOM 64u
/* Closed connections whose lingering read goes on at once (conn_drain),
 * each holding its socket's descriptor: within SRV_FD_RESERVE's room to
 * spare (daemon.h). A refusal past them is closed at once. */
#define CONN_DRAIN_MAX 16u

/* The lingering read of a connection libmicrohttpd has closed (its
 * descriptor duplicated at the close): reads and drops until the client
 * closes, `until`, or `left` bytes more. Loop thread; freed by its poll's
 * close callback. */
struct conn_drain {
    uv_poll_t poll;
    srv *s;
    int fd;
    double start, until; /* log_now() seconds */
    size_t left, got;    /* bytes it may still drop; dropped so far */
    conn_drain *prev, *next;
};

/* The deadline of c under cfg (pure). */
conn_deadline conn_deadline_of(const cfg_config *cfg, const srv_conn *c);
/* Keep-alive, between requests: at is when c's last byte arrived (< 0:
 * unknown), since when the previous check ran. A byte after the one
 * before t_ready starts the next head: t_head is set to the earliest time
 * it can have come (t_ready, or since). 1 when it set t_head (pure). */
int conn_note_recv(srv_conn *c, double at, double since);
/* c's request ended (on_completed): c waits for its next head. */
void conn_request_done(srv_conn *c);
/* The connection of list head, other than except, that has no request in
 * progress and has been so longest; NULL when none (pure). */
srv_conn *conn_pick_idle(srv_conn *head, const srv_conn *except);
/* The record of libmicrohttpd's connection mc (NULL: untracked). */
srv_conn *conn_of(struct MHD_Connection *mc);
/* Shuts c's socket down; libmicrohttpd closes it on its next run. */
void conn_close(srv_conn *c);
/* The drain's last moment: every connection whose request has no answer
 * started (its head or body still coming, tokenizing, waiting) gets a 503
 * server_shutting_down JSON and is closed. */
void conn_close_unanswered(srv *s);
/* Resumes every suspended request's connection: before MHD_stop_daemon,
 * which aborts the process when one is still suspended. */
void conn_resume_all(srv *s);
/* Writes status (an invalid_request_error JSON with msg, X-Request-Id) on
 * c's socket, then lingers as conn_refuse_linger: for a request refused in
 * the middle of its body, when libmicrohttpd takes no response yet. */
void conn_refuse(srv_conn *c, int status, const char *reason, const char *msg);
/* The address of c in text (inet_ntop) into buf; "-" when not IP. */
void conn_addr_text(int family, const unsigned char *addr, char *buf, size_t len);
/* Parses text as an IPv4 or IPv6 address into family and addr (an
 * IPv4-mapped IPv6 address is 4); 0 when it is not one. */
int conn_addr_parse(const char *text, size_t len, int *family, unsigned char *addr);
/* Notes a refusal (why) of a connection or request from family/addr: the
 * metric, and a log line for the first of the address's refusals in a
 * CONN_REFUSE_LOG_S (the rest are summed up by conn_refuse_log_flush). */
void conn_note_refused(srv *s, int family, const unsigned char *addr, met_refused why,
                       const char *what);
/* Writes the summed-up refusal lines whose interval has passed (the sweep). */
void conn_refuse_log_flush(srv *s, double now);
/* As conn_refuse, for a connection whose request has not been read yet:
 * the answer, then the sending side shut and refusal_linger of reading
 * (t_linger), so that the client reads the answer rather than a reset. */
void conn_refuse_linger(srv_conn *c, int status, const char *reason, const char *msg);
/* c's request was answered from its head while a body is on its way
 * (libmicrohttpd sends the answer, then closes without reading the body):
 * its close is followed by the lingering read (t_linger). */
void conn_answered_early(srv_conn *c);
/* The lingering read's byte bound: a connection whose request was refused
 * in the middle of its body has dropped n bytes since; past
 * refusal_linger_bytes it is closed. */
void conn_note_dropped(srv_conn *c, size_t total);
/* Ends every lingering read (the loop is closing). */
void conn_drains_close(srv *s);
/* MHD_OPTION_NOTIFY_CONNECTION: records connections, enforces
 * max_connections and max_connections_per_ip (429, 503 with Retry-After,
 * never a bare close). */
void conn_on_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                    enum MHD_ConnectionNotificationCode toe);
/* Every CONN_SWEEP_MS: closes connections past their deadline. */
void conn_on_sweep(uv_timer_t *t);
/* ---- tls.c: HTTPS ------------------------------------------------------------ */

/* Whether this build (GnuTLS) and its libmicrohttpd serve HTTPS: 1, or 0
 * with err saying why not and what to do instead. */
int tls_supported(char *err, size_t errlen);
/* Whether this build has GnuTLS (/version, gpt2d_build_info). */
int tls_built(void);
/* Whether GnuTLS takes prio as a priority string (tls_priorities, which
 * libmicrohttpd is given at start): 0, or -1 with err naming the key, the
 * string and where GnuTLS stopped. A build without GnuTLS takes any (it
 * serves no HTTPS). Thread: any. */
int tls_priorities_check(const char *prio, char *err, size_t errlen);
/* Loads cfg.tls_cert_file and tls_key_file into s->tls, the certificate
 * every handshake gets from now on. 0, or -1 with err naming the file and
 * what is wrong with it (unreadable, not PEM, a key that does not match). */
int tls_open(srv *s, char *err, size_t errlen);
/* Loads the files again (SIGHUP) and swaps the new certificate in for the
 * handshakes that follow; connections already open keep theirs. 0, or -1
 * with err as tls_open's, and the current certificate still serving. */
int tls_reload(srv *s, char *err, size_t errlen);
/* The connection record c was just made / is about to be freed: the
 * retired certificates' holders (conn.c). */
void tls_conn_opened(srv *s, srv_conn *c);
void tls_conn_closed(srv *s, const srv_conn *c);
/* Retired certificates not yet freed (a connection open since before their
 * retirement may hold them). */
size_t tls_retired(const srv *s);
/* Frees every certificate (after MHD_stop_daemon); s->tls becomes NULL. */
void tls_close(srv *s);
#ifdef GPT2D_HAVE_GNUTLS
#include <gnutls/abstract.h>
/* GnuTLS's certificate callback (MHD_OPTION_HTTPS_CERT_CALLBACK): the
 * current certificate chain and key, owned by tls.c. */
int tls_pick(gnutls_session_t session, const gnutls_datum_t *req_ca_rdn, int nreqs,
             const gnutls_pk_algorithm_t *pk_algos, int pk_algos_length, gnutls_pcert_st **pcert,
             unsigned int *pcert_length, gnutls_privkey_t *privkey);
#endif
/* ---- loop.c --------------------------------------------------------------- */

/* Runs libmicrohttpd and re-arms its timeout. */
void loop_mhd_run(srv *s);
void loop_on_poll(uv_poll_t *p, int status, int events);

#endif
