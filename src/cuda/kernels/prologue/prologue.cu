/*
 * First kernel of every layer: one pass over the step's token rows.
 *   - real rows (when the caller did not pre-write them): store k, v, idx_k,
 *     idx_v at the row's position in the paged planes, converted to the
 *     plane's element type;
 *   - padding rows: write the padding outputs (o = 0, idx_o = 0, lse = -inf,
 *     selected ids = -1), so the later kernels only ever touch real rows.
 */
#include "cuda/kernels/prologue/prologue_row.cuh"
#include "cuda/arch/launch.cuh"
#include "cuda/common/timeline.cuh"

/* Eight CTAs per SM (32 registers): the grid (up to 8 per SM, one per
 * token) is then a single wave. */
__global__ void __launch_bounds__(256, 8) cu_prologue_kernel(cu_prologue_params p)
{
    cu_pdl_trigger(); /* the indexer may be scheduled; it waits for us */
    if (threadIdx.x == 0)
        CU_TL_MARK(p, CU_TL_PROLOGUE, CU_TL_ENTRY);
    /* The first row's facts load beside the row count, not after it
     * (grid_tok <= cap_tok: the entry exists). */
    cu_tok_info ti = p.tok_info[blockIdx.x];
    const int32_t ntok = p.hdr->num_tokens;
    for (int32_t t = blockIdx.x; t < ntok; t += gridDim.x) {
        if (t != (int32_t)blockIdx.x)
            ti = p.tok_info[t];
        cu_prologue_token(p, t, ti);
    }
    if (threadIdx.x == 0)
        CU_TL_MARK(p, CU_TL_PROLOGUE, CU_TL_EXIT);
}

void cu_launch_prologue(const cu_prologue_params *p, const cu_plan_state *st, cudaStream_t s)
{
    cu_prologue_kernel<<<st->sz.grid_tok, 256, 0, s>>>(*p);
}
