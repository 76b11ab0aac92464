/*
 * tools/convert.c: `gpt2d convert IN OUT [--dtype f32|f16|bf16|q8]
 * [--layout hf|panel64]`, an aligned copy of a safetensors file, optionally
 * in another weight format or layout.
 *
 * Alignment: the published GPT-2 file starts its data at byte 14,291, so
 * every F32 tensor in it is misaligned and must be copied at every start;
 * the copy written here pads its header to 8 bytes, so later starts map it
 * without copying and every process shares one copy of the weights in the
 * page cache. The write is atomic (formats/ sft_save).
 *
 * Metadata: IN's is kept, the checkpoint's own words among it
 * (gpt2d.model_name, gpt2d.owned_by, gpt2d.description, gpt2d.weights);
 * --meta KEY=VALUE adds or replaces an entry; the format and layout keys
 * are OUT's, written here.
 *
 * Formats (formats/include/wformat.h). Without --dtype, tensors and dtypes
 * are kept as they are. With it, every floating-point
 * tensor (F32, F16, BF16, F64) is first widened exactly to F32, then: f32   kept; f16   rounded to
 * nearest, ties to even (sft_f32_to_f16; out of range becomes infinity, as IEEE conversion does);
 *   bf16  rounded to nearest, ties to even on the upper 16 bits (NaN stays
 *         a quiet NaN);
 *   q8    see quantize.c: every weight matrix (2-D, but wpe) becomes I8 with
 *         F32 scales per 32 elements along its reduction dimension; vectors
 *         and wpe stay F32.
 * Integer and BOOL tensors are kept. A q8 file converts back to float by
 * its dequantized values (q * scale, the F32 product the engine computes),
 * so `convert --dtype f32` of a q8 file gives exactly its logits.
 *
 * Layouts (formats/include/wformat.h, "gpt2d.layout"): --layout hf|panel64,
 * default IN's. panel64 is gpt2d's serving layout (each projection matrix
 * stored in panels of 64 columns, so decode streams contiguous memory);
 * hf keeps the file loadable by Hugging Face. The steps: IN's projections
 * (and q8 scales) are un-panelled into hf buffers, the dtype conversion
 * runs on hf tensors, and OUT's are panelled when OUT is panel64, so any
 * layout and dtype go to any other, and hf -> panel64 -> hf gives back
 * the same bytes. pairs64 (BF16 only) stores the projections as the
 * avx512-bf16 kernels read them, so that those read them from the shared
 * mapping; its steps are the same (un-paired, converted, paired).
 */
#include "tools.h"

#include "engine.h"
#include "meta.h"
#include "quantize.h"
#include "safetensors.h"
#include "wformat.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void convert_usage(FILE *out)
{
    fprintf(out, "usage: gpt2d convert IN OUT [--dtype f32|f16|bf16|q8]\n"
                 "                     [--layout hf|panel64|pairs64] [--meta KEY=VALUE]...\n"
                 "Writes an aligned copy of the safetensors file IN to OUT (atomically), so\n"
                 "that it can be memory-mapped and shared without copies.\n"
                 "  --dtype D    the weight format of OUT (default: IN's); f16 and bf16 round\n"
                 "               to nearest even, q8 stores int8 with a scale per 32 weights\n"
                 "               along the reduction dimension (docs/api.md)\n"
                 "  --layout L   the layout of OUT (default: IN's): panel64 is gpt2d's serving\n"
                 "               layout (projection matrices in panels of 64 columns: faster\n"
                 "               decode); hf keeps the file loadable by Hugging Face;\n"
                 "               pairs64 (bf16 only) stores them as the avx512-bf16 kernels\n"
                 "               read them: no private copy of the projections there\n"
                 "  --meta K=V   a __metadata__ entry of OUT (again: more), beside IN's:\n"
                 "               gpt2d.model_name, gpt2d.owned_by, gpt2d.description and\n"
                 "               gpt2d.weights (random|trained) are what a server reports\n"
                 "               about the model (docs/api.md)\n");
}

/* A wf_layout value's name. */
static const char *layout_name(int layout)
{
    return layout == WF_PAIRS ? WF_LAYOUT_PAIRS : layout == WF_PANELS ? WF_LAYOUT_PANEL : "hf";
}

/* Whether key is one of the format keys convert writes for OUT. */
static int format_key(const char *key)
{
    return strcmp(key, WF_META_FORMAT) == 0 || strcmp(key, WF_META_Q8_BLOCK) == 0
           || strcmp(key, WF_META_LAYOUT) == 0;
}

