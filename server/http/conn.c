/*
 * server/http/conn.c: the connections themselves, under every request. Each
 * accepted connection gets a record (libmicrohttpd's connection notifier)
 * that says when it last became ready for a request head and which request,
 * if any, is in progress on it. From that record:
 *
 *   - deadlines, checked every CONN_SWEEP_MS: a new connection must send a
 *     complete request head within request_header_timeout, even a byte at a
 *     time (libmicrohttpd's own timeout restarts with every byte, so a
 *     byte-a-second client would hold a slot for ever); a body must not stall
 *     for longer than body_timeout, nor come slower on average than
 *     body_min_rate once body_timeout has passed (a byte every few seconds
 *     never stalls); a keep-alive connection between requests
 *     is closed connection_timeout after its last answer while no byte of a
 *     next head has come, and once one has, that head must be complete
 *     within request_header_timeout of it, as on a new connection;
 *   - max_connections: libmicrohttpd is allowed SRV_CONN_HEADROOM more,
 *     and when a connection over max_connections arrives the oldest one
 *     without a request in progress (idle keep-alive, or a head still
 *     coming) is closed so that the new client is served; with none idle
 *     the new one gets a 503.
 *
 * libmicrohttpd reads a head's bytes without telling us until the head is
 * complete, so the first byte of a keep-alive connection's next head is
 * seen in the kernel's TCP_INFO (the time since the last byte arrived),
 * once per sweep: the deadline then starts from the sweep before it (a
 * client that spaces its bytes by less than the kernel's clock tick right
 * after an answer is seen at its next byte). A socket that is not TCP has
 * no such record; its keep-alive heads are bounded by connection_timeout
 * and libmicrohttpd's own idle timeout.
 *
 * A connection is closed by shutting its socket down; libmicrohttpd sees
 * the end on its next read and closes it (on_completed runs for a request in
 * progress, which ends ABORTED). Before a request's answer has started, the
 * socket carries nothing of ours, so a 408 or 503 JSON can be written on it
 * first, whole, without libmicrohttpd's help. Over HTTPS the socket carries
 * GnuTLS's records, which only libmicrohttpd writes: those refusals close
 * the connection without an answer (their log line and metric stay).
 *
 * A connection answered before its request's body was read (a refusal at
 * accept or from the head, a 413 in the middle of a chunked body) lingers,
 * as nginx's lingering close: closing a socket with unread bytes sends the
 * client a reset, which can come before it has read the answer (a client
 * still writing its body gets EPIPE or ECONNRESET instead of the status).
 * So the sending side is shut after the answer, what the client still
 * sends is read and dropped (by libmicrohttpd while it holds the
 * connection, then by a conn_drain on a duplicate of its descriptor once
 * it has closed it), and the socket is closed when the client closes it,
 * refusal_linger after the answer, or past refusal_linger_bytes.
 */
#include "http/error_json.h"
#include "http/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* TCP_INFO's last_data_recv counts kernel clock ticks (1-10 ms) in
 * milliseconds: two readings of the same last byte differ by up to a
 * tick. */
#define CONN_RECV_SLACK_S 0.02

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
        } else if (c->t_head > 0) {
            d.kind = CONN_WAIT_HEAD;
            d.at = c->t_head + cfg->request_header_timeout_s;
        } else {
            d.kind = CONN_WAIT_IDLE;
            d.at = c->t_ready + cfg->connection_timeout_s;
        }
    } else if (c->req->state == HTTP_REQ_HEAD || c->req->state == HTTP_REQ_BODY) {
        d.kind = CONN_WAIT_BODY;
        d.at = c->req->t_progress + cfg->body_timeout_s;
        if (cfg->body_min_rate > 0) {
            /* A byte every few seconds never stalls for body_timeout. */
            double by_rate = c->req->t_start + cfg->body_timeout_s
                             + (double)c->req->body_len / (double)cfg->body_min_rate;
            if (by_rate < d.at) {
                d.kind = CONN_WAIT_RATE;
                d.at = by_rate;
            }
        }
    }
    return d;
}

