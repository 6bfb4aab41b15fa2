/*
 * Bad input (SPEC 10): every entry point rejects it with a status and a
 * message, writes nothing (cache planes and outputs byte-identical
 * afterwards), and a rejected msa_plan_update leaves the previous plan
 * usable (the next forward reproduces the baseline bit for bit).  Steps
 * whose cache writes could collide are rejected like any other bad step;
 * a randomized cross-check compares that check with a naive reference.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "msa/msa.h"

enum { L = 2, HQ = 4, HKV = 2, D = 16, HI = 2, DI = 16, BLK = 4, K = 3, P = 4, PAGES = 8 };
enum { R = 2, ROWS = 4, STRIDE = 3 };

static msa_context *ctx;
static msa_model *model;
static msa_cache *cache;
static msa_plan *plan;

/* The valid step: request 0 has 2 new tokens of 6, request 1 one of 3, and
 * one padding row. */
static int32_t q_len[R] = {2, 1}, kv_len[R] = {6, 3};
static int32_t table[R * STRIDE] = {3, 5, -1, 1, -1, -1};
static msa_step good_step = {R, ROWS, q_len, kv_len, table, STRIDE};

/* Backend buffers: inputs, then outputs. */
static void *q, *k, *v, *iq, *ik, *iv, *o, *io_out, *lse, *topk;
static size_t o_bytes, idx_o_bytes, lse_bytes, topk_bytes;

/* Baseline outputs and cache of the valid step on layer 1. */
static unsigned char *base_o, *base_io, *base_lse, *base_topk, *base_cache[L * 4];

/* ---- helpers --------------------------------------------------------- */

static void *buffer(size_t bytes, unsigned seed)
{
    void *p = NULL;
    unsigned char *h = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) {
        seed = seed * 1103515245u + 12345u;
        h[i] = (unsigned char)(seed >> 16);
    }
    /* bf16 data: keep every element a small finite number. */
    for (size_t i = 1; i < bytes; i += 2)
        h[i] = (unsigned char)(0x3c + (h[i] & 1));
    if (msa_buffer_alloc(ctx, bytes, &p) != MSA_OK ||
        msa_copy_to_buffer(ctx, p, h, bytes) != MSA_OK)
        p = NULL;
    free(h);
    return p;
}

static unsigned char *read_back(const void *p, size_t bytes)
{
    unsigned char *h = malloc(bytes ? bytes : 1);
    msa_copy_from_buffer(ctx, h, p, bytes);
    return h;
}

static void fill(void *p, size_t bytes, unsigned char byte)
{
    unsigned char *h = malloc(bytes);
    memset(h, byte, bytes);
    msa_copy_to_buffer(ctx, p, h, bytes);
    free(h);
}

static msa_layer_io good_io(int32_t layer)
{
    msa_layer_io io;
    msa_layer_io_default(&io);
    io.act_dtype = MSA_DTYPE_BF16;
    io.q = q;
    io.k = k;
    io.v = v;
    io.o = o;
    io.lse = lse;
    if (layer == 1) {
        io.idx_q = iq;
        io.idx_k = ik;
        io.idx_v = iv;
        io.idx_o = io_out;
        io.topk = topk;
    }
    return io;
}

/* Snapshot of every byte a call could write. */
typedef struct snapshot {
    unsigned char *cache[L * 4], *o, *io, *lse, *topk;
} snapshot;

static void snap_take(snapshot *s)
{
    for (int i = 0; i < L * 4; i++) {
        size_t n = msa_cache_plane_bytes(cache, i / 4, (msa_plane)(i % 4));
        s->cache[i] = n ? read_back(msa_cache_plane_data(cache, i / 4, (msa_plane)(i % 4)), n)
                        : NULL;
    }
    s->o = read_back(o, o_bytes);
    s->io = read_back(io_out, idx_o_bytes);
    s->lse = read_back(lse, lse_bytes);
    s->topk = read_back(topk, topk_bytes);
}

static int same_bytes(const unsigned char *a, const void *buf, size_t n)
{
    unsigned char *b = read_back(buf, n);
    int same = !memcmp(a, b, n);
    free(b);
    return same;
}

/* 1 when nothing changed since the snapshot; frees it. */
static int snap_same(snapshot *s)
{
    int same = 1;
    for (int i = 0; i < L * 4; i++) {
        if (!s->cache[i])
            continue;
        size_t n = msa_cache_plane_bytes(cache, i / 4, (msa_plane)(i % 4));
        same &= same_bytes(s->cache[i], msa_cache_plane_data(cache, i / 4, (msa_plane)(i % 4)), n);
        free(s->cache[i]);
    }
    same &= same_bytes(s->o, o, o_bytes) && same_bytes(s->io, io_out, idx_o_bytes) &&
            same_bytes(s->lse, lse, lse_bytes) && same_bytes(s->topk, topk, topk_bytes);
    free(s->o);
    free(s->io);
    free(s->lse);
    free(s->topk);
    return same;
}

/* Leaves a known message on the context, so a rejected call must replace
 * it with its own. */
static const char *plant_message(void)
{
    static char planted[512];
    msa_model *m = NULL;
    msa_model_load_config_file(ctx, "/nonexistent/dir/planted-message.json", &m);
    msa_model_free(m);
    snprintf(planted, sizeof planted, "%s", msa_context_last_error(ctx));
    return planted;
}

static int fresh_message(const char *planted)
{
    const char *msg = msa_context_last_error(ctx);
    return msg && msg[0] && strcmp(msg, planted) != 0;
}

static int status_in(msa_status st, msa_status a, msa_status b)
{
    return st == a || st == b;
}

/* Both layers of the valid step; o and lse end up holding layer 1's. */
static msa_status run_both_layers(msa_plan *p)
{
    msa_layer_io io0 = good_io(0), io1 = good_io(1);
    msa_status st = msa_forward(ctx, p, 0, &io0);
    if (st == MSA_OK)
        st = msa_forward(ctx, p, 1, &io1);
    if (st == MSA_OK)
        st = msa_synchronize(ctx);
    return st;
}

/* Forward of the valid step reproduces the baseline exactly. */
static int plan_reproduces_baseline(void)
{
    if (run_both_layers(plan) != MSA_OK)
        return 0;
    int same = same_bytes(base_o, o, o_bytes) && same_bytes(base_io, io_out, idx_o_bytes) &&
               same_bytes(base_lse, lse, lse_bytes) && same_bytes(base_topk, topk, topk_bytes);
    for (int i = 0; i < L * 4; i++)
        if (base_cache[i])
            same &= same_bytes(base_cache[i],
                               msa_cache_plane_data(cache, i / 4, (msa_plane)(i % 4)),
                               msa_cache_plane_bytes(cache, i / 4, (msa_plane)(i % 4)));
    return same;
}

/* ---- setup ------------------------------------------------------------- */

