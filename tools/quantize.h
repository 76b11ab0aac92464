/*
 * tools/quantize.h: the conversions behind `gpt2d convert --dtype`
 * (convert.c, quantize.c) and the accuracy test. Prefix: tool_.
 * Thread: any (no shared state).
 */
#ifndef GPT2D_TOOLS_QUANTIZE_H
#define GPT2D_TOOLS_QUANTIZE_H

#include "safetensors.h"

#include <stdint.h>

/* BF16 by round to nearest, ties to even, of the upper 16 bits; a NaN
 * stays a quiet NaN with its sign. */
uint16_t tool_f32_to_bf16(float f);

/*
 * The tensors of f as a q8 file (formats/wformat.h): every 2-D float tensor
 * but wpe becomes I8 plus an F32 "<name>.q8_scale" tensor; per block of 32
 * along the reduction dimension, scale = max |w| / 127 (0 for an all-zero
 * block) and q = w / scale rounded to nearest, ties to even, in -127..127.
 * t holds at least 2 * sft_count(f) entries and bufs 2 * sft_count(f) + 1
 * pointers (zeroed), which own the new bytes and are freed by the caller;
 * *nout receives the number of tensors. A non-finite weight, or an
 * embedding width that is not a multiple of 32, fails with err.
 */
int tool_quantize_q8(const sft_file *f, sft_tensor *t, void **bufs, size_t *nout, char *err,
                     size_t errlen);

/* The tensors of a q8 file f as F32: every I8 matrix becomes its values
 * q * scale, the scale tensors are dropped. Same t, bufs and nout as above. */
int tool_dequantize_q8(const sft_file *f, sft_tensor *t, void **bufs, size_t *nout, char *err,
                       size_t errlen);

#endif
