/*
 * structured/build.c: the builder of structured outputs' automaton (the
 * gb_ calls of build.h). A recursive transition network over bytes:
 * NFA nodes (a byte class, an epsilon split, a call of a rule, a rule's end)
 * in one array, built by Thompson's construction (fragments with one entry
 * and one open exit). Repetition re-emits its operand, recursion goes
 * through rules, and GRAM_MAX_NODES bounds it all. Also the character
 * fragments the front ends share: any UTF-8 character, a set of ASCII
 * characters (escaped as JSON writes them inside a string), one literal
 * character.
 */
#include "build.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Errors -------------------------------------------------------------- */

void gb_fail(gb *b, const char *kw, const char *path, const char *fmt, ...)
{
    if (b->failed) return;
    b->failed = 1;
    snprintf(b->err->keyword, sizeof b->err->keyword, "%s", kw);
    snprintf(b->err->path, sizeof b->err->path, "%s", path);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err->message, sizeof b->err->message, fmt, ap);
    va_end(ap);
}

/* ---- The builder: nodes, classes, fragments -------------------------------- */

/* The array arr of *cap elements of size bytes, doubled (first when
 * empty); NULL (the build failed, arr kept): out of memory. */
static void *grow(gb *b, void *arr, size_t *cap, size_t first, size_t size)
{
    size_t n = *cap ? 2 * *cap : first;
    void *p = realloc(arr, n * size);
    if (p == NULL) {
        gb_fail(b, "", "", "out of memory");
        return NULL;
    }
    *cap = n;
    return p;
}

/* Node 0 is a dead sink that a failed build writes into harmlessly. */
int32_t gb_node(gb *b, uint8_t kind, int32_t a, int32_t x)
{
    if (b->failed) return 0;
    if (b->nn >= GRAM_MAX_NODES) {
        gb_fail(b, "", "", "the automaton would pass %d nodes", GRAM_MAX_NODES);
        return 0;
    }
    if (b->nn == b->ncap) {
        gnode *n = grow(b, b->n, &b->ncap, 256, sizeof *n);
        if (n == NULL) return 0;
        b->n = n;
    }
    b->n[b->nn] = (gnode){kind, a, x};
    return (int32_t)b->nn++;
}

int32_t gb_class(gb *b, const uint64_t set[4])
{
    for (size_t i = b->nc; i-- > 0 && i + 16 >= b->nc;) /* recent ones repeat */
        if (memcmp(b->c[i], set, sizeof b->c[i]) == 0) return (int32_t)i;
    if (b->failed) return 0;
    if (b->nc == b->ccap) {
        uint64_t(*c)[4] = grow(b, b->c, &b->ccap, 64, sizeof *c);
        if (c == NULL) return 0;
        b->c = c;
    }
    memcpy(b->c[b->nc], set, sizeof b->c[0]);
    return (int32_t)b->nc++;
}

void gb_patch(gb *b, int32_t e, int32_t to)
{
    b->n[e].a = to;
}

frag gb_eps(gb *b)
{
    int32_t e = gb_node(b, GN_EPS, -1, -1);
    return (frag){e, e};
}

static frag gb_set(gb *b, const uint64_t set[4])
{
    int32_t e = gb_node(b, GN_EPS, -1, -1);
    int32_t s = gb_node(b, GN_BYTE, gb_class(b, set), e);
    return (frag){s, e};
}

void gb_set_range(uint64_t set[4], unsigned lo, unsigned hi)
{
    for (unsigned c = lo; c <= hi; c++) set[c >> 6] |= 1ull << (c & 63);
}

frag gb_range(gb *b, unsigned lo, unsigned hi)
{
    uint64_t set[4] = {0};
    gb_set_range(set, lo, hi);
    return gb_set(b, set);
}

frag gb_byte(gb *b, unsigned c)
{
    return gb_range(b, c, c);
}

/* A fragment that nothing passes (an empty class). */
frag gb_none(gb *b)
{
    uint64_t set[4] = {0};
    return gb_set(b, set);
}

frag gb_seq(gb *b, frag x, frag y)
{
    gb_patch(b, x.e, y.s);
    return (frag){x.s, y.e};
}

frag gb_lit(gb *b, const char *s, size_t n)
{
    frag f = gb_eps(b);
    for (size_t i = 0; i < n; i++) f = gb_seq(b, f, gb_byte(b, (unsigned char)s[i]));
    return f;
}

frag gb_alt(gb *b, frag x, frag y)
{
    int32_t e = gb_node(b, GN_EPS, -1, -1);
    int32_t s = gb_node(b, GN_EPS, x.s, y.s);
    gb_patch(b, x.e, e);
    gb_patch(b, y.e, e);
    return (frag){s, e};
}

frag gb_opt(gb *b, frag x)
{
    int32_t e = gb_node(b, GN_EPS, -1, -1);
    int32_t s = gb_node(b, GN_EPS, x.s, e);
    gb_patch(b, x.e, e);
    return (frag){s, e};
}

