/*
 * server/api/oai_resp.c: POST /v1/responses (oai_parse_responses): the input
 * as messages (the route renders them with its stored history, oai_render),
 * instructions, previous_response_id, store, metadata, text.format, the
 * logprobs it includes, and the fields it refuses by name. The sampling
 * fields are read as on every route (oai_parse_shared). See oai.h.
 */
#include "oai_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

void oai_resp_request_free(oai_resp_request *rq)
{
    if (rq == NULL) return;
    oai_request_free(&rq->req);
    oai_msgs_free(rq->msgs, rq->nmsgs);
    free(rq->instructions);
    free(rq->previous_id);
    json_decref(rq->metadata);
    json_decref(rq->user);
    json_decref(rq->text_format);
    json_decref(rq->tools);
    json_decref(rq->tool_choice);
    free(rq->tools_text);
    memset(rq, 0, sizeof *rq);
}

/* text (absent, null, or {format: {...}}): 0 with the output format set
 * (none for "text"; json_object or json_schema through oai_parse_format)
 * and the format kept for the answer to echo, or -1 with the 400 naming
 * text.format. */
static int resp_text_format(json_t *text, oai_resp_request *rq, oai_error *err)
{
    if (text == NULL || json_is_null(text)) return 0;
    if (!json_is_object(text))
        return oai_bad(err, "text",
                       "'text' must be an object ({\"format\": {\"type\": \"text\"}}), got %s",
                       oai_json_kind(text));
    json_t *format = json_object_get(text, "format");
    if (format == NULL || json_is_null(format)) return 0;
    /* The Responses API's flat shape ({"type": "json_schema", "name",
     * "schema", "strict"}) is read by the same parser as chat's
     * response_format. */
    if (oai_parse_format(format, "text.format", &rq->req, err) != 0) return -1;
    rq->text_format = json_incref(format);
    return 0;
}

/* One input item's content: a string, or a list of text parts (joined);
 * images, files and audio are refused by name. */
static int resp_content(const json_t *content, size_t i, oai_textbuf *b, oai_error *err)
{
    if (json_is_string(content))
        return oai_tb_add(b, json_string_value(content), json_string_length(content)) != 0
                   ? oai_bad(err, "input", "out of memory")
                   : 0;
    if (!json_is_array(content))
        return oai_bad(
            err, "input",
            "'input[%zu].content' must be a string or a list of input_text parts, got %s", i,
            content ? oai_json_kind(content) : "nothing");
    for (size_t k = 0; k < json_array_size(content); k++) {
        const json_t *part = json_array_get(content, k);
        const json_t *type = json_object_get(part, "type");
        const json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type))
            return oai_bad(err, "input",
                           "'input[%zu].content[%zu]' must be a content part {type, text}", i, k);
        if (oai_str_is(type, "input_image") || oai_str_is(type, "input_file")
            || oai_str_is(type, "input_audio"))
            return oai_bad(
                err, "input",
                "'input[%zu].content[%zu]' is an %s part: GPT-2 reads only text (images, "
                "files and audio are not supported)",
                i, k, json_string_value(type));
        if (!oai_str_is(type, "input_text") && !oai_str_is(type, "output_text")
            && !oai_str_is(type, "text"))
            return oai_bad(
                err, "input",
                "'input[%zu].content[%zu]' is a '%.40s' part; this server reads input_text "
                "(and an assistant's output_text)",
                i, k, json_string_value(type));
        if (!json_is_string(text))
            return oai_bad(err, "input", "'input[%zu].content[%zu].text' must be a string", i, k);
        if (oai_tb_add(b, json_string_value(text), json_string_length(text)) != 0)
            return oai_bad(err, "input", "out of memory");
    }
    return 0;
}

/* A string of 1 to 64 bytes without NUL (a call_id, a function's name). */
static int short_id(const json_t *v)
{
    return json_is_string(v) && json_string_length(v) > 0 && json_string_length(v) <= 64
           && memchr(json_string_value(v), '\0', json_string_length(v)) == NULL;
}

/* A function_call item (call: {call_id, name, arguments}) or a
 * function_call_output ({call_id, output}) into *out: kept as they came,
 * the template writes them (oai_render). 0, or -1 with the 400 in err. */
