/*
 * `msa demo`: the library end to end on an M3-shaped model, checked.
 *
 * Model: Hq=64 Hkv=4 D=128, index Hi=4 Di=128, B=128 K=16 I=0 Lc=1, max
 * score; three layers: 0 dense, 1 sparse without index value (as M3's
 * sparse layers), 2 sparse with index value (to show that branch).  bf16
 * activations and cache, pages of 128 tokens in shuffled pool order.
 *
 * Steps, each through one plan serving every layer:
 *   prefill-prefix  request A writes its first `prefix` tokens
 *   prefill-chunk   A adds `chunk` tokens on top of the cached prefix
 *   decode          A plus forks of A (sharing A's leading pages, each with
 *                   a page of its own) decode one token each
 *   verify          the same requests verify 8 draft tokens each
 *
 * For every (step, layer): time, rate under the work models, selection
 * statistics, and the error against the oracle on sampled tokens (the
 * oracle reads the cache back from the library).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "devbuf.h"
#include "elem.h"
#include "oracle_cmp.h"
#include "synth.h"
#include "table.h"
#include "workmodel.h"

#define DEMO_LAYERS 3
#define DEMO_MAX_REQ 16

typedef struct demo_opts {
    msa_backend backend;
    int threads;
    const char *json;
    int64_t prefix, chunk; /* tokens of the two prefill steps */
    int64_t requests;      /* requests of the decode and verify steps */
    int64_t verify_len;    /* tokens per request of the verify step */
    int64_t samples;       /* token rows compared per (step, layer) */
    int64_t reps;          /* timed runs of the decode / verify steps */
    int64_t seed;
} demo_opts;

typedef struct demo {
    demo_opts opt;
    msa_context *ctx;
    msa_model *model;
    msa_cache *cache;
    msa_plan *plan;
    msa_dtype act;
    float scales[4];
    int32_t page_size;
    int32_t stride;                  /* page-table row length */
    int32_t *tables;                 /* [DEMO_MAX_REQ][stride]: row 0 request A, rows 1.. forks */
    int32_t fork_page[DEMO_MAX_REQ]; /* first page a fork owns (its shared prefix length) */
    synth_rng rng;
    table *tab;
    cJSON *rows;
    int failed;
    double total_s;
} demo;

/* One layer's tensors for one step, host floats (already rounded to the
 * activation dtype) and backend copies. */
typedef struct layer_bufs {
    float *q, *k, *v, *idx_q, *idx_k, *idx_v;
    float *o, *lse, *idx_o;
    int32_t *topk;
    dev_pool pool;
} layer_bufs;

static int demo_fail(demo *d, const char *what)
{
    fprintf(stderr, "msa demo: %s: %s\n", what, msa_context_last_error(d->ctx));
    return -1;
}

/* ---- setup -------------------------------------------------------------- */

