/*
 * structured/schema_values.c: the checks on values a schema lists. enum and
 * const are written only for the values that satisfy their sibling
 * keywords (type, lengths, bounds and counts read directly; pattern,
 * format and the object and array keywords by a sub-schema compiled and
 * run on the value's text), and a oneOf is taken only when no value can
 * satisfy two of its branches (different JSON types, listed values none
 * shared, or a required property's listed values none shared: the
 * discriminated union), proved within ONEOF_WORK steps a schema.
 */
#include "structured.h"
#include "schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* ---- enum and const beside other keywords -------------------------------------- */

/* Equal as JSON Schema counts it: 1 and 1.0 are one number, at any depth. */
static int same_value(const json_t *x, const json_t *y)
{
    if (json_is_number(x) && json_is_number(y)) return json_number_value(x) == json_number_value(y);
    if (json_is_array(x) && json_is_array(y)) {
        if (json_array_size(x) != json_array_size(y)) return 0;
        for (size_t i = 0; i < json_array_size(x); i++)
            if (!same_value(json_array_get(x, i), json_array_get(y, i))) return 0;
        return 1;
    }
    if (json_is_object(x) && json_is_object(y)) {
        if (json_object_size(x) != json_object_size(y)) return 0;
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)x, k, v)
        {
            const json_t *w = json_object_get(y, k);
            if (w == NULL || !same_value(v, w)) return 0;
        }
        return 1;
    }
    return json_equal(x, y);
}

/* A string's length in code points (JSON Schema's minLength counts them). */
static size_t cp_len(const json_t *v)
{
    const unsigned char *t = (const unsigned char *)json_string_value(v);
    size_t n = 0, len = json_string_length(v);
    for (size_t i = 0; i < len; i++) n += (t[i] & 0xC0) != 0x80;
    return n;
}

/* The keywords an enum or const value is checked against by a compiled
 * sub-schema, by the JSON type they apply to; NULL-ended. */
static const char *const chk_string[] = {"pattern", "format", NULL};
static const char *const chk_object[] = {"properties", "required", "additionalProperties", NULL};
static const char *const chk_array[] = {"items", "prefixItems", NULL};

/* The checkers of one enum or const: a grammar of {"type": T, those keys}
 * per type T, compiled when a value of T comes (NULL: none of its keys). */
typedef struct {
    gram *g[3];
    int tried[3];
    gram_vocab *v;
} checkers;

static void checkers_free(checkers *k)
{
    for (int i = 0; i < 3; i++) gram_unref(k->g[i]);
    gram_vocab_free(k->v);
}

/* 1 when value v (compact text t) passes the keywords of kind i of schema s
 * (kinds: 0 string, 1 object, 2 array); 0 not; -1 refused (failed). */
static int checker_run(gs_ctx *c, checkers *k, int i, const json_t *s, const char *t,
                       const char *path)
{
    static const char *const *const keys[] = {chk_string, chk_object, chk_array};
    static const char *const type[] = {"string", "object", "array"};
    if (!k->tried[i]) {
        k->tried[i] = 1;
        json_t *sub = json_object();
        int any = 0;
        for (const char *const *kw = keys[i]; *kw != NULL; kw++) {
            json_t *x = json_object_get(s, *kw);
            if (x != NULL) {
                json_object_set(sub, *kw, x);
                any = 1;
            }
        }
        if (any) {
            json_object_set_new(sub, "type", json_string(type[i]));
            gram_error e = {0};
            if (k->v == NULL
                && gram_vocab_new((const char *const[]){"a"}, (const size_t[]){1}, 1, -1, &k->v)
                       != 0) {
                json_decref(sub);
                gb_fail(c->b, "enum", path, "out of memory");
                return -1;
            }
            /* in this document: its $refs resolve, its oneOfs draw on this budget */
            int rc = c->compile(c->root, sub, &c->work, &k->g[i], &e);
            json_decref(sub);
            if (rc != 0) {
                char where[256]; /* the sub-schema's keys sit where they sit in s */
                snprintf(where, sizeof where, "%s%s", path, e.path + (e.path[0] == '#'));
                gb_fail(c->b, e.keyword, where,
                        "beside 'enum' or 'const', the %s keywords must compile alone: %.300s",
                        type[i], e.message);
                return -1;
            }
        } else
            json_decref(sub);
    }
    if (k->g[i] == NULL) return 1;
    gram_matcher *m = gram_matcher_new(k->g[i], k->v);
    if (m == NULL) {
        gb_fail(c->b, "enum", path, "out of memory");
        return -1;
    }
    int ok = gram_matcher_feed_bytes(m, t, strlen(t)) == 0 && gram_matcher_accepting(m);
    gram_matcher_free(m);
    return ok;
}

