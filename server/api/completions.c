/*
 * server/api/completions.c: POST /v1/completions and /v1/chat/completions (a
 * chat's messages become one text prompt through the chat template, and
 * its answer takes chat's shape in cmpl_respond.c) from the parsed body to
 * the engine and back: the limits, one engine request per prompt x candidate,
 * and the engine's events turned into each choice's text (UTF-8 stream
 * decoder, then the stop matcher). cmpl_respond.c builds the answer. The
 * completion policy over time is here too, in the hooks daemon.c registers:
 * each second (cmpl_tick) the queue's wait limit, the request's own
 * timeout, a stalled stream and a waiting stream's keep-alive comment;
 * after each step (cmpl_after_step) the streams' back-pressure; at the
 * drain's end (cmpl_cut_all) what still generates.
 *
 * States: BODY -> (TOKENIZING ->) QUEUED -> RUNNING -> FINISHED, or
 * BODY -> (TOKENIZING ->) STREAMING -> FINISHED; any -> ABORTED.
 */
#include "api/api.h"
#include "errbuf.h"

#include <stdlib.h>
#include <string.h>

/* The HTTP layer's http_cache_salt reads at most HTTP_MAX_CACHE_SALT bytes
 * of the cache_salt oai.c accepts. */
_Static_assert(OAI_MAX_CACHE_SALT == HTTP_MAX_CACHE_SALT, "cache_salt bounds disagree");

static int is_space(char ch)
{
    return ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r';
}

void cmpl_choice_text(srv_choice *c, const char *p, size_t n)
{
    /* chat: the reply starts at its first word, after the space the model
     * writes after "Assistant:" and any empty lines before it */
    while (c->trim && n > 0 && is_space(*p)) {
        p++;
        n--;
    }
    if (n == 0) return;
    c->trim = 0;
    cmpl_grow(c->req, n);
    if (http_append(&c->text, &c->text_len, &c->text_cap, p, n) != 0) cmpl_fail_oom(c->req);
}

/* Feeds decoded text through the stop matcher. */
static void choice_feed(srv_choice *c, const char *p, size_t n)
{
    if (c->stopped) return;
    if (c->stop == NULL) {
        cmpl_choice_text(c, p, n);
        return;
    }
    char out[SRV_MAX_STOP_BYTES + UTF8_STREAM_MAX_OUT(SRV_MAX_TOKEN_BYTES)];
    int stopped = 0;
    size_t w = stop_feed(c->stop, p, n, out, &stopped);
    if (w == (size_t)-1)
        cmpl_fail_oom(c->req);
    else
        cmpl_choice_text(c, out, w);
    if (stopped) {
        c->stopped = 1;
        eng_sched_cancel(c->req->cmpl->ckpt->sched, c->id); /* DONE follows */
    }
}

static void on_token(srv_choice *c, const eng_event *ev)
{
    srv_req *r = c->req;
    double t = log_now();
    if (r->t_first == 0) r->t_first = t;
    if (c->tokens == 0)
        met_observe(&r->s->api->met.ttft, t - r->t_start);
    else
        met_observe(&r->s->api->met.itl, t - c->t_last);
    c->t_last = t;
    c->tokens++;
    c->lp_sum += ev->logprob;
    c->lp_n++;
    int eot = ev->token == BPE_EOT && !r->cmpl->oreq.ignore_eos;
    if (c->lp != NULL) {
        /* text_offset counts characters from the prompt's start: only the
         * logprobs object reads it, so only a request that asked pays for
         * the prompt's and each token's decoding here. */
        while (c->prompt_fed < r->tok->prompt_len[c->prompt])
            lp_offset_feed(c, r->tok->prompt_ids[c->prompt][c->prompt_fed++]);
        size_t off = lp_offset_feed(c, ev->token);
        if (!c->stopped) lp_add(c, ev->token, ev, off);
    }
    size_t len;
    const char *b = eot ? NULL : bpe_token_bytes(r->s->api->tok, ev->token, &len);
    if (b != NULL) {
        char buf[UTF8_STREAM_MAX_OUT(SRV_MAX_TOKEN_BYTES)];
        if (len > SRV_MAX_TOKEN_BYTES) len = SRV_MAX_TOKEN_BYTES;
        size_t n = utf8_stream_feed(&c->utf8, b, len, buf);
        choice_feed(c, buf, n);
    }
}

