/*
 * tests/test_sched.c: the continuous-batching scheduler without HTTP, driven
 * the way the server drives it: a libuv loop, one step at a time on the
 * work queue (uv_queue_work), plan and complete on the loop thread.
 */
#include "engine.h"
#include "internal.h"
#include "tools.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "testutil.h"

static char dir[256];
static eng_model *model;

static void setup(void)
{
    mkdtemp_template(dir, sizeof dir, "/tmp/gpt2d-test-sched-");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char out[320];
    snprintf(out, sizeof out, "%s/model.safetensors", dir);
    char *argv[] = {"synth", out,     "--layers", "2",       "--embd", "64",     "--heads",
                    "4",     "--ctx", "256",      "--vocab", "600",    "--seed", "9"};
    ck_assert_int_eq(tool_synth(14, argv), 0);
    char err[512];
    ck_assert_msg(eng_model_load(dir, &model, err, sizeof err) == ENG_OK, "%s", err);
}

static void teardown(void)
{
    eng_model_free(model);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* KV bytes per block of 16 positions for this model. */
static size_t block_bytes(void)
{
    return 2 * 2 * 16 * 64 * sizeof(float);
}

/* ---- The libuv driver ------------------------------------------------------ */

typedef struct {
    uv_loop_t loop;
    uv_work_t work;
    eng_sched *s;
    int in_flight;
    size_t steps;
} driver;

static void kick(driver *d);

static void work_cb(uv_work_t *w)
{
    eng_sched_execute(((driver *)w->data)->s);
}

static void after_cb(uv_work_t *w, int status)
{
    driver *d = w->data;
    ck_assert_int_eq(status, 0);
    d->in_flight = 0;
    eng_sched_complete(d->s);
    d->steps++;
    kick(d);
}

static void kick(driver *d)
{
    if (d->in_flight || !eng_sched_plan(d->s)) return;
    d->in_flight = 1;
    d->work.data = d;
    ck_assert_int_eq(uv_queue_work(&d->loop, &d->work, work_cb, after_cb), 0);
}

static void drive(driver *d)
{
    kick(d);
    ck_assert_int_ge(uv_run(&d->loop, UV_RUN_DEFAULT), 0);
}

/* ---- Per-request records ----------------------------------------------------- */

typedef struct {
    uint64_t id;
    int32_t tokens[512];
    float logprobs[512];
    float prompt_logprobs[512]; /* by position */
    size_t prompt_ntop[512];    /* by position: alternatives, and the last one */
    int32_t prompt_top_id[512];
    float prompt_top_lp[512];
    size_t n, prompt_events, done_count;
    size_t cached; /* DONE: prompt tokens from the prefix cache */
    eng_finish finish;
    size_t first_token_step; /* driver step count when the first token came */
    size_t done_order;       /* 1 for the first DONE of the test, 2 ... */
    driver *d;
    eng_sched *s;
    size_t cancel_after; /* cancel from the callback after this many tokens */
    float emb[64];       /* DONE of an embedding (the test model's width) */
    int has_emb;
} rec;

static void on_event(void *user, const eng_event *ev)
{
    rec *r = user;
    ck_assert_uint_eq(r->done_count, 0); /* nothing after DONE */
    ck_assert(ev->id == r->id);
    if (ev->kind == ENG_EV_TOKEN) {
        ck_assert_uint_eq(ev->index, r->n);
        if (r->n == 0 && r->d) r->first_token_step = r->d->steps;
        r->logprobs[r->n] = ev->logprob;
        r->tokens[r->n++] = ev->token;
        if (r->cancel_after && r->n == r->cancel_after) eng_sched_cancel(r->s, r->id);
    } else if (ev->kind == ENG_EV_PROMPT_LOGPROB) {
        r->prompt_logprobs[ev->index] = ev->logprob;
        r->prompt_ntop[ev->index] = ev->ntop;
        if (ev->ntop > 0) {
            r->prompt_top_id[ev->index] = ev->top_ids[ev->ntop - 1];
            r->prompt_top_lp[ev->index] = ev->top_logprobs[ev->ntop - 1];
        }
        r->prompt_events++;
    } else {
        static size_t dones;
        r->done_count++;
        r->done_order = ++dones;
        r->finish = ev->finish;
        r->cached = ev->cached;
        if (ev->embedding != NULL) {
            memcpy(r->emb, ev->embedding, sizeof r->emb);
            r->has_emb = 1;
        }
    }
}

static eng_sched *make_sched_threads(size_t blocks, size_t max_running, size_t max_queue,
                                     size_t step_tokens, int prefix_cache, size_t threads)
{
    eng_sched_opts o = {.kv_bytes = blocks * block_bytes(),
                        .block_len = 16,
                        .max_running = max_running,
                        .max_queue = max_queue,
                        .step_tokens = step_tokens,
                        .threads = threads,
                        .prefix_cache = prefix_cache};
    eng_sched *s;
    char err[256];
    ck_assert_msg(eng_sched_new(model, &o, &s, err, sizeof err) == ENG_OK, "%s", err);
    return s;
}

static eng_sched *make_sched_cache(size_t blocks, size_t max_running, size_t max_queue,
                                   size_t step_tokens, int prefix_cache)
{
    return make_sched_threads(blocks, max_running, max_queue, step_tokens, prefix_cache, 2);
}

/* The scheduler with the prefix cache on, as the server runs it. */
static eng_sched *make_sched(size_t blocks, size_t max_running, size_t max_queue,
                             size_t step_tokens)
{
    return make_sched_cache(blocks, max_running, max_queue, step_tokens, 1);
}

static void prompt_of(int32_t *p, size_t n, unsigned salt)
{
    for (size_t i = 0; i < n; i++) p[i] = (int32_t)((i * 37u + salt * 101u) % 600u);
}

static void submit(eng_sched *s, rec *r, size_t nprompt, size_t max_tokens, unsigned salt,
                   float temperature)
{
    int32_t p[256];
    prompt_of(p, nprompt, salt);
    eng_request q = {.prompt = p,
                     .nprompt = nprompt,
                     .max_tokens = max_tokens,
                     .sampling = {.temperature = temperature, .top_k = 40, .top_p = 0.95f},
                     .seed = salt,
                     .ignore_eos = 1,
                     .logprobs = 0,
                     .on_event = on_event,
                     .user = r};
    char err[256];
    r->s = s;
    ck_assert_msg(eng_sched_submit(s, &q, &r->id, err, sizeof err) == ENG_OK, "%s", err);
}

static void assert_idle(eng_sched *s)
{
    eng_sched_stats st;
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.running, 0);
    ck_assert_uint_eq(st.queued, 0);
    ck_assert_uint_eq(st.kv_blocks_used, 0);
}

/* ---- Tests --------------------------------------------------------------------- */

START_TEST(sched_many_mixed_requests_complete_and_return_every_block)
{
    /* 30 blocks of 16 positions: far fewer than the 40 requests need at
     * once, so most wait for blocks; 8 run at a time. */
    eng_sched *s = make_sched(30, 8, 64, 64);
    driver d = {.s = s};
    ck_assert_int_eq(uv_loop_init(&d.loop), 0);
    static rec recs[40];
    memset(recs, 0, sizeof recs);
    for (unsigned i = 0; i < 40; i++) {
        recs[i].d = &d;
        submit(s, &recs[i], 1 + (i * 13) % 150, 1 + (i * 7) % 40, i, 0.8f);
    }
    drive(&d);
    for (unsigned i = 0; i < 40; i++) {
        ck_assert_uint_eq(recs[i].done_count, 1);
        ck_assert_int_eq(recs[i].finish, ENG_FINISH_LENGTH);
        ck_assert_uint_eq(recs[i].n, 1 + (i * 7) % 40);
        for (size_t k = 0; k < recs[i].n; k++) {
            ck_assert(recs[i].tokens[k] >= 0 && recs[i].tokens[k] < 600);
            ck_assert(recs[i].logprobs[k] <= 0.0f && isfinite(recs[i].logprobs[k]));
        }
    }
    assert_idle(s);
    eng_sched_free(s);
    ck_assert_int_eq(uv_loop_close(&d.loop), 0);
}
END_TEST

START_TEST(sched_same_seed_same_tokens_alone_or_batched)
{
    static rec alone[6], batched[6], noise[10];
    memset(alone, 0, sizeof alone);
    memset(batched, 0, sizeof batched);
    memset(noise, 0, sizeof noise);
    for (unsigned i = 0; i < 6; i++) {
        eng_sched *s = make_sched(64, 16, 64, 64);
        submit(s, &alone[i], 5 + i * 17, 20, 100 + i, i % 2 ? 0.8f : 0.0f);
        while (eng_sched_step(s)) {
        }
        eng_sched_free(s);
    }
    eng_sched *s = make_sched(64, 16, 64, 64);
    driver d = {.s = s};
    ck_assert_int_eq(uv_loop_init(&d.loop), 0);
    for (unsigned i = 0; i < 10; i++) submit(s, &noise[i], 3 + i * 9, 25, 7 + i, 1.0f);
    for (unsigned i = 0; i < 6; i++)
        submit(s, &batched[i], 5 + i * 17, 20, 100 + i, i % 2 ? 0.8f : 0.0f);
    drive(&d);
    for (unsigned i = 0; i < 6; i++) {
        ck_assert_uint_eq(alone[i].n, 20);
        ck_assert_uint_eq(batched[i].n, 20);
        ck_assert_mem_eq(alone[i].tokens, batched[i].tokens, 20 * sizeof(int32_t));
        ck_assert_mem_eq(alone[i].logprobs, batched[i].logprobs, 20 * sizeof(float));
    }
    assert_idle(s);
    eng_sched_free(s);
    ck_assert_int_eq(uv_loop_close(&d.loop), 0);
}
END_TEST

START_TEST(sched_cancel_waiting_running_and_from_callback)
{
    eng_sched *s = make_sched(8, 2, 16, 64);
    driver d = {.s = s};
    ck_assert_int_eq(uv_loop_init(&d.loop), 0);
    static rec r[6];
    memset(r, 0, sizeof r);
    for (unsigned i = 0; i < 6; i++) submit(s, &r[i], 20, 30, i, 0.8f);
    r[1].cancel_after = 3;        /* cancels itself from its own callback */
    eng_sched_cancel(s, r[5].id); /* still waiting: ends at once */
    ck_assert_uint_eq(r[5].done_count, 1);
    ck_assert_int_eq(r[5].finish, ENG_FINISH_CANCELLED);
    ck_assert_uint_eq(r[5].n, 0);
    /* One step by hand, then cancel a running sequence between steps. */
    ck_assert(eng_sched_step(s));
    eng_sched_stats st;
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.running, 2);
    ck_assert_uint_gt(st.kv_blocks_used, 0);
    eng_sched_cancel(s, r[0].id);
    ck_assert_uint_eq(r[0].done_count, 1);
    ck_assert_int_eq(r[0].finish, ENG_FINISH_CANCELLED);
    eng_sched_cancel(s, 999999); /* unknown: ignored */
    drive(&d);
    ck_assert_uint_eq(r[1].n, 3);
    ck_assert_int_eq(r[1].finish, ENG_FINISH_CANCELLED);
    for (unsigned i = 2; i < 5; i++) {
        ck_assert_uint_eq(r[i].n, 30);
        ck_assert_int_eq(r[i].finish, ENG_FINISH_LENGTH);
    }
    for (unsigned i = 0; i < 6; i++) ck_assert_uint_eq(r[i].done_count, 1);
    assert_idle(s);
    eng_sched_free(s);
    ck_assert_int_eq(uv_loop_close(&d.loop), 0);
}
END_TEST

