/*
 * server/server.c: the daemon. Where a request goes:
 *
 *   socket -> libmicrohttpd (on the loop thread) -> on_request: route, body
 *   -> completions: oai_parse_completion -> tokenize -> eng_sched_submit
 *      (one engine request per prompt x n) -> the connection is suspended
 *   -> a step on the work queue (kick/work_cb/after_cb)
 *   -> on_event (loop thread): token bytes -> UTF-8 stream decoder -> stop
 *      matcher -> the choice's text, or an SSE chunk -> resume the connection
 *   -> libmicrohttpd sends the JSON body, or the chunks as they come
 *
 * Lifetimes: a request (srv_req) is freed when its connection is done and
 * every engine request it made has delivered DONE, whichever comes last; a
 * client that goes away cancels its engine requests.
 */
#include "server.h"

#include "config.h"
#include "engine.h"
#include "oai.h"
#include "sse.h"
#include "systemd.h"
#include "tokenizer.h"

#include <jansson.h>
#include <microhttpd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#ifndef GPT2D_BUILD_VERSION
#define GPT2D_BUILD_VERSION "dev"
#endif

#define EOT 50256
/* The longest stop string a request may give; the stop matcher holds back
 * less than this, so its output fits on the stack. */
#define SRV_MAX_STOP_BYTES 256
/* The bytes of one token, at most (GPT-2's longest is 128). */
#define SRV_MAX_TOKEN_BYTES 256

typedef struct srv srv;
typedef struct srv_req srv_req;

/* ---- Metrics: counters and histograms (loop thread only) -------------------- */

#define MET_BUCKETS 14
static const double met_seconds[MET_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                1,     2.5,  5,     10,   30,  60,   120};
static const double met_rows[MET_BUCKETS] = {1,   2,   4,   8,    16,   32,   64,
                                             128, 256, 512, 1024, 2048, 4096, 8192};

typedef struct {
    const double *bounds;
    uint64_t counts[MET_BUCKETS]; /* non-cumulative; printed cumulative */
    uint64_t count;
    double sum;
} met_hist;

static void met_observe(met_hist *h, double v)
{
    for (size_t i = 0; i < MET_BUCKETS; i++)
        if (v <= h->bounds[i]) {
            h->counts[i]++;
            break;
        }
    h->count++;
    h->sum += v;
}

static void met_print(FILE *m, const char *name, const char *help, const met_hist *h)
{
    fprintf(m, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i < MET_BUCKETS; i++) {
        cum += h->counts[i];
        fprintf(m, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    fprintf(m, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
            (unsigned long long)h->count, name, h->sum, name, (unsigned long long)h->count);
}

static const char *const met_routes[] = {"/v1/completions", "/v1/models", "/health",     "/ready",
                                         "/metrics",        "/tokenize",  "/detokenize", "other"};
#define MET_ROUTES (sizeof met_routes / sizeof met_routes[0])
static const unsigned met_statuses[] = {200, 400, 401, 404, 405, 408, 413, 429, 500, 503, 0};
#define MET_STATUSES (sizeof met_statuses / sizeof met_statuses[0])

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
} srv_choice;

struct srv_req {
    srv *s;
    struct MHD_Connection *conn;
    int suspended, conn_done, responded;
    int cancelling; /* inside on_completed's cancel loop: do not free yet */
    char method[8], url[64];
    enum { R_UNKNOWN, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE } route;
    /* Tokenizing a large body runs on the work queue (tok_state RUNNING):
     * the worker writes prompt_ids/prompt_len and tok_err, nothing else
     * touches them until tok_after_cb runs on the loop thread. */
    enum { TOK_NONE, TOK_RUNNING, TOK_DONE } tok_state;
    uv_work_t tok_work;
    json_t *tok_json; /* /tokenize: the parsed body, which holds the text */
    int tok_failed;
    char tok_err[256];
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
    /* Streaming: SSE bytes waiting to be sent. */
    sse_queue sse;
    int error_status; /* a failure after submission */
    char error_msg[256];
    srv_req *prev, *next; /* the list of requests with engine work */
};

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
    size_t tokenizing; /* requests tokenizing on the work queue */
    double drain_started;
    bpe *tok;
    eng_model *model;
    eng_sched *sched;
    char fingerprint[32];
    uint64_t next_id;
    size_t active; /* requests alive */
    srv_req *head; /* requests with engine work (for the 1 s tick) */
    uv_timer_t tick;
    /* systemd: the watchdog timer, when the step in flight started, the last
     * STATUS= line sent. */
    uv_timer_t watchdog;
    double step_started;
    char sd_status[160];
    unsigned step_delay_ms; /* GPT2D_TEST_STEP_DELAY_MS: a wedged step, for tests */
    /* Metrics (loop thread only). */
    uint64_t requests[MET_ROUTES][MET_STATUSES]; /* the last status column: others */
    uint64_t prompt_tokens, completion_tokens, aborted;
    met_hist ttft, itl, duration, step_seconds, step_rows;
};

static void log_line(const char *level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static int log_max = 2; /* the most verbose level written: 0 error .. 3 debug */

static int level_rank(const char *level)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (strcmp(level, names[i]) == 0) return i;
    return 2;
}

/* One line per event on stderr: "TIMESTAMP LEVEL message", or, when stderr
 * is the journal (which stamps lines itself), "<PRIORITY>message" with the
 * syslog priority of the level (3 error, 4 warning, 6 info, 7 debug). */
