#include "bench_run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "devbuf.h"
#include "elem.h"
#include "plane.h"
#include "workmodel.h"

#define MAX_COPIES 16
#define MAX_SETS 4
/* Synthetic plane data is generated in tiles of about this size and
 * repeated: generating hundreds of GB of random numbers would dominate the
 * run, and the timing does not depend on the values. */
#define TILE_BYTES ((size_t)16 << 20)

typedef struct run_state {
    const bench_env *env;
    const bench_case *c;
    msa_model_config cfg;
    int32_t num_layers; /* of the model */
    int32_t width;
    int64_t tokens;
    int64_t num_pages;
    msa_cache_config cache_cfg; /* of every copy */
    int32_t max_pages;          /* page-table row length */
    int32_t *page_table;
    int copies, sets;
    msa_cache *cache[MAX_COPIES];
    msa_plan *plan[MAX_COPIES];
    msa_layer_io io[MAX_SETS];
    dev_pool pool;
    size_t io_bytes; /* inputs + outputs of one set */
} run_state;

static int fail_lib(run_state *s, bench_result *res, const char *what)
{
    snprintf(res->message, sizeof res->message, "%s: %s", what,
             msa_context_last_error(s->env->ctx));
    return -1;
}

/* ---- sizes -------------------------------------------------------------- */

static double cache_bytes_per_copy(const run_state *s)
{
    double total = 0;
    for (int32_t l = 0; l < s->num_layers; l++)
        for (int p = 0; p < 4; p++) {
            plane_geom g;
            plane_geometry(s->env->model, l, &s->cache_cfg, (msa_plane)p, &g);
            total += (double)g.bytes;
        }
    return total;
}

/* Upper bound of the bytes one forward of `layer` reads (before the real
 * selections are known): used only to choose the number of copies. */
static double bytes_estimate(const run_state *s, int32_t layer)
{
    const msa_model_config *m = &s->cfg;
    double e = elem_bytes_per_value(s->env->kv_dtype),
           ie = elem_bytes_per_value(s->env->index_dtype);
    double total = 0;
    for (int32_t r = 0; r < s->c->num_requests; r++) {
        double kv = s->c->kv_len[r];
        if (!msa_model_layer_is_sparse(s->env->model, layer)) {
            total += kv * m->num_kv_heads * m->head_dim * e * 2;
            continue;
        }
        double reach = fmin(kv, (double)s->c->q_len[r] * s->width * m->block_size + m->block_size);
        total += kv * m->index_dim * ie + m->num_kv_heads * reach * m->head_dim * e * 2;
    }
    return total;
}

/* ---- setup -------------------------------------------------------------- */

/* Backend buffer of n random activations. */
static void *dev_random(run_state *s, int64_t n)
{
    float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    void *dev = NULL;
    if (x) {
        synth_fill_uniform(s->env->rng, x, n, 1.0f);
        dev = dev_pool_act(&s->pool, s->env->act_dtype, x, n);
    }
    free(x);
    return dev;
}

