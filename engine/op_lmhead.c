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
 * the portable code in an array: the same operations on every path.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

/* ---- The reference: one dot product in the fixed order ----------------- */

static float dot16_c(const float *a, const float *b, size_t n)
{
    float l[16] = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (size_t j = 0; j < 16; j++) l[j] = fmaf(a[i + j], b[i + j], l[j]);
    float m[8];
    for (size_t j = 0; j < 8; j++) m[j] = l[j] + l[j + 8];
    float s = ((m[0] + m[4]) + (m[2] + m[6])) + ((m[1] + m[5]) + (m[3] + m[7]));
    for (; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

#if HAVE_X86
__attribute__((target("avx2,fma"))) static float dot16_avx2(const float *a, const float *b,
                                                            size_t n)
{
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), hi);
    }
    float s = op_hsum8(_mm256_add_ps(lo, hi));
    for (; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

/* Four rows of h against four rows of wte: 16 dot products at once, each
 * with exactly dot16's operations. out[r * ldo + v]. */
__attribute__((target("avx512f"))) static void
dot_4x4_avx512(float *out, size_t ldo, const float *h, const float *w, size_t C)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) acc[r][v] = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= C; i += 16) {
        __m512 w0 = _mm512_loadu_ps(w + i), w1 = _mm512_loadu_ps(w + C + i);
        __m512 w2 = _mm512_loadu_ps(w + 2 * C + i), w3 = _mm512_loadu_ps(w + 3 * C + i);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            __m512 x = _mm512_loadu_ps(h + (size_t)r * C + i);
            acc[r][0] = _mm512_fmadd_ps(x, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(x, w1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(x, w2, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(x, w3, acc[r][3]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < 4; v++) {
            float s = op_hsum16(acc[r][v]);
            for (size_t j = i; j < C; j++) s = fmaf(h[(size_t)r * C + j], w[(size_t)v * C + j], s);
            out[(size_t)r * ldo + (size_t)v] = s;
        }
}

/* One row of h against four rows of wte (decode). */
__attribute__((target("avx512f"))) static void dot_1x4_avx512(float *out, const float *h,
                                                              const float *w, size_t C)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 16 <= C; i += 16) {
        __m512 x = _mm512_loadu_ps(h + i);
        a0 = _mm512_fmadd_ps(x, _mm512_loadu_ps(w + i), a0);
        a1 = _mm512_fmadd_ps(x, _mm512_loadu_ps(w + C + i), a1);
        a2 = _mm512_fmadd_ps(x, _mm512_loadu_ps(w + 2 * C + i), a2);
        a3 = _mm512_fmadd_ps(x, _mm512_loadu_ps(w + 3 * C + i), a3);
    }
    float s[4] = {op_hsum16(a0), op_hsum16(a1), op_hsum16(a2), op_hsum16(a3)};
    for (int v = 0; v < 4; v++) {
        for (size_t j = i; j < C; j++) s[v] = fmaf(h[j], w[(size_t)v * C + j], s[v]);
        out[v] = s[v];
    }
}
#endif

float op_dot(const float *a, const float *b, size_t n)
{
#if HAVE_X86
    if (op_use_avx2()) return dot16_avx2(a, b, n);
#endif
    return dot16_c(a, b, n);
}

/* ---- LM head: logits (T,V) = h (T,C) @ wte^T ------------------------------ */

#define LM_VROWS 64 /* vocabulary rows per task */

typedef struct {
    float *out;
    const float *h, *wte;
    size_t T, C, V;
} lm_ctx;

static void lm_task(void *arg, size_t begin, size_t end, size_t tid)
{
    (void)tid;
    const lm_ctx *c = arg;
    for (size_t blk = begin; blk < end; blk++) {
        size_t v0 = blk * LM_VROWS, v1 = v0 + LM_VROWS < c->V ? v0 + LM_VROWS : c->V;
        size_t v = v0;
#if HAVE_X86
        if (op_use_avx512()) {
            for (; v + 4 <= v1; v += 4) {
                size_t t = 0;
                for (; t + 4 <= c->T; t += 4)
                    dot_4x4_avx512(c->out + t * c->V + v, c->V, c->h + t * c->C, c->wte + v * c->C,
                                   c->C);
                for (; t < c->T; t++)
                    dot_1x4_avx512(c->out + t * c->V + v, c->h + t * c->C, c->wte + v * c->C, c->C);
            }
        }
#endif
        for (; v < v1; v++)
            for (size_t t = 0; t < c->T; t++)
                c->out[t * c->V + v] = op_dot(c->h + t * c->C, c->wte + v * c->C, c->C);
    }
}

void op_lm_head(op_pool *pool, float *out, const float *h, const float *wte, size_t T, size_t C,
                size_t V)
{
    lm_ctx c = {out, h, wte, T, C, V};
    op_pool_run(pool, (V + LM_VROWS - 1) / LM_VROWS, lm_task, &c);
}
