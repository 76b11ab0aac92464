/*
 * tests/test_spec.c: speculative decoding changes no event. Every request
 * is run twice: plainly (speculative_tokens 0), all at once, and with
 * speculation (prompt lookup, or a prediction that is the plain output,
 * a perturbed copy of it, a cut copy or noise), in batches of random sizes
 * beside each other and beside plain ones; every event (token, logprob,
 * alternatives, index, finish, the DONE's count) must be the same bits.
 * The requests vary everything the sampler reads: temperature, top-k,
 * top-p, penalties, logit bias (end of text too), logprobs, max_tokens
 * from 1, ignore_eos, a token mask that allows a subset, gets stuck or
 * fails, cancellation from the callback (a stop string), the prefix cache;
 * in F32, F16, BF16 and Q8 weights.
 */
#include "engine.h"
#include "tools.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "testutil.h"

#define V 50257 /* GPT-2's vocabulary, so that end of text exists */
#define EOT 50256
#define MAXTOK 48

static char dir[256];

static void setup(void)
{
    mkdtemp_template(dir, sizeof dir, "/tmp/gpt2d-test-spec-");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char out[320];
    snprintf(out, sizeof out, "%s/model.safetensors", dir);
    char *argv[] = {"synth",   out, "--layers", "2",   "--embd", "64",
                    "--heads", "4", "--ctx",    "256", "--seed", "5"};
    ck_assert_int_eq(tool_synth(12, argv), 0);
    /* A draft: one layer, another seed, the same vocabulary. */
    char draft[320], dout[400];
    snprintf(draft, sizeof draft, "%s/draft", dir);
    mkdir(draft, 0755);
    snprintf(dout, sizeof dout, "%s/model.safetensors", draft);
    char *dv[] = {"synth",   dout, "--layers", "1",   "--embd", "32",
                  "--heads", "2",  "--ctx",    "256", "--seed", "6"};
    ck_assert_int_eq(tool_synth(12, dv), 0);
    static const char *dtypes[] = {"f16", "bf16", "q8"};
    for (size_t i = 0; i < 3; i++) {
        char sub[320], to[400];
        snprintf(sub, sizeof sub, "%s/%s", dir, dtypes[i]);
        mkdir(sub, 0755);
        snprintf(to, sizeof to, "%s/model.safetensors", sub);
        char *cv[] = {"convert", out, to, "--dtype", (char *)dtypes[i]};
        ck_assert_int_eq(tool_convert(5, cv), 0);
    }
}

