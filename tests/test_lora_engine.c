/*
 * tests/test_lora_engine.c: LoRA adapters served unmerged by the engine
 * (engine/adapter.c, engine/op_lora.c, eng_item.adapter,
 * eng_request.adapter) on tiny `gpt2d synth` checkpoints in every weight
 * format and layout.
 *
 * Bitwise: a sequence with an adapter gets the same logits alone, in
 * batches of every row count the matmul tests use (1..70) beside rows of
 * another adapter, of the same adapter and of the base model, and in
 * prefill chunks of every size; base rows beside adapters keep the base's
 * bits. Numerically: base + adapter against `gpt2d lora merge`'s merged
 * checkpoint, within the engine-vs-numpy tolerance of the tiny models
 * (1e-4). The prefix cache: a prompt under one adapter never takes blocks
 * computed under another or under the base, even with every hash
 * colliding. Adapters are written here in PEFT's layout with random
 * factors (tools' deterministic RNG through eng_rng).
 */
#include "internal.h"
#include "lora.h"
#include "safetensors.h"
#include "step.h"
#include "tools.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "testutil.h"

static char dir[128];

/* The formats every test runs on, by loop index. */
static const char *const models[] = {"f32",       "f16",        "bf16",    "q8",
                                     "f32_panel", "bf16_panel", "q8_panel"};
#define N_MODELS (sizeof models / sizeof *models)

static void path_of(char *out, size_t n, const char *sub, const char *file)
{
    snprintf(out, n, "%s/%s%s%s", dir, sub, file ? "/" : "", file ? file : "");
}

static void copy_config(const char *from, const char *to)
{
    char cmd[800];
    snprintf(cmd, sizeof cmd, "cp '%s/%s/config.json' '%s/%s/'", dir, from, dir, to);
    ck_assert_int_eq(system(cmd), 0);
}

static void convert(const char *to, const char *dtype, const char *layout)
{
    char in[320], out[320];
    path_of(out, sizeof out, to, NULL);
    mkdir(out, 0755);
    path_of(in, sizeof in, "f32", "model.safetensors");
    path_of(out, sizeof out, to, "model.safetensors");
    char *argv[] = {"convert", in, out, "--dtype", (char *)dtype, "--layout", (char *)layout};
    ck_assert_int_eq(tool_convert(7, argv), 0);
    copy_config("f32", to);
}

/* An adapter folder `sub` in PEFT's layout for a 2-layer model of width
 * C: rank r, lora_alpha 16, every module, F32 factors uniform in (-0.25,
 * 0.25) from seed. */
static void write_adapter(const char *sub, size_t r, uint64_t seed, size_t C)
{
    char p[320];
    path_of(p, sizeof p, sub, NULL);
    mkdir(p, 0755);
    path_of(p, sizeof p, sub, LORA_CONFIG_FILE);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f,
            "{\"peft_type\": \"LORA\", \"task_type\": \"CAUSAL_LM\", \"r\": %zu, "
            "\"lora_alpha\": 16, \"lora_dropout\": 0.0, \"bias\": \"none\", "
            "\"fan_in_fan_out\": true, \"target_modules\": [\"c_attn\", \"c_proj\", \"c_fc\"], "
            "\"base_model_name_or_path\": \"tiny\", \"use_rslora\": false}\n",
            r);
    fclose(f);
    enum { NT = 2 * 2 * LORA_NMODULES };
    sft_tensor t[NT];
    char names[NT][128];
    int64_t shapes[NT][2];
    float *bufs[NT];
    eng_rng rng;
    eng_rng_seed(&rng, seed);
    size_t n = 0;
    for (size_t l = 0; l < 2; l++)
        for (int m = 0; m < LORA_NMODULES; m++) {
            size_t in, out;
            lora_module_dims((lora_module)m, C, &in, &out);
            for (int b = 0; b < 2; b++, n++) {
                size_t rows = b ? out : r, cols = b ? r : in;
                snprintf(names[n], sizeof names[n],
                         "base_model.model.transformer.h.%zu.%s.lora_%c.weight", l,
                         lora_module_name((lora_module)m), b ? 'B' : 'A');
                bufs[n] = malloc(rows * cols * sizeof(float));
                for (size_t i = 0; i < rows * cols; i++)
                    bufs[n][i] = (float)(eng_rng_uniform(&rng) - 0.5) * 0.5f;
                shapes[n][0] = (int64_t)rows;
                shapes[n][1] = (int64_t)cols;
                t[n] = (sft_tensor){.name = names[n],
                                    .dtype = SFT_F32,
                                    .ndim = 2,
                                    .shape = shapes[n],
                                    .data = bufs[n],
                                    .nbytes = rows * cols * sizeof(float)};
            }
        }
    char err[256];
    path_of(p, sizeof p, sub, LORA_WEIGHTS_FILE);
    ck_assert_msg(sft_save(p, t, n, NULL, 0, NULL, err, sizeof err) == SFT_OK, "%s", err);
    for (size_t i = 0; i < n; i++) free(bufs[i]);
}

