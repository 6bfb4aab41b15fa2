/*
 * Prefill indexer and selection, wgmma products (sm_90a): the kernel of
 * indexer_prefill.cuh with WG = true.  Compiled for every architecture of
 * the build; its products exist in the sm_90a code only, and the host
 * launches it only where the device runs that code (cu_plan_state.wgmma).
 */
#include "cuda/kernels/indexer/indexer_prefill_mma_sm80.cuh"
#include "cuda/kernels/indexer/indexer_prefill.cuh"

cudaError_t cu_pfidx_wgmma_setup(size_t smem)
{
    return cu_allow_smem(smem, cu_pfidx_kernel<cu_bf16_tag, true>,
                         cu_pfidx_kernel<cu_f16_tag, true>);
}

void cu_pfidx_wgmma_launch(const cu_pfidx_params *p, int bf16, int grid, size_t smem,
                           cudaStream_t s, int pdl)
{
    if (bf16)
        cu_launch(cu_pfidx_kernel<cu_bf16_tag, true>, grid, PFI_THREADS, smem, s, pdl, *p);
    else
        cu_launch(cu_pfidx_kernel<cu_f16_tag, true>, grid, PFI_THREADS, smem, s, pdl, *p);
}
