/*
 * server/internal.h: what the pieces of `gpt2d serve` share. Not installed;
 * server.h (srv_main) is the only public entry. A request's path through
 * the files:
 *
 *   daemon.c       start-up, listen, signals, drain, shutdown; builds the
 *                  route table
 *   conn.c         the connections: head and body deadlines, the
 *                  max_connections policy (idle ones closed first)
 *   loop.c         libmicrohttpd's epoll fd and timer in libuv; suspend and
 *                  resume; the engine step driver; the 1 s tick; watchdog
 *   http.c         on_request/on_completed: the per-request state machine,
 *                  the head phase, the body, dispatch through the router
 *   router.c       the {method, path, handler, needs_key} table lookup; the
 *                  API key check
 *   tokenize.c     tokenizing bodies (inline or on a tokenizer thread,
 *                  admitted like generation); /tokenize and /detokenize
 *   tokpool.c      the tokenizer threads (low priority)
 *   completions.c  /v1/completions and /v1/chat/completions: admission,
 *                  engine events, choices
 *   cmpl_respond.c best_of ranking, the JSON answer and the SSE stream
 *   logprobs.c     the logprobs object of a choice
 *   respond.c      responses, and the one table from engine/tokenizer/config
 *                  status to HTTP status and OpenAI error
 *   probes.c       /health, /ready, /v1/models[/{id}], /metrics, /version
 *   ui.c           the playground page at / (server/ui/, built into the
 *                  binary by scripts/embed.py)
 *   metrics.c      counters, histograms, the Prometheus page
 *   log.c          log lines and the access log
 *
 * Thread: everything here runs on the loop thread, except tokenize_run (on
 * tokpool.c's threads) and the step (eng_sched_execute, on the libuv work
 * queue).
 *
 * Prefixes: srv_ (daemon), http_ (connection, state, routing, responses),
 * loop_ (the libuv glue), cmpl_ (completions), lp_ (logprobs), tok_
 * (tokenizing), tpool_ (its threads, tokpool.c), conn_ (connections), probe_ (the
 * small GET routes), met_ (metrics), log_.
 */
#ifndef GPT2D_SERVER_INTERNAL_H
#define GPT2D_SERVER_INTERNAL_H

#include "config.h"
#include "engine.h"
#include "oai.h"
#include "sse.h"
#include "tokenizer.h"

#include <assert.h>
#include <jansson.h>
#include <microhttpd.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#define EOT 50256
/* The longest stop string a request may give; the stop matcher holds back
 * less than this, so its output fits on the stack. */
#define SRV_MAX_STOP_BYTES 256
/* The bytes of one token, at most (GPT-2's longest is 128). */
#define SRV_MAX_TOKEN_BYTES 256
/* Bodies whose texts are at least this long are tokenized on the work queue:
 * the tokenizer does ~50 MB/s, so a 1 MB prompt would hold the loop thread
 * (every stream's next token) for ~20 ms; a typical prompt costs microseconds
 * and is cheaper inline than a trip through the queue. */
#define SRV_TOKENIZE_INLINE_BYTES (64u * 1024u)
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

typedef struct srv srv;
typedef struct srv_req srv_req;
typedef struct srv_conn srv_conn;
typedef struct tokpool tokpool;

/* ---- log.c --------------------------------------------------------------- */

/* One line per event on stderr (see log.c for the format); level is
 * "error", "warn", "info" or "debug". */
