/*
 * structured/build.h: what the structured-outputs compiler's files
 * share (gb_): the builder of the recursive transition network
 * (build.c) and the two front ends that drive it, the regex subset
 * (regex.c) and the JSON Schema walker (schema.c);
 * compile.c checks the finished automaton and owns the compile. Internal.
 *
 * A build is one gb on the caller's stack. Every call takes it and, once
 * it has failed (b->failed, the message in *b->err), does nothing harmful:
 * nodes go to the dead sink, node 0, so the front ends need not check
 * after every call. Thread: a gb belongs to one thread.
 */
#ifndef GPT2D_STRUCTURED_BUILD_H
#define GPT2D_STRUCTURED_BUILD_H

#include "automaton.h"

#include <stddef.h>
#include <stdint.h>

/* The largest count the front ends write out: a regex {m,n}, minLength and
 * maxLength, minItems and maxItems, prefixItems. */
#define GB_MAX_COUNT 1000
/* The most values an enum or a guided_choice may list. */
#define GB_MAX_ENUM 4096

/* The automaton under construction: the arrays a gram takes over. */
typedef struct {
    gnode *n;
    size_t nn, ncap;
    uint64_t (*c)[4]; /* byte classes, 256 bits each */
    size_t nc, ccap;
    int32_t *rs; /* rule starts (-1: not set yet) */
    size_t nr, rcap;
    gram_error *err; /* borrowed: where the first failure is written */
    int failed;
} gb;

/* A fragment of Thompson's construction: one entry, one open exit. */
typedef struct {
    int32_t s, e; /* entry; open exit (an EPS node whose a is -1) */
} frag;

/* Errors: the first failure's keyword, path and message go to *b->err;
 * later ones are dropped. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
void gb_fail(gb *b, const char *kw, const char *path, const char *fmt, ...);

/* Nodes, classes, rules. gb_node fails past GRAM_MAX_NODES; a class equal
 * to a recent one is shared. gb_patch points an open exit at a node. */
int32_t gb_node(gb *b, uint8_t kind, int32_t a, int32_t x);
int32_t gb_class(gb *b, const uint64_t set[4]);
void gb_patch(gb *b, int32_t e, int32_t to);
int32_t gb_rule_new(gb *b);
void gb_rule_set(gb *b, int32_t r, frag f); /* ends f with the rule's END */
/* Frees the arrays (those a gram has not taken over). */
void gb_free(gb *b);

/* Fragments. gb_none passes nothing; gb_call calls rule. */
void gb_set_range(uint64_t set[4], unsigned lo, unsigned hi);
frag gb_eps(gb *b);
frag gb_range(gb *b, unsigned lo, unsigned hi);
frag gb_byte(gb *b, unsigned c);
frag gb_none(gb *b);
frag gb_lit(gb *b, const char *s, size_t n);
frag gb_seq(gb *b, frag x, frag y);
frag gb_alt(gb *b, frag x, frag y);
frag gb_opt(gb *b, frag x);
frag gb_star(gb *b, frag x);
frag gb_plus(gb *b, frag x);
frag gb_call(gb *b, int32_t rule);

/* Characters. gb_chars: one character of the ASCII set ascii (bits of
 * 0..127), plus every non-ASCII one when nonascii; inside a JSON string
 * (json) what JSON escapes is written escaped. gb_char_lit: one
 * character's bytes s[0..n), escaped for JSON when json. */
frag gb_chars(gb *b, const uint64_t ascii[2], int nonascii, int json);
frag gb_char_lit(gb *b, const unsigned char *s, size_t n, int json);

/* The regex front end (regex.c), which the schema walker uses too: the
 * regex p[0..n) matching the whole output (json: inside a JSON string); a
 * refusal names kw and path. The schema walker's entry points are in
 * schema.h. */
frag gb_regex(gb *b, const char *p, size_t n, int json, const char *kw, const char *path);

#define INT_LIMIT 9999999999999999LL /* 16 digits: the generated integers' bound */

/* Integers in [lo, hi] (either sign), written without leading zeros;
 * gb_uint_range for 0 <= lo <= hi. */
frag gb_uint_range(gb *b, long long lo, long long hi);
frag gb_int_range(gb *b, long long lo, long long hi);

#endif
