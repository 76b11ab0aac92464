/*
 * server/api/tokenize.c: the tokenizer job: a request's prompts to token
 * ids, inline or on a tokenizer thread (tokpool.c), admitted like
 * generation; and the /tokenize and /detokenize routes. A body that is
 * still to be parsed is parsed where it is tokenized, by the parser the
 * caller gives (tok_prompts): this file knows no route's request shape.
 *
 * Lifetime: the job is r->tok, freed with r (its route's free hook); a
 * tokenizer thread that has it holds a reference to r.
 */
#include "api/api.h"

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

/* ---- The job ------------------------------------------------------------- */

tok_job *tok_job_new(srv_req *r)
{
    r->tok = calloc(1, sizeof *r->tok);
    if (r->tok != NULL) r->tok->max_prompt_tokens = SIZE_MAX;
    return r->tok;
}

int tok_job_prompts(tok_job *t, size_t n)
{
    t->prompt_ids = calloc(n ? n : 1, sizeof *t->prompt_ids);
    t->prompt_len = calloc(n ? n : 1, sizeof *t->prompt_len);
    t->text = calloc(n ? n : 1, sizeof *t->text);
    t->text_len = calloc(n ? n : 1, sizeof *t->text_len);
    if (t->prompt_ids && t->prompt_len && t->text && t->text_len) {
        /* The count only once the arrays exist: the usage hook of the
         * access line reads prompt_len[0 .. nprompts). */
        t->nprompts = n;
        return 0;
    }
    free(t->prompt_ids);
    free(t->prompt_len);
    free(t->text);
    free(t->text_len);
    t->prompt_ids = NULL;
    t->prompt_len = NULL;
    t->text = NULL;
    t->text_len = NULL;
    t->nprompts = 0;
    return -1;
}

void tok_job_free(tok_job *t)
{
    if (t == NULL) return;
    for (size_t i = 0; t->prompt_ids != NULL && i < t->nprompts; i++) free(t->prompt_ids[i]);
    free(t->prompt_ids);
    free(t->prompt_len);
    free(t->text);
    free(t->text_len);
    free(t->pred_ids);
    json_decref(t->tokenize_body);
    free(t->answer);
    free(t);
}

size_t tok_prompt_tokens(const srv_req *r)
{
    size_t n = 0;
    if (r->tok == NULL || r->tok->on_thread) return 0; /* the worker is writing them */
    for (size_t i = 0; i < r->tok->nprompts; i++) n += r->tok->prompt_len[i];
    return n;
}

/* The text of prompt i, or NULL for a prompt given as token ids. */
static const char *prompt_text(const srv_req *r, size_t i, size_t *len)
{
    *len = r->tok->text_len[i];
    return r->tok->text[i];
}

/* /tokenize's body, parsed here: a large one on the work queue, since
 * parsing 1 MB of JSON holds the loop thread (every stream's next token)
 * for milliseconds. 0, or -1 with r->tok->body_status set. */
static int tokenize_body_parse(srv_req *r)
{
    json_error_t jerr;
    json_t *o = json_loadb(r->body ? r->body : "", r->body_len, JSON_ALLOW_NUL, &jerr);
    if (o == NULL || !json_is_object(o)) {
        json_decref(o);
        r->tok->body_status = 400;
        snprintf(r->tok->err, sizeof r->tok->err, "the body must be a JSON object");
        return -1;
    }
    const json_t *p = json_object_get(o, "prompt");
    if (!json_is_string(p)) {
        r->tok->body_status = 400;
        r->tok->body_param = "prompt";
        snprintf(r->tok->err, sizeof r->tok->err, "%s",
                 p == NULL ? "'prompt' is required: the text to tokenize"
                           : "'prompt' must be a string");
        json_decref(o);
        return -1;
    }
    r->tok->tokenize_body = o; /* holds the text while it is tokenized */
    r->tok->text[0] = json_string_value(p);
    r->tok->text_len[0] = json_string_length(p);
    return 0;
}

/* POST /detokenize's work: the body's ids as text, its answer into
 * r->tok->answer (errors as for /tokenize). Thread: the loop thread, or a
 * worker while r->tok->on_thread. */
