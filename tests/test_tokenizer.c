/*
 * tests/test_tokenizer.c: tokenizer/ (BPE, pretokenizer, UTF-8 stream).
 *
 * Expected ids are published ones (the seed chapter's, which are tiktoken's);
 * the full agreement with tiktoken is the differential test
 * (tests/differential/tiktoken_diff.mjs). Merge-order rules use tiny
 * hand-written vocabularies. GPT2D_VOCAB_DIR is the vendored GPT-2 files.
 */
#include "tokenizer.h"

#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

#ifndef GPT2D_VOCAB_DIR
#error "GPT2D_VOCAB_DIR must name the directory with vocab.json and merges.txt"
#endif

static bpe *gpt2;

static void load_gpt2(void)
{
    char err[512];
    ck_assert_msg(bpe_load_dir(GPT2D_VOCAB_DIR, &gpt2, err, sizeof err) == BPE_OK, "%s", err);
}

static void free_gpt2(void)
{
    bpe_free(gpt2);
    gpt2 = NULL;
}

typedef bpe_status (*encode_fn)(const bpe *, const char *, size_t, int32_t **, size_t *, char *,
                                size_t);

/* Encodes text with enc and compares with want[0..n). */
static void assert_ids(const bpe *t, encode_fn enc, const char *text, size_t len,
                       const int32_t *want, size_t n)
{
    int32_t *ids;
    size_t nids;
    char err[256];
    ck_assert_msg(enc(t, text, len, &ids, &nids, err, sizeof err) == BPE_OK, "%s", err);
    char got[1024] = "";
    size_t used = 0;
    for (size_t i = 0; i < nids && used < sizeof got - 16; i++)
        used += (size_t)snprintf(got + used, sizeof got - used, "%d ", ids[i]);
    ck_assert_msg(nids == n, "'%s': %zu ids, want %zu (got %s)", text, nids, n, got);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(ids[i] == want[i], "'%s': id %zu is %d, want %d (got %s)", text, i, ids[i],
                      want[i], got);
    free(ids);
}

#define IDS(text, ...)                                                                             \
    do {                                                                                           \
        static const int32_t want_[] = {__VA_ARGS__};                                              \
        assert_ids(gpt2, bpe_encode, text, strlen(text), want_, sizeof want_ / sizeof want_[0]);   \
    } while (0)

#define SPECIAL_IDS(text, ...)                                                                     \
    do {                                                                                           \
        static const int32_t want_[] = {__VA_ARGS__};                                              \
        assert_ids(gpt2, bpe_encode_special, text, strlen(text), want_,                            \
                   sizeof want_ / sizeof want_[0]);                                                \
    } while (0)

START_TEST(bpe_encode_seed_examples)
{
    IDS("Hello, world!", 15496, 11, 995, 0);
    IDS("Hello, my name is", 15496, 11, 616, 1438, 318);
    IDS(" world", 995);
    IDS("tokenization", 30001, 1634);
    IDS("日本", 33768, 98, 17312, 105);
    ck_assert_uint_eq(bpe_vocab_size(gpt2), 50257);
    ck_assert_uint_eq(bpe_merge_count(gpt2), 50000);
}
END_TEST

START_TEST(bpe_encode_japanese_splits_characters_across_tokens)
{
    /* "日本" -> bytes e6 97 | a5 | e6 9c | ac */
    static const char *want[] = {"\xe6\x97", "\xa5", "\xe6\x9c", "\xac"};
    static const int32_t ids[] = {33768, 98, 17312, 105};
    for (int i = 0; i < 4; i++) {
        size_t len;
        const char *p = bpe_token_bytes(gpt2, ids[i], &len);
        ck_assert_ptr_nonnull(p);
        ck_assert_uint_eq(len, strlen(want[i]));
        ck_assert_mem_eq(p, want[i], len);
    }
}
END_TEST

START_TEST(bpe_encode_endoftext_is_ordinary_text)
{
    IDS("<|endoftext|>", 27, 91, 437, 1659, 5239, 91, 29);
    size_t len;
    const char *p = bpe_token_bytes(gpt2, 50256, &len);
    ck_assert_uint_eq(len, 13);
    ck_assert_mem_eq(p, "<|endoftext|>", 13);
}
END_TEST

START_TEST(bpe_encode_special_makes_endoftext_one_token)
{
    SPECIAL_IDS("<|endoftext|>", 50256);
    SPECIAL_IDS("Hello<|endoftext|> world", 15496, 50256, 995);
    SPECIAL_IDS("<|endoftext|><|endoftext|>", 50256, 50256);
    /* The text before it is encoded on its own: "a " ends in a space piece,
     * where ordinarily the space would join the next piece ("a", " <|"). */
    SPECIAL_IDS("a <|endoftext|>", 64, 220, 50256);
    IDS("a <|", 64, 1279, 91);
    /* Anything short of the whole marker is ordinary text. */
    SPECIAL_IDS("<|endoftext|", 27, 91, 437, 1659, 5239, 91);
    SPECIAL_IDS("Hello, world!", 15496, 11, 995, 0);
}
END_TEST

