/*
 * tests/test_lora.c: formats/lora.h, PEFT LoRA adapters.
 *
 * Every adapter is written here: adapter_config.json from a JSON object of
 * PEFT's keys (as save_pretrained writes them, then the case's changes) and
 * adapter_model.safetensors through formats' own writer, its factors
 * values that F16 and BF16 hold exactly (multiples of 1/64 below 2), so
 * every dtype must give the same floats. One test per refusal, each
 * checking the status and that the line names the key or tensor.
 * Allocation failures are injected through the linker's --wrap.
 */
#include "lora.h"
#include "safetensors.h"

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);

static long alloc_countdown = -1; /* -1: never fail; k: fail the k-th call from now */

void *__wrap_malloc(size_t n)
{
    return alloc_countdown >= 0 && alloc_countdown-- == 0 ? NULL : __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t m)
{
    return alloc_countdown >= 0 && alloc_countdown-- == 0 ? NULL : __real_calloc(n, m);
}

/* ---- Fixtures -------------------------------------------------------------- */

static char dir[128];
static char err[512];

static void setup(void)
{
    mkdtemp_template(dir, sizeof dir, "/tmp/gpt2d-lora-");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    err[0] = '\0';
}

static void teardown(void)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, LORA_CONFIG_FILE);
    unlink(p);
    snprintf(p, sizeof p, "%s/%s", dir, LORA_WEIGHTS_FILE);
    unlink(p);
    rmdir(dir);
}

/* PEFT's config for GPT2LMHeadModel (r 2, alpha 16, all four modules: its
 * "c_proj" is both attn.c_proj and mlp.c_proj), with changes: a JSON object
 * whose keys replace the defaults' (a null value with key "-KEY" deletes KEY). */
static void write_config(const char *changes)
{
    json_t *c = json_loads(
        "{\"alpha_pattern\": {}, \"auto_mapping\": null, \"base_model_name_or_path\": "
        "\"gpt2d-tiny\", \"bias\": \"none\", \"fan_in_fan_out\": true, \"inference_mode\": true, "
        "\"init_lora_weights\": true, \"layer_replication\": null, \"layers_pattern\": null, "
        "\"layers_to_transform\": null, \"loftq_config\": {}, \"lora_alpha\": 16, "
        "\"lora_dropout\": 0.05, \"megatron_config\": null, \"megatron_core\": \"megatron.core\", "
        "\"modules_to_save\": null, \"peft_type\": \"LORA\", \"r\": 2, \"rank_pattern\": {}, "
        "\"revision\": null, \"target_modules\": [\"c_attn\", \"c_proj\", \"c_fc\"], "
        "\"task_type\": \"CAUSAL_LM\", \"use_dora\": false, \"use_rslora\": false}",
        0, NULL);
    ck_assert_ptr_nonnull(c);
    if (changes != NULL) {
        json_t *ch = json_loads(changes, 0, NULL);
        ck_assert_msg(ch != NULL, "bad test JSON: %s", changes);
        const char *k;
        json_t *v;
        json_object_foreach(ch, k, v)
        {
            if (k[0] == '-')
                json_object_del(c, k + 1);
            else
                json_object_set(c, k, v);
        }
        json_decref(ch);
    }
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, LORA_CONFIG_FILE);
    ck_assert_int_eq(json_dump_file(c, p, JSON_INDENT(2)), 0);
    json_decref(c);
}

static void write_text(const char *name, const char *text)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *fp = fopen(p, "wb");
    ck_assert_ptr_nonnull(fp);
    fputs(text, fp);
    fclose(fp);
}

/* What the test adapter holds: layers x the modules in `modules`, width C,
 * rank r, in dtype; and one change. */
typedef struct {
    size_t from, layers, C, r; /* layers from..layers-1 are written */
    unsigned modules;          /* bit per lora_module */
    sft_dtype dtype;
    const char *drop;     /* a tensor left out */
    const char *extra;    /* an extra [r, C] tensor of this name */
    int wide_a;           /* layer 0's c_attn A is [r, C + 1] */
    sft_dtype first_type; /* layer 0's c_attn A in this dtype instead, when not F32 */
    int three_d;          /* layer 0's c_attn A is [1, r, C] */
    int nan;              /* layer 0's c_attn B holds a NaN */
} spec;

