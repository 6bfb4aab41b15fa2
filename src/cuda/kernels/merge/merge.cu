/*
 * Last launch of an attention pass, two jobs for every CTA:
 *   merge         split decode attention: each split left a normalized fp32
 *                 row and its LSE; the output is the LSE-weighted sum.  One
 *                 warp per output row.
 *   prefill rows  the rows of prefill requests (rows_simt.cuh), which depend
 *                 only on the selection, not on the decode items.
 */
#include "cuda/kernels/attention/rows_simt.cuh"
#include "cuda/kernels/merge/merge_row.cuh"
#include "cuda/arch/launch.cuh"
#include "cuda/common/timeline.cuh"

#define MERGE_WARPS 8

__device__ __forceinline__ void cu_merge_role(const cu_attn_params &params, int cta, int nctas)
{
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
        cu_pdl_wait(); /* the attention's partial rows (at once after the first) */
        if (threadIdx.x == 0 && w == (int64_t)cta * MERGE_WARPS)
            CU_TL_MARK(params, CU_TL_MERGE, CU_TL_WAITED);
        cu_merge_row(params, it, rl);
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
