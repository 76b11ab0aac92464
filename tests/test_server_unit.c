/* tests/test_server_unit.c: the pieces of `gpt2d serve` that decide without
 * a connection (the headers of server/http, api, daemon): the route table lookup, the API key
 * check, the status table, the request state machine, best_of ranking, the
 * SSE queue's backlog bound, the stored responses' bounds and the /metrics
 * page. The expectations are
 * written from docs/api.md, OpenAI's error shapes and the Prometheus text
 * format, not from the code. */
#include "daemon/daemon.h"
#include "testutil.h"

#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- Routing ------------------------------------------------------------- */

static enum MHD_Result handler_a(srv_req *r)
{
    (void)r;
    return MHD_YES;
}

static enum MHD_Result handler_b(srv_req *r)
{
    (void)r;
    return MHD_NO;
}

static const http_route table[] = {
    {"POST", "/v1/completions", handler_a, 1, 0}, {"GET", "/health", handler_b, 0, 0},
    {"POST", "/health", handler_a, 1, 0}, /* a second method on one path */
    {"GET", "/metrics", handler_b, 0, 0},         {"GET", "/v1/models", handler_b, 1, 0},
    {"GET", "/v1/models/", handler_a, 1, 1}, /* a prefix: /v1/models/{id} */
};
#define NTABLE (sizeof table / sizeof table[0])

START_TEST(http_route_find_known_route_found)
{
    const http_route *e = NULL;
    ck_assert_int_eq(http_route_find(table, NTABLE, "POST", "/v1/completions", &e),
                     HTTP_ROUTE_FOUND);
    ck_assert_ptr_eq(e, &table[0]);
    ck_assert_int_eq(http_route_find(table, NTABLE, "POST", "/health", &e), HTTP_ROUTE_FOUND);
    ck_assert_ptr_eq(e, &table[2]);
    ck_assert_int_eq(http_route_find(table, NTABLE, "GET", "/health", &e), HTTP_ROUTE_FOUND);
    ck_assert_ptr_eq(e, &table[1]);
    ck_assert(e->handler == handler_b && e->needs_key == 0);
}
END_TEST

START_TEST(http_route_find_other_method_bad_method)
{
    const http_route *e = NULL;
    ck_assert_int_eq(http_route_find(table, NTABLE, "GET", "/v1/completions", &e),
                     HTTP_ROUTE_BAD_METHOD);
    ck_assert_ptr_eq(e, &table[0]); /* its needs_key decides the 401 before the 405 */
    ck_assert_int_eq(http_route_find(table, NTABLE, "DELETE", "/health", &e),
                     HTTP_ROUTE_BAD_METHOD);
    ck_assert_ptr_eq(e, &table[1]); /* the path's first entry */
    /* Methods are case-sensitive (RFC 9110 9.1). */
    ck_assert_int_eq(http_route_find(table, NTABLE, "get", "/metrics", &e), HTTP_ROUTE_BAD_METHOD);
}
END_TEST

START_TEST(http_route_find_unknown_path_not_found)
{
    const http_route *e = &table[0];
    ck_assert_int_eq(http_route_find(table, NTABLE, "GET", "/nope", &e), HTTP_ROUTE_NOT_FOUND);
    ck_assert_ptr_null(e);
    /* Whole paths only: no prefix, no trailing slash, no case folding. */
    ck_assert_int_eq(http_route_find(table, NTABLE, "GET", "/health/", &e), HTTP_ROUTE_NOT_FOUND);
    ck_assert_int_eq(http_route_find(table, NTABLE, "GET", "/heal", &e), HTTP_ROUTE_NOT_FOUND);
    ck_assert_int_eq(http_route_find(table, NTABLE, "GET", "/HEALTH", &e), HTTP_ROUTE_NOT_FOUND);
    ck_assert_int_eq(http_route_find(table, NTABLE, "GET", "", &e), HTTP_ROUTE_NOT_FOUND);
    ck_assert_int_eq(http_route_find(table, 0, "GET", "/health", &e), HTTP_ROUTE_NOT_FOUND);
}
END_TEST

START_TEST(http_route_find_prefix_entry_matches_longer_paths)
{
    const http_route *e = NULL;
    ck_assert_int_eq(http_route_find(table, NTABLE, "GET", "/v1/models/gpt2", &e),
                     HTTP_ROUTE_FOUND);
    ck_assert_ptr_eq(e, &table[5]);
    ck_assert_int_eq(http_route_find(table, NTABLE, "GET", "/v1/models/a/b", &e), HTTP_ROUTE_FOUND);
    ck_assert_ptr_eq(e, &table[5]);
    /* The exact entry stays exact; the prefix itself is not a match. */
    ck_assert_int_eq(http_route_find(table, NTABLE, "GET", "/v1/models", &e), HTTP_ROUTE_FOUND);
    ck_assert_ptr_eq(e, &table[4]);
    ck_assert_int_eq(http_route_find(table, NTABLE, "GET", "/v1/models/", &e),
                     HTTP_ROUTE_NOT_FOUND);
    ck_assert_int_eq(http_route_find(table, NTABLE, "POST", "/v1/models/gpt2", &e),
                     HTTP_ROUTE_BAD_METHOD);
    ck_assert_ptr_eq(e, &table[5]);
    /* An exact entry is never a prefix. */
    ck_assert_int_eq(http_route_find(table, NTABLE, "GET", "/metricsx", &e), HTTP_ROUTE_NOT_FOUND);
}
END_TEST

START_TEST(http_route_find_head_finds_get)
{
    const http_route *e = NULL;
    ck_assert_int_eq(http_route_find(table, NTABLE, "HEAD", "/health", &e), HTTP_ROUTE_FOUND);
    ck_assert_ptr_eq(e, &table[1]);
    ck_assert_int_eq(http_route_find(table, NTABLE, "HEAD", "/v1/completions", &e),
                     HTTP_ROUTE_BAD_METHOD);
}
END_TEST

START_TEST(http_route_allow_lists_methods_head_options)
{
    char buf[128];
    http_route_allow(table, NTABLE, "/health", buf, sizeof buf);
    ck_assert_str_eq(buf, "GET, HEAD, POST, OPTIONS");
    http_route_allow(table, NTABLE, "/v1/completions", buf, sizeof buf);
    ck_assert_str_eq(buf, "POST, OPTIONS");
    http_route_allow(table, NTABLE, "/v1/models/x", buf, sizeof buf);
    ck_assert_str_eq(buf, "GET, HEAD, OPTIONS");
    char small[8];
    http_route_allow(table, NTABLE, "/health", small, sizeof small);
    ck_assert_uint_lt(strlen(small), sizeof small); /* truncated, terminated */
}
END_TEST

START_TEST(http_origin_same_host_ip_or_localhost_only)
{
    ck_assert(http_origin_same_host("http://127.0.0.1:8080", "127.0.0.1:8080"));
    ck_assert(http_origin_same_host("http://localhost:8080", "localhost:8080"));
    ck_assert(http_origin_same_host("http://[::1]:8080", "[::1]:8080"));
    ck_assert(http_origin_same_host("http://10.1.2.3", "10.1.2.3"));
    /* A name could be rebound to this address: not by itself. */
    ck_assert(!http_origin_same_host("http://evil.example:8080", "evil.example:8080"));
    /* Another origin, scheme or port than the one the browser reached. */
    ck_assert(!http_origin_same_host("http://127.0.0.1:9999", "127.0.0.1:8080"));
    ck_assert(!http_origin_same_host("https://127.0.0.1:8080", "127.0.0.1:8080"));
    ck_assert(!http_origin_same_host("http://127.0.0.1:8080", NULL));
    ck_assert(!http_origin_same_host("null", "127.0.0.1:8080"));
    ck_assert(!http_origin_same_host("http://[::1", "[::1"));
    ck_assert(!http_origin_same_host("http://:8080", ":8080"));
}
END_TEST

START_TEST(http_request_id_ok_sane_ids_only)
{
    ck_assert(http_request_id_ok("hostile-abc-123"));
    ck_assert(http_request_id_ok("a"));
    char max[130];
    memset(max, 'x', 128);
    max[128] = '\0';
    ck_assert(http_request_id_ok(max));
    max[128] = 'x';
    max[129] = '\0';
    ck_assert(!http_request_id_ok(max)); /* 129 bytes */
    ck_assert(!http_request_id_ok(NULL));
    ck_assert(!http_request_id_ok(""));
    ck_assert(!http_request_id_ok("has space"));
    ck_assert(!http_request_id_ok("tab\tid"));
    ck_assert(!http_request_id_ok("nl\nid"));
    ck_assert(!http_request_id_ok("del\x7f"));
    ck_assert(!http_request_id_ok("utf8-\xc3\xa9"));
}
END_TEST

