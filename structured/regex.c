/*
 * structured/regex.c: structured outputs' regex subset (docs/api.md),
 * compiled onto the builder (build.h) by gb_regex: literals (UTF-8
 * too), `.`, classes `[...]` / `[^...]` of ASCII characters and ranges,
 * `\d \w \s \D \W \S` (`.`, `\s`, `\S` as ECMA-262 has them: JSON
 * Schema's dialect), escapes `\n \t \r \f \v \0 \xHH \uHHHH` (code points) and escaped
 * punctuation, groups `( )` and `(?: )`, `|`, `* + ? {m} {m,} {m,n}` (lazy
 * `?` suffix accepted: the language is the same), `^` first and `$` last.
 * Backreferences, lookaround, word boundaries and named groups are refused.
 * A regex matches the whole output (a JSON Schema `pattern`, the whole
 * string: a string that matches whole also contains a match). A parse by
 * recursive descent, nested at most GRAM_MAX_DEPTH groups; a counted
 * repetition re-parses its atom for each copy (at most GB_MAX_COUNT).
 */
#include "build.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    gb *b;
    const char *p;
    size_t n, i;
    int json;         /* inside a JSON string: escape what JSON escapes */
    const char *kw;   /* "pattern", "guided_regex", "format" */
    const char *path; /* the schema path of the keyword */
    int depth;
    int32_t set_rule[3];  /* the non-ASCII sets' rules (NA_SPACE, NA_OTHER, 0: '.'), -1 unbuilt */
    int32_t atom_rule[7]; /* '.' and \d \D \w \W \s \S outside a class, -1 unbuilt */
} rx;

static frag rx_alt(rx *r);

static void rx_fail(rx *r, const char *what)
{
    gb_fail(r->b, r->kw, r->path, "%s at offset %zu of the regex; docs/api.md lists the subset",
            what, r->i);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static size_t utf8_put(unsigned cp, unsigned char *o)
{
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 63));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 63));
        o[2] = (unsigned char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 63));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 63));
    o[3] = (unsigned char)(0x80 | (cp & 63));
    return 4;
}

/* ---- Non-ASCII sets, as ECMA-262 (JSON Schema's regex dialect) has them ---- */

/* The non-ASCII characters of a class: NA_SPACE the white space of ECMA's
 * \s above ASCII, NA_OTHER every other one (both: all of them). */
enum { NA_SPACE = 1, NA_OTHER = 2, NA_ALL = 3 };

/* ECMA's \s above ASCII (WhiteSpace and LineTerminator: U+00A0, U+FEFF,
 * Unicode's Zs, U+2028, U+2029), as code point ranges. */
