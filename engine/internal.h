/* engine/internal.h: shared by the engine's files; never included from
 * outside engine/. */
#ifndef GPT2D_ENGINE_INTERNAL_H
#define GPT2D_ENGINE_INTERNAL_H

#include "kernels.h"
#include "step.h"
#include "errbuf.h"
#include "safetensors.h"

/* One transformer block's weights: views into the mapping, in the file's
 * format (kernels.h, op_w). */
/* splitmix64's finaliser (Steele, Lea and Flood, 2014): every input bit
 * moves every output bit. The sampler's generator and the prefix cache's
 * block hashes end with it. */
static inline uint64_t gpt2_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

typedef struct {
    op_w ln1_g, ln1_b;   /* (C)                       */
    op_w attn_w, attn_b; /* (C, 3C), (3C): Conv1D      */
    op_w proj_w, proj_b; /* (C, C), (C)                */
    op_w ln2_g, ln2_b;   /* (C)                        */
    op_w fc_w, fc_b;     /* (C, 4C), (4C)              */
    op_w fc2_w, fc2_b;   /* (4C, C), (C)               */
} gpt2_layer;

struct eng_model {
    eng_config cfg;
    op_w wte;           /* (V, C); also the LM head, transposed */
    op_w wpe;           /* (n_ctx, C)                           */
    gpt2_layer *layers; /* [L]                                  */
    op_w lnf_g, lnf_b;
    sft_data *data; /* keeps the mapping (and copies) alive */
    size_t copied;
    size_t pair_bytes;  /* the weights' pair or quad copies (op_w_*_build) */
    void *panels;       /* the HF projections' panel copy (op_w_panels.c), or NULL */
    size_t panel_bytes; /* its size                                          */
    size_t params;
    size_t weight_bytes; /* as stored, read once per step          */
    const char *dtype;   /* wf_detect's name: "f32", "bf16", ...    */
    const char *layout;  /* "hf", "panel64" or "pairs64" (wformat.h) */
    eng_about about;     /* the file's own words (engine.h)        */
};

/* One projection's LoRA factors as the forward pass reads them
 * (adapter.c, op_lora.c): a.p NULL when this layer's module is not
 * adapted. */
typedef struct {
    op_w a;  /* (r, in)  */
    op_w bt; /* (r, out): B transposed */
    size_t in, out;
} eng_adapter_pair;

struct eng_adapter {
    _Atomic size_t refs; /* the owner's reference and one per sequence */
    size_t n_layer, n_embd, rank;
    float scaling;
    op_dtype dt;             /* OP_F32 or OP_BF16 */
    eng_adapter_pair *pairs; /* n_layer x LORA_NMODULES */
    void *slab;              /* every factor */
    size_t bytes;            /* the slab's */
    uint64_t key;            /* the prefix cache's partition; never 0 */
};

/* The logprob of the prompt token at one position and the top alternatives
 * of the distribution that predicts it (echo), as fill_logprobs gives them
 * for ENG_MAX_TOP; a request asking fewer takes the first ones. */
typedef struct {
    float logprob;
    uint32_t ntop;
    int32_t top_ids[ENG_MAX_TOP];
    float top_logprobs[ENG_MAX_TOP];
} kv_lp;

/* A block's bookkeeping for the prefix cache (kv.c). A block is free (on
 * the free list), in use (ref > 0) or cached (ref 0, registered, on the LRU
 * list). A registered block is full and read-only: its KV are those of its
 * tokens after the prefix its parent chain spells. */
typedef struct {
    int32_t ref;        /* sequences holding it                          */
    int32_t parent;     /* registered: the block before it; -1: first    */
    int32_t nchild;     /* registered blocks whose parent it is          */
    int32_t hnext;      /* next in its hash bucket; -1: end              */
    int32_t prev, next; /* LRU list of cached blocks; -1: end            */
    int registered;     /* findable by hash                              */
    int has_lp;         /* registered with its positions' prompt logprobs */
    uint64_t hash;      /* registered: chain hash (tokens + parent hash) */
    uint64_t salt;      /* registered: the partition (eng_seq.salt)      */
    uint64_t lora;      /* registered: and its adapter's (eng_seq.lora)  */
} kv_block;

struct eng_kv {
    size_t block_len; /* positions per block                         */
    size_t nblocks;
    size_t L, NH, HS;  /* layers, heads, head size                    */
    float *pool;       /* nblocks x L x 2 x NH x block_len x HS        */
    size_t pool_bytes; /* the mapping's length (a multiple of 2 MiB)     */
    int32_t *free_list;
    size_t nfree;
    /* The prefix cache; only the scheduler's loop thread touches it. */
    kv_block *meta;             /* nblocks                                */
    int32_t *tokens;            /* nblocks x block_len: registered blocks' */
    int32_t *bucket;            /* nbucket heads; -1: empty               */
    size_t nbucket;             /* a power of two                         */
    int32_t lru_head, lru_tail; /* least recently used first; -1: empty  */
    size_t nlru, nregistered;
    uint64_t evictions;
    uint64_t hash_mask; /* all ones; tests narrow it to force collisions */
    kv_lp *lp;          /* nblocks x block_len: has_lp blocks' logprobs  */
};

/* ---- The prefix cache (kv.c) ---- */

/* The chain hash of a block of block_len tokens after the block whose hash
 * is prev (kv_hash_root(salt, lora) for the first block). */
#define KV_HASH_ROOT UINT64_C(0x9e3779b97f4a7c15)
uint64_t kv_hash(const eng_kv *kv, uint64_t prev, const int32_t *tokens);
/* The chain's seed in partition salt under adapter key lora
 * (eng_adapter_key; 0: the base model): KV_HASH_ROOT for salt 0 and lora
 * 0, so the hashes of salt 0 on the base are those of an unsalted cache.
 * A salt or an adapter changes every hash of the chain; a hit also
 * compares both (find), so two partitions never share a block even when
 * their hashes collide. */
