/*
 * engine/op_matmul.c: out (T,N) = in (T,K) @ W (K,N) + b, the four
 * projections of every layer (W as stored by GPT-2's Conv1D, [in, out]).
 *
 * The reduction order, on every path: out[t][n] = b[n], then
 * out[t][n] = fma(in[t][k], W[k][n], out[t][n]) for k = 0, 1, ..., K-1;
 * one rounding per step, nothing depending on T, the tile, the thread or
 * alignment. mm_stream_c below is that order written plainly (the
 * reference, and the portable path); the AVX2 and AVX-512 versions that
 * follow perform the same operations on 8 or 16 columns at once, so they
 * give the same bits (tests/test_engine.c, op_matmul_*, every row count
 * 1..70 at every kernel level).
 */
#include "internal.h"

#include <math.h>
#include <string.h>

/* ---- matmul: out (T,N) = in (T,K) @ W (K,N) + b ------------------------- */

#define MM_COLS 32 /* columns per block: four 8-float vectors          */
#define MM_ROWS 3  /* rows per register tile (12 accumulators)         */
/* Up to this many rows, k-blocked tiles over W; above, packed strips. The
 * packed AVX-512 tiles take about the same time from 24 to 48 rows (the
 * weights' reading bounds them), the k-blocked ones grow with the rows:
 * `gpt2d bench --sequences 20,24,28,32,40,48`, 3 alternated runs, matmul ms
 * a step, k-blocked / packed: 24 rows 28-31 / 32-34, 28 rows 28-29 / 24-27,
 * 48 rows 49-63 / 33-34. The packed AVX2 tiles (3 x 32) lose at every row
 * count to 48: 40 rows 78-80 / 122-127 ms. */
#define MM_STREAM_MAX 48
#define MM_STREAM_MAX_512 24

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
    const float *in, *W, *b;
    size_t T, K, N;
    float *pack; /* per thread: K x MM_COLS floats */
} mm_ctx;

static void mm_stream_c(const mm_ctx *c, size_t n0, size_t n1)
{
    for (size_t t = 0; t < c->T; t++)
        memcpy(c->out + t * c->N + n0, c->b + n0, (n1 - n0) * sizeof(float));
    for (size_t k = 0; k < c->K; k++) {
        const float *w = c->W + k * c->N;
        for (size_t t = 0; t < c->T; t++) {
            float x = c->in[t * c->K + k], *o = c->out + t * c->N;
            for (size_t n = n0; n < n1; n++) o[n] = fmaf(x, w[n], o[n]);
        }
    }
}

#if HAVE_X86
/* k-blocked tiles for few rows: W is read straight from the weights, KB
 * rows at a time (KB streams for the prefetcher), each tile of R rows x 32
 * columns keeping its accumulators in registers for those KB steps and in
 * out between them. A float stored and reloaded is exact, so this is still
 * b[n] then one FMA per k in increasing k. */
#define KB 16
#define MM_PF_COLS 128 /* software prefetch distance, in columns of W */

/* Prefetches W one 32-column segment MM_PF_COLS ahead in the order the
 * k-blocked loops read it: further along the current KB rows, or, near the
 * end of the thread's column range, the start of the next KB rows. Each
 * thread reads its part of every W row in short segments (1.5 to 6 KB for
 * GPT-2), and the starts of those are where the hardware prefetchers lose
 * most. Prefetches change no result. */
