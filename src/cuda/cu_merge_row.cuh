/*
 * The merge of one output row of a split decode item: each split left a
 * normalized fp32 row and its LSE (cu_rows_write, cu_attt_write_part); the
 * output row is their LSE-weighted sum.  One warp per row (merge.cu).
 *
 * The partials are read with ld.global.cg: the merge may read them while
 * the attention still runs (cu_att_merges), and L1 is not coherent.
 */
#ifndef MSA_CU_MERGE_ROW_CUH
#define MSA_CU_MERGE_ROW_CUH

#include "cu_attn.cuh"

/* Splits whose rows one lane loads at once (16 was measured on the H200:
 * no faster, bench/RESULTS.md v17). */
#define MERGE_GROUP 8

/* Which split items the merge kernel takes as soon as their splits are
 * written, not after the whole attention has ended: on a pass with
 * cu_attn.att_merge set (the Hopper attention), every split item.  The
 * attention counts each item's splits done (cu_attt_count_splits), the
 * merge waits for the count (cu_merge_wait_splits).  The one test both
 * kernels ask. */
__device__ __forceinline__ bool cu_att_merges(const cu_attn &A, int32_t nsplit)
{
    return A.att_merge && nsplit > 1;
}

/* Output row of row `row` (token * g + head in group) of a request whose
 * first token row is t0, KV head `group`. */
__device__ __forceinline__ int64_t cu_merge_qrow(const cu_attn &A, int32_t t0, int32_t group, int32_t row)
{
    const int32_t i = row / A.g;
    return (int64_t)(t0 + i) * A.hq_total + group * A.g + (row - i * A.g);
}

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
            x[u][j] = s0 + u < nsplit && lane + 32 * j < d ? __ldcg(p0 + (s0 + u) * step + lane + 32 * j) : 0.0f;
}

/* Row rl of the item whose partials start at row part_base (split s's rows
 * at part_base + s * nrows), into output row qrow. */
__device__ __forceinline__ void cu_merge_row(const cu_layer &L, const cu_attn &A, int32_t part_base,
                                             int32_t nrows, int32_t nsplit, int32_t rl, int64_t qrow)
{
    const int lane = threadIdx.x & 31;
    const float *p0 = L.part + ((int64_t)part_base + rl) * L.part_stride;
    const int64_t step = (int64_t)nrows * L.part_stride;
    float M, wsum;
    if (nsplit <= 32 && A.d <= 128) {
        /* One lane per split: the split LSEs load at once, and every
         * output element's loads over the splits are independent.
         * Eight splits' rows are loaded together before any is used,
         * the first eight beside the LSEs (they do not depend on them):
         * one round trip per eight splits, the first shared.  A split
         * with no keys (weight 0) is skipped, whatever its row holds. */
        float x[MERGE_GROUP][4];
        cu_merge_load(p0, step, 0, nsplit, A.d, x);
        const float ls = lane < nsplit ? __ldcg(p0 + lane * step + A.d) : -INFINITY;
        M = cu_warp_max(ls);
        const float w = ls == -INFINITY ? 0.0f : expf(ls - M);
        wsum = cu_warp_sum(w);
        const float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int32_t s0 = 0; s0 < nsplit; s0 += MERGE_GROUP) {
            if (s0 > 0)
                cu_merge_load(p0, step, s0, nsplit, A.d, x);
#pragma unroll
            for (int u = 0; u < MERGE_GROUP; ++u) {
                const float ws = __shfl_sync(0xffffffffu, w, (s0 + u) & 31);
                if (s0 + u < nsplit && ws != 0.0f)
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        acc[j] = fmaf(ws, x[u][j], acc[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (lane + 32 * j < A.d)
                cu_store(A.o, A.act, qrow * A.d + lane + 32 * j, acc[j] * inv);
    } else {
        M = -INFINITY;
        for (int32_t s = 0; s < nsplit; ++s)
            M = fmaxf(M, __ldcg(p0 + s * step + A.d));
        wsum = 0.0f;
        for (int32_t s = 0; s < nsplit; ++s) {
            const float ls = __ldcg(p0 + s * step + A.d);
            wsum += ls == -INFINITY ? 0.0f : expf(ls - M);
        }
        const float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
        for (int32_t d = lane; d < A.d; d += 32) {
            float acc = 0.0f;
            for (int32_t s = 0; s < nsplit; ++s) {
                const float ls = __ldcg(p0 + s * step + A.d);
                if (ls != -INFINITY)
                    acc = fmaf(expf(ls - M), __ldcg(p0 + s * step + d), acc);
            }
            cu_store(A.o, A.act, qrow * A.d + d, acc * inv);
        }
    }
    if (A.lse && lane == 0)
        A.lse[qrow] = wsum > 0.0f ? M + logf(wsum) : -INFINITY;
}

#endif /* MSA_CU_MERGE_ROW_CUH */