static void teardown(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static eng_model *load(const char *dtype)
{
    char sub[320], err[512];
    if (dtype == NULL)
        snprintf(sub, sizeof sub, "%s", dir);
    else
        snprintf(sub, sizeof sub, "%s/%s", dir, dtype);
    eng_model *m;
    ck_assert_msg(eng_model_load(sub, &m, err, sizeof err) == ENG_OK, "%s", err);
    return m;
}

/* ---- A mask: tokens t with t % 5 == rem (and end of text), stuck or
 * failing after some tokens ---- */

typedef struct {
    uint64_t bits[(V + 63) / 64];
    int rem;
    size_t naccepted, stuck_after, fail_after;
} tmask;

static const uint64_t *tm_allowed(void *self, size_t *nallowed)
{
    tmask *m = self;
    *nallowed = 0;
    if (m->fail_after && m->naccepted >= m->fail_after) return NULL;
    memset(m->bits, 0, sizeof m->bits);
    if (m->stuck_after && m->naccepted >= m->stuck_after) return m->bits;
    for (int32_t t = 0; t < V; t++)
        if (t % 5 == m->rem || t == EOT) {
            m->bits[t / 64] |= 1ull << (t % 64);
            ++*nallowed;
        }
    return m->bits;
}

static int tm_accept(void *self, int32_t token)
{
    tmask *m = self;
    if (token % 5 != m->rem && token != EOT) return -1;
    m->naccepted++;
    return 0;
}

static int tm_accepting(const void *self)
{
    (void)self;
    return 1;
}

static const char *tm_error(const void *self)
{
    const tmask *m = self;
    return m->fail_after && m->naccepted >= m->fail_after ? "the test mask failed" : NULL;
}

static void tm_free(void *self)
{
    free(self);
}

static const eng_mask_ops tm_ops = {.allowed = tm_allowed,
                                    .accept = tm_accept,
                                    .accepting = tm_accepting,
                                    .error = tm_error,
                                    .free = tm_free};

/* ---- Requests and what they received ---- */

typedef struct {
    int32_t token;
    size_t index, ntop;
    float logprob;
    int32_t top_ids[ENG_MAX_TOP];
    float top_lp[ENG_MAX_TOP];
} tok_ev;

typedef struct {
    /* the request */
    int32_t prompt[64];
    size_t nprompt, max_tokens;
    eng_sampling sp;
    eng_bias bias[2];
    uint64_t seed;
    int ignore_eos, logprobs, masked, mask_rem;
    size_t stuck_after, fail_after, cancel_after;
    /* what came back */
    uint64_t id;
    eng_sched *s;
    tok_ev ev[MAXTOK];
    size_t n, dones, done_index;
    eng_finish finish;
    const char *message;
    size_t drafted, accepted;
} req;

static void on_event(void *user, const eng_event *e)
{
    req *r = user;
    ck_assert_uint_eq(r->dones, 0);
    ck_assert(e->id == r->id);
    if (e->kind == ENG_EV_TOKEN) {
        ck_assert_uint_lt(r->n, MAXTOK);
        tok_ev *t = &r->ev[r->n++];
        t->token = e->token;
        t->index = e->index;
        t->ntop = e->ntop;
        t->logprob = e->logprob;
        memcpy(t->top_ids, e->top_ids, sizeof t->top_ids);
        memcpy(t->top_lp, e->top_logprobs, sizeof t->top_lp);
        if (r->cancel_after && r->n == r->cancel_after) eng_sched_cancel(r->s, r->id);
    } else if (e->kind == ENG_EV_DONE) {
        r->dones++;
        r->done_index = e->index;
        r->finish = e->finish;
        r->message = e->message;
        r->drafted = e->drafted;
        r->accepted = e->accepted;
    }
}

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static size_t rnd_n(size_t n)
{
    return (size_t)(rnd() % n);
}

/* A random request: the prompts share beginnings (the prefix cache), some
 * repeat themselves (prompt lookup finds something), the model's own
 * loops do the rest. */
static void make_req(req *r, size_t i)
{
    memset(r, 0, sizeof *r);
    r->nprompt = 3 + rnd_n(40);
    unsigned family = (unsigned)rnd_n(4);
    for (size_t k = 0; k < r->nprompt; k++)
        if (k < 20)
            r->prompt[k] = (int32_t)((family * 977 + k * 131) % 50000);
        else
            r->prompt[k] = r->prompt[k % 7 + 5]; /* a repeat */
    r->prompt[r->nprompt - 1] = (int32_t)rnd_n(50000);
    r->max_tokens = 1 + rnd_n(MAXTOK - 1);
    static const float temps[] = {0.0f, 0.0f, 0.6f, 1.0f, 1.7f};
    r->sp.temperature = temps[rnd_n(5)];
    r->sp.top_k = rnd_n(3) == 0 ? 0 : (int)(1 + rnd_n(60));
    r->sp.top_p = rnd_n(3) == 0 ? 1.0f : 0.5f + (float)rnd_n(50) / 100.0f;
    if (rnd_n(3) == 0) r->sp.presence_penalty = (float)rnd_n(41) / 10.0f - 2.0f;
    if (rnd_n(3) == 0) r->sp.frequency_penalty = (float)rnd_n(41) / 10.0f - 2.0f;
    size_t nb = rnd_n(3);
    for (size_t b = 0; b < nb; b++)
        r->bias[b] = (eng_bias){.token = b == 0 && rnd_n(4) == 0 ? EOT : (int32_t)(rnd() % V),
                                .bias = (float)rnd_n(21) - 10.0f};
    r->sp.bias = nb ? r->bias : NULL;
    r->sp.nbias = nb;
    r->seed = 1000 + i;
    r->ignore_eos = (int)rnd_n(2);
    r->logprobs = (int)rnd_n(7) - 1;
    r->masked = rnd_n(5) == 0;
    r->mask_rem = (int)rnd_n(5);
    if (r->masked && rnd_n(3) == 0) r->stuck_after = 1 + rnd_n(12);
    if (r->masked && rnd_n(3) == 0) r->fail_after = 1 + rnd_n(12);
    if (rnd_n(6) == 0) r->cancel_after = 1 + rnd_n(10);
}

/* Submits r (its outcome cleared) with speculation k from the drafter
 * (and prediction, when npred > 0). */
static void submit(eng_sched *s, req *r, size_t k, eng_drafter by, const int32_t *pred,
                   size_t npred)
{
    r->n = r->dones = 0;
    r->s = s;
    eng_request q = {.prompt = r->prompt,
                     .nprompt = r->nprompt,
                     .max_tokens = r->max_tokens,
                     .sampling = r->sp,
                     .seed = r->seed,
                     .ignore_eos = r->ignore_eos,
                     .logprobs = r->logprobs,
                     .speculative_tokens = k,
                     .drafter = by,
                     .prediction = pred,
                     .nprediction = npred,
                     .on_event = on_event,
                     .user = r};
    if (r->masked) {
        tmask *m = calloc(1, sizeof *m);
        m->rem = r->mask_rem;
        m->stuck_after = r->stuck_after;
        m->fail_after = r->fail_after;
        q.mask = (eng_mask){.ops = &tm_ops, .self = m, .n_vocab = V};
    }
    char err[256];
    ck_assert_msg(eng_sched_submit(s, &q, &r->id, err, sizeof err) == ENG_OK, "%s", err);
}

static const eng_model *draft_model; /* for make_sched: NULL, none */
static size_t draft_kv_bytes;

static eng_sched *make_sched(eng_model *m, int prefix_cache, size_t spec_max_batch)
{
    eng_sched_opts o = {.kv_bytes = 4u << 20,
                        .block_len = 16,
                        .max_running = 16,
                        .max_queue = 256,
                        .step_tokens = 64,
                        .threads = 2,
                        .prefix_cache = prefix_cache,
                        .spec_max_batch = spec_max_batch,
                        .draft = draft_model,
                        .draft_kv_bytes = draft_kv_bytes};
    eng_sched *s;
    char err[256];
    ck_assert_msg(eng_sched_new(m, &o, &s, err, sizeof err) == ENG_OK, "%s", err);
    return s;
}

static void run(eng_sched *s)
{
    while (eng_sched_step(s)) {
    }
    eng_sched_stats st;
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.running, 0);
    ck_assert_uint_eq(st.queued, 0);
}

