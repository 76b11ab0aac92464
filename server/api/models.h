/*
 * server/api/models.h: what a request's `model` names, part of the API
 * layer (api.h includes it): the served checkpoints (ckpt.c; the daemon
 * loads them, daemon/models.c) and the resident LoRA adapters (adapters.c),
 * their tables' entries and the lookups by name.
 *
 * Thread: the loop thread (an adapter's load reads its files on the work
 * queue).
 *
 * Prefixes: adp_ (adapters.c), ckpt_ (ckpt.c).
 */
#ifndef GPT2D_SERVER_API_MODELS_H
#define GPT2D_SERVER_API_MODELS_H

#include "engine.h"
#include "http/http.h"

/* A resident LoRA adapter (adapters.c). */
#define ADP_MAX 1024 /* max_loras' ceiling */
typedef struct {
    char name[CFG_LORA_NAME_MAX];
    char path[CFG_STR_MAX]; /* its folder (resolved, for the route's) */
    eng_adapter *a;         /* the table's reference */
    int from_config;        /* lora_modules' (SIGHUP unloads it when unlisted) */
    uint64_t requests;      /* requests that picked it (gpt2d_lora_requests_total) */
    double load_seconds;
} adp_entry;

/* A served checkpoint (ckpt.c): the primary (model's first folder, named by
 * model_name) and those listed after it, each with its own read-only
 * mapping, scheduler and KV pool, all on the primary's step threads and
 * tokenizer. */
#define SRV_MAX_CKPT 8
typedef struct {
    char name[CFG_LORA_NAME_MAX]; /* what `model` says; the primary: cfg.model_name's names */
    char dir[CFG_STR_MAX];
    eng_model *model;
    eng_sched *sched;
    size_t kv_bytes;   /* its share of kv_cache_mb */
    uint64_t requests; /* requests that picked it (gpt2d_model_requests_total) */
} srv_ckpt;

/* ---- adapters.c: LoRA adapters by name ------------------------------------ */

/* The resident adapters, in load order (i < adp_count). */
size_t adp_count(const srv *s);
const adp_entry *adp_at(const srv *s, size_t i);
/* The adapter a `model` names (plain, or "<base name>:<adapter>"), or
 * NULL. Borrows name. */
const adp_entry *adp_find(const srv *s, const char *name);
/* Resolves a request's `model` (NULL: the base): 1 for the base or an
 * adapter (r->cmpl->adapter, r->cmpl->model set, a reference taken), 0
 * with the 404 queued (*rc). */
int adp_pick(srv_req *r, const char *model, enum MHD_Result *rc);
/* The name the answers report: the adapter's, or model_name. */
const char *adp_model_name(const srv_req *r);
/* Start-up: lora_modules loaded here and now (before serving); -1 with
 * err naming the adapter on any failure. */
int adp_start(srv *s, char *err, size_t errlen);
/* SIGHUP, after the configuration is applied: lora_modules' adapters no
 * longer listed unloaded, new or moved ones loaded on the work queue. */
void adp_reload(srv *s);
/* Shutdown: the table's references dropped. */
void adp_free_all(srv *s);
/* POST /v1/load_lora_adapter {lora_name, lora_path} and
 * POST /v1/unload_lora_adapter {lora_name} (vLLM's); 404 unless lora_dir. */
enum MHD_Result adp_route_load(srv_req *r);
enum MHD_Result adp_route_unload(srv_req *r);

/* ---- ckpt.c: the served checkpoints --------------------------------------- */

/* The checkpoint a `model` names (one of the primary's names, or another
 * checkpoint's), or NULL. Borrows name. */
srv_ckpt *ckpt_find(const srv *s, const char *name);
/* The name a checkpoint answers with: the primary's model_name, else its own. */
const char *ckpt_name(const srv *s, const srv_ckpt *c);
/* What else a model_not_found 404 names beside model_name: "" or, e.g.,
 * " and other checkpoints (GET /v1/models)". */
const char *ckpt_others_words(const srv *s);
/* The statistics of every checkpoint's scheduler summed (the counters and
 * the gauges; the last step's rows and seconds: the latest step's). */
void ckpt_stats_sum(const srv *s, eng_sched_stats *out);
/* The request's checkpoint (the primary until its `model` is resolved). */
srv_ckpt *cmpl_ckpt(const srv_req *r);

#endif
