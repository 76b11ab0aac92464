/*
 * tests/test_engine.c: engine/ on tiny `gpt2d synth` checkpoints.
 *
 * The numbers themselves are checked against numpy in
 * tests/test_engine_reference.py; here: batch invariance (bitwise), the KV
 * cache through the forward pass, layouts that must give identical logits,
 * and the errors.
 */
#include "step.h"
#include "internal.h"
#include "quantize.h"
#include "safetensors.h"
#include "tools.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

static char dir[256];

/* DIR/sub/model.safetensors = `gpt2d synth` of this shape (vocabulary 500),
 * with up to two more arguments. */
static void synth_shape(const char *sub, const char *layers, const char *embd, const char *heads,
                        const char *ctx, const char *seed, const char *extra1, const char *extra2)
{
    char out[320];
    snprintf(out, sizeof out, "%s/%s", dir, sub);
    mkdir(out, 0755);
    snprintf(out, sizeof out, "%s/%s/model.safetensors", dir, sub);
    char *argv[16] = {"synth",      out,       "--layers",    (char *)layers, "--embd",
                      (char *)embd, "--heads", (char *)heads, "--ctx",        (char *)ctx,
                      "--vocab",    "500",     "--seed",      (char *)seed};
    int argc = 14;
    if (extra1) argv[argc++] = (char *)extra1;
    if (extra2) argv[argc++] = (char *)extra2;
    ck_assert_int_eq(tool_synth(argc, argv), 0);
}

static void synth(const char *sub, const char *extra1, const char *extra2)
{
    synth_shape(sub, "2", "64", "4", "64", "5", extra1, extra2);
}

/* GPT-2's head size, 64, which has its own attention kernel (rows of a
 * prefill chunk taken together, a decode row's heads four at a time):
 * width 448, seven heads, so that both a group of four heads and a
 * shorter last group occur. */
static void synth_hs64(void)
{
    synth_shape("hs64", "2", "448", "7", "64", "6", NULL, NULL);
}

/* DIR/to/model.safetensors = `gpt2d convert DIR/from/... --dtype dtype`,
 * with `--layout layout` unless layout is NULL (IN's layout). */
static void convert_layout(const char *from, const char *to, const char *dtype, const char *layout)
{
    char in[320], out[320], cfg[700];
    snprintf(out, sizeof out, "%s/%s", dir, to);
    mkdir(out, 0755);
    snprintf(in, sizeof in, "%s/%s/model.safetensors", dir, from);
    snprintf(out, sizeof out, "%s/%s/model.safetensors", dir, to);
    char *argv[] = {"convert", in, out, "--dtype", (char *)dtype, "--layout", (char *)layout};
    ck_assert_int_eq(tool_convert(layout ? 7 : 5, argv), 0);
    snprintf(cfg, sizeof cfg, "cp '%s/%s/config.json' '%s/%s/'", dir, from, dir, to);
    ck_assert_int_eq(system(cfg), 0);
}

static void convert(const char *from, const char *to, const char *dtype)
{
    convert_layout(from, to, dtype, NULL);
}

static void convert_panel(const char *from, const char *to, const char *dtype)
{
    convert_layout(from, to, dtype, "panel64");
}

/* The models the invariance tests run on, by loop index: GPT-2's head size
 * also in BF16 and in Q8, whose kernels widen the weights in registers,
 * and in the panel64 layout (F32, BF16, Q8), whose projections the matmul
 * reads panel by panel. */
static const char *const inv_models[] = {
    "aligned", "hs64", "hs64_bf16", "hs64_q8", "hs64_panel", "hs64_bf16_panel", "hs64_q8_panel"};
#define N_INV_MODELS (sizeof inv_models / sizeof *inv_models)

static void setup(void)
{
    mkdtemp_template(dir, sizeof dir, "/tmp/gpt2d-test-engine-");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    synth("aligned", NULL, NULL);
    synth_hs64();
    convert("hs64", "hs64_bf16", "bf16");
    convert("hs64", "hs64_q8", "q8");
    convert_panel("hs64", "hs64_panel", "f32");
    convert_panel("hs64", "hs64_bf16_panel", "bf16");
    convert_panel("hs64", "hs64_q8_panel", "q8");
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
    snprintf(p, sizeof p, "%s/%s", dir, sub);
    eng_model *m;
    ck_assert_msg(eng_model_load(p, &m, err, sizeof err) == ENG_OK, "%s", err);
    return m;
}

static const int32_t toks_a[] = {3, 141, 59, 26, 5, 358, 97, 93, 238, 46};
static const int32_t toks_b[] = {400, 1, 2, 3, 499, 250, 17, 18, 19, 20, 21, 22};

/* Logits of toks_a after each of: a 7-token prefill, then 3 single decodes,
 * alone, on one thread (the batched runs use two: the bits must not depend
 * on the thread count either). out: 4 rows of V. */
static void run_alone(eng_model *m, float *out)
{
    size_t V = eng_model_config(m)->n_vocab;
    eng_kv *kv;
    eng_workspace *w;
    eng_seq s = {0};
    char err[256];
    ck_assert_int_eq(eng_kv_new(m, 1 << 20, 4, &kv, err, sizeof err), ENG_OK);
    ck_assert_int_eq(eng_workspace_new(m, 32, 1, &w), ENG_OK);
    ck_assert_int_eq(eng_kv_reserve(kv, &s, 10), ENG_OK);
    eng_item it = {.seq = &s, .tokens = toks_a, .n = 7, .want = ENG_LOGITS_LAST, .logits = out};
    ck_assert_int_eq(eng_forward(m, kv, w, &it, 1, err, sizeof err), ENG_OK);
    for (size_t k = 0; k < 3; k++) {
        it = (eng_item){.seq = &s,
                        .tokens = toks_a + 7 + k,
                        .n = 1,
                        .want = ENG_LOGITS_LAST,
                        .logits = out + (k + 1) * V};
        ck_assert_int_eq(eng_forward(m, kv, w, &it, 1, err, sizeof err), ENG_OK);
    }
    ck_assert_uint_eq(s.len, 10);
    eng_kv_release(kv, &s);
    ck_assert_uint_eq(eng_kv_blocks_free(kv), eng_kv_blocks_total(kv));
    eng_workspace_free(w);
    eng_kv_free(kv);
}

START_TEST(eng_forward_is_batch_invariant_bitwise)
{
    eng_model *m = load(inv_models[_i]);
    size_t V = eng_model_config(m)->n_vocab;
    float *alone = malloc(4 * V * sizeof *alone), *mixed = malloc(4 * V * sizeof *mixed);
    float *junk = malloc(12 * V * sizeof *junk);
    run_alone(m, alone);

    /* The same sequence beside others: B prefilling in chunks of mixed
     * length, C decoding, in varying order. */
    eng_kv *kv;
    eng_workspace *w;
    eng_seq a = {0}, b = {0}, c = {0};
    char err[256];
    ck_assert_int_eq(eng_kv_new(m, 1 << 20, 4, &kv, err, sizeof err), ENG_OK);
    ck_assert_int_eq(eng_workspace_new(m, 32, 2, &w), ENG_OK);
    ck_assert_int_eq(eng_kv_reserve(kv, &a, 10), ENG_OK);
    ck_assert_int_eq(eng_kv_reserve(kv, &b, 12), ENG_OK);
    ck_assert_int_eq(eng_kv_reserve(kv, &c, 12), ENG_OK);
    eng_item c0 = {.seq = &c, .tokens = toks_b, .n = 5, .want = ENG_LOGITS_ALL, .logits = junk};
    ck_assert_int_eq(eng_forward(m, kv, w, &c0, 1, err, sizeof err), ENG_OK);
    eng_item step1[3] = {
        {.seq = &b, .tokens = toks_b, .n = 3, .want = ENG_LOGITS_NONE},
        {.seq = &a, .tokens = toks_a, .n = 7, .want = ENG_LOGITS_LAST, .logits = mixed},
        {.seq = &c, .tokens = toks_b + 5, .n = 1, .want = ENG_LOGITS_LAST, .logits = junk},
    };
    ck_assert_int_eq(eng_forward(m, kv, w, step1, 3, err, sizeof err), ENG_OK);
    for (size_t k = 0; k < 3; k++) {
        eng_item step[3] = {
            {.seq = &c, .tokens = toks_b + 6 + k, .n = 1, .want = ENG_LOGITS_LAST, .logits = junk},
            {.seq = &b,
             .tokens = toks_b + 3 + 2 * k,
             .n = 2,
             .want = ENG_LOGITS_ALL,
             .logits = junk + V},
            {.seq = &a,
             .tokens = toks_a + 7 + k,
             .n = 1,
             .want = ENG_LOGITS_LAST,
             .logits = mixed + (k + 1) * V},
        };
        ck_assert_int_eq(eng_forward(m, kv, w, step, 3, err, sizeof err), ENG_OK);
    }
    for (size_t r = 0; r < 4; r++)
        ck_assert_msg(memcmp(alone + r * V, mixed + r * V, V * sizeof(float)) == 0,
                      "row %zu differs alone and in a batch", r);
    eng_kv_release(kv, &a);
    eng_kv_release(kv, &b);
    eng_kv_release(kv, &c);
    ck_assert_uint_eq(eng_kv_blocks_free(kv), eng_kv_blocks_total(kv));
    eng_workspace_free(w);
    eng_kv_free(kv);
    eng_model_free(m);
    free(alone);
    free(mixed);
    free(junk);
}
END_TEST

/* 60 tokens: a full prefill takes the packed-tile matmul (more than 48
 * rows, the most k-blocked ones take), a decode the k-blocked one; both
 * must give the same bits. */
static const int32_t toks_long[60] = {
    3,   141, 59,  26,  5,   358, 97,  93,  238, 46,  1,   2,  3,  4,  5,  6,   7,   8,   9,   10,
    400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 499, 0,  17, 17, 17, 250, 251, 252, 253, 254,
    60,  61,  62,  63,  64,  65,  66,  67,  68,  69,  70,  71, 72, 73, 74, 75,  76,  77,  78,  79};

START_TEST(eng_forward_incremental_equals_full_prefill)
{
    eng_model *m = load(inv_models[_i]);
    size_t V = eng_model_config(m)->n_vocab;
    float *full = malloc(60 * V * sizeof *full), *inc = malloc(60 * V * sizeof *inc);
    eng_kv *kv;
    eng_workspace *w;
    eng_seq s = {0}, t = {0};
    char err[256];
    ck_assert_int_eq(eng_kv_new(m, 1 << 20, 4, &kv, err, sizeof err), ENG_OK);
    ck_assert_int_eq(eng_workspace_new(m, 64, 2, &w), ENG_OK);
    ck_assert_int_eq(eng_kv_reserve(kv, &s, 60), ENG_OK);
    ck_assert_int_eq(eng_kv_reserve(kv, &t, 60), ENG_OK);
    eng_item it = {.seq = &s, .tokens = toks_long, .n = 60, .want = ENG_LOGITS_ALL, .logits = full};
    ck_assert_int_eq(eng_forward(m, kv, w, &it, 1, err, sizeof err), ENG_OK);
    for (size_t k = 0; k < 60; k++) {
        it = (eng_item){.seq = &t,
                        .tokens = toks_long + k,
                        .n = 1,
                        .want = ENG_LOGITS_LAST,
                        .logits = inc + k * V};
        ck_assert_int_eq(eng_forward(m, kv, w, &it, 1, err, sizeof err), ENG_OK);
    }
    ck_assert_mem_eq(full, inc, 60 * V * sizeof(float));
    eng_kv_release(kv, &s);
    eng_kv_release(kv, &t);
    eng_workspace_free(w);
    eng_kv_free(kv);
    eng_model_free(m);
    free(full);
    free(inc);
}
END_TEST

/* A BF16 model's prefill past the "avx512-bf16" kernels' chunk of 256
 * rows (op_matmul_bf16.c, MMB_CHUNK): 300 tokens in one step, in steps of
 * 257 + 43 and of 1 + 256 + 43, give the same bits for every position
 * (one layer of width 64, n_ctx 320). */
