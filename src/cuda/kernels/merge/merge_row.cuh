/*
 * One output row of a split decode attention item: each split left a
 * normalized fp32 row and its LSE; the output is the LSE-weighted sum.  The
 * merge kernel (merge.cu) and the fused small-step decode kernel
 * (kernels/fused) call it with one warp per row.
 */
#ifndef MSA_CUDA_KERNELS_MERGE_MERGE_ROW_CUH
#define MSA_CUDA_KERNELS_MERGE_MERGE_ROW_CUH

#include "cuda/params.cuh"

/* Splits whose rows one lane loads at once (16 was measured on the H200:
 * no faster). */
#define MERGE_GROUP 8

/* Elements lane + 32 j of the rows of splits s0 .. s0 + MERGE_GROUP - 1
 * (zeros past nsplit or d). */
__device__ __forceinline__ void cu_merge_load(const float *p0, int64_t step, int32_t s0,
                                              int32_t nsplit, int32_t d, float (&x)[MERGE_GROUP][4])
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < MERGE_GROUP; ++u)
#pragma unroll
        for (int j = 0; j < 4; ++j)
            x[u][j] = s0 + u < nsplit && lane + 32 * j < d ? p0[(s0 + u) * step + lane + 32 * j]
                                                           : 0.0f;
}

/* Row rl of merge item it, by one warp. */
__device__ __forceinline__ void cu_merge_row(const cu_attn_params &params, const cu_merge_item &it,
                                             int32_t rl)
{
    const int lane = threadIdx.x & 31;
    const int32_t t0 = it.t0;
    const int32_t row = it.row0 + rl;
    const int32_t i = row / params.group;
    const int32_t hq = it.group * params.group + (row - i * params.group);
    const int64_t qrow = (int64_t)(t0 + i) * params.q_heads + hq;
    const float *p0 = params.partials + ((int64_t)it.part_base + rl) * params.partial_stride;
    const int64_t step = (int64_t)it.nrows * params.partial_stride;
    float M, wsum;
    if (it.nsplit <= 32 && params.head_dim <= 128) {
        /* One lane per split: the split LSEs load at once, and every
         * output element's loads over the splits are independent.
         * Eight splits' rows are loaded together before any is used,
         * the first eight beside the LSEs (they do not depend on them):
         * one round trip per eight splits, the first shared.  A split
         * with no keys (weight 0) is skipped, whatever its row holds. */
        float x[MERGE_GROUP][4];
        cu_merge_load(p0, step, 0, it.nsplit, params.head_dim, x);
        const float ls = lane < it.nsplit ? p0[lane * step + params.head_dim] : -INFINITY;
        M = cu_warp_max(ls);
        const float w = ls == -INFINITY ? 0.0f : expf(ls - M);
        wsum = cu_warp_sum(w);
        const float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int32_t s0 = 0; s0 < it.nsplit; s0 += MERGE_GROUP) {
            if (s0 > 0)
                cu_merge_load(p0, step, s0, it.nsplit, params.head_dim, x);
#pragma unroll
            for (int u = 0; u < MERGE_GROUP; ++u) {
                const float ws = __shfl_sync(0xffffffffu, w, (s0 + u) & 31);
                if (s0 + u < it.nsplit && ws != 0.0f)
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        acc[j] = fmaf(ws, x[u][j], acc[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (lane + 32 * j < params.head_dim)
                cu_store(params.out, params.act_dtype, qrow * params.head_dim + lane + 32 * j,
                         acc[j] * inv);
    } else {
        M = -INFINITY;
        for (int32_t s = 0; s < it.nsplit; ++s)
            M = fmaxf(M, p0[s * step + params.head_dim]);
        wsum = 0.0f;
        for (int32_t s = 0; s < it.nsplit; ++s) {
            const float ls = p0[s * step + params.head_dim];
            wsum += ls == -INFINITY ? 0.0f : expf(ls - M);
        }
        const float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
        for (int32_t d = lane; d < params.head_dim; d += 32) {
            float acc = 0.0f;
            for (int32_t s = 0; s < it.nsplit; ++s) {
                const float ls = p0[s * step + params.head_dim];
                if (ls != -INFINITY)
                    acc = fmaf(expf(ls - M), p0[s * step + d], acc);
            }
            cu_store(params.out, params.act_dtype, qrow * params.head_dim + d, acc * inv);
        }
    }
    if (params.lse && lane == 0)
        params.lse[qrow] = wsum > 0.0f ? M + logf(wsum) : -INFINITY;
}

#endif /* MSA_CUDA_KERNELS_MERGE_MERGE_ROW_CUH */
