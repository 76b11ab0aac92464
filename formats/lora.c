/*
 * formats/lora.c: lora_read, a PEFT LoRA adapter for GPT-2 (lora.h).
 *
 * Three steps, each refusing with one line: adapter_config.json (every key
 * that changes the arithmetic checked against what gpt2d applies), the set
 * of (layer, module) pairs target_modules names, matched as PEFT matches
 * them against GPT2LMHeadModel's module names, then the safetensors file
 * (sft_open's checks, then every tensor's name, dtype and shape against
 * the config and the base, and the set of tensors against the targets,
 * both ways). Only then are the factors widened to F32 into one slab.
 */
#include "lora.h"

#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TENSOR_PREFIX "base_model.model.transformer.h."

static const char *const module_names[LORA_NMODULES] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                        "mlp.c_proj"};
/* in and out as multiples of n_embd */
static const size_t module_in[LORA_NMODULES] = {1, 1, 1, 4};
static const size_t module_out[LORA_NMODULES] = {3, 1, 4, 1};

const char *lora_module_name(lora_module m)
{
    return (unsigned)m < LORA_NMODULES ? module_names[m] : "?";
}

void lora_module_dims(lora_module m, size_t n_embd, size_t *in, size_t *out)
{
    unsigned i = (unsigned)m < LORA_NMODULES ? (unsigned)m : 0;
    *in = module_in[i] * n_embd;
    *out = module_out[i] * n_embd;
}

const lora_pair *lora_pair_at(const lora_adapter *a, size_t l, lora_module m)
{
    return &a->pairs[l * LORA_NMODULES + (size_t)m];
}

void lora_free(lora_adapter *a)
{
    if (a == NULL) return;
    free(a->slab);
    free(a->pairs);
    free(a->dir);
    free(a->base_model);
    free(a);
}

/* ---- adapter_config.json -------------------------------------------------- */

/* What the config says, before the tensors are read. */
typedef struct {
    size_t rank;
    double alpha;
    int rslora;
    const json_t *targets; /* target_modules: an array of strings or a string */
    const char *base_model;
} config;

/* A value PEFT writes for a setting that is off. */
static int is_default(const json_t *v)
{
    if (v == NULL || json_is_null(v) || json_is_false(v)) return 1;
    if (json_is_string(v)) return json_string_length(v) == 0;
    if (json_is_array(v)) return json_array_size(v) == 0;
    if (json_is_object(v)) return json_object_size(v) == 0;
    return 0;
}

/* Keys that may hold anything: names, bookkeeping and training-time
 * settings that do not change an adapted module's output. */
static const char *const ignored_keys[] = {"base_model_name_or_path",
                                           "revision",
                                           "inference_mode",
                                           "auto_mapping",
                                           "init_lora_weights",
                                           "layers_pattern",
                                           "megatron_config",
                                           "megatron_core",
                                           "loftq_config",
                                           "eva_config",
                                           "corda_config",
                                           "runtime_config",
                                           "lora_dropout",
                                           "fan_in_fan_out"};

/* Keys that change the arithmetic: accepted only at their defaults, and
 * why not otherwise. */
static const struct {
    const char *key, *why;
} refused_keys[] = {{"use_dora", "DoRA (a magnitude vector beside A and B) is not supported"},
                    {"modules_to_save", "full copies of base modules are not supported"},
                    {"layers_to_transform", "an adapter on some layers only is not supported"},
                    {"rank_pattern", "a rank per module is not supported"},
                    {"alpha_pattern", "an alpha per module is not supported"},
                    {"layer_replication", "replicated layers are not supported"},
                    {"lora_bias", "a bias on lora_B is not supported"},
                    {"use_qalora", "QALoRA is not supported"},
                    {"trainable_token_indices", "trained token embeddings are not supported"},
                    {"target_parameters", "adapted parameters (not modules) are not supported"},
                    {"exclude_modules", "excluded modules are not supported"}};

static int in_list(const char *key, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(key, list[i]) == 0) return 1;
    return 0;
}