START_TEST(eng_forward_bf16_prefill_past_the_chunk_is_invariant)
{
    enum { NT = 300 };
    synth_shape("long", "1", "64", "2", "320", "8", NULL, NULL);
    convert("long", "long_bf16", "bf16");
    eng_model *m = load("long_bf16");
    size_t V = eng_model_config(m)->n_vocab;
    int32_t toks[NT];
    for (size_t i = 0; i < NT; i++) toks[i] = (int32_t)((i * 37 + 11) % V);
    static const size_t splits[3][4] = {{NT, 0}, {257, 43, 0}, {1, 256, 43, 0}};
    float *want = malloc(NT * V * sizeof *want), *got = malloc(NT * V * sizeof *got);
    ck_assert(want && got);
    for (size_t s = 0; s < 3; s++) {
        eng_kv *kv;
        eng_workspace *w;
        eng_seq q = {0};
        char err[256];
        ck_assert_int_eq(eng_kv_new(m, 1 << 22, 4, &kv, err, sizeof err), ENG_OK);
        ck_assert_int_eq(eng_workspace_new(m, NT, 2, &w), ENG_OK);
        ck_assert_int_eq(eng_kv_reserve(kv, &q, NT), ENG_OK);
        float *dst = s == 0 ? want : got;
        for (size_t i = 0, at = 0; splits[s][i] != 0; at += splits[s][i++]) {
            eng_item it = {.seq = &q,
                           .tokens = toks + at,
                           .n = splits[s][i],
                           .want = ENG_LOGITS_ALL,
                           .logits = dst + at * V};
            ck_assert_int_eq(eng_forward(m, kv, w, &it, 1, err, sizeof err), ENG_OK);
        }
        if (s > 0)
            for (size_t p = 0; p < NT; p++)
                ck_assert_msg(memcmp(want + p * V, got + p * V, V * sizeof(float)) == 0,
                              "split %zu: position %zu differs from the one-step prefill", s, p);
        eng_kv_release(kv, &q);
        eng_workspace_free(w);
        eng_kv_free(kv);
    }
    eng_model_free(m);
    free(want);
    free(got);
}
END_TEST

START_TEST(eng_model_layouts_give_identical_logits)
{
    synth("misaligned", "--misaligned", "--mask-buffers");
    synth("prefixed", "--prefix", "transformer.");
    size_t V = 500;
    float *want = malloc(4 * V * sizeof *want), *got = malloc(4 * V * sizeof *got);
    eng_model *m = load("aligned");
    ck_assert_uint_eq(eng_model_copied_bytes(m), 0);
    run_alone(m, want);
    eng_model_free(m);
    const char *subs[] = {"misaligned", "prefixed"};
    for (int i = 0; i < 2; i++) {
        m = load(subs[i]);
        if (i == 0) ck_assert_uint_gt(eng_model_copied_bytes(m), 0);
        run_alone(m, got);
        ck_assert_msg(memcmp(want, got, 4 * V * sizeof *got) == 0, "%s differs", subs[i]);
        eng_model_free(m);
    }
    free(want);
    free(got);
}
END_TEST

/* Rewrites DIR/aligned's weights as F16 (or BF16) into DIR/half and, with
 * the same values widened back, as F32 into DIR/rounded: the two must give
 * identical logits, since the loader's conversion is exact. */
static void write_half_pair(sft_dtype half)
{
    char p[320], err[512];
    snprintf(p, sizeof p, "%s/aligned/model.safetensors", dir);
    sft_file *f;
    ck_assert_int_eq(sft_open(p, SFT_LOAD_COPY, &f, err, sizeof err), SFT_OK);
    size_t n = sft_count(f);
    sft_tensor *h = calloc(n, sizeof *h), *r = calloc(n, sizeof *r);
    void **bufs = calloc(2 * n, sizeof *bufs);
    for (size_t i = 0; i < n; i++) {
        const sft_tensor *t = sft_tensor_at(f, i);
        size_t count = sft_tensor_numel(t);
        uint16_t *hb = malloc(count * 2 + 2);
        float *rb = malloc(count * 4 + 4);
        const float *src = t->data;
        for (size_t k = 0; k < count; k++) {
            uint32_t bits;
            memcpy(&bits, &src[k], 4);
            /* BF16 by truncation; F16 round to nearest even. */
            hb[k] = half == SFT_F16 ? sft_f32_to_f16(src[k]) : (uint16_t)(bits >> 16);
            rb[k] = half == SFT_F16 ? sft_f16_to_f32(hb[k]) : sft_bf16_to_f32(hb[k]);
        }
        h[i] = *t;
        h[i].dtype = half;
        h[i].data = hb;
        r[i] = *t;
        r[i].data = rb;
        bufs[2 * i] = hb;
        bufs[2 * i + 1] = rb;
    }
    snprintf(p, sizeof p, "%s/half", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/rounded", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/half/model.safetensors", dir);
    ck_assert_int_eq(sft_save(p, h, n, NULL, 0, NULL, err, sizeof err), SFT_OK);
    snprintf(p, sizeof p, "%s/rounded/model.safetensors", dir);
    ck_assert_int_eq(sft_save(p, r, n, NULL, 0, NULL, err, sizeof err), SFT_OK);
    for (size_t i = 0; i < 2 * n; i++) free(bufs[i]);
    free(bufs);
    free(h);
    free(r);
    sft_close(f);
}

START_TEST(eng_model_half_precision_loads_exactly)
{
    size_t V = 500;
    float *want = malloc(4 * V * sizeof *want), *got = malloc(4 * V * sizeof *got);
    sft_dtype kinds[2] = {SFT_F16, SFT_BF16};
    for (int k = 0; k < 2; k++) {
        write_half_pair(kinds[k]);
        eng_model *m = load("rounded");
        run_alone(m, want);
        eng_model_free(m);
        m = load("half");
        ck_assert_uint_eq(eng_model_copied_bytes(m), 0); /* served from the mapping */
        run_alone(m, got);
        eng_model_free(m);
        if (kinds[k] == SFT_BF16 && op_use_avx512bf16()) {
            /* The "avx512-bf16" level rounds the projections' inputs to
             * BF16 (kernels.h, op_bf16_dot2): the logits of the widening,
             * within a bound of the BF16 rounding (2^-8 of each input) over
             * the model's depth, relative to the logits' spread. */
            double spread = 0, worst = 0;
            for (size_t i = 0; i < 4 * V; i++) spread = fmax(spread, fabs((double)want[i]));
            for (size_t i = 0; i < 4 * V; i++)
                worst = fmax(worst, fabs((double)got[i] - (double)want[i]));
            printf("BF16 at avx512-bf16: logits within %.3g of the widening's (largest %.3g)\n",
                   worst, spread);
            ck_assert_msg(worst > 0 && worst <= 0.02 * spread,
                          "BF16 at avx512-bf16: logits %g from the widening's (largest %g)", worst,
                          spread);
        } else {
            ck_assert_msg(memcmp(want, got, 4 * V * sizeof *got) == 0, "%s logits differ",
                          sft_dtype_name(kinds[k]));
        }
    }
    free(want);
    free(got);
}
END_TEST

/* A q8 file is served as stored (0 bytes copied) and gives exactly the
 * logits of `convert --dtype f32` of it, which writes q * scale, at the
 * widening levels; at "avx512-vnni" (the inputs quantized per block of
 * 32 too) within a bound of them. */
START_TEST(eng_model_q8_gives_the_logits_of_its_dequantization)
{
    size_t V = 500;
    float *want = malloc(4 * V * sizeof *want), *got = malloc(4 * V * sizeof *got);
    convert("aligned", "q8", "q8");
    convert("q8", "dequant", "f32");
    eng_model *m = load("dequant");
    ck_assert_str_eq(eng_model_dtype(m), "f32");
    run_alone(m, want);
    eng_model_free(m);
    m = load("q8");
    ck_assert_str_eq(eng_model_dtype(m), "q8");
    ck_assert_uint_eq(eng_model_copied_bytes(m), 0);
    /* int8 matrices plus one F32 scale per 32 weights: 1.125 bytes each */
    ck_assert_uint_lt(eng_model_weight_bytes(m), eng_model_params(m) * 2);
    run_alone(m, got);
    eng_model_free(m);
    if (op_use_avx512vnni()) {
        /* Each input rounded to 1/254 of its block's largest |x| at most,
         * over the model's depth, relative to the logits' spread. */
        double spread = 0, worst = 0;
        for (size_t i = 0; i < 4 * V; i++) spread = fmax(spread, fabs((double)want[i]));
        for (size_t i = 0; i < 4 * V; i++)
            worst = fmax(worst, fabs((double)got[i] - (double)want[i]));
        printf("Q8 at avx512-vnni: logits within %.3g of the widening's (largest %.3g)\n", worst,
               spread);
        ck_assert_msg(worst > 0 && worst <= 0.02 * spread,
                      "Q8 at avx512-vnni: logits %g from the widening's (largest %g)", worst,
                      spread);
    } else {
        ck_assert_msg(memcmp(want, got, 4 * V * sizeof *got) == 0, "q8 logits differ");
    }
    free(want);
    free(got);
}
END_TEST

/* The panel64 layout moves the projections' elements, never their values or
 * the order they are summed in: each format's panel file gives exactly the
 * logits of the same format in the Hugging Face layout (a prefill of 7 and
 * three decodes, run_alone), served from the mapping all the same. */
START_TEST(eng_model_panel_gives_the_logits_of_its_hf_file)
{
    static const char *const pairs[][2] = {{"hs64", "hs64_panel"},
                                           {"hs64_bf16", "hs64_bf16_panel"},
                                           {"hs64_q8", "hs64_q8_panel"},
                                           {"hs64_f16", "hs64_f16_panel"}};
    convert("hs64", "hs64_f16", "f16");
    convert_panel("hs64", "hs64_f16_panel", "f16");
    size_t V = 500;
    float *want = malloc(4 * V * sizeof *want), *got = malloc(4 * V * sizeof *got);
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        /* The HF file from its own pages (GPT2D_PANEL_COPY=off) ... */
        ck_assert_int_eq(setenv("GPT2D_PANEL_COPY", "off", 1), 0);
        eng_model *m = load(pairs[i][0]);
        ck_assert_str_eq(eng_model_layout(m), "hf");
        ck_assert_uint_eq(eng_model_panel_bytes(m), 0);
        run_alone(m, want);
        const char *dtype = eng_model_dtype(m);
        size_t bytes = eng_model_weight_bytes(m);
        eng_model_free(m);
        /* ... and through its panel copy (op_w_panels.c: F32 and F16 where
         * the panel kernels run, the projections' size) ... */
        ck_assert_int_eq(unsetenv("GPT2D_PANEL_COPY"), 0);
        m = load(pairs[i][0]);
        const eng_config *c = eng_model_config(m);
        int copied = (strcmp(dtype, "f32") == 0 || strcmp(dtype, "f16") == 0) && op_use_avx512bw();
        size_t proj = c->n_layer * 12 * c->n_embd * c->n_embd * (strcmp(dtype, "f32") ? 2u : 4u);
        ck_assert_uint_eq(eng_model_panel_bytes(m), copied ? proj : 0);
        for (size_t l = 0; l < c->n_layer; l++) ck_assert_int_eq(m->layers[l].fc2_w.panel, copied);
        run_alone(m, got);
        eng_model_free(m);
        ck_assert_msg(memcmp(want, got, 4 * V * sizeof *got) == 0, "%s: panel copy logits differ",
                      pairs[i][0]);
        /* ... and the panel64 file give the same bits. */
        m = load(pairs[i][1]);
        ck_assert_str_eq(eng_model_layout(m), "panel64");
        ck_assert_str_eq(eng_model_dtype(m), dtype);
        ck_assert_uint_eq(eng_model_weight_bytes(m), bytes);
        ck_assert_uint_eq(eng_model_copied_bytes(m), 0);
        ck_assert_uint_eq(eng_model_panel_bytes(m), 0);
        run_alone(m, got);
        eng_model_free(m);
        ck_assert_msg(memcmp(want, got, 4 * V * sizeof *got) == 0, "%s: panel64 logits differ",
                      pairs[i][1]);
    }
    free(want);
    free(got);
}
END_TEST

