/*
 * server/api/sse.c: see sse.h.
 */
#include "sse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sse_init(sse_queue *q)
{
    memset(q, 0, sizeof *q);
}

void sse_free(sse_queue *q)
{
    free(q->buf);
    sse_init(q);
}

/* Appends the pieces of one event, all or nothing. */
static int put(sse_queue *q, const char *a, const char *b, size_t blen, const char *c)
{
    if (q->failed || q->done) return -1;
    size_t alen = strlen(a), clen = strlen(c);
    size_t n = alen + blen + clen;
    if (!sse_fits(q, n)) {
        q->over = 1; /* refused whole: the stream never holds half an event */
        return -1;
    }
    if (q->off > 0 && q->off == q->len) q->off = q->len = 0; /* all taken: start over */
    size_t need = q->len + n;
    if (need < q->len) { /* overflow */
        q->failed = 1;
        return -1;
    }
    if (need > q->cap && q->off > 0) { /* a slow reader: reuse what it took */
        memmove(q->buf, q->buf + q->off, q->len - q->off);
        q->len -= q->off;
        need -= q->off;
        q->off = 0;
    }
    if (need > q->cap) {
        size_t cap = q->cap ? q->cap : 1024;
        while (cap < need) {
            if (cap > (size_t)-1 / 2) {
                q->failed = 1;
                return -1;
            }
            cap *= 2;
        }
        char *nb = realloc(q->buf, cap);
        if (nb == NULL) {
            q->failed = 1;
            return -1;
        }
        q->buf = nb;
        q->cap = cap;
    }
    memcpy(q->buf + q->len, a, alen);
    memcpy(q->buf + q->len + alen, b, blen);
    memcpy(q->buf + q->len + alen + blen, c, clen);
    q->len = need;
    q->total += n;
    return 0;
}

int sse_fits(const sse_queue *q, size_t n)
{
    return q->max_bytes == 0 || (q->total <= q->max_bytes && n <= q->max_bytes - q->total);
}

/* "event: " NAME "\ndata: " JSON "\n\n" */
size_t sse_event_bytes(const char *name, const json_t *obj)
{
    size_t js = json_dumpb(obj, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY);
    return js == 0 ? 0 : 7 + strlen(name) + 7 + js + 2;
}

void sse_final(sse_queue *q)
{
    q->max_bytes = 0;
}

size_t sse_cut(sse_queue *q)
{
    if (q->done) return 0;
    size_t keep = 0, wait = q->len - q->off;
    if (q->mid && wait > 0) {
        /* Every event ends with a blank line, and no event holds one inside
         * it (a data line is one line of compact JSON), so the partly taken
         * event ends at the first "\n\n" from here, which may straddle what
         * was taken. */
        const char *p = q->buf + q->off;
        if (q->last == '\n' && p[0] == '\n') {
            keep = 1;
        } else {
            keep = wait;
            for (size_t i = 0; i + 1 < wait; i++)
                if (p[i] == '\n' && p[i + 1] == '\n') {
                    keep = i + 2;
                    break;
                }
        }
    }
    size_t dropped = wait - keep;
    const char *d = q->buf + q->off + keep; /* whole events, each ending "\n\n" */
    for (size_t i = 0; i < dropped; i++)
        if ((i == 0 || (i >= 2 && d[i - 1] == '\n' && d[i - 2] == '\n')) && d[i] != ':')
            q->dropped++;
    q->len = q->off + keep;
    q->total -= dropped;
    /* Nothing more fits but the ending (sse_final): no event is one byte. */
    q->max_bytes = q->total ? q->total : 1;
    return dropped;
}

int sse_data(sse_queue *q, const json_t *obj)
{
    if (q->failed || q->done) return -1;
    char *js = json_dumps(obj, JSON_COMPACT | JSON_ENCODE_ANY);
    if (js == NULL) {
        q->failed = 1;
        return -1;
    }
    /* Compact JSON from jansson never holds a raw CR or LF: no scan. */
    int rc = put(q, "data: ", js, strlen(js), "\n\n");
    free(js);
    return rc;
}

int sse_event(sse_queue *q, const char *name, const json_t *obj)
{
    if (q->failed || q->done) return -1;
    char head[96];
    int w = snprintf(head, sizeof head, "event: %s\ndata: ", name);
    if (w < 0 || (size_t)w >= sizeof head || strpbrk(name, "\r\n") != NULL) return -1;
    char *js = json_dumps(obj, JSON_COMPACT | JSON_ENCODE_ANY);
    if (js == NULL) {
        q->failed = 1;
        return -1;
    }
    int rc = put(q, head, js, strlen(js), "\n\n");
    free(js);
    return rc;
}

int sse_end(sse_queue *q)
{
    if (q->failed || q->done) return -1;
    q->done = 1;
    return 0;
}

int sse_data_raw(sse_queue *q, const char *json)
{
    if (strchr(json, '\n') != NULL || strchr(json, '\r') != NULL) return -1;
    return put(q, "data: ", json, strlen(json), "\n\n");
}

int sse_comment(sse_queue *q, const char *text)
{
    if (strchr(text, '\n') != NULL || strchr(text, '\r') != NULL) return -1;
    return put(q, ": ", text, strlen(text), "\n\n");
}

int sse_done(sse_queue *q)
{
    if (put(q, "data: [DONE]", "", 0, "\n\n") != 0) return -1;
    q->done = 1;
    return 0;
}

size_t sse_pending(const sse_queue *q)
{
    return q->len - q->off;
}

size_t sse_take(sse_queue *q, char *out, size_t max)
{
    size_t n = q->len - q->off;
    if (n > max) n = max;
    if (n == 0) return 0;
    memcpy(out, q->buf + q->off, n);
    /* Whether the bytes taken now end an event: they end with a blank line
     * (its first newline may have been the previous take's last byte). */
    q->mid = !(out[n - 1] == '\n' && (n >= 2 ? out[n - 2] == '\n' : q->last == '\n'));
    q->last = out[n - 1];
    q->off += n;
    if (q->off == q->len) q->off = q->len = 0;
    return n;
}

int sse_finished(const sse_queue *q)
{
    return q->done && q->off == q->len;
}

int sse_over_limit(const sse_queue *q)
{
    return q->limit > 0 && sse_pending(q) > q->limit;
}
