/*
 * engine/sample.c: token sampling from one row of logits.
 *
 * Order: temperature scales the logits; top-k keeps the k largest; top-p
 * keeps the smallest set of the most likely tokens whose probability reaches
 * p (always at least one); a token is drawn from the renormalised rest with
 * the request's own random stream. Temperature 0 is greedy: the largest
 * logit, the lowest id among equal ones.
 *
 * Cost per row of GPT-2's 50,257 logits: one pass of the engine's vector
 * exp, then a draw by blocks, or for top-p two bucketing passes over the
 * weights and a sort of one small bucket (sorting the vocabulary took ~6 ms
 * a row). With top-k, a heap keeps the k strongest and only they are sorted.
 *
 * Before the draw, samp_row shapes a sequence's row (logit bias, presence
 * and frequency penalties, then a structured output's token mask;
 * internal.h, samp_seq) and takes the logprobs of the row as the model gave
 * it (before the mask); the scheduler only hands rows over. Temperature,
 * top-k and top-p then apply to the masked row.
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x)
{
    return gpt2_mix64(*x += 0x9E3779B97F4A7C15ull);
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
    float logit; /* a logit, or a weight exp((logit - max) / T) */
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

/*
 * Scratch: NBUCKET doubles (the bucket masses of the nucleus search, or the
 * block sums of a draw over the whole vocabulary), then V candidates.
 */
#define NBUCKET 2048 /* 11 bits of a weight's float bits per level */
#define DRAW_BLOCK 64

static size_t ndoubles(size_t V)
{
    size_t blocks = (V + DRAW_BLOCK - 1) / DRAW_BLOCK;
    return blocks > NBUCKET ? blocks : NBUCKET;
}

size_t eng_sample_scratch_bytes(size_t V)
{
    return ndoubles(V) * sizeof(double) + V * sizeof(cand);
}

/* A draw from the candidates c[0..n) in their order, by their weights. */
static int32_t draw_cands(const cand *c, size_t n, eng_rng *rng)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += c[i].logit;
    double u = eng_rng_uniform(rng) * sum, acc = 0;
    for (size_t i = 0; i < n; i++) {
        acc += c[i].logit;
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;
}

/* A draw over all of w[0..V) in id order. The sums of blocks of 64 find the
 * block, then the block is summed again in the same order: the running sum
 * at a block's end is bitwise the one the block search used, so the draw
 * always lands (every weight is > 0: op_exp_sub_sum's floor is exp(-87)). */
static int32_t draw_all(const float *w, size_t V, eng_rng *rng, double *bsum)
{
    size_t nb = (V + DRAW_BLOCK - 1) / DRAW_BLOCK;
    double total = 0;
    for (size_t b = 0; b < nb; b++) {
        size_t i1 = (b + 1) * DRAW_BLOCK < V ? (b + 1) * DRAW_BLOCK : V;
        double s = 0;
        for (size_t i = b * DRAW_BLOCK; i < i1; i++) s += w[i];
        bsum[b] = s;
        total += s;
    }
    double u = eng_rng_uniform(rng) * total, acc = 0;
    for (size_t b = 0; b < nb; b++) {
        if (u < acc + bsum[b] || b + 1 == nb) {
            size_t i1 = (b + 1) * DRAW_BLOCK < V ? (b + 1) * DRAW_BLOCK : V;
            double s = 0;
            for (size_t i = b * DRAW_BLOCK; i < i1; i++) {
                s += w[i];
                if (u < acc + s) return (int32_t)i;
            }
            return (int32_t)(i1 - 1);
        }
        acc += bsum[b];
    }
    return (int32_t)(V - 1);
}

static uint32_t wbits(float w)
{
    uint32_t k;
    memcpy(&k, &w, sizeof k);
    return k;
}

/* Walks mass[] from the heaviest bucket down, adding to *cum, and returns
 * the first bucket at which *cum would reach target (*cum then holds the
 * mass above it); the lightest non-empty bucket if rounding never lets it. */
static size_t walk_buckets(const double *mass, double *cum, double target)
{
    size_t lo = 0;
    while (lo + 1 < NBUCKET && mass[lo] == 0) lo++;
    for (size_t b = NBUCKET; b-- > lo;) {
        if (mass[b] == 0) continue;
        if (*cum + mass[b] >= target || b == lo) return b;
        *cum += mass[b];
    }
    return lo;
}

/*
 * Top-p over positive weights w[0..V): the smallest set of the heaviest
 * weights whose mass reaches top_p of the total, found without sorting the
 * vocabulary. A positive float's bits order like its value, so the weights
 * are bucketed by their top 11 bits (sign 0, exponent, 3 mantissa bits),
 * the bucket where the running mass crosses the target is split again by
 * the next 11 bits, and only the weights of that final bucket are sorted.
 * The kept set is written to c in draw order: every weight above the final
 * bucket in id order, then the final bucket's heaviest first. Returns its
 * size (at least 1).
 */
