/*
 * First kernel of every layer: one pass over the step's token rows, each
 * row's cache writes or padding outputs as prologue_row.cuh describes.
 */
#include "cuda/kernels/prologue/prologue_row.cuh"
#include "cuda/arch/launch.cuh"
#include "cuda/common/timeline.cuh"

/* Eight CTAs per SM (32 registers): the grid (up to 8 per SM, one per
 * token) is then a single wave.  The variant for quantized planes
 * (QUANT) keeps an nvfp4 group's 16 values in registers: four CTAs per
 * SM, 64 registers. */
template <bool QUANT>
__global__ void __launch_bounds__(256, QUANT ? 4 : 8) cu_prologue_kernel(cu_prologue_params p)
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
        cu_prologue_token<QUANT>(p, t, ti);
    }
    if (threadIdx.x == 0)
        CU_TL_MARK(p, CU_TL_PROLOGUE, CU_TL_EXIT);
}

void cu_launch_prologue(const cu_prologue_params *p, const cu_plan_state *st, cudaStream_t s)
{
    /* Index planes count where the layer has them. */
    if (cu_is_quantized(p->kv_dtype) || (p->sparse && cu_is_quantized(p->index_dtype)))
        cu_prologue_kernel<true><<<st->sz.grid_tok, 256, 0, s>>>(*p);
    else
        cu_prologue_kernel<false><<<st->sz.grid_tok, 256, 0, s>>>(*p);
}
