/*
 * engine/scheduler.c: continuous batching over the paged KV cache.
 *
 * Life of a request: submit -> waiting (bounded, fair order) -> admitted
 * when the blocks for prompt + max_tokens are reserved (all or nothing) ->
 * running:
 * prefill chunks, then one decode row per step -> finished (length, end of
 * text, cancelled) -> blocks released, DONE delivered.
 *
 * A step: plan (loop thread) builds the batch; execute (any thread) runs
 * eng_forward and samples; complete (loop thread) appends the tokens,
 * delivers events and retires finished sequences. Only the loop thread
 * touches the queue, the running set and the block tables; execute reads
 * the step's sequences and writes the KV blocks and the step's results.
 */
#include "internal.h"
#include "sched_int.h"
#include "tokenizer.h" /* BPE_EOT only: a header edge, no link (docs/architecture.md) */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rows of prompt logits (echo) per step: bounds the logits buffer. */
#define ECHO_ROWS 64

eng_status eng_sched_new(const eng_model *m, const eng_sched_opts *opts, eng_sched **out, char *err,
                         size_t errlen)
{
    *out = NULL;
    eng_sched_opts o = *opts;
    if (o.block_len == 0) o.block_len = 16;
    if (o.max_running == 0) o.max_running = 64;
    if (o.tenant_spare == 0) o.tenant_spare = o.max_running / 8 > 0 ? o.max_running / 8 : 1;
    if (o.max_queue == 0) o.max_queue = 256;
    if (o.step_tokens == 0) o.step_tokens = 512;
    if (o.embed_tokens_beside_decode == 0) o.embed_tokens_beside_decode = 16;
    if (o.spec_max_batch == 0) o.spec_max_batch = 4;
    eng_sched *s = calloc(1, sizeof *s);
    if (s == NULL) return ERRBUF_FAIL(err, errlen, ENG_ENOMEM, "out of memory");
    s->m = m;
    s->o = o;
    s->next_id = 1;
    s->slots = o.max_running + o.tenant_spare;
    size_t V = m->cfg.n_vocab;
    eng_status rc = eng_kv_new(m, o.kv_bytes, o.block_len, &s->kv, err, errlen);
    if (rc != ENG_OK) goto fail;
    /* Prompt rows within the budget plus one decode row per running
     * sequence on top, and the drafted rows of speculation. */
    rc = o.threads_of != NULL
             ? eng_workspace_new_on(m, o.step_tokens + s->slots + SPEC_ROWS, o.threads_of->ws,
                                    &s->ws)
             : eng_workspace_new(m, o.step_tokens + s->slots + SPEC_ROWS, o.threads, &s->ws);
    if (rc != ENG_OK) {
        errbuf_set(err, errlen, "cannot allocate the step workspace");
        goto fail;
    }
    s->logit_rows = s->slots + ECHO_ROWS + SPEC_ROWS;
    s->running = calloc(s->slots, sizeof *s->running);
    s->queue = calloc(o.max_queue, sizeof *s->queue);
    s->qlimit = o.max_queue;
    s->items = calloc(s->slots, sizeof *s->items);
    s->step_seqs = calloc(s->slots, sizeof *s->step_seqs);
    s->logits = malloc(s->logit_rows * V * sizeof *s->logits);
    s->results = calloc(s->logit_rows, sizeof *s->results);
    s->units = calloc(s->logit_rows, sizeof *s->units);
    s->nthreads = op_pool_size(gpt2_workspace_pool(s->ws));
    s->thr = calloc(s->nthreads, sizeof *s->thr);
    int ok = s->running && s->queue && s->items && s->step_seqs && s->logits && s->results
             && s->units && s->thr;
    for (size_t t = 0; ok && t < s->nthreads; t++) ok = samp_thread_init(&s->thr[t], V) == ENG_OK;
    if (!ok) {
        rc = ERRBUF_FAIL(err, errlen, ENG_ENOMEM, "out of memory for the scheduler");
        goto fail;
    }
    s->stats.kv_blocks_total = eng_kv_blocks_total(s->kv);
    if (o.draft != NULL && (rc = draft_new(s, err, errlen)) != ENG_OK) goto fail;
    *out = s;
    return ENG_OK;
fail:
    eng_sched_free(s);
    return rc;
}

