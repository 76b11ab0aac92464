/*
 * server/api/responses.c: POST /v1/responses, OpenAI's Responses API, on
 * the chat completion path: the body is parsed (oai_parse_responses), a
 * previous_response_id's stored conversation goes first, the messages are
 * rendered through the chat template into one prompt, and from there it
 * is a chat completion (tokenizing, admission, the engine, the UTF-8 and
 * stop-string decoding, the prefix cache under the key's salt, a client's
 * disconnect cancelling) whose answer this file shapes (cmpl_shape): the
 * response object, or the semantic stream events, each with its
 * sequence_number:
 *
 *   response.created, response.in_progress, response.output_item.added,
 *   response.content_part.added, response.output_text.delta ...,
 *   response.output_text.done, response.content_part.done,
 *   response.output_item.done, response.completed | response.incomplete
 *
 * or, after a failure once the stream began, response.failed and error.
 * A finished response with store (the default) is kept in resp_store.c
 * for GET/DELETE /v1/responses/{id}, .../input_items and a later
 * previous_response_id, visible to its API key only.
 */
#include "api/api.h"

#include <stdlib.h>
#include <string.h>

/* The state of one Responses request (the completion job's shape_data). */
/* The state of one Responses request: resp_job (api.h). */

static resp_job *job_of(const srv_req *r)
{
    return r->cmpl->shape_data;
}

/* ---- The response object ------------------------------------------------ */

/* An output_text part; lp: its logprobs entries (a reference is taken),
 * or NULL for none. */
static json_t *text_part(const char *text, size_t len, json_t *lp)
{
    return json_pack("{s:s, s:s%, s:[], s:o}", "type", "output_text", "text", text ? text : "", len,
                     "annotations", "logprobs", lp ? json_incref(lp) : json_array());
}

/* The entries of a choice's logprobs object (chat's {content: [...]}). */
static json_t *lp_entries(const srv_choice *c)
{
    return c->lp ? json_object_get(c->lp, "content") : NULL;
}

/* The output message: in progress (content as given), or done. */
static json_t *message_item(const srv_req *r, const char *status, json_t *content)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", job_of(r)->msg_id, "type", "message",
                     "status", status, "role", "assistant", "content", content);
}

/* The output's function_call item (status: in_progress, completed or
 * incomplete), its arguments as they are. */
static json_t *call_item(const srv_req *r, const char *status)
{
    const resp_job *j = job_of(r);
    char call_id[48];
    tools_call_id(r, 0, call_id, sizeof call_id);
    return json_pack("{s:s+, s:s, s:s, s:s, s:s, s:s}", "id", "fc_", j->msg_id + strlen("msg_"),
                     "type", "function_call", "status", status, "call_id", call_id, "name",
                     j->call_name ? j->call_name : "", "arguments",
                     j->call_args ? j->call_args : "");
}

static json_t *usage_json(const srv_req *r)
{
    size_t in = tok_prompt_tokens(r), out = cmpl_completion_tokens(r);
    size_t cached = r->cmpl->nchoices > 0 ? r->cmpl->choices[0].cached : 0;
    return json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens", (json_int_t)in,
                     "input_tokens_details", "cached_tokens", (json_int_t)cached, "output_tokens",
                     (json_int_t)out, "output_tokens_details", "reasoning_tokens", (json_int_t)0,
                     "total_tokens", (json_int_t)(in + out));
}

/* The response object in the status given: "in_progress" (no output yet),
 * "completed", "incomplete" or "failed"; output and usage only when it
 * ended (text: its output). */
