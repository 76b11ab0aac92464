/*
 * engine/op_matmul_q8.c: op_matmul for Q8 weights on AVX512_VNNI
 * (VPDPBUSD), the kernel level "avx512-vnni" (op_dispatch.c). Taken for
 * every row count, one row included, for every Q8 W whose quad copy was
 * built (op_w_quads_build: the model's projections at load); lower levels
 * keep op_matmul.c's widening kernels and their F32 contract. The LM head
 * (op_lmhead.c) keeps its widening kernels at every level.
 *
 * The reduction order (the contract of this level, kernels.h
 * op_q8_quantize and op_q8_block): each input row is quantized per block
 * of 32 along K to int8 xq with one F32 scale d per block (d = max|x| /
 * 127, xq = x / d rounded to nearest even, clamped to +-127); then
 * out[t][n] = b[n], and for each block B in increasing order
 * out[t][n] = fmaf((float)isum, d_B * s_B[n], out[t][n]) with isum the
 * exact int32 sum over B of xq[k] * q[k][n]. A last partial block pads
 * both with zeros. Nothing depends on T, the tile, the thread or the
 * layout, so the bits are batch-invariant (tests/test_engine.c checks them
 * against that C for every row count 1..70 and 261, both file layouts,
 * whole and partial blocks).
 *
 * VPDPBUSD multiplies unsigned bytes by signed ones: the inputs go in as
 * xu = xq + 128 (1..255), and the excess 128 * sum over B of q[k][n] is
 * taken off: the tiles of 5 rows and more start each block's int32
 * accumulator at -128 * that sum (the start values, computed at load);
 * up to 4 rows, where memory bounds the step, the kernels sum it
 * themselves by VPDPBUSD of 128 against the same weights and subtract it,
 * so as to read no more bytes than the file's q8. Every term is exact: per
 * block and column the products are at most 32 x 255 x 128 = 1044480 in
 * size and the start value or excess at most 128 x 32 x 128 = 524288, far
 * inside int32, and the result equals isum whatever order VPDPBUSD adds its
 * four products and the groups in; |isum| <= 32 x 127 x 128 < 2^24, so
 * (float)isum is exact.
 *
 * Weights: VPDPBUSD wants four consecutive k of a column in one 32-bit
 * lane, which neither file layout has. The quad copy has it: built once at
 * load from either layout, panels of 64 columns (the last padded with zero
 * columns), each panel's blocks of 32 k one after the other (a last
 * partial block padded with zero rows), a block being MMQ_BLOCK_BYTES:
 *   8 groups of 4 k, each 64 lanes of 4 bytes (lane i: column 64 p + i,
 *       byte j: k = 32 b + 4 g + j), 2048 bytes;
 *   the block's 64 F32 weight scales s_B[n], 256 bytes;
 * one contiguous run of 2304 bytes, 1.125 bytes a weight as in the file.
 * After all the blocks, the start values: per panel and block 64 int32
 * -128 * sum over B of q[k][n] (256 bytes), read by the tiles of 5 rows
 * and more only. It costs private memory the size of the projections as
 * stored and a ninth more (GPT-2 small: about 106 MB) in place of the
 * file's pages, which this level never touches.
 */
#include "matmul.h"

#include <stdlib.h>
#include <string.h>

/* Rows per chunk: the chunk's quantized inputs live in the shared part of
 * the scratch, after the threads' parts. */
#define MMQ_CHUNK 256
#define MMQ_GROUPS (OP_Q8_BLOCK / 4)           /* groups of 4 k in a block */
#define MMQ_SCALES (MMQ_GROUPS * OP_PANEL * 4) /* where a block's scales start */
#define MMQ_BLOCK_BYTES (MMQ_SCALES + OP_PANEL * 4)

/* A quantized input row: ceil(K / 32) blocks of 32 bytes xu = xq + 128,
 * then the blocks' F32 scales d: 36 bytes, 9 floats, a block. */
