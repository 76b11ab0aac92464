/*
 * engine/model.c: GPT-2 weights over one safetensors mapping.
 *
 * The weights are views into the sft_data of the checkpoint (kept alive by a
 * reference, so the sft_file with its names is closed after loading). Conv1D
 * weights are used as stored, [in, out]: y = x @ W + b is a row-major GEMM
 * without transposes. Every tensor is used in its file's format (F32, F16
 * or BF16): the kernels widen 16-bit weights in registers, so a 16-bit file
 * stays in the shared mapping (no private copy) and gives exactly the
 * logits of its F32 widening.
 */
#include "internal.h"
#include "hfconfig.h"
#include "wformat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

_Static_assert(sizeof(((eng_about *)0)->name) == WF_NAME_MAX
                   && sizeof(((eng_about *)0)->owned_by) == WF_NAME_MAX
                   && sizeof(((eng_about *)0)->description) == WF_DESCRIPTION_MAX,
               "eng_about holds what wformat.h allows");

const char *eng_strerror(eng_status s)
{
    switch (s) {
    case ENG_OK: return "ok";
    case ENG_EIO: return "I/O error";
    case ENG_EFORMAT: return "format error";
    case ENG_ENOMEM: return "out of memory";
    case ENG_EINVAL: return "invalid argument";
    case ENG_EFULL: return "queue full";
    case ENG_ETOOBIG: return "too big";
    }
    return "unknown status";
}

/* The four projections of a layer, with their K and N. */
#define LAYER_PROJECTIONS(L, C)                                                                    \
    {                                                                                              \
        {&(L)->attn_w, (C), 3 * (C)}, {&(L)->proj_w, (C), (C)}, {&(L)->fc_w, (C), 4 * (C)},        \
        {                                                                                          \
            &(L)->fc2_w, 4 * (C), (C)                                                              \
        }                                                                                          \
    }

typedef struct {
    op_w *w;
    size_t K, N;
} projection;

void eng_model_free(eng_model *m)
{
    if (m == NULL) return;
    for (size_t i = 0; m->layers != NULL && i < m->cfg.n_layer; i++) {
        projection p[4] = LAYER_PROJECTIONS(&m->layers[i], m->cfg.n_embd);
        for (size_t j = 0; j < 4; j++) {
            if (p[j].w->pairs == p[j].w->p) p[j].w->pairs = NULL; /* the file's: not ours */
            op_w_pairs_free(p[j].w, p[j].K, p[j].N);
            op_w_quads_free(p[j].w);
        }
    }
    op_w_pairs_free(&m->wte, m->cfg.n_embd, m->cfg.n_vocab);
    op_copy_unmap(m->panels, m->panel_bytes);
    free(m->layers);
    sft_data_unref(m->data);
    free(m);
}

const eng_config *eng_model_config(const eng_model *m)
{
    return &m->cfg;
}
size_t eng_model_copied_bytes(const eng_model *m)
{
    return m->copied;
}
size_t eng_model_pair_bytes(const eng_model *m)
{
    return m->pair_bytes;
}
size_t eng_model_panel_bytes(const eng_model *m)
{
    return m->panel_bytes;
}
size_t eng_model_params(const eng_model *m)
{
    return m->params;
}
const char *eng_model_dtype(const eng_model *m)
{
    return m->dtype;
}
const char *eng_model_layout(const eng_model *m)
{
    return m->layout;
}
const eng_about *eng_model_about(const eng_model *m)
{
    return &m->about;
}

const char *eng_model_kernels(const eng_model *m)
{
    return eng_kernels_for(m->dtype);
}
size_t eng_model_weight_bytes(const eng_model *m)
{
    return m->weight_bytes;
}

typedef struct {
    const sft_file *f;
    const char *prefix; /* "" or "transformer." */
    const char *path;
    char *err;
    size_t errlen;
    size_t params;
    size_t bytes; /* as stored, scales included */
    int panel;    /* the file's projections are panel64 (wformat.h) */
} binder;