START_TEST(http_origin_allowed_list_star_and_empty)
{
    ck_assert(!http_origin_allowed("", "http://ok.example"));
    ck_assert(http_origin_allowed("http://ok.example", "http://ok.example"));
    ck_assert(http_origin_allowed("http://a.example, http://ok.example", "http://ok.example"));
    ck_assert(http_origin_allowed(" http://a.example ,http://ok.example ", "http://a.example"));
    ck_assert(http_origin_allowed("*", "http://evil.example"));
    ck_assert(http_origin_allowed("http://a.example, *", "null"));
    /* Whole entries only: no prefix, no suffix, no scheme swap. */
    ck_assert(!http_origin_allowed("http://ok.example", "http://ok.example.evil"));
    ck_assert(!http_origin_allowed("http://ok.example", "http://ok.exampl"));
    ck_assert(!http_origin_allowed("http://ok.example", "https://ok.example"));
    ck_assert(!http_origin_allowed("http://ok.example", ""));
    ck_assert(!http_origin_allowed("http://ok.example,", "null"));
    ck_assert(!http_origin_allowed("**", "http://evil.example"));
}
END_TEST

/* ---- Log escaping --------------------------------------------------------- */

static const char *escaped(const char *in, size_t n, size_t outlen)
{
    static char out[256];
    size_t w = log_escape(in, n, out, outlen);
    ck_assert_uint_eq(w, strlen(out));
    ck_assert_uint_lt(w, outlen);
    return out;
}

START_TEST(log_escape_controls_and_bad_utf8_escaped)
{
    const char forged[] = "/\n<3>gpt2d serve: FORGED";
    ck_assert_str_eq(escaped(forged, sizeof forged - 1, 256), "/\\x0a<3>gpt2d serve: FORGED");
    const char esc[] = "\x1b[31mRED\x1b[0m\x07\r\x7f";
    ck_assert_str_eq(escaped(esc, sizeof esc - 1, 256), "\\x1b[31mRED\\x1b[0m\\x07\\x0d\\x7f");
    /* A NUL inside the field does not end it. */
    ck_assert_str_eq(escaped("a\0b", 3, 256), "a\\x00b");
    /* Invalid UTF-8: a lone continuation, a bad second byte, an overlong
     * form, a surrogate, a cut sequence; C1 controls (U+009B is CSI). */
    ck_assert_str_eq(escaped("\xc3\x28\xff", 3, 256), "\\xc3(\\xff");
    ck_assert_str_eq(escaped("\x80", 1, 256), "\\x80");
    ck_assert_str_eq(escaped("\xc0\xaf", 2, 256), "\\xc0\\xaf");
    ck_assert_str_eq(escaped("\xed\xa0\x80", 3, 256), "\\xed\\xa0\\x80");
    ck_assert_str_eq(escaped("\xe2\x82", 2, 256), "\\xe2\\x82");
    ck_assert_str_eq(escaped("\xc2\x9b", 2, 256), "\\xc2\\x9b");
    /* The backslash itself, so an escape cannot be forged. */
    ck_assert_str_eq(escaped("a\\x0a", 5, 256), "a\\x5cx0a");
}
END_TEST

START_TEST(log_escape_printable_and_utf8_kept)
{
    const char text[] = "GET /v1/models status=200 caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 ~";
    ck_assert_str_eq(escaped(text, sizeof text - 1, 256), text);
}
END_TEST

START_TEST(log_escape_line_and_bidi_controls_escaped)
{
    /* Valid UTF-8 that breaks or reorders a line is escaped byte by byte:
     * C1 (U+0080, U+0085 NEL, U+009F), U+2028 and U+2029, and the
     * bidirectional controls U+061C, U+200E, U+200F, U+202A..U+202E,
     * U+2066..U+2069. */
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"\xc2\x80", "\\xc2\\x80"},
        {"a\xc2\x85z", "a\\xc2\\x85z"},
        {"\xc2\x9f", "\\xc2\\x9f"},
        {"\xd8\x9c", "\\xd8\\x9c"},
        {"\xe2\x80\x8e", "\\xe2\\x80\\x8e"},
        {"\xe2\x80\x8f", "\\xe2\\x80\\x8f"},
        {"/\xe2\x80\xa8x", "/\\xe2\\x80\\xa8x"},
        {"\xe2\x80\xa9", "\\xe2\\x80\\xa9"},
        {"\xe2\x80\xaa", "\\xe2\\x80\\xaa"},
        {"\xe2\x80\xab", "\\xe2\\x80\\xab"},
        {"\xe2\x80\xac", "\\xe2\\x80\\xac"},
        {"\xe2\x80\xad", "\\xe2\\x80\\xad"},
        {"status=200 \xe2\x80\xae", "status=200 \\xe2\\x80\\xae"},
        {"\xe2\x81\xa6", "\\xe2\\x81\\xa6"},
        {"\xe2\x81\xa7", "\\xe2\\x81\\xa7"},
        {"\xe2\x81\xa8", "\\xe2\\x81\\xa8"},
        {"\xe2\x81\xa9", "\\xe2\\x81\\xa9"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_str_eq(escaped(cases[i].in, strlen(cases[i].in), 256), cases[i].out);
    /* Their neighbours are text, kept: U+00A0, U+061B, U+200D (the emoji
     * joiner), U+2027, U+202F, U+2065, U+206A. */
    const char kept[] = "\xc2\xa0 \xd8\x9b \xe2\x80\x8d \xe2\x80\xa7 \xe2\x80\xaf "
                        "\xe2\x81\xa5 \xe2\x81\xaa";
    ck_assert_str_eq(escaped(kept, sizeof kept - 1, 256), kept);
}
END_TEST

START_TEST(log_escape_short_buffer_never_splits)
{
    /* Room for 5 bytes + NUL: an escape (4) or a character (2) that would
     * not fit is left out whole. */
    ck_assert_str_eq(escaped("ab\ncd", 5, 6), "ab");
    ck_assert_str_eq(escaped("abcd\xc3\xa9", 6, 6), "abcd");
    ck_assert_str_eq(escaped("abcdefgh", 8, 6), "abcde");
    char one[1];
    ck_assert_uint_eq(log_escape("abc", 3, one, 1), 0);
    ck_assert_int_eq(one[0], 0);
}
END_TEST

/* ---- Auth ---------------------------------------------------------------- */

static cfg_config keyed(const char *k1, const char *k2)
{
    cfg_config c;
    cfg_defaults(&c);
    c.n_api_keys = 0;
    if (k1) snprintf(c.api_keys[c.n_api_keys++], sizeof c.api_keys[0], "%s", k1);
    if (k2) snprintf(c.api_keys[c.n_api_keys++], sizeof c.api_keys[0], "%s", k2);
    return c;
}

START_TEST(http_key_ok_no_keys_open)
{
    cfg_config c = keyed(NULL, NULL);
    ck_assert(http_key_ok(&c, NULL));
    ck_assert(http_key_ok(&c, "Bearer anything"));
    ck_assert(http_key_ok(&c, "garbage"));
}
END_TEST

START_TEST(http_key_ok_configured_key_accepted)
{
    cfg_config c = keyed("sk-first-0123456789", "sk-second-0123456789");
    ck_assert(http_key_ok(&c, "Bearer sk-first-0123456789"));
    ck_assert(http_key_ok(&c, "Bearer sk-second-0123456789"));
    /* RFC 9110 11.1: the scheme is case-insensitive, 1*SP before the key. */
    ck_assert(http_key_ok(&c, "bearer sk-first-0123456789"));
    ck_assert(http_key_ok(&c, "BEARER sk-first-0123456789"));
    ck_assert(http_key_ok(&c, "Bearer   sk-first-0123456789"));
    /* RFC 9110 5.5: trailing whitespace (OWS) is not part of the value. */
    ck_assert(http_key_ok(&c, "Bearer sk-first-0123456789 "));
    ck_assert(http_key_ok(&c, "Bearer sk-first-0123456789\t \t"));
}
END_TEST

START_TEST(http_host_allowed_loopback_default_and_list)
{
    /* A loopback bind: the loopback names, any port, no other. */
    ck_assert(http_host_allowed("", 1, NULL));
    ck_assert(http_host_allowed("", 1, "localhost"));
    ck_assert(http_host_allowed("", 1, "LocalHost:8080"));
    ck_assert(http_host_allowed("", 1, "127.0.0.1:1"));
    ck_assert(http_host_allowed("", 1, "[::1]"));
    ck_assert(http_host_allowed("", 1, "[::1]:80"));
    ck_assert(!http_host_allowed("", 1, "evil.example"));
    ck_assert(!http_host_allowed("", 1, "localhost.evil.example"));
    ck_assert(!http_host_allowed("", 1, "127.0.0.1.nip.io:80"));
    ck_assert(!http_host_allowed("", 1, "[::1]x"));
    ck_assert(!http_host_allowed("", 1, "[::1"));
    ck_assert(!http_host_allowed("", 1, "localhost:80x"));
    ck_assert(!http_host_allowed("", 1, ""));
    /* Elsewhere any Host, unless listed. */
    ck_assert(http_host_allowed("", 0, "anything.example"));
    ck_assert(http_host_allowed("api.example, localhost", 0, "API.example:443"));
    ck_assert(!http_host_allowed("api.example, localhost", 0, "127.0.0.1"));
    ck_assert(http_host_allowed("*", 1, "evil.example"));
}
END_TEST

