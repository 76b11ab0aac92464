/*
 * structured/schema.c: structured outputs' JSON Schema subset
 * (docs/api.md), walked onto the builder (build.h): gb_schema for
 * a response_format's schema, gb_json_object for any JSON object. The
 * output is compact JSON: an object's properties in the order written (an
 * optional one may be left out), arrays of bounded or open length, strings
 * of bounded length or of a pattern or format (regex.c), numbers
 * in bounded integer ranges written digit by digit, enum and const as
 * literals (those the schema's other keywords allow) and oneOf only where
 * no value satisfies two branches (both checked in schema_values.c).
 * Recursion ($ref, and the generic JSON value) goes through
 * rules, each $ref target built once, so the automaton is linear in the
 * schema except for bounded counts; schemas nest at most GRAM_MAX_DEPTH
 * deep, and anything outside the subset is refused, naming its keyword and
 * path.
 */
#include "structured.h"
#include "schema.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static frag sch(gs_ctx *c, const json_t *s, const char *path);

static void subpath_index(char *out, size_t cap, const char *path, size_t i)
{
    char k[24];
    snprintf(k, sizeof k, "%zu", i);
    gs_subpath(out, cap, path, k);
}

static frag f_json_char(gb *b)
{
    uint64_t a[2] = {~0ull, ~0ull};
    return gb_chars(b, a, 1, 1);
}

static frag f_number_any(gb *b)
{
    static const char re[] = "-?(0|[1-9][0-9]{0,15})(\\.[0-9]{1,16})?([eE][+-]?[0-9]{1,2})?";
    return gb_regex(b, re, sizeof re - 1, 0, "type", "");
}

static frag f_integer_any(gb *b)
{
    static const char re[] = "-?(0|[1-9][0-9]{0,15})";
    return gb_regex(b, re, sizeof re - 1, 0, "type", "");
}

static int32_t generic_rule(gs_ctx *c, int32_t *slot);

static frag f_generic(gs_ctx *c, int32_t *slot)
{
    return gb_call(c->b, generic_rule(c, slot));
}

/* The generic JSON rules: value, object, array, string (compact). */
static int32_t generic_rule(gs_ctx *c, int32_t *slot)
{
    gb *b = c->b;
    if (*slot >= 0) return *slot;
    if (c->r_value < 0) { /* all four at once */
        c->r_value = gb_rule_new(b);
        c->r_object = gb_rule_new(b);
        c->r_array = gb_rule_new(b);
        c->r_string = gb_rule_new(b);
        frag str =
            gb_seq(b, gb_seq(b, gb_byte(b, '"'), gb_star(b, f_json_char(b))), gb_byte(b, '"'));
        gb_rule_set(b, c->r_string, str);
        frag v = gb_call(b, c->r_object);
        v = gb_alt(b, v, gb_call(b, c->r_array));
        v = gb_alt(b, v, gb_call(b, c->r_string));
        v = gb_alt(b, v, f_number_any(b));
        v = gb_alt(b, v, gb_lit(b, "true", 4));
        v = gb_alt(b, v, gb_lit(b, "false", 5));
        v = gb_alt(b, v, gb_lit(b, "null", 4));
        gb_rule_set(b, c->r_value, v);
        frag member =
            gb_seq(b, gb_seq(b, gb_call(b, c->r_string), gb_byte(b, ':')), gb_call(b, c->r_value));
        frag more = gb_star(b, gb_seq(b, gb_byte(b, ','),
                                      gb_seq(b, gb_seq(b, gb_call(b, c->r_string), gb_byte(b, ':')),
                                             gb_call(b, c->r_value))));
        frag obj = gb_seq(b, gb_seq(b, gb_byte(b, '{'), gb_opt(b, gb_seq(b, member, more))),
                          gb_byte(b, '}'));
        gb_rule_set(b, c->r_object, obj);
        frag el = gb_seq(b, gb_call(b, c->r_value),
                         gb_star(b, gb_seq(b, gb_byte(b, ','), gb_call(b, c->r_value))));
        frag arr = gb_seq(b, gb_seq(b, gb_byte(b, '['), gb_opt(b, el)), gb_byte(b, ']'));
        gb_rule_set(b, c->r_array, arr);
    }
    return *slot;
}

