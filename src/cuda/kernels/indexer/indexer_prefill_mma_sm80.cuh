/*
 * Prefill indexer and selection on tensor cores (mma.sync, sm_80 and
 * later; wgmma on sm_90a): index scores of prefill tokens (requests with
 * q_len above the decode path's CU_DEC_MAX_Q) against their request's
 * visible index keys, the causal mask, block max / log-sum-exp and the
 * score scale fused, then the exact SPEC 4 selection of each (token,
 * unit) written as the sel rows (and the caller's topk rows) the prefill
 * attention reads.
 *
 * Covers 16-bit activations with an index plane of the same type, Di = 128,
 * B a multiple of 64 and at most 4 index heads (cu_paths.idx_fast); other
 * shapes keep the selection kernel's scalar prefill role.
 *
 * The kernel reads and writes only what its parameter struct names;
 * cu_pfidx_build fills it from the selection's parameters and the plan.
 */
#ifndef MSA_INDEXER_PREFILL_MMA_SM80_CUH
#define MSA_INDEXER_PREFILL_MMA_SM80_CUH

#include "cuda/params.cuh"

#include <cuda.h>

/* Rows of one tile: tokens x index heads, one 16-row MMA tile per warp. */
#define CU_PFI_ROWS 64

typedef struct cu_pfidx_params {
    /* Shapes. */
    int32_t Hi, Hkv, B, K, I, Lc, W;
    int32_t mi, mk,
        units;  /* cu_select_params' index_heads_per_unit, kv_heads_per_unit, num_units */
    int32_t tt; /* tokens per tile: CU_PFI_ROWS / Hi */
    int32_t score_lse;
    float iscale;
    int32_t P, logP, cap_pages, cap_blocks, sel_cache;
    /* Inputs: index queries of the step, the layer's index-key plane, the
     * plan's request arrays and page table. */
    const void *iq, *ikp;
    msa_plane_strides iks; /* the index-key plane's strides: rows at cu_plane_row */
    const cu_step_hdr *hdr;
    const int32_t *q_len, *kv_len, *q_start, *page_table;
    /* Outputs: the plan's sel rows, the caller's topk rows (or NULL), and
     * this kernel's workspaces: block scores [grid][CU_PFI_ROWS][cap_blocks],
     * split candidates (ids, scores) [grid][CU_PFI_ROWS][32] and completion
     * counts per tile [grid] (kept 0 between launches); cand_id NULL: no
     * splits. */
    int32_t *sel, *topk;
    float *scratch;
    int32_t *cand_id;
    float *cand_score;
    int32_t *split_done;
} cu_pfidx_params;

/* Whether a plan's model and cache fit the kernel: a 16-bit index plane
 * (or a quantized one the plan copies to 16 bits: index_copy),
 * Di = 128, B a multiple of 64, at most 4 index heads (the activations
 * must match the plane: the plan's pf_idx, cu_choose_paths). */
int cu_pfidx_shape(const msa_plan *plan, int index_copy);

/* Fills the kernel's parameters from the selection's (built from the plan
 * and the call) and the plan state's workspaces. */
void cu_pfidx_build(const cu_select_params *sel, const cu_plan_state *st, cu_pfidx_params *p);

/* Dynamic shared memory of the kernel for a plan's selection shapes. */
size_t cu_pfidx_smem(int32_t mi, int32_t K, int32_t W, int32_t sel_cache);

/* Raises the kernels' shared-memory limit to `smem` bytes (plan init). */
cudaError_t cu_pfidx_setup(size_t smem);

/* CTAs of the persistent grid (two per SM), the floats of their
 * block-score workspace and the 32-bit words of the split workspace
 * (candidates and completion counts: 16 KB a CTA). */
int cu_pfidx_grid(int num_sms);
size_t cu_pfidx_scratch_floats(int grid, int32_t cap_blocks);
size_t cu_pfidx_split_words(int grid);

/* The wgmma variant (indexer_prefill_wgmma_sm90.cu): its shared-memory
 * limit, and its launch with parameters p (bf16: else fp16). */
cudaError_t cu_pfidx_wgmma_setup(size_t smem);
void cu_pfidx_wgmma_launch(const cu_pfidx_params *p, int bf16, int grid, size_t smem,
                           cudaStream_t s, int pdl);

/* Enqueues the kernel (after the selection kernel, which then leaves the
 * prefill rows to it: cu_select_params.prefill_ctas = 0).  map: the
 * layer's index-key tensor map where the plan's paths take the Hopper
 * tensor-map kernels (pages and blocks of 128 keys), else NULL; with it
 * and the wgmma products the Hopper kernel (indexer_prefill_tma_sm90.cu)
 * runs instead. */
void cu_launch_indexer_prefill_mma(const cu_select_params *sel, const cu_plan_state *st,
                                   const CUtensorMap *map, cudaStream_t s);

#endif /* MSA_INDEXER_PREFILL_MMA_SM80_CUH */
