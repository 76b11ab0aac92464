/*
 * structured/include/structured.h: structured outputs. A JSON Schema (a documented
 * subset, docs/api.md "Structured outputs"), a regular expression or a list
 * of choices compiles once into a grammar over bytes (a recursive
 * transition network: NFA fragments that call rules, so $ref recursion and
 * nesting keep a stack); a matcher walks one sequence's output through it
 * and, at each step, the trie of the vocabulary's token byte strings gives
 * the tokens allowed next (a token may cover several characters or part of
 * a UTF-8 character: the walk is byte by byte).
 *
 * Whitespace rule: the JSON the grammar allows has no whitespace between
 * its tokens (compact JSON, as JSON.stringify writes it), so a model can
 * never loop on spaces; whitespace inside strings is content.
 *
 * Prefix: gram_. Threads: a gram is immutable once compiled and may be
 * shared by any threads (reference counted, atomically); a gram_cache is
 * locked inside; a gram_matcher belongs to one sequence, used by one
 * thread at a time.
 */
#ifndef GPT2D_STRUCTURED_H
#define GPT2D_STRUCTURED_H

#include <stddef.h>
#include <stdint.h>

/* What the source text is. */
typedef enum {
    GRAM_SCHEMA = 0,      /* a JSON Schema (JSON text)                   */
    GRAM_JSON_OBJECT = 1, /* any JSON object (src ignored)               */
    GRAM_REGEX = 2,       /* the whole output matches the regex (subset) */
    GRAM_CHOICE = 3       /* a JSON array of strings: exactly one of them */
} gram_kind;

/* Why a source was refused: the keyword, its JSON path ("#/properties/a")
 * and the words. */
typedef struct {
    char keyword[64];
    char path[256];
    char message[384];
} gram_error;

/* Bounds on one compile (docs/api.md). */
#define GRAM_MAX_SOURCE (256 * 1024) /* bytes of source                  */
#define GRAM_MAX_NODES 200000        /* automaton nodes                   */
#define GRAM_MAX_DEPTH 64            /* schema nesting, in the compiler    */
#define GRAM_MAX_STACK                                                                             \
    1024 /* runtime nesting (calls) of a value: past it the output ends, as at max_tokens */
/* The matcher's bounds (docs/api.md): the NFA threads (positions) one state
 * may hold, and the work of one mask (gram_matcher_work's unit). A grammar found to pass the first
 * is refused by gram_compile; a sequence that passes either at run time ends with an error
 * (gram_matcher_error), never with a narrowed language. */
#define GRAM_MAX_THREADS 4096
#define GRAM_MASK_BUDGET 1000000u

typedef struct gram gram;

/*
 * Compiles src (len bytes) as kind. 0 and *out (one reference), or -1 and
 * err. Bounded: a source over GRAM_MAX_SOURCE, nesting over GRAM_MAX_DEPTH
 * or an automaton over GRAM_MAX_NODES is refused, naming the keyword and
 * path where the bound was passed; so is anything outside the subset and a
 * schema that no value satisfies. Thread: any.
 */
int gram_compile(gram_kind kind, const char *src, size_t len, gram **out, gram_error *err);
gram *gram_ref(gram *g);
void gram_unref(gram *g); /* accepts NULL */
size_t gram_nodes(const gram *g);
/* The bytes g's automaton takes in memory (its nodes, byte classes, rules
 * and the record, as allocated). Thread: any. */
size_t gram_bytes(const gram *g);

/* ---- A bounded cache of compiled grammars, by a hash of kind and source -- */

/* Bounded twice: at most capacity entries, and at most max_bytes bytes of
 * entries, each counted as its automaton (gram_bytes) plus its source's
 * copy; the least recently used entries go first to fit either bound. An
 * entry larger than max_bytes alone is compiled and returned, not kept. A
 * gram evicted while a request still holds it lives on until its last
 * reference, uncounted here. */
typedef struct gram_cache gram_cache;
/* NULL: out of memory. max_bytes: SIZE_MAX until gram_cache_set_max_bytes. */
gram_cache *gram_cache_new(size_t capacity);
void gram_cache_free(gram_cache *c); /* accepts NULL */
/* Sets the bytes bound, evicting the least recently used entries at once
 * until the cache fits it; returns how many went. Thread: any. */
size_t gram_cache_set_max_bytes(gram_cache *c, size_t max_bytes);
/* As gram_compile, through the cache (a hit is a reference to the entry;
 * the least recently used entries go when it is full). Thread: any. */
int gram_cache_get(gram_cache *c, gram_kind kind, const char *src, size_t len, gram **out,
                   gram_error *err);
/* Hits and misses so far. */
void gram_cache_stats(gram_cache *c, uint64_t *hits, uint64_t *misses);
/* The entries held now and their bytes (as counted against max_bytes). */
void gram_cache_usage(gram_cache *c, size_t *entries, size_t *bytes);

/* ---- The vocabulary: a trie over the tokens' byte strings ----------------- */

typedef struct gram_vocab gram_vocab;
/* tok[i] (len[i] bytes) for i < V; eot is the end-of-text id, which the
 * trie leaves out (it is allowed only where the grammar accepts). Zero-length
 * tokens are left out too. 0 and *out, or -1 (out of memory). */
int gram_vocab_new(const char *const *tok, const size_t *len, size_t V, int32_t eot,
                   gram_vocab **out);
void gram_vocab_free(gram_vocab *v); /* accepts NULL */
size_t gram_vocab_size(const gram_vocab *v);
size_t gram_vocab_trie_nodes(const gram_vocab *v);

/* ---- One sequence's walk ------------------------------------------------- */

typedef struct gram_matcher gram_matcher;
/* A matcher at the start of g's language; holds a reference to g and
 * borrows v (which must outlive it). NULL: out of memory. */
gram_matcher *gram_matcher_new(gram *g, const gram_vocab *v);
void gram_matcher_free(gram_matcher *m); /* accepts NULL */

/*
 * The tokens allowed next: a bitset of (V + 63) / 64 words, bit i of word
 * i / 64 for token i, valid until the next call on m; the end-of-text bit
 * is set only where the output so far is complete. *nallowed: how many bits
 * are set (0: nothing can continue, as when the nesting passed
 * GRAM_MAX_STACK). NULL: out of memory.
 */
const uint64_t *gram_matcher_mask(gram_matcher *m, size_t *nallowed);
/* Feeds token id (its bytes; end-of-text ends the walk). 0, or -1 when the
 * grammar does not allow it (m unchanged). */
int gram_matcher_feed(gram_matcher *m, int32_t id);
/* Feeds raw bytes (tests). 0, or -1 when not allowed (m unchanged). */
int gram_matcher_feed_bytes(gram_matcher *m, const char *b, size_t n);
/* NULL, or why the walk ended at a bound (GRAM_MAX_THREADS,
 * GRAM_MASK_BUDGET): then gram_matcher_mask allows nothing and feeding
 * fails; the sequence must end with this error. */
const char *gram_matcher_error(const gram_matcher *m);
/* The work of the last mask that walked the trie, in GRAM_MASK_BUDGET's
 * unit: trie nodes visited, plus positions visited by the closures of the
 * states it made, plus a sixteenth of the threads whose class it tested
 * (a deterministic stand-in for time: about 15 ns a unit on the machine of
 * docs/benchmarks.md). Benchmarks and tests. */
uint64_t gram_matcher_work(const gram_matcher *m);
/* 1 when the output so far is a whole sentence of the language. */
int gram_matcher_accepting(const gram_matcher *m);

#endif
