/*
 * Engine-owned resources (docs/API.md): plans on caller workspace and page
 * tables in device memory.
 *
 * Two plans with the same fixed limits run the same steps on one cache: a
 * plan of the library's own (msa_plan_create, host page tables) and a plan
 * on caller workspace (msa_plan_create_with_workspace, page tables given in
 * backend memory to msa_plan_update_ex).  Every output of every layer must
 * be equal bit for bit, and from the creation of the second plan on the
 * library must allocate no backend memory (on the CUDA backend: no device
 * memory) and, in updates and forwards, nothing at all (the allocation
 * counters of src/core/alloc_fault.c).  The calls that must be refused are
 * refused, writing nothing.
 *
 * The CUDA backend cannot check a device table's entries.  A step whose
 * device table holds entries outside the pool and pages written twice must
 * run without an error, write no row to an invalid page, and neither read
 * nor write outside the cache's planes: the planes lie in larger buffers
 * whose guard bytes around them must stay unchanged.  The CPU backend reads
 * a device table as host memory and refuses such a step.
 *
 *   test_engine_resources [--backend cpu|cuda]
 *
 * With --backend cuda and no GPU it prints "skipped" and exits 77.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/internal.h"
#include "msa/msa.h"

#define EXIT_SKIPPED 77
#define NLAYERS 3
#define HQ 32
#define HKV 2
#define DIM 128
#define HI 2
#define DI 128
#define PAGE 128
#define NPAGES 128
#define MAXREQ 4
#define MAXTOK 512
#define MAXKV 4096
#define PPR (MAXKV / PAGE)

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rand_u32(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 32);
}

/* A bf16 value in about [-1, 1). */
static uint16_t rand_bf16(void)
{
    float f = (float)((int32_t)(rand_u32() >> 8) - (1 << 23)) / (float)(1 << 23);
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return (uint16_t)(bits >> 16);
}

typedef struct rig {
    msa_context *ctx;
    msa_backend backend;
    msa_model *model;
    msa_cache *cache;
    int32_t width;
    /* Inputs and outputs in backend memory, MAXTOK rows each. */
    void *q, *k, *v, *iq, *ik, *iv;
    void *o, *io, *lse, *topk;
    size_t o_bytes, io_bytes, lse_bytes, topk_bytes;
    /* The device copy of a step's page table. */
    void *table;
} rig;

static void *buf(rig *r, size_t bytes)
{
    void *p = NULL;
    if (msa_buffer_alloc(r->ctx, bytes, &p) != MSA_OK)
        return NULL;
    return p;
}

/* Fills a backend buffer with random bf16 values. */
static int fill_random(rig *r, void *dst, size_t elems)
{
    uint16_t *h = malloc(elems * sizeof *h);
    if (!h)
        return 0;
    for (size_t i = 0; i < elems; i++)
        h[i] = rand_bf16();
    int ok = msa_copy_to_buffer(r->ctx, dst, h, elems * sizeof *h) == MSA_OK;
    free(h);
    return ok;
}

static void model_config(msa_model_config *mc, const uint8_t *sparse, const uint8_t *value,
                         int layers)
{
    msa_model_config_default(mc);
    mc->num_layers = layers;
    mc->num_q_heads = HQ;
    mc->num_kv_heads = HKV;
    mc->head_dim = DIM;
    mc->num_index_heads = HI;
    mc->index_dim = DI;
    mc->block_size = 128;
    mc->topk_blocks = 4;
    mc->init_blocks = 1;
    mc->local_blocks = 1;
    mc->layer_sparse = sparse;
    mc->layer_index_value = value;
}