/* The whole file (at most LORA_MAX_CONFIG bytes) as JSON; *root owned. */
static sft_status load_json(const char *path, json_t **root, char *err, size_t errlen)
{
    *root = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sft__fail(err, errlen, SFT_EIO, path, "cannot open: %s", strerror(errno));
    struct stat st;
    sft_status s = SFT_OK;
    char *text = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        s = sft__fail(err, errlen, SFT_EIO, path, "not a regular file");
        goto done;
    }
    if ((unsigned long long)st.st_size > LORA_MAX_CONFIG) {
        s = sft__fail(err, errlen, SFT_ETOOBIG, path, "%lld bytes, more than the %u allowed",
                      (long long)st.st_size, LORA_MAX_CONFIG);
        goto done;
    }
    size_t n = (size_t)st.st_size, got = 0;
    text = malloc(n + 1);
    if (text == NULL) {
        s = sft__fail(err, errlen, SFT_ENOMEM, path, "out of memory");
        goto done;
    }
    while (got < n) {
        ssize_t r = read(fd, text + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            s = sft__fail(err, errlen, SFT_EIO, path, "read failed: %s",
                          r < 0 ? strerror(errno) : "file shrank");
            goto done;
        }
        got += (size_t)r;
    }
    if (sft__utf8_valid_prefix((const unsigned char *)text, n) != n) {
        s = sft__fail(err, errlen, SFT_EFORMAT, path, "not valid UTF-8");
        goto done;
    }
    json_error_t jerr;
    *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &jerr);
    if (*root == NULL) {
        s = sft__fail(err, errlen, SFT_EFORMAT, path, "not JSON: %s (line %d)", jerr.text,
                      jerr.line);
        goto done;
    }
    if (!json_is_object(*root)) {
        json_decref(*root);
        *root = NULL;
        s = sft__fail(err, errlen, SFT_EFORMAT, path, "not a JSON object");
    }
done:
    free(text);
    close(fd);
    return s;
}