START_TEST(sched_cancel_during_an_executing_step_ends_at_completion)
{
    eng_sched *s = make_sched(16, 4, 16, 64);
    static rec r[2];
    memset(r, 0, sizeof r);
    submit(s, &r[0], 10, 20, 1, 0.0f);
    submit(s, &r[1], 10, 20, 2, 0.0f);
    ck_assert(eng_sched_plan(s));
    eng_sched_execute(s);
    eng_sched_cancel(s, r[0].id); /* in the step: only marked */
    ck_assert_uint_eq(r[0].done_count, 0);
    eng_sched_complete(s);
    ck_assert_uint_eq(r[0].done_count, 1);
    ck_assert_uint_eq(r[0].n, 0);
    ck_assert_int_eq(r[0].finish, ENG_FINISH_CANCELLED);
    while (eng_sched_step(s)) {
    }
    ck_assert_uint_eq(r[1].n, 20);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

START_TEST(sched_pause_holds_rows_and_blocks_then_resumes_same_tokens)
{
    /* The reference: request 0 alone, never paused. */
    eng_sched *s = make_sched(16, 4, 16, 64);
    static rec ref, r[2];
    memset(&ref, 0, sizeof ref);
    memset(r, 0, sizeof r);
    submit(s, &ref, 10, 20, 1, 0.8f);
    while (eng_sched_step(s)) {
    }
    ck_assert_uint_eq(ref.n, 20);
    eng_sched_free(s);

    s = make_sched(16, 4, 16, 64);
    submit(s, &r[0], 10, 20, 1, 0.8f);
    submit(s, &r[1], 10, 20, 2, 0.8f);
    ck_assert(eng_sched_step(s)); /* both admitted and prefilled: a token each */
    ck_assert_uint_eq(r[0].n, 1);
    eng_sched_pause(s, r[0].id, 1);
    eng_sched_pause(s, 999999, 1); /* unknown: ignored */
    for (int i = 0; i < 5; i++) ck_assert(eng_sched_step(s));
    ck_assert_uint_eq(r[0].n, 1); /* no rows while paused */
    ck_assert_uint_eq(r[1].n, 6);
    eng_sched_stats st;
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.running, 2); /* still admitted, blocks kept */
    ck_assert_uint_eq(st.kv_blocks_used, 4);
    eng_sched_pause(s, r[1].id, 1);
    ck_assert(!eng_sched_plan(s)); /* everything paused: no step */
    eng_sched_pause(s, r[0].id, 0);
    eng_sched_pause(s, r[1].id, 0);
    while (eng_sched_step(s)) {
    }
    ck_assert_uint_eq(r[0].n, 20);
    ck_assert_uint_eq(r[1].n, 20);
    for (size_t i = 0; i < 20; i++) ck_assert_int_eq(r[0].tokens[i], ref.tokens[i]);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

START_TEST(sched_queue_overflow_and_impossible_requests_are_refused)
{
    eng_sched *s = make_sched(4, 1, 3, 64);
    static rec r[5];
    memset(r, 0, sizeof r);
    for (unsigned i = 0; i < 3; i++) submit(s, &r[i], 10, 5, i, 0.0f);
    int32_t p[300];
    prompt_of(p, 300, 1);
    eng_request q = {.prompt = p,
                     .nprompt = 10,
                     .max_tokens = 5,
                     .logprobs = -1,
                     .on_event = on_event,
                     .user = &r[3]};
    uint64_t id;
    char err[256];
    ck_assert_int_eq(eng_sched_submit(s, &q, &id, err, sizeof err), ENG_EFULL);
    ck_assert_ptr_nonnull(strstr(err, "queue is full"));
    q.nprompt = 250;
    q.max_tokens = 10; /* 260 > context 256 */
    ck_assert_int_eq(eng_sched_submit(s, &q, &id, err, sizeof err), ENG_ETOOBIG);
    ck_assert_ptr_nonnull(strstr(err, "250"));
    ck_assert_ptr_nonnull(strstr(err, "256"));
    q.nprompt = 60;
    q.max_tokens = 10; /* 70 positions = 5 blocks > the pool's 4 */
    ck_assert_int_eq(eng_sched_submit(s, &q, &id, err, sizeof err), ENG_ETOOBIG);
    q.nprompt = 1;
    p[0] = 600;
    ck_assert_int_eq(eng_sched_submit(s, &q, &id, err, sizeof err), ENG_EINVAL);
    p[0] = 1;
    q.nprompt = 0;
    ck_assert_int_eq(eng_sched_submit(s, &q, &id, err, sizeof err), ENG_EINVAL);
    while (eng_sched_step(s)) {
    }
    ck_assert_uint_eq(r[3].done_count, 0); /* refused requests get no events */
    for (unsigned i = 0; i < 3; i++) ck_assert_uint_eq(r[i].n, 5);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

/* A submission's status, for requests that may be refused. */
static eng_status try_submit(eng_sched *s, rec *r, unsigned salt)
{
    int32_t p[10];
    prompt_of(p, 10, salt);
    eng_request q = {.prompt = p,
                     .nprompt = 10,
                     .max_tokens = 3,
                     .logprobs = -1,
                     .ignore_eos = 1,
                     .on_event = on_event,
                     .user = r};
    char err[256];
    r->s = s;
    return eng_sched_submit(s, &q, &r->id, err, sizeof err);
}

START_TEST(sched_set_max_queue_grows_in_order_and_shrinks)
{
    eng_sched *s = make_sched(16, 1, 2, 64);
    static rec r[7];
    memset(r, 0, sizeof r);
    char err[256];
    ck_assert_int_eq(try_submit(s, &r[0], 0), ENG_OK);
    ck_assert_int_eq(try_submit(s, &r[1], 1), ENG_OK);
    ck_assert(eng_sched_plan(s)); /* r0 leaves the queue: its ring's head moves */
    eng_sched_execute(s);
    eng_sched_complete(s);
    ck_assert_int_eq(try_submit(s, &r[2], 2), ENG_OK); /* wraps around the ring */
    ck_assert_int_eq(try_submit(s, &r[3], 3), ENG_EFULL);
    ck_assert_int_eq(eng_sched_set_max_queue(s, 4, err, sizeof err), ENG_OK);
    ck_assert_int_eq(try_submit(s, &r[3], 3), ENG_OK);
    ck_assert_int_eq(try_submit(s, &r[4], 4), ENG_OK);
    ck_assert_int_eq(try_submit(s, &r[5], 5), ENG_EFULL);
    eng_sched_stats st;
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.queued, 4);
    /* A smaller bound keeps who waits, and refuses until the queue is under it. */
    ck_assert_int_eq(eng_sched_set_max_queue(s, 1, err, sizeof err), ENG_OK);
    ck_assert_int_eq(try_submit(s, &r[5], 5), ENG_EFULL);
    while (eng_sched_step(s)) {
    }
    for (size_t i = 0; i < 5; i++) { /* one runs at a time: done in queue order */
        ck_assert_uint_eq(r[i].n, 3);
        if (i > 0) ck_assert_uint_gt(r[i].done_order, r[i - 1].done_order);
    }
    ck_assert_int_eq(try_submit(s, &r[5], 5), ENG_OK);
    ck_assert_int_eq(try_submit(s, &r[6], 6), ENG_EFULL);
    while (eng_sched_step(s)) {
    }
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

START_TEST(sched_chunked_prefill_keeps_decoders_flowing)
{
    /* Budget 16 prompt tokens per step: a 200-token prompt takes exactly
     * ceil(200 / 16) = 13 steps of prefill (the decode row comes on top of
     * the budget; if it took from it, 15 a step would need 14), during which
     * the already decoding stream gets a token every step. */
    eng_sched *s = make_sched(64, 4, 16, 16);
    static rec a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    driver d = {.s = s};
    a.d = b.d = &d;
    submit(s, &a, 4, 40, 1, 0.0f);
    ck_assert(eng_sched_step(s)); /* a prefilled, first token */
    d.steps = 1;
    submit(s, &b, 200, 5, 2, 0.0f);
    size_t a_before_b = 0, max_rows = 0;
    while (eng_sched_step(s)) {
        d.steps++;
        eng_sched_stats st;
        eng_sched_stats_get(s, &st);
        if (st.last_step_rows > max_rows) max_rows = st.last_step_rows;
        if (b.n == 0) a_before_b = a.n;
    }
    ck_assert_uint_eq(max_rows, 16 + 1);
    ck_assert_uint_eq(b.first_token_step, 13);
    ck_assert_uint_eq(a_before_b, 1 + 12);
    ck_assert_uint_eq(a.n, 40);
    ck_assert_uint_eq(b.n, 5);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

static size_t distinct(const int32_t *t, size_t n)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < i && t[j] != t[i]) j++;
        d += j == i;
    }
    return d;
}

