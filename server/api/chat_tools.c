/*
 * server/api/chat_tools.c: function tools on POST /v1/chat/completions. The
 * request's tools are parsed and written into the prompt by oai_chat.c
 * (oai_request.tool_mode, the call's schema in format_src); this file makes
 * the call happen and answers it in OpenAI's shape.
 *
 * A call is the chat template's marker (oai_template.call_prefix, after
 * its call_lead) then {"name":N,"arguments":{...}} (compact JSON, name
 * first: the structured-outputs grammar writes an object's properties in
 * the order its schema gives them).
 *   - tool_choice required, or a named function: the prompt ends with the
 *     marker and the whole reply is the object, constrained from its first
 *     token (the format mask of completions.c).
 *   - auto: the reply is free text, unless its first token is the first
 *     token of the lead and marker (" <tool_call>" by default); then the
 *     marker's other tokens follow,
 *     forced, and the rest is the object, constrained (the mask here).
 * Either way the call always parses and its arguments validate against
 * the tool's parameters, on any weights. One call per reply.
 *
 * The answer: message {role, content: null, tool_calls: [{id, type,
 * function: {name, arguments}}]} and finish_reason "tool_calls"; streamed,
 * delta.tool_calls[0] with index, id, type and the name first, then the
 * arguments in pieces as they come. A reply that is text is content, as
 * without tools. The shape's state is one parser per choice.
 *
 * logprobs are those of the message's content, as OpenAI defines them: a
 * reply that is text has its tokens' entries ({content: [...]}, streamed
 * with the text they made), a call has none ({content: null}; the marker's
 * and the call's tokens are not content).
 */
#include "api/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- The mask of tool_choice auto ---------------------------------------- */

enum { TM_START, TM_FREE, TM_MARKER, TM_CALL };

typedef struct {
    int state;
    size_t at; /* TM_MARKER: the marker's next token */
    const int32_t *marker;
    size_t nmarker;
    const uint64_t *all; /* every token's bit */
    uint64_t *one;       /* TM_MARKER: the one token allowed */
    size_t V, words;
    gram_matcher *m;
} tool_mask;

static const uint64_t *tm_allowed(void *self, size_t *n)
{
    tool_mask *t = self;
    if (t->state == TM_START || t->state == TM_FREE) {
        *n = t->V;
        return t->all;
    }
    if (t->state == TM_MARKER) {
        memset(t->one, 0, t->words * sizeof *t->one);
        int32_t id = t->marker[t->at];
        t->one[id / 64] |= UINT64_C(1) << (id % 64);
        *n = 1;
        return t->one;
    }
    return gram_matcher_mask(t->m, n);
}

static int tm_accept(void *self, int32_t token)
{
    tool_mask *t = self;
    switch (t->state) {
    case TM_START:
        t->state = token != t->marker[0] ? TM_FREE : t->nmarker > 1 ? TM_MARKER : TM_CALL;
        t->at = 1;
        return 0;
    case TM_FREE: return 0;
    case TM_MARKER:
        if (token != t->marker[t->at]) return -1;
        if (++t->at == t->nmarker) t->state = TM_CALL;
        return 0;
    default: return gram_matcher_feed(t->m, token);
    }
}

static int tm_accepting(const void *self)
{
    const tool_mask *t = self;
    return t->state == TM_START || t->state == TM_FREE
           || (t->state == TM_CALL && gram_matcher_accepting(t->m));
}

static const char *tm_error(const void *self)
{
    const tool_mask *t = self;
    return t->state == TM_CALL ? gram_matcher_error(t->m) : NULL;
}

static void tm_free(void *self)
{
    tool_mask *t = self;
    gram_matcher_free(t->m);
    free(t->one);
    free(t);
}

static const eng_mask_ops tool_mask_ops = {
    .allowed = tm_allowed,
    .accept = tm_accept,
    .accepting = tm_accepting,
    .error = tm_error,
    .free = tm_free,
};

/* The marker's tokens (the template's lead and marker) and the
 * all-tokens bitset, once. 0, or -1. */
