/*
 * config/include/config.h: gpt2d serve's configuration, one validated struct.
 *
 * Sources, lowest first: built-in defaults < a config file (`key = value`
 * lines, `#` comments, blank lines) < the command line (`--key value` or
 * `--key=value`; every key is also a long option). An unknown key or a bad
 * value is an error whose message names the key and where it came from
 * (`FILE:LINE` or `--key`). The table of keys is the one place that knows
 * them: the parser, `gpt2d serve --help` and docs/operations.md all come
 * from it.
 *
 * Prefix: cfg_. Knows nothing of HTTP or the engine. Thread: any (no state).
 */
#ifndef GPT2D_CONFIG_CONFIG_H
#define GPT2D_CONFIG_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    CFG_OK = 0,
    CFG_EIO = 1,     /* the file cannot be read                  */
    CFG_ESYNTAX = 2, /* a line that is not `key = value`          */
    CFG_EKEY = 3,    /* an unknown key                            */
    CFG_EVALUE = 4   /* a value of the wrong type or out of range */
} cfg_status;

#define CFG_MAX_KEYS 16  /* API keys */
#define CFG_MAX_NAMES 8  /* names the model answers to */
#define CFG_STR_MAX 4096 /* paths and other strings */
#define CFG_MAX_NETS 32  /* trusted_proxies entries */
#define CFG_MAX_MODELS 8 /* checkpoints one daemon serves (model = DIR,NAME=DIR...) */
#define CFG_MODEL_NAME_MAX 64

/* An IPv4 or IPv6 network: family 4 or 6, the address (4 or 16 bytes used)
 * and the prefix length in bits. */
typedef struct {
    int family;
    unsigned char addr[16];
    unsigned bits;
} cfg_net;

typedef struct {
    /* Listening */
    char host[256];
    uint16_t port;
    size_t max_connections;
    double connection_timeout_s;     /* idle keep-alive connections */
    double request_header_timeout_s; /* a new connection's complete head */
    double body_timeout_s;           /* the longest gap between body bytes */
    size_t body_min_rate;            /* bytes/s a body averages past body_timeout (0: any) */
    size_t max_connections_per_ip;   /* 0: no limit; trusted_proxies are exempt */
    /* A refusal answered before the request's body was read (413, 401,
     * 429, ...): its connection then reads and drops what the client still
     * sends, for this long after the answer and this many bytes at most,
     * so that the client reads the answer rather than a reset (0: none). */
    double refusal_linger_s;
    size_t refusal_linger_bytes;
    /* Proxies (and loopback, by default): exempt from the per-address
     * limit; their X-Forwarded-For names the client (the text and it
     * parsed). */
    char trusted_proxies[1024];
    cfg_net trusted_nets[CFG_MAX_NETS];
    size_t n_trusted_nets;
    /* Host names requests may carry (comma-separated, "*": any; empty: the
     * loopback names on a loopback bind, else any). */
    char allowed_hosts[1024];
    /* HTTPS: a PEM certificate chain and its key (both empty: plain HTTP;
     * read again on SIGHUP). */
    char tls_cert_file[CFG_STR_MAX];
    char tls_key_file[CFG_STR_MAX];
    /* GnuTLS's priority string for the handshakes (gnutls_priority_init's
     * syntax; the daemon checks it, this module knows nothing of GnuTLS). */
    char tls_priorities[512];
    size_t stream_backlog_bytes;   /* unread SSE bytes before a stream pauses */
    double stream_stall_timeout_s; /* paused that long: cancelled */
    size_t tokenize_concurrency;   /* bodies tokenized at once on the work queue */
    /* The compiled structured-output formats kept for reuse: at most this
     * many MiB of automata (structured/cache.c counts each one's bytes). */
    size_t structured_cache_mb;
    /* The model */
    char model_dir[CFG_STR_MAX]; /* the primary's folder (cfg_models_split) */
    /* The checkpoints served beside it, model's entries after the first
     * (cfg_models_split): each one's name and folder. */
    size_t n_more_models;
    struct {
        char name[CFG_MODEL_NAME_MAX];
        char dir[CFG_STR_MAX];
    } more_models[CFG_MAX_MODELS - 1];
    char fallback_model[CFG_STR_MAX];     /* served while model_dir has no weights; "": none */
    char model_name[128];                 /* the first name: what responses and /v1/models report */
    char model_names[CFG_MAX_NAMES][128]; /* every name a request's `model` may use */
    size_t n_model_names;
    int model_name_set; /* 1: a file or option set model_name (else the checkpoint's name may) */
    char chat_template[CFG_STR_MAX]; /* "default", "none" or a template file */
    size_t chat_max_tokens;          /* a chat reply without max_tokens: at most this */
    size_t speculative_tokens;       /* drafted tokens a step (0: no speculation)      */
    char speculative_drafter[16];    /* lookup, draft_model or none                    */
    size_t speculative_max_batch;    /* no drafts in steps of more decoding sequences  */
    char draft_model[CFG_STR_MAX];   /* the draft model's directory; "": none          */
    /* LoRA adapters (issue 36): name=DIR entries loaded at start-up and
     * again on SIGHUP (cfg_lora_modules_parse), the most resident at once,
     * the highest rank accepted, and the folder under which
     * POST /v1/load_lora_adapter may load ("": that route is off). */
    char lora_modules[CFG_STR_MAX];
    size_t max_loras;
    size_t max_lora_rank;
    char lora_dir[CFG_STR_MAX];
    /* The engine */
    size_t threads; /* 0: one per CPU */
    size_t kv_cache_mb;
    size_t kv_block;        /* positions per KV block */
    int prefix_cache;       /* 1: share cached KV blocks of equal prefixes */
    size_t max_running;     /* sequences per step */
    size_t step_tokens;     /* prompt tokens per step (prefill chunk)  */
    size_t max_queue;       /* waiting requests before 429 */
    double queue_timeout_s; /* longest wait for admission before 503 */
    /* Request limits */
    size_t max_body_bytes;
    size_t max_prompt_tokens;
    size_t max_tokens_limit;            /* ceiling for `max_tokens` */
    size_t max_n;                       /* ceiling for `n` and `best_of` */
    size_t max_sequences_per_request;   /* prompts x max(n, best_of) of one request */
    size_t max_response_bytes;          /* the largest answer a request may ask for */
    size_t responses_store_max;         /* stored responses kept at most (count) */
    size_t responses_store_bytes;       /* ... and their bytes at most */
    size_t responses_store_chain_bytes; /* one conversation's bytes at most */
    size_t max_embedding_inputs;        /* inputs of one POST /v1/embeddings */
    /* Access */
    char api_keys[CFG_MAX_KEYS][128];
    size_t n_api_keys;
    int auth_open_health; /* 1: /health, /ready, /metrics need no key */
    /* 1: every API key shares the prefix cache (one tenant); 0: each key's
     * prompts are cached apart (server/http/router.c, http_key_salt). */
    int prefix_cache_shared_across_keys;
    /* Operation */
    double shutdown_timeout_s;
    char log_level[16];     /* error, warn, info, debug */
    double info_interval_s; /* throughput log line while busy; 0: never */
    int ui;                 /* 1: the playground page at / */
    /* Browsers: the Origins allowed (comma-separated; "*": any; empty: a
     * request carrying Origin is refused) */
    char cors_origins[1024];
} cfg_config;

