/*
 * bench/bench_ops.c [THREADS [anon|file [f32|f16|bf16|q8 [hf|panel64]]]]: the engine's
 * matmul and LM head kernels on
 * GPT-2 small's shapes, outside the model: per batch size T (1, 4, 16 and 64
 * as in decode, 256 as in a prefill), the time of one step's worth of
 * projections (12 layers of qkv 768x2304, proj 768x768, fc 768x3072,
 * fc-proj 3072x768, each layer its own 28 MB of weights, 340 MB in all, so
 * that they stream from memory as in the model) and of the LM head
 * (768 x 50257), with their GFLOP/s. Each figure is the fastest of 15
 * repetitions (5 at T = 256): on a shared machine interference only ever
 * adds time, so the minimum is the kernels' own speed. For comparing kernel
 * changes (build before and after, run both alternately); the model-level
 * figures are `gpt2d bench`'s.
 *
 * The weights are read from a file's pages, as the model's are (written to
 * an unnamed file in $TMPDIR or /tmp and mapped read-only): the physical
 * placement of page-cache pages changes what access patterns cost. Tiles
 * that walked W down its rows were 1.3x faster than the k-blocked ones on
 * freshly allocated anonymous memory and slower on the model's mapped file.
 * "anon" keeps them in anonymous memory instead. The weights are F32 unless
 * a format is named: F16 and BF16 are the F32 values rounded, q8 random
 * int8 with random scales (the kernels' time does not depend on the
 * values); "GB/s" is the bytes of weights (with q8's scales) read per
 * second. The projections are in the Hugging Face layout unless panel64
 * is named (kernels.h, op_w; the LM head is the same either way).
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

static float *randn(size_t n, unsigned seed)
{
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (p == NULL) exit(1);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = ((float)(seed >> 9) / (float)(1u << 23) - 0.5f) * 0.1f;
    }
    return p;
}

/* Moves the n arrays (lens[i] bytes each) into one read-only mapping of
 * an unnamed file (O_TMPFILE) in $TMPDIR or /tmp, each at a 64-byte aligned
 * offset, and frees the originals. 0 on success; -1 with errno set, the
 * arrays untouched. */
static int to_file(void **arrays[], const size_t *lens, size_t n)
{
    const char *tmp = getenv("TMPDIR");
    int fd = open(tmp && *tmp ? tmp : "/tmp", O_TMPFILE | O_RDWR, 0600);
    if (fd < 0) return -1;
    size_t *off = malloc((n + 1) * sizeof *off);
    char *map = MAP_FAILED;
    if (off == NULL) goto done;
    off[0] = 0;
    for (size_t i = 0; i < n; i++) {
        size_t bytes = lens[i];
        if (pwrite(fd, *arrays[i], bytes, (off_t)off[i]) != (ssize_t)bytes) goto done;
        off[i + 1] = off[i] + (bytes + 63) / 64 * 64;
    }
    if (ftruncate(fd, (off_t)off[n]) != 0) goto done;
    map = mmap(NULL, off[n], PROT_READ, MAP_PRIVATE, fd, 0);
    if (map != MAP_FAILED)
        for (size_t i = 0; i < n; i++) {
            free(*arrays[i]);
            *arrays[i] = map + off[i];
        }
done:;
    int saved = errno;
    free(off);
    close(fd);
    errno = saved;
    return map == MAP_FAILED ? -1 : 0;
}

/* Array p of n F32 values in format dt (in place for F32; else a new
 * array, p freed): its bytes in *bytes. */
