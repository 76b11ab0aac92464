/* tests/test_sse.c: the SSE writer (server/api/sse.c), read back by an event
 * stream parser written from the WHATWG HTML specification ("Interpreting an
 * event stream"): lines end in CR, LF or CRLF; a blank line dispatches the
 * event; "data" lines append to the data buffer (one space after the colon
 * dropped), joined by LF; lines starting with ':' are comments. */
#include "sse.h"

#include <check.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define MAX_EVENTS 16

typedef struct {
    char *data[MAX_EVENTS];
    size_t n;
} events;

static void parse(const char *s, size_t len, events *ev)
{
    ev->n = 0;
    char *data = NULL;
    size_t dlen = 0;
    int have = 0;
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        while (j < len && s[j] != '\n' && s[j] != '\r') j++;
        ck_assert_msg(j < len, "an unterminated line at the end of the stream");
        size_t llen = j - i;
        const char *line = s + i;
        if (llen == 0) { /* dispatch */
            if (have) {
                ck_assert_uint_lt(ev->n, MAX_EVENTS);
                ev->data[ev->n++] = data ? data : strdup("");
                data = NULL;
                dlen = 0;
                have = 0;
            }
        } else if (line[0] != ':') {
            const char *colon = memchr(line, ':', llen);
            size_t flen = colon ? (size_t)(colon - line) : llen;
            const char *v = colon ? colon + 1 : line + llen;
            size_t vlen = (size_t)(line + llen - v);
            if (vlen > 0 && v[0] == ' ') {
                v++;
                vlen--;
            }
            if (flen == 4 && memcmp(line, "data", 4) == 0) {
                data = realloc(data, dlen + vlen + 2);
                if (have) data[dlen++] = '\n';
                memcpy(data + dlen, v, vlen);
                dlen += vlen;
                data[dlen] = '\0';
                have = 1;
            }
        }
        i = j + 1;
        if (s[j] == '\r' && i < len && s[i] == '\n') i++;
    }
    free(data); /* an event without its blank line is never dispatched */
}

static void events_free(events *ev)
{
    for (size_t i = 0; i < ev->n; i++) free(ev->data[i]);
}

static char *drain(sse_queue *q, size_t step, size_t *len)
{
    char *all = malloc(sse_pending(q) + 1);
    size_t n = 0, got;
    while ((got = sse_take(q, all + n, step)) > 0) n += got;
    *len = n;
    return all;
}

START_TEST(sse_text_cannot_break_the_framing)
{
    /* Text a model or a client could produce: blank lines, a forged event,
     * carriage returns, NUL, line and paragraph separators. */
    static const char text[] = "a\n\nb\r\ndata: [DONE]\n\n\r: c\x00 d\xe2\x80\xa8 e\xe2\x80\xa9";
    json_t *o = json_pack("{s:s%, s:i}", "text", text, sizeof text - 1, "index", 3);
    sse_queue q;
    sse_init(&q);
    ck_assert_int_eq(sse_data(&q, o), 0);
    size_t len;
    char *bytes = drain(&q, 7, &len);
    ck_assert_int_eq(memcmp(bytes, "data: {", 7), 0);
    ck_assert_int_eq(memcmp(bytes + len - 3, "}\n\n", 3), 0);
    events ev;
    parse(bytes, len, &ev);
    ck_assert_uint_eq(ev.n, 1);
    json_error_t err;
    json_t *back = json_loads(ev.data[0], JSON_ALLOW_NUL, &err);
    ck_assert_ptr_nonnull(back);
    ck_assert(json_equal(back, o));
    ck_assert_uint_eq(json_string_length(json_object_get(back, "text")), sizeof text - 1);
    json_decref(back);
    json_decref(o);
    events_free(&ev);
    free(bytes);
    sse_free(&q);
}
END_TEST

START_TEST(sse_a_stream_parses_back_in_order)
{
    sse_queue q;
    sse_init(&q);
    json_t *a = json_pack("{s:s}", "text", "Hello"),
           *b = json_pack("{s:s}", "text", " w\xc3\xb6rld");
    ck_assert_int_eq(sse_comment(&q, "waiting"), 0);
    ck_assert_int_eq(sse_data(&q, a), 0);
    ck_assert_int_eq(sse_comment(&q, "waiting"), 0);
    ck_assert_int_eq(sse_data(&q, b), 0);
    ck_assert_int_eq(sse_data_raw(&q, "{\"error\":{\"message\":\"x\"}}"), 0);
    ck_assert(!sse_finished(&q));
    ck_assert_int_eq(sse_done(&q), 0);
    ck_assert(!sse_finished(&q)); /* queued, not yet sent */
    size_t len;
    char *bytes = drain(&q, 1, &len); /* one byte at a time */
    ck_assert(sse_finished(&q));
    ck_assert_uint_eq(sse_pending(&q), 0);
    events ev;
    parse(bytes, len, &ev);
    ck_assert_uint_eq(ev.n, 4);
    ck_assert_str_eq(ev.data[0], "{\"text\":\"Hello\"}");
    ck_assert_str_eq(ev.data[1], "{\"text\":\" w\xc3\xb6rld\"}");
    ck_assert_str_eq(ev.data[2], "{\"error\":{\"message\":\"x\"}}");
    ck_assert_str_eq(ev.data[3], "[DONE]");
    /* The exact bytes, as clients' parsers and proxies see them. */
    ck_assert_uint_eq(len,
                      strlen(": waiting\n\ndata: {\"text\":\"Hello\"}\n\n: waiting\n\n")
                          + strlen("data: {\"text\":\" w\xc3\xb6rld\"}\n\n")
                          + strlen("data: {\"error\":{\"message\":\"x\"}}\n\ndata: [DONE]\n\n"));
    ck_assert_int_eq(memcmp(bytes + len - 14, "data: [DONE]\n\n", 14), 0);
    json_decref(a);
    json_decref(b);
    events_free(&ev);
    free(bytes);
    sse_free(&q);
}
END_TEST

