/*
 * tools/tensorset.h: the tensors of a file being converted by `gpt2d
 * convert` (convert.c, quantize.c), as an array that each step rewrites,
 * and the steps between the hf and panel64 layouts (formats/include/wformat.h).
 * Prefix: tool_. Thread: any (no shared state; one set per thread).
 */
#ifndef GPT2D_TOOLS_TENSORSET_H
#define GPT2D_TOOLS_TENSORSET_H

#include "safetensors.h"

#include <stddef.h>

/* A list of tensor views and the bytes it owns. A step replaces a tensor's
 * view by new bytes from tool_set_alloc; the views it starts with borrow
 * the file's names, shapes and data (the file must stay open). */
typedef struct {
    sft_tensor *t; /* n tensors (order: the file's, then appended ones) */
    size_t n, cap;
    void **owned; /* allocations freed by tool_set_free */
    size_t nowned, owncap;
} tool_set;

/* The tensors of f; 0, or -1 with err when out of memory (*s then empty
 * and safe to free). */
int tool_set_init(tool_set *s, const sft_file *f, char *err, size_t errlen);

/* bytes (at least 1) owned by s, or NULL when out of memory. */
void *tool_set_alloc(tool_set *s, size_t bytes);

/* Appends a view; 0, or -1 when out of memory. */
int tool_set_push(tool_set *s, const sft_tensor *t);

/* The tensor called name, or NULL. */
sft_tensor *tool_set_find(const tool_set *s, const char *name);

/* Frees what s owns; accepts an empty or zeroed set. */
void tool_set_free(tool_set *s);

/* 1 for a projection or the q8 scale tensor of one (the tensors the
 * panel64 layout stores in panels). */
int tool_is_paneled(const char *name);

/* panel64 to hf: every 3-D projection [N/64, K, 64] (and q8 scale
 * [N/64, ceil(K/32), 64]) becomes its logical [K, N] (or [ceil(K/32), N]),
 * the same bytes permuted; other tensors are kept. For a set from a file
 * that passed wf_detect. 0, or -1 with err. */
int tool_unpanel(tool_set *s, char *err, size_t errlen);

/* hf to panel64, the inverse: every projection and projection scale must
 * be 2-D with a column count that is a multiple of WF_PANEL, or it fails
 * with err naming the tensor. 0, or -1 with err. */
int tool_panel(tool_set *s, char *err, size_t errlen);

/* pairs64 to hf: every 4-D projection [N/64, K/2, 64, 2] becomes its
 * logical [K, N], the same BF16 values permuted; other tensors are kept.
 * For a set from a file that passed wf_detect. 0, or -1 with err. */
int tool_unpair(tool_set *s, char *err, size_t errlen);

/* hf to pairs64, the inverse: every projection must be a BF16 matrix
 * with an even row count and a column count that is a multiple of
 * WF_PANEL, and no q8 scale may be left, or it fails with err naming the
 * tensor. 0, or -1 with err. */
int tool_pair(tool_set *s, char *err, size_t errlen);

#endif
