/*
 * bench/bench_dnnl_onednn.h: oneDNN's side of bench_dnnl
 * (bench_dnnl_onednn.c): its matmul primitive over a shape's weights.
 * Private to bench_dnnl.c, which calls it.
 */
#ifndef GPT2D_BENCH_DNNL_ONEDNN_H
#define GPT2D_BENCH_DNNL_ONEDNN_H

#include "bench_dnnl_shared.h"

#include <oneapi/dnnl/dnnl.h>

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
