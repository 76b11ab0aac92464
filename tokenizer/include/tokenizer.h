/*
 * tokenizer/include/tokenizer.h: GPT-2's byte-level BPE, identical to tiktoken's
 * "gpt2" encoding (encode_ordinary), and a streaming UTF-8 decoder for
 * generated tokens.
 *
 * A tokenizer is loaded from a Hugging Face snapshot's vocab.json and
 * merges.txt, is immutable afterwards, and may be used by any number of
 * threads at once (every call keeps its scratch on the stack or in memory it
 * allocates itself). bpe_encode is ordinary: "<|endoftext|>" in the text is
 * encoded as the characters it is made of; bpe_encode_special makes it the
 * one token 50256, as a model's prompt wants. Id 50256 decodes to that text.
 *
 * Prefixes: bpe_ (the tokenizer), utf8_ (the stream decoder), stop_ (the
 * stop-string matcher).
 */
#ifndef GPT2D_TOKENIZER_TOKENIZER_H
#define GPT2D_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

/* Status codes; never renumbered. */
typedef enum {
    BPE_OK = 0,
    BPE_EIO = 1,     /* a file cannot be opened or read                      */
    BPE_EFORMAT = 2, /* vocab.json or merges.txt is malformed                */
    BPE_ENOMEM = 3,
    BPE_EUNKNOWN = 4, /* an id not in the vocabulary, or text with a byte
                       * the vocabulary cannot represent                      */
    BPE_ETOOBIG = 5   /* a file, an id or a text over its limit                */
} bpe_status;

/* Bounds for hostile files. GPT-2's vocab.json is 1 MB with ids < 50,257. */
#define BPE_MAX_FILE (64u << 20)
#define BPE_MAX_ID 10000000

typedef struct bpe bpe;

const char *bpe_strerror(bpe_status s);

/* ---- Loading ------------------------------------------------------------ */

/*
 * Loads a tokenizer. vocab.json maps token strings (GPT-2's byte-to-unicode
 * symbols) to non-negative integer ids; merges.txt holds an optional
 * "#version" line, then one merge "LEFT RIGHT" per line in rank order. Both
 * parts and the result of every merge must be tokens. On failure *out is
 * NULL and err names the file, the line or token, and the check. Borrows the
 * paths; free the result with bpe_free.
 */
bpe_status bpe_load(const char *vocab_path, const char *merges_path, bpe **out, char *err,
                    size_t errlen);

/* bpe_load on DIR/vocab.json and DIR/merges.txt. */
bpe_status bpe_load_dir(const char *dir, bpe **out, char *err, size_t errlen);

void bpe_free(bpe *t); /* accepts NULL */

/* One more than the largest id (50,257 for GPT-2). */
size_t bpe_vocab_size(const bpe *t);

/* Number of merges (50,000 for GPT-2). */
size_t bpe_merge_count(const bpe *t);

/* ---- Encoding and decoding ---------------------------------------------- */

/*
 * Encodes n bytes of text (any bytes: invalid UTF-8 is kept byte for byte)
 * into *ids, a malloc'd array of *nids ids (free it; NULL when n == 0).
 * There are never more ids than bytes. BPE_EUNKNOWN when a byte of the text
 * has no token (only with vocabularies smaller than GPT-2's). Thread: any.
 */
bpe_status bpe_encode(const bpe *t, const char *text, size_t n, int32_t **ids, size_t *nids,
                      char *err, size_t errlen);

/* GPT-2's one special token: its id, the end of a text (a sequence that
 * samples it is finished), and its text. The one definition of the id:
 * engine/, tools/ and server/ use this. */
#define BPE_EOT 50256
#define BPE_EOT_TEXT "<|endoftext|>"

/*
 * bpe_encode, except that every "<|endoftext|>" in the text is that token
 * (what tiktoken's encode(text, allowed_special="all") and Hugging Face's
 * tokenizer give), and the text between is encoded ordinarily; a vocabulary
 * without the token encodes it ordinarily. Thread: any.
 */
bpe_status bpe_encode_special(const bpe *t, const char *text, size_t n, int32_t **ids, size_t *nids,
                              char *err, size_t errlen);

/*
 * bpe_encode_special for a text that may have at most max tokens: it stops
 * as soon as the text is known to have more (within one pre-tokenizer piece
 * of the limit), and returns BPE_ETOOBIG with *ids NULL, so a long text over
 * a small limit costs the work of max tokens, not of the whole text.
 * Thread: any.
 */
