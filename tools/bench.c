/*
 * tools/bench.c: `gpt2d bench --model DIR`, the engine's speed on this
 * machine, as one JSON object:
 *   - the machine: memory read bandwidth (all threads, 1 GiB), OpenBLAS's
 *     SGEMM rate (2048^3) and the compute peaks (F32 FMA, VDPBF16PS,
 *     VPDPBUSD; AMX tiles named as not built), measured in the same run;
 *     prefill and decode figures are given as GFLOP/s of the weight
 *     matmuls (flop_per_token, model_work below) and as fractions of the
 *     peak that bounds them (the compute peak of the model's kernel path;
 *     at one sequence, the bandwidth bound too);
 *   - prefill: tokens/s for one 512-token prompt;
 *   - decode at 1, 4, 16 and 64 concurrent sequences through the scheduler:
 *     aggregate tokens/s over pure-decode steps, median step time, and, at
 *     one sequence, the fraction of the bandwidth bound (every weight byte
 *     read once per token, in the file's format: eng_model_weight_bytes);
 *   - where step time goes (matmul, attention, LM head, the rest, sampling);
 *   - peak RSS.
 * A benchmark, never a test: numbers go to docs/benchmarks.md.
 */
#include "tools.h"

#include "engine.h"
#include "peaks.h"

#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- Memory bandwidth ------------------------------------------------------ */

typedef struct {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} bw_arg;

/* Reads with the widest loads the engine uses (AVX2 where there is one): a
 * scalar loop under-reports the bandwidth by about a quarter here. */
#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2"))) static uint64_t bw_read_avx2(const uint64_t *p, size_t n)
{
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 16 <= n; i += 16) {
        s0 = _mm256_xor_si256(s0, _mm256_loadu_si256((const void *)(p + i)));
        s1 = _mm256_xor_si256(s1, _mm256_loadu_si256((const void *)(p + i + 4)));
        s2 = _mm256_xor_si256(s2, _mm256_loadu_si256((const void *)(p + i + 8)));
        s3 = _mm256_xor_si256(s3, _mm256_loadu_si256((const void *)(p + i + 12)));
    }
    __m256i s = _mm256_xor_si256(_mm256_xor_si256(s0, s1), _mm256_xor_si256(s2, s3));
    return (uint64_t)_mm256_extract_epi64(s, 0) ^ (uint64_t)_mm256_extract_epi64(s, 3);
}
#endif

static void *bw_read(void *arg)
{
    bw_arg *a = arg;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) {
        a->sum = bw_read_avx2(a->p, a->n);
        return NULL;
    }
#endif
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= a->n; i += 4) {
        s0 += a->p[i];
        s1 += a->p[i + 1];
        s2 += a->p[i + 2];
        s3 += a->p[i + 3];
    }
    a->sum = s0 ^ s1 ^ s2 ^ s3;
    return NULL;
}

/* GB/s reading 1 GiB with nthreads threads; the best of 5 passes. */
static double bandwidth(size_t nthreads)
{
    size_t bytes = (size_t)1 << 30, n = bytes / sizeof(uint64_t);
    uint64_t *buf = malloc(bytes);
    if (buf == NULL) return 0;
    for (size_t i = 0; i < n; i++) buf[i] = i;
    double best = 0;
    pthread_t th[64];
    bw_arg args[64];
    if (nthreads > 64) nthreads = 64;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = now_s();
        for (size_t k = 0; k < nthreads; k++) {
            args[k] = (bw_arg){buf + k * (n / nthreads), n / nthreads, 0};
            pthread_create(&th[k], NULL, bw_read, &args[k]);
        }
        uint64_t x = 0;
        for (size_t k = 0; k < nthreads; k++) {
            pthread_join(th[k], NULL);
            x ^= args[k].sum;
        }
        double dt = now_s() - t0;
        if (x == 42) fprintf(stderr, "."); /* keeps the sums alive */
        if ((double)bytes / dt / 1e9 > best) best = (double)bytes / dt / 1e9;
    }
    free(buf);
    return best;
}