static sft_status read_config(const char *path, const json_t *root, config *c, char *err,
                              size_t errlen)
{
    memset(c, 0, sizeof *c);
    const json_t *v = json_object_get(root, "peft_type");
    if (!json_is_string(v))
        return sft__fail(err, errlen, SFT_EFORMAT, path,
                         "peft_type: %s (a PEFT adapter names its type: \"LORA\")",
                         v == NULL ? "missing" : "not a string");
    if (strcmp(json_string_value(v), "LORA") != 0)
        return sft__fail(err, errlen, SFT_EFORMAT, path,
                         "peft_type: '%s' is not supported (only \"LORA\")", json_string_value(v));
    v = json_object_get(root, "task_type");
    if (v != NULL && !json_is_null(v)
        && (!json_is_string(v) || strcmp(json_string_value(v), "CAUSAL_LM") != 0))
        return sft__fail(err, errlen, SFT_EFORMAT, path,
                         "task_type: %s%s%s is not supported (only \"CAUSAL_LM\" or null: "
                         "an adapter on GPT2LMHeadModel)",
                         json_is_string(v) ? "'" : "",
                         json_is_string(v) ? json_string_value(v) : "not a string",
                         json_is_string(v) ? "'" : "");
    v = json_object_get(root, "r");
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > LORA_MAX_RANK)
        return sft__fail(err, errlen, SFT_EFORMAT, path,
                         "r: %s (the rank: an integer from 1 to %d)",
                         v == NULL ? "missing" : "out of range or not an integer", LORA_MAX_RANK);
    c->rank = (size_t)json_integer_value(v);
    v = json_object_get(root, "lora_alpha");
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) <= 0)
        return sft__fail(err, errlen, SFT_EFORMAT, path, "lora_alpha: %s (a number above 0)",
                         v == NULL ? "missing" : "not a finite number above 0");
    c->alpha = json_number_value(v);
    v = json_object_get(root, "use_rslora");
    if (v != NULL && !json_is_boolean(v))
        return sft__fail(err, errlen, SFT_EFORMAT, path, "use_rslora: not true or false");
    c->rslora = json_is_true(v);
    v = json_object_get(root, "bias");
    if (v != NULL && (!json_is_string(v) || strcmp(json_string_value(v), "none") != 0))
        return sft__fail(err, errlen, SFT_EFORMAT, path,
                         "bias: %s%s%s trains biases of the base, which is not supported (only "
                         "\"none\")",
                         json_is_string(v) ? "'" : "",
                         json_is_string(v) ? json_string_value(v) : "not a string",
                         json_is_string(v) ? "'" : "");
    v = json_object_get(root, "fan_in_fan_out");
    if (v != NULL && !json_is_boolean(v))
        return sft__fail(err, errlen, SFT_EFORMAT, path, "fan_in_fan_out: not true or false");
    v = json_object_get(root, "lora_dropout");
    if (v != NULL && !json_is_null(v)
        && (!json_is_number(v) || !(json_number_value(v) >= 0 && json_number_value(v) <= 1)))
        return sft__fail(err, errlen, SFT_EFORMAT, path, "lora_dropout: not a number from 0 to 1");
    v = json_object_get(root, "base_model_name_or_path");
    if (v != NULL && !json_is_null(v) && !json_is_string(v))
        return sft__fail(err, errlen, SFT_EFORMAT, path,
                         "base_model_name_or_path: not a string or null");
    c->base_model = json_is_string(v) ? json_string_value(v) : NULL;
    for (size_t i = 0; i < sizeof refused_keys / sizeof refused_keys[0]; i++)
        if (!is_default(json_object_get(root, refused_keys[i].key)))
            return sft__fail(err, errlen, SFT_EFORMAT, path, "%s: %s", refused_keys[i].key,
                             refused_keys[i].why);
    v = json_object_get(root, "target_modules");
    if (!json_is_array(v) && !json_is_string(v))
        return sft__fail(err, errlen, SFT_EFORMAT, path,
                         "target_modules: %s (a list of module names or a regular expression)",
                         v == NULL ? "missing" : "not a list or a string");
    if (json_is_array(v)) {
        if (json_array_size(v) == 0)
            return sft__fail(err, errlen, SFT_EFORMAT, path, "target_modules: an empty list");
        for (size_t i = 0; i < json_array_size(v); i++)
            if (!json_is_string(json_array_get(v, i)))
                return sft__fail(err, errlen, SFT_EFORMAT, path,
                                 "target_modules: entry %zu is not a string", i);
    }
    c->targets = v;
    static const char *const checked[] = {
        "peft_type", "task_type", "r", "lora_alpha", "use_rslora", "bias", "target_modules"};
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)root, key, val)
    {
        if (in_list(key, checked, sizeof checked / sizeof checked[0])
            || in_list(key, ignored_keys, sizeof ignored_keys / sizeof ignored_keys[0]))
            continue;
        int known = 0;
        for (size_t i = 0; i < sizeof refused_keys / sizeof refused_keys[0]; i++)
            known |= strcmp(key, refused_keys[i].key) == 0;
        if (!known && !is_default(val))
            return sft__fail(err, errlen, SFT_EFORMAT, path,
                             "%s: an unknown key with a value that is not a default (null, "
                             "false, \"\", [] or {}): what it changes is not known here",
                             key);
    }
    return SFT_OK;
}

/* ---- target_modules -------------------------------------------------------- */

/* The modules of GPT2LMHeadModel that PEFT could be asked to adapt but gpt2d
 * does not: names outside the blocks, and per-block ones. */
static const char *const outer_names[] = {"transformer",      "transformer.wte", "transformer.wpe",
                                          "transformer.drop", "transformer.h",   "transformer.ln_f",
                                          "lm_head"};
static const char *const block_names[] = {
    "",      ".ln_1", ".attn",    ".attn.attn_dropout", ".attn.resid_dropout",
    ".ln_2", ".mlp",  ".mlp.act", ".mlp.dropout"}; /* after "transformer.h.N" */

/* PEFT's rule for a list entry: the module's name is the entry, or ends
 * with "." + the entry. For a string: the whole name matches the regular
 * expression (compiled in re). */
static int target_matches(const char *entry, const regex_t *re, const char *name)
{
    if (re != NULL) return regexec(re, name, 0, NULL, 0) == 0;
    size_t n = strlen(name), e = strlen(entry);
    if (n == e) return strcmp(name, entry) == 0;
    return n > e && name[n - e - 1] == '.' && strcmp(name + n - e, entry) == 0;
}

