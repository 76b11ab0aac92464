/*
 * engine/op_lora.c: a LoRA adapter's low-rank product added to a
 * projection's output, for the rows of one step that share the adapter.
 *
 * After the base matmul out (T, N) = in (T, K) @ W + b over every row (the
 * base path unchanged), each row t of the group gets
 *   u[k]      = dot(in[t], A[k])                 k < r, op_dot's order
 *   acc[n]    = u[0] Bt[0][n], then + u[k] Bt[k][n] by FMA, k increasing
 *   out[t][n] = fma(scaling, acc[n], out[t][n])
 * with A (r, K) and Bt (r, N) = B^T in F32, F16 or BF16 (widened exactly). Every
 * element depends only on its own row of `in` and on the adapter: not on
 * the group's size, the other rows of the step, the thread that computes
 * it or the instruction set (an FMA is one rounding on every path), so a
 * sequence gets the same bits alone, in any batch and in prefill chunks of
 * any size. Rows are taken OP_LORA_ROWS at a time (u's scratch), every
 * group of a projection in one pool run.
 */
#include "internal.h"

#include <math.h>

/* One group's chunk of at most OP_LORA_ROWS rows, as a thread works it. */
typedef struct {
    const float *u; /* (nrows, r) */
    float *out;
    const size_t *rows;
    size_t nrows;
    const op_w *Bt;
    size_t r, N;
    float scaling;
} lora_ctx;

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
    else if (c->Bt->dt == OP_F16)
        lora_up_avx512_t(c, n0, n1, OP_F16);
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
    else if (c->Bt->dt == OP_F16)
        lora_up_avx2_t(c, n0, n1, OP_F16);
    else
        lora_up_avx2_t(c, n0, n1, OP_F32);
}
#endif

/* The columns [n0, n1) of a chunk, on the best path. */
static void lora_up(const lora_ctx *c, size_t n0, size_t n1)
{
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

typedef struct {
    float *u; /* per thread: OP_LORA_ROWS x OP_LORA_MAX_RANK */
    float *out;
    const float *in;
    const op_lora_group *g;
    size_t ng, K, N;
} lora_task_ctx;

/* One thread's columns blocks [begin, end) of OP_LORA_COLS, for every
 * group: each chunk's u = x A^T computed by every thread for itself (a
 * barrier between the two halves cost more than the repeated dot
 * products: one pool run a projection, not two a group), then its
 * columns. */
#define OP_LORA_COLS 16
/* Below this many FMAs (a decode step of up to 16 rank-8 rows at GPT-2
 * small's widths: 16 x 8 x 3840 = 492K for c_fc) the product runs on the
 * step thread alone: a pool run (a hand-off to the other threads and the
 * wait for them) was measured dearer on 2 vCPUs (docs/benchmarks.md, "LoRA
 * adapters"). */
#define OP_LORA_INLINE_FMAS (1u << 20)
static void lora_task(void *p, size_t begin, size_t end, size_t tid)
{
    const lora_task_ctx *t = p;
    float *u = t->u + tid * (size_t)OP_LORA_ROWS * OP_LORA_MAX_RANK;
    size_t n0 = begin * OP_LORA_COLS, n1 = end * OP_LORA_COLS;
    if (n1 > t->N) n1 = t->N;
    for (size_t gi = 0; gi < t->ng; gi++) {
        const op_lora_group *g = &t->g[gi];
        for (size_t g0 = 0; g0 < g->nrows; g0 += OP_LORA_ROWS) {
            lora_ctx c = {.u = u,
                          .out = t->out,
                          .rows = g->rows + g0,
                          .nrows = g->nrows - g0 < OP_LORA_ROWS ? g->nrows - g0 : OP_LORA_ROWS,
                          .Bt = g->bt,
                          .r = g->r,
                          .N = t->N,
                          .scaling = g->scaling};
            for (size_t i = 0; i < c.nrows; i++)
                for (size_t k = 0; k < g->r; k++)
                    u[i * g->r + k] = op_dot_w(t->in + c.rows[i] * t->K, g->a, k * t->K, t->K);
            lora_up(&c, n0, n1);
        }
    }
}

void op_lora(op_pool *pool, float *u, float *out, const float *in, const op_lora_group *g,
             size_t ng, size_t K, size_t N)
{
    if (ng == 0) return;
    lora_task_ctx t = {.u = u, .out = out, .in = in, .g = g, .ng = ng, .K = K, .N = N};
    size_t blocks = (N + OP_LORA_COLS - 1) / OP_LORA_COLS, fmas = 0;
    for (size_t i = 0; i < ng; i++) fmas += g[i].nrows * g[i].r * (K + N);
    /* Small products run on this thread alone (thread 0's scratch): a pool
     * run costs more than they do. Which thread computes an element
     * changes none of its bits. */
    if (fmas < OP_LORA_INLINE_FMAS)
        lora_task(&t, 0, blocks, 0);
    else
        op_pool_run(pool, blocks, lora_task, &t);
}
