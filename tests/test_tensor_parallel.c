/*
 * msa_model_config_for_rank: the rank's head counts and where its heads lie,
 * for M3 at every tensor-parallel size and for every small shape; refusals
 * that write nothing; and, on the CPU backend, one sparse layer run as the
 * full model and as its ranks, which must give the same outputs and the
 * same selections head for head.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "msa/msa.h"

static msa_context *ctx;

static msa_model_config shape(int32_t hq, int32_t hkv, int32_t hi)
{
    msa_model_config c;
    msa_model_config_default(&c);
    c.num_q_heads = hq;
    c.num_kv_heads = hkv;
    c.num_index_heads = hi;
    return c;
}

/* M3 (64 query, 4 KV, 4 index heads): every size that divides 64. */
static void test_m3(void)
{
    msa_model_config full = shape(64, 4, 4), r;
    msa_tp_shard sh;
    for (int32_t size = 1; size <= 64; size *= 2) {
        for (int32_t rank = 0; rank < size; rank++) {
            msa_status st = msa_model_config_for_rank(ctx, &full, rank, size, &r, &sh);
            CHECK(st == MSA_OK, "M3 rank %d of %d: %s %s", rank, size, msa_status_name(st),
                  msa_context_last_error(ctx));
            if (st != MSA_OK)
                continue;
            int32_t kv = size <= 4 ? 4 / size : 1;
            CHECK(r.num_q_heads == 64 / size && r.num_kv_heads == kv && r.num_index_heads == kv,
                  "M3 rank %d of %d: heads %d/%d/%d", rank, size, r.num_q_heads, r.num_kv_heads,
                  r.num_index_heads);
            CHECK(sh.q_head_begin == rank * (64 / size), "M3 rank %d of %d: q begin %d", rank, size,
                  sh.q_head_begin);
            int32_t rep = size <= 4 ? 1 : size / 4;
            CHECK(sh.kv_head_begin == rank * kv / rep && sh.kv_replicas == rep,
                  "M3 rank %d of %d: kv begin %d replicas %d", rank, size, sh.kv_head_begin,
                  sh.kv_replicas);
            CHECK(sh.index_head_begin == sh.kv_head_begin && sh.index_replicas == rep,
                  "M3 rank %d of %d: index begin %d replicas %d", rank, size, sh.index_head_begin,
                  sh.index_replicas);
            CHECK(r.head_dim == 128 && r.index_dim == 128 && r.topk_blocks == 16 &&
                      r.block_size == 128 && r.num_layers == 1,
                  "M3 rank %d of %d: other fields changed", rank, size);
        }
    }
    /* 128 ranks for 64 query heads. */
    msa_model_config sentinel;
    memset(&sentinel, 0x5a, sizeof sentinel);
    r = sentinel;
    msa_status st = msa_model_config_for_rank(ctx, &full, 0, 128, &r, NULL);
    CHECK(st == MSA_ERR_INVALID_CONFIG, "M3 at 128 ranks: %s", msa_status_name(st));
    CHECK(strstr(msa_context_last_error(ctx), "num_attention_heads (64)") != NULL,
          "M3 at 128 ranks: message '%s'", msa_context_last_error(ctx));
    CHECK(memcmp(&r, &sentinel, sizeof r) == 0, "a refused call wrote its output");
}

/* The index heads KV head g uses in a model of hkv KV and hi index heads. */
static void index_range(int32_t g, int32_t hkv, int32_t hi, int32_t *lo, int32_t *hi_out)
{
    if (hi >= hkv) {
        *lo = g * (hi / hkv);
        *hi_out = *lo + hi / hkv - 1;
    } else {
        *lo = *hi_out = g / (hkv / hi);
    }
}

/* Every shape with up to 24 query heads, every size up to 24: either a
 * refusal that writes nothing, or ranks whose heads tile the model and keep
 * its mappings. */