START_TEST(bpe_encode_special_max_stops_past_the_limit)
{
    /* "Hello, world!" is 4 tokens: a limit of 4 or more encodes it whole. */
    int32_t *ids = NULL;
    size_t n = 0;
    char err[128];
    ck_assert_int_eq(
        bpe_encode_special_max(gpt2, "Hello, world!", 13, 4, &ids, &n, err, sizeof err), BPE_OK);
    ck_assert_uint_eq(n, 4);
    ck_assert_int_eq(ids[3], 0);
    free(ids);
    ids = (int32_t *)1;
    ck_assert_int_eq(
        bpe_encode_special_max(gpt2, "Hello, world!", 13, 3, &ids, &n, err, sizeof err),
        BPE_ETOOBIG);
    ck_assert_ptr_null(ids);
    ck_assert_msg(strstr(err, "more than 3 tokens") != NULL, "err: %s", err);
    size_t big = 70000;
    char *text = malloc(big);
    ck_assert_ptr_nonnull(text);
    for (size_t i = 0; i < big; i++) text[i] = i % 7 == 6 ? ' ' : (char)('a' + (i * 7919) % 26);
    /* The same text with room for it all: every id, as bpe_encode_special. */
    int32_t *all = NULL, *ref = NULL;
    size_t nall = 0, nref = 0;
    ck_assert_int_eq(bpe_encode_special_max(gpt2, text, big, SIZE_MAX, &all, &nall, NULL, 0),
                     BPE_OK);
    ck_assert_int_eq(bpe_encode_special(gpt2, text, big, &ref, &nref, NULL, 0), BPE_OK);
    ck_assert_uint_eq(nall, nref);
    ck_assert_mem_eq(all, ref, nref * sizeof *ref);
    free(all);
    free(ref);
    free(text);
}
END_TEST

START_TEST(bpe_encode_empty_text_is_no_ids)
{
    int32_t *ids = (int32_t *)1;
    size_t n = 7;
    ck_assert_int_eq(bpe_encode(gpt2, "", 0, &ids, &n, NULL, 0), BPE_OK);
    ck_assert_ptr_null(ids);
    ck_assert_uint_eq(n, 0);
}
END_TEST

/* The pieces of text, "|"-joined. */
static void split_str(const char *text, size_t n, char *out, size_t cap)
{
    size_t o = 0, pos = 0;
    out[0] = '\0';
    while (pos < n) {
        size_t end = bpe_split_next(text, n, pos);
        ck_assert_uint_gt(end, pos);
        ck_assert_uint_le(end, n);
        if (o && o < cap) out[o++] = '|';
        size_t m = end - pos < cap - o - 1 ? end - pos : cap - o - 1;
        memcpy(out + o, text + pos, m);
        o += m;
        out[o] = '\0';
        pos = end;
    }
}

#define SPLIT(text, want)                                                                          \
    do {                                                                                           \
        char got_[512];                                                                            \
        split_str(text, sizeof(text) - 1, got_, sizeof got_);                                      \
        ck_assert_msg(strcmp(got_, want) == 0, "split of '%s' is '%s', want '%s'", text, got_,     \
                      want);                                                                       \
    } while (0)

START_TEST(bpe_split_next_seed_examples)
{
    SPLIT("Hello, world!", "Hello|,| world|!");
    SPLIT("don't we'll", "don|'t| we|'ll");
    SPLIT("o'clock", "o|'|clock");
    SPLIT("abc123 45", "abc|123| 45");
    SPLIT("a  b", "a| | b");
    SPLIT("a\n\nb", "a|\n|\n|b");
    SPLIT("a   ", "a|   ");
    SPLIT(" \n x", " \n| x");
    SPLIT("Hello, world!  I'm here 2024", "Hello|,| world|!| | I|'m| here| 2024");
    SPLIT("año €5 日本語", "año| €|5| 日本語");
}
END_TEST

START_TEST(bpe_split_next_contractions_and_spaces)
{
    SPLIT("I'M HE'S we've they're she'd it'll", "I|'|M| HE|'|S| we|'ve| they|'re| she|'d| it|'ll");
    SPLIT("'s's", "'s|'s");
    SPLIT("' s", "'| s");
    SPLIT("!!'s", "!!'|s");
    SPLIT(" 's", " '|s");
    SPLIT("x\u3000y", "x|\u3000|y");    /* ideographic space: not an ASCII space */
    SPLIT("x \u00a0y", "x| |\u00a0|y"); /* NBSP cannot lead a word */
    SPLIT("\t\t", "\t\t");
    SPLIT("a\r\n", "a|\r\n");
    SPLIT("x\xff\xfey", "x|\xff\xfe|y");                  /* invalid bytes are "other" */
    SPLIT("1\xe6\x97", "1|\xe6\x97");                     /* a truncated character too */
    SPLIT("Ⅻ½²", "Ⅻ½²");                                  /* numbers of other kinds */
    SPLIT("e\xcc\x81t\xcc\x81", "e|\xcc\x81|t|\xcc\x81"); /* combining marks are Mn: other */
}
END_TEST

