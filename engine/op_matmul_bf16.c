/*
 * engine/op_matmul_bf16.c: op_matmul (and op_lm_head) for BF16 weights on
 * AVX512_BF16 (VDPBF16PS), the kernel level "avx512-bf16" (op_dispatch.c).
 * Taken for every row count, one row included, for every BF16 W whose pair
 * copy was built (op_w_pairs_build: the model's projections at load;
 * op_w_pairs_build_rows: wte, which the LM head reads as its transpose,
 * with no bias); lower levels keep the widening kernels and their F32
 * contract.
 *
 * The reduction order (the contract of this level, kernels.h op_bf16_dot2):
 * each input row is rounded once to BF16 (op_f32_to_bf16_dp: to nearest,
 * ties to even, subnormals to zero: VCVTNEPS2BF16), then
 * out[t][n] = b[n], and for each pair j = 0, 1, ..., ceil(K / 2) - 1 of k,
 * out[t][n] = op_bf16_dot2(out[t][n], x[2j], x[2j + 1], W[2j][n],
 * W[2j + 1][n]) (the odd product added first, then the even, each by one
 * F32 FMA with subnormals read and written as zero: VDPBF16PS on every
 * CPU that has it, checked against this C on AMD Zen 5: 32 million random
 * lanes, every bit pattern of the operands); an odd K's last pair has zero
 * for its missing half. Nothing depends on T, the tile, the thread or the
 * layout, so the bits are batch-invariant (tests/test_engine.c checks them
 * against that C for every row count 1..70 and 261, both file layouts,
 * whole and partial blocks).
 *
 * Weights: VDPBF16PS wants the two k of a pair in one 32-bit lane, which
 * neither file layout has (both keep one k per row). The pair copy has it:
 * built once at load from either layout, panels of 64 columns (the last
 * padded with zero columns), each panel's pairs one after the other, so
 * that pair j of columns [64p, 64p + 64) is 64 32-bit lanes at
 * (p * ceil(K / 2) + j) * 64, W[2j][n] in the low half, W[2j + 1][n] (or
 * zero) in the high. Every tile then reads four whole vectors a pair and
 * keeps its accumulators in column order: no shuffle per VDPBF16PS, no
 * packed strip per chunk of rows. It costs private memory the size of the
 * projections (GPT-2 small: 170 MB) in place of the file's pages, which
 * this level reads only once, to build it (GPT-2 small's wte: 77 MB more);
 * docs/
 * benchmarks.md has the measurements that chose it over interleaving in
 * registers (the version before, 0.66-0.97x of the widening kernels at one
 * row). A pairs64 file (formats/include/wformat.h) stores the projections
 * in exactly this order, and engine/model.c then points pairs into its
 * mapping instead of building the copy (shared, 0 private bytes for them).
 */
#include "matmul.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define PAIRS_PAGE ((size_t)2 << 20)

/* Rows per chunk: the chunk's inputs as BF16 pairs live in the shared part
 * of the scratch, after the threads' parts. */
#define MMB_CHUNK 256

size_t op_matmul_bf16_scratch_floats(size_t K)
{
    return MMB_CHUNK * ((K + 1) / 2);
}

size_t op_lm_head_scratch_floats(size_t C)
{
    return op_matmul_bf16_scratch_floats(C);
}

size_t op_w_pairs_bytes(size_t K, size_t N)
{
    return (N + OP_PANEL - 1) / OP_PANEL * ((K + 1) / 2) * OP_PANEL * sizeof(uint32_t);
}

/* The mapping's length for a copy of `bytes`: whole 4 KB pages. */
static size_t pairs_len(size_t bytes)
{
    return (bytes + 4095) / 4096 * 4096;
}

/* Anonymous memory for a copy, starting on a 2 MB boundary and asked for
 * as transparent huge pages ("madvise" mode, Debian's default): a step
 * streams the copies, and with 4 KB pages the LM head's 77 MB at one row
 * took 3.0-3.7 ms against 2.3-2.5 (bench_ops, 1 thread). Mapped, not
 * malloc'd, so that nothing but the copy touches its pages (the length is
 * whole 4 KB pages, not 2 MB: a copy's last part takes small pages rather
 * than resident padding). */