START_TEST(http_key_ok_wrong_key_refused)
{
    cfg_config c = keyed("sk-first-0123456789", NULL);
    ck_assert(!http_key_ok(&c, NULL));
    ck_assert(!http_key_ok(&c, ""));
    ck_assert(!http_key_ok(&c, "Bearer "));
    ck_assert(!http_key_ok(&c, "Bearer sk-first-012345678"));   /* a prefix */
    ck_assert(!http_key_ok(&c, "Bearer sk-first-01234567890")); /* longer */
    ck_assert(!http_key_ok(&c, "Bearer sk-first-0123456788"));  /* last byte */
    ck_assert(!http_key_ok(&c, "sk-first-0123456789"));         /* no scheme */
    ck_assert(!http_key_ok(&c, "Basic sk-first-0123456789"));
    ck_assert(!http_key_ok(&c, "Bearersk-first-0123456789"));
    ck_assert(!http_key_ok(&c, "bearer  "));
}
END_TEST

/* The matched key is named (1 + its index): its prefix cache salt (issue 24). */
START_TEST(http_key_ok_names_the_matched_key)
{
    cfg_config c = keyed("sk-first-0123456789", "sk-second-0123456789");
    ck_assert_int_eq(http_key_ok(&c, "Bearer sk-first-0123456789"), 1);
    ck_assert_int_eq(http_key_ok(&c, "Bearer sk-second-0123456789"), 2);
    ck_assert_int_eq(http_key_ok(&c, "Bearer sk-third-0123456789"), 0);
    c = keyed(NULL, NULL);
    ck_assert_int_eq(http_key_ok(&c, "Bearer sk-first-0123456789"), 1);
}
END_TEST

/* The reference implementation's test vectors: key 00 01 .. 0f, message
 * 00 01 .. n-1 (Aumasson and Bernstein's vectors.h, as 64-bit numbers). */
START_TEST(http_siphash_reference_vectors)
{
    const uint64_t k[2] = {UINT64_C(0x0706050403020100), UINT64_C(0x0f0e0d0c0b0a0908)};
    unsigned char m[16];
    for (unsigned i = 0; i < sizeof m; i++) m[i] = (unsigned char)i;
    ck_assert_uint_eq(http_siphash(k, m, 0), UINT64_C(0x726fdb47dd0e0e31));
    ck_assert_uint_eq(http_siphash(k, m, 1), UINT64_C(0x74f839c593dc67fd));
    ck_assert_uint_eq(http_siphash(k, m, 8), UINT64_C(0x93f5f5799a932462));
    ck_assert_uint_eq(http_siphash(k, m, 15), UINT64_C(0xa129ca6149be45e5));
}
END_TEST

/* A key's salt depends on the key and the process's secret, is never 0
 * (the common partition), and a request's cache_salt makes another within
 * the key's; no cache_salt leaves the key's. */
START_TEST(http_key_salt_per_key_per_secret_never_zero)
{
    const uint64_t s1[2] = {1, 2}, s2[2] = {3, 4};
    uint64_t a = http_key_salt(s1, "sk-first-0123456789");
    uint64_t b = http_key_salt(s1, "sk-second-0123456789");
    ck_assert(a != 0 && b != 0 && a != b);
    ck_assert_uint_eq(http_key_salt(s1, "sk-first-0123456789"), a);
    ck_assert_uint_ne(http_key_salt(s2, "sk-first-0123456789"), a);
    ck_assert_uint_eq(http_cache_salt(s1, a, NULL, 0), a);
    ck_assert_uint_eq(http_cache_salt(s1, 0, NULL, 0), 0);
    uint64_t au = http_cache_salt(s1, a, "u", 1), av = http_cache_salt(s1, a, "v", 1);
    uint64_t bu = http_cache_salt(s1, b, "u", 1), nu = http_cache_salt(s1, 0, "u", 1);
    ck_assert(au != 0 && av != 0 && bu != 0 && nu != 0);
    ck_assert(au != a && au != av && au != bu && au != nu && bu != nu);
    ck_assert_uint_eq(http_cache_salt(s1, a, "u", 1), au);
    /* Two uses of one hash, told apart: a cache_salt spelling a key does
     * not land on that key's salt. */
    ck_assert_uint_ne(http_cache_salt(s1, 0, "sk-first-0123456789", 19), a);
}
END_TEST

/* ---- The status table ---------------------------------------------------- */

START_TEST(http_status_of_engine_statuses_mapped)
{
    const http_status_map *m = http_status_of(HTTP_SRC_ENG, ENG_EFULL);
    ck_assert_int_eq(m->http, 429); /* retryable, with Retry-After */
    ck_assert_str_eq(m->type, "rate_limit_exceeded");
    ck_assert(m->retry);
    m = http_status_of(HTTP_SRC_ENG, ENG_ETOOBIG);
    ck_assert_int_eq(m->http, 400);
    ck_assert_str_eq(m->ecode, "context_length_exceeded");
    ck_assert(!m->retry);
    m = http_status_of(HTTP_SRC_ENG, ENG_EINVAL);
    ck_assert_int_eq(m->http, 400);
    ck_assert_str_eq(m->type, "invalid_request_error");
    ck_assert_int_eq(http_status_of(HTTP_SRC_ENG, ENG_ENOMEM)->http, 500);
}
END_TEST

START_TEST(http_status_of_tokenizer_and_config_mapped)
{
    ck_assert_int_eq(http_status_of(HTTP_SRC_BPE, BPE_EUNKNOWN)->http, 400);
    ck_assert_int_eq(http_status_of(HTTP_SRC_BPE, BPE_ETOOBIG)->http, 400);
    const http_status_map *m = http_status_of(HTTP_SRC_BPE, BPE_ENOMEM);
    ck_assert_int_eq(m->http, 500);
    ck_assert_str_eq(m->type, "server_error");
    ck_assert_int_eq(http_status_of(HTTP_SRC_CFG, CFG_EVALUE)->http, 400);
    ck_assert_int_eq(http_status_of(HTTP_SRC_CFG, CFG_EKEY)->http, 400);
    /* The same number from another source is another status. */
    ck_assert_int_ne(http_status_of(HTTP_SRC_BPE, 5)->http, http_status_of(HTTP_SRC_ENG, 5)->http);
}
END_TEST

START_TEST(http_status_of_unknown_status_server_error)
{
    const http_status_map *m = http_status_of(HTTP_SRC_ENG, 999);
    ck_assert_int_eq(m->http, 500);
    ck_assert_str_eq(m->type, "server_error");
    ck_assert_int_eq(http_status_of(HTTP_SRC_ENG, ENG_OK)->http, 500);
    ck_assert_int_eq(http_status_of(HTTP_SRC_CFG, -1)->http, 500);
}
END_TEST

/* ---- The request state machine ------------------------------------------- */

START_TEST(http_state_legal_request_paths_legal)
{
    static const http_state paths[][6] = {
        /* GET /health */
        {HTTP_REQ_HEAD, HTTP_REQ_BODY, HTTP_REQ_FINISHED, HTTP_REQ_NSTATES},
        /* a completion */
        {HTTP_REQ_HEAD, HTTP_REQ_BODY, HTTP_REQ_QUEUED, HTTP_REQ_RUNNING, HTTP_REQ_FINISHED,
         HTTP_REQ_NSTATES},
        /* a large prompt, streamed */
        {HTTP_REQ_HEAD, HTTP_REQ_BODY, HTTP_REQ_TOKENIZING, HTTP_REQ_STREAMING, HTTP_REQ_FINISHED,
         HTTP_REQ_NSTATES},
        /* refused on the head alone (401, 413) */
        {HTTP_REQ_HEAD, HTTP_REQ_FINISHED, HTTP_REQ_NSTATES},
        /* the queue timeout: an error before any token */
        {HTTP_REQ_BODY, HTTP_REQ_QUEUED, HTTP_REQ_FINISHED, HTTP_REQ_NSTATES},
        /* the client left while the answer was sent */
        {HTTP_REQ_RUNNING, HTTP_REQ_FINISHED, HTTP_REQ_ABORTED, HTTP_REQ_NSTATES},
    };
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++)
        for (size_t i = 0; i + 1 < 6 && paths[p][i + 1] != HTTP_REQ_NSTATES; i++)
            ck_assert_msg(http_state_legal(paths[p][i], paths[p][i + 1]), "%s -> %s",
                          http_state_name(paths[p][i]), http_state_name(paths[p][i + 1]));
    /* Every state but ABORTED may end in ABORTED. */
    for (int s = 0; s < HTTP_REQ_ABORTED; s++)
        ck_assert_msg(http_state_legal((http_state)s, HTTP_REQ_ABORTED), "%s -> aborted",
                      http_state_name((http_state)s));
}
END_TEST

