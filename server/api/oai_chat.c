/*
 * server/api/oai_chat.c: POST /v1/chat/completions (oai_parse_chat): its
 * messages, read and rendered through the chat template into one prompt;
 * oai_render, the same rendering of a list of messages for /v1/responses;
 * and what that route shares of chat's (oai_int.h: the text buffer, roles,
 * refused fields, the template's stop strings). See oai.h.
 */
#include "oai_int.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int oai_tb_add(oai_textbuf *b, const char *p, size_t n)
{
    if (n > SIZE_MAX - b->len - 1) return -1;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap = cap > SIZE_MAX / 2 ? b->len + n + 1 : cap * 2;
        char *q = realloc(b->p, cap);
        if (q == NULL) return -1;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

static int tb_str(oai_textbuf *b, const char *s)
{
    return oai_tb_add(b, s, strlen(s));
}

/* One message's content: a string, or a list of text parts (joined). */
static int add_content(oai_textbuf *b, const json_t *content, size_t i, oai_error *err)
{
    if (json_is_string(content))
        return oai_tb_add(b, json_string_value(content), json_string_length(content)) != 0
                   ? oai_bad(err, "messages", "out of memory")
                   : 0;
    if (!json_is_array(content))
        return oai_bad(err, "messages",
                       "'messages[%zu].content' must be a string or a list of text parts, got %s",
                       i, oai_json_kind(content));
    for (size_t k = 0; k < json_array_size(content); k++) {
        const json_t *part = json_array_get(content, k);
        const json_t *type = json_object_get(part, "type");
        const json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type))
            return oai_bad(err, "messages", "'messages[%zu].content[%zu]' must be a content part",
                           i, k);
        if (!oai_str_is(type, "text"))
            return oai_bad(err, "messages",
                           "'messages[%zu].content[%zu]' is a '%.40s' part; GPT-2 reads only text",
                           i, k, json_string_value(type));
        if (!json_is_string(text))
            return oai_bad(err, "messages", "'messages[%zu].content[%zu].text' must be a string", i,
                           k);
        if (oai_tb_add(b, json_string_value(text), json_string_length(text)) != 0)
            return oai_bad(err, "messages", "out of memory");
    }
    return 0;
}

int oai_role_of(const char *name, oai_role *out)
{
    if (strcmp(name, "system") == 0 || strcmp(name, "developer") == 0)
        *out = OAI_ROLE_SYSTEM;
    else if (strcmp(name, "user") == 0)
        *out = OAI_ROLE_USER;
    else if (strcmp(name, "assistant") == 0)
        *out = OAI_ROLE_ASSISTANT;
    else
        return -1;
    return 0;
}

/* messages -> the template's text, as the one prompt of r. */
static int render_messages(const json_t *o, const oai_template *t, oai_request *r, oai_error *err)
{
    const json_t *msgs = json_object_get(o, "messages");
    if (msgs == NULL || json_is_null(msgs))
        return oai_bad(err, "messages", "'messages' is required: a list of {role, content}");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return oai_bad(err, "messages", "'messages' must be a non-empty list, got %s",
                       json_is_array(msgs) ? "an empty list" : oai_json_kind(msgs));
    oai_textbuf b = {0};
    if (tb_str(&b, t->begin) != 0) goto oom;
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m)) {
            oai_bad(err, "messages", "'messages[%zu]' must be an object, got %s", i,
                    oai_json_kind(m));
            goto fail;
        }
        const json_t *role = json_object_get(m, "role");
        oai_role rl;
        if (!json_is_string(role)) {
            oai_bad(err, "messages", "'messages[%zu].role' must be a string", i);
            goto fail;
        }
        if (memchr(json_string_value(role), '\0', json_string_length(role)) != NULL
            || oai_role_of(json_string_value(role), &rl) != 0) {
            oai_bad(
                err, "messages",
                "'messages[%zu].role' is '%.40s'; this server takes system, developer, user and "
                "assistant messages (no tools)",
                i, json_string_value(role));
            goto fail;
        }
        const json_t *calls = json_object_get(m, "tool_calls");
        if (calls == NULL || json_is_null(calls)) calls = json_object_get(m, "function_call");
        if (calls != NULL && !json_is_null(calls)) {
            oai_bad(err, "messages", "'messages[%zu].%s': tools are not supported", i,
                    json_object_get(m, "tool_calls") != NULL ? "tool_calls" : "function_call");
            goto fail;
        }
        const json_t *content = json_object_get(m, "content");
        if (content == NULL || json_is_null(content)) {
            oai_bad(err, "messages", "'messages[%zu].content' is required", i);
            goto fail;
        }
        if (tb_str(&b, t->prefix[rl]) != 0) goto oom;
        if (add_content(&b, content, i, err) != 0) goto fail;
        if (tb_str(&b, t->suffix[rl]) != 0) goto oom;
    }
    if (tb_str(&b, t->generation) != 0) goto oom;
    r->prompts = calloc(1, sizeof *r->prompts);
    if (r->prompts == NULL) goto oom;
    r->nprompts = 1;
    r->prompts[0].text = b.p;
    r->prompts[0].text_len = b.len;
    return 0;
oom:
    oai_bad(err, "messages", "out of memory");
fail:
    free(b.p);
    return -1;
}

/* A field that must be absent or null (or an empty list; with loose, also
 * false or an empty object). */
