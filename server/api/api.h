/*
 * server/api/api.h: the API layer, above the HTTP layer (server/http/)
 * and below the daemon (server/daemon/). A request's way through its
 * files, top down:
 *
 *   completions.c  /v1/completions and /v1/chat/completions: parsing (by
 *                  oai.c), admission, engine events into choices; the
 *                  completion policy of the 1 s tick and after each step
 *   cmpl_respond.c best_of ranking, the JSON answer and the SSE stream
 *   logprobs.c     the logprobs object of a choice
 *   cmpl_job.c     the completion job: its struct's lifetime, its token
 *                  counts, its hooks on the request, its list on the srv
 *   tokenize.c     the tokenizer job: prompts to ids (inline or on a
 *                  tokenizer thread, admitted like generation, with the
 *                  parser its caller gives); /tokenize and /detokenize
 *   tokpool.c      the tokenizer threads (low priority)
 *   step.c         the engine step driver: one step at a time on the
 *                  libuv work queue, then the srv_api's after-step hook
 *   responses.c    /v1/responses: a Responses request onto the chat
 *                  completion (its template, job, SSE writer), the
 *                  response object and its semantic stream events
 *   resp_prompt.c  a Responses request's conversation (the store read) and
 *                  its prompt, made where it is tokenized
 *   resp_routes.c  GET/DELETE /v1/responses/{id}, .../input_items
 *   resp_store.c   the stored responses (bounded, shared fairly by API keys)
 *   adapters.c, ckpt.c  what a request's `model` names: a LoRA adapter or a
 *                  served checkpoint (models.h)
 *   oai.c          OpenAI request parsing and validation (pure): errors,
 *                  completions, the readers every route shares
 *   oai_chat.c     chat's messages and their rendering (pure)
 *   oai_resp.c     the Responses request (pure); oai_int.h is what the
 *                  three oai files share
 *   chat_template.c the chat template (pure)
 *   sse.c          SSE framing (pure)
 *
 * This layer's state is struct srv_api (below): the daemon makes it and
 * links it to the srv (srv.api), so that a route finds it through its
 * request (r->s->api); the HTTP layer holds it only as an opaque pointer.
 *
 * Thread: the loop thread, except tokenize's job (on tokpool.c's threads)
 * and the step (eng_sched_execute, on the libuv work queue).
 *
 * Prefixes: cmpl_ (completions), lp_ (logprobs), tok_ (the tokenizer
 * job), tpool_ (its threads), step_ (the step driver), oai_, sse_, resp_
 * (the Responses route), rs_ (its store), srv_api (the state), met_ (the
 * counters' reasons).
 */
#ifndef GPT2D_SERVER_API_H
#define GPT2D_SERVER_API_H

#include "api/models.h"
#include "api/oai.h"
#include "api/sse.h"
#include "http/http.h"
#include "structured.h"
#include "tokenizer.h"

/* The longest stop string a request may give; the stop matcher holds back
 * less than this, so its output fits on the stack. */
#define SRV_MAX_STOP_BYTES 256
/* The bytes of one token, at most (GPT-2's longest is 128). */
#define SRV_MAX_TOKEN_BYTES 256
/* Bodies whose texts are at least this long are tokenized on the work queue:
 * the tokenizer does ~50 MB/s, so a 1 MB prompt would hold the loop thread
 * (every stream's next token) for ~20 ms; a typical prompt costs microseconds
 * and is cheaper inline than a trip through the queue. */
#define SRV_TOKENIZE_INLINE_BYTES (64u * 1024u)

typedef struct tokpool tokpool;
typedef struct tok_job tok_job;
typedef struct cmpl_job cmpl_job;
typedef struct resp_store resp_store;
typedef struct srv_api srv_api;

/* ---- The API layer's state -------------------------------------------------- */

/* Why a request's generation was cancelled before it finished
 * (gpt2d_requests_cancelled_total{reason}); each request counts once. */
typedef enum {
    MET_CANCEL_CLIENT_CLOSED,  /* its client closed the connection */
    MET_CANCEL_QUEUE_TIMEOUT,  /* it waited longer than queue_timeout */
    MET_CANCEL_TIMEOUT,        /* its own timeout passed */
    MET_CANCEL_STREAM_STALLED, /* its stream stayed unread (stream_stall_timeout) */
    MET_CANCEL_SHUTDOWN,       /* the drain's end */
    MET_CANCEL_RESPONSE_BYTES, /* its answer outgrew max_response_bytes */
    MET_CANCEL_REASONS
} met_cancel_reason;

/* What this layer counts for /metrics (the daemon renders it beside the
 * HTTP layer's http_metrics); loop thread only. */
typedef struct {
    uint64_t cancelled[MET_CANCEL_REASONS];
    met_hist ttft, itl;               /* completions.c: a choice's tokens' times */
    met_hist step_seconds, step_rows; /* step.c: each engine step */
} cmpl_metrics;

