/*
 * First kernel of every layer: one pass over the step's token rows, each
 * row's cache writes or padding outputs as prologue_row.cuh describes.
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

/* Planes of which some are quantized: the padding rows a CTA each, then
 * every (real row, unit of 16 elements) a thread each, over the whole
 * grid.  A unit's activations come in 16-byte loads, its codes go out in
 * one store, and a warp runs one copy of the unit's code whichever planes
 * its lanes' units belong to.  The form before it (a CTA per row, a
 * thread per element, a call per plane, a branch per element's encoding)
 * took 347 us for a 32K-token prompt's rows on the H200, this one 106 us
 * (ncu), against about 50 us for 16-bit planes.  At most 64 registers
 * (four CTAs of 256 per SM): a unit's 16 values stay in registers. */
__global__ void __launch_bounds__(256, 4) cu_prologue_quant_kernel(cu_prologue_params p)
{
    cu_pdl_trigger();
    if (threadIdx.x == 0)
        CU_TL_MARK(p, CU_TL_PROLOGUE, CU_TL_ENTRY);
    const int32_t ntok = p.hdr->num_tokens;
    for (int32_t t = blockIdx.x; t < ntok; t += gridDim.x)
        if (p.tok_info[t].r < 0)
            cu_prologue_padding(p, t);
    if (p.write_cache) {
        const int32_t units = cu_prologue_quant_units(p);
        const int64_t n = (int64_t)ntok * units;
        for (int64_t w = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; w < n;
             w += (int64_t)gridDim.x * blockDim.x) {
            /* 32-bit division where the units allow it (a uniform
             * choice): 64-bit division is a long software sequence. */
            const int32_t t = n <= INT32_MAX ? (int32_t)((uint32_t)w / (uint32_t)units)
                                             : (int32_t)(w / units);
            const int32_t e = (int32_t)(w - (int64_t)t * units);
            const cu_tok_info ti = p.tok_info[t];
            /* page -1: the row's page-table entry lies outside the pool
             * (plan.cu): the row is not written. */
            if (ti.r < 0 || ti.page < 0)
                continue;
            cu_prologue_unit_quant(p, t, ti.page, ti.pos & (p.page_size - 1), e);
        }
    }
    if (threadIdx.x == 0)
        CU_TL_MARK(p, CU_TL_PROLOGUE, CU_TL_EXIT);
}

void cu_launch_prologue(const cu_prologue_params *p, const cu_plan_state *st, cudaStream_t s)
{
    /* Index planes count where the layer has them. */
    if (cu_is_quantized(p->kv_dtype) || (p->sparse && cu_is_quantized(p->index_dtype)))
        cu_prologue_quant_kernel<<<st->sz.grid_tok, 256, 0, s>>>(*p);
    else
        cu_prologue_kernel<<<st->sz.grid_tok, 256, 0, s>>>(*p);
}