static void log_line(const char *level, const char *fmt, ...)
{
    int rank = level_rank(level);
    if (rank > log_max) return;
    char line[4096];
    int n;
    if (srv_sd_journal()) {
        static const int prio[] = {3, 4, 6, 7};
        n = snprintf(line, sizeof line, "<%d>", prio[rank]);
    } else {
        char ts[32];
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
        n = snprintf(line, sizeof line, "%s %s ", ts, level);
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* One write per line, so that lines from a crash or another process
     * sharing the stream do not interleave mid-line. */
    fprintf(stderr, "%s\n", line);
}

/* A start-up failure: one line, "gpt2d serve: message", at error priority
 * in the journal. */
static void fatal_line(const char *msg)
{
    fprintf(stderr, "%sgpt2d serve: %s\n", srv_sd_journal() ? "<3>" : "", msg);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- Driving libmicrohttpd from the loop ----------------------------------- */

static void mhd_run(srv *s);

static void on_timer(uv_timer_t *t)
{
    mhd_run(t->data);
}

static void on_poll(uv_poll_t *p, int status, int events)
{
    (void)status;
    (void)events;
    mhd_run(p->data);
}

/* Runs libmicrohttpd and re-arms its timeout. */
static void mhd_run(srv *s)
{
    if (s->mhd == NULL) return;
    MHD_run(s->mhd);
    MHD_UNSIGNED_LONG_LONG ms;
    if (MHD_get_timeout(s->mhd, &ms) == MHD_YES)
        uv_timer_start(&s->timer, on_timer, ms > 1000 ? 1000 : ms, 0);
    else
        uv_timer_start(&s->timer, on_timer, 1000, 0);
}

static void resume(srv_req *r)
{
    if (r->suspended && !r->conn_done) {
        r->suspended = 0;
        MHD_resume_connection(r->conn);
    }
}

/* ---- Driving the scheduler ------------------------------------------------- */

static void kick(srv *s);

static void work_cb(uv_work_t *w)
{
    srv *s = w->data;
    if (s->step_delay_ms > 0) usleep(s->step_delay_ms * 1000u);
    eng_sched_execute(s->sched);
}

static void after_cb(uv_work_t *w, int status)
{
    (void)status;
    srv *s = w->data;
    s->in_flight = 0;
    eng_sched_complete(s->sched); /* events: on_event */
    eng_sched_stats st;
    eng_sched_stats_get(s->sched, &st);
    met_observe(&s->step_seconds, st.last_step_seconds);
    met_observe(&s->step_rows, (double)st.last_step_rows);
    kick(s);
    mhd_run(s); /* serve the connections the events resumed */
}

static void kick(srv *s)
{
    if (s->in_flight || !eng_sched_plan(s->sched)) return;
    s->in_flight = 1;
    s->step_started = now_s();
    s->work.data = s;
    if (uv_queue_work(s->loop, &s->work, work_cb, after_cb) != 0) {
        /* Cannot happen with a live loop; run it here rather than stall. */
        eng_sched_execute(s->sched);
        s->in_flight = 0;
        eng_sched_complete(s->sched);
    }
}

/* ---- Requests -------------------------------------------------------------- */

static void req_unlink(srv_req *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else if (r->s->head == r)
        r->s->head = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

static void req_free(srv_req *r)
{
    req_unlink(r);
    for (size_t i = 0; i < r->nchoices; i++) {
        stop_free(r->choices[i].stop);
        free(r->choices[i].text);
        json_decref(r->choices[i].lp);
    }
    free(r->choices);
    for (size_t i = 0; i < r->nprompts; i++) free(r->prompt_ids[i]);
    free(r->prompt_ids);
    free(r->prompt_len);
    oai_request_free(&r->oreq);
    json_decref(r->tok_json);
    free(r->body);
    sse_free(&r->sse);
    r->s->active--;
    free(r);
}

static void req_maybe_free(srv_req *r)
{
    if (r->conn_done && r->nlive == 0 && r->tok_state != TOK_RUNNING) req_free(r);
}

static int append(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1) c *= 2;
        char *b = realloc(*buf, c);
        if (b == NULL) return -1;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

/* Queues obj as one SSE event and drops the reference (NULL: out of memory,
 * which breaks the stream rather than leaving a hole in it). */
static void sse_event(srv_req *r, json_t *obj)
{
    if (obj == NULL)
        r->sse.failed = 1;
    else
        sse_data(&r->sse, obj);
    json_decref(obj);
}

static json_t *completion_base(const srv_req *r)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", r->id, "object", "text_completion",
                     "created", (json_int_t)r->created, "model", r->s->cfg.model_name,
                     "system_fingerprint", r->s->fingerprint);
}

/* A streamed piece of one choice's text (finish NULL while it goes on). */
static void sse_choice(srv_req *r, const srv_choice *c, const char *text, size_t n,
                       const char *finish)
{
    json_t *o = completion_base(r);
    json_t *ch = json_pack("{s:s%, s:I, s:n, s:o}", "text", text, n, "index", (json_int_t)c->index,
                           "logprobs", "finish_reason", finish ? json_string(finish) : json_null());
    json_object_set_new(o, "choices", json_pack("[o]", ch));
    if (r->oreq.include_usage) json_object_set_new(o, "usage", json_null());
    sse_event(r, o);
}

static size_t usage_completion(const srv_req *r)
{
    size_t n = 0;
    for (size_t i = 0; i < r->nchoices; i++) n += r->choices[i].tokens;
    return n;
}

static size_t usage_prompt(const srv_req *r)
{
    size_t n = 0;
    if (r->tok_state == TOK_RUNNING) return 0; /* the worker is writing them */
    for (size_t i = 0; i < r->nprompts; i++) n += r->prompt_len[i];
    return n;
}

/* ---- logprobs --------------------------------------------------------------- */

static json_t *lp_new(void)
{
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                     "text_offset");
}

/* A token as text: its bytes when they are whole UTF-8, else OpenAI's
 * "bytes:\xe6\x97" spelling. */
static json_t *token_json(const srv *s, int32_t id)
{
    size_t len;
    const char *b = bpe_token_bytes(s->tok, id, &len);
    if (b == NULL) return json_string("");
    if (utf8_valid(b, len)) return json_stringn(b, len);
    char buf[6 + 4 * 256 + 1];
    size_t o = (size_t)snprintf(buf, sizeof buf, "bytes:");
    for (size_t i = 0; i < len && i < 256; i++)
        o += (size_t)snprintf(buf + o, sizeof buf - o, "\\x%02x", (unsigned char)b[i]);
    return json_stringn(buf, o);
}

/* Counts token id into the character offset; returns the offset before it. */
static size_t offset_feed(srv_choice *c, int32_t id)
{
    size_t before = c->off_chars, len;
    const char *b = bpe_token_bytes(c->req->s->tok, id, &len);
    if (b == NULL) return before;
    char out[UTF8_STREAM_MAX_OUT(256)];
    size_t n = utf8_stream_feed(&c->off_utf8, b, len > 256 ? 256 : len, out);
    for (size_t i = 0; i < n; i++) c->off_chars += ((unsigned char)out[i] & 0xC0) != 0x80;
    return before;
}

/* Appends one token's entry (logprob NULL for the first prompt token). */
static void lp_add(srv_choice *c, int32_t id, const eng_event *ev, size_t offset)
{
    srv *s = c->req->s;
    json_array_append_new(json_object_get(c->lp, "tokens"), token_json(s, id));
    json_array_append_new(json_object_get(c->lp, "token_logprobs"),
                          ev ? json_real(ev->logprob) : json_null());
    json_t *top = json_null();
    if (ev != NULL && c->req->oreq.logprobs > 0) {
        top = json_object();
        for (size_t k = 0; k < ev->ntop; k++) {
            json_t *t = token_json(s, ev->top_ids[k]);
            json_object_set_new(top, json_string_value(t), json_real(ev->top_logprobs[k]));
            json_decref(t);
        }
    }
    json_array_append_new(json_object_get(c->lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(c->lp, "text_offset"), json_integer((json_int_t)offset));
}

/* Streaming: sends the chunk built for choice c (its text and logprobs). */
static void chunk_flush(srv_choice *c)
{
    srv_req *r = c->req;
    int has_lp = c->lp != NULL && json_array_size(json_object_get(c->lp, "tokens")) > 0;
    if (c->text_len == 0 && !has_lp) return;
    json_t *o = completion_base(r);
    json_t *ch =
        json_pack("{s:s%, s:I, s:O, s:n}", "text", c->text ? c->text : "", c->text_len, "index",
                  (json_int_t)c->index, "logprobs", has_lp ? c->lp : json_null(), "finish_reason");
    json_object_set_new(o, "choices", json_pack("[o]", ch));
    if (r->oreq.include_usage) json_object_set_new(o, "usage", json_null());
    sse_event(r, o);
    c->text_len = 0;
    if (has_lp) {
        json_decref(c->lp);
        c->lp = lp_new();
    }
}

/* Text that the decoder and the stop matcher released for choice c. */
/* Ends the request with a 500 (an error event for a stream) once: text that
 * cannot be kept must not be silently missing from the answer. */
static void req_fail_oom(srv_req *r)
{
    if (r->error_status != 0) return;
    r->error_status = 500;
    snprintf(r->error_msg, sizeof r->error_msg, "out of memory while building the response");
    for (size_t i = 0; i < r->nchoices; i++)
        if (r->choices[i].live) eng_sched_cancel(r->s->sched, r->choices[i].id);
}

static void choice_text(srv_choice *c, const char *p, size_t n)
{
    if (n == 0) return;
    if (append(&c->text, &c->text_len, &c->text_cap, p, n) != 0) req_fail_oom(c->req);
}

/* Feeds decoded text through the stop matcher. */
static void choice_feed(srv_choice *c, const char *p, size_t n)
{
    if (c->stopped) return;
    if (c->stop == NULL) {
        choice_text(c, p, n);
        return;
    }
    char out[SRV_MAX_STOP_BYTES + UTF8_STREAM_MAX_OUT(SRV_MAX_TOKEN_BYTES)];
    int stopped = 0;
    size_t w = stop_feed(c->stop, p, n, out, &stopped);
    if (w == (size_t)-1)
        req_fail_oom(c->req);
    else
        choice_text(c, out, w);
    if (stopped) {
        c->stopped = 1;
        eng_sched_cancel(c->req->s->sched, c->id); /* DONE follows */
    }
}

static void finish_stream(srv_req *r)
{
    if (r->error_status != 0) { /* after the headers: an error event, then [DONE] */
        oai_error e;
        oai_error_set(&e, r->error_status, "server_error", NULL, NULL, "%s", r->error_msg);
        char *js = oai_error_json(&e);
        if (js == NULL || sse_data_raw(&r->sse, js) != 0) r->sse.failed = 1;
        free(js);
    } else if (r->oreq.include_usage) {
        size_t pt = usage_prompt(r) * r->oreq.n, ct = usage_completion(r);
        json_t *o = completion_base(r);
        json_object_set_new(o, "choices", json_array());
        json_object_set_new(o, "usage",
                            json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)pt,
                                      "completion_tokens", (json_int_t)ct, "total_tokens",
                                      (json_int_t)(pt + ct)));
        sse_event(r, o);
    }
    sse_done(&r->sse);
}