struct srv_api {
    /* The served checkpoints (ckpt[0] the primary), their shared tokenizer
     * and chat template (chat_on 0 when chat_template is "none"); the
     * daemon loads them. model: the primary's (ckpt[0].model), what the
     * adapters, the draft and the build's own reports are made for. */
    srv_ckpt ckpt[SRV_MAX_CKPT];
    size_t nckpt;
    eng_model *model;
    eng_model *draft; /* draft_model (speculative decoding), or NULL */
    bpe *tok;
    oai_template chat;
    int chat_on;
    char fingerprint[32]; /* system_fingerprint */
    /* The seeds of requests without one (cmpl_seed, issue 35): SipHash of
     * a counter under a key the daemon draws from the operating system at
     * start-up, never logged or written anywhere; loop thread only. */
    uint64_t seed_key[2];
    uint64_t seed_count;
    /* Structured outputs: the trie of the vocabulary's token bytes, and the
     * compiled grammars by a hash of their source (bounded, locked inside:
     * the tokenizer threads compile). */
    gram_vocab *gvocab;
    gram_cache *gcache;
    /* Tool calls (chat_tools.c): the tokens of " <tool_call>" as a reply
     * begins one, and every token's bit set (a free reply's mask); made at
     * the first request with tools. */
    int32_t *tool_marker;
    size_t ntool_marker;
    uint64_t *all_tokens;
    /* tokenize.c, tokpool.c: the tokenizer threads, the requests on them,
     * and those waiting for a tokenize slot (tokenize_concurrency), oldest
     * first; at most max_queue of them. */
    tokpool *tokpool;
    size_t tokenizing;
    srv_req *tok_wait_head, *tok_wait_tail;
    size_t tok_nwait;
    /* step.c: the step in flight on the work queue, and when it started
     * (the daemon's watchdog reads it). */
    uv_work_t work;
    int in_flight;
    double step_started;
    size_t step_ckpt;       /* the checkpoint whose step runs (or ran last): the next
                             * plan asks the others first (round robin) */
    unsigned step_delay_ms; /* GPT2D_TEST_STEP_DELAY_MS: a wedged step, for tests */
    /* The hook the completions register on the way down (daemon.c):
     * after each engine step's events are delivered (step.c, which
     * completions.c calls, so it cannot call back by name). */
    void (*after_step)(srv *s);
    srv_req *cmpl_list;     /* requests with engine work, newest first (cmpl_job.c) */
    resp_store *resp_store; /* stored responses (resp_store.c; NULL: none yet) */
    /* The daemon's drain, as the routes see it (lifecycle.c sets them):
     * draining, new completions get 503; cut, the drain is over and what
     * still ran was ended (a final event, or 503). */
    int draining, cut;
    cmpl_metrics met;
    /* adapters.c: the resident LoRA adapters (at most max_loras), and the
     * loads on the work queue. */
    adp_entry *adapters[ADP_MAX];
    size_t nadapters;
    size_t adp_loading;
};

/* ---- The jobs ------------------------------------------------------------- */

/* The tokenizer job of a request (tokenize.c): its text prompts to token
 * ids, inline or on a tokenizer thread (state TOKENIZING). While on_thread
 * the worker writes the results and nothing else touches them until
 * tok_done runs on the loop thread. */
struct tok_job {
    /* What to do: */
    /* Work beside the tokenizing (where it runs; the structured outputs'
     * compile), or NULL; heavy: always on a tokenizer thread. */
    int (*work)(srv_req *r);
    int heavy;
    int (*parse)(srv_req *r); /* a body still to parse first (where the
                               * tokenizing runs), or NULL */
    size_t max_prompt_tokens; /* a completion's limit, read by the worker */
    /* Where it is: */
    srv_req *qnext; /* tokpool.c's queues */
    int on_thread;  /* a tokenizer thread holds it (and a reference to r) */
    int waiting;    /* in the srv_api's tokenize wait list (wprev, wnext) */
    srv_req *wprev, *wnext;
    /* What it made: */
    json_t *tokenize_body; /* /tokenize: the parsed body, which holds the text */
    const char **text;     /* [nprompts]: each prompt's text (NULL: given as */
    size_t *text_len;      /* ids), which its request's parsed body holds     */
    int32_t **prompt_ids;  /* [nprompts][prompt_len[i]] */
    size_t *prompt_len;
    size_t nprompts;
    /* A prediction (speculative decoding) to encode beside the prompts:
     * its text (its request's parsed body holds it; NULL: none), cut to
     * pred_max_bytes first; its ids (ordinary text: no special token). */
    const char *pred_text;
    size_t pred_text_len, pred_max_bytes;
    int32_t *pred_ids;
    size_t npred;
    int parse_failed; /* parse returned -1 (its error is its caller's) */
    int body_status;  /* /(de)tokenize: a 400 for the body (body_param, err) */
    const char *body_param;
    char *answer; /* /(de)tokenize: the answer's JSON, made beside the tokens */
    int failed;   /* a prompt failed to encode: status, err */
    bpe_status status;
    char err[256];
};

