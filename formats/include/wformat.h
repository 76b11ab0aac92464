/*
 * formats/include/wformat.h: gpt2d's weight formats over safetensors, so that
 * `gpt2d inspect`, `gpt2d convert` and the engine's loader name and check a
 * file's format the same way.
 *
 * A file's format is that of its weight matrices (its 2-D tensors, and the
 * 3-D projections of a panel64 file, below):
 *   f32, f16, bf16   every matrix in that dtype (vectors may be any float);
 *   q8               8-bit: every matrix is I8 with an F32 scale tensor
 *                    "<name>.q8_scale", one scale per WF_Q8_BLOCK elements
 *                    along the matrix's reduction dimension, and
 *                    __metadata__ {"gpt2d.format": "q8", "gpt2d.q8_block":
 *                    "32"}; the value of q is the F32 product q * scale;
 *   mixed            matrices of different float dtypes (served as they are).
 * The reduction dimension of GPT-2's matrices: the rows (dimension 0) of
 * the Conv1D weights, [in, out], so the scales of an [R, C] matrix are
 * [ceil(R / 32), C]; the columns (dimension 1) of the token embeddings
 * (a name ending in "wte.weight", read by the LM head as rows of C), whose
 * scales are [V, C / 32] (C a multiple of 32).
 *
 * A file's layout, __metadata__ "gpt2d.layout":
 *   absent    "hf", the Hugging Face layout: every tensor as published;
 *   panel64   gpt2d's serving layout (faster decode: each thread streams one
 *             contiguous run): the projection matrices (names ending in
 *             attn.c_attn.weight, attn.c_proj.weight, mlp.c_fc.weight or
 *             mlp.c_proj.weight), logically [K, N] (HF's [in, out]), are
 *             stored [N / 64, K, 64], element (k, n) at flat index
 *             ((n / 64) * K + k) * 64 + n % 64 (N a multiple of 64); in a q8
 *             file their scales, logically [ceil(K / 32), N], are stored
 *             [N / 64, ceil(K / 32), 64] by the same permutation. wte, wpe,
 *             biases and layer norms are unchanged.
 *   pairs64   the layout the "avx512-bf16" kernels read (VDPBF16PS wants the
 *             two k of a pair in one 32-bit lane: engine/op_matmul_bf16.c),
 *             BF16 projections only: logically [K, N], K even, N a multiple
 *             of 64, stored [N / 64, K / 2, 64, 2], element (k, n) at flat
 *             index ((n / 64) * (K / 2) + k / 2) * 128 + (n % 64) * 2 + k % 2,
 *             so that the kernels read them straight from the shared
 *             mapping (written with the data at a multiple of 64 bytes);
 *             everything else unchanged.
 * Any other value is refused, as are a 3-D or 4-D projection in an hf file;
 * in a panel64 file, a 2-D projection, a 3-D tensor that is not a
 * projection (or its scales), or a last dimension other than 64; in a
 * pairs64 file, a projection that is not BF16 [N/64, K/2, 64, 2], any
 * other 3-D tensor or any q8 scale.
 *
 * Prefix: wf_. Thread: any.
 */
#ifndef GPT2D_FORMATS_WFORMAT_H
#define GPT2D_FORMATS_WFORMAT_H

#include "safetensors.h"

#include <stddef.h>
#include <stdint.h>

#define WF_Q8_BLOCK 32
#define WF_META_FORMAT "gpt2d.format"
#define WF_META_Q8_BLOCK "gpt2d.q8_block"
#define WF_Q8_SCALE_SUFFIX ".q8_scale"
#define WF_META_LAYOUT "gpt2d.layout"
#define WF_LAYOUT_PANEL "panel64"
#define WF_LAYOUT_PAIRS "pairs64"
#define WF_PANEL 64
/* wf_layout's values. */
enum { WF_HF = 0, WF_PANELS = 1, WF_PAIRS = 2 };