static size_t mmq_row_bytes(size_t KB)
{
    return KB * (OP_Q8_BLOCK + sizeof(float));
}

size_t op_matmul_q8_scratch_floats(size_t K)
{
    return MMQ_CHUNK * mmq_row_bytes((K + OP_Q8_BLOCK - 1) / OP_Q8_BLOCK) / sizeof(float);
}

/* The blocks of all panels, then the start values: per panel and block,
 * 64 int32. */
static size_t mmq_blocks_bytes(size_t K, size_t N)
{
    return (N + OP_PANEL - 1) / OP_PANEL * ((K + OP_Q8_BLOCK - 1) / OP_Q8_BLOCK) * MMQ_BLOCK_BYTES;
}

size_t op_w_quads_bytes(size_t K, size_t N)
{
    return mmq_blocks_bytes(K, N) / MMQ_BLOCK_BYTES * (MMQ_BLOCK_BYTES + OP_PANEL * 4);
}

int op_w_quads_build(op_w *w, size_t K, size_t N)
{
    w->quads = NULL;
    if (w->dt != OP_Q8 || !op_use_avx512vnni() || K == 0 || N == 0) return 0;
    const size_t KB = (K + OP_Q8_BLOCK - 1) / OP_Q8_BLOCK, NP = (N + OP_PANEL - 1) / OP_PANEL;
    uint8_t *p = aligned_alloc(64, op_w_quads_bytes(K, N));
    if (p == NULL) return -1;
    const int8_t *q = w->p;
    uint8_t *starts = p + mmq_blocks_bytes(K, N);
    const mm_ctx at = {.W = *w, .K = K, .N = N}; /* for mm_wi, mm_si */
    for (size_t pn = 0; pn < NP; pn++) {
        size_t n0 = pn * OP_PANEL, cols = N - n0 < OP_PANEL ? N - n0 : OP_PANEL;
        for (size_t b = 0; b < KB; b++) {
            uint8_t *o = p + (pn * KB + b) * MMQ_BLOCK_BYTES;
            int32_t sum[OP_PANEL] = {0};
            memset(o, 0, MMQ_BLOCK_BYTES);
            memset(starts + (pn * KB + b) * OP_PANEL * 4, 0, OP_PANEL * 4);
            for (size_t kk = 0; kk < OP_Q8_BLOCK && b * OP_Q8_BLOCK + kk < K; kk++) {
                size_t k = b * OP_Q8_BLOCK + kk;
                /* Row k of these columns, in either layout (matmul.h, mm_wi:
                 * a panel's row and a row-major row are both contiguous). */
                const int8_t *row = q + mm_wi(&at, k, n0);
                uint8_t *lane = o + (kk / 4) * OP_PANEL * 4 + kk % 4;
                for (size_t i = 0; i < cols; i++) {
                    lane[4 * i] = (uint8_t)row[i];
                    sum[i] += row[i];
                }
            }
            for (size_t i = 0; i < cols; i++) {
                float s = w->scale[mm_si(&at, b * OP_Q8_BLOCK, n0 + i)];
                int32_t start = -128 * sum[i];
                memcpy(o + MMQ_SCALES + 4 * i, &s, sizeof s);
                memcpy(starts + ((pn * KB + b) * OP_PANEL + i) * 4, &start, sizeof start);
            }
        }
    }
    w->quads = p;
    return 0;
}

void op_w_quads_free(op_w *w)
{
    free((void *)w->quads);
    w->quads = NULL;
}

#if HAVE_X86
/* Up to this many rows, W is read once per step from memory, all of K at
 * once; more take k-ranges of MMQ_KC blocks (a panel's 20 KB), every 6-row
 * tile over a k-range before the next. */
#define MMQ_DIRECT_MAX 4
#define MMQ_ROWS 6 /* rows per tile (24 int32 accumulators) */
#define MMQ_KC 8

