/*
 * server/daemon/daemon.c: `gpt2d serve`: the configuration, the model, the route
 * table, listening (a socket systemd passed, or host:port), and the
 * shutdown once the loop ends (lifecycle.c: the signals and the drain).
 */
#include "daemon/daemon.h"
#include "server.h"
#include "daemon/systemd.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef GPT2D_BUILD_VERSION
#define GPT2D_BUILD_VERSION "dev"
#endif

/* libmicrohttpd's unescaper, which leaves the request target as sent: the
 * router matches the undecoded path, so "/v1%2fcompletions" and
 * "/health%00junk" are unknown routes (404), not their decoded look-alikes,
 * and the access log shows what the client sent. No route reads query
 * arguments, which stay undecoded too. */
static size_t keep_escaped(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    return strlen(s);
}

/* Fills p[0..n) with the operating system's random bytes: getrandom,
 * retried when a signal interrupts it, else /dev/urandom (a kernel before
 * 3.17 has no getrandom: ENOSYS; a seccomp filter may refuse it). 0, or -1
 * with err naming what failed: the caller stops, since every secret of the
 * process (the prefix cache salts' key, the seeds' key) depends on these
 * bytes, and none may fall back to something guessable like the time. */
static int random_fill(void *p, size_t n, char *err, size_t errlen)
{
    unsigned char *b = p;
    size_t got = 0;
    int gr_errno = 0;
    while (got < n) {
        ssize_t k = getrandom(b + got, n - got, 0);
        if (k > 0) {
            got += (size_t)k;
        } else if (k == 0 || errno != EINTR) {
            gr_errno = k == 0 ? EIO : errno;
            break;
        }
    }
    if (got == n) return 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        got = 0;
        while (got < n) {
            ssize_t k = read(fd, b + got, n - got);
            if (k > 0) {
                got += (size_t)k;
            } else if (k == 0 || errno != EINTR) {
                if (k == 0) errno = EIO;
                break;
            }
        }
        int rd_errno = errno;
        close(fd);
        if (got == n) return 0;
        errno = rd_errno;
    }
    snprintf(err, errlen,
             "no random bytes from the operating system: getrandom: %s; /dev/urandom: %s",
             strerror(gr_errno), strerror(errno));
    return -1;
}

/* Whether d's listening socket is bound to a loopback address (127.0.0.0/8,
 * ::1, or IPv4-mapped loopback); 0 when unknown. */
static int listens_on_loopback(struct MHD_Daemon *d)
{
    const union MHD_DaemonInfo *li = MHD_get_daemon_info(d, MHD_DAEMON_INFO_LISTEN_FD);
    if (li == NULL) return 0;
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(li->listen_fd, (struct sockaddr *)&ss, &len) != 0) return 0;
    if (ss.ss_family == AF_INET) {
        const unsigned char *a =
            (const unsigned char *)&((const struct sockaddr_in *)(const void *)&ss)->sin_addr;
        return a[0] == 127;
    }
    if (ss.ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)&ss)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

/* Whether host:port (ss) can be bound now: a trial bind, with the
 * SO_REUSEADDR libmicrohttpd's listener uses, so that only a listener
 * already there (not a closed one's TIME_WAIT) counts. Port 0 always can.
 * 0 with err saying what to do, else 1. */
static int address_free(const struct sockaddr_storage *ss, char *err, size_t errlen,
                        const char *host, unsigned port)
{
    if (port == 0) return 1;
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 1; /* libmicrohttpd will say what fails */
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = ss->ss_family == AF_INET6 ? (socklen_t)sizeof(struct sockaddr_in6)
                                              : (socklen_t)sizeof(struct sockaddr_in);
    int ok = bind(fd, (const struct sockaddr *)ss, len) == 0;
    int e = errno;
    close(fd);
    if (ok) return 1;
    if (e == EADDRINUSE)
        snprintf(err, errlen,
                 "port %u on %s is in use (another gpt2d, or another server): stop it, or "
                 "choose another with --port",
                 port, host);
    else
        snprintf(err, errlen, "cannot listen on %s:%u: %s", host, port, strerror(e));
    return 0;
}

/* What is served, as the checkpoint describes itself (wformat.h): its
 * name, owner and description; random weights are a warning. */
