/*
 * config/config.c: see config.h. One table describes every key: its type,
 * range, default (as text, parsed by the same code as any other value) and
 * meaning.
 */
#include "config.h"
#include "errbuf.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
    K_STR,
    K_PORT,
    K_SIZE,
    K_SECONDS,
    K_BOOL,
    K_APIKEY,
    K_LEVEL,
    K_NAMES,
    K_NETS,
    K_HOSTS
} kind;

typedef struct {
    const char *key;
    kind k;
    size_t off, size; /* field offset; buffer size for strings */
    double min, max;  /* numbers */
    const char *def;  /* the default, as text ("" for none) */
    const char *help;
} spec;

#define F(field) offsetof(cfg_config, field), sizeof(((cfg_config *)0)->field)

static const spec specs[] = {
    {"host", K_STR, F(host), 0, 0, "127.0.0.1", "address to listen on"},
    {"port", K_PORT, F(port), 0, 65535, "8080", "TCP port to listen on (0: any free port)"},
    {"max_connections", K_SIZE, F(max_connections), 1, 1000000, "1024",
     "concurrent HTTP connections; LimitNOFILE must exceed it"},
    {"connection_timeout", K_SECONDS, F(connection_timeout_s), 1, 86400, "60",
     "seconds an idle keep-alive connection is kept"},
    {"request_header_timeout", K_SECONDS, F(request_header_timeout_s), 1, 86400, "10",
     "seconds a new connection, or a keep-alive one from its next head's first byte, gets to "
     "send a complete request head (else 408, closed)"},
    {"body_timeout", K_SECONDS, F(body_timeout_s), 1, 86400, "10",
     "longest gap in seconds between body bytes while a body is read (else 408, closed)"},
    {"body_min_rate", K_SIZE, F(body_min_rate), 0, 1073741824, "1024",
     "bytes a second a body must average: it gets body_timeout plus a second for each "
     "body_min_rate bytes (else 408, closed; 0: no minimum)"},
    {"max_connections_per_ip", K_SIZE, F(max_connections_per_ip), 0, 1000000, "512",
     "concurrent connections from one address, trusted_proxies aside; more get 429 and are "
     "closed (0: no limit)"},
    {"refusal_linger", K_SECONDS, F(refusal_linger_s), 0, 3600, "5",
     "seconds a connection refused before its body was read (413, 401, 403, 421, 429, 503) "
     "keeps reading and dropping the rest after the answer, so that the client reads the "
     "answer, not a reset (0: closed at once)"},
    {"refusal_linger_bytes", K_SIZE, F(refusal_linger_bytes), 0, 1073741824, "67108864",
     "bytes such a connection reads and drops at most before it is closed"},
    {"trusted_proxies", K_NETS, F(trusted_proxies), 0, 0, "127.0.0.0/8, ::1",
     "addresses and CIDRs (comma-separated) exempt from max_connections_per_ip, whose "
     "X-Forwarded-For names the client in the access log (\"\": none)"},
    {"allowed_hosts", K_HOSTS, F(allowed_hosts), 0, 0, "",
     "Host names (comma-separated, any port; \"*\": any) requests may carry, others get 421; "
     "empty: localhost, 127.0.0.1 and [::1] on a loopback bind, any elsewhere"},
    {"tls_cert_file", K_STR, F(tls_cert_file), 0, 0, "",
     "PEM certificate chain (the server's first) to serve HTTPS with, read again on SIGHUP "
     "(empty: plain HTTP); needs tls_key_file"},
    {"tls_key_file", K_STR, F(tls_key_file), 0, 0, "",
     "PEM private key of tls_cert_file, read again on SIGHUP"},
    {"tls_priorities", K_STR, F(tls_priorities), 0, 0, "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2",
     "GnuTLS priority string of the HTTPS handshakes (protocol versions, ciphers); the default "
     "allows TLS 1.3 and 1.2 only (RFC 8996); a string GnuTLS refuses stops start-up and a "
     "reload"},
    {"stream_backlog_bytes", K_SIZE, F(stream_backlog_bytes), 4096, 1073741824, "1048576",
     "SSE bytes a streaming client may leave unread; over it, its sequences pause"},
    {"stream_stall_timeout", K_SECONDS, F(stream_stall_timeout_s), 1, 86400, "30",
     "seconds a stream may stay over stream_backlog_bytes before it is cancelled"},
    {"tokenize_concurrency", K_SIZE, F(tokenize_concurrency), 1, 64, "2",
     "large request bodies tokenized at once; more wait in a queue (max_queue) or get 429"},
    {"structured_cache_mb", K_SIZE, F(structured_cache_mb), 1, 1048576, "64",
     "MiB the compiled structured-output formats (response_format, text.format) kept for reuse "
     "may take; the least recently used go first"},
    {"model", K_STR, F(model_dir), 0, 0, "",
     "model directory: model.safetensors, vocab.json, merges.txt, config.json"},
    {"fallback_model", K_STR, F(fallback_model), 0, 0, "",
     "model directory served in model's place while model has no model.safetensors (the "
     "installed gpt2d.conf: the embedded gpt2d-tiny until GPT-2 is downloaded), with a warning"},
    {"model_name", K_NAMES, F(model_name), 0, 0, "gpt2",
     "the model id clients send (several: comma-separated, the first is reported); unset: the "
     "checkpoint's own name (gpt2d.model_name), gpt2 still accepted"},
    {"chat_template", K_STR, F(chat_template), 0, 0, "default",
     "how /v1/chat/completions writes messages as a prompt: default, none (no chat route) or a "
     "template file (docs/api.md)"},
    {"chat_max_tokens", K_SIZE, F(chat_max_tokens), 1, 1048576, "256",
     "the longest chat reply when a request sends no max_tokens (capped by max_tokens_limit and "
     "the context)"},
    {"speculative_tokens", K_SIZE, F(speculative_tokens), 0, 8, "4",
     "tokens drafted a step for a decoding sequence and verified in one batched step "
     "(speculative decoding: the same output bit for bit); a request's speculative_tokens "
     "overrides it; 0: off for every request, predictions too"},
    {"speculative_drafter", K_STR, F(speculative_drafter), 0, 0, "lookup",
     "where drafts come from when a request names none: lookup (the sequence's own earlier "
     "text), draft_model (draft_model's guesses) or none (only a request's prediction)"},
    {"speculative_max_batch", K_SIZE, F(speculative_max_batch), 1, 4096, "4",
     "steps with more decoding sequences than this draft nothing (they are bound by compute, "
     "where verifying drafts costs what it saves)"},
    {"draft_model", K_STR, F(draft_model), 0, 0, "",
     "model directory of a smaller GPT-2 with the same vocabulary whose greedy tokens are the "
     "drafts of speculative_drafter = draft_model (\"\": none)"},
    {"lora_modules", K_STR, F(lora_modules), 0, 0, "",
     "LoRA adapters served beside the model, name=DIR,...: PEFT folders (adapter_config.json, "
     "adapter_model.safetensors) for this model, loaded at start-up and again on SIGHUP; a "
     "request's model picks one by name"},
    {"max_loras", K_SIZE, F(max_loras), 1, 1024, "8",
     "LoRA adapters resident at once (lora_modules and those loaded at run time)"},
    {"max_lora_rank", K_SIZE, F(max_lora_rank), 1, 1024, "64",
     "the highest LoRA rank accepted; an adapter above it is refused"},
    {"lora_dir", K_STR, F(lora_dir), 0, 0, "",
     "folder under which POST /v1/load_lora_adapter may load adapters (a lora_path must resolve "
     "inside it, symbolic links followed); \"\": the load and unload routes are off"},
    {"threads", K_SIZE, F(threads), 0, 1024, "0", "engine threads (0: one per CPU)"},
    {"kv_cache_mb", K_SIZE, F(kv_cache_mb), 1, 1048576, "2048",
     "memory for the paged KV cache, in MiB"},
    {"kv_block", K_SIZE, F(kv_block), 1, 4096, "16", "positions per KV cache block"},
    {"prefix_cache", K_BOOL, F(prefix_cache), 0, 1, "true",
     "reuse the KV cache of prompt prefixes seen before (the same results, bit for bit)"},
    {"prefix_cache_shared_across_keys", K_BOOL, F(prefix_cache_shared_across_keys), 0, 1, "false",
     "let all API keys share cached prompts (one tenant); false: each key's prompts are cached "
     "apart, so no key can see or time another's"},
    {"max_running", K_SIZE, F(max_running), 1, 4096, "64", "sequences decoded together per step"},
    {"step_tokens", K_SIZE, F(step_tokens), 1, 65536, "512",
     "prompt tokens per step, the prefill chunk (bounds decode latency); decode rows come on top"},
    {"max_queue", K_SIZE, F(max_queue), 0, 1000000, "256",
     "requests waiting for admission before new ones get 429"},
    {"queue_timeout", K_SECONDS, F(queue_timeout_s), 0, 86400, "60",
     "seconds a request may wait for admission before it gets 503"},
    {"max_body_bytes", K_SIZE, F(max_body_bytes), 64, 1073741824, "1048576",
     "largest request body; larger ones get 413"},
    {"max_prompt_tokens", K_SIZE, F(max_prompt_tokens), 1, 1048576, "1024",
     "longest prompt in tokens"},
    {"max_tokens_limit", K_SIZE, F(max_tokens_limit), 1, 1048576, "1024",
     "largest max_tokens a request may ask for"},
    {"max_n", K_SIZE, F(max_n), 1, 128, "16", "largest n and best_of"},
    {"max_sequences_per_request", K_SIZE, F(max_sequences_per_request), 1, 65536, "64",
     "engine sequences one request may ask for (prompts x max(n, best_of)); more get 400"},
    {"max_response_bytes", K_SIZE, F(max_response_bytes), 65536, 68719476736, "4194304",
     "largest answer one request may ask for (its predictable size up front, and as it grows; "
     "a larger one gets 400, or its answer is ended with an error)"},
    {"responses_store_max", K_SIZE, F(responses_store_max), 0, 1000000, "1000",
     "stored responses (store, previous_response_id) kept in memory at most; the least "
     "recently used go first; 0: none kept"},
    {"responses_store_bytes", K_SIZE, F(responses_store_bytes), 0, 68719476736, "67108864",
     "bytes the stored responses may take in memory at most; past them, the least recently "
     "used of the key furthest over its fair share go first"},
    {"max_embedding_inputs", K_SIZE, F(max_embedding_inputs), 1, 100000, "2048",
     "inputs one POST /v1/embeddings may carry (each is one sequence; they run a window at a "
     "time)"},
    {"responses_store_chain_bytes", K_SIZE, F(responses_store_chain_bytes), 1048576, 68719476736,
     "16777216",
     "bytes one conversation (a chain of previous_response_id) may keep; past them the "
     "oldest turns are forgotten"},
    {"api_key", K_APIKEY, F(api_keys), 0, 0, "",
     "a Bearer key clients must send (repeat for several; none: no authentication)"},
    {"auth_open_health", K_BOOL, F(auth_open_health), 0, 1, "true",
     "whether /health, /ready and /metrics are open without a key"},
    {"shutdown_timeout", K_SECONDS, F(shutdown_timeout_s), 0, 86400, "30",
     "seconds in-flight requests get to finish after SIGTERM"},
    {"log_level", K_LEVEL, F(log_level), 0, 0, "info", "error, warn, info or debug"},
    {"info_interval", K_SECONDS, F(info_interval_s), 0, 86400, "10",
     "seconds between throughput log lines while requests run (0: never; else at least 1)"},
    {"ui", K_BOOL, F(ui), 0, 1, "true", "serve the playground page at /"},
    {"cors_origins", K_STR, F(cors_origins), 0, 0, "",
     "Origins browsers may call from, comma-separated (\"*\": any); a request with another "
     "Origin gets 403"},
};