void log_line(const char *level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* in[0..n) made safe for one log line into out (outlen bytes, always
 * terminated): control bytes (C0, DEL, C1), bytes that are not valid UTF-8
 * and the backslash become \xNN; valid UTF-8 is kept. Stops before an
 * escape or a character that would not fit. Returns the bytes written. */
size_t log_escape(const char *in, size_t n, char *out, size_t outlen);
/* A start-up failure: "gpt2d serve: message" at error priority. */
void log_fatal(const char *msg);
/* Sets the most verbose level written (an unknown name is "info"). */
void log_set_level(const char *level);
/* The access log line of a finished request. */
void log_access(const srv_req *r, unsigned status, int aborted);
/* The access log line of a response conn.c wrote itself on a connection
 * without a request (a head's 408, max_connections' 503), or one
 * libmicrohttpd wrote (req_id NULL: "-"): no method, no target, duration_s
 * since the connection (or its head) started. */
void log_access_conn(const char *req_id, unsigned status, double duration_s);
/* CLOCK_MONOTONIC in seconds. */
double log_now(void);

/* ---- metrics.c (pure; loop thread) ---------------------------------------- */

#define MET_BUCKETS 14
#define MET_ROUTES 12   /* metrics.c's met_routes, and "other" */
#define MET_STATUSES 16 /* metrics.c's met_statuses, and "other" */

typedef struct {
    const double *bounds;
    uint64_t counts[MET_BUCKETS]; /* non-cumulative; printed cumulative */
    uint64_t count;
    double sum;
} met_hist;

/* What /metrics says about the build and the process (probes.c gathers
 * the process's numbers; met_render only prints them). */
typedef struct {
    const char *version, *commit, *buildtype, *kernels, *dtype, *layout, *model;
    double start_time;        /* Unix seconds */
    double cpu_seconds;       /* user + system */
    double resident_bytes;    /* -1: unknown */
    double virtual_bytes;     /* -1: unknown */
    double open_fds, max_fds; /* -1: unknown */
} met_info;

typedef struct {
    uint64_t requests[MET_ROUTES][MET_STATUSES]; /* the last column: others */
    uint64_t prompt_tokens, completion_tokens, aborted;
    met_hist ttft, itl, duration, step_seconds, step_rows;
} srv_metrics;

/* Zeroes m and sets the histograms' buckets. */
void met_init(srv_metrics *m);
void met_observe(met_hist *h, double v);
/* Counts one finished request by route (its URL) and HTTP status. */
void met_count_request(srv_metrics *m, const char *url, unsigned status, int aborted);
/* The Prometheus text page of m, the scheduler's st and info into *out
 * (malloc'd, *len bytes). 0, or -1 when memory ran out (nothing kept). */
int met_render(const srv_metrics *m, const eng_sched_stats *st, const met_info *info, char **out,
               size_t *len);

/* ---- The per-request state machine (http.c) ------------------------------- */

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
 * keys ("Bearer KEY", the scheme in any case); always 1 when none is
 * configured. Constant time in
 * the keys. */
int http_key_ok(const cfg_config *cfg, const char *auth);
/* Whether origin (an Origin header) is in list (cors_origins: origins
 * separated by commas and spaces, compared whole; "*" allows any). */
int http_origin_allowed(const char *list, const char *origin);
/* Whether origin is this server itself as the browser reached it
 * ("http://" + the Host header) with an IP address or localhost for a host
 * name: the playground page's own calls. A host name is not enough (DNS
 * rebinding): list it in cors_origins. */
int http_origin_same_host(const char *origin, const char *host);

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
enum MHD_Result http_send_oai_error(srv_req *r, const oai_error *e);
/* Retry-After for 429/503 from the scheduler's step rate. */
void http_retry_after(const srv *s, char *buf, size_t len);

/* ---- The request ---------------------------------------------------------- */

/* One completion choice: one engine request. */
typedef struct {
    srv_req *req;
    size_t index;  /* choices[index] */
    size_t prompt; /* which prompt */
    uint64_t id;   /* engine request id */
    int live;      /* submitted, DONE not yet delivered */
    int done;
    const char *finish; /* "stop" or "length" */
    int stopped;        /* a stop string ended it */
    utf8_stream utf8;
    stop_matcher *stop;
    char *text; /* non-streaming: the whole text; streaming: this chunk's */
    size_t text_len, text_cap;
    size_t tokens;
    /* logprobs: {tokens, token_logprobs, top_logprobs, text_offset}; for a
     * stream, the entries of the chunk being built. NULL when not asked. */
    json_t *lp;
    utf8_stream off_utf8; /* text_offset: characters before each token, */
    size_t off_chars;     /* counted from the start of the prompt        */
    size_t prompt_fed;    /* prompt tokens counted into off_chars so far */
    double t_last;        /* when the last token came (inter-token latency) */
    double lp_sum;        /* best_of: the sum and count of the chosen    */
    size_t lp_n;          /* tokens' logprobs                            */
    int trim;             /* chat: leading spaces of the reply still dropped */
    size_t cached;        /* DONE: prompt tokens from the prefix cache   */
} srv_choice;

typedef enum { R_UNKNOWN, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE } srv_kind;

struct srv_req {
    srv *s;
    struct MHD_Connection *conn;
    srv_conn *sc; /* its connection's record (NULL once it is done) */
    http_state state;
    http_cont cont;           /* set by http_suspend, run by on_request on resume */
    int suspended, conn_done; /* libmicrohttpd's view of the connection */
    int cancelling;           /* inside on_completed's cancel loop: do not free yet */
    char method[8], url[64];
    char req_id[132]; /* X-Request-Id: the client's (sane) or generated */
    char origin[256]; /* an allowed Origin (CORS headers on every response) */
    /* The head phase's decision (http.c): the route entry (NULL: none) and
     * whether the method matched it. */
    const http_route *route;
    http_route_result route_result;
    srv_kind kind;
    /* Tokenizing a large body runs on the work queue (state TOKENIZING): the
     * worker writes prompt_ids/prompt_len and tok_err, nothing else touches
     * them until tok_after_cb runs on the loop thread. */
    srv_req *tok_qnext; /* tokpool.c's queues */
    int tok_running;    /* a worker holds the fields below: r is not freed */
    int tok_waiting;    /* in the srv's tokenize wait list (tok_wprev/next) */
    srv_req *tok_wprev, *tok_wnext;
    json_t *tok_json; /* /tokenize: the parsed body, which holds the text */
    int tok_http;     /* /tokenize: a 400 for the body (tok_param, tok_err) */
    const char *tok_param;
    char *tok_resp; /* /tokenize: the answer's JSON, made beside the tokens */
    int tok_failed;
    bpe_status tok_status; /* of the prompt that failed */
    char tok_err[256];
    size_t tok_max_tokens; /* a completion's max_prompt_tokens, read by the worker */
    /* A completion or chat body of SRV_TOKENIZE_INLINE_BYTES or more is
     * parsed on the tokenizer thread too (parsing 1 MB of JSON holds the
     * loop thread, and every stream's next token, for milliseconds): until
     * then cmpl_unparsed; a parse that fails leaves cmpl_err. */
    int cmpl_chat, cmpl_unparsed, cmpl_parse_failed;
    oai_limits cmpl_lim;
    oai_error cmpl_err;
    char *body;
    size_t body_len, body_cap;
    int too_large, body_oom;
    oai_request oreq;
    int32_t **prompt_ids;
    size_t *prompt_len;
    size_t nprompts;
    srv_choice *choices;
    size_t nchoices, nlive, ndone;
    char id[40];
    long long created;
    double t_start;
    double t_first;    /* the first generated token (0: none yet) */
    double t_progress; /* the head, or the last body byte (body_timeout) */
    /* Streaming: SSE bytes waiting to be sent. Over sse.limit the choices
     * are paused (eng_sched_pause) since t_over; cmpl_backlog decides. */
    sse_queue sse;
    int paused;
    double t_over;
    int error_status; /* a failure after submission */
    char error_msg[256];
    const char *error_code; /* its OpenAI error code, or NULL */
    int cut;                /* ended by the end of a drain (srv_drain_cut) */
    unsigned conn_status;   /* a status conn.c wrote itself before closing (408, 413) */
    srv_req *prev, *next;   /* the list of requests with engine work */
};

/* Whether v is an X-Request-Id to echo: 1-128 bytes, each printable ASCII
 * other than space. */
int http_request_id_ok(const char *v);
/* A new X-Request-Id ("req-" + hex) into buf, for a response without a
 * request (conn.c). */
void http_request_id_new(srv *s, char *buf, size_t len);
/* Prompt and completion tokens so far (0 prompt tokens while tokenizing). */
size_t http_req_prompt_tokens(const srv_req *r);
size_t http_req_completion_tokens(const srv_req *r);
/* Frees r once its connection is done, no engine request is live and no
 * worker holds it. */
void http_req_maybe_free(srv_req *r);
/* Appends n bytes to a growing NUL-terminated buffer; 0 or -1 (no memory). */
int http_append(char **buf, size_t *len, size_t *cap, const char *p, size_t n);

/* libmicrohttpd's callbacks (MHD_start_daemon). */
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

/* ---- The daemon ----------------------------------------------------------- */

/* What identifies a file's contents cheaply: a copy over it changes the
 * size or the modification time, a rename over it the inode. */
typedef struct {
    int exists;
    uint64_t dev, ino, size;
    int64_t mtime_s, mtime_ns;
} srv_file_id;

struct srv {
    cfg_config cfg;
    uv_loop_t *loop;
    struct MHD_Daemon *mhd;
    uv_poll_t poll;
    uv_timer_t timer;
    uv_signal_t sigterm, sigint;
    uv_timer_t drain_timer;
    uv_work_t work;
    int in_flight, draining;
    size_t tokenizing; /* requests tokenizing on the tokenizer threads */
    tokpool *tokpool;
    /* Requests waiting for a tokenize slot (tokenize_concurrency), oldest
     * first; at most max_queue of them. */
    srv_req *tok_wait_head, *tok_wait_tail;
    size_t tok_nwait;
    double drain_started;
    bpe *tok;
    eng_model *model;
    eng_sched *sched;
    char fingerprint[32];
    uint64_t next_id;
    size_t active; /* requests alive */
    srv_req *head; /* requests with engine work (for the 1 s tick) */
    uv_timer_t tick;
    /* The connections (conn.c): every accepted one, newest first. */
    srv_conn *conns;
    size_t nconns, nconns_closing;
    uv_timer_t sweep;
    double sweep_last; /* when conn_on_sweep last ran */
    /* The routes (daemon.c builds them from the configuration). */
    const http_route *routes;
    size_t nroutes;
    /* systemd: the watchdog timer, when the step in flight started, the last
     * STATUS= line sent. */
    uv_timer_t watchdog;
    double step_started;
    char sd_status[160];
    unsigned step_delay_ms; /* GPT2D_TEST_STEP_DELAY_MS: a wedged step, for tests */
    srv_metrics met;        /* loop thread only */
    /* The chat template (chat_template; chat_on 0 when it is "none"). */
    oai_template chat;
    int chat_on;
    double started_wall; /* Unix seconds at start-up (process_start_time_seconds) */
    /* The periodic info line: when it was last written, and the token
     * counters then. */
    uv_timer_t info_timer;
    double info_last;
    uint64_t info_prompt, info_completion;
    /* lifecycle.c: the drain's end and the exit. cut: the drain is over and
     * what still ran was ended (a final event, or 503); closed: the loop's
     * handles are closed and the loop is ending. */
    int cut, closed;
    double cut_at;
    int exit_code; /* srv_main's status once the loop ends */
    uv_signal_t sighup, sigusr1, sigusr2;
    /* reload.c: the command line, read again on SIGHUP. */
    int argc;
    char **argv;
    /* modelwatch.c: the served weights file as it was loaded. */
    uv_timer_t model_timer;
    char model_path[CFG_STR_MAX + 32];
    srv_file_id model_id;
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
    /* Keep-alive: when the last byte before t_ready arrived (the kernel's
     * TCP_INFO; < 0: unknown, not TCP), and when the next head's first byte
     * came (0: none yet; conn_note_recv), which starts its deadline. */
    double t_recv, t_head;
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
/* Connections libmicrohttpd accepts past max_connections, each closed at
 * once (conn_on_notify); LimitNOFILE must cover max_connections + this. */
#define SRV_CONN_HEADROOM 64u

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
 * c's socket, then closes it: for a request refused in the middle of its
 * body, when libmicrohttpd takes no response yet. */
void conn_refuse(srv_conn *c, int status, const char *reason, const char *msg);
/* MHD_OPTION_NOTIFY_CONNECTION: records connections, enforces
 * max_connections. */
void conn_on_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                    enum MHD_ConnectionNotificationCode toe);
/* Every CONN_SWEEP_MS: closes connections past their deadline. */
void conn_on_sweep(uv_timer_t *t);

/* ---- loop.c --------------------------------------------------------------- */

/* Runs libmicrohttpd and re-arms its timeout. */
void loop_mhd_run(srv *s);
void loop_on_poll(uv_poll_t *p, int status, int events);
/* Suspends r's connection; on resume, on_request runs cont (NULL: a stream
 * whose content reader is called again instead). */
void http_suspend(srv_req *r, http_cont cont);
/* Resumes r's connection if it is suspended and still open. */
void http_resume(srv_req *r);
/* Starts an engine step on the work queue if one is planned and none runs. */
void loop_kick(srv *s);
void loop_on_tick(uv_timer_t *t);
void loop_on_watchdog(uv_timer_t *t);
/* systemd's STATUS= line, sent when it changed. */
void loop_sd_status(srv *s);

/* ---- lifecycle.c, reload.c, modelwatch.c ---------------------------------- */

/* srv_main's exit status when the model file changed under the server (a
 * drain, then this status, so that systemd restarts it on the new file). */
#define SRV_EXIT_MODEL_CHANGED 3
/* Seconds the responses ended by a drain's end get to be written before the
 * loop stops regardless (shutdown_timeout + this bounds the exit). */
#define SRV_CUT_GRACE_S 0.5

/* Builds the configuration: defaults < the config file (--config, else
 * /etc/gpt2d/gpt2d.conf when it exists) < the command line; validated.
 * CFG_OK, or the status with err naming the key and its file:line or
 * option. */
cfg_status srv_config_read(cfg_config *c, int argc, char **argv, char *err, size_t errlen);
/* Starts the signal handlers: SIGTERM and SIGINT drain (a second one ends
 * the drain at once), SIGHUP reloads, SIGUSR1 and SIGUSR2 are logged and
 * otherwise ignored. */
void srv_signals_start(srv *s);
/* Starts the drain once: /ready answers 503, new completions 503, running
 * ones finish within shutdown_timeout, then the rest are ended cleanly and
 * the loop stops; srv_main then returns exit_code. why is logged. */
void srv_drain_begin(srv *s, int exit_code, const char *why);
/* Ends the drain now: every request still generating ends with a final
 * event naming the shutdown (streams) or 503 (whole answers). */
void srv_drain_cut(srv *s, const char *why);
/* SIGHUP: reads the configuration again (the file and the command line) and
 * applies the keys that may change while serving; any other changed key is
 * logged as needing a restart; a bad file is refused whole, logged with
 * its file:line. */
void srv_reload(srv *s);
/* The identity of the file at path now (exists 0 when stat fails). */
void srv_file_id_get(const char *path, srv_file_id *out);
/* 1 when a and b are the same file with the same contents, as far as
 * srv_file_id tells. */
int srv_file_id_same(const srv_file_id *a, const srv_file_id *b);
/* Records the served weights file before it is loaded; then watches it
 * (once a second) and drains with SRV_EXIT_MODEL_CHANGED when it changes.
 * Also installs the SIGBUS handler that names the file when a read of its
 * mapping fails (the file shrank under it). */
void srv_model_watch_init(srv *s);
void srv_model_watch_start(srv *s);

/* ---- Handlers (the route table's) ----------------------------------------- */

enum MHD_Result cmpl_route(srv_req *r);           /* completions.c */
enum MHD_Result cmpl_route_chat(srv_req *r);      /* completions.c */
enum MHD_Result tok_route_tokenize(srv_req *r);   /* tokenize.c    */
enum MHD_Result tok_route_detokenize(srv_req *r); /* tokenize.c    */
enum MHD_Result probe_health(srv_req *r);         /* probes.c      */
enum MHD_Result probe_ready(srv_req *r);
enum MHD_Result probe_models(srv_req *r);
enum MHD_Result probe_model(srv_req *r); /* GET /v1/models/{id} */
enum MHD_Result probe_metrics(srv_req *r);
enum MHD_Result probe_version(srv_req *r);
enum MHD_Result ui_page(srv_req *r); /* ui.c: GET / and its assets */

/* The build, as /version and gpt2d_build_info report it. */
const char *srv_version(void);
const char *srv_commit(void);
const char *srv_buildtype(void);
/* The log line of what the server did since the last one (info_interval):
 * nothing when it was idle. */
void loop_on_info(uv_timer_t *t);

/* ---- completions.c / cmpl_respond.c --------------------------------------- */

/* Continues a completion once its prompts are token ids (the continuation of
 * tokenizing). */
enum MHD_Result cmpl_admit(srv_req *r);
/* The engine's event callback (eng_request.on_event; user is a srv_choice). */
void cmpl_on_event(void *user, const eng_event *ev);
json_t *cmpl_base(const srv_req *r);
/* Queues obj as one SSE event and drops the reference (NULL breaks the
 * stream). */
void cmpl_sse_event(srv_req *r, json_t *obj);
/* Streaming: sends the chunk built for choice c (its text and logprobs). */
void cmpl_chunk_flush(srv_choice *c);
/* Streaming: choice c's last chunk, with its finish_reason. */
void cmpl_sse_finish(srv_req *r, const srv_choice *c);
/* Streaming chat: the first chunk of every choice ({"role": "assistant"}). */
void cmpl_chat_open(srv_req *r);
/* The final events of a stream: an error or usage, then [DONE]. */
void cmpl_finish_stream(srv_req *r);
/* The non-streaming answer (the continuation of a suspended completion). */
enum MHD_Result cmpl_send(srv_req *r);
/* Queues the SSE response of r. */
enum MHD_Result cmpl_start_stream(srv_req *r);
/* best_of: one prompt's best_of candidates (mean token logprob mean_lp[j])
 * ranked into order[0..best_of), best first; the answer is the first n.
 * Ties keep their order, and with best_of == n the candidates stay as they
 * are. */
void cmpl_rank(const double *mean_lp, size_t best_of, size_t n, size_t *order);
/* A stream's back-pressure, after its queue grew or shrank: pauses its
 * choices while the client leaves more than stream_backlog_bytes unread,
 * resumes them when it catches up; 1 when it resumed them (the caller
 * kicks the engine). */
int cmpl_backlog(srv_req *r);
/* Cancels a stream paused for longer than stream_stall_timeout, with an
 * error event; 1 if it did. */
int cmpl_stall_check(srv_req *r, double now);
/* Ends r with a 500 once (an error event for a stream): out of memory. */
void cmpl_fail_oom(srv_req *r);
/* Appends n bytes of text to choice c (a failure ends r with a 500). */
void cmpl_choice_text(srv_choice *c, const char *p, size_t n);

/* ---- logprobs.c ----------------------------------------------------------- */

/* The logprobs of choice c in its request's shape: legacy completions
 * {tokens, token_logprobs, top_logprobs, text_offset}, or chat {content}. */
json_t *lp_new(const srv_req *r);
/* How many tokens lp holds. */
size_t lp_count(const json_t *lp);
/* Counts token id into c's character offset; returns the offset before it. */
size_t lp_offset_feed(srv_choice *c, int32_t id);
/* Appends one token's entry (ev NULL: the first prompt token, no logprob). */
void lp_add(srv_choice *c, int32_t id, const eng_event *ev, size_t offset);

/* ---- tokpool.c: the tokenizer threads ------------------------------------ */

typedef void (*tpool_fn)(srv_req *r);

/* Starts nthreads low-priority threads that call run(r) for each submitted
 * request, then done(r) on the loop thread. 0, or -1 with err (then
 * tpool_close and tpool_free what *out holds). */
int tpool_new(uv_loop_t *loop, size_t nthreads, tpool_fn run, tpool_fn done, tokpool **out,
              char *err, size_t errlen);
/* Queues r (FIFO); one thread runs it when free. */
void tpool_submit(tokpool *p, srv_req *r);
/* Stops taking work and closes the wake-up handle (before uv_run returns);
 * done is not called again. NULL: nothing. */
void tpool_close(tokpool *p);
/* Joins the threads (a job running finishes first), calls drop(r) for
 * each request still queued or done but not delivered (the loop stopped
 * first), and frees p. After uv_run returned. NULL: nothing. */
void tpool_free(tokpool *p, tpool_fn drop);

/* ---- tokenize.c ----------------------------------------------------------- */

/* Tokenizes r's text prompts (inline, or on the work queue with r
 * suspended), then runs then. Large bodies are admitted like generation:
 * tokenize_concurrency at once on the work queue, up to max_queue more
 * waiting (for at most queue_timeout: 503), others get 429. A completion's
 * prompt stops being tokenized past max_prompt_tokens (BPE_ETOOBIG). */
enum MHD_Result tok_prompts(srv_req *r, http_cont then);
/* A completion or chat body into r->oreq by the route's parser (r->cmpl_chat,
 * r->cmpl_lim), then the prompts given as ids into prompt_ids. 0, or -1 with
 * r->cmpl_err set. Thread: the loop thread, or a tokenizer thread while
 * tok_running. (completions.c) */
int cmpl_parse(srv_req *r);
/* Starts s->tokpool with tokenize_concurrency threads. 0, or -1 with err. */
int tok_pool_start(srv *s, char *err, size_t errlen);
/* Stops s->tokpool's threads (after uv_run returned) and frees the
 * requests they held, whose connections libmicrohttpd has closed. */
void tok_pool_free(srv *s);
/* Takes r out of the tokenize wait list (its client left). */
void tok_unwait(srv_req *r);
/* The 1 s tick: waiting bodies past queue_timeout get 503. */
void tok_tick(srv *s, double now);
/* Token ids as text: their bytes made valid UTF-8 (a split character is
 * U+FFFD). *out is malloc'd; BPE_EUNKNOWN for an id that is not a token
 * (with err), BPE_ENOMEM. */
bpe_status tok_ids_text(const bpe *tok, const int32_t *ids, size_t n, char **out, size_t *len,
                        char *err, size_t errlen);

#endif
