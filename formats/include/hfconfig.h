/*
 * formats/include/hfconfig.h: the numbers of a Hugging Face GPT-2
 * checkpoint's config.json that the engine reads beside its weights
 * (n_head and layer_norm_epsilon, which the tensors' shapes do not give,
 * and the dimensions they do, to be checked against them). The file is
 * read as JSON and each field reported with its JSON kind; what the values
 * must be is the engine's to judge (engine/model.c).
 *
 * Prefix: hfc_. Thread: any.
 */
#ifndef GPT2D_FORMATS_HFCONFIG_H
#define GPT2D_FORMATS_HFCONFIG_H

#include "safetensors.h" /* sft_status */

#include <stddef.h>

/* One field: absent, a JSON integer, another JSON number, or something
 * else (a string, null, an object...). x is the number's value for INT and
 * REAL; i the integer's for INT. */
typedef enum { HFC_ABSENT = 0, HFC_INT = 1, HFC_REAL = 2, HFC_OTHER = 3 } hfc_kind;
typedef struct {
    hfc_kind kind;
    long long i;
    double x;
} hfc_value;

typedef struct {
    int present; /* the file could be opened */
    hfc_value n_head, layer_norm_epsilon;
    hfc_value n_layer, n_embd, vocab_size, n_positions;
} hfc_config;

/*
 * Reads path (a config.json). A file that cannot be opened is no error:
 * SFT_OK with present 0 (the file is optional). A file that is not a JSON
 * object (or repeats a key) is SFT_EFORMAT with err "PATH: not a JSON
 * object". Otherwise SFT_OK, present 1 and each field as found.
 */
sft_status hfc_read(const char *path, hfc_config *out, char *err, size_t errlen);

#endif
