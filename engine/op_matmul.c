/*
 * engine/op_matmul.c: out (T,N) = in (T,K) @ W (K,N) + b, the four
 * projections of every layer (W as stored by GPT-2's Conv1D, [in, out]).
 *
 * The reduction order, on every path: out[t][n] = b[n], then
 * out[t][n] = fma(in[t][k], W[k][n], out[t][n]) for k = 0, 1, ..., K-1,
 * where W[k][n] is the weight widened to F32 (op_widen1: exact for F16 and
 * BF16, the product q * scale for Q8; kernels.h);
 * one rounding per step, nothing depending on T, the tile, the thread or
 * alignment. mm_stream_c below is that order written plainly (the
 * reference, and the portable path); the AVX2 and AVX-512 versions that
 * follow perform the same operations on 8 or 16 columns at once, so they
 * give the same bits (tests/test_engine.c, op_matmul_*, every row count
 * 1..70 at every kernel level). This file has the reference, the k-blocked
 * tiles for few rows (decode) and the choice between them and the packed
 * tiles for many rows (prefill), which are in op_matmul_packed.c.
 */
#include "matmul.h"

#include <math.h>
#include <string.h>

/* ---- matmul: out (T,N) = in (T,K) @ W (K,N) + b ------------------------- */

/* Up to this many rows, k-blocked tiles over W; above, packed strips. The
 * packed AVX-512 tiles take about the same time from 24 to 48 rows (the
 * weights' reading bounds them), the k-blocked ones grow with the rows:
 * `gpt2d bench --sequences 20,24,28,32,40,48`, 3 alternated runs, matmul ms
 * a step, k-blocked / packed: 24 rows 28-31 / 32-34, 28 rows 28-29 / 24-27,
 * 48 rows 49-63 / 33-34. The packed AVX2 tiles (3 x 32) lose at every row
 * count to 48: 40 rows 78-80 / 122-127 ms. */
#define MM_STREAM_MAX 48
#define MM_STREAM_MAX_512 24
/* F16, BF16 and Q8, whose packed strips are widened while packing, keep
 * the k-blocked tiles to 48 rows: bench_decode, 2 threads, 2 alternated runs,
 * fastest step at 24 / 48: BF16 28 rows 44.6-45.4 -> 37.6-38.6 ms, 32 rows
 * 47.3-47.9 -> 42.4-42.7, 48 rows 57.1-58.6 -> 55.6-57.0; Q8 32 rows
 * 45.8-46.0 -> 37.9-38.8; F16 32 rows 49.8-52.5 -> 42.4-42.9, 48 rows
 * 61.2-62.3 -> 57.5-59.6. At 64 rows the packed tiles won (BF16 69.7-70.3
 * against 72.7-72.8). F32 at 28 and 32 rows was 2-8 % faster packed. */
#define MM_STREAM_MAX_512_NARROW 48
/* Panels (F32, F16, BF16) take the k-blocked tiles up to 64 rows
 * (mm_panels_rows_avx512_t): bench_decode, 2 threads, 2 alternated rounds
 * on a loaded machine, matmul ms a step against the packed tiles: F32 32
 * rows 41.7-44.0 against 56.3-58.2, 48 rows 52.9-55.2 against 65.6-66.9,
 * 64 rows 70.1-75.1 against 83.7-86.6; F16 at 64 rows 71.8-74.6 against
 * 75.2-76.3, BF16 75.8-76.3 against 76.9-78.5. */
#define MM_STREAM_MAX_PANEL 64

/* The reference: columns [n0, n1) of every row in the fixed order. Each W
 * row segment is widened once into wrow and used by every row t. */
static void mm_stream_c(const mm_ctx *c, size_t n0, size_t n1)
{
    float wrow[MM_COLS];
    for (size_t t = 0; t < c->T; t++)
        memcpy(c->out + t * c->N + n0, c->b + n0, (n1 - n0) * sizeof(float));
    for (size_t k = 0; k < c->K; k++) {
        for (size_t nb = n0; nb < n1; nb += MM_COLS) {
            size_t ne = nb + MM_COLS < n1 ? nb + MM_COLS : n1;
            for (size_t n = nb; n < ne; n++) wrow[n - nb] = mm_w_at(c, k, n);
            for (size_t t = 0; t < c->T; t++) {
                float x = c->in[t * c->K + k], *o = c->out + t * c->N;
                for (size_t n = nb; n < ne; n++) o[n] = fmaf(x, wrow[n - nb], o[n]);
            }
        }
    }
}

#if HAVE_X86
/* k-blocked tiles for few rows: W is read straight from the weights, KB
 * rows at a time (KB streams for the prefetcher), each tile of R rows x 32
 * columns keeping its accumulators in registers for those KB steps and in
 * out between them. A float stored and reloaded is exact, so this is still
 * b[n] then one FMA per k in increasing k. KB is 16 rows of W for up to
 * 4 rows of in, 32 for more: that halves the stores and reloads, and one
 * thread's 16-row F32 decode step went from 53-54 to 48-49 ms with it and
 * the 6 x 64 tiles below (bench_decode, 3 alternated runs); one row was
 * about 1 % slower with 32. */