static json_t *response_json(const srv_req *r, const char *status, const char *text, size_t len,
                             json_t *lp)
{
    const resp_job *j = job_of(r);
    const oai_request *q = &r->cmpl->oreq;
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(r->id));
    json_object_set_new(o, "object", json_string("response"));
    json_object_set_new(o, "created_at", json_integer((json_int_t)r->created));
    json_object_set_new(o, "status", json_string(status));
    json_t *error = json_null(), *incomplete = json_null();
    if (strcmp(status, "failed") == 0)
        error = json_pack("{s:s, s:s}", "code",
                          r->cmpl->error_code            ? r->cmpl->error_code
                          : r->cmpl->error_status >= 500 ? "server_error"
                                                         : "invalid_request",
                          "message", r->cmpl->error_msg);
    if (strcmp(status, "incomplete") == 0)
        incomplete = json_pack("{s:s}", "reason", "max_output_tokens");
    json_object_set_new(o, "error", error);
    json_object_set_new(o, "incomplete_details", incomplete);
    json_object_set_new(o, "instructions",
                        j->rq.instructions
                            ? json_stringn(j->rq.instructions, j->rq.instructions_len)
                            : json_null());
    json_object_set_new(o, "max_output_tokens",
                        q->max_tokens_auto ? json_null() : json_integer((json_int_t)q->max_tokens));
    json_object_set_new(o, "model", json_string(adp_model_name(r)));
    json_t *output = json_array();
    int ended = strcmp(status, "in_progress") != 0 && strcmp(status, "failed") != 0;
    if (ended && j->call_name != NULL) { /* a call: its item, no text */
        json_array_append_new(output, call_item(r, status));
        json_object_set_new(o, "output_text", json_string(""));
    } else if (ended) {
        json_array_append_new(output,
                              message_item(r, status, json_pack("[o]", text_part(text, len, lp))));
        json_object_set_new(o, "output_text", json_stringn(text ? text : "", len));
    }
    json_object_set_new(o, "output", output);
    json_object_set_new(o, "parallel_tool_calls", json_false());
    json_object_set_new(o, "previous_response_id",
                        j->rq.previous_id ? json_string(j->rq.previous_id) : json_null());
    json_object_set_new(o, "reasoning", json_pack("{s:n, s:n}", "effort", "summary"));
    json_object_set_new(o, "store", json_boolean(j->rq.store));
    json_object_set_new(o, "temperature", json_real(q->temperature));
    /* text.format and tool_choice as the request set them (OpenAI's
     * defaults otherwise) */
    json_object_set_new(o, "text",
                        json_pack("{s:o}", "format",
                                  j->rq.text_format ? json_deep_copy(j->rq.text_format)
                                                    : json_pack("{s:s}", "type", "text")));
    json_object_set_new(o, "tool_choice",
                        j->rq.tool_choice ? json_incref(j->rq.tool_choice)
                                          : json_string(j->rq.tool_choice_none ? "none" : "auto"));
    json_object_set_new(o, "tools", j->rq.tools ? json_incref(j->rq.tools) : json_array());
    json_object_set_new(o, "top_p", json_real(q->top_p));
    json_object_set_new(o, "truncation", json_string(j->rq.truncation_auto ? "auto" : "disabled"));
    json_object_set_new(o, "usage",
                        ended || strcmp(status, "failed") == 0 ? usage_json(r) : json_null());
    json_object_set_new(o, "user", j->rq.user ? json_incref(j->rq.user) : json_null());
    json_object_set_new(o, "metadata",
                        j->rq.metadata ? json_incref(j->rq.metadata) : json_object());
    return o;
}

/* "completed", or "incomplete" when max_output_tokens (or the request's
 * own timeout) ended it. */
static const char *final_status(const srv_req *r)
{
    const srv_choice *c = &r->cmpl->choices[0];
    return c->finish != NULL && strcmp(c->finish, "length") == 0 ? "incomplete" : "completed";
}

/* Keeps the finished response (store) with its conversation: the history,
 * the input and the output (text: the reply's, or a call's arguments; not
 * the instructions, which a previous_response_id does not carry over). */