static void on_event(void *user, const eng_event *ev)
{
    srv_choice *c = user;
    srv_req *r = c->req;
    int stream = r->oreq.stream && !r->conn_done;
    if (ev->kind == ENG_EV_PROMPT_LOGPROB) {
        /* Prompt positions arrive in order; count the tokens before them. */
        while (c->prompt_fed < ev->index) offset_feed(c, r->prompt_ids[c->prompt][c->prompt_fed++]);
        size_t off = offset_feed(c, ev->token);
        c->prompt_fed++;
        if (c->lp != NULL) lp_add(c, ev->token, ev, off);
        if (stream) chunk_flush(c);
    } else if (ev->kind == ENG_EV_TOKEN) {
        double t = now_s();
        if (c->tokens == 0)
            met_observe(&r->s->ttft, t - r->t_start);
        else
            met_observe(&r->s->itl, t - c->t_last);
        c->t_last = t;
        c->tokens++;
        c->lp_sum += ev->logprob;
        c->lp_n++;
        while (c->prompt_fed < r->prompt_len[c->prompt])
            offset_feed(c, r->prompt_ids[c->prompt][c->prompt_fed++]);
        size_t off = offset_feed(c, ev->token);
        int eot = ev->token == EOT && !r->oreq.ignore_eos;
        if (c->lp != NULL && !c->stopped) lp_add(c, ev->token, ev, off);
        size_t len;
        const char *b = eot ? NULL : bpe_token_bytes(r->s->tok, ev->token, &len);
        if (b != NULL) {
            char buf[UTF8_STREAM_MAX_OUT(SRV_MAX_TOKEN_BYTES)];
            if (len > SRV_MAX_TOKEN_BYTES) len = SRV_MAX_TOKEN_BYTES;
            size_t n = utf8_stream_feed(&c->utf8, b, len, buf);
            choice_feed(c, buf, n);
        }
        if (stream) chunk_flush(c);
    } else if (ev->kind == ENG_EV_DONE) {
        c->live = 0;
        r->nlive--;
        if (!c->stopped) {
            char tail[4];
            size_t n = utf8_stream_flush(&c->utf8, tail);
            choice_feed(c, tail, n);
            if (c->stop != NULL && !c->stopped) {
                char out[SRV_MAX_STOP_BYTES];
                choice_text(c, out, stop_flush(c->stop, out));
            }
        }
        if (ev->finish == ENG_FINISH_ERROR && r->error_status == 0) {
            r->error_status = 500;
            snprintf(r->error_msg, sizeof r->error_msg, "generation failed: %s",
                     ev->message ? ev->message : "unknown error");
        }
        c->finish = c->stopped || ev->finish == ENG_FINISH_EOS ? "stop" : "length";
        c->done = 1;
        r->ndone++;
        if (stream) {
            chunk_flush(c);
            sse_choice(r, c, "", 0, c->finish);
        }
        if (r->ndone == r->nchoices && r->oreq.stream) finish_stream(r);
    }
    if (r->conn_done) {
        if (!r->cancelling) req_maybe_free(r);
    } else {
        resume(r);
    }
}

/* Token ids as text: their bytes made valid UTF-8 as generated text is (a
 * character split or cut short becomes U+FFFD). *out is malloc'd; an id
 * that is not a token is BPE_EUNKNOWN (with err), no memory BPE_ENOMEM. */
static bpe_status ids_text(const bpe *tok, const int32_t *ids, size_t n, char **out, size_t *len,
                           char *err, size_t errlen)
{
    char *bytes;
    size_t nb;
    bpe_status st = bpe_decode(tok, ids, n, &bytes, &nb, err, errlen);
    if (st != BPE_OK) return st;
    char *text = malloc(UTF8_STREAM_MAX_OUT(nb) + 1);
    if (text == NULL) {
        free(bytes);
        snprintf(err, errlen, "out of memory");
        return BPE_ENOMEM;
    }
    utf8_stream u;
    utf8_stream_init(&u);
    size_t tn = utf8_stream_feed(&u, bytes, nb, text);
    tn += utf8_stream_flush(&u, text + tn);
    text[tn] = '\0';
    free(bytes);
    *out = text;
    *len = tn;
    return BPE_OK;
}

/* ---- Responses --------------------------------------------------------------- */

static enum MHD_Result send_json(struct MHD_Connection *conn, unsigned status, const char *body,
                                 const char *retry_after)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (resp == NULL) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    if (retry_after != NULL) MHD_add_response_header(resp, "Retry-After", retry_after);
    enum MHD_Result rc = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result send_error(srv_req *r, int status, const char *type, const char *code,
                                  const char *param, const char *retry_after, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 7, 8)))
#endif
    ;

static enum MHD_Result send_error(srv_req *r, int status, const char *type, const char *code,
                                  const char *param, const char *retry_after, const char *fmt, ...)
{
    oai_error e;
    va_list ap;
    va_start(ap, fmt);
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    oai_error_set(&e, status, type, code, param, "%s", msg);
    char *js = oai_error_json(&e);
    r->responded = 1;
    enum MHD_Result rc =
        send_json(r->conn, (unsigned)status, js ? js : "{\"error\":{}}", retry_after);
    free(js);
    return rc;
}

/* A 200 with obj as compact JSON; takes obj's reference. NULL (a failed
 * json_pack) or a failed dump is a 500. */
static enum MHD_Result send_obj(srv_req *r, json_t *obj)
{
    char *js = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (js == NULL) return send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    r->responded = 1;
    enum MHD_Result rc = send_json(r->conn, 200, js, NULL);
    free(js);
    return rc;
}

static enum MHD_Result send_oai_error(srv_req *r, const oai_error *e)
{
    char *js = oai_error_json(e);
    r->responded = 1;
    enum MHD_Result rc = send_json(r->conn, (unsigned)e->status, js ? js : "{}", NULL);
    free(js);
    return rc;
}

/* A candidate's mean token logprob (best_of ranks by it). */
static double choice_mean_lp(const srv_choice *c)
{
    return c->lp_n ? c->lp_sum / (double)c->lp_n : -1e30;
}

static enum MHD_Result send_completion(srv_req *r)
{
    if (r->error_status != 0)
        return send_error(r, r->error_status, "server_error", NULL, NULL,
                          r->error_status == 503 ? "5" : NULL, "%s", r->error_msg);
    json_t *o = completion_base(r);
    json_t *choices = json_array();
    size_t n = r->oreq.n, best_of = r->oreq.best_of;
    srv_choice *rank[128]; /* best_of <= max_n <= 128 */
    for (size_t pi = 0; pi < r->nprompts; pi++) {
        /* best_of: this prompt's n candidates with the highest mean token
         * logprob, best first; a stable insertion sort, so ties keep their
         * order (with best_of == n, the candidates as they are). */
        for (size_t j = 0; j < best_of; j++) {
            srv_choice *c = &r->choices[pi * best_of + j];
            size_t at = j;
            if (best_of > n)
                while (at > 0 && choice_mean_lp(c) > choice_mean_lp(rank[at - 1])) {
                    rank[at] = rank[at - 1];
                    at--;
                }
            rank[at] = c;
        }
        for (size_t k = 0; k < n; k++) {
            srv_choice *c = rank[k];
            size_t i = pi * n + k;
            json_t *text;
            if (r->oreq.echo) {
                char *pt, err[64];
                size_t plen;
                if (ids_text(r->s->tok, r->prompt_ids[pi], r->prompt_len[pi], &pt, &plen, err,
                             sizeof err)
                    != BPE_OK) {
                    json_decref(choices);
                    json_decref(o);
                    return send_error(r, 500, "server_error", NULL, NULL, NULL, "%s", err);
                }
                char *joined = realloc(pt, plen + c->text_len + 1);
                if (joined == NULL) {
                    free(pt);
                    json_decref(choices);
                    json_decref(o);
                    return send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
                }
                if (c->text_len > 0) memcpy(joined + plen, c->text, c->text_len);
                text = json_stringn(joined, plen + c->text_len);
                free(joined);
            } else {
                text = json_stringn(c->text ? c->text : "", c->text_len);
            }
            json_array_append_new(choices,
                                  json_pack("{s:o, s:I, s:O, s:s}", "text", text, "index",
                                            (json_int_t)i, "logprobs", c->lp ? c->lp : json_null(),
                                            "finish_reason", c->finish));
        }
    }
    json_object_set_new(o, "choices", choices);
    size_t pt = usage_prompt(r) * r->oreq.n, ct = usage_completion(r); /* all candidates */
    json_object_set_new(o, "usage",
                        json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)pt,
                                  "completion_tokens", (json_int_t)ct, "total_tokens",
                                  (json_int_t)(pt + ct)));
    return send_obj(r, o);
}