uint64_t kv_hash_root(uint64_t salt, uint64_t lora);

/*
 * Admission with the cache: finds the longest run of registered blocks of
 * seq's partition (seq->salt) spelling tokens[0 .. maxhit x block_len)
 * (hashes[i]: the chain hash of block i, from kv_hash_root(seq->salt, seq->lora)),
 * takes them, and reserves fresh blocks up to `positions` in all, evicting
 * cached blocks when the free list runs out. All or nothing:
 * ENG_ENOMEM leaves seq and the pool unchanged. On success seq->len is the
 * hit's positions and *hit its blocks. seq must be empty.
 *
 * With lp (echo), only blocks that keep their prompt logprobs count, and
 * the last of them is not taken: the logprob at its first position (which
 * the hit's last row predicts) goes with the others into lp[0 .. *hit x
 * block_len], and the sequence computes that block itself.
 */
eng_status kv_admit(eng_kv *kv, eng_seq *seq, const int32_t *tokens, const uint64_t *hashes,
                    size_t maxhit, size_t positions, kv_lp *lp, size_t *hit);

/* While seq's next block is unwritten (seq->len on a block boundary, below
 * maxhit blocks) and registered in seq's partition, swaps it in for seq's
 * reserved one and advances seq->len; returns the blocks gained. With lp (echo), as
 * kv_admit: only blocks with logprobs, followed by one, whose first entry
 * joins theirs in lp. */
size_t kv_extend(eng_kv *kv, eng_seq *seq, const int32_t *tokens, const uint64_t *hashes,
                 size_t maxhit, kv_lp *lp);

/* Registers seq's full blocks from *nhashed up to seq->len in seq's
 * partition (tokens: the sequence's tokens; *hash: the chain hash of block
 * *nhashed - 1). A block already registered with the same contents and
 * salt replaces seq's copy, which goes back to the free list. lp (or NULL): the prompt logprobs of
 * positions [1, nlp); a block whose positions all have them keeps them. */
void kv_commit(eng_kv *kv, eng_seq *seq, const int32_t *tokens, size_t *nhashed, uint64_t *hash,
               const kv_lp *lp, size_t nlp);

/*
 * K (kind 0) or V (kind 1) of layer l, head h at position pos of seq: HS
 * floats. Within a block, each (layer, kind) holds head after head, and
 * each head its block_len positions one after the other: the keys of one
 * head in a block are one run of block_len x HS floats, and those of
 * neighbouring heads follow. Attention, which reads a head (or a few) over
 * many positions, then streams contiguous memory; a position-major layout
 * gave it 256-byte pieces 3 KB apart, and a decode step waited on them.
 */
static inline float *kv_head(const eng_kv *kv, const eng_seq *seq, size_t l, int kind, size_t h,
                             size_t pos)
{
    size_t block = (size_t)seq->blocks[pos / kv->block_len];
    size_t off = (((block * kv->L + l) * 2 + (size_t)kind) * kv->NH + h) * kv->block_len
                 + pos % kv->block_len;
    return kv->pool + off * kv->HS;
}

/* ---- One row's distribution and its logprobs (sample.c) ---- */

/* A sampling thread's own buffers, for rows of V logits. */
typedef struct {
    void *scratch;   /* eng_sample_scratch_bytes(V)                    */
    float *raw;      /* V: the row before it is shaped, for logprobs   */
    uint32_t *stamp; /* V: presence marks of the penalties             */
    uint32_t stamp_now;
} samp_thread;

/* Allocates th's buffers for rows of V logits: ENG_OK, or ENG_ENOMEM with
 * nothing held. samp_thread_fini frees them (and accepts a zeroed th). */
eng_status samp_thread_init(samp_thread *th, size_t V);
void samp_thread_fini(samp_thread *th);

/*
 * What shapes one sequence's distribution before the draw, applied in this
 * order to the row: the logit bias, then the presence and frequency
 * penalties over the tokens it has generated (as vLLM does: not the
 * prompt). A per-sequence token mask (structured outputs) joins here, last,
 * so that a masked token stays masked whatever the bias and penalties did.
 * Borrows everything; valid for the one call.
 */
typedef struct {
    const eng_sampling *sp;
    const int32_t *generated; /* the tokens generated so far */
    size_t ngenerated;
    int logprobs; /* -1: none; 0..ENG_MAX_TOP: the chosen token's plus top N */
    /* Structured outputs: the allowed tokens (a bitset of V bits), or NULL
     * for none; applied last, after bias and penalties, so a masked token
     * stays masked. The logprobs stay the model's (before the mask). */
    const uint64_t *allow;
} samp_seq;

/*
 * Samples the next token of sequence q from row (V logits, shaped in place)
 * with q's random stream: ev->token, and with q->logprobs >= 0 the chosen
 * token's logprob and the top alternatives under the model's own (unshaped)
 * distribution. Thread: worker (the step's sampling), th its own.
 */
void samp_row(eng_event *ev, samp_thread *th, float *row, size_t V, const samp_seq *q,
              eng_rng *rng);

/* The logprob of token chosen and the top n alternatives (n <= ENG_MAX_TOP;
 * ties: lower id first) of raw logits x[0..V), into ev. */
void samp_logprobs(eng_event *ev, const float *x, size_t V, int32_t chosen, int n);

/* The scheduler's KV pool (tests narrow its hash_mask). */
eng_kv *sch_kv(eng_sched *s);

/* The worker pool of a step's workspace (forward.c), for the scheduler's
 * sampling. */
op_pool *gpt2_workspace_pool(eng_workspace *w);

#endif