static void store_put(srv_req *r, json_t *response, const char *text, size_t len)
{
    resp_job *j = job_of(r);
    srv *s = r->s;
    if (!j->rq.store) return;
    if (r->cmpl->cancel_counted && r->cmpl->cancel_why == MET_CANCEL_CLIENT_CLOSED) {
        log_line("info", "%s: not stored: its client left before the end", r->id);
        return;
    }
    if (s->api->resp_store == NULL && (s->api->resp_store = rs_new()) == NULL) goto oom;
    rs_msg *m = malloc((j->nin + 1) * sizeof *m);
    if (m == NULL) goto oom;
    for (size_t i = 0; i < j->nin; i++)
        m[i] = (rs_msg){j->in[i].role, j->in[i].text, j->in[i].len,
                        j->in[i].kind, j->in[i].name, j->in[i].call_id};
    char call_id[48];
    tools_call_id(r, 0, call_id, sizeof call_id);
    m[j->nin] =
        (rs_msg){.role = OAI_ROLE_ASSISTANT, .text = text ? text : "", .len = text ? len : 0};
    if (j->call_name != NULL) { /* the reply was a call */
        m[j->nin].kind = OAI_MSG_CALL;
        m[j->nin].name = j->call_name;
        m[j->nin].call_id = call_id;
    }
    rs_turns *t = rs_turns_new(s->api->resp_store, r->key_id, j->prev, m, j->nin + 1,
                               s->cfg.responses_store_chain_bytes);
    free(m);
    rs_entry *e = t ? rs_entry_new(r->id, r->key_id, response, t, j->nin) : NULL;
    if (e == NULL) {
        rs_turns_unref(t);
        goto oom;
    }
    if (t->parent == NULL && j->prev != NULL)
        log_line("info",
                 "%s: its conversation passed responses_store_chain_bytes (%zu): stored with "
                 "the newest %zu of its %zu earlier messages",
                 r->id, s->cfg.responses_store_chain_bytes, t->n - j->nin - 1, j->prev->chain_msgs);
    if (!rs_put(s->api->resp_store, e, s->cfg.responses_store_max, s->cfg.responses_store_bytes))
        log_line("info", "%s: not stored: over responses_store_max or responses_store_bytes",
                 r->id);
    return;
oom:
    log_line("warn", "%s: not stored: out of memory", r->id);
}

/* ---- The stream ---------------------------------------------------------- */

/* obj as the event type: its type and the next sequence_number first
 * (takes obj); NULL when memory ran out (the stream is then broken). */
static json_t *event_obj(srv_req *r, const char *type, json_t *obj)
{
    resp_job *j = job_of(r);
    json_t *e = obj ? json_pack("{s:s, s:I}", "type", type, "sequence_number", j->seq++) : NULL;
    if (e != NULL && json_object_update(e, obj) != 0) {
        json_decref(e);
        e = NULL;
    }
    json_decref(obj);
    if (e == NULL) r->cmpl->sse.failed = 1;
    return e;
}

/* Queues one event (takes obj); one that is not queued (over
 * max_response_bytes, or after the stream was cut) gives its
 * sequence_number back, so that the numbers the client gets have no gap. */
static void event(srv_req *r, const char *type, json_t *obj)
{
    json_t *e = event_obj(r, type, obj);
    if (e != NULL && sse_event(&r->cmpl->sse, type, e) != 0) job_of(r)->seq--;
    json_decref(e);
}

/* The fields that place an event in the output: item 0, part 0. */
static json_t *at_part(const srv_req *r)
{
    return json_pack("{s:s, s:i, s:i}", "item_id", job_of(r)->msg_id, "output_index", 0,
                     "content_index", 0);
}

static void finish_failed(srv_req *r);

/* The output message's item and part, opened (once). */
static void open_message(srv_req *r)
{
    resp_job *j = job_of(r);
    if (j->item_open) return;
    j->item_open = 1;
    event(r, "response.output_item.added",
          json_pack("{s:i, s:o}", "output_index", 0, "item",
                    message_item(r, "in_progress", json_array())));
    json_t *o = at_part(r);
    json_object_set_new(o, "part", text_part("", 0, NULL));
    event(r, "response.content_part.added", o);
}

/* With tools the output's item waits until the reply is known to be text
 * (a message) or a call (a function_call). */
