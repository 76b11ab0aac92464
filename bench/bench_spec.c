/*
 * bench/bench_spec.c DIR [TOKENS [STREAMS [K [ROUNDS [PROMPT_FILE [DRAFT_DIR]]]]]]:
 * speculative decoding through the scheduler (eng_sched_step on this
 * thread, the step's workers as the server has them), against plain
 * decoding, side by side: every round runs each mode once, in turn, and
 * the medians of the rounds are printed with their ratio to plain.
 * Modes: plain (speculative_tokens 0); right (a prediction that is the
 * plain output: every draft accepted, the verify step's efficiency);
 * wrong (a prediction that proposes a wrong token after each of the
 * output's: nothing accepted, the backing off's cost); lookup (prompt
 * lookup); with DRAFT_DIR, draft (that checkpoint as the draft model,
 * its own KV pool of 256 MiB). STREAMS sequences (1) of TOKENS greedy tokens (128) each after
 * the prompt: PROMPT_FILE's token ids (whitespace-separated, as `gpt2d
 * tokenize` prints them), or 16 fixed tokens. K: speculative_tokens (4).
 * Tokens are checked to be the same in every mode. The environment's
 * SPEC_MAX_BATCH sets the scheduler's spec_max_batch (default 4). A
 * benchmark, never a test.
 */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

#define MAX_STREAMS 64
#define MAX_TOKENS 1024
#define MAX_ROUNDS 15
#define MODES 5

typedef struct {
    uint64_t id;
    int32_t out[MAX_TOKENS];
    size_t n;
    size_t drafted, accepted;
} stream;

static void on_event(void *user, const eng_event *e)
{
    stream *st = user;
    if (e->kind == ENG_EV_TOKEN && st->n < MAX_TOKENS) st->out[st->n++] = e->token;
    if (e->kind == ENG_EV_DONE) {
        st->drafted = e->drafted;
        st->accepted = e->accepted;
    }
}