/* GFLOP/s of OpenBLAS SGEMM on 2048^3, the best of 3. */
static double sgemm_rate(void)
{
    size_t n = 2048;
    float *a = malloc(n * n * sizeof *a), *b = malloc(n * n * sizeof *b),
          *c = malloc(n * n * sizeof *c);
    if (!a || !b || !c) {
        free(a);
        free(b);
        free(c);
        return 0;
    }
    for (size_t i = 0; i < n * n; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    double best = 0;
    for (int pass = 0; pass < 3; pass++) {
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)n, (blasint)n, (blasint)n,
                    1.0f, a, (blasint)n, b, (blasint)n, 0.0f, c, (blasint)n);
        double g = 2.0 * (double)n * (double)n * (double)n / (now_s() - t0) / 1e9;
        if (g > best) best = g;
    }
    free(a);
    free(b);
    free(c);
    return best;
}

/* ---- Engine runs ------------------------------------------------------------- */

typedef struct {
    size_t tokens;
    int done;
} bench_req;

static void on_event(void *user, const eng_event *ev)
{
    bench_req *r = user;
    if (ev->kind == ENG_EV_TOKEN) r->tokens++;
    if (ev->kind == ENG_EV_DONE) r->done = 1;
}

/* The weight matmuls' work, in flops a token: 2 a weight of every matrix
 * the token's row is multiplied by. A prompt token goes through the
 * projections only (params less wte and wpe; the biases and layer norms
 * among them are a fraction of a percent), since only a prompt's last row
 * reaches the LM head; a generated token through the LM head too (wte,
 * n_vocab x n_embd). Attention is not counted. */
typedef struct {
    double proj, lm;                  /* weights: projections, LM head */
    double prefill_peak, decode_peak; /* the compute peaks that bound them */
} work;

/* The peaks come from the kernel path: VDPBF16PS's on the avx512-bf16
 * level (projections and LM head), the F32 FMA's on the widening levels;
 * q8 on avx512-vnni runs its projections on VPDPBUSD and its LM head on
 * the F32 FMA, so a generated token's bound is the rate at which both
 * parts would take their least time. */
static work model_work(const eng_model *m, double fma, double bf16, double int8)
{
    const eng_config *cfg = eng_model_config(m);
    double all = (double)eng_model_params(m);
    work w = {.lm = (double)cfg->n_vocab * (double)cfg->n_embd};
    w.proj = all - w.lm - (double)cfg->n_ctx * (double)cfg->n_embd;
    if (w.proj < 0) w.proj = 0;
    const char *k = eng_model_kernels(m);
    if (strcmp(k, "avx512-bf16") == 0) {
        w.prefill_peak = w.decode_peak = bf16;
    } else if (strcmp(k, "avx512-vnni") == 0 && int8 > 0 && fma > 0) {
        w.prefill_peak = int8;
        w.decode_peak = (w.proj + w.lm) / (w.proj / int8 + w.lm / fma);
    } else {
        w.prefill_peak = w.decode_peak = fma;
    }
    return w;
}

static double frac(double x, double peak)
{
    return peak > 0 ? x / peak : 0.0;
}

static long peak_rss_kb(void)
{
    FILE *fp = fopen("/proc/self/status", "r");
    if (fp == NULL) return -1;
    char line[256];
    long v = -1;
    while (fgets(line, sizeof line, fp) != NULL)
        if (strncmp(line, "VmHWM:", 6) == 0) v = strtol(line + 6, NULL, 10);
    fclose(fp);
    return v;
}

typedef struct {
    size_t seqs;
    double tokens_per_s, step_ms;
    size_t decode_steps;
    eng_times times;
} decode_result;

/* nseq sequences of a 32-token prompt and gen new tokens each, run to the
 * end; decode figures from the steps in which every row was a decode row. */
