/*
 * tools/quantize.c: the q8 weight format's writer and reader for tools
 * (see quantize.h and formats/wformat.h for the format).
 *
 * Rounding: scale = max |w| / 127 in F32 (one division, rounded to nearest
 * even), q = nearbyintf(w / scale) in the default rounding mode (nearest,
 * ties to even), clamped to -127..127 (|w| / scale can round a hair above
 * 127). -128 is never written, so the range is symmetric.
 */
#include "quantize.h"

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

int tool_quantize_q8(const sft_file *f, sft_tensor *t, void **bufs, size_t *nout, char *err,
                     size_t errlen)
{
    size_t n = sft_count(f), k = n;
    int64_t *shapes = calloc(2 * n + 1, sizeof *shapes);
    bufs[2 * n] = shapes;
    if (shapes == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const sft_tensor *src = sft_tensor_at(f, i);
        t[i] = *src;
        if (!quantizes(src)) continue;
        size_t R = (size_t)src->shape[0], Cc = (size_t)src->shape[1], cnt = R * Cc;
        int64_t *ss = shapes + 2 * i;
        if (wf_q8_scale_shape(src->name, src->shape[0], src->shape[1], ss) != 0) {
            snprintf(err, errlen, "%s: width %zu is not a multiple of %d", src->name, Cc,
                     WF_Q8_BLOCK);
            return -1;
        }
        size_t nsc = (size_t)(ss[0] * ss[1]), nlen = strlen(src->name) + sizeof WF_Q8_SCALE_SUFFIX;
        /* The scales and, after them, the scale tensor's name: one block. */
        float *sc = malloc(nsc * sizeof *sc + nlen);
        int8_t *q = malloc(cnt ? cnt : 1);
        float *wide = malloc((cnt ? cnt : 1) * sizeof *wide);
        bufs[i] = q;
        bufs[n + i] = sc;
        if (wide == NULL || q == NULL || sc == NULL) {
            free(wide);
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        if (sft_tensor_to_f32(src, wide, cnt, err, errlen) != SFT_OK) {
            free(wide);
            return -1;
        }
        int bad = 0;
        if (wf_q8_along_columns(src->name)) {
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
        free(wide);
        if (bad) {
            snprintf(err, errlen, "%s: a weight is not finite; q8 cannot store it", src->name);
            return -1;
        }
        char *name = (char *)(sc + nsc);
        snprintf(name, nlen, "%s%s", src->name, WF_Q8_SCALE_SUFFIX);
        t[i].dtype = SFT_I8;
        t[i].data = q;
        t[i].nbytes = cnt;
        t[k++] = (sft_tensor){.name = name,
                              .dtype = SFT_F32,
                              .ndim = 2,
                              .shape = ss,
                              .data = sc,
                              .nbytes = nsc * sizeof *sc};
    }
    *nout = k;
    return 0;
}

int tool_dequantize_q8(const sft_file *f, sft_tensor *t, void **bufs, size_t *nout, char *err,
                       size_t errlen)
{
    size_t n = sft_count(f), k = 0;
    for (size_t i = 0; i < n; i++) {
        const sft_tensor *src = sft_tensor_at(f, i);
        size_t len = strlen(src->name), sl = strlen(WF_Q8_SCALE_SUFFIX);
        if (len > sl && strcmp(src->name + len - sl, WF_Q8_SCALE_SUFFIX) == 0) continue;
        t[k] = *src;
        if (src->dtype == SFT_I8 && src->ndim == 2) {
            char sname[512];
            snprintf(sname, sizeof sname, "%s%s", src->name, WF_Q8_SCALE_SUFFIX);
            const sft_tensor *s = sft_find(f, sname); /* checked by wf_detect */
            size_t R = (size_t)src->shape[0], Cc = (size_t)src->shape[1];
            float *w = malloc((R * Cc > 0 ? R * Cc : 1) * sizeof *w);
            if (s == NULL || w == NULL) {
                free(w);
                snprintf(err, errlen, "%s: %s", src->name, s ? "out of memory" : "no scales");
                return -1;
            }
            bufs[i] = w;
            const int8_t *q = src->data;
            const float *sc = s->data;
            int cols = wf_q8_along_columns(src->name);
            for (size_t r = 0; r < R; r++)
                for (size_t c = 0; c < Cc; c++) {
                    size_t si = cols ? (r * Cc + c) / WF_Q8_BLOCK : (r / WF_Q8_BLOCK) * Cc + c;
                    w[r * Cc + c] = (float)q[r * Cc + c] * sc[si];
                }
            t[k].dtype = SFT_F32;
            t[k].data = w;
            t[k].nbytes = R * Cc * sizeof *w;
        }
        k++;
    }
    *nout = k;
    return 0;
}
