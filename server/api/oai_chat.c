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
    if (n > 0) memcpy(b->p + b->len, p, n); /* p may be NULL when n is 0 */
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

/* ---- Function tools ------------------------------------------------------
 * tools, tool_choice and parallel_tool_calls; what the prompt says of them
 * (a system message listing them and how to call one; an assistant's
 * earlier calls in the same form; a tool's result as a user message), and
 * the schema of a call. */

/* A function name as OpenAI takes it: 1-64 of a-z, A-Z, 0-9, _ and -. */
static int name_ok(const json_t *v)
{
    if (!json_is_string(v)) return 0;
    size_t n = json_string_length(v);
    const char *p = json_string_value(v);
    if (n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((p[i] >= 'a' && p[i] <= 'z') || (p[i] >= 'A' && p[i] <= 'Z')
              || (p[i] >= '0' && p[i] <= '9') || p[i] == '_' || p[i] == '-'))
            return 0;
    return 1;
}

int oai_parse_tools(const json_t *o, const oai_template *t, oai_request *r, oai_textbuf *b,
                    oai_error *err)
{
    const json_t *tools = json_object_get(o, "tools");
    const json_t *choice = json_object_get(o, "tool_choice");
    if (choice == NULL || json_is_null(choice)) choice = json_object_get(o, "function_call");
    if (json_object_get(o, "functions") != NULL && !json_is_null(json_object_get(o, "functions")))
        return oai_bad(err, "functions", "'functions' is the old form of 'tools': send 'tools'");
    const json_t *par = json_object_get(o, "parallel_tool_calls");
    if (par != NULL && !json_is_null(par) && !json_is_boolean(par))
        return oai_bad(err, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    size_t n = 0;
    if (tools != NULL && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return oai_bad(err, "tools", "'tools' must be a list, got %s", oai_json_kind(tools));
        n = json_array_size(tools);
        if (n > OAI_MAX_TOOLS)
            return oai_bad(err, "tools", "'tools' has %zu tools; the limit is %d", n,
                           OAI_MAX_TOOLS);
    }
    const char *named = NULL;
    int mode = n > 0 ? OAI_TOOLS_AUTO : OAI_TOOLS_NONE;
    const char *cparam = json_object_get(o, "tool_choice") ? "tool_choice" : "function_call";
    if (choice != NULL && !json_is_null(choice)) {
        if (oai_str_is(choice, "none"))
            mode = OAI_TOOLS_NONE;
        else if (oai_str_is(choice, "auto"))
            mode = n > 0 ? OAI_TOOLS_AUTO : OAI_TOOLS_NONE;
        else if (oai_str_is(choice, "required"))
            mode = OAI_TOOLS_REQUIRED;
        else if (json_is_object(choice) && oai_str_is(json_object_get(choice, "type"), "function")
                 && name_ok(json_object_get(json_object_get(choice, "function"), "name"))) {
            mode = OAI_TOOLS_REQUIRED;
            named = json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
        } else {
            return oai_bad(err, cparam,
                           "'%s' must be \"none\", \"auto\", \"required\" or {\"type\": "
                           "\"function\", \"function\": {\"name\": ...}}",
                           cparam);
        }
        if (mode == OAI_TOOLS_REQUIRED && n == 0)
            return oai_bad(err, cparam, "'%s' asks for a tool call, but 'tools' is empty", cparam);
    }
    json_t *branches = json_array(), *listing = json_array();
    if (branches == NULL || listing == NULL) goto oom;
    int found = named == NULL;
    r->tool_names = n ? calloc(n, sizeof *r->tool_names) : NULL;
    if (n && r->tool_names == NULL) goto oom;
    for (size_t i = 0; i < n; i++) {
        const json_t *tool = json_array_get(tools, i);
        const json_t *type = json_object_get(tool, "type");
        if (!json_is_object(tool) || !json_is_string(type)) {
            oai_bad(err, "tools",
                    "'tools[%zu]' must be {\"type\": \"function\", \"function\": {...}}", i);
            goto fail;
        }
        if (!oai_str_is(type, "function")) {
            oai_bad(err, "tools",
                    "'tools[%zu].type' is '%.40s': this server calls only function tools", i,
                    json_string_value(type));
            goto fail;
        }
        const json_t *fn = json_object_get(tool, "function");
        const json_t *name = json_object_get(fn, "name"),
                     *desc = json_object_get(fn, "description");
        const json_t *params = json_object_get(fn, "parameters"),
                     *strict = json_object_get(fn, "strict");
        if (!json_is_object(fn) || !name_ok(name)) {
            oai_bad(err, "tools",
                    "'tools[%zu].function.name' must be 1 to 64 letters, digits, '_' or '-'", i);
            goto fail;
        }
        if (desc != NULL && !json_is_null(desc) && !json_is_string(desc)) {
            oai_bad(err, "tools", "'tools[%zu].function.description' must be a string", i);
            goto fail;
        }
        if (params != NULL && !json_is_null(params) && !json_is_object(params)) {
            oai_bad(err, "tools", "'tools[%zu].function.parameters' must be a JSON Schema object",
                    i);
            goto fail;
        }
        if (strict != NULL && !json_is_null(strict) && !json_is_boolean(strict)) {
            oai_bad(err, "tools", "'tools[%zu].function.strict' must be a boolean", i);
            goto fail;
        }
        for (size_t k = 0; k < i; k++)
            if (strcmp(r->tool_names[k], json_string_value(name)) == 0) {
                oai_bad(err, "tools", "'tools[%zu].function.name' '%s' is given twice", i,
                        r->tool_names[k]);
                goto fail;
            }
        if ((r->tool_names[i] = strdup(json_string_value(name))) == NULL) goto oom;
        r->ntools = i + 1;
        json_t *p = params != NULL && !json_is_null(params)
                        ? json_deep_copy(params)
                        : json_pack("{s:s, s:{}}", "type", "object", "properties");
        if (named == NULL || strcmp(named, r->tool_names[i]) == 0) {
            found |= named != NULL;
            if (json_array_append_new(branches,
                                      json_pack("{s:s, s:{s:{s:s}, s:O}, s:[s,s], s:b}", "type",
                                                "object", "properties", "name", "const",
                                                r->tool_names[i], "arguments", p, "required",
                                                "name", "arguments", "additionalProperties", 0))
                != 0)
                goto oom_p;
        }
        json_t *entry = json_pack("{s:s, s:O}", "name", r->tool_names[i], "parameters", p);
        if (entry != NULL && desc != NULL && json_is_string(desc))
            json_object_set(entry, "description", (json_t *)desc);
        if (entry == NULL || json_array_append_new(listing, entry) != 0) goto oom_p;
        json_decref(p);
        continue;
    oom_p:
        json_decref(p);
        goto oom;
    }
    if (!found) {
        oai_bad(err, cparam, "'%s' names the function '%s', which is not in 'tools'", cparam,
                named);
        goto fail;
    }
    if (mode != OAI_TOOLS_NONE && r->format != OAI_FORMAT_NONE) {
        oai_bad(err, r->format_param,
                "'%s' cannot be combined with 'tools': a tool call has a format of its own "
                "(send tool_choice \"none\" to use '%s')",
                r->format_param, r->format_param);
        goto fail;
    }
    if (mode != OAI_TOOLS_NONE && r->nstop > 0) {
        oai_bad(err, "stop",
                "'stop' cannot be combined with 'tools': a stop string could cut a call short "
                "(send tool_choice \"none\" to use 'stop')");
        goto fail;
    }
    r->tool_mode = mode;
    if (mode != OAI_TOOLS_NONE) {
        json_t *schema = json_array_size(branches) == 1 ? json_incref(json_array_get(branches, 0))
                                                        : json_pack("{s:O}", "anyOf", branches);
        r->format_src = schema ? json_dumps(schema, JSON_COMPACT) : NULL;
        json_decref(schema);
        if (r->format_src == NULL) goto oom;
        r->format_len = strlen(r->format_src);
        r->format = OAI_FORMAT_SCHEMA;
        snprintf(r->format_param, sizeof r->format_param, "tools");
        /* The text of the system message that lists them, one line a tool. */
        if (tb_str(b, t->tools_prefix) != 0) goto oom;
        for (size_t i = 0; i < json_array_size(listing); i++) {
            char *line = json_dumps(json_array_get(listing, i), JSON_COMPACT);
            int bad = line == NULL || (i > 0 && tb_str(b, "\n") != 0) || tb_str(b, line) != 0;
            free(line);
            if (bad) goto oom;
        }
        if (tb_str(b, t->tools_suffix) != 0) goto oom;
    }
    json_decref(branches);
    json_decref(listing);
    return 0;
oom:
    oai_bad(err, "tools", "out of memory");
fail:
    json_decref(branches);
    json_decref(listing);
    return -1;
}

int oai_tb_call(oai_textbuf *b, const oai_template *t, const char *name, size_t name_len,
                const char *args, size_t args_len)
{
    json_t *a = json_loadb(args, args_len, JSON_DECODE_ANY, NULL);
    json_t *call = json_pack("{s:s%, s:o}", "name", name, name_len, "arguments",
                             a ? a : json_stringn(args, args_len));
    char *txt = call ? json_dumps(call, JSON_COMPACT) : NULL;
    json_decref(call);
    int bad = txt == NULL || tb_str(b, t->call_prefix) != 0 || tb_str(b, txt) != 0
              || tb_str(b, t->call_suffix) != 0;
    free(txt);
    return bad ? -1 : 0;
}

/* An assistant message's tool_calls, each as the model would write it. */
static int add_calls(oai_textbuf *b, const oai_template *t, const json_t *calls, size_t i,
                     oai_error *err)
{
    if (!json_is_array(calls))
        return oai_bad(err, "messages", "'messages[%zu].tool_calls' must be a list", i);
    for (size_t k = 0; k < json_array_size(calls); k++) {
        const json_t *c = json_array_get(calls, k), *fn = json_object_get(c, "function");
        const json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        if (!json_is_object(c) || !json_is_object(fn) || !json_is_string(name)
            || (args != NULL && !json_is_string(args)))
            return oai_bad(err, "messages",
                           "'messages[%zu].tool_calls[%zu]' must be {\"id\", \"type\": "
                           "\"function\", \"function\": {\"name\", \"arguments\": a string}}",
                           i, k);
        if (oai_tb_call(b, t, json_string_value(name), json_string_length(name),
                        args ? json_string_value(args) : "", args ? json_string_length(args) : 0)
            != 0)
            return oai_bad(err, "messages", "out of memory");
    }
    return 0;
}

/* messages -> the template's text, as the one prompt of r (the tools'
 * system message first, when there are tools to call). */
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
    oai_textbuf tl = {0};
    if (oai_parse_tools(o, t, r, &tl, err) != 0) goto fail;
    int listed =
        tl.len > 0
        && (tb_str(&b, t->prefix[OAI_ROLE_SYSTEM]) != 0 || oai_tb_add(&b, tl.p, tl.len) != 0
            || tb_str(&b, t->suffix[OAI_ROLE_SYSTEM]) != 0);
    free(tl.p);
    if (listed) goto oom;
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
        /* A tool's result reads as a user message in the prompt. */
        int tool = oai_str_is(role, "tool");
        if (tool)
            rl = OAI_ROLE_USER;
        else if (memchr(json_string_value(role), '\0', json_string_length(role)) != NULL
                 || oai_role_of(json_string_value(role), &rl) != 0) {
            oai_bad(err, "messages",
                    "'messages[%zu].role' is '%.40s'; this server takes system, developer, "
                    "user, assistant and tool messages",
                    i, json_string_value(role));
            goto fail;
        }
        const json_t *calls = json_object_get(m, "tool_calls");
        if (json_object_get(m, "function_call") != NULL
            && !json_is_null(json_object_get(m, "function_call"))) {
            oai_bad(err, "messages",
                    "'messages[%zu].function_call' is the old form: send tool_calls", i);
            goto fail;
        }
        int has_calls = calls != NULL && !json_is_null(calls) && json_array_size(calls) > 0;
        if (has_calls && rl != OAI_ROLE_ASSISTANT) {
            oai_bad(err, "messages", "'messages[%zu].tool_calls' belongs to an assistant message",
                    i);
            goto fail;
        }
        const json_t *content = json_object_get(m, "content");
        if ((content == NULL || json_is_null(content)) && !has_calls) {
            oai_bad(err, "messages", "'messages[%zu].content' is required", i);
            goto fail;
        }
        if (tb_str(&b, t->prefix[rl]) != 0) goto oom;
        if (tool && tb_str(&b, t->result_prefix) != 0) goto oom;
        if (content != NULL && !json_is_null(content) && add_content(&b, content, i, err) != 0)
            goto fail;
        if (tool && tb_str(&b, t->result_suffix) != 0) goto oom;
        if (has_calls && add_calls(&b, t, calls, i, err) != 0) goto fail;
        if (tb_str(&b, t->suffix[rl]) != 0) goto oom;
    }
    if (tb_str(&b, t->generation) != 0) goto oom;
    /* A call it must make: the marker is the prompt's, the object the reply. */
    if (r->tool_mode == OAI_TOOLS_REQUIRED
        && (tb_str(&b, t->call_lead) != 0 || tb_str(&b, t->call_prefix) != 0))
        goto oom;
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
    int free_reply = r->format == OAI_FORMAT_NONE || r->tool_mode == OAI_TOOLS_AUTO;
    for (size_t i = 0; free_reply && i < t->nstop && r->nstop < OAI_STOP_CAP; i++) {
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
    if (oai_refuse(o, "audio", "GPT-2 writes only text", 0, err) != 0) goto done;
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
    /* After the shared fields: the tools' call is a format of its own. */
    if (render_messages(o, t, r, err) != 0) goto done;
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
        free(msgs[i].name);
        free(msgs[i].call_id);
    }
    free(msgs);
}

