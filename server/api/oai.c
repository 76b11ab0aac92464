/*
 * server/api/oai.c: see oai.h. The errors (oai_error_set, oai_error_json), the
 * readers every route's parser shares (oai_int.h: numbers, booleans, prompts,
 * stop, logit_bias, cache_salt, the structured outputs, the body itself) and
 * POST /v1/completions (oai_parse_completion). Chat is in oai_chat.c, the
 * Responses API in oai_resp.c. Every check names the parameter and says what
 * was expected and what came, as OpenAI's own 400s do.
 */
#include "oai_int.h"
#include "http/error_json.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define INVALID "invalid_request_error"

void oai_error_set(oai_error *err, int status, const char *type, const char *code,
                   const char *param, const char *fmt, ...)
{
    err->status = status;
    err->type = type;
    err->code = code;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    http_error_sanitize(err->message);
    http_error_sanitize(err->param);
}

char *oai_error_json(const oai_error *err)
{
    return http_error_json(err->type, err->code, err->param, err->message);
}

void oai_request_free(oai_request *r)
{
    if (r == NULL) return;
    free(r->model);
    for (size_t i = 0; i < r->nprompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    for (size_t i = 0; i < r->nstop; i++) free(r->stop[i]);
    free(r->bias);
    free(r->cache_salt);
    free(r->format_src);
    for (size_t i = 0; i < r->ntools; i++) free(r->tool_names[i]);
    free(r->tool_names);
    free(r->prediction);
    memset(r, 0, sizeof *r);
    r->format = OAI_FORMAT_NONE;
}

int oai_bad(oai_error *err, const char *param, const char *fmt, ...)
{
    err->status = 400;
    err->type = INVALID;
    err->code = NULL;
    snprintf(err->param, sizeof err->param, "%s", param);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    http_error_sanitize(err->message);
    return -1;
}

/* A short text for "got ..." in messages. */
const char *oai_json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "something else";
}

/* Whether string v is exactly lit (a NUL inside v is not ignored). */
int oai_str_is(const json_t *v, const char *lit)
{
    return json_string_length(v) == strlen(lit) && strcmp(json_string_value(v), lit) == 0;
}

/* A number in [lo, hi] (integers count); absent or null keeps *out. */
static int get_number(const json_t *o, const char *key, double lo, double hi, double *out,
                      oai_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (v == NULL || json_is_null(v)) return 0;
    if (!json_is_number(v))
        return oai_bad(err, key, "'%s' must be a number from %g to %g, got %s", key, lo, hi,
                       oai_json_kind(v));
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi)
        return oai_bad(err, key, "'%s' must be from %g to %g, got %g", key, lo, hi, x);
    *out = x;
    return 0;
}

/* An integer in [lo, hi]; absent or null keeps *out. */
int oai_get_int(const json_t *o, const char *key, long long lo, long long hi, long long *out,
                oai_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (v == NULL || json_is_null(v)) return 0;
    if (!json_is_integer(v))
        return oai_bad(err, key, "'%s' must be an integer from %lld to %lld, got %s", key, lo, hi,
                       oai_json_kind(v));
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return oai_bad(err, key, "'%s' must be from %lld to %lld, got %lld", key, lo, hi, x);
    *out = x;
    return 0;
}

int oai_get_bool(const json_t *o, const char *key, int *out, oai_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (v == NULL || json_is_null(v)) return 0;
    if (!json_is_boolean(v))
        return oai_bad(err, key, "'%s' must be a boolean, got %s", key, oai_json_kind(v));
    *out = json_is_true(v);
    return 0;
}

static int parse_ids(const json_t *arr, const oai_limits *lim, const char *param, oai_prompt *p,
                     oai_error *err)
{
    size_t n = json_array_size(arr);
    if (n == 0) return oai_bad(err, param, "'%s' must not be an empty list of tokens", param);
    p->ids = malloc(n * sizeof *p->ids);
    if (p->ids == NULL) return oai_bad(err, param, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0
            || (size_t)json_integer_value(v) >= lim->vocab_size)
            return oai_bad(err, param, "'%s' holds %s where a token id from 0 to %zu belongs",
                           param, json_is_integer(v) ? "an out-of-range integer" : oai_json_kind(v),
                           lim->vocab_size - 1);
        p->ids[i] = (int32_t)json_integer_value(v);
    }
    p->nids = n;
    return 0;
}