/* One logprobs entry of a whole (non-streaming) answer, kept as numbers
 * until the answer is written (about 60 bytes, against some 700 as
 * jansson values). */
typedef struct {
    int32_t id;    /* the token                                         */
    float logprob; /* of id; has 0: none (the first prompt token)       */
    int32_t has;   /* 1: logprob and the alternatives are known         */
    int32_t ntop;  /* alternatives in top_ids, cut to the request's     */
    int32_t top_ids[ENG_MAX_TOP];
    float top_logprobs[ENG_MAX_TOP];
    size_t offset; /* text_offset: characters before the token */
} lp_entry;

/* One completion choice: one engine request. */
typedef struct {
    srv_req *req;
    size_t index;  /* choices[index] */
    size_t prompt; /* which prompt */
    uint64_t id;   /* engine request id */
    int live;      /* submitted, DONE not yet delivered */
    int done;
    const char *finish; /* "stop" or "length" */
    int stopped;        /* a stop string ended it */
    utf8_stream utf8;
    stop_matcher *stop;
    char *text; /* non-streaming: the whole text; streaming: this chunk's */
    size_t text_len, text_cap;
    size_t tokens;
    /* logprobs: {tokens, token_logprobs, top_logprobs, text_offset}; for a
     * stream, the entries of the chunk being built; for a whole answer an
     * empty one (the entries are in lpe). NULL when not asked. */
    json_t *lp;
    lp_entry *lpe; /* a whole answer's logprobs entries, lpe_n of lpe_cap */
    size_t lpe_n, lpe_cap;
    utf8_stream off_utf8; /* text_offset: characters before each token, */
    size_t off_chars;     /* counted from the start of the prompt        */
    size_t prompt_fed;    /* prompt tokens counted into off_chars so far */
    double t_last;        /* when the last token came (inter-token latency) */
    double lp_sum;        /* best_of: the sum and count of the chosen    */
    size_t lp_n;          /* tokens' logprobs                            */
    int trim;             /* chat: leading white space of the reply still dropped */
    int trim_tail;        /* chat: white space the stop matcher holds at the end is dropped */
    size_t cached;        /* DONE: prompt tokens from the prefix cache   */
    size_t drafted;       /* DONE: speculation's drafted tokens, and      */
    size_t accepted;      /* those the model drew as drafted              */
    float *embedding;     /* DONE of an embedding: n_embd floats (owned) */
} srv_choice;

/* How a route other than completions and chat shapes a completion's answer
 * (responses.c registers it; the completion path calls through it, so it
 * never names its caller). Each member is called where chat's own shape
 * would be. */
typedef struct {
    void (*open)(srv_req *r);            /* a stream's first events (at admission) */
    void (*chunk)(srv_choice *c);        /* a stream: c's text since the last call */
    void (*finish_stream)(srv_req *r);   /* a stream's last events (after every DONE) */
    enum MHD_Result (*send)(srv_req *r); /* the whole answer (after every DONE) */
    void (*free)(srv_req *r);            /* frees shape_data (with the job) */
} cmpl_shape;

/* The completion job of a request (cmpl_job.c; completions.c and
 * cmpl_respond.c fill it): the parsed request, one choice per prompt x
 * candidate, the SSE queue. */
struct cmpl_job {
    int chat;       /* /v1/chat/completions */
    oai_limits lim; /* the parser's limits */
    oai_error parse_err;
    oai_request oreq;
    srv_choice *choices;
    size_t nchoices;
    size_t nlive; /* choices submitted whose DONE has not come */
    size_t ndone;
    /* Streaming: SSE bytes waiting to be sent. Over sse.limit the choices
     * are paused (eng_sched_pause) since t_over; cmpl_backlog decides. */
    sse_queue sse;
    int paused;
    double t_over;
    /* A failure after submission (cmpl_set_error: the first one stays). */
    int error_status;
    char error_msg[256];
    const char *error_code;       /* its OpenAI error code, or NULL */
    srv_req *prev, *next;         /* the srv_api's list of requests with engine work */
    int cancel_counted;           /* gpt2d_requests_cancelled_total counted it, */
    met_cancel_reason cancel_why; /* under this reason */
    size_t answer_bytes;          /* what the answer holds so far (max_response_bytes) */
    /* The LoRA adapter its `model` picked (a reference, dropped when the
     * job is freed), and its name for the answers' `model`; NULL, "": the
     * base model. */
    eng_adapter *adapter;
    char model[CFG_LORA_NAME_MAX];
    /* The checkpoint its `model` picked (cmpl_job_new: the primary). */
    srv_ckpt *ckpt;
    /* Embeddings (oreq.embed): choices[0 .. submitted) went to the engine,
     * at most SRV_EMBED_WINDOW ahead of those done, under this salt. */
    size_t submitted;
    uint64_t salt;
    double t_progress;       /* when the last of them finished (or the first went) */
    const cmpl_shape *shape; /* NULL: completions' or chat's own */
    void *shape_data;        /* the shape's state */
    /* Structured outputs: the compiled format (a reference), or NULL; a
     * format that did not compile leaves its 400 in format_err. */
    gram *grammar;
    int format_failed;
    oai_error format_err;
    /* A whole answer as it is written (cmpl_respond.c): a piece at a time,
     * as the connection takes it, so no answer is ever held whole. */
    struct {
        size_t *order; /* the choices in the answer's order (best_of ranked) */
        size_t norder; /* prompts x n */
        size_t k;      /* the choice being written: order[k]; norder: the end */
        int part;      /* within it: 0 its head, then its logprobs' columns */
        size_t at;     /* the next logprobs entry of the part */
        char *usage;   /* the usage object, as of the last DONE */
        char *buf;     /* bytes made and not yet sent: [off, len) */
        size_t off, len, cap;
        int done; /* the last byte is made */
    } ans;
};

