/*
 * bench/bench_dnnl.c [-m ROWS] [-s SHAPES] [-r REPS] [-c COPIES] [-t THREADS]:
 * gpt2d's matmul beside oneDNN's (issue 25), at GPT-2 small's shapes, in one
 * run and one table.
 *
 * For each shape (K x N) and row count M it times, round by round in turn:
 *   gpt2d F32          op_matmul on F32 panel64 weights, as a panel64 file
 *                      serves them, at the engine's kernel level;
 *   oneDNN f32         the matmul primitive, f32 x f32 -> f32, with bias;
 *   gpt2d BF16         op_matmul on BF16 panel64 weights at the widening
 *                      kernels (this process runs at GPT2D_KERNELS=avx512
 *                      when GPT2D_KERNELS is not set);
 *   gpt2d BF16 dp      the same at the level "avx512-bf16" (VDPBF16PS),
 *                      when the CPU has AVX512_BF16: run in a child process
 *                      forked before any kernel ran, with
 *                      GPT2D_KERNELS=avx512-bf16, as the engine reads the
 *                      level once (engine/op_dispatch.c);
 *   oneDNN bf16        the matmul primitive, bf16 x bf16 -> f32 (the F32
 *                      inputs rounded to BF16 beforehand, outside the time;
 *                      gpt2d's BF16 dp rounds them inside op_matmul).
 * oneDNN's weights are in the format its primitive asks for
 * (format_tag::any), reordered once per shape and M outside the time, as a
 * user of oneDNN would keep them. gpt2d's LM head (shape "lm", 768 x 50257)
 * is op_lm_head over wte (V, C), no bias; oneDNN reads the same wte as its
 * (K, N) weights transposed (tag ba) before the reorder.
 *
 * Each figure is the fastest of REPS rounds (interference only ever adds
 * time), a round being one call on each of COPIES weight copies (so that the
 * weights come from memory, not cache, as a model's 12 layers do; the LM
 * head, 154 MB in F32 alone, always takes one copy). Two clocks: the wall
 * (CLOCK_MONOTONIC) and the process's CPU time (CLOCK_PROCESS_CPUTIME_ID,
 * which a process on the sibling hyperthread inflates less; with THREADS > 1
 * it sums every thread, spinning workers included). GFLOP/s is 2 M K N over
 * the time; "x oneDNN" is gpt2d's time over oneDNN's of the same precision
 * (above 1: gpt2d slower).
 *
 * Numerics, which make this a check: for each pair the largest difference
 * over the M x N outputs relative to the largest oneDNN output. F32 against
 * f32 must be within 1e-5 (only the order of the sums differs); the BF16
 * dp level against oneDNN's bf16 within 1e-5 too (both round the inputs to
 * BF16 to nearest even and form exact products: only the order of the sums
 * differs); the widening level, which keeps the inputs in F32, within
 * 2^-8 (the inputs' BF16 rounding, 2^-9 relative each, in oneDNN's). Beyond
 * a bound the program prints FAIL and exits 1.
 *
 * Arguments (defaults): -m 1,64,512 the row counts; -s qkv,proj,fc,fc2 the
 * shapes (qkv 768x2304, proj 768x768, fc 768x3072, fc2 3072x768, lm
 * 768x50257, or "all"); -r 5 rounds; -c 4 weight copies; -t 1 threads (each
 * library's own: gpt2d's pool, oneDNN's OpenMP). The quick check meson runs
 * (suite bench): -s proj -m 1,64 -r 2 -c 1.
 *
 * Built only where oneDNN (Debian's libdnnl-dev, a benchmark-only
 * dependency, like OpenBLAS) is found: bench/meson.build.
 */
#include "bench_dnnl_child.h"
#include "bench_dnnl_onednn.h"
#include "engine.h"

#include <oneapi/dnnl/dnnl_debug.h>

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if HAVE_X86
#include <cpuid.h>
#endif

#define MAX_ROWS 8
#define BOUND_F32 1e-5
#define BOUND_BF16_DP 1e-5
#define BOUND_BF16 (1.0 / 256)

static const bd_shape shapes[] = {{"qkv", 768, 2304, 0},
                                  {"proj", 768, 768, 0},
                                  {"fc", 768, 3072, 0},
                                  {"fc2", 3072, 768, 0},
                                  {"lm", 768, 50257, 1}};