static int set_text(oai_prompt *p, const json_t *v, oai_error *err)
{
    size_t n = json_string_length(v);
    p->text = malloc(n + 1);
    if (p->text == NULL) return oai_bad(err, "prompt", "out of memory");
    memcpy(p->text, json_string_value(v), n);
    p->text[n] = '\0';
    p->text_len = n;
    return 0;
}

/* prompt: a string, an array of strings, an array of ids, or an array of
 * arrays of ids; null or absent is "<|endoftext|>" (the spec's default),
 * which the server's tokenizer makes the one token 50256. The embeddings'
 * input (key "input") alike, where it is required. */
static int parse_prompts(const json_t *o, const char *key, const oai_limits *lim, oai_request *r,
                         oai_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (strcmp(key, "prompt") != 0 && (v == NULL || json_is_null(v)))
        return oai_bad(err, key, "'%s' is required", key);
    if (v == NULL || json_is_null(v)) {
        r->prompts = calloc(1, sizeof *r->prompts);
        if (r->prompts == NULL) return oai_bad(err, key, "out of memory");
        r->nprompts = 1;
        json_t *eot = json_string("<|endoftext|>");
        int rc = set_text(&r->prompts[0], eot, err);
        json_decref(eot);
        return rc;
    }
    if (json_is_string(v)) {
        r->prompts = calloc(1, sizeof *r->prompts);
        if (r->prompts == NULL) return oai_bad(err, key, "out of memory");
        r->nprompts = 1;
        return set_text(&r->prompts[0], v, err);
    }
    if (!json_is_array(v))
        return oai_bad(err, key,
                       "'%s' must be a string, a list of strings, a list of token ids or a "
                       "list of lists of token ids, got %s",
                       key, oai_json_kind(v));
    size_t n = json_array_size(v);
    if (n == 0) return oai_bad(err, key, "'%s' must not be an empty list", key);
    const json_t *first = json_array_get(v, 0);
    if (json_is_integer(first)) { /* one prompt of ids */
        r->prompts = calloc(1, sizeof *r->prompts);
        if (r->prompts == NULL) return oai_bad(err, key, "out of memory");
        r->nprompts = 1;
        return parse_ids(v, lim, key, &r->prompts[0], err);
    }
    if (n > lim->max_prompts)
        return oai_bad(err, key, "'%s' has %zu entries; the limit is %zu", key, n,
                       lim->max_prompts);
    r->prompts = calloc(n, sizeof *r->prompts);
    if (r->prompts == NULL) return oai_bad(err, key, "out of memory");
    r->nprompts = n;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        if (json_is_string(e) && json_is_string(first)) {
            if (set_text(&r->prompts[i], e, err) != 0) return -1;
        } else if (json_is_array(e) && json_is_array(first)) {
            if (parse_ids(e, lim, key, &r->prompts[i], err) != 0) return -1;
        } else {
            return oai_bad(err, key, "'%s' mixes kinds: entry %zu is %s, entry 0 is %s", key, i,
                           oai_json_kind(e), oai_json_kind(first));
        }
    }
    return 0;
}

