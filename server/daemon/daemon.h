/*
 * server/daemon/daemon.h: the daemon, the top of server/: it builds the
 * server object and the route table, registers the hooks, runs the loop,
 * and owns the process's lifecycle. Its files:
 *
 *   daemon.c      start-up, listen, the route table and the hooks, the loop,
 *                 shutdown
 *   lifecycle.c   signals, the drain and its end
 *   reload.c      SIGHUP: the configuration read again
 *   models.c      the served checkpoints loaded, their schedulers started
 *   modelwatch.c  the served weights files watched; SIGBUS named
 *   timers.c      the 1 s tick, the systemd watchdog and status, the info
 *                 line
 *   probes.c      /health, /ready, /v1/models[/{id}], /metrics, /version
 *   ui.c          the playground page at / (server/ui/, built into the
 *                 binary by scripts/embed.py)
 *   metrics.c     counters, histograms, the Prometheus page (a leaf)
 *   systemd.c     sd_notify, the watchdog interval, the journal (a leaf)
 *
 * Its state is struct srv_daemon (below): srv_main makes it beside the
 * HTTP layer's srv and the API layer's srv_api, and links the three
 * (srv.api, srv.daemon); the layers below see it only as an opaque
 * pointer.
 *
 * Thread: the loop thread (modelwatch.c's SIGBUS handler aside).
 *
 * Prefixes: srv_ (daemon), probe_, ui_, met_ (the /metrics page).
 */
#ifndef GPT2D_SERVER_DAEMON_H
#define GPT2D_SERVER_DAEMON_H

#include "api/api.h"
#include "daemon/metrics.h"

/* ---- The daemon's state (srv_main makes it) -------------------------------- */

/* What identifies a file's contents cheaply: a copy over it changes the
 * size or the modification time, a rename over it the inode. */
typedef struct {
    int exists;
    uint64_t dev, ino, size;
    int64_t mtime_s, mtime_ns;
} srv_file_id;
/* Words of the model file's digest (modelwatch.c): four lanes and the
 * length. */
#define SRV_DIGEST_WORDS 5

/* One watched weights file (modelwatch.c), watch[i] checkpoint i's: its
 * path, its identity as loaded, the digest of its bytes as loaded
 * (digest_ok once known), and the digest job in flight on the work queue
 * (NULL: none). */
typedef struct {
    char path[CFG_STR_MAX + 32];
    srv_file_id id;
    uint64_t digest[SRV_DIGEST_WORDS];
    int digest_ok;
    struct mw_job *job;
} srv_watch;

typedef struct srv_daemon srv_daemon;
struct srv_daemon {
    /* lifecycle.c: the signals, the drain (its timer and start) and its
     * end; exit_code is srv_main's status once the loop ends. */
    uv_signal_t sigterm, sigint, sighup, sigusr1, sigusr2;
    uv_timer_t drain_timer;
    double drain_started;
    double cut_at;
    int exit_code;
    /* reload.c: the command line, read again on SIGHUP. */
    int argc;
    char **argv;
    /* timers.c: the 1 s tick; systemd's watchdog and the last STATUS= line
     * sent; the periodic info line (when it was last written, and the
     * token counters then). */
    uv_timer_t tick;
    uv_timer_t watchdog;
    char sd_status[160];
    uv_timer_t info_timer;
    double info_last;
    uint64_t info_prompt, info_completion;
    double started_wall; /* Unix seconds at start-up (process_start_time_seconds) */
    /* modelwatch.c: the served weights files as they were loaded, one a
     * checkpoint (watch[0] the primary's), looked at by one timer. */
    uv_timer_t model_timer;
    srv_watch watch[SRV_MAX_CKPT];
    size_t nwatch;
    /* The SIGBUS handler's wake-up of the loop: a read past the file's
     * new end (it shrank under the mapping); closed with the loop's other
     * handles, after which a SIGBUS exits at once. */
    uv_async_t sigbus_wake;
};

/* ---- lifecycle.c, reload.c, modelwatch.c ---------------------------------- */

/* srv_main's exit status when the model file changed under the server (a
 * drain, then this status, so that systemd restarts it on the new file). */
#define SRV_EXIT_MODEL_CHANGED 3
/* Seconds the responses ended by a drain's end get to be written before the
 * loop stops regardless (shutdown_timeout + this bounds the exit). */
#define SRV_CUT_GRACE_S 0.5

/* Builds the configuration: defaults < the config file (--config, else
 * /etc/gpt2d/gpt2d.conf when it exists) < the command line; validated.
 * CFG_OK, or the status with err naming the key and its file:line or
 * option. */
cfg_status srv_config_read(cfg_config *c, int argc, char **argv, char *err, size_t errlen);

/* Whether DIR holds a model's weights (DIR/model.safetensors exists). */
int srv_model_present(const char *dir);
/* fallback_model in model's place when model has no weights yet (the
 * installed configuration: the embedded gpt2d-tiny until GPT-2 is
 * downloaded): 1 with c->model_dir replaced and the folder that was wanted
 * in wanted (when not NULL), else 0 and c unchanged. Start-up and SIGHUP
 * both apply it, so that a reload compares like with like. */
