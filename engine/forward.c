/*
 * engine/forward.c: one batched GPT-2 step over the paged KV cache.
 *
 * Every item's new tokens are stacked into one (T, C) activation, so each
 * weight matrix is read once per step for all sequences together; every
 * matmul is a row-major SGEMM (never a GEMV special case), which in
 * OpenBLAS reduces each output row in the same order whatever T is, so a
 * sequence's numbers do not depend on its neighbours in the batch
 * (tests/test_engine.c checks it bitwise). Attention runs per row over its
 * own sequence's blocks in a fixed order.
 */
#include "internal.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rows per logits GEMM: V floats each, so 64 rows are 12.9 MB for GPT-2. */
#define LOGIT_ROWS 64

struct eng_workspace {
    size_t max_rows;
    float *x;      /* (T, C) residual stream */
    float *ln;     /* (T, C)                 */
    float *qkv;    /* (T, 3C)                */
    float *att;    /* (T, C)                 */
    float *tmp;    /* (T, C)                 */
    float *fc;     /* (T, 4C)                */
    float *scores; /* (n_ctx)                */
    float *lrows;  /* (LOGIT_ROWS, C)        */
    float *logits; /* (LOGIT_ROWS, V)        */
    size_t *pos;   /* (T) position of each row  */
    size_t *item;  /* (T) item of each row      */
};

static float *falloc(size_t n)
{
    return aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
}

eng_status eng_workspace_new(const eng_model *m, size_t max_rows, eng_workspace **out)
{
    *out = NULL;
    const eng_config *c = &m->cfg;
    size_t C = c->n_embd, R = max_rows;
    if (R == 0) return ENG_EINVAL;
    eng_workspace *w = calloc(1, sizeof *w);
    if (w == NULL) return ENG_ENOMEM;
    w->max_rows = R;
    w->x = falloc(R * C);
    w->ln = falloc(R * C);
    w->qkv = falloc(R * 3 * C);
    w->att = falloc(R * C);
    w->tmp = falloc(R * C);
    w->fc = falloc(R * 4 * C);
    w->scores = falloc(c->n_ctx);
    w->lrows = falloc(LOGIT_ROWS * C);
    w->logits = falloc(LOGIT_ROWS * c->n_vocab);
    w->pos = malloc(R * sizeof *w->pos);
    w->item = malloc(R * sizeof *w->item);
    if (!w->x || !w->ln || !w->qkv || !w->att || !w->tmp || !w->fc || !w->scores || !w->lrows
        || !w->logits || !w->pos || !w->item) {
        eng_workspace_free(w);
        return ENG_ENOMEM;
    }
    *out = w;
    return ENG_OK;
}

void eng_workspace_free(eng_workspace *w)
{
    if (w == NULL) return;
    free(w->x);
    free(w->ln);
    free(w->qkv);
    free(w->att);
    free(w->tmp);
    free(w->fc);
    free(w->scores);
    free(w->lrows);
    free(w->logits);
    free(w->pos);
    free(w->item);
    free(w);
}

/* ---- Kernels ------------------------------------------------------------- */

/* out = layernorm(in) * g + b, row by row; mean and variance in double so
 * the result does not drift with the width. */
static void op_layernorm(float *out, const float *in, const float *g, const float *b, size_t T,
                         size_t C, float eps)
{
    for (size_t t = 0; t < T; t++) {
        const float *x = in + t * C;
        float *y = out + t * C;
        double mean = 0, var = 0;
        for (size_t i = 0; i < C; i++) mean += x[i];
        mean /= (double)C;
        for (size_t i = 0; i < C; i++) var += (x[i] - mean) * (x[i] - mean);
        var /= (double)C;
        float rstd = (float)(1.0 / sqrt(var + eps));
        float m = (float)mean;
        for (size_t i = 0; i < C; i++) y[i] = (x[i] - m) * rstd * g[i] + b[i];
    }
}

