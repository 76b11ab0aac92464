/*
 * engine/matmul.h: what op_matmul.c (the dispatch, the reference and the
 * k-blocked tiles) and op_matmul_packed.c (the packed prefill tiles) share.
 * Private to those two files.
 */
#ifndef GPT2D_ENGINE_MATMUL_H
#define GPT2D_ENGINE_MATMUL_H

#include "internal.h"

#define MM_COLS 32 /* columns per block: four 8-float vectors          */
#define MM_ROWS 3  /* rows per register tile (12 accumulators)         */
/* AVX-512 packed tiles: 6 rows x 64 columns (24 accumulators). */
#define MM512_COLS 64
#define MM512_ROWS 6

/*
 * Two loop orders, one arithmetic. Few rows (decode): W is streamed once,
 * KB rows at a time, in register tiles whose accumulators rest in out
 * between k-blocks (kb_tile_*). Many rows (prefill): a strip
 * of 32 columns of W is packed into contiguous memory once, then register
 * tiles of 3 rows x 32 columns run k = 0..K-1 over it. Either way each
 * element is b[n] followed by one FMA per k in increasing k.
 */
typedef struct {
    float *out;
    const float *in;
    op_w W;         /* (K, N), any op_dtype                             */
    op_w bias;      /* (N) as stored                                    */
    const float *b; /* (N) as F32: the file's, or NULL until a task widens it */
    size_t T, K, N;
    float *pack; /* per thread: mm_thread_floats(K, N) floats */
} mm_ctx;

/* Where W[k][n] and its Q8 scale are, in either layout (kernels.h, op_w). */
static inline size_t mm_wi(const mm_ctx *c, size_t k, size_t n)
{
    return c->W.panel ? ((n / OP_PANEL) * c->K + k) * OP_PANEL + n % OP_PANEL : k * c->N + n;
}

static inline size_t mm_si(const mm_ctx *c, size_t k, size_t n)
{
    size_t kq = (c->K + OP_Q8_BLOCK - 1) / OP_Q8_BLOCK;
    return c->W.panel ? ((n / OP_PANEL) * kq + k / OP_Q8_BLOCK) * OP_PANEL + n % OP_PANEL
                      : (k / OP_Q8_BLOCK) * c->N + n;
}

/* W[k][n] widened: the reference (kernels.h, op_widen1). */
static inline float mm_w_at(const mm_ctx *c, size_t k, size_t n)
{
    return op_widen1(&c->W, mm_wi(c, k, n), mm_si(c, k, n));
}

#if HAVE_X86
/* Eight columns of W at row k from column n, widened; sc: the eight Q8
 * scales of the k-block (unused otherwise). */
OP_AVX2 __attribute__((always_inline)) static inline __m256
mm_w8(const mm_ctx *c, size_t k, size_t n, __m256 sc, const op_dtype dt)
{
    __m256 w = op_ld8(c->W.p, mm_wi(c, k, n), dt);
    return dt == OP_Q8 ? _mm256_mul_ps(w, sc) : w;
}

OP_AVX512 __attribute__((always_inline)) static inline __m512
mm_w16(const mm_ctx *c, size_t k, size_t n, __m512 sc, const op_dtype dt)
{
    __m512 w = op_ld16(c->W.p, mm_wi(c, k, n), dt);
    return dt == OP_Q8 ? _mm512_mul_ps(w, sc) : w;
}

/* The Q8 scales of row k's block at column n (zeros for other formats). */
OP_AVX2 __attribute__((always_inline)) static inline __m256 mm_sc8(const mm_ctx *c, size_t k,
                                                                   size_t n, const op_dtype dt)
{
    return dt == OP_Q8 ? _mm256_loadu_ps(c->W.scale + mm_si(c, k, n)) : _mm256_setzero_ps();
}

OP_AVX512 __attribute__((always_inline)) static inline __m512 mm_sc16(const mm_ctx *c, size_t k,
                                                                      size_t n, const op_dtype dt)
{
    return dt == OP_Q8 ? _mm512_loadu_ps(c->W.scale + mm_si(c, k, n)) : _mm512_setzero_ps();
}

/* The packed tiles (op_matmul_packed.c): all T rows of columns
 * [n0, n0 + MM_COLS) or [n0, n0 + MM512_COLS). strip: K x 32 or K x 64
 * floats of the thread's scratch; tail: 6 x 64 floats for the rows past the
 * last full AVX-512 tile (their inputs repeat a real row; outputs dropped). */
OP_AVX2 void op_mm_block_avx2(const mm_ctx *c, size_t n0, float *strip);
OP_AVX512 void op_mm_block_avx512(const mm_ctx *c, size_t n0, float *strip, float *tail);
/* The "avx512-bf16" level (op_matmul_bf16.c): all of c (BF16 W with its
 * pair copy), in chunks of rows; thread_floats: each thread's part of
 * c->pack (the widened bias after a strip's room), after which
 * op_matmul_bf16_scratch_floats(K) floats hold a chunk's inputs as BF16
 * pairs. */
void op_matmul_bf16dp(op_pool *pool, const mm_ctx *c, size_t thread_floats);
/* The "avx512-vnni" level (op_matmul_q8.c): all of c (Q8 W with its quad
 * copy), in chunks of rows, the same way; after the threads' parts,
 * op_matmul_q8_scratch_floats(K) floats hold a chunk's quantized inputs. */
void op_matmul_q8vnni(op_pool *pool, const mm_ctx *c, size_t thread_floats);
#endif
size_t op_matmul_bf16_scratch_floats(size_t K);
size_t op_matmul_q8_scratch_floats(size_t K);

#endif
