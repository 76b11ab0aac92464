/*
 * tests/engine_logits.c [--adapter ADAPTER] MODE DIR ID...: the engine's
 * logits at every position of the ids, float32 (n, V) on stdout, for the
 * numpy and PyTorch reference tests. MODE "all": one prefill step with
 * logits for every row; "incremental": one token per step through the KV
 * cache. --adapter: with a PEFT LoRA adapter folder applied unmerged
 * (eng_adapter, F32 factors).
 */
#include "step.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    const char *adir = NULL;
    if (argc > 2 && strcmp(argv[1], "--adapter") == 0) {
        adir = argv[2];
        argc -= 2;
        argv += 2;
    }
    if (argc < 4) {
        fprintf(stderr, "usage: engine_logits [--adapter ADAPTER] all|incremental DIR ID...\n");
        return 2;
    }
    int all = strcmp(argv[1], "all") == 0;
    size_t n = (size_t)argc - 3;
    int32_t *ids = malloc(n * sizeof *ids);
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)strtol(argv[3 + i], NULL, 10);
    char err[512];
    eng_model *m;
    if (eng_model_load(argv[2], &m, err, sizeof err) != ENG_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    eng_adapter *ad = NULL;
    if (adir != NULL
        && eng_adapter_load(m, adir, ENG_ADAPTER_F32, &ad, err, sizeof err) != ENG_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    size_t V = eng_model_config(m)->n_vocab;
    eng_kv *kv;
    eng_workspace *w;
    eng_seq seq = {0};
    const eng_config *cfg = eng_model_config(m);
    size_t kv_bytes = (n + 32) * cfg->n_layer * 2 * cfg->n_embd * sizeof(float); /* n positions */
    if (eng_kv_new(m, kv_bytes, 16, &kv, err, sizeof err) != ENG_OK
        || eng_kv_reserve(kv, &seq, n) != ENG_OK || eng_workspace_new(m, n, 0, &w) != ENG_OK) {
        fprintf(stderr, "kv/workspace: %s\n", err);
        return 1;
    }
    float *logits = malloc(n * V * sizeof *logits);
    if (all) {
        eng_item it = {.seq = &seq,
                       .tokens = ids,
                       .n = n,
                       .want = ENG_LOGITS_ALL,
                       .logits = logits,
                       .adapter = ad};
        if (eng_forward(m, kv, w, &it, 1, err, sizeof err) != ENG_OK) goto fail;
    } else {
        for (size_t i = 0; i < n; i++) {
            eng_item it = {.seq = &seq,
                           .tokens = ids + i,
                           .n = 1,
                           .want = ENG_LOGITS_LAST,
                           .logits = logits + i * V,
                           .adapter = ad};
            if (eng_forward(m, kv, w, &it, 1, err, sizeof err) != ENG_OK) goto fail;
        }
    }
    fwrite(logits, sizeof *logits, n * V, stdout);
    eng_kv_release(kv, &seq);
    free(logits);
    free(ids);
    eng_workspace_free(w);
    eng_kv_free(kv);
    eng_adapter_free(ad);
    eng_model_free(m);
    return 0;
fail:
    fprintf(stderr, "%s\n", err);
    return 1;
}
