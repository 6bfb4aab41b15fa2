/*
 * Accuracy of quantized cache planes against a bf16 cache on the CPU, on
 * synthetic data shaped like real keys: per channel a mean that drifts
 * slowly along the sequence, a few heavy channels, plus noise.  For each
 * plane choice (main K/V and/or index K/V in fp8_e4m3 or nvfp4) one decode
 * step of an M3-shaped layer pair (a dense layer and a sparse layer) runs
 * over the same data; the program reports the relative L2 error of the
 * outputs and the overlap of the selected blocks with the bf16 cache's.
 *
 * The caches are filled through the public msa_quantize_rows helper, the
 * decode token through msa_forward's cache write.  Scales follow the data:
 * fp8 scale = amax / 448, nvfp4 global = amax / (6 * 448).
 *
 *   quant_accuracy [--context N] [--requests R] [--threads T]
 *
 * Exit: 0 when every plane choice stays within loose bounds (output error
 * and selection overlap), 1 otherwise.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/internal.h"
#include "testkit_internal.h"

enum { HQ = 64, HKV = 4, D = 128, HI = 4, DI = 128, B = 128, K = 16, P = 128, HEAVY = 4 };

typedef struct plane_choice {
    const char *name;
    msa_dtype kv, index;
    double max_err;     /* bound on the relative error of o, both layers */
    double min_overlap; /* bound on the mean selection overlap */
} plane_choice;

/* One stream of rows of `dim` channels: a mean per channel that drifts
 * by a small random walk, HEAVY channels ten times larger, unit noise. */
typedef struct stream {
    float mean[D > DI ? D : DI];
    int heavy[HEAVY];
    int nheavy; /* heavy channels in use, at most HEAVY */
    int dim;
} stream;

static void stream_init(stream *s, int dim, int nheavy, tk_rng *rng)
{
    s->dim = dim;
    s->nheavy = nheavy;
    for (int c = 0; c < dim; c++)
        s->mean[c] = 0.5f * tk_rng_gauss(rng);
    const int first = tk_rng_below(rng, dim); /* distinct channels */
    for (int h = 0; h < HEAVY; h++)
        s->heavy[h] = (first + 37 * h) % dim;
}

static void stream_next(stream *s, tk_rng *rng, float *row)
{
    for (int c = 0; c < s->dim; c++) {
        s->mean[c] += 0.02f * tk_rng_gauss(rng);
        row[c] = s->mean[c] + tk_rng_gauss(rng);
    }
    for (int h = 0; h < s->nheavy; h++)
        row[s->heavy[h]] *= 10.0f;
}

/* Everything one run needs, built from a seed so that every plane choice
 * sees the same numbers. */
typedef struct setup {
    int ctx_len, R;
    msa_context *ctx;
    msa_model *model;
} setup;

/* Writes a row into slot (page, head, off) of a plane through the public
 * helpers (quantized) or a bf16 conversion. */
static void put_row(msa_cache *cache, int layer, msa_plane pl, msa_dtype dt, float scale, int heads,
                    int dim, int page, int head, int off, const float *row)
{
    uint8_t *base = msa_cache_plane_data(cache, layer, pl);
    if (dt == MSA_DTYPE_BF16) {
        uint16_t *dst = (uint16_t *)base + (((size_t)page * heads + head) * P + off) * dim;
        for (int e = 0; e < dim; e++)
            dst[e] = tk_f32_to_bf16(row[e]);
        return;
    }
    const size_t region = dt == MSA_DTYPE_NVFP4 ? (size_t)P * dim / 2 + (size_t)P * dim / 16
                                                : (size_t)P * dim;
    uint8_t *r = base + ((size_t)page * heads + head) * region;
    void *codes = dt == MSA_DTYPE_NVFP4 ? r + (size_t)off * dim / 2 : r + (size_t)off * dim;
    void *gs = dt == MSA_DTYPE_NVFP4 ? r + (size_t)P * dim / 2 + (size_t)off * dim / 16 : NULL;
    msa_quantize_rows(NULL, dt, scale, row, MSA_DTYPE_FP32, 1, dim, codes, gs);
}

