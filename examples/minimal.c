/* One prefill step of one sparse layer on the CPU (a complete program). */
#include <msa/msa.h>

#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                          \
    do {                                                                     \
        if ((call) != MSA_OK) {                                              \
            fprintf(stderr, "%s: %s\n", #call, msa_context_last_error(ctx)); \
            return 1;                                                        \
        }                                                                    \
    } while (0)

int main(void)
{
    msa_context *ctx;
    char err[256];
    if (msa_context_create(NULL, &ctx, err, sizeof err) != MSA_OK) { /* CPU, all cores */
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    msa_model_config mc;
    msa_model_config_default(&mc); /* M3: Hq 64, Hkv 4, D 128, Hi 4, Di 128, one sparse layer */
    msa_model *model;
    CHECK(msa_model_create(ctx, &mc, &model)); /* or msa_model_load_config_file */
    msa_cache_config cc;
    msa_cache_config_default(&cc); /* bf16 planes, 128-token pages */
    cc.num_pages = 8;
    msa_cache *cache;
    CHECK(msa_cache_create(ctx, model, &cc, &cache));
    msa_plan_params pp;
    msa_plan_params_default(&pp);
    pp.act_dtype = MSA_DTYPE_FP32; /* the activations' element type */
    msa_plan *plan;
    CHECK(msa_plan_create(ctx, model, cache, &pp, &plan));

    /* One request of 300 new tokens on an empty cache: pages 5, 2, 7. */
    enum { T = 300 };
    int32_t q_len[1] = {T}, kv_len[1] = {T}, pages[3] = {5, 2, 7};
    msa_step step = {1, T, q_len, kv_len, pages, 3};
    CHECK(msa_plan_update(plan, &step, NULL)); /* once per step, for every layer */

    size_t nq = (size_t)T * 64 * 128, nkv = (size_t)T * 4 * 128, ni = (size_t)T * 128;
    float *q = malloc(nq * sizeof *q), *o = malloc(nq * sizeof *o);
    float *k = malloc(nkv * sizeof *k), *v = malloc(nkv * sizeof *v);
    float *iq = malloc(4 * ni * sizeof *iq), *ik = malloc(ni * sizeof *ik);
    if (!q || !o || !k || !v || !iq || !ik)
        return 1;
    for (size_t i = 0; i < nq; i++)
        q[i] = (float)(i * 7919 % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < nkv; i++) {
        k[i] = (float)(i * 104729 % 1000) / 1000.0f - 0.5f;
        v[i] = (float)(i % 17 + 1) / 17.0f;
    }
    for (size_t i = 0; i < ni; i++) {
        ik[i] = (float)(i * 31 % 101) / 101.0f - 0.5f;
        for (int h = 0; h < 4; h++)
            iq[i * 4 + (size_t)h] = (float)((i + (size_t)h) * 13 % 97) / 97.0f - 0.5f;
    }

    msa_layer_io io;
    msa_layer_io_default(&io);
    io.act_dtype = MSA_DTYPE_FP32;
    io.q = q;
    io.k = k;
    io.v = v;
    io.idx_q = iq; /* sparse layers: the index branch */
    io.idx_k = ik;
    io.o = o;
    CHECK(msa_forward(ctx, plan, 0, &io)); /* writes the cache, then attends */
    printf("libmsa %s, layer 0 on %s: o[0] = %.6f, o[last] = %.6f\n", msa_version_string(),
           msa_plan_kernel_name(plan, 0), o[0], o[nq - 1]);

    free(q);
    free(o);
    free(k);
    free(v);
    free(iq);
    free(ik);
    msa_plan_free(plan);
    msa_cache_free(cache);
    msa_model_free(model);
    msa_context_free(ctx);
    return 0;
}