static int rig_open(rig *r, msa_backend backend)
{
    static const uint8_t sparse[NLAYERS] = {0, 1, 1}, value[NLAYERS] = {0, 0, 1};
    memset(r, 0, sizeof *r);
    r->backend = backend;
    msa_context_params cp;
    msa_context_params_default(&cp);
    cp.backend = backend;
    cp.num_threads = 2;
    char err[256];
    if (msa_context_create(&cp, &r->ctx, err, sizeof err) != MSA_OK) {
        fprintf(stderr, "context: %s\n", err);
        return 0;
    }
    msa_model_config mc;
    model_config(&mc, sparse, value, NLAYERS);
    msa_cache_config cc;
    msa_cache_config_default(&cc);
    cc.num_pages = NPAGES;
    cc.page_size = PAGE;
    if (msa_model_create(r->ctx, &mc, &r->model) != MSA_OK ||
        msa_cache_create(r->ctx, r->model, &cc, &r->cache) != MSA_OK)
        return 0;
    r->width = msa_model_topk_width(r->model);
    /* Random cache contents: the positions a step does not write. */
    for (int32_t l = 0; l < NLAYERS; l++)
        for (int pl = 0; pl < 4; pl++) {
            size_t b = msa_cache_plane_bytes(r->cache, l, (msa_plane)pl);
            if (b && !fill_random(r, msa_cache_plane_data(r->cache, l, (msa_plane)pl), b / 2))
                return 0;
        }
    r->o_bytes = (size_t)MAXTOK * HQ * DIM * 2;
    r->io_bytes = (size_t)MAXTOK * HI * DI * 2;
    r->lse_bytes = (size_t)MAXTOK * HQ * 4;
    r->topk_bytes = (size_t)MAXTOK * HKV * (size_t)r->width * 4;
    r->q = buf(r, r->o_bytes);
    r->k = buf(r, (size_t)MAXTOK * HKV * DIM * 2);
    r->v = buf(r, (size_t)MAXTOK * HKV * DIM * 2);
    r->iq = buf(r, r->io_bytes);
    r->ik = buf(r, (size_t)MAXTOK * DI * 2);
    r->iv = buf(r, (size_t)MAXTOK * DI * 2);
    r->o = buf(r, r->o_bytes);
    r->io = buf(r, r->io_bytes);
    r->lse = buf(r, r->lse_bytes);
    r->topk = buf(r, r->topk_bytes);
    r->table = buf(r, (size_t)MAXREQ * PPR * 4 + 64);
    return r->q && r->k && r->v && r->iq && r->ik && r->iv && r->o && r->io && r->lse && r->topk &&
           r->table;
}

static void rig_close(rig *r)
{
    void *bufs[] = {r->q, r->k, r->v, r->iq, r->ik, r->iv, r->o, r->io, r->lse, r->topk, r->table};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            msa_buffer_free(r->ctx, bufs[i]);
    msa_cache_free(r->cache);
    msa_model_free(r->model);
    msa_context_free(r->ctx);
}

/* One step: lengths, and its page table on the host (PPR entries a row). */
typedef struct step {
    int32_t nreq;
    int64_t ntok;
    int32_t q[MAXREQ], kv[MAXREQ];
    int32_t table[MAXREQ * PPR];
} step;