static void on_done(srv_choice *c, const eng_event *ev, int stream)
{
    srv_req *r = c->req;
    c->cached = ev->cached;
    c->drafted = ev->drafted;
    c->accepted = ev->accepted;
    c->live = 0;
    r->cmpl->nlive--;
    if (!c->stopped) {
        char tail[4];
        size_t n = utf8_stream_flush(&c->utf8, tail);
        choice_feed(c, tail, n);
        if (c->stop != NULL && !c->stopped) {
            char out[SRV_MAX_STOP_BYTES];
            size_t k = stop_flush(c->stop, out), blank = 0;
            while (c->trim_tail && blank < k && is_space(out[blank])) blank++;
            /* chat: the "\n\n" held as the start of "\n\nUser:" when the
             * model ends its turn with <|endoftext|> is not part of the reply */
            if (blank < k || !c->trim_tail) cmpl_choice_text(c, out, k);
        }
    }
    if (ev->finish == ENG_FINISH_ERROR)
        cmpl_set_error(r, 500, NULL, "generation failed: %s",
                       ev->message ? ev->message : "unknown error");
    if (ev->embedding != NULL) {
        size_t C = eng_model_config(r->cmpl->ckpt->model)->n_embd;
        if ((c->embedding = malloc(C * sizeof *c->embedding)) == NULL)
            cmpl_fail_oom(r);
        else
            memcpy(c->embedding, ev->embedding, C * sizeof *c->embedding);
    }
    c->finish = c->stopped || ev->finish == ENG_FINISH_EOS ? "stop" : "length";
    c->done = 1;
    r->cmpl->ndone++;
    if (stream) {
        cmpl_chunk_flush(c);
        cmpl_sse_finish(r, c);
    }
    if (r->cmpl->ndone == r->cmpl->nchoices && r->cmpl->oreq.stream) cmpl_finish_stream(r);
}

static eng_status choice_submit(srv_req *r, size_t i, const eng_bias *bias,
                                const char *const *stops, uint64_t seed, uint64_t salt, char *err,
                                size_t errlen);

/* An embeddings request's next inputs into the engine, up to its window
 * (SRV_EMBED_WINDOW in flight), as earlier ones finish or at the tick; none
 * once it failed or its client left. A full wait queue leaves them for the
 * next chance (the tick's queue_timeout bounds the wait); another refusal
 * fails the request, the inputs in flight finishing first. */
static void embed_next(srv_req *r)
{
    cmpl_job *j = r->cmpl;
    while (j->submitted < j->nchoices && j->nlive < SRV_EMBED_WINDOW && j->error_status == 0
           && r->conn != NULL) {
        char err[256];
        size_t i = j->submitted;
        eng_status st = choice_submit(r, i, NULL, NULL, 0, j->salt, err, sizeof err);
        if (st == ENG_EFULL) return;
        if (st != ENG_OK) {
            cmpl_set_error(r, 500, NULL, "embedding input %zu not computed: %s", i, err);
            j->ndone += j->nchoices - i; /* never computed: the answer is the error */
            j->submitted = j->nchoices;
            return;
        }
        j->submitted++;
    }
}

void cmpl_on_event(void *user, const eng_event *ev)
{
    srv_choice *c = user;
    srv_req *r = c->req;
    int stream = r->cmpl->oreq.stream && r->conn != NULL;
    if (r->state == HTTP_REQ_QUEUED && ev->kind != ENG_EV_DONE)
        http_req_set_state(r, HTTP_REQ_RUNNING);
    if (ev->kind == ENG_EV_PROMPT_LOGPROB) {
        /* Prompt positions arrive in order; count the tokens before them. */
        while (c->prompt_fed < ev->index)
            lp_offset_feed(c, r->tok->prompt_ids[c->prompt][c->prompt_fed++]);
        size_t off = lp_offset_feed(c, ev->token);
        c->prompt_fed++;
        if (c->lp != NULL) lp_add(c, ev->token, ev, off);
        if (stream) cmpl_chunk_flush(c);
    } else if (ev->kind == ENG_EV_TOKEN) {
        on_token(c, ev);
        if (stream) cmpl_chunk_flush(c);
    } else if (ev->kind == ENG_EV_DONE) {
        on_done(c, ev, stream);
        if (r->cmpl->oreq.embed) {
            r->cmpl->t_progress = log_now();
            embed_next(r);
        }
    }
    if (r->conn != NULL
        && (r->state == HTTP_REQ_STREAMING || r->cmpl->ndone == r->cmpl->nchoices)) {
        /* A stream sends what came; a whole answer waits for the last DONE
         * (the continuation set at admission sends it). */
        http_resume(r);
    }
    if (stream && r->cmpl->ndone < r->cmpl->nchoices) cmpl_stream_bytes_check(r);
    if (ev->kind == ENG_EV_DONE) http_req_release(r); /* the sequence's reference */
}