static void detokenize_run(srv_req *r)
{
    json_error_t jerr;
    json_t *o = json_loadb(r->body ? r->body : "", r->body_len, JSON_ALLOW_NUL, &jerr);
    r->tok->body_param = "tokens";
    if (o == NULL || !json_is_object(o)) {
        json_decref(o);
        r->tok->body_status = 400;
        r->tok->body_param = NULL;
        snprintf(r->tok->err, sizeof r->tok->err, "the body must be a JSON object");
        return;
    }
    json_t *t = json_object_get(o, "tokens");
    size_t n = json_array_size(t);
    int32_t *ids = NULL;
    if (!json_is_array(t)) {
        r->tok->body_status = 400;
        snprintf(r->tok->err, sizeof r->tok->err, "%s",
                 t == NULL ? "'tokens' is required: the token ids to detokenize"
                           : "'tokens' must be a list of token ids");
        goto done;
    }
    ids = malloc((n ? n : 1) * sizeof *ids);
    if (ids == NULL) {
        r->tok->failed = 1;
        r->tok->status = BPE_ENOMEM;
        snprintf(r->tok->err, sizeof r->tok->err, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            r->tok->body_status = 400;
            snprintf(r->tok->err, sizeof r->tok->err, "'tokens' entry %zu is not a token id", i);
            goto done;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    char *text;
    size_t tn;
    bpe_status st =
        tok_ids_text(r->s->api->tok, ids, n, &text, &tn, r->tok->err, sizeof r->tok->err);
    if (st != BPE_OK) {
        r->tok->failed = 1;
        r->tok->status = st;
        goto done;
    }
    json_t *answer = json_pack("{s:s%}", "prompt", text, tn);
    free(text);
    r->tok->answer = answer != NULL ? json_dumps(answer, JSON_COMPACT) : NULL;
    json_decref(answer);
    if (r->tok->answer == NULL) {
        r->tok->failed = 1;
        r->tok->status = BPE_ENOMEM;
        snprintf(r->tok->err, sizeof r->tok->err, "out of memory");
    }
done:
    free(ids);
    json_decref(o);
}

/* /tokenize's answer, {"tokens":[...],"count":N}, into r->tok->answer (the same
 * bytes jansson's compact form gives, without an object per token). */
static void tokenize_body_answer(srv_req *r)
{
    size_t n = r->tok->prompt_len[0], cap = 64 + n * 12, len = 0;
    char *out = malloc(cap);
    if (out == NULL) {
        r->tok->failed = 1;
        r->tok->status = BPE_ENOMEM;
        snprintf(r->tok->err, sizeof r->tok->err, "out of memory");
        return;
    }
    len += (size_t)snprintf(out, cap, "{\"tokens\":[");
    for (size_t i = 0; i < n; i++)
        len +=
            (size_t)snprintf(out + len, cap - len, i ? ",%d" : "%d", (int)r->tok->prompt_ids[0][i]);
    snprintf(out + len, cap - len, "],\"count\":%zu}", n);
    r->tok->answer = out;
}

/* Encodes every text prompt into prompt_ids/prompt_len (a body still to
 * parse first by the job's parser; for /tokenize, parses the body first and
 * writes the answer after; /detokenize's work too). Thread: the loop
 * thread, or a tokenizer thread while on_thread. */
static void tokenize_run(srv_req *r)
{
    if (r->kind == R_DETOKENIZE) {
        detokenize_run(r);
        return;
    }
    if (r->kind == R_TOKENIZE && r->tok->tokenize_body == NULL && tokenize_body_parse(r) != 0)
        return;
    if (r->tok->parse != NULL) {
        int (*parse)(srv_req *) = r->tok->parse;
        r->tok->parse = NULL;
        if (parse(r) != 0) {
            r->tok->parse_failed = 1;
            return;
        }
    }
    if (r->tok->work != NULL && r->tok->work(r) != 0) return;
    for (size_t i = 0; i < r->tok->nprompts && !r->tok->failed; i++) {
        size_t len;
        const char *text = prompt_text(r, i, &len);
        if (text == NULL) continue;
        /* "<|endoftext|>" in a prompt is the token, as the model knows it. A
         * completion's prompt is cut off past max_prompt_tokens: a 1 MB
         * prompt costs the work of its first tokens, not of all of them. */
        size_t max = r->tok->max_prompt_tokens;
        bpe_status st =
            bpe_encode_special_max(r->s->api->tok, text, len, max, &r->tok->prompt_ids[i],
                                   &r->tok->prompt_len[i], r->tok->err, sizeof r->tok->err);
        if (st == BPE_ETOOBIG && max != SIZE_MAX)
            snprintf(r->tok->err, sizeof r->tok->err,
                     "prompt %zu has more than %zu tokens; the limit is %zu (max_prompt_tokens)", i,
                     max, max);
        if (st != BPE_OK) {
            r->tok->failed = 1;
            r->tok->status = st;
        }
    }
    if (r->kind == R_TOKENIZE && !r->tok->failed) tokenize_body_answer(r);
    if (r->tok->pred_text != NULL && !r->tok->failed) {
        /* Only drafts: a prediction that cannot be encoded (memory) is
         * none, and no output changes. Past what max_tokens can use it is
         * cut (at a byte: its last token may differ; a draft still). */
        size_t n = r->tok->pred_text_len;
        if (n > r->tok->pred_max_bytes) n = r->tok->pred_max_bytes;
        if (bpe_encode(r->s->api->tok, r->tok->pred_text, n, &r->tok->pred_ids, &r->tok->npred,
                       NULL, 0)
            != BPE_OK)
            r->tok->npred = 0;
    }
}

/* Starts r's tokenization on a tokenizer thread. */
static void tok_start(srv_req *r)
{
    http_req_hold(r); /* the thread's reference, released by tok_done */
    r->tok->on_thread = 1;
    r->s->api->tokenizing++;
    tpool_submit(r->s->api->tokpool, r);
}

static void tok_unwait(srv_req *r)
{
    srv *s = r->s;
    assert(r->tok->waiting);
    if (r->tok->wprev)
        r->tok->wprev->tok->wnext = r->tok->wnext;
    else
        s->api->tok_wait_head = r->tok->wnext;
    if (r->tok->wnext)
        r->tok->wnext->tok->wprev = r->tok->wprev;
    else
        s->api->tok_wait_tail = r->tok->wprev;
    r->tok->wprev = r->tok->wnext = NULL;
    r->tok->waiting = 0;
    s->api->tok_nwait--;
}

/* Starts waiting bodies while slots are free. */
static void tok_admit_waiting(srv *s)
{
    while (s->api->tokenizing < s->cfg.tokenize_concurrency && s->api->tok_wait_head != NULL) {
        srv_req *r = s->api->tok_wait_head;
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
    for (srv_req *r = s->api->tok_wait_head; r != NULL; r = next) {
        next = r->tok->wnext;
        if (now - r->t_start <= s->cfg.queue_timeout_s) break; /* oldest first */
        tok_unwait(r);
        r->cont = tok_expired;
        http_resume(r);
    }
}

/* A tokenizer thread is done with r (loop thread). */
static void tok_done(srv_req *r)
{
    r->s->api->tokenizing--;
    r->tok->on_thread = 0;
    srv *s = r->s;
    tok_admit_waiting(s);
    http_resume(r); /* on_request runs the continuation (the client may have left) */
    http_req_release(r);
    loop_mhd_run(s);
}

int tok_pool_start(srv *s, char *err, size_t errlen)
{
    return tpool_new(s->loop, s->cfg.tokenize_concurrency, tokenize_run, tok_done, &s->api->tokpool,
                     err, errlen);
}

/* A request the tokenizer threads held when the server stopped. */
static void tok_drop(srv_req *r)
{
    r->tok->on_thread = 0;
    http_req_release(r);
}

void tok_pool_free(srv *s)
{
    tpool_free(s->api->tokpool, tok_drop);
    s->api->tokpool = NULL;
}

void tok_closed(srv_req *r)
{
    if (r->tok != NULL && r->tok->waiting) tok_unwait(r);
}

enum MHD_Result tok_prompts(srv_req *r, int (*parse)(srv_req *r), http_cont then)
{
    /* TOKENIZING: a second trip, the continuation of a first (a Responses
     * body parsed on a tokenizer thread, its stored history read since). */
    assert(r->state == HTTP_REQ_BODY || r->state == HTTP_REQ_TOKENIZING);
    int again = r->state == HTTP_REQ_TOKENIZING;
    size_t bytes = 0;
    r->tok->parse = parse;
    if (r->kind == R_TOKENIZE || r->kind == R_DETOKENIZE || parse != NULL)
        bytes = r->body_len; /* not parsed yet: the body is the work */
    else
        for (size_t i = 0; i < r->tok->nprompts; i++) {
            size_t len;
            if (prompt_text(r, i, &len) != NULL) bytes += len;
        }
    if (r->tok->heavy) bytes = SRV_TOKENIZE_INLINE_BYTES; /* off the loop thread */
    srv *s = r->s;
    if (bytes >= SRV_TOKENIZE_INLINE_BYTES) {
        if (s->api->tokenizing < s->cfg.tokenize_concurrency) {
            if (!again) http_req_set_state(r, HTTP_REQ_TOKENIZING);
            http_suspend(r, then);
            tok_start(r);
            return MHD_YES;
        } else if (s->api->tok_nwait < s->cfg.max_queue) {
            /* Wait for a slot: a tokenizer on every core would hold up the
             * engine's steps (and every stream's next token). */
            r->tok->waiting = 1;
            r->tok->wprev = s->api->tok_wait_tail;
            if (s->api->tok_wait_tail)
                s->api->tok_wait_tail->tok->wnext = r;
            else
                s->api->tok_wait_head = r;
            s->api->tok_wait_tail = r;
            s->api->tok_nwait++;
            if (!again) http_req_set_state(r, HTTP_REQ_TOKENIZING);
            http_suspend(r, then);
            return MHD_YES;
        } else {
            char ra[16];
            http_retry_after(s, ra, sizeof ra);
            return http_send_error(r, 429, "rate_limit_exceeded", "rate_limit_exceeded", NULL, ra,
                                   "The server is busy (%zu request bodies wait to be tokenized); "
                                   "retry after %s s",
                                   s->api->tok_nwait, ra);
        }
    }
    tokenize_run(r);
    return then(r);
}

/* POST /tokenize and /detokenize, once the work is done (the continuation). */
static enum MHD_Result tokenize_respond(srv_req *r)
{
    assert(r->state == HTTP_REQ_BODY || r->state == HTTP_REQ_TOKENIZING);
    if (r->tok->body_status != 0)
        return http_send_error(r, r->tok->body_status, "invalid_request_error", NULL,
                               r->tok->body_param, NULL, "%s", r->tok->err);
    if (r->tok->failed)
        return http_send_status(r, HTTP_SRC_BPE, (int)r->tok->status,
                                r->kind == R_DETOKENIZE ? "tokens" : "prompt", r->tok->err);
    enum MHD_Result rc = http_send_json(r, 200, r->tok->answer, NULL);
    free(r->tok->answer);
    r->tok->answer = NULL;
    return rc;
}

/* The hooks of a /tokenize or /detokenize request. */
static void tok_usage(const srv_req *r, size_t *prompt, size_t *completion)
{
    *prompt = tok_prompt_tokens(r);
    *completion = 0;
}

static void tok_free(srv_req *r)
{
    tok_job_free(r->tok);
    r->tok = NULL;
}

static const srv_req_ops tok_ops = {.closed = tok_closed, .usage = tok_usage, .free = tok_free};

/* Both routes: the job, its hooks, its prompt slot (the body's text is
 * found when the body is parsed, with the tokenizing). */
static enum MHD_Result tok_route(srv_req *r, srv_kind kind)
{
    r->kind = kind;
    r->ops = &tok_ops;
    if (tok_job_new(r) == NULL || tok_job_prompts(r->tok, kind == R_TOKENIZE ? 1 : 0) != 0)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    return tok_prompts(r, NULL, tokenize_respond);
}

enum MHD_Result tok_route_tokenize(srv_req *r)
{
    return tok_route(r, R_TOKENIZE); /* the body is parsed with the tokenizing */
}

enum MHD_Result tok_route_detokenize(srv_req *r)
{
    return tok_route(r, R_DETOKENIZE); /* parsed and decoded like a body to tokenize */
}
