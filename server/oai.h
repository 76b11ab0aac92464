/*
 * server/oai.h: the OpenAI legacy completions request, parsed and validated
 * (../shared/OPENAI-COMPLETIONS.md, docs/api.md). Pure: JSON in, a request
 * or an OpenAI-shaped error out; no HTTP, no engine.
 *
 * Prefix: oai_. Thread: any.
 */
#ifndef GPT2D_SERVER_OAI_H
#define GPT2D_SERVER_OAI_H

#include <stddef.h>
#include <stdint.h>

#define OAI_MAX_STOP 4
#define OAI_MAX_LOGPROBS 5

/* The server's limits a request is checked against. */
typedef struct {
    size_t vocab_size;       /* token ids must be below it   */
    size_t max_tokens_limit; /* ceiling for max_tokens       */
    size_t max_n;            /* ceiling for n and best_of    */
    size_t max_stop_bytes;   /* longest stop string          */
    size_t max_prompts;      /* entries of a prompt array    */
} oai_limits;

/* One prompt: text to tokenize, or token ids. */
typedef struct {
    char *text; /* owned, NUL-terminated; NULL for ids */
    size_t text_len;
    int32_t *ids; /* owned; NULL for text */
    size_t nids;
} oai_prompt;

typedef struct {
    int32_t token;
    float bias;
} oai_bias;

typedef struct {
    char *model; /* owned */
    oai_prompt *prompts;
    size_t nprompts;
    size_t max_tokens;  /* default 16 */
    double temperature; /* default 1 */
    double top_p;       /* default 1 */
    int top_k;          /* extension; 0 = off */
    size_t n;           /* default 1 */
    size_t best_of;     /* default n */
    int stream;
    int include_usage; /* stream_options.include_usage */
    char *stop[OAI_MAX_STOP];
    size_t stop_len[OAI_MAX_STOP];
    size_t nstop;
    double presence_penalty, frequency_penalty;
    oai_bias *bias; /* logit_bias */
    size_t nbias;
    int has_seed;
    uint64_t seed;
    int logprobs; /* -1: not asked; 0..5 */
    int echo;
    int ignore_eos;   /* extension */
    double timeout_s; /* extension: per-request deadline; 0 = none */
} oai_request;

/* An error as OpenAI sends it: status, then the body's four fields. */
typedef struct {
    int status;
    const char *type; /* "invalid_request_error", ... */
    const char *code; /* NULL or "context_length_exceeded", ... */
    char param[64];   /* "" for null */
    char message[512];
} oai_error;

/*
 * Parses and validates a POST /v1/completions body. On success returns 0
 * and fills req (free with oai_request_free); otherwise returns -1, req is
 * empty, and err holds the 400 error naming the parameter. Unknown fields
 * are ignored; `suffix` is rejected. Whether `model` names the served model
 * (404) and whether prompt + max_tokens fit the context (400, after
 * tokenization) are the caller's checks.
 */
int oai_parse_completion(const char *body, size_t len, const oai_limits *lim, oai_request *req,
                         oai_error *err);

void oai_request_free(oai_request *req);

/* Fills err (the four fields and the status). */
void oai_error_set(oai_error *err, int status, const char *type, const char *code,
                   const char *param, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

/* The error body {"error": {...}} as a malloc'd NUL-terminated string. */
char *oai_error_json(const oai_error *err);

#endif