static op_dtype op_dtype_of(sft_dtype d)
{
    return d == SFT_F16 ? OP_F16 : d == SFT_BF16 ? OP_BF16 : OP_F32;
}

/* Binds the F32 scales of the Q8 matrix t, logically [K, N] (their shape
 * was checked by wf_detect; checked again here, as the kernels index by
 * it): [ceil(K / 32), N], or [N / 64, ceil(K / 32), 64] in a panel. */
static eng_status bind_scales(binder *b, op_w *dst, const sft_tensor *t, size_t K, size_t N,
                              int panel)
{
    char sname[200];
    int64_t want[3];
    snprintf(sname, sizeof sname, "%s%s", t->name, WF_Q8_SCALE_SUFFIX);
    const sft_tensor *s = sft_find(b->f, sname);
    int ok = s != NULL && wf_q8_scale_shape(t->name, (int64_t)K, (int64_t)N, want) == 0
             && s->dtype == SFT_F32;
    if (ok && panel) {
        want[2] = WF_PANEL;
        want[1] = want[0];
        want[0] = (int64_t)N / WF_PANEL;
    }
    for (size_t i = 0; ok && i < (panel ? 3u : 2u); i++)
        ok = s->ndim == (panel ? 3u : 2u) && s->shape[i] == want[i];
    if (!ok)
        return ERRBUF_FAIL(b->err, b->errlen, ENG_EFORMAT, "%s: q8 tensor '%s' lacks valid scales",
                           b->path, t->name);
    b->bytes += s->nbytes;
    *dst = (op_w){t->data, s->data, OP_Q8, panel, NULL, NULL};
    return ENG_OK;
}

/* What a tensor may be: a float vector or matrix (wpe, biases, norms); a
 * matrix that may be Q8 (wte); a projection, a [d0 = K, d1 = N] Conv1D
 * weight that may be Q8 and is stored [N / 64, K, 64] in a panel64 file. */
typedef enum { BIND_FLOAT, BIND_MAY_Q8, BIND_PROJECTION } bind_kind;

/* A projection (K, N) of a pairs64 file: BF16 [N / 64, K / 2, 64, 2]
 * (wformat.h), bound as stored with panel = OP_PANEL_PAIRS; eng_model_load
 * then reads it as the pair copy or builds a panel copy from it. */
static eng_status bind_pairs(binder *b, op_w *dst, const sft_tensor *t, size_t K, size_t N)
{
    int ok = K % 2 == 0 && N % WF_PANEL == 0 && t->ndim == 4 && t->dtype == SFT_BF16
             && (size_t)t->shape[0] == N / WF_PANEL && (size_t)t->shape[1] == K / 2
             && t->shape[2] == WF_PANEL && t->shape[3] == 2;
    if (!ok)
        return ERRBUF_FAIL(b->err, b->errlen, ENG_EFORMAT,
                           "%s: tensor '%s' is not BF16 [%zu, %zu, %d, 2] (a %s file's "
                           "projection of %zu x %zu)",
                           b->path, t->name, N / WF_PANEL, K / 2, WF_PANEL, WF_LAYOUT_PAIRS, K, N);
    b->params += sft_tensor_numel(t);
    b->bytes += t->nbytes;
    *dst = (op_w){t->data, NULL, OP_BF16, OP_PANEL_PAIRS, NULL, NULL};
    return ENG_OK;
}

