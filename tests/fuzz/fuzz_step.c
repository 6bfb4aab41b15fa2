/*
 * libFuzzer harness: derives a tiny model, cache and step from the bytes
 * (requests, q_len / kv_len, page tables, row count, limits, optional
 * outputs) and calls msa_plan_update; when the step is accepted, runs
 * msa_forward so the validator and the kernels see it.  Must never crash;
 * accepted steps with finite inputs must give finite outputs.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "msa/msa.h"
#include "fuzz_context.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_R = 6, MAX_PAGES_PER_REQ = 40, POOL = 48, HQ = 4, HKV = 2, D = 16, DI = 16 };

/* Reads the input front to back; zeros once it runs out. */
typedef struct reader {
    const uint8_t *p;
    size_t left;
} reader;

static uint8_t byte(reader *r)
{
    if (!r->left)
        return 0;
    r->left--;
    return *r->p++;
}

/* Small finite values from a byte-seeded generator. */
static void *tensor(msa_dtype dt, size_t n, uint32_t seed)
{
    size_t es = dt == MSA_DTYPE_FP32 ? 4 : 2;
    unsigned char *t = calloc(n ? n : 1, es);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        float x = (float)((int)(seed >> 20) - 2048) / 1024.0f; /* [-2, 2) */
        if (es == 4) {
            memcpy(t + 4 * i, &x, 4);
        } else {
            uint32_t u;
            memcpy(&u, &x, 4);
            /* bf16 truncation is exact enough; fp16 via the same grid: x has
             * at most 11 significant bits, so both encodings are exact. */
            uint16_t h;
            if (dt == MSA_DTYPE_BF16) {
                h = (uint16_t)(u >> 16);
            } else {
                int e = (int)((u >> 23) & 0xff);
                uint16_t s = (uint16_t)((u >> 16) & 0x8000u);
                h = e == 0 ? s
                           : (uint16_t)(s | (uint16_t)((e - 112) << 10) |
                                        (uint16_t)((u >> 13) & 0x3ffu));
            }
            memcpy(t + 2 * i, &h, 2);
        }
    }
    return t;
}

static int finite_rows(const void *o, msa_dtype dt, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x;
        if (dt == MSA_DTYPE_FP32) {
            memcpy(&x, (const char *)o + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, (const char *)o + 2 * i, 2);
            uint16_t expo = dt == MSA_DTYPE_BF16 ? (uint16_t)(h & 0x7f80u)
                                                 : (uint16_t)(h & 0x7c00u);
            x = expo == (dt == MSA_DTYPE_BF16 ? 0x7f80u : 0x7c00u) ? NAN : 0.0f;
        }
        if (!isfinite(x))
            return 0;
    }
    return 1;
}

