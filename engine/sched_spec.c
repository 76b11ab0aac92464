/*
 * engine/sched_spec.c: speculative decoding's drafts and their settling,
 * on the loop thread (engine.h says why it changes no output bit).
 *
 * Plan asks spec_propose for a decoding sequence's draft: the prediction's
 * next tokens where the request has one, else what followed the latest
 * earlier occurrence of the sequence's last n-gram (prompt lookup), else
 * nothing; the draft model's tokens are made in the step itself
 * (sched_draft.c). Execute verifies (sched_step.c: the sampler draws each
 * position as plain decoding would and stops at the first disagreement).
 * Complete calls spec_settle: the KV positions past the accepted run are
 * rolled back (the block table keeps its blocks: those positions are
 * written again by the next step), the counts are kept, and the next
 * draft's length follows what drafts earned: the whole draft accepted
 * grows it by one up to the request's k; otherwise it becomes one more than
 * what was accepted; a draft that earned nothing makes the sequence decode
 * plainly for 2, 4, ... up to 16 steps before it drafts again, so a
 * drafter that is always wrong costs about one step in seventeen.
 */
#include "sched_int.h"

#include <string.h>

/* Prompt lookup's n-grams: the longest first. */
#define LOOKUP_MAX_N 4
#define LOOKUP_MIN_N 2
/* Plain steps after a draft that earned nothing: 2, 4, ... at most this. */
#define SPEC_SKIP_MAX 16

/* The end of the latest occurrence of t[n-len, n) in t that ends before
 * n, for the longest len in [LOOKUP_MIN_N, LOOKUP_MAX_N]; 0 if none. */
static size_t lookup_end(const int32_t *t, size_t n)
{
    for (size_t len = LOOKUP_MAX_N; len >= LOOKUP_MIN_N; len--) {
        if (n < len + 1) continue;
        const int32_t *pat = t + n - len;
        for (size_t i = n - len; i-- > 0;)
            if (t[i] == pat[0] && memcmp(t + i, pat, len * sizeof *t) == 0) return i + len;
    }
    return 0;
}

/* How far past its place a prediction is searched for the output's
 * return: a bound on the loop thread's work a token (a prediction may be
 * tens of thousands of tokens, and one that was left is searched again at
 * every token until the output rejoins it). */
#define REALIGN_WINDOW 512

/* The first index in [from, from + REALIGN_WINDOW) of p[0, np) where the
 * output's last tokens o[no-len, no) occur (the longest len first, at most
 * LOOKUP_MAX_N), as the index just past them; SIZE_MAX if none there. */
static size_t realign(const int32_t *p, size_t np, size_t from, const int32_t *o, size_t no)
{
    if (np > from + REALIGN_WINDOW) np = from + REALIGN_WINDOW;
    for (size_t len = no < LOOKUP_MAX_N ? no : LOOKUP_MAX_N; len >= 1; len--) {
        const int32_t *pat = o + no - len;
        for (size_t i = from; i + len <= np; i++)
            if (p[i] == pat[0] && memcmp(p + i, pat, len * sizeof *p) == 0) return i + len;
    }
    return SIZE_MAX;
}