static int make_io_sets(run_state *s, bench_result *res)
{
    const msa_model_config *m = &s->cfg;
    const int64_t T = s->tokens;
    const size_t act = msa_dtype_size(s->env->act_dtype);
    int any_iv = 0;
    for (int32_t l = 0; l < s->num_layers; l++)
        any_iv |= msa_model_layer_has_index_value(s->env->model, l);
    s->io_bytes = (size_t)T * act *
                  (size_t)(2 * m->num_q_heads * m->head_dim + 2 * m->num_kv_heads * m->head_dim +
                           m->num_index_heads * m->index_dim + m->index_dim);
    for (int i = 0; i < s->sets; i++) {
        msa_layer_io *io = &s->io[i];
        msa_layer_io_default(io);
        io->act_dtype = s->env->act_dtype;
        io->write_cache = s->env->write_cache;
        io->q = dev_random(s, T * m->num_q_heads * m->head_dim);
        io->k = dev_random(s, T * m->num_kv_heads * m->head_dim);
        io->v = dev_random(s, T * m->num_kv_heads * m->head_dim);
        io->idx_q = dev_random(s, T * m->num_index_heads * m->index_dim);
        io->idx_k = dev_random(s, T * m->index_dim);
        io->idx_v = any_iv ? dev_random(s, T * m->index_dim) : NULL;
        io->o = dev_pool_alloc(&s->pool, NULL, (size_t)(T * m->num_q_heads * m->head_dim) * act);
        io->idx_o = any_iv ? dev_pool_alloc(&s->pool, NULL,
                                            (size_t)(T * m->num_index_heads * m->index_dim) * act)
                           : NULL;
        if (!io->q || !io->k || !io->v || !io->idx_q || !io->idx_k || !io->o ||
            (any_iv && (!io->idx_v || !io->idx_o))) {
            snprintf(res->message, sizeof res->message, "cannot allocate the input sets");
            return -1;
        }
    }
    return 0;
}

/* The tile's values in the plane's format.  Quantized formats go through
 * the library's encoder (msa_quantize_rows: the cache write's rule of SPEC
 * 8), region by region; the test kit's reference encoder, which searches
 * the code table for every value, took 1.6 s per 16 MB tile of fp8 codes,
 * seconds per case of a prefill workload. */
static int encode_tile(const run_state *s, void *tile, msa_dtype dt, const float *x, int64_t units,
                       int64_t elems)
{
    if (dt != MSA_DTYPE_FP8_E4M3 && dt != MSA_DTYPE_NVFP4) {
        elem_encode_plane(tile, dt, x, units, elems, 1.0f);
        return 0;
    }
    const int32_t P = s->cache_cfg.page_size;
    const size_t unit_bytes = elem_plane_bytes(dt, 1, elems);
    for (int64_t u = 0; u < units; u++) {
        unsigned char *region = (unsigned char *)tile + (size_t)u * unit_bytes;
        void *scales = dt == MSA_DTYPE_NVFP4 ? region + (size_t)elems / 2 : NULL;
        if (msa_quantize_rows(NULL, dt, 1.0f, x + u * elems, MSA_DTYPE_FP32, P,
                              (int32_t)(elems / P), region, scales) != MSA_OK)
            return -1;
    }
    return 0;
}

/* Fills every plane of every copy from one random tile per plane. */
static int fill_caches(run_state *s, bench_result *res)
{
    for (int32_t l = 0; l < s->num_layers; l++) {
        for (int p = 0; p < 4; p++) {
            plane_geom g;
            plane_geometry(s->env->model, l, &s->cache_cfg, (msa_plane)p, &g);
            if (g.bytes == 0)
                continue;
            if (g.bytes != msa_cache_plane_bytes(s->cache[0], l, (msa_plane)p)) {
                snprintf(res->message, sizeof res->message,
                         "the library's %s plane layout differs from the one this program writes",
                         msa_dtype_name(g.dtype));
                return -1;
            }
            const int64_t units = g.units, elems = g.unit_elems;
            size_t unit_bytes = elem_plane_bytes(g.dtype, 1, elems);
            int64_t tile_units = (int64_t)(TILE_BYTES / unit_bytes);
            if (tile_units < 1)
                tile_units = 1;
            if (tile_units > units)
                tile_units = units;
            float *x = malloc(sizeof(float) * (size_t)(tile_units * elems));
            void *tile = malloc(unit_bytes * (size_t)tile_units);
            if (!x || !tile) {
                free(x);
                free(tile);
                snprintf(res->message, sizeof res->message, "cannot build the cache tiles");
                return -1;
            }
            synth_fill_uniform(s->env->rng, x, tile_units * elems, 1.0f);
            /* Unit-variance data fits the default quantization scale of 1.0. */
            const int enc = encode_tile(s, tile, g.dtype, x, tile_units, elems);
            free(x);
            if (enc != 0) {
                free(tile);
                snprintf(res->message, sizeof res->message, "cannot encode the %s cache tile",
                         msa_dtype_name(g.dtype));
                return -1;
            }
            for (int c = 0; c < s->copies; c++) {
                char *dst = msa_cache_plane_data(s->cache[c], l, (msa_plane)p);
                for (int64_t u = 0; u < units; u += tile_units) {
                    int64_t n = units - u < tile_units ? units - u : tile_units;
                    if (msa_copy_to_buffer(s->env->ctx, dst + (size_t)u * unit_bytes, tile,
                                           (size_t)n * unit_bytes) != MSA_OK) {
                        free(tile);
                        return fail_lib(s, res, "filling the cache");
                    }
                }
            }
            free(tile);
        }
    }
    return 0;
}