/* The SSE body, chunk by chunk as on_event produces it. */
static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    srv_req *r = cls;
    if (r->sse.failed) return MHD_CONTENT_READER_END_WITH_ERROR; /* out of memory */
    if (sse_pending(&r->sse) > 0) return (ssize_t)sse_take(&r->sse, buf, max);
    if (sse_finished(&r->sse)) return MHD_CONTENT_READER_END_OF_STREAM;
    /* Nothing yet: sleep until on_event resumes us (no busy polling). */
    r->suspended = 1;
    MHD_suspend_connection(r->conn);
    return 0;
}

/* ---- Routes ------------------------------------------------------------------ */

/* GET /metrics: Prometheus text format. */
static enum MHD_Result route_metrics(srv_req *r)
{
    srv *s = r->s;
    eng_sched_stats st;
    eng_sched_stats_get(s->sched, &st);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (m == NULL) return send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    fprintf(m, "# HELP gpt2d_requests_total HTTP requests by route and status.\n"
               "# TYPE gpt2d_requests_total counter\n");
    for (size_t ri = 0; ri < MET_ROUTES; ri++)
        for (size_t si = 0; si < MET_STATUSES; si++) {
            if (s->requests[ri][si] == 0) continue;
            char code[16];
            if (met_statuses[si] == 0)
                snprintf(code, sizeof code, "other");
            else
                snprintf(code, sizeof code, "%u", met_statuses[si]);
            fprintf(m, "gpt2d_requests_total{route=\"%s\",status=\"%s\"} %llu\n", met_routes[ri],
                    code, (unsigned long long)s->requests[ri][si]);
        }
    met_print(m, "gpt2d_time_to_first_token_seconds", "From the request to its first token.",
              &s->ttft);
    met_print(m, "gpt2d_inter_token_latency_seconds", "Between consecutive tokens of a choice.",
              &s->itl);
    met_print(m, "gpt2d_request_duration_seconds", "Completion requests, start to end.",
              &s->duration);
    met_print(m, "gpt2d_step_duration_seconds", "One engine step: forward and sampling.",
              &s->step_seconds);
    met_print(m, "gpt2d_step_batch_rows", "Rows (tokens) per engine step.", &s->step_rows);
    fprintf(m,
            "# TYPE gpt2d_requests_aborted_total counter\ngpt2d_requests_aborted_total %llu\n"
            "# TYPE gpt2d_prompt_tokens_total counter\ngpt2d_prompt_tokens_total %llu\n"
            "# TYPE gpt2d_completion_tokens_total counter\ngpt2d_completion_tokens_total %llu\n"
            "# HELP gpt2d_running_sequences Sequences in the running batch.\n"
            "# TYPE gpt2d_running_sequences gauge\ngpt2d_running_sequences %zu\n"
            "# TYPE gpt2d_queued_requests gauge\ngpt2d_queued_requests %zu\n"
            "# TYPE gpt2d_kv_blocks_used gauge\ngpt2d_kv_blocks_used %zu\n"
            "# TYPE gpt2d_kv_blocks_total gauge\ngpt2d_kv_blocks_total %zu\n"
            "# TYPE gpt2d_steps_total counter\ngpt2d_steps_total %llu\n"
            "# TYPE gpt2d_last_step_rows gauge\ngpt2d_last_step_rows %zu\n"
            "# TYPE gpt2d_last_step_seconds gauge\ngpt2d_last_step_seconds %.6f\n",
            (unsigned long long)s->aborted, (unsigned long long)s->prompt_tokens,
            (unsigned long long)s->completion_tokens, st.running, st.queued, st.kv_blocks_used,
            st.kv_blocks_total, (unsigned long long)st.steps, st.last_step_rows,
            st.last_step_seconds);
    /* The weight format served (engine.h, eng_model_dtype). */
    fprintf(m,
            "# HELP gpt2d_model_info The served model's weight format.\n"
            "# TYPE gpt2d_model_info gauge\ngpt2d_model_info{dtype=\"%s\"} 1\n",
            eng_model_dtype(s->model));
    int bad = ferror(m);
    if (fclose(m) != 0 || bad || buf == NULL) { /* a write failed: never a partial page */
        free(buf);
        return send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(buf);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4");
    r->responded = 1;
    enum MHD_Result rc = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result route_models(srv_req *r)
{
    json_t *o = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:s}]}", "object", "list", "data", "id",
                          r->s->cfg.model_name, "object", "model", "created", (json_int_t)0,
                          "owned_by", "gpt2d", "dtype", eng_model_dtype(r->s->model));
    return send_obj(r, o);
}

/* Retry-After for 429/503: the time the queue ahead needs at the measured
 * step rate, at least a second. */
static void retry_after(const srv *s, char *buf, size_t len)
{
    eng_sched_stats st;
    eng_sched_stats_get(s->sched, &st);
    double step = st.last_step_seconds > 0 ? st.last_step_seconds : 0.05;
    double secs = (double)(st.queued + 1) * step * 16;
    if (secs < 1) secs = 1;
    if (secs > 60) secs = 60;
    snprintf(buf, len, "%.0f", secs);
}

/* ---- Tokenizing, inline or on the work queue ---------------------------------- */

/* Bodies whose texts are at least this long are tokenized on the work queue:
 * the tokenizer does ~50 MB/s, so a 1 MB prompt would hold the loop thread
 * (every stream's next token) for ~20 ms; a typical prompt costs microseconds
 * and is cheaper inline than a trip through the queue. */
#define SRV_TOKENIZE_INLINE_BYTES (64u * 1024u)

static enum MHD_Result completions_admit(srv_req *r);
static enum MHD_Result tokenize_respond(srv_req *r);

/* The text of prompt i, or NULL for a prompt given as token ids. */
static const char *prompt_text(const srv_req *r, size_t i, size_t *len)
{
    if (r->route == R_TOKENIZE) {
        json_t *p = json_object_get(r->tok_json, "prompt");
        *len = json_string_length(p);
        return json_string_value(p);
    }
    *len = r->oreq.prompts[i].text_len;
    return r->oreq.prompts[i].text;
}

/* Encodes every text prompt into prompt_ids/prompt_len. Thread: the loop
 * thread, or a worker while tok_state is TOK_RUNNING. */
static void tokenize_run(srv_req *r)
{
    for (size_t i = 0; i < r->nprompts && !r->tok_failed; i++) {
        size_t len;
        const char *text = prompt_text(r, i, &len);
        if (text == NULL) continue;
        /* "<|endoftext|>" in a prompt is the token, as the model knows it */
        if (bpe_encode_special(r->s->tok, text, len, &r->prompt_ids[i], &r->prompt_len[i],
                               r->tok_err, sizeof r->tok_err)
            != BPE_OK)
            r->tok_failed = 1;
    }
}