/* `gpt2d lora merge` of adapter into the model `base` (any format; the
 * merge widens it exactly, dequantizes q8, un-panels): DIR/BASE+ADAPTER,
 * F32 in the Hugging Face layout. */
static void merge(const char *base, const char *adapter)
{
    char in[320], ad[320], out[320], sub[64];
    snprintf(sub, sizeof sub, "%s+%s", base, adapter);
    path_of(out, sizeof out, sub, NULL);
    mkdir(out, 0755);
    path_of(in, sizeof in, base, NULL);
    path_of(ad, sizeof ad, adapter, NULL);
    path_of(out, sizeof out, sub, "model.safetensors");
    char *argv[] = {"lora", "merge", in, ad, out};
    ck_assert_int_eq(tool_lora(5, argv), 0);
    copy_config("f32", sub);
}

static void setup(void)
{
    mkdtemp_template(dir, sizeof dir, "/tmp/gpt2d-test-lora-engine-");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char out[320];
    path_of(out, sizeof out, "f32", NULL);
    mkdir(out, 0755);
    path_of(out, sizeof out, "f32", "model.safetensors");
    char *argv[] = {"synth", out,     "--layers", "2",       "--embd", "64",     "--heads",
                    "4",     "--ctx", "128",      "--vocab", "500",    "--seed", "9"};
    ck_assert_int_eq(tool_synth(14, argv), 0);
    convert("f16", "f16", "hf");
    convert("bf16", "bf16", "hf");
    convert("q8", "q8", "hf");
    convert("f32_panel", "f32", "panel64");
    convert("bf16_panel", "bf16", "panel64");
    convert("q8_panel", "q8", "panel64");
    write_adapter("ad_a", 8, 1, 64);
    write_adapter("ad_b", 4, 2, 64);
    /* Width 448 and rank 16: a step of more than about 29 rows takes the
     * product past op_lora.c's inline bound, onto the pool's threads. */
    path_of(out, sizeof out, "wide448", NULL);
    mkdir(out, 0755);
    path_of(out, sizeof out, "wide448", "model.safetensors");
    char *wargv[] = {"synth", out,     "--layers", "2",       "--embd", "448",    "--heads",
                     "7",     "--ctx", "128",      "--vocab", "500",    "--seed", "6"};
    ck_assert_int_eq(tool_synth(14, wargv), 0);
    write_adapter("ad_w", 16, 3, 448);
    write_adapter("ad_w2", 8, 4, 448);
    for (size_t i = 0; i < N_MODELS; i++) {
        merge(models[i], "ad_a");
        merge(models[i], "ad_b");
    }
}

