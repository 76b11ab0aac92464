/*
 * server/conn.c: the connections themselves, under every request. Each
 * accepted connection gets a record (libmicrohttpd's connection notifier)
 * that says when it last became ready for a request head and which request,
 * if any, is in progress on it. From that record:
 *
 *   - deadlines, checked every CONN_SWEEP_MS: a new connection must send a
 *     complete request head within request_header_timeout, even a byte at a
 *     time (libmicrohttpd's own timeout restarts with every byte, so a
 *     byte-a-second client would hold a slot for ever); a body must not stall
 *     for longer than body_timeout; a keep-alive connection between requests
 *     is closed connection_timeout after its last answer, bytes or not;
 *   - max_connections: libmicrohttpd is allowed SRV_CONN_HEADROOM more,
 *     and when a connection over max_connections arrives the oldest one
 *     without a request in progress (idle keep-alive, or a head still
 *     coming) is closed so that the new client is served; with none idle
 *     the new one gets a 503.
 *
 * A connection is closed by shutting its socket down; libmicrohttpd sees
 * the end on its next read and closes it (on_completed runs for a request in
 * progress, which ends ABORTED). Before a request's answer has started, the
 * socket carries nothing of ours, so a 408 or 503 JSON can be written on it
 * first, whole, without libmicrohttpd's help.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

srv_conn *conn_of(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci != NULL ? ci->socket_context : NULL;
}

conn_deadline conn_deadline_of(const cfg_config *cfg, const srv_conn *c)
{
    conn_deadline d = {CONN_WAIT_NONE, 0.0};
    if (c->closing) return d;
    if (c->req == NULL) {
        if (c->served == 0) {
            d.kind = CONN_WAIT_HEAD;
            d.at = c->t_ready + cfg->request_header_timeout_s;
        } else {
            d.kind = CONN_WAIT_IDLE;
            d.at = c->t_ready + cfg->connection_timeout_s;
        }
    } else if (c->req->state == HTTP_REQ_HEAD || c->req->state == HTTP_REQ_BODY) {
        d.kind = CONN_WAIT_BODY;
        d.at = c->req->t_progress + cfg->body_timeout_s;
    }
    return d;
}

srv_conn *conn_pick_idle(srv_conn *head, const srv_conn *except)
{
    srv_conn *best = NULL;
    for (srv_conn *c = head; c != NULL; c = c->next)
        if (c != except && !c->closing && c->req == NULL
            && (best == NULL || c->t_ready < best->t_ready))
            best = c;
    return best;
}

/* Writes a whole JSON error response on c's socket (best effort: a socket
 * whose buffer is full gets nothing), before the close. */
static void write_error(srv_conn *c, int status, const char *reason, const char *code,
                        const char *msg)
{
    oai_error e;
    oai_error_set(&e, status, status == 503 ? "server_error" : "invalid_request_error", code, NULL,
                  "%s", msg);
    char *js = oai_error_json(&e);
    if (js == NULL) return;
    char buf[1024];
    int n = snprintf(buf, sizeof buf,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nCache-Control: "
                     "no-store\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
                     status, reason, strlen(js), js);
    free(js);
    if (n > 0 && (size_t)n < sizeof buf) {
        ssize_t w = send(c->fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w; /* a client that cannot take it is closed all the same */
    }
}

void conn_close(srv_conn *c)
{
    if (c->closing) return;
    c->closing = 1;
    c->s->nconns_closing++;
    shutdown(c->fd, SHUT_RDWR);
}

void conn_on_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                    enum MHD_ConnectionNotificationCode toe)
{
    srv *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        srv_conn *c = *socket_context;
        if (c == NULL) return;
        if (c->req != NULL) c->req->sc = NULL;
        if (c->prev)
            c->prev->next = c->next;
        else
            s->conns = c->next;
        if (c->next) c->next->prev = c->prev;
        if (c->closing) s->nconns_closing--;
        s->nconns--;
        free(c);
        *socket_context = NULL;
        return;
    }
    const union MHD_ConnectionInfo *fi =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    srv_conn *c = calloc(1, sizeof *c);
    if (c == NULL || fi == NULL) {
        free(c); /* untracked: libmicrohttpd's own timeout still applies */
        *socket_context = NULL;
        return;
    }
    c->s = s;
    c->conn = mc;
    c->fd = fi->connect_fd;
    c->t_ready = log_now();
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    *socket_context = c;
    if (s->nconns - s->nconns_closing <= s->cfg.max_connections) return;
    /* One over max_connections: make room, idle connections first. */
    srv_conn *idle = conn_pick_idle(s->conns, c);
    if (idle != NULL) {
        log_line("debug", "max_connections (%zu) reached: closing the oldest idle connection",
                 s->cfg.max_connections);
        conn_close(idle);
        return;
    }
    log_line("warn", "max_connections (%zu) reached and none is idle: refusing a connection",
             s->cfg.max_connections);
    write_error(c, 503, "Service Unavailable", "too_many_connections",
                "The server has max_connections connections open, all busy; retry later");
    conn_close(c);
}

void conn_on_sweep(uv_timer_t *t)
{
    srv *s = t->data;
    double now = log_now();
    int closed = 0;
    for (srv_conn *c = s->conns; c != NULL; c = c->next) {
        conn_deadline d = conn_deadline_of(&s->cfg, c);
        if (d.kind == CONN_WAIT_NONE || now < d.at) continue;
        if (d.kind == CONN_WAIT_HEAD) {
            log_line("debug",
                     "closing a connection: no complete request head in %g s "
                     "(request_header_timeout)",
                     s->cfg.request_header_timeout_s);
            write_error(c, 408, "Request Timeout", "request_timeout",
                        "The request head did not arrive within request_header_timeout");
        } else if (d.kind == CONN_WAIT_BODY) {
            log_line("info", "closing a connection: its body stalled for %g s (body_timeout)",
                     s->cfg.body_timeout_s);
            write_error(c, 408, "Request Timeout", "request_timeout",
                        "The request body stalled for longer than body_timeout");
        }
        conn_close(c);
        closed = 1;
    }
    if (closed) loop_mhd_run(s);
}
