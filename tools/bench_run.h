/*
 * One benchmark case on one backend: caches filled with synthetic data, a
 * plan per cache copy, several input sets, then msa_bench_forward.
 *
 * The working set must not sit in the last-level cache (PERFORMANCE.md asks
 * for more than twice its size), so small cases get several copies of their
 * cache and plan, used in rotation with the input sets.  The bytes and FLOPs
 * of the work models come from the real selections of an untimed run per
 * input set.
 */
#ifndef MSA_TOOLS_BENCH_RUN_H
#define MSA_TOOLS_BENCH_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "msa/msa.h"
#include "synth.h"
#include "workload.h"

typedef struct bench_env {
    msa_context *ctx;
    const msa_model *model;
    msa_dtype act_dtype, kv_dtype, index_dtype;
    int32_t page_size;
    int warmup, reps;
    int write_cache;   /* 1: every timed run also writes the step's entries */
    size_t target_ws;  /* bytes one rotation should touch (2 x LLC or L2) */
    size_t mem_budget; /* most cache bytes over all copies */
    int max_copies;
    int min_sets; /* input sets, at least 2 */
    int verbose;  /* progress lines on stderr */
    int stages;   /* 1: also time each stage (msa_bench_stages) */
    synth_rng *rng;
} bench_env;

typedef struct bench_layer_result {
    int32_t layer;
    int sparse;
    double bytes;        /* decode work model, mean over input sets */
    double flops;        /* prefill work model, mean over input sets */
    double union_blocks; /* sparse: mean blocks read per (request, KV head) */
    double working_set;  /* bytes one rotation touches (model bytes + inputs/outputs) */
    double median_us, p10_us, p90_us, min_us, max_us;
    int has_stages; /* stage_us holds msa_bench_stages' medians */
    double stage_us[MSA_STAGE_COUNT];
    char kernel[64];
    char fallback[160];
} bench_layer_result;

typedef struct bench_result {
    int skipped;
    char message[256];
    int copies, io_sets;
    double cache_bytes; /* one copy */
    int num_layers;
    bench_layer_result layers[2];
} bench_result;

/* Times `num_layers` layers (ids in `layers`) on case `c`.  Returns 0 when
 * it ran or was skipped for size (res->skipped, res->message), -1 on a
 * library error (res->message). */
int bench_run_case(const bench_env *env, const bench_case *c, const int32_t *layers, int num_layers,
                   bench_result *res);

#endif