static void assert_same(const req *a, const req *b, size_t i)
{
    ck_assert_msg(a->n == b->n, "request %zu: %zu tokens, %zu plainly", i, b->n, a->n);
    ck_assert_uint_eq(a->dones, 1);
    ck_assert_uint_eq(b->dones, 1);
    ck_assert_int_eq(a->finish, b->finish);
    ck_assert_uint_eq(a->done_index, b->done_index);
    ck_assert((a->message == NULL) == (b->message == NULL));
    for (size_t k = 0; k < a->n; k++)
        ck_assert_msg(memcmp(&a->ev[k], &b->ev[k], sizeof a->ev[k]) == 0,
                      "request %zu token %zu: %d plainly, %d speculated", i, k, a->ev[k].token,
                      b->ev[k].token);
}

/* The drafts a request gets: 0 lookup, 1 the plain output, 2 it with
 * every fourth token changed, 3 its first half, 4 noise, 5 the plain
 * output after a wrong start. */
static size_t make_pred(const req *plain, int kind, int32_t *out)
{
    size_t n = 0;
    if (kind == 5) out[n++] = 7;
    for (size_t k = 0; k < plain->n; k++) out[n++] = plain->ev[k].token;
    if (kind == 2)
        for (size_t k = 3; k < n; k += 4) out[k] = (out[k] + 1) % V;
    if (kind == 3) n /= 2;
    if (kind == 4)
        for (size_t k = 0; k < n; k++) out[k] = (int32_t)rnd_n(V);
    return n;
}

#define NREQ 240