static int setup(void)
{
    msa_context_params cp;
    msa_context_params_default(&cp);
    cp.num_threads = 2;
    if (msa_context_create(&cp, &ctx, NULL, 0) != MSA_OK)
        return -1;
    msa_model_config mc;
    msa_model_config_default(&mc);
    static const uint8_t sparse[L] = {0, 1}, value[L] = {0, 1};
    mc.num_layers = L;
    mc.num_q_heads = HQ;
    mc.num_kv_heads = HKV;
    mc.head_dim = D;
    mc.num_index_heads = HI;
    mc.index_dim = DI;
    mc.block_size = BLK;
    mc.topk_blocks = K;
    mc.layer_sparse = sparse;
    mc.layer_index_value = value;
    if (msa_model_create(ctx, &mc, &model) != MSA_OK)
        return -1;
    msa_cache_config cc;
    msa_cache_config_default(&cc);
    cc.num_pages = PAGES;
    cc.page_size = P;
    if (msa_cache_create(ctx, model, &cc, &cache) != MSA_OK)
        return -1;
    /* Non-zero pool contents, so any stray write shows. */
    for (int i = 0; i < L * 4; i++) {
        size_t n = msa_cache_plane_bytes(cache, i / 4, (msa_plane)(i % 4));
        if (!n)
            continue;
        void *tmp = buffer(n, 100u + (unsigned)i);
        unsigned char *h = read_back(tmp, n);
        msa_copy_to_buffer(ctx, msa_cache_plane_data(cache, i / 4, (msa_plane)(i % 4)), h, n);
        free(h);
        msa_buffer_free(ctx, tmp);
    }
    msa_plan_params lim;
    msa_plan_params_default(&lim);
    if (msa_plan_create(ctx, model, cache, &lim, &plan) != MSA_OK ||
        msa_plan_update(plan, &good_step, NULL) != MSA_OK)
        return -1;

    q = buffer(ROWS * HQ * D * 2, 1);
    k = buffer(ROWS * HKV * D * 2, 2);
    v = buffer(ROWS * HKV * D * 2, 3);
    iq = buffer(ROWS * HI * DI * 2, 4);
    ik = buffer(ROWS * DI * 2, 5);
    iv = buffer(ROWS * DI * 2, 6);
    o_bytes = ROWS * HQ * D * 2;
    idx_o_bytes = ROWS * HI * DI * 2;
    lse_bytes = ROWS * HQ * 4;
    topk_bytes = ROWS * HKV * K * 4;
    o = buffer(o_bytes, 7);
    io_out = buffer(idx_o_bytes, 8);
    lse = buffer(lse_bytes, 9);
    topk = buffer(topk_bytes, 10);
    if (!q || !k || !v || !iq || !ik || !iv || !o || !io_out || !lse || !topk)
        return -1;

    if (run_both_layers(plan) != MSA_OK)
        return -1;
    base_o = read_back(o, o_bytes);
    base_io = read_back(io_out, idx_o_bytes);
    base_lse = read_back(lse, lse_bytes);
    base_topk = read_back(topk, topk_bytes);
    for (int i = 0; i < L * 4; i++) {
        size_t n = msa_cache_plane_bytes(cache, i / 4, (msa_plane)(i % 4));
        base_cache[i] = n ? read_back(msa_cache_plane_data(cache, i / 4, (msa_plane)(i % 4)), n)
                          : NULL;
    }
    return 0;
}

/* ---- msa_plan_update ---------------------------------------------------- */

static void reject_step(const char *what, const msa_step *step, msa_status a, msa_status b)
{
    fill(o, o_bytes, 0x11);
    snapshot s;
    snap_take(&s);
    const char *planted = plant_message();
    msa_status st = msa_plan_update(plan, step, NULL);
    CHECK(status_in(st, a, b), "%s: got %s, want %s", what, msa_status_name(st),
          msa_status_name(a));
    CHECK(fresh_message(planted), "%s: no message of its own (\"%s\")", what,
          msa_context_last_error(ctx));
    CHECK(snap_same(&s), "%s: rejected update wrote something", what);
    CHECK(plan_reproduces_baseline(), "%s: previous plan no longer usable", what);
}

static void test_plan_update(void)
{
    const msa_status IA = MSA_ERR_INVALID_ARGUMENT, OOR = MSA_ERR_OUT_OF_RANGE;
    int32_t ql[R], kl[R], tb[R * STRIDE];
    msa_step s;
#define RESET()                        \
    do {                               \
        memcpy(ql, q_len, sizeof ql);  \
        memcpy(kl, kv_len, sizeof kl); \
        memcpy(tb, table, sizeof tb);  \
        s = good_step;                 \
        s.q_len = ql;                  \
        s.kv_len = kl;                 \
        s.page_table = tb;             \
    } while (0)

    reject_step("NULL step", NULL, IA, IA);
    CHECK(msa_plan_update(NULL, &good_step, NULL) == IA, "NULL plan");
    RESET();
    s.num_requests = -1;
    reject_step("negative num_requests", &s, IA, IA);
    RESET();
    s.q_len = NULL;
    reject_step("NULL q_len", &s, IA, IA);
    RESET();
    s.kv_len = NULL;
    reject_step("NULL kv_len", &s, IA, IA);
    RESET();
    s.page_table = NULL;
    reject_step("NULL page table", &s, IA, IA);
    RESET();
    ql[0] = -1;
    reject_step("negative q_len", &s, IA, IA);
    RESET();
    kl[1] = -1;
    ql[1] = 0;
    reject_step("negative kv_len", &s, IA, IA);
    RESET();
    ql[1] = 4;
    s.num_tokens = 8;
    reject_step("q_len > kv_len", &s, IA, IA);
    RESET();
    s.num_tokens = 2;
    reject_step("num_tokens < sum(q_len)", &s, IA, OOR);
    RESET();
    s.num_tokens = -1;
    reject_step("negative num_tokens", &s, IA, OOR);
    RESET();
    tb[1] = PAGES;
    reject_step("page id == num_pages", &s, OOR, OOR);
    RESET();
    tb[STRIDE] = 1000000;
    reject_step("page id far outside the pool", &s, OOR, OOR);
    RESET();
    tb[0] = -2;
    reject_step("page id -2", &s, OOR, IA);
    RESET();
    tb[1] = -1;
    reject_step("missing page for a position in use", &s, IA, OOR);
    RESET();
    tb[STRIDE] = -1;
    reject_step("missing page of a decode request", &s, IA, OOR);
#undef RESET

    /* Fixed limits: a step beyond them is a capacity error, and the plan
     * keeps its previous step. */
    msa_plan *fixed = NULL;
    msa_plan_params lim = {R, ROWS, 8, MSA_DTYPE_BF16, 0};
    CHECK(msa_plan_create(ctx, model, cache, &lim, &fixed) == MSA_OK && fixed, "fixed plan");
    if (!fixed)
        return;
    CHECK(msa_plan_update(fixed, &good_step, NULL) == MSA_OK, "fixed plan: valid step");
    int32_t q3[3] = {1, 1, 1}, kv3[3] = {2, 2, 2},
            t3[3 * STRIDE] = {0, -1, -1, 1, -1, -1, 2, -1, -1};
    msa_step big = {3, 3, q3, kv3, t3, STRIDE};
    const char *planted = plant_message();
    CHECK(msa_plan_update(fixed, &big, NULL) == MSA_ERR_CAPACITY, "too many requests");
    CHECK(fresh_message(planted), "capacity: message");
    msa_step rows = good_step;
    rows.num_tokens = ROWS + 1;
    CHECK(msa_plan_update(fixed, &rows, NULL) == MSA_ERR_CAPACITY, "too many rows");
    int32_t kv9[R] = {9, 3}, t9[R * STRIDE] = {3, 5, 6, 1, -1, -1};
    msa_step longer = {R, ROWS, q_len, kv9, t9, STRIDE};
    CHECK(msa_plan_update(fixed, &longer, NULL) == MSA_ERR_CAPACITY, "context beyond max_kv_len");
    CHECK(run_both_layers(fixed) == MSA_OK && same_bytes(base_o, o, o_bytes) &&
              same_bytes(base_topk, topk, topk_bytes),
          "fixed plan still runs its previous step");
    msa_plan_free(fixed);
}

