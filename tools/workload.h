/*
 * Benchmark cases: read from bench/workloads/{decode,prefill}.json, chosen by
 * suite or id, and scaled to what the machine can hold.
 *
 * decode.json: {"q_len_per_request": 8, "smoke": [ids], "cases": [{"id",
 *   "suite", "batch", "weight", "kv_lens": [...]}]}; kv_lens include the
 *   step's new tokens.
 * prefill.json: {"cases": [{"id", "tags": [...], "weight", "requests":
 *   [{"prefix", "new"}]}]}.
 */
#ifndef MSA_TOOLS_WORKLOAD_H
#define MSA_TOOLS_WORKLOAD_H

#include <stddef.h>
#include <stdint.h>

typedef struct bench_case {
    char id[96];
    char suite[32];
    double weight;
    int prefill; /* work model: 1 = FLOPs, 0 = bytes */
    int scaled;  /* lengths were shrunk by --max-context */
    int32_t num_requests;
    int32_t *q_len;  /* new tokens per request */
    int32_t *kv_len; /* tokens after the step */
} bench_case;

typedef struct workload_filter {
    const char *suite;   /* decode: full | low_latency | smoke | all (default full);
                            prefill: representative | hot | batch_anchor | stress | all
                            (default representative) */
    const char *ids;     /* comma-separated ids; overrides suite */
    int64_t max_context; /* 0 = as in the file; else longer cases scaled down */
    int32_t q_len;       /* decode: 0 = the file's q_len_per_request */
} workload_filter;

/* Loads the cases of `path` that pass `filter`.  Returns 0 with *cases
 * (caller frees with workload_free) or -1 with a message. */
int workload_load(const char *path, int prefill, const workload_filter *filter, bench_case **cases,
                  int *num_cases, char *err, size_t err_size);
void workload_free(bench_case *cases, int num_cases);

/* A single decode shape: `batch` requests of context `context` (after the
 * step), `q_len` new tokens each. */
int workload_single(int64_t context, int32_t batch, int32_t q_len, bench_case **cases,
                    int *num_cases, char *err, size_t err_size);

#endif