static int demo_setup(demo *d)
{
    const demo_opts *o = &d->opt;
    d->ctx = cli_context(o->backend, o->threads);
    if (!d->ctx)
        return -1;
    static const uint8_t sparse[DEMO_LAYERS] = {0, 1, 1};
    static const uint8_t index_value[DEMO_LAYERS] = {0, 0, 1};
    msa_model_config cfg;
    msa_model_config_default(&cfg); /* M3 shape */
    cfg.num_layers = DEMO_LAYERS;
    cfg.layer_sparse = sparse;
    cfg.layer_index_value = index_value;
    if (msa_model_create(d->ctx, &cfg, &d->model) != MSA_OK)
        return demo_fail(d, "model");
    d->act = MSA_DTYPE_BF16;
    d->page_size = 128;

    /* Pages: A holds every token it will ever have; each fork one page. */
    int64_t a_tokens = o->prefix + o->chunk + 1 + o->verify_len;
    int32_t a_pages = (int32_t)((a_tokens + d->page_size - 1) / d->page_size);
    int32_t num_pages = a_pages + (int32_t)o->requests - 1;
    d->stride = a_pages;
    d->tables = malloc(sizeof(int32_t) * DEMO_MAX_REQ * (size_t)d->stride);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)num_pages);
    if (!d->tables || !perm) {
        free(perm);
        fprintf(stderr, "msa demo: out of memory\n");
        return -1;
    }
    /* Shuffled physical pages: the paging must not depend on order. */
    for (int32_t i = 0; i < num_pages; i++)
        perm[i] = i;
    for (int32_t i = num_pages - 1; i > 0; i--) {
        int32_t j = (int32_t)synth_below(&d->rng, (uint64_t)i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int64_t i = 0; i < DEMO_MAX_REQ * (int64_t)d->stride; i++)
        d->tables[i] = -1;
    memcpy(d->tables, perm, sizeof(int32_t) * (size_t)a_pages);
    /* Fork r shares A's first fork_page[r] pages (full pages of the chunked
     * prefill), spread evenly over A's context, then writes its own page. */
    int32_t full = (int32_t)((o->prefix + o->chunk) / d->page_size);
    for (int32_t r = 1; r < o->requests; r++) {
        int32_t f = (int32_t)((int64_t)full * r / o->requests);
        if (f < 1)
            f = 1;
        d->fork_page[r] = f;
        int32_t *row = d->tables + (int64_t)r * d->stride;
        memcpy(row, perm, sizeof(int32_t) * (size_t)f);
        row[f] = perm[a_pages + r - 1];
    }
    free(perm);

    msa_cache_config cc;
    msa_cache_config_default(&cc); /* bf16 planes */
    cc.num_pages = num_pages;
    cc.page_size = d->page_size;
    if (msa_cache_create(d->ctx, d->model, &cc, &d->cache) != MSA_OK)
        return demo_fail(d, "cache");
    for (int p = 0; p < 4; p++)
        d->scales[p] = 1.0f;
    msa_plan_params limits;
    msa_plan_params_default(&limits);
    limits.act_dtype = d->act;
    if (msa_plan_create(d->ctx, d->model, d->cache, &limits, &d->plan) != MSA_OK)
        return demo_fail(d, "plan");
    return 0;
}

/* ---- one layer ---------------------------------------------------------- */

static void bufs_free(layer_bufs *b)
{
    free(b->q);
    free(b->k);
    free(b->v);
    free(b->idx_q);
    free(b->idx_k);
    free(b->idx_v);
    free(b->o);
    free(b->lse);
    free(b->idx_o);
    free(b->topk);
    dev_pool_release(&b->pool);
    memset(b, 0, sizeof *b);
}

/* Random activations: host floats rounded to the activation dtype, and the
 * same values in backend memory. */
static float *make_input(demo *d, layer_bufs *b, int64_t n, const void **dev)
{
    float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!x)
        return NULL;
    synth_fill_uniform(&d->rng, x, n, 1.0f);
    elem_round_f32(x, d->act, n);
    if (!(*dev = dev_pool_act(&b->pool, d->act, x, n))) {
        free(x);
        return NULL;
    }
    return x;
}

/* Rows to hold against the oracle: per request the last row, then the
 * first, then evenly spaced rows between. */
static int pick_rows(const demo *d, const msa_step *step, int64_t *rows, int max_rows)
{
    int n = 0;
    int per = (int)(d->opt.samples / step->num_requests);
    if (per < 1)
        per = 1;
    int64_t start = 0;
    for (int32_t r = 0; r < step->num_requests; start += step->q_len[r], r++) {
        int32_t q = step->q_len[r];
        int take = q < per ? q : per;
        for (int s = 0; s < take && n < max_rows; s++) {
            /* s = 0 -> last row, s = take-1 -> first row (when take > 1) */
            int64_t off = take == 1 ? q - 1 : (int64_t)(q - 1) * (take - 1 - s) / (take - 1);
            rows[n++] = start + off;
        }
    }
    return n;
}

static const char *layer_kind(const demo *d, int32_t l)
{
    if (!msa_model_layer_is_sparse(d->model, l))
        return "dense";
    return msa_model_layer_has_index_value(d->model, l) ? "sparse+iv" : "sparse";
}

/* Sizes of one layer's step tensors. */
typedef struct layer_shape {
    int sparse, iv;
    int32_t W;
    int64_t T, n_o, n_kv, n_iq, n_ik, n_lse, n_ids;
} layer_shape;