typedef struct {
    mm_ctx c;              /* out, in: the chunk's first row; T: its rows */
    const uint8_t *xq;     /* the chunk's rows quantized, mmq_row_bytes apart */
    const uint8_t *starts; /* W's start values (after its blocks) */
    size_t KB;             /* ceil(K / 32) */
    size_t thread_floats;
} mmq_ctx;

/* Rows [begin, end) of the chunk quantized (kernels.h, op_q8_quantize),
 * a block of 32 at a time: the same operations, lane by lane. The largest
 * |x| by VMAXPS with the running maximum second (a NaN never taken, so
 * the maximum of the rest, in any order); the division, rounding to
 * nearest even and clamps (VMAXPS and VMINPS with the bound second: a NaN
 * to -127) as op_q8_quantize's. */
OP_AVX512VNNI static void mmq_quantize(void *arg, size_t begin, size_t end, size_t tid)
{
    (void)tid;
    const mmq_ctx *m = arg;
    const size_t K = m->c.K, KB = m->KB;
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    const __m512i off = _mm512_set1_epi32(128);
    for (size_t t = begin; t < end; t++) {
        const float *x = m->c.in + t * K;
        uint8_t *row = (uint8_t *)m->xq + t * mmq_row_bytes(KB);
        for (size_t b = 0; b < KB; b++) {
            size_t k = b * OP_Q8_BLOCK, left = K - k;
            __mmask16 m0 = (__mmask16)(left >= 16 ? 0xFFFFu : (1u << left) - 1);
            __mmask16 m1 = (__mmask16)(left >= 32   ? 0xFFFFu
                                       : left <= 16 ? 0u
                                                    : (1u << (left - 16)) - 1);
            __m512 a = _mm512_maskz_loadu_ps(m0, x + k), c = _mm512_maskz_loadu_ps(m1, x + k + 16);
            __m512 mx = _mm512_max_ps(_mm512_abs_ps(a), _mm512_setzero_ps());
            mx = _mm512_max_ps(_mm512_abs_ps(c), mx);
            float d = _mm512_reduce_max_ps(mx) / 127.0f;
            memcpy(row + KB * OP_Q8_BLOCK + b * sizeof d, &d, sizeof d);
            uint8_t *xu = row + k;
            if (d == 0.0f) {
                memset(xu, 128, OP_Q8_BLOCK);
                continue;
            }
            /* Clamped, then rounded by the conversion (VCVTPS2DQ: the
             * current rounding mode, nearest even, as rintf): the same as
             * rounding first, as the bounds are integers. */
            __m512 dv = _mm512_set1_ps(d);
            __m512 ra = _mm512_min_ps(_mm512_max_ps(_mm512_div_ps(a, dv), lo), hi);
            __m512 rc = _mm512_min_ps(_mm512_max_ps(_mm512_div_ps(c, dv), lo), hi);
            _mm_storeu_si128((void *)xu,
                             _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(ra), off)));
            _mm_storeu_si128((void *)(xu + 16),
                             _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(rc), off)));
        }
    }
}

/* The columns of [n + 16 q, n + 16 q + 16) below N. */
static inline __mmask16 mmq_cols(size_t n, size_t q, size_t N)
{
    size_t c = n + 16 * q;
    return (__mmask16)(c >= N ? 0u : N - c >= 16 ? 0xFFFFu : (1u << (N - c)) - 1);
}

/* Four bytes of xu (group g of block b of row t) in every lane. */
OP_AVX512VNNI __attribute__((always_inline)) static inline __m512i
mmq_x4(const mmq_ctx *m, size_t t, size_t b, size_t g)
{
    int32_t v;
    memcpy(&v, m->xq + t * mmq_row_bytes(m->KB) + b * OP_Q8_BLOCK + 4 * g, sizeof v);
    return _mm512_set1_epi32(v);
}

static inline float mmq_d(const mmq_ctx *m, size_t t, size_t b)
{
    float d;
    memcpy(&d, m->xq + t * mmq_row_bytes(m->KB) + m->KB * OP_Q8_BLOCK + b * sizeof d, sizeof d);
    return d;
}

