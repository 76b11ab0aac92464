/*
 * structured/cache.c: a bounded cache of compiled grammars by a hash of
 * their kind and source (structured.h), least recently used out, locked
 * inside: the tokenizer threads compile through it. Bounded by entries and
 * by bytes (issue 34): one schema's automaton can take megabytes (190,000
 * nodes, about 2.6 MiB), so a count alone let 64 of them hold 165 MiB.
 */
#include "automaton.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t hash;
    gram_kind kind;
    char *src;
    size_t len;
    gram *g;
    size_t bytes; /* gram_bytes(g) + len + 1: what it counts against max_bytes */
    uint64_t used;
} centry;

struct gram_cache {
    pthread_mutex_t mu;
    centry *e;
    size_t cap, n;
    size_t bytes, max_bytes; /* the entries' bytes; their bound */
    uint64_t clock, hits, misses;
};

gram_cache *gram_cache_new(size_t capacity)
{
    gram_cache *c = calloc(1, sizeof *c);
    if (c == NULL) return NULL;
    c->cap = capacity ? capacity : 1;
    c->max_bytes = SIZE_MAX;
    c->e = calloc(c->cap, sizeof *c->e);
    if (c->e == NULL) {
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void gram_cache_free(gram_cache *c)
{
    if (c == NULL) return;
    for (size_t i = 0; i < c->n; i++) {
        free(c->e[i].src);
        gram_unref(c->e[i].g);
    }
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* Drops the least recently used entry (c->n > 0). Called with c->mu held. */
static void evict_lru(gram_cache *c)
{
    size_t lru = 0;
    for (size_t i = 1; i < c->n; i++)
        if (c->e[i].used < c->e[lru].used) lru = i;
    c->bytes -= c->e[lru].bytes;
    free(c->e[lru].src);
    gram_unref(c->e[lru].g);
    c->e[lru] = c->e[--c->n];
}

size_t gram_cache_set_max_bytes(gram_cache *c, size_t max_bytes)
{
    size_t gone = 0;
    pthread_mutex_lock(&c->mu);
    c->max_bytes = max_bytes;
    for (; c->n > 0 && c->bytes > c->max_bytes; gone++) evict_lru(c);
    pthread_mutex_unlock(&c->mu);
    return gone;
}

static uint64_t fnv(gram_kind kind, const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)kind;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* The entry of kind and src (hash h), or NULL. Called with c->mu held. */
static centry *find(gram_cache *c, uint64_t h, gram_kind kind, const char *src, size_t len)
{
    for (size_t i = 0; i < c->n; i++) {
        centry *e = &c->e[i];
        if (e->hash == h && e->kind == kind && e->len == len && memcmp(e->src, src, len) == 0)
            return e;
    }
    return NULL;
}

int gram_cache_get(gram_cache *c, gram_kind kind, const char *src, size_t len, gram **out,
                   gram_error *err)
{
    uint64_t h = fnv(kind, src, len);
    pthread_mutex_lock(&c->mu);
    centry *e = find(c, h, kind, src, len);
    if (e != NULL) {
        e->used = ++c->clock;
        c->hits++;
        *out = gram_ref(e->g);
        pthread_mutex_unlock(&c->mu);
        return 0;
    }
    c->misses++;
    pthread_mutex_unlock(&c->mu);
    /* Compiled outside the lock: two threads may compile one source at once;
     * the second insert finds the first and keeps it (below). */
    gram *g;
    if (gram_compile(kind, src, len, &g, err) != 0) return -1;
    char *copy = malloc(len + 1);
    if (copy == NULL) {
        *out = g;
        return 0;
    }
    memcpy(copy, src, len);
    size_t bytes = gram_bytes(g) + len + 1;
    pthread_mutex_lock(&c->mu);
    if (find(c, h, kind, src, len) != NULL || bytes > c->max_bytes) {
        /* Another thread's copy is in, or g is larger than the whole
         * bound: served, not kept. */
        pthread_mutex_unlock(&c->mu);
        free(copy);
        *out = g;
        return 0;
    }
    while (c->n > 0 && (c->n == c->cap || c->bytes + bytes > c->max_bytes)) evict_lru(c);
    c->e[c->n++] = (centry){h, kind, copy, len, gram_ref(g), bytes, ++c->clock};
    c->bytes += bytes;
    pthread_mutex_unlock(&c->mu);
    *out = g;
    return 0;
}

void gram_cache_usage(gram_cache *c, size_t *entries, size_t *bytes)
{
    pthread_mutex_lock(&c->mu);
    *entries = c->n;
    *bytes = c->bytes;
    pthread_mutex_unlock(&c->mu);
}

void gram_cache_stats(gram_cache *c, uint64_t *hits, uint64_t *misses)
{
    pthread_mutex_lock(&c->mu);
    *hits = c->hits;
    *misses = c->misses;
    pthread_mutex_unlock(&c->mu);
}