/* Finds name with the given shape and binds *dst to its data as stored. */
static eng_status bind(binder *b, op_w *dst, const char *name, size_t ndim, size_t d0, size_t d1,
                       bind_kind kind)
{
    int q8 = kind != BIND_FLOAT;
    char full[160];
    snprintf(full, sizeof full, "%s%s", b->prefix, name);
    const sft_tensor *t = sft_find(b->f, full);
    if (t == NULL)
        return ERRBUF_FAIL(b->err, b->errlen, ENG_EFORMAT, "%s: missing tensor '%s'", b->path,
                           full);
    if (kind == BIND_PROJECTION && b->panel == WF_PAIRS) return bind_pairs(b, dst, t, d0, d1);
    int panel = kind == BIND_PROJECTION && b->panel;
    if (panel && d1 % WF_PANEL != 0)
        return ERRBUF_FAIL(b->err, b->errlen, ENG_EFORMAT,
                           "%s: tensor '%s': %zu columns cannot be panels of %d", b->path, full, d1,
                           WF_PANEL);
    size_t want[3] = {d0, d1, 0};
    if (panel) {
        want[0] = d1 / WF_PANEL;
        want[1] = d0;
        want[2] = WF_PANEL;
        ndim = 3;
    }
    int ok = t->ndim == ndim;
    for (size_t i = 0; ok && i < ndim; i++) ok = (size_t)t->shape[i] == want[i];
    if (!ok) {
        char got[96] = "[", exp[96] = "[";
        for (size_t i = 0; i < t->ndim && strlen(got) < 80; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "",
                     (long long)t->shape[i]);
        for (size_t i = 0; i < ndim; i++)
            snprintf(exp + strlen(exp), sizeof exp - strlen(exp), "%s%zu", i ? ", " : "", want[i]);
        return ERRBUF_FAIL(b->err, b->errlen, ENG_EFORMAT,
                           "%s: tensor '%s' has shape %s], expected %s]%s", b->path, full, got, exp,
                           panel ? " (a panel64 file)" : "");
    }
    if (t->dtype == SFT_I8 && q8) {
        b->params += sft_tensor_numel(t);
        b->bytes += t->nbytes;
        return bind_scales(b, dst, t, d0, d1, panel);
    }
    if (t->dtype != SFT_F32 && t->dtype != SFT_F16 && t->dtype != SFT_BF16)
        return ERRBUF_FAIL(b->err, b->errlen, ENG_EFORMAT,
                           "%s: tensor '%s' is %s; expected F32, F16 or BF16%s", b->path, full,
                           sft_dtype_name(t->dtype), q8 ? " (or I8 in a q8 file)" : "");
    b->params += sft_tensor_numel(t);
    b->bytes += t->nbytes;
    *dst = (op_w){t->data, NULL, op_dtype_of(t->dtype), panel, NULL, NULL};
    return ENG_OK;
}

static eng_status bind_all(binder *b, eng_model *m)
{
    const eng_config *c = &m->cfg;
    size_t C = c->n_embd;
    eng_status rc;
#define B(dst, name, ndim, d0, d1, kind)                                                           \
    do {                                                                                           \
        rc = bind(b, dst, name, ndim, d0, d1, kind);                                               \
        if (rc != ENG_OK) return rc;                                                               \
    } while (0)
    B(&m->wte, "wte.weight", 2, c->n_vocab, C, BIND_MAY_Q8);
    B(&m->wpe, "wpe.weight", 2, c->n_ctx, C, BIND_FLOAT);
    for (size_t i = 0; i < c->n_layer; i++) {
        gpt2_layer *L = &m->layers[i];
        char nm[96];
#define N(fmt) (snprintf(nm, sizeof nm, "h.%zu." fmt, i), nm)
        B(&L->ln1_g, N("ln_1.weight"), 1, C, 0, BIND_FLOAT);
        B(&L->ln1_b, N("ln_1.bias"), 1, C, 0, BIND_FLOAT);
        B(&L->attn_w, N("attn.c_attn.weight"), 2, C, 3 * C, BIND_PROJECTION);
        B(&L->attn_b, N("attn.c_attn.bias"), 1, 3 * C, 0, BIND_FLOAT);
        B(&L->proj_w, N("attn.c_proj.weight"), 2, C, C, BIND_PROJECTION);
        B(&L->proj_b, N("attn.c_proj.bias"), 1, C, 0, BIND_FLOAT);
        B(&L->ln2_g, N("ln_2.weight"), 1, C, 0, BIND_FLOAT);
        B(&L->ln2_b, N("ln_2.bias"), 1, C, 0, BIND_FLOAT);
        B(&L->fc_w, N("mlp.c_fc.weight"), 2, C, 4 * C, BIND_PROJECTION);
        B(&L->fc_b, N("mlp.c_fc.bias"), 1, 4 * C, 0, BIND_FLOAT);
        B(&L->fc2_w, N("mlp.c_proj.weight"), 2, 4 * C, C, BIND_PROJECTION);
        B(&L->fc2_b, N("mlp.c_proj.bias"), 1, C, 0, BIND_FLOAT);
#undef N
    }
    B(&m->lnf_g, "ln_f.weight", 1, C, 0, BIND_FLOAT);
    B(&m->lnf_b, "ln_f.bias", 1, C, 0, BIND_FLOAT);
#undef B
    return ENG_OK;
}

