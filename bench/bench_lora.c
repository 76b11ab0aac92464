/*
 * bench/bench_lora.c MODEL ADAPTER... [--tokens N] [--rounds R]: LoRA
 * adapters served unmerged through the scheduler (eng_sched_step on this
 * thread, the step's workers as the server has them), side by side with
 * the base model: every round runs each mode once, in turn, and the
 * medians of the rounds are printed with their ratio to the base.
 * Modes: 16 base streams; 16 streams spread over the adapters (stream i
 * takes adapter i % nadapters), their factors in F32 and in BF16; one
 * stream without an adapter, with one (F32, BF16). Each stream decodes N
 * greedy tokens (64) after a 16-token prompt of its own; the rate is the
 * tokens of all streams over the wall time from the first submit to the
 * last DONE. Also each adapter's load time (eng_adapter_load: read,
 * validate, widen, transpose), the median over the rounds. A benchmark,
 * never a test.
 */
#include "engine.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

#define MAX_ADAPTERS 16
#define MAX_ROUNDS 15
#define STREAMS 16
#define PROMPT 16
enum { BASE16, LORA16, LORA16_BF16, BASE1, LORA1, LORA1_BF16, MODES };
static const char *const mode_name[MODES] = {"16 streams, base",
                                             "16 streams over the adapters (F32)",
                                             "16 streams over the adapters (BF16)",
                                             "1 stream, base",
                                             "1 stream, adapter (F32)",
                                             "1 stream, adapter (BF16)"};

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

typedef struct {
    uint64_t id;
    size_t n;
    int done;
} stream;

static void on_event(void *user, const eng_event *e)
{
    stream *st = user;
    if (e->kind == ENG_EV_TOKEN) st->n++;
    if (e->kind == ENG_EV_DONE) st->done = 1;
}

/* Tokens a second of nstreams streams of `tokens` tokens each, stream i
 * with ad[i % nad] (nad 0: the base). */
static double run(const eng_model *m, eng_adapter *const *ad, size_t nad, size_t nstreams,
                  size_t tokens)
{
    eng_sched_opts o = {.kv_bytes = (size_t)1 << 30, .prefix_cache = 0};
    eng_sched *s;
    char err[256];
    if (eng_sched_new(m, &o, &s, err, sizeof err) != ENG_OK
        || eng_sched_warmup(s, err, sizeof err) != ENG_OK) {
        fprintf(stderr, "bench_lora: %s\n", err);
        exit(1);
    }
    stream st[STREAMS] = {0};
    int32_t prompt[STREAMS][PROMPT];
    size_t V = eng_model_config(m)->n_vocab;
    double t0 = now();
    for (size_t i = 0; i < nstreams; i++) {
        for (size_t k = 0; k < PROMPT; k++) prompt[i][k] = (int32_t)((i * 977 + k * 131 + 7) % V);
        eng_request r = {.prompt = prompt[i],
                         .nprompt = PROMPT,
                         .max_tokens = tokens,
                         .sampling = {.temperature = 0, .top_p = 1},
                         .ignore_eos = 1,
                         .logprobs = -1,
                         .adapter = nad ? ad[i % nad] : NULL,
                         .on_event = on_event,
                         .user = &st[i]};
        if (eng_sched_submit(s, &r, &st[i].id, err, sizeof err) != ENG_OK) {
            fprintf(stderr, "bench_lora: %s\n", err);
            exit(1);
        }
    }
    while (eng_sched_step(s)) {
    }
    double dt = now() - t0;
    size_t total = 0;
    for (size_t i = 0; i < nstreams; i++) total += st[i].n;
    eng_sched_free(s);
    return (double)total / dt;
}

/* The bytes of DIR/adapter_model.safetensors past its header (its
 * tensors'), or 0 when it cannot be read: what an adapter resident in
 * memory is held to (issue 36: within 1.1x). */
static size_t file_tensor_bytes(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    FILE *f = fopen(path, "rb");
    unsigned char h[8];
    size_t n = 0;
    if (f != NULL && fread(h, 1, 8, f) == 8 && fseek(f, 0, SEEK_END) == 0) {
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | h[i];
        long end = ftell(f);
        if (end > 0 && (uint64_t)end >= 8 + hl) n = (size_t)((uint64_t)end - 8 - hl);
    }
    if (f != NULL) fclose(f);
    return n;
}