/* pairs64 (wformat.h) stores a BF16 file's projections as the pair copy
 * lays them out: the same logits as the hf file, at every level. At
 * "avx512-bf16" the kernels read the projections from the file's mapping
 * (no private bytes but wte's pair copy); below it the projections get a
 * panel copy, as no other kernel reads the pairs. */
START_TEST(eng_model_pairs64_gives_the_logits_of_its_hf_file)
{
    convert_layout("hs64", "hs64_bf16_pairs", "bf16", "pairs64");
    size_t V = 500;
    float *want = malloc(4 * V * sizeof *want), *got = malloc(4 * V * sizeof *got);
    eng_model *m = load("hs64_bf16");
    run_alone(m, want);
    size_t bytes = eng_model_weight_bytes(m);
    eng_model_free(m);
    m = load("hs64_bf16_pairs");
    const eng_config *c = eng_model_config(m);
    const size_t C = c->n_embd, L = c->n_layer;
    ck_assert_str_eq(eng_model_layout(m), "pairs64");
    ck_assert_str_eq(eng_model_dtype(m), "bf16");
    ck_assert_uint_eq(eng_model_weight_bytes(m), bytes);
    ck_assert_uint_eq(eng_model_copied_bytes(m), 0);
    int dp = op_use_avx512bf16();
    ck_assert_uint_eq(eng_model_pair_bytes(m), dp ? op_w_pairs_bytes(C, c->n_vocab) : 0);
    ck_assert_uint_eq(eng_model_panel_bytes(m), dp ? 0 : L * 12 * C * C * 2);
    for (size_t l = 0; l < L; l++) {
        const op_w *w = &m->layers[l].fc_w;
        if (dp)
            ck_assert_msg(w->pairs != NULL && (const void *)w->pairs == w->p,
                          "layer %zu: the pairs are not read from the mapping", l);
        else
            ck_assert_int_eq(w->panel, 1);
    }
    run_alone(m, got);
    eng_model_free(m);
    ck_assert_msg(memcmp(want, got, 4 * V * sizeof *got) == 0, "pairs64 logits differ");
    /* The same file with its data 8- but not 64-byte aligned (a longer
     * header): the aligned loads cannot read it in place, so the pairs are
     * copied (private), with the same logits. */
    char p[320], err[512], pad[80] = "";
    snprintf(p, sizeof p, "%s/hs64_bf16_pairs/model.safetensors", dir);
    sft_file *f;
    ck_assert_int_eq(sft_open(p, SFT_LOAD_COPY, &f, err, sizeof err), SFT_OK);
    size_t n = sft_count(f);
    sft_tensor *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++) t[i] = *sft_tensor_at(f, i);
    snprintf(p, sizeof p, "%s/pairs_mis", dir);
    mkdir(p, 0755);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "cp '%s/hs64/config.json' '%s/pairs_mis/'", dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(p, sizeof p, "%s/pairs_mis/model.safetensors", dir);
    for (size_t len = 1; len < 16; len++) {
        memset(pad, 'x', len);
        pad[len] = '\0';
        sft_meta meta[2] = {{"gpt2d.layout", "pairs64"}, {"pad", pad}};
        ck_assert_int_eq(sft_save(p, t, n, meta, 2, NULL, err, sizeof err), SFT_OK);
        sft_file *g;
        ck_assert_int_eq(sft_open(p, SFT_LOAD_MMAP, &g, err, sizeof err), SFT_OK);
        size_t start = sft_data_start(g);
        sft_close(g);
        if (start % 64 != 0) break;
    }
    free(t);
    sft_close(f);
    m = load("pairs_mis");
    if (dp) {
        ck_assert_uint_eq(eng_model_pair_bytes(m), op_w_pairs_bytes(C, V) + L * 12 * C * C * 2);
        ck_assert((const void *)m->layers[0].fc_w.pairs != m->layers[0].fc_w.p);
    }
    run_alone(m, got);
    eng_model_free(m);
    ck_assert_msg(memcmp(want, got, 4 * V * sizeof *got) == 0, "misaligned pairs64 logits differ");
    free(want);
    free(got);
}
END_TEST

/* DIR/hs64_bf16_pairs rewritten with h.0.mlp.c_fc.weight's shape (kind 0)
 * or dtype (kind 1) changed, its bytes kept, or as a 3-D tensor (kind 2):
 * refused with `expect`, never read past its end. */
static void malformed_pairs(int kind, const char *expect)
{
    char p[320], err[512];
    snprintf(p, sizeof p, "%s/hs64_bf16_pairs/model.safetensors", dir);
    sft_file *f;
    ck_assert_int_eq(sft_open(p, SFT_LOAD_COPY, &f, err, sizeof err), SFT_OK);
    size_t n = sft_count(f);
    sft_tensor *t = malloc(n * sizeof *t);
    int64_t shape[4];
    for (size_t i = 0; i < n; i++) {
        t[i] = *sft_tensor_at(f, i);
        if (strcmp(t[i].name, "h.0.mlp.c_fc.weight") != 0) continue;
        memcpy(shape, t[i].shape, sizeof shape);
        if (kind == 0) { /* [N/64, K/2, 64, 2] -> [N/64 / 2, K, 64, 2]: the same count */
            shape[0] /= 2;
            shape[1] *= 2;
        }
        if (kind == 1) t[i].dtype = SFT_F16;
        if (kind == 2) {
            shape[1] *= 2;
            t[i].ndim = 3;
        }
        t[i].shape = shape;
    }
    sft_meta meta[1] = {{"gpt2d.layout", "pairs64"}};
    snprintf(p, sizeof p, "%s/badpairs", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/badpairs/model.safetensors", dir);
    sft_save_opts so = {.data_align = 64};
    ck_assert_int_eq(sft_save(p, t, n, meta, 1, &so, err, sizeof err), SFT_OK);
    char cfg[700];
    snprintf(cfg, sizeof cfg, "cp '%s/hs64/config.json' '%s/badpairs/'", dir, dir);
    ck_assert_int_eq(system(cfg), 0);
    eng_model *m = (eng_model *)1;
    snprintf(p, sizeof p, "%s/badpairs", dir);
    ck_assert_int_eq(eng_model_load(p, &m, err, sizeof err), ENG_EFORMAT);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err, expect) != NULL, "kind %d: '%s' lacks '%s'", kind, err, expect);
    free(t);
    sft_close(f);
}

START_TEST(eng_model_malformed_pairs64_is_refused)
{
    convert_layout("hs64", "hs64_bf16_pairs", "bf16", "pairs64");
    malformed_pairs(0, "tensor 'h.0.mlp.c_fc.weight' is not BF16 [28, 224, 64, 2] (a pairs64 "
                       "file's projection of 448 x 1792)");
    malformed_pairs(1, "pairs64 file: projection 'h.0.mlp.c_fc.weight' is F16 4-D, expected "
                       "BF16 [N/64, K/2, 64, 2]");
    malformed_pairs(2, "pairs64 file: projection 'h.0.mlp.c_fc.weight' is BF16 3-D");
}
END_TEST

/* GPT2D_PANEL_COPY takes auto or off; anything else is refused by name,
 * never read as either. */
START_TEST(eng_model_bad_panel_copy_setting_is_einval)
{
    char p[320], err[512];
    snprintf(p, sizeof p, "%s/hs64", dir);
    ck_assert_int_eq(setenv("GPT2D_PANEL_COPY", "no", 1), 0);
    eng_model *m = NULL;
    ck_assert_int_eq(eng_model_load(p, &m, err, sizeof err), ENG_EINVAL);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err, "GPT2D_PANEL_COPY must be auto or off, not 'no'") != NULL, "err: %s",
                  err);
    ck_assert_int_eq(setenv("GPT2D_PANEL_COPY", "auto", 1), 0);
    m = load("hs64");
    eng_model_free(m);
    ck_assert_int_eq(unsetenv("GPT2D_PANEL_COPY"), 0);
}
END_TEST

/* Rewrites DIR/q8 with one change and expects the loader to refuse it with
 * an error containing `expect`. kind: 0 drop a scale tensor, 1 a scale
 * tensor of the wrong shape, 2 of the wrong dtype, 3 no block metadata,
 * 4 no q8 metadata at all (I8 matrices in a float file), 5 a block of 64. */
static void malformed_q8(int kind, const char *expect)
{
    char p[320], err[512];
    snprintf(p, sizeof p, "%s/q8/model.safetensors", dir);
    sft_file *f;
    ck_assert_int_eq(sft_open(p, SFT_LOAD_COPY, &f, err, sizeof err), SFT_OK);
    size_t n = sft_count(f), k = 0;
    sft_tensor *t = malloc(n * sizeof *t);
    static const int64_t bad_shape[] = {1, 192};
    static float zeros[192];
    static uint16_t halves[2 * 192];
    for (size_t i = 0; i < n; i++) {
        t[k] = *sft_tensor_at(f, i);
        if (strcmp(t[k].name, "h.0.attn.c_attn.weight.q8_scale") == 0) {
            if (kind == 0) continue;
            if (kind == 1) {
                t[k].shape = bad_shape;
                t[k].data = zeros;
            }
            if (kind == 2) {
                t[k].dtype = SFT_F16;
                t[k].data = halves;
            }
        }
        k++;
    }
    sft_meta meta[2] = {{"gpt2d.format", "q8"}, {"gpt2d.q8_block", kind == 5 ? "64" : "32"}};
    size_t nmeta = kind == 4 ? 0 : kind == 3 ? 1 : 2;
    snprintf(p, sizeof p, "%s/bad", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/bad/model.safetensors", dir);
    ck_assert_int_eq(sft_save(p, t, k, meta, nmeta, NULL, err, sizeof err), SFT_OK);
    eng_model *m = (eng_model *)1;
    snprintf(p, sizeof p, "%s/bad", dir);
    ck_assert_int_eq(eng_model_load(p, &m, err, sizeof err), ENG_EFORMAT);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err, expect) != NULL, "kind %d: '%s' lacks '%s'", kind, err, expect);
    free(t);
    sft_close(f);
}

START_TEST(eng_model_malformed_q8_is_refused)
{
    convert("aligned", "q8", "q8");
    malformed_q8(0, "q8 tensor 'h.0.attn.c_attn.weight' has no scale tensor "
                    "'h.0.attn.c_attn.weight.q8_scale'");
    malformed_q8(1, "q8 scale 'h.0.attn.c_attn.weight.q8_scale' must be F32 [2, 192]");
    malformed_q8(2, "q8 scale 'h.0.attn.c_attn.weight.q8_scale' must be F32 [2, 192]");
    malformed_q8(3, "metadata gpt2d.q8_block is missing; expected \"32\"");
    malformed_q8(4, "I8 matrix 'h.0.attn.c_attn.weight' in a file without gpt2d.format \"q8\"");
    malformed_q8(5, "metadata gpt2d.q8_block is \"64\"; expected \"32\"");
}
END_TEST

START_TEST(eng_model_missing_or_misshapen_tensor_is_named)
{
    char p[320], err[512];
    snprintf(p, sizeof p, "%s/aligned/model.safetensors", dir);
    sft_file *f;
    ck_assert_int_eq(sft_open(p, SFT_LOAD_COPY, &f, err, sizeof err), SFT_OK);
    size_t n = sft_count(f);
    sft_tensor *t = malloc(n * sizeof *t);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(sft_tensor_at(f, i)->name, "h.1.mlp.c_fc.bias") != 0)
            t[k++] = *sft_tensor_at(f, i);
    snprintf(p, sizeof p, "%s/missing", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/missing/model.safetensors", dir);
    ck_assert_int_eq(sft_save(p, t, k, NULL, 0, NULL, err, sizeof err), SFT_OK);
    eng_model *m = (eng_model *)1;
    snprintf(p, sizeof p, "%s/missing", dir);
    ck_assert_int_eq(eng_model_load(p, &m, err, sizeof err), ENG_EFORMAT);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err, "missing tensor 'h.1.mlp.c_fc.bias'") != NULL, "%s", err);

    /* A square matrix with the wrong shape: swap a bias for a 2-D tensor. */
    static const int64_t bad_shape[] = {8, 8};
    static float zeros[64];
    for (size_t i = 0; i < k; i++)
        if (strcmp(t[i].name, "h.0.attn.c_proj.bias") == 0) {
            t[i].ndim = 2;
            t[i].shape = bad_shape;
            t[i].data = zeros;
        }
    snprintf(p, sizeof p, "%s/missing/model.safetensors", dir);
    ck_assert_int_eq(sft_save(p, t, k, NULL, 0, NULL, err, sizeof err), SFT_OK);
    snprintf(p, sizeof p, "%s/missing", dir);
    ck_assert_int_eq(eng_model_load(p, &m, err, sizeof err), ENG_EFORMAT);
    ck_assert_msg(strstr(err, "'h.0.attn.c_proj.bias' has shape [8, 8], expected [64]") != NULL,
                  "%s", err);
    ck_assert_int_eq(eng_model_load("/nonexistent", &m, err, sizeof err), ENG_EIO);
    free(t);
    sft_close(f);
}
END_TEST