/* The value of element (i, j) of a factor: a multiple of 1/64 in (-2, 2). */
static float factor_value(size_t layer, size_t m, int b, size_t i, size_t j)
{
    long v = (long)((layer * 7 + m * 5 + (size_t)b * 3 + i * 11 + j * 13) % 200) - 100;
    return (float)v / 64.0f;
}

static void encode(sft_dtype dt, const float *x, size_t n, void *out)
{
    for (size_t k = 0; k < n; k++) {
        if (dt == SFT_F32) {
            memcpy((char *)out + 4 * k, &x[k], 4);
        } else if (dt == SFT_F64) {
            double d = x[k];
            memcpy((char *)out + 8 * k, &d, 8);
        } else if (dt == SFT_F16) {
            uint16_t h = sft_f32_to_f16(x[k]);
            memcpy((char *)out + 2 * k, &h, 2);
        } else if (dt == SFT_BF16) {
            uint32_t u;
            memcpy(&u, &x[k], 4);
            uint16_t h = (uint16_t)(u >> 16); /* exact: the values have few bits */
            memcpy((char *)out + 2 * k, &h, 2);
        } else {
            int32_t i = (int32_t)x[k];
            memcpy((char *)out + 4 * k, &i, 4);
        }
    }
}

static void write_adapter(const spec *s)
{
    enum { MAXT = 64 };
    sft_tensor t[MAXT];
    char names[MAXT][128];
    int64_t shapes[MAXT][3];
    void *bufs[MAXT];
    size_t n = 0;
    for (size_t l = s->from; l < s->layers; l++)
        for (size_t m = 0; m < LORA_NMODULES; m++) {
            if (!(s->modules & (1u << m))) continue;
            size_t in, out;
            lora_module_dims((lora_module)m, s->C, &in, &out);
            for (int b = 0; b < 2; b++) {
                snprintf(names[n], sizeof names[n],
                         "base_model.model.transformer.h.%zu.%s.lora_%c.weight", l,
                         lora_module_name((lora_module)m), b ? 'B' : 'A');
                if (s->drop != NULL && strcmp(s->drop, names[n]) == 0) continue;
                int first = l == 0 && m == 0 && b == 0;
                size_t rows = b ? out : s->r, cols = b ? s->r : in + (first && s->wide_a);
                sft_dtype dt = first && s->first_type != SFT_F32 ? s->first_type : s->dtype;
                float *x = malloc(rows * cols * sizeof *x);
                for (size_t i = 0; i < rows; i++)
                    for (size_t j = 0; j < cols; j++) x[i * cols + j] = factor_value(l, m, b, i, j);
                if (l == 0 && m == 0 && b == 1 && s->nan) x[1] = NAN;
                bufs[n] = malloc(rows * cols * 8);
                encode(dt, x, rows * cols, bufs[n]);
                free(x);
                size_t nd = first && s->three_d ? 3 : 2;
                shapes[n][0] = nd == 3 ? 1 : (int64_t)rows;
                shapes[n][nd - 2] = (int64_t)rows;
                shapes[n][nd - 1] = (int64_t)cols;
                t[n] = (sft_tensor){.name = names[n],
                                    .dtype = dt,
                                    .ndim = nd,
                                    .shape = shapes[n],
                                    .data = bufs[n],
                                    .nbytes = rows * cols * sft_dtype_size(dt)};
                n++;
            }
        }
    if (s->extra != NULL) {
        snprintf(names[n], sizeof names[n], "%s", s->extra);
        bufs[n] = calloc(s->r * s->C, 4);
        shapes[n][0] = (int64_t)s->r;
        shapes[n][1] = (int64_t)s->C;
        t[n] = (sft_tensor){.name = names[n],
                            .dtype = SFT_F32,
                            .ndim = 2,
                            .shape = shapes[n],
                            .data = bufs[n],
                            .nbytes = s->r * s->C * 4};
        n++;
    }
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, LORA_WEIGHTS_FILE);
    ck_assert_int_eq(sft_save(p, t, n, NULL, 0, NULL, err, sizeof err), SFT_OK);
    for (size_t i = 0; i < n; i++) free(bufs[i]);
}