static void same_events_in(const char *dtype, int prefix_cache, size_t spec_max_batch)
{
    eng_model *m = load(dtype);
    eng_drafter by = draft_model != NULL ? ENG_DRAFT_MODEL : ENG_DRAFT_LOOKUP;
    static req plain[NREQ], spec[NREQ];
    static int32_t pred[NREQ][MAXTOK + 1];
    for (size_t i = 0; i < NREQ; i++) make_req(&plain[i], i);
    /* Plainly, all at once. */
    eng_sched *s = make_sched(m, prefix_cache, spec_max_batch);
    for (size_t i = 0; i < NREQ; i++) submit(s, &plain[i], 0, ENG_DRAFT_LOOKUP, NULL, 0);
    run(s);
    eng_sched_free(s);
    /* Speculated, in batches of 1 to 12 (every fifth one plain). */
    s = make_sched(m, prefix_cache, spec_max_batch);
    for (size_t i = 0; i < NREQ;) {
        size_t batch = 1 + rnd_n(12);
        for (size_t j = 0; j < batch && i < NREQ; j++, i++) {
            spec[i] = plain[i];
            int kind = (int)rnd_n(6);
            size_t np = kind == 0 ? 0 : make_pred(&plain[i], kind, pred[i]);
            size_t k = i % 5 == 4 ? 0 : 1 + rnd_n(ENG_SPEC_MAX);
            submit(s, &spec[i], k, by, np ? pred[i] : NULL, np);
        }
        run(s);
    }
    eng_sched_stats st;
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.kv_blocks_used, prefix_cache ? st.kv_blocks_used : 0);
    uint64_t drafted = 0, accepted = 0;
    for (size_t i = 0; i < NREQ; i++) {
        assert_same(&plain[i], &spec[i], i);
        ck_assert_uint_le(spec[i].accepted, spec[i].drafted);
        drafted += spec[i].drafted;
        accepted += spec[i].accepted;
    }
    /* Something was drafted and verified, by both drafters, and the
     * statistics count what the requests were told. */
    ck_assert_uint_gt(st.spec_drafted[ENG_DRAFT_PREDICTION], 0);
    ck_assert_uint_gt(st.spec_accepted[ENG_DRAFT_PREDICTION], 0);
    ck_assert_uint_gt(st.spec_drafted[by], 0);
    uint64_t sd = 0, sa = 0;
    for (int d = 0; d < ENG_DRAFTERS; d++) {
        sd += st.spec_drafted[d];
        sa += st.spec_accepted[d];
        uint64_t at = 0;
        for (int j = 0; j < ENG_SPEC_MAX; j++) at += st.spec_accepted_at[d][j];
        ck_assert_uint_eq(at, st.spec_accepted[d]);
        for (int j = 1; j < ENG_SPEC_MAX; j++)
            ck_assert_uint_le(st.spec_accepted_at[d][j], st.spec_accepted_at[d][j - 1]);
    }
    /* Cancelled requests' last step is not told (their DONE is sent
     * before the step settles), so at least what the requests saw. */
    ck_assert_uint_ge(sd, drafted);
    ck_assert_uint_ge(sa, accepted);
    eng_sched_free(s);
    eng_model_free(m);
}

static const char *formats[] = {NULL, "f16", "bf16", "q8"};

/* Every format, with the prefix cache; and F32 without it and with
 * speculation in every step whatever the batch. */
START_TEST(spec_same_events_as_plain_decoding)
{
    same_events_in(formats[_i], 1, 4);
    if (_i == 0) {
        same_events_in(NULL, 0, 4);
        same_events_in(NULL, 1, 64);
    }
}
END_TEST

/* What the scheduler's policy (sched_spec.c) makes of drafts that are
 * the model's own greedy tokens (top[i], the first alternative of token
 * i's logprobs), for output tok[0..n): the tokens drafted and accepted. */
static void simulate_self_draft(const req *r, size_t K, size_t *drafted, size_t *accepted)
{
    size_t n = r->n, g = 1, skip = 0, k_now = K;
    unsigned miss = 0;
    *drafted = *accepted = 0;
    while (g < n) {
        if (skip > 0) {
            skip--;
            g++;
            continue;
        }
        size_t left = n - g, d = k_now < left - 1 ? k_now : left - 1, a = 0;
        if (left <= 1 || d == 0) {
            g++;
            continue;
        }
        while (a < d && r->ev[g + a].token == r->ev[g + a].top_ids[0]) a++;
        *drafted += d;
        *accepted += a;
        g += a + 1;
        k_now = a == d ? (k_now < K ? k_now + 1 : K) : a + 1;
        if (a == 0) {
            if (miss < 4) miss++;
            skip = (size_t)1 << miss;
            if (skip > 16) skip = 16;
        } else {
            miss = 0;
        }
    }
}

/* The draft model: a smaller one (its guesses mostly wrong), and one whose
 * pool holds a single sequence (the others decode plainly); then the
 * model as its own draft. Its drafts are the model's greedy tokens, so
 * which are accepted follows from the plain output (the sampled token
 * against the first alternative) and the policy: the counts equal the
 * simulation's only if the draft's cache holds exactly the sequence's
 * tokens after every rollback (greedy: all accepted; sampled: some
 * refused, then rolled back). */
