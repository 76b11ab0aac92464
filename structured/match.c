/*
 * structured/match.c: one sequence's walk through a compiled grammar,
 * and the allowed-token mask from the vocabulary's trie.
 *
 * The matcher's state is the set of NFA threads alive after the bytes so
 * far: (a byte node, a call stack). Stacks are hash-consed frames (return
 * node, parent), so equal stacks are equal ids, and a state is a sorted
 * set of (node, frame) pairs with an accepting flag, interned: the DFA is
 * built lazily, state by state, with a dense transition row per state
 * (the first DENSE_STATES of them). A mask is a depth-first walk of the
 * token trie from the current state, a subtree pruned as soon as its
 * prefix is dead; masks are kept by state (NMASK of them), so a state seen
 * again (inside a long string, most steps) costs a lookup.
 *
 * Bounds: a stack deeper than GRAM_MAX_STACK kills its thread; the
 * tables are dropped and rebuilt from the current state when they pass
 * MAX_STATES; frames past MAX_FRAMES end the walk (no token allowed).
 * Nothing is dropped silently: a state of more than GRAM_MAX_THREADS
 * threads, or a mask whose work passes GRAM_MASK_BUDGET, puts the matcher
 * over its bound (gram_matcher_error), and the sequence ends with an error.
 * gram_compile explores the automaton first (gram_explore) and refuses
 * what it finds over the thread bound, so that is the rare case.
 */
#include "automaton.h"

#include <stdlib.h>
#include <string.h>

/* ---- The vocabulary's trie ------------------------------------------------- */

struct gram_vocab {
    size_t V;
    int32_t eot;
    size_t nnodes;
    int32_t *first, *sibling, *tok; /* per node: first child, next sibling, token or -1 */
    uint8_t *byte;                  /* per node: the byte of the edge into it */
    size_t maxdepth;
    char *bytes; /* every token's bytes, at off[i], len[i] */
    size_t *off, *len;
};

typedef struct {
    const char *const *tok;
    const size_t *len;
} sort_ctx;

static sort_ctx g_sort; /* qsort has no context argument in C17; guarded by its single use */
static pthread_mutex_t g_sort_mu = PTHREAD_MUTEX_INITIALIZER;

static int by_bytes(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx = g_sort.len[x], ly = g_sort.len[y];
    int c = memcmp(g_sort.tok[x], g_sort.tok[y], lx < ly ? lx : ly);
    if (c != 0) return c;
    return (lx > ly) - (lx < ly);
}

void gram_vocab_free(gram_vocab *v)
{
    if (v == NULL) return;
    free(v->first);
    free(v->sibling);
    free(v->tok);
    free(v->byte);
    free(v->bytes);
    free(v->off);
    free(v->len);
    free(v);
}