static void layer_shape_init(const demo *d, const msa_step *step, int32_t l, layer_shape *sh)
{
    msa_model_config cfg;
    msa_model_get_config(d->model, &cfg);
    sh->sparse = msa_model_layer_is_sparse(d->model, l);
    sh->iv = msa_model_layer_has_index_value(d->model, l);
    sh->W = msa_model_topk_width(d->model);
    sh->T = step->num_tokens;
    sh->n_o = sh->T * cfg.num_q_heads * cfg.head_dim;
    sh->n_kv = sh->T * cfg.num_kv_heads * cfg.head_dim;
    sh->n_iq = sh->T * cfg.num_index_heads * cfg.index_dim;
    sh->n_ik = sh->T * cfg.index_dim;
    sh->n_lse = sh->T * cfg.num_q_heads;
    sh->n_ids = sh->T * cfg.num_kv_heads * sh->W;
}

/* Random inputs (kept on the host for the oracle) and output buffers. */
static int make_layer_io(demo *d, const layer_shape *sh, layer_bufs *b, msa_layer_io *io)
{
    const size_t act = msa_dtype_size(d->act);
    msa_layer_io_default(io);
    io->act_dtype = d->act;
    b->q = make_input(d, b, sh->n_o, &io->q);
    b->k = make_input(d, b, sh->n_kv, &io->k);
    b->v = make_input(d, b, sh->n_kv, &io->v);
    int ok = b->q && b->k && b->v;
    if (ok && sh->sparse) {
        b->idx_q = make_input(d, b, sh->n_iq, &io->idx_q);
        b->idx_k = make_input(d, b, sh->n_ik, &io->idx_k);
        ok = b->idx_q && b->idx_k;
    }
    if (ok && sh->iv)
        ok = (b->idx_v = make_input(d, b, sh->n_ik, &io->idx_v)) != NULL;
    if (ok) {
        io->o = dev_pool_alloc(&b->pool, NULL, (size_t)sh->n_o * act);
        io->lse = dev_pool_alloc(&b->pool, NULL, sizeof(float) * (size_t)sh->n_lse);
        ok = io->o && io->lse;
        if (ok && sh->sparse)
            ok = (io->topk = dev_pool_alloc(&b->pool, NULL, sizeof(int32_t) * (size_t)sh->n_ids)) !=
                 NULL;
        if (ok && sh->iv)
            ok = (io->idx_o = dev_pool_alloc(&b->pool, NULL, (size_t)sh->n_iq * act)) != NULL;
    }
    if (!ok) {
        fprintf(stderr, "msa demo: no memory for the layer's tensors: %s\n",
                msa_context_last_error(d->ctx));
        return -1;
    }
    return 0;
}

/* Runs the layer once (the step itself: cache write, then attention) and
 * returns its time; decode steps are short, so they are timed again over
 * repeated runs (rewriting the same entries is harmless) and the median
 * kept, within about half a second per layer so slow builds stay quick. */
static int run_and_time(demo *d, int32_t l, const msa_layer_io *io, int decode, double *seconds)
{
    double t0 = cli_now();
    if (msa_forward(d->ctx, d->plan, l, io) != MSA_OK || msa_synchronize(d->ctx) != MSA_OK)
        return demo_fail(d, "forward");
    *seconds = cli_now() - t0;
    if (!decode)
        return 0;
    int reps = (int)d->opt.reps;
    if (*seconds * (reps + 2) > 0.5)
        reps = *seconds > 0.1 ? 3 : (int)(0.5 / *seconds) - 2;
    if (reps < 3)
        reps = 3;
    double *times = malloc(sizeof(double) * (size_t)reps);
    if (!times || msa_bench_forward(d->ctx, d->plan, l, io, 1, 2, reps, times) != MSA_OK) {
        free(times);
        return demo_fail(d, "bench forward");
    }
    cli_sort_doubles(times, (size_t)reps);
    *seconds = times[reps / 2] * 1e-6;
    free(times);
    return 0;
}

