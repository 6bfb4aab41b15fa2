/*
 * Plan updates are transactions: a failed msa_plan_update (bad step, too
 * large a capacity, an allocation that fails at any point) leaves the
 * previous step, its arrays and the backend state as they were, so the next
 * msa_forward reproduces the previous step's outputs bit for bit.  A plan
 * with all limits set allocates nothing in an update.  A plan without a
 * step refuses msa_forward.  Runs on the CPU backend, and on the CUDA
 * backend where one is compiled in and a device exists.
 *
 * Allocation failures come from the library's injector
 * (msa_test_fail_allocation, src/core/alloc_fault.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/internal.h"
#include "msa/msa.h"

/* ---- a small rig: context, model, cache, io buffers ------------------------ */

typedef struct shape {
    int32_t hq, hkv, d, hi, di, block, topk, layers;
    const uint8_t *sparse, *value;
    int64_t num_pages;
    int32_t page;
    int64_t max_rows; /* rows of the io buffers */
} shape;

typedef struct rig {
    msa_backend backend;
    const char *name;
    msa_context *ctx;
    msa_model *model;
    msa_cache *cache;
    shape sh;
    int32_t width; /* msa_model_topk_width */
    void *q, *k, *v, *iq, *ik, *iv, *o, *io, *lse, *topk;
    size_t o_bytes, io_bytes, lse_bytes, topk_bytes;
} rig;

/* Host copy of the outputs of every layer of one step. */
typedef struct outputs {
    int layers;
    unsigned char *o[4], *io[4], *lse[4], *topk[4];
} outputs;

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint16_t rand_bf16(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    float f = (float)((int64_t)(rng >> 40) - (1 << 23)) / (float)(1 << 23); /* [-1, 1) */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return (uint16_t)(bits >> 16);
}

static void *dev_random(rig *r, size_t elems)
{
    void *dev = NULL;
    uint16_t *h = malloc(elems * 2);
    if (!h || msa_buffer_alloc(r->ctx, elems * 2, &dev) != MSA_OK) {
        free(h);
        return NULL;
    }
    for (size_t i = 0; i < elems; i++)
        h[i] = rand_bf16();
    msa_copy_to_buffer(r->ctx, dev, h, elems * 2);
    free(h);
    return dev;
}

static void *dev_zero(rig *r, size_t bytes)
{
    void *dev = NULL;
    return msa_buffer_alloc(r->ctx, bytes, &dev) == MSA_OK ? dev : NULL;
}

static void dev_fill(rig *r, void *dev, size_t bytes, unsigned char byte)
{
    unsigned char *h = malloc(bytes);
    if (!h)
        return;
    memset(h, byte, bytes);
    msa_copy_to_buffer(r->ctx, dev, h, bytes);
    free(h);
}

static unsigned char *dev_read(rig *r, const void *dev, size_t bytes)
{
    unsigned char *h = malloc(bytes ? bytes : 1);
    if (h)
        msa_copy_from_buffer(r->ctx, h, dev, bytes);
    return h;
}

static void rig_free(rig *r)
{
    void *bufs[] = {r->q, r->k, r->v, r->iq, r->ik, r->iv, r->o, r->io, r->lse, r->topk};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            msa_buffer_free(r->ctx, bufs[i]);
    msa_cache_free(r->cache);
    msa_model_free(r->model);
    msa_context_free(r->ctx);
    memset(r, 0, sizeof *r);
}

