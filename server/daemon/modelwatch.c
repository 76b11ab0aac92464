/*
 * server/daemon/modelwatch.c: the served weights files, watched (each
 * checkpoint's; a change to any one drains the whole server, which
 * restarts on the new files: the others' requests end cleanly too).
 *
 * The file is mapped, so a change under the running server either changes
 * the answers silently (a copy over it: the same inode, new bytes under the
 * mapping) or kills it (a file that shrinks: reading a page past its end is
 * SIGBUS). Its identity (device, inode, size, modification time) is taken
 * before it is loaded and compared once a second.
 *
 * An identity that differs is not yet a change: `touch`, or a deployment
 * that writes the same bytes again (in place or renamed over it), changes
 * the identity and not the weights. So the bytes decide: a digest of the
 * file is taken once after start-up (of the bytes as loaded: the identity
 * is the same before and after the digest) and again whenever the
 * identity changes, both on the work queue (a GPT-2-small file is 250-500
 * MB; the loop thread never reads it). The same digest: the new identity
 * is adopted with one info line, and nothing else happens. A different
 * size, a missing file, or a different digest is a change: one line says
 * so and the server drains and exits with SRV_EXIT_MODEL_CHANGED, so that
 * systemd (Restart=on-failure) starts it again on the new file. A file
 * renamed over the old one (the safe way: the old inode stays mapped and
 * intact) gets the whole drain; a file changed in place (the same inode)
 * is no longer the one the running requests read, so the drain ends at
 * once (every stream gets its clean ending).
 *
 * The digest: four 64-bit lanes over the file's little-endian words
 * (multiply-rotate rounds, the words spread round-robin over the lanes) and
 * its length, 320 bits compared whole. It detects accidental and deployment
 * changes; it is not a defence against someone who can write the model
 * file (that person owns the server anyway). It runs at memory speed
 * (256 MB from the page cache in 0.15 s on a loaded 2-core machine, so
 * about 0.3 s for GPT-2 small's 500 MB), far cheaper than a cryptographic
 * hash, and runs one digest at a time: a second
 * change while one runs is looked at by the next tick.
 *
 * A read of a truncated mapping (`cp` over the file truncates it first,
 * then writes) raises SIGBUS in the step, usually before the watch sees
 * the change. Once the loop runs, the handler puts a page of zeros where
 * the missing page was (the read then goes on: the step finishes, its
 * text is nonsense, as with any bytes written in place) and wakes the loop
 * (uv_async_send, async-signal-safe), which treats it as a change in
 * place: one line, the drain and its cut at once, so that every stream
 * gets its clean ending before the exit with SRV_EXIT_MODEL_CHANGED. Each
 * missing page costs one signal. mmap is not on POSIX's list of
 * async-signal-safe calls; the handler makes the bare system call
 * (syscall(SYS_mmap)), which takes no lock of the process's. Before the loop runs (a read at load),
 * or when the page cannot be replaced, the handler writes one
 * preformatted line naming the file (nothing is formatted in the handler)
 * and exits with the same status.
 */
#include "daemon/daemon.h"
#include "daemon/systemd.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Bytes read at a time (a multiple of 32: whole rounds of the four lanes). */
#define MW_READ_BYTES (1u << 20)

/* One digest of the file, on the work queue. expect: the identity the
 * file had when the job was asked for; before/after: what stat said on
 * either side of the read (the digest counts only when both equal). */
typedef struct mw_job {
    uv_work_t work;
    srv *s;
    srv_watch *w;
    int at_load; /* the digest of the file as loaded (else: a changed identity) */
    srv_file_id expect, before, after;
    int ok; /* read whole */
    uint64_t digest[SRV_DIGEST_WORDS];
    char path[CFG_STR_MAX + 32];
} mw_job;

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

#define MW_P1 UINT64_C(0x9E3779B185EBCA87)
#define MW_P2 UINT64_C(0xC2B2AE3D27D4EB4F)

static uint64_t mw_round(uint64_t lane, uint64_t w)
{
    lane += w * MW_P2;
    lane = (lane << 31) | (lane >> 33);
    return lane * MW_P1;
}

/* The digest of the file at path into d; 0, or -1 when it cannot be read
 * whole. Thread: a work-queue thread. */
static int mw_digest(const char *path, uint64_t d[SRV_DIGEST_WORDS])
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    unsigned char *buf = malloc(MW_READ_BYTES);
    int rc = buf == NULL ? -1 : 0;
    for (int i = 0; i < 4; i++) d[i] = MW_P1 * (uint64_t)(i + 1);
    uint64_t total = 0;
    size_t lane = 0;
    while (rc == 0) {
        size_t have = 0; /* fill the buffer whole, so that rounds never straddle reads */
        while (have < MW_READ_BYTES) {
            ssize_t n = read(fd, buf + have, MW_READ_BYTES - have);
            if (n < 0) {
                rc = -1;
                break;
            }
            if (n == 0) break;
            have += (size_t)n;
        }
        if (rc != 0 || have == 0) break;
        total += have;
        size_t i = 0;
        for (; i + 8 <= have; i += 8) {
            uint64_t w = 0;
            for (int b = 7; b >= 0; b--) w = (w << 8) | buf[i + (size_t)b];
            d[lane] = mw_round(d[lane], w);
            lane = (lane + 1) & 3;
        }
        for (; i < have; i++) { /* the tail (only at the end of the file) */
            d[lane] = mw_round(d[lane], 0x100u | buf[i]);
            lane = (lane + 1) & 3;
        }
        if (have < MW_READ_BYTES) break;
    }
    d[4] = total;
    free(buf);
    close(fd);
    return rc;
}

