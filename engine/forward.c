/*
 * engine/forward.c: one batched GPT-2 step over the paged KV cache.
 *
 * Every item's new tokens are stacked into one (T, C) activation, so each
 * weight matrix is read once per step for all sequences together. Every
 * kernel (op_*.c, kernels.h) reduces each output element in a fixed order that does not
 * depend on T, so a sequence's numbers do not depend on its neighbours in
 * the batch (tests/test_engine.c checks it bitwise). Attention runs per row
 * over its own sequence's blocks.
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Rows per logits GEMM: V floats each, so 64 rows are 12.9 MB for GPT-2. */
#define LOGIT_ROWS 64

/* The rows of a step that share one adapter: lrow[first .. first + n). */
typedef struct {
    const eng_adapter *a;
    size_t first, n;
} lora_group;

struct eng_workspace {
    size_t max_rows;
    eng_times times; /* cumulative, for benchmarks */
    op_pool *pool;
    int own_pool;  /* 0: borrowed from another workspace (eng_workspace_new_on) */
    float *x;      /* (T, C) residual stream */
    float *ln;     /* (T, C)                 */
    float *qkv;    /* (T, 3C)                */
    float *att;    /* (T, C)                 */
    float *tmp;    /* (T, C)                 */
    float *fc;     /* (T, 4C)                */
    float *scores; /* (threads, 4, n_ctx)    */
    float *pack;   /* op_matmul_scratch_floats(threads, 4C, 4C) */
    float *lrows;  /* (LOGIT_ROWS, C)        */
    float *logits; /* (LOGIT_ROWS, V)        */
    size_t *pos;   /* (T) position of each row  */
    size_t *item;  /* (T) item of each row      */
    /* LoRA: this step's groups of rows that share an adapter, their rows
     * one group after the other, and the product's scratch. */
    lora_group *groups; /* (T) at most one a row */
    size_t ngroups;
    size_t *lrow;           /* (T) rows by group         */
    op_lora_group *lgroups; /* (T) one projection's      */
    float *lora_u;          /* (threads, OP_LORA_ROWS, OP_LORA_MAX_RANK) */
};

static float *falloc(size_t n)
{
    return aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
}

static eng_status workspace_new(const eng_model *m, size_t max_rows, size_t threads,
                                op_pool *borrowed, eng_workspace **out)
{
    *out = NULL;
    const eng_config *c = &m->cfg;
    size_t C = c->n_embd, R = max_rows;
    if (R == 0) return ENG_EINVAL;
    eng_workspace *w = calloc(1, sizeof *w);
    if (w == NULL) return ENG_ENOMEM;
    w->max_rows = R;
    if (threads == 0) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        threads = ncpu > 0 ? (size_t)ncpu : 1;
    }
    w->own_pool = borrowed == NULL;
    w->pool = borrowed != NULL ? borrowed : op_pool_new(threads);
    if (w->pool == NULL) {
        free(w);
        return ENG_ENOMEM;
    }
    w->x = falloc(R * C);
    w->ln = falloc(R * C);
    w->qkv = falloc(R * 3 * C);
    w->att = falloc(R * C);
    w->tmp = falloc(R * C);
    w->fc = falloc(R * 4 * C);
    w->scores = falloc(op_pool_size(w->pool) * OP_ATT_ROWS * c->n_ctx);
    w->pack = falloc(op_matmul_scratch_floats(op_pool_size(w->pool), 4 * C, 4 * C));
    w->lrows = falloc(LOGIT_ROWS * C);
    w->logits = falloc(LOGIT_ROWS * c->n_vocab);
    w->pos = malloc(R * sizeof *w->pos);
    w->item = malloc(R * sizeof *w->item);
    w->groups = malloc(R * sizeof *w->groups);
    w->lrow = malloc(R * sizeof *w->lrow);
    w->lgroups = malloc(R * sizeof *w->lgroups);
    w->lora_u = falloc(op_pool_size(w->pool) * (size_t)OP_LORA_ROWS * OP_LORA_MAX_RANK);
    if (!w->groups || !w->lrow || !w->lgroups || !w->lora_u || !w->x || !w->ln || !w->qkv || !w->att
        || !w->tmp || !w->fc || !w->scores || !w->pack || !w->lrows || !w->logits || !w->pos
        || !w->item) {
        eng_workspace_free(w);
        return ENG_ENOMEM;
    }
    *out = w;
    return ENG_OK;
}

