/*
 * server/api/cmpl_respond.c: a completion's answer: best_of ranking and the
 * JSON body, or the SSE stream (its chunks, its end, its content reader).
 */
#include "api/api.h"

#include <math.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

json_t *cmpl_base(const srv_req *r)
{
    const char *object = !r->cmpl->oreq.chat    ? "text_completion"
                         : r->cmpl->oreq.stream ? "chat.completion.chunk"
                                                : "chat.completion";
    return json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", r->id, "object", object, "created",
                     (json_int_t)r->created, "model", adp_model_name(r), "system_fingerprint",
                     r->s->api->fingerprint);
}

/* One streamed choice: completions {text, index, logprobs, finish_reason},
 * chat {index, delta, logprobs, finish_reason}. Takes delta and lp. */
static json_t *stream_choice(const srv_req *r, size_t index, json_t *delta, const char *text,
                             size_t n, json_t *lp, const char *finish)
{
    json_t *fin = finish ? json_string(finish) : json_null();
    if (r->cmpl->oreq.chat)
        return json_pack("{s:I, s:o, s:o, s:o}", "index", (json_int_t)index, "delta", delta,
                         "logprobs", lp ? lp : json_null(), "finish_reason", fin);
    json_decref(delta);
    return json_pack("{s:s%, s:I, s:o, s:o}", "text", text, n, "index", (json_int_t)index,
                     "logprobs", lp ? lp : json_null(), "finish_reason", fin);
}

static void stream_send(srv_req *r, json_t *choice)
{
    json_t *o = cmpl_base(r);
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    if (r->cmpl->oreq.include_usage) json_object_set_new(o, "usage", json_null());
    cmpl_sse_event(r, o);
}

void cmpl_chat_open(srv_req *r)
{
    if (r->cmpl->shape != NULL) {
        r->cmpl->shape->open(r);
        return;
    }
    for (size_t i = 0; i < r->cmpl->nchoices; i++)
        stream_send(r,
                    stream_choice(r, i, json_pack("{s:s, s:s}", "role", "assistant", "content", ""),
                                  "", 0, NULL, NULL));
}

void cmpl_sse_finish(srv_req *r, const srv_choice *c)
{
    if (r->cmpl->shape != NULL) return; /* its finish_stream says it */
    stream_send(r, stream_choice(r, c->index, json_object(), "", 0, NULL, c->finish));
}

void cmpl_sse_event(srv_req *r, json_t *obj)
{
    if (obj == NULL)
        r->cmpl->sse.failed = 1;
    else
        sse_data(&r->cmpl->sse, obj);
    json_decref(obj);
}

void cmpl_chunk_flush(srv_choice *c)
{
    srv_req *r = c->req;
    if (r->cmpl->shape != NULL) {
        r->cmpl->shape->chunk(c);
        return;
    }
    int has_lp = c->lp != NULL && lp_count(c->lp) > 0;
    if (c->text_len == 0 && !has_lp) return;
    const char *text = c->text ? c->text : "";
    stream_send(r, stream_choice(r, c->index, json_pack("{s:s%}", "content", text, c->text_len),
                                 text, c->text_len, has_lp ? json_incref(c->lp) : NULL, NULL));
    c->text_len = 0;
    if (has_lp) {
        json_decref(c->lp);
        c->lp = lp_new(r);
    }
}

/* usage: OpenAI's three counts, and the extension `timings` (docs/api.md):
 * time to the first token, the whole request, completion tokens a second. */
/* Prompt tokens that came from the prefix cache: per prompt, the fewest any
 * of its candidates took (the first computes what its siblings share). */
static size_t usage_cached(const srv_req *r)
{
    size_t n = 0, per = r->cmpl->oreq.best_of;
    for (size_t p = 0; per > 0 && p < r->cmpl->nchoices / per; p++) {
        size_t least = SIZE_MAX;
        for (size_t j = 0; j < per; j++)
            if (r->cmpl->choices[p * per + j].cached < least)
                least = r->cmpl->choices[p * per + j].cached;
        n += least;
    }
    return n;
}

/* Every prompt counts once (as OpenAI counts it, whatever n and best_of),
 * every generated token of every candidate; the cached part of the prompts
 * in prompt_tokens_details (OpenAI's field). */