static int parse_stop(const json_t *o, const oai_limits *lim, oai_request *r, oai_error *err)
{
    const json_t *v = json_object_get(o, "stop");
    if (v == NULL || json_is_null(v)) return 0;
    const json_t *items[OAI_MAX_STOP];
    size_t n;
    if (json_is_string(v)) {
        items[0] = v;
        n = 1;
    } else if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > OAI_MAX_STOP)
            return oai_bad(err, "stop", "'stop' may hold at most %d strings, got %zu", OAI_MAX_STOP,
                           n);
        for (size_t i = 0; i < n; i++) items[i] = json_array_get(v, i);
    } else {
        return oai_bad(err, "stop", "'stop' must be a string or a list of up to %d strings, got %s",
                       OAI_MAX_STOP, oai_json_kind(v));
    }
    for (size_t i = 0; i < n; i++) {
        if (!json_is_string(items[i]))
            return oai_bad(err, "stop", "'stop' entries must be strings, got %s",
                           oai_json_kind(items[i]));
        size_t len = json_string_length(items[i]);
        if (len == 0) continue; /* an empty stop string can never stop anything */
        if (len > lim->max_stop_bytes)
            return oai_bad(err, "stop", "a 'stop' string is %zu bytes; the limit is %zu", len,
                           lim->max_stop_bytes);
        r->stop[r->nstop] = malloc(len + 1);
        if (r->stop[r->nstop] == NULL) return oai_bad(err, "stop", "out of memory");
        memcpy(r->stop[r->nstop], json_string_value(items[i]), len + 1);
        r->stop_len[r->nstop++] = len;
    }
    return 0;
}

static int parse_bias(const json_t *o, const oai_limits *lim, oai_request *r, oai_error *err)
{
    const json_t *v = json_object_get(o, "logit_bias");
    if (v == NULL || json_is_null(v)) return 0;
    if (!json_is_object(v))
        return oai_bad(err, "logit_bias", "'logit_bias' must be an object, got %s",
                       oai_json_kind(v));
    size_t n = json_object_size(v);
    r->bias = calloc(n ? n : 1, sizeof *r->bias);
    if (r->bias == NULL) return oai_bad(err, "logit_bias", "out of memory");
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val)
    {
        /* A token id in canonical decimal: digits only (no sign, no space,
         * which strtoll would take), no leading zero ("05" and "5" would be
         * two keys for one token). */
        int canonical = key[0] >= '0' && key[0] <= '9' && !(key[0] == '0' && key[1] != '\0');
        for (const char *p = key; canonical && *p != '\0'; p++) canonical = *p >= '0' && *p <= '9';
        char *end;
        errno = 0;
        long long id = canonical ? strtoll(key, &end, 10) : -1;
        if (!canonical || *end != '\0' || errno != 0 || id < 0 || (size_t)id >= lim->vocab_size)
            return oai_bad(err, "logit_bias",
                           "'logit_bias' key '%.40s' is not a token id from 0 to %zu", key,
                           lim->vocab_size - 1);
        if (!json_is_number(val) || json_number_value(val) < -100 || json_number_value(val) > 100)
            return oai_bad(err, "logit_bias",
                           "'logit_bias' values must be numbers from -100 to 100 (token %lld)", id);
        r->bias[r->nbias++] = (oai_bias){(int32_t)id, (float)json_number_value(val)};
    }
    return 0;
}

/* cache_salt (vLLM's extension): absent or null, or a string of 1 to
 * OAI_MAX_CACHE_SALT bytes, kept with its length (a NUL inside is just a
 * byte: it is hashed, never printed). */
static int parse_cache_salt(const json_t *o, oai_request *r, oai_error *err)
{
    const json_t *v = json_object_get(o, "cache_salt");
    if (v == NULL || json_is_null(v)) return 0;
    if (!json_is_string(v))
        return oai_bad(err, "cache_salt", "'cache_salt' must be a string, got %s",
                       oai_json_kind(v));
    size_t n = json_string_length(v);
    if (n == 0 || n > OAI_MAX_CACHE_SALT)
        return oai_bad(err, "cache_salt", "'cache_salt' must be 1 to %d bytes, got %zu",
                       OAI_MAX_CACHE_SALT, n);
    r->cache_salt = malloc(n);
    if (r->cache_salt == NULL) return oai_bad(err, "cache_salt", "out of memory");
    memcpy(r->cache_salt, json_string_value(v), n);
    r->cache_salt_len = n;
    return 0;
}