START_TEST(http_state_legal_backwards_and_after_end_illegal)
{
    static const http_state bad[][2] = {
        {HTTP_REQ_BODY, HTTP_REQ_HEAD},
        {HTTP_REQ_HEAD, HTTP_REQ_QUEUED},
        {HTTP_REQ_HEAD, HTTP_REQ_STREAMING},
        {HTTP_REQ_HEAD, HTTP_REQ_TOKENIZING},
        {HTTP_REQ_QUEUED, HTTP_REQ_STREAMING},
        {HTTP_REQ_RUNNING, HTTP_REQ_QUEUED},
        {HTTP_REQ_STREAMING, HTTP_REQ_RUNNING},
        {HTTP_REQ_FINISHED, HTTP_REQ_BODY},
        {HTTP_REQ_FINISHED, HTTP_REQ_STREAMING},
        {HTTP_REQ_TOKENIZING, HTTP_REQ_RUNNING},
        {HTTP_REQ_TOKENIZING, HTTP_REQ_TOKENIZING},
        {HTTP_REQ_QUEUED, HTTP_REQ_QUEUED},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(!http_state_legal(bad[i][0], bad[i][1]), "%s -> %s",
                      http_state_name(bad[i][0]), http_state_name(bad[i][1]));
    /* ABORTED is final. */
    for (int s = 0; s < HTTP_REQ_NSTATES; s++)
        ck_assert(!http_state_legal(HTTP_REQ_ABORTED, (http_state)s));
    ck_assert(!http_state_legal(HTTP_REQ_NSTATES, HTTP_REQ_BODY));
    ck_assert(!http_state_legal(HTTP_REQ_HEAD, HTTP_REQ_NSTATES));
    ck_assert_str_eq(http_state_name(HTTP_REQ_NSTATES), "invalid");
    ck_assert_str_eq(http_state_name(HTTP_REQ_TOKENIZING), "tokenizing");
}
END_TEST

START_TEST(http_req_set_state_legal_moves)
{
    srv_req r;
    memset(&r, 0, sizeof r);
    r.state = HTTP_REQ_HEAD;
    http_req_set_state(&r, HTTP_REQ_BODY);
    ck_assert_int_eq(r.state, HTTP_REQ_BODY);
    http_req_set_state(&r, HTTP_REQ_QUEUED);
    http_req_set_state(&r, HTTP_REQ_RUNNING);
    http_req_set_state(&r, HTTP_REQ_FINISHED);
    ck_assert_int_eq(r.state, HTTP_REQ_FINISHED);
}
END_TEST

#ifndef NDEBUG
/* An illegal move is a bug in the server: the assert stops it. */
START_TEST(http_req_set_state_illegal_aborts)
{
    srv_req r;
    memset(&r, 0, sizeof r);
    r.state = HTTP_REQ_FINISHED;
    http_req_set_state(&r, HTTP_REQ_RUNNING);
}
END_TEST
#endif

/* ---- best_of ranking ----------------------------------------------------- */

START_TEST(cmpl_rank_best_of_highest_mean_first)
{
    const double mean[5] = {-2.0, -0.5, -3.0, -0.1, -1.0};
    size_t order[5];
    cmpl_rank(mean, 5, 2, order);
    ck_assert_uint_eq(order[0], 3);
    ck_assert_uint_eq(order[1], 1);
    cmpl_rank(mean, 5, 5, order); /* best_of == n: as generated */
    for (size_t i = 0; i < 5; i++) ck_assert_uint_eq(order[i], i);
}
END_TEST

START_TEST(cmpl_rank_ties_keep_order)
{
    const double mean[4] = {-1.0, -0.5, -1.0, -0.5};
    size_t order[4];
    cmpl_rank(mean, 4, 3, order);
    ck_assert_uint_eq(order[0], 1);
    ck_assert_uint_eq(order[1], 3);
    ck_assert_uint_eq(order[2], 0);
    ck_assert_uint_eq(order[3], 2);
    /* A candidate without tokens ranks last (completions.c gives it -1e30). */
    const double empty[3] = {-1e30, -4.0, -1e30};
    cmpl_rank(empty, 3, 1, order);
    ck_assert_uint_eq(order[0], 1);
}
END_TEST

/* ---- The seeds (issue 35) ------------------------------------------------ */

/* A request's own seed, 0 too, is kept and spends no counter; without one,
 * the seed is SipHash of the counter's little-endian bytes under the key:
 * new on each call, and another key (another replica, another start) gives
 * others at the same place in the order. */
START_TEST(cmpl_seed_own_kept_else_keyed_counter)
{
    static srv_api a, b; /* zeroed */
    a.seed_key[0] = b.seed_key[0] = 1;
    a.seed_key[1] = 2;
    b.seed_key[1] = 3;
    oai_request q;
    memset(&q, 0, sizeof q);
    q.has_seed = 1;
    q.seed = 42;
    ck_assert_uint_eq(cmpl_seed(&a, &q), 42);
    q.seed = 0;
    ck_assert_uint_eq(cmpl_seed(&a, &q), 0);
    ck_assert_uint_eq(a.seed_count, 0);
    q.has_seed = 0;
    uint64_t a0 = cmpl_seed(&a, &q), a1 = cmpl_seed(&a, &q), b0 = cmpl_seed(&b, &q);
    ck_assert_uint_eq(a.seed_count, 2);
    ck_assert(a0 != a1 && a0 != b0 && a1 != b0);
    const uint64_t k[2] = {1, 2};
    const unsigned char m0[8] = {0}, m1[8] = {1};
    ck_assert_uint_eq(a0, http_siphash(k, m0, sizeof m0));
    ck_assert_uint_eq(a1, http_siphash(k, m1, sizeof m1));
}
END_TEST

/* ---- The SSE backlog bound ----------------------------------------------- */

START_TEST(sse_over_limit_backlog_bound)
{
    sse_queue q;
    sse_init(&q);
    for (int i = 0; i < 100; i++) ck_assert_int_eq(sse_comment(&q, "padding"), 0);
    ck_assert(!sse_over_limit(&q)); /* no bound */
    q.limit = 64;
    ck_assert(sse_over_limit(&q));
    char buf[2048];
    size_t left = sse_pending(&q);
    ck_assert_uint_eq(sse_take(&q, buf, left - 64), left - 64);
    ck_assert_uint_eq(sse_pending(&q), 64);
    ck_assert(!sse_over_limit(&q)); /* at the bound is within it */
    ck_assert_int_eq(sse_comment(&q, "x"), 0);
    ck_assert(sse_over_limit(&q));
    sse_take(&q, buf, sizeof buf);
    ck_assert(!sse_over_limit(&q));
    sse_free(&q);
}
END_TEST

/* ---- Connections (conn.c) ------------------------------------------------ */

START_TEST(conn_deadline_of_each_phase_its_timeout)
{
    cfg_config cfg;
    cfg_defaults(&cfg);
    cfg.request_header_timeout_s = 2;
    cfg.body_timeout_s = 3;
    cfg.connection_timeout_s = 60;
    srv_conn c = {.t_ready = 100.0};
    conn_deadline d = conn_deadline_of(&cfg, &c); /* a new connection: its first head */
    ck_assert_int_eq(d.kind, CONN_WAIT_HEAD);
    ck_assert_double_eq(d.at, 102.0);
    c.served = 1; /* keep-alive between requests, no byte yet: connection_timeout */
    d = conn_deadline_of(&cfg, &c);
    ck_assert_int_eq(d.kind, CONN_WAIT_IDLE);
    ck_assert_double_eq(d.at, 160.0);
    c.t_head = 110.0; /* the next head's first byte: request_header_timeout from it */
    d = conn_deadline_of(&cfg, &c);
    ck_assert_int_eq(d.kind, CONN_WAIT_HEAD);
    ck_assert_double_eq(d.at, 112.0);
    c.t_head = 0;
    cfg.body_min_rate = 0;
    srv_req r = {.state = HTTP_REQ_BODY, .t_start = 120.0, .t_progress = 130.0};
    c.req = &r; /* a body: from its last byte */
    d = conn_deadline_of(&cfg, &c);
    ck_assert_int_eq(d.kind, CONN_WAIT_BODY);
    ck_assert_double_eq(d.at, 133.0);
    /* At 100 bytes a second: 3 s from the head plus a second a 100 bytes. */
    cfg.body_min_rate = 100;
    r.body_len = 500; /* 123 + 5 = 128, before the gap's 133 */
    d = conn_deadline_of(&cfg, &c);
    ck_assert_int_eq(d.kind, CONN_WAIT_RATE);
    ck_assert_double_eq(d.at, 128.0);
    r.body_len = 5000; /* 123 + 50 = 173: the gap's 133 comes first */
    d = conn_deadline_of(&cfg, &c);
    ck_assert_int_eq(d.kind, CONN_WAIT_BODY);
    ck_assert_double_eq(d.at, 133.0);
    r.state = HTTP_REQ_HEAD; /* the head is in, no body byte yet */
    ck_assert_int_eq(conn_deadline_of(&cfg, &c).kind, CONN_WAIT_BODY);
    r.state = HTTP_REQ_STREAMING; /* being answered: no deadline here */
    ck_assert_int_eq(conn_deadline_of(&cfg, &c).kind, CONN_WAIT_NONE);
    r.state = HTTP_REQ_BODY;
    c.closing = 1; /* already closing: nothing more */
    ck_assert_int_eq(conn_deadline_of(&cfg, &c).kind, CONN_WAIT_NONE);
}
END_TEST

START_TEST(conn_note_recv_byte_after_answer_starts_head)
{
    /* Ready at 100 s; the last byte before that (the request) came at 99.5. */
    srv_conn c = {.t_ready = 100.0, .served = 1, .t_recv = 99.5};
    ck_assert_int_eq(conn_note_recv(&c, 99.51, 100.2), 0); /* the same byte, one tick off */
    ck_assert_double_eq(c.t_head, 0.0);
    ck_assert_int_eq(conn_note_recv(&c, -1.0, 100.2), 0); /* not TCP: nothing known */
    /* A byte at 100.35, seen at the sweep after 100.2: from the sweep before. */
    ck_assert_int_eq(conn_note_recv(&c, 100.35, 100.2), 1);
    ck_assert_double_eq(c.t_head, 100.2);
    ck_assert_int_eq(conn_note_recv(&c, 101.0, 100.8), 0); /* set once per head */
    ck_assert_double_eq(c.t_head, 100.2);
    /* The first sweep after the answer: never before t_ready. */
    srv_conn d = {.t_ready = 100.0, .served = 1, .t_recv = 99.5};
    ck_assert_int_eq(conn_note_recv(&d, 100.1, 99.9), 1);
    ck_assert_double_eq(d.t_head, 100.0);
    /* Not between requests: a new connection, or one with a request. */
    srv_conn e = {.t_ready = 100.0, .t_recv = 99.5};
    ck_assert_int_eq(conn_note_recv(&e, 100.5, 100.2), 0);
    srv_req r = {.state = HTTP_REQ_BODY};
    srv_conn f = {.t_ready = 100.0, .served = 1, .t_recv = 99.5, .req = &r};
    ck_assert_int_eq(conn_note_recv(&f, 100.5, 100.2), 0);
    srv_conn g = {.t_ready = 100.0, .served = 1, .t_recv = -1.0}; /* no record at t_ready */
    ck_assert_int_eq(conn_note_recv(&g, 100.5, 100.2), 0);
}
END_TEST

START_TEST(conn_pick_idle_oldest_without_request)
{
    srv_req busy = {.state = HTTP_REQ_RUNNING};
    srv_conn c[4] = {{.t_ready = 5.0},
                     {.t_ready = 1.0, .req = &busy},
                     {.t_ready = 3.0},
                     {.t_ready = 2.0, .closing = 1}};
    for (int i = 0; i < 3; i++) c[i].next = &c[i + 1];
    ck_assert_ptr_eq(conn_pick_idle(&c[0], NULL), &c[2]); /* 1 is busy, 3 is closing */
    ck_assert_ptr_eq(conn_pick_idle(&c[0], &c[2]), &c[0]);
    c[0].req = c[2].req = &busy;
    ck_assert_ptr_null(conn_pick_idle(&c[0], NULL)); /* none idle */
}
END_TEST

/* ---- /metrics ------------------------------------------------------------ */

static int has_line(const char *page, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = page; (p = strstr(p, line)) != NULL; p++)
        if ((p == page || p[-1] == '\n') && p[n] == '\n') return 1;
    return 0;
}