static void test_all_shapes(void)
{
    int ok = 0, refused = 0;
    for (int32_t hq = 1; hq <= 24; hq++)
        for (int32_t hkv = 1; hkv <= hq; hkv++)
            for (int32_t hi = 1; hi <= 24; hi++) {
                if (hq % hkv || (hi % hkv && hkv % hi))
                    continue;
                msa_model_config full = shape(hq, hkv, hi);
                for (int32_t size = 1; size <= 24; size++) {
                    int q_held[24] = {0}, kv_held[24] = {0}, ix_held[24] = {0};
                    int all_ok = 1;
                    for (int32_t rank = 0; rank < size; rank++) {
                        msa_model_config r;
                        memset(&r, 0x5a, sizeof r);
                        msa_model_config before = r;
                        msa_tp_shard sh;
                        msa_status st = msa_model_config_for_rank(ctx, &full, rank, size, &r, &sh);
                        if (st != MSA_OK) {
                            CHECK(st == MSA_ERR_INVALID_CONFIG && msa_context_last_error(ctx)[0],
                                  "%d/%d/%d at %d: %s without a message", hq, hkv, hi, size,
                                  msa_status_name(st));
                            CHECK(memcmp(&r, &before, sizeof r) == 0,
                                  "%d/%d/%d at %d: refused, but wrote", hq, hkv, hi, size);
                            CHECK(rank == 0 || !all_ok, "%d/%d/%d at %d: only rank %d refused", hq,
                                  hkv, hi, size, rank);
                            all_ok = 0;
                            continue;
                        }
                        CHECK(all_ok, "%d/%d/%d at %d: rank %d accepted after a refusal", hq, hkv,
                              hi, size, rank);
                        msa_model *m = NULL;
                        CHECK(msa_model_create(ctx, &r, &m) == MSA_OK,
                              "%d/%d/%d at %d rank %d: the rank's config is no model: %s", hq, hkv,
                              hi, size, rank, msa_context_last_error(ctx));
                        msa_model_free(m);
                        for (int32_t j = 0; j < r.num_q_heads; j++) {
                            int32_t q = sh.q_head_begin + j;
                            q_held[q]++;
                            /* The query head's KV head, in the full model and in the rank's. */
                            int32_t g_full = q / (hq / hkv);
                            int32_t g_rank =
                                sh.kv_head_begin + j / (r.num_q_heads / r.num_kv_heads);
                            CHECK(g_full == g_rank,
                                  "%d/%d/%d at %d rank %d: q head %d on KV %d, not %d", hq, hkv, hi,
                                  size, rank, q, g_rank, g_full);
                        }
                        for (int32_t g = 0; g < r.num_kv_heads; g++) {
                            kv_held[sh.kv_head_begin + g]++;
                            int32_t flo, fhi, rlo, rhi;
                            index_range(sh.kv_head_begin + g, hkv, hi, &flo, &fhi);
                            index_range(g, r.num_kv_heads, r.num_index_heads, &rlo, &rhi);
                            CHECK(flo == sh.index_head_begin + rlo &&
                                      fhi == sh.index_head_begin + rhi,
                                  "%d/%d/%d at %d rank %d: KV head %d selects with index heads "
                                  "%d..%d, not %d..%d",
                                  hq, hkv, hi, size, rank, sh.kv_head_begin + g,
                                  sh.index_head_begin + rlo, sh.index_head_begin + rhi, flo, fhi);
                        }
                        for (int32_t h = 0; h < r.num_index_heads; h++)
                            ix_held[sh.index_head_begin + h]++;
                        CHECK(sh.kv_replicas >= 1 && sh.index_replicas >= 1,
                              "%d/%d/%d at %d: replicas %d %d", hq, hkv, hi, size, sh.kv_replicas,
                              sh.index_replicas);
                    }
                    if (!all_ok) {
                        refused++;
                        continue;
                    }
                    ok++;
                    /* Query heads once each; KV and index heads replicas times each. */
                    msa_model_config r0;
                    msa_tp_shard s0;
                    msa_model_config_for_rank(ctx, &full, 0, size, &r0, &s0);
                    for (int32_t q = 0; q < hq; q++)
                        CHECK(q_held[q] == 1, "%d/%d/%d at %d: q head %d held %d times", hq, hkv,
                              hi, size, q, q_held[q]);
                    for (int32_t g = 0; g < hkv; g++)
                        CHECK(kv_held[g] == s0.kv_replicas,
                              "%d/%d/%d at %d: KV head %d held %d times", hq, hkv, hi, size, g,
                              kv_held[g]);
                    for (int32_t h = 0; h < hi; h++)
                        CHECK(ix_held[h] == s0.index_replicas,
                              "%d/%d/%d at %d: index head %d held %d times, not %d", hq, hkv, hi,
                              size, h, ix_held[h], s0.index_replicas);
                }
            }
    printf("shapes: %d splits accepted, %d refused\n", ok, refused);
    CHECK(ok > 1000 && refused > 1000, "too few cases: %d accepted, %d refused", ok, refused);
}