/* ---- colliding cache writes (SPEC 10, last paragraph) -------------------- */

/* A step of up to 3 requests with its own table rows (stride 3). */
typedef struct small_step {
    int32_t n, ql[3], kl[3], tb[3 * STRIDE];
    int64_t rows;
} small_step;

static msa_step as_step(small_step *t)
{
    int64_t rows = 0;
    for (int32_t r = 0; r < t->n; r++)
        rows += t->ql[r];
    msa_step s = {t->n, t->rows > rows ? t->rows : rows, t->ql, t->kl, t->tb, STRIDE};
    return s;
}

/* Rejected with MSA_ERR_INVALID_ARGUMENT, nothing written, previous step
 * intact, and a message that names every part of `names`. */
static void reject_collision(const char *what, small_step *t, const char *const *names)
{
    msa_step s = as_step(t);
    reject_step(what, &s, MSA_ERR_INVALID_ARGUMENT, MSA_ERR_INVALID_ARGUMENT);
    msa_plan_update(plan, &s, NULL); /* once more for the message */
    const char *msg = msa_context_last_error(ctx);
    for (int i = 0; names[i]; i++)
        CHECK(strstr(msg, names[i]) != NULL, "%s: message \"%s\" does not say \"%s\"", what, msg,
              names[i]);
}

static void accept_step(const char *what, small_step *t)
{
    msa_step s = as_step(t);
    CHECK(msa_plan_update(plan, &s, NULL) == MSA_OK, "%s: rejected (%s)", what,
          msa_context_last_error(ctx));
}

static void test_collisions(void)
{
    /* (a) Two requests of 8 new tokens each, both writing page 3. */
    small_step a = {2, {8, 8}, {8, 8}, {3, 4, -1, 3, 6, -1}, 0};
    static const char *const a_names[] = {"request 0 writes page 3 (logical page 0)",
                                          "request 1 also writes (logical page 0)", NULL};
    reject_collision("two prefills write one page", &a, a_names);
    /* (b) A fresh prefill lands on the prefix page request 0 reads. */
    small_step b = {2, {1, 4}, {6, 4}, {3, 5, -1, 3, -1, -1}, 0};
    static const char *const b_names[] = {"request 1 writes page 3 (logical page 0)",
                                          "request 0 also uses (logical page 0)", NULL};
    reject_collision("a prefill writes another request's prefix page", &b, b_names);
    /* (c) One request maps every logical page to page 5 while it writes. */
    small_step c = {1, {2}, {10}, {5, 5, 5}, 0};
    static const char *const c_names[] = {"request 0 writes page 5 (logical page 2)",
                                          "request 0 also uses (logical page 0)", NULL};
    reject_collision("one request maps all its pages to one page", &c, c_names);
    small_step c2 = {1, {6}, {6}, {5, 5, -1}, 0};
    static const char *const c2_names[] = {"request 0 writes page 5 (logical page 0)",
                                           "request 0 also writes (logical page 1)", NULL};
    reject_collision("one request writes two logical pages of one page", &c2, c2_names);
    /* A decode row that writes the page two other requests read. */
    small_step d = {3, {0, 1, 1}, {4, 6, 3}, {3, -1, -1, 1, 4, -1, 3, -1, -1}, 0};
    static const char *const d_names[] = {"request 2 writes page 3 (logical page 0)",
                                          "request 0 also uses (logical page 0)", NULL};
    reject_collision("a decode row writes a page that a q_len 0 request holds", &d, d_names);
    /* The first new token of request 0 is the last slot of logical page 0. */
    small_step e = {2, {5, 1}, {8, 5}, {3, 5, -1, 3, 6, -1}, 0};
    static const char *const e_names[] = {"request 0 writes page 3 (logical page 0)",
                                          "request 1 also uses (logical page 0)", NULL};
    reject_collision("a write reaching back into a shared page by one slot", &e, e_names);
    /* The same collision on a plan with fixed limits, as a replayed CUDA
     * graph uses it: rejected, and the plan keeps its step. */
    msa_plan *fixed = NULL;
    msa_plan_params lim = {3, 16, 12, MSA_DTYPE_BF16, 0};
    CHECK(msa_plan_create(ctx, model, cache, &lim, &fixed) == MSA_OK && fixed, "fixed plan");
    if (fixed) {
        CHECK(msa_plan_update(fixed, &good_step, NULL) == MSA_OK, "fixed plan: valid step");
        msa_step sa = as_step(&a);
        CHECK(msa_plan_update(fixed, &sa, NULL) == MSA_ERR_INVALID_ARGUMENT,
              "fixed plan: colliding step rejected");
        fill(o, o_bytes, 0x44);
        CHECK(run_both_layers(fixed) == MSA_OK && same_bytes(base_o, o, o_bytes) &&
                  same_bytes(base_topk, topk, topk_bytes),
              "fixed plan still runs its previous step");
        msa_plan_free(fixed);
    }

    /* Allowed: pages shared only where nobody writes. */
    small_step ok1 = {2, {1, 1}, {6, 6}, {3, 5, -1, 3, 6, -1}, 0};
    accept_step("shared read-only prefix page of two decode rows", &ok1);
    small_step ok2 = {3, {1, 1, 1}, {12, 6, 3}, {0, 1, 2, 0, 4, -1, 6, -1, -1}, 0};
    accept_step("decode rows each writing their own last page", &ok2);
    small_step ok3 = {3, {0, 0, 1}, {8, 8, 6}, {3, 5, -1, 3, 5, -1, 3, 6, -1}, 0};
    accept_step("q_len 0 requests sharing pages with a reader", &ok3);
    small_step ok4 = {2, {4, 1}, {8, 5}, {3, 5, -1, 3, 6, -1}, 0};
    accept_step("a write that starts exactly at a page boundary after a shared page", &ok4);
    small_step ok5 = {2, {1, 0}, {4, 0}, {3, 3, 3, 3, 3, 3}, 0};
    accept_step("entries beyond ceil(kv_len / P) and kv_len 0 requests are not used", &ok5);
    small_step ok6 = {2, {1, 1}, {4, 4}, {3, -1, -1, 4, -1, -1}, 0};
    accept_step("repeated accepted updates leave no marks behind", &ok6);
    accept_step("repeated accepted updates leave no marks behind", &ok6);
    int32_t zero[2] = {0, 0};
    msa_step empty = {2, 0, zero, zero, NULL, 0};
    CHECK(msa_plan_update(plan, &empty, NULL) == MSA_OK,
          "requests with kv_len 0 and no page table: %s", msa_context_last_error(ctx));
    CHECK(msa_plan_update(plan, &good_step, NULL) == MSA_OK, "back to the valid step");
    CHECK(plan_reproduces_baseline(), "valid step reproduces the baseline after the collisions");
}

