/*
 * Last launch of an attention pass, two jobs for every CTA:
 *   merge         split decode attention: each split left a normalized fp32
 *                 row and its LSE; the output is the LSE-weighted sum.  One
 *                 warp per output row.
 *   prefill rows  the rows of prefill requests (rows_simt.cuh), which depend
 *                 only on the selection, not on the decode items.
 */
#include "cuda/kernels/attention/rows_simt.cuh"
#include "cuda/arch/launch.cuh"
#include "cuda/common/timeline.cuh"

#define MERGE_WARPS 8
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

__device__ __forceinline__ void cu_merge_role(const cu_attn_params &params, int cta, int nctas)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int32_t n_items = params.meta.hdr->n_merge[params.kind];
    const cu_merge_item *items = params.meta.merge[params.kind];
    /* Rows of all merge items enumerated item by item, CU_ROWS_PER_ITEM each. */
    const int64_t total = (int64_t)n_items * CU_ROWS_PER_ITEM;
    for (int64_t w = (int64_t)cta * MERGE_WARPS + warp; w < total;
         w += (int64_t)nctas * MERGE_WARPS) {
        const int32_t ii = (int32_t)(w / CU_ROWS_PER_ITEM);
        const int32_t rl = (int32_t)(w - (int64_t)ii * CU_ROWS_PER_ITEM);
        const cu_merge_item it = items[ii];
        if (rl >= it.nrows)
            continue;
        const int32_t t0 = it.t0;
        const int32_t row = it.row0 + rl;
        const int32_t i = row / params.group;
        const int32_t hq = it.group * params.group + (row - i * params.group);
        const int64_t qrow = (int64_t)(t0 + i) * params.q_heads + hq;
        cu_pdl_wait(); /* the attention's partial rows (at once after the first) */
        if (threadIdx.x == 0 && w == (int64_t)cta * MERGE_WARPS)
            CU_TL_MARK(params, CU_TL_MERGE, CU_TL_WAITED);
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
}

__global__ void __launch_bounds__(MERGE_WARPS * 32, 2)
    cu_merge_prefill_kernel(cu_attn_params params)
{
    cu_pdl_trigger();
    if (threadIdx.x == 0)
        CU_TL_MARK(params, CU_TL_MERGE, CU_TL_ENTRY);
    /* Both roles in every CTA: no CTAs that only check for absent work.
     * The merge reads its plan items before it waits for the partials. */
    cu_merge_role(params, blockIdx.x, gridDim.x);
    cu_pdl_wait(); /* the selection for the prefill rows; every CTA waits */
    if (!params.prefill_on_tensor_cores)
        cu_attn_prefill_role(params, blockIdx.x, gridDim.x, MERGE_WARPS);
    if (threadIdx.x == 0)
        CU_TL_MARK(params, CU_TL_MERGE, CU_TL_EXIT);
}

void cu_launch_merge_prefill(const cu_attn_params *params, const cu_plan_state *st, cudaStream_t s)
{
    cu_launch(cu_merge_prefill_kernel, st->sz.grid_merge, MERGE_WARPS * 32, 0, s, st->pdl, *params);
}
