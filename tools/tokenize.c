/*
 * tools/tokenize.c: `gpt2d tokenize` and `gpt2d detokenize`.
 *
 *   gpt2d tokenize --model DIR [--jsonl] [--special]
 *                                          raw bytes on stdin -> [ids] on stdout;
 *                                          --jsonl: one JSON string per line in,
 *                                          one array of ids per line out;
 *                                          --special: "<|endoftext|>" is id 50256
 *   gpt2d detokenize --model DIR           [ids] on stdin -> raw bytes on stdout
 *
 * DIR holds vocab.json and merges.txt.
 */
#include "tools.h"

#include "tokenizer.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Standard input is bounded like any other input (1 GiB). */
#define STDIN_MAX (1ul << 30)

static void tok_usage(FILE *out, const char *cmd)
{
    if (strcmp(cmd, "tokenize") == 0)
        fprintf(out, "usage: gpt2d tokenize --model DIR [--jsonl] [--special]\n"
                     "Reads raw bytes on stdin and prints their GPT-2 token ids as a JSON array.\n"
                     "  --model DIR   directory with vocab.json and merges.txt\n"
                     "  --jsonl       every stdin line is a JSON string; print one array per line\n"
                     "  --special     \"<|endoftext|>\" in the text is the token 50256 (as in the\n"
                     "                server's prompts), not the 7 tokens of its characters\n");
    else
        fprintf(out, "usage: gpt2d detokenize --model DIR\n"
                     "Reads a JSON array of token ids on stdin and writes their bytes to stdout.\n"
                     "  --model DIR   directory with vocab.json and merges.txt\n");
}

static char *read_stdin(size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf != NULL) {
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            if (cap >= STDIN_MAX) {
                free(buf);
                return NULL;
            }
            cap *= 2;
            char *grown = realloc(buf, cap + 1);
            if (grown == NULL) free(buf);
            buf = grown;
        }
    }
    if (buf == NULL) return NULL;
    if (ferror(stdin)) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static void print_ids(const int32_t *ids, size_t n)
{
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    fputs("]\n", stdout);
}

typedef bpe_status (*encode_fn)(const bpe *, const char *, size_t, int32_t **, size_t *, char *,
                                size_t);

static int encode_jsonl(const bpe *t, encode_fn enc, const char *text, size_t len)
{
    size_t pos = 0, lineno = 0;
    char err[256];
    while (pos < len) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len;
        lineno++;
        json_error_t jerr;
        json_t *v = json_loadb(text + pos, end - pos, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
        if (v == NULL || !json_is_string(v)) {
            fprintf(stderr, "gpt2d tokenize: stdin:%zu: not a JSON string%s%s\n", lineno,
                    v == NULL ? ": " : "", v == NULL ? jerr.text : "");
            json_decref(v);
            return 1;
        }
        int32_t *ids;
        size_t nids;
        bpe_status s =
            enc(t, json_string_value(v), json_string_length(v), &ids, &nids, err, sizeof err);
        json_decref(v);
        if (s != BPE_OK) {
            fprintf(stderr, "gpt2d tokenize: stdin:%zu: %s\n", lineno, err);
            return 1;
        }
        print_ids(ids, nids);
        free(ids);
        pos = end + 1;
    }
    return 0;
}

static int run(int argc, char **argv, int encode)
{
    static const struct option longopts[] = {{"model", required_argument, 0, 'm'},
                                             {"jsonl", no_argument, 0, 'j'},
                                             {"special", no_argument, 0, 's'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    const char *cmd = argv[0], *model = NULL;
    int jsonl = 0, special = 0, c, idx = 0;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":", longopts, &idx)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'j':
            if (!encode) goto bad;
            jsonl = 1;
            break;
        case 's':
            if (!encode) goto bad;
            special = 1;
            break;
        case 'h': tok_usage(stdout, cmd); return 0;
        default: goto bad;
        }
    }
    if (model == NULL || optind != argc) {
        fprintf(stderr, "gpt2d %s: %s\n", cmd,
                model == NULL ? "--model DIR is required" : "unexpected argument");
        tok_usage(stderr, cmd);
        return 2;
    }
    char err[512];
    bpe *t;
    if (bpe_load_dir(model, &t, err, sizeof err) != BPE_OK) {
        fprintf(stderr, "gpt2d %s: %s\n", cmd, err);
        return 1;
    }
    size_t len;
    char *in = read_stdin(&len);
    int rc = 1;
    if (in == NULL) {
        fprintf(stderr, "gpt2d %s: cannot read stdin (or it is over 1 GiB)\n", cmd);
        goto done;
    }
    encode_fn enc = special ? bpe_encode_special : bpe_encode;
    if (encode && jsonl) {
        rc = encode_jsonl(t, enc, in, len);
    } else if (encode) {
        int32_t *ids;
        size_t nids;
        if (enc(t, in, len, &ids, &nids, err, sizeof err) != BPE_OK) {
            fprintf(stderr, "gpt2d %s: %s\n", cmd, err);
            goto done;
        }
        print_ids(ids, nids);
        free(ids);
        rc = 0;
    } else {
        json_error_t jerr;
        json_t *arr = json_loadb(in, len, 0, &jerr);
        if (arr == NULL || !json_is_array(arr)) {
            fprintf(stderr, "gpt2d %s: stdin is not a JSON array of ids%s%s\n", cmd,
                    arr == NULL ? ": " : "", arr == NULL ? jerr.text : "");
            json_decref(arr);
            goto done;
        }
        size_t n = json_array_size(arr);
        int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
        for (size_t i = 0; ids != NULL && i < n; i++) {
            json_t *v = json_array_get(arr, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0
                || json_integer_value(v) > INT32_MAX) {
                fprintf(stderr, "gpt2d %s: element %zu is not a token id\n", cmd, i);
                free(ids);
                json_decref(arr);
                goto done;
            }
            ids[i] = (int32_t)json_integer_value(v);
        }
        json_decref(arr);
        char *bytes;
        size_t nb;
        if (ids == NULL || bpe_decode(t, ids, n, &bytes, &nb, err, sizeof err) != BPE_OK) {
            fprintf(stderr, "gpt2d %s: %s\n", cmd, ids == NULL ? "out of memory" : err);
            free(ids);
            goto done;
        }
        fwrite(bytes, 1, nb, stdout);
        free(bytes);
        free(ids);
        rc = 0;
    }
done:
    free(in);
    bpe_free(t);
    if (fflush(stdout) != 0) rc = 1;
    return rc;
bad:
    if (c == 'j' || c == 's')
        fprintf(stderr, "gpt2d %s: --%s is only for tokenize\n", cmd, longopts[idx].name);
    else
        tool_option_error(cmd, c, argv, optind, longopts, idx);
    tok_usage(stderr, cmd);
    return 2;
}

int tool_tokenize(int argc, char **argv)
{
    return run(argc, argv, 1);
}
int tool_detokenize(int argc, char **argv)
{
    return run(argc, argv, 0);
}
