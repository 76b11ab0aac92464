/*
 * tools/lora.c: `gpt2d lora merge BASE ADAPTER OUT [--meta KEY=VALUE]...`,
 * a PEFT LoRA adapter (formats/include/lora.h) merged into a checkpoint.
 *
 * Every adapted projection W [in, out] (GPT-2's Conv1D) becomes
 *     W'[i][o] = W[i][o] + scaling * sum_k A[k][i] * B[o][k]
 * (PEFT's merge for fan_in_fan_out: W + scaling * (B A)^T), the sum over k
 * in increasing order in F32, then one rounding of the scaled delta added
 * to W. The merge runs in F32 and OUT is F32 in the Hugging Face layout
 * whatever BASE is: BASE's F16 and BF16 widen exactly, a q8 BASE is
 * dequantized (q * scale, the F32 product the engine computes) and a
 * panel64 BASE un-panelled first, so OUT's logits are those of BASE's
 * weights plus the adapter with no rounding of BASE's own format applied
 * twice. `gpt2d convert OUT ... --dtype bf16 --layout panel64` then gives
 * the serving format. Metadata: BASE's labels, less the format and layout
 * keys, with --meta entries over them. The write is atomic (sft_save), as
 * `gpt2d convert`'s.
 */
#include "tools.h"

#include "lora.h"
#include "meta.h"
#include "quantize.h"
#include "safetensors.h"
#include "tensorset.h"
#include "wformat.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void lora_usage(FILE *out)
{
    fprintf(out, "usage: gpt2d lora merge BASE ADAPTER OUT [--meta KEY=VALUE]...\n"
                 "Merges a PEFT LoRA adapter (a folder with adapter_config.json and\n"
                 "adapter_model.safetensors) into a GPT-2 checkpoint: every adapted projection\n"
                 "W [in, out] becomes W + scaling * (B A)^T. BASE is a model folder or its\n"
                 "model.safetensors; OUT (a file, written atomically) is F32 in the Hugging Face\n"
                 "layout whatever BASE's format (q8 is dequantized, panel64 and pairs64 undone);\n"
                 "`gpt2d convert` gives it another. Copy BASE's config.json, vocab.json and\n"
                 "merges.txt beside OUT to serve it.\n"
                 "  --meta K=V   a __metadata__ entry of OUT, beside BASE's labels\n"
                 "  --help       this text\n");
}

/* "h.L.NAME" with the checkpoint's prefix ("" or "transformer."). */
static sft_tensor *layer_tensor(const tool_set *s, const char *prefix, size_t l, const char *name)
{
    char key[160];
    snprintf(key, sizeof key, "%sh.%zu.%s", prefix, l, name);
    return tool_set_find(s, key);
}

/* The base's layers and width, read off its tensors as the engine reads
 * them (layers: h.N.ln_1.weight counted; width: wte's columns). */
static int base_shape(const tool_set *s, const char **prefix, size_t *n_layer, size_t *n_embd,
                      char *err, size_t errlen)
{
    *prefix = tool_set_find(s, "transformer.wte.weight") != NULL ? "transformer." : "";
    char key[64];
    snprintf(key, sizeof key, "%swte.weight", *prefix);
    const sft_tensor *wte = tool_set_find(s, key);
    if (wte == NULL || wte->ndim != 2 || wte->shape[1] <= 0) {
        snprintf(err, errlen, "BASE has no 2-D wte.weight: not a GPT-2 checkpoint");
        return -1;
    }
    *n_embd = (size_t)wte->shape[1];
    *n_layer = 0;
    while (layer_tensor(s, *prefix, *n_layer, "ln_1.weight") != NULL) (*n_layer)++;
    if (*n_layer == 0) {
        snprintf(err, errlen, "BASE has no h.0.ln_1.weight: not a GPT-2 checkpoint");
        return -1;
    }
    return 0;
}

/* W += scaling * (B A)^T for every adapted module; W F32 [in, out]. */
static int merge(tool_set *s, const char *prefix, const lora_adapter *a, char *err, size_t errlen)
{
    size_t r = a->rank;
    for (size_t l = 0; l < a->n_layer; l++)
        for (size_t m = 0; m < LORA_NMODULES; m++) {
            const lora_pair *p = lora_pair_at(a, l, (lora_module)m);
            if (p->a == NULL) continue;
            char name[64];
            snprintf(name, sizeof name, "%s.weight", lora_module_name((lora_module)m));
            sft_tensor *t = layer_tensor(s, prefix, l, name);
            if (t == NULL || t->dtype != SFT_F32 || t->ndim != 2 || (size_t)t->shape[0] != p->in
                || (size_t)t->shape[1] != p->out) {
                snprintf(err, errlen, "BASE's h.%zu.%s is missing or not [%zu, %zu]", l, name,
                         p->in, p->out);
                return -1;
            }
            float *w = tool_set_alloc(s, p->in * p->out * sizeof *w);
            if (w == NULL) {
                snprintf(err, errlen, "out of memory");
                return -1;
            }
            memcpy(w, t->data, p->in * p->out * sizeof *w);
            for (size_t i = 0; i < p->in; i++)
                for (size_t o = 0; o < p->out; o++) {
                    float d = 0.0f;
                    for (size_t k = 0; k < r; k++) d += p->a[k * p->in + i] * p->b[o * r + k];
                    w[i * p->out + o] += a->scaling * d;
                }
            t->data = w;
        }
    return 0;
}