static int make_copies(run_state *s, bench_result *res)
{
    msa_plan_params lim;
    msa_plan_params_default(&lim);
    lim.act_dtype = s->env->act_dtype;
    lim.max_requests = s->c->num_requests;
    lim.max_tokens = s->tokens > 0 ? s->tokens : 1;
    /* As an engine's plan for steps of this shape: a decode plan says that
     * no request exceeds its q_len, which keeps prefill kernels off it. */
    for (int32_t r = 0; r < s->c->num_requests; r++)
        if (s->c->q_len[r] > lim.max_q_len)
            lim.max_q_len = s->c->q_len[r];
    for (int32_t r = 0; r < s->c->num_requests; r++)
        if (s->c->kv_len[r] > lim.max_kv_len)
            lim.max_kv_len = s->c->kv_len[r];
    msa_step step = {s->c->num_requests, s->tokens,     s->c->q_len,
                     s->c->kv_len,       s->page_table, s->max_pages};
    int wanted = s->copies;
    s->copies = 0;
    for (int c = 0; c < wanted; c++) {
        msa_status st = msa_cache_create(s->env->ctx, s->env->model, &s->cache_cfg, &s->cache[c]);
        if (st == MSA_ERR_OUT_OF_MEMORY && c > 0)
            break; /* fewer copies than hoped: still a valid measurement */
        if (st != MSA_OK)
            return fail_lib(s, res, "cache");
        s->copies = c + 1;
        if (msa_plan_create(s->env->ctx, s->env->model, s->cache[c], &lim, &s->plan[c]) != MSA_OK)
            return fail_lib(s, res, "plan");
        if (msa_plan_update(s->plan[c], &step, NULL) != MSA_OK)
            return fail_lib(s, res, "plan update");
    }
    return 0;
}

/* ---- measuring ---------------------------------------------------------- */

/* Work of `layer` from the selections of an untimed run of every input set. */
static int measure_work(run_state *s, int32_t layer, bench_layer_result *lr, bench_result *res)
{
    const msa_model_config *m = &s->cfg;
    const int sparse = msa_model_layer_is_sparse(s->env->model, layer);
    const size_t n_ids = (size_t)(s->tokens * m->num_kv_heads * s->width);
    int32_t *ids = sparse ? malloc(sizeof(int32_t) * (n_ids + 1)) : NULL;
    int32_t *dev_ids = sparse ? dev_pool_alloc(&s->pool, NULL, sizeof(int32_t) * n_ids) : NULL;
    if (sparse && (!ids || !dev_ids)) {
        free(ids);
        snprintf(res->message, sizeof res->message, "out of memory for selected ids");
        return -1;
    }
    work_layer w;
    work_layer_init(&w, s->env->model, layer, s->env->kv_dtype, s->env->index_dtype);
    double bytes = 0, flops = 0, blocks = 0;
    for (int i = 0; i < s->sets; i++) {
        msa_layer_io io = s->io[i];
        io.topk = dev_ids;
        if (msa_forward(s->env->ctx, s->plan[0], layer, &io) != MSA_OK ||
            msa_synchronize(s->env->ctx) != MSA_OK ||
            (sparse &&
             msa_copy_from_buffer(s->env->ctx, ids, dev_ids, sizeof(int32_t) * n_ids) != MSA_OK)) {
            free(ids);
            return fail_lib(s, res, "forward");
        }
        int64_t row = 0;
        for (int32_t r = 0; r < s->c->num_requests; row += s->c->q_len[r], r++) {
            const int32_t *t = sparse ? ids + row * m->num_kv_heads * s->width : NULL;
            bytes += work_decode_bytes(&w, s->c->kv_len[r], s->c->q_len[r], t);
            flops += work_prefill_flops(&w, s->c->kv_len[r], s->c->q_len[r], t);
            blocks += (double)work_union_blocks(&w, s->c->kv_len[r], s->c->q_len[r], t);
        }
    }
    free(ids);
    lr->bytes = bytes / s->sets;
    lr->flops = flops / s->sets;
    lr->union_blocks = blocks / s->sets / ((double)s->c->num_requests * m->num_kv_heads);
    return 0;
}

