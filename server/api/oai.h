/*
 * server/api/oai.h: the OpenAI legacy completions request, parsed and validated
 * (../shared/OPENAI-COMPLETIONS.md, docs/api.md). Pure: JSON in, a request
 * or an OpenAI-shaped error out; no HTTP, no engine. Implemented by oai.c
 * (errors, completions), oai_chat.c (chat, rendering) and oai_resp.c
 * (/v1/responses), which share oai_int.h.
 *
 * Prefix: oai_. Thread: any.
 */
#ifndef GPT2D_SERVER_OAI_H
#define GPT2D_SERVER_OAI_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define OAI_MAX_STOP 4         /* stop strings a request may send */
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
    /* Structured outputs (docs/api.md): response_format json_object or
     * json_schema, or the extensions guided_choice / guided_regex. format
     * is an oai_format; format_src the schema as compact JSON text, the
     * regex, or the choices as a JSON array (owned, NUL-terminated);
     * format_param the field to name in its errors. */
    int format;
    char *format_src;
    size_t format_len;
    char format_param[48];
    /* Function tools (chat; docs/api.md "Tool calls"): their names, and
     * how a reply may call one. A call is written as the template's marker
     * (oai_template.call_prefix) then {"name": ..., "arguments": {...}}
     * (format_src: the schema of that object, one branch a tool): with
     * REQUIRED (tool_choice required or a named function) the reply is that
     * object from its first token, the marker at the end of the prompt;
     * with AUTO the reply may begin with the marker, and then the rest is
     * that object. */
    char **tool_names; /* owned */
    size_t ntools;
    int tool_mode; /* oai_tool_mode */
    /* Speculative decoding (docs/api.md): prediction, OpenAI's Predicted
     * Outputs (the text the output is expected to resemble; its content
     * parts joined; owned, NULL: none); speculative_tokens (extension;
     * 0..OAI_MAX_SPECULATIVE where has_speculative_tokens, else the
     * server's) and speculative_drafter (extension; an oai_drafter). */
    char *prediction;
    size_t prediction_len;
    int has_speculative_tokens;
    int speculative_tokens;
    int drafter;
    /* POST /v1/embeddings: prompts are the inputs, each an embedding */
    int embed;
    int embed_base64;        /* encoding_format base64 */
    size_t embed_dimensions; /* `dimensions` as given (0: not given) */
} oai_request;

typedef enum { OAI_TOOLS_NONE = 0, OAI_TOOLS_AUTO = 1, OAI_TOOLS_REQUIRED = 2 } oai_tool_mode;
/* speculative_drafter: absent (the server's), "lookup", "draft_model",
 * "none" (predictions only). */
typedef enum {
    OAI_DRAFT_SERVER = 0,
    OAI_DRAFT_LOOKUP = 1,
    OAI_DRAFT_MODEL = 2,
    OAI_DRAFT_NONE = 3
} oai_drafter;
#define OAI_MAX_SPECULATIVE 8
#define OAI_MAX_TOOLS 128

/* What the output must be (the values of structured/include/structured.h's
 * gram_kind, plus none; the server maps them). */
typedef enum {
    OAI_FORMAT_NONE = -1,
    OAI_FORMAT_SCHEMA = 0,      /* response_format json_schema          */
    OAI_FORMAT_JSON_OBJECT = 1, /* response_format json_object          */
    OAI_FORMAT_REGEX = 2,       /* guided_regex (extension)             */
    OAI_FORMAT_CHOICE = 3       /* guided_choice (extension)            */
} oai_format;

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
 * Parses and validates a POST /v1/embeddings body into req (free with
 * oai_request_free): `input` (a string, strings, ids or lists of ids; no
 * empty string) as the prompts, `encoding_format` (float, base64),
 * `dimensions` (only n_embd; n_embd 0: any, checked by the caller once
 * `model` picked the width: req->embed_dimensions), `user`, `model`;
 * req->embed set. 0, or -1 with the 400 in err naming the field.
 */
int oai_parse_embeddings(const char *body, size_t len, const oai_limits *lim, size_t n_embd,
                         oai_request *req, oai_error *err);

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
    int trim_reply; /* 1: leading white space of the reply is not part of its content */
    /* How tools are written (docs/api.md, "Tool calls"; owned, each set:
     * the built-in format unless a template file gives its own): the
     * system message that lists them, tools_prefix + one compact JSON line
     * a tool + tools_suffix; a call, call_prefix + {"name": N, "arguments":
     * {...}} + call_suffix, where call_prefix (non-empty) is the marker a
     * reply begins a call with, after call_lead (white space, maybe none);
     * a tool's result, result_prefix + output + result_suffix, the content
     * of a user message. */
    char *tools_prefix, *tools_suffix;
    char *call_prefix, *call_suffix;
    char *call_lead;
    char *result_prefix, *result_suffix;
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

