/*
 * tests/fuzz/fuzz_safetensors.c: libFuzzer target for the safetensors reader.
 * Each input is written to a file and opened in both load modes; on success
 * the first and last byte of every tensor and every metadata string are
 * read. The only allowed outcome besides success is an error status with a
 * one-line message; ASan/UBSan turn anything else into a crash.
 */
#include "safetensors.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile unsigned char sink;

static void touch(const sft_file *f)
{
    for (size_t i = 0; i < sft_count(f); i++) {
        const sft_tensor *t = sft_tensor_at(f, i);
        sink ^= (unsigned char)t->name[0];
        if (t->nbytes > 0) {
            const unsigned char *p = t->data;
            sink ^= p[0];
            sink ^= p[t->nbytes - 1];
        }
        if (sft_find(f, t->name) != t) __builtin_trap();
    }
    size_t n;
    const sft_meta *m = sft_metadata(f, &n);
    for (size_t i = 0; i < n; i++) sink ^= (unsigned char)(m[i].key[0] ^ m[i].value[0]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/gpt2d-fuzz-%ld.safetensors", (long)getpid());
    FILE *fp = fopen(path, "wb");
    if (fp == NULL) return 0;
    fwrite(data, 1, size, fp);
    fclose(fp);
    for (int mode = 0; mode < 2; mode++) {
        sft_file *f = NULL;
        char err[256];
        sft_status s = sft_open(path, (sft_load_mode)mode, &f, err, sizeof err);
        if (s == SFT_OK) {
            touch(f);
            sft_close(f);
        } else if (f != NULL || strchr(err, '\n') != NULL || err[0] == '\0') {
            __builtin_trap();
        }
    }
    unlink(path);
    return 0;
}