/* ---- Structured outputs (completions.c) -------------------------------------- */

/* The vocabulary's trie and the grammar cache of s->api (GRAM_CACHE_ENTRIES,
 * and structured_cache_mb of bytes), from its tokenizer. 0, or -1 (out of
 * memory). */
#define GRAM_CACHE_ENTRIES 64
int srv_grammar_init(srv *s);

/* ---- cmpl_job.c ------------------------------------------------------------ */

/* Attaches a completion job and a tokenizer job to r, and the completion
 * hooks (NULL: no memory). */
cmpl_job *cmpl_job_new(srv_req *r);
/* Completion tokens so far (the prompt's: tok_prompt_tokens). */
size_t cmpl_completion_tokens(const srv_req *r);
/* Cancels every live choice of r (their DONE events follow, some at once),
 * counted once in gpt2d_requests_cancelled_total under
 * why when something was still live. */
void cmpl_cancel_for(srv_req *r, met_cancel_reason why);
/* Records r's failure after submission, once: the first failure's status,
 * OpenAI code (or NULL) and words stay, a later one is dropped (0); 1 when
 * this one was recorded. The answer (cmpl_send, or a stream's error event)
 * carries it; cancelling is the caller's. */
int cmpl_set_error(srv_req *r, int status, const char *code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* The OpenAI error type of a failure's status: 400 is the client's. */
const char *cmpl_error_type(int status);
/* Ends r with a 500 once (an error event for a stream): out of memory. */
void cmpl_fail_oom(srv_req *r);
/* The bytes one logprobs entry (a position: token, logprob, offset, and
 * each of its top alternatives) takes in an answer at least: jansson
 * writes a logprob in 9-20 bytes, a token in 3 or more. Answers measured
 * at GPT-2 scale average about 30 + 28 a top entry. */
#define CMPL_LP_POS_BYTES 24u
#define CMPL_LP_TOP_BYTES 24u
/* One position's least bytes with ntop alternatives: the up-front estimate
 * of max_response_bytes and the running count use the same figure. */
static inline size_t cmpl_lp_bytes(size_t ntop)
{
    return CMPL_LP_POS_BYTES + ntop * CMPL_LP_TOP_BYTES;
}
/* The answer's least bytes for a choice besides its text and logprobs. */
#define CMPL_CHOICE_BYTES 96u
/* Counts bytes more of r's answer; past max_response_bytes ends it once
 * with a 400 naming the fields (an error event for a stream) and cancels
 * what still generates. */
void cmpl_grow(srv_req *r, size_t bytes);
/* Ends r once with that 400 and cancels what still generates: its answer
 * is over max_response_bytes. */
void cmpl_too_large(srv_req *r);
/* A stream counts the bytes it queues (sse.max_bytes = max_response_bytes):
 * an event refused for them ends r as cmpl_too_large does; the events
 * before it stay, and the ending (an error event and [DONE], or
 * response.failed and error) follows them. */
void cmpl_stream_bytes_check(srv_req *r);
/* Puts r on, and takes it off, the srv_api's list of requests with engine
 * work (the tick's). */
void cmpl_list_add(srv_req *r);

/* ---- step.c ---------------------------------------------------------------- */

/* Starts an engine step on the work queue if one is planned and none runs;
 * after it, the events are delivered (cmpl_on_event), then s->api->after_step. */
void step_kick(srv *s);

/* ---- completions.c --------------------------------------------------------- */

enum MHD_Result cmpl_route(srv_req *r);      /* POST /v1/completions      */
enum MHD_Result cmpl_route_chat(srv_req *r); /* POST /v1/chat/completions */
/* The 503 (with its metric) every generating route answers while the
 * server drains. */
enum MHD_Result cmpl_refuse_draining(srv_req *r);

/* Continues a completion once its prompts are token ids (the continuation of
 * tokenizing). */
enum MHD_Result cmpl_admit(srv_req *r);
/* The base seed of request q, the one place one is made for every route
 * (completions, chat, responses): q's own seed when it has one (its text is
 * then what it always was), else a fresh one, SipHash-2-4 of the next
 * a->seed_count under a->seed_key: unpredictable to other clients, and
 * different on two replicas and after a restart (issue 35). Choice i of the
 * request samples with the base + i either way. */
uint64_t cmpl_seed(srv_api *a, const oai_request *q);
/* The engine's event callback (eng_request.on_event; user is a srv_choice). */
void cmpl_on_event(void *user, const eng_event *ev);
/* A completion or chat body into r->cmpl->oreq by the route's parser
 * (cmpl->chat, cmpl->lim), then the prompts given as ids into r->tok's
 * prompt_ids. 0, or -1 with cmpl->parse_err set. The tokenizer job's
 * parser (tok_prompts): thread: the loop thread, or a tokenizer thread. */
int cmpl_parse(srv_req *r);
/* The parsed request's prompts into r->tok: the texts to tokenize, the ids
 * given as ids copied (cmpl_parse's second half, for the routes with parsers
 * of their own). 0, or -1 with cmpl->parse_err set (out of memory). */
int cmpl_job_prompts(srv_req *r);
/* The tokenizer job's work (tok_job.work) for a request with an output
 * format: compiles it through the grammar cache; a refusal becomes the
 * request's format_err (cmpl_admit answers it). Always 0. */
int cmpl_compile_format(srv_req *r);
/* A fresh walk of g for one sequence, as its mask (cmpl_format.c); 0, or
 * -1 out of memory. */
int cmpl_format_mask_new(srv *s, gram *g, eng_mask *out);
/* Speculative decoding (cmpl_spec.c). The request's drafting: its
 * speculative_tokens and speculative_drafter over the server's, its
 * prediction's ids (from r->tok); into er. */
void cmpl_speculation(const srv_req *r, eng_request *er);
/* The request's prediction into its tokenizer job (encoded beside the
 * prompts). */
void cmpl_job_prediction(srv_req *r);
/* 1 when the request's speculation can be served; else 0 with its 400
 * queued (*rc): a draft_model drafter on a server without one. */
int cmpl_speculation_ok(srv_req *r, enum MHD_Result *rc);
/* The usage's completion_tokens_details of a request with a prediction
 * (OpenAI's accepted_prediction_tokens, rejected_prediction_tokens), added
 * to usage; nothing without one. */
void cmpl_usage_prediction(const srv_req *r, json_t *usage);
/* The 1 s tick (daemon/timers.c): each completion's wait limit (queue_timeout,
 * 503), its own timeout, a stalled stream's cancel, a waiting stream's
 * ": waiting" comment; then the tokenizer's wait list. */
void cmpl_tick(srv *s, double now);
/* After each step (srv_api.after_step): streams whose clients fell behind sit
 * out the next step. */
void cmpl_after_step(srv *s);
/* The drain's end (lifecycle.c): every completion still generating ends
 * with a final event naming the shutdown (why; streams) or 503 (whole
 * answers). Returns how many it cut. */
size_t cmpl_cut_all(srv *s, const char *why);
/* Appends n bytes of text to choice c (a failure ends r with a 500). */
void cmpl_choice_text(srv_choice *c, const char *p, size_t n);

/* ---- cmpl_respond.c --------------------------------------------------------- */

json_t *cmpl_base(const srv_req *r);
/* Queues obj as one SSE event and drops the reference (NULL breaks the
 * stream). */
void cmpl_sse_event(srv_req *r, json_t *obj);
/* Streaming: sends the chunk built for choice c (its text and logprobs). */
void cmpl_chunk_flush(srv_choice *c);
/* Streaming: choice c's last chunk, with its finish_reason. */
void cmpl_sse_finish(srv_req *r, const srv_choice *c);
/* Streaming chat: the first chunk of every choice ({"role": "assistant"}). */
void cmpl_chat_open(srv_req *r);
/* The final events of a stream: an error or usage, then [DONE]. */
void cmpl_finish_stream(srv_req *r);
/* A chat or completions stream's end after its choices' last chunks: the
 * error event or the usage chunk, then [DONE] (a shape that writes chat's
 * chunks ends with it). */
void cmpl_finish_stream_tail(srv_req *r);
/* The usage object of a chat or completions answer. */
json_t *cmpl_usage_json(const srv_req *r);
/* The non-streaming answer (the continuation of a suspended completion). */
enum MHD_Result cmpl_send(srv_req *r);
/* The answer of an OpenAI error e (a parse's or a format's: its status). */
enum MHD_Result cmpl_send_oai_error(srv_req *r, const oai_error *e);
/* Queues the SSE response of r. */
enum MHD_Result cmpl_start_stream(srv_req *r);
/* best_of: one prompt's best_of candidates (mean token logprob mean_lp[j])
 * ranked into order[0..best_of), best first; the answer is the first n.
 * Ties keep their order, and with best_of == n the candidates stay as they
 * are. */
void cmpl_rank(const double *mean_lp, size_t best_of, size_t n, size_t *order);
/* A stream's back-pressure, after its queue grew or shrank: pauses its
 * choices while the client leaves more than stream_backlog_bytes unread,
 * resumes them when it catches up; 1 when it resumed them (the caller
 * kicks the engine). */
int cmpl_backlog(srv_req *r);
/* Cancels a stream paused for longer than stream_stall_timeout, with an
 * error event; 1 if it did. */
int cmpl_stall_check(srv_req *r, double now);
/* ---- chat_tools.c ----------------------------------------------------------- */

/* A chat request with tools to call (oreq.tool_mode): its answer's shape
 * (tool_calls, finish_reason "tool_calls", the streamed delta.tool_calls)
 * set on r, and what its sequences need. 0, or -1 (out of memory). */
int tools_begin(srv_req *r);
/* Sequence's mask for tool_choice auto: free text, unless the reply begins
 * with the call's marker, then the marker's tokens and the call compiled in
 * g (a reference is taken). 0, or -1 (out of memory). */
int tools_mask_new(srv_req *r, gram *g, eng_mask *out);
/* A whole reply read as a call of one of q's tools (by q's tool_mode; with
 * auto, a call begins with template t's marker): 1 with its name and
 * arguments (compact JSON), both malloc'd; 0 when it is text, a call cut
 * short, or not one of the tools. */
int tools_parse_call(const char *text, size_t len, const oai_request *q, const oai_template *t,
                     char **name, char **args);
/* The id of choice index's call: "call_" and 24 hex digits. */
void tools_call_id(const srv_req *r, size_t index, char *out, size_t len);
/* A reply read as it streams (chat's and Responses' streams): its text
 * goes to ops->text, a call to ops->head (its name, once known) and then
 * ops->args (the arguments in pieces). */
typedef struct {
    void (*text)(void *u, const char *p, size_t n);
    void (*head)(void *u, const char *name, size_t n);
    void (*args)(void *u, const char *p, size_t n);
} tools_reader_ops;
typedef struct {
    int state;
    char *buf;
    size_t len, cap;
    const char *marker; /* the template's call_prefix (borrowed: the server's) */
} tools_reader;
/* A reader for a reply of tool_mode mode whose calls begin with marker
 * (borrowed; the chat template's call_prefix). */
void tools_reader_init(tools_reader *t, int mode, const char *marker);
void tools_reader_free(tools_reader *t);
/* n more bytes of the reply (whole characters). 0, or -1 (out of memory). */
int tools_reader_feed(tools_reader *t, const char *p, size_t n, const tools_reader_ops *ops,
                      void *u);
/* The reply ended (cut: by max_tokens): what was held goes out; 1 when it
 * was a whole call. */
int tools_reader_end(tools_reader *t, int cut, const tools_reader_ops *ops, void *u);
/* 1 once the reply is known to be a call. */
int tools_reader_is_call(const tools_reader *t);

/* ---- embeddings.c ----------------------------------------------------------- */

/* The engine requests an embeddings request keeps in flight at once: its
 * inputs go in as earlier ones finish, so a batch of thousands neither
 * fills the wait queue (which every request shares) nor holds more than
 * this many sequences. */
#define SRV_EMBED_WINDOW 8
enum MHD_Result embed_route(srv_req *r); /* POST /v1/embeddings */

/* ---- responses.c ------------------------------------------------------------ */

enum MHD_Result resp_route(srv_req *r);        /* POST /v1/responses              */
enum MHD_Result resp_route_get(srv_req *r);    /* GET /v1/responses/{id}[/input_items] */
enum MHD_Result resp_route_delete(srv_req *r); /* DELETE /v1/responses/{id}       */

/* ---- resp_store.c ----------------------------------------------------------- */

/* One item of a stored conversation (its strings in its node): a message,
 * or a function call (text: its arguments) or a call's output (text: the
 * output), as oai_msg. */
typedef struct {
    oai_role role;
    const char *text; /* NUL-terminated */
    size_t len;
    int kind;            /* oai_msg_kind */
    const char *name;    /* a call's; else NULL */
    const char *call_id; /* a call's or an output's; else NULL */
} rs_msg;

/* A node of a stored conversation: its messages after those of parent,
 * the older turns (shared by every response that continued them). Made
 * and let go of on the loop thread; its messages never change, so a
 * tokenizer thread may read a node its request holds a reference to. */
typedef struct rs_turns rs_turns;
struct rs_turns {
    size_t refs;
    rs_turns *parent;        /* the older messages (a reference), or NULL */
    resp_store *st;          /* the store counting its bytes, or NULL */
    uint64_t owner;          /* the key whose bytes they are */
    rs_turns *sprev, *snext; /* the store's list of nodes */
    size_t bytes;            /* what this node takes */
    size_t chain_bytes;      /* ... with every older node */
    size_t chain_msgs;       /* messages here and in every older node */
    size_t n;                /* msg[0..n), oldest first */
    rs_msg msg[];
};

/* A node of msgs[0..n) (copied) after parent (a reference is taken; NULL:
 * none), counted by st (NULL: not counted) as owner's; when parent's chain
 * and these would pass chain_max bytes, the node copies instead the newest
 * of parent's chain's messages that fit in chain_max / 2, then msgs, and
 * keeps no parent. NULL: no memory. */
rs_turns *rs_turns_new(resp_store *st, uint64_t owner, rs_turns *parent, const rs_msg *msgs,
                       size_t n, size_t chain_max);
rs_turns *rs_turns_ref(rs_turns *t);
/* Lets go of a reference (NULL: nothing); the last frees the node and lets
 * go of its parent. */
void rs_turns_unref(rs_turns *t);

/* One stored response. */
typedef struct rs_entry rs_entry;
struct rs_entry {
    char id[48];           /* resp_... */
    uint64_t owner;        /* the API key's keyed hash (srv_req.key_id); 0: no keys */
    char *response;        /* the response object as answered, compact JSON */
    rs_turns *turns;       /* its conversation: the history, this request's input */
    size_t nin;            /* (turns->msg[n - 1 - nin .. n - 1)) and its output */
                           /* (turns->msg[n - 1]) */
    size_t bytes;          /* what it takes, less its node (counted as the node's) */
    rs_entry *prev, *next; /* its key's use order */
    rs_entry *hnext;       /* its hash chain */
};

/* An entry (not stored yet) for the response object (serialized) with its
 * node turns (the reference is taken) of which the newest nin + 1 messages
 * are the request's input and its output. NULL: no memory (turns is the
 * caller's still). */
rs_entry *rs_entry_new(const char *id, uint64_t owner, const json_t *response, rs_turns *turns,
                       size_t nin);
/* An empty store (NULL: no memory). */
resp_store *rs_new(void);
/* Frees st and every entry. NULL: nothing. */
void rs_free(resp_store *st);
void rs_entry_free(rs_entry *e);
/* Stores e (a new id), taking it: first entries go until it fits under
 * max_count entries and max_bytes, each the least recently used of its key,
 * the key e's owner when that is over its fair share (the bounds over the
 * keys with entries), else the key furthest over its share. 1, or 0 when e
 * alone is over the bounds, or what is left over them is held by running
 * requests (e is freed). */
int rs_put(resp_store *st, rs_entry *e, size_t max_count, size_t max_bytes);
/* Frees entries until st holds at most max_count entries and max_bytes
 * (bounds lowered by a reload), the least recently used of the key furthest
 * over its share each time; how many went. */
size_t rs_trim(resp_store *st, size_t max_count, size_t max_bytes);
/* The entry id of owner, now the most recently used; NULL when none (or
 * another owner's). */
rs_entry *rs_get(resp_store *st, const char *id, uint64_t owner);
/* Frees the entry id of owner: 0, or -1 when there is none. */
int rs_delete(resp_store *st, const char *id, uint64_t owner);
size_t rs_count(const resp_store *st);
size_t rs_bytes(const resp_store *st);

/* The state of one Responses request (the completion job's shape_data;
 * responses.c makes and frees it, resp_prompt.c makes its prompt). */
typedef struct {
    oai_resp_request rq; /* what the request said (its req moved to cmpl->oreq) */
    rs_turns *prev;      /* previous_response_id's conversation (a reference), or NULL */
    oai_msg *in;         /* the input's messages, after it */
    size_t nin;
    /* The prompt, made where it is tokenized (prepare), within limits fixed
     * at routing (the model's context n_ctx, the tokenizer job's
     * max_prompt_tokens: fit_limit, prompt_budget): */
    size_t n_ctx;
    size_t fit, budget;
    /* A large body parsed on a tokenizer thread whose conversation names
     * stored items (previous_response_id, item_reference): its prompt is
     * made after the loop thread has read them from the store. */
    int deferred;
    size_t total;   /* messages in the conversation (history and input) */
    size_t dropped; /* truncation auto: the oldest of them left out */
    int too_long;   /* the prompt does not fit: ... */
    int over;       /* ... known to pass `tokens` (else it has that many) */
    size_t tokens;
    char msg_id[48]; /* the output message's id */
    char *text;      /* a stream: the output so far */
    size_t len, cap;
    json_t *lp;     /* a stream with logprobs: every token's entry so far */
    json_int_t seq; /* the next event's sequence_number */
    /* Tools (rq.req.tool_mode): the reply read as text or a call; a call's
     * name and arguments (owned) once known; a stream's message item is
     * opened when the reply turns out to be text. */
    tools_reader rd;
    int item_open;
    char *call_name, *call_args;
    size_t args_len, args_cap;
} resp_job;

/* resp_prompt.c: the conversation of a Responses request: the previous
 * response's stored node (a reference), then the input's items, each
 * item_reference made the stored item it names (a copy). Thread: loop (the
 * store is the loop's). 0; -1 with the error sent (*rc). */
int resp_build_conv(srv_req *r, enum MHD_Result *rc);
/* resp_prompt.c: the prompt of a Responses request, made where it is
 * tokenized (the tokenizer job's parser; a tokenizer thread when a stored
 * history or a format is involved): the conversation from its newest
 * message back, fitted to the context as truncation says. 0. */
int resp_prepare(srv_req *r);
/* The most tokens a prompt that fits may have, and what truncation "auto"
 * cuts one to (into resp_job.fit / .budget where the body is parsed; they
 * read only what was fixed at routing). */
size_t resp_fit_limit(const srv_req *r);
size_t resp_prompt_budget(const srv_req *r);

/* ---- logprobs.c ----------------------------------------------------------- */

/* The logprobs of choice c in its request's shape: legacy completions
 * {tokens, token_logprobs, top_logprobs, text_offset}, or chat {content}. */
json_t *lp_new(const srv_req *r);
/* How many tokens lp holds. */
size_t lp_count(const json_t *lp);
/* Counts token id into c's character offset; returns the offset before it. */
size_t lp_offset_feed(srv_choice *c, int32_t id);
/* Appends one token's entry (ev NULL: the first prompt token, no logprob):
 * to c->lp for a stream, to c->lpe for a whole answer. Out of memory ends
 * the request with a 500 (cmpl_fail_oom). */
void lp_add(srv_choice *c, int32_t id, const eng_event *ev, size_t offset);
/* The JSON of a whole answer's logprobs column `part` (completions: 1
 * tokens, 2 token_logprobs, 3 top_logprobs, 4 text_offset; chat: 1
 * content) for entry e, with jansson's spelling of every value: a new
 * value (json_decref it), NULL when memory ran out. */
json_t *lp_entry_json(const srv_req *r, const lp_entry *e, int part);
/* ---- tokpool.c: the tokenizer threads ------------------------------------ */

typedef void (*tpool_fn)(srv_req *r);

/* Starts nthreads low-priority threads that call run(r) for each submitted
 * request, then done(r) on the loop thread. 0, or -1 with err (then
 * tpool_close and tpool_free what *out holds). */
int tpool_new(uv_loop_t *loop, size_t nthreads, tpool_fn run, tpool_fn done, tokpool **out,
              char *err, size_t errlen);
/* Queues r (FIFO); one thread runs it when free. */
void tpool_submit(tokpool *p, srv_req *r);
/* Stops taking work and closes the wake-up handle (before uv_run returns);
 * done is not called again. NULL, or a pool already closed: nothing. */
void tpool_close(tokpool *p);
/* Joins the threads (a job running finishes first), calls drop(r) for
 * each request still queued or done but not delivered (the loop stopped
 * first), and frees p. After uv_run returned. NULL: nothing. */
void tpool_free(tokpool *p, tpool_fn drop);
/* ---- tokenize.c ----------------------------------------------------------- */

enum MHD_Result tok_route_tokenize(srv_req *r);   /* POST /tokenize   */
enum MHD_Result tok_route_detokenize(srv_req *r); /* POST /detokenize */

/* Attaches a new tokenizer job to r (NULL: no memory); no limit on a
 * prompt's tokens until the caller sets max_prompt_tokens. */
struct tok_job *tok_job_new(srv_req *r);
/* Room for n prompts (texts and ids). 0, or -1 (no memory). */
int tok_job_prompts(struct tok_job *t, size_t n);
void tok_job_free(struct tok_job *t);
/* The prompt tokens of r's job (0 while a tokenizer thread writes them). */
size_t tok_prompt_tokens(const srv_req *r);
/* r's connection ended: out of the tokenizer's wait list. */
void tok_closed(srv_req *r);

/* Tokenizes r's text prompts (inline, or on the work queue with r
 * suspended), then runs then. Large bodies are admitted like generation:
 * tokenize_concurrency at once on the work queue, up to max_queue more
 * waiting (for at most queue_timeout: 503), others get 429. A prompt stops
 * being tokenized past the job's max_prompt_tokens (BPE_ETOOBIG). parse
 * (NULL: none) is run first, where the tokenizing runs: a body that is
 * the work (parse sets the job's texts; -1 sets parse_failed). */
enum MHD_Result tok_prompts(srv_req *r, int (*parse)(srv_req *r), http_cont then);
/* Starts s->api->tokpool with tokenize_concurrency threads. 0, or -1 with err. */
int tok_pool_start(srv *s, char *err, size_t errlen);
/* Stops s->api->tokpool's threads (after uv_run returned) and frees the
 * requests they held, whose connections libmicrohttpd has closed. */
void tok_pool_free(srv *s);
/* The 1 s tick: waiting bodies past queue_timeout get 503. */
void tok_tick(srv *s, double now);
/* Token ids as text: their bytes made valid UTF-8 (a split character is
 * U+FFFD). *out is malloc'd; BPE_EUNKNOWN for an id that is not a token
 * (with err), BPE_ENOMEM. */
bpe_status tok_ids_text(const bpe *tok, const int32_t *ids, size_t n, char **out, size_t *len,
                        char *err, size_t errlen);

#endif