/*
 * One tile: R rows from t0 x the 64 columns from n (a panel; those past N
 * masked), blocks [b0, b1): out starts as the bias (b0 == 0) and takes
 * each block's FMA there, in L1 (48 accumulators, int and float, would not
 * fit the 32 registers). own: the excess of the offset summed here (up to
 * 4 rows), else the start values read.
 */
OP_AVX512VNNI __attribute__((always_inline)) static inline void
mmq_tile(const mmq_ctx *m, size_t t0, size_t n, size_t b0, size_t b1, const size_t R, const int own)
{
    const __m512i x128 = _mm512_set1_epi8((char)-128); /* 128 as unsigned bytes */
    const mm_ctx *c = &m->c;
    const size_t N = c->N;
    __mmask16 cm[4];
#pragma GCC unroll 4
    for (size_t q = 0; q < 4; q++) cm[q] = mmq_cols(n, q, N);
    if (b0 == 0)
#pragma GCC unroll 6
        for (size_t r = 0; r < R; r++)
#pragma GCC unroll 4
            for (size_t q = 0; q < 4; q++)
                _mm512_mask_storeu_ps(c->out + (t0 + r) * N + n + 16 * q, cm[q],
                                      _mm512_maskz_loadu_ps(cm[q], c->b + n + 16 * q));
    const uint8_t *w = c->W.quads + ((n / OP_PANEL) * m->KB + b0) * MMQ_BLOCK_BYTES;
    const uint8_t *st = m->starts + ((n / OP_PANEL) * m->KB + b0) * OP_PANEL * 4;
    for (size_t b = b0; b < b1; b++, w += MMQ_BLOCK_BYTES, st += OP_PANEL * 4) {
        __m512i acc[MMQ_ROWS][4], ex[4];
#pragma GCC unroll 4
        for (size_t q = 0; q < 4; q++) {
            __m512i start =
                own ? _mm512_setzero_si512() : _mm512_load_si512((const void *)(st + 64 * q));
            ex[q] = _mm512_setzero_si512();
#pragma GCC unroll 6
            for (size_t r = 0; r < R; r++) acc[r][q] = start;
        }
#pragma GCC unroll 8
        for (size_t g = 0; g < MMQ_GROUPS; g++) {
            __m512i wv[4];
#pragma GCC unroll 4
            for (size_t q = 0; q < 4; q++) {
                wv[q] = _mm512_load_si512((const void *)(w + (g * OP_PANEL + 16 * q) * 4));
                if (own) ex[q] = _mm512_dpbusd_epi32(ex[q], x128, wv[q]);
            }
#pragma GCC unroll 6
            for (size_t r = 0; r < R; r++) {
                __m512i xb = mmq_x4(m, t0 + r, b, g);
#pragma GCC unroll 4
                for (size_t q = 0; q < 4; q++)
                    acc[r][q] = _mm512_dpbusd_epi32(acc[r][q], xb, wv[q]);
            }
        }
#pragma GCC unroll 6
        for (size_t r = 0; r < R; r++) {
            __m512 d = _mm512_set1_ps(mmq_d(m, t0 + r, b));
#pragma GCC unroll 4
            for (size_t q = 0; q < 4; q++) {
                float *o = c->out + (t0 + r) * N + n + 16 * q;
                __m512 s = _mm512_load_ps((const void *)(w + MMQ_SCALES + 64 * q));
                __m512i z = own ? _mm512_sub_epi32(acc[r][q], ex[q]) : acc[r][q];
                __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(z), _mm512_mul_ps(d, s),
                                           _mm512_maskz_loadu_ps(cm[q], o));
                _mm512_mask_storeu_ps(o, cm[q], v);
            }
        }
    }
}

