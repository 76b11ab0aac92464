/*
 * engine/sample.c: token sampling from one row of logits.
 *
 * Order: temperature scales the logits; top-k keeps the k largest; top-p
 * keeps the smallest set of the most likely tokens whose probability reaches
 * p (always at least one); a token is drawn from the renormalised rest with
 * the request's own random stream. Temperature 0 is greedy: the largest
 * logit, the lowest id among equal ones.
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void eng_rng_seed(eng_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

uint64_t eng_rng_next(eng_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double eng_rng_uniform(eng_rng *r)
{
    return (double)(eng_rng_next(r) >> 11) * 0x1.0p-53;
}

typedef struct {
    float logit;
    int32_t id;
} cand;

/* Descending logit, then ascending id: a total order, so the result does
 * not depend on the sort algorithm. */
static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Min-heap on (logit, -id): the root is the weakest of the k kept. */
static int weaker(const cand *a, const cand *b)
{
    return cand_cmp(a, b) > 0;
}

static void sift_down(cand *h, size_t n, size_t i)
{
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && weaker(&h[c + 1], &h[c])) c++;
        if (!weaker(&h[c], &h[i])) return;
        cand t = h[i];
        h[i] = h[c];
        h[c] = t;
        i = c;
    }
}

int32_t eng_sample(float *logits, size_t V, const eng_sampling *p, eng_rng *rng, void *scratch)
{
    if (p->temperature <= 0.0f) {
        size_t best = 0;
        for (size_t i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return (int32_t)best;
    }
    cand *c = scratch;
    size_t n;
    size_t k = p->top_k > 0 && (size_t)p->top_k < V ? (size_t)p->top_k : V;
    if (k < V) {
        /* Keep the k strongest with a heap: O(V log k). */
        for (size_t i = 0; i < k; i++) c[i] = (cand){logits[i], (int32_t)i};
        for (size_t i = k / 2; i-- > 0;) sift_down(c, k, i);
        for (size_t i = k; i < V; i++) {
            cand x = {logits[i], (int32_t)i};
            if (weaker(&c[0], &x)) {
                c[0] = x;
                sift_down(c, k, 0);
            }
        }
        n = k;
    } else {
        for (size_t i = 0; i < V; i++) c[i] = (cand){logits[i], (int32_t)i};
        n = V;
    }
    int need_sort = k < V || p->top_p < 1.0f;
    if (need_sort) qsort(c, n, sizeof *c, cand_cmp);
    float maxv = c[0].logit;
    if (!need_sort)
        for (size_t i = 1; i < n; i++)
            if (c[i].logit > maxv) maxv = c[i].logit;
    /* Probabilities (unnormalised), in place of the logits. */
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        c[i].logit = expf((c[i].logit - maxv) / p->temperature);
        sum += c[i].logit;
    }
    if (p->top_p < 1.0f) {
        double acc = 0;
        size_t keep = 0;
        while (keep < n) {
            acc += c[keep].logit;
            keep++;
            if (acc >= (double)p->top_p * sum) break;
        }
        n = keep;
        sum = acc;
    }
    double u = eng_rng_uniform(rng) * sum, acc = 0;
    for (size_t i = 0; i < n; i++) {
        acc += c[i].logit;
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;
}