/* Panels (kernels.h, op_w): one k-block of all K (up to 4 rows, and Q8 at
 * any row count; F32, F16 and BF16 at 5-64 rows take k-blocks of
 * MM_PANEL_KB, mm_panels_rows_avx512_t), so that a tile runs a
 * whole panel with its accumulators in registers while the thread streams
 * its panels in order: bench_decode, 2 threads, GPT-2 small, fastest step
 * against the row-major layout, 2 alternated runs (the panels then made in
 * memory at load, before the file layout existed; the files measure the
 * same, docs/benchmarks-history.md): 1 sequence q8 4.8-5.0
 * -> 3.2 ms, BF16 5.7-6.5 -> 5.5-5.6, F32 12.0-12.3 -> 8.3-9.4; 16
 * sequences q8 20.1-20.4 -> 16.5, BF16 22.2-22.7 -> 16.7-17.3, F32
 * 27.7-28.8 -> 23.4-24.7. */
#define KB(c) ((c)->W.panel ? (c)->K : (c)->T > 4 ? (size_t)32 : (size_t)16)
/* Software prefetch distance, in bytes of one row of W: 512 (128 columns of
 * F32, 256 of BF16), 1024 for Q8 (1024 columns), as every format's tiles
 * stream about the same bytes per second. Q8 at the 128 columns of the
 * other formats (128 bytes) lost a quarter of one thread's matmul time. */
#define MM_PF_BYTES 512
#define MM_PF_BYTES_Q8 1024

/* Prefetches W MM_PF_BYTES ahead (in bytes of one row) in the order the k-blocked loops read it:
 * further along the current KB rows, or, past the end of the thread's column range, the next KB
 * rows. Each thread reads its part of every W row in short segments (0.4 to 6 KB for GPT-2), and
 * the starts of those are where the hardware prefetchers lose most. `bytes` of every row from the
 * prefetched column, one line at a time. Prefetches change no result. */
