/*
 * engine/sched_draft.c: the draft model of speculative decoding
 * (ENG_DRAFT_MODEL): a smaller GPT-2 with the target's vocabulary, its own
 * KV pool and workspace, that proposes a sequence's next k tokens greedily.
 *
 * Each drafting sequence keeps its own block table in the draft's pool
 * (reserved whole, prompt + max_tokens, at its first draft; while the
 * pool is too full the sequence decodes plainly rather than waiting). The draft's
 * cache holds the sequence's tokens up to some position; a step first
 * feeds what it lacks (the prompt at first, then the tokens the last
 * verify accepted, in chunks of at most DRAFT_ROWS over all sequences),
 * then the last token, and draws k tokens one round at a time: every
 * drafting sequence's row in one forward pass of the draft model per
 * round. Plan (loop thread) decides who drafts and feeds how much;
 * execute (the step's thread) runs the rounds before the target's verify
 * pass; complete rolls the draft's cache back past what was accepted, as
 * the target's is.
 */
#include "sched_int.h"

#include <stdlib.h>
#include <string.h>

eng_status draft_new(eng_sched *s, char *err, size_t errlen)
{
    const eng_config *t = &s->m->cfg, *d = &s->o.draft->cfg;
    if (d->n_vocab != t->n_vocab)
        return ERRBUF_FAIL(err, errlen, ENG_EINVAL,
                           "the draft model's vocabulary has %zu tokens, the model's %zu: a "
                           "draft must share the model's tokenizer",
                           d->n_vocab, t->n_vocab);
    if (d->n_ctx < t->n_ctx)
        return ERRBUF_FAIL(err, errlen, ENG_EINVAL,
                           "the draft model's context is %zu positions, the model's %zu: a draft "
                           "must see as far",
                           d->n_ctx, t->n_ctx);
    size_t bytes = s->o.draft_kv_bytes ? s->o.draft_kv_bytes : s->o.kv_bytes / 4;
    size_t per_pos = 2 * d->n_layer * d->n_embd * sizeof(float); /* K and V */
    size_t one_seq = (t->n_ctx + s->o.block_len) * per_pos;
    if (bytes < one_seq) bytes = one_seq;
    eng_status rc = eng_kv_new(s->o.draft, bytes, s->o.block_len, &s->dkv, err, errlen);
    if (rc != ENG_OK) return rc;
    rc = eng_workspace_new_on(s->o.draft, DRAFT_ROWS + s->slots, s->ws, &s->dws); /* its threads */
    if (rc != ENG_OK) return ERRBUF_FAIL(err, errlen, rc, "cannot allocate the draft workspace");
    s->ditems = calloc(s->slots, sizeof *s->ditems);
    s->dseqs = calloc(s->slots, sizeof *s->dseqs);
    s->dlogits = malloc(s->slots * t->n_vocab * sizeof *s->dlogits);
    if (s->ditems == NULL || s->dseqs == NULL || s->dlogits == NULL)
        return ERRBUF_FAIL(err, errlen, ENG_ENOMEM, "out of memory for the draft model");
    return ENG_OK;
}

void draft_free(eng_sched *s)
{
    eng_workspace_free(s->dws);
    eng_kv_free(s->dkv);
    free(s->ditems);
    free(s->dseqs);
    free(s->dlogits);
}

void draft_release(eng_sched *s, sch_seq *q)
{
    if (s->dkv != NULL && q->dkv.blocks != NULL) eng_kv_release(s->dkv, &q->dkv);
}

size_t draft_plan(eng_sched *s, sch_seq *q, size_t k, size_t *rows_left)
{
    q->draft_feed = 0;
    if (q->draft_off) return 0;
    if (q->dkv.blocks == NULL
        && eng_kv_reserve(s->dkv, &q->dkv, q->req.nprompt + q->req.max_tokens) != ENG_OK)
        return 0; /* the draft's pool is full: plainly, until blocks come back */
    /* What the draft lacks, the last token with it. */
    size_t feed = q->ntokens - q->dkv.len;
    if (feed > *rows_left) { /* a chunk of it this step, no draft yet */
        q->draft_feed = *rows_left;
        *rows_left = 0;
        return 0;
    }
    *rows_left -= feed;
    q->draft_feed = feed;
    return k;
}

/* The lowest id among the row's maxima. */
static int32_t argmax(const float *x, size_t V)
{
    size_t best = 0;
    for (size_t i = 1; i < V; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

/* The sequences of this step that feed the draft model. */
static size_t drafting(eng_sched *s)
{
    size_t n = 0;
    for (size_t i = 0; i < s->nitems; i++)
        if (s->step_seqs[i]->draft_feed > 0) s->dseqs[n++] = s->step_seqs[i];
    return n;
}

eng_status draft_run(eng_sched *s, char *err, size_t errlen)
{
    size_t V = s->m->cfg.n_vocab, n = drafting(s);
    if (n == 0) return ENG_OK;
    /* Round 0: each sequence's feed (its last rows: the last token when
     * it drafts); then one row a round: the token drawn in the last. */
    for (size_t r = 0;; r++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            sch_seq *q = s->dseqs[i];
            if (r > 0 && r >= q->step_draft) continue;
            const int32_t *t = r == 0 ? q->tokens + q->dkv.len : q->tokens + q->ntokens + r - 1;
            size_t rows = r == 0 ? q->draft_feed : 1;
            int drafts = q->step_draft > 0;
            s->ditems[m++] = (eng_item){.seq = &q->dkv,
                                        .tokens = t,
                                        .n = rows,
                                        .want = drafts ? ENG_LOGITS_LAST : ENG_LOGITS_NONE,
                                        .logits = s->dlogits + i * V};
        }
        if (m == 0) return ENG_OK;
        eng_status rc = eng_forward(s->o.draft, s->dkv, s->dws, s->ditems, m, err, errlen);
        if (rc != ENG_OK) return rc;
        for (size_t i = 0; i < n; i++) {
            sch_seq *q = s->dseqs[i];
            if (r < q->step_draft) q->tokens[q->ntokens + r] = argmax(s->dlogits + i * V, V);
        }
    }
}

void draft_abandon(eng_sched *s)
{
    for (size_t i = 0; i < s->nitems; i++) {
        sch_seq *q = s->step_seqs[i];
        if (q->draft_feed == 0) continue;
        q->draft_feed = 0;
        q->draft_off = 1; /* its draft cache is in doubt: no more drafts */
        if (q->step_draft > 0) {
            q->step_draft = 0;
            s->items[i].n = 1;
            s->items[i].want = ENG_LOGITS_LAST;
        }
    }
}

void draft_settle(sch_seq *q)
{
    /* The draft's cache holds the last token and the drafts it was fed
     * (all but the last): those past the accepted ones are rolled back. */
    size_t valid = q->ntokens + q->step_accepted; /* positions < this hold tokens kept */
    if (q->dkv.len > valid) q->dkv.len = valid;
}