static void shape_open(srv_req *r)
{
    event(r, "response.created",
          json_pack("{s:o}", "response", response_json(r, "in_progress", NULL, 0, NULL)));
    event(r, "response.in_progress",
          json_pack("{s:o}", "response", response_json(r, "in_progress", NULL, 0, NULL)));
    if (r->cmpl->oreq.tool_mode == OAI_TOOLS_NONE) open_message(r);
}

/* n bytes of the output's text (c's logprobs with them). */
static void text_delta(srv_choice *c, const char *p, size_t n)
{
    srv_req *r = c->req;
    resp_job *j = job_of(r);
    if (n == 0) return;
    open_message(r);
    if (http_append(&j->text, &j->len, &j->cap, p, n) != 0) {
        cmpl_fail_oom(r);
        return;
    }
    json_t *o = at_part(r), *lp = lp_entries(c);
    json_object_set_new(o, "delta", json_stringn(p, n));
    json_object_set_new(o, "logprobs", lp ? json_incref(lp) : json_array());
    if (lp != NULL) { /* the delta's entries, kept for the done events */
        if ((j->lp == NULL && (j->lp = json_array()) == NULL) || json_array_extend(j->lp, lp) != 0)
            cmpl_fail_oom(r);
        json_decref(c->lp);
        c->lp = lp_new(r);
    }
    event(r, "response.output_text.delta", o);
}

static void rd_text(void *u, const char *p, size_t n)
{
    text_delta(u, p, n);
}

/* A call's tokens have no logprobs (an output_text part has them; a
 * function_call item has none): c's entries so far are dropped. */
static void drop_lp(srv_choice *c)
{
    if (c->lp == NULL || lp_count(c->lp) == 0) return;
    json_decref(c->lp);
    c->lp = lp_new(c->req);
}

static void rd_head(void *u, const char *name, size_t n)
{
    srv_choice *c = u;
    resp_job *j = job_of(c->req);
    drop_lp(c);
    free(j->call_name);
    if ((j->call_name = strndup(name, n)) == NULL) {
        cmpl_fail_oom(c->req);
        return;
    }
    if (http_append(&j->call_args, &j->args_len, &j->args_cap, "", 0) != 0) cmpl_fail_oom(c->req);
    event(c->req, "response.output_item.added",
          json_pack("{s:i, s:o}", "output_index", 0, "item", call_item(c->req, "in_progress")));
}

static void rd_args(void *u, const char *p, size_t n)
{
    srv_choice *c = u;
    resp_job *j = job_of(c->req);
    drop_lp(c);
    if (http_append(&j->call_args, &j->args_len, &j->args_cap, p, n) != 0) {
        cmpl_fail_oom(c->req);
        return;
    }
    event(c->req, "response.function_call_arguments.delta",
          json_pack("{s:s+, s:i, s:s%}", "item_id", "fc_", j->msg_id + strlen("msg_"),
                    "output_index", 0, "delta", p, n));
}

static const tools_reader_ops resp_rd_ops = {.text = rd_text, .head = rd_head, .args = rd_args};

static void shape_chunk(srv_choice *c)
{
    srv_req *r = c->req;
    resp_job *j = job_of(r);
    if (r->cmpl->oreq.tool_mode == OAI_TOOLS_NONE)
        text_delta(c, c->text, c->text_len);
    else if (tools_reader_feed(&j->rd, c->text ? c->text : "", c->text_len, &resp_rd_ops, c) != 0)
        cmpl_fail_oom(r);
    c->text_len = 0;
}

/* A stream's last n events (taken), the last the response's end: queued
 * only if all of them fit under max_response_bytes (else the stream fails
 * naming it, its numbering back at seq), and resp stored (text: its
 * conversation's last message) before the last goes out. */