#define WARMUP_TOKENS 8

eng_status eng_sched_warmup(eng_sched *s, char *err, size_t errlen)
{
    /* A prefill of n tokens and one decode step: n no more than a step's
     * prompt rows (the workspace's size), and n + 1 positions within the
     * context and the pool. A pool or context too small for two positions
     * (a test's) gets no warm-up: it is a matter of speed, not of
     * serving. */
    size_t n = WARMUP_TOKENS, room = eng_kv_blocks_free(s->kv) * eng_kv_block_len(s->kv);
    if (n > s->o.step_tokens) n = s->o.step_tokens;
    if (n + 1 > s->m->cfg.n_ctx) n = s->m->cfg.n_ctx - 1;
    if (n + 1 > room) n = room > 0 ? room - 1 : 0;
    if (n == 0) return ENG_OK;
    eng_seq seq = {0};
    eng_status rc = eng_kv_reserve(s->kv, &seq, n + 1);
    if (rc != ENG_OK)
        return ERRBUF_FAIL(err, errlen, rc, "the KV pool cannot hold a %zu-position warm-up",
                           n + 1);
    int32_t toks[WARMUP_TOKENS];
    for (size_t i = 0; i < n; i++) toks[i] = (int32_t)(i * 997 % s->m->cfg.n_vocab);
    eng_item it = {
        .seq = &seq, .tokens = toks, .n = n, .want = ENG_LOGITS_LAST, .logits = s->logits};
    rc = eng_forward(s->m, s->kv, s->ws, &it, 1, err, errlen);
    if (rc == ENG_OK) {
        it.n = 1; /* a decode step: the one-row kernels */
        rc = eng_forward(s->m, s->kv, s->ws, &it, 1, err, errlen);
    }
    eng_kv_release(s->kv, &seq);
    if (rc == ENG_OK && s->dkv != NULL) { /* the draft model's pages and threads too */
        eng_seq dseq = {0};
        if (eng_kv_reserve(s->dkv, &dseq, n + 1) == ENG_OK) {
            it = (eng_item){.seq = &dseq,
                            .tokens = toks,
                            .n = n,
                            .want = ENG_LOGITS_LAST,
                            .logits = s->dlogits};
            rc = eng_forward(s->o.draft, s->dkv, s->dws, &it, 1, err, errlen);
            eng_kv_release(s->dkv, &dseq);
        }
        eng_workspace_times_clear(s->dws);
    }
    eng_workspace_times_clear(s->ws);
    return rc;
}

eng_kv *sch_kv(eng_sched *s)
{
    return s->kv;
}

void eng_sched_free(eng_sched *s)
{
    if (s == NULL) return;
    for (size_t i = 0; i < s->nrunning; i++) sch_seq_free(s, s->running[i]);
    for (size_t i = 0; i < s->qlen; i++) sch_seq_free(s, s->queue[(s->qhead + i) % s->o.max_queue]);
    eng_workspace_free(s->ws);
    draft_free(s);
    eng_kv_free(s->kv);
    free(s->running);
    free(s->queue);
    free(s->items);
    free(s->step_seqs);
    free(s->logits);
    free(s->results);
    for (size_t t = 0; s->thr != NULL && t < s->nthreads; t++) samp_thread_fini(&s->thr[t]);
    free(s->thr);
    free(s->units);
    free(s);
}

/* 1 if a and b are of one group (eng_request.group; 0: each alone). */
static int same_group(const sch_seq *a, const sch_seq *b)
{
    return a == b
           || (a->req.group != 0 && a->req.tenant == b->req.tenant && a->req.group == b->req.group);
}

/* A new waiting sequence's stamps: those its tenant's (group's) waiting
 * sequences carry, or the latest admission among its running ones, or 0
 * (a tenant with nothing in the scheduler was served longest ago). */