/* r's format from kind and the compact text of v. */
static int set_format(oai_request *r, int kind, const json_t *v, const char *param, oai_error *err)
{
    if (r->format != OAI_FORMAT_NONE)
        return oai_bad(err, param, "'%s' cannot be combined with '%s': one output format a request",
                       param, r->format_param);
    r->format = kind;
    snprintf(r->format_param, sizeof r->format_param, "%.47s", param);
    if (v == NULL) return 0;
    if (json_is_string(v)) {
        r->format_len = json_string_length(v);
        r->format_src = malloc(r->format_len + 1);
        if (r->format_src != NULL) memcpy(r->format_src, json_string_value(v), r->format_len + 1);
    } else {
        r->format_src = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        r->format_len = r->format_src ? strlen(r->format_src) : 0;
    }
    if (r->format_src == NULL) return oai_bad(err, param, "out of memory");
    return 0;
}

int oai_parse_format(const json_t *f, const char *param, oai_request *r, oai_error *err)
{
    if (f == NULL || json_is_null(f)) return 0;
    const json_t *type = json_object_get(f, "type");
    if (!json_is_object(f) || !json_is_string(type))
        return oai_bad(err, param,
                       "'%s' must be an object with a 'type': \"text\", \"json_object\" or "
                       "\"json_schema\"",
                       param);
    if (oai_str_is(type, "text")) return 0;
    if (oai_str_is(type, "json_object"))
        return set_format(r, OAI_FORMAT_JSON_OBJECT, NULL, param, err);
    if (!oai_str_is(type, "json_schema"))
        return oai_bad(err, param,
                       "'%s' type '%.40s' is not supported: \"text\", \"json_object\" or "
                       "\"json_schema\"",
                       param, json_string_value(type));
    /* Chat's {"json_schema": {...}}, or the Responses API's flat fields. */
    const json_t *js = json_object_get(f, "json_schema");
    char p[48];
    snprintf(p, sizeof p, "%.30s.json_schema", param);
    if (js == NULL) {
        js = f;
        snprintf(p, sizeof p, "%.30s", param);
    }
    if (!json_is_object(js)) return oai_bad(err, p, "'%s' must be an object", p);
    const json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict");
    const json_t *schema = json_object_get(js, "schema");
    if (name != NULL && !json_is_null(name)
        && (!json_is_string(name) || json_string_length(name) == 0
            || json_string_length(name) > 64))
        return oai_bad(err, p, "'%s.name' must be a string of 1 to 64 characters", p);
    if (strict != NULL && !json_is_null(strict) && !json_is_boolean(strict))
        return oai_bad(err, p, "'%s.strict' must be a boolean", p);
    if (schema == NULL || !(json_is_object(schema) || json_is_boolean(schema)))
        return oai_bad(err, p, "'%s.schema' must be a JSON Schema (an object)", p);
    char sp[64];
    snprintf(sp, sizeof sp, "%.47s.schema", p);
    return set_format(r, OAI_FORMAT_SCHEMA, schema, sp, err);
}

/* The structured outputs of both routes: response_format (the completions
 * route's is an extension), guided_choice and guided_regex (vLLM's
 * extensions). One of them at most; not with stop strings or ignore_eos,
 * which would cut or run past the output the grammar ends. */
static int parse_formats(const json_t *o, oai_request *r, oai_error *err)
{
    if (oai_parse_format(json_object_get(o, "response_format"), "response_format", r, err) != 0)
        return -1;
    const json_t *gc = json_object_get(o, "guided_choice");
    if (gc != NULL && !json_is_null(gc)) {
        size_t i;
        const json_t *one;
        if (!json_is_array(gc) || json_array_size(gc) == 0)
            return oai_bad(err, "guided_choice",
                           "'guided_choice' must be a non-empty array of strings");
        json_array_foreach(gc, i, one)
        {
            if (!json_is_string(one))
                return oai_bad(err, "guided_choice", "'guided_choice' entry %zu is not a string",
                               i);
        }
        if (set_format(r, OAI_FORMAT_CHOICE, gc, "guided_choice", err) != 0) return -1;
    }
    const json_t *gr = json_object_get(o, "guided_regex");
    if (gr != NULL && !json_is_null(gr)) {
        if (!json_is_string(gr) || json_string_length(gr) == 0)
            return oai_bad(err, "guided_regex", "'guided_regex' must be a non-empty string");
        if (set_format(r, OAI_FORMAT_REGEX, gr, "guided_regex", err) != 0) return -1;
    }
    if (r->format == OAI_FORMAT_NONE) return 0;
    if (r->ignore_eos)
        return oai_bad(err, "ignore_eos", "'ignore_eos' cannot be combined with '%s'",
                       r->format_param);
    if (r->nstop > 0)
        return oai_bad(err, "stop",
                       "'stop' cannot be combined with '%s': a stop string would cut the output "
                       "short of its format",
                       r->format_param);
    return 0;
}

