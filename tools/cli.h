/*
 * The `msa` program: one verb per file (cmd_*.c), dispatched by main.c.
 * Shared option-parsing helpers live in cli.c.
 */
#ifndef MSA_TOOLS_CLI_H
#define MSA_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "msa/msa.h"

int cmd_info(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_replay(int argc, char **argv);

/* Exit codes shared by the verbs. */
enum {
    CLI_EXIT_OK = 0,
    CLI_EXIT_FAIL = 1, /* ran, but a check failed or the library refused */
    CLI_EXIT_USAGE = 2 /* bad command line or rejected input */
};

/*
 * Option matching: when argv[*i] is `--name` or `--name=value`, sets *value
 * (taking the next argument for the first form, advancing *i) and returns 1;
 * returns 0 when argv[*i] is another option; -1 (message printed) when the
 * value is missing.
 */
int cli_option(int argc, char **argv, int *i, const char *name, const char **value);
/* Whole-string integer / number parsing with range checks; messages name
 * the option.  Return 0 on success, -1 (message printed) otherwise. */
int cli_int(const char *option, const char *text, int64_t min, int64_t max, int64_t *out);
int cli_double(const char *option, const char *text, double min, double max, double *out);

/* A table of integer options: when argv[*i] is one of them, parses its value
 * into *dst (range-checked) and returns 1; 0 when it is none of them; -1
 * (message printed) on a missing or bad value. */
typedef struct cli_int_opt {
    const char *name;
    int64_t min, max;
    int64_t *dst;
} cli_int_opt;
int cli_int_options(int argc, char **argv, int *i, const cli_int_opt *opts, size_t n);
int cli_backend(const char *text, msa_backend *out);
int cli_dtype(const char *option, const char *text, msa_dtype *out);

/* Sorts n doubles ascending (timings, for medians and percentiles). */
void cli_sort_doubles(double *x, size_t n);

/* Monotonic clock in seconds. */
double cli_now(void);
/* Creates a context or prints why not (NULL then). */
/* The CUDA backend's debugging aids that the program takes from its
 * environment: MSA_CUDA_SMS=n, MSA_CUDA_TMA=0, MSA_CUDA_PDL=0,
 * MSA_CUDA_SEL_WARP_ROWS=1, MSA_CUDA_SEL_UNIONS=1, MSA_CUDA_PF_TMA=0,
 * MSA_CUDA_PFI=0, MSA_CUDA_PFI_WGMMA=0, MSA_CUDA_PF_KBM=0,
 * MSA_CUDA_PF_KBM_CHUNK=n, MSA_CUDA_LEAN=0, MSA_CUDA_TIMELINE=path
 * (msa_debug_options); NULL when none is set. */
const msa_debug_options *cli_debug_options(void);
msa_context *cli_context(msa_backend backend, int threads);

#endif