static void inherit_stamps(const eng_sched *s, sch_seq *q)
{
    int tenant_known = 0, group_known = 0;
    for (size_t i = 0; i < s->qlen; i++) {
        const sch_seq *w = s->queue[(s->qhead + i) % s->o.max_queue];
        if (w->req.tenant != q->req.tenant) continue;
        q->tenant_stamp = w->tenant_stamp;
        tenant_known = 1;
        if (same_group(w, q)) {
            q->group_stamp = w->group_stamp;
            group_known = 1;
        }
    }
    for (size_t i = 0; i < s->nrunning; i++) {
        const sch_seq *a = s->running[i];
        if (a->req.tenant != q->req.tenant) continue;
        if (!tenant_known && a->admitted > q->tenant_stamp) q->tenant_stamp = a->admitted;
        if (!group_known && same_group(a, q) && a->admitted > q->group_stamp)
            q->group_stamp = a->admitted;
    }
}

eng_status eng_sched_submit(eng_sched *s, const eng_request *r, uint64_t *id, char *err,
                            size_t errlen)
{
    const eng_config *c = &s->m->cfg;
    if (r->nprompt == 0 || r->prompt == NULL)
        return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "the prompt has no tokens");
    if (r->on_event == NULL) return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "no event callback");
    for (size_t i = 0; i < r->nprompt; i++)
        if (r->prompt[i] < 0 || (size_t)r->prompt[i] >= c->n_vocab)
            return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "prompt token %d is not in 0..%zu",
                               r->prompt[i], c->n_vocab - 1);
    for (size_t i = 0; i < r->sampling.nbias; i++)
        if (r->sampling.bias[i].token < 0 || (size_t)r->sampling.bias[i].token >= c->n_vocab)
            return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "logit_bias token %d is not in 0..%zu",
                               r->sampling.bias[i].token, c->n_vocab - 1);
    if (r->logprobs > ENG_MAX_TOP)
        return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "logprobs %d is over %d", r->logprobs,
                           ENG_MAX_TOP);
    if (r->speculative_tokens > ENG_SPEC_MAX)
        return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "speculative_tokens %zu is over %d",
                           r->speculative_tokens, ENG_SPEC_MAX);
    if ((unsigned)r->drafter >= ENG_DRAFTERS)
        return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "drafter %d is not one", (int)r->drafter);
    if (r->drafter == ENG_DRAFT_MODEL && r->speculative_tokens > 0 && s->dkv == NULL)
        return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "no draft model is loaded");
    for (size_t i = 0; i < r->nprediction; i++)
        if (r->prediction[i] < 0 || (size_t)r->prediction[i] >= c->n_vocab)
            return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "prediction token %d is not in 0..%zu",
                               r->prediction[i], c->n_vocab - 1);
    const eng_mask_ops *mo = r->mask.ops;
    if (mo != NULL
        && (mo->allowed == NULL || mo->accept == NULL || mo->accepting == NULL || mo->error == NULL
            || mo->free == NULL))
        return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "a mask provider lacks one of its operations");
    if (mo != NULL && r->mask.n_vocab != c->n_vocab)
        return ERRBUF_FAIL(err, errlen, ENG_EINVAL,
                           "a mask needs the model's vocabulary (%zu tokens, not %zu)", c->n_vocab,
                           r->mask.n_vocab);
    if (r->embed && (r->max_tokens != 0 || r->echo || r->logprobs >= 0 || mo != NULL))
        return ERRBUF_FAIL(err, errlen, ENG_EINVAL,
                           "an embedding request generates nothing: max_tokens 0, no echo, no "
                           "logprobs, no mask");
    if (r->adapter != NULL
        && (r->adapter->n_layer != c->n_layer || r->adapter->n_embd != c->n_embd))
        return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "the adapter was made for another model");
    size_t total = r->nprompt + r->max_tokens;
    if (r->nprompt > c->n_ctx || r->max_tokens > c->n_ctx || total > c->n_ctx)
        return ERRBUF_FAIL(
            err, errlen, ENG_ETOOBIG,
            "the prompt (%zu tokens) plus max_tokens (%zu) exceed the context of %zu", r->nprompt,
            r->max_tokens, c->n_ctx);
    size_t blocks = (total + s->o.block_len - 1) / s->o.block_len;
    if (blocks > eng_kv_blocks_total(s->kv))
        return ERRBUF_FAIL(err, errlen, ENG_ETOOBIG,
                           "the request needs %zu KV blocks; the pool has %zu", blocks,
                           eng_kv_blocks_total(s->kv));
    if (s->qlen >= s->qlimit)
        return ERRBUF_FAIL(err, errlen, ENG_EFULL, "the wait queue is full (%zu requests)",
                           s->qlimit);
    size_t nphash = s->o.prefix_cache ? r->nprompt / s->o.block_len : 0;
    sch_seq *q = calloc(1, sizeof *q);
    int32_t *tokens = malloc(total * sizeof *tokens);
    eng_bias *bias = r->sampling.nbias ? malloc(r->sampling.nbias * sizeof *bias) : NULL;
    uint64_t *phash = nphash ? malloc(nphash * sizeof *phash) : NULL;
    int keep_lp = s->o.prefix_cache && r->echo;
    kv_lp *plp = keep_lp ? calloc(r->nprompt, sizeof *plp) : NULL;
    float *embed = r->embed ? calloc(c->n_embd, sizeof *embed) : NULL;
    size_t npred = r->speculative_tokens > 0 ? r->nprediction : 0;
    int32_t *pred = npred ? malloc(npred * sizeof *pred) : NULL;
    if (q == NULL || tokens == NULL || (r->sampling.nbias && bias == NULL)
        || (nphash && phash == NULL) || (keep_lp && plp == NULL) || (r->embed && embed == NULL)
        || (npred && pred == NULL)) {
        free(pred);
        free(q);
        free(tokens);
        free(bias);
        free(phash);
        free(plp);
        free(embed);
        return ERRBUF_FAIL(err, errlen, ENG_ENOMEM, "out of memory");
    }
    q->kv.salt = r->cache_salt;
    q->kv.lora = r->adapter != NULL ? eng_adapter_key(r->adapter) : 0;
    for (size_t b = 0; b < nphash; b++)
        phash[b] = kv_hash(s->kv, b > 0 ? phash[b - 1] : kv_hash_root(q->kv.salt, q->kv.lora),
                           r->prompt + b * s->o.block_len);
    q->phash = phash;
    q->plp = plp;
    q->nplp = 1; /* the first prompt token has no logprob */
    /* An embedding takes no cached blocks (every position's row is in its
     * mean); it registers its own for others. */
    q->maxhit = s->o.prefix_cache && !r->embed ? (r->nprompt - 1) / s->o.block_len : 0;
    q->embed = embed;
    memcpy(tokens, r->prompt, r->nprompt * sizeof *tokens);
    if (bias) memcpy(bias, r->sampling.bias, r->sampling.nbias * sizeof *bias);
    q->id = s->next_id++;
    q->req = *r;
    q->req.prompt = tokens;
    q->req.sampling.bias = bias;
    /* q->req.mask: the sequence owns the mask from here (sch_seq_free) */
    q->tokens = tokens;
    q->ntokens = r->nprompt;
    if (npred) memcpy(pred, r->prediction, npred * sizeof *pred);
    q->pred = pred;
    q->npred = npred;
    q->req.prediction = pred;
    q->req.nprediction = npred;
    q->spec_k = r->speculative_tokens;
    eng_adapter_ref(r->adapter); /* dropped by sch_seq_free */
    eng_rng_seed(&q->rng, r->seed);
    inherit_stamps(s, q);
    s->queue[(s->qhead + s->qlen) % s->o.max_queue] = q;
    s->qlen++;
    *id = q->id;
    return ENG_OK;
}

