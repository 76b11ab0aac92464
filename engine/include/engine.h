/*
 * engine/include/engine.h: GPT-2 over one shared read-only mapping, a batched forward
 * pass over a paged KV cache, and sampling.
 *
 * Dimensions: T rows in a step (every sequence's new tokens stacked),
 * C width, NH heads, HS = C / NH head size, V vocabulary, L layers.
 *
 * This header is what the server uses (the model, the scheduler, its events
 * and the sampling parameters); the step-level API under the scheduler (the
 * KV cache, the workspace, one forward step) is engine/step.h, for tests,
 * benchmarks and tools.
 *
 * Prefix: eng_ (internal files: gpt2_, op_, kv_, samp_).
 */
#ifndef GPT2D_ENGINE_ENGINE_H
#define GPT2D_ENGINE_ENGINE_H

#include "lora.h" /* lora_adapter */

#include <stddef.h>
#include <stdint.h>

/* Status codes; never renumbered. */
typedef enum {
    ENG_OK = 0,
    ENG_EIO = 1,     /* a model file cannot be read                   */
    ENG_EFORMAT = 2, /* a tensor is missing, misshapen or mistyped    */
    ENG_ENOMEM = 3,  /* allocation failed, or the KV pool is too small */
    ENG_EINVAL = 4,  /* a caller's argument is out of range           */
    ENG_EFULL = 5,   /* the wait queue is full: try again later       */
    ENG_ETOOBIG = 6  /* the request can never fit (context or pool)   */
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
 * is mapped once, read-only; aligned tensors are used in place, in their
 * format (F32, F16 or BF16: the kernels widen 16-bit weights in registers
 * and give exactly the logits of the F32 widening), misaligned ones copied
 * once into aligned memory (see eng_model_copied_bytes). A "transformer." prefix is stripped;
 * h.{i}.attn.bias and lm_head.weight are ignored (the head is tied to wte).
 * Every expected tensor must be present with its shape and a float dtype,
 * else ENG_EFORMAT naming it. Free with eng_model_free. Thread: any.
 */
eng_status eng_model_load(const char *dir, eng_model **out, char *err, size_t errlen);
void eng_model_free(eng_model *m); /* accepts NULL */

const eng_config *eng_model_config(const eng_model *m);

/* The highest kernel level this CPU runs: "avx512-bf16" (AVX512_BF16's
 * VDPBF16PS for BF16 weights), "avx512-vnni" (AVX512_VNNI's VPDPBUSD for
 * Q8 weights), "avx512", "avx2" or "portable"
 * (GPT2D_KERNELS names a lower one to cap it). Thread: any. */
const char *eng_kernels(void);
/* The kernel path weights of format dtype ("f32", "bf16", ...: as
 * eng_model_dtype names them) take on this CPU: "avx512-bf16" for "bf16"
 * and "avx512-vnni" for "q8" where that level runs; otherwise the
 * widening kernels' level ("avx512", "avx2" or "portable").
 * eng_model_kernels: that of m's format. Static strings. Thread: any. */
const char *eng_kernels_for(const char *dtype);
const char *eng_model_kernels(const eng_model *m);

/* Bytes of weights held in private memory (misaligned copies); 0 for an
 * aligned file of any format. */
size_t eng_model_copied_bytes(const eng_model *m);
/* Private bytes of the weights' copies built at load: BF16's pair copies
 * (the projections and wte, for the LM head) for the "avx512-bf16"
 * kernels, Q8's quad copies (the projections) for "avx512-vnni" (0 at
 * other levels and formats; a model has one format, so one kind). */
size_t eng_model_pair_bytes(const eng_model *m);
/* Private bytes of the panel copy of a Hugging Face file's F32 or F16
 * projections, built at load where the AVX-512 panel kernels run (0 for a
 * panel64 file, other formats, lower levels and GPT2D_PANEL_COPY=off), or
 * of a pairs64 file's below "avx512-bf16" (which reads them in place);
 * the logits are the file's, bit for bit. Thread: any. */
size_t eng_model_panel_bytes(const eng_model *m);

/* Number of parameters (wte, wpe, blocks, ln_f). */
size_t eng_model_params(const eng_model *m);

/* The format the model is served in, as the file stores it: "f32", "f16",
 * "bf16", "q8" (formats/include/wformat.h) or "mixed". A static string. */
const char *eng_model_dtype(const eng_model *m);
/* The layout of its projections: "hf" (as Hugging Face stores them),
 * "panel64" (gpt2d's serving layout, `gpt2d convert --layout`) or
 * "pairs64" (BF16 as the avx512-bf16 kernels read them;
 * formats/include/wformat.h). A static string. */
const char *eng_model_layout(const eng_model *m);

/* What the checkpoint says about itself (its __metadata__ keys
 * gpt2d.model_name, gpt2d.owned_by, gpt2d.description and gpt2d.weights,
 * formats/include/wformat.h, checked at load): "" where the file says
 * nothing; weights is "random" (`gpt2d synth`: the text is nonsense),
 * "trained" or "unknown". */
typedef struct {
    char name[128];
    char owned_by[128];
    char description[1024];
    const char *weights; /* a static string */
} eng_about;
const eng_about *eng_model_about(const eng_model *m);

/* Bytes of the weights as stored (Q8 scales included): what one step reads
 * at most, and the bandwidth bound's numerator. */
size_t eng_model_weight_bytes(const eng_model *m);
/* Bytes of KV cache one position of one sequence takes (K and V, every
 * layer): what a share of a KV budget holds is the share over this. */
size_t eng_model_kv_position_bytes(const eng_model *m);

/* ---- LoRA adapters ------------------------------------------------------- */

/*
 * A LoRA adapter for one model (PEFT's, formats/include/lora.h), applied
 * unmerged: the base projections run once for every row of a step, then
 * each group of rows that shares an adapter adds scaling * (x A^T) B^T
 * (engine/op_lora.c), in an order that depends only on the row, so a
 * sequence gets the same bits alone, in any batch, beside any adapters,
 * and in prefill chunks of any size. Every weight format takes adapters.
 * The factors are kept in F32 (ENG_ADAPTER_F32, the default: see
 * docs/benchmarks.md for F32 against BF16) or BF16; F32 of a file whose
 * factors are all F16 (or all BF16) keeps them in those 16 bits, which
 * widen exactly: the same bits as F32, and memory within 1.1x of the
 * file's tensors.
 *
 * Reference counted: the creator holds one reference (eng_adapter_free
 * drops it) and every sequence submitted with it one more until it ends,
 * so an adapter freed while sequences use it is released by the last of
 * them. Reading is thread-safe; the counts are atomic. Thread: any.
 */
typedef struct eng_adapter eng_adapter;
typedef enum { ENG_ADAPTER_F32 = 0, ENG_ADAPTER_BF16 = 1 } eng_adapter_dtype;

/* Builds m's adapter from la (copied: la may be freed after). ENG_EFORMAT
 * when la's layers or width are not m's; ENG_ENOMEM. */
eng_status eng_adapter_new(const eng_model *m, const lora_adapter *la, eng_adapter_dtype dtype,
                           eng_adapter **out, char *err, size_t errlen);
/* lora_read(path) for m's shape, then eng_adapter_new: ENG_EIO (a file
 * unreadable), ENG_EFORMAT (lora_read's refusals, its line in err). */
eng_status eng_adapter_load(const eng_model *m, const char *path, eng_adapter_dtype dtype,
                            eng_adapter **out, char *err, size_t errlen);
/* Takes one more reference; returns a. */
eng_adapter *eng_adapter_ref(eng_adapter *a);
/* Drops a reference; the last frees it. Accepts NULL. */
void eng_adapter_free(eng_adapter *a);
size_t eng_adapter_rank(const eng_adapter *a);
float eng_adapter_scaling(const eng_adapter *a);
/* Bytes of its factors as kept (the resident memory, less ~100 bytes). */
size_t eng_adapter_bytes(const eng_adapter *a);
/* The prefix cache's key of its computations: a hash of its factors'
 * bits, rank and scaling; never 0 (the base model's). */
uint64_t eng_adapter_key(const eng_adapter *a);
/* The references held besides the creator's (its running and waiting
 * sequences). */
size_t eng_adapter_users(const eng_adapter *a);

/* ---- Step timings -------------------------------------------------------- */

/* Where the steps' time went, cumulative seconds (for benchmarks). */
typedef struct {
    double matmul;    /* the four projections per layer            */
    double lora;      /* LoRA adapters' products beside them       */
    double attention; /* K/V into the cache and attention          */
    double lm_head;   /* ln_f and logits = h @ wte^T               */
    double other;     /* layer norms, GELU, residual adds          */
    double sample;    /* sampling, logprobs (scheduler)            */
} eng_times;

/* ---- Sampling ------------------------------------------------------------ */

/* One logit_bias entry: added to the token's logit before sampling. */
typedef struct {
    int32_t token;
    float bias; /* -100 .. 100 */
} eng_bias;

typedef struct {
    float temperature;       /* 0: greedy                                  */
    int top_k;               /* 0: off                                     */
    float top_p;             /* 1: off                                     */
    float presence_penalty;  /* -2 .. 2: minus this once a token appeared  */
    float frequency_penalty; /* -2 .. 2: minus this per appearance         */
    const eng_bias *bias;    /* logit_bias, nbias entries (copied at submit) */
    size_t nbias;
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
 * lowest id among equal maxima. scratch holds eng_sample_scratch_bytes(V)
 * bytes, 8-byte aligned (caller's; one per thread that samples).
 */
size_t eng_sample_scratch_bytes(size_t V);
int32_t eng_sample(float *logits, size_t V, const eng_sampling *p, eng_rng *rng, void *scratch);

/* ---- The continuous-batching scheduler ----------------------------------- */

/*
 * The scheduler owns the running sequences, their KV blocks and a bounded
 * wait queue, admitted fairly (below). Each step takes every running sequence: decoding ones
 * contribute one row, prefilling ones a chunk of their prompt, within a
 * per-step token budget (decode rows first, so streams keep flowing while a
 * long prompt is processed). A request is admitted only when the blocks for
 * its prompt plus max_tokens can be reserved, all or nothing, so a running
 * sequence never fails for memory; it joins at the next step and leaves the
 * step after it finishes.
 *
 * With prefix_cache, full KV blocks are kept and shared by content among
 * the requests of one cache_salt: a prompt starts after its longest cached
 * prefix (its last token is always computed), and a prompt that an earlier
 * running sequence of its salt is computing waits for those blocks instead
 * of computing them again. Results are the
 * same bits with and without the cache. A block computed with echo keeps
 * its positions' prompt logprobs; echo requests take only such blocks.
 *
 * Admission is fair across tenants and across the groups (requests) of a
 * tenant: a free slot goes to the tenant that holds the fewest running
 * sequences (a tie: the one whose earliest waiting sequence came first),
 * within it to the group that holds the fewest (a tie: the earlier), and
 * within the group to its earliest sequence. The chosen one waits until its
 * blocks fit; nobody overtakes it, so a large request is never starved. One
 * tenant holds at most max_running sequences; tenant_spare more slots are
 * for the others, so a newcomer runs at the next step even when one tenant
 * fills max_running with long generations (nothing is preempted). One
 * tenant alone is served as before. A sequence's bits depend on none of it.
 *
 * Threads: eng_sched_plan and eng_sched_complete and every other function
 * run on one thread (the server's loop thread); eng_sched_execute runs the
 * planned step on any one thread (uv_queue_work) and touches only the
 * step's rows, the KV contents and its own scratch. Between plan and
 * complete, submit and cancel stay legal.
 */
typedef struct eng_sched eng_sched;

typedef struct {
    size_t kv_bytes;     /* KV pool budget                                  */
    size_t block_len;    /* positions per KV block (16)                     */
    size_t max_running;  /* one tenant's sequences in a step (64)           */
    size_t tenant_spare; /* slots past max_running for the other tenants
                          * (0: max_running / 8, at least 1)              */
    size_t max_queue;    /* waiting requests before ENG_EFULL (256)          */
    size_t step_tokens;  /* prompt rows per step; decode rows on top (512) */
    size_t threads;      /* step threads; 0 = one per CPU                   */
    int prefix_cache;    /* 1: reuse the KV blocks of prompts seen before   */
    /* Prompt rows of embedding requests (eng_request.embed) in a step that
     * also decodes: this many (16), or 4 a decode row when more decode, so
     * a batch of embeddings keeps one stream beside it flowing and still
     * moves beside many; the whole step_tokens when nothing decodes. */
    size_t embed_tokens_beside_decode;
    /* Speculation: drafts only in steps with at most this many decoding
     * sequences (0: 4): past it a step is bound by compute, not by reading
     * the weights, and verifying drafts costs what it saves. */
    size_t spec_max_batch;
    /* The draft model for ENG_DRAFT_MODEL (NULL: none): a GPT-2 with the
     * target's vocabulary and at least its context, borrowed (the caller
     * frees it after the scheduler). It keeps its own KV pages, draft_kv_bytes
     * of them (0: a quarter of kv_bytes, at least one sequence's worth). */
    const eng_model *draft;
    size_t draft_kv_bytes;
    /* Another scheduler whose step threads this one borrows (threads is
     * then ignored; NULL: its own). The caller never executes steps of the
     * two at the same time (a server of several checkpoints runs one step
     * at a time, each checkpoint's in turn) and frees this one first. */
    const eng_sched *threads_of;
} eng_sched_opts;

typedef enum {
    ENG_EV_TOKEN = 0,          /* a generated token                            */
    ENG_EV_PROMPT_LOGPROB = 1, /* (echo) the logprob of prompt token index+1  */
    ENG_EV_DONE = 2            /* the last event of a request                  */
} eng_event_kind;

typedef enum {
    ENG_FINISH_LENGTH = 0,    /* max_tokens generated, or the sequence's mask
                               * allowed no token (eng_mask) */
    ENG_FINISH_EOS = 1,       /* end of text (50256)   */
    ENG_FINISH_CANCELLED = 2, /* eng_sched_cancel      */
    ENG_FINISH_ERROR = 3      /* the step failed, or the sequence's mask
                               * failed (eng_mask_ops.error); see message */
} eng_finish;

#define ENG_MAX_TOP 5

typedef struct {
    eng_event_kind kind;
    uint64_t id;
    int32_t token; /* TOKEN, PROMPT_LOGPROB                     */
    size_t index;  /* TOKEN: 0-based count; PROMPT: position    */
    float logprob; /* of token under the model's distribution   */
    size_t ntop;   /* top alternatives (request's logprobs)     */
    int32_t top_ids[ENG_MAX_TOP];
    float top_logprobs[ENG_MAX_TOP];
    eng_finish finish;      /* DONE                                      */
    const char *message;    /* DONE with ENG_FINISH_ERROR                */
    size_t cached;          /* DONE: prompt tokens taken from the prefix cache */
    const float *embedding; /* DONE of an embed request that finished: n_embd
                             * floats, valid during the callback; else NULL */
    size_t drafted;         /* DONE: tokens drafted for the request (speculation) */
    size_t accepted;        /* DONE: of those, tokens the model drew as drafted */
} eng_event;

/* Called on the thread of eng_sched_complete / eng_sched_cancel with each
 * event of a request; after DONE it is never called again for that id. */
typedef void (*eng_event_cb)(void *user, const eng_event *ev);

/*
 * A sequence's mask provider: how a constraint reaches the sampler without
 * the engine knowing what it is (structured outputs compile JSON Schema in
 * their own module; the server wraps their matcher in these ops). One
 * provider belongs to one sequence; the scheduler calls it from a step's
 * worker thread, one call at a time, in token order:
 *   allowed   the tokens allowed next: a bitset of (n_vocab + 63) / 64
 *             words, bit i of word i / 64 for token i, valid until the next
 *             call; end of text (50256) only where the output may end.
 *             *nallowed: how many bits are set; 0 ends the sequence as
 *             max_tokens does (ENG_FINISH_LENGTH). NULL: out of memory or
 *             failed (error says why).
 *   accept    the token the sampler chose: 0, or -1 when the provider
 *             refuses it (then error says why, or the next allowed is 0).
 *   accepting 1 when the output so far is complete (end of text allowed).
 *   error     NULL, or why the provider failed: the sequence then ends
 *             with ENG_FINISH_ERROR and this message, never with a
 *             quietly narrowed output. The string lives as long as self.
 *   free      releases self (the scheduler calls it once, at the end).
 */
typedef struct {
    const uint64_t *(*allowed)(void *self, size_t *nallowed);
    int (*accept)(void *self, int32_t token);
    int (*accepting)(const void *self);
    const char *(*error)(const void *self);
    void (*free)(void *self);
} eng_mask_ops;

typedef struct {
    const eng_mask_ops *ops; /* NULL: no mask */
    void *self;
    size_t n_vocab; /* the bitset's vocabulary: must be the model's */
} eng_mask;

/* Speculative decoding (engine/sched_spec.c): a drafter proposes up to k
 * tokens past a decoding sequence's last one; one step computes the
 * model's logits at those k + 1 positions as a prefill chunk (the same
 * bits as k + 1 single steps), and the sampler draws position by position
 * exactly what plain decoding would have drawn (the same shaping, mask
 * and random draws in the same order), keeping a drafted token only where
 * it is that token. The first disagreement keeps the model's token and
 * ends the run; the KV positions past it are rolled back. So every event
 * (tokens, logprobs, finish) is the same bits with speculation or
 * without; only the number of steps changes. Drafters, also the index of
 * the statistics by drafter: */
typedef enum {
    ENG_DRAFT_LOOKUP = 0,     /* prompt lookup: what followed the sequence's last
                               * n-gram where it occurred before in its tokens */
    ENG_DRAFT_PREDICTION = 1, /* the request's prediction (the client's guess
                               * of the output), followed where it agrees */
    ENG_DRAFT_MODEL = 2,      /* a smaller model with the same vocabulary
                               * (eng_sched_opts.draft), greedy, k steps */
    ENG_DRAFTERS = 3
} eng_drafter;
/* The most tokens drafted for one sequence in one step. */
#define ENG_SPEC_MAX 8

typedef struct {
    const int32_t *prompt; /* copied at submit; at least one token */
    size_t nprompt;
    size_t max_tokens;     /* 0: the prompt only (with echo, its logprobs) */
    eng_sampling sampling; /* bias entries copied at submit */
    uint64_t seed;
    int ignore_eos;
    int logprobs; /* -1: none; 0..5: the chosen token's plus top N */
    int echo;     /* 1: PROMPT_LOGPROB events for the prompt      */
    /* 1: an embedding, not tokens (max_tokens 0, no echo, no logprobs, no
     * mask): the prompt is computed whole, taking no cached blocks, and
     * its DONE event carries the mean over its positions of the final
     * layer norm's output (ln_f, what the LM head reads), scaled to length
     * 1. Each position's row has the same bits in any batch and prefill
     * chunk, and the rows are summed in position order in F32, so the
     * vector is the same bits alone or in any batch. */
    int embed;
    /* The prefix cache's partition: a request takes cached blocks only
     * from requests of the same salt (and waits only for theirs), so one
     * salt can neither read another's prompts through `cached` nor time
     * them. 0: the common partition (every unsalted request shares it). The
     * caller picks salts that others cannot guess or choose (the server: a
     * keyed hash of the API key and cache_salt); the results are the same
     * bits under any salt. */
    uint64_t cache_salt;
    /* A constraint on what may be sampled (structured outputs, later tool
     * calls): every sampled token is one the mask allows at that point,
     * whatever the sampling parameters say (ignore_eos too). ops NULL:
     * unconstrained, at no cost. On ENG_OK the scheduler owns the mask
     * and frees it (ops->free) when the sequence ends; on an error the
     * caller still owns it. */
    eng_mask mask;
    /* Fair admission (above): opaque ids the caller picks; the engine only
     * compares them. tenant: whose request (the server: an API key's index
     * or the client's address, never the key). group: the submissions of
     * one client request share it; 0: a group of its own. */
    /* Speculation (above): at most this many drafted tokens a step (0:
     * none; at most ENG_SPEC_MAX). With a prediction (copied at submit;
     * tokens of the model's vocabulary) the drafts follow it while the
     * output does; otherwise, or where it has nothing to say, they come
     * from `drafter`: LOOKUP, MODEL (where the scheduler has a draft
     * model) or PREDICTION (the prediction alone, nothing else). The
     * scheduler adapts the count to what the sequence's drafts earn and
     * drafts nothing in steps of more than spec_max_batch decoding
     * sequences. Changes no event. */
    size_t speculative_tokens;
    eng_drafter drafter;
    const int32_t *prediction;
    size_t nprediction;
    uint64_t tenant;
    uint64_t group;
    /* The LoRA adapter the sequence runs with (NULL: the base model),
     * made for this model; the scheduler holds a reference from a
     * successful submit to the sequence's end. Its blocks in the prefix
     * cache are its own: a prompt under one adapter never takes blocks
     * computed under another or the base (and waits only for its own). */
    eng_adapter *adapter;
    eng_event_cb on_event;
    void *user;
} eng_request;

eng_status eng_sched_new(const eng_model *m, const eng_sched_opts *o, eng_sched **out, char *err,
                         size_t errlen);
/* Frees the scheduler; outstanding requests get no more events. */
void eng_sched_free(eng_sched *s);

/* One prefill of a few tokens (up to 8, within step_tokens, the context
 * and the pool) and one decode step through the scheduler's own workspace
 * and KV pool, before any request, the results dropped: the weights'
 * pages, the step threads and the first KV block are all warm when the
 * first request comes. Counts nothing in the statistics and leaves the
 * pool as it was; a pool or context of fewer than two positions gets no
 * warm-up (ENG_OK). An error only if a step fails (err says why). Call
 * before the first submit. */
eng_status eng_sched_warmup(eng_sched *s, char *err, size_t errlen);

/* Queues a request; *id names it in events and for cancel. ENG_EFULL when
 * the queue is full; ENG_ETOOBIG when prompt + max_tokens exceed the context
 * or the whole KV pool; ENG_EINVAL for a bad token or parameter (err says
 * which). On error no event is ever delivered. */
eng_status eng_sched_submit(eng_sched *s, const eng_request *r, uint64_t *id, char *err,
                            size_t errlen);

/* Cancels a request. Unless it is in the step now executing (then at that
 * step's completion) it ends at once: its blocks return to the pool and its
 * DONE (cancelled) event is delivered inside this call. Unknown ids are
 * ignored. */
void eng_sched_cancel(eng_sched *s, uint64_t id);

/* Changes max_queue (0: 256) while serving: later submissions see the new
 * bound; requests already waiting stay. ENG_ENOMEM (err) when a larger
 * queue cannot be allocated; then nothing changed. */
eng_status eng_sched_set_max_queue(eng_sched *s, size_t max_queue, char *err, size_t errlen);
/* Holds request id out of the steps (paused 1) or lets it back in (0). A
 * paused request keeps its place, and once admitted its KV blocks, but gets
 * no rows and so no events: a consumer that cannot keep up (a client not
 * reading its stream) stops its generation without losing it. A step
 * already planned is not changed. Unknown ids are ignored. */
void eng_sched_pause(eng_sched *s, uint64_t id, int paused);

/* 1 while request id waits in the queue (not yet admitted). */
int eng_sched_waiting(const eng_sched *s, uint64_t id);

/* Plans the next step (admission, batch); 1 if there is one to execute. */
int eng_sched_plan(eng_sched *s);
/* Executes the planned step: the forward pass and sampling. Thread: any. */
void eng_sched_execute(eng_sched *s);
/* Applies the executed step: delivers events, retires finished sequences. */
void eng_sched_complete(eng_sched *s);
/* plan + execute + complete on this thread; 1 if a step ran. */
int eng_sched_step(eng_sched *s);

typedef struct {
    size_t running, queued;
    size_t kv_blocks_used, kv_blocks_total;
    size_t last_step_rows;    /* rows in the last step                 */
    size_t last_step_seqs;    /* sequences in the last step            */
    double last_step_seconds; /* forward + sampling of the last step   */
    uint64_t steps;
    eng_times times; /* cumulative, all steps                 */
    /* Tokens as the steps compute them, not when requests end: what a
     * rate over an interval needs (the server's info line). */
    uint64_t tokens_generated; /* sampled tokens delivered (ENG_EV_TOKEN)  */
    uint64_t prompt_computed;  /* prompt positions run through a step (not
                                * those taken from the prefix cache)      */
    /* The prefix cache (zero when it is off). */
    uint64_t prefix_lookups;    /* admissions that looked for a cached prefix */
    uint64_t prefix_hit_tokens; /* prompt tokens taken from the cache          */
    uint64_t prefix_evictions;  /* cached blocks given up for fresh ones       */
    size_t kv_blocks_cached;    /* registered blocks, held or not              */
    /* Sequences ended because their mask failed (eng_mask_ops.error: for
     * structured outputs, a matcher bound passed). */
    uint64_t mask_errors;
    /* Speculation, by drafter (eng_drafter): verify steps' drafted tokens
     * and those accepted, and by position in the draft (0: the first
     * drafted token) how often a position was drafted and accepted. */
    uint64_t spec_drafted[ENG_DRAFTERS], spec_accepted[ENG_DRAFTERS];
    uint64_t spec_drafted_at[ENG_DRAFTERS][ENG_SPEC_MAX];
    uint64_t spec_accepted_at[ENG_DRAFTERS][ENG_SPEC_MAX];
    uint64_t spec_steps; /* steps in which some sequence verified a draft */
} eng_sched_stats;

void eng_sched_stats_get(const eng_sched *s, eng_sched_stats *out);

#endif