START_TEST(bpe_char_class_samples)
{
    ck_assert_int_eq(bpe_char_class('a'), 1);
    ck_assert_int_eq(bpe_char_class(0x65E5), 1); /* 日 */
    ck_assert_int_eq(bpe_char_class('7'), 2);
    ck_assert_int_eq(bpe_char_class(0x00BD), 2); /* ½ */
    ck_assert_int_eq(bpe_char_class(' '), 3);
    ck_assert_int_eq(bpe_char_class(0x85), 3);   /* NEL is White_Space */
    ck_assert_int_eq(bpe_char_class(0xFEFF), 0); /* BOM is not */
    ck_assert_int_eq(bpe_char_class(0x180E), 0); /* not since Unicode 6.3 */
    ck_assert_int_eq(bpe_char_class(0x200B), 0);
    ck_assert_int_eq(bpe_char_class('!'), 0);
    ck_assert_int_eq(bpe_char_class(0x110000), 0);
    /* A letter new in Unicode 16.0: U+1C89 CYRILLIC CAPITAL LETTER TJE. */
    ck_assert_int_eq(bpe_char_class(0x1C89), 1);
}
END_TEST

START_TEST(bpe_decode_round_trips_every_byte)
{
    char text[256];
    for (int i = 0; i < 256; i++) text[i] = (char)i;
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(bpe_encode(gpt2, text, 256, &ids, &n, NULL, 0), BPE_OK);
    char *back;
    size_t blen;
    ck_assert_int_eq(bpe_decode(gpt2, ids, n, &back, &blen, NULL, 0), BPE_OK);
    ck_assert_uint_eq(blen, 256);
    ck_assert_mem_eq(back, text, 256);
    free(back);
    free(ids);
    /* And every single byte alone is one token of that byte. */
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        ck_assert_int_eq(bpe_encode(gpt2, &c, 1, &ids, &n, NULL, 0), BPE_OK);
        ck_assert_uint_eq(n, 1);
        size_t len;
        const char *p = bpe_token_bytes(gpt2, ids[0], &len);
        ck_assert_uint_eq(len, 1);
        ck_assert_int_eq(p[0], c);
        free(ids);
    }
}
END_TEST

START_TEST(bpe_decode_round_trips_invalid_utf8)
{
    static const char text[] =
        "ok \xff\xfe\x80 \xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80 \xe6\x97 end\x00x";
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(bpe_encode(gpt2, text, sizeof text - 1, &ids, &n, NULL, 0), BPE_OK);
    char *back;
    size_t blen;
    ck_assert_int_eq(bpe_decode(gpt2, ids, n, &back, &blen, NULL, 0), BPE_OK);
    ck_assert_uint_eq(blen, sizeof text - 1);
    ck_assert_mem_eq(back, text, blen);
    free(back);
    free(ids);
}
END_TEST

START_TEST(bpe_encode_long_runs_round_trip)
{
    /* Long pieces take the heap merge; the result must still decode back and
     * agree with short pieces of the same word. */
    size_t n = 20000;
    char *text = malloc(n);
    for (size_t i = 0; i < n; i++) text[i] = "abcab"[i % 5];
    int32_t *ids;
    size_t nids;
    ck_assert_int_eq(bpe_encode(gpt2, text, n, &ids, &nids, NULL, 0), BPE_OK);
    ck_assert_uint_lt(nids, n / 2);
    char *back;
    size_t blen;
    ck_assert_int_eq(bpe_decode(gpt2, ids, nids, &back, &blen, NULL, 0), BPE_OK);
    ck_assert_uint_eq(blen, n);
    ck_assert_mem_eq(back, text, n);
    free(back);
    free(ids);
    free(text);
}
END_TEST

START_TEST(bpe_decode_unknown_id_is_an_error)
{
    static const int32_t ids[] = {15496, 50257};
    char *out;
    size_t len;
    char err[256];
    ck_assert_int_eq(bpe_decode(gpt2, ids, 2, &out, &len, err, sizeof err), BPE_EUNKNOWN);
    ck_assert_ptr_null(out);
    ck_assert_ptr_nonnull(strstr(err, "50257"));
    static const int32_t neg[] = {-1};
    ck_assert_int_eq(bpe_decode(gpt2, neg, 1, &out, &len, err, sizeof err), BPE_EUNKNOWN);
    ck_assert_ptr_null(bpe_token_bytes(gpt2, 1 << 30, &len));
}
END_TEST

/* Many threads share one tokenizer: each encodes the same texts and must get
 * what one thread gets. Run under ASan (and TSan by hand) in CI. */
static const char *const thread_texts[] = {
    "Hello, world! don't we'll",
    "año €5 日本語 👩‍👩‍👧",
    "    indented\n\tcode();\n",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
};

