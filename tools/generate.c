/*
 * tools/generate.c: `gpt2d generate`, text from a prompt, offline: the whole
 * pipeline (tokenizer, model over its mapping, paged KV cache, sampler) in
 * one process, one sequence.
 */
#include "tools.h"

#include "engine.h"
#include "tokenizer.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PREFILL_CHUNK 256

static void gen_usage(FILE *out)
{
    fprintf(out, "usage: gpt2d generate --model DIR [options]\n"
                 "Continues a prompt with the model in DIR (model.safetensors, vocab.json,\n"
                 "merges.txt, optional config.json). The continuation goes to stdout as raw\n"
                 "bytes, tokens per second to stderr.\n"
                 "  --prompt TEXT       the prompt (\"The meaning of life is\"; an empty prompt\n"
                 "                      starts from <|endoftext|>, which in the text is\n"
                 "                      the token 50256, as in the server)\n"
                 "  --tokens N          tokens to generate (60)\n"
                 "  --temperature T     0 is greedy (0.8)\n"
                 "  --top-k K           0 is off (40)\n"
                 "  --top-p P           1 is off (1)\n"
                 "  --seed S            random seed (42)\n"
                 "  --ignore-eos        do not stop at <|endoftext|>\n"
                 "  --ids               print {\"prompt\": [...], \"generated\": [...]} instead\n");
}

static int parse_num(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(v >= lo && v <= hi)) return 0;
    *out = v;
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct {
    const bpe *tok;
    int print;
    int32_t *out;
    size_t nout;
    int done;
    eng_finish finish;
    char message[256];
    double t0, t1; /* submit; first token (end of the prefill) */
} gen_state;

/* Scheduler events: tokens are printed as they come. */
static void on_event(void *user, const eng_event *ev)
{
    gen_state *st = user;
    if (ev->kind == ENG_EV_TOKEN) {
        if (st->nout == 0) st->t1 = now_s();
        st->out[st->nout++] = ev->token;
        size_t len;
        const char *b = bpe_token_bytes(st->tok, ev->token, &len);
        if (st->print && b != NULL && !(ev->token == BPE_EOT)) {
            fwrite(b, 1, len, stdout);
            fflush(stdout);
        }
    } else if (ev->kind == ENG_EV_DONE) {
        st->done = 1;
        st->finish = ev->finish;
        snprintf(st->message, sizeof st->message, "%s", ev->message ? ev->message : "");
    }
}

