/*
 * server/api/resp_prompt.c: the conversation of a POST /v1/responses
 * request (api.h: resp_build_conv: a stored history and the items its input
 * refers to, read on the loop thread) and its prompt (resp_prepare), made
 * where it is tokenized. The conversation is a stored history's nodes
 * (resp_store.c) and the input's messages; the prompt reads it from its
 * newest message back and only as far as the context can reach, so a
 * request naming a long history costs what its prompt can use, not what
 * the history holds.
 */
#include "api/api.h"

#include <stdlib.h>
#include <string.h>

static resp_job *job_of(const srv_req *r)
{
    return r->cmpl->shape_data;
}

/* The most tokens a prompt that fits can have: max_prompt_tokens, and the
 * context with max_output_tokens (without it, any room left: the reply is
 * cut to what fits). The limits are those fixed at routing (the job's
 * n_ctx, the tokenizer job's max_prompt_tokens): any thread. */
size_t resp_fit_limit(const srv_req *r)
{
    size_t n_ctx = job_of(r)->n_ctx, max = r->tok->max_prompt_tokens;
    const oai_request *q = &r->cmpl->oreq;
    size_t n = q->max_tokens_auto ? n_ctx - 1 : q->max_tokens < n_ctx ? n_ctx - q->max_tokens : 0;
    return n < max ? n : max;
}

/* What truncation "auto" cuts a prompt to: max_prompt_tokens, and room in
 * the context for max_output_tokens (without it, for chat_max_tokens or
 * half the context, whichever is less). Any thread, as resp_fit_limit. */
size_t resp_prompt_budget(const srv_req *r)
{
    size_t n_ctx = job_of(r)->n_ctx, max = r->tok->max_prompt_tokens;
    const oai_request *q = &r->cmpl->oreq;
    size_t out = q->max_tokens;
    if (q->max_tokens_auto && out > n_ctx / 2) out = n_ctx / 2;
    if (q->max_tokens_auto && out == 0) out = 1;
    size_t budget = out < n_ctx ? n_ctx - out : 0;
    return budget < max ? budget : max;
}

/* ---- The conversation, read from the store (loop thread) ----------------------- */

/* An input's item_reference (m->ref) made the item it names, a copy:
 * "msg_X" (or "fc_X", a call) is response resp_X's output, "msg_X_inK"
 * (or "fc_X_inK", "fco_X_inK": a call, an output) its input item K, of a
 * response stored for this key. The copies of one request add up to at
 * most max_body_bytes (*bytes so far), as a body's text does. 0; -1 with
 * the 404 or 400 sent (*rc). */
