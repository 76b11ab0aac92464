/*
 * engine/kernels.h: the kernels of a step (op_*), shared by the engine's
 * files; never included from outside engine/ (and bench_ops).
 *
 * Batch invariance: a sequence must get the same bits whether it runs alone
 * or beside others. OpenBLAS's SGEMM does not give that here (a row's bits
 * change with the number of rows and the weights' alignment), so the
 * kernels are our own: every output element is reduced in one order that
 * depends only on the shapes, never on T, on the tile it falls in, on the
 * thread that computes it or on alignment. Each family has its own file,
 * which opens with the plain C reference and its reduction order, followed
 * by the AVX2 and AVX-512 versions that must equal it bit for bit:
 *   op_dispatch.c     which instruction set (GPT2D_KERNELS caps it);
 *   op_matmul.c       the four projections of a layer;
 *   op_attention.c    causal attention over the paged KV cache;
 *   op_lmhead.c       logits = h @ wte^T and the fixed-order dot product;
 *   op_elementwise.c  exp, GELU, softmax sums and layer norm;
 *   op_lora.c         a LoRA adapter's low-rank product beside a projection.
 *
 * Parallelism: op_pool_run splits columns (matmul), vocabulary rows
 * (LM head) and rows (layer norm, GELU) into one contiguous range per
 * thread; attention's (head, rows) jobs, whose costs differ, are claimed
 * one at a time (op_pool_run_chunks). Claiming the matmul's columns in
 * chunks instead was measured slower (16 streams through the server, 3
 * alternated runs: 8 % fewer tokens/s), as each chunk gathers its inputs
 * again and loses the contiguous run of W.
 */
#ifndef GPT2D_ENGINE_KERNELS_H
#define GPT2D_ENGINE_KERNELS_H

#include "safetensors.h"
#include "step.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

/* Function attributes of the SIMD paths. Every AVX2 function may widen F16
 * (F16C); every AVX-512 one may call the AVX2 helpers. */
#define OP_AVX2 __attribute__((target("avx2,fma,f16c")))
#define OP_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
/* AVX-512 with its byte and word instructions (the BF16 decode tiles): one
 * target list, as clang keeps only one target attribute of a function. */
#define OP_AVX512BW __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))
/* The same with AVX512_VNNI (VPDPBUSD: the Q8 level). */
#define OP_AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512vnni,avx2,fma,f16c")))

/* ---- Dispatch (op_dispatch.c) ---- */

/* 1 when the AVX-512 (avx512f) or AVX2 (avx2, fma, f16c) kernels may run:
 * the CPU has them and GPT2D_KERNELS (portable, avx2) does not cap them.
 * Cached after the first call. Thread: any. */
int op_use_avx512(void);
int op_use_avx2(void);
/* 1 when op_use_avx512 and the CPU has AVX512BW (the BF16 decode tiles). */
int op_use_avx512bw(void);
/* 1 when op_use_avx512bw and the CPU has AVX512_BF16 and GPT2D_KERNELS
 * does not cap it (=avx512): BF16 weights then take the level
 * "avx512-bf16" (op_matmul_bf16.c), whose contract is op_bf16_dot2's. */
int op_use_avx512bf16(void);
/* 1 when op_use_avx512bw and the CPU has AVX512_VNNI and GPT2D_KERNELS
 * does not cap it (=avx512): Q8 projections then take the level
 * "avx512-vnni" (op_matmul_q8.c), whose contract is op_q8_quantize's and
 * op_q8_block's. */
int op_use_avx512vnni(void);
/* The levels of the matrix units that are not built, each with why, for
 * the tests and `gpt2d bench` to name as not run (AMX: no machine here to
 * verify a kernel on). NULL-terminated. */
extern const char *const op_unbuilt_levels[];

/* ---- Worker threads (pool.c) ---- */

typedef struct op_pool op_pool;
/* fn(ctx, begin, end, tid): one contiguous range of [0, n) per thread. */
typedef void (*op_task)(void *ctx, size_t begin, size_t end, size_t tid);
op_pool *op_pool_new(size_t nthreads); /* NULL on failure */
void op_pool_free(op_pool *p);
size_t op_pool_size(const op_pool *p);
/* Runs fn over [0, n) on every thread; returns when all are done.
 * Thread: the one step thread. */
void op_pool_run(op_pool *p, size_t n, op_task fn, void *ctx);
/* The same, but threads claim chunks of grain items in turn until [0, n)
 * is used up, so uneven items or a descheduled thread balance out. */