int gram_vocab_new(const char *const *tok, const size_t *len, size_t V, int32_t eot,
                   gram_vocab **out)
{
    *out = NULL;
    gram_vocab *v = calloc(1, sizeof *v);
    if (v == NULL) return -1;
    v->V = V;
    v->eot = eot;
    size_t total = 0;
    for (size_t i = 0; i < V; i++) total += len[i];
    size_t cap = total + 1;
    int32_t *order = malloc(V * sizeof *order);
    v->first = malloc(cap * sizeof *v->first);
    v->sibling = malloc(cap * sizeof *v->sibling);
    v->tok = malloc(cap * sizeof *v->tok);
    v->byte = malloc(cap);
    v->bytes = malloc(total + 1);
    v->off = malloc(V * sizeof *v->off);
    v->len = malloc(V * sizeof *v->len);
    int32_t *path = malloc((total + 2) * sizeof *path);
    if (order == NULL || v->first == NULL || v->sibling == NULL || v->tok == NULL || v->byte == NULL
        || v->bytes == NULL || v->off == NULL || v->len == NULL || path == NULL) {
        free(order);
        free(path);
        gram_vocab_free(v);
        return -1;
    }
    size_t at = 0, n = 0;
    for (size_t i = 0; i < V; i++) {
        memcpy(v->bytes + at, tok[i], len[i]);
        v->off[i] = at;
        v->len[i] = len[i];
        at += len[i];
        if ((int32_t)i != eot && len[i] > 0) order[n++] = (int32_t)i;
    }
    pthread_mutex_lock(&g_sort_mu);
    g_sort = (sort_ctx){tok, len};
    qsort(order, n, sizeof *order, by_bytes);
    pthread_mutex_unlock(&g_sort_mu);
    /* Sorted strings: each shares a prefix with the one before; the path
     * holds the nodes of the previous string. Children are made in byte
     * order, so each node's list (first, sibling) is kept in order by
     * appending at its tail (the tail is the last child made). */
    v->nnodes = 1;
    v->first[0] = v->sibling[0] = v->tok[0] = -1;
    v->byte[0] = 0;
    path[0] = 0;
    size_t plen = 0; /* bytes of the previous string */
    const char *prev = "";
    int32_t *last = malloc(cap * sizeof *last); /* per node: its last child */
    if (last == NULL) {
        free(order);
        free(path);
        gram_vocab_free(v);
        return -1;
    }
    last[0] = -1;
    for (size_t k = 0; k < n; k++) {
        int32_t id = order[k];
        const char *s = tok[id];
        size_t l = len[id], lcp = 0;
        while (lcp < l && lcp < plen && s[lcp] == prev[lcp]) lcp++;
        for (size_t d = lcp; d < l; d++) {
            int32_t parent = path[d], u = (int32_t)v->nnodes++;
            v->first[u] = v->sibling[u] = v->tok[u] = last[u] = -1;
            v->byte[u] = (uint8_t)s[d];
            if (last[parent] < 0)
                v->first[parent] = u;
            else
                v->sibling[last[parent]] = u;
            last[parent] = u;
            path[d + 1] = u;
        }
        v->tok[path[l]] = id;
        if (l > v->maxdepth) v->maxdepth = l;
        prev = s;
        plen = l;
    }
    free(last);
    free(order);
    free(path);
    *out = v;
    return 0;
}

size_t gram_vocab_size(const gram_vocab *v)
{
    return v->V;
}

size_t gram_vocab_trie_nodes(const gram_vocab *v)
{
    return v->nnodes;
}

/* ---- The matcher ------------------------------------------------------------ */

#define DEAD 0            /* state 0: no thread, not accepting */
#define DENSE_STATES 2048 /* states with a cached transition row */
#define MAX_STATES 16384  /* then the tables are rebuilt */
#define MAX_FRAMES (1u << 20)
#define NMASK 8
#define VISIT_BITS 16 /* the closure's visited set: 65536 slots (nodes and frames of a closure) */
/* The exploration at compile time: the work (as a mask's, gram_matcher_work) it may spend
 * (or the states it may make) before it stops, inconclusive: the runtime
 * bounds still hold. */
#define EXPLORE_BUDGET 500000u

typedef struct {
    size_t off; /* into pool */
    uint32_t n; /* threads */
    uint8_t accept;
    int8_t mask; /* slot of its cached mask, or -1 */
    uint64_t hash;
} dstate;