/* The outputs back on the host as float / int32. */
static int read_outputs(demo *d, const layer_shape *sh, const msa_layer_io *io, layer_bufs *b)
{
    const size_t act = msa_dtype_size(d->act);
    b->o = malloc(sizeof(float) * (size_t)(sh->n_o + 1));
    b->lse = malloc(sizeof(float) * (size_t)(sh->n_lse + 1));
    b->topk = malloc(sizeof(int32_t) * (size_t)(sh->n_ids + 1));
    b->idx_o = malloc(sizeof(float) * (size_t)(sh->n_iq + 1));
    void *stage = malloc((size_t)(sh->n_o > sh->n_iq ? sh->n_o : sh->n_iq) * act + 1);
    int ok = b->o && b->lse && b->topk && b->idx_o && stage;
    ok = ok && msa_copy_from_buffer(d->ctx, stage, io->o, (size_t)sh->n_o * act) == MSA_OK;
    if (ok)
        elem_to_f32(b->o, d->act, stage, sh->n_o);
    ok = ok &&
         msa_copy_from_buffer(d->ctx, b->lse, io->lse, sizeof(float) * (size_t)sh->n_lse) == MSA_OK;
    if (ok && sh->sparse)
        ok = msa_copy_from_buffer(d->ctx, b->topk, io->topk, sizeof(int32_t) * (size_t)sh->n_ids) ==
             MSA_OK;
    if (ok && sh->iv) {
        ok = msa_copy_from_buffer(d->ctx, stage, io->idx_o, (size_t)sh->n_iq * act) == MSA_OK;
        if (ok)
            elem_to_f32(b->idx_o, d->act, stage, sh->n_iq);
    }
    free(stage);
    if (!ok)
        fprintf(stderr, "msa demo: cannot read the outputs back\n");
    return ok ? 0 : -1;
}

/* What one (step, layer) row reports. */
typedef struct layer_row {
    double seconds;
    double work;     /* bytes (decode) or FLOPs (prefill) of the work model */
    double sel_mean; /* selected blocks per (token, KV head) */
    double kept;     /* of the reachable blocks */
    int64_t max_kv;
    int num_rows; /* tokens held against the oracle */
    double tol;
    int passed;
    cmp_result res;
} layer_row;

/* Work and selection statistics, request by request. */
static void layer_stats(const demo *d, const msa_step *step, int32_t l, const layer_shape *sh,
                        const int32_t *topk, int decode, layer_row *row)
{
    msa_cache_config cc;
    msa_cache_get_config(d->cache, &cc);
    work_layer w;
    work_layer_init(&w, d->model, l, cc.kv_dtype, cc.index_dtype);
    int64_t selected = 0, reachable = 0, row0 = 0;
    int64_t per_token = sh->T > 0 ? sh->n_ids / sh->T : 0;
    for (int32_t r = 0; r < step->num_requests; row0 += step->q_len[r], r++) {
        const int32_t *ids = sh->sparse ? topk + row0 * per_token : NULL;
        int64_t s, n;
        if (decode)
            row->work += work_decode_bytes(&w, step->kv_len[r], step->q_len[r], ids);
        else
            row->work += work_prefill_flops(&w, step->kv_len[r], step->q_len[r], ids);
        work_selection_stats(&w, step->kv_len[r], step->q_len[r], ids, &s, &n);
        selected += s;
        reachable += n;
        if (step->kv_len[r] > row->max_kv)
            row->max_kv = step->kv_len[r];
    }
    row->sel_mean = sh->sparse && sh->T ? (double)selected / (double)(sh->n_ids / sh->W) : 0.0;
    row->kept = reachable ? (double)selected / (double)reachable : 1.0;
}