static void *encode_many(void *arg)
{
    size_t *counts = arg;
    for (int rep = 0; rep < 200; rep++) {
        for (size_t i = 0; i < 4; i++) {
            int32_t *ids;
            size_t n;
            if (bpe_encode(gpt2, thread_texts[i], strlen(thread_texts[i]), &ids, &n, NULL, 0)
                != BPE_OK)
                return (void *)1;
            if (rep == 0)
                counts[i] = n;
            else if (counts[i] != n)
                return (void *)1;
            free(ids);
        }
    }
    return NULL;
}

START_TEST(bpe_encode_is_safe_from_many_threads)
{
    size_t want[4], got[8][4];
    ck_assert_ptr_null(encode_many(want));
    pthread_t th[8];
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, encode_many, got[i]), 0);
    for (int i = 0; i < 8; i++) {
        void *rc;
        ck_assert_int_eq(pthread_join(th[i], &rc), 0);
        ck_assert_ptr_null(rc);
        for (int k = 0; k < 4; k++) ck_assert_uint_eq(got[i][k], want[k]);
    }
}
END_TEST

/* ---- Tiny vocabularies --------------------------------------------------- */

static char fixdir[256];

static void fix_setup(void)
{
    mkdtemp_template(fixdir, sizeof fixdir, "/tmp/gpt2d-test-bpe-");
    ck_assert_ptr_nonnull(mkdtemp(fixdir));
}

static void fix_teardown(void)
{
    char p[300];
    snprintf(p, sizeof p, "%s/vocab.json", fixdir);
    unlink(p);
    snprintf(p, sizeof p, "%s/merges.txt", fixdir);
    unlink(p);
    rmdir(fixdir);
}

static void write_fixture(const char *vocab, const char *merges)
{
    char p[300];
    FILE *fp;
    if (vocab != NULL) {
        snprintf(p, sizeof p, "%s/vocab.json", fixdir);
        fp = fopen(p, "w");
        fputs(vocab, fp);
        fclose(fp);
    }
    if (merges != NULL) {
        snprintf(p, sizeof p, "%s/merges.txt", fixdir);
        fp = fopen(p, "w");
        fputs(merges, fp);
        fclose(fp);
    }
}

static bpe *load_fixture(const char *vocab, const char *merges)
{
    write_fixture(vocab, merges);
    bpe *t;
    char err[256];
    ck_assert_msg(bpe_load_dir(fixdir, &t, err, sizeof err) == BPE_OK, "%s", err);
    return t;
}

#define TINY_VOCAB                                                                                 \
    "{\"h\": 0, \"e\": 1, \"l\": 2, \"he\": 3, \"el\": 4, \"hel\": 5, \"a\": 6, \"aa\": 7}"

