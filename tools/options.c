/*
 * tools/options.c: the one wording of a command-line mistake for every
 * subcommand but serve (config/ words serve's): an unknown option, an
 * option without its value and a bad value are told apart, so that
 * `gpt2d synth --foo` never says "missing value". Thread: main only.
 */
#include "tools.h"

#include <stdio.h>
#include <string.h>

int tool_option_error(const char *cmd, int c, char *const *argv, int next,
                      const struct option *longopts, int index)
{
    const char *arg = next > 0 ? argv[next - 1] : "";
    if (c == ':') {
        fprintf(stderr, "gpt2d %s: %s needs a value\n", cmd, arg);
        return 2;
    }
    if (c != '?') {
        fprintf(stderr, "gpt2d %s: bad value for --%s: '%s'\n", cmd, longopts[index].name,
                optarg != NULL ? optarg : "");
        return 2;
    }
    /* '?': an option no command knows, or `--flag=value` for a flag. */
    const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
    for (const struct option *o = longopts; eq != NULL && o->name != NULL; o++)
        if (o->has_arg == no_argument && strlen(o->name) == (size_t)(eq - arg - 2)
            && strncmp(o->name, arg + 2, (size_t)(eq - arg - 2)) == 0) {
            fprintf(stderr, "gpt2d %s: --%s takes no value\n", cmd, o->name);
            return 2;
        }
    if (optopt > 0 && optopt < 128) /* a short option: "-xy" leaves optind on its word */
        fprintf(stderr, "gpt2d %s: unknown option '-%c'\n", cmd, optopt);
    else
        fprintf(stderr, "gpt2d %s: unknown option '%s'\n", cmd, arg);
    return 2;
}
