/*
 * bench/bench_tokenizer.c FILE VOCAB_DIR RUNS: single-threaded encode
 * throughput of gpt2d's tokenizer on FILE, one JSON line per run:
 * {"impl": "gpt2d", "mb": ..., "seconds": ..., "mb_per_s": ..., "ids": ...}.
 * bench/tokenizer.sh runs it beside tiktoken (bench/tokenizer.mjs).
 */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: bench_tokenizer FILE VOCAB_DIR RUNS\n");
        return 2;
    }
    FILE *fp = fopen(argv[1], "rb");
    if (fp == NULL) {
        perror(argv[1]);
        return 1;
    }
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *text = malloc((size_t)len);
    if (text == NULL || fread(text, 1, (size_t)len, fp) != (size_t)len) return 1;
    fclose(fp);
    char err[512];
    bpe *t;
    if (bpe_load_dir(argv[2], &t, err, sizeof err) != BPE_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    long runs = strtol(argv[3], NULL, 10);
    if (runs < 1 || runs > 1000) {
        fprintf(stderr, "bench_tokenizer: RUNS must be 1..1000\n");
        return 2;
    }
    for (long r = 0; r < runs; r++) {
        int32_t *ids;
        size_t n;
        double t0 = now_s();
        if (bpe_encode(t, text, (size_t)len, &ids, &n, err, sizeof err) != BPE_OK) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        double dt = now_s() - t0;
        printf("{\"impl\": \"gpt2d\", \"mb\": %.3f, \"seconds\": %.4f, \"mb_per_s\": %.2f, "
               "\"ids\": %zu}\n",
               (double)len / 1e6, dt, (double)len / 1e6 / dt, n);
        free(ids);
    }
    bpe_free(t);
    free(text);
    return 0;
}