/* R rows of the chunk from t0 x the panel at n, blocks [b0, b1). */
OP_AVX512VNNI static void mmq_rows(const mmq_ctx *m, size_t t0, size_t R, size_t n, size_t b0,
                                   size_t b1)
{
    switch (R) {
    case 6: mmq_tile(m, t0, n, b0, b1, 6, 0); break;
    case 5: mmq_tile(m, t0, n, b0, b1, 5, 0); break;
    case 4: mmq_tile(m, t0, n, b0, b1, 4, 0); break;
    case 3: mmq_tile(m, t0, n, b0, b1, 3, 0); break;
    case 2: mmq_tile(m, t0, n, b0, b1, 2, 0); break;
    default: mmq_tile(m, t0, n, b0, b1, 1, 0); break;
    }
}

/* Up to MMQ_DIRECT_MAX rows x the panel at n, all of K, summing the
 * offset's excess themselves (as mmq_row1x2: the weights' and scales'
 * bytes only, bound by memory there). */
OP_AVX512VNNI static void mmq_rows_direct(const mmq_ctx *m, size_t R, size_t n)
{
    switch (R) {
    case 4: mmq_tile(m, 0, n, 0, m->KB, 4, 1); break;
    case 3: mmq_tile(m, 0, n, 0, m->KB, 3, 1); break;
    case 2: mmq_tile(m, 0, n, 0, m->KB, 2, 1); break;
    default: mmq_tile(m, 0, n, 0, m->KB, 1, 1); break;
    }
}

/* One row against two whole panels, [na, na + 64) and [nb, nb + 64), all
 * of K with the F32 accumulators in registers (as mmb_row1x2 in
 * op_matmul_bf16.c), reading no more bytes a block than the file's q8
 * (the weights and scales): the excess of the offset, 128 * sum q, is
 * summed here by VPDPBUSD of 128 in every byte (exact as the rest) and
 * taken off, where the tiles read it from the start values, which one row
 * would read for 11 % more bytes. Sixteen independent chains. The same
 * isum, so the same operations per column as mmq_tile. mmq_task gives it
 * neighbouring panels, one stream of memory: bench_ops, 1 thread, q8,
 * 1 row, 3 alternated runs, 4.23-4.46 ms a step against 4.63-4.91 for the
 * first half of the thread's panels beside the second (BF16's order), and
 * 4.8-5.0 with eight chains of eight, both reading the start values. */
OP_AVX512VNNI static void mmq_row1x2(const mmq_ctx *m, size_t na, size_t nb)
{
    const mm_ctx *c = &m->c;
    const size_t KB = m->KB;
    const uint8_t *wa = c->W.quads + (na / OP_PANEL) * KB * MMQ_BLOCK_BYTES;
    const uint8_t *wb = c->W.quads + (nb / OP_PANEL) * KB * MMQ_BLOCK_BYTES;
    const __m512i x128 = _mm512_set1_epi8((char)-128); /* 128 as unsigned bytes */
    __m512 a[4], b[4];
#pragma GCC unroll 4
    for (size_t q = 0; q < 4; q++) {
        a[q] = _mm512_loadu_ps(c->b + na + 16 * q);
        b[q] = _mm512_loadu_ps(c->b + nb + 16 * q);
    }
    for (size_t blk = 0; blk < KB; blk++, wa += MMQ_BLOCK_BYTES, wb += MMQ_BLOCK_BYTES) {
        __m512i ia[4], ib[4], ea[4], eb[4];
#pragma GCC unroll 4
        for (size_t q = 0; q < 4; q++) ia[q] = ib[q] = ea[q] = eb[q] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (size_t g = 0; g < MMQ_GROUPS; g++) {
            __m512i xb = mmq_x4(m, 0, blk, g);
#pragma GCC unroll 4
            for (size_t q = 0; q < 4; q++) {
                size_t o = (g * OP_PANEL + 16 * q) * 4;
                __m512i va = _mm512_load_si512((const void *)(wa + o));
                __m512i vb = _mm512_load_si512((const void *)(wb + o));
                ia[q] = _mm512_dpbusd_epi32(ia[q], xb, va);
                ib[q] = _mm512_dpbusd_epi32(ib[q], xb, vb);
                ea[q] = _mm512_dpbusd_epi32(ea[q], x128, va);
                eb[q] = _mm512_dpbusd_epi32(eb[q], x128, vb);
            }
        }
        __m512 d = _mm512_set1_ps(mmq_d(m, 0, blk));
#pragma GCC unroll 4
        for (size_t q = 0; q < 4; q++) {
            __m512 sa = _mm512_load_ps((const void *)(wa + MMQ_SCALES + 64 * q));
            __m512 sb = _mm512_load_ps((const void *)(wb + MMQ_SCALES + 64 * q));
            __m512i za = _mm512_sub_epi32(ia[q], ea[q]), zb = _mm512_sub_epi32(ib[q], eb[q]);
            a[q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(za), _mm512_mul_ps(d, sa), a[q]);
            b[q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(zb), _mm512_mul_ps(d, sb), b[q]);
        }
    }
#pragma GCC unroll 4
    for (size_t q = 0; q < 4; q++) {
        _mm512_storeu_ps(c->out + na + 16 * q, a[q]);
        _mm512_storeu_ps(c->out + nb + 16 * q, b[q]);
    }
}