int cmpl_parse(srv_req *r)
{
    srv *s = r->s;
    oai_error *e = &r->cmpl->parse_err;
    const char *body = r->body ? r->body : "";
    if ((r->cmpl->chat
             ? oai_parse_chat(body, r->body_len, &r->cmpl->lim, &s->api->chat, &r->cmpl->oreq, e)
             : oai_parse_completion(body, r->body_len, &r->cmpl->lim, &r->cmpl->oreq, e))
        != 0)
        return -1;
    oai_request *q = &r->cmpl->oreq;
    if (q->format != OAI_FORMAT_NONE) { /* compiled where the prompts are tokenized */
        r->tok->work = cmpl_compile_format;
        r->tok->heavy = 1;
    }
    return cmpl_job_prompts(r);
}

int cmpl_job_prompts(srv_req *r)
{
    oai_error *e = &r->cmpl->parse_err;
    oai_request *q = &r->cmpl->oreq;
    if (tok_job_prompts(r->tok, q->nprompts) != 0) goto oom;
    for (size_t i = 0; i < q->nprompts; i++) {
        const oai_prompt *p = &q->prompts[i];
        r->tok->text[i] = p->text; /* the tokenizer job's work */
        r->tok->text_len[i] = p->text_len;
        if (p->text == NULL) {
            r->tok->prompt_ids[i] = malloc((p->nids ? p->nids : 1) * sizeof(int32_t));
            if (r->tok->prompt_ids[i] == NULL) goto oom;
            memcpy(r->tok->prompt_ids[i], p->ids, p->nids * sizeof(int32_t));
            r->tok->prompt_len[i] = p->nids;
        }
    }
    cmpl_job_prediction(r);
    return 0;
oom:
    oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
}

/* What is checked once the body is parsed: the served model and whether the
 * request can ever be admitted. 1 when they hold, or 0 with the error
 * queued (*rc). */
static int parsed_ok(srv_req *r, enum MHD_Result *rc)
{
    srv *s = r->s;
    oai_request *q = &r->cmpl->oreq;
    if (r->cmpl->chat) { /* OpenAI's chat ids are chatcmpl-...; the id fits r->id with room */
        size_t n = strlen(r->id);
        assert(n + 4 < sizeof r->id);
        memmove(r->id + 4, r->id, n + 1);
        memcpy(r->id, "chat", 4);
    }
    if (!adp_pick(r, q->model, rc)) return 0;
    /* Every prompt x candidate is one engine request, and all of them enter
     * the wait queue together: more than it holds can never be admitted,
     * however idle the server (a 400, not a 429 a client would retry). The
     * scheduler reads max_queue 0 as 256. */
    const char *cand = q->best_of > q->n ? "best_of" : "n";
    size_t need = q->nprompts * q->best_of;
    if (need > s->cfg.max_sequences_per_request) {
        /* One request's share of the engine is bounded up front: past the
         * cap it would fill the queue before anyone else's (issue 24). */
        *rc = http_send_error(r, 400, "invalid_request_error", "too_many_sequences", cand, NULL,
                              "This request needs %zu sequences (%zu prompts in `prompt` x `%s` "
                              "%zu); the limit is %zu a request (max_sequences_per_request): "
                              "send fewer prompts or a smaller `%s`",
                              need, q->nprompts, cand, q->best_of, s->cfg.max_sequences_per_request,
                              cand);
        return 0;
    }
    size_t queue_cap = s->cfg.max_queue ? s->cfg.max_queue : 256;
    if (need > queue_cap) {
        *rc = http_send_error(r, 400, "invalid_request_error", NULL, cand, NULL,
                              "This request needs %zu sequences (%zu prompts x %s %zu); the "
                              "limit is %zu (max_queue), so it can never be admitted",
                              need, q->nprompts, cand, q->best_of, queue_cap);
        return 0;
    }
    return cmpl_speculation_ok(r, rc);
}