/* BASE's metadata less the format and layout keys (OUT is F32, hf), with
 * extra over it. NULL when out of memory. */
static sft_meta *out_metadata(const sft_file *f, const sft_meta *extra, size_t nextra, size_t *nom)
{
    size_t nmeta;
    const sft_meta *meta = sft_metadata(f, &nmeta);
    sft_meta *om = calloc(nmeta + nextra + 1, sizeof *om);
    if (om == NULL) return NULL;
    *nom = 0;
    for (size_t i = 0; i < nmeta; i++)
        if (strcmp(meta[i].key, WF_META_FORMAT) != 0 && strcmp(meta[i].key, WF_META_Q8_BLOCK) != 0
            && strcmp(meta[i].key, WF_META_LAYOUT) != 0)
            om[(*nom)++] = meta[i];
    for (size_t i = 0; i < nextra; i++) tool_meta_set(om, nom, extra[i].key, extra[i].value);
    return om;
}

static int lora_merge(const char *base, const char *adapter, const char *out, const sft_meta *extra,
                      size_t nextra)
{
    char err[512], path[4096];
    struct stat st;
    if (stat(base, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(path, sizeof path, "%s/model.safetensors", base);
    else
        snprintf(path, sizeof path, "%s", base);
    sft_file *f = NULL;
    lora_adapter *a = NULL;
    tool_set set = {0};
    sft_meta *om = NULL;
    int rc = 1;
    if (sft_open(path, SFT_LOAD_MMAP, &f, err, sizeof err) != SFT_OK) goto fail;
    const char *format, *prefix;
    int panel = 0;
    if (wf_detect(f, &format, err, sizeof err) != SFT_OK
        || wf_layout(f, &panel, err, sizeof err) != SFT_OK)
        goto fail;
    if (tool_set_init(&set, f, err, sizeof err) != 0) goto fail;
    if (panel == WF_PANELS && tool_unpanel(&set, err, sizeof err) != 0) goto fail;
    if (panel == WF_PAIRS && tool_unpair(&set, err, sizeof err) != 0) goto fail;
    if (strcmp(format, "q8") == 0 && tool_dequantize_q8(&set, err, sizeof err) != 0) goto fail;
    if (tool_to_float(&set, SFT_F32, err, sizeof err) != 0) goto fail;
    size_t n_layer, n_embd, nom;
    if (base_shape(&set, &prefix, &n_layer, &n_embd, err, sizeof err) != 0) goto fail;
    if (lora_read(adapter, n_layer, n_embd, &a, err, sizeof err) != SFT_OK) goto fail;
    if (merge(&set, prefix, a, err, sizeof err) != 0) goto fail;
    om = out_metadata(f, extra, nextra, &nom);
    if (om == NULL) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    if (sft_save(out, set.t, set.n, om, nom, NULL, err, sizeof err) != SFT_OK) goto fail;
    fprintf(stderr,
            "gpt2d lora merge: wrote %s (%zu tensors, F32, hf layout): %s (%s%s) plus %s (rank "
            "%zu, scaling %g, %zu modules in %zu layers)\n",
            out, set.n, path, format,
            panel == WF_PAIRS ? ", pairs64"
            : panel           ? ", panel64"
                              : "",
            a->dir, a->rank, (double)a->scaling, a->n_adapted, a->n_layer);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "gpt2d lora merge: %s\n", err);
done:
    free(om);
    lora_free(a);
    tool_set_free(&set);
    sft_close(f);
    return rc;
}

int tool_lora(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"meta", required_argument, 0, 'M'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        lora_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "merge") != 0) {
        fprintf(stderr, "gpt2d lora: unknown subcommand '%s' (only merge)\n", argv[1]);
        lora_usage(stderr);
        return 2;
    }
    argc--;
    argv++;
    sft_meta extra[TOOL_META_MAX];
    size_t nextra = 0;
    int c, idx = 0;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":", longopts, &idx)) != -1) {
        switch (c) {
        case 'M':
            if (tool_meta_add("lora merge", optarg, extra, &nextra) != 0) {
                lora_usage(stderr);
                return 2;
            }
            break;
        case 'h': lora_usage(stdout); return 0;
        default:
            tool_option_error("lora merge", c, argv, optind, longopts, idx);
            lora_usage(stderr);
            return 2;
        }
    }
    if (argc - optind != 3) {
        fprintf(stderr, "gpt2d lora merge: expected BASE, ADAPTER and OUT\n");
        lora_usage(stderr);
        return 2;
    }
    return lora_merge(argv[optind], argv[optind + 1], argv[optind + 2], extra, nextra);
}
