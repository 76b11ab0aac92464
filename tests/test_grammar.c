/*
 * tests/test_grammar.c: structured outputs' compiler, matcher and mask
 * (structured/include/structured.h) over GPT-2's real vocabulary.
 *
 * Random walks: at every step a token drawn uniformly from the mask, so
 * every corner the mask allows is tried, not only the likely ones; a walk
 * that ends (end of text drawn) must parse as JSON and validate against
 * the schema under the small validator below, written from the JSON Schema
 * spec, independently of the compiler. Refusals name their keyword.
 */
#include "structured.h"
#include "tokenizer.h"

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static bpe *gpt2;
static gram_vocab *vocab;

static void setup(void)
{
    if (vocab != NULL) return;
    char err[256];
    ck_assert_msg(bpe_load_dir(GPT2D_VOCAB_DIR, &gpt2, err, sizeof err) == BPE_OK, "%s", err);
    size_t V = bpe_vocab_size(gpt2);
    const char **tok = malloc(V * sizeof *tok);
    size_t *len = malloc(V * sizeof *len);
    for (size_t i = 0; i < V; i++) tok[i] = bpe_token_bytes(gpt2, (int32_t)i, &len[i]);
    ck_assert_int_eq(gram_vocab_new(tok, len, V, BPE_EOT, &vocab), 0);
    free(tok);
    free(len);
}

/* ---- An independent validator of the subset --------------------------------- */

static size_t codepoints(const char *s)
{
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static int valid(const json_t *v, const json_t *s, const json_t *root);

static const json_t *deref(const json_t *root, const char *ref)
{
    if (strcmp(ref, "#") == 0) return root;
    const char *name = strrchr(ref, '/');
    const json_t *defs = json_object_get(root, "$defs");
    if (defs == NULL) defs = json_object_get(root, "definitions");
    return name ? json_object_get(defs, name + 1) : NULL;
}

static int type_ok(const json_t *v, const char *t)
{
    if (strcmp(t, "object") == 0) return json_is_object(v);
    if (strcmp(t, "array") == 0) return json_is_array(v);
    if (strcmp(t, "string") == 0) return json_is_string(v);
    if (strcmp(t, "integer") == 0)
        return json_is_integer(v)
               || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    if (strcmp(t, "number") == 0) return json_is_number(v);
    if (strcmp(t, "boolean") == 0) return json_is_boolean(v);
    if (strcmp(t, "null") == 0) return json_is_null(v);
    return 0;
}

static int valid(const json_t *v, const json_t *s, const json_t *root)
{
    if (json_is_true(s)) return 1;
    if (json_is_false(s)) return 0;
    const json_t *x;
    size_t i;
    const json_t *one;
    if ((x = json_object_get(s, "$ref")) && !valid(v, deref(root, json_string_value(x)), root))
        return 0;
    if ((x = json_object_get(s, "anyOf")) || (x = json_object_get(s, "oneOf"))) {
        int any = 0;
        json_array_foreach(x, i, one) any |= valid(v, one, root);
        if (!any) return 0;
    }
    if ((x = json_object_get(s, "const")) && !json_equal(x, v)) return 0;
    if ((x = json_object_get(s, "enum"))) {
        int any = 0;
        json_array_foreach(x, i, one) any |= json_equal(one, v);
        if (!any) return 0;
    }
    if ((x = json_object_get(s, "type"))) {
        int any = 0;
        if (json_is_string(x))
            any = type_ok(v, json_string_value(x));
        else
            json_array_foreach(x, i, one) any |= type_ok(v, json_string_value(one));
        if (!any) return 0;
    }
    if (json_is_object(v)) {
        const json_t *props = json_object_get(s, "properties");
        json_array_foreach(json_object_get(s, "required"), i, one)
        {
            if (!json_object_get(v, json_string_value(one))) return 0;
        }
        const char *k;
        json_t *pv;
        json_object_foreach((json_t *)v, k, pv)
        {
            const json_t *ps = props ? json_object_get(props, k) : NULL;
            if (ps != NULL && !valid(pv, ps, root)) return 0;
            if (ps == NULL && json_is_false(json_object_get(s, "additionalProperties"))) return 0;
        }
    }
    if (json_is_array(v)) {
        const json_t *pre = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
        size_t np = pre ? json_array_size(pre) : 0;
        json_array_foreach(v, i, one)
        {
            const json_t *is = i < np ? json_array_get(pre, i) : items;
            if (is != NULL && !valid(one, is, root)) return 0;
        }
        if ((x = json_object_get(s, "minItems"))
            && json_array_size(v) < (size_t)json_integer_value(x))
            return 0;
        if ((x = json_object_get(s, "maxItems"))
            && json_array_size(v) > (size_t)json_integer_value(x))
            return 0;
    }
    if (json_is_string(v)) {
        size_t n = codepoints(json_string_value(v));
        if ((x = json_object_get(s, "minLength")) && n < (size_t)json_integer_value(x)) return 0;
        if ((x = json_object_get(s, "maxLength")) && n > (size_t)json_integer_value(x)) return 0;
        if ((x = json_object_get(s, "pattern"))) {
            regex_t re;
            ck_assert_int_eq(regcomp(&re, json_string_value(x), REG_EXTENDED | REG_NOSUB), 0);
            int m = regexec(&re, json_string_value(v), 0, NULL, 0) == 0;
            regfree(&re);
            if (!m) return 0;
        }
    }
    if (json_is_number(v)) {
        double d = json_number_value(v);
        if ((x = json_object_get(s, "minimum")) && d < json_number_value(x)) return 0;
        if ((x = json_object_get(s, "maximum")) && d > json_number_value(x)) return 0;
        if ((x = json_object_get(s, "exclusiveMinimum")) && d <= json_number_value(x)) return 0;
        if ((x = json_object_get(s, "exclusiveMaximum")) && d >= json_number_value(x)) return 0;
    }
    return 1;
}

/* ---- Random walks -------------------------------------------------------------- */

static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return rng_state >> 11;
}

