/*
 * server/api/resp_store.c: the stored responses of POST /v1/responses
 * (store, previous_response_id; api.h): in memory only, bounded by a count
 * and by bytes (responses_store_max, responses_store_bytes, read at each
 * put so that a reload applies at the next one).
 *
 * A conversation is held once: each stored response keeps a node of its
 * own messages (its input and output) with a reference to the node of the
 * response it continued, so a chain of responses shares its history, and a
 * request naming one takes a reference, not a copy. A chain's bytes are
 * bounded (responses_store_chain_bytes): a node that would pass the bound
 * copies instead the newest messages of its history that fit in half of it
 * and holds no older node; the oldest turns are forgotten (the model's
 * context never reaches that far back).
 *
 * What the store counts is what it holds: each node's and each entry's
 * allocation as the allocator sized it, from its making to its freeing
 * (a node lives while a stored response or a running request refers to
 * it). The response object is kept as its compact JSON text, the input
 * items are made again from the node when asked.
 *
 * Each entry belongs to the API key that made it (its owner, the key's
 * keyed hash; 0 without keys): another key finds nothing, as if the id did
 * not exist. The keys share the bounds: each has a fair share (the bounds
 * over the number of keys with something stored), and what must go to make
 * room is the least recently used entry of the key making it when that key
 * is over its share, else of the key furthest over its share. So one key
 * storing much evicts its own, never another key's within its share.
 */
#include "api/api.h"

#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#define RS_BUCKETS 4096u

/* One key's part of the store: its entries in use order. */
typedef struct {
    uint64_t owner;
    rs_entry *head, *tail; /* most recently used first */
    size_t count, bytes;   /* its entries, and its entries' and nodes' bytes */
} rs_key;

struct resp_store {
    rs_entry *buckets[RS_BUCKETS];
    rs_key *keys;
    size_t nkeys, capkeys;
    rs_turns *turns; /* every node alive that it counts */
    size_t count, bytes;
};

/* What an allocation takes: its usable size and the allocator's header. */
static size_t alloc_bytes(void *p, size_t asked)
{
#ifdef __GLIBC__
    (void)asked;
    return p ? malloc_usable_size(p) + sizeof(size_t) : 0;
#else
    return p ? asked + 2 * sizeof(size_t) : 0;
#endif
}

static size_t bucket_of(const char *id)
{
    uint64_t h = UINT64_C(1469598103934665603); /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * UINT64_C(1099511628211);
    return (size_t)(h % RS_BUCKETS);
}

/* ---- The keys ------------------------------------------------------------ */

static rs_key *key_find(resp_store *st, uint64_t owner)
{
    for (size_t i = 0; i < st->nkeys; i++)
        if (st->keys[i].owner == owner) return &st->keys[i];
    return NULL;
}

/* owner's record, made when missing; NULL: no memory. */
static rs_key *key_get(resp_store *st, uint64_t owner)
{
    rs_key *k = key_find(st, owner);
    if (k != NULL) return k;
    if (st->nkeys == st->capkeys) {
        size_t cap = st->capkeys ? 2 * st->capkeys : 4;
        rs_key *nk = realloc(st->keys, cap * sizeof *nk);
        if (nk == NULL) return NULL;
        st->keys = nk;
        st->capkeys = cap;
    }
    k = &st->keys[st->nkeys++];
    *k = (rs_key){.owner = owner};
    return k;
}

/* Forgets owner's record once nothing of it is left. */
static void key_drop_if_empty(resp_store *st, uint64_t owner)
{
    rs_key *k = key_find(st, owner);
    if (k == NULL || k->count != 0 || k->bytes != 0) return;
    *k = st->keys[--st->nkeys];
}

static void account(resp_store *st, uint64_t owner, size_t bytes, int add)
{
    rs_key *k = key_find(st, owner);
    if (add) {
        st->bytes += bytes;
        if (k) k->bytes += bytes;
    } else {
        st->bytes -= bytes;
        if (k) {
            k->bytes -= bytes;
            key_drop_if_empty(st, owner);
        }
    }
}

/* ---- The conversation's nodes --------------------------------------------- */

static void turns_unlink(rs_turns *t)
{
    resp_store *st = t->st;
    if (st == NULL) return;
    if (t->sprev)
        t->sprev->snext = t->snext;
    else
        st->turns = t->snext;
    if (t->snext) t->snext->sprev = t->sprev;
    account(st, t->owner, t->bytes, 0);
    t->st = NULL;
}

rs_turns *rs_turns_ref(rs_turns *t)
{
    if (t != NULL) t->refs++;
    return t;
}

void rs_turns_unref(rs_turns *t)
{
    /* A chain is let go of from its newest node back, without recursion:
     * a long chain is a long list. */
    while (t != NULL && --t->refs == 0) {
        rs_turns *parent = t->parent;
        turns_unlink(t);
        free(t);
        t = parent;
    }
}

/* The bytes m takes in a node: its record, its text, a call's name and
 * call_id (each NUL-terminated). */