static void run(reader *in)
{
    msa_context *ctx = fuzz_context();
    const uint8_t shape = byte(in), flags = byte(in);

    /* Model: a few valid shapes, sometimes an invalid one on purpose. */
    static const int32_t his[4] = {1, 2, 4, 3};
    static const int32_t blocks[4] = {1, 2, 4, 8};
    static const int32_t pages[5] = {1, 2, 4, 8, 16};
    msa_model_config mc;
    msa_model_config_default(&mc);
    uint8_t sparse = (uint8_t)((shape & 1) != 0), value = (uint8_t)((shape & 2) != 0);
    mc.num_layers = 1;
    mc.num_q_heads = HQ;
    mc.num_kv_heads = HKV;
    mc.head_dim = D;
    mc.num_index_heads = his[(shape >> 2) & 3];
    mc.index_dim = DI;
    mc.block_size = blocks[(shape >> 4) & 3];
    mc.topk_blocks = 2 + ((shape >> 6) & 1);
    mc.init_blocks = (shape >> 7) & 1;
    mc.local_blocks = 1;
    mc.score_type = (flags & 1) ? MSA_SCORE_LSE : MSA_SCORE_MAX;
    mc.layer_sparse = &sparse;
    mc.layer_index_value = &value;
    msa_model *model = NULL;
    if (msa_model_create(ctx, &mc, &model) != MSA_OK)
        return;

    msa_cache_config cc;
    msa_cache_config_default(&cc);
    cc.num_pages = POOL;
    cc.page_size = pages[(flags >> 1) % 5];
    static const msa_dtype acts[3] = {MSA_DTYPE_BF16, MSA_DTYPE_FP32, MSA_DTYPE_FP16};
    const msa_dtype act = acts[(flags >> 4) % 3];
    cc.kv_dtype = cc.index_dtype = act;
    msa_cache *cache = NULL;
    msa_plan *plan = NULL;
    if (msa_cache_create(ctx, model, &cc, &cache) != MSA_OK)
        goto out;

    /* Step: lengths as signed bytes so negatives occur; tables with ids
     * slightly outside the pool and -1 holes. */
    int32_t q_len[MAX_R], kv_len[MAX_R], table[MAX_R * MAX_PAGES_PER_REQ];
    const int32_t R = byte(in) % (MAX_R + 1);
    int64_t sum = 0;
    for (int32_t r = 0; r < R; r++) {
        /* Kept small (q_len -32..31, kv_len < 160) so runs stay fast. */
        q_len[r] = (int8_t)byte(in) / 4;
        kv_len[r] = (int32_t)byte(in) / 2 + ((byte(in) & 1) ? q_len[r] : 0);
        if (q_len[r] > 0)
            sum += q_len[r];
    }
    for (int32_t i = 0; i < R * MAX_PAGES_PER_REQ; i++) {
        uint8_t b = byte(in);
        table[i] = b >= 250 ? (int32_t)b - 252 : b % (POOL + 2); /* -2..-1, 0..POOL+1 */
    }
    const int64_t rows = sum + (int8_t)byte(in) % 4;

    msa_plan_params lim;
    msa_plan_params_default(&lim);
    lim.act_dtype = act;
    if (flags & 0x80) {
        lim.max_requests = 1 + byte(in) % MAX_R;
        lim.max_tokens = 1 + byte(in);
        lim.max_kv_len = 1 + byte(in) * 2;
    }
    if (msa_plan_create(ctx, model, cache, &lim, &plan) != MSA_OK)
        goto out;
    msa_step step = {R, rows, q_len, kv_len, table, MAX_PAGES_PER_REQ};
    if (msa_plan_update(plan, &step, NULL) != MSA_OK)
        goto out;

    /* Accepted: run the layer on small finite inputs. */
    const size_t T = (size_t)rows, W = (size_t)msa_model_topk_width(model);
    const uint32_t seed = (uint32_t)shape * 2654435761u ^ flags;
    void *q = tensor(act, T * HQ * D, seed), *k = tensor(act, T * HKV * D, seed + 1);
    void *v = tensor(act, T * HKV * D, seed + 2), *iq = tensor(act, T * 4 * DI, seed + 3);
    void *ik = tensor(act, T * DI, seed + 4), *iv = tensor(act, T * DI, seed + 5);
    void *o = calloc(T * HQ * D + 1, 4), *io = calloc(T * 4 * DI + 1, 4);
    float *lse = calloc(T * HQ + 1, sizeof(float));
    int32_t *topk = calloc(T * HKV * W + 1, sizeof(int32_t));
    msa_layer_io x;
    msa_layer_io_default(&x);
    x.act_dtype = act;
    x.q = q;
    x.k = k;
    x.v = v;
    x.idx_q = sparse ? iq : NULL;
    x.idx_k = sparse ? ik : NULL;
    x.idx_v = sparse && value ? iv : NULL;
    x.o = o;
    x.idx_o = sparse && value ? io : NULL;
    x.lse = (flags & 0x40) ? lse : NULL;
    x.topk = (flags & 0x40) && sparse ? topk : NULL;
    /* The cache starts zero-filled, so pre-written entries are finite too. */
    x.write_cache = (flags & 0x20) ? 0 : 1;
    if (msa_forward(ctx, plan, 0, &x) == MSA_OK) {
        msa_synchronize(ctx);
        if (!finite_rows(o, act, T * HQ * D))
            abort();
        for (size_t i = 0; x.topk && i < T * HKV * W; i++)
            if (topk[i] < -1)
                abort();
    }
    free(q);
    free(k);
    free(v);
    free(iq);
    free(ik);
    free(iv);
    free(o);
    free(io);
    free(lse);
    free(topk);
out:
    msa_plan_free(plan);
    msa_cache_free(cache);
    msa_model_free(model);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader in = {data, size};
    run(&in);
    return 0;
}