/* One item as the template writes it: its role's prefix, the message's
 * text (a call in the call form, an output in the result form), the
 * role's suffix. 0, or -1 when out of memory. */
static int render_msg(oai_textbuf *b, const oai_template *t, const oai_msg *m)
{
    if (tb_str(b, t->prefix[m->role]) != 0) return -1;
    int bad;
    if (m->kind == OAI_MSG_CALL)
        bad = oai_tb_call(b, t, m->name ? m->name : "", m->name ? strlen(m->name) : 0, m->text,
                          m->len);
    else if (m->kind == OAI_MSG_CALL_OUTPUT)
        bad = tb_str(b, t->result_prefix) != 0 || oai_tb_add(b, m->text, m->len) != 0
              || tb_str(b, t->result_suffix) != 0;
    else
        bad = oai_tb_add(b, m->text, m->len) != 0;
    return bad || tb_str(b, t->suffix[m->role]) != 0 ? -1 : 0;
}

size_t oai_render_len(const oai_template *t, const oai_msg *msg)
{
    oai_textbuf b = {0};
    size_t n = render_msg(&b, t, msg) == 0 ? b.len : SIZE_MAX;
    free(b.p);
    return n;
}

int oai_render(const oai_template *t, const oai_msg *msgs, size_t n, char **out, size_t *outlen)
{
    oai_textbuf b = {0};
    int bad_alloc = tb_str(&b, t->begin) != 0;
    for (size_t i = 0; i < n && !bad_alloc; i++) bad_alloc = render_msg(&b, t, &msgs[i]) != 0;
    if (bad_alloc || tb_str(&b, t->generation) != 0) {
        free(b.p);
        return -1;
    }
    *out = b.p;
    *outlen = b.len;
    return 0;
}