/* OUT's metadata: IN's, less the format keys, with the --meta entries
 * (extra[0..nextra)) over it, plus q8's when OUT is q8 and the layout's
 * when OUT is panel64. NULL when out of memory. */
static sft_meta *out_metadata(const sft_file *f, const sft_meta *extra, size_t nextra, int q8,
                              int panel, size_t *nom)
{
    size_t nmeta;
    const sft_meta *meta = sft_metadata(f, &nmeta);
    sft_meta *om = calloc(nmeta + nextra + 3, sizeof *om);
    if (om == NULL) return NULL;
    *nom = 0;
    for (size_t i = 0; i < nmeta; i++)
        if (!format_key(meta[i].key)) om[(*nom)++] = meta[i];
    for (size_t i = 0; i < nextra; i++) tool_meta_set(om, nom, extra[i].key, extra[i].value);
    if (q8) {
        om[(*nom)++] = (sft_meta){WF_META_FORMAT, "q8"};
        om[(*nom)++] = (sft_meta){WF_META_Q8_BLOCK, "32"};
    }
    if (panel) om[(*nom)++] = (sft_meta){WF_META_LAYOUT, layout_name(panel)};
    return om;
}

int tool_convert(int argc, char **argv)
{
    static const struct option longopts[] = {{"dtype", required_argument, 0, 'd'},
                                             {"layout", required_argument, 0, 'l'},
                                             {"meta", required_argument, 0, 'M'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    sft_meta extra[TOOL_META_MAX];
    size_t nextra = 0;
    const char *dtype = NULL, *layout = NULL;
    int c, idx = 0;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":", longopts, &idx)) != -1) {
        switch (c) {
        case 'd': dtype = optarg; break;
        case 'l': layout = optarg; break;
        case 'M':
            if (tool_meta_add("convert", optarg, extra, &nextra) != 0) {
                convert_usage(stderr);
                return 2;
            }
            break;
        case 'h': convert_usage(stdout); return 0;
        default:
            tool_option_error("convert", c, argv, optind, longopts, idx);
            convert_usage(stderr);
            return 2;
        }
    }
    if (argc - optind != 2) {
        fprintf(stderr, "gpt2d convert: expected IN and OUT\n");
        convert_usage(stderr);
        return 2;
    }
    sft_dtype to = SFT_F32;
    int q8 = 0;
    if (dtype != NULL) {
        if (strcmp(dtype, "f16") == 0)
            to = SFT_F16;
        else if (strcmp(dtype, "bf16") == 0)
            to = SFT_BF16;
        else if (strcmp(dtype, "q8") == 0)
            q8 = 1;
        else if (strcmp(dtype, "f32") != 0) {
            fprintf(stderr, "gpt2d convert: --dtype must be f32, f16, bf16 or q8, not '%s'\n",
                    dtype);
            return 2;
        }
    }
    if (layout != NULL && strcmp(layout, "hf") != 0 && strcmp(layout, WF_LAYOUT_PANEL) != 0
        && strcmp(layout, WF_LAYOUT_PAIRS) != 0) {
        fprintf(stderr, "gpt2d convert: --layout must be hf, %s or %s, not '%s'\n", WF_LAYOUT_PANEL,
                WF_LAYOUT_PAIRS, layout);
        return 2;
    }
    const char *in = argv[optind], *out = argv[optind + 1];
    char err[512];
    sft_file *f;
    if (sft_open(in, SFT_LOAD_MMAP, &f, err, sizeof err) != SFT_OK) {
        fprintf(stderr, "gpt2d convert: %s\n", err);
        return 1;
    }
    const char *from;
    int in_panel = 0;
    if (wf_detect(f, &from, err, sizeof err) != SFT_OK
        || wf_layout(f, &in_panel, err, sizeof err) != SFT_OK) {
        fprintf(stderr, "gpt2d convert: %s\n", err);
        sft_close(f);
        return 1;
    }
    int out_panel = layout == NULL                         ? in_panel
                    : strcmp(layout, WF_LAYOUT_PANEL) == 0 ? WF_PANELS
                    : strcmp(layout, WF_LAYOUT_PAIRS) == 0 ? WF_PAIRS
                                                           : WF_HF;
    int from_q8 = strcmp(from, "q8") == 0;
    tool_set set;
    int rc = 1;
    if (tool_set_init(&set, f, err, sizeof err) != 0) goto fail;
    /* IN's layout to hf, the dtype conversion, hf to OUT's layout. */
    if (in_panel == WF_PANELS && tool_unpanel(&set, err, sizeof err) != 0) goto fail;
    if (in_panel == WF_PAIRS && tool_unpair(&set, err, sizeof err) != 0) goto fail;
    if (q8 && !from_q8) {
        if (tool_quantize_q8(&set, err, sizeof err) != 0) goto fail;
    } else if (from_q8 && dtype != NULL && !q8) {
        /* Back to float: the dequantized values, then the float format. */
        if (tool_dequantize_q8(&set, err, sizeof err) != 0
            || tool_to_float(&set, to, err, sizeof err) != 0)
            goto fail;
    } else if (dtype != NULL && !q8) {
        if (tool_to_float(&set, to, err, sizeof err) != 0) goto fail;
    }
    if (out_panel == WF_PANELS && tool_panel(&set, err, sizeof err) != 0) goto fail;
    if (out_panel == WF_PAIRS && tool_pair(&set, err, sizeof err) != 0) goto fail;
    size_t nom;
    sft_meta *om =
        out_metadata(f, extra, nextra, q8 || (from_q8 && dtype == NULL), out_panel, &nom);
    if (om == NULL) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    /* pairs64: the data at a multiple of 64 bytes, so that the kernels'
     * aligned loads can read the projections from the mapping (each is a
     * multiple of 256 bytes; a tensor before one that is not leaves it
     * misaligned, and the server then copies it: engine/model.c). */
    sft_save_opts so = {.data_align = out_panel == WF_PAIRS ? 64u : 0u};
    sft_status ss = sft_save(out, set.t, set.n, om, nom, &so, err, sizeof err);
    free(om);
    if (ss != SFT_OK) goto fail;
    /* Plain words for what alignment buys: the server maps an aligned file
     * and reads its weights in place; a misaligned one is copied at load.
     * On a CPU with matrix units, BF16 and q8 files are also served from a
     * copy of their projections (and BF16's LM head) made at every start, in
     * the order those kernels read (engine/op_matmul_bf16.c, op_matmul_q8.c). */
    const char *kernels = eng_kernels_for(dtype ? dtype : from);
    int copy = strcmp(kernels, "avx512-bf16") == 0 || strcmp(kernels, "avx512-vnni") == 0;
    fprintf(stderr, "gpt2d convert: wrote %s (%zu tensors, weights %s -> %s, layout %s -> %s); ",
            out, set.n, from, dtype ? dtype : from, layout_name(in_panel), layout_name(out_panel));
    if (copy && out_panel == WF_PAIRS)
        fprintf(stderr,
                "gpt2d serve maps it in place, and on this CPU its %s kernels read the "
                "projections from the mapping and a private copy of the LM head, built at "
                "every start",
                kernels);
    else if (out_panel == WF_PAIRS)
        fprintf(stderr,
                "on this CPU (kernels %s, not avx512-bf16) gpt2d serve reads a private panel "
                "copy of the projections, built at every start (--layout panel64 serves from "
                "the mapping)",
                kernels);
    else if (copy)
        fprintf(stderr,
                "gpt2d serve maps it in place, and on this CPU its %s kernels read a private copy "
                "of the projections%s, built at every start (GPT2D_KERNELS=avx512 serves "
                "without it)",
                kernels, strcmp(kernels, "avx512-bf16") == 0 ? " and the LM head" : "");
    else if (!out_panel && (strcmp(kernels, "avx512") == 0)
             && (strcmp(dtype ? dtype : from, "f32") == 0
                 || strcmp(dtype ? dtype : from, "f16") == 0))
        fprintf(stderr,
                "gpt2d serve maps it in place, and on this CPU its avx512 kernels read a private "
                "panel copy of the projections, built at every start (--layout panel64 serves "
                "as fast without it; GPT2D_PANEL_COPY=off serves the file's pages)");
    else
        fprintf(stderr, "gpt2d serve reads its weights in place, without a copy in memory");
    if (sft_data_start(f) % 8 != 0)
        fprintf(stderr, " (it copies %s's into memory at every start)", in);
    fputc('\n', stderr);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "gpt2d convert: %s\n", err);
done:
    tool_set_free(&set);
    sft_close(f);
    return rc;
}