static int time_layer(run_state *s, int32_t layer, bench_layer_result *lr, bench_result *res)
{
    const bench_env *env = s->env;
    double *times = malloc(sizeof(double) * (size_t)env->reps);
    if (!times) {
        snprintf(res->message, sizeof res->message, "out of memory");
        return -1;
    }
    msa_status st = MSA_OK;
    if (s->copies == 1) {
        st = msa_bench_forward(env->ctx, s->plan[0], layer, s->io, s->sets, env->warmup, env->reps,
                               times);
    } else {
        /* One run per call so consecutive runs read different caches. */
        for (int i = 0; st == MSA_OK && i < env->warmup + env->reps; i++) {
            double t = 0;
            st = msa_bench_forward(env->ctx, s->plan[i % s->copies], layer,
                                   &s->io[(i / s->copies) % s->sets], 1, 0, 1, &t);
            if (i >= env->warmup)
                times[i - env->warmup] = t;
        }
    }
    if (st != MSA_OK) {
        free(times);
        return fail_lib(s, res, "timing");
    }
    lr->has_stages = 0;
    if (env->stages) {
        if (msa_bench_stages(env->ctx, s->plan[0], layer, s->io, s->sets, env->reps,
                             lr->stage_us) != MSA_OK) {
            free(times);
            return fail_lib(s, res, "stage timing");
        }
        lr->has_stages = 1;
    }
    cli_sort_doubles(times, (size_t)env->reps);
    int n = env->reps;
    lr->median_us = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    lr->p10_us = times[(int)floor(0.1 * (n - 1))];
    lr->p90_us = times[(int)ceil(0.9 * (n - 1))];
    lr->min_us = times[0];
    lr->max_us = times[n - 1];
    free(times);
    snprintf(lr->kernel, sizeof lr->kernel, "%s", msa_plan_kernel_name(s->plan[0], layer));
    snprintf(lr->fallback, sizeof lr->fallback, "%s", msa_plan_fallback_reason(s->plan[0], layer));
    return 0;
}

/* ---- the case ----------------------------------------------------------- */

static int plan_pages(run_state *s, bench_result *res)
{
    const bench_case *c = s->c;
    const int64_t P = s->env->page_size;
    s->max_pages = 1;
    s->num_pages = 0;
    s->tokens = 0;
    for (int32_t r = 0; r < c->num_requests; r++) {
        int64_t n = (c->kv_len[r] + P - 1) / P;
        if (n > s->max_pages)
            s->max_pages = (int32_t)n;
        s->num_pages += n;
        s->tokens += c->q_len[r];
    }
    if (s->num_pages < 1)
        s->num_pages = 1;
    msa_cache_config_default(&s->cache_cfg);
    s->cache_cfg.num_pages = s->num_pages;
    s->cache_cfg.page_size = s->env->page_size;
    s->cache_cfg.kv_dtype = s->env->kv_dtype;
    s->cache_cfg.index_dtype = s->env->index_dtype;
    s->page_table = malloc(sizeof(int32_t) * (size_t)c->num_requests * (size_t)s->max_pages);
    if (!s->page_table) {
        snprintf(res->message, sizeof res->message, "out of memory");
        return -1;
    }
    /* Requests take consecutive runs of pages, as a fresh pool hands them out. */
    int64_t next = 0;
    for (int32_t r = 0; r < c->num_requests; r++) {
        int64_t n = (c->kv_len[r] + P - 1) / P;
        for (int64_t i = 0; i < s->max_pages; i++)
            s->page_table[(int64_t)r * s->max_pages + i] = i < n ? (int32_t)(next + i) : -1;
        next += n;
    }
    return 0;
}