START_TEST(bpe_encode_special_max_never_reads_past_the_limit)
{
    /* "!" has no token here: reaching it is BPE_EUNKNOWN. With a limit the
     * first piece passes, the encoder stops before the "!" piece. */
    bpe *t = load_fixture(TINY_VOCAB, "#version: 0.2\nh e\ne l\nhe l\n");
    int32_t *ids = NULL;
    size_t n = 0;
    ck_assert_int_eq(bpe_encode_special_max(t, "hel!", 4, SIZE_MAX, &ids, &n, NULL, 0),
                     BPE_EUNKNOWN);
    ck_assert_int_eq(bpe_encode_special_max(t, "hel!", 4, 0, &ids, &n, NULL, 0), BPE_ETOOBIG);
    ck_assert_ptr_null(ids);
    ck_assert_int_eq(bpe_encode_special_max(t, "hel", 3, 1, &ids, &n, NULL, 0), BPE_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(ids[0], 5);
    free(ids);
    bpe_free(t);
}
END_TEST

START_TEST(bpe_merges_follow_their_rank)
{
    /* h e (0), e l (1), he l (2): [h][e][l] -> [he][l] -> [hel] */
    bpe *t = load_fixture(TINY_VOCAB, "#version: 0.2\nh e\ne l\nhe l\n");
    static const int32_t want[] = {5};
    assert_ids(t, bpe_encode, "hel", 3, want, 1);
    bpe_free(t);
}
END_TEST

START_TEST(bpe_merges_lower_rank_wins_over_earlier_position)
{
    /* e l (0), h e (1): rank decides, not position -> [h][el] */
    bpe *t = load_fixture("{\"h\": 0, \"e\": 1, \"l\": 2, \"he\": 3, \"el\": 4}", "e l\r\nh e\r\n");
    static const int32_t want[] = {0, 4};
    assert_ids(t, bpe_encode, "hel", 3, want, 2);
    bpe_free(t);
}
END_TEST

START_TEST(bpe_merges_non_overlapping_left_to_right)
{
    /* a a (0): "aaa" -> [aa][a], not [a][aa]; "aaaa" -> [aa][aa] */
    bpe *t = load_fixture(TINY_VOCAB, "a a\n");
    static const int32_t three[] = {7, 6}, four[] = {7, 7};
    assert_ids(t, bpe_encode, "aaa", 3, three, 2);
    assert_ids(t, bpe_encode, "aaaa", 4, four, 2);
    /* A long run takes the heap path and must agree: 101 a's -> 50 [aa], [a]. */
    char run[101];
    memset(run, 'a', sizeof run);
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(bpe_encode(t, run, sizeof run, &ids, &n, NULL, 0), BPE_OK);
    ck_assert_uint_eq(n, 51);
    for (size_t i = 0; i < 50; i++) ck_assert_int_eq(ids[i], 7);
    ck_assert_int_eq(ids[50], 6);
    free(ids);
    bpe_free(t);
}
END_TEST

START_TEST(bpe_encode_byte_without_token_is_eunknown)
{
    bpe *t = load_fixture(TINY_VOCAB, "h e\n");
    int32_t *ids;
    size_t n;
    char err[256];
    ck_assert_int_eq(bpe_encode(t, "hex", 3, &ids, &n, err, sizeof err), BPE_EUNKNOWN);
    ck_assert_ptr_nonnull(strstr(err, "0x78"));
    ck_assert_ptr_null(ids);
    /* Without the token in the vocabulary, the marker is ordinary text. */
    ck_assert_int_eq(bpe_encode_special(t, "<|endoftext|>", 13, &ids, &n, err, sizeof err),
                     BPE_EUNKNOWN);
    ck_assert_ptr_nonnull(strstr(err, "0x3C (at 0)"));
    bpe_free(t);
    /* With it, the offset of a bad byte counts from the start of the text. */
    t = load_fixture("{\"h\": 0, \"e\": 1, \"<|endoftext|>\": 2}", "");
    ck_assert_int_eq(bpe_encode_special(t, "he<|endoftext|>hex", 18, &ids, &n, err, sizeof err),
                     BPE_EUNKNOWN);
    ck_assert_ptr_nonnull(strstr(err, "0x78 (at 17)"));
    static const int32_t want[] = {0, 1, 2, 0, 1};
    assert_ids(t, bpe_encode_special, "he<|endoftext|>he", 17, want, 5);
    bpe_free(t);
}
END_TEST

typedef struct {
    const char *what, *vocab, *merges;
    bpe_status status;
    const char *words;
} bad_files;

static const bad_files bad_file_cases[] = {
    {"id is a string", "{\"a\": \"1\"}", "", BPE_EFORMAT, "not a non-negative integer"},
    {"id is negative", "{\"a\": -1}", "", BPE_EFORMAT, "not a non-negative integer"},
    {"id is a float", "{\"a\": 1.0}", "", BPE_EFORMAT, "not a non-negative integer"},
    {"id too large", "{\"a\": 99999999}", "", BPE_ETOOBIG, "over"},
    {"duplicate id", "{\"a\": 1, \"b\": 1}", "", BPE_EFORMAT, "id 1 is used by two tokens"},
    {"duplicate token", "{\"a\": 1, \"a\": 2}", "", BPE_EFORMAT, "not valid JSON"},
    {"not an object", "[1]", "", BPE_EFORMAT, "not a JSON object"},
    {"not JSON", "{", "", BPE_EFORMAT, "not valid JSON"},
    {"empty vocabulary", "{}", "", BPE_EFORMAT, "empty"},
    {"character outside the byte symbols", "{\"a\": 0, \"\xe2\x82\xac\": 1}", "", BPE_EFORMAT,
     "outside the 256 byte symbols"},
    {"raw space in a token", "{\"a b\": 0}", "", BPE_EFORMAT, "outside the 256 byte symbols"},
    {"merges line with one symbol", "{\"a\": 0}", "a\n", BPE_EFORMAT,
     ":1: \"a\" is not two symbols"},
    {"merges line with three symbols", "{\"a\": 0}", "#version: 0.2\na a a\n", BPE_EFORMAT,
     ":2: \"a a a\" is not two symbols"},
    {"merges line with two spaces", "{\"a\": 0}", "a  a\n", BPE_EFORMAT, "not two symbols"},
    {"merge part not in vocabulary", "{\"a\": 0, \"ab\": 1}", "a b\n", BPE_EFORMAT,
     "right part of \"a b\" is not in the vocabulary"},
    {"merge result not in vocabulary", "{\"a\": 0, \"b\": 1}", "a b\n", BPE_EFORMAT,
     "result of \"a b\" is not in the vocabulary"},
    {"merge with a non-symbol", "{\"a\": 0}", "a \xe2\x82\xac\n", BPE_EFORMAT, "outside"},
    {"repeated merge", "{\"a\": 0, \"aa\": 1}", "a a\na a\n", BPE_EFORMAT, "repeats"},
};

START_TEST(bpe_load_malformed_files)
{
    const bad_files *b = &bad_file_cases[_i];
    write_fixture(b->vocab, b->merges);
    bpe *t = (bpe *)1;
    char err[512];
    bpe_status s = bpe_load_dir(fixdir, &t, err, sizeof err);
    ck_assert_msg(s == b->status, "%s: status %d (%s)", b->what, s, err);
    ck_assert_ptr_null(t);
    ck_assert_msg(strstr(err, b->words) != NULL, "%s: '%s' lacks '%s'", b->what, err, b->words);
    ck_assert_msg(strstr(err, fixdir) != NULL, "%s: '%s' does not name the file", b->what, err);
}
END_TEST

START_TEST(bpe_load_missing_files)
{
    bpe *t;
    char err[512];
    ck_assert_int_eq(bpe_load_dir(fixdir, &t, err, sizeof err), BPE_EIO);
    ck_assert_ptr_nonnull(strstr(err, "vocab.json: cannot open"));
    write_fixture("{\"a\": 0}", NULL);
    ck_assert_int_eq(bpe_load_dir(fixdir, &t, err, sizeof err), BPE_EIO);
    ck_assert_ptr_nonnull(strstr(err, "merges.txt: cannot open"));
    ck_assert_ptr_null(t);
    ck_assert_int_eq(bpe_load(fixdir, fixdir, &t, err, sizeof err), BPE_EIO);
    ck_assert_ptr_nonnull(strstr(err, "not a regular file"));
    for (int s = 0; s <= BPE_ETOOBIG; s++)
        ck_assert_str_ne(bpe_strerror((bpe_status)s), "unknown status");
}
END_TEST

/* ---- The streaming UTF-8 decoder ----------------------------------------- */

/* An independent, non-streaming reference: maximal subparts, written from
 * Unicode's table 3-7 as a test of the streaming code. */
static size_t ref_decode(const unsigned char *p, size_t n, char *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t need;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            out[o++] = (char)c;
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF)
            need = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else
            need = 0;
        size_t k = 1;
        while (k <= need && i + k < n && p[i + k] >= (k == 1 ? lo : 0x80)
               && p[i + k] <= (k == 1 ? hi : 0xBF))
            k++;
        if (need > 0 && k == need + 1) {
            memcpy(out + o, p + i, k);
            o += k;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
        }
        i += k;
    }
    return o;
}

