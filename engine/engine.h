/*
 * engine/engine.h: GPT-2 over one shared read-only mapping, a batched forward
 * pass over a paged KV cache, and sampling.
 *
 * Dimensions: T rows in a step (every sequence's new tokens stacked),
 * C width, NH heads, HS = C / NH head size, V vocabulary, L layers.
 *
 * Prefix: eng_ (internal files: gpt2_, op_, kv_, samp_).
 */
#ifndef GPT2D_ENGINE_ENGINE_H
#define GPT2D_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

/* Status codes; never renumbered. */
typedef enum {
    ENG_OK = 0,
    ENG_EIO = 1,     /* a model file cannot be read                   */
    ENG_EFORMAT = 2, /* a tensor is missing, misshapen or mistyped    */
    ENG_ENOMEM = 3,  /* allocation failed, or the KV pool is too small */
    ENG_EINVAL = 4   /* a caller's argument is out of range           */
} eng_status;

const char *eng_strerror(eng_status s);

/* The model's shape, read off its tensors (and config.json for the heads). */
typedef struct {
    size_t n_layer; /* L  */
    size_t n_embd;  /* C  */
    size_t n_head;  /* NH */
    size_t n_ctx;   /* positions (wpe rows) */
    size_t n_vocab; /* V  */
    float ln_eps;   /* 1e-5 unless config.json says otherwise */
} eng_config;

/* ---- The model ----------------------------------------------------------- */

typedef struct eng_model eng_model;

/*
 * Loads DIR/model.safetensors (and DIR/config.json when present). The file
 * is mapped once, read-only; aligned F32 tensors are used in place, the
 * others copied once into aligned memory (see eng_model_copied_bytes), F16
 * and BF16 converted to F32. A "transformer." prefix is stripped;
 * h.{i}.attn.bias and lm_head.weight are ignored (the head is tied to wte).
 * Every expected tensor must be present with its shape and a float dtype,
 * else ENG_EFORMAT naming it. Free with eng_model_free. Thread: any.
 */
eng_status eng_model_load(const char *dir, eng_model **out, char *err, size_t errlen);
void eng_model_free(eng_model *m); /* accepts NULL */

const eng_config *eng_model_config(const eng_model *m);

/* Bytes of weights held in private memory (misaligned copies, converted
 * half-precision tensors); 0 for an aligned F32 file. */
size_t eng_model_copied_bytes(const eng_model *m);

/* Number of parameters (wte, wpe, blocks, ln_f). */
size_t eng_model_params(const eng_model *m);

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
    size_t len;      /* positions already in the cache */
    size_t cap;      /* positions the reserved blocks hold */
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
} eng_item;

typedef struct eng_workspace eng_workspace;

/* Activation scratch for steps of up to max_rows rows, and the step's
 * worker threads (threads in all, counting the thread that calls
 * eng_forward; 0 means one per online CPU); allocated once, so a step never
 * allocates. */
eng_status eng_workspace_new(const eng_model *m, size_t max_rows, size_t threads,
                             eng_workspace **out);
void eng_workspace_free(eng_workspace *w);

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

/* ---- Sampling ------------------------------------------------------------ */

typedef struct {
    float temperature; /* 0: greedy                     */
    int top_k;         /* 0: off                        */
    float top_p;       /* 1: off                        */
} eng_sampling;

/* A per-request random stream (xoshiro256**). */
typedef struct {
    uint64_t s[4];
} eng_rng;

void eng_rng_seed(eng_rng *r, uint64_t seed);
uint64_t eng_rng_next(eng_rng *r);
double eng_rng_uniform(eng_rng *r); /* [0, 1) */

/*
 * Picks a token from logits[0..V) (modified in place). Greedy takes the
 * lowest id among equal maxima. scratch holds V * ENG_SAMPLE_SCRATCH bytes
 * (caller's).
 */
#define ENG_SAMPLE_SCRATCH 8
int32_t eng_sample(float *logits, size_t V, const eng_sampling *p, eng_rng *rng, void *scratch);

#endif