/* Keywords that say nothing about the value (annotations). */
static int annotation(const char *k)
{
    static const char *const a[] = {"title",    "description", "$schema",      "$id",
                                    "$comment", "default",     "examples",     "deprecated",
                                    "readOnly", "writeOnly",   "$defs",        "definitions",
                                    "$anchor",  "strict",      "discriminator"};
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
        if (strcmp(k, a[i]) == 0) return 1;
    return 0;
}

static int known(const char *k)
{
    static const char *const a[] = {"type",
                                    "properties",
                                    "required",
                                    "additionalProperties",
                                    "enum",
                                    "const",
                                    "items",
                                    "prefixItems",
                                    "minItems",
                                    "maxItems",
                                    "anyOf",
                                    "oneOf",
                                    "allOf",
                                    "$ref",
                                    "minLength",
                                    "maxLength",
                                    "pattern",
                                    "format",
                                    "minimum",
                                    "maximum",
                                    "exclusiveMinimum",
                                    "exclusiveMaximum"};
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
        if (strcmp(k, a[i]) == 0) return 1;
    return annotation(k);
}

static int32_t ref_rule(gs_ctx *c, const char *ref, const char *path)
{
    for (size_t i = 0; i < c->nrefs; i++)
        if (strcmp(c->refs[i].ref, ref) == 0) return c->refs[i].rule;
    if (c->nrefs == MAX_REFS) {
        gb_fail(c->b, "$ref", path, "more than %d distinct $ref targets", MAX_REFS);
        return 0;
    }
    char *dup = strdup(ref);
    if (dup == NULL) {
        gb_fail(c->b, "$ref", path, "out of memory");
        return 0;
    }
    c->refs[c->nrefs].ref = dup;
    c->refs[c->nrefs].rule = gb_rule_new(c->b);
    c->refs[c->nrefs].done = 0;
    return c->refs[c->nrefs++].rule;
}

/* A numeric bound of the schema: 0 absent, 1 read (*v), -1 failed. */
static int bound(gs_ctx *c, const json_t *s, const char *kw, const char *path, double *v)
{
    const json_t *x = json_object_get(s, kw);
    if (x == NULL) return 0;
    if (!json_is_number(x)) {
        char p[256];
        gs_subpath(p, sizeof p, path, kw);
        gb_fail(c->b, kw, p, "'%s' must be a number", kw);
        return -1;
    }
    *v = json_number_value(x);
    return 1;
}

static frag sch_number(gs_ctx *c, const json_t *s, const char *path, int integer)
{
    gb *b = c->b;
    double mn = 0, mx = 0, xmn = 0, xmx = 0;
    int hmn = bound(c, s, "minimum", path, &mn), hmx = bound(c, s, "maximum", path, &mx);
    int hxmn = bound(c, s, "exclusiveMinimum", path, &xmn),
        hxmx = bound(c, s, "exclusiveMaximum", path, &xmx);
    if (hmn < 0 || hmx < 0 || hxmn < 0 || hxmx < 0) return gb_none(b);
    if (!hmn && !hmx && !hxmn && !hxmx) return integer ? f_integer_any(b) : f_number_any(b);
    char p[256];
    gs_subpath(p, sizeof p, path,
               hmn || hxmn ? (hmn ? "minimum" : "exclusiveMinimum")
                           : (hmx ? "maximum" : "exclusiveMaximum"));
    const char *kw = p + strlen(path) + 1;
    double lim = (double)INT_LIMIT;
    if ((hmn && fabs(mn) > lim) || (hmx && fabs(mx) > lim) || (hxmn && fabs(xmn) > lim)
        || (hxmx && fabs(xmx) > lim)) {
        gb_fail(b, kw, p, "bounds beyond 1e16 are outside the subset");
        return gb_none(b);
    }
    if (integer) {
        long long lo = -INT_LIMIT, hi = INT_LIMIT;
        if (hmn) lo = (long long)ceil(mn);
        if (hxmn && (long long)floor(xmn) + 1 > lo) lo = (long long)floor(xmn) + 1;
        if (hmx) hi = (long long)floor(mx);
        if (hxmx && (long long)ceil(xmx) - 1 < hi) hi = (long long)ceil(xmx) - 1;
        if (lo > hi) {
            gb_fail(b, kw, p, "no integer lies between the minimum and the maximum");
            return gb_none(b);
        }
        return gb_int_range(b, lo, hi);
    }
    /* A number: integer non-negative bounds (inclusive) only, written as an
     * integer part in range, then a fraction below the upper bound. */
    if (hxmn || hxmx || (hmn && (mn < 0 || mn != floor(mn))) || (hmx && mx != floor(mx)) || !hmn) {
        gb_fail(b, kw, p,
                "a number's bounds must be an integer minimum >= 0 and optionally an integer "
                "maximum (use type integer for other integer ranges)");
        return gb_none(b);
    }
    long long lo = (long long)mn, hi = hmx ? (long long)mx : INT_LIMIT;
    if (lo > hi) {
        gb_fail(b, kw, p, "the minimum is above the maximum");
        return gb_none(b);
    }
    static const char frac[] = "(\\.[0-9]{1,16})?";
    frag f = gb_lit(b, "", 0);
    char hs[24];
    snprintf(hs, sizeof hs, "%lld", hi);
    f = gb_lit(b, hs, strlen(hs));
    if (hi > lo)
        f = gb_alt(
            b, f,
            gb_seq(b, gb_uint_range(b, lo, hi - 1), gb_regex(b, frac, sizeof frac - 1, 0, kw, p)));
    return f;
}