/* Feeds p[0..n) cut at the given points, then flushes. */
static size_t stream_decode(const unsigned char *p, size_t n, const size_t *cuts, size_t ncuts,
                            char *out)
{
    utf8_stream s;
    utf8_stream_init(&s);
    size_t o = 0, prev = 0;
    for (size_t c = 0; c <= ncuts; c++) {
        size_t end = c < ncuts ? cuts[c] : n;
        size_t w = utf8_stream_feed(&s, (const char *)p + prev, end - prev, out + o);
        ck_assert_uint_le(w, UTF8_STREAM_MAX_OUT(end - prev));
        ck_assert(utf8_valid(out + o, w));
        o += w;
        prev = end;
    }
    o += utf8_stream_flush(&s, out + o);
    ck_assert_uint_eq(utf8_stream_pending(&s), 0);
    return o;
}

START_TEST(utf8_stream_every_split_of_multibyte_characters)
{
    static const char text[] = "a\xc3\xa9"
                               "b\xe6\x97\xa5"
                               "c\xf0\x9f\x98\x80"
                               "d\xe2\x82\xac";
    size_t n = sizeof text - 1;
    char out[256];
    for (size_t a = 0; a <= n; a++) {
        for (size_t b = a; b <= n; b++) {
            size_t cuts[2] = {a, b};
            size_t o = stream_decode((const unsigned char *)text, n, cuts, 2, out);
            ck_assert_uint_eq(o, n);
            ck_assert_mem_eq(out, text, n);
        }
    }
    /* One token's bytes at a time: only whole characters come out. */
    utf8_stream s;
    utf8_stream_init(&s);
    ck_assert_uint_eq(utf8_stream_feed(&s, "\xe6\x97", 2, out), 0);
    ck_assert_uint_eq(utf8_stream_pending(&s), 2);
    ck_assert_uint_eq(utf8_stream_feed(&s, "\xa5", 1, out), 3);
    ck_assert_mem_eq(out, "\xe6\x97\xa5", 3);
}
END_TEST

START_TEST(utf8_stream_invalid_input_matches_python_replace)
{
    /* Expected values are CPython's bytes.decode("utf-8", errors="replace"). */
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"\xff", "\xef\xbf\xbd"},
        {"\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xe6\x97"
         "A",
         "\xef\xbf\xbd"
         "A"},                                                    /* truncated: one U+FFFD */
        {"\xe0\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* overlong: three */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* surrogate: three */
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xf0\x9f\x98", "\xef\xbf\xbd"}, /* dangling at the end: flush */
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},
        {"a\xf0\x9f\x98\xe6\x97\xa5", "a\xef\xbf\xbd\xe6\x97\xa5"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[64];
        size_t n = strlen(cases[i].in);
        for (size_t cut = 0; cut <= n; cut++) {
            size_t o = stream_decode((const unsigned char *)cases[i].in, n, &cut, 1, out);
            ck_assert_msg(o == strlen(cases[i].out) && memcmp(out, cases[i].out, o) == 0,
                          "case %zu cut %zu", i, cut);
        }
    }
}
END_TEST