static void mw_job_run(uv_work_t *w)
{
    mw_job *j = w->data;
    srv_file_id_get(j->path, &j->before);
    j->ok = j->before.exists && mw_digest(j->path, j->digest) == 0;
    srv_file_id_get(j->path, &j->after);
}

/* Whether now is the loaded file's inode (its bytes changed under the mapping). */
static int same_inode(const srv_watch *w, const srv_file_id *now)
{
    return now->exists && now->dev == w->id.dev && now->ino == w->id.ino;
}

/* The file changed: one line, the drain, and the cut when it changed in place. */
static void model_changed(srv *s, const srv_watch *w, int in_place, const char *what)
{
    if (s->api->draining) return; /* said once */
    uv_timer_stop(&s->daemon->model_timer);
    const srv_daemon *d = s->daemon;
    const char *name = w != NULL && d->nwatch > 1 ? ckpt_name(s, &s->api->ckpt[w - d->watch]) : "";
    log_line("error",
             "the model file %s%s%s%s changed under the running server: %s; draining, then "
             "exiting with status %d so that it restarts on the new file (replace the file with "
             "a rename: docs/operations.md)",
             w != NULL ? w->path : "(a mapped one)", name[0] ? " (" : "", name, name[0] ? ")" : "",
             what, SRV_EXIT_MODEL_CHANGED);
    srv_drain_begin(s, SRV_EXIT_MODEL_CHANGED, "the model file changed");
    if (in_place) srv_drain_cut(s, "the model file changed in place");
}

static int mw_job_start(srv *s, srv_watch *w, int at_load, const srv_file_id *expect);

/* The digests of the files as loaded, one after the other from watch[i]:
 * they share libuv's work threads with the steps, so that several large
 * checkpoints never hold them all at once (a step waits for at most one). */
static void load_digests_from(srv *s, size_t i)
{
    for (; i < s->daemon->nwatch; i++) {
        srv_watch *w = &s->daemon->watch[i];
        if (mw_job_start(s, w, 1, &w->id) == 0) return;
        log_line("warn", "cannot take the digest of %s: any change to it restarts the server",
                 w->path);
    }
}

static void mw_job_done(uv_work_t *work, int status)
{
    mw_job *j = work->data;
    srv *s = j->s;
    srv_watch *w = j->w;
    w->job = NULL;
    int settled = status == 0 && j->ok && srv_file_id_same(&j->before, &j->after);
    if (s->closed || s->api->draining) {
        free(j);
        return;
    }
    if (j->at_load) {
        /* The bytes as loaded only if the file is still the one loaded;
         * otherwise the digest stays unknown and the next tick calls any
         * difference a change. */
        if (settled && srv_file_id_same(&j->before, &w->id)) {
            memcpy(w->digest, j->digest, sizeof w->digest);
            w->digest_ok = 1;
        }
        free(j);
        load_digests_from(s, (size_t)(w - s->daemon->watch) + 1);
        return;
    }
    if (!settled || !srv_file_id_same(&j->before, &j->expect)) {
        free(j); /* still being written: the next tick looks again */
        return;
    }
    if (memcmp(j->digest, w->digest, sizeof w->digest) == 0) {
        log_line("info",
                 "the model file %s was %s with the same bytes; still serving it (no restart)",
                 w->path,
                 j->after.ino != w->id.ino || j->after.dev != w->id.dev ? "replaced"
                                                                        : "touched or rewritten");
        w->id = j->after;
        free(j);
        return;
    }
    srv_file_id now = j->after;
    free(j);
    char what[160];
    if (now.dev != w->id.dev || now.ino != w->id.ino)
        snprintf(what, sizeof what, "another file with other bytes was put in its place");
    else
        snprintf(what, sizeof what, "its bytes were rewritten in place");
    model_changed(s, w, same_inode(w, &now), what);
}

/* Starts a digest of w's file (one at a time a file); 0, or -1 when it
 * cannot. */
static int mw_job_start(srv *s, srv_watch *w, int at_load, const srv_file_id *expect)
{
    if (w->job != NULL) return 0;
    mw_job *j = calloc(1, sizeof *j);
    if (j == NULL) return -1;
    j->s = s;
    j->w = w;
    j->at_load = at_load;
    j->expect = *expect;
    j->work.data = j;
    memcpy(j->path, w->path, sizeof j->path);
    if (uv_queue_work(s->loop, &j->work, mw_job_run, mw_job_done) != 0) {
        free(j);
        return -1;
    }
    w->job = j;
    return 0;
}