static int resp_call_item(const json_t *m, size_t i, int call, oai_msg *out, oai_error *err)
{
    const json_t *id = json_object_get(m, "call_id"), *name = json_object_get(m, "name");
    const json_t *text = json_object_get(m, call ? "arguments" : "output");
    if (call ? !short_id(name) || !json_is_string(text) : !json_is_string(text))
        return oai_bad(err, "input",
                       call ? "'input[%zu]' (function_call) needs 'name' and 'arguments' strings"
                            : "'input[%zu]' (function_call_output) needs an 'output' string",
                       i);
    if (!short_id(id))
        return oai_bad(err, "input", "'input[%zu].call_id' must be a string of 1 to 64 bytes", i);
    size_t n = json_string_length(text);
    *out = (oai_msg){call ? OAI_ROLE_ASSISTANT : OAI_ROLE_USER,
                     malloc(n + 1),
                     n,
                     NULL,
                     call ? OAI_MSG_CALL : OAI_MSG_CALL_OUTPUT,
                     call ? strdup(json_string_value(name)) : NULL,
                     strdup(json_string_value(id))};
    if (out->text == NULL || (call && out->name == NULL) || out->call_id == NULL)
        return oai_bad(err, "input", "out of memory"); /* freed with the messages */
    memcpy(out->text, json_string_value(text), n + 1);
    return 0;
}

/* input: a string (one user message) or a list of message items. */
static int resp_input(const json_t *o, oai_resp_request *rq, oai_error *err)
{
    const json_t *in = json_object_get(o, "input");
    if (in == NULL || json_is_null(in))
        return oai_bad(err, "input", "'input' is required: a string or a list of messages");
    size_t n = json_is_array(in) ? json_array_size(in) : 1;
    if (!json_is_string(in) && !json_is_array(in))
        return oai_bad(err, "input", "'input' must be a string or a list of messages, got %s",
                       oai_json_kind(in));
    if (n == 0) return oai_bad(err, "input", "'input' must not be an empty list");
    rq->msgs = calloc(n, sizeof *rq->msgs);
    if (rq->msgs == NULL) return oai_bad(err, "input", "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_is_array(in) ? json_array_get(in, i) : NULL;
        const json_t *content = in;
        oai_role role = OAI_ROLE_USER;
        if (m != NULL) {
            if (!json_is_object(m))
                return oai_bad(err, "input", "'input[%zu]' must be a message object, got %s", i,
                               oai_json_kind(m));
            const json_t *type = json_object_get(m, "type");
            if (json_is_string(type) && oai_str_is(type, "item_reference")) {
                /* An earlier message by its id (the AI SDK sends its own
                 * replies so): resolved against the stored responses. */
                const json_t *id = json_object_get(m, "id");
                if (!json_is_string(id) || json_string_length(id) == 0
                    || json_string_length(id) > 64
                    || memchr(json_string_value(id), '\0', json_string_length(id)) != NULL)
                    return oai_bad(err, "input", "'input[%zu].id' must be a message id (msg_...)",
                                   i);
                rq->msgs[i] =
                    (oai_msg){.role = OAI_ROLE_ASSISTANT, .ref = strdup(json_string_value(id))};
                if (rq->msgs[i].ref == NULL) return oai_bad(err, "input", "out of memory");
                rq->nmsgs = i + 1;
                continue;
            }
            if (json_is_string(type)
                && (oai_str_is(type, "function_call")
                    || oai_str_is(type, "function_call_output"))) {
                if (resp_call_item(m, i, oai_str_is(type, "function_call"), &rq->msgs[i], err) != 0)
                    return -1;
                rq->nmsgs = i + 1;
                continue;
            }
            if (type != NULL && !json_is_null(type)
                && !(json_is_string(type) && oai_str_is(type, "message")))
                return oai_bad(
                    err, "input",
                    "'input[%zu]' is a '%.40s' item: this server takes message, function_call, "
                    "function_call_output and item_reference items (no reasoning or other tools)",
                    i, json_is_string(type) ? json_string_value(type) : oai_json_kind(type));
            const json_t *rl = json_object_get(m, "role");
            if (!json_is_string(rl)
                || memchr(json_string_value(rl), '\0', json_string_length(rl)) != NULL
                || oai_role_of(json_string_value(rl), &role) != 0)
                return oai_bad(err, "input",
                               "'input[%zu].role' must be user, system, developer or assistant", i);
            content = json_object_get(m, "content");
        }
        oai_textbuf b = {0};
        if (oai_tb_add(&b, "", 0) != 0) return oai_bad(err, "input", "out of memory");
        if (resp_content(content, i, &b, err) != 0) {
            free(b.p);
            return -1;
        }
        rq->msgs[i] = (oai_msg){.role = role, .text = b.p, .len = b.len};
        rq->nmsgs = i + 1;
    }
    return 0;
}

