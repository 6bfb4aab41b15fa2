/*
 * msa_case_run / msa_case_run_sequence: steps through the public API on any
 * backend, checked against the oracle.  Outputs are poisoned before each
 * call so unwritten elements show up; the whole pool is read back so stray
 * writes show up; a sequence reuses one plan so stale plan state shows up.
 */
#include "testkit_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TK_POISON_TOPK 0x7f7f7f7f

/* Library objects and backend buffers of one run. */
typedef struct tk_run {
    msa_context *ctx;
    msa_model *model;
    msa_cache *cache;
    msa_plan *plan;
    void *buf[10];
    int nbuf;
    /* Engine layout (msa_case.engine_layout): the pool's buffers and where
     * each plane lies in them; what was uploaded last, host side. */
    int layout;
    void *pool[4];
    size_t pool_bytes[4];
    int plane_pool[4];
    size_t plane_off[4];
    int64_t plane_stride[4][3]; /* page, head, token in elements */
    uint8_t *uploaded[4];
} tk_run;

/* Host copies of the outputs after the call. */
typedef struct tk_outputs {
    void *o, *idx_o;
    float *lse;
    int32_t *topk;
    uint8_t *cache[4];
    long stray; /* engine layouts: bytes between the rows that changed */
} tk_outputs;

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void note(msa_case_result *res, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(res->message, sizeof res->message, fmt, ap);
    va_end(ap);
}

/* Records a failed library call; UNSUPPORTED makes the case a skip. */
static int call_failed(tk_run *run, msa_case_result *res, const char *what, msa_status st)
{
    if (st == MSA_OK)
        return 0;
    if (st == MSA_ERR_UNSUPPORTED)
        res->skipped = 1;
    note(res, "%s: %s: %s", what, msa_status_name(st), msa_context_last_error(run->ctx));
    return 1;
}

static size_t act_size(msa_dtype dtype)
{
    return dtype == MSA_DTYPE_FP32 ? 4 : 2;
}

/* Backend buffer holding `bytes` of host data, starting `offset` bytes after
 * the allocation's start (the start is what is kept and freed at the end);
 * never a zero-size request, so every tensor pointer is valid even for an
 * empty step. */
static void *upload_at(tk_run *run, const void *host, size_t bytes, size_t offset, msa_status *st)
{
    void *p = NULL;
    size_t n = bytes + offset < 64 ? 64 : bytes + offset;
    if (*st != MSA_OK)
        return NULL;
    *st = msa_buffer_alloc(run->ctx, n, &p);
    if (*st != MSA_OK)
        return NULL;
    run->buf[run->nbuf++] = p;
    p = (char *)p + offset;
    if (bytes)
        *st = msa_copy_to_buffer(run->ctx, p, host, bytes);
    return p;
}

static void *upload(tk_run *run, const void *host, size_t bytes, msa_status *st)
{
    return upload_at(run, host, bytes, 0, st);
}

static void *act_tensor(tk_run *run, msa_dtype act, const float *x, size_t n, msa_status *st)
{
    void *h = calloc(n ? n : 1, act_size(act));
    for (size_t i = 0; i < n; i++)
        tk_store_act(h, act, i, x[i]);
    void *d = upload(run, h, n * act_size(act), st);
    free(h);
    return d;
}

static double tolerance_of(const msa_case *c)
{
    int fp32 = c->act_dtype == MSA_DTYPE_FP32 && c->kv_dtype == MSA_DTYPE_FP32 &&
               (!c->sparse || c->index_dtype == MSA_DTYPE_FP32);
    return fp32 ? 1e-5 : 1e-2;
}

const char *msa_case_layout_name(int layout)
{
    static const char *const names[MSA_CASE_LAYOUT_COUNT] = {"library", "vllm", "vllm-head-major",
                                                             "sglang", "llama.cpp"};
    return layout >= 0 && layout < MSA_CASE_LAYOUT_COUNT ? names[layout] : "?";
}

static size_t round256(size_t n)
{
    return (n + 255) & ~(size_t)255;
}

/* Where each plane of the case's engine layout lies: its buffer, its byte
 * offset in it and its strides (msa_case_layout in testkit.h); the bytes
 * of every buffer. */