frag gb_star(gb *b, frag x)
{
    int32_t e = gb_node(b, GN_EPS, -1, -1);
    int32_t s = gb_node(b, GN_EPS, x.s, e);
    gb_patch(b, x.e, s);
    return (frag){s, e};
}

frag gb_plus(gb *b, frag x)
{
    int32_t e = gb_node(b, GN_EPS, -1, -1);
    if (!b->failed) {
        b->n[x.e].a = x.s;
        b->n[x.e].b = e;
    }
    return (frag){x.s, e};
}

frag gb_call(gb *b, int32_t rule)
{
    int32_t e = gb_node(b, GN_EPS, -1, -1);
    int32_t s = gb_node(b, GN_CALL, rule, e);
    return (frag){s, e};
}

int32_t gb_rule_new(gb *b)
{
    if (b->failed) return 0;
    if (b->nr == b->rcap) {
        int32_t *r = grow(b, b->rs, &b->rcap, 16, sizeof *r);
        if (r == NULL) return 0;
        b->rs = r;
    }
    b->rs[b->nr] = -1;
    return (int32_t)b->nr++;
}

void gb_rule_set(gb *b, int32_t r, frag f)
{
    int32_t end = gb_node(b, GN_END, -1, -1);
    gb_patch(b, f.e, end);
    if (!b->failed) b->rs[r] = f.s;
}

void gb_free(gb *b)
{
    free(b->n);
    free(b->c);
    free(b->rs);
}

/* ---- Characters ------------------------------------------------------------ */

/* Any UTF-8 character of two to four bytes (well formed: no overlongs, no
 * surrogates, nothing past U+10FFFF). */
static frag gb_utf8_multi(gb *b)
{
    frag t = gb_seq(b, gb_range(b, 0xC2, 0xDF), gb_range(b, 0x80, 0xBF));
    t = gb_alt(
        b, t,
        gb_seq(b, gb_seq(b, gb_byte(b, 0xE0), gb_range(b, 0xA0, 0xBF)), gb_range(b, 0x80, 0xBF)));
    uint64_t e3[4] = {0};
    gb_set_range(e3, 0xE1, 0xEC);
    gb_set_range(e3, 0xEE, 0xEF);
    t = gb_alt(
        b, t,
        gb_seq(b, gb_seq(b, gb_set(b, e3), gb_range(b, 0x80, 0xBF)), gb_range(b, 0x80, 0xBF)));
    t = gb_alt(
        b, t,
        gb_seq(b, gb_seq(b, gb_byte(b, 0xED), gb_range(b, 0x80, 0x9F)), gb_range(b, 0x80, 0xBF)));
    t = gb_alt(b, t,
               gb_seq(b,
                      gb_seq(b, gb_seq(b, gb_byte(b, 0xF0), gb_range(b, 0x90, 0xBF)),
                             gb_range(b, 0x80, 0xBF)),
                      gb_range(b, 0x80, 0xBF)));
    t = gb_alt(b, t,
               gb_seq(b,
                      gb_seq(b, gb_seq(b, gb_range(b, 0xF1, 0xF3), gb_range(b, 0x80, 0xBF)),
                             gb_range(b, 0x80, 0xBF)),
                      gb_range(b, 0x80, 0xBF)));
    t = gb_alt(b, t,
               gb_seq(b,
                      gb_seq(b, gb_seq(b, gb_byte(b, 0xF4), gb_range(b, 0x80, 0x8F)),
                             gb_range(b, 0x80, 0xBF)),
                      gb_range(b, 0x80, 0xBF)));
    return t;
}

static const char hexd[] = "0123456789abcdef";

/* One character of the set ascii[0..2) (bits of 0..127), plus every
 * non-ASCII character when nonascii. In a JSON string (json) the
 * characters JSON must escape are written escaped: \" \\ \n \r \t \b \f,
 * other controls \u00XX. */
