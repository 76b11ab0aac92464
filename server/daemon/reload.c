/*
 * server/daemon/reload.c: reading the configuration (at start-up and on SIGHUP).
 *
 * The configuration is built-in defaults < the config file (--config, else
 * /etc/gpt2d/gpt2d.conf when it exists) < the command line. SIGHUP builds it
 * again the same way from the same command line, so the file's new values
 * count and the command line still wins, and then applies only the keys
 * that may change while serving (cfg_key_reloadable): the handlers read
 * s->cfg per request, so a new API key or limit applies to the next request
 * and no connection is dropped. A key that needs a restart keeps its value
 * and is named in the log; a file that does not parse is refused whole.
 */
#include "daemon/daemon.h"
#include "daemon/systemd.h"
#include "errbuf.h"

#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* The configuration file read when no --config is given, if it exists. */
#define SRV_DEFAULT_CONFIG "/etc/gpt2d/gpt2d.conf"

/* `model` names a folder (a Hugging Face snapshot's layout). Given the
 * weights file itself, model.safetensors, its folder is meant: that is
 * used, here, so that start-up and SIGHUP agree. Another file is refused
 * with what --model takes, rather than serving the folder's
 * model.safetensors in its place. */
static cfg_status model_folder(cfg_config *c, char *err, size_t errlen)
{
    struct stat st;
    if (stat(c->model_dir, &st) != 0 || !S_ISREG(st.st_mode)) return CFG_OK;
    const char *slash = strrchr(c->model_dir, '/');
    const char *base = slash ? slash + 1 : c->model_dir;
    if (strcmp(base, "model.safetensors") != 0) {
        return ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                           "model: %s is a file; --model takes the folder that holds "
                           "model.safetensors, vocab.json and merges.txt (gpt2d convert writes "
                           "a model.safetensors)",
                           c->model_dir);
    }
    if (slash == NULL)
        snprintf(c->model_dir, sizeof c->model_dir, ".");
    else if (slash == c->model_dir)
        c->model_dir[1] = '\0'; /* "/model.safetensors": the root */
    else
        c->model_dir[slash - c->model_dir] = '\0';
    return CFG_OK;
}

cfg_status srv_config_read(cfg_config *c, int argc, char **argv, char *err, size_t errlen)
{
    int explicit_config = 0;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--config") == 0 || strncmp(argv[i], "--config=", 9) == 0)
            explicit_config = 1;
    cfg_defaults(c);
    cfg_status st = CFG_OK;
    if (!explicit_config && access(SRV_DEFAULT_CONFIG, F_OK) == 0)
        st = cfg_load_file(c, SRV_DEFAULT_CONFIG, err, errlen);
    if (st == CFG_OK) st = cfg_parse_args(c, argc, argv, 1, err, errlen);
    if (st == CFG_OK) st = cfg_validate(c, err, errlen);
    /* The priority string is GnuTLS's to parse: a bad one is said here,
     * naming the key, not by libmicrohttpd's start as a failure to listen
     * (and a reload that brings one is refused whole). */
    if (st == CFG_OK && tls_priorities_check(c->tls_priorities, err, errlen) != 0) st = CFG_EVALUE;
    if (st == CFG_OK) st = cfg_models_split(c, err, errlen);
    if (st == CFG_OK) st = model_folder(c, err, errlen);
    return st;
}

int srv_model_present(const char *dir)
{
    char path[CFG_STR_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    return access(path, F_OK) == 0;
}

int srv_model_fallback(cfg_config *c, char *wanted, size_t len)
{
    if (c->fallback_model[0] == '\0' || srv_model_present(c->model_dir)) return 0;
    if (wanted != NULL) snprintf(wanted, len, "%s", c->model_dir);
    snprintf(c->model_dir, sizeof c->model_dir, "%s", c->fallback_model);
    return 1;
}

size_t srv_fd_fit(size_t max_connections)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return max_connections;
    rlim_t own = (rlim_t)SRV_CONN_HEADROOM + SRV_FD_RESERVE;
    if (rl.rlim_cur <= own) return 0;
    if (rl.rlim_cur - own >= max_connections) return max_connections;
    return (size_t)(rl.rlim_cur - own);
}

void srv_model_names(cfg_config *c, const eng_model *m)
{
    const char *own = eng_model_about(m)->name;
    if (c->model_name_set || own[0] == '\0' || strcmp(own, c->model_name) == 0) return;
    /* The default's one name moves second; wformat.h's rule for a
     * checkpoint's name is model_name's (printable, no spaces, < 128). */
    memcpy(c->model_names[1], c->model_names[0], sizeof c->model_names[1]);
    snprintf(c->model_names[0], sizeof c->model_names[0], "%s", own);
    snprintf(c->model_name, sizeof c->model_name, "%s", own);
    c->n_model_names = 2;
}

void srv_model_description(const eng_model *m, char *buf, size_t len)
{
    const eng_about *a = eng_model_about(m);
    if (strcmp(a->weights, "random") == 0)
        snprintf(buf, len, "random weights: the text is nonsense%s%s",
                 a->description[0] != '\0' ? "; " : "", a->description);
    else
        snprintf(buf, len, "%s", a->description);
}