eng_status eng_workspace_new(const eng_model *m, size_t max_rows, size_t threads,
                             eng_workspace **out)
{
    return workspace_new(m, max_rows, threads, NULL, out);
}

eng_status eng_workspace_new_on(const eng_model *m, size_t max_rows, eng_workspace *threads_of,
                                eng_workspace **out)
{
    return workspace_new(m, max_rows, 0, threads_of->pool, out);
}

op_pool *gpt2_workspace_pool(eng_workspace *w)
{
    return w->pool;
}

void eng_workspace_free(eng_workspace *w)
{
    if (w == NULL) return;
    if (w->own_pool) op_pool_free(w->pool);
    free(w->x);
    free(w->ln);
    free(w->qkv);
    free(w->att);
    free(w->tmp);
    free(w->fc);
    free(w->scores);
    free(w->pack);
    free(w->lrows);
    free(w->logits);
    free(w->pos);
    free(w->item);
    free(w->groups);
    free(w->lrow);
    free(w->lgroups);
    free(w->lora_u);
    free(w);
}

/* ---- The step ------------------------------------------------------------ */

static double clock_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Runs call and adds its wall time to w->times.slot. */
#define TIMED(slot, call)                                                                          \
    do {                                                                                           \
        double t0_ = clock_s();                                                                    \
        call;                                                                                      \
        w->times.slot += clock_s() - t0_;                                                          \
    } while (0)

void eng_workspace_times(const eng_workspace *w, eng_times *out)
{
    *out = w->times;
}

void eng_workspace_times_clear(eng_workspace *w)
{
    memset(&w->times, 0, sizeof w->times);
}