START_TEST(utf8_stream_random_bytes_match_the_reference)
{
    uint64_t x = 0x9E3779B97F4A7C15ull;
    unsigned char in[64];
    char a[1024], b[1024];
    for (int iter = 0; iter < 20000; iter++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t n = (size_t)(x % 40);
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            /* Bias toward the interesting bytes. */
            static const unsigned char pool[] = {0x41, 0x80, 0x8F, 0x90, 0x9F, 0xA0,
                                                 0xBF, 0xC0, 0xC2, 0xDF, 0xE0, 0xE6,
                                                 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF};
            in[i] = (x >> 8) % 3 ? pool[(x >> 16) % sizeof pool] : (unsigned char)(x >> 24);
        }
        size_t cuts[3];
        for (int c = 0; c < 3; c++) cuts[c] = n ? (size_t)((x >> (10 * c)) % (n + 1)) : 0;
        if (cuts[0] > cuts[1]) {
            size_t t = cuts[0];
            cuts[0] = cuts[1];
            cuts[1] = t;
        }
        if (cuts[1] > cuts[2]) {
            size_t t = cuts[1];
            cuts[1] = cuts[2];
            cuts[2] = t;
        }
        if (cuts[0] > cuts[1]) {
            size_t t = cuts[0];
            cuts[0] = cuts[1];
            cuts[1] = t;
        }
        size_t na = stream_decode(in, n, cuts, 3, a);
        size_t nb = ref_decode(in, n, b);
        ck_assert_uint_eq(na, nb);
        ck_assert_mem_eq(a, b, na);
    }
}
END_TEST

/* ---- Stop strings ---------------------------------------------------------- */

/* Feeds pieces; returns everything released (including the final flush). */
static size_t stop_run(const char *const *stops, size_t nstops, const char *const *pieces,
                       size_t npieces, char *out, int *stopped)
{
    size_t lens[8];
    for (size_t i = 0; i < nstops; i++) lens[i] = strlen(stops[i]);
    stop_matcher *m = stop_new(stops, lens, nstops);
    ck_assert_ptr_nonnull(m);
    size_t o = 0;
    *stopped = 0;
    for (size_t i = 0; i < npieces; i++) {
        int st;
        size_t w = stop_feed(m, pieces[i], strlen(pieces[i]), out + o, &st);
        ck_assert(w != (size_t)-1);
        o += w;
        if (st) *stopped = 1;
    }
    o += stop_flush(m, out + o);
    out[o] = '\0';
    stop_free(m);
    return o;
}

START_TEST(stop_feed_spanning_tokens_never_leaks)
{
    char out[256];
    int stopped;
    static const char *const s1[] = {"\n\n"};
    static const char *const p1[] = {"Hello", "\n", "\nWorld"};
    stop_run(s1, 1, p1, 3, out, &stopped);
    ck_assert_str_eq(out, "Hello");
    ck_assert(stopped);

    /* A partial match is held, then released when it turns out not to be one. */
    static const char *const s2[] = {"END"};
    size_t lens[] = {3};
    stop_matcher *m = stop_new(s2, lens, 1);
    int st;
    ck_assert_uint_eq(stop_feed(m, "abcE", 4, out, &st), 3);
    ck_assert_uint_eq(stop_held(m), 1);
    ck_assert_uint_eq(stop_feed(m, "N", 1, out, &st), 0);
    ck_assert_uint_eq(stop_held(m), 2);
    ck_assert_uint_eq(stop_feed(m, "x", 1, out, &st), 3);
    ck_assert_mem_eq(out, "ENx", 3);
    ck_assert(!st);
    stop_free(m);

    /* The earliest occurrence wins among several stop strings. */
    static const char *const s3[] = {"bc", "abcd"};
    static const char *const p3[] = {"xa", "bcd"};
    stop_run(s3, 2, p3, 2, out, &stopped);
    ck_assert_str_eq(out, "x");
    /* Multi-byte stop strings across pieces; nothing after a stop. */
    static const char *const s4[] = {"日本"};
    static const char *const p4[] = {"x日", "本y", "more"};
    stop_run(s4, 1, p4, 3, out, &stopped);
    ck_assert_str_eq(out, "x");
    /* No stop: everything comes out, the held tail at the flush. */
    static const char *const p5[] = {"a\n", "b\n"};
    stop_run(s1, 1, p5, 2, out, &stopped);
    ck_assert_str_eq(out, "a\nb\n");
    ck_assert(!stopped);
    /* Empty stop strings are ignored. */
    static const char *const s6[] = {""};
    static const char *const p6[] = {"abc"};
    stop_run(s6, 1, p6, 1, out, &stopped);
    ck_assert_str_eq(out, "abc");
}
END_TEST

