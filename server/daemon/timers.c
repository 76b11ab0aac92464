/*
 * server/daemon/timers.c: the daemon's clocks. The 1 s tick runs the
 * hook the completions registered (their wait limits, deadlines and
 * keep-alive comments: cmpl_tick) and sends systemd's status line; the
 * watchdog pings systemd while steps progress; the info line says what the
 * server did since the last one.
 */
#include "daemon/daemon.h"
#include "daemon/systemd.h"

#include <string.h>

void srv_sd_status(srv *s)
{
    eng_sched_stats st;
    ckpt_stats_sum(s, &st);
    char line[sizeof s->daemon->sd_status];
    snprintf(line, sizeof line, "%s: %zu running, %zu queued, KV blocks %zu/%zu",
             s->api->draining ? "draining" : "serving", st.running, st.queued, st.kv_blocks_used,
             st.kv_blocks_total);
    if (strcmp(line, s->daemon->sd_status) == 0) return;
    memcpy(s->daemon->sd_status, line, sizeof line);
    srv_sd_notify("STATUS=%s", line);
}

/* WATCHDOG=1, every half WatchdogSec, only while the engine makes progress:
 * the loop thread is alive (this timer runs) and no step has been in flight
 * for more than half the interval (a step takes well under a second). A
 * step wedged on the work queue stops the pings, and systemd restarts the
 * service WatchdogSec after the last one. */
void srv_on_watchdog(uv_timer_t *t)
{
    srv *s = t->data;
    double half = (double)srv_sd_watchdog_usec() / 2e6;
    if (s->api->in_flight && log_now() - s->api->step_started > half) {
        log_line("error", "watchdog: a step has run for %.1f s; not pinging",
                 log_now() - s->api->step_started);
        return;
    }
    srv_sd_notify("WATCHDOG=1");
}

void srv_on_tick(uv_timer_t *t)
{
    srv *s = t->data;
    cmpl_tick(s, log_now()); /* the completions' policy over time */
    srv_sd_status(s);
    loop_mhd_run(s);
}

void srv_on_info(uv_timer_t *t)
{
    srv *s = t->data;
    double now = log_now(), dt = now - s->daemon->info_last;
    eng_sched_stats st;
    ckpt_stats_sum(s, &st);
    /* The engine's counters move with every step (prompt positions
     * computed, tokens sampled), so the rates are of this interval even
     * while long requests run; the request counters (met) count only when
     * a request ends. */
    uint64_t dp = st.prompt_computed - s->daemon->info_prompt;
    uint64_t dc = st.tokens_generated - s->daemon->info_completion;
    s->daemon->info_last = now;
    s->daemon->info_prompt = st.prompt_computed;
    s->daemon->info_completion = st.tokens_generated;
    if (dp == 0 && dc == 0 && st.running == 0 && st.queued == 0) return; /* idle: silent */
    log_line("info",
             "running %zu, queued %zu; prompt %.1f tokens/s, generation %.1f tokens/s; KV "
             "cache %.1f%% (%zu of %zu blocks)",
             st.running, st.queued, dt > 0 ? (double)dp / dt : 0.0, dt > 0 ? (double)dc / dt : 0.0,
             st.kv_blocks_total ? 100.0 * (double)st.kv_blocks_used / (double)st.kv_blocks_total
                                : 0.0,
             st.kv_blocks_used, st.kv_blocks_total);
}
