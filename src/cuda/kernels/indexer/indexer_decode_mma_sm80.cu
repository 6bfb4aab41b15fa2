/*
 * Decode indexer, tensor-core path (the scoring: indexer_decode_mma_sm80.cuh).
 * Work split as in the portable path: the blocks of all decode requests end
 * to end, an equal contiguous share per CTA.
 */
#include "cuda/kernels/indexer/indexer_decode_mma_sm80.cuh"
#include "cuda/arch/launch.cuh"

template <typename Tag>
/* Three CTAs per SM (68 KB of shared memory each): the loop is bound by
 * instruction latency more than by bytes in flight, so warps beat stages. */
__global__ void __launch_bounds__(IDX_MMA_THREADS, 3)
    cu_indexer_mma_kernel(cu_indexer_params params)
{
    cu_pdl_wait();
    cu_pdl_trigger();
    extern __shared__ __align__(128) unsigned char smem[];
    const cu_step_hdr *hdr = params.meta.hdr;
    const int64_t total = hdr->total_dec_blocks;
    if (hdr->n_dec == 0 || total == 0)
        return;
    cu_idx_mma_range<Tag>(params, smem, (int32_t)(total * blockIdx.x / gridDim.x),
                          (int32_t)(total * (blockIdx.x + 1) / gridDim.x));
}

void cu_launch_indexer_mma(const cu_indexer_params *params, const cu_plan_state *st, cudaStream_t s)
{
    if (params->act_dtype == MSA_DTYPE_BF16)
        cu_launch(cu_indexer_mma_kernel<cu_bf16_tag>, st->sz.grid_idx_fast, IDX_MMA_THREADS,
                  IDX_MMA_SMEM_BYTES, s, st->pdl, *params);
    else
        cu_launch(cu_indexer_mma_kernel<cu_f16_tag>, st->sz.grid_idx_fast, IDX_MMA_THREADS,
                  IDX_MMA_SMEM_BYTES, s, st->pdl, *params);
}

cudaError_t cu_indexer_mma_setup(int num_sms, int *grid)
{
    cudaError_t e = cu_allow_smem(IDX_MMA_SMEM_BYTES, cu_indexer_mma_kernel<cu_bf16_tag>,
                                  cu_indexer_mma_kernel<cu_f16_tag>);
    if (e != cudaSuccess)
        return e;
    int occ = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, cu_indexer_mma_kernel<cu_bf16_tag>,
                                                      IDX_MMA_THREADS, IDX_MMA_SMEM_BYTES);
    if (e != cudaSuccess)
        return e;
    *grid = num_sms * (occ > 0 ? occ : 1);
    return cudaSuccess;
}
