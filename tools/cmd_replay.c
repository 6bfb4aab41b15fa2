/*
 * `msa replay DIR`: one layer step from files, exactly as docs/REPLAY.md
 * states.  The order of work keeps the contract's promises:
 *
 *   1. remove the outputs of an earlier run (status first), so the
 *      directory never shows a stale "ok" beside new inputs;
 *   2. validate meta.json and every array before touching the library;
 *   3. run the step on the chosen backend, all tensors in backend memory;
 *   4. write each output to a temporary name, then rename them all, then
 *      write out_status.json last: a reader who sees "ok" sees whole files.
 *
 * Any failure writes out_status.json with the status name and message,
 * removes temporaries, and exits with CLI_EXIT_USAGE (2).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "devbuf.h"
#include "elem.h"
#include "npy.h"
#include "plane.h"
#include "replay_meta.h"
#include "table.h"

enum { OUT_O, OUT_LSE, OUT_TOPK, OUT_IDX_O, NUM_OUT };
static const char *const out_names[NUM_OUT] = {"out_o.npy", "out_lse.npy", "out_topk.npy",
                                               "out_idx_o.npy"};

typedef struct replay_run {
    const char *dir;
    msa_backend backend;
    replay_meta meta;
    /* inputs */
    npy_array plane_in[4]; /* k_cache, v_cache, idx_k_cache, idx_v_cache */
    npy_array q, k, v, idx_q, idx_k, idx_v;
    /* library objects */
    msa_context *ctx;
    msa_model *model;
    msa_cache *cache;
    msa_plan *plan;
    dev_pool pool;
    /* host outputs, float32 / int32 */
    float *o, *lse, *idx_o;
    int32_t *topk;
    int32_t width;
    /* result */
    msa_status status;
    char msg[1024];
} replay_run;

static msa_status set_fail(replay_run *r, msa_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static msa_status set_fail(replay_run *r, msa_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    r->status = st;
    return st;
}

/* A failed library call: its status and the context's message. */
static msa_status lib_fail(replay_run *r, msa_status st, const char *what)
{
    const char *detail = r->ctx ? msa_context_last_error(r->ctx) : "";
    return set_fail(r, st, "%s: %s", what, detail[0] ? detail : msa_status_name(st));
}

static int join(char *buf, size_t size, const char *dir, const char *name)
{
    int n = snprintf(buf, size, "%s/%s", dir, name);
    return n > 0 && (size_t)n < size ? 0 : -1;
}

/* ---- step 1: stale outputs --------------------------------------------- */

static void remove_outputs(const char *dir)
{
    char path[4096];
    if (join(path, sizeof path, dir, "out_status.json") == 0)
        unlink(path);
    for (int i = 0; i < NUM_OUT; i++) {
        if (join(path, sizeof path, dir, out_names[i]) == 0)
            unlink(path);
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        unlink(tmp);
    }
}

/* ---- step 2: arrays ----------------------------------------------------- */

static msa_status load_array(replay_run *r, const char *name, int ndim, const int64_t *shape,
                             npy_array *out)
{
    char path[4096], err[600];
    if (join(path, sizeof path, r->dir, name) != 0)
        return set_fail(r, MSA_ERR_INVALID_ARGUMENT, "directory path too long");
    if (npy_read(path, out, err, sizeof err) != 0)
        return set_fail(r, MSA_ERR_IO, "%s", err);
    if (out->type != NPY_F32)
        return set_fail(r, MSA_ERR_INVALID_ARGUMENT, "%s holds int32; float32 ('<f4') needed",
                        name);
    int same = out->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = out->shape[i] == shape[i];
    if (!same) {
        char got[128], want[128];
        npy_shape_str(out->ndim, out->shape, got, sizeof got);
        npy_shape_str(ndim, shape, want, sizeof want);
        return set_fail(r, MSA_ERR_INVALID_ARGUMENT, "%s has shape %s; meta.json implies %s", name,
                        got, want);
    }
    return MSA_OK;
}

static msa_status load_inputs(replay_run *r)
{
    const replay_meta *m = &r->meta;
    const int64_t T = m->tokens, NP = m->num_pages, P = m->page_size;
    const int64_t kv_cache[4] = {NP, m->Hkv, P, m->D};
    const int64_t idx_cache[3] = {NP, P, m->Di};
    const int64_t q_shape[3] = {T, m->Hq, m->D};
    const int64_t kv_shape[3] = {T, m->Hkv, m->D};
    const int64_t iq_shape[3] = {T, m->Hi, m->Di};
    const int64_t ik_shape[2] = {T, m->Di};
    msa_status st;
    if ((st = load_array(r, "k_cache.npy", 4, kv_cache, &r->plane_in[MSA_PLANE_K])) ||
        (st = load_array(r, "v_cache.npy", 4, kv_cache, &r->plane_in[MSA_PLANE_V])) ||
        (st = load_array(r, "q.npy", 3, q_shape, &r->q)))
        return st;
    if (m->write_cache && ((st = load_array(r, "k.npy", 3, kv_shape, &r->k)) ||
                           (st = load_array(r, "v.npy", 3, kv_shape, &r->v))))
        return st;
    if (!m->sparse)
        return MSA_OK;
    if ((st = load_array(r, "idx_k_cache.npy", 3, idx_cache, &r->plane_in[MSA_PLANE_INDEX_K])) ||
        (st = load_array(r, "idx_q.npy", 3, iq_shape, &r->idx_q)))
        return st;
    if (m->index_value &&
        (st = load_array(r, "idx_v_cache.npy", 3, idx_cache, &r->plane_in[MSA_PLANE_INDEX_V])))
        return st;
    if (m->write_cache && (st = load_array(r, "idx_k.npy", 2, ik_shape, &r->idx_k)))
        return st;
    if (m->write_cache && m->index_value &&
        (st = load_array(r, "idx_v.npy", 2, ik_shape, &r->idx_v)))
        return st;
    return MSA_OK;
}

/* ---- step 3: the library ------------------------------------------------ */

/* Backend memory holding `bytes` copied from host. */
static msa_status upload(replay_run *r, const void *host, size_t bytes, void **out)
{
    if (!(*out = dev_pool_alloc(&r->pool, host, bytes)))
        return lib_fail(r, r->pool.status, "backend memory");
    return MSA_OK;
}

/* Rounds float32 values to the activation dtype and uploads them. */
static msa_status upload_act(replay_run *r, const float *x, int64_t n, const void **out)
{
    void *dev = dev_pool_act(&r->pool, r->meta.act_dtype, x, n);
    if (!dev)
        return lib_fail(r, r->pool.status, "backend memory");
    *out = dev;
    return MSA_OK;
}

/* Poison so an element the library failed to write shows up as NaN (or id
 * -2) in the output files instead of as a plausible value. */
static msa_status upload_poison_act(replay_run *r, int64_t n, void **out)
{
    float *nan_f = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!nan_f)
        return set_fail(r, MSA_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t i = 0; i < n; i++)
        nan_f[i] = NAN;
    const void *dev = NULL;
    msa_status st = upload_act(r, nan_f, n, &dev);
    free(nan_f);
    *out = (void *)dev;
    return st;
}