/* 1 when the value v of an enum or const satisfies schema s's other
 * keywords (type, lengths, bounds, counts exactly; pattern, format and the
 * object and array keywords by a compiled sub-schema, so a value the subset
 * would not write is left out too); 0 not; -1 refused. */
static int value_ok(gs_ctx *c, checkers *k, const json_t *s, const json_t *v, const char *path)
{
    if (!gs_type_allows(json_object_get(s, "type"), v)) return 0;
    const json_t *x;
    if (json_is_string(v)) {
        size_t n = cp_len(v);
        if ((x = json_object_get(s, "minLength")) != NULL && json_is_number(x)
            && (double)n < json_number_value(x))
            return 0;
        if ((x = json_object_get(s, "maxLength")) != NULL && json_is_number(x)
            && (double)n > json_number_value(x))
            return 0;
    } else if (json_is_number(v)) {
        double d = json_number_value(v);
        if ((x = json_object_get(s, "minimum")) != NULL && json_is_number(x)
            && d < json_number_value(x))
            return 0;
        if ((x = json_object_get(s, "maximum")) != NULL && json_is_number(x)
            && d > json_number_value(x))
            return 0;
        if ((x = json_object_get(s, "exclusiveMinimum")) != NULL && json_is_number(x)
            && d <= json_number_value(x))
            return 0;
        if ((x = json_object_get(s, "exclusiveMaximum")) != NULL && json_is_number(x)
            && d >= json_number_value(x))
            return 0;
        return 1;
    } else if (json_is_array(v)) {
        double n = (double)json_array_size(v);
        if ((x = json_object_get(s, "minItems")) != NULL && json_is_number(x)
            && n < json_number_value(x))
            return 0;
        if ((x = json_object_get(s, "maxItems")) != NULL && json_is_number(x)
            && n > json_number_value(x))
            return 0;
    }
    int kind = json_is_string(v) ? 0 : json_is_object(v) ? 1 : json_is_array(v) ? 2 : -1;
    if (kind < 0) return 1;
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (t == NULL) {
        gb_fail(c->b, "enum", path, "out of memory");
        return -1;
    }
    for (size_t i = 0; t[i] != '\0'; i++) /* \u001F as the grammar writes it, \u001f */
        if (t[i] == '\\' && t[++i] == 'u')
            for (size_t j = 1; j <= 4 && t[i + j] != '\0'; j++)
                if (t[i + j] >= 'A' && t[i + j] <= 'F') t[i + j] = (char)(t[i + j] | 0x20);
    int r = checker_run(c, k, kind, s, t, path);
    free(t);
    return r;
}

/* enum and const: the values that satisfy the schema's other keywords,
 * each written as a literal; none left is refused. */
