/* tests/test_oai.c: the completions, chat and Responses request parsers
 * (server/api/oai.c). */
#include "oai.h"
#include "testutil.h"

#include <check.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const oai_limits lim = {.vocab_size = 50257,
                               .max_tokens_limit = 1024,
                               .max_n = 8,
                               .max_stop_bytes = 64,
                               .max_prompts = 16,
                               .chat_max_tokens = 256};

static oai_request parse_ok(const char *body)
{
    oai_request r;
    oai_error e;
    ck_assert_msg(oai_parse_completion(body, strlen(body), &lim, &r, &e) == 0, "%s: %s", body,
                  e.message);
    return r;
}

START_TEST(oai_parse_defaults)
{
    oai_request r = parse_ok("{\"model\": \"gpt2\", \"prompt\": \"Hello\"}");
    ck_assert_str_eq(r.model, "gpt2");
    ck_assert_uint_eq(r.nprompts, 1);
    ck_assert_str_eq(r.prompts[0].text, "Hello");
    ck_assert_uint_eq(r.max_tokens, 16);
    ck_assert(r.temperature == 1.0 && r.top_p == 1.0);
    ck_assert_uint_eq(r.n, 1);
    ck_assert_uint_eq(r.best_of, 1);
    ck_assert_int_eq(r.logprobs, -1);
    ck_assert(!r.stream && !r.echo && !r.has_seed);
    oai_request_free(&r);
    /* No prompt: the spec's default, <|endoftext|>. */
    r = parse_ok("{\"model\": \"gpt2\"}");
    ck_assert_str_eq(r.prompts[0].text, "<|endoftext|>");
    oai_request_free(&r);
    /* max_tokens 0 is valid (echo + logprobs scores a text). */
    r = parse_ok("{\"model\": \"gpt2\", \"max_tokens\": 0, \"echo\": true, \"logprobs\": 0}");
    ck_assert_uint_eq(r.max_tokens, 0);
    oai_request_free(&r);
}
END_TEST

START_TEST(oai_parse_every_prompt_shape)
{
    oai_request r = parse_ok("{\"model\":\"m\",\"prompt\":[\"a\",\"b\\u0000c\"]}");
    ck_assert_uint_eq(r.nprompts, 2);
    ck_assert_uint_eq(r.prompts[1].text_len, 3); /* NUL kept */
    oai_request_free(&r);
    r = parse_ok("{\"model\":\"m\",\"prompt\":[15496, 11, 50256]}");
    ck_assert_uint_eq(r.nprompts, 1);
    ck_assert_uint_eq(r.prompts[0].nids, 3);
    ck_assert_int_eq(r.prompts[0].ids[2], 50256);
    oai_request_free(&r);
    r = parse_ok("{\"model\":\"m\",\"prompt\":[[1,2],[3]]}");
    ck_assert_uint_eq(r.nprompts, 2);
    ck_assert_uint_eq(r.prompts[1].nids, 1);
    oai_request_free(&r);
}
END_TEST

START_TEST(oai_parse_every_field)
{
    oai_request r = parse_ok(
        "{\"model\":\"m\",\"prompt\":\"x\",\"max_tokens\":5,\"temperature\":0,\"top_p\":0.5,"
        "\"top_k\":40,\"n\":2,\"best_of\":3,\"stop\":[\"\\n\\n\",\"END\",\"\"],"
        "\"presence_penalty\":-2,\"frequency_penalty\":1.5,\"logit_bias\":{\"50256\":-100,"
        "\"11\":2.5},\"seed\":-7,\"logprobs\":5,\"echo\":true,\"user\":\"u\","
        "\"ignore_eos\":true,\"timeout\":30,\"unknown_field\":{\"ignored\":1}}");
    ck_assert_uint_eq(r.max_tokens, 5);
    ck_assert(r.temperature == 0 && r.top_p == 0.5);
    ck_assert_int_eq(r.top_k, 40);
    ck_assert_uint_eq(r.n, 2);
    ck_assert_uint_eq(r.best_of, 3);
    ck_assert_uint_eq(r.nstop, 2); /* the empty one is dropped */
    ck_assert_str_eq(r.stop[1], "END");
    ck_assert(r.presence_penalty == -2 && r.frequency_penalty == 1.5);
    ck_assert_uint_eq(r.nbias, 2);
    ck_assert(r.has_seed && r.seed == (uint64_t)-7);
    ck_assert_int_eq(r.logprobs, 5);
    ck_assert(r.echo && r.ignore_eos && r.timeout_s == 30);
    oai_request_free(&r);
    r = parse_ok("{\"model\":\"m\",\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                 "\"stop\":\"\\n\"}");
    ck_assert(r.stream && r.include_usage);
    ck_assert_uint_eq(r.nstop, 1);
    oai_request_free(&r);
}
END_TEST

