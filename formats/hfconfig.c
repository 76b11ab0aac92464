/*
 * formats/hfconfig.c: a Hugging Face config.json's GPT-2 numbers
 * (hfconfig.h), read with jansson as the safetensors header is.
 */
#include "hfconfig.h"

#include "errbuf.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static hfc_value field(const json_t *root, const char *key)
{
    const json_t *v = json_object_get(root, key);
    if (v == NULL) return (hfc_value){.kind = HFC_ABSENT};
    if (json_is_integer(v))
        return (hfc_value){
            .kind = HFC_INT, .i = json_integer_value(v), .x = (double)json_integer_value(v)};
    if (json_is_real(v)) return (hfc_value){.kind = HFC_REAL, .x = json_real_value(v)};
    return (hfc_value){.kind = HFC_OTHER};
}

sft_status hfc_read(const char *path, hfc_config *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) return SFT_OK; /* optional */
    json_error_t jerr;
    json_t *root = json_loadf(fp, JSON_REJECT_DUPLICATES, &jerr);
    fclose(fp);
    if (root == NULL || !json_is_object(root)) {
        json_decref(root);
        return ERRBUF_FAIL(err, errlen, SFT_EFORMAT, "%s: not a JSON object", path);
    }
    out->present = 1;
    out->n_head = field(root, "n_head");
    out->layer_norm_epsilon = field(root, "layer_norm_epsilon");
    out->n_layer = field(root, "n_layer");
    out->n_embd = field(root, "n_embd");
    out->vocab_size = field(root, "vocab_size");
    out->n_positions = field(root, "n_positions");
    json_decref(root);
    return SFT_OK;
}
