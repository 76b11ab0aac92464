/*
 * structured/schema_read.c: readers of a JSON Schema document that the
 * schema walker (schema.c) and the checks on listed values
 * (schema_values.c) both use: paths for error messages, a value's JSON
 * Schema type, local $ref resolution and a value's text as a literal.
 * Below both, so that neither calls into the other's helpers.
 */
#include "schema.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* path + "/" + key into out (cut to cap - 1 bytes). */
void gs_subpath(char *out, size_t cap, const char *path, const char *key)
{
    size_t n = 0;
    for (const char *s = path; *s != '\0' && n + 1 < cap; s++) out[n++] = *s;
    if (n + 1 < cap) out[n++] = '/';
    for (const char *s = key; *s != '\0' && n + 1 < cap; s++) out[n++] = *s;
    out[n] = '\0';
}

/* A JSON value's compact text as a literal. */
frag gs_json_lit(gs_ctx *c, const json_t *v, const char *path, const char *kw)
{
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (t == NULL) {
        gb_fail(c->b, kw, path, "out of memory");
        return gb_none(c->b);
    }
    frag f = gb_lit(c->b, t, strlen(t));
    free(t);
    return f;
}

const char *gs_type_of(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    default: return "null";
    }
}

/* Whether value v is of type name s: an integer is a number, and a number
 * with no fraction (1.0) an integer, as JSON Schema counts them. */
static int is_type(const char *s, const json_t *v)
{
    const char *t = gs_type_of(v);
    if (strcmp(s, t) == 0) return 1;
    if (strcmp(s, "number") == 0) return strcmp(t, "integer") == 0;
    if (strcmp(s, "integer") == 0 && json_is_real(v)) {
        double x = json_real_value(v);
        return isfinite(x) && x == floor(x);
    }
    return 0;
}

/* Whether value v is of one of the schema's types (no type: yes). */
int gs_type_allows(const json_t *types, const json_t *v)
{
    if (types == NULL) return 1;
    const json_t *one;
    size_t i;
    if (json_is_string(types)) return is_type(json_string_value(types), v);
    json_array_foreach(types, i, one)
    {
        const char *s = json_string_value(one);
        if (s != NULL && is_type(s, v)) return 1;
    }
    return 0;
}

/* The schema a local reference names: "#", "#/$defs/x", "#/definitions/x"
 * or any JSON pointer into the document (~0 ~1 unescaped). */
const json_t *gs_resolve(const json_t *root, const char *ref)
{
    if (ref[0] != '#') return NULL;
    const json_t *at = root;
    const char *p = ref + 1;
    while (*p == '/' && at != NULL) {
        p++;
        char key[256];
        size_t k = 0;
        while (*p != '\0' && *p != '/' && k + 1 < sizeof key) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
                key[k++] = p[1] == '0' ? '~' : '/';
                p += 2;
            } else
                key[k++] = *p++;
        }
        key[k] = '\0';
        if (json_is_object(at))
            at = json_object_get(at, key);
        else if (json_is_array(at)) {
            char *end;
            unsigned long idx = strtoul(key, &end, 10);
            at = *end == '\0' ? json_array_get(at, idx) : NULL;
        } else
            at = NULL;
    }
    return *p == '\0' ? at : NULL;
}
