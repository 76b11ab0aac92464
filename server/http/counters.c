/*
 * server/http/counters.c: what the HTTP layer counts for /metrics (http.h:
 * http_metrics), and the histogram every layer's counters use. The page
 * itself is the daemon's (daemon/metrics.c). Pure; loop thread.
 */
#include "http/http.h"

#include <string.h>

const char *const met_routes[MET_ROUTES] = {"/v1/completions",
                                            "/v1/chat/completions",
                                            "/v1/models",
                                            "/v1/models/{id}",
                                            "/v1/responses",
                                            "/v1/responses/{id}",
                                            "/v1/embeddings",
                                            "/health",
                                            "/ready",
                                            "/metrics",
                                            "/tokenize",
                                            "/detokenize",
                                            "/version",
                                            "/",
                                            "other"};
/* Every status gpt2d writes (204: a preflight; 403: a refused Origin;
 * 421: a Host not allowed; 414/431/501: refused heads), then "other". */
const unsigned met_statuses[MET_STATUSES] = {200, 204, 400, 401, 403, 404, 405, 408, 413,
                                             414, 421, 429, 431, 500, 501, 503, 0};

/* The label of each reason, by its enum (http.h). */
static const char *const met_refused_names[MET_REFUSED_N] = {
    [MET_REFUSED_PER_IP] = "per_ip",     [MET_REFUSED_MAX_CONNECTIONS] = "max_connections",
    [MET_REFUSED_DRAINING] = "draining", [MET_REFUSED_SHUTDOWN] = "shutdown",
    [MET_REFUSED_TIMEOUT] = "timeout",   [MET_REFUSED_HOST] = "host"};

void met_count_refused(http_metrics *m, met_refused why)
{
    if ((unsigned)why < MET_REFUSED_N) m->refused[why]++;
}

const char *met_refused_name(met_refused why)
{
    return (unsigned)why < MET_REFUSED_N ? met_refused_names[why] : "other";
}

void met_observe(met_hist *h, double v)
{
    for (size_t i = 0; i < MET_BUCKETS; i++)
        if (v <= h->bounds[i]) {
            h->counts[i]++;
            break;
        }
    h->count++;
    h->sum += v;
}

void met_count_request(http_metrics *m, const char *url, unsigned status, int aborted)
{
    size_t ri = MET_ROUTES - 1, si = MET_STATUSES - 1;
    static const char models[] = "/v1/models/";
    for (size_t i = 0; i + 1 < MET_ROUTES; i++)
        if (strcmp(url, met_routes[i]) == 0) ri = i;
    if (strncmp(url, models, sizeof models - 1) == 0 && url[sizeof models - 1] != '\0')
        ri = 3; /* "/v1/models/{id}": one series for every id */
    static const char responses[] = "/v1/responses/";
    if (strncmp(url, responses, sizeof responses - 1) == 0 && url[sizeof responses - 1] != '\0')
        for (size_t i = 0; i + 1 < MET_ROUTES; i++) /* one series for every id, input_items too */
            if (strcmp(met_routes[i], "/v1/responses/{id}") == 0) ri = i;
    for (size_t i = 0; i + 1 < MET_STATUSES; i++)
        if (status == met_statuses[i]) si = i;
    m->requests[ri][si]++;
    if (aborted) m->aborted++;
}