static int rig_make(rig *r, msa_backend backend, const shape *sh)
{
    memset(r, 0, sizeof *r);
    r->backend = backend;
    r->name = msa_backend_name(backend);
    r->sh = *sh;
    msa_context_params cp;
    msa_context_params_default(&cp);
    cp.backend = backend;
    cp.num_threads = 2;
    char err[256] = "";
    if (msa_context_create(&cp, &r->ctx, err, sizeof err) != MSA_OK) {
        CHECK(0, "%s: context: %s", r->name, err);
        return 0;
    }
    msa_model_config mc;
    msa_model_config_default(&mc);
    mc.num_layers = sh->layers;
    mc.num_q_heads = sh->hq;
    mc.num_kv_heads = sh->hkv;
    mc.head_dim = sh->d;
    mc.num_index_heads = sh->hi;
    mc.index_dim = sh->di;
    mc.block_size = sh->block;
    mc.topk_blocks = sh->topk;
    mc.layer_sparse = sh->sparse;
    mc.layer_index_value = sh->value;
    msa_cache_config cc;
    msa_cache_config_default(&cc);
    cc.num_pages = sh->num_pages;
    cc.page_size = sh->page;
    if (msa_model_create(r->ctx, &mc, &r->model) != MSA_OK ||
        msa_cache_create(r->ctx, r->model, &cc, &r->cache) != MSA_OK) {
        CHECK(0, "%s: model / cache: %s", r->name, msa_context_last_error(r->ctx));
        rig_free(r);
        return 0;
    }
    r->width = msa_model_topk_width(r->model);
    const size_t T = (size_t)sh->max_rows;
    r->q = dev_random(r, T * sh->hq * sh->d);
    r->k = dev_random(r, T * sh->hkv * sh->d);
    r->v = dev_random(r, T * sh->hkv * sh->d);
    r->iq = dev_random(r, T * sh->hi * sh->di);
    r->ik = dev_random(r, T * sh->di);
    r->iv = dev_random(r, T * sh->di);
    r->o_bytes = T * sh->hq * sh->d * 2;
    r->io_bytes = T * sh->hi * sh->di * 2;
    r->lse_bytes = T * sh->hq * 4;
    r->topk_bytes = T * sh->hkv * (size_t)r->width * 4;
    r->o = dev_zero(r, r->o_bytes);
    r->io = dev_zero(r, r->io_bytes);
    r->lse = dev_zero(r, r->lse_bytes);
    r->topk = dev_zero(r, r->topk_bytes);
    if (!r->q || !r->k || !r->v || !r->iq || !r->ik || !r->iv || !r->o || !r->io || !r->lse ||
        !r->topk) {
        CHECK(0, "%s: io buffers", r->name);
        rig_free(r);
        return 0;
    }
    return 1;
}

static msa_layer_io rig_io(const rig *r, int32_t layer)
{
    msa_layer_io io;
    msa_layer_io_default(&io);
    io.q = r->q;
    io.k = r->k;
    io.v = r->v;
    io.o = r->o;
    io.lse = r->lse;
    if (r->sh.sparse[layer]) {
        io.idx_q = r->iq;
        io.idx_k = r->ik;
        io.topk = r->topk;
    }
    if (r->sh.value[layer]) {
        io.idx_v = r->iv;
        io.idx_o = r->io;
    }
    return io;
}

static void poison(rig *r)
{
    dev_fill(r, r->o, r->o_bytes, 0x5a);
    dev_fill(r, r->io, r->io_bytes, 0x6b);
    dev_fill(r, r->lse, r->lse_bytes, 0x7c);
    dev_fill(r, r->topk, r->topk_bytes, 0x8d);
}

static void outputs_free(outputs *out)
{
    for (int l = 0; l < out->layers; l++) {
        free(out->o[l]);
        free(out->io[l]);
        free(out->lse[l]);
        free(out->topk[l]);
    }
    memset(out, 0, sizeof *out);
}

/* Poisons the outputs, runs every layer of the plan's step and reads the
 * outputs of each layer back. */
static msa_status run_step(rig *r, msa_plan *plan, outputs *out)
{
    memset(out, 0, sizeof *out);
    for (int32_t l = 0; l < r->sh.layers; l++) {
        poison(r);
        msa_layer_io io = rig_io(r, l);
        msa_status st = msa_forward(r->ctx, plan, l, &io);
        if (st == MSA_OK)
            st = msa_synchronize(r->ctx);
        if (st != MSA_OK) {
            outputs_free(out);
            return st;
        }
        out->layers = l + 1;
        out->o[l] = dev_read(r, r->o, r->o_bytes);
        out->io[l] = dev_read(r, r->io, r->io_bytes);
        out->lse[l] = dev_read(r, r->lse, r->lse_bytes);
        out->topk[l] = dev_read(r, r->topk, r->topk_bytes);
    }
    return MSA_OK;
}

