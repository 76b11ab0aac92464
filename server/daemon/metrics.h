/*
 * server/daemon/metrics.h: the /metrics page (metrics.c: pure, loop
 * thread). Each layer counts into counters of its own (http.h's
 * http_metrics, api.h's cmpl_metrics); the daemon sets their buckets and
 * prints them, with the scheduler's numbers and the process's.
 */
#ifndef GPT2D_SERVER_METRICS_H
#define GPT2D_SERVER_METRICS_H

#include "api/api.h"

#include <stddef.h>
#include <stdint.h>

/* What /metrics says about the build and the process (probes.c gathers
 * the process's numbers; met_render only prints them). */
typedef struct {
    const char *version, *commit, *buildtype, *kernels, *dtype, *layout, *model;
    const char *tls;              /* "gnutls": this build serves HTTPS; "none": it cannot */
    double start_time;            /* Unix seconds */
    double cpu_seconds;           /* user + system */
    double resident_bytes;        /* -1: unknown */
    double virtual_bytes;         /* -1: unknown */
    double open_fds, max_fds;     /* -1: unknown */
    size_t responses_stored;      /* the stored responses (api/resp_store.c) */
    size_t responses_store_bytes; /* ... and the bytes they hold */
    /* The compiled structured-output formats kept (structured/cache.c):
     * entries, and their bytes as counted against structured_cache_mb. */
    size_t structured_cache_entries, structured_cache_bytes;
    /* The resident LoRA adapters (api/adapters.c), nlora of each: their
     * names, the requests that picked them, the requests and sequences
     * holding them (eng_adapter_users) and their factors' bytes. */
    size_t nlora;
    const char *const *lora_name;
    const uint64_t *lora_requests;
    const size_t *lora_running, *lora_bytes;
    /* The served checkpoints (api/ckpt.c), nmodels of each: their names
     * (the `model` label), their schedulers' statistics, the requests that
     * picked them and their weights' bytes as stored. */
    size_t nmodels;
    const char *const *model_name;
    const eng_sched_stats *model_stats;
    const uint64_t *model_requests;
    const size_t *model_weight_bytes;
} met_info;

/* Zeroes the counters of both layers and sets the histograms' buckets
 * (seconds; rows for step_rows). */
void met_init(http_metrics *h, cmpl_metrics *c);
/* The Prometheus text page of the HTTP layer's counters h, the API
 * layer's c and info (the schedulers' by checkpoint) into *out (malloc'd, *len
 * bytes). 0, or -1 when memory ran out (nothing kept). */
int met_render(const http_metrics *h, const cmpl_metrics *c, const met_info *info, char **out,
               size_t *len);
#endif
