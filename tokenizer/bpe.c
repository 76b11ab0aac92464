/*
 * tokenizer/bpe.c: loading vocab.json and merges.txt, encoding, decoding.
 *
 * Everything works on token ids, never on strings: a piece starts as the ids
 * of its single bytes and merges pairs of ids, looked up in one open-
 * addressing table keyed by (left id, right id) that gives the merge's rank
 * and the merged id. Nothing is allocated per merge.
 *
 * Merge order is tiktoken's: repeatedly merge the adjacent pair of lowest
 * rank, the leftmost one on ties. (With GPT-2's files this is also what the
 * reference Python implementation computes by merging every occurrence of
 * the lowest-rank pair in one pass, because a merge only ever uses tokens
 * made by earlier merges.) As in tiktoken, a piece that is itself a token is
 * that token without running the merges. Short pieces use a quadratic scan
 * over a small array; long ones (a 10,000-byte run of letters) a binary heap
 * of candidate pairs with lazy deletion, O(n log n).
 */
#include "errbuf.h"
#include "internal.h"
#include "tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Pieces up to this many bytes use the quadratic merge. */
#define SMALL_PIECE 48

typedef struct {
    uint64_t key; /* (left << 32) | right; 0 = empty (id pairs are never 0,0+1) */
    uint32_t rank;
    int32_t id;
} pair_slot;

typedef struct {
    uint32_t off, len; /* into tok_bytes */
    int32_t id;        /* -1 = empty slot */
} str_slot;

struct bpe {
    size_t vocab_size; /* max id + 1 */
    uint32_t *tok_off; /* [vocab_size + 1]: bytes of id i are tok_bytes[off[i], off[i+1]) */
    unsigned char *present;
    char *tok_bytes;
    int32_t byte_id[256]; /* the token of each single byte, -1 if none */
    pair_slot *pairs;
    size_t pair_mask;
    size_t nmerges;
    str_slot *strs; /* bytes -> id */
    size_t str_mask;
};

const char *bpe_strerror(bpe_status s)
{
    switch (s) {
    case BPE_OK: return "ok";
    case BPE_EIO: return "I/O error";
    case BPE_EFORMAT: return "format error";
    case BPE_ENOMEM: return "out of memory";
    case BPE_EUNKNOWN: return "unknown token";
    case BPE_ETOOBIG: return "too big";
    }
    return "unknown status";
}

/* ---- Hashing ------------------------------------------------------------ */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(const unsigned char *p, size_t n)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ull;
    return mix64(h ^ n);
}

static size_t pow2_at_least(size_t n)
{
    size_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

static uint64_t pair_key(int32_t left, int32_t right)
{
    /* +1 keeps the key of pair (0, 0) from being the empty marker 0. */
    return ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
}

static const pair_slot *pair_find(const bpe *t, int32_t left, int32_t right)
{
    uint64_t key = pair_key(left, right);
    size_t i = (size_t)mix64(key) & t->pair_mask;
    for (;;) {
        const pair_slot *s = &t->pairs[i];
        if (s->key == key) return s;
        if (s->key == 0) return NULL;
        i = (i + 1) & t->pair_mask;
    }
}

static int32_t str_find(const bpe *t, const unsigned char *p, size_t n)
{
    size_t i = (size_t)hash_bytes(p, n) & t->str_mask;
    for (;;) {
        const str_slot *s = &t->strs[i];
        if (s->id < 0) return -1;
        if (s->len == n && memcmp(t->tok_bytes + s->off, p, n) == 0) return s->id;
        i = (i + 1) & t->str_mask;
    }
}

/* ---- The byte-to-unicode mapping ----------------------------------------- */

/*
 * GPT-2 writes every byte as a printable character: the 188 printable bytes
 * (21-7E, A1-AC, AE-FF) as themselves, the other 68, in byte order, as
 * U+0100, U+0101, ... U+0143. symbol_byte() is the inverse: the byte of a
 * symbol code point, or -1.
 */
static int printable_byte(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static void build_symbol_table(int16_t table[0x144])
{
    for (unsigned i = 0; i < 0x144; i++) table[i] = -1;
    unsigned next = 0x100;
    for (unsigned b = 0; b < 256; b++) {
        if (printable_byte(b))
            table[b] = (int16_t)b;
        else
            table[next++] = (int16_t)b;
    }
}

/* Decodes a token written in symbols into bytes (out holds >= n bytes);
 * returns the byte count, or -1 if a character is not a byte symbol. */
static long symbols_to_bytes(const int16_t table[0x144], const char *s, size_t n,
                             unsigned char *out)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        size_t len = utf8_decode_one(p + i, n - i, &cp);
        if (cp == UTF8_INVALID || cp >= 0x144 || table[cp] < 0) return -1;
        out[o++] = (unsigned char)table[cp];
        i += len;
    }
    return (long)o;
}