void op_pool_run_chunks(op_pool *p, size_t n, size_t grain, op_task fn, void *ctx);

/* ---- Weights as stored ---- */

/*
 * A weight tensor in its file's format, read in place (from the shared
 * mapping): the kernels widen each element to F32 in registers and compute
 * in F32, so a tensor gives exactly the results of its F32 widening.
 *   OP_F32   floats;
 *   OP_F16   IEEE half, widened exactly (sft_f16_to_f32, or F16C);
 *   OP_BF16  bfloat16, widened by a 16-bit shift (sft_bf16_to_f32);
 *   OP_Q8    int8 q with F32 scales s, one per OP_Q8_BLOCK elements along
 *            the reduction dimension; the value is the F32 product
 *            (float)q * s, rounded once. For a projection W (K, N) the
 *            scale of W[k][n] is scale[(k / 32) * N + n]; for the token
 *            embeddings (V, C) that of wte[v][c] is scale[(v * C + c) / 32]
 *            (C a multiple of 32, so a block never crosses a row).
 * The layout of a projection W (K, N), formats/include/wformat.h:
 *   panel 0  row-major, as Hugging Face stores Conv1D weights: W[k][n] at
 *            k * N + n (its Q8 scale at (k / 32) * N + n);
 *   panel 1  "panel64": N / 64 panels of K rows of 64 columns, each panel
 *            one contiguous run, W[k][n] at ((n / 64) * K + k) * 64 + n % 64
 *            (its Q8 scale at ((n / 64) * ceil(K / 32) + k / 32) * 64 +
 *            n % 64); N a multiple of 64. A thread's share of the columns is
 *            then one contiguous stream of memory. Only op_matmul reads it;
 *            the values and the reduction order are those of panel 0.
 */
typedef enum { OP_F32 = 0, OP_F16 = 1, OP_BF16 = 2, OP_Q8 = 3 } op_dtype;
#define OP_Q8_BLOCK 32

typedef struct {
    const void *p;      /* the elements, row-major                     */
    const float *scale; /* OP_Q8 only                                  */
    op_dtype dt;
    int panel; /* 1: the panel64 layout (projections only), see above; 2
                * (OP_PANEL_PAIRS): a pairs64 file's projection as stored,
                * only while the model loads (engine/model.c): a kernel
                * never sees it */
    /* OP_BF16 at the "avx512-bf16" level: W's pair copy, k-pairs in 32-bit
     * lanes (op_matmul_bf16.c), built by op_w_pairs_build; NULL otherwise,
     * and then op_matmul takes the widening kernels. */
    const uint32_t *pairs;
    /* OP_Q8 at the "avx512-vnni" level: W's quad copy, four k in the four
     * bytes of a 32-bit lane, with each block's scales and column sums
     * (op_matmul_q8.c), built by op_w_quads_build; NULL otherwise, and
     * then op_matmul takes the widening kernels. */
    const uint8_t *quads;
} op_w;
#define OP_PANEL 64
#define OP_PANEL_PAIRS 2

/* The pair copy of a projection W (K, N) (op_matmul_bf16.c): built when W
 * is BF16 and the "avx512-bf16" level runs (else pairs stays NULL), 0 or
 * -1 when out of memory; op_w_pairs_bytes is its size, op_w_pairs_free
 * (with the same K and N; C and V for op_w_pairs_build_rows) unmaps it. */
int op_w_pairs_build(op_w *w, size_t K, size_t N);
/* The same for the token embeddings wte (V, C) read as the LM head's
 * (C, V): pair j of column v is wte[v][2j], wte[v][2j + 1]. */
int op_w_pairs_build_rows(op_w *w, size_t V, size_t C);
size_t op_w_pairs_bytes(size_t K, size_t N);
void op_w_pairs_free(op_w *w, size_t K, size_t N);

/* Private anonymous memory for a copy of weights built at load, on a 2 MB
 * boundary and advised as huge pages (op_matmul_bf16.c says why); NULL
 * when out of memory. op_copy_unmap takes the same bytes (and NULL). */
void *op_copy_map(size_t bytes);
void op_copy_unmap(const void *p, size_t bytes);