size_t spec_propose(eng_sched *s, sch_seq *q, size_t room)
{
    q->step_draft = 0;
    q->step_accepted = 0;
    if (q->req.speculative_tokens == 0) return 0;
    if (q->spec_skip > 0) {
        q->spec_skip--;
        return 0;
    }
    /* Room: the step's spare rows, and the sequence's own: the last of
     * max_tokens is always the model's own token, never a draft's. */
    size_t k = q->spec_k;
    size_t left = q->req.max_tokens - q->generated;
    if (left <= 1) return 0;
    if (k > left - 1) k = left - 1;
    if (k > room) k = room;
    if (k == 0) return 0;
    int32_t *out = q->tokens + q->ntokens;
    size_t d = 0;
    if (q->pred != NULL && !q->pred_lost && q->pred_pos < q->npred) {
        q->spec_by = ENG_DRAFT_PREDICTION;
        for (; d < k && q->pred_pos + d < q->npred; d++) out[d] = q->pred[q->pred_pos + d];
    } else if (q->req.drafter == ENG_DRAFT_LOOKUP) {
        q->spec_by = ENG_DRAFT_LOOKUP;
        size_t at = lookup_end(q->tokens, q->ntokens);
        for (; at > 0 && d < k && at + d < q->ntokens; d++) out[d] = q->tokens[at + d];
    } else if (q->req.drafter == ENG_DRAFT_MODEL && s->dkv != NULL) {
        q->spec_by = ENG_DRAFT_MODEL; /* the step writes them (sched_draft.c) */
        d = draft_plan(s, q, k, &s->draft_rows_left);
    }
    q->step_draft = d;
    return d;
}

void spec_settle(eng_sched *s, sch_seq *q)
{
    size_t d = q->step_draft, a = q->step_accepted;
    if (d == 0) return;
    if (q->spec_by == ENG_DRAFT_MODEL) draft_settle(q);
    /* The step wrote positions for the last token and every drafted one;
     * those past the accepted run hold what the model will not see. */
    q->kv.len -= d - a;
    eng_drafter by = q->spec_by;
    s->stats.spec_drafted[by] += d;
    s->stats.spec_accepted[by] += a;
    for (size_t j = 0; j < d; j++) s->stats.spec_drafted_at[by][j]++;
    for (size_t j = 0; j < a; j++) s->stats.spec_accepted_at[by][j]++;
    q->drafted += d; /* q->accepted: of the tokens delivered (eng_sched_complete) */
    if (a == d) {
        if (q->spec_k < q->req.speculative_tokens) q->spec_k++;
    } else {
        q->spec_k = a + 1;
    }
    if (a == 0) {
        if (q->spec_miss < 4) q->spec_miss++;
        q->spec_skip = (size_t)1 << q->spec_miss;
        if (q->spec_skip > SPEC_SKIP_MAX) q->spec_skip = SPEC_SKIP_MAX;
    } else {
        q->spec_miss = 0;
    }
}

void spec_delivered(eng_sched *s, sch_seq *q, size_t from)
{
    /* A stop string may cancel in the middle of the accepted run: the
     * request is told of the accepted tokens it received. */
    size_t delivered = q->ntokens - from;
    q->accepted += q->step_accepted < delivered ? q->step_accepted : delivered;
    if (!s->o.prefix_cache) return;
    /* The cache registers what plain decoding would have computed by now,
     * every delivered token but the last, and no more: the verify pass may
     * have computed the position of a last token (an accepted end of text)
     * or of tokens a cancel left undelivered, and a later request's
     * cached_tokens must not tell. */
    size_t len = q->kv.len;
    if (q->kv.len > q->ntokens - 1) q->kv.len = q->ntokens - 1;
    kv_commit(s->kv, &q->kv, q->tokens, &q->nhashed, &q->chain, q->plp, q->nplp);
    q->kv.len = len;
}

void spec_follow(sch_seq *q, size_t from)
{
    if (q->pred == NULL) return;
    const int32_t *o = q->tokens + q->req.nprompt;
    size_t no = q->ntokens - q->req.nprompt;
    for (size_t i = from - q->req.nprompt; i < no; i++) {
        if (!q->pred_lost && q->pred_pos < q->npred && q->pred[q->pred_pos] == o[i]) {
            q->pred_pos++;
            continue;
        }
        /* The output left the prediction (or has not come back yet): it
         * rejoins where the output's latest tokens occur next, from the
         * place it left; until then the prediction proposes nothing. */
        size_t at = realign(q->pred, q->npred, q->pred_pos, o, i + 1);
        q->pred_lost = at == SIZE_MAX;
        if (at != SIZE_MAX) q->pred_pos = at;
    }
}