json_t *cmpl_usage_json(const srv_req *r)
{
    size_t pt = tok_prompt_tokens(r), ct = cmpl_completion_tokens(r);
    double total = log_now() - r->t_start;
    double ttft = r->t_first > 0 ? r->t_first - r->t_start : 0;
    /* Whole numbers: jansson writes a double with 17 digits (4.1 as
     * 4.0999999999999996), which says nothing more about a timing. */
    json_t *u = json_pack(
        "{s:I, s:I, s:I, s:{s:I}, s:{s:I, s:I, s:I}}", "prompt_tokens", (json_int_t)pt,
        "completion_tokens", (json_int_t)ct, "total_tokens", (json_int_t)(pt + ct),
        "prompt_tokens_details", "cached_tokens", (json_int_t)usage_cached(r), "timings", "ttft_ms",
        (json_int_t)llround(ttft * 1e3), "total_ms", (json_int_t)llround(total * 1e3),
        "completion_tokens_per_second", (json_int_t)(total > 0 ? llround((double)ct / total) : 0));
    if (u != NULL) cmpl_usage_prediction(r, u);
    return u;
}

void cmpl_finish_stream(srv_req *r)
{
    cmpl_stream_bytes_check(r); /* an event refused for max_response_bytes */
    /* However it ended, its client gets connection_timeout to read the end. */
    http_conn_timeout(r, (unsigned)r->s->cfg.connection_timeout_s);
    if (r->cmpl->shape != NULL) {
        r->cmpl->shape->finish_stream(r);
        return;
    }
    cmpl_finish_stream_tail(r);
}

void cmpl_finish_stream_tail(srv_req *r)
{
    if (r->cmpl->error_status == 0 && r->cmpl->oreq.include_usage) {
        json_t *o = cmpl_base(r);
        json_object_set_new(o, "choices", json_array());
        json_object_set_new(o, "usage", cmpl_usage_json(r));
        cmpl_sse_event(r, o);
        cmpl_stream_bytes_check(r);
    }
    sse_final(&r->cmpl->sse);
    if (r->cmpl->error_status != 0) { /* after the headers: an error event, then [DONE] */
        oai_error e;
        oai_error_set(&e, r->cmpl->error_status, cmpl_error_type(r->cmpl->error_status),
                      r->cmpl->error_code, NULL, "%s", r->cmpl->error_msg);
        char *js = oai_error_json(&e);
        if (js == NULL || sse_data_raw(&r->cmpl->sse, js) != 0) r->cmpl->sse.failed = 1;
        free(js);
    }
    sse_done(&r->cmpl->sse);
}

/* A candidate's mean token logprob (best_of ranks by it). */
static double choice_mean_lp(const srv_choice *c)
{
    return c->lp_n ? c->lp_sum / (double)c->lp_n : -1e30;
}

void cmpl_rank(const double *mean_lp, size_t best_of, size_t n, size_t *order)
{
    /* A stable insertion sort, so ties keep their order. */
    for (size_t j = 0; j < best_of; j++) {
        size_t at = j;
        if (best_of > n)
            while (at > 0 && mean_lp[j] > mean_lp[order[at - 1]]) {
                order[at] = order[at - 1];
                at--;
            }
        order[at] = j;
    }
}

/* The text of choice c, after the prompt's when echo is asked. NULL when
 * memory ran out or the prompt cannot be decoded (err says which). A chat
 * choice is its message {role, content}. */