/* out (T, N) = in (T, K) @ W (K, N) + bias (N): Conv1D weights as stored. */
static void op_matmul(float *out, const float *in, const float *W, const float *bias, size_t T,
                      size_t K, size_t N)
{
    for (size_t t = 0; t < T; t++) memcpy(out + t * N, bias, N * sizeof *out);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)T, (blasint)N, (blasint)K,
                1.0f, in, (blasint)K, W, (blasint)N, 1.0f, out, (blasint)N);
}

/* GELU, tanh approximation (GPT-2's "gelu_new"). */
static void op_gelu(float *x, size_t n)
{
    const float s = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(s * (v + 0.044715f * v * v * v)));
    }
}

static void op_add(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

/* Causal attention of every row over its sequence's cached K and V (which
 * already hold this step's rows). att (T, C); qkv (T, 3C). */
static void op_attention(float *att, const float *qkv, const eng_kv *kv, const eng_item *items,
                         const size_t *row_item, const size_t *row_pos, size_t T, size_t l,
                         size_t NH, size_t HS, float *scores)
{
    size_t C = NH * HS;
    float scale = 1.0f / sqrtf((float)HS);
    for (size_t t = 0; t < T; t++) {
        const eng_seq *seq = items[row_item[t]].seq;
        size_t p = row_pos[t];
        for (size_t h = 0; h < NH; h++) {
            const float *q = qkv + t * 3 * C + h * HS;
            float maxv = -INFINITY;
            for (size_t s = 0; s <= p; s++) {
                const float *k = kv_at(kv, seq, l, 0, s) + h * HS;
                float d = 0;
                for (size_t i = 0; i < HS; i++) d += q[i] * k[i];
                d *= scale;
                scores[s] = d;
                if (d > maxv) maxv = d;
            }
            float sum = 0;
            for (size_t s = 0; s <= p; s++) {
                scores[s] = expf(scores[s] - maxv);
                sum += scores[s];
            }
            float inv = 1.0f / sum;
            float *o = att + t * C + h * HS;
            memset(o, 0, HS * sizeof *o);
            for (size_t s = 0; s <= p; s++) {
                const float *v = kv_at(kv, seq, l, 1, s) + h * HS;
                float w = scores[s] * inv;
                for (size_t i = 0; i < HS; i++) o[i] += w * v[i];
            }
        }
    }
}

/* ---- The step ------------------------------------------------------------ */

/* logits (k, V) = lrows (k, C) @ wte^T, copied to each row's destination. */
static void lm_head(eng_workspace *w, const eng_model *m, float *const *dest, size_t k)
{
    size_t C = m->cfg.n_embd, V = m->cfg.n_vocab;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)k, (blasint)V, (blasint)C, 1.0f,
                w->lrows, (blasint)C, m->wte, (blasint)C, 0.0f, w->logits, (blasint)V);
    for (size_t q = 0; q < k; q++) memcpy(dest[q], w->logits + q * V, V * sizeof(float));
}