static int resolve_ref(srv_req *r, oai_msg *m, size_t i, size_t *bytes, enum MHD_Result *rc)
{
    char rid[64];
    static const char *const kinds[] = {"msg_", "fc_", "fco_"};
    const char *hex = NULL;
    for (size_t p = 0; hex == NULL && p < sizeof kinds / sizeof kinds[0]; p++)
        if (strncmp(m->ref, kinds[p], strlen(kinds[p])) == 0) hex = m->ref + strlen(kinds[p]);
    size_t hn = hex ? strcspn(hex, "_") : 0;
    unsigned long k = 0;
    int input = hex != NULL && strncmp(hex + hn, "_in", 3) == 0;
    if (input) {
        char *end;
        k = strtoul(hex + hn + 3, &end, 10);
        if (*end != '\0' || hex[hn + 3] == '\0') hex = NULL;
    } else if (hex != NULL && hex[hn] != '\0') {
        hex = NULL;
    }
    const rs_entry *e = NULL;
    if (hex != NULL && hn > 0 && hn + 6 < sizeof rid) {
        snprintf(rid, sizeof rid, "resp_%.*s", (int)hn, hex);
        e = rs_get(r->s->api->resp_store, rid, r->key_id);
    }
    const rs_turns *t = e ? e->turns : NULL;
    const rs_msg *src = t == NULL || t->n < e->nin + 1 ? NULL
                        : !input                       ? &t->msg[t->n - 1]
                        : k < e->nin                   ? &t->msg[t->n - 1 - e->nin + k]
                                                       : NULL;
    if (src == NULL) {
        *rc = http_send_error(r, 404, "invalid_request_error", "item_not_found", "input", NULL,
                              "'input[%zu]' refers to item '%.64s', which is not a message of a "
                              "response stored for this key (stored responses live in memory, "
                              "bounded, until a restart): send the message itself",
                              i, m->ref);
        return -1;
    }
    if (src->len > r->s->cfg.max_body_bytes - *bytes) {
        *rc = http_send_error(r, 400, "invalid_request_error", NULL, "input", NULL,
                              "'input[%zu]': the item references' messages come to more than "
                              "%zu bytes (max_body_bytes, as the body's own text); refer to "
                              "fewer, or use previous_response_id",
                              i, r->s->cfg.max_body_bytes);
        return -1;
    }
    *bytes += src->len;
    m->text = malloc(src->len + 1);
    if (m->text == NULL) {
        *rc = http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
        return -1;
    }
    memcpy(m->text, src->text, src->len + 1);
    m->len = src->len;
    m->role = src->role;
    m->kind = src->kind;
    m->name = src->name ? strdup(src->name) : NULL;
    m->call_id = src->call_id ? strdup(src->call_id) : NULL;
    if ((src->name && m->name == NULL) || (src->call_id && m->call_id == NULL)) {
        *rc = http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
        return -1;
    }
    free(m->ref);
    m->ref = NULL;
    return 0;
}

int resp_build_conv(srv_req *r, enum MHD_Result *rc)
{
    resp_job *j = job_of(r);
    if (j->rq.previous_id != NULL) {
        const rs_entry *prev = rs_get(r->s->api->resp_store, j->rq.previous_id, r->key_id);
        if (prev == NULL) {
            *rc = http_send_error(r, 404, "invalid_request_error", "previous_response_not_found",
                                  "previous_response_id", NULL,
                                  "Previous response with id '%.64s' not found (never made, "
                                  "made with another key, deleted, or no longer kept: stored "
                                  "responses live in memory, bounded, until a restart)",
                                  j->rq.previous_id);
            return -1;
        }
        j->prev = rs_turns_ref(prev->turns);
    }
    size_t bytes = 0;
    for (size_t i = 0; i < j->rq.nmsgs; i++)
        if (j->rq.msgs[i].ref != NULL && resolve_ref(r, &j->rq.msgs[i], i, &bytes, rc) != 0)
            return -1;
    j->in = j->rq.msgs; /* moved */
    j->nin = j->rq.nmsgs;
    j->rq.msgs = NULL;
    j->rq.nmsgs = 0;
    return 0;
}

/* ---- The prompt, made where it is tokenized --------------------------------
 *
 * The conversation is read from its newest message back, and only as far as
 * the context can reach: a request naming a long stored history costs what
 * its prompt can use, not what the history holds. Each message's tokens are
 * counted once (its template text alone, less the template's fixed part),
 * which says where to stop reading and, for truncation "auto", how many of
 * the oldest to leave out; the prompt is then rendered and tokenized whole,
 * and while it still does not fit one more goes. */

/* One message read, and its tokens alone. */
typedef struct {
    oai_msg m; /* its text is the request's or its stored node's */
    size_t count;
} conv_msg;

/* The conversation newest first: the input's messages, then the history's,
 * its newest node first. */
typedef struct {
    const resp_job *j;
    size_t k;          /* input messages left */
    const rs_turns *t; /* the node being read, */
    size_t i;          /* its messages left */
} conv_iter;

static int conv_next(conv_iter *it, oai_msg *m)
{
    if (it->k > 0) {
        const oai_msg *src = &it->j->in[--it->k];
        *m = (oai_msg){src->role, src->text, src->len, NULL, src->kind, src->name, src->call_id};
        return 1;
    }
    while (it->t != NULL && it->i == 0) {
        it->t = it->t->parent;
        it->i = it->t ? it->t->n : 0;
    }
    if (it->t == NULL) return 0;
    const rs_msg *src = &it->t->msg[--it->i]; /* read only: */
    *m = (oai_msg){src->role,         (char *)src->text,   src->len, NULL, src->kind,
                   (char *)src->name, (char *)src->call_id};
    return 1;
}

