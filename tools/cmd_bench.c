/*
 * `msa bench`: decode and prefill timings of one M3 sparse layer (and, with
 * --dense, a dense layer) against the work models of docs/PERFORMANCE.md.
 *
 *   msa bench --workload decode [--suite S | --cases a,b] [--max-context L] [--q-len Q]
 *   msa bench --workload prefill [--suite S | --cases a,b] [--max-context L]
 *   msa bench --decode-context L --batch B [--q-len Q] [--dense]
 *
 * Every case reports the median time with its p10..p90 spread, the rate
 * (GB/s of the bytes model for decode, TFLOP/s of useful work for prefill)
 * and, for decode, the share of the streaming-read bandwidth measured in the
 * same run.  Weighted aggregates use the workload file's weights:
 * sum(weight * work) / sum(weight * time).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench_run.h"
#include "cli.h"
#include "fmapeak.h"
#include "sysinfo.h"
#include "table.h"
#include "workload.h"

typedef struct bench_opts {
    msa_backend backend;
    int64_t threads;
    const char *workload; /* "decode" / "prefill", NULL with --decode-context */
    const char *workload_file;
    workload_filter filter;
    int64_t decode_context, batch, q_len;
    int dense;
    int64_t reps, warmup, max_copies, sets;
    double mem_gb;
    msa_dtype act_dtype, kv_dtype, index_dtype;
    int prewritten;
    int stages; /* -1: default (prefill workloads on CUDA), 0: off, 1: on */
    const char *json;
} bench_opts;

static void bench_usage(FILE *f)
{
    fprintf(
        f,
        "usage: msa bench [--backend cpu|cuda] [--threads N]\n"
        "         --workload decode|prefill [--workload-file PATH]\n"
        "             [--suite S] [--cases ID,ID] [--max-context L] [--q-len Q]\n"
        "       | --decode-context L [--batch B] [--q-len Q]\n"
        "         [--dense] [--stages] [--reps N] [--warmup N] [--json FILE]\n"
        "         [--act-dtype D] [--kv-dtype D] [--index-dtype D] [--prewritten]\n"
        "         [--copies N] [--sets N] [--mem-gb G]\n"
        "  --workload W       cases of bench/workloads/W.json\n"
        "  --suite S          decode: full (default), low_latency, smoke, all;\n"
        "                     prefill: representative (default), hot, batch_anchor, stress, all\n"
        "  --cases IDS        these case ids only (comma-separated)\n"
        "  --max-context L    scale every request of a longer case by L / longest\n"
        "  --q-len Q          decode: tokens per request (default: the file's, 8)\n"
        "  --decode-context L one decode shape: --batch requests (default 1) of context L\n"
        "  --dense            also time a dense layer on the same step\n"
        "  --reps N           timed runs per case (default 20); --warmup N (default 5)\n"
        "  --prewritten       step entries already cached (time attention alone)\n"
        "  --stages           also time each stage (cache write, indexer, selection,\n"
        "                     prefill indexer, attention, index value; CUDA only; the\n"
        "                     default for prefill workloads on CUDA; --no-stages: off)\n"
        "  --copies N         most cache copies rotated to defeat the LLC (default 16)\n"
        "  --sets N           input sets rotated (default 2, at most 4)\n"
        "  --mem-gb G         most cache memory for all copies (default: half of RAM\n"
        "                     on the CPU, 100 on a GPU)\n");
}

