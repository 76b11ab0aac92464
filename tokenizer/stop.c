/*
 * tokenizer/stop.c: the stop-string matcher for streamed text.
 *
 * Text arrives in pieces (whole UTF-8 characters from the stream decoder).
 * The matcher releases only what can no longer become part of a stop
 * string: it holds back the longest tail that is a prefix of some stop
 * string, so no part of a stop string ever reaches the client, even when it
 * spans tokens. When a stop string completes, the text before its first
 * occurrence is released and the rest is dropped.
 */
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

struct stop_matcher {
    size_t n;
    char **stops;
    size_t *lens;
    size_t max_len;
    char *buf; /* held text, then the new piece while it is examined */
    size_t held, cap;
    int stopped;
};

void stop_free(stop_matcher *m)
{
    if (m == NULL) return;
    for (size_t i = 0; i < m->n; i++) free(m->stops[i]);
    free(m->stops);
    free(m->lens);
    free(m->buf);
    free(m);
}

stop_matcher *stop_new(const char *const *stops, const size_t *lens, size_t n)
{
    stop_matcher *m = calloc(1, sizeof *m);
    if (m == NULL) return NULL;
    m->stops = calloc(n ? n : 1, sizeof *m->stops);
    m->lens = calloc(n ? n : 1, sizeof *m->lens);
    if (m->stops == NULL || m->lens == NULL) goto fail;
    for (size_t i = 0; i < n; i++) {
        if (lens[i] == 0) continue; /* an empty stop string matches nothing */
        m->stops[m->n] = malloc(lens[i]);
        if (m->stops[m->n] == NULL) goto fail;
        memcpy(m->stops[m->n], stops[i], lens[i]);
        m->lens[m->n++] = lens[i];
        if (lens[i] > m->max_len) m->max_len = lens[i];
    }
    return m;
fail:
    stop_free(m);
    return NULL;
}

static int ensure(stop_matcher *m, size_t need)
{
    if (need <= m->cap) return 1;
    size_t cap = need < 64 ? 64 : need * 2;
    char *b = realloc(m->buf, cap);
    if (b == NULL) return 0;
    m->buf = b;
    m->cap = cap;
    return 1;
}

/* The longest k < len(stop) such that the last k bytes of p[0..n) are the
 * first k bytes of some stop string. */
static size_t partial_tail(const stop_matcher *m, const char *p, size_t n)
{
    size_t best = 0;
    for (size_t i = 0; i < m->n; i++) {
        size_t k = m->lens[i] - 1 < n ? m->lens[i] - 1 : n;
        for (; k > best; k--)
            if (memcmp(p + n - k, m->stops[i], k) == 0) break;
        if (k > best) best = k;
    }
    return best;
}

size_t stop_feed(stop_matcher *m, const char *in, size_t n, char *out, int *stopped)
{
    *stopped = m->stopped;
    if (m->stopped || n == 0) return 0;
    if (!ensure(m, m->held + n)) return (size_t)-1;
    memcpy(m->buf + m->held, in, n);
    size_t len = m->held + n;
    /* The earliest complete stop string, if any. */
    size_t first = len;
    for (size_t i = 0; i < m->n; i++) {
        if (m->lens[i] > len) continue;
        for (size_t at = 0; at + m->lens[i] <= len && at < first; at++)
            if (memcmp(m->buf + at, m->stops[i], m->lens[i]) == 0) {
                first = at;
                break;
            }
    }
    if (first < len) {
        memcpy(out, m->buf, first);
        m->held = 0;
        m->stopped = 1;
        *stopped = 1;
        return first;
    }
    size_t keep = partial_tail(m, m->buf, len);
    size_t release = len - keep;
    memcpy(out, m->buf, release);
    memmove(m->buf, m->buf + release, keep);
    m->held = keep;
    return release;
}

size_t stop_flush(stop_matcher *m, char *out)
{
    size_t n = m->stopped ? 0 : m->held;
    if (n > 0) memcpy(out, m->buf, n);
    m->held = 0;
    return n;
}

size_t stop_held(const stop_matcher *m)
{
    return m->held;
}