static int tools_init(srv_api *a)
{
    if (a->tool_marker != NULL) return 0;
    size_t V = gram_vocab_size(a->gvocab), words = (V + 63) / 64;
    char err[64], *marker = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    if (asprintf(&marker, "%s%s", a->chat.call_lead, a->chat.call_prefix) < 0) return -1;
    bpe_status st = bpe_encode_special(a->tok, marker, strlen(marker), &ids, &n, err, sizeof err);
    free(marker);
    if (st != BPE_OK || n == 0) {
        free(ids);
        return -1;
    }
    uint64_t *all = malloc(words * sizeof *all);
    if (all == NULL) {
        free(ids);
        return -1;
    }
    memset(all, 0xff, words * sizeof *all);
    if (V % 64) all[words - 1] = (UINT64_C(1) << (V % 64)) - 1;
    a->tool_marker = ids;
    a->ntool_marker = n;
    a->all_tokens = all;
    return 0;
}

int tools_mask_new(srv_req *r, gram *g, eng_mask *out)
{
    srv_api *a = r->s->api;
    tool_mask *t = calloc(1, sizeof *t);
    if (t == NULL || tools_init(a) != 0) {
        free(t);
        return -1;
    }
    t->V = gram_vocab_size(a->gvocab);
    t->words = (t->V + 63) / 64;
    t->marker = a->tool_marker;
    t->nmarker = a->ntool_marker;
    t->all = a->all_tokens;
    t->one = malloc(t->words * sizeof *t->one);
    t->m = gram_matcher_new(g, a->gvocab);
    if (t->one == NULL || t->m == NULL) {
        tm_free(t);
        return -1;
    }
    *out = (eng_mask){.ops = &tool_mask_ops, .self = t, .n_vocab = t->V};
    return 0;
}

/* ---- Reading a reply as a call --------------------------------------------- */

/* The call's id: "call_" and 24 hex digits of a keyed hash of the request
 * and the choice (not guessable, the same in every delta of a stream). */
void tools_call_id(const srv_req *r, size_t index, char *out, size_t len)
{
    unsigned char m[64];
    size_t n = strlen(r->id);
    if (n > 56) n = 56;
    memcpy(m, r->id, n);
    for (int j = 0; j < 8; j++) m[n + (size_t)j] = (unsigned char)(index >> (8 * j));
    uint64_t a = http_siphash(r->s->salt_secret, m, n + 8);
    m[0] ^= 0x5a;
    uint64_t b = http_siphash(r->s->salt_secret, m, n + 8);
    snprintf(out, len, "call_%016llx%08llx", (unsigned long long)a,
             (unsigned long long)(b & 0xffffffffu));
}

/* White space: what a template's call_lead is made of. */
static int is_lead(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

int tools_parse_call(const char *text, size_t len, const oai_request *q, const oai_template *t,
                     char **name, char **args)
{
    if (q->tool_mode == OAI_TOOLS_NONE) return 0;
    if (q->tool_mode == OAI_TOOLS_AUTO) {
        size_t nb = strlen(t->call_prefix);
        while (len > 0 && is_lead(*text)) { /* the lead (a template without trim_reply) */
            text++;
            len--;
        }
        if (len < nb || memcmp(text, t->call_prefix, nb) != 0) return 0;
        text += nb;
        len -= nb;
    }
    json_t *o = json_loadb(text, len, 0, NULL);
    const json_t *n = json_object_get(o, "name"), *a = json_object_get(o, "arguments");
    int ok = 0;
    for (size_t i = 0; json_is_string(n) && a != NULL && i < q->ntools; i++)
        ok |= strcmp(q->tool_names[i], json_string_value(n)) == 0; /* one of the tools */
    if (ok) {
        *name = strdup(json_string_value(n));
        *args = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY);
        ok = *name != NULL && *args != NULL;
        if (!ok) {
            free(*name);
            free(*args);
        }
    }
    json_decref(o);
    return ok;
}

static json_t *call_json(const srv_req *r, size_t index, const char *name, const char *args)
{
    char id[48];
    tools_call_id(r, index, id, sizeof id);
    return json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name",
                     name, "arguments", args);
}