static void plan_layout(tk_run *run, const msa_case *c, int64_t pages)
{
    const int64_t P = c->page_size, H = c->Hkv, D = c->D, Di = c->Di;
    const size_t ekv = act_size(c->kv_dtype), ei = act_size(c->index_dtype);
    memset(run->pool_bytes, 0, sizeof run->pool_bytes);
    for (int p = 0; p < 4; p++) {
        const int main_plane = p < 2;
        const size_t es = main_plane ? ekv : ei;
        const int64_t row = main_plane ? D : Di;
        int64_t *st = run->plane_stride[p];
        switch (run->layout) {
        case MSA_CASE_LAYOUT_VLLM: /* K and V interleaved per page, token-major */
        case MSA_CASE_LAYOUT_VLLM_HEAD_MAJOR: {
            const int head_major = run->layout == MSA_CASE_LAYOUT_VLLM_HEAD_MAJOR;
            const int64_t half = main_plane ? P * H * D : P * Di;
            st[0] = 2 * half;
            st[1] = main_plane ? (head_major ? P * D : D) : Di;
            st[2] = main_plane && !head_major ? H * D : row;
            run->plane_pool[p] = main_plane ? 0 : 1;
            run->plane_off[p] = (size_t)(p % 2) * (size_t)half * es;
            run->pool_bytes[run->plane_pool[p]] = (size_t)(pages * 2 * half) * es;
            break;
        }
        default: { /* SGLang and llama.cpp: token (cell) pools, [cells][heads][dim] */
            const int64_t heads = main_plane ? H : 1;
            st[0] = P * heads * row;
            st[1] = row;
            st[2] = heads * row;
            const size_t bytes = (size_t)(pages * P * heads * row) * es;
            if (run->layout == MSA_CASE_LAYOUT_SGLANG) { /* a buffer per pool */
                run->plane_pool[p] = p;
                run->plane_off[p] = 0;
                run->pool_bytes[p] = bytes;
            } else { /* K before V in one buffer, index K before index V in another */
                run->plane_pool[p] = main_plane ? 0 : 1;
                run->plane_off[p] = (p % 2) ? round256(bytes) : 0;
                run->pool_bytes[run->plane_pool[p]] = round256(bytes) + bytes;
            }
        }
        }
    }
}

static size_t lib_row_offset(const tk_plane *pl, int64_t page, int head, int slot)
{
    const size_t es = act_size(pl->dtype);
    return (((size_t)page * (size_t)pl->heads + (size_t)head) * (size_t)pl->page_size +
            (size_t)slot) *
           (size_t)pl->dim * es;
}

static size_t engine_row_offset(const tk_run *run, int p, int64_t page, int head, int slot,
                                size_t es)
{
    const int64_t *st = run->plane_stride[p];
    return run->plane_off[p] +
           (size_t)(page * st[0] + (int64_t)head * st[1] + (int64_t)slot * st[2]) * es;
}

/* Copies every row of plane p between a library-layout image and the
 * plane's buffer image: to_engine 1 scatters lib into eng, 0 gathers. */
static void copy_plane_rows(const tk_run *run, int p, const tk_plane *pl, uint8_t *lib,
                            uint8_t *eng, int to_engine)
{
    const size_t es = act_size(pl->dtype), row = (size_t)pl->dim * es;
    for (int64_t pg = 0; pg < pl->pages; pg++)
        for (int h = 0; h < pl->heads; h++)
            for (int t = 0; t < pl->page_size; t++) {
                uint8_t *a = lib + lib_row_offset(pl, pg, h, t);
                uint8_t *b = eng + engine_row_offset(run, p, pg, h, t, es);
                if (to_engine)
                    memcpy(b, a, row);
                else
                    memcpy(a, b, row);
            }
}

/* The pool in the case's engine layout: buffers, then the wrapped cache. */
static msa_status create_engine_cache(tk_run *run, const msa_case *c, const msa_cache_config *cc,
                                      msa_case_result *res)
{
    if (c->kv_dtype == MSA_DTYPE_FP8_E4M3 || c->kv_dtype == MSA_DTYPE_NVFP4 ||
        (c->sparse &&
         (c->index_dtype == MSA_DTYPE_FP8_E4M3 || c->index_dtype == MSA_DTYPE_NVFP4))) {
        note(res, "engine layouts hold activation formats only");
        return MSA_ERR_INVALID_CONFIG;
    }
    run->layout = c->engine_layout;
    plan_layout(run, c, cc->num_pages);
    msa_status st = MSA_OK;
    for (int b = 0; b < 4 && st == MSA_OK; b++)
        if (run->pool_bytes[b])
            st = msa_buffer_alloc(run->ctx, run->pool_bytes[b], &run->pool[b]);
    if (call_failed(run, res, "msa_buffer_alloc", st))
        return st;
    msa_plane_view views[4];
    memset(views, 0, sizeof views);
    const int has[4] = {1, 1, c->sparse, c->sparse && c->index_value};
    for (int p = 0; p < 4; p++) {
        if (!has[p])
            continue;
        views[p].data = (char *)run->pool[run->plane_pool[p]] + run->plane_off[p];
        views[p].page_stride = run->plane_stride[p][0];
        views[p].head_stride = run->plane_stride[p][1];
        views[p].token_stride = run->plane_stride[p][2];
    }
    st = msa_cache_wrap_strided(run->ctx, run->model, cc, views, &run->cache);
    call_failed(run, res, "msa_cache_wrap_strided", st);
    return st;
}