static size_t msg_bytes(const rs_msg *m)
{
    return sizeof(rs_msg) + m->len + 1 + (m->name ? strlen(m->name) + 1 : 0)
           + (m->call_id ? strlen(m->call_id) + 1 : 0);
}

/* Copies s (NULL: none) to *p, moving it on; the copy, or NULL. */
static const char *pack(char **p, const char *s)
{
    if (s == NULL) return NULL;
    size_t n = strlen(s) + 1;
    memcpy(*p, s, n);
    *p += n;
    return *p - n;
}

/* A node of the messages src[0..n) (texts copied) after parent (a reference
 * taken). NULL: no memory. */
static rs_turns *turns_make(resp_store *st, uint64_t owner, rs_turns *parent, const rs_msg *src,
                            size_t n)
{
    size_t asked = sizeof(rs_turns);
    for (size_t i = 0; i < n; i++) asked += msg_bytes(&src[i]);
    rs_turns *t = malloc(asked);
    if (t == NULL) return NULL;
    *t = (rs_turns){.refs = 1, .parent = rs_turns_ref(parent), .owner = owner, .n = n};
    char *p = (char *)(t->msg + n);
    for (size_t i = 0; i < n; i++) {
        if (src[i].len > 0) memcpy(p, src[i].text, src[i].len);
        p[src[i].len] = '\0';
        t->msg[i] = (rs_msg){src[i].role, p, src[i].len, src[i].kind, NULL, NULL};
        p += src[i].len + 1;
        t->msg[i].name = pack(&p, src[i].name);
        t->msg[i].call_id = pack(&p, src[i].call_id);
    }
    t->bytes = alloc_bytes(t, asked);
    t->chain_bytes = t->bytes + (parent ? parent->chain_bytes : 0);
    t->chain_msgs = n + (parent ? parent->chain_msgs : 0);
    if (st != NULL && key_get(st, owner) != NULL) {
        t->st = st;
        t->snext = st->turns;
        if (st->turns) st->turns->sprev = t;
        st->turns = t;
        account(st, owner, t->bytes, 1);
    }
    return t;
}

rs_turns *rs_turns_new(resp_store *st, uint64_t owner, rs_turns *parent, const rs_msg *msgs,
                       size_t n, size_t chain_max)
{
    size_t own = sizeof(rs_turns);
    for (size_t i = 0; i < n; i++) own += msg_bytes(&msgs[i]);
    if (parent == NULL || parent->chain_bytes + own <= chain_max)
        return turns_make(st, owner, parent, msgs, n);
    /* Past the chain's bound: the newest of the history that fits in half
     * of it, copied, then msgs; nothing older. */
    size_t keep = 0, bytes = own;
    for (const rs_turns *t = parent; t != NULL; t = t->parent) {
        size_t i = t->n;
        while (i > 0 && bytes + msg_bytes(&t->msg[i - 1]) <= chain_max / 2) {
            bytes += msg_bytes(&t->msg[--i]);
            keep++;
        }
        if (i > 0) break;
    }
    rs_msg *all = malloc((keep + n) * sizeof *all + 1);
    if (all == NULL) return NULL;
    size_t at = keep;
    for (const rs_turns *t = parent; t != NULL && at > 0; t = t->parent)
        for (size_t i = t->n; i > 0 && at > 0; i--) all[--at] = t->msg[i - 1];
    if (n > 0) memcpy(all + keep, msgs, n * sizeof *msgs);
    rs_turns *t = turns_make(st, owner, NULL, all, keep + n);
    free(all);
    return t;
}

/* ---- The entries ----------------------------------------------------------- */

rs_entry *rs_entry_new(const char *id, uint64_t owner, const json_t *response, rs_turns *turns,
                       size_t nin)
{
    rs_entry *e = calloc(1, sizeof *e);
    if (e == NULL) return NULL;
    snprintf(e->id, sizeof e->id, "%s", id);
    e->owner = owner;
    e->turns = turns;
    e->nin = nin;
    e->response = json_dumps(response, JSON_COMPACT);
    if (e->response == NULL) {
        free(e);
        return NULL;
    }
    e->bytes = alloc_bytes(e, sizeof *e) + alloc_bytes(e->response, strlen(e->response) + 1);
    return e;
}

void rs_entry_free(rs_entry *e)
{
    if (e == NULL) return;
    free(e->response);
    rs_turns_unref(e->turns);
    free(e);
}

void rs_free(resp_store *st)
{
    if (st == NULL) return;
    for (size_t b = 0; b < RS_BUCKETS; b++) {
        rs_entry *next;
        for (rs_entry *e = st->buckets[b]; e != NULL; e = next) {
            next = e->hnext;
            rs_entry_free(e);
        }
    }
    /* Nodes still held by running requests outlive the store uncounted. */
    for (rs_turns *t = st->turns; t != NULL; t = t->snext) t->st = NULL;
    free(st->keys);
    free(st);
}

