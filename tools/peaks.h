/*
 * tools/peaks.h: the machine's compute ceilings, measured, for `gpt2d bench`
 * and bench/fma_peak. Internal to tools/ (and the bench programs that link
 * tools_internal_dep).
 */
#ifndef GPT2D_TOOLS_PEAKS_H
#define GPT2D_TOOLS_PEAKS_H

#include <stddef.h>

typedef enum {
    PEAK_FMA512, /* F32 FMA, AVX-512: 32 flop an instruction */
    PEAK_FMA256, /* F32 FMA, AVX2: 16 flop */
    PEAK_DPBF16, /* VDPBF16PS (AVX512_BF16): 64 flop, two products a lane */
    PEAK_DPBUSD  /* VPDPBUSD (AVX512_VNNI): 128 int8 ops, four u8 x s8 products a lane */
} peak_kind;

/* GFLOP/s (for PEAK_DPBUSD, giga int8 operations a second, a multiply and
 * an add each, as a flop is counted) of kind on nthreads threads (at most
 * 64), the best of passes runs (interference only ever lowers a peak); 0
 * where the CPU lacks the instruction. */
double peak_rate(peak_kind kind, size_t nthreads, int passes);

#endif
