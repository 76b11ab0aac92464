/*
 * engine/sched_int.h: the scheduler's state, shared by its five files:
 * scheduler.c (submit, the queue, fair admission, plan: the loop thread's
 * side), sched_step.c (execute: the forward pass and sampling on the
 * step's threads; complete: events and retirement on the loop thread;
 * eng_sched_step, plan + execute + complete), and below both sched_seq.c
 * (one sequence's end), sched_spec.c (speculative decoding's drafts and
 * their settling) and sched_draft.c (the draft model). Calls go one way:
 * sched_step.c -> scheduler.c -> sched_seq.c, both -> sched_spec.c ->
 * sched_draft.c, sched_seq.c -> sched_draft.c. Internal to those five.
 */
#ifndef GPT2D_ENGINE_SCHED_INT_H
#define GPT2D_ENGINE_SCHED_INT_H

#include "internal.h"

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
    float *embed;    /* req.embed: the sum of the prompt's ln_f rows (n_embd) */
    size_t nplp;     /* echo: positions [0, nplp) are known */
    size_t lp_sent;  /* echo: positions 1..lp_sent delivered */
    eng_rng rng;
    int cancelled;
    int paused; /* eng_sched_pause: no rows until resumed */
    /* req.mask (eng_mask): the sequence's own constraint, or none. */
    int mask_stuck;       /* this step: the mask allowed no token */
    const char *mask_err; /* this step: the mask failed (eng_mask_ops.error) */
    int in_step;
    /* Fair admission. Waiting: the running sequences of its tenant and of
     * its group (counted by eng_sched_plan), and the admission number of
     * its tenant's and its group's latest admitted sequence (0: none that
     * still waits or runs), the same in every waiting sequence of one
     * tenant (group). Running: its own admission number. */
    size_t held_tenant, held_group;
    uint64_t tenant_stamp, group_stamp, admitted;
    /* This step. */
    size_t step_first, step_n; /* rows [first, first + n) of the prompt or the last token */
    int step_samples;
    size_t step_result, step_nresults; /* into s->results */
    /* Speculation (sched_spec.c). The drafted tokens of a step sit in
     * tokens[ntokens, ntokens + step_draft), so the step's item is the
     * last token and the draft, and the sampler's penalties read the
     * accepted ones as generated. */
    int32_t *pred; /* the request's prediction (owned), or NULL */
    size_t npred;
    size_t pred_pos;          /* the prediction's next expected token */
    int pred_lost;            /* the output left the prediction, not yet back */
    size_t spec_k;            /* drafted tokens wanted next (adapted) */
    size_t spec_skip;         /* steps to decode plainly after drafts that missed */
    unsigned spec_miss;       /* verify steps in a row that accepted nothing */
    eng_drafter spec_by;      /* this step's drafter */
    size_t step_draft;        /* this step: drafted tokens (0: plain decoding) */
    size_t step_accepted;     /* this step: drafted tokens the sampler drew */
    size_t drafted, accepted; /* the request's totals (DONE) */
    /* The draft model (sched_draft.c): the sequence's blocks in its pool,
     * this step's rows fed to it (0: none), and whether it drafts no more
     * (its pool was full, or a draft step failed). */
    eng_seq dkv;
    size_t draft_feed;
    int draft_off;
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
    uint64_t admissions; /* numbers sch_seq.admitted, from 1 */
    sch_seq **running;   /* slots entries, in admission order */
    size_t nrunning;
    size_t slots;    /* o.max_running + o.tenant_spare */
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
    /* The draft model (o.draft; sched_draft.c), or NULLs: its KV pool and
     * workspace, a round's items, the step's drafting sequences, a row of
     * logits each; the rows its next step may still take (plan). */
    eng_kv *dkv;
    eng_workspace *dws;
    eng_item *ditems;
    sch_seq **dseqs;
    float *dlogits;
    size_t draft_rows_left;
};

/* sched_spec.c, below both halves (and above sched_seq.c). Extra rows of
 * logits a step keeps for drafts (beyond one a sequence). */
#define SPEC_ROWS 64
/* Plan (loop thread): drafts up to `room` tokens for decoding sequence q
 * into q->tokens[q->ntokens...]; returns how many (0: decode plainly). */
size_t spec_propose(eng_sched *s, sch_seq *q, size_t room);
/* Complete (loop thread), before its blocks are committed: the KV
 * positions past the accepted draft rolled back, the statistics counted,
 * the next draft's length adapted. */
void spec_settle(eng_sched *s, sch_seq *q);
/* Complete, once a verified draft's tokens from `from` on were delivered
 * (all, or up to a cancel): the request's accepted count, and the blocks
 * plain decoding would have completed by now committed to the prefix
 * cache. */
void spec_delivered(eng_sched *s, sch_seq *q, size_t from);
/* Complete, after q's tokens from `from` on were appended: the
 * prediction's place follows the output. */
void spec_follow(sch_seq *q, size_t from);

/* sched_draft.c (below sched_spec.c). Rows a draft model's step takes at
 * most for its sequences' catch-up (their first drafted rows included). */
#define DRAFT_ROWS 512
/* eng_sched_new: the draft's pool and workspace, after its checks (the
 * same vocabulary, at least the context); draft_free undoes it. */
eng_status draft_new(eng_sched *s, char *err, size_t errlen);
void draft_free(eng_sched *s);
/* Plan: q drafts k tokens this step if the draft has (or can take within
 * *rows_left) all of q's tokens; otherwise a chunk of them is fed and 0
 * returned. */
size_t draft_plan(eng_sched *s, sch_seq *q, size_t k, size_t *rows_left);
/* Execute, before the verify pass: the draft's rounds, the drafts written
 * after each drafting sequence's last token. On an error draft_abandon
 * turns the step's drafts off (the verify pass goes on without them). */
eng_status draft_run(eng_sched *s, char *err, size_t errlen);
void draft_abandon(eng_sched *s);
/* Complete (spec_settle): the draft's cache rolled back past the
 * accepted drafts. */
void draft_settle(sch_seq *q);
/* sch_seq_free: q's blocks back to the draft's pool. */
void draft_release(eng_sched *s, sch_seq *q);

/* sched_seq.c, below both halves. Monotonic seconds. */
double sch_now(void);
/* Frees q: its KV blocks back to the pool, its copies, its mask. */
void sch_seq_free(eng_sched *s, sch_seq *q);
/* Removes q from the running set (order kept: admission order). */
void sch_running_remove(eng_sched *s, sch_seq *q);
/* Frees q and delivers its DONE event (why, message). */
void sch_finish(eng_sched *s, sch_seq *q, eng_finish why, const char *message);

#endif
