/* tokenizer/internal.h: shared by the tokenizer's files; never included
 * from outside tokenizer/. */
#ifndef GPT2D_TOKENIZER_INTERNAL_H
#define GPT2D_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/*
 * Decodes the code point at p[0..n) (n >= 1). Returns its length in bytes and
 * stores it in *cp; an invalid or truncated sequence (overlong, surrogate,
 * above U+10FFFF) returns 1 and stores UTF8_INVALID.
 */
#define UTF8_INVALID 0xFFFFFFFFu
size_t utf8_decode_one(const unsigned char *p, size_t n, uint32_t *cp);

#endif