bpe_status bpe_encode_special_max(const bpe *t, const char *text, size_t n, size_t max,
                                  int32_t **ids, size_t *nids, char *err, size_t errlen);

/* The bytes of one token, or NULL for an id not in the vocabulary. Valid
 * until bpe_free(t). Thread: any. */
const char *bpe_token_bytes(const bpe *t, int32_t id, size_t *len);

/*
 * Decodes n ids into *out, a malloc'd buffer of *outlen bytes plus a NUL
 * (the bytes need not be UTF-8: a character can be split across tokens).
 * BPE_EUNKNOWN names the first unknown id. Thread: any.
 */
bpe_status bpe_decode(const bpe *t, const int32_t *ids, size_t n, char **out, size_t *outlen,
                      char *err, size_t errlen);

/*
 * The GPT-2 pretokenizer: the end of the piece that starts at byte pos of
 * text[0..n) (pos < n), following
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * with Unicode 16.0 classes. Bytes that are not valid UTF-8 count as "other"
 * characters one byte long. Thread: any.
 */
size_t bpe_split_next(const char *text, size_t n, size_t pos);

/* The class the pretokenizer gives a code point: 0 other, 1 letter,
 * 2 number, 3 white space. */
int bpe_char_class(uint32_t cp);

/* ---- Streaming UTF-8 decoding ------------------------------------------- */

/*
 * Turns the bytes of generated tokens, fed one token at a time, into valid
 * UTF-8: complete characters are emitted, an incomplete tail is kept for the
 * next call, and every invalid sequence becomes U+FFFD by the "maximal
 * subpart" rule (what Python's bytes.decode("utf-8", errors="replace")
 * produces). The output is always valid UTF-8, so always valid in a JSON
 * string. Plain data: zero-initialise or call utf8_stream_init.
 */
typedef struct {
    unsigned char buf[4]; /* bytes of the incomplete character so far */
    unsigned char len;    /* how many of buf are used                 */
    unsigned char need;   /* bytes the character still needs         */
    unsigned char lo, hi; /* allowed range of the next byte           */
} utf8_stream;

/* Output bound for utf8_stream_feed of n bytes (every byte may become a
 * 3-byte U+FFFD, plus up to 3 held bytes). */
#define UTF8_STREAM_MAX_OUT(n) (3 * ((n) + 4))

void utf8_stream_init(utf8_stream *s);

/* Decodes n bytes; writes at most UTF8_STREAM_MAX_OUT(n) bytes to out and
 * returns how many. Thread: whoever owns s. */
size_t utf8_stream_feed(utf8_stream *s, const char *in, size_t n, char *out);

/* Ends the stream: a dangling incomplete character becomes one U+FFFD.
 * Writes at most 3 bytes; returns how many. s is reset. */
size_t utf8_stream_flush(utf8_stream *s, char *out);

/* Bytes held back, waiting for the rest of a character (0 to 3). */
size_t utf8_stream_pending(const utf8_stream *s);

/* ---- Stop strings --------------------------------------------------------- */

/*
 * Holds back streamed text that could still turn into a stop string, so that
 * no part of one is ever released, even when it spans tokens. Thread:
 * whoever owns it.
 */
typedef struct stop_matcher stop_matcher;

/* Copies the n stop strings (byte strings of the given lengths; empty ones
 * are ignored). NULL when out of memory. Free with stop_free. */
stop_matcher *stop_new(const char *const *stops, const size_t *lens, size_t n);
void stop_free(stop_matcher *m); /* accepts NULL */

/*
 * Feeds n bytes of text; writes the text that is now safe to release to out
 * (room for stop_held(m) + n bytes) and returns its length. *stopped becomes
 * 1 when a stop string has completed: out then holds the text before its
 * first occurrence, and every later feed releases nothing. (size_t)-1 when
 * out of memory.
 */
size_t stop_feed(stop_matcher *m, const char *in, size_t n, char *out, int *stopped);

/* At the end of generation: releases what is held (nothing after a stop). */
size_t stop_flush(stop_matcher *m, char *out);

/* Bytes held back now (less than the longest stop string). */
size_t stop_held(const stop_matcher *m);

/* 1 when p[0..n) is valid UTF-8 (RFC 3629: no overlongs, no surrogates,
 * nothing above U+10FFFF). */
int utf8_valid(const char *p, size_t n);

#endif
