/*
 * tests/fuzz/fuzz_oai.c: libFuzzer target for the completions request
 * parser. Any body gives either a request or a 400 with a message and an
 * error body that is valid JSON; nothing leaks, nothing crashes.
 */
#include "oai.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const oai_limits lim = {.vocab_size = 50257,
                                   .max_tokens_limit = 1024,
                                   .max_n = 8,
                                   .max_stop_bytes = 64,
                                   .max_prompts = 16};
    oai_request r;
    oai_error e;
    if (oai_parse_completion((const char *)data, size, &lim, &r, &e) == 0) {
        if (r.model == NULL || r.nprompts == 0 || r.n < 1 || r.best_of < r.n) __builtin_trap();
        oai_request_free(&r);
        return 0;
    }
    if (e.status != 400 || e.message[0] == '\0') __builtin_trap();
    char *js = oai_error_json(&e);
    json_t *j = js ? json_loads(js, 0, NULL) : NULL;
    if (j == NULL) __builtin_trap();
    json_decref(j);
    free(js);
    return 0;
}
