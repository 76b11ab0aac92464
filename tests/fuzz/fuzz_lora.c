/*
 * tests/fuzz/fuzz_lora.c: libFuzzer target for the LoRA adapter reader
 * (formats/include/lora.h). An input is an adapter folder in one buffer:
 * a 4-byte little-endian length N, then N bytes of adapter_config.json
 * (N clamped to what is there), then the rest as adapter_model.safetensors.
 * Both files are written to a folder of this process and read against a
 * base of 2 layers of width 8, and with the shape read off the tensors. On
 * success every factor is read and the pairs' invariants checked; the
 * only other outcome allowed is an error status with a one-line message.
 * ASan/UBSan turn anything else into a crash. Seeds: make_lora_corpus.py.
 */
#include "lora.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile float sink;

static void write_file(const char *path, const uint8_t *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (fp == NULL) return;
    fwrite(p, 1, n, fp);
    fclose(fp);
}

static void touch(const lora_adapter *a)
{
    if (a->rank == 0 || a->rank > LORA_MAX_RANK || !isfinite(a->scaling) || a->n_layer == 0)
        __builtin_trap();
    size_t adapted = 0;
    for (size_t l = 0; l < a->n_layer; l++)
        for (size_t m = 0; m < LORA_NMODULES; m++) {
            const lora_pair *p = lora_pair_at(a, l, (lora_module)m);
            size_t in, out;
            lora_module_dims((lora_module)m, a->n_embd, &in, &out);
            if (p->in != in || p->out != out || (p->a == NULL) != (p->b == NULL)) __builtin_trap();
            if (p->a == NULL) continue;
            adapted++;
            sink += p->a[0] + p->a[a->rank * in - 1] + p->b[0] + p->b[out * a->rank - 1];
        }
    if (adapted != a->n_adapted || adapted == 0) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char dir[64], cfg[96], weights[96];
    snprintf(dir, sizeof dir, "/tmp/gpt2d-fuzz-lora-%ld", (long)getpid());
    snprintf(cfg, sizeof cfg, "%s/%s", dir, LORA_CONFIG_FILE);
    snprintf(weights, sizeof weights, "%s/%s", dir, LORA_WEIGHTS_FILE);
    mkdir(dir, 0700);
    size_t n = 0;
    if (size >= 4)
        n = (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 | (size_t)data[3] << 24;
    size_t rest = size >= 4 ? size - 4 : 0;
    if (n > rest) n = rest;
    write_file(cfg, data + (size - rest), n);
    write_file(weights, data + (size - rest) + n, rest - n);
    static const size_t shapes[2][2] = {{2, 8}, {0, 0}};
    for (int k = 0; k < 2; k++) {
        lora_adapter *a = NULL;
        char err[256];
        err[0] = '\0';
        sft_status s = lora_read(dir, shapes[k][0], shapes[k][1], &a, err, sizeof err);
        if (s == SFT_OK) {
            touch(a);
            lora_free(a);
        } else if (a != NULL || strchr(err, '\n') != NULL || err[0] == '\0') {
            __builtin_trap();
        }
    }
    unlink(cfg);
    unlink(weights);
    rmdir(dir);
    return 0;
}