void srv_reload(srv *s)
{
    srv_sd_notify("RELOADING=1");
    cfg_config next;
    char err[1024];
    if (srv_config_read(&next, s->daemon->argc, s->daemon->argv, err, sizeof err) != CFG_OK) {
        log_line("error", "SIGHUP: reload refused, the configuration is unchanged: %s", err);
        srv_sd_notify("READY=1");
        return;
    }
    srv_model_fallback(&next, NULL, 0); /* as at start-up */
    /* HTTPS is on or off for the process's life (libmicrohttpd's
     * listener): the certificate's paths change, not whether there is one. */
    if ((next.tls_cert_file[0] != '\0') != (s->tls != NULL)) {
        log_line("warn",
                 "SIGHUP: HTTPS is turned %s only by a restart; tls_cert_file and "
                 "tls_key_file keep their running values",
                 s->tls != NULL ? "off" : "on");
        snprintf(next.tls_cert_file, sizeof next.tls_cert_file, "%s", s->cfg.tls_cert_file);
        snprintf(next.tls_key_file, sizeof next.tls_key_file, "%s", s->cfg.tls_key_file);
    }
    /* The certificate is read again every time (a rotation writes new
     * files under the same names); a bad one leaves the current one
     * serving, and its paths with it. */
    if (s->tls != NULL) {
        char cert[sizeof s->cfg.tls_cert_file], key[sizeof s->cfg.tls_key_file];
        snprintf(cert, sizeof cert, "%s", s->cfg.tls_cert_file);
        snprintf(key, sizeof key, "%s", s->cfg.tls_key_file);
        snprintf(s->cfg.tls_cert_file, sizeof s->cfg.tls_cert_file, "%s", next.tls_cert_file);
        snprintf(s->cfg.tls_key_file, sizeof s->cfg.tls_key_file, "%s", next.tls_key_file);
        if (tls_reload(s, err, sizeof err) == 0) {
            log_line("info", "SIGHUP: HTTPS certificate loaded from %s; new connections get it",
                     s->cfg.tls_cert_file);
        } else {
            log_line("error", "SIGHUP: the HTTPS certificate is unchanged (still %s): %s", cert,
                     err);
            snprintf(next.tls_cert_file, sizeof next.tls_cert_file, "%s", cert);
            snprintf(next.tls_key_file, sizeof next.tls_key_file, "%s", key);
        }
        snprintf(s->cfg.tls_cert_file, sizeof s->cfg.tls_cert_file, "%s", cert);
        snprintf(s->cfg.tls_key_file, sizeof s->cfg.tls_key_file, "%s", key);
    }
    srv_model_names(&next, s->api->model); /* as at start-up: the same model */
    /* As at start-up: max_connections within the descriptor limit (so that
     * a lowered one is not taken for a change that needs a restart). */
    size_t fit = srv_fd_fit(next.max_connections);
    if (fit > 0) next.max_connections = fit;
    size_t old_queue = s->cfg.max_queue;
    char changed[512], kept[512];
    size_t n = cfg_apply_reload(&s->cfg, &next, changed, sizeof changed, kept, sizeof kept);
    log_set_level(s->cfg.log_level);
    if (s->cfg.max_queue != old_queue) { /* every checkpoint's, or none */
        size_t i = 0;
        while (i < s->api->nckpt
               && eng_sched_set_max_queue(s->api->ckpt[i].sched, s->cfg.max_queue, err, sizeof err)
                      == ENG_OK)
            i++;
        if (i < s->api->nckpt) {
            log_line("error", "SIGHUP: max_queue stays %zu: %s", old_queue, err);
            s->cfg.max_queue = old_queue;
            while (i-- > 0) /* back to the old size, which they had room for */
                (void)eng_sched_set_max_queue(s->api->ckpt[i].sched, old_queue, err, sizeof err);
        }
    }
    adp_reload(s); /* lora_modules' changes (their loads go on off the loop) */
    /* Lowered store bounds apply now, not at the next stored response. */
    size_t dropped =
        rs_trim(s->api->resp_store, s->cfg.responses_store_max, s->cfg.responses_store_bytes);
    if (dropped > 0)
        log_line("info",
                 "SIGHUP: %zu stored %s dropped to fit responses_store_max %zu and "
                 "responses_store_bytes %zu",
                 dropped, log_plural(dropped, "response", "responses"), s->cfg.responses_store_max,
                 s->cfg.responses_store_bytes);
    /* A lowered structured_cache_mb applies now too. */
    size_t gone = s->api->gcache != NULL
                      ? gram_cache_set_max_bytes(s->api->gcache, s->cfg.structured_cache_mb << 20)
                      : 0;
    if (gone > 0)
        log_line("info", "SIGHUP: %zu compiled %s dropped to fit structured_cache_mb %zu", gone,
                 log_plural(gone, "format", "formats"), s->cfg.structured_cache_mb);
    if (n > 0)
        log_line("info", "SIGHUP: configuration reloaded; changed: %s", changed);
    else
        log_line("info", "SIGHUP: configuration reloaded; no reloadable key changed");
    if (kept[0] != '\0')
        log_line("warn", "SIGHUP: changed, but needs a restart (the running value is kept): %s",
                 kept);
    int others = next.n_more_models != s->cfg.n_more_models;
    for (size_t i = 0; !others && i < next.n_more_models; i++)
        others = strcmp(next.more_models[i].name, s->cfg.more_models[i].name) != 0
                 || strcmp(next.more_models[i].dir, s->cfg.more_models[i].dir) != 0;
    if (others)
        log_line("warn", "SIGHUP: changed, but needs a restart (the running checkpoints are "
                         "kept): model's other checkpoints");
    srv_sd_notify("READY=1");
}