static int parse_opts(int argc, char **argv, bench_opts *o, int *help)
{
    const cli_int_opt ints[] = {
        {"--threads", 0, 1024, &o->threads},
        {"--max-context", 1, INT32_MAX, &o->filter.max_context},
        {"--decode-context", 1, INT32_MAX, &o->decode_context},
        {"--batch", 1, 65536, &o->batch},
        {"--q-len", 1, 4096, &o->q_len},
        {"--reps", 1, 1000000, &o->reps},
        {"--warmup", 0, 1000000, &o->warmup},
        {"--copies", 1, 16, &o->max_copies},
        {"--sets", 2, 4, &o->sets},
    };
    struct {
        const char *name;
        const char **dst;
    } strs[] = {
        {"--workload", &o->workload},  {"--workload-file", &o->workload_file},
        {"--suite", &o->filter.suite}, {"--cases", &o->filter.ids},
        {"--json", &o->json},
    };
    struct {
        const char *name;
        msa_dtype *dst;
    } dtypes[] = {
        {"--act-dtype", &o->act_dtype},
        {"--kv-dtype", &o->kv_dtype},
        {"--index-dtype", &o->index_dtype},
    };
    for (int i = 1; i < argc; i++) {
        const char *val;
        int r, matched = 0;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            *help = 1;
            return 0;
        }
        if (strcmp(argv[i], "--dense") == 0) {
            o->dense = 1;
            continue;
        }
        if (strcmp(argv[i], "--prewritten") == 0) {
            o->prewritten = 1;
            continue;
        }
        if (strcmp(argv[i], "--stages") == 0 || strcmp(argv[i], "--no-stages") == 0) {
            o->stages = argv[i][2] == 's';
            continue;
        }
        if ((r = cli_option(argc, argv, &i, "--backend", &val)) != 0) {
            if (r < 0 || cli_backend(val, &o->backend) != 0)
                return -1;
            continue;
        }
        if ((r = cli_option(argc, argv, &i, "--mem-gb", &val)) != 0) {
            if (r < 0 || cli_double("--mem-gb", val, 0.001, 1e6, &o->mem_gb) != 0)
                return -1;
            continue;
        }
        if ((matched = cli_int_options(argc, argv, &i, ints, sizeof ints / sizeof ints[0])) < 0)
            return -1;
        for (size_t k = 0; k < sizeof strs / sizeof strs[0] && !matched; k++) {
            if ((r = cli_option(argc, argv, &i, strs[k].name, &val)) == 0)
                continue;
            if (r < 0)
                return -1;
            *strs[k].dst = val;
            matched = 1;
        }
        for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0] && !matched; k++) {
            if ((r = cli_option(argc, argv, &i, dtypes[k].name, &val)) == 0)
                continue;
            if (r < 0 || cli_dtype(dtypes[k].name, val, dtypes[k].dst) != 0)
                return -1;
            matched = 1;
        }
        if (!matched) {
            fprintf(stderr, "msa bench: unknown option '%s'\n", argv[i]);
            return -1;
        }
    }
    if (!o->workload && !o->decode_context) {
        fprintf(stderr, "msa bench: give --workload decode|prefill or --decode-context L\n");
        return -1;
    }
    if (o->workload && o->decode_context) {
        fprintf(stderr, "msa bench: --workload and --decode-context exclude each other\n");
        return -1;
    }
    if (o->workload && strcmp(o->workload, "decode") != 0 && strcmp(o->workload, "prefill") != 0) {
        fprintf(stderr, "msa bench: --workload must be decode or prefill\n");
        return -1;
    }
    if (o->workload && strcmp(o->workload, "prefill") == 0 && o->q_len) {
        fprintf(stderr, "msa bench: --q-len applies to decode workloads only\n");
        return -1;
    }
    if (o->decode_context && o->q_len > o->decode_context) {
        fprintf(stderr, "msa bench: --q-len exceeds --decode-context\n");
        return -1;
    }
    if (o->act_dtype != MSA_DTYPE_FP32 && o->act_dtype != MSA_DTYPE_BF16 &&
        o->act_dtype != MSA_DTYPE_FP16) {
        fprintf(stderr, "msa bench: --act-dtype must be fp32, bf16 or fp16\n");
        return -1;
    }
    o->filter.q_len = (int32_t)o->q_len;
    return 0;
}

/* Where an installed program's workloads lie, relative to the directory
 * that holds it (the build passes the installed layout's path). */
#ifndef MSA_WORKLOAD_RELDIR
#define MSA_WORKLOAD_RELDIR "../share/msa/workloads"
#endif

/* The workload file: as given, else bench/workloads/ under the working
 * directory, else beside the build directory holding the program (a build
 * inside the source tree), else the installed workloads beside the
 * installed program. */