static json_t *choice_text_json(srv_req *r, size_t pi, const srv_choice *c, char *err,
                                size_t errlen)
{
    if (r->cmpl->oreq.chat)
        return json_pack("{s:s, s:s%}", "role", "assistant", "content", c->text ? c->text : "",
                         c->text_len);
    if (!r->cmpl->oreq.echo) return json_stringn(c->text ? c->text : "", c->text_len);
    char *pt;
    size_t plen;
    if (tok_ids_text(r->s->api->tok, r->tok->prompt_ids[pi], r->tok->prompt_len[pi], &pt, &plen,
                     err, errlen)
        != BPE_OK)
        return NULL;
    char *joined = realloc(pt, plen + c->text_len + 1);
    if (joined == NULL) {
        free(pt);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (c->text_len > 0) memcpy(joined + plen, c->text, c->text_len);
    json_t *text = json_stringn(joined, plen + c->text_len);
    free(joined);
    return text;
}

/* ---- A whole answer, a piece at a time ---------------------------------------
 *
 * The answer is written as libmicrohttpd asks for more (its content reader,
 * chunked): each call makes about ANSWER_PIECE bytes more from the choices'
 * texts and their logprobs entries (kept as numbers, lp_entry), so an
 * answer is never held whole, and the loop thread spends a piece's time on
 * it between the other connections' turns, not the whole answer's. Every
 * value is spelled by jansson, as a whole json_dumps would spell it.
 */
#define ANSWER_PIECE (32u * 1024u)

/* Room for n more bytes in the answer's buffer; -1 when memory ran out. */
static int ans_room(cmpl_job *j, size_t n)
{
    if (n <= j->ans.cap - j->ans.len) return 0;
    size_t cap = j->ans.cap ? j->ans.cap : 2 * ANSWER_PIECE;
    while (cap - j->ans.len < n) cap *= 2;
    char *b = realloc(j->ans.buf, cap);
    if (b == NULL) return -1;
    j->ans.buf = b;
    j->ans.cap = cap;
    return 0;
}

static int ans_put(cmpl_job *j, const char *p, size_t n)
{
    if (ans_room(j, n) != 0) return -1;
    memcpy(j->ans.buf + j->ans.len, p, n);
    j->ans.len += n;
    return 0;
}

static int ans_str(cmpl_job *j, const char *s)
{
    return ans_put(j, s, strlen(s));
}

/* Appends v as compact JSON and drops it; -1 for NULL or no memory. */
static int ans_json(cmpl_job *j, json_t *v)
{
    const size_t flags = JSON_COMPACT | JSON_ENCODE_ANY;
    size_t n = v != NULL ? json_dumpb(v, NULL, 0, flags) : 0;
    int rc = -1;
    if (n > 0 && ans_room(j, n) == 0 && json_dumpb(v, j->ans.buf + j->ans.len, n, flags) == n) {
        j->ans.len += n;
        rc = 0;
    }
    json_decref(v);
    return rc;
}

/* The logprobs columns of a whole answer, after the head ("{" and the
 * first name) that part 0 writes. */
static const char *const lp_cols[] = {"{\"tokens\":[", "],\"token_logprobs\":[",
                                      "],\"top_logprobs\":[", "],\"text_offset\":["};

/* Makes the next piece of r's answer (at least ANSWER_PIECE bytes, or the
 * rest). 0, or -1 when memory ran out or a prompt could not be decoded
 * (err says which). */
static int answer_fill(srv_req *r, char *err, size_t errlen)
{
    cmpl_job *j = r->cmpl;
    int chat = j->oreq.chat;
    int ncols = chat ? 1 : 4;
    snprintf(err, errlen, "out of memory");
    while (j->ans.len < ANSWER_PIECE && !j->ans.done) {
        if (j->ans.k == j->ans.norder) {
            if (ans_str(j, "],\"usage\":") != 0 || ans_str(j, j->ans.usage) != 0
                || ans_str(j, "}") != 0)
                return -1;
            j->ans.done = 1;
            break;
        }
        size_t ci = j->ans.order[j->ans.k];
        const srv_choice *c = &j->choices[ci];
        if (j->ans.part == 0) { /* {"text": ..., "index": N, "logprobs": */
            char head[64];
            snprintf(head, sizeof head, "%s{\"%s\":", j->ans.k > 0 ? "," : "",
                     chat ? "message" : "text");
            json_t *text = choice_text_json(r, c->prompt, c, err, errlen);
            if (text == NULL || ans_str(j, head) != 0 || ans_json(j, text) != 0) return -1;
            snprintf(head, sizeof head, ",\"index\":%zu,\"logprobs\":", j->ans.k);
            if (ans_str(j, head) != 0) return -1;
            if (c->lp == NULL) {
                if (ans_str(j, "null") != 0) return -1;
                j->ans.part = ncols + 1;
            } else {
                if (ans_str(j, chat ? "{\"content\":[" : lp_cols[0]) != 0) return -1;
                j->ans.part = 1;
                j->ans.at = 0;
            }
        } else if (j->ans.part <= ncols) { /* a column's entries */
            for (; j->ans.at < c->lpe_n && j->ans.len < ANSWER_PIECE; j->ans.at++)
                if ((j->ans.at > 0 && ans_str(j, ",") != 0)
                    || ans_json(j, lp_entry_json(r, &c->lpe[j->ans.at], j->ans.part)) != 0)
                    return -1;
            if (j->ans.at < c->lpe_n) break;
            if (ans_str(j, j->ans.part < ncols ? lp_cols[j->ans.part] : "]}") != 0) return -1;
            j->ans.part++;
            j->ans.at = 0;
        } else { /* "finish_reason": ...} */
            if (ans_str(j, ",\"finish_reason\":") != 0 || ans_json(j, json_string(c->finish)) != 0
                || ans_str(j, "}") != 0)
                return -1;
            j->ans.k++;
            j->ans.part = 0;
        }
    }
    return 0;
}

/* The answer's body, as libmicrohttpd asks for it. */
static ssize_t answer_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    srv_req *r = cls;
    cmpl_job *j = r->cmpl;
    assert(r->state == HTTP_REQ_FINISHED);
    if (j->ans.off == j->ans.len) {
        if (j->ans.done) return MHD_CONTENT_READER_END_OF_STREAM;
        j->ans.off = j->ans.len = 0;
        char err[64];
        if (answer_fill(r, err, sizeof err) != 0) {
            log_line("error", "%s: the answer could not be written (%s); connection closed", r->id,
                     err);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = j->ans.len - j->ans.off;
    if (n > max) n = max;
    memcpy(buf, j->ans.buf + j->ans.off, n);
    j->ans.off += n;
    return (ssize_t)n;
}

/* The answer's order (best_of ranked), its usage and its first bytes; 0, or
 * -1 when memory ran out. */
static int answer_start(srv_req *r)
{
    cmpl_job *j = r->cmpl;
    size_t n = j->oreq.n, best_of = j->oreq.best_of;
    double mean[128];
    size_t order[128]; /* best_of <= max_n <= 128 */
    j->ans.norder = r->tok->nprompts * n;
    j->ans.order = malloc(j->ans.norder * sizeof *j->ans.order);
    if (j->ans.order == NULL) return -1;
    for (size_t pi = 0; pi < r->tok->nprompts; pi++) {
        for (size_t k = 0; k < best_of; k++)
            mean[k] = choice_mean_lp(&j->choices[pi * best_of + k]);
        cmpl_rank(mean, best_of, n, order);
        for (size_t k = 0; k < n; k++) j->ans.order[pi * n + k] = pi * best_of + order[k];
    }
    json_t *usage = cmpl_usage_json(r); /* all candidates, as of now */
    j->ans.usage = usage ? json_dumps(usage, JSON_COMPACT) : NULL;
    json_decref(usage);
    json_t *base = cmpl_base(r);
    char *head = base ? json_dumps(base, JSON_COMPACT) : NULL;
    json_decref(base);
    /* {"id": ..., "system_fingerprint": ...,"choices":[ */
    int rc = j->ans.usage == NULL || head == NULL || ans_put(j, head, strlen(head) - 1) != 0
                     || ans_str(j, ",\"choices\":[") != 0
                 ? -1
                 : 0;
    free(head);
    return rc;
}

enum MHD_Result cmpl_send(srv_req *r)
{
    assert(r->state == HTTP_REQ_QUEUED || r->state == HTTP_REQ_RUNNING);
    assert(r->cmpl->ndone == r->cmpl->nchoices);
    if (r->cmpl->shape != NULL) return r->cmpl->shape->send(r);
    if (r->cmpl->error_status != 0)
        return http_send_error(r, r->cmpl->error_status, cmpl_error_type(r->cmpl->error_status),
                               r->cmpl->error_code, NULL, r->cmpl->error_status == 503 ? "5" : NULL,
                               "%s", r->cmpl->error_msg);
    if (answer_start(r) != 0)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, ANSWER_PIECE, answer_reader, r, NULL);
    if (resp == NULL) return MHD_NO;
    http_req_set_state(r, HTTP_REQ_FINISHED);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, "Cache-Control", "no-store");
    http_resp_headers(r, resp, 200);
    enum MHD_Result rc = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    return rc;
}