static msa_status create_model_cache(tk_run *run, const msa_case *c, int64_t num_pages,
                                     msa_case_result *res)
{
    msa_model_config mc;
    msa_model_config_default(&mc);
    uint8_t sparse = (uint8_t)c->sparse, iv = (uint8_t)(c->sparse && c->index_value);
    mc.num_layers = 1;
    mc.num_q_heads = c->Hq;
    mc.num_kv_heads = c->Hkv;
    mc.head_dim = c->D;
    mc.num_index_heads = c->Hi;
    mc.index_dim = c->Di;
    mc.block_size = c->block;
    mc.topk_blocks = c->topk;
    mc.init_blocks = c->init_blocks;
    mc.local_blocks = c->local_blocks;
    mc.score_type = c->score_lse ? MSA_SCORE_LSE : MSA_SCORE_MAX;
    mc.layer_sparse = &sparse;
    mc.layer_index_value = &iv;
    mc.softmax_scale = c->scale;
    mc.index_softmax_scale = c->index_scale;
    msa_status st = msa_model_create(run->ctx, &mc, &run->model);
    if (call_failed(run, res, "msa_model_create", st))
        return st;

    msa_cache_config cc;
    msa_cache_config_default(&cc);
    cc.num_pages = num_pages;
    cc.page_size = c->page_size;
    cc.kv_dtype = c->kv_dtype;
    cc.index_dtype = c->index_dtype;
    if (c->engine_layout != MSA_CASE_LAYOUT_LIBRARY) {
        if ((st = create_engine_cache(run, c, &cc, res)) != MSA_OK)
            return st;
    } else {
        st = msa_cache_create(run->ctx, run->model, &cc, &run->cache);
        if (call_failed(run, res, "msa_cache_create", st))
            return st;
    }
    if (c->k_scale > 0 || c->v_scale > 0 || c->index_k_scale > 0 || c->index_v_scale > 0) {
        st = msa_cache_set_scales(run->cache, 0, c->k_scale > 0 ? c->k_scale : 1.0f,
                                  c->v_scale > 0 ? c->v_scale : 1.0f,
                                  c->index_k_scale > 0 ? c->index_k_scale : 1.0f,
                                  c->index_v_scale > 0 ? c->index_v_scale : 1.0f);
        if (call_failed(run, res, "msa_cache_set_scales", st))
            return st;
    }
    return MSA_OK;
}

/* Limits: "grow", or the exact maxima over every step of the sequence. */
static msa_status create_plan(tk_run *run, const msa_case *cases, int n, msa_case_result *res)
{
    msa_plan_params lim;
    msa_plan_params_default(&lim);
    lim.act_dtype = cases[0].act_dtype;
    if (cases[0].fixed_limits) {
        for (int i = 0; i < n; i++) {
            const msa_case *c = &cases[i];
            int64_t rows = c->padding_rows;
            if (c->num_requests > lim.max_requests)
                lim.max_requests = c->num_requests;
            for (int r = 0; r < c->num_requests; r++) {
                rows += c->q_len[r];
                if (c->q_len[r] > lim.max_q_len)
                    lim.max_q_len = c->q_len[r];
                if (c->kv_len[r] > lim.max_kv_len)
                    lim.max_kv_len = c->kv_len[r];
            }
            if (rows > lim.max_tokens)
                lim.max_tokens = rows;
        }
    }
    msa_status st = msa_plan_create(run->ctx, run->model, run->cache, &lim, &run->plan);
    call_failed(run, res, "msa_plan_create", st);
    return st;
}

static msa_status update_plan(tk_run *run, const tk_step *s, msa_case_result *res);

/* The engine pool gets the step's "before" rows through the layout; the
 * elements between rows get a pattern, so a stray write shows up. */