static inline void kb_prefetch(const mm_ctx *c, size_t n0, size_t n1, size_t n, size_t kb,
                               size_t ke)
{
    size_t ahead = n - n0 + MM_PF_COLS, span = n1 - n0;
    size_t pk = kb, pn = n0 + ahead;
    if (ahead >= span) {
        pk = ke;
        pn = n0 + (ahead - span);
    }
    if (pk >= c->K || pn + 32 > n1) return;
    size_t pe = pk + KB < c->K ? pk + KB : c->K;
    for (size_t k = pk; k < pe; k++) {
        const char *p = (const char *)(c->W + k * c->N + pn);
        _mm_prefetch(p, _MM_HINT_T0);
        _mm_prefetch(p + 64, _MM_HINT_T0);
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

__attribute__((target("avx2,fma"), always_inline)) static inline void
kb_tile_avx2(const mm_ctx *c, const float *xs, size_t t0, size_t n0, size_t kb, size_t ke,
             const size_t R)
{
    __m256 acc[3][4];
#pragma GCC unroll 3
    for (size_t r = 0; r < R; r++) {
        const float *src = kb == 0 ? c->b + n0 : c->out + (t0 + r) * c->N + n0;
#pragma GCC unroll 4
        for (size_t v = 0; v < 4; v++) acc[r][v] = _mm256_loadu_ps(src + 8 * v);
    }
    for (size_t k = kb; k < ke; k++) {
        const float *w = c->W + k * c->N + n0;
        __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);
        __m256 w2 = _mm256_loadu_ps(w + 16), w3 = _mm256_loadu_ps(w + 24);
#pragma GCC unroll 3
        for (size_t r = 0; r < R; r++) {
            __m256 x = _mm256_broadcast_ss(xs + (k - kb) * c->T + t0 + r);
            acc[r][0] = _mm256_fmadd_ps(x, w0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(x, w1, acc[r][1]);
            acc[r][2] = _mm256_fmadd_ps(x, w2, acc[r][2]);
            acc[r][3] = _mm256_fmadd_ps(x, w3, acc[r][3]);
        }
    }
#pragma GCC unroll 3
    for (size_t r = 0; r < R; r++)
#pragma GCC unroll 4
        for (size_t v = 0; v < 4; v++)
            _mm256_storeu_ps(c->out + (t0 + r) * c->N + n0 + 8 * v, acc[r][v]);
}

__attribute__((target("avx2,fma"))) static void mm_kblock_avx2(const mm_ctx *c, size_t n0,
                                                               size_t n1, float *xs)
{
    for (size_t kb = 0; kb < c->K; kb += KB) {
        size_t ke = kb + KB < c->K ? kb + KB : c->K;
        gather_inputs(c, xs, kb, ke);
        for (size_t n = n0; n + 32 <= n1; n += 32) {
            kb_prefetch(c, n0, n1, n, kb, ke);
            size_t t = 0;
            for (; t + 3 <= c->T; t += 3) kb_tile_avx2(c, xs, t, n, kb, ke, 3);
            if (c->T - t == 2) kb_tile_avx2(c, xs, t, n, kb, ke, 2);
            if (c->T - t == 1) kb_tile_avx2(c, xs, t, n, kb, ke, 1);
        }
    }
}

#define KB_ROWS512 8 /* rows per AVX-512 k-blocked tile (16 accumulators) */

__attribute__((target("avx512f"), always_inline)) static inline void
kb_tile_avx512(const mm_ctx *c, const float *xs, size_t t0, size_t n0, size_t kb, size_t ke,
               const size_t R)
{
    __m512 acc[KB_ROWS512][2];
#pragma GCC unroll 8
    for (size_t r = 0; r < R; r++) {
        const float *src = kb == 0 ? c->b + n0 : c->out + (t0 + r) * c->N + n0;
        acc[r][0] = _mm512_loadu_ps(src);
        acc[r][1] = _mm512_loadu_ps(src + 16);
    }
    for (size_t k = kb; k < ke; k++) {
        const float *w = c->W + k * c->N + n0;
        __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16);
#pragma GCC unroll 8
        for (size_t r = 0; r < R; r++) {
            __m512 x = _mm512_set1_ps(xs[(k - kb) * c->T + t0 + r]);
            acc[r][0] = _mm512_fmadd_ps(x, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(x, w1, acc[r][1]);
        }
    }
#pragma GCC unroll 8
    for (size_t r = 0; r < R; r++) {
        _mm512_storeu_ps(c->out + (t0 + r) * c->N + n0, acc[r][0]);
        _mm512_storeu_ps(c->out + (t0 + r) * c->N + n0 + 16, acc[r][1]);
    }
}

__attribute__((target("avx512f"))) static void mm_kblock_avx512(const mm_ctx *c, size_t n0,
                                                                size_t n1, float *xs)
{
    for (size_t kb = 0; kb < c->K; kb += KB) {
        size_t ke = kb + KB < c->K ? kb + KB : c->K;
        gather_inputs(c, xs, kb, ke);
        for (size_t n = n0; n + 32 <= n1; n += 32) {
            kb_prefetch(c, n0, n1, n, kb, ke);
            size_t t = 0;
            for (; t + KB_ROWS512 <= c->T; t += KB_ROWS512)
                kb_tile_avx512(c, xs, t, n, kb, ke, KB_ROWS512);
            switch (c->T - t) {
            case 7: kb_tile_avx512(c, xs, t, n, kb, ke, 7); break;
            case 6: kb_tile_avx512(c, xs, t, n, kb, ke, 6); break;
            case 5: kb_tile_avx512(c, xs, t, n, kb, ke, 5); break;
            case 4: kb_tile_avx512(c, xs, t, n, kb, ke, 4); break;
            case 3: kb_tile_avx512(c, xs, t, n, kb, ke, 3); break;
            case 2: kb_tile_avx512(c, xs, t, n, kb, ke, 2); break;
            case 1: kb_tile_avx512(c, xs, t, n, kb, ke, 1); break;
            default: break;
            }
        }
    }
}

__attribute__((target("avx2,fma"), always_inline)) static inline void
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

__attribute__((target("avx2,fma"))) static void mm_block_avx2(const mm_ctx *c, size_t n0,
                                                              float *strip)
{
    for (size_t k = 0; k < c->K; k++)
        memcpy(strip + k * MM_COLS, c->W + k * c->N + n0, MM_COLS * sizeof(float));
    size_t t = 0;
    for (; t + 3 <= c->T; t += 3) mm_tile_avx2(c, strip, t, n0, 3);
    if (c->T - t == 2) mm_tile_avx2(c, strip, t, n0, 2);
    if (c->T - t == 1) mm_tile_avx2(c, strip, t, n0, 1);
}
#endif

/* AVX-512: register tiles of 6 rows x 64 columns (24 accumulators). A
 * 512-bit FMA rounds each lane exactly as a 256-bit one or fmaf does, so
 * the bits are those of the other paths. */
#define MM512_COLS 64
#define MM512_ROWS 6
#define MM512_KC 256

/* One register tile: rows x[0..5] (K floats from the current k) against K
 * rows of the packed strip, starting from init[r] (the bias, or the partial
 * sums from the previous k-block) and written to o[0..5]. Fully unrolled so
 * that the 24 accumulators stay in registers. */
__attribute__((target("avx512f"))) static void mm_tile6_avx512(float *const o[6],
                                                               const float *const x[6],
                                                               const float *strip,
                                                               const float *const init[6], size_t K)
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
__attribute__((target("avx512f"))) static void mm_block_avx512(const mm_ctx *c, size_t n0,
                                                               float *strip, float *tail)
{
    for (size_t k = 0; k < c->K; k++)
        memcpy(strip + k * MM512_COLS, c->W + k * c->N + n0, MM512_COLS * sizeof(float));
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

/* Per thread: a strip of K x 64 floats of W and 6 x 64 floats for the rows
 * past the last full AVX-512 tile (mm_block_avx512), or T x KB inputs for the
 * k-blocked tiles (T <= MM_STREAM_MAX, KB = 16: less than the strip). */
static size_t mm_thread_floats(size_t K, size_t N)
{
    (void)N;
    return (K + MM512_ROWS) * MM512_COLS;
}

static void mm_task(void *arg, size_t begin, size_t end, size_t tid)
{
    const mm_ctx *c = arg;
    size_t n0 = begin * MM_COLS, n1 = end * MM_COLS < c->N ? end * MM_COLS : c->N;
#if HAVE_X86
    if (op_use_avx2()) {
        if (c->T <= (op_use_avx512() ? MM_STREAM_MAX_512 : MM_STREAM_MAX)) {
            size_t nv = n0 + (n1 - n0) / 32 * 32;
            float *xs = c->pack + tid * mm_thread_floats(c->K, c->N); /* T x KB */
            if (op_use_avx512())
                mm_kblock_avx512(c, n0, nv, xs);
            else
                mm_kblock_avx2(c, n0, nv, xs);
            if (nv < n1) mm_stream_c(c, nv, n1);
            return;
        }
        size_t n = n0;
        float *strip = c->pack + tid * mm_thread_floats(c->K, c->N);
        if (op_use_avx512())
            for (; n + MM512_COLS <= n1; n += MM512_COLS)
                mm_block_avx512(c, n, strip, strip + c->K * MM512_COLS);
        for (; n + MM_COLS <= n1; n += MM_COLS) mm_block_avx2(c, n, strip);
        if (n < n1) mm_stream_c(c, n, n1);
        return;
    }
#endif
    (void)tid;
    mm_stream_c(c, n0, n1);
}

size_t op_matmul_scratch_floats(size_t threads, size_t K, size_t N)
{
    return threads * mm_thread_floats(K, N);
}

void op_matmul(op_pool *pool, float *pack, float *out, const float *in, const float *W,
               const float *b, size_t T, size_t K, size_t N)
{
    mm_ctx c = {out, in, W, b, T, K, N, pack};
    op_pool_run(pool, (N + MM_COLS - 1) / MM_COLS, mm_task, &c);
}
