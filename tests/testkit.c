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
} tk_run;

/* Host copies of the outputs after the call. */
typedef struct tk_outputs {
    void *o, *idx_o;
    float *lse;
    int32_t *topk;
    uint8_t *cache[4];
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
    st = msa_cache_create(run->ctx, run->model, &cc, &run->cache);
    if (call_failed(run, res, "msa_cache_create", st))
        return st;
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

/* The pool must have exactly the documented layout; it gets the step's
 * "before" image, then the plan gets the step. */
static msa_status load_step(tk_run *run, const tk_step *s, msa_case_result *res)
{
    msa_status st;
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
           a->index_v_scale == b->index_v_scale;
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
            one.cache_errors = check_cache(&s, &out);
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
    release(&run);
    res->seconds = now_seconds() - t0;
    return res->passed;
}

int msa_case_run(msa_context *ctx, const msa_case *c, msa_case_result *res)
{
    return msa_case_run_sequence(ctx, c, 1, res);
}
