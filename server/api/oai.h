/*
 * server/api/oai.h: the OpenAI legacy completions request, parsed and validated
 * (../shared/OPENAI-COMPLETIONS.md, docs/api.md). Pure: JSON in, a request
 * or an OpenAI-shaped error out; no HTTP, no engine.
 *
 * Prefix: oai_. Thread: any.
 */
#ifndef GPT2D_SERVER_OAI_H
#define GPT2D_SERVER_OAI_H

#include <stddef.h>
#include <stdint.h>

#define OAI_MAX_STOP 4         /* stop strings a request may send */
#define OAI_MAX_LOGPROBS 5     /* top alternatives per token */
#define OAI_MAX_CACHE_SALT 256 /* bytes of a cache_salt */
/* Stop strings a request holds: its own plus a chat template's. */
#define OAI_STOP_CAP (2 * OAI_MAX_STOP)

/* The server's limits a request is checked against. */
typedef struct {
    size_t vocab_size;       /* token ids must be below it   */
    size_t max_tokens_limit; /* ceiling for max_tokens       */
    size_t max_n;            /* ceiling for n and best_of    */
    size_t max_stop_bytes;   /* longest stop string          */
    size_t max_prompts;      /* entries of a prompt array    */
    size_t chat_max_tokens;  /* chat without max_tokens: at most this many */
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
    char *model;         /* owned; NULL: absent, the served model */
    int chat;            /* 1: POST /v1/chat/completions (answers in the chat shape) */
    int max_tokens_auto; /* 1: max_tokens was not given (chat): what the context allows */
    int max_completion;  /* 1: max_tokens came as max_completion_tokens (errors name it) */
    oai_prompt *prompts;
    size_t nprompts;
    size_t max_tokens;  /* default 16 */
    double temperature; /* default 1 */
    double top_p;       /* default 1 */
    int top_k;          /* extension; 0 = off */
    size_t n;           /* default 1 */
    size_t best_of;     /* default n */
    int stream;
    int include_usage;        /* stream_options.include_usage */
    char *stop[OAI_STOP_CAP]; /* the request's, then the chat template's */
    size_t stop_len[OAI_STOP_CAP];
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
    /* extension (vLLM's): the prefix cache partition within the API key;
     * owned, 1..OAI_MAX_CACHE_SALT bytes (NUL allowed), NULL: absent */
    char *cache_salt;
    size_t cache_salt_len;
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

/*
 * A chat template: how a list of messages becomes GPT-2's prompt text
 * (docs/api.md, "Chat templates"). The prompt is `begin`, then each message
 * as its role's prefix + content + suffix, then `generation`, which the
 * model continues; `stop` strings end the reply (the turn separator).
 */
typedef enum { OAI_ROLE_SYSTEM = 0, OAI_ROLE_USER, OAI_ROLE_ASSISTANT, OAI_NROLES } oai_role;

#define OAI_TEMPLATE_MAX_STOP OAI_MAX_STOP

typedef struct {
    char *begin;                       /* owned; may be "" */
    char *prefix[OAI_NROLES];          /* owned */
    char *suffix[OAI_NROLES];          /* owned */
    char *generation;                  /* owned */
    char *stop[OAI_TEMPLATE_MAX_STOP]; /* owned */
    size_t nstop;
    int trim_reply; /* 1: leading spaces of the reply are not part of its content */
} oai_template;

/* The built-in transcript template (docs/api.md). Returns 0, or -1 when out
 * of memory (t empty). Free with oai_template_free. */
int oai_template_default(oai_template *t);

/*
 * Reads a template file (`key = "string"` lines, docs/api.md). Returns 0,
 * or -1 with t empty and err naming the file and line. Borrows path.
 */
int oai_template_load(const char *path, oai_template *t, char *err, size_t errlen);

void oai_template_free(oai_template *t); /* accepts an empty t */

/*
 * Parses and validates a POST /v1/chat/completions body and renders its
 * messages through template t into one text prompt, with t's stop strings
 * after the request's own. As oai_parse_completion otherwise: 0 and req, or
 * -1 and the 400 in err. `tools`, `functions` and a `response_format` other
 * than text are refused.
 */
int oai_parse_chat(const char *body, size_t len, const oai_limits *lim, const oai_template *t,
                   oai_request *req, oai_error *err);

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