START_TEST(met_render_counters_and_histograms_prometheus)
{
    http_metrics m;   /* the HTTP layer's counters */
    cmpl_metrics api; /* the API layer's */
    met_init(&m, &api);
    met_count_request(&m, "/health", 200, 0);
    met_count_request(&m, "/health", 200, 0);
    met_count_request(&m, "/v1/completions", 429, 0);
    met_count_request(&m, "/nowhere", 418, 1);
    met_count_request(&m, "/v1/models/gpt2", 200, 0);
    met_count_request(&m, "/v1/models/other", 503, 0);
    met_count_request(&m, "/v1/completions", 403, 0);
    met_count_request(&m, "/v1/chat/completions", 204, 0);
    met_count_request(&m, "/v1/responses", 200, 0);
    met_count_request(&m, "/v1/responses/resp_1", 404, 0);
    met_count_request(&m, "/v1/responses/resp_2/input_items", 404, 0);
    met_count_request(&m, "/v1/responses/", 404, 0); /* no id: another route */
    met_observe(&api.ttft, 0.003);
    met_observe(&api.ttft, 0.2);
    met_observe(&api.ttft, 1000); /* past the last bucket: only +Inf */
    m.prompt_tokens = 7;
    eng_sched_stats st[2]; /* one checkpoint's, then a second's */
    memset(st, 0, sizeof st);
    st[0].running = 3;
    st[0].kv_blocks_total = 99;
    st[0].spec_drafted[ENG_DRAFT_PREDICTION] = 5;
    st[1].running = 4;
    st[1].spec_accepted_at[ENG_DRAFT_MODEL][2] = 6;
    const char *names[2] = {"gpt2", "tiny\"x"};
    uint64_t reqs[2] = {11, 12};
    size_t wbytes[2] = {500, 7};
    char *page;
    size_t len;
    met_info info = {.version = "1.2.3",
                     .commit = "abc\"d",
                     .buildtype = "release",
                     .kernels = "avx2",
                     .tls = "gnutls",
                     .dtype = "bf16",
                     .layout = "panel64",
                     .model = "gpt2",
                     .start_time = 1e9,
                     .cpu_seconds = 2.5,
                     .resident_bytes = 4096,
                     .virtual_bytes = -1, /* unknown: left out */
                     .open_fds = 7,
                     .max_fds = 1024,
                     .nmodels = 1,
                     .model_name = names,
                     .model_stats = st,
                     .model_requests = reqs,
                     .model_weight_bytes = wbytes};
    ck_assert_int_eq(met_render(&m, &api, &info, &page, &len), 0);
    ck_assert_uint_eq(strlen(page), len);
    ck_assert(has_line(page, "gpt2d_requests_total{route=\"/health\",status=\"200\"} 2"));
    ck_assert(has_line(page, "gpt2d_requests_total{route=\"/v1/completions\",status=\"429\"} 1"));
    ck_assert(has_line(page, "gpt2d_requests_total{route=\"other\",status=\"other\"} 1"));
    ck_assert(has_line(page, "gpt2d_requests_total{route=\"/v1/completions\",status=\"403\"} 1"));
    ck_assert(
        has_line(page, "gpt2d_requests_total{route=\"/v1/chat/completions\",status=\"204\"} 1"));
    ck_assert(has_line(page, "gpt2d_requests_total{route=\"/v1/models/{id}\",status=\"200\"} 1"));
    ck_assert(has_line(page, "gpt2d_requests_total{route=\"/v1/responses\",status=\"200\"} 1"));
    ck_assert(
        has_line(page, "gpt2d_requests_total{route=\"/v1/responses/{id}\",status=\"404\"} 2"));
    ck_assert(has_line(page, "gpt2d_requests_total{route=\"other\",status=\"404\"} 1"));
    ck_assert(has_line(page, "gpt2d_requests_total{route=\"/v1/models/{id}\",status=\"503\"} 1"));
    ck_assert(!strstr(page, "status=\"405\"")); /* zero counts are not printed */
    ck_assert(has_line(page, "# TYPE gpt2d_time_to_first_token_seconds histogram"));
    /* Buckets are cumulative. */
    ck_assert(has_line(page, "gpt2d_time_to_first_token_seconds_bucket{le=\"0.005\"} 1"));
    ck_assert(has_line(page, "gpt2d_time_to_first_token_seconds_bucket{le=\"0.1\"} 1"));
    ck_assert(has_line(page, "gpt2d_time_to_first_token_seconds_bucket{le=\"0.25\"} 2"));
    ck_assert(has_line(page, "gpt2d_time_to_first_token_seconds_bucket{le=\"120\"} 2"));
    ck_assert(has_line(page, "gpt2d_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3"));
    ck_assert(has_line(page, "gpt2d_time_to_first_token_seconds_count 3"));
    ck_assert(has_line(page, "gpt2d_time_to_first_token_seconds_sum 1000.203000"));
    ck_assert(has_line(page, "gpt2d_step_batch_rows_bucket{le=\"8192\"} 0"));
    ck_assert(has_line(page, "gpt2d_requests_aborted_total 1"));
    ck_assert(has_line(page, "gpt2d_prompt_tokens_total 7"));
    ck_assert(has_line(page, "gpt2d_running_sequences 3"));
    ck_assert(has_line(page, "gpt2d_kv_blocks_capacity 99"));
    /* Every family has HELP and TYPE; only counters end in _total. */
    ck_assert(has_line(page, "# TYPE gpt2d_kv_blocks_capacity gauge"));
    ck_assert(has_line(page, "# HELP gpt2d_queued_requests Requests waiting for admission."));
    ck_assert(has_line(page, "gpt2d_build_info{version=\"1.2.3\",commit=\"abc\\\"d\","
                             "buildtype=\"release\",kernels=\"avx2\",dtype=\"bf16\","
                             "layout=\"panel64\",model=\"gpt2\",tls=\"gnutls\"} 1"));
    ck_assert(has_line(page, "process_cpu_seconds_total 2.500000"));
    ck_assert(has_line(page, "# TYPE process_cpu_seconds_total counter"));
    ck_assert(has_line(page, "process_resident_memory_bytes 4096.000000"));
    ck_assert(has_line(page, "process_start_time_seconds 1000000000.000000"));
    ck_assert(strstr(page, "process_virtual_memory_bytes") == NULL);
    for (const char *p = page; (p = strstr(p, "# TYPE ")) != NULL; p++) {
        char name[128], type[32];
        ck_assert_int_eq(sscanf(p, "# TYPE %127s %31s", name, type), 2);
        size_t n = strlen(name);
        int total = n > 6 && strcmp(name + n - 6, "_total") == 0;
        ck_assert_msg(total == (strcmp(type, "counter") == 0), "%s is a %s", name, type);
        char help[160];
        snprintf(help, sizeof help, "# HELP %s ", name);
        ck_assert_msg(strstr(page, help) != NULL, "%s has no HELP", name);
    }
    ck_assert_int_eq(page[len - 1], '\n');
    /* One checkpoint: the scheduler's families without a model label (the
     * page a single-model server always had); the per-model ones with it. */
    ck_assert(has_line(page, "gpt2d_spec_drafted_tokens_total{drafter=\"prediction\"} 5"));
    ck_assert(has_line(page, "gpt2d_model_requests_total{model=\"gpt2\"} 11"));
    ck_assert(has_line(page, "gpt2d_model_weight_bytes{model=\"gpt2\"} 500"));
    free(page);
    /* Two: every scheduler family by model, the second's name escaped. */
    info.nmodels = 2;
    ck_assert_int_eq(met_render(&m, &api, &info, &page, &len), 0);
    ck_assert(has_line(page, "gpt2d_running_sequences{model=\"gpt2\"} 3"));
    ck_assert(has_line(page, "gpt2d_running_sequences{model=\"tiny\\\"x\"} 4"));
    ck_assert(has_line(page, "gpt2d_kv_blocks_capacity{model=\"gpt2\"} 99"));
    ck_assert(has_line(page, "gpt2d_last_step_seconds{model=\"gpt2\"} 0.000000"));
    ck_assert(has_line(page, "gpt2d_spec_drafted_tokens_total{model=\"gpt2\",drafter="
                             "\"prediction\"} 5"));
    ck_assert(has_line(page, "gpt2d_spec_position_accepted_total{model=\"tiny\\\"x\","
                             "drafter=\"draft_model\",position=\"2\"} 6"));
    ck_assert(has_line(page, "gpt2d_model_requests_total{model=\"tiny\\\"x\"} 12"));
    ck_assert(strstr(page, "\ngpt2d_running_sequences ") == NULL);
    ck_assert(has_line(page, "# TYPE gpt2d_running_sequences gauge")); /* once */
    ck_assert_ptr_eq(strstr(strstr(page, "# TYPE gpt2d_running_sequences") + 1,
                            "# TYPE gpt2d_running_sequences"),
                     NULL);
    free(page);
}
END_TEST

