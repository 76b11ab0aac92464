/*
 * formats/wformat.c: naming and checking gpt2d's weight formats (see
 * wformat.h).
 */
#include "wformat.h"

#include "internal.h"

#include <stdio.h>
#include <string.h>

static int ends_with(const char *name, const char *suffix)
{
    size_t n = strlen(name), s = strlen(suffix);
    return n >= s && strcmp(name + n - s, suffix) == 0;
}

int wf_q8_along_columns(const char *name)
{
    return ends_with(name, "wte.weight");
}

/* ceil(n / WF_Q8_BLOCK) without n + 31, which overflows for the huge
 * dimensions a hostile file may declare beside a zero one. */
static int64_t wf_blocks(int64_t n)
{
    return n / WF_Q8_BLOCK + (n % WF_Q8_BLOCK != 0);
}

/* A projection's name: one of the four suffixes, the whole name or after a
 * dot ("h.0.attn.c_attn.weight", "transformer.h.0..."), never the tail of
 * a longer component ("h.0.crossattn.c_attn.weight" is not one). */
int wf_is_projection(const char *name)
{
    static const char *const suffixes[] = {"attn.c_attn.weight", "attn.c_proj.weight",
                                           "mlp.c_fc.weight", "mlp.c_proj.weight"};
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++)
        if (ends_with(name, suffixes[i])) {
            size_t n = strlen(name), k = strlen(suffixes[i]);
            if (n == k || name[n - k - 1] == '.') return 1;
        }
    return 0;
}

sft_status wf_layout(const sft_file *f, int *panel, char *err, size_t errlen)
{
    *panel = 0;
    const char *v = sft_metadata_get(f, WF_META_LAYOUT);
    if (v == NULL) return SFT_OK;
    if (strcmp(v, WF_LAYOUT_PAIRS) == 0) {
        *panel = WF_PAIRS;
        return SFT_OK;
    }
    if (strcmp(v, WF_LAYOUT_PANEL) != 0)
        return sft__fail(err, errlen, SFT_EFORMAT, sft_path(f),
                         "metadata %s is \"%s\"; expected \"%s\" or \"%s\" (or no key: the hf "
                         "layout)",
                         WF_META_LAYOUT, v, WF_LAYOUT_PANEL, WF_LAYOUT_PAIRS);
    *panel = WF_PANELS;
    return SFT_OK;
}

/* A name's rule (gpt2d.model_name, gpt2d.owned_by): 1 to WF_NAME_MAX - 1
 * printable ASCII characters without spaces. */
static int name_ok(const char *v)
{
    size_t n = strlen(v);
    if (n == 0 || n >= WF_NAME_MAX) return 0;
    for (const char *p = v; *p; p++)
        if (*p <= ' ' || *p > '~') return 0;
    return 1;
}

/* A description's rule: 1 to WF_DESCRIPTION_MAX - 1 bytes of UTF-8 without
 * control characters (one line, safe in a log line and a page). */
static int description_ok(const char *v)
{
    size_t n = strlen(v);
    if (n == 0 || n >= WF_DESCRIPTION_MAX || !sft__utf8_ok(v)) return 0;
    for (const char *p = v; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) return 0;
    return 1;
}

int wf_meta_ok(const char *key, const char *value, char *err, size_t errlen)
{
    const char *rule = NULL;
    if (strcmp(key, WF_META_NAME) == 0 || strcmp(key, WF_META_OWNED_BY) == 0) {
        if (!name_ok(value)) rule = "1 to 127 printable ASCII characters without spaces";
    } else if (strcmp(key, WF_META_DESCRIPTION) == 0) {
        if (!description_ok(value))
            rule = "one line of 1 to 1023 bytes of UTF-8 without control characters";
    } else if (strcmp(key, WF_META_WEIGHTS) == 0) {
        if (strcmp(value, "random") != 0 && strcmp(value, "trained") != 0)
            rule = "\"random\" or \"trained\"";
    } else if (strncmp(key, "gpt2d.", 6) == 0) {
        rule = strcmp(key, WF_META_FORMAT) == 0 || strcmp(key, WF_META_Q8_BLOCK) == 0
                       || strcmp(key, WF_META_LAYOUT) == 0
                   ? "written by gpt2d convert itself (--dtype, --layout)"
                   : "not a key gpt2d knows (" WF_META_NAME ", " WF_META_OWNED_BY
                     ", " WF_META_DESCRIPTION ", " WF_META_WEIGHTS ")";
    }
    if (rule == NULL) return 1;
    if (err != NULL && errlen > 0) snprintf(err, errlen, "%s: %s", key, rule);
    return 0;
}

