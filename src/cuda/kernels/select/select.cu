/*
 * Selection stage of a sparse layer, one launch: every CTA takes decode
 * rows, the first prefill_ctas also the simple path's prefill items
 * (the roles: select_roles.cuh).
 */
#include "cuda/kernels/select/select_roles.cuh"

__global__ void __launch_bounds__(SEL_WARPS * 32, 1) cu_select_kernel(cu_select_params params)
{
    /* Plan data first; each role waits for the indexer before it reads
     * scores or the cache. */
    cu_pdl_trigger();
    if (threadIdx.x == 0)
        CU_TL_MARK(params, CU_TL_SELECT, CU_TL_ENTRY);
    extern __shared__ __align__(8) uint32_t sel_smem[];
    /* Every CTA takes decode rows; the first pf_ctas then take prefill items,
     * each with its own scratch row. */
    cu_select_decode_role(params, blockIdx.x, gridDim.x, sel_smem);
    cu_pdl_wait(); /* every CTA, before it ends (arch/launch.cuh) */
    if (threadIdx.x == 0)
        CU_TL_MARK(params, CU_TL_SELECT, CU_TL_EXIT);
    if (blockIdx.x >= params.prefill_ctas)
        return;
    __syncthreads();
    cu_select_prefill_role(params, blockIdx.x, params.prefill_ctas, sel_smem);
}

size_t cu_select_smem(int32_t index_heads_per_unit, int32_t topk_blocks, int32_t topk_width,
                      int32_t cached_blocks)
{
    return (cu_sel_grp_offset(index_heads_per_unit, topk_blocks, topk_width, cached_blocks) +
            SEL_GRP_WORDS) *
           sizeof(uint32_t);
}

cudaError_t cu_select_setup(size_t smem)
{
    if (smem <= 48 * 1024)
        return cudaSuccess;
    return cudaFuncSetAttribute(cu_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem);
}

void cu_launch_select(const cu_select_params *params, const cu_plan_state *st, cudaStream_t s)
{
    /* The first grid_pf CTAs also serve the prefill role, each with its own
     * scratch row. */
    cu_launch(cu_select_kernel, st->sz.grid_sel, SEL_WARPS * 32,
              cu_select_smem(params->index_heads_per_unit, params->topk_blocks, params->topk_width,
                             params->cached_blocks),
              s, st->pdl, *params);
}
