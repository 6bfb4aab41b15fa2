/*
 * Prefill indexer and selection, mma.sync products (sm_80 and later), and
 * the host side of both variants: shapes, parameters, workspace sizes,
 * launch (the wgmma variant, indexer_prefill_wgmma_sm90.cu, where the
 * device runs sm_90a code).  The kernel: indexer_prefill.cuh.
 */
#include "cuda/kernels/indexer/indexer_prefill_mma_sm80.cuh"
#include "cuda/kernels/indexer/indexer_prefill.cuh"
#include "cuda/kernels/indexer/indexer_prefill_tma_sm90.cuh"

#include <string.h>

int cu_pfidx_shape(const msa_plan *plan, int index_copy)
{
    const msa_model_config *cfg = &plan->model->cfg;
    const msa_dtype idt = plan->cache->cfg.index_dtype;
    return (idt == MSA_DTYPE_BF16 || idt == MSA_DTYPE_FP16 || index_copy) &&
           cfg->index_dim == 128 && cfg->block_size % PFI_CHUNK == 0 && cfg->num_index_heads >= 1 &&
           cfg->num_index_heads <= 4;
}

void cu_pfidx_build(const cu_select_params *sel, const cu_plan_state *st, cu_pfidx_params *p)
{
    memset(p, 0, sizeof *p);
    p->Hi = sel->num_index_heads;
    p->Hkv = sel->num_kv_heads;
    p->B = sel->block_size;
    p->K = sel->topk_blocks;
    p->I = sel->init_blocks;
    p->Lc = sel->local_blocks;
    p->W = sel->topk_width;
    p->mi = sel->index_heads_per_unit;
    p->mk = sel->kv_heads_per_unit;
    p->units = sel->num_units;
    p->tt = CU_PFI_ROWS / sel->num_index_heads;
    p->score_lse = sel->score_lse;
    /* The index-key plane's scale on a copy: inside the log-sum-exp's
     * scale; a block max keeps the raw products, whose order a positive
     * scale does not change. */
    p->iscale = sel->index_scale * sel->pf_index_k_mul;
    p->P = sel->page_size;
    p->logP = sel->log_page_size;
    p->cap_pages = st->sz.cap_pages;
    p->cap_blocks = st->sz.cap_blocks;
    p->sel_cache = st->sz.sel_cache;
    p->iq = sel->index_q;
    p->ikp = sel->pf_index_k_plane;
    p->iks = sel->pf_index_k_strides;
    p->hdr = st->dev.hdr;
    p->q_len = st->dev.q_len;
    p->kv_len = st->dev.kv_len;
    p->q_start = st->dev.q_start;
    p->page_table = st->dev.page_table;
    p->sel = st->sel;
    p->topk = sel->topk_ids;
    p->scratch = st->pfi_scratch;
    if (st->pfi_split) {
        const size_t n = (size_t)st->grid_pfi * CU_PFI_ROWS * PFI_CAND;
        p->cand_id = st->pfi_split;
        p->cand_score = (float *)(st->pfi_split + n);
        p->split_done = st->pfi_split + 2 * n;
    }
}

size_t cu_pfidx_smem(int32_t mi, int32_t K, int32_t W, int32_t sel_cache)
{
    const size_t sel = PFI_WARPS * cu_pfi_warp_words(mi, K, W, sel_cache) * sizeof(uint32_t);
    return sel > PFI_SCORE_SMEM ? sel : PFI_SCORE_SMEM;
}

cudaError_t cu_pfidx_setup(size_t smem)
{
    /* The limit is the kernels', not a plan's: only ever raised, so that a
     * plan created later with smaller shapes does not lower it under an
     * earlier plan that still runs. */
    static size_t allowed = 48 * 1024;
    if (smem <= allowed)
        return cudaSuccess;
    cudaError_t e = cu_allow_smem(smem, cu_pfidx_kernel<cu_bf16_tag, false>,
                                  cu_pfidx_kernel<cu_f16_tag, false>);
    if (e == cudaSuccess)
        e = cu_pfidx_wgmma_setup(smem);
    if (e == cudaSuccess)
        allowed = smem;
    return e;
}

int cu_pfidx_grid(int num_sms)
{
    return 2 * num_sms;
}

size_t cu_pfidx_scratch_floats(int grid, int32_t cap_blocks)
{
    return (size_t)grid * CU_PFI_ROWS * (size_t)cap_blocks;
}

size_t cu_pfidx_split_words(int grid)
{
    return 2 * (size_t)grid * CU_PFI_ROWS * PFI_CAND + (size_t)grid;
}

void cu_launch_indexer_prefill_mma(const cu_select_params *sel, const cu_plan_state *st,
                                   const CUtensorMap *map, cudaStream_t s)
{
    cu_pfidx_params p;
    cu_pfidx_build(sel, st, &p);
    const int bf16 = sel->act_dtype == MSA_DTYPE_BF16;
    /* Hopper with pages of 128 keys: the tensor-map kernel, its tiles of
     * CU_PFIT_ROWS rows. */
    if (st->pfit && map) {
        p.tt = CU_PFIT_ROWS / sel->num_index_heads;
        cu_pfit_launch(&p, bf16, st->sz.num_sms, cu_pfit_smem(p.mi, p.K, p.W, p.sel_cache), map, s,
                       st->pdl);
        return;
    }
    const size_t smem = cu_pfidx_smem(p.mi, p.K, p.W, p.sel_cache);
    /* The Hopper products where the device runs the sm_90a code, unless
     * the debugging option cuda_no_prefill_wgmma keeps mma.sync there too. */
    if (st->pfi_wgmma)
        cu_pfidx_wgmma_launch(&p, bf16, st->grid_pfi, smem, s, st->pdl);
    else if (bf16)
        cu_launch(cu_pfidx_kernel<cu_bf16_tag, false>, st->grid_pfi, PFI_THREADS, smem, s, st->pdl,
                  p);
    else
        cu_launch(cu_pfidx_kernel<cu_f16_tag, false>, st->grid_pfi, PFI_THREADS, smem, s, st->pdl,
                  p);
}
