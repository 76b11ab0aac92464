/*
 * tests/fuzz/fuzz_oai.c: libFuzzer target for the request parsers:
 * completions, chat through the default template, and Responses (its
 * messages rendered as the route renders them). Any body gives either
 * a request or a 400 with a message and an error body that is valid JSON;
 * nothing leaks, nothing crashes.
 */
#include "oai.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_error(const oai_error *e)
{
    if (e->status != 400 || e->message[0] == '\0') __builtin_trap();
    char *js = oai_error_json(e);
    json_t *j = js ? json_loads(js, 0, NULL) : NULL;
    if (j == NULL) __builtin_trap();
    json_decref(j);
    free(js);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const oai_limits lim = {.vocab_size = 50257,
                                   .max_tokens_limit = 1024,
                                   .max_n = 8,
                                   .max_stop_bytes = 64,
                                   .max_prompts = 16,
                                   .chat_max_tokens = 256};
    static oai_template tmpl;
    static int have_tmpl;
    if (!have_tmpl) {
        if (oai_template_default(&tmpl) != 0) __builtin_trap();
        have_tmpl = 1; /* kept for the process, as the server keeps it */
    }
    oai_request r;
    oai_error e;
    if (oai_parse_completion((const char *)data, size, &lim, &r, &e) == 0) {
        if (r.nprompts == 0 || r.n < 1 || r.best_of < r.n || r.chat) __builtin_trap();
        oai_request_free(&r);
    } else {
        check_error(&e);
    }
    if (oai_parse_chat((const char *)data, size, &lim, &tmpl, &r, &e) == 0) {
        if (!r.chat || r.nprompts != 1 || r.prompts[0].text == NULL || r.nstop > OAI_STOP_CAP
            || r.max_tokens > lim.max_tokens_limit || r.best_of != r.n
            || strlen(r.prompts[0].text) > r.prompts[0].text_len)
            __builtin_trap();
        oai_request_free(&r);
    } else {
        check_error(&e);
    }
    oai_resp_request rq;
    if (oai_parse_responses((const char *)data, size, &lim, &tmpl, &rq, &e) == 0) {
        if (!rq.req.chat || rq.nmsgs == 0 || rq.req.n != 1 || rq.req.nprompts != 0
            || rq.req.max_tokens > lim.max_tokens_limit)
            __builtin_trap();
        char *text;
        size_t len;
        if (oai_render(&tmpl, rq.msgs, rq.nmsgs, &text, &len) != 0 || strlen(text) > len)
            __builtin_trap();
        free(text);
        oai_resp_request_free(&rq);
    } else {
        check_error(&e);
    }
    return 0;
}