/* The default adapter: 2 layers, width 8, rank 2, all modules, F32. */
static spec base_spec(void)
{
    return (spec){
        .layers = 2, .C = 8, .r = 2, .modules = 0xF, .dtype = SFT_F32, .first_type = SFT_F32};
}

/* Reads the fixture folder against a base of 2 layers, width 8. */
static sft_status read_default(lora_adapter **a)
{
    return lora_read(dir, 2, 8, a, err, sizeof err);
}

/* Writes the config with changes and the spec, expects status want with
 * `needle` in the message. */
static void expect_refusal(const char *changes, const spec *s, sft_status want, const char *needle)
{
    write_config(changes);
    write_adapter(s);
    lora_adapter *a = (lora_adapter *)1;
    ck_assert_int_eq(read_default(&a), want);
    ck_assert_ptr_null(a);
    ck_assert_msg(strstr(err, needle) != NULL, "want '%s' in: %s", needle, err);
    ck_assert_msg(strchr(err, '\n') == NULL, "two lines: %s", err);
}

static void check_values(const lora_adapter *a, unsigned modules)
{
    for (size_t l = 0; l < a->n_layer; l++)
        for (size_t m = 0; m < LORA_NMODULES; m++) {
            const lora_pair *p = lora_pair_at(a, l, (lora_module)m);
            size_t in, out;
            lora_module_dims((lora_module)m, a->n_embd, &in, &out);
            ck_assert_uint_eq(p->in, in);
            ck_assert_uint_eq(p->out, out);
            if (!(modules & (1u << m))) {
                ck_assert_ptr_null(p->a);
                ck_assert_ptr_null(p->b);
                continue;
            }
            for (size_t i = 0; i < a->rank; i++)
                for (size_t j = 0; j < in; j++)
                    ck_assert_float_eq(p->a[i * in + j], factor_value(l, m, 0, i, j));
            for (size_t i = 0; i < out; i++)
                for (size_t j = 0; j < a->rank; j++)
                    ck_assert_float_eq(p->b[i * a->rank + j], factor_value(l, m, 1, i, j));
        }
}

/* ---- Good adapters ----------------------------------------------------------- */

static void read_good(sft_dtype dt)
{
    write_config(NULL);
    spec s = base_spec();
    s.dtype = dt;
    write_adapter(&s);
    lora_adapter *a = NULL;
    ck_assert_msg(read_default(&a) == SFT_OK, "%s", err);
    ck_assert_uint_eq(a->n_layer, 2);
    ck_assert_uint_eq(a->n_embd, 8);
    ck_assert_uint_eq(a->rank, 2);
    ck_assert_float_eq(a->scaling, 8.0f); /* 16 / 2 */
    ck_assert_int_eq(a->rslora, 0);
    ck_assert_uint_eq(a->targets, 0xF);
    ck_assert_uint_eq(a->n_adapted, 8);
    ck_assert_int_eq(a->dtype, dt);
    ck_assert_int_eq(a->mixed_dtype, 0);
    ck_assert_str_eq(a->base_model, "gpt2d-tiny");
    /* Hand-computed: layer 1's mlp.c_proj (m 3) B[2][1] = (7 + 15 + 3 + 22 + 13) % 200 - 100
     * = -40, / 64 = -0.625; A is [2, 32], B [8, 2]. */
    const lora_pair *p = lora_pair_at(a, 1, LORA_MLP_C_PROJ);
    ck_assert_uint_eq(p->in, 32);
    ck_assert_uint_eq(p->out, 8);
    ck_assert_float_eq(p->b[2 * 2 + 1], -0.625f);
    check_values(a, 0xF);
    lora_free(a);
}

START_TEST(lora_read_f32_is_ok)
{
    read_good(SFT_F32);
}
END_TEST

START_TEST(lora_read_f16_widens_exactly)
{
    read_good(SFT_F16);
}
END_TEST

START_TEST(lora_read_bf16_widens_exactly)
{
    read_good(SFT_BF16);
}
END_TEST