/* 1 when every 4 KB page of [p, p + len) is mapped (msync fails with
 * ENOMEM on an unmapped page). */
static int pages_mapped(const void *p, size_t len)
{
    for (size_t o = 0; o < len; o += 4096)
        if (msync((char *)(uintptr_t)p + o, 4096, MS_ASYNC) != 0) return 0;
    return 1;
}

/* A BF16 model's pair copies (op_matmul_bf16.c; none at GPT2D_KERNELS=avx512)
 * are mapped over their whole length while the model lives, counted in
 * eng_model_pair_bytes, and unmapped, every page, by eng_model_free. */
START_TEST(eng_model_free_unmaps_the_pair_copies)
{
    static const char *const subs[] = {"hs64_bf16", "hs64_bf16_panel"};
    for (size_t s = 0; s < 2; s++) {
        eng_model *m = load(subs[s]);
        const size_t C = m->cfg.n_embd, V = m->cfg.n_vocab, L = m->cfg.n_layer;
        const void *at[64];
        size_t len[64], n = 0, total = 0;
        for (size_t i = 0; i < L; i++) {
            const op_w *w[4] = {&m->layers[i].attn_w, &m->layers[i].proj_w, &m->layers[i].fc_w,
                                &m->layers[i].fc2_w};
            const size_t K[4] = {C, C, C, 4 * C}, N[4] = {3 * C, C, 4 * C, C};
            for (size_t j = 0; j < 4; j++) {
                ck_assert_int_eq(w[j]->pairs != NULL, op_use_avx512bf16());
                if (w[j]->pairs == NULL) continue;
                at[n] = w[j]->pairs;
                len[n++] = op_w_pairs_bytes(K[j], N[j]);
                total += op_w_pairs_bytes(K[j], N[j]);
            }
        }
        ck_assert_int_eq(m->wte.pairs != NULL, op_use_avx512bf16());
        if (m->wte.pairs != NULL) {
            at[n] = m->wte.pairs;
            len[n++] = op_w_pairs_bytes(C, V);
            total += op_w_pairs_bytes(C, V);
        }
        ck_assert_uint_eq(eng_model_pair_bytes(m), total);
        for (size_t i = 0; i < n; i++) {
            ck_assert_msg(pages_mapped(at[i], len[i]), "%s: copy %zu not mapped", subs[s], i);
            ck_assert_uint_eq((uintptr_t)at[i] % 64, 0);
        }
        eng_model_free(m);
        for (size_t i = 0; i < n; i++)
            for (size_t o = 0; o < len[i]; o += 4096)
                ck_assert_msg(msync((char *)(uintptr_t)at[i] + o, 4096, MS_ASYNC) != 0,
                              "%s: page %zu of copy %zu still mapped after eng_model_free", subs[s],
                              o / 4096, i);
    }
}
END_TEST

START_TEST(eng_kv_reserve_is_all_or_nothing)
{
    eng_model *m = load("aligned");
    eng_kv *kv;
    char err[256];
    /* 2 layers x K,V x 4 positions x 64 floats = 4 KiB per block; 3 blocks. */
    ck_assert_int_eq(eng_kv_new(m, 3 * 4096 + 100, 4, &kv, err, sizeof err), ENG_OK);
    ck_assert_uint_eq(eng_kv_blocks_total(kv), 3);
    eng_seq a = {0}, b = {0};
    ck_assert_int_eq(eng_kv_reserve(kv, &a, 9), ENG_OK); /* 3 blocks */
    ck_assert_uint_eq(eng_kv_blocks_free(kv), 0);
    ck_assert_int_eq(eng_kv_reserve(kv, &b, 1), ENG_ENOMEM);
    ck_assert_uint_eq(b.nblocks, 0);
    ck_assert_int_eq(eng_kv_reserve(kv, &a, 13), ENG_ENOMEM); /* would need a 4th */
    ck_assert_uint_eq(a.nblocks, 3);
    eng_kv_release(kv, &a);
    ck_assert_uint_eq(eng_kv_blocks_free(kv), 3);
    eng_kv *none;
    ck_assert_int_eq(eng_kv_new(m, 100, 4, &none, err, sizeof err), ENG_EINVAL);
    ck_assert_ptr_null(none);
    eng_kv_free(kv);
    eng_model_free(m);
}
END_TEST

START_TEST(eng_forward_rejects_bad_items_before_computing)
{
    eng_model *m = load("aligned");
    eng_kv *kv;
    eng_workspace *w;
    eng_seq s = {0};
    char err[256];
    float logits[500];
    ck_assert_int_eq(eng_kv_new(m, 1 << 20, 4, &kv, err, sizeof err), ENG_OK);
    ck_assert_int_eq(eng_workspace_new(m, 4, 2, &w), ENG_OK);
    ck_assert_int_eq(eng_kv_reserve(kv, &s, 4), ENG_OK);
    static const int32_t bad[] = {1, 500}, many[] = {1, 2, 3, 4, 5};
    eng_item it = {.seq = &s, .tokens = bad, .n = 2, .want = ENG_LOGITS_LAST, .logits = logits};
    ck_assert_int_eq(eng_forward(m, kv, w, &it, 1, err, sizeof err), ENG_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "token 500"));
    it.tokens = many;
    it.n = 5;
    ck_assert_int_eq(eng_forward(m, kv, w, &it, 1, err, sizeof err), ENG_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "reserved"));
    ck_assert_uint_eq(s.len, 0);
    eng_kv_release(kv, &s);
    eng_workspace_free(w);
    eng_kv_free(kv);
    eng_model_free(m);
}
END_TEST

START_TEST(eng_sample_greedy_topk_and_seed)
{
    float logits[6] = {1, 5, 5, 2, -1, 0};
    void *scratch = malloc(eng_sample_scratch_bytes(6));
    ck_assert_ptr_nonnull(scratch);
    eng_rng r;
    eng_rng_seed(&r, 1);
    eng_sampling greedy = {.temperature = 0, .top_p = 1};
    ck_assert_int_eq(eng_sample(logits, 6, &greedy, &r, scratch), 1); /* lowest id on ties */
    eng_sampling top1 = {.temperature = 1, .top_k = 1, .top_p = 1};
    for (int i = 0; i < 50; i++) {
        float l[6] = {1, 2, 9, 2, -1, 0};
        ck_assert_int_eq(eng_sample(l, 6, &top1, &r, scratch), 2);
    }
    /* top-k 2 of {id 1, id 2}: both appear, nothing else. */
    eng_sampling top2 = {.temperature = 1, .top_k = 2, .top_p = 1};
    int seen[6] = {0};
    for (int i = 0; i < 400; i++) {
        float l[6] = {1, 5, 5, 2, -1, 0};
        seen[eng_sample(l, 6, &top2, &r, scratch)]++;
    }
    ck_assert(seen[1] > 100 && seen[2] > 100 && seen[0] + seen[3] + seen[4] + seen[5] == 0);
    /* top-p 0.5 keeps only the dominant token. */
    eng_sampling nucleus = {.temperature = 1, .top_p = 0.5f};
    for (int i = 0; i < 50; i++) {
        float l[6] = {0, 0, 10, 0, 0, 0};
        ck_assert_int_eq(eng_sample(l, 6, &nucleus, &r, scratch), 2);
    }
    /* The same seed gives the same draws. */
    eng_rng r1, r2;
    eng_rng_seed(&r1, 42);
    eng_rng_seed(&r2, 42);
    eng_sampling t = {.temperature = 1.0f, .top_p = 1};
    for (int i = 0; i < 100; i++) {
        float l1[6] = {1, 1, 1, 1, 1, 1}, l2[6] = {1, 1, 1, 1, 1, 1};
        ck_assert_int_eq(eng_sample(l1, 6, &t, &r1, scratch), eng_sample(l2, 6, &t, &r2, scratch));
    }
    free(scratch);
}
END_TEST

/* The reference nucleus, by a full sort: ids ordered by logit descending
 * (ties by id), softmax at temperature T in double, the shortest prefix
 * whose mass reaches p. Marks in[] the tokens kept; returns how many. */
typedef struct {
    float logit;
    int id;
} ref_cand;

static int ref_cmp(const void *a, const void *b)
{
    const ref_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static size_t ref_nucleus(const float *l, size_t V, double T, double p, char *in, double *kept_mass)
{
    ref_cand *c = malloc(V * sizeof *c);
    ck_assert_ptr_nonnull(c);
    for (size_t i = 0; i < V; i++) c[i] = (ref_cand){l[i], (int)i};
    qsort(c, V, sizeof *c, ref_cmp);
    double sum = 0;
    for (size_t i = 0; i < V; i++) sum += exp(((double)c[i].logit - c[0].logit) / T);
    double acc = 0;
    size_t n = 0;
    memset(in, 0, V);
    while (n < V) {
        acc += exp(((double)c[n].logit - c[0].logit) / T) / sum;
        in[c[n++].id] = 1;
        if (acc >= p) break;
    }
    *kept_mass = acc;
    free(c);
    return n;
}

/* Top-p without top-k (bucketed, no sort of the vocabulary): at GPT-2's
 * vocabulary size, on peaked, flat and heavily tied logits, every draw is a
 * token of the reference nucleus, and over many draws the kept tokens come
 * up in proportion to their probabilities. A token at the very edge of the
 * nucleus may fall either way by rounding (the two sum in different
 * orders); the test allows exactly that: a token outside the reference set
 * must sit where the reference's running mass is within 1e-6 of p. */
START_TEST(eng_sample_top_p_matches_a_full_sort)
{
    const size_t V = 50257;
    float *l = malloc(V * sizeof *l), *w = malloc(V * sizeof *w);
    char *in = malloc(V);
    void *scratch = malloc(eng_sample_scratch_bytes(V));
    ck_assert(l && w && in && scratch);
    uint64_t x = 12345;
    const struct {
        double spread; /* logits uniform in [-spread, spread] */
        int ties;      /* rounded to multiples of 1/4: many equal logits */
        float T, p;
    } cases[] = {
        {12, 0, 1.0f, 0.9f},  {2, 0, 0.8f, 0.95f},  {6, 1, 1.0f, 0.5f},
        {0.1, 0, 1.0f, 0.3f}, {20, 1, 0.7f, 0.99f}, {12, 0, 1.5f, 0.05f},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        for (size_t i = 0; i < V; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            double u = (double)(x >> 11) * 0x1.0p-53;
            float v = (float)((2 * u - 1) * cases[ci].spread);
            l[i] = cases[ci].ties ? roundf(v * 4) / 4 : v;
        }
        double mass;
        size_t n = ref_nucleus(l, V, cases[ci].T, cases[ci].p, in, &mass);
        eng_sampling sp = {.temperature = cases[ci].T, .top_p = cases[ci].p};
        eng_rng r;
        eng_rng_seed(&r, 7 + ci);
        size_t outside = 0;
        for (int d = 0; d < 300; d++) {
            memcpy(w, l, V * sizeof *l);
            int32_t t = eng_sample(w, V, &sp, &r, scratch);
            ck_assert(t >= 0 && (size_t)t < V);
            if (!in[t]) outside++;
        }
        /* The reference's mass overshoots p by at most its last token; a
         * token outside may only be drawn if the edge was within rounding. */
        ck_assert_msg(outside == 0 || fabs(mass - cases[ci].p) < 1e-6,
                      "case %zu: %zu of 300 draws outside the nucleus of %zu tokens", ci, outside,
                      n);
    }
    /* A peaked case, where the nucleus is small enough for every one of its
     * tokens to be drawn: 40 strong tokens (scattered ids) over a weak
     * tail, p = 0.5 keeps about half of them. The draws must be exactly
     * the reference's set: nothing outside, and every kept token seen. */
    for (size_t i = 0; i < V; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((double)(x >> 11) * 0x1.0p-53 * -4.0);
    }
    for (int k = 0; k < 40; k++) l[(size_t)k * 1231 + 17] = 8.0f + 0.05f * (float)k;
    {
        double mass;
        size_t n = ref_nucleus(l, V, 1.0, 0.5, in, &mass);
        ck_assert(n > 5 && n < 40);
        eng_sampling sp = {.temperature = 1, .top_p = 0.5f};
        eng_rng r;
        eng_rng_seed(&r, 5);
        unsigned char *seen = calloc(V, 1);
        ck_assert_ptr_nonnull(seen);
        for (int d = 0; d < 3000; d++) {
            memcpy(w, l, V * sizeof *l);
            int32_t t = eng_sample(w, V, &sp, &r, scratch);
            ck_assert_msg(in[(size_t)t], "token %d is outside the nucleus", t);
            seen[(size_t)t] = 1;
        }
        size_t covered = 0;
        for (size_t i = 0; i < V; i++) covered += seen[i];
        ck_assert_uint_eq(covered, n);
        free(seen);
    }
    /* Proportions on a small vocabulary: p = 0.85 over weights 0.4, 0.3,
     * 0.2, 0.1 keeps the first three (0.4 + 0.3 < 0.85 <= 0.9),
     * renormalised to 4/9, 3/9, 2/9. */
    float small[4] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f)};
    eng_sampling sp = {.temperature = 1, .top_p = 0.85f};
    eng_rng r;
    eng_rng_seed(&r, 99);
    int seen[4] = {0};
    const int draws = 90000;
    for (int d = 0; d < draws; d++) {
        float v[4];
        memcpy(v, small, sizeof v);
        seen[eng_sample(v, 4, &sp, &r, scratch)]++;
    }
    ck_assert_int_eq(seen[3], 0);
    const double want[3] = {4.0 / 9, 3.0 / 9, 2.0 / 9};
    for (int i = 0; i < 3; i++) /* 5 standard deviations */
        ck_assert_msg(fabs(seen[i] / (double)draws - want[i])
                          < 5 * sqrt(want[i] * (1 - want[i]) / draws),
                      "token %d: %d of %d draws", i, seen[i], draws);
    free(l);
    free(w);
    free(in);
    free(scratch);
}
END_TEST

