/*
 * server/http/loop.c: libmicrohttpd in libuv. It runs in external-event
 * mode: a uv_poll on its epoll descriptor and a uv_timer for its timeouts
 * (daemon.c starts them); each run re-arms the timer.
 *
 * libmicrohttpd asks for a timeout of 0 while it believes a connection has
 * work it can do now. A timer re-armed with 0 from its own callback runs
 * again in the same pass of libuv's timers (the loop's clock does not move
 * inside it), so a connection that keeps that belief spins there and
 * starves the rest of the loop: the poll, the other timers (the sweep that
 * would close it), the engine's step completions. libmicrohttpd 0.9.75
 * does this for a TLS handshake whose ClientHello stops half-way (GnuTLS
 * reads the socket itself, so libmicrohttpd never sees it run dry). A
 * second 0 in one pass of the loop becomes 1 ms: the loop turns, and the
 * sweep closes the stalled connection at its deadline.
 */
#include "http/http.h"

#include <string.h>

static void on_timer(uv_timer_t *t)
{
    loop_mhd_run(t->data);
}

void loop_on_poll(uv_poll_t *p, int status, int events)
{
    (void)status;
    (void)events;
    loop_mhd_run(p->data);
}

void loop_mhd_run(srv *s)
{
    if (s->mhd == NULL || s->closed) return;
    MHD_run(s->mhd);
    MHD_UNSIGNED_LONG_LONG ms;
    /* 0 means a connection can go on at once (a long answer's next piece,
     * a handshake's next record). libuv before 1.45 reruns a 0 ms timer
     * that its callback re-arms in the same pass over the timers, without
     * looking at any other descriptor: a fast reader's 5 MB answer was
     * written in one go (every stream beside it stalled), and half a TLS
     * handshake spun the loop. So one zero a pass, then 1 ms: small answers
     * still finish in one pass, and the loop serves the others between
     * pieces. */
    if (MHD_get_timeout(s->mhd, &ms) != MHD_YES) ms = 1000;
    if (ms > 1000) ms = 1000;
    if (ms == 0) {
        uint64_t now = uv_now(s->loop);
        if (s->mhd_zero_armed && s->mhd_zero_at == now) ms = 1; /* once a pass */
        s->mhd_zero_armed = 1;
        s->mhd_zero_at = now;
    }
    uv_timer_start(&s->timer, on_timer, ms, 0);
}