/* Naive reference: every pair of used entries (r, n), (r2, n2) that map to
 * one page, at least one of them a write entry. */
static int naive_collides(int32_t nr, const int32_t *ql, const int32_t *kl, const int32_t *tb,
                          int64_t stride, int32_t page_size, int32_t *pages_out)
{
    int found = 0;
    for (int32_t r = 0; r < nr; r++)
        for (int64_t n = 0; n < (kl[r] + page_size - 1) / page_size; n++)
            for (int32_t r2 = 0; r2 < nr; r2++)
                for (int64_t n2 = 0; n2 < (kl[r2] + page_size - 1) / page_size; n2++) {
                    if (r == r2 && n == n2)
                        continue;
                    int32_t pg = tb[r * stride + n];
                    if (pg != tb[r2 * stride + n2])
                        continue;
                    int writes = ql[r] > 0 && n >= (kl[r] - ql[r]) / page_size;
                    if (writes) {
                        pages_out[pg] = 1;
                        found = 1;
                    }
                }
    return found;
}

/* The bitmap check against the naive reference on random small steps, on a
 * pool of more than two bitmap words, with a plan of fixed limits. */
static void test_collisions_random(void)
{
    enum { RP = 4, RPAGES = 150, RMAXR = 6, RSTRIDE = 5, RSTEPS = 600 };
    msa_cache_config cc;
    msa_cache_config_default(&cc);
    cc.num_pages = RPAGES;
    cc.page_size = RP;
    msa_cache *c2 = NULL;
    msa_plan *p2 = NULL;
    msa_plan_params lim = {RMAXR, RMAXR * RSTRIDE * RP, RSTRIDE * RP, MSA_DTYPE_BF16, 0};
    if (msa_cache_create(ctx, model, &cc, &c2) != MSA_OK ||
        msa_plan_create(ctx, model, c2, &lim, &p2) != MSA_OK) {
        CHECK(0, "random collisions: setup: %s", msa_context_last_error(ctx));
        msa_cache_free(c2);
        return;
    }
    uint64_t seed = 0x9e3779b97f4a7c15u;
#define RND(n)                                                    \
    ((seed = seed * 6364136223846793005u + 1442695040888963407u), \
     (int32_t)((seed >> 33) % (uint64_t)(n)))
    int accepted = 0, rejected = 0, mismatches = 0, wrong_page = 0;
    for (int it = 0; it < RSTEPS; it++) {
        int32_t nr = 1 + RND(RMAXR), ql[RMAXR], kl[RMAXR], tb[RMAXR * RSTRIDE];
        /* Page ids from a window whose width sets how often pages repeat. */
        int32_t width = 1 + RND(3 * RMAXR * RSTRIDE), base = RND(RPAGES - width + 1);
        int64_t rows = 0;
        for (int32_t r = 0; r < nr; r++) {
            kl[r] = RND(RSTRIDE * RP + 1);
            int mode = RND(4); /* q_len 0, decode, or anything up to kv_len */
            ql[r] = mode == 0 ? 0 : mode == 1 ? (kl[r] > 0) : RND(kl[r] + 1);
            rows += ql[r];
            for (int32_t n = 0; n < RSTRIDE; n++)
                tb[r * RSTRIDE + n] = base + RND(width);
        }
        int32_t naive_pages[RPAGES] = {0};
        int want_reject = naive_collides(nr, ql, kl, tb, RSTRIDE, RP, naive_pages);
        msa_step s = {nr, rows, ql, kl, tb, RSTRIDE};
        msa_status st = msa_plan_update(p2, &s, NULL);
        if (st != (want_reject ? MSA_ERR_INVALID_ARGUMENT : MSA_OK)) {
            if (mismatches++ < 5)
                CHECK(0, "random step %d: got %s, naive reference says %s (%s)", it,
                      msa_status_name(st), want_reject ? "collision" : "none",
                      msa_context_last_error(ctx));
            continue;
        }
        if (!want_reject) {
            accepted++;
            continue;
        }
        rejected++;
        int pg = -1;
        const char *w = strstr(msa_context_last_error(ctx), "writes page ");
        if (!w || sscanf(w, "writes page %d", &pg) != 1 || pg < 0 || pg >= RPAGES ||
            !naive_pages[pg])
            if (wrong_page++ < 5)
                CHECK(0, "random step %d: message names no colliding page: %s", it,
                      msa_context_last_error(ctx));
    }
#undef RND
    CHECK(mismatches == 0, "random steps: %d of %d disagree with the naive reference", mismatches,
          RSTEPS);
    CHECK(wrong_page == 0, "random steps: %d messages name a page that does not collide",
          wrong_page);
    CHECK(accepted >= RSTEPS / 5 && rejected >= RSTEPS / 5,
          "random steps: both outcomes common (accepted %d, rejected %d)", accepted, rejected);
    msa_plan_free(p2);
    msa_cache_free(c2);
}

/* ---- msa_forward ------------------------------------------------------------ */

static void reject_forward(const char *what, msa_context *c, msa_plan *p, int32_t layer,
                           const msa_layer_io *io, msa_status a, msa_status b)
{
    fill(o, o_bytes, 0x22);
    fill(lse, lse_bytes, 0x33);
    snapshot s;
    snap_take(&s);
    const char *planted = plant_message();
    msa_status st = msa_forward(c, p, layer, io);
    CHECK(status_in(st, a, b), "%s: got %s, want %s", what, msa_status_name(st),
          msa_status_name(a));
    if (c)
        CHECK(fresh_message(planted), "%s: no message of its own (\"%s\")", what,
              msa_context_last_error(ctx));
    msa_synchronize(ctx); /* before the snapshot comparison, after the message */
    CHECK(snap_same(&s), "%s: rejected forward wrote something", what);
}