/* ---- The lifecycle: the model file's identity, the configuration ---------- */

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(srv_file_id_same_changes_in_place_rename_and_delete_differ)
{
    char dir[64];
    mkdtemp_template(dir, sizeof dir, "/tmp/gpt2d-unit-");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[128], other[128];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(other, sizeof other, "%s/new.safetensors", dir);
    write_file(path, "0123456789");
    srv_file_id a, b;
    srv_file_id_get(path, &a);
    ck_assert_int_eq(a.exists, 1);
    ck_assert_uint_eq(a.size, 10);
    srv_file_id_get(path, &b);
    ck_assert(srv_file_id_same(&a, &b)); /* read twice: the same */
    /* Rewritten in place with the same size: only the time tells. */
    struct timespec times[2] = {{0, UTIME_OMIT}, {(time_t)a.mtime_s + 5, 0}};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, times, 0), 0);
    srv_file_id_get(path, &b);
    ck_assert(!srv_file_id_same(&a, &b));
    ck_assert_uint_eq(b.ino, a.ino);
    srv_file_id_get(path, &a);
    ck_assert_int_eq(truncate(path, 4), 0); /* shrunk */
    srv_file_id_get(path, &b);
    ck_assert(!srv_file_id_same(&a, &b));
    ck_assert_uint_eq(b.size, 4);
    srv_file_id_get(path, &a);
    write_file(other, "0123"); /* the safe way: a new file renamed over it */
    struct timespec same[2] = {{0, UTIME_OMIT}, {(time_t)a.mtime_s, (long)a.mtime_ns}};
    ck_assert_int_eq(utimensat(AT_FDCWD, other, same, 0), 0);
    ck_assert_int_eq(rename(other, path), 0);
    srv_file_id_get(path, &b);
    ck_assert(!srv_file_id_same(&a, &b)); /* same size and time, another inode */
    ck_assert_uint_ne(b.ino, a.ino);
    ck_assert_int_eq(unlink(path), 0);
    srv_file_id_get(path, &a);
    ck_assert_int_eq(a.exists, 0);
    ck_assert(!srv_file_id_same(&a, &b));
    rmdir(dir);
}
END_TEST

/* An empty configuration file of the test's own, its name into path. */
static void conf_file_new(char *path, size_t len)
{
    mkdtemp_template(path, len, "/tmp/gpt2d-unit-conf-");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
}

START_TEST(srv_config_read_file_then_options_and_bad_files_refused)
{
    char path[48];
    conf_file_new(path, sizeof path);
    write_file(path, "model = /m\nmax_queue = 3\napi_key = file-key-123\n");
    char *argv[] = {"serve", "--config", path, "--max-queue", "5"};
    cfg_config c;
    char err[512];
    ck_assert_msg(srv_config_read(&c, 5, argv, err, sizeof err) == CFG_OK, "%s", err);
    ck_assert_uint_eq(c.max_queue, 5); /* the command line wins */
    ck_assert_str_eq(c.api_keys[0], "file-key-123");
    ck_assert_str_eq(c.model_dir, "/m");
    write_file(path, "model = /m\napi_key =\n");
    ck_assert_int_eq(srv_config_read(&c, 3, argv, err, sizeof err), CFG_EVALUE);
    char where[128];
    snprintf(where, sizeof where, "%s:2: api_key is empty", path);
    ck_assert_msg(strstr(err, where) != NULL, "'%s' lacks '%s'", err, where);
    unlink(path);
}
END_TEST

/* srv_fd_fit under this process's own soft limit, set for the test
 * (lowering it needs no privilege) and restored. */
START_TEST(srv_fd_fit_leaves_room_for_headroom_and_reserve)
{
    struct rlimit saved, rl;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &saved), 0);
    static const struct {
        rlim_t soft;
        size_t want, fits;
    } cases[] = {
        {256, 1024, 128}, /* 256 - 64 past max_connections - 64 of its own */
        {256, 100, 100},  {1152, 1024, 1024}, {1151, 1024, 1023}, {129, 1024, 1}, {128, 1024, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < cases[i].soft) continue;
        rl.rlim_cur = cases[i].soft;
        rl.rlim_max = saved.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) continue; /* valgrind keeps its own */
        ck_assert_uint_eq(srv_fd_fit(cases[i].want), cases[i].fits);
    }
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &saved), 0);
}
END_TEST

START_TEST(srv_config_read_refuses_a_bad_tls_priorities)
{
    char path[48];
    conf_file_new(path, sizeof path);
    char *argv[] = {"serve", "--config", path};
    cfg_config c;
    char err[512];
    write_file(path, "model = /m\ntls_priorities = NORMAL:-VERS-ALL:+VERS-TLS1.3\n");
    ck_assert_msg(srv_config_read(&c, 3, argv, err, sizeof err) == CFG_OK, "%s", err);
    ck_assert_str_eq(c.tls_priorities, "NORMAL:-VERS-ALL:+VERS-TLS1.3");
    write_file(path, "model = /m\ntls_priorities = NORMAL:+VERS-BOGUS\n");
    cfg_status st = srv_config_read(&c, 3, argv, err, sizeof err);
    if (tls_built()) { /* GnuTLS parses it; a build without serves no HTTPS */
        ck_assert_int_eq(st, CFG_EVALUE);
        ck_assert_msg(strstr(err, "tls_priorities 'NORMAL:+VERS-BOGUS'") != NULL, "%s", err);
    }
    unlink(path);
}
END_TEST

/* ---- Stored responses (api/resp_store.c) ------------------------------------ */

/* An entry of about `bytes` bytes (its output's text), owned by owner,
 * continuing parent (NULL: none), counted by st. */
static rs_entry *entry_after(resp_store *st, const char *id, uint64_t owner, size_t bytes,
                             rs_turns *parent, size_t chain_max)
{
    char *text = malloc(bytes + 1);
    ck_assert_ptr_nonnull(text);
    memset(text, 'x', bytes);
    text[bytes] = '\0';
    rs_msg m[2] = {{.role = OAI_ROLE_USER, .text = "hi", .len = 2},
                   {.role = OAI_ROLE_ASSISTANT, .text = text, .len = bytes}};
    rs_turns *t = rs_turns_new(st, owner, parent, m, 2, chain_max);
    free(text);
    ck_assert_ptr_nonnull(t);
    json_t *resp = json_pack("{s:s}", "id", id);
    rs_entry *e = rs_entry_new(id, owner, resp, t, 1);
    json_decref(resp);
    ck_assert_ptr_nonnull(e);
    return e;
}