/* Without top-k or top-p, every token of the vocabulary is drawn in
 * proportion to softmax(logits / T). */
START_TEST(eng_sample_full_vocabulary_follows_softmax)
{
    enum { V = 300 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)(i % 7) * 0.5f - (i == 13 ? 3.0f : 0.0f);
    const double T = 0.8;
    double p[V], sum = 0;
    for (int i = 0; i < V; i++) sum += p[i] = exp(l[i] / T);
    void *scratch = malloc(eng_sample_scratch_bytes(V));
    ck_assert_ptr_nonnull(scratch);
    eng_sampling sp = {.temperature = (float)T, .top_p = 1};
    eng_rng r;
    eng_rng_seed(&r, 3);
    static int seen[V];
    const int draws = 300000;
    for (int d = 0; d < draws; d++) {
        float v[V];
        memcpy(v, l, sizeof v);
        seen[eng_sample(v, V, &sp, &r, scratch)]++;
    }
    /* Per residue class of i % 7 (43 tokens each, the same probability),
     * within 5 standard deviations; and token 13 (lowered) on its own. */
    for (int k = 0; k < 7; k++) {
        double want = 0;
        int got = 0;
        for (int i = k; i < V; i += 7)
            if (i != 13) {
                want += p[i] / sum;
                got += seen[i];
            }
        ck_assert_msg(fabs(got / (double)draws - want) < 5 * sqrt(want * (1 - want) / draws),
                      "class %d: %d of %d draws, want %.4f", k, got, draws, want);
    }
    double want13 = p[13] / sum;
    ck_assert(fabs(seen[13] / (double)draws - want13) < 5 * sqrt(want13 / draws) + 1e-4);
    free(scratch);
}
END_TEST

/* ---- Kernels against their reference order, in every weight format ---- */

static unsigned lcg(unsigned *seed)
{
    return *seed = *seed * 1103515245u + 12345u;
}

static float unit(unsigned *seed)
{
    return (float)lcg(seed) / 4e9f - 0.5f;
}

/* A weight tensor of R x Cc elements in format dt and its F32 widening,
 * computed here from the definitions (kernels.h): F16 by sft_f16_to_f32 of
 * any finite half (subnormals included), BF16 the top 16 bits, Q8 the F32
 * product q * scale with scales per 32 rows (rows = 1: a projection, K x N)
 * or per 32 consecutive elements (rows = 0: the embeddings). */
typedef struct {
    void *p;
    float *scale, *wide;
    op_w w;
} test_w;

static void test_w_make(test_w *t, op_dtype dt, size_t R, size_t Cc, int rows, unsigned *seed)
{
    size_t n = R * Cc, nsc = rows ? (R + 31) / 32 * Cc : (n + 31) / 32;
    t->wide = malloc(n * sizeof(float));
    t->p = malloc(n * 4);
    t->scale = dt == OP_Q8 ? malloc(nsc * sizeof(float)) : NULL;
    ck_assert(t->wide && t->p && (dt != OP_Q8 || t->scale));
    for (size_t i = 0; dt == OP_Q8 && i < nsc; i++)
        t->scale[i] = ((float)(lcg(seed) % 1000) + 1) / 65536.0f;
    for (size_t i = 0; i < n; i++) {
        float f = unit(seed);
        uint16_t h;
        switch (dt) {
        case OP_F32: ((float *)t->p)[i] = t->wide[i] = f; break;
        case OP_F16:
            do h = (uint16_t)(lcg(seed) >> 8);
            while ((h & 0x7C00u) == 0x7C00u); /* finite halves, subnormals too */
            ((uint16_t *)t->p)[i] = h;
            t->wide[i] = sft_f16_to_f32(h);
            break;
        case OP_BF16:
            h = (uint16_t)(((lcg(seed) >> 8) & 0x80FFu) | (uint16_t)((100 + lcg(seed) % 40) << 7));
            ((uint16_t *)t->p)[i] = h;
            t->wide[i] = sft_bf16_to_f32(h);
            break;
        case OP_Q8: {
            int8_t q = (int8_t)((int)(lcg(seed) % 255) - 127);
            ((int8_t *)t->p)[i] = q;
            size_t si = rows ? (i / Cc / 32) * Cc + i % Cc : i / 32;
            t->wide[i] = (float)q * t->scale[si];
            break;
        }
        }
    }
    t->w = (op_w){t->p, t->scale, dt, 0, NULL, NULL};
}

static void test_w_free(test_w *t)
{
    free(t->p);
    free(t->scale);
    free(t->wide);
}

static const char *const dt_names[] = {"F32", "F16", "BF16", "Q8"};

/* W (K, N) of t rewritten in the panel64 layout, from its definition
 * (kernels.h, formats/include/wformat.h): element (k, n) moves to ((n / 64) * K +
 * k) * 64 + n % 64, and a Q8 scale (j, n) to ((n / 64) * ceil(K / 32) + j)
 * * 64 + n % 64. The widened values stay where they were. */
static void test_w_panel(test_w *t, size_t K, size_t N)
{
    size_t es = t->w.dt == OP_F32 ? 4 : t->w.dt == OP_Q8 ? 1 : 2, kq = (K + 31) / 32;
    unsigned char *p = malloc(K * N * es);
    float *sc = t->scale ? malloc(kq * N * sizeof *sc) : NULL;
    ck_assert(p && (!t->scale || sc));
    for (size_t k = 0; k < K; k++)
        for (size_t n = 0; n < N; n++)
            memcpy(p + (((n / 64) * K + k) * 64 + n % 64) * es,
                   (unsigned char *)t->p + (k * N + n) * es, es);
    for (size_t j = 0; sc && j < kq; j++)
        for (size_t n = 0; n < N; n++) sc[((n / 64) * kq + j) * 64 + n % 64] = t->scale[j * N + n];
    free(t->p);
    free(t->scale);
    t->p = p;
    t->scale = sc;
    t->w = (op_w){p, sc, t->w.dt, 1, NULL, NULL};
}

/* Every row count from 1 to 70 takes one of the matmul's tile shapes (up to
 * 24 rows with AVX-512 or 48 with AVX2, k-blocked tiles; more, packed
 * strips; and every partial tile of each); each must give, bit for bit,
 * b[n] followed by one FMA per k in increasing k over the widened weights,
 * computed here with fmaf, in every weight format (loop index % 4) and
 * with a 16-bit bias too, in both layouts of W (loop index / 4: row-major,
 * then panel64). K = 70 leaves a k-block tail (and a partial Q8 block)
 * and N = 112 a column tail past the 32-column tasks; panels take N = 320
 * (five panels: three on one thread, a pair and an odd one at one row,
 * and a pair on the other); K = 200 too. Run at every kernel level
 * (GPT2D_KERNELS) by tests/meson.build. */
