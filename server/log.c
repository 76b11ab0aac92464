/*
 * server/log.c: log lines on stderr and the access log.
 *
 * One line per event: "TIMESTAMP LEVEL message", or, when stderr is the
 * journal (which stamps lines itself), "<PRIORITY>message" with the syslog
 * priority of the level (3 error, 4 warning, 6 info, 7 debug).
 */
#include "internal.h"
#include "systemd.h"

#include <stdarg.h>
#include <string.h>
#include <time.h>

static int log_max = 2; /* the most verbose level written: 0 error .. 3 debug */

static int level_rank(const char *level)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (strcmp(level, names[i]) == 0) return i;
    return 2;
}

void log_set_level(const char *level)
{
    log_max = level_rank(level);
}

void log_line(const char *level, const char *fmt, ...)
{
    int rank = level_rank(level);
    if (rank > log_max) return;
    char line[4096];
    int n;
    if (srv_sd_journal()) {
        static const int prio[] = {3, 4, 6, 7};
        n = snprintf(line, sizeof line, "<%d>", prio[rank]);
    } else {
        char ts[32];
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
        n = snprintf(line, sizeof line, "%s %s ", ts, level);
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* One write per line, so that lines from a crash or another process
     * sharing the stream do not interleave mid-line. */
    fprintf(stderr, "%s\n", line);
}

void log_fatal(const char *msg)
{
    fprintf(stderr, "%sgpt2d serve: %s\n", srv_sd_journal() ? "<3>" : "", msg);
}

void log_access(const srv_req *r, unsigned status, int aborted)
{
    log_line("info",
             "access %s %s status=%u id=%s prompt_tokens=%zu completion_tokens=%zu "
             "duration_ms=%.1f%s%s",
             r->method, r->url, status, r->id, http_req_prompt_tokens(r),
             http_req_completion_tokens(r), (log_now() - r->t_start) * 1e3,
             r->cut ? " cut=shutdown" : "", aborted ? " aborted=1" : "");
}

double log_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
