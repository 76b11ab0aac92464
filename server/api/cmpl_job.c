/*
 * server/api/cmpl_job.c: the completion job of a request (struct cmpl_job,
 * api.h): made with its tokenizer job when a completion route takes the
 * request, freed with the request by the free hook registered here; its
 * token counts; cancelling what it runs; the srv_api's list of requests with
 * engine work, which the tick and the after-step hook walk.
 */
#include "api/api.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static void list_remove(srv_req *r)
{
    cmpl_job *j = r->cmpl;
    if (j->prev)
        j->prev->cmpl->next = j->next;
    else if (r->s->api->cmpl_list == r)
        r->s->api->cmpl_list = j->next;
    if (j->next) j->next->cmpl->prev = j->prev;
    j->prev = j->next = NULL;
}

void cmpl_list_add(srv_req *r)
{
    srv *s = r->s;
    r->cmpl->next = s->api->cmpl_list;
    if (s->api->cmpl_list) s->api->cmpl_list->cmpl->prev = r;
    s->api->cmpl_list = r;
}

size_t cmpl_completion_tokens(const srv_req *r)
{
    size_t n = 0;
    for (size_t i = 0; r->cmpl != NULL && i < r->cmpl->nchoices; i++)
        n += r->cmpl->choices[i].tokens;
    return n;
}

/* Cancels every live choice of r (their DONE events follow, some at once). */
static void cmpl_cancel_all(srv_req *r)
{
    for (size_t i = 0; i < r->cmpl->nchoices; i++)
        if (r->cmpl->choices[i].live)
            eng_sched_cancel(r->cmpl->ckpt->sched, r->cmpl->choices[i].id);
}

void cmpl_cancel_for(srv_req *r, met_cancel_reason why)
{
    if (r->cmpl->nlive > 0 && !r->cmpl->cancel_counted) {
        r->cmpl->cancel_counted = 1;
        r->cmpl->cancel_why = why;
        if ((unsigned)why < MET_CANCEL_REASONS) r->s->api->met.cancelled[why]++;
    }
    cmpl_cancel_all(r);
}

int cmpl_set_error(srv_req *r, int status, const char *code, const char *fmt, ...)
{
    cmpl_job *j = r->cmpl;
    if (j->error_status != 0) return 0;
    j->error_status = status;
    j->error_code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->error_msg, sizeof j->error_msg, fmt, ap);
    va_end(ap);
    return 1;
}

const char *cmpl_error_type(int status)
{
    return status == 400 ? "invalid_request_error" : "server_error";
}

void cmpl_grow(srv_req *r, size_t bytes)
{
    cmpl_job *j = r->cmpl;
    j->answer_bytes += bytes;
    if (j->answer_bytes > r->s->cfg.max_response_bytes) cmpl_too_large(r);
}

void cmpl_stream_bytes_check(srv_req *r)
{
    if (r->cmpl->sse.over) cmpl_too_large(r);
}

void cmpl_too_large(srv_req *r)
{
    if (r->cmpl->error_status != 0) return;
    cmpl_set_error(r, 400, "response_too_large",
                   "The answer grew past %zu bytes (max_response_bytes) and was ended; ask for "
                   "less: fewer prompts, a smaller `n`, `best_of`, `max_tokens` or `logprobs`, "
                   "or no `echo`",
                   r->s->cfg.max_response_bytes);
    log_line("info", "%s: the answer passed max_response_bytes (%zu); ended", r->id,
             r->s->cfg.max_response_bytes);
    cmpl_cancel_for(r, MET_CANCEL_RESPONSE_BYTES);
}

void cmpl_fail_oom(srv_req *r)
{
    if (cmpl_set_error(r, 500, NULL, "out of memory while building the response"))
        cmpl_cancel_all(r);
}

/* ---- The hooks on the request (srv_req_ops) -------------------------------- */

/* The connection ended: out of the tokenizer's wait list, and every live
 * sequence cancelled (each DONE releases that sequence's reference). Work
 * still live means its client left (a stream's disconnect is seen here). */
static void job_closed(srv_req *r)
{
    tok_closed(r);
    cmpl_cancel_for(r, MET_CANCEL_CLIENT_CLOSED);
}

static void job_usage(const srv_req *r, size_t *prompt, size_t *completion)
{
    *prompt = tok_prompt_tokens(r);
    *completion = cmpl_completion_tokens(r);
}

static void job_free(srv_req *r)
{
    cmpl_job *j = r->cmpl;
    list_remove(r);
    if (j->shape != NULL && j->shape->free != NULL) j->shape->free(r);
    for (size_t i = 0; i < j->nchoices; i++) {
        stop_free(j->choices[i].stop);
        free(j->choices[i].text);
        json_decref(j->choices[i].lp);
        free(j->choices[i].lpe);
        free(j->choices[i].embedding);
    }
    free(j->choices);
    gram_unref(j->grammar);
    eng_adapter_free(j->adapter);
    free(j->ans.order);
    free(j->ans.usage);
    free(j->ans.buf);
    oai_request_free(&j->oreq);
    sse_free(&j->sse);
    free(j);
    r->cmpl = NULL;
    tok_job_free(r->tok);
    r->tok = NULL;
}

static const srv_req_ops cmpl_ops = {.closed = job_closed, .usage = job_usage, .free = job_free};

cmpl_job *cmpl_job_new(srv_req *r)
{
    r->cmpl = calloc(1, sizeof *r->cmpl);
    if (r->cmpl == NULL || tok_job_new(r) == NULL) {
        free(r->cmpl);
        r->cmpl = NULL;
        return NULL;
    }
    r->ops = &cmpl_ops;
    r->cmpl->ckpt = &r->s->api->ckpt[0]; /* until its `model` picks one */
    return r->cmpl;
}
