/*
 * bench/bench_dnnl.h: what bench/bench_dnnl.c (the data, the rounds, the
 * table), bench_dnnl_child.c (gpt2d's side and the avx512-bf16 child) and
 * bench_dnnl_onednn.c (oneDNN's matmul) share. Private to those three.
 */
#ifndef GPT2D_BENCH_DNNL_H
#define GPT2D_BENCH_DNNL_H

#include "internal.h"

#include <oneapi/dnnl/dnnl.h>
#include <sys/types.h>

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

/* The weights of copy c of shape s as generated, F32: row-major (K, N) for a
 * projection, wte's (N, K) for the LM head; to_bf16 rounds them (to
 * nearest even, op_f32_to_bf16_dp). */
void gen_plain(float *w, const bd_shape *s, size_t c);
void to_bf16(uint16_t *dst, const float *src, size_t n);

/* ---- gpt2d's side (bench_dnnl_child.c) ---- */

typedef struct {
    op_pool *pool;
    float *scratch; /* op_matmul_scratch_floats for the largest projection */
} bd_gpt2d;

/* One round: a call on every copy of d, into out (M, N); bf16: the BF16
 * weights (with their pair copies where d has them). */
void gpt2d_round(const bd_gpt2d *g, const bd_data *d, int bf16, float *out, const float *x,
                 size_t M);

/* The avx512-bf16 level in a child process, forked before the parent asks
 * for a kernel level (the engine reads GPT2D_KERNELS once): it builds the
 * pair copies of the data's BF16 weights and runs gpt2d_round on command. */
typedef struct {
    pid_t pid; /* 0: not running */
    int to, from;
    float *out; /* shared: the child's (M, N) */
    char level[32];
} bd_child;

/* 0, or -1 with a message on stderr; ch->out must be set (shared memory). */
int child_start(bd_child *ch, const bd_data *data, const float *x, size_t threads,
                size_t scratch_floats);
/* One round of data[shape] at M rows, timed in the child. 0 or -1. */
int child_round(bd_child *ch, int shape, size_t M, bd_time *t);
/* Tells the child to quit and reaps it: its exit status, or -1. */
int child_stop(bd_child *ch);

/* ---- oneDNN's side (bench_dnnl_onednn.c) ---- */

typedef struct {
    dnnl_primitive_t prim;
    dnnl_memory_t src, bias, dst;
    dnnl_memory_t wei[MAX_COPIES];
    size_t copies;
    char impl[64]; /* oneDNN's implementation and weights' blocks */
} bd_dnnl;

/*
 * The matmul primitive for shape d->s at M rows: src (M, K) in dt over x,
 * weights (K, N) in dt in the format the primitive chooses (every copy
 * generated again, rounded for bf16, and reordered now), bias (1, N) f32
 * (none for the LM head), dst (M, N) f32 over out. plain: K x N floats of
 * scratch. 0; 1 when oneDNN has no kernel for dt on this CPU (err says
 * so); -1 with err set. Nothing is held unless it returns 0.
 */
int dnnl_mm_init(bd_dnnl *m, const bd_data *d, size_t M, dnnl_data_type_t dt, void *x, float *out,
                 float *plain, dnnl_engine_t eng, dnnl_stream_t strm, char *err, size_t errlen);
/* One round: the primitive on every weight copy. 0, or -1 with err set. */
int dnnl_round(const bd_dnnl *m, dnnl_stream_t strm, char *err, size_t errlen);
void dnnl_free_mm(bd_dnnl *m);

#endif