/* Marks in want[l * LORA_NMODULES + m] the pairs one entry (or the regular
 * expression) names; refuses an entry that names a module gpt2d does not
 * adapt, or none. */
static sft_status match_entry(const char *path, const char *entry, const regex_t *re,
                              size_t n_layer, unsigned char *want, char *err, size_t errlen)
{
    char name[160];
    int any = 0;
    for (size_t i = 0; i < sizeof outer_names / sizeof outer_names[0]; i++)
        if (target_matches(entry, re, outer_names[i]))
            return sft__fail(err, errlen, SFT_EFORMAT, path,
                             "target_modules: '%s' names %s, which gpt2d does not adapt (only "
                             "attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj)",
                             entry, outer_names[i]);
    for (size_t l = 0; l < n_layer; l++) {
        for (size_t i = 0; i < sizeof block_names / sizeof block_names[0]; i++) {
            snprintf(name, sizeof name, "transformer.h.%zu%s", l, block_names[i]);
            if (target_matches(entry, re, name))
                return sft__fail(err, errlen, SFT_EFORMAT, path,
                                 "target_modules: '%s' names %s, which gpt2d does not adapt "
                                 "(only attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj)",
                                 entry, name);
        }
        for (size_t m = 0; m < LORA_NMODULES; m++) {
            snprintf(name, sizeof name, "transformer.h.%zu.%s", l, module_names[m]);
            if (target_matches(entry, re, name)) {
                want[l * LORA_NMODULES + m] = 1;
                any = 1;
            }
        }
    }
    if (!any)
        return sft__fail(err, errlen, SFT_EFORMAT, path,
                         "target_modules: '%s' names no module of a %zu-layer GPT-2", entry,
                         n_layer);
    return SFT_OK;
}

/* A Python regular expression (PEFT's re.fullmatch) as POSIX extended
 * syntax into out (cap bytes, at least 13 per input byte plus 5), anchored:
 * the escapes of a special character (\\. \\( ...) are ERE's too; \\d and
 * \\w become their classes; any other escape, a backslash inside brackets
 * and the (?...) extensions have no ERE equivalent: -1. */
static int python_to_ere(const char *pat, char *out, size_t cap)
{
    size_t o = 0;
    int bracket = 0; /* inside [...] */
    memcpy(out + o, "^(", 2);
    o += 2;
    for (const char *p = pat; *p != '\0'; p++) {
        if (o + 16 > cap) return -1;
        const char *emit = NULL;
        char one[3] = {*p, 0, 0};
        if (bracket) {
            if (*p == '\\') return -1;
            if (*p == ']') bracket = 0;
        } else if (*p == '\\') {
            p++;
            if (*p == 'd')
                emit = "[0-9]";
            else if (*p == 'w')
                emit = "[A-Za-z0-9_]";
            else if (*p != '\0' && strchr(".^$*+?()[]{}|\\", *p) != NULL) {
                one[0] = '\\';
                one[1] = *p;
            } else if (*p == '/' || *p == '-' || *p == '_')
                one[0] = *p;
            else
                return -1;
        } else if (*p == '(' && p[1] == '?') {
            return -1;
        } else if (*p == '[') {
            bracket = 1;
            out[o++] = *p++;
            if (*p == '^') out[o++] = *p++;
            if (*p == '\0') return -1;
            one[0] = *p; /* a ']' here is literal */
            if (*p == '\\') return -1;
        }
        if (emit == NULL) emit = one;
        size_t n = strlen(emit);
        memcpy(out + o, emit, n);
        o += n;
    }
    if (bracket) return -1;
    memcpy(out + o, ")$", 3);
    return 0;
}

/* want[] from target_modules: a list of names, "all-linear" (every
 * projection but the LM head, PEFT's meaning), or a regular expression
 * matched against each whole name (PEFT's re.fullmatch), read through
 * python_to_ere; one it cannot translate is refused rather than read
 * differently. */
