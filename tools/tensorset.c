/*
 * tools/tensorset.c: the tensor array of `gpt2d convert` and the panel64
 * and pairs64 permutations (see tensorset.h; the layout is specified in
 * formats/include/wformat.h).
 *
 * The permutation moves runs of WF_PANEL elements: row k of panel g of the
 * stored tensor, [g][k][0..64), is row k's columns g*64 .. g*64+63 of the
 * logical [K, N] matrix, so (k, n) lands at ((n / 64) * K + k) * 64 + n % 64.
 * Bytes are copied as they are, whatever the dtype: hf -> panel64 -> hf
 * gives back the same bytes.
 */
#include "tensorset.h"

#include "errbuf.h"
#include "wformat.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tool_set_init(tool_set *s, const sft_file *f, char *err, size_t errlen)
{
    size_t n = sft_count(f);
    *s = (tool_set){0};
    s->cap = 2 * n + 1; /* room for a q8 scale per tensor */
    s->t = calloc(s->cap, sizeof *s->t);
    if (s->t == NULL) {
        s->cap = 0;
        errbuf_set(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) s->t[i] = *sft_tensor_at(f, i);
    s->n = n;
    return 0;
}

void *tool_set_alloc(tool_set *s, size_t bytes)
{
    if (s->nowned == s->owncap) {
        size_t cap = s->owncap ? 2 * s->owncap : 64;
        void **o = realloc(s->owned, cap * sizeof *o);
        if (o == NULL) return NULL;
        s->owned = o;
        s->owncap = cap;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (p != NULL) s->owned[s->nowned++] = p;
    return p;
}

int tool_set_push(tool_set *s, const sft_tensor *t)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        sft_tensor *nt = realloc(s->t, cap * sizeof *nt);
        if (nt == NULL) return -1;
        s->t = nt;
        s->cap = cap;
    }
    s->t[s->n++] = *t;
    return 0;
}

sft_tensor *tool_set_find(const tool_set *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->t[i].name, name) == 0) return &s->t[i];
    return NULL;
}

void tool_set_free(tool_set *s)
{
    for (size_t i = 0; i < s->nowned; i++) free(s->owned[i]);
    free(s->owned);
    free(s->t);
    *s = (tool_set){0};
}

int tool_is_paneled(const char *name)
{
    size_t n = strlen(name), sl = strlen(WF_Q8_SCALE_SUFFIX);
    if (wf_is_projection(name)) return 1;
    if (n <= sl || strcmp(name + n - sl, WF_Q8_SCALE_SUFFIX) != 0) return 0;
    char base[512];
    if (n - sl >= sizeof base) return 0;
    memcpy(base, name, n - sl);
    base[n - sl] = '\0';
    return wf_is_projection(base);
}

/* One permutation between [rows, N] (hf) and [N/64, rows, 64] (panel64) of
 * elements of esize bytes; to_panel picks the direction. */
static void permute(const unsigned char *src, unsigned char *dst, size_t rows, size_t N,
                    size_t esize, int to_panel)
{
    size_t run = WF_PANEL * esize;
    for (size_t g = 0; g < N / WF_PANEL; g++)
        for (size_t k = 0; k < rows; k++) {
            size_t hf = (k * N + g * WF_PANEL) * esize, pa = (g * rows + k) * run;
            if (to_panel)
                memcpy(dst + pa, src + hf, run);
            else
                memcpy(dst + hf, src + pa, run);
        }
}

/* Replaces t's view by its permutation into the shape {d0, d1[, d2]}. */
static int relayout(tool_set *s, sft_tensor *t, size_t rows, size_t N, int to_panel, char *err,
                    size_t errlen)
{
    int64_t *shape = tool_set_alloc(s, 3 * sizeof *shape);
    unsigned char *dst = tool_set_alloc(s, t->nbytes);
    if (shape == NULL || dst == NULL) {
        errbuf_set(err, errlen, "out of memory");
        return -1;
    }
    permute(t->data, dst, rows, N, sft_dtype_size(t->dtype), to_panel);
    if (to_panel) {
        shape[0] = (int64_t)(N / WF_PANEL);
        shape[1] = (int64_t)rows;
        shape[2] = WF_PANEL;
    } else {
        shape[0] = (int64_t)rows;
        shape[1] = (int64_t)N;
    }
    t->ndim = to_panel ? 3 : 2;
    t->shape = shape;
    t->data = dst;
    return 0;
}

int tool_unpanel(tool_set *s, char *err, size_t errlen)
{
    for (size_t i = 0; i < s->n; i++) {
        sft_tensor *t = &s->t[i];
        if (t->ndim != 3 || !tool_is_paneled(t->name)) continue;
        if (t->shape[2] != WF_PANEL) { /* wf_detect refuses it; checked for the indexing */
            errbuf_set(err, errlen, "%s: last dimension %lld, expected %d", t->name,
                       (long long)t->shape[2], WF_PANEL);
            return -1;
        }
        size_t N = (size_t)t->shape[0] * WF_PANEL;
        if (relayout(s, t, (size_t)t->shape[1], N, 0, err, errlen) != 0) return -1;
    }
    return 0;
}

