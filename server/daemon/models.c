/*
 * server/daemon/models.c: the served checkpoints, loaded at start-up.
 *
 * `model = DIR[,NAME=DIR...]`: the first folder is the primary (its
 * tokenizer is everyone's, model_name names it, the draft model and the
 * LoRA adapters are made for it); each other checkpoint must share that
 * tokenizer (its vocab.json and merges.txt, where it has them, the same
 * bytes; its vocabulary the same size), since prompts are tokenized once
 * before a checkpoint is picked and structured outputs' masks are made for
 * one vocabulary.
 *
 * Each checkpoint is its own read-only mapping with its own scheduler and
 * KV pool; the schedulers after the first borrow the first's step threads
 * (step.c runs one step at a time). kv_cache_mb is split in proportion to
 * what a position costs each checkpoint (layers x width), so that every
 * checkpoint holds the same number of positions: a checkpoint's share is
 * never taken by another's load (no preemption), and each is admitted
 * exactly as it would be alone with its share.
 */
#include "daemon/daemon.h"
#include "daemon/systemd.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* 1 when files a and b hold the same bytes (both readable). */
static int same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa != NULL && fb != NULL;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        same = ca == cb;
        if (ca == EOF) break;
    }
    if (fa != NULL) fclose(fa);
    if (fb != NULL) fclose(fb);
    return same;
}

/* 0 when dir's tokenizer files, where it has them, are the primary's;
 * else -1 with err naming the file (what names dir: "draft_model", ...). */
static int same_tokenizer(const srv *s, const char *what, const char *dir, char *err, size_t errlen)
{
    static const char *const files[] = {"vocab.json", "merges.txt"};
    for (size_t i = 0; i < 2; i++) {
        char mine[CFG_STR_MAX + 16], theirs[CFG_STR_MAX + 16];
        snprintf(mine, sizeof mine, "%s/%s", s->cfg.model_dir, files[i]);
        snprintf(theirs, sizeof theirs, "%s/%s", dir, files[i]);
        if (access(theirs, F_OK) == 0 && !same_file(mine, theirs)) {
            snprintf(err, errlen,
                     "%s %.512s: its %s differs from the model's: %s must share the first "
                     "model's tokenizer",
                     what, dir, files[i], strcmp(what, "draft_model") == 0 ? "a draft" : "it");
            return -1;
        }
    }
    return 0;
}

/* draft_model: loaded beside the model (speculative decoding); the
 * scheduler checks the vocabulary's size and the context. 0, or -1. */
static int draft_load(srv *s, char *err, size_t errlen)
{
    if (same_tokenizer(s, "draft_model", s->cfg.draft_model, err, errlen) != 0) return -1;
    char why[256];
    if (eng_model_load(s->cfg.draft_model, &s->api->draft, why, sizeof why) != ENG_OK) {
        snprintf(err, errlen, "draft_model: %.900s", why);
        return -1;
    }
    const eng_config *c = eng_model_config(s->api->draft);
    log_line("info", "draft model %s: %zu layers, width %zu (%s weights), for speculative decoding",
             s->cfg.draft_model, c->n_layer, c->n_embd, eng_model_dtype(s->api->draft));
    return 0;
}

/* The debug lines of one checkpoint's weights: format, layout, copies. */
static void weight_lines(const char *name, const eng_model *m)
{
    log_line("debug", "%s: weights %s, %s layout, %.1f MB as stored; kernels: %s", name,
             eng_model_dtype(m), eng_model_layout(m), (double)eng_model_weight_bytes(m) / 1e6,
             eng_model_kernels(m));
    if (eng_model_pair_bytes(m) > 0) {
        int q8 = strcmp(eng_model_dtype(m), "q8") == 0;
        log_line("debug",
                 "%s: built the %s copy for the %s kernels: %.1f MB private (GPT2D_KERNELS=avx512 "
                 "reads the file's pages instead)",
                 name, q8 ? "Q8 projections' quad" : "BF16 weights' pair (projections, LM head)",
                 q8 ? "avx512-vnni" : "avx512-bf16", (double)eng_model_pair_bytes(m) / 1e6);
    }
    if (eng_model_copied_bytes(m) > 0)
        log_line("warn",
                 "%s: copied %.1f MB of misaligned weights; `gpt2d convert` writes a file that "
                 "maps without copying",
                 name, (double)eng_model_copied_bytes(m) / 1e6);
}

/* The other checkpoints (cfg.more_models), after the primary. */
static int others_load(srv *s, char *err, size_t errlen)
{
    srv_api *a = s->api;
    size_t V = eng_model_config(a->model)->n_vocab;
    for (size_t i = 0; i < s->cfg.n_more_models; i++) {
        srv_ckpt *c = &a->ckpt[a->nckpt];
        snprintf(c->name, sizeof c->name, "%s", s->cfg.more_models[i].name);
        snprintf(c->dir, sizeof c->dir, "%s", s->cfg.more_models[i].dir);
        /* The first's names may have grown since the list was read: its
         * checkpoint's own name (srv_model_names), which the request's
         * `model` would then find first. */
        if (cfg_model_name_ok(&s->cfg, c->name)) {
            snprintf(err, errlen,
                     "model: the name '%s' is taken (the first checkpoint's own name); NAME=DIR "
                     "gives it another",
                     c->name);
            return -1;
        }
        char what[CFG_MODEL_NAME_MAX + 16];
        snprintf(what, sizeof what, "model %s:", c->name);
        if (same_tokenizer(s, what, c->dir, err, errlen) != 0) return -1;
        log_line("info", "loading %s (%s)", c->dir, c->name);
        char why[900];
        if (eng_model_load(c->dir, &c->model, why, sizeof why) != ENG_OK) {
            snprintf(err, errlen, "model %s: %s", c->name, why);
            return -1;
        }
        a->nckpt++; /* freed with the others from here on */
        if (eng_model_config(c->model)->n_vocab != V) {
            snprintf(err, errlen,
                     "model %s: its vocabulary has %zu tokens, the first model's %zu: every "
                     "checkpoint must share the first one's tokenizer",
                     c->name, eng_model_config(c->model)->n_vocab, V);
            return -1;
        }
        weight_lines(c->name, c->model);
    }
    return 0;
}