static const char *mode_name[MODES] = {"plain", "right", "wrong", "lookup", "draft"};

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(
            stderr,
            "usage: bench_spec DIR [TOKENS [STREAMS [K [ROUNDS [PROMPT_FILE [DRAFT_DIR]]]]]]\n");
        return 2;
    }
    size_t ntok = argc > 2 ? (size_t)atoi(argv[2]) : 128;
    size_t S = argc > 3 ? (size_t)atoi(argv[3]) : 1;
    size_t K = argc > 4 ? (size_t)atoi(argv[4]) : 4;
    int rounds = argc > 5 ? atoi(argv[5]) : 5;
    if (ntok < 2 || ntok > MAX_TOKENS / 2 || S < 1 || S > MAX_STREAMS || K < 1 || K > ENG_SPEC_MAX
        || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "bench_spec: TOKENS 2..%d, STREAMS 1..%d, K 1..%d, ROUNDS 1..%d\n",
                MAX_TOKENS / 2, MAX_STREAMS, ENG_SPEC_MAX, MAX_ROUNDS);
        return 2;
    }
    int32_t prompt[MAX_TOKENS];
    size_t np = 0;
    if (argc > 6 && strcmp(argv[6], "-") != 0) {
        FILE *f = fopen(argv[6], "r");
        if (f == NULL) {
            perror(argv[6]);
            return 1;
        }
        int v;
        while (np < MAX_TOKENS && fscanf(f, "%d", &v) == 1) prompt[np++] = v;
        fclose(f);
    } else {
        for (; np < 16; np++) prompt[np] = (int32_t)(464 + np * 97);
    }
    char err[512];
    eng_model *m;
    if (eng_model_load(argv[1], &m, err, sizeof err) != ENG_OK) {
        fprintf(stderr, "bench_spec: %s\n", err);
        return 1;
    }
    eng_model *draft = NULL;
    if (argc > 7 && eng_model_load(argv[7], &draft, err, sizeof err) != ENG_OK) {
        fprintf(stderr, "bench_spec: %s\n", err);
        return 1;
    }
    int modes = draft != NULL ? MODES : MODES - 1;
    eng_sched_opts o = {.kv_bytes = (size_t)2 << 30,
                        .prefix_cache = 0,
                        .draft = draft,
                        .draft_kv_bytes = (size_t)256 << 20,
                        /* SPEC_MAX_BATCH: the threshold's measurement */
                        .spec_max_batch = getenv("SPEC_MAX_BATCH") != NULL
                                              ? (size_t)atoi(getenv("SPEC_MAX_BATCH"))
                                              : 0};
    eng_sched *s;
    if (eng_sched_new(m, &o, &s, err, sizeof err) != ENG_OK
        || eng_sched_warmup(s, err, sizeof err) != ENG_OK) {
        fprintf(stderr, "bench_spec: %s\n", err);
        return 1;
    }
    static stream st[MAX_STREAMS], ref[MAX_STREAMS];
    static int32_t pred[MAX_STREAMS][2 * MAX_TOKENS];
    double tps[MODES][MAX_ROUNDS];
    size_t drafted[MODES] = {0}, accepted[MODES] = {0};
    double part[MODES][5] = {{0}};
    uint64_t steps[MODES] = {0};
    for (int r = 0; r < rounds; r++)
        for (int mode = 0; mode < modes; mode++) {
            eng_sched_stats before, after;
            eng_sched_stats_get(s, &before);
            for (size_t i = 0; i < S; i++) {
                memset(&st[i], 0, sizeof st[i]);
                size_t npred = 0;
                if (mode == 1) {
                    memcpy(pred[i], ref[i].out, ref[i].n * sizeof(int32_t));
                    npred = ref[i].n;
                } else if (mode == 2) {
                    for (size_t k = 0; k < ref[i].n; k++) {
                        pred[i][npred++] = ref[i].out[k];
                        pred[i][npred++] = ref[i].out[k] == 0 ? 1 : 0;
                    }
                }
                eng_request q = {.prompt = prompt,
                                 .nprompt = np,
                                 .max_tokens = ntok,
                                 .sampling = {.temperature = 0, .top_p = 1},
                                 .ignore_eos = 1,
                                 .logprobs = -1,
                                 .speculative_tokens = mode == 0 ? 0 : K,
                                 .drafter = mode == 3   ? ENG_DRAFT_LOOKUP
                                            : mode == 4 ? ENG_DRAFT_MODEL
                                                        : ENG_DRAFT_PREDICTION,
                                 .prediction = npred ? pred[i] : NULL,
                                 .nprediction = npred,
                                 .tenant = i,
                                 .on_event = on_event,
                                 .user = &st[i]};
                if (eng_sched_submit(s, &q, &st[i].id, err, sizeof err) != ENG_OK) {
                    fprintf(stderr, "bench_spec: %s\n", err);
                    return 1;
                }
            }
            /* The prompts' prefill is the same in every mode; time it all. */
            double t0 = now();
            while (eng_sched_step(s)) {
            }
            double t = now() - t0;
            eng_sched_stats_get(s, &after);
            tps[mode][r] = (double)(after.tokens_generated - before.tokens_generated) / t;
            part[mode][0] += after.times.matmul - before.times.matmul;
            part[mode][1] += after.times.attention - before.times.attention;
            part[mode][2] += after.times.lm_head - before.times.lm_head;
            part[mode][3] += after.times.other - before.times.other;
            part[mode][4] += after.times.sample - before.times.sample;
            steps[mode] += after.steps - before.steps;
            for (size_t i = 0; i < S; i++) {
                if (mode == 0 && r == 0) ref[i] = st[i];
                if (st[i].n != ref[i].n || memcmp(st[i].out, ref[i].out, st[i].n * 4) != 0) {
                    fprintf(stderr, "bench_spec: %s gave other tokens than plain\n",
                            mode_name[mode]);
                    return 1;
                }
                drafted[mode] += st[i].drafted;
                accepted[mode] += st[i].accepted;
            }
        }
    printf("bench_spec: %s (%s, kernels %s), %zu stream(s), %zu-token prompt, %zu tokens, "
           "k=%zu, %d rounds\n",
           argv[1], eng_model_dtype(m), eng_model_kernels(m), S, np, ntok, K, rounds);
    double base = 0;
    for (int mode = 0; mode < modes; mode++) {
        qsort(tps[mode], (size_t)rounds, sizeof(double), cmp_double);
        double med = tps[mode][rounds / 2];
        if (mode == 0) base = med;
        printf("  %-6s %8.1f tok/s (median)  %.2fx plain   drafted %zu accepted %zu (%.0f%%)\n",
               mode_name[mode], med, med / base, drafted[mode], accepted[mode],
               drafted[mode] ? 100.0 * (double)accepted[mode] / (double)drafted[mode] : 0.0);
        printf("         %.0f steps a round; ms a round: matmul %.1f attention %.1f lm_head %.1f "
               "other %.1f sample %.1f\n",
               (double)steps[mode] / rounds, 1e3 * part[mode][0] / rounds,
               1e3 * part[mode][1] / rounds, 1e3 * part[mode][2] / rounds,
               1e3 * part[mode][3] / rounds, 1e3 * part[mode][4] / rounds);
    }
    eng_sched_free(s);
    eng_model_free(draft);
    eng_model_free(m);
    return 0;
}