/* The continuation of a large body, parsed and tokenized on a tokenizer
 * thread. */
static enum MHD_Result after_worker_parse(srv_req *r)
{
    assert(r->state == HTTP_REQ_TOKENIZING);
    if (r->tok->parse_failed) return cmpl_send_oai_error(r, &r->cmpl->parse_err);
    enum MHD_Result rc;
    if (!parsed_ok(r, &rc)) return rc;
    return cmpl_admit(r);
}

enum MHD_Result cmpl_refuse_draining(srv_req *r)
{
    met_count_refused(&r->s->met, MET_REFUSED_DRAINING);
    return http_send_error(r, 503, "server_error", "server_draining", NULL, "5",
                           "The server is shutting down; retry on another replica");
}

/* Both routes: the body parsed by the route's parser (chat's with the
 * template), then the served model, the prompts' ids, and tokenizing; a
 * large body is parsed with its tokenizing, off the loop thread. */
static enum MHD_Result route(srv_req *r, int chat)
{
    assert(r->state == HTTP_REQ_BODY);
    srv *s = r->s;
    if (s->api->draining) return cmpl_refuse_draining(r);
    const eng_config *mc = eng_model_config(s->api->model);
    r->kind = R_COMPLETIONS;
    if (cmpl_job_new(r) == NULL)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    r->tok->max_prompt_tokens = s->cfg.max_prompt_tokens; /* a reload may change the config */
    r->cmpl->chat = chat;
    r->cmpl->lim = (oai_limits){.vocab_size = mc->n_vocab,
                                .max_tokens_limit = s->cfg.max_tokens_limit,
                                .max_n = s->cfg.max_n,
                                .max_stop_bytes = SRV_MAX_STOP_BYTES,
                                .max_prompts = 64,
                                .chat_max_tokens = s->cfg.chat_max_tokens};
    if (r->body_len >= SRV_TOKENIZE_INLINE_BYTES) /* parsed where it is tokenized */
        return tok_prompts(r, cmpl_parse, after_worker_parse);
    if (cmpl_parse(r) != 0) return cmpl_send_oai_error(r, &r->cmpl->parse_err);
    enum MHD_Result rc;
    if (!parsed_ok(r, &rc)) return rc;
    return tok_prompts(r, NULL, cmpl_admit);
}

enum MHD_Result cmpl_route(srv_req *r)
{
    return route(r, 0);
}

enum MHD_Result cmpl_route_chat(srv_req *r)
{
    if (!r->s->api->chat_on)
        return http_send_error(r, 400, "invalid_request_error", "chat_not_supported", NULL, NULL,
                               "This server has no chat template (chat_template = none): send "
                               "the text to continue to /v1/completions");
    return route(r, 1);
}

