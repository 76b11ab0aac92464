/* tests/test_config.c: config/ (defaults < file < command line). */
#include "config.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

static char path[256];

static void write_conf(const char *text)
{
    mkdtemp_template(path, sizeof path, "/tmp/gpt2d-test-cfg-");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static void drop_conf(void)
{
    unlink(path);
}

START_TEST(cfg_defaults_are_the_documented_ones)
{
    cfg_config c;
    cfg_defaults(&c);
    ck_assert_str_eq(c.host, "127.0.0.1");
    ck_assert_uint_eq(c.port, 8080);
    ck_assert_str_eq(c.model_name, "gpt2");
    ck_assert_uint_eq(c.max_queue, 256);
    ck_assert_uint_eq(c.n_api_keys, 0);
    ck_assert_int_eq(c.auth_open_health, 1);
    ck_assert_int_eq(c.prefix_cache, 1);
    ck_assert(c.shutdown_timeout_s == 30.0);
    ck_assert_str_eq(c.log_level, "info");
    ck_assert_str_eq(c.cors_origins, "");
    ck_assert_uint_eq(c.max_connections_per_ip, 512);
    ck_assert_str_eq(c.trusted_proxies, "127.0.0.0/8, ::1");
    ck_assert_uint_eq(c.n_trusted_nets, 2);
    ck_assert_str_eq(c.allowed_hosts, "");
}
END_TEST

START_TEST(cfg_print_defaults_reads_back_to_the_defaults)
{
    char *buf;
    size_t len;
    FILE *mem = open_memstream(&buf, &len);
    cfg_print_defaults(mem);
    fclose(mem);
    write_conf(buf);
    free(buf);
    cfg_config a, b;
    cfg_defaults(&a);
    memset(&b, 0x5A, sizeof b);
    cfg_defaults(&b);
    char err[256];
    ck_assert_msg(cfg_load_file(&b, path, err, sizeof err) == CFG_OK, "%s", err);
    ck_assert_mem_eq(&a, &b, sizeof a);
    drop_conf();
}
END_TEST

START_TEST(cfg_load_file_reads_keys_comments_and_quotes)
{
    write_conf("# a comment\n\n  port = 9001  \r\nhost=\"0.0.0.0\"\nmax_queue = 3\n"
               "api_key = secret-key-1\napi_key = secret-key-2\nqueue_timeout = 2.5\n"
               "auth_open_health = false\nmodel = /srv/models/gpt2\n");
    cfg_config c;
    cfg_defaults(&c);
    char err[256];
    ck_assert_msg(cfg_load_file(&c, path, err, sizeof err) == CFG_OK, "%s", err);
    ck_assert_uint_eq(c.port, 9001);
    ck_assert_str_eq(c.host, "0.0.0.0");
    ck_assert_uint_eq(c.max_queue, 3);
    ck_assert_uint_eq(c.n_api_keys, 2);
    ck_assert_str_eq(c.api_keys[1], "secret-key-2");
    ck_assert(c.queue_timeout_s == 2.5);
    ck_assert_int_eq(c.auth_open_health, 0);
    ck_assert_str_eq(c.model_dir, "/srv/models/gpt2");
    drop_conf();
}
END_TEST

static const struct {
    const char *text;
    cfg_status status;
    const char *words;
} bad_files[] = {
    {"port = 8080\nbogus = 1\n", CFG_EKEY, ":2: unknown key 'bogus'"},
    {"port = 70000\n", CFG_EVALUE, ":1: port must be a number from 0 to 65535, not '70000'"},
    {"port = -1\n", CFG_EVALUE, "port must be a number"},
    {"max_queue = 1e3\n", CFG_EVALUE, "max_queue"},
    {"max_running = 0\n", CFG_EVALUE, "max_running"},
    {"threads = 12abc\n", CFG_EVALUE, "threads"},
    {"queue_timeout = nan\n", CFG_EVALUE, "queue_timeout"},
    {"auth_open_health = maybe\n", CFG_EVALUE, "true or false"},
    {"log_level = loud\n", CFG_EVALUE, "error, warn, info or debug"},
    {"api_key = short\n", CFG_EVALUE, "8 to"},
    {"api_key = has space\n", CFG_EVALUE, "printable ASCII without spaces"},
    {"log_level = info\napi_key =\n", CFG_EVALUE, ":2: api_key is empty"},
    {"api_key = \"\"\n", CFG_EVALUE, ":1: api_key is empty"},
    {"\n\njust words\n", CFG_ESYNTAX, ":3: expected key = value"},
    {" = 5\n", CFG_ESYNTAX, "missing key"},
};

START_TEST(cfg_load_file_errors_name_the_line)
{
    write_conf(bad_files[_i].text);
    cfg_config c;
    cfg_defaults(&c);
    char err[512];
    ck_assert_int_eq(cfg_load_file(&c, path, err, sizeof err), bad_files[_i].status);
    ck_assert_msg(strstr(err, bad_files[_i].words) != NULL, "'%s' lacks '%s'", err,
                  bad_files[_i].words);
    ck_assert_msg(strstr(err, path) != NULL, "'%s' lacks the file", err);
    drop_conf();
}
END_TEST

START_TEST(cfg_parse_args_defaults_then_file_then_options)
{
    write_conf("port = 9001\nmax_queue = 3\n");
    char *argv[] = {"serve",          "--max-queue=7",
                    "--config",       path,
                    "--host",         "::1",
                    "--model",        "/m",
                    "--max_running",  "8",
                    "--prefix-cache", "false"};
    cfg_config c;
    cfg_defaults(&c);
    char err[256];
    ck_assert_msg(cfg_parse_args(&c, 12, argv, 1, err, sizeof err) == CFG_OK, "%s", err);
    ck_assert_int_eq(c.prefix_cache, 0);
    ck_assert_uint_eq(c.port, 9001);   /* from the file */
    ck_assert_uint_eq(c.max_queue, 3); /* the file came after --max-queue=7 */
    ck_assert_str_eq(c.host, "::1");
    ck_assert_uint_eq(c.max_running, 8);
    ck_assert_int_eq(cfg_validate(&c, err, sizeof err), CFG_OK);
    drop_conf();
}
END_TEST

START_TEST(cfg_parse_args_errors)
{
    cfg_config c;
    cfg_defaults(&c);
    char err[256];
    char *a1[] = {"serve", "--bogus", "1"};
    ck_assert_int_eq(cfg_parse_args(&c, 3, a1, 1, err, sizeof err), CFG_EKEY);
    ck_assert_ptr_nonnull(strstr(err, "unknown option '--bogus'"));
    /* The last option, with no value after it, is still an unknown option. */
    char *a0[] = {"serve", "--foo"};
    ck_assert_int_eq(cfg_parse_args(&c, 2, a0, 1, err, sizeof err), CFG_EKEY);
    ck_assert_str_eq(err, "unknown option '--foo'");
    char *a2[] = {"serve", "--port"};
    ck_assert_int_eq(cfg_parse_args(&c, 2, a2, 1, err, sizeof err), CFG_EVALUE);
    ck_assert_ptr_nonnull(strstr(err, "needs a value"));
    char *a3[] = {"serve", "--port=abc"};
    ck_assert_int_eq(cfg_parse_args(&c, 2, a3, 1, err, sizeof err), CFG_EVALUE);
    ck_assert_ptr_nonnull(strstr(err, "--port: port must be"));
    char *a4[] = {"serve", "stray"};
    ck_assert_int_eq(cfg_parse_args(&c, 2, a4, 1, err, sizeof err), CFG_ESYNTAX);
    char *a6[] = {"serve", "--api-key", ""}; /* would turn authentication off */
    ck_assert_int_eq(cfg_parse_args(&c, 3, a6, 1, err, sizeof err), CFG_EVALUE);
    ck_assert_ptr_nonnull(strstr(err, "--api-key: api_key is empty"));
    ck_assert_uint_eq(c.n_api_keys, 0);
    char *a5[] = {"serve", "--config", "/nonexistent/gpt2d.conf"};
    ck_assert_int_eq(cfg_parse_args(&c, 3, a5, 1, err, sizeof err), CFG_EIO);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/gpt2d.conf"));
}
END_TEST

/* Issue 24's per-request bounds: documented defaults, ranges, reloadable. */
START_TEST(cfg_request_bounds_default_range_and_reload)
{
    cfg_config c;
    cfg_defaults(&c);
    ck_assert_uint_eq(c.max_sequences_per_request, 64);
    ck_assert_uint_eq(c.max_response_bytes, (size_t)4 << 20);
    char err[256];
    char *ok[] = {"serve", "--max-sequences-per-request", "256", "--max-response-bytes=1048576"};
    ck_assert_int_eq(cfg_parse_args(&c, 4, ok, 1, err, sizeof err), CFG_OK);
    ck_assert_uint_eq(c.max_sequences_per_request, 256);
    ck_assert_uint_eq(c.max_response_bytes, 1048576);
    char *zero[] = {"serve", "--max-sequences-per-request", "0"};
    ck_assert_int_eq(cfg_parse_args(&c, 3, zero, 1, err, sizeof err), CFG_EVALUE);
    ck_assert_ptr_nonnull(strstr(err, "max_sequences_per_request"));
    char *tiny[] = {"serve", "--max-response-bytes", "1000"};
    ck_assert_int_eq(cfg_parse_args(&c, 3, tiny, 1, err, sizeof err), CFG_EVALUE);
    ck_assert_ptr_nonnull(strstr(err, "max_response_bytes"));
    ck_assert_int_eq(cfg_key_reloadable("max_sequences_per_request"), 1);
    ck_assert_int_eq(cfg_key_reloadable("max_response_bytes"), 1);
}
END_TEST

/* Issue 26's store bounds: documented defaults (1000 responses, 64 MiB),
 * 0 allowed (nothing kept), ranges named, reloadable. */
START_TEST(cfg_responses_store_bounds)
{
    cfg_config c;
    cfg_defaults(&c);
    ck_assert_uint_eq(c.responses_store_max, 1000);
    ck_assert_uint_eq(c.responses_store_bytes, (size_t)64 << 20);
    char err[256];
    char *ok[] = {"serve", "--responses-store-max", "0", "--responses-store-bytes=4096"};
    ck_assert_int_eq(cfg_parse_args(&c, 4, ok, 1, err, sizeof err), CFG_OK);
    ck_assert_uint_eq(c.responses_store_max, 0);
    ck_assert_uint_eq(c.responses_store_bytes, 4096);
    char *big[] = {"serve", "--responses-store-max", "1000001"};
    ck_assert_int_eq(cfg_parse_args(&c, 3, big, 1, err, sizeof err), CFG_EVALUE);
    ck_assert_ptr_nonnull(strstr(err, "responses_store_max"));
    char *neg[] = {"serve", "--responses-store-bytes", "-1"};
    ck_assert_int_eq(cfg_parse_args(&c, 3, neg, 1, err, sizeof err), CFG_EVALUE);
    ck_assert_ptr_nonnull(strstr(err, "responses_store_bytes"));
    ck_assert_int_eq(cfg_key_reloadable("responses_store_max"), 1);
    ck_assert_int_eq(cfg_key_reloadable("responses_store_bytes"), 1);
}
END_TEST

/* Issue 36: model as a list of checkpoints (cfg_models_split): the first
 * stays model_dir, the others are named by NAME= or their folder, and
 * every refusal names the entry. */
START_TEST(cfg_models_split_entries_and_refusals)
{
    cfg_config *c = calloc(1, sizeof *c);
    ck_assert_ptr_nonnull(c);
    char err[512];
    cfg_defaults(c);
    snprintf(c->model_dir, sizeof c->model_dir, "/srv/gpt2");
    ck_assert_int_eq(cfg_models_split(c, err, sizeof err), CFG_OK);
    ck_assert_str_eq(c->model_dir, "/srv/gpt2");
    ck_assert_uint_eq(c->n_more_models, 0);
    snprintf(c->model_dir, sizeof c->model_dir,
             "  /srv/gpt2 , tiny=/m/a=b , /srv/distilgpt2/ ,rel");
    ck_assert_int_eq(cfg_models_split(c, err, sizeof err), CFG_OK);
    ck_assert_str_eq(c->model_dir, "/srv/gpt2");
    ck_assert_uint_eq(c->n_more_models, 3);
    ck_assert_str_eq(c->more_models[0].name, "tiny");
    ck_assert_str_eq(c->more_models[0].dir, "/m/a=b");
    ck_assert_str_eq(c->more_models[1].name, "distilgpt2");
    ck_assert_str_eq(c->more_models[1].dir, "/srv/distilgpt2/");
    ck_assert_str_eq(c->more_models[2].name, "rel");
    const struct {
        const char *list, *needle;
    } bad[] = {{"/a,", "an empty entry"},
               {"/a,,/b", "an empty entry"},
               {",/b", "the first entry is empty"},
               {"x=/a,/b", "the first checkpoint is named by model_name"},
               {"/a,n=", "'n=' names no folder"},
               {"/a,a b=/x", "'a b' is not a checkpoint's name"},
               {"/a,gpt2=/x", "the name 'gpt2' is taken"},
               {"/a,/x/b,/y/b", "the name 'b' is taken"},
               {"/a,/1,/2,/3,/4,/5,/6,/7,/8", "more than 8 checkpoints"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(c->model_dir, sizeof c->model_dir, "%s", bad[i].list);
        ck_assert_int_eq(cfg_models_split(c, err, sizeof err), CFG_EVALUE);
        ck_assert_msg(strstr(err, bad[i].needle) != NULL && strncmp(err, "model: ", 7) == 0,
                      "%s: %s", bad[i].list, err);
    }
    /* Seven others is the most: eight in all. */
    snprintf(c->model_dir, sizeof c->model_dir, "/a,/1,/2,/3,/4,/5,/6,/7");
    ck_assert_int_eq(cfg_models_split(c, err, sizeof err), CFG_OK);
    ck_assert_uint_eq(c->n_more_models, 7);
    free(c);
}
END_TEST

/* Issue 36: lora_modules' entries, and every refusal naming the entry. */
START_TEST(cfg_lora_modules_parse_entries_and_refusals)
{
    cfg_lora_module m[4];
    size_t n = 9;
    char err[256];
    ck_assert_int_eq(cfg_lora_modules_parse("", m, 4, &n, err, sizeof err), CFG_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(
        cfg_lora_modules_parse(" pirate=/a/b , f.v_2-x=rel/dir,", m, 4, &n, err, sizeof err),
        CFG_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(m[0].name, "pirate");
    ck_assert_str_eq(m[0].dir, "/a/b");
    ck_assert_str_eq(m[1].name, "f.v_2-x");
    ck_assert_str_eq(m[1].dir, "rel/dir");
    const struct {
        const char *list, *needle;
    } bad[] = {{"pirate", "'pirate' is not name=DIR"},
               {"=dir", "'=dir' is not name=DIR"},
               {"pirate=", "'pirate=' is not name=DIR"},
               {"a b=dir", "'a b' is not an adapter name"},
               {"a:b=dir", "'a:b' is not an adapter name"},
               {"a=x,a=y", "'a' is named twice"},
               {"a=1,b=2,c=3,d=4,e=5", "more than 4 adapters (max_loras)"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(cfg_lora_modules_parse(bad[i].list, m, 4, &n, err, sizeof err),
                         CFG_EVALUE);
        ck_assert_msg(strstr(err, bad[i].needle) != NULL && strncmp(err, "lora_modules: ", 14) == 0,
                      "%s: %s", bad[i].list, err);
    }
    ck_assert(cfg_lora_name_ok("pirate"));
    ck_assert(!cfg_lora_name_ok(""));
    ck_assert(!cfg_lora_name_ok("a/b"));
    ck_assert(
        !cfg_lora_name_ok("0123456789012345678901234567890123456789012345678901234567890123"));
    /* cfg_validate: an adapter may not take the model's name, and max_loras
     * bounds the list. */
    cfg_config c;
    cfg_defaults(&c);
    snprintf(c.model_dir, sizeof c.model_dir, "/m");
    ck_assert_int_eq(cfg_set(&c, "lora_modules", "gpt2=/x", "--lora-modules", err, sizeof err),
                     CFG_OK);
    ck_assert_int_eq(cfg_validate(&c, err, sizeof err), CFG_EVALUE);
    ck_assert_msg(strstr(err, "'gpt2' is also the model's name") != NULL, "%s", err);
    ck_assert_int_eq(cfg_set(&c, "lora_modules", "a=/x,b=/y", "--lora-modules", err, sizeof err),
                     CFG_OK);
    ck_assert_int_eq(cfg_set(&c, "max_loras", "1", "--max-loras", err, sizeof err), CFG_OK);
    ck_assert_int_eq(cfg_validate(&c, err, sizeof err), CFG_EVALUE);
    ck_assert_int_eq(cfg_set(&c, "max_loras", "2", "--max-loras", err, sizeof err), CFG_OK);
    ck_assert_msg(cfg_validate(&c, err, sizeof err) == CFG_OK, "%s", err);
    ck_assert(cfg_key_reloadable("lora_modules") && cfg_key_reloadable("lora_dir"));
}
END_TEST

START_TEST(cfg_set_model_name_takes_several_names)
{
    cfg_config c;
    cfg_defaults(&c);
    char err[256];
    ck_assert_uint_eq(c.n_model_names, 1);
    ck_assert(cfg_model_name_ok(&c, "gpt2"));
    ck_assert_int_eq(c.model_name_set, 0); /* the checkpoint's own name may take its place */
    ck_assert_int_eq(cfg_set(&c, "model_name", "gpt2-small,gpt-3.5-turbo-instruct,x",
                             "--model-name", err, sizeof err),
                     CFG_OK);
    ck_assert_str_eq(c.model_name, "gpt2-small"); /* the first is reported */
    ck_assert_int_eq(c.model_name_set, 1);
    ck_assert_uint_eq(c.n_model_names, 3);
    ck_assert(cfg_model_name_ok(&c, "gpt-3.5-turbo-instruct"));
    ck_assert(cfg_model_name_ok(&c, "x"));
    ck_assert(!cfg_model_name_ok(&c, "gpt2"));
    ck_assert(!cfg_model_name_ok(&c, "gpt2-smal"));
    const char *bad[] = {"", "a,,b", "a,", "has space", "a,b,c,d,e,f,g,h,i"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(cfg_set(&c, "model_name", bad[i], "f:3", err, sizeof err), CFG_EVALUE);
        ck_assert_msg(strncmp(err, "f:3: model_name", 15) == 0, "%s", err);
    }
    ck_assert_str_eq(c.model_name, "gpt2-small"); /* a refused value changes nothing */
    ck_assert_uint_eq(c.n_model_names, 3);
}
END_TEST

START_TEST(cfg_validate_cross_checks)
{
    cfg_config c;
    cfg_defaults(&c);
    char err[256];
    ck_assert_int_eq(cfg_validate(&c, err, sizeof err), CFG_EVALUE);
    ck_assert_ptr_nonnull(strstr(err, "model"));
    ck_assert_int_eq(cfg_set(&c, "model", "/m", "test", err, sizeof err), CFG_OK);
    /* The budget counts prompt tokens only: below max_running is fine. */
    ck_assert_int_eq(cfg_set(&c, "step_tokens", "8", "test", err, sizeof err), CFG_OK);
    ck_assert_int_eq(cfg_validate(&c, err, sizeof err), CFG_OK);
    ck_assert_int_eq(cfg_set(&c, "step_tokens", "0", "test", err, sizeof err), CFG_EVALUE);
    for (int i = 0; i < 16; i++)
        ck_assert_int_eq(cfg_set(&c, "api_key", "abcdefgh", "t", err, sizeof err), CFG_OK);
    ck_assert_int_eq(cfg_set(&c, "api_key", "abcdefgh", "t", err, sizeof err), CFG_EVALUE);
    for (int s = 0; s <= CFG_EVALUE; s++)
        ck_assert_str_ne(cfg_strerror((cfg_status)s), "unknown status");
}
END_TEST

START_TEST(cfg_apply_reload_copies_reloadable_keys_and_names_the_rest)
{
    cfg_config cur, next;
    cfg_defaults(&cur);
    char err[256];
    ck_assert_int_eq(cfg_set(&cur, "api_key", "old-key-1111", "t", err, sizeof err), CFG_OK);
    memcpy(&next, &cur, sizeof next);
    /* The same values: nothing changes, nothing is named. */
    char changed[256], kept[256];
    ck_assert_uint_eq(cfg_apply_reload(&cur, &next, changed, sizeof changed, kept, sizeof kept), 0);
    ck_assert_str_eq(changed, "");
    ck_assert_str_eq(kept, "");
    cfg_defaults(&next);
    ck_assert_int_eq(cfg_set(&next, "api_key", "new-key-2222", "t", err, sizeof err), CFG_OK);
    ck_assert_int_eq(cfg_set(&next, "api_key", "new-key-3333", "t", err, sizeof err), CFG_OK);
    ck_assert_int_eq(cfg_set(&next, "log_level", "debug", "t", err, sizeof err), CFG_OK);
    ck_assert_int_eq(cfg_set(&next, "max_queue", "9", "t", err, sizeof err), CFG_OK);
    ck_assert_int_eq(cfg_set(&next, "port", "9999", "t", err, sizeof err), CFG_OK);
    ck_assert_int_eq(cfg_set(&next, "kv_cache_mb", "64", "t", err, sizeof err), CFG_OK);
    ck_assert_int_eq(cfg_set(&next, "prefix_cache", "false", "t", err, sizeof err), CFG_OK);
    ck_assert_uint_eq(cfg_apply_reload(&cur, &next, changed, sizeof changed, kept, sizeof kept), 3);
    ck_assert_str_eq(changed, "max_queue, api_key, log_level"); /* the table's order */
    ck_assert_str_eq(kept, "port, kv_cache_mb, prefix_cache");
    ck_assert_uint_eq(cur.n_api_keys, 2);
    ck_assert_str_eq(cur.api_keys[1], "new-key-3333");
    ck_assert_str_eq(cur.log_level, "debug");
    ck_assert_uint_eq(cur.max_queue, 9);
    ck_assert_uint_eq(cur.port, 8080); /* needs a restart: kept */
    ck_assert_uint_eq(cur.kv_cache_mb, 2048);
    ck_assert_int_eq(cur.prefix_cache, 1);
    /* Dropping every key is a change too (back to no authentication). */
    next.n_api_keys = 0;
    ck_assert_uint_eq(cfg_apply_reload(&cur, &next, NULL, 0, NULL, 0), 1);
    ck_assert_uint_eq(cur.n_api_keys, 0);
    ck_assert(cfg_key_reloadable("max_body_bytes") && !cfg_key_reloadable("model"));
}
END_TEST

/* Issue 28: --no-KEY sets a boolean false; it is no option for another
 * kind, nor with a value. */
START_TEST(cfg_parse_args_no_flag_sets_booleans_false)
{
    cfg_config c;
    char err[256];
    cfg_defaults(&c);
    ck_assert_int_eq(c.prefix_cache, 1);
    ck_assert_int_eq(c.ui, 1);
    char *argv[] = {"gpt2d", "--no-prefix-cache", "--no-ui", "--model", "m"};
    ck_assert_int_eq(cfg_parse_args(&c, 5, argv, 1, err, sizeof err), CFG_OK);
    ck_assert_int_eq(c.prefix_cache, 0);
    ck_assert_int_eq(c.ui, 0);
    char *bad1[] = {"gpt2d", "--no-port"};
    ck_assert_int_eq(cfg_parse_args(&c, 2, bad1, 1, err, sizeof err), CFG_EKEY);
    ck_assert_str_eq(err, "unknown option '--no-port'");
    char *bad2[] = {"gpt2d", "--no-ui=true"};
    ck_assert_int_eq(cfg_parse_args(&c, 2, bad2, 1, err, sizeof err), CFG_EKEY);
    ck_assert_str_eq(err, "unknown option '--no-ui'");
    char *again[] = {"gpt2d", "--ui", "true"};
    ck_assert_int_eq(cfg_parse_args(&c, 3, again, 1, err, sizeof err), CFG_OK);
    ck_assert_int_eq(c.ui, 1);
}
END_TEST

START_TEST(cfg_print_help_lists_every_key)
{
    char *buf;
    size_t len;
    FILE *mem = open_memstream(&buf, &len);
    cfg_print_help(mem);
    fclose(mem);
    static const char *keys[] = {
        "--host",           "--port",    "--model ",           "--kv-cache-mb",
        "--max-queue",      "--api-key", "--shutdown-timeout", "--config FILE",
        "--no-prefix-cache"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        ck_assert_msg(strstr(buf, keys[i]) != NULL, "help lacks %s", keys[i]);
    free(buf);
}
END_TEST

/* Issue 24: keys cache apart unless the operator says they are one tenant;
 * the switch applies per request, so SIGHUP may flip it. */
START_TEST(cfg_prefix_cache_shared_across_keys_off_and_reloadable)
{
    cfg_config cur, next;
    cfg_defaults(&cur);
    ck_assert_int_eq(cur.prefix_cache_shared_across_keys, 0);
    memcpy(&next, &cur, sizeof next);
    char err[256], changed[256];
    ck_assert_int_eq(
        cfg_set(&next, "prefix_cache_shared_across_keys", "true", "t", err, sizeof err), CFG_OK);
    ck_assert_int_eq(next.prefix_cache_shared_across_keys, 1);
    ck_assert_int_eq(
        cfg_set(&next, "prefix_cache_shared_across_keys", "yes please", "t", err, sizeof err),
        CFG_EVALUE);
    ck_assert(cfg_key_reloadable("prefix_cache_shared_across_keys"));
    ck_assert_uint_eq(cfg_apply_reload(&cur, &next, changed, sizeof changed, NULL, 0), 1);
    ck_assert_str_eq(changed, "prefix_cache_shared_across_keys");
    ck_assert_int_eq(cur.prefix_cache_shared_across_keys, 1);
}
END_TEST

START_TEST(cfg_trusted_proxies_parse_and_match)
{
    cfg_config c;
    char err[256];
    cfg_defaults(&c);
    /* The default: loopback, both families. */
    unsigned char v4[16] = {127, 9, 8, 7}, v6[16] = {0};
    v6[15] = 1;
    ck_assert(cfg_nets_contain(c.trusted_nets, c.n_trusted_nets, 4, v4));
    ck_assert(cfg_nets_contain(c.trusted_nets, c.n_trusted_nets, 6, v6));
    ck_assert_int_eq(
        cfg_set(&c, "trusted_proxies", "10.0.0.0/8, 192.168.1.5,fd00::/8", "t", err, sizeof err),
        CFG_OK);
    ck_assert_uint_eq(c.n_trusted_nets, 3);
    unsigned char a[16] = {10, 200, 0, 1}, b[16] = {11, 0, 0, 1}, h[16] = {192, 168, 1, 5},
                  h2[16] = {192, 168, 1, 6}, u[16] = {0xfd, 0x12}, u2[16] = {0xfe};
    ck_assert(cfg_nets_contain(c.trusted_nets, c.n_trusted_nets, 4, a));
    ck_assert(!cfg_nets_contain(c.trusted_nets, c.n_trusted_nets, 4, b));
    ck_assert(cfg_nets_contain(c.trusted_nets, c.n_trusted_nets, 4, h));
    ck_assert(!cfg_nets_contain(c.trusted_nets, c.n_trusted_nets, 4, h2));
    ck_assert(cfg_nets_contain(c.trusted_nets, c.n_trusted_nets, 6, u));
    ck_assert(!cfg_nets_contain(c.trusted_nets, c.n_trusted_nets, 6, u2));
    ck_assert(!cfg_nets_contain(c.trusted_nets, c.n_trusted_nets, 4, v4)); /* replaced */
    /* A /12 cuts inside a byte. */
    ck_assert_int_eq(cfg_set(&c, "trusted_proxies", "172.16.0.0/12", "t", err, sizeof err), CFG_OK);
    unsigned char in[16] = {172, 31, 255, 255}, out[16] = {172, 32, 0, 0};
    ck_assert(cfg_nets_contain(c.trusted_nets, c.n_trusted_nets, 4, in));
    ck_assert(!cfg_nets_contain(c.trusted_nets, c.n_trusted_nets, 4, out));
    ck_assert_int_eq(cfg_set(&c, "trusted_proxies", "", "t", err, sizeof err), CFG_OK);
    ck_assert_uint_eq(c.n_trusted_nets, 0);
    /* Refused values name the entry and change nothing. */
    static const char *bad[] = {"10.0.0.0/33", "example.com", "::1/129", "10.0.0.1/", "10.0.0.1/x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(cfg_set(&c, "trusted_proxies", bad[i], "f:3", err, sizeof err),
                         CFG_EVALUE);
        ck_assert_msg(strstr(err, "f:3: trusted_proxies") != NULL, "%s", err);
        ck_assert_uint_eq(c.n_trusted_nets, 0);
    }
    ck_assert_int_eq(cfg_set(&c, "allowed_hosts", "a.example, localhost", "t", err, sizeof err),
                     CFG_OK);
    ck_assert_int_eq(cfg_set(&c, "allowed_hosts", "a\x01b", "t", err, sizeof err), CFG_EVALUE);
    ck_assert_int_eq(cfg_set(&c, "allowed_hosts", "a.example:8080", "t", err, sizeof err),
                     CFG_EVALUE);
    ck_assert_msg(strstr(err, "'a.example:8080': host names without a scheme or a port") != NULL,
                  "%s", err);
    ck_assert_int_eq(cfg_set(&c, "allowed_hosts", "localhost, http://a", "t", err, sizeof err),
                     CFG_EVALUE);
    ck_assert_int_eq(cfg_set(&c, "allowed_hosts", "[::1], *, b.example", "t", err, sizeof err),
                     CFG_OK);
}
END_TEST

START_TEST(cfg_tls_priorities_tls12_and_13_and_not_reloadable)
{
    cfg_config c, next;
    char err[256];
    cfg_defaults(&c);
    ck_assert_str_eq(c.tls_priorities, "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2");
    ck_assert_int_eq(cfg_set(&c, "tls_priorities", "NORMAL:-VERS-ALL:+VERS-TLS1.3",
                             "--tls-priorities", err, sizeof err),
                     CFG_OK);
    ck_assert_str_eq(c.tls_priorities, "NORMAL:-VERS-ALL:+VERS-TLS1.3");
    char big[600];
    memset(big, 'A', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ck_assert_int_eq(cfg_set(&c, "tls_priorities", big, "f:2", err, sizeof err), CFG_EVALUE);
    ck_assert_msg(strstr(err, "f:2: tls_priorities is longer than") != NULL, "%s", err);
    /* libmicrohttpd takes it at start only: a reload keeps it and names it. */
    ck_assert(!cfg_key_reloadable("tls_priorities"));
    cfg_defaults(&next);
    char changed[128], kept[128];
    ck_assert_uint_eq(cfg_apply_reload(&c, &next, changed, sizeof changed, kept, sizeof kept), 0);
    ck_assert_str_eq(kept, "tls_priorities");
    ck_assert_str_eq(c.tls_priorities, "NORMAL:-VERS-ALL:+VERS-TLS1.3");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("cfg");
    tcase_add_test(tc, cfg_defaults_are_the_documented_ones);
    tcase_add_test(tc, cfg_print_defaults_reads_back_to_the_defaults);
    tcase_add_test(tc, cfg_load_file_reads_keys_comments_and_quotes);
    tcase_add_loop_test(tc, cfg_load_file_errors_name_the_line, 0,
                        (int)(sizeof bad_files / sizeof bad_files[0]));
    tcase_add_test(tc, cfg_parse_args_defaults_then_file_then_options);
    tcase_add_test(tc, cfg_parse_args_errors);
    tcase_add_test(tc, cfg_validate_cross_checks);
    tcase_add_test(tc, cfg_set_model_name_takes_several_names);
    tcase_add_test(tc, cfg_request_bounds_default_range_and_reload);
    tcase_add_test(tc, cfg_responses_store_bounds);
    tcase_add_test(tc, cfg_parse_args_no_flag_sets_booleans_false);
    tcase_add_test(tc, cfg_print_help_lists_every_key);
    tcase_add_test(tc, cfg_trusted_proxies_parse_and_match);
    tcase_add_test(tc, cfg_apply_reload_copies_reloadable_keys_and_names_the_rest);
    tcase_add_test(tc, cfg_prefix_cache_shared_across_keys_off_and_reloadable);
    tcase_add_test(tc, cfg_tls_priorities_tls12_and_13_and_not_reloadable);
    tcase_add_test(tc, cfg_lora_modules_parse_entries_and_refusals);
    tcase_add_test(tc, cfg_models_split_entries_and_refusals);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