int main(int argc, char **argv)
{
    const char *dirs[MAX_ADAPTERS];
    size_t nad = 0, tokens = 64, rounds = 3;
    const char *model_dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc)
            tokens = strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = strtoul(argv[++i], NULL, 10);
        else if (model_dir == NULL)
            model_dir = argv[i];
        else if (nad < MAX_ADAPTERS)
            dirs[nad++] = argv[i];
    }
    if (model_dir == NULL || nad == 0 || tokens == 0 || rounds == 0 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "usage: bench_lora MODEL ADAPTER... [--tokens N] [--rounds R (<= 15)]\n");
        return 2;
    }
    char err[512];
    eng_model *m;
    if (eng_model_load(model_dir, &m, err, sizeof err) != ENG_OK) {
        fprintf(stderr, "bench_lora: %s\n", err);
        return 1;
    }
    eng_adapter *f32[MAX_ADAPTERS], *b16[MAX_ADAPTERS];
    double load_ms[MAX_ADAPTERS][MAX_ROUNDS], load_b16_ms[MAX_ROUNDS];
    for (size_t r = 0; r < rounds; r++)
        for (size_t a = 0; a < nad; a++) {
            double t0 = now();
            if (eng_adapter_load(m, dirs[a], ENG_ADAPTER_F32, &f32[a], err, sizeof err) != ENG_OK) {
                fprintf(stderr, "bench_lora: %s\n", err);
                return 1;
            }
            load_ms[a][r] = (now() - t0) * 1e3;
            if (r + 1 < rounds) eng_adapter_free(f32[a]);
        }
    for (size_t r = 0; r < rounds; r++) {
        for (size_t a = 0; a < nad; a++) {
            double t0 = now();
            if (eng_adapter_load(m, dirs[a], ENG_ADAPTER_BF16, &b16[a], err, sizeof err)
                != ENG_OK) {
                fprintf(stderr, "bench_lora: %s\n", err);
                return 1;
            }
            if (a == 0) load_b16_ms[r] = (now() - t0) * 1e3;
            if (r + 1 < rounds) eng_adapter_free(b16[a]);
        }
    }
    printf("model %s (%s, %s, kernels %s), %zu adapters, %zu tokens a stream, %zu rounds\n",
           model_dir, eng_model_dtype(m), eng_model_layout(m), eng_model_kernels(m), nad, tokens,
           rounds);
    for (size_t a = 0; a < nad; a++) {
        size_t fb = file_tensor_bytes(dirs[a]);
        printf("adapter %s: rank %zu, %zu bytes resident (F32 asked; the file's tensors %zu "
               "bytes, %.2fx); load %.1f ms (median)\n",
               dirs[a], eng_adapter_rank(f32[a]), eng_adapter_bytes(f32[a]), fb,
               fb ? (double)eng_adapter_bytes(f32[a]) / (double)fb : 0.0,
               median(load_ms[a], rounds));
    }
    printf("adapter %s as BF16: load %.1f ms (median)\n", dirs[0], median(load_b16_ms, rounds));
    double rate[MODES][MAX_ROUNDS];
    for (size_t r = 0; r < rounds; r++)
        for (int md = 0; md < MODES; md++) {
            eng_adapter *const *set = md == LORA16 || md == LORA1 ? f32 : b16;
            size_t n = md <= LORA16_BF16 ? STREAMS : 1;
            size_t k = md == BASE16 || md == BASE1 ? 0 : nad;
            rate[md][r] = run(m, set, k, n, tokens);
            fprintf(stderr, "round %zu: %s: %.1f tok/s\n", r + 1, mode_name[md], rate[md][r]);
        }
    double med[MODES];
    for (int md = 0; md < MODES; md++) med[md] = median(rate[md], rounds);
    printf("%-40s %10s %8s\n", "mode", "tok/s", "ratio");
    for (int md = 0; md < MODES; md++)
        printf("%-40s %10.1f %8.3f\n", mode_name[md], med[md],
               med[md] / med[md <= LORA16_BF16 ? BASE16 : BASE1]);
    for (size_t a = 0; a < nad; a++) {
        eng_adapter_free(f32[a]);
        eng_adapter_free(b16[a]);
    }
    eng_model_free(m);
    return 0;
}
