/*
 * engine/op_lmhead.c: logits (T,V) = h (T,C) @ wte^T, the LM head tied to
 * the token embeddings, and the fixed-order dot product it is made of
 * (attention's scores use it too).
 *
 * The reduction order, on every path (dot16_c below, the reference):
 * sixteen lanes, lane j summing a[i] * b[i] for i = j, j + 16, ... by FMA
 * from 0; then the pairs (l[j] + l[j + 8]); then the tree
 * ((m0 + m4) + (m2 + m6)) + ((m1 + m5) + (m3 + m7)); then the n % 16 tail
 * by FMA in order. AVX-512 holds the lanes in one register, AVX2 in two,
 * the portable code in an array: the same operations on every path. The
 * embeddings are read in their file's format (kernels.h, op_w) and widened
 * element by element (op_widen1 is the reference; op_ld16 and op_ld8 give
 * the same floats), so a 16-bit or 8-bit wte gives exactly the logits of
 * its F32 widening.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

/* ---- The reference: one dot product in the fixed order ----------------- */

/* dot(a, w[off .. off + n)), w's Q8 scales by the flat index. */
static float dot16_c(const float *a, const op_w *w, size_t off, size_t n)
{
    float l[16] = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (size_t j = 0; j < 16; j++) {
            size_t e = off + i + j;
            l[j] = fmaf(a[i + j], op_widen1(w, e, e / OP_Q8_BLOCK), l[j]);
        }
    float m[8];
    for (size_t j = 0; j < 8; j++) m[j] = l[j] + l[j + 8];
    float s = ((m[0] + m[4]) + (m[2] + m[6])) + ((m[1] + m[5]) + (m[3] + m[7]));
    for (; i < n; i++) s = fmaf(a[i], op_widen1(w, off + i, (off + i) / OP_Q8_BLOCK), s);
    return s;
}

#if HAVE_X86
static inline size_t mm_esize_lm(op_dtype dt)
{
    return dt == OP_F32 ? 4 : dt == OP_Q8 ? 1 : 2;
}

/* Sixteen elements of w from the flat index e, widened; Q8 blocks of 32
 * hold whole 16-element groups (e a multiple of 16 then, C % 32 == 0). */
OP_AVX512 __attribute__((always_inline)) static inline __m512 lm_w16(const op_w *w, size_t e,
                                                                     const op_dtype dt)
{
    __m512 v = op_ld16(w->p, e, dt);
    return dt == OP_Q8 ? _mm512_mul_ps(v, _mm512_set1_ps(w->scale[e / OP_Q8_BLOCK])) : v;
}

OP_AVX2 __attribute__((always_inline)) static inline __m256 lm_w8(const op_w *w, size_t e,
                                                                  const op_dtype dt)
{
    __m256 v = op_ld8(w->p, e, dt);
    return dt == OP_Q8 ? _mm256_mul_ps(v, _mm256_set1_ps(w->scale[e / OP_Q8_BLOCK])) : v;
}

OP_AVX2 __attribute__((always_inline)) static inline float
dot16_avx2_t(const float *a, const op_w *w, size_t off, size_t n, const op_dtype dt)
{
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), lm_w8(w, off + i, dt), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), lm_w8(w, off + i + 8, dt), hi);
    }
    float s = op_hsum8(_mm256_add_ps(lo, hi));
    for (; i < n; i++) s = fmaf(a[i], op_widen1(w, off + i, (off + i) / OP_Q8_BLOCK), s);
    return s;
}

OP_AVX2 static float dot16_avx2(const float *a, const op_w *w, size_t off, size_t n)
{
    switch (w->dt) {
    case OP_F16: return dot16_avx2_t(a, w, off, n, OP_F16);
    case OP_BF16: return dot16_avx2_t(a, w, off, n, OP_BF16);
    case OP_Q8: return dot16_avx2_t(a, w, off, n, OP_Q8);
    case OP_F32: break;
    }
    return dot16_avx2_t(a, w, off, n, OP_F32);
}