sft_status wf_about_get(const sft_file *f, wf_about *out, char *err, size_t errlen)
{
    static const char *const keys[] = {WF_META_NAME, WF_META_OWNED_BY, WF_META_DESCRIPTION,
                                       WF_META_WEIGHTS};
    const char *v[4];
    for (size_t i = 0; i < 4; i++) {
        v[i] = sft_metadata_get(f, keys[i]);
        char why[256];
        if (v[i] != NULL && !wf_meta_ok(keys[i], v[i], why, sizeof why))
            return sft__fail(err, errlen, SFT_EFORMAT, sft_path(f), "metadata %s must be %s",
                             keys[i], why + strlen(keys[i]) + 2);
    }
    *out = (wf_about){.name = v[0],
                      .owned_by = v[1],
                      .description = v[2],
                      .weights = v[3] == NULL                  ? "unknown"
                                 : strcmp(v[3], "random") == 0 ? "random"
                                                               : "trained"};
    return SFT_OK;
}

int wf_q8_scale_shape(const char *name, int64_t rows, int64_t cols, int64_t out[2])
{
    if (wf_q8_along_columns(name)) {
        if (cols % WF_Q8_BLOCK != 0) return -1;
        out[0] = rows;
        out[1] = cols / WF_Q8_BLOCK;
    } else {
        out[0] = wf_blocks(rows);
        out[1] = cols;
    }
    return 0;
}

static int is_scale_name(const char *name)
{
    return strlen(name) > strlen(WF_Q8_SCALE_SUFFIX) && ends_with(name, WF_Q8_SCALE_SUFFIX);
}

/* 1 for the q8 scale tensor of a projection ("<projection>.q8_scale"). */
static int is_projection_scale(const char *name)
{
    if (!is_scale_name(name)) return 0;
    char base[512];
    size_t len = strlen(name) - strlen(WF_Q8_SCALE_SUFFIX);
    if (len >= sizeof base) return 0;
    memcpy(base, name, len);
    base[len] = '\0';
    return wf_is_projection(base);
}

/* A weight matrix: 2-D, or a projection stored in panels (3-D; only a
 * panel64 file has them once check_layout passed). */
static int is_matrix(const sft_tensor *t)
{
    return t->ndim == 2 || ((t->ndim == 3 || t->ndim == 4) && wf_is_projection(t->name));
}

/* pairs64's rules (check_layout). */
static sft_status check_pairs(const sft_file *f, const sft_tensor *t, int proj, char *err,
                              size_t errlen)
{
    const char *path = sft_path(f);
    /* A 4-D tensor that is not a projection is the attention mask buffer
     * of Hugging Face's files (h.N.attn.bias), which is kept and ignored. */
    if (!proj && t->ndim == 3)
        return sft__fail(err, errlen, SFT_EFORMAT, path,
                         "%s file: 3-D tensor '%s' is not a projection", WF_LAYOUT_PAIRS, t->name);
    if (!proj) return SFT_OK;
    if (!wf_is_projection(t->name))
        return sft__fail(err, errlen, SFT_EFORMAT, path,
                         "%s file: q8 scale '%s' (the layout holds BF16 projections only)",
                         WF_LAYOUT_PAIRS, t->name);
    if (t->ndim != 4 || t->dtype != SFT_BF16 || t->shape[2] != WF_PANEL || t->shape[3] != 2)
        return sft__fail(err, errlen, SFT_EFORMAT, path,
                         "%s file: projection '%s' is %s %zu-D, expected BF16 [N/%d, K/2, %d, 2]",
                         WF_LAYOUT_PAIRS, t->name, sft_dtype_name(t->dtype), t->ndim, WF_PANEL,
                         WF_PANEL);
    return SFT_OK;
}

