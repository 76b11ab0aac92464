/*
 * tokenizer/utf8.c: UTF-8 validation, one-code-point decoding, and the
 * streaming decoder for generated tokens.
 *
 * The streaming decoder is a byte-at-a-time state machine over the table of
 * well-formed sequences (Unicode 16.0, table 3-7). A lead byte fixes the
 * sequence length and the range of its second byte; every later byte must be
 * 80..BF. When a byte does not fit, the bytes consumed so far (a "maximal
 * subpart") become one U+FFFD and the byte is examined again as a new start;
 * a byte that cannot start a sequence becomes one U+FFFD by itself. That is
 * the W3C/WHATWG practice, and what CPython's "replace" error handler does.
 */
#include "internal.h"
#include "tokenizer.h"

#include <string.h>

static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

/* For a lead byte: the total length (0: cannot start) and the range of the
 * second byte. */
static void lead_info(unsigned c, unsigned *len, unsigned *lo, unsigned *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) {
        *len = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
        *len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        *len = 3;
        if (c == 0xE0) *lo = 0xA0; /* no overlongs    */
        if (c == 0xED) *hi = 0x9F; /* no surrogates   */
    } else if (c >= 0xF0 && c <= 0xF4) {
        *len = 4;
        if (c == 0xF0) *lo = 0x90; /* no overlongs    */
        if (c == 0xF4) *hi = 0x8F; /* <= U+10FFFF     */
    } else {
        *len = 0;
    }
}

size_t utf8_decode_one(const unsigned char *p, size_t n, uint32_t *cp)
{
    unsigned len, lo, hi;
    lead_info(p[0], &len, &lo, &hi);
    if (len == 1) {
        *cp = p[0];
        return 1;
    }
    if (len == 0 || n < len || p[1] < lo || p[1] > hi) goto invalid;
    for (unsigned k = 2; k < len; k++)
        if (p[k] < 0x80 || p[k] > 0xBF) goto invalid;
    uint32_t v = p[0] & (0x7Fu >> len);
    for (unsigned k = 1; k < len; k++) v = (v << 6) | (p[k] & 0x3Fu);
    *cp = v;
    return len;
invalid:
    *cp = UTF8_INVALID;
    return 1;
}

int utf8_valid(const char *p, size_t n)
{
    const unsigned char *u = (const unsigned char *)p;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t len = utf8_decode_one(u + i, n - i, &cp);
        if (cp == UTF8_INVALID) return 0;
        i += len;
    }
    return 1;
}

void utf8_stream_init(utf8_stream *s)
{
    memset(s, 0, sizeof *s);
}

size_t utf8_stream_pending(const utf8_stream *s)
{
    return s->len;
}

size_t utf8_stream_feed(utf8_stream *s, const char *in, size_t n, char *out)
{
    const unsigned char *u = (const unsigned char *)in;
    size_t o = 0;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        if (s->len > 0) {
            if (c >= s->lo && c <= s->hi) {
                s->buf[s->len++] = (unsigned char)c;
                s->lo = 0x80;
                s->hi = 0xBF;
                i++;
                if (--s->need == 0) {
                    memcpy(out + o, s->buf, s->len);
                    o += s->len;
                    s->len = 0;
                }
                continue;
            }
            /* The sequence broke off: its prefix is one maximal subpart. */
            memcpy(out + o, replacement, 3);
            o += 3;
            s->len = 0;
            s->need = 0;
            continue; /* c is examined again as a start */
        }
        if (c < 0x80) {
            out[o++] = (char)c;
            i++;
            continue;
        }
        unsigned len, lo, hi;
        lead_info(c, &len, &lo, &hi);
        i++;
        if (len == 0) {
            memcpy(out + o, replacement, 3);
            o += 3;
            continue;
        }
        s->buf[0] = (unsigned char)c;
        s->len = 1;
        s->need = (unsigned char)(len - 1);
        s->lo = (unsigned char)lo;
        s->hi = (unsigned char)hi;
    }
    return o;
}

size_t utf8_stream_flush(utf8_stream *s, char *out)
{
    size_t o = 0;
    if (s->len > 0) {
        memcpy(out, replacement, 3);
        o = 3;
    }
    utf8_stream_init(s);
    return o;
}