static msa_status load_engine_step(tk_run *run, const tk_step *s, msa_case_result *res)
{
    msa_status st = MSA_OK;
    for (int b = 0; b < 4; b++) {
        free(run->uploaded[b]);
        run->uploaded[b] = NULL;
        if (!run->pool_bytes[b])
            continue;
        run->uploaded[b] = malloc(run->pool_bytes[b]);
        memset(run->uploaded[b], 0xa5, run->pool_bytes[b]);
    }
    for (int p = 0; p < 4; p++)
        if (s->has_plane[p])
            copy_plane_rows(run, p, &s->plane[p], s->before[p], run->uploaded[run->plane_pool[p]],
                            1);
    for (int b = 0; b < 4 && st == MSA_OK; b++)
        if (run->pool_bytes[b])
            st = msa_copy_to_buffer(run->ctx, run->pool[b], run->uploaded[b], run->pool_bytes[b]);
    if (call_failed(run, res, "msa_copy_to_buffer", st))
        return st;
    return update_plan(run, s, res);
}

/* The pool must have exactly the documented layout; it gets the step's
 * "before" image, then the plan gets the step. */
static msa_status load_step(tk_run *run, const tk_step *s, msa_case_result *res)
{
    msa_status st;
    if (run->layout != MSA_CASE_LAYOUT_LIBRARY)
        return load_engine_step(run, s, res);
    for (int p = 0; p < 4; p++) {
        size_t want = s->has_plane[p] ? tk_plane_bytes(&s->plane[p]) : 0;
        size_t got = msa_cache_plane_bytes(run->cache, 0, (msa_plane)p);
        if (got != want) {
            note(res, "plane %d holds %zu bytes, layout says %zu", p, got, want);
            return MSA_ERR_INVALID_CONFIG;
        }
        if (!want)
            continue;
        st = msa_copy_to_buffer(run->ctx, msa_cache_plane_data(run->cache, 0, (msa_plane)p),
                                s->before[p], want);
        if (call_failed(run, res, "msa_copy_to_buffer", st))
            return st;
    }
    return update_plan(run, s, res);
}

static msa_status update_plan(tk_run *run, const tk_step *s, msa_case_result *res)
{
    msa_status st;
    msa_step step;
    memset(&step, 0, sizeof step);
    step.num_requests = s->R;
    step.num_tokens = s->rows;
    step.q_len = s->q_len;
    step.kv_len = s->kv_len;
    step.page_table = s->table;
    step.page_table_stride = s->stride;
    st = msa_plan_update(run->plan, &step, NULL);
    call_failed(run, res, "msa_plan_update", st);
    return st;
}

/* Reads the engine pool back: each plane's rows, gathered through the
 * layout into the library layout's image (out->cache), and out->stray, the
 * bytes between rows that differ from what was uploaded. */
static msa_status read_engine_pool(tk_run *run, const tk_step *s, tk_outputs *out)
{
    msa_status st = MSA_OK;
    uint8_t *got[4] = {NULL, NULL, NULL, NULL};
    for (int b = 0; b < 4 && st == MSA_OK; b++)
        if (run->pool_bytes[b]) {
            got[b] = malloc(run->pool_bytes[b]);
            st = msa_copy_from_buffer(run->ctx, got[b], run->pool[b], run->pool_bytes[b]);
        }
    for (int p = 0; p < 4 && st == MSA_OK; p++) {
        if (!s->has_plane[p])
            continue;
        out->cache[p] = malloc(tk_plane_bytes(&s->plane[p]));
        copy_plane_rows(run, p, &s->plane[p], out->cache[p], got[run->plane_pool[p]], 0);
        /* What the buffer should hold: the upload with these rows put back. */
        copy_plane_rows(run, p, &s->plane[p], out->cache[p], run->uploaded[run->plane_pool[p]], 1);
    }
    for (int b = 0; b < 4 && st == MSA_OK; b++)
        for (size_t i = 0; i < run->pool_bytes[b]; i++)
            out->stray += got[b][i] != run->uploaded[b][i];
    for (int b = 0; b < 4; b++)
        free(got[b]);
    return st;
}