void *op_copy_map(size_t bytes)
{
    size_t len = pairs_len(bytes);
    char *r =
        mmap(NULL, len + PAIRS_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return NULL;
    size_t head = (PAIRS_PAGE - (uintptr_t)r % PAIRS_PAGE) % PAIRS_PAGE;
    if (head > 0) munmap(r, head);
    munmap(r + head + len, PAIRS_PAGE - head);
#ifdef MADV_HUGEPAGE
    (void)madvise(r + head, len, MADV_HUGEPAGE); /* advice: without it, small pages */
#endif
    return r + head;
}

void op_copy_unmap(const void *p, size_t bytes)
{
    if (p != NULL) munmap((void *)(uintptr_t)p, pairs_len(bytes));
}

/* The pair copy of W (K, N), of a projection in its layout or (rows) of a
 * (N, K) matrix read as its transpose. */
static int pairs_build(op_w *w, size_t K, size_t N, int rows)
{
    w->pairs = NULL;
    if (w->dt != OP_BF16 || !op_use_avx512bf16() || K == 0 || N == 0) return 0;
    const size_t KP = (K + 1) / 2, NP = (N + OP_PANEL - 1) / OP_PANEL;
    uint32_t *p = op_copy_map(op_w_pairs_bytes(K, N));
    if (p == NULL) return -1;
    const uint16_t *src = w->p;
    const mm_ctx c = {.W = *w, .K = K, .N = N}; /* for mm_wi */
    for (size_t pn = 0; pn < NP; pn++) {
        size_t n0 = pn * OP_PANEL, cols = N - n0 < OP_PANEL ? N - n0 : OP_PANEL;
        for (size_t j = 0; j < KP; j++) {
            uint32_t *o = p + (pn * KP + j) * OP_PANEL;
            int two = 2 * j + 1 < K;
            for (size_t i = 0; i < OP_PANEL; i++) {
                if (i >= cols) {
                    o[i] = 0;
                    continue;
                }
                size_t n = n0 + i, k = 2 * j;
                /* W[k][n] and W[k + 1][n]: a (N, K) matrix read as its
                 * transpose, or a projection in its layout (mm_wi). */
                uint32_t lo = src[rows ? n * K + k : mm_wi(&c, k, n)];
                uint32_t hi = !two ? 0 : src[rows ? n * K + k + 1 : mm_wi(&c, k + 1, n)];
                o[i] = lo | hi << 16;
            }
        }
    }
    w->pairs = p;
    return 0;
}

int op_w_pairs_build(op_w *w, size_t K, size_t N)
{
    return pairs_build(w, K, N, 0);
}

int op_w_pairs_build_rows(op_w *w, size_t V, size_t C)
{
    return pairs_build(w, C, V, 1);
}

void op_w_pairs_free(op_w *w, size_t K, size_t N)
{
    op_copy_unmap(w->pairs, op_w_pairs_bytes(K, N));
    w->pairs = NULL;
}

#if HAVE_X86
#define OP_BF16DP __attribute__((target("avx512f,avx512bw,avx512bf16,avx2,fma,f16c")))

/* Up to this many rows, W is read once per step from memory, all of K at
 * once; more take k-blocks of MMB_KC pairs (a panel's 32 KB), every 6-row
 * tile over a k-block before the next. */
#define MMB_DIRECT_MAX 4
#define MMB_ROWS 6 /* rows per tile (24 accumulators) */
#define MMB_KC 128

typedef struct {
    mm_ctx c;           /* out, in: the chunk's first row; T: its rows */
    const uint32_t *xb; /* the chunk's rows as BF16 pairs, T x KP */
    size_t KP;          /* ceil(K / 2) */
    size_t thread_floats;
} mmb_ctx;

/* Rows [begin, end) of the chunk into pairs of op_f32_to_bf16_dp (the
 * missing half of an odd K 0), 32 floats at a time (VCVTNE2PS2BF16). */
OP_BF16DP static void mmb_convert_avx512(void *arg, size_t begin, size_t end, size_t tid)
{
    (void)tid;
    const mmb_ctx *m = arg;
    const size_t K = m->c.K;
    for (size_t t = begin; t < end; t++) {
        const float *x = m->c.in + t * K;
        uint16_t *o = (uint16_t *)(m->xb + t * m->KP);
        for (size_t k = 0; k < 2 * m->KP; k += 32) {
            size_t left = K > k ? K - k : 0;
            __mmask16 m0 = (__mmask16)(left >= 16 ? 0xFFFFu : (1u << left) - 1);
            __mmask16 m1 = (__mmask16)(left >= 32   ? 0xFFFFu
                                       : left <= 16 ? 0u
                                                    : (1u << (left - 16)) - 1);
            __m512 a = _mm512_maskz_loadu_ps(m0, x + k), b = _mm512_maskz_loadu_ps(m1, x + k + 16);
            __m512i r = (__m512i)_mm512_cvtne2ps_pbh(b, a);
            size_t pe = 2 * m->KP - k; /* halves left in the row's pairs */
            __mmask32 ms = pe >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << pe) - 1);
            _mm512_mask_storeu_epi16(o + k, ms, r);
        }
    }
}

