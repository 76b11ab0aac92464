/*
 * tools/meta.c: --meta KEY=VALUE (meta.h).
 */
#include "meta.h"

#include "wformat.h"

#include <stdio.h>
#include <string.h>

void tool_meta_set(sft_meta *meta, size_t *n, const char *key, const char *value)
{
    for (size_t i = 0; i < *n; i++)
        if (strcmp(meta[i].key, key) == 0) {
            meta[i].value = value;
            return;
        }
    meta[(*n)++] = (sft_meta){key, value};
}

int tool_meta_add(const char *cmd, char *arg, sft_meta *meta, size_t *n)
{
    char *eq = strchr(arg, '=');
    if (eq == NULL || eq == arg) {
        fprintf(stderr, "gpt2d %s: --meta takes KEY=VALUE, not '%s'\n", cmd, arg);
        return 2;
    }
    *eq = '\0';
    char why[256];
    if (!wf_meta_ok(arg, eq + 1, why, sizeof why)) {
        fprintf(stderr, "gpt2d %s: --meta %s\n", cmd, why);
        return 2;
    }
    int known = 0;
    for (size_t i = 0; i < *n; i++) known |= strcmp(meta[i].key, arg) == 0;
    if (!known && *n == TOOL_META_MAX) {
        fprintf(stderr, "gpt2d %s: more than %d --meta keys\n", cmd, TOOL_META_MAX);
        return 2;
    }
    tool_meta_set(meta, n, arg, eq + 1);
    return 0;
}