static void *as_format(float *p, size_t n, op_dtype dt, size_t *bytes)
{
    if (dt == OP_F32) {
        *bytes = n * sizeof(float);
        return p;
    }
    size_t es = dt == OP_Q8 ? 1 : 2;
    unsigned char *q = aligned_alloc(64, (n * es + 63) / 64 * 64);
    if (q == NULL) exit(1);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &p[i], sizeof u);
        if (dt == OP_F16) ((uint16_t *)(void *)q)[i] = sft_f32_to_f16(p[i]);
        if (dt == OP_BF16) ((uint16_t *)(void *)q)[i] = (uint16_t)(u >> 16);
        if (dt == OP_Q8) q[i] = (unsigned char)(u >> 11);
    }
    free(p);
    *bytes = n * es;
    return q;
}

/* Array p of a K x N row-major matrix (es bytes an element) rewritten in
 * the panel64 layout (kernels.h, op_w; N a multiple of 64), p freed. The
 * Q8 scales move the same way, their ceil(K / 32) rows as K. */
static void *to_panel(void *p, size_t K, size_t N, size_t es)
{
    unsigned char *q = aligned_alloc(64, (K * N * es + 63) / 64 * 64);
    if (q == NULL) exit(1);
    for (size_t k = 0; k < K; k++)
        for (size_t n = 0; n < N; n++)
            memcpy(q + (((n / 64) * K + k) * 64 + n % 64) * es,
                   (const unsigned char *)p + (k * N + n) * es, es);
    free(p);
    return q;
}

static int parse_dtype(const char *s, op_dtype *dt)
{
    static const char *const names[] = {"f32", "f16", "bf16", "q8"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) {
            *dt = (op_dtype)i;
            return 0;
        }
    return -1;
}