static const struct {
    const char *body, *param, *words;
} bad[] = {
    {"not json", "", "not valid JSON"},
    {"[1]", "", "must be a JSON object"},
    {"{\"model\":5}", "model", "'model' must be a string, got an integer"},
    {"{\"model\":\"gpt2\\u0000evil\"}", "model", "must not contain a NUL"},
    {"{\"model\":\"m\",\"suffix\":\"x\"}", "suffix", "not supported"},
    {"{\"model\":\"m\",\"prompt\":5}", "prompt", "got an integer"},
    {"{\"model\":\"m\",\"prompt\":[]}", "prompt", "empty list"},
    {"{\"model\":\"m\",\"prompt\":[[]]}", "prompt", "empty list of tokens"},
    {"{\"model\":\"m\",\"prompt\":[50257]}", "prompt", "token id from 0 to 50256"},
    {"{\"model\":\"m\",\"prompt\":[1,\"a\"]}", "prompt", "a string where a token id"},
    {"{\"model\":\"m\",\"prompt\":[\"a\",[1]]}", "prompt", "mixes kinds"},
    {"{\"model\":\"m\",\"max_tokens\":-1}", "max_tokens", "from 0 to 1024, got -1"},
    {"{\"model\":\"m\",\"max_tokens\":5000}", "max_tokens", "got 5000"},
    {"{\"model\":\"m\",\"max_tokens\":\"5\"}", "max_tokens", "got a string"},
    {"{\"model\":\"m\",\"max_tokens\":5.5}", "max_tokens", "got a number"},
    {"{\"model\":\"m\",\"temperature\":2.5}", "temperature", "from 0 to 2, got 2.5"},
    {"{\"model\":\"m\",\"temperature\":true}", "temperature", "got a boolean"},
    {"{\"model\":\"m\",\"top_p\":0}", "top_p", "above 0"},
    {"{\"model\":\"m\",\"top_p\":1.5}", "top_p", "got 1.5"},
    {"{\"model\":\"m\",\"n\":0}", "n", "from 1 to 8"},
    {"{\"model\":\"m\",\"n\":9}", "n", "got 9"},
    {"{\"model\":\"m\",\"n\":3,\"best_of\":2}", "best_of", "at least 'n'"},
    {"{\"model\":\"m\",\"best_of\":2,\"stream\":true}", "best_of", "cannot be used with 'stream'"},
    {"{\"model\":\"m\",\"stream\":\"yes\"}", "stream", "must be a boolean"},
    {"{\"model\":\"m\",\"stream_options\":{\"include_usage\":true}}", "stream_options",
     "only allowed when 'stream' is true"},
    {"{\"model\":\"m\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}",
     "stream_options.include_usage", "must be a boolean"},
    {"{\"model\":\"m\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop", "at most 4"},
    {"{\"model\":\"m\",\"stop\":[1]}", "stop", "must be strings"},
    {"{\"model\":\"m\",\"stop\":5}", "stop", "a string or a list"},
    {"{\"model\":\"m\",\"presence_penalty\":-3}", "presence_penalty", "from -2 to 2"},
    {"{\"model\":\"m\",\"frequency_penalty\":2.01}", "frequency_penalty", "from -2 to 2"},
    {"{\"model\":\"m\",\"logit_bias\":{\"abc\":1}}", "logit_bias", "is not a token id"},
    /* Token ids in canonical decimal only: no space, sign or leading zero. */
    {"{\"model\":\"m\",\"logit_bias\":{\" 5\":1}}", "logit_bias", "is not a token id"},
    {"{\"model\":\"m\",\"logit_bias\":{\"+5\":1}}", "logit_bias", "is not a token id"},
    {"{\"model\":\"m\",\"logit_bias\":{\"-0\":1}}", "logit_bias", "is not a token id"},
    {"{\"model\":\"m\",\"logit_bias\":{\"05\":1}}", "logit_bias", "is not a token id"},
    {"{\"model\":\"m\",\"logit_bias\":{\"5 \":1}}", "logit_bias", "is not a token id"},
    {"{\"model\":\"m\",\"logit_bias\":{\"\":1}}", "logit_bias", "is not a token id"},
    {"{\"model\":\"m\",\"logit_bias\":{\"50257\":1}}", "logit_bias", "is not a token id"},
    {"{\"model\":\"m\",\"logit_bias\":{\"5\":101}}", "logit_bias", "from -100 to 100"},
    {"{\"model\":\"m\",\"logit_bias\":[1]}", "logit_bias", "must be an object"},
    {"{\"model\":\"m\",\"seed\":1.5}", "seed", "must be an integer"},
    {"{\"model\":\"m\",\"logprobs\":6}", "logprobs", "from 0 to 5, got 6"},
    {"{\"model\":\"m\",\"echo\":1}", "echo", "must be a boolean"},
    {"{\"model\":\"m\",\"user\":5}", "user", "must be a string"},
    {"{\"model\":\"m\",\"timeout\":-1}", "timeout", "from 0 to 86400"},
    {"{\"model\":\"m\",\"model\":\"n\"}", "", "not valid JSON"},
};

START_TEST(oai_parse_bad_requests_name_the_parameter)
{
    oai_request r;
    oai_error e;
    const char *body = bad[_i].body;
    ck_assert_int_eq(oai_parse_completion(body, strlen(body), &lim, &r, &e), -1);
    ck_assert_int_eq(e.status, 400);
    ck_assert_str_eq(e.type, "invalid_request_error");
    ck_assert_msg(strcmp(e.param, bad[_i].param) == 0, "%s: param '%s', want '%s'", body, e.param,
                  bad[_i].param);
    ck_assert_msg(strstr(e.message, bad[_i].words) != NULL, "%s: '%s' lacks '%s'", body, e.message,
                  bad[_i].words);
    ck_assert_ptr_null(r.model);
    ck_assert_ptr_null(r.prompts);
    /* The error body has OpenAI's shape, all four keys present. */
    char *js = oai_error_json(&e);
    json_t *j = json_loads(js, 0, NULL);
    ck_assert_ptr_nonnull(j);
    json_t *inner = json_object_get(j, "error");
    ck_assert(json_is_string(json_object_get(inner, "message")));
    ck_assert(json_is_string(json_object_get(inner, "type")));
    ck_assert_ptr_nonnull(json_object_get(inner, "param"));
    ck_assert_ptr_nonnull(json_object_get(inner, "code"));
    ck_assert(e.param[0] ? json_is_string(json_object_get(inner, "param"))
                         : json_is_null(json_object_get(inner, "param")));
    json_decref(j);
    free(js);
}
END_TEST