/* Shapes of the index mappings beside M3's. */
static void test_index_mappings(void)
{
    msa_model_config r;
    msa_tp_shard sh;
    /* Unions (8 index heads over 2 KV heads) at 4 ranks: each rank keeps the
     * 4 index heads of its (replicated) KV head. */
    msa_model_config full = shape(16, 2, 8);
    CHECK(msa_model_config_for_rank(ctx, &full, 3, 4, &r, &sh) == MSA_OK, "unions: %s",
          msa_context_last_error(ctx));
    CHECK(r.num_q_heads == 4 && r.num_kv_heads == 1 && r.num_index_heads == 4 &&
              sh.kv_head_begin == 1 && sh.index_head_begin == 4 && sh.kv_replicas == 2 &&
              sh.index_replicas == 2,
          "unions: %d/%d/%d kv %d index %d replicas %d %d", r.num_q_heads, r.num_kv_heads,
          r.num_index_heads, sh.kv_head_begin, sh.index_head_begin, sh.kv_replicas,
          sh.index_replicas);
    /* 8 KV heads over 2 index heads at 4 ranks: 2 KV heads, 1 index head. */
    full = shape(16, 8, 2);
    CHECK(msa_model_config_for_rank(ctx, &full, 3, 4, &r, &sh) == MSA_OK, "shared index: %s",
          msa_context_last_error(ctx));
    CHECK(r.num_kv_heads == 2 && r.num_index_heads == 1 && sh.kv_head_begin == 6 &&
              sh.index_head_begin == 1 && sh.kv_replicas == 1 && sh.index_replicas == 2,
          "shared index: %d/%d kv %d index %d replicas %d %d", r.num_kv_heads, r.num_index_heads,
          sh.kv_head_begin, sh.index_head_begin, sh.kv_replicas, sh.index_replicas);
    /* 12 KV heads over 3 index heads at 2 ranks: rank 0's 6 KV heads use
     * index heads 0,0,0,0,1,1, which no model of 6 KV and 2 index heads
     * maps. */
    full = shape(24, 12, 3);
    msa_status st = msa_model_config_for_rank(ctx, &full, 0, 2, &r, &sh);
    CHECK(st == MSA_ERR_INVALID_CONFIG, "12 KV over 3 index heads at 2 ranks: %s",
          msa_status_name(st));
    CHECK(strstr(msa_context_last_error(ctx), "cannot be split over 2 ranks") != NULL,
          "message '%s'", msa_context_last_error(ctx));
    /* 6 KV heads at 4 ranks: neither divides the other. */
    full = shape(24, 6, 6);
    st = msa_model_config_for_rank(ctx, &full, 0, 4, &r, &sh);
    CHECK(st == MSA_ERR_INVALID_CONFIG &&
              strstr(msa_context_last_error(ctx), "num_key_value_heads (6)") != NULL,
          "6 KV heads at 4 ranks: %s '%s'", msa_status_name(st), msa_context_last_error(ctx));
}

static void test_bad_arguments(void)
{
    msa_model_config full = shape(64, 4, 4), r;
    CHECK(msa_model_config_for_rank(NULL, &full, 0, 1, &r, NULL) == MSA_ERR_INVALID_ARGUMENT,
          "NULL context");
    CHECK(msa_model_config_for_rank(ctx, NULL, 0, 1, &r, NULL) == MSA_ERR_INVALID_ARGUMENT,
          "NULL config");
    CHECK(msa_model_config_for_rank(ctx, &full, 0, 1, NULL, NULL) == MSA_ERR_INVALID_ARGUMENT,
          "NULL output");
    const int32_t bad[][2] = {{0, 0}, {-1, 4}, {4, 4}, {0, -2}, {INT32_MAX, 2}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        msa_status st = msa_model_config_for_rank(ctx, &full, bad[i][0], bad[i][1], &r, NULL);
        CHECK(st == MSA_ERR_INVALID_ARGUMENT && strstr(msa_context_last_error(ctx), "rank"),
              "rank %d of %d: %s '%s'", bad[i][0], bad[i][1], msa_status_name(st),
              msa_context_last_error(ctx));
    }
    /* The full config is checked as msa_model_create checks it. */
    full.num_kv_heads = 5;
    msa_status st = msa_model_config_for_rank(ctx, &full, 0, 1, &r, NULL);
    CHECK(st == MSA_ERR_INVALID_CONFIG, "invalid full config: %s", msa_status_name(st));
}