static void tok_work_cb(uv_work_t *w)
{
    tokenize_run(w->data);
}

static void tok_after_cb(uv_work_t *w, int status)
{
    (void)status;
    srv_req *r = w->data;
    r->s->tokenizing--;
    r->tok_state = TOK_DONE;
    if (r->conn_done) { /* the client left meanwhile */
        req_maybe_free(r);
        return;
    }
    resume(r); /* on_request continues with completions_admit or tokenize_respond */
    mhd_run(r->s);
}

/* Tokenizes the request's text prompts, then continues with its route. */
static enum MHD_Result tokenize(srv_req *r)
{
    size_t bytes = 0;
    for (size_t i = 0; i < r->nprompts; i++) {
        size_t len;
        if (prompt_text(r, i, &len) != NULL) bytes += len;
    }
    if (bytes >= SRV_TOKENIZE_INLINE_BYTES) {
        r->tok_work.data = r;
        if (uv_queue_work(r->s->loop, &r->tok_work, tok_work_cb, tok_after_cb) == 0) {
            r->tok_state = TOK_RUNNING;
            r->s->tokenizing++;
            r->suspended = 1;
            MHD_suspend_connection(r->conn);
            return MHD_YES;
        }
    }
    tokenize_run(r);
    return r->route == R_TOKENIZE ? tokenize_respond(r) : completions_admit(r);
}

static enum MHD_Result route_completions(srv_req *r)
{
    srv *s = r->s;
    const eng_config *mc = eng_model_config(s->model);
    oai_limits lim = {.vocab_size = mc->n_vocab,
                      .max_tokens_limit = s->cfg.max_tokens_limit,
                      .max_n = s->cfg.max_n,
                      .max_stop_bytes = SRV_MAX_STOP_BYTES,
                      .max_prompts = 64};
    oai_error e;
    if (oai_parse_completion(r->body ? r->body : "", r->body_len, &lim, &r->oreq, &e) != 0)
        return send_oai_error(r, &e);
    oai_request *q = &r->oreq;
    if (strcmp(q->model, s->cfg.model_name) != 0)
        return send_error(r, 404, "invalid_request_error", "model_not_found", "model", NULL,
                          "The model '%s' does not exist; this server serves '%s'", q->model,
                          s->cfg.model_name);
    r->route = R_COMPLETIONS;
    r->nprompts = q->nprompts;
    r->prompt_ids = calloc(q->nprompts, sizeof *r->prompt_ids);
    r->prompt_len = calloc(q->nprompts, sizeof *r->prompt_len);
    if (r->prompt_ids == NULL || r->prompt_len == NULL)
        return send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    for (size_t i = 0; i < q->nprompts; i++) {
        const oai_prompt *p = &q->prompts[i];
        if (p->text == NULL) {
            r->prompt_ids[i] = malloc((p->nids ? p->nids : 1) * sizeof(int32_t));
            if (r->prompt_ids[i] == NULL)
                return send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
            memcpy(r->prompt_ids[i], p->ids, p->nids * sizeof(int32_t));
            r->prompt_len[i] = p->nids;
        }
    }
    return tokenize(r);
}

/* The rest of a completion, once its prompts are token ids: the limits, the
 * engine requests, and the response (a suspended connection, or the SSE
 * stream). */
static enum MHD_Result completions_admit(srv_req *r)
{
    srv *s = r->s;
    const eng_config *mc = eng_model_config(s->model);
    oai_request *q = &r->oreq;
    if (r->tok_failed)
        return send_error(r, 400, "invalid_request_error", NULL, "prompt", NULL, "%s", r->tok_err);
    for (size_t i = 0; i < q->nprompts; i++) {
        if (r->prompt_len[i] == 0) { /* "": the text starts, as with no prompt */
            free(r->prompt_ids[i]);
            r->prompt_ids[i] = malloc(sizeof(int32_t));
            if (r->prompt_ids[i] == NULL)
                return send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
            r->prompt_ids[i][0] = EOT;
            r->prompt_len[i] = 1;
        }
        if (r->prompt_len[i] > s->cfg.max_prompt_tokens)
            return send_error(r, 400, "invalid_request_error", NULL, "prompt", NULL,
                              "prompt %zu has %zu tokens; the limit is %zu", i, r->prompt_len[i],
                              s->cfg.max_prompt_tokens);
        if (r->prompt_len[i] + q->max_tokens > mc->n_ctx)
            return send_error(
                r, 400, "invalid_request_error", "context_length_exceeded", "max_tokens", NULL,
                "This model's maximum context length is %zu tokens, however you "
                "requested %zu tokens (%zu in your prompt; %zu for the "
                "completion). Please reduce your prompt; or completion length.",
                mc->n_ctx, r->prompt_len[i] + q->max_tokens, r->prompt_len[i], q->max_tokens);
    }
    /* One engine request per prompt and candidate (best_of >= n of them). */
    r->nchoices = q->nprompts * q->best_of;
    r->choices = calloc(r->nchoices, sizeof *r->choices);
    if (r->choices == NULL)
        return send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    eng_bias *bias = NULL;
    if (q->nbias > 0) {
        bias = malloc(q->nbias * sizeof *bias);
        if (bias == NULL)
            return send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
        for (size_t i = 0; i < q->nbias; i++)
            bias[i] = (eng_bias){q->bias[i].token, q->bias[i].bias};
    }
    const char *stops[OAI_MAX_STOP];
    for (size_t i = 0; i < q->nstop; i++) stops[i] = q->stop[i];
    uint64_t base_seed = q->has_seed ? q->seed : (uint64_t)time(NULL) ^ (s->next_id * 7919);
    for (size_t i = 0; i < r->nchoices; i++) {
        srv_choice *c = &r->choices[i];
        c->req = r;
        c->index = i;
        c->prompt = i / q->best_of;
        utf8_stream_init(&c->utf8);
        utf8_stream_init(&c->off_utf8);
        if (q->logprobs >= 0) {
            c->lp = lp_new();
            if (c->lp == NULL) {
                free(bias);
                return send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
            }
            if (q->echo) { /* the first prompt token has no logprob */
                lp_add(c, r->prompt_ids[c->prompt][0], NULL,
                       offset_feed(c, r->prompt_ids[c->prompt][0]));
                c->prompt_fed = 1;
            }
        }
        if (q->nstop > 0 && (c->stop = stop_new(stops, q->stop_len, q->nstop)) == NULL) {
            free(bias);
            return send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
        }
        eng_request er = {
            .prompt = r->prompt_ids[c->prompt],
            .nprompt = r->prompt_len[c->prompt],
            .max_tokens = q->max_tokens,
            .sampling = {.temperature = (float)q->temperature,
                         .top_k = q->top_k,
                         .top_p = (float)q->top_p,
                         .presence_penalty = (float)q->presence_penalty,
                         .frequency_penalty = (float)q->frequency_penalty,
                         .bias = bias,
                         .nbias = q->nbias},
            .seed = base_seed + i,
            .ignore_eos = q->ignore_eos,
            /* best_of ranks candidates by their tokens' mean logprob */
            .logprobs = q->logprobs >= 0    ? q->logprobs
                        : q->best_of > q->n ? 0
                                            : -1,
            .echo = q->echo && q->logprobs >= 0,
            .on_event = on_event,
            .user = c,
        };
        char err[256];
        eng_status st = eng_sched_submit(s->sched, &er, &c->id, err, sizeof err);
        if (st != ENG_OK) {
            free(bias);
            /* Nothing half-admitted: cancel what this request already queued. */
            for (size_t k = 0; k < i; k++) eng_sched_cancel(s->sched, r->choices[k].id);
            char ra[16];
            retry_after(s, ra, sizeof ra);
            if (st == ENG_EFULL)
                return send_error(r, 429, "rate_limit_exceeded", "rate_limit_exceeded", NULL, ra,
                                  "The server is busy (%s); retry after %s s", err, ra);
            if (st == ENG_ETOOBIG)
                return send_error(r, 400, "invalid_request_error", "context_length_exceeded",
                                  "max_tokens", NULL, "%s", err);
            return send_error(r, 400, "invalid_request_error", NULL, NULL, NULL, "%s", err);
        }
        c->live = 1;
        r->nlive++;
    }
    free(bias);
    r->next = s->head;
    if (s->head) s->head->prev = r;
    s->head = r;
    if (q->stream && q->echo)
        for (size_t i = 0; i < r->nchoices; i++) {
            srv_choice *c = &r->choices[i];
            char *t, err[64];
            size_t tn;
            if (ids_text(s->tok, r->prompt_ids[c->prompt], r->prompt_len[c->prompt], &t, &tn, err,
                         sizeof err)
                != BPE_OK) {
                req_fail_oom(r); /* the ids were checked: only memory can fail */
                break;
            }
            choice_text(c, t, tn);
            chunk_flush(c);
            free(t);
        }
    kick(s);
    if (q->stream) {
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_reader, r, NULL);
        if (resp == NULL) return MHD_NO;
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        r->responded = 1;
        enum MHD_Result rc = MHD_queue_response(r->conn, 200, resp);
        MHD_destroy_response(resp);
        return rc;
    }
    r->suspended = 1;
    MHD_suspend_connection(r->conn);
    return MHD_YES;
}

