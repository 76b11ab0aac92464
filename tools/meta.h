/*
 * tools/meta.h: `--meta KEY=VALUE`, the __metadata__ entries `gpt2d synth`
 * and `gpt2d convert` write on request: a checkpoint's name, owner,
 * description and whether its weights are random (formats/include/
 * wformat.h, wf_about). Prefix: tool_meta_. Thread: main only.
 */
#ifndef GPT2D_TOOLS_META_H
#define GPT2D_TOOLS_META_H

#include "safetensors.h"

#include <stddef.h>

#define TOOL_META_MAX 16 /* --meta options one command takes */

/*
 * Adds arg ("KEY=VALUE", split in place: arg must stay alive and writable,
 * as optarg is) to meta[0..*n), at most TOOL_META_MAX; a key given again
 * replaces its value. A value gpt2d would refuse to load (wf_meta_ok) is
 * refused here. Returns 0, or 2 after one line on stderr ("gpt2d CMD:
 * --meta ...").
 */
int tool_meta_add(const char *cmd, char *arg, sft_meta *meta, size_t *n);

/* Sets key to value in meta[0..*n) (room for one more assumed): replaces
 * an entry with that key, else appends. */
void tool_meta_set(sft_meta *meta, size_t *n, const char *key, const char *value);

#endif