START_TEST(lora_read_rslora_scales_by_sqrt_r)
{
    write_config("{\"r\": 4, \"lora_alpha\": 16, \"use_rslora\": true}");
    spec s = base_spec();
    s.r = 4;
    write_adapter(&s);
    lora_adapter *a = NULL;
    ck_assert_msg(read_default(&a) == SFT_OK, "%s", err);
    ck_assert_float_eq(a->scaling, 8.0f); /* 16 / sqrt(4) */
    ck_assert_int_eq(a->rslora, 1);
    check_values(a, 0xF);
    lora_free(a);
    /* Without rslora, r 4 and alpha 6: 1.5. */
    write_config("{\"r\": 4, \"lora_alpha\": 6}");
    ck_assert_msg(read_default(&a) == SFT_OK, "%s", err);
    ck_assert_float_eq(a->scaling, 1.5f);
    lora_free(a);
}
END_TEST

START_TEST(lora_read_subset_of_modules_is_ok)
{
    /* "attn.c_proj" is attn's only; "c_fc" the MLP's first. */
    write_config("{\"target_modules\": [\"attn.c_proj\", \"c_fc\"]}");
    spec s = base_spec();
    s.modules = (1u << LORA_ATTN_C_PROJ) | (1u << LORA_MLP_C_FC);
    write_adapter(&s);
    lora_adapter *a = NULL;
    ck_assert_msg(read_default(&a) == SFT_OK, "%s", err);
    ck_assert_uint_eq(a->targets, s.modules);
    ck_assert_uint_eq(a->n_adapted, 4);
    check_values(a, s.modules);
    lora_free(a);
}
END_TEST

START_TEST(lora_read_all_linear_and_regex_targets_are_ok)
{
    write_config("{\"target_modules\": \"all-linear\"}");
    spec s = base_spec();
    write_adapter(&s);
    lora_adapter *a = NULL;
    ck_assert_msg(read_default(&a) == SFT_OK, "%s", err);
    ck_assert_uint_eq(a->targets, 0xF);
    lora_free(a);
    write_config("{\"target_modules\": \".*[.]attn[.]c_attn\"}");
    s.modules = 1u << LORA_ATTN_C_ATTN;
    write_adapter(&s);
    ck_assert_msg(read_default(&a) == SFT_OK, "%s", err);
    ck_assert_uint_eq(a->targets, 1u << LORA_ATTN_C_ATTN);
    lora_free(a);
    /* Python's escapes (PEFT's re.fullmatch): \. and \d, layer 1's MLP only. */
    write_config(
        "{\"target_modules\": \"transformer\\\\.h\\\\.[1-9]\\\\d*\\\\.mlp\\\\.c_(fc|proj)\"}");
    s.modules = (1u << LORA_MLP_C_FC) | (1u << LORA_MLP_C_PROJ);
    write_adapter(&s);
    ck_assert_int_eq(read_default(&a), SFT_EFORMAT); /* layer 0's tensors are not targets */
    ck_assert_msg(strstr(err, "h.0.mlp.c_fc.lora_A.weight': layer 0's mlp.c_fc is not in") != NULL,
                  "%s", err);
    s.from = 1;
    write_adapter(&s);
    ck_assert_msg(read_default(&a) == SFT_OK, "%s", err);
    ck_assert_uint_eq(a->targets, s.modules);
    ck_assert_uint_eq(a->n_adapted, 2);
    ck_assert_ptr_null(lora_pair_at(a, 0, LORA_MLP_C_FC)->a);
    ck_assert_float_eq(lora_pair_at(a, 1, LORA_MLP_C_PROJ)->b[3], factor_value(1, 3, 1, 1, 1));
    lora_free(a);
}
END_TEST

START_TEST(lora_read_file_path_and_inferred_shape_are_ok)
{
    write_config("{\"-base_model_name_or_path\": null, \"new_peft_key\": false, "
                 "\"fan_in_fan_out\": false}");
    spec s = base_spec();
    s.layers = 3;
    write_adapter(&s);
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, LORA_WEIGHTS_FILE);
    lora_adapter *a = NULL;
    ck_assert_msg(lora_read(p, 0, 0, &a, err, sizeof err) == SFT_OK, "%s", err);
    ck_assert_uint_eq(a->n_layer, 3);
    ck_assert_uint_eq(a->n_embd, 8);
    ck_assert_ptr_null(a->base_model);
    ck_assert_str_eq(a->dir, dir);
    check_values(a, 0xF);
    lora_free(a);
}
END_TEST

