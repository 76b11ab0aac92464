/*
 * engine/op_matmul_packed.c: the packed tiles of op_matmul for many rows
 * (prefill): a strip of W's columns is packed, widened, into contiguous
 * memory once, then register tiles (AVX2 3 x 32, AVX-512 6 x 64) run
 * k = 0..K-1 over it. The arithmetic is op_matmul.c's: b[n], then one FMA
 * per k in increasing k, so the bits are those of every other path.
 * op_matmul.c decides when these run (MM_STREAM_MAX*); matmul.h is what the
 * two files share.
 */
#include "matmul.h"

#include <string.h>

#if HAVE_X86
/* Packs columns [n0, n0 + cols) of W, widened, into strip (K x cols floats,
 * cols 32 or 64): copies of the widened values, so no bit changes. */
OP_AVX2 __attribute__((always_inline)) static inline void
mm_pack_t(const mm_ctx *c, size_t n0, size_t cols, float *strip, const op_dtype dt)
{
    for (size_t k = 0; k < c->K; k++)
        for (size_t j = 0; j < cols; j += 8)
            _mm256_store_ps(strip + k * cols + j,
                            mm_w8(c, k, n0 + j, mm_sc8(c, k, n0 + j, dt), dt));
}

/* cols is a constant where this is inlined (32 or 64): the F32 copy is then
 * a few vector moves a row, not a call of memcpy (a call per row took
 * prefill's matmuls from 120-131 to 155-330 ms in bench_ops at 256 rows). */
OP_AVX2 __attribute__((always_inline)) static inline void mm_pack(const mm_ctx *c, size_t n0,
                                                                  const size_t cols, float *strip)
{
    switch (c->W.dt) {
    case OP_F32:
        for (size_t k = 0; k < c->K; k++)
            memcpy(strip + k * cols, (const float *)c->W.p + mm_wi(c, k, n0), cols * sizeof(float));
        break;
    case OP_F16: mm_pack_t(c, n0, cols, strip, OP_F16); break;
    case OP_BF16: mm_pack_t(c, n0, cols, strip, OP_BF16); break;
    case OP_Q8: mm_pack_t(c, n0, cols, strip, OP_Q8); break;
    }
}