static void matmul_rows_check(op_dtype dt, int panel, size_t K)
{
    /* Rows 1..70, then 261: past the BF16 level's chunk of 256 rows. */
    enum { TMAX = 261, TALL = 70 };
    /* BF16 weights at the "avx512-bf16" level: the inputs rounded to BF16
     * and VDPBF16PS's pairs (kernels.h, op_bf16_dot2; op_matmul_bf16.c). */
    int dp = dt == OP_BF16 && op_use_avx512bf16();
    /* Q8 weights at the "avx512-vnni" level: the inputs quantized per
     * block, exact integer sums, one FMA a block (kernels.h,
     * op_q8_quantize and op_q8_block; op_matmul_q8.c). */
    int vnni = dt == OP_Q8 && op_use_avx512vnni();
    size_t N = panel ? 320 : 112;
    op_pool *pool = op_pool_new(2);
    ck_assert_ptr_nonnull(pool);
    float *pack =
        aligned_alloc(64, op_matmul_scratch_floats(op_pool_size(pool), K, N) * sizeof(float));
    float *in = malloc(TMAX * K * sizeof *in), *out = malloc(TMAX * N * sizeof *out);
    float *want = malloc(TMAX * N * sizeof *want);
    ck_assert(pack && in && out && want);
    unsigned seed = 7;
    for (size_t i = 0; i < TMAX * K; i++) in[i] = unit(&seed);
    /* Rows 2 and 5 start with a block of zeros (the Q8 level's d = 0). */
    for (size_t k = 0; k < OP_Q8_BLOCK && k < K; k++) in[2 * K + k] = in[5 * K + k] = 0.0f;
    test_w W, b;
    test_w_make(&W, dt, K, N, 1, &seed);
    test_w_make(&b, dt == OP_Q8 ? OP_F32 : dt, 1, N, 0, &seed);
    size_t KB = (K + OP_Q8_BLOCK - 1) / OP_Q8_BLOCK;
    int8_t *xq = vnni ? malloc(TMAX * KB * OP_Q8_BLOCK) : NULL;
    float *xd = vnni ? malloc(TMAX * KB * sizeof *xd) : NULL;
    ck_assert(!vnni || (xq && xd));
    for (size_t t = 0; vnni && t < TMAX; t++)
        for (size_t j = 0; j < KB; j++) {
            size_t k = j * OP_Q8_BLOCK, n = K - k < OP_Q8_BLOCK ? K - k : OP_Q8_BLOCK;
            xd[t * KB + j] = op_q8_quantize(in + t * K + k, n, xq + (t * KB + j) * OP_Q8_BLOCK);
        }
    for (size_t t = 0; t < TMAX; t++)
        for (size_t n = 0; n < N; n++) {
            float acc = b.wide[n];
            if (vnni) {
                const int8_t *q = W.p;
                for (size_t j = 0; j < KB; j++) {
                    int32_t isum = 0;
                    for (size_t k = j * OP_Q8_BLOCK; k < K && k < (j + 1) * OP_Q8_BLOCK; k++)
                        isum += xq[t * KB * OP_Q8_BLOCK + k] * q[k * N + n];
                    acc = op_q8_block(acc, isum, xd[t * KB + j], W.scale[j * N + n]);
                }
            } else if (dp) {
                const uint16_t *w = W.p;
                for (size_t k = 0; k < K; k += 2) {
                    int two = k + 1 < K;
                    acc = op_bf16_dot2(acc, op_f32_to_bf16_dp(in[t * K + k]),
                                       two ? op_f32_to_bf16_dp(in[t * K + k + 1]) : 0, w[k * N + n],
                                       two ? w[(k + 1) * N + n] : 0);
                }
            } else {
                for (size_t k = 0; k < K; k++) acc = fmaf(in[t * K + k], W.wide[k * N + n], acc);
            }
            want[t * N + n] = acc;
        }
    if (panel) test_w_panel(&W, K, N);
    /* The pair copy the level reads (built from either layout, as the
     * model's loader does); op_matmul takes the widening kernels without. */
    ck_assert_int_eq(op_w_pairs_build(&W.w, K, N), 0);
    ck_assert(dp == (W.w.pairs != NULL));
    ck_assert_int_eq(op_w_quads_build(&W.w, K, N), 0);
    ck_assert(vnni == (W.w.quads != NULL));
    for (size_t T = 1; T <= TMAX; T = T == TALL ? TMAX : T + 1) {
        memset(out, 0xff, TMAX * N * sizeof *out);
        op_matmul(pool, pack, out, in, &W.w, &b.w, T, K, N);
        for (size_t i = 0; i < T * N; i++)
            ck_assert_msg(memcmp(&out[i], &want[i], sizeof(float)) == 0,
                          "%s%s%s, K = %zu, T = %zu: row %zu column %zu is %a, want %a",
                          dt_names[dt], panel ? " panel64" : "",
                          dp     ? " avx512-bf16"
                          : vnni ? " avx512-vnni"
                                 : "",
                          K, T, i / N, i % N, (double)out[i], (double)want[i]);
    }
    op_w_pairs_free(&W.w, K, N);
    op_w_quads_free(&W.w);
    free(xq);
    free(xd);
    test_w_free(&W);
    test_w_free(&b);
    free(pack);
    free(in);
    free(out);
    free(want);
    op_pool_free(pool);
}

START_TEST(op_matmul_every_row_count_is_the_fixed_order)
{
    op_dtype dt = (op_dtype)(_i % 4);
    int panel = _i / 4;
    matmul_rows_check(dt, panel, 70);
    /* K = 200: several whole k-blocks (the panels' 64-row k-blocks, each
     * tile after the first prefetching the next) and a tail of 8, as
     * GPT-2's K of 768 and 3072 take whole ones. */
    matmul_rows_check(dt, panel, 200);
    /* K = 301: the BF16 level's whole k-block of 128 pairs, a partial one
     * and an odd K's half pair; the Q8 level's whole k-range of 8 blocks,
     * a partial one and a partial block of 13. */
    if (dt == OP_BF16 || dt == OP_Q8) matmul_rows_check(dt, panel, 301);
}
END_TEST

/* The chain hashes of n blocks of kv's block length. */
static void chain_hashes(const eng_kv *kv, const int32_t *t, size_t n, uint64_t *h)
{
    for (size_t i = 0; i < n; i++)
        h[i] = kv_hash(kv, i > 0 ? h[i - 1] : KV_HASH_ROOT, t + i * eng_kv_block_len(kv));
}

START_TEST(eng_kv_prefix_refcounts_lru_and_leaves_first)
{
    eng_model *m = load("aligned");
    eng_kv *kv;
    char err[256];
    /* 4 blocks of 4 positions (4 KiB each). */
    ck_assert_int_eq(eng_kv_new(m, 4 * 4096, 4, &kv, err, sizeof err), ENG_OK);
    int32_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    int32_t b[12] = {9, 9, 9, 9, 8, 8, 8, 8, 7, 7, 7, 7};
    uint64_t ha[3], hb[3], chain = 0;
    chain_hashes(kv, a, 3, ha);
    chain_hashes(kv, b, 3, hb);
    eng_seq sa = {0}, sb = {0}, sc = {0}, sd = {0};
    size_t hit = 99, nhashed = 0;
    ck_assert_int_eq(kv_admit(kv, &sa, a, ha, 2, 12, NULL, &hit), ENG_OK);
    ck_assert_uint_eq(hit, 0);
    ck_assert_uint_eq(sa.len, 0);
    sa.len = 12; /* as if a step had computed its 12 positions */
    kv_commit(kv, &sa, a, &nhashed, &chain, NULL, 0);
    ck_assert_uint_eq(nhashed, 3);
    ck_assert(chain == ha[2]);
    ck_assert_uint_eq(kv->nregistered, 3);
    /* A second sequence with a's first 8 tokens shares two blocks. */
    ck_assert_int_eq(kv_admit(kv, &sb, a, ha, 2, 12, NULL, &hit), ENG_OK);
    ck_assert_uint_eq(hit, 2);
    ck_assert_uint_eq(sb.len, 8);
    ck_assert_int_eq(sb.blocks[0], sa.blocks[0]);
    ck_assert_int_eq(sb.blocks[1], sa.blocks[1]);
    ck_assert_int_ne(sb.blocks[2], sa.blocks[2]); /* its own, private */
    ck_assert_int_eq(kv->meta[sa.blocks[0]].ref, 2);
    ck_assert_int_eq(kv->meta[sa.blocks[2]].ref, 1);
    ck_assert_uint_eq(eng_kv_blocks_free(kv), 0);
    /* Full: nothing more, and a refusal changes nothing. */
    ck_assert_int_eq(kv_admit(kv, &sc, b, hb, 0, 4, NULL, &hit), ENG_ENOMEM);
    ck_assert_uint_eq(sc.nblocks, 0);
    ck_assert_int_eq(kv->meta[sa.blocks[0]].ref, 2);
    int32_t a0 = sa.blocks[0], a1 = sa.blocks[1], a2 = sa.blocks[2];
    eng_kv_release(kv, &sa); /* a2 is cached; a0, a1 are still b's */
    ck_assert_uint_eq(eng_kv_blocks_free(kv), 1);
    ck_assert_uint_eq(kv->nlru, 1);
    ck_assert_int_eq(kv->meta[a0].ref, 1);
    eng_kv_release(kv, &sb); /* its private block is free; a1, a0 cached */
    ck_assert_uint_eq(kv->nfree, 1);
    ck_assert_uint_eq(kv->nlru, 3);
    ck_assert_uint_eq(eng_kv_blocks_free(kv), 4);
    ck_assert_uint_eq(kv->nregistered, 3);
    /* Least recently used first, and a chain's leaf before its parent. */
    ck_assert_int_eq(kv->lru_head, a2);
    ck_assert_int_eq(kv->meta[a2].next, a1);
    ck_assert_int_eq(kv->meta[a1].next, a0);
    /* Three fresh blocks: the free one, then a2 and a1 evicted. */
    ck_assert_int_eq(kv_admit(kv, &sc, b, hb, 0, 12, NULL, &hit), ENG_OK);
    ck_assert_uint_eq(hit, 0);
    ck_assert_uint_eq(kv->evictions, 2);
    ck_assert_uint_eq(kv->nregistered, 1);
    /* a0 is still found; a1 is not. */
    ck_assert_int_eq(kv_admit(kv, &sd, a, ha, 2, 8, NULL, &hit), ENG_ENOMEM); /* 1 hit + 1 fresh */
    ck_assert_int_eq(kv_admit(kv, &sd, a, ha, 2, 4, NULL, &hit), ENG_OK);
    ck_assert_uint_eq(hit, 1);
    ck_assert_int_eq(sd.blocks[0], a0);
    ck_assert_uint_eq(eng_kv_blocks_free(kv), 0);
    /* Held blocks are never evicted. */
    eng_seq se = {0};
    ck_assert_int_eq(eng_kv_reserve(kv, &se, 1), ENG_ENOMEM);
    eng_kv_release(kv, &sc);
    eng_kv_release(kv, &sd);
    ck_assert_uint_eq(eng_kv_blocks_free(kv), 4);
    /* kv_extend swaps a reserved, unwritten block for a cached one. */
    ck_assert_int_eq(kv_admit(kv, &se, b, hb, 0, 12, NULL, &hit), ENG_OK);
    se.len = 12;
    nhashed = 0;
    kv_commit(kv, &se, b, &nhashed, &chain, NULL, 0);
    eng_kv_release(kv, &se);
    int32_t b0 = kv->lru_tail;                             /* b's first block, released last */
    ck_assert_int_eq(eng_kv_reserve(kv, &se, 12), ENG_OK); /* the free one, b2, b1 */
    ck_assert_uint_eq(kv->nregistered, 1);
    ck_assert_uint_eq(kv_extend(kv, &se, b, hb, 2, NULL), 1);
    ck_assert_int_eq(se.blocks[0], b0);
    ck_assert_uint_eq(se.len, 4);
    ck_assert_uint_eq(kv_extend(kv, &se, b, hb, 2, NULL), 0); /* b1 is gone */
    ck_assert_uint_eq(eng_kv_blocks_free(kv), 1);             /* the swapped-out block */
    eng_kv_release(kv, &se);
    ck_assert_uint_eq(kv->nregistered, 1);
    ck_assert_uint_eq(eng_kv_blocks_free(kv), 4);
    eng_kv_free(kv);
    eng_model_free(m);
}
END_TEST

START_TEST(eng_kv_prefix_hit_compares_tokens_and_parent_not_only_the_hash)
{
    eng_model *m = load("aligned");
    eng_kv *kv;
    char err[256];
    ck_assert_int_eq(eng_kv_new(m, 8 * 4096, 4, &kv, err, sizeof err), ENG_OK);
    kv->hash_mask = 0; /* every block hashes to 0 */
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {1, 2, 3, 5, 5, 6, 7, 8};
    uint64_t ha[2], hb[2], chain = 0;
    chain_hashes(kv, a, 2, ha);
    chain_hashes(kv, b, 2, hb);
    ck_assert(ha[0] == hb[0] && ha[1] == hb[1]);
    eng_seq sa = {0}, sb = {0}, sc = {0};
    size_t hit, nhashed = 0;
    ck_assert_int_eq(kv_admit(kv, &sa, a, ha, 2, 8, NULL, &hit), ENG_OK);
    sa.len = 8;
    kv_commit(kv, &sa, a, &nhashed, &chain, NULL, 0);
    eng_kv_release(kv, &sa);
    /* b's first block differs in one token: no hit, and its second block
     * (the same tokens as a's) is not found under a's first. */
    ck_assert_int_eq(kv_admit(kv, &sb, b, hb, 2, 8, NULL, &hit), ENG_OK);
    ck_assert_uint_eq(hit, 0);
    ck_assert_uint_eq(kv_extend(kv, &sb, b, hb, 2, NULL), 0);
    sb.len = 8;
    nhashed = 0;
    kv_commit(kv, &sb, b, &nhashed, &chain, NULL, 0);
    ck_assert_uint_eq(kv->nregistered, 4);
    eng_kv_release(kv, &sb);
    /* Both chains are found, each whole. */
    ck_assert_int_eq(kv_admit(kv, &sc, a, ha, 2, 8, NULL, &hit), ENG_OK);
    ck_assert_uint_eq(hit, 2);
    eng_kv_release(kv, &sc);
    ck_assert_int_eq(kv_admit(kv, &sc, b, hb, 2, 8, NULL, &hit), ENG_OK);
    ck_assert_uint_eq(hit, 2);
    eng_kv_release(kv, &sc);
    eng_kv_free(kv);
    eng_model_free(m);
}
END_TEST