const char *cfg_strerror(cfg_status s);

/* Fills c with the built-in defaults. */
void cfg_defaults(cfg_config *c);

/*
 * Sets one key from text. origin names where the value came from, for the
 * message ("/etc/gpt2d/gpt2d.conf:12" or "--port"). `api_key` may be given
 * several times (each adds a key); every other key replaces its value.
 */
cfg_status cfg_set(cfg_config *c, const char *key, const char *value, const char *origin, char *err,
                   size_t errlen);

/* Reads a config file into c (on top of what c holds). Borrows path. */
cfg_status cfg_load_file(cfg_config *c, const char *path, char *err, size_t errlen);

/*
 * Applies command-line options argv[first..argc) (`--key value`,
 * `--key=value`); `--config FILE` is read in place, so later options win.
 * Stops at the first error.
 */
cfg_status cfg_parse_args(cfg_config *c, int argc, char **argv, int first, char *err,
                          size_t errlen);

/* Whether name is one of the served model's names (model_name). Borrows
 * name. */
int cfg_model_name_ok(const cfg_config *c, const char *name);

/* One entry of lora_modules: an adapter's name and folder. */
#define CFG_LORA_NAME_MAX 64
typedef struct {
    char name[CFG_LORA_NAME_MAX]; /* [A-Za-z0-9._-], 1..63 bytes */
    char dir[CFG_STR_MAX];
} cfg_lora_module;

/* Parses list ("name=DIR,name=DIR...", spaces around entries ignored; ""
 * gives none) into out[0..*n), at most max: CFG_EVALUE naming the entry
 * for a bad name, a missing '=' or DIR, a name twice or more than max. */
cfg_status cfg_lora_modules_parse(const char *list, cfg_lora_module *out, size_t max, size_t *n,
                                  char *err, size_t errlen);
/* model = DIR[,[NAME=]DIR...]: the first entry stays in model_dir (the
 * primary, named by model_name), the others go to more_models, each named
 * NAME or, without one, its folder's last component. CFG_EVALUE naming the
 * entry for an empty one, a bad or repeated name (one of model_name's, an
 * adapter's in lora_modules, another entry's), a NAME= on the first entry,
 * or more than CFG_MAX_MODELS. Run after cfg_validate. */
cfg_status cfg_models_split(cfg_config *c, char *err, size_t errlen);
/* Whether name is an adapter name lora_modules and the load route accept. */
int cfg_lora_name_ok(const char *name);

/* Parses list (addresses and CIDRs separated by commas or spaces) into
 * nets[0..*n), at most max. An error names the entry. */
cfg_status cfg_nets_parse(const char *list, cfg_net *nets, size_t max, size_t *n, char *err,
                          size_t errlen);
/* Whether addr (4 bytes for family 4, 16 for 6) is in one of nets. */
int cfg_nets_contain(const cfg_net *nets, size_t n, int family, const unsigned char *addr);

/* Cross-key checks (e.g. a model directory is set). */
cfg_status cfg_validate(const cfg_config *c, char *err, size_t errlen);

/* Whether key may change while gpt2d serve runs (SIGHUP): api_key,
 * log_level, the request limits, max_queue, queue_timeout and the
 * connection deadlines; docs/operations.md lists them. */
int cfg_key_reloadable(const char *key);

/* A reload: copies into cur every reloadable key whose value differs in
 * next, and names those keys in changed ("a, b"); names in kept every other
 * key that differs, which keeps its value in cur (it needs a restart).
 * Either list may be NULL; a list too long is cut. Returns how many keys
 * were copied. */
size_t cfg_apply_reload(cfg_config *cur, const cfg_config *next, char *changed, size_t changed_len,
                        char *kept, size_t kept_len);

/* Every key with its type, default and meaning, one per line. */
void cfg_print_help(FILE *out);

/* The config file form of every key and its default (the shipped
 * deploy/gpt2d.conf is this output). */
void cfg_print_defaults(FILE *out);

#endif
