/*
 * bench/bench_dnnl_onednn.c: oneDNN's side of bench_dnnl: its matmul
 * primitive over weights reordered once into the format it picks
 * (bench_dnnl_onednn.h). Every call's status is checked and reported.
 */
#include "bench_dnnl_onednn.h"

#include <oneapi/dnnl/dnnl_debug.h>

#include <stdio.h>
#include <string.h>

/* A oneDNN call that failed: its text and status, then the cleanup. */
#define DNNL_TRY(call)                                                                             \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success) {                                                                 \
            status = st_;                                                                          \
            snprintf(err, errlen, "%s: %s", #call, dnnl_status2str(st_));                          \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

void dnnl_free_mm(bd_dnnl *m)
{
    for (size_t c = 0; c < MAX_COPIES; c++)
        if (m->wei[c] != NULL) dnnl_memory_destroy(m->wei[c]);
    if (m->src != NULL) dnnl_memory_destroy(m->src);
    if (m->bias != NULL) dnnl_memory_destroy(m->bias);
    if (m->dst != NULL) dnnl_memory_destroy(m->dst);
    if (m->prim != NULL) dnnl_primitive_destroy(m->prim);
    memset(m, 0, sizeof *m);
}

/* The inner blocks of the weights' format in oneDNN's notation, a for K
 * and b for N ("16a64b2a": pairs of k innermost, then 64 columns, then
 * 16 k), or "plain"; for the table. */
static void weights_blocks(char *out, size_t len, const dnnl_memory_desc_t *md)
{
    size_t at = 0;
    out[0] = '\0';
    if (md->format_kind != dnnl_blocked || md->format_desc.blocking.inner_nblks == 0) {
        snprintf(out, len, "plain");
        return;
    }
    const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
    for (int i = 0; i < b->inner_nblks && at < len; i++) {
        int w = snprintf(out + at, len - at, "%lld%c", (long long)b->inner_blks[i],
                         (char)('a' + b->inner_idxs[i]));
        if (w < 0) break;
        at += (size_t)w;
    }
}

/* Copies user (the plain weights, tag ab or ba over (K, N)) into a new memory
 * of want's format. */
static dnnl_status_t dnnl_reorder_in(dnnl_memory_t *to, const dnnl_memory_desc_t *want,
                                     const dnnl_memory_desc_t *user_md, void *user,
                                     dnnl_engine_t eng, dnnl_stream_t strm, char *err,
                                     size_t errlen)
{
    dnnl_status_t status = dnnl_success;
    dnnl_memory_t from = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t r = NULL;
    *to = NULL;
    DNNL_TRY(dnnl_memory_create(&from, user_md, eng, user));
    DNNL_TRY(dnnl_memory_create(to, want, eng, DNNL_MEMORY_ALLOCATE));
    DNNL_TRY(dnnl_reorder_primitive_desc_create(&pd, user_md, eng, want, eng, NULL));
    DNNL_TRY(dnnl_primitive_create(&r, pd));
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, *to}};
    DNNL_TRY(dnnl_primitive_execute(r, strm, 2, args));
    DNNL_TRY(dnnl_stream_wait(strm));
fail:
    if (r != NULL) dnnl_primitive_destroy(r);
    if (pd != NULL) dnnl_primitive_desc_destroy(pd);
    if (from != NULL) dnnl_memory_destroy(from);
    if (status != dnnl_success && *to != NULL) {
        dnnl_memory_destroy(*to);
        *to = NULL;
    }
    return status;
}