static int find_workload(const bench_opts *o, char *path, size_t size)
{
    if (o->workload_file) {
        snprintf(path, size, "%s", o->workload_file);
        return 0;
    }
    snprintf(path, size, "bench/workloads/%s.json", o->workload);
    if (access(path, R_OK) == 0)
        return 0;
    char dir[3000];
    if (sysinfo_exe_dir(dir, sizeof dir) == 0) {
        snprintf(path, size, "%s/../bench/workloads/%s.json", dir, o->workload);
        if (access(path, R_OK) == 0)
            return 0;
        snprintf(path, size, "%s/%s/%s.json", dir, MSA_WORKLOAD_RELDIR, o->workload);
        if (access(path, R_OK) == 0)
            return 0;
    }
    fprintf(stderr,
            "msa bench: cannot find %s.json in bench/workloads/ or the installed workloads "
            "(use --workload-file)\n",
            o->workload);
    return -1;
}

static double mean_context(const bench_case *c)
{
    double s = 0;
    for (int32_t r = 0; r < c->num_requests; r++)
        s += c->kv_len[r];
    return s / c->num_requests;
}

static int32_t mean_q(const bench_case *c)
{
    int64_t s = 0;
    for (int32_t r = 0; r < c->num_requests; r++)
        s += c->q_len[r];
    return (int32_t)(s / c->num_requests);
}

typedef struct aggregate {
    double w_work, w_time, weight;
    int cases;
} aggregate;

static cJSON *result_json(const bench_case *c, const bench_result *res, int li, double bw)
{
    const bench_layer_result *lr = &res->layers[li];
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "suite", c->suite);
    cJSON_AddNumberToObject(o, "weight", c->weight);
    cJSON_AddBoolToObject(o, "scaled", c->scaled);
    cJSON_AddNumberToObject(o, "batch", c->num_requests);
    cJSON *q = cJSON_AddArrayToObject(o, "q_len");
    cJSON *kv = cJSON_AddArrayToObject(o, "kv_len");
    for (int32_t r = 0; r < c->num_requests; r++) {
        cJSON_AddItemToArray(q, cJSON_CreateNumber(c->q_len[r]));
        cJSON_AddItemToArray(kv, cJSON_CreateNumber(c->kv_len[r]));
    }
    if (res->skipped) {
        cJSON_AddBoolToObject(o, "skipped", 1);
        cJSON_AddStringToObject(o, "reason", res->message);
        return o;
    }
    cJSON_AddNumberToObject(o, "layer", lr->layer);
    cJSON_AddStringToObject(o, "layer_kind", lr->sparse ? "sparse" : "dense");
    cJSON_AddStringToObject(o, "kernel", lr->kernel);
    cJSON_AddStringToObject(o, "fallback_reason", lr->fallback);
    cJSON *t = cJSON_AddObjectToObject(o, "time_us");
    cJSON_AddNumberToObject(t, "median", lr->median_us);
    cJSON_AddNumberToObject(t, "p10", lr->p10_us);
    cJSON_AddNumberToObject(t, "p90", lr->p90_us);
    cJSON_AddNumberToObject(t, "min", lr->min_us);
    cJSON_AddNumberToObject(t, "max", lr->max_us);
    if (lr->has_stages) {
        cJSON *st = cJSON_AddObjectToObject(o, "stage_us");
        for (int k = 0; k < MSA_STAGE_COUNT; k++)
            cJSON_AddNumberToObject(st, msa_stage_name((msa_stage)k), lr->stage_us[k]);
    }
    cJSON_AddNumberToObject(o, "bytes", lr->bytes);
    cJSON_AddNumberToObject(o, "flops", lr->flops);
    cJSON_AddNumberToObject(o, "gb_per_s", lr->bytes / lr->median_us * 1e-3);
    cJSON_AddNumberToObject(o, "tflop_per_s", lr->flops / lr->median_us * 1e-6);
    cJSON_AddNumberToObject(o, "read_bw_fraction", lr->bytes / lr->median_us * 1e-3 / bw);
    if (lr->sparse)
        cJSON_AddNumberToObject(o, "union_blocks_per_head", lr->union_blocks);
    cJSON_AddNumberToObject(o, "cache_copies", res->copies);
    cJSON_AddNumberToObject(o, "io_sets", res->io_sets);
    cJSON_AddNumberToObject(o, "working_set_bytes", lr->working_set);
    cJSON_AddNumberToObject(o, "cache_bytes_per_copy", res->cache_bytes);
    return o;
}