int tool_panel(tool_set *s, char *err, size_t errlen)
{
    for (size_t i = 0; i < s->n; i++) {
        sft_tensor *t = &s->t[i];
        if (!tool_is_paneled(t->name)) continue;
        if (t->ndim != 2) {
            errbuf_set(err, errlen, "%s: a %zu-D projection; the %s layout needs a matrix", t->name,
                       t->ndim, WF_LAYOUT_PANEL);
            return -1;
        }
        if (t->shape[1] % WF_PANEL != 0) {
            errbuf_set(err, errlen,
                       "%s: %lld columns are not a multiple of %d; the %s layout cannot store it",
                       t->name, (long long)t->shape[1], WF_PANEL, WF_LAYOUT_PANEL);
            return -1;
        }
        if (relayout(s, t, (size_t)t->shape[0], (size_t)t->shape[1], 1, err, errlen) != 0)
            return -1;
    }
    return 0;
}

/* The pairs64 permutation of a [K, N] BF16 matrix (wformat.h): (k, n) of
 * hf at k * N + n, of pairs64 at ((n / 64) * (K / 2) + k / 2) * 128 +
 * (n % 64) * 2 + k % 2; to_pairs picks the direction. */
static void permute_pairs(const uint16_t *src, uint16_t *dst, size_t K, size_t N, int to_pairs)
{
    for (size_t k = 0; k < K; k++)
        for (size_t n = 0; n < N; n++) {
            size_t hf = k * N + n;
            size_t pa =
                ((n / WF_PANEL) * (K / 2) + k / 2) * 2 * WF_PANEL + (n % WF_PANEL) * 2 + k % 2;
            if (to_pairs)
                dst[pa] = src[hf];
            else
                dst[hf] = src[pa];
        }
}

static int repair(tool_set *s, sft_tensor *t, size_t K, size_t N, int to_pairs, char *err,
                  size_t errlen)
{
    int64_t *shape = tool_set_alloc(s, 4 * sizeof *shape);
    uint16_t *dst = tool_set_alloc(s, t->nbytes);
    if (shape == NULL || dst == NULL) {
        errbuf_set(err, errlen, "out of memory");
        return -1;
    }
    permute_pairs(t->data, dst, K, N, to_pairs);
    if (to_pairs) {
        shape[0] = (int64_t)(N / WF_PANEL);
        shape[1] = (int64_t)(K / 2);
        shape[2] = WF_PANEL;
        shape[3] = 2;
    } else {
        shape[0] = (int64_t)K;
        shape[1] = (int64_t)N;
    }
    t->ndim = to_pairs ? 4 : 2;
    t->shape = shape;
    t->data = dst;
    return 0;
}

int tool_unpair(tool_set *s, char *err, size_t errlen)
{
    for (size_t i = 0; i < s->n; i++) {
        sft_tensor *t = &s->t[i];
        if (t->ndim != 4 || !wf_is_projection(t->name)) continue;
        if (t->dtype != SFT_BF16 || t->shape[2] != WF_PANEL || t->shape[3] != 2) {
            /* wf_detect refuses it; checked for the indexing */
            errbuf_set(err, errlen, "%s: not BF16 [N/%d, K/2, %d, 2]", t->name, WF_PANEL, WF_PANEL);
            return -1;
        }
        if (repair(s, t, 2 * (size_t)t->shape[1], (size_t)t->shape[0] * WF_PANEL, 0, err, errlen)
            != 0)
            return -1;
    }
    return 0;
}

int tool_pair(tool_set *s, char *err, size_t errlen)
{
    for (size_t i = 0; i < s->n; i++) {
        sft_tensor *t = &s->t[i];
        if (!tool_is_paneled(t->name)) continue;
        if (!wf_is_projection(t->name) || t->dtype != SFT_BF16 || t->ndim != 2) {
            errbuf_set(err, errlen,
                       "%s: %s %zu-D; the %s layout stores BF16 projection matrices only "
                       "(--dtype bf16)",
                       t->name, sft_dtype_name(t->dtype), t->ndim, WF_LAYOUT_PAIRS);
            return -1;
        }
        if (t->shape[0] % 2 != 0 || t->shape[1] % WF_PANEL != 0) {
            errbuf_set(err, errlen,
                       "%s: [%lld, %lld]; the %s layout needs an even row count and columns a "
                       "multiple of %d",
                       t->name, (long long)t->shape[0], (long long)t->shape[1], WF_LAYOUT_PAIRS,
                       WF_PANEL);
            return -1;
        }
        if (repair(s, t, (size_t)t->shape[0], (size_t)t->shape[1], 1, err, errlen) != 0) return -1;
    }
    return 0;
}