START_TEST(spec_draft_model_same_events)
{
    draft_model = load("draft");
    same_events_in(NULL, 1, 4);
    same_events_in("bf16", 0, 64);
    draft_kv_bytes = 1; /* raised to one sequence's worth */
    same_events_in(NULL, 1, 64);
    draft_kv_bytes = 0;
    eng_model_free((eng_model *)draft_model);
    eng_model *m = load(NULL);
    draft_model = m;
    eng_sched *s = make_sched(m, 1, 8);
    static req plain[8], self[8];
    for (size_t i = 0; i < 8; i++) {
        make_req(&plain[i], 500 + i);
        plain[i].masked = 0;
        plain[i].cancel_after = 0;
        plain[i].ignore_eos = 1;
        plain[i].logprobs = 1;
        plain[i].sp = (eng_sampling){.temperature = i < 4 ? 0.0f : 0.7f, .top_p = 1};
        plain[i].max_tokens = 40;
        submit(s, &plain[i], 0, ENG_DRAFT_LOOKUP, NULL, 0);
    }
    run(s);
    size_t refused = 0;
    for (size_t i = 0; i < 8; i++) {
        self[i] = plain[i];
        submit(s, &self[i], 2 + i % 7, ENG_DRAFT_MODEL, NULL, 0);
    }
    run(s);
    for (size_t i = 0; i < 8; i++) {
        assert_same(&plain[i], &self[i], i);
        size_t drafted, accepted;
        simulate_self_draft(&plain[i], 2 + i % 7, &drafted, &accepted);
        ck_assert_uint_gt(self[i].drafted, 0);
        ck_assert_uint_eq(self[i].drafted, drafted);
        ck_assert_uint_eq(self[i].accepted, accepted);
        if (i < 4) ck_assert_uint_eq(self[i].accepted, self[i].drafted);
        refused += self[i].drafted - self[i].accepted;
    }
    ck_assert_uint_gt(refused, 0); /* the rollback was exercised */
    eng_sched_free(s);
    eng_model_free(m);
    draft_model = NULL;
}
END_TEST

/* A draft whose vocabulary or context differs is refused, naming why. */
START_TEST(spec_draft_model_must_match)
{
    eng_model *m = load(NULL);
    char sub[320], out[400], err[256];
    snprintf(sub, sizeof sub, "%s/small-vocab", dir);
    mkdir(sub, 0755);
    snprintf(out, sizeof out, "%s/model.safetensors", sub);
    char *a[] = {"synth", out,     "--layers", "1",       "--embd", "32",     "--heads",
                 "2",     "--ctx", "256",      "--vocab", "600",    "--seed", "1"};
    ck_assert_int_eq(tool_synth(14, a), 0);
    eng_model *d = load("small-vocab");
    eng_sched_opts o = {.kv_bytes = 4u << 20, .draft = d};
    eng_sched *s;
    ck_assert_int_eq(eng_sched_new(m, &o, &s, err, sizeof err), ENG_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "vocabulary"));
    eng_model_free(d);
    snprintf(sub, sizeof sub, "%s/short", dir);
    mkdir(sub, 0755);
    snprintf(out, sizeof out, "%s/model.safetensors", sub);
    char *b[] = {"synth",   out, "--layers", "1",   "--embd", "32",
                 "--heads", "2", "--ctx",    "128", "--seed", "1"};
    ck_assert_int_eq(tool_synth(12, b), 0);
    d = load("short");
    o.draft = d;
    ck_assert_int_eq(eng_sched_new(m, &o, &s, err, sizeof err), ENG_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "context"));
    eng_model_free(d);
    eng_model_free(m);
}
END_TEST

/* A prediction that is the output: each verify step keeps every drafted
 * token and one of its own, so k = 4 takes a fifth of the steps. A
 * prediction that always proposes a wrong token next (the output with a
 * wrong token after each of its own: it realigns after every token and
 * misses again) costs a few verify steps, each of them backing off
 * further. */