static void teardown(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static eng_model *load(const char *sub)
{
    char p[320], err[512];
    path_of(p, sizeof p, sub, NULL);
    eng_model *m;
    ck_assert_msg(eng_model_load(p, &m, err, sizeof err) == ENG_OK, "%s", err);
    return m;
}

static eng_adapter *adapter(const eng_model *m, const char *sub, eng_adapter_dtype dt)
{
    char p[320], err[512];
    path_of(p, sizeof p, sub, NULL);
    eng_adapter *a;
    ck_assert_msg(eng_adapter_load(m, p, dt, &a, err, sizeof err) == ENG_OK, "%s", err);
    return a;
}

/* The test's prompts: n tokens of the 500-token vocabulary from salt. */
static void prompt_of(int32_t *p, size_t n, unsigned salt)
{
    for (size_t i = 0; i < n; i++) p[i] = (int32_t)((i * 37u + salt * 101u + 7u) % 500u);
}

#define NP 12 /* the subject's prompt */

/* The subject's logits at every position of its prompt (NP rows of V),
 * prefilled in chunks of `chunk` rows on a workspace of `threads`. */
static void subject_alone(const eng_model *m, const eng_adapter *a, size_t chunk, size_t threads,
                          float *out)
{
    size_t V = eng_model_config(m)->n_vocab;
    int32_t p[NP];
    prompt_of(p, NP, 1);
    eng_kv *kv;
    eng_workspace *w;
    eng_seq s = {0};
    char err[256];
    ck_assert_int_eq(eng_kv_new(m, 1 << 20, 4, &kv, err, sizeof err), ENG_OK);
    ck_assert_int_eq(eng_workspace_new(m, 80, threads, &w), ENG_OK);
    ck_assert_int_eq(eng_kv_reserve(kv, &s, NP), ENG_OK);
    for (size_t at = 0; at < NP; at += chunk) {
        size_t n = NP - at < chunk ? NP - at : chunk;
        eng_item it = {.seq = &s,
                       .tokens = p + at,
                       .n = n,
                       .want = ENG_LOGITS_ALL,
                       .logits = out + at * V,
                       .adapter = a};
        ck_assert_msg(eng_forward(m, kv, w, &it, 1, err, sizeof err) == ENG_OK, "%s", err);
    }
    eng_kv_release(kv, &s);
    eng_workspace_free(w);
    eng_kv_free(kv);
}

static void assert_rows_equal(const float *got, const float *want, size_t rows, size_t V,
                              const char *what, size_t R)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t v = 0; v < V; v++)
            ck_assert_msg(memcmp(&got[r * V + v], &want[r * V + v], sizeof(float)) == 0,
                          "%s, %zu rows in the step: row %zu logit %zu is %a, alone %a", what, R, r,
                          v, (double)got[r * V + v], (double)want[r * V + v]);
}

/* Every row count 1..70: the subject's first k = min(R, 1 + R % NP) rows
 * (adapter A) beside R - k rows of fillers, each filler item of up to 5
 * rows cycling through adapter B, the base model and A (another
 * sequence), the subject placed among them by R. A base-model subject
 * (a == NULL) checks that base rows keep their bits beside adapters. */
static void mixed_batches(const eng_model *m, const eng_adapter *a, const eng_adapter *other,
                          const eng_adapter *same_kind, const float *alone, const char *what)
{
    size_t V = eng_model_config(m)->n_vocab;
    float *got = malloc(NP * V * sizeof *got), *junk = malloc(5 * V * sizeof *junk);
    int32_t p[NP], fill[70];
    prompt_of(p, NP, 1);
    prompt_of(fill, 70, 2);
    char err[256];
    eng_workspace *w;
    ck_assert_int_eq(eng_workspace_new(m, 80, 2, &w), ENG_OK);
    for (size_t R = 1; R <= 70; R++) {
        eng_kv *kv;
        ck_assert_int_eq(eng_kv_new(m, 1 << 21, 4, &kv, err, sizeof err), ENG_OK);
        size_t k = 1 + R % NP < R ? 1 + R % NP : R;
        eng_item items[32];
        eng_seq seqs[32];
        memset(seqs, 0, sizeof seqs);
        const eng_adapter *cycle[3] = {other, NULL, same_kind};
        size_t nfill = (R - k + 4) / 5, at = R % 3 < nfill ? R % 3 : nfill, nitems = 0;
        for (size_t f = 0, done = 0; nitems < nfill + 1; nitems++) {
            eng_item *it = &items[nitems];
            if (nitems == at) {
                ck_assert_int_eq(eng_kv_reserve(kv, &seqs[nitems], k), ENG_OK);
                *it = (eng_item){.seq = &seqs[nitems],
                                 .tokens = p,
                                 .n = k,
                                 .want = ENG_LOGITS_ALL,
                                 .logits = got,
                                 .adapter = a};
                continue;
            }
            size_t n = R - k - done < 5 ? R - k - done : 5;
            ck_assert_int_eq(eng_kv_reserve(kv, &seqs[nitems], n), ENG_OK);
            *it = (eng_item){.seq = &seqs[nitems],
                             .tokens = fill + done,
                             .n = n,
                             .want = f % 2 ? ENG_LOGITS_LAST : ENG_LOGITS_ALL,
                             .logits = junk,
                             .adapter = cycle[f % 3]};
            f++;
            done += n;
        }
        ck_assert_msg(eng_forward(m, kv, w, items, nitems, err, sizeof err) == ENG_OK, "%s", err);
        assert_rows_equal(got, alone, k, V, what, R);
        for (size_t i = 0; i < nitems; i++) eng_kv_release(kv, &seqs[i]);
        eng_kv_free(kv);
    }
    eng_workspace_free(w);
    free(got);
    free(junk);
}