START_TEST(lora_read_mixed_dtypes_are_ok)
{
    write_config(NULL);
    spec s = base_spec();
    s.first_type = SFT_BF16;
    write_adapter(&s);
    lora_adapter *a = NULL;
    ck_assert_msg(read_default(&a) == SFT_OK, "%s", err);
    ck_assert_int_eq(a->mixed_dtype, 1);
    check_values(a, 0xF);
    lora_free(a);
}
END_TEST

/* ---- The config's refusals ----------------------------------------------------- */

#define REFUSAL(test, changes, needle)                                                             \
    START_TEST(test)                                                                               \
    {                                                                                              \
        spec s = base_spec();                                                                      \
        expect_refusal(changes, &s, SFT_EFORMAT, needle);                                          \
    }                                                                                              \
    END_TEST

REFUSAL(lora_read_other_peft_type_is_eformat, "{\"peft_type\": \"PREFIX_TUNING\"}", "peft_type")
REFUSAL(lora_read_missing_peft_type_is_eformat, "{\"-peft_type\": null}", "peft_type: missing")
REFUSAL(lora_read_other_task_type_is_eformat, "{\"task_type\": \"SEQ_CLS\"}", "task_type")
REFUSAL(lora_read_modules_to_save_is_eformat, "{\"modules_to_save\": [\"lm_head\"]}",
        "modules_to_save")
REFUSAL(lora_read_bias_all_is_eformat, "{\"bias\": \"all\"}", "bias: 'all'")
REFUSAL(lora_read_bias_lora_only_is_eformat, "{\"bias\": \"lora_only\"}", "bias")
REFUSAL(lora_read_target_wte_is_eformat, "{\"target_modules\": [\"c_attn\", \"wte\"]}",
        "'wte' names transformer.wte")
REFUSAL(lora_read_target_lm_head_is_eformat, "{\"target_modules\": [\"lm_head\"]}",
        "'lm_head' names lm_head")
REFUSAL(lora_read_target_layer_norm_is_eformat, "{\"target_modules\": [\"c_attn\", \"ln_1\"]}",
        "'ln_1' names transformer.h.0.ln_1")
REFUSAL(lora_read_target_ln_f_regex_is_eformat, "{\"target_modules\": \".*ln_f\"}",
        "transformer.ln_f")
REFUSAL(lora_read_target_block_is_eformat, "{\"target_modules\": [\"attn\"]}",
        "names transformer.h.0.attn,")
REFUSAL(lora_read_target_unknown_is_eformat, "{\"target_modules\": [\"q_proj\"]}",
        "'q_proj' names no module")
REFUSAL(lora_read_target_python_only_regex_is_eformat,
        "{\"target_modules\": \"(?:transformer[.]h[.][0-9]+[.]attn[.]c_attn)\"}",
        "target_modules: the regular expression")
REFUSAL(lora_read_target_python_escape_is_eformat, "{\"target_modules\": \".*\\\\bc_attn\"}",
        "target_modules: the regular expression")
REFUSAL(lora_read_target_empty_is_eformat, "{\"target_modules\": []}", "target_modules")
REFUSAL(lora_read_dora_is_eformat, "{\"use_dora\": true}", "use_dora: DoRA")
REFUSAL(lora_read_rank_pattern_is_eformat, "{\"rank_pattern\": {\"c_attn\": 4}}", "rank_pattern")
REFUSAL(lora_read_alpha_pattern_is_eformat, "{\"alpha_pattern\": {\"c_fc\": 32}}", "alpha_pattern")
REFUSAL(lora_read_layers_to_transform_is_eformat, "{\"layers_to_transform\": [0]}",
        "layers_to_transform")
REFUSAL(lora_read_lora_bias_is_eformat, "{\"lora_bias\": true}", "lora_bias")
REFUSAL(lora_read_unknown_key_set_is_eformat, "{\"new_peft_key\": 3}",
        "new_peft_key: an unknown key")
