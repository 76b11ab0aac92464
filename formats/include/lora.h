/*
 * formats/include/lora.h: a PEFT LoRA adapter for GPT-2, read as strictly as
 * the model file.
 *
 * An adapter is a folder as Hugging Face PEFT's save_pretrained writes it
 * for GPT2LMHeadModel:
 *   adapter_config.json        peft_type "LORA", r, lora_alpha,
 *                              target_modules, use_rslora, ...
 *   adapter_model.safetensors  for each adapted layer N and module M
 *                              (attn.c_attn, attn.c_proj, mlp.c_fc,
 *                              mlp.c_proj), F32, F16 or BF16:
 *     base_model.model.transformer.h.N.M.lora_A.weight   [r, in]
 *     base_model.model.transformer.h.N.M.lora_B.weight   [out, r]
 * An adapted module computes y = x W + b + scaling * (x A^T) B^T, with
 * scaling = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora). GPT-2's
 * Conv1D stores W as [in, out] (fan_in_fan_out: true), so the merged weight
 * is W'[i][o] = W[i][o] + scaling * sum_k A[k][i] B[o][k]; A and B have the
 * same shapes whichever way W is stored.
 *
 * The adapter file is hostile input: the safetensors reader's checks apply
 * unchanged, and then everything gpt2d does not apply exactly is refused
 * with one line naming the key (or tensor) and the reason: another
 * peft_type or task_type, DoRA, bias other than "none", modules_to_save,
 * layers_to_transform, rank_pattern / alpha_pattern, targets on the
 * embeddings, the LM head or the layer norms, a tensor that is missing,
 * unexpected, of a non-float dtype, of a shape that does not match r and
 * the base's width, on a layer the base does not have, or holding a
 * non-finite value. A key this reader does not know is accepted only with
 * a default value (null, false, "", [] or {}): PEFT adds keys release by
 * release, and one that is set may change the arithmetic.
 *
 * Prefix: lora_. Thread: any (no shared state).
 */
#ifndef GPT2D_FORMATS_LORA_H
#define GPT2D_FORMATS_LORA_H

#include "safetensors.h" /* sft_status, sft_dtype */

#include <stddef.h>

#define LORA_CONFIG_FILE "adapter_config.json"
#define LORA_WEIGHTS_FILE "adapter_model.safetensors"
#define LORA_MAX_RANK 1024         /* r above this is refused                   */
#define LORA_MAX_LAYERS 4096       /* a layer index above this is refused      */
#define LORA_MAX_CONFIG (1u << 20) /* adapter_config.json above 1 MiB is refused */

/* The four projections of a GPT-2 block an adapter may change, in the
 * order of the forward pass. */
typedef enum {
    LORA_ATTN_C_ATTN = 0, /* [C, 3C] */
    LORA_ATTN_C_PROJ = 1, /* [C, C]  */
    LORA_MLP_C_FC = 2,    /* [C, 4C] */
    LORA_MLP_C_PROJ = 3,  /* [4C, C] */
    LORA_NMODULES = 4
} lora_module;

/* One adapted module's factors, F32 (widened from the file's dtype). */
typedef struct {
    const float *a; /* (rank, in), row-major; NULL when this module of this layer is not adapted */
    const float *b; /* (out, rank), row-major; NULL with a                       */
    size_t in, out; /* the module's dimensions (set for every module)           */
} lora_pair;

/* A validated adapter. Plain data: every pointer is owned by it and valid
 * until lora_free. */
typedef struct {
    size_t n_layer;   /* the base's layers (as given, or read off the tensors)  */
    size_t n_embd;    /* the base's width C (as given, or read off the tensors) */
    size_t rank;      /* r                                                        */
    double alpha;     /* lora_alpha                                               */
    int rslora;       /* use_rslora                                               */
    float scaling;    /* alpha / r, or alpha / sqrt(r) with use_rslora            */
    unsigned targets; /* bit (1u << m) set when module m is adapted in some layer */
    size_t n_adapted; /* the (layer, module) pairs adapted                        */
    sft_dtype dtype;  /* the tensors' dtype (F32, F16 or BF16)...                 */
    int mixed_dtype;  /* ...or 1 when they do not share one (dtype: the first's)  */
    char *base_model; /* base_model_name_or_path, or NULL when absent or null     */
    char *dir;        /* the adapter's folder                                     */
    lora_pair *pairs; /* n_layer * LORA_NMODULES, pairs[layer * LORA_NMODULES + m] */
    float *slab;      /* every a and b                                            */
} lora_adapter;

/* ---- Modules ------------------------------------------------------------ */

/* "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"; "?" out of range. */
const char *lora_module_name(lora_module m);

/* The module's input and output widths for a base of width n_embd. */
void lora_module_dims(lora_module m, size_t n_embd, size_t *in, size_t *out);

/* ---- Reading ------------------------------------------------------------ */

/*
 * Reads the adapter at path: its folder, or the adapter_model.safetensors
 * in it (adapter_config.json is read beside it). n_layer and n_embd are the
 * base model's: every tensor must fit them. Either may be 0 to read it off
 * the tensors instead (`gpt2d inspect`, which has no base): the width from
 * the first tensor's shape, the layers as one more than the highest layer
 * named; the tensors must then agree with each other.
 *
 * On success *out is a new adapter (free with lora_free). On failure *out
 * is NULL, nothing is left allocated, and err holds one line "PATH: KEY:
 * reason" or "PATH: tensor 'NAME': reason". SFT_EIO: a file could not be
 * read; SFT_EFORMAT: anything malformed or unsupported; SFT_ETYPE: a tensor
 * of a non-float dtype; SFT_ETOOBIG: adapter_config.json over
 * LORA_MAX_CONFIG; SFT_ENOMEM; SFT_EINVAL: path NULL. Borrows path.
 */
sft_status lora_read(const char *path, size_t n_layer, size_t n_embd, lora_adapter **out, char *err,
                     size_t errlen);

/* Frees a and everything it owns. Accepts NULL. */
void lora_free(lora_adapter *a);

/* The pair of layer l and module m (l < a->n_layer): a->pairs' element. */
const lora_pair *lora_pair_at(const lora_adapter *a, size_t l, lora_module m);

#endif
