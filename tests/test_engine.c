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
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

static char dir[256];

static void synth(const char *sub, const char *extra1, const char *extra2)
{
    char out[320];
    snprintf(out, sizeof out, "%s/%s", dir, sub);
    mkdir(out, 0755);
    snprintf(out, sizeof out, "%s/%s/model.safetensors", dir, sub);
    char *argv[16] = {"synth", out,     "--layers", "2",       "--embd", "64",     "--heads",
                      "4",     "--ctx", "64",       "--vocab", "500",    "--seed", "5"};
    int argc = 14;
    if (extra1) argv[argc++] = (char *)extra1;
    if (extra2) argv[argc++] = (char *)extra2;
    ck_assert_int_eq(tool_synth(argc, argv), 0);
}

/* GPT-2's head size, 64, which has its own attention kernel (rows of a
 * prefill chunk taken together, a decode row's heads four at a time):
 * width 448, seven heads, so that both a group of four heads and a
 * shorter last group occur. */
static void synth_hs64(void)
{
    char out[320];
    snprintf(out, sizeof out, "%s/hs64", dir);
    mkdir(out, 0755);
    snprintf(out, sizeof out, "%s/hs64/model.safetensors", dir);
    char *argv[] = {"synth", out,     "--layers", "2",       "--embd", "448",    "--heads",
                    "7",     "--ctx", "64",       "--vocab", "500",    "--seed", "6"};
    ck_assert_int_eq(tool_synth((int)(sizeof argv / sizeof *argv), argv), 0);
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
        ck_assert_msg(memcmp(want, got, 4 * V * sizeof *got) == 0, "%s logits differ",
                      sft_dtype_name(kinds[k]));
    }
    free(want);
    free(got);
}
END_TEST

/* A q8 file is served as stored (0 bytes copied) and gives exactly the
 * logits of `convert --dtype f32` of it, which writes q * scale. */
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
    ck_assert_msg(memcmp(want, got, 4 * V * sizeof *got) == 0, "q8 logits differ");
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
        eng_model *m = load(pairs[i][0]);
        ck_assert_str_eq(eng_model_layout(m), "hf");
        run_alone(m, want);
        const char *dtype = eng_model_dtype(m);
        size_t bytes = eng_model_weight_bytes(m);
        eng_model_free(m);
        m = load(pairs[i][1]);
        ck_assert_str_eq(eng_model_layout(m), "panel64");
        ck_assert_str_eq(eng_model_dtype(m), dtype);
        ck_assert_uint_eq(eng_model_weight_bytes(m), bytes);
        ck_assert_uint_eq(eng_model_copied_bytes(m), 0);
        run_alone(m, got);
        eng_model_free(m);
        ck_assert_msg(memcmp(want, got, 4 * V * sizeof *got) == 0, "%s: panel64 logits differ",
                      pairs[i][1]);
    }
    free(want);
    free(got);
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
    t->w = (op_w){t->p, t->scale, dt, 0};
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
    t->w = (op_w){p, sc, t->w.dt, 1};
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
    enum { TMAX = 70 };
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
    test_w W, b;
    test_w_make(&W, dt, K, N, 1, &seed);
    test_w_make(&b, dt == OP_Q8 ? OP_F32 : dt, 1, N, 0, &seed);
    if (panel) test_w_panel(&W, K, N);
    for (size_t t = 0; t < TMAX; t++)
        for (size_t n = 0; n < N; n++) {
            float acc = b.wide[n];
            for (size_t k = 0; k < K; k++) acc = fmaf(in[t * K + k], W.wide[k * N + n], acc);
            want[t * N + n] = acc;
        }
    for (size_t T = 1; T <= TMAX; T++) {
        memset(out, 0xff, TMAX * N * sizeof *out);
        op_matmul(pool, pack, out, in, &W.w, &b.w, T, K, N);
        for (size_t i = 0; i < T * N; i++)
            ck_assert_msg(memcmp(&out[i], &want[i], sizeof(float)) == 0,
                          "%s%s, K = %zu, T = %zu: row %zu column %zu is %a, want %a", dt_names[dt],
                          panel ? " panel64" : "", K, T, i / N, i % N, (double)out[i],
                          (double)want[i]);
    }
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
 * C % 32 == 0. V = 133: two threads' shares of 128 and 5 vocabulary rows. */
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
    for (size_t t = 0; t < TMAX; t++)
        for (size_t v = 0; v < V; v++) {
            const float *a = h + t * C, *b = wte.wide + v * C;
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
        op_lm_head(pool, out, h, &wte.w, T, C, V);
        for (size_t i = 0; i < T * V; i++)
            ck_assert_msg(memcmp(&out[i], &want[i], sizeof(float)) == 0,
                          "%s, C = %zu, V = %zu, T = %zu: row %zu token %zu is %a, want %a",
                          dt_names[dt], C, V, T, i / V, i % V, (double)out[i], (double)want[i]);
    }
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
    /* Two threads' shares of 64 and 1 (V = 65) or 2 (V = 130) vocabulary
     * rows: one row's two runs of a 16-bit wte empty (the odd row alone)
     * or of one row each. */
    lm_head_rows_check(dt, 96, 65);
    lm_head_rows_check(dt, 96, 130);
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
        op_w w = {bits, NULL, k == 0 ? OP_F16 : OP_BF16, 0};
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

int main(void)
{
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
    tcase_add_test(tc, eng_model_malformed_q8_is_refused);
    tcase_add_test(tc, eng_model_missing_or_misshapen_tensor_is_named);
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
