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
    if (st == CFG_OK) st = model_folder(c, err, errlen);
    return st;
}

void srv_reload(srv *s)
{
    srv_sd_notify("RELOADING=1");
    cfg_config next;
    char err[1024];
    if (srv_config_read(&next, s->argc, s->argv, err, sizeof err) != CFG_OK) {
        log_line("error", "SIGHUP: reload refused, the configuration is unchanged: %s", err);
        srv_sd_notify("READY=1");
        return;
    }
    size_t old_queue = s->cfg.max_queue;
    char changed[512], kept[512];
    size_t n = cfg_apply_reload(&s->cfg, &next, changed, sizeof changed, kept, sizeof kept);
    log_set_level(s->cfg.log_level);
    if (s->cfg.max_queue != old_queue
        && eng_sched_set_max_queue(s->sched, s->cfg.max_queue, err, sizeof err) != ENG_OK) {
        log_line("error", "SIGHUP: max_queue stays %zu: %s", old_queue, err);
        s->cfg.max_queue = old_queue;
    }
    if (n > 0)
        log_line("info", "SIGHUP: configuration reloaded; changed: %s", changed);
    else
        log_line("info", "SIGHUP: configuration reloaded; no reloadable key changed");
    if (kept[0] != '\0')
        log_line("warn", "SIGHUP: changed, but needs a restart (the running value is kept): %s",
                 kept);
    srv_sd_notify("READY=1");
}