/* Gives every request distinct pages of the pool, in random order. */
static void step_pages(step *s)
{
    int32_t perm[NPAGES];
    for (int32_t i = 0; i < NPAGES; i++)
        perm[i] = i;
    for (int32_t i = NPAGES - 1; i > 0; i--) {
        int32_t j = (int32_t)(rand_u32() % (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t next = 0;
    for (int32_t r = 0; r < MAXREQ; r++)
        for (int32_t n = 0; n < PPR; n++)
            s->table[r * PPR + n] = -1;
    for (int32_t r = 0; r < s->nreq; r++)
        for (int32_t n = 0; n < (s->kv[r] + PAGE - 1) / PAGE; n++)
            s->table[r * PPR + n] = perm[next++];
}

static msa_step step_view(const step *s, const int32_t *table)
{
    msa_step st;
    memset(&st, 0, sizeof st);
    st.num_requests = s->nreq;
    st.num_tokens = s->ntok;
    st.q_len = s->q;
    st.kv_len = s->kv;
    st.page_table = table;
    st.page_table_stride = PPR;
    return st;
}

/* Host copies of every layer's outputs of one step. */
typedef struct outs {
    unsigned char *o[NLAYERS], *io[NLAYERS], *lse[NLAYERS], *topk[NLAYERS];
} outs;

static void outs_free(outs *x)
{
    for (int l = 0; l < NLAYERS; l++) {
        free(x->o[l]);
        free(x->io[l]);
        free(x->lse[l]);
        free(x->topk[l]);
    }
    memset(x, 0, sizeof *x);
}

/* Poisons the outputs, runs every layer of the plan's step and copies the
 * outputs back.  Returns 0 when a call failed. */
static int run_layers(rig *r, msa_plan *plan, outs *x)
{
    memset(x, 0, sizeof *x);
    for (int l = 0; l < NLAYERS; l++) {
        unsigned char *poison = malloc(r->o_bytes);
        if (!poison)
            return 0;
        memset(poison, 0xa5, r->o_bytes);
        if (msa_copy_to_buffer(r->ctx, r->o, poison, r->o_bytes) != MSA_OK ||
            msa_copy_to_buffer(r->ctx, r->io, poison, r->io_bytes) != MSA_OK ||
            msa_copy_to_buffer(r->ctx, r->lse, poison, r->lse_bytes) != MSA_OK ||
            msa_copy_to_buffer(r->ctx, r->topk, poison, r->topk_bytes) != MSA_OK) {
            free(poison);
            return 0;
        }
        free(poison);
        msa_layer_io io;
        msa_layer_io_default(&io);
        io.q = r->q;
        io.k = r->k;
        io.v = r->v;
        io.idx_q = r->iq;
        io.idx_k = r->ik;
        io.idx_v = r->iv;
        io.o = r->o;
        io.idx_o = msa_model_layer_has_index_value(r->model, l) ? r->io : NULL;
        io.lse = r->lse;
        io.topk = msa_model_layer_is_sparse(r->model, l) ? r->topk : NULL;
        msa_status st = msa_forward(r->ctx, plan, l, &io);
        if (st != MSA_OK) {
            fprintf(stderr, "forward layer %d: %s\n", l, msa_context_last_error(r->ctx));
            return 0;
        }
        x->o[l] = malloc(r->o_bytes);
        x->io[l] = malloc(r->io_bytes);
        x->lse[l] = malloc(r->lse_bytes);
        x->topk[l] = malloc(r->topk_bytes);
        if (!x->o[l] || !x->io[l] || !x->lse[l] || !x->topk[l] ||
            msa_copy_from_buffer(r->ctx, x->o[l], r->o, r->o_bytes) != MSA_OK ||
            msa_copy_from_buffer(r->ctx, x->io[l], r->io, r->io_bytes) != MSA_OK ||
            msa_copy_from_buffer(r->ctx, x->lse[l], r->lse, r->lse_bytes) != MSA_OK ||
            msa_copy_from_buffer(r->ctx, x->topk[l], r->topk, r->topk_bytes) != MSA_OK)
            return 0;
    }
    return msa_synchronize(r->ctx) == MSA_OK;
}

static void plan_params(msa_plan_params *pp)
{
    msa_plan_params_default(pp);
    pp->max_requests = MAXREQ;
    pp->max_tokens = MAXTOK;
    pp->max_kv_len = MAXKV;
}

/* ---- refusals ------------------------------------------------------------------ */

static void test_refusals(rig *r)
{
    msa_plan_params pp;
    plan_params(&pp);
    size_t need = 0;
    CHECK(msa_plan_workspace_size(r->ctx, r->model, r->cache, &pp, &need) == MSA_OK && need > 0,
          "workspace size: %s", msa_context_last_error(r->ctx));

    /* Grow-on-update limits cannot live in a fixed workspace. */
    for (int which = 0; which < 3; which++) {
        msa_plan_params g = pp;
        if (which == 0)
            g.max_requests = 0;
        else if (which == 1)
            g.max_tokens = 0;
        else
            g.max_kv_len = 0;
        size_t bytes = 12345;
        CHECK(msa_plan_workspace_size(r->ctx, r->model, r->cache, &g, &bytes) ==
                      MSA_ERR_INVALID_ARGUMENT &&
                  bytes == 12345,
              "workspace size of a growing plan: not refused or written");
        CHECK(strstr(msa_context_last_error(r->ctx), "every limit set") != NULL, "message: %s",
              msa_context_last_error(r->ctx));
    }
    CHECK(msa_plan_workspace_size(r->ctx, r->model, r->cache, NULL, &need) ==
              MSA_ERR_INVALID_ARGUMENT,
          "default params (limits 0) not refused");
    CHECK(msa_plan_workspace_size(r->ctx, r->model, r->cache, &pp, NULL) ==
              MSA_ERR_INVALID_ARGUMENT,
          "NULL bytes not refused");

    void *ws = buf(r, need + MSA_PLAN_WORKSPACE_ALIGNMENT);
    CHECK(ws != NULL, "workspace buffer");
    if (!ws)
        return;
    msa_plan *p = (msa_plan *)(uintptr_t)1;
    msa_plan_params g = pp;
    g.max_tokens = 0;
    CHECK(msa_plan_create_with_workspace(r->ctx, r->model, r->cache, &g, ws, need, &p) ==
                  MSA_ERR_INVALID_ARGUMENT &&
              p == NULL,
          "growing plan on workspace not refused");
    p = NULL;
    CHECK(msa_plan_create_with_workspace(r->ctx, r->model, r->cache, &pp, ws, need - 1, &p) ==
                  MSA_ERR_INVALID_ARGUMENT &&
              p == NULL,
          "too small a workspace not refused");
    CHECK(strstr(msa_context_last_error(r->ctx), "the plan needs") != NULL, "message: %s",
          msa_context_last_error(r->ctx));
    CHECK(msa_plan_create_with_workspace(r->ctx, r->model, r->cache, &pp, NULL, need, &p) ==
                  MSA_ERR_INVALID_ARGUMENT &&
              p == NULL,
          "NULL workspace not refused");
    const size_t off = r->backend == MSA_BACKEND_CPU ? 32 : 64;
    CHECK(msa_plan_create_with_workspace(r->ctx, r->model, r->cache, &pp, (char *)ws + off, need,
                                         &p) == MSA_ERR_INVALID_ARGUMENT &&
              p == NULL,
          "misaligned workspace not refused");

    /* Steps the host can check are refused with a device table too. */
    CHECK(msa_plan_create_with_workspace(r->ctx, r->model, r->cache, &pp, ws, need, &p) == MSA_OK &&
              p,
          "plan on workspace: %s", msa_context_last_error(r->ctx));
    if (p) {
        step s = {.nreq = 2, .ntok = 3, .q = {1, 2}, .kv = {300, 500}};
        step_pages(&s);
        CHECK(msa_copy_to_buffer(r->ctx, r->table, s.table, sizeof s.table) == MSA_OK, "copy");
        msa_step st = step_view(&s, r->table);
        CHECK(msa_plan_update_ex(p, &st, (msa_memory)7, NULL) == MSA_ERR_INVALID_ARGUMENT,
              "unknown memory kind not refused");
        st.page_table_stride = 2; /* request 1 needs 4 pages */
        CHECK(msa_plan_update_ex(p, &st, MSA_MEMORY_DEVICE, NULL) == MSA_ERR_INVALID_ARGUMENT,
              "short stride not refused");
        st = step_view(&s, NULL);
        CHECK(msa_plan_update_ex(p, &st, MSA_MEMORY_DEVICE, NULL) == MSA_ERR_INVALID_ARGUMENT,
              "NULL table not refused");
        if (r->backend != MSA_BACKEND_CPU) {
            /* Lengths are host data: checked whatever the table. */
            st = step_view(&s, r->table);
            int32_t big[2] = {1, MAXKV + 1};
            st.kv_len = big;
            st.page_table_stride = PPR + 8;
            CHECK(msa_plan_update_ex(p, &st, MSA_MEMORY_DEVICE, NULL) == MSA_ERR_CAPACITY,
                  "kv_len beyond the limit not refused");
            st = step_view(&s, (const int32_t *)((const char *)r->table + 2));
            CHECK(msa_plan_update_ex(p, &st, MSA_MEMORY_DEVICE, NULL) == MSA_ERR_INVALID_ARGUMENT,
                  "misaligned device table not refused");
        } else {
            /* The CPU backend reads a device table as host memory: every
             * check of a host table applies. */
            s.table[PPR + 1] = NPAGES;
            CHECK(msa_copy_to_buffer(r->ctx, r->table, s.table, sizeof s.table) == MSA_OK, "copy");
            st = step_view(&s, r->table);
            CHECK(msa_plan_update_ex(p, &st, MSA_MEMORY_DEVICE, NULL) == MSA_ERR_OUT_OF_RANGE,
                  "CPU: page outside the pool not refused");
            s.table[PPR + 1] = s.table[PPR + 3]; /* request 1 writes its page 3 twice */
            CHECK(msa_copy_to_buffer(r->ctx, r->table, s.table, sizeof s.table) == MSA_OK, "copy");
            CHECK(msa_plan_update_ex(p, &st, MSA_MEMORY_DEVICE, NULL) == MSA_ERR_INVALID_ARGUMENT,
                  "CPU: colliding pages not refused");
            CHECK(strncmp(msa_context_last_error(r->ctx), "msa_plan_update_ex:", 19) == 0,
                  "message: %s", msa_context_last_error(r->ctx));
        }
        msa_plan_free(p);
    }
    msa_buffer_free(r->ctx, ws);
}

/* ---- equality and allocations ---------------------------------------------- */

static int same(const unsigned char *a, const unsigned char *b, size_t n)
{
    return memcmp(a, b, n) == 0;
}

static void test_equal(rig *r)
{
    msa_plan_params pp;
    plan_params(&pp);
    msa_plan *own = NULL, *eng = NULL;
    CHECK(msa_plan_create(r->ctx, r->model, r->cache, &pp, &own) == MSA_OK, "plan: %s",
          msa_context_last_error(r->ctx));
    size_t need = 0;
    CHECK(msa_plan_workspace_size(r->ctx, r->model, r->cache, &pp, &need) == MSA_OK, "size");
    void *ws = buf(r, need);
    CHECK(own && ws, "plan and workspace");
    if (!own || !ws)
        return;
    const long dev0 = msa_test_device_allocations();
    CHECK(msa_plan_create_with_workspace(r->ctx, r->model, r->cache, &pp, ws, need, &eng) ==
                  MSA_OK &&
              eng,
          "plan on workspace: %s", msa_context_last_error(r->ctx));
    CHECK(msa_test_device_allocations() == dev0,
          "creating a plan on caller workspace allocated %ld blocks of backend memory",
          msa_test_device_allocations() - dev0);
    if (!eng) {
        msa_plan_free(own);
        msa_buffer_free(r->ctx, ws);
        return;
    }
    CHECK(strcmp(msa_plan_kernel_name(own, 1), msa_plan_kernel_name(eng, 1)) == 0,
          "kernels differ: %s, %s", msa_plan_kernel_name(own, 1), msa_plan_kernel_name(eng, 1));

    /* Prefill, decode, verify, a request without new tokens and padding
     * rows; contexts over several pages, up to the limit. */
    static const step steps[] = {
        {.nreq = 3, .ntok = 215, .q = {200, 1, 4}, .kv = {200, 1500, 900}},
        {.nreq = 4, .ntok = 40, .q = {1, 8, 30, 0}, .kv = {2100, 3000, 1000, 500}},
        {.nreq = 2, .ntok = 2, .q = {1, 1}, .kv = {MAXKV, 129}},
        {.nreq = 4, .ntok = 300, .q = {16, 17, 100, 3}, .kv = {16, 2000, 1100, 4000}},
    };
    const long all0 = msa_test_allocations(), dev1 = msa_test_device_allocations();
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        step s = steps[i];
        step_pages(&s);
        const size_t rows = (size_t)s.ntok;
        int ok = fill_random(r, r->q, rows * HQ * DIM) && fill_random(r, r->k, rows * HKV * DIM) &&
                 fill_random(r, r->v, rows * HKV * DIM) && fill_random(r, r->iq, rows * HI * DI) &&
                 fill_random(r, r->ik, rows * DI) && fill_random(r, r->iv, rows * DI) &&
                 msa_copy_to_buffer(r->ctx, r->table, s.table, sizeof s.table) == MSA_OK;
        CHECK(ok, "step %zu: inputs", i);
        msa_step host = step_view(&s, s.table), dev = step_view(&s, r->table);
        CHECK(msa_plan_update(own, &host, NULL) == MSA_OK, "step %zu: update: %s", i,
              msa_context_last_error(r->ctx));
        outs a, b;
        CHECK(run_layers(r, own, &a), "step %zu: forward of the library's plan", i);
        if (i == 0) {
            /* The comparisons below need a backend that repeats itself bit
             * for bit: a difference here is not one of the workspace or of
             * the device tables. */
            outs again;
            CHECK(run_layers(r, own, &again), "step 0: second forward");
            for (int l = 0; l < NLAYERS && a.o[l] && again.o[l]; l++)
                CHECK(same(a.o[l], again.o[l], r->o_bytes) &&
                          same(a.topk[l], again.topk[l], r->topk_bytes),
                      "layer %d: the library's plan gives other outputs when run again", l);
            outs_free(&again);
        }
        /* The second plan's forward writes the same rows into the same
         * slots: the cache it reads is the one the first plan read. */
        CHECK(msa_plan_update_ex(eng, &dev, MSA_MEMORY_DEVICE, NULL) == MSA_OK,
              "step %zu: update_ex: %s", i, msa_context_last_error(r->ctx));
        CHECK(run_layers(r, eng, &b), "step %zu: forward on workspace", i);
        for (int l = 0; l < NLAYERS && a.o[l] && b.o[l]; l++) {
            CHECK(same(a.o[l], b.o[l], r->o_bytes), "step %zu layer %d: o differs", i, l);
            CHECK(same(a.lse[l], b.lse[l], r->lse_bytes), "step %zu layer %d: lse differs", i, l);
            CHECK(same(a.topk[l], b.topk[l], r->topk_bytes), "step %zu layer %d: topk differs", i,
                  l);
            CHECK(same(a.io[l], b.io[l], r->io_bytes), "step %zu layer %d: idx_o differs", i, l);
        }
        /* And a host table on the workspace plan gives the same again. */
        outs c;
        CHECK(msa_plan_update(eng, &host, NULL) == MSA_OK, "step %zu: host update", i);
        CHECK(run_layers(r, eng, &c), "step %zu: forward on workspace, host table", i);
        for (int l = 0; l < NLAYERS && a.o[l] && c.o[l]; l++)
            CHECK(same(a.o[l], c.o[l], r->o_bytes) && same(a.topk[l], c.topk[l], r->topk_bytes),
                  "step %zu layer %d: host table on workspace differs", i, l);
        outs_free(&a);
        outs_free(&b);
        outs_free(&c);
    }
    CHECK(msa_test_allocations() == all0,
          "updates and forwards of fixed-limit plans allocated %ld times",
          msa_test_allocations() - all0);
    CHECK(msa_test_device_allocations() == dev1, "updates and forwards allocated backend memory");
    msa_plan_free(eng);
    msa_plan_free(own);
    /* The workspace is the caller's: still usable after the plan is gone. */
    CHECK(msa_copy_to_buffer(r->ctx, ws, &need, sizeof need) == MSA_OK, "workspace after free");
    msa_buffer_free(r->ctx, ws);
}

/* ---- unchecked device tables (CUDA) ------------------------------------------ */

#define GUARD ((size_t)1 << 16)
#define GPAGES 16

/* A one-layer sparse model with index value whose cache planes lie in
 * buffers with GUARD bytes of 0x5a on both sides; a step whose device table
 * holds entries outside the pool and a page written by two requests. */
static void test_unchecked(rig *r)
{
    static const uint8_t sparse[1] = {1}, value[1] = {1};
    msa_model_config mc;
    model_config(&mc, sparse, value, 1);
    msa_model *m = NULL;
    CHECK(msa_model_create(r->ctx, &mc, &m) == MSA_OK, "model");
    if (!m)
        return;
    msa_cache_config cc;
    msa_cache_config_default(&cc);
    cc.num_pages = GPAGES;
    cc.page_size = PAGE;
    msa_cache *probe = NULL;
    CHECK(msa_cache_create(r->ctx, m, &cc, &probe) == MSA_OK, "probe cache");
    size_t bytes[4] = {0};
    void *block[4] = {NULL}, *planes[4] = {NULL};
    unsigned char *image[4] = {NULL}, *after = NULL;
    int ok = probe != NULL;
    for (int pl = 0; pl < 4 && ok; pl++) {
        bytes[pl] = msa_cache_plane_bytes(probe, 0, (msa_plane)pl);
        const size_t total = bytes[pl] + 2 * GUARD;
        block[pl] = buf(r, total);
        image[pl] = malloc(total);
        ok = block[pl] && image[pl];
        if (!ok)
            break;
        memset(image[pl], 0x5a, total);
        for (size_t i = GUARD; i < GUARD + bytes[pl]; i += 2) {
            uint16_t x = rand_bf16();
            memcpy(image[pl] + i, &x, 2);
        }
        ok = msa_copy_to_buffer(r->ctx, block[pl], image[pl], total) == MSA_OK;
        planes[pl] = (char *)block[pl] + GUARD;
    }
    msa_cache_free(probe);
    msa_cache *cache = NULL;
    CHECK(ok && msa_cache_wrap(r->ctx, m, &cc, planes, &cache) == MSA_OK, "guarded cache");
    msa_plan_params pp;
    msa_plan_params_default(&pp);
    pp.max_requests = 3;
    pp.max_tokens = 64;
    pp.max_kv_len = 1024;
    msa_plan *p = NULL;
    if (cache)
        CHECK(msa_plan_create(r->ctx, m, cache, &pp, &p) == MSA_OK, "plan: %s",
              msa_context_last_error(r->ctx));
    /* Request 0: every entry outside the pool (it writes 20 rows into its
     * last page).  Requests 1 and 2 both write into page 3.  No row may be
     * written anywhere but page 3. */
    const int32_t stride = 8;
    int32_t table[3 * 8] = {-1, GPAGES, INT32_MAX, INT32_MIN, -7, GPAGES + 1, 0, 0, 5, 3, 0, 0,
                            0,  0,      0,         0,         3,  0,          0, 0, 0, 0, 0, 0};
    int32_t q[3] = {20, 2, 1}, kv[3] = {5 * PAGE, PAGE + 10, 100};
    msa_step st;
    memset(&st, 0, sizeof st);
    st.num_requests = 3;
    st.num_tokens = 24;
    st.q_len = q;
    st.kv_len = kv;
    st.page_table = r->table;
    st.page_table_stride = stride;
    if (p) {
        CHECK(msa_copy_to_buffer(r->ctx, r->table, table, sizeof table) == MSA_OK, "copy");
        CHECK(msa_plan_update_ex(p, &st, MSA_MEMORY_DEVICE, NULL) == MSA_OK, "update_ex: %s",
              msa_context_last_error(r->ctx));
        msa_layer_io io;
        msa_layer_io_default(&io);
        ok = fill_random(r, r->q, 24 * HQ * DIM) && fill_random(r, r->k, 24 * HKV * DIM) &&
             fill_random(r, r->v, 24 * HKV * DIM) && fill_random(r, r->iq, 24 * HI * DI) &&
             fill_random(r, r->ik, 24 * DI) && fill_random(r, r->iv, 24 * DI);
        io.q = r->q;
        io.k = r->k;
        io.v = r->v;
        io.idx_q = r->iq;
        io.idx_k = r->ik;
        io.idx_v = r->iv;
        io.o = r->o;
        io.idx_o = r->io;
        io.lse = r->lse;
        io.topk = r->topk;
        CHECK(ok && msa_forward(r->ctx, p, 0, &io) == MSA_OK, "forward: %s",
              msa_context_last_error(r->ctx));
        CHECK(msa_synchronize(r->ctx) == MSA_OK, "synchronize after unchecked entries: %s",
              msa_context_last_error(r->ctx));
        for (int pl = 0; pl < 4; pl++) {
            const size_t total = bytes[pl] + 2 * GUARD;
            after = malloc(total);
            if (!after || msa_copy_from_buffer(r->ctx, after, block[pl], total) != MSA_OK) {
                CHECK(0, "copy back plane %d", pl);
                free(after);
                continue;
            }
            CHECK(same(after, image[pl], GUARD) &&
                      same(after + GUARD + bytes[pl], image[pl] + GUARD + bytes[pl], GUARD),
                  "plane %d: guard bytes around the plane changed", pl);
            /* Every page but page 3 as it was: the rows of request 0 were
             * dropped, none went to page 0. */
            const size_t page_bytes = bytes[pl] / GPAGES;
            long changed = 0;
            for (int32_t g = 0; g < GPAGES; g++)
                if (g != 3 && !same(after + GUARD + g * page_bytes,
                                    image[pl] + GUARD + g * page_bytes, page_bytes))
                    changed++;
            CHECK(changed == 0, "plane %d: %ld pages other than page 3 were written", pl, changed);
            free(after);
        }
        /* The plan goes on with a valid step. */
        int32_t good[3 * 8] = {0};
        for (int i = 0; i < 3; i++)
            good[i * 8] = 4 * i;
        int32_t q2[3] = {1, 1, 1}, kv2[3] = {PAGE, PAGE, PAGE};
        st.q_len = q2;
        st.kv_len = kv2;
        st.num_tokens = 3;
        CHECK(msa_copy_to_buffer(r->ctx, r->table, good, sizeof good) == MSA_OK, "copy");
        CHECK(msa_plan_update_ex(p, &st, MSA_MEMORY_DEVICE, NULL) == MSA_OK &&
                  msa_forward(r->ctx, p, 0, &io) == MSA_OK && msa_synchronize(r->ctx) == MSA_OK,
              "a valid step after unchecked entries: %s", msa_context_last_error(r->ctx));
    }
    msa_plan_free(p);
    msa_cache_free(cache);
    for (int pl = 0; pl < 4; pl++) {
        if (block[pl])
            msa_buffer_free(r->ctx, block[pl]);
        free(image[pl]);
    }
    msa_model_free(m);
}

int main(int argc, char **argv)
{
    msa_backend backend = MSA_BACKEND_CPU;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) {
            const char *b = argv[++i];
            if (!strcmp(b, "cuda"))
                backend = MSA_BACKEND_CUDA;
            else if (strcmp(b, "cpu")) {
                fprintf(stderr, "unknown backend %s\n", b);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: %s [--backend cpu|cuda]\n", argv[0]);
            return 2;
        }
    }
    if (!msa_backend_available(backend)) {
        printf("skipped: no %s backend\n", msa_backend_name(backend));
        printf("0 passed, 0 failed, 1 skipped\n");
        return EXIT_SKIPPED;
    }
    rig r;
    if (!rig_open(&r, backend)) {
        CHECK(0, "setup: %s", r.ctx ? msa_context_last_error(r.ctx) : "no context");
        rig_close(&r);
        return check_finish();
    }
    test_refusals(&r);
    test_equal(&r);
    if (backend == MSA_BACKEND_CUDA)
        test_unchecked(&r);
    rig_close(&r);
    return check_finish();
}
