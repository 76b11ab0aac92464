/*
 * tools/include/tools.h: the gpt2d subcommands that are not the server. Each takes
 * the arguments after its own name (argv[0] is the subcommand) and returns
 * the process exit status: 0 success, 1 failure (one line on stderr),
 * 2 usage error (the usage on stderr). Prefix: tool_. Thread: main only.
 */
#ifndef GPT2D_TOOLS_TOOLS_H
#define GPT2D_TOOLS_TOOLS_H

#include <getopt.h>

int tool_inspect(int argc, char **argv);
int tool_synth(int argc, char **argv);
int tool_tokenize(int argc, char **argv);
int tool_detokenize(int argc, char **argv);
int tool_generate(int argc, char **argv);
int tool_convert(int argc, char **argv);
int tool_bench(int argc, char **argv);
int tool_lora(int argc, char **argv); /* `gpt2d lora merge` */

/* Prints the one line for getopt_long's answer c (optstring ":"): ':' an
 * option without its value, '?' an unknown option, anything else a bad
 * value (optarg) of longopts[index]; next is optind. The caller prints its
 * usage after it. Returns 2, the usage error's exit status. */
int tool_option_error(const char *cmd, int c, char *const *argv, int next,
                      const struct option *longopts, int index);

#endif