OP_AVX2 __attribute__((always_inline)) static inline void
mm_tile_avx2(const mm_ctx *c, const float *strip, size_t t0, size_t n0, const size_t R)
{
    __m256 acc[MM_ROWS][4];
    for (size_t r = 0; r < R; r++)
        for (size_t v = 0; v < 4; v++) acc[r][v] = _mm256_loadu_ps(c->b + n0 + 8 * v);
    const float *w = strip;
    for (size_t k = 0; k < c->K; k++, w += MM_COLS) {
        __m256 w0 = _mm256_load_ps(w), w1 = _mm256_load_ps(w + 8);
        __m256 w2 = _mm256_load_ps(w + 16), w3 = _mm256_load_ps(w + 24);
        for (size_t r = 0; r < R; r++) {
            __m256 x = _mm256_broadcast_ss(c->in + (t0 + r) * c->K + k);
            acc[r][0] = _mm256_fmadd_ps(x, w0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(x, w1, acc[r][1]);
            acc[r][2] = _mm256_fmadd_ps(x, w2, acc[r][2]);
            acc[r][3] = _mm256_fmadd_ps(x, w3, acc[r][3]);
        }
    }
    for (size_t r = 0; r < R; r++)
        for (size_t v = 0; v < 4; v++)
            _mm256_storeu_ps(c->out + (t0 + r) * c->N + n0 + 8 * v, acc[r][v]);
}

OP_AVX2 void op_mm_block_avx2(const mm_ctx *c, size_t n0, float *strip)
{
    mm_pack(c, n0, MM_COLS, strip);
    size_t t = 0;
    for (; t + 3 <= c->T; t += 3) mm_tile_avx2(c, strip, t, n0, 3);
    if (c->T - t == 2) mm_tile_avx2(c, strip, t, n0, 2);
    if (c->T - t == 1) mm_tile_avx2(c, strip, t, n0, 1);
}
/* AVX-512: register tiles of 6 rows x 64 columns (24 accumulators). A
 * 512-bit FMA rounds each lane exactly as a 256-bit one or fmaf does, so
 * the bits are those of the other paths. */
#define MM512_KC 256

/* One register tile: rows x[0..5] (K floats from the current k) against K
 * rows of the packed strip, starting from init[r] (the bias, or the partial
 * sums from the previous k-block) and written to o[0..5]. Fully unrolled so
 * that the 24 accumulators stay in registers. */
OP_AVX512 static void mm_tile6_avx512(float *const o[6], const float *const x[6],
                                      const float *strip, const float *const init[6], size_t K)
{
#define ACC(r)                                                                                     \
    __m512 a##r##0 = _mm512_loadu_ps(init[r]), a##r##1 = _mm512_loadu_ps(init[r] + 16),            \
           a##r##2 = _mm512_loadu_ps(init[r] + 32), a##r##3 = _mm512_loadu_ps(init[r] + 48)
    ACC(0);
    ACC(1);
    ACC(2);
    ACC(3);
    ACC(4);
    ACC(5);
#undef ACC
    const float *w = strip;
    for (size_t k = 0; k < K; k++, w += MM512_COLS) {
        __m512 w0 = _mm512_load_ps(w), w1 = _mm512_load_ps(w + 16);
        __m512 w2 = _mm512_load_ps(w + 32), w3 = _mm512_load_ps(w + 48);
#define ROW(r)                                                                                     \
    do {                                                                                           \
        __m512 v = _mm512_set1_ps(x[r][k]);                                                        \
        a##r##0 = _mm512_fmadd_ps(v, w0, a##r##0);                                                 \
        a##r##1 = _mm512_fmadd_ps(v, w1, a##r##1);                                                 \
        a##r##2 = _mm512_fmadd_ps(v, w2, a##r##2);                                                 \
        a##r##3 = _mm512_fmadd_ps(v, w3, a##r##3);                                                 \
    } while (0)
        ROW(0);
        ROW(1);
        ROW(2);
        ROW(3);
        ROW(4);
        ROW(5);
#undef ROW
    }
#define OUT(r)                                                                                     \
    do {                                                                                           \
        _mm512_storeu_ps(o[r], a##r##0);                                                           \
        _mm512_storeu_ps(o[r] + 16, a##r##1);                                                      \
        _mm512_storeu_ps(o[r] + 32, a##r##2);                                                      \
        _mm512_storeu_ps(o[r] + 48, a##r##3);                                                      \
    } while (0)
    OUT(0);
    OUT(1);
    OUT(2);
    OUT(3);
    OUT(4);
    OUT(5);
#undef OUT
}

/* tail: per-thread scratch of 6 x 64 floats for the rows past the last full
 * tile (their inputs repeat a real row; their outputs are dropped). */
OP_AVX512 void op_mm_block_avx512(const mm_ctx *c, size_t n0, float *strip, float *tail)
{
    mm_pack(c, n0, MM512_COLS, strip);
    /* k-blocks of MM512_KC rows (64 KB of strip, in L1/L2 while every row
     * tile passes over it): 256 measured best of 64, 128, 256 and none. */
    for (size_t kb = 0; kb < c->K; kb += MM512_KC) {
        size_t kn = kb + MM512_KC < c->K ? MM512_KC : c->K - kb;
        for (size_t t = 0; t < c->T; t += MM512_ROWS) {
            float *o[MM512_ROWS];
            const float *x[MM512_ROWS], *init[MM512_ROWS];
            for (size_t r = 0; r < MM512_ROWS; r++) {
                int real = t + r < c->T;
                x[r] = c->in + (real ? t + r : t) * c->K + kb;
                o[r] = real ? c->out + (t + r) * c->N + n0 : tail + r * MM512_COLS;
                init[r] = kb == 0 ? c->b + n0 : o[r];
            }
            mm_tile6_avx512(o, x, strip + kb * MM512_COLS, init, kn);
        }
    }
}

#endif