/* The prompts' limits: a 400 queued (*rc) and 0, or 1 when they hold. */
static int prompts_fit(srv_req *r, enum MHD_Result *rc)
{
    srv *s = r->s;
    const eng_config *mc = eng_model_config(r->cmpl->ckpt->model);
    oai_request *q = &r->cmpl->oreq;
    for (size_t i = 0; i < q->nprompts; i++) {
        if (r->tok->prompt_len[i] == 0) { /* "": the text starts, as with no prompt */
            free(r->tok->prompt_ids[i]);
            r->tok->prompt_ids[i] = malloc(sizeof(int32_t));
            if (r->tok->prompt_ids[i] == NULL) {
                *rc = http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
                return 0;
            }
            r->tok->prompt_ids[i][0] = BPE_EOT;
            r->tok->prompt_len[i] = 1;
        }
        if (r->tok->prompt_len[i] > s->cfg.max_prompt_tokens) {
            *rc = http_send_error(r, 400, "invalid_request_error", NULL, "prompt", NULL,
                                  "prompt %zu has %zu tokens; the limit is %zu", i,
                                  r->tok->prompt_len[i], s->cfg.max_prompt_tokens);
            return 0;
        }
        if (q->max_tokens_auto && r->tok->prompt_len[i] >= mc->n_ctx) {
            *rc = http_send_error(r, 400, "invalid_request_error", "context_length_exceeded",
                                  "messages", NULL,
                                  "The messages are %zu tokens in the chat template; this "
                                  "model's maximum context length is %zu tokens",
                                  r->tok->prompt_len[i], mc->n_ctx);
            return 0;
        }
        if (q->max_tokens_auto && q->max_tokens > mc->n_ctx - r->tok->prompt_len[i])
            q->max_tokens = mc->n_ctx - r->tok->prompt_len[i]; /* no max_tokens: what fits */
        if (r->tok->prompt_len[i] + q->max_tokens > mc->n_ctx) {
            *rc = http_send_error(r, 400, "invalid_request_error", "context_length_exceeded",
                                  q->max_completion ? "max_completion_tokens" : "max_tokens", NULL,
                                  "This model's maximum context length is %zu tokens, however you "
                                  "requested %zu tokens (%zu in your prompt; %zu for the "
                                  "completion). Please reduce your prompt; or completion length.",
                                  mc->n_ctx, r->tok->prompt_len[i] + q->max_tokens,
                                  r->tok->prompt_len[i], q->max_tokens);
            return 0;
        }
    }
    return 1;
}

/* The answer's predictable size against max_response_bytes: a 400 naming
 * the fields queued (*rc) and 0, or 1 when it fits. Predictable is what
 * every answer to it holds at least: each choice's echoed prompt (its
 * text, and with logprobs an entry per position with its top
 * alternatives) and one generated token, at the least bytes each (a lower
 * bound, so that nothing that fits is refused); what generation adds
 * beyond is counted as it comes (cmpl_grow). Checked sums: the factors
 * come from the client. */
static int answer_fits(srv_req *r, enum MHD_Result *rc)
{
    const oai_request *q = &r->cmpl->oreq;
    size_t per_pos = 1; /* a position's text: a byte at least */
    if (q->logprobs >= 0) per_pos += cmpl_lp_bytes((size_t)q->logprobs);
    size_t total = 0, limit = r->s->cfg.max_response_bytes;
    int over = 0;
    for (size_t i = 0; i < q->nprompts && !over; i++) {
        size_t pos = (q->echo ? r->tok->prompt_len[i] : 0) + 1, one, all;
        over = __builtin_mul_overflow(pos, per_pos, &one)
               || __builtin_add_overflow(one, (size_t)CMPL_CHOICE_BYTES, &one)
               || __builtin_mul_overflow(one, q->best_of, &all)
               || __builtin_add_overflow(total, all, &total) || total > limit;
    }
    if (!over) return 1;
    *rc = http_send_error(
        r, 400, "invalid_request_error", "response_too_large", q->echo ? "echo" : "logprobs", NULL,
        "The answer to this request would be over %zu bytes (max_response_bytes): %zu prompts "
        "(`prompt`) x %zu choices (`%s`)%s%s; ask for less: fewer or shorter prompts, a smaller "
        "`%s`, a smaller `logprobs`, or no `echo`",
        limit, q->nprompts, q->best_of, q->best_of > q->n ? "best_of" : "n",
        q->echo ? " x the echoed prompt's tokens (`echo`)" : "",
        q->logprobs >= 0 ? " x logprobs entries (`logprobs`)" : "",
        q->best_of > q->n ? "best_of" : "n");
    return 0;
}

/* Sets up choice i and submits its engine request. ENG_OK, or the engine's
 * status with err (ENG_ENOMEM: memory here). */
