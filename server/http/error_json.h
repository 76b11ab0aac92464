/*
 * server/http/error_json.h: the JSON error body every layer answers with,
 * {"error": {"message", "type", "param", "code"}} (OpenAI's shape;
 * docs/api.md). The HTTP layer's own refusals (404, 405, 408, 413, ...)
 * write it, and so do the API layer's (api/oai.c's oai_error_json), so it
 * lives here, below both. Pure (jansson); thread: any.
 */
#ifndef GPT2D_SERVER_HTTP_ERROR_JSON_H
#define GPT2D_SERVER_HTTP_ERROR_JSON_H

/* Makes p (NUL-terminated) valid UTF-8 in place: every byte that is not
 * part of a valid sequence becomes '?'. A message may quote the client's
 * bytes, or be cut mid-character by its buffer; jansson refuses a string
 * that is not UTF-8, and the body must always be JSON. */
void http_error_sanitize(char *p);
/* The compact error body: message and type (NULL: "server_error"), param
 * ("" for null) and code (NULL for null), each valid UTF-8
 * (http_error_sanitize). Returns it malloc'd (free it), or NULL when
 * memory ran out. */
char *http_error_json(const char *type, const char *code, const char *param, const char *message);

#endif
