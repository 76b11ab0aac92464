/*
 * tools/convert.c: `gpt2d convert IN OUT`, an aligned copy of a safetensors
 * file. The published GPT-2 file starts its data at byte 14,291, so every
 * F32 tensor in it is misaligned and must be copied at every start; the copy
 * written here pads its header to 8 bytes, so later starts map it without
 * copying and every process shares one copy of the weights in the page
 * cache. Tensors, dtypes and metadata are kept as they are; the write is
 * atomic (formats/ sft_save).
 */
#include "tools.h"

#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void convert_usage(FILE *out)
{
    fprintf(out, "usage: gpt2d convert IN OUT\n"
                 "Writes an aligned copy of the safetensors file IN to OUT (atomically), so\n"
                 "that it can be memory-mapped and shared without copies.\n");
}

int tool_convert(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--help") == 0) {
        convert_usage(stdout);
        return 0;
    }
    if (argc != 3 || argv[1][0] == '-' || argv[2][0] == '-') {
        fprintf(stderr, "gpt2d convert: expected IN and OUT\n");
        convert_usage(stderr);
        return 2;
    }
    char err[512];
    sft_file *f;
    if (sft_open(argv[1], SFT_LOAD_MMAP, &f, err, sizeof err) != SFT_OK) {
        fprintf(stderr, "gpt2d convert: %s\n", err);
        return 1;
    }
    size_t n = sft_count(f), nmeta;
    sft_tensor *t = malloc((n ? n : 1) * sizeof *t);
    if (t == NULL) {
        fprintf(stderr, "gpt2d convert: out of memory\n");
        sft_close(f);
        return 1;
    }
    for (size_t i = 0; i < n; i++) t[i] = *sft_tensor_at(f, i);
    const sft_meta *meta = sft_metadata(f, &nmeta);
    int rc = 0;
    if (sft_save(argv[2], t, n, meta, nmeta, NULL, err, sizeof err) != SFT_OK) {
        fprintf(stderr, "gpt2d convert: %s\n", err);
        rc = 1;
    } else {
        fprintf(stderr,
                "gpt2d convert: %zu tensors; data now starts at an 8-byte boundary "
                "(was byte %llu)\n",
                n, (unsigned long long)sft_data_start(f));
    }
    free(t);
    sft_close(f);
    return rc;
}