static void test_forward(void)
{
    const msa_status IA = MSA_ERR_INVALID_ARGUMENT, OOR = MSA_ERR_OUT_OF_RANGE,
                     UNS = MSA_ERR_UNSUPPORTED;
    msa_layer_io io = good_io(1);
    reject_forward("NULL context", NULL, plan, 1, &io, IA, IA);
    reject_forward("NULL plan", ctx, NULL, 1, &io, IA, IA);
    reject_forward("NULL io", ctx, plan, 1, NULL, IA, IA);
    reject_forward("layer -1", ctx, plan, -1, &io, OOR, OOR);
    reject_forward("layer == num_layers", ctx, plan, L, &io, OOR, OOR);

    struct {
        const char *what;
        size_t offset;
    } required[] = {
        {"o NULL", offsetof(msa_layer_io, o)},
        {"q NULL", offsetof(msa_layer_io, q)},
        {"k NULL while writing the cache", offsetof(msa_layer_io, k)},
        {"v NULL while writing the cache", offsetof(msa_layer_io, v)},
        {"idx_q NULL on a sparse layer", offsetof(msa_layer_io, idx_q)},
        {"idx_k NULL on a sparse layer", offsetof(msa_layer_io, idx_k)},
        {"idx_v NULL on an index-value layer", offsetof(msa_layer_io, idx_v)},
        {"idx_o NULL on an index-value layer", offsetof(msa_layer_io, idx_o)},
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        msa_layer_io bad = good_io(1);
        void *null_ptr = NULL;
        memcpy((char *)&bad + required[i].offset, &null_ptr, sizeof null_ptr);
        reject_forward(required[i].what, ctx, plan, 1, &bad, IA, IA);
    }
    /* The dense layer needs no q/o on the index side: o NULL still fails. */
    msa_layer_io dense = good_io(0);
    dense.o = NULL;
    reject_forward("o NULL on a dense layer", ctx, plan, 0, &dense, IA, IA);

    msa_layer_io bad = good_io(1);
    bad.act_dtype = MSA_DTYPE_FP8_E4M3;
    reject_forward("fp8 activations", ctx, plan, 1, &bad, UNS, IA);
    bad.act_dtype = MSA_DTYPE_NVFP4;
    reject_forward("nvfp4 activations", ctx, plan, 1, &bad, UNS, IA);
    bad.act_dtype = (msa_dtype)42;
    reject_forward("unknown act dtype", ctx, plan, 1, &bad, IA, UNS);
    /* The plan was made for bf16 activations: fp32 ones are refused. */
    bad.act_dtype = MSA_DTYPE_FP32;
    reject_forward("act dtype other than the plan's", ctx, plan, 1, &bad, IA, IA);

    /* What is not required may be absent. */
    dense = good_io(0);
    CHECK(msa_forward(ctx, plan, 0, &dense) == MSA_OK, "dense layer without index tensors: %s",
          msa_context_last_error(ctx));
    msa_layer_io pre = good_io(1);
    pre.write_cache = 0;
    pre.k = pre.v = pre.idx_k = pre.idx_v = NULL;
    pre.lse = NULL;
    pre.topk = NULL;
    snapshot s;
    snap_take(&s);
    free(s.o);
    free(s.io);
    free(s.lse);
    free(s.topk);
    CHECK(msa_forward(ctx, plan, 1, &pre) == MSA_OK && msa_synchronize(ctx) == MSA_OK,
          "write_cache = 0 without k/v/idx_k/idx_v: %s", msa_context_last_error(ctx));
    int same = 1;
    for (int i = 0; i < L * 4; i++) {
        if (!s.cache[i])
            continue;
        same &= same_bytes(s.cache[i], msa_cache_plane_data(cache, i / 4, (msa_plane)(i % 4)),
                           msa_cache_plane_bytes(cache, i / 4, (msa_plane)(i % 4)));
        free(s.cache[i]);
    }
    CHECK(same, "write_cache = 0 leaves the cache alone");
    CHECK(same_bytes(base_o, o, o_bytes), "write_cache = 0 on the cached step gives the same o");
}

/* ---- alignment ------------------------------------------------------------- */

/* Each tensor of msa_layer_io at an address that is not a multiple of its
 * element size (bf16: 2, lse and topk: 4) is rejected with a message that
 * names it, and nothing is written: not the misplaced tensor, not the other
 * outputs, not the cache.  The same tensor at the next aligned address
 * (aligned to its element size only, not to 4 or 16 bytes) gives the
 * baseline results. */
static void test_alignment(void)
{
    const msa_status IA = MSA_ERR_INVALID_ARGUMENT;
    struct {
        const char *name;
        size_t field;
        void *src;
        size_t bytes;
        size_t align;
        unsigned char *base; /* expected contents afterwards, outputs */
    } t[] = {
        {"q", offsetof(msa_layer_io, q), q, ROWS * HQ * D * 2, 2, NULL},
        {"k", offsetof(msa_layer_io, k), k, ROWS * HKV * D * 2, 2, NULL},
        {"v", offsetof(msa_layer_io, v), v, ROWS * HKV * D * 2, 2, NULL},
        {"idx_q", offsetof(msa_layer_io, idx_q), iq, ROWS * HI * DI * 2, 2, NULL},
        {"idx_k", offsetof(msa_layer_io, idx_k), ik, ROWS * DI * 2, 2, NULL},
        {"idx_v", offsetof(msa_layer_io, idx_v), iv, ROWS * DI * 2, 2, NULL},
        {"o", offsetof(msa_layer_io, o), o, o_bytes, 2, base_o},
        {"idx_o", offsetof(msa_layer_io, idx_o), io_out, idx_o_bytes, 2, base_io},
        {"lse", offsetof(msa_layer_io, lse), lse, lse_bytes, 4, base_lse},
        {"topk", offsetof(msa_layer_io, topk), topk, topk_bytes, 4, base_topk},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        void *mem = NULL;
        if (msa_buffer_alloc(ctx, t[i].bytes + 128, &mem) != MSA_OK) {
            CHECK(0, "%s: no buffer", t[i].name);
            continue;
        }
        unsigned char *contents = read_back(t[i].src, t[i].bytes);
        /* Misaligned: odd addresses, and for 4-byte elements 2 mod 4. */
        const size_t shifts[] = {1, 3, 2};
        const size_t nshift = t[i].align == 4 ? 3 : 2;
        for (size_t j = 0; j < nshift; j++) {
            char *at = (char *)mem + 64 - t[i].align + shifts[j];
            char what[96];
            snprintf(what, sizeof what, "%s at %zu mod 64", t[i].name, (size_t)(at - (char *)mem));
            /* inputs keep their data, outputs hold poison */
            if (t[i].base)
                fill(at, t[i].bytes, 0x5a);
            else
                msa_copy_to_buffer(ctx, at, contents, t[i].bytes);
            unsigned char *before = read_back(at, t[i].bytes);
            msa_layer_io bad = good_io(1);
            memcpy((char *)&bad + t[i].field, &at, sizeof at);
            fill(o, o_bytes, 0x22);
            fill(lse, lse_bytes, 0x33);
            snapshot s;
            snap_take(&s);
            const char *planted = plant_message();
            msa_status st = msa_forward(ctx, plan, 1, &bad);
            const char *msg = msa_context_last_error(ctx);
            char want[32];
            snprintf(want, sizeof want, "%s at", t[i].name);
            CHECK(st == IA, "%s: got %s, want %s", what, msa_status_name(st), msa_status_name(IA));
            CHECK(fresh_message(planted) && strstr(msg, want) && strstr(msg, "aligned"),
                  "%s: the message names the tensor and its alignment (\"%s\")", what, msg);
            char need[32];
            snprintf(need, sizeof need, "%zu bytes", t[i].align);
            CHECK(strstr(msg, need) != NULL, "%s: the message says %s (\"%s\")", what, need, msg);
            msa_synchronize(ctx);
            CHECK(snap_same(&s), "%s: rejected forward wrote something", what);
            CHECK(same_bytes(before, at, t[i].bytes), "%s: the misaligned tensor was written",
                  what);
            free(before);
        }
        /* Aligned to the element size only. */
        char *at = (char *)mem + 64 - t[i].align;
        if (t[i].base)
            fill(at, t[i].bytes, 0x5a);
        else
            msa_copy_to_buffer(ctx, at, contents, t[i].bytes);
        msa_layer_io good = good_io(1);
        memcpy((char *)&good + t[i].field, &at, sizeof at);
        msa_status st = msa_forward(ctx, plan, 1, &good);
        if (st == MSA_OK)
            st = msa_synchronize(ctx);
        CHECK(st == MSA_OK, "%s aligned to %zu bytes: %s (%s)", t[i].name, t[i].align,
              msa_status_name(st), msa_context_last_error(ctx));
        if (st == MSA_OK && t[i].base)
            CHECK(same_bytes(t[i].base, at, t[i].bytes), "%s aligned to %zu bytes: baseline values",
                  t[i].name, t[i].align);
        CHECK(plan_reproduces_baseline(), "%s: baseline after the aligned call", t[i].name);
        free(contents);
        msa_buffer_free(ctx, mem);
    }
    /* A tensor the call does not use is not checked: k at an odd address
     * with write_cache = 0. */
    void *mem = NULL;
    if (msa_buffer_alloc(ctx, 64, &mem) == MSA_OK) {
        msa_layer_io pre = good_io(1);
        pre.write_cache = 0;
        pre.k = (char *)mem + 1;
        CHECK(msa_forward(ctx, plan, 1, &pre) == MSA_OK && msa_synchronize(ctx) == MSA_OK,
              "unused k at an odd address: %s", msa_context_last_error(ctx));
        msa_buffer_free(ctx, mem);
    }

    /* msa_cache_wrap: every plane aligned to its element size (CPU). */
    msa_cache_config cc;
    msa_cache_config_default(&cc);
    cc.num_pages = 2;
    cc.page_size = P;
    void *planes[L * 4] = {0};
    void *plane_mem[L * 4] = {0};
    int ok = 1;
    for (int i = 0; i < L * 4; i++) {
        size_t n = msa_cache_plane_bytes(cache, i / 4, (msa_plane)(i % 4)) / (PAGES / 2);
        if (n && msa_buffer_alloc(ctx, n + 64, &plane_mem[i]) != MSA_OK)
            ok = 0;
        planes[i] = plane_mem[i] ? (char *)plane_mem[i] + 64 - 2 : NULL;
    }
    CHECK(ok, "wrap: plane buffers");
    msa_cache *c2 = NULL;
    if (ok) {
        CHECK(msa_cache_wrap(ctx, model, &cc, planes, &c2) == MSA_OK && c2,
              "wrap: planes aligned to 2 bytes (bf16): %s", msa_context_last_error(ctx));
        msa_cache_free(c2);
        for (int i = 0; i < L * 4; i++) {
            if (!planes[i])
                continue;
            planes[i] = (char *)planes[i] + 1;
            c2 = NULL;
            const char *pl = plant_message();
            msa_status st = msa_cache_wrap(ctx, model, &cc, planes, &c2);
            CHECK(st == IA && c2 == NULL, "wrap: plane %d at an odd address: %s", i,
                  msa_status_name(st));
            CHECK(fresh_message(pl) && strstr(msa_context_last_error(ctx), "aligned to 2 bytes"),
                  "wrap: plane %d: message (\"%s\")", i, msa_context_last_error(ctx));
            msa_cache_free(c2);
            planes[i] = (char *)planes[i] - 1;
        }
    }
    for (int i = 0; i < L * 4; i++)
        if (plane_mem[i])
            msa_buffer_free(ctx, plane_mem[i]);
}