static size_t nucleus(const float *w, size_t V, float top_p, double *mass, cand *c)
{
    memset(mass, 0, NBUCKET * sizeof *mass);
    for (size_t i = 0; i < V; i++) mass[(wbits(w[i]) >> 20) & 0x7FF] += w[i];
    double total = 0;
    for (size_t b = NBUCKET; b-- > 0;) total += mass[b];
    double target = (double)top_p * total, cum = 0;
    uint32_t b1 = (uint32_t)walk_buckets(mass, &cum, target);
    memset(mass, 0, NBUCKET * sizeof *mass);
    for (size_t i = 0; i < V; i++) {
        uint32_t k = wbits(w[i]);
        if (((k >> 20) & 0x7FF) == b1) mass[(k >> 9) & 0x7FF] += w[i];
    }
    uint32_t b2 = (uint32_t)walk_buckets(mass, &cum, target);
    uint32_t edge = (b1 << 11) | b2; /* the final bucket: bits 31..9 of its weights */
    size_t n = 0;
    for (size_t i = 0; i < V; i++)
        if (((wbits(w[i]) >> 9) & 0x3FFFFF) > edge) c[n++] = (cand){w[i], (int32_t)i};
    size_t above = n;
    for (size_t i = 0; i < V; i++)
        if (((wbits(w[i]) >> 9) & 0x3FFFFF) == edge) c[n++] = (cand){w[i], (int32_t)i};
    qsort(c + above, n - above, sizeof *c, cand_cmp);
    size_t keep = above;
    while (keep < n) {
        cum += c[keep].logit;
        keep++;
        if (cum >= target) break;
    }
    return keep > 0 ? keep : 1;
}

/* The lowest index of the row's maximum: the maximum first, in 16
 * independent lanes (no chain of dependent compares: a fifth of the time
 * of one loop over GPT-2's 50,257 logits), then the first index that holds
 * it. */
