/*
 * server/http/req.c: the request record under every layer: its state
 * machine, suspend and resume of its connection, its ids, and its one
 * lifetime rule.
 *
 *   HEAD -> BODY -> FINISHED                         (a whole answer)
 *               \-> TOKENIZING -> ...                (a large body)
 *               \-> QUEUED -> RUNNING -> FINISHED    (a completion)
 *               \-> STREAMING -> FINISHED            (a stream)
 *   any but ABORTED -> ABORTED                       (the connection ended early)
 *
 * Lifetime: each user of a request holds a reference: the connection
 * (on_head to on_completed), the tokenizer job while a tokenizer thread has
 * it, and each engine sequence from its submission to its DONE event. The
 * last http_req_release frees it, here and nowhere else; what a route
 * attached (its jobs) is freed by the hook it registered.
 */
#include "http/http.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <string.h>
#include <time.h>

#define B(s) (1u << (s))

/* The states each state may move to. */
static const unsigned legal_next[HTTP_REQ_NSTATES] = {
    [HTTP_REQ_HEAD] = B(HTTP_REQ_BODY) | B(HTTP_REQ_FINISHED) | B(HTTP_REQ_ABORTED),
    [HTTP_REQ_BODY] = B(HTTP_REQ_TOKENIZING) | B(HTTP_REQ_QUEUED) | B(HTTP_REQ_STREAMING)
                      | B(HTTP_REQ_FINISHED) | B(HTTP_REQ_ABORTED),
    [HTTP_REQ_TOKENIZING] =
        B(HTTP_REQ_QUEUED) | B(HTTP_REQ_STREAMING) | B(HTTP_REQ_FINISHED) | B(HTTP_REQ_ABORTED),
    [HTTP_REQ_QUEUED] = B(HTTP_REQ_RUNNING) | B(HTTP_REQ_FINISHED) | B(HTTP_REQ_ABORTED),
    [HTTP_REQ_RUNNING] = B(HTTP_REQ_FINISHED) | B(HTTP_REQ_ABORTED),
    [HTTP_REQ_STREAMING] = B(HTTP_REQ_FINISHED) | B(HTTP_REQ_ABORTED),
    /* the client left while the answer was being sent */
    [HTTP_REQ_FINISHED] = B(HTTP_REQ_ABORTED),
    [HTTP_REQ_ABORTED] = 0,
};

int http_state_legal(http_state from, http_state to)
{
    if ((unsigned)from >= HTTP_REQ_NSTATES || (unsigned)to >= HTTP_REQ_NSTATES) return 0;
    return (legal_next[from] & B(to)) != 0;
}

const char *http_state_name(http_state st)
{
    static const char *const names[HTTP_REQ_NSTATES] = {
        "head", "body", "tokenizing", "queued", "running", "streaming", "finished", "aborted"};
    return (unsigned)st < HTTP_REQ_NSTATES ? names[st] : "invalid";
}

void http_req_set_state(srv_req *r, http_state to)
{
    assert(http_state_legal(r->state, to));
    r->state = to;
}

void http_suspend(srv_req *r, http_cont cont)
{
    assert(!r->suspended && r->conn != NULL);
    r->cont = cont;
    r->suspended = 1;
    MHD_suspend_connection(r->conn);
}

void http_resume(srv_req *r)
{
    if (r->suspended && r->conn != NULL) {
        r->suspended = 0;
        MHD_resume_connection(r->conn);
    }
}

int http_request_id_ok(const char *v)
{
    if (v == NULL) return 0;
    size_t n = 0;
    for (; v[n] != '\0'; n++)
        if ((unsigned char)v[n] <= 0x20 || (unsigned char)v[n] >= 0x7F || n >= 128) return 0;
    return n > 0;
}

void http_request_id_new(srv *s, char *buf, size_t len)
{
    snprintf(buf, len, "req-%llx%06llx", (unsigned long long)time(NULL),
             (unsigned long long)(s->next_id++ & 0xFFFFFF));
}

int http_append(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1) c *= 2;
        char *b = realloc(*buf, c);
        if (b == NULL) return -1;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

int http_peer_closed(const srv_req *r)
{
    if (r->conn == NULL || r->conn_rec == NULL || r->conn_rec->fd < 0) return 0;
    if (r->s->tls != NULL) {
        /* A TLS client that leaves sends a close_notify record before its
         * FIN: bytes are waiting, and a peek never reaches the end. The
         * FIN itself is what counts (a TLS client does not half-close). */
        struct pollfd p = {.fd = r->conn_rec->fd, .events = POLLRDHUP, .revents = 0};
        return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
    }
    char b;
    ssize_t n = recv(r->conn_rec->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return 1;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 1;
    return 0;
}

void http_conn_timeout(srv_req *r, unsigned seconds)
{
    if (r->conn == NULL) return;
    /* libmicrohttpd (0.9.75) restarts a connection's idle clock when a
     * timeout is set on it while it has none: 0 first, so that the seconds
     * count from now, not from its last byte (the hostile case
     * stall_cut_event_boundary reads on after the latter would have
     * passed). */
    MHD_set_connection_option(r->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    if (seconds > 0) MHD_set_connection_option(r->conn, MHD_CONNECTION_OPTION_TIMEOUT, seconds);
}

void http_req_hold(srv_req *r)
{
    assert(r->refs > 0);
    r->refs++;
}

void http_req_release(srv_req *r)
{
    assert(r->refs > 0);
    if (--r->refs > 0) return;
    assert(r->conn == NULL);
    if (r->ops != NULL && r->ops->free != NULL) r->ops->free(r);
    free(r->body);
    r->s->active--;
    free(r);
}
