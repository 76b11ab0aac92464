/*
 * tests/hold_model.c DIR: loads the model in DIR, runs one forward step (so
 * every weight page is read), prints "ready", the bytes copied at load,
 * those of the BF16 pair or Q8 quad copies and those of the panel copy
 * (engine.h), and holds the model until stdin closes. tests/test_shared_weights.sh reads its memory
 * from /proc.
 */
#include "step.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: hold_model DIR\n");
        return 2;
    }
    char err[512];
    eng_model *m;
    if (eng_model_load(argv[1], &m, err, sizeof err) != ENG_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    eng_kv *kv;
    eng_workspace *w;
    eng_seq s = {0};
    size_t V = eng_model_config(m)->n_vocab;
    float *logits = malloc(V * sizeof *logits);
    int32_t tok = 1;
    eng_item it = {.seq = &s, .tokens = &tok, .n = 1, .want = ENG_LOGITS_LAST, .logits = logits};
    if (logits == NULL || eng_kv_new(m, 1 << 20, 1, &kv, err, sizeof err) != ENG_OK
        || eng_kv_reserve(kv, &s, 1) != ENG_OK || eng_workspace_new(m, 1, 1, &w) != ENG_OK
        || eng_forward(m, kv, w, &it, 1, err, sizeof err) != ENG_OK) {
        fprintf(stderr, "hold_model: %s\n", err);
        return 1;
    }
    printf("ready %zu %zu %zu\n", eng_model_copied_bytes(m), eng_model_pair_bytes(m),
           eng_model_panel_bytes(m));
    fflush(stdout);
    while (getchar() != EOF) {
    }
    eng_kv_release(kv, &s);
    eng_workspace_free(w);
    eng_kv_free(kv);
    free(logits);
    eng_model_free(m);
    return 0;
}
