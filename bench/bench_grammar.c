/*
 * bench/bench_grammar.c VOCAB_DIR SCHEMA.json...: structured outputs' costs
 * (structured/include/structured.h) over GPT-2's vocabulary.
 *
 * For each schema: the compile time (the fastest and the median of 20
 * compiles, no cache), then a walk of up to 200 steps, each a mask and a
 * token drawn uniformly from it (seeded, so runs compare), run RUNS times
 * from fresh matchers, each step's time its fastest run: the mean, the
 * median, the worst step and the steps walked (a state seen before reuses
 * its mask; a new one walks the trie).
 * Last, the worst case on purpose: a fresh matcher inside an unconstrained
 * string, where nearly every token is allowed and the whole trie is walked;
 * then hostile regexes (many simultaneous positions), each after a prefix
 * that piles positions up: refused at compile, or the mask's time and work
 * (GRAM_MASK_BUDGET's unit), or the bound that ended the walk.
 * Compare a mask with a decode step of `bench_decode DIR STEPS 0 16`
 * (docs/benchmarks.md). A benchmark, never a test.
 */
#include "structured.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

#define RUNS 5

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    char *b = malloc(1 << 20);
    *len = b ? fread(b, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (b) b[*len] = '\0';
    return b;
}

static uint64_t rng = 42;
static uint64_t rnd(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return rng >> 11;
}

/* Regexes whose states hold many positions, each with a prefix (a byte
 * repeated) that reaches a wide state: refused, or one mask's cost. */