/* The layout rules of wformat.h: projections (and their scales) 3-D with a
 * last dimension of WF_PANEL in a panel64 file, and only they; no 3-D
 * projection in an hf file. */
static sft_status check_layout(const sft_file *f, int panel, char *err, size_t errlen)
{
    const char *path = sft_path(f);
    for (size_t i = 0; i < sft_count(f); i++) {
        const sft_tensor *t = sft_tensor_at(f, i);
        int proj = wf_is_projection(t->name) || is_projection_scale(t->name);
        if (panel == WF_PAIRS) {
            sft_status s = check_pairs(f, t, proj, err, errlen);
            if (s != SFT_OK) return s;
            continue;
        }
        if (!panel) {
            if (proj && (t->ndim == 3 || t->ndim == 4))
                return sft__fail(err, errlen, SFT_EFORMAT, path,
                                 "%zu-D projection '%s' in a file without %s \"%s\" or \"%s\" "
                                 "metadata",
                                 t->ndim, t->name, WF_META_LAYOUT, WF_LAYOUT_PANEL,
                                 WF_LAYOUT_PAIRS);
            continue;
        }
        if (proj && t->ndim != 3)
            return sft__fail(err, errlen, SFT_EFORMAT, path,
                             "%s file: projection '%s' is %zu-D, expected 3-D [N/%d, K, %d]",
                             WF_LAYOUT_PANEL, t->name, t->ndim, WF_PANEL, WF_PANEL);
        if (proj && t->shape[2] != WF_PANEL)
            return sft__fail(err, errlen, SFT_EFORMAT, path,
                             "%s file: projection '%s' has last dimension %lld, expected %d",
                             WF_LAYOUT_PANEL, t->name, (long long)t->shape[2], WF_PANEL);
        if (!proj && t->ndim == 3)
            return sft__fail(err, errlen, SFT_EFORMAT, path,
                             "%s file: 3-D tensor '%s' is not a projection", WF_LAYOUT_PANEL,
                             t->name);
    }
    return SFT_OK;
}

static int is_float(sft_dtype d)
{
    return d == SFT_F32 || d == SFT_F16 || d == SFT_BF16;
}

/* The q8 checks: every I8 matrix has its scale tensor, every scale tensor
 * its I8 matrix, and no float matrix is left. */
