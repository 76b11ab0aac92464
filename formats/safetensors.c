/*
 * formats/safetensors.c: see safetensors.h for the contract. This file holds
 * what reading and writing share: the dtype table, the status messages,
 * error formatting, UTF-8 and shape checks, and the F16/BF16 conversions.
 * Reading is formats/sft_read.c, writing formats/sft_write.c.
 */
#include "errbuf.h"
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_table[SFT_DTYPE_COUNT] = {
    [SFT_F32] = {"F32", 4},   [SFT_F64] = {"F64", 8}, [SFT_I64] = {"I64", 8},
    [SFT_BOOL] = {"BOOL", 1}, [SFT_F16] = {"F16", 2}, [SFT_BF16] = {"BF16", 2},
    [SFT_I32] = {"I32", 4},   [SFT_I16] = {"I16", 2}, [SFT_I8] = {"I8", 1},
    [SFT_U8] = {"U8", 1},
};

const char *sft_dtype_name(sft_dtype d)
{
    return (unsigned)d < SFT_DTYPE_COUNT ? dtype_table[d].name : "?";
}

size_t sft_dtype_size(sft_dtype d)
{
    return (unsigned)d < SFT_DTYPE_COUNT ? dtype_table[d].size : 0;
}

sft_status sft_dtype_parse(const char *name, sft_dtype *out)
{
    for (unsigned i = 0; i < SFT_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_table[i].name) == 0) {
            *out = (sft_dtype)i;
            return SFT_OK;
        }
    }
    return SFT_ETYPE;
}

const char *sft_strerror(sft_status s)
{
    switch (s) {
    case SFT_OK: return "ok";
    case SFT_EIO: return "I/O error";
    case SFT_EFORMAT: return "format error";
    case SFT_ETYPE: return "type error";
    case SFT_ETOOBIG: return "too big";
    case SFT_ENOMEM: return "out of memory";
    case SFT_EINVAL: return "invalid argument";
    }
    return "unknown status";
}

/* Writes "PATH: message" into err and returns s. */
#if defined(__GNUC__)
__attribute__((format(printf, 5, 6)))
#endif
sft_status
sft__fail(char *err, size_t errlen, sft_status s, const char *path, const char *fmt, ...)
{
    va_list ap;
    errbuf_set(err, errlen, "%s: ", path);
    va_start(ap, fmt);
    errbuf_vappend(err, errlen, fmt, ap);
    va_end(ap);
    /* One line, whatever the file holds: control bytes quoted from a
     * header (jansson's "near '...'") or a path become '?'. */
    errbuf_oneline(err, errlen);
    return s;
}

/*
 * Returns the length of the longest valid UTF-8 prefix of p[0..n) (n when
 * all of it is valid). Rejects overlong forms, surrogates and code points
 * above U+10FFFF, as RFC 3629 requires.
 */
size_t sft__utf8_valid_prefix(const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return i;
        }
        if (n - i < len) return i;
        if (p[i + 1] < lo || p[i + 1] > hi) return i;
        for (size_t k = 2; k < len; k++)
            if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
        i += len;
    }
    return n;
}

int sft__utf8_ok(const char *s)
{
    size_t n = strlen(s);
    return sft__utf8_valid_prefix((const unsigned char *)s, n) == n;
}

const char *sft__shape_str(char *buf, size_t len, const int64_t *shape, size_t ndim)
{
    size_t used = 0;
    buf[0] = '\0';
    int k = snprintf(buf, len, "[");
    used = k > 0 ? (size_t)k : 0;
    for (size_t i = 0; i < ndim && used < len; i++) {
        k = snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
        used += k > 0 ? (size_t)k : 0;
    }
    if (used < len) snprintf(buf + used, len - used, "]");
    return buf;
}

/* numel and nbytes of a shape with overflow checks; returns 0 on overflow. */
int sft__shape_bytes(const int64_t *shape, size_t ndim, size_t esize, uint64_t *numel,
                     uint64_t *nbytes)
{
    uint64_t count = 1;
    for (size_t i = 0; i < ndim; i++) {
        if (__builtin_mul_overflow(count, (uint64_t)shape[i], &count)) return 0;
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(count, (uint64_t)esize, &bytes)) return 0;
    if (bytes > SIZE_MAX) return 0;
    *numel = count;
    *nbytes = bytes;
    return 1;
}

size_t sft_tensor_numel(const sft_tensor *t)
{
    size_t esize = sft_dtype_size(t->dtype);
    return esize ? t->nbytes / esize : 0;
}

/* ---- Conversions -------------------------------------------------------- */

float sft_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13); /* inf or NaN (payload kept) */
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        /* subnormal: value = man * 2^-24; normalise into an F32 exponent */
        uint32_t e = 113u;
        while ((man & 0x400u) == 0) {
            man <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((man & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

float sft_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t sft_f32_to_f16(float value)
{
    uint32_t x;
    memcpy(&x, &value, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t exp = (x >> 23) & 0xFFu;
    uint32_t man = x & 0x7FFFFFu;
    if (exp == 0xFF) return (uint16_t)(sign | 0x7C00u | (man ? 0x200u : 0u));
    int e = (int)exp - 127 + 15;
    if (e >= 0x1F) return (uint16_t)(sign | 0x7C00u);
    if (e <= 0) {
        if (e < -10) return sign;
        man |= 0x800000u;
        unsigned shift = (unsigned)(14 - e);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++; /* may carry into inf */
    return (uint16_t)(sign | half);
}

sft_status sft_tensor_to_f32(const sft_tensor *t, float *out, size_t n, char *err, size_t errlen)
{
    size_t numel = sft_tensor_numel(t);
    if (n != numel)
        return sft__fail(err, errlen, SFT_EINVAL, t->name,
                         "asked for %zu elements, the tensor has %zu", n, numel);
    const unsigned char *p = t->data;
    switch (t->dtype) {
    case SFT_F32:
        if (n) memcpy(out, p, n * sizeof *out);
        return SFT_OK;
    case SFT_F16:
    case SFT_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(p[2 * i] | (p[2 * i + 1] << 8));
            out[i] = t->dtype == SFT_F16 ? sft_f16_to_f32(h) : sft_bf16_to_f32(h);
        }
        return SFT_OK;
    case SFT_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, sizeof d);
            out[i] = (float)d;
        }
        return SFT_OK;
    default:
        return sft__fail(err, errlen, SFT_ETYPE, t->name, "cannot convert %s to F32",
                         sft_dtype_name(t->dtype));
    }
}
