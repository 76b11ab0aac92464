/*
 * tests/fuzz/fuzz_tokenizer.c: libFuzzer target for the tokenizer on the
 * GPT-2 vocabulary. For any bytes: the pretokenizer makes progress and tiles
 * the input, encoding succeeds with no more ids than bytes, decoding gives
 * the input back byte for byte, and the streaming UTF-8 decoder, fed the
 * tokens one at a time, emits valid UTF-8 only. Encoding with the special
 * token also decodes back byte for byte, makes every "<|endoftext|>" the one
 * token 50256, and is the ordinary encoding when the text has none.
 */
#include "tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef GPT2D_VOCAB_DIR
#error "GPT2D_VOCAB_DIR"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bpe *tok;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (tok == NULL && bpe_load_dir(GPT2D_VOCAB_DIR, &tok, NULL, 0) != BPE_OK) __builtin_trap();
    const char *text = (const char *)data;
    for (size_t pos = 0; pos < size;) {
        size_t end = bpe_split_next(text, size, pos);
        if (end <= pos || end > size) __builtin_trap();
        pos = end;
    }
    int32_t *ids;
    size_t n;
    if (bpe_encode(tok, text, size, &ids, &n, NULL, 0) != BPE_OK || n > size) __builtin_trap();
    char *back;
    size_t blen;
    if (bpe_decode(tok, ids, n, &back, &blen, NULL, 0) != BPE_OK) __builtin_trap();
    if (blen != size || (size && memcmp(back, data, size) != 0)) __builtin_trap();
    utf8_stream s;
    utf8_stream_init(&s);
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *p = bpe_token_bytes(tok, ids[i], &len);
        char out[UTF8_STREAM_MAX_OUT(256)];
        if (p == NULL || len > 256) __builtin_trap();
        size_t o = utf8_stream_feed(&s, p, len, out);
        if (!utf8_valid(out, o)) __builtin_trap();
    }
    char tail[4];
    size_t o = utf8_stream_flush(&s, tail);
    if (!utf8_valid(tail, o)) __builtin_trap();
    free(back);
    int32_t *sp;
    size_t ns;
    if (bpe_encode_special(tok, text, size, &sp, &ns, NULL, 0) != BPE_OK || ns > size)
        __builtin_trap();
    if (bpe_decode(tok, sp, ns, &back, &blen, NULL, 0) != BPE_OK) __builtin_trap();
    if (blen != size || (size && memcmp(back, data, size) != 0)) __builtin_trap();
    size_t marks = 0, eots = 0;
    const size_t elen = sizeof BPE_EOT_TEXT - 1;
    for (const char *p = text; (p = memmem(p, size - (size_t)(p - text), BPE_EOT_TEXT, elen));
         p += elen)
        marks++;
    for (size_t i = 0; i < ns; i++) eots += sp[i] == 50256;
    if (eots != marks) __builtin_trap();
    if (marks == 0 && (ns != n || (n && memcmp(sp, ids, n * sizeof *ids) != 0))) __builtin_trap();
    free(back);
    free(sp);
    free(ids);
    return 0;
}