/* The panel copy of a projection W (K, N) stored in the Hugging Face
 * layout (op_w_panels.c): the bytes it takes, 0 when none is wanted (W
 * not F32 or F16, already panels, N not a multiple of OP_PANEL, or the
 * AVX-512 panel kernels not running); op_w_panels_write fills dst (that
 * many bytes, 64-byte aligned) with W's elements in the panel64 layout
 * and points w at it (p, panel = 1): the same values summed in the same
 * order, so the bits do not change. The caller owns dst and keeps it
 * while w is used. */
size_t op_w_panels_bytes(const op_w *w, size_t K, size_t N);
void op_w_panels_write(op_w *w, void *dst, size_t K, size_t N);

/* The quad copy of a projection W (K, N) (op_matmul_q8.c): built when W
 * is Q8 and the "avx512-vnni" level runs (else quads stays NULL), 0 or -1
 * when out of memory; op_w_quads_bytes is its size, op_w_quads_free frees
 * it. */
int op_w_quads_build(op_w *w, size_t K, size_t N);
size_t op_w_quads_bytes(size_t K, size_t N);
void op_w_quads_free(op_w *w);

/* Element i of w, widened; si is its scale's index (OP_Q8). The reference
 * widening of every kernel. */
static inline float op_widen1(const op_w *w, size_t i, size_t si)
{
    switch (w->dt) {
    case OP_F16: return sft_f16_to_f32(((const uint16_t *)w->p)[i]);
    case OP_BF16: return sft_bf16_to_f32(((const uint16_t *)w->p)[i]);
    case OP_Q8: return (float)((const int8_t *)w->p)[i] * w->scale[si];
    case OP_F32: break;
    }
    return ((const float *)w->p)[i];
}

/* The arithmetic of the "avx512-bf16" level (op_matmul_bf16.c), written
 * in C from Intel's definitions of VCVTNEPS2BF16 and VDPBF16PS (and checked
 * against them on AMD Zen 5: every F32 input of the one, 32 million random
 * lanes of the other). op_f32_to_bf16_dp: to nearest, ties to even, a
 * subnormal to a zero of its sign, a NaN kept quiet. */