static eng_status choice_submit(srv_req *r, size_t i, const eng_bias *bias,
                                const char *const *stops, uint64_t seed, uint64_t salt, char *err,
                                size_t errlen)
{
    oai_request *q = &r->cmpl->oreq;
    srv_choice *c = &r->cmpl->choices[i];
    c->req = r;
    c->index = i;
    c->prompt = i / q->best_of;
    utf8_stream_init(&c->utf8);
    utf8_stream_init(&c->off_utf8);
    if (q->logprobs >= 0) {
        c->lp = lp_new(r);
        if (c->lp == NULL) return ENG_ENOMEM;
        if (q->echo) { /* the first prompt token has no logprob */
            lp_add(c, r->tok->prompt_ids[c->prompt][0], NULL,
                   lp_offset_feed(c, r->tok->prompt_ids[c->prompt][0]));
            c->prompt_fed = 1;
        }
    }
    if (q->nstop > 0 && (c->stop = stop_new(stops, q->stop_len, q->nstop)) == NULL)
        return ENG_ENOMEM;
    c->trim = c->trim_tail = q->chat && r->s->api->chat.trim_reply;
    eng_request er = {
        .prompt = r->tok->prompt_ids[c->prompt],
        .nprompt = r->tok->prompt_len[c->prompt],
        .max_tokens = q->max_tokens,
        .sampling = {.temperature = (float)q->temperature,
                     .top_k = q->top_k,
                     .top_p = (float)q->top_p,
                     .presence_penalty = (float)q->presence_penalty,
                     .frequency_penalty = (float)q->frequency_penalty,
                     .bias = bias,
                     .nbias = q->nbias},
        .seed = seed,
        .ignore_eos = q->ignore_eos,
        /* best_of ranks candidates by their tokens' mean logprob */
        .logprobs = q->logprobs >= 0    ? q->logprobs
                    : q->best_of > q->n ? 0
                                        : -1,
        .echo = q->echo && q->logprobs >= 0,
        .embed = q->embed,
        .cache_salt = salt,
        .adapter = r->cmpl->adapter,
        /* Fair admission: the request's tenant, and the request itself as
         * the group (unique while any of its sequences lives). */
        .tenant = r->tenant,
        .group = (uint64_t)(uintptr_t)r,
        .on_event = cmpl_on_event,
        .user = c,
    };
    cmpl_speculation(r, &er);
    if (r->cmpl->grammar != NULL
        && (q->tool_mode == OAI_TOOLS_AUTO ? tools_mask_new(r, r->cmpl->grammar, &er.mask)
                                           : cmpl_format_mask_new(r->s, r->cmpl->grammar, &er.mask))
               != 0)
        return ERRBUF_FAIL(err, errlen, ENG_ENOMEM, "out of memory");
    eng_status st = eng_sched_submit(r->cmpl->ckpt->sched, &er, &c->id, err, errlen);
    if (st != ENG_OK) {
        if (er.mask.ops != NULL) er.mask.ops->free(er.mask.self); /* still ours */
        return st;
    }
    c->live = 1;
    r->cmpl->nlive++;
    http_req_hold(r); /* released by its DONE event */
    return ENG_OK;
}

uint64_t cmpl_seed(srv_api *a, const oai_request *q)
{
    if (q->has_seed) return q->seed;
    /* The counter's bytes little-endian, so the message is the same on any
     * host; a key of its own, so that no seed is a hash another use of a
     * key shows clients (responses.c's ids hash a counter too). */
    unsigned char m[8];
    uint64_t n = a->seed_count++;
    for (int j = 0; j < 8; j++) m[j] = (unsigned char)(n >> (8 * j));
    return http_siphash(a->seed_key, m, sizeof m);
}

/* A refused submission: nothing half-admitted, the status table's answer. */
static enum MHD_Result refuse(srv_req *r, size_t submitted, eng_status st, const char *err)
{
    /* Cancel what this request already queued. */
    for (size_t k = 0; k < submitted; k++)
        eng_sched_cancel(r->cmpl->ckpt->sched, r->cmpl->choices[k].id);
    if (st == ENG_ENOMEM)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    if (st == ENG_EFULL) {
        char ra[16];
        http_retry_after(r->s, ra, sizeof ra);
        return http_send_error(r, 429, "rate_limit_exceeded", "rate_limit_exceeded", NULL, ra,
                               "The server is busy (%s); retry after %s s", err, ra);
    }
    return http_send_status(r, HTTP_SRC_ENG, (int)st, st == ENG_ETOOBIG ? "max_tokens" : NULL, err);
}

