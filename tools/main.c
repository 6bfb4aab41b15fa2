/*
 * `msa`: how a person meets the library.  Verbs:
 *   info     versions, backends, CPU features
 *   demo     an M3-shaped model run end to end on synthetic data, checked
 *   bench    decode / prefill timings against the work models
 *   check    the oracle sweep
 *   replay   one layer step on tensors read from .npy files
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct verb {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} verb;

static const verb verbs[] = {
    {"info", cmd_info, "library version, backends, CPU features"},
    {"demo", cmd_demo, "run an M3-shaped model on synthetic data and check it"},
    {"bench", cmd_bench, "time decode / prefill workloads"},
    {"check", cmd_check, "compare a backend with the oracle over a sweep of cases"},
    {"replay", cmd_replay, "run one layer step from .npy files (docs/REPLAY.md)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: msa VERB [options]   (msa VERB --help for a verb's options)\n\n");
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
        fprintf(f, "  %-8s %s\n", verbs[i].name, verbs[i].summary);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("msa %s\n", msa_version_string());
        return CLI_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
        if (strcmp(argv[1], verbs[i].name) == 0)
            return verbs[i].run(argc - 1, argv + 1);
    fprintf(stderr, "msa: unknown verb '%s'\n\n", argv[1]);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
