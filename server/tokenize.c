/*
 * server/tokenize.c: prompts to token ids, inline or on the work queue, and
 * the /tokenize and /detokenize routes.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

bpe_status tok_ids_text(const bpe *tok, const int32_t *ids, size_t n, char **out, size_t *len,
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

/* The text of prompt i, or NULL for a prompt given as token ids. */
static const char *prompt_text(const srv_req *r, size_t i, size_t *len)
{
    if (r->kind == R_TOKENIZE) {
        json_t *p = json_object_get(r->tok_json, "prompt");
        *len = json_string_length(p);
        return json_string_value(p);
    }
    *len = r->oreq.prompts[i].text_len;
    return r->oreq.prompts[i].text;
}

/* /tokenize's body, parsed here: a large one on the work queue, since
 * parsing 1 MB of JSON holds the loop thread (every stream's next token)
 * for milliseconds. 0, or -1 with tok_http set. */
static int tokenize_body_parse(srv_req *r)
{
    json_error_t jerr;
    json_t *o = json_loadb(r->body ? r->body : "", r->body_len, JSON_ALLOW_NUL, &jerr);
    if (o == NULL || !json_is_object(o)) {
        json_decref(o);
        r->tok_http = 400;
        snprintf(r->tok_err, sizeof r->tok_err, "the body must be a JSON object");
        return -1;
    }
    const json_t *p = json_object_get(o, "prompt");
    if (!json_is_string(p)) {
        r->tok_http = 400;
        r->tok_param = "prompt";
        snprintf(r->tok_err, sizeof r->tok_err, "%s",
                 p == NULL ? "'prompt' is required: the text to tokenize"
                           : "'prompt' must be a string");
        json_decref(o);
        return -1;
    }
    r->tok_json = o; /* holds the text while it is tokenized */
    return 0;
}

/* POST /detokenize's work: the body's ids as text, its answer into tok_resp
 * (errors as for /tokenize). Thread: the loop thread, or a worker while
 * tok_running. */
