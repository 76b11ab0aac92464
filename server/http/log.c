/*
 * server/http/log.c: log lines on stderr and the access log.
 *
 * One line per event: "TIMESTAMP LEVEL message", or, when stderr is the
 * journal (which stamps lines itself), "<PRIORITY>message" with the syslog
 * priority of the level (3 error, 4 warning, 6 info, 7 debug).
 *
 * Every message is escaped (log_escape) before it is written: its fields
 * carry client bytes (the URL, the method, X-Request-Id), and a newline,
 * an ESC or a forged "<3>" at a line start would forge or colour lines; a
 * U+2028 would break one for a JSON reader, and a U+202E would show its
 * fields in another order than they are.
 */
#include "http/http.h"

#include <stdarg.h>
#include <string.h>
#include <time.h>

static int log_max = 2; /* the most verbose level written: 0 error .. 3 debug */
/* stderr is the journal: the daemon says so (log_set_journal) at start-up,
 * before any thread; the log lives below the daemon and asks it nothing. */
static int log_journal;

static int level_rank(const char *level)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (strcmp(level, names[i]) == 0) return i;
    return 2;
}

void log_set_journal(int on)
{
    log_journal = on != 0;
}

void log_set_level(const char *level)
{
    log_max = level_rank(level);
}

/* Whether code point cp, valid UTF-8 as sent, is still escaped: the C1
 * controls (U+0080..U+009F: U+0085 NEL ends a line for some readers,
 * U+009B is CSI), the line and paragraph separators U+2028 and U+2029
 * (line breaks to a JSON or JavaScript reader), and the bidirectional
 * controls, which reorder the text around them on a terminal or in a log
 * viewer (CVE-2021-42574, "Trojan Source"): U+061C ALM, U+200E LRM, U+200F
 * RLM, the embeddings and overrides U+202A..U+202E and the isolates
 * U+2066..U+2069. */
static int escaped_cp(unsigned cp)
{
    return (cp >= 0x80 && cp <= 0x9F) || cp == 0x061C || cp == 0x200E || cp == 0x200F
           || (cp >= 0x2028 && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

/* The length of the valid UTF-8 sequence at p (n bytes left) that is not
 * escaped_cp, or 0. */
static size_t utf8_ok(const unsigned char *p, size_t n)
{
    size_t len;
    unsigned min;
    unsigned cp;
    if (p[0] >= 0xC2 && p[0] <= 0xDF) {
        len = 2, min = 0x80, cp = p[0] & 0x1Fu;
    } else if (p[0] >= 0xE0 && p[0] <= 0xEF) {
        len = 3, min = 0x800, cp = p[0] & 0x0Fu;
    } else if (p[0] >= 0xF0 && p[0] <= 0xF4) {
        len = 4, min = 0x10000, cp = p[0] & 0x07u;
    } else {
        return 0;
    }
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) || escaped_cp(cp)) return 0;
    return len;
}

size_t log_escape(const char *in, size_t n, char *out, size_t outlen)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)in;
    size_t o = 0;
    if (outlen == 0) return 0;
    for (size_t i = 0; i < n;) {
        size_t len = p[i] >= 0x80 ? utf8_ok(p + i, n - i) : 0;
        if (len > 0) {
            if (o + len >= outlen) break;
            memcpy(out + o, p + i, len);
            o += len;
            i += len;
        } else if (p[i] < 0x20 || p[i] >= 0x7F || p[i] == '\\') {
            if (o + 4 >= outlen) break;
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[p[i] >> 4];
            out[o++] = hex[p[i] & 15];
            i++;
        } else {
            if (o + 1 >= outlen) break;
            out[o++] = (char)p[i++];
        }
    }
    out[o] = '\0';
    return o;
}

void log_line(const char *level, const char *fmt, ...)
{
    int rank = level_rank(level);
    if (rank > log_max) return;
    char line[4096];
    int n;
    if (log_journal) {
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
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t mlen = m < 0 ? 0 : (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1;
    log_escape(msg, mlen, line + n, sizeof line - (size_t)n);
    /* One write per line, so that lines from a crash or another process
     * sharing the stream do not interleave mid-line. */
    fprintf(stderr, "%s\n", line);
}

void log_fatal(const char *msg)
{
    char esc[4096];
    log_escape(msg, strlen(msg), esc, sizeof esc);
    fprintf(stderr, "%sgpt2d serve: %s\n", log_journal ? "<3>" : "", esc);
}

void log_access(const log_access_rec *a)
{
    /* ttft_ms: to the first generated token (0: none); tokens_per_s: the
     * completion tokens over the whole request. */
    log_line("info",
             "access %s %s status=%u%s%s request_id=%s prompt_tokens=%zu "
             "completion_tokens=%zu duration_ms=%.1f ttft_ms=%.1f tokens_per_s=%.1f client=%s%s%s",
             a->method, a->url, a->status, a->id != NULL ? " id=" : "", a->id != NULL ? a->id : "",
             a->req_id, a->prompt_tokens, a->completion_tokens, a->duration_s * 1e3,
             a->ttft_s * 1e3,
             a->duration_s > 0 ? (double)a->completion_tokens / a->duration_s : 0.0,
             a->client != NULL && a->client[0] != '\0' ? a->client : "-",
             a->cut ? " cut=shutdown" : "", a->aborted ? " aborted=1" : "");
}

void log_access_conn(const char *req_id, unsigned status, double duration_s)
{
    log_line("info",
             "access - - status=%u request_id=%s prompt_tokens=0 completion_tokens=0 "
             "duration_ms=%.1f ttft_ms=0.0 tokens_per_s=0.0",
             status, req_id != NULL ? req_id : "-", duration_s * 1e3);
}

double log_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