START_TEST(oai_parse_hostile_bodies_fail_cleanly)
{
    /* Deep nesting, huge arrays of prompts, odd bytes. */
    size_t depth = 50000;
    char *deep = malloc(depth * 2 + 64);
    size_t n = (size_t)snprintf(deep, 64, "{\"model\":\"m\",\"prompt\":");
    for (size_t i = 0; i < depth; i++) deep[n++] = '[';
    for (size_t i = 0; i < depth; i++) deep[n++] = ']';
    deep[n++] = '}';
    oai_request r;
    oai_error e;
    ck_assert_int_eq(oai_parse_completion(deep, n, &lim, &r, &e), -1);
    free(deep);
    const char many[] = "{\"model\":\"m\",\"prompt\":[\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\","
                        "\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\"]}";
    ck_assert_int_eq(oai_parse_completion(many, sizeof many - 1, &lim, &r, &e), -1);
    ck_assert_ptr_nonnull(strstr(e.message, "limit is 16"));
    const char bytes[] = "{\"model\":\"m\",\"prompt\":\"\xff\xfe\"}";
    ck_assert_int_eq(oai_parse_completion(bytes, sizeof bytes - 1, &lim, &r, &e), -1);
    ck_assert_int_eq(oai_parse_completion("", 0, &lim, &r, &e), -1);
    /* Found by fuzz_oai: jansson quotes the invalid bytes in its message;
     * the error body must still be valid JSON. */
    static const char quoted[] = "{\"model\":\"\",\"p\":[\"\\\xdd\x8a\x8c\x9a\x91\"\0\0\0:3}";
    ck_assert_int_eq(oai_parse_completion(quoted, sizeof quoted - 1, &lim, &r, &e), -1);
    char *js = oai_error_json(&e);
    ck_assert_ptr_nonnull(js);
    json_t *j = json_loads(js, 0, NULL);
    ck_assert_ptr_nonnull(j);
    json_decref(j);
    free(js);
}
END_TEST

START_TEST(oai_parse_model_is_optional)
{
    oai_request r = parse_ok("{\"prompt\": \"Hello\"}");
    ck_assert_ptr_null(r.model);
    oai_request_free(&r);
    r = parse_ok("{\"model\": null, \"prompt\": \"Hello\"}");
    ck_assert_ptr_null(r.model);
    oai_request_free(&r);
}
END_TEST

/* ---- chat ---- */

static oai_request chat_ok(const oai_template *t, const char *body)
{
    oai_request r;
    oai_error e;
    ck_assert_msg(oai_parse_chat(body, strlen(body), &lim, t, &r, &e) == 0, "%s: %s", body,
                  e.message);
    ck_assert_int_eq(r.chat, 1);
    return r;
}

START_TEST(oai_parse_chat_renders_the_default_transcript)
{
    oai_template t;
    ck_assert_int_eq(oai_template_default(&t), 0);
    oai_request r =
        chat_ok(&t, "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
                    "{\"role\": \"user\", \"content\": \"Hi\"},"
                    "{\"role\": \"assistant\", \"content\": \"Hello.\"},"
                    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\":"
                    " \"How are \"}, {\"type\": \"text\", \"text\": \"you?\"}]}]}");
    ck_assert_uint_eq(r.nprompts, 1);
    ck_assert_str_eq(r.prompts[0].text, "Be brief.\n\nUser: Hi\n\nAssistant: Hello.\n\n"
                                        "User: How are you?\n\nAssistant:");
    ck_assert_uint_eq(r.prompts[0].text_len, strlen(r.prompts[0].text));
    /* The next turn's marker is the implicit stop, not a blank line (an
     * empty first line must not end the reply, issue 35); no max_tokens:
     * the context. */
    ck_assert_uint_eq(r.nstop, 4);
    ck_assert_str_eq(r.stop[0], "\n\nUser:");
    ck_assert_str_eq(r.stop[1], "\nUser:");
    ck_assert_str_eq(r.stop[2], "\n\nAssistant:");
    ck_assert_str_eq(r.stop[3], "\nAssistant:");
    ck_assert_int_eq(r.max_tokens_auto, 1);
    ck_assert_int_eq(r.max_completion, 0);
    ck_assert_uint_eq(r.max_tokens, lim.chat_max_tokens); /* not the whole context */
    ck_assert_int_eq(r.logprobs, -1);
    ck_assert_ptr_null(r.model);
    oai_request_free(&r);
    oai_template_free(&t);
}
END_TEST