static sft_status match_targets(const char *path, const config *c, size_t n_layer,
                                unsigned char *want, char *err, size_t errlen)
{
    if (json_is_array(c->targets)) {
        for (size_t i = 0; i < json_array_size(c->targets); i++) {
            sft_status s = match_entry(path, json_string_value(json_array_get(c->targets, i)), NULL,
                                       n_layer, want, err, errlen);
            if (s != SFT_OK) return s;
        }
        return SFT_OK;
    }
    const char *pat = json_string_value(c->targets);
    if (strcmp(pat, "all-linear") == 0) {
        memset(want, 1, n_layer * LORA_NMODULES);
        return SFT_OK;
    }
    size_t cap = 13 * strlen(pat) + 32;
    char *ere = strlen(pat) <= 1000 ? malloc(cap) : NULL;
    if (strlen(pat) <= 1000 && ere == NULL)
        return sft__fail(err, errlen, SFT_ENOMEM, path, "out of memory");
    if (ere == NULL || python_to_ere(pat, ere, cap) != 0) {
        free(ere);
        return sft__fail(err, errlen, SFT_EFORMAT, path,
                         "target_modules: the regular expression '%s' uses syntax this reader "
                         "does not read (only POSIX extended syntax, \\d, \\w and escaped "
                         "characters; at most 1000 bytes)",
                         pat);
    }
    regex_t re;
    int rc = regcomp(&re, ere, REG_EXTENDED | REG_NOSUB);
    free(ere);
    if (rc != 0)
        return sft__fail(err, errlen, SFT_EFORMAT, path,
                         "target_modules: '%s' is not a regular expression this reader reads", pat);
    sft_status s = match_entry(path, pat, &re, n_layer, want, err, errlen);
    regfree(&re);
    return s;
}

/* ---- adapter_model.safetensors ------------------------------------------------ */

/* Parses NAME = TENSOR_PREFIX "N.MODULE.lora_A.weight" (or lora_B): 1 with
 * the layer, module and factor (0 A, 1 B), or 0. The layer is decimal
 * without leading zeros, below LORA_MAX_LAYERS. */
static int parse_name(const char *name, size_t *layer, size_t *module, int *factor)
{
    size_t np = strlen(TENSOR_PREFIX);
    if (strncmp(name, TENSOR_PREFIX, np) != 0) return 0;
    const char *p = name + np;
    size_t l = 0, digits = 0;
    while (p[digits] >= '0' && p[digits] <= '9') {
        if (digits == 4) return 0;
        l = l * 10 + (size_t)(p[digits] - '0');
        digits++;
    }
    if (digits == 0 || (digits > 1 && p[0] == '0') || l >= LORA_MAX_LAYERS || p[digits] != '.')
        return 0;
    p += digits + 1;
    for (size_t m = 0; m < LORA_NMODULES; m++) {
        size_t n = strlen(module_names[m]);
        if (strncmp(p, module_names[m], n) != 0) continue;
        if (strcmp(p + n, ".lora_A.weight") == 0 || strcmp(p + n, ".lora_B.weight") == 0) {
            *layer = l;
            *module = m;
            *factor = p[n + 6] == 'B';
            return 1;
        }
    }
    return 0;
}

/* Every tensor's name, dtype and rank (dimension count) checked; the base's
 * layers and width read off them where the caller gave 0. */
static sft_status check_names(const char *path, const sft_file *f, size_t *n_layer, size_t *n_embd,
                              char *err, size_t errlen)
{
    size_t max_layer = 0;
    for (size_t i = 0; i < sft_count(f); i++) {
        const sft_tensor *t = sft_tensor_at(f, i);
        size_t l, m;
        int b;
        if (!parse_name(t->name, &l, &m, &b))
            return sft__fail(err, errlen, SFT_EFORMAT, path,
                             "tensor '%s': unexpected (an adapter holds only " TENSOR_PREFIX
                             "N.{attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj}.lora_{A,B}.weight)",
                             t->name);
        if (t->dtype != SFT_F32 && t->dtype != SFT_F16 && t->dtype != SFT_BF16)
            return sft__fail(err, errlen, SFT_ETYPE, path,
                             "tensor '%s': dtype %s (an adapter's tensors are F32, F16 or BF16)",
                             t->name, sft_dtype_name(t->dtype));
        if (t->ndim != 2)
            return sft__fail(err, errlen, SFT_EFORMAT, path,
                             "tensor '%s': %zu dimensions, expected 2", t->name, t->ndim);
        if (*n_layer != 0 && l >= *n_layer)
            return sft__fail(err, errlen, SFT_EFORMAT, path,
                             "tensor '%s': layer %zu, but the base has %zu layers", t->name, l,
                             *n_layer);
        if (l > max_layer) max_layer = l;
        if (*n_embd == 0) {
            /* A's columns are the module's input, B's rows its output. */
            int64_t d = b ? t->shape[0] : t->shape[1];
            size_t mult = b ? module_out[m] : module_in[m];
            if (d <= 0 || (uint64_t)d % mult != 0 || (uint64_t)d / mult > (1u << 20))
                return sft__fail(err, errlen, SFT_EFORMAT, path,
                                 "tensor '%s': dimension %lld is not %zu x a model width", t->name,
                                 (long long)d, mult);
            *n_embd = (size_t)((uint64_t)d / mult);
        }
    }
    if (sft_count(f) == 0)
        return sft__fail(err, errlen, SFT_EFORMAT, path,
                         "no tensors (an adapter adapts something)");
    if (*n_layer == 0) *n_layer = max_layer + 1;
    return SFT_OK;
}