/* The i-th waiting sequence (0: the earliest). */
static sch_seq **queue_at(const eng_sched *s, size_t i)
{
    return &s->queue[(s->qhead + i) % s->o.max_queue];
}

/* Takes the i-th waiting sequence out of the queue, the order of the
 * others kept. */
static void queue_remove(eng_sched *s, size_t i)
{
    for (size_t k = i; k + 1 < s->qlen; k++) *queue_at(s, k) = *queue_at(s, k + 1);
    s->qlen--;
}

void eng_sched_cancel(eng_sched *s, uint64_t id)
{
    for (size_t i = 0; i < s->qlen; i++) {
        sch_seq *q = *queue_at(s, i);
        if (q->id != id) continue;
        queue_remove(s, i);
        sch_finish(s, q, ENG_FINISH_CANCELLED, NULL);
        return;
    }
    for (size_t i = 0; i < s->nrunning; i++) {
        sch_seq *q = s->running[i];
        if (q->id != id) continue;
        if (q->in_step) {
            q->cancelled = 1; /* retired by eng_sched_complete */
            return;
        }
        sch_running_remove(s, q);
        sch_finish(s, q, ENG_FINISH_CANCELLED, NULL);
        return;
    }
}

eng_status eng_sched_set_max_queue(eng_sched *s, size_t max_queue, char *err, size_t errlen)
{
    if (max_queue == 0) max_queue = 256; /* as eng_sched_new */
    if (max_queue > s->o.max_queue) {    /* a larger ring, in queue order */
        sch_seq **ring = calloc(max_queue, sizeof *ring);
        if (ring == NULL) return ERRBUF_FAIL(err, errlen, ENG_ENOMEM, "out of memory");
        for (size_t i = 0; i < s->qlen; i++) ring[i] = s->queue[(s->qhead + i) % s->o.max_queue];
        free(s->queue);
        s->queue = ring;
        s->qhead = 0;
        s->o.max_queue = max_queue;
    }
    s->qlimit = max_queue; /* a smaller bound keeps the ring; who waits stays */
    return ENG_OK;
}