typedef struct run_out {
    float *o[2];   /* [R][HQ][D] per layer */
    int32_t *topk; /* [R][HKV][K] sparse layer */
    float amax[4]; /* largest |value| per plane kind (K, V, index K, index V) */
} run_out;

/* Fills a cache with ctx_len tokens per request, runs one decode token per
 * request on both layers. */
static int run_choice(const setup *su, msa_dtype kv, msa_dtype ix, const float scales[4],
                      run_out *out)
{
    const int R = su->R, pages = (su->ctx_len + 1 + P - 1) / P;
    msa_cache_config cc;
    msa_cache_config_default(&cc);
    cc.num_pages = (int64_t)R * pages;
    cc.page_size = P;
    cc.kv_dtype = kv;
    cc.index_dtype = ix;
    msa_cache *cache = NULL;
    if (msa_cache_create(su->ctx, su->model, &cc, &cache) != MSA_OK) {
        fprintf(stderr, "cache: %s\n", msa_context_last_error(su->ctx));
        return -1;
    }
    for (int l = 0; l < 2; l++)
        msa_cache_set_scales(cache, l, scales[0], scales[1], scales[2], scales[3]);

    /* Step rows: one token per request. */
    float *q = malloc(sizeof(float) * R * HQ * D), *k = malloc(sizeof(float) * R * HKV * D);
    float *v = malloc(sizeof(float) * R * HKV * D), *iq = malloc(sizeof(float) * R * HI * DI);
    float *ik = malloc(sizeof(float) * R * DI);
    float row[D > DI ? D : DI];
    for (int p = 0; p < 4; p++)
        out->amax[p] = 0;
    for (int r = 0; r < R; r++) {
        tk_rng rng = {0x616363ull + (uint64_t)r * 7919};
        stream ks[HKV], vs[HKV], iks;
        for (int g = 0; g < HKV; g++) {
            stream_init(&ks[g], D, HEAVY, &rng);
            stream_init(&vs[g], D, 0, &rng); /* values: no heavy channels */
        }
        stream_init(&iks, DI, HEAVY, &rng);
        for (int j = 0; j <= su->ctx_len; j++) {
            const int page = r * pages + j / P, off = j % P;
            for (int g = 0; g < HKV; g++) {
                for (int kind = 0; kind < 2; kind++) {
                    stream_next(kind ? &vs[g] : &ks[g], &rng, row);
                    for (int e = 0; e < D; e++)
                        out->amax[kind] = fmaxf(out->amax[kind], fabsf(row[e]));
                    if (j < su->ctx_len) {
                        for (int l = 0; l < 2; l++)
                            put_row(cache, l, kind ? MSA_PLANE_V : MSA_PLANE_K, kv, scales[kind],
                                    HKV, D, page, g, off, row);
                    } else {
                        memcpy((kind ? v : k) + ((size_t)r * HKV + g) * D, row, sizeof(float) * D);
                    }
                }
            }
            stream_next(&iks, &rng, row);
            for (int e = 0; e < DI; e++)
                out->amax[2] = fmaxf(out->amax[2], fabsf(row[e]));
            if (j < su->ctx_len)
                put_row(cache, 1, MSA_PLANE_INDEX_K, ix, scales[2], 1, DI, page, 0, off, row);
            else
                memcpy(ik + (size_t)r * DI, row, sizeof(float) * DI);
        }
        /* Queries: noise plus a share of the drifting key means, so that
         * scores depend on the keys' structure as in a trained model. */
        for (int h = 0; h < HQ; h++)
            for (int e = 0; e < D; e++)
                q[((size_t)r * HQ + h) * D + e] =
                    tk_rng_gauss(&rng) + 0.3f * ks[h / (HQ / HKV)].mean[e];
        for (int h = 0; h < HI; h++)
            for (int e = 0; e < DI; e++)
                iq[((size_t)r * HI + h) * DI + e] = 0.2f * tk_rng_gauss(&rng) + 0.1f * iks.mean[e];
    }

    /* bf16 activations. */
    const size_t nq = (size_t)R * HQ * D, nk = (size_t)R * HKV * D, niq = (size_t)R * HI * DI;
    uint16_t *q16 = malloc(nq * 2), *k16 = malloc(nk * 2), *v16 = malloc(nk * 2);
    uint16_t *iq16 = malloc(niq * 2), *ik16 = malloc((size_t)R * DI * 2), *o16 = malloc(nq * 2);
    for (size_t i = 0; i < nq; i++)
        q16[i] = tk_f32_to_bf16(q[i]);
    for (size_t i = 0; i < nk; i++) {
        k16[i] = tk_f32_to_bf16(k[i]);
        v16[i] = tk_f32_to_bf16(v[i]);
    }
    for (size_t i = 0; i < niq; i++)
        iq16[i] = tk_f32_to_bf16(iq[i]);
    for (size_t i = 0; i < (size_t)R * DI; i++)
        ik16[i] = tk_f32_to_bf16(ik[i]);

    int32_t *q_len = malloc(sizeof(int32_t) * R), *kv_len = malloc(sizeof(int32_t) * R);
    int32_t *table = malloc(sizeof(int32_t) * R * pages);
    for (int r = 0; r < R; r++) {
        q_len[r] = 1;
        kv_len[r] = su->ctx_len + 1;
        for (int n = 0; n < pages; n++)
            table[r * pages + n] = r * pages + n;
    }
    msa_step step = {R, R, q_len, kv_len, table, pages};
    msa_plan *plan = NULL;
    int rc = -1;
    if (msa_plan_create(su->ctx, su->model, cache, NULL, &plan) == MSA_OK &&
        msa_plan_update(plan, &step, NULL) == MSA_OK) {
        rc = 0;
        out->topk = malloc(sizeof(int32_t) * R * HKV * K);
        for (int l = 0; l < 2 && rc == 0; l++) {
            msa_layer_io io;
            msa_layer_io_default(&io);
            io.q = q16;
            io.k = k16;
            io.v = v16;
            io.idx_q = iq16;
            io.idx_k = ik16;
            io.o = o16;
            io.topk = l == 1 ? out->topk : NULL;
            if (msa_forward(su->ctx, plan, l, &io) != MSA_OK) {
                fprintf(stderr, "forward: %s\n", msa_context_last_error(su->ctx));
                rc = -1;
                break;
            }
            out->o[l] = malloc(sizeof(float) * nq);
            for (size_t i = 0; i < nq; i++)
                out->o[l][i] = tk_bf16_to_f32(o16[i]);
        }
    } else {
        fprintf(stderr, "plan: %s\n", msa_context_last_error(su->ctx));
    }
    msa_plan_free(plan);
    msa_cache_free(cache);
    free(q), free(k), free(v), free(iq), free(ik);
    free(q16), free(k16), free(v16), free(iq16), free(ik16), free(o16);
    free(q_len), free(kv_len), free(table);
    return rc;
}

