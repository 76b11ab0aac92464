/*
 * server/daemon.c: `gpt2d serve`: the configuration, the model, the route
 * table, listening (a socket systemd passed, or host:port), the signals,
 * the drain and the shutdown.
 */
#include "internal.h"
#include "server.h"
#include "systemd.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef GPT2D_BUILD_VERSION
#define GPT2D_BUILD_VERSION "dev"
#endif

/* ---- Start-up and shutdown --------------------------------------------------- */

static void close_all(srv *s);

static void drain_check(uv_timer_t *t)
{
    srv *s = t->data;
    eng_sched_stats st;
    eng_sched_stats_get(s->sched, &st);
    if ((st.running == 0 && st.queued == 0 && !s->in_flight && s->tokenizing + s->tok_nwait == 0)
        || log_now() - s->drain_started > s->cfg.shutdown_timeout_s)
        close_all(s);
}

static void on_signal(uv_signal_t *h, int signum)
{
    srv *s = h->data;
    if (s->draining) return;
    s->draining = 1;
    s->drain_started = log_now();
    srv_sd_notify("STOPPING=1");
    loop_sd_status(s);
    log_line("info", "signal %d: draining (shutdown_timeout %.0f s)", signum,
             s->cfg.shutdown_timeout_s);
    /* The listener stays open while draining: /ready answers 503 (load
     * balancers take the replica out) and new completions get 503 with
     * Retry-After, while the running ones finish. */
    uv_timer_start(&s->drain_timer, drain_check, 0, 50);
}

static void close_all(srv *s)
{
    uv_timer_stop(&s->tick);
    uv_close((uv_handle_t *)&s->tick, NULL);
    uv_timer_stop(&s->drain_timer);
    uv_close((uv_handle_t *)&s->drain_timer, NULL);
    uv_timer_stop(&s->timer);
    uv_close((uv_handle_t *)&s->timer, NULL);
    uv_timer_stop(&s->sweep);
    uv_close((uv_handle_t *)&s->sweep, NULL);
    uv_timer_stop(&s->watchdog);
    uv_close((uv_handle_t *)&s->watchdog, NULL);
    uv_poll_stop(&s->poll);
    uv_close((uv_handle_t *)&s->poll, NULL);
    uv_close((uv_handle_t *)&s->sigterm, NULL);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    tpool_close(s->tokpool);
}

static void serve_usage(FILE *out)
{
    fprintf(out, "usage: gpt2d serve --model DIR [options]\n"
                 "Serves the model over HTTP (OpenAI-compatible POST /v1/completions).\n"
                 "Every option is also a config-file key (key = value):\n");
    cfg_print_help(out);
}

/* The routes: the router (router.c) looks requests up here. /health, /ready
 * and /metrics need no key when auth_open_health is set. */
static size_t build_routes(const cfg_config *cfg, http_route *t)
{
    int probe_key = !cfg->auth_open_health;
    size_t n = 0;
    t[n++] = (http_route){"POST", "/v1/completions", cmpl_route, 1};
    t[n++] = (http_route){"GET", "/v1/models", probe_models, 1};
    t[n++] = (http_route){"POST", "/tokenize", tok_route_tokenize, 1};
    t[n++] = (http_route){"POST", "/detokenize", tok_route_detokenize, 1};
    t[n++] = (http_route){"GET", "/health", probe_health, probe_key};
    t[n++] = (http_route){"GET", "/ready", probe_ready, probe_key};
    t[n++] = (http_route){"GET", "/metrics", probe_metrics, probe_key};
    return n;
}
#define SRV_MAX_ROUTES 16

/* The configuration file read when no --config is given, if it exists. */
#define SRV_DEFAULT_CONFIG "/etc/gpt2d/gpt2d.conf"