frag gs_enum(gs_ctx *c, const json_t *s, const char *path)
{
    gb *b = c->b;
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    const char *kw = en ? "enum" : "const";
    char p[256];
    gs_subpath(p, sizeof p, path, kw);
    if (en != NULL && (!json_is_array(en) || json_array_size(en) > GB_MAX_ENUM)) {
        gb_fail(b, kw, p, "'enum' must be an array of at most %d values", GB_MAX_ENUM);
        return gb_none(b);
    }
    static const char *const counts[] = {"minLength", "maxLength", "minItems", "maxItems"};
    static const char *const bounds[] = {"minimum", "maximum", "exclusiveMinimum",
                                         "exclusiveMaximum"};
    for (size_t i = 0; i < 4; i++) {
        const json_t *x = json_object_get(s, counts[i]), *y = json_object_get(s, bounds[i]);
        if (x != NULL && (!json_is_integer(x) || json_integer_value(x) < 0)) {
            gs_subpath(p, sizeof p, path, counts[i]);
            gb_fail(b, counts[i], p, "'%s' must be an integer >= 0", counts[i]);
            return gb_none(b);
        }
        if (y != NULL && !json_is_number(y)) {
            gs_subpath(p, sizeof p, path, bounds[i]);
            gb_fail(b, bounds[i], p, "'%s' must be a number", bounds[i]);
            return gb_none(b);
        }
    }
    checkers k = {0};
    frag f = gb_none(b);
    size_t n = 0;
    for (size_t i = 0; i < (en ? json_array_size(en) : 1) && !b->failed; i++) {
        const json_t *one = en ? json_array_get(en, i) : cn;
        if (en != NULL && cn != NULL && !same_value(cn, one)) continue;
        int ok = value_ok(c, &k, s, one, path);
        if (ok <= 0) continue;
        f = gb_alt(b, f, gs_json_lit(c, one, p, kw));
        n++;
    }
    checkers_free(&k);
    if (n == 0 && !b->failed)
        gb_fail(b, kw, p,
                "no value of '%s' satisfies the schema's other keywords: no output satisfies it",
                kw);
    return f;
}

/* ---- oneOf: branches no value satisfies twice ------------------------------- */

/* Follows $ref and a one-schema allOf to the schema that says something
 * (at most 16 steps; NULL when it does not get there). */
static const json_t *deref(const gs_ctx *c, const json_t *s)
{
    for (int k = 0; k < 16 && json_is_object(s); k++) {
        const json_t *r = json_object_get(s, "$ref"), *all = json_object_get(s, "allOf");
        if (json_is_string(r) && c->root != NULL)
            s = gs_resolve(c->root, json_string_value(r));
        else if (json_is_array(all) && json_array_size(all) == 1)
            s = json_array_get(all, 0);
        else
            return s;
    }
    return json_is_object(s) || json_is_boolean(s) ? s : NULL;
}

enum {
    K_NULL = 1,
    K_BOOL = 2,
    K_OBJECT = 4,
    K_ARRAY = 8,
    K_STRING = 16,
    K_NUMBER = 32,
    K_ALL = 63
};

static unsigned kind_of_name(const char *t)
{
    static const char *const names[] = {"null",   "boolean", "object", "array",
                                        "string", "number",  "integer"};
    for (unsigned i = 0; i < 7; i++)
        if (t != NULL && strcmp(t, names[i]) == 0) return 1u << (i < 6 ? i : 5);
    return K_ALL;
}

static unsigned kind_of_value(const json_t *v)
{
    return kind_of_name(gs_type_of(v));
}

/* The JSON types a value valid under s may have (a superset); at most
 * *budget schemas looked at (a self-referring anyOf would branch without
 * end), then all types. */
static unsigned kinds(const gs_ctx *c, const json_t *s, int depth, long *budget)
{
    s = deref(c, s);
    if (s == NULL || json_is_true(s) || depth > 16 || --*budget < 0) return K_ALL;
    if (json_is_false(s)) return 0;
    const json_t *t = json_object_get(s, "type"), *en = json_object_get(s, "enum"),
                 *cn = json_object_get(s, "const"), *any = json_object_get(s, "anyOf");
    if (any == NULL) any = json_object_get(s, "oneOf");
    unsigned k = K_ALL;
    size_t i;
    const json_t *one;
    if (json_is_string(t))
        k = kind_of_name(json_string_value(t));
    else if (json_is_array(t)) {
        k = 0;
        json_array_foreach(t, i, one) k |= kind_of_name(json_string_value(one));
    }
    if (cn != NULL) k &= kind_of_value(cn);
    if (json_is_array(en)) {
        unsigned e = 0;
        json_array_foreach(en, i, one) e |= kind_of_value(one);
        k &= e;
    }
    if (json_is_array(any)) {
        unsigned a = 0;
        json_array_foreach(any, i, one) a |= kinds(c, one, depth + 1, budget);
        k &= a;
    }
    return k;
}