/* The shapes against r and the width, the tensors against the targets
 * (both ways); fills the pairs' dimensions and counts the floats. */
static sft_status check_tensors(const char *path, const sft_file *f, const lora_adapter *a,
                                const unsigned char *want, size_t *floats, char *err, size_t errlen)
{
    char name[200], got[64];
    size_t r = a->rank;
    *floats = 0;
    for (size_t i = 0; i < sft_count(f); i++) {
        const sft_tensor *t = sft_tensor_at(f, i);
        size_t l, m;
        int b;
        parse_name(t->name, &l, &m, &b);
        const lora_pair *p = &a->pairs[l * LORA_NMODULES + m];
        uint64_t d0 = b ? p->out : r, d1 = b ? r : p->in;
        if ((uint64_t)t->shape[0] != d0 || (uint64_t)t->shape[1] != d1)
            return sft__fail(err, errlen, SFT_EFORMAT, path,
                             "tensor '%s': shape %s, expected [%llu, %llu] (r = %zu, width %zu)",
                             t->name, sft__shape_str(got, sizeof got, t->shape, t->ndim),
                             (unsigned long long)d0, (unsigned long long)d1, r, a->n_embd);
        if (!want[l * LORA_NMODULES + m])
            return sft__fail(err, errlen, SFT_EFORMAT, path,
                             "tensor '%s': layer %zu's %s is not in target_modules", t->name, l,
                             module_names[m]);
    }
    for (size_t l = 0; l < a->n_layer; l++)
        for (size_t m = 0; m < LORA_NMODULES; m++) {
            if (!want[l * LORA_NMODULES + m]) continue;
            const lora_pair *p = &a->pairs[l * LORA_NMODULES + m];
            for (int b = 0; b < 2; b++) {
                snprintf(name, sizeof name, TENSOR_PREFIX "%zu.%s.lora_%c.weight", l,
                         module_names[m], b ? 'B' : 'A');
                if (sft_find(f, name) == NULL)
                    return sft__fail(err, errlen, SFT_EFORMAT, path,
                                     "tensor '%s': missing (target_modules names layer %zu's %s)",
                                     name, l, module_names[m]);
            }
            *floats += r * (p->in + p->out); /* bounded: the file holds these elements */
        }
    return SFT_OK;
}

/* The factors widened into a->slab, each checked finite. */
static sft_status load_factors(const char *path, const sft_file *f, lora_adapter *a, size_t floats,
                               char *err, size_t errlen)
{
    a->slab = malloc((floats ? floats : 1) * sizeof(float));
    if (a->slab == NULL) return sft__fail(err, errlen, SFT_ENOMEM, path, "out of memory");
    float *next = a->slab;
    for (size_t i = 0; i < sft_count(f); i++) {
        const sft_tensor *t = sft_tensor_at(f, i);
        size_t l, m;
        int b;
        parse_name(t->name, &l, &m, &b);
        lora_pair *p = &a->pairs[l * LORA_NMODULES + m];
        size_t n = sft_tensor_numel(t);
        sft_status s = sft_tensor_to_f32(t, next, n, err, errlen);
        if (s != SFT_OK) return s;
        for (size_t k = 0; k < n; k++)
            if (!isfinite(next[k]))
                return sft__fail(err, errlen, SFT_EFORMAT, path,
                                 "tensor '%s': element %zu is not finite", t->name, k);
        if (b)
            p->b = next;
        else
            p->a = next;
        if (t->dtype != a->dtype) a->mixed_dtype = 1;
        next += n;
    }
    return SFT_OK;
}

