/*
 * engine/kv.c: the paged KV cache. A pool of fixed-size blocks sized by a
 * memory budget, a free list, and per-sequence block tables. Reservation is
 * all or nothing, so a sequence that was admitted can never run out.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

eng_status eng_kv_new(const eng_model *m, size_t budget_bytes, size_t block_len, eng_kv **out,
                      char *err, size_t errlen)
{
    *out = NULL;
    const eng_config *c = eng_model_config(m);
    if (block_len == 0 || block_len > 4096)
        return gpt2_fail(err, errlen, ENG_EINVAL, "KV block length %zu is not in 1..4096",
                         block_len);
    size_t per_block = c->n_layer * 2 * block_len * c->n_embd * sizeof(float);
    size_t nblocks = budget_bytes / per_block;
    if (nblocks == 0 || nblocks > INT32_MAX)
        return gpt2_fail(err, errlen, ENG_EINVAL,
                         "a KV budget of %zu bytes holds no block of %zu bytes", budget_bytes,
                         per_block);
    eng_kv *kv = calloc(1, sizeof *kv);
    if (kv == NULL) return gpt2_fail(err, errlen, ENG_ENOMEM, "out of memory");
    kv->block_len = block_len;
    kv->nblocks = nblocks;
    kv->L = c->n_layer;
    kv->NH = c->n_head;
    kv->HS = c->n_embd / c->n_head;
    kv->pool = aligned_alloc(64, (per_block * nblocks + 63) / 64 * 64);
    kv->free_list = malloc(nblocks * sizeof *kv->free_list);
    if (kv->pool == NULL || kv->free_list == NULL) {
        eng_kv_free(kv);
        return gpt2_fail(err, errlen, ENG_ENOMEM, "cannot allocate a KV pool of %zu bytes",
                         per_block * nblocks);
    }
    /* Lowest ids are handed out first. */
    for (size_t i = 0; i < nblocks; i++) kv->free_list[i] = (int32_t)(nblocks - 1 - i);
    kv->nfree = nblocks;
    *out = kv;
    return ENG_OK;
}

void eng_kv_free(eng_kv *kv)
{
    if (kv == NULL) return;
    free(kv->pool);
    free(kv->free_list);
    free(kv);
}

size_t eng_kv_blocks_total(const eng_kv *kv)
{
    return kv->nblocks;
}
size_t eng_kv_blocks_free(const eng_kv *kv)
{
    return kv->nfree;
}
size_t eng_kv_block_len(const eng_kv *kv)
{
    return kv->block_len;
}

eng_status eng_kv_reserve(eng_kv *kv, eng_seq *seq, size_t positions)
{
    size_t need = (positions + kv->block_len - 1) / kv->block_len;
    if (need <= seq->nblocks) return ENG_OK;
    size_t more = need - seq->nblocks;
    if (more > kv->nfree) return ENG_ENOMEM;
    int32_t *grown = realloc(seq->blocks, need * sizeof *grown);
    if (grown == NULL) return ENG_ENOMEM;
    seq->blocks = grown;
    for (size_t i = 0; i < more; i++) seq->blocks[seq->nblocks++] = kv->free_list[--kv->nfree];
    seq->cap = seq->nblocks * kv->block_len;
    return ENG_OK;
}

void eng_kv_release(eng_kv *kv, eng_seq *seq)
{
    for (size_t i = seq->nblocks; i-- > 0;) kv->free_list[kv->nfree++] = seq->blocks[i];
    free(seq->blocks);
    memset(seq, 0, sizeof *seq);
}