/* ---- Loading ------------------------------------------------------------ */

static bpe_status read_file(const char *path, char **out, size_t *len, char *err, size_t errlen)
{
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (fp == NULL)
        return ERRBUF_FAIL(err, errlen, BPE_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(fp);
        return ERRBUF_FAIL(err, errlen, BPE_EIO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > BPE_MAX_FILE) {
        fclose(fp);
        return ERRBUF_FAIL(err, errlen, BPE_ETOOBIG, "%s: %lld bytes is over the limit of %u", path,
                           (long long)st.st_size, BPE_MAX_FILE);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (buf == NULL) {
        fclose(fp);
        return ERRBUF_FAIL(err, errlen, BPE_ENOMEM, "%s: out of memory", path);
    }
    size_t got = fread(buf, 1, n, fp);
    fclose(fp);
    if (got != n) {
        free(buf);
        return ERRBUF_FAIL(err, errlen, BPE_EIO, "%s: short read", path);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return BPE_OK;
}

void bpe_free(bpe *t)
{
    if (t == NULL) return;
    free(t->tok_off);
    free(t->present);
    free(t->tok_bytes);
    free(t->pairs);
    free(t->strs);
    free(t);
}

static bpe_status load_vocab(bpe *t, const char *path, const int16_t sym[0x144], char *err,
                             size_t errlen)
{
    char *text;
    size_t len;
    bpe_status rc = read_file(path, &text, &len, err, errlen);
    if (rc != BPE_OK) return rc;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    int32_t *ids = NULL;
    unsigned char *bytes = NULL;
    uint32_t *offs = NULL;
    if (root == NULL) {
        rc = ERRBUF_FAIL(err, errlen, BPE_EFORMAT, "%s: not valid JSON: %s (line %d)", path,
                         jerr.text, jerr.line);
        goto done;
    }
    if (!json_is_object(root)) {
        rc = ERRBUF_FAIL(err, errlen, BPE_EFORMAT, "%s: not a JSON object", path);
        goto done;
    }
    size_t n = json_object_size(root);
    if (n == 0) {
        rc = ERRBUF_FAIL(err, errlen, BPE_EFORMAT, "%s: the vocabulary is empty", path);
        goto done;
    }
    /* Pass 1: ids, and the total byte count (a token's bytes are at most its
     * symbol text's length). */
    ids = malloc(n * sizeof *ids);
    offs = malloc((n + 1) * sizeof *offs);
    size_t total = 0, k = 0, max_id = 0;
    const char *key;
    json_t *val;
    if (ids == NULL || offs == NULL) goto nomem;
    json_object_foreach(root, key, val)
    {
        if (!json_is_integer(val) || json_integer_value(val) < 0) {
            rc = ERRBUF_FAIL(err, errlen, BPE_EFORMAT,
                             "%s: the id of token \"%s\" is not a non-negative integer", path, key);
            goto done;
        }
        if (json_integer_value(val) > BPE_MAX_ID) {
            rc = ERRBUF_FAIL(err, errlen, BPE_ETOOBIG, "%s: the id %lld of token \"%s\" is over %d",
                             path, (long long)json_integer_value(val), key, BPE_MAX_ID);
            goto done;
        }
        ids[k] = (int32_t)json_integer_value(val);
        if ((size_t)ids[k] > max_id) max_id = (size_t)ids[k];
        total += strlen(key);
        k++;
    }
    if (total > UINT32_MAX) {
        rc = ERRBUF_FAIL(err, errlen, BPE_ETOOBIG, "%s: too many token bytes", path);
        goto done;
    }
    t->vocab_size = max_id + 1;
    bytes = malloc(total ? total : 1);
    t->tok_off = calloc(t->vocab_size + 1, sizeof *t->tok_off);
    t->present = calloc(t->vocab_size, 1);
    t->str_mask = pow2_at_least(2 * n) - 1;
    t->strs = malloc((t->str_mask + 1) * sizeof *t->strs);
    if (bytes == NULL || t->tok_off == NULL || t->present == NULL || t->strs == NULL) goto nomem;
    for (size_t i = 0; i <= t->str_mask; i++) t->strs[i].id = -1;

    /* Pass 2: each token's bytes, in key order, then placed by id. */
    size_t used = 0;
    k = 0;
    json_object_foreach(root, key, val)
    {
        int32_t id = ids[k++];
        if (t->present[id]) {
            rc = ERRBUF_FAIL(err, errlen, BPE_EFORMAT,
                             "%s: id %d is used by two tokens (one is \"%s\")", path, id, key);
            goto done;
        }
        long nb = symbols_to_bytes(sym, key, strlen(key), bytes + used);
        if (nb <= 0) {
            rc = ERRBUF_FAIL(
                err, errlen, BPE_EFORMAT,
                "%s: token \"%s\" (id %d) is empty or has a character outside the 256 byte symbols",
                path, key, id);
            goto done;
        }
        t->present[id] = 1;
        offs[k - 1] = (uint32_t)used;
        used += (size_t)nb;
        offs[k] = (uint32_t)used; /* end of this token, provisional */
    }
    /* Lay the bytes out by id so that decoding is one offset lookup. */
    t->tok_bytes = malloc(used ? used : 1);
    if (t->tok_bytes == NULL) goto nomem;
    {
        /* Sizes by id, prefix sums, copy. */
        uint32_t *size_of = t->tok_off; /* reuse: size at [id + 1] */
        for (size_t i = 0; i < n; i++) size_of[ids[i] + 1] = offs[i + 1] - offs[i];
        for (size_t i = 1; i <= t->vocab_size; i++) t->tok_off[i] += t->tok_off[i - 1];
        for (size_t i = 0; i < n; i++) {
            memcpy(t->tok_bytes + t->tok_off[ids[i]], bytes + offs[i], offs[i + 1] - offs[i]);
        }
    }
    /* Two tokens cannot have the same bytes (the mapping is a bijection and
     * JSON keys are unique), so the byte table needs no duplicate check. */
    for (size_t id = 0; id < t->vocab_size; id++) {
        if (!t->present[id]) continue;
        uint32_t off = t->tok_off[id], nb = t->tok_off[id + 1] - off;
        size_t i = (size_t)hash_bytes((unsigned char *)t->tok_bytes + off, nb) & t->str_mask;
        while (t->strs[i].id >= 0) i = (i + 1) & t->str_mask;
        t->strs[i] = (str_slot){.off = off, .len = nb, .id = (int32_t)id};
    }
    for (unsigned b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        t->byte_id[b] = str_find(t, &c, 1);
    }
    rc = BPE_OK;
    goto done;
nomem:
    rc = ERRBUF_FAIL(err, errlen, BPE_ENOMEM, "%s: out of memory", path);
done:
    json_decref(root);
    free(ids);
    free(offs);
    free(bytes);
    return rc;
}

static bpe_status load_merges(bpe *t, const char *path, const int16_t sym[0x144], char *err,
                              size_t errlen)
{
    char *text;
    size_t len;
    bpe_status rc = read_file(path, &text, &len, err, errlen);
    if (rc != BPE_OK) return rc;
    /* Every line is a merge, so the line count bounds the table. */
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    t->pair_mask = pow2_at_least(2 * lines) - 1;
    t->pairs = calloc(t->pair_mask + 1, sizeof *t->pairs);
    unsigned char *buf = malloc(len + 1);
    if (t->pairs == NULL || buf == NULL) {
        rc = ERRBUF_FAIL(err, errlen, BPE_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    size_t pos = 0, lineno = 0;
    while (pos < len) {
        size_t end = pos;
        while (end < len && text[end] != '\n') end++;
        size_t next = end + 1;
        lineno++;
        if (end > pos && text[end - 1] == '\r') end--;
        const char *line = text + pos;
        size_t n = end - pos;
        pos = next;
        if (n == 0 || (n >= 8 && memcmp(line, "#version", 8) == 0)) continue;
        const char *space = memchr(line, ' ', n);
        if (space == NULL || space == line || space == line + n - 1
            || memchr(space + 1, ' ', (size_t)(line + n - space - 1)) != NULL) {
            rc = ERRBUF_FAIL(err, errlen, BPE_EFORMAT, "%s:%zu: \"%.*s\" is not two symbols", path,
                             lineno, (int)(n > 80 ? 80 : n), line);
            goto done;
        }
        size_t nl = (size_t)(space - line), nr = n - nl - 1;
        long bl = symbols_to_bytes(sym, line, nl, buf);
        long br = bl < 0 ? -1 : symbols_to_bytes(sym, space + 1, nr, buf + bl);
        if (bl < 0 || br < 0) {
            rc = ERRBUF_FAIL(err, errlen, BPE_EFORMAT,
                             "%s:%zu: \"%.*s\" has a character outside the 256 byte symbols", path,
                             lineno, (int)(n > 80 ? 80 : n), line);
            goto done;
        }
        int32_t left = str_find(t, buf, (size_t)bl);
        int32_t right = str_find(t, buf + bl, (size_t)br);
        int32_t merged = str_find(t, buf, (size_t)(bl + br));
        if (left < 0 || right < 0 || merged < 0) {
            rc = ERRBUF_FAIL(err, errlen, BPE_EFORMAT,
                             "%s:%zu: the %s of \"%.*s\" is not in the vocabulary", path, lineno,
                             left < 0    ? "left part"
                             : right < 0 ? "right part"
                                         : "result",
                             (int)(n > 80 ? 80 : n), line);
            goto done;
        }
        uint64_t key = pair_key(left, right);
        size_t i = (size_t)mix64(key) & t->pair_mask;
        while (t->pairs[i].key != 0 && t->pairs[i].key != key) i = (i + 1) & t->pair_mask;
        if (t->pairs[i].key == key) {
            rc = ERRBUF_FAIL(err, errlen, BPE_EFORMAT,
                             "%s:%zu: \"%.*s\" repeats the merge of rank %u", path, lineno,
                             (int)(n > 80 ? 80 : n), line, t->pairs[i].rank);
            goto done;
        }
        t->pairs[i] = (pair_slot){.key = key, .rank = (uint32_t)t->nmerges, .id = merged};
        t->nmerges++;
    }
    rc = BPE_OK;
done:
    free(buf);
    free(text);
    return rc;
}

bpe_status bpe_load(const char *vocab_path, const char *merges_path, bpe **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    if (err != NULL && errlen > 0) err[0] = '\0';
    bpe *t = calloc(1, sizeof *t);
    if (t == NULL) return ERRBUF_FAIL(err, errlen, BPE_ENOMEM, "out of memory");
    int16_t sym[0x144];
    build_symbol_table(sym);
    bpe_status rc = load_vocab(t, vocab_path, sym, err, errlen);
    if (rc == BPE_OK) rc = load_merges(t, merges_path, sym, err, errlen);
    if (rc != BPE_OK) {
        bpe_free(t);
        return rc;
    }
    *out = t;
    return BPE_OK;
}

bpe_status bpe_load_dir(const char *dir, bpe **out, char *err, size_t errlen)
{
    size_t n = strlen(dir) + sizeof "/vocab.json";
    char *v = malloc(n), *m = malloc(n);
    bpe_status rc;
    if (v == NULL || m == NULL) {
        *out = NULL;
        rc = ERRBUF_FAIL(err, errlen, BPE_ENOMEM, "out of memory");
    } else {
        snprintf(v, n, "%s/vocab.json", dir);
        snprintf(m, n, "%s/merges.txt", dir);
        rc = bpe_load(v, m, out, err, errlen);
    }
    free(v);
    free(m);
    return rc;
}

size_t bpe_vocab_size(const bpe *t)
{
    return t->vocab_size;
}
size_t bpe_merge_count(const bpe *t)
{
    return t->nmerges;
}

/* ---- Encoding ----------------------------------------------------------- */

/* Scratch for one bpe_encode call, grown to the longest piece. */
typedef struct {
    size_t cap;
    int32_t *id;    /* symbol ids                                  */
    uint32_t *rank; /* small path: rank of pair (i, i+1)          */
    int32_t *next, *prev;
    uint64_t *heap; /* large path: (rank << 32) | left position    */
} scratch;

static int scratch_reserve(scratch *s, size_t n)
{
    if (n <= s->cap) return 1;
    size_t cap = n < 64 ? 64 : n;
    free(s->id);
    free(s->rank);
    free(s->next);
    free(s->prev);
    free(s->heap);
    s->id = malloc(cap * sizeof *s->id);
    s->rank = malloc(cap * sizeof *s->rank);
    s->next = malloc(cap * sizeof *s->next);
    s->prev = malloc(cap * sizeof *s->prev);
    s->heap = malloc(3 * cap * sizeof *s->heap);
    s->cap = (s->id && s->rank && s->next && s->prev && s->heap) ? cap : 0;
    return s->cap != 0;
}

static void scratch_free(scratch *s)
{
    free(s->id);
    free(s->rank);
    free(s->next);
    free(s->prev);
    free(s->heap);
}

#define NO_RANK UINT32_MAX

/* The rank of merging a and b, and in *merged the id of the merge; NO_RANK
 * and -1 when the pair does not merge. *merged is always written, so that
 * no caller reads it unset (gcc -O3 cannot prove that merge_small only
 * merges ranked pairs and warns maybe-uninitialized). */
static uint32_t rank_of(const bpe *t, int32_t a, int32_t b, int32_t *merged)
{
    *merged = -1;
    if (a < 0 || b < 0) return NO_RANK;
    const pair_slot *s = pair_find(t, a, b);
    if (s == NULL) return NO_RANK;
    *merged = s->id;
    return s->rank;
}

/* Quadratic merge over an array: ids[0..n) in place; returns the new n. */
static size_t merge_small(const bpe *t, int32_t *ids, uint32_t *rank, size_t n)
{
    int32_t merged;
    for (size_t i = 0; i + 1 < n; i++) rank[i] = rank_of(t, ids[i], ids[i + 1], &merged);
    while (n > 1) {
        uint32_t best = NO_RANK;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++)
            if (rank[i] < best) {
                best = rank[i];
                at = i;
            }
        if (best == NO_RANK) break;
        rank_of(t, ids[at], ids[at + 1], &merged);
        ids[at] = merged;
        memmove(ids + at + 1, ids + at + 2, (n - at - 2) * sizeof *ids);
        memmove(rank + at + 1, rank + at + 2, (n - at - 2) * sizeof *rank);
        n--;
        if (at > 0) rank[at - 1] = rank_of(t, ids[at - 1], ids[at], &merged);
        if (at + 1 < n) rank[at] = rank_of(t, ids[at], ids[at + 1], &merged);
    }
    return n;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = v;
    return top;
}

/* Heap merge over a linked list of symbols (positions 0..n); the same order
 * as merge_small: lowest rank, then leftmost position. Compacts the
 * surviving ids into s->id[0..) and returns their count. */
static size_t merge_large(const bpe *t, scratch *s, size_t n)
{
    int32_t *id = s->id, *next = s->next, *prev = s->prev;
    uint64_t *heap = s->heap;
    size_t hn = 0;
    int32_t merged;
    for (size_t i = 0; i < n; i++) {
        next[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prev[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t r = rank_of(t, id[i], id[i + 1], &merged);
        if (r != NO_RANK) heap_push(heap, &hn, (uint64_t)r << 32 | i);
    }
    while (hn > 0) {
        uint64_t top = heap_pop(heap, &hn);
        uint32_t r = (uint32_t)(top >> 32);
        int32_t a = (int32_t)(uint32_t)top;
        int32_t b = next[a];
        /* Stale if a was merged away (id -2), has no right neighbour, or the
         * pair at a changed: ranks identify pairs uniquely. */
        if (id[a] == -2 || b < 0 || rank_of(t, id[a], id[b], &merged) != r) continue;
        id[a] = merged;
        id[b] = -2;
        next[a] = next[b];
        if (next[b] >= 0) prev[next[b]] = a;
        if (prev[a] >= 0) {
            uint32_t rl = rank_of(t, id[prev[a]], id[a], &merged);
            if (rl != NO_RANK) heap_push(heap, &hn, (uint64_t)rl << 32 | (uint32_t)prev[a]);
        }
        if (next[a] >= 0) {
            uint32_t rr = rank_of(t, id[a], id[next[a]], &merged);
            if (rr != NO_RANK) heap_push(heap, &hn, (uint64_t)rr << 32 | (uint32_t)a);
        }
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) id[k++] = id[i];
    return k;
}

/* Encodes text[from..n) ordinarily (as if the text began at from), appending
 * to out at *k: never more ids than bytes. BPE_ETOOBIG as soon as *k passes
 * max (after the piece that passed it). */
static bpe_status encode_span(const bpe *t, const char *text, size_t from, size_t n, size_t max,
                              int32_t *out, size_t *k, scratch *s, char *err, size_t errlen)
{
    const unsigned char *u = (const unsigned char *)text;
    size_t pos = from;
    while (pos < n) {
        if (*k > max)
            return ERRBUF_FAIL(err, errlen, BPE_ETOOBIG, "the text has more than %zu tokens", max);
        size_t end = bpe_split_next(text, n, pos);
        size_t m = end - pos;
        int32_t whole = str_find(t, u + pos, m);
        if (whole >= 0) {
            out[(*k)++] = whole;
            pos = end;
            continue;
        }
        if (!scratch_reserve(s, m)) return ERRBUF_FAIL(err, errlen, BPE_ENOMEM, "out of memory");
        for (size_t i = 0; i < m; i++) s->id[i] = t->byte_id[u[pos + i]];
        size_t left = m <= SMALL_PIECE ? merge_small(t, s->id, s->rank, m) : merge_large(t, s, m);
        for (size_t i = 0; i < left; i++) {
            if (s->id[i] < 0) {
                size_t b = pos;
                while (t->byte_id[u[b]] >= 0) b++;
                return ERRBUF_FAIL(err, errlen, BPE_EUNKNOWN,
                                   "the text has byte 0x%02X (at %zu) that the vocabulary cannot "
                                   "represent",
                                   u[b], b);
            }
            out[(*k)++] = s->id[i];
        }
        pos = end;
    }
    return BPE_OK;
}

/* bpe_encode and bpe_encode_special: with `special`, every occurrence of
 * BPE_EOT_TEXT is its token (when the vocabulary has one) and the text
 * between is encoded ordinarily. */
static bpe_status encode(const bpe *t, const char *text, size_t n, int special, size_t max,
                         int32_t **ids, size_t *nids, char *err, size_t errlen)
{
    *ids = NULL;
    *nids = 0;
    if (n == 0) return BPE_OK;
    int32_t *out = malloc(n * sizeof *out);
    scratch s = {0};
    if (out == NULL || !scratch_reserve(&s, SMALL_PIECE)) {
        free(out);
        scratch_free(&s);
        return ERRBUF_FAIL(err, errlen, BPE_ENOMEM, "out of memory");
    }
    const size_t elen = sizeof BPE_EOT_TEXT - 1;
    int32_t eot = special ? str_find(t, (const unsigned char *)BPE_EOT_TEXT, elen) : -1;
    size_t k = 0, pos = 0;
    bpe_status rc = BPE_OK;
    while (rc == BPE_OK && pos < n) {
        const char *hit = eot >= 0 ? memmem(text + pos, n - pos, BPE_EOT_TEXT, elen) : NULL;
        size_t end = hit != NULL ? (size_t)(hit - text) : n;
        rc = encode_span(t, text, pos, end, max, out, &k, &s, err, errlen);
        if (hit != NULL && rc == BPE_OK) {
            out[k++] = eot;
            end += elen;
        }
        pos = end;
    }
    if (rc == BPE_OK && k > max)
        rc = ERRBUF_FAIL(err, errlen, BPE_ETOOBIG, "the text has more than %zu tokens", max);
    scratch_free(&s);
    if (rc != BPE_OK) {
        free(out);
        return rc;
    }
    int32_t *shrunk = realloc(out, k * sizeof *out);
    *ids = shrunk != NULL ? shrunk : out;
    *nids = k;
    return BPE_OK;
}

bpe_status bpe_encode(const bpe *t, const char *text, size_t n, int32_t **ids, size_t *nids,
                      char *err, size_t errlen)
{
    return encode(t, text, n, 0, SIZE_MAX, ids, nids, err, errlen);
}

bpe_status bpe_encode_special(const bpe *t, const char *text, size_t n, int32_t **ids, size_t *nids,
                              char *err, size_t errlen)
{
    return encode(t, text, n, 1, SIZE_MAX, ids, nids, err, errlen);
}

bpe_status bpe_encode_special_max(const bpe *t, const char *text, size_t n, size_t max,
                                  int32_t **ids, size_t *nids, char *err, size_t errlen)
{
    return encode(t, text, n, 1, max, ids, nids, err, errlen);
}

/* ---- Decoding ----------------------------------------------------------- */

const char *bpe_token_bytes(const bpe *t, int32_t id, size_t *len)
{
    if (id < 0 || (size_t)id >= t->vocab_size || !t->present[id]) return NULL;
    *len = t->tok_off[id + 1] - t->tok_off[id];
    return t->tok_bytes + t->tok_off[id];
}

bpe_status bpe_decode(const bpe *t, const int32_t *ids, size_t n, char **out, size_t *outlen,
                      char *err, size_t errlen)
{
    *out = NULL;
    *outlen = 0;
    size_t total = 0, len;
    for (size_t i = 0; i < n; i++) {
        if (bpe_token_bytes(t, ids[i], &len) == NULL)
            return ERRBUF_FAIL(err, errlen, BPE_EUNKNOWN, "id %d (at %zu) is not in the vocabulary",
                               ids[i], i);
        total += len;
    }
    char *buf = malloc(total + 1);
    if (buf == NULL) return ERRBUF_FAIL(err, errlen, BPE_ENOMEM, "out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = bpe_token_bytes(t, ids[i], &len);
        memcpy(buf + o, p, len);
        o += len;
    }
    buf[o] = '\0';
    *out = buf;
    *outlen = o;
    return BPE_OK;
}
