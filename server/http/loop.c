/*
 * server/http/loop.c: libmicrohttpd in libuv. It runs in external-event
 * mode: a uv_poll on its epoll descriptor and a uv_timer for its timeouts
 * (daemon.c starts them); each run re-arms the timer.
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
    if (MHD_get_timeout(s->mhd, &ms) == MHD_YES)
        uv_timer_start(&s->timer, on_timer, ms > 1000 ? 1000 : ms, 0);
    else
        uv_timer_start(&s->timer, on_timer, 1000, 0);
}