struct gram_matcher {
    gram *g;
    const gram_vocab *v;
    /* frames: 0 is the empty stack */
    int32_t *f_ret;
    uint32_t *f_parent, *f_depth;
    size_t nf, fcap;
    uint32_t *fh; /* intern table of frame ids + 1 (0 empty) */
    size_t fhcap;
    /* DFA states */
    uint64_t *pool;
    size_t npool, pcap;
    dstate *st;
    size_t nst, stcap;
    uint32_t *sh; /* intern table of state ids + 1 */
    size_t shcap;
    int32_t *trans; /* tcap_states x 256 (at most DENSE_STATES), -1 unknown */
    size_t tcap_states;
    int32_t cur;
    int finished;     /* end of text taken */
    int broken;       /* out of memory or frames: nothing more allowed */
    const char *over; /* a bound passed (threads, work): why; the walk is over */
    uint64_t spent;   /* work so far (gram_matcher_work's unit) */
    /* closure scratch */
    uint64_t *tmp;
    size_t ntmp, tcap;
    uint64_t *work;
    size_t wcap;
    uint64_t *vkey; /* 1 << VISIT_BITS each */
    uint32_t *vstamp, stamp;
    int accept_now;
    /* masks */
    size_t words;
    uint64_t *masks; /* NMASK x words */
    int32_t mask_state[NMASK];
    size_t mask_count[NMASK];
    int next_mask;
    /* the trie walk */
    struct dfs {
        int32_t child;
        int32_t state;
    } * dfs;
};

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (q == NULL) return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* The frame (ret, parent), interned; UINT32_MAX when out of room. */
static uint32_t frame(gram_matcher *m, int32_t ret, uint32_t parent)
{
    if (m->nf * 2 >= m->fhcap) { /* rehash */
        size_t cap = m->fhcap ? m->fhcap * 2 : 1024;
        uint32_t *h = calloc(cap, sizeof *h);
        if (h == NULL) return UINT32_MAX;
        for (size_t i = 1; i < m->nf; i++) {
            size_t k = mix(((uint64_t)(uint32_t)m->f_ret[i] << 32) | m->f_parent[i]) & (cap - 1);
            while (h[k] != 0) k = (k + 1) & (cap - 1);
            h[k] = (uint32_t)i + 1;
        }
        free(m->fh);
        m->fh = h;
        m->fhcap = cap;
    }
    size_t k = mix(((uint64_t)(uint32_t)ret << 32) | parent) & (m->fhcap - 1);
    while (m->fh[k] != 0) {
        uint32_t f = m->fh[k] - 1;
        if (m->f_ret[f] == ret && m->f_parent[f] == parent) return f;
        k = (k + 1) & (m->fhcap - 1);
    }
    if (m->nf >= MAX_FRAMES) return UINT32_MAX;
    size_t c1 = m->fcap, c2 = m->fcap, c3 = m->fcap;
    if (grow((void **)&m->f_ret, &c1, m->nf + 1, sizeof *m->f_ret) != 0
        || grow((void **)&m->f_parent, &c2, m->nf + 1, sizeof *m->f_parent) != 0
        || grow((void **)&m->f_depth, &c3, m->nf + 1, sizeof *m->f_depth) != 0)
        return UINT32_MAX;
    m->fcap = c1 < c2 ? (c1 < c3 ? c1 : c3) : (c2 < c3 ? c2 : c3);
    uint32_t f = (uint32_t)m->nf++;
    m->f_ret[f] = ret;
    m->f_parent[f] = parent;
    m->f_depth[f] = m->f_depth[parent] + 1;
    m->fh[k] = f + 1;
    return f;
}

_Static_assert(GRAM_MAX_THREADS == 4096, "the messages name the bound");
_Static_assert(GRAM_MAX_THREADS * 8 <= 1u << VISIT_BITS, "a closure's nodes fit the visited set");
static const char over_threads[] = "structured outputs: the grammar allows more than 4096 "
                                   "simultaneous positions after this output (docs/api.md)";
static const char over_work[] = "structured outputs: the allowed tokens after this output cost "
                                "more than the per-token budget to find (docs/api.md)";

/* The matcher is over a bound: nothing more is allowed, and why is kept. */
static void over(gram_matcher *m, const char *why)
{
    if (m->over == NULL) m->over = why;
    m->broken = 1;
}

static int visited(gram_matcher *m, uint64_t key)
{
    size_t mask = (1u << VISIT_BITS) - 1, k = mix(key) & mask;
    for (size_t probes = 0; probes <= mask; probes++, k = (k + 1) & mask) {
        if (m->vstamp[k] != m->stamp) {
            m->vstamp[k] = m->stamp;
            m->vkey[k] = key;
            return 0;
        }
        if (m->vkey[k] == key) return 1;
    }
    over(m, over_threads); /* full: more positions than any state may hold */
    return 1;
}

