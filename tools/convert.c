/*
 * tools/convert.c: `gpt2d convert IN OUT [--dtype f32|f16|bf16|q8]`, an
 * aligned copy of a safetensors file, optionally in another weight format.
 *
 * Alignment: the published GPT-2 file starts its data at byte 14,291, so
 * every F32 tensor in it is misaligned and must be copied at every start;
 * the copy written here pads its header to 8 bytes, so later starts map it
 * without copying and every process shares one copy of the weights in the
 * page cache. The write is atomic (formats/ sft_save).
 *
 * Formats (formats/wformat.h). Without --dtype, tensors, dtypes and
 * metadata are kept as they are. With it, every floating-point tensor
 * (F32, F16, BF16, F64) is first widened exactly to F32, then:
 *   f32   kept;
 *   f16   rounded to nearest, ties to even (sft_f32_to_f16; out of range
 *         becomes infinity, as IEEE conversion does);
 *   bf16  rounded to nearest, ties to even on the upper 16 bits (NaN stays
 *         a quiet NaN);
 *   q8    see quantize.c: every weight matrix (2-D, but wpe) becomes I8 with
 *         F32 scales per 32 elements along its reduction dimension; vectors
 *         and wpe stay F32.
 * Integer and BOOL tensors are kept. A q8 file converts back to float by
 * its dequantized values (q * scale, the F32 product the engine computes),
 * so `convert --dtype f32` of a q8 file gives exactly its logits.
 */
#include "tools.h"

#include "quantize.h"
#include "safetensors.h"
#include "wformat.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void convert_usage(FILE *out)
{
    fprintf(out, "usage: gpt2d convert IN OUT [--dtype f32|f16|bf16|q8]\n"
                 "Writes an aligned copy of the safetensors file IN to OUT (atomically), so\n"
                 "that it can be memory-mapped and shared without copies.\n"
                 "  --dtype D   the weight format of OUT (default: IN's); f16 and bf16 round\n"
                 "              to nearest even, q8 stores int8 with a scale per 32 weights\n"
                 "              along the reduction dimension (docs/api.md)\n");
}

uint16_t tool_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7F800000u) == 0x7F800000u && (x & 0x7FFFFFu) != 0)
        return (uint16_t)((x >> 16) | 0x40u); /* NaN: quiet, sign kept */
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static int is_float(sft_dtype d)
{
    return d == SFT_F32 || d == SFT_F16 || d == SFT_BF16 || d == SFT_F64;
}

/* The output tensors of a float conversion into `to` (F32, F16 or BF16):
 * each float tensor's new bytes in *bufs[i] (freed by the caller). */
static int convert_float(const sft_file *f, sft_dtype to, sft_tensor *t, void **bufs, char *err,
                         size_t errlen)
{
    for (size_t i = 0; i < sft_count(f); i++) {
        const sft_tensor *src = sft_tensor_at(f, i);
        t[i] = *src;
        if (!is_float(src->dtype) || src->dtype == to) continue;
        size_t n = sft_tensor_numel(src);
        float *wide = malloc((n ? n : 1) * sizeof *wide);
        if (wide == NULL) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        if (sft_tensor_to_f32(src, wide, n, err, errlen) != SFT_OK) {
            free(wide);
            return -1;
        }
        if (to == SFT_F32) {
            bufs[i] = wide;
        } else {
            uint16_t *h = malloc((n ? n : 1) * sizeof *h);
            if (h == NULL) {
                free(wide);
                snprintf(err, errlen, "out of memory");
                return -1;
            }
            for (size_t k = 0; k < n; k++)
                h[k] = to == SFT_F16 ? sft_f32_to_f16(wide[k]) : tool_f32_to_bf16(wide[k]);
            free(wide);
            bufs[i] = h;
        }
        t[i].dtype = to;
        t[i].data = bufs[i];
        t[i].nbytes = n * sft_dtype_size(to);
    }
    return 0;
}