static int outputs_same(const rig *r, const outputs *a, const outputs *b)
{
    if (a->layers != b->layers)
        return 0;
    for (int l = 0; l < a->layers; l++)
        if (memcmp(a->o[l], b->o[l], r->o_bytes) || memcmp(a->io[l], b->io[l], r->io_bytes) ||
            memcmp(a->lse[l], b->lse[l], r->lse_bytes) ||
            memcmp(a->topk[l], b->topk[l], r->topk_bytes))
            return 0;
    return 1;
}

/* Counts the occurrences of `needle` in `hay`. */
static int occurrences(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* A message of the plan path names its call once ("<fn>: text"), and no
 * other prefix such as "plan: " follows. */
static int message_ok(const char *msg, const char *fn)
{
    size_t n = strlen(fn);
    return !strncmp(msg, fn, n) && msg[n] == ':' && msg[n + 1] == ' ' && msg[n + 2] != '\0' &&
           occurrences(msg, fn) == 1 && occurrences(msg, "plan: ") == 0;
}

/* ---- 1. the reported crash: forward after an update that ran out of memory */

static void test_oom_then_forward(msa_backend backend)
{
    /* Hq = Hkv = Hi = 4096, D = Di = 16, one sparse layer, K = 1, block 1,
     * one page of 256 tokens.  A step of kv_len 2^22 then needs Hi * 2^22
     * block scores per query token (64 GiB), more than the machine has. */
    static const uint8_t sparse[1] = {1}, value[1] = {0};
    shape sh = {4096, 4096, 16, 4096, 16, 1, 1, 1, sparse, value, 1, 256, 1};
    rig r;
    if (!rig_make(&r, backend, &sh))
        return;
    msa_plan *plan = NULL;
    msa_plan_params lim;
    msa_plan_params_default(&lim);
    msa_status st = msa_plan_create(r.ctx, r.model, r.cache, &lim, &plan);
    if (st == MSA_ERR_UNSUPPORTED) {
        SKIP("%s: 4096 heads of dimension 16: %s", r.name, msa_context_last_error(r.ctx));
        rig_free(&r);
        return;
    }
    CHECK(st == MSA_OK, "%s: plan: %s", r.name, msa_context_last_error(r.ctx));
    if (!plan) {
        rig_free(&r);
        return;
    }
    int32_t q1 = 1, kv1 = 1, page0 = 0;
    msa_step a = {1, 1, &q1, &kv1, &page0, 1};
    CHECK(msa_plan_update(plan, &a, NULL) == MSA_OK, "%s: step (1, 1): %s", r.name,
          msa_context_last_error(r.ctx));
    outputs base, again;
    CHECK(run_step(&r, plan, &base) == MSA_OK, "%s: forward (1, 1): %s", r.name,
          msa_context_last_error(r.ctx));

    const int32_t kv_big = 1 << 22, pages = kv_big / 256;
    /* Every page id 0.  With q_len 0 the step writes nothing, so the shared
     * page is a valid step (SPEC section 10); it still needs the plan to grow
     * to a context of 2^22. */
    int32_t *table = calloc((size_t)pages, sizeof *table);
    int32_t q0 = 0;
    msa_step b = {1, 1, &q0, &kv_big, table, pages};
    st = msa_plan_update(plan, &b, NULL);
    if (st == MSA_OK) {
        SKIP("%s: this machine holds the step of kv_len 2^22; the injection tests cover the "
             "failure path",
             r.name);
    } else {
        CHECK(st == MSA_ERR_OUT_OF_MEMORY, "%s: kv_len 2^22: got %s (%s)", r.name,
              msa_status_name(st), msa_context_last_error(r.ctx));
        CHECK(message_ok(msa_context_last_error(r.ctx), "msa_plan_update"), "%s: message \"%s\"",
              r.name, msa_context_last_error(r.ctx));
        st = run_step(&r, plan, &again);
        CHECK(st == MSA_OK, "%s: forward after the failed update: %s", r.name,
              msa_context_last_error(r.ctx));
        CHECK(st == MSA_OK && outputs_same(&r, &base, &again),
              "%s: forward after the failed update differs from the previous step", r.name);
        if (st == MSA_OK)
            outputs_free(&again);
    }
    free(table);
    outputs_free(&base);
    msa_plan_free(plan);
    rig_free(&r);
}

/* ---- 2. injected failures at every allocation of a growing update --------- */

/* Two layers: dense, and sparse with an index value. */
static const uint8_t two_sparse[2] = {0, 1}, two_value[2] = {0, 1};
static const shape small_shape = {8, 2, 32, 2, 32, 16, 4, 2, two_sparse, two_value, 256, 16, 96};

/* Step A: two requests and a padding row. */
static int32_t a_q[2] = {3, 1}, a_kv[2] = {40, 17};
static int32_t a_table[2 * 3] = {0, 1, 2, 3, 4, -1};
static const msa_step step_a = {2, 5, a_q, a_kv, a_table, 3};

/* Step B: beyond every initial capacity of a growable plan (8 requests, 64
 * rows, kv_len 1024): 10 requests, 90 rows, kv_len 1100.  Each request
 * writes its last 8 positions into a page of its own. */
#define B_REQS 10
#define B_PPR 69
static int32_t b_q[B_REQS], b_kv[B_REQS], b_table[B_REQS * B_PPR];
static msa_step step_b;

static void make_step_b(void)
{
    for (int r = 0; r < B_REQS; r++) {
        b_q[r] = 8;
        b_kv[r] = 1100;
        for (int n = 0; n < B_PPR; n++)
            b_table[r * B_PPR + n] = n < B_PPR - 1 ? (r + n) % 100 : 100 + r;
    }
    step_b = (msa_step){B_REQS, 90, b_q, b_kv, b_table, B_PPR};
}

static void test_injected_growth(msa_backend backend)
{
    rig r;
    if (!rig_make(&r, backend, &small_shape))
        return;
    msa_plan *plan = NULL;
    CHECK(msa_plan_create(r.ctx, r.model, r.cache, NULL, &plan) == MSA_OK, "%s: plan: %s", r.name,
          msa_context_last_error(r.ctx));
    if (!plan) {
        rig_free(&r);
        return;
    }
    outputs base, again;
    CHECK(msa_plan_update(plan, &step_a, NULL) == MSA_OK, "%s: step A: %s", r.name,
          msa_context_last_error(r.ctx));
    if (run_step(&r, plan, &base) != MSA_OK) {
        CHECK(0, "%s: forward A: %s", r.name, msa_context_last_error(r.ctx));
        msa_plan_free(plan);
        rig_free(&r);
        return;
    }
    long n = 0;
    int failures = 0, bad_status = 0, bad_msg = 0, bad_forward = 0;
    msa_status st = MSA_ERR_OUT_OF_MEMORY;
    for (; n < 400; n++) {
        msa_test_fail_allocation(n);
        st = msa_plan_update(plan, &step_b, NULL);
        msa_test_fail_allocation(-1);
        if (st == MSA_OK)
            break;
        failures++;
        if (st != MSA_ERR_OUT_OF_MEMORY) {
            if (!bad_status++)
                CHECK(0, "%s: allocation %ld failed: got %s (%s)", r.name, n, msa_status_name(st),
                      msa_context_last_error(r.ctx));
            continue;
        }
        if (!message_ok(msa_context_last_error(r.ctx), "msa_plan_update") && !bad_msg++)
            CHECK(0, "%s: allocation %ld: message \"%s\"", r.name, n,
                  msa_context_last_error(r.ctx));
        st = run_step(&r, plan, &again);
        if (st != MSA_OK || !outputs_same(&r, &base, &again)) {
            if (!bad_forward++)
                CHECK(0, "%s: after failing allocation %ld the forward %s", r.name, n,
                      st != MSA_OK ? msa_context_last_error(r.ctx) : "differs from step A");
        }
        if (st == MSA_OK)
            outputs_free(&again);
    }
    CHECK(st == MSA_OK, "%s: step B never succeeded (%ld tries): %s", r.name, n,
          msa_context_last_error(r.ctx));
    CHECK(!bad_status && !bad_msg && !bad_forward,
          "%s: %d bad statuses, %d bad messages, %d bad forwards in %d failed updates", r.name,
          bad_status, bad_msg, bad_forward, failures);
    if (backend == MSA_BACKEND_CPU)
        CHECK(failures >= 10, "%s: only %d allocations of a growing update were injectable", r.name,
              failures);
    printf("%s: %d injected failures of a growing update, each left step A in place\n", r.name,
           failures);
    if (st == MSA_OK) {
        st = run_step(&r, plan, &again);
        CHECK(st == MSA_OK, "%s: forward B: %s", r.name, msa_context_last_error(r.ctx));
        if (st == MSA_OK)
            outputs_free(&again);
    }
    outputs_free(&base);
    msa_plan_free(plan);

    /* Plan creation under injection: fails cleanly (no plan, no leak). */
    int create_failures = 0, create_bad = 0;
    for (n = 0; n < 400; n++) {
        msa_plan *p2 = (msa_plan *)&n; /* must become NULL on failure */
        msa_test_fail_allocation(n);
        st = msa_plan_create(r.ctx, r.model, r.cache, NULL, &p2);
        msa_test_fail_allocation(-1);
        if (st == MSA_OK) {
            msa_plan_free(p2);
            break;
        }
        create_failures++;
        if ((st != MSA_ERR_OUT_OF_MEMORY || p2 != NULL ||
             !message_ok(msa_context_last_error(r.ctx), "msa_plan_create")) &&
            !create_bad++)
            CHECK(0, "%s: plan creation, allocation %ld failed: %s, \"%s\"", r.name, n,
                  msa_status_name(st), msa_context_last_error(r.ctx));
    }
    CHECK(st == MSA_OK && !create_bad, "%s: plan creation under injection (%d failures)", r.name,
          create_failures);
    rig_free(&r);
}

/* ---- 3. fixed limits: updates allocate nothing ------------------------------ */

static void test_fixed_no_alloc(msa_backend backend)
{
    rig r;
    if (!rig_make(&r, backend, &small_shape))
        return;
    msa_plan *plan = NULL;
    msa_plan_params lim = {B_REQS, 96, 1100, MSA_DTYPE_BF16, 0};
    CHECK(msa_plan_create(r.ctx, r.model, r.cache, &lim, &plan) == MSA_OK, "%s: fixed plan: %s",
          r.name, msa_context_last_error(r.ctx));
    if (!plan) {
        rig_free(&r);
        return;
    }
    outputs base, again;
    CHECK(msa_plan_update(plan, &step_a, NULL) == MSA_OK, "%s: fixed: step A: %s", r.name,
          msa_context_last_error(r.ctx));
    CHECK(run_step(&r, plan, &base) == MSA_OK, "%s: fixed: forward A: %s", r.name,
          msa_context_last_error(r.ctx));
    const msa_step *steps[3] = {&step_b, &step_a, &step_b};
    for (int i = 0; i < 3; i++) {
        /* The next allocation would fail; an update within the limits
         * makes none, so the armed failure is still pending afterwards. */
        msa_test_fail_allocation(0);
        msa_status st = msa_plan_update(plan, steps[i], NULL);
        int pending = msa_alloc_fault();
        msa_test_fail_allocation(-1);
        CHECK(st == MSA_OK, "%s: fixed: update %d with a failing allocation armed: %s", r.name, i,
              msa_context_last_error(r.ctx));
        CHECK(pending == 1, "%s: fixed: update %d allocated", r.name, i);
        if (steps[i] == &step_a) {
            st = run_step(&r, plan, &again);
            CHECK(st == MSA_OK && outputs_same(&r, &base, &again),
                  "%s: fixed: step A again differs: %s", r.name, msa_context_last_error(r.ctx));
            if (st == MSA_OK)
                outputs_free(&again);
        }
    }
    /* A rejected step (beyond the limits) keeps step B. */
    outputs b_out;
    CHECK(run_step(&r, plan, &b_out) == MSA_OK, "%s: fixed: forward B", r.name);
    int32_t q = 1, kv = 1101, t[B_PPR + 1] = {0};
    msa_step longer = {1, 1, &q, &kv, t, B_PPR + 1};
    CHECK(msa_plan_update(plan, &longer, NULL) == MSA_ERR_CAPACITY, "%s: fixed: beyond max_kv_len",
          r.name);
    CHECK(message_ok(msa_context_last_error(r.ctx), "msa_plan_update"), "%s: message \"%s\"",
          r.name, msa_context_last_error(r.ctx));
    msa_status st = run_step(&r, plan, &again);
    CHECK(st == MSA_OK && outputs_same(&r, &b_out, &again),
          "%s: fixed: step B not kept after a rejected step", r.name);
    if (st == MSA_OK)
        outputs_free(&again);
    outputs_free(&b_out);
    outputs_free(&base);
    msa_plan_free(plan);
    rig_free(&r);
}

/* ---- 4. forward before any update ------------------------------------------- */

static void expect_no_step(rig *r, msa_plan *plan, const char *when)
{
    unsigned char *o0, *lse0, *topk0, *io0;
    poison(r);
    o0 = dev_read(r, r->o, r->o_bytes);
    io0 = dev_read(r, r->io, r->io_bytes);
    lse0 = dev_read(r, r->lse, r->lse_bytes);
    topk0 = dev_read(r, r->topk, r->topk_bytes);
    for (int32_t l = 0; l < r->sh.layers; l++) {
        msa_layer_io io = rig_io(r, l);
        msa_status st = msa_forward(r->ctx, plan, l, &io);
        const char *msg = msa_context_last_error(r->ctx);
        CHECK(st == MSA_ERR_INVALID_ARGUMENT, "%s: forward %s, layer %d: got %s", r->name, when, l,
              msa_status_name(st));
        CHECK(strstr(msg, "no step") && strstr(msg, "msa_plan_update"), "%s: message \"%s\"",
              r->name, msg);
        double t[2];
        st = msa_bench_forward(r->ctx, plan, l, &io, 1, 0, 2, t);
        CHECK(st == MSA_ERR_INVALID_ARGUMENT, "%s: bench forward %s: got %s", r->name, when,
              msa_status_name(st));
    }
    msa_synchronize(r->ctx);
    unsigned char *o1 = dev_read(r, r->o, r->o_bytes), *io1 = dev_read(r, r->io, r->io_bytes),
                  *lse1 = dev_read(r, r->lse, r->lse_bytes),
                  *topk1 = dev_read(r, r->topk, r->topk_bytes);
    CHECK(!memcmp(o0, o1, r->o_bytes) && !memcmp(io0, io1, r->io_bytes) &&
              !memcmp(lse0, lse1, r->lse_bytes) && !memcmp(topk0, topk1, r->topk_bytes),
          "%s: forward %s wrote outputs", r->name, when);
    free(o0);
    free(io0);
    free(lse0);
    free(topk0);
    free(o1);
    free(io1);
    free(lse1);
    free(topk1);
}

static void test_forward_without_step(msa_backend backend)
{
    rig r;
    if (!rig_make(&r, backend, &small_shape))
        return;
    unsigned char *cache0 = dev_read(&r, msa_cache_plane_data(r.cache, 1, MSA_PLANE_K),
                                     msa_cache_plane_bytes(r.cache, 1, MSA_PLANE_K));
    msa_plan *plan = NULL;
    CHECK(msa_plan_create(r.ctx, r.model, r.cache, NULL, &plan) == MSA_OK, "%s: plan", r.name);
    if (plan) {
        expect_no_step(&r, plan, "on a new plan");
        /* A rejected first step leaves the plan without a step. */
        int32_t q = 2, kv = 1;
        msa_step bad = {1, 2, &q, &kv, a_table, 3};
        CHECK(msa_plan_update(plan, &bad, NULL) == MSA_ERR_INVALID_ARGUMENT, "%s: bad step",
              r.name);
        expect_no_step(&r, plan, "after a rejected first step");
        /* So does a first step that runs out of memory while growing. */
        msa_test_fail_allocation(0);
        msa_status st = msa_plan_update(plan, &step_b, NULL);
        msa_test_fail_allocation(-1);
        if (st == MSA_OK) {
            SKIP("%s: the backend allocates nothing through the injector", r.name);
        } else {
            CHECK(st == MSA_ERR_OUT_OF_MEMORY, "%s: injected failure: %s", r.name,
                  msa_status_name(st));
            expect_no_step(&r, plan, "after a first step that ran out of memory");
        }
        unsigned char *cache1 = dev_read(&r, msa_cache_plane_data(r.cache, 1, MSA_PLANE_K),
                                         msa_cache_plane_bytes(r.cache, 1, MSA_PLANE_K));
        CHECK(!memcmp(cache0, cache1, msa_cache_plane_bytes(r.cache, 1, MSA_PLANE_K)),
              "%s: a refused forward wrote the cache", r.name);
        free(cache1);
        /* An empty step is a step: the forward runs and writes nothing. */
        msa_step empty = {0, 0, NULL, NULL, NULL, 0};
        CHECK(msa_plan_update(plan, &empty, NULL) == MSA_OK, "%s: empty step", r.name);
        msa_layer_io io = rig_io(&r, 1);
        CHECK(msa_forward(r.ctx, plan, 1, &io) == MSA_OK, "%s: forward of an empty step: %s",
              r.name, msa_context_last_error(r.ctx));
    }
    free(cache0);
    msa_plan_free(plan);
    rig_free(&r);
}

/* ---- 5. capacities beyond what a plan can address ----------------------------- */

static void test_capacity_limits(msa_backend backend)
{
    rig r;
    if (!rig_make(&r, backend, &small_shape))
        return;
    msa_plan *plan = NULL;
    CHECK(msa_plan_create(r.ctx, r.model, r.cache, NULL, &plan) == MSA_OK, "%s: plan", r.name);
    if (!plan) {
        rig_free(&r);
        return;
    }
    outputs base, again;
    CHECK(msa_plan_update(plan, &step_a, NULL) == MSA_OK, "%s: step A", r.name);
    CHECK(run_step(&r, plan, &base) == MSA_OK, "%s: forward A", r.name);
    static const int64_t huge[] = {(INT64_C(1) << 40) + 1, INT64_MAX / 2 + 3, INT64_MAX};
    for (int i = 0; i < 3; i++) {
        msa_step s = {0, huge[i], NULL, NULL, NULL, 0};
        msa_status st = msa_plan_update(plan, &s, NULL);
        CHECK(st == MSA_ERR_CAPACITY, "%s: num_tokens %lld: got %s", r.name, (long long)huge[i],
              msa_status_name(st));
        CHECK(message_ok(msa_context_last_error(r.ctx), "msa_plan_update"), "%s: message \"%s\"",
              r.name, msa_context_last_error(r.ctx));
    }
    msa_status st = run_step(&r, plan, &again);
    CHECK(st == MSA_OK && outputs_same(&r, &base, &again),
          "%s: step A not kept after capacity errors", r.name);
    if (st == MSA_OK)
        outputs_free(&again);
    outputs_free(&base);
    msa_plan_free(plan);

    msa_plan_params lim = {0, (INT64_C(1) << 40) + 1, 0, MSA_DTYPE_BF16, 0};
    msa_plan *p2 = NULL;
    st = msa_plan_create(r.ctx, r.model, r.cache, &lim, &p2);
    CHECK(st == MSA_ERR_INVALID_ARGUMENT && !p2, "%s: max_tokens 2^40 + 1: got %s", r.name,
          msa_status_name(st));
    CHECK(message_ok(msa_context_last_error(r.ctx), "msa_plan_create"), "%s: message \"%s\"",
          r.name, msa_context_last_error(r.ctx));
    rig_free(&r);
}

/* The arithmetic behind the capacities, at the edges no test step reaches
 * without terabytes of request arrays. */
static void test_capacity_arithmetic(void)
{
    const int64_t M32 = MSA_PLAN_MAX_REQUESTS;
    CHECK(msa_capacity_grow(8, 5, M32) == 8, "no growth when it fits");
    CHECK(msa_capacity_grow(8, 9, M32) == 16, "doubling");
    CHECK(msa_capacity_grow(8, 100, M32) == 100, "jump to the need");
    CHECK(msa_capacity_grow(INT64_C(1) << 30, (INT64_C(1) << 30) + 1, M32) == M32,
          "2^30 requests grow to the int32 maximum, not past it: %lld",
          (long long)msa_capacity_grow(INT64_C(1) << 30, (INT64_C(1) << 30) + 1, M32));
    CHECK(msa_capacity_grow(M32 - 1, M32, M32) == M32, "growth to the maximum");
    CHECK(msa_capacity_grow(8, M32 + 1, M32) == -1, "need beyond the maximum");
    CHECK(msa_capacity_grow(INT64_MAX / 2 + 1, INT64_MAX, INT64_MAX) == INT64_MAX,
          "no signed overflow when doubling");
    size_t out = 7;
    CHECK(msa_size_mul(SIZE_MAX / 2, 2, &out) && out == SIZE_MAX - 1, "mul at the edge");
    out = 7;
    CHECK(!msa_size_mul(SIZE_MAX / 2 + 1, 2, &out) && out == 7, "mul overflow detected");
    CHECK(msa_size_mul(0, SIZE_MAX, &out) && out == 0, "mul by 0");
    CHECK(!msa_size_add(SIZE_MAX, 1, &out), "add overflow detected");
    CHECK(msa_size_add(SIZE_MAX - 1, 1, &out) && out == SIZE_MAX, "add at the edge");
    /* A block beyond the machine's memory is refused without asking malloc. */
    CHECK(msa_plan_malloc(SIZE_MAX / 2) == NULL, "absurd plan allocation refused");
    void *p = msa_plan_aligned_alloc(1);
    CHECK(p && ((uintptr_t)p & 63) == 0, "aligned plan allocation");
    free(p);
}

/* With --crash only the reported crash scenario runs (its own CTest case). */
int main(int argc, char **argv)
{
    const int crash_only = argc > 1 && !strcmp(argv[1], "--crash");
    make_step_b();
    if (!crash_only)
        test_capacity_arithmetic();
    msa_backend backends[2] = {MSA_BACKEND_CPU, MSA_BACKEND_CUDA};
    for (int b = 0; b < 2; b++) {
        if (backends[b] == MSA_BACKEND_CUDA && !msa_backend_available(MSA_BACKEND_CUDA)) {
            printf("cuda: skipped (no CUDA backend or no device)\n");
            SKIP("cuda part: no CUDA backend or no device");
            continue;
        }
        if (!crash_only) {
            test_forward_without_step(backends[b]);
            test_injected_growth(backends[b]);
            test_fixed_no_alloc(backends[b]);
            test_capacity_limits(backends[b]);
        }
        test_oom_then_forward(backends[b]);
    }
    return check_finish();
}