/* msa_cache_wrap_strided: a vLLM-style pool ([pages][2][P][Hkv][D], index
 * planes [pages][2][P][Di]) is taken; strides that are negative, mixed
 * with zeros, overlapping, too large or misaligned are refused with a
 * message and no cache, as are quantized planes with strides. */
static void test_strided_wrap(void)
{
    const msa_status IA = MSA_ERR_INVALID_ARGUMENT;
    msa_cache_config cc;
    msa_cache_config_default(&cc);
    cc.num_pages = PAGES;
    cc.page_size = P;
    const int64_t half = (int64_t)P * HKV * D, ihalf = (int64_t)P * DI;
    void *kv = NULL, *idx = NULL;
    if (msa_buffer_alloc(ctx, (size_t)(PAGES * 2 * half) * 2, &kv) != MSA_OK ||
        msa_buffer_alloc(ctx, (size_t)(PAGES * 2 * ihalf) * 2, &idx) != MSA_OK) {
        CHECK(0, "strided wrap: buffers");
        return;
    }
    msa_plane_view views[L * 4];
    memset(views, 0, sizeof views);
    for (int l = 0; l < L; l++) {
        for (int h = 0; h < 2; h++)
            views[l * 4 + h] = (msa_plane_view){(char *)kv + h * half * 2, 2 * half, D, HKV * D};
        if (msa_model_layer_is_sparse(model, l))
            views[l * 4 + 2] = (msa_plane_view){idx, 2 * ihalf, -5 /* not read */, DI};
        if (msa_model_layer_has_index_value(model, l))
            views[l * 4 + 3] = (msa_plane_view){(char *)idx + ihalf * 2, 2 * ihalf, 0, DI};
    }
    msa_cache *c2 = NULL;
    msa_status st = msa_cache_wrap_strided(ctx, model, &cc, views, &c2);
    CHECK(st == MSA_OK && c2, "strided wrap: vLLM layout: %s", msa_context_last_error(ctx));
    if (c2) {
        /* From the base to the end of the last row: the last page's V rows
         * end half a page before the K plane's extent would. */
        const size_t want_k = (size_t)((PAGES - 1) * 2 * half + half) * 2;
        CHECK(msa_cache_plane_bytes(c2, 0, MSA_PLANE_K) == want_k,
              "strided wrap: K plane spans %zu bytes, want %zu",
              msa_cache_plane_bytes(c2, 0, MSA_PLANE_K), want_k);
        CHECK(msa_cache_plane_data(c2, 0, MSA_PLANE_V) == views[1].data,
              "strided wrap: V plane data");
        msa_cache_free(c2);
    }

    struct {
        const char *what, *message;
        int plane;
        int64_t page, head, token;
    } bad[] = {
        {"negative page stride", "must be positive", 0, -2 * half, D, HKV * D},
        {"zero token stride beside others", "must be positive", 1, 2 * half, D, 0},
        {"rows overlap (token stride < D)", "overlap", 0, 2 * half, P * D, D - 1},
        {"heads on the same rows", "overlap", 0, 2 * half, HKV * D, HKV * D},
        {"pages overlap", "overlap", 1, half - 1, D, HKV * D},
        {"index rows overlap", "overlap", 2, 2 * ihalf, 0, DI / 2},
        {"extent beyond 2^46 bytes", "2^46", 0, INT64_C(1) << 44, D, HKV * D},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        msa_plane_view w[L * 4];
        memcpy(w, views, sizeof w);
        const int idx_plane = bad[i].plane >= 2;
        const int layer = idx_plane && !msa_model_layer_is_sparse(model, 0) ? 1 : 0;
        msa_plane_view *pv = &w[layer * 4 + bad[i].plane];
        pv->page_stride = bad[i].page;
        pv->head_stride = bad[i].head;
        pv->token_stride = bad[i].token;
        c2 = NULL;
        const char *pl = plant_message();
        st = msa_cache_wrap_strided(ctx, model, &cc, w, &c2);
        CHECK(st == IA && c2 == NULL, "strided wrap: %s: %s", bad[i].what, msa_status_name(st));
        CHECK(fresh_message(pl) && strstr(msa_context_last_error(ctx), bad[i].message),
              "strided wrap: %s: message (\"%s\")", bad[i].what, msa_context_last_error(ctx));
        msa_cache_free(c2);
    }

    /* A plane at an odd address (bf16 elements). */
    msa_plane_view w[L * 4];
    memcpy(w, views, sizeof w);
    w[0].data = (char *)w[0].data + 1;
    c2 = NULL;
    st = msa_cache_wrap_strided(ctx, model, &cc, w, &c2);
    CHECK(st == IA && c2 == NULL && strstr(msa_context_last_error(ctx), "aligned"),
          "strided wrap: odd address: %s (%s)", msa_status_name(st), msa_context_last_error(ctx));

    /* Quantized planes take the library layout only. */
    msa_cache_config qc = cc;
    qc.kv_dtype = MSA_DTYPE_FP8_E4M3;
    c2 = NULL;
    st = msa_cache_wrap_strided(ctx, model, &qc, views, &c2);
    CHECK(st == MSA_ERR_UNSUPPORTED && c2 == NULL &&
              strstr(msa_context_last_error(ctx), "library layout"),
          "strided wrap: fp8 planes with strides: %s (%s)", msa_status_name(st),
          msa_context_last_error(ctx));

    /* All strides 0: the library layout, the same bytes as msa_cache_create's. */
    memset(w, 0, sizeof w);
    for (int i = 0; i < L * 4; i++)
        w[i].data = views[i].data;
    c2 = NULL;
    st = msa_cache_wrap_strided(ctx, model, &cc, w, &c2);
    CHECK(st == MSA_OK && c2, "strided wrap: zero strides: %s", msa_context_last_error(ctx));
    if (c2)
        CHECK(msa_cache_plane_bytes(c2, 0, MSA_PLANE_K) == (size_t)(PAGES * half) * 2,
              "strided wrap: zero strides: K plane of %zu bytes",
              msa_cache_plane_bytes(c2, 0, MSA_PLANE_K));
    msa_cache_free(c2);
    c2 = NULL;
    CHECK(msa_cache_wrap_strided(ctx, model, &cc, NULL, &c2) == IA && c2 == NULL,
          "strided wrap: NULL views");
    msa_buffer_free(ctx, kv);
    msa_buffer_free(ctx, idx);
}

