/* `msa check`: the oracle sweep of the test kit, on one backend. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "testkit.h"

static void check_usage(FILE *f)
{
    fprintf(f, "usage: msa check [--backend cpu|cuda] [--quick] [--decode-only] [--filter S]\n"
               "  --quick        smaller sweep\n"
               "  --decode-only  only decode / verify cases (q_len <= 16)\n"
               "  --filter S     only cases whose name contains S\n"
               "exit status 1 when any case fails\n");
}

int cmd_check(int argc, char **argv)
{
    msa_sweep_options opts;
    memset(&opts, 0, sizeof opts);
    opts.backend = MSA_BACKEND_CPU;
    opts.log = stdout;
    for (int i = 1; i < argc; i++) {
        const char *val;
        int r;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            check_usage(stdout);
            return CLI_EXIT_OK;
        } else if (strcmp(argv[i], "--quick") == 0) {
            opts.quick = 1;
        } else if (strcmp(argv[i], "--decode-only") == 0) {
            opts.decode_only = 1;
        } else if ((r = cli_option(argc, argv, &i, "--backend", &val)) != 0) {
            if (r < 0 || cli_backend(val, &opts.backend) != 0)
                return CLI_EXIT_USAGE;
        } else if ((r = cli_option(argc, argv, &i, "--filter", &val)) != 0) {
            if (r < 0)
                return CLI_EXIT_USAGE;
            opts.filter = val;
        } else {
            fprintf(stderr, "msa check: unknown option '%s'\n", argv[i]);
            check_usage(stderr);
            return CLI_EXIT_USAGE;
        }
    }
    int passed = 0, failed = 0, skipped = 0;
    int rc = msa_sweep_run(&opts, &passed, &failed, &skipped);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    fflush(stdout);
    /* A non-zero return with no failed case still means the sweep broke. */
    return (failed || rc) ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
