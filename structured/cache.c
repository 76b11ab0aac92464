/*
 * structured/cache.c: a bounded cache of compiled grammars by a hash of
 * their kind and source (structured.h), least recently used out, locked
 * inside: the tokenizer threads compile through it.
 */
#include "automaton.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t hash;
    gram_kind kind;
    char *src;
    size_t len;
    gram *g;
    uint64_t used;
} centry;

struct gram_cache {
    pthread_mutex_t mu;
    centry *e;
    size_t cap, n;
    uint64_t clock, hits, misses;
};

gram_cache *gram_cache_new(size_t capacity)
{
    gram_cache *c = calloc(1, sizeof *c);
    if (c == NULL) return NULL;
    c->cap = capacity ? capacity : 1;
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

static uint64_t fnv(gram_kind kind, const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)kind;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

int gram_cache_get(gram_cache *c, gram_kind kind, const char *src, size_t len, gram **out,
                   gram_error *err)
{
    uint64_t h = fnv(kind, src, len);
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n; i++) {
        centry *e = &c->e[i];
        if (e->hash == h && e->kind == kind && e->len == len && memcmp(e->src, src, len) == 0) {
            e->used = ++c->clock;
            c->hits++;
            *out = gram_ref(e->g);
            pthread_mutex_unlock(&c->mu);
            return 0;
        }
    }
    c->misses++;
    pthread_mutex_unlock(&c->mu);
    /* Compiled outside the lock: two threads may compile one source at once;
     * the second insert finds the first and keeps it. */
    gram *g;
    if (gram_compile(kind, src, len, &g, err) != 0) return -1;
    char *copy = malloc(len + 1);
    if (copy == NULL) {
        *out = g;
        return 0;
    }
    memcpy(copy, src, len);
    pthread_mutex_lock(&c->mu);
    size_t slot = c->n;
    if (c->n == c->cap) {
        slot = 0;
        for (size_t i = 1; i < c->n; i++)
            if (c->e[i].used < c->e[slot].used) slot = i;
        free(c->e[slot].src);
        gram_unref(c->e[slot].g);
    } else
        c->n++;
    c->e[slot] = (centry){h, kind, copy, len, gram_ref(g), ++c->clock};
    pthread_mutex_unlock(&c->mu);
    *out = g;
    return 0;
}

void gram_cache_stats(gram_cache *c, uint64_t *hits, uint64_t *misses)
{
    pthread_mutex_lock(&c->mu);
    *hits = c->hits;
    *misses = c->misses;
    pthread_mutex_unlock(&c->mu);
}