static inline uint16_t op_f32_to_bf16_dp(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu) != 0)
        return (uint16_t)((u >> 16) | 0x40u);
    if ((u & 0x7F800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* F32 with a subnormal read or written as a zero of its sign. */
static inline float op_ftz(float f)
{
    return fpclassify(f) == FP_SUBNORMAL ? copysignf(0.0f, f) : f;
}

/* One lane of VDPBF16PS: acc + x1 w1 (one FMA), then + x0 w0 (another),
 * BF16 operands widened, subnormals in and out as zero. */
static inline float op_bf16_dot2(float acc, uint16_t x0, uint16_t x1, uint16_t w0, uint16_t w1)
{
    acc = op_ftz(acc);
    acc = op_ftz(fmaf(op_ftz(sft_bf16_to_f32(x1)), op_ftz(sft_bf16_to_f32(w1)), acc));
    return op_ftz(fmaf(op_ftz(sft_bf16_to_f32(x0)), op_ftz(sft_bf16_to_f32(w0)), acc));
}

/*
 * The arithmetic of the "avx512-vnni" level (op_matmul_q8.c) for Q8
 * projections, written in C. Each input row is quantized per block of
 * OP_Q8_BLOCK along K by op_q8_quantize (n: the block's inputs, fewer in
 * a last partial block, whose missing ones are zeros): amax = the largest
 * |x_i| (a NaN never taken), d = amax / 127 (one F32 division), and, when
 * d != 0, xq_i = rintf(x_i / d) (one F32 division per element, rounded to
 * nearest even: the default rounding mode, which the engine never
 * changes) clamped to [-127, 127] (a NaN to -127); all zeros when d == 0.
 * Then out[t][n] = b[n] and, for each block B in increasing order,
 * out[t][n] = op_q8_block(out[t][n], isum, d_B, s_B[n]), where isum =
 * sum over k in B of xq[k] * q[k][n] is exact in int32 (|isum| <= 32 x 127
 * x 128 < 2^24, so its float is exact too, and the order of its terms
 * does not matter). Nothing depends on T, the tile, the thread or the
 * layout: batch-invariant by construction.
 */
static inline float op_q8_quantize(const float *x, size_t n, int8_t xq[OP_Q8_BLOCK])
{
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    float d = amax / 127.0f;
    for (size_t i = 0; i < OP_Q8_BLOCK; i++) {
        float v = 0.0f;
        if (i < n && d != 0.0f) {
            v = rintf(x[i] / d);
            v = v > -127.0f ? v : -127.0f;
            v = v < 127.0f ? v : 127.0f;
        }
        xq[i] = (int8_t)v;
    }
    return d;
}

/* One block's step: one F32 product d * s (the input's scale times the
 * weight's), then one FMA of the exact integer sum. */
static inline float op_q8_block(float acc, int32_t isum, float d, float s)
{
    return fmaf((float)isum, d * s, acc);
}

/* dst[j] = element off + j of w, widened, j < n; Q8 scales by the flat
 * index (the embeddings' layout). A copy for F32. (op_elementwise.c) */
void op_widen(float *dst, const op_w *w, size_t off, size_t n);

/* ---- Kernels; fixed reduction orders, see each file ---- */

/* Floats of scratch that op_matmul needs on a pool of `threads` threads for
 * every product of up to K x N (the largest of a step): the one place that
 * sizes it (forward.c, tests, bench_ops). */
size_t op_matmul_scratch_floats(size_t threads, size_t K, size_t N);
/* out (T,N) = in (T,K) @ W (K,N) + b. scratch: op_matmul_scratch_floats
 * floats (or more) for at least these K and N, 64-byte aligned. */
void op_matmul(op_pool *pool, float *scratch, float *out, const float *in, const op_w *W,
               const op_w *b, size_t T, size_t K, size_t N);
/* logits (T,V) = h (T,C) @ wte^T, wte (V, C) in any op_dtype. scratch:
 * op_lm_head_scratch_floats(C) floats or more (op_matmul's for a K >= C
 * is enough), 64-byte aligned; a BF16 wte with its pair copy at the
 * "avx512-bf16" level takes op_matmul_bf16.c's kernels (no bias). */
void op_lm_head(op_pool *pool, float *scratch, float *out, const float *h, const op_w *wte,
                size_t T, size_t C, size_t V);
size_t op_lm_head_scratch_floats(size_t C);
#if HAVE_X86
void op_lm_head_bf16dp(op_pool *pool, float *scratch, float *out, const float *h, const op_w *wte,
                       size_t T, size_t C, size_t V);
#endif
void op_layernorm(op_pool *pool, float *out, const float *in, const op_w *g, const op_w *b,
                  size_t T, size_t C, float eps);
void op_gelu(op_pool *pool, float *x, size_t n);
/* scores: per-thread scratch, threads x OP_ATT_ROWS x n_ctx floats. */
#define OP_ATT_ROWS 4
void op_attention(op_pool *pool, float *att, const float *qkv, const eng_kv *kv,
                  const eng_item *items, const size_t *row_item, const size_t *row_pos, size_t T,
                  size_t l, size_t NH, size_t HS, float *scores, size_t n_ctx);
/* The fixed-order dot product of op_lmhead.c (attention's scores too). */
float op_dot(const float *a, const float *b, size_t n);
/* The same order over w[off .. off + n), widened (a LoRA factor's row). */
float op_dot_w(const float *a, const op_w *w, size_t off, size_t n);
/* LoRA adapters' products beside one projection (op_lora.c): for each
 * group (the rows `rows`, indices into the step's rows, that share an
 * adapter) out[t] += scaling * (in[t] A^T) Bt, A (r, K) and Bt (r, N) =
 * B^T in OP_F32, OP_F16 or OP_BF16, each element in one order that depends only
 * on its own row. u: scratch of op_pool_size(pool) x OP_LORA_ROWS x
 * OP_LORA_MAX_RANK floats. Thread: the one step thread. */
#define OP_LORA_ROWS 64
#define OP_LORA_MAX_RANK 1024 /* LORA_MAX_RANK */
typedef struct {
    const op_w *a, *bt;
    size_t r;
    float scaling;
    const size_t *rows;
    size_t nrows;
} op_lora_group;
void op_lora(op_pool *pool, float *u, float *out, const float *in, const op_lora_group *g,
             size_t ng, size_t K, size_t N);
/* x[i] = exp(x[i] - m) (clamped to exp(-87) below), returning their sum in a
 * fixed lane order; the same bits on every path. */
float op_exp_sub_sum(float *x, size_t n, float m);

/* ---- Horizontal sums in the fixed tree of every path ---- */

#if HAVE_X86
/* ((m0 + m4) + (m2 + m6)) + ((m1 + m5) + (m3 + m7)) of the eight lanes. */
__attribute__((target("avx2,fma"), always_inline)) static inline float op_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s)); /* (m0+m4)+(m2+m6), (m1+m5)+(m3+m7) */
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    return _mm_cvtss_f32(s);
}