static void model_lines(const srv *s)
{
    const eng_about *a = eng_model_about(s->api->model);
    char d[sizeof a->description + 64];
    srv_model_description(s->api->model, d, sizeof d);
    log_line("info", "model: %s, owned by %s%s%s", s->cfg.model_name,
             a->owned_by[0] != '\0' ? a->owned_by : "gpt2d", d[0] != '\0' ? ": " : "",
             d[0] != '\0' ? d : "(the checkpoint does not describe itself)");
    if (strcmp(a->weights, "random") == 0)
        log_line("warn", "random weights: the text is nonsense (a gpt2d synth checkpoint, for "
                         "tests and benchmarks; scripts/run.sh serves a trained model)");
}

/* Where a person on this machine reaches the server, as the effective
 * configuration and the bound port say: the playground's URL and a curl
 * line to try (an API key is named, never written). */
static void try_lines(const cfg_config *cfg, const char *scheme, unsigned port)
{
    const char *h = cfg->host;
    char host[CFG_STR_MAX + 2];
    if (h[0] == '\0' || strcmp(h, "0.0.0.0") == 0)
        snprintf(host, sizeof host, "127.0.0.1"); /* every address: this machine's is one */
    else if (strcmp(h, "::") == 0)
        snprintf(host, sizeof host, "[::1]");
    else if (strchr(h, ':') != NULL)
        snprintf(host, sizeof host, "[%s]", h); /* an IPv6 address */
    else
        snprintf(host, sizeof host, "%s", h);
    if (cfg->ui)
        log_line("info", "the playground: %s://%s:%u/ (open it in a browser)", scheme, host, port);
    /* A certificate the system does not trust (self-signed, a private CA)
     * needs curl's --cacert with the CA's file. */
    log_line("info",
             "try: curl -s %s://%s:%u/v1/completions -H 'Content-Type: application/json'%s -d "
             "'{\"model\": \"%s\", \"prompt\": \"Hello, my name is\", \"max_tokens\": 16}'",
             scheme, host, port,
             cfg->n_api_keys > 0 ? " -H \"Authorization: Bearer $GPT2D_API_KEY\"" : "",
             cfg->model_name);
}

/* RLIMIT_NOFILE against max_connections. libmicrohttpd accepts up to
 * max_connections + SRV_CONN_HEADROOM connections; past the descriptor
 * limit its accept() fails, and it stops accepting until a connection
 * closes, so every new client (a health probe too) waits behind idle ones
 * instead of being served or refused (conn.c). So a soft limit too low is
 * raised to the hard limit, and where the hard limit is too low as well,
 * max_connections is lowered to what fits (srv_fd_fit), with a warning
 * naming both numbers. 0, or -1 with err when not one connection fits. */
static int fd_limit_fit(cfg_config *cfg, char *err, size_t errlen)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 0;
    rlim_t need = (rlim_t)cfg->max_connections + SRV_CONN_HEADROOM + SRV_FD_RESERVE;
    if (rl.rlim_cur < need && (rl.rlim_max == RLIM_INFINITY || rl.rlim_max > rl.rlim_cur)) {
        /* An unlimited hard limit still has the kernel's nr_open above it:
         * ask for what is needed. */
        struct rlimit up = {rl.rlim_max == RLIM_INFINITY ? need : rl.rlim_max, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &up) == 0) {
            log_line("info",
                     "raised the descriptor limit (RLIMIT_NOFILE) from %llu to %llu for "
                     "max_connections %zu",
                     (unsigned long long)rl.rlim_cur, (unsigned long long)up.rlim_cur,
                     cfg->max_connections);
            rl.rlim_cur = up.rlim_cur;
        }
    }
    size_t fit = srv_fd_fit(cfg->max_connections);
    if (fit == cfg->max_connections) return 0;
    if (fit == 0) {
        snprintf(err, errlen,
                 "the descriptor limit (RLIMIT_NOFILE) is %llu: gpt2d needs more than %u (%u of "
                 "its own and %u connections past max_connections) to serve one connection; "
                 "raise LimitNOFILE (or ulimit -n)",
                 (unsigned long long)rl.rlim_cur, SRV_FD_RESERVE + SRV_CONN_HEADROOM,
                 SRV_FD_RESERVE, SRV_CONN_HEADROOM);
        return -1;
    }
    log_line("warn",
             "the descriptor limit (RLIMIT_NOFILE) is %llu (hard %llu), below the %llu that "
             "max_connections %zu needs (+ %u past it, + %u of gpt2d's own): max_connections "
             "lowered to %zu; raise LimitNOFILE (or ulimit -n) to serve more",
             (unsigned long long)rl.rlim_cur,
             (unsigned long long)(rl.rlim_max == RLIM_INFINITY ? rl.rlim_cur : rl.rlim_max),
             (unsigned long long)need, cfg->max_connections, SRV_CONN_HEADROOM, SRV_FD_RESERVE,
             fit);
    cfg->max_connections = fit;
    return 0;
}