/* ---- the full model against its ranks, on the CPU ---------------------- */

static uint32_t rng = 12345;
static float urand(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 16777216.0f - 0.5f;
}

typedef struct run_out {
    float *o;      /* [T][Hq][D] */
    int32_t *topk; /* [T][Hkv][W] */
    int32_t width;
} run_out;

enum { T = 48, D = 16, DI = 16 };

/* One prefill step of T tokens on layer 0 (sparse), fp32 activations. */
static int run(const msa_model_config *cfg, const float *q, const float *k, const float *v,
               const float *iq, const float *ik, run_out *out)
{
    msa_model *m = NULL;
    msa_cache *c = NULL;
    msa_plan *p = NULL;
    int rc = -1;
    msa_cache_config cc;
    msa_cache_config_default(&cc);
    cc.num_pages = 8;
    cc.page_size = 8;
    cc.kv_dtype = MSA_DTYPE_FP32;
    cc.index_dtype = MSA_DTYPE_FP32;
    msa_plan_params pp;
    msa_plan_params_default(&pp);
    pp.act_dtype = MSA_DTYPE_FP32;
    int32_t q_len = T, kv_len = T, pages[6] = {3, 1, 4, 0, 5, 2};
    msa_step step = {1, T, &q_len, &kv_len, pages, 6};
    if (msa_model_create(ctx, cfg, &m) != MSA_OK || msa_cache_create(ctx, m, &cc, &c) != MSA_OK ||
        msa_plan_create(ctx, m, c, &pp, &p) != MSA_OK || msa_plan_update(p, &step, NULL) != MSA_OK)
        goto done;
    out->width = msa_model_topk_width(m);
    out->o = calloc((size_t)T * (size_t)cfg->num_q_heads * D, sizeof(float));
    out->topk = calloc((size_t)T * (size_t)cfg->num_kv_heads * (size_t)out->width, sizeof(int32_t));
    if (!out->o || !out->topk)
        goto done;
    msa_layer_io io;
    msa_layer_io_default(&io);
    io.act_dtype = MSA_DTYPE_FP32;
    io.q = q;
    io.k = k;
    io.v = v;
    io.idx_q = iq;
    io.idx_k = ik;
    io.o = out->o;
    io.topk = out->topk;
    if (msa_forward(ctx, p, 0, &io) == MSA_OK)
        rc = 0;
done:
    if (rc)
        fprintf(stderr, "run: %s\n", msa_context_last_error(ctx));
    msa_plan_free(p);
    msa_cache_free(c);
    msa_model_free(m);
    return rc;
}

/* Rows [begin, begin + n) of heads of a [T][heads][dim] tensor. */
static float *slice(const float *x, int32_t heads, int32_t dim, int32_t begin, int32_t n)
{
    float *s = malloc((size_t)T * (size_t)n * (size_t)dim * sizeof *s);
    if (!s)
        return NULL;
    for (int32_t t = 0; t < T; t++)
        memcpy(s + ((size_t)t * (size_t)n) * (size_t)dim,
               x + ((size_t)t * (size_t)heads + (size_t)begin) * (size_t)dim,
               (size_t)n * (size_t)dim * sizeof *s);
    return s;
}