static void lru_unlink(rs_key *k, rs_entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        k->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        k->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push(rs_key *k, rs_entry *e)
{
    e->prev = NULL;
    e->next = k->head;
    if (k->head) k->head->prev = e;
    k->head = e;
    if (k->tail == NULL) k->tail = e;
}

/* Takes e out of the store and frees it. */
static void drop(resp_store *st, rs_entry *e)
{
    rs_entry **pp = &st->buckets[bucket_of(e->id)];
    while (*pp != NULL && *pp != e) pp = &(*pp)->hnext;
    if (*pp == e) *pp = e->hnext;
    rs_key *k = key_find(st, e->owner);
    lru_unlink(k, e);
    k->count--;
    st->count--;
    account(st, e->owner, e->bytes, 0);
    rs_entry_free(e); /* its node's bytes go when the node does */
}

/* Whether the store holds more than the bounds allow with `count` more
 * entries of `need` more bytes. */
static int over(const resp_store *st, size_t max_count, size_t max_bytes, size_t count, size_t need)
{
    return st->count + count > max_count || st->bytes + need > max_bytes;
}

/* The key whose least recently used entry goes next: `putter` (NULL for
 * none: a trim) when it is over its fair share with `need` bytes more (NULL
 * when it has no entry left to give), else the key furthest over its share
 * (count or bytes, whichever bound is passed); never a key within its
 * share. NULL when there is none. */
static rs_key *victim(resp_store *st, const rs_key *putter, size_t max_count, size_t max_bytes,
                      size_t need)
{
    size_t nk = 0;
    for (size_t i = 0; i < st->nkeys; i++) nk += st->keys[i].count > 0 || &st->keys[i] == putter;
    if (nk == 0) return NULL;
    size_t share_count = max_count / nk, share_bytes = max_bytes / nk;
    if (putter != NULL && (putter->count + 1 > share_count || putter->bytes + need > share_bytes))
        /* Over its share: its own go, and when it has none left, nothing
         * of another key's does (its entry is not kept). */
        return putter->tail != NULL ? (rs_key *)putter : NULL;
    int by_count = st->count + (putter != NULL) > max_count;
    rs_key *worst = NULL;
    for (size_t i = 0; i < st->nkeys; i++) {
        rs_key *k = &st->keys[i];
        if (k->tail == NULL || k == putter
            || (by_count ? k->count <= share_count : k->bytes <= share_bytes))
            continue; /* within its share: untouched */
        if (worst == NULL || (by_count ? k->count > worst->count : k->bytes > worst->bytes))
            worst = k;
    }
    return worst;
}

int rs_put(resp_store *st, rs_entry *e, size_t max_count, size_t max_bytes)
{
    uint64_t owner = e->owner;
    rs_key *k = key_get(st, owner);
    if (k == NULL || max_count == 0 || e->bytes + (e->turns ? e->turns->bytes : 0) > max_bytes) {
        rs_entry_free(e);
        if (k) key_drop_if_empty(st, owner);
        rs_trim(st, max_count, max_bytes); /* bounds lowered since the last put */
        return 0;
    }
    while (over(st, max_count, max_bytes, 1, e->bytes)) {
        rs_key *v = victim(st, k, max_count, max_bytes, e->bytes);
        if (v == NULL) break;
        drop(st, v->tail);
        if ((k = key_find(st, owner)) == NULL) k = key_get(st, owner); /* records move */
        if (k == NULL) break;
    }
    if (k == NULL || over(st, max_count, max_bytes, 1, e->bytes)) {
        /* What is left is held by running requests, not by entries. */
        rs_entry_free(e);
        key_drop_if_empty(st, owner);
        return 0;
    }
    size_t b = bucket_of(e->id);
    e->hnext = st->buckets[b];
    st->buckets[b] = e;
    lru_push(k, e);
    k->count++;
    st->count++;
    account(st, e->owner, e->bytes, 1);
    return 1;
}

size_t rs_trim(resp_store *st, size_t max_count, size_t max_bytes)
{
    if (st == NULL) return 0;
    size_t before = st->count;
    while (over(st, max_count, max_bytes, 0, 0)) {
        rs_key *v = victim(st, NULL, max_count, max_bytes, 0);
        if (v == NULL) break;
        drop(st, v->tail);
    }
    return before - st->count;
}

rs_entry *rs_get(resp_store *st, const char *id, uint64_t owner)
{
    if (st == NULL) return NULL;
    for (rs_entry *e = st->buckets[bucket_of(id)]; e != NULL; e = e->hnext)
        if (e->owner == owner && strcmp(e->id, id) == 0) {
            rs_key *k = key_find(st, owner);
            lru_unlink(k, e);
            lru_push(k, e);
            return e;
        }
    return NULL;
}

int rs_delete(resp_store *st, const char *id, uint64_t owner)
{
    rs_entry *e = rs_get(st, id, owner);
    if (e == NULL) return -1;
    drop(st, e);
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