static sft_status check_q8(const sft_file *f, char *err, size_t errlen)
{
    const char *path = sft_path(f), *block = sft_metadata_get(f, WF_META_Q8_BLOCK);
    char want_block[16];
    snprintf(want_block, sizeof want_block, "%d", WF_Q8_BLOCK);
    if (block == NULL || strcmp(block, want_block) != 0)
        return sft__fail(err, errlen, SFT_EFORMAT, path,
                         "q8 file: metadata %s is %s%s%s; expected \"%d\"", WF_META_Q8_BLOCK,
                         block ? "\"" : "missing", block ? block : "", block ? "\"" : "",
                         WF_Q8_BLOCK);
    size_t nq = 0;
    for (size_t i = 0; i < sft_count(f); i++) {
        const sft_tensor *t = sft_tensor_at(f, i);
        if (is_scale_name(t->name)) {
            char base[512];
            size_t len = strlen(t->name) - strlen(WF_Q8_SCALE_SUFFIX);
            if (len >= sizeof base)
                return sft__fail(err, errlen, SFT_EFORMAT, path, "q8 scale '%s': name too long",
                                 t->name);
            memcpy(base, t->name, len);
            base[len] = '\0';
            const sft_tensor *q = sft_find(f, base);
            if (q == NULL || q->dtype != SFT_I8)
                return sft__fail(err, errlen, SFT_EFORMAT, path,
                                 "q8 scale '%s' has no I8 tensor '%s'", t->name, base);
            continue;
        }
        if (!is_matrix(t)) {
            if (t->dtype == SFT_I8)
                return sft__fail(err, errlen, SFT_EFORMAT, path,
                                 "q8 file: I8 tensor '%s' is not a matrix", t->name);
            continue;
        }
        if (is_float(t->dtype) && strstr(t->name, "wpe.weight") == NULL)
            return sft__fail(err, errlen, SFT_EFORMAT, path,
                             "q8 file: matrix '%s' is %s, expected I8", t->name,
                             sft_dtype_name(t->dtype));
        if (t->dtype != SFT_I8) continue;
        char sname[512];
        if ((size_t)snprintf(sname, sizeof sname, "%s%s", t->name, WF_Q8_SCALE_SUFFIX)
            >= sizeof sname)
            return sft__fail(err, errlen, SFT_EFORMAT, path, "q8 tensor '%s': name too long",
                             t->name);
        /* The scales' shape: [rows, cols] of the logical matrix, or, for a
         * panel [N/64, K, 64], [N/64, ceil(K/32), 64]. */
        int64_t shape[3];
        size_t nd = t->ndim;
        if (nd == 3) {
            shape[0] = t->shape[0];
            shape[1] = wf_blocks(t->shape[1]);
            shape[2] = t->shape[2];
        } else if (wf_q8_scale_shape(t->name, t->shape[0], t->shape[1], shape) != 0)
            return sft__fail(err, errlen, SFT_EFORMAT, path,
                             "q8 tensor '%s': %lld columns are not a multiple of the block %d",
                             t->name, (long long)t->shape[1], WF_Q8_BLOCK);
        const sft_tensor *s = sft_find(f, sname);
        if (s == NULL)
            return sft__fail(err, errlen, SFT_EFORMAT, path,
                             "q8 tensor '%s' has no scale tensor '%s'", t->name, sname);
        int ok = s->dtype == SFT_F32 && s->ndim == nd;
        for (size_t d = 0; ok && d < nd; d++) ok = s->shape[d] == shape[d];
        if (!ok && nd == 3)
            return sft__fail(err, errlen, SFT_EFORMAT, path,
                             "q8 scale '%s' must be F32 [%lld, %lld, %lld]", sname,
                             (long long)shape[0], (long long)shape[1], (long long)shape[2]);
        if (!ok)
            return sft__fail(err, errlen, SFT_EFORMAT, path,
                             "q8 scale '%s' must be F32 [%lld, %lld]", sname, (long long)shape[0],
                             (long long)shape[1]);
        nq++;
    }
    if (nq == 0) return sft__fail(err, errlen, SFT_EFORMAT, path, "q8 file without I8 matrices");
    return SFT_OK;
}

sft_status wf_detect(const sft_file *f, const char **name, char *err, size_t errlen)
{
    *name = "f32";
    int panel;
    sft_status ls = wf_layout(f, &panel, err, errlen);
    if (ls == SFT_OK) ls = check_layout(f, panel, err, errlen);
    if (ls != SFT_OK) return ls;
    const char *meta = sft_metadata_get(f, WF_META_FORMAT);
    if (meta != NULL && strcmp(meta, "q8") == 0) {
        sft_status s = check_q8(f, err, errlen);
        if (s == SFT_OK) *name = "q8";
        return s;
    }
    if (meta != NULL && strcmp(meta, "f32") != 0 && strcmp(meta, "f16") != 0
        && strcmp(meta, "bf16") != 0)
        return sft__fail(err, errlen, SFT_EFORMAT, sft_path(f),
                         "metadata %s is \"%s\"; expected f32, f16, bf16 or q8", WF_META_FORMAT,
                         meta);
    int seen = -1, mixed = 0;
    for (size_t i = 0; i < sft_count(f); i++) {
        const sft_tensor *t = sft_tensor_at(f, i);
        if (t->dtype == SFT_I8 && (is_matrix(t) || is_scale_name(t->name)))
            return sft__fail(err, errlen, SFT_EFORMAT, sft_path(f),
                             "I8 matrix '%s' in a file without %s \"q8\" metadata", t->name,
                             WF_META_FORMAT);
        if (!is_matrix(t) || !is_float(t->dtype)) continue;
        if (seen < 0)
            seen = (int)t->dtype;
        else if (seen != (int)t->dtype)
            mixed = 1;
    }
    if (mixed)
        *name = "mixed";
    else if (seen == SFT_F16)
        *name = "f16";
    else if (seen == SFT_BF16)
        *name = "bf16";
    return SFT_OK;
}