int tool_convert(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"dtype", required_argument, 0, 'd'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *dtype = NULL;
    int c, idx = 0;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":", longopts, &idx)) != -1) {
        switch (c) {
        case 'd': dtype = optarg; break;
        case 'h': convert_usage(stdout); return 0;
        default:
            tool_option_error("convert", c, argv, optind, longopts, idx);
            convert_usage(stderr);
            return 2;
        }
    }
    if (argc - optind != 2) {
        fprintf(stderr, "gpt2d convert: expected IN and OUT\n");
        convert_usage(stderr);
        return 2;
    }
    sft_dtype to = SFT_F32;
    int q8 = 0;
    if (dtype != NULL) {
        if (strcmp(dtype, "f16") == 0)
            to = SFT_F16;
        else if (strcmp(dtype, "bf16") == 0)
            to = SFT_BF16;
        else if (strcmp(dtype, "q8") == 0)
            q8 = 1;
        else if (strcmp(dtype, "f32") != 0) {
            fprintf(stderr, "gpt2d convert: --dtype must be f32, f16, bf16 or q8, not '%s'\n",
                    dtype);
            return 2;
        }
    }
    const char *in = argv[optind], *out = argv[optind + 1];
    char err[512];
    sft_file *f;
    if (sft_open(in, SFT_LOAD_MMAP, &f, err, sizeof err) != SFT_OK) {
        fprintf(stderr, "gpt2d convert: %s\n", err);
        return 1;
    }
    const char *from;
    if (wf_detect(f, &from, err, sizeof err) != SFT_OK) {
        fprintf(stderr, "gpt2d convert: %s\n", err);
        sft_close(f);
        return 1;
    }
    size_t n = sft_count(f), nmeta;
    sft_tensor *t = calloc(2 * n + 1, sizeof *t);
    void **bufs = calloc(2 * n + 1, sizeof *bufs);
    const sft_meta *meta = sft_metadata(f, &nmeta);
    int rc = 1;
    size_t nout = n;
    if (t == NULL || bufs == NULL) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    int from_q8 = strcmp(from, "q8") == 0;
    if (q8 && !from_q8) {
        if (tool_quantize_q8(f, t, bufs, &nout, err, sizeof err) != 0) goto fail;
    } else if (from_q8 && dtype != NULL && !q8) {
        /* Back to float: the dequantized values, then the float format. */
        if (tool_dequantize_q8(f, t, bufs, &nout, err, sizeof err) != 0) goto fail;
        for (size_t i = 0; to != SFT_F32 && i < nout; i++) {
            if (t[i].dtype != SFT_F32) continue;
            size_t cnt = sft_tensor_numel(&t[i]);
            uint16_t *h = malloc((cnt ? cnt : 1) * sizeof *h);
            if (h == NULL) {
                snprintf(err, sizeof err, "out of memory");
                goto fail;
            }
            const float *w = t[i].data;
            for (size_t k = 0; k < cnt; k++)
                h[k] = to == SFT_F16 ? sft_f32_to_f16(w[k]) : tool_f32_to_bf16(w[k]);
            bufs[n + i] = h;
            t[i].dtype = to;
            t[i].data = h;
            t[i].nbytes = cnt * sizeof *h;
        }
    } else if (dtype != NULL && !q8) {
        if (convert_float(f, to, t, bufs, err, sizeof err) != 0) goto fail;
    } else {
        for (size_t i = 0; i < n; i++) t[i] = *sft_tensor_at(f, i);
    }
    /* Metadata: IN's, less gpt2d's format keys, plus q8's when OUT is q8. */
    sft_meta *om = calloc(nmeta + 2, sizeof *om);
    if (om == NULL) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    size_t nom = 0;
    for (size_t i = 0; i < nmeta; i++)
        if (strncmp(meta[i].key, "gpt2d.", 6) != 0) om[nom++] = meta[i];
    if (q8 || (from_q8 && dtype == NULL)) {
        om[nom++] = (sft_meta){WF_META_FORMAT, "q8"};
        om[nom++] = (sft_meta){WF_META_Q8_BLOCK, "32"};
    }
    sft_status ss = sft_save(out, t, nout, om, nom, NULL, err, sizeof err);
    free(om);
    if (ss != SFT_OK) goto fail;
    fprintf(stderr,
            "gpt2d convert: %zu tensors, %s -> %s; data now starts at an 8-byte boundary "
            "(was byte %llu)\n",
            nout, from, dtype ? dtype : from, (unsigned long long)sft_data_start(f));
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "gpt2d convert: %s\n", err);
done:
    for (size_t i = 0; bufs != NULL && i < 2 * n + 1; i++) free(bufs[i]);
    free(bufs);
    free(t);
    sft_close(f);
    return rc;
}
