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

/* Encodes every text prompt into prompt_ids/prompt_len. Thread: the loop
 * thread, or a worker while tok_running. */
static void tokenize_run(srv_req *r)
{
    for (size_t i = 0; i < r->nprompts && !r->tok_failed; i++) {
        size_t len;
        const char *text = prompt_text(r, i, &len);
        if (text == NULL) continue;
        /* "<|endoftext|>" in a prompt is the token, as the model knows it */
        bpe_status st = bpe_encode_special(r->s->tok, text, len, &r->prompt_ids[i],
                                           &r->prompt_len[i], r->tok_err, sizeof r->tok_err);
        if (st != BPE_OK) {
            r->tok_failed = 1;
            r->tok_status = st;
        }
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
    r->tok_running = 0;
    if (r->conn_done) { /* the client left meanwhile */
        http_req_maybe_free(r);
        return;
    }
    http_resume(r); /* on_request runs the continuation */
    loop_mhd_run(r->s);
}

enum MHD_Result tok_prompts(srv_req *r, http_cont then)
{
    assert(r->state == HTTP_REQ_BODY);
    size_t bytes = 0;
    for (size_t i = 0; i < r->nprompts; i++) {
        size_t len;
        if (prompt_text(r, i, &len) != NULL) bytes += len;
    }
    if (bytes >= SRV_TOKENIZE_INLINE_BYTES) {
        r->tok_work.data = r;
        if (uv_queue_work(r->s->loop, &r->tok_work, tok_work_cb, tok_after_cb) == 0) {
            r->tok_running = 1;
            r->s->tokenizing++;
            http_req_set_state(r, HTTP_REQ_TOKENIZING);
            http_suspend(r, then);
            return MHD_YES;
        }
    }
    tokenize_run(r);
    return then(r);
}

/* The body as a JSON object, or NULL with a 400 queued (*rc). */
static json_t *body_object(srv_req *r, enum MHD_Result *rc)
{
    json_error_t jerr;
    json_t *o = json_loadb(r->body ? r->body : "", r->body_len, JSON_ALLOW_NUL, &jerr);
    if (o == NULL || !json_is_object(o)) {
        json_decref(o);
        *rc = http_send_error(r, 400, "invalid_request_error", NULL, NULL, NULL,
                              "the body must be a JSON object");
        return NULL;
    }
    return o;
}

/* POST /tokenize, once the prompt is tokenized (the continuation). */
static enum MHD_Result tokenize_respond(srv_req *r)
{
    assert(r->state == HTTP_REQ_BODY || r->state == HTTP_REQ_TOKENIZING);
    if (r->tok_failed)
        return http_send_status(r, HTTP_SRC_BPE, (int)r->tok_status, "prompt", r->tok_err);
    json_t *arr = json_array();
    for (size_t i = 0; i < r->prompt_len[0]; i++)
        json_array_append_new(arr, json_integer(r->prompt_ids[0][i]));
    return http_send_obj(
        r, json_pack("{s:o, s:I}", "tokens", arr, "count", (json_int_t)r->prompt_len[0]));
}

enum MHD_Result tok_route_tokenize(srv_req *r)
{
    enum MHD_Result rc;
    json_t *o = body_object(r, &rc);
    if (o == NULL) return rc;
    json_t *p = json_object_get(o, "prompt");
    if (!json_is_string(p)) {
        int absent = p == NULL;
        json_decref(o);
        return http_send_error(r, 400, "invalid_request_error", NULL, "prompt", NULL,
                               absent ? "'prompt' is required: the text to tokenize"
                                      : "'prompt' must be a string");
    }
    r->kind = R_TOKENIZE;
    r->tok_json = o; /* holds the text while it is tokenized */
    r->nprompts = 1;
    r->prompt_ids = calloc(1, sizeof *r->prompt_ids);
    r->prompt_len = calloc(1, sizeof *r->prompt_len);
    if (r->prompt_ids == NULL || r->prompt_len == NULL)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    return tok_prompts(r, tokenize_respond);
}

enum MHD_Result tok_route_detokenize(srv_req *r)
{
    enum MHD_Result rc;
    json_t *o = body_object(r, &rc);
    if (o == NULL) return rc;
    r->kind = R_DETOKENIZE;
    json_t *t = json_object_get(o, "tokens");
    if (t == NULL) {
        json_decref(o);
        return http_send_error(r, 400, "invalid_request_error", NULL, "tokens", NULL,
                               "'tokens' is required: the token ids to detokenize");
    }
    size_t n = json_array_size(t);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!json_is_array(t) || ids == NULL) {
        free(ids);
        json_decref(o);
        return http_send_error(r, 400, "invalid_request_error", NULL, "tokens", NULL,
                               "'tokens' must be a list of token ids");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            free(ids);
            json_decref(o);
            return http_send_error(r, 400, "invalid_request_error", NULL, "tokens", NULL,
                                   "'tokens' entry %zu is not a token id", i);
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    json_decref(o);
    char *text, err[256];
    size_t tn;
    bpe_status st = tok_ids_text(r->s->tok, ids, n, &text, &tn, err, sizeof err);
    free(ids);
    if (st != BPE_OK) return http_send_status(r, HTTP_SRC_BPE, (int)st, "tokens", err);
    rc = http_send_obj(r, json_pack("{s:s%}", "prompt", text, tn));
    free(text);
    return rc;
}