START_TEST(sched_echo_logprobs_bias_and_penalties)
{
    eng_sched *s = make_sched(64, 4, 16, 64);
    static rec e, g, biased, pen;
    memset(&e, 0, sizeof e);
    memset(&g, 0, sizeof g);
    memset(&biased, 0, sizeof biased);
    memset(&pen, 0, sizeof pen);
    int32_t p[30];
    prompt_of(p, 30, 3);
    char err[256];
    /* Echo: one PROMPT_LOGPROB per prompt token after the first; greedy
     * chooses the top alternative. */
    eng_request q = {.prompt = p,
                     .nprompt = 30,
                     .max_tokens = 6,
                     .logprobs = 3,
                     .echo = 1,
                     .ignore_eos = 1,
                     .on_event = on_event,
                     .user = &e};
    ck_assert_int_eq(eng_sched_submit(s, &q, &e.id, err, sizeof err), ENG_OK);
    q.echo = 0;
    q.user = &g;
    ck_assert_int_eq(eng_sched_submit(s, &q, &g.id, err, sizeof err), ENG_OK);
    /* max_tokens 0 (scoring a text): the prompt's logprobs, no token, and
     * the request ends as "length"; without echo it just ends. */
    static rec z, zq;
    memset(&z, 0, sizeof z);
    memset(&zq, 0, sizeof zq);
    q.max_tokens = 0;
    q.echo = 1;
    q.user = &z;
    ck_assert_int_eq(eng_sched_submit(s, &q, &z.id, err, sizeof err), ENG_OK);
    q.echo = 0;
    q.user = &zq;
    ck_assert_int_eq(eng_sched_submit(s, &q, &zq.id, err, sizeof err), ENG_OK);
    q.max_tokens = 6;
    while (eng_sched_step(s)) {
    }
    ck_assert_uint_eq(e.prompt_events, 29);
    ck_assert_uint_eq(g.prompt_events, 0);
    ck_assert_mem_eq(e.tokens, g.tokens, 6 * sizeof(int32_t)); /* echo changes nothing */
    ck_assert_uint_eq(z.prompt_events, 29);
    ck_assert_mem_eq(z.prompt_logprobs + 1, e.prompt_logprobs + 1, 29 * sizeof(float));
    for (size_t k = 1; k < 30; k++) ck_assert(z.prompt_logprobs[k] < 0);
    ck_assert_uint_eq(z.n, 0);
    ck_assert_uint_eq(z.done_count, 1);
    ck_assert_int_eq(z.finish, ENG_FINISH_LENGTH);
    ck_assert_uint_eq(zq.n + zq.prompt_events, 0);
    ck_assert_uint_eq(zq.done_count, 1);
    ck_assert_int_eq(zq.finish, ENG_FINISH_LENGTH);
    assert_idle(s);
    /* A +100 bias forces a token; a presence penalty of 2 under greedy
     * changes the continuation. */
    eng_bias bias = {.token = 123, .bias = 100.0f};
    q.user = &biased;
    q.sampling = (eng_sampling){.temperature = 0, .top_p = 1, .bias = &bias, .nbias = 1};
    ck_assert_int_eq(eng_sched_submit(s, &q, &biased.id, err, sizeof err), ENG_OK);
    q.user = &pen;
    q.sampling = (eng_sampling){
        .temperature = 0, .top_p = 1, .presence_penalty = 2.0f, .frequency_penalty = 2.0f};
    ck_assert_int_eq(eng_sched_submit(s, &q, &pen.id, err, sizeof err), ENG_OK);
    while (eng_sched_step(s)) {
    }
    for (size_t k = 0; k < 6; k++) ck_assert_int_eq(biased.tokens[k], 123);
    size_t dg = distinct(g.tokens, 6), dp = distinct(pen.tokens, 6);
    ck_assert_uint_ge(dp, dg);
    if (dg < 6) ck_assert_msg(dp > dg, "penalties did not reduce repeats (%zu vs %zu)", dp, dg);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

START_TEST(sched_end_of_text_ends_unless_ignored)
{
    /* A model with GPT-2's vocabulary, so that 50256 exists; a +100 bias
     * makes it the first token. */
    char sub[320], out[400], err[512];
    snprintf(sub, sizeof sub, "%s/eot", dir);
    mkdir(sub, 0755);
    snprintf(out, sizeof out, "%s/model.safetensors", sub);
    char *argv[] = {"synth",   out, "--layers", "1",  "--embd", "64",
                    "--heads", "4", "--ctx",    "64", "--seed", "2"};
    ck_assert_int_eq(tool_synth(12, argv), 0);
    eng_model *m;
    ck_assert_msg(eng_model_load(sub, &m, err, sizeof err) == ENG_OK, "%s", err);
    eng_sched_opts o = {.kv_bytes = 1 << 20,
                        .block_len = 16,
                        .max_running = 4,
                        .max_queue = 4,
                        .step_tokens = 64,
                        .threads = 2};
    eng_sched *s;
    ck_assert_int_eq(eng_sched_new(m, &o, &s, err, sizeof err), ENG_OK);
    static rec stop, go;
    memset(&stop, 0, sizeof stop);
    memset(&go, 0, sizeof go);
    int32_t p[3] = {464, 3616, 286};
    eng_bias eot = {.token = 50256, .bias = 100.0f};
    eng_request q = {
        .prompt = p,
        .nprompt = 3,
        .max_tokens = 5,
        .logprobs = -1,
        .sampling = {.temperature = 0.8f, .top_k = 40, .top_p = 1, .bias = &eot, .nbias = 1},
        .on_event = on_event,
        .user = &stop};
    ck_assert_int_eq(eng_sched_submit(s, &q, &stop.id, err, sizeof err), ENG_OK);
    q.ignore_eos = 1;
    q.user = &go;
    ck_assert_int_eq(eng_sched_submit(s, &q, &go.id, err, sizeof err), ENG_OK);
    while (eng_sched_step(s)) {
    }
    ck_assert_uint_eq(stop.n, 1);
    ck_assert_int_eq(stop.tokens[0], 50256);
    ck_assert_int_eq(stop.finish, ENG_FINISH_EOS);
    ck_assert_uint_eq(go.n, 5);
    ck_assert_int_eq(go.finish, ENG_FINISH_LENGTH);
    for (size_t k = 0; k < 5; k++) ck_assert_int_eq(go.tokens[k], 50256);
    assert_idle(s);
    eng_sched_free(s);
    eng_model_free(m);
}
END_TEST

/* ---- The prefix cache ------------------------------------------------------------ */

/* Submits prompt p[0..n) (copied), with logprobs and echo as given. */
static void submit_lp(eng_sched *s, rec *r, const int32_t *p, size_t n, size_t max_tokens,
                      uint64_t seed, float temperature, int echo, int logprobs)
{
    eng_request q = {.prompt = p,
                     .nprompt = n,
                     .max_tokens = max_tokens,
                     .sampling = {.temperature = temperature, .top_k = 40, .top_p = 0.95f},
                     .seed = seed,
                     .ignore_eos = 1,
                     .logprobs = logprobs,
                     .echo = echo,
                     .on_event = on_event,
                     .user = r};
    char err[256];
    r->s = s;
    ck_assert_msg(eng_sched_submit(s, &q, &r->id, err, sizeof err) == ENG_OK, "%s", err);
}

static void submit_ids(eng_sched *s, rec *r, const int32_t *p, size_t n, size_t max_tokens,
                       uint64_t seed, float temperature, int echo)
{
    submit_lp(s, r, p, n, max_tokens, seed, temperature, echo, 2);
}

static void run_all(eng_sched *s)
{
    while (eng_sched_step(s)) {
    }
}

/* The same request alone, on a fresh scheduler without the cache. */
/* ---- The mask provider (eng_mask) ------------------------------------------------ */

/* A mask that allows the tokens t with t % 7 == rem, and records what the
 * scheduler told it: the accepted tokens in order and how often it was
 * freed. stuck_after: past that many tokens it allows none; fail_after:
 * past that many it fails (error). 0: never. */
typedef struct {
    uint64_t bits[(600 + 63) / 64];
    int32_t rem;
    int32_t accepted[64];
    size_t naccepted, stuck_after, fail_after;
    int frees, refused;
} test_mask;

static const uint64_t *tm_allowed(void *self, size_t *nallowed)
{
    test_mask *m = self;
    *nallowed = 0;
    if (m->fail_after && m->naccepted >= m->fail_after) return NULL;
    memset(m->bits, 0, sizeof m->bits);
    if (m->stuck_after && m->naccepted >= m->stuck_after) return m->bits;
    for (int32_t t = 0; t < 600; t++)
        if (t % 7 == m->rem) {
            m->bits[t / 64] |= 1ull << (t % 64);
            ++*nallowed;
        }
    return m->bits;
}

static int tm_accept(void *self, int32_t token)
{
    test_mask *m = self;
    if (token % 7 != m->rem) {
        m->refused++;
        return -1;
    }
    m->accepted[m->naccepted++] = token;
    return 0;
}

static int tm_accepting(const void *self)
{
    (void)self;
    return 1;
}

static const char *tm_error(const void *self)
{
    const test_mask *m = self;
    return m->fail_after && m->naccepted >= m->fail_after ? "the test mask failed" : NULL;
}

static void tm_free(void *self)
{
    ((test_mask *)self)->frees++;
}

static const eng_mask_ops tm_ops = {.allowed = tm_allowed,
                                    .accept = tm_accept,
                                    .accepting = tm_accepting,
                                    .error = tm_error,
                                    .free = tm_free};

static eng_status submit_masked(eng_sched *s, rec *r, test_mask *m, size_t n_vocab,
                                size_t max_tokens, unsigned salt)
{
    int32_t p[8];
    prompt_of(p, 8, salt);
    eng_request q = {.prompt = p,
                     .nprompt = 8,
                     .max_tokens = max_tokens,
                     .sampling = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f},
                     .seed = salt,
                     .ignore_eos = 1,
                     .logprobs = 0,
                     .on_event = on_event,
                     .user = r};
    if (m != NULL) q.mask = (eng_mask){.ops = &tm_ops, .self = m, .n_vocab = n_vocab};
    char err[256];
    r->s = s;
    return eng_sched_submit(s, &q, &r->id, err, sizeof err);
}

/* An embedding request: prompt n tokens (salt), no tokens out. */
static eng_status submit_embed(eng_sched *s, rec *r, size_t n, unsigned salt)
{
    int32_t p[256];
    prompt_of(p, n, salt);
    eng_request q = {.prompt = p,
                     .nprompt = n,
                     .max_tokens = 0,
                     .logprobs = -1,
                     .embed = 1,
                     .on_event = on_event,
                     .user = r};
    char err[256];
    memset(r, 0, sizeof *r);
    r->s = s;
    return eng_sched_submit(s, &q, &r->id, err, sizeof err);
}

/* Embeddings: the same bits alone, chunked, beside decoding sequences and
 * other embeddings, after a completion cached the same prompt's blocks,
 * and with any thread count; length 1; no tokens; refusals; a cancelled
 * one ends without a vector. */