/* The CPU's fp32 multiply-add ceiling measured in this run (GFLOP/s; 0 on a
 * GPU): prefill rows report their share of it in the "% bw" column. */
static double fma_peak;
/* The bf16 dot-product (vdpbf16ps) ceiling where the level has one. */
static double bf16_peak;

static void add_row(table *tab, const bench_case *c, const bench_result *res, int li, double bw)
{
    const bench_layer_result *lr = &res->layers[li];
    table_cell(tab, "%s%s", c->id, c->scaled ? "*" : "");
    if (res->skipped) {
        for (int i = 0; i < 10; i++)
            table_cell(tab, i == 0 ? "skipped" : "");
        return;
    }
    table_cell(tab, "%s", lr->sparse ? "sparse" : "dense");
    table_cell(tab, "%d", c->num_requests);
    table_cell(tab, "%d", mean_q(c));
    table_cell(tab, "%.0f", mean_context(c));
    table_cell(tab, "%.1f", lr->median_us);
    table_cell(tab, "%.1f..%.1f", lr->p10_us, lr->p90_us);
    if (c->prefill) {
        table_cell(tab, "%.3f TFLOP/s", lr->flops / lr->median_us * 1e-6);
        if (fma_peak > 0)
            table_cell(tab, "%.0f%% fma", 100.0 * lr->flops / lr->median_us * 1e-3 / fma_peak);
        else
            table_cell(tab, "-");
    } else {
        double gbps = lr->bytes / lr->median_us * 1e-3;
        table_cell(tab, "%.1f GB/s", gbps);
        table_cell(tab, "%.0f%%", 100.0 * gbps / bw);
    }
    if (c->prefill)
        table_cell(tab, "-");
    else
        table_cell(tab, "%.1f", lr->bytes * 1e-6);
    table_cell(tab, "%g", c->weight);
}

static void add_stage_row(table *tab, const bench_case *c, const bench_layer_result *lr)
{
    double sum = 0;
    table_cell(tab, "%s%s", c->id, c->scaled ? "*" : "");
    table_cell(tab, "%s", lr->sparse ? "sparse" : "dense");
    for (int k = 0; k < MSA_STAGE_COUNT; k++) {
        table_cell(tab, "%.1f", lr->stage_us[k]);
        sum += lr->stage_us[k];
    }
    table_cell(tab, "%.1f", sum);
    table_cell(tab, "%.1f", lr->median_us);
}

static void print_aggregate(const char *kind, const aggregate *a, int prefill, double bw)
{
    if (a->cases == 0 || a->w_time <= 0)
        return;
    /* Where the level has bf16 dot products, its prefill kernels use them
     * on 16-bit data: their share of that ceiling is the one that says how
     * close they run (the fp32 share can pass 100%). */
    if (prefill && fma_peak > 0 && bf16_peak > 0)
        printf("weighted aggregate, %s layer: %.3f TFLOP/s = %.0f%% of the bf16 dot-product peak "
               "(%.0f%% of the fp32 FMA peak) over %d cases (weight %g)\n",
               kind, a->w_work / a->w_time * 1e-6, 100.0 * a->w_work / a->w_time * 1e-3 / bf16_peak,
               100.0 * a->w_work / a->w_time * 1e-3 / fma_peak, a->cases, a->weight);
    else if (prefill && fma_peak > 0)
        printf("weighted aggregate, %s layer: %.3f TFLOP/s = %.0f%% of the fp32 FMA peak over %d "
               "cases (weight %g)\n",
               kind, a->w_work / a->w_time * 1e-6, 100.0 * a->w_work / a->w_time * 1e-3 / fma_peak,
               a->cases, a->weight);
    else if (prefill)
        printf("weighted aggregate, %s layer: %.2f TFLOP/s over %d cases (weight %g)\n", kind,
               a->w_work / a->w_time * 1e-6, a->cases, a->weight);
    else
        printf("weighted aggregate, %s layer: %.1f GB/s = %.0f%% of the measured read bandwidth "
               "over %d cases (weight %g)\n",
               kind, a->w_work / a->w_time * 1e-3, 100.0 * a->w_work / a->w_time * 1e-3 / bw,
               a->cases, a->weight);
    /* The workloads' targets are stated as this mean. */
    printf("weighted mean time, %s layer: %.1f us\n", kind, a->w_time / a->weight);
}