void eng_sched_pause(eng_sched *s, uint64_t id, int paused)
{
    for (size_t i = 0; i < s->qlen; i++) {
        sch_seq *q = s->queue[(s->qhead + i) % s->o.max_queue];
        if (q->id == id) q->paused = paused != 0;
    }
    for (size_t i = 0; i < s->nrunning; i++)
        if (s->running[i]->id == id) s->running[i]->paused = paused != 0;
}

int eng_sched_waiting(const eng_sched *s, uint64_t id)
{
    for (size_t i = 0; i < s->qlen; i++)
        if (s->queue[(s->qhead + i) % s->o.max_queue]->id == id) return 1;
    return 0;
}

/* q's prompt gained `blocks` cached blocks at its front. */
static void took_cached(eng_sched *s, sch_seq *q, size_t blocks)
{
    if (blocks == 0) return;
    q->nhashed += blocks;
    q->chain = q->phash[q->nhashed - 1];
    q->prefilled = q->kv.len;
    q->cached += blocks * s->o.block_len;
    s->stats.prefix_hit_tokens += blocks * s->o.block_len;
}

/* 1 if sequence a (prefilling) will compute q's prompt block b: the same
 * tokens after the same prefix (chain hash) in the same partition (salt:
 * another's would not be taken, and waiting for it would time it), with
 * logprobs if q needs them
 * (echo). A paused sequence computes nothing until its client reads again
 * (eng_sched_pause), maybe never: others do not wait for it. */
static int computes_block(const sch_seq *a, const sch_seq *q, size_t b, size_t bl)
{
    return !a->paused && a->prefilled < a->req.nprompt && a->kv.len < (b + 1) * bl
           && a->req.nprompt >= (b + 1) * bl && a->kv.salt == q->kv.salt && a->kv.lora == q->kv.lora
           && a->phash[b] == q->phash[b] && (q->plp == NULL || a->plp != NULL);
}

/* 1 if an earlier running sequence is computing the prompt block that
 * running[i] would compute next (for echo, or the one after it, whose first
 * logprob echo needs to take a block): running[i] then waits a step and
 * takes it from the cache. The earlier one never waits for a later one, so
 * every wait ends. */
static int waits_for_earlier(const eng_sched *s, size_t i)
{
    const sch_seq *q = s->running[i];
    size_t bl = s->o.block_len, b = q->kv.len / bl;
    if (q->kv.len % bl != 0 || b >= q->maxhit) return 0;
    int two = q->plp != NULL && b + 1 < q->maxhit;
    for (size_t j = 0; j < i; j++) {
        const sch_seq *a = s->running[j];
        if (computes_block(a, q, b, bl) || (two && computes_block(a, q, b + 1, bl))) return 1;
    }
    return 0;
}

/* Counts, for every waiting sequence, the running sequences of its tenant
 * and of its group: O(waiting x running), once a plan that has a free
 * slot; admissions then update the counts in O(waiting). */