/* GPT2D_PANEL_COPY: "auto" (or unset) builds the panel copy of a Hugging
 * Face file's F32 and F16 projections where the panel kernels run, "off"
 * serves them from the file's pages (op_w_panels.c says what it costs).
 * Read at each load, so that a test can compare the two. */
static eng_status panel_copy_wanted(int *want, const char *path, char *err, size_t errlen)
{
    const char *v = getenv("GPT2D_PANEL_COPY");
    *want = v == NULL || v[0] == '\0' || strcmp(v, "auto") == 0;
    if (*want || strcmp(v, "off") == 0) return ENG_OK;
    return ERRBUF_FAIL(err, errlen, ENG_EINVAL,
                       "%s: GPT2D_PANEL_COPY must be auto or off, not '%.40s'", path, v);
}

/* The panel copy of every F32 or F16 projection of a Hugging Face file,
 * one mapping for all (op_w_panels.c says why and what it costs); the
 * file's pages for them are dropped from the process (drop_pages). */
/* Drops the pages of the file's [p, p + n) from the process, when drop
 * says they are the read-only file mapping's (nothing was copied out of a
 * misaligned file): MADV_DONTNEED there only unmaps them, they stay in the
 * page cache (reclaimable), and a read would fault them back in, so it is
 * advice, never a change of data. For a projection whose copy was just
 * built from it, so that the process holds the copy in place of the
 * file's pages rather than both. */
static void drop_pages(const void *p, size_t n, int drop)
{
    uintptr_t a = ((uintptr_t)p + 4095) / 4096 * 4096, e = ((uintptr_t)p + n) / 4096 * 4096;
    if (drop && e > a) (void)madvise((void *)a, e - a, MADV_DONTNEED); /* advice */
}

static size_t panel_copy_bytes(const projection *p, int want)
{
    /* A pairs64 projection without its pairs read in place has no kernel
     * but through its panel copy: built whatever GPT2D_PANEL_COPY says. */
    if (!want && p->w->panel != OP_PANEL_PAIRS) return 0;
    return op_w_panels_bytes(p->w, p->K, p->N);
}

static eng_status panels_build(eng_model *m, int want, int drop, const char *path, char *err,
                               size_t errlen)
{
    size_t total = 0;
    for (size_t i = 0; i < m->cfg.n_layer; i++) {
        projection p[4] = LAYER_PROJECTIONS(&m->layers[i], m->cfg.n_embd);
        for (size_t j = 0; j < 4; j++) total += panel_copy_bytes(&p[j], want);
    }
    if (total == 0) return ENG_OK;
    char *dst = op_copy_map(total);
    if (dst == NULL)
        return ERRBUF_FAIL(err, errlen, ENG_ENOMEM,
                           "%s: out of memory for the panel copy of the projections (%zu bytes; "
                           "GPT2D_PANEL_COPY=off serves from the file's pages)",
                           path, total);
    m->panels = dst;
    m->panel_bytes = total;
    for (size_t i = 0; i < m->cfg.n_layer; i++) {
        projection p[4] = LAYER_PROJECTIONS(&m->layers[i], m->cfg.n_embd);
        for (size_t j = 0; j < 4; j++) {
            size_t n = panel_copy_bytes(&p[j], want);
            if (n == 0) continue;
            const void *src = p[j].w->p;
            op_w_panels_write(p[j].w, dst, p[j].K, p[j].N);
            dst += n;
            drop_pages(src, n, drop);
        }
    }
    return ENG_OK;
}