/* Walks g with tokens drawn from the mask until end of text (1, *out the
 * text) or max tokens (0). Every token drawn is fed back and must be taken. */
static int walk(gram *g, size_t max, char *out, size_t cap, uint64_t seed)
{
    rng_state = seed;
    gram_matcher *m = gram_matcher_new(g, vocab);
    ck_assert_ptr_nonnull(m);
    size_t V = gram_vocab_size(vocab), n = 0;
    int32_t *allowed = malloc(V * sizeof *allowed);
    int done = 0;
    out[0] = '\0';
    for (size_t t = 0; t < max && !done; t++) {
        size_t na;
        const uint64_t *mask = gram_matcher_mask(m, &na);
        ck_assert_ptr_nonnull(mask);
        ck_assert_msg(na > 0, "a dead end after '%s'", out);
        size_t k = 0;
        for (size_t i = 0; i < V; i++)
            if (mask[i >> 6] >> (i & 63) & 1) allowed[k++] = (int32_t)i;
        ck_assert_uint_eq(k, na);
        int eot_ok = mask[BPE_EOT >> 6] >> (BPE_EOT & 63) & 1;
        ck_assert_int_eq(eot_ok, gram_matcher_accepting(m));
        /* end of text half the time it is allowed, so walks end */
        int32_t id = eot_ok && rnd() % 2 == 0 ? BPE_EOT : allowed[rnd() % k];
        ck_assert_int_eq(gram_matcher_feed(m, id), 0);
        if (id == BPE_EOT) {
            done = 1;
            break;
        }
        size_t len;
        const char *b = bpe_token_bytes(gpt2, id, &len);
        ck_assert_msg(n + len < cap, "output too long");
        memcpy(out + n, b, len);
        n += len;
        out[n] = '\0';
    }
    free(allowed);
    gram_matcher_free(m);
    return done;
}

static void check_schema(const char *schema, int walks, size_t max)
{
    setup();
    gram *g;
    gram_error e;
    int rc = gram_compile(GRAM_SCHEMA, schema, strlen(schema), &g, &e);
    ck_assert_msg(rc == 0, "%s: %s at %s: %s", schema, e.keyword, e.path, e.message);
    json_t *s = json_loads(schema, 0, NULL);
    ck_assert_ptr_nonnull(s);
    static char out[1 << 16];
    int ended = 0;
    for (int w = 0; w < walks; w++) {
        if (!walk(g, max, out, sizeof out, 1000u + (uint64_t)w)) continue;
        ended++;
        json_error_t je;
        json_t *v = json_loads(out, JSON_DECODE_ANY, &je);
        ck_assert_msg(v != NULL, "%s: not JSON: '%s' (%s)", schema, out, je.text);
        ck_assert_msg(valid(v, s, s), "%s: invalid: '%s'", schema, out);
        ck_assert_msg(strpbrk(out, " \n\t\r") == NULL || json_is_string(v)
                          || strchr(out, '"') != NULL,
                      "whitespace outside strings: '%s'", out);
        json_decref(v);
    }
    ck_assert_msg(ended > 0, "%s: no walk ended", schema);
    json_decref(s);
    gram_unref(g);
}

START_TEST(schema_walks)
{
    static const char *const corpus[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
        "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120}},\"required\":[\"name\","
        "\"age\"],\"additionalProperties\":false}",
        "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":2,\"maxItems\":4}",
        "{\"enum\":[\"caf\\u00e9\",\"\\u65e5\\u672c\",1,null,{\"a\":[1,2]}]}",
        "{\"type\":\"object\",\"properties\":{\"\\u00e9t\\u00e9\":{\"const\":\"\\u2603\"},"
        "\"b\":{\"type\":[\"null\",\"number\"]}},\"required\":[\"b\"]}",
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
        "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},\"maxItems\":2}},"
        "\"required\":[\"v\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
        "{\"anyOf\":[{\"type\":\"string\",\"pattern\":\"^[a-c]{2,3}-[0-9]+$\"},{\"type\":"
        "\"integer\",\"minimum\":-25,\"maximum\":-3}]}",
        "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\",\"minLength\":2},{\"type\":"
        "\"null\"}],\"items\":false,\"minItems\":1}",
        "{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}",
        "{\"type\":\"array\",\"maxItems\":0}",
        "{\"type\":\"integer\",\"minimum\":17,\"maximum\":4021}",
        "{\"type\":\"number\",\"minimum\":0,\"maximum\":3}",
        "{\"type\":\"object\"}",
        "{}",
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":"
        "\"boolean\"},\"c\":{\"type\":\"boolean\"}},\"required\":[\"c\"],"
        "\"additionalProperties\":false}",
    };
    for (size_t i = 0; i < sizeof corpus / sizeof corpus[0]; i++) check_schema(corpus[i], 40, 200);
}
END_TEST