/* ---- A reply read as it streams ------------------------------------------
 * Undecided (auto: while it may still be the marker), text, or a call: its
 * head ({"name":"N","arguments":) until the name is known, then the
 * arguments, a last '}' held back (it may close the call's object). */

enum { TR_DECIDE, TR_TEXT, TR_HEAD, TR_ARGS };

void tools_reader_init(tools_reader *t, int mode, const char *marker)
{
    *t = (tools_reader){.state = mode == OAI_TOOLS_REQUIRED ? TR_HEAD
                                 : mode == OAI_TOOLS_AUTO   ? TR_DECIDE
                                                            : TR_TEXT,
                        .marker = marker};
}

void tools_reader_free(tools_reader *t)
{
    free(t->buf);
    t->buf = NULL;
}

/* TR_ARGS: what came goes on as arguments but a last '}' (held: t->buf is
 * that one byte, or nothing). Whole characters only: the texts come as
 * whole characters, and '}' is one. */
static void send_held(tools_reader *t, const tools_reader_ops *ops, void *u)
{
    size_t keep = t->len > 0 && t->buf[t->len - 1] == '}';
    if (t->len > keep) ops->args(u, t->buf, t->len - keep);
    if (keep) t->buf[0] = '}';
    t->len = keep;
}

/* TR_HEAD: the name, once {"name":"N","arguments": has come. */
static void read_head(tools_reader *t, const tools_reader_ops *ops, void *u)
{
    static const char pre[] = "{\"name\":\"", mid[] = "\",\"arguments\":";
    if (t->len <= sizeof pre - 1) return;
    const char *end = memchr(t->buf + sizeof pre - 1, '"', t->len - (sizeof pre - 1));
    if (end == NULL) return;
    size_t at = (size_t)(end - t->buf);
    if (t->len < at + sizeof mid - 1) return;
    ops->head(u, t->buf + sizeof pre - 1, at - (sizeof pre - 1));
    t->state = TR_ARGS;
    size_t rest = t->len - (at + sizeof mid - 1);
    memmove(t->buf, t->buf + at + sizeof mid - 1, rest);
    t->len = rest;
    send_held(t, ops, u);
}

int tools_reader_feed(tools_reader *t, const char *p, size_t n, const tools_reader_ops *ops,
                      void *u)
{
    if (n == 0) return 0;
    if (t->state == TR_TEXT) {
        ops->text(u, p, n);
        return 0;
    }
    if (http_append(&t->buf, &t->len, &t->cap, p, n) != 0) return -1;
    if (t->state == TR_DECIDE) {
        size_t sp = 0, nb = strlen(t->marker); /* the lead (a template without trim_reply) */
        while (sp < t->len && is_lead(t->buf[sp])) sp++;
        size_t have = t->len - sp, k = have < nb ? have : nb;
        if (memcmp(t->buf + sp, t->marker, k) != 0) { /* text after all */
            t->state = TR_TEXT;
            ops->text(u, t->buf, t->len);
            t->len = 0;
            return 0;
        }
        if (have < nb) return 0;
        memmove(t->buf, t->buf + sp + nb, have - nb);
        t->len = have - nb;
        t->state = TR_HEAD;
    }
    if (t->state == TR_HEAD)
        read_head(t, ops, u);
    else
        send_held(t, ops, u);
    return 0;
}

int tools_reader_end(tools_reader *t, int cut, const tools_reader_ops *ops, void *u)
{
    if ((t->state == TR_DECIDE || t->state == TR_HEAD) && t->len > 0) {
        /* It could still have been the marker, or a call cut before its
         * name: what came is text, as in a whole answer. */
        ops->text(u, t->buf, t->len);
        t->len = 0;
    }
    int whole = t->state == TR_ARGS && t->len == 1 && !cut;
    if (t->state == TR_ARGS && t->len == 1 && !whole) ops->args(u, t->buf, 1);
    return whole;
}

int tools_reader_is_call(const tools_reader *t)
{
    return t->state == TR_HEAD || t->state == TR_ARGS;
}

/* ---- The stream ------------------------------------------------------------ */

typedef struct {
    tools_reader *rd; /* one per choice */
    size_t n;
} tools_state;