eng_status eng_forward(const eng_model *m, eng_kv *kv, eng_workspace *w, eng_item *items,
                       size_t nitems, char *err, size_t errlen)
{
    const eng_config *c = &m->cfg;
    const size_t C = c->n_embd, V = c->n_vocab, NH = c->n_head, HS = C / NH;

    /* Validate everything before computing anything. */
    size_t T = 0;
    for (size_t i = 0; i < nitems; i++) {
        const eng_item *it = &items[i];
        if (it->n == 0)
            return gpt2_fail(err, errlen, ENG_EINVAL, "item %zu has no tokens", i);
        if (it->seq->len + it->n > c->n_ctx)
            return gpt2_fail(err, errlen, ENG_EINVAL,
                             "item %zu: positions up to %zu are past the context of %zu", i,
                             it->seq->len + it->n, c->n_ctx);
        if (it->seq->len + it->n > it->seq->cap)
            return gpt2_fail(err, errlen, ENG_EINVAL,
                             "item %zu: %zu positions but only %zu reserved in the KV cache", i,
                             it->seq->len + it->n, it->seq->cap);
        if (it->want != ENG_LOGITS_NONE && it->logits == NULL)
            return gpt2_fail(err, errlen, ENG_EINVAL, "item %zu: no logits buffer", i);
        for (size_t k = 0; k < it->n; k++)
            if (it->tokens[k] < 0 || (size_t)it->tokens[k] >= V)
                return gpt2_fail(err, errlen, ENG_EINVAL, "item %zu: token %d is not in 0..%zu",
                                 i, it->tokens[k], V - 1);
        T += it->n;
    }
    if (T > w->max_rows)
        return gpt2_fail(err, errlen, ENG_EINVAL, "%zu rows exceed the workspace's %zu", T,
                         w->max_rows);

    /* Embeddings: x = wte[token] + wpe[position]. */
    size_t r = 0;
    for (size_t i = 0; i < nitems; i++) {
        for (size_t k = 0; k < items[i].n; k++, r++) {
            size_t pos = items[i].seq->len + k;
            const float *te = m->wte + (size_t)items[i].tokens[k] * C, *pe = m->wpe + pos * C;
            for (size_t j = 0; j < C; j++) w->x[r * C + j] = te[j] + pe[j];
            w->pos[r] = pos;
            w->item[r] = i;
        }
    }

    for (size_t l = 0; l < c->n_layer; l++) {
        const gpt2_layer *L = &m->layers[l];
        op_layernorm(w->ln, w->x, L->ln1_g, L->ln1_b, T, C, c->ln_eps); /* (T,C)            */
        op_matmul(w->qkv, w->ln, L->attn_w, L->attn_b, T, C, 3 * C);    /* (T,3C); W (C,3C) */
        for (size_t t = 0; t < T; t++) {                               /* K, V -> cache    */
            const eng_seq *seq = items[w->item[t]].seq;
            memcpy(kv_at(kv, seq, l, 0, w->pos[t]), w->qkv + t * 3 * C + C, C * sizeof(float));
            memcpy(kv_at(kv, seq, l, 1, w->pos[t]), w->qkv + t * 3 * C + 2 * C,
                   C * sizeof(float));
        }
        op_attention(w->att, w->qkv, kv, items, w->item, w->pos, T, l, NH, HS, w->scores);
        op_matmul(w->tmp, w->att, L->proj_w, L->proj_b, T, C, C); /* (T,C)             */
        op_add(w->x, w->tmp, T * C);
        op_layernorm(w->ln, w->x, L->ln2_g, L->ln2_b, T, C, c->ln_eps);
        op_matmul(w->fc, w->ln, L->fc_w, L->fc_b, T, C, 4 * C); /* (T,4C)            */
        op_gelu(w->fc, T * 4 * C);
        op_matmul(w->tmp, w->fc, L->fc2_w, L->fc2_b, T, 4 * C, C); /* (T,C)          */
        op_add(w->x, w->tmp, T * C);
    }

    /* Logits only for the rows that sample: gather them after ln_f, then
     * logits = h @ wte^T, up to LOGIT_ROWS rows per GEMM. */
    float *dest[LOGIT_ROWS];
    size_t k = 0;
    r = 0;
    for (size_t i = 0; i < nitems; i++) {
        size_t n = items[i].n;
        size_t first = items[i].want == ENG_LOGITS_ALL ? 0 : items[i].want == ENG_LOGITS_LAST ? n - 1 : n;
        for (size_t j = first; j < n; j++) {
            op_layernorm(w->lrows + k * C, w->x + (r + j) * C, m->lnf_g, m->lnf_b, 1, C, c->ln_eps);
            dest[k++] = items[i].logits + (items[i].want == ENG_LOGITS_ALL ? j * V : 0);
            if (k == LOGIT_ROWS) {
                lm_head(w, m, dest, k);
                k = 0;
            }
        }
        r += n;
    }
    if (k > 0) lm_head(w, m, dest, k);
    for (size_t i = 0; i < nitems; i++) items[i].seq->len += items[i].n;
    return ENG_OK;
}