static int run_decode(const eng_model *m, const eng_sched_opts *o, size_t nseq, size_t gen,
                      decode_result *out, char *err, size_t errlen)
{
    eng_sched *s;
    if (eng_sched_new(m, o, &s, err, errlen) != ENG_OK) return -1;
    size_t V = eng_model_config(m)->n_vocab;
    bench_req *reqs = calloc(nseq, sizeof *reqs);
    double *steps = malloc(nseq * gen * sizeof *steps);
    int32_t prompt[32];
    int rc = -1;
    if (reqs == NULL || steps == NULL) goto done;
    for (size_t i = 0; i < nseq; i++) {
        for (size_t k = 0; k < 32; k++) prompt[k] = (int32_t)((i * 131 + k * 17) % V);
        eng_request r = {.prompt = prompt,
                         .nprompt = 32,
                         .max_tokens = gen,
                         .sampling = {.temperature = 0.8f, .top_k = 40, .top_p = 1},
                         .seed = i,
                         .ignore_eos = 1,
                         .logprobs = -1,
                         .on_event = on_event,
                         .user = &reqs[i]};
        uint64_t id;
        if (eng_sched_submit(s, &r, &id, err, errlen) != ENG_OK) goto done;
    }
    size_t nsteps = 0, decoded = 0;
    double decode_time = 0;
    eng_times t_before = {0};
    int measuring = 0;
    for (;;) {
        eng_sched_stats before;
        eng_sched_stats_get(s, &before);
        if (!eng_sched_plan(s)) break;
        double t0 = now_s();
        eng_sched_execute(s);
        double dt = now_s() - t0;
        eng_sched_complete(s);
        eng_sched_stats st;
        eng_sched_stats_get(s, &st);
        /* A pure decode step: as many rows as sequences, all of them running. */
        if (st.last_step_rows == st.last_step_seqs && st.last_step_seqs == nseq) {
            if (!measuring) {
                t_before = before.times;
                measuring = 1;
            }
            steps[nsteps++] = dt;
            decoded += st.last_step_seqs;
            decode_time += dt;
            out->times = st.times;
        }
    }
    out->times.matmul -= t_before.matmul;
    out->times.attention -= t_before.attention;
    out->times.lm_head -= t_before.lm_head;
    out->times.other -= t_before.other;
    out->times.sample -= t_before.sample;
    out->seqs = nseq;
    out->decode_steps = nsteps;
    out->tokens_per_s = decode_time > 0 ? (double)decoded / decode_time : 0;
    out->step_ms = median(steps, nsteps) * 1e3;
    rc = 0;
done:
    free(steps);
    free(reqs);
    eng_sched_free(s);
    return rc;
}

static double run_prefill(const eng_model *m, const eng_sched_opts *o, size_t n, int reps,
                          char *err, size_t errlen)
{
    size_t V = eng_model_config(m)->n_vocab;
    int32_t *prompt = malloc(n * sizeof *prompt);
    double *t = malloc((size_t)reps * sizeof *t);
    double result = -1;
    if (prompt == NULL || t == NULL) goto done;
    for (size_t k = 0; k < n; k++) prompt[k] = (int32_t)((k * 7919) % V);
    for (int r = 0; r < reps; r++) {
        eng_sched *s;
        if (eng_sched_new(m, o, &s, err, errlen) != ENG_OK) goto done;
        bench_req q = {0};
        eng_request req = {.prompt = prompt,
                           .nprompt = n,
                           .max_tokens = 1,
                           .logprobs = -1,
                           .ignore_eos = 1,
                           .on_event = on_event,
                           .user = &q};
        uint64_t id;
        if (eng_sched_submit(s, &req, &id, err, errlen) != ENG_OK) {
            eng_sched_free(s);
            goto done;
        }
        double t0 = now_s();
        while (eng_sched_step(s)) {
        }
        t[r] = now_s() - t0;
        eng_sched_free(s);
    }
    result = (double)n / median(t, (size_t)reps);
done:
    free(prompt);
    free(t);
    return result;
}

static void bench_usage(FILE *out)
{
    fprintf(out, "usage: gpt2d bench --model DIR [--threads N] [--tokens N] [--sequences LIST]\n"
                 "Measures memory bandwidth, SGEMM, prefill and batched decode; prints JSON.\n"
                 "  --threads N        step threads (default: one per CPU)\n"
                 "  --tokens N         tokens generated per sequence in the decode runs (64)\n"
                 "  --sequences LIST   concurrent sequences of the decode runs, comma-separated,\n"
                 "                     each 1 to 64, at most 8 (1,4,16,64)\n");
}