#define NSHAPES (sizeof shapes / sizeof shapes[0])
_Static_assert(NSHAPES == BD_NSHAPES, "bench_dnnl_shared.h counts the shapes");

/* The five implementations, in the order each round runs them. */
enum { G_F32, D_F32, G_BF16, G_BF16DP, D_BF16, NIMPL };

/* ---- Shared memory: one anonymous shared mapping, bumped ------------- */

typedef struct {
    char *base;
    size_t size, used;
} bd_arena;

static void *arena_take(bd_arena *a, size_t bytes)
{
    size_t at = (a->used + 63) / 64 * 64;
    if (at > a->size || a->size - at < bytes) { /* main sizes it: a bug */
        fprintf(stderr, "bench_dnnl: the arena is too small\n");
        abort();
    }
    a->used = at + bytes;
    return a->base + at;
}

/* ---- Data ---------------------------------------------------------------- */

/* gpt2d's array from the plain one: panel64 (kernels.h, op_w) for a
 * projection, wte as it is for the LM head. */
static void to_gpt2d(float *dst, const float *plain, const bd_shape *s)
{
    if (s->lm) {
        memcpy(dst, plain, s->K * s->N * sizeof *dst);
        return;
    }
    for (size_t k = 0; k < s->K; k++)
        for (size_t n = 0; n < s->N; n++)
            dst[((n / OP_PANEL) * s->K + k) * OP_PANEL + n % OP_PANEL] = plain[k * s->N + n];
}

/* ---- Between rounds -------------------------------------------------------- */

/* With several threads, the workers of the implementation that ran last
 * (OpenMP's spin for a while, gpt2d's pool's briefly) would take the
 * hyperthreads from the next one: 5 ms idle, outside the time, lets them
 * fall asleep first. */
static void settle(void)
{
    struct timespec ts = {0, 5000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- The CPU ----------------------------------------------------------------- */

static int has_word(const char *list, const char *w)
{
    size_t n = strlen(w);
    for (const char *p = list; (p = strstr(p, w)) != NULL; p += n)
        if ((p == list || p[-1] == ' ' || p[-1] == '\t')
            && (p[n] == ' ' || p[n] == '\n' || p[n] == '\0'))
            return 1;
    return 0;
}

/* The model name and the matrix-unit flags /proc/cpuinfo lists. */
static void print_cpu(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char *line = NULL, *model = NULL, *flags = NULL;
    size_t cap = 0;
    while (f != NULL && getline(&line, &cap, f) > 0 && (model == NULL || flags == NULL)) {
        char *colon = strchr(line, ':');
        if (colon == NULL) continue;
        if (model == NULL && strncmp(line, "model name", 10) == 0) model = strdup(colon + 2);
        if (flags == NULL && strncmp(line, "flags", 5) == 0) flags = strdup(colon + 1);
    }
    if (f != NULL) fclose(f);
    free(line);
    if (model != NULL) model[strcspn(model, "\n")] = '\0';
    printf("cpu: %s, %ld CPUs online\n", model ? model : "(unknown)",
           sysconf(_SC_NPROCESSORS_ONLN));
    static const char *const want[] = {"avx512f",     "avx512bw", "avx512_bf16",
                                       "avx512_vnni", "amx_bf16", "amx_int8"};
    printf("flags:");
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        printf(" %s %s", want[i], flags && has_word(flags, want[i]) ? "yes" : "no");
    printf("\n");
    free(model);
    free(flags);
}

/* What op_use_avx512bf16 asks of the CPU (avx512f, avx512bw, AVX512_BF16),
 * without asking the engine: its answer is cached for the process. */
static int cpu_has_bf16dp(void)
{
#if HAVE_X86
    unsigned a, b, c, d;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
           && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5)) != 0;
#else
    return 0;
#endif
}

/* ---- Arguments ---------------------------------------------------------------- */

/* A comma-separated list of integers in [1, max]; the count, or -1. */
static int parse_sizes(const char *s, size_t *v, int cap, size_t max)
{
    int n = 0;
    for (;;) {
        char *end;
        errno = 0;
        unsigned long long u = strtoull(s, &end, 10);
        if (end == s || errno != 0 || u < 1 || u > max || n == cap) return -1;
        v[n++] = (size_t)u;
        if (*end == '\0') return n;
        if (*end != ',') return -1;
        s = end + 1;
    }
}