/* Software prefetch for the LM head: a tile reads four vocabulary rows (4 C
 * contiguous elements) 16 elements of each row a step; pf is the start of
 * the four rows about LM_PF_BYTES further on (NULL near the end of the
 * vocabulary, and for the tiles after the first on the same rows), and
 * step i prefetches its share of them. With the hardware prefetchers alone
 * one thread read a q8 wte at about 12 GB/s (GPT-2 small, bench_decode
 * with 1 thread: 3.7 ms of LM head a step against 1.9; 2 threads 2.1
 * against 1.4). The 16-bit formats gained less (F16 4.6 -> 4.0 ms on one
 * thread, the same with two); F32 lost at one row (2 threads, 4.4 -> 4.9
 * ms: its wte saturates the bandwidth without help), so F32 prefetches only
 * from LM_PF_F32_ROWS rows, where a tile's 16 FMAs a vector leave the
 * memory idle without it (16 rows, bench_decode, LM head a step: one
 * thread 20.9-23.4 -> 17.1-18.8 ms, two threads 19.0-19.3 -> 16.8-16.9 on
 * a loaded machine). Prefetches change no result. */
#define LM_PF_BYTES 12288
#define LM_PF_F32_ROWS 8

/* The elements [*lo, *hi) of C whose prefetches row group g of G issues. */
static inline void lm_pf_range(size_t C, size_t g, size_t G, size_t *lo, size_t *hi)
{
    *lo = C * g / G;
    *hi = C * (g + 1) / G;
}

/* With several row groups on a tile (g of G: the tiles of 4 rows, then the
 * single rows), each group prefetches its share of the next tile's lines
 * (the steps i in [lo, hi): group g's g/G-th part of the C elements, from
 * lm_pf_range, once a tile), not the first group all of them: the memory
 * then works while every group computes. (Measured with every G-th step
 * per group, which cost a division a step; the same lines, spread in
 * chunks instead.) bench_decode, 16 sequences, panel files, 3
 * alternated pairs on a loaded machine, fastest step: F32 25.1-51.2 ms
 * against 53.1-59.6, q8 34.1-34.5 against 34.4-39.9. */