static msa_status create_objects(replay_run *r)
{
    const replay_meta *m = &r->meta;
    msa_context_params params;
    msa_context_params_default(&params);
    params.backend = r->backend;
    params.debug = cli_debug_options();
    char err[512] = "";
    msa_status st = msa_context_create(&params, &r->ctx, err, sizeof err);
    if (st != MSA_OK)
        return set_fail(r, st, "cannot create a %s context: %s", msa_backend_name(r->backend),
                        err[0] ? err : msa_status_name(st));
    dev_pool_init(&r->pool, r->ctx);

    uint8_t sparse = (uint8_t)m->sparse, index_value = (uint8_t)(m->sparse && m->index_value);
    msa_model_config cfg;
    msa_model_config_default(&cfg);
    cfg.num_layers = 1;
    cfg.num_q_heads = m->Hq;
    cfg.num_kv_heads = m->Hkv;
    cfg.head_dim = m->D;
    cfg.num_index_heads = m->Hi;
    cfg.index_dim = m->Di;
    cfg.block_size = m->block;
    cfg.topk_blocks = m->topk;
    cfg.init_blocks = m->init_blocks;
    cfg.local_blocks = m->local_blocks;
    cfg.score_type = m->score;
    cfg.layer_sparse = &sparse;
    cfg.layer_index_value = &index_value;
    cfg.softmax_scale = m->scale;
    cfg.index_softmax_scale = m->index_scale;
    if ((st = msa_model_create(r->ctx, &cfg, &r->model)) != MSA_OK)
        return lib_fail(r, st, "model");

    msa_cache_config cc;
    msa_cache_config_default(&cc);
    cc.num_pages = m->num_pages;
    cc.page_size = m->page_size;
    cc.kv_dtype = m->kv_dtype;
    cc.index_dtype = m->index_dtype;
    if ((st = msa_cache_create(r->ctx, r->model, &cc, &r->cache)) != MSA_OK)
        return lib_fail(r, st, "cache");
    if ((st = msa_cache_set_scales(r->cache, 0, m->k_scale, m->v_scale, m->index_k_scale,
                                   m->index_v_scale)) != MSA_OK)
        return lib_fail(r, st, "cache scales");
    r->width = m->sparse ? msa_model_topk_width(r->model) : 0;
    return MSA_OK;
}