START_TEST(spec_right_drafts_save_steps_wrong_ones_back_off)
{
    eng_model *m = load(NULL);
    static req plain, right, wrong;
    make_req(&plain, 0);
    plain.max_tokens = 41;
    plain.masked = 0;
    plain.cancel_after = 0;
    plain.ignore_eos = 1;
    plain.logprobs = 2;
    plain.sp = (eng_sampling){.temperature = 1.0f, .top_p = 1.0f};
    eng_sched *s = make_sched(m, 0, 4);
    submit(s, &plain, 0, ENG_DRAFT_LOOKUP, NULL, 0);
    run(s);
    ck_assert_uint_eq(plain.n, 41);
    int32_t pred[64], every_other[128], x = 0;
    size_t np = make_pred(&plain, 1, pred);
    /* x is none of the output's tokens: after token i the prediction
     * realigns just past its copy of it (the first occurrence from where
     * it stands is that one) and proposes x. */
    for (int found = 1; found; x++) {
        found = 0;
        for (size_t a = 0; a < np; a++) found |= pred[a] == x;
        if (!found) break;
    }
    for (size_t k = 0; k < np; k++) {
        every_other[2 * k] = pred[k];
        every_other[2 * k + 1] = x;
    }
    eng_sched_stats st0, st1, st2;
    eng_sched_stats_get(s, &st0);
    right = plain;
    submit(s, &right, 4, ENG_DRAFT_PREDICTION, pred, np);
    run(s);
    eng_sched_stats_get(s, &st1);
    assert_same(&plain, &right, 0);
    /* 1 prefill step (the first token), then 40 tokens in steps of 5. */
    ck_assert_uint_eq(st1.steps - st0.steps, 1 + 8);
    ck_assert_uint_eq(right.drafted, 32);
    ck_assert_uint_eq(right.accepted, 32);
    ck_assert_uint_eq(st1.spec_accepted_at[ENG_DRAFT_PREDICTION][3], 8);
    wrong = plain;
    submit(s, &wrong, 4, ENG_DRAFT_PREDICTION, every_other, 2 * np);
    run(s);
    eng_sched_stats_get(s, &st2);
    assert_same(&plain, &wrong, 0);
    ck_assert_uint_eq(wrong.accepted, 0);
    /* Verify steps at tokens 1, 4, 9, 18 and 35 (backing off 2, 4, 8, 16
     * steps): 4 + 1 + 1 + 1 + 1 drafted, one token a step throughout. */
    ck_assert_uint_eq(wrong.drafted, 8);
    ck_assert_uint_eq(st2.steps - st1.steps, 41);
    eng_sched_free(s);
    eng_model_free(m);
}
END_TEST

/* Bad speculation parameters are refused before anything runs. */
START_TEST(spec_bad_parameters_are_refused)
{
    eng_model *m = load(NULL);
    eng_sched *s = make_sched(m, 0, 4);
    static req r;
    make_req(&r, 1);
    int32_t bad = V;
    char err[256];
    eng_request q = {.prompt = r.prompt,
                     .nprompt = r.nprompt,
                     .max_tokens = 4,
                     .sampling = {.top_p = 1},
                     .logprobs = -1,
                     .speculative_tokens = ENG_SPEC_MAX + 1,
                     .on_event = on_event,
                     .user = &r};
    uint64_t id;
    ck_assert_int_eq(eng_sched_submit(s, &q, &id, err, sizeof err), ENG_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "speculative_tokens"));
    q.speculative_tokens = 2;
    q.drafter = ENG_DRAFT_MODEL;
    ck_assert_int_eq(eng_sched_submit(s, &q, &id, err, sizeof err), ENG_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "draft model"));
    q.drafter = ENG_DRAFT_LOOKUP;
    q.prediction = &bad;
    q.nprediction = 1;
    ck_assert_int_eq(eng_sched_submit(s, &q, &id, err, sizeof err), ENG_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "prediction token"));
    eng_sched_free(s);
    eng_model_free(m);
}
END_TEST

/* ---- Found by review: echo beside drafts, the cache after a draft ---- */

static eng_sched *make_sched2(eng_model *m, int prefix_cache, size_t spec_max_batch,
                              size_t step_tokens)
{
    eng_sched_opts o = {.kv_bytes = 4u << 20,
                        .block_len = 16,
                        .max_running = 16,
                        .max_queue = 256,
                        .step_tokens = step_tokens,
                        .threads = 2,
                        .prefix_cache = prefix_cache,
                        .spec_max_batch = spec_max_batch};
    eng_sched *s;
    char err[256];
    ck_assert_msg(eng_sched_new(m, &o, &s, err, sizeof err) == ENG_OK, "%s", err);
    return s;
}

typedef struct {
    size_t ntok, dones;
    eng_finish finish;
    const char *message;
    int32_t tok[64];
    size_t cached, accepted, cancel_at;
    eng_sched *s;
    uint64_t id;
} simple;