static double rel_err(const float *a, const float *ref, size_t n)
{
    double d2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
        d2 += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        r2 += (double)ref[i] * ref[i];
    }
    return r2 > 0 ? sqrt(d2 / r2) : INFINITY;
}

/* Mean over (token, KV head) of |selected ∩ reference| / |reference|. */
static double overlap(const int32_t *a, const int32_t *ref, int rows)
{
    double sum = 0;
    for (int i = 0; i < rows; i++) {
        int n = 0, common = 0;
        for (int x = 0; x < K; x++) {
            if (ref[i * K + x] < 0)
                continue;
            n++;
            for (int y = 0; y < K; y++)
                common += a[i * K + y] == ref[i * K + x];
        }
        sum += n ? (double)common / n : 1.0;
    }
    return sum / rows;
}

static void free_out(run_out *o)
{
    free(o->o[0]);
    free(o->o[1]);
    free(o->topk);
    memset(o, 0, sizeof *o);
}

int main(int argc, char **argv)
{
    setup su = {8192, 4, NULL, NULL};
    int threads = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--context") == 0)
            su.ctx_len = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--requests") == 0)
            su.R = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--threads") == 0)
            threads = atoi(argv[i + 1]);
    }
    if (su.ctx_len < B * (K + 2) || su.R < 1) {
        fprintf(stderr, "usage: quant_accuracy [--context N >= %d] [--requests R] [--threads T]\n",
                B * (K + 2));
        return 2;
    }
    msa_context_params cp;
    msa_context_params_default(&cp);
    cp.num_threads = threads;
    if (msa_context_create(&cp, &su.ctx, NULL, 0) != MSA_OK)
        return 1;
    msa_model_config mc;
    msa_model_config_default(&mc);
    const uint8_t sparse[2] = {0, 1}, iv[2] = {0, 0};
    mc.num_layers = 2;
    mc.layer_sparse = sparse;
    mc.layer_index_value = iv;
    if (msa_model_create(su.ctx, &mc, &su.model) != MSA_OK)
        return 1;

    static const plane_choice choices[] = {
        {"kv fp8_e4m3", MSA_DTYPE_FP8_E4M3, MSA_DTYPE_BF16, 0.08, 0.999},
        {"kv nvfp4", MSA_DTYPE_NVFP4, MSA_DTYPE_BF16, 0.25, 0.999},
        {"index fp8_e4m3", MSA_DTYPE_BF16, MSA_DTYPE_FP8_E4M3, 0.08, 0.85},
        {"index nvfp4", MSA_DTYPE_BF16, MSA_DTYPE_NVFP4, 0.25, 0.85},
        {"both fp8_e4m3", MSA_DTYPE_FP8_E4M3, MSA_DTYPE_FP8_E4M3, 0.08, 0.85},
        {"both nvfp4", MSA_DTYPE_NVFP4, MSA_DTYPE_NVFP4, 0.25, 0.85},
        {"kv nvfp4, index fp8_e4m3", MSA_DTYPE_NVFP4, MSA_DTYPE_FP8_E4M3, 0.25, 0.85},
    };
    const float ones[4] = {1, 1, 1, 1};
    run_out ref;
    memset(&ref, 0, sizeof ref);
    if (run_choice(&su, MSA_DTYPE_BF16, MSA_DTYPE_BF16, ones, &ref) != 0)
        return 1;
    const size_t nq = (size_t)su.R * HQ * D;
    printf("context %d, %d requests, one decode token each; M3 layer shape; against a bf16 "
           "cache\n",
           su.ctx_len, su.R);
    printf("amax: K %.1f, V %.1f, index K %.1f\n", ref.amax[0], ref.amax[1], ref.amax[2]);
    printf("| planes | dense o error | sparse o error | top-K overlap |\n");
    printf("| --- | --- | --- | --- |\n");
    for (size_t c = 0; c < sizeof choices / sizeof choices[0]; c++) {
        const plane_choice *pc = &choices[c];
        float sc[4];
        for (int p = 0; p < 4; p++) {
            const float amax = ref.amax[p] > 0 ? ref.amax[p] : 1.0f;
            const msa_dtype dt = p < 2 ? pc->kv : pc->index;
            sc[p] = dt == MSA_DTYPE_FP8_E4M3 ? amax / 448.0f
                    : dt == MSA_DTYPE_NVFP4  ? amax / (6.0f * 448.0f)
                                             : 1.0f;
        }
        run_out got;
        memset(&got, 0, sizeof got);
        if (run_choice(&su, pc->kv, pc->index, sc, &got) != 0) {
            CHECK(0, "%s: run failed", pc->name);
            continue;
        }
        const double e0 = rel_err(got.o[0], ref.o[0], nq), e1 = rel_err(got.o[1], ref.o[1], nq);
        const double ov = overlap(got.topk, ref.topk, su.R * HKV);
        printf("| %s | %.2e | %.2e | %.4f |\n", pc->name, e0, e1, ov);
        CHECK(e0 < pc->max_err && e1 < pc->max_err, "%s: output error %.3g / %.3g above %.3g",
              pc->name, e0, e1, pc->max_err);
        CHECK(ov >= pc->min_overlap, "%s: selection overlap %.4f below %.4f", pc->name, ov,
              pc->min_overlap);
        free_out(&got);
    }
    free_out(&ref);
    msa_model_free(su.model);
    msa_context_free(su.ctx);
    return check_finish();
}
