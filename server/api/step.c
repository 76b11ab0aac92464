/*
 * server/api/step.c: the engine step driver. At most one step is in
 * flight: it runs on the libuv work queue (eng_sched_execute), and its
 * events are delivered back on the loop thread (eng_sched_complete calls
 * each request's cmpl_on_event); then the srv_api's after-step hook runs (the
 * completions' back-pressure), the next step is planned, and
 * libmicrohttpd serves the connections the events resumed.
 */
#include "api/api.h"

#include <unistd.h>

static void work_cb(uv_work_t *w)
{
    srv *s = w->data;
    if (s->api->step_delay_ms > 0) usleep(s->api->step_delay_ms * 1000u);
    eng_sched_execute(s->sched);
}

static void after_cb(uv_work_t *w, int status)
{
    (void)status;
    srv *s = w->data;
    s->api->in_flight = 0;
    eng_sched_complete(s->sched); /* events: cmpl_on_event */
    eng_sched_stats st;
    eng_sched_stats_get(s->sched, &st);
    met_observe(&s->api->met.step_seconds, st.last_step_seconds);
    met_observe(&s->api->met.step_rows, (double)st.last_step_rows);
    if (s->api->after_step != NULL) s->api->after_step(s); /* cmpl_after_step */
    step_kick(s);
    loop_mhd_run(s); /* serve the connections the events resumed */
}

void step_kick(srv *s)
{
    if (s->api->in_flight || s->closed || !eng_sched_plan(s->sched)) return;
    s->api->in_flight = 1;
    s->api->step_started = log_now();
    s->api->work.data = s;
    if (uv_queue_work(s->loop, &s->api->work, work_cb, after_cb) != 0) {
        /* Cannot happen with a live loop; run it here rather than stall. */
        eng_sched_execute(s->sched);
        s->api->in_flight = 0;
        eng_sched_complete(s->sched);
    }
}
