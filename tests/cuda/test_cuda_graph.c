/*
 * CUDA graphs across plan updates (SPEC 9): the forward of a dense layer, a
 * sparse layer and a sparse layer with index value is captured into one
 * graph once; then, for several steps with new lengths, new page tables and
 * a changing token count (decode, verify, prefill and padding rows mixed),
 * the plan is updated in place and the graph replayed.  Every output and
 * the whole cache are compared with the CPU backend run on the same step.
 *
 * Index keys are built so that block scores have no near-ties (each block
 * of a request gets a distinct value per feature, queries weight one
 * feature heavily): the selections of both backends must be identical.
 * Unused cache slots hold NaN, so a kernel that reads a slot it should not
 * poisons its output.  Outputs are poisoned before every run.
 *
 * Without a GPU (or without the CUDA runtime at build time) it prints
 * "skipped" and exits 77.  `--sms N` sizes the CUDA grids for N SMs
 * (msa_debug_options.cuda_num_sms).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "msa/msa.h"
#include "testkit_internal.h"

#define EXIT_SKIPPED 77

#ifndef MSA_TEST_HAVE_CUDART

int main(void)
{
    printf("skipped: built without the CUDA runtime\n");
    printf("0 passed, 0 failed, 1 skipped\n");
    return EXIT_SKIPPED;
}

#else

#include <cuda_runtime_api.h>

#define NLAYERS 3
#define MAXREQ 4
#define MAXTOK 48
#define MAXKV 3000

typedef struct cfg {
    const char *name;
    msa_dtype act;
    int page, block, topk, init, local, lse;
    double tol_o, tol_lse;
    int lean; /* LEAN_STEPS on a plan of LEAN_TOK rows, q_len 1 and K blocks, 16 query heads a KV head */
} cfg;

typedef struct stepdef {
    int nreq, ntok;
    int q[MAXREQ], kv[MAXREQ];
} stepdef;

static const stepdef STEPS[] = {
    {3, 14, {1, 8, 3}, {2900, 1500, 700}},
    {3, 26, {16, 2, 5}, {2000, 130, 64}},
    {4, 31, {1, 1, 20, 4}, {3000, 1, 900, 2500}},
    {2, 9, {8, 1}, {8, 2999}},
};

/* Steps of one-token requests for plans of q_len 1 whose requests keep
 * every block (max_kv_len of K blocks of 128), which run their layers
 * without index value in the lean decode kernel: one block or several,
 * padding rows. */
#define LEAN_TOK 8
static const stepdef LEAN_STEPS[] = {
    {3, 4, {1, 1, 1}, {500, 130, 300}},
    {4, 4, {1, 1, 1, 1}, {512, 1, 384, 257}},
    {2, 8, {1, 1}, {129, 511}},
    {1, 1, {1}, {128}},
};

/* Shapes: two KV heads of 8 query heads (16 in the lean configurations,
 * the lean kernel's group), two index heads. */
enum { HKV = 2, D = 128, HI = 2, DI = 128 };
static int HQ = 16;