int conn_note_recv(srv_conn *c, double at, double since)
{
    if (c->req != NULL || c->served == 0 || c->t_head > 0 || c->closing) return 0;
    if (at < 0 || c->t_recv < 0 || at <= c->t_recv + CONN_RECV_SLACK_S) return 0;
    /* The byte came after the previous check, unless the slack hid it then. */
    double first = at < since ? at : since;
    c->t_head = first > c->t_ready ? first : c->t_ready;
    return 1;
}

/* When the last byte arrived on TCP socket fd, in log_now() seconds; -1
 * when the kernel does not say (not TCP). */
static double last_recv_at(int fd, double now)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0
        || len < offsetof(struct tcp_info, tcpi_last_data_recv) + sizeof ti.tcpi_last_data_recv)
        return -1.0;
    return now - (double)ti.tcpi_last_data_recv / 1e3;
}

void conn_request_done(srv_conn *c)
{
    c->req = NULL;
    c->t_ready = log_now();
    c->t_recv = last_recv_at(c->fd, c->t_ready);
    c->t_head = 0;
    c->served++;
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
 * whose buffer is full gets nothing), before the close. It carries an
 * X-Request-Id: the request's when one is in progress (whose access line,
 * written when libmicrohttpd ends it, then gives this status), else a new
 * one, with an access line of its own unless quiet (a per-address
 * refusal, logged per address by conn_note_refused instead). retry_after: a
 * Retry-After value, or NULL. */