static void count_held(eng_sched *s)
{
    for (size_t i = 0; i < s->qlen; i++) {
        sch_seq *q = *queue_at(s, i);
        q->held_tenant = q->held_group = 0;
        for (size_t j = 0; j < s->nrunning; j++) {
            const sch_seq *a = s->running[j];
            if (a->req.tenant != q->req.tenant) continue;
            q->held_tenant++;
            if (same_group(a, q)) q->held_group++;
        }
    }
}

/* 1 if a tenant (group) holding `held` running sequences, last served at
 * admission `stamp`, goes before one holding held2, last served at stamp2:
 * fewer running first, then the one served longer ago (round robin). */
static int goes_before(size_t held, uint64_t stamp, size_t held2, uint64_t stamp2)
{
    return held != held2 ? held < held2 : stamp < stamp2;
}

/* The waiting sequence (its queue index) that the next free slot goes to,
 * or SIZE_MAX when no one may take one: the tenant that holds the fewest
 * running sequences (below max_running), then the one served longest ago,
 * then the earliest; within it the group by the same rules; within the
 * group the earliest. Every waiting sequence of a tenant (group) carries
 * the same counts and stamps, so a strict comparison in queue order keeps
 * the earliest on a tie, and the last rule needs no code. */
static size_t fair_next(const eng_sched *s)
{
    if (s->nrunning >= s->slots) return SIZE_MAX;
    size_t pick = SIZE_MAX;
    for (size_t i = 0; i < s->qlen; i++) {
        const sch_seq *q = *queue_at(s, i), *p = pick == SIZE_MAX ? NULL : *queue_at(s, pick);
        if (q->held_tenant >= s->o.max_running) continue;
        if (p == NULL
            || goes_before(q->held_tenant, q->tenant_stamp, p->held_tenant, p->tenant_stamp))
            pick = i;
    }
    if (pick == SIZE_MAX) return SIZE_MAX;
    uint64_t tenant = (*queue_at(s, pick))->req.tenant;
    for (size_t i = pick + 1; i < s->qlen; i++) {
        const sch_seq *q = *queue_at(s, i), *p = *queue_at(s, pick);
        if (q->req.tenant == tenant
            && goes_before(q->held_group, q->group_stamp, p->held_group, p->group_stamp))
            pick = i;
    }
    return pick;
}