enum MHD_Result cmpl_admit(srv_req *r)
{
    assert(r->state == HTTP_REQ_BODY || r->state == HTTP_REQ_TOKENIZING);
    srv *s = r->s;
    oai_request *q = &r->cmpl->oreq;
    enum MHD_Result rc;
    if (r->tok->failed)
        return http_send_status(r, HTTP_SRC_BPE, (int)r->tok->status, "prompt", r->tok->err);
    if (r->cmpl->format_failed) {
        log_line("info", "%s: %s refused: %s", r->id, q->format_param, r->cmpl->format_err.message);
        return cmpl_send_oai_error(r, &r->cmpl->format_err);
    }
    if (s->api->cut) /* tokenized while the drain ended */
        return http_send_error(r, 503, "server_error", "server_shutting_down", NULL, "5",
                               "The server is shutting down; retry on another replica");
    if (!prompts_fit(r, &rc)) return rc;
    if (!answer_fits(r, &rc)) return rc;
    if (q->tool_mode != OAI_TOOLS_NONE && r->cmpl->shape == NULL && tools_begin(r) != 0)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    /* One engine request per prompt and candidate (best_of >= n of them). */
    /* The count only once the array exists: the usage and close hooks walk
     * choices[0 .. nchoices). */
    size_t nchoices = q->nprompts * q->best_of;
    r->cmpl->choices = calloc(nchoices, sizeof *r->cmpl->choices);
    if (r->cmpl->choices == NULL)
        return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
    r->cmpl->nchoices = nchoices;
    eng_bias *bias = NULL;
    if (q->nbias > 0) {
        bias = malloc(q->nbias * sizeof *bias);
        if (bias == NULL)
            return http_send_error(r, 500, "server_error", NULL, NULL, NULL, "out of memory");
        for (size_t i = 0; i < q->nbias; i++)
            bias[i] = (eng_bias){q->bias[i].token, q->bias[i].bias};
    }
    const char *stops[OAI_STOP_CAP];
    for (size_t i = 0; i < q->nstop; i++) stops[i] = q->stop[i];
    uint64_t base_seed = cmpl_seed(s->api, q);
    /* The prefix cache partition of every choice: the key's, and within it
     * the request's cache_salt (a keyed hash, once a request). */
    uint64_t salt =
        http_cache_salt(s->salt_secret, r->cache_tenant, q->cache_salt, q->cache_salt_len);
    /* An embeddings request: a window of its inputs now, the rest as
     * they finish (embed_next). */
    size_t first = q->embed && nchoices > SRV_EMBED_WINDOW ? SRV_EMBED_WINDOW : nchoices;
    r->cmpl->salt = salt;
    for (size_t i = 0; i < first; i++) {
        char err[256];
        eng_status st = choice_submit(r, i, bias, stops, base_seed + i, salt, err, sizeof err);
        if (st != ENG_OK) {
            free(bias);
            return refuse(r, i, st, err);
        }
    }
    r->cmpl->submitted = first;
    r->cmpl->t_progress = log_now();
    free(bias);
    cmpl_list_add(r);
    if (q->stream) { /* the backlog's bound, and what the stream may write in all */
        r->cmpl->sse.limit = s->cfg.stream_backlog_bytes;
        r->cmpl->sse.max_bytes = s->cfg.max_response_bytes;
    }
    if (q->stream && q->echo)
        for (size_t i = 0; i < r->cmpl->nchoices; i++) {
            srv_choice *c = &r->cmpl->choices[i];
            char *t, err[64];
            size_t tn;
            if (tok_ids_text(s->api->tok, r->tok->prompt_ids[c->prompt],
                             r->tok->prompt_len[c->prompt], &t, &tn, err, sizeof err)
                != BPE_OK) {
                cmpl_fail_oom(r); /* the ids were checked: only memory can fail */
                break;
            }
            cmpl_choice_text(c, t, tn);
            cmpl_chunk_flush(c);
            free(t);
        }
    if (q->stream && q->chat) cmpl_chat_open(r);
    if (q->stream) cmpl_stream_bytes_check(r);
    step_kick(s);
    if (q->stream) return cmpl_start_stream(r);
    http_req_set_state(r, HTTP_REQ_QUEUED);
    http_suspend(r, cmpl_send); /* on_event resumes it after the last DONE */
    return MHD_YES;
}

/* ---- Over time: the hooks ------------------------------------------------- */

