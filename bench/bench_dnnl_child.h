/*
 * bench/bench_dnnl_child.h: gpt2d's side of bench_dnnl (bench_dnnl_child.c):
 * one round of gpt2d's matmul, and the child process at the avx512-bf16
 * level. Private to bench_dnnl.c, which calls it.
 */
#ifndef GPT2D_BENCH_DNNL_CHILD_H
#define GPT2D_BENCH_DNNL_CHILD_H

#include "bench_dnnl_shared.h"

#include <sys/types.h>

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

#endif
