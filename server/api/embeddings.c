/*
 * server/api/embeddings.c: POST /v1/embeddings, OpenAI's shape. Each input
 * is one engine sequence that computes its prompt and ends with its
 * embedding (eng_request.embed: the mean over its positions of the final
 * layer norm's output, scaled to length 1), on the completion path: the
 * body parsed (oai_parse_embeddings; a large one where it is tokenized),
 * tokenized, admitted and counted like a completion's prompts, sharing the
 * engine's steps, fair admission and limits with generation. The inputs go
 * to the engine SRV_EMBED_WINDOW at a time (completions.c, embed_next), so
 * a batch of thousands holds a window of sequences, not thousands. This
 * file checks the inputs' lengths and writes the answer:
 *
 *   {"object": "list", "data": [{"object": "embedding", "index": i,
 *    "embedding": [floats] | "base64 of little-endian float32"}, ...],
 *    "model": ..., "usage": {"prompt_tokens": n, "total_tokens": n}}
 */
#include "api/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A float as JSON takes at most this (%.9g: "-1.23456789e-05", a comma). */
#define EMBED_FLOAT_BYTES 16
/* An entry's fixed part: {"object":"embedding","index":N,"embedding":[]}. */
#define EMBED_ENTRY_BYTES 64

static size_t b64_len(size_t n)
{
    return (n + 2) / 3 * 4;
}

/* n bytes of p as base64 at out (b64_len(n) bytes, no NUL). */
static void b64_put(char *out, const unsigned char *p, size_t n)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        if (i + 1 < n) v |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n) v |= p[i + 2];
        *out++ = a[(v >> 18) & 63];
        *out++ = a[(v >> 12) & 63];
        *out++ = i + 1 < n ? a[(v >> 6) & 63] : '=';
        *out++ = i + 2 < n ? a[v & 63] : '=';
    }
}

/* The most bytes the answer can take. */
static size_t answer_bound(const srv_req *r, size_t C)
{
    const oai_request *q = &r->cmpl->oreq;
    size_t per =
        EMBED_ENTRY_BYTES + (q->embed_base64 ? b64_len(C * sizeof(float)) : C * EMBED_FLOAT_BYTES);
    return 256 + 2 * strlen(adp_model_name(r)) + q->nprompts * per;
}

static enum MHD_Result send_answer(srv_req *r)
{
    cmpl_job *j = r->cmpl;
    if (j->error_status != 0)
        return http_send_error(r, j->error_status, cmpl_error_type(j->error_status), j->error_code,
                               NULL, j->error_status == 503 ? "5" : NULL, "%s", j->error_msg);
    size_t C = eng_model_config(r->cmpl->ckpt->model)->n_embd;
    size_t cap = answer_bound(r, C), len = 0;
    char *out = malloc(cap);
    if (out == NULL)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    len += (size_t)snprintf(out, cap, "{\"object\":\"list\",\"data\":[");
    for (size_t i = 0; i < j->nchoices; i++) {
        const srv_choice *c = &j->choices[i];
        if (c->embedding == NULL) { /* cut short (a cancel) without an error: none */
            free(out);
            return http_send_error(r, 500, "server_error", NULL, NULL, NULL,
                                   "embedding input %zu was not computed", i);
        }
        len += (size_t)snprintf(
            out + len, cap - len,
            "%s{\"object\":\"embedding\",\"index\":%zu,\"embedding\":", i ? "," : "", i);
        if (j->oreq.embed_base64) {
            unsigned char bytes[4];
            unsigned char *raw = malloc(C * sizeof(float));
            if (raw == NULL) {
                free(out);
                return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
            }
            for (size_t e = 0; e < C; e++) { /* little-endian, as OpenAI's clients read */
                uint32_t u;
                memcpy(&u, &c->embedding[e], sizeof u);
                for (int b = 0; b < 4; b++) bytes[b] = (unsigned char)(u >> (8 * b));
                memcpy(raw + 4 * e, bytes, 4);
            }
            out[len++] = '"';
            b64_put(out + len, raw, C * sizeof(float));
            len += b64_len(C * sizeof(float));
            out[len++] = '"';
            free(raw);
        } else {
            out[len++] = '[';
            for (size_t e = 0; e < C; e++)
                len += (size_t)snprintf(out + len, cap - len, "%s%.9g", e ? "," : "",
                                        (double)c->embedding[e]);
            out[len++] = ']';
        }
        out[len++] = '}';
    }
    size_t n = tok_prompt_tokens(r);
    /* The name as a JSON string: printable ASCII, but '"' and '\\' may be
     * in it (answer_bound leaves room for each byte escaped). */
    json_t *name = json_string(adp_model_name(r));
    char *qname = name ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
    json_decref(name);
    if (qname == NULL) {
        free(out);
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    }
    len += (size_t)snprintf(out + len, cap - len,
                            "],\"model\":%s,\"usage\":{\"prompt_tokens\":%zu,\"total_tokens\":"
                            "%zu}}",
                            qname, n, n);
    free(qname);
    enum MHD_Result rc = http_send_json(r, 200, out, NULL);
    free(out);
    return rc;
}