START_TEST(oai_parse_chat_every_field)
{
    oai_template t;
    ck_assert_int_eq(oai_template_default(&t), 0);
    oai_request r = chat_ok(
        &t, "{\"model\": \"gpt2\", \"messages\": [{\"role\": \"developer\", \"content\": \"x\"}],"
            "\"max_completion_tokens\": 7, \"max_tokens\": 3, \"n\": 2, \"stop\": [\"END\"],"
            "\"stream\": true, \"stream_options\": {\"include_usage\": true},"
            "\"temperature\": 0.5, \"top_p\": 0.9, \"seed\": 4, \"logprobs\": true,"
            "\"top_logprobs\": 3, \"logit_bias\": {\"11\": 1}, \"response_format\": {\"type\":"
            " \"text\"}, \"tools\": [], \"tool_choice\": \"none\", \"function_call\": \"none\", "
            "\"user\": \"u\"}");
    ck_assert_str_eq(r.model, "gpt2");
    ck_assert_str_eq(r.prompts[0].text, "x\n\nAssistant:"); /* developer is system */
    ck_assert_uint_eq(r.max_tokens, 7);                     /* the current name wins */
    ck_assert_int_eq(r.max_tokens_auto, 0);
    ck_assert_int_eq(r.max_completion, 1);
    ck_assert_uint_eq(r.n, 2);
    ck_assert_uint_eq(r.best_of, 2);
    ck_assert_uint_eq(r.nstop, 5); /* the request's, then the template's */
    ck_assert_str_eq(r.stop[0], "END");
    ck_assert(r.stream && r.include_usage && r.has_seed && r.seed == 4);
    ck_assert_int_eq(r.logprobs, 3);
    ck_assert_uint_eq(r.nbias, 1);
    oai_request_free(&r);
    r = chat_ok(&t, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 0,"
                    " \"logprobs\": true}");
    ck_assert_uint_eq(r.max_tokens, 0);
    ck_assert_int_eq(r.logprobs, 0);
    oai_request_free(&r);
    oai_template_free(&t);
}
END_TEST

static const struct {
    const char *body, *param, *message;
} chat_bad[] = {
    {"{}", "messages", "'messages' is required"},
    {"{\"messages\": []}", "messages", "non-empty list, got an empty list"},
    {"{\"messages\": \"hi\"}", "messages", "got a string"},
    {"{\"messages\": [5]}", "messages", "'messages[0]' must be an object"},
    {"{\"messages\": [{\"content\": \"x\"}]}", "messages", "'messages[0].role' must be"},
    {"{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", "messages",
     "user, assistant and tool messages"},
    {"{\"messages\": [{\"role\": \"user\"}]}", "messages", "content' is required"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages", "got an integer"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", "messages",
     "'image_url' part; GPT-2 reads only text"},
    {"{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": [{}]}]}",
     "messages", "'messages[0].tool_calls[0]' must be"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": [{}]}]}", "messages",
     "belongs to an assistant message"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
     "\"function\"}]}",
     "tools", "'tools[0].function.name' must be"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
     "\"web_search\"}]}",
     "tools", "this server calls only function tools"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": {}}", "tools",
     "'tools' must be a list"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
     "\"function\", \"function\": {\"name\": \"a b\"}}]}",
     "tools", "'tools[0].function.name' must be"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
     "\"function\", \"function\": {\"name\": \"f\"}}, {\"type\": \"function\", \"function\": "
     "{\"name\": \"f\"}}]}",
     "tools", "given twice"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
     "\"function\", \"function\": {\"name\": \"f\", \"parameters\": 5}}]}",
     "tools", "must be a JSON Schema object"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"required\"}",
     "tool_choice", "'tools' is empty"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"always\"}",
     "tool_choice", "must be \"none\", \"auto\", \"required\""},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
     "\"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": \"function\", "
     "\"function\": {\"name\": \"g\"}}}",
     "tool_choice", "not in 'tools'"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
     "\"function\", \"function\": {\"name\": \"f\"}}], \"response_format\": {\"type\": "
     "\"json_object\"}}",
     "response_format", "cannot be combined with 'tools'"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
     "\"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": \"required\", \"stop\": "
     "\"}\"}",
     "stop", "could cut a call short"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
     "\"function\", \"function\": {\"name\": \"f\"}}], \"stop\": \"a\"}",
     "stop", "could cut a call short"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"parallel_tool_calls\": 1}",
     "parallel_tool_calls", "must be a boolean"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"functions\": [{}]}", "functions",
     "old form of 'tools'"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"function_call\": \"sometimes\"}",
     "function_call", "'function_call' must be"},
    {"{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\", \"function_call\": {}}]}",
     "messages", "'messages[0].function_call' is the old form"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": "
     "\"xml\"}}",
     "response_format", "type 'xml' is not supported"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": "
     "\"json_schema\", \"json_schema\": {\"name\": \"a\"}}}",
     "response_format.json_schema", "'response_format.json_schema.schema' must be"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": "
     "\"json_object\"}, \"guided_regex\": \"a\"}",
     "guided_regex", "cannot be combined with 'response_format'"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"guided_choice\": [\"a\", 1]}",
     "guided_choice", "entry 1 is not a string"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"guided_regex\": \"a\", "
     "\"stop\": \"x\"}",
     "stop", "cannot be combined with 'guided_regex'"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"guided_regex\": \"a\", "
     "\"ignore_eos\": true}",
     "ignore_eos", "cannot be combined"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 7, "
     "\"logprobs\": true}",
     "top_logprobs", "at most 5"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}",
     "top_logprobs", "needs 'logprobs': true"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_completion_tokens\": "
     "5000}",
     "max_completion_tokens", "got 5000"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_completion_tokens\": 3, "
     "\"max_tokens\": \"junk\"}",
     "max_tokens", "got a string"},
    {"{\"messages\": [{\"role\": \"user\\u0000x\", \"content\": \"x\"}]}", "messages",
     "user, assistant and tool messages"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\\u0000z\", \"text\": "
     "\"x\"}]}]}",
     "messages", "GPT-2 reads only text"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": 3}",
     "temperature", "got 3"},
};

