/*
 * bench/bench_decode.c DIR [STEPS [THREADS]]: single-sequence decode steps
 * of the model in DIR (one token a step through the KV cache, 100 steps by
 * default, one thread per CPU), printing the fastest and the median step in
 * ms and the mean time per step of each kernel family. The fastest step is
 * what a noisy machine still measures well: builds or formats compared with
 * it, alternated, differ by a few percent where `gpt2d bench` varies 3x.
 * A benchmark, never a test.
 */
#include "step.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_decode DIR [STEPS [THREADS]]\n");
        return 2;
    }
    int steps = argc > 2 ? atoi(argv[2]) : 100;
    size_t threads = argc > 3 ? (size_t)atoi(argv[3]) : 0;
    if (steps < 1 || steps > 900) {
        fprintf(stderr, "bench_decode: STEPS must be 1..900\n");
        return 2;
    }
    char err[512];
    eng_model *m;
    if (eng_model_load(argv[1], &m, err, sizeof err) != ENG_OK) {
        fprintf(stderr, "bench_decode: %s\n", err);
        return 1;
    }
    const eng_config *cfg = eng_model_config(m);
    size_t V = cfg->n_vocab, kv_bytes = ((size_t)steps + 32) * cfg->n_layer * 2 * cfg->n_embd * 4;
    float *logits = malloc(V * sizeof *logits);
    double *t = malloc((size_t)steps * sizeof *t);
    eng_kv *kv = NULL;
    eng_workspace *w = NULL;
    eng_seq s = {0};
    int rc = 1;
    if (logits == NULL || t == NULL || eng_kv_new(m, kv_bytes, 16, &kv, err, sizeof err) != ENG_OK
        || eng_kv_reserve(kv, &s, (size_t)steps) != ENG_OK
        || eng_workspace_new(m, 1, threads, &w) != ENG_OK) {
        fprintf(stderr, "bench_decode: cannot set up the step\n");
        goto done;
    }
    int32_t tok = 1;
    for (int i = 0; i < steps; i++) {
        eng_item it = {
            .seq = &s, .tokens = &tok, .n = 1, .want = ENG_LOGITS_LAST, .logits = logits};
        double a = now();
        if (eng_forward(m, kv, w, &it, 1, err, sizeof err) != ENG_OK) {
            fprintf(stderr, "bench_decode: %s\n", err);
            goto done;
        }
        t[i] = now() - a;
        tok = (int32_t)(((size_t)tok * 7 + 3) % V);
    }
    eng_times tm;
    eng_workspace_times(w, &tm);
    qsort(t, (size_t)steps, sizeof *t, cmp_double);
    printf("{\"format\": \"%s\", \"min_ms\": %.2f, \"median_ms\": %.2f, \"mean_ms\": {\"matmul\": "
           "%.2f, \"attention\": %.2f, \"lm_head\": %.2f, \"other\": %.2f}}\n",
           eng_model_dtype(m), t[0] * 1e3, t[steps / 2] * 1e3, tm.matmul * 1e3 / steps,
           tm.attention * 1e3 / steps, tm.lm_head * 1e3 / steps, tm.other * 1e3 / steps);
    rc = 0;
done:
    if (kv != NULL) eng_kv_release(kv, &s);
    eng_workspace_free(w);
    eng_kv_free(kv);
    eng_model_free(m);
    free(logits);
    free(t);
    return rc;
}
