/*
 * engine/sched_seq.c: what both halves of the scheduler do to one sequence
 * (scheduler.c: submit, cancel, plan; sched_step.c: execute, complete):
 * free it, take it out of the running set, end it with its DONE event; and
 * the clock both read. Below both, so that neither calls into the other.
 */
#include "sched_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double sch_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void sch_seq_free(eng_sched *s, sch_seq *q)
{
    eng_kv_release(s->kv, &q->kv);
    draft_release(s, q);
    free(q->phash);
    free(q->plp);
    free(q->embed);
    free(q->pred);
    free(q->tokens);
    free((void *)q->req.sampling.bias);
    if (q->req.mask.ops != NULL) q->req.mask.ops->free(q->req.mask.self);
    eng_adapter_free(q->req.adapter);
    free(q);
}

/* Removes q from the running set (order kept: admission order). */
void sch_running_remove(eng_sched *s, sch_seq *q)
{
    for (size_t i = 0; i < s->nrunning; i++)
        if (s->running[i] == q) {
            memmove(s->running + i, s->running + i + 1, (s->nrunning - i - 1) * sizeof *s->running);
            s->nrunning--;
            return;
        }
}

void sch_finish(eng_sched *s, sch_seq *q, eng_finish why, const char *message)
{
    eng_event ev = {.kind = ENG_EV_DONE,
                    .id = q->id,
                    .finish = why,
                    .message = message,
                    .index = q->generated,
                    .cached = q->cached,
                    .drafted = q->drafted,
                    .accepted = q->accepted};
    eng_event_cb cb = q->req.on_event;
    void *user = q->req.user;
    /* An embedding that is whole: its mean, scaled to length 1 (summed in
     * index order in double, so the same bits wherever it ran). */
    float *emb = NULL;
    if (q->embed != NULL && why == ENG_FINISH_LENGTH && q->prefilled == q->req.nprompt) {
        size_t C = s->m->cfg.n_embd;
        emb = q->embed;
        q->embed = NULL;
        double norm = 0;
        for (size_t e = 0; e < C; e++) {
            emb[e] /= (float)q->req.nprompt;
            norm += (double)emb[e] * emb[e];
        }
        float scale = norm > 0 ? (float)(1.0 / sqrt(norm)) : 0.0f;
        for (size_t e = 0; e < C; e++) emb[e] *= scale;
        ev.embedding = emb;
    }
    sch_seq_free(s, q);
    cb(user, &ev);
    free(emb);
}
