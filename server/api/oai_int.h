/*
 * server/api/oai_int.h: what the request parsers share across their three
 * files: oai.c (errors, the completion request and the readers of every
 * route), oai_chat.c (chat and the template's rendering) and oai_resp.c
 * (/v1/responses). Internal: only server/api/oai*.c include it; the rest of
 * the server and the tests use oai.h.
 *
 * Prefix: oai_. Thread: any.
 */
#ifndef GPT2D_SERVER_OAI_INT_H
#define GPT2D_SERVER_OAI_INT_H

#include "oai.h"

#include <jansson.h>
#include <stddef.h>

#define OAI_MAX_LOGPROBS 5 /* top alternatives per token */

/* ---- oai.c: the readers ---------------------------------------------------- */

/* Fills err with a 400 invalid_request_error naming param; returns -1. */
int oai_bad(oai_error *err, const char *param, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* A short text for "got ..." in messages ("an object", "null", ...). */
const char *oai_json_kind(const json_t *v);

/* Whether string v is exactly lit (a NUL inside v is not ignored). */
int oai_str_is(const json_t *v, const char *lit);

/* An integer in [lo, hi]; absent or null keeps *out. 0, or -1 with the 400
 * naming key in err. */
int oai_get_int(const json_t *o, const char *key, long long lo, long long hi, long long *out,
                oai_error *err);

/* A boolean; absent or null keeps *out. 0, or -1 with the 400 in err. */
int oai_get_bool(const json_t *o, const char *key, int *out, oai_error *err);

/*
 * The body as a JSON object (returns owned, json_decref), after r is set to
 * the defaults, and the optional `model` (a string without NUL; absent or
 * null means the served model, r->model stays NULL). NULL with the 400 in
 * err.
 */
json_t *oai_parse_body(const char *body, size_t len, oai_request *r, oai_error *err);

/* The fields completions, chat and responses share: sampling, n, stream,
 * stop, penalties, logit_bias, seed, user and the extensions (timeout,
 * cache_salt, the structured outputs). 0, or -1 with the 400 in err. */
int oai_parse_shared(const json_t *o, const oai_limits *lim, oai_request *r, oai_error *err);

/* ---- oai_chat.c: messages and templates ------------------------------------- */

/* Bounded growth of the rendered prompt: the body's own size bounds it, plus
 * the template's text per message. Starts {0}; p is malloc'd and
 * NUL-terminated once anything is added. */
typedef struct {
    char *p;
    size_t len, cap;
} oai_textbuf;

/* Appends n bytes of p. 0, or -1 when out of memory (b as it was). */
int oai_tb_add(oai_textbuf *b, const char *p, size_t n);

/* A role's name (system, developer, user, assistant) to *out: 0, or -1 for
 * any other name. */
int oai_role_of(const char *name, oai_role *out);

/* A field this server refuses when it asks for anything: absent, null or an
 * empty list pass; with loose (the Responses API), false and an empty object
 * pass too. 0, or -1 with "'key' is not supported: why" in err. */
int oai_refuse(const json_t *o, const char *key, const char *why, int loose, oai_error *err);

/* Function tools (chat's shape: tools [{type, function: {name,
 * description, parameters, strict}}], tool_choice, parallel_tool_calls,
 * and the old function_call as a tool_choice) -> r->tool_names, tool_mode
 * and the call's schema as r's format (param "tools"); into b the text of
 * the system message that lists them in template t's form (nothing with
 * tool_choice none or no tools). 0, or -1 with err. */
int oai_parse_tools(const json_t *o, const oai_template *t, oai_request *r, oai_textbuf *b,
                    oai_error *err);

/* Appends a call of name with args (JSON text, written compact; other
 * text as a string) in template t's call form: call_prefix +
 * {"name":N,"arguments":A} + call_suffix. 0, or -1 when out of memory. */
int oai_tb_call(oai_textbuf *b, const oai_template *t, const char *name, size_t name_len,
                const char *args, size_t args_len);

/* Appends template t's stop strings to r's (chat and responses): they end a
 * free reply; a formatted one ends where its grammar does, so it gets none.
 * 0, or -1 with the error in err (out of memory). */
int oai_template_stops(oai_request *r, const oai_template *t, oai_error *err);

#endif