static enum MHD_Result route_tokenize(srv_req *r, int encode)
{
    json_error_t jerr;
    json_t *o = json_loadb(r->body ? r->body : "", r->body_len, JSON_ALLOW_NUL, &jerr);
    enum MHD_Result rc;
    char err[256];
    if (o == NULL || !json_is_object(o)) {
        json_decref(o);
        return send_error(r, 400, "invalid_request_error", NULL, NULL, NULL,
                          "the body must be a JSON object");
    }
    if (encode) {
        json_t *p = json_object_get(o, "prompt");
        if (!json_is_string(p)) {
            json_decref(o);
            return send_error(r, 400, "invalid_request_error", NULL, "prompt", NULL,
                              "'prompt' must be a string");
        }
        r->route = R_TOKENIZE;
        r->tok_json = o; /* holds the text while it is tokenized */
        r->nprompts = 1;
        r->prompt_ids = calloc(1, sizeof *r->prompt_ids);
        r->prompt_len = calloc(1, sizeof *r->prompt_len);
        if (r->prompt_ids == NULL || r->prompt_len == NULL)
            return send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
        return tokenize(r);
    } else {
        json_t *t = json_object_get(o, "tokens");
        size_t n = json_array_size(t);
        int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
        if (!json_is_array(t) || ids == NULL) {
            free(ids);
            json_decref(o);
            return send_error(r, 400, "invalid_request_error", NULL, "tokens", NULL,
                              "'tokens' must be a list of token ids");
        }
        for (size_t i = 0; i < n; i++) {
            json_t *v = json_array_get(t, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0
                || json_integer_value(v) > INT32_MAX) {
                free(ids);
                json_decref(o);
                return send_error(r, 400, "invalid_request_error", NULL, "tokens", NULL,
                                  "'tokens' entry %zu is not a token id", i);
            }
            ids[i] = (int32_t)json_integer_value(v);
        }
        char *text;
        size_t tn;
        bpe_status st = ids_text(r->s->tok, ids, n, &text, &tn, err, sizeof err);
        free(ids);
        if (st != BPE_OK) {
            json_decref(o);
            return st == BPE_ENOMEM
                       ? send_error(r, 500, "server_error", NULL, NULL, NULL, "%s", err)
                       : send_error(r, 400, "invalid_request_error", NULL, "tokens", NULL, "%s",
                                    err);
        }
        rc = send_obj(r, json_pack("{s:s%}", "prompt", text, tn));
        free(text);
    }
    json_decref(o);
    return rc;
}

/* POST /tokenize, once the prompt is tokenized. */
static enum MHD_Result tokenize_respond(srv_req *r)
{
    if (r->tok_failed)
        return send_error(r, 400, "invalid_request_error", NULL, "prompt", NULL, "%s", r->tok_err);
    json_t *arr = json_array();
    for (size_t i = 0; i < r->prompt_len[0]; i++)
        json_array_append_new(arr, json_integer(r->prompt_ids[0][i]));
    return send_obj(r,
                    json_pack("{s:o, s:I}", "tokens", arr, "count", (json_int_t)r->prompt_len[0]));
}