static void check_format(const char *fmt, const char *ere)
{
    setup();
    char schema[128];
    snprintf(schema, sizeof schema, "{\"type\":\"string\",\"format\":\"%s\"}", fmt);
    gram *g;
    gram_error e;
    ck_assert_int_eq(gram_compile(GRAM_SCHEMA, schema, strlen(schema), &g, &e), 0);
    regex_t re;
    ck_assert_int_eq(regcomp(&re, ere, REG_EXTENDED | REG_NOSUB), 0);
    static char out[4096];
    for (int w = 0; w < 20; w++) {
        if (!walk(g, 100, out, sizeof out, 77u + (uint64_t)w)) continue;
        ck_assert_msg(regexec(&re, out, 0, NULL, 0) == 0, "%s: '%s'", fmt, out);
    }
    regfree(&re);
    gram_unref(g);
}

START_TEST(formats)
{
    check_format("date", "^\"[0-9]{4}-[0-9]{2}-[0-9]{2}\"$");
    check_format("date-time",
                 "^\"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]+)?(Z|[+-][0-9]{"
                 "2}:[0-9]{2})\"$");
    check_format("uuid", "^\"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\"$");
    check_format("email", "^\"[a-z0-9._+-]+@[a-z0-9.-]+\\.[a-z]+\"$");
}
END_TEST

START_TEST(choice_and_regex)
{
    setup();
    gram *g;
    gram_error e;
    const char *choices = "[\"yes\",\"no\",\"maybe so\",\"\\u00e9\"]";
    ck_assert_int_eq(gram_compile(GRAM_CHOICE, choices, strlen(choices), &g, &e), 0);
    static char out[256];
    for (int w = 0; w < 30; w++) {
        ck_assert(walk(g, 20, out, sizeof out, (uint64_t)w));
        ck_assert_msg(strcmp(out, "yes") == 0 || strcmp(out, "no") == 0
                          || strcmp(out, "maybe so") == 0 || strcmp(out, "\xc3\xa9") == 0,
                      "'%s'", out);
    }
    gram_unref(g);
    const char *re = "(ab|cd)+[0-9]{3}x?";
    ck_assert_int_eq(gram_compile(GRAM_REGEX, re, strlen(re), &g, &e), 0);
    regex_t rx;
    ck_assert_int_eq(regcomp(&rx, "^(ab|cd)+[0-9]{3}x?$", REG_EXTENDED | REG_NOSUB), 0);
    for (int w = 0; w < 30; w++) {
        if (!walk(g, 60, out, sizeof out, (uint64_t)w)) continue;
        ck_assert_msg(regexec(&rx, out, 0, NULL, 0) == 0, "'%s'", out);
    }
    regfree(&rx);
    gram_unref(g);
    /* A property whose schema can never finish is never begun. */
    const char *never = "{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/l\"},"
                        "\"y\":{\"type\":\"null\"}},\"$defs\":{\"l\":{\"type\":\"object\","
                        "\"properties\":{\"a\":{\"$ref\":\"#/$defs/l\"}},\"required\":[\"a\"]}}}";
    ck_assert_int_eq(gram_compile(GRAM_SCHEMA, never, strlen(never), &g, &e), 0);
    gram_matcher *mn = gram_matcher_new(g, vocab);
    ck_assert_int_eq(gram_matcher_feed_bytes(mn, "{\"x", 3), -1);
    ck_assert_int_eq(gram_matcher_feed_bytes(mn, "{\"y\":null}", 10), 0);
    ck_assert_int_eq(gram_matcher_accepting(mn), 1);
    gram_matcher_free(mn);
    gram_unref(g);
    /* Exact feeding: bytes split anywhere, UTF-8 included. */
    ck_assert_int_eq(gram_compile(GRAM_JSON_OBJECT, "", 0, &g, &e), 0);
    gram_matcher *m = gram_matcher_new(g, vocab);
    ck_assert_int_eq(gram_matcher_feed_bytes(m, "{\"\xc3", 3), 0);
    ck_assert_int_eq(gram_matcher_feed_bytes(m, "\xa9\":[1,", 6), 0);
    ck_assert_int_eq(gram_matcher_accepting(m), 0);
    ck_assert_int_eq(gram_matcher_feed_bytes(m, " ", 1), -1); /* no whitespace */
    ck_assert_int_eq(gram_matcher_feed_bytes(m, "\xff", 1), -1);
    ck_assert_int_eq(gram_matcher_feed_bytes(m, "true]}", 6), 0);
    ck_assert_int_eq(gram_matcher_accepting(m), 1);
    ck_assert_int_eq(gram_matcher_feed(m, BPE_EOT), 0);
    gram_matcher_free(m);
    gram_unref(g);
}
END_TEST

/* Refused: the keyword named, never a crash or a hang. */
static void refused(gram_kind kind, const char *src, const char *keyword)
{
    gram *g = NULL;
    gram_error e;
    clock_t t0 = clock();
    int rc = gram_compile(kind, src, strlen(src), &g, &e);
    double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
    ck_assert_msg(rc == -1, "accepted: %s", src);
    ck_assert_ptr_null(g);
    ck_assert_msg(strcmp(e.keyword, keyword) == 0, "%s: keyword '%s' (path %s: %s), not '%s'", src,
                  e.keyword, e.path, e.message, keyword);
    ck_assert_msg(s < 2.0, "%s: %.2f s", src, s);
}