static void write_error(srv_conn *c, int status, const char *reason, const char *code,
                        const char *msg, const char *retry_after, int quiet)
{
    srv *s = c->s;
    char id[sizeof((srv_req *)0)->req_id];
    if (c->req != NULL) {
        snprintf(id, sizeof id, "%s", c->req->req_id);
        c->req->conn_status = (unsigned)status;
    } else {
        http_request_id_new(s, id, sizeof id);
        double since = c->t_head > 0 ? c->t_head : c->t_ready;
        if (!quiet) log_access_conn(id, (unsigned)status, log_now() - since);
        met_count_request(&s->met, "-", (unsigned)status, 0);
    }
    const char *type = status == 503   ? "server_error"
                       : status == 429 ? "rate_limit_exceeded"
                                       : "invalid_request_error";
    char text[512]; /* api/oai.h's oai_error.message: the same cut */
    snprintf(text, sizeof text, "%s", msg);
    http_error_sanitize(text);
    char *js = http_error_json(type, code, "", text);
    if (js == NULL) return;
    if (s->tls != NULL) { /* plaintext bytes would break the TLS stream */
        free(js);
        return;
    }
    char ra[48] = "";
    if (retry_after != NULL) snprintf(ra, sizeof ra, "Retry-After: %s\r\n", retry_after);
    char buf[2048];
    int n = snprintf(buf, sizeof buf,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nCache-Control: "
                     "no-store\r\nConnection: close\r\n%sX-Request-Id: %s\r\nContent-Length: "
                     "%zu\r\n\r\n%s",
                     status, reason, ra, id, strlen(js), js);
    free(js);
    if (n > 0 && (size_t)n < sizeof buf) {
        ssize_t w = send(c->fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w; /* a client that cannot take it is closed all the same */
    }
}

/* After an answer written on c's socket: its sending side shut, then a
 * linger (t_linger, refusal_linger) in which libmicrohttpd reads and drops
 * what the client sent, and a conn_drain once it has closed the
 * connection, so that the client reads the answer rather than a reset. A
 * lingering connection holds one of libmicrohttpd's slots past
 * max_connections (SRV_CONN_HEADROOM): with half of them lingering, c is
 * closed at once instead, so that a flood of refusals cannot stop the
 * server from accepting anyone. */
static void conn_linger(srv_conn *c)
{
    srv *s = c->s;
    if (s->nconns_closing >= SRV_CONN_HEADROOM / 2 || s->cfg.refusal_linger_s <= 0) {
        conn_close(c);
        return;
    }
    c->closing = 1;
    s->nconns_closing++;
    c->t_linger = log_now();
    shutdown(c->fd, SHUT_WR);
}

/* The linger of c is over (its time, or its bytes): both sides shut, so
 * libmicrohttpd closes it and no drain follows. */
static void linger_end(srv_conn *c)
{
    c->t_linger = 0;
    shutdown(c->fd, SHUT_RDWR);
}

void conn_refuse(srv_conn *c, int status, const char *reason, const char *msg)
{
    if (c->closing) return;
    write_error(c, status, reason, NULL, msg, NULL, 0);
    conn_linger(c);
}

void conn_refuse_linger(srv_conn *c, int status, const char *reason, const char *msg)
{
    if (c->closing) return;
    write_error(c, status, reason, NULL, msg, NULL, 0);
    conn_linger(c);
}

void conn_answered_early(srv_conn *c)
{
    if (c->closing || c->s->cfg.refusal_linger_s <= 0) return;
    c->t_linger = log_now();
}

void conn_note_dropped(srv_conn *c, size_t total)
{
    if (c->t_linger > 0 && total > c->s->cfg.refusal_linger_bytes) linger_end(c);
}

/* ---- The lingering read after libmicrohttpd's close --------------------- */

/* Reads and drops what d's socket holds now: 1 when the drain is over (the
 * client closed, an error, or its bytes spent), 0 when it waits for more. */
static int drain_read(conn_drain *d)
{
    char buf[16384];
    for (;;) {
        ssize_t n = recv(d->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) {
            d->got += (size_t)n;
            if ((size_t)n >= d->left) {
                d->left = 0;
                return 1;
            }
            d->left -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : 1;
    }
}

static void drain_closed(uv_handle_t *h)
{
    conn_drain *d = h->data;
    close(d->fd); /* the socket's last descriptor: the connection ends here */
    free(d);
}

static void drain_log(const conn_drain *d, const char *why)
{
    log_line("debug", "lingering read ended (%s): %zu bytes dropped in %.2f s", why, d->got,
             log_now() - d->start);
}

static void drain_end(conn_drain *d, const char *why)
{
    srv *s = d->s;
    if (d->prev)
        d->prev->next = d->next;
    else
        s->drains = d->next;
    if (d->next) d->next->prev = d->prev;
    s->ndrains--;
    drain_log(d, why);
    uv_poll_stop(&d->poll);
    uv_close((uv_handle_t *)&d->poll, drain_closed);
}

static void on_drain(uv_poll_t *p, int status, int events)
{
    (void)events;
    conn_drain *d = p->data;
    if (status < 0 || drain_read(d)) drain_end(d, d->left == 0 ? "bytes" : "closed");
}

/* libmicrohttpd is about to close c, which lingers (t_linger): its socket
 * is kept (a duplicate descriptor; libmicrohttpd takes its own out of its
 * epoll set before closing it) and read until the client closes, for
 * what is left of refusal_linger, and refusal_linger_bytes at most. None
 * past CONN_DRAIN_MAX or once the loop is closing: closed at once. */
static void drain_start(srv *s, const srv_conn *c)
{
    double now = log_now(), until = c->t_linger + s->cfg.refusal_linger_s;
    if (s->closed || s->ndrains >= CONN_DRAIN_MAX || now >= until
        || s->cfg.refusal_linger_bytes == 0)
        return;
    conn_drain *d = calloc(1, sizeof *d);
    if (d == NULL) return;
    d->s = s;
    d->start = now;
    d->until = until;
    d->left = s->cfg.refusal_linger_bytes;
    d->fd = fcntl(c->fd, F_DUPFD_CLOEXEC, 3);
    int over = d->fd < 0 || drain_read(d);
    if (over || uv_poll_init_socket(s->loop, &d->poll, d->fd) != 0) {
        if (over && d->fd >= 0) drain_log(d, d->left == 0 ? "bytes" : "closed");
        if (d->fd >= 0) close(d->fd);
        free(d);
        return;
    }
    d->poll.data = d;
    if (uv_poll_start(&d->poll, UV_READABLE | UV_DISCONNECT, on_drain) != 0) {
        uv_close((uv_handle_t *)&d->poll, drain_closed);
        return;
    }
    d->next = s->drains;
    if (s->drains) s->drains->prev = d;
    s->drains = d;
    s->ndrains++;
}

void conn_drains_close(srv *s)
{
    while (s->drains != NULL) drain_end(s->drains, "shutdown");
}

void conn_close_unanswered(srv *s)
{
    for (srv_conn *c = s->conns; c != NULL; c = c->next) {
        if (c->closing || c->req == NULL) continue;
        http_state st = c->req->state;
        /* A stream's head, or a whole answer, is libmicrohttpd's to send. */
        if (st == HTTP_REQ_STREAMING || st == HTTP_REQ_FINISHED || st == HTTP_REQ_ABORTED) continue;
        write_error(c, 503, "Service Unavailable", "server_shutting_down",
                    "The server is shutting down and did not answer this request in time; "
                    "retry on another replica",
                    "5", 0);
        met_count_refused(&s->met, MET_REFUSED_SHUTDOWN);
        conn_close(c);
    }
}

void conn_resume_all(srv *s)
{
    for (srv_conn *c = s->conns; c != NULL; c = c->next)
        if (c->req != NULL) http_resume(c->req);
}

void conn_close(srv_conn *c)
{
    if (c->closing) return;
    c->closing = 1;
    c->s->nconns_closing++;
    shutdown(c->fd, SHUT_RDWR);
}

void conn_addr_text(int family, const unsigned char *addr, char *buf, size_t len)
{
    if (family == 0
        || inet_ntop(family == 4 ? AF_INET : AF_INET6, addr, buf, (socklen_t)len) == NULL)
        snprintf(buf, len, "-");
}

/* An IPv4-mapped IPv6 address (::ffff:a.b.c.d) as IPv4, in place. */
static void unmap(int *family, unsigned char *addr)
{
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
    if (*family == 6 && memcmp(addr, mapped, sizeof mapped) == 0) {
        memmove(addr, addr + 12, 4);
        memset(addr + 4, 0, 12);
        *family = 4;
    }
}

int conn_addr_parse(const char *text, size_t len, int *family, unsigned char *addr)
{
    char buf[64];
    if (len == 0 || len >= sizeof buf) return 0;
    memcpy(buf, text, len);
    buf[len] = '\0';
    memset(addr, 0, 16);
    if (inet_pton(AF_INET, buf, addr) == 1) {
        *family = 4;
    } else if (inet_pton(AF_INET6, buf, addr) == 1) {
        *family = 6;
        unmap(family, addr);
    } else {
        return 0;
    }
    return 1;
}

/* The peer address sa into c (family 0 when it is not IP). */
static void conn_addr_of(const struct sockaddr *sa, srv_conn *c)
{
    if (sa->sa_family == AF_INET) {
        c->family = 4;
        memcpy(c->addr, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        c->family = 6;
        memcpy(c->addr, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
        unmap(&c->family, c->addr);
    }
}

/* The connections open from c's address (c included), those closing aside. */
static size_t conns_from(const srv *s, const srv_conn *c)
{
    size_t n = 0;
    size_t alen = c->family == 4 ? 4 : 16;
    for (const srv_conn *o = s->conns; o != NULL; o = o->next)
        if (!o->closing && o->family == c->family && memcmp(o->addr, c->addr, alen) == 0) n++;
    return n;
}

/* The line of e's refusals summed up since e->since, if any. */
static void refuse_log_write(const conn_refuse_log *e, double now)
{
    if (e->count == 0) return;
    char text[INET6_ADDRSTRLEN + 1];
    conn_addr_text(e->family, e->addr, text, sizeof text);
    log_line("warn", "refused %llu more connections from %s (%s) in the last %.0f s", e->count,
             e->family != 0 ? text : "other addresses", met_refused_name(e->why), now - e->since);
}

void conn_note_refused(srv *s, int family, const unsigned char *addr, met_refused why,
                       const char *what)
{
    met_count_refused(&s->met, why);
    size_t alen = family == 4 ? 4 : 16;
    conn_refuse_log *free_slot = NULL, *other = NULL;
    for (size_t i = 0; i < CONN_REFUSE_LOG_SLOTS; i++) {
        conn_refuse_log *e = &s->refuse_log[i];
        if (!e->used) {
            if (free_slot == NULL) free_slot = e;
            continue;
        }
        if (e->family == 0) other = e;
        if (e->why == why && e->family == family && family != 0
            && memcmp(e->addr, addr, alen) == 0) {
            e->count++;
            return;
        }
    }
    char text[INET6_ADDRSTRLEN + 1];
    conn_addr_text(family, addr, text, sizeof text);
    if (free_slot == NULL || family == 0) { /* the table is full: one line for the others */
        if (other != NULL) {
            other->count++;
            return;
        }
        if (free_slot == NULL) { /* its pending count is written, not lost */
            free_slot = &s->refuse_log[CONN_REFUSE_LOG_SLOTS - 1];
            refuse_log_write(free_slot, log_now());
        }
        family = 0;
    }
    memset(free_slot, 0, sizeof *free_slot);
    free_slot->used = 1;
    free_slot->family = family;
    if (family != 0) memcpy(free_slot->addr, addr, alen);
    free_slot->why = why;
    free_slot->since = log_now();
    log_line(
        "warn", "refused a connection from %s (%s: %s); more from it are summed up every %.0f s",
        family != 0 ? text : "other addresses", met_refused_name(why), what, CONN_REFUSE_LOG_S);
}

void conn_refuse_log_flush(srv *s, double now)
{
    for (size_t i = 0; i < CONN_REFUSE_LOG_SLOTS; i++) {
        conn_refuse_log *e = &s->refuse_log[i];
        if (!e->used || now - e->since < CONN_REFUSE_LOG_S) continue;
        if (e->count == 0) {
            e->used = 0;
            continue;
        }
        refuse_log_write(e, now);
        e->count = 0;
        e->since = now;
    }
}

/* Refuses c at accept: the answer on its socket (no request yet, so the
 * socket carries nothing of ours), then conn_linger. */
static void refuse_at_accept(srv_conn *c, int status, const char *reason, const char *code,
                             const char *msg, met_refused why, const char *what)
{
    srv *s = c->s;
    char ra[16];
    http_retry_after(s, ra, sizeof ra);
    /* A per-address refusal has no access line of its own: one address
     * can cause thousands (conn_note_refused sums them up). */
    write_error(c, status, reason, code, msg, ra, why == MET_REFUSED_PER_IP);
    conn_note_refused(s, c->family, c->addr, why, what);
    conn_linger(c);
}

void conn_on_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                    enum MHD_ConnectionNotificationCode toe)
{
    srv *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        srv_conn *c = *socket_context;
        if (c == NULL) return;
        if (c->req != NULL) c->req->conn_rec = NULL;
        if (c->t_linger > 0) drain_start(s, c);
        if (c->prev)
            c->prev->next = c->next;
        else
            s->conns = c->next;
        if (c->next) c->next->prev = c->prev;
        if (c->closing) s->nconns_closing--;
        s->nconns--;
        tls_conn_closed(s, c);
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
        /* Over HTTPS an untracked connection could hold a retired
         * certificate past its free (tls.c counts tracked ones): closed. */
        if (s->tls != NULL && fi != NULL) shutdown(fi->connect_fd, SHUT_RDWR);
        return;
    }
    c->s = s;
    c->conn = mc;
    c->fd = fi->connect_fd;
    c->t_ready = log_now();
    tls_conn_opened(s, c);
    const union MHD_ConnectionInfo *ai =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ai != NULL && ai->client_addr != NULL) conn_addr_of(ai->client_addr, c);
    c->trusted =
        c->family != 0
        && cfg_nets_contain(s->cfg.trusted_nets, s->cfg.n_trusted_nets, c->family, c->addr);
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    *socket_context = c;
    size_t limit = s->cfg.max_connections_per_ip;
    if (limit > 0 && c->family != 0 && !c->trusted && conns_from(s, c) > limit) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "More than max_connections_per_ip (%zu) connections from your address; retry "
                 "later",
                 limit);
        refuse_at_accept(c, 429, "Too Many Requests", "too_many_connections", msg,
                         MET_REFUSED_PER_IP, "more than max_connections_per_ip open");
        return;
    }
    if (s->nconns - s->nconns_closing <= s->cfg.max_connections) return;
    /* One over max_connections: make room, idle connections first. */
    srv_conn *idle = conn_pick_idle(s->conns, c);
    if (idle != NULL) {
        log_line("debug", "max_connections (%zu) reached: closing the oldest idle connection",
                 s->cfg.max_connections);
        conn_close(idle);
        return;
    }
    refuse_at_accept(c, 503, "Service Unavailable", "too_many_connections",
                     "The server has max_connections connections open, all busy; retry later",
                     MET_REFUSED_MAX_CONNECTIONS, "max_connections reached and none idle");
}