/* The fields every route shares: sampling, n, stream, stop,
 * penalties, logit_bias, seed, user and the extensions. */
/* prediction: {"type": "content", "content": a string or an array of
 * {"type": "text", "text": ...} parts}, as OpenAI's Predicted Outputs; the
 * parts joined in order. */
static int parse_prediction(const json_t *o, oai_request *r, oai_error *err)
{
    const json_t *p = json_object_get(o, "prediction");
    if (p == NULL || json_is_null(p)) return 0;
    if (!json_is_object(p))
        return oai_bad(err, "prediction", "'prediction' must be an object, got %s",
                       oai_json_kind(p));
    const json_t *type = json_object_get(p, "type");
    if (!oai_str_is(type, "content"))
        return oai_bad(err, "prediction.type", "'prediction.type' must be \"content\"");
    const json_t *c = json_object_get(p, "content");
    size_t n = json_is_array(c) ? json_array_size(c) : 1, len = 0;
    if (!json_is_string(c) && !json_is_array(c))
        return oai_bad(err, "prediction.content",
                       "'prediction.content' must be a string or an array of text parts, got %s",
                       c == NULL ? "nothing" : oai_json_kind(c));
    for (size_t i = 0; i < n; i++) { /* the parts first checked and measured */
        const json_t *t = c;
        if (json_is_array(c)) {
            const json_t *part = json_array_get(c, i);
            if (!json_is_object(part) || !oai_str_is(json_object_get(part, "type"), "text")
                || !json_is_string(t = json_object_get(part, "text")))
                return oai_bad(err, "prediction.content",
                               "'prediction.content' part %zu must be {\"type\": \"text\", "
                               "\"text\": a string}",
                               i);
        }
        len += json_string_length(t);
    }
    if ((r->prediction = malloc(len + 1)) == NULL)
        return oai_bad(err, "prediction", "out of memory");
    r->prediction_len = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_is_array(c) ? json_object_get(json_array_get(c, i), "text") : c;
        memcpy(r->prediction + r->prediction_len, json_string_value(t), json_string_length(t));
        r->prediction_len += json_string_length(t);
    }
    r->prediction[len] = '\0';
    return 0;
}

/* prediction, and the extensions speculative_tokens and
 * speculative_drafter (docs/api.md, "Speculative decoding"). */
static int parse_speculation(const json_t *o, oai_request *r, oai_error *err)
{
    if (parse_prediction(o, r, err) != 0) return -1;
    long long k = -1;
    if (oai_get_int(o, "speculative_tokens", 0, OAI_MAX_SPECULATIVE, &k, err) != 0) return -1;
    r->has_speculative_tokens = k >= 0;
    r->speculative_tokens = k >= 0 ? (int)k : 0;
    const json_t *d = json_object_get(o, "speculative_drafter");
    if (d == NULL || json_is_null(d)) return 0;
    if (oai_str_is(d, "lookup"))
        r->drafter = OAI_DRAFT_LOOKUP;
    else if (oai_str_is(d, "draft_model"))
        r->drafter = OAI_DRAFT_MODEL;
    else if (oai_str_is(d, "none"))
        r->drafter = OAI_DRAFT_NONE;
    else
        return oai_bad(err, "speculative_drafter",
                       "'speculative_drafter' must be \"lookup\", \"draft_model\" or \"none\"");
    return 0;
}