/* metadata: up to 16 string values, keys up to 64 bytes, values up to 512. */
static int resp_metadata(const json_t *o, oai_resp_request *rq, oai_error *err)
{
    json_t *v = json_object_get(o, "metadata");
    if (v == NULL || json_is_null(v)) return 0;
    if (!json_is_object(v))
        return oai_bad(err, "metadata", "'metadata' must be an object of strings, got %s",
                       oai_json_kind(v));
    if (json_object_size(v) > 16)
        return oai_bad(err, "metadata", "'metadata' has %zu keys; the limit is 16",
                       json_object_size(v));
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val)
    {
        if (strlen(key) > 64) return oai_bad(err, "metadata", "a 'metadata' key is over 64 bytes");
        if (!json_is_string(val) || json_string_length(val) > 512)
            return oai_bad(err, "metadata",
                           "'metadata' values must be strings of at most 512 bytes");
    }
    rq->metadata = json_incref(v);
    return 0;
}

/* include (only "message.output_text.logprobs") and top_logprobs (0 to
 * OAI_MAX_LOGPROBS): either asks for the output's logprobs. */
static int resp_logprobs(const json_t *o, oai_request *r, oai_error *err)
{
    int want = 0;
    const json_t *inc = json_object_get(o, "include");
    if (inc != NULL && !json_is_null(inc)) {
        if (!json_is_array(inc))
            return oai_bad(err, "include", "'include' must be a list of strings, got %s",
                           oai_json_kind(inc));
        for (size_t i = 0; i < json_array_size(inc); i++) {
            const json_t *v = json_array_get(inc, i);
            if (!json_is_string(v) || !oai_str_is(v, "message.output_text.logprobs"))
                return oai_bad(err, "include",
                               "'include[%zu]' is not available: this server can include only "
                               "\"message.output_text.logprobs\" (no tools, images or reasoning)",
                               i);
            want = 1;
        }
    }
    long long ll = 0;
    if (oai_get_int(o, "top_logprobs", 0, 20, &ll, err) != 0) return -1;
    if (ll > OAI_MAX_LOGPROBS)
        return oai_bad(err, "top_logprobs", "'top_logprobs' is %lld; this server gives at most %d",
                       ll, OAI_MAX_LOGPROBS);
    r->logprobs = want || ll > 0 ? (int)ll : -1;
    return 0;
}

/* tools (Responses' shape: {type: function, name, description,
 * parameters, strict}) and tool_choice ({type: function, name} for one),
 * read as chat's (oai_parse_tools): the tools' system message into rq. */
static int resp_tools(const json_t *o, const oai_template *t, oai_resp_request *rq, oai_error *err)
{
    const json_t *tools = json_object_get(o, "tools"), *tc = json_object_get(o, "tool_choice");
    if ((tools == NULL || json_is_null(tools)) && (tc == NULL || json_is_null(tc))) return 0;
    json_t *chat = json_object();
    if (chat == NULL) return oai_bad(err, "tools", "out of memory");
    if (json_is_array(tools)) {
        json_t *list = json_array();
        size_t i;
        const json_t *tool;
        json_array_foreach(tools, i, tool)
        {
            json_t *fn = json_object(), *one = json_object();
            const char *keys[] = {"name", "description", "parameters", "strict"};
            for (size_t k = 0; fn != NULL && k < 4; k++) {
                json_t *v = json_object_get(tool, keys[k]);
                if (v != NULL) json_object_set(fn, keys[k], v);
            }
            json_t *type = json_object_get(tool, "type");
            if (type != NULL) json_object_set(one, "type", type);
            json_object_set_new(one, "function", fn);
            json_array_append_new(list, one);
        }
        json_object_set_new(chat, "tools", list);
    } else if (tools != NULL) {
        json_object_set(chat, "tools", (json_t *)tools);
    }
    if (json_is_object(tc) && oai_str_is(json_object_get(tc, "type"), "function"))
        json_object_set_new(
            chat, "tool_choice",
            json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name",
                      json_object_get(tc, "name") ? json_object_get(tc, "name") : json_null()));
    else if (tc != NULL)
        json_object_set(chat, "tool_choice", (json_t *)tc);
    oai_textbuf b = {0};
    int rc = oai_parse_tools(chat, t, &rq->req, &b, err);
    json_decref(chat);
    if (rc != 0) {
        free(b.p);
        return -1;
    }
    rq->tools_text = b.p;
    rq->tools_text_len = b.len;
    if (tools != NULL && !json_is_null(tools)) rq->tools = json_incref((json_t *)tools);
    if (tc != NULL && !json_is_null(tc)) rq->tool_choice = json_incref((json_t *)tc);
    return 0;
}