void cmpl_tick(srv *s, double now)
{
    srv_req *next;
    for (srv_req *r = s->api->cmpl_list; r != NULL; r = next) {
        next = r->cmpl->next;
        cmpl_job *j = r->cmpl;
        if (r->conn != NULL && j->oreq.embed && j->nlive == 0 && j->submitted < j->nchoices) {
            /* Inputs the full wait queue turned away: again now, or, past
             * queue_timeout without progress, a 503. */
            embed_next(r);
            if (j->nlive == 0 && j->error_status == 0
                && now - j->t_progress > s->cfg.queue_timeout_s)
                cmpl_set_error(r, 503, NULL,
                               "The request waited %.0f s for room in the wait queue "
                               "(queue_timeout); retry later",
                               now - j->t_progress);
            if (j->error_status != 0 && j->nlive == 0) {
                j->ndone = j->nchoices;
                http_resume(r); /* its answer is the error */
            }
            continue;
        }
        if (r->conn == NULL || r->cmpl->nlive == 0) continue;
        /* An embeddings request's inputs enter a window at a time: its age
         * in the queue counts from its last progress. */
        double age = now - (j->oreq.embed ? j->t_progress : r->t_start);
        int waiting = 0;
        for (size_t i = 0; i < r->cmpl->nchoices; i++)
            if (r->cmpl->choices[i].live
                && eng_sched_waiting(r->cmpl->ckpt->sched, r->cmpl->choices[i].id))
                waiting = 1;
        if (waiting && age > s->cfg.queue_timeout_s) {
            /* Waited too long for admission: 503, which clients retry. */
            cmpl_set_error(r, 503, NULL,
                           "The request waited %.0f s for a free slot (queue_timeout); retry later",
                           age);
            /* the connection holds r through the DONE events */
            cmpl_cancel_for(r, MET_CANCEL_QUEUE_TIMEOUT);
            continue;
        }
        if (cmpl_stall_check(r, now)) continue;
        if (r->cmpl->oreq.timeout_s > 0 && age > r->cmpl->oreq.timeout_s) {
            /* The request's own deadline ends generation like max_tokens. */
            cmpl_cancel_for(r, MET_CANCEL_TIMEOUT);
            continue;
        }
        if (!r->cmpl->oreq.stream && r->suspended && r->cmpl->error_status == 0
            && http_peer_closed(r)) {
            /* A whole answer waits suspended, and libmicrohttpd does not
             * watch a suspended connection: its client's close is looked
             * for here, once a tick, or it would generate for nobody. */
            log_line("info", "%s: the client closed its connection while waiting; cancelled",
                     r->id);
            /* 499: nginx's "client closed request", for the access log */
            cmpl_set_error(r, 499, "client_closed",
                           "The client closed its connection; the request was cancelled");
            cmpl_cancel_for(r, MET_CANCEL_CLIENT_CLOSED);
            continue;
        }
        if (r->cmpl->oreq.stream && cmpl_completion_tokens(r) == 0) {
            /* Still waiting: an SSE comment, which clients ignore, keeps
             * proxies from timing out and lets a disconnect be noticed. */
            sse_comment(&r->cmpl->sse, "waiting");
            http_resume(r);
        }
    }
    tok_tick(s, now);
}

void cmpl_after_step(srv *s)
{
    for (srv_req *r = s->api->cmpl_list; r != NULL; r = r->cmpl->next) cmpl_backlog(r);
}

size_t cmpl_cut_all(srv *s, const char *why)
{
    size_t n = 0;
    srv_req *next;
    for (srv_req *r = s->api->cmpl_list; r != NULL; r = next) {
        next = r->cmpl->next;
        if (r->conn == NULL || r->cmpl->nlive == 0) continue;
        /* Its DONE events (now, or when the step in flight is back) end the
         * answer: a stream's final events, or the continuation's 503. The
         * connection holds r through them. */
        r->cut = 1;
        cmpl_set_error(r, 503, "server_shutting_down",
                       "The server is shutting down (%s); the request was cut short; retry on "
                       "another replica",
                       why);
        /* A stream held back for its slow client would not be read to its
         * end within the cut's grace: only the rest of the event it is in
         * stays before its ending. */
        if (r->cmpl->oreq.stream && r->cmpl->paused) sse_cut(&r->cmpl->sse);
        cmpl_cancel_for(r, MET_CANCEL_SHUTDOWN);
        n++;
    }
    return n;
}
