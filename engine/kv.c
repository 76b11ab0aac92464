/*
 * engine/kv.c: the paged KV cache. A pool of fixed-size blocks sized by a
 * memory budget, a free list, and per-sequence block tables. Reservation is
 * all or nothing, so a sequence that was admitted can never run out.
 *
 * The prefix cache: a full block whose KV are computed can be registered
 * under the chain hash of its tokens and of the block before it. A later
 * sequence whose prompt begins with the same tokens takes the registered
 * blocks (a reference each) instead of computing them. A hit compares the
 * tokens and the parent block itself, not only the hash, so a collision can
 * never make two different prefixes share a block. Every block belongs to
 * a partition, its sequence's salt (eng_request.cache_salt: one per tenant
 * in the server): the salt seeds the chain hash and a hit compares it too,
 * so one partition can neither take nor time another's blocks. Registered blocks are
 * never written: a sequence writes only at positions past its shared ones.
 * When the last holder lets go, a registered block stays cached on an LRU
 * list; it counts as free, and is evicted (leaves first) only when a fresh
 * block is needed and the free list is empty.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/*
 * The pool is anonymous memory that the kernel backs on first touch. With
 * 4 KiB pages every block a step enters for the first time costs hundreds
 * of page faults inside that step: 16 sequences of a GPT-2-small-shaped
 * model crossing into new 16-token blocks at once took the step from 48 to
 * ~100 ms on a 2-vCPU VM (docs/benchmarks-history.md, 2026-12-05). Transparent huge
 * pages where the kernel offers them on request (madvise mode, Debian's
 * default) cut the faults 512-fold; the pool is 2 MiB-aligned for them.
 * Blocks are handed out lowest id first, so touched memory is reused first.
 */
#define KV_POOL_ALIGN ((size_t)2 << 20)

static void *kv_pool_alloc(size_t bytes, size_t *mapped)
{
    size_t len = (bytes + KV_POOL_ALIGN - 1) / KV_POOL_ALIGN * KV_POOL_ALIGN;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, len, MADV_HUGEPAGE); /* a hint: without THP, 4 KiB pages */
#endif
    *mapped = len;
    return p;
}

size_t eng_model_kv_position_bytes(const eng_model *m)
{
    const eng_config *c = eng_model_config(m);
    return c->n_layer * 2 * c->n_embd * sizeof(float);
}

eng_status eng_kv_new(const eng_model *m, size_t budget_bytes, size_t block_len, eng_kv **out,
                      char *err, size_t errlen)
{
    *out = NULL;
    const eng_config *c = eng_model_config(m);
    if (block_len == 0 || block_len > 4096)
        return ERRBUF_FAIL(err, errlen, ENG_EINVAL, "KV block length %zu is not in 1..4096",
                           block_len);
    size_t per_block = block_len * eng_model_kv_position_bytes(m);
    size_t nblocks = budget_bytes / per_block;
    if (nblocks == 0 || nblocks > INT32_MAX / 2)
        return ERRBUF_FAIL(err, errlen, ENG_EINVAL,
                           "a KV budget of %zu bytes holds no block of %zu bytes", budget_bytes,
                           per_block);
    eng_kv *kv = calloc(1, sizeof *kv);
    if (kv == NULL) return ERRBUF_FAIL(err, errlen, ENG_ENOMEM, "out of memory");
    kv->block_len = block_len;
    kv->nblocks = nblocks;
    kv->L = c->n_layer;
    kv->NH = c->n_head;
    kv->HS = c->n_embd / c->n_head;
    kv->nbucket = 1;
    while (kv->nbucket < 2 * nblocks) kv->nbucket *= 2;
    kv->pool = kv_pool_alloc(per_block * nblocks, &kv->pool_bytes);
    kv->free_list = malloc(nblocks * sizeof *kv->free_list);
    kv->meta = malloc(nblocks * sizeof *kv->meta);
    kv->tokens = malloc(nblocks * block_len * sizeof *kv->tokens);
    kv->bucket = malloc(kv->nbucket * sizeof *kv->bucket);
    kv->lp = malloc(nblocks * block_len * sizeof *kv->lp);
    if (kv->pool == NULL || kv->free_list == NULL || kv->meta == NULL || kv->tokens == NULL
        || kv->bucket == NULL || kv->lp == NULL) {
        eng_kv_free(kv);
        return ERRBUF_FAIL(err, errlen, ENG_ENOMEM, "cannot allocate a KV pool of %zu bytes",
                           per_block * nblocks);
    }
    /* Lowest ids are handed out first. */
    for (size_t i = 0; i < nblocks; i++) {
        kv->free_list[i] = (int32_t)(nblocks - 1 - i);
        kv->meta[i] = (kv_block){.parent = -1, .hnext = -1, .prev = -1, .next = -1};
    }
    for (size_t i = 0; i < kv->nbucket; i++) kv->bucket[i] = -1;
    kv->nfree = nblocks;
    kv->lru_head = kv->lru_tail = -1;
    kv->hash_mask = UINT64_MAX;
    *out = kv;
    return ENG_OK;
}