static int resp_fields(json_t *o, const oai_limits *lim, const oai_template *t,
                       oai_resp_request *rq, oai_error *err)
{
    oai_request *r = &rq->req;
    static const char *const refused[][2] = {
        {"reasoning", "GPT-2 is not a reasoning model"},
        {"background", "responses are answered in the foreground"},
        {"prompt", "stored prompt templates are not supported; send 'input'"},
        {"conversation", "conversations are not supported; use 'previous_response_id'"},
        {"messages", "this route takes 'input' (messages belong to /v1/chat/completions)"},
        {"best_of", "a response has one output"},
        {"echo", "not a Responses field (use /v1/completions)"},
        {"suffix", "GPT-2 has no insertion mode"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (oai_refuse(o, refused[i][0], refused[i][1], 1, err) != 0) return -1;
    const json_t *tc = json_object_get(o, "tool_choice");
    rq->tool_choice_none = oai_str_is(tc, "none");
    if (resp_text_format(json_object_get(o, "text"), rq, err) != 0) return -1;
    if (resp_input(o, rq, err) != 0) return -1;
    const json_t *ins = json_object_get(o, "instructions");
    if (ins != NULL && !json_is_null(ins)) {
        if (!json_is_string(ins))
            return oai_bad(err, "instructions", "'instructions' must be a string, got %s",
                           oai_json_kind(ins));
        rq->instructions_len = json_string_length(ins);
        rq->instructions = malloc(rq->instructions_len + 1);
        if (rq->instructions == NULL) return oai_bad(err, "instructions", "out of memory");
        memcpy(rq->instructions, json_string_value(ins), rq->instructions_len + 1);
    }
    const json_t *prev = json_object_get(o, "previous_response_id");
    if (prev != NULL && !json_is_null(prev)) {
        if (!json_is_string(prev) || json_string_length(prev) == 0 || json_string_length(prev) > 64
            || memchr(json_string_value(prev), '\0', json_string_length(prev)) != NULL)
            return oai_bad(err, "previous_response_id",
                           "'previous_response_id' must be a response id (resp_...)");
        rq->previous_id = strdup(json_string_value(prev));
        if (rq->previous_id == NULL) return oai_bad(err, "previous_response_id", "out of memory");
    }
    rq->store = 1;
    if (oai_get_bool(o, "store", &rq->store, err) != 0) return -1;
    const json_t *tr = json_object_get(o, "truncation");
    if (tr != NULL && !json_is_null(tr)) {
        if (!json_is_string(tr) || !(oai_str_is(tr, "auto") || oai_str_is(tr, "disabled")))
            return oai_bad(err, "truncation", "'truncation' must be \"auto\" or \"disabled\"");
        rq->truncation_auto = oai_str_is(tr, "auto");
    }
    if (resp_metadata(o, rq, err) != 0) return -1;
    /* As chat's max_completion_tokens: without it, up to chat_max_tokens. */
    long long ll = -1;
    if (oai_get_int(o, "max_output_tokens", 0, (long long)lim->max_tokens_limit, &ll, err) != 0)
        return -1;
    r->max_tokens_auto = ll < 0;
    r->max_tokens = ll >= 0                                        ? (size_t)ll
                    : lim->chat_max_tokens < lim->max_tokens_limit ? lim->chat_max_tokens
                                                                   : lim->max_tokens_limit;
    if (oai_parse_shared(o, lim, r, err) != 0) return -1;
    if (r->n != 1)
        return oai_bad(err, "n", "'n' is not a Responses field: a response has one output");
    if (resp_tools(o, t, rq, err) != 0) return -1;
    r->best_of = 1;
    if (resp_logprobs(o, r, err) != 0) return -1;
    const json_t *user = json_object_get(o, "user");
    if (json_is_string(user)) rq->user = json_incref((json_t *)user);
    return 0;
}

int oai_parse_responses(const char *body, size_t len, const oai_limits *lim, const oai_template *t,
                        oai_resp_request *rq, oai_error *err)
{
    memset(rq, 0, sizeof *rq);
    err->message[0] = '\0';
    int rc = -1;
    json_t *o = oai_parse_body(body, len, &rq->req, err);
    if (o == NULL) goto done;
    rq->req.chat = 1;
    if (resp_fields(o, lim, t, rq, err) != 0) goto done;
    oai_request *r = &rq->req;
    if (oai_template_stops(r, t, err) != 0) goto done; /* as on chat */
    rc = 0;
done:
    json_decref(o);
    if (rc != 0) oai_resp_request_free(rq);
    return rc;
}