/* "DIR/NAME" into a new string, or NULL. */
static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p != NULL) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

sft_status lora_read(const char *path, size_t n_layer, size_t n_embd, lora_adapter **out, char *err,
                     size_t errlen)
{
    *out = NULL;
    if (path == NULL) return sft__fail(err, errlen, SFT_EINVAL, "(null)", "no adapter path");
    sft_status s = SFT_OK;
    char *cpath = NULL, *wpath = NULL;
    json_t *root = NULL;
    sft_file *f = NULL;
    unsigned char *want = NULL;
    lora_adapter *a = calloc(1, sizeof *a);
    if (a == NULL) return sft__fail(err, errlen, SFT_ENOMEM, path, "out of memory");
    struct stat st;
    if (stat(path, &st) != 0) {
        s = sft__fail(err, errlen, SFT_EIO, path, "cannot open: %s", strerror(errno));
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        a->dir = strdup(path);
    } else {
        /* DIR/adapter_model.safetensors: the folder is what precedes the last '/'. */
        const char *slash = strrchr(path, '/');
        a->dir =
            slash == NULL ? strdup(".") : strndup(path, (size_t)(slash - path) + (slash == path));
    }
    if (a->dir == NULL) goto nomem;
    cpath = join(a->dir, LORA_CONFIG_FILE);
    wpath = S_ISDIR(st.st_mode) ? join(a->dir, LORA_WEIGHTS_FILE) : strdup(path);
    if (cpath == NULL || wpath == NULL) goto nomem;
    config c;
    s = load_json(cpath, &root, err, errlen);
    if (s == SFT_OK) s = read_config(cpath, root, &c, err, errlen);
    if (s != SFT_OK) goto fail;
    a->rank = c.rank;
    a->alpha = c.alpha;
    a->rslora = c.rslora;
    a->scaling = (float)(c.alpha / (c.rslora ? sqrt((double)c.rank) : (double)c.rank));
    if (c.base_model != NULL && (a->base_model = strdup(c.base_model)) == NULL) goto nomem;
    s = sft_open(wpath, SFT_LOAD_MMAP, &f, err, errlen);
    if (s != SFT_OK) goto fail;
    a->n_layer = n_layer;
    a->n_embd = n_embd;
    s = check_names(wpath, f, &a->n_layer, &a->n_embd, err, errlen);
    if (s != SFT_OK) goto fail;
    a->dtype = sft_tensor_at(f, 0)->dtype;
    want = calloc(a->n_layer * LORA_NMODULES, 1);
    a->pairs = calloc(a->n_layer * LORA_NMODULES, sizeof *a->pairs);
    if (want == NULL || a->pairs == NULL) goto nomem;
    for (size_t i = 0; i < a->n_layer * LORA_NMODULES; i++)
        lora_module_dims((lora_module)(i % LORA_NMODULES), a->n_embd, &a->pairs[i].in,
                         &a->pairs[i].out);
    s = match_targets(cpath, &c, a->n_layer, want, err, errlen);
    if (s != SFT_OK) goto fail;
    size_t floats;
    s = check_tensors(wpath, f, a, want, &floats, err, errlen);
    if (s == SFT_OK) s = load_factors(wpath, f, a, floats, err, errlen);
    if (s != SFT_OK) goto fail;
    for (size_t i = 0; i < a->n_layer * LORA_NMODULES; i++)
        if (a->pairs[i].a != NULL) {
            a->targets |= 1u << (i % LORA_NMODULES);
            a->n_adapted++;
        }
    *out = a;
    a = NULL;
    goto done;
nomem:
    s = sft__fail(err, errlen, SFT_ENOMEM, path, "out of memory");
fail:
    lora_free(a);
done:
    free(want);
    sft_close(f);
    json_decref(root);
    free(wpath);
    free(cpath);
    return s;
}
