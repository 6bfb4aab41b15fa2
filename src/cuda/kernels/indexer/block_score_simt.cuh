/*
 * Block score of one (token, index head) over one key block, computed by a
 * whole warp (portable path): lanes split the block's visible keys, each dot
 * product is a sequential fp32 FMA chain over the stored operand values
 * (quantized index keys de-quantized as the CPU reads them).
 * SPEC 4: max of the raw scores, or ln(sum exp(c * s)) for the lse type.
 */
#ifndef MSA_CUDA_KERNELS_INDEXER_BLOCK_SCORE_SIMT_CUH
#define MSA_CUDA_KERNELS_INDEXER_BLOCK_SCORE_SIMT_CUH

#include "cuda/params.cuh"

/* Every lane returns the score.  `p` is the token's absolute position:
 * keys j <= p are visible.  qoff: element offset of the query row in
 * params.index_q.  Params: the decode indexer's (cu_indexer_params) or the
 * selection's (cu_select_params, its scalar prefill role), which name the
 * index planes, shapes and the step's page table alike. */
template <typename Params>
__device__ __forceinline__ float cu_warp_block_score(const Params &params, int32_t r, int64_t qoff,
                                                     int32_t n, int32_t p)
{
    const int lane = threadIdx.x & 31;
    const int32_t j0 = n * params.block_size;
    const int32_t j1 = min(j0 + params.block_size, p + 1);
    float m = -INFINITY, l = 0.0f;
    for (int32_t j = j0 + lane; j < j1; j += 32) {
        const int32_t page =
            cu_page_of(params.meta.page_table, params.cap_pages, r, j, params.log_page_size);
        const cu_qrow krow = cu_plane_at(params.index_k_strides, params.index_dtype, page, 0,
                                         j & (params.page_size - 1), params.page_size,
                                         params.index_dim);
        float s = 0.0f;
        for (int32_t d = 0; d < params.index_dim; ++d)
            s = fmaf(cu_load(params.index_q, params.act_dtype, qoff + d),
                     cu_plane_load(params.index_k_plane, params.index_dtype, params.index_k_scale,
                                   krow, d),
                     s);
        if (params.score_lse)
            cu_lse_merge(m, l, params.index_scale * s, 1.0f);
        else
            m = cu_nanmax(m, s);
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float l2 = __shfl_xor_sync(0xffffffffu, l, o);
        if (params.score_lse)
            cu_lse_merge(m, l, m2, l2);
        else
            m = cu_nanmax(m, m2);
    }
    return params.score_lse ? cu_lse_value(m, l) : m;
}

#endif /* MSA_CUDA_KERNELS_INDEXER_BLOCK_SCORE_SIMT_CUH */