static void report_row(demo *d, const char *step_name, int decode, const msa_step *step, int32_t l,
                       const layer_shape *sh, const layer_row *row)
{
    const cmp_result *res = &row->res;
    double rate = row->seconds > 0 ? row->work / row->seconds * 1e-9 : 0.0;
    double err = fmax(res->o_err, fmax(res->lse_err, res->idx_o_err));
    table_cell(d->tab, "%s", step_name);
    table_cell(d->tab, "%d %s", l, layer_kind(d, l));
    table_cell(d->tab, "%lld", (long long)sh->T);
    table_cell(d->tab, "%lld", (long long)row->max_kv);
    table_cell(d->tab, "%.3f", row->seconds * 1e3);
    table_cell(d->tab, "%.1f %s", rate, decode ? "GB/s" : "GFLOP/s");
    if (sh->sparse) {
        table_cell(d->tab, "%.1f", row->sel_mean);
        table_cell(d->tab, "%.0f%%", row->kept * 100.0);
        table_cell(d->tab, "%ld/%ld%s", res->topk_mismatches, res->topk_rows,
                   res->near_ties ? " (tie)" : "");
    } else {
        table_cell(d->tab, "all");
        table_cell(d->tab, "100%%");
        table_cell(d->tab, "-");
    }
    table_cell(d->tab, "%.1e", err);
    table_cell(d->tab, "%s", row->passed ? "ok" : "FAIL");
    table_cell(d->tab, "%s", msa_plan_kernel_name(d->plan, l));

    cJSON *o = cJSON_CreateObject();
    if (!o)
        return;
    cJSON_AddStringToObject(o, "step", step_name);
    cJSON_AddNumberToObject(o, "layer", l);
    cJSON_AddStringToObject(o, "layer_kind", layer_kind(d, l));
    cJSON_AddStringToObject(o, "kernel", msa_plan_kernel_name(d->plan, l));
    cJSON_AddStringToObject(o, "fallback_reason", msa_plan_fallback_reason(d->plan, l));
    cJSON_AddNumberToObject(o, "requests", step->num_requests);
    cJSON_AddNumberToObject(o, "tokens", (double)sh->T);
    cJSON_AddNumberToObject(o, "max_kv_len", (double)row->max_kv);
    cJSON_AddNumberToObject(o, "time_us", row->seconds * 1e6);
    cJSON_AddNumberToObject(o, decode ? "bytes" : "flops", row->work);
    cJSON_AddNumberToObject(o, decode ? "gb_per_s" : "gflop_per_s", rate);
    if (sh->sparse) {
        cJSON_AddNumberToObject(o, "selected_blocks_mean", row->sel_mean);
        cJSON_AddNumberToObject(o, "kept_fraction", row->kept);
        cJSON_AddNumberToObject(o, "topk_rows", (double)res->topk_rows);
        cJSON_AddNumberToObject(o, "topk_mismatches", (double)res->topk_mismatches);
        cJSON_AddNumberToObject(o, "near_ties", (double)res->near_ties);
    }
    cJSON_AddNumberToObject(o, "sampled_tokens", row->num_rows);
    cJSON_AddNumberToObject(o, "o_rel_err", res->o_err);
    cJSON_AddNumberToObject(o, "lse_rel_err", res->lse_err);
    if (sh->iv)
        cJSON_AddNumberToObject(o, "idx_o_rel_err", res->idx_o_err);
    cJSON_AddNumberToObject(o, "tolerance", row->tol);
    cJSON_AddBoolToObject(o, "passed", row->passed);
    cJSON_AddItemToArray(d->rows, o);
}

static int run_layer(demo *d, const char *step_name, int decode, const msa_step *step, int32_t l)
{
    layer_shape sh;
    layer_shape_init(d, step, l, &sh);
    layer_bufs b;
    memset(&b, 0, sizeof b);
    dev_pool_init(&b.pool, d->ctx);
    msa_layer_io io;
    layer_row row;
    memset(&row, 0, sizeof row);
    int rc = make_layer_io(d, &sh, &b, &io);
    if (rc == 0)
        rc = run_and_time(d, l, &io, decode, &row.seconds);
    if (rc == 0)
        rc = read_outputs(d, &sh, &io, &b);
    if (rc != 0) {
        bufs_free(&b);
        return -1;
    }
    layer_stats(d, step, l, &sh, b.topk, decode, &row);

    /* The oracle on sampled rows. */
    int64_t rows[64];
    row.num_rows = pick_rows(d, step, rows, 64);
    cmp_inputs in = {
        .ctx = d->ctx,
        .model = d->model,
        .cache = d->cache,
        .plane_scales = d->scales,
        .layer = l,
        .step = step,
        .q = b.q,
        .idx_q = b.idx_q,
        .o = b.o,
        .lse = b.lse,
        .idx_o = sh.iv ? b.idx_o : NULL,
        .topk = sh.sparse ? b.topk : NULL,
        .rows = rows,
        .num_rows = row.num_rows,
    };
    row.tol = d->act == MSA_DTYPE_FP32 ? 1e-5 : 1e-2;
    int ran = cmp_layer(&in, &row.res) == 0;
    const cmp_result *res = &row.res;
    row.passed = ran && !res->nonfinite && res->o_err <= row.tol && res->lse_err <= row.tol &&
                 res->idx_o_err <= row.tol && res->topk_mismatches == res->near_ties;
    if (!ran)
        fprintf(stderr, "msa demo: oracle comparison failed: %s\n", res->message);
    if (!row.passed)
        d->failed = 1;
    d->total_s += row.seconds;
    report_row(d, step_name, decode, step, l, &sh, &row);
    bufs_free(&b);
    return 0;
}

/* ---- one step ----------------------------------------------------------- */