static size_t argmax_first(const float *x, size_t V)
{
    float m[16];
    size_t n = V < 16 ? V : 16, i;
    for (i = 0; i < 16; i++) m[i] = x[i < n ? i : 0];
    for (i = 16; i + 16 <= V; i += 16)
        for (size_t j = 0; j < 16; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    for (; i < V; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
    float best = m[0];
    for (size_t j = 1; j < 16; j++) best = m[j] > best ? m[j] : best;
    for (i = 0; i < V; i++)
        if (x[i] == best) return i;
    return 0; /* no finite maximum (NaN): the first, as a compare chain gives */
}

int32_t eng_sample(float *logits, size_t V, const eng_sampling *p, eng_rng *rng, void *scratch)
{
    if (p->temperature <= 0.0f) return (int32_t)argmax_first(logits, V);
    double *dbl = scratch;
    cand *c = (cand *)(dbl + ndoubles(V));
    size_t k = p->top_k > 0 && (size_t)p->top_k < V ? (size_t)p->top_k : V;
    if (k == V) {
        /* No top-k: weights for the whole vocabulary in place, then either
         * a draw over all of it or the nucleus. */
        float maxv = logits[0];
        for (size_t i = 1; i < V; i++)
            if (logits[i] > maxv) maxv = logits[i];
        for (size_t i = 0; i < V; i++) logits[i] = (logits[i] - maxv) / p->temperature;
        op_exp_sub_sum(logits, V, 0.0f);
        if (p->top_p >= 1.0f) return draw_all(logits, V, rng, dbl);
        return draw_cands(c, nucleus(logits, V, p->top_p, dbl, c), rng);
    }
    /* Keep the k strongest with a heap: O(V log k), then sort those k. */
    for (size_t i = 0; i < k; i++) c[i] = (cand){logits[i], (int32_t)i};
    for (size_t i = k / 2; i-- > 0;) sift_down(c, k, i);
    for (size_t i = k; i < V; i++) {
        cand x = {logits[i], (int32_t)i};
        if (weaker(&c[0], &x)) {
            c[0] = x;
            sift_down(c, k, 0);
        }
    }
    qsort(c, k, sizeof *c, cand_cmp);
    float maxv = c[0].logit;
    double sum = 0;
    for (size_t i = 0; i < k; i++) {
        c[i].logit = expf((c[i].logit - maxv) / p->temperature);
        sum += c[i].logit;
    }
    size_t n = k;
    if (p->top_p < 1.0f) {
        double acc = 0;
        size_t keep = 0;
        while (keep < n) {
            acc += c[keep].logit;
            keep++;
            if (acc >= (double)p->top_p * sum) break;
        }
        n = keep;
    }
    return draw_cands(c, n, rng);
}

/* ---- One sequence's row: shaping, the draw, logprobs ------------------- */

eng_status samp_thread_init(samp_thread *th, size_t V)
{
    *th = (samp_thread){0};
    th->scratch = malloc(eng_sample_scratch_bytes(V));
    th->raw = malloc(V * sizeof *th->raw);
    th->stamp = calloc(V, sizeof *th->stamp);
    if (th->scratch == NULL || th->raw == NULL || th->stamp == NULL) {
        samp_thread_fini(th);
        return ENG_ENOMEM;
    }
    return ENG_OK;
}

void samp_thread_fini(samp_thread *th)
{
    free(th->scratch);
    free(th->raw);
    free(th->stamp);
    *th = (samp_thread){0};
}

/* log-softmax facts of raw logits: the log of the partition function. */
static double log_partition(const float *x, size_t V)
{
    float maxv = x[0];
    for (size_t i = 1; i < V; i++)
        if (x[i] > maxv) maxv = x[i];
    double sum = 0;
    for (size_t i = 0; i < V; i++) sum += exp((double)(x[i] - maxv));
    return (double)maxv + log(sum);
}

void samp_logprobs(eng_event *ev, const float *x, size_t V, int32_t chosen, int n)
{
    double lz = log_partition(x, V);
    ev->logprob = (float)(x[chosen] - lz);
    size_t want = n > 0 ? (size_t)n : 0, have = 0;
    if (want > V) want = V;
    /* One pass keeping the n largest in order (n <= 5). Ties: lower id
     * first, so a later id enters only when strictly larger. */
    for (size_t i = 0; i < V && want > 0; i++) {
        if (have == want && !(x[i] > x[ev->top_ids[have - 1]])) continue;
        size_t j = have < want ? have++ : have - 1;
        while (j > 0 && x[i] > x[ev->top_ids[j - 1]]) {
            ev->top_ids[j] = ev->top_ids[j - 1];
            j--;
        }
        ev->top_ids[j] = (int32_t)i;
    }
    ev->ntop = have;
    for (size_t k = 0; k < have; k++) ev->top_logprobs[k] = (float)(x[ev->top_ids[k]] - lz);
}

/* The distribution q samples from: the bias, then the penalties, then the
 * structured outputs' mask (a disallowed token's logit becomes -inf), in
 * place. */
static void shape_row(float *row, size_t V, const samp_seq *q, samp_thread *th)
{
    const eng_sampling *sp = q->sp;
    for (size_t b = 0; b < sp->nbias; b++) row[sp->bias[b].token] += sp->bias[b].bias;
    if (sp->presence_penalty != 0 || sp->frequency_penalty != 0) {
        th->stamp_now++;
        for (size_t g = 0; g < q->ngenerated; g++) {
            int32_t t = q->generated[g];
            row[t] -= sp->frequency_penalty;
            if (th->stamp[t] != th->stamp_now) {
                th->stamp[t] = th->stamp_now;
                row[t] -= sp->presence_penalty;
            }
        }
    }
    if (q->allow != NULL)
        for (size_t i = 0; i < V; i++)
            if (!(q->allow[i >> 6] >> (i & 63) & 1)) row[i] = -INFINITY;
}

/* The strongest allowed token of row (masked draws only: see samp_row). */
static int32_t best_allowed(const float *row, size_t V, const uint64_t *allow)
{
    int32_t best = -1;
    for (size_t i = 0; i < V; i++)
        if ((allow[i >> 6] >> (i & 63) & 1) && (best < 0 || row[i] > row[best])) best = (int32_t)i;
    return best < 0 ? 0 : best;
}

void samp_row(eng_event *ev, samp_thread *th, float *row, size_t V, const samp_seq *q, eng_rng *rng)
{
    if (q->logprobs >= 0) memcpy(th->raw, row, V * sizeof *row);
    shape_row(row, V, q, th);
    if (q->allow != NULL && q->logprobs < 0) memcpy(th->raw, row, V * sizeof *row);
    ev->token = eng_sample(row, V, q->sp, rng, th->scratch);
    /* The vector exp floors a weight at exp(-87), so a masked token keeps a
     * weight of about 1e-38 and a draw could land on it once in 1e33: then
     * the strongest allowed token is taken instead, the same every time. */
    if (q->allow != NULL && !(q->allow[ev->token >> 6] >> (ev->token & 63) & 1)) {
        if (q->logprobs >= 0) { /* th->raw holds the unshaped row: shape it again */
            memcpy(row, th->raw, V * sizeof *row);
            shape_row(row, V, q, th);
        } else
            memcpy(row, th->raw, V * sizeof *row);
        ev->token = best_allowed(row, V, q->allow);
    }
    if (q->logprobs >= 0) samp_logprobs(ev, th->raw, V, ev->token, q->logprobs);
}