/* Constant-time comparison of a presented key with the configured ones. */
static int key_ok(const srv *s, const char *auth)
{
    if (s->cfg.n_api_keys == 0) return 1;
    if (auth == NULL || strncmp(auth, "Bearer ", 7) != 0) return 0;
    const char *k = auth + 7;
    size_t klen = strlen(k);
    int ok = 0;
    for (size_t i = 0; i < s->cfg.n_api_keys; i++) {
        const char *want = s->cfg.api_keys[i];
        size_t wlen = strlen(want);
        unsigned diff = (unsigned)(klen ^ wlen);
        for (size_t j = 0; j < wlen; j++)
            diff |= (unsigned char)want[j] ^ (unsigned char)(j < klen ? k[j] : 0);
        ok |= diff == 0;
    }
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version;
    srv *s = cls;
    srv_req *r = *con_cls;
    if (r == NULL) {
        r = calloc(1, sizeof *r);
        if (r == NULL) return MHD_NO;
        r->s = s;
        r->conn = conn;
        r->t_start = now_s();
        r->created = (long long)time(NULL);
        snprintf(r->id, sizeof r->id, "cmpl-%llx%06llx", (unsigned long long)r->created,
                 (unsigned long long)(s->next_id++ & 0xFFFFFF));
        snprintf(r->method, sizeof r->method, "%s", method);
        snprintf(r->url, sizeof r->url, "%s", url);
        s->active++;
        *con_cls = r;
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        if (!r->too_large && !r->body_oom) {
            if (r->body_len + *upload_data_size > s->cfg.max_body_bytes)
                r->too_large = 1;
            else if (append(&r->body, &r->body_len, &r->body_cap, upload_data, *upload_data_size)
                     != 0)
                r->body_oom = 1;
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (r->responded) return MHD_YES;
    if (r->tok_state == TOK_RUNNING) { /* woken early: keep waiting */
        r->suspended = 1;
        MHD_suspend_connection(conn);
        return MHD_YES;
    }
    if (r->tok_state == TOK_DONE) { /* tokenized on the work queue: go on */
        r->tok_state = TOK_NONE;
        return r->route == R_TOKENIZE ? tokenize_respond(r) : completions_admit(r);
    }
    if (r->nchoices > 0 && !r->oreq.stream) {
        if (r->ndone < r->nchoices) { /* woken early: keep waiting */
            r->suspended = 1;
            MHD_suspend_connection(conn);
            return MHD_YES;
        }
        return send_completion(r);
    }
    int post = strcmp(method, "POST") == 0, get = strcmp(method, "GET") == 0;
    int open_route =
        strcmp(url, "/health") == 0 || strcmp(url, "/ready") == 0 || strcmp(url, "/metrics") == 0;
    if (!(open_route && s->cfg.auth_open_health)
        && !key_ok(s, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization")))
        return send_error(r, 401, "invalid_request_error", "invalid_api_key", NULL, NULL,
                          "Incorrect or missing API key (Authorization: Bearer ...)");
    if (r->body_oom)
        return send_error(r, 500, "server_error", NULL, NULL, NULL,
                          "Out of memory while reading the request body");
    if (r->too_large)
        return send_error(r, 413, "invalid_request_error", NULL, NULL, NULL,
                          "The request body is over the limit of %zu bytes", s->cfg.max_body_bytes);
    if (strcmp(url, "/health") == 0) {
        if (!get) goto method;
        r->responded = 1;
        return send_json(conn, 200, "{\"status\":\"ok\"}", NULL);
    }
    if (strcmp(url, "/ready") == 0) {
        if (!get) goto method;
        r->responded = 1;
        return s->draining ? send_json(conn, 503, "{\"status\":\"draining\"}", NULL)
                           : send_json(conn, 200, "{\"status\":\"ready\"}", NULL);
    }
    if (strcmp(url, "/metrics") == 0) {
        if (!get) goto method;
        return route_metrics(r);
    }
    if (strcmp(url, "/v1/models") == 0) {
        if (!get) goto method;
        return route_models(r);
    }
    if (strcmp(url, "/v1/completions") == 0) {
        if (!post) goto method;
        if (s->draining)
            return send_error(r, 503, "server_error", "server_draining", NULL, "5",
                              "The server is shutting down; retry on another replica");
        return route_completions(r);
    }
    if (strcmp(url, "/tokenize") == 0 || strcmp(url, "/detokenize") == 0) {
        if (!post) goto method;
        return route_tokenize(r, url[1] == 't');
    }
    return send_error(r, 404, "invalid_request_error", NULL, NULL, NULL, "Unknown route %s %s",
                      method, url);
method:
    return send_error(r, 405, "invalid_request_error", NULL, NULL, NULL,
                      "Method %s is not allowed on %s", method, url);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    srv_req *r = *con_cls;
    if (r == NULL) return;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_HTTP_STATUS);
    unsigned status = ci ? ci->http_status : 0;
    log_line("info",
             "access %s %s status=%u id=%s prompt_tokens=%zu completion_tokens=%zu "
             "duration_ms=%.1f%s",
             r->method, r->url, status, r->id, usage_prompt(r), usage_completion(r),
             (now_s() - r->t_start) * 1e3,
             toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " aborted=1");
    srv *s = r->s;
    size_t ri = MET_ROUTES - 1, si = MET_STATUSES - 1;
    for (size_t i = 0; i + 1 < MET_ROUTES; i++)
        if (strcmp(r->url, met_routes[i]) == 0) ri = i;
    for (size_t i = 0; i + 1 < MET_STATUSES; i++)
        if (status == met_statuses[i]) si = i;
    s->requests[ri][si]++;
    if (ri == 0) met_observe(&s->duration, now_s() - r->t_start);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) s->aborted++;
    if (r->route == R_COMPLETIONS) { /* /tokenize's tokens are not served ones */
        s->prompt_tokens += usage_prompt(r) * (r->oreq.n ? r->oreq.n : 1);
        s->completion_tokens += usage_completion(r);
    }
    r->conn_done = 1;
    *con_cls = NULL;
    /* The client went away (or the response is sent): stop what still runs.
     * A cancel may deliver DONE at once, so r is freed only after the loop. */
    r->cancelling = 1;
    for (size_t i = 0; i < r->nchoices; i++)
        if (r->choices[i].live) eng_sched_cancel(r->s->sched, r->choices[i].id);
    r->cancelling = 0;
    req_maybe_free(r);
}

/* ---- The 1 s tick: deadlines, the queue's wait limit, keep-alive comments ---- */

static void cancel_all(srv_req *r)
{
    for (size_t i = 0; i < r->nchoices; i++)
        if (r->choices[i].live) eng_sched_cancel(r->s->sched, r->choices[i].id);
}

/* systemd's STATUS= line (systemctl status shows it), sent when it changed. */
static void sd_status(srv *s)
{
    eng_sched_stats st;
    eng_sched_stats_get(s->sched, &st);
    char line[sizeof s->sd_status];
    snprintf(line, sizeof line, "%s: %zu running, %zu queued, KV blocks %zu/%zu",
             s->draining ? "draining" : "serving", st.running, st.queued, st.kv_blocks_used,
             st.kv_blocks_total);
    if (strcmp(line, s->sd_status) == 0) return;
    memcpy(s->sd_status, line, sizeof line);
    srv_sd_notify("STATUS=%s", line);
}

/* WATCHDOG=1, every half WatchdogSec, only while the engine makes progress:
 * the loop thread is alive (this timer runs) and no step has been in flight
 * for more than half the interval (a step takes well under a second). A
 * step wedged on the work queue stops the pings, and systemd restarts the
 * service WatchdogSec after the last one. */
static void on_watchdog(uv_timer_t *t)
{
    srv *s = t->data;
    double half = (double)srv_sd_watchdog_usec() / 2e6;
    if (s->in_flight && now_s() - s->step_started > half) {
        log_line("error", "watchdog: a step has run for %.1f s; not pinging",
                 now_s() - s->step_started);
        return;
    }
    srv_sd_notify("WATCHDOG=1");
}

static void on_tick(uv_timer_t *t)
{
    srv *s = t->data;
    double now = now_s();
    srv_req *next;
    for (srv_req *r = s->head; r != NULL; r = next) {
        next = r->next;
        if (r->conn_done || r->nlive == 0) continue;
        double age = now - r->t_start;
        int waiting = 0;
        for (size_t i = 0; i < r->nchoices; i++)
            if (r->choices[i].live && eng_sched_waiting(s->sched, r->choices[i].id)) waiting = 1;
        if (waiting && age > s->cfg.queue_timeout_s) {
            /* Waited too long for admission: 503, which clients retry. */
            r->error_status = 503;
            snprintf(r->error_msg, sizeof r->error_msg,
                     "The request waited %.0f s for a free slot (queue_timeout); retry later", age);
            cancel_all(r); /* DONE events may free nothing: the connection is open */
            continue;
        }
        if (r->oreq.timeout_s > 0 && age > r->oreq.timeout_s) {
            /* The request's own deadline ends generation like max_tokens. */
            cancel_all(r);
            continue;
        }
        if (r->oreq.stream && usage_completion(r) == 0) {
            /* Still waiting: an SSE comment, which clients ignore, keeps
             * proxies from timing out and lets a disconnect be noticed. */
            sse_comment(&r->sse, "waiting");
            resume(r);
        }
    }
    sd_status(s);
    mhd_run(s);
}

/* ---- Start-up and shutdown --------------------------------------------------- */

static void close_all(srv *s);

static void drain_check(uv_timer_t *t)
{
    srv *s = t->data;
    eng_sched_stats st;
    eng_sched_stats_get(s->sched, &st);
    if ((st.running == 0 && st.queued == 0 && !s->in_flight && s->tokenizing == 0)
        || now_s() - s->drain_started > s->cfg.shutdown_timeout_s)
        close_all(s);
}

static void on_signal(uv_signal_t *h, int signum)
{
    srv *s = h->data;
    if (s->draining) return;
    s->draining = 1;
    s->drain_started = now_s();
    srv_sd_notify("STOPPING=1");
    sd_status(s);
    log_line("info", "signal %d: draining (shutdown_timeout %.0f s)", signum,
             s->cfg.shutdown_timeout_s);
    /* The listener stays open while draining: /ready answers 503 (load
     * balancers take the replica out) and new completions get 503 with
     * Retry-After, while the running ones finish. */
    uv_timer_start(&s->drain_timer, drain_check, 0, 50);
}

static void close_all(srv *s)
{
    uv_timer_stop(&s->tick);
    uv_close((uv_handle_t *)&s->tick, NULL);
    uv_timer_stop(&s->drain_timer);
    uv_close((uv_handle_t *)&s->drain_timer, NULL);
    uv_timer_stop(&s->timer);
    uv_close((uv_handle_t *)&s->timer, NULL);
    uv_timer_stop(&s->watchdog);
    uv_close((uv_handle_t *)&s->watchdog, NULL);
    uv_poll_stop(&s->poll);
    uv_close((uv_handle_t *)&s->poll, NULL);
    uv_close((uv_handle_t *)&s->sigterm, NULL);
    uv_close((uv_handle_t *)&s->sigint, NULL);
}

static void serve_usage(FILE *out)
{
    fprintf(out, "usage: gpt2d serve --model DIR [options]\n"
                 "Serves the model over HTTP (OpenAI-compatible POST /v1/completions).\n"
                 "Every option is also a config-file key (key = value):\n");
    cfg_print_help(out);
}

/* The configuration file read when no --config is given, if it exists. */
#define SRV_DEFAULT_CONFIG "/etc/gpt2d/gpt2d.conf"

int srv_main(int argc, char **argv)
{
    int explicit_config = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            serve_usage(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--print-defaults") == 0) {
            cfg_print_defaults(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--config") == 0 || strncmp(argv[i], "--config=", 9) == 0)
            explicit_config = 1;
    }
    srv_sd_init();
    srv s;
    memset(&s, 0, sizeof s);
    char err[1024];
    cfg_defaults(&s.cfg);
    s.ttft.bounds = s.itl.bounds = s.duration.bounds = s.step_seconds.bounds = met_seconds;
    s.step_rows.bounds = met_rows;
    if ((!explicit_config && access(SRV_DEFAULT_CONFIG, F_OK) == 0
         && cfg_load_file(&s.cfg, SRV_DEFAULT_CONFIG, err, sizeof err) != CFG_OK)
        || cfg_parse_args(&s.cfg, argc, argv, 1, err, sizeof err) != CFG_OK
        || cfg_validate(&s.cfg, err, sizeof err) != CFG_OK) {
        fatal_line(err);
        return 2;
    }
    log_max = level_rank(s.cfg.log_level);
    const char *delay = getenv("GPT2D_TEST_STEP_DELAY_MS");
    if (delay != NULL && atoi(delay) > 0) {
        s.step_delay_ms = (unsigned)atoi(delay);
        log_line("warn",
                 "GPT2D_TEST_STEP_DELAY_MS: every step sleeps %u ms (a test of a wedged "
                 "engine; never set it in production)",
                 s.step_delay_ms);
    }
    int rc = 1;
    log_line("info", "loading %s", s.cfg.model_dir);
    srv_sd_notify("STATUS=loading %s", s.cfg.model_dir);
    if (bpe_load_dir(s.cfg.model_dir, &s.tok, err, sizeof err) != BPE_OK
        || eng_model_load(s.cfg.model_dir, &s.model, err, sizeof err) != ENG_OK) {
        fatal_line(err);
        goto done;
    }
    log_line("info", "weights: %s, %.1f MB as stored", eng_model_dtype(s.model),
             (double)eng_model_weight_bytes(s.model) / 1e6);
    if (eng_model_copied_bytes(s.model) > 0)
        log_line("warn",
                 "copied %.1f MB of misaligned weights; "
                 "`gpt2d convert` writes a file that maps without copying",
                 (double)eng_model_copied_bytes(s.model) / 1e6);
    eng_sched_opts so = {.kv_bytes = s.cfg.kv_cache_mb << 20,
                         .block_len = s.cfg.kv_block,
                         .max_running = s.cfg.max_running,
                         .max_queue = s.cfg.max_queue,
                         .step_tokens = s.cfg.step_tokens,
                         .threads = s.cfg.threads};
    if (eng_sched_new(s.model, &so, &s.sched, err, sizeof err) != ENG_OK) {
        fatal_line(err);
        goto done;
    }
    const eng_config *mc = eng_model_config(s.model);
    /* system_fingerprint: changes with the build and with the weights file. */
    {
        char path[CFG_STR_MAX + 32];
        snprintf(path, sizeof path, "%s/model.safetensors", s.cfg.model_dir);
        struct stat st;
        uint64_t h = 0xCBF29CE484222325ull;
        const char *build = __DATE__ " " __TIME__ " " GPT2D_BUILD_VERSION;
        for (const char *p = build; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001B3ull;
        if (stat(path, &st) == 0) {
            uint64_t parts[3] = {(uint64_t)st.st_size, (uint64_t)st.st_mtim.tv_sec,
                                 (uint64_t)st.st_ino};
            for (int i = 0; i < 3; i++) h = (h ^ parts[i]) * 0x100000001B3ull;
        }
        snprintf(s.fingerprint, sizeof s.fingerprint, "fp_%012llx",
                 (unsigned long long)(h & 0xFFFFFFFFFFFFull));
    }
    s.loop = uv_default_loop();
    /* Listen on the socket systemd passed (gpt2d.socket), else bind host:port. */
    int lfd = srv_sd_listen_fd(err, sizeof err);
    if (lfd == -2) {
        fatal_line(err);
        goto done;
    }
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME;
    if (lfd < 0 && uv_ip4_addr(s.cfg.host, s.cfg.port, (struct sockaddr_in *)&ss) != 0) {
        if (uv_ip6_addr(s.cfg.host, s.cfg.port, (struct sockaddr_in6 *)&ss) != 0) {
            snprintf(err, sizeof err, "host '%s' is not an IPv4 or IPv6 address", s.cfg.host);
            fatal_line(err);
            goto done;
        }
        flags |= MHD_USE_IPv6;
    }
    if (lfd >= 0)
        s.mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, &s, MHD_OPTION_LISTEN_SOCKET,
                                 lfd, MHD_OPTION_NOTIFY_COMPLETED, on_completed, &s,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)s.cfg.max_connections,
                                 MHD_OPTION_CONNECTION_TIMEOUT,
                                 (unsigned)s.cfg.connection_timeout_s, MHD_OPTION_END);
    else
        s.mhd = MHD_start_daemon(
            flags, s.cfg.port, NULL, NULL, on_request, &s, MHD_OPTION_SOCK_ADDR,
            (struct sockaddr *)&ss, MHD_OPTION_NOTIFY_COMPLETED, on_completed, &s,
            MHD_OPTION_CONNECTION_LIMIT, (unsigned)s.cfg.max_connections,
            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s.cfg.connection_timeout_s, MHD_OPTION_END);
    if (s.mhd == NULL) {
        if (lfd >= 0)
            snprintf(err, sizeof err, "cannot serve on the socket systemd passed (descriptor %d)",
                     lfd);
        else
            snprintf(err, sizeof err, "cannot listen on %s:%u (in use, or not allowed)", s.cfg.host,
                     s.cfg.port);
        fatal_line(err);
        goto done;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s.mhd, MHD_DAEMON_INFO_EPOLL_FD);
    const union MHD_DaemonInfo *pi = MHD_get_daemon_info(s.mhd, MHD_DAEMON_INFO_BIND_PORT);
    uv_poll_init(s.loop, &s.poll, di->epoll_fd);
    s.poll.data = &s;
    uv_poll_start(&s.poll, UV_READABLE, on_poll);
    uv_timer_init(s.loop, &s.timer);
    s.timer.data = &s;
    uv_timer_init(s.loop, &s.drain_timer);
    s.drain_timer.data = &s;
    uv_timer_init(s.loop, &s.tick);
    s.tick.data = &s;
    uv_timer_start(&s.tick, on_tick, 1000, 1000);
    uv_signal_init(s.loop, &s.sigterm);
    uv_signal_init(s.loop, &s.sigint);
    s.sigterm.data = s.sigint.data = &s;
    uv_signal_start(&s.sigterm, on_signal, SIGTERM);
    uv_signal_start(&s.sigint, on_signal, SIGINT);
    signal(SIGPIPE, SIG_IGN);
    if (lfd >= 0)
        log_line("info",
                 "serving %s (%zu layers, width %zu) on the socket systemd passed (port %u)",
                 s.cfg.model_name, mc->n_layer, mc->n_embd, pi ? pi->port : 0);
    else
        log_line("info", "serving %s (%zu layers, width %zu) on http://%s:%u", s.cfg.model_name,
                 mc->n_layer, mc->n_embd, s.cfg.host, pi ? pi->port : s.cfg.port);
    uv_timer_init(s.loop, &s.watchdog);
    s.watchdog.data = &s;
    if (srv_sd_watchdog_usec() > 0) {
        uint64_t ms = srv_sd_watchdog_usec() / 2000;
        uv_timer_start(&s.watchdog, on_watchdog, 0, ms > 0 ? ms : 1);
    }
    /* Ready only now: the model is loaded and the socket is listening. */
    srv_sd_notify("READY=1");
    sd_status(&s);
    mhd_run(&s);
    uv_run(s.loop, UV_RUN_DEFAULT);
    MHD_stop_daemon(s.mhd);
    s.mhd = NULL;
    log_line("info", "stopped");
    rc = 0;
done:
    eng_sched_free(s.sched);
    eng_model_free(s.model);
    bpe_free(s.tok);
    if (s.loop != NULL) uv_loop_close(s.loop);
    return rc;
}