#undef F

#define NSPECS (sizeof specs / sizeof specs[0])

const char *cfg_strerror(cfg_status s)
{
    switch (s) {
    case CFG_OK: return "ok";
    case CFG_EIO: return "I/O error";
    case CFG_ESYNTAX: return "syntax error";
    case CFG_EKEY: return "unknown key";
    case CFG_EVALUE: return "bad value";
    }
    return "unknown status";
}

static const spec *find(const char *key)
{
    for (size_t i = 0; i < NSPECS; i++)
        if (strcmp(specs[i].key, key) == 0) return &specs[i];
    return NULL;
}

static cfg_status set_spec(cfg_config *c, const spec *sp, const char *value, const char *origin,
                           char *err, size_t errlen)
{
    void *field = (char *)c + sp->off; /* written with memcpy: no alignment casts */
    char *end;
    switch (sp->k) {
    case K_STR:
    case K_LEVEL:
        if (strlen(value) >= sp->size)
            return ERRBUF_FAIL(err, errlen, CFG_EVALUE, "%s: %s is longer than %zu bytes", origin,
                               sp->key, sp->size - 1);
        if (sp->k == K_LEVEL && strcmp(value, "error") != 0 && strcmp(value, "warn") != 0
            && strcmp(value, "info") != 0 && strcmp(value, "debug") != 0)
            return ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                               "%s: %s must be error, warn, info or debug, not '%s'", origin,
                               sp->key, value);
        memcpy(field, value, strlen(value) + 1);
        return CFG_OK;
    case K_APIKEY: {
        if (*value == '\0') /* would read as "no key": authentication off */
            return ERRBUF_FAIL(
                err, errlen, CFG_EVALUE,
                "%s: api_key is empty; leave the key out to run without authentication", origin);
        if (c->n_api_keys == CFG_MAX_KEYS)
            return ERRBUF_FAIL(err, errlen, CFG_EVALUE, "%s: more than %d api_key values", origin,
                               CFG_MAX_KEYS);
        if (strlen(value) >= sizeof c->api_keys[0] || strlen(value) < 8)
            return ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                               "%s: an api_key must be 8 to %zu characters", origin,
                               sizeof c->api_keys[0] - 1);
        for (const char *p = value; *p; p++)
            if (*p <= ' ' || *p > '~')
                return ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                                   "%s: an api_key must be printable ASCII without spaces", origin);
        memcpy(c->api_keys[c->n_api_keys++], value, strlen(value) + 1);
        return CFG_OK;
    }
    case K_NAMES: {
        /* "a,b,c": every name 1 to 127 printable characters, no spaces.
         * Parsed aside, so that a refused value changes nothing. */
        char names[CFG_MAX_NAMES][sizeof c->model_names[0]];
        memset(names, 0, sizeof names); /* the struct compares bytewise (tests) */
        size_t n = 0;
        const char *p = value;
        for (;;) {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            if (len == 0 || len >= sizeof names[0])
                return ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                                   "%s: %s: every name must be 1 to %zu characters", origin,
                                   sp->key, sizeof names[0] - 1);
            if (n == CFG_MAX_NAMES)
                return ERRBUF_FAIL(err, errlen, CFG_EVALUE, "%s: %s: more than %d names", origin,
                                   sp->key, CFG_MAX_NAMES);
            for (size_t i = 0; i < len; i++)
                if (p[i] <= ' ' || p[i] > '~')
                    return ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                                       "%s: %s: names are printable ASCII without spaces", origin,
                                       sp->key);
            memcpy(names[n], p, len);
            names[n++][len] = '\0';
            if (comma == NULL) break;
            p = comma + 1;
        }
        memcpy(c->model_names, names, sizeof names);
        c->n_model_names = n;
        memcpy(c->model_name, names[0], strlen(names[0]) + 1);
        return CFG_OK;
    }
    case K_NETS: {
        /* Parsed aside, so that a refused value changes nothing. */
        cfg_net nets[CFG_MAX_NETS];
        memset(nets, 0, sizeof nets); /* the struct compares bytewise (tests) */
        size_t n = 0;
        if (strlen(value) >= sp->size)
            return ERRBUF_FAIL(err, errlen, CFG_EVALUE, "%s: %s is longer than %zu bytes", origin,
                               sp->key, sp->size - 1);
        char why[256]; /* the entry's fault, then prefixed with where it came from */
        cfg_status rc = cfg_nets_parse(value, nets, CFG_MAX_NETS, &n, why, sizeof why);
        if (rc != CFG_OK) return ERRBUF_FAIL(err, errlen, rc, "%s: %s: %s", origin, sp->key, why);
        memcpy(c->trusted_nets, nets, sizeof nets);
        c->n_trusted_nets = n;
        memcpy(field, value, strlen(value) + 1);
        return CFG_OK;
    }
    case K_HOSTS:
        if (strlen(value) >= sp->size)
            return ERRBUF_FAIL(err, errlen, CFG_EVALUE, "%s: %s is longer than %zu bytes", origin,
                               sp->key, sp->size - 1);
        for (const char *p = value; *p; p++)
            if ((unsigned char)*p < ' ' || (unsigned char)*p > '~')
                return ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                                   "%s: %s: host names are printable ASCII", origin, sp->key);
        /* A name with a scheme or a port ("http://a", "a:8080") could never
         * match a request's Host, which is compared without its port. */
        for (const char *p = value; *p;) {
            while (*p == ' ' || *p == ',') p++;
            const char *e = p;
            while (*e && *e != ',') e++;
            int bracket = *p == '[';
            for (const char *q = p; q < e; q++)
                if (*q == '/' || (*q == ':' && !bracket))
                    return ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                                       "%s: %s: '%.*s': host names without a scheme or a port",
                                       origin, sp->key, (int)(e - p), p);
            p = e;
        }
        memcpy(field, value, strlen(value) + 1);
        return CFG_OK;
    case K_BOOL:
        if (strcmp(value, "true") == 0 || strcmp(value, "yes") == 0 || strcmp(value, "1") == 0)
            memcpy(field, &(int){1}, sizeof(int));
        else if (strcmp(value, "false") == 0 || strcmp(value, "no") == 0 || strcmp(value, "0") == 0)
            memcpy(field, &(int){0}, sizeof(int));
        else
            return ERRBUF_FAIL(err, errlen, CFG_EVALUE, "%s: %s must be true or false, not '%s'",
                               origin, sp->key, value);
        return CFG_OK;
    case K_PORT:
    case K_SIZE: {
        errno = 0;
        if (*value == '\0' || *value == '-' || *value == '+') goto bad_number;
        unsigned long long v = strtoull(value, &end, 10);
        if (errno != 0 || *end != '\0' || (double)v < sp->min || (double)v > sp->max)
            goto bad_number;
        if (sp->k == K_PORT)
            memcpy(field, &(uint16_t){(uint16_t)v}, sizeof(uint16_t));
        else
            memcpy(field, &(size_t){(size_t)v}, sizeof(size_t));
        return CFG_OK;
    }
    case K_SECONDS: {
        errno = 0;
        double v = strtod(value, &end);
        if (*value == '\0' || errno != 0 || *end != '\0' || !isfinite(v) || v < sp->min
            || v > sp->max)
            goto bad_number;
        memcpy(field, &v, sizeof v);
        return CFG_OK;
    }
    }
    return ERRBUF_FAIL(err, errlen, CFG_EKEY, "%s: %s", origin, sp->key);