START_TEST(oai_parse_chat_bad_requests_name_the_parameter)
{
    oai_template t;
    ck_assert_int_eq(oai_template_default(&t), 0);
    oai_request r;
    oai_error e;
    const char *body = chat_bad[_i].body;
    ck_assert_int_eq(oai_parse_chat(body, strlen(body), &lim, &t, &r, &e), -1);
    ck_assert_int_eq(e.status, 400);
    ck_assert_str_eq(e.param, chat_bad[_i].param);
    ck_assert_msg(strstr(e.message, chat_bad[_i].message) != NULL, "%s: %s", body, e.message);
    oai_template_free(&t);
}
END_TEST

/* cache_salt (issue 24): a string of 1..OAI_MAX_CACHE_SALT bytes on both
 * generating routes, kept with its length; anything else is a 400 naming
 * it. */
START_TEST(oai_parse_cache_salt_on_both_routes)
{
    oai_template t;
    ck_assert_int_eq(oai_template_default(&t), 0);
    oai_request r = parse_ok("{\"prompt\":\"x\",\"cache_salt\":\"tenant-a\"}");
    ck_assert_uint_eq(r.cache_salt_len, 8);
    ck_assert_mem_eq(r.cache_salt, "tenant-a", 8);
    oai_request_free(&r);
    r = parse_ok("{\"prompt\":\"x\",\"cache_salt\":\"a\\u0000b\"}"); /* a NUL is a byte */
    ck_assert_uint_eq(r.cache_salt_len, 3);
    ck_assert_mem_eq(r.cache_salt, "a\0b", 3);
    oai_request_free(&r);
    r = parse_ok("{\"prompt\":\"x\",\"cache_salt\":null}");
    ck_assert_ptr_null(r.cache_salt);
    oai_request_free(&r);
    r = parse_ok("{\"prompt\":\"x\"}");
    ck_assert_ptr_null(r.cache_salt);
    ck_assert_uint_eq(r.cache_salt_len, 0);
    oai_request_free(&r);
    r = chat_ok(&t,
                "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"cache_salt\":\"u-1\"}");
    ck_assert_uint_eq(r.cache_salt_len, 3);
    ck_assert_mem_eq(r.cache_salt, "u-1", 3);
    oai_request_free(&r);
    /* The cap: OAI_MAX_CACHE_SALT bytes pass, one more does not. */
    static char body[OAI_MAX_CACHE_SALT + 128];
    for (int over = 0; over <= 1; over++) {
        size_t n = OAI_MAX_CACHE_SALT + (size_t)over;
        int w =
            snprintf(body, sizeof body, "{\"prompt\":\"x\",\"cache_salt\":\"%0*d\"}", (int)n, 0);
        ck_assert(w > 0 && (size_t)w < sizeof body);
        oai_error e;
        int rc = oai_parse_completion(body, (size_t)w, &lim, &r, &e);
        if (!over) {
            ck_assert_int_eq(rc, 0);
            ck_assert_uint_eq(r.cache_salt_len, OAI_MAX_CACHE_SALT);
            oai_request_free(&r);
        } else {
            ck_assert_int_eq(rc, -1);
            ck_assert_str_eq(e.param, "cache_salt");
            ck_assert_msg(strstr(e.message, "1 to 256 bytes, got 257") != NULL, "%s", e.message);
        }
    }
    static const char *const wrong[] = {"5", "true", "[\"a\"]", "{\"a\":1}", "\"\"", "1.5"};
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++)
        for (int chat = 0; chat <= 1; chat++) {
            snprintf(body, sizeof body, "{%s,\"cache_salt\":%s}",
                     chat ? "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
                          : "\"prompt\":\"x\"",
                     wrong[i]);
            oai_error e;
            int rc = chat ? oai_parse_chat(body, strlen(body), &lim, &t, &r, &e)
                          : oai_parse_completion(body, strlen(body), &lim, &r, &e);
            ck_assert_msg(rc == -1, "%s was taken", body);
            ck_assert_int_eq(e.status, 400);
            ck_assert_str_eq(e.type, "invalid_request_error");
            ck_assert_msg(strcmp(e.param, "cache_salt") == 0, "%s: param '%s'", body, e.param);
            ck_assert_msg(strstr(e.message, "'cache_salt' must be") != NULL, "%s: %s", body,
                          e.message);
        }
    oai_template_free(&t);
}
END_TEST

static char tpath[64];

static void write_template_n(const char *text, size_t n)
{
    mkdtemp_template(tpath, sizeof tpath, "/tmp/gpt2d-test-tmpl-");
    int fd = mkstemp(tpath);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(text, 1, n, f), n);
    fclose(f);
}

static void write_template(const char *text)
{
    write_template_n(text, strlen(text));
}

/* Structured outputs: response_format on both routes (an extension on
 * completions), guided_choice and guided_regex; the chat template's stop
 * strings left out; the Responses API's flat text.format read by the same
 * function. */
