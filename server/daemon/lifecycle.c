/*
 * server/daemon/lifecycle.c: the daemon's signals and the drain.
 *
 * SIGTERM or SIGINT starts the drain (srv_drain_begin): the listener stays
 * open, /ready answers 503 (load balancers take the replica out), new
 * completions get 503 with Retry-After, and what runs goes on. The drain
 * ends in one of three ways:
 *
 *   - every request is answered and its response written: the loop stops;
 *   - shutdown_timeout passes, or a second SIGTERM/SIGINT comes: the cut
 *     (srv_drain_cut). Every request still generating is cancelled and ends
 *     cleanly: a stream gets its choices' last chunks, an error event
 *     naming the shutdown, `data: [DONE]` and the chunked end; a whole
 *     answer gets a 503 JSON error. Those responses get SRV_CUT_GRACE_S to
 *     be written, then the loop stops regardless;
 *   - a third signal during the cut: the loop stops at once.
 *
 * When the loop stops, a request that still has no answer started (its
 * body still coming, say) gets a 503 server_shutting_down JSON written on
 * its socket (conn.c) before its connection is closed.
 *
 * Stopping the loop closes its handles; uv_run returns once the step in
 * flight (if any) is back, and srv_main stops libmicrohttpd, which closes
 * whatever connection is left, and returns s->daemon->exit_code.
 *
 *   serving -> draining -> (cut ->) closed
 *
 * SIGHUP reloads the configuration (reload.c); SIGUSR1 and SIGUSR2 are
 * logged and otherwise ignored (their default action would kill the
 * process). Thread: the loop thread (libuv delivers signals there).
 */
#include "daemon/daemon.h"
#include "daemon/systemd.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

