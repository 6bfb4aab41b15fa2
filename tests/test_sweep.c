/*
 * The oracle sweep as a CTest program.
 *   test_sweep [--quick] [--decode-only] [--filter TEXT] [--threads N]
 *              [--backend cpu|cuda] [--cpu-isa LEVEL]
 * --cpu-isa runs the CPU kernels of one level (portable, avx2, avx512,
 * avx512_bf16, neon, neon_bf16): skipped where this build or this CPU lacks it.
 * MSA_TEST_QUICK=1 in the environment also selects the quick subset, so a
 * sanitizer job can run every registered test without a long sweep.
 * Exit: 0 all passed, 1 something failed, 77 nothing could run (skipped).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

#define EXIT_SKIPPED 77

static int usage(void)
{
    fprintf(stderr, "usage: test_sweep [--quick] [--decode-only] [--filter TEXT] [--threads N] "
                    "[--backend cpu|cuda] [--cpu-isa LEVEL]\n");
    return 2;
}

int main(int argc, char **argv)
{
    msa_sweep_options opts;
    memset(&opts, 0, sizeof opts);
    opts.backend = MSA_BACKEND_CPU;
    opts.log = stdout;
    const char *env = getenv("MSA_TEST_QUICK");
    opts.quick = env && env[0] && strcmp(env, "0") != 0;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            opts.quick = 1;
        } else if (!strcmp(argv[i], "--decode-only")) {
            opts.decode_only = 1;
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            opts.num_threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--filter") && i + 1 < argc) {
            opts.filter = argv[++i];
        } else if (!strcmp(argv[i], "--cpu-isa") && i + 1 < argc) {
            const char *name = argv[++i];
            int found = 0;
            for (int l = MSA_CPU_ISA_PORTABLE; l <= MSA_CPU_ISA_NEON_BF16 && !found; l++)
                if (!strcmp(name, msa_cpu_isa_name((msa_cpu_isa)l))) {
                    opts.cpu_isa_max = (msa_cpu_isa)l;
                    found = 1;
                }
            if (!found)
                return usage();
        } else if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            const char *b = argv[++i];
            if (!strcmp(b, "cpu"))
                opts.backend = MSA_BACKEND_CPU;
            else if (!strcmp(b, "cuda"))
                opts.backend = MSA_BACKEND_CUDA;
            else
                return usage();
        } else {
            return usage();
        }
    }

    if (!msa_backend_available(opts.backend)) {
        printf("backend %s not available in this build or machine\n",
               msa_backend_name(opts.backend));
        printf("0 passed, 0 failed, 1 skipped\n");
        return EXIT_SKIPPED;
    }

    if (opts.cpu_isa_max != MSA_CPU_ISA_AUTO && !msa_cpu_isa_supported(opts.cpu_isa_max)) {
        printf("CPU kernel level %s: not in this build or not run by this CPU\n",
               msa_cpu_isa_name(opts.cpu_isa_max));
        printf("0 passed, 0 failed, 1 skipped\n");
        return EXIT_SKIPPED;
    }

    int passed = 0, failed = 0, skipped = 0;
    msa_sweep_run(&opts, &passed, &failed, &skipped);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    if (failed)
        return 1;
    return passed == 0 && skipped > 0 ? EXIT_SKIPPED : 0;
}