START_TEST(eng_kv_prefix_echo_blocks_keep_their_prompt_logprobs)
{
    eng_model *m = load("aligned");
    eng_kv *kv;
    char err[256];
    ck_assert_int_eq(eng_kv_new(m, 8 * 4096, 4, &kv, err, sizeof err), ENG_OK);
    int32_t a[12] = {4, 8, 15, 16, 23, 42, 7, 9, 11, 13, 17, 19};
    uint64_t ha[3], chain = 0;
    chain_hashes(kv, a, 3, ha);
    kv_lp lp[12], got[13];
    memset(lp, 0, sizeof lp);
    for (size_t i = 1; i < 12; i++)
        lp[i] = (kv_lp){.logprob = -(float)i, .ntop = 1, .top_ids = {(int32_t)(100 + i)}};
    eng_seq sa = {0}, sb = {0}, sc = {0};
    size_t hit, nhashed = 0;
    /* Registered without logprobs: an echo lookup does not take them. */
    ck_assert_int_eq(kv_admit(kv, &sa, a, ha, 2, 12, NULL, &hit), ENG_OK);
    sa.len = 12;
    kv_commit(kv, &sa, a, &nhashed, &chain, NULL, 0);
    int32_t a0 = sa.blocks[0], a1 = sa.blocks[1], a2 = sa.blocks[2];
    eng_kv_release(kv, &sa);
    ck_assert_int_eq(kv_admit(kv, &sb, a, ha, 2, 12, got, &hit), ENG_OK);
    ck_assert_uint_eq(hit, 0);
    /* Computed again with logprobs: the registered blocks keep them, and
     * sb's copies go back to the free list. */
    sb.len = 12;
    nhashed = 0;
    kv_commit(kv, &sb, a, &nhashed, &chain, lp, 12);
    ck_assert_int_eq(sb.blocks[0], a0);
    ck_assert_int_eq(sb.blocks[2], a2);
    ck_assert(kv->meta[a0].has_lp && kv->meta[a1].has_lp && kv->meta[a2].has_lp);
    ck_assert_uint_eq(kv->nfree, 5);
    eng_kv_release(kv, &sb);
    /* Two blocks with logprobs within maxhit: one taken, and the logprobs
     * of positions 1 .. 4 (the 4th from the second block). */
    ck_assert_int_eq(kv_admit(kv, &sc, a, ha, 2, 12, got, &hit), ENG_OK);
    ck_assert_uint_eq(hit, 1);
    ck_assert_uint_eq(sc.len, 4);
    ck_assert_int_eq(sc.blocks[0], a0);
    ck_assert_int_ne(sc.blocks[1], a1);
    for (size_t i = 1; i <= 4; i++) {
        ck_assert(got[i].logprob == -(float)i);
        ck_assert_int_eq(got[i].top_ids[0], (int32_t)(100 + i));
    }
    eng_kv_release(kv, &sc);
    /* Evicted blocks lose them with their registration. */
    ck_assert_int_eq(eng_kv_reserve(kv, &sc, 32), ENG_OK);
    ck_assert_uint_eq(kv->nregistered, 0);
    ck_assert(!kv->meta[a0].has_lp);
    eng_kv_release(kv, &sc);
    eng_kv_free(kv);
    eng_model_free(m);
}
END_TEST

/* The LM head for every row count 1..70 (4-row tiles and single rows,
 * vocabulary tiles of four and the rest) against the dot product's order,
 * written out here: sixteen lanes by FMA, the pairs l[j] + l[j + 8], the
 * tree ((m0 + m4) + (m2 + m6)) + ((m1 + m5) + (m3 + m7)), then the tail by
 * FMA. C = 96 (whole 32-element steps: the 4 x 4 tiles' sums are reduced
 * sixteen at once, op_hsum16x16) and, for the float formats, C = 86
 * (32-element steps, a 16-element step and a tail of 6); Q8 needs
 * C % 32 == 0. V = 133: two threads' shares of 128 and 5 vocabulary rows.
 * BF16 at the "avx512-bf16" level has its own order (below). */
static void lm_head_rows_check(op_dtype dt, size_t C, size_t V)
{
    const size_t TMAX = 70;
    op_pool *pool = op_pool_new(2);
    ck_assert_ptr_nonnull(pool);
    float *h = malloc(TMAX * C * sizeof *h), *out = malloc(TMAX * V * sizeof *out);
    float *want = malloc(TMAX * V * sizeof *want);
    ck_assert(h && out && want);
    unsigned seed = 11;
    for (size_t i = 0; i < TMAX * C; i++) h[i] = unit(&seed);
    test_w wte;
    test_w_make(&wte, dt, V, C, 0, &seed);
    /* BF16 at the "avx512-bf16" level: wte's pair copy and the projections'
     * contract with no bias: from +0, op_bf16_dot2 over the pairs of h
     * (rounded to BF16) in increasing order, an odd C's last pair with a
     * zero half (op_matmul_bf16.c). */
    int dp = dt == OP_BF16 && op_use_avx512bf16();
    ck_assert_int_eq(op_w_pairs_build_rows(&wte.w, V, C), 0);
    ck_assert(dp == (wte.w.pairs != NULL));
    float *scratch = aligned_alloc(64, op_lm_head_scratch_floats(C) * sizeof(float));
    ck_assert_ptr_nonnull(scratch);
    for (size_t t = 0; t < TMAX; t++)
        for (size_t v = 0; v < V; v++) {
            const float *a = h + t * C, *b = wte.wide + v * C;
            if (dp) {
                const uint16_t *wb = (const uint16_t *)wte.p + v * C;
                float acc = 0;
                for (size_t k = 0; k < C; k += 2) {
                    int two = k + 1 < C;
                    acc = op_bf16_dot2(acc, op_f32_to_bf16_dp(a[k]),
                                       two ? op_f32_to_bf16_dp(a[k + 1]) : 0, wb[k],
                                       two ? wb[k + 1] : 0);
                }
                want[t * V + v] = acc;
                continue;
            }
            float l[16] = {0}, m[8];
            size_t i = 0;
            for (; i + 16 <= C; i += 16)
                for (size_t j = 0; j < 16; j++) l[j] = fmaf(a[i + j], b[i + j], l[j]);
            for (size_t j = 0; j < 8; j++) m[j] = l[j] + l[j + 8];
            float s = ((m[0] + m[4]) + (m[2] + m[6])) + ((m[1] + m[5]) + (m[3] + m[7]));
            for (; i < C; i++) s = fmaf(a[i], b[i], s);
            want[t * V + v] = s;
        }
    for (size_t T = 1; T <= TMAX; T++) {
        memset(out, 0xff, TMAX * V * sizeof *out);
        op_lm_head(pool, scratch, out, h, &wte.w, T, C, V);
        for (size_t i = 0; i < T * V; i++)
            ck_assert_msg(memcmp(&out[i], &want[i], sizeof(float)) == 0,
                          "%s%s, C = %zu, V = %zu, T = %zu: row %zu token %zu is %a, want %a",
                          dt_names[dt], dp ? " avx512-bf16" : "", C, V, T, i / V, i % V,
                          (double)out[i], (double)want[i]);
    }
    op_w_pairs_free(&wte.w, C, V);
    free(scratch);
    test_w_free(&wte);
    free(h);
    free(out);
    free(want);
    op_pool_free(pool);
}

START_TEST(op_lm_head_every_row_count_is_the_fixed_order)
{
    op_dtype dt = (op_dtype)_i;
    lm_head_rows_check(dt, 96, 133);
    if (dt != OP_Q8) lm_head_rows_check(dt, 86, 133);
    /* An odd C: the pair copy's last pair has a zero half (BF16). */
    if (dt == OP_BF16) lm_head_rows_check(dt, 85, 133);
    /* Two threads' shares of 64 and 1 (V = 65) or 2 (V = 130) vocabulary
     * rows: one row's two runs of a 16-bit wte empty (the odd row alone)
     * or of one row each. */
    lm_head_rows_check(dt, 96, 65);
    lm_head_rows_check(dt, 96, 130);
}
END_TEST

/* ---- BF16 edge shapes (the pair copy's contract, or the widening's) ---- */

/* A BF16 bit pattern: any finite value, zero and subnormals included, at
 * exponents from 2^-40 to 2^13 (so that sums stay finite). */
static uint16_t edge_bf16(unsigned *seed)
{
    unsigned r = lcg(seed) >> 8;
    uint16_t sign = (uint16_t)(r & 0x8000u), man = (uint16_t)((r >> 1) & 0x7Fu);
    unsigned e = (r >> 9) % 16 == 0 ? 0u : 87u + (r >> 13) % 54u;
    return (uint16_t)(sign | (uint16_t)(e << 7) | man);
}

/* An input: mostly unit(), sometimes a subnormal, a zero of either sign, a
 * value whose BF16 rounding is a tie, or one small enough that products
 * and sums fall to subnormals (flushed at the "avx512-bf16" level). */