static int run_step(demo *d, const char *name, int decode, int32_t num_requests,
                    const int32_t *q_len, const int32_t *kv_len)
{
    int64_t tokens = 0;
    for (int32_t r = 0; r < num_requests; r++)
        tokens += q_len[r];
    msa_step step = {num_requests, tokens, q_len, kv_len, d->tables, d->stride};
    if (msa_plan_update(d->plan, &step, NULL) != MSA_OK)
        return demo_fail(d, name);
    for (int32_t l = 0; l < DEMO_LAYERS; l++) {
        /* Progress: each (step, layer) says when it starts and how long it
         * took with its data and its check against the oracle. */
        fprintf(stderr, "msa demo: %s, layer %d (%s) ...", name, l, layer_kind(d, l));
        fflush(stderr);
        double t0 = cli_now();
        if (run_layer(d, name, decode, &step, l) != 0)
            return -1;
        fprintf(stderr, " %.2f s\n", cli_now() - t0);
    }
    return 0;
}

static int run_all_steps(demo *d)
{
    const demo_opts *o = &d->opt;
    int32_t R = (int32_t)o->requests;
    int32_t q[DEMO_MAX_REQ], kv[DEMO_MAX_REQ];

    q[0] = (int32_t)o->prefix;
    kv[0] = (int32_t)o->prefix;
    if (run_step(d, "prefill-prefix", 0, 1, q, kv) != 0)
        return -1;
    q[0] = (int32_t)o->chunk;
    kv[0] = (int32_t)(o->prefix + o->chunk);
    if (run_step(d, "prefill-chunk", 0, 1, q, kv) != 0)
        return -1;
    /* A continues; fork r's first new token sits at the start of its own page. */
    q[0] = 1;
    kv[0] = (int32_t)(o->prefix + o->chunk + 1);
    for (int32_t r = 1; r < R; r++) {
        q[r] = 1;
        kv[r] = d->fork_page[r] * d->page_size + 1;
    }
    if (run_step(d, "decode", 1, R, q, kv) != 0)
        return -1;
    for (int32_t r = 0; r < R; r++) {
        q[r] = (int32_t)o->verify_len;
        kv[r] += (int32_t)o->verify_len;
    }
    return run_step(d, "verify", 1, R, q, kv);
}

/* ---- the verb ----------------------------------------------------------- */

static void demo_usage(FILE *f)
{
    fprintf(f,
            "usage: msa demo [--threads N] [--json FILE] [--backend cpu|cuda]\n"
            "                [--prefix N] [--chunk N] [--requests N] [--verify N]\n"
            "                [--samples N] [--reps N] [--seed N]\n"
            "  --threads N    CPU worker threads (0 = all online cores; default)\n"
            "  --json FILE    also write every row as JSON\n"
            "  --prefix N     tokens of the first prefill (default 4096)\n"
            "  --chunk N      tokens of the second prefill on top of it (default 1024)\n"
            "  --requests N   requests of the decode / verify steps (default 4, max %d)\n"
            "  --verify N     draft tokens per request in the verify step (default 8)\n"
            "  --samples N    tokens held against the oracle per step and layer (default 4)\n"
            "  --reps N       timed runs of each decode / verify layer (default 20)\n"
            "exit status 1 when a check against the oracle fails\n",
            DEMO_MAX_REQ);
}

static int parse_opts(int argc, char **argv, demo_opts *o, int *help)
{
    const cli_int_opt ints[] = {
        {"--prefix", 1, 1 << 20, &o->prefix},
        {"--chunk", 1, 1 << 20, &o->chunk},
        {"--requests", 1, DEMO_MAX_REQ, &o->requests},
        {"--verify", 1, 127, &o->verify_len},
        {"--samples", 1, 64, &o->samples},
        {"--reps", 1, 100000, &o->reps},
        {"--seed", 0, INT64_MAX, &o->seed},
    };
    for (int i = 1; i < argc; i++) {
        const char *val;
        int r, matched = 0;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            *help = 1;
            return 0;
        }
        if ((r = cli_option(argc, argv, &i, "--backend", &val)) != 0) {
            if (r < 0 || cli_backend(val, &o->backend) != 0)
                return -1;
            continue;
        }
        if ((r = cli_option(argc, argv, &i, "--json", &val)) != 0) {
            if (r < 0)
                return -1;
            o->json = val;
            continue;
        }
        if ((r = cli_option(argc, argv, &i, "--threads", &val)) != 0) {
            int64_t t;
            if (r < 0 || cli_int("--threads", val, 0, 1024, &t) != 0)
                return -1;
            o->threads = (int)t;
            continue;
        }
        if ((matched = cli_int_options(argc, argv, &i, ints, sizeof ints / sizeof ints[0])) < 0)
            return -1;
        if (!matched) {
            fprintf(stderr, "msa demo: unknown option '%s'\n", argv[i]);
            return -1;
        }
    }
    if (o->prefix + o->chunk < 128) {
        fprintf(stderr, "msa demo: --prefix + --chunk must be at least one page (128)\n");
        return -1;
    }
    return 0;
}

