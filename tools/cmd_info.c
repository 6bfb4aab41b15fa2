/* `msa info`: what this build and this machine offer. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "sysinfo.h"

static void info_usage(FILE *f)
{
    fprintf(f, "usage: msa info [--bandwidth] [--backend cpu|cuda]\n"
               "  --bandwidth   also measure the backend's streaming-read bandwidth\n");
}

/* "compiled in" and "usable" differ for CUDA: a build with the backend on a
 * machine without a GPU says NO_DEVICE when asked for a context. */
static const char *backend_state(msa_backend b)
{
    if (msa_backend_available(b))
        return "available";
    msa_context_params params;
    msa_context_params_default(&params);
    params.backend = b;
    msa_context *ctx = NULL;
    msa_status st = msa_context_create(&params, &ctx, NULL, 0);
    msa_context_free(ctx);
    if (st == MSA_ERR_NO_DEVICE)
        return "compiled in, no device";
    if (st == MSA_OK)
        return "available";
    return "not compiled in";
}

int cmd_info(int argc, char **argv)
{
    int bandwidth = 0;
    msa_backend backend = MSA_BACKEND_CPU;
    for (int i = 1; i < argc; i++) {
        const char *val;
        int r;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            info_usage(stdout);
            return CLI_EXIT_OK;
        } else if (strcmp(argv[i], "--bandwidth") == 0) {
            bandwidth = 1;
        } else if ((r = cli_option(argc, argv, &i, "--backend", &val)) != 0) {
            if (r < 0 || cli_backend(val, &backend) != 0)
                return CLI_EXIT_USAGE;
        } else {
            fprintf(stderr, "msa info: unknown option '%s'\n", argv[i]);
            info_usage(stderr);
            return CLI_EXIT_USAGE;
        }
    }

    char model[256], feats[128];
    sysinfo_cpu_model(model, sizeof model);
    sysinfo_cpu_features(feats, sizeof feats);
    printf("libmsa        %s (header %d.%d.%d)\n", msa_version_string(), MSA_VERSION_MAJOR,
           MSA_VERSION_MINOR, MSA_VERSION_PATCH);
    printf("backend cpu   %s\n", backend_state(MSA_BACKEND_CPU));
    printf("backend cuda  %s\n", backend_state(MSA_BACKEND_CUDA));
    printf("cpu           %s\n", model);
    printf("cpu features  %s\n", feats);
    printf("online cpus   %d\n", sysinfo_online_cpus());
    printf("llc           %zu KiB\n", sysinfo_llc_bytes(0) >> 10);

    msa_context *ctx = cli_context(MSA_BACKEND_CPU, 0);
    if (!ctx)
        return CLI_EXIT_FAIL;
    printf("cpu threads   %d (default context)\n", msa_context_num_threads(ctx));
    /* The kernel level of a default CPU context, and the levels this build
     * has that this CPU runs (msa_context_params.cpu_isa_max picks one). */
    printf("cpu kernels   %s (levels here:", msa_cpu_isa_name(msa_context_cpu_isa(ctx)));
    static const msa_cpu_isa levels[] = {MSA_CPU_ISA_PORTABLE, MSA_CPU_ISA_AVX2,
                                         MSA_CPU_ISA_AVX512,   MSA_CPU_ISA_AVX512_BF16,
                                         MSA_CPU_ISA_NEON,     MSA_CPU_ISA_NEON_BF16};
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
        if (msa_cpu_isa_supported(levels[i]))
            printf(" %s", msa_cpu_isa_name(levels[i]));
    printf(")\n");
    static const char *const stages[] = {"indexer", "attention", "gather"};
    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++)
        printf("  %-11s %s\n", stages[i], msa_context_cpu_kernel(ctx, stages[i]));
    msa_context_free(ctx);

    if (bandwidth) {
        ctx = cli_context(backend, 0);
        if (!ctx)
            return CLI_EXIT_FAIL;
        /* Far beyond any cache: 256 MiB on the CPU, 2 GiB on a GPU. */
        size_t bytes = backend == MSA_BACKEND_CPU ? (size_t)256 << 20 : (size_t)2 << 30;
        double gbps = 0;
        msa_status st = msa_bench_read_bandwidth(ctx, bytes, 10, &gbps);
        if (st != MSA_OK) {
            fprintf(stderr, "msa info: bandwidth: %s: %s\n", msa_status_name(st),
                    msa_context_last_error(ctx));
            msa_context_free(ctx);
            return CLI_EXIT_FAIL;
        }
        printf("read bw       %.1f GB/s (%s, %zu MiB x 10)\n", gbps, msa_backend_name(backend),
               bytes >> 20);
        msa_context_free(ctx);
    }
    return CLI_EXIT_OK;
}
