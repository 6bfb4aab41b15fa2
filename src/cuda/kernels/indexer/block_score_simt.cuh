/*
 * Block score of one (token, index head) over one key block, computed by a
 * whole warp (portable path): lanes split the block's visible keys, each dot
 * product is a sequential fp32 FMA chain over the stored operand values.
 * SPEC 4: max of the raw scores, or ln(sum exp(c * s)) for the lse type.
 */
#ifndef MSA_CUDA_KERNELS_INDEXER_BLOCK_SCORE_SIMT_CUH
#define MSA_CUDA_KERNELS_INDEXER_BLOCK_SCORE_SIMT_CUH

#include "cuda/plan.cuh"

/* Every lane returns the score.  `p` is the token's absolute position:
 * keys j <= p are visible.  qoff: element offset of the query row in L.iq. */
__device__ __forceinline__ float cu_warp_block_score(const cu_layer &L, int32_t r, int64_t qoff,
                                                     int32_t n, int32_t p)
{
    const int lane = threadIdx.x & 31;
    const int32_t j0 = n * L.B;
    const int32_t j1 = min(j0 + L.B, p + 1);
    float m = -INFINITY, l = 0.0f;
    for (int32_t j = j0 + lane; j < j1; j += 32) {
        const int32_t page = cu_page_of(L.m.page_table, L.cap_pages, r, j, L.logP);
        const int64_t koff = ((int64_t)page * L.P + (j & (L.P - 1))) * L.Di;
        float s = 0.0f;
        for (int32_t d = 0; d < L.Di; ++d)
            s = fmaf(cu_load(L.iq, L.act, qoff + d), cu_load(L.ikp, L.idx_dt, koff + d), s);
        if (L.score_lse)
            cu_lse_merge(m, l, L.iscale * s, 1.0f);
        else
            m = cu_nanmax(m, s);
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float l2 = __shfl_xor_sync(0xffffffffu, l, o);
        if (L.score_lse)
            cu_lse_merge(m, l, m2, l2);
        else
            m = cu_nanmax(m, m2);
    }
    return L.score_lse ? cu_lse_value(m, l) : m;
}

#endif /* MSA_CUDA_KERNELS_INDEXER_BLOCK_SCORE_SIMT_CUH */