/* Adds the closure of (node, frame) to tmp. */
static void closure(gram_matcher *m, int32_t node, uint32_t fr)
{
    const gram *g = m->g;
    size_t sp = 0;
    if (grow((void **)&m->work, &m->wcap, 64, sizeof *m->work) != 0) {
        m->broken = 1;
        return;
    }
    m->work[sp++] = ((uint64_t)(uint32_t)node << 32) | fr;
    while (sp > 0) {
        uint64_t key = m->work[--sp];
        int32_t x = (int32_t)(key >> 32);
        m->spent++; /* the work unit: a position visited (hashed, kept, later sorted) */
        if (!g->live[x] || visited(m, key)) continue; /* a path that can never finish */
        uint32_t f = (uint32_t)key;
        const gnode *n = &g->n[x];
        uint64_t push[2];
        int np = 0;
        switch (n->kind) {
        case GN_BYTE: {
            const uint64_t *set = g->cls[n->a]; /* an empty class (f_none) is no thread */
            if (x != 0 && (set[0] | set[1] | set[2] | set[3]) != 0) {
                if (m->ntmp >= GRAM_MAX_THREADS) {
                    over(m, over_threads);
                    return;
                }
                if (grow((void **)&m->tmp, &m->tcap, m->ntmp + 1, sizeof *m->tmp) != 0) {
                    m->broken = 1;
                    return;
                }
                m->tmp[m->ntmp++] = key;
            }
            break;
        }
        case GN_EPS:
            if (n->a >= 0) push[np++] = ((uint64_t)(uint32_t)n->a << 32) | f;
            if (n->b >= 0) push[np++] = ((uint64_t)(uint32_t)n->b << 32) | f;
            break;
        case GN_CALL: {
            if (m->f_depth[f] >= GRAM_MAX_STACK) break; /* too deep: the thread dies */
            uint32_t nf = frame(m, n->b, f);
            if (nf == UINT32_MAX) {
                m->broken = 1;
                return;
            }
            push[np++] = ((uint64_t)(uint32_t)g->rule_start[n->a] << 32) | nf;
            break;
        }
        default: /* GN_END */
            if (f == 0)
                m->accept_now = 1;
            else
                push[np++] = ((uint64_t)(uint32_t)m->f_ret[f] << 32) | m->f_parent[f];
        }
        if (grow((void **)&m->work, &m->wcap, sp + 2, sizeof *m->work) != 0) {
            m->broken = 1;
            return;
        }
        for (int k = np; k-- > 0;) m->work[sp++] = push[k];
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The state of tmp[0..ntmp) with accept_now, interned. -1: out of memory. */
static int32_t intern(gram_matcher *m)
{
    if (m->ntmp > 1) qsort(m->tmp, m->ntmp, sizeof *m->tmp, cmp_u64);
    size_t n = 0;
    for (size_t i = 0; i < m->ntmp; i++)
        if (n == 0 || m->tmp[i] != m->tmp[n - 1]) m->tmp[n++] = m->tmp[i];
    m->ntmp = n;
    if (n == 0 && !m->accept_now) return DEAD;
    uint64_t h = mix(n * 2 + (uint64_t)m->accept_now);
    for (size_t i = 0; i < n; i++) h = mix(h ^ m->tmp[i]);
    if (m->nst * 2 >= m->shcap) {
        size_t cap = m->shcap ? m->shcap * 2 : 256;
        uint32_t *t = calloc(cap, sizeof *t);
        if (t == NULL) return -1;
        for (size_t i = 1; i < m->nst; i++) {
            size_t k = m->st[i].hash & (cap - 1);
            while (t[k] != 0) k = (k + 1) & (cap - 1);
            t[k] = (uint32_t)i + 1;
        }
        free(m->sh);
        m->sh = t;
        m->shcap = cap;
    }
    size_t k = h & (m->shcap - 1);
    while (m->sh[k] != 0) {
        const dstate *s = &m->st[m->sh[k] - 1];
        if (s->hash == h && s->n == n && s->accept == m->accept_now
            && memcmp(m->pool + s->off, m->tmp, n * sizeof *m->tmp) == 0)
            return (int32_t)(m->sh[k] - 1);
        k = (k + 1) & (m->shcap - 1);
    }
    if (grow((void **)&m->pool, &m->pcap, m->npool + n, sizeof *m->pool) != 0
        || grow((void **)&m->st, &m->stcap, m->nst + 1, sizeof *m->st) != 0)
        return -1;
    memcpy(m->pool + m->npool, m->tmp, n * sizeof *m->tmp);
    int32_t id = (int32_t)m->nst++;
    if ((size_t)id < DENSE_STATES && (size_t)id >= m->tcap_states) { /* grown as needed: a */
        size_t cap = m->tcap_states * 2;                             /* new sequence touches */
        if (cap > DENSE_STATES) cap = DENSE_STATES;                  /* little fresh memory */
        int32_t *t = realloc(m->trans, cap * 256 * sizeof *t);
        if (t == NULL) return -1;
        m->trans = t;
        m->tcap_states = cap;
    }
    m->st[id] = (dstate){m->npool, (uint32_t)n, (uint8_t)m->accept_now, -1, h};
    m->npool += n;
    m->sh[k] = (uint32_t)id + 1;
    if ((size_t)id < DENSE_STATES)
        memset(m->trans + (size_t)id * 256, 0xFF, 256 * sizeof *m->trans);
    return id;
}

static void begin(gram_matcher *m)
{
    m->ntmp = 0;
    m->accept_now = 0;
    if (++m->stamp == 0) { /* wrapped: clear the stamps once */
        memset(m->vstamp, 0, (1u << VISIT_BITS) * sizeof *m->vstamp);
        m->stamp = 1;
    }
}

/* The state after byte c from state s (DEAD when nothing takes it). */
static int32_t step(gram_matcher *m, int32_t s, uint8_t c)
{
    if ((size_t)s < DENSE_STATES) {
        int32_t t = m->trans[(size_t)s * 256 + c];
        if (t >= 0) return t;
    }
    if (s == DEAD) return DEAD;
    const gram *g = m->g;
    begin(m);
    const dstate *d = &m->st[s];
    m->spent += d->n / 16 + 1; /* a test of each thread's class: cheap beside a closure */
    for (uint32_t i = 0; i < d->n && !m->broken; i++) {
        uint64_t th = m->pool[d->off + i];
        const gnode *n = &g->n[(int32_t)(th >> 32)];
        const uint64_t *set = g->cls[n->a];
        if (set[c >> 6] >> (c & 63) & 1) closure(m, n->b, (uint32_t)th);
        d = &m->st[s]; /* closure does not move st, but keep it plain */
    }
    int32_t t = m->broken ? -1 : intern(m);
    if (t < 0) {
        m->broken = 1;
        return DEAD;
    }
    if ((size_t)s < DENSE_STATES) m->trans[(size_t)s * 256 + c] = t;
    return t;
}

/* Drops every table and starts again from the current state's threads. */
static int rebuild(gram_matcher *m)
{
    const dstate cur = m->st[m->cur];
    begin(m);
    if (grow((void **)&m->tmp, &m->tcap, cur.n + 1, sizeof *m->tmp) != 0) return -1;
    memmove(m->tmp, m->pool + cur.off, cur.n * sizeof *m->tmp);
    m->ntmp = cur.n;
    m->accept_now = cur.accept;
    m->nst = 1; /* DEAD stays */
    m->npool = 0;
    memset(m->sh, 0, m->shcap * sizeof *m->sh);
    for (int k = 0; k < NMASK; k++) m->mask_state[k] = -1;
    int32_t id = intern(m);
    if (id < 0) return -1;
    m->cur = id;
    return 0;
}

gram_matcher *gram_matcher_new(gram *g, const gram_vocab *v)
{
    gram_matcher *m = calloc(1, sizeof *m);
    if (m == NULL) return NULL;
    m->g = gram_ref(g);
    m->v = v;
    m->words = v ? (v->V + 63) / 64 : 1;
    m->tcap_states = 16;
    m->trans = malloc(m->tcap_states * 256 * sizeof *m->trans);
    m->masks = malloc(NMASK * m->words * sizeof *m->masks);
    m->dfs = malloc(((v ? v->maxdepth : 0) + 2) * sizeof *m->dfs);
    m->vkey = malloc((1u << VISIT_BITS) * sizeof *m->vkey);
    m->vstamp = calloc(1u << VISIT_BITS, sizeof *m->vstamp);
    m->fcap = 0;
    size_t c1 = 0, c2 = 0, c3 = 0;
    if (m->trans == NULL || m->masks == NULL || m->dfs == NULL || m->vkey == NULL
        || m->vstamp == NULL || grow((void **)&m->f_ret, &c1, 64, sizeof *m->f_ret) != 0
        || grow((void **)&m->f_parent, &c2, 64, sizeof *m->f_parent) != 0
        || grow((void **)&m->f_depth, &c3, 64, sizeof *m->f_depth) != 0) {
        gram_matcher_free(m);
        return NULL;
    }
    m->fcap = 64;
    m->nf = 1;
    m->f_ret[0] = -1;
    m->f_parent[0] = 0;
    m->f_depth[0] = 0;
    for (int k = 0; k < NMASK; k++) m->mask_state[k] = -1;
    /* state 0: DEAD */
    if (grow((void **)&m->st, &m->stcap, 1, sizeof *m->st) != 0) {
        gram_matcher_free(m);
        return NULL;
    }
    m->st[0] = (dstate){0, 0, 0, -1, 0};
    m->nst = 1;
    memset(m->trans, 0, 256 * sizeof *m->trans); /* DEAD -> DEAD */
    begin(m);
    closure(m, g->rule_start[g->root], 0);
    int32_t s0 = m->over ? DEAD : m->broken ? -1 : intern(m);
    if (s0 < 0) {
        gram_matcher_free(m);
        return NULL;
    }
    m->cur = s0;
    return m;
}

void gram_matcher_free(gram_matcher *m)
{
    if (m == NULL) return;
    gram_unref(m->g);
    free(m->f_ret);
    free(m->f_parent);
    free(m->f_depth);
    free(m->fh);
    free(m->pool);
    free(m->st);
    free(m->sh);
    free(m->trans);
    free(m->tmp);
    free(m->work);
    free(m->masks);
    free(m->dfs);
    free(m->vkey);
    free(m->vstamp);
    free(m);
}

uint64_t gram_matcher_work(const gram_matcher *m)
{
    return m->spent;
}

const char *gram_matcher_error(const gram_matcher *m)
{
    return m->over;
}

int gram_matcher_accepting(const gram_matcher *m)
{
    return m->finished || m->st[m->cur].accept;
}

const uint64_t *gram_matcher_mask(gram_matcher *m, size_t *nallowed)
{
    const gram_vocab *v = m->v;
    if (!m->broken && !m->finished && m->nst > MAX_STATES && rebuild(m) != 0) m->broken = 1;
    int32_t s = m->broken || m->finished ? DEAD : m->cur;
    for (int k = 0; k < NMASK; k++)
        if (m->mask_state[k] == s) {
            *nallowed = m->mask_count[k];
            return m->masks + (size_t)k * m->words;
        }
    int slot = m->next_mask;
    m->next_mask = (m->next_mask + 1) % NMASK;
    uint64_t *mask = m->masks + (size_t)slot * m->words;
    memset(mask, 0, m->words * sizeof *mask);
    size_t count = 0;
    if (s != DEAD && m->v->first[0] >= 0) {
        size_t sp = 0;
        m->spent = 0;
        m->dfs[0] = (struct dfs){v->first[0], s};
        for (;;) {
            if (++m->spent > GRAM_MASK_BUDGET) {
                over(m, over_work);
                break;
            }
            struct dfs *fr = &m->dfs[sp];
            int32_t c = fr->child;
            if (c < 0) {
                if (sp == 0) break;
                sp--;
                continue;
            }
            fr->child = v->sibling[c];
            int32_t t = step(m, fr->state, v->byte[c]);
            if (t == DEAD) continue;
            int32_t id = v->tok[c];
            if (id >= 0) {
                mask[id >> 6] |= 1ull << (id & 63);
                count++;
            }
            if (v->first[c] >= 0) m->dfs[++sp] = (struct dfs){v->first[c], t};
        }
        if (m->broken) { /* a table could not grow, or a bound passed: allow nothing */
            memset(mask, 0, m->words * sizeof *mask);
            count = 0;
        } else if (m->st[s].accept && v->eot >= 0 && (size_t)v->eot < v->V) {
            mask[v->eot >> 6] |= 1ull << (v->eot & 63);
            count++;
        }
    }
    m->mask_state[slot] = m->broken ? -1 : s;
    m->mask_count[slot] = count;
    *nallowed = count;
    return mask;
}

int gram_matcher_feed_bytes(gram_matcher *m, const char *b, size_t n)
{
    if (m->broken || m->finished) return -1;
    int32_t s = m->cur;
    for (size_t i = 0; i < n && s != DEAD; i++) s = step(m, s, (uint8_t)b[i]);
    if (s == DEAD) return -1;
    m->cur = s;
    return 0;
}

int gram_matcher_feed(gram_matcher *m, int32_t id)
{
    const gram_vocab *v = m->v;
    if (id < 0 || (size_t)id >= v->V || m->broken || m->finished) return -1;
    if (id == v->eot) {
        if (!m->st[m->cur].accept) return -1;
        m->finished = 1;
        return 0;
    }
    if (v->len[id] == 0) return -1;
    return gram_matcher_feed_bytes(m, v->bytes + v->off[id], v->len[id]);
}

/* ---- The exploration at compile time --------------------------------------- */

/* A max-heap of state ids by thread count. */
static void heap_push(const gram_matcher *m, int32_t *h, size_t *n, int32_t s)
{
    size_t i = (*n)++;
    while (i > 0 && m->st[h[(i - 1) / 2]].n < m->st[s].n) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = s;
}

static int32_t heap_pop(const gram_matcher *m, int32_t *h, size_t *n)
{
    int32_t top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && m->st[h[c + 1]].n > m->st[h[c]].n) c++;
        if (m->st[h[c]].n <= m->st[last].n) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

int gram_explore(gram *g, size_t *max_threads)
{
    *max_threads = 0;
    gram_matcher *m = gram_matcher_new(g, NULL);
    if (m == NULL) return -1;
    /* One byte for each set of bytes that every class treats alike. */
    uint64_t sig[256];
    uint8_t rep[256];
    size_t nrep = 0;
    for (unsigned c = 0; c < 256; c++) {
        uint64_t h = 0;
        for (size_t k = 1; k < g->ncls; k++)
            if (g->cls[k][c >> 6] >> (c & 63) & 1) h = mix(h ^ (k + 1));
        sig[c] = h;
        size_t j = 0;
        while (j < nrep && sig[rep[j]] != h) j++;
        if (j == nrep) rep[nrep++] = (uint8_t)c;
    }
    int32_t *heap = NULL;
    uint8_t *seen = NULL;
    size_t hcap = 0, scap = 0, nh = 0;
    int rc = 0;
    if (m->over)
        rc = 1;
    else if (grow((void **)&heap, &hcap, 1, sizeof *heap) != 0
             || grow((void **)&seen, &scap, m->nst + 1, 1) != 0)
        rc = -1;
    else {
        memset(seen, 0, scap);
        seen[m->cur] = 1;
        heap_push(m, heap, &nh, m->cur);
    }
    /* Largest first: a state that grows is followed before the others, so
     * a pattern whose positions pile up is found in few steps. */
    while (rc == 0 && nh > 0 && m->spent < EXPLORE_BUDGET && m->nst < DENSE_STATES) {
        int32_t s = heap_pop(m, heap, &nh);
        if (m->st[s].n > *max_threads) *max_threads = m->st[s].n;
        for (size_t k = 0; k < nrep && rc == 0; k++) {
            int32_t t = step(m, s, rep[k]);
            if (m->over)
                rc = 1;
            else if (m->broken)
                rc = -1;
            else if (t != DEAD) {
                size_t old = scap;
                if (grow((void **)&seen, &scap, (size_t)t + 1, 1) != 0
                    || grow((void **)&heap, &hcap, nh + 1, sizeof *heap) != 0) {
                    rc = -1;
                    break;
                }
                if (scap > old) memset(seen + old, 0, scap - old);
                if (!seen[t]) {
                    seen[t] = 1;
                    heap_push(m, heap, &nh, t);
                }
            }
        }
    }
    if (rc == 1) *max_threads = GRAM_MAX_THREADS + 1;
    free(heap);
    free(seen);
    gram_matcher_free(m);
    return rc;
}