bad_number:
    return ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                       "%s: %s must be a number from %.0f to %.0f, not '%s'", origin, sp->key,
                       sp->min, sp->max, value);
}

void cfg_defaults(cfg_config *c)
{
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < NSPECS; i++) {
        char err[128];
        if (specs[i].k == K_APIKEY) continue; /* none by default (an empty one is an error) */
        /* The table's defaults are valid by construction (cfg tests check). */
        (void)set_spec(c, &specs[i], specs[i].def, "default", err, sizeof err);
    }
}

cfg_status cfg_set(cfg_config *c, const char *key, const char *value, const char *origin, char *err,
                   size_t errlen)
{
    const spec *sp = find(key);
    if (sp == NULL) return ERRBUF_FAIL(err, errlen, CFG_EKEY, "%s: unknown key '%s'", origin, key);
    cfg_status st = set_spec(c, sp, value, origin, err, errlen);
    if (st == CFG_OK && sp->k == K_NAMES) c->model_name_set = 1;
    return st;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n')) e--;
    *e = '\0';
    return s;
}

cfg_status cfg_load_file(cfg_config *c, const char *path, char *err, size_t errlen)
{
    FILE *fp = fopen(path, "r");
    if (fp == NULL)
        return ERRBUF_FAIL(err, errlen, CFG_EIO, "%s: cannot open: %s", path, strerror(errno));
    char line[8192], origin[CFG_STR_MAX + 32];
    size_t lineno = 0;
    cfg_status rc = CFG_OK;
    while (fgets(line, sizeof line, fp) != NULL) {
        lineno++;
        snprintf(origin, sizeof origin, "%s:%zu", path, lineno);
        if (strchr(line, '\n') == NULL && !feof(fp)) {
            rc = ERRBUF_FAIL(err, errlen, CFG_ESYNTAX, "%s: line longer than %zu bytes", origin,
                             sizeof line - 2);
            break;
        }
        char *s = trim(line);
        if (*s == '\0' || *s == '#') continue;
        char *eq = strchr(s, '=');
        if (eq == NULL) {
            rc = ERRBUF_FAIL(err, errlen, CFG_ESYNTAX, "%s: expected key = value", origin);
            break;
        }
        *eq = '\0';
        char *key = trim(s), *value = trim(eq + 1);
        if (*key == '\0') {
            rc = ERRBUF_FAIL(err, errlen, CFG_ESYNTAX, "%s: missing key before '='", origin);
            break;
        }
        size_t vlen = strlen(value);
        if (vlen >= 2 && value[0] == '"' && value[vlen - 1] == '"') { /* "quoted value" */
            value[vlen - 1] = '\0';
            value++;
        }
        rc = cfg_set(c, key, value, origin, err, errlen);
        if (rc != CFG_OK) break;
    }
    if (rc == CFG_OK && ferror(fp)) rc = ERRBUF_FAIL(err, errlen, CFG_EIO, "%s: read error", path);
    fclose(fp);
    return rc;
}