/* The columns of [n + 16 q, n + 16 q + 16) below N. */
static inline __mmask16 mmb_cols(size_t n, size_t q, size_t N)
{
    size_t c = n + 16 * q;
    return (__mmask16)(c >= N ? 0u : N - c >= 16 ? 0xFFFFu : (1u << (N - c)) - 1);
}

/*
 * One tile: R rows from t0 x the 64 columns from n (a panel; those past N
 * masked), pairs [j0, j1), from the bias (j0 == 0) or what out holds.
 */
OP_BF16DP __attribute__((always_inline)) static inline void
mmb_tile(const mmb_ctx *m, size_t t0, size_t n, size_t j0, size_t j1, const size_t R)
{
    const mm_ctx *c = &m->c;
    const size_t N = c->N, KP = m->KP;
    __m512 acc[MMB_ROWS][4];
    __mmask16 cm[4];
#pragma GCC unroll 4
    for (size_t q = 0; q < 4; q++) cm[q] = mmb_cols(n, q, N);
#pragma GCC unroll 6
    for (size_t r = 0; r < R; r++)
#pragma GCC unroll 4
        for (size_t q = 0; q < 4; q++)
            acc[r][q] = j0 > 0 ? _mm512_maskz_loadu_ps(cm[q], c->out + (t0 + r) * N + n + 16 * q)
                        : c->b != NULL ? _mm512_maskz_loadu_ps(cm[q], c->b + n + 16 * q)
                                       : _mm512_setzero_ps();
    const uint32_t *w = c->W.pairs + ((n / OP_PANEL) * KP + j0) * OP_PANEL;
    const uint32_t *x = m->xb + t0 * KP;
    for (size_t j = j0; j < j1; j++, w += OP_PANEL) {
        __m512i wv[4];
#pragma GCC unroll 4
        for (size_t q = 0; q < 4; q++) wv[q] = _mm512_load_si512((const void *)(w + 16 * q));
#pragma GCC unroll 6
        for (size_t r = 0; r < R; r++) {
            __m512bh xr = (__m512bh)_mm512_set1_epi32((int)x[r * KP + j]);
#pragma GCC unroll 4
            for (size_t q = 0; q < 4; q++)
                acc[r][q] = _mm512_dpbf16_ps(acc[r][q], xr, (__m512bh)wv[q]);
        }
    }
#pragma GCC unroll 6
    for (size_t r = 0; r < R; r++)
#pragma GCC unroll 4
        for (size_t q = 0; q < 4; q++)
            _mm512_mask_storeu_ps(c->out + (t0 + r) * N + n + 16 * q, cm[q], acc[r][q]);
}

/* R rows of the chunk from t0 x the panel at n, pairs [j0, j1). */
OP_BF16DP static void mmb_rows(const mmb_ctx *m, size_t t0, size_t R, size_t n, size_t j0,
                               size_t j1)
{
    switch (R) {
    case 6: mmb_tile(m, t0, n, j0, j1, 6); break;
    case 5: mmb_tile(m, t0, n, j0, j1, 5); break;
    case 4: mmb_tile(m, t0, n, j0, j1, 4); break;
    case 3: mmb_tile(m, t0, n, j0, j1, 3); break;
    case 2: mmb_tile(m, t0, n, j0, j1, 2); break;
    default: mmb_tile(m, t0, n, j0, j1, 1); break;
    }
}

/* One row against two whole panels, [na, na + 64) and [nb, nb + 64), all
 * of K with the accumulators in registers: two streams of W for the
 * prefetchers and eight independent chains (as kb_tile2_avx512 in
 * op_matmul.c). The same operations per column as mmb_tile. */