/* ---- objects -------------------------------------------------------------- */

static void expect_fail(const char *what, msa_status st, msa_status a, msa_status b,
                        const char *planted)
{
    CHECK(status_in(st, a, b), "%s: got %s", what, msa_status_name(st));
    if (planted)
        CHECK(fresh_message(planted), "%s: no message of its own", what);
}

static void test_objects(void)
{
    const msa_status IA = MSA_ERR_INVALID_ARGUMENT, IC = MSA_ERR_INVALID_CONFIG,
                     OOR = MSA_ERR_OUT_OF_RANGE, UNS = MSA_ERR_UNSUPPORTED;
    msa_cache_config cc;
    msa_cache *c2;
    const char *pl;

    /* Caches. */
    static const int32_t bad_pages[] = {0, 3, 512, -4};
    for (size_t i = 0; i < 4; i++) {
        msa_cache_config_default(&cc);
        cc.num_pages = 4;
        cc.page_size = bad_pages[i];
        c2 = NULL;
        pl = plant_message();
        char what[64];
        snprintf(what, sizeof what, "page size %d", bad_pages[i]);
        expect_fail(what, msa_cache_create(ctx, model, &cc, &c2), IC, IA, pl);
        CHECK(c2 == NULL, "%s: no cache", what);
    }
    msa_cache_config_default(&cc);
    cc.num_pages = 0;
    c2 = NULL;
    pl = plant_message();
    expect_fail("zero pages", msa_cache_create(ctx, model, &cc, &c2), IC, IA, pl);
    cc.num_pages = -3;
    expect_fail("negative pages", msa_cache_create(ctx, model, &cc, &c2), IC, IA, NULL);
    cc.num_pages = 4;
    cc.kv_dtype = (msa_dtype)42;
    expect_fail("unknown kv dtype", msa_cache_create(ctx, model, &cc, &c2), IA, IC, NULL);
    cc.kv_dtype = MSA_DTYPE_BF16;
    cc.index_dtype = (msa_dtype)-1;
    expect_fail("unknown index dtype", msa_cache_create(ctx, model, &cc, &c2), IA, IC, NULL);
    CHECK(c2 == NULL, "no cache from bad configs");

    /* Quantized planes: supported, or refused as UNSUPPORTED with a message. */
    static const msa_dtype quant[] = {MSA_DTYPE_FP8_E4M3, MSA_DTYPE_NVFP4};
    for (int i = 0; i < 2; i++) {
        msa_cache_config_default(&cc);
        cc.num_pages = 4;
        cc.page_size = P;
        cc.kv_dtype = quant[i];
        c2 = NULL;
        pl = plant_message();
        msa_status st = msa_cache_create(ctx, model, &cc, &c2);
        if (st == MSA_OK) {
            CHECK(c2 != NULL, "%s cache", msa_dtype_name(quant[i]));
        } else {
            expect_fail(msa_dtype_name(quant[i]), st, UNS, UNS, pl);
            CHECK(c2 == NULL, "%s: no cache", msa_dtype_name(quant[i]));
        }
        msa_cache_free(c2);
    }

    msa_cache_config_default(&cc);
    cc.num_pages = 4;
    cc.page_size = P;
    expect_fail("cache: NULL model", msa_cache_create(ctx, NULL, &cc, &c2), IA, IA, NULL);
    expect_fail("cache: NULL config", msa_cache_create(ctx, model, NULL, &c2), IA, IA, NULL);
    expect_fail("cache: NULL out", msa_cache_create(ctx, model, &cc, NULL), IA, IA, NULL);
    expect_fail("wrap: NULL planes", msa_cache_wrap(ctx, model, &cc, NULL, &c2), IA, IA, NULL);
    void *planes[L * 4] = {0};
    expect_fail("wrap: missing plane", msa_cache_wrap(ctx, model, &cc, planes, &c2), IA, IA, NULL);

    /* Scales: layer out of range, non-positive or non-finite. */
    pl = plant_message();
    expect_fail("scales: layer 2", msa_cache_set_scales(cache, L, 1, 1, 1, 1), OOR, OOR, pl);
    expect_fail("scales: layer -1", msa_cache_set_scales(cache, -1, 1, 1, 1, 1), OOR, OOR, NULL);
    static const float bad_scale[] = {0.0f, -1.0f, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        pl = plant_message();
        expect_fail("scales: bad value", msa_cache_set_scales(cache, 1, 1, bad_scale[i], 1, 1), IA,
                    IA, pl);
        expect_fail("scales: bad index value",
                    msa_cache_set_scales(cache, 1, 1, 1, 1, bad_scale[i]), IA, IA, NULL);
    }

    /* Plans. */
    msa_plan *p2 = NULL;
    msa_plan_params lim;
    msa_plan_params_default(&lim);
    expect_fail("plan: NULL model", msa_plan_create(ctx, NULL, cache, &lim, &p2), IA, IA, NULL);
    expect_fail("plan: NULL cache", msa_plan_create(ctx, model, NULL, &lim, &p2), IA, IA, NULL);
    expect_fail("plan: NULL out", msa_plan_create(ctx, model, cache, &lim, NULL), IA, IA, NULL);
    lim.max_tokens = -1;
    pl = plant_message();
    expect_fail("plan: negative limit", msa_plan_create(ctx, model, cache, &lim, &p2), IA, IC, pl);
    CHECK(p2 == NULL, "no plan from bad arguments");
    msa_plan_params_default(&lim);
    lim.act_dtype = MSA_DTYPE_FP8_E4M3;
    expect_fail("plan: fp8 activations", msa_plan_create(ctx, model, cache, &lim, &p2), UNS, IA,
                NULL);
    CHECK(p2 == NULL, "no plan from an fp8 act_dtype");
    msa_plan_params_default(&lim);
    lim.max_q_len = -1;
    pl = plant_message();
    expect_fail("plan: negative max_q_len", msa_plan_create(ctx, model, cache, &lim, &p2), IA, IA,
                pl);
    CHECK(p2 == NULL, "no plan from a negative max_q_len");
    /* A plan of max_q_len 4 refuses a request of 5 new tokens and keeps
     * its previous step. */
    msa_plan_params_default(&lim);
    lim.max_q_len = 4;
    CHECK(msa_plan_create(ctx, model, cache, &lim, &p2) == MSA_OK, "plan with max_q_len 4: %s",
          msa_context_last_error(ctx));
    if (p2) {
        int32_t q4 = 4, q5 = 5, pages[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        msa_step s4 = {1, 4, &q4, &q4, pages, 8}, s5 = {1, 5, &q5, &q5, pages, 8};
        CHECK(msa_plan_update(p2, &s4, NULL) == MSA_OK, "max_q_len 4: a step of 4: %s",
              msa_context_last_error(ctx));
        pl = plant_message();
        expect_fail("plan: q_len above max_q_len", msa_plan_update(p2, &s5, NULL), MSA_ERR_CAPACITY,
                    MSA_ERR_CAPACITY, pl);
        msa_plan_free(p2);
        p2 = NULL;
    }

    /* Contexts. */
    msa_context_params cp;
    msa_context_params_default(&cp);
    msa_context *c3 = NULL;
    char err[256] = "";
    cp.num_threads = -1;
    expect_fail("context: negative threads", msa_context_create(&cp, &c3, err, sizeof err), IA, IA,
                NULL);
    CHECK(c3 == NULL && err[0], "context: NULL and a message");
    msa_context_params_default(&cp);
    cp.backend = (msa_backend)9;
    err[0] = 0;
    expect_fail("context: unknown backend", msa_context_create(&cp, &c3, err, sizeof err), IA, UNS,
                NULL);
    CHECK(c3 == NULL && err[0], "context: NULL and a message");
    msa_context_params_default(&cp);
    expect_fail("context: NULL out", msa_context_create(&cp, NULL, NULL, 0), IA, IA, NULL);
    msa_debug_options dbg;
    memset(&dbg, 0, sizeof dbg);
    dbg.cuda_num_sms = -2;
    msa_context_params_default(&cp);
    cp.debug = &dbg;
    err[0] = 0;
    expect_fail("context: negative debug option", msa_context_create(&cp, &c3, err, sizeof err), IA,
                IA, NULL);
    CHECK(c3 == NULL && err[0], "context: NULL and a message");
    dbg.cuda_num_sms = 0;
    dbg.cuda_no_prefill_wgmma = -1;
    expect_fail("context: negative prefill debug option",
                msa_context_create(&cp, &c3, err, sizeof err), IA, IA, NULL);
    CHECK(c3 == NULL, "context: NULL after a negative prefill debug option");
    dbg.cuda_no_prefill_wgmma = 0;
    CHECK(msa_context_create(&cp, &c3, NULL, 0) == MSA_OK && c3, "context: zeroed debug options");
    msa_context_free(c3);
    c3 = NULL;

    /* Memory helpers and benchmarks. */
    void *b = NULL;
    expect_fail("alloc: NULL out", msa_buffer_alloc(ctx, 16, NULL), IA, IA, NULL);
    unsigned char byte = 0;
    expect_fail("copy to NULL", msa_copy_to_buffer(ctx, NULL, &byte, 1), IA, IA, NULL);
    expect_fail("copy from NULL", msa_copy_from_buffer(ctx, &byte, NULL, 1), IA, IA, NULL);
    (void)b;
    double t[2];
    msa_layer_io io = good_io(1);
    expect_fail("bench: zero reps", msa_bench_forward(ctx, plan, 1, &io, 1, 0, 0, t), IA, IA, NULL);
    expect_fail("bench: NULL times", msa_bench_forward(ctx, plan, 1, &io, 1, 0, 2, NULL), IA, IA,
                NULL);
    expect_fail("bench: no io sets", msa_bench_forward(ctx, plan, 1, &io, 0, 0, 2, t), IA, IA,
                NULL);
    msa_layer_io bad = good_io(1);
    bad.o = NULL;
    expect_fail("bench: invalid io", msa_bench_forward(ctx, plan, 1, &bad, 1, 0, 2, t), IA, IA,
                NULL);
    expect_fail("bench: layer 5", msa_bench_forward(ctx, plan, 5, &io, 1, 0, 2, t), OOR, OOR, NULL);
    double stage_us[MSA_STAGE_COUNT];
    expect_fail("stages: zero reps", msa_bench_stages(ctx, plan, 1, &io, 1, 0, stage_us), IA, IA,
                NULL);
    expect_fail("stages: NULL times", msa_bench_stages(ctx, plan, 1, &io, 1, 2, NULL), IA, IA,
                NULL);
    expect_fail("stages: invalid io", msa_bench_stages(ctx, plan, 1, &bad, 1, 2, stage_us), IA, IA,
                NULL);
    expect_fail("stages: layer 5", msa_bench_stages(ctx, plan, 5, &io, 1, 2, stage_us), OOR, OOR,
                NULL);
    pl = plant_message();
    expect_fail("stages: CPU backend", msa_bench_stages(ctx, plan, 1, &io, 1, 2, stage_us), UNS,
                UNS, pl);
    CHECK(!strcmp(msa_stage_name(MSA_STAGE_PREFILL_INDEXER), "prefill_indexer") &&
              !strcmp(msa_stage_name(MSA_STAGE_COUNT), "?"),
          "stage names");
    CHECK(plan_reproduces_baseline(), "plan intact after all the rejected calls");
}

int main(void)
{
    if (setup() != 0) {
        CHECK(0, "setup failed: %s", ctx ? msa_context_last_error(ctx) : "no context");
        return check_finish();
    }
    CHECK(plan_reproduces_baseline(), "baseline reproducible");
    test_plan_update();
    test_collisions();
    test_collisions_random();
    test_forward();
    test_alignment();
    test_objects();
    test_strided_wrap();

    for (int i = 0; i < L * 4; i++)
        free(base_cache[i]);
    free(base_o);
    free(base_io);
    free(base_lse);
    free(base_topk);
    void *bufs[] = {q, k, v, iq, ik, iv, o, io_out, lse, topk};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        msa_buffer_free(ctx, bufs[i]);
    msa_plan_free(plan);
    msa_cache_free(cache);
    msa_model_free(model);
    msa_context_free(ctx);
    return check_finish();
}