cfg_status cfg_parse_args(cfg_config *c, int argc, char **argv, int first, char *err, size_t errlen)
{
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0')
            return ERRBUF_FAIL(err, errlen, CFG_ESYNTAX, "unexpected argument '%s'", a);
        char key[128];
        const char *value;
        const char *eq = strchr(a, '=');
        size_t klen = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (klen >= sizeof key) return ERRBUF_FAIL(err, errlen, CFG_EKEY, "unknown option '%s'", a);
        memcpy(key, a + 2, klen);
        key[klen] = '\0';
        for (char *p = key; *p; p++)
            if (*p == '-') *p = '_'; /* --max-queue is max_queue */
        char origin[160];
        snprintf(origin, sizeof origin, "--%s", a + 2);
        if (eq != NULL) origin[2 + klen] = '\0';
        /* --no-FLAG: a boolean key set to false, without a value. */
        if (eq == NULL && strncmp(key, "no_", 3) == 0 && find(key) == NULL) {
            const spec *neg = find(key + 3);
            if (neg != NULL && neg->k == K_BOOL) {
                cfg_status rc = cfg_set(c, neg->key, "false", origin, err, errlen);
                if (rc != CFG_OK) return rc;
                continue;
            }
        }
        if (strcmp(key, "config") != 0 && find(key) == NULL)
            return ERRBUF_FAIL(err, errlen, CFG_EKEY, "unknown option '%s'", origin);
        if (eq != NULL) {
            value = eq + 1;
        } else {
            if (i + 1 >= argc)
                return ERRBUF_FAIL(err, errlen, CFG_EVALUE, "%s needs a value", origin);
            value = argv[++i];
        }
        cfg_status rc;
        if (strcmp(key, "config") == 0)
            rc = cfg_load_file(c, value, err, errlen);
        else
            rc = cfg_set(c, key, value, origin, err, errlen);
        if (rc != CFG_OK) return rc;
    }
    return CFG_OK;
}

