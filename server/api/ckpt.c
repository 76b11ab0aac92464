/*
 * server/api/ckpt.c: the served checkpoints, by name.
 *
 * `model = DIR[,NAME=DIR...]` serves several checkpoints in one daemon
 * (the daemon loads them: daemon/models.c). The first is the primary,
 * named by model_name as a single checkpoint always was; each other
 * answers to its NAME. A request's `model` picks one (adapters.c's
 * adp_pick asks here first); its sequences go to that checkpoint's
 * scheduler, whose KV pool and prefix cache are its own, so that a prompt
 * never takes blocks another model computed. step.c gives the schedulers
 * their steps in turn.
 */
#include "api/api.h"

#include <string.h>

srv_ckpt *ckpt_find(const srv *s, const char *name)
{
    srv_api *a = s->api;
    if (cfg_model_name_ok(&s->cfg, name)) return &a->ckpt[0];
    for (size_t i = 1; i < a->nckpt; i++)
        if (strcmp(a->ckpt[i].name, name) == 0) return &a->ckpt[i];
    return NULL;
}

const char *ckpt_name(const srv *s, const srv_ckpt *c)
{
    return c == &s->api->ckpt[0] ? s->cfg.model_name : c->name;
}

const char *ckpt_others_words(const srv *s)
{
    int more = s->api->nckpt > 1, lora = s->api->nadapters > 0;
    if (more && lora) return ", other checkpoints and LoRA adapters (GET /v1/models)";
    if (more) return " and other checkpoints (GET /v1/models)";
    if (lora) return " and its LoRA adapters (GET /v1/models)";
    return "";
}

srv_ckpt *cmpl_ckpt(const srv_req *r)
{
    return r->cmpl != NULL && r->cmpl->ckpt != NULL ? r->cmpl->ckpt : &r->s->api->ckpt[0];
}

void ckpt_stats_sum(const srv *s, eng_sched_stats *out)
{
    const srv_api *a = s->api;
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < a->nckpt; i++) {
        eng_sched_stats st;
        eng_sched_stats_get(a->ckpt[i].sched, &st);
        if (i == a->step_ckpt) { /* the latest step's */
            out->last_step_rows = st.last_step_rows;
            out->last_step_seqs = st.last_step_seqs;
            out->last_step_seconds = st.last_step_seconds;
        }
        out->running += st.running;
        out->queued += st.queued;
        out->kv_blocks_used += st.kv_blocks_used;
        out->kv_blocks_total += st.kv_blocks_total;
        out->steps += st.steps;
        out->times.matmul += st.times.matmul;
        out->times.lora += st.times.lora;
        out->times.attention += st.times.attention;
        out->times.lm_head += st.times.lm_head;
        out->times.other += st.times.other;
        out->times.sample += st.times.sample;
        out->tokens_generated += st.tokens_generated;
        out->prompt_computed += st.prompt_computed;
        out->prefix_lookups += st.prefix_lookups;
        out->prefix_hit_tokens += st.prefix_hit_tokens;
        out->prefix_evictions += st.prefix_evictions;
        out->kv_blocks_cached += st.kv_blocks_cached;
        out->mask_errors += st.mask_errors;
        for (size_t d = 0; d < ENG_DRAFTERS; d++) {
            out->spec_drafted[d] += st.spec_drafted[d];
            out->spec_accepted[d] += st.spec_accepted[d];
            for (size_t j = 0; j < ENG_SPEC_MAX; j++) {
                out->spec_drafted_at[d][j] += st.spec_drafted_at[d][j];
                out->spec_accepted_at[d][j] += st.spec_accepted_at[d][j];
            }
        }
        out->spec_steps += st.spec_steps;
    }
}