START_TEST(sched_embedding_same_bits_alone_batched_chunked_or_cached)
{
    static rec alone, other, chunked, beside, dec, cached_first, cached, lone1, cancel;
    eng_sched *s = make_sched(64, 8, 8, 256);
    ck_assert_int_eq(submit_embed(s, &alone, 100, 3), ENG_OK);
    ck_assert_int_eq(submit_embed(s, &other, 100, 4), ENG_OK);
    run_all(s);
    ck_assert(alone.has_emb && other.has_emb);
    ck_assert_uint_eq(alone.n, 0);
    ck_assert_int_eq(alone.finish, ENG_FINISH_LENGTH);
    double norm = 0, dot = 0;
    for (size_t e = 0; e < 64; e++) {
        norm += (double)alone.emb[e] * alone.emb[e];
        dot += (double)alone.emb[e] * other.emb[e];
    }
    ck_assert_double_eq_tol(norm, 1.0, 1e-5);
    ck_assert(dot < 0.9999); /* another prompt, another vector */
    assert_idle(s);
    eng_sched_free(s);

    /* Prefill chunks of 7 rows, beside a decoding sequence and another
     * embedding; then after a completion put the same prompt's blocks in
     * the cache (an embedding takes none). */
    s = make_sched(64, 8, 8, 7);
    submit(s, &dec, 20, 30, 5, 0.8f);
    ck_assert_int_eq(submit_embed(s, &chunked, 100, 3), ENG_OK);
    ck_assert_int_eq(submit_embed(s, &beside, 60, 9), ENG_OK);
    run_all(s);
    ck_assert(chunked.has_emb && beside.has_emb);
    ck_assert(memcmp(chunked.emb, alone.emb, sizeof alone.emb) == 0);
    submit(s, &cached_first, 100, 2, 3, 0.0f);
    run_all(s);
    ck_assert_int_eq(submit_embed(s, &cached, 100, 3), ENG_OK);
    run_all(s);
    ck_assert_uint_eq(cached.cached, 0);
    ck_assert(memcmp(cached.emb, alone.emb, sizeof alone.emb) == 0);
    assert_idle(s);
    eng_sched_free(s);

    /* One thread, one row a step. */
    s = make_sched_threads(64, 8, 8, 1, 1, 1);
    ck_assert_int_eq(submit_embed(s, &lone1, 100, 3), ENG_OK);
    run_all(s);
    ck_assert(memcmp(lone1.emb, alone.emb, sizeof alone.emb) == 0);

    /* It generates nothing: tokens, echo, logprobs or a mask are refused. */
    int32_t p[4] = {1, 2, 3, 4};
    eng_request bad = {.prompt = p,
                       .nprompt = 4,
                       .max_tokens = 1,
                       .logprobs = -1,
                       .embed = 1,
                       .on_event = on_event,
                       .user = &cancel};
    uint64_t id;
    char err[256];
    ck_assert_int_eq(eng_sched_submit(s, &bad, &id, err, sizeof err), ENG_EINVAL);
    bad.max_tokens = 0;
    bad.logprobs = 0;
    ck_assert_int_eq(eng_sched_submit(s, &bad, &id, err, sizeof err), ENG_EINVAL);
    /* Cancelled while its prompt is computed: DONE without a vector. */
    ck_assert_int_eq(submit_embed(s, &cancel, 100, 3), ENG_OK);
    ck_assert(eng_sched_step(s));
    eng_sched_cancel(s, cancel.id);
    run_all(s);
    ck_assert_int_eq(cancel.finish, ENG_FINISH_CANCELLED);
    ck_assert(!cancel.has_emb);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

START_TEST(sched_mask_constrains_its_sequence_only_and_is_freed_once)
{
    /* Alone, unmasked: the reference for the neighbour below. */
    eng_sched *s = make_sched(64, 8, 8, 64);
    static rec ref, masked, plain, stuck, failing, cancelled, queued;
    memset(&ref, 0, sizeof ref);
    ck_assert_int_eq(submit_masked(s, &ref, NULL, 0, 12, 5), ENG_OK);
    run_all(s);
    assert_idle(s);

    /* A masked sequence beside the same unmasked one: every token of the
     * masked one is allowed and was accepted in order; the neighbour's
     * tokens and logprobs are the reference's, bit for bit. */
    test_mask mk = {.rem = 3}, mst = {.rem = 1, .stuck_after = 4}, mf = {.rem = 2, .fail_after = 2};
    memset(&masked, 0, sizeof masked);
    memset(&plain, 0, sizeof plain);
    memset(&stuck, 0, sizeof stuck);
    memset(&failing, 0, sizeof failing);
    ck_assert_int_eq(submit_masked(s, &masked, &mk, 600, 12, 6), ENG_OK);
    ck_assert_int_eq(submit_masked(s, &plain, NULL, 0, 12, 5), ENG_OK);
    ck_assert_int_eq(submit_masked(s, &stuck, &mst, 600, 12, 7), ENG_OK);
    ck_assert_int_eq(submit_masked(s, &failing, &mf, 600, 12, 8), ENG_OK);
    run_all(s);
    ck_assert_uint_eq(masked.n, 12);
    ck_assert_int_eq(masked.finish, ENG_FINISH_LENGTH);
    ck_assert_uint_eq(mk.naccepted, 12);
    ck_assert_int_eq(mk.refused, 0);
    for (size_t k = 0; k < 12; k++) {
        ck_assert_int_eq(masked.tokens[k] % 7, 3);
        ck_assert_int_eq(mk.accepted[k], masked.tokens[k]);
    }
    ck_assert_int_eq(mk.frees, 1);
    ck_assert_uint_eq(plain.n, ref.n);
    for (size_t k = 0; k < ref.n; k++) {
        ck_assert_int_eq(plain.tokens[k], ref.tokens[k]);
        ck_assert(memcmp(&plain.logprobs[k], &ref.logprobs[k], sizeof(float)) == 0);
    }
    /* Nothing allowed: cut short as max_tokens cuts, no error. */
    ck_assert_uint_eq(stuck.n, 4);
    ck_assert_int_eq(stuck.finish, ENG_FINISH_LENGTH);
    ck_assert_int_eq(mst.frees, 1);
    /* A failing mask: an error with its message, counted. */
    ck_assert_uint_eq(failing.n, 2);
    ck_assert_int_eq(failing.finish, ENG_FINISH_ERROR);
    ck_assert_int_eq(mf.frees, 1);
    eng_sched_stats st;
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.mask_errors, 1);
    assert_idle(s);

    /* Refused at submit: the caller keeps the mask (not freed). */
    test_mask wrong = {.rem = 0};
    rec dummy = {0};
    ck_assert_int_eq(submit_masked(s, &dummy, &wrong, 599, 4, 9), ENG_EINVAL);
    ck_assert_int_eq(wrong.frees, 0);
    eng_mask_ops partial = tm_ops;
    partial.accepting = NULL;
    int32_t p1[1] = {1};
    eng_request q = {.prompt = p1,
                     .nprompt = 1,
                     .max_tokens = 1,
                     .logprobs = -1,
                     .mask = {.ops = &partial, .self = &wrong, .n_vocab = 600},
                     .on_event = on_event,
                     .user = &dummy};
    char err[256];
    uint64_t id;
    ck_assert_int_eq(eng_sched_submit(s, &q, &id, err, sizeof err), ENG_EINVAL);
    ck_assert_int_eq(wrong.frees, 0);

    /* Cancelled while waiting, and still queued when the scheduler is
     * freed: freed once each. */
    test_mask mc = {.rem = 4}, mq = {.rem = 5};
    memset(&cancelled, 0, sizeof cancelled);
    memset(&queued, 0, sizeof queued);
    ck_assert_int_eq(submit_masked(s, &cancelled, &mc, 600, 8, 10), ENG_OK);
    eng_sched_cancel(s, cancelled.id);
    ck_assert_int_eq(cancelled.finish, ENG_FINISH_CANCELLED);
    ck_assert_int_eq(mc.frees, 1);
    ck_assert_int_eq(submit_masked(s, &queued, &mq, 600, 8, 11), ENG_OK);
    eng_sched_free(s);
    ck_assert_int_eq(mq.frees, 1);
}
END_TEST

static void reference_lp(rec *r, const int32_t *p, size_t n, size_t max_tokens, uint64_t seed,
                         float temperature, int echo, int logprobs)
{
    eng_sched *s = make_sched_cache(64, 4, 16, 64, 0);
    memset(r, 0, sizeof *r);
    submit_lp(s, r, p, n, max_tokens, seed, temperature, echo, logprobs);
    run_all(s);
    ck_assert_uint_eq(r->done_count, 1);
    ck_assert_uint_eq(r->cached, 0);
    eng_sched_free(s);
}

static void reference(rec *r, const int32_t *p, size_t n, size_t max_tokens, uint64_t seed,
                      float temperature, int echo)
{
    reference_lp(r, p, n, max_tokens, seed, temperature, echo, 2);
}

/* Bit for bit the same tokens, logprobs and prompt logprobs. */
static void assert_same(const rec *got, const rec *want)
{
    ck_assert_uint_eq(got->done_count, 1);
    ck_assert_int_eq(got->finish, want->finish);
    ck_assert_uint_eq(got->n, want->n);
    ck_assert_mem_eq(got->tokens, want->tokens, want->n * sizeof(int32_t));
    ck_assert_mem_eq(got->logprobs, want->logprobs, want->n * sizeof(float));
    ck_assert_uint_eq(got->prompt_events, want->prompt_events);
    ck_assert_mem_eq(got->prompt_logprobs, want->prompt_logprobs, sizeof want->prompt_logprobs);
    ck_assert_mem_eq(got->prompt_ntop, want->prompt_ntop, sizeof want->prompt_ntop);
    ck_assert_mem_eq(got->prompt_top_id, want->prompt_top_id, sizeof want->prompt_top_id);
    ck_assert_mem_eq(got->prompt_top_lp, want->prompt_top_lp, sizeof want->prompt_top_lp);
}

/* The warm-up leaves no trace: every block back in the pool, no step, no
 * time and no prefix-cache entry counted, and a request after it gives the
 * bits it gives on a scheduler never warmed (the cache on, so a block the
 * warm-up had registered would show as cached tokens). */
