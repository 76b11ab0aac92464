/*
 * server/api/step.c: the engine step driver. At most one step is in
 * flight: it runs on the libuv work queue (eng_sched_execute), and its
 * events are delivered back on the loop thread (eng_sched_complete calls
 * each request's cmpl_on_event); then the srv_api's after-step hook runs (the
 * completions' back-pressure), the next step is planned, and
 * libmicrohttpd serves the connections the events resumed.
 *
 * Several checkpoints (ckpt.c) take turns: each has its own scheduler, all
 * run on the primary's step threads, so one step runs at a time, and the
 * next plan asks the checkpoint after the last one stepped first. Each
 * checkpoint with work gets every n-th step at least, whatever the others
 * hold: fair across models as admission is across keys, and a step's bits
 * never depend on another checkpoint's.
 */
#include "api/api.h"

#include <unistd.h>

static void work_cb(uv_work_t *w)
{
    srv *s = w->data;
    if (s->api->step_delay_ms > 0) usleep(s->api->step_delay_ms * 1000u);
    eng_sched_execute(s->api->ckpt[s->api->step_ckpt].sched);
}

static void after_cb(uv_work_t *w, int status)
{
    (void)status;
    srv *s = w->data;
    srv_api *a = s->api;
    a->in_flight = 0;
    eng_sched *sched = a->ckpt[a->step_ckpt].sched;
    eng_sched_complete(sched); /* events: cmpl_on_event */
    eng_sched_stats st;
    eng_sched_stats_get(sched, &st);
    met_observe(&a->met.step_seconds, st.last_step_seconds);
    met_observe(&a->met.step_rows, (double)st.last_step_rows);
    s->load_step_s = st.last_step_seconds;
    size_t queued = 0;
    for (size_t i = 0; i < a->nckpt; i++) {
        eng_sched_stats_get(a->ckpt[i].sched, &st);
        queued += st.queued;
    }
    s->load_queued = queued;
    if (a->after_step != NULL) a->after_step(s); /* cmpl_after_step */
    step_kick(s);
    loop_mhd_run(s); /* serve the connections the events resumed */
}

void step_kick(srv *s)
{
    srv_api *a = s->api;
    if (a->in_flight || s->closed) return;
    size_t n = a->nckpt, pick = n;
    for (size_t k = 1; k <= n && pick == n; k++) {
        size_t i = (a->step_ckpt + k) % n;
        if (eng_sched_plan(a->ckpt[i].sched)) pick = i;
    }
    if (pick == n) return;
    a->step_ckpt = pick;
    a->in_flight = 1;
    a->step_started = log_now();
    a->work.data = s;
    if (uv_queue_work(s->loop, &a->work, work_cb, after_cb) != 0) {
        /* Cannot happen with a live loop; run it here rather than stall. */
        eng_sched_execute(a->ckpt[pick].sched);
        a->in_flight = 0;
        eng_sched_complete(a->ckpt[pick].sched);
    }
}