static void finish_with(srv_req *r, const char *const *name, json_t **ev, int n, json_int_t seq,
                        json_t *resp, const char *text, size_t len)
{
    size_t need = 0;
    for (int i = 0; i < n; i++) need += ev[i] ? sse_event_bytes(name[i], ev[i]) : 0;
    int fits = sse_fits(&r->cmpl->sse, need);
    for (int i = 0; fits && i < n; i++) {
        if (i == n - 1 && text != NULL) store_put(r, resp, text, len);
        if (ev[i] != NULL) sse_event(&r->cmpl->sse, name[i], ev[i]);
    }
    for (int i = 0; i < n; i++) json_decref(ev[i]);
    json_decref(resp);
    if (!fits) {
        job_of(r)->seq = seq;
        cmpl_too_large(r);
        finish_failed(r);
        return;
    }
    sse_end(&r->cmpl->sse);
}

/* A stream that ended in a call: its last events and the response. */
static void finish_call(srv_req *r, int whole)
{
    resp_job *j = job_of(r);
    const char *status = whole ? "completed" : "incomplete";
    const char *name[3] = {"response.function_call_arguments.done", "response.output_item.done",
                           whole ? "response.completed" : "response.incomplete"};
    json_t *ev[3];
    json_int_t seq = j->seq;
    ev[0] = event_obj(r, name[0],
                      json_pack("{s:s+, s:i, s:s}", "item_id", "fc_", j->msg_id + strlen("msg_"),
                                "output_index", 0, "arguments", j->call_args ? j->call_args : ""));
    ev[1] = event_obj(r, name[1],
                      json_pack("{s:i, s:o}", "output_index", 0, "item", call_item(r, status)));
    json_t *resp = response_json(r, status, NULL, 0, NULL);
    ev[2] = event_obj(r, name[2], json_pack("{s:O}", "response", resp));
    finish_with(r, name, ev, 3, seq, resp, j->call_args ? j->call_args : "",
                j->call_args ? strlen(j->call_args) : 0);
}

/* After the headers: the failed response, then the error event. */
static void finish_failed(srv_req *r)
{
    /* Numbered on from the last event the client gets (sse_cut dropped
     * the rest unsent). */
    job_of(r)->seq -= (json_int_t)r->cmpl->sse.dropped;
    r->cmpl->sse.dropped = 0;
    sse_final(&r->cmpl->sse);
    event(r, "response.failed",
          json_pack("{s:o}", "response", response_json(r, "failed", NULL, 0, NULL)));
    event(r, "error",
          json_pack("{s:s, s:s, s:n}", "code",
                    r->cmpl->error_code ? r->cmpl->error_code : "server_error", "message",
                    r->cmpl->error_msg, "param"));
    sse_end(&r->cmpl->sse);
}

static void shape_finish_stream(srv_req *r)
{
    resp_job *j = job_of(r);
    if (r->cmpl->error_status != 0) {
        finish_failed(r);
        return;
    }
    const char *status = final_status(r);
    if (r->cmpl->oreq.tool_mode != OAI_TOOLS_NONE) {
        int whole = tools_reader_end(&j->rd, strcmp(status, "completed") != 0, &resp_rd_ops,
                                     &r->cmpl->choices[0]);
        if (j->call_name != NULL) {
            finish_call(r, whole);
            return;
        }
        open_message(r); /* text, or a call cut before its name: as text */
    }
    const json_t *rest = lp_entries(&r->cmpl->choices[0]); /* tokens that made no text */
    if (rest != NULL && json_array_size(rest) > 0
        && ((j->lp == NULL && (j->lp = json_array()) == NULL)
            || json_array_extend(j->lp, (json_t *)rest) != 0))
        r->cmpl->sse.failed = 1;
    /* The last four events each carry the whole text (and its logprobs):
     * made first, and queued only if all of them fit under
     * max_response_bytes, or the stream fails naming it instead. */
    const char *name[4] = {
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        strcmp(status, "completed") == 0 ? "response.completed" : "response.incomplete"};
    json_t *ev[4];
    json_int_t seq = j->seq;
    json_t *o = at_part(r);
    json_object_set_new(o, "text", json_stringn(j->text ? j->text : "", j->len));
    json_object_set_new(o, "logprobs", j->lp ? json_incref(j->lp) : json_array());
    ev[0] = event_obj(r, name[0], o);
    o = at_part(r);
    json_object_set_new(o, "part", text_part(j->text, j->len, j->lp));
    ev[1] = event_obj(r, name[1], o);
    ev[2] = event_obj(
        r, name[2],
        json_pack("{s:i, s:o}", "output_index", 0, "item",
                  message_item(r, status, json_pack("[o]", text_part(j->text, j->len, j->lp)))));
    json_t *resp = response_json(r, status, j->text, j->len, j->lp);
    ev[3] = event_obj(r, name[3], json_pack("{s:O}", "response", resp));
    finish_with(r, name, ev, 4, seq, resp, j->text ? j->text : "", j->len);
}

