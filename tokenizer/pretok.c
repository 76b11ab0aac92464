/*
 * tokenizer/pretok.c: the GPT-2 pretokenizer, written by hand.
 *
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *
 * At each position the alternatives are tried in order, as the regex engine
 * does (leftmost-first):
 *   1. a lowercase ASCII contraction after an apostrophe;
 *   2-4. an optional single ASCII space, then a maximal run of one class:
 *      letters, numbers, or "other" (neither white space, letter nor number);
 *   5. a white-space run not followed by a non-space: the whole run at the
 *      end of the text, otherwise the run minus its last character (which
 *      then starts the next piece, e.g. " world");
 *   6. what 5 cannot take: a single white-space character before text.
 * Bytes that are not valid UTF-8 are "other" characters one byte long, so a
 * piece always ends on the original bytes and nothing is replaced.
 */
#include "internal.h"
#include "tokenizer.h"
#include "unicode_classes.h"

enum { C_OTHER = 0, C_LETTER = 1, C_NUMBER = 2, C_SPACE = 3 };

int bpe_char_class(uint32_t cp)
{
    if (cp > 0x10FFFF) return C_OTHER;
    return ucls_stage2[ucls_stage1[cp >> 8]][cp & 0xFF];
}

/* Class and length of the character at p[0..n), n >= 1. */
static int class_at(const unsigned char *p, size_t n, size_t *len)
{
    if (p[0] < 0x80) {
        *len = 1;
        return ucls_stage2[ucls_stage1[0]][p[0]];
    }
    uint32_t cp;
    *len = utf8_decode_one(p, n, &cp);
    return cp == UTF8_INVALID ? C_OTHER : bpe_char_class(cp);
}

/* End of the maximal run of class cls starting at i. */
static size_t run_end(const unsigned char *p, size_t n, size_t i, int cls)
{
    while (i < n) {
        size_t len;
        if (class_at(p + i, n - i, &len) != cls) break;
        i += len;
    }
    return i;
}

static int is_lower_ascii(unsigned char c, char want)
{
    return c == (unsigned char)want;
}

size_t bpe_split_next(const char *text, size_t n, size_t pos)
{
    const unsigned char *p = (const unsigned char *)text;
    size_t len0;
    int c0 = class_at(p + pos, n - pos, &len0);

    /* 1. Contractions: 's 't 'm 'd, then 're 've 'll (lowercase only). */
    if (p[pos] == '\'' && pos + 1 < n) {
        unsigned char a = p[pos + 1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
        if (pos + 2 < n) {
            unsigned char b = p[pos + 2];
            if ((a == 'r' && is_lower_ascii(b, 'e')) || (a == 'v' && is_lower_ascii(b, 'e'))
                || (a == 'l' && is_lower_ascii(b, 'l')))
                return pos + 3;
        }
    }

    /* 2-4. " ?" then a run of letters, numbers or others. */
    if (p[pos] == ' ' && pos + 1 < n) {
        size_t len1;
        int c1 = class_at(p + pos + 1, n - pos - 1, &len1);
        if (c1 != C_SPACE) return run_end(p, n, pos + 1 + len1, c1);
    }
    if (c0 != C_SPACE) return run_end(p, n, pos + len0, c0);

    /* 5-6. White space: the run, minus its last character before text. */
    size_t last = pos, i = pos;
    while (i < n) {
        size_t len;
        if (class_at(p + i, n - i, &len) != C_SPACE) break;
        last = i;
        i += len;
    }
    if (i == n) return n;        /* 5: the run ends the text            */
    if (last > pos) return last; /* 5: give back the last character    */
    return i;                    /* 6: a single character before text  */
}
