/*
 * server/api/resp_store.c: the stored responses of POST /v1/responses
 * (store, previous_response_id; api.h): in memory only, bounded by a count
 * and by bytes (responses_store_max, responses_store_bytes, read at each
 * put so that a reload applies at the next one), least recently used
 * first out. Each entry belongs to the API key that made it (its owner,
 * the key's keyed hash; 0 without keys): another key finds nothing, as if
 * the id did not exist. A chained hash over the ids, and a list in use
 * order.
 */
#include "api/api.h"

#include <stdlib.h>
#include <string.h>

#define RS_BUCKETS 4096u

struct resp_store {
    rs_entry *buckets[RS_BUCKETS];
    rs_entry *head, *tail; /* most recently used first */
    size_t count, bytes;
};

static size_t bucket_of(const char *id)
{
    uint64_t h = UINT64_C(1469598103934665603); /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * UINT64_C(1099511628211);
    return (size_t)(h % RS_BUCKETS);
}

void rs_entry_free(rs_entry *e)
{
    if (e == NULL) return;
    json_decref(e->response);
    json_decref(e->input_items);
    oai_msgs_free(e->conv, e->nconv);
    free(e);
}

void rs_free(resp_store *st)
{
    if (st == NULL) return;
    rs_entry *next;
    for (rs_entry *e = st->head; e != NULL; e = next) {
        next = e->next;
        rs_entry_free(e);
    }
    free(st);
}

static void lru_unlink(resp_store *st, rs_entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        st->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        st->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push(resp_store *st, rs_entry *e)
{
    e->prev = NULL;
    e->next = st->head;
    if (st->head) st->head->prev = e;
    st->head = e;
    if (st->tail == NULL) st->tail = e;
}

/* Takes e out of the store (its memory stays the caller's). */
static void take_out(resp_store *st, rs_entry *e)
{
    rs_entry **pp = &st->buckets[bucket_of(e->id)];
    while (*pp != NULL && *pp != e) pp = &(*pp)->hnext;
    if (*pp == e) *pp = e->hnext;
    lru_unlink(st, e);
    st->count--;
    st->bytes -= e->bytes;
}

/* Drops the least recently used until count < max_count and bytes + need
 * <= max_bytes. */
static void evict(resp_store *st, size_t max_count, size_t max_bytes, size_t need)
{
    while (st->tail != NULL && (st->count >= max_count || st->bytes + need > max_bytes)) {
        rs_entry *e = st->tail;
        take_out(st, e);
        rs_entry_free(e);
    }
}

static size_t json_bytes(const json_t *v)
{
    return v ? json_dumpb(v, NULL, 0, JSON_COMPACT) : 0;
}

int rs_put(resp_store *st, rs_entry *e, size_t max_count, size_t max_bytes)
{
    e->bytes = sizeof *e + json_bytes(e->response) + json_bytes(e->input_items);
    for (size_t i = 0; i < e->nconv; i++) e->bytes += sizeof e->conv[i] + e->conv[i].len;
    if (max_count == 0 || e->bytes > max_bytes) {
        rs_trim(st, max_count, max_bytes); /* bounds lowered since the last put */
        rs_entry_free(e);
        return 0;
    }
    evict(st, max_count, max_bytes, e->bytes);
    size_t b = bucket_of(e->id);
    e->hnext = st->buckets[b];
    st->buckets[b] = e;
    lru_push(st, e);
    st->count++;
    st->bytes += e->bytes;
    return 1;
}

size_t rs_trim(resp_store *st, size_t max_count, size_t max_bytes)
{
    if (st == NULL) return 0;
    size_t before = st->count;
    while (st->tail != NULL && (st->count > max_count || st->bytes > max_bytes)) {
        rs_entry *e = st->tail;
        take_out(st, e);
        rs_entry_free(e);
    }
    return before - st->count;
}

rs_entry *rs_get(resp_store *st, const char *id, uint64_t owner)
{
    if (st == NULL) return NULL;
    for (rs_entry *e = st->buckets[bucket_of(id)]; e != NULL; e = e->hnext)
        if (e->owner == owner && strcmp(e->id, id) == 0) {
            lru_unlink(st, e);
            lru_push(st, e);
            return e;
        }
    return NULL;
}

int rs_delete(resp_store *st, const char *id, uint64_t owner)
{
    rs_entry *e = rs_get(st, id, owner);
    if (e == NULL) return -1;
    take_out(st, e);
    rs_entry_free(e);
    return 0;
}

resp_store *rs_new(void)
{
    return calloc(1, sizeof(resp_store));
}

size_t rs_count(const resp_store *st)
{
    return st ? st->count : 0;
}

size_t rs_bytes(const resp_store *st)
{
    return st ? st->bytes : 0;
}
