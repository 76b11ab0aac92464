/*
 * server/daemon/systemd.c: see systemd.h.
 */
#include "daemon/systemd.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>

static int journal;
static uint64_t watchdog_usec;

void srv_sd_init(void)
{
    /* JOURNAL_STREAM is "DEVICE:INODE" of the stream systemd connected;
     * stderr may have been redirected since, so compare. */
    const char *js = getenv("JOURNAL_STREAM");
    struct stat st;
    unsigned long long dev, ino;
    journal = js != NULL && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(2, &st) == 0
              && (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
    /* sd_watchdog_enabled checks WATCHDOG_PID against our pid, so that a
     * child that inherited the variables does not ping for its parent. */
    uint64_t usec = 0;
    watchdog_usec = sd_watchdog_enabled(0, &usec) > 0 ? usec : 0;
}

int srv_sd_journal(void)
{
    return journal;
}

void srv_sd_notify(const char *fmt, ...)
{
    if (getenv("NOTIFY_SOCKET") == NULL) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    (void)sd_notify(0, msg); /* best effort: a lost STATUS line is harmless */
}

uint64_t srv_sd_watchdog_usec(void)
{
    return watchdog_usec;
}

int srv_sd_listen_fd(char *err, size_t errlen)
{
    int n = sd_listen_fds(1); /* 1: unset LISTEN_* so children do not inherit them */
    if (n == 0) return -1;
    if (n < 0) {
        snprintf(err, errlen, "socket activation: %s", "LISTEN_FDS is malformed");
        return -2;
    }
    if (n != 1) {
        snprintf(err, errlen, "socket activation passed %d sockets; gpt2d listens on exactly one",
                 n);
        return -2;
    }
    int fd = SD_LISTEN_FDS_START;
    if (sd_is_socket(fd, AF_UNSPEC, SOCK_STREAM, 1) <= 0) {
        snprintf(err, errlen, "socket activation: descriptor %d is not a listening stream socket",
                 fd);
        return -2;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        snprintf(err, errlen, "socket activation: cannot make descriptor %d non-blocking", fd);
        return -2;
    }
    return fd;
}
