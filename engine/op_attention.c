/*
 * engine/op_attention.c: causal attention of every row of a step over its
 * own sequence's positions in the paged KV cache.
 *
 * The reduction order, per row and head (att_task below, the reference):
 * scores[s] = op_dot(q, k_s) * (1 / sqrt(HS)) for s = 0..p in order, their
 * maximum, e_s = exp(scores[s] - max) summed by op_exp_sub_sum's fixed lane
 * order, then o = 0 and o += (e_s * (1 / sum)) * v_s by FMA for s = 0..p.
 * The AVX-512 tiles for head size 64 perform the same operations in the
 * same order for several rows or heads at once.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

/* ---- Attention -------------------------------------------------------------- */

typedef struct {
    float *att;
    const float *qkv;
    const eng_kv *kv;
    const eng_item *items;
    const size_t *row_item, *row_pos;
    size_t l, NH, HS;
    float *scores; /* nthreads x OP_ATT_ROWS x n_ctx */
    size_t n_ctx, T;
} att_ctx;

#if HAVE_X86
__attribute__((target("avx2,fma,f16c"))) static void axpy_avx2(float *y, float a, const float *x,
                                                               size_t n)
{
    __m256 va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}
#endif

/* y += a * x, one FMA per element (same bits on both paths). */
static void axpy(float *y, float a, const float *x, size_t n)
{
#if HAVE_X86
    if (op_use_avx2()) {
        axpy_avx2(y, a, x, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

/* Causal attention of one (row, head) over the row's sequence, positions
 * 0..p in order; K and V of this step's rows are already in the cache.
 * The reference order (and the path for other head sizes). */
static void att_task(void *arg, size_t begin, size_t end, size_t tid)
{
    const att_ctx *c = arg;
    size_t C = c->NH * c->HS;
    float *scores = c->scores + tid * OP_ATT_ROWS * c->n_ctx;
    float scale = 1.0f / sqrtf((float)c->HS);
    for (size_t job = begin; job < end; job++) {
        size_t t = job / c->NH, h = job % c->NH;
        const eng_seq *seq = c->items[c->row_item[t]].seq;
        size_t p = c->row_pos[t];
        const float *q = c->qkv + t * 3 * C + h * c->HS;
        float *o = c->att + t * C + h * c->HS;
        float maxv = -INFINITY;
        for (size_t s = 0; s <= p; s++) {
            float d = op_dot(q, kv_head(c->kv, seq, c->l, 0, h, s), c->HS) * scale;
            scores[s] = d;
            if (d > maxv) maxv = d;
        }
        float sum = op_exp_sub_sum(scores, p + 1, maxv);
        float inv = 1.0f / sum;
        memset(o, 0, c->HS * sizeof *o);
        for (size_t s = 0; s <= p; s++)
            axpy(o, scores[s] * inv, kv_head(c->kv, seq, c->l, 1, h, s), c->HS);
    }
}

#if HAVE_X86
/*
 * Head size 64 (every GPT-2): a tile of R consecutive rows of one sequence
 * (a prefill chunk) times G heads, R * G <= OP_ATT_ROWS, taken together:
 * each K and V load serves the tile's R rows, and its R * G chains are
 * independent, so they overlap. Prefill takes 4 rows x 1 head; a decode
 * row 1 row x 4 heads, which reads four neighbouring runs of the block
 * (kv_head: 16 KB in one piece for 16-position blocks). q and the outputs
 * stay in registers. Per row and head the operations are those of the
 * portable path, in the same order: the score of position s is a four-FMA
 * chain over the head's 64 lanes and a fixed horizontal sum (op_dot's),
 * the output is o += (score * inv) * v for s = 0..p by FMA (axpy's). The
 * cache is walked block by block, one address computation per block.
 */
__attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) static inline void
att_tile64_avx512(const att_ctx *c, const eng_seq *seq, size_t t0, size_t p0, size_t h0,
                  float *scores, const size_t R, const size_t G)
{
    size_t C = c->NH * 64, bl = c->kv->block_len, last = p0 + R - 1;
    size_t hstride = bl * 64;       /* from one head's keys in a block to the next's */
    const size_t stride = c->n_ctx; /* scores of tile entry i = r * G + g */
    float scale = 1.0f / sqrtf(64.0f);
    __m512 q[OP_ATT_ROWS][4], o[OP_ATT_ROWS][4];
    float mx[OP_ATT_ROWS], inv[OP_ATT_ROWS];
#pragma GCC unroll 4
    for (size_t i = 0; i < R * G; i++) {
        const float *qi = c->qkv + (t0 + i / G) * 3 * C + (h0 + i % G) * 64;
#pragma GCC unroll 4
        for (size_t j = 0; j < 4; j++) q[i][j] = _mm512_loadu_ps(qi + 16 * j);
        mx[i] = -INFINITY;
    }
    /* Positions 0..p0 are seen by every row, p0 + 1..last by the later
     * rows only. The loops over the tile are unrolled (R and G are
     * constants), so q and o stay in registers. */
    for (size_t s0 = 0; s0 <= last; s0 += bl) {
        size_t s1 = s0 + bl <= last + 1 ? s0 + bl : last + 1;
        const float *k = kv_head(c->kv, seq, c->l, 0, h0, s0);
        for (size_t s = s0; s < s1; s++, k += 64) {
            size_t first = s > p0 ? s - p0 : 0; /* rows before it do not see s */
#pragma GCC unroll 4
            for (size_t g = 0; g < G; g++) {
                const float *kg = k + g * hstride;
                __m512 k0 = _mm512_loadu_ps(kg), k1 = _mm512_loadu_ps(kg + 16),
                       k2 = _mm512_loadu_ps(kg + 32), k3 = _mm512_loadu_ps(kg + 48);
#pragma GCC unroll 4
                for (size_t r = 0; r < R; r++) {
                    if (r < first) continue;
                    size_t i = r * G + g;
                    __m512 acc = _mm512_fmadd_ps(q[i][0], k0, _mm512_setzero_ps());
                    acc = _mm512_fmadd_ps(q[i][1], k1, acc);
                    acc = _mm512_fmadd_ps(q[i][2], k2, acc);
                    acc = _mm512_fmadd_ps(q[i][3], k3, acc);
                    float d = op_hsum16(acc) * scale;
                    scores[i * stride + s] = d;
                    if (d > mx[i]) mx[i] = d;
                }
            }
        }
    }
#pragma GCC unroll 4
    for (size_t i = 0; i < R * G; i++) {
        inv[i] = 1.0f / op_exp_sub_sum(scores + i * stride, p0 + i / G + 1, mx[i]);
#pragma GCC unroll 4
        for (size_t j = 0; j < 4; j++) o[i][j] = _mm512_setzero_ps();
    }
    for (size_t s0 = 0; s0 <= last; s0 += bl) {
        size_t s1 = s0 + bl <= last + 1 ? s0 + bl : last + 1;
        const float *v = kv_head(c->kv, seq, c->l, 1, h0, s0);
        for (size_t s = s0; s < s1; s++, v += 64) {
            size_t first = s > p0 ? s - p0 : 0;
#pragma GCC unroll 4
            for (size_t g = 0; g < G; g++) {
                const float *vg = v + g * hstride;
                __m512 v0 = _mm512_loadu_ps(vg), v1 = _mm512_loadu_ps(vg + 16),
                       v2 = _mm512_loadu_ps(vg + 32), v3 = _mm512_loadu_ps(vg + 48);
#pragma GCC unroll 4
                for (size_t r = 0; r < R; r++) {
                    if (r < first) continue;
                    size_t i = r * G + g;
                    __m512 w = _mm512_set1_ps(scores[i * stride + s] * inv[i]);
                    o[i][0] = _mm512_fmadd_ps(w, v0, o[i][0]);
                    o[i][1] = _mm512_fmadd_ps(w, v1, o[i][1]);
                    o[i][2] = _mm512_fmadd_ps(w, v2, o[i][2]);
                    o[i][3] = _mm512_fmadd_ps(w, v3, o[i][3]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (size_t i = 0; i < R * G; i++) {
        float *out = c->att + (t0 + i / G) * C + (h0 + i % G) * 64;
#pragma GCC unroll 4
        for (size_t j = 0; j < 4; j++) _mm512_storeu_ps(out + 16 * j, o[i][j]);
    }
}

/* Jobs are (head, group of OP_ATT_ROWS rows), head by head so that a thread
 * going through one head's groups finds that head's K and V slices still in
 * its cache, and from the last group down: later rows of a prefill attend
 * to more positions, so the costly jobs are claimed first and the cheap
 * ones fill in at the end. Within a group, a run of rows of one sequence at
 * consecutive positions is one 4-row (or shorter) tile of this head; a
 * lone row (a decode row) is done with the next heads up to four at once,
 * by the job of the first of them. */
__attribute__((target("avx512f,avx2,fma,f16c"))) static void att64_task(void *arg, size_t begin,
                                                                        size_t end, size_t tid)
{
    const att_ctx *c = arg;
    float *scores = c->scores + tid * OP_ATT_ROWS * c->n_ctx;
    size_t ngroups = (c->T + OP_ATT_ROWS - 1) / OP_ATT_ROWS;
    for (size_t job = begin; job < end; job++) {
        size_t j = ngroups * c->NH - 1 - job, h = j / ngroups, g = j % ngroups;
        size_t t = g * OP_ATT_ROWS, tend = t + OP_ATT_ROWS < c->T ? t + OP_ATT_ROWS : c->T;
        while (t < tend) {
            size_t n = 1;
            while (t + n < tend && c->row_item[t + n] == c->row_item[t]
                   && c->row_pos[t + n] == c->row_pos[t] + n)
                n++;
            const eng_seq *seq = c->items[c->row_item[t]].seq;
            size_t p0 = c->row_pos[t];
            switch (n) {
            case 4: att_tile64_avx512(c, seq, t, p0, h, scores, 4, 1); break;
            case 3: att_tile64_avx512(c, seq, t, p0, h, scores, 3, 1); break;
            case 2: att_tile64_avx512(c, seq, t, p0, h, scores, 2, 1); break;
            default:
                if (h % 4 != 0) break;
                switch (c->NH - h < 4 ? c->NH - h : 4) {
                case 4: att_tile64_avx512(c, seq, t, p0, h, scores, 1, 4); break;
                case 3: att_tile64_avx512(c, seq, t, p0, h, scores, 1, 3); break;
                case 2: att_tile64_avx512(c, seq, t, p0, h, scores, 1, 2); break;
                default: att_tile64_avx512(c, seq, t, p0, h, scores, 1, 1); break;
                }
                break;
            }
            t += n;
        }
    }
}
#endif

void op_attention(op_pool *pool, float *att, const float *qkv, const eng_kv *kv,
                  const eng_item *items, const size_t *row_item, const size_t *row_pos, size_t T,
                  size_t l, size_t NH, size_t HS, float *scores, size_t n_ctx)
{
    att_ctx c = {att, qkv, kv, items, row_item, row_pos, l, NH, HS, scores, n_ctx, T};
#if HAVE_X86
    if (HS == 64 && op_use_avx512()) {
        op_pool_run_chunks(pool, (T + OP_ATT_ROWS - 1) / OP_ATT_ROWS * NH, 1, att64_task, &c);
        return;
    }
#endif
    op_pool_run_chunks(pool, T * NH, 1, att_task, &c);
}