/* Shape names, comma-separated, or "all": sel[i] set for each. 0 or -1. */
static int parse_shapes(const char *s, int *sel)
{
    if (strcmp(s, "all") == 0) {
        for (size_t i = 0; i < NSHAPES; i++) sel[i] = 1;
        return 0;
    }
    while (*s != '\0') {
        size_t len = strcspn(s, ",");
        size_t i = 0;
        while (i < NSHAPES
               && !(strlen(shapes[i].name) == len && strncmp(s, shapes[i].name, len) == 0))
            i++;
        if (i == NSHAPES) return -1;
        sel[i] = 1;
        s += len;
        if (*s == ',') s++;
    }
    return 0;
}

/* ---- Reporting ----------------------------------------------------------------- */

typedef struct {
    int ran;
    char kernel[64]; /* the level or oneDNN's implementation */
    char why[600];   /* not run: the reason */
    bd_time best;    /* per call */
    float *out;      /* (M, N) */
} bd_impl;

/* What row i of a shape says: gpt2d's weights are panel64 projections, or
 * wte (V, C) at the LM head. */
static const char *impl_name(int i, int lm)
{
    switch (i) {
    case G_F32: return lm ? "gpt2d F32 wte" : "gpt2d F32 panel64";
    case D_F32: return "oneDNN f32";
    case G_BF16:
    case G_BF16DP: return lm ? "gpt2d BF16 wte" : "gpt2d BF16 panel64";
    default: return "oneDNN bf16->f32";
    }
}

/* max |a - b| / max |b| over n. */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double dmax = 0, bmax = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]), m = fabs((double)b[i]);
        if (!(d <= dmax)) dmax = d; /* a NaN wins */
        if (m > bmax) bmax = m;
    }
    return bmax > 0 ? dmax / bmax : dmax;
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_dnnl [-m ROWS,...] [-s qkv,proj,fc,fc2,lm|all] [-r REPS] "
                    "[-c COPIES] [-t THREADS]\n");
}

