/*
 * engine/ops.c: the kernels of a step, each with a fixed reduction order.
 *
 * Batch invariance: a sequence must get the same bits whether it runs alone
 * or beside others. OpenBLAS's SGEMM does not give that here (a row's bits
 * change with the number of rows and the weights' alignment), so the
 * matmuls are our own: every output element is reduced in one order that
 * depends only on K, never on T, on the tile it falls in, on the thread that
 * computes it or on alignment:
 *   op_matmul   out[t][n] = b[n], then += in[t][k] * W[k][n] for k = 0..K-1,
 *               each step one fused multiply-add (vfmadd / fmaf);
 *   op_lm_head  out[t][v] = dot(h[t], wte[v]): sixteen lanes, lane j summing
 *               c = j, j+16, ... by FMA, then a fixed tree, then the tail;
 *   attention   per row and head over its own positions in order.
 * The AVX2 paths and the portable C paths perform the same operations in
 * the same order, so they give the same bits too.
 *
 * Parallelism: op_pool_run splits columns (matmul), vocabulary rows
 * (LM head) and rows (layer norm, GELU) into one contiguous range per
 * thread; attention's (head, rows) jobs, whose costs differ, are claimed
 * one at a time (op_pool_run_chunks). Claiming the matmul's columns in
 * chunks instead was measured slower (16 streams through the server, 3
 * alternated runs: 8 % fewer tokens/s), as each chunk gathers its inputs
 * again and loses the contiguous run of W.
 */
#include "internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

#if HAVE_X86
/* GPT2D_KERNELS=portable or =avx2 caps the instruction set (for tests that
 * compare the paths bit for bit, and for benchmarks). */
static int kernels_allow(const char *level)
{
    const char *v = getenv("GPT2D_KERNELS");
    if (v == NULL || *v == '\0') return 1;
    if (strcmp(v, "portable") == 0) return 0;
    return strcmp(v, "avx2") != 0 || strcmp(level, "avx2") == 0;
}

static int probe_avx512(void)
{
    return kernels_allow("avx512") && __builtin_cpu_supports("avx512f")
           && __builtin_cpu_supports("fma");
}