int srv_model_fallback(cfg_config *c, char *wanted, size_t len);

/* Descriptors gpt2d needs beside its connections' and the
 * SRV_CONN_HEADROOM past max_connections: stdio, the listener, the epoll
 * and event descriptors of libmicrohttpd and libuv, libuv's signal pipe,
 * the model's and the tokenizer's files while they load, a config file or
 * a certificate read on SIGHUP, /proc for /metrics, the journal's socket
 * (about 25 in all), with room to spare: the CONN_DRAIN_MAX lingering
 * reads of closed connections (http.h) take theirs from it. */
#define SRV_FD_RESERVE 64u
/* The max_connections that the descriptor limit (RLIMIT_NOFILE's soft
 * limit, as it is now) leaves room for: max_connections itself when it
 * fits with SRV_CONN_HEADROOM + SRV_FD_RESERVE beside it, else fewer; 0
 * when not one connection fits. */
size_t srv_fd_fit(size_t max_connections);
/* The names the model answers to when no file or option set model_name:
 * the checkpoint's own (gpt2d.model_name, eng_model_about), reported,
 * and the default "gpt2" still accepted, so that the examples and clients
 * written for it keep working. Otherwise c is left as it is. */
void srv_model_names(cfg_config *c, const eng_model *m);

/* What the served model is, in one line for people: the checkpoint's
 * description; a checkpoint known to be random says so first ("random
 * weights: the text is nonsense"). "" when the file says nothing. */
void srv_model_description(const eng_model *m, char *buf, size_t len);
/* Start-up: the checkpoints of model (the primary with the tokenizer, the
 * draft model, the structured outputs' vocabulary, then the others), each
 * one's scheduler on its share of kv_cache_mb, warmed up; the files
 * watched from before they are read (srv_model_watch_init). 0, or -1 with
 * err (the fatal line). srv_models_free undoes it (any part). */
int srv_models_load(srv *s, char *err, size_t errlen);
void srv_models_free(srv *s);
/* Starts the signal handlers: SIGTERM and SIGINT drain (a second one ends
 * the drain at once), SIGHUP reloads, SIGUSR1 and SIGUSR2 are logged and
 * otherwise ignored. */
void srv_signals_start(srv *s);
/* Starts the drain once: /ready answers 503, new completions 503, running
 * ones finish within shutdown_timeout, then the rest are ended cleanly and
 * the loop stops; srv_main then returns exit_code. why is logged. */
void srv_drain_begin(srv *s, int exit_code, const char *why);
/* Ends the drain now: every request still generating ends with a final
 * event naming the shutdown (streams) or 503 (whole answers). */
void srv_drain_cut(srv *s, const char *why);
/* SIGHUP: reads the configuration again (the file and the command line) and
 * applies the keys that may change while serving; any other changed key is
 * logged as needing a restart; a bad file is refused whole, logged with
 * its file:line. */
void srv_reload(srv *s);
/* The identity of the file at path now (exists 0 when stat fails). */
void srv_file_id_get(const char *path, srv_file_id *out);
/* 1 when a and b are the same file with the same contents, as far as
 * srv_file_id tells. */
int srv_file_id_same(const srv_file_id *a, const srv_file_id *b);
/* Records the served weights file before it is loaded; then watches it
 * (once a second) and drains with SRV_EXIT_MODEL_CHANGED when it changes.
 * Also installs the SIGBUS handler for a read of its mapping past the
 * file's end (it shrank under it): before srv_model_watch_start, one line
 * naming the file and the exit; after, a page of zeros in place and the
 * change handled on the loop (the drain cut at once, every stream ended
 * cleanly). */
void srv_model_watch_init(srv *s);
void srv_model_watch_start(srv *s);

/* ---- probes.c, ui.c: the small GET routes --------------------------------- */

enum MHD_Result probe_health(srv_req *r); /* probes.c */
enum MHD_Result probe_ready(srv_req *r);
enum MHD_Result probe_models(srv_req *r);
enum MHD_Result probe_model(srv_req *r); /* GET /v1/models/{id} */
enum MHD_Result probe_metrics(srv_req *r);
enum MHD_Result probe_version(srv_req *r);
enum MHD_Result ui_page(srv_req *r); /* ui.c: GET / and its assets */

/* The build, as /version and gpt2d_build_info report it. */
const char *srv_version(void);
const char *srv_commit(void);
const char *srv_buildtype(void);

/* ---- timers.c: the daemon's clocks ----------------------------------------- */

/* The 1 s tick: the completions' policy (cmpl_tick), then the systemd
 * status line. */
void srv_on_tick(uv_timer_t *t);
/* systemd's watchdog: pings while steps progress. */
void srv_on_watchdog(uv_timer_t *t);
/* systemd's STATUS= line, sent when it changed. */
void srv_sd_status(srv *s);
/* The log line of what the server did since the last one (info_interval):
 * nothing when it was idle. */
void srv_on_info(uv_timer_t *t);
#endif