/* A count's bounds, min_kw and max_kw (minLength and maxLength, minItems
 * and maxItems): *lo 0..GB_MAX_COUNT (0 when absent), *hi >= *lo or -1
 * (absent). A *hi past GB_MAX_COUNT is the caller's to refuse (an array
 * closed by items false may hold fewer). 0, or -1 failed. */
static int count_bounds(gs_ctx *c, const json_t *s, const char *path, const char *min_kw,
                        const char *max_kw, long long *lo, long long *hi)
{
    const json_t *mn = json_object_get(s, min_kw), *mx = json_object_get(s, max_kw);
    char p[256];
    *lo = 0;
    *hi = -1;
    if (mn != NULL) {
        gs_subpath(p, sizeof p, path, min_kw);
        if (!json_is_integer(mn) || json_integer_value(mn) < 0
            || json_integer_value(mn) > GB_MAX_COUNT) {
            gb_fail(c->b, min_kw, p, "'%s' must be an integer 0..%d", min_kw, GB_MAX_COUNT);
            return -1;
        }
        *lo = json_integer_value(mn);
    }
    if (mx != NULL) {
        gs_subpath(p, sizeof p, path, max_kw);
        if (!json_is_integer(mx) || json_integer_value(mx) < 0) {
            gb_fail(c->b, max_kw, p, "'%s' must be an integer >= 0", max_kw);
            return -1;
        }
        if (json_integer_value(mx) < *lo) {
            gb_fail(c->b, max_kw, p, "'%s' is below '%s'", max_kw, min_kw);
            return -1;
        }
        *hi = json_integer_value(mx);
    }
    return 0;
}

/* Refuses a maximum count past what is written out (never unbounded). */
static int count_max_ok(gs_ctx *c, const char *path, const char *max_kw, long long hi)
{
    if (hi <= GB_MAX_COUNT) return 1;
    char p[256];
    gs_subpath(p, sizeof p, path, max_kw);
    gb_fail(c->b, max_kw, p, "'%s' above %d is outside the subset (leave it out for no bound)",
            max_kw, GB_MAX_COUNT);
    return 0;
}

/* The date and time formats, valid by construction (every month's days; no
 * leap day or leap second, a subset). */
static const char re_date[] = "[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-"
                              "(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))";
static const char re_time[] =
    "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
static const char re_uuid[] = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";
static const char re_email[] =
    "[a-z0-9_+-]{1,20}(\\.[a-z0-9_+-]{1,20}){0,2}@[a-z0-9]([a-z0-9-]{0,20}"
    "[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?){0,2}\\.[a-z]{2,8}";