static void residual_add(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

/* ln_f over the k gathered rows, logits (k, V) = rows @ wte^T, copied to each
 * row's destination. */
static void lm_head(eng_workspace *w, const eng_model *m, float *const *dest, size_t k)
{
    const eng_config *c = &m->cfg;
    op_layernorm(w->pool, w->lrows, w->lrows, &m->lnf_g, &m->lnf_b, k, c->n_embd, c->ln_eps);
    op_lm_head(w->pool, w->pack, w->logits, w->lrows, &m->wte, k, c->n_embd, c->n_vocab);
    for (size_t q = 0; q < k; q++)
        memcpy(dest[q], w->logits + q * c->n_vocab, c->n_vocab * sizeof(float));
}

/* Groups the step's rows by adapter (items in order; the base model's
 * rows in none): w->groups, w->lrow. The grouping changes no bits (each
 * row's product depends on that row alone); it reads each adapter's
 * factors once per step rather than once per sequence. */
static void lora_group_rows(eng_workspace *w, const eng_item *items, size_t nitems)
{
    w->ngroups = 0;
    for (size_t i = 0; i < nitems; i++) {
        const eng_adapter *a = items[i].adapter;
        if (a == NULL) continue;
        size_t g = 0;
        while (g < w->ngroups && w->groups[g].a != a) g++;
        if (g == w->ngroups) w->groups[w->ngroups++] = (lora_group){a, 0, 0};
        w->groups[g].n += items[i].n;
    }
    size_t at = 0;
    for (size_t g = 0; g < w->ngroups; g++) {
        w->groups[g].first = at;
        at += w->groups[g].n;
        w->groups[g].n = 0;
    }
    size_t r = 0;
    for (size_t i = 0; i < nitems; i++) {
        const eng_adapter *a = items[i].adapter;
        size_t g = 0;
        while (a != NULL && w->groups[g].a != a) g++;
        for (size_t k = 0; k < items[i].n; k++, r++) {
            if (a == NULL) continue;
            lora_group *G = &w->groups[g];
            w->lrow[G->first + G->n++] = r;
        }
    }
}

/* out (T, N) += each group's low-rank product of projection mo of layer l
 * over in (T, K), after the base matmul: one pool run for all groups. */
static void lora_add(eng_workspace *w, float *out, const float *in, size_t l, lora_module mo,
                     size_t K, size_t N)
{
    size_t n = 0;
    for (size_t g = 0; g < w->ngroups; g++) {
        const lora_group *G = &w->groups[g];
        const eng_adapter_pair *p = &G->a->pairs[l * LORA_NMODULES + mo];
        if (p->a.p == NULL) continue;
        w->lgroups[n++] = (op_lora_group){.a = &p->a,
                                          .bt = &p->bt,
                                          .r = G->a->rank,
                                          .scaling = G->a->scaling,
                                          .rows = w->lrow + G->first,
                                          .nrows = G->n};
    }
    op_lora(w->pool, w->lora_u, out, in, w->lgroups, n, K, N);
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
        if (it->n == 0) return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "item %zu has no tokens", i);
        if (it->seq->len + it->n > c->n_ctx)
            return ERRBUF_FAIL(err, errlen, ENG_EINVAL,
                               "item %zu: positions up to %zu are past the context of %zu", i,
                               it->seq->len + it->n, c->n_ctx);
        if (it->seq->len + it->n > it->seq->cap)
            return ERRBUF_FAIL(err, errlen, ENG_EINVAL,
                               "item %zu: %zu positions but only %zu reserved in the KV cache", i,
                               it->seq->len + it->n, it->seq->cap);
        if (it->adapter != NULL && (it->adapter->n_layer != c->n_layer || it->adapter->n_embd != C))
            return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "item %zu: the adapter is another model's",
                               i);
        if (it->want != ENG_LOGITS_NONE && it->logits == NULL)
            return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "item %zu: no logits buffer", i);
        for (size_t k = 0; k < it->n; k++)
            if (it->tokens[k] < 0 || (size_t)it->tokens[k] >= V)
                return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "item %zu: token %d is not in 0..%zu",
                                   i, it->tokens[k], V - 1);
        T += it->n;
    }
    if (T > w->max_rows)
        return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "%zu rows exceed the workspace's %zu", T,
                           w->max_rows);

    /* Embeddings: x = wte[token] + wpe[position], both widened from the
     * file's format (the LM head reads the same wte). */
    size_t r = 0;
    for (size_t i = 0; i < nitems; i++) {
        for (size_t k = 0; k < items[i].n; k++, r++) {
            size_t pos = items[i].seq->len + k;
            float *te = w->x + r * C, *pe = w->tmp;
            op_widen(te, &m->wte, (size_t)items[i].tokens[k] * C, C);
            op_widen(pe, &m->wpe, pos * C, C);
            for (size_t j = 0; j < C; j++) te[j] += pe[j];
            w->pos[r] = pos;
            w->item[r] = i;
        }
    }

    lora_group_rows(w, items, nitems);
    op_pool *P = w->pool;
    for (size_t l = 0; l < c->n_layer; l++) {
        const gpt2_layer *L = &m->layers[l];
        TIMED(other, op_layernorm(P, w->ln, w->x, &L->ln1_g, &L->ln1_b, T, C, c->ln_eps));
        TIMED(matmul, op_matmul(P, w->pack, w->qkv, w->ln, &L->attn_w, &L->attn_b, T, C, 3 * C));
        TIMED(lora, lora_add(w, w->qkv, w->ln, l, LORA_ATTN_C_ATTN, C, 3 * C));
        double t0 = clock_s(); /* K, V rows -> the cache, then attention (T,C) */
        for (size_t t = 0; t < T; t++) {
            const eng_seq *seq = items[w->item[t]].seq;
            float *k = kv_head(kv, seq, l, 0, 0, w->pos[t]),
                  *v = kv_head(kv, seq, l, 1, 0, w->pos[t]);
            size_t head_stride = kv->block_len * HS; /* from one head to the next */
            for (size_t h = 0; h < NH; h++) {
                memcpy(k + h * head_stride, w->qkv + t * 3 * C + C + h * HS, HS * sizeof(float));
                memcpy(v + h * head_stride, w->qkv + t * 3 * C + 2 * C + h * HS,
                       HS * sizeof(float));
            }
        }
        op_attention(P, w->att, w->qkv, kv, items, w->item, w->pos, T, l, NH, HS, w->scores,
                     c->n_ctx);
        w->times.attention += clock_s() - t0;
        TIMED(matmul, op_matmul(P, w->pack, w->tmp, w->att, &L->proj_w, &L->proj_b, T, C, C));
        TIMED(lora, lora_add(w, w->tmp, w->att, l, LORA_ATTN_C_PROJ, C, C));
        TIMED(other, residual_add(w->x, w->tmp, T * C));
        TIMED(other, op_layernorm(P, w->ln, w->x, &L->ln2_g, &L->ln2_b, T, C, c->ln_eps));
        TIMED(matmul, op_matmul(P, w->pack, w->fc, w->ln, &L->fc_w, &L->fc_b, T, C, 4 * C));
        TIMED(lora, lora_add(w, w->fc, w->ln, l, LORA_MLP_C_FC, C, 4 * C));
        TIMED(other, op_gelu(P, w->fc, T * 4 * C));
        TIMED(matmul, op_matmul(P, w->pack, w->tmp, w->fc, &L->fc2_w, &L->fc2_b, T, 4 * C, C));
        TIMED(lora, lora_add(w, w->tmp, w->fc, l, LORA_MLP_C_PROJ, 4 * C, C));
        TIMED(other, residual_add(w->x, w->tmp, T * C));
    }

    /* Embeddings: each row's ln_f output added to its item's sum, in
     * position order, LOGIT_ROWS rows at a time (a row's layer norm is the
     * same bits in any group). */
    r = 0;
    for (size_t i = 0; i < nitems; i++) {
        float *sum = items[i].hidden_sum;
        for (size_t j = 0; sum != NULL && j < items[i].n; j += LOGIT_ROWS) {
            size_t k = items[i].n - j < LOGIT_ROWS ? items[i].n - j : LOGIT_ROWS;
            memcpy(w->lrows, w->x + (r + j) * C, k * C * sizeof(float));
            TIMED(lm_head,
                  op_layernorm(P, w->lrows, w->lrows, &m->lnf_g, &m->lnf_b, k, C, c->ln_eps));
            for (size_t q = 0; q < k; q++)
                for (size_t e = 0; e < C; e++) sum[e] += w->lrows[q * C + e];
        }
        r += items[i].n;
    }

    /* Logits only for the rows that sample: gather them after ln_f, then
     * logits = h @ wte^T, up to LOGIT_ROWS rows at a time. */
    float *dest[LOGIT_ROWS];
    size_t k = 0;
    r = 0;
    for (size_t i = 0; i < nitems; i++) {
        size_t n = items[i].n;
        size_t first = items[i].want == ENG_LOGITS_ALL    ? 0
                       : items[i].want == ENG_LOGITS_LAST ? n - 1
                                                          : n;
        for (size_t j = first; j < n; j++) {
            memcpy(w->lrows + k * C, w->x + (r + j) * C, C * sizeof(float));
            dest[k++] = items[i].logits + (items[i].want == ENG_LOGITS_ALL ? j * V : 0);
            if (k == LOGIT_ROWS) {
                TIMED(lm_head, lm_head(w, m, dest, k));
                k = 0;
            }
        }
        r += n;
    }
    if (k > 0) TIMED(lm_head, lm_head(w, m, dest, k));
    for (size_t i = 0; i < nitems; i++) items[i].seq->len += items[i].n;
    return ENG_OK;
}