void conn_on_sweep(uv_timer_t *t)
{
    srv *s = t->data;
    double now = log_now();
    int closed = 0;
    conn_refuse_log_flush(s, now);
    for (conn_drain *d = s->drains, *next; d != NULL; d = next) {
        next = d->next;
        if (now >= d->until) drain_end(d, "time"); /* the client had its time to read */
    }
    for (srv_conn *c = s->conns; c != NULL; c = c->next) {
        if (c->closing && c->t_linger > 0 && now - c->t_linger >= s->cfg.refusal_linger_s) {
            linger_end(c); /* the client had its time to read the answer */
            closed = 1;
            continue;
        }
        if (c->req == NULL && c->served > 0 && c->t_head == 0 && !c->closing)
            conn_note_recv(c, last_recv_at(c->fd, now), s->sweep_last);
        conn_deadline d = conn_deadline_of(&s->cfg, c);
        if (d.kind == CONN_WAIT_NONE || now < d.at) continue;
        if (d.kind == CONN_WAIT_HEAD) {
            log_line("debug",
                     "closing a connection: no complete request head in %g s "
                     "(request_header_timeout)",
                     s->cfg.request_header_timeout_s);
            write_error(c, 408, "Request Timeout", "request_timeout",
                        "The request head did not arrive within request_header_timeout", NULL, 0);
        } else if (d.kind == CONN_WAIT_BODY) {
            log_line("info", "closing a connection: its body stalled for %g s (body_timeout)",
                     s->cfg.body_timeout_s);
            write_error(c, 408, "Request Timeout", "request_timeout",
                        "The request body stalled for longer than body_timeout", NULL, 0);
        } else if (d.kind == CONN_WAIT_RATE) {
            log_line("info",
                     "closing a connection: its body came slower than %zu bytes a second "
                     "(body_min_rate)",
                     s->cfg.body_min_rate);
            write_error(c, 408, "Request Timeout", "request_timeout",
                        "The request body arrived slower than body_min_rate bytes a second", NULL,
                        0);
        }
        /* An idle keep-alive connection closed after connection_timeout
         * is ordinary, not a refusal: only the 408s count. */
        if (d.kind != CONN_WAIT_IDLE) met_count_refused(&s->met, MET_REFUSED_TIMEOUT);
        conn_close(c);
        closed = 1;
    }
    s->sweep_last = now;
    if (closed) loop_mhd_run(s);
}