/* Uploads inputs and poisoned outputs, runs the layer, reads everything back. */
static msa_status forward(tk_run *run, const msa_case *c, const tk_step *s, msa_case_result *res,
                          tk_outputs *out)
{
    const msa_oracle_layer *L = &s->layer;
    const msa_dtype act = c->act_dtype;
    const size_t T = (size_t)s->rows, W = (size_t)msa_oracle_topk_width(L);
    const size_t n_o = T * (size_t)L->Hq * (size_t)L->D, n_io = T * (size_t)L->Hi * (size_t)L->Di;
    const int want_opt = !c->omit_optional;
    msa_status st = MSA_OK;
    msa_layer_io io;
    msa_layer_io_default(&io);
    io.act_dtype = act;
    io.write_cache = c->write_cache;

    io.q = act_tensor(run, act, s->q, n_o, &st);
    if (c->write_cache) {
        io.k = act_tensor(run, act, s->k, T * (size_t)L->Hkv * (size_t)L->D, &st);
        io.v = act_tensor(run, act, s->v, T * (size_t)L->Hkv * (size_t)L->D, &st);
    }
    if (L->sparse) {
        io.idx_q = act_tensor(run, act, s->idx_q, n_io, &st);
        if (c->write_cache)
            io.idx_k = act_tensor(run, act, s->idx_k, T * (size_t)L->Di, &st);
        if (c->write_cache && L->index_value)
            io.idx_v = act_tensor(run, act, s->idx_v, T * (size_t)L->Di, &st);
    }

    out->o = calloc(n_o ? n_o : 1, act_size(act));
    tk_poison_act(out->o, act, n_o);
    io.o = upload_at(run, out->o, n_o * act_size(act), (size_t)c->out_offset, &st);
    if (L->index_value) {
        out->idx_o = calloc(n_io ? n_io : 1, act_size(act));
        tk_poison_act(out->idx_o, act, n_io);
        io.idx_o = upload(run, out->idx_o, n_io * act_size(act), &st);
    }
    if (want_opt) {
        out->lse = calloc(T * (size_t)L->Hq + 1, sizeof(float));
        tk_poison_act(out->lse, MSA_DTYPE_FP32, T * (size_t)L->Hq);
        io.lse = upload(run, out->lse, T * (size_t)L->Hq * sizeof(float), &st);
        if (L->sparse) {
            size_t n = T * (size_t)L->Hkv * W;
            out->topk = calloc(n + 1, sizeof(int32_t));
            for (size_t i = 0; i < n; i++)
                out->topk[i] = TK_POISON_TOPK;
            io.topk = upload(run, out->topk, n * sizeof(int32_t), &st);
        }
    }
    if (call_failed(run, res, "buffer upload", st))
        return st;

    st = msa_forward(run->ctx, run->plan, 0, &io);
    if (call_failed(run, res, "msa_forward", st))
        return st;
    st = msa_synchronize(run->ctx);
    if (call_failed(run, res, "msa_synchronize", st))
        return st;

    st = msa_copy_from_buffer(run->ctx, out->o, io.o, n_o * act_size(act));
    if (st == MSA_OK && out->idx_o)
        st = msa_copy_from_buffer(run->ctx, out->idx_o, io.idx_o, n_io * act_size(act));
    if (st == MSA_OK && out->lse)
        st = msa_copy_from_buffer(run->ctx, out->lse, io.lse, T * (size_t)L->Hq * sizeof(float));
    if (st == MSA_OK && out->topk)
        st = msa_copy_from_buffer(run->ctx, out->topk, io.topk,
                                  T * (size_t)L->Hkv * W * sizeof(int32_t));
    if (run->layout != MSA_CASE_LAYOUT_LIBRARY) {
        if (st == MSA_OK)
            st = read_engine_pool(run, s, out);
        call_failed(run, res, "msa_copy_from_buffer", st);
        return st;
    }
    for (int p = 0; p < 4 && st == MSA_OK; p++) {
        if (!s->has_plane[p])
            continue;
        size_t bytes = tk_plane_bytes(&s->plane[p]);
        out->cache[p] = malloc(bytes);
        st = msa_copy_from_buffer(run->ctx, out->cache[p],
                                  msa_cache_plane_data(run->cache, 0, (msa_plane)p), bytes);
    }
    call_failed(run, res, "msa_copy_from_buffer", st);
    return st;
}

/* Every row of the pool must match the expected image. */
static long check_cache(const tk_step *s, const tk_outputs *out)
{
    long bad = 0;
    for (int p = 0; p < 4; p++) {
        if (!s->has_plane[p])
            continue;
        const tk_plane *pl = &s->plane[p];
        for (int64_t pg = 0; pg < pl->pages; pg++)
            for (int h = 0; h < pl->heads; h++)
                for (int t = 0; t < pl->page_size; t++)
                    bad += !tk_plane_row_equal(pl, out->cache[p], s->after[p], pg, h, t);
    }
    return bad;
}

/* Running sums for ||out - ref|| / ||ref||. */
typedef struct tk_err {
    double diff2, ref2;
} tk_err;

