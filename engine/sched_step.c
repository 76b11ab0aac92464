/*
 * engine/sched_step.c: the second half of a scheduler step (scheduler.c
 * plans it). execute runs on any thread: eng_forward over the planned
 * items, then every row's sampling (and echo's prompt logprobs) at once on
 * the step's workers, each unit touching only its own row, event and
 * random stream. complete runs on the loop thread: it appends the tokens,
 * keeps and delivers prompt logprobs in position order (those of cached
 * blocks first), registers finished prompt blocks with the prefix cache,
 * delivers the events and retires finished sequences.
 */
#include "sched_int.h"
#include "tokenizer.h" /* BPE_EOT only: a header edge, no link (docs/architecture.md) */

#include <string.h>

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
    /* The sampled rows: the last (plain decoding, a prompt's end), or with
     * a draft of d tokens the d + 1 rows of the last token and the draft,
     * drawn in order as plain decoding would draw them one step at a time:
     * row j sees the tokens before it (the accepted draft) as generated,
     * the mask and the random stream advance once a row, and the run stops
     * at the first token that is not the draft's, or that ends the
     * sequence. */
    size_t d = q->step_draft;
    float *rows = it->logits + (it->want == ENG_LOGITS_ALL ? (it->n - 1 - d) * V : 0);
    size_t ngen = q->ntokens > q->req.nprompt ? q->ntokens - q->req.nprompt : 0;
    const eng_mask *mk = &q->req.mask;
    size_t kept = 0;
    for (size_t j = 0; j <= d; j++) {
        eng_event *e = ev + j;
        if (j > 0) *e = (eng_event){.kind = ENG_EV_TOKEN, .id = q->id, .index = ev->index + j};
        samp_seq sq = {.sp = &q->req.sampling,
                       .generated = q->tokens + q->req.nprompt,
                       .ngenerated = ngen + j,
                       .logprobs = q->req.logprobs};
        if (mk->ops != NULL) { /* this sequence's own constraint */
            size_t nallowed = 0;
            sq.allow = mk->ops->allowed(mk->self, &nallowed);
            if (sq.allow == NULL || nallowed == 0) {
                q->mask_stuck = 1;
                q->mask_err = mk->ops->error(mk->self);
                e->token = BPE_EOT;
                break;
            }
        }
        samp_row(e, &s->thr[tid], rows + j * V, V, &sq, &q->rng);
        if (mk->ops != NULL && mk->ops->accept(mk->self, e->token) != 0) {
            q->mask_stuck = 1;
            q->mask_err = mk->ops->error(mk->self);
            break;
        }
        kept = j + 1;
        if (j == d || e->token != q->tokens[q->ntokens + j]) break;
        q->step_accepted++;
        if ((e->token == BPE_EOT && (!q->req.ignore_eos || mk->ops != NULL))
            || q->generated + j + 1 == q->req.max_tokens)
            break;
    }
    if (d > 0) q->step_nresults = kept;
}

static void sample_task(void *arg, size_t begin, size_t end, size_t tid)
{
    eng_sched *s = arg;
    for (size_t i = begin; i < end; i++) sample_unit(s, &s->units[i], tid);
}

void eng_sched_execute(eng_sched *s)
{
    if (!s->planned) return;
    double t0 = sch_now();
    s->nresults = 0;
    /* The draft model's tokens first, where it drafts (a failure there
     * only turns the drafts off: the verify pass decodes plainly). */
    if (s->dkv != NULL && draft_run(s, s->step_err, sizeof s->step_err) != ENG_OK) draft_abandon(s);
    s->step_rc =
        eng_forward(s->m, s->kv, s->ws, s->items, s->nitems, s->step_err, sizeof s->step_err);
    double t_sample = sch_now();
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
                s->units[nunits++] = (samp_unit){i, SAMPLE_ROW, s->nresults};
                s->nresults += 1 + q->step_draft; /* a drafted row's token each */
            }
            q->step_nresults = s->nresults - q->step_result;
        }
        op_pool_run(gpt2_workspace_pool(s->ws), nunits, sample_task, s);
    }
    double t1 = sch_now();
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
    for (size_t i = 0; i < s->nitems; i++)
        if (s->step_seqs[i]->step_draft > 0) {
            s->stats.spec_steps++;
            break;
        }
    for (size_t i = 0; i < s->nitems; i++) {
        sch_seq *q = s->step_seqs[i];
        /* in_step stays set while its events are delivered, so a cancel from
         * inside a callback only marks it. */
        if (q->cancelled) {
            sch_running_remove(s, q);
            sch_finish(s, q, ENG_FINISH_CANCELLED, NULL);
            continue;
        }
        if (s->step_rc != ENG_OK) {
            sch_running_remove(s, q);
            sch_finish(s, q, ENG_FINISH_ERROR, s->step_err);
            continue;
        }
        /* The mask failed at the step's first sampled row; at a later
         * row of a draft, the tokens before it are delivered first (as
         * plain decoding's earlier steps would have), then it ends. */
        int mask_ends = q->mask_err != NULL || q->mask_stuck;
        if (mask_ends && (q->step_draft == 0 || q->step_nresults == 0)) {
            sch_running_remove(s, q);
            if (q->mask_err != NULL) s->stats.mask_errors++; /* an error, never a quiet cut */
            sch_finish(s, q, q->mask_err != NULL ? ENG_FINISH_ERROR : ENG_FINISH_LENGTH,
                       q->mask_err); /* stuck: cut short as max_tokens cuts */
            continue;
        }
        spec_settle(s, q);
        if (q->prefilled < q->req.nprompt) {
            q->prefilled += q->step_n;
            s->stats.prompt_computed += q->step_n;
        }
        keep_prompt_lp(s, q);
        /* The full blocks this step completed become findable (after a
         * draft's verify, once its tokens are delivered: below). */
        if (s->o.prefix_cache && q->step_draft == 0)
            kv_commit(s->kv, &q->kv, q->tokens, &q->nhashed, &q->chain, q->plp, q->nplp);
        deliver_cached_lp(q);
        eng_finish why = ENG_FINISH_LENGTH;
        /* max_tokens 0: done once the prompt (and its echo) is through */
        int done = q->req.max_tokens == 0 && q->prefilled == q->req.nprompt;
        size_t from = q->ntokens;
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
                if (ev->token == BPE_EOT && (!q->req.ignore_eos || q->req.mask.ops != NULL)) {
                    done = 1;
                    why = ENG_FINISH_EOS;
                } else if (q->generated == q->req.max_tokens) {
                    done = 1;
                }
            }
            q->req.on_event(q->req.user, ev);
            if (q->cancelled) break; /* cancelled from inside the callback */
        }
        if (q->step_draft > 0) spec_delivered(s, q, from);
        if (q->cancelled) {
            sch_running_remove(s, q);
            sch_finish(s, q, ENG_FINISH_CANCELLED, NULL);
        } else if (done) {
            sch_running_remove(s, q);
            sch_finish(s, q, why, NULL);
        } else if (mask_ends) {
            sch_running_remove(s, q);
            if (q->mask_err != NULL) s->stats.mask_errors++;
            sch_finish(s, q, q->mask_err != NULL ? ENG_FINISH_ERROR : ENG_FINISH_LENGTH,
                       q->mask_err);
        } else {
            spec_follow(q, from);
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