/* A pairs64 projection at the "avx512-bf16" level: the kernels read its
 * pairs from the file's mapping, shared, when they are 64-byte aligned
 * (their aligned loads; `gpt2d convert` writes them so), else from a
 * private copy (counted in pair_bytes). Below that level it stays as
 * bound, for panels_build. */
static eng_status pairs_in_place(eng_model *m, op_w *w, size_t K, size_t N, const char *path,
                                 char *err, size_t errlen)
{
    if (!op_use_avx512bf16()) return ENG_OK;
    if ((uintptr_t)w->p % 64 == 0) {
        w->pairs = w->p;
        return ENG_OK;
    }
    size_t n = op_w_pairs_bytes(K, N); /* K * N * 2: K even, N a multiple of 64 */
    uint32_t *c = op_copy_map(n);
    if (c == NULL)
        return ERRBUF_FAIL(err, errlen, ENG_ENOMEM,
                           "%s: out of memory for a copy of misaligned pairs (%zu bytes)", path, n);
    memcpy(c, w->p, n);
    w->pairs = c;
    m->pair_bytes += n;
    return ENG_OK;
}

/* Reads n_head (and layer_norm_epsilon) from config.json when present,
 * and checks the dimensions it names against the weights'. */
static eng_status read_config(const char *dir, eng_config *c, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    hfc_config hc;
    if (hfc_read(path, &hc, err, errlen) != SFT_OK) return ENG_EFORMAT;
    if (!hc.present) return ENG_OK; /* optional */
    if (hc.n_head.kind != HFC_ABSENT) {
        if (hc.n_head.kind != HFC_INT || hc.n_head.i <= 0 || c->n_embd % (size_t)hc.n_head.i != 0)
            return ERRBUF_FAIL(err, errlen, ENG_EFORMAT,
                               "%s: n_head must be a positive divisor of the width %zu", path,
                               c->n_embd);
        c->n_head = (size_t)hc.n_head.i;
    }
    const hfc_value *eps = &hc.layer_norm_epsilon;
    if (eps->kind != HFC_ABSENT) {
        if ((eps->kind != HFC_INT && eps->kind != HFC_REAL) || eps->x <= 0 || eps->x > 1)
            return ERRBUF_FAIL(err, errlen, ENG_EFORMAT, "%s: bad layer_norm_epsilon", path);
        c->ln_eps = (float)eps->x;
    }
    static const char *const dims[] = {"n_layer", "n_embd", "vocab_size", "n_positions"};
    const hfc_value *got[] = {&hc.n_layer, &hc.n_embd, &hc.vocab_size, &hc.n_positions};
    const size_t have[] = {c->n_layer, c->n_embd, c->n_vocab, c->n_ctx};
    for (size_t i = 0; i < 4; i++)
        if (got[i]->kind != HFC_ABSENT && (got[i]->kind != HFC_INT || (size_t)got[i]->i != have[i]))
            return ERRBUF_FAIL(err, errlen, ENG_EFORMAT,
                               "%s: %s does not match the weights (which say %zu)", path, dims[i],
                               have[i]);
    return ENG_OK;
}