typedef struct side {
    msa_context *ctx;
    msa_model *model;
    msa_cache *cache;
    msa_plan *plan;
    /* per layer io buffers (backend memory) */
    void *q[NLAYERS], *k[NLAYERS], *v[NLAYERS], *iq[NLAYERS], *ik[NLAYERS], *iv[NLAYERS];
    void *o[NLAYERS], *io[NLAYERS];
    float *lse[NLAYERS];
    int32_t *topk[NLAYERS];
} side;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float uni(void) /* [-1, 1) */
{
    return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static size_t esz(msa_dtype d)
{
    return msa_dtype_size(d);
}

/* The CUDA backend's debugging aids of this run (command line). */
static msa_debug_options g_debug;

static void *xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static int make_side(side *s, msa_backend be, const cfg *c, int64_t num_pages)
{
    memset(s, 0, sizeof *s);
    msa_context_params cp;
    msa_context_params_default(&cp);
    cp.backend = be;
    cp.num_threads = 2;
    cp.debug = &g_debug;
    char err[256];
    if (msa_context_create(&cp, &s->ctx, err, sizeof err) != MSA_OK) {
        fprintf(stderr, "context: %s\n", err);
        return 0;
    }
    static const uint8_t sparse[NLAYERS] = {0, 1, 1};
    static const uint8_t ivalue[NLAYERS] = {0, 0, 1};
    msa_model_config mc;
    msa_model_config_default(&mc);
    mc.num_layers = NLAYERS;
    mc.num_q_heads = HQ;
    mc.num_kv_heads = HKV;
    mc.head_dim = D;
    mc.num_index_heads = HI;
    mc.index_dim = DI;
    mc.block_size = c->block;
    mc.topk_blocks = c->topk;
    mc.init_blocks = c->init;
    mc.local_blocks = c->local;
    mc.score_type = c->lse ? MSA_SCORE_LSE : MSA_SCORE_MAX;
    mc.layer_sparse = sparse;
    mc.layer_index_value = ivalue;
    if (msa_model_create(s->ctx, &mc, &s->model) != MSA_OK)
        return 0;
    msa_cache_config cc;
    msa_cache_config_default(&cc);
    cc.num_pages = num_pages;
    cc.page_size = c->page;
    cc.kv_dtype = c->act;
    cc.index_dtype = c->act;
    if (msa_cache_create(s->ctx, s->model, &cc, &s->cache) != MSA_OK)
        return 0;
    msa_plan_params lim;
    msa_plan_params_default(&lim);
    lim.act_dtype = c->act;
    lim.max_requests = MAXREQ;
    lim.max_tokens = c->lean ? LEAN_TOK : MAXTOK;
    lim.max_q_len = c->lean ? 1 : 0;
    lim.max_kv_len = c->lean ? c->topk * 128 : MAXKV;
    if (msa_plan_create(s->ctx, s->model, s->cache, &lim, &s->plan) != MSA_OK)
        return 0;
    const size_t e = esz(c->act);
    for (int l = 0; l < NLAYERS; ++l) {
        int ok = msa_buffer_alloc(s->ctx, MAXTOK * HQ * D * e, &s->q[l]) == MSA_OK &&
                 msa_buffer_alloc(s->ctx, MAXTOK * HKV * D * e, &s->k[l]) == MSA_OK &&
                 msa_buffer_alloc(s->ctx, MAXTOK * HKV * D * e, &s->v[l]) == MSA_OK &&
                 msa_buffer_alloc(s->ctx, MAXTOK * HI * DI * e, &s->iq[l]) == MSA_OK &&
                 msa_buffer_alloc(s->ctx, MAXTOK * DI * e, &s->ik[l]) == MSA_OK &&
                 msa_buffer_alloc(s->ctx, MAXTOK * DI * e, &s->iv[l]) == MSA_OK &&
                 msa_buffer_alloc(s->ctx, MAXTOK * HQ * D * e, &s->o[l]) == MSA_OK &&
                 msa_buffer_alloc(s->ctx, MAXTOK * HI * DI * e, &s->io[l]) == MSA_OK &&
                 msa_buffer_alloc(s->ctx, MAXTOK * HQ * 4, (void **)&s->lse[l]) == MSA_OK &&
                 msa_buffer_alloc(s->ctx, MAXTOK * HKV * 64 * 4, (void **)&s->topk[l]) == MSA_OK;
        if (!ok)
            return 0;
    }
    return 1;
}

static void free_side(side *s)
{
    for (int l = 0; l < NLAYERS; ++l) {
        msa_buffer_free(s->ctx, s->q[l]);
        msa_buffer_free(s->ctx, s->k[l]);
        msa_buffer_free(s->ctx, s->v[l]);
        msa_buffer_free(s->ctx, s->iq[l]);
        msa_buffer_free(s->ctx, s->ik[l]);
        msa_buffer_free(s->ctx, s->iv[l]);
        msa_buffer_free(s->ctx, s->o[l]);
        msa_buffer_free(s->ctx, s->io[l]);
        msa_buffer_free(s->ctx, s->lse[l]);
        msa_buffer_free(s->ctx, s->topk[l]);
    }
    msa_plan_free(s->plan);
    msa_cache_free(s->cache);
    msa_model_free(s->model);
    msa_context_free(s->ctx);
}

static void io_for(const side *s, int l, msa_dtype act, void *stream, msa_layer_io *io)
{
    msa_layer_io_default(io);
    io->act_dtype = act;
    io->q = s->q[l];
    io->k = s->k[l];
    io->v = s->v[l];
    io->idx_q = s->iq[l];
    io->idx_k = s->ik[l];
    io->idx_v = s->iv[l];
    io->o = s->o[l];
    io->idx_o = l == 2 ? s->io[l] : NULL;
    io->lse = s->lse[l];
    io->topk = l == 0 ? NULL : s->topk[l];
    io->write_cache = 1;
    io->stream = stream;
}

/* Host images of one step. */
typedef struct images {
    void *plane[NLAYERS][4];
    size_t plane_bytes[NLAYERS][4];
    void *q[NLAYERS], *k[NLAYERS], *v[NLAYERS], *iq[NLAYERS], *ik[NLAYERS], *iv[NLAYERS];
    int32_t pt[MAXREQ * 256];
    int64_t stride;
} images;

/* Index-key features: value of feature d for block n of request r. */
static float feature(const int *perm, int nblk, int d, int n)
{
    return (float)perm[d * nblk + n] / (float)nblk;
}

static void index_key_row(float *row, const int *perm, int nblk, int pos, int B)
{
    for (int d = 0; d < DI; ++d)
        row[d] = 0.001f * uni();
    for (int d = 0; d < 8; ++d)
        row[d] += feature(perm, nblk, d, pos / B);
}

static void index_query_row(float *row)
{
    for (int d = 0; d < DI; ++d)
        row[d] = 0.001f * uni();
    row[rnd() % 8] += 4.0f;
}

static void store(void *dst, msa_dtype act, int64_t i, const float *src, int n)
{
    for (int e = 0; e < n; ++e)
        tk_store_act(dst, act, (size_t)i + (size_t)e, src[e]);
}

static void build_step(const cfg *c, const stepdef *sd, int64_t num_pages, const side *cpu,
                       images *im)
{
    const msa_dtype act = c->act;
    const int P = c->page, B = c->block;
    float row[DI > D ? DI : D];
    /* Page tables: a random permutation of the pool, consumed request by request. */
    int64_t *perm_pages = xmalloc(sizeof(int64_t) * (size_t)num_pages);
    for (int64_t i = 0; i < num_pages; ++i)
        perm_pages[i] = i;
    for (int64_t i = num_pages - 1; i > 0; --i) {
        int64_t j = (int64_t)(rnd() % (uint64_t)(i + 1)), t = perm_pages[i];
        perm_pages[i] = perm_pages[j];
        perm_pages[j] = t;
    }
    im->stride = (MAXKV + P - 1) / P;
    int64_t used = 0;
    for (int r = 0; r < sd->nreq; ++r)
        for (int64_t n = 0; n < im->stride; ++n)
            im->pt[r * im->stride + n] = n < (sd->kv[r] + P - 1) / P ? (int32_t)perm_pages[used++]
                                                                     : -1;
    free(perm_pages);

    /* Cache images: NaN everywhere, then each request's cached prefix. */
    for (int l = 0; l < NLAYERS; ++l) {
        for (int p = 0; p < 4; ++p) {
            size_t bytes = msa_cache_plane_bytes(cpu->cache, l, (msa_plane)p);
            im->plane_bytes[l][p] = bytes;
            im->plane[l][p] = bytes ? xmalloc(bytes) : NULL;
            if (bytes)
                memset(im->plane[l][p], 0xff, bytes); /* NaN in fp32, bf16 and fp16 */
        }
    }
    int *perm[MAXREQ];
    int nblk[MAXREQ];
    for (int r = 0; r < sd->nreq; ++r) {
        nblk[r] = (sd->kv[r] + B - 1) / B;
        perm[r] = xmalloc(sizeof(int) * 8 * (size_t)(nblk[r] + 1));
        for (int d = 0; d < 8; ++d) {
            int *pp = perm[r] + d * nblk[r];
            for (int n = 0; n < nblk[r]; ++n)
                pp[n] = n;
            for (int n = nblk[r] - 1; n > 0; --n) {
                int j = (int)(rnd() % (uint64_t)(n + 1)), t = pp[n];
                pp[n] = pp[j];
                pp[j] = t;
            }
        }
        const int prefix = sd->kv[r] - sd->q[r];
        for (int j = 0; j < prefix; ++j) {
            const int64_t page = im->pt[r * im->stride + j / P], slot = j % P;
            for (int l = 0; l < NLAYERS; ++l) {
                for (int h = 0; h < HKV; ++h) {
                    const int64_t off = ((page * HKV + h) * P + slot) * D;
                    for (int d = 0; d < D; ++d)
                        row[d] = uni();
                    store(im->plane[l][MSA_PLANE_K], act, off, row, D);
                    for (int d = 0; d < D; ++d)
                        row[d] = uni();
                    store(im->plane[l][MSA_PLANE_V], act, off, row, D);
                }
                if (l == 0)
                    continue;
                const int64_t off = (page * P + slot) * DI;
                index_key_row(row, perm[r], nblk[r], j, B);
                store(im->plane[l][MSA_PLANE_INDEX_K], act, off, row, DI);
                if (l == 2) {
                    for (int d = 0; d < DI; ++d)
                        row[d] = uni();
                    store(im->plane[l][MSA_PLANE_INDEX_V], act, off, row, DI);
                }
            }
        }
    }
    /* Step tensors; padding rows random too (they must not reach the cache). */
    const int T = sd->ntok;
    for (int l = 0; l < NLAYERS; ++l) {
        im->q[l] = xmalloc((size_t)T * HQ * D * esz(act));
        im->k[l] = xmalloc((size_t)T * HKV * D * esz(act));
        im->v[l] = xmalloc((size_t)T * HKV * D * esz(act));
        im->iq[l] = xmalloc((size_t)T * HI * DI * esz(act));
        im->ik[l] = xmalloc((size_t)T * DI * esz(act));
        im->iv[l] = xmalloc((size_t)T * DI * esz(act));
        int t = 0;
        for (int r = 0; r <= sd->nreq; ++r) {
            const int n = r < sd->nreq ? sd->q[r] : T - t;
            for (int i = 0; i < n; ++i, ++t) {
                const int pos = r < sd->nreq ? sd->kv[r] - sd->q[r] + i : 0;
                for (int h = 0; h < HQ; ++h) {
                    for (int d = 0; d < D; ++d)
                        row[d] = uni();
                    store(im->q[l], act, ((int64_t)t * HQ + h) * D, row, D);
                }
                for (int h = 0; h < HKV; ++h) {
                    for (int d = 0; d < D; ++d)
                        row[d] = uni();
                    store(im->k[l], act, ((int64_t)t * HKV + h) * D, row, D);
                    for (int d = 0; d < D; ++d)
                        row[d] = uni();
                    store(im->v[l], act, ((int64_t)t * HKV + h) * D, row, D);
                }
                for (int h = 0; h < HI; ++h) {
                    index_query_row(row);
                    store(im->iq[l], act, ((int64_t)t * HI + h) * DI, row, DI);
                }
                if (r < sd->nreq)
                    index_key_row(row, perm[r], nblk[r], pos, B);
                else
                    for (int d = 0; d < DI; ++d)
                        row[d] = uni();
                store(im->ik[l], act, (int64_t)t * DI, row, DI);
                for (int d = 0; d < DI; ++d)
                    row[d] = uni();
                store(im->iv[l], act, (int64_t)t * DI, row, DI);
            }
        }
    }
    for (int r = 0; r < sd->nreq; ++r)
        free(perm[r]);
}

static void free_images(images *im)
{
    for (int l = 0; l < NLAYERS; ++l) {
        for (int p = 0; p < 4; ++p)
            free(im->plane[l][p]);
        free(im->q[l]);
        free(im->k[l]);
        free(im->v[l]);
        free(im->iq[l]);
        free(im->ik[l]);
        free(im->iv[l]);
    }
}

static int upload(side *s, const images *im, const stepdef *sd, msa_dtype act)
{
    const size_t e = esz(act);
    const size_t T = (size_t)sd->ntok;
    int ok = 1;
    for (int l = 0; l < NLAYERS; ++l) {
        for (int p = 0; p < 4; ++p)
            if (im->plane_bytes[l][p])
                ok &= msa_copy_to_buffer(s->ctx, msa_cache_plane_data(s->cache, l, (msa_plane)p),
                                         im->plane[l][p], im->plane_bytes[l][p]) == MSA_OK;
        ok &= msa_copy_to_buffer(s->ctx, s->q[l], im->q[l], T * HQ * D * e) == MSA_OK;
        ok &= msa_copy_to_buffer(s->ctx, s->k[l], im->k[l], T * HKV * D * e) == MSA_OK;
        ok &= msa_copy_to_buffer(s->ctx, s->v[l], im->v[l], T * HKV * D * e) == MSA_OK;
        ok &= msa_copy_to_buffer(s->ctx, s->iq[l], im->iq[l], T * HI * DI * e) == MSA_OK;
        ok &= msa_copy_to_buffer(s->ctx, s->ik[l], im->ik[l], T * DI * e) == MSA_OK;
        ok &= msa_copy_to_buffer(s->ctx, s->iv[l], im->iv[l], T * DI * e) == MSA_OK;
    }
    return ok;
}

/* Poisons every output of the step's rows (NaN values, garbage ids). */
static int poison(side *s, const stepdef *sd, msa_dtype act)
{
    const size_t e = esz(act), T = (size_t)sd->ntok;
    const size_t big = T * HQ * D * (e > 4 ? e : 4) + T * HKV * 64 * 4;
    unsigned char *junk = xmalloc(big);
    memset(junk, 0xff, big);
    int32_t *ids = xmalloc(T * HKV * 64 * 4);
    for (size_t i = 0; i < T * HKV * 64; ++i)
        ids[i] = 0x7f7f7f7f;
    int ok = 1;
    for (int l = 0; l < NLAYERS; ++l) {
        ok &= msa_copy_to_buffer(s->ctx, s->o[l], junk, T * HQ * D * e) == MSA_OK;
        ok &= msa_copy_to_buffer(s->ctx, s->io[l], junk, T * HI * DI * e) == MSA_OK;
        ok &= msa_copy_to_buffer(s->ctx, s->lse[l], junk, T * HQ * 4) == MSA_OK;
        ok &= msa_copy_to_buffer(s->ctx, s->topk[l], ids, T * HKV * 64 * 4) == MSA_OK;
    }
    free(junk);
    free(ids);
    return ok;
}

static double rel_err(const float *a, const float *ref, size_t n, long *bad)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; ++i) {
        if (isnan(a[i]) != isnan(ref[i]) || (isinf(a[i]) != isinf(ref[i]))) {
            ++*bad;
            continue;
        }
        if (isnan(a[i]) || isinf(a[i])) {
            if (isinf(a[i]) && a[i] != ref[i])
                ++*bad;
            continue;
        }
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static float *fetch(side *s, const void *buf, msa_dtype dt, size_t n)
{
    void *raw = xmalloc(n * (dt == MSA_DTYPE_FP32 ? 4 : esz(dt)));
    float *f = xmalloc(n * sizeof(float));
    msa_copy_from_buffer(s->ctx, raw, buf, n * esz(dt));
    for (size_t e = 0; e < n; ++e)
        f[e] = tk_load_act(raw, dt, e);
    free(raw);
    return f;
}

static void compare(side *gpu, side *cpu, const cfg *c, const stepdef *sd, int step)
{
    const size_t T = (size_t)sd->ntok;
    const int W = msa_model_topk_width(cpu->model);
    for (int l = 0; l < NLAYERS; ++l) {
        long bad = 0;
        float *go = fetch(gpu, gpu->o[l], c->act, T * HQ * D);
        float *co = fetch(cpu, cpu->o[l], c->act, T * HQ * D);
        double eo = rel_err(go, co, T * HQ * D, &bad);
        float *gl = fetch(gpu, gpu->lse[l], MSA_DTYPE_FP32, T * HQ);
        float *cl = fetch(cpu, cpu->lse[l], MSA_DTYPE_FP32, T * HQ);
        double el = rel_err(gl, cl, T * HQ, &bad);
        CHECK(bad == 0 && eo < c->tol_o && el < c->tol_lse,
              "%s step %d layer %d: o err %.3g, lse err %.3g, %ld NaN/inf mismatches", c->name,
              step, l, eo, el, bad);
        free(go);
        free(co);
        free(gl);
        free(cl);
        if (l > 0) {
            int32_t *gt = xmalloc(T * HKV * (size_t)W * 4), *ct = xmalloc(T * HKV * (size_t)W * 4);
            msa_copy_from_buffer(gpu->ctx, gt, gpu->topk[l], T * HKV * (size_t)W * 4);
            msa_copy_from_buffer(cpu->ctx, ct, cpu->topk[l], T * HKV * (size_t)W * 4);
            long diff = 0;
            for (size_t i = 0; i < T * HKV * (size_t)W; ++i)
                diff += gt[i] != ct[i];
            CHECK(diff == 0, "%s step %d layer %d: %ld selected ids differ", c->name, step, l,
                  diff);
            free(gt);
            free(ct);
        }
        if (l == 2) {
            long bad2 = 0;
            float *gi = fetch(gpu, gpu->io[l], c->act, T * HI * DI);
            float *ci = fetch(cpu, cpu->io[l], c->act, T * HI * DI);
            double ei = rel_err(gi, ci, T * HI * DI, &bad2);
            CHECK(bad2 == 0 && ei < c->tol_o, "%s step %d: idx_o err %.3g, %ld NaN mismatches",
                  c->name, step, ei, bad2);
            free(gi);
            free(ci);
        }
        for (int p = 0; p < 4; ++p) {
            size_t bytes = msa_cache_plane_bytes(cpu->cache, l, (msa_plane)p);
            if (!bytes)
                continue;
            unsigned char *a = xmalloc(bytes), *b = xmalloc(bytes);
            msa_copy_from_buffer(gpu->ctx, a, msa_cache_plane_data(gpu->cache, l, (msa_plane)p),
                                 bytes);
            msa_copy_from_buffer(cpu->ctx, b, msa_cache_plane_data(cpu->cache, l, (msa_plane)p),
                                 bytes);
            CHECK(memcmp(a, b, bytes) == 0, "%s step %d layer %d plane %d: caches differ", c->name,
                  step, l, p);
            free(a);
            free(b);
        }
    }
}

/* msa_bench_stages on a step with a prefill row (or a lean plan's step):
 * every layer writes its entries and attends; only sparse layers on the
 * decode chain score and select. */
static void check_stages(side *gpu, const cfg *c)
{
    for (int l = 0; l < NLAYERS; ++l) {
        msa_layer_io io;
        io_for(gpu, l, c->act, NULL, &io);
        double us[MSA_STAGE_COUNT];
        msa_status st = msa_bench_stages(gpu->ctx, gpu->plan, l, &io, 1, 3, us);
        CHECK(st == MSA_OK, "%s layer %d: stages: %s", c->name, l,
              msa_context_last_error(gpu->ctx));
        if (st != MSA_OK)
            continue;
        int finite = 1;
        for (int k = 0; k < MSA_STAGE_COUNT; ++k)
            finite &= us[k] >= 0 && us[k] < 1e6;
        const int sparse = msa_model_layer_is_sparse(gpu->model, l);
        if (strstr(msa_plan_kernel_name(gpu->plan, l), ".lean")) {
            /* One kernel: its time is the attention stage's. */
            CHECK(finite && us[MSA_STAGE_ATTENTION] > 0 && us[MSA_STAGE_INDEXER] == 0 &&
                      us[MSA_STAGE_SELECTION] == 0 && us[MSA_STAGE_PREFILL_INDEXER] == 0,
                  "%s layer %d (lean): stage times %.1f %.1f %.1f %.1f %.1f %.1f", c->name, l,
                  us[0], us[1], us[2], us[3], us[4], us[5]);
            continue;
        }
        CHECK(finite && us[MSA_STAGE_CACHE_WRITE] > 0 && us[MSA_STAGE_ATTENTION] > 0,
              "%s layer %d: stage times %.1f %.1f %.1f %.1f %.1f %.1f", c->name, l, us[0], us[1],
              us[2], us[3], us[4], us[5]);
        CHECK(sparse ? us[MSA_STAGE_INDEXER] > 0 && us[MSA_STAGE_SELECTION] > 0
                     : us[MSA_STAGE_INDEXER] == 0 && us[MSA_STAGE_SELECTION] == 0 &&
                           us[MSA_STAGE_PREFILL_INDEXER] == 0,
              "%s layer %d (%s): indexer %.1f us, selection %.1f us", c->name, l,
              sparse ? "sparse" : "dense", us[MSA_STAGE_INDEXER], us[MSA_STAGE_SELECTION]);
    }
}

static void run_config(const cfg *c)
{
    HQ = c->lean ? 32 : 16;
    const stepdef *steps = c->lean ? LEAN_STEPS : STEPS;
    const size_t nsteps = c->lean ? sizeof LEAN_STEPS / sizeof LEAN_STEPS[0]
                                  : sizeof STEPS / sizeof STEPS[0];
    const int64_t num_pages = (int64_t)MAXREQ * ((MAXKV + c->page - 1) / c->page) + 4;
    side gpu, cpu;
    if (!make_side(&gpu, MSA_BACKEND_CUDA, c, num_pages) ||
        !make_side(&cpu, MSA_BACKEND_CPU, c, num_pages)) {
        CHECK(0, "%s: setup failed: %s / %s", c->name,
              gpu.ctx ? msa_context_last_error(gpu.ctx) : "",
              cpu.ctx ? msa_context_last_error(cpu.ctx) : "");
        return;
    }
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess, "stream");
    cudaGraphExec_t exec = NULL;
    for (size_t si = 0; si < nsteps; ++si) {
        const stepdef *sd = &steps[si];
        images im;
        memset(&im, 0, sizeof im);
        build_step(c, sd, num_pages, &cpu, &im);
        msa_step step;
        step.num_requests = sd->nreq;
        step.num_tokens = sd->ntok;
        step.q_len = sd->q;
        step.kv_len = sd->kv;
        step.page_table = im.pt;
        step.page_table_stride = im.stride;
        CHECK(upload(&gpu, &im, sd, c->act) && upload(&cpu, &im, sd, c->act), "upload");
        CHECK(poison(&gpu, sd, c->act) && poison(&cpu, sd, c->act), "poison");
        CHECK(msa_plan_update(cpu.plan, &step, NULL) == MSA_OK, "cpu plan: %s",
              msa_context_last_error(cpu.ctx));
        CHECK(msa_plan_update(gpu.plan, &step, stream) == MSA_OK, "gpu plan: %s",
              msa_context_last_error(gpu.ctx));
        for (int l = 0; l < NLAYERS; ++l) {
            msa_layer_io io;
            io_for(&cpu, l, c->act, NULL, &io);
            CHECK(msa_forward(cpu.ctx, cpu.plan, l, &io) == MSA_OK, "cpu forward: %s",
                  msa_context_last_error(cpu.ctx));
        }
        if (!exec) {
            /* Captured once, on the first step; later steps only update the plan. */
            cudaGraph_t graph;
            CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess,
                  "begin capture");
            for (int l = 0; l < NLAYERS; ++l) {
                msa_layer_io io;
                io_for(&gpu, l, c->act, stream, &io);
                CHECK(msa_forward(gpu.ctx, gpu.plan, l, &io) == MSA_OK, "gpu forward (capture): %s",
                      msa_context_last_error(gpu.ctx));
            }
            CHECK(cudaStreamEndCapture(stream, &graph) == cudaSuccess, "end capture");
            CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "instantiate");
            cudaGraphDestroy(graph);
            printf("%s: kernels %s / %s / %s, reason \"%s\"\n", c->name,
                   msa_plan_kernel_name(gpu.plan, 0), msa_plan_kernel_name(gpu.plan, 1),
                   msa_plan_kernel_name(gpu.plan, 2), msa_plan_fallback_reason(gpu.plan, 2));
            if (c->lean && g_debug.cuda_num_sms == 0) /* (with fewer SMs its tasks do not fit) */
                CHECK(!strcmp(msa_plan_kernel_name(gpu.plan, 0), "cuda.dense.lean") &&
                          !strcmp(msa_plan_kernel_name(gpu.plan, 1), "cuda.sparse.lean"),
                      "%s: layers 0 and 1 run %s and %s, not the lean decode kernel (%s)", c->name,
                      msa_plan_kernel_name(gpu.plan, 0), msa_plan_kernel_name(gpu.plan, 1),
                      msa_plan_fallback_reason(gpu.plan, 1));
        }
        cudaError_t e = cudaGraphLaunch(exec, stream);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(stream);
        CHECK(e == cudaSuccess, "%s step %zu: replay: %s", c->name, si, cudaGetErrorString(e));
        compare(&gpu, &cpu, c, sd, (int)si);
        if (sd->q[2] > 16 || (c->lean && si == 0))
            check_stages(&gpu, c);
        free_images(&im);
    }
    if (exec)
        cudaGraphExecDestroy(exec);
    cudaStreamDestroy(stream);
    free_side(&gpu);
    free_side(&cpu);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--sms") && i + 1 < argc && atoi(argv[i + 1]) > 0) {
            g_debug.cuda_num_sms = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--kbm-chunk") && i + 1 < argc && atoi(argv[i + 1]) > 0) {
            /* the key-block-major prefill attention in chunks of N tokens */
            g_debug.cuda_prefill_kbm_chunk = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--sms N] [--kbm-chunk N]\n", argv[0]);
            return 2;
        }
    }
    if (!msa_backend_available(MSA_BACKEND_CUDA)) {
        printf("skipped: no CUDA device\n");
        printf("0 passed, 0 failed, 1 skipped\n");
        return EXIT_SKIPPED;
    }
    static const cfg CFGS[] = {
        {"bf16 P64 B64", MSA_DTYPE_BF16, 64, 64, 6, 1, 2, 0, 1e-2, 1e-4, 0},
        {"fp16 P128 B128 lse", MSA_DTYPE_FP16, 128, 128, 5, 0, 1, 1, 1e-2, 1e-4, 0},
        {"bf16 P16 B128", MSA_DTYPE_BF16, 16, 128, 4, 1, 1, 0, 1e-2, 1e-4, 0},
        {"fp32 P32 B64", MSA_DTYPE_FP32, 32, 64, 6, 1, 2, 0, 1e-5, 1e-5, 0},
        {"bf16 P64 B128 lean", MSA_DTYPE_BF16, 64, 128, 4, 1, 1, 0, 1e-2, 1e-4, 1},
        {"fp16 P128 B128 lse lean", MSA_DTYPE_FP16, 128, 128, 5, 0, 2, 1, 1e-2, 1e-4, 1},
    };
    for (size_t i = 0; i < sizeof CFGS / sizeof CFGS[0]; ++i)
        run_config(&CFGS[i]);
    return check_finish();
}

#endif
