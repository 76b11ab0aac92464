/*
 * engine/adapter.c: a LoRA adapter as the forward pass reads it
 * (eng_adapter): for each layer and projection its A (r, in) and B^T
 * (r, out) in one slab, F32 or BF16, its scaling, and a key for the prefix
 * cache. Reference counted: the caller's reference and one per sequence
 * that uses it (eng_sched_submit to the sequence's end), so an adapter
 * that is unloaded while sequences run stays until the last one ends.
 */
#include "internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static size_t dt_size(op_dtype dt)
{
    return dt == OP_F32 ? 4 : 2;
}

/* F32 to BF16, rounded to nearest even (lora_read has refused NaN). */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* An F32 value as stored. */
static void put(void *slab, size_t i, op_dtype dt, float v)
{
    if (dt == OP_BF16)
        ((uint16_t *)slab)[i] = to_bf16(v);
    else if (dt == OP_F16)
        ((uint16_t *)slab)[i] = sft_f32_to_f16(v); /* exact: v was an F16's */
    else
        ((float *)slab)[i] = v;
}

/* The key: a hash of everything that changes the arithmetic (shape, rank,
 * scaling, dtype and every stored bit), never 0 (0 is the base model's).
 * Two loads of one adapter share cached blocks, as they compute the same
 * bits; two different adapters would share a block only if their 64-bit
 * keys collided and then only when its tokens and parents match too. */
static uint64_t adapter_key(const eng_adapter *a)
{
    uint64_t h = gpt2_mix64(a->n_layer * 0x9e3779b97f4a7c15u ^ a->n_embd);
    uint32_t sbits;
    memcpy(&sbits, &a->scaling, sizeof sbits);
    h = gpt2_mix64(h ^ a->rank ^ ((uint64_t)sbits << 32) ^ ((uint64_t)a->dt << 20));
    const unsigned char *p = a->slab;
    size_t i = 0;
    for (; i + 8 <= a->bytes; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        h = gpt2_mix64(h ^ v) + i;
    }
    for (; i < a->bytes; i++) h = gpt2_mix64(h ^ p[i]);
    return h != 0 ? h : 1;
}