int srv_main(int argc, char **argv)
{
    int explicit_config = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            serve_usage(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--print-defaults") == 0) {
            cfg_print_defaults(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--config") == 0 || strncmp(argv[i], "--config=", 9) == 0)
            explicit_config = 1;
    }
    srv_sd_init();
    srv s;
    memset(&s, 0, sizeof s);
    char err[1024];
    cfg_defaults(&s.cfg);
    met_init(&s.met);
    if ((!explicit_config && access(SRV_DEFAULT_CONFIG, F_OK) == 0
         && cfg_load_file(&s.cfg, SRV_DEFAULT_CONFIG, err, sizeof err) != CFG_OK)
        || cfg_parse_args(&s.cfg, argc, argv, 1, err, sizeof err) != CFG_OK
        || cfg_validate(&s.cfg, err, sizeof err) != CFG_OK) {
        log_fatal(err);
        return 2;
    }
    log_set_level(s.cfg.log_level);
    const char *delay = getenv("GPT2D_TEST_STEP_DELAY_MS");
    if (delay != NULL && atoi(delay) > 0) {
        s.step_delay_ms = (unsigned)atoi(delay);
        log_line("warn",
                 "GPT2D_TEST_STEP_DELAY_MS: every step sleeps %u ms (a test of a wedged "
                 "engine; never set it in production)",
                 s.step_delay_ms);
    }
    int rc = 1;
    log_line("info", "loading %s", s.cfg.model_dir);
    srv_sd_notify("STATUS=loading %s", s.cfg.model_dir);
    if (bpe_load_dir(s.cfg.model_dir, &s.tok, err, sizeof err) != BPE_OK
        || eng_model_load(s.cfg.model_dir, &s.model, err, sizeof err) != ENG_OK) {
        log_fatal(err);
        goto done;
    }
    if (eng_model_copied_bytes(s.model) > 0)
        log_line("warn",
                 "copied %.1f MB of misaligned or half-precision weights; "
                 "`gpt2d convert` writes a file that maps without copying",
                 (double)eng_model_copied_bytes(s.model) / 1e6);
    eng_sched_opts so = {.kv_bytes = s.cfg.kv_cache_mb << 20,
                         .block_len = s.cfg.kv_block,
                         .max_running = s.cfg.max_running,
                         .max_queue = s.cfg.max_queue,
                         .step_tokens = s.cfg.step_tokens,
                         .threads = s.cfg.threads};
    if (eng_sched_new(s.model, &so, &s.sched, err, sizeof err) != ENG_OK) {
        log_fatal(err);
        goto done;
    }
    const eng_config *mc = eng_model_config(s.model);
    /* system_fingerprint: changes with the build and with the weights file. */
    {
        char path[CFG_STR_MAX + 32];
        snprintf(path, sizeof path, "%s/model.safetensors", s.cfg.model_dir);
        struct stat st;
        uint64_t h = 0xCBF29CE484222325ull;
        const char *build = __DATE__ " " __TIME__ " " GPT2D_BUILD_VERSION;
        for (const char *p = build; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001B3ull;
        if (stat(path, &st) == 0) {
            uint64_t parts[3] = {(uint64_t)st.st_size, (uint64_t)st.st_mtim.tv_sec,
                                 (uint64_t)st.st_ino};
            for (int i = 0; i < 3; i++) h = (h ^ parts[i]) * 0x100000001B3ull;
        }
        snprintf(s.fingerprint, sizeof s.fingerprint, "fp_%012llx",
                 (unsigned long long)(h & 0xFFFFFFFFFFFFull));
    }
    http_route routes[SRV_MAX_ROUTES];
    s.nroutes = build_routes(&s.cfg, routes);
    s.routes = routes;
    s.loop = uv_default_loop();
    if (tok_pool_start(&s, err, sizeof err) != 0) {
        log_fatal(err);
        goto done;
    }
    /* Listen on the socket systemd passed (gpt2d.socket), else bind host:port. */
    int lfd = srv_sd_listen_fd(err, sizeof err);
    if (lfd == -2) {
        log_fatal(err);
        goto done;
    }
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME;
    if (lfd < 0 && uv_ip4_addr(s.cfg.host, s.cfg.port, (struct sockaddr_in *)&ss) != 0) {
        if (uv_ip6_addr(s.cfg.host, s.cfg.port, (struct sockaddr_in6 *)&ss) != 0) {
            snprintf(err, sizeof err, "host '%s' is not an IPv4 or IPv6 address", s.cfg.host);
            log_fatal(err);
            goto done;
        }
        flags |= MHD_USE_IPv6;
    }
    /* Connections over max_connections reach conn_on_notify, which closes an
     * idle one to make room (or refuses the newcomer): conn.c. libmicrohttpd
     * gets headroom for those closing: at its own limit it stops accepting
     * until its next run, which may be a timer's second away. */
    unsigned mhd_limit = (unsigned)s.cfg.max_connections + SRV_CONN_HEADROOM;
    unsigned per_ip = (unsigned)s.cfg.max_connections_per_ip;
    if (lfd >= 0)
        s.mhd = MHD_start_daemon(
            flags, 0, NULL, NULL, http_on_request, &s, MHD_OPTION_LISTEN_SOCKET, lfd,
            MHD_OPTION_NOTIFY_COMPLETED, http_on_completed, &s, MHD_OPTION_NOTIFY_CONNECTION,
            conn_on_notify, &s, MHD_OPTION_CONNECTION_LIMIT, mhd_limit,
            MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip, MHD_OPTION_CONNECTION_TIMEOUT,
            (unsigned)s.cfg.connection_timeout_s, MHD_OPTION_END);
    else
        s.mhd = MHD_start_daemon(
            flags, s.cfg.port, NULL, NULL, http_on_request, &s, MHD_OPTION_SOCK_ADDR,
            (struct sockaddr *)&ss, MHD_OPTION_NOTIFY_COMPLETED, http_on_completed, &s,
            MHD_OPTION_NOTIFY_CONNECTION, conn_on_notify, &s, MHD_OPTION_CONNECTION_LIMIT,
            mhd_limit, MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip, MHD_OPTION_CONNECTION_TIMEOUT,
            (unsigned)s.cfg.connection_timeout_s, MHD_OPTION_END);
    if (s.mhd == NULL) {
        if (lfd >= 0)
            snprintf(err, sizeof err, "cannot serve on the socket systemd passed (descriptor %d)",
                     lfd);
        else
            snprintf(err, sizeof err, "cannot listen on %s:%u (in use, or not allowed)", s.cfg.host,
                     s.cfg.port);
        log_fatal(err);
        goto done;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s.mhd, MHD_DAEMON_INFO_EPOLL_FD);
    const union MHD_DaemonInfo *pi = MHD_get_daemon_info(s.mhd, MHD_DAEMON_INFO_BIND_PORT);
    uv_poll_init(s.loop, &s.poll, di->epoll_fd);
    s.poll.data = &s;
    uv_poll_start(&s.poll, UV_READABLE, loop_on_poll);
    uv_timer_init(s.loop, &s.timer);
    s.timer.data = &s;
    uv_timer_init(s.loop, &s.drain_timer);
    s.drain_timer.data = &s;
    uv_timer_init(s.loop, &s.tick);
    s.tick.data = &s;
    uv_timer_start(&s.tick, loop_on_tick, 1000, 1000);
    uv_timer_init(s.loop, &s.sweep);
    s.sweep.data = &s;
    uv_timer_start(&s.sweep, conn_on_sweep, CONN_SWEEP_MS, CONN_SWEEP_MS);
    uv_signal_init(s.loop, &s.sigterm);
    uv_signal_init(s.loop, &s.sigint);
    s.sigterm.data = s.sigint.data = &s;
    uv_signal_start(&s.sigterm, on_signal, SIGTERM);
    uv_signal_start(&s.sigint, on_signal, SIGINT);
    signal(SIGPIPE, SIG_IGN);
    if (lfd >= 0)
        log_line("info",
                 "serving %s (%zu layers, width %zu) on the socket systemd passed (port %u)",
                 s.cfg.model_name, mc->n_layer, mc->n_embd, pi ? pi->port : 0);
    else
        log_line("info", "serving %s (%zu layers, width %zu) on http://%s:%u", s.cfg.model_name,
                 mc->n_layer, mc->n_embd, s.cfg.host, pi ? pi->port : s.cfg.port);
    uv_timer_init(s.loop, &s.watchdog);
    s.watchdog.data = &s;
    if (srv_sd_watchdog_usec() > 0) {
        uint64_t ms = srv_sd_watchdog_usec() / 2000;
        uv_timer_start(&s.watchdog, loop_on_watchdog, 0, ms > 0 ? ms : 1);
    }
    /* Ready only now: the model is loaded and the socket is listening. */
    srv_sd_notify("READY=1");
    loop_sd_status(&s);
    loop_mhd_run(&s);
    uv_run(s.loop, UV_RUN_DEFAULT);
    MHD_stop_daemon(s.mhd);
    s.mhd = NULL;
    log_line("info", "stopped");
    rc = 0;
done:
    if (rc != 0) tpool_close(s.tokpool);
    tpool_free(s.tokpool);
    eng_sched_free(s.sched);
    eng_model_free(s.model);
    bpe_free(s.tok);
    if (s.loop != NULL) uv_loop_close(s.loop);
    return rc;
}
