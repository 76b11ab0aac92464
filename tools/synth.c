/*
 * tools/synth.c: `gpt2d synth`, a GPT-2 checkpoint with random weights in the
 * exact Hugging Face layout.
 *
 * The real weights cannot be downloaded on the machines that build gpt2d, so
 * every test and benchmark runs on these files. They have the names, shapes,
 * dtype (F32), Conv1D layout ([in, out]), metadata ({"format":"pt"}, and
 * gpt2d.weights = random: a server serving it says the text is nonsense;
 * --meta adds or replaces keys, formats/include/wformat.h) and, with
 * --misaligned --mask-buffers, the 160 entries and the misaligned data start
 * of the published `gpt2` model.safetensors. A config.json in the Hugging
 * Face form is written beside the file.
 *
 * The weights are random but shaped so that a forward pass behaves like a
 * trained model's in the ways tests rely on: Conv1D weights are
 * N(0, 1/fan_in), so each block's attention and MLP change the residual
 * stream about as much as the embeddings (with GPT-2's N(0, 0.02)
 * initialisation the stream is the token embedding plus noise, and greedy
 * decoding repeats the last token forever); wte is N(0, 0.3), so logits
 * (h @ wte^T) spread by about 8 as trained GPT-2's do, and greedy choices are
 * not near-ties; wpe is N(0, 0.01); biases are N(0, 0.02), not 0, and
 * layer-norm gains 1 + N(0, 0.1) and shifts N(0, 0.02), so that a forward
 * pass that drops any of them fails the reference test.
 * Each tensor has its own random stream (seed, name), so the bytes depend
 * only on the options, and the weights only on the shape options and seed.
 */
#include "tools.h"

#include "engine.h"
#include "meta.h"
#include "safetensors.h"
#include "wformat.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    long layers, embd, heads, ctx, vocab;
    uint64_t seed;
    int misaligned, mask_buffers, lm_head;
    const char *prefix;
} synth_opts;

enum init_kind { INIT_NORMAL, INIT_LN_GAIN, INIT_MASK };

typedef struct {
    char name[96];
    size_t ndim;
    int64_t shape[4];
    enum init_kind kind;
    double std;
} synth_spec;

