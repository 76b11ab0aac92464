/*
 * server/api/logprobs.c: a choice's logprobs object, one entry per token, in
 * the shape of its request's API:
 *   completions: {tokens, token_logprobs, top_logprobs, text_offset}
 *   chat:        {content: [{token, logprob, bytes, top_logprobs: [...]}]}
 */
#include "api/api.h"

#include <stdlib.h>
#include <string.h>

json_t *lp_new(const srv_req *r)
{
    if (r->cmpl->oreq.chat) return json_pack("{s:[]}", "content");
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
                     "text_offset");
}

size_t lp_count(const json_t *lp)
{
    const json_t *a = json_object_get(lp, "content");
    return json_array_size(a != NULL ? a : json_object_get(lp, "tokens"));
}

/* A token as text: its bytes when they are whole UTF-8, else OpenAI's
 * "bytes:\xe6\x97" spelling. */
static json_t *token_json(const srv *s, int32_t id)
{
    size_t len;
    const char *b = bpe_token_bytes(s->api->tok, id, &len);
    if (b == NULL) return json_string("");
    if (utf8_valid(b, len)) return json_stringn(b, len);
    char buf[6 + 4 * 256 + 1];
    size_t o = (size_t)snprintf(buf, sizeof buf, "bytes:");
    for (size_t i = 0; i < len && i < 256; i++)
        o += (size_t)snprintf(buf + o, sizeof buf - o, "\\x%02x", (unsigned char)b[i]);
    return json_stringn(buf, o);
}

/* A token's bytes as a list of integers (chat's `bytes`): exact even when a
 * character is split across tokens. */
static json_t *token_bytes(const srv *s, int32_t id)
{
    size_t len;
    const char *b = bpe_token_bytes(s->api->tok, id, &len);
    json_t *a = json_array();
    for (size_t i = 0; b != NULL && i < len; i++)
        json_array_append_new(a, json_integer((unsigned char)b[i]));
    return a;
}

size_t lp_offset_feed(srv_choice *c, int32_t id)
{
    size_t before = c->off_chars, len;
    const char *b = bpe_token_bytes(c->req->s->api->tok, id, &len);
    if (b == NULL) return before;
    char out[UTF8_STREAM_MAX_OUT(256)];
    size_t n = utf8_stream_feed(&c->off_utf8, b, len > 256 ? 256 : len, out);
    for (size_t i = 0; i < n; i++) c->off_chars += ((unsigned char)out[i] & 0xC0) != 0x80;
    return before;
}

/* Chat: {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]},
 * the alternatives most likely first. */
static json_t *chat_json(const srv *s, const lp_entry *e)
{
    json_t *top = json_array();
    for (int32_t k = 0; k < e->ntop; k++)
        json_array_append_new(
            top, json_pack("{s:o, s:f, s:o}", "token", token_json(s, e->top_ids[k]), "logprob",
                           (double)e->top_logprobs[k], "bytes", token_bytes(s, e->top_ids[k])));
    return json_pack("{s:o, s:f, s:o, s:o}", "token", token_json(s, e->id), "logprob",
                     (double)e->logprob, "bytes", token_bytes(s, e->id), "top_logprobs", top);
}

/* Completions' top_logprobs entry: {token: logprob}, or null without
 * alternatives asked for (or none known: the first prompt token). */
static json_t *top_json(const srv_req *r, const lp_entry *e)
{
    if (!e->has || r->cmpl->oreq.logprobs <= 0) return json_null();
    json_t *top = json_object();
    for (int32_t k = 0; k < e->ntop; k++) {
        json_t *t = token_json(r->s, e->top_ids[k]);
        json_object_set_new(top, json_string_value(t), json_real(e->top_logprobs[k]));
        json_decref(t);
    }
    return top;
}

json_t *lp_entry_json(const srv_req *r, const lp_entry *e, int part)
{
    if (r->cmpl->oreq.chat) return chat_json(r->s, e);
    switch (part) {
    case 1: return token_json(r->s, e->id);
    case 2: return e->has ? json_real(e->logprob) : json_null();
    case 3: return top_json(r, e);
    default: return json_integer((json_int_t)e->offset);
    }
}

void lp_add(srv_choice *c, int32_t id, const eng_event *ev, size_t offset)
{
    srv_req *r = c->req;
    cmpl_grow(r, cmpl_lp_bytes(ev != NULL ? ev->ntop : 0));
    if (r->cmpl->oreq.chat && ev == NULL) return; /* chat has no echo: every token has one */
    lp_entry e = {.id = id, .offset = offset, .has = ev != NULL};
    if (ev != NULL) {
        e.logprob = ev->logprob;
        e.ntop = r->cmpl->oreq.logprobs > 0 ? (int32_t)ev->ntop : 0;
        memcpy(e.top_ids, ev->top_ids, sizeof e.top_ids);
        memcpy(e.top_logprobs, ev->top_logprobs, sizeof e.top_logprobs);
    }
    if (!r->cmpl->oreq.stream) { /* a whole answer: numbers until it is written */
        if (c->lpe_n == c->lpe_cap) {
            size_t cap = c->lpe_cap ? 2 * c->lpe_cap : 16;
            lp_entry *p = realloc(c->lpe, cap * sizeof *p);
            if (p == NULL) {
                cmpl_fail_oom(r);
                return;
            }
            c->lpe = p;
            c->lpe_cap = cap;
        }
        c->lpe[c->lpe_n++] = e;
        return;
    }
    if (r->cmpl->oreq.chat) {
        json_array_append_new(json_object_get(c->lp, "content"), chat_json(r->s, &e));
        return;
    }
    static const char *const cols[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    for (int part = 1; part <= 4; part++)
        json_array_append_new(json_object_get(c->lp, cols[part - 1]), lp_entry_json(r, &e, part));
}
