/*
 * engine/op_elementwise.c: exp, GELU, the softmax sums and layer norm.
 *
 * The plain scalar forms come first (exp_c1, gelu_c1, exp_sub_sum_c,
 * ln_task): they are the reference. The AVX2 forms perform the same
 * operations in the same order lane by lane, so they give the same bits;
 * libm's expf would differ between its scalar and any vector form, which
 * is why exp is our own.
 */
#include "internal.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- exp, tanh and GELU with one set of operations on every path ---------- */

/*
 * exp(x) for x in [-87, 88] (clamped): n = nearest(x log2 e), r = x - n ln 2
 * (ln 2 in two parts), e^r by a degree-6 Horner polynomial with FMAs (error
 * about 1 ulp on |r| <= ln2/2), times 2^n through the exponent bits. The
 * AVX2 code performs the same operations, so both give the same bits; libm's
 * expf would differ between its scalar and any vector form.
 */
#define EXP_LO -87.0f
#define EXP_HI 88.0f
static const float exp_c[7] = {1.0f, 1.0f, 0.5f, 1.0f / 6, 1.0f / 24, 1.0f / 120, 1.0f / 720};

static float exp_c1(float x)
{
    x = x < EXP_LO ? EXP_LO : x > EXP_HI ? EXP_HI : x;
    float n = nearbyintf(x * 1.44269504088896341f);
    float r = fmaf(n, -0.693145751953125f, x);
    r = fmaf(n, -1.428606765330187045e-06f, r);
    float p = exp_c[6];
    for (int k = 5; k >= 0; k--) p = fmaf(p, r, exp_c[k]);
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* GELU, tanh approximation (GPT-2's "gelu_new"), with
 * tanh(u) = 1 - 2 / (exp(2u) + 1). */
static float gelu_c1(float v)
{
    float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    float t = 1.0f - 2.0f / (exp_c1(2.0f * u) + 1.0f);
    return 0.5f * v * (1.0f + t);
}

/* x[i] = exp(x[i] - m), returning the sum: eight lanes, lane j summing
 * i = j, j + 8, ...; the tree ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7));
 * then the tail in order. exp_sub_sum_avx2 holds the lanes in a register. */
static float exp_sub_sum_c(float *x, size_t n, float m)
{
    float l[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++) {
            x[i + j] = exp_c1(x[i + j] - m);
            l[j] += x[i + j];
        }
    float s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    for (; i < n; i++) {
        x[i] = exp_c1(x[i] - m);
        s += x[i];
    }
    return s;
}

#if HAVE_X86
__attribute__((target("avx2,fma,f16c"), always_inline)) static inline __m256 exp_avx2(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693145751953125f), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(exp_c[6]);
    for (int k = 5; k >= 0; k--) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(exp_c[k]));
    __m256i bits =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

__attribute__((target("avx2,fma,f16c"))) static void gelu_avx2(float *x, size_t n)
{
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f),
                 two = _mm256_set1_ps(2.0f), s = _mm256_set1_ps(0.7978845608028654f),
                 a = _mm256_set1_ps(0.044715f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        /* the scalar expression, operation by operation: ((a * v) * v) * v */
        __m256 cube = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(a, v), v), v);
        __m256 u = _mm256_mul_ps(s, _mm256_add_ps(v, cube));
        __m256 e = exp_avx2(_mm256_mul_ps(two, u));
        __m256 t = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(e, one)));
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, t)));
    }
    for (; i < n; i++) x[i] = gelu_c1(x[i]);
}

/* x[i] = exp(x[i] - m), returning the sum in lane order then the tail. */
__attribute__((target("avx2,fma,f16c"))) static float exp_sub_sum_avx2(float *x, size_t n, float m)
{
    __m256 vm = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float s = op_hsum8(acc);
    for (; i < n; i++) {
        x[i] = exp_c1(x[i] - m);
        s += x[i];
    }
    return s;
}
#endif

