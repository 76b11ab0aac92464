/*
 * tools/tools.h: the gpt2d subcommands that are not the server. Each takes
 * the arguments after its own name (argv[0] is the subcommand) and returns
 * the process exit status: 0 success, 1 failure (one line on stderr),
 * 2 usage error (the usage on stderr). Prefix: tool_. Thread: main only.
 */
#ifndef GPT2D_TOOLS_TOOLS_H
#define GPT2D_TOOLS_TOOLS_H

int tool_inspect(int argc, char **argv);
int tool_synth(int argc, char **argv);
int tool_tokenize(int argc, char **argv);
int tool_detokenize(int argc, char **argv);
int tool_generate(int argc, char **argv);
int tool_convert(int argc, char **argv);
int tool_bench(int argc, char **argv);

#endif