/* SIGHUP (a reload), SIGUSR1 and SIGUSR2 kill the process by default,
 * and their handlers (lifecycle.c, libuv's) come with the loop, after the
 * model has loaded and warmed up (seconds for a large one). Until then a
 * handler of our own notes them here, one flag per signal: written by
 * that handler on whichever thread the kernel picks (blocking them would
 * not do: threads a library starts before main, OpenBLAS's, would still
 * take them and die of the default action), read once on the loop thread
 * when the real handlers are in, which then get each noted signal again
 * (a SIGHUP that came during start-up is a reload once the server serves).
 * docs/architecture.md lists it with the other global state. */
static volatile sig_atomic_t startup_signal_seen[3];
static const int startup_signal_nums[3] = {SIGHUP, SIGUSR1, SIGUSR2};

static void startup_signal_note(int signum)
{
    for (int i = 0; i < 3; i++)
        if (startup_signal_nums[i] == signum) startup_signal_seen[i] = 1;
}

static void startup_signals_catch(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = startup_signal_note;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* the start-up's reads go on */
    for (int i = 0; i < 3; i++) sigaction(startup_signal_nums[i], &sa, NULL);
}

/* After srv_signals_start: libuv's handlers have replaced ours; each
 * signal noted during start-up is raised again, to them. */
static void startup_signals_replay(void)
{
    for (int i = 0; i < 3; i++)
        if (startup_signal_seen[i]) {
            startup_signal_seen[i] = 0;
            raise(startup_signal_nums[i]);
        }
}

static void serve_usage(FILE *out)
{
    fprintf(out,
            "usage: gpt2d serve --model DIR [options]\n"
            "Serves the model in DIR (model.safetensors, vocab.json, merges.txt; given\n"
            "DIR/model.safetensors, its folder) over HTTP: OpenAI-compatible\n"
            "/v1/completions, /v1/chat/completions, /v1/responses and a playground\n"
            "page at /.\n"
            "\n"
            "The model: gpt2d-download --model gpt2-medium --dir DIR (or gpt2, -large, -xl)\n"
            "fetches a published checkpoint; gpt2d convert IN OUT --dtype bf16|q8 --layout\n"
            "panel64 makes it smaller and faster to serve (docs/api.md, \"Weight formats\").\n"
            "\n"
            "  %-24s this text\n"
            "  %-24s the build (version, commit, kernels)\n"
            "  %-24s every key with its default, as a config file\n"
            "\n"
            "Every option is also a config-file key (key = value); booleans take\n"
            "true/false, or --no-KEY:\n",
            "--help", "--version", "--print-defaults");
    cfg_print_help(out);
}

/* The routes: the router (router.c) looks requests up here. /health, /ready
 * and /metrics need no key when auth_open_health is set. */
static size_t build_routes(const cfg_config *cfg, http_route *t)
{
    int probe_key = !cfg->auth_open_health;
    size_t n = 0;
    t[n++] = (http_route){"POST", "/v1/completions", cmpl_route, 1, 0};
    t[n++] = (http_route){"POST", "/v1/chat/completions", cmpl_route_chat, 1, 0};
    t[n++] = (http_route){"POST", "/v1/responses", resp_route, 1, 0};
    t[n++] = (http_route){"POST", "/v1/embeddings", embed_route, 1, 0};
    t[n++] = (http_route){"GET", "/v1/responses/", resp_route_get, 1, 1}; /* {id}[/input_items] */
    t[n++] = (http_route){"DELETE", "/v1/responses/", resp_route_delete, 1, 1};
    t[n++] = (http_route){"GET", "/v1/models", probe_models, 1, 0};
    t[n++] = (http_route){"GET", "/v1/models/", probe_model, 1, 1}; /* /v1/models/{id} */
    t[n++] = (http_route){"GET", "/version", probe_version, probe_key, 0};
    if (cfg->ui) t[n++] = (http_route){"GET", "/", ui_page, 0, 0}; /* its API calls need keys */
    t[n++] = (http_route){"POST", "/v1/load_lora_adapter", adp_route_load, 1, 0};
    t[n++] = (http_route){"POST", "/v1/unload_lora_adapter", adp_route_unload, 1, 0};
    t[n++] = (http_route){"POST", "/tokenize", tok_route_tokenize, 1, 0};
    t[n++] = (http_route){"POST", "/detokenize", tok_route_detokenize, 1, 0};
    t[n++] = (http_route){"GET", "/health", probe_health, probe_key, 0};
    t[n++] = (http_route){"GET", "/ready", probe_ready, probe_key, 0};
    t[n++] = (http_route){"GET", "/metrics", probe_metrics, probe_key, 0};
    return n;
}
#define SRV_MAX_ROUTES 24