static void hostile(const gram_vocab *v)
{
    static const struct {
        const char *re, *byte;
        int reps;
    } h[] = {
        {"(.?){1000}", "x", 0},         {"(.?){400}", "x", 0},
        {"(a?a?){1000}b", "a", 0},      {".{0,500}x.{0,500}", "x", 400},
        {".{0,100}x.{0,100}", "x", 90}, {"(x|xx|xxx)*y.{0,300}", "x", 200},
    };
    printf("%-24s %5s | %9s %10s  %s\n", "hostile regex", "after", "mask", "work", "outcome");
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) {
        gram *g;
        gram_error ge;
        double c0 = now();
        if (gram_compile(GRAM_REGEX, h[i].re, strlen(h[i].re), &g, &ge) != 0) {
            printf("%-24s %5d | refused at compile (%.1f ms): %.60s\n", h[i].re, h[i].reps,
                   (now() - c0) * 1e3, ge.message);
            continue;
        }
        gram_matcher *m = gram_matcher_new(g, v);
        for (int k = 0; k < h[i].reps; k++) gram_matcher_feed_bytes(m, h[i].byte, 1);
        size_t na;
        double m0 = now();
        gram_matcher_mask(m, &na);
        double dt = now() - m0;
        const char *why = gram_matcher_error(m);
        printf("%-24s %5d | %7.3fms %10llu  %s\n", h[i].re, h[i].reps, dt * 1e3,
               (unsigned long long)gram_matcher_work(m), why ? why : "allowed");
        gram_matcher_free(m);
        gram_unref(g);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_grammar VOCAB_DIR SCHEMA.json...\n");
        return 2;
    }
    char err[256];
    bpe *tok;
    if (bpe_load_dir(argv[1], &tok, err, sizeof err) != BPE_OK) {
        fprintf(stderr, "bench_grammar: %s\n", err);
        return 1;
    }
    size_t V = bpe_vocab_size(tok);
    const char **tb = malloc(V * sizeof *tb);
    size_t *tl = malloc(V * sizeof *tl);
    int32_t *allowed = malloc(V * sizeof *allowed);
    for (size_t i = 0; i < V; i++) tb[i] = bpe_token_bytes(tok, (int32_t)i, &tl[i]);
    gram_vocab *v;
    double t0 = now();
    if (gram_vocab_new(tb, tl, V, BPE_EOT, &v) != 0) return 1;
    printf("vocabulary trie: %zu tokens, %zu nodes, built in %.1f ms\n", V,
           gram_vocab_trie_nodes(v), (now() - t0) * 1e3);
    printf("%-18s %8s %8s %7s | %9s %9s %9s %6s %9s\n", "schema", "compile", "median", "nodes",
           "mask mean", "median", "worst", "steps", "max work");
    double worst_all = 0;
    for (int a = 2; a < argc; a++) {
        size_t len;
        char *src = slurp(argv[a], &len);
        if (src == NULL) {
            fprintf(stderr, "bench_grammar: cannot read %s\n", argv[a]);
            return 1;
        }
        double ct[20];
        gram *g = NULL;
        gram_error ge;
        for (int k = 0; k < 20; k++) {
            gram_unref(g);
            double c0 = now();
            if (gram_compile(GRAM_SCHEMA, src, len, &g, &ge) != 0) {
                fprintf(stderr, "%s: %s at %s: %s\n", argv[a], ge.keyword, ge.path, ge.message);
                return 1;
            }
            ct[k] = now() - c0;
        }
        qsort(ct, 20, sizeof ct[0], cmp_double);
        /* The same walk (the same seed) RUNS times, each from a fresh
         * matcher; a step's time is its fastest run (the machine's noise
         * only ever adds). */
        double mt[200];
        int n = 0;
        uint64_t wmax = 0;
        for (int run = 0; run < RUNS; run++) {
            gram_matcher *m = gram_matcher_new(g, v);
            rng = 42;
            int k_steps = 0;
            for (; k_steps < 200; k_steps++) {
                size_t na;
                double m0 = now();
                const uint64_t *mask = gram_matcher_mask(m, &na);
                double dt = now() - m0;
                mt[k_steps] = run == 0 || dt < mt[k_steps] ? dt : mt[k_steps];
                if (gram_matcher_work(m) > wmax) wmax = gram_matcher_work(m);
                size_t k = 0;
                for (size_t i = 0; i < V; i++)
                    if (mask[i >> 6] >> (i & 63) & 1) allowed[k++] = (int32_t)i;
                if (k == 0) break;
                int32_t id = allowed[rnd() % k];
                int eot = mask[BPE_EOT >> 6] >> (BPE_EOT & 63) & 1;
                if (eot && rnd() % 2 == 0) id = BPE_EOT;
                gram_matcher_feed(m, id);
                if (id == BPE_EOT) {
                    k_steps++;
                    break;
                }
            }
            n = k_steps;
            gram_matcher_free(m);
        }
        double sum = 0;
        for (int i = 0; i < n; i++) sum += mt[i];
        double worst = 0;
        for (int i = 0; i < n; i++) worst = mt[i] > worst ? mt[i] : worst;
        worst_all = worst > worst_all ? worst : worst_all;
        qsort(mt, (size_t)n, sizeof mt[0], cmp_double);
        const char *name = strrchr(argv[a], '/') ? strrchr(argv[a], '/') + 1 : argv[a];
        printf("%-18s %6.3fms %6.3fms %7zu | %7.3fms %7.3fms %7.3fms %6d %9llu\n", name,
               ct[0] * 1e3, ct[10] * 1e3, gram_nodes(g), sum / n * 1e3, mt[n / 2] * 1e3,
               worst * 1e3, n, (unsigned long long)wmax);
        gram_unref(g);
        free(src);
    }
    /* The worst case on purpose: inside a free string, from cold. */
    gram *g;
    gram_error ge;
    const char *s = "{\"type\":\"string\"}";
    gram_compile(GRAM_SCHEMA, s, strlen(s), &g, &ge);
    double best = 1e9;
    for (int k = 0; k < 5; k++) {
        gram_matcher *m = gram_matcher_new(g, v);
        gram_matcher_feed_bytes(m, "\"", 1);
        size_t na;
        double m0 = now();
        gram_matcher_mask(m, &na);
        double dt = now() - m0;
        best = dt < best ? dt : best;
        if (k == 0)
            printf("inside a free string, cold: %zu tokens allowed, work %llu", na,
                   (unsigned long long)gram_matcher_work(m));
        gram_matcher_free(m);
    }
    printf(", the trie walk %.3f ms (fastest of 5)\n", best * 1e3);
    hostile(v);
    printf("worst mask of the corpus walks: %.3f ms\n", worst_all * 1e3);
    gram_unref(g);
    gram_vocab_free(v);
    free(tb);
    free(tl);
    free(allowed);
    bpe_free(tok);
    return 0;
}
