#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int cli_option(int argc, char **argv, int *i, const char *name, const char **value)
{
    const char *arg = argv[*i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0)
        return 0;
    if (arg[n] == '=') {
        *value = arg + n + 1;
        return 1;
    }
    if (arg[n] != '\0')
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "msa: option %s needs a value\n", name);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

int cli_int(const char *option, const char *text, int64_t min, int64_t max, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max) {
        fprintf(stderr, "msa: %s expects an integer in [%lld, %lld], got '%s'\n", option,
                (long long)min, (long long)max, text);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_int_options(int argc, char **argv, int *i, const cli_int_opt *opts, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        const char *val;
        const int r = cli_option(argc, argv, i, opts[k].name, &val);
        if (r == 0)
            continue;
        if (r < 0 || cli_int(opts[k].name, val, opts[k].min, opts[k].max, opts[k].dst) != 0)
            return -1;
        return 1;
    }
    return 0;
}

int cli_double(const char *option, const char *text, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !(v >= min && v <= max)) {
        fprintf(stderr, "msa: %s expects a number in [%g, %g], got '%s'\n", option, min, max, text);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_backend(const char *text, msa_backend *out)
{
    if (strcmp(text, "cpu") == 0) {
        *out = MSA_BACKEND_CPU;
        return 0;
    }
    if (strcmp(text, "cuda") == 0) {
        *out = MSA_BACKEND_CUDA;
        return 0;
    }
    fprintf(stderr, "msa: unknown backend '%s' (expected cpu or cuda)\n", text);
    return -1;
}

int cli_dtype(const char *option, const char *text, msa_dtype *out)
{
    if (msa_dtype_from_name(text, out) == MSA_OK)
        return 0;
    fprintf(stderr, "msa: %s: unknown dtype '%s' (fp32, bf16, fp16, fp8_e4m3, nvfp4)\n", option,
            text);
    return -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void cli_sort_doubles(double *x, size_t n)
{
    qsort(x, n, sizeof *x, cmp_double);
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Whether environment variable `name` is set and starts with c. */
static int env_starts(const char *name, char c)
{
    const char *v = getenv(name);
    return v && v[0] == c;
}

const msa_debug_options *cli_debug_options(void)
{
    static msa_debug_options d;
    memset(&d, 0, sizeof d);
    const char *sms = getenv("MSA_CUDA_SMS");
    d.cuda_num_sms = sms ? atoi(sms) : 0;
    if (d.cuda_num_sms < 0)
        d.cuda_num_sms = 0;
    d.cuda_no_tma = env_starts("MSA_CUDA_TMA", '0');
    d.cuda_no_pdl = env_starts("MSA_CUDA_PDL", '0');
    d.cuda_sel_warp_rows = env_starts("MSA_CUDA_SEL_WARP_ROWS", '1');
    d.cuda_sel_unions = env_starts("MSA_CUDA_SEL_UNIONS", '1');
    d.cuda_no_prefill_tma = env_starts("MSA_CUDA_PF_TMA", '0');
    d.cuda_no_prefill_indexer = env_starts("MSA_CUDA_PFI", '0');
    d.cuda_no_prefill_wgmma = env_starts("MSA_CUDA_PFI_WGMMA", '0');
    d.cuda_no_prefill_kbm = env_starts("MSA_CUDA_PF_KBM", '0');
    d.cuda_no_lean_decode = env_starts("MSA_CUDA_LEAN", '0');
    const char *chunk = getenv("MSA_CUDA_PF_KBM_CHUNK");
    d.cuda_prefill_kbm_chunk = chunk && atoi(chunk) > 0 ? atoi(chunk) : 0;
    const char *tl = getenv("MSA_CUDA_TIMELINE");
    d.cuda_timeline_path = tl && tl[0] ? tl : NULL;
    const int any = d.cuda_num_sms || d.cuda_no_tma || d.cuda_no_pdl || d.cuda_sel_warp_rows ||
                    d.cuda_sel_unions || d.cuda_no_prefill_tma || d.cuda_no_prefill_indexer ||
                    d.cuda_no_prefill_wgmma || d.cuda_no_prefill_kbm || d.cuda_prefill_kbm_chunk ||
                    d.cuda_no_lean_decode || d.cuda_timeline_path;
    return any ? &d : NULL;
}

msa_context *cli_context(msa_backend backend, int threads)
{
    msa_context_params params;
    msa_context_params_default(&params);
    params.debug = cli_debug_options();
    params.backend = backend;
    params.num_threads = threads;
    /* MSA_CPU_ISA_MAX caps the CPU kernel level ("avx2", ...; docs/CPU.md). */
    const char *isa = getenv("MSA_CPU_ISA_MAX");
    if (isa && isa[0] && backend == MSA_BACKEND_CPU) {
        int found = 0;
        for (int i = MSA_CPU_ISA_AUTO; i <= MSA_CPU_ISA_NEON_BF16 && !found; i++)
            if (strcmp(isa, msa_cpu_isa_name((msa_cpu_isa)i)) == 0) {
                params.cpu_isa_max = (msa_cpu_isa)i;
                found = 1;
            }
        if (!found) {
            fprintf(stderr,
                    "msa: MSA_CPU_ISA_MAX=%s names no CPU kernel level (auto, portable, "
                    "avx2, avx512, avx512_bf16, neon, neon_bf16)\n",
                    isa);
            return NULL;
        }
    }
    msa_context *ctx = NULL;
    char err[512] = "";
    msa_status st = msa_context_create(&params, &ctx, err, sizeof err);
    if (st != MSA_OK) {
        fprintf(stderr, "msa: cannot create a %s context: %s%s%s\n", msa_backend_name(backend),
                msa_status_name(st), err[0] ? ": " : "", err);
        return NULL;
    }
    return ctx;
}