static void compare_ranks(int32_t hq, int32_t hkv, int32_t hi, int32_t size)
{
    msa_model_config full;
    msa_model_config_default(&full);
    full.num_q_heads = hq;
    full.num_kv_heads = hkv;
    full.num_index_heads = hi;
    full.head_dim = D;
    full.index_dim = DI;
    full.block_size = 4; /* 12 blocks, 3 kept: the selection matters */
    full.topk_blocks = 3;
    full.local_blocks = 1;
    size_t nq = (size_t)T * (size_t)hq * D, nkv = (size_t)T * (size_t)hkv * D;
    size_t niq = (size_t)T * (size_t)hi * DI, nik = (size_t)T * DI;
    float *q = malloc(nq * 4), *k = malloc(nkv * 4), *v = malloc(nkv * 4);
    float *iq = malloc(niq * 4), *ik = malloc(nik * 4);
    if (!q || !k || !v || !iq || !ik) {
        CHECK(0, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < nq; i++)
        q[i] = urand();
    for (size_t i = 0; i < nkv; i++) {
        k[i] = urand();
        v[i] = urand();
    }
    for (size_t i = 0; i < niq; i++)
        iq[i] = urand();
    for (size_t i = 0; i < nik; i++)
        ik[i] = urand();
    run_out whole = {0};
    if (run(&full, q, k, v, iq, ik, &whole) != 0) {
        CHECK(0, "%d/%d/%d: the full model did not run", hq, hkv, hi);
        goto done_whole;
    }
    for (int32_t rank = 0; rank < size; rank++) {
        msa_model_config rc;
        msa_tp_shard sh;
        if (msa_model_config_for_rank(ctx, &full, rank, size, &rc, &sh) != MSA_OK) {
            CHECK(0, "%d/%d/%d rank %d of %d: %s", hq, hkv, hi, rank, size,
                  msa_context_last_error(ctx));
            continue;
        }
        /* What the engine gives the rank: its slices of q, k, v and idx_q;
         * idx_k whole (one shared index key head). */
        float *rq = slice(q, hq, D, sh.q_head_begin, rc.num_q_heads);
        float *rk = slice(k, hkv, D, sh.kv_head_begin, rc.num_kv_heads);
        float *rv = slice(v, hkv, D, sh.kv_head_begin, rc.num_kv_heads);
        float *riq = slice(iq, hi, DI, sh.index_head_begin, rc.num_index_heads);
        run_out part = {0};
        if (rq && rk && rv && riq && run(&rc, rq, rk, rv, riq, ik, &part) == 0) {
            float worst = 0;
            int ids_differ = 0;
            for (int32_t t = 0; t < T; t++) {
                for (int32_t j = 0; j < rc.num_q_heads * D; j++) {
                    float a = part.o[(size_t)t * (size_t)rc.num_q_heads * D + (size_t)j];
                    float b =
                        whole.o[((size_t)t * (size_t)hq + (size_t)sh.q_head_begin) * D + (size_t)j];
                    worst = fmaxf(worst, fabsf(a - b));
                }
                for (int32_t g = 0; g < rc.num_kv_heads; g++)
                    ids_differ +=
                        memcmp(part.topk + ((size_t)t * (size_t)rc.num_kv_heads + (size_t)g) *
                                               (size_t)part.width,
                               whole.topk +
                                   ((size_t)t * (size_t)hkv + (size_t)(sh.kv_head_begin + g)) *
                                       (size_t)whole.width,
                               (size_t)part.width * sizeof(int32_t)) != 0;
            }
            CHECK(part.width == whole.width, "%d/%d/%d rank %d of %d: selection width %d, not %d",
                  hq, hkv, hi, rank, size, part.width, whole.width);
            CHECK(worst <= 1e-6f, "%d/%d/%d rank %d of %d: o differs by %g", hq, hkv, hi, rank,
                  size, (double)worst);
            CHECK(ids_differ == 0, "%d/%d/%d rank %d of %d: %d selections differ", hq, hkv, hi,
                  rank, size, ids_differ);
        } else {
            CHECK(0, "%d/%d/%d rank %d of %d did not run", hq, hkv, hi, rank, size);
        }
        free(part.o);
        free(part.topk);
        free(rq);
        free(rk);
        free(rv);
        free(riq);
    }
done_whole:
    free(whole.o);
    free(whole.topk);
done:
    free(q);
    free(k);
    free(v);
    free(iq);
    free(ik);
}

static void test_ranks_match_full_model(void)
{
    compare_ranks(8, 2, 2, 2);  /* M3's mapping, heads split */
    compare_ranks(8, 2, 2, 4);  /* M3's mapping, KV and index heads replicated */
    compare_ranks(8, 2, 4, 4);  /* unions, replicated */
    compare_ranks(16, 4, 2, 4); /* one index head for two KV heads */
}

int main(void)
{
    msa_context_params cp;
    msa_context_params_default(&cp);
    cp.num_threads = 2;
    char err[256];
    if (msa_context_create(&cp, &ctx, err, sizeof err) != MSA_OK) {
        fprintf(stderr, "context: %s\n", err);
        return 1;
    }
    test_m3();
    test_all_shapes();
    test_index_mappings();
    test_bad_arguments();
    test_ranks_match_full_model();
    msa_context_free(ctx);
    return check_finish();
}