static enum MHD_Result shape_send(srv_req *r)
{
    if (r->cmpl->error_status != 0)
        return http_send_error(r, r->cmpl->error_status, cmpl_error_type(r->cmpl->error_status),
                               r->cmpl->error_code, NULL, r->cmpl->error_status == 503 ? "5" : NULL,
                               "%s", r->cmpl->error_msg);
    const srv_choice *c = &r->cmpl->choices[0];
    /* A whole answer keeps its logprobs as numbers (c->lpe, lp_add): made
     * into chat's entries here, once. */
    json_t *lp = NULL;
    if (c->lp != NULL) {
        lp = json_array();
        for (size_t i = 0; lp != NULL && i < c->lpe_n; i++)
            if (json_array_append_new(lp, lp_entry_json(r, &c->lpe[i], 1)) != 0) {
                json_decref(lp);
                lp = NULL;
            }
        if (lp == NULL)
            return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    }
    resp_job *j = job_of(r);
    char *name, *args;
    int call = tools_parse_call(c->text ? c->text : "", c->text_len, &r->cmpl->oreq,
                                &r->s->api->chat, &name, &args);
    if (call) {
        j->call_name = name;
        j->call_args = args;
    }
    json_t *resp = response_json(r, call ? "completed" : final_status(r), c->text, c->text_len, lp);
    json_decref(lp);
    /* What is written, measured: the text is in it twice (output and
     * output_text), which the count while generating does not know. */
    if (resp != NULL && json_dumpb(resp, NULL, 0, JSON_COMPACT) > r->s->cfg.max_response_bytes) {
        json_decref(resp);
        cmpl_too_large(r);
        return http_send_error(r, r->cmpl->error_status, cmpl_error_type(r->cmpl->error_status),
                               r->cmpl->error_code, NULL, NULL, "%s", r->cmpl->error_msg);
    }
    if (resp != NULL && call)
        store_put(r, resp, j->call_args, strlen(j->call_args));
    else if (resp != NULL)
        store_put(r, resp, c->text, c->text_len);
    return http_send_obj(r, resp);
}

static void shape_free(srv_req *r)
{
    resp_job *j = job_of(r);
    if (j == NULL) return;
    oai_resp_request_free(&j->rq);
    rs_turns_unref(j->prev);
    oai_msgs_free(j->in, j->nin);
    free(j->text);
    json_decref(j->lp);
    tools_reader_free(&j->rd);
    free(j->call_name);
    free(j->call_args);
    free(j);
    r->cmpl->shape_data = NULL;
}

static const cmpl_shape resp_shape = {
    .open = shape_open,
    .chunk = shape_chunk,
    .finish_stream = shape_finish_stream,
    .send = shape_send,
    .free = shape_free,
};

/* ---- The request ---------------------------------------------------------- */

/* The continuation of tokenizing: the context (truncation), then the
 * completion's own admission. */
