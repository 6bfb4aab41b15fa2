/*
 * Prefill indexer and selection on Hopper (sm_90a): the index keys come by
 * tensor-map copies of whole pages into a ring that a producer warp keeps
 * full, and two consumer warpgroups score 128-row tiles against each page
 * with warpgroup products (wgmma), then select.  The same work, workspace
 * and results as the kernel of indexer_prefill.cuh (whose host side,
 * indexer_prefill_mma_sm80.cu, launches this one where it applies);
 * docs/PREFILL_INDEXER.md gives the design.
 */
#ifndef MSA_INDEXER_PREFILL_TMA_SM90_CUH
#define MSA_INDEXER_PREFILL_TMA_SM90_CUH

#include "cuda/kernels/indexer/indexer_prefill_mma_sm80.cuh"

#include <cuda.h>

/* Rows of one tile: tokens x index heads, two warpgroups of 64. */
#define CU_PFIT_ROWS 128

/* Dynamic shared memory of the kernel for a plan's selection shapes; the
 * kernel serves plans where it is at most CU_PFIT_SMEM_LIMIT. */
size_t cu_pfit_smem(int32_t mi, int32_t K, int32_t W, int32_t sel_cache);
#define CU_PFIT_SMEM_LIMIT (227 * 1024)

/* Raises the kernel's shared-memory limit to `smem` bytes (plan init, on
 * devices that run the sm_90a code only). */
cudaError_t cu_pfit_setup(size_t smem);

/* Launches the kernel, one CTA per SM, with parameters p (their tt set for
 * CU_PFIT_ROWS-row tiles) and the layer's index-key tensor map (boxes of
 * 64 columns x 128 rows: a page of 128 keys is two boxes).  The plan's
 * workspaces, sized for the portable kernel's grid of two CTAs of 64 rows
 * per SM, hold this grid's 128 rows per SM. */
void cu_pfit_launch(const cu_pfidx_params *p, int bf16, int num_sms, size_t smem,
                    const CUtensorMap *map, cudaStream_t s, int pdl);

#endif /* MSA_INDEXER_PREFILL_TMA_SM90_CUH */