/* One file's look: nothing, a digest started, or a change. */
static void look(srv *s, srv_watch *w)
{
    srv_file_id now;
    srv_file_id_get(w->path, &now);
    if (srv_file_id_same(&now, &w->id)) return;
    if (w->job != NULL) return; /* a digest runs: its answer first */
    /* Only the same bytes are no change: a file of another size, or gone,
     * or one whose bytes at load are unknown, is a change at once. */
    if (now.exists && now.size == w->id.size && w->digest_ok && mw_job_start(s, w, 0, &now) == 0)
        return;
    char what[128];
    describe_change(&w->id, &now, what, sizeof what);
    model_changed(s, w, same_inode(w, &now), what);
}

static void on_model_timer(uv_timer_t *t)
{
    srv *s = t->data;
    for (size_t i = 0; i < s->daemon->nwatch && !s->api->draining; i++)
        look(s, &s->daemon->watch[i]);
}

/* The line the SIGBUS handler writes, made before it can be needed; the
 * page size; and the loop's wake-up once it runs (NULL before). */
static char sigbus_line[CFG_STR_MAX + 512];
static size_t sigbus_len;
static size_t sigbus_page;
static uv_async_t *volatile sigbus_wake;

static void on_sigbus(int signum, siginfo_t *si, void *uctx)
{
    (void)signum;
    (void)uctx;
    uv_async_t *wake = sigbus_wake;
    /* BUS_ADRERR: a page of a file mapping past the file's end. Once the
     * loop's end closed the wake-up (lifecycle.c), no step runs any more. */
    if (wake != NULL && !uv_is_closing((uv_handle_t *)wake) && si->si_code == BUS_ADRERR
        && sigbus_page > 0) {
        uintptr_t page = (uintptr_t)si->si_addr & ~(uintptr_t)(sigbus_page - 1);
        /* The system call itself, not a sanitizer's interceptor of mmap. */
        long p = syscall(SYS_mmap, page, sigbus_page, PROT_READ,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (p != -1) {
            uv_async_send(wake);
            return; /* the read is tried again, on the zeros */
        }
    }
    ssize_t w = write(STDERR_FILENO, sigbus_line, sigbus_len);
    (void)w;
    _exit(SRV_EXIT_MODEL_CHANGED);
}

/* The loop's side of a SIGBUS: the file shrank under the mapping. */
static void on_sigbus_wake(uv_async_t *h)
{
    srv *s = h->data;
    if (s->closed) return;
    /* The file whose identity changed (a truncation changes its size);
     * where none has yet, the first's when it is the only one. */
    srv_daemon *d = s->daemon;
    const srv_watch *w = d->nwatch == 1 ? &d->watch[0] : NULL;
    for (size_t i = 0; i < d->nwatch; i++) {
        srv_file_id now;
        srv_file_id_get(d->watch[i].path, &now);
        if (!srv_file_id_same(&now, &d->watch[i].id)) {
            w = &d->watch[i];
            break;
        }
    }
    model_changed(s, w, 1,
                  "a read of its mapping past the file's new end failed (SIGBUS): it was "
                  "truncated or is being rewritten in place");
}

void srv_model_watch_init(srv *s)
{
    srv_daemon *d = s->daemon;
    d->nwatch = 0;
    for (size_t i = 0; i <= s->cfg.n_more_models && i < SRV_MAX_CKPT; i++) {
        srv_watch *w = &d->watch[d->nwatch++];
        memset(w, 0, sizeof *w);
        snprintf(w->path, sizeof w->path, "%s/model.safetensors",
                 i == 0 ? s->cfg.model_dir : s->cfg.more_models[i - 1].dir);
        srv_file_id_get(w->path, &w->id);
    }
    int n = snprintf(sigbus_line, sizeof sigbus_line,
                     "%sgpt2d serve: SIGBUS reading the mapped model file %s%s: it was truncated "
                     "or overwritten while served (replace it with a rename); exiting with "
                     "status %d\n",
                     srv_sd_journal() ? "<2>" : "", d->watch[0].path,
                     d->nwatch > 1 ? " or another checkpoint's" : "", SRV_EXIT_MODEL_CHANGED);
    sigbus_len = n < 0 ? 0 : (size_t)n < sizeof sigbus_line ? (size_t)n : sizeof sigbus_line - 1;
    long page = sysconf(_SC_PAGESIZE);
    sigbus_page = page > 0 ? (size_t)page : 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

void srv_model_watch_start(srv *s)
{
    uv_timer_init(s->loop, &s->daemon->model_timer);
    s->daemon->model_timer.data = s;
    uv_timer_start(&s->daemon->model_timer, on_model_timer, 1000, 1000);
    uv_async_init(s->loop, &s->daemon->sigbus_wake, on_sigbus_wake);
    s->daemon->sigbus_wake.data = s;
    sigbus_wake = &s->daemon->sigbus_wake;
    load_digests_from(s, 0);
}