REFUSAL(lora_read_rank_zero_is_eformat, "{\"r\": 0}", "r: out of range")
REFUSAL(lora_read_rank_missing_is_eformat, "{\"-r\": null}", "r: missing")
REFUSAL(lora_read_alpha_string_is_eformat, "{\"lora_alpha\": \"16\"}", "lora_alpha")
REFUSAL(lora_read_rslora_string_is_eformat, "{\"use_rslora\": \"yes\"}", "use_rslora")
REFUSAL(lora_read_dropout_out_of_range_is_eformat, "{\"lora_dropout\": 2}", "lora_dropout")

START_TEST(lora_read_config_not_json_is_eformat)
{
    spec s = base_spec();
    write_adapter(&s);
    lora_adapter *a = NULL;
    write_text(LORA_CONFIG_FILE, "{\"peft_type\": \"LORA\",");
    ck_assert_int_eq(read_default(&a), SFT_EFORMAT);
    ck_assert_msg(strstr(err, "adapter_config.json: not JSON") != NULL, "%s", err);
    write_text(LORA_CONFIG_FILE, "[\"LORA\"]");
    ck_assert_int_eq(read_default(&a), SFT_EFORMAT);
    ck_assert_msg(strstr(err, "not a JSON object") != NULL, "%s", err);
    write_text(LORA_CONFIG_FILE, "{\"r\": 2, \"r\": 4}");
    ck_assert_int_eq(read_default(&a), SFT_EFORMAT);
    ck_assert_msg(strstr(err, "duplicate") != NULL, "%s", err);
    ck_assert_ptr_null(a);
}
END_TEST

START_TEST(lora_read_config_missing_is_eio)
{
    spec s = base_spec();
    write_adapter(&s);
    lora_adapter *a = NULL;
    ck_assert_int_eq(read_default(&a), SFT_EIO);
    ck_assert_msg(strstr(err, "adapter_config.json: cannot open") != NULL, "%s", err);
    ck_assert_int_eq(lora_read("/nonexistent/gpt2d-adapter", 2, 8, &a, err, sizeof err), SFT_EIO);
    ck_assert_int_eq(lora_read(NULL, 2, 8, &a, err, sizeof err), SFT_EINVAL);
    ck_assert_ptr_null(a);
}
END_TEST

START_TEST(lora_read_config_too_big_is_etoobig)
{
    spec s = base_spec();
    write_adapter(&s);
    size_t n = LORA_MAX_CONFIG + 2;
    char *big = malloc(n);
    memset(big, ' ', n - 1);
    big[0] = '{';
    big[n - 2] = '}';
    big[n - 1] = '\0';
    write_text(LORA_CONFIG_FILE, big);
    free(big);
    lora_adapter *a = NULL;
    ck_assert_int_eq(read_default(&a), SFT_ETOOBIG);
    ck_assert_ptr_null(a);
}
END_TEST

/* ---- The tensors' refusals ------------------------------------------------------- */

START_TEST(lora_read_rank_mismatch_is_eformat)
{
    spec s = base_spec();
    expect_refusal("{\"r\": 4}", &s, SFT_EFORMAT,
                   "tensor 'base_model.model.transformer.h.0.attn.c_attn.lora_A.weight': shape "
                   "[2, 8], expected [4, 8]");
}
END_TEST

START_TEST(lora_read_width_mismatch_is_eformat)
{
    spec s = base_spec();
    s.C = 16;
    expect_refusal(NULL, &s, SFT_EFORMAT, "shape [2, 16], expected [2, 8]");
}
END_TEST

START_TEST(lora_read_wrong_shape_is_eformat)
{
    spec s = base_spec();
    s.wide_a = 1;
    expect_refusal(NULL, &s, SFT_EFORMAT, "shape [2, 9], expected [2, 8]");
    s.wide_a = 0;
    s.three_d = 1;
    expect_refusal(NULL, &s, SFT_EFORMAT, "3 dimensions");
}
END_TEST

START_TEST(lora_read_more_layers_than_base_is_eformat)
{
    spec s = base_spec();
    s.layers = 3;
    expect_refusal(NULL, &s, SFT_EFORMAT, "layer 2, but the base has 2 layers");
}
END_TEST