static const cmpl_shape embed_shape = {.send = send_answer};

/* The inputs, tokenized: each within the context and max_prompt_tokens,
 * the answer within max_response_bytes; then admission as a completion's. */
static enum MHD_Result after_tokenize(srv_req *r)
{
    srv *s = r->s;
    if (r->tok->parse_failed) return cmpl_send_oai_error(r, &r->cmpl->parse_err);
    if (r->tok->failed)
        return http_send_status(r, HTTP_SRC_BPE, (int)r->tok->status, "input", r->tok->err);
    oai_request *q = &r->cmpl->oreq;
    enum MHD_Result rc;
    if (!adp_pick(r, q->model, &rc)) return rc;
    const eng_config *mc = eng_model_config(r->cmpl->ckpt->model);
    if (q->embed_dimensions != 0 && q->embed_dimensions != mc->n_embd)
        return http_send_error(r, 400, "invalid_request_error", NULL, "dimensions", NULL,
                               "'dimensions' must be this model's width, %zu: its embeddings are "
                               "not trained to be cut shorter",
                               mc->n_embd);
    size_t limit = mc->n_ctx < s->cfg.max_prompt_tokens ? mc->n_ctx : s->cfg.max_prompt_tokens;
    for (size_t i = 0; i < q->nprompts; i++)
        if (r->tok->prompt_len[i] > limit)
            return http_send_error(
                r, 400, "invalid_request_error", "context_length_exceeded", "input", NULL,
                "'input' entry %zu has %zu tokens; the limit is %zu (this "
                "model's context %zu, max_prompt_tokens %zu)",
                i, r->tok->prompt_len[i], limit, mc->n_ctx, s->cfg.max_prompt_tokens);
    size_t bound = answer_bound(r, mc->n_embd);
    if (bound > s->cfg.max_response_bytes)
        return http_send_error(r, 400, "invalid_request_error", "response_too_large", "input", NULL,
                               "The answer to %zu inputs could take %zu bytes, over "
                               "max_response_bytes (%zu); send fewer inputs in one request%s",
                               q->nprompts, bound, s->cfg.max_response_bytes,
                               q->embed_base64 ? "" : ", or \"encoding_format\": \"base64\"");
    return cmpl_admit(r);
}

/* The tokenizer job's parser: the body, then the prompts. */
static int parse(srv_req *r)
{
    /* One checkpoint: its width; several: `dimensions` is checked once
     * `model` picked one (after_tokenize). */
    const srv_api *a = r->s->api;
    size_t width = a->nckpt == 1 ? eng_model_config(a->model)->n_embd : 0;
    if (oai_parse_embeddings(r->body ? r->body : "", r->body_len, &r->cmpl->lim, width,
                             &r->cmpl->oreq, &r->cmpl->parse_err)
        != 0)
        return -1;
    return cmpl_job_prompts(r);
}

enum MHD_Result embed_route(srv_req *r)
{
    assert(r->state == HTTP_REQ_BODY);
    srv *s = r->s;
    if (s->api->draining) return cmpl_refuse_draining(r);
    const eng_config *mc = eng_model_config(s->api->model);
    r->kind = R_COMPLETIONS;
    if (cmpl_job_new(r) == NULL)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    r->tok->max_prompt_tokens = s->cfg.max_prompt_tokens;
    r->cmpl->shape = &embed_shape;
    r->cmpl->lim = (oai_limits){.vocab_size = mc->n_vocab,
                                .max_tokens_limit = 0,
                                .max_n = 1,
                                .max_stop_bytes = SRV_MAX_STOP_BYTES,
                                .max_prompts = s->cfg.max_embedding_inputs};
    if (r->body_len >= SRV_TOKENIZE_INLINE_BYTES) /* parsed where it is tokenized */
        return tok_prompts(r, parse, after_tokenize);
    if (parse(r) != 0) return cmpl_send_oai_error(r, &r->cmpl->parse_err);
    return tok_prompts(r, NULL, after_tokenize);
}