static void invariance(eng_adapter_dtype dt)
{
    for (size_t i = 0; i <= N_MODELS; i++) {
        const char *name = i < N_MODELS ? models[i] : "wide448";
        eng_model *m = load(name);
        size_t V = eng_model_config(m)->n_vocab;
        eng_adapter *a = adapter(m, i < N_MODELS ? "ad_a" : "ad_w", dt),
                    *b = adapter(m, i < N_MODELS ? "ad_b" : "ad_w2", dt);
        float *alone = malloc(NP * V * sizeof *alone), *chunked = malloc(NP * V * sizeof *alone);
        float *base = malloc(NP * V * sizeof *base);
        char what[128];
        subject_alone(m, a, NP, 1, alone);
        subject_alone(m, NULL, NP, 1, base);
        /* The adapter does something. */
        ck_assert(memcmp(alone, base, NP * V * sizeof(float)) != 0);
        /* Prefill chunks of every size, on two threads. */
        for (size_t c = 1; c <= NP; c++) {
            subject_alone(m, a, c, 2, chunked);
            snprintf(what, sizeof what, "%s, adapter %s, chunks of %zu", name,
                     dt == ENG_ADAPTER_BF16 ? "bf16" : "f32", c);
            assert_rows_equal(chunked, alone, NP, V, what, c);
        }
        snprintf(what, sizeof what, "%s, adapter %s beside others", name,
                 dt == ENG_ADAPTER_BF16 ? "bf16" : "f32");
        mixed_batches(m, a, b, a, alone, what);
        snprintf(what, sizeof what, "%s, base rows beside adapters", name);
        mixed_batches(m, NULL, b, a, base, what);
        free(alone);
        free(chunked);
        free(base);
        eng_adapter_free(a);
        eng_adapter_free(b);
        eng_model_free(m);
    }
}

START_TEST(eng_forward_adapter_rows_are_batch_and_chunk_invariant)
{
    invariance(_i ? ENG_ADAPTER_BF16 : ENG_ADAPTER_F32);
}
END_TEST

/* Base + adapter, unmerged, against `gpt2d lora merge` of the same base
 * (F32: each format's weights widen exactly, q8 dequantized, panels
 * undone): the same function up to rounding, in every format. The levels
 * that round activations (avx512-bf16 for BF16, avx512-vnni for Q8) are
 * compared in the lora-engine-avx512 run, which caps them. */
START_TEST(eng_forward_adapter_matches_the_merged_checkpoint)
{
    const char *ads[] = {"ad_a", "ad_b"};
    for (size_t i = 0; i < N_MODELS; i++) {
        eng_model *m = load(models[i]);
        const char *k = eng_model_kernels(m);
        if (strcmp(k, "avx512-bf16") == 0 || strcmp(k, "avx512-vnni") == 0) {
            printf("%s: kernels %s round activations; compared at the widening levels\n", models[i],
                   k);
            eng_model_free(m);
            continue;
        }
        size_t V = eng_model_config(m)->n_vocab;
        float *want = malloc(NP * V * sizeof *want), *got = malloc(NP * V * sizeof *got);
        float *base = malloc(NP * V * sizeof *base);
        subject_alone(m, NULL, NP, 1, base);
        for (size_t j = 0; j < 2; j++) {
            char sub[64];
            snprintf(sub, sizeof sub, "%s+%s", models[i], ads[j]);
            eng_model *mm = load(sub);
            subject_alone(mm, NULL, NP, 1, want);
            eng_adapter *a = adapter(m, ads[j], ENG_ADAPTER_F32);
            subject_alone(m, a, NP, 1, got);
            double err = 0, moved = 0;
            for (size_t e = 0; e < NP * V; e++) {
                err = fmax(err, fabs((double)got[e] - want[e]));
                moved = fmax(moved, fabs((double)want[e] - base[e]));
            }
            printf("%s + %s (kernels %s): max abs error %.2e against the merged checkpoint; the "
                   "adapter moves the logits by up to %.2f\n",
                   models[i], ads[j], k, err, moved);
            fflush(stdout);
            ck_assert_msg(err < 1e-4, "%s + %s: %.3e", models[i], ads[j], err);
            ck_assert_msg(moved > 0.05, "%s + %s: the adapter barely moves the logits (%.3f)",
                          models[i], ads[j], moved);
            eng_adapter_free(a);
            eng_model_free(mm);
        }
        free(want);
        free(got);
        free(base);
        eng_model_free(m);
    }
}
END_TEST