static rs_entry *entry_in(resp_store *st, const char *id, uint64_t owner, size_t bytes)
{
    return entry_after(st, id, owner, bytes, NULL, SIZE_MAX);
}

/* The count bound: the least recently used (put or got) goes first. */
START_TEST(rs_count_bound_evicts_least_recently_used)
{
    resp_store *st = rs_new();
    ck_assert_ptr_nonnull(st);
    char id[16];
    for (int i = 0; i < 3; i++) {
        snprintf(id, sizeof id, "resp_%d", i);
        ck_assert_int_eq(rs_put(st, entry_in(st, id, 0, 10), 3, 1u << 20), 1);
    }
    ck_assert_ptr_nonnull(rs_get(st, "resp_0", 0)); /* now the most recent */
    ck_assert_int_eq(rs_put(st, entry_in(st, "resp_3", 0, 10), 3, 1u << 20), 1);
    ck_assert_uint_eq(rs_count(st), 3);
    ck_assert_ptr_null(rs_get(st, "resp_1", 0));
    ck_assert_ptr_nonnull(rs_get(st, "resp_0", 0));
    ck_assert_ptr_nonnull(rs_get(st, "resp_2", 0));
    ck_assert_ptr_nonnull(rs_get(st, "resp_3", 0));
    /* A lower bound (a reload) applies at the next put. */
    ck_assert_int_eq(rs_put(st, entry_in(st, "resp_4", 0, 10), 1, 1u << 20), 1);
    ck_assert_uint_eq(rs_count(st), 1);
    ck_assert_ptr_nonnull(rs_get(st, "resp_4", 0));
    /* 0: nothing kept, the new one nor those before (the store turned off
     * by a reload). */
    ck_assert_int_eq(rs_put(st, entry_in(st, "resp_5", 0, 10), 0, 1u << 20), 0);
    ck_assert_ptr_null(rs_get(st, "resp_4", 0));
    ck_assert_uint_eq(rs_count(st), 0);
    ck_assert_uint_eq(rs_bytes(st), 0);
    /* rs_trim: lowered bounds without a put, least recently used first. */
    for (int i = 0; i < 3; i++) {
        snprintf(id, sizeof id, "resp_%d", i);
        ck_assert_int_eq(rs_put(st, entry_in(st, id, 0, 10), 3, 1u << 20), 1);
    }
    ck_assert_ptr_nonnull(rs_get(st, "resp_0", 0));
    ck_assert_uint_eq(rs_trim(st, 3, 1u << 20), 0);
    ck_assert_uint_eq(rs_trim(st, 1, 1u << 20), 2);
    ck_assert_ptr_nonnull(rs_get(st, "resp_0", 0));
    ck_assert_uint_eq(rs_trim(NULL, 0, 0), 0);
    rs_free(st);
    rs_free(NULL);
}
END_TEST

/* The bytes bound: entries go until the new one fits; one larger than the
 * bound alone is refused and evicts nothing. */
START_TEST(rs_bytes_bound)
{
    resp_store *st = rs_new();
    ck_assert_int_eq(rs_put(st, entry_in(st, "a", 0, 3000), 100, 10000), 1);
    ck_assert_int_eq(rs_put(st, entry_in(st, "b", 0, 3000), 100, 10000), 1);
    size_t two = rs_bytes(st);
    ck_assert_uint_ge(two, 6000);
    ck_assert_int_eq(rs_put(st, entry_in(st, "big", 0, 20000), 100, 10000), 0);
    ck_assert_uint_eq(rs_bytes(st), two);
    ck_assert_int_eq(rs_put(st, entry_in(st, "c", 0, 5000), 100, 10000), 1);
    ck_assert_ptr_null(rs_get(st, "a", 0)); /* the oldest went */
    ck_assert_ptr_nonnull(rs_get(st, "b", 0));
    ck_assert_ptr_nonnull(rs_get(st, "c", 0));
    ck_assert_uint_le(rs_bytes(st), 10000);
    ck_assert_int_eq(rs_delete(st, "b", 0), 0);
    ck_assert_int_eq(rs_delete(st, "b", 0), -1);
    ck_assert_uint_eq(rs_count(st), 1);
    rs_free(st);
}
END_TEST

/* An entry is its owner's: another owner finds nothing and deletes nothing. */
START_TEST(rs_owner_only)
{
    resp_store *st = rs_new();
    ck_assert_int_eq(rs_put(st, entry_in(st, "resp_x", 7, 10), 10, 1u << 20), 1);
    ck_assert_ptr_null(rs_get(st, "resp_x", 8));
    ck_assert_ptr_null(rs_get(st, "resp_x", 0));
    ck_assert_int_eq(rs_delete(st, "resp_x", 8), -1);
    ck_assert_ptr_nonnull(rs_get(st, "resp_x", 7));
    ck_assert_ptr_null(rs_get(NULL, "resp_x", 7)); /* no store yet */
    /* Many ids: the hash chains find each. */
    char id[24];
    for (int i = 0; i < 5000; i++) {
        snprintf(id, sizeof id, "resp_%08x", i);
        ck_assert_int_eq(rs_put(st, entry_in(st, id, 7, 1), 10000, 1u << 30), 1);
    }
    for (int i = 0; i < 5000; i += 97) {
        snprintf(id, sizeof id, "resp_%08x", i);
        ck_assert_ptr_nonnull(rs_get(st, id, 7));
    }
    rs_free(st);
}
END_TEST

/* The keys share the bounds: a key storing past its fair share evicts its
 * own least recently used, never another key's within its share. */
START_TEST(rs_keys_share_fairly)
{
    resp_store *st = rs_new();
    char id[24];
    ck_assert_int_eq(rs_put(st, entry_in(st, "resp_a", 1, 10), 50, 1u << 30), 1);
    for (int i = 0; i < 200; i++) {
        snprintf(id, sizeof id, "resp_b%d", i);
        ck_assert_int_eq(rs_put(st, entry_in(st, id, 2, 10), 50, 1u << 30), 1);
    }
    ck_assert_ptr_nonnull(rs_get(st, "resp_a", 1));
    ck_assert_uint_eq(rs_count(st), 50);
    ck_assert_ptr_nonnull(rs_get(st, "resp_b199", 2));
    ck_assert_ptr_null(rs_get(st, "resp_b150", 2)); /* its own oldest went */
    /* A key under its share that needs room takes it from the key over
     * its share: key 3's first put evicts key 2's oldest, not key 1's. */
    ck_assert_int_eq(rs_put(st, entry_in(st, "resp_c", 3, 10), 50, 1u << 30), 1);
    ck_assert_ptr_nonnull(rs_get(st, "resp_a", 1));
    ck_assert_ptr_nonnull(rs_get(st, "resp_c", 3));
    ck_assert_uint_eq(rs_count(st), 50);
    /* The bytes bound alike: key 2's big entries evict key 2's. */
    size_t cap = rs_bytes(st) + 40000;
    for (int i = 0; i < 40; i++) {
        snprintf(id, sizeof id, "resp_big%d", i);
        ck_assert_int_eq(rs_put(st, entry_in(st, id, 2, 4000), 50, cap), 1);
        ck_assert_uint_le(rs_bytes(st), cap);
    }
    ck_assert_ptr_nonnull(rs_get(st, "resp_a", 1));
    ck_assert_ptr_nonnull(rs_get(st, "resp_c", 3));
    /* A trim (bounds lowered) takes from the key furthest over. */
    rs_trim(st, 3, cap);
    ck_assert_uint_eq(rs_count(st), 3);
    ck_assert_ptr_nonnull(rs_get(st, "resp_a", 1));
    ck_assert_ptr_nonnull(rs_get(st, "resp_c", 3));
    rs_free(st);

    /* A key with nothing stored whose one entry is over its share, in a
     * store that must make room for it, is not kept: it takes nothing from
     * a key within its share. */
    st = rs_new();
    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof id, "resp_b%d", i);
        ck_assert_int_eq(rs_put(st, entry_in(st, id, 2, 1000), 50, 200000), 1);
    }
    ck_assert_int_eq(rs_put(st, entry_in(st, "resp_big", 1, 196000), 50, 200000), 0);
    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof id, "resp_b%d", i);
        ck_assert_ptr_nonnull(rs_get(st, id, 2));
    }
    /* Within its share it is kept, and the key over its share gives way. */
    ck_assert_int_eq(rs_put(st, entry_in(st, "resp_fit", 1, 90000), 50, 200000), 1);
    ck_assert_uint_eq(rs_count(st), 6);
    rs_free(st);
}
END_TEST

/* A conversation is held once: a chain's nodes share their history (each
 * node's bytes counted once), an evicted entry's node lives while a later
 * one continues it, and a chain past its bound keeps only its newest
 * messages, copied. */