START_TEST(stop_feed_random_pieces_match_a_reference)
{
    uint64_t x = 12345;
#define NEXT() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
    char text[64], out[256];
    for (int iter = 0; iter < 20000; iter++) {
        size_t n = NEXT() % 40;
        for (size_t i = 0; i < n; i++) text[i] = "ab\nc"[NEXT() % 4];
        text[n] = '\0';
        char stop_a[5], stop_b[5];
        size_t la = 1 + NEXT() % 4, lb = 1 + NEXT() % 4;
        for (size_t i = 0; i < la; i++) stop_a[i] = "ab\nc"[NEXT() % 4];
        for (size_t i = 0; i < lb; i++) stop_b[i] = "ab\nc"[NEXT() % 4];
        stop_a[la] = stop_b[lb] = '\0';
        int has_stop = strstr(text, stop_a) != NULL || strstr(text, stop_b) != NULL;
        /* Feed in random pieces. */
        char piece_store[64][64];
        const char *pieces[64];
        size_t np = 0, pos = 0;
        while (pos < n) {
            size_t k = 1 + NEXT() % 5;
            if (k > n - pos) k = n - pos;
            memcpy(piece_store[np], text + pos, k);
            piece_store[np][k] = '\0';
            pieces[np] = piece_store[np];
            np++;
            pos += k;
        }
        const char *stops[2] = {stop_a, stop_b};
        int stopped;
        stop_run(stops, 2, pieces, np, out, &stopped);
        /* Streaming semantics: generation stops at the first piece after
         * which some stop string is present; the released text is a prefix
         * of the text, contains no stop string, and (after a stop) is
         * followed in the text by one. Without a stop it is all the text. */
        size_t on = strlen(out);
        ck_assert_msg(on <= n && memcmp(out, text, on) == 0, "'%s' is not a prefix of '%s'", out,
                      text);
        ck_assert(strstr(out, stop_a) == NULL && strstr(out, stop_b) == NULL);
        ck_assert_int_eq(stopped, has_stop);
        if (stopped)
            ck_assert_msg(strncmp(text + on, stop_a, la) == 0
                              || strncmp(text + on, stop_b, lb) == 0,
                          "text '%s' stops '%s' '%s': '%s' is not followed by a stop", text, stop_a,
                          stop_b, out);
        else
            ck_assert_uint_eq(on, n);
    }
#undef NEXT
}
END_TEST

static Suite *bpe_suite(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("bpe_encode");
    tcase_add_unchecked_fixture(tc, load_gpt2, free_gpt2);
    tcase_add_test(tc, bpe_encode_seed_examples);
    tcase_add_test(tc, bpe_encode_japanese_splits_characters_across_tokens);
    tcase_add_test(tc, bpe_encode_endoftext_is_ordinary_text);
    tcase_add_test(tc, bpe_encode_special_makes_endoftext_one_token);
    tcase_add_test(tc, bpe_encode_special_max_stops_past_the_limit);
    tcase_add_test(tc, bpe_encode_empty_text_is_no_ids);
    tcase_add_test(tc, bpe_encode_long_runs_round_trip);
    tcase_add_test(tc, bpe_decode_round_trips_every_byte);
    tcase_add_test(tc, bpe_decode_round_trips_invalid_utf8);
    tcase_add_test(tc, bpe_decode_unknown_id_is_an_error);
    tcase_add_test(tc, bpe_encode_is_safe_from_many_threads);
    suite_add_tcase(s, tc);

    tc = tcase_create("bpe_split_next");
    tcase_add_test(tc, bpe_split_next_seed_examples);
    tcase_add_test(tc, bpe_split_next_contractions_and_spaces);
    tcase_add_test(tc, bpe_char_class_samples);
    suite_add_tcase(s, tc);

    tc = tcase_create("bpe_load");
    tcase_add_checked_fixture(tc, fix_setup, fix_teardown);
    tcase_add_test(tc, bpe_merges_follow_their_rank);
    tcase_add_test(tc, bpe_encode_special_max_never_reads_past_the_limit);
    tcase_add_test(tc, bpe_merges_lower_rank_wins_over_earlier_position);
    tcase_add_test(tc, bpe_merges_non_overlapping_left_to_right);
    tcase_add_test(tc, bpe_encode_byte_without_token_is_eunknown);
    tcase_add_loop_test(tc, bpe_load_malformed_files, 0,
                        (int)(sizeof bad_file_cases / sizeof bad_file_cases[0]));
    tcase_add_test(tc, bpe_load_missing_files);
    suite_add_tcase(s, tc);

    tc = tcase_create("stop_feed");
    tcase_add_test(tc, stop_feed_spanning_tokens_never_leaks);
    tcase_add_test(tc, stop_feed_random_pieces_match_a_reference);
    suite_add_tcase(s, tc);

    tc = tcase_create("utf8_stream");
    tcase_add_test(tc, utf8_stream_every_split_of_multibyte_characters);
    tcase_add_test(tc, utf8_stream_invalid_input_matches_python_replace);
    tcase_add_test(tc, utf8_stream_random_bytes_match_the_reference);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(bpe_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
