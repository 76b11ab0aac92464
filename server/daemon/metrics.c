/*
 * server/daemon/metrics.c: the Prometheus text page of /metrics, from the
 * HTTP layer's and the API layer's counters (http/counters.c counts the
 * former). Pure (no I/O but a memory stream); loop thread.
 */
#include "daemon/metrics.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double met_seconds[MET_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                1,     2.5,  5,     10,   30,  60,   120};
static const double met_rows[MET_BUCKETS] = {1,   2,   4,   8,    16,   32,   64,
                                             128, 256, 512, 1024, 2048, 4096, 8192};

static const char *const met_cancel_names[MET_CANCEL_REASONS] = {
    [MET_CANCEL_CLIENT_CLOSED] = "client_closed",
    [MET_CANCEL_QUEUE_TIMEOUT] = "queue_timeout",
    [MET_CANCEL_TIMEOUT] = "timeout",
    [MET_CANCEL_STREAM_STALLED] = "stream_stalled",
    [MET_CANCEL_SHUTDOWN] = "shutdown",
    [MET_CANCEL_RESPONSE_BYTES] = "response_bytes"};

void met_init(http_metrics *h, cmpl_metrics *c)
{
    memset(h, 0, sizeof *h);
    memset(c, 0, sizeof *c);
    c->ttft.bounds = c->itl.bounds = h->duration.bounds = c->step_seconds.bounds = met_seconds;
    c->step_rows.bounds = met_rows;
}