START_TEST(sched_warmup_leaves_no_trace)
{
    int32_t p[40];
    prompt_of(p, 40, 7);
    rec want;
    reference(&want, p, 40, 12, 5, 0.8f, 0);
    eng_sched *s = make_sched(64, 4, 16, 64);
    eng_sched_stats before, after;
    eng_sched_stats_get(s, &before);
    char err[256];
    ck_assert_msg(eng_sched_warmup(s, err, sizeof err) == ENG_OK, "%s", err);
    eng_sched_stats_get(s, &after);
    ck_assert_uint_eq(after.kv_blocks_used, 0);
    ck_assert_uint_eq(after.kv_blocks_cached, 0);
    ck_assert_uint_eq(after.kv_blocks_total, before.kv_blocks_total);
    ck_assert_uint_eq(after.steps, 0);
    ck_assert(after.times.matmul == 0 && after.times.lm_head == 0);
    rec got = {0};
    submit_ids(s, &got, p, 40, 12, 5, 0.8f, 0);
    run_all(s);
    assert_same(&got, &want);
    ck_assert_uint_eq(got.cached, 0);
    eng_sched_stats_get(s, &after);
    ck_assert_uint_eq(after.steps, 12); /* the prefill with the first token, 11 decodes */
    assert_idle(s);
    eng_sched_free(s);
    /* One prompt row a step, one sequence: the warm-up fits the workspace. */
    s = make_sched(1, 1, 1, 1);
    ck_assert_msg(eng_sched_warmup(s, err, sizeof err) == ENG_OK, "%s", err);
    assert_idle(s);
    eng_sched_free(s);
    /* A pool of one position: no warm-up, and no error. */
    eng_sched_opts o = {.kv_bytes = block_bytes() / 16, .block_len = 1};
    ck_assert_msg(eng_sched_new(model, &o, &s, err, sizeof err) == ENG_OK, "%s", err);
    ck_assert_uint_eq(eng_kv_blocks_total(sch_kv(s)), 1);
    ck_assert_msg(eng_sched_warmup(s, err, sizeof err) == ENG_OK, "%s", err);
    eng_sched_stats_get(s, &after);
    ck_assert_uint_eq(after.steps, 0);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

START_TEST(sched_prefix_cache_same_bits_cached_partly_cached_or_not)
{
    int32_t p[150];
    prompt_of(p, 150, 21);
    static rec ref, ref_echo, warm, part, full, echo;
    reference(&ref, p, 150, 20, 5, 0.8f, 0);
    reference(&ref_echo, p, 150, 5, 5, 0.0f, 1);
    memset(&warm, 0, sizeof warm);
    memset(&part, 0, sizeof part);
    memset(&full, 0, sizeof full);
    memset(&echo, 0, sizeof echo);
    /* Chunks of 40 rows: blocks are completed across chunk boundaries. */
    eng_sched *s = make_sched(64, 4, 16, 40);
    submit_ids(s, &warm, p, 100, 3, 1, 0.0f, 0); /* the first 100 tokens */
    run_all(s);
    ck_assert_uint_eq(warm.cached, 0);
    submit_ids(s, &part, p, 150, 20, 5, 0.8f, 0);
    run_all(s);
    ck_assert_uint_eq(part.cached, 96); /* warm's 6 full blocks */
    assert_same(&part, &ref);
    submit_ids(s, &full, p, 150, 20, 5, 0.8f, 0);
    run_all(s);
    ck_assert_uint_eq(full.cached, 144); /* all but the block of the last token */
    assert_same(&full, &ref);
    /* echo needs every prompt position's logprobs, which the blocks of
     * requests without echo do not keep: computed, the same bits. */
    submit_ids(s, &echo, p, 150, 5, 5, 0.0f, 1);
    run_all(s);
    ck_assert_uint_eq(echo.cached, 0);
    assert_same(&echo, &ref_echo);
    eng_sched_stats st;
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.prefix_lookups, 4);
    ck_assert_uint_eq(st.prefix_hit_tokens, 96 + 144);
    ck_assert_uint_gt(st.kv_blocks_cached, 0);
    ck_assert_uint_eq(st.prefix_evictions, 0);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

START_TEST(sched_prefix_cache_same_bits_batched_with_shared_prefixes)
{
    /* Eight prompts that begin with the same 80 tokens (two of them
     * identical, as the choices of n = 2), six unrelated ones beside them,
     * all submitted at once, twice. */
    enum { NP = 8, NN = 6 };
    static int32_t p[NP][160];
    static size_t len[NP];
    static rec ref[NP], got[NP], again[NP], noise[NN];
    for (unsigned i = 0; i < NP; i++) {
        prompt_of(p[i], 80, 31);
        unsigned salt = i == 7 ? 40 + 6 : 40 + i; /* 7 repeats 6's suffix */
        len[i] = 80 + 5 + (i == 7 ? 6 : i) * 11;
        prompt_of(p[i] + 80, len[i] - 80, salt);
        reference(&ref[i], p[i], len[i], 15, 50 + i, i % 2 ? 0.8f : 0.0f, 0);
    }
    memset(got, 0, sizeof got);
    memset(again, 0, sizeof again);
    memset(noise, 0, sizeof noise);
    eng_sched *s = make_sched(160, 16, 64, 64);
    driver d = {.s = s};
    ck_assert_int_eq(uv_loop_init(&d.loop), 0);
    for (unsigned i = 0; i < NN; i++) submit(s, &noise[i], 3 + i * 19, 25, 70 + i, 1.0f);
    for (unsigned i = 0; i < NP; i++)
        submit_ids(s, &got[i], p[i], len[i], 15, 50 + i, i % 2 ? 0.8f : 0.0f, 0);
    drive(&d);
    for (unsigned i = 0; i < NP; i++) {
        assert_same(&got[i], &ref[i]);
        /* The first computes the shared 80 tokens, the others wait for them. */
        if (i > 0) ck_assert_uint_ge(got[i].cached, 80);
    }
    ck_assert_uint_eq(got[0].cached, 0);
    ck_assert_uint_eq(got[7].cached, (len[7] - 1) / 16 * 16); /* 6's whole prompt */
    for (unsigned i = 0; i < NN; i++) ck_assert_uint_eq(noise[i].done_count, 1);
    for (unsigned i = 0; i < NP; i++)
        submit_ids(s, &again[i], p[i], len[i], 15, 50 + i, i % 2 ? 0.8f : 0.0f, 0);
    drive(&d);
    for (unsigned i = 0; i < NP; i++) {
        assert_same(&again[i], &ref[i]);
        ck_assert_uint_eq(again[i].cached, (len[i] - 1) / 16 * 16);
    }
    assert_idle(s);
    eng_sched_free(s);
    ck_assert_int_eq(uv_loop_close(&d.loop), 0);
}
END_TEST

START_TEST(sched_prefix_cache_choices_of_one_prompt_compute_it_once)
{
    int32_t p[100];
    prompt_of(p, 100, 33);
    static rec ref[4], got[4];
    memset(got, 0, sizeof got);
    for (unsigned i = 0; i < 4; i++) reference(&ref[i], p, 100, 10, 900 + i, 1.0f, 0);
    eng_sched *s = make_sched(64, 8, 16, 512);
    for (unsigned i = 0; i < 4; i++) submit_ids(s, &got[i], p, 100, 10, 900 + i, 1.0f, 0);
    run_all(s);
    size_t computed = 0;
    for (unsigned i = 0; i < 4; i++) {
        assert_same(&got[i], &ref[i]);
        computed += 100 - got[i].cached;
    }
    /* The 96 tokens of the full blocks once; the last 4 by each choice. */
    ck_assert_uint_eq(computed, 96 + 4 * 4);
    eng_sched_stats st;
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.prefix_hit_tokens, 3 * 96);
    /* Only the positions a step ran count as computed; every token counts. */
    ck_assert_uint_eq(st.prompt_computed, 96 + 4 * 4);
    ck_assert_uint_eq(st.tokens_generated, 4 * 10);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

/* The token counters move with the steps, not when requests end: after
 * each step they equal what the callbacks have been given so far (the
 * server's periodic info line takes its rates from them). */
START_TEST(sched_stats_count_tokens_as_steps_deliver_them)
{
    eng_sched *s = make_sched_cache(64, 4, 16, 16, 0);
    static rec r[2];
    memset(r, 0, sizeof r);
    submit(s, &r[0], 40, 30, 5, 0.8f);
    submit(s, &r[1], 7, 30, 6, 0.8f);
    size_t steps = 0;
    eng_sched_stats st;
    while (eng_sched_step(s)) {
        steps++;
        eng_sched_stats_get(s, &st);
        ck_assert_uint_eq(st.tokens_generated, r[0].n + r[1].n);
        /* 16 prompt positions a step (step_tokens) until both prompts are in */
        ck_assert_uint_le(st.prompt_computed, 47);
    }
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.prompt_computed, 47);
    ck_assert_uint_eq(st.tokens_generated, 60);
    ck_assert_uint_gt(steps, 30);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

START_TEST(sched_prefix_cache_evicts_under_pressure_and_admits_everything)
{
    /* 12 blocks; each request needs 5 (60 prompt + 20 generated), so at
     * most two run at once, and ten prefixes (each asked four times) cannot
     * all stay cached. */
    enum { NR = 40 };
    static int32_t p[NR][60];
    static rec ref[NR], got[NR], big_ref, big;
    for (unsigned i = 0; i < NR; i++) {
        /* Round robin over the ten first (least recently used is always
         * gone), then in pairs (the second finds the first's blocks). */
        prompt_of(p[i], 60, 200 + (i < 20 ? i % 10 : (i / 2) % 10));
        reference(&ref[i], p[i], 60, 20, i, 0.8f, 0);
    }
    memset(got, 0, sizeof got);
    memset(&big, 0, sizeof big);
    eng_sched *s = make_sched(12, 8, 64, 64);
    driver d = {.s = s};
    ck_assert_int_eq(uv_loop_init(&d.loop), 0);
    for (unsigned i = 0; i < NR; i++) submit_ids(s, &got[i], p[i], 60, 20, i, 0.8f, 0);
    drive(&d);
    size_t hits = 0;
    for (unsigned i = 0; i < NR; i++) {
        assert_same(&got[i], &ref[i]);
        hits += got[i].cached > 0;
    }
    eng_sched_stats st;
    eng_sched_stats_get(s, &st);
    ck_assert_uint_gt(hits, 0);
    ck_assert_uint_gt(st.prefix_evictions, 0);
    ck_assert_uint_le(st.kv_blocks_cached, 12);
    ck_assert_uint_gt(st.kv_blocks_cached, 0);
    assert_idle(s); /* cached blocks count as free */
    /* A request that needs the whole pool still fits: the cache gives way. */
    int32_t q[150];
    prompt_of(q, 150, 77);
    reference(&big_ref, q, 150, 42, 3, 0.8f, 0);
    submit_ids(s, &big, q, 150, 42, 3, 0.8f, 0);
    drive(&d);
    assert_same(&big, &big_ref);
    assert_idle(s);
    eng_sched_free(s);
    ck_assert_int_eq(uv_loop_close(&d.loop), 0);
}
END_TEST

START_TEST(sched_prefix_cache_hash_collisions_never_share_different_prefixes)
{
    /* Every hash 0: only the token and parent comparisons tell blocks
     * apart. b differs from a in its first token only, so its later blocks
     * hold the same tokens as a's, after a different prefix. */
    int32_t a[50], b[50];
    prompt_of(a, 50, 61);
    memcpy(b, a, sizeof a);
    b[0] = (a[0] + 1) % 600;
    static rec ref_a, ref_b, got_a, got_b, again_a, again_b;
    reference(&ref_a, a, 50, 12, 8, 0.8f, 0);
    reference(&ref_b, b, 50, 12, 8, 0.8f, 0);
    memset(&got_a, 0, sizeof got_a);
    memset(&got_b, 0, sizeof got_b);
    memset(&again_a, 0, sizeof again_a);
    memset(&again_b, 0, sizeof again_b);
    eng_sched *s = make_sched(64, 4, 16, 64);
    sch_kv(s)->hash_mask = 0;
    submit_ids(s, &got_a, a, 50, 12, 8, 0.8f, 0);
    run_all(s);
    submit_ids(s, &got_b, b, 50, 12, 8, 0.8f, 0);
    run_all(s);
    ck_assert_uint_eq(got_b.cached, 0);
    assert_same(&got_a, &ref_a);
    assert_same(&got_b, &ref_b);
    /* Both chains are cached side by side, in one bucket. */
    submit_ids(s, &again_a, a, 50, 12, 8, 0.8f, 0);
    submit_ids(s, &again_b, b, 50, 12, 8, 0.8f, 0);
    run_all(s);
    ck_assert_uint_eq(again_a.cached, 48);
    ck_assert_uint_eq(again_b.cached, 48);
    assert_same(&again_a, &ref_a);
    assert_same(&again_b, &ref_b);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

START_TEST(sched_prefix_cache_echo_takes_stored_prompt_logprobs)
{
    /* p: 100 tokens (6 full blocks); t: p's first 60, then others. */
    int32_t p[100], t[100];
    prompt_of(p, 100, 41);
    memcpy(t, p, 60 * sizeof *t);
    prompt_of(t + 60, 40, 42);
    static rec ref3, ref1, ref_t, plain, a, b, c, d;
    reference_lp(&ref3, p, 100, 0, 1, 0.0f, 1, 3);
    reference_lp(&ref1, p, 100, 4, 7, 0.8f, 1, 1);
    reference_lp(&ref_t, t, 100, 0, 1, 0.0f, 1, 5);
    rec *all[] = {&plain, &a, &b, &c, &d};
    for (size_t i = 0; i < 5; i++) memset(all[i], 0, sizeof *all[i]);
    eng_sched *s = make_sched(64, 4, 16, 40);
    /* Without echo: blocks without logprobs; echo finds none of them. */
    submit_lp(s, &plain, p, 100, 4, 7, 0.8f, 0, 1);
    run_all(s);
    submit_lp(s, &a, p, 100, 0, 1, 0.0f, 1, 3);
    run_all(s);
    ck_assert_uint_eq(a.cached, 0);
    assert_same(&a, &ref3);
    /* a left its logprobs with the blocks: the next echo takes five of the
     * six (the sixth's first position is the logprob the fifth's last row
     * gives), and computes from there. */
    submit_lp(s, &b, p, 100, 0, 1, 0.0f, 1, 3);
    run_all(s);
    ck_assert_uint_eq(b.cached, 80);
    ck_assert_uint_eq(b.prompt_events, 99);
    assert_same(&b, &ref3);
    /* Fewer alternatives asked, and tokens generated after the prompt. */
    submit_lp(s, &c, p, 100, 4, 7, 0.8f, 1, 1);
    run_all(s);
    ck_assert_uint_eq(c.cached, 80);
    assert_same(&c, &ref1);
    ck_assert_mem_eq(c.tokens, plain.tokens, 4 * sizeof(int32_t));
    /* A prompt that shares 3 blocks and 12 tokens: 2 blocks taken. */
    submit_lp(s, &d, t, 100, 0, 1, 0.0f, 1, 5);
    run_all(s);
    ck_assert_uint_eq(d.cached, 32);
    assert_same(&d, &ref_t);
    eng_sched_stats st;
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.prefix_hit_tokens, 80 + 80 + 32);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

START_TEST(sched_prefix_cache_echo_batch_of_continuations_shares_the_context)
{
    /* Scoring continuations of one 64-token context, submitted together as
     * an evaluation harness does (one request, a list of prompts): the
     * first computes the context, the others wait for its blocks and take
     * all but the one whose last row predicts their own continuation. The
     * second is the first again (n = 2): it waits for the first's fifth
     * block too, which the first computes in its second chunk. */
    enum { NC = 5 };
    static int32_t p[NC][84];
    static rec ref[NC], got[NC];
    memset(got, 0, sizeof got);
    for (unsigned i = 0; i < NC; i++) {
        prompt_of(p[i], 64, 51);
        prompt_of(p[i] + 64, 20, 60 + (i == 1 ? 0 : i));
        reference_lp(&ref[i], p[i], 84, 0, 1, 0.0f, 1, 2);
    }
    eng_sched *s = make_sched(64, 8, 16, 64);
    for (unsigned i = 0; i < NC; i++) submit_lp(s, &got[i], p[i], 84, 0, 1, 0.0f, 1, 2);
    run_all(s);
    for (unsigned i = 0; i < NC; i++) {
        assert_same(&got[i], &ref[i]);
        ck_assert_uint_eq(got[i].prompt_events, 83);
    }
    ck_assert_uint_eq(got[0].cached, 0);
    ck_assert_uint_eq(got[1].cached, 64);
    for (unsigned i = 2; i < NC; i++) ck_assert_uint_eq(got[i].cached, 48);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

START_TEST(sched_prefix_cache_whole_block_prompts_still_compute_their_last_token)
{
    /* 16-token blocks. A 40-token prompt seen before takes its 2 full
     * blocks (32 tokens) and computes the 8 of its partial one. A 64-token
     * prompt is 4 whole blocks, but its last token's row must be computed
     * for the logits that sample the first token: at most 3 are taken. A
     * 16-token prompt never takes any (no lookup either). */
    int32_t p[64];
    prompt_of(p, 64, 91);
    static rec ref40, ref64, ref16, ref_echo, r[6], echo1, echo2;
    reference(&ref40, p, 40, 6, 4, 0.8f, 0);
    reference(&ref64, p, 64, 6, 4, 0.8f, 0);
    reference(&ref16, p, 16, 6, 4, 0.8f, 0);
    reference_lp(&ref_echo, p, 64, 0, 1, 0.0f, 1, 2);
    memset(r, 0, sizeof r);
    memset(&echo1, 0, sizeof echo1);
    memset(&echo2, 0, sizeof echo2);
    eng_sched *s = make_sched(64, 4, 16, 64);
    const size_t n[6] = {40, 40, 64, 64, 16, 16};
    /* The second 40: blocks 0-1 (the first's 45 positions hold 2 full
     * blocks); the first 64: the same 2; the second 64: blocks 0-2. */
    const size_t want[6] = {0, 32, 32, 48, 0, 0};
    const rec *refs[6] = {&ref40, &ref40, &ref64, &ref64, &ref16, &ref16};
    for (size_t i = 0; i < 6; i++) {
        submit_ids(s, &r[i], p, n[i], 6, 4, 0.8f, 0);
        run_all(s);
        ck_assert_msg(r[i].cached == want[i], "request %zu: cached %zu, want %zu", i, r[i].cached,
                      want[i]);
        assert_same(&r[i], refs[i]);
    }
    /* max_tokens 0 with echo: the first finds blocks without logprobs and
     * computes all 64 rows; the second takes blocks 0-1 (block 2's last row
     * predicts position 48, which block 3 keeps, but block 3 holds the last
     * token), and gets the same 63 prompt logprobs. */
    submit_lp(s, &echo1, p, 64, 0, 1, 0.0f, 1, 2);
    run_all(s);
    submit_lp(s, &echo2, p, 64, 0, 1, 0.0f, 1, 2);
    run_all(s);
    ck_assert_uint_eq(echo1.cached, 0);
    ck_assert_uint_eq(echo2.cached, 32);
    ck_assert_uint_eq(echo2.prompt_events, 63);
    ck_assert_uint_eq(echo2.n, 0);
    assert_same(&echo1, &ref_echo);
    assert_same(&echo2, &ref_echo);
    eng_sched_stats st;
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.prefix_lookups, 6); /* not the 16-token prompts */
    ck_assert_uint_eq(st.prefix_hit_tokens, 32 + 32 + 48 + 32);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

START_TEST(sched_prefix_cache_same_bits_with_any_thread_count)
{
    /* Four prompts sharing their first 70 tokens, a 50-token part of it
     * seen before, batched, on 1 and 3 worker threads; the references ran
     * alone on 2 threads without the cache. */
    enum { NQ = 4 };
    static int32_t p[NQ][120];
    static rec ref[NQ], got[NQ], warm;
    for (unsigned i = 0; i < NQ; i++) {
        prompt_of(p[i], 70, 95);
        prompt_of(p[i] + 70, 20 + 10 * i, 96 + i);
        reference(&ref[i], p[i], 90 + 10 * i, 12, 20 + i, i % 2 ? 0.8f : 0.0f, 0);
    }
    const size_t threads[2] = {1, 3};
    for (size_t t = 0; t < 2; t++) {
        memset(got, 0, sizeof got);
        memset(&warm, 0, sizeof warm);
        eng_sched *s = make_sched_threads(64, 8, 16, 48, 1, threads[t]);
        submit_ids(s, &warm, p[0], 50, 3, 1, 0.0f, 0); /* 52 positions: 3 blocks */
        run_all(s);
        for (unsigned i = 0; i < NQ; i++)
            submit_ids(s, &got[i], p[i], 90 + 10 * i, 12, 20 + i, i % 2 ? 0.8f : 0.0f, 0);
        run_all(s);
        for (unsigned i = 0; i < NQ; i++) {
            assert_same(&got[i], &ref[i]);
            /* The first takes warm's 3 blocks and computes block 3 (tokens
             * 48-63, shared); the others wait a step and take it too. */
            ck_assert_uint_eq(got[i].cached, i == 0 ? 48 : 64);
        }
        assert_idle(s);
        eng_sched_free(s);
    }
}
END_TEST

START_TEST(sched_prefix_cache_full_pool_of_cached_blocks_gives_way_lru_first)
{
    /* 12 blocks. Three 64-token prompts scored without echo (max_tokens 0)
     * leave 4 registered blocks each: every block cached, none free. */
    static int32_t p[4][64];
    for (unsigned i = 0; i < 4; i++) prompt_of(p[i], 64, 300 + i);
    static rec fill[3], r[5], big_ref, big, other_ref, other;
    memset(fill, 0, sizeof fill);
    memset(r, 0, sizeof r);
    memset(&big, 0, sizeof big);
    memset(&other, 0, sizeof other);
    eng_sched *s = make_sched(12, 4, 16, 64);
    eng_kv *kv = sch_kv(s);
    eng_sched_stats st;
    for (unsigned i = 0; i < 3; i++) {
        submit_ids(s, &fill[i], p[i], 64, 0, 1, 0.0f, 0);
        run_all(s);
    }
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.kv_blocks_cached, 12);
    ck_assert_uint_eq(kv->nfree, 0);
    ck_assert_uint_eq(st.prefix_evictions, 0);
    assert_idle(s); /* cached blocks nobody holds count as free */
    /* Least recently used first: p0 again (3 blocks taken; its 4th, the
     * list's head, evicted for the fresh block it computes), then a new
     * prompt (p1's 4 go), then p2 and p0 (each evicts its own 4th), then
     * p1, which is gone (p3's 4 go). */
    const unsigned which[5] = {0, 3, 2, 0, 1};
    const size_t want_cached[5] = {48, 0, 48, 48, 0};
    const uint64_t want_evictions[5] = {1, 5, 6, 7, 11};
    for (unsigned k = 0; k < 5; k++) {
        submit_ids(s, &r[k], p[which[k]], 64, 0, 1, 0.0f, 0);
        run_all(s);
        eng_sched_stats_get(s, &st);
        ck_assert_msg(r[k].done_count == 1 && r[k].cached == want_cached[k],
                      "request %u (p%u): cached %zu, want %zu", k, which[k], r[k].cached,
                      want_cached[k]);
        ck_assert_uint_eq(st.prefix_evictions, want_evictions[k]);
        ck_assert_uint_eq(st.kv_blocks_cached, 12);
    }
    /* A request that needs the whole pool (150 + 42 positions, 12 blocks)
     * and shares p0's first 32 tokens: it holds those 2 blocks and evicts
     * the other 10, with the same bits as without a cache. */
    int32_t q[150];
    memcpy(q, p[0], 32 * sizeof *q);
    prompt_of(q + 32, 118, 310);
    reference(&big_ref, q, 150, 42, 3, 0.8f, 0);
    submit_ids(s, &big, q, 150, 42, 3, 0.8f, 0);
    run_all(s);
    ck_assert_uint_eq(big.cached, 32);
    assert_same(&big, &big_ref);
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.prefix_evictions, 11 + 10);
    /* Another whole-pool request, nothing shared: 11 registered blocks of
     * the last one (191 positions written) evicted, the free one taken. */
    int32_t o[150];
    prompt_of(o, 150, 311);
    reference(&other_ref, o, 150, 42, 4, 0.8f, 0);
    submit_ids(s, &other, o, 150, 42, 4, 0.8f, 0);
    run_all(s);
    ck_assert_uint_eq(other.cached, 0);
    assert_same(&other, &other_ref);
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.prefix_evictions, 11 + 10 + 11);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

/* a and b share their first 80 tokens; submitted together with 16 prompt
 * rows a step, a computes them and b waits for each block (the case an
 * HTTP request's choices, or concurrent clients, are in). mode: what
 * happens to a (or b) after the first step. */
enum { PRODUCER_PAUSED, PRODUCER_CANCELLED, PRODUCER_CANCELLED_IN_STEP, WAITER_CANCELLED };

static void producer_case(int mode)
{
    int32_t pa[100], pb[100];
    prompt_of(pa, 100, 81);
    memcpy(pb, pa, 80 * sizeof *pb);
    prompt_of(pb + 80, 20, 82);
    static rec ref_a, ref_b, a, b;
    reference(&ref_a, pa, 100, 8, 1, 0.8f, 0);
    reference(&ref_b, pb, 100, 8, 2, 0.8f, 0);
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    eng_sched *s = make_sched(64, 4, 16, 16);
    submit_ids(s, &a, pa, 100, 8, 1, 0.8f, 0);
    submit_ids(s, &b, pb, 100, 8, 2, 0.8f, 0);
    ck_assert(eng_sched_step(s)); /* a: block 0; b waits for it */
    ck_assert(eng_sched_plan(s)); /* a: block 1; b took block 0, waits for 1 */
    if (mode == PRODUCER_CANCELLED_IN_STEP) eng_sched_cancel(s, a.id); /* marked */
    eng_sched_execute(s);
    eng_sched_complete(s);
    if (mode == PRODUCER_PAUSED) eng_sched_pause(s, a.id, 1);
    if (mode == PRODUCER_CANCELLED) eng_sched_cancel(s, a.id);
    if (mode == WAITER_CANCELLED) eng_sched_cancel(s, b.id);
    run_all(s);
    if (mode == WAITER_CANCELLED) {
        ck_assert_uint_eq(b.finish, ENG_FINISH_CANCELLED);
        assert_same(&a, &ref_a);
        ck_assert_uint_eq(a.cached, 0);
    } else {
        /* b goes on alone: blocks 0-1 from a (block 1 only if a's step
         * completed), the rest computed, the same bits. */
        assert_same(&b, &ref_b);
        ck_assert_uint_eq(b.cached, mode == PRODUCER_CANCELLED_IN_STEP ? 16 : 32);
    }
    if (mode == PRODUCER_PAUSED) {
        ck_assert_uint_eq(a.done_count, 0);
        eng_sched_pause(s, a.id, 0);
        run_all(s);
        assert_same(&a, &ref_a);
        ck_assert_uint_eq(a.cached, 48); /* b's blocks 2-4 */
    } else if (mode != WAITER_CANCELLED) {
        ck_assert_uint_eq(a.done_count, 1);
        ck_assert_uint_eq(a.finish, ENG_FINISH_CANCELLED);
    }
    assert_idle(s);
    eng_sched_free(s);
}

START_TEST(sched_prefix_cache_waiter_goes_on_when_the_producer_pauses)
{
    producer_case(PRODUCER_PAUSED);
}
END_TEST

START_TEST(sched_prefix_cache_waiter_goes_on_when_the_producer_is_cancelled)
{
    producer_case(PRODUCER_CANCELLED);
}
END_TEST

START_TEST(sched_prefix_cache_producer_cancelled_mid_step_leaves_no_half_block)
{
    producer_case(PRODUCER_CANCELLED_IN_STEP);
}
END_TEST

START_TEST(sched_prefix_cache_waiter_cancelled_leaves_the_producer_alone)
{
    producer_case(WAITER_CANCELLED);
}
END_TEST

START_TEST(sched_prefix_cache_sharers_never_write_into_shared_blocks)
{
    /* A 100-token prompt run once leaves 6 registered blocks (102 positions
     * written). Four requests that continue it differently, batched, hold
     * them while they prefill their tails and decode: the blocks' KV bytes
     * stay as they were, and they were held by all four at once. */
    enum { NS = 4 };
    static int32_t p[NS][140];
    static rec warm, got[NS], ref[NS];
    memset(&warm, 0, sizeof warm);
    memset(got, 0, sizeof got);
    for (unsigned i = 0; i < NS; i++) {
        prompt_of(p[i], 100, 71);
        prompt_of(p[i] + 100, 40, 72 + i);
        reference(&ref[i], p[i], 140, 20, 30 + i, 0.8f, 0);
    }
    eng_sched *s = make_sched(64, 8, 16, 64);
    eng_kv *kv = sch_kv(s);
    submit_ids(s, &warm, p[0], 100, 3, 1, 0.0f, 0);
    run_all(s);
    ck_assert_uint_eq(kv->nregistered, 6);
    int32_t shared[6];
    size_t floats = kv->L * 2 * kv->NH * kv->block_len * kv->HS; /* one block's */
    float *before = malloc(6 * floats * sizeof *before);
    ck_assert_ptr_nonnull(before);
    size_t n = 0;
    for (int32_t b = 0; b < (int32_t)kv->nblocks; b++)
        if (kv->meta[b].registered) {
            shared[n] = b;
            memcpy(before + n * floats, kv->pool + (size_t)b * floats, floats * sizeof *before);
            n++;
        }
    ck_assert_uint_eq(n, 6);
    /* Read-only while they run: a write into one, even of the same bits,
     * faults (the test dies with SIGSEGV). A block is 16 KiB, whole 4 KiB
     * pages; with larger pages only the bytes are compared (said below). */
    size_t bytes = floats * sizeof(float), page = (size_t)sysconf(_SC_PAGESIZE);
    int guard = bytes % page == 0;
    if (!guard)
        fprintf(stderr, "sharers test: %zu-byte pages, larger than a block: bytes compared only\n",
                page);
    for (size_t k = 0; guard && k < n; k++)
        ck_assert_int_eq(mprotect(kv->pool + (size_t)shared[k] * floats, bytes, PROT_READ), 0);
    for (unsigned i = 0; i < NS; i++) submit_ids(s, &got[i], p[i], 140, 20, 30 + i, 0.8f, 0);
    int32_t most_refs = 0;
    while (eng_sched_step(s))
        for (size_t k = 0; k < n; k++)
            if (kv->meta[shared[k]].ref > most_refs) most_refs = kv->meta[shared[k]].ref;
    for (size_t k = 0; guard && k < n; k++)
        ck_assert_int_eq(
            mprotect(kv->pool + (size_t)shared[k] * floats, bytes, PROT_READ | PROT_WRITE), 0);
    ck_assert_int_eq(most_refs, NS);
    for (size_t k = 0; k < n; k++) {
        ck_assert(kv->meta[shared[k]].registered);
        ck_assert_mem_eq(kv->pool + (size_t)shared[k] * floats, before + k * floats,
                         floats * sizeof *before);
    }
    for (unsigned i = 0; i < NS; i++) {
        assert_same(&got[i], &ref[i]);
        ck_assert_uint_eq(got[i].cached, 96);
    }
    free(before);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

START_TEST(sched_prefix_cache_admission_reserves_only_the_blocks_past_the_hit)
{
    /* 7 blocks. p runs a 64-token prompt with 16 tokens to generate (5
     * blocks); after its prefill, q with the same prompt needs 5 blocks too,
     * but 3 of them are p's (held, registered): it reserves the 2 free ones
     * and runs beside p. Without the cache q waits until p is done. */
    int32_t p[64];
    prompt_of(p, 64, 97);
    static rec ref_a, ref_b, a, b;
    reference(&ref_a, p, 64, 16, 1, 0.8f, 0);
    reference(&ref_b, p, 64, 16, 2, 0.8f, 0);
    for (int cache = 1; cache >= 0; cache--) {
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        eng_sched *s = make_sched_cache(7, 4, 16, 64, cache);
        submit_ids(s, &a, p, 64, 16, 1, 0.8f, 0);
        ck_assert(eng_sched_step(s)); /* a's prefill and first token */
        submit_ids(s, &b, p, 64, 16, 2, 0.8f, 0);
        ck_assert(eng_sched_step(s));
        eng_sched_stats st;
        eng_sched_stats_get(s, &st);
        ck_assert_uint_eq(st.running, cache ? 2 : 1);
        ck_assert_uint_eq(st.queued, cache ? 0 : 1);
        /* With the cache: p's 5, and q's 2 less the one it gave back when
         * the block of its last token, computed, turned out to be p's. */
        ck_assert_uint_eq(st.kv_blocks_used, cache ? 6 : 5);
        run_all(s);
        assert_same(&a, &ref_a);
        assert_same(&b, &ref_b);
        ck_assert_uint_eq(b.cached, cache ? 48 : 0);
        assert_idle(s);
        eng_sched_free(s);
    }
}
END_TEST

/* Submits prompt p[0..n) in the prefix cache's partition salt. */
static void submit_salted(eng_sched *s, rec *r, const int32_t *p, size_t n, size_t max_tokens,
                          uint64_t seed, uint64_t salt)
{
    eng_request q = {.prompt = p,
                     .nprompt = n,
                     .max_tokens = max_tokens,
                     .sampling = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f},
                     .seed = seed,
                     .ignore_eos = 1,
                     .logprobs = 2,
                     .cache_salt = salt,
                     .on_event = on_event,
                     .user = r};
    char err[256];
    memset(r, 0, sizeof *r);
    r->s = s;
    ck_assert_msg(eng_sched_submit(s, &q, &r->id, err, sizeof err) == ENG_OK, "%s", err);
}

/* Issue 24: two tenants (salts) never share a cached block, one after the
 * other or at once, even when every hash collides; the same salt does; and
 * the bits are those of a cold run whichever way. */
START_TEST(sched_prefix_cache_salts_partition_the_cache)
{
    int32_t p[100];
    prompt_of(p, 100, 111);
    static rec ref, a, b, a2, b2, none, x, y;
    reference(&ref, p, 100, 10, 4, 0.8f, 0);
    const uint64_t A = UINT64_C(0x1234567890abcdef), B = A + 1;
    for (int collide = 0; collide <= 1; collide++) {
        eng_sched *s = make_sched(64, 4, 16, 64);
        if (collide) sch_kv(s)->hash_mask = 0; /* only the salt tells A from B */
        submit_salted(s, &a, p, 100, 10, 4, A);
        run_all(s);
        submit_salted(s, &b, p, 100, 10, 4, B); /* A's prompt is cached; B's is not */
        run_all(s);
        submit_salted(s, &none, p, 100, 10, 4, 0); /* nor the unsalted one's */
        run_all(s);
        submit_salted(s, &a2, p, 100, 10, 4, A);
        submit_salted(s, &b2, p, 100, 10, 4, B);
        run_all(s);
        ck_assert_uint_eq(a.cached, 0);
        ck_assert_uint_eq(b.cached, 0);
        ck_assert_uint_eq(none.cached, 0);
        ck_assert_uint_eq(a2.cached, 96); /* each its own six full blocks */
        ck_assert_uint_eq(b2.cached, 96);
        rec *all[] = {&a, &b, &none, &a2, &b2};
        for (size_t i = 0; i < 5; i++) assert_same(all[i], &ref);
        eng_sched_stats st;
        eng_sched_stats_get(s, &st);
        ck_assert_uint_eq(st.prefix_hit_tokens, 2 * 96);
        ck_assert_uint_eq(st.kv_blocks_cached, 3 * 6); /* A's, B's and the unsalted chain */
        assert_idle(s);
        eng_sched_free(s);
    }
    /* At once, on a cold cache: a later sequence of another salt neither
     * waits for an earlier one's prompt blocks nor takes them when they are
     * done (both compute all of it); one of the same salt does. */
    int32_t q[100];
    prompt_of(q, 100, 112);
    static rec ref_q;
    reference(&ref_q, q, 100, 10, 4, 0.8f, 0);
    eng_sched *s = make_sched(64, 4, 16, 32); /* 32-row chunks: four steps of prefill */
    submit_salted(s, &x, q, 100, 10, 4, A);
    submit_salted(s, &y, q, 100, 10, 4, B);
    run_all(s);
    ck_assert_uint_eq(x.cached, 0);
    ck_assert_uint_eq(y.cached, 0);
    assert_same(&x, &ref_q);
    assert_same(&y, &ref_q);
    submit_salted(s, &x, q, 100, 10, 4, A);
    run_all(s);
    ck_assert_uint_eq(x.cached, 96);
    assert_same(&x, &ref_q);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

/* ---- Fair admission (issue 24, finding 3) ------------------------------------ */

static void submit_fair(eng_sched *s, rec *r, const int32_t *p, size_t n, size_t max_tokens,
                        uint64_t seed, uint64_t tenant, uint64_t group)
{
    eng_request q = {.prompt = p,
                     .nprompt = n,
                     .max_tokens = max_tokens,
                     .sampling = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f},
                     .seed = seed,
                     .ignore_eos = 1,
                     .logprobs = 2,
                     .tenant = tenant,
                     .group = group,
                     .on_event = on_event,
                     .user = r};
    char err[256];
    memset(r, 0, sizeof *r);
    r->s = s;
    ck_assert_msg(eng_sched_submit(s, &q, &r->id, err, sizeof err) == ENG_OK, "%s", err);
}

/* A pool of one block, no prefix cache: one 8-token, 1-token request runs
 * at a time, so the order of the DONE events is the order of admission. */
static eng_sched *make_one_at_a_time(void)
{
    return make_sched_cache(1, 4, 32, 64, 0);
}

/* Checks that recs[order[0]], recs[order[1]], ... ended in that order. */
static void assert_done_order(rec *const *recs, const size_t *order, size_t n)
{
    for (size_t k = 0; k < n; k++) ck_assert_uint_eq(recs[order[k]]->done_count, 1);
    for (size_t k = 1; k < n; k++)
        ck_assert_msg(recs[order[k - 1]]->done_order < recs[order[k]]->done_order,
                      "position %zu: request %zu ended before request %zu", k, order[k],
                      order[k - 1]);
}

/* Two tenants, then three: a slot goes to the tenant served longest ago
 * (round robin), whatever the order of arrival; one tenant's requests stay
 * in their order. FIFO would give A1 A2 A3 B1 B2. */
START_TEST(sched_fair_admission_round_robin_over_two_and_three_tenants)
{
    int32_t p[8];
    prompt_of(p, 8, 3);
    static rec a1, a2, a3, b1, b2, c1, c2;
    eng_sched *s = make_one_at_a_time();
    submit_fair(s, &a1, p, 8, 1, 1, 10, 0);
    submit_fair(s, &a2, p, 8, 1, 2, 10, 0);
    submit_fair(s, &a3, p, 8, 1, 3, 10, 0);
    submit_fair(s, &b1, p, 8, 1, 4, 20, 0);
    submit_fair(s, &b2, p, 8, 1, 5, 20, 0);
    run_all(s);
    rec *two[] = {&a1, &a2, &a3, &b1, &b2};
    assert_done_order(two, (const size_t[]){0, 3, 1, 4, 2}, 5); /* A1 B1 A2 B2 A3 */
    assert_idle(s);
    /* Three tenants: A1 (A served), B1 and C1 (never served: B came first),
     * then A2 (served before C), C2, A3. */
    submit_fair(s, &a1, p, 8, 1, 1, 10, 0);
    submit_fair(s, &a2, p, 8, 1, 2, 10, 0);
    submit_fair(s, &a3, p, 8, 1, 3, 10, 0);
    submit_fair(s, &b1, p, 8, 1, 4, 20, 0);
    submit_fair(s, &c1, p, 8, 1, 6, 30, 0);
    submit_fair(s, &c2, p, 8, 1, 7, 30, 0);
    run_all(s);
    rec *three[] = {&a1, &a2, &a3, &b1, &c1, &c2};
    assert_done_order(three, (const size_t[]){0, 3, 4, 1, 5, 2}, 6);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

/* One tenant's three requests (groups) of two sequences each, then another
 * tenant's one request of one: the newcomer is admitted second, and the
 * first tenant's requests take turns (FIFO would serve the newcomer last,
 * after six sequences). */
START_TEST(sched_fair_admission_one_request_beside_a_tenant_with_many)
{
    int32_t p[8];
    prompt_of(p, 8, 4);
    static rec a[6], b;
    eng_sched *s = make_one_at_a_time();
    for (size_t i = 0; i < 6; i++) submit_fair(s, &a[i], p, 8, 1, i, 10, 100 + i / 2);
    submit_fair(s, &b, p, 8, 1, 9, 20, 200);
    run_all(s);
    rec *all[] = {&a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &b};
    /* A's request 1, B, A's requests 2 and 3, then each's second */
    assert_done_order(all, (const size_t[]){0, 6, 2, 4, 1, 3, 5}, 7);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

/* A tenant that fills max_running with long generations leaves the spare
 * slot to another: the newcomer's first token comes from the first step
 * after it arrives, while the first tenant never holds more than
 * max_running; every sequence's bits are those it has alone. */
START_TEST(sched_fair_admission_spare_slot_for_a_newcomer_same_bits)
{
    int32_t p[8], pb[8];
    prompt_of(p, 8, 5);
    prompt_of(pb, 8, 6);
    static rec a[4], b, ref_a[4], ref_b;
    for (size_t i = 0; i < 4; i++) reference(&ref_a[i], p, 8, 40, 50 + i, 0.8f, 0);
    reference(&ref_b, pb, 8, 3, 60, 0.8f, 0);
    eng_sched *s = make_sched_cache(64, 2, 32, 64, 0); /* 2 per tenant, 1 spare */
    for (size_t i = 0; i < 4; i++) submit_fair(s, &a[i], p, 8, 40, 50 + i, 10, 1);
    ck_assert(eng_sched_step(s));
    ck_assert(eng_sched_step(s));
    eng_sched_stats st;
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.running, 2); /* max_running: the spare stays free */
    ck_assert_uint_eq(st.queued, 2);
    submit_fair(s, &b, pb, 8, 3, 60, 20, 2);
    ck_assert(eng_sched_step(s));
    ck_assert_uint_eq(b.n, 1); /* admitted and prefilled in the next step */
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.running, 3);
    while (b.done_count == 0) ck_assert(eng_sched_step(s));
    eng_sched_stats_get(s, &st);
    ck_assert_uint_eq(st.running, 2); /* A still capped at max_running */
    ck_assert_uint_eq(st.queued, 2);
    run_all(s);
    for (size_t i = 0; i < 4; i++) assert_same(&a[i], &ref_a[i]);
    assert_same(&b, &ref_b);
    assert_idle(s);
    eng_sched_free(s);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("scheduler");
    TCase *tc = tcase_create("eng_sched");
    tcase_set_timeout(tc, 240);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, sched_many_mixed_requests_complete_and_return_every_block);
    tcase_add_test(tc, sched_warmup_leaves_no_trace);
    tcase_add_test(tc, sched_same_seed_same_tokens_alone_or_batched);
    tcase_add_test(tc, sched_cancel_waiting_running_and_from_callback);
    tcase_add_test(tc, sched_cancel_during_an_executing_step_ends_at_completion);
    tcase_add_test(tc, sched_pause_holds_rows_and_blocks_then_resumes_same_tokens);
    tcase_add_test(tc, sched_queue_overflow_and_impossible_requests_are_refused);
    tcase_add_test(tc, sched_set_max_queue_grows_in_order_and_shrinks);
    tcase_add_test(tc, sched_chunked_prefill_keeps_decoders_flowing);
    tcase_add_test(tc, sched_echo_logprobs_bias_and_penalties);
    tcase_add_test(tc, sched_end_of_text_ends_unless_ignored);
    tcase_add_test(tc, sched_mask_constrains_its_sequence_only_and_is_freed_once);
    tcase_add_test(tc, sched_embedding_same_bits_alone_batched_chunked_or_cached);
    tcase_add_test(tc, sched_prefix_cache_same_bits_cached_partly_cached_or_not);
    tcase_add_test(tc, sched_prefix_cache_same_bits_batched_with_shared_prefixes);
    tcase_add_test(tc, sched_prefix_cache_choices_of_one_prompt_compute_it_once);
    tcase_add_test(tc, sched_stats_count_tokens_as_steps_deliver_them);
    tcase_add_test(tc, sched_prefix_cache_evicts_under_pressure_and_admits_everything);
    tcase_add_test(tc, sched_prefix_cache_hash_collisions_never_share_different_prefixes);
    tcase_add_test(tc, sched_prefix_cache_echo_takes_stored_prompt_logprobs);
    tcase_add_test(tc, sched_prefix_cache_echo_batch_of_continuations_shares_the_context);
    tcase_add_test(tc, sched_prefix_cache_whole_block_prompts_still_compute_their_last_token);
    tcase_add_test(tc, sched_prefix_cache_same_bits_with_any_thread_count);
    tcase_add_test(tc, sched_prefix_cache_full_pool_of_cached_blocks_gives_way_lru_first);
    tcase_add_test(tc, sched_prefix_cache_waiter_goes_on_when_the_producer_pauses);
    tcase_add_test(tc, sched_prefix_cache_waiter_goes_on_when_the_producer_is_cancelled);
    tcase_add_test(tc, sched_prefix_cache_producer_cancelled_mid_step_leaves_no_half_block);
    tcase_add_test(tc, sched_prefix_cache_waiter_cancelled_leaves_the_producer_alone);
    tcase_add_test(tc, sched_prefix_cache_sharers_never_write_into_shared_blocks);
    tcase_add_test(tc, sched_prefix_cache_admission_reserves_only_the_blocks_past_the_hit);
    tcase_add_test(tc, sched_prefix_cache_salts_partition_the_cache);
    tcase_add_test(tc, sched_fair_admission_round_robin_over_two_and_three_tenants);
    tcase_add_test(tc, sched_fair_admission_one_request_beside_a_tenant_with_many);
    tcase_add_test(tc, sched_fair_admission_spare_slot_for_a_newcomer_same_bits);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
