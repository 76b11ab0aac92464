/*
 * engine/scheduler.c: continuous batching over the paged KV cache.
 *
 * Life of a request: submit -> waiting (bounded FIFO) -> admitted when the
 * blocks for prompt + max_tokens are reserved (all or nothing) -> running:
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
#include "tokenizer.h" /* BPE_EOT only: a header edge, no link (docs/architecture.md) */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Rows of prompt logits (echo) per step: bounds the logits buffer. */
#define ECHO_ROWS 64

typedef struct {
    uint64_t id;
    eng_request req; /* prompt and bias point into the owned copies */
    int32_t *tokens; /* prompt then generated; capacity nprompt + max_tokens */
    size_t ntokens;
    size_t generated;
    size_t prefilled; /* prompt tokens in the cache */
    eng_seq kv;
    /* The prefix cache (prefix_cache on). */
    uint64_t *phash; /* chain hash of each full prompt block (nprompt / block_len) */
    size_t maxhit;   /* prompt blocks a hit may cover: not the last token's */
    size_t nhashed;  /* leading blocks registered, so read-only */
    uint64_t chain;  /* chain hash of block nhashed - 1 */
    size_t cached;   /* prompt tokens taken from the cache */
    kv_lp *plp;      /* echo: prompt logprobs by position ([0] unused), or NULL */
    size_t nplp;     /* echo: positions [0, nplp) are known */
    size_t lp_sent;  /* echo: positions 1..lp_sent delivered */
    eng_rng rng;
    int cancelled;
    int paused; /* eng_sched_pause: no rows until resumed */
    int in_step;
    /* This step. */
    size_t step_first, step_n; /* rows [first, first + n) of the prompt or the last token */
    int step_samples;
    size_t step_result, step_nresults; /* into s->results */
} sch_seq;

/* One row to sample from, or one echoed prompt position's logprobs: the
 * step's item, the row of its logits (SAMPLE_ROW: the sampled last row)
 * and the result it fills. */
#define SAMPLE_ROW SIZE_MAX
typedef struct {
    size_t item, row, result;
} samp_unit;