static void simple_ev(void *user, const eng_event *e)
{
    simple *r = user;
    if (e->kind == ENG_EV_TOKEN && r->ntok < 64) r->tok[r->ntok++] = e->token;
    if (e->kind == ENG_EV_TOKEN && r->cancel_at && r->ntok == r->cancel_at)
        eng_sched_cancel(r->s, r->id); /* a stop string */
    if (e->kind == ENG_EV_DONE) {
        r->dones++;
        r->finish = e->finish;
        r->message = e->message;
        r->cached = e->cached;
        r->accepted = e->accepted;
    }
}

/* 8 decoders each drafting 8 tokens (a right prediction) beside an echo
 * prompt in one step: the drafted rows once counted as echo's, past
 * ECHO_ROWS, and the echo's chunk underflowed (a failed step, or a read
 * past its tokens with a cache hit). */
static void echo_beside_drafts(int prefix_cache, int spec, size_t echo_max_tokens)
{
    eng_model *m = load(NULL);
    static req plain[8], sp[8];
    eng_sched *s = make_sched2(m, prefix_cache, 16, 512);
    for (size_t i = 0; i < 8; i++) {
        make_req(&plain[i], 700 + i);
        plain[i].nprompt = 5;
        plain[i].masked = 0;
        plain[i].cancel_after = 0;
        plain[i].ignore_eos = 1;
        plain[i].logprobs = -1;
        plain[i].sp = (eng_sampling){.temperature = 0.0f, .top_p = 1};
        plain[i].max_tokens = 40;
        submit(s, &plain[i], 0, ENG_DRAFT_LOOKUP, NULL, 0);
    }
    run(s);
    int32_t ep[40];
    for (size_t k = 0; k < 40; k++) ep[k] = (int32_t)(100 + k % 16);
    static simple warm, echo;
    memset(&echo, 0, sizeof echo);
    uint64_t id;
    char err[256];
    if (prefix_cache) { /* a first one registers two blocks with their logprobs */
        eng_request w = {.prompt = ep,
                         .nprompt = 33,
                         .max_tokens = 1,
                         .sampling = {.top_p = 1},
                         .logprobs = 0,
                         .echo = 1,
                         .on_event = simple_ev,
                         .user = &warm};
        ck_assert(eng_sched_submit(s, &w, &id, err, sizeof err) == ENG_OK);
        run(s);
    }
    static int32_t pred[8][64];
    for (size_t i = 0; i < 8; i++) {
        sp[i] = plain[i];
        size_t np = make_pred(&plain[i], 1, pred[i]);
        submit(s, &sp[i], spec ? 8 : 0, ENG_DRAFT_PREDICTION, pred[i], np);
    }
    ck_assert(eng_sched_step(s)); /* the prompts, the first tokens */
    eng_request e = {.prompt = ep,
                     .nprompt = 40,
                     .max_tokens = echo_max_tokens,
                     .sampling = {.top_p = 1},
                     .logprobs = 0,
                     .echo = 1,
                     .on_event = simple_ev,
                     .user = &echo};
    ck_assert(eng_sched_submit(s, &e, &id, err, sizeof err) == ENG_OK);
    run(s);
    for (size_t i = 0; i < 8; i++) assert_same(&plain[i], &sp[i], i);
    ck_assert_msg(echo.finish == ENG_FINISH_LENGTH && echo.ntok == echo_max_tokens,
                  "echo: finish %d, %zu tokens, %s", (int)echo.finish, echo.ntok,
                  echo.message ? echo.message : "");
    eng_sched_free(s);
    eng_model_free(m);
}

/* Plainly (the harness), with drafts, with the prefix cache, and with
 * max_tokens 0 (the prompt alone: its tokens array ends with it). */
START_TEST(spec_echo_beside_drafts)
{
    echo_beside_drafts(0, 0, 4);
    echo_beside_drafts(0, 1, 4);
    echo_beside_drafts(1, 1, 4);
    echo_beside_drafts(1, 1, 0);
}
END_TEST

/* A mask that forces tokens: forced[i] as the i-th, then end of text. */
typedef struct {
    uint64_t bits[(V + 63) / 64];
    const int32_t *forced;
    size_t n, at;
} fmask;
static const uint64_t *fm_allowed(void *self, size_t *nallowed)
{
    fmask *f = self;
    memset(f->bits, 0, sizeof f->bits);
    int32_t t = f->at < f->n ? f->forced[f->at] : EOT;
    f->bits[t / 64] |= 1ull << (t % 64);
    *nallowed = 1;
    return f->bits;
}
static int fm_accept(void *self, int32_t token)
{
    fmask *f = self;
    int32_t t = f->at < f->n ? f->forced[f->at] : EOT;
    if (token != t) return -1;
    f->at++;
    return 0;
}
static int fm_accepting(const void *self)
{
    (void)self;
    return 1;
}
static const char *fm_error(const void *self)
{
    (void)self;
    return NULL;
}
static const eng_mask_ops fm_ops = {.allowed = fm_allowed,
                                    .accept = fm_accept,
                                    .accepting = fm_accepting,
                                    .error = fm_error,
                                    .free = tm_free};