/*
 * What a checkpoint says about itself, in its __metadata__ (every key
 * optional; `gpt2d convert` keeps them, `gpt2d synth` writes
 * gpt2d.weights = random, either tool sets them with --meta KEY=VALUE):
 *   gpt2d.model_name   its name, e.g. "gpt2d-tiny": 1 to 127 printable ASCII
 *                      characters without spaces (a request's `model` may
 *                      name it, so a model name's rules);
 *   gpt2d.owned_by     who made it (OpenAI's `owned_by`): the same rules;
 *   gpt2d.description  one line for people: 1 to 1023 bytes of UTF-8
 *                      without control characters;
 *   gpt2d.weights      "random" (`gpt2d synth`: the text is nonsense) or
 *                      "trained".
 * Another value is refused (SFT_EFORMAT naming the key): a typo must not
 * pass for a label.
 */
#define WF_META_NAME "gpt2d.model_name"
#define WF_META_OWNED_BY "gpt2d.owned_by"
#define WF_META_DESCRIPTION "gpt2d.description"
#define WF_META_WEIGHTS "gpt2d.weights"
#define WF_NAME_MAX 128         /* gpt2d.model_name and gpt2d.owned_by, with the NUL */
#define WF_DESCRIPTION_MAX 1024 /* gpt2d.description, with the NUL */

typedef struct {
    const char *name;        /* gpt2d.model_name; NULL when absent (borrowed from the file) */
    const char *owned_by;    /* gpt2d.owned_by; NULL when absent */
    const char *description; /* gpt2d.description; NULL when absent */
    const char *weights;     /* "random", "trained" or "unknown" (no key): a static string */
} wf_about;

/* f's self-description (above), every present key checked. SFT_EFORMAT
 * with one line in err naming the file, the key and the rule. */
sft_status wf_about_get(const sft_file *f, wf_about *out, char *err, size_t errlen);

/* Whether value is acceptable for key: 1 for one of the keys above with a
 * value that follows its rule, and for any key that is not gpt2d's; 0 for
 * a bad value (err says which rule, "KEY: ..."), and for the keys the
 * tools write themselves (gpt2d.format, gpt2d.q8_block, gpt2d.layout). */
int wf_meta_ok(const char *key, const char *value, char *err, size_t errlen);

/*
 * The format of f: "f32", "f16", "bf16", "q8" or "mixed" (a static
 * string) in *name. A q8 file is checked whole: the metadata, every I8
 * matrix's scale tensor (present, F32, its shape) and no I8 tensor without
 * one; a file with I8 matrices but no q8 metadata, or q8 metadata and float
 * matrices, is refused. SFT_EFORMAT with one line in err naming the tensor
 * and the check. A file without 2-D tensors is "f32". The layout is checked
 * first (wf_layout and the rules above); a panel64 file's 3-D projections
 * are its matrices like the 2-D ones, their q8 scales [N / 64,
 * ceil(K / 32), 64].
 */
sft_status wf_detect(const sft_file *f, const char **name, char *err, size_t errlen);

/* 1 when the Q8 blocks of the matrix called name run along its columns
 * (the token embeddings), 0 along its rows. */
int wf_q8_along_columns(const char *name);

/* The shape of the scale tensor of an [rows, cols] I8 matrix called name;
 * 0 on success, -1 when cols is not a multiple of WF_Q8_BLOCK for a
 * matrix whose blocks run along its columns. */
int wf_q8_scale_shape(const char *name, int64_t rows, int64_t cols, int64_t out[2]);

/* 1 when name is that of a projection matrix (the four suffixes above,
 * with or without a "transformer." prefix); 0 otherwise, scales included. */
int wf_is_projection(const char *name);

/* The layout of f from its metadata: *panel = WF_PANELS (1) for panel64,
 * WF_PAIRS (2) for pairs64, WF_HF (0) for hf (no key). Any other value is SFT_EFORMAT with one line
 * in err naming the key and the value. Checks only the metadata (wf_detect checks the tensors). */
sft_status wf_layout(const sft_file *f, int *panel, char *err, size_t errlen);

#endif
