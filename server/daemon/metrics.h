/*
 * server/daemon/metrics.h: the counters and histograms of /metrics, and
 * their Prometheus page (metrics.c: pure, loop thread). A leaf: every layer
 * counts into it, and it calls nothing in server/.
 */
#ifndef GPT2D_SERVER_METRICS_H
#define GPT2D_SERVER_METRICS_H

#include "engine.h"

#include <stddef.h>
#include <stdint.h>

#define MET_BUCKETS 14
#define MET_ROUTES 14   /* metrics.c's met_routes, and "other" */
#define MET_STATUSES 17 /* metrics.c's met_statuses, and "other" */

typedef struct {
    const double *bounds;
    uint64_t counts[MET_BUCKETS]; /* non-cumulative; printed cumulative */
    uint64_t count;
    double sum;
} met_hist;

/* What /metrics says about the build and the process (probes.c gathers
 * the process's numbers; met_render only prints them). */
typedef struct {
    const char *version, *commit, *buildtype, *kernels, *dtype, *layout, *model;
    const char *tls;          /* "gnutls": this build serves HTTPS; "none": it cannot */
    double start_time;        /* Unix seconds */
    double cpu_seconds;       /* user + system */
    double resident_bytes;    /* -1: unknown */
    double virtual_bytes;     /* -1: unknown */
    double open_fds, max_fds; /* -1: unknown */
} met_info;

/* Why a connection or request was refused before any route ran
 * (gpt2d_connections_refused_total{reason}): metrics.c's met_refused_names
 * in this order. */
typedef enum {
    MET_REFUSED_PER_IP,          /* over max_connections_per_ip: 429           */
    MET_REFUSED_MAX_CONNECTIONS, /* over max_connections, none idle: 503       */
    MET_REFUSED_DRAINING,        /* a completion while the server drains: 503  */
    MET_REFUSED_SHUTDOWN,        /* unanswered when the drain ended: 503       */
    MET_REFUSED_TIMEOUT,         /* a head or body past its deadline: 408      */
    MET_REFUSED_HOST,            /* a Host not in allowed_hosts: 421           */
    MET_REFUSED_N
} met_refused;

/* Why a request's generation was cancelled before it finished
 * (gpt2d_requests_cancelled_total{reason}); each request counts once. */
typedef enum {
    MET_CANCEL_CLIENT_CLOSED,  /* its client closed the connection */
    MET_CANCEL_QUEUE_TIMEOUT,  /* it waited longer than queue_timeout */
    MET_CANCEL_TIMEOUT,        /* its own timeout passed */
    MET_CANCEL_STREAM_STALLED, /* its stream stayed unread (stream_stall_timeout) */
    MET_CANCEL_SHUTDOWN,       /* the drain's end */
    MET_CANCEL_RESPONSE_BYTES, /* its answer outgrew max_response_bytes */
    MET_CANCEL_REASONS
} met_cancel_reason;

typedef struct {
    uint64_t requests[MET_ROUTES][MET_STATUSES]; /* the last column: others */
    uint64_t refused[MET_REFUSED_N];
    uint64_t cancelled[MET_CANCEL_REASONS];
    uint64_t prompt_tokens, completion_tokens, aborted;
    met_hist ttft, itl, duration, step_seconds, step_rows;
} srv_metrics;

/* Zeroes m and sets the histograms' buckets. */
void met_init(srv_metrics *m);
void met_observe(met_hist *h, double v);
/* Counts one finished request by route (its URL) and HTTP status. */
void met_count_request(srv_metrics *m, const char *url, unsigned status, int aborted);
/* Counts one cancelled request. */
void met_count_cancelled(srv_metrics *m, met_cancel_reason why);
/* Counts one refusal. */
void met_count_refused(srv_metrics *m, met_refused why);
/* The label value of why ("per_ip", ...). */
const char *met_refused_name(met_refused why);
/* The Prometheus text page of m, the scheduler's st and info into *out
 * (malloc'd, *len bytes). 0, or -1 when memory ran out (nothing kept). */
int met_render(const srv_metrics *m, const eng_sched_stats *st, const met_info *info, char **out,
               size_t *len);
#endif