static tools_state *state_of(const srv_req *r)
{
    return r->cmpl->shape_data;
}

static int mode_of(const srv_req *r)
{
    return r->cmpl->oreq.tool_mode;
}

/* One chunk of choice index: delta and lp (its logprobs, NULL: null) taken. */
static void send_delta_lp(srv_req *r, size_t index, json_t *delta, json_t *lp, const char *finish)
{
    json_t *o = cmpl_base(r);
    json_object_set_new(o, "choices",
                        json_pack("[{s:I, s:o, s:o, s:o}]", "index", (json_int_t)index, "delta",
                                  delta, "logprobs", lp ? lp : json_null(), "finish_reason",
                                  finish ? json_string(finish) : json_null()));
    if (r->cmpl->oreq.include_usage) json_object_set_new(o, "usage", json_null());
    cmpl_sse_event(r, o);
}

static void send_delta(srv_req *r, size_t index, json_t *delta, const char *finish)
{
    send_delta_lp(r, index, delta, NULL, finish);
}

/* Choice c's logprobs entries so far (a stream's, with logprobs asked), to
 * go with its next delta: the object (taken by the caller), c's entries
 * started again; NULL when there are none. */
static json_t *take_lp(srv_choice *c)
{
    if (c->lp == NULL || lp_count(c->lp) == 0) return NULL;
    json_t *lp = c->lp;
    c->lp = lp_new(c->req);
    return lp;
}

/* A call's tokens have no logprobs entries: c's so far are dropped. */
static void drop_lp(srv_choice *c)
{
    json_decref(take_lp(c));
}

/* The reader's ops for chat: u is the choice. */
static void chat_text(void *u, const char *p, size_t n)
{
    srv_choice *c = u;
    send_delta_lp(c->req, c->index, json_pack("{s:s%}", "content", p, n), take_lp(c), NULL);
}

static void chat_head(void *u, const char *name, size_t n)
{
    srv_choice *c = u;
    drop_lp(c);
    char id[48];
    tools_call_id(c->req, c->index, id, sizeof id);
    send_delta(c->req, c->index,
               json_pack("{s:[{s:I, s:s, s:s, s:{s:s%, s:s}}]}", "tool_calls", "index",
                         (json_int_t)0, "id", id, "type", "function", "function", "name", name, n,
                         "arguments", ""),
               NULL);
}

static void chat_args(void *u, const char *p, size_t n)
{
    srv_choice *c = u;
    drop_lp(c);
    send_delta(c->req, c->index,
               json_pack("{s:[{s:I, s:{s:s%}}]}", "tool_calls", "index", (json_int_t)0, "function",
                         "arguments", p, n),
               NULL);
}

static const tools_reader_ops chat_ops = {.text = chat_text, .head = chat_head, .args = chat_args};

static void shape_open(srv_req *r)
{
    for (size_t i = 0; i < r->cmpl->nchoices; i++)
        send_delta(r, i,
                   mode_of(r) == OAI_TOOLS_REQUIRED
                       ? json_pack("{s:s, s:n}", "role", "assistant", "content")
                       : json_pack("{s:s, s:s}", "role", "assistant", "content", ""),
                   NULL);
}

static void shape_chunk(srv_choice *c)
{
    srv_req *r = c->req;
    tools_reader *rd = &state_of(r)->rd[c->index];
    if (tools_reader_feed(rd, c->text ? c->text : "", c->text_len, &chat_ops, c) != 0)
        cmpl_fail_oom(r);
    c->text_len = 0;
    /* Tokens that made no text yet: a text reply's go out now (as chat's
     * without tools), a call's arguments' are dropped; undecided (the
     * marker, or a call's head before its name: a reply cut there is
     * text), they wait with the text they may still make. */
    if (rd->state == TR_TEXT) {
        json_t *lp = take_lp(c);
        if (lp != NULL) send_delta_lp(r, c->index, json_pack("{s:s}", "content", ""), lp, NULL);
    } else if (rd->state == TR_ARGS) {
        drop_lp(c);
    }
}

