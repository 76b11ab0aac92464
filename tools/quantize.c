/*
 * tools/quantize.c: the q8 weight format's writer and reader for tools
 * (see quantize.h and formats/include/wformat.h for the format).
 *
 * Rounding: scale = max |w| / 127 in F32 (one division, rounded to nearest
 * even), q = nearbyintf(w / scale) in the default rounding mode (nearest,
 * ties to even), clamped to -127..127 (|w| / scale can round a hair above
 * 127). -128 is never written, so the range is symmetric.
 */
#include "quantize.h"

#include "errbuf.h"
#include "wformat.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_float(sft_dtype d)
{
    return d == SFT_F32 || d == SFT_F16 || d == SFT_BF16 || d == SFT_F64;
}

static int quantizes(const sft_tensor *t)
{
    return t->ndim == 2 && is_float(t->dtype) && strstr(t->name, "wpe.weight") == NULL;
}

/* One block of n weights, stride apart, into q (same stride) and *scale. */
static int quantize_block(const float *w, int8_t *q, size_t n, size_t stride, float *scale)
{
    float amax = 0;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(w[i * stride]);
        if (!isfinite(a)) return -1;
        if (a > amax) amax = a;
    }
    float s = amax / 127.0f;
    *scale = s;
    for (size_t i = 0; i < n; i++) {
        float v = s > 0 ? nearbyintf(w[i * stride] / s) : 0.0f;
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        q[i * stride] = (int8_t)v;
    }
    return 0;
}

uint16_t tool_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7F800000u) == 0x7F800000u && (x & 0x7FFFFFu) != 0)
        return (uint16_t)((x >> 16) | 0x40u); /* NaN: quiet, sign kept */
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* t's elements widened to F32 in a buffer owned by s, or NULL with err. */
static float *widen(tool_set *s, const sft_tensor *t, char *err, size_t errlen)
{
    size_t n = sft_tensor_numel(t);
    float *w = tool_set_alloc(s, n * sizeof *w);
    if (w == NULL) {
        errbuf_set(err, errlen, "out of memory");
        return NULL;
    }
    return sft_tensor_to_f32(t, w, n, err, errlen) == SFT_OK ? w : NULL;
}

int tool_to_float(tool_set *s, sft_dtype to, char *err, size_t errlen)
{
    for (size_t i = 0; i < s->n; i++) {
        sft_tensor *t = &s->t[i];
        if (!is_float(t->dtype) || t->dtype == to) continue;
        size_t n = sft_tensor_numel(t);
        float *wide = widen(s, t, err, errlen);
        if (wide == NULL) return -1;
        if (to != SFT_F32) {
            uint16_t *h = tool_set_alloc(s, n * sizeof *h);
            if (h == NULL) {
                errbuf_set(err, errlen, "out of memory");
                return -1;
            }
            for (size_t k = 0; k < n; k++)
                h[k] = to == SFT_F16 ? sft_f32_to_f16(wide[k]) : tool_f32_to_bf16(wide[k]);
            t->data = h;
        } else {
            t->data = wide;
        }
        t->dtype = to;
        t->nbytes = n * sft_dtype_size(to);
    }
    return 0;
}