/* dnnl_mm_init's work, with oneDNN's status. */
static dnnl_status_t mm_init(bd_dnnl *m, const bd_data *d, size_t M, dnnl_data_type_t dt, void *x,
                             float *out, float *plain, dnnl_engine_t eng, dnnl_stream_t strm,
                             char *err, size_t errlen)
{
    dnnl_status_t status = dnnl_success;
    const bd_shape *s = d->s;
    dnnl_primitive_desc_t pd = NULL;
    memset(m, 0, sizeof *m);
    dnnl_memory_desc_t src_md, wei_md, user_md, bias_md, dst_md;
    dnnl_dims_t src_dims = {(dnnl_dim_t)M, (dnnl_dim_t)s->K};
    dnnl_dims_t wei_dims = {(dnnl_dim_t)s->K, (dnnl_dim_t)s->N};
    dnnl_dims_t bias_dims = {1, (dnnl_dim_t)s->N};
    dnnl_dims_t dst_dims = {(dnnl_dim_t)M, (dnnl_dim_t)s->N};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&src_md, 2, src_dims, dt, dnnl_ab));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&wei_md, 2, wei_dims, dt, dnnl_format_tag_any));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&user_md, 2, wei_dims, dt, s->lm ? dnnl_ba : dnnl_ab));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&bias_md, 2, bias_dims, dnnl_f32, dnnl_ab));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst_md, 2, dst_dims, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t desc;
    DNNL_TRY(dnnl_matmul_desc_init(&desc, &src_md, &wei_md, s->lm ? NULL : &bias_md, &dst_md));
    DNNL_TRY(dnnl_primitive_desc_create(&pd, &desc, NULL, eng, NULL));
    const char *impl = NULL;
    DNNL_TRY(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, (void *)&impl));
    const dnnl_memory_desc_t *want = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    if (want == NULL) {
        status = dnnl_runtime_error;
        snprintf(err, errlen, "dnnl_primitive_desc_query_md(weights): NULL");
        goto fail;
    }
    char blocks[32] = "";
    weights_blocks(blocks, sizeof blocks, want);
    snprintf(m->impl, sizeof m->impl, "%s %s", impl ? impl : "?", blocks);
    DNNL_TRY(dnnl_primitive_create(&m->prim, pd));
    for (size_t c = 0; c < d->copies; c++) {
        gen_plain(plain, s, c);
        if (dt == dnnl_bf16) to_bf16((uint16_t *)(void *)plain, plain, s->K * s->N);
        status = dnnl_reorder_in(&m->wei[c], want, &user_md, plain, eng, strm, err, errlen);
        if (status != dnnl_success) goto fail;
    }
    m->copies = d->copies;
    DNNL_TRY(dnnl_memory_create(&m->src, &src_md, eng, x));
    if (!s->lm) DNNL_TRY(dnnl_memory_create(&m->bias, &bias_md, eng, d->bias));
    DNNL_TRY(dnnl_memory_create(&m->dst, &dst_md, eng, out));
    dnnl_primitive_desc_destroy(pd);
    return dnnl_success;
fail:
    if (pd != NULL) dnnl_primitive_desc_destroy(pd);
    dnnl_free_mm(m);
    return status;
}

int dnnl_round(const bd_dnnl *m, dnnl_stream_t strm, char *err, size_t errlen)
{
    dnnl_status_t status = dnnl_success;
    for (size_t c = 0; c < m->copies; c++) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, m->src},
                                   {DNNL_ARG_WEIGHTS, m->wei[c]},
                                   {DNNL_ARG_DST, m->dst},
                                   {DNNL_ARG_BIAS, m->bias}};
        DNNL_TRY(dnnl_primitive_execute(m->prim, strm, m->bias ? 4 : 3, args));
    }
    DNNL_TRY(dnnl_stream_wait(strm));
fail:
    return status == dnnl_success ? 0 : -1;
}

int dnnl_mm_init(bd_dnnl *m, const bd_data *d, size_t M, dnnl_data_type_t dt, void *x, float *out,
                 float *plain, dnnl_engine_t eng, dnnl_stream_t strm, char *err, size_t errlen)
{
    dnnl_status_t st = mm_init(m, d, M, dt, x, out, plain, eng, strm, err, errlen);
    /* dnnl_unimplemented is oneDNN's status for "no kernel for this data
     * type on this CPU" (bf16 on a CPU without it): a line of the table
     * says so, the run goes on. */
    return st == dnnl_success ? 0 : st == dnnl_unimplemented ? 1 : -1;
}
