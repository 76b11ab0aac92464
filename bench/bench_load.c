/*
 * bench/bench_load.c FILE copy|mmap: time and memory to load a safetensors
 * file with formats/, as one JSON line. Run once per process, so that the
 * peak RSS (VmHWM) belongs to this load alone; bench/load.sh drives it.
 *
 *   open_ms   sft_open: validation plus the copy (copy mode, misaligned
 *             tensors in mmap mode) or the mapping
 *   touch_ms  reading one float per 4 KiB page of every tensor after open:
 *             what the first forward pass pays for pages not yet resident
 *   hwm_kb    peak resident set (file-backed mapped pages included)
 *   anon_kb   private anonymous memory at the end (the copies)
 */
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static long status_kb(const char *key)
{
    FILE *fp = fopen("/proc/self/status", "r");
    if (fp == NULL) return -1;
    char line[256];
    long v = -1;
    size_t klen = strlen(key);
    while (fgets(line, sizeof line, fp) != NULL)
        if (strncmp(line, key, klen) == 0 && line[klen] == ':')
            v = strtol(line + klen + 1, NULL, 10);
    fclose(fp);
    return v;
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[2], "copy") != 0 && strcmp(argv[2], "mmap") != 0)) {
        fprintf(stderr, "usage: bench_load FILE copy|mmap\n");
        return 2;
    }
    sft_load_mode mode = strcmp(argv[2], "copy") == 0 ? SFT_LOAD_COPY : SFT_LOAD_MMAP;
    char err[512];
    sft_file *f;
    double t0 = now_ms();
    if (sft_open(argv[1], mode, &f, err, sizeof err) != SFT_OK) {
        fprintf(stderr, "bench_load: %s\n", err);
        return 1;
    }
    double t1 = now_ms();
    unsigned sum = 0; /* printed, so the reads cannot be optimised away */
    size_t mapped = 0;
    for (size_t i = 0; i < sft_count(f); i++) {
        const sft_tensor *t = sft_tensor_at(f, i);
        const unsigned char *p = t->data;
        mapped += (size_t)t->mapped;
        for (size_t k = 0; k < t->nbytes; k += 4096) sum ^= p[k];
    }
    double t2 = now_ms();
    printf("{\"mode\": \"%s\", \"data_start\": %llu, \"tensors\": %zu, \"mapped\": %zu, "
           "\"copied_mb\": %.1f, \"open_ms\": %.1f, \"touch_ms\": %.1f, \"hwm_kb\": %ld, "
           "\"anon_kb\": %ld, \"xor\": %u}\n",
           argv[2], (unsigned long long)sft_data_start(f), sft_count(f), mapped,
           (double)sft_copied_bytes(f) / 1e6, t1 - t0, t2 - t1, status_kb("VmHWM"),
           status_kb("RssAnon"), sum);
    sft_close(f);
    return 0;
}
