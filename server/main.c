/*
 * server/main.c: the one gpt2d binary. main() dispatches to a subcommand and
 * is, with the HTTP boundary, the only place that decides exit codes
 * (STYLE.md G5).
 */
#include "server.h"
#include "tools.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"serve", srv_main, "serve the model over HTTP (OpenAI-compatible /v1/completions)"},
    {"inspect", tool_inspect, "validate a safetensors file or a LoRA adapter and list its tensors"},
    {"synth", tool_synth, "write a random-weight GPT-2 checkpoint in the Hugging Face layout"},
    {"tokenize", tool_tokenize, "text on stdin -> GPT-2 token ids (JSON)"},
    {"detokenize", tool_detokenize, "GPT-2 token ids (JSON) on stdin -> bytes"},
    {"generate", tool_generate, "continue a prompt with a model, offline"},
    {"convert", tool_convert, "write an aligned copy of a safetensors file (maps without copying)"},
    {"lora", tool_lora, "merge a PEFT LoRA adapter into a checkpoint (gpt2d lora merge)"},
    {"bench", tool_bench, "measure bandwidth, prefill and batched decode speed (JSON)"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: gpt2d COMMAND [ARGS...]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "  %-12s %s\n  %-12s %s\n\n", "help", "this list", "version", "print the version");
    fprintf(out, "`gpt2d COMMAND --help` describes a command.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        srv_print_version();
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(cmd, commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "gpt2d: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