static frag sch_string(gs_ctx *c, const json_t *s, const char *path)
{
    gb *b = c->b;
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    const json_t *mnl = json_object_get(s, "minLength"), *mxl = json_object_get(s, "maxLength");
    char p[256];
    frag body;
    if (pat != NULL || fmt != NULL) {
        const char *kw = pat != NULL ? "pattern" : "format";
        gs_subpath(p, sizeof p, path, kw);
        if ((pat != NULL && fmt != NULL) || mnl != NULL || mxl != NULL) {
            gb_fail(b, kw, p, "'%s' with %s is outside the subset", kw,
                    pat != NULL && fmt != NULL ? "'format'" : "'minLength' or 'maxLength'");
            return gb_none(b);
        }
        const char *re = NULL;
        if (pat != NULL) {
            if (!json_is_string(pat)) {
                gb_fail(b, kw, p, "'pattern' must be a string");
                return gb_none(b);
            }
            re = json_string_value(pat);
            body = gb_regex(b, re, json_string_length(pat), 1, kw, p);
        } else {
            const char *f = json_string_value(fmt);
            if (f == NULL) f = "";
            re = strcmp(f, "date") == 0        ? re_date
                 : strcmp(f, "time") == 0      ? re_time
                 : strcmp(f, "uuid") == 0      ? re_uuid
                 : strcmp(f, "email") == 0     ? re_email
                 : strcmp(f, "date-time") == 0 ? ""
                                               : NULL;
            if (re == NULL) {
                gb_fail(b, kw, p,
                        "format '%.40s' is outside the subset (date, time, date-time, uuid, email)",
                        f);
                return gb_none(b);
            }
            if (*re == '\0')
                body = gb_seq(
                    b,
                    gb_seq(b, gb_regex(b, re_date, sizeof re_date - 1, 1, kw, p), gb_byte(b, 'T')),
                    gb_regex(b, re_time, sizeof re_time - 1, 1, kw, p));
            else
                body = gb_regex(b, re, strlen(re), 1, kw, p);
        }
    } else {
        long long lo, hi;
        if (count_bounds(c, s, path, "minLength", "maxLength", &lo, &hi) != 0
            || !count_max_ok(c, path, "maxLength", hi))
            return gb_none(b);
        body = gb_eps(b);
        for (long long k = 0; k < lo && !b->failed; k++) body = gb_seq(b, body, f_json_char(b));
        if (hi < 0)
            body = gb_seq(b, body, gb_star(b, f_json_char(b)));
        else { /* nested optional copies: (c(c(c)?)?)? (see rx_concat, regex.c) */
            frag tail = gb_eps(b);
            for (long long k = lo; k < hi && !b->failed; k++)
                tail = gb_opt(b, gb_seq(b, f_json_char(b), tail));
            body = gb_seq(b, body, tail);
        }
    }
    return gb_seq(b, gb_seq(b, gb_byte(b, '"'), body), gb_byte(b, '"'));
}

/* A property's or an item's schema: a rule called where it is used, so a
 * schema repeated (array positions) is built once. */
static int32_t sub_rule(gs_ctx *c, const json_t *s, const char *path)
{
    int32_t r = gb_rule_new(c->b);
    frag f = sch(c, s, path);
    gb_rule_set(c->b, r, f);
    return r;
}