START_TEST(rs_chain_shared_and_bounded)
{
    resp_store *st = rs_new();
    rs_entry *e = entry_in(st, "resp_0", 5, 1000);
    rs_turns *first = e->turns;
    ck_assert_int_eq(rs_put(st, e, 100, 1u << 30), 1);
    size_t one = rs_bytes(st);
    char id[24];
    rs_turns *parent = first;
    for (int i = 1; i < 10; i++) {
        snprintf(id, sizeof id, "resp_%d", i);
        e = entry_after(st, id, 5, 1000, parent, SIZE_MAX);
        ck_assert_ptr_eq(e->turns->parent, parent);
        ck_assert_uint_eq(e->turns->chain_msgs, 2 * (size_t)(i + 1));
        ck_assert_int_eq(rs_put(st, e, 100, 1u << 30), 1);
        parent = e->turns;
    }
    /* Ten entries, each with its own 1000 bytes once: not the 55 copies a
     * copy per request would hold. */
    ck_assert_uint_le(rs_bytes(st), 10 * one + 10 * 64);
    ck_assert_uint_ge(rs_bytes(st), 10 * 1000);
    /* A request's reference keeps a node after its entry went. */
    rs_turns *held = rs_turns_ref(first);
    ck_assert_int_eq(rs_delete(st, "resp_0", 5), 0);
    ck_assert_ptr_eq(rs_get(st, "resp_1", 5)->turns->parent, first);
    ck_assert_str_eq(first->msg[1].text + 990, "xxxxxxxxxx");
    /* The chain's bound: 9000 bytes; the next node passes it and keeps the
     * newest messages that fit in 4500, and no parent. */
    e = entry_after(st, "resp_10", 5, 1000, parent, 9000);
    ck_assert_ptr_null(e->turns->parent);
    ck_assert_uint_le(e->turns->chain_bytes, 9000);
    ck_assert_uint_ge(e->turns->n, 4); /* some history, then its own two */
    ck_assert_str_eq(e->turns->msg[e->turns->n - 2].text, "hi");
    ck_assert_uint_eq(e->turns->msg[e->turns->n - 3].len, 1000); /* resp_9's output */
    ck_assert_int_eq(rs_put(st, e, 100, 1u << 30), 1);
    /* Lowered bounds free the chain once nothing refers to it. */
    rs_trim(st, 0, 1u << 30);
    ck_assert_uint_eq(rs_count(st), 0);
    ck_assert_uint_ge(rs_bytes(st), first->bytes); /* the request's node */
    rs_turns_unref(held);
    ck_assert_uint_eq(rs_bytes(st), 0);
    /* A node a request holds when the store goes is freed after it. */
    e = entry_in(st, "resp_x", 5, 10);
    held = rs_turns_ref(e->turns);
    ck_assert_int_eq(rs_put(st, e, 100, 1u << 30), 1);
    rs_free(st);
    ck_assert_ptr_null(held->st);
    rs_turns_unref(held);
}
END_TEST

/* glibc's own heap (a sanitizer's allocator reports nothing in mallinfo2:
 * there the bound of rs_bytes_bound and the hostile cases hold it). */
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
#include <malloc.h>
/* What the store counts is what it holds: many small messages (the case a
 * count of the text alone undercounts tenfold) and a few large ones,
 * against the heap the allocator reports in use. */
START_TEST(rs_counted_bytes_match_heap)
{
    struct mallinfo2 before = mallinfo2();
    resp_store *st = rs_new();
    enum { N = 30, MSGS = 3000 };
    rs_msg *m = malloc(MSGS * sizeof *m);
    for (int i = 0; i < MSGS; i++) m[i] = (rs_msg){.role = OAI_ROLE_USER, .text = "a", .len = 1};
    char id[24];
    for (int k = 0; k < N; k++) {
        rs_turns *t = rs_turns_new(st, 9, NULL, m, MSGS, SIZE_MAX);
        json_t *resp = json_pack("{s:s, s:s}", "id", "resp", "output_text", "some reply text");
        snprintf(id, sizeof id, "resp_%d", k);
        ck_assert_int_eq(rs_put(st, rs_entry_new(id, 9, resp, t, MSGS - 1), 1000, 1u << 30), 1);
        json_decref(resp);
    }
    for (int k = 0; k < 20; k++) {
        rs_msg big[2] = {{.role = OAI_ROLE_USER, .text = "q", .len = 1},
                         {.role = OAI_ROLE_ASSISTANT, .len = 200000}};
        char *text = calloc(200001, 1);
        memset(text, 'y', 200000);
        big[1].text = text;
        rs_turns *t = rs_turns_new(st, 9, NULL, big, 2, SIZE_MAX);
        free(text);
        json_t *resp = json_pack("{s:s}", "id", "resp");
        snprintf(id, sizeof id, "resp_big%d", k);
        ck_assert_int_eq(rs_put(st, rs_entry_new(id, 9, resp, t, 1), 1000, 1u << 30), 1);
        json_decref(resp);
    }
    free(m);
    struct mallinfo2 after = mallinfo2();
    size_t heap = after.uordblks + after.hblkhd - before.uordblks - before.hblkhd;
    size_t counted = rs_bytes(st);
    /* Within 1.5x either way. */
    ck_assert_msg(heap <= counted * 3 / 2 && counted <= heap * 3 / 2,
                  "counted %zu bytes, the heap grew %zu", counted, heap);
    rs_free(st);
}
END_TEST
#endif

int main(void)
{
    Suite *s = suite_create("server");
    TCase *tc = tcase_create("router");
    tcase_add_test(tc, http_route_find_known_route_found);
    tcase_add_test(tc, http_route_find_other_method_bad_method);
    tcase_add_test(tc, http_route_find_unknown_path_not_found);
    tcase_add_test(tc, http_route_find_prefix_entry_matches_longer_paths);
    tcase_add_test(tc, http_route_find_head_finds_get);
    tcase_add_test(tc, http_origin_same_host_ip_or_localhost_only);
    tcase_add_test(tc, http_route_allow_lists_methods_head_options);
    tcase_add_test(tc, http_request_id_ok_sane_ids_only);
    tcase_add_test(tc, http_origin_allowed_list_star_and_empty);
    tcase_add_test(tc, http_key_ok_no_keys_open);
    tcase_add_test(tc, http_key_ok_configured_key_accepted);
    tcase_add_test(tc, http_key_ok_wrong_key_refused);
    tcase_add_test(tc, http_key_ok_names_the_matched_key);
    tcase_add_test(tc, http_siphash_reference_vectors);
    tcase_add_test(tc, http_key_salt_per_key_per_secret_never_zero);
    tcase_add_test(tc, http_host_allowed_loopback_default_and_list);
    suite_add_tcase(s, tc);
    tc = tcase_create("log");
    tcase_add_test(tc, log_escape_controls_and_bad_utf8_escaped);
    tcase_add_test(tc, log_escape_printable_and_utf8_kept);
    tcase_add_test(tc, log_escape_line_and_bidi_controls_escaped);
    tcase_add_test(tc, log_escape_short_buffer_never_splits);
    suite_add_tcase(s, tc);
    tc = tcase_create("status");
    tcase_add_test(tc, http_status_of_engine_statuses_mapped);
    tcase_add_test(tc, http_status_of_tokenizer_and_config_mapped);
    tcase_add_test(tc, http_status_of_unknown_status_server_error);
    suite_add_tcase(s, tc);
    tc = tcase_create("state");
    tcase_add_test(tc, http_state_legal_request_paths_legal);
    tcase_add_test(tc, http_state_legal_backwards_and_after_end_illegal);
    tcase_add_test(tc, http_req_set_state_legal_moves);
#ifndef NDEBUG
    tcase_add_test_raise_signal(tc, http_req_set_state_illegal_aborts, SIGABRT);
#endif
    suite_add_tcase(s, tc);
    tc = tcase_create("completions");
    tcase_add_test(tc, cmpl_rank_best_of_highest_mean_first);
    tcase_add_test(tc, cmpl_rank_ties_keep_order);
    tcase_add_test(tc, cmpl_seed_own_kept_else_keyed_counter);
    tcase_add_test(tc, sse_over_limit_backlog_bound);
    suite_add_tcase(s, tc);
    tc = tcase_create("lifecycle");
    tcase_add_test(tc, srv_file_id_same_changes_in_place_rename_and_delete_differ);
    tcase_add_test(tc, srv_config_read_file_then_options_and_bad_files_refused);
    tcase_add_test(tc, srv_config_read_refuses_a_bad_tls_priorities);
    tcase_add_test(tc, srv_fd_fit_leaves_room_for_headroom_and_reserve);
    suite_add_tcase(s, tc);
    tc = tcase_create("conn");
    tcase_add_test(tc, conn_deadline_of_each_phase_its_timeout);
    tcase_add_test(tc, conn_note_recv_byte_after_answer_starts_head);
    tcase_add_test(tc, conn_pick_idle_oldest_without_request);
    suite_add_tcase(s, tc);
    tc = tcase_create("resp_store");
    tcase_add_test(tc, rs_count_bound_evicts_least_recently_used);
    tcase_add_test(tc, rs_bytes_bound);
    tcase_add_test(tc, rs_owner_only);
    tcase_add_test(tc, rs_keys_share_fairly);
    tcase_add_test(tc, rs_chain_shared_and_bounded);
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
    tcase_add_test(tc, rs_counted_bytes_match_heap);
#endif
    suite_add_tcase(s, tc);
    tc = tcase_create("metrics");
    tcase_add_test(tc, met_render_counters_and_histograms_prometheus);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