static void shape_finish_stream(srv_req *r)
{
    tools_state *st = state_of(r);
    for (size_t i = 0; r->cmpl->error_status == 0 && i < r->cmpl->nchoices; i++) {
        srv_choice *c = &r->cmpl->choices[i];
        int cut = c->finish != NULL && strcmp(c->finish, "length") == 0;
        int whole = tools_reader_end(&st->rd[i], cut, &chat_ops, c);
        json_t *lp = take_lp(c); /* the last tokens', if they made no text */
        if (st->rd[i].state == TR_ARGS) {
            json_decref(lp);
            lp = NULL;
        }
        send_delta_lp(r, i, json_object(), lp, whole ? "tool_calls" : c->finish);
    }
    cmpl_finish_stream_tail(r);
}

/* ---- The whole answer ------------------------------------------------------ */

static enum MHD_Result shape_send(srv_req *r)
{
    cmpl_job *j = r->cmpl;
    if (j->error_status != 0)
        return http_send_error(r, j->error_status, cmpl_error_type(j->error_status), j->error_code,
                               NULL, j->error_status == 503 ? "5" : NULL, "%s", j->error_msg);
    json_t *o = cmpl_base(r), *choices = json_array();
    for (size_t i = 0; i < j->nchoices; i++) {
        const srv_choice *c = &j->choices[i];
        char *name, *args;
        json_t *msg;
        const char *finish = c->finish;
        json_t *lp = NULL; /* logprobs asked: the content's ({content: null} for a call) */
        if (c->lp != NULL) {
            if ((lp = json_pack("{s:n}", "content")) == NULL) goto oom;
        }
        if (tools_parse_call(c->text ? c->text : "", c->text_len, &r->cmpl->oreq, &r->s->api->chat,
                             &name, &args)) {
            msg = json_pack("{s:s, s:n, s:[o]}", "role", "assistant", "content", "tool_calls",
                            call_json(r, i, name, args));
            free(name);
            free(args);
            finish = "tool_calls";
        } else {
            msg = json_pack("{s:s, s:s%}", "role", "assistant", "content", c->text ? c->text : "",
                            c->text_len);
            json_t *entries = lp ? json_array() : NULL;
            for (size_t k = 0; entries != NULL && k < c->lpe_n; k++)
                if (json_array_append_new(entries, lp_entry_json(r, &c->lpe[k], 1)) != 0) {
                    json_decref(entries);
                    entries = NULL;
                }
            if (lp != NULL && (entries == NULL || json_object_set_new(lp, "content", entries) != 0))
                goto oom_lp;
        }
        json_array_append_new(choices, json_pack("{s:I, s:o, s:o, s:s}", "index", (json_int_t)i,
                                                 "message", msg, "logprobs", lp ? lp : json_null(),
                                                 "finish_reason", finish ? finish : "stop"));
        continue;
    oom_lp:
        json_decref(msg);
        json_decref(lp);
    oom:
        json_decref(o);
        json_decref(choices);
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    }
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", cmpl_usage_json(r));
    return http_send_obj(r, o);
}

static void shape_free(srv_req *r)
{
    tools_state *st = state_of(r);
    if (st == NULL) return;
    for (size_t i = 0; i < st->n; i++) tools_reader_free(&st->rd[i]);
    free(st->rd);
    free(st);
    r->cmpl->shape_data = NULL;
}

static const cmpl_shape tools_shape = {
    .open = shape_open,
    .chunk = shape_chunk,
    .finish_stream = shape_finish_stream,
    .send = shape_send,
    .free = shape_free,
};

int tools_begin(srv_req *r)
{
    const oai_request *q = &r->cmpl->oreq;
    size_t n = q->nprompts * q->best_of;
    tools_state *st = calloc(1, sizeof *st);
    if (st == NULL || (st->rd = calloc(n ? n : 1, sizeof *st->rd)) == NULL) {
        free(st);
        return -1;
    }
    st->n = n;
    for (size_t i = 0; i < n; i++)
        tools_reader_init(&st->rd[i], q->tool_mode, r->s->api->chat.call_prefix);
    r->cmpl->shape = &tools_shape;
    r->cmpl->shape_data = st;
    return tools_init(r->s->api);
}