static const char *const plane_names[4] = {"K", "V", "index K", "index V"};

/* The *_cache.npy values go straight to the plane's format (REPLAY.md). */
static msa_status fill_planes(replay_run *r)
{
    const replay_meta *m = &r->meta;
    const float scales[4] = {m->k_scale, m->v_scale, m->index_k_scale, m->index_v_scale};
    msa_cache_config cc;
    msa_cache_get_config(r->cache, &cc);
    for (int p = 0; p < 4; p++) {
        const npy_array *a = &r->plane_in[p];
        if (!a->data)
            continue; /* plane not read: the layer does not have it */
        plane_geom g;
        plane_geometry(r->model, 0, &cc, (msa_plane)p, &g);
        size_t want = g.bytes;
        size_t have = msa_cache_plane_bytes(r->cache, 0, (msa_plane)p);
        void *dst = msa_cache_plane_data(r->cache, 0, (msa_plane)p);
        if (want == 0 || want != have || !dst)
            return set_fail(r, MSA_ERR_UNSUPPORTED,
                            "the library's %s plane (%zu bytes) differs from the %s layout this "
                            "program writes (%zu bytes)",
                            plane_names[p], have, msa_dtype_name(g.dtype), want);
        void *host = malloc(want);
        if (!host)
            return set_fail(r, MSA_ERR_OUT_OF_MEMORY, "out of memory for a %zu-byte plane", want);
        elem_encode_plane(host, g.dtype, a->data, g.units, g.unit_elems, scales[p]);
        msa_status st = msa_copy_to_buffer(r->ctx, dst, host, want);
        free(host);
        if (st != MSA_OK)
            return lib_fail(r, st, "writing the cache");
    }
    return MSA_OK;
}