struct eng_sched {
    const eng_model *m;
    eng_sched_opts o;
    eng_kv *kv;
    eng_workspace *ws;
    uint64_t next_id;
    sch_seq **running;
    size_t nrunning;
    sch_seq **queue; /* ring of o.max_queue entries */
    size_t qhead, qlen;
    size_t qlimit; /* waiting requests before ENG_EFULL (<= o.max_queue) */
    /* The planned step. */
    int planned, executed;
    eng_item *items;
    sch_seq **step_seqs;
    size_t nitems, rows;
    float *logits; /* logit_rows x V */
    size_t logit_rows;
    eng_event *results; /* logit_rows */
    size_t nresults;
    eng_status step_rc;
    char step_err[256];
    /* Sampling (execute), on the step's worker threads: the units of this
     * step, and each thread's scratch. */
    samp_unit *units; /* logit_rows */
    size_t nthreads;
    samp_thread *thr; /* nthreads */
    /* What execute measured (its thread's), folded into stats by complete:
     * stats is the loop thread's, read by eng_sched_stats_get at any time,
     * also while a step runs. */
    double exec_seconds, exec_sample;
    eng_sched_stats stats;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

eng_status eng_sched_new(const eng_model *m, const eng_sched_opts *opts, eng_sched **out, char *err,
                         size_t errlen)
{
    *out = NULL;
    eng_sched_opts o = *opts;
    if (o.block_len == 0) o.block_len = 16;
    if (o.max_running == 0) o.max_running = 64;
    if (o.max_queue == 0) o.max_queue = 256;
    if (o.step_tokens == 0) o.step_tokens = 512;
    eng_sched *s = calloc(1, sizeof *s);
    if (s == NULL) return ERRBUF_FAIL(err, errlen, ENG_ENOMEM, "out of memory");
    s->m = m;
    s->o = o;
    s->next_id = 1;
    size_t V = m->cfg.n_vocab;
    eng_status rc = eng_kv_new(m, o.kv_bytes, o.block_len, &s->kv, err, errlen);
    if (rc != ENG_OK) goto fail;
    /* Prompt rows within the budget plus one decode row per running
     * sequence on top. */
    rc = eng_workspace_new(m, o.step_tokens + o.max_running, o.threads, &s->ws);
    if (rc != ENG_OK) {
        errbuf_set(err, errlen, "cannot allocate the step workspace");
        goto fail;
    }
    s->logit_rows = o.max_running + ECHO_ROWS;
    s->running = calloc(o.max_running, sizeof *s->running);
    s->queue = calloc(o.max_queue, sizeof *s->queue);
    s->qlimit = o.max_queue;
    s->items = calloc(o.max_running, sizeof *s->items);
    s->step_seqs = calloc(o.max_running, sizeof *s->step_seqs);
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
    eng_workspace_times_clear(s->ws);
    return rc;
}

eng_kv *sch_kv(eng_sched *s)
{
    return s->kv;
}

static void seq_free(eng_sched *s, sch_seq *q)
{
    eng_kv_release(s->kv, &q->kv);
    free(q->phash);
    free(q->plp);
    free(q->tokens);
    free((void *)q->req.sampling.bias);
    free(q);
}

void eng_sched_free(eng_sched *s)
{
    if (s == NULL) return;
    for (size_t i = 0; i < s->nrunning; i++) seq_free(s, s->running[i]);
    for (size_t i = 0; i < s->qlen; i++) seq_free(s, s->queue[(s->qhead + i) % s->o.max_queue]);
    eng_workspace_free(s->ws);
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
    if (q == NULL || tokens == NULL || (r->sampling.nbias && bias == NULL)
        || (nphash && phash == NULL) || (keep_lp && plp == NULL)) {
        free(q);
        free(tokens);
        free(bias);
        free(phash);
        free(plp);
        return ERRBUF_FAIL(err, errlen, ENG_ENOMEM, "out of memory");
    }
    q->kv.salt = r->cache_salt;
    for (size_t b = 0; b < nphash; b++)
        phash[b] = kv_hash(s->kv, b > 0 ? phash[b - 1] : kv_hash_root(r->cache_salt),
                           r->prompt + b * s->o.block_len);
    q->phash = phash;
    q->plp = plp;
    q->nplp = 1; /* the first prompt token has no logprob */
    q->maxhit = s->o.prefix_cache ? (r->nprompt - 1) / s->o.block_len : 0;
    memcpy(tokens, r->prompt, r->nprompt * sizeof *tokens);
    if (bias) memcpy(bias, r->sampling.bias, r->sampling.nbias * sizeof *bias);
    q->id = s->next_id++;
    q->req = *r;
    q->req.prompt = tokens;
    q->req.sampling.bias = bias;
    q->tokens = tokens;
    q->ntokens = r->nprompt;
    eng_rng_seed(&q->rng, r->seed);
    s->queue[(s->qhead + s->qlen) % s->o.max_queue] = q;
    s->qlen++;
    *id = q->id;
    return ENG_OK;
}

/* Removes q from the running set (order kept: admission order). */
static void running_remove(eng_sched *s, sch_seq *q)
{
    for (size_t i = 0; i < s->nrunning; i++)
        if (s->running[i] == q) {
            memmove(s->running + i, s->running + i + 1, (s->nrunning - i - 1) * sizeof *s->running);
            s->nrunning--;
            return;
        }
}

static void finish(eng_sched *s, sch_seq *q, eng_finish why, const char *message)
{
    eng_event ev = {.kind = ENG_EV_DONE,
                    .id = q->id,
                    .finish = why,
                    .message = message,
                    .index = q->generated,
                    .cached = q->cached};
    eng_event_cb cb = q->req.on_event;
    void *user = q->req.user;
    seq_free(s, q);
    cb(user, &ev);
}

void eng_sched_cancel(eng_sched *s, uint64_t id)
{
    for (size_t i = 0; i < s->qlen; i++) {
        size_t at = (s->qhead + i) % s->o.max_queue;
        sch_seq *q = s->queue[at];
        if (q->id != id) continue;
        for (size_t k = i; k + 1 < s->qlen; k++)
            s->queue[(s->qhead + k) % s->o.max_queue] =
                s->queue[(s->qhead + k + 1) % s->o.max_queue];
        s->qlen--;
        finish(s, q, ENG_FINISH_CANCELLED, NULL);
        return;
    }
    for (size_t i = 0; i < s->nrunning; i++) {
        sch_seq *q = s->running[i];
        if (q->id != id) continue;
        if (q->in_step) {
            q->cancelled = 1; /* retired by eng_sched_complete */
            return;
        }
        running_remove(s, q);
        finish(s, q, ENG_FINISH_CANCELLED, NULL);
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
           && a->req.nprompt >= (b + 1) * bl && a->kv.salt == q->kv.salt
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

int eng_sched_plan(eng_sched *s)
{
    if (s->planned) return 1;
    /* Admission, FIFO: the head waits until its blocks fit (no overtaking,
     * so a large request is never starved by small ones). With the prefix
     * cache only the blocks past its cached prefix are new, and cached
     * blocks nobody holds count as free. */
    while (s->qlen > 0 && s->nrunning < s->o.max_running) {
        sch_seq *q = s->queue[s->qhead];
        size_t positions = q->req.nprompt + q->req.max_tokens, hit = 0;
        eng_status rc = s->o.prefix_cache ? kv_admit(s->kv, &q->kv, q->tokens, q->phash, q->maxhit,
                                                     positions, q->plp, &hit)
                                          : eng_kv_reserve(s->kv, &q->kv, positions);
        if (rc != ENG_OK) break;
        if (q->maxhit > 0) s->stats.prefix_lookups++;
        took_cached(s, q, hit);
        if (q->plp != NULL && hit > 0) q->nplp = q->kv.len + 1; /* and one more */
        s->qhead = (s->qhead + 1) % s->o.max_queue;
        s->qlen--;
        s->running[s->nrunning++] = q;
    }
    /* The batch: a decode row for every running sequence, then prompt
     * chunks within the budget. Decode rows do not take from the budget:
     * if they did, a prompt that fits the budget would leave its last few
     * tokens, and its first token, to the next step (a whole step later). */
    size_t budget = s->o.step_tokens, logit_rows = 0, echo_rows = 0;
    s->nitems = 0;
    s->rows = 0;
    for (int pass = 0; pass < 2; pass++) {
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
            if (decoding) {
                q->step_first = q->ntokens - 1;
                n = 1;
            } else {
                q->step_first = q->prefilled;
                n = q->req.nprompt - q->prefilled;
                if (n > budget) n = budget;
                if (q->req.echo) {
                    if (echo_rows + n > ECHO_ROWS) n = ECHO_ROWS - echo_rows;
                    if (n == 0) continue;
                }
            }
            q->step_n = n;
            q->step_samples =
                q->req.max_tokens > 0 && (decoding || q->prefilled + n == q->req.nprompt);
            eng_logits want = q->req.echo && !decoding ? ENG_LOGITS_ALL
                              : q->step_samples        ? ENG_LOGITS_LAST
                                                       : ENG_LOGITS_NONE;
            size_t lrows = want == ENG_LOGITS_ALL ? n : want == ENG_LOGITS_LAST ? 1 : 0;
            if (want == ENG_LOGITS_ALL) echo_rows += n;
            s->items[s->nitems] = (eng_item){.seq = &q->kv,
                                             .tokens = q->tokens + q->step_first,
                                             .n = n,
                                             .want = want,
                                             .logits = s->logits + logit_rows * s->m->cfg.n_vocab};
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

/* One unit of a step's sampling, on worker thread tid. */
static void sample_unit(eng_sched *s, const samp_unit *u, size_t tid)
{
    size_t V = s->m->cfg.n_vocab;
    sch_seq *q = s->step_seqs[u->item];
    const eng_item *it = &s->items[u->item];
    eng_event *ev = &s->results[u->result];
    if (u->row != SAMPLE_ROW) { /* echo: row j predicts prompt token step_first + j + 1 */
        /* All ENG_MAX_TOP for the cache; the request gets its first ones. */
        samp_logprobs(ev, it->logits + u->row * V, V, ev->token, ENG_MAX_TOP);
        return;
    }
    float *last = it->logits + (it->want == ENG_LOGITS_ALL ? (it->n - 1) * V : 0);
    samp_seq sq = {.sp = &q->req.sampling,
                   .generated = q->tokens + q->req.nprompt,
                   .ngenerated = q->ntokens > q->req.nprompt ? q->ntokens - q->req.nprompt : 0,
                   .logprobs = q->req.logprobs};
    samp_row(ev, &s->thr[tid], last, V, &sq, &q->rng);
}

static void sample_task(void *arg, size_t begin, size_t end, size_t tid)
{
    eng_sched *s = arg;
    for (size_t i = begin; i < end; i++) sample_unit(s, &s->units[i], tid);
}

void eng_sched_execute(eng_sched *s)
{
    if (!s->planned) return;
    double t0 = now_s();
    s->nresults = 0;
    s->step_rc =
        eng_forward(s->m, s->kv, s->ws, s->items, s->nitems, s->step_err, sizeof s->step_err);
    double t_sample = now_s();
    if (s->step_rc == ENG_OK) {
        /* Every event's slot and header first, in item order; then the
         * sampling and logprobs of all rows at once on the workers. Each
         * unit touches only its own logits row, its own event and its own
         * sequence's random stream, so the split changes no result. */
        size_t nunits = 0;
        for (size_t i = 0; i < s->nitems; i++) {
            sch_seq *q = s->step_seqs[i];
            const eng_item *it = &s->items[i];
            q->step_result = s->nresults;
            for (size_t j = 0; it->want == ENG_LOGITS_ALL && j < it->n; j++) {
                size_t pos = q->step_first + j + 1;
                if (pos >= q->req.nprompt) break;
                s->results[s->nresults] = (eng_event){.kind = ENG_EV_PROMPT_LOGPROB,
                                                      .id = q->id,
                                                      .token = q->tokens[pos],
                                                      .index = pos};
                s->units[nunits++] = (samp_unit){i, j, s->nresults++};
            }
            if (q->step_samples) {
                s->results[s->nresults] =
                    (eng_event){.kind = ENG_EV_TOKEN, .id = q->id, .index = q->generated};
                s->units[nunits++] = (samp_unit){i, SAMPLE_ROW, s->nresults++};
            }
            q->step_nresults = s->nresults - q->step_result;
        }
        op_pool_run(gpt2_workspace_pool(s->ws), nunits, sample_task, s);
    }
    double t1 = now_s();
    s->exec_sample = t1 - t_sample;
    s->exec_seconds = t1 - t0;
    s->executed = 1;
}

/* A prompt logprob event's alternatives, cut to what the request asked. */
static void cut_top(const sch_seq *q, eng_event *ev)
{
    size_t want = q->req.logprobs > 0 ? (size_t)q->req.logprobs : 0;
    if (ev->ntop > want) ev->ntop = want;
}

/* echo: the prompt logprobs this step computed, kept by position for the
 * blocks they belong to. */
static void keep_prompt_lp(eng_sched *s, sch_seq *q)
{
    for (size_t k = 0; q->plp != NULL && k < q->step_nresults; k++) {
        const eng_event *ev = &s->results[q->step_result + k];
        if (ev->kind != ENG_EV_PROMPT_LOGPROB) continue;
        kv_lp *d = &q->plp[ev->index];
        d->logprob = ev->logprob;
        d->ntop = (uint32_t)ev->ntop;
        memcpy(d->top_ids, ev->top_ids, sizeof d->top_ids);
        memcpy(d->top_logprobs, ev->top_logprobs, sizeof d->top_logprobs);
        q->nplp = ev->index + 1;
    }
}

/* echo: the prompt logprobs that came with cached blocks (positions up to
 * the step's first row), delivered before those the step computed, in
 * position order. */
static void deliver_cached_lp(sch_seq *q)
{
    if (q->plp == NULL) return;
    size_t last = q->step_first < q->req.nprompt ? q->step_first : q->req.nprompt - 1;
    for (size_t p = q->lp_sent + 1; p <= last && !q->cancelled; p++) {
        const kv_lp *d = &q->plp[p];
        eng_event ev = {.kind = ENG_EV_PROMPT_LOGPROB,
                        .id = q->id,
                        .token = q->tokens[p],
                        .index = p,
                        .logprob = d->logprob,
                        .ntop = d->ntop};
        memcpy(ev.top_ids, d->top_ids, sizeof ev.top_ids);
        memcpy(ev.top_logprobs, d->top_logprobs, sizeof ev.top_logprobs);
        cut_top(q, &ev);
        q->lp_sent = p;
        q->req.on_event(q->req.user, &ev);
    }
}

void eng_sched_complete(eng_sched *s)
{
    if (!s->planned) return;
    s->planned = 0;
    if (s->executed) {
        double sample = s->stats.times.sample + s->exec_sample;
        eng_workspace_times(s->ws, &s->stats.times); /* the step's thread is done with it */
        s->stats.times.sample = sample;
        s->stats.last_step_seconds = s->exec_seconds;
    }
    s->executed = 0;
    s->stats.steps++;
    s->stats.last_step_rows = s->rows;
    s->stats.last_step_seqs = s->nitems;
    for (size_t i = 0; i < s->nitems; i++) {
        sch_seq *q = s->step_seqs[i];
        /* in_step stays set while its events are delivered, so a cancel from
         * inside a callback only marks it. */
        if (q->cancelled) {
            running_remove(s, q);
            finish(s, q, ENG_FINISH_CANCELLED, NULL);
            continue;
        }
        if (s->step_rc != ENG_OK) {
            running_remove(s, q);
            finish(s, q, ENG_FINISH_ERROR, s->step_err);
            continue;
        }
        if (q->prefilled < q->req.nprompt) {
            q->prefilled += q->step_n;
            s->stats.prompt_computed += q->step_n;
        }
        keep_prompt_lp(s, q);
        /* The full blocks this step completed become findable. */
        if (s->o.prefix_cache)
            kv_commit(s->kv, &q->kv, q->tokens, &q->nhashed, &q->chain, q->plp, q->nplp);
        deliver_cached_lp(q);
        eng_finish why = ENG_FINISH_LENGTH;
        /* max_tokens 0: done once the prompt (and its echo) is through */
        int done = q->req.max_tokens == 0 && q->prefilled == q->req.nprompt;
        for (size_t k = 0; k < q->step_nresults && !q->cancelled; k++) {
            eng_event *ev = &s->results[q->step_result + k];
            if (ev->kind == ENG_EV_PROMPT_LOGPROB) {
                cut_top(q, ev);
                q->lp_sent = ev->index;
            }
            if (ev->kind == ENG_EV_TOKEN) {
                q->tokens[q->ntokens++] = ev->token;
                q->generated++;
                s->stats.tokens_generated++;
                if (ev->token == BPE_EOT && !q->req.ignore_eos) {
                    done = 1;
                    why = ENG_FINISH_EOS;
                } else if (q->generated == q->req.max_tokens) {
                    done = 1;
                }
            }
            q->req.on_event(q->req.user, ev);
            if (q->cancelled) break; /* cancelled from inside the callback */
        }
        if (q->cancelled) {
            running_remove(s, q);
            finish(s, q, ENG_FINISH_CANCELLED, NULL);
        } else if (done) {
            running_remove(s, q);
            finish(s, q, why, NULL);
        } else {
            q->in_step = 0;
        }
    }
    s->nitems = 0;
}

int eng_sched_step(eng_sched *s)
{
    if (!eng_sched_plan(s)) return 0;
    eng_sched_execute(s);
    eng_sched_complete(s);
    return 1;
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
