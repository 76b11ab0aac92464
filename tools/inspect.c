/*
 * tools/inspect.c: `gpt2d inspect FILE [--json]`, a safetensors file's header,
 * validated; or a PEFT LoRA adapter (a folder with adapter_config.json, or
 * the adapter_model.safetensors in one): its rank, scaling, targets, layers
 * and dtype, read by formats' lora_read with every check. Exit 0 when the
 * file is valid, 1 with one line on stderr when it is not, 2 on a usage
 * error.
 */
#include "tools.h"

#include "engine.h"

#include "lora.h"
#include "safetensors.h"
#include "wformat.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static void inspect_usage(FILE *out)
{
    fprintf(out, "usage: gpt2d inspect FILE|ADAPTER_DIR [--json]\n"
                 "Validates a safetensors file and prints its weight format (f32, f16, bf16,\n"
                 "q8 or mixed; a malformed q8 file is refused), layout (hf, panel64, pairs64),\n"
                 "metadata and tensors. A PEFT LoRA adapter (a folder with\n"
                 "adapter_config.json, or its adapter_model.safetensors) is validated as\n"
                 "an adapter: its rank, scaling, targets, layers and dtype.\n"
                 "  --json   machine-readable output\n"
                 "  --help   this text\n");
}

/* A tensor is aligned when its position in the file is a multiple of its
 * element size: a pointer into a page-aligned mapping is then aligned. */
static int is_aligned(const sft_file *f, const sft_tensor *t)
{
    return (sft_data_start(f) + t->begin) % sft_dtype_size(t->dtype) == 0;
}

static void shape_text(char *buf, size_t len, const sft_tensor *t)
{
    size_t used = (size_t)snprintf(buf, len, "[");
    for (size_t d = 0; d < t->ndim && used < len; d++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", d ? ", " : "",
                                 (long long)t->shape[d]);
    if (used < len) snprintf(buf + used, len - used, "]");
}