int tool_quantize_q8(tool_set *s, char *err, size_t errlen)
{
    size_t n = s->n;
    for (size_t i = 0; i < n; i++) {
        sft_tensor src = s->t[i]; /* a copy: tool_set_push may move s->t */
        if (!quantizes(&src)) continue;
        size_t R = (size_t)src.shape[0], Cc = (size_t)src.shape[1], cnt = R * Cc;
        int64_t *ss = tool_set_alloc(s, 2 * sizeof *ss);
        if (ss == NULL) {
            errbuf_set(err, errlen, "out of memory");
            return -1;
        }
        if (wf_q8_scale_shape(src.name, src.shape[0], src.shape[1], ss) != 0) {
            errbuf_set(err, errlen, "%s: width %zu is not a multiple of %d", src.name, Cc,
                       WF_Q8_BLOCK);
            return -1;
        }
        size_t nsc = (size_t)(ss[0] * ss[1]), nlen = strlen(src.name) + sizeof WF_Q8_SCALE_SUFFIX;
        float *sc = tool_set_alloc(s, nsc * sizeof *sc);
        int8_t *q = tool_set_alloc(s, cnt);
        char *name = tool_set_alloc(s, nlen);
        if (sc == NULL || q == NULL || name == NULL) {
            errbuf_set(err, errlen, "out of memory");
            return -1;
        }
        const float *wide = widen(s, &src, err, errlen);
        if (wide == NULL) return -1;
        int bad = 0;
        if (wf_q8_along_columns(src.name)) {
            for (size_t r = 0; r < R && !bad; r++)
                for (size_t c0 = 0; c0 < Cc && !bad; c0 += WF_Q8_BLOCK)
                    bad = quantize_block(wide + r * Cc + c0, q + r * Cc + c0, WF_Q8_BLOCK, 1,
                                         &sc[r * (Cc / WF_Q8_BLOCK) + c0 / WF_Q8_BLOCK]);
        } else {
            for (size_t r0 = 0; r0 < R && !bad; r0 += WF_Q8_BLOCK)
                for (size_t c = 0; c < Cc && !bad; c++)
                    bad = quantize_block(wide + r0 * Cc + c, q + r0 * Cc + c,
                                         R - r0 < WF_Q8_BLOCK ? R - r0 : WF_Q8_BLOCK, Cc,
                                         &sc[(r0 / WF_Q8_BLOCK) * Cc + c]);
        }
        if (bad) {
            errbuf_set(err, errlen, "%s: a weight is not finite; q8 cannot store it", src.name);
            return -1;
        }
        snprintf(name, nlen, "%s%s", src.name, WF_Q8_SCALE_SUFFIX);
        s->t[i].dtype = SFT_I8;
        s->t[i].data = q;
        s->t[i].nbytes = cnt;
        sft_tensor st = {.name = name,
                         .dtype = SFT_F32,
                         .ndim = 2,
                         .shape = ss,
                         .data = sc,
                         .nbytes = nsc * sizeof *sc};
        if (tool_set_push(s, &st) != 0) {
            errbuf_set(err, errlen, "out of memory");
            return -1;
        }
    }
    return 0;
}

static int is_scale_name(const char *name)
{
    size_t len = strlen(name), sl = strlen(WF_Q8_SCALE_SUFFIX);
    return len > sl && strcmp(name + len - sl, WF_Q8_SCALE_SUFFIX) == 0;
}

int tool_dequantize_q8(tool_set *s, char *err, size_t errlen)
{
    for (size_t i = 0; i < s->n; i++) {
        sft_tensor *t = &s->t[i];
        if (t->dtype != SFT_I8 || t->ndim != 2) continue;
        char sname[512];
        snprintf(sname, sizeof sname, "%s%s", t->name, WF_Q8_SCALE_SUFFIX);
        const sft_tensor *st = tool_set_find(s, sname); /* checked by wf_detect */
        size_t R = (size_t)t->shape[0], Cc = (size_t)t->shape[1];
        float *w = tool_set_alloc(s, R * Cc * sizeof *w);
        if (st == NULL || w == NULL) {
            errbuf_set(err, errlen, "%s: %s", t->name, st ? "out of memory" : "no scales");
            return -1;
        }
        const int8_t *q = t->data;
        const float *sc = st->data;
        int cols = wf_q8_along_columns(t->name);
        for (size_t r = 0; r < R; r++)
            for (size_t c = 0; c < Cc; c++) {
                size_t si = cols ? (r * Cc + c) / WF_Q8_BLOCK : (r / WF_Q8_BLOCK) * Cc + c;
                w[r * Cc + c] = (float)q[r * Cc + c] * sc[si];
            }
        t->dtype = SFT_F32;
        t->data = w;
        t->nbytes = R * Cc * sizeof *w;
    }
    size_t k = 0; /* drop the scales, keeping the order */
    for (size_t i = 0; i < s->n; i++)
        if (!is_scale_name(s->t[i].name)) s->t[k++] = s->t[i];
    s->n = k;
    return 0;
}