START_TEST(oai_parse_formats_on_both_routes)
{
    oai_template t;
    ck_assert_int_eq(oai_template_default(&t), 0);
    oai_request r = chat_ok(&t, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                                "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
                                "{\"name\": \"p\", \"strict\": true, \"schema\": {\"type\": "
                                "\"object\", \"properties\": {\"b\": {}, \"a\": {}}}}}}");
    ck_assert_int_eq(r.format, OAI_FORMAT_SCHEMA);
    /* compact, properties in the order written */
    ck_assert_str_eq(r.format_src, "{\"type\":\"object\",\"properties\":{\"b\":{},\"a\":{}}}");
    ck_assert_uint_eq(r.format_len, strlen(r.format_src));
    ck_assert_uint_eq(r.nstop, 0); /* the template's turn separator is not a stop here */
    oai_request_free(&r);
    oai_template_free(&t);
    oai_error e;
    const char *b1 = "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_object\"}}";
    ck_assert_int_eq(oai_parse_completion(b1, strlen(b1), &lim, &r, &e), 0);
    ck_assert_int_eq(r.format, OAI_FORMAT_JSON_OBJECT);
    oai_request_free(&r);
    const char *b2 = "{\"prompt\": \"x\", \"guided_choice\": [\"yes\", \"n\\u00f6\"]}";
    ck_assert_int_eq(oai_parse_completion(b2, strlen(b2), &lim, &r, &e), 0);
    ck_assert_int_eq(r.format, OAI_FORMAT_CHOICE);
    ck_assert_str_eq(r.format_src, "[\"yes\",\"n\xc3\xb6\"]");
    oai_request_free(&r);
    const char *b3 = "{\"prompt\": \"x\", \"guided_regex\": \"[0-9]+\"}";
    ck_assert_int_eq(oai_parse_completion(b3, strlen(b3), &lim, &r, &e), 0);
    ck_assert_int_eq(r.format, OAI_FORMAT_REGEX);
    ck_assert_str_eq(r.format_src, "[0-9]+");
    ck_assert_str_eq(r.format_param, "guided_regex");
    oai_request_free(&r);
    /* The Responses API's text.format: the fields beside "type". */
    json_t *f = json_loads("{\"type\": \"json_schema\", \"name\": \"n\", \"schema\": {\"type\": "
                           "\"integer\"}}",
                           0, NULL);
    oai_request q;
    memset(&q, 0, sizeof q);
    q.format = OAI_FORMAT_NONE;
    ck_assert_int_eq(oai_parse_format(f, "text.format", &q, &e), 0);
    ck_assert_int_eq(q.format, OAI_FORMAT_SCHEMA);
    ck_assert_str_eq(q.format_src, "{\"type\":\"integer\"}");
    ck_assert_str_eq(q.format_param, "text.format.schema");
    oai_request_free(&q);
    json_decref(f);
}
END_TEST

START_TEST(oai_template_load_reads_a_file)
{
    write_template("# ChatML-like, for a fine-tuned checkpoint\n"
                   "begin = \"<|endoftext|>\"\n"
                   "system = \"<|im_start|>system\\n{content}<|im_end|>\\n\"\n"
                   "user = \"<|im_start|>user\\n{content}<|im_end|>\\n\"\n"
                   "assistant = \"<|im_start|>assistant\\n{content}<|im_end|>\\n\"\n"
                   "generation = \"<|im_start|>assistant\\n\"\n"
                   "stop = \"<|im_end|>\"\n"
                   "trim_reply = false\n");
    oai_template t;
    char err[256];
    ck_assert_msg(oai_template_load(tpath, &t, err, sizeof err) == 0, "%s", err);
    unlink(tpath);
    ck_assert_int_eq(t.trim_reply, 0);
    oai_request r =
        chat_ok(&t, "{\"messages\": [{\"role\": \"user\", \"content\": \"Say \\\"hi\\\"\"}],"
                    "\"stop\": \"X\"}");
    ck_assert_str_eq(r.prompts[0].text, "<|endoftext|><|im_start|>user\nSay \"hi\"<|im_end|>\n"
                                        "<|im_start|>assistant\n");
    ck_assert_uint_eq(r.nstop, 2);
    ck_assert_str_eq(r.stop[1], "<|im_end|>");
    oai_request_free(&r);
    oai_template_free(&t);
}
END_TEST

static const struct {
    const char *text, *message;
    size_t len; /* 0: strlen(text) */
} tmpl_bad[] = {
    {"user = \"{content}\"\n", "needs system, user, assistant and generation", 0},
    {"user = \"no placeholder\"\n", ":1: user must hold {content} exactly once", 0},
    {"\nuser = \"{content}{content}\"\n", ":2: user must hold {content} exactly once", 0},
    {"user = {content}\n", ":1: user: the value must be a double-quoted string", 0},
    {"user = \"a\\qb\"\n", ":1: user: unknown escape", 0},
    {"colour = \"x\"\n", ":1: unknown key 'colour'", 0},
    {"user\n", ":1: expected key = \"value\"", 0},
    {"stop = \"\"\n", ":1: a stop string must be 1 to 256 bytes", 0},
    {"stop = \"a\"\nstop = \"b\"\nstop = \"c\"\nstop = \"d\"\nstop = \"e\"\n",
     ":5: more than 4 stop strings", 0},
    {"trim_reply = maybe\n", ":1: trim_reply must be true or false", 0},
    {"# a comment\nuser = \"{content}\0\"\n", ":2: the line holds a NUL byte",
     sizeof "# a comment\nuser = \"{content}\0\"\n" - 1},
};