__attribute__((always_inline)) static inline void
lm_prefetch(const char *pf, size_t i, const size_t esize, size_t lo, size_t hi)
{
    if (pf == NULL || i < lo || i >= hi) return;
    const char *p = pf + i * 4 * esize; /* 64 * esize bytes a 16-element step */
#pragma GCC unroll 4
    for (size_t b = 0; b < 64 * esize; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
}

/* The sixteen sums of a 4 x 4 tile, acc[r][j] to out[r * ldo + j], reduced
 * together (op_hsum16x16: the bits of op_hsum16 on each). Where C % 16 is
 * 0, so that no element is left for the scalar tail. */
OP_AVX512 __attribute__((always_inline)) static inline void lm_store_4x4(float *out, size_t ldo,
                                                                         __m512 acc[4][4])
{
    __m512 v[16];
#pragma GCC unroll 4
    for (size_t r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (size_t j = 0; j < 4; j++) v[4 * r + j] = acc[r][j];
    __m512 s = op_hsum16x16(v);
    _mm_storeu_ps(out, _mm512_castps512_ps128(s));
    _mm_storeu_ps(out + ldo, _mm512_extractf32x4_ps(s, 1));
    _mm_storeu_ps(out + 2 * ldo, _mm512_extractf32x4_ps(s, 2));
    _mm_storeu_ps(out + 3 * ldo, _mm512_extractf32x4_ps(s, 3));
}

/* Four rows of h against wte rows v .. v + 3: 16 dot products at once, each
 * with exactly dot16's operations. out[r * ldo + j]. */
OP_AVX512 __attribute__((always_inline)) static inline void
dot_4x4_avx512(float *out, size_t ldo, const float *h, const op_w *w, size_t v, size_t C,
               const char *pf, size_t g, size_t G, const op_dtype dt)
{
    size_t plo, phi;
    lm_pf_range(C, g, G, &plo, &phi);
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    size_t i = 0, e = v * C;
    for (; i + 16 <= C; i += 16) {
        lm_prefetch(pf, i, mm_esize_lm(dt), plo, phi);
        __m512 w0 = lm_w16(w, e + i, dt), w1 = lm_w16(w, e + C + i, dt);
        __m512 w2 = lm_w16(w, e + 2 * C + i, dt), w3 = lm_w16(w, e + 3 * C + i, dt);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            __m512 x = _mm512_loadu_ps(h + (size_t)r * C + i);
            acc[r][0] = _mm512_fmadd_ps(x, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(x, w1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(x, w2, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(x, w3, acc[r][3]);
        }
    }
    if (i == C) {
        lm_store_4x4(out, ldo, acc);
        return;
    }
    for (size_t r = 0; r < 4; r++)
        for (size_t j = 0; j < 4; j++) {
            float s = op_hsum16(acc[r][j]);
            for (size_t q = i; q < C; q++) {
                size_t f = e + j * C + q;
                s = fmaf(h[r * C + q], op_widen1(w, f, f / OP_Q8_BLOCK), s);
            }
            out[r * ldo + j] = s;
        }
}

/* R (1 or 4) rows of h against BF16 wte rows v .. v + 3, 32 elements a
 * step: each lane's FMAs are dot16's, in its order. out[r * ldo + j]. */
OP_AVX512BW __attribute__((always_inline)) static inline void
dot_rx4_bf16(float *out, size_t ldo, const float *h, const op_w *w, size_t v, size_t C,
             const char *pf, size_t g, size_t G, const size_t R)
{
    size_t plo, phi;
    lm_pf_range(C, g, G, &plo, &phi);
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (size_t r = 0; r < R; r++)
#pragma GCC unroll 4
        for (size_t j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    const uint16_t *wp = (const uint16_t *)w->p + v * C;
    size_t i = 0;
    for (; i + 32 <= C; i += 32) {
        lm_prefetch(pf, i, 2, plo, phi);
        lm_prefetch(pf, i + 16, 2, plo, phi);
        __m512 lo[4], hi[4];
#pragma GCC unroll 4
        for (size_t j = 0; j < 4; j++) op_bf16x32(wp + j * C + i, &lo[j], &hi[j]);
#pragma GCC unroll 4
        for (size_t r = 0; r < R; r++) {
            __m512 x = _mm512_loadu_ps(h + r * C + i);
#pragma GCC unroll 4
            for (size_t j = 0; j < 4; j++) acc[r][j] = _mm512_fmadd_ps(x, lo[j], acc[r][j]);
            x = _mm512_loadu_ps(h + r * C + i + 16);
#pragma GCC unroll 4
            for (size_t j = 0; j < 4; j++) acc[r][j] = _mm512_fmadd_ps(x, hi[j], acc[r][j]);
        }
    }
    for (; i + 16 <= C; i += 16)
#pragma GCC unroll 4
        for (size_t r = 0; r < R; r++) {
            __m512 x = _mm512_loadu_ps(h + r * C + i);
#pragma GCC unroll 4
            for (size_t j = 0; j < 4; j++)
                acc[r][j] = _mm512_fmadd_ps(x, op_ld16(wp, j * C + i, OP_BF16), acc[r][j]);
        }
    if (R == 4 && i == C) {
        lm_store_4x4(out, ldo, acc);
        return;
    }
    for (size_t r = 0; r < R; r++)
        for (size_t j = 0; j < 4; j++) {
            float s = op_hsum16(acc[r][j]);
            for (size_t q = i; q < C; q++)
                s = fmaf(h[r * C + q], sft_bf16_to_f32(wp[j * C + q]), s);
            out[r * ldo + j] = s;
        }
}

/* One row of h against wte rows v .. v + 3 (decode). */
OP_AVX512 __attribute__((always_inline)) static inline void
dot_1x4_avx512(float *out, const float *h, const op_w *w, size_t v, size_t C, const char *pf,
               size_t g, size_t G, const op_dtype dt)
{
    size_t plo, phi;
    lm_pf_range(C, g, G, &plo, &phi);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0, e = v * C;
    for (; i + 16 <= C; i += 16) {
        lm_prefetch(pf, i, mm_esize_lm(dt), plo, phi);
        __m512 x = _mm512_loadu_ps(h + i);
        a0 = _mm512_fmadd_ps(x, lm_w16(w, e + i, dt), a0);
        a1 = _mm512_fmadd_ps(x, lm_w16(w, e + C + i, dt), a1);
        a2 = _mm512_fmadd_ps(x, lm_w16(w, e + 2 * C + i, dt), a2);
        a3 = _mm512_fmadd_ps(x, lm_w16(w, e + 3 * C + i, dt), a3);
    }
    float s[4] = {op_hsum16(a0), op_hsum16(a1), op_hsum16(a2), op_hsum16(a3)};
    for (size_t j = 0; j < 4; j++) {
        for (size_t q = i; q < C; q++) {
            size_t f = e + j * C + q;
            s[j] = fmaf(h[q], op_widen1(w, f, f / OP_Q8_BLOCK), s[j]);
        }
        out[j] = s[j];
    }
}

/* One row of h against wte rows v .. v + 7: dot_1x4_avx512 twice over,
 * eight FMA chains on one contiguous run of eight rows, each lane in
 * dot16's order. bench_decode, GPT-2 small panel64 files, 1 sequence, 3
 * alternated pairs: F32 LM head 2.42-2.49 against 3.05-3.14 ms a step;
 * q8 0.80-0.89 against 0.71-0.88 and F16 1.42-1.66 against 1.51-1.66, so
 * only F32 takes it. */
OP_AVX512 __attribute__((always_inline)) static inline void
dot_1x8_avx512(float *out, const float *h, const op_w *w, size_t v, size_t C, const char *pf,
               const op_dtype dt)
{
    __m512 a[8];
#pragma GCC unroll 8
    for (size_t j = 0; j < 8; j++) a[j] = _mm512_setzero_ps();
    size_t i = 0, e = v * C;
    for (; i + 16 <= C; i += 16) {
        lm_prefetch(pf, i, mm_esize_lm(dt), 0, C);
        lm_prefetch(pf == NULL ? NULL : pf + 4 * C * mm_esize_lm(dt), i, mm_esize_lm(dt), 0, C);
        __m512 x = _mm512_loadu_ps(h + i);
#pragma GCC unroll 8
        for (size_t j = 0; j < 8; j++)
            a[j] = _mm512_fmadd_ps(x, lm_w16(w, e + j * C + i, dt), a[j]);
    }
    for (size_t j = 0; j < 8; j++) {
        float s = op_hsum16(a[j]);
        for (size_t q = i; q < C; q++) {
            size_t f = e + j * C + q;
            s = fmaf(h[q], op_widen1(w, f, f / OP_Q8_BLOCK), s);
        }
        out[j] = s;
    }
}
#endif

/* dot(a, w[off .. off + n)) on the best path. */
static float dot16(const float *a, const op_w *w, size_t off, size_t n)
{
#if HAVE_X86
    if (op_use_avx2()) return dot16_avx2(a, w, off, n);
#endif
    return dot16_c(a, w, off, n);
}

float op_dot(const float *a, const float *b, size_t n)
{
    op_w w = {b, NULL, OP_F32, 0, NULL, NULL};
    return dot16(a, &w, 0, n);
}

float op_dot_w(const float *a, const op_w *w, size_t off, size_t n)
{
    return dot16(a, w, off, n);
}

/* ---- LM head: logits (T,V) = h (T,C) @ wte^T ------------------------------ */

#define LM_VROWS 64 /* vocabulary rows per task */

typedef struct {
    float *out;
    const float *h;
    const op_w *wte;
    size_t T, C, V;
} lm_ctx;

#if HAVE_X86
/*
 * 9 to 24 rows of h: the task's vocabulary rows (LM_VROWS, 192 KB of F32
 * wte) are taken four rows of h at a time, one pass of 4 x 4 tiles each,
 * so that the four rows (12 KB) stay in L1 beside the wte tile, and the
 * wte rows come from memory in the first pass (prefetched) and from L2 in
 * the others. Taking all rows of h on each wte tile (the tiles below)
 * reads h from L2 for every tile once it is over 8 rows (24 KB).
 * bench_decode, GPT-2 small panel files, 2 threads, 2-3 alternated rounds,
 * LM head ms a step: F32 12 rows 5.6-5.8 against 7.0-7.1, 16 rows
 * 6.8-7.1 against 7.8-8.1, 24 rows 8.4-8.9 against 9.6-9.7, F16 16 rows
 * 4.7-4.9 against 5.3-5.6, q8 16 rows 4.8 against 5.0; at 32 rows and
 * more no better (F32 32 rows 10.5-10.9 against 10.2-10.6, 64 rows 18.6-18.8
 * against 18.0-18.3); BF16's 32-element tiles (lm_rows_bf16_avx512) were
 * no faster so (16 rows 5.96-6.10 against 5.92-5.98). The same operations
 * for every output, in the same order, so the same bits.
 */
#define LM_L1_ROWS 8
#define LM_CHUNKED_MAX 24
OP_AVX512 __attribute__((always_inline)) static inline void
lm_rows_chunked_avx512_t(const lm_ctx *c, size_t v0, size_t v1, size_t ahead, const op_dtype dt)
{
    const size_t esize = mm_esize_lm(dt);
    for (size_t t0 = 0; t0 < c->T; t0 += 4) {
        size_t t1 = t0 + 4 < c->T ? t0 + 4 : c->T;
        for (size_t v = v0; v + 4 <= v1; v += 4) {
            const char *pf = t0 == 0 && v + ahead + 4 <= c->V
                                 ? (const char *)c->wte->p + (v + ahead) * c->C * esize
                                 : NULL;
            if (t1 - t0 == 4) {
                dot_4x4_avx512(c->out + t0 * c->V + v, c->V, c->h + t0 * c->C, c->wte, v, c->C, pf,
                               0, 1, dt);
                continue;
            }
            for (size_t t = t0, g = 0; t < t1; t++, g++)
                dot_1x4_avx512(c->out + t * c->V + v, c->h + t * c->C, c->wte, v, c->C, pf, g,
                               t1 - t0, dt);
        }
    }
}

/* Vocabulary rows [v0, v0 + 4 * n4) in tiles of four, every row of h. */
OP_AVX512 __attribute__((always_inline)) static inline void
lm_rows_avx512_t(const lm_ctx *c, size_t v0, size_t v1, const op_dtype dt)
{
    const size_t esize = mm_esize_lm(dt);
    size_t ahead = LM_PF_BYTES / (4 * c->C * esize) * 4 + 4; /* rows, a multiple of 4 */
    size_t v = v0;
    /* F32, one row: tiles of eight vocabulary rows (dot_1x8_avx512). The
     * narrow formats, which prefetch, lost with them. */
    if (dt == OP_F32 && c->T == 1)
        for (; v + 8 <= v1; v += 8) dot_1x8_avx512(c->out + v, c->h, c->wte, v, c->C, NULL, dt);
    if (c->T > LM_L1_ROWS && c->T <= LM_CHUNKED_MAX) {
        lm_rows_chunked_avx512_t(c, v, v1, ahead, dt);
        return;
    }
    for (; v + 4 <= v1; v += 4) {
        const char *pf = (dt != OP_F32 || c->T >= LM_PF_F32_ROWS) && v + ahead + 4 <= c->V
                             ? (const char *)c->wte->p + (v + ahead) * c->C * esize
                             : NULL;
        size_t t = 0, g = 0, G = c->T / 4 + c->T % 4;
        for (; t + 4 <= c->T; t += 4, g++)
            dot_4x4_avx512(c->out + t * c->V + v, c->V, c->h + t * c->C, c->wte, v, c->C,
                           g < G ? pf : NULL, g, G, dt);
        for (; t < c->T; t++, g++)
            dot_1x4_avx512(c->out + t * c->V + v, c->h + t * c->C, c->wte, v, c->C,
                           g < G ? pf : NULL, g, G, dt);
    }
}

OP_AVX512BW static void lm_rows_bf16_avx512(const lm_ctx *c, size_t v0, size_t v1)
{
    size_t ahead = LM_PF_BYTES / (8 * c->C) * 4 + 4; /* rows, as lm_rows_avx512_t */
    for (size_t v = v0; v + 4 <= v1; v += 4) {
        const char *pf =
            v + ahead + 4 <= c->V ? (const char *)c->wte->p + (v + ahead) * c->C * 2 : NULL;
        size_t t = 0, g = 0, G = c->T / 4 + c->T % 4;
        for (; t + 4 <= c->T; t += 4, g++)
            dot_rx4_bf16(c->out + t * c->V + v, c->V, c->h + t * c->C, c->wte, v, c->C,
                         g < G ? pf : NULL, g, G, 4);
        for (; t < c->T; t++, g++)
            dot_rx4_bf16(c->out + t * c->V + v, c->V, c->h + t * c->C, c->wte, v, c->C,
                         g < G ? pf : NULL, g, G, 1);
    }
}

OP_AVX512 static void lm_rows_avx512(const lm_ctx *c, size_t v0, size_t v1)
{
    if (c->wte->dt == OP_BF16 && op_use_avx512bw()) {
        lm_rows_bf16_avx512(c, v0, v1);
        return;
    }
    switch (c->wte->dt) {
    case OP_F32: lm_rows_avx512_t(c, v0, v1, OP_F32); break;
    case OP_F16: lm_rows_avx512_t(c, v0, v1, OP_F16); break;
    case OP_BF16: lm_rows_avx512_t(c, v0, v1, OP_BF16); break;
    case OP_Q8: lm_rows_avx512_t(c, v0, v1, OP_Q8); break;
    }
}
#endif

#if HAVE_X86
/* One row of h (decode of one sequence) against the 16-bit wte rows
 * [v0, v1), a thread's whole share: the share is cut into two runs, and
 * the k-th vocabulary row of each run is taken at once, one row after the
 * other down each run, so that the thread reads two sequential streams
 * (the 4-row tiles read four rows side by side, 1.5 KB each, which the
 * hardware prefetchers follow poorly). Each row's sum is one accumulator
 * in dot16's lane order (BF16 32 elements a step, lo then hi: the order
 * of i). bench_decode, GPT-2 small panel files, 1 sequence, 3 alternated
 * rounds, LM head a step: BF16 1.58-1.70 ms against 2.14-2.17 with the
 * prefetching 4-row tiles, F16 1.12-1.52 against 1.93-2.10; three or four
 * runs were no better, F32 (tiles of eight) and q8 no faster with two. */
OP_AVX512BW __attribute__((always_inline)) static inline void
lm_1row_runs_t(const lm_ctx *c, size_t v0, size_t v1, const op_dtype dt)
{
    const size_t C = c->C, per = (v1 - v0) / 2;
    const float *h = c->h;
    for (size_t r = 0; r < per; r++) {
        size_t row[2] = {v0 + r, v0 + per + r};
        __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        size_t i = 0;
        if (dt == OP_BF16)
            for (; i + 32 <= C; i += 32) {
                __m512 xl = _mm512_loadu_ps(h + i), xh = _mm512_loadu_ps(h + i + 16);
#pragma GCC unroll 2
                for (size_t s = 0; s < 2; s++) {
                    __m512 lo, hi;
                    op_bf16x32((const uint16_t *)c->wte->p + row[s] * C + i, &lo, &hi);
                    acc[s] = _mm512_fmadd_ps(xl, lo, acc[s]);
                    acc[s] = _mm512_fmadd_ps(xh, hi, acc[s]);
                }
            }
        for (; i + 16 <= C; i += 16) {
            __m512 x = _mm512_loadu_ps(h + i);
#pragma GCC unroll 2
            for (size_t s = 0; s < 2; s++)
                acc[s] = _mm512_fmadd_ps(x, lm_w16(c->wte, row[s] * C + i, dt), acc[s]);
        }
#pragma GCC unroll 2
        for (size_t s = 0; s < 2; s++) {
            float sum = op_hsum16(acc[s]);
            for (size_t q = i; q < C; q++) {
                size_t f = row[s] * C + q;
                sum = fmaf(h[q], op_widen1(c->wte, f, f / OP_Q8_BLOCK), sum);
            }
            c->out[row[s]] = sum;
        }
    }
    if ((v1 - v0) % 2 == 1) c->out[v1 - 1] = dot16(h, c->wte, (v1 - 1) * C, C);
}

OP_AVX512BW static void lm_1row_runs(const lm_ctx *c, size_t v0, size_t v1)
{
    if (c->wte->dt == OP_BF16)
        lm_1row_runs_t(c, v0, v1, OP_BF16);
    else
        lm_1row_runs_t(c, v0, v1, OP_F16);
}
#endif

static void lm_task(void *arg, size_t begin, size_t end, size_t tid)
{
    (void)tid;
    const lm_ctx *c = arg;
#if HAVE_X86
    if (c->T == 1 && (c->wte->dt == OP_BF16 || c->wte->dt == OP_F16) && op_use_avx512bw()) {
        size_t v0 = begin * LM_VROWS, v1 = end * LM_VROWS < c->V ? end * LM_VROWS : c->V;
        lm_1row_runs(c, v0, v1);
        return;
    }
#endif
    for (size_t blk = begin; blk < end; blk++) {
        size_t v0 = blk * LM_VROWS, v1 = v0 + LM_VROWS < c->V ? v0 + LM_VROWS : c->V;
        size_t v = v0;
#if HAVE_X86
        if (op_use_avx512()) {
            lm_rows_avx512(c, v0, v1);
            v = v0 + (v1 - v0) / 4 * 4;
        }
#endif
        for (; v < v1; v++)
            for (size_t t = 0; t < c->T; t++)
                c->out[t * c->V + v] = dot16(c->h + t * c->C, c->wte, v * c->C, c->C);
    }
}

void op_lm_head(op_pool *pool, float *scratch, float *out, const float *h, const op_w *wte,
                size_t T, size_t C, size_t V)
{
#if HAVE_X86
    /* The "avx512-bf16" level: the pair copy of wte (op_matmul_bf16.c,
     * the projections' kernels with no bias). */
    if (wte->dt == OP_BF16 && wte->pairs != NULL && op_use_avx512bf16()) {
        op_lm_head_bf16dp(pool, scratch, out, h, wte, T, C, V);
        return;
    }
#else
    (void)scratch;
#endif
    lm_ctx c = {out, h, wte, T, C, V};
    op_pool_run(pool, (V + LM_VROWS - 1) / LM_VROWS, lm_task, &c);
}