static void mmq_task(void *arg, size_t begin, size_t end, size_t tid)
{
    mmq_ctx task = *(const mmq_ctx *)arg;
    mm_ctx *c = &task.c;
    const size_t KB = task.KB;
    size_t n0 = begin * OP_PANEL, n1 = end * OP_PANEL < c->N ? end * OP_PANEL : c->N;
    if (c->b == NULL) { /* a 16-bit bias: this task's columns, widened */
        float *wb = c->pack + tid * task.thread_floats + (c->K + MM512_ROWS) * MM512_COLS;
        op_widen(wb + n0, &c->bias, n0, n1 - n0);
        c->b = wb;
    }
    size_t n = n0;
    if (c->T == 1) { /* whole panels in pairs of neighbours, an odd last one alone */
        size_t nblk = (n1 - n0) / OP_PANEL;
        for (size_t i = 0; i + 2 <= nblk; i += 2)
            mmq_row1x2(&task, n0 + OP_PANEL * i, n0 + OP_PANEL * (i + 1));
        n = n0 + OP_PANEL * (nblk / 2 * 2);
    }
    for (; n < n1; n += OP_PANEL) {
        if (c->T <= MMQ_DIRECT_MAX) {
            mmq_rows_direct(&task, c->T, n);
            continue;
        }
        for (size_t b0 = 0; b0 < KB; b0 += MMQ_KC) {
            size_t b1 = b0 + MMQ_KC < KB ? b0 + MMQ_KC : KB;
            for (size_t t = 0; t < c->T; t += MMQ_ROWS)
                mmq_rows(&task, t, c->T - t < MMQ_ROWS ? c->T - t : MMQ_ROWS, n, b0, b1);
        }
    }
}

void op_matmul_q8vnni(op_pool *pool, const mm_ctx *c, size_t thread_floats)
{
    size_t threads = op_pool_size(pool);
    mmq_ctx m = {*c, (const uint8_t *)(c->pack + threads * thread_floats),
                 c->W.quads + mmq_blocks_bytes(c->K, c->N), (c->K + OP_Q8_BLOCK - 1) / OP_Q8_BLOCK,
                 thread_floats};
    for (size_t t0 = 0; t0 < c->T; t0 += MMQ_CHUNK) {
        m.c.T = c->T - t0 < MMQ_CHUNK ? c->T - t0 : MMQ_CHUNK;
        m.c.in = c->in + t0 * c->K;
        m.c.out = c->out + t0 * c->N;
        if (m.c.T == 1)
            mmq_quantize(&m, 0, 1, 0);
        else
            op_pool_run(pool, m.c.T, mmq_quantize, &m);
        op_pool_run(pool, (c->N + OP_PANEL - 1) / OP_PANEL, mmq_task, &m);
    }
}

#endif