/* The tokens of msgs[0..n) rendered through t; past max, max + 1 (their
 * bytes when the tokenizer fails: an upper bound). */
static size_t count_tokens(const bpe *tok, const oai_template *t, const oai_msg *msgs, size_t n,
                           size_t max)
{
    char *txt, err[64];
    size_t len, nids = 0;
    int32_t *ids = NULL;
    if (oai_render(t, msgs, n, &txt, &len) != 0) return SIZE_MAX / 4;
    bpe_status st = bpe_encode_special_max(tok, txt, len, max, &ids, &nids, err, sizeof err);
    if (st == BPE_ETOOBIG)
        nids = max + 1;
    else if (st != BPE_OK)
        nids = len;
    free(ids);
    free(txt);
    return nids;
}

/* The messages every prompt begins with, into m: the tools' list and the
 * instructions (system messages), each where there is one; how many. */
static size_t fixed_msgs(const resp_job *j, oai_msg *m)
{
    size_t k = 0;
    if (j->rq.tools_text != NULL)
        m[k++] = (oai_msg){
            .role = OAI_ROLE_SYSTEM, .text = j->rq.tools_text, .len = j->rq.tools_text_len};
    if (j->rq.instructions != NULL)
        m[k++] = (oai_msg){
            .role = OAI_ROLE_SYSTEM, .text = j->rq.instructions, .len = j->rq.instructions_len};
    return k;
}

/* The prompt of the tools' list and the instructions, then kept[from..n)
 * (oldest first), into *txt; its tokens, at most max, into *ids / *nids.
 * The tokenizer's status (BPE_ENOMEM for no memory). */
static bpe_status render_encode(srv_req *r, const conv_msg *kept, size_t from, size_t n, size_t max,
                                char **txt, size_t *len, int32_t **ids, size_t *nids)
{
    resp_job *j = job_of(r);
    oai_msg *m = calloc(n - from + 2, sizeof *m);
    if (m == NULL) return BPE_ENOMEM;
    size_t k = fixed_msgs(j, m);
    for (size_t i = from; i < n; i++) m[k++] = kept[i].m;
    int rc = oai_render(&r->s->api->chat, m, k, txt, len);
    free(m); /* the texts are j's and the nodes' */
    if (rc != 0) return BPE_ENOMEM;
    /* A call it must make: the marker ends the prompt, the object is the reply. */
    const oai_template *tp = &r->s->api->chat;
    if (r->cmpl->oreq.tool_mode == OAI_TOOLS_REQUIRED) {
        size_t nl = strlen(tp->call_lead), nm = strlen(tp->call_prefix);
        char *t = realloc(*txt, *len + nl + nm + 1);
        if (t == NULL) {
            free(*txt);
            return BPE_ENOMEM;
        }
        memcpy(t + *len, tp->call_lead, nl);
        memcpy(t + *len + nl, tp->call_prefix, nm + 1);
        *txt = t;
        *len += nl + nm;
    }
    *ids = NULL;
    *nids = 0;
    bpe_status st = bpe_encode_special_max(r->s->api->tok, *txt, *len, max, ids, nids, r->tok->err,
                                           sizeof r->tok->err);
    if (st != BPE_OK) {
        free(*ids);
        free(*txt);
        *ids = NULL;
        *txt = NULL;
    }
    return st;
}

/* The prompt's text and tokens into the request and its tokenizer job
 * (taken). */
static void set_prompt(srv_req *r, char *txt, size_t len, int32_t *ids, size_t n)
{
    oai_prompt *p = &r->cmpl->oreq.prompts[0];
    free(p->text);
    p->text = txt;
    p->text_len = len;
    r->tok->text[0] = NULL; /* tokenized here: the tokenizer's loop skips it */
    r->tok->text_len[0] = 0;
    free(r->tok->prompt_ids[0]);
    r->tok->prompt_ids[0] = ids;
    r->tok->prompt_len[0] = n;
}