int main(int argc, char **argv)
{
    size_t threads = argc > 1 ? (size_t)atoi(argv[1]) : 0;
    int anon = argc > 2 && strcmp(argv[2], "anon") == 0;
    op_dtype dt = OP_F32;
    int panel = argc > 4 && strcmp(argv[4], "panel64") == 0;
    if ((argc > 2 && !anon && strcmp(argv[2], "file") != 0)
        || (argc > 3 && parse_dtype(argv[3], &dt) != 0)
        || (argc > 4 && !panel && strcmp(argv[4], "hf") != 0) || argc > 5) {
        fprintf(stderr, "usage: bench_ops [THREADS [anon|file [f32|f16|bf16|q8 [hf|panel64]]]]\n");
        return 2;
    }
    op_pool *pool = op_pool_new(threads);
    if (pool == NULL) return 1;
    enum { C = 768, V = 50257, L = 12, TMAX = 256 };
    static const size_t shapes[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};
    /* Every weight array, then (q8) its scales: one per 32 rows and column
     * for a projection, one per 32 elements for wte. */
    void *W[L][4], *S[L][4], *wte, *wte_s = NULL;
    float *b[4];
    void **arrays[2 * (L * 4 + 1)];
    size_t lens[2 * (L * 4 + 1)], n = 0, mm_bytes = 0, lm_bytes = 0;
    for (int i = 0; i < 4; i++) {
        size_t K = shapes[i][0], N = shapes[i][1];
        for (int l = 0; l < L; l++) {
            W[l][i] = as_format(randn(K * N, 11u + (unsigned)(i + 4 * l)), K * N, dt, &lens[n]);
            if (panel) W[l][i] = to_panel(W[l][i], K, N, lens[n] / (K * N));
            arrays[n] = &W[l][i];
            mm_bytes += lens[n++];
            S[l][i] = NULL;
            if (dt == OP_Q8) {
                S[l][i] = randn((K + 31) / 32 * N, 71u + (unsigned)(i + 4 * l));
                if (panel) S[l][i] = to_panel(S[l][i], (K + 31) / 32, N, sizeof(float));
                lens[n] = (K + 31) / 32 * N * sizeof(float);
                arrays[n] = &S[l][i];
                mm_bytes += lens[n++];
            }
        }
        b[i] = randn(N, 21u + (unsigned)i);
    }
    wte = as_format(randn((size_t)V * C, 31u), (size_t)V * C, dt, &lens[n]);
    arrays[n] = &wte;
    lm_bytes += lens[n++];
    if (dt == OP_Q8) {
        wte_s = randn((size_t)V * C / 32, 81u);
        lens[n] = (size_t)V * C / 32 * sizeof(float);
        arrays[n] = &wte_s;
        lm_bytes += lens[n++];
    }
    if (!anon && to_file(arrays, lens, n) != 0) {
        fprintf(stderr, "bench_ops: cannot map the weights from a file in %s: %s\n",
                getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", strerror(errno));
        return 1;
    }
    float *in = randn((size_t)TMAX * 4 * C, 41u), *out = randn((size_t)TMAX * 4 * C, 51u);
    float *logits = randn((size_t)TMAX * V, 61u);
    float *pack = aligned_alloc(64, op_matmul_scratch_floats(op_pool_size(pool), 4 * C, 4 * C)
                                        * sizeof(float));
    if (pack == NULL) return 1;
    /* As the model binds them: BF16 at the "avx512-bf16" level reads the
     * pair copy built here (op_matmul_bf16.c), Q8 at "avx512-vnni" the quad
     * copy (op_matmul_q8.c), not the mapped file. */
    op_w Wl[L][4];
    for (int l = 0; l < L; l++)
        for (int i = 0; i < 4; i++) {
            Wl[l][i] = (op_w){W[l][i], S[l][i], dt, panel, NULL, NULL};
            if (op_w_pairs_build(&Wl[l][i], shapes[i][0], shapes[i][1]) != 0
                || op_w_quads_build(&Wl[l][i], shapes[i][0], shapes[i][1]) != 0)
                return 1;
        }
    op_w wte_w = {wte, wte_s, dt, 0, NULL, NULL};
    if (op_w_pairs_build_rows(&wte_w, V, C) != 0) return 1;
    static const char *const names[] = {"f32", "f16", "bf16", "q8"};
    printf("{\"threads\": %zu, \"weights\": \"%s\", \"format\": \"%s\", \"layout\": \"%s\", "
           "\"runs\": [",
           op_pool_size(pool), anon ? "anonymous memory" : "a mapped file", names[dt],
           panel ? "panel64" : "hf");
    static const size_t Ts[] = {1, 4, 8, 16, 32, 48, 64, 256};
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        size_t T = Ts[ti];
        double best_mm = 1e9, best_lm = 1e9;
        for (int rep = 0; rep < (T >= 256 ? 5 : 15); rep++) {
            double t0 = now();
            for (int l = 0; l < L; l++)
                for (int i = 0; i < 4; i++)
                    op_matmul(pool, pack, out, in, &Wl[l][i],
                              &(op_w){b[i], NULL, OP_F32, 0, NULL, NULL}, T, shapes[i][0],
                              shapes[i][1]);
            double t1 = now();
            op_lm_head(pool, pack, logits, in, &wte_w, T, C, V);
            double t2 = now();
            if (t1 - t0 < best_mm) best_mm = t1 - t0;
            if (t2 - t1 < best_lm) best_lm = t2 - t1;
        }
        double mm_flop = 2.0 * (double)T * L * (C * 3 * C + C * C + 2.0 * C * 4 * C);
        double lm_flop = 2.0 * (double)T * C * V;
        printf(
            "%s{\"T\": %zu, \"matmul_ms\": %.2f, \"matmul_gflops\": %.1f, \"matmul_gb_s\": %.1f, "
            "\"lm_head_ms\": %.2f, \"lm_head_gflops\": %.1f, \"lm_head_gb_s\": %.1f}",
            ti ? ", " : "", T, best_mm * 1e3, mm_flop / best_mm / 1e9,
            (double)mm_bytes / best_mm / 1e9, best_lm * 1e3, lm_flop / best_lm / 1e9,
            (double)lm_bytes / best_lm / 1e9);
        fflush(stdout);
    }
    printf("]}\n");
    return 0;
}
