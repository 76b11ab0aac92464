/*
 * bench/bench_dnnl_shared.h: what both sides of bench_dnnl use, below them:
 * the shapes and their weights, the clocks, the generated data. The files
 * read one way (tests/check_modules.py): bench_dnnl.c (the rounds, the
 * table) calls bench_dnnl_child.c (gpt2d's side and the avx512-bf16 child)
 * and bench_dnnl_onednn.c (oneDNN's matmul), and all three call this file's
 * bench_dnnl_shared.c. Private to those four.
 */
#ifndef GPT2D_BENCH_DNNL_SHARED_H
#define GPT2D_BENCH_DNNL_SHARED_H

#include "internal.h"

#define MAX_COPIES 16
#define BD_NSHAPES 5 /* bench_dnnl.c's shapes[] */

typedef struct {
    const char *name;
    size_t K, N;
    int lm; /* the LM head: op_lm_head over wte (N, K), no bias */
} bd_shape;

/* A shape's weights as gpt2d reads them (in the shared arena, so that the
 * dp child sees them): panel64 (K, N), or wte (N, K) for the LM head. */
typedef struct {
    const bd_shape *s;
    size_t copies;
    float *wf[MAX_COPIES];
    uint16_t *wb[MAX_COPIES];
    /* The dp child's pair copies of wb (op_w_pairs_build, or
     * op_w_pairs_build_rows for the LM head's wte, as the model loader
     * builds them); NULL in the parent. */
    const uint32_t *pairs[MAX_COPIES];
    float *bias; /* N; NULL for the LM head */
} bd_data;

typedef struct {
    double wall, cpu; /* seconds */
} bd_time;

bd_time bd_now(void);
bd_time bd_since(bd_time t0);

/* The next of a fixed sequence from *seed, in [-1, 1). */
float bd_unit(unsigned *seed);
/* The weights of copy c of shape s as generated, F32: row-major (K, N) for a
 * projection, wte's (N, K) for the LM head; to_bf16 rounds them (to
 * nearest even, op_f32_to_bf16_dp). */
void gen_plain(float *w, const bd_shape *s, size_t c);
void to_bf16(uint16_t *dst, const float *src, size_t n);

#endif
