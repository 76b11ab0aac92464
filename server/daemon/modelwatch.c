/*
 * server/daemon/modelwatch.c: the served weights file, watched.
 *
 * The file is mapped, so a change under the running server either changes
 * the answers silently (a copy over it: the same inode, new bytes under the
 * mapping) or kills it (a file that shrinks: reading a page past its end is
 * SIGBUS). Its identity (device, inode, size, modification time) is taken
 * before it is loaded and compared once a second. When it differs, one line
 * says so and the server drains and exits with SRV_EXIT_MODEL_CHANGED, so
 * that systemd (Restart=on-failure) starts it again on the new file. A file
 * renamed over the old one (the safe way: the old inode stays mapped and
 * intact) gets the whole drain; a file changed in place (the same inode) is
 * no longer the one the running requests read, so the drain ends at once
 * (every stream gets its clean ending).
 *
 * A read of a truncated mapping raises SIGBUS before the watch sees the
 * change: its handler writes one preformatted line naming the file (write
 * is async-signal-safe; nothing is formatted in the handler) and exits.
 */
#include "daemon/daemon.h"
#include "daemon/systemd.h"

#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void srv_file_id_get(const char *path, srv_file_id *out)
{
    memset(out, 0, sizeof *out);
    struct stat st;
    if (stat(path, &st) != 0) return;
    out->exists = 1;
    out->dev = (uint64_t)st.st_dev;
    out->ino = (uint64_t)st.st_ino;
    out->size = (uint64_t)st.st_size;
    out->mtime_s = (int64_t)st.st_mtim.tv_sec;
    out->mtime_ns = (int64_t)st.st_mtim.tv_nsec;
}

int srv_file_id_same(const srv_file_id *a, const srv_file_id *b)
{
    return a->exists == b->exists && a->dev == b->dev && a->ino == b->ino && a->size == b->size
           && a->mtime_s == b->mtime_s && a->mtime_ns == b->mtime_ns;
}

/* What changed, in words, into buf. */
static void describe_change(const srv_file_id *was, const srv_file_id *now, char *buf, size_t len)
{
    if (!now->exists)
        snprintf(buf, len, "it is gone");
    else if (now->dev != was->dev || now->ino != was->ino)
        snprintf(buf, len, "another file was put in its place");
    else if (now->size != was->size)
        snprintf(buf, len, "its size went from %llu to %llu bytes in place",
                 (unsigned long long)was->size, (unsigned long long)now->size);
    else
        snprintf(buf, len, "it was rewritten in place (its modification time changed)");
}

static void on_model_timer(uv_timer_t *t)
{
    srv *s = t->data;
    srv_file_id now;
    srv_file_id_get(s->model_path, &now);
    if (srv_file_id_same(&now, &s->model_id)) return;
    uv_timer_stop(t);
    char what[128];
    describe_change(&s->model_id, &now, what, sizeof what);
    int in_place = now.exists && now.dev == s->model_id.dev && now.ino == s->model_id.ino;
    log_line("error",
             "the model file %s changed under the running server: %s; draining, then exiting "
             "with status %d so that it restarts on the new file (replace the file with a "
             "rename: docs/operations.md)",
             s->model_path, what, SRV_EXIT_MODEL_CHANGED);
    srv_drain_begin(s, SRV_EXIT_MODEL_CHANGED, "the model file changed");
    if (in_place) srv_drain_cut(s, "the model file changed in place");
}

/* The line the SIGBUS handler writes, made before it can be needed. */
static char sigbus_line[CFG_STR_MAX + 512];
static size_t sigbus_len;

static void on_sigbus(int signum)
{
    (void)signum;
    ssize_t w = write(STDERR_FILENO, sigbus_line, sigbus_len);
    (void)w;
    _exit(SRV_EXIT_MODEL_CHANGED);
}

void srv_model_watch_init(srv *s)
{
    snprintf(s->model_path, sizeof s->model_path, "%s/model.safetensors", s->cfg.model_dir);
    srv_file_id_get(s->model_path, &s->model_id);
    int n = snprintf(sigbus_line, sizeof sigbus_line,
                     "%sgpt2d serve: SIGBUS reading the mapped model file %s: it was truncated "
                     "or overwritten while served (replace it with a rename); exiting with "
                     "status %d\n",
                     srv_sd_journal() ? "<2>" : "", s->model_path, SRV_EXIT_MODEL_CHANGED);
    sigbus_len = n < 0 ? 0 : (size_t)n < sizeof sigbus_line ? (size_t)n : sizeof sigbus_line - 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

void srv_model_watch_start(srv *s)
{
    uv_timer_init(s->loop, &s->model_timer);
    s->model_timer.data = s;
    uv_timer_start(&s->model_timer, on_model_timer, 1000, 1000);
}