static void close_handle(uv_handle_t *h)
{
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

/* Closes every handle of the loop, so that uv_run returns. */
static void close_all(srv *s)
{
    if (s->closed) return;
    s->closed = 1;
    conn_close_unanswered(s); /* a request still unanswered gets a 503, not a bare close */
    conn_drains_close(s);     /* the lingering reads' handles */
    uv_handle_t *handles[] = {
        (uv_handle_t *)&s->daemon->tick,
        (uv_handle_t *)&s->daemon->drain_timer,
        (uv_handle_t *)&s->timer,
        (uv_handle_t *)&s->daemon->watchdog,
        (uv_handle_t *)&s->poll,
        (uv_handle_t *)&s->daemon->sigterm,
        (uv_handle_t *)&s->daemon->sigint,
        (uv_handle_t *)&s->daemon->sighup,
        (uv_handle_t *)&s->daemon->sigusr1,
        (uv_handle_t *)&s->daemon->sigusr2,
        (uv_handle_t *)&s->daemon->model_timer,
        (uv_handle_t *)&s->daemon->sigbus_wake,
        (uv_handle_t *)&s->daemon->info_timer,
        (uv_handle_t *)&s->sweep,
    };
    for (size_t i = 0; i < sizeof handles / sizeof handles[0]; i++) close_handle(handles[i]);
    tpool_close(s->api->tokpool);
}

/* Nothing generates, waits or tokenizes, and every request's response is
 * written (its connection's request completed). */
static int all_answered(const srv *s)
{
    eng_sched_stats st;
    ckpt_stats_sum(s, &st);
    return st.running == 0 && st.queued == 0 && !s->api->in_flight
           && s->api->tokenizing + s->api->tok_nwait == 0 && s->active == 0;
}

static void drain_check(uv_timer_t *t)
{
    srv *s = t->data;
    if (all_answered(s)) {
        log_line("info", "drained: every response is written");
        close_all(s);
        return;
    }
    double now = log_now();
    if (!s->api->cut && now - s->daemon->drain_started >= s->cfg.shutdown_timeout_s) {
        srv_drain_cut(s, "shutdown_timeout");
    } else if (s->api->cut && now - s->daemon->cut_at >= SRV_CUT_GRACE_S) {
        log_line("warn", "%zu %s not answered %.1f s after the drain's end; closing %s", s->active,
                 log_plural(s->active, "request", "requests"), SRV_CUT_GRACE_S,
                 log_plural(s->active, "its connection", "their connections"));
        close_all(s);
    }
}

void srv_drain_begin(srv *s, int exit_code, const char *why)
{
    if (s->daemon->exit_code == 0) s->daemon->exit_code = exit_code;
    if (s->api->draining) return;
    s->api->draining = 1;
    s->daemon->drain_started = log_now();
    srv_sd_notify("STOPPING=1");
    srv_sd_status(s);
    log_line("info", "%s: draining (shutdown_timeout %.0f s; a second SIGTERM ends it now)", why,
             s->cfg.shutdown_timeout_s);
    uv_timer_start(&s->daemon->drain_timer, drain_check, 0, 50);
}

void srv_drain_cut(srv *s, const char *why)
{
    assert(s->api->draining);
    if (s->api->cut || s->closed) return;
    s->api->cut = 1;
    s->daemon->cut_at = log_now();
    size_t n = cmpl_cut_all(s, why);
    if (n == 0)
        log_line("info", "drain ended (%s): nothing was still generating", why);
    else
        log_line("info", "drain ended (%s): %zu %s still generating %s cut short", why, n,
                 log_plural(n, "request", "requests"), log_plural(n, "is", "are"));
    loop_mhd_run(s); /* write what the cancellations queued */
}

static void on_stop_signal(uv_signal_t *h, int signum)
{
    srv *s = h->data;
    const char *name = signum == SIGINT ? "SIGINT" : "SIGTERM";
    /* Ctrl-C in a terminal: say it in a terminal user's words. */
    if (signum == SIGINT && !s->api->draining && isatty(STDERR_FILENO)) {
        eng_sched_stats st;
        ckpt_stats_sum(s, &st);
        size_t n = st.running + st.queued;
        if (n == 0)
            log_line("info", "Ctrl-C: stopping (nothing is running); press Ctrl-C again to stop at "
                             "once");
        else
            log_line("info",
                     "Ctrl-C: stopping. %zu %s still running %s up to %.0f s to finish; press "
                     "Ctrl-C again to stop at once",
                     n, log_plural(n, "request", "requests"), log_plural(n, "gets", "get"),
                     s->cfg.shutdown_timeout_s);
    }
    if (!s->api->draining) {
        srv_drain_begin(s, 0, name);
    } else if (!s->api->cut) {
        log_line("info", "%s during the drain: ending it now", name);
        srv_drain_cut(s, "a second signal");
    } else {
        log_line("warn", "%s during the drain's end: closing every connection now", name);
        close_all(s);
    }
}

static void on_reload_signal(uv_signal_t *h, int signum)
{
    (void)signum;
    srv_reload(h->data);
}

static void on_user_signal(uv_signal_t *h, int signum)
{
    (void)h;
    log_line("info", "%s: no action (SIGHUP reloads the configuration, SIGTERM drains)",
             signum == SIGUSR1 ? "SIGUSR1" : "SIGUSR2");
}

void srv_signals_start(srv *s)
{
    struct {
        uv_signal_t *h;
        uv_signal_cb cb;
        int signum;
    } sigs[] = {
        {&s->daemon->sigterm, on_stop_signal, SIGTERM},
        {&s->daemon->sigint, on_stop_signal, SIGINT},
        {&s->daemon->sighup, on_reload_signal, SIGHUP},
        {&s->daemon->sigusr1, on_user_signal, SIGUSR1},
        {&s->daemon->sigusr2, on_user_signal, SIGUSR2},
    };
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        uv_signal_init(s->loop, sigs[i].h);
        sigs[i].h->data = s;
        uv_signal_start(sigs[i].h, sigs[i].cb, sigs[i].signum);
    }
}
