/*
 * tools/tools.h: the gpt2d subcommands that are not the server. Each takes
 * the arguments after its own name (argv[0] is the subcommand) and returns
 * the process exit status: 0 success, 1 failure (one line on stderr),
 * 2 usage error (the usage on stderr). Prefix: tool_. Thread: main only.
 */
#ifndef GPT2D_TOOLS_TOOLS_H
#define GPT2D_TOOLS_TOOLS_H

#include <stdint.h>
#include <stddef.h>

int tool_inspect(int argc, char **argv);
int tool_synth(int argc, char **argv);
int tool_tokenize(int argc, char **argv);
int tool_detokenize(int argc, char **argv);

/* Deterministic random numbers for synth and the tests (xoshiro256**,
 * seeded through splitmix64). Thread: any; one state per thread. */
typedef struct {
    uint64_t s[4];
} tool_rng;

void tool_rng_seed(tool_rng *r, uint64_t seed);
uint64_t tool_rng_next(tool_rng *r);
double tool_rng_uniform(tool_rng *r); /* [0, 1) */
double tool_rng_normal(tool_rng *r);  /* N(0, 1), Box-Muller */

#endif