eng_status eng_adapter_new(const eng_model *m, const lora_adapter *la, eng_adapter_dtype dtype,
                           eng_adapter **out, char *err, size_t errlen)
{
    *out = NULL;
    const eng_config *c = &m->cfg;
    if (dtype != ENG_ADAPTER_F32 && dtype != ENG_ADAPTER_BF16)
        return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "unknown adapter dtype %d", (int)dtype);
    if (la->n_layer != c->n_layer || la->n_embd != c->n_embd)
        return ERRBUF_FAIL(err, errlen, ENG_EFORMAT,
                           "%s: the adapter is for %zu layers of width %zu; the model has %zu of "
                           "width %zu",
                           la->dir ? la->dir : "adapter", la->n_layer, la->n_embd, c->n_layer,
                           c->n_embd);
    if (la->rank == 0 || la->rank > LORA_MAX_RANK)
        return ERRBUF_FAIL(err, errlen, ENG_EFORMAT, "rank %zu is out of 1..%d", la->rank,
                           LORA_MAX_RANK);
    /* F32 asked of a file whose factors are all F16 or all BF16 keeps them
     * in their 16 bits: the same values, widened exactly in the kernels,
     * so the same bits as F32 in half the memory (a resident adapter is
     * held to 1.1x its file's tensors, issue 36). */
    op_dtype dt = OP_F32;
    if (dtype == ENG_ADAPTER_BF16 || (!la->mixed_dtype && la->dtype == SFT_BF16))
        dt = OP_BF16;
    else if (!la->mixed_dtype && la->dtype == SFT_F16)
        dt = OP_F16;
    size_t r = la->rank, L = c->n_layer, elems = 0;
    for (size_t l = 0; l < L; l++)
        for (int mo = 0; mo < LORA_NMODULES; mo++) {
            const lora_pair *p = lora_pair_at(la, l, (lora_module)mo);
            if (p->a != NULL) elems += r * (p->in + p->out);
        }
    eng_adapter *a = calloc(1, sizeof *a);
    if (a == NULL) return ERRBUF_FAIL(err, errlen, ENG_ENOMEM, "out of memory");
    a->pairs = calloc(L * LORA_NMODULES, sizeof *a->pairs);
    a->bytes = elems * dt_size(dt);
    a->slab = a->bytes ? aligned_alloc(64, (a->bytes + 63) / 64 * 64) : NULL;
    if (a->pairs == NULL || (a->bytes && a->slab == NULL)) {
        free(a->pairs);
        free(a);
        return ERRBUF_FAIL(err, errlen, ENG_ENOMEM, "out of memory (%zu bytes of adapter)",
                           elems * dt_size(dt));
    }
    atomic_init(&a->refs, 1);
    a->n_layer = L;
    a->n_embd = c->n_embd;
    a->rank = r;
    a->scaling = la->scaling;
    a->dt = dt;
    size_t at = 0;
    for (size_t l = 0; l < L; l++)
        for (int mo = 0; mo < LORA_NMODULES; mo++) {
            const lora_pair *p = lora_pair_at(la, l, (lora_module)mo);
            eng_adapter_pair *q = &a->pairs[l * LORA_NMODULES + (size_t)mo];
            if (p->a == NULL) continue;
            /* A as it is, (r, in); B (out, r) transposed to (r, out), so
             * that a column block of the product reads r runs. */
            q->a = (op_w){(char *)a->slab + at * dt_size(dt), NULL, dt, 0, NULL, NULL};
            for (size_t i = 0; i < r * p->in; i++) put(a->slab, at + i, dt, p->a[i]);
            at += r * p->in;
            q->bt = (op_w){(char *)a->slab + at * dt_size(dt), NULL, dt, 0, NULL, NULL};
            for (size_t k = 0; k < r; k++)
                for (size_t o = 0; o < p->out; o++)
                    put(a->slab, at + k * p->out + o, dt, p->b[o * r + k]);
            at += r * p->out;
            q->in = p->in;
            q->out = p->out;
        }
    a->key = adapter_key(a);
    *out = a;
    return ENG_OK;
}

eng_status eng_adapter_load(const eng_model *m, const char *path, eng_adapter_dtype dtype,
                            eng_adapter **out, char *err, size_t errlen)
{
    *out = NULL;
    lora_adapter *la = NULL;
    const eng_config *c = &m->cfg;
    sft_status ss = lora_read(path, c->n_layer, c->n_embd, &la, err, errlen);
    if (ss != SFT_OK) return ss == SFT_ENOMEM ? ENG_ENOMEM : ss == SFT_EIO ? ENG_EIO : ENG_EFORMAT;
    eng_status rc = eng_adapter_new(m, la, dtype, out, err, errlen);
    lora_free(la);
    return rc;
}

eng_adapter *eng_adapter_ref(eng_adapter *a)
{
    if (a != NULL) atomic_fetch_add_explicit(&a->refs, 1, memory_order_relaxed);
    return a;
}

void eng_adapter_free(eng_adapter *a)
{
    if (a == NULL) return;
    if (atomic_fetch_sub_explicit(&a->refs, 1, memory_order_acq_rel) != 1) return;
    free(a->slab);
    free(a->pairs);
    free(a);
}

size_t eng_adapter_rank(const eng_adapter *a)
{
    return a->rank;
}

float eng_adapter_scaling(const eng_adapter *a)
{
    return a->scaling;
}

size_t eng_adapter_bytes(const eng_adapter *a)
{
    return a->bytes;
}

uint64_t eng_adapter_key(const eng_adapter *a)
{
    return a->key;
}

size_t eng_adapter_users(const eng_adapter *a)
{
    return atomic_load_explicit(&a->refs, memory_order_relaxed) - 1;
}
