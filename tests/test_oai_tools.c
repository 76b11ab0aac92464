/* tests/test_oai_tools.c: how the chat template writes tools (server/api/
 * chat_template.c's tool keys) on chat and on /v1/responses (oai_chat.c,
 * oai_resp.c): the built-in format, a template file's own, and the file's
 * mistakes. The request parsers' other tests are tests/test_oai.c. */
#include "oai.h"
#include "testutil.h"

#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const oai_limits lim = {.vocab_size = 50257,
                               .max_tokens_limit = 1024,
                               .max_n = 8,
                               .max_stop_bytes = 64,
                               .max_prompts = 16,
                               .chat_max_tokens = 256};

static char tpath[64];

/* A template file of text (the roles ChatML's) into tpath, loaded into t.
 * 0, or -1 with err. */
static int load(const char *text, oai_template *t, char *err, size_t errlen)
{
    static const char roles[] = "system = \"<|im_start|>system\\n{content}<|im_end|>\\n\"\n"
                                "user = \"<|im_start|>user\\n{content}<|im_end|>\\n\"\n"
                                "assistant = \"<|im_start|>assistant\\n{content}<|im_end|>\\n\"\n"
                                "generation = \"<|im_start|>assistant\\n\"\n";
    mkdtemp_template(tpath, sizeof tpath, "/tmp/gpt2d-test-tmpl-");
    int fd = mkstemp(tpath);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    ck_assert_ptr_nonnull(f);
    fputs(roles, f);
    fputs(text, f);
    fclose(f);
    int rc = oai_template_load(tpath, t, err, errlen);
    unlink(tpath);
    return rc;
}

static oai_request chat_ok(const oai_template *t, const char *body)
{
    oai_request r;
    oai_error e;
    ck_assert_msg(oai_parse_chat(body, strlen(body), &lim, t, &r, &e) == 0, "%s: %s", body,
                  e.message);
    return r;
}

#define TOOLS                                                                                      \
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"add\", \"parameters\": "      \
    "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}]"
/* A turn with an earlier call (arguments with spaces: written compact) and
 * its result. */
#define TURN                                                                                       \
    "\"messages\": [{\"role\": \"user\", \"content\": \"Add\"}, {\"role\": \"assistant\", "        \
    "\"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": "  \
    "{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 2}\"}}]}, {\"role\": \"tool\", "             \
    "\"tool_call_id\": \"c1\", \"content\": \"5\"}]"
#define LISTED                                                                                     \
    "{\"name\":\"add\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"       \
    "\"integer\"}}}}"

/* The built-in format, as docs/api.md shows it: the tools' system message,
 * a call between <tool_call> and </tool_call>, "Tool result: " in a user
 * message, and with tool_choice required " <tool_call>" after the
 * generation prompt. */
START_TEST(oai_template_default_writes_the_builtin_tool_format)
{
    oai_template t;
    ck_assert_int_eq(oai_template_default(&t), 0);
    ck_assert_str_eq(t.call_prefix, "<tool_call>");
    ck_assert_str_eq(t.call_suffix, "</tool_call>");
    ck_assert_str_eq(t.call_lead, " ");
    oai_request r = chat_ok(&t, "{" TURN ", " TOOLS ", \"tool_choice\": \"required\"}");
    ck_assert_int_eq(r.tool_mode, OAI_TOOLS_REQUIRED);
    ck_assert_str_eq(r.prompts[0].text,
                     "You can call these tools. To call one, answer with <tool_call>{\"name\": "
                     "..., \"arguments\": {...}}</tool_call>.\n" LISTED "\n\n"
                     "User: Add\n\n"
                     "Assistant: <tool_call>{\"name\":\"add\",\"arguments\":{\"a\":2}}</tool_call>"
                     "\n\n"
                     "User: Tool result: 5\n\n"
                     "Assistant: <tool_call>");
    oai_request_free(&r);
    oai_template_free(&t);
}
END_TEST

/* A template file's tool keys: the listing, the call's form and marker,
 * the lead (none here), the result's form; on chat, and the same text on
 * /v1/responses from its function_call and function_call_output items. */