START_TEST(sse_nothing_after_done)
{
    sse_queue q;
    sse_init(&q);
    json_t *a = json_pack("{s:i}", "n", 1);
    ck_assert_int_eq(sse_done(&q), 0);
    ck_assert_int_eq(sse_data(&q, a), -1);
    ck_assert_int_eq(sse_comment(&q, "late"), -1);
    ck_assert_int_eq(sse_done(&q), -1);
    ck_assert_uint_eq(sse_pending(&q), 14);
    json_decref(a);
    sse_free(&q);
}
END_TEST

START_TEST(sse_rejects_what_would_span_lines)
{
    sse_queue q;
    sse_init(&q);
    ck_assert_int_eq(sse_comment(&q, "two\nlines"), -1);
    ck_assert_int_eq(sse_comment(&q, "cr\r"), -1);
    ck_assert_int_eq(sse_data_raw(&q, "{\n}"), -1);
    ck_assert_uint_eq(sse_pending(&q), 0);
    ck_assert(!q.failed); /* a refused event does not break the stream */
    ck_assert_int_eq(sse_comment(&q, "ok"), 0);
    ck_assert_uint_eq(sse_pending(&q), 6);
    sse_free(&q);
}
END_TEST

START_TEST(sse_slow_reader_buffer_stays_bounded)
{
    /* A reader that always leaves part behind never empties the queue, so
     * the start-over of put() never runs: the taken bytes must still be
     * reused, or the buffer grows with everything ever sent. */
    sse_queue q;
    sse_init(&q);
    char out[64];
    size_t sent = 0, got = 0;
    for (int i = 0; i < 10000; i++) {
        ck_assert_int_eq(sse_comment(&q, "0123456789012345678901234567890123456789"), 0);
        sent += 44;
        got += sse_take(&q, out, 40); /* 4 bytes a round stay behind */
        ck_assert_uint_eq(sse_pending(&q), sent - got);
    }
    ck_assert_uint_eq(sse_pending(&q), 40000);
    ck_assert_uint_le(q.cap, 2 * 40000 + 1024); /* not the 440,000 bytes sent */
    /* The stream is intact where it stood: event after event, in order. */
    const char *ev = ": 0123456789012345678901234567890123456789\n\n";
    char rest[44];
    for (size_t k = 0; k < 3; k++) {
        ck_assert_uint_eq(sse_take(&q, rest, 1), 1);
        ck_assert_int_eq(rest[0], ev[(got + k) % 44]);
    }
    sse_free(&q);
}
END_TEST

START_TEST(sse_partial_takes_and_reuse)
{
    sse_queue q;
    sse_init(&q);
    char out[64];
    ck_assert_uint_eq(sse_take(&q, out, sizeof out), 0); /* empty */
    for (int round = 0; round < 3; round++) {
        ck_assert_int_eq(sse_comment(&q, "0123456789"), 0); /* 14 bytes */
        ck_assert_uint_eq(sse_take(&q, out, 5), 5);
        ck_assert_int_eq(sse_comment(&q, "abc"), 0); /* queued behind the rest */
        ck_assert_uint_eq(sse_pending(&q), 9 + 7);
        ck_assert_uint_eq(sse_take(&q, out, sizeof out), 16);
        ck_assert_int_eq(memcmp(out, "3456789\n\n: abc\n\n", 16), 0);
        ck_assert_uint_eq(q.len, 0); /* all taken: the buffer starts over */
    }
    /* Many events: the queue grows and keeps every byte in order. */
    for (int i = 0; i < 5000; i++) ck_assert_int_eq(sse_comment(&q, "keep-alive"), 0);
    ck_assert_uint_eq(sse_pending(&q), 5000 * 14);
    size_t len;
    char *bytes = drain(&q, 4096, &len);
    ck_assert_uint_eq(len, 5000 * 14);
    for (size_t i = 0; i < len; i += 14)
        ck_assert_int_eq(memcmp(bytes + i, ": keep-alive\n\n", 14), 0);
    free(bytes);
    sse_free(&q);
}
END_TEST