int cmpl_backlog(srv_req *r)
{
    if (!r->cmpl->oreq.stream || r->conn == NULL) return 0;
    int over = sse_over_limit(&r->cmpl->sse);
    if (over && r->cmpl->t_over == 0) r->cmpl->t_over = log_now();
    if (!over) r->cmpl->t_over = 0;
    if (over == r->cmpl->paused) return 0;
    r->cmpl->paused = over;
    for (size_t i = 0; i < r->cmpl->nchoices; i++)
        if (r->cmpl->choices[i].live)
            eng_sched_pause(r->cmpl->ckpt->sched, r->cmpl->choices[i].id, over);
    return !over;
}

int cmpl_stall_check(srv_req *r, double now)
{
    if (!r->cmpl->paused || now - r->cmpl->t_over <= r->s->cfg.stream_stall_timeout_s) return 0;
    log_line("info",
             "%s: the client left %zu bytes of its stream unread for %.0f s "
             "(stream_stall_timeout); cancelled",
             r->id, sse_pending(&r->cmpl->sse), now - r->cmpl->t_over);
    cmpl_set_error(r, 408, NULL,
                   "The stream was cancelled: the client left over %zu bytes unread for %.0f s "
                   "(stream_backlog_bytes, stream_stall_timeout)",
                   r->s->cfg.stream_backlog_bytes, r->s->cfg.stream_stall_timeout_s);
    /* What the client has not read is dropped but the rest of the event it
     * is in, so that the error event and [DONE] (queued by the DONE events,
     * some of them at once) come right after it, on an event boundary: a
     * client that reads on gets the ending within a few hundred bytes,
     * whatever the backlog was. */
    sse_cut(&r->cmpl->sse);
    cmpl_cancel_for(r, MET_CANCEL_STREAM_STALLED);
    return 1;
}