START_TEST(oai_template_load_tool_keys_write_the_prompt)
{
    oai_template t;
    char err[256];
    ck_assert_msg(load("tools = \"# Tools\\n{tools}\\n# End\"\n"
                       "tool_call = \"<call>{call}</call>\"\n"
                       "tool_call_lead = \"\"\n"
                       "tool_result = \"<result>{content}</result>\"\n",
                       &t, err, sizeof err)
                      == 0,
                  "%s", err);
    static const char want[] =
        "<|im_start|>system\n# Tools\n" LISTED "\n# End<|im_end|>\n"
        "<|im_start|>user\nAdd<|im_end|>\n"
        "<|im_start|>assistant\n<call>{\"name\":\"add\",\"arguments\":{\"a\":2}}</call><|im_end|>\n"
        "<|im_start|>user\n<result>5</result><|im_end|>\n"
        "<|im_start|>assistant\n<call>";
    oai_request r = chat_ok(&t, "{" TURN ", " TOOLS ", \"tool_choice\": \"required\"}");
    ck_assert_str_eq(r.prompts[0].text, want);
    oai_request_free(&r);
    /* auto: the same, without the marker at the end */
    r = chat_ok(&t, "{" TURN ", " TOOLS "}");
    ck_assert_int_eq(r.tool_mode, OAI_TOOLS_AUTO);
    ck_assert_uint_eq(r.prompts[0].text_len, strlen(want) - strlen("<call>"));
    oai_request_free(&r);
    /* Responses: the items kept as they came (the call's arguments as
     * sent), written by the template when rendered. */
    static const char body[] =
        "{\"input\": [{\"role\": \"user\", \"content\": \"Add\"}, {\"type\": \"function_call\", "
        "\"call_id\": \"c1\", \"name\": \"add\", \"arguments\": \"{\\\"a\\\": 2}\"}, {\"type\": "
        "\"function_call_output\", \"call_id\": \"c1\", \"output\": \"5\"}], \"tools\": "
        "[{\"type\": \"function\", \"name\": \"add\", \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"a\": {\"type\": \"integer\"}}}}], \"tool_choice\": \"required\"}";
    oai_resp_request rq;
    oai_error e;
    ck_assert_msg(oai_parse_responses(body, strlen(body), &lim, &t, &rq, &e) == 0, "%s", e.message);
    ck_assert_uint_eq(rq.nmsgs, 3);
    ck_assert_int_eq(rq.msgs[1].kind, OAI_MSG_CALL);
    ck_assert_str_eq(rq.msgs[1].name, "add");
    ck_assert_str_eq(rq.msgs[1].call_id, "c1");
    ck_assert_str_eq(rq.msgs[1].text, "{\"a\": 2}");
    ck_assert_int_eq(rq.msgs[2].kind, OAI_MSG_CALL_OUTPUT);
    ck_assert_str_eq(rq.msgs[2].call_id, "c1");
    ck_assert_ptr_null(rq.msgs[2].name);
    ck_assert_str_eq(rq.msgs[2].text, "5");
    ck_assert_uint_eq(oai_render_len(&t, &rq.msgs[2]),
                      strlen("<|im_start|>user\n<result>5</result><|im_end|>\n"));
    oai_msg all[4] = {{.role = OAI_ROLE_SYSTEM, .text = rq.tools_text, .len = rq.tools_text_len}};
    for (size_t i = 0; i < 3; i++) all[i + 1] = rq.msgs[i];
    char *text;
    size_t len;
    ck_assert_int_eq(oai_render(&t, all, 4, &text, &len), 0);
    ck_assert_uint_eq(len, strlen(want) - strlen("<call>")); /* the route adds the marker */
    ck_assert_int_eq(strncmp(text, want, len), 0);
    free(text);
    oai_resp_request_free(&rq);
    oai_template_free(&t);
}
END_TEST

static const struct {
    const char *text, *message;
} tool_bad[] = {
    {"tools = \"no list\"\n", ":5: tools must hold {tools} exactly once"},
    {"tool_call = \"<call>\"\n", ":5: tool_call must hold {call} exactly once"},
    {"tool_call = \"{call}</call>\"\n", ":5: tool_call must begin with its marker"},
    {"tool_call = \" <call>{call}\"\n", ":5: tool_call must begin with its marker"},
    {"tool_call_lead = \"> \"\n", ":5: tool_call_lead must be white space"},
    {"tool_result = \"{content}{content}\"\n", ":5: tool_result must hold {content} exactly once"},
};

START_TEST(oai_template_load_tool_key_errors_name_the_line)
{
    oai_template t;
    char err[256];
    ck_assert_int_eq(load(tool_bad[_i].text, &t, err, sizeof err), -1);
    ck_assert_msg(strstr(err, tool_bad[_i].message) != NULL, "%s", err);
    ck_assert_ptr_null(t.call_prefix);
}
END_TEST

/* input_items' ids stand for the items; a function_call needs its call_id. */
START_TEST(oai_parse_responses_call_items_need_a_call_id)
{
    oai_template t;
    ck_assert_int_eq(oai_template_default(&t), 0);
    static const char *const bodies[] = {
        "{\"input\": [{\"type\": \"function_call\", \"name\": \"f\", \"arguments\": \"{}\"}]}",
        "{\"input\": [{\"type\": \"function_call_output\", \"call_id\": \"\", \"output\": \"x\"}]}",
    };
    for (size_t i = 0; i < 2; i++) {
        oai_resp_request rq;
        oai_error e;
        ck_assert_int_eq(oai_parse_responses(bodies[i], strlen(bodies[i]), &lim, &t, &rq, &e), -1);
        ck_assert_str_eq(e.param, "input");
        ck_assert_msg(strstr(e.message, "call_id") != NULL, "%s", e.message);
    }
    oai_template_free(&t);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("oai_tools");
    TCase *tc = tcase_create("oai_template_tools");
    tcase_add_test(tc, oai_template_default_writes_the_builtin_tool_format);
    tcase_add_test(tc, oai_template_load_tool_keys_write_the_prompt);
    tcase_add_loop_test(tc, oai_template_load_tool_key_errors_name_the_line, 0,
                        (int)(sizeof tool_bad / sizeof tool_bad[0]));
    tcase_add_test(tc, oai_parse_responses_call_items_need_a_call_id);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