static int probe_avx2(void)
{
    return kernels_allow("avx2") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* The answer of probe, cached in an atomic (relaxed: every thread that races
 * to fill it computes the same value). */
static int cached(atomic_int *cache, int (*probe)(void))
{
    int v = atomic_load_explicit(cache, memory_order_relaxed);
    if (v < 0) {
        v = probe();
        atomic_store_explicit(cache, v, memory_order_relaxed);
    }
    return v;
}

static atomic_int have_avx512 = -1, have_avx2 = -1;
static int use_avx512(void)
{
    return cached(&have_avx512, probe_avx512);
}
static int use_avx2(void)
{
    return cached(&have_avx2, probe_avx2);
}
#else
static int use_avx512(void)
{
    return 0;
}
static int use_avx2(void)
{
    return 0;
}
#endif

const char *eng_kernels(void)
{
    return use_avx512() ? "avx512" : use_avx2() ? "avx2" : "portable";
}

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

static void mm_task(void *arg, size_t begin, size_t end, size_t tid)
{
    const mm_ctx *c = arg;
    size_t n0 = begin * MM_COLS, n1 = end * MM_COLS < c->N ? end * MM_COLS : c->N;
#if HAVE_X86
    if (use_avx2()) {
        if (c->T <= (use_avx512() ? MM_STREAM_MAX_512 : MM_STREAM_MAX)) {
            size_t nv = n0 + (n1 - n0) / 32 * 32;
            float *xs = c->pack + tid * (c->K + MM512_ROWS) * MM512_COLS; /* T x KB */
            if (use_avx512())
                mm_kblock_avx512(c, n0, nv, xs);
            else
                mm_kblock_avx2(c, n0, nv, xs);
            if (nv < n1) mm_stream_c(c, nv, n1);
            return;
        }
        size_t n = n0;
        float *strip = c->pack + tid * (c->K + MM512_ROWS) * MM512_COLS;
        if (use_avx512())
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

void op_matmul(op_pool *pool, float *pack, float *out, const float *in, const float *W,
               const float *b, size_t T, size_t K, size_t N)
{
    mm_ctx c = {out, in, W, b, T, K, N, pack};
    op_pool_run(pool, (N + MM_COLS - 1) / MM_COLS, mm_task, &c);
}

/* ---- dot products with a fixed order -------------------------------------- */

/*
 * dot(a, b, n): sixteen lanes, lane j summing a[i] * b[i] for i = j, j + 16,
 * ... by FMA from 0; then the pairs (l[j] + l[j + 8]); then the tree
 * ((m0 + m4) + (m2 + m6)) + ((m1 + m5) + (m3 + m7)); then the n % 16 tail
 * by FMA in order. AVX-512 holds the lanes in one register, AVX2 in two,
 * the portable code in an array: the same operations on every path.
 */
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
__attribute__((target("avx2,fma"), always_inline)) static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s)); /* (m0+m4)+(m2+m6), (m1+m5)+(m3+m7) */
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) static float dot16_avx2(const float *a, const float *b,
                                                            size_t n)
{
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), hi);
    }
    float s = hsum8(_mm256_add_ps(lo, hi));
    for (; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

__attribute__((target("avx512f"), always_inline)) static inline float hsum16(__m512 v)
{
    __m256 m = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    return _mm_cvtss_f32(s);
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
            float s = hsum16(acc[r][v]);
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
    float s[4] = {hsum16(a0), hsum16(a1), hsum16(a2), hsum16(a3)};
    for (int v = 0; v < 4; v++) {
        for (size_t j = i; j < C; j++) s[v] = fmaf(h[j], w[(size_t)v * C + j], s[v]);
        out[v] = s[v];
    }
}
#endif

float op_dot(const float *a, const float *b, size_t n)
{
#if HAVE_X86
    if (use_avx2()) return dot16_avx2(a, b, n);
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
        if (use_avx512()) {
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

#if HAVE_X86
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 exp_avx2(__m256 x)
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

__attribute__((target("avx2,fma"))) static void gelu_avx2(float *x, size_t n)
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
__attribute__((target("avx2,fma"))) static float exp_sub_sum_avx2(float *x, size_t n, float m)
{
    __m256 vm = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float s = hsum8(acc);
    for (; i < n; i++) {
        x[i] = exp_c1(x[i] - m);
        s += x[i];
    }
    return s;
}
#endif

/* The portable twin of exp_sub_sum_avx2: eight lanes, the same tree. */
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

float op_exp_sub_sum(float *x, size_t n, float m)
{
#if HAVE_X86
    if (use_avx2()) return exp_sub_sum_avx2(x, n, m);
#endif
    return exp_sub_sum_c(x, n, m);
}

/* ---- Layer norm and GELU, by rows ----------------------------------------- */

typedef struct {
    float *out;
    const float *in, *g, *b;
    size_t C;
    float eps;
} ln_ctx;

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
        for (size_t i = 0; i < c->C; i++) y[i] = (x[i] - m) * rstd * c->g[i] + c->b[i];
    }
}

void op_layernorm(op_pool *pool, float *out, const float *in, const float *g, const float *b,
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
    if (use_avx2()) {
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
__attribute__((target("avx2,fma"))) static void axpy_avx2(float *y, float a, const float *x,
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
    if (use_avx2()) {
        axpy_avx2(y, a, x, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

/* Causal attention of one (row, head) over the row's sequence, positions
 * 0..p in order; K and V of this step's rows are already in the cache. */
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
__attribute__((target("avx512f"), always_inline)) static inline void
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
                    float d = hsum16(acc) * scale;
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
__attribute__((target("avx512f"))) static void att64_task(void *arg, size_t begin, size_t end,
                                                          size_t tid)
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

void op_attention(op_pool *pool, float *att, const float *qkv, const eng_kv *kv,
                  const eng_item *items, const size_t *row_item, const size_t *row_pos, size_t T,
                  size_t l, size_t NH, size_t HS, float *scores, size_t n_ctx)
{
    att_ctx c = {att, qkv, kv, items, row_item, row_pos, l, NH, HS, scores, n_ctx, T};
#if HAVE_X86
    if (HS == 64 && use_avx512()) {
        op_pool_run_chunks(pool, (T + OP_ATT_ROWS - 1) / OP_ATT_ROWS * NH, 1, att64_task, &c);
        return;
    }
#endif
    op_pool_run_chunks(pool, T * NH, 1, att_task, &c);
}