static int print_json(const sft_file *f, const char *format, const char *layout)
{
    json_t *root = json_object();
    json_t *meta = json_object();
    json_t *list = json_array();
    size_t nmeta;
    const sft_meta *m = sft_metadata(f, &nmeta);
    for (size_t i = 0; i < nmeta; i++) json_object_set_new(meta, m[i].key, json_string(m[i].value));
    size_t aligned = 0;
    for (size_t i = 0; i < sft_count(f); i++) {
        const sft_tensor *t = sft_tensor_at(f, i);
        json_t *shape = json_array();
        for (size_t d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        int a = is_aligned(f, t);
        aligned += (size_t)a;
        json_array_append_new(list,
                              json_pack("{s:s, s:s, s:o, s:[I,I], s:b}", "name", t->name, "dtype",
                                        sft_dtype_name(t->dtype), "shape", shape, "data_offsets",
                                        (json_int_t)t->begin, (json_int_t)t->end, "aligned", a));
    }
    json_object_set_new(root, "path", json_string(sft_path(f)));
    json_object_set_new(root, "file_size", json_integer((json_int_t)sft_file_size(f)));
    json_object_set_new(root, "header_length", json_integer((json_int_t)sft_header_len(f)));
    json_object_set_new(root, "data_start", json_integer((json_int_t)sft_data_start(f)));
    json_object_set_new(root, "format", json_string(format));
    json_object_set_new(root, "layout", json_string(layout));
    json_object_set_new(root, "kernels", json_string(eng_kernels_for(format)));
    json_object_set_new(root, "tensor_count", json_integer((json_int_t)sft_count(f)));
    json_object_set_new(root, "aligned_count", json_integer((json_int_t)aligned));
    json_object_set_new(root, "metadata", meta);
    json_object_set_new(root, "tensors", list);
    int rc = json_dumpf(root, stdout, JSON_INDENT(2)) == 0 ? 0 : 1;
    fputc('\n', stdout);
    json_decref(root);
    return rc;
}

static void print_table(const sft_file *f, const char *format, const char *layout)
{
    size_t nmeta;
    const sft_meta *m = sft_metadata(f, &nmeta);
    printf("file        %s\n", sft_path(f));
    printf("size        %llu bytes\n", (unsigned long long)sft_file_size(f));
    printf("header      %llu bytes; data starts at byte %llu (%s)\n",
           (unsigned long long)sft_header_len(f), (unsigned long long)sft_data_start(f),
           sft_data_start(f) % 8 == 0 ? "8-byte aligned" : "not 8-byte aligned");
    printf("format      %s (the weight matrices'; docs/api.md)\n", format);
    printf("layout      %s (%s)\n", layout,
           strcmp(layout, "hf") == 0              ? "Hugging Face's"
           : strcmp(layout, WF_LAYOUT_PAIRS) == 0 ? "the avx512-bf16 kernels' pairs, read in place"
                                                  : "gpt2d's serving layout");
    printf("kernels     %s (the path its weights take on this CPU)\n", eng_kernels_for(format));
    printf("metadata   ");
    if (nmeta == 0) printf(" (none)");
    for (size_t i = 0; i < nmeta; i++) printf(" %s=%s", m[i].key, m[i].value);
    printf("\n\n%-40s %-5s %-22s %-26s %s\n", "name", "dtype", "shape", "data_offsets", "aligned");
    size_t aligned = 0, elements = 0;
    for (size_t i = 0; i < sft_count(f); i++) {
        const sft_tensor *t = sft_tensor_at(f, i);
        char shape[128], range[64];
        shape_text(shape, sizeof shape, t);
        snprintf(range, sizeof range, "[%llu, %llu)", (unsigned long long)t->begin,
                 (unsigned long long)t->end);
        int a = is_aligned(f, t);
        aligned += (size_t)a;
        elements += sft_tensor_numel(t);
        printf("%-40s %-5s %-22s %-26s %s\n", t->name, sft_dtype_name(t->dtype), shape, range,
               a ? "yes" : "no");
    }
    printf("\n%zu tensors, %zu elements, %zu aligned, %zu misaligned\n", sft_count(f), elements,
           aligned, sft_count(f) - aligned);
}

/* Whether path is a LoRA adapter: a folder with adapter_config.json, or an
 * adapter_model.safetensors with one beside it. */
static int is_adapter(const char *path)
{
    struct stat st;
    char cfg[4096];
    if (stat(path, &st) != 0) return 0;
    if (S_ISDIR(st.st_mode)) {
        snprintf(cfg, sizeof cfg, "%s/%s", path, LORA_CONFIG_FILE);
        return stat(cfg, &st) == 0;
    }
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (strcmp(base, LORA_WEIGHTS_FILE) != 0) return 0;
    snprintf(cfg, sizeof cfg, "%.*s%s", slash ? (int)(slash - path + 1) : 0, path,
             LORA_CONFIG_FILE);
    return stat(cfg, &st) == 0;
}

/* The adapted layers as "0-5" or "0, 2, 4" (runs joined). */
static void layers_text(char *buf, size_t len, const lora_adapter *a)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t l = 0; l < a->n_layer && used < len; l++) {
        int on = 0;
        for (size_t m = 0; m < LORA_NMODULES; m++)
            on |= lora_pair_at(a, l, (lora_module)m)->a != NULL;
        if (!on) continue;
        size_t e = l;
        while (e + 1 < a->n_layer) {
            int next = 0;
            for (size_t m = 0; m < LORA_NMODULES; m++)
                next |= lora_pair_at(a, e + 1, (lora_module)m)->a != NULL;
            if (!next) break;
            e++;
        }
        used +=
            (size_t)(e > l ? snprintf(buf + used, len - used, "%s%zu-%zu", used ? ", " : "", l, e)
                           : snprintf(buf + used, len - used, "%s%zu", used ? ", " : "", l));
        l = e;
    }
}

