/*
 * structured/automaton.h: the compiled grammar's layout, shared by the
 * compiler (compile.c and the files of build.h), the matcher (match.c)
 * and the cache; its lifetime in automaton.c. Internal.
 *
 * The module's files call one way (tests/check_modules.py proves it):
 * cache.c -> compile.c -> schema.c -> schema_values.c -> schema_read.c,
 * and below them regex.c -> build.c; compile.c and schema_values.c run
 * match.c (the matcher, the vocabulary trie), and every holder of a gram
 * calls automaton.c (its lifetime), the lowest. The enum checks compile
 * sub-schemas through a pointer compile.c hands down (schema.h,
 * gs_compile_fn), not by name.
 */
#ifndef GPT2D_STRUCTURED_AUTOMATON_H
#define GPT2D_STRUCTURED_AUTOMATON_H

#include "structured.h"

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
    /* What the arrays above and this record take, as allocated (the
     * builder's arrays keep their doubled capacity): gram_bytes. */
    size_t bytes;
};

/* Explores g's matcher from its start, byte class by byte class, largest
 * state first, within a budget of work (match.c): 1 when some
 * state passes GRAM_MAX_THREADS (a prefix leads there), 0 when none was
 * found (the whole automaton seen, or the budget spent: inconclusive), -1
 * out of memory. *max_threads: the largest state seen. */
int gram_explore(gram *g, size_t *max_threads);

#endif