/* The SSE body, chunk by chunk as on_event produces it. */
static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    srv_req *r = cls;
    assert(r->state == HTTP_REQ_STREAMING);
    if (r->cmpl->sse.failed) return MHD_CONTENT_READER_END_WITH_ERROR; /* out of memory */
    if (sse_pending(&r->cmpl->sse) > 0) {
        ssize_t n = (ssize_t)sse_take(&r->cmpl->sse, buf, max);
        if (r->cmpl->paused && cmpl_backlog(r)) step_kick(r->s); /* caught up: resume */
        return n;
    }
    if (sse_finished(&r->cmpl->sse)) return MHD_CONTENT_READER_END_OF_STREAM;
    /* Nothing yet: sleep until on_event resumes us (no busy polling). */
    http_suspend(r, NULL);
    return 0;
}

enum MHD_Result cmpl_start_stream(srv_req *r)
{
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_reader, r, NULL);
    if (resp == NULL) return MHD_NO;
    http_req_set_state(r, HTTP_REQ_STREAMING);
    /* A client that stops reading is the stall policy's (cmpl_stall_check),
     * not libmicrohttpd's idle timeout, which would close the connection
     * with an event half sent; the stream's end sets it again. */
    http_conn_timeout(r, 0);
    /* The kernel's send buffer is part of what a stalled client pins: left to
     * autotuning it grows to megabytes (tcp_wmem) before any backlog forms
     * here. A token stream needs little of it. */
    const union MHD_ConnectionInfo *fi =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    int sndbuf = r->s->cfg.stream_backlog_bytes > INT_MAX / 2 ? INT_MAX / 2
                                                              : (int)r->s->cfg.stream_backlog_bytes;
    if (fi != NULL) setsockopt(fi->connect_fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    http_resp_headers(r, resp, 200);
    enum MHD_Result rc = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    return rc;
}

enum MHD_Result cmpl_send_oai_error(srv_req *r, const oai_error *e)
{
    char *js = oai_error_json(e);
    enum MHD_Result rc = http_send_json(r, (unsigned)e->status, js ? js : "{}", NULL);
    free(js);
    return rc;
}