START_TEST(eng_adapter_new_refuses_another_models_adapter)
{
    /* A base of another width: lora_read refuses the shapes. */
    char out[320], p[320], err[512];
    path_of(out, sizeof out, "wide", NULL);
    mkdir(out, 0755);
    path_of(out, sizeof out, "wide", "model.safetensors");
    char *argv[] = {"synth", out,     "--layers", "2",       "--embd", "128",    "--heads",
                    "4",     "--ctx", "64",       "--vocab", "500",    "--seed", "3"};
    ck_assert_int_eq(tool_synth(14, argv), 0);
    eng_model *m = load("wide");
    eng_adapter *a = (eng_adapter *)1;
    path_of(p, sizeof p, "ad_a", NULL);
    ck_assert_int_eq(eng_adapter_load(m, p, ENG_ADAPTER_F32, &a, err, sizeof err), ENG_EFORMAT);
    ck_assert_ptr_null(a);
    ck_assert_msg(strstr(err, "lora_A") != NULL || strstr(err, "shape") != NULL, "%s", err);
    path_of(p, sizeof p, "nowhere", NULL);
    ck_assert_int_eq(eng_adapter_load(m, p, ENG_ADAPTER_F32, &a, err, sizeof err), ENG_EIO);
    /* An adapter made for the tiny model, on a step of the wide one. */
    eng_model *tiny = load("f32");
    eng_adapter *t = adapter(tiny, "ad_a", ENG_ADAPTER_F32);
    ck_assert_uint_eq(eng_adapter_rank(t), 8);
    ck_assert_float_eq(eng_adapter_scaling(t), 2.0f);
    /* F32: A and B of 8 modules (2 layers x 4), 8 x (in + out) floats each. */
    ck_assert_uint_eq(eng_adapter_bytes(t), 2 * 8 * (64 + 192 + 64 + 64 + 64 + 256 + 256 + 64) * 4);
    eng_adapter *t16 = adapter(tiny, "ad_a", ENG_ADAPTER_BF16);
    ck_assert_uint_eq(eng_adapter_bytes(t16), eng_adapter_bytes(t) / 2);
    ck_assert(eng_adapter_key(t16) != eng_adapter_key(t));
    eng_adapter *t2 = adapter(tiny, "ad_a", ENG_ADAPTER_F32);
    ck_assert(eng_adapter_key(t2) == eng_adapter_key(t)); /* the same bits, one key */
    eng_kv *kv;
    eng_workspace *w;
    eng_seq s = {0};
    ck_assert_int_eq(eng_kv_new(m, 1 << 20, 4, &kv, err, sizeof err), ENG_OK);
    ck_assert_int_eq(eng_workspace_new(m, 8, 1, &w), ENG_OK);
    ck_assert_int_eq(eng_kv_reserve(kv, &s, 4), ENG_OK);
    int32_t tok[1] = {5};
    float logits[500];
    eng_item it = {
        .seq = &s, .tokens = tok, .n = 1, .want = ENG_LOGITS_LAST, .logits = logits, .adapter = t};
    ck_assert_int_eq(eng_forward(m, kv, w, &it, 1, err, sizeof err), ENG_EINVAL);
    ck_assert_msg(strstr(err, "adapter") != NULL, "%s", err);
    eng_kv_release(kv, &s);
    eng_workspace_free(w);
    eng_kv_free(kv);
    eng_adapter_free(t);
    eng_adapter_free(t2);
    eng_adapter_free(t16);
    eng_adapter_free(NULL);
    eng_model_free(tiny);
    eng_model_free(m);
}
END_TEST