frag gb_chars(gb *b, const uint64_t ascii[2], int nonascii, int json)
{
    uint64_t plain[4] = {ascii[0], ascii[1], 0, 0};
    frag f;
    int have = 0;
    if (json) {
        plain[0] &= ~0xFFFFFFFFull;                 /* controls */
        plain['"' >> 6] &= ~(1ull << ('"' & 63));   /* quote */
        plain['\\' >> 6] &= ~(1ull << ('\\' & 63)); /* backslash */
        int all_ctl = (ascii[0] & 0xFFFFFFFFull) == 0xFFFFFFFFull;
        uint64_t esc[4] = {0}; /* the letters after a backslash */
        if (ascii['"' >> 6] >> ('"' & 63) & 1) esc['"' >> 6] |= 1ull << ('"' & 63);
        if (ascii['\\' >> 6] >> ('\\' & 63) & 1) esc['\\' >> 6] |= 1ull << ('\\' & 63);
        static const char ctl_letter[][2] = {
            {'\n', 'n'}, {'\r', 'r'}, {'\t', 't'}, {'\b', 'b'}, {'\f', 'f'}};
        for (size_t k = 0; k < 5; k++)
            if (ascii[0] >> ctl_letter[k][0] & 1)
                gb_set_range(esc, (unsigned char)ctl_letter[k][1], (unsigned char)ctl_letter[k][1]);
        if (esc[0] | esc[1]) {
            f = gb_seq(b, gb_byte(b, '\\'), gb_set(b, esc));
            have = 1;
        }
        if (all_ctl) {
            frag u = gb_seq(b, gb_lit(b, "\\u00", 4), gb_range(b, '0', '1'));
            uint64_t hx[4] = {0};
            gb_set_range(hx, '0', '9');
            gb_set_range(hx, 'a', 'f');
            u = gb_seq(b, u, gb_set(b, hx));
            f = have ? gb_alt(b, f, u) : u;
            have = 1;
        } else {
            for (unsigned c = 0; c < 32; c++) {
                if (!(ascii[0] >> c & 1) || c == '\n' || c == '\r' || c == '\t' || c == '\b'
                    || c == '\f')
                    continue;
                char u[6] = {'\\', 'u', '0', '0', hexd[c >> 4], hexd[c & 15]};
                frag l = gb_lit(b, u, 6);
                f = have ? gb_alt(b, f, l) : l;
                have = 1;
            }
        }
    }
    if (plain[0] | plain[1]) {
        frag p = gb_set(b, plain);
        f = have ? gb_alt(b, f, p) : p;
        have = 1;
    }
    if (nonascii) {
        frag m = gb_utf8_multi(b);
        f = have ? gb_alt(b, f, m) : m;
        have = 1;
    }
    return have ? f : gb_none(b);
}

/* One literal byte sequence of a character, escaped for JSON when json. */
frag gb_char_lit(gb *b, const unsigned char *s, size_t n, int json)
{
    if (n == 1 && s[0] < 0x80) {
        uint64_t a[2] = {0};
        a[s[0] >> 6] |= 1ull << (s[0] & 63);
        return gb_chars(b, a, 0, json);
    }
    return gb_lit(b, (const char *)s, n);
}

/* ---- Integer ranges (JSON Schema bounds, written digit by digit) ----------- */

/* Non-negative integers in [lo, hi], written without leading zeros. */
static frag digits_any(gb *b, size_t k)
{
    frag f = gb_eps(b);
    for (size_t i = 0; i < k; i++) f = gb_seq(b, f, gb_range(b, '0', '9'));
    return f;
}

static frag suffix_ge(gb *b, const char *a, size_t i, size_t n)
{
    if (i == n) return gb_eps(b);
    frag f = gb_seq(b, gb_byte(b, (unsigned char)a[i]), suffix_ge(b, a, i + 1, n));
    if (a[i] < '9')
        f = gb_alt(b, f,
                   gb_seq(b, gb_range(b, (unsigned char)a[i] + 1u, '9'), digits_any(b, n - i - 1)));
    return f;
}

static frag suffix_le(gb *b, const char *z, size_t i, size_t n)
{
    if (i == n) return gb_eps(b);
    frag f = gb_seq(b, gb_byte(b, (unsigned char)z[i]), suffix_le(b, z, i + 1, n));
    if (z[i] > '0')
        f = gb_alt(b, f,
                   gb_seq(b, gb_range(b, '0', (unsigned char)z[i] - 1u), digits_any(b, n - i - 1)));
    return f;
}

static frag same_len(gb *b, const char *a, const char *z, size_t i, size_t n)
{
    if (i == n) return gb_eps(b);
    if (a[i] == z[i])
        return gb_seq(b, gb_byte(b, (unsigned char)a[i]), same_len(b, a, z, i + 1, n));
    frag f = gb_seq(b, gb_byte(b, (unsigned char)a[i]), suffix_ge(b, a, i + 1, n));
    if (z[i] - a[i] >= 2)
        f = gb_alt(b, f,
                   gb_seq(b, gb_range(b, (unsigned char)a[i] + 1u, (unsigned char)z[i] - 1u),
                          digits_any(b, n - i - 1)));
    return gb_alt(b, f, gb_seq(b, gb_byte(b, (unsigned char)z[i]), suffix_le(b, z, i + 1, n)));
}

frag gb_uint_range(gb *b, long long lo, long long hi)
{
    frag f = gb_none(b);
    long long p = 1;
    for (int d = 1; d <= 16; d++, p *= 10) {
        long long dlo = d == 1 ? 0 : p, dhi = p * 10 - 1;
        long long a = lo > dlo ? lo : dlo, z = hi < dhi ? hi : dhi;
        if (a > z) continue;
        char as[24], zs[24];
        snprintf(as, sizeof as, "%lld", a);
        snprintf(zs, sizeof zs, "%lld", z);
        f = gb_alt(b, f, same_len(b, as, zs, 0, strlen(as)));
    }
    return f;
}

frag gb_int_range(gb *b, long long lo, long long hi)
{
    frag f = gb_none(b);
    if (hi >= 0) f = gb_alt(b, f, gb_uint_range(b, lo > 0 ? lo : 0, hi));
    if (lo < 0) {
        long long mlo = hi < 0 ? -hi : 1, mhi = -lo;
        f = gb_alt(b, f, gb_seq(b, gb_byte(b, '-'), gb_uint_range(b, mlo, mhi)));
    }
    return f;
}