static msa_status plan_step(replay_run *r)
{
    const replay_meta *m = &r->meta;
    int32_t n = m->num_requests > 0 ? m->num_requests : 1;
    int32_t *q_len = calloc((size_t)n, sizeof *q_len);
    int32_t *kv_len = calloc((size_t)n, sizeof *kv_len);
    int32_t *pages = malloc((size_t)n * (size_t)m->max_pages * sizeof *pages);
    msa_status st = MSA_ERR_OUT_OF_MEMORY;
    if (!q_len || !kv_len || !pages) {
        set_fail(r, st, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < (int64_t)n * m->max_pages; i++)
        pages[i] = -1;
    for (int32_t i = 0; i < m->num_requests; i++) {
        q_len[i] = m->requests[i].q_len;
        kv_len[i] = m->requests[i].kv_len;
        memcpy(pages + (int64_t)i * m->max_pages, m->requests[i].pages,
               (size_t)m->requests[i].num_pages * sizeof *pages);
    }
    msa_plan_params limits;
    msa_plan_params_default(&limits);
    limits.act_dtype = m->act_dtype;
    if ((st = msa_plan_create(r->ctx, r->model, r->cache, &limits, &r->plan)) != MSA_OK) {
        lib_fail(r, st, "plan");
        goto done;
    }
    msa_step step = {m->num_requests, m->tokens, q_len, kv_len, pages, m->max_pages};
    if ((st = msa_plan_update(r->plan, &step, NULL)) != MSA_OK)
        lib_fail(r, st, "step");
done:
    free(q_len);
    free(kv_len);
    free(pages);
    return st;
}

static msa_status run_layer(replay_run *r)
{
    const replay_meta *m = &r->meta;
    const int64_t T = m->tokens;
    msa_layer_io io;
    msa_layer_io_default(&io);
    io.act_dtype = m->act_dtype;
    io.write_cache = m->write_cache;
    msa_status st;
    void *o = NULL, *idx_o = NULL, *lse = NULL, *topk = NULL;
    /* Inputs not read for this layer stay NULL (their arrays were not loaded). */
    const struct {
        const npy_array *a;
        const void **dst;
    } inputs[] = {{&r->q, &io.q},         {&r->k, &io.k},         {&r->v, &io.v},
                  {&r->idx_q, &io.idx_q}, {&r->idx_k, &io.idx_k}, {&r->idx_v, &io.idx_v}};
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) {
        int loaded = inputs[i].a->ndim > 0;
        if (loaded && (st = upload_act(r, inputs[i].a->data, inputs[i].a->count, inputs[i].dst)))
            return st;
    }
    size_t lse_n = (size_t)(T * m->Hq), topk_n = (size_t)(T * m->Hkv * r->width);
    float *lse_host = malloc((lse_n ? lse_n : 1) * sizeof(float));
    int32_t *topk_host = malloc((topk_n ? topk_n : 1) * sizeof(int32_t));
    if (!lse_host || !topk_host) {
        free(lse_host);
        free(topk_host);
        return set_fail(r, MSA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (size_t i = 0; i < lse_n; i++)
        lse_host[i] = NAN;
    for (size_t i = 0; i < topk_n; i++)
        topk_host[i] = -2;
    st = upload_poison_act(r, T * m->Hq * m->D, &o);
    if (!st)
        st = upload(r, lse_host, lse_n * sizeof(float), &lse);
    if (!st && m->sparse)
        st = upload(r, topk_host, topk_n * sizeof(int32_t), &topk);
    if (!st && m->sparse && m->index_value)
        st = upload_poison_act(r, T * m->Hi * m->Di, &idx_o);
    free(lse_host);
    free(topk_host);
    if (st)
        return st;
    io.o = o;
    io.idx_o = idx_o;
    io.lse = lse;
    io.topk = topk;

    if ((st = msa_forward(r->ctx, r->plan, 0, &io)) != MSA_OK)
        return lib_fail(r, st, "forward");
    if ((st = msa_synchronize(r->ctx)) != MSA_OK)
        return lib_fail(r, st, "synchronize");

    /* Back to the host, as float32 / int32. */
    size_t o_n = (size_t)(T * m->Hq * m->D), io_n = (size_t)(T * m->Hi * m->Di);
    size_t act = msa_dtype_size(m->act_dtype);
    void *stage = malloc((o_n > io_n ? o_n : io_n) * act + 1);
    r->o = malloc(o_n * sizeof(float) + 1);
    r->lse = malloc(lse_n * sizeof(float) + 1);
    r->topk = malloc(topk_n * sizeof(int32_t) + 1);
    r->idx_o = malloc(io_n * sizeof(float) + 1);
    if (!stage || !r->o || !r->lse || !r->topk || !r->idx_o) {
        free(stage);
        return set_fail(r, MSA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    if ((st = msa_copy_from_buffer(r->ctx, stage, o, o_n * act)) == MSA_OK) {
        elem_to_f32(r->o, m->act_dtype, stage, (int64_t)o_n);
        st = msa_copy_from_buffer(r->ctx, r->lse, lse, lse_n * sizeof(float));
    }
    if (st == MSA_OK && m->sparse)
        st = msa_copy_from_buffer(r->ctx, r->topk, topk, topk_n * sizeof(int32_t));
    if (st == MSA_OK && idx_o) {
        if ((st = msa_copy_from_buffer(r->ctx, stage, idx_o, io_n * act)) == MSA_OK)
            elem_to_f32(r->idx_o, m->act_dtype, stage, (int64_t)io_n);
    }
    free(stage);
    return st == MSA_OK ? MSA_OK : lib_fail(r, st, "reading the outputs");
}

/* ---- step 4: outputs ---------------------------------------------------- */

static msa_status write_outputs(replay_run *r)
{
    const replay_meta *m = &r->meta;
    const int64_t T = m->tokens;
    const int64_t o_shape[3] = {T, m->Hq, m->D};
    const int64_t lse_shape[2] = {T, m->Hq};
    const int64_t topk_shape[3] = {T, m->Hkv, r->width};
    const int64_t io_shape[3] = {T, m->Hi, m->Di};
    struct {
        int wanted;
        npy_type type;
        int ndim;
        const int64_t *shape;
        const void *data;
    } outs[NUM_OUT] = {
        {1, NPY_F32, 3, o_shape, r->o},
        {1, NPY_F32, 2, lse_shape, r->lse},
        {m->sparse, NPY_I32, 3, topk_shape, r->topk},
        {m->sparse && m->index_value, NPY_F32, 3, io_shape, r->idx_o},
    };
    char path[4096], tmp[4200], err[600];
    int written = 0;
    for (; written < NUM_OUT; written++) {
        if (!outs[written].wanted)
            continue;
        if (join(path, sizeof path, r->dir, out_names[written]) != 0)
            break;
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        if (npy_write(tmp, outs[written].type, outs[written].ndim, outs[written].shape,
                      outs[written].data, err, sizeof err) != 0) {
            set_fail(r, MSA_ERR_IO, "%s", err);
            break;
        }
    }
    for (int i = 0; i < NUM_OUT; i++) {
        if (!outs[i].wanted || join(path, sizeof path, r->dir, out_names[i]) != 0)
            continue;
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        if (written < NUM_OUT) {
            unlink(tmp);
        } else if (rename(tmp, path) != 0) {
            set_fail(r, MSA_ERR_IO, "%s: cannot rename into place: %s", path, strerror(errno));
            written = -1;
        }
    }
    if (written != NUM_OUT) {
        remove_outputs(r->dir);
        if (r->status == MSA_OK)
            set_fail(r, MSA_ERR_IO, "cannot write the outputs");
        return r->status;
    }
    return MSA_OK;
}

static int write_status(const replay_run *r)
{
    char path[4096], err[600];
    if (join(path, sizeof path, r->dir, "out_status.json") != 0)
        return -1;
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return -1;
    cJSON_AddStringToObject(root, "status",
                            r->status == MSA_OK ? "ok" : msa_status_name(r->status));
    if (r->status != MSA_OK)
        cJSON_AddStringToObject(root, "message", r->msg);
    int rc = json_write_file(path, root, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "msa replay: %s\n", err);
    cJSON_Delete(root);
    return rc;
}

static void release(replay_run *r)
{
    for (int i = 0; i < 4; i++)
        npy_free(&r->plane_in[i]);
    npy_free(&r->q);
    npy_free(&r->k);
    npy_free(&r->v);
    npy_free(&r->idx_q);
    npy_free(&r->idx_k);
    npy_free(&r->idx_v);
    if (r->ctx)
        dev_pool_release(&r->pool);
    msa_plan_free(r->plan);
    msa_cache_free(r->cache);
    msa_model_free(r->model);
    msa_context_free(r->ctx);
    free(r->o);
    free(r->lse);
    free(r->topk);
    free(r->idx_o);
    replay_meta_free(&r->meta);
}

static void replay_usage(FILE *f)
{
    fprintf(f, "usage: msa replay DIR [--backend cpu|cuda]\n"
               "  reads DIR/meta.json and DIR/*.npy, runs one layer step, writes\n"
               "  DIR/out_*.npy and DIR/out_status.json (format: docs/REPLAY.md)\n");
}

int cmd_replay(int argc, char **argv)
{
    replay_run r;
    memset(&r, 0, sizeof r);
    r.backend = MSA_BACKEND_CPU;
    for (int i = 1; i < argc; i++) {
        const char *val;
        int rc;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            replay_usage(stdout);
            return CLI_EXIT_OK;
        } else if ((rc = cli_option(argc, argv, &i, "--backend", &val)) != 0) {
            if (rc < 0 || cli_backend(val, &r.backend) != 0)
                return CLI_EXIT_USAGE;
        } else if (argv[i][0] == '-' || r.dir) {
            fprintf(stderr, "msa replay: unexpected argument '%s'\n", argv[i]);
            replay_usage(stderr);
            return CLI_EXIT_USAGE;
        } else {
            r.dir = argv[i];
        }
    }
    if (!r.dir) {
        replay_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    char meta_path[4096];
    if (join(meta_path, sizeof meta_path, r.dir, "meta.json") != 0 || access(r.dir, W_OK) != 0) {
        fprintf(stderr, "msa replay: %s: not a writable directory\n", r.dir);
        return CLI_EXIT_USAGE;
    }

    remove_outputs(r.dir);
    msa_status st = replay_meta_load(meta_path, &r.meta, r.msg, sizeof r.msg);
    if (st == MSA_OK)
        st = load_inputs(&r);
    if (st == MSA_OK)
        st = create_objects(&r);
    if (st == MSA_OK)
        st = fill_planes(&r);
    if (st == MSA_OK)
        st = plan_step(&r);
    if (st == MSA_OK)
        st = run_layer(&r);
    if (st == MSA_OK)
        st = write_outputs(&r);

    r.status = st;
    if (st == MSA_OK) {
        printf("msa replay: ok: %s layer, %d requests, %lld token rows, %s backend, kernel %s\n",
               r.meta.sparse ? "sparse" : "dense", r.meta.num_requests, (long long)r.meta.tokens,
               msa_backend_name(r.backend), msa_plan_kernel_name(r.plan, 0));
    } else {
        fprintf(stderr, "msa replay: %s: %s\n", msa_status_name(st), r.msg);
    }
    int status_rc = write_status(&r);
    release(&r);
    if (st == MSA_OK && status_rc != 0) {
        remove_outputs(r.dir);
        return CLI_EXIT_USAGE;
    }
    return st == MSA_OK ? CLI_EXIT_OK : CLI_EXIT_USAGE;
}
