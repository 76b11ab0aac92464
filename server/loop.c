/*
 * server/loop.c: the libuv side. libmicrohttpd runs in external-event mode
 * (a uv_poll on its epoll descriptor and a uv_timer for its timeouts);
 * connections are suspended and resumed here; each engine step runs on the
 * work queue and its events are delivered back on the loop thread; a 1 s
 * tick enforces the queue's wait limit and request deadlines and keeps
 * waiting streams alive; the systemd watchdog pings while steps progress.
 */
#include "internal.h"
#include "systemd.h"

#include <string.h>
#include <unistd.h>

static void on_timer(uv_timer_t *t)
{
    loop_mhd_run(t->data);
}

void loop_on_poll(uv_poll_t *p, int status, int events)
{
    (void)status;
    (void)events;
    loop_mhd_run(p->data);
}

void loop_mhd_run(srv *s)
{
    if (s->mhd == NULL || s->closed) return;
    MHD_run(s->mhd);
    MHD_UNSIGNED_LONG_LONG ms;
    if (MHD_get_timeout(s->mhd, &ms) == MHD_YES)
        uv_timer_start(&s->timer, on_timer, ms > 1000 ? 1000 : ms, 0);
    else
        uv_timer_start(&s->timer, on_timer, 1000, 0);
}

void http_suspend(srv_req *r, http_cont cont)
{
    assert(!r->suspended && !r->conn_done);
    r->cont = cont;
    r->suspended = 1;
    MHD_suspend_connection(r->conn);
}

void http_resume(srv_req *r)
{
    if (r->suspended && !r->conn_done) {
        r->suspended = 0;
        MHD_resume_connection(r->conn);
    }
}

/* ---- The step driver ------------------------------------------------------ */

static void work_cb(uv_work_t *w)
{
    srv *s = w->data;
    if (s->step_delay_ms > 0) usleep(s->step_delay_ms * 1000u);
    eng_sched_execute(s->sched);
}

static void after_cb(uv_work_t *w, int status)
{
    (void)status;
    srv *s = w->data;
    s->in_flight = 0;
    eng_sched_complete(s->sched); /* events: cmpl_on_event */
    eng_sched_stats st;
    eng_sched_stats_get(s->sched, &st);
    met_observe(&s->met.step_seconds, st.last_step_seconds);
    met_observe(&s->met.step_rows, (double)st.last_step_rows);
    /* Streams whose clients fell behind sit out the next step. */
    for (srv_req *r = s->head; r != NULL; r = r->next) cmpl_backlog(r);
    loop_kick(s);
    loop_mhd_run(s); /* serve the connections the events resumed */
}

void loop_kick(srv *s)
{
    if (s->in_flight || s->closed || !eng_sched_plan(s->sched)) return;
    s->in_flight = 1;
    s->step_started = log_now();
    s->work.data = s;
    if (uv_queue_work(s->loop, &s->work, work_cb, after_cb) != 0) {
        /* Cannot happen with a live loop; run it here rather than stall. */
        eng_sched_execute(s->sched);
        s->in_flight = 0;
        eng_sched_complete(s->sched);
    }
}

/* ---- The 1 s tick: deadlines, the queue's wait limit, keep-alive comments -- */

static void cancel_all(srv_req *r)
{
    for (size_t i = 0; i < r->nchoices; i++)
        if (r->choices[i].live) eng_sched_cancel(r->s->sched, r->choices[i].id);
}

void loop_sd_status(srv *s)
{
    eng_sched_stats st;
    eng_sched_stats_get(s->sched, &st);
    char line[sizeof s->sd_status];
    snprintf(line, sizeof line, "%s: %zu running, %zu queued, KV blocks %zu/%zu",
             s->draining ? "draining" : "serving", st.running, st.queued, st.kv_blocks_used,
             st.kv_blocks_total);
    if (strcmp(line, s->sd_status) == 0) return;
    memcpy(s->sd_status, line, sizeof line);
    srv_sd_notify("STATUS=%s", line);
}

/* WATCHDOG=1, every half WatchdogSec, only while the engine makes progress:
 * the loop thread is alive (this timer runs) and no step has been in flight
 * for more than half the interval (a step takes well under a second). A
 * step wedged on the work queue stops the pings, and systemd restarts the
 * service WatchdogSec after the last one. */
void loop_on_watchdog(uv_timer_t *t)
{
    srv *s = t->data;
    double half = (double)srv_sd_watchdog_usec() / 2e6;
    if (s->in_flight && log_now() - s->step_started > half) {
        log_line("error", "watchdog: a step has run for %.1f s; not pinging",
                 log_now() - s->step_started);
        return;
    }
    srv_sd_notify("WATCHDOG=1");
}

void loop_on_tick(uv_timer_t *t)
{
    srv *s = t->data;
    double now = log_now();
    srv_req *next;
    for (srv_req *r = s->head; r != NULL; r = next) {
        next = r->next;
        if (r->conn_done || r->nlive == 0) continue;
        double age = now - r->t_start;
        int waiting = 0;
        for (size_t i = 0; i < r->nchoices; i++)
            if (r->choices[i].live && eng_sched_waiting(s->sched, r->choices[i].id)) waiting = 1;
        if (waiting && age > s->cfg.queue_timeout_s) {
            /* Waited too long for admission: 503, which clients retry. */
            r->error_status = 503;
            snprintf(r->error_msg, sizeof r->error_msg,
                     "The request waited %.0f s for a free slot (queue_timeout); retry later", age);
            cancel_all(r); /* DONE events may free nothing: the connection is open */
            continue;
        }
        if (cmpl_stall_check(r, now)) continue;
        if (r->oreq.timeout_s > 0 && age > r->oreq.timeout_s) {
            /* The request's own deadline ends generation like max_tokens. */
            cancel_all(r);
            continue;
        }
        if (r->oreq.stream && http_req_completion_tokens(r) == 0) {
            /* Still waiting: an SSE comment, which clients ignore, keeps
             * proxies from timing out and lets a disconnect be noticed. */
            sse_comment(&r->sse, "waiting");
            http_resume(r);
        }
    }
    tok_tick(s, now);
    loop_sd_status(s);
    loop_mhd_run(s);
}

void loop_on_info(uv_timer_t *t)
{
    srv *s = t->data;
    double now = log_now(), dt = now - s->info_last;
    eng_sched_stats st;
    eng_sched_stats_get(s->sched, &st);
    uint64_t dp = s->met.prompt_tokens - s->info_prompt;
    uint64_t dc = s->met.completion_tokens - s->info_completion;
    s->info_last = now;
    s->info_prompt = s->met.prompt_tokens;
    s->info_completion = s->met.completion_tokens;
    if (dp == 0 && dc == 0 && st.running == 0 && st.queued == 0) return; /* idle: silent */
    log_line("info",
             "running %zu, queued %zu; prompt %.1f tokens/s, generation %.1f tokens/s; KV "
             "cache %.1f%% (%zu of %zu blocks)",
             st.running, st.queued, dt > 0 ? (double)dp / dt : 0.0, dt > 0 ? (double)dc / dt : 0.0,
             st.kv_blocks_total ? 100.0 * (double)st.kv_blocks_used / (double)st.kv_blocks_total
                                : 0.0,
             st.kv_blocks_used, st.kv_blocks_total);
}