START_TEST(refusals)
{
    refused(GRAM_SCHEMA, "{\"type\":\"string\",\"foo\":1}", "foo");
    refused(GRAM_SCHEMA, "{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}}}}", "not");
    refused(GRAM_SCHEMA, "{\"type\":\"string\",\"format\":\"hostname\"}", "format");
    refused(GRAM_SCHEMA, "{\"enum\":[]}", "enum");
    refused(GRAM_SCHEMA, "{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "minimum");
    refused(GRAM_SCHEMA, "{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "maxItems");
    refused(GRAM_SCHEMA, "{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "pattern");
    refused(GRAM_SCHEMA, "{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "pattern");
    refused(GRAM_SCHEMA, "{\"$ref\":\"#\"}", "$ref"); /* left recursion */
    refused(GRAM_SCHEMA,
            "{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#\"}},\"required\":[\"x\"]}",
            "$ref"); /* a recursion that never ends */
    refused(GRAM_SCHEMA, "{\"$ref\":\"#/$defs/nope\"}", "$ref");
    refused(GRAM_SCHEMA, "{\"type\":\"object\",\"required\":[\"a\"]}", "required");
    refused(GRAM_SCHEMA, "{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", "maxLength");
    refused(GRAM_SCHEMA, "not json", "schema");
    refused(GRAM_REGEX, "a{1000}{1000}", "guided_regex"); /* too many nodes */
    refused(GRAM_REGEX, "(a|b", "guided_regex");
    refused(GRAM_CHOICE, "[]", "guided_choice");
    /* Deep nesting: refused at the bound, quickly. */
    size_t depth = 5000;
    char *deep = malloc(depth * 16 + 64);
    size_t n = 0;
    for (size_t i = 0; i < depth; i++) n += (size_t)sprintf(deep + n, "{\"items\":");
    n += (size_t)sprintf(deep + n, "{}");
    for (size_t i = 0; i < depth; i++) deep[n++] = '}';
    deep[n] = '\0';
    gram *g;
    gram_error e;
    ck_assert_int_eq(gram_compile(GRAM_SCHEMA, deep, n, &g, &e), -1);
    free(deep);
    /* A regex that backtracks elsewhere compiles and matches in linear time. */
    const char *bt = "(a+)+b";
    ck_assert_int_eq(gram_compile(GRAM_REGEX, bt, strlen(bt), &g, &e), 0);
    setup();
    gram_matcher *m = gram_matcher_new(g, vocab);
    clock_t t0 = clock();
    for (int i = 0; i < 5000; i++) ck_assert_int_eq(gram_matcher_feed_bytes(m, "a", 1), 0);
    size_t na;
    gram_matcher_mask(m, &na);
    ck_assert_uint_gt(na, 0);
    ck_assert_msg((double)(clock() - t0) / CLOCKS_PER_SEC < 2.0, "backtracking regex slow");
    gram_matcher_free(m);
    gram_unref(g);
}
END_TEST

/* Whether the schema (or regex) src compiles and its grammar takes text
 * whole; the expectations below are worked out by hand from JSON Schema and
 * ECMA-262. */
static int takes(gram_kind kind, const char *src, const char *text)
{
    setup();
    gram *g;
    gram_error e;
    ck_assert_msg(gram_compile(kind, src, strlen(src), &g, &e) == 0, "%s: %s %s %s", src, e.keyword,
                  e.path, e.message);
    gram_matcher *m = gram_matcher_new(g, vocab);
    int ok = gram_matcher_feed_bytes(m, text, strlen(text)) == 0 && gram_matcher_accepting(m);
    gram_matcher_free(m);
    gram_unref(g);
    return ok;
}

/* What the subset writes validates: enum and const beside other keywords,
 * oneOf, counts above the bound, properties false, \xHH, '.', \s, \S. */
START_TEST(schema_semantics)
{
    /* enum and const keep only the values the other keywords allow */
    const char *e1 = "{\"type\":\"string\",\"enum\":[\"a\",\"bb\"],\"maxLength\":1}";
    ck_assert(takes(GRAM_SCHEMA, e1, "\"a\""));
    ck_assert(!takes(GRAM_SCHEMA, e1, "\"bb\""));
    const char *e2 = "{\"type\":\"integer\",\"enum\":[1,50],\"maximum\":10}";
    ck_assert(takes(GRAM_SCHEMA, e2, "1"));
    ck_assert(!takes(GRAM_SCHEMA, e2, "50"));
    const char *e3 = "{\"enum\":[\"xy\",\"abc\"],\"pattern\":\"^x.$\"}";
    ck_assert(takes(GRAM_SCHEMA, e3, "\"xy\""));
    ck_assert(!takes(GRAM_SCHEMA, e3, "\"abc\""));
    const char *e4 = "{\"enum\":[{\"a\":1},{\"a\":\"s\"}],\"properties\":{\"a\":{\"type\":"
                     "\"integer\"}}}";
    ck_assert(takes(GRAM_SCHEMA, e4, "{\"a\":1}"));
    ck_assert(!takes(GRAM_SCHEMA, e4, "{\"a\":\"s\"}"));
    refused(GRAM_SCHEMA, "{\"const\":\"abc\",\"pattern\":\"^x$\"}", "const");
    /* the checker compiles in the document: a $ref beside enum resolves */
    const char *e5 = "{\"$defs\":{\"i\":{\"type\":\"integer\",\"maximum\":3}},\"enum\":[{\"x\":1},"
                     "{\"x\":7}],\"properties\":{\"x\":{\"$ref\":\"#/$defs/i\"}}}";
    ck_assert(takes(GRAM_SCHEMA, e5, "{\"x\":1}"));
    ck_assert(!takes(GRAM_SCHEMA, e5, "{\"x\":7}"));
    /* a control the pattern checker sees as the grammar writes it (\u001f) */
    ck_assert(takes(GRAM_SCHEMA, "{\"enum\":[\"a\\u001fb\",\"x\"],\"pattern\":\"^a.b$\"}",
                    "\"a\\u001Fb\""));
    refused(GRAM_SCHEMA, "{\"type\":\"array\",\"enum\":[[1,2,3]],\"maxItems\":1}", "enum");
    refused(GRAM_SCHEMA, "{\"type\":\"number\",\"const\":3,\"exclusiveMaximum\":3}", "const");
    ck_assert(takes(GRAM_SCHEMA, "{\"type\":\"integer\",\"enum\":[1.0]}", "1.0"));
    refused(GRAM_SCHEMA, "{\"enum\":[\"a\"],\"pattern\":\"(?=a)\"}", "pattern");
    /* oneOf: only branches no value satisfies twice */
    refused(GRAM_SCHEMA, "{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "oneOf");
    refused(GRAM_SCHEMA, "{\"oneOf\":[{\"const\":1},{\"enum\":[2,1.0]}]}", "oneOf");
    refused(GRAM_SCHEMA,
            "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"a\"}}},{\"type\":"
            "\"object\",\"properties\":{\"k\":{\"const\":\"b\"}},\"required\":[\"k\"]}]}",
            "oneOf"); /* {} satisfies the first and not the second: k is optional there */
    const char *o1 = "{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"string\"}]}";
    ck_assert(takes(GRAM_SCHEMA, o1, "5"));
    ck_assert(takes(GRAM_SCHEMA, o1, "\"x\""));
    const char *o2 =
        "{\"$defs\":{\"a\":{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"a\"},\"x\":{"
        "\"type\":\"integer\"}},\"required\":[\"k\"]}},\"oneOf\":[{\"$ref\":\"#/$defs/a\"},{"
        "\"type\":\"object\",\"properties\":{\"k\":{\"enum\":[\"b\",\"c\"]}},\"required\":[\"k\"]}"
        "]}";
    ck_assert(takes(GRAM_SCHEMA, o2, "{\"k\":\"a\",\"x\":1}"));
    ck_assert(takes(GRAM_SCHEMA, o2, "{\"k\":\"c\"}"));
    /* a oneOf whose branches' types branch without end (a self-referring
     * anyOf): refused quickly, not a hang */
    char *big = malloc(4096);
    size_t bn = (size_t)sprintf(big, "{\"$defs\":{\"a\":{\"anyOf\":[");
    for (int i = 0; i < 10; i++) bn += (size_t)sprintf(big + bn, "{\"$ref\":\"#/$defs/a\"},");
    bn += (size_t)sprintf(big + bn, "{\"type\":\"null\"}]}},\"oneOf\":[");
    for (int i = 0; i < 2; i++) /* the first pair alone would branch 10^16 ways */
        bn += (size_t)sprintf(big + bn, "%s{\"$ref\":\"#/$defs/a\"}", i ? "," : "");
    sprintf(big + bn, "]}");
    refused(GRAM_SCHEMA, big, "oneOf");
    free(big);
    /* a maximum count above the bound: refused, never unbounded */
    refused(GRAM_SCHEMA, "{\"type\":\"string\",\"maxLength\":1001}", "maxLength");
    refused(GRAM_SCHEMA, "{\"type\":\"array\",\"maxItems\":1001}", "maxItems");
    ck_assert(takes(GRAM_SCHEMA,
                    "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"null\"}],\"items\":false,"
                    "\"maxItems\":5000}",
                    "[null]")); /* items false: at most one anyway */
    /* a property false is never written; required, nothing satisfies it */
    const char *f1 = "{\"type\":\"object\",\"properties\":{\"a\":false,\"b\":{\"type\":\"null\"}}}";
    ck_assert(!takes(GRAM_SCHEMA, f1, "{\"a\":null}"));
    ck_assert(takes(GRAM_SCHEMA, f1, "{\"b\":null}"));
    const char *f2 = "{\"properties\":{\"a\":false}}";
    ck_assert(takes(GRAM_SCHEMA, f2, "{}"));
    ck_assert(!takes(GRAM_SCHEMA, f2, "{\"a\":1}"));
    refused(GRAM_SCHEMA, "{\"properties\":{\"a\":false},\"required\":[\"a\"]}", "required");
    ck_assert(!takes(GRAM_SCHEMA, "{\"anyOf\":[false,{\"type\":\"null\"}]}", "1"));
    ck_assert(takes(GRAM_SCHEMA, "{\"oneOf\":[false,{\"type\":\"null\"}]}", "null"));
    refused(GRAM_SCHEMA, "{\"anyOf\":[false,false]}", "anyOf");
    ck_assert(
        takes(GRAM_SCHEMA, "{\"properties\":{\"a\":true},\"required\":[\"a\"]}", "{\"a\":[1,{}]}"));
    /* \xHH names a code point: e9 is U+00E9, two bytes of UTF-8 */
    ck_assert(takes(GRAM_REGEX, "\\xe9", "\xc3\xa9"));
    ck_assert(!takes(GRAM_REGEX, "\\xe9", "\xe9"));
    ck_assert(
        takes(GRAM_SCHEMA, "{\"type\":\"string\",\"pattern\":\"^\\\\xe9$\"}", "\"\xc3\xa9\""));
    /* a pattern's '.': no line terminator (ECMA); guided_regex: not \n only */
    const char *dot = "{\"type\":\"string\",\"pattern\":\"^.$\"}";
    ck_assert(takes(GRAM_SCHEMA, dot, "\"a\""));
    ck_assert(takes(GRAM_SCHEMA, dot, "\"\xf0\x9f\x98\x80\"")); /* U+1F600 */
    ck_assert(!takes(GRAM_SCHEMA, dot, "\"\\n\""));
    ck_assert(!takes(GRAM_SCHEMA, dot, "\"\\r\""));
    ck_assert(!takes(GRAM_SCHEMA, dot, "\"\xe2\x80\xa8\"")); /* U+2028 */
    ck_assert(!takes(GRAM_SCHEMA, dot, "\"\xe2\x80\xa9\"")); /* U+2029 */
    ck_assert(takes(GRAM_SCHEMA, dot, "\"\xe2\x80\xa7\""));  /* U+2027 */
    ck_assert(takes(GRAM_REGEX, ".", "\r"));
    ck_assert(!takes(GRAM_REGEX, ".", "\n"));
    /* \s and \S: ECMA's white space, U+00A0, U+2028, U+3000, U+FEFF too */
    const char *sp = "{\"type\":\"string\",\"pattern\":\"^\\\\s$\"}";
    const char *ns = "{\"type\":\"string\",\"pattern\":\"^\\\\S$\"}";
    const char *nsc = "{\"type\":\"string\",\"pattern\":\"^[^\\\\s]$\"}";
    static const char *const white[] = {"\xc2\xa0", "\xe2\x80\xa8", "\xe3\x80\x80", "\xef\xbb\xbf",
                                        "\xe2\x80\x8a"};
    static const char *const black[] = {"\xc3\xa9", "\xe2\x80\x8b", "\xef\xbb\xbe",
                                        "\xf4\x8f\xbf\xbf", "\xed\x9f\xbf"};
    char q[16];
    for (size_t i = 0; i < 5; i++) {
        snprintf(q, sizeof q, "\"%s\"", white[i]);
        ck_assert_msg(takes(GRAM_SCHEMA, sp, q) && !takes(GRAM_SCHEMA, ns, q)
                          && !takes(GRAM_SCHEMA, nsc, q),
                      "white %zu", i);
        snprintf(q, sizeof q, "\"%s\"", black[i]);
        ck_assert_msg(!takes(GRAM_SCHEMA, sp, q) && takes(GRAM_SCHEMA, ns, q)
                          && takes(GRAM_SCHEMA, nsc, q),
                      "black %zu", i);
    }
    /* each class escape and '.' built once a regex: counted, they fit the node bound */
    ck_assert(takes(GRAM_SCHEMA, "{\"pattern\":\"^(.\\\\S\\\\s){0,1000}$\"}", "\"a\\\"\\t\""));
    ck_assert(takes(GRAM_SCHEMA, sp, "\"\\n\""));
    ck_assert(!takes(GRAM_SCHEMA, ns, "\"\\t\""));
}
END_TEST

/* Accepts s whole (fed byte by byte in one call). */
static int matches(gram *g, const char *s, size_t n)
{
    gram_matcher *m = gram_matcher_new(g, vocab);
    ck_assert_ptr_nonnull(m);
    int ok = gram_matcher_feed_bytes(m, s, n) == 0 && gram_matcher_accepting(m);
    ck_assert_ptr_null(gram_matcher_error(m));
    gram_matcher_free(m);
    return ok;
}

/* The matcher's bounds (GRAM_MAX_THREADS, GRAM_MASK_BUDGET): a pattern
 * whose positions pile up is refused at compile time, or matched exactly,
 * or ends its walk with an error; never a narrowed language. */
START_TEST(thread_bound)
{
    setup();
    gram *g;
    gram_error e;
    /* Counted repetition against POSIX ERE (glibc), on every string of
     * a b c up to length 7: the nested construction keeps the language. */
    static const char *const re[] = {"(ab|a){2,4}c", "(a?b){0,3}",     "a{3}",        "(a|b){2,}c",
                                     "(a?a?){2,3}b", "((ab)?c?){1,3}", "b{0,5}a{1,2}"};
    for (size_t k = 0; k < sizeof re / sizeof re[0]; k++) {
        ck_assert_int_eq(gram_compile(GRAM_REGEX, re[k], strlen(re[k]), &g, &e), 0);
        char full[64];
        snprintf(full, sizeof full, "^(%s)$", re[k]);
        regex_t rx;
        ck_assert_int_eq(regcomp(&rx, full, REG_EXTENDED | REG_NOSUB), 0);
        char str[8];
        for (size_t len = 0; len <= 7; len++) {
            size_t total = 1;
            for (size_t i = 0; i < len; i++) total *= 3;
            for (size_t code = 0; code < total; code++) {
                size_t c = code;
                for (size_t i = 0; i < len; i++, c /= 3) str[i] = (char)('a' + c % 3);
                str[len] = '\0';
                int want = regexec(&rx, str, 0, NULL, 0) == 0;
                ck_assert_msg(matches(g, str, len) == want, "%s on '%s': want %d", re[k], str,
                              want);
            }
        }
        regfree(&rx);
        gram_unref(g);
    }
    /* Positions that pile up past the bound: refused, quickly, by name. */
    clock_t t0 = clock();
    const char *wide = "(.?){1000}";
    ck_assert_int_eq(gram_compile(GRAM_REGEX, wide, strlen(wide), &g, &e), -1);
    ck_assert_str_eq(e.keyword, "guided_regex");
    ck_assert_msg(strstr(e.message, "simultaneous positions") != NULL, "%s", e.message);
    ck_assert_msg((double)(clock() - t0) / CLOCKS_PER_SEC < 2.0, "refusal slow");
    const char *wide_schema = "{\"type\":\"string\",\"pattern\":\"(.?){1000}\"}";
    ck_assert_int_eq(gram_compile(GRAM_SCHEMA, wide_schema, strlen(wide_schema), &g, &e), -1);
    ck_assert_msg(strstr(e.message, "simultaneous positions") != NULL, "%s", e.message);
    /* 2,001 positions: under the bound, so every one is kept (a cap of
     * 1,024 once dropped the ones that accept "b"). */
    const char *aab = "(a?a?){1000}b";
    if (gram_compile(GRAM_REGEX, aab, strlen(aab), &g, &e) != 0)
        ck_assert_msg(strstr(e.message, "simultaneous positions") != NULL, "%s", e.message);
    else {
        static char s[2100];
        memset(s, 'a', sizeof s);
        ck_assert(matches(g, "b", 1));
        ck_assert(matches(g, "ab", 2));
        s[2000] = 'b';
        ck_assert(matches(g, s, 2001));
        s[2000] = 'a';
        s[2001] = 'b';
        ck_assert(!matches(g, s, 2002));
        ck_assert(!matches(g, "", 0));
        gram_unref(g);
    }
    /* 4,096 choices alike up to their last characters: all kept. */
    static char choices[4096 * 12 + 8];
    size_t n = 0;
    choices[n++] = '[';
    for (int i = 0; i < 4096; i++)
        n += (size_t)sprintf(choices + n, "%s\"i%04d\"", i ? "," : "", i);
    choices[n++] = ']';
    ck_assert_int_eq(gram_compile(GRAM_CHOICE, choices, n, &g, &e), 0);
    ck_assert(matches(g, "i4095", 5));
    ck_assert(matches(g, "i0000", 5));
    ck_assert(!matches(g, "i4096", 5));
    gram_unref(g);
    /* Accepted, but a mask from a wide state costs more than the budget:
     * the walk ends with an error (deterministic: work, not time), at once,
     * and stays ended. */
    const char *overlap = ".{0,500}x.{0,500}";
    ck_assert_int_eq(gram_compile(GRAM_REGEX, overlap, strlen(overlap), &g, &e), 0);
    gram_matcher *m = gram_matcher_new(g, vocab);
    for (int i = 0; i < 400; i++) ck_assert_int_eq(gram_matcher_feed_bytes(m, "x", 1), 0);
    t0 = clock();
    size_t na;
    const uint64_t *mask = gram_matcher_mask(m, &na);
    ck_assert_msg((double)(clock() - t0) / CLOCKS_PER_SEC < 2.0, "a mask past the budget ran on");
    ck_assert_ptr_nonnull(mask);
    if (gram_matcher_error(m) != NULL) {
        ck_assert_uint_eq(na, 0);
        ck_assert_msg(strstr(gram_matcher_error(m), "budget") != NULL, "%s", gram_matcher_error(m));
        ck_assert_int_eq(gram_matcher_feed_bytes(m, "x", 1), -1);
        mask = gram_matcher_mask(m, &na);
        ck_assert_uint_eq(na, 0);
    } else
        ck_assert_uint_gt(na, 0);
    gram_matcher_free(m);
    gram_unref(g);
}
END_TEST

START_TEST(cache_and_recursion_bound)
{
    setup();
    gram_cache *c = gram_cache_new(2);
    gram *a, *b;
    gram_error e;
    const char *s1 = "{\"type\":\"boolean\"}", *s2 = "{\"type\":\"null\"}";
    ck_assert_int_eq(gram_cache_get(c, GRAM_SCHEMA, s1, strlen(s1), &a, &e), 0);
    ck_assert_int_eq(gram_cache_get(c, GRAM_SCHEMA, s1, strlen(s1), &b, &e), 0);
    ck_assert_ptr_eq(a, b);
    gram_unref(b);
    ck_assert_int_eq(gram_cache_get(c, GRAM_SCHEMA, s2, strlen(s2), &b, &e), 0);
    gram_unref(b);
    ck_assert_int_eq(gram_cache_get(c, GRAM_REGEX, "a|b", 3, &b, &e), 0); /* evicts */
    gram_unref(b);
    uint64_t hits, misses;
    gram_cache_stats(c, &hits, &misses);
    ck_assert_uint_eq(hits, 1);
    ck_assert_uint_eq(misses, 3);
    gram_cache_free(c);
    gram_unref(a); /* outlives the cache */
    /* Nesting past GRAM_MAX_STACK: the matcher stops allowing deeper. */
    ck_assert_int_eq(gram_compile(GRAM_JSON_OBJECT, "", 0, &a, &e), 0);
    gram_matcher *m = gram_matcher_new(a, vocab);
    ck_assert_int_eq(gram_matcher_feed_bytes(m, "{\"a\":", 5), 0);
    int fed = 0;
    for (int i = 0; i < 1500; i++)
        if (gram_matcher_feed_bytes(m, "[", 1) == 0) fed++;
    /* two calls a bracket (a value, then an array) */
    ck_assert_int_gt(fed, GRAM_MAX_STACK / 2 - 4);
    ck_assert_int_lt(fed, GRAM_MAX_STACK / 2 + 1);
    size_t na;
    gram_matcher_mask(m, &na);
    gram_matcher_free(m);
    gram_unref(a);
}
END_TEST

/* What an entry of src counts against the cache's max_bytes. */
static size_t entry_bytes(const char *src)
{
    gram *g;
    gram_error e;
    ck_assert_int_eq(gram_compile(GRAM_SCHEMA, src, strlen(src), &g, &e), 0);
    size_t b = gram_bytes(g) + strlen(src) + 1;
    /* the nodes alone (a kind and two int32) are part of it */
    ck_assert_uint_ge(gram_bytes(g), gram_nodes(g) * 9);
    gram_unref(g);
    return b;
}

/* Gets src through c (a new reference, released at once). */
static void cache_get(gram_cache *c, const char *src)
{
    gram *g = NULL;
    gram_error e;
    ck_assert_int_eq(gram_cache_get(c, GRAM_SCHEMA, src, strlen(src), &g, &e), 0);
    ck_assert_ptr_nonnull(g);
    gram_unref(g);
}

/* The cache is bounded by bytes as well as entries, least recently used
 * out first. */
START_TEST(gram_cache_get_over_max_bytes_evicts_lru)
{
    const char *src[4] = {"{\"type\":\"boolean\"}", "{\"type\":\"null\"}",
                          "{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}",
                          ("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},"
                           "\"required\":[\"a\"]}")};
    size_t b[4];
    for (int i = 0; i < 4; i++) b[i] = entry_bytes(src[i]);
    /* Three fit at first; src[3] fits once src[1] and src[2] (the least
     * recently used after src[0]'s hit) are both gone, not before. */
    size_t bound = b[0] + b[2] + b[3] - 1;
    ck_assert_uint_le(b[0] + b[1] + b[2], bound);
    gram_cache *c = gram_cache_new(64);
    ck_assert_uint_eq(gram_cache_set_max_bytes(c, bound), 0);
    size_t n, bytes;
    uint64_t hits, misses;
    cache_get(c, src[0]);
    cache_get(c, src[1]);
    cache_get(c, src[2]);
    gram_cache_usage(c, &n, &bytes);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(bytes, b[0] + b[1] + b[2]);
    cache_get(c, src[0]); /* a hit: src[1] is now the least recently used */
    cache_get(c, src[3]); /* src[1] goes, then src[2] (src[0] was used last) */
    gram_cache_usage(c, &n, &bytes);
    ck_assert_uint_le(bytes, bound);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(bytes, b[0] + b[3]);
    gram_cache_stats(c, &hits, &misses);
    ck_assert_uint_eq(hits, 1);
    ck_assert_uint_eq(misses, 4);
    cache_get(c, src[0]); /* kept: a hit */
    gram_cache_stats(c, &hits, &misses);
    ck_assert_uint_eq(hits, 2);
    /* A lower bound evicts at once, least recently used first: src[3]. */
    ck_assert_uint_eq(gram_cache_set_max_bytes(c, b[0]), 1);
    gram_cache_usage(c, &n, &bytes);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(bytes, b[0]);
    /* One larger than the whole bound is compiled and served, not kept. */
    ck_assert_uint_eq(gram_cache_set_max_bytes(c, b[0] - 1), 1);
    cache_get(c, src[0]);
    gram_cache_usage(c, &n, &bytes);
    ck_assert_uint_eq(n, 0);
    ck_assert_uint_eq(bytes, 0);
    gram_cache_free(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("grammar");
    TCase *tc = tcase_create("gram");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, schema_walks);
    tcase_add_test(tc, formats);
    tcase_add_test(tc, choice_and_regex);
    tcase_add_test(tc, refusals);
    tcase_add_test(tc, schema_semantics);
    tcase_add_test(tc, thread_bound);
    tcase_add_test(tc, cache_and_recursion_bound);
    tcase_add_test(tc, gram_cache_get_over_max_bytes_evicts_lru);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    gram_vocab_free(vocab);
    bpe_free(gpt2);
    return failed == 0 ? 0 : 1;
}
