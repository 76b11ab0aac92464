/*
 * structured/schema.h: what the JSON Schema walker (schema.c)
 * shares with the checks on listed values (schema_values.c): the walk's
 * context and a few readers. Internal to those two files.
 */
#ifndef GPT2D_STRUCTURED_SCHEMA_H
#define GPT2D_STRUCTURED_SCHEMA_H

#include "build.h"

#include <jansson.h>

#define MAX_REFS 256
#define ONEOF_WORK (1 << 20) /* steps to prove every oneOf's branches apart */

/* A compile of the schema at of the parsed document doc (its $refs
 * resolved in doc), as gram_compile: what the checkers of enum values run
 * on a sub-schema. compile.c passes its own to gb_schema, so the walker
 * reaches the compiler above it only through this pointer (work as
 * gb_schema's). */
typedef int (*gs_compile_fn)(const json_t *doc, const json_t *at, long *work, gram **out,
                             gram_error *err);

/* One schema's walk. */
typedef struct {
    gb *b;
    const json_t *root;
    struct {
        char *ref;
        int32_t rule;
        int done;
    } refs[MAX_REFS];
    size_t nrefs;
    int32_t r_value, r_object, r_array, r_string; /* the generic JSON rules, -1 until used */
    int depth;
    long work; /* what proving oneOf's branches apart may still cost, for the whole schema */
    gs_compile_fn compile; /* the sub-schemas of enum checks (NULL: gb_json_object's walk) */
} gs_ctx;

/* The front ends (schema.c). gb_schema: the schema at of the JSON Schema
 * document doc (both borrowed; at is doc but for a checker), with a rule
 * for each schema it references; work: what proving oneOf's branches apart
 * may still cost, drawn on and written back (NULL: a fresh budget);
 * compile: how an enum's checker compiles a sub-schema. gb_json_object:
 * any JSON object (compact). */
frag gb_schema(gb *b, const json_t *doc, const json_t *at, long *work, gs_compile_fn compile);
frag gb_json_object(gb *b);

/* path + "/" + key into out (cut to cap - 1 bytes). */
void gs_subpath(char *out, size_t cap, const char *path, const char *key);
/* The JSON Schema type name of value v ("integer" for a whole number). */
const char *gs_type_of(const json_t *v);
/* Whether value v is of one of the schema's types (no type: yes). */
int gs_type_allows(const json_t *types, const json_t *v);
/* A JSON value's compact text as a literal (kw and path name it in errors). */
frag gs_json_lit(gs_ctx *c, const json_t *v, const char *path, const char *kw);
/* The schema a local reference names, or NULL. */
const json_t *gs_resolve(const json_t *root, const char *ref);

/* schema_values.c: enum and const, the values that satisfy schema s's
 * other keywords, as literals (none left: refused). */
frag gs_enum(gs_ctx *c, const json_t *s, const char *path);
/* schema_values.c: 1 when no value can satisfy two branches of the oneOf
 * array arr; else 0, refused (failed) naming them. */
int gs_one_of_ok(gs_ctx *c, const json_t *arr, const char *p);

#endif
