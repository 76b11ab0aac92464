/*
 * bench/bench_decode.c DIR [STEPS [THREADS [SEQUENCES]]]: decode steps of the
 * model in DIR (each of SEQUENCES sequences, 1 by default, adds one token a
 * step through the KV cache; 100 steps by default, one thread per CPU),
 * printing the fastest and the median step in ms, the tokens/s of the
 * fastest step, and the mean time per step of each kernel family. Three
 * warm-up steps first (the first touches every page of the mapping) are
 * not counted. The
 * fastest step is what a noisy machine still measures well: builds or
 * formats compared with it, alternated, differ by a few percent where
 * `gpt2d bench` varies 3x. A benchmark, never a test.
 */
#include "step.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench_util.h"

#define MAX_SEQS 64
#define WARMUP 3

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_decode DIR [STEPS [THREADS [SEQUENCES]]]\n");
        return 2;
    }
    int steps = argc > 2 ? atoi(argv[2]) : 100;
    size_t threads = argc > 3 ? (size_t)atoi(argv[3]) : 0;
    int nseq = argc > 4 ? atoi(argv[4]) : 1;
    if (steps < 1 || steps > 900) {
        fprintf(stderr, "bench_decode: STEPS must be 1..900\n");
        return 2;
    }
    if (nseq < 1 || nseq > MAX_SEQS) {
        fprintf(stderr, "bench_decode: SEQUENCES must be 1..%d\n", MAX_SEQS);
        return 2;
    }
    size_t S = (size_t)nseq;
    char err[512];
    eng_model *m;
    if (eng_model_load(argv[1], &m, err, sizeof err) != ENG_OK) {
        fprintf(stderr, "bench_decode: %s\n", err);
        return 1;
    }
    const eng_config *cfg = eng_model_config(m);
    size_t V = cfg->n_vocab;
    size_t kv_bytes = S * ((size_t)steps + WARMUP + 32) * cfg->n_layer * 2 * cfg->n_embd * 4;
    float *logits = malloc(S * V * sizeof *logits);
    double *t = malloc((size_t)steps * sizeof *t);
    eng_kv *kv = NULL;
    eng_workspace *w = NULL;
    eng_seq s[MAX_SEQS] = {0};
    eng_item it[MAX_SEQS];
    int32_t tok[MAX_SEQS];
    int rc = 1;
    if (logits == NULL || t == NULL || eng_kv_new(m, kv_bytes, 16, &kv, err, sizeof err) != ENG_OK
        || eng_workspace_new(m, S, threads, &w) != ENG_OK) {
        fprintf(stderr, "bench_decode: cannot set up the step\n");
        goto done;
    }
    for (size_t q = 0; q < S; q++) {
        if (eng_kv_reserve(kv, &s[q], (size_t)steps + WARMUP) != ENG_OK) {
            fprintf(stderr, "bench_decode: cannot reserve the KV cache\n");
            goto done;
        }
        tok[q] = (int32_t)(1 + q * 101 % V);
    }
    eng_times t0 = {0};
    for (int i = -WARMUP; i < steps; i++) {
        if (i == 0) eng_workspace_times(w, &t0);
        for (size_t q = 0; q < S; q++)
            it[q] = (eng_item){.seq = &s[q],
                               .tokens = &tok[q],
                               .n = 1,
                               .want = ENG_LOGITS_LAST,
                               .logits = logits + q * V};
        double a = now();
        if (eng_forward(m, kv, w, it, S, err, sizeof err) != ENG_OK) {
            fprintf(stderr, "bench_decode: %s\n", err);
            goto done;
        }
        if (i >= 0) t[i] = now() - a;
        for (size_t q = 0; q < S; q++) tok[q] = (int32_t)(((size_t)tok[q] * 7 + 3) % V);
    }
    eng_times tm;
    eng_workspace_times(w, &tm);
    qsort(t, (size_t)steps, sizeof *t, cmp_double);
    printf("{\"format\": \"%s\", \"layout\": \"%s\", \"sequences\": %zu, \"min_ms\": %.2f, "
           "\"median_ms\": %.2f, "
           "\"tokens_per_s_at_min\": %.1f, \"mean_ms\": {\"matmul\": %.2f, \"attention\": %.2f, "
           "\"lm_head\": %.2f, \"other\": %.2f}}\n",
           eng_model_dtype(m), eng_model_layout(m), S, t[0] * 1e3, t[steps / 2] * 1e3,
           (double)S / t[0], (tm.matmul - t0.matmul) * 1e3 / steps,
           (tm.attention - t0.attention) * 1e3 / steps, (tm.lm_head - t0.lm_head) * 1e3 / steps,
           (tm.other - t0.other) * 1e3 / steps);
    rc = 0;
done:
    for (size_t q = 0; q < S; q++)
        if (kv != NULL) eng_kv_release(kv, &s[q]);
    eng_workspace_free(w);
    eng_kv_free(kv);
    eng_model_free(m);
    free(logits);
    free(t);
    return rc;
}
