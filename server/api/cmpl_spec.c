/*
 * server/api/cmpl_spec.c: speculative decoding on the generation routes
 * (docs/api.md, "Speculative decoding"). The engine verifies drafts so that
 * no output changes (engine.h); here a request's settings become the
 * engine's: speculative_tokens (the request's, else the server's; the
 * server's 0 turns it off for everyone), the drafter (a prediction's ids
 * when the request carries one, and then only they; else the request's or
 * the server's speculative_drafter), and the usage's prediction counts.
 */
#include "api/api.h"

#include <string.h>

/* 1 when the request's checkpoint has a draft model: the primary's, the
 * only scheduler made with one (daemon/models.c). */
static int has_draft(const srv_req *r)
{
    return r->s->api->draft != NULL && cmpl_ckpt(r) == &r->s->api->ckpt[0];
}

/* The drafter a request without a prediction gets. */
static eng_drafter drafter_of(const srv_req *r)
{
    int d = r->cmpl->oreq.drafter;
    if (d == OAI_DRAFT_SERVER) {
        const char *c = r->s->cfg.speculative_drafter;
        d = strcmp(c, "draft_model") == 0 ? OAI_DRAFT_MODEL
            : strcmp(c, "none") == 0      ? OAI_DRAFT_NONE
                                          : OAI_DRAFT_LOOKUP;
        /* A reload may name draft_model on a server started without one
         * (draft_model itself needs a restart), and the draft model is the
         * primary checkpoint's alone: lookup instead. */
        if (d == OAI_DRAFT_MODEL && !has_draft(r)) d = OAI_DRAFT_LOOKUP;
    }
    return d == OAI_DRAFT_MODEL  ? ENG_DRAFT_MODEL
           : d == OAI_DRAFT_NONE ? ENG_DRAFT_PREDICTION /* a prediction alone: none here */
                                 : ENG_DRAFT_LOOKUP;
}

void cmpl_job_prediction(srv_req *r)
{
    const oai_request *q = &r->cmpl->oreq;
    r->tok->pred_text = q->prediction;
    r->tok->pred_text_len = q->prediction_len;
    /* A prediction drafts at most max_tokens tokens: 64 bytes a token is
     * past what any text's tokens average. */
    r->tok->pred_max_bytes = (q->max_tokens + 16) * 64;
}

void cmpl_speculation(const srv_req *r, eng_request *er)
{
    const oai_request *q = &r->cmpl->oreq;
    size_t k =
        q->has_speculative_tokens ? (size_t)q->speculative_tokens : r->s->cfg.speculative_tokens;
    if (r->s->cfg.speculative_tokens == 0) k = 0;
    er->speculative_tokens = k;
    if (q->prediction != NULL) {
        er->drafter = ENG_DRAFT_PREDICTION;
        er->prediction = r->tok->pred_ids;
        er->nprediction = r->tok->npred;
    } else {
        er->drafter = drafter_of(r);
    }
}

int cmpl_speculation_ok(srv_req *r, enum MHD_Result *rc)
{
    if (r->cmpl->oreq.drafter != OAI_DRAFT_MODEL || has_draft(r)) return 1;
    if (r->s->api->draft != NULL)
        *rc = http_send_error(r, 400, "invalid_request_error", NULL, "speculative_drafter", NULL,
                              "'speculative_drafter' \"draft_model\": the draft model is made for "
                              "'%s', not '%s'; use \"lookup\" or \"none\"",
                              r->s->cfg.model_name, ckpt_name(r->s, cmpl_ckpt(r)));
    else
        *rc = http_send_error(r, 400, "invalid_request_error", NULL, "speculative_drafter", NULL,
                              "'speculative_drafter' \"draft_model\" needs a server started with "
                              "draft_model; this one has none");
    return 0;
}

void cmpl_usage_prediction(const srv_req *r, json_t *usage)
{
    if (r->cmpl == NULL || r->cmpl->oreq.prediction == NULL) return;
    size_t drafted = 0, accepted = 0;
    for (size_t i = 0; i < r->cmpl->nchoices; i++) {
        drafted += r->cmpl->choices[i].drafted;
        accepted += r->cmpl->choices[i].accepted;
    }
    /* OpenAI bills rejected prediction tokens as completion tokens; here
     * they are the drafted ones the model did not draw (computed, then
     * rolled back). */
    json_object_set_new(usage, "completion_tokens_details",
                        json_pack("{s:I, s:I}", "accepted_prediction_tokens", (json_int_t)accepted,
                                  "rejected_prediction_tokens", (json_int_t)(drafted - accepted)));
}