int cfg_lora_name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= CFG_LORA_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')
              || ch == '.' || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

cfg_status cfg_lora_modules_parse(const char *list, cfg_lora_module *out, size_t max, size_t *n,
                                  char *err, size_t errlen)
{
    *n = 0;
    const char *p = list;
    while (*p != '\0') {
        while (*p == ' ' || *p == ',') p++;
        if (*p == '\0') break;
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len > 0 && p[len - 1] == ' ') len--;
        const char *eq = memchr(p, '=', len);
        if (eq == NULL || eq == p || (size_t)(eq - p) >= CFG_LORA_NAME_MAX || eq + 1 == p + len)
            return ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                               "lora_modules: '%.*s' is not name=DIR (a name of 1 to %d bytes)",
                               (int)(len > 200 ? 200 : len), p, CFG_LORA_NAME_MAX - 1);
        if (*n >= max)
            return ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                               "lora_modules: more than %zu adapters (max_loras)", max);
        cfg_lora_module *m = &out[*n];
        memcpy(m->name, p, (size_t)(eq - p));
        m->name[eq - p] = '\0';
        size_t dl = len - (size_t)(eq - p) - 1;
        if (dl >= sizeof m->dir)
            return ERRBUF_FAIL(err, errlen, CFG_EVALUE, "lora_modules: %s: the folder is too long",
                               m->name);
        memcpy(m->dir, eq + 1, dl);
        m->dir[dl] = '\0';
        if (!cfg_lora_name_ok(m->name))
            return ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                               "lora_modules: '%s' is not an adapter name (letters, digits, '.', "
                               "'_' and '-')",
                               m->name);
        for (size_t i = 0; i < *n; i++)
            if (strcmp(out[i].name, m->name) == 0)
                return ERRBUF_FAIL(err, errlen, CFG_EVALUE, "lora_modules: '%s' is named twice",
                                   m->name);
        (*n)++;
        p += end ? (size_t)(end - p) : strlen(p);
    }
    return CFG_OK;
}