OP_BF16DP static void mmb_row1x2(const mmb_ctx *m, size_t na, size_t nb)
{
    const mm_ctx *c = &m->c;
    const size_t KP = m->KP;
    const uint32_t *wa = c->W.pairs + (na / OP_PANEL) * KP * OP_PANEL;
    const uint32_t *wb = c->W.pairs + (nb / OP_PANEL) * KP * OP_PANEL;
    __m512 a[4], b[4];
#pragma GCC unroll 4
    for (size_t q = 0; q < 4; q++) {
        a[q] = c->b != NULL ? _mm512_loadu_ps(c->b + na + 16 * q) : _mm512_setzero_ps();
        b[q] = c->b != NULL ? _mm512_loadu_ps(c->b + nb + 16 * q) : _mm512_setzero_ps();
    }
    const uint32_t *x = m->xb;
    for (size_t j = 0; j < KP; j++, wa += OP_PANEL, wb += OP_PANEL) {
        __m512bh xr = (__m512bh)_mm512_set1_epi32((int)x[j]);
#pragma GCC unroll 4
        for (size_t q = 0; q < 4; q++) {
            a[q] = _mm512_dpbf16_ps(a[q], xr,
                                    (__m512bh)_mm512_load_si512((const void *)(wa + 16 * q)));
            b[q] = _mm512_dpbf16_ps(b[q], xr,
                                    (__m512bh)_mm512_load_si512((const void *)(wb + 16 * q)));
        }
    }
#pragma GCC unroll 4
    for (size_t q = 0; q < 4; q++) {
        _mm512_storeu_ps(c->out + na + 16 * q, a[q]);
        _mm512_storeu_ps(c->out + nb + 16 * q, b[q]);
    }
}

static void mmb_task(void *arg, size_t begin, size_t end, size_t tid)
{
    mmb_ctx task = *(const mmb_ctx *)arg;
    mm_ctx *c = &task.c;
    const size_t KP = task.KP;
    size_t n0 = begin * OP_PANEL, n1 = end * OP_PANEL < c->N ? end * OP_PANEL : c->N;
    if (c->b == NULL && c->bias.p != NULL) { /* a 16-bit bias: this task's columns, widened */
        float *wb = c->pack + tid * task.thread_floats + (c->K + MM512_ROWS) * MM512_COLS;
        op_widen(wb + n0, &c->bias, n0, n1 - n0);
        c->b = wb;
    }
    size_t n = n0;
    if (c->T == 1) { /* whole panels in pairs, the first half beside the second */
        size_t nblk = (n1 - n0) / OP_PANEL, half = (nblk + 1) / 2;
        for (size_t i = 0; i < nblk / 2; i++)
            mmb_row1x2(&task, n0 + OP_PANEL * i, n0 + OP_PANEL * (i + half));
        if (nblk % 2 == 1) mmb_rows(&task, 0, 1, n0 + OP_PANEL * (half - 1), 0, KP);
        n = n0 + OP_PANEL * nblk;
    }
    for (; n < n1; n += OP_PANEL) {
        if (c->T <= MMB_DIRECT_MAX) {
            mmb_rows(&task, 0, c->T, n, 0, KP);
            continue;
        }
        for (size_t j0 = 0; j0 < KP; j0 += MMB_KC) {
            size_t j1 = j0 + MMB_KC < KP ? j0 + MMB_KC : KP;
            for (size_t t = 0; t < c->T; t += MMB_ROWS)
                mmb_rows(&task, t, c->T - t < MMB_ROWS ? c->T - t : MMB_ROWS, n, j0, j1);
        }
    }
}

void op_matmul_bf16dp(op_pool *pool, const mm_ctx *c, size_t thread_floats)
{
    size_t threads = op_pool_size(pool);
    mmb_ctx m = {*c, (const uint32_t *)(c->pack + threads * thread_floats), (c->K + 1) / 2,
                 thread_floats};
    for (size_t t0 = 0; t0 < c->T; t0 += MMB_CHUNK) {
        m.c.T = c->T - t0 < MMB_CHUNK ? c->T - t0 : MMB_CHUNK;
        m.c.in = c->in + t0 * c->K;
        m.c.out = c->out + t0 * c->N;
        if (m.c.T == 1)
            mmb_convert_avx512(&m, 0, 1, 0);
        else
            op_pool_run(pool, m.c.T, mmb_convert_avx512, &m);
        op_pool_run(pool, (c->N + OP_PANEL - 1) / OP_PANEL, mmb_task, &m);
    }
}

void op_lm_head_bf16dp(op_pool *pool, float *scratch, float *out, const float *h, const op_w *wte,
                       size_t T, size_t C, size_t V)
{
    mm_ctx c = {out, h, *wte, {NULL, NULL, OP_F32, 0, NULL, NULL}, NULL, T, C, V, scratch};
    op_matmul_bf16dp(pool, &c, 0);
}

#endif