/* The values s allows when it lists them (enum, const): 1 (in *en, or
 * *cn), else 0. */
static int listed(const gs_ctx *c, const json_t *s, const json_t **en, const json_t **cn)
{
    s = deref(c, s);
    if (!json_is_object(s)) return 0;
    *cn = json_object_get(s, "const");
    *en = json_object_get(s, "enum");
    if (*cn == NULL && !json_is_array(*en)) return 0;
    if (*cn != NULL) *en = NULL;
    return 1;
}

/* Whether x and y list a value in common (*known: both list theirs); past
 * the work bound, yes. */
static int lists_meet(const gs_ctx *c, const json_t *x, const json_t *y, int *known, long *work)
{
    const json_t *xe, *xc, *ye, *yc;
    *known = listed(c, x, &xe, &xc) && listed(c, y, &ye, &yc);
    if (!*known) return 1;
    for (size_t i = 0; i < (xe ? json_array_size(xe) : 1); i++)
        for (size_t j = 0; j < (ye ? json_array_size(ye) : 1); j++)
            if (--*work < 0
                || same_value(xe ? json_array_get(xe, i) : xc, ye ? json_array_get(ye, j) : yc))
                return 1;
    return 0;
}

static int required_has(const json_t *s, const char *key)
{
    size_t i;
    const json_t *one;
    json_array_foreach(json_object_get(s, "required"), i, one)
    {
        if (json_is_string(one) && strcmp(json_string_value(one), key) == 0) return 1;
    }
    return 0;
}

/* Whether no value satisfies both x and y: different JSON types, listed
 * values none shared, or objects that both require a property whose
 * listed values none shared (a discriminated union). */
static int disjoint(const gs_ctx *c, const json_t *x, const json_t *y, unsigned kx, unsigned ky,
                    long *work)
{
    if ((kx & ky) == 0) return 1;
    int known;
    if (!lists_meet(c, x, y, &known, work) && known) return 1;
    x = deref(c, x);
    y = deref(c, y);
    const json_t *xp = json_is_object(x) ? json_object_get(x, "properties") : NULL;
    const json_t *yp = json_is_object(y) ? json_object_get(y, "properties") : NULL;
    if (!json_is_object(xp) || !json_is_object(yp)) return 0;
    const char *key;
    const json_t *xv;
    json_object_foreach((json_t *)xp, key, xv)
    {
        const json_t *yv = json_object_get(yp, key);
        if (--*work < 0) return 0;
        if (yv == NULL || !required_has(x, key) || !required_has(y, key)) continue;
        if (!lists_meet(c, xv, yv, &known, work) && known) return 1;
    }
    return 0;
}

/* Refuses a oneOf whose branches a value might satisfy two of (the
 * grammar writes one branch; oneOf asks that no other matches). */
int gs_one_of_ok(gs_ctx *c, const json_t *arr, const char *p)
{
    size_t n = json_array_size(arr);
    unsigned *k = malloc(n * sizeof *k);
    if (k == NULL) {
        gb_fail(c->b, "oneOf", p, "out of memory");
        return 0;
    }
    for (size_t i = 0; i < n && c->work >= 0; i++) { /* each branch's types, 512 schemas at most */
        long budget = 512;
        k[i] = kinds(c, json_array_get(arr, i), 0, &budget);
        c->work -= 512 - (budget > 0 ? budget : 0);
    }
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (--c->work < 0
                || !disjoint(c, json_array_get(arr, i), json_array_get(arr, j), k[i], k[j],
                             &c->work)) {
                free(k);
                if (c->work < 0) {
                    gb_fail(c->b, "oneOf", p,
                            "'oneOf' too large to prove its branches apart (the schema's oneOfs "
                            "take at most %d steps); use 'anyOf'",
                            ONEOF_WORK);
                    return 0;
                }
                gb_fail(c->b, "oneOf", p,
                        "'oneOf' branches %zu and %zu may both match one value (this subset takes "
                        "oneOf only when its branches differ in JSON type, in listed values, or "
                        "in a required property's const or enum); use 'anyOf'",
                        i, j);
                return 0;
            }
    free(k);
    return 1;
}