int cfg_model_name_ok(const cfg_config *c, const char *name)
{
    for (size_t i = 0; i < c->n_model_names; i++)
        if (strcmp(c->model_names[i], name) == 0) return 1;
    return 0;
}

cfg_status cfg_validate(const cfg_config *c, char *err, size_t errlen)
{
    if (c->info_interval_s > 0 && c->info_interval_s < 1)
        return ERRBUF_FAIL(
            err, errlen, CFG_EVALUE,
            "info_interval: %g s is too often for a log line (0: never, else at least 1)",
            c->info_interval_s);
    if (c->model_dir[0] == '\0')
        return ERRBUF_FAIL(err, errlen, CFG_EVALUE, "model: no model directory (--model DIR)");
    {
        size_t nl = c->max_loras;
        cfg_lora_module *mods = calloc(nl ? nl : 1, sizeof *mods);
        if (mods == NULL) return ERRBUF_FAIL(err, errlen, CFG_EVALUE, "out of memory");
        cfg_status rc = cfg_lora_modules_parse(c->lora_modules, mods, nl, &nl, err, errlen);
        for (size_t i = 0; rc == CFG_OK && i < nl; i++)
            if (cfg_model_name_ok(c, mods[i].name))
                rc = ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                                 "lora_modules: '%s' is also the model's name", mods[i].name);
        free(mods);
        if (rc != CFG_OK) return rc;
    }
    if (strcmp(c->speculative_drafter, "lookup") != 0
        && strcmp(c->speculative_drafter, "draft_model") != 0
        && strcmp(c->speculative_drafter, "none") != 0)
        return ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                           "speculative_drafter must be lookup, draft_model or none, not '%s'",
                           c->speculative_drafter);
    if (strcmp(c->speculative_drafter, "draft_model") == 0 && c->draft_model[0] == '\0')
        return ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                           "speculative_drafter = draft_model needs draft_model (a model "
                           "directory)");
    if ((c->tls_cert_file[0] == '\0') != (c->tls_key_file[0] == '\0'))
        return ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                           "%s is set without %s: HTTPS needs both a certificate and its key",
                           c->tls_cert_file[0] != '\0' ? "tls_cert_file" : "tls_key_file",
                           c->tls_cert_file[0] != '\0' ? "tls_key_file" : "tls_cert_file");
    return CFG_OK;
}

