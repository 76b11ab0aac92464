/*
 * server/api/logprobs.c: a choice's logprobs object, one entry per token, in
 * the shape of its request's API:
 *   completions: {tokens, token_logprobs, top_logprobs, text_offset}
 *   chat:        {content: [{token, logprob, bytes, top_logprobs: [...]}]}
 */
#include "api/api.h"

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
    const char *b = bpe_token_bytes(s->tok, id, &len);
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
    const char *b = bpe_token_bytes(s->tok, id, &len);
    json_t *a = json_array();
    for (size_t i = 0; b != NULL && i < len; i++)
        json_array_append_new(a, json_integer((unsigned char)b[i]));
    return a;
}

size_t lp_offset_feed(srv_choice *c, int32_t id)
{
    size_t before = c->off_chars, len;
    const char *b = bpe_token_bytes(c->req->s->tok, id, &len);
    if (b == NULL) return before;
    char out[UTF8_STREAM_MAX_OUT(256)];
    size_t n = utf8_stream_feed(&c->off_utf8, b, len > 256 ? 256 : len, out);
    for (size_t i = 0; i < n; i++) c->off_chars += ((unsigned char)out[i] & 0xC0) != 0x80;
    return before;
}

/* Chat: {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]},
 * the alternatives most likely first. */
static void chat_add(srv_choice *c, int32_t id, const eng_event *ev)
{
    srv *s = c->req->s;
    json_t *top = json_array();
    for (size_t k = 0; k < ev->ntop && c->req->cmpl->oreq.logprobs > 0; k++)
        json_array_append_new(
            top, json_pack("{s:o, s:f, s:o}", "token", token_json(s, ev->top_ids[k]), "logprob",
                           (double)ev->top_logprobs[k], "bytes", token_bytes(s, ev->top_ids[k])));
    json_array_append_new(json_object_get(c->lp, "content"),
                          json_pack("{s:o, s:f, s:o, s:o}", "token", token_json(s, id), "logprob",
                                    (double)ev->logprob, "bytes", token_bytes(s, id),
                                    "top_logprobs", top));
}

void lp_add(srv_choice *c, int32_t id, const eng_event *ev, size_t offset)
{
    srv *s = c->req->s;
    cmpl_grow(c->req, cmpl_lp_bytes(ev != NULL ? ev->ntop : 0));
    if (c->req->cmpl->oreq.chat) {
        if (ev != NULL) chat_add(c, id, ev); /* chat has no echo: every token has one */
        return;
    }
    json_array_append_new(json_object_get(c->lp, "tokens"), token_json(s, id));
    json_array_append_new(json_object_get(c->lp, "token_logprobs"),
                          ev ? json_real(ev->logprob) : json_null());
    json_t *top = json_null();
    if (ev != NULL && c->req->cmpl->oreq.logprobs > 0) {
        top = json_object();
        for (size_t k = 0; k < ev->ntop; k++) {
            json_t *t = token_json(s, ev->top_ids[k]);
            json_object_set_new(top, json_string_value(t), json_real(ev->top_logprobs[k]));
            json_decref(t);
        }
    }
    json_array_append_new(json_object_get(c->lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(c->lp, "text_offset"), json_integer((json_int_t)offset));
}