START_TEST(sse_max_bytes_refuses_whole_events_but_not_the_ending)
{
    sse_queue q;
    sse_init(&q);
    q.max_bytes = 30;
    ck_assert_int_eq(sse_comment(&q, "0123456789"), 0); /* 14 */
    ck_assert_int_eq(sse_comment(&q, "0123456789"), 0); /* 28 */
    ck_assert(sse_fits(&q, 2));
    ck_assert(!sse_fits(&q, 3));
    ck_assert_int_eq(sse_comment(&q, "x"), -1); /* 5 more: refused whole */
    ck_assert(q.over);
    ck_assert(!q.failed);
    ck_assert_uint_eq(sse_pending(&q), 28);
    ck_assert_uint_eq(q.total, 28);
    sse_final(&q); /* the ending passes */
    ck_assert_int_eq(sse_data_raw(&q, "{\"error\":{}}"), 0);
    ck_assert_int_eq(sse_done(&q), 0);
    size_t len;
    char *bytes = drain(&q, 7, &len);
    events ev;
    parse(bytes, len, &ev);
    ck_assert_uint_eq(ev.n, 2);
    ck_assert_str_eq(ev.data[0], "{\"error\":{}}");
    ck_assert_str_eq(ev.data[1], "[DONE]");
    events_free(&ev);
    free(bytes);
    sse_free(&q);
}
END_TEST

START_TEST(sse_event_bytes_is_what_sse_event_queues)
{
    sse_queue q;
    sse_init(&q);
    json_t *o = json_pack("{s:s, s:i}", "type", "response.completed", "n", 7);
    ck_assert_int_eq(sse_event(&q, "response.completed", o), 0);
    ck_assert_uint_eq(sse_event_bytes("response.completed", o), sse_pending(&q));
    json_decref(o);
    sse_free(&q);
}
END_TEST

/* A stream cut after `taken` bytes were read of three 14-byte events: what
 * the reader gets from then on, ending included. */
static char *cut_after(size_t taken, size_t *len)
{
    sse_queue q;
    sse_init(&q);
    char out[64];
    for (int i = 0; i < 3; i++) ck_assert_int_eq(sse_comment(&q, "0123456789"), 0);
    size_t got = 0;
    while (got < taken) got += sse_take(&q, out, taken - got < 3 ? taken - got : 3);
    sse_cut(&q);
    ck_assert_int_eq(sse_comment(&q, "late"), -1); /* only the ending may follow */
    sse_final(&q);
    ck_assert_int_eq(sse_data_raw(&q, "{\"error\":{}}"), 0);
    ck_assert_int_eq(sse_done(&q), 0);
    char *rest = drain(&q, 5, len);
    sse_free(&q);
    return rest;
}

START_TEST(sse_cut_ends_on_an_event_boundary)
{
    const char *ending = "data: {\"error\":{}}\n\ndata: [DONE]\n\n";
    size_t len;
    /* Nothing taken, or whole events taken: the ending follows at once. */
    size_t at[] = {0, 14, 28};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        char *rest = cut_after(at[i], &len);
        ck_assert_uint_eq(len, strlen(ending));
        ck_assert_int_eq(memcmp(rest, ending, len), 0);
        free(rest);
    }
    /* The events dropped are counted, comments aside. */
    sse_queue q;
    sse_init(&q);
    json_t *o = json_pack("{s:i}", "n", 1);
    ck_assert_int_eq(sse_event(&q, "a", o), 0);
    ck_assert_int_eq(sse_comment(&q, "waiting"), 0);
    ck_assert_int_eq(sse_event(&q, "b", o), 0);
    ck_assert_int_eq(sse_data(&q, o), 0);
    char out[4];
    ck_assert_uint_eq(sse_take(&q, out, 3), 3); /* inside event a: it stays */
    ck_assert_uint_gt(sse_cut(&q), 0);
    ck_assert_uint_eq(q.dropped, 2);
    json_decref(o);
    sse_free(&q);
    /* Inside an event (its first newline taken, too): the rest of it, then
     * the ending; the events after it are gone. */
    static const char event[] = ": 0123456789\n\n";
    for (size_t k = 1; k < 14; k++) {
        char *rest = cut_after(14 + k, &len);
        ck_assert_uint_eq(len, 14 - k + strlen(ending));
        ck_assert_int_eq(memcmp(rest, event + k, 14 - k), 0);
        ck_assert_int_eq(memcmp(rest + 14 - k, ending, strlen(ending)), 0);
        free(rest);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sse");
    TCase *tc = tcase_create("sse");
    tcase_add_test(tc, sse_text_cannot_break_the_framing);
    tcase_add_test(tc, sse_a_stream_parses_back_in_order);
    tcase_add_test(tc, sse_nothing_after_done);
    tcase_add_test(tc, sse_rejects_what_would_span_lines);
    tcase_add_test(tc, sse_partial_takes_and_reuse);
    tcase_add_test(tc, sse_slow_reader_buffer_stays_bounded);
    tcase_add_test(tc, sse_max_bytes_refuses_whole_events_but_not_the_ending);
    tcase_add_test(tc, sse_event_bytes_is_what_sse_event_queues);
    tcase_add_test(tc, sse_cut_ends_on_an_event_boundary);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