/* The keys SIGHUP may change: the server reads them per request (or per
 * tick), so a new value applies to the next request without dropping a
 * connection. The others (listening, the model, the engine's sizes) are
 * fixed at start-up. A name the table lacks matches nothing. */
static const char *const reloadable[] = {
    "api_key",
    "log_level",
    "max_body_bytes",
    "max_prompt_tokens",
    "max_tokens_limit",
    "max_n",
    "max_sequences_per_request",
    "max_response_bytes",
    "responses_store_max",
    "responses_store_bytes",
    "responses_store_chain_bytes",
    "max_embedding_inputs",
    "max_queue",
    "queue_timeout",
    "cors_origins",
    "body_timeout",
    "body_min_rate",
    "refusal_linger",
    "refusal_linger_bytes",
    "structured_cache_mb",
    "request_header_timeout",
    "stream_backlog_bytes",
    "stream_stall_timeout",
    "prefix_cache_shared_across_keys",
    "speculative_tokens",
    "lora_modules",
    "max_loras",
    "max_lora_rank",
    "lora_dir",
    "speculative_drafter",
    /* The files are read again on every SIGHUP (certificate rotation);
     * turning HTTPS on or off still needs a restart (daemon/reload.c). */
    "tls_cert_file",
    "tls_key_file",
};

int cfg_key_reloadable(const char *key)
{
    for (size_t i = 0; i < sizeof reloadable / sizeof reloadable[0]; i++)
        if (strcmp(reloadable[i], key) == 0) return 1;
    return 0;
}

/* Whether key sp has the same value in a and b. */
static int same_value(const cfg_config *a, const cfg_config *b, const spec *sp)
{
    const char *fa = (const char *)a + sp->off, *fb = (const char *)b + sp->off;
    if (sp->k == K_APIKEY) {
        if (a->n_api_keys != b->n_api_keys) return 0;
        for (size_t i = 0; i < a->n_api_keys; i++)
            if (strcmp(a->api_keys[i], b->api_keys[i]) != 0) return 0;
        return 1;
    }
    if (sp->k == K_STR || sp->k == K_LEVEL || sp->k == K_NETS || sp->k == K_HOSTS)
        return strcmp(fa, fb) == 0; /* bytes past NUL vary */
    return memcmp(fa, fb, sp->size) == 0;
}

/* Appends ", key" (or "key" first) to list, cut at len. */
static void list_add(char *list, size_t len, const char *key)
{
    if (list == NULL || len == 0) return;
    size_t n = strlen(list);
    snprintf(list + n, len - n, "%s%s", n ? ", " : "", key);
}

size_t cfg_apply_reload(cfg_config *cur, const cfg_config *next, char *changed, size_t changed_len,
                        char *kept, size_t kept_len)
{
    if (changed != NULL && changed_len > 0) changed[0] = '\0';
    if (kept != NULL && kept_len > 0) kept[0] = '\0';
    size_t n = 0;
    for (size_t i = 0; i < NSPECS; i++) {
        const spec *sp = &specs[i];
        if (same_value(cur, next, sp)) continue;
        if (!cfg_key_reloadable(sp->key)) {
            list_add(kept, kept_len, sp->key);
            continue;
        }
        memcpy((char *)cur + sp->off, (const char *)next + sp->off, sp->size);
        if (sp->k == K_APIKEY) cur->n_api_keys = next->n_api_keys;
        list_add(changed, changed_len, sp->key);
        n++;
    }
    return n;
}