/* DIR/to: the adapter `from` with every factor rounded to dtype (F16 or
 * BF16, nearest even), stored in dtype (wide 0) or as the F32 widening of
 * those values (wide 1): the same numbers either way. */
static void adapter_rounded(const char *from, const char *to, sft_dtype dtype, int wide)
{
    char p[320], err[256];
    path_of(p, sizeof p, to, NULL);
    mkdir(p, 0755);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "cp '%s/%s/%s' '%s/%s/'", dir, from, LORA_CONFIG_FILE, dir, to);
    ck_assert_int_eq(system(cmd), 0);
    path_of(p, sizeof p, from, LORA_WEIGHTS_FILE);
    sft_file *f;
    ck_assert_msg(sft_open(p, SFT_LOAD_COPY, &f, err, sizeof err) == SFT_OK, "%s", err);
    size_t n = sft_count(f);
    sft_tensor *t = calloc(n, sizeof *t);
    void **bufs = calloc(n, sizeof *bufs);
    for (size_t i = 0; i < n; i++) {
        t[i] = *sft_tensor_at(f, i);
        size_t k = sft_tensor_numel(&t[i]);
        const float *x = t[i].data;
        uint16_t *h = malloc(k * sizeof *h);
        float *w = malloc(k * sizeof *w);
        for (size_t j = 0; j < k; j++) {
            uint32_t u;
            memcpy(&u, &x[j], sizeof u);
            h[j] = dtype == SFT_F16 ? sft_f32_to_f16(x[j])
                                    : (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
            w[j] = dtype == SFT_F16 ? sft_f16_to_f32(h[j]) : sft_bf16_to_f32(h[j]);
        }
        if (wide) {
            free(h);
            bufs[i] = w;
            t[i].nbytes = k * sizeof(float);
        } else {
            free(w);
            bufs[i] = h;
            t[i].dtype = dtype;
            t[i].nbytes = k * sizeof(uint16_t);
        }
        t[i].data = bufs[i];
    }
    path_of(p, sizeof p, to, LORA_WEIGHTS_FILE);
    ck_assert_msg(sft_save(p, t, n, NULL, 0, NULL, err, sizeof err) == SFT_OK, "%s", err);
    for (size_t i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    free(t);
    sft_close(f);
}

/* A resident adapter costs at most 1.1x its file's tensors (issue 36): an
 * F16 or BF16 file asked for in F32 keeps its 16 bits (exactly its
 * tensors' bytes), and gives the logits of an F32 file holding the same
 * values, bit for bit (the kernels widen 16 bits exactly). */
START_TEST(eng_adapter_16_bit_file_stays_16_bit_with_f32_bits)
{
    static const sft_dtype dts[] = {SFT_F16, SFT_BF16};
    static const char *const names[][2] = {{"ad_h16", "ad_h32"}, {"ad_b16", "ad_b32"}};
    eng_model *m = load("f32");
    size_t V = eng_model_config(m)->n_vocab;
    float *want = malloc(NP * V * sizeof *want), *got = malloc(NP * V * sizeof *got);
    for (size_t i = 0; i < 2; i++) {
        adapter_rounded("ad_a", names[i][0], dts[i], 0);
        adapter_rounded("ad_a", names[i][1], dts[i], 1);
        eng_adapter *narrow = adapter(m, names[i][0], ENG_ADAPTER_F32);
        eng_adapter *wide = adapter(m, names[i][1], ENG_ADAPTER_F32);
        size_t file = 2 * 8 * (64 + 192 + 64 + 64 + 64 + 256 + 256 + 64) * 2;
        ck_assert_uint_eq(eng_adapter_bytes(narrow), file);
        ck_assert_uint_eq(eng_adapter_bytes(wide), 2 * file);
        subject_alone(m, wide, NP, 1, want);
        subject_alone(m, narrow, NP, 1, got);
        assert_rows_equal(got, want, NP, V, names[i][0], 1);
        subject_alone(m, narrow, 3, 2, got);
        assert_rows_equal(got, want, NP, V, names[i][0], 1);
        eng_adapter_free(narrow);
        eng_adapter_free(wide);
    }
    free(want);
    free(got);
    eng_model_free(m);
}
END_TEST

/* ---- Through the scheduler ---------------------------------------------- */

typedef struct {
    uint64_t id;
    int32_t tokens[64];
    size_t n, cached, done;
} rec;

static void on_event(void *user, const eng_event *ev)
{
    rec *r = user;
    if (ev->kind == ENG_EV_TOKEN) r->tokens[r->n++] = ev->token;
    if (ev->kind == ENG_EV_DONE) {
        r->cached = ev->cached;
        r->done++;
    }
}

static eng_sched *sched(const eng_model *m)
{
    eng_sched_opts o = {.kv_bytes = 64 * 16 * 2 * 2 * 64 * sizeof(float),
                        .block_len = 16,
                        .max_running = 8,
                        .max_queue = 16,
                        .step_tokens = 64,
                        .threads = 2,
                        .prefix_cache = 1};
    eng_sched *s;
    char err[256];
    ck_assert_msg(eng_sched_new(m, &o, &s, err, sizeof err) == ENG_OK, "%s", err);
    return s;
}

static void submit_spec(eng_sched *s, rec *r, const int32_t *p, size_t n, eng_adapter *a,
                        size_t spec)
{
    memset(r, 0, sizeof *r);
    eng_request q = {.prompt = p,
                     .speculative_tokens = spec,
                     .drafter = ENG_DRAFT_LOOKUP,
                     .nprompt = n,
                     .max_tokens = 8,
                     .sampling = {.temperature = 0.8f, .top_p = 1.0f},
                     .seed = 42,
                     .ignore_eos = 1,
                     .logprobs = -1,
                     .adapter = a,
                     .on_event = on_event,
                     .user = r};
    char err[256];
    ck_assert_msg(eng_sched_submit(s, &q, &r->id, err, sizeof err) == ENG_OK, "%s", err);
}

static void submit(eng_sched *s, rec *r, const int32_t *p, size_t n, eng_adapter *a)
{
    submit_spec(s, r, p, n, a, 0);
}

static void run_all(eng_sched *s)
{
    while (eng_sched_step(s)) {
    }
}

/* Issue 36: the same prompt under adapter A never starts from blocks
 * computed under B or under the base (nor the base from A's), one after
 * the other or at once, even with every hash colliding; the same adapter
 * does; and the tokens are those of a cold run whichever way. */
START_TEST(sched_prefix_cache_never_crosses_adapters)
{
    eng_model *m = load("f32");
    eng_adapter *A = adapter(m, "ad_a", ENG_ADAPTER_F32), *B = adapter(m, "ad_b", ENG_ADAPTER_F32);
    int32_t p[50];
    prompt_of(p, 50, 3);
    static rec cold[3], r0[3], r1[3], both[2];
    eng_adapter *which[3] = {NULL, A, B};
    for (int i = 0; i < 3; i++) { /* cold references, each on its own scheduler */
        eng_sched *s = sched(m);
        submit(s, &cold[i], p, 50, which[i]);
        run_all(s);
        eng_sched_free(s);
    }
    ck_assert(memcmp(cold[0].tokens, cold[1].tokens, sizeof cold[0].tokens) != 0);
    ck_assert(memcmp(cold[1].tokens, cold[2].tokens, sizeof cold[0].tokens) != 0);
    for (int collide = 0; collide <= 1; collide++) {
        eng_sched *s = sched(m);
        if (collide) sch_kv(s)->hash_mask = 0; /* only the adapter's key tells them apart */
        for (int i = 0; i < 3; i++) {
            submit(s, &r0[i], p, 50, which[i]);
            run_all(s);
            ck_assert_uint_eq(r0[i].cached, 0);
            ck_assert_mem_eq(r0[i].tokens, cold[i].tokens, sizeof cold[i].tokens);
        }
        for (int i = 0; i < 3; i++) {
            submit(s, &r1[i], p, 50, which[i]);
            run_all(s);
            ck_assert_uint_eq(r1[i].cached, 48); /* its own three full blocks */
            ck_assert_mem_eq(r1[i].tokens, cold[i].tokens, sizeof cold[i].tokens);
        }
        eng_sched_stats st;
        eng_sched_stats_get(s, &st);
        ck_assert_uint_eq(st.kv_blocks_cached, 3 * 3);
        eng_sched_free(s);
    }
    /* At once, cold: B's sequence neither waits for A's blocks nor takes
     * them. */
    eng_sched *s = sched(m);
    submit(s, &both[0], p, 50, A);
    submit(s, &both[1], p, 50, B);
    run_all(s);
    ck_assert_uint_eq(both[0].cached, 0);
    ck_assert_uint_eq(both[1].cached, 0);
    ck_assert_mem_eq(both[0].tokens, cold[1].tokens, sizeof cold[1].tokens);
    ck_assert_mem_eq(both[1].tokens, cold[2].tokens, sizeof cold[2].tokens);
    eng_sched_free(s);
    eng_adapter_free(A);
    eng_adapter_free(B);
    eng_model_free(m);
}
END_TEST

/* The owner may free an adapter while sequences use it: they hold it
 * until they end, and their tokens are those of the adapter. */
START_TEST(sched_adapter_freed_while_running_lives_until_its_sequences_end)
{
    eng_model *m = load("q8_panel");
    eng_adapter *A = adapter(m, "ad_a", ENG_ADAPTER_F32);
    int32_t p[20];
    prompt_of(p, 20, 4);
    static rec ref, a1, a2;
    eng_sched *s = sched(m);
    submit(s, &ref, p, 20, A);
    run_all(s);
    ck_assert_uint_eq(eng_adapter_users(A), 0);
    submit(s, &a1, p, 20, A);
    submit(s, &a2, p, 20, A);
    ck_assert_uint_eq(eng_adapter_users(A), 2);
    ck_assert(eng_sched_step(s));
    eng_adapter_free(A); /* unloaded: the two sequences keep it */
    run_all(s);
    ck_assert_uint_eq(a1.done, 1);
    ck_assert_uint_eq(a2.done, 1);
    ck_assert_mem_eq(a1.tokens, ref.tokens, sizeof ref.tokens);
    ck_assert_mem_eq(a2.tokens, ref.tokens, sizeof ref.tokens);
    eng_sched_free(s);
    eng_model_free(m);
}
END_TEST

/* Speculative decoding verifies drafts with the sequence's adapter: the
 * same tokens with speculation as without, beside a base sequence. */
START_TEST(sched_speculation_with_an_adapter_changes_no_token)
{
    eng_model *m = load("bf16_panel");
    eng_adapter *A = adapter(m, "ad_a", ENG_ADAPTER_F32);
    int32_t p[40];
    for (size_t i = 0; i < 40; i++) p[i] = (int32_t)(i % 8 * 31 + 5); /* repeats: lookup drafts */
    static rec plain, spec, base_plain, base_spec;
    eng_sched *s = sched(m);
    submit_spec(s, &plain, p, 40, A, 0);
    submit_spec(s, &base_plain, p, 40, NULL, 0);
    run_all(s);
    eng_sched_free(s);
    s = sched(m);
    submit_spec(s, &spec, p, 40, A, 4);
    submit_spec(s, &base_spec, p, 40, NULL, 4);
    run_all(s);
    eng_sched_stats st;
    eng_sched_stats_get(s, &st);
    ck_assert_uint_gt(st.spec_steps, 0); /* drafts were verified */
    ck_assert_uint_eq(spec.n, 8);
    ck_assert_mem_eq(spec.tokens, plain.tokens, sizeof plain.tokens);
    ck_assert_mem_eq(base_spec.tokens, base_plain.tokens, sizeof plain.tokens);
    ck_assert(memcmp(plain.tokens, base_plain.tokens, sizeof plain.tokens) != 0);
    eng_sched_free(s);
    eng_adapter_free(A);
    eng_model_free(m);
}
END_TEST

static Suite *lora_engine_suite(void)
{
    Suite *s = suite_create("lora_engine");
    TCase *tc = tcase_create("eng_forward");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, eng_forward_adapter_rows_are_batch_and_chunk_invariant, 0, 2);
    tcase_add_test(tc, eng_adapter_new_refuses_another_models_adapter);
    tcase_add_test(tc, eng_adapter_16_bit_file_stays_16_bit_with_f32_bits);
    suite_add_tcase(s, tc);
    tc = tcase_create("merged");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, eng_forward_adapter_matches_the_merged_checkpoint);
    suite_add_tcase(s, tc);
    tc = tcase_create("eng_sched");
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, sched_prefix_cache_never_crosses_adapters);
    tcase_add_test(tc, sched_adapter_freed_while_running_lives_until_its_sequences_end);
    tcase_add_test(tc, sched_speculation_with_an_adapter_changes_no_token);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(lora_engine_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