/*
 * Reads one response_format object f (a jansson json_t; NULL or JSON null:
 * nothing) into r->format and r->format_src: {"type": "text"}, {"type":
 * "json_object"}, or {"type": "json_schema", "json_schema": {"name",
 * "schema", "strict"}}; the Responses API's text.format, whose fields sit
 * beside "type" ({"type": "json_schema", "name", "schema", "strict"}), is
 * read too. param names the field in errors ("response_format",
 * "text.format"). 0, or -1 with the 400 in err. Whether the schema is in
 * the subset is decided when it compiles (structured/include/structured.h).
 */
struct json_t;
int oai_parse_format(const struct json_t *f, const char *param, oai_request *r, oai_error *err);

/* Fills err (the four fields and the status). */
void oai_error_set(oai_error *err, int status, const char *type, const char *code,
                   const char *param, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

/* The error body {"error": {...}} as a malloc'd NUL-terminated string. */
char *oai_error_json(const oai_error *err);

/* ---- POST /v1/responses ---------------------------------------------------- */

/* What an item of a conversation is: a message, a function call (the
 * assistant's) or a call's output (read as the user's). */
typedef enum { OAI_MSG_TEXT = 0, OAI_MSG_CALL = 1, OAI_MSG_CALL_OUTPUT = 2 } oai_msg_kind;

/* One item of a conversation: a role and its text (owned): a message's
 * text, a call's arguments (as sent) or a call output's output; or, from
 * an input's item_reference, the id of an earlier item (ref, owned; text
 * NULL) that its route resolves. A call has its name and call_id, an
 * output its call_id (owned; NULL otherwise). The template writes each
 * kind its own way (oai_render). */
typedef struct {
    oai_role role;
    char *text;
    size_t len;
    char *ref;
    int kind; /* oai_msg_kind */
    char *name;
    char *call_id;
} oai_msg;

/* A Responses request: the sampling fields in req (its prompts still empty:
 * the caller renders history + msgs through the template, oai_render), the
 * input as messages, and what the answer echoes. */
typedef struct {
    oai_request req;
    oai_msg *msgs; /* the input's messages, in order */
    size_t nmsgs;
    char *instructions; /* owned; NULL: absent */
    size_t instructions_len;
    char *previous_id; /* owned; NULL: absent */
    int store;         /* default 1 */
    int truncation_auto;
    json_t *metadata;     /* the request's object (a reference), or NULL */
    json_t *user;         /* a string (a reference), or NULL */
    json_t *text_format;  /* text.format as sent (a reference; echoed), or NULL */
    int tool_choice_none; /* tool_choice "none" was sent (echoed; default "auto") */
    json_t *tools;        /* tools as sent (a reference; echoed), or NULL */
    json_t *tool_choice;  /* tool_choice as sent (a reference; echoed), or NULL */
    char *tools_text;     /* the system message listing the tools (owned), or NULL */
    size_t tools_text_len;
} oai_resp_request;

/*
 * Parses and validates a POST /v1/responses body (docs/api.md): 0 and rq
 * (free with oai_resp_request_free), or -1 with rq empty and the 400 in err
 * naming the field. Tools, reasoning, images, files and audio are refused
 * by name. text.format json_schema / json_object set the request's format
 * (as oai_parse_format).
 * The template's stop strings follow the request's own, as on chat.
 */
int oai_parse_responses(const char *body, size_t len, const oai_limits *lim, const oai_template *t,
                        oai_resp_request *rq, oai_error *err);
void oai_resp_request_free(oai_resp_request *rq);

/* Renders msgs[0..n) through template t: begin, each message as its role's
 * prefix + text + suffix (a call's text: the template's call form, an
 * output's: its result form), then generation (the text a chat request
 * with these messages makes). *out is malloc'd and NUL-terminated. 0, or
 * -1 when out of memory. */
int oai_render(const oai_template *t, const oai_msg *msgs, size_t n, char **out, size_t *outlen);
/* The bytes msg takes in a rendering (its prefix, text and suffix); SIZE_MAX
 * when out of memory. */
size_t oai_render_len(const oai_template *t, const oai_msg *msg);
void oai_msgs_free(oai_msg *msgs, size_t n);

#endif