/* The pairs l[j] + l[j + 8], then op_hsum8's tree. */
__attribute__((target("avx512f"), always_inline)) static inline float op_hsum16(__m512 v)
{
    __m256 m = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    return _mm_cvtss_f32(s);
}

/* op_hsum16 of sixteen vectors at once: lane i of the result is
 * op_hsum16(v[i]), bit for bit, as every addition is the same pair of the
 * same partial sums (each level adds two vectors whose lanes are the pairs
 * of that level of the tree for several inputs): 45 operations for the
 * sixteen where one at a time takes eight each and a store. */
__attribute__((target("avx512f"), always_inline)) static inline __m512
op_hsum16x16(const __m512 v[16])
{
    /* Pairs of inputs (a, b) -> [a0..7 + a8..15 | b0..7 + b8..15]. The
     * inputs are taken in the order that leaves lane i holding v[i] at
     * the end: slot s holds v[4 * (s % 4) + s / 4]. */
    __m512 m[8], n[4], q[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        int sa = 2 * i, sb = 2 * i + 1;
        __m512 a = v[4 * (sa % 4) + sa / 4], b = v[4 * (sb % 4) + sb / 4];
        m[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    }
    /* Distance 4 within each eight: 128-bit lanes (0, 2) plus (1, 3). */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        n[i] = _mm512_add_ps(_mm512_shuffle_f32x4(m[2 * i], m[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(m[2 * i], m[2 * i + 1], 0xDD));
        /* Distance 2 within each four: elements (0, 1) plus (2, 3). */
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++)
        q[i] = _mm512_add_ps(_mm512_shuffle_ps(n[2 * i], n[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(n[2 * i], n[2 * i + 1], 0xEE));
    /* Distance 1: elements 0 plus 1 of each pair. */
    return _mm512_add_ps(_mm512_shuffle_ps(q[0], q[1], 0x88), _mm512_shuffle_ps(q[0], q[1], 0xDD));
}

/* 16 (AVX-512) or 8 (AVX2) elements of p from element i, widened exactly;
 * OP_Q8 gives the integers as floats (the caller multiplies by the scale).
 * dt is a constant where these are inlined, so each kernel is compiled once
 * per format. */
OP_AVX512 __attribute__((always_inline)) static inline __m512 op_ld16(const void *p, size_t i,
                                                                      const op_dtype dt)
{
    switch (dt) {
    case OP_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const void *)((const uint16_t *)p + i)));
    case OP_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)((const uint16_t *)p + i))),
            16));
    case OP_Q8:
        return _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)((const int8_t *)p + i))));
    case OP_F32: break;
    }
    return _mm512_loadu_ps((const float *)p + i);
}

/* BF16, 32 elements from one 64-byte load: two word permutes (vpermw)
 * with zero masking put elements 0-15 and 16-31 in the high halves of
 * sixteen dwords each (the shift of sft_bf16_to_f32), in their own order:
 * two instructions for 32 weights where op_ld16's zero extension and
 * shift take four. */
OP_AVX512BW __attribute__((always_inline)) static inline void op_bf16x32(const uint16_t *p,
                                                                         __m512 *lo, __m512 *hi)
{
    const __m512i idx_lo = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7,
                                            0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
    const __m512i idx_hi = _mm512_set_epi16(31, 0, 30, 0, 29, 0, 28, 0, 27, 0, 26, 0, 25, 0, 24, 0,
                                            23, 0, 22, 0, 21, 0, 20, 0, 19, 0, 18, 0, 17, 0, 16, 0);
    const __mmask32 odd = 0xAAAAAAAAu;
    __m512i raw = _mm512_loadu_si512((const void *)p);
    *lo = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(odd, idx_lo, raw));
    *hi = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(odd, idx_hi, raw));
}

OP_AVX2 __attribute__((always_inline)) static inline __m256 op_ld8(const void *p, size_t i,
                                                                   const op_dtype dt)
{
    switch (dt) {
    case OP_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const void *)((const uint16_t *)p + i)));
    case OP_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const void *)((const uint16_t *)p + i))), 16));
    case OP_Q8:
        return _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const void *)((const int8_t *)p + i))));
    case OP_F32: break;
    }
    return _mm256_loadu_ps((const float *)p + i);
}
#endif

#endif