static void met_print(FILE *m, const char *name, const char *help, const met_hist *h)
{
    fprintf(m, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i < MET_BUCKETS; i++) {
        cum += h->counts[i];
        fprintf(m, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    fprintf(m, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
            (unsigned long long)h->count, name, h->sum, name, (unsigned long long)h->count);
}

/* A label value: backslash, quote and newline escaped (the text format). */
static void label(FILE *m, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            fprintf(m, "\\%c", *v);
        else if (*v == '\n')
            fputs("\\n", m);
        else
            fputc(*v, m);
    }
}

static void family(FILE *m, const char *name, const char *type, const char *help)
{
    fprintf(m, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample_u(FILE *m, const char *name, const char *type, const char *help,
                     unsigned long long v)
{
    family(m, name, type, help);
    fprintf(m, "%s %llu\n", name, v);
}

static void sample_d(FILE *m, const char *name, const char *type, const char *help, double v)
{
    if (v < 0) return; /* unknown here: leave the family out */
    family(m, name, type, help);
    fprintf(m, "%s %.6f\n", name, v);
}

/* One sample's name and labels: the `model` label where several
 * checkpoints are served (one alone keeps the page it always had), then
 * more ("" for none: drafter="x",position="n"). */
static void series(FILE *m, const char *name, const met_info *info, size_t k, const char *more)
{
    fputs(name, m);
    int several = info->nmodels > 1;
    if (!several && more[0] == '\0') {
        fputc(' ', m);
        return;
    }
    fputc('{', m);
    if (several) {
        fputs("model=\"", m);
        label(m, info->model_name[k]);
        fputs(more[0] != '\0' ? "\"," : "\"", m);
    }
    fprintf(m, "%s} ", more);
}

/* A scheduler family: one sample a checkpoint. */
#define MODEL_FAMILY(m, info, name, type, help, field, fmt, cast)                                  \
    do {                                                                                           \
        family(m, name, type, help);                                                               \
        for (size_t k_ = 0; k_ < (info)->nmodels; k_++) {                                          \
            series(m, name, info, k_, "");                                                         \
            fprintf(m, fmt "\n", (cast)(info)->model_stats[k_].field);                             \
        }                                                                                          \
    } while (0)
#define MODEL_U(m, info, name, type, help, field)                                                  \
    MODEL_FAMILY(m, info, name, type, help, field, "%llu", unsigned long long)

/* A family with one sample a name, always labelled key="name": values[k]
 * for names[k], k < n (the checkpoints', the adapters'). */
#define LABELLED(m, name, type, help, key, names, n, values)                                       \
    do {                                                                                           \
        family(m, name, type, help);                                                               \
        for (size_t k_ = 0; k_ < (n); k_++) {                                                      \
            fputs(name "{" key "=\"", m);                                                          \
            label(m, (names)[k_]);                                                                 \
            fprintf(m, "\"} %llu\n", (unsigned long long)(values)[k_]);                            \
        }                                                                                          \
    } while (0)

/* Speculative decoding by drafter: drafted and accepted tokens v[d] (per
 * 0), or by drafter and position in the draft (0: its first token)
 * v[d * per + j] (per ENG_SPEC_MAX); v at offset in each checkpoint's
 * statistics. */
static void spec_family(FILE *m, const met_info *info, const char *name, const char *help,
                        size_t offset, size_t per)
{
    static const char *const by[ENG_DRAFTERS] = {[ENG_DRAFT_LOOKUP] = "lookup",
                                                 [ENG_DRAFT_PREDICTION] = "prediction",
                                                 [ENG_DRAFT_MODEL] = "draft_model"};
    family(m, name, "counter", help);
    for (size_t k = 0; k < info->nmodels; k++) {
        const uint64_t *v =
            (const uint64_t *)(const void *)((const char *)&info->model_stats[k] + offset);
        for (size_t d = 0; d < ENG_DRAFTERS; d++)
            for (size_t j = 0; j < (per ? per : 1); j++) {
                char more[64];
                if (per)
                    snprintf(more, sizeof more, "drafter=\"%s\",position=\"%zu\"", by[d], j);
                else
                    snprintf(more, sizeof more, "drafter=\"%s\"", by[d]);
                series(m, name, info, k, more);
                fprintf(m, "%llu\n", (unsigned long long)v[per ? d * per + j : d]);
            }
    }
}

static void spec_render(FILE *m, const met_info *info)
{
    spec_family(m, info, "gpt2d_spec_drafted_tokens_total",
                "Tokens drafted for speculative decoding and verified, by drafter.",
                offsetof(eng_sched_stats, spec_drafted), 0);
    spec_family(m, info, "gpt2d_spec_accepted_tokens_total",
                "Drafted tokens the model drew as drafted (kept), by drafter.",
                offsetof(eng_sched_stats, spec_accepted), 0);
    spec_family(m, info, "gpt2d_spec_position_drafted_total",
                "Drafts that reached this position (0: a draft's first token), by drafter.",
                offsetof(eng_sched_stats, spec_drafted_at), ENG_SPEC_MAX);
    spec_family(m, info, "gpt2d_spec_position_accepted_total",
                "Drafts accepted through this position, by drafter: over the drafted count, the "
                "acceptance rate at each position.",
                offsetof(eng_sched_stats, spec_accepted_at), ENG_SPEC_MAX);
    MODEL_U(m, info, "gpt2d_spec_verify_steps_total", "counter",
            "Steps in which some sequence verified a draft.", spec_steps);
}

int met_render(const http_metrics *h, const cmpl_metrics *c, const met_info *info, char **out,
               size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&buf, &n);
    if (m == NULL) return -1;
    family(m, "gpt2d_build_info", "gauge",
           "Always 1; the labels say which build serves which model and weights.");
    fputs("gpt2d_build_info{version=\"", m);
    label(m, info->version);
    fputs("\",commit=\"", m);
    label(m, info->commit);
    fputs("\",buildtype=\"", m);
    label(m, info->buildtype);
    fputs("\",kernels=\"", m);
    label(m, info->kernels);
    fputs("\",dtype=\"", m);
    label(m, info->dtype);
    fputs("\",layout=\"", m);
    label(m, info->layout);
    fputs("\",model=\"", m);
    label(m, info->model);
    fputs("\",tls=\"", m);
    label(m, info->tls != NULL ? info->tls : "none");
    fputs("\"} 1\n", m);
    family(m, "gpt2d_requests_total", "counter", "HTTP requests by route and status.");
    for (size_t ri = 0; ri < MET_ROUTES; ri++)
        for (size_t si = 0; si < MET_STATUSES; si++) {
            if (h->requests[ri][si] == 0) continue;
            char code[16];
            if (met_statuses[si] == 0)
                snprintf(code, sizeof code, "other");
            else
                snprintf(code, sizeof code, "%u", met_statuses[si]);
            fprintf(m, "gpt2d_requests_total{route=\"%s\",status=\"%s\"} %llu\n", met_routes[ri],
                    code, (unsigned long long)h->requests[ri][si]);
        }
    family(m, "gpt2d_connections_refused_total", "counter",
           "Connections and requests refused before a route ran, by reason.");
    for (size_t i = 0; i < MET_REFUSED_N; i++)
        fprintf(m, "gpt2d_connections_refused_total{reason=\"%s\"} %llu\n",
                met_refused_name((met_refused)i), (unsigned long long)h->refused[i]);
    sample_u(m, "gpt2d_requests_aborted_total", "counter",
             "Requests whose client went away before the answer was complete.",
             (unsigned long long)h->aborted);
    family(m, "gpt2d_requests_cancelled_total", "counter",
           "Requests whose generation was cancelled before it finished, by reason.");
    for (size_t i = 0; i < MET_CANCEL_REASONS; i++)
        fprintf(m, "gpt2d_requests_cancelled_total{reason=\"%s\"} %llu\n", met_cancel_names[i],
                (unsigned long long)c->cancelled[i]);
    sample_u(m, "gpt2d_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
             (unsigned long long)h->prompt_tokens);
    sample_u(m, "gpt2d_completion_tokens_total", "counter", "Tokens generated.",
             (unsigned long long)h->completion_tokens);
    met_print(m, "gpt2d_time_to_first_token_seconds", "From the request to its first token.",
              &c->ttft);
    met_print(m, "gpt2d_inter_token_latency_seconds", "Between consecutive tokens of a choice.",
              &c->itl);
    met_print(m, "gpt2d_request_duration_seconds", "Completion requests, start to end.",
              &h->duration);
    met_print(m, "gpt2d_step_duration_seconds", "One engine step: forward and sampling.",
              &c->step_seconds);
    met_print(m, "gpt2d_step_batch_rows", "Rows (tokens) per engine step.", &c->step_rows);
    MODEL_U(m, info, "gpt2d_steps_total", "counter", "Engine steps run.", steps);
    MODEL_U(m, info, "gpt2d_running_sequences", "gauge", "Sequences in the running batch.",
            running);
    MODEL_U(m, info, "gpt2d_queued_requests", "gauge", "Requests waiting for admission.", queued);
    MODEL_U(m, info, "gpt2d_kv_blocks_used", "gauge", "KV cache blocks held by sequences.",
            kv_blocks_used);
    MODEL_U(m, info, "gpt2d_kv_blocks_capacity", "gauge", "KV cache blocks in the pool.",
            kv_blocks_total);
    MODEL_U(m, info, "gpt2d_last_step_rows", "gauge", "Rows (tokens) in the last engine step.",
            last_step_rows);
    MODEL_FAMILY(m, info, "gpt2d_last_step_seconds", "gauge", "Duration of the last engine step.",
                 last_step_seconds, "%.6f", double);
    MODEL_U(m, info, "gpt2d_prefix_cache_lookups_total", "counter",
            "Admissions that looked for a cached prefix.", prefix_lookups);
    MODEL_U(m, info, "gpt2d_prefix_cache_hit_tokens_total", "counter",
            "Prompt tokens taken from the prefix cache.", prefix_hit_tokens);
    MODEL_U(m, info, "gpt2d_prefix_cache_blocks", "gauge",
            "KV blocks findable by content, held or not.", kv_blocks_cached);
    MODEL_U(m, info, "gpt2d_prefix_cache_evictions_total", "counter",
            "Cached blocks given up for fresh ones.", prefix_evictions);
    MODEL_U(m, info, "gpt2d_grammar_bound_errors_total", "counter",
            "Structured-output sequences ended because their matcher passed a bound.", mask_errors);
    spec_render(m, info);
    LABELLED(m, "gpt2d_model_requests_total", "counter",
             "Requests whose model picked the checkpoint (its adapters' included).", "model",
             info->model_name, info->nmodels, info->model_requests);
    LABELLED(m, "gpt2d_model_weight_bytes", "gauge", "Bytes of the checkpoint's weights as stored.",
             "model", info->model_name, info->nmodels, info->model_weight_bytes);
    sample_u(m, "gpt2d_responses_stored", "gauge",
             "Responses kept for previous_response_id and GET /v1/responses/{id}.",
             (unsigned long long)info->responses_stored);
    sample_u(m, "gpt2d_responses_store_bytes", "gauge",
             "Bytes the stored responses hold (responses_store_bytes bounds them).",
             (unsigned long long)info->responses_store_bytes);
    sample_u(m, "gpt2d_structured_cache_entries", "gauge",
             "Compiled structured-output formats kept for reuse.",
             (unsigned long long)info->structured_cache_entries);
    sample_u(m, "gpt2d_structured_cache_bytes", "gauge",
             "Bytes the kept compiled formats take (bounded by structured_cache_mb).",
             (unsigned long long)info->structured_cache_bytes);
    sample_d(m, "process_cpu_seconds_total", "counter", "User and system CPU time spent.",
             info->cpu_seconds);
    family(m, "gpt2d_lora_adapters", "gauge", "LoRA adapters resident (max_loras bounds them).");
    fprintf(m, "gpt2d_lora_adapters %zu\n", info->nlora);
    LABELLED(m, "gpt2d_lora_requests_total", "counter",
             "Requests whose model picked the LoRA adapter, since it was loaded.", "adapter",
             info->lora_name, info->nlora, info->lora_requests);
    LABELLED(m, "gpt2d_lora_in_use", "gauge",
             "Requests and their sequences (waiting or running) holding the LoRA adapter.",
             "adapter", info->lora_name, info->nlora, info->lora_running);
    LABELLED(m, "gpt2d_lora_bytes", "gauge", "Bytes of the LoRA adapter's factors in memory.",
             "adapter", info->lora_name, info->nlora, info->lora_bytes);
    sample_d(m, "process_resident_memory_bytes", "gauge", "Resident memory size.",
             info->resident_bytes);
    sample_d(m, "process_virtual_memory_bytes", "gauge", "Virtual memory size.",
             info->virtual_bytes);
    sample_d(m, "process_open_fds", "gauge", "Open file descriptors.", info->open_fds);
    sample_d(m, "process_max_fds", "gauge", "The limit of open file descriptors.", info->max_fds);
    sample_d(m, "process_start_time_seconds", "gauge",
             "Start time of the process since the Unix epoch.", info->start_time);
    int bad = ferror(m);
    if (fclose(m) != 0 || bad || buf == NULL) { /* a write failed: never a partial page */
        free(buf);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}
