/* engine/internal.h: shared by the engine's files; never included from
 * outside engine/. */
#ifndef GPT2D_ENGINE_INTERNAL_H
#define GPT2D_ENGINE_INTERNAL_H

#include "kernels.h"
#include "step.h"
#include "safetensors.h"

/* One transformer block's weights: views into the mapping, in the file's
 * format (kernels.h, op_w). */
typedef struct {
    op_w ln1_g, ln1_b;   /* (C)                       */
    op_w attn_w, attn_b; /* (C, 3C), (3C): Conv1D      */
    op_w proj_w, proj_b; /* (C, C), (C)                */
    op_w ln2_g, ln2_b;   /* (C)                        */
    op_w fc_w, fc_b;     /* (C, 4C), (4C)              */
    op_w fc2_w, fc2_b;   /* (4C, C), (C)               */
} gpt2_layer;

struct eng_model {
    eng_config cfg;
    op_w wte;           /* (V, C); also the LM head, transposed */
    op_w wpe;           /* (n_ctx, C)                           */
    gpt2_layer *layers; /* [L]                                  */
    op_w lnf_g, lnf_b;
    sft_data *data; /* keeps the mapping (and copies) alive */
    size_t copied;
    size_t params;
    size_t weight_bytes; /* as stored, read once per step          */
    const char *dtype;   /* wf_detect's name: "f32", "bf16", ...    */
};

struct eng_kv {
    size_t block_len; /* positions per block                         */
    size_t nblocks;
    size_t L, NH, HS; /* layers, heads, head size                    */
    float *pool;      /* nblocks x L x 2 x NH x block_len x HS        */
    int32_t *free_list;
    size_t nfree;
};

/*
 * K (kind 0) or V (kind 1) of layer l, head h at position pos of seq: HS
 * floats. Within a block, each (layer, kind) holds head after head, and
 * each head its block_len positions one after the other: the keys of one
 * head in a block are one run of block_len x HS floats, and those of
 * neighbouring heads follow. Attention, which reads a head (or a few) over
 * many positions, then streams contiguous memory; a position-major layout
 * gave it 256-byte pieces 3 KB apart, and a decode step waited on them.
 */
static inline float *kv_head(const eng_kv *kv, const eng_seq *seq, size_t l, int kind, size_t h,
                             size_t pos)
{
    size_t block = (size_t)seq->blocks[pos / kv->block_len];
    size_t off = (((block * kv->L + l) * 2 + (size_t)kind) * kv->NH + h) * kv->block_len
                 + pos % kv->block_len;
    return kv->pool + off * kv->HS;
}

/* The worker pool of a step's workspace (forward.c), for the scheduler's
 * sampling. */
op_pool *gpt2_workspace_pool(eng_workspace *w);

eng_status gpt2_fail(char *err, size_t errlen, eng_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

#endif