eng_status eng_model_load(const char *dir, eng_model **out, char *err, size_t errlen)
{
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    sft_file *f = NULL;
    char e[512];
    sft_status ss = sft_open(path, SFT_LOAD_MMAP, &f, e, sizeof e);
    if (ss != SFT_OK)
        return ERRBUF_FAIL(err, errlen,
                           ss == SFT_ENOMEM ? ENG_ENOMEM
                           : ss == SFT_EIO  ? ENG_EIO
                                            : ENG_EFORMAT,
                           "%s", e);
    eng_model *m = calloc(1, sizeof *m);
    eng_status rc = ENG_OK;
    if (m == NULL) {
        rc = ERRBUF_FAIL(err, errlen, ENG_ENOMEM, "out of memory");
        goto done;
    }
    binder b = {.f = f, .prefix = "", .path = path, .err = err, .errlen = errlen};
    if (sft_find(f, "wte.weight") == NULL && sft_find(f, "transformer.wte.weight") != NULL)
        b.prefix = "transformer.";
    /* The configuration, off the shapes. */
    char nm[96];
    snprintf(nm, sizeof nm, "%swte.weight", b.prefix);
    const sft_tensor *wte = sft_find(f, nm);
    snprintf(nm, sizeof nm, "%swpe.weight", b.prefix);
    const sft_tensor *wpe = sft_find(f, nm);
    if (wte == NULL || wte->ndim != 2 || wpe == NULL || wpe->ndim != 2) {
        rc = ERRBUF_FAIL(err, errlen, ENG_EFORMAT,
                         "%s: missing or misshapen %swte.weight / %swpe.weight", path, b.prefix,
                         b.prefix);
        goto done;
    }
    m->cfg.n_vocab = (size_t)wte->shape[0];
    m->cfg.n_embd = (size_t)wte->shape[1];
    m->cfg.n_ctx = (size_t)wpe->shape[0];
    m->cfg.ln_eps = 1e-5f;
    for (;;) {
        snprintf(nm, sizeof nm, "%sh.%zu.ln_1.weight", b.prefix, m->cfg.n_layer);
        if (sft_find(f, nm) == NULL) break;
        m->cfg.n_layer++;
    }
    if (m->cfg.n_layer == 0 || m->cfg.n_embd == 0 || m->cfg.n_vocab == 0 || m->cfg.n_ctx == 0) {
        rc = ERRBUF_FAIL(err, errlen, ENG_EFORMAT, "%s: no transformer blocks (h.0.ln_1.weight)",
                         path);
        goto done;
    }
    m->cfg.n_head = m->cfg.n_embd % 64 == 0 ? m->cfg.n_embd / 64 : 1;
    rc = read_config(dir, &m->cfg, err, errlen);
    if (rc != ENG_OK) goto done;
    m->layers = calloc(m->cfg.n_layer, sizeof *m->layers);
    if (m->layers == NULL) {
        rc = ERRBUF_FAIL(err, errlen, ENG_ENOMEM, "out of memory");
        goto done;
    }
    if (wf_detect(f, &m->dtype, e, sizeof e) != SFT_OK) {
        rc = ERRBUF_FAIL(err, errlen, ENG_EFORMAT, "%s", e);
        goto done;
    }
    /* wf_detect checked the layout and its shapes; the binder checks every
     * shape again, as the kernels index by them. */
    if (wf_layout(f, &b.panel, e, sizeof e) != SFT_OK) {
        rc = ERRBUF_FAIL(err, errlen, ENG_EFORMAT, "%s", e);
        goto done;
    }
    m->layout = b.panel == WF_PAIRS ? WF_LAYOUT_PAIRS : b.panel ? WF_LAYOUT_PANEL : "hf";
    /* The file's words are copied: the names die with f below. */
    wf_about about;
    if (wf_about_get(f, &about, e, sizeof e) != SFT_OK) {
        rc = ERRBUF_FAIL(err, errlen, ENG_EFORMAT, "%s", e);
        goto done;
    }
    snprintf(m->about.name, sizeof m->about.name, "%s", about.name ? about.name : "");
    snprintf(m->about.owned_by, sizeof m->about.owned_by, "%s",
             about.owned_by ? about.owned_by : "");
    snprintf(m->about.description, sizeof m->about.description, "%s",
             about.description ? about.description : "");
    m->about.weights = about.weights;
    rc = bind_all(&b, m);
    if (rc != ENG_OK) goto done;
    /* BF16 projections (and the LM head, below) at the "avx512-bf16"
     * level read a pair copy, Q8 ones at "avx512-vnni" a quad copy, built
     * here once (op_matmul_bf16.c and op_matmul_q8.c say why; each build
     * does nothing for the other formats); other formats and levels read
     * the file's pages. */
    for (size_t i = 0; i < m->cfg.n_layer; i++) {
        projection p[4] = LAYER_PROJECTIONS(&m->layers[i], m->cfg.n_embd);
        for (size_t j = 0; j < 4; j++) {
            if (p[j].w->panel == OP_PANEL_PAIRS) {
                rc = pairs_in_place(m, p[j].w, p[j].K, p[j].N, path, err, errlen);
                if (rc != ENG_OK) goto done;
                continue;
            }
            if (op_w_pairs_build(p[j].w, p[j].K, p[j].N) != 0) {
                rc = ERRBUF_FAIL(err, errlen, ENG_ENOMEM,
                                 "%s: out of memory for the BF16 pair copy of layer %zu's "
                                 "projections (%zu bytes; GPT2D_KERNELS=avx512 serves from the "
                                 "file's pages)",
                                 path, i, op_w_pairs_bytes(p[j].K, p[j].N));
                goto done;
            }
            if (p[j].w->pairs != NULL) {
                m->pair_bytes += op_w_pairs_bytes(p[j].K, p[j].N);
                drop_pages(p[j].w->p, p[j].K * p[j].N * 2, sft_copied_bytes(f) == 0);
            }
            if (op_w_quads_build(p[j].w, p[j].K, p[j].N) != 0) {
                rc = ERRBUF_FAIL(err, errlen, ENG_ENOMEM,
                                 "%s: out of memory for the Q8 quad copy of layer %zu's "
                                 "projections (%zu bytes; GPT2D_KERNELS=avx512 serves from the "
                                 "file's pages)",
                                 path, i, op_w_quads_bytes(p[j].K, p[j].N));
                goto done;
            }
            if (p[j].w->quads != NULL) {
                m->pair_bytes += op_w_quads_bytes(p[j].K, p[j].N);
                drop_pages(p[j].w->p, p[j].K * p[j].N, sft_copied_bytes(f) == 0);
            }
        }
    }
    /* And wte for the LM head, read as its transpose (C, V). */
    if (op_w_pairs_build_rows(&m->wte, m->cfg.n_vocab, m->cfg.n_embd) != 0) {
        rc = ERRBUF_FAIL(err, errlen, ENG_ENOMEM,
                         "%s: out of memory for the BF16 pair copy of wte (%zu bytes; "
                         "GPT2D_KERNELS=avx512 serves from the file's pages)",
                         path, op_w_pairs_bytes(m->cfg.n_embd, m->cfg.n_vocab));
        goto done;
    }
    if (m->wte.pairs != NULL) m->pair_bytes += op_w_pairs_bytes(m->cfg.n_embd, m->cfg.n_vocab);
    int panels;
    rc = panel_copy_wanted(&panels, path, err, errlen);
    if (rc == ENG_OK) rc = panels_build(m, panels, sft_copied_bytes(f) == 0, path, err, errlen);
    if (rc != ENG_OK) goto done;
    m->params = b.params;
    m->weight_bytes = b.bytes;
    m->copied = sft_copied_bytes(f);
    m->data = sft_data_ref(f);
done:
    sft_close(f);
    if (rc != ENG_OK) {
        eng_model_free(m);
        return rc;
    }
    *out = m;
    return ENG_OK;
}