int cmd_demo(int argc, char **argv)
{
    demo d;
    memset(&d, 0, sizeof d);
    d.opt = (demo_opts){.backend = MSA_BACKEND_CPU,
                        .prefix = 4096,
                        .chunk = 1024,
                        .requests = 4,
                        .verify_len = 8,
                        .samples = 4,
                        .reps = 20,
                        .seed = 20261130};
    int help = 0;
    if (parse_opts(argc, argv, &d.opt, &help) != 0) {
        demo_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (help) {
        demo_usage(stdout);
        return CLI_EXIT_OK;
    }
    synth_seed(&d.rng, (uint64_t)d.opt.seed);
    static const char *const headers[] = {"step",      "layer",   "tokens",  "ctx",
                                          "ms",        "rate",    "blk/tok", "kept",
                                          "topk diff", "max err", "check",   "kernel"};
    d.tab = table_new(12, headers);
    d.rows = cJSON_CreateArray();
    int rc = (d.tab && d.rows) ? demo_setup(&d) : -1;
    double wall0 = cli_now();
    if (rc == 0) {
        printf("M3-shaped model: Hq=64 Hkv=4 D=128, index Hi=4 Di=128, B=128 K=16 I=0 Lc=1, "
               "max score; bf16 activations and cache\n");
        printf("layers: 0 dense, 1 sparse, 2 sparse with index value; %s backend, %d threads\n",
               msa_backend_name(d.opt.backend), msa_context_num_threads(d.ctx));
        printf("steps: prefill %lld tokens, prefill %lld more on that prefix, decode %lld "
               "requests (forks share A's pages), verify %lld tokens each\n\n",
               (long long)d.opt.prefix, (long long)d.opt.chunk, (long long)d.opt.requests,
               (long long)d.opt.verify_len);
        fflush(stdout);
        rc = run_all_steps(&d);
    }
    double wall = cli_now() - wall0;
    if (d.tab && d.rows && cJSON_GetArraySize(d.rows) > 0) {
        table_print(d.tab, stdout);
        printf("\nrate: prefill GFLOP/s of useful work, decode GB/s of the bytes model "
               "(docs/PERFORMANCE.md); blk/tok: selected blocks per token and KV head; "
               "kept: of the reachable blocks;\n"
               "max err: ||out - oracle|| / ||oracle|| over o, lse, idx_o on %lld sampled "
               "tokens per row (bound %.0e)\n",
               (long long)d.opt.samples, d.act == MSA_DTYPE_FP32 ? 1e-5 : 1e-2);
        printf("library time %.2f s, wall time %.2f s (data generation and oracle included)\n",
               d.total_s, wall);
    }
    if (rc == 0 && d.opt.json) {
        cJSON *root = cJSON_CreateObject();
        char err[600];
        if (root) {
            cJSON_AddStringToObject(root, "backend", msa_backend_name(d.opt.backend));
            cJSON_AddNumberToObject(root, "threads", msa_context_num_threads(d.ctx));
            cJSON_AddStringToObject(root, "version", msa_version_string());
            cJSON_AddBoolToObject(root, "passed", !d.failed);
            cJSON_AddItemToObject(root, "rows", d.rows);
            d.rows = NULL;
            if (json_write_file(d.opt.json, root, err, sizeof err) != 0) {
                fprintf(stderr, "msa demo: %s\n", err);
                rc = -1;
            }
            cJSON_Delete(root);
        }
    }
    if (rc == 0)
        printf("%s\n",
               d.failed ? "demo: FAILED (see the check column)" : "demo: all checks passed");
    cJSON_Delete(d.rows);
    table_free(d.tab);
    free(d.tables);
    msa_plan_free(d.plan);
    msa_cache_free(d.cache);
    msa_model_free(d.model);
    msa_context_free(d.ctx);
    return (rc != 0 || d.failed) ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