void eng_kv_free(eng_kv *kv)
{
    if (kv == NULL) return;
    if (kv->pool != NULL) munmap(kv->pool, kv->pool_bytes);
    free(kv->free_list);
    free(kv->meta);
    free(kv->tokens);
    free(kv->bucket);
    free(kv->lp);
    free(kv);
}

size_t eng_kv_blocks_total(const eng_kv *kv)
{
    return kv->nblocks;
}
/* Cached blocks nobody holds count as free: they are evicted on demand. */
size_t eng_kv_blocks_free(const eng_kv *kv)
{
    return kv->nfree + kv->nlru;
}
size_t eng_kv_block_len(const eng_kv *kv)
{
    return kv->block_len;
}

/* ---- The LRU list of cached blocks ------------------------------------------ */

static void lru_remove(eng_kv *kv, int32_t b)
{
    kv_block *m = &kv->meta[b];
    if (m->prev >= 0)
        kv->meta[m->prev].next = m->next;
    else
        kv->lru_head = m->next;
    if (m->next >= 0)
        kv->meta[m->next].prev = m->prev;
    else
        kv->lru_tail = m->prev;
    m->prev = m->next = -1;
    kv->nlru--;
}

static void lru_append(eng_kv *kv, int32_t b)
{
    kv_block *m = &kv->meta[b];
    m->prev = kv->lru_tail;
    m->next = -1;
    if (kv->lru_tail >= 0)
        kv->meta[kv->lru_tail].next = b;
    else
        kv->lru_head = b;
    kv->lru_tail = b;
    kv->nlru++;
}

/* ---- Registration ------------------------------------------------------------ */

uint64_t kv_hash(const eng_kv *kv, uint64_t prev, const int32_t *tokens)
{
    /* FNV-1a over the tokens' bytes, seeded with the parent's hash, then a
     * splitmix64 finaliser; collisions are harmless (hits compare tokens). */
    uint64_t h = prev ^ UINT64_C(0xcbf29ce484222325);
    for (size_t i = 0; i < kv->block_len; i++) {
        uint32_t t = (uint32_t)tokens[i];
        for (int k = 0; k < 4; k++) {
            h ^= (t >> (8 * k)) & 0xffu;
            h *= UINT64_C(0x100000001b3);
        }
    }
    return gpt2_mix64(h) & kv->hash_mask;
}

uint64_t kv_hash_root(uint64_t salt, uint64_t lora)
{
    uint64_t h = salt == 0 ? KV_HASH_ROOT : gpt2_mix64(salt + KV_HASH_ROOT); /* nearby salts,
                                                                              * unrelated seeds */
    return lora == 0 ? h : gpt2_mix64(h ^ gpt2_mix64(lora));
}

/* The registered block of seq's partition (its salt and adapter) with
 * this hash, parent and tokens, or -1. A child's partition is its
 * parent's, so the comparison decides only for first blocks; it is as
 * cheap everywhere. */
static int32_t find(const eng_kv *kv, uint64_t hash, const eng_seq *seq, int32_t parent,
                    const int32_t *tokens)
{
    for (int32_t b = kv->bucket[hash & (kv->nbucket - 1)]; b >= 0; b = kv->meta[b].hnext) {
        const kv_block *m = &kv->meta[b];
        if (m->hash == hash && m->salt == seq->salt && m->lora == seq->lora && m->parent == parent
            && memcmp(kv->tokens + (size_t)b * kv->block_len, tokens,
                      kv->block_len * sizeof *tokens)
                   == 0)
            return b;
    }
    return -1;
}