static int inspect_adapter(const char *path, int json)
{
    char err[512];
    lora_adapter *a = NULL;
    sft_status s = lora_read(path, 0, 0, &a, err, sizeof err);
    if (s != SFT_OK) {
        fprintf(stderr, "gpt2d inspect: %s: %s\n", sft_strerror(s), err);
        return 1;
    }
    size_t params = 0;
    for (size_t i = 0; i < a->n_layer * LORA_NMODULES; i++)
        if (a->pairs[i].a != NULL) params += a->rank * (a->pairs[i].in + a->pairs[i].out);
    const char *dtype = a->mixed_dtype ? "mixed" : sft_dtype_name(a->dtype);
    char layers[512];
    layers_text(layers, sizeof layers, a);
    int rc = 0;
    if (json) {
        json_t *targets = json_array(), *adapted = json_array();
        for (size_t m = 0; m < LORA_NMODULES; m++)
            if (a->targets & (1u << m))
                json_array_append_new(targets, json_string(lora_module_name((lora_module)m)));
        for (size_t l = 0; l < a->n_layer; l++) {
            int on = 0;
            for (size_t m = 0; m < LORA_NMODULES; m++)
                on |= lora_pair_at(a, l, (lora_module)m)->a != NULL;
            if (on) json_array_append_new(adapted, json_integer((json_int_t)l));
        }
        json_t *root =
            json_pack("{s:s, s:s, s:s?, s:I, s:f, s:b, s:f, s:o, s:o, s:I, s:I, s:I, s:s, s:I}",
                      "path", a->dir, "kind", "lora", "base_model", a->base_model, "rank",
                      (json_int_t)a->rank, "alpha", a->alpha, "use_rslora", a->rslora, "scaling",
                      (double)a->scaling, "targets", targets, "layers", adapted, "n_layer",
                      (json_int_t)a->n_layer, "n_embd", (json_int_t)a->n_embd, "modules_adapted",
                      (json_int_t)a->n_adapted, "dtype", dtype, "parameters", (json_int_t)params);
        rc = root != NULL && json_dumpf(root, stdout, JSON_INDENT(2)) == 0 ? 0 : 1;
        fputc('\n', stdout);
        json_decref(root);
    } else {
        printf("adapter     %s\n", a->dir);
        printf("type        PEFT LoRA%s%s\n", a->base_model ? ", base " : "",
               a->base_model ? a->base_model : "");
        printf("rank        %zu\n", a->rank);
        printf("scaling     %g (lora_alpha %g / %s)\n", (double)a->scaling, a->alpha,
               a->rslora ? "sqrt(r), use_rslora" : "r");
        printf("targets    ");
        for (size_t m = 0; m < LORA_NMODULES; m++)
            if (a->targets & (1u << m)) printf(" %s", lora_module_name((lora_module)m));
        printf("\nlayers      %s (of %zu; width %zu)\n", layers, a->n_layer, a->n_embd);
        printf("dtype       %s\n", dtype);
        printf("size        %zu modules adapted, %zu parameters\n", a->n_adapted, params);
    }
    lora_free(a);
    return rc;
}

int tool_inspect(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int json = 0, c, idx = 0;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":", longopts, &idx)) != -1) {
        switch (c) {
        case 'j': json = 1; break;
        case 'h': inspect_usage(stdout); return 0;
        default:
            tool_option_error("inspect", c, argv, optind, longopts, idx);
            inspect_usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "gpt2d inspect: expected exactly one file\n");
        inspect_usage(stderr);
        return 2;
    }
    if (is_adapter(argv[optind])) return inspect_adapter(argv[optind], json);
    char err[512];
    sft_file *f = NULL;
    /* Mapped, so that only the pages that are checked (BOOL tensors) are read. */
    sft_status s = sft_open(argv[optind], SFT_LOAD_MMAP, &f, err, sizeof err);
    if (s != SFT_OK) {
        fprintf(stderr, "gpt2d inspect: %s: %s\n", sft_strerror(s), err);
        return 1;
    }
    const char *format;
    int panel = 0;
    if (wf_detect(f, &format, err, sizeof err) != SFT_OK
        || wf_layout(f, &panel, err, sizeof err) != SFT_OK) {
        fprintf(stderr, "gpt2d inspect: %s: %s\n", sft_strerror(SFT_EFORMAT), err);
        sft_close(f);
        return 1;
    }
    int rc = 0;
    if (json)
        rc = print_json(f, format,
                        panel == WF_PAIRS ? WF_LAYOUT_PAIRS
                        : panel           ? WF_LAYOUT_PANEL
                                          : "hf");
    else
        print_table(f, format,
                    panel == WF_PAIRS ? WF_LAYOUT_PAIRS
                    : panel           ? WF_LAYOUT_PANEL
                                      : "hf");
    sft_close(f);
    return rc;
}
