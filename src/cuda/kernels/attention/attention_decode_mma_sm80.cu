/*
 * Decode attention, tensor-core path: one CTA (4 warps) per work item at a
 * time, items dealt round robin (the item code: attention_decode_mma_sm80.cuh).
 */
#include "cuda/kernels/attention/attention_decode_mma_sm80.cuh"
#include "cuda/arch/launch.cuh"

template <typename Tag>
__global__ void __launch_bounds__(ATT_MMA_THREADS, 2) cu_attn_mma_kernel(cu_attn_params params)
{
    cu_pdl_wait();
    cu_pdl_trigger();
    extern __shared__ __align__(128) unsigned char smem[];
    const int32_t n_items = params.meta.hdr->n_att[params.kind];
    const cu_att_item *items = params.meta.att[params.kind];
    for (int32_t ii = blockIdx.x; ii < n_items; ii += gridDim.x) {
        cu_att_item_any<Tag>(params, smem, items[ii]);
    }
}

void cu_launch_attn_decode_mma(const cu_attn_params *params, const cu_plan_state *st,
                               cudaStream_t s)
{
    if (params->act_dtype == MSA_DTYPE_BF16)
        cu_launch(cu_attn_mma_kernel<cu_bf16_tag>, st->sz.grid_att_fast, ATT_MMA_THREADS,
                  ATT_MMA_SMEM_BYTES, s, st->pdl, *params);
    else
        cu_launch(cu_attn_mma_kernel<cu_f16_tag>, st->sz.grid_att_fast, ATT_MMA_THREADS,
                  ATT_MMA_SMEM_BYTES, s, st->pdl, *params);
}

cudaError_t cu_attn_mma_setup(int num_sms, int *grid)
{
    cudaError_t e = cu_allow_smem(ATT_MMA_SMEM_BYTES, cu_attn_mma_kernel<cu_bf16_tag>,
                                  cu_attn_mma_kernel<cu_f16_tag>);
    if (e != cudaSuccess)
        return e;
    int occ = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, cu_attn_mma_kernel<cu_bf16_tag>,
                                                      ATT_MMA_THREADS, ATT_MMA_SMEM_BYTES);
    if (e != cudaSuccess)
        return e;
    *grid = num_sms * (occ > 0 ? occ : 1);
    return cudaSuccess;
}
