/*
 * structured/compile.c: structured outputs' compiler (structured.h). A JSON Schema
 * (subset, schema.c), a regex (subset, regex.c) or a list
 * of choices becomes a recursive transition network over bytes, built by
 * build.c; here the finished automaton is checked (every rule can
 * finish, no left recursion) and each node marked live when its rule's end
 * can still be reached, then handed over as a gram, shared by reference
 * count. Nothing backtracks: the matcher (match.c) runs every
 * thread of the NFA at once. Also the cache of compiled grammars, by
 * source.
 */
#include "schema.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Checks on the finished automaton -------------------------------------- */

/* Rules that can finish (some path to END through bytes and calls of
 * rules that can finish), by a fixed point. */
static int check_productive(gb *b, uint8_t *prod)
{
    int32_t *stack = malloc(b->nn * sizeof *stack);
    uint8_t *seen = malloc(b->nn);
    if (stack == NULL || seen == NULL) {
        free(stack);
        free(seen);
        return -1;
    }
    memset(prod, 0, b->nr);
    for (int changed = 1; changed;) {
        changed = 0;
        for (size_t r = 0; r < b->nr; r++) {
            if (prod[r] || b->rs[r] < 0) continue;
            memset(seen, 0, b->nn);
            size_t sp = 0;
            stack[sp++] = b->rs[r];
            seen[b->rs[r]] = 1;
            while (sp > 0 && !prod[r]) {
                const gnode *x = &b->n[stack[--sp]];
                int32_t next[2] = {-1, -1};
                if (x->kind == GN_END) prod[r] = 1;
                if (x->kind == GN_EPS) next[0] = x->a, next[1] = x->b;
                if (x->kind == GN_BYTE) {
                    const uint64_t *c = b->c[x->a];
                    if (c[0] | c[1] | c[2] | c[3]) next[0] = x->b;
                }
                if (x->kind == GN_CALL && prod[x->a]) next[0] = x->b;
                for (int k = 0; k < 2; k++)
                    if (next[k] >= 0 && !seen[next[k]]) {
                        seen[next[k]] = 1;
                        stack[sp++] = next[k];
                    }
            }
            changed |= prod[r];
        }
    }
    free(stack);
    free(seen);
    return 0;
}

/* Nodes from which their rule's end can be reached (through non-empty
 * bytes, epsilons and calls of rules that can finish): a breadth-first
 * walk back from every END over the reversed edges. The matcher keeps only
 * live threads, so every allowed prefix can still be completed (a property
 * whose schema can never finish is simply never begun). */
static uint8_t *live_nodes(gb *b, const uint8_t *prod)
{
    size_t n = b->nn;
    uint32_t *cnt = calloc(n + 1, sizeof *cnt), *pred = NULL, *queue = NULL;
    uint8_t *live = calloc(n, 1);
    if (cnt == NULL || live == NULL) goto oom;
    /* edges x -> y as (y's predecessors), counted then filled */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t x = 0; x < n; x++) {
            const gnode *g = &b->n[x];
            int32_t to[2] = {-1, -1};
            if (g->kind == GN_EPS) to[0] = g->a, to[1] = g->b;
            if (g->kind == GN_BYTE) {
                const uint64_t *c = b->c[g->a];
                if (c[0] | c[1] | c[2] | c[3]) to[0] = g->b;
            }
            if (g->kind == GN_CALL && prod[g->a]) to[0] = g->b;
            for (int k = 0; k < 2; k++) {
                if (to[k] < 0) continue;
                if (pass == 0)
                    cnt[to[k] + 1]++;
                else
                    pred[cnt[to[k]]++] = (uint32_t)x;
            }
        }
        if (pass == 0) {
            for (size_t i = 0; i < n; i++) cnt[i + 1] += cnt[i];
            pred = malloc((cnt[n] + 1) * sizeof *pred);
            queue = malloc(n * sizeof *queue);
            if (pred == NULL || queue == NULL) goto oom;
        }
    }
    /* after the fill, cnt[y] is the end of y's list; its start is cnt[y - 1] */
    size_t head = 0, tail = 0;
    for (size_t x = 0; x < n; x++)
        if (b->n[x].kind == GN_END) {
            live[x] = 1;
            queue[tail++] = (uint32_t)x;
        }
    while (head < tail) {
        uint32_t y = queue[head++];
        for (uint32_t i = y ? cnt[y - 1] : 0; i < cnt[y]; i++)
            if (!live[pred[i]]) {
                live[pred[i]] = 1;
                queue[tail++] = pred[i];
            }
    }
    free(cnt);
    free(pred);
    free(queue);
    return live;