static void release(run_state *s)
{
    dev_pool_release(&s->pool);
    for (int c = 0; c < MAX_COPIES; c++) {
        msa_plan_free(s->plan[c]);
        msa_cache_free(s->cache[c]);
    }
    free(s->page_table);
}

int bench_run_case(const bench_env *env, const bench_case *c, const int32_t *layers, int num_layers,
                   bench_result *res)
{
    run_state s;
    memset(&s, 0, sizeof s);
    memset(res, 0, sizeof *res);
    s.env = env;
    s.c = c;
    dev_pool_init(&s.pool, env->ctx);
    msa_model_get_config(env->model, &s.cfg);
    s.num_layers = s.cfg.num_layers;
    s.width = msa_model_topk_width(env->model);
    int rc = plan_pages(&s, res);
    if (rc != 0)
        goto done;

    /* Copies: enough to exceed the target working set, as memory allows. */
    double per_copy = cache_bytes_per_copy(&s);
    /* Sized for the lightest layer: the heavier ones then exceed the target too. */
    double est = INFINITY;
    for (int i = 0; i < num_layers; i++)
        est = fmin(est, bytes_estimate(&s, layers[i]));
    int copies = (int)ceil((double)env->target_ws / fmax(est, 1.0));
    int max_copies = env->max_copies < MAX_COPIES ? env->max_copies : MAX_COPIES;
    copies = copies < 1 ? 1 : copies > max_copies ? max_copies : copies;
    while (copies > 1 && per_copy * copies > (double)env->mem_budget)
        copies--;
    res->cache_bytes = per_copy;
    if (per_copy > (double)env->mem_budget) {
        res->skipped = 1;
        snprintf(res->message, sizeof res->message,
                 "cache needs %.1f GB, over the %.1f GB budget (--max-context scales cases down)",
                 per_copy * 1e-9, (double)env->mem_budget * 1e-9);
        goto done;
    }
    s.copies = copies;
    s.sets = env->min_sets < 2 ? 2 : env->min_sets > MAX_SETS ? MAX_SETS : env->min_sets;

    if (env->verbose && per_copy * copies > 1e9)
        fprintf(stderr, "  filling %d cache cop%s of %.1f GB ...\n", copies,
                copies == 1 ? "y" : "ies", per_copy * 1e-9);
    if ((rc = make_copies(&s, res)) != 0)
        goto done;
    if ((rc = fill_caches(&s, res)) != 0 || (rc = make_io_sets(&s, res)) != 0)
        goto done;
    res->copies = s.copies;
    res->io_sets = s.sets;
    res->num_layers = num_layers;
    for (int i = 0; i < num_layers && rc == 0; i++) {
        bench_layer_result *lr = &res->layers[i];
        lr->layer = layers[i];
        lr->sparse = msa_model_layer_is_sparse(env->model, layers[i]);
        rc = measure_work(&s, layers[i], lr, res);
        if (rc == 0)
            rc = time_layer(&s, layers[i], lr, res);
        lr->working_set = lr->bytes * s.copies + (double)s.io_bytes * s.sets;
    }
done:
    release(&s);
    return rc;
}