int eng_sched_plan(eng_sched *s)
{
    if (s->planned) return 1;
    /* Admission in the fair order (fair_next): the one chosen waits until
     * its blocks fit (no overtaking, so a large request is never starved by
     * small ones). With the prefix cache only the blocks past its cached
     * prefix are new, and cached blocks nobody holds count as free. */
    if (s->qlen > 0 && s->nrunning < s->slots) count_held(s);
    while (s->qlen > 0) {
        size_t at = fair_next(s);
        if (at == SIZE_MAX) break;
        sch_seq *q = *queue_at(s, at);
        size_t positions = q->req.nprompt + q->req.max_tokens, hit = 0;
        eng_status rc = s->o.prefix_cache ? kv_admit(s->kv, &q->kv, q->tokens, q->phash, q->maxhit,
                                                     positions, q->plp, &hit)
                                          : eng_kv_reserve(s->kv, &q->kv, positions);
        if (rc != ENG_OK) break;
        if (q->maxhit > 0) s->stats.prefix_lookups++;
        took_cached(s, q, hit);
        if (q->plp != NULL && hit > 0) q->nplp = q->kv.len + 1; /* and one more */
        queue_remove(s, at);
        q->admitted = ++s->admissions;
        s->running[s->nrunning++] = q;
        for (size_t i = 0; i < s->qlen; i++) {
            sch_seq *w = *queue_at(s, i);
            if (w->req.tenant != q->req.tenant) continue;
            w->held_tenant++;
            w->tenant_stamp = q->admitted;
            if (!same_group(w, q)) continue;
            w->held_group++;
            w->group_stamp = q->admitted;
        }
    }
    /* The batch: a decode row for every running sequence, then prompt
     * chunks within the budget. Decode rows do not take from the budget:
     * if they did, a prompt that fits the budget would leave its last few
     * tokens, and its first token, to the next step (a whole step later). */
    size_t budget = s->o.step_tokens, logit_rows = 0, echo_rows = 0;
    size_t embed_budget = SIZE_MAX; /* set once the decode rows are known */
    s->nitems = 0;
    s->rows = 0;
    /* Speculation only in a step of few decoding sequences (memory-bound:
     * reading the weights once for several positions is what it saves);
     * the drafted rows come out of the prompt budget and SPEC_ROWS. */
    size_t decoders = 0, spec_rows = 0;
    for (size_t i = 0; i < s->nrunning; i++)
        decoders +=
            !s->running[i]->paused && s->running[i]->prefilled == s->running[i]->req.nprompt;
    if (decoders <= s->o.spec_max_batch) spec_rows = SPEC_ROWS;
    s->draft_rows_left = DRAFT_ROWS;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && s->nitems > 0)
            embed_budget = s->nitems * 4 > s->o.embed_tokens_beside_decode
                               ? s->nitems * 4
                               : s->o.embed_tokens_beside_decode;
        for (size_t i = 0; i < s->nrunning; i++) {
            sch_seq *q = s->running[i];
            int decoding = q->prefilled == q->req.nprompt;
            if (q->paused) continue;
            if (decoding != (pass == 0) || (!decoding && budget == 0)) continue;
            if (!decoding && q->maxhit > 0) {
                /* Blocks cached since the last step (a sibling's prefill). */
                size_t g = kv_extend(s->kv, &q->kv, q->tokens, q->phash, q->maxhit, q->plp);
                took_cached(s, q, g);
                if (q->plp != NULL && g > 0) q->nplp = q->kv.len + 1;
                if (waits_for_earlier(s, i)) continue;
            }
            size_t n;
            q->step_draft = 0;
            q->draft_feed = 0;
            if (decoding) {
                q->step_first = q->ntokens - 1;
                /* Drafted rows: SPEC_ROWS a step beside the budget (the
                 * workspace and the logits have room for them), so a
                 * draft never delays a prompt. */
                size_t d = spec_rows > 0 ? spec_propose(s, q, spec_rows) : 0;
                spec_rows -= d;
                n = 1 + d;
            } else {
                q->step_first = q->prefilled;
                n = q->req.nprompt - q->prefilled;
                if (n > budget) n = budget;
                if (q->req.echo) {
                    if (echo_rows + n > ECHO_ROWS) n = ECHO_ROWS - echo_rows;
                    if (n == 0) continue;
                }
                if (q->req.embed) {
                    if (n > embed_budget) n = embed_budget;
                    if (n == 0) continue;
                    embed_budget -= n;
                }
            }
            q->step_n = n;
            q->step_samples =
                q->req.max_tokens > 0 && (decoding || q->prefilled + n == q->req.nprompt);
            eng_logits want = (q->req.echo && !decoding) || q->step_draft > 0 ? ENG_LOGITS_ALL
                              : q->step_samples                               ? ENG_LOGITS_LAST
                                                                              : ENG_LOGITS_NONE;
            size_t lrows = want == ENG_LOGITS_ALL ? n : want == ENG_LOGITS_LAST ? 1 : 0;
            if (want == ENG_LOGITS_ALL && !decoding) echo_rows += n; /* a draft's: SPEC_ROWS */
            s->items[s->nitems] = (eng_item){.seq = &q->kv,
                                             .tokens = q->tokens + q->step_first,
                                             .n = n,
                                             .want = want,
                                             .logits = s->logits + logit_rows * s->m->cfg.n_vocab,
                                             .hidden_sum = decoding ? NULL : q->embed,
                                             .adapter = q->req.adapter};
            s->step_seqs[s->nitems++] = q;
            logit_rows += lrows;
            if (!decoding) budget -= n;
            s->rows += n;
            q->in_step = 1;
        }
    }
    s->planned = s->nitems > 0;
    return s->planned;
}

void eng_sched_stats_get(const eng_sched *s, eng_sched_stats *out)
{
    *out = s->stats;
    out->running = s->nrunning;
    out->queued = s->qlen;
    out->kv_blocks_total = eng_kv_blocks_total(s->kv);
    out->kv_blocks_used = out->kv_blocks_total - eng_kv_blocks_free(s->kv);
    out->prefix_evictions = s->kv->evictions;
    out->kv_blocks_cached = s->kv->nregistered;
}
