/*
 * server/api/cmpl_format.c: structured outputs for the generation routes:
 * a request's format compiled through the cache on a tokenizer thread
 * (cmpl_compile_format), the vocabulary the matchers walk
 * (srv_grammar_init), and each sequence's matcher as the engine's mask
 * (cmpl_format_mask_new: the engine knows only eng_mask_ops).
 */
#include "api/api.h"

#include <stdlib.h>

/* A structured-outputs matcher (structured.h) answers the engine's mask
 * operations for one sequence. */

static const uint64_t *mask_allowed(void *self, size_t *nallowed)
{
    return gram_matcher_mask(self, nallowed);
}

static int mask_accept(void *self, int32_t token)
{
    return gram_matcher_feed(self, token);
}

static int mask_accepting(const void *self)
{
    return gram_matcher_accepting(self);
}

static const char *mask_error(const void *self)
{
    return gram_matcher_error(self);
}

static void mask_free(void *self)
{
    gram_matcher_free(self);
}

static const eng_mask_ops format_mask_ops = {
    .allowed = mask_allowed,
    .accept = mask_accept,
    .accepting = mask_accepting,
    .error = mask_error,
    .free = mask_free,
};

int cmpl_format_mask_new(srv *s, gram *g, eng_mask *out)
{
    gram_matcher *m = gram_matcher_new(g, s->api->gvocab);
    if (m == NULL) return -1;
    *out =
        (eng_mask){.ops = &format_mask_ops, .self = m, .n_vocab = gram_vocab_size(s->api->gvocab)};
    return 0;
}

int srv_grammar_init(srv *s)
{
    size_t V = bpe_vocab_size(s->api->tok);
    const char **tok = malloc(V * sizeof *tok);
    size_t *len = malloc(V * sizeof *len);
    int rc = -1;
    if (tok != NULL && len != NULL) {
        for (size_t i = 0; i < V; i++) tok[i] = bpe_token_bytes(s->api->tok, (int32_t)i, &len[i]);
        rc = gram_vocab_new(tok, len, V, BPE_EOT, &s->api->gvocab);
    }
    free(tok);
    free(len);
    if (rc == 0 && (s->api->gcache = gram_cache_new(GRAM_CACHE_ENTRIES)) == NULL) rc = -1;
    if (rc == 0) /* structured_cache_mb is at most 2^20: no overflow */
        gram_cache_set_max_bytes(s->api->gcache, s->cfg.structured_cache_mb << 20);
    return rc;
}

/* The request's output format compiled (through the cache), on a tokenizer
 * thread (tok_job.work); a refusal becomes format_err, the 400 that names
 * the keyword and its path. Always 0: the tokenizing goes on. */
int cmpl_compile_format(srv_req *r)
{
    cmpl_job *j = r->cmpl;
    const oai_request *q = &j->oreq;
    /* A prompt made on a second trip (/v1/responses' deferred one) runs the
     * work again: compiled once, or the first reference is lost. */
    if (j->grammar != NULL || j->format_failed) return 0;
    gram_error ge;
    if (gram_cache_get(r->s->api->gcache, (gram_kind)q->format, q->format_src ? q->format_src : "",
                       q->format_len, &j->grammar, &ge)
        != 0) {
        j->format_failed = 1;
        const char *kw = ge.keyword[0] ? ge.keyword : q->format_param;
        if (q->format == OAI_FORMAT_SCHEMA)
            oai_error_set(&j->format_err, 400, "invalid_request_error", "invalid_schema",
                          q->format_param, "Invalid schema: '%s' at %s: %s", kw, ge.path,
                          ge.message);
        else
            oai_error_set(&j->format_err, 400, "invalid_request_error", NULL, q->format_param,
                          "'%s' is refused: %s", q->format_param, ge.message);
    }
    return 0;
}