int oai_refuse(const json_t *o, const char *key, const char *why, int loose, oai_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (v == NULL || json_is_null(v) || (json_is_array(v) && json_array_size(v) == 0)
        || (loose && (json_is_false(v) || (json_is_object(v) && json_object_size(v) == 0))))
        return 0;
    return oai_bad(err, key, "'%s' is not supported: %s", key, why);
}

/* Appends template t's stop strings to r's (chat and responses): they end a
 * free reply; a formatted one ends where its grammar does, so it gets none.
 * 0, or -1 with the error in err (out of memory). */
int oai_template_stops(oai_request *r, const oai_template *t, oai_error *err)
{
    for (size_t i = 0; r->format == OAI_FORMAT_NONE && i < t->nstop && r->nstop < OAI_STOP_CAP;
         i++) {
        size_t n = strlen(t->stop[i]);
        r->stop[r->nstop] = malloc(n + 1);
        if (r->stop[r->nstop] == NULL) return oai_bad(err, "stop", "out of memory");
        memcpy(r->stop[r->nstop], t->stop[i], n + 1);
        r->stop_len[r->nstop++] = n;
    }
    return 0;
}

int oai_parse_chat(const char *body, size_t len, const oai_limits *lim, const oai_template *t,
                   oai_request *r, oai_error *err)
{
    int rc = -1;
    json_t *o = oai_parse_body(body, len, r, err);
    if (o == NULL) goto done;
    r->chat = 1;
    if (oai_refuse(o, "tools", "GPT-2 cannot call tools", 0, err) != 0
        || oai_refuse(o, "functions", "GPT-2 cannot call functions", 0, err) != 0
        || oai_refuse(o, "audio", "GPT-2 writes only text", 0, err) != 0)
        goto done;
    /* tool_choice and the older function_call: only "none" (or null). */
    static const char *const choices[] = {"tool_choice", "function_call"};
    for (size_t i = 0; i < 2; i++) {
        const json_t *tc = json_object_get(o, choices[i]);
        if (tc != NULL && !json_is_null(tc) && !oai_str_is(tc, "none")) {
            oai_bad(err, choices[i], "'%s' is not supported: GPT-2 cannot call tools", choices[i]);
            goto done;
        }
    }
    if (render_messages(o, t, r, err) != 0) goto done;
    /* max_completion_tokens is the current name, max_tokens the old one;
     * both are checked, the current one wins. Without either, the reply may
     * run to chat_max_tokens (the server also caps it by the context): a
     * default of the whole context would reserve its KV blocks for every
     * chat (admission reserves prompt + max_tokens). */
    long long ll = -1, old = -1;
    if (oai_get_int(o, "max_completion_tokens", 0, (long long)lim->max_tokens_limit, &ll, err) != 0
        || oai_get_int(o, "max_tokens", 0, (long long)lim->max_tokens_limit, &old, err) != 0)
        goto done;
    r->max_completion = ll >= 0;
    if (ll < 0) ll = old;
    r->max_tokens_auto = ll < 0;
    r->max_tokens = ll >= 0                                        ? (size_t)ll
                    : lim->chat_max_tokens < lim->max_tokens_limit ? lim->chat_max_tokens
                                                                   : lim->max_tokens_limit;
    if (oai_parse_shared(o, lim, r, err) != 0) goto done;
    r->best_of = r->n;
    int logprobs = 0;
    if (oai_get_bool(o, "logprobs", &logprobs, err) != 0) goto done;
    ll = 0;
    if (oai_get_int(o, "top_logprobs", 0, 20, &ll, err) != 0) goto done;
    if (ll > OAI_MAX_LOGPROBS) {
        oai_bad(err, "top_logprobs", "'top_logprobs' is %lld; this server gives at most %d", ll,
                OAI_MAX_LOGPROBS);
        goto done;
    }
    if (ll > 0 && !logprobs) {
        oai_bad(err, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        goto done;
    }
    r->logprobs = logprobs ? (int)ll : -1;
    if (oai_template_stops(r, t, err) != 0) goto done;
    rc = 0;
done:
    json_decref(o);
    if (rc != 0) oai_request_free(r);
    return rc;
}

void oai_msgs_free(oai_msg *msgs, size_t n)
{
    for (size_t i = 0; msgs != NULL && i < n; i++) {
        free(msgs[i].text);
        free(msgs[i].ref);
    }
    free(msgs);
}

size_t oai_render_len(const oai_template *t, const oai_msg *msg)
{
    return strlen(t->prefix[msg->role]) + msg->len + strlen(t->suffix[msg->role]);
}

int oai_render(const oai_template *t, const oai_msg *msgs, size_t n, char **out, size_t *outlen)
{
    oai_textbuf b = {0};
    int bad_alloc = tb_str(&b, t->begin) != 0;
    for (size_t i = 0; i < n && !bad_alloc; i++)
        bad_alloc = tb_str(&b, t->prefix[msgs[i].role]) != 0
                    || oai_tb_add(&b, msgs[i].text, msgs[i].len) != 0
                    || tb_str(&b, t->suffix[msgs[i].role]) != 0;
    if (bad_alloc || tb_str(&b, t->generation) != 0) {
        free(b.p);
        return -1;
    }
    *out = b.p;
    *outlen = b.len;
    return 0;
}
