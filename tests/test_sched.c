/*
 * tests/test_sched.c: the continuous-batching scheduler without HTTP, driven
 * the way the server drives it: a libuv loop, one step at a time on the
 * work queue (uv_queue_work), plan and complete on the loop thread.
 */
#include "engine.h"
#include "tools.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
    size_t n, prompt_events, done_count;
    eng_finish finish;
    size_t first_token_step; /* driver step count when the first token came */
    driver *d;
    eng_sched *s;
    size_t cancel_after; /* cancel from the callback after this many tokens */
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
        r->prompt_events++;
    } else {
        r->done_count++;
        r->finish = ev->finish;
    }
}

static eng_sched *make_sched(size_t blocks, size_t max_running, size_t max_queue,
                             size_t step_tokens)
{
    eng_sched_opts o = {.kv_bytes = blocks * block_bytes(),
                        .block_len = 16,
                        .max_running = max_running,
                        .max_queue = max_queue,
                        .step_tokens = step_tokens,
                        .threads = 2};
    eng_sched *s;
    char err[256];
    ck_assert_msg(eng_sched_new(model, &o, &s, err, sizeof err) == ENG_OK, "%s", err);
    return s;
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

int main(void)
{
    Suite *su = suite_create("scheduler");
    TCase *tc = tcase_create("eng_sched");
    tcase_set_timeout(tc, 240);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, sched_many_mixed_requests_complete_and_return_every_block);
    tcase_add_test(tc, sched_same_seed_same_tokens_alone_or_batched);
    tcase_add_test(tc, sched_cancel_waiting_running_and_from_callback);
    tcase_add_test(tc, sched_cancel_during_an_executing_step_ends_at_completion);
    tcase_add_test(tc, sched_pause_holds_rows_and_blocks_then_resumes_same_tokens);
    tcase_add_test(tc, sched_queue_overflow_and_impossible_requests_are_refused);
    tcase_add_test(tc, sched_chunked_prefill_keeps_decoders_flowing);
    tcase_add_test(tc, sched_echo_logprobs_bias_and_penalties);
    tcase_add_test(tc, sched_end_of_text_ends_unless_ignored);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
