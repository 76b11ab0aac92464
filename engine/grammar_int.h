/*
 * engine/grammar_int.h: the compiled grammar's layout, shared by the
 * compiler (grammar.c and the grammar_build.h files) and the matcher
 * (grammar_match.c). Internal.
 */
#ifndef GPT2D_ENGINE_GRAMMAR_INT_H
#define GPT2D_ENGINE_GRAMMAR_INT_H

#include "grammar.h"

#include <pthread.h>
#include <stdatomic.h>

/* Node kinds of the recursive transition network. */
enum {
    GN_BYTE = 0, /* a: class, b: next (taken on a byte of the class)       */
    GN_EPS = 1,  /* a, b: successors without input (-1: none)              */
    GN_CALL = 2, /* a: rule, b: where the rule returns to                  */
    GN_END = 3   /* a rule's end: return (the root's: the output is whole) */
};

typedef struct {
    uint8_t kind;
    int32_t a, b;
} gnode;

struct gram {
    atomic_size_t refs;
    gnode *n;
    size_t nn;
    uint64_t (*cls)[4]; /* byte classes, 256 bits each */
    size_t ncls;
    int32_t *rule_start;
    size_t nrules;
    int32_t root;
    uint8_t *live; /* per node: the rule's end is reachable from it */
};

/* Explores g's matcher from its start, byte class by byte class, largest
 * state first, within a budget of work (grammar_match.c): 1 when some
 * state passes GRAM_MAX_THREADS (a prefix leads there), 0 when none was
 * found (the whole automaton seen, or the budget spent: inconclusive), -1
 * out of memory. *max_threads: the largest state seen. */
int gram_explore(gram *g, size_t *max_threads);

#endif
