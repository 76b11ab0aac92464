/*
 * tools/quantize.h: the conversions behind `gpt2d convert --dtype`
 * (convert.c, quantize.c) and the accuracy test. Prefix: tool_.
 * Thread: any (no shared state).
 */
#ifndef GPT2D_TOOLS_QUANTIZE_H
#define GPT2D_TOOLS_QUANTIZE_H

#include "safetensors.h"
#include "tensorset.h"

#include <stdint.h>

/* BF16 by round to nearest, ties to even, of the upper 16 bits; a NaN
 * stays a quiet NaN with its sign. */
uint16_t tool_f32_to_bf16(float f);

/*
 * The tensors of s as a q8 file (formats/include/wformat.h), in the hf layout:
 * every 2-D float tensor but wpe becomes I8 plus an F32 "<name>.q8_scale"
 * tensor appended to s; per block of 32 along the reduction dimension,
 * scale = max |w| / 127 (0 for an all-zero block) and q = w / scale
 * rounded to nearest, ties to even, in -127..127. A non-finite weight, or
 * an embedding width that is not a multiple of 32, fails with err. 0 or -1.
 */
int tool_quantize_q8(tool_set *s, char *err, size_t errlen);

/* The tensors of a q8 set s (hf layout, checked by wf_detect) as F32:
 * every I8 matrix becomes its values q * scale, the scale tensors are
 * dropped. 0 or -1 with err. */
int tool_dequantize_q8(tool_set *s, char *err, size_t errlen);

/* Every floating-point tensor of s (F32, F16, BF16, F64) not already in
 * `to` (F32, F16 or BF16) widened exactly to F32, then rounded to `to`
 * (nearest, ties to even: sft_f32_to_f16, tool_f32_to_bf16). 0 or -1. */
int tool_to_float(tool_set *s, sft_dtype to, char *err, size_t errlen);

#endif