START_TEST(oai_template_load_errors_name_the_line)
{
    write_template_n(tmpl_bad[_i].text,
                     tmpl_bad[_i].len ? tmpl_bad[_i].len : strlen(tmpl_bad[_i].text));
    oai_template t;
    char err[256];
    ck_assert_int_eq(oai_template_load(tpath, &t, err, sizeof err), -1);
    unlink(tpath);
    ck_assert_msg(strstr(err, tmpl_bad[_i].message) != NULL, "%s", err);
    ck_assert_ptr_nonnull(strstr(err, tpath));
    ck_assert_ptr_null(t.begin);
    ck_assert_int_eq(oai_template_load("/nonexistent/t", &t, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/t: cannot open"));
}
END_TEST

/* ---- POST /v1/responses ---------------------------------------------------- */

static oai_resp_request resp_ok(const oai_template *t, const char *body)
{
    oai_resp_request rq;
    oai_error e;
    ck_assert_msg(oai_parse_responses(body, strlen(body), &lim, t, &rq, &e) == 0, "%s: %s", body,
                  e.message);
    return rq;
}

/* The input as messages, the instructions first, rendered through the
 * template: the very text a chat request with the same messages gets. */
START_TEST(oai_parse_responses_renders_as_chat)
{
    oai_template t;
    ck_assert_int_eq(oai_template_default(&t), 0);
    oai_resp_request rq = resp_ok(
        &t, "{\"model\": \"gpt2\", \"instructions\": \"Be brief.\", \"input\": ["
            "{\"role\": \"user\", \"content\": \"Hi\"},"
            "{\"type\": \"message\", \"role\": \"assistant\", \"content\": [{\"type\": "
            "\"output_text\", \"text\": \"Hello.\"}]},"
            "{\"role\": \"developer\", \"content\": \"Note.\"},"
            "{\"role\": \"user\", \"content\": [{\"type\": \"input_text\", \"text\": \"How are \"},"
            " {\"type\": \"input_text\", \"text\": \"you?\"}]}],"
            " \"max_output_tokens\": 9, \"store\": false, \"truncation\": \"auto\","
            " \"previous_response_id\": \"resp_1\", \"metadata\": {\"k\": \"v\"}, \"user\": \"u\","
            " \"text\": {\"format\": {\"type\": \"text\"}, \"verbosity\": \"low\"},"
            " \"tool_choice\": \"auto\", \"tools\": [], \"reasoning\": null, \"seed\": 5,"
            " \"include\": [\"message.output_text.logprobs\"], \"top_logprobs\": 3}");
    ck_assert_uint_eq(rq.nmsgs, 4);
    ck_assert_int_eq(rq.msgs[1].role, OAI_ROLE_ASSISTANT);
    ck_assert_int_eq(rq.msgs[2].role, OAI_ROLE_SYSTEM);
    ck_assert_str_eq(rq.msgs[3].text, "How are you?");
    ck_assert_str_eq(rq.instructions, "Be brief.");
    ck_assert_str_eq(rq.previous_id, "resp_1");
    ck_assert_int_eq(rq.store, 0);
    ck_assert_int_eq(rq.truncation_auto, 1);
    ck_assert_str_eq(json_string_value(json_object_get(rq.metadata, "k")), "v");
    ck_assert_str_eq(json_string_value(rq.user), "u");
    ck_assert_uint_eq(rq.req.max_tokens, 9);
    ck_assert_int_eq(rq.req.max_tokens_auto, 0);
    ck_assert_int_eq(rq.req.has_seed, 1);
    ck_assert_int_eq(rq.req.chat, 1);
    ck_assert_uint_eq(rq.req.n, 1);
    ck_assert_uint_eq(rq.req.nstop, 4); /* the template's */
    ck_assert_int_eq(rq.req.logprobs, 3);
    oai_msg all[5] = {
        {.role = OAI_ROLE_SYSTEM, .text = rq.instructions, .len = rq.instructions_len}};
    for (size_t i = 0; i < 4; i++) all[i + 1] = rq.msgs[i];
    char *text;
    size_t len;
    ck_assert_int_eq(oai_render(&t, all, 5, &text, &len), 0);
    const char *want = "Be brief.\n\nUser: Hi\n\nAssistant: Hello.\n\nNote.\n\n"
                       "User: How are you?\n\nAssistant:";
    ck_assert_str_eq(text, want);
    ck_assert_uint_eq(len, strlen(want));
    /* The same conversation on chat: the same prompt. */
    oai_request c =
        chat_ok(&t, "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
                    "{\"role\": \"user\", \"content\": \"Hi\"},"
                    "{\"role\": \"assistant\", \"content\": \"Hello.\"},"
                    "{\"role\": \"system\", \"content\": \"Note.\"},"
                    "{\"role\": \"user\", \"content\": \"How are you?\"}]}");
    ck_assert_str_eq(c.prompts[0].text, text);
    ck_assert_uint_eq(oai_render_len(&t, &rq.msgs[0]), strlen("User: Hi\n\n"));
    free(text);
    oai_request_free(&c);
    oai_resp_request_free(&rq);
    /* A string is one user message; defaults. */
    rq = resp_ok(&t, "{\"input\": \"Hello\"}");
    ck_assert_uint_eq(rq.nmsgs, 1);
    ck_assert_int_eq(rq.msgs[0].role, OAI_ROLE_USER);
    ck_assert_int_eq(rq.store, 1);
    ck_assert_int_eq(rq.truncation_auto, 0);
    ck_assert_int_eq(rq.req.max_tokens_auto, 1);
    ck_assert_uint_eq(rq.req.max_tokens, lim.chat_max_tokens);
    ck_assert_ptr_null(rq.previous_id);
    ck_assert_ptr_null(rq.instructions);
    ck_assert_int_eq(rq.req.logprobs, -1); /* not asked */
    oai_resp_request_free(&rq);
    oai_resp_request_free(NULL);
    oai_template_free(&t);
}
END_TEST

static const struct {
    const char *body, *param, *message;
} resp_bad[] = {
    {"{}", "input", "'input' is required"},
    {"{\"input\": 3}", "input", "must be a string or a list"},
    {"{\"input\": []}", "input", "empty list"},
    {"{\"input\": [\"x\"]}", "input", "'input[0]' must be a message object"},
    {"{\"input\": [{\"role\": \"tool\", \"content\": \"x\"}]}", "input", "'input[0].role'"},
    {"{\"input\": [{\"type\": \"function_call\", \"name\": \"f\"}]}", "input",
     "needs 'name' and 'arguments' strings"},
    {"{\"input\": [{\"type\": \"reasoning\"}]}", "input", "'reasoning' item"},
    {"{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_image\"}]}]}", "input",
     "input_image part: GPT-2 reads only text"},
    {"{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_file\"}]}]}", "input",
     "input_file"},
    {"{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"refusal\", \"refusal\": "
     "\"no\"}]}]}",
     "input", "'refusal' part"},
    {"{\"input\": \"x\", \"tools\": [{\"type\": \"function\"}]}", "tools",
     "'tools[0].function.name' must be"},
    {"{\"input\": \"x\", \"tools\": [{\"type\": \"web_search_preview\"}]}", "tools",
     "only function tools"},
    {"{\"input\": \"x\", \"tool_choice\": \"required\"}", "tool_choice", "'tools' is empty"},
    {"{\"input\": [{\"type\": \"function_call_output\", \"call_id\": \"c\"}]}", "input",
     "needs an 'output' string"},
    {"{\"input\": \"x\", \"reasoning\": {\"effort\": \"low\"}}", "reasoning",
     "not a reasoning model"},
    {"{\"input\": \"x\", \"include\": [\"reasoning.encrypted_content\"]}", "include",
     "can include only"},
    {"{\"input\": \"x\", \"include\": \"message.output_text.logprobs\"}", "include", "a list"},
    {"{\"input\": \"x\", \"top_logprobs\": 6}", "top_logprobs", "at most 5"},
    {"{\"input\": \"x\", \"background\": true}", "background", "foreground"},
    {"{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"json_schema\"}}}", "text.format",
     "must be a JSON Schema"},
    {"{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"yaml\"}}}", "text.format",
     "is not supported"},
    {"{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"json_object\"}}, \"stop\": [\"}\"]}",
     "stop", "cannot be combined"},
    {"{\"input\": \"x\", \"text\": 1}", "text", "must be an object"},
    {"{\"input\": \"x\", \"truncation\": \"half\"}", "truncation", "\"auto\" or \"disabled\""},
    {"{\"input\": \"x\", \"store\": 1}", "store", "must be a boolean"},
    {"{\"input\": \"x\", \"max_output_tokens\": 2000}", "max_output_tokens", "from 0 to 1024"},
    {"{\"input\": \"x\", \"n\": 2}", "n", "one output"},
    {"{\"input\": \"x\", \"instructions\": 1}", "instructions", "must be a string"},
    {"{\"input\": \"x\", \"previous_response_id\": \"\"}", "previous_response_id", "resp_"},
    {"{\"input\": \"x\", \"metadata\": {\"a\": 1}}", "metadata", "strings"},
    {"{\"input\": \"x\", \"messages\": [1]}", "messages", "'input'"},
    {"{\"input\": \"x\", \"temperature\": -1}", "temperature", "from 0 to 2"},
};

START_TEST(oai_parse_responses_bad_requests_name_the_field)
{
    oai_template t;
    ck_assert_int_eq(oai_template_default(&t), 0);
    oai_resp_request rq;
    oai_error e;
    const char *body = resp_bad[_i].body;
    ck_assert_int_eq(oai_parse_responses(body, strlen(body), &lim, &t, &rq, &e), -1);
    ck_assert_int_eq(e.status, 400);
    ck_assert_str_eq(e.param, resp_bad[_i].param);
    ck_assert_msg(strstr(e.message, resp_bad[_i].message) != NULL, "%s: %s", body, e.message);
    ck_assert_ptr_null(rq.msgs); /* nothing left allocated */
    ck_assert_ptr_null(rq.metadata);
    oai_template_free(&t);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("oai");
    TCase *tc = tcase_create("oai_parse_completion");
    tcase_add_test(tc, oai_parse_defaults);
    tcase_add_test(tc, oai_parse_every_prompt_shape);
    tcase_add_test(tc, oai_parse_every_field);
    tcase_add_loop_test(tc, oai_parse_bad_requests_name_the_parameter, 0,
                        (int)(sizeof bad / sizeof bad[0]));
    tcase_add_test(tc, oai_parse_hostile_bodies_fail_cleanly);
    tcase_add_test(tc, oai_parse_model_is_optional);
    suite_add_tcase(s, tc);
    tc = tcase_create("oai_parse_chat");
    tcase_add_test(tc, oai_parse_chat_renders_the_default_transcript);
    tcase_add_test(tc, oai_parse_chat_every_field);
    tcase_add_test(tc, oai_parse_cache_salt_on_both_routes);
    tcase_add_loop_test(tc, oai_parse_chat_bad_requests_name_the_parameter, 0,
                        (int)(sizeof chat_bad / sizeof chat_bad[0]));
    suite_add_tcase(s, tc);
    tc = tcase_create("oai_parse_responses");
    tcase_add_test(tc, oai_parse_responses_renders_as_chat);
    tcase_add_loop_test(tc, oai_parse_responses_bad_requests_name_the_field, 0,
                        (int)(sizeof resp_bad / sizeof resp_bad[0]));
    suite_add_tcase(s, tc);
    tc = tcase_create("oai_template_load");
    tcase_add_test(tc, oai_parse_formats_on_both_routes);
    tcase_add_test(tc, oai_template_load_reads_a_file);
    tcase_add_loop_test(tc, oai_template_load_errors_name_the_line, 0,
                        (int)(sizeof tmpl_bad / sizeof tmpl_bad[0]));
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