static enum MHD_Result after_tokenize(srv_req *r)
{
    resp_job *j = job_of(r);
    if (r->tok->failed) return cmpl_admit(r);
    if (j->dropped > 0)
        log_line("info", "%s: truncation auto: the oldest %zu of %zu messages left out", r->id,
                 j->dropped, j->total);
    if (j->too_long) {
        const eng_config *mc = eng_model_config(r->cmpl->ckpt->model);
        return http_send_error(
            r, 400, "invalid_request_error", "context_length_exceeded", "input", NULL,
            "The input is %s%zu tokens in the chat template; this model's "
            "context is %zu tokens (max_prompt_tokens %zu), and %s; send "
            "less%s",
            j->over ? "over " : "", j->tokens, mc->n_ctx, r->s->cfg.max_prompt_tokens,
            r->cmpl->oreq.max_tokens_auto ? "the output needs room"
                                          : "max_output_tokens needs room",
            j->rq.truncation_auto ? " (truncation auto left only the newest message, which "
                                    "alone does not fit)"
                                  : ", or \"truncation\": \"auto\" to drop the oldest messages");
    }
    return cmpl_admit(r);
}

/* A new response's ids: "resp_" + 24 hex digits of a keyed hash of a
 * counter (not guessable in order; a stored response is still its key's
 * only), and its message's, "msg_" + the same digits: an item_reference to
 * the message finds its response. */
static void new_ids(srv *s, char *resp_id, size_t resp_len, char *msg_id, size_t msg_len)
{
    uint64_t n = s->next_id++;
    uint64_t a = http_siphash(s->salt_secret, &n, sizeof n);
    n ^= UINT64_C(0x9e3779b97f4a7c15);
    uint64_t b = http_siphash(s->salt_secret, &n, sizeof n);
    char hex[32];
    snprintf(hex, sizeof hex, "%016llx%08llx", (unsigned long long)a,
             (unsigned long long)(b & 0xffffffffu));
    snprintf(resp_id, resp_len, "resp_%s", hex);
    snprintf(msg_id, msg_len, "msg_%s", hex);
}

/* The body parsed into the job, and what its prompt's making needs (the
 * request moved to the completion job, its prompt slot, the format's work,
 * the reader, the limits): pure, on the loop thread or a tokenizer thread.
 * 0, or -1 with cmpl->parse_err set. */
