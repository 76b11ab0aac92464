/*
 * engine/op_lora.c: a LoRA adapter's low-rank product added to a
 * projection's output, for the rows of one step that share the adapter.
 *
 * After the base matmul out (T, N) = in (T, K) @ W + b over every row (the
 * base path unchanged), each row t of the group gets
 *   u[k]      = dot(in[t], A[k])                 k < r, op_dot's order
 *   acc[n]    = u[0] Bt[0][n], then + u[k] Bt[k][n] by FMA, k increasing
 *   out[t][n] = fma(scaling, acc[n], out[t][n])
 * with A (r, K) and Bt (r, N) = B^T in F32 or BF16 (widened exactly). Every
 * element depends only on its own row of `in` and on the adapter: not on
 * the group's size, the other rows of the step, the thread that computes
 * it or the instruction set (an FMA is one rounding on every path), so a
 * sequence gets the same bits alone, in any batch and in prefill chunks of
 * any size. Rows are taken OP_LORA_ROWS at a time (u's scratch).
 */
#include "internal.h"

#include <math.h>

typedef struct {
    float *u; /* (nrows, r) */
    float *out;
    const float *in;
    const size_t *rows;
    size_t nrows;
    const op_w *A, *Bt;
    size_t r, K, N;
    float scaling;
} lora_ctx;

/* Phase 1: u[j] for j = row * r + k in [begin, end). */
static void lora_down(void *p, size_t begin, size_t end, size_t tid)
{
    (void)tid;
    const lora_ctx *c = p;
    for (size_t j = begin; j < end; j++) {
        size_t g = j / c->r, k = j % c->r;
        c->u[j] = op_dot_w(c->in + c->rows[g] * c->K, c->A, k * c->K, c->K);
    }
}

/* The reference: columns [n0, n1) of every row of the group. */
static void lora_up_c(const lora_ctx *c, size_t n0, size_t n1)
{
    for (size_t g = 0; g < c->nrows; g++) {
        const float *u = c->u + g * c->r;
        float *y = c->out + c->rows[g] * c->N;
        for (size_t n = n0; n < n1; n++) {
            float acc = 0.0f;
            for (size_t k = 0; k < c->r; k++)
                acc = fmaf(u[k], op_widen1(c->Bt, k * c->N + n, 0), acc);
            y[n] = fmaf(c->scaling, acc, y[n]);
        }
    }
}

#if HAVE_X86
OP_AVX512 __attribute__((always_inline)) static inline void
lora_up_avx512_t(const lora_ctx *c, size_t n0, size_t n1, const op_dtype dt)
{
    const __m512 s = _mm512_set1_ps(c->scaling);
    for (size_t g = 0; g < c->nrows; g++) {
        const float *u = c->u + g * c->r;
        float *y = c->out + c->rows[g] * c->N;
        size_t n = n0;
        for (; n + 16 <= n1; n += 16) {
            __m512 acc = _mm512_setzero_ps();
            for (size_t k = 0; k < c->r; k++)
                acc =
                    _mm512_fmadd_ps(_mm512_set1_ps(u[k]), op_ld16(c->Bt->p, k * c->N + n, dt), acc);
            _mm512_storeu_ps(y + n, _mm512_fmadd_ps(s, acc, _mm512_loadu_ps(y + n)));
        }
        for (; n < n1; n++) {
            float acc = 0.0f;
            for (size_t k = 0; k < c->r; k++)
                acc = fmaf(u[k], op_widen1(c->Bt, k * c->N + n, 0), acc);
            y[n] = fmaf(c->scaling, acc, y[n]);
        }
    }
}

OP_AVX512 static void lora_up_avx512(const lora_ctx *c, size_t n0, size_t n1)
{
    if (c->Bt->dt == OP_BF16)
        lora_up_avx512_t(c, n0, n1, OP_BF16);
    else
        lora_up_avx512_t(c, n0, n1, OP_F32);
}

OP_AVX2 __attribute__((always_inline)) static inline void
lora_up_avx2_t(const lora_ctx *c, size_t n0, size_t n1, const op_dtype dt)
{
    const __m256 s = _mm256_set1_ps(c->scaling);
    for (size_t g = 0; g < c->nrows; g++) {
        const float *u = c->u + g * c->r;
        float *y = c->out + c->rows[g] * c->N;
        size_t n = n0;
        for (; n + 8 <= n1; n += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (size_t k = 0; k < c->r; k++)
                acc =
                    _mm256_fmadd_ps(_mm256_set1_ps(u[k]), op_ld8(c->Bt->p, k * c->N + n, dt), acc);
            _mm256_storeu_ps(y + n, _mm256_fmadd_ps(s, acc, _mm256_loadu_ps(y + n)));
        }
        for (; n < n1; n++) {
            float acc = 0.0f;
            for (size_t k = 0; k < c->r; k++)
                acc = fmaf(u[k], op_widen1(c->Bt, k * c->N + n, 0), acc);
            y[n] = fmaf(c->scaling, acc, y[n]);
        }
    }
}

OP_AVX2 static void lora_up_avx2(const lora_ctx *c, size_t n0, size_t n1)
{
    if (c->Bt->dt == OP_BF16)
        lora_up_avx2_t(c, n0, n1, OP_BF16);
    else
        lora_up_avx2_t(c, n0, n1, OP_F32);
}
#endif

/* Phase 2: the column blocks [begin, end) of OP_LORA_COLS columns. */
#define OP_LORA_COLS 16
static void lora_up(void *p, size_t begin, size_t end, size_t tid)
{
    (void)tid;
    const lora_ctx *c = p;
    size_t n0 = begin * OP_LORA_COLS, n1 = end * OP_LORA_COLS;
    if (n1 > c->N) n1 = c->N;
#if HAVE_X86
    if (op_use_avx512()) {
        lora_up_avx512(c, n0, n1);
        return;
    }
    if (op_use_avx2()) {
        lora_up_avx2(c, n0, n1);
        return;
    }
#endif
    lora_up_c(c, n0, n1);
}

void op_lora(op_pool *pool, float *u, float *out, const float *in, const size_t *rows, size_t nrows,
             const op_w *A, const op_w *Bt, size_t r, size_t K, size_t N, float scaling)
{
    for (size_t g0 = 0; g0 < nrows; g0 += OP_LORA_ROWS) {
        lora_ctx c = {.u = u,
                      .out = out,
                      .in = in,
                      .rows = rows + g0,
                      .nrows = nrows - g0 < OP_LORA_ROWS ? nrows - g0 : OP_LORA_ROWS,
                      .A = A,
                      .Bt = Bt,
                      .r = r,
                      .K = K,
                      .N = N,
                      .scaling = scaling};
        op_pool_run(pool, c.nrows * r, lora_down, &c);
        op_pool_run(pool, (N + OP_LORA_COLS - 1) / OP_LORA_COLS, lora_up, &c);
    }
}