static void register_block(eng_kv *kv, int32_t b, uint64_t hash, const eng_seq *seq, int32_t parent,
                           const int32_t *tokens)
{
    kv_block *m = &kv->meta[b];
    m->registered = 1;
    m->hash = hash;
    m->salt = seq->salt;
    m->lora = seq->lora;
    m->parent = parent;
    memcpy(kv->tokens + (size_t)b * kv->block_len, tokens, kv->block_len * sizeof *tokens);
    size_t at = hash & (kv->nbucket - 1);
    m->hnext = kv->bucket[at];
    kv->bucket[at] = b;
    if (parent >= 0) kv->meta[parent].nchild++;
    kv->nregistered++;
}

static void unregister_block(eng_kv *kv, int32_t b)
{
    kv_block *m = &kv->meta[b];
    int32_t *link = &kv->bucket[m->hash & (kv->nbucket - 1)];
    while (*link != b) link = &kv->meta[*link].hnext;
    *link = m->hnext;
    if (m->parent >= 0) kv->meta[m->parent].nchild--;
    m->registered = 0;
    m->has_lp = 0;
    m->hnext = m->parent = -1;
    kv->nregistered--;
}

/* A block for a sequence to write: a free one, or else the least recently
 * used cached block that no other cached block continues (a parent outlives
 * its children, so every reachable chain stays whole). The caller has
 * checked that nfree + nlru > 0. */
static int32_t take_fresh(eng_kv *kv)
{
    int32_t b;
    if (kv->nfree > 0) {
        b = kv->free_list[--kv->nfree];
    } else {
        /* A cached block's cached children are unheld (a holder of a child
         * holds its parent), so the list always has a leaf; it is nearly
         * always the head, since sequences release their last block first. */
        b = kv->lru_head;
        while (kv->meta[b].nchild > 0) b = kv->meta[b].next;
        lru_remove(kv, b);
        unregister_block(kv, b);
        kv->evictions++;
    }
    kv->meta[b].ref = 1;
    return b;
}

/* One more holder of block b. */
static void hold(eng_kv *kv, int32_t b)
{
    if (kv->meta[b].ref++ == 0) lru_remove(kv, b);
}

/* One holder fewer: the last one leaves it cached if registered. */
static void unhold(eng_kv *kv, int32_t b)
{
    if (--kv->meta[b].ref > 0) return;
    if (kv->meta[b].registered)
        lru_append(kv, b);
    else
        kv->free_list[kv->nfree++] = b;
}

/* ---- Sequences ------------------------------------------------------------------ */

eng_status eng_kv_reserve(eng_kv *kv, eng_seq *seq, size_t positions)
{
    size_t need = (positions + kv->block_len - 1) / kv->block_len;
    if (need <= seq->nblocks) return ENG_OK;
    size_t more = need - seq->nblocks;
    if (more > kv->nfree + kv->nlru) return ENG_ENOMEM;
    int32_t *grown = realloc(seq->blocks, need * sizeof *grown);
    if (grown == NULL) return ENG_ENOMEM;
    seq->blocks = grown;
    for (size_t i = 0; i < more; i++) seq->blocks[seq->nblocks++] = take_fresh(kv);
    seq->cap = seq->nblocks * kv->block_len;
    return ENG_OK;
}

void eng_kv_release(eng_kv *kv, eng_seq *seq)
{
    /* Last block first: a chain's leaves reach the LRU list before their
     * parents, so they are evicted first. */
    for (size_t i = seq->nblocks; i-- > 0;) unhold(kv, seq->blocks[i]);
    free(seq->blocks);
    memset(seq, 0, sizeof *seq);
}