int tool_bench(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},  {"threads", required_argument, 0, 't'},
        {"tokens", required_argument, 0, 'n'}, {"sequences", required_argument, 0, 's'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    const char *dir = NULL;
    long threads = 0, gen = 64;
    size_t conc[8] = {1, 4, 16, 64}, nconc = 4, max_seqs = 64;
    int c, idx = 0;
    char *end;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":", longopts, &idx)) != -1) {
        switch (c) {
        case 'm': dir = optarg; break;
        case 't':
            errno = 0;
            threads = strtol(optarg, &end, 10);
            if (errno || *end || threads < 0 || threads > 256) goto bad;
            break;
        case 'n':
            errno = 0;
            gen = strtol(optarg, &end, 10);
            if (errno || *end || gen < 2 || gen > 900) goto bad;
            break;
        case 's':
            nconc = 0;
            max_seqs = 0;
            for (char *p = optarg;; p = end + 1) {
                errno = 0;
                long v = strtol(p, &end, 10);
                if (errno || end == p || v < 1 || v > 64 || nconc == 8 || (*end && *end != ','))
                    goto bad;
                conc[nconc++] = (size_t)v;
                if ((size_t)v > max_seqs) max_seqs = (size_t)v;
                if (*end == '\0') break;
            }
            break;
        case 'h': bench_usage(stdout); return 0;
        default: goto bad;
        }
    }
    if (dir == NULL || optind != argc) {
        fprintf(stderr, "gpt2d bench: %s\n",
                dir == NULL ? "--model DIR is required" : "unexpected argument");
        bench_usage(stderr);
        return 2;
    }

    char err[512];
    eng_model *m;
    if (eng_model_load(dir, &m, err, sizeof err) != ENG_OK) {
        fprintf(stderr, "gpt2d bench: %s\n", err);
        return 1;
    }
    size_t nthreads = threads ? (size_t)threads : (size_t)sysconf(_SC_NPROCESSORS_ONLN);
    const eng_config *cfg = eng_model_config(m);
    double weight_bytes = (double)eng_model_weight_bytes(m); /* as stored */
    /* The machine is shared: bandwidth is measured before and after the
     * engine runs, and the bound uses the higher reading. */
    double bw_before = bandwidth(nthreads);
    double gflops = sgemm_rate();
    /* Best of 5: the CPUs may be hyperthreads of one core, and anything on
     * the sibling halves a pass. */
    double fma_peak = peak_rate(PEAK_FMA512, nthreads, 5);
    if (fma_peak == 0) fma_peak = peak_rate(PEAK_FMA256, nthreads, 5);
    double bf16_peak = peak_rate(PEAK_DPBF16, nthreads, 5);
    double int8_peak = peak_rate(PEAK_DPBUSD, nthreads, 5);
    work wk = model_work(m, fma_peak, bf16_peak, int8_peak);
    /* KV for the most sequences, of 32 + gen positions each. */
    size_t block = 16, per_block = cfg->n_layer * 2 * block * cfg->n_embd * sizeof(float);
    size_t blocks_per_seq = (32 + (size_t)gen + block - 1) / block + 1;
    eng_sched_opts o = {.kv_bytes = max_seqs * blocks_per_seq * per_block + 40 * per_block,
                        .block_len = block,
                        .max_running = 64,
                        .max_queue = 64,
                        .step_tokens = 512,
                        .threads = (size_t)threads};
    int rc = 1;
    double prefill =
        run_prefill(m, &o, 512 < cfg->n_ctx ? 512 : cfg->n_ctx - 1, 3, err, sizeof err);
    if (prefill < 0) {
        fprintf(stderr, "gpt2d bench: %s\n", err);
        goto done;
    }
    decode_result res[8];
    for (size_t i = 0; i < nconc; i++) {
        if (run_decode(m, &o, conc[i], (size_t)gen, &res[i], err, sizeof err) != 0) {
            fprintf(stderr, "gpt2d bench: %s\n", err);
            goto done;
        }
    }
    double bw_after = bandwidth(nthreads);
    double bw = bw_before > bw_after ? bw_before : bw_after;
    double bound = bw * 1e9 / weight_bytes;
    printf("{\n  \"model\": {\"format\": \"%s\", \"layout\": \"%s\", \"kernels\": \"%s\", "
           "\"layers\": %zu, "
           "\"width\": %zu, \"vocab\": %zu, \"context\": %zu, \"params\": %zu, "
           "\"weight_bytes\": %.0f, \"pair_copy_bytes\": %zu, \"panel_copy_bytes\": %zu},\n",
           eng_model_dtype(m), eng_model_layout(m), eng_model_kernels(m), cfg->n_layer, cfg->n_embd,
           cfg->n_vocab, cfg->n_ctx, eng_model_params(m), weight_bytes, eng_model_pair_bytes(m),
           eng_model_panel_bytes(m));
    printf("  \"threads\": %zu,\n  \"machine\": {\"read_bandwidth_gb_s\": %.1f, "
           "\"read_bandwidth_before_after\": [%.1f, %.1f], \"openblas_sgemm_gflop_s\": %.1f,\n"
           "    \"peaks\": {\"f32_fma_gflop_s\": %.1f, \"bf16_dot_gflop_s\": %.1f, "
           "\"int8_dot_gop_s\": %.1f, "
           "\"amx_tile\": \"not built (no AMX machine to verify it on)\", "
           "\"bounding_prefill_gflop_s\": %.1f, \"bounding_decode_gflop_s\": %.1f}},\n",
           nthreads, bw, bw_before, bw_after, gflops, fma_peak, bf16_peak, int8_peak,
           wk.prefill_peak, wk.decode_peak);
    printf("  \"flop_per_token\": {\"prefill\": %.0f, \"decode\": %.0f},\n", 2 * wk.proj,
           2 * (wk.proj + wk.lm));
    double prefill_gflops = prefill * 2.0 * wk.proj / 1e9;
    printf("  \"prefill_512\": {\"tokens_per_s\": %.1f, \"gflop_s\": %.1f, "
           "\"fraction_of_compute_peak\": %.3f},\n",
           prefill, prefill_gflops, frac(prefill_gflops, wk.prefill_peak));
    printf("  \"decode_bandwidth_bound_tokens_per_s\": %.1f,\n  \"decode\": [\n", bound);
    double single = 0; /* vs_single: against the 1-sequence run, if there is one */
    for (size_t i = 0; i < nconc; i++)
        if (res[i].seqs == 1) single = res[i].tokens_per_s;
    for (size_t i = 0; i < nconc; i++) {
        const eng_times *t = &res[i].times;
        double total = t->matmul + t->attention + t->lm_head + t->other + t->sample;
        if (total <= 0) total = 1;
        printf("    {\"sequences\": %zu, \"tokens_per_s\": %.1f, \"step_ms_median\": %.2f, "
               "\"steps\": %zu, \"vs_single\": %.2f, \"fraction_of_bandwidth_bound\": %.2f, "
               "\"gflop_s\": %.1f, \"fraction_of_compute_peak\": %.3f, \"time_share\": "
               "{\"matmul\": %.2f, \"attention\": %.2f, "
               "\"lm_head\": %.2f, \"other\": %.2f, \"sample\": %.2f}}%s\n",
               res[i].seqs, res[i].tokens_per_s, res[i].step_ms, res[i].decode_steps,
               single > 0 ? res[i].tokens_per_s / single : 0.0,
               res[i].seqs == 1 ? res[i].tokens_per_s / bound : 0.0,
               res[i].tokens_per_s * 2.0 * (wk.proj + wk.lm) / 1e9,
               frac(res[i].tokens_per_s * 2.0 * (wk.proj + wk.lm) / 1e9, wk.decode_peak),
               t->matmul / total, t->attention / total, t->lm_head / total, t->other / total,
               t->sample / total, i + 1 < nconc ? "," : "");
    }
    printf("  ],\n  \"peak_rss_mb\": %.1f\n}\n", (double)peak_rss_kb() / 1024.0);
    rc = 0;
done:
    eng_model_free(m);
    return rc;
bad:
    tool_option_error("bench", c, argv, optind, longopts, idx);
    bench_usage(stderr);
    return 2;
}
