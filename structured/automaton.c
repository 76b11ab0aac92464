/*
 * structured/automaton.c: a compiled grammar's lifetime (automaton.h):
 * shared by reference count, freed with its last reference. The lowest
 * file of the module: the compiler hands a gram over, the matcher and the
 * cache hold references.
 */
#include "automaton.h"

#include <stdlib.h>

gram *gram_ref(gram *g)
{
    atomic_fetch_add(&g->refs, 1);
    return g;
}

void gram_unref(gram *g)
{
    if (g == NULL || atomic_fetch_sub(&g->refs, 1) != 1) return;
    free(g->n);
    free(g->cls);
    free(g->rule_start);
    free(g->live);
    free(g);
}

size_t gram_nodes(const gram *g)
{
    return g->nn;
}

size_t gram_bytes(const gram *g)
{
    return g->bytes;
}