static frag sch_object(gs_ctx *c, const json_t *s, const char *path)
{
    gb *b = c->b;
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    char p[256];
    if (addl != NULL && !json_is_boolean(addl)
        && !(json_is_object(addl) && json_object_size(addl) == 0)) {
        gs_subpath(p, sizeof p, path, "additionalProperties");
        gb_fail(b, "additionalProperties", p,
                "'additionalProperties' must be false or true (a schema is outside the subset)");
        return gb_none(b);
    }
    if (props != NULL && !json_is_object(props)) {
        gs_subpath(p, sizeof p, path, "properties");
        gb_fail(b, "properties", p, "'properties' must be an object");
        return gb_none(b);
    }
    if (req != NULL && !json_is_array(req)) {
        gs_subpath(p, sizeof p, path, "required");
        gb_fail(b, "required", p, "'required' must be an array of strings");
        return gb_none(b);
    }
    size_t i;
    const json_t *one;
    json_array_foreach(req, i, one)
    {
        if (!json_is_string(one) || props == NULL
            || json_object_get(props, json_string_value(one)) == NULL) {
            gs_subpath(p, sizeof p, path, "required");
            gb_fail(b, "required", p,
                    "required property %s is not among 'properties' (this subset writes only the "
                    "properties it declares)",
                    json_is_string(one) ? json_string_value(one) : "(not a string)");
            return gb_none(b);
        }
    }
    size_t n = props ? json_object_size(props) : 0;
    if (n == 0) {
        if (json_is_false(addl)) return gb_lit(b, "{}", 2);
        return f_generic(c, &c->r_object);
    }
    if (n > 1024) {
        gs_subpath(p, sizeof p, path, "properties");
        gb_fail(b, "properties", p, "more than 1024 properties");
        return gb_none(b);
    }
    /* Properties in the order written; an optional one may be left out.
     * A[i]: from property i with nothing written yet; B[i]: after one (a
     * comma first). Both end at the closing brace. */
    frag close = gb_byte(b, '}');
    int32_t a_next = close.s, b_next = close.s;
    const char **keys = malloc(n * sizeof *keys);
    const json_t **vals = malloc(n * sizeof *vals);
    if (keys == NULL || vals == NULL) {
        free(keys);
        free(vals);
        gb_fail(b, "properties", path, "out of memory");
        return gb_none(b);
    }
    const char *key;
    const json_t *val;
    size_t k = 0;
    json_object_foreach((json_t *)props, key, val)
    {
        keys[k] = key;
        vals[k++] = val;
    }
    size_t written = 0; /* properties not false */
    for (size_t j = n; j-- > 0 && !b->failed;) {
        int required = 0;
        json_array_foreach(req, i, one) required |= strcmp(json_string_value(one), keys[j]) == 0;
        char pp[256];
        char pq[256];
        gs_subpath(pq, sizeof pq, path, "properties");
        gs_subpath(pp, sizeof pp, pq, keys[j]);
        if (json_is_false(vals[j])) { /* forbidden: never written */
            if (required)
                gb_fail(b, "required", pp,
                        "required property %.60s has the schema false: no object satisfies it",
                        keys[j]);
            continue;
        }
        written++;
        json_t *ks = json_string(keys[j]);
        frag kv = gs_json_lit(c, ks, pp, "properties");
        json_decref(ks);
        kv = gb_seq(b, gb_seq(b, kv, gb_byte(b, ':')), gb_call(b, sub_rule(c, vals[j], pp)));
        gb_patch(b, kv.e, b_next);
        frag comma = gb_byte(b, ',');
        gb_patch(b, comma.e, kv.s);
        int32_t na = gb_node(b, GN_EPS, kv.s, required ? -1 : a_next);
        int32_t nb = gb_node(b, GN_EPS, comma.s, required ? -1 : b_next);
        a_next = na;
        b_next = nb;
    }
    free(keys);
    free(vals);
    if (written == 0) return gb_lit(b, "{}", 2); /* the declared ones forbidden, no others */
    frag open = gb_byte(b, '{');
    gb_patch(b, open.e, a_next);
    return (frag){open.s, close.e};
}

static frag sch_array(gs_ctx *c, const json_t *s, const char *path)
{
    gb *b = c->b;
    const json_t *items = json_object_get(s, "items"), *pre = json_object_get(s, "prefixItems");
    char p[256];
    long long lo, hi;
    if (count_bounds(c, s, path, "minItems", "maxItems", &lo, &hi) != 0) return gb_none(b);
    if (pre != NULL && (!json_is_array(pre) || json_array_size(pre) > GB_MAX_COUNT)) {
        gs_subpath(p, sizeof p, path, "prefixItems");
        gb_fail(b, "prefixItems", p, "'prefixItems' must be an array (of at most %d)",
                GB_MAX_COUNT);
        return gb_none(b);
    }
    if (items != NULL && json_is_array(items)) {
        gs_subpath(p, sizeof p, path, "items");
        gb_fail(b, "items", p, "'items' as an array is draft 4's tuple form; use 'prefixItems'");
        return gb_none(b);
    }
    size_t np = pre ? json_array_size(pre) : 0;
    int no_more = json_is_false(items);
    if (no_more && (hi < 0 || (size_t)hi > np)) hi = (long long)np;
    if (!count_max_ok(c, path, "maxItems", hi)) return gb_none(b);
    if (lo > hi && hi >= 0) {
        gs_subpath(p, sizeof p, path, "minItems");
        gb_fail(b, "minItems", p, "'minItems' asks for more items than the array may hold");
        return gb_none(b);
    }
    int32_t item_rule = -1;
    if (!no_more) {
        gs_subpath(p, sizeof p, path, "items");
        item_rule = items ? sub_rule(c, items, p) : generic_rule(c, &c->r_value);
    }
    /* Positions 0 .. L-1 written out (mandatory below minItems, optional
     * after: leaving one out closes the array), then, unbounded, a loop. */
    size_t L = (size_t)(hi >= 0 ? hi : (lo > (long long)np ? lo : (long long)np));
    frag close = gb_byte(b, ']');
    int32_t next = close.s;
    if (hi < 0) { /* (, item)* then ] */
        frag loop = gb_star(b, gb_seq(b, gb_byte(b, ','), gb_call(b, item_rule)));
        gb_patch(b, loop.e, close.s);
        next = loop.s;
    }
    for (size_t j = L; j-- > 0 && !b->failed;) {
        int32_t r;
        if (j < np) {
            char pp[256];
            char pq[256];
            gs_subpath(pq, sizeof pq, path, "prefixItems");
            subpath_index(pp, sizeof pp, pq, j);
            r = sub_rule(c, json_array_get(pre, j), pp);
        } else
            r = item_rule;
        frag el = gb_call(b, r);
        if (j > 0) el = gb_seq(b, gb_byte(b, ','), el);
        gb_patch(b, el.e, next);
        next = (long long)j < lo ? el.s : gb_node(b, GN_EPS, el.s, close.s);
    }
    if (L == 0 && hi < 0) { /* [] or [item (, item)*] */
        frag first = gb_call(b, item_rule);
        gb_patch(b, first.e, next);
        next = gb_node(b, GN_EPS, first.s, close.s);
    }
    frag open = gb_byte(b, '[');
    gb_patch(b, open.e, next);
    return (frag){open.s, close.e};
}

