/*
 * formats/internal.h: what the safetensors reader (sft_read.c), writer
 * (sft_write.c) and the shared part (safetensors.c: dtypes, messages,
 * shapes, conversions) use of each other. Never included outside formats/.
 */
#ifndef GPT2D_FORMATS_INTERNAL_H
#define GPT2D_FORMATS_INTERNAL_H

#include "safetensors.h"

#include <stddef.h>
#include <stdint.h>

/* The reserved header key of the format's metadata map. */
#define SFT__METADATA_KEY "__metadata__"

/* Writes "PATH: message" into err (one line: control bytes become '?') and
 * returns s. */
#if defined(__GNUC__)
__attribute__((format(printf, 5, 6)))
#endif
sft_status
sft__fail(char *err, size_t errlen, sft_status s, const char *path, const char *fmt, ...);

/* The length of the longest valid UTF-8 prefix of p[0..n) (RFC 3629: no
 * overlong forms, surrogates or code points above U+10FFFF). */
size_t sft__utf8_valid_prefix(const unsigned char *p, size_t n);

/* 1 when the NUL-terminated s is valid UTF-8. */
int sft__utf8_ok(const char *s);

/* Writes "[d0, d1, ...]" into buf for messages (truncated if long). */
const char *sft__shape_str(char *buf, size_t len, const int64_t *shape, size_t ndim);

/* numel and nbytes of a shape with overflow checks; returns 0 on overflow. */
int sft__shape_bytes(const int64_t *shape, size_t ndim, size_t esize, uint64_t *numel,
                     uint64_t *nbytes);

#endif