int tool_generate(int argc, char **argv)
{
    static const struct option longopts[] = {{"model", required_argument, 0, 'm'},
                                             {"prompt", required_argument, 0, 'p'},
                                             {"tokens", required_argument, 0, 'n'},
                                             {"temperature", required_argument, 0, 't'},
                                             {"top-k", required_argument, 0, 'k'},
                                             {"top-p", required_argument, 0, 'P'},
                                             {"seed", required_argument, 0, 's'},
                                             {"ignore-eos", no_argument, 0, 'e'},
                                             {"ids", no_argument, 0, 'i'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    const char *model_dir = NULL, *prompt = "The meaning of life is";
    double ntok = 60, temp = 0.8, topk = 40, topp = 1, seed = 42;
    int ignore_eos = 0, ids_out = 0, c, idx = 0;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":", longopts, &idx)) != -1) {
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n':
            if (!parse_num(optarg, 0, 1e6, &ntok) || ntok != floor(ntok)) goto bad;
            break;
        case 't':
            if (!parse_num(optarg, 0, 100, &temp)) goto bad;
            break;
        case 'k':
            if (!parse_num(optarg, 0, 1e7, &topk) || topk != floor(topk)) goto bad;
            break;
        case 'P':
            if (!parse_num(optarg, 0, 1, &topp) || topp <= 0) goto bad;
            break;
        case 's':
            if (!parse_num(optarg, 0, 9007199254740992.0, &seed)) goto bad;
            break;
        case 'e': ignore_eos = 1; break;
        case 'i': ids_out = 1; break;
        case 'h': gen_usage(stdout); return 0;
        default: goto bad;
        }
    }
    if (model_dir == NULL || optind != argc) {
        fprintf(stderr, "gpt2d generate: %s\n",
                model_dir == NULL ? "--model DIR is required" : "unexpected argument");
        gen_usage(stderr);
        return 2;
    }

    char err[512];
    int rc = 1;
    bpe *tok = NULL;
    eng_model *m = NULL;
    eng_sched *sch = NULL;
    int32_t *ids = NULL;
    size_t nids = 0;
    gen_state st = {0};
    if (bpe_load_dir(model_dir, &tok, err, sizeof err) != BPE_OK
        || eng_model_load(model_dir, &m, err, sizeof err) != ENG_OK) {
        fprintf(stderr, "gpt2d generate: %s\n", err);
        goto done;
    }
    const eng_config *cfg = eng_model_config(m);
    if (eng_model_copied_bytes(m) > 0)
        fprintf(stderr,
                "gpt2d generate: copied %.1f MB of misaligned or half-precision weights "
                "(`gpt2d convert` writes an aligned file that maps without copying)\n",
                (double)eng_model_copied_bytes(m) / 1e6);
    if (bpe_encode_special(tok, prompt, strlen(prompt), &ids, &nids, err, sizeof err) != BPE_OK) {
        fprintf(stderr, "gpt2d generate: %s\n", err);
        goto done;
    }
    if (nids == 0) {
        free(ids);
        ids = malloc(sizeof *ids);
        if (ids == NULL) {
            fprintf(stderr, "gpt2d generate: out of memory\n");
            goto done;
        }
        ids[0] = BPE_EOT;
        nids = 1;
    }
    size_t want = (size_t)ntok;
    if (want == 0) {
        fprintf(stderr, "gpt2d generate: --tokens must be at least 1\n");
        goto done;
    }
    /* KV for exactly this one sequence. */
    size_t block = 16, per_block = cfg->n_layer * 2 * block * cfg->n_embd * sizeof(float);
    eng_sched_opts so = {.kv_bytes = ((nids + want + block - 1) / block) * per_block,
                         .block_len = block,
                         .max_running = 1,
                         .max_queue = 1,
                         .step_tokens = PREFILL_CHUNK};
    if (eng_sched_new(m, &so, &sch, err, sizeof err) != ENG_OK) {
        fprintf(stderr, "gpt2d generate: %s\n", err);
        goto done;
    }
    st.tok = tok;
    st.print = !ids_out;
    st.out = malloc(want * sizeof *st.out);
    if (st.out == NULL) {
        fprintf(stderr, "gpt2d generate: out of memory\n");
        goto done;
    }
    eng_request req = {
        .prompt = ids,
        .nprompt = nids,
        .max_tokens = want,
        .sampling = {.temperature = (float)temp, .top_k = (int)topk, .top_p = (float)topp},
        .seed = (uint64_t)seed,
        .ignore_eos = ignore_eos,
        .logprobs = -1,
        .on_event = on_event,
        .user = &st};
    uint64_t id;
    if (eng_sched_submit(sch, &req, &id, err, sizeof err) != ENG_OK) {
        fprintf(stderr, "gpt2d generate: %s\n", err);
        goto done;
    }
    st.t0 = now_s();
    while (!st.done && eng_sched_step(sch)) {
    }
    double t2 = now_s();
    if (st.finish == ENG_FINISH_ERROR) {
        fprintf(stderr, "gpt2d generate: %s\n", st.message);
        goto done;
    }
    if (ids_out) {
        printf("{\"prompt\": [");
        for (size_t i = 0; i < nids; i++) printf(i ? ", %d" : "%d", ids[i]);
        printf("], \"generated\": [");
        for (size_t i = 0; i < st.nout; i++) printf(i ? ", %d" : "%d", st.out[i]);
        printf("]}\n");
    } else {
        putchar('\n');
    }
    double prefill = st.t1 - st.t0, decode = t2 - st.t1;
    fprintf(stderr,
            "gpt2d generate: prompt %zu tokens in %.3f s (%.1f tokens/s); %zu tokens in "
            "%.3f s (%.1f tokens/s)\n",
            nids, prefill, (double)nids / prefill, st.nout, decode,
            st.nout > 1 ? (double)(st.nout - 1) / decode : 0.0);
    rc = fflush(stdout) == 0 ? 0 : 1;
done:
    free(st.out);
    free(ids);
    eng_sched_free(sch);
    eng_model_free(m);
    bpe_free(tok);
    return rc;
bad:
    tool_option_error("generate", c, argv, optind, longopts, idx);
    gen_usage(stderr);
    return 2;
}