static inline void kb_prefetch(const mm_ctx *c, size_t n0, size_t n1, size_t n, size_t kb,
                               const size_t esize, const size_t bytes)
{
    /* A panel is one contiguous run, which the hardware prefetchers follow
     * best alone: prefetching the next panel made every format slower
     * (q8 at 1 sequence 3.2 -> 4.3 ms a step). */
    if (c->W.panel) return;
    size_t ahead = n - n0 + (esize == 1 ? MM_PF_BYTES_Q8 : MM_PF_BYTES) / esize, span = n1 - n0;
    size_t pk = kb + ahead / span * KB(c), pn = n0 + ahead % span;
    if (pk >= c->K || pn + bytes / esize > n1) return;
    size_t pe = pk + KB(c) < c->K ? pk + KB(c) : c->K;
    for (size_t k = pk; k < pe; k++) {
        const char *p = (const char *)c->W.p + (k * c->N + pn) * esize;
#pragma GCC unroll 4
        for (size_t b = 0; b < bytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
    }
}

/* The inputs of k-block [kb, ke) for all T rows, k-major, in per-thread
 * scratch: the tiles broadcast them from one contiguous block of T x KB
 * floats instead of T rows K floats apart (K = 768 or 3072 puts the rows in
 * the same few L1 sets: 16 rows conflicted). Copies, so no bit changes. */
static inline void gather_inputs(const mm_ctx *c, float *xs, size_t kb, size_t ke)
{
    for (size_t t = 0; t < c->T; t++)
        for (size_t k = kb; k < ke; k++) xs[(k - kb) * c->T + t] = c->in[t * c->K + k];
}

static size_t mm_esize(op_dtype dt)
{
    return dt == OP_F32 ? 4 : dt == OP_Q8 ? 1 : 2;
}

/* A row-major k-block [kb, ke) lies in one Q8 scale block: KB (16 or 32)
 * divides OP_Q8_BLOCK. A panel's k-block is all of K, and the tiles take
 * it in pieces of one Q8 block each, loading their scales at each: the end
 * of the piece from kq. */
_Static_assert(OP_Q8_BLOCK % 32 == 0 && OP_Q8_BLOCK % 16 == 0,
               "a k-block must not cross a Q8 block");
static inline size_t kq_end(size_t kq, size_t ke)
{
    size_t e = (kq / OP_Q8_BLOCK + 1) * OP_Q8_BLOCK;
    return e < ke ? e : ke;
}

OP_AVX2 __attribute__((always_inline)) static inline void
kb_tile_avx2(const mm_ctx *c, const float *xs, size_t t0, size_t n0, size_t kb, size_t ke,
             const size_t R, const op_dtype dt)
{
    __m256 acc[3][4];
#pragma GCC unroll 3
    for (size_t r = 0; r < R; r++) {
        const float *src = kb == 0 ? c->b + n0 : c->out + (t0 + r) * c->N + n0;
#pragma GCC unroll 4
        for (size_t v = 0; v < 4; v++) acc[r][v] = _mm256_loadu_ps(src + 8 * v);
    }
    for (size_t kq = kb; kq < ke;) {
        size_t kn = kq_end(kq, ke);
        __m256 s0 = mm_sc8(c, kq, n0, dt), s1 = mm_sc8(c, kq, n0 + 8, dt);
        __m256 s2 = mm_sc8(c, kq, n0 + 16, dt), s3 = mm_sc8(c, kq, n0 + 24, dt);
        for (size_t k = kq; k < kn; k++) {
            __m256 w0 = mm_w8(c, k, n0, s0, dt), w1 = mm_w8(c, k, n0 + 8, s1, dt);
            __m256 w2 = mm_w8(c, k, n0 + 16, s2, dt), w3 = mm_w8(c, k, n0 + 24, s3, dt);
#pragma GCC unroll 3
            for (size_t r = 0; r < R; r++) {
                __m256 x = _mm256_broadcast_ss(xs + (k - kb) * c->T + t0 + r);
                acc[r][0] = _mm256_fmadd_ps(x, w0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(x, w1, acc[r][1]);
                acc[r][2] = _mm256_fmadd_ps(x, w2, acc[r][2]);
                acc[r][3] = _mm256_fmadd_ps(x, w3, acc[r][3]);
            }
        }
        kq = kn;
    }
#pragma GCC unroll 3
    for (size_t r = 0; r < R; r++)
#pragma GCC unroll 4
        for (size_t v = 0; v < 4; v++)
            _mm256_storeu_ps(c->out + (t0 + r) * c->N + n0 + 8 * v, acc[r][v]);
}

OP_AVX2 __attribute__((always_inline)) static inline void
mm_kblock_avx2_t(const mm_ctx *c, size_t n0, size_t n1, float *xs, const op_dtype dt)
{
    for (size_t kb = 0; kb < c->K; kb += KB(c)) {
        size_t ke = kb + KB(c) < c->K ? kb + KB(c) : c->K;
        gather_inputs(c, xs, kb, ke);
        for (size_t n = n0; n + 32 <= n1; n += 32) {
            kb_prefetch(c, n0, n1, n, kb, mm_esize(dt), 32 * mm_esize(dt));
            size_t t = 0;
            for (; t + 3 <= c->T; t += 3) kb_tile_avx2(c, xs, t, n, kb, ke, 3, dt);
            if (c->T - t == 2) kb_tile_avx2(c, xs, t, n, kb, ke, 2, dt);
            if (c->T - t == 1) kb_tile_avx2(c, xs, t, n, kb, ke, 1, dt);
        }
    }
}

OP_AVX2 static void mm_kblock_avx2(const mm_ctx *c, size_t n0, size_t n1, float *xs)
{
    switch (c->W.dt) {
    case OP_F32: mm_kblock_avx2_t(c, n0, n1, xs, OP_F32); break;
    case OP_F16: mm_kblock_avx2_t(c, n0, n1, xs, OP_F16); break;
    case OP_BF16: mm_kblock_avx2_t(c, n0, n1, xs, OP_BF16); break;
    case OP_Q8: mm_kblock_avx2_t(c, n0, n1, xs, OP_Q8); break;
    }
}

#define KB_ROWS512 8 /* rows per AVX-512 k-blocked tile (16 accumulators) */
#define KB_TALL512 6 /* rows per 64-column AVX-512 tile (24 accumulators) */

/* A k-blocked tile's accumulators, R rows x 16 V columns: the bias at the
 * first k-block, then what the previous k-block left in out; and back. */
OP_AVX512 __attribute__((always_inline)) static inline void
kb_acc_load(const mm_ctx *c, __m512 acc[][4], size_t t0, size_t n0, size_t kb, const size_t R,
            const size_t V)
{
#pragma GCC unroll 8
    for (size_t r = 0; r < R; r++) {
        const float *src = kb == 0 ? c->b + n0 : c->out + (t0 + r) * c->N + n0;
#pragma GCC unroll 4
        for (size_t v = 0; v < V; v++) acc[r][v] = _mm512_loadu_ps(src + 16 * v);
    }
}

OP_AVX512 __attribute__((always_inline)) static inline void
kb_acc_store(const mm_ctx *c, __m512 acc[][4], size_t t0, size_t n0, const size_t R, const size_t V)
{
#pragma GCC unroll 8
    for (size_t r = 0; r < R; r++)
#pragma GCC unroll 4
        for (size_t v = 0; v < V; v++)
            _mm512_storeu_ps(c->out + (t0 + r) * c->N + n0 + 16 * v, acc[r][v]);
}

/* R rows x 16 V columns: V = 4 for up to 4 rows (more independent
 * accumulators per W load when there are few rows) and for the 6-row tiles
 * of 5-24 rows (F32, F16, BF16), V = 2 for the 8-row tiles (Q8, AVX-512
 * column tails). */
OP_AVX512 __attribute__((always_inline)) static inline void
kb_tile_pf_avx512(const mm_ctx *c, const float *xs, size_t t0, size_t n0, size_t kb, size_t ke,
                  const size_t R, const size_t V, const op_dtype dt, const char *pf, size_t pfn)
{
    __m512 acc[KB_ROWS512][4], s[4], w[4];
    kb_acc_load(c, acc, t0, n0, kb, R, V);
    /* W[k][n0 + j] is element wi + j, and the next k's is ws further on
     * (mm_wi, in either layout: a tile never crosses a panel); the tile's
     * inputs of one k are T floats further on in xs. */
    size_t wi = mm_wi(c, kb, n0), ws = c->W.panel ? OP_PANEL : c->N;
    const float *x = xs + t0;
    for (size_t kq = kb; kq < ke;) {
        size_t kn = kq_end(kq, ke);
#pragma GCC unroll 4
        for (size_t v = 0; v < V; v++) s[v] = mm_sc16(c, kq, n0 + 16 * v, dt);
        for (size_t k = kq; k < kn; k++, wi += ws, x += c->T) {
            if (pf != NULL)
                for (size_t i = 0; i < pfn; i++, pf += 64) _mm_prefetch(pf, _MM_HINT_T0);
#pragma GCC unroll 4
            for (size_t v = 0; v < V; v++) {
                w[v] = op_ld16(c->W.p, wi + 16 * v, dt);
                if (dt == OP_Q8) w[v] = _mm512_mul_ps(w[v], s[v]);
            }
#pragma GCC unroll 8
            for (size_t r = 0; r < R; r++) {
                __m512 xr = _mm512_set1_ps(x[r]);
#pragma GCC unroll 4
                for (size_t v = 0; v < V; v++) acc[r][v] = _mm512_fmadd_ps(xr, w[v], acc[r][v]);
            }
        }
        kq = kn;
    }
    kb_acc_store(c, acc, t0, n0, R, V);
}

OP_AVX512 __attribute__((always_inline)) static inline void
kb_tile_avx512(const mm_ctx *c, const float *xs, size_t t0, size_t n0, size_t kb, size_t ke,
               const size_t R, const size_t V, const op_dtype dt)
{
    kb_tile_pf_avx512(c, xs, t0, n0, kb, ke, R, V, dt, NULL, 0);
}

/* One row (decode of one sequence) against two panels at once, columns
 * [na, na + 64) and [nb, nb + 64), all of K with the accumulators in
 * registers: two streams of W for the prefetchers instead of one, and eight
 * independent FMA chains instead of four. The same operations per column
 * as kb_tile_avx512. bench_decode, GPT-2 small in panels, 1 sequence,
 * fastest step, 6 alternated pairs on a machine loaded by other builds:
 * q8 2.33-7.71 ms against 2.81-8.39, F32 7.03-18.46 against 10.04-21.69,
 * F16 3.39-7.63 against 3.72-9.20, faster in 15 of 18 pairs. */
OP_AVX512 __attribute__((always_inline)) static inline void
kb_tile2_avx512(const mm_ctx *c, const float *xs, size_t na, size_t nb, const op_dtype dt)
{
    __m512 a[4], b[4], sa[4], sb[4];
    for (size_t v = 0; v < 4; v++) {
        a[v] = _mm512_loadu_ps(c->b + na + 16 * v);
        b[v] = _mm512_loadu_ps(c->b + nb + 16 * v);
    }
    for (size_t kq = 0; kq < c->K;) {
        size_t kn = kq_end(kq, c->K);
#pragma GCC unroll 4
        for (size_t v = 0; v < 4; v++) {
            sa[v] = mm_sc16(c, kq, na + 16 * v, dt);
            sb[v] = mm_sc16(c, kq, nb + 16 * v, dt);
        }
        for (size_t k = kq; k < kn; k++) {
            __m512 x = _mm512_set1_ps(xs[k]);
#pragma GCC unroll 4
            for (size_t v = 0; v < 4; v++) {
                a[v] = _mm512_fmadd_ps(x, mm_w16(c, k, na + 16 * v, sa[v], dt), a[v]);
                b[v] = _mm512_fmadd_ps(x, mm_w16(c, k, nb + 16 * v, sb[v], dt), b[v]);
            }
        }
        kq = kn;
    }
    for (size_t v = 0; v < 4; v++) {
        _mm512_storeu_ps(c->out + na + 16 * v, a[v]);
        _mm512_storeu_ps(c->out + nb + 16 * v, b[v]);
    }
}

/* BF16, 32 columns at a time: op_bf16x32 widens them with one 64-byte load
 * and two word permutes, in the columns' own order (the zero extension
 * and shift of op_ld16 take four instructions per 32). R rows (up to 4) x
 * 16 V columns. The same speed as the unpacks against zeros of commit
 * 5f9fe06, whose lane order had the accumulators permuted in and out. */
OP_AVX512BW __attribute__((always_inline)) static inline void
kb_tile_bf16_avx512(const mm_ctx *c, const float *xs, size_t t0, size_t n0, size_t kb, size_t ke,
                    const size_t R, const size_t V)
{
    __m512 acc[4][4];
    kb_acc_load(c, acc, t0, n0, kb, R, V);
    for (size_t k = kb; k < ke; k++) {
        __m512 w[4];
        const uint16_t *row = (const uint16_t *)c->W.p + mm_wi(c, k, n0);
#pragma GCC unroll 2
        for (size_t h = 0; h < V / 2; h++) op_bf16x32(row + 32 * h, &w[2 * h], &w[2 * h + 1]);
#pragma GCC unroll 8
        for (size_t r = 0; r < R; r++) {
            __m512 x = _mm512_set1_ps(xs[(k - kb) * c->T + t0 + r]);
#pragma GCC unroll 4
            for (size_t v = 0; v < V; v++) acc[r][v] = _mm512_fmadd_ps(x, w[v], acc[r][v]);
        }
    }
    kb_acc_store(c, acc, t0, n0, R, V);
}

/* kb_tile2_avx512 for BF16 panels, widened by op_bf16x32. */
OP_AVX512BW static inline void kb_tile2_bf16_avx512(const mm_ctx *c, const float *xs, size_t na,
                                                    size_t nb)
{
    __m512 a[4], b[4];
    for (size_t v = 0; v < 4; v++) {
        a[v] = _mm512_loadu_ps(c->b + na + 16 * v);
        b[v] = _mm512_loadu_ps(c->b + nb + 16 * v);
    }
    const uint16_t *ra = (const uint16_t *)c->W.p + mm_wi(c, 0, na);
    const uint16_t *rb = (const uint16_t *)c->W.p + mm_wi(c, 0, nb);
    for (size_t k = 0; k < c->K; k++, ra += OP_PANEL, rb += OP_PANEL) {
        __m512 wa[4], wb[4], x = _mm512_set1_ps(xs[k]);
        op_bf16x32(ra, &wa[0], &wa[1]);
        op_bf16x32(ra + 32, &wa[2], &wa[3]);
        op_bf16x32(rb, &wb[0], &wb[1]);
        op_bf16x32(rb + 32, &wb[2], &wb[3]);
#pragma GCC unroll 4
        for (size_t v = 0; v < 4; v++) {
            a[v] = _mm512_fmadd_ps(x, wa[v], a[v]);
            b[v] = _mm512_fmadd_ps(x, wb[v], b[v]);
        }
    }
    for (size_t v = 0; v < 4; v++) {
        _mm512_storeu_ps(c->out + na + 16 * v, a[v]);
        _mm512_storeu_ps(c->out + nb + 16 * v, b[v]);
    }
}

/* One row against the thread's panels [n0, n1), two at a time (the first
 * half beside the second), an odd one alone; xs: the row's K inputs. */
OP_AVX512BW static void mm_panels_1row_avx512(const mm_ctx *c, size_t n0, size_t n1,
                                              const float *xs, const op_dtype dt)
{
    size_t np = (n1 - n0) / OP_PANEL, half = (np + 1) / 2;
    for (size_t i = 0; i < np / 2; i++) {
        size_t na = n0 + OP_PANEL * i, nb = n0 + OP_PANEL * (i + half);
        switch (dt) {
        case OP_F32: kb_tile2_avx512(c, xs, na, nb, OP_F32); break;
        case OP_F16: kb_tile2_avx512(c, xs, na, nb, OP_F16); break;
        case OP_BF16: kb_tile2_bf16_avx512(c, xs, na, nb); break;
        case OP_Q8: kb_tile2_avx512(c, xs, na, nb, OP_Q8); break;
        }
    }
    if (np % 2 == 1) {
        size_t n = n0 + OP_PANEL * (half - 1);
        switch (dt) {
        case OP_F32: kb_tile_avx512(c, xs, 0, n, 0, c->K, 1, 4, OP_F32); break;
        case OP_F16: kb_tile_avx512(c, xs, 0, n, 0, c->K, 1, 4, OP_F16); break;
        case OP_BF16: kb_tile_bf16_avx512(c, xs, 0, n, 0, c->K, 1, 4); break;
        case OP_Q8: kb_tile_avx512(c, xs, 0, n, 0, c->K, 1, 4, OP_Q8); break;
        }
    }
}

/* BF16 k-blocked tiles for up to 4 rows (decode), 64 columns at a time;
 * more rows take the generic tiles, which were faster there (the weights
 * in cache, one thread, 16 rows: 283-286 us against 314-322 for these
 * tiles with 8 rows), as each widened vector serves more FMAs. */
OP_AVX512BW static void mm_kblock_bf16_avx512(const mm_ctx *c, size_t n0, size_t n1, float *xs)
{
    for (size_t kb = 0; kb < c->K; kb += KB(c)) {
        size_t ke = kb + KB(c) < c->K ? kb + KB(c) : c->K;
        gather_inputs(c, xs, kb, ke);
        size_t n = n0;
        for (; n + 64 <= n1; n += 64) {
            kb_prefetch(c, n0, n1, n, kb, 2, 128);
            switch (c->T) {
            case 4: kb_tile_bf16_avx512(c, xs, 0, n, kb, ke, 4, 4); break;
            case 3: kb_tile_bf16_avx512(c, xs, 0, n, kb, ke, 3, 4); break;
            case 2: kb_tile_bf16_avx512(c, xs, 0, n, kb, ke, 2, 4); break;
            default: kb_tile_bf16_avx512(c, xs, 0, n, kb, ke, 1, 4); break;
            }
        }
        for (; n + 32 <= n1; n += 32) {
            kb_prefetch(c, n0, n1, n, kb, 2, 64);
            switch (c->T) {
            case 4: kb_tile_bf16_avx512(c, xs, 0, n, kb, ke, 4, 2); break;
            case 3: kb_tile_bf16_avx512(c, xs, 0, n, kb, ke, 3, 2); break;
            case 2: kb_tile_bf16_avx512(c, xs, 0, n, kb, ke, 2, 2); break;
            default: kb_tile_bf16_avx512(c, xs, 0, n, kb, ke, 1, 2); break;
            }
        }
    }
}

OP_AVX512 __attribute__((always_inline)) static inline void
mm_kblock_avx512_t(const mm_ctx *c, size_t n0, size_t n1, float *xs, const op_dtype dt)
{
    for (size_t kb = 0; kb < c->K; kb += KB(c)) {
        size_t ke = kb + KB(c) < c->K ? kb + KB(c) : c->K;
        gather_inputs(c, xs, kb, ke);
        size_t n = n0;
        /* Up to 4 rows: 64-column tiles (4 accumulators a row). */
        for (; c->T <= 4 && n + 64 <= n1; n += 64) {
            kb_prefetch(c, n0, n1, n, kb, mm_esize(dt), 64 * mm_esize(dt));
            switch (c->T) {
            case 4: kb_tile_avx512(c, xs, 0, n, kb, ke, 4, 4, dt); break;
            case 3: kb_tile_avx512(c, xs, 0, n, kb, ke, 3, 4, dt); break;
            case 2: kb_tile_avx512(c, xs, 0, n, kb, ke, 2, 4, dt); break;
            default: kb_tile_avx512(c, xs, 0, n, kb, ke, 1, 4, dt); break;
            }
        }
        /* More rows: 64-column tiles of 6 rows (24 accumulators; 10 loads
         * for 24 FMAs a k, where 8 x 32 tiles took 10 for 16). Not Q8,
         * whose four scale vectors leave too few registers for them. */
        for (; c->T > 4 && dt != OP_Q8 && n + 64 <= n1; n += 64) {
            kb_prefetch(c, n0, n1, n, kb, mm_esize(dt), 64 * mm_esize(dt));
            size_t t = 0;
            for (; t + KB_TALL512 <= c->T; t += KB_TALL512)
                kb_tile_avx512(c, xs, t, n, kb, ke, KB_TALL512, 4, dt);
            switch (c->T - t) {
            case 5: kb_tile_avx512(c, xs, t, n, kb, ke, 5, 4, dt); break;
            case 4: kb_tile_avx512(c, xs, t, n, kb, ke, 4, 4, dt); break;
            case 3: kb_tile_avx512(c, xs, t, n, kb, ke, 3, 4, dt); break;
            case 2: kb_tile_avx512(c, xs, t, n, kb, ke, 2, 4, dt); break;
            case 1: kb_tile_avx512(c, xs, t, n, kb, ke, 1, 4, dt); break;
            default: break;
            }
        }
        for (; n + 32 <= n1; n += 32) {
            kb_prefetch(c, n0, n1, n, kb, mm_esize(dt), 32 * mm_esize(dt));
            size_t t = 0;
            for (; t + KB_ROWS512 <= c->T; t += KB_ROWS512)
                kb_tile_avx512(c, xs, t, n, kb, ke, KB_ROWS512, 2, dt);
            switch (c->T - t) {
            case 7: kb_tile_avx512(c, xs, t, n, kb, ke, 7, 2, dt); break;
            case 6: kb_tile_avx512(c, xs, t, n, kb, ke, 6, 2, dt); break;
            case 5: kb_tile_avx512(c, xs, t, n, kb, ke, 5, 2, dt); break;
            case 4: kb_tile_avx512(c, xs, t, n, kb, ke, 4, 2, dt); break;
            case 3: kb_tile_avx512(c, xs, t, n, kb, ke, 3, 2, dt); break;
            case 2: kb_tile_avx512(c, xs, t, n, kb, ke, 2, 2, dt); break;
            case 1: kb_tile_avx512(c, xs, t, n, kb, ke, 1, 2, dt); break;
            default: break;
            }
        }
    }
}

/*
 * Panels for 5 rows and more (F32, F16, BF16): panel by panel, in k-blocks
 * of MM_PANEL_KB rows (16 KB of F32), every row tile of the panel over one
 * k-block before the next, the tiles after the first prefetching the next
 * k-block (the next panel's first after the last) between them, pfn lines
 * a k. The first tile reads the k-block from memory, the others from L1;
 * with the prefetches the memory works while they compute, where the
 * hardware prefetchers, which follow the first tile's misses only, leave it
 * idle (bench_decode, GPT-2 small panel files, 16 sequences, 2 threads, 3
 * alternated rounds, matmul ms a step against whole-K tiles: F32 10.4-11.4
 * against 13.7-14.3; the same k-blocks without the prefetches 15.0-16.2).
 * BF16 8.7-9.1 against 9.7-10.1, F16 8.9-9.0 against 9.6-10.2. Q8, whose
 * 64-byte panel rows the 8 x 32 tiles read in two halves, lost with it
 * (10.4-10.6 against 9.9-10.6 at k-blocks of 64, more at 128 to 768) and
 * keeps whole-K tiles. xs: all T x K inputs, gathered once.
 */
#define MM_PANEL_KB 64
OP_AVX512 __attribute__((always_inline)) static inline void
mm_panels_rows_avx512_t(const mm_ctx *c, size_t n0, size_t n1, float *xs, const op_dtype dt)
{
    gather_inputs(c, xs, 0, c->K);
    const size_t es = mm_esize(dt), ntiles = (c->T + KB_TALL512 - 1) / KB_TALL512;
    for (size_t n = n0; n + OP_PANEL <= n1; n += OP_PANEL) {
        for (size_t kb = 0; kb < c->K; kb += MM_PANEL_KB) {
            size_t ke = kb + MM_PANEL_KB < c->K ? kb + MM_PANEL_KB : c->K, nk = ke - kb;
            const float *xk = xs + kb * c->T;
            /* The next k-block's lines: its rows follow this one's in the
             * panel, and the next panel's first k-block follows the last. */
            size_t lines = nk * OP_PANEL * es / 64, pfn = 0;
            if (ntiles > 1 && (ke < c->K || n + OP_PANEL < n1))
                pfn = (lines + (ntiles - 1) * nk - 1) / ((ntiles - 1) * nk);
            const char *pf = (const char *)c->W.p + (mm_wi(c, ke - 1, n) + OP_PANEL) * es;
            size_t t = 0, tile = 0;
            for (; t < c->T; t += KB_TALL512, tile++) {
                const char *p = tile > 0 && pfn > 0 ? pf + (tile - 1) * nk * pfn * 64 : NULL;
                switch (c->T - t < KB_TALL512 ? c->T - t : KB_TALL512) {
                case 6: kb_tile_pf_avx512(c, xk, t, n, kb, ke, 6, 4, dt, p, pfn); break;
                case 5: kb_tile_pf_avx512(c, xk, t, n, kb, ke, 5, 4, dt, p, pfn); break;
                case 4: kb_tile_pf_avx512(c, xk, t, n, kb, ke, 4, 4, dt, p, pfn); break;
                case 3: kb_tile_pf_avx512(c, xk, t, n, kb, ke, 3, 4, dt, p, pfn); break;
                case 2: kb_tile_pf_avx512(c, xk, t, n, kb, ke, 2, 4, dt, p, pfn); break;
                default: kb_tile_pf_avx512(c, xk, t, n, kb, ke, 1, 4, dt, p, pfn); break;
                }
            }
        }
    }
}

OP_AVX512 static void mm_kblock_avx512(const mm_ctx *c, size_t n0, size_t n1, float *xs)
{
    if (c->W.panel && c->T > 4) {
        switch (c->W.dt) {
        case OP_F32: mm_panels_rows_avx512_t(c, n0, n1, xs, OP_F32); return;
        case OP_F16: mm_panels_rows_avx512_t(c, n0, n1, xs, OP_F16); return;
        case OP_BF16: mm_panels_rows_avx512_t(c, n0, n1, xs, OP_BF16); return;
        case OP_Q8: break;
        }
    }
    switch (c->W.dt) {
    case OP_F32: mm_kblock_avx512_t(c, n0, n1, xs, OP_F32); break;
    case OP_F16: mm_kblock_avx512_t(c, n0, n1, xs, OP_F16); break;
    case OP_BF16:
        if (c->T <= 4 && op_use_avx512bw())
            mm_kblock_bf16_avx512(c, n0, n1, xs);
        else
            mm_kblock_avx512_t(c, n0, n1, xs, OP_BF16);
        break;
    case OP_Q8: mm_kblock_avx512_t(c, n0, n1, xs, OP_Q8); break;
    }
}

#endif

/* Per thread: a strip of K x 64 floats of W and 6 x 64 floats for the rows
 * past the last full AVX-512 tile (op_mm_block_avx512), or T x KB inputs for the
 * k-blocked tiles (T <= MM_STREAM_MAX, KB <= K: a panel's k-block is all of
 * K, so T x K, less than the strip while T <= 64); then N floats for the
 * bias widened from F16 or BF16 (the task's columns). */
_Static_assert(MM_STREAM_MAX <= MM512_COLS && MM_STREAM_MAX_512 <= MM512_COLS
                   && MM_STREAM_MAX_512_NARROW <= MM512_COLS && MM_STREAM_MAX_PANEL <= MM512_COLS,
               "the k-blocked tiles' T x K inputs must fit in the K x 64 strip");
static size_t mm_thread_floats(size_t K, size_t N)
{
    return (K + MM512_ROWS) * MM512_COLS + (N + 15) / 16 * 16;
}

static void mm_task(void *arg, size_t begin, size_t end, size_t tid)
{
    mm_ctx task = *(const mm_ctx *)arg;
    const mm_ctx *c = &task;
    size_t unit = c->W.panel ? OP_PANEL : MM_COLS; /* a thread never splits a panel */
    size_t n0 = begin * unit, n1 = end * unit < c->N ? end * unit : c->N;
    float *mine = c->pack + tid * mm_thread_floats(c->K, c->N);
    if (c->b == NULL) { /* a 16-bit bias: this task's columns, widened */
        float *wb = mine + (c->K + MM512_ROWS) * MM512_COLS;
        op_widen(wb + n0, &c->bias, n0, n1 - n0);
        task.b = wb;
    }
#if HAVE_X86
    if (op_use_avx2()) {
        size_t max512 = c->W.dt == OP_F32 ? MM_STREAM_MAX_512 : MM_STREAM_MAX_512_NARROW;
        if (c->W.panel && c->W.dt != OP_Q8) max512 = MM_STREAM_MAX_PANEL;
        if (c->T <= (op_use_avx512() ? max512 : MM_STREAM_MAX)) {
            size_t nv = n0 + (n1 - n0) / 32 * 32;
            if (op_use_avx512bw() && c->W.panel && c->T == 1) {
                gather_inputs(c, mine, 0, c->K);
                mm_panels_1row_avx512(c, n0, n1, mine, c->W.dt);
                return;
            }
            if (op_use_avx512())
                mm_kblock_avx512(c, n0, nv, mine); /* T x KB inputs */
            else
                mm_kblock_avx2(c, n0, nv, mine);
            if (nv < n1) mm_stream_c(c, nv, n1);
            return;
        }
        size_t n = n0;
        if (op_use_avx512())
            for (; n + MM512_COLS <= n1; n += MM512_COLS)
                op_mm_block_avx512(c, n, mine, mine + c->K * MM512_COLS);
        for (; n + MM_COLS <= n1; n += MM_COLS) op_mm_block_avx2(c, n, mine);
        if (n < n1) mm_stream_c(c, n, n1);
        return;
    }
#endif
    mm_stream_c(c, n0, n1);
}

size_t op_matmul_scratch_floats(size_t threads, size_t K, size_t N)
{
    size_t bf16 = op_matmul_bf16_scratch_floats(K), q8 = op_matmul_q8_scratch_floats(K);
    return threads * mm_thread_floats(K, N) + (bf16 > q8 ? bf16 : q8);
}

/* A panel W needs N % OP_PANEL == 0 (kernels.h): the loader binds no other
 * (engine/model.c), and the tests and benchmarks build theirs so. */
void op_matmul(op_pool *pool, float *pack, float *out, const float *in, const op_w *W,
               const op_w *b, size_t T, size_t K, size_t N)
{
    mm_ctx c = {out, in, *W, *b, b->dt == OP_F32 ? b->p : NULL, T, K, N, pack};
#if HAVE_X86
    if (W->dt == OP_BF16 && W->pairs != NULL && op_use_avx512bf16()) {
        op_matmul_bf16dp(pool, &c, mm_thread_floats(K, N));
        return;
    }
    if (W->dt == OP_Q8 && W->quads != NULL && op_use_avx512vnni()) {
        op_matmul_q8vnni(pool, &c, mm_thread_floats(K, N));
        return;
    }
#endif
    size_t unit = W->panel ? OP_PANEL : MM_COLS;
    op_pool_run(pool, (N + unit - 1) / unit, mm_task, &c);
}