static void synth_usage(FILE *out)
{
    fprintf(out, "usage: gpt2d synth OUT [options]\n"
                 "Writes a GPT-2 checkpoint with random weights in the Hugging Face layout to OUT\n"
                 "(a .safetensors file) and config.json beside it. Defaults are GPT-2 small.\n"
                 "  --layers L        transformer blocks (12)\n"
                 "  --embd C          width (768)\n"
                 "  --heads H         attention heads, C %% H == 0 (12)\n"
                 "  --ctx N           context length (1024)\n"
                 "  --vocab V         vocabulary size (50257)\n"
                 "  --seed S          random seed (1)\n"
                 "  --misaligned      start the data at byte 4k+3, like the published file\n"
                 "  --mask-buffers    add the h.{i}.attn.bias causal-mask buffers\n"
                 "  --prefix P        prepend P to every name (e.g. transformer.)\n"
                 "  --lm-head         add lm_head.weight (a copy of wte, as state_dict() has)\n"
                 "  --meta KEY=VALUE  a __metadata__ entry (again: more); the file says\n"
                 "                    gpt2d.weights=random, which servers report, unless\n"
                 "                    this sets it (gpt2d.model_name, gpt2d.owned_by,\n"
                 "                    gpt2d.description, gpt2d.weights: docs/api.md)\n"
                 "  --help            this text\n");
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* Appends one spec; the names are short and bounded by the option ranges. */
static void add(synth_spec *specs, size_t *n, const synth_opts *o, const char *suffix,
                enum init_kind kind, double std, size_t ndim, const int64_t *shape)
{
    synth_spec *s = &specs[(*n)++];
    snprintf(s->name, sizeof s->name, "%s%s", o->prefix, suffix);
    s->ndim = ndim;
    memcpy(s->shape, shape, ndim * sizeof *shape);
    s->kind = kind;
    s->std = std;
}

static size_t build_specs(synth_spec *specs, const synth_opts *o)
{
    size_t n = 0;
    int64_t C = o->embd, V = o->vocab, N = o->ctx;
    /* Fan-in scaling keeps every block's contribution to the residual stream
     * comparable to the embeddings (see the comment at the top). */
    double in_c = 1.0 / sqrt((double)C), in_4c = 1.0 / sqrt(4.0 * (double)C);
    char nm[64];
    add(specs, &n, o, "wte.weight", INIT_NORMAL, 0.3, 2, (int64_t[]){V, C});
    add(specs, &n, o, "wpe.weight", INIT_NORMAL, 0.01, 2, (int64_t[]){N, C});
    for (long i = 0; i < o->layers; i++) {
#define L(fmt) (snprintf(nm, sizeof nm, "h.%ld." fmt, i), nm)
        add(specs, &n, o, L("ln_1.weight"), INIT_LN_GAIN, 0.1, 1, (int64_t[]){C});
        add(specs, &n, o, L("ln_1.bias"), INIT_NORMAL, 0.02, 1, (int64_t[]){C});
        if (o->mask_buffers)
            add(specs, &n, o, L("attn.bias"), INIT_MASK, 0, 4, (int64_t[]){1, 1, N, N});
        add(specs, &n, o, L("attn.c_attn.weight"), INIT_NORMAL, in_c, 2, (int64_t[]){C, 3 * C});
        add(specs, &n, o, L("attn.c_attn.bias"), INIT_NORMAL, 0.02, 1, (int64_t[]){3 * C});
        add(specs, &n, o, L("attn.c_proj.weight"), INIT_NORMAL, in_c, 2, (int64_t[]){C, C});
        add(specs, &n, o, L("attn.c_proj.bias"), INIT_NORMAL, 0.02, 1, (int64_t[]){C});
        add(specs, &n, o, L("ln_2.weight"), INIT_LN_GAIN, 0.1, 1, (int64_t[]){C});
        add(specs, &n, o, L("ln_2.bias"), INIT_NORMAL, 0.02, 1, (int64_t[]){C});
        add(specs, &n, o, L("mlp.c_fc.weight"), INIT_NORMAL, in_c, 2, (int64_t[]){C, 4 * C});
        add(specs, &n, o, L("mlp.c_fc.bias"), INIT_NORMAL, 0.02, 1, (int64_t[]){4 * C});
        add(specs, &n, o, L("mlp.c_proj.weight"), INIT_NORMAL, in_4c, 2, (int64_t[]){4 * C, C});
        add(specs, &n, o, L("mlp.c_proj.bias"), INIT_NORMAL, 0.02, 1, (int64_t[]){C});
#undef L
    }
    add(specs, &n, o, "ln_f.weight", INIT_LN_GAIN, 0.1, 1, (int64_t[]){C});
    add(specs, &n, o, "ln_f.bias", INIT_NORMAL, 0.02, 1, (int64_t[]){C});
    return n;
}

/* N(0, 1) by Box-Muller; 1 - u is in (0, 1], so the log is finite. */
static double normal(eng_rng *r)
{
    double u1 = eng_rng_uniform(r), u2 = eng_rng_uniform(r);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
}

/* The random stream of a tensor depends on the seed and its name without
 * the prefix only, so --prefix, --mask-buffers and --misaligned change the
 * layout of a file but never its weights. */
static void fill(float *dst, size_t count, const synth_spec *s, uint64_t seed, size_t prefix_len)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (const char *p = s->name + prefix_len; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001B3ull;
    eng_rng rng;
    eng_rng_seed(&rng, seed ^ h);
    switch (s->kind) {
    case INIT_NORMAL:
        for (size_t i = 0; i < count; i++) dst[i] = (float)(s->std * normal(&rng));
        break;
    case INIT_LN_GAIN:
        for (size_t i = 0; i < count; i++) dst[i] = (float)(1.0 + s->std * normal(&rng));
        break;
    case INIT_MASK: {
        /* The causal mask as GPT-2 stores it: [1, 1, N, N], 1 on and below
         * the diagonal. */
        size_t N = (size_t)s->shape[3];
        for (size_t r = 0; r < N; r++)
            for (size_t c = 0; c < N; c++) dst[r * N + c] = c <= r ? 1.0f : 0.0f;
        break;
    }
    }
}

static int write_config(const char *out_path, const synth_opts *o)
{
    const char *slash = strrchr(out_path, '/');
    size_t dlen = slash ? (size_t)(slash - out_path) + 1 : 0;
    char path[4096], tmp[4200];
    if (dlen + sizeof "config.json" > sizeof path) return -1;
    snprintf(path, sizeof path, "%.*sconfig.json", (int)dlen, out_path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *fp = fopen(tmp, "w");
    if (fp == NULL) return -1;
    fprintf(fp,
            "{\n"
            "  \"activation_function\": \"gelu_new\",\n"
            "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
            "  \"layer_norm_epsilon\": 1e-05,\n"
            "  \"model_type\": \"gpt2\",\n"
            "  \"n_ctx\": %ld,\n"
            "  \"n_embd\": %ld,\n"
            "  \"n_head\": %ld,\n"
            "  \"n_layer\": %ld,\n"
            "  \"n_positions\": %ld,\n"
            "  \"vocab_size\": %ld,\n"
            "  \"gpt2d_synth_seed\": %" PRIu64 "\n"
            "}\n",
            o->ctx, o->embd, o->heads, o->layers, o->ctx, o->vocab, o->seed);
    if (fclose(fp) != 0 || rename(tmp, path) != 0) {
        remove(tmp);
        return -1;
    }
    return 0;
}

int tool_synth(int argc, char **argv)
{
    synth_opts o = {.layers = 12,
                    .embd = 768,
                    .heads = 12,
                    .ctx = 1024,
                    .vocab = 50257,
                    .seed = 1,
                    .prefix = ""};
    static const struct option longopts[] = {{"layers", required_argument, 0, 'l'},
                                             {"embd", required_argument, 0, 'c'},
                                             {"heads", required_argument, 0, 'H'},
                                             {"ctx", required_argument, 0, 'n'},
                                             {"vocab", required_argument, 0, 'v'},
                                             {"seed", required_argument, 0, 's'},
                                             {"misaligned", no_argument, 0, 'm'},
                                             {"mask-buffers", no_argument, 0, 'b'},
                                             {"prefix", required_argument, 0, 'p'},
                                             {"lm-head", no_argument, 0, 'L'},
                                             {"meta", required_argument, 0, 'M'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    /* "format": "pt" as torch's save_file writes; the weights are random. */
    sft_meta meta[TOOL_META_MAX + 2] = {{"format", "pt"}, {WF_META_WEIGHTS, "random"}};
    size_t nmeta = 2;
    optind = 1;
    opterr = 0;
    int c, idx = 0;
    long v;
    while ((c = getopt_long(argc, argv, ":", longopts, &idx)) != -1) {
        switch (c) {
        case 'l':
            if (!parse_long(optarg, 1, 1000, &o.layers)) goto bad_value;
            break;
        case 'c':
            if (!parse_long(optarg, 1, 65536, &o.embd)) goto bad_value;
            break;
        case 'H':
            if (!parse_long(optarg, 1, 65536, &o.heads)) goto bad_value;
            break;
        case 'n':
            if (!parse_long(optarg, 1, 1 << 20, &o.ctx)) goto bad_value;
            break;
        case 'v':
            if (!parse_long(optarg, 1, 1 << 24, &o.vocab)) goto bad_value;
            break;
        case 's':
            if (!parse_long(optarg, 0, INT64_MAX, &v)) goto bad_value;
            o.seed = (uint64_t)v;
            break;
        case 'm': o.misaligned = 1; break;
        case 'b': o.mask_buffers = 1; break;
        case 'L': o.lm_head = 1; break;
        case 'M':
            if (tool_meta_add("synth", optarg, meta, &nmeta) != 0) {
                synth_usage(stderr);
                return 2;
            }
            break;
        case 'p':
            if (strlen(optarg) > 32) goto bad_value;
            o.prefix = optarg;
            break;
        case 'h': synth_usage(stdout); return 0;
        default: goto bad_value;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "gpt2d synth: expected exactly one output path\n");
        synth_usage(stderr);
        return 2;
    }
    if (o.embd % o.heads != 0) {
        fprintf(stderr, "gpt2d synth: --embd %ld is not a multiple of --heads %ld\n", o.embd,
                o.heads);
        return 2;
    }
    const char *out = argv[optind];

    size_t cap = (size_t)o.layers * 13 + 5;
    synth_spec *specs = calloc(cap, sizeof *specs);
    sft_tensor *tensors = calloc(cap, sizeof *tensors);
    float **bufs = calloc(cap, sizeof *bufs);
    int rc = 1;
    if (specs == NULL || tensors == NULL || bufs == NULL) {
        fprintf(stderr, "gpt2d synth: out of memory\n");
        goto done;
    }
    size_t n = build_specs(specs, &o);
    float *mask = NULL; /* one buffer shared by every layer's mask entry */
    for (size_t i = 0; i < n; i++) {
        size_t count = 1;
        for (size_t d = 0; d < specs[i].ndim; d++) count *= (size_t)specs[i].shape[d];
        float *buf;
        if (specs[i].kind == INIT_MASK && mask != NULL) {
            buf = mask;
        } else {
            buf = malloc(count * sizeof *buf);
            if (buf == NULL) {
                fprintf(stderr, "gpt2d synth: out of memory for %s\n", specs[i].name);
                goto done;
            }
            bufs[i] = buf;
            fill(buf, count, &specs[i], o.seed, strlen(o.prefix));
            if (specs[i].kind == INIT_MASK) mask = buf;
        }
        tensors[i] = (sft_tensor){.name = specs[i].name,
                                  .dtype = SFT_F32,
                                  .ndim = specs[i].ndim,
                                  .shape = specs[i].shape,
                                  .data = buf};
    }
    if (o.lm_head) {
        synth_spec *s = &specs[n];
        snprintf(s->name, sizeof s->name, "lm_head.weight");
        s->ndim = 2;
        s->shape[0] = o.vocab;
        s->shape[1] = o.embd;
        tensors[n] = (sft_tensor){.name = s->name,
                                  .dtype = SFT_F32,
                                  .ndim = 2,
                                  .shape = s->shape,
                                  .data = tensors[0].data};
        n++;
    }

    sft_save_opts so = {.data_misalign = o.misaligned ? 3u : 0u};
    char err[512];
    if (sft_save(out, tensors, n, meta, nmeta, &so, err, sizeof err) != SFT_OK) {
        fprintf(stderr, "gpt2d synth: %s\n", err);
        goto done;
    }
    if (write_config(out, &o) != 0) {
        fprintf(stderr, "gpt2d synth: cannot write config.json beside %s: %s\n", out,
                strerror(errno));
        goto done;
    }
    rc = 0;
done:
    if (bufs != NULL)
        for (size_t i = 0; i < cap; i++) free(bufs[i]);
    free(bufs);
    free(tensors);
    free(specs);
    return rc;

bad_value:
    tool_option_error("synth", c, argv, optind, longopts, idx);
    synth_usage(stderr);
    return 2;
}