int cmd_bench(int argc, char **argv)
{
    bench_opts o;
    memset(&o, 0, sizeof o);
    o.backend = MSA_BACKEND_CPU;
    o.reps = 20;
    o.warmup = 5;
    o.max_copies = 16;
    o.sets = 2;
    o.stages = -1;
    o.act_dtype = o.kv_dtype = o.index_dtype = MSA_DTYPE_BF16;
    int help = 0;
    if (parse_opts(argc, argv, &o, &help) != 0) {
        bench_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (help) {
        bench_usage(stdout);
        return CLI_EXIT_OK;
    }

    bench_case *cases = NULL;
    int num_cases = 0, prefill = o.workload && strcmp(o.workload, "prefill") == 0;
    char err[600], path[4096];
    if (o.stages < 0)
        o.stages = prefill && o.backend == MSA_BACKEND_CUDA;
    if (o.stages && o.backend != MSA_BACKEND_CUDA) {
        fprintf(stderr, "msa bench: --stages needs --backend cuda\n");
        return CLI_EXIT_USAGE;
    }
    if (o.workload) {
        if (find_workload(&o, path, sizeof path) != 0)
            return CLI_EXIT_USAGE;
        if (workload_load(path, prefill, &o.filter, &cases, &num_cases, err, sizeof err) != 0) {
            fprintf(stderr, "msa bench: %s\n", err);
            return CLI_EXIT_USAGE;
        }
    } else if (workload_single(o.decode_context, (int32_t)(o.batch ? o.batch : 1),
                               (int32_t)(o.q_len ? o.q_len : 1), &cases, &num_cases, err,
                               sizeof err) != 0) {
        fprintf(stderr, "msa bench: %s\n", err);
        return CLI_EXIT_FAIL;
    }

    int rc = CLI_EXIT_FAIL;
    msa_model *model = NULL;
    cJSON *results = cJSON_CreateArray();
    static const char *const headers[] = {"case", "layer",     "batch",       "q",
                                          "ctx",  "median us", "p10..p90 us", "rate",
                                          "% bw", "MB",        "weight"};
    table *tab = table_new(11, headers);
    static const char *const stage_headers[] = {"case",      "layer",     "write us", "indexer us",
                                                "select us", "pf idx us", "attn us",  "idx val us",
                                                "sum us",    "forward us"};
    table *stages = o.stages ? table_new(10, stage_headers) : NULL;
    msa_context *ctx = cli_context(o.backend, (int)o.threads);
    if (!ctx || !results || !tab)
        goto done;

    /* The ceiling first, in the same run as the cases. */
    double bw = 0;
    size_t bw_bytes = o.backend == MSA_BACKEND_CPU ? (size_t)256 << 20 : (size_t)2 << 30;
    if (msa_bench_read_bandwidth(ctx, bw_bytes, 10, &bw) != MSA_OK || !(bw > 0)) {
        fprintf(stderr, "msa bench: read bandwidth: %s\n", msa_context_last_error(ctx));
        goto done;
    }
    const char *fma_what = "";
    fma_peak = o.backend == MSA_BACKEND_CPU ? fmapeak_gflops(msa_context_num_threads(ctx),
                                                             msa_context_cpu_isa(ctx), &fma_what)
                                            : 0.0;
    bf16_peak = o.backend == MSA_BACKEND_CPU
                    ? fmapeak_bf16_gflops(msa_context_num_threads(ctx), msa_context_cpu_isa(ctx))
                    : 0.0;
    uint8_t sparse[2] = {1, 0};
    msa_model_config cfg;
    msa_model_config_default(&cfg); /* one M3 sparse layer (+ a dense one) */
    cfg.num_layers = o.dense ? 2 : 1;
    cfg.layer_sparse = sparse;
    if (msa_model_create(ctx, &cfg, &model) != MSA_OK) {
        fprintf(stderr, "msa bench: model: %s\n", msa_context_last_error(ctx));
        goto done;
    }
    synth_rng rng;
    synth_seed(&rng, 1701);
    size_t llc = sysinfo_llc_bytes((size_t)32 << 20);
    bench_env env = {
        .ctx = ctx,
        .model = model,
        .act_dtype = o.act_dtype,
        .kv_dtype = o.kv_dtype,
        .index_dtype = o.index_dtype,
        .page_size = 128,
        .warmup = (int)o.warmup,
        .reps = (int)o.reps,
        .write_cache = !o.prewritten,
        /* twice the LLC on the CPU; above twice a GPU's 50 MB L2 */
        .target_ws = o.backend == MSA_BACKEND_CPU ? 2 * llc : (size_t)128 << 20,
        .mem_budget = o.mem_gb > 0                   ? (size_t)(o.mem_gb * 1e9)
                      : o.backend == MSA_BACKEND_CPU ? sysinfo_phys_bytes((size_t)8 << 30) / 2
                                                     : (size_t)100e9,
        .max_copies = (int)o.max_copies,
        .min_sets = (int)o.sets,
        .verbose = 1,
        .stages = o.stages,
        .rng = &rng,
    };
    printf("%s backend, %d threads, read bandwidth %.1f GB/s; %s; %s activations, %s K/V, %s "
           "index keys; %s\n",
           msa_backend_name(o.backend), msa_context_num_threads(ctx), bw,
           o.workload ? path : "single decode shape", msa_dtype_name(o.act_dtype),
           msa_dtype_name(o.kv_dtype), msa_dtype_name(o.index_dtype),
           o.prewritten ? "entries pre-written" : "each run writes its entries");
    if (fma_peak > 0)
        printf("fp32 FMA peak %.1f GFLOP/s (%s, %d threads, measured now; %% fma: a prefill "
               "row's share of it)\n",
               fma_peak, fma_what, msa_context_num_threads(ctx));
    if (bf16_peak > 0)
        printf("bf16 dot-product peak %.1f GFLOP/s (vdpbf16ps, %d threads, measured now)\n",
               bf16_peak, msa_context_num_threads(ctx));
    fflush(stdout);

    int32_t layers[2] = {0, 1};
    aggregate agg[2];
    memset(agg, 0, sizeof agg);
    int errors = 0;
    double t_start = cli_now();
    for (int i = 0; i < num_cases; i++) {
        const bench_case *c = &cases[i];
        fprintf(stderr, "[%d/%d] %s: batch %d, q %d, mean context %.0f%s (%.0f s so far)\n", i + 1,
                num_cases, c->id, c->num_requests, mean_q(c), mean_context(c),
                c->scaled ? " (scaled)" : "", cli_now() - t_start);
        bench_result res;
        if (bench_run_case(&env, c, layers, o.dense ? 2 : 1, &res) != 0) {
            fprintf(stderr, "msa bench: %s: %s\n", c->id, res.message);
            errors++;
            continue;
        }
        if (res.skipped) {
            fprintf(stderr, "  skipped: %s\n", res.message);
            add_row(tab, c, &res, 0, bw);
            cJSON_AddItemToArray(results, result_json(c, &res, 0, bw));
            continue;
        }
        for (int li = 0; li < res.num_layers; li++) {
            const bench_layer_result *lr = &res.layers[li];
            add_row(tab, c, &res, li, bw);
            cJSON_AddItemToArray(results, result_json(c, &res, li, bw));
            fprintf(stderr,
                    "  %s: median %.1f us (p10..p90 %.1f..%.1f), %.2f %s, "
                    "%d cop%s, working set %.0f MB\n",
                    lr->sparse ? "sparse" : "dense", lr->median_us, lr->p10_us, lr->p90_us,
                    prefill ? lr->flops / lr->median_us * 1e-6 : lr->bytes / lr->median_us * 1e-3,
                    prefill ? "TFLOP/s" : "GB/s", res.copies, res.copies == 1 ? "y" : "ies",
                    lr->working_set * 1e-6);
            if (lr->has_stages) {
                fprintf(stderr, "  %s stages (us):", lr->sparse ? "sparse" : "dense");
                for (int k = 0; k < MSA_STAGE_COUNT; k++)
                    fprintf(stderr, " %s %.1f", msa_stage_name((msa_stage)k), lr->stage_us[k]);
                fprintf(stderr, "\n");
                add_stage_row(stages, c, lr);
            }
            if (c->weight > 0) {
                aggregate *a = &agg[lr->sparse ? 0 : 1];
                a->w_work += c->weight * (prefill ? lr->flops : lr->bytes);
                a->w_time += c->weight * lr->median_us;
                a->weight += c->weight;
                a->cases++;
            }
        }
        if (res.num_layers == 2)
            fprintf(stderr, "  sparse layer %.1fx faster than dense\n",
                    res.layers[1].median_us / res.layers[0].median_us);
    }

    printf("\n");
    table_print(tab, stdout);
    printf("\n");
    if (stages) {
        printf("stages (msa_bench_stages: eager runs, each stage waits for the previous one;\n"
               "pf idx: the prefill rows' index scores and selection)\n");
        table_print(stages, stdout);
        printf("\n");
    }
    print_aggregate("sparse", &agg[0], prefill, bw);
    print_aggregate("dense", &agg[1], prefill, bw);
    printf("rate: %s; MB: bytes of the model per run; * = lengths scaled by --max-context\n",
           prefill ? "useful TFLOP/s (PERFORMANCE.md)"
                   : "GB/s of the decode bytes model (PERFORMANCE.md), % of the read bandwidth");

    if (o.json) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "backend", msa_backend_name(o.backend));
        cJSON_AddNumberToObject(root, "threads", msa_context_num_threads(ctx));
        cJSON_AddStringToObject(root, "version", msa_version_string());
        cJSON_AddStringToObject(root, "workload", o.workload ? path : "single");
        cJSON_AddNumberToObject(root, "read_bw_gbps", bw);
        if (fma_peak > 0)
            cJSON_AddNumberToObject(root, "fma_peak_gflops", fma_peak);
        if (bf16_peak > 0)
            cJSON_AddNumberToObject(root, "bf16_dot_peak_gflops", bf16_peak);
        cJSON_AddNumberToObject(root, "llc_bytes", (double)llc);
        cJSON_AddStringToObject(root, "act_dtype", msa_dtype_name(o.act_dtype));
        cJSON_AddStringToObject(root, "kv_dtype", msa_dtype_name(o.kv_dtype));
        cJSON_AddStringToObject(root, "index_dtype", msa_dtype_name(o.index_dtype));
        cJSON_AddBoolToObject(root, "write_cache", !o.prewritten);
        cJSON_AddNumberToObject(root, "warmup", (double)o.warmup);
        cJSON_AddNumberToObject(root, "reps", (double)o.reps);
        cJSON_AddNumberToObject(root, "max_context", (double)o.filter.max_context);
        cJSON *ag = cJSON_AddObjectToObject(root, "aggregate");
        for (int k = 0; k < 2; k++) {
            if (agg[k].cases == 0)
                continue;
            cJSON *a = cJSON_AddObjectToObject(ag, k == 0 ? "sparse" : "dense");
            cJSON_AddNumberToObject(a, "cases", agg[k].cases);
            cJSON_AddNumberToObject(a, "weight", agg[k].weight);
            if (prefill) {
                cJSON_AddNumberToObject(a, "tflop_per_s", agg[k].w_work / agg[k].w_time * 1e-6);
            } else {
                cJSON_AddNumberToObject(a, "gb_per_s", agg[k].w_work / agg[k].w_time * 1e-3);
                cJSON_AddNumberToObject(a, "read_bw_fraction",
                                        agg[k].w_work / agg[k].w_time * 1e-3 / bw);
            }
        }
        cJSON_AddItemToObject(root, "results", results);
        results = NULL;
        if (json_write_file(o.json, root, err, sizeof err) != 0) {
            fprintf(stderr, "msa bench: %s\n", err);
            errors++;
        }
        cJSON_Delete(root);
    }
    rc = errors ? CLI_EXIT_FAIL : CLI_EXIT_OK;
done:
    cJSON_Delete(results);
    table_free(tab);
    table_free(stages);
    msa_model_free(model);
    msa_context_free(ctx);
    workload_free(cases, num_cases);
    return rc;
}