int srv_main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            serve_usage(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--version") == 0) {
            srv_print_version();
            return 0;
        }
        if (strcmp(argv[i], "--print-defaults") == 0) {
            cfg_print_defaults(stdout);
            return 0;
        }
    }
    startup_signals_catch();
    srv_sd_init();
    log_set_journal(srv_sd_journal());
    /* Each layer's state (http.h, api.h, daemon.h), linked: the upper
     * layers' code finds its own through the srv (s->api, s->daemon). */
    srv s;
    srv_api a;
    srv_daemon d;
    memset(&s, 0, sizeof s);
    memset(&a, 0, sizeof a);
    memset(&d, 0, sizeof d);
    s.api = &a;
    s.daemon = &d;
    char err[1024];
    met_init(&s.met, &a.met);
    /* The keys of the prefix cache salts (http/router.c) and of the seeds
     * of requests without one (api/completions.c, cmpl_seed): new at every
     * start, so two replicas or two runs share neither (issue 35). */
    if (random_fill(s.salt_secret, sizeof s.salt_secret, err, sizeof err) != 0
        || random_fill(a.seed_key, sizeof a.seed_key, err, sizeof err) != 0) {
        log_fatal(err);
        return 1;
    }
    d.argc = argc;
    d.argv = argv;
    if (srv_config_read(&s.cfg, argc, argv, err, sizeof err) != CFG_OK) {
        log_fatal(err);
        if (strncmp(err, "unknown option", 14) == 0) serve_usage(stderr);
        return 2;
    }
    {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        d.started_wall = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
    }
    /* The chat template: built in, none, or an operator's file. */
    if (strcmp(s.cfg.chat_template, "none") == 0) {
        a.chat_on = 0;
    } else if (strcmp(s.cfg.chat_template, "default") == 0) {
        if (oai_template_default(&a.chat) != 0) {
            log_fatal("out of memory");
            return 1;
        }
        a.chat_on = 1;
    } else {
        char terr[512];
        if (oai_template_load(s.cfg.chat_template, &a.chat, terr, sizeof terr) != 0) {
            snprintf(err, sizeof err, "chat_template: %s", terr);
            log_fatal(err);
            return 2;
        }
        a.chat_on = 1;
    }
    log_set_level(s.cfg.log_level);
    if (fd_limit_fit(&s.cfg, err, sizeof err) != 0) {
        log_fatal(err);
        return 2;
    }
    const char *delay = getenv("GPT2D_TEST_STEP_DELAY_MS");
    if (delay != NULL && atoi(delay) > 0) {
        a.step_delay_ms = (unsigned)atoi(delay);
        log_line("warn",
                 "GPT2D_TEST_STEP_DELAY_MS: every step sleeps %u ms (a test of a wedged "
                 "engine; never set it in production)",
                 a.step_delay_ms);
    }
    int rc = 1;
    /* Listen on the socket systemd passed (gpt2d.socket), else bind host:port.
     * The address is checked before the model loads (seconds, for a large
     * one): a port in use is said at once. */
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
    if (lfd < 0 && !address_free(&ss, err, sizeof err, s.cfg.host, s.cfg.port)) {
        log_fatal(err);
        goto done;
    }
    /* HTTPS: the certificate and key are read (and checked to go
     * together) before the model loads, so that a bad file is said at
     * once. */
    if (s.cfg.tls_cert_file[0] != '\0') {
        if (tls_open(&s, err, sizeof err) != 0) {
            log_fatal(err);
            rc = 2;
            goto done;
        }
        flags |= MHD_USE_TLS;
    }
    const char *scheme = s.tls != NULL ? "https" : "http";
    if (srv_models_load(&s, err, sizeof err) != 0) {
        log_fatal(err);
        goto done;
    }
    model_lines(&s);
    if (adp_start(&s, err, sizeof err) != 0) { /* lora_modules, before serving */
        log_fatal(err);
        goto done;
    }
    const eng_config *mc = eng_model_config(a.model);
    /* system_fingerprint: changes with the build and with any checkpoint's
     * weights file. */
    {
        uint64_t h = 0xCBF29CE484222325ull;
        const char *build = __DATE__ " " __TIME__ " " GPT2D_BUILD_VERSION;
        for (const char *p = build; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001B3ull;
        for (size_t k = 0; k < a.nckpt; k++) {
            char path[CFG_STR_MAX + 32];
            snprintf(path, sizeof path, "%s/model.safetensors", a.ckpt[k].dir);
            struct stat st;
            if (stat(path, &st) != 0) continue;
            uint64_t parts[3] = {(uint64_t)st.st_size, (uint64_t)st.st_mtim.tv_sec,
                                 (uint64_t)st.st_ino};
            for (int i = 0; i < 3; i++) h = (h ^ parts[i]) * 0x100000001B3ull;
        }
        snprintf(a.fingerprint, sizeof a.fingerprint, "fp_%012llx",
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
    /* Connections over max_connections, or over max_connections_per_ip
     * from one address, reach conn_on_notify, which closes an
     * idle one to make room (or refuses the newcomer): conn.c. libmicrohttpd
     * gets headroom for those closing: at its own limit it stops accepting
     * until its next run, which may be a timer's second away. */
    unsigned mhd_limit = (unsigned)s.cfg.max_connections + SRV_CONN_HEADROOM;
    /* The options both ways of listening share: the undecoded path,
     * libmicrohttpd's per-connection memory, the completion, connection and
     * request-line callbacks, the limits and the idle timeout. */
#define SRV_MHD_OPTIONS                                                                            \
    MHD_OPTION_UNESCAPE_CALLBACK, keep_escaped, NULL, MHD_OPTION_CONNECTION_MEMORY_LIMIT,          \
        (size_t)SRV_CONN_POOL_BYTES, MHD_OPTION_NOTIFY_COMPLETED, http_on_completed, &s,           \
        MHD_OPTION_NOTIFY_CONNECTION, conn_on_notify, &s, MHD_OPTION_URI_LOG_CALLBACK,             \
        http_on_uri, &s, MHD_OPTION_CONNECTION_LIMIT, mhd_limit, MHD_OPTION_CONNECTION_TIMEOUT,    \
        (unsigned)s.cfg.connection_timeout_s
    /* HTTPS: each handshake asks tls.c for the current certificate (so that
     * SIGHUP rotates it), and offers what tls_priorities allows (TLS 1.3
     * and 1.2 by default; libmicrohttpd's own default, GnuTLS's NORMAL,
     * takes TLS 1.0 and 1.1 too, which RFC 8996 retires); both options are
     * ignored without MHD_USE_TLS. */
#ifdef GPT2D_HAVE_GNUTLS
#define SRV_MHD_TLS                                                                                \
    , MHD_OPTION_HTTPS_CERT_CALLBACK, tls_pick, MHD_OPTION_HTTPS_PRIORITIES,                       \
        (const char *)s.cfg.tls_priorities
#else
#define SRV_MHD_TLS
#endif
    if (lfd >= 0)
        s.mhd =
            MHD_start_daemon(flags, 0, NULL, NULL, http_on_request, &s, MHD_OPTION_LISTEN_SOCKET,
                             lfd, SRV_MHD_OPTIONS SRV_MHD_TLS, MHD_OPTION_END);
    else
        s.mhd = MHD_start_daemon(flags, s.cfg.port, NULL, NULL, http_on_request, &s,
                                 MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                                 SRV_MHD_OPTIONS SRV_MHD_TLS, MHD_OPTION_END);
#undef SRV_MHD_OPTIONS
#undef SRV_MHD_TLS
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
    s.bind_loopback = listens_on_loopback(s.mhd);
    if (!s.bind_loopback && s.cfg.n_api_keys == 0)
        log_line("warn", "listening on a non-loopback address without an api_key: anyone who "
                         "reaches this port can use the model");
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s.mhd, MHD_DAEMON_INFO_EPOLL_FD);
    const union MHD_DaemonInfo *pi = MHD_get_daemon_info(s.mhd, MHD_DAEMON_INFO_BIND_PORT);
    uv_poll_init(s.loop, &s.poll, di->epoll_fd);
    s.poll.data = &s;
    uv_poll_start(&s.poll, UV_READABLE, loop_on_poll);
    uv_timer_init(s.loop, &s.timer);
    s.timer.data = &s;
    uv_timer_init(s.loop, &d.drain_timer);
    d.drain_timer.data = &s;
    /* The hook the completions register on the way down: their
     * back-pressure after each step (the 1 s tick calls cmpl_tick itself). */
    a.after_step = cmpl_after_step;
    uv_timer_init(s.loop, &d.tick);
    d.tick.data = &s;
    uv_timer_start(&d.tick, srv_on_tick, 1000, 1000);
    uv_timer_init(s.loop, &s.sweep);
    s.sweep.data = &s;
    uv_timer_start(&s.sweep, conn_on_sweep, CONN_SWEEP_MS, CONN_SWEEP_MS);
    srv_signals_start(&s);
    startup_signals_replay();
    srv_model_watch_start(&s);
    signal(SIGPIPE, SIG_IGN);
    int random = strcmp(eng_model_about(a.model)->weights, "random") == 0;
    if (lfd >= 0)
        log_line("info",
                 "serving %s (%zu layers, width %zu%s) on the socket systemd passed (port %u, %s)",
                 s.cfg.model_name, mc->n_layer, mc->n_embd,
                 random ? "; random weights: the text is nonsense" : "", pi ? pi->port : 0, scheme);
    else
        log_line("info", "serving %s (%zu layers, width %zu%s) on %s://%s:%u", s.cfg.model_name,
                 mc->n_layer, mc->n_embd, random ? "; random weights: the text is nonsense" : "",
                 scheme, s.cfg.host, pi ? pi->port : s.cfg.port);
    if (s.tls != NULL)
        log_line("info", "HTTPS with %s (key %s); SIGHUP reads them again; tls_priorities %s",
                 s.cfg.tls_cert_file, s.cfg.tls_key_file, s.cfg.tls_priorities);
    try_lines(&s.cfg, scheme, pi ? pi->port : s.cfg.port);
    uv_timer_init(s.loop, &d.watchdog);
    d.watchdog.data = &s;
    uv_timer_init(s.loop, &d.info_timer);
    d.info_timer.data = &s;
    d.info_last = log_now();
    if (s.cfg.info_interval_s > 0) {
        uint64_t ms = (uint64_t)(s.cfg.info_interval_s * 1000);
        uv_timer_start(&d.info_timer, srv_on_info, ms > 0 ? ms : 1, ms > 0 ? ms : 1);
    }
    if (srv_sd_watchdog_usec() > 0) {
        uint64_t ms = srv_sd_watchdog_usec() / 2000;
        uv_timer_start(&d.watchdog, srv_on_watchdog, 0, ms > 0 ? ms : 1);
    }
    /* Ready only now: the model is loaded and the socket is listening. */
    srv_sd_notify("READY=1");
    srv_sd_status(&s);
    loop_mhd_run(&s);
    uv_run(s.loop, UV_RUN_DEFAULT);
    /* libmicrohttpd aborts the process when it is stopped with a connection
     * suspended (a request still tokenizing or waiting when the drain's
     * grace ran out): resumed, they are closed like the others. */
    conn_resume_all(&s);
    MHD_stop_daemon(s.mhd);
    s.mhd = NULL;
    rc = d.exit_code;
    log_line("info", "stopped (exit status %d)", rc);
done:
    /* The loop's end (close_all) closed the pool; a start-up failure did not. */
    if (!s.closed) tpool_close(a.tokpool);
    tok_pool_free(&s);
    rs_free(a.resp_store); /* nothing stored outlives the process */
    tls_close(&s);         /* after MHD_stop_daemon: no handshake is left */
    oai_template_free(&a.chat);
    if (s.api != NULL) adp_free_all(&s);
    srv_models_free(&s);
    gram_cache_free(a.gcache);
    free(a.tool_marker);
    free(a.all_tokens);
    gram_vocab_free(a.gvocab);
    bpe_free(a.tok);
    if (s.loop != NULL) uv_loop_close(s.loop);
    return rc;
}
