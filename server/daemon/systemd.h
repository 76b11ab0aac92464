/*
 * server/daemon/systemd.h: what gpt2d needs of systemd, through libsystemd: the
 * service manager's notifications (READY, STATUS, WATCHDOG, STOPPING), a
 * listening socket inherited by socket activation, and whether stderr is
 * the journal (then log lines carry syslog priority prefixes).
 *
 * Every function is a no-op when gpt2d does not run under systemd, so the
 * daemon behaves the same from a shell. Prefix: srv_sd_. Thread: the loop
 * thread (srv_sd_init first, from main).
 */
#ifndef GPT2D_SERVER_SYSTEMD_H
#define GPT2D_SERVER_SYSTEMD_H

#include <stddef.h>
#include <stdint.h>

/* Reads the environment once: NOTIFY_SOCKET, WATCHDOG_USEC, JOURNAL_STREAM. */
void srv_sd_init(void);

/* Whether stderr is connected to the journal (JOURNAL_STREAM names its
 * device and inode): log lines then start with "<N>", the syslog priority,
 * and carry no timestamp of their own. */
int srv_sd_journal(void);

/* Sends one notification ("READY=1", "STATUS=...", ...) when NOTIFY_SOCKET
 * is set; printf-style. */
void srv_sd_notify(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* The watchdog interval systemd asked for (WatchdogSec=), in microseconds;
 * 0 when there is none. */
uint64_t srv_sd_watchdog_usec(void);

/* A listening TCP socket passed by socket activation (LISTEN_FDS), made
 * non-blocking: its descriptor; -1 when none was passed; -2 with a message
 * in err when the passed descriptors are not one listening stream socket. */
int srv_sd_listen_fd(char *err, size_t errlen);

#endif