int oai_parse_shared(const json_t *o, const oai_limits *lim, oai_request *r, oai_error *err)
{
    long long ll;
    double d;
    if (get_number(o, "temperature", 0, 2, &r->temperature, err) != 0) return -1;
    d = r->top_p;
    if (get_number(o, "top_p", 0, 1, &d, err) != 0) return -1;
    if (d <= 0) return oai_bad(err, "top_p", "'top_p' must be above 0 and at most 1, got %g", d);
    r->top_p = d;
    ll = 0;
    if (oai_get_int(o, "top_k", 0, 1000000, &ll, err) != 0) return -1;
    r->top_k = (int)ll;
    ll = 1;
    if (oai_get_int(o, "n", 1, (long long)lim->max_n, &ll, err) != 0) return -1;
    r->n = (size_t)ll;
    if (oai_get_bool(o, "stream", &r->stream, err) != 0) return -1;
    const json_t *so = json_object_get(o, "stream_options");
    if (so != NULL && !json_is_null(so)) {
        if (!r->stream)
            return oai_bad(err, "stream_options",
                           "'stream_options' is only allowed when 'stream' is true");
        if (!json_is_object(so))
            return oai_bad(err, "stream_options", "'stream_options' must be an object, got %s",
                           oai_json_kind(so));
        if (oai_get_bool(so, "include_usage", &r->include_usage, err) != 0) {
            snprintf(err->param, sizeof err->param, "stream_options.include_usage");
            return -1;
        }
    }
    if (parse_stop(o, lim, r, err) != 0) return -1;
    if (get_number(o, "presence_penalty", -2, 2, &r->presence_penalty, err) != 0) return -1;
    if (get_number(o, "frequency_penalty", -2, 2, &r->frequency_penalty, err) != 0) return -1;
    if (parse_bias(o, lim, r, err) != 0) return -1;
    const json_t *seed = json_object_get(o, "seed");
    if (seed != NULL && !json_is_null(seed)) {
        if (!json_is_integer(seed))
            return oai_bad(err, "seed", "'seed' must be an integer, got %s", oai_json_kind(seed));
        r->has_seed = 1;
        r->seed = (uint64_t)json_integer_value(seed);
    }
    const json_t *user = json_object_get(o, "user");
    if (user != NULL && !json_is_null(user) && !json_is_string(user))
        return oai_bad(err, "user", "'user' must be a string, got %s", oai_json_kind(user));
    if (oai_get_bool(o, "ignore_eos", &r->ignore_eos, err) != 0) return -1;
    if (get_number(o, "timeout", 0, 86400, &r->timeout_s, err) != 0) return -1;
    if (parse_cache_salt(o, r, err) != 0) return -1;
    if (parse_formats(o, r, err) != 0) return -1;
    if (parse_speculation(o, r, err) != 0) return -1;
    return 0;
}

/* The body as a JSON object, and the optional `model` (a string without
 * NUL; absent or null means the served model, r->model stays NULL). */
json_t *oai_parse_body(const char *body, size_t len, oai_request *r, oai_error *err)
{
    memset(r, 0, sizeof *r);
    r->max_tokens = 16;
    r->temperature = 1;
    r->top_p = 1;
    r->n = 1;
    r->best_of = 1;
    r->logprobs = -1;
    r->format = OAI_FORMAT_NONE;
    json_error_t jerr;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (o == NULL) {
        oai_bad(err, "", "the body is not valid JSON: %s (at byte %d)", jerr.text, jerr.position);
        return NULL;
    }
    if (!json_is_object(o)) {
        oai_bad(err, "", "the body must be a JSON object, got %s", oai_json_kind(o));
        goto fail;
    }
    const json_t *model = json_object_get(o, "model");
    if (model != NULL && !json_is_null(model)) {
        if (!json_is_string(model)) {
            oai_bad(err, "model", "'model' must be a string, got %s", oai_json_kind(model));
            goto fail;
        }
        size_t n = json_string_length(model);
        if (memchr(json_string_value(model), '\0', n) != NULL) {
            oai_bad(err, "model", "'model' must not contain a NUL character");
            goto fail;
        }
        r->model = strdup(json_string_value(model));
        if (r->model == NULL) {
            oai_bad(err, "model", "out of memory");
            goto fail;
        }
    }
    return o;
fail:
    json_decref(o);
    return NULL;
}