oom:
    free(cnt);
    free(pred);
    free(queue);
    free(live);
    return NULL;
}

/* A rule that calls itself before reading a byte (left recursion) would
 * loop in the matcher's closure: refused. 1 if there is one. */
static int left_recursive(gb *b)
{
    /* edges: rule r -> rule q when r reaches a CALL q through epsilons */
    size_t nr = b->nr;
    uint8_t *reach = calloc(nr * nr, 1);
    int32_t *stack = malloc(b->nn * sizeof *stack);
    uint8_t *seen = malloc(b->nn);
    int bad = 0;
    if (reach == NULL || stack == NULL || seen == NULL) {
        bad = -1;
        goto out;
    }
    for (size_t r = 0; r < nr; r++) {
        if (b->rs[r] < 0) continue;
        memset(seen, 0, b->nn);
        size_t sp = 0;
        stack[sp++] = b->rs[r];
        seen[b->rs[r]] = 1;
        while (sp > 0) {
            const gnode *x = &b->n[stack[--sp]];
            if (x->kind == GN_CALL) reach[r * nr + (size_t)x->a] = 1;
            if (x->kind != GN_EPS) continue;
            int32_t next[2] = {x->a, x->b};
            for (int k = 0; k < 2; k++)
                if (next[k] >= 0 && !seen[next[k]]) {
                    seen[next[k]] = 1;
                    stack[sp++] = next[k];
                }
        }
    }
    /* transitive closure (rules are few: at most a few thousand) */
    for (size_t k = 0; k < nr && nr <= 4096; k++)
        for (size_t i = 0; i < nr; i++)
            if (reach[i * nr + k])
                for (size_t j = 0; j < nr; j++) reach[i * nr + j] |= reach[k * nr + j];
    for (size_t r = 0; r < nr; r++) bad |= reach[r * nr + r];
out:
    free(reach);
    free(stack);
    free(seen);
    return bad;
}

/* ---- Compile ---------------------------------------------------------------- */

/* An enum checker's sub-schema (schema.h, gs_compile_fn). */
static int compile_sub(const json_t *doc, const json_t *at, long *work, gram **out,
                       gram_error *err);

/* A source's compile (root_doc NULL), or, for the schema walker, the
 * schema at of the parsed document root_doc, drawing on *work
 * (build.h). */