static float edge_input(unsigned *seed)
{
    unsigned r = lcg(seed) % 16;
    uint32_t u;
    float f = unit(seed);
    switch (r) {
    case 0: u = (lcg(seed) >> 9) | (lcg(seed) & 0x80000000u); break; /* subnormal or zero */
    case 1: u = 0x80000000u; break;
    case 2: u = 0x3F808000u | (lcg(seed) & 0x80010000u); break; /* a tie, either parity */
    case 3: return f * 1e-32f;
    default: return f;
    }
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The value out[t][n] (or logits[t][n] of the LM head: bias NULL, W read
 * as wt's rows, wt (N, K)) must have: at the "avx512-bf16" level with a
 * pair copy the pairs' contract (kernels.h op_bf16_dot2), else the
 * widening's fmaf chain (op_matmul.c) or, for the LM head, NAN: the caller
 * then skips (lm_head_rows_check has the widening's order). */
static float edge_want(int dp, int lm, const float *x, const uint16_t *W, const float *bias,
                       size_t K, size_t N, size_t n)
{
    float acc = bias != NULL ? bias[n] : 0.0f;
    if (!dp && lm) return NAN;
    for (size_t k = 0; k < K; k += dp ? 2 : 1) {
        size_t i0 = lm ? n * K + k : k * N + n, i1 = lm ? i0 + 1 : i0 + N;
        if (!dp) {
            acc = fmaf(x[k], sft_bf16_to_f32(W[i0]), acc);
            continue;
        }
        int two = k + 1 < K;
        acc = op_bf16_dot2(acc, op_f32_to_bf16_dp(x[k]), two ? op_f32_to_bf16_dp(x[k + 1]) : 0,
                           W[i0], two ? W[i1] : 0);
    }
    return acc;
}

/* BF16 projections (K, N) and LM heads (wte (N, K)) of the shapes at the
 * edges of op_matmul_bf16.c's tiles: K of 1, 2, odd and past two k-blocks
 * of 128 pairs; N below, at and one past a panel of 64 (N % 64 == 1: a
 * panel of one column), the panel64 layout where N allows; rows 1..7 (one
 * row's paired panels, the direct tiles, the first k-blocked ones), 63, 64
 * and about the chunks of 256 (255, 256, 257, 512, 513); pools of 1, 2 and
 * 3 threads; an F32 and a BF16 bias (widened per task). in, out and the
 * scratch are allocated at exactly their sizes (ASan) and out's rows past
 * T must stay untouched. */
static const struct {
    size_t K, N;
    int panel, lm;
} bf16_edges[] = {
    {1, 1, 0, 0},    {2, 5, 0, 0},     {3, 63, 0, 0},   {17, 64, 1, 0},
    {64, 65, 0, 0},  {129, 129, 0, 0}, {33, 193, 0, 0}, {5, 128, 1, 0},
    {513, 65, 0, 0}, {1, 1, 0, 1},     {2, 2, 0, 1},    {3, 63, 0, 1},
    {85, 64, 0, 1},  {64, 65, 0, 1},   {33, 129, 0, 1}, {513, 3, 0, 1},
};

START_TEST(op_bf16_edge_shapes_keep_the_contract)
{
    static const size_t Ts[] = {1, 2, 3, 4, 5, 6, 7, 63, 64, 255, 256, 257, 512, 513};
    const size_t TMAX = 513, K = bf16_edges[_i].K, N = bf16_edges[_i].N;
    const int panel = bf16_edges[_i].panel, lm = bf16_edges[_i].lm;
    unsigned seed = 29u + (unsigned)_i;
    uint16_t *W = malloc(K * N * sizeof *W), *bb = malloc(N * sizeof *bb);
    float *bf = malloc(N * sizeof *bf), *bw = malloc(N * sizeof *bw);
    float *x = malloc(TMAX * K * sizeof *x), *want = malloc(2 * TMAX * N * sizeof *want);
    ck_assert(W && bb && bf && bw && x && want);
    for (size_t i = 0; i < K * N; i++) W[i] = edge_bf16(&seed);
    for (size_t n = 0; n < N; n++) {
        bb[n] = edge_bf16(&seed);
        bw[n] = sft_bf16_to_f32(bb[n]);
        bf[n] = edge_input(&seed);
    }
    for (size_t i = 0; i < TMAX * K; i++) x[i] = edge_input(&seed);
    /* W as the kernels get it: (N, K) rows for the LM head, (K, N) in
     * either layout for a projection. */
    uint16_t *Wl = malloc(K * N * sizeof *Wl);
    ck_assert_ptr_nonnull(Wl);
    for (size_t k = 0; k < K; k++)
        for (size_t n = 0; n < N; n++) {
            size_t at = lm ? n * K + k : k * N + n;
            Wl[panel ? ((n / 64) * K + k) * 64 + n % 64 : at] = W[at];
        }
    op_w w = {Wl, NULL, OP_BF16, panel, NULL, NULL};
    ck_assert_int_eq(lm ? op_w_pairs_build_rows(&w, N, K) : op_w_pairs_build(&w, K, N), 0);
    int dp = w.pairs != NULL;
    ck_assert_int_eq(dp, op_use_avx512bf16());
    if (!dp && lm) goto done; /* the widening LM head: lm_head_rows_check */
    for (size_t bk = 0; bk < (lm ? 1u : 2u); bk++)
        for (size_t t = 0; t < TMAX; t++)
            for (size_t n = 0; n < N; n++)
                want[(bk * TMAX + t) * N + n] = edge_want(dp, lm, x + t * K, W,
                                                          lm   ? NULL
                                                          : bk ? bw
                                                               : bf,
                                                          K, N, n);
    for (size_t threads = 1; threads <= 3; threads++) {
        op_pool *pool = op_pool_new(threads);
        ck_assert_ptr_nonnull(pool);
        size_t sf = lm ? op_lm_head_scratch_floats(K) : op_matmul_scratch_floats(threads, K, N);
        void *scratch = NULL;
        ck_assert_int_eq(posix_memalign(&scratch, 64, sf * sizeof(float)), 0);
        for (size_t bk = 0; bk < (lm ? 1u : 2u); bk++) {
            op_w b = bk ? (op_w){bb, NULL, OP_BF16, 0, NULL, NULL}
                        : (op_w){bf, NULL, OP_F32, 0, NULL, NULL};
            for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
                size_t T = Ts[ti];
                float *in = malloc(T * K * sizeof *in), *out = malloc((T + 1) * N * sizeof *out);
                ck_assert(in && out);
                memcpy(in, x, T * K * sizeof *in);
                memset(out, 0xA5, (T + 1) * N * sizeof *out);
                if (lm)
                    op_lm_head(pool, scratch, out, in, &w, T, K, N);
                else
                    op_matmul(pool, scratch, out, in, &w, &b, T, K, N);
                /* The first difference only: a check per element costs a
                 * message to check's parent each. */
                size_t i = 0;
                for (; i < T * N; i++) {
                    float g = out[i], e = want[bk * TMAX * N + i];
                    if (memcmp(&g, &e, sizeof g) != 0 && !(isnan(g) && isnan(e))) break;
                }
                if (i < T * N)
                    ck_abort_msg("%s K = %zu N = %zu%s, %s bias, %zu threads, T = %zu: row %zu "
                                 "column %zu is %a, want %a",
                                 lm ? "LM head" : "matmul", K, N, panel ? " panel64" : "",
                                 bk ? "BF16" : "F32", threads, T, i / N, i % N, (double)out[i],
                                 (double)want[bk * TMAX * N + i]);
                for (i = T * N; i < (T + 1) * N; i++) {
                    uint32_t u;
                    memcpy(&u, &out[i], sizeof u);
                    if (u != 0xA5A5A5A5u)
                        ck_abort_msg("K = %zu N = %zu T = %zu: wrote past out", K, N, T);
                }
                free(in);
                free(out);
            }
        }
        free(scratch);
        op_pool_free(pool);
    }
done:
    op_w_pairs_free(&w, K, N);
    free(Wl);
    free(W);
    free(bb);
    free(bf);
    free(bw);
    free(x);
    free(want);
}
END_TEST

/* op_widen (the embeddings, layer norm, biases) of every F16 and BF16 bit
 * pattern equals the formats module's conversion; NaNs stay NaNs (F16C
 * quiets a signalling NaN, which any arithmetic on it does anyway). */
START_TEST(op_widen_every_16_bit_value_is_exact)
{
    uint16_t *bits = malloc(65536 * sizeof *bits);
    float *got = malloc(65536 * sizeof *got);
    ck_assert(bits && got);
    for (size_t i = 0; i < 65536; i++) bits[i] = (uint16_t)i;
    for (int k = 0; k < 2; k++) {
        op_w w = {bits, NULL, k == 0 ? OP_F16 : OP_BF16, 0, NULL, NULL};
        op_widen(got, &w, 0, 65536);
        for (size_t i = 0; i < 65536; i++) {
            float want = k == 0 ? sft_f16_to_f32(bits[i]) : sft_bf16_to_f32(bits[i]);
            if (isnan(want))
                ck_assert_msg(isnan(got[i]), "%s 0x%04zx is not NaN", k ? "BF16" : "F16", i);
            else
                ck_assert_msg(memcmp(&got[i], &want, sizeof want) == 0, "%s 0x%04zx: %a, want %a",
                              k ? "BF16" : "F16", i, (double)got[i], (double)want);
        }
    }
    free(bits);
    free(got);
}
END_TEST

/* BF16 rounding of `gpt2d convert --dtype bf16`: to nearest, ties to even,
 * carries into the exponent, overflow to infinity, NaN stays NaN. */
START_TEST(tool_f32_to_bf16_rounds_to_nearest_even)
{
    static const struct {
        uint32_t in;
        uint16_t want;
    } cases[] = {
        {0x3F800000u, 0x3F80u}, /* 1.0 exactly */
        {0x3F808000u, 0x3F80u}, /* tie, even below: down */
        {0x3F818000u, 0x3F82u}, /* tie, odd below: up */
        {0x3F808001u, 0x3F81u}, /* above the tie: up */
        {0x3F807FFFu, 0x3F80u}, /* below the tie: down */
        {0xBF818000u, 0xBF82u}, /* negative tie: away from the odd */
        {0x3FFFFFFFu, 0x4000u}, /* carries into the exponent */
        {0x7F7FFFFFu, 0x7F80u}, /* the largest float: to infinity */
        {0xFF800000u, 0xFF80u}, /* -infinity */
        {0x00000001u, 0x0000u}, /* the smallest subnormal: to zero */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float f;
        memcpy(&f, &cases[i].in, sizeof f);
        ck_assert_msg(tool_f32_to_bf16(f) == cases[i].want, "0x%08x -> 0x%04x, want 0x%04x",
                      cases[i].in, tool_f32_to_bf16(f), cases[i].want);
    }
    uint32_t nan_bits = 0x7F800001u; /* a signalling NaN whose payload is in the low half */
    float nan;
    memcpy(&nan, &nan_bits, sizeof nan);
    uint16_t h = tool_f32_to_bf16(nan);
    ck_assert_msg((h & 0x7F80u) == 0x7F80u && (h & 0x7Fu) != 0, "NaN became 0x%04x", h);
}
END_TEST

/* The levels of the matrix units this run does not test, by name (a path
 * the CPU cannot run is reported, never skipped silently). */
static void report_levels(void)
{
    const char *cap = getenv("GPT2D_KERNELS");
    if (op_use_avx512bf16())
        printf("avx512-bf16: run (BF16 weights, VDPBF16PS)\n");
    else if (cap != NULL && *cap != '\0' && strcmp(cap, "avx512-bf16") != 0)
        printf("avx512-bf16: not run, GPT2D_KERNELS=%s caps the level\n", cap);
    else
        printf("avx512-bf16: not run, CPU lacks avx512_bf16 (or avx512bw)\n");
    if (op_use_avx512vnni())
        printf("avx512-vnni: run (q8 weights, VPDPBUSD)\n");
    else if (cap != NULL && *cap != '\0' && strcmp(cap, "avx512-vnni") != 0
             && strcmp(cap, "avx512-bf16") != 0)
        printf("avx512-vnni: not run, GPT2D_KERNELS=%s caps the level\n", cap);
    else
        printf("avx512-vnni: not run, CPU lacks avx512_vnni (or avx512bw)\n");
    for (size_t i = 0; op_unbuilt_levels[i] != NULL; i++) printf("%s\n", op_unbuilt_levels[i]);
    fflush(stdout);
}

int main(void)
{
    report_levels();
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("eng_forward");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, eng_forward_is_batch_invariant_bitwise, 0, (int)N_INV_MODELS);
    tcase_add_loop_test(tc, eng_forward_incremental_equals_full_prefill, 0, (int)N_INV_MODELS);
    tcase_add_test(tc, eng_model_layouts_give_identical_logits);
    tcase_add_test(tc, eng_model_half_precision_loads_exactly);
    tcase_add_test(tc, eng_model_q8_gives_the_logits_of_its_dequantization);
    tcase_add_test(tc, eng_model_panel_gives_the_logits_of_its_hf_file);
    tcase_add_test(tc, eng_model_bad_panel_copy_setting_is_einval);
    tcase_add_test(tc, eng_model_pairs64_gives_the_logits_of_its_hf_file);
    tcase_add_test(tc, eng_model_malformed_pairs64_is_refused);
    tcase_add_test(tc, eng_model_malformed_q8_is_refused);
    tcase_add_test(tc, eng_model_missing_or_misshapen_tensor_is_named);
    tcase_add_test(tc, eng_model_free_unmaps_the_pair_copies);
    tcase_add_test(tc, eng_forward_bf16_prefill_past_the_chunk_is_invariant);
    tcase_add_test(tc, eng_kv_reserve_is_all_or_nothing);
    tcase_add_test(tc, eng_kv_prefix_refcounts_lru_and_leaves_first);
    tcase_add_test(tc, eng_kv_prefix_hit_compares_tokens_and_parent_not_only_the_hash);
    tcase_add_test(tc, eng_kv_prefix_echo_blocks_keep_their_prompt_logprobs);
    tcase_add_test(tc, eng_forward_rejects_bad_items_before_computing);
    suite_add_tcase(s, tc);
    tc = tcase_create("eng_sample");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, eng_sample_greedy_topk_and_seed);
    tcase_add_test(tc, eng_sample_top_p_matches_a_full_sort);
    tcase_add_test(tc, eng_sample_full_vocabulary_follows_softmax);
    suite_add_tcase(s, tc);
    tc = tcase_create("op_kernels");
    tcase_set_timeout(tc, 240);
    tcase_add_loop_test(tc, op_matmul_every_row_count_is_the_fixed_order, 0, 8);
    tcase_add_loop_test(tc, op_lm_head_every_row_count_is_the_fixed_order, OP_F32, OP_Q8 + 1);
    tcase_add_test(tc, op_widen_every_16_bit_value_is_exact);
    tcase_add_loop_test(tc, op_bf16_edge_shapes_keep_the_contract, 0,
                        (int)(sizeof bf16_edges / sizeof *bf16_edges));
    suite_add_tcase(s, tc);
    tc = tcase_create("tool_convert");
    tcase_add_test(tc, tool_f32_to_bf16_rounds_to_nearest_even);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