static void detokenize_run(srv_req *r)
{
    json_error_t jerr;
    json_t *o = json_loadb(r->body ? r->body : "", r->body_len, JSON_ALLOW_NUL, &jerr);
    r->tok_param = "tokens";
    if (o == NULL || !json_is_object(o)) {
        json_decref(o);
        r->tok_http = 400;
        r->tok_param = NULL;
        snprintf(r->tok_err, sizeof r->tok_err, "the body must be a JSON object");
        return;
    }
    json_t *t = json_object_get(o, "tokens");
    size_t n = json_array_size(t);
    int32_t *ids = NULL;
    if (!json_is_array(t)) {
        r->tok_http = 400;
        snprintf(r->tok_err, sizeof r->tok_err, "%s",
                 t == NULL ? "'tokens' is required: the token ids to detokenize"
                           : "'tokens' must be a list of token ids");
        goto done;
    }
    ids = malloc((n ? n : 1) * sizeof *ids);
    if (ids == NULL) {
        r->tok_failed = 1;
        r->tok_status = BPE_ENOMEM;
        snprintf(r->tok_err, sizeof r->tok_err, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            r->tok_http = 400;
            snprintf(r->tok_err, sizeof r->tok_err, "'tokens' entry %zu is not a token id", i);
            goto done;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    char *text;
    size_t tn;
    bpe_status st = tok_ids_text(r->s->tok, ids, n, &text, &tn, r->tok_err, sizeof r->tok_err);
    if (st != BPE_OK) {
        r->tok_failed = 1;
        r->tok_status = st;
        goto done;
    }
    json_t *answer = json_pack("{s:s%}", "prompt", text, tn);
    free(text);
    r->tok_resp = answer != NULL ? json_dumps(answer, JSON_COMPACT) : NULL;
    json_decref(answer);
    if (r->tok_resp == NULL) {
        r->tok_failed = 1;
        r->tok_status = BPE_ENOMEM;
        snprintf(r->tok_err, sizeof r->tok_err, "out of memory");
    }
done:
    free(ids);
    json_decref(o);
}

/* /tokenize's answer, {"tokens":[...],"count":N}, into tok_resp (the same
 * bytes jansson's compact form gives, without an object per token). */
static void tokenize_body_answer(srv_req *r)
{
    size_t n = r->prompt_len[0], cap = 64 + n * 12, len = 0;
    char *out = malloc(cap);
    if (out == NULL) {
        r->tok_failed = 1;
        r->tok_status = BPE_ENOMEM;
        snprintf(r->tok_err, sizeof r->tok_err, "out of memory");
        return;
    }
    len += (size_t)snprintf(out, cap, "{\"tokens\":[");
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(out + len, cap - len, i ? ",%d" : "%d", (int)r->prompt_ids[0][i]);
    snprintf(out + len, cap - len, "],\"count\":%zu}", n);
    r->tok_resp = out;
}

/* Encodes every text prompt into prompt_ids/prompt_len (for /tokenize, parses
 * the body first and writes the answer after; /detokenize's work too). Thread: the loop thread, or
 * a worker while tok_running. */
static void tokenize_run(srv_req *r)
{
    if (r->kind == R_DETOKENIZE) {
        detokenize_run(r);
        return;
    }
    if (r->kind == R_TOKENIZE && r->tok_json == NULL && tokenize_body_parse(r) != 0) return;
    if (r->kind == R_COMPLETIONS && r->cmpl_unparsed) {
        r->cmpl_unparsed = 0;
        if (cmpl_parse(r) != 0) {
            r->cmpl_parse_failed = 1;
            return;
        }
    }
    for (size_t i = 0; i < r->nprompts && !r->tok_failed; i++) {
        size_t len;
        const char *text = prompt_text(r, i, &len);
        if (text == NULL) continue;
        /* "<|endoftext|>" in a prompt is the token, as the model knows it. A
         * completion's prompt is cut off past max_prompt_tokens: a 1 MB
         * prompt costs the work of its first tokens, not of all of them. */
        size_t max = r->kind == R_COMPLETIONS ? r->tok_max_tokens : SIZE_MAX;
        bpe_status st = bpe_encode_special_max(r->s->tok, text, len, max, &r->prompt_ids[i],
                                               &r->prompt_len[i], r->tok_err, sizeof r->tok_err);
        if (st == BPE_ETOOBIG && r->kind == R_COMPLETIONS)
            snprintf(r->tok_err, sizeof r->tok_err,
                     "prompt %zu has more than %zu tokens; the limit is %zu (max_prompt_tokens)", i,
                     max, max);
        if (st != BPE_OK) {
            r->tok_failed = 1;
            r->tok_status = st;
        }
    }
    if (r->kind == R_TOKENIZE && !r->tok_failed) tokenize_body_answer(r);
}

/* Starts r's tokenization on a tokenizer thread. */
static void tok_start(srv_req *r)
{
    r->tok_running = 1;
    r->s->tokenizing++;
    tpool_submit(r->s->tokpool, r);
}

void tok_unwait(srv_req *r)
{
    srv *s = r->s;
    assert(r->tok_waiting);
    if (r->tok_wprev)
        r->tok_wprev->tok_wnext = r->tok_wnext;
    else
        s->tok_wait_head = r->tok_wnext;
    if (r->tok_wnext)
        r->tok_wnext->tok_wprev = r->tok_wprev;
    else
        s->tok_wait_tail = r->tok_wprev;
    r->tok_wprev = r->tok_wnext = NULL;
    r->tok_waiting = 0;
    s->tok_nwait--;
}

/* Starts waiting bodies while slots are free. */
static void tok_admit_waiting(srv *s)
{
    while (s->tokenizing < s->cfg.tokenize_concurrency && s->tok_wait_head != NULL) {
        srv_req *r = s->tok_wait_head;
        tok_unwait(r);
        tok_start(r);
    }
}

/* The continuation of a body that waited longer than queue_timeout. */
static enum MHD_Result tok_expired(srv_req *r)
{
    assert(r->state == HTTP_REQ_TOKENIZING);
    char ra[16];
    http_retry_after(r->s, ra, sizeof ra);
    return http_send_error(r, 503, "server_error", NULL, NULL, ra,
                           "The request waited %.0f s to be tokenized (queue_timeout); retry later",
                           log_now() - r->t_start);
}

void tok_tick(srv *s, double now)
{
    srv_req *next;
    for (srv_req *r = s->tok_wait_head; r != NULL; r = next) {
        next = r->tok_wnext;
        if (now - r->t_start <= s->cfg.queue_timeout_s) break; /* oldest first */
        tok_unwait(r);
        r->cont = tok_expired;
        http_resume(r);
    }
}

/* A tokenizer thread is done with r (loop thread). */
static void tok_done(srv_req *r)
{
    r->s->tokenizing--;
    r->tok_running = 0;
    tok_admit_waiting(r->s);
    if (r->conn_done) { /* the client left meanwhile */
        http_req_maybe_free(r);
        return;
    }
    http_resume(r); /* on_request runs the continuation */
    loop_mhd_run(r->s);
}

int tok_pool_start(srv *s, char *err, size_t errlen)
{
    return tpool_new(s->loop, s->cfg.tokenize_concurrency, tokenize_run, tok_done, &s->tokpool, err,
                     errlen);
}

/* A request the tokenizer threads held when the server stopped. */
static void tok_drop(srv_req *r)
{
    r->tok_running = 0;
    http_req_maybe_free(r);
}

void tok_pool_free(srv *s)
{
    tpool_free(s->tokpool, tok_drop);
    s->tokpool = NULL;
}

enum MHD_Result tok_prompts(srv_req *r, http_cont then)
{
    assert(r->state == HTTP_REQ_BODY);
    size_t bytes = 0;
    r->tok_max_tokens = r->s->cfg.max_prompt_tokens; /* a reload may change the config */
    if (r->kind == R_TOKENIZE || r->kind == R_DETOKENIZE || r->cmpl_unparsed)
        bytes = r->body_len; /* not parsed yet: the body is the work */
    else
        for (size_t i = 0; i < r->nprompts; i++) {
            size_t len;
            if (prompt_text(r, i, &len) != NULL) bytes += len;
        }
    srv *s = r->s;
    if (bytes >= SRV_TOKENIZE_INLINE_BYTES) {
        if (s->tokenizing < s->cfg.tokenize_concurrency) {
            http_req_set_state(r, HTTP_REQ_TOKENIZING);
            http_suspend(r, then);
            tok_start(r);
            return MHD_YES;
        } else if (s->tok_nwait < s->cfg.max_queue) {
            /* Wait for a slot: a tokenizer on every core would hold up the
             * engine's steps (and every stream's next token). */
            r->tok_waiting = 1;
            r->tok_wprev = s->tok_wait_tail;
            if (s->tok_wait_tail)
                s->tok_wait_tail->tok_wnext = r;
            else
                s->tok_wait_head = r;
            s->tok_wait_tail = r;
            s->tok_nwait++;
            http_req_set_state(r, HTTP_REQ_TOKENIZING);
            http_suspend(r, then);
            return MHD_YES;
        } else {
            char ra[16];
            http_retry_after(s, ra, sizeof ra);
            return http_send_error(r, 429, "rate_limit_exceeded", "rate_limit_exceeded", NULL, ra,
                                   "The server is busy (%zu request bodies wait to be tokenized); "
                                   "retry after %s s",
                                   s->tok_nwait, ra);
        }
    }
    tokenize_run(r);
    return then(r);
}

/* POST /tokenize and /detokenize, once the work is done (the continuation). */
static enum MHD_Result tokenize_respond(srv_req *r)
{
    assert(r->state == HTTP_REQ_BODY || r->state == HTTP_REQ_TOKENIZING);
    if (r->tok_http != 0)
        return http_send_error(r, r->tok_http, "invalid_request_error", NULL, r->tok_param, NULL,
                               "%s", r->tok_err);
    if (r->tok_failed)
        return http_send_status(r, HTTP_SRC_BPE, (int)r->tok_status,
                                r->kind == R_DETOKENIZE ? "tokens" : "prompt", r->tok_err);
    enum MHD_Result rc = http_send_json(r, 200, r->tok_resp, NULL);
    free(r->tok_resp);
    r->tok_resp = NULL;
    return rc;
}

enum MHD_Result tok_route_tokenize(srv_req *r)
{
    r->kind = R_TOKENIZE; /* the body is parsed with the tokenizing */
    r->nprompts = 1;
    r->prompt_ids = calloc(1, sizeof *r->prompt_ids);
    r->prompt_len = calloc(1, sizeof *r->prompt_len);
    if (r->prompt_ids == NULL || r->prompt_len == NULL)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    return tok_prompts(r, tokenize_respond);
}

enum MHD_Result tok_route_detokenize(srv_req *r)
{
    r->kind = R_DETOKENIZE; /* parsed and decoded like a body to tokenize */
    return tok_prompts(r, tokenize_respond);
}