static void err_add(tk_err *e, double got, double ref, long *unwritten)
{
    if (isnan(got)) {
        (*unwritten)++; /* poison left in place, or a NaN produced */
        return;
    }
    e->diff2 += (got - ref) * (got - ref);
    e->ref2 += ref * ref;
}

static double err_value(const tk_err *e)
{
    if (isnan(e->diff2) || isinf(e->diff2))
        return INFINITY;
    if (e->ref2 == 0.0)
        return e->diff2 == 0.0 ? 0.0 : INFINITY;
    return sqrt(e->diff2 / e->ref2);
}

/* Outputs of active rows against the oracle run on the cache as stored. */
static void check_outputs(const msa_case *c, const tk_step *s, const tk_outputs *out,
                          msa_case_result *res)
{
    const msa_oracle_layer *L = &s->layer;
    const int W = msa_oracle_topk_width(L);
    const size_t nq = (size_t)L->Hq * (size_t)L->D, ni = (size_t)L->Hi * (size_t)L->Di;
    tk_err eo = {0, 0}, el = {0, 0}, ei = {0, 0};
    double *o = calloc(nq, sizeof(double)), *lse = calloc((size_t)L->Hq, sizeof(double));
    double *idx_o = calloc(ni ? ni : 1, sizeof(double));
    int32_t *topk = calloc((size_t)L->Hkv * (size_t)W + 1, sizeof(int32_t));

    for (int r = 0; r < s->R; r++) {
        if (s->q_len[r] == 0)
            continue;
        tk_view view;
        tk_view_gather(s, out->cache, r, &view);
        msa_oracle_request req = tk_oracle_request(s, &view, r);
        for (int i = 0; i < s->q_len[r]; i++) {
            const size_t row = (size_t)(s->row0[r] + i);
            msa_oracle_token(L, &req, i, o, lse, topk, idx_o);
            for (size_t e = 0; e < nq; e++)
                err_add(&eo, tk_load_act(out->o, c->act_dtype, row * nq + e), o[e],
                        &res->unwritten);
            if (out->lse)
                for (int h = 0; h < L->Hq; h++)
                    err_add(&el, out->lse[row * (size_t)L->Hq + (size_t)h], lse[h],
                            &res->unwritten);
            if (out->idx_o)
                for (size_t e = 0; e < ni; e++)
                    err_add(&ei, tk_load_act(out->idx_o, c->act_dtype, row * ni + e), idx_o[e],
                            &res->unwritten);
            if (out->topk) {
                for (int g = 0; g < L->Hkv; g++) {
                    const int32_t *got = out->topk + (row * (size_t)L->Hkv + (size_t)g) * (size_t)W;
                    for (int w = 0; w < W; w++)
                        res->unwritten += got[w] == TK_POISON_TOPK;
                    res->topk_mismatches +=
                        memcmp(got, topk + (size_t)g * (size_t)W, sizeof(int32_t) * (size_t)W) != 0;
                }
            }
        }
        tk_view_free(&view);
    }
    res->o_err = err_value(&eo);
    res->lse_err = out->lse ? err_value(&el) : 0.0;
    res->idx_o_err = out->idx_o ? err_value(&ei) : 0.0;
    if (res->unwritten) /* a NaN or poison anywhere fails every norm */
        res->o_err = INFINITY;
    free(o);
    free(lse);
    free(idx_o);
    free(topk);
}

/* FNV-1a over bytes, continued from h. */
static uint64_t hash_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Hash of every output of every row as the backend wrote it (bit for bit),
 * continued from h: two runs of a case agree exactly when their hashes
 * do (up to collisions). */
static uint64_t hash_outputs(uint64_t h, const msa_case *c, const tk_step *s, const tk_outputs *out)
{
    const msa_oracle_layer *L = &s->layer;
    const size_t rows = (size_t)s->rows, es = msa_dtype_size(c->act_dtype);
    const size_t W = (size_t)msa_oracle_topk_width(L);
    h = hash_bytes(h, out->o, rows * (size_t)L->Hq * (size_t)L->D * es);
    if (out->idx_o)
        h = hash_bytes(h, out->idx_o, rows * (size_t)L->Hi * (size_t)L->Di * es);
    if (out->lse)
        h = hash_bytes(h, out->lse, rows * (size_t)L->Hq * sizeof(float));
    if (out->topk)
        h = hash_bytes(h, out->topk, rows * (size_t)L->Hkv * W * sizeof(int32_t));
    return h;
}