static const unsigned na_space[][2] = {{0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
                                       {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                                       {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};

/* The code points lo..hi (same UTF-8 length n; o the bytes of lo and of
 * hi, from byte i on): the bytes in order, split where they differ. */
static frag utf8_span(gb *b, const unsigned char *lo, const unsigned char *hi, size_t i, size_t n)
{
    if (i + 1 == n) return gb_range(b, lo[i], hi[i]);
    if (lo[i] == hi[i]) return gb_seq(b, gb_byte(b, lo[i]), utf8_span(b, lo, hi, i + 1, n));
    static const unsigned char min[4] = {0x80, 0x80, 0x80, 0x80}, max[4] = {0xBF, 0xBF, 0xBF, 0xBF};
    frag f = gb_seq(b, gb_byte(b, lo[i]), utf8_span(b, lo, max, i + 1, n));
    if (hi[i] - lo[i] >= 2)
        f = gb_alt(
            b, f, gb_seq(b, gb_range(b, lo[i] + 1u, hi[i] - 1u), utf8_span(b, min, max, i + 1, n)));
    return gb_alt(b, f, gb_seq(b, gb_byte(b, hi[i]), utf8_span(b, min, hi, i + 1, n)));
}

/* The code points lo..hi (0x80 <= lo <= hi <= 0x10FFFF, no surrogates
 * inside) as UTF-8, split where the length changes. */
static frag utf8_range(gb *b, unsigned lo, unsigned hi)
{
    static const unsigned top[] = {0x7FF, 0xFFFF, 0x10FFFF};
    frag f = gb_none(b);
    for (size_t k = 0; k < 3; k++) {
        unsigned bot = k == 0 ? 0x80 : top[k - 1] + 1;
        unsigned a = lo > bot ? lo : bot, z = hi < top[k] ? hi : top[k];
        if (a > z) continue;
        unsigned char x[4], y[4];
        size_t n = utf8_put(a, x);
        utf8_put(z, y);
        f = gb_alt(b, f, utf8_span(b, x, y, 0, n));
    }
    return f;
}

/* The non-ASCII characters outside ranges r[0..n) (sorted, apart). */
static frag utf8_except(gb *b, const unsigned (*r)[2], size_t n)
{
    frag f = gb_none(b);
    unsigned from = 0x80;
    for (size_t k = 0; k <= n; k++) {
        unsigned to = k < n ? r[k][0] - 1 : 0x10FFFF;
        /* no surrogates: D800..DFFF split out */
        if (from <= to && (to < 0xD800 || from > 0xDFFF))
            f = gb_alt(b, f, utf8_range(b, from, to));
        else if (from <= to) {
            if (from < 0xD800) f = gb_alt(b, f, utf8_range(b, from, 0xD7FF));
            if (to > 0xDFFF) f = gb_alt(b, f, utf8_range(b, 0xE000, to));
        }
        if (k < n) from = r[k][1] + 1;
    }
    return f;
}

/* A call of the rule of non-ASCII set which (NA_SPACE, NA_OTHER, or 0:
 * all but U+2028 and U+2029), built once a regex: a set is some forty
 * nodes, and {m,n} copies only the call. */
static frag rx_set(rx *r, int which)
{
    gb *b = r->b;
    if (r->set_rule[which] < 0) {
        static const unsigned ls_ps[][2] = {{0x2028, 0x2029}};
        frag f = gb_none(b);
        if (which == NA_SPACE)
            for (size_t k = 0; k < sizeof na_space / sizeof na_space[0]; k++)
                f = gb_alt(b, f, utf8_range(b, na_space[k][0], na_space[k][1]));
        else if (which == NA_OTHER)
            f = utf8_except(b, na_space, sizeof na_space / sizeof na_space[0]);
        else
            f = utf8_except(b, ls_ps, 1);
        r->set_rule[which] = gb_rule_new(b);
        gb_rule_set(b, r->set_rule[which], f);
    }
    return gb_call(b, r->set_rule[which]);
}

/* ASCII set a and the non-ASCII set na (NA_*), inside a JSON string when
 * json. */
static frag rx_chars(rx *r, const uint64_t a[2], int na)
{
    gb *b = r->b;
    if (na == 0 || na == NA_ALL) return gb_chars(b, a, na == NA_ALL, r->json);
    return gb_alt(b, gb_chars(b, a, 0, r->json), rx_set(r, na));
}

/* \d \w \s (and their capitals) as an ASCII set and a non-ASCII one
 * (NA_*, or'ed into *nonascii); 1 if c is one. */
static int class_escape(char c, uint64_t a[2], int *nonascii)
{
    uint64_t s[4] = {0};
    char lc = (char)(c | 0x20);
    if (lc == 'd')
        gb_set_range(s, '0', '9');
    else if (lc == 'w') {
        gb_set_range(s, '0', '9');
        gb_set_range(s, 'a', 'z');
        gb_set_range(s, 'A', 'Z');
        gb_set_range(s, '_', '_');
    } else if (lc == 's') {
        gb_set_range(s, '\t', '\r');
        gb_set_range(s, ' ', ' ');
    } else
        return 0;
    if (c >= 'A' && c <= 'Z') {
        a[0] |= ~s[0];
        a[1] |= ~s[1];
        *nonascii |= lc == 's' ? NA_OTHER : NA_ALL;
    } else {
        a[0] |= s[0];
        a[1] |= s[1];
        *nonascii |= lc == 's' ? NA_SPACE : 0;
    }
    return 1;
}

/* A simple escape's character (after the backslash at r->i); -1: none. */
static int simple_escape(rx *r)
{
    char c = r->p[r->i];
    switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    case 'x':
        if (r->i + 2 < r->n + 0 && hexval(r->p[r->i + 1]) >= 0 && hexval(r->p[r->i + 2]) >= 0) {
            int v = hexval(r->p[r->i + 1]) * 16 + hexval(r->p[r->i + 2]);
            r->i += 2;
            return v;
        }
        return -2;
    default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
            || (unsigned char)c >= 0x80)
            return -2; /* a letter or digit we do not know: refused */
        return (unsigned char)c;
    }
}

static frag rx_class(rx *r)
{
    r->i++; /* [ */
    int neg = 0, nonascii = 0;
    uint64_t a[2] = {0};
    if (r->i < r->n && r->p[r->i] == '^') {
        neg = 1;
        r->i++;
    }
    int first = 1;
    while (r->i < r->n && (r->p[r->i] != ']' || first)) {
        first = 0;
        int lo;
        if ((unsigned char)r->p[r->i] >= 0x80) {
            rx_fail(r, "a character class with non-ASCII characters");
            return gb_none(r->b);
        }
        if (r->p[r->i] == '\\' && r->i + 1 < r->n) {
            r->i++;
            if (class_escape(r->p[r->i], a, &nonascii)) {
                r->i++;
                continue;
            }
            lo = simple_escape(r);
            if (lo < 0 || lo >= 0x80) {
                rx_fail(r, "an escape in a character class outside the subset");
                return gb_none(r->b);
            }
        } else if (r->p[r->i] == '[' && r->i + 1 < r->n && r->p[r->i + 1] == ':') {
            rx_fail(r, "a POSIX class [:name:]");
            return gb_none(r->b);
        } else
            lo = (unsigned char)r->p[r->i];
        r->i++;
        int hi = lo;
        if (r->i + 1 < r->n && r->p[r->i] == '-' && r->p[r->i + 1] != ']') {
            r->i++;
            if (r->p[r->i] == '\\' && r->i + 1 < r->n) {
                r->i++;
                hi = simple_escape(r);
            } else
                hi = (unsigned char)r->p[r->i];
            r->i++;
            if (hi < lo || hi >= 0x80) {
                rx_fail(r, "a bad range in a character class");
                return gb_none(r->b);
            }
        }
        for (int c = lo; c <= hi; c++) a[c >> 6] |= 1ull << (c & 63);
    }
    if (r->i >= r->n) {
        rx_fail(r, "an unterminated character class");
        return gb_none(r->b);
    }
    r->i++; /* ] */
    if (neg) {
        a[0] = ~a[0];
        a[1] = ~a[1];
        nonascii ^= NA_ALL;
    }
    return rx_chars(r, a, nonascii);
}

static frag rx_atom(rx *r)
{
    gb *b = r->b;
    char c = r->p[r->i];
    if (c == '(') {
        r->i++;
        if (r->i + 1 < r->n && r->p[r->i] == '?') {
            if (r->p[r->i + 1] != ':') {
                rx_fail(r, "a lookaround, named or flagged group");
                return gb_none(b);
            }
            r->i += 2;
        }
        if (++r->depth > GRAM_MAX_DEPTH) {
            rx_fail(r, "groups nested too deep");
            return gb_none(b);
        }
        frag f = rx_alt(r);
        r->depth--;
        if (r->i >= r->n || r->p[r->i] != ')') {
            rx_fail(r, "an unclosed group");
            return gb_none(b);
        }
        r->i++;
        return f;
    }
    if (c == '[') return rx_class(r);
    if (c == '.') { /* ECMA: not a line terminator (\n \r U+2028 U+2029); guided_regex: not \n */
        r->i++;
        uint64_t a[2] = {~0ull, ~0ull};
        a[0] &= ~(1ull << '\n');
        if (!r->json) return gb_chars(b, a, 1, 0);
        a[0] &= ~(1ull << '\r');
        if (r->atom_rule[0] < 0) {
            frag f = gb_alt(b, gb_chars(b, a, 0, 1), rx_set(r, 0));
            r->atom_rule[0] = gb_rule_new(b);
            gb_rule_set(b, r->atom_rule[0], f);
        }
        return gb_call(b, r->atom_rule[0]);
    }
    if (c == '^' && r->i == 0) {
        r->i++;
        return gb_eps(b);
    }
    if (c == '$' && r->i + 1 == r->n) {
        r->i++;
        return gb_eps(b);
    }
    if (c == '^' || c == '$') {
        rx_fail(r, "an anchor that is not first (^) or last ($)");
        return gb_none(b);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{' || c == ')') {
        rx_fail(r, "a quantifier with nothing to repeat, or an unmatched ')'");
        return gb_none(b);
    }
    if (c == '\\') {
        r->i++;
        if (r->i >= r->n) {
            rx_fail(r, "a trailing backslash");
            return gb_none(b);
        }
        uint64_t a[2] = {0};
        int nonascii = 0;
        if (class_escape(r->p[r->i], a, &nonascii)) {
            /* a rule each: \S is some two hundred nodes in a JSON string (every
             * control's \u00XX), and {m,n} copies only the call */
            static const char letters[] = "dDwWsS";
            size_t slot = 1;
            while (letters[slot - 1] != r->p[r->i]) slot++;
            r->i++;
            if (r->atom_rule[slot] < 0) {
                frag f = rx_chars(r, a, nonascii);
                r->atom_rule[slot] = gb_rule_new(b);
                gb_rule_set(b, r->atom_rule[slot], f);
            }
            return gb_call(b, r->atom_rule[slot]);
        }
        char e = r->p[r->i];
        if (e == 'u') {
            unsigned cp = 0;
            for (int k = 1; k <= 4; k++) {
                int h = r->i + (size_t)k < r->n ? hexval(r->p[r->i + (size_t)k]) : -1;
                if (h < 0) {
                    rx_fail(r, "a bad \\u escape");
                    return gb_none(b);
                }
                cp = cp * 16 + (unsigned)h;
            }
            r->i += 5;
            if (cp >= 0xD800 && cp <= 0xDFFF) {
                rx_fail(r, "a surrogate \\u escape");
                return gb_none(b);
            }
            unsigned char o[4];
            size_t n = utf8_put(cp, o);
            return gb_char_lit(b, o, n, r->json);
        }
        if ((e >= '1' && e <= '9') || e == 'b' || e == 'B' || e == 'k') {
            rx_fail(r, "a backreference or word boundary");
            return gb_none(b);
        }
        int v = simple_escape(r);
        if (v < 0) {
            rx_fail(r, "an escape outside the subset");
            return gb_none(b);
        }
        r->i++;
        unsigned char o[4]; /* \xHH names a code point, as \uHHHH does */
        size_t n = utf8_put((unsigned)v, o);
        return gb_char_lit(b, o, n, r->json);
    }
    /* A literal character, all its UTF-8 bytes. */
    unsigned char u = (unsigned char)c;
    size_t len = u < 0x80 ? 1 : u >= 0xF0 ? 4 : u >= 0xE0 ? 3 : 2;
    if (r->i + len > r->n) len = r->n - r->i;
    frag f = gb_char_lit(b, (const unsigned char *)r->p + r->i, len, r->json);
    r->i += len;
    return f;
}

static int rx_number(rx *r, long *v)
{
    size_t s = r->i;
    long x = 0;
    while (r->i < r->n && r->p[r->i] >= '0' && r->p[r->i] <= '9' && x <= 100000)
        x = x * 10 + (r->p[r->i++] - '0');
    *v = x;
    return r->i > s;
}

/* One copy of a counted atom (it stands at at..after): the first (*made
 * 0) is first, the atom already built; the others parse the atom again. */
static frag rx_copy(rx *r, frag first, long *made, size_t at, size_t after)
{
    if ((*made)++ == 0) return first;
    r->i = at;
    frag f = rx_atom(r);
    r->i = after;
    return f;
}

static frag rx_concat(rx *r)
{
    gb *b = r->b;
    frag f = gb_eps(b);
    while (r->i < r->n && r->p[r->i] != '|' && r->p[r->i] != ')' && !b->failed) {
        size_t at = r->i;
        frag a = rx_atom(r);
        size_t after = r->i;
        if (r->i < r->n && (r->p[r->i] == '*' || r->p[r->i] == '+' || r->p[r->i] == '?')) {
            char q = r->p[r->i++];
            a = q == '*' ? gb_star(b, a) : q == '+' ? gb_plus(b, a) : gb_opt(b, a);
        } else if (r->i < r->n && r->p[r->i] == '{') {
            r->i++;
            long lo = 0, hi = -1;
            if (!rx_number(r, &lo)) {
                rx_fail(r, "a bad {m,n} count");
                return f;
            }
            if (r->i < r->n && r->p[r->i] == ',') {
                r->i++;
                if (!rx_number(r, &hi)) hi = -2; /* {m,} */
            } else
                hi = lo;
            if (r->i >= r->n || r->p[r->i] != '}' || (hi >= 0 && hi < lo) || lo > GB_MAX_COUNT
                || hi > GB_MAX_COUNT) {
                rx_fail(r, "a bad {m,n} count (at most "
                           "1000"
                           ")");
                return f;
            }
            r->i++;
            size_t end = r->i;
            /* lo copies, then either a loop or hi - lo optional copies
             * nested, (a(a(a)?)?)?, so that a position's closure holds one
             * copy's threads, not every later one's. The first copy is a;
             * the others re-parse the atom. */
            frag rep = gb_eps(b);
            long nopt = hi == -2 ? 0 : hi - lo, made = 0;
            for (long k = 0; k < lo && !b->failed; k++)
                rep = gb_seq(b, rep, rx_copy(r, a, &made, at, after));
            if (hi == -2)
                rep = gb_seq(b, rep, gb_star(b, rx_copy(r, a, &made, at, after)));
            else if (nopt > 0) {
                frag tail = gb_eps(b);
                for (long k = 0; k < nopt && !b->failed; k++)
                    tail = gb_opt(b, gb_seq(b, rx_copy(r, a, &made, at, after), tail));
                rep = gb_seq(b, rep, tail);
            }
            r->i = end;
            a = rep;
        }
        if (r->i < r->n && r->p[r->i] == '?') r->i++; /* lazy: the same language */
        f = gb_seq(b, f, a);
    }
    return f;
}

static frag rx_alt(rx *r)
{
    frag f = rx_concat(r);
    while (r->i < r->n && r->p[r->i] == '|' && !r->b->failed) {
        r->i++;
        f = gb_alt(r->b, f, rx_concat(r));
    }
    return f;
}

frag gb_regex(gb *b, const char *p, size_t n, int json, const char *kw, const char *path)
{
    rx r = {b, p, n, 0, json, kw, path, 0, {-1, -1, -1}, {-1, -1, -1, -1, -1, -1, -1}};
    frag f = rx_alt(&r);
    if (!b->failed && r.i != n) rx_fail(&r, "an unmatched ')'");
    return f;
}