static frag sch_type(gs_ctx *c, const json_t *s, const char *t, const char *path)
{
    gb *b = c->b;
    if (strcmp(t, "object") == 0) return sch_object(c, s, path);
    if (strcmp(t, "array") == 0) return sch_array(c, s, path);
    if (strcmp(t, "string") == 0) return sch_string(c, s, path);
    if (strcmp(t, "number") == 0) return sch_number(c, s, path, 0);
    if (strcmp(t, "integer") == 0) return sch_number(c, s, path, 1);
    if (strcmp(t, "boolean") == 0) return gb_alt(b, gb_lit(b, "true", 4), gb_lit(b, "false", 5));
    if (strcmp(t, "null") == 0) return gb_lit(b, "null", 4);
    char p[256];
    gs_subpath(p, sizeof p, path, "type");
    gb_fail(b, "type", p, "unknown type '%.40s'", t);
    return gb_none(b);
}

static frag sch(gs_ctx *c, const json_t *s, const char *path)
{
    gb *b = c->b;
    if (b->failed) return gb_none(b);
    if (json_is_true(s)) return f_generic(c, &c->r_value);
    if (json_is_false(s)) {
        gb_fail(b, "false", path, "the schema false accepts nothing");
        return gb_none(b);
    }
    if (!json_is_object(s)) {
        gb_fail(b, "", path, "a schema must be an object or a boolean");
        return gb_none(b);
    }
    if (++c->depth > GRAM_MAX_DEPTH) {
        gb_fail(b, "", path, "schemas nested deeper than %d", GRAM_MAX_DEPTH);
        return gb_none(b);
    }
    const char *key;
    const json_t *val;
    int constraining = 0;
    char p[256];
    json_object_foreach((json_t *)s, key, val)
    {
        if (!known(key)) {
            gs_subpath(p, sizeof p, path, key);
            gb_fail(b, key, p, "keyword '%.60s' is outside the supported subset (docs/api.md)",
                    key);
            c->depth--;
            return gb_none(b);
        }
        constraining += !annotation(key);
    }
    frag f;
    const json_t *ref = json_object_get(s, "$ref");
    const json_t *any = json_object_get(s, "anyOf");
    if (any == NULL) any = json_object_get(s, "oneOf");
    const json_t *all = json_object_get(s, "allOf");
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    const json_t *type = json_object_get(s, "type");
    if (ref != NULL || any != NULL || all != NULL) {
        const char *kw = ref                           ? "$ref"
                         : all                         ? "allOf"
                         : json_object_get(s, "anyOf") ? "anyOf"
                                                       : "oneOf";
        gs_subpath(p, sizeof p, path, kw);
        if (constraining != 1) {
            gb_fail(b, kw, p, "'%s' beside other constraining keywords is outside the subset", kw);
            c->depth--;
            return gb_none(b);
        }
        if (ref != NULL) {
            const char *r = json_string_value(ref);
            if (r == NULL || gs_resolve(c->root, r) == NULL) {
                gb_fail(b, "$ref", p, "'$ref' must name a schema of this document ('#/$defs/...')");
                c->depth--;
                return gb_none(b);
            }
            f = gb_call(b, ref_rule(c, r, p));
        } else {
            const json_t *arr = ref == NULL && all != NULL ? all : any;
            if (!json_is_array(arr) || json_array_size(arr) == 0
                || (all != NULL && json_array_size(arr) != 1)) {
                gb_fail(b, kw, p,
                        all != NULL ? "'allOf' of exactly one schema is the subset"
                                    : "'%s' must be a non-empty array",
                        kw);
                c->depth--;
                return gb_none(b);
            }
            if (all == NULL && json_object_get(s, "anyOf") == NULL && !gs_one_of_ok(c, arr, p)) {
                c->depth--;
                return gb_none(b);
            }
            size_t i;
            const json_t *one;
            f = gb_none(b);
            size_t taken = 0;
            json_array_foreach(arr, i, one)
            {
                char pp[256];
                subpath_index(pp, sizeof pp, p, i);
                if (json_is_false(one) && json_array_size(arr) > 1) continue; /* never chosen */
                f = taken++ == 0 ? sch(c, one, pp) : gb_alt(b, f, sch(c, one, pp));
            }
            if (taken == 0) gb_fail(b, kw, p, "every branch is the schema false");
        }
    } else if (en != NULL || cn != NULL) {
        f = gs_enum(c, s, path);
    } else if (type != NULL) {
        gs_subpath(p, sizeof p, path, "type");
        if (json_is_string(type))
            f = sch_type(c, s, json_string_value(type), path);
        else if (json_is_array(type) && json_array_size(type) > 0) {
            size_t i;
            const json_t *one;
            f = gb_none(b);
            json_array_foreach(type, i, one)
            {
                if (!json_is_string(one)) {
                    gb_fail(b, "type", p, "'type' must be a string or an array of strings");
                    break;
                }
                f = gb_alt(b, f, sch_type(c, s, json_string_value(one), path));
            }
        } else {
            gb_fail(b, "type", p, "'type' must be a string or an array of strings");
            f = gb_none(b);
        }
    } else if (json_object_get(s, "properties") || json_object_get(s, "required")
               || json_object_get(s, "additionalProperties"))
        f = sch_object(c, s, path);
    else if (json_object_get(s, "items") || json_object_get(s, "prefixItems")
             || json_object_get(s, "minItems") || json_object_get(s, "maxItems"))
        f = sch_array(c, s, path);
    else if (json_object_get(s, "pattern") || json_object_get(s, "format")
             || json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
        f = sch_string(c, s, path);
    else if (json_object_get(s, "minimum") || json_object_get(s, "maximum")
             || json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum"))
        f = sch_number(c, s, path, 0);
    else
        f = f_generic(c, &c->r_value);
    c->depth--;
    return f;
}

/* ---- Entries ------------------------------------------------------------------- */

frag gb_schema(gb *b, const json_t *doc, const json_t *at, long *work, gs_compile_fn compile)
{
    gs_ctx c = {.b = b,
                .compile = compile,
                .root = doc,
                .r_value = -1,
                .r_object = -1,
                .r_array = -1,
                .r_string = -1,
                .work = work != NULL ? *work : ONEOF_WORK};
    frag f = sch(&c, at, "#");
    /* referenced schemas, each once (a reference may add others) */
    for (size_t i = 0; i < c.nrefs && !b->failed; i++) {
        const json_t *t = gs_resolve(doc, c.refs[i].ref);
        frag rf = sch(&c, t, c.refs[i].ref);
        gb_rule_set(b, c.refs[i].rule, rf);
    }
    for (size_t i = 0; i < c.nrefs; i++) free(c.refs[i].ref);
    if (work != NULL) *work = c.work;
    return f;
}

frag gb_json_object(gb *b)
{
    gs_ctx c = {.b = b, .r_value = -1, .r_object = -1, .r_array = -1, .r_string = -1};
    return f_generic(&c, &c.r_object);
}