/* Padding rows: o = 0, idx_o = 0, lse = -inf, ids -1. */
static void check_padding(const msa_case *c, const tk_step *s, const tk_outputs *out,
                          msa_case_result *res)
{
    const msa_oracle_layer *L = &s->layer;
    const size_t nq = (size_t)L->Hq * (size_t)L->D, ni = (size_t)L->Hi * (size_t)L->Di;
    const size_t W = (size_t)msa_oracle_topk_width(L);
    for (size_t row = (size_t)s->active; row < (size_t)s->rows; row++) {
        for (size_t e = 0; e < nq; e++)
            res->padding_errors += tk_load_act(out->o, c->act_dtype, row * nq + e) != 0.0f;
        if (out->idx_o)
            for (size_t e = 0; e < ni; e++)
                res->padding_errors += tk_load_act(out->idx_o, c->act_dtype, row * ni + e) != 0.0f;
        if (out->lse)
            for (int h = 0; h < L->Hq; h++) {
                float x = out->lse[row * (size_t)L->Hq + (size_t)h];
                res->padding_errors += !(isinf(x) && x < 0);
            }
        if (out->topk)
            for (size_t w = 0; w < (size_t)L->Hkv * W; w++)
                res->padding_errors += out->topk[row * (size_t)L->Hkv * W + w] != -1;
    }
}

static void judge(msa_case_result *res)
{
    const double tol = res->tolerance;
    res->passed = res->o_err < tol && res->lse_err < tol && res->idx_o_err < tol &&
                  res->topk_mismatches == 0 && res->unwritten == 0 && res->cache_errors == 0 &&
                  res->padding_errors == 0;
    if (!res->passed)
        note(res,
             "o %.2e lse %.2e idx_o %.2e (tol %.0e), topk rows %ld, unwritten %ld, "
             "cache rows %ld, padding %ld",
             res->o_err, res->lse_err, res->idx_o_err, tol, res->topk_mismatches, res->unwritten,
             res->cache_errors, res->padding_errors);
}

static void release_step(tk_run *run, tk_outputs *out)
{
    for (int i = 0; i < run->nbuf; i++)
        msa_buffer_free(run->ctx, run->buf[i]);
    run->nbuf = 0;
    free(out->o);
    free(out->idx_o);
    free(out->lse);
    free(out->topk);
    for (int p = 0; p < 4; p++)
        free(out->cache[p]);
    memset(out, 0, sizeof *out);
}

static void release(tk_run *run)
{
    msa_plan_free(run->plan);
    msa_cache_free(run->cache);
    msa_model_free(run->model);
    for (int b = 0; b < 4; b++) {
        if (run->pool[b])
            msa_buffer_free(run->ctx, run->pool[b]);
        free(run->uploaded[b]);
    }
}

/* Cases of one sequence must describe the same layer and cache. */
static int same_setup(const msa_case *a, const msa_case *b)
{
    return a->Hq == b->Hq && a->Hkv == b->Hkv && a->D == b->D && a->Hi == b->Hi && a->Di == b->Di &&
           a->block == b->block && a->topk == b->topk && a->init_blocks == b->init_blocks &&
           a->local_blocks == b->local_blocks && a->score_lse == b->score_lse &&
           a->sparse == b->sparse && a->index_value == b->index_value && a->scale == b->scale &&
           a->index_scale == b->index_scale && a->page_size == b->page_size &&
           a->act_dtype == b->act_dtype && a->kv_dtype == b->kv_dtype &&
           a->index_dtype == b->index_dtype && a->k_scale == b->k_scale &&
           a->v_scale == b->v_scale && a->index_k_scale == b->index_k_scale &&
           a->index_v_scale == b->index_v_scale && a->engine_layout == b->engine_layout;
}

/* Folds one step's result into the sequence's: worst error, summed counts. */
static void merge(msa_case_result *into, const msa_case_result *step)
{
    into->o_err = fmax(into->o_err, step->o_err);
    into->lse_err = fmax(into->lse_err, step->lse_err);
    into->idx_o_err = fmax(into->idx_o_err, step->idx_o_err);
    into->topk_mismatches += step->topk_mismatches;
    into->unwritten += step->unwritten;
    into->cache_errors += step->cache_errors;
    into->padding_errors += step->padding_errors;
}

