/*
 * engine/step.h: the step-level API under the scheduler: the paged KV cache,
 * a step's workspace and one batched forward pass. The server does not use
 * it (it drives eng_sched in engine.h); tests, benchmarks and tools that run
 * the model step by step do.
 *
 * Prefix: eng_.
 */
#ifndef GPT2D_ENGINE_STEP_H
#define GPT2D_ENGINE_STEP_H

#include "engine.h"

#include <stddef.h>
#include <stdint.h>

/* ---- The paged KV cache -------------------------------------------------- */

typedef struct eng_kv eng_kv;

/* A pool of blocks of block_len positions each (every layer's K and V, C
 * floats per position), as many as fit in budget_bytes. */
eng_status eng_kv_new(const eng_model *m, size_t budget_bytes, size_t block_len, eng_kv **out,
                      char *err, size_t errlen);
void eng_kv_free(eng_kv *kv);
size_t eng_kv_blocks_total(const eng_kv *kv);
size_t eng_kv_blocks_free(const eng_kv *kv);
size_t eng_kv_block_len(const eng_kv *kv);

/* A sequence's block table. Zero-initialise. */
typedef struct {
    int32_t *blocks; /* block ids, owned (released by eng_kv_release) */
    size_t nblocks;
    size_t len; /* positions already in the cache */
    size_t cap; /* positions the reserved blocks hold */
    /* The prefix cache's partition (kv.c): the sequence takes and registers
     * cached blocks only under this salt (eng_request.cache_salt). */
    uint64_t salt;
    /* The prefix cache's partition by adapter: eng_adapter_key of the
     * sequence's adapter, 0 for the base model. Compared like the salt. */
    uint64_t lora;
} eng_seq;

/* Reserves blocks so that seq can hold `positions` positions in all. All or
 * nothing: ENG_ENOMEM leaves seq and the pool unchanged. */
eng_status eng_kv_reserve(eng_kv *kv, eng_seq *seq, size_t positions);

/* Returns seq's blocks to the pool and zeroes seq. */
void eng_kv_release(eng_kv *kv, eng_seq *seq);

/* ---- The batched forward pass -------------------------------------------- */

/* Which rows of an item get logits. */
typedef enum { ENG_LOGITS_NONE = 0, ENG_LOGITS_LAST = 1, ENG_LOGITS_ALL = 2 } eng_logits;

/* One sequence's part of a step: n new tokens at positions seq->len ..
 * seq->len + n - 1 (a prefill chunk, or one decode token). */
typedef struct {
    eng_seq *seq;
    const int32_t *tokens;
    size_t n;
    eng_logits want;
    float *logits; /* out: V floats (LAST) or n * V (ALL); caller's memory */
    /* NULL, or C floats to which each row's final layer norm output is
     * added, in position order (an embedding's sum; caller's memory). */
    float *hidden_sum;
    /* The LoRA adapter of these rows (NULL: the base model), made for
     * this model; borrowed for the call. */
    const eng_adapter *adapter;
} eng_item;

typedef struct eng_workspace eng_workspace;

/* Activation scratch for steps of up to max_rows rows, and the step's
 * worker threads (threads in all, counting the thread that calls
 * eng_forward; 0 means one per online CPU); allocated once, so a step never
 * allocates. */
eng_status eng_workspace_new(const eng_model *m, size_t max_rows, size_t threads,
                             eng_workspace **out);
/* The same on another workspace's step threads (borrowed: freed with their
 * owner, which must outlive this one). The two must never run a step at
 * the same time: the caller runs one step at a time (a draft model inside
 * its target's step, the checkpoints of one server in turn). */
eng_status eng_workspace_new_on(const eng_model *m, size_t max_rows, eng_workspace *threads_of,
                                eng_workspace **out);
void eng_workspace_free(eng_workspace *w);

void eng_workspace_times(const eng_workspace *w, eng_times *out);
/* Zeroes the cumulative times (after a warm-up step that is not a step). */
void eng_workspace_times_clear(eng_workspace *w);

/*
 * One step: the rows of every item stacked into one [T, C] activation, so
 * each weight matrix is read once for the whole batch; attention per item
 * over its own KV blocks. On success every item's seq->len advanced by n.
 * ENG_EINVAL (nothing computed) if a token is out of the vocabulary, a
 * position past n_ctx or past the sequence's reserved blocks, or the rows
 * exceed the workspace. Thread: one step at a time per kv and workspace.
 */
eng_status eng_forward(const eng_model *m, eng_kv *kv, eng_workspace *w, eng_item *items,
                       size_t nitems, char *err, size_t errlen);

#endif