static const char *kind_name(kind k)
{
    switch (k) {
    case K_STR: return "string";
    case K_PORT: return "port";
    case K_SIZE: return "integer";
    case K_SECONDS: return "seconds";
    case K_BOOL: return "bool";
    case K_APIKEY: return "string, repeatable";
    case K_LEVEL: return "level";
    case K_NAMES: return "names";
    case K_NETS: return "addresses";
    case K_HOSTS: return "host names";
    }
    return "?";
}

void cfg_print_help(FILE *out)
{
    for (size_t i = 0; i < NSPECS; i++) {
        const spec *sp = &specs[i];
        char opt[64];
        snprintf(opt, sizeof opt, "--%s", sp->key);
        for (char *p = opt + 2; *p; p++)
            if (*p == '_') *p = '-';
        fprintf(out, "  %-24s %s (%s; default: %s)\n", opt, sp->help, kind_name(sp->k),
                sp->def[0] ? sp->def : "none");
        if (sp->k == K_BOOL) {
            snprintf(opt, sizeof opt, "--no-%s", sp->key);
            for (char *p = opt + 5; *p; p++)
                if (*p == '_') *p = '-';
            fprintf(out, "  %-24s the same as --%s false\n", opt, opt + 5);
        }
    }
    fprintf(out, "  %-24s read a config file (key = value lines) at this point\n", "--config FILE");
}

void cfg_print_defaults(FILE *out)
{
    fprintf(out, "# gpt2d configuration: every key with its default.\n"
                 "# Command-line options (--key value) override this file.\n");
    for (size_t i = 0; i < NSPECS; i++) {
        const spec *sp = &specs[i];
        /* model_name's default is commented out: set, even to gpt2, it
         * would hide the checkpoint's own name (config.h, model_name_set). */
        int unset = sp->def[0] == '\0' || sp->k == K_NAMES;
        fprintf(out, "\n# %s (%s)\n%s%s = %s\n", sp->help, kind_name(sp->k), unset ? "# " : "",
                sp->key, sp->def[0] ? sp->def : "...");
    }
}

/* One address or CIDR ("10.0.0.0/8", "::1", "fd00::/8") into *out. */
static cfg_status net_parse(const char *text, size_t len, cfg_net *out, char *err, size_t errlen)
{
    char buf[64];
    if (len == 0 || len >= sizeof buf)
        return ERRBUF_FAIL(err, errlen, CFG_EVALUE, "'%.*s' is not an address or CIDR", (int)len,
                           text);
    memcpy(buf, text, len);
    buf[len] = '\0';
    char *slash = strchr(buf, '/');
    if (slash != NULL) *slash = '\0';
    memset(out, 0, sizeof *out);
    if (inet_pton(AF_INET, buf, out->addr) == 1) {
        out->family = 4;
        out->bits = 32;
    } else if (inet_pton(AF_INET6, buf, out->addr) == 1) {
        out->family = 6;
        out->bits = 128;
    } else {
        return ERRBUF_FAIL(err, errlen, CFG_EVALUE, "'%s' is not an IPv4 or IPv6 address", buf);
    }
    if (slash != NULL) {
        const char *b = slash + 1;
        char *end;
        unsigned long bits = strtoul(b, &end, 10);
        if (*b < '0' || *b > '9' || *end != '\0' || bits > out->bits)
            return ERRBUF_FAIL(err, errlen, CFG_EVALUE,
                               "'%s/%s': the prefix length must be 0 to %u", buf, b, out->bits);
        out->bits = (unsigned)bits;
    }
    return CFG_OK;
}

cfg_status cfg_nets_parse(const char *list, cfg_net *nets, size_t max, size_t *n, char *err,
                          size_t errlen)
{
    *n = 0;
    const char *p = list;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t') p++;
        if (*p == '\0') return CFG_OK;
        const char *e = p;
        while (*e != '\0' && *e != ',' && *e != ' ' && *e != '\t') e++;
        if (*n == max) return ERRBUF_FAIL(err, errlen, CFG_EVALUE, "more than %zu addresses", max);
        cfg_status rc = net_parse(p, (size_t)(e - p), &nets[*n], err, errlen);
        if (rc != CFG_OK) return rc;
        (*n)++;
        p = e;
    }
}

int cfg_nets_contain(const cfg_net *nets, size_t n, int family, const unsigned char *addr)
{
    for (size_t i = 0; i < n; i++) {
        if (nets[i].family != family) continue;
        unsigned bits = nets[i].bits, whole = bits / 8, rest = bits % 8;
        if (memcmp(nets[i].addr, addr, whole) != 0) continue;
        if (rest != 0) {
            unsigned mask = (0xFFu << (8 - rest)) & 0xFFu;
            if (((nets[i].addr[whole] ^ addr[whole]) & mask) != 0) continue;
        }
        return 1;
    }
    return 0;
}