int msa_case_run_sequence(msa_context *ctx, const msa_case *cases, int n, msa_case_result *res)
{
    const double t0 = now_seconds();
    tk_run run;
    memset(res, 0, sizeof *res);
    memset(&run, 0, sizeof run);
    run.ctx = ctx;
    if (n < 1) {
        note(res, "empty sequence");
        return 0;
    }
    int64_t pages = 0;
    for (int i = 0; i < n; i++) {
        if (!same_setup(&cases[0], &cases[i])) {
            note(res, "sequence step %d changes the layer or cache setup", i);
            return 0;
        }
        int64_t need = tk_step_pages(&cases[i]);
        pages = need > pages ? need : pages;
        res->tolerance = fmax(res->tolerance, tolerance_of(&cases[i]));
    }

    int ok = create_model_cache(&run, &cases[0], pages, res) == MSA_OK &&
             create_plan(&run, cases, n, res) == MSA_OK;
    for (int i = 0; ok && i < n; i++) {
        const msa_case *c = &cases[i];
        msa_case_result one;
        tk_step s;
        tk_outputs out;
        memset(&one, 0, sizeof one);
        memset(&out, 0, sizeof out);
        if (tk_step_build(c, pages, &s, res->message, sizeof res->message) ||
            tk_avoid_near_ties(&s, c->seed, res->message, sizeof res->message)) {
            ok = 0;
        } else if (load_step(&run, &s, res) != MSA_OK ||
                   forward(&run, c, &s, res, &out) != MSA_OK) {
            ok = 0;
        } else {
            one.cache_errors = check_cache(&s, &out) + (out.stray > 0);
            if (out.stray)
                note(res, "%ld bytes between the engine layout's rows changed", out.stray);
            uint64_t h = res->cache_hash ? res->cache_hash : 0xcbf29ce484222325ull;
            for (int p = 0; p < 4; p++)
                if (s.has_plane[p])
                    h = hash_bytes(h, out.cache[p], tk_plane_bytes(&s.plane[p]));
            res->cache_hash = h;
            snprintf(res->kernel, sizeof res->kernel, "%s (%s)", msa_plan_kernel_name(run.plan, 0),
                     msa_plan_fallback_reason(run.plan, 0));
            check_outputs(c, &s, &out, &one);
            check_padding(c, &s, &out, &one);
            merge(res, &one);
            res->out_hash =
                hash_outputs(res->out_hash ? res->out_hash : 0xcbf29ce484222325ull, c, &s, &out);
        }
        release_step(&run, &out);
        tk_step_free(&s);
    }
    if (ok)
        judge(res);
    if (res->passed && cases[0].expect_cuda && msa_context_backend(ctx) == MSA_BACKEND_CUDA &&
        !strstr(res->kernel, cases[0].expect_cuda)) {
        res->passed = 0;
        note(res, "ran %.180s; expected \"%.60s\"", res->kernel, cases[0].expect_cuda);
    }
    release(&run);
    res->seconds = now_seconds() - t0;
    return res->passed;
}

int msa_case_run_layout_pair(msa_context *ctx, const msa_case *cases, int n, msa_case_result *res)
{
    msa_case_result lib;
    memset(&lib, 0, sizeof lib);
    msa_case_run_sequence(ctx, cases, n, res);
    if (!res->passed || n < 1)
        return 0;
    msa_case *twin = malloc(sizeof *twin * (size_t)n);
    if (!twin) {
        res->passed = 0;
        note(res, "out of memory");
        return 0;
    }
    for (int i = 0; i < n; i++) {
        twin[i] = cases[i];
        twin[i].engine_layout = MSA_CASE_LAYOUT_LIBRARY;
    }
    msa_case_run_sequence(ctx, twin, n, &lib);
    free(twin);
    res->seconds += lib.seconds;
    const int same_kernels = strcmp(lib.kernel, res->kernel) == 0;
    if (!lib.passed) {
        res->passed = 0;
        note(res, "the library-layout run failed: %s", lib.message);
    } else if (!same_kernels) {
        /* Every kernel reads rows through the strides (the CUDA backend's
         * Hopper kernels through tensor maps encoded with them). */
        res->passed = 0;
        note(res, "kernels differ: %.110s vs library %.110s", res->kernel, lib.kernel);
    } else if (lib.cache_hash != res->cache_hash) {
        res->passed = 0;
        note(res, "cache rows differ from the library layout's");
    } else if (lib.out_hash != res->out_hash) {
        res->passed = 0;
        note(res, "outputs differ from the library layout's (both ran %.200s)", res->kernel);
    }
    return res->passed;
}

int msa_case_run(msa_context *ctx, const msa_case *c, msa_case_result *res)
{
    return msa_case_run_sequence(ctx, c, 1, res);
}