START_TEST(lora_read_fewer_layers_than_base_is_eformat)
{
    write_config(NULL);
    spec s = base_spec();
    write_adapter(&s);
    lora_adapter *a = NULL;
    ck_assert_int_eq(lora_read(dir, 3, 8, &a, err, sizeof err), SFT_EFORMAT);
    ck_assert_msg(strstr(err, "h.2.attn.c_attn.lora_A.weight': missing") != NULL, "%s", err);
    ck_assert_ptr_null(a);
}
END_TEST

START_TEST(lora_read_missing_tensor_is_eformat)
{
    spec s = base_spec();
    s.drop = "base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight";
    expect_refusal(NULL, &s, SFT_EFORMAT,
                   "tensor 'base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight': missing");
}
END_TEST

START_TEST(lora_read_extra_tensor_is_eformat)
{
    spec s = base_spec();
    s.extra = "base_model.model.transformer.h.0.attn.c_attn.lora_A.bias";
    expect_refusal(NULL, &s, SFT_EFORMAT, "c_attn.lora_A.bias': unexpected");
    s.extra = "base_model.model.transformer.wte.lora_embedding_A";
    expect_refusal(NULL, &s, SFT_EFORMAT, "wte.lora_embedding_A': unexpected");
    s.extra = "base_model.model.transformer.h.01.mlp.c_fc.lora_A.weight";
    expect_refusal(NULL, &s, SFT_EFORMAT, "h.01.mlp.c_fc.lora_A.weight': unexpected");
}
END_TEST

START_TEST(lora_read_untargeted_tensor_is_eformat)
{
    spec s = base_spec();
    expect_refusal("{\"target_modules\": [\"c_attn\", \"c_fc\"]}", &s, SFT_EFORMAT,
                   "layer 0's attn.c_proj is not in target_modules");
}
END_TEST

START_TEST(lora_read_integer_tensor_is_etype)
{
    spec s = base_spec();
    s.first_type = SFT_I32;
    expect_refusal(NULL, &s, SFT_ETYPE, "dtype I32 (an adapter's tensors are F32, F16 or BF16)");
    s.first_type = SFT_F64;
    expect_refusal(NULL, &s, SFT_ETYPE, "dtype F64");
}
END_TEST

START_TEST(lora_read_nan_is_eformat)
{
    spec s = base_spec();
    s.nan = 1;
    expect_refusal(NULL, &s, SFT_EFORMAT, "c_attn.lora_B.weight': element 1 is not finite");
}
END_TEST

START_TEST(lora_read_bad_safetensors_is_eformat)
{
    write_config(NULL);
    write_text(LORA_WEIGHTS_FILE, "\x10\0\0\0\0\0\0\0{}");
    lora_adapter *a = NULL;
    ck_assert_int_eq(read_default(&a), SFT_EFORMAT);
    ck_assert_msg(strstr(err, LORA_WEIGHTS_FILE) != NULL, "%s", err);
    spec s = base_spec();
    s.modules = 0;
    write_adapter(&s);
    ck_assert_int_eq(read_default(&a), SFT_EFORMAT);
    ck_assert_msg(strstr(err, "no tensors") != NULL, "%s", err);
    ck_assert_ptr_null(a);
}
END_TEST

/* ---- Allocation failures ------------------------------------------------------- */

START_TEST(lora_read_every_allocation_failure_is_clean)
{
    write_config(NULL);
    spec s = base_spec();
    write_adapter(&s);
    for (long k = 0;; k++) {
        lora_adapter *a = NULL;
        alloc_countdown = k;
        sft_status st = read_default(&a);
        int hit = alloc_countdown < 0;
        alloc_countdown = -1;
        if (!hit) {
            ck_assert_msg(st == SFT_OK, "k %ld: %s", k, err);
            check_values(a, 0xF);
            lora_free(a);
            break;
        }
        /* jansson's own failures read as a parse error. */
        ck_assert_msg(st == SFT_ENOMEM || st == SFT_EFORMAT, "k %ld: %d %s", k, st, err);
        ck_assert_ptr_null(a);
        ck_assert(k < 10000);
    }
}
END_TEST