static int compile(gram_kind kind, const char *src, size_t len, const json_t *root_doc,
                   const json_t *at, long *work, gram **out, gram_error *err)
{
    *out = NULL;
    memset(err, 0, sizeof *err);
    gb b = {.err = err};
    gb_node(&b, GN_BYTE, 0, 0); /* node 0: the dead sink (class 0, empty) */
    uint64_t none[4] = {0};
    gb_class(&b, none);
    int32_t root = gb_rule_new(&b);
    const char *kw = kind == GRAM_REGEX    ? "guided_regex"
                     : kind == GRAM_CHOICE ? "guided_choice"
                                           : "schema";
    if (len > GRAM_MAX_SOURCE) {
        gb_fail(&b, kw, "#", "the source is %zu bytes; at most %d", len, GRAM_MAX_SOURCE);
        gb_free(&b);
        return -1;
    }
    uint8_t *live = NULL;
    json_t *doc = NULL;
    if (root_doc == NULL && (kind == GRAM_SCHEMA || kind == GRAM_CHOICE)) {
        json_error_t je;
        doc = json_loadb(src, len, JSON_DECODE_ANY, &je);
        if (doc == NULL) gb_fail(&b, kw, "#", "not JSON: %s", je.text);
    }
    if (!b.failed) {
        frag f = gb_none(&b);
        if (kind == GRAM_SCHEMA)
            f = root_doc != NULL ? gb_schema(&b, root_doc, at, work, compile_sub)
                                 : gb_schema(&b, doc, doc, NULL, compile_sub);
        else if (kind == GRAM_JSON_OBJECT)
            f = gb_json_object(&b);
        else if (kind == GRAM_REGEX)
            f = gb_regex(&b, src, len, 0, "guided_regex", "#");
        else {
            if (!json_is_array(doc) || json_array_size(doc) == 0
                || json_array_size(doc) > GB_MAX_ENUM)
                gb_fail(&b, kw, "#",
                        "'guided_choice' must be a non-empty array of strings (at most %d)",
                        GB_MAX_ENUM);
            size_t i;
            json_t *one;
            json_array_foreach(doc, i, one)
            {
                if (!json_is_string(one)) {
                    gb_fail(&b, kw, "#", "'guided_choice' entry %zu is not a string", i);
                    break;
                }
                frag l = gb_lit(&b, json_string_value(one), json_string_length(one));
                f = i == 0 ? l : gb_alt(&b, f, l);
            }
        }
        gb_rule_set(&b, root, f);
    }
    json_decref(doc);
    if (!b.failed) {
        uint8_t *prod = malloc(b.nr);
        if (prod == NULL || check_productive(&b, prod) != 0)
            gb_fail(&b, kw, "#", "out of memory");
        else if (!prod[root])
            gb_fail(&b, kind == GRAM_SCHEMA ? "$ref" : kw, "#",
                    "no output satisfies it (a recursion that never ends, or nothing left to "
                    "choose)");
        else if ((live = live_nodes(&b, prod)) == NULL)
            gb_fail(&b, kw, "#", "out of memory");
        free(prod);
    }
    if (!b.failed) {
        int lr = left_recursive(&b);
        if (lr != 0)
            gb_fail(
                &b, "$ref", "#",
                lr < 0 ? "out of memory"
                       : "a schema that refers to itself before writing anything (left recursion)");
    }
    if (b.failed) {
        free(live);
        if (err->keyword[0] == '\0') snprintf(err->keyword, sizeof err->keyword, "%s", kw);
        if (err->path[0] == '\0') snprintf(err->path, sizeof err->path, "#");
        gb_free(&b);
        return -1;
    }
    gram *g = calloc(1, sizeof *g);
    if (g == NULL) {
        gb_fail(&b, kw, "#", "out of memory");
        free(live);
        gb_free(&b);
        return -1;
    }
    atomic_init(&g->refs, 1);
    g->n = b.n;
    g->nn = b.nn;
    g->cls = b.c;
    g->ncls = b.nc;
    g->rule_start = b.rs;
    g->nrules = b.nr;
    g->root = root;
    g->live = live;
    g->bytes = sizeof *g + b.ncap * sizeof *b.n + b.ccap * sizeof *b.c + b.rcap * sizeof *b.rs
               + b.nn * sizeof *live;
    /* The matcher's thread bound, checked here rather than met at run time
     * (match.c): a state found over it refuses the grammar. */
    size_t widest;
    int ex = gram_explore(g, &widest);
    if (ex != 0) {
        gram_unref(g);
        if (ex < 0)
            snprintf(err->message, sizeof err->message, "out of memory");
        else
            snprintf(err->message, sizeof err->message,
                     "the pattern allows too many simultaneous positions (more than %d after "
                     "some output): a counted repetition of something that may be empty, or a "
                     "long optional run that overlaps what follows it; docs/api.md",
                     GRAM_MAX_THREADS);
        snprintf(err->keyword, sizeof err->keyword, "%s", kw);
        snprintf(err->path, sizeof err->path, "#");
        return -1;
    }
    *out = g;
    return 0;
}

int gram_compile(gram_kind kind, const char *src, size_t len, gram **out, gram_error *err)
{
    return compile(kind, src, len, NULL, NULL, NULL, out, err);
}

static int compile_sub(const json_t *doc, const json_t *at, long *work, gram **out, gram_error *err)
{
    return compile(GRAM_SCHEMA, "", 0, doc, at, work, out, err);
}