int main(int argc, char **argv)
{
    size_t rows[MAX_ROWS] = {1, 64, 512}, reps = 5, copies = 4, threads = 1;
    int nrows = 3, sel[NSHAPES] = {1, 1, 1, 1, 0}, opt;
    while ((opt = getopt(argc, argv, "m:s:r:c:t:")) != -1) {
        switch (opt) {
        case 'm': nrows = parse_sizes(optarg, rows, MAX_ROWS, 4096); break;
        case 's':
            memset(sel, 0, sizeof sel);
            if (parse_shapes(optarg, sel) != 0) nrows = -1;
            break;
        case 'r': nrows = parse_sizes(optarg, &reps, 1, 1000) == 1 ? nrows : -1; break;
        case 'c': nrows = parse_sizes(optarg, &copies, 1, MAX_COPIES) == 1 ? nrows : -1; break;
        case 't': nrows = parse_sizes(optarg, &threads, 1, 256) == 1 ? nrows : -1; break;
        default: nrows = -1; break;
        }
        if (nrows < 0) break;
    }
    int any = 0;
    for (size_t i = 0; i < NSHAPES; i++) any |= sel[i];
    if (nrows < 0 || optind != argc || !any) {
        usage();
        return 2;
    }
    /* The engine's default is the highest level, avx512-bf16 for BF16 where
     * the CPU has it: this process measures the widening kernels (the dp
     * child sets its own level). */
    if ((getenv("GPT2D_KERNELS") == NULL || *getenv("GPT2D_KERNELS") == '\0')
        && setenv("GPT2D_KERNELS", "avx512", 1) != 0)
        return 1;
    /* With several threads, OpenMP's workers by default spin after each
     * parallel region, and a 5 ms pause does not stop them taking the
     * sibling hyperthread from gpt2d's pool (proj, 64 rows, 2 threads:
     * gpt2d F32 0.93 ms beside them, 0.42 ms with OMP_WAIT_POLICY=passive).
     * libgomp reads the policy when it loads, so the program runs itself
     * again with it, unless it was set. */
    if (threads > 1 && getenv("OMP_WAIT_POLICY") == NULL) {
        if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return 1;
        execv("/proc/self/exe", argv);
        fprintf(stderr, "bench_dnnl: cannot run again with OMP_WAIT_POLICY=passive: %s\n",
                strerror(errno));
        return 1;
    }
    size_t Mmax = 0, Kmax = 0, Nmax = 0, KNmax = 0, mmK = 0, mmN = 0;
    for (int i = 0; i < nrows; i++) Mmax = rows[i] > Mmax ? rows[i] : Mmax;

    /* The arena: inputs, every shape's gpt2d weights and bias, the dp
     * child's output. */
    size_t bytes = 0;
    for (size_t i = 0; i < NSHAPES; i++) {
        if (!sel[i]) continue;
        const bd_shape *s = &shapes[i];
        size_t nc = s->lm ? 1 : copies;
        bytes += nc * (s->K * s->N * 6 + 128) + s->N * 4 + 64;
        Kmax = s->K > Kmax ? s->K : Kmax;
        Nmax = s->N > Nmax ? s->N : Nmax;
        KNmax = s->K * s->N > KNmax ? s->K * s->N : KNmax;
        if (!s->lm) {
            mmK = s->K > mmK ? s->K : mmK;
            mmN = s->N > mmN ? s->N : mmN;
        }
    }
    bytes += Mmax * Kmax * 4 + Mmax * Nmax * 4 + 128;
    bd_arena arena = {mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0),
                      bytes, 0};
    if (arena.base == MAP_FAILED) {
        fprintf(stderr, "bench_dnnl: cannot map %zu bytes: %s\n", bytes, strerror(errno));
        return 1;
    }
    int rc = 1;
    char err[512];
    bd_data data[NSHAPES];
    memset(data, 0, sizeof data);
    bd_child child = {0};
    bd_gpt2d g = {NULL, NULL};
    bd_impl impl[NIMPL];
    memset(impl, 0, sizeof impl);
    dnnl_engine_t eng = NULL;
    dnnl_stream_t strm = NULL;
    uint16_t *xb = NULL;
    float *plain = NULL;
    float *x = arena_take(&arena, Mmax * Kmax * sizeof(float));
    child.out = arena_take(&arena, Mmax * Nmax * sizeof(float));
    plain = malloc(KNmax * sizeof(float));
    if (plain == NULL) goto out;
    unsigned seed = 7;
    for (size_t i = 0; i < Mmax * Kmax; i++) x[i] = bd_unit(&seed);
    for (size_t i = 0; i < NSHAPES; i++) {
        if (!sel[i]) continue;
        bd_data *d = &data[i];
        d->s = &shapes[i];
        d->copies = d->s->lm ? 1 : copies;
        size_t kn = d->s->K * d->s->N;
        for (size_t c = 0; c < d->copies; c++) {
            d->wf[c] = arena_take(&arena, kn * sizeof(float));
            d->wb[c] = arena_take(&arena, kn * sizeof(uint16_t));
            gen_plain(plain, d->s, c);
            to_gpt2d(d->wf[c], plain, d->s);
            to_bf16(d->wb[c], d->wf[c], kn);
        }
        if (!d->s->lm) {
            d->bias = arena_take(&arena, d->s->N * sizeof(float));
            for (size_t n = 0; n < d->s->N; n++) d->bias[n] = 0.1f * bd_unit(&seed);
        }
    }
    size_t scratch_floats = op_matmul_scratch_floats(threads, mmK ? mmK : 1, mmN ? mmN : 1);
    if (scratch_floats < op_lm_head_scratch_floats(Kmax))
        scratch_floats = op_lm_head_scratch_floats(Kmax);

    print_cpu();
    /* The dp level in its own process, forked before this one asks for a
     * level; on a CPU without AVX512_BF16 its lines say why they did not
     * run. */
    int dp = cpu_has_bf16dp();
    if (dp && child_start(&child, data, x, threads, scratch_floats) != 0) goto out;
    if (dp && strcmp(child.level, "avx512-bf16") != 0) {
        snprintf(impl[G_BF16DP].why, sizeof impl[G_BF16DP].why,
                 "not run: the engine chose %s at GPT2D_KERNELS=avx512-bf16", child.level);
        dp = 0;
    } else if (!dp) {
        snprintf(impl[G_BF16DP].why, sizeof impl[G_BF16DP].why, "not run: CPU lacks avx512_bf16");
    }

    omp_set_num_threads((int)threads);
    g.pool = op_pool_new(threads);
    g.scratch = aligned_alloc(64, scratch_floats * sizeof(float));
    xb = malloc(Mmax * Kmax * sizeof *xb);
    for (int i = 0; i < NIMPL; i++) impl[i].out = malloc(Mmax * Nmax * sizeof(float));
    if (g.pool == NULL || g.scratch == NULL || xb == NULL) goto out;
    for (int i = 0; i < NIMPL; i++)
        if (impl[i].out == NULL) goto out;
    to_bf16(xb, x, Mmax * Kmax);

    dnnl_status_t st = dnnl_engine_create(&eng, dnnl_cpu, 0);
    if (st == dnnl_success) st = dnnl_stream_create(&strm, eng, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        fprintf(stderr, "bench_dnnl: oneDNN's CPU engine and stream: %s\n", dnnl_status2str(st));
        goto out;
    }
    const dnnl_version_t *ver = dnnl_version();
    printf("oneDNN %d.%d.%d (%s), ISA %s; gpt2d kernels: F32 %s, BF16 %s, dp level %s\n",
           ver->major, ver->minor, ver->patch, ver->hash,
           dnnl_cpu_isa2str(dnnl_get_effective_cpu_isa()), eng_kernels_for("f32"),
           eng_kernels_for("bf16"), dp ? child.level : "not run");
    const char *wait = getenv("OMP_WAIT_POLICY");
    printf("OMP_WAIT_POLICY %s; ", wait ? wait : "(unset)");
    printf("threads %zu, fastest of %zu rounds of %zu weight copies (the LM head 1); times per "
           "call; x oneDNN: gpt2d's time over oneDNN's (above 1: gpt2d slower)\n",
           threads, reps, copies);
    printf("\n%-5s %4s  %-20s %-32s %9s %8s %9s %8s %7s %7s %9s\n", "shape", "M", "what", "kernel",
           "wall ms", "GFLOP/s", "cpu ms", "GFLOP/s", "x wall", "x cpu", "rel diff");

    /* Per M, the sums over the shapes run (a layer's projections). */
    double sum[MAX_ROWS][NIMPL];
    int bad = 0, failed = 0; /* an error; a difference beyond its bound */
    memset(sum, 0, sizeof sum);
    for (size_t si = 0; si < NSHAPES; si++) {
        if (!sel[si]) continue;
        const bd_data *d = &data[si];
        const bd_shape *s = d->s;
        for (int ri = 0; ri < nrows; ri++) {
            size_t M = rows[ri];
            bd_dnnl dm[2];
            memset(dm, 0, sizeof dm);
            for (int i = 0; i < NIMPL; i++) {
                impl[i].ran = 0;
                impl[i].best = (bd_time){1e30, 1e30};
            }
            impl[G_F32].ran = impl[G_BF16].ran = 1;
            snprintf(impl[G_F32].kernel, sizeof impl[G_F32].kernel, "%s", eng_kernels_for("f32"));
            snprintf(impl[G_BF16].kernel, sizeof impl[G_BF16].kernel, "%s (widening)",
                     eng_kernels_for("bf16"));
            impl[G_BF16DP].ran = dp;
            snprintf(impl[G_BF16DP].kernel, sizeof impl[G_BF16DP].kernel, "%s",
                     dp ? child.level : "avx512-bf16");
            for (int k = 0; k < 2; k++) {
                int id = k ? D_BF16 : D_F32;
                int got = dnnl_mm_init(&dm[k], d, M, k ? dnnl_bf16 : dnnl_f32, k ? (void *)xb : x,
                                       impl[id].out, plain, eng, strm, err, sizeof err);
                if (got == 1 && k == 1) {
                    snprintf(impl[id].why, sizeof impl[id].why,
                             "not run: oneDNN has no bf16 matmul here (%s)", err);
                    continue;
                }
                if (got != 0) {
                    fprintf(stderr, "bench_dnnl: %s %zu x %zu, M = %zu: %s\n", s->name, s->K, s->N,
                            M, err);
                    dnnl_free_mm(&dm[0]);
                    goto out;
                }
                impl[id].ran = 1;
                snprintf(impl[id].kernel, sizeof impl[id].kernel, "%s", dm[k].impl);
            }
            /* One round of each not timed (first touches), then REPS. */
            for (size_t rep = 0; rep <= reps && !bad; rep++) {
                for (int i = 0; i < NIMPL; i++) {
                    if (!impl[i].ran) continue;
                    if (threads > 1) settle();
                    bd_time t0 = bd_now(), t = {0, 0};
                    switch (i) {
                    case G_F32:
                    case G_BF16:
                        gpt2d_round(&g, d, i == G_BF16, impl[i].out, x, M);
                        t = bd_since(t0);
                        break;
                    case G_BF16DP:
                        if (child_round(&child, (int)si, M, &t) != 0) bad = 1;
                        break;
                    default:
                        if (dnnl_round(&dm[i == D_BF16], strm, err, sizeof err) != 0) {
                            fprintf(stderr, "bench_dnnl: %s, M = %zu: %s\n", s->name, M, err);
                            bad = 1;
                        }
                        t = bd_since(t0);
                        break;
                    }
                    if (rep == 0) continue;
                    t.wall /= (double)d->copies;
                    t.cpu /= (double)d->copies;
                    if (t.wall < impl[i].best.wall) impl[i].best.wall = t.wall;
                    if (t.cpu < impl[i].best.cpu) impl[i].best.cpu = t.cpu;
                }
            }
            dnnl_free_mm(&dm[0]);
            dnnl_free_mm(&dm[1]);
            if (bad) goto out;
            if (dp) memcpy(impl[G_BF16DP].out, child.out, M * s->N * sizeof(float));
            double flop = 2.0 * (double)M * (double)s->K * (double)s->N;
            for (int i = 0; i < NIMPL; i++) {
                bd_impl *p = &impl[i];
                int ref = i < G_BF16 ? D_F32 : D_BF16;
                char shape[16];
                snprintf(shape, sizeof shape, "%s", s->name);
                if (!p->ran) {
                    printf("%-5s %4zu  %-20s %s\n", shape, M, impl_name(i, s->lm), p->why);
                    continue;
                }
                sum[ri][i] += p->best.cpu;
                printf("%-5s %4zu  %-20s %-32s %9.3f %8.1f %9.3f %8.1f", shape, M,
                       impl_name(i, s->lm), p->kernel, p->best.wall * 1e3,
                       flop / p->best.wall / 1e9, p->best.cpu * 1e3, flop / p->best.cpu / 1e9);
                if (i == D_F32 || i == D_BF16 || !impl[ref].ran) {
                    printf("\n");
                    continue;
                }
                double r = rel_diff(p->out, impl[ref].out, M * s->N);
                double bound = i == G_F32 ? BOUND_F32 : i == G_BF16DP ? BOUND_BF16_DP : BOUND_BF16;
                printf(" %7.2f %7.2f %9.1e%s\n", p->best.wall / impl[ref].best.wall,
                       p->best.cpu / impl[ref].best.cpu, r, r <= bound ? "" : " FAIL");
                if (!(r <= bound)) failed = 1;
            }
            fflush(stdout);
        }
    }
    printf("\nsums of the CPU times over the shapes run, gpt2d over oneDNN:\n");
    for (int ri = 0; ri < nrows; ri++) {
        printf("M = %4zu: F32 %.2f", rows[ri], sum[ri][G_F32] / sum[ri][D_F32]);
        if (impl[D_BF16].ran) {
            printf(", BF16 widening %.2f", sum[ri][G_BF16] / sum[ri][D_BF16]);
            if (dp) printf(", BF16 dp %.2f", sum[ri][G_BF16DP] / sum[ri][D_BF16]);
        }
        printf("\n");
    }
    if (failed) {
        printf("FAIL: a difference beyond its bound (F32 %.0e, BF16 dp %.0e, BF16 widening %.1e)\n",
               BOUND_F32, BOUND_BF16_DP, BOUND_BF16);
        rc = 1;
    } else {
        printf("numerics: every pair within its bound (F32 %.0e, BF16 dp %.0e, BF16 widening "
               "%.1e)\n",
               BOUND_F32, BOUND_BF16_DP, BOUND_BF16);
        rc = 0;
    }
out:
    if (child_stop(&child) != 0) rc = 1;
    if (strm != NULL) dnnl_stream_destroy(strm);
    if (eng != NULL) dnnl_engine_destroy(eng);
    for (int i = 0; i < NIMPL; i++) free(impl[i].out);
    free(xb);
    free(plain);
    free(g.scratch);
    op_pool_free(g.pool);
    munmap(arena.base, arena.size);
    return rc;
}