int oai_parse_completion(const char *body, size_t len, const oai_limits *lim, oai_request *r,
                         oai_error *err)
{
    int rc = -1;
    json_t *o = oai_parse_body(body, len, r, err);
    if (o == NULL) goto done;
    const json_t *suffix = json_object_get(o, "suffix");
    if (suffix != NULL && !json_is_null(suffix)) {
        oai_bad(err, "suffix", "'suffix' is not supported: GPT-2 has no insertion mode");
        goto done;
    }
    long long ll;
    if (parse_prompts(o, "prompt", lim, r, err) != 0) goto done;
    ll = (long long)r->max_tokens;
    if (oai_get_int(o, "max_tokens", 0, (long long)lim->max_tokens_limit, &ll, err) != 0) goto done;
    r->max_tokens = (size_t)ll;
    if (oai_parse_shared(o, lim, r, err) != 0) goto done;
    ll = (long long)r->n;
    if (oai_get_int(o, "best_of", 1, (long long)lim->max_n, &ll, err) != 0) goto done;
    r->best_of = (size_t)ll;
    if (r->best_of < r->n) {
        oai_bad(err, "best_of", "'best_of' (%zu) must be at least 'n' (%zu)", r->best_of, r->n);
        goto done;
    }
    if (r->stream && r->best_of > r->n) {
        oai_bad(err, "best_of", "'best_of' cannot be used with 'stream'");
        goto done;
    }
    ll = -1;
    if (oai_get_int(o, "logprobs", 0, OAI_MAX_LOGPROBS, &ll, err) != 0) goto done;
    r->logprobs = (int)ll;
    if (oai_get_bool(o, "echo", &r->echo, err) != 0) goto done;
    rc = 0;
done:
    json_decref(o);
    if (rc != 0) oai_request_free(r);
    return rc;
}

int oai_parse_embeddings(const char *body, size_t len, const oai_limits *lim, size_t n_embd,
                         oai_request *r, oai_error *err)
{
    int rc = -1;
    json_t *o = oai_parse_body(body, len, r, err);
    if (o == NULL) goto done;
    if (parse_prompts(o, "input", lim, r, err) != 0) goto done;
    for (size_t i = 0; i < r->nprompts; i++)
        if (r->prompts[i].text != NULL && r->prompts[i].text_len == 0) {
            oai_bad(err, "input", "'input' entry %zu is an empty string", i);
            goto done;
        }
    const json_t *f = json_object_get(o, "encoding_format");
    if (f != NULL && !json_is_null(f) && !oai_str_is(f, "float") && !oai_str_is(f, "base64")) {
        oai_bad(err, "encoding_format", "'encoding_format' must be \"float\" or \"base64\", got %s",
                json_is_string(f) ? "another string" : oai_json_kind(f));
        goto done;
    }
    r->embed_base64 = f != NULL && oai_str_is(f, "base64");
    long long d = 0;
    if (oai_get_int(o, "dimensions", 1, LLONG_MAX, &d, err) != 0) goto done;
    r->embed_dimensions = (size_t)d;
    if (d != 0 && n_embd != 0 && (size_t)d != n_embd) {
        oai_bad(err, "dimensions",
                "'dimensions' must be this model's width, %zu: its embeddings are not trained to "
                "be cut shorter",
                n_embd);
        goto done;
    }
    const json_t *u = json_object_get(o, "user");
    if (u != NULL && !json_is_null(u) && !json_is_string(u)) {
        oai_bad(err, "user", "'user' must be a string, got %s", oai_json_kind(u));
        goto done;
    }
    r->embed = 1;
    r->max_tokens = 0;
    r->n = r->best_of = 1;
    r->logprobs = -1;
    r->temperature = 0;
    rc = 0;
done:
    json_decref(o);
    if (rc != 0) oai_request_free(r);
    return rc;
}