float op_exp_sub_sum(float *x, size_t n, float m)
{
#if HAVE_X86
    if (op_use_avx2()) return exp_sub_sum_avx2(x, n, m);
#endif
    return exp_sub_sum_c(x, n, m);
}

/* ---- Widening weights ------------------------------------------------------ */

#if HAVE_X86
/* F16C and the BF16 shift give op_widen1's floats, eight at a time. */
OP_AVX2 static size_t widen16_avx2(float *dst, const op_w *w, size_t off, size_t n)
{
    size_t i = 0;
    if (w->dt == OP_F16)
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, op_ld8(w->p, off + i, OP_F16));
    if (w->dt == OP_BF16)
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, op_ld8(w->p, off + i, OP_BF16));
    return i;
}
#endif

void op_widen(float *dst, const op_w *w, size_t off, size_t n)
{
    if (w->dt == OP_F32) {
        memcpy(dst, (const float *)w->p + off, n * sizeof(float));
        return;
    }
    size_t i = 0;
#if HAVE_X86
    if (op_use_avx2()) i = widen16_avx2(dst, w, off, n);
#endif
    for (; i < n; i++) dst[i] = op_widen1(w, off + i, (off + i) / OP_Q8_BLOCK);
}

/* ---- Layer norm and GELU, by rows ----------------------------------------- */

typedef struct {
    float *out;
    const float *in;
    const op_w *g, *b; /* (C) in any 16- or 32-bit float format */
    size_t C;
    float eps;
} ln_ctx;

#define LN_CHUNK 64

/* Mean and variance in double, so the result does not drift with width. */
static void ln_task(void *arg, size_t begin, size_t end, size_t tid)
{
    (void)tid;
    const ln_ctx *c = arg;
    for (size_t t = begin; t < end; t++) {
        const float *x = c->in + t * c->C;
        float *y = c->out + t * c->C;
        double mean = 0, var = 0;
        for (size_t i = 0; i < c->C; i++) mean += x[i];
        mean /= (double)c->C;
        for (size_t i = 0; i < c->C; i++) var += (x[i] - mean) * (x[i] - mean);
        var /= (double)c->C;
        float rstd = (float)(1.0 / sqrt(var + c->eps));
        float m = (float)mean;
        float g[LN_CHUNK], b[LN_CHUNK]; /* widened, chunk by chunk */
        for (size_t i0 = 0; i0 < c->C; i0 += LN_CHUNK) {
            size_t n = c->C - i0 < LN_CHUNK ? c->C - i0 : LN_CHUNK;
            op_widen(g, c->g, i0, n);
            op_widen(b, c->b, i0, n);
            for (size_t i = 0; i < n; i++) y[i0 + i] = (x[i0 + i] - m) * rstd * g[i] + b[i];
        }
    }
}

void op_layernorm(op_pool *pool, float *out, const float *in, const op_w *g, const op_w *b,
                  size_t T, size_t C, float eps)
{
    ln_ctx c = {out, in, g, b, C, eps};
    op_pool_run(pool, T, ln_task, &c);
}

typedef struct {
    float *x;
    size_t n;
} gelu_ctx;

#define GELU_CHUNK 4096

static void gelu_task(void *arg, size_t begin, size_t end, size_t tid)
{
    (void)tid;
    const gelu_ctx *c = arg;
    size_t i0 = begin * GELU_CHUNK, i1 = end * GELU_CHUNK < c->n ? end * GELU_CHUNK : c->n;
#if HAVE_X86
    if (op_use_avx2()) {
        gelu_avx2(c->x + i0, i1 - i0);
        return;
    }
#endif
    for (size_t i = i0; i < i1; i++) c->x[i] = gelu_c1(c->x[i]);
}

void op_gelu(op_pool *pool, float *x, size_t n)
{
    gelu_ctx c = {x, n};
    op_pool_run(pool, (n + GELU_CHUNK - 1) / GELU_CHUNK, gelu_task, &c);
}