static int parse_body(srv_req *r)
{
    resp_job *j = job_of(r);
    if (oai_parse_responses(r->body ? r->body : "", r->body_len, &r->cmpl->lim, &r->s->api->chat,
                            &j->rq, &r->cmpl->parse_err)
        != 0)
        return -1;
    r->cmpl->oreq = j->rq.req; /* moved: the job frees it */
    memset(&j->rq.req, 0, sizeof j->rq.req);
    oai_request *q = &r->cmpl->oreq;
    q->prompts = calloc(1, sizeof *q->prompts); /* the request frees it */
    if (q->prompts == NULL || tok_job_prompts(r->tok, 1) != 0) {
        oai_error_set(&r->cmpl->parse_err, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    q->nprompts = 1;
    cmpl_job_prediction(r);           /* a prediction: encoded where the prompt is tokenized */
    if (q->format != OAI_FORMAT_NONE) /* text.format: compiled where the input is tokenized */
        r->tok->work = cmpl_compile_format;
    tools_reader_init(&j->rd, q->tool_mode, r->s->api->chat.call_prefix);
    j->fit = resp_fit_limit(r);
    j->budget = resp_prompt_budget(r);
    return 0;
}

/* A large body's work on a tokenizer thread (tok_prompts' parser): the
 * parse, then the prompt, unless the conversation names stored items, which
 * only the loop thread may read (deferred: its prompt is made after). */
static int parse_and_prepare(srv_req *r)
{
    resp_job *j = job_of(r);
    if (parse_body(r) != 0) return -1;
    /* Several checkpoints: the prompt's limits are those of the one
     * `model` picks, which the loop thread resolves (named_ok) first. */
    j->deferred = j->rq.previous_id != NULL || r->s->api->nckpt > 1;
    for (size_t i = 0; i < j->rq.nmsgs; i++) j->deferred |= j->rq.msgs[i].ref != NULL;
    if (j->deferred) { /* the prediction too is encoded on the second trip */
        r->tok->pred_text = NULL;
        return 0;
    }
    j->in = j->rq.msgs; /* the conversation is the input alone (moved) */
    j->nin = j->rq.nmsgs;
    j->rq.msgs = NULL;
    j->rq.nmsgs = 0;
    return resp_prepare(r);
}

/* The response's ids, the model it names and its speculation's drafter. 1,
 * or 0 with the 404 or 400 queued (*rc). */
static int named_ok(srv_req *r, enum MHD_Result *rc)
{
    srv *s = r->s;
    const oai_request *q = &r->cmpl->oreq;
    new_ids(s, r->id, sizeof r->id, job_of(r)->msg_id, sizeof job_of(r)->msg_id);
    if (!adp_pick(r, q->model, rc)) return 0; /* the base, or an adapter by name */
    /* The prompt's limits: the picked checkpoint's context. */
    resp_job *j = job_of(r);
    j->n_ctx = eng_model_config(cmpl_ckpt(r)->model)->n_ctx;
    j->fit = resp_fit_limit(r);
    j->budget = resp_prompt_budget(r);
    return cmpl_speculation_ok(r, rc);
}

/* A parsed body's conversation (the store read here, on the loop thread),
 * then its prompt, made where it is tokenized: on a tokenizer thread when
 * a stored history or a format is involved, or the body is large. */
static enum MHD_Result start_prompt(srv_req *r)
{
    resp_job *j = job_of(r);
    enum MHD_Result rc;
    if (resp_build_conv(r, &rc) != 0) return rc;
    cmpl_job_prediction(r);
    r->tok->heavy = r->cmpl->oreq.format != OAI_FORMAT_NONE || j->prev != NULL;
    return tok_prompts(r, resp_prepare, after_tokenize);
}

/* The continuation of a large body parsed (and its prompt made, unless
 * deferred) on a tokenizer thread. */
static enum MHD_Result after_worker_parse(srv_req *r)
{
    assert(r->state == HTTP_REQ_TOKENIZING);
    if (r->tok->parse_failed) return cmpl_send_oai_error(r, &r->cmpl->parse_err);
    enum MHD_Result rc;
    if (!named_ok(r, &rc)) return rc;
    return job_of(r)->deferred ? start_prompt(r) : after_tokenize(r);
}

enum MHD_Result resp_route(srv_req *r)
{
    assert(r->state == HTTP_REQ_BODY);
    srv *s = r->s;
    if (s->api->draining) return cmpl_refuse_draining(r);
    if (!s->api->chat_on)
        return http_send_error(r, 400, "invalid_request_error", "chat_not_supported", NULL, NULL,
                               "This server has no chat template (chat_template = none), which "
                               "/v1/responses needs: send the text to continue to "
                               "/v1/completions");
    const eng_config *mc = eng_model_config(s->api->model);
    r->kind = R_COMPLETIONS;
    if (cmpl_job_new(r) == NULL)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    resp_job *j = calloc(1, sizeof *j);
    if (j == NULL)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    r->cmpl->shape = &resp_shape;
    r->cmpl->shape_data = j;
    /* What a tokenizer thread may read, fixed here (a reload changes the
     * config on the loop thread meanwhile). */
    r->tok->max_prompt_tokens = s->cfg.max_prompt_tokens;
    j->n_ctx = mc->n_ctx;
    r->cmpl->chat = 1;
    r->cmpl->lim = (oai_limits){.vocab_size = mc->n_vocab,
                                .max_tokens_limit = s->cfg.max_tokens_limit,
                                .max_n = s->cfg.max_n,
                                .max_stop_bytes = SRV_MAX_STOP_BYTES,
                                .max_prompts = 1,
                                .chat_max_tokens = s->cfg.chat_max_tokens};
    /* A large body is parsed, and its prompt made, on a tokenizer thread
     * (parsing 1 MB of JSON holds every stream's next token ~10 ms), as
     * completions' and chat's are. */
    if (r->body_len >= SRV_TOKENIZE_INLINE_BYTES)
        return tok_prompts(r, parse_and_prepare, after_worker_parse);
    if (parse_body(r) != 0) return cmpl_send_oai_error(r, &r->cmpl->parse_err);
    enum MHD_Result rc;
    if (!named_ok(r, &rc)) return rc;
    return start_prompt(r);
}