/* Each checkpoint's scheduler on its share of kv_cache_mb, warmed up. */
static int scheds_start(srv *s, char *err, size_t errlen)
{
    srv_api *a = s->api;
    size_t per_all = 0;
    for (size_t i = 0; i < a->nckpt; i++) per_all += eng_model_kv_position_bytes(a->ckpt[i].model);
    size_t budget = s->cfg.kv_cache_mb << 20;
    for (size_t i = 0; i < a->nckpt; i++) {
        srv_ckpt *c = &a->ckpt[i];
        size_t per = eng_model_kv_position_bytes(c->model);
        c->kv_bytes =
            a->nckpt == 1 ? budget : (size_t)((double)budget * (double)per / (double)per_all);
        eng_sched_opts so = {.kv_bytes = c->kv_bytes,
                             .block_len = s->cfg.kv_block,
                             .max_running = s->cfg.max_running,
                             .max_queue = s->cfg.max_queue,
                             .step_tokens = s->cfg.step_tokens,
                             .threads = s->cfg.threads,
                             .prefix_cache = s->cfg.prefix_cache,
                             .spec_max_batch = s->cfg.speculative_max_batch,
                             .draft = i == 0 ? a->draft : NULL,
                             .threads_of = i == 0 ? NULL : a->ckpt[0].sched};
        char why[900];
        if (eng_sched_new(c->model, &so, &c->sched, why, sizeof why) != ENG_OK) {
            if (i == 0)
                snprintf(err, errlen, "%s", why);
            else
                snprintf(err, errlen, "model %s: %s (its share of kv_cache_mb: %.1f MiB)", c->name,
                         why, (double)c->kv_bytes / (1 << 20));
            return -1;
        }
        double warm0 = log_now();
        if (eng_sched_warmup(c->sched, why, sizeof why) != ENG_OK) {
            snprintf(err, errlen, "%s", why);
            return -1;
        }
        log_line("debug", "%s: warm-up step: %.0f ms", ckpt_name(s, c), (log_now() - warm0) * 1e3);
        if (a->nckpt > 1) {
            const eng_config *mc = eng_model_config(c->model);
            log_line("info",
                     "model %s: %s, %zu layers, width %zu, %s weights; KV %.1f MiB of "
                     "kv_cache_mb (%zu positions)",
                     ckpt_name(s, c), i == 0 ? s->cfg.model_dir : c->dir, mc->n_layer, mc->n_embd,
                     eng_model_dtype(c->model), (double)c->kv_bytes / (1 << 20), c->kv_bytes / per);
        }
    }
    return 0;
}

int srv_models_load(srv *s, char *err, size_t errlen)
{
    srv_api *a = s->api;
    {
        char wanted[CFG_STR_MAX];
        if (srv_model_fallback(&s->cfg, wanted, sizeof wanted))
            log_line("warn",
                     "no model in %s yet: serving fallback_model %s until there is one; "
                     "gpt2d-download fetches GPT-2 (operations.md, \"The model\"), then restart "
                     "gpt2d",
                     wanted, s->cfg.model_dir);
    }
    log_line("info", "loading %s", s->cfg.model_dir);
    srv_sd_notify("STATUS=loading %s", s->cfg.model_dir);
    srv_model_watch_init(s); /* the files' identities before they are read */
    char why[1024];
    if (bpe_load_dir(s->cfg.model_dir, &a->tok, why, sizeof why) != BPE_OK
        || eng_model_load(s->cfg.model_dir, &a->model, why, sizeof why) != ENG_OK) {
        /* A folder with no weights yet: say where they come from. */
        if (srv_model_present(s->cfg.model_dir))
            snprintf(err, errlen, "%s", why);
        else
            snprintf(
                err, errlen,
                "%s; %s has no model yet: gpt2d-download fetches the published GPT-2 "
                "(operations.md, \"The model\"), or --model (model in gpt2d.conf) names another "
                "folder",
                why, s->cfg.model_dir);
        return -1;
    }
    a->ckpt[0].model = a->model;
    snprintf(a->ckpt[0].dir, sizeof a->ckpt[0].dir, "%s", s->cfg.model_dir);
    a->nckpt = 1;
    if (s->cfg.draft_model[0] != '\0' && draft_load(s, err, errlen) != 0) return -1;
    if (srv_grammar_init(s) != 0) {
        snprintf(err, errlen, "out of memory (the structured outputs' vocabulary trie)");
        return -1;
    }
    weight_lines("model", a->model);
    srv_model_names(&s->cfg, a->model);
    if (others_load(s, err, errlen) != 0) return -1;
    return scheds_start(s, err, errlen);
}

void srv_models_free(srv *s)
{
    srv_api *a = s->api;
    /* The borrowers of the first's threads first. */
    for (size_t i = a->nckpt; i-- > 0;) {
        eng_sched_free(a->ckpt[i].sched);
        a->ckpt[i].sched = NULL;
    }
    for (size_t i = 1; i < a->nckpt; i++) eng_model_free(a->ckpt[i].model);
    eng_model_free(a->model);
    eng_model_free(a->draft);
    a->model = a->draft = NULL;
    a->nckpt = 0;
}