/* Request A: 16 prompt tokens, 15 forced then end of text (32 positions),
 * or cut by a cancel (a stop string) after cancel_at tokens; request B:
 * A's prompt and output and more. B's cached prompt tokens must not depend
 * on speculation: the verify pass computed the position of A's accepted
 * end of text, and of tokens the cancel left undelivered, which plain
 * decoding never computes. A is told only of accepted tokens it got. */
static size_t cached_after(int spec, size_t cancel_at, size_t *accepted)
{
    eng_model *m = load(NULL);
    eng_sched *s = make_sched2(m, 1, 4, 64);
    int32_t pa[16], forced[15], pb[40], pred[16];
    for (size_t k = 0; k < 16; k++) pa[k] = (int32_t)(300 + k);
    for (size_t k = 0; k < 15; k++) forced[k] = (int32_t)(500 + k);
    for (size_t k = 0; k < 15; k++) pred[k] = forced[k];
    pred[15] = EOT;
    fmask *f = calloc(1, sizeof *f);
    f->forced = forced;
    f->n = 15;
    static simple a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.s = s;
    a.cancel_at = cancel_at;
    uint64_t id;
    char err[256];
    eng_request ra = {.prompt = pa,
                      .nprompt = 16,
                      .max_tokens = 40,
                      .sampling = {.top_p = 1},
                      .logprobs = -1,
                      .mask = {.ops = &fm_ops, .self = f, .n_vocab = V},
                      .speculative_tokens = spec ? 8 : 0,
                      .drafter = ENG_DRAFT_PREDICTION,
                      .prediction = pred,
                      .nprediction = 16,
                      .on_event = simple_ev,
                      .user = &a};
    ck_assert(eng_sched_submit(s, &ra, &a.id, err, sizeof err) == ENG_OK);
    run(s);
    size_t na = cancel_at ? cancel_at : 16;
    ck_assert_uint_eq(a.ntok, na);
    ck_assert_int_eq(a.finish, cancel_at ? ENG_FINISH_CANCELLED : ENG_FINISH_EOS);
    *accepted = a.accepted;
    ck_assert_uint_le(a.accepted, na);
    memcpy(pb, pa, sizeof pa);
    memcpy(pb + 16, a.tok, na * sizeof *pb);
    for (size_t k = 16 + na; k < 40; k++) pb[k] = 7;
    eng_request rb = {.prompt = pb,
                      .nprompt = 40,
                      .max_tokens = 1,
                      .sampling = {.top_p = 1},
                      .logprobs = -1,
                      .on_event = simple_ev,
                      .user = &b};
    ck_assert(eng_sched_submit(s, &rb, &id, err, sizeof err) == ENG_OK);
    run(s);
    eng_sched_free(s);
    eng_model_free(m);
    return b.cached;
}

START_TEST(spec_cache_holds_what_plain_decoding_computed)
{
    size_t acc;
    for (size_t cancel_at = 0; cancel_at <= 12; cancel_at += 3) {
        size_t plain = cached_after(0, cancel_at, &acc), spec = cached_after(1, cancel_at, &acc);
        ck_assert_msg(plain == spec,
                      "cancel at %zu: cached prompt tokens: %zu plainly, %zu speculated", cancel_at,
                      plain, spec);
        ck_assert_uint_gt(acc, 0);
    }
}
END_TEST

int main(void)
{
    Suite *su = suite_create("spec");
    TCase *tc = tcase_create("spec");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, spec_same_events_as_plain_decoding, 0, 4);
    tcase_add_test(tc, spec_right_drafts_save_steps_wrong_ones_back_off);
    tcase_add_test(tc, spec_bad_parameters_are_refused);
    tcase_add_test(tc, spec_draft_model_same_events);
    tcase_add_test(tc, spec_draft_model_must_match);
    tcase_add_test(tc, spec_echo_beside_drafts);
    tcase_add_test(tc, spec_cache_holds_what_plain_decoding_computed);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