START_TEST(lora_module_names_and_dims)
{
    size_t in, out;
    lora_module_dims(LORA_ATTN_C_ATTN, 768, &in, &out);
    ck_assert_uint_eq(in, 768);
    ck_assert_uint_eq(out, 2304);
    lora_module_dims(LORA_MLP_C_PROJ, 768, &in, &out);
    ck_assert_uint_eq(in, 3072);
    ck_assert_uint_eq(out, 768);
    ck_assert_str_eq(lora_module_name(LORA_MLP_C_FC), "mlp.c_fc");
    ck_assert_str_eq(lora_module_name(LORA_NMODULES), "?");
}
END_TEST

START_TEST(lora_free_null_is_a_no_op)
{
    lora_free(NULL);
}
END_TEST

static Suite *lora_suite(void)
{
    Suite *s = suite_create("lora");
    TCase *tc = tcase_create("lora_read");
    tcase_add_checked_fixture(tc, setup, teardown);
    const TTest *const tests[] = {lora_read_f32_is_ok,
                                  lora_read_f16_widens_exactly,
                                  lora_read_bf16_widens_exactly,
                                  lora_read_rslora_scales_by_sqrt_r,
                                  lora_read_subset_of_modules_is_ok,
                                  lora_read_all_linear_and_regex_targets_are_ok,
                                  lora_read_file_path_and_inferred_shape_are_ok,
                                  lora_read_mixed_dtypes_are_ok,
                                  lora_read_other_peft_type_is_eformat,
                                  lora_read_missing_peft_type_is_eformat,
                                  lora_read_other_task_type_is_eformat,
                                  lora_read_modules_to_save_is_eformat,
                                  lora_read_bias_all_is_eformat,
                                  lora_read_bias_lora_only_is_eformat,
                                  lora_read_target_wte_is_eformat,
                                  lora_read_target_lm_head_is_eformat,
                                  lora_read_target_layer_norm_is_eformat,
                                  lora_read_target_ln_f_regex_is_eformat,
                                  lora_read_target_block_is_eformat,
                                  lora_read_target_unknown_is_eformat,
                                  lora_read_target_python_only_regex_is_eformat,
                                  lora_read_target_python_escape_is_eformat,
                                  lora_read_target_empty_is_eformat,
                                  lora_read_dora_is_eformat,
                                  lora_read_rank_pattern_is_eformat,
                                  lora_read_alpha_pattern_is_eformat,
                                  lora_read_layers_to_transform_is_eformat,
                                  lora_read_lora_bias_is_eformat,
                                  lora_read_unknown_key_set_is_eformat,
                                  lora_read_rank_zero_is_eformat,
                                  lora_read_rank_missing_is_eformat,
                                  lora_read_alpha_string_is_eformat,
                                  lora_read_rslora_string_is_eformat,
                                  lora_read_dropout_out_of_range_is_eformat,
                                  lora_read_config_not_json_is_eformat,
                                  lora_read_config_missing_is_eio,
                                  lora_read_config_too_big_is_etoobig,
                                  lora_read_rank_mismatch_is_eformat,
                                  lora_read_width_mismatch_is_eformat,
                                  lora_read_wrong_shape_is_eformat,
                                  lora_read_more_layers_than_base_is_eformat,
                                  lora_read_fewer_layers_than_base_is_eformat,
                                  lora_read_missing_tensor_is_eformat,
                                  lora_read_extra_tensor_is_eformat,
                                  lora_read_untargeted_tensor_is_eformat,
                                  lora_read_integer_tensor_is_etype,
                                  lora_read_nan_is_eformat,
                                  lora_read_bad_safetensors_is_eformat,
                                  lora_read_every_allocation_failure_is_clean};
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) tcase_add_test(tc, tests[i]);
    suite_add_tcase(s, tc);
    TCase *tm = tcase_create("lora_module");
    tcase_add_test(tm, lora_module_names_and_dims);
    suite_add_tcase(s, tm);
    TCase *tf = tcase_create("lora_free");
    tcase_add_test(tf, lora_free_null_is_a_no_op);
    suite_add_tcase(s, tf);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(lora_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