eng_status kv_admit(eng_kv *kv, eng_seq *seq, const int32_t *tokens, const uint64_t *hashes,
                    size_t maxhit, size_t positions, kv_lp *lp, size_t *hit)
{
    size_t bl = kv->block_len, need = (positions + bl - 1) / bl;
    if (maxhit > need) maxhit = need;
    int32_t *grown = realloc(seq->blocks, (need ? need : 1) * sizeof *grown);
    if (grown == NULL) return ENG_ENOMEM;
    seq->blocks = grown;
    /* The hit, into the table (not yet held), and how many of its blocks
     * are on the LRU list: taking those leaves fewer to evict. */
    size_t h = 0, from_lru = 0;
    int32_t lp_next = -1; /* echo: the block after the hit, for its first position */
    for (int32_t parent = -1; h < maxhit; h++) {
        int32_t b = find(kv, hashes[h], seq, parent, tokens + h * bl);
        if (b < 0 || (lp != NULL && !kv->meta[b].has_lp)) break;
        seq->blocks[h] = b;
        from_lru += kv->meta[b].ref == 0;
        parent = b;
    }
    if (lp != NULL && h > 0) {
        lp_next = seq->blocks[--h];
        from_lru -= kv->meta[lp_next].ref == 0;
    }
    if (need - h > kv->nfree + kv->nlru - from_lru) return ENG_ENOMEM;
    if (lp_next >= 0) { /* before fresh blocks may evict lp_next */
        for (size_t i = 0; i < h; i++)
            memcpy(lp + i * bl, kv->lp + (size_t)seq->blocks[i] * bl, bl * sizeof *lp);
        lp[h * bl] = kv->lp[(size_t)lp_next * bl];
    }
    for (size_t i = 0; i < h; i++) hold(kv, seq->blocks[i]);
    for (size_t i = h; i < need; i++) seq->blocks[i] = take_fresh(kv);
    seq->nblocks = need;
    seq->cap = need * bl;
    seq->len = h * bl;
    *hit = h;
    return ENG_OK;
}

size_t kv_extend(eng_kv *kv, eng_seq *seq, const int32_t *tokens, const uint64_t *hashes,
                 size_t maxhit, kv_lp *lp)
{
    size_t bl = kv->block_len, gained = 0;
    while (seq->len % bl == 0) {
        size_t i = seq->len / bl;
        if (i >= maxhit || i >= seq->nblocks) break;
        int32_t b = find(kv, hashes[i], seq, i > 0 ? seq->blocks[i - 1] : -1, tokens + i * bl);
        if (b < 0) break;
        if (lp != NULL) { /* echo: block i's logprobs, and the next block's first */
            int32_t next = i + 1 < maxhit && kv->meta[b].has_lp
                               ? find(kv, hashes[i + 1], seq, b, tokens + (i + 1) * bl)
                               : -1;
            if (next < 0 || !kv->meta[next].has_lp) break;
            memcpy(lp + i * bl, kv->lp + (size_t)b * bl, bl * sizeof *lp);
            lp[(i + 1) * bl] = kv->lp[(size_t)next * bl];
        }
        /* Hold the cached block before letting go of the unwritten one, so
         * the free list never has to give up a block mid-swap. */
        hold(kv, b);
        unhold(kv, seq->blocks[i]);
        seq->blocks[i] = b;
        seq->len += bl;
        gained++;
    }
    return gained;
}

/* Block b keeps the prompt logprobs of its positions from lp (one block's). */
static void keep_lp(eng_kv *kv, int32_t b, const kv_lp *lp)
{
    memcpy(kv->lp + (size_t)b * kv->block_len, lp, kv->block_len * sizeof *lp);
    kv->meta[b].has_lp = 1;
}

void kv_commit(eng_kv *kv, eng_seq *seq, const int32_t *tokens, size_t *nhashed, uint64_t *hash,
               const kv_lp *lp, size_t nlp)
{
    size_t bl = kv->block_len;
    for (size_t i = *nhashed; (i + 1) * bl <= seq->len; i++) {
        const int32_t *t = tokens + i * bl;
        uint64_t h = kv_hash(kv, i > 0 ? *hash : kv_hash_root(seq->salt, seq->lora), t);
        int32_t parent = i > 0 ? seq->blocks[i - 1] : -1;
        int32_t same = find(kv, h, seq, parent, t);
        if (same >= 0) {
            /* Computed twice at once (two sequences prefilled it in the
             * same steps): keep one copy, the same bits. */
            hold(kv, same);
            unhold(kv, seq->blocks[i]);
            seq->blocks[i] = same;
        } else {
            register_block(kv, seq->blocks[i], h, seq, parent, t);
        }
        /* The same logprobs whoever computed them: the first to have them
         * leaves them. */
        if (lp != NULL && (i + 1) * bl <= nlp && !kv->meta[seq->blocks[i]].has_lp)
            keep_lp(kv, seq->blocks[i], lp + i * bl);
        *hash = h;
        *nhashed = i + 1;
    }
}