/* The tokenizer job's parser for /v1/responses (a tokenizer thread when the
 * request names a stored response, else inline): the prompt, fitted to the
 * context as truncation says; what did not fit is left in j (too_long,
 * over, tokens) for after_tokenize, a tokenizer failure in the job. 0. */
int resp_prepare(srv_req *r)
{
    resp_job *j = job_of(r);
    const bpe *tok = r->s->api->tok;
    const oai_template *t = &r->s->api->chat;
    size_t fit = j->fit, budget = j->budget;
    int truncate = j->rq.truncation_auto;
    /* Past fit and a margin for the counts' error at the messages' joins,
     * the whole can be known not to fit without rendering it. */
    size_t cutoff = fit + fit / 8 + 16;
    oai_msg fixed[2];
    size_t nfixed = fixed_msgs(j, fixed);
    size_t bare = count_tokens(tok, t, NULL, 0, SIZE_MAX); /* begin and generation */
    size_t total = count_tokens(tok, t, fixed, nfixed, SIZE_MAX);
    j->total = (j->prev ? j->prev->chain_msgs : 0) + j->nin;
    conv_msg *kept = NULL;
    size_t n = 0, cap = 0;
    int cut = 0;
    conv_iter it = {j, j->nin, j->prev, j->prev ? j->prev->n : 0};
    oai_msg m;
    while (conv_next(&it, &m)) {
        size_t c = count_tokens(tok, t, &m, 1, cutoff + bare);
        c = c > bare ? c - bare : 0;
        if (total + c > cutoff && (n > 0 || !truncate)) {
            cut = 1;
            break;
        }
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 16;
            conv_msg *g = realloc(kept, nc * sizeof *g);
            if (g == NULL) goto oom;
            kept = g;
            cap = nc;
        }
        kept[n++] = (conv_msg){m, c};
        total += c;
    }
    for (size_t a = 0, b = n; a + 1 < b; a++, b--) { /* oldest first */
        conv_msg x = kept[a];
        kept[a] = kept[b - 1];
        kept[b - 1] = x;
    }
    char *txt;
    size_t len, nids;
    int32_t *ids;
    bpe_status st;
    if (!cut) { /* the whole conversation, as it is */
        st = render_encode(r, kept, 0, n, r->tok->max_prompt_tokens, &txt, &len, &ids, &nids);
        if (st == BPE_OK && nids <= fit) {
            set_prompt(r, txt, len, ids, nids);
            goto done;
        }
        if (st == BPE_OK) {
            free(ids);
            free(txt);
        } else if (st != BPE_ETOOBIG) {
            goto failed;
        }
        j->over = st == BPE_ETOOBIG;
        j->tokens = st == BPE_ETOOBIG ? r->tok->max_prompt_tokens : nids;
    } else {
        j->over = 1;
        j->tokens = fit;
    }
    j->too_long = 1;
    if (!truncate || n == 0) goto done;
    /* truncation auto: the oldest go (never the instructions, never the
     * newest message) until the counts fit the budget, then one more while
     * the whole does not. */
    size_t drop = 0;
    while (drop + 1 < n && total > budget) total -= kept[drop++].count;
    for (; drop < n; drop++) {
        st = render_encode(r, kept, drop, n, budget, &txt, &len, &ids, &nids);
        if (st == BPE_OK && nids <= budget) {
            set_prompt(r, txt, len, ids, nids);
            j->too_long = 0;
            j->dropped = j->total - (n - drop);
            goto done;
        }
        if (st == BPE_OK) {
            free(ids);
            free(txt);
        } else if (st != BPE_ETOOBIG) {
            goto failed;
        }
    }
done:
    free(kept);
    return 0;
oom:
    st = BPE_ENOMEM;
failed:
    free(kept);
    r->tok->failed = 1;
    r->tok->status = st;
    if (st == BPE_ENOMEM) snprintf(r->tok->err, sizeof r->tok->err, "out of memory");
    return 0;
}
