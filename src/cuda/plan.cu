/*
 * Plans of the CUDA backend: the device state sized from the capacities
 * (plan_init: allocations, kernel setup, tensor maps, kernel paths), the
 * per-step schedule (schedule.c) written into a pinned staging copy and
 * published with one async copy (plan_upload), and release (plan_free).
 * See plan.cuh for the state and schedule.h for the metadata layout.
 */
#include "cuda/backend.cuh"
#include "cuda/arch/tma_sm90.cuh"
#include "cuda/kernels/indexer/indexer_prefill_mma_sm80.cuh"
#include "cuda/kernels/indexer/indexer_prefill_tma_sm90.cuh"
#include "cuda/kernels/attention/attention_prefill_mma_sm80.cuh"
#include "cuda/kernels/attention/attention_prefill_tma_sm90.cuh"

#include <stdlib.h>
#include <string.h>

static void cu_state_release(cu_plan_state *st)
{
    if (!st)
        return;
    /* Pending uploads read the staging buffers: let them finish first. */
    for (int i = 0; i < 2; ++i)
        if (st->staging_used[i])
            cudaEventSynchronize(st->staged[i]);
    cudaFree(st->meta_dev);
    for (int i = 0; i < 2; ++i) {
        if (st->staging[i])
            cudaFreeHost(st->staging[i]);
        if (st->staged[i])
            cudaEventDestroy(st->staged[i]);
    }
    cudaFree(st->scores);
    cudaFree(st->sel);
    cudaFree(st->uids);
    cudaFree(st->umask);
    cudaFree(st->ucnt);
    cudaFree(st->sel_done);
    cudaFree(st->idx_next);
    cudaFree(st->pf_scratch);
    cudaFree(st->part);
    cudaFree(st->pfi_scratch);
    cudaFree(st->pfi_split);
    free(st->maps);
    free(st->map_ok);
    free(st->path);
    free(st->path_why);
    free(st);
}

/* Allocates n bytes of zeroed device memory (at least 16). */
/* Zero-filled device memory.  Like every allocation of the plan path it
 * asks the failure injector first (src/core/alloc_fault.c), so that tests
 * can fail it and check that the update leaves the previous step. */
static cudaError_t cu_zalloc(void **p, size_t n)
{
    if (n < 16)
        n = 16;
    if (msa_alloc_fault()) {
        *p = NULL;
        return cudaErrorMemoryAllocation;
    }
    cudaError_t e = cudaMalloc(p, n);
    if (e != cudaSuccess) {
        *p = NULL;
        return e;
    }
    return cudaMemset(*p, 0, n);
}

/* The layers' tensor maps (cu_plan_state.maps), encoded here once
 * instead of three driver calls on the host at every forward of every
 * sparse layer (eager launches pay them; graph replays never did).  A map
 * that cannot be encoded (plane alignment or size, a driver without
 * tensor maps) leaves its bit clear, and that layer's pass takes the mma
 * kernels. */
static int cu_state_maps(const msa_plan *plan, cu_plan_state *st)
{
    const msa_model *m = plan->model;
    const msa_cache *cache = plan->cache;
    const int32_t layers = m->cfg.num_layers;
    /* Aligned as CUtensorMap asks (128 bytes with CUDA 13), its size a
     * multiple of that. */
    const size_t map_bytes = (size_t)layers * CU_MAPS * sizeof(CUtensorMap);
    st->maps = (CUtensorMap *)aligned_alloc(alignof(CUtensorMap), map_bytes);
    st->map_ok = (uint8_t *)calloc((size_t)layers, 1);
    if (!st->maps || !st->map_ok)
        return 1;
    memset(st->maps, 0, map_bytes);
    const uint64_t prows = (uint64_t)cache->cfg.num_pages * (uint64_t)cache->cfg.page_size;
    const uint64_t hkv = (uint64_t)m->cfg.num_kv_heads;
    for (int32_t l = 0; l < layers; ++l) {
        /* Dense layers: K and V only, for the Hopper prefill kernel. */
        void *const *planes = cache->planes + (size_t)l * 4;
        CUtensorMap *mp = st->maps + (size_t)l * CU_MAPS;
        uint8_t ok = 0;
        if (m->layer_sparse[l] &&
            cu_tma_map_rows(&mp[CU_MAP_INDEX_K], planes[MSA_PLANE_INDEX_K], prows, 128) == 0)
            ok |= 1u << CU_MAP_INDEX_K;
        if (cu_tma_map_rows(&mp[CU_MAP_K], planes[MSA_PLANE_K], prows * hkv, 64) == 0)
            ok |= 1u << CU_MAP_K;
        if (cu_tma_map_rows(&mp[CU_MAP_V], planes[MSA_PLANE_V], prows * hkv, 64) == 0)
            ok |= 1u << CU_MAP_V;
        st->map_ok[l] = ok;
    }
    return 0;
}

static msa_status cu_state_create(msa_plan *plan, cu_plan_state **out)
{
    msa_context *ctx = plan->ctx;
    const cu_ctx_state *cs = (const cu_ctx_state *)ctx->backend_state;
    const msa_model *m = plan->model;
    const msa_model_config *cfg = &m->cfg;
    *out = NULL;

    if (plan->cap_requests > (1 << 24) || plan->cap_tokens > (1 << 28) ||
        plan->cap_kv_len > ((int64_t)1 << 30))
        return msa_set_error(ctx, MSA_ERR_UNSUPPORTED,
                             "CUDA backend: plan capacities beyond 2^24 requests, 2^28 tokens "
                             "or 2^30 context tokens");
    if (cfg->head_dim > CU_SIMT_MAX_DIM || cfg->index_dim > CU_SIMT_MAX_DIM)
        return msa_set_error(ctx, MSA_ERR_UNSUPPORTED,
                             "CUDA backend: head_dim and index_dim up to %d", CU_SIMT_MAX_DIM);
    if (cfg->num_index_heads > 32 * cfg->num_kv_heads)
        return msa_set_error(ctx, MSA_ERR_UNSUPPORTED,
                             "CUDA backend: at most 32 index heads per KV head");

    cu_plan_state *st = msa_alloc_fault() ? NULL : (cu_plan_state *)calloc(1, sizeof(*st));
    if (!st)
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY, "out of host memory");

    const int any_sparse = cu_sched_any_layer(m, 1, 0);
    const int any_iv = cu_sched_any_layer(m, 1, 1);
    const int32_t Hkv = cfg->num_kv_heads, Hi = cfg->num_index_heads;
    const int32_t W = m->topk_width;
    const int32_t index_heads_per_unit = Hi >= Hkv ? Hi / Hkv : 1;
    const int32_t units = Hi < Hkv ? Hi : Hkv;

    const cu_sched_device dev = {cs->num_sms, cs->grid_idx_fast, cs->grid_att_fast};
    cu_sched_size(plan, &dev, &st->sz);
    st->pdl = cs->pdl;
    st->tma = cs->tma;
    st->wgmma = cs->wgmma;
    st->pfi_wgmma = cs->pfi_wgmma;

    cudaError_t e = cu_zalloc(&st->meta_dev, st->sz.meta_bytes);
    for (int i = 0; i < 2 && e == cudaSuccess; ++i) {
        e = msa_alloc_fault() ? cudaErrorMemoryAllocation
                              : cudaMallocHost(&st->staging[i], st->sz.meta_bytes);
        if (e == cudaSuccess) {
            memset(st->staging[i], 0, st->sz.meta_bytes);
            e = cudaEventCreateWithFlags(&st->staged[i], cudaEventDisableTiming);
        }
    }
    if (e == cudaSuccess && any_sparse)
        e = cu_zalloc((void **)&st->scores,
                      sizeof(float) * (size_t)st->sz.dec_rows_cap * Hi * st->sz.cap_blocks);
    if (e == cudaSuccess && any_sparse)
        e = cu_zalloc((void **)&st->sel, sizeof(int32_t) * (size_t)st->sz.cap_tok * Hkv * W);
    if (e == cudaSuccess && any_sparse)
        e = cu_zalloc((void **)&st->uids,
                      sizeof(int32_t) * (size_t)st->sz.cap_req * Hkv * st->sz.cap_union);
    if (e == cudaSuccess && any_sparse)
        e = cu_zalloc((void **)&st->umask,
                      sizeof(uint32_t) * (size_t)st->sz.cap_req * Hkv * st->sz.cap_union);
    if (e == cudaSuccess && any_sparse)
        e = cu_zalloc((void **)&st->ucnt, sizeof(int32_t) * (size_t)st->sz.cap_req * Hkv);
    if (e == cudaSuccess && any_sparse)
        e = cu_zalloc((void **)&st->sel_done, sizeof(int32_t) * (size_t)st->sz.cap_req * units);
    if (e == cudaSuccess && any_sparse)
        e = cu_zalloc((void **)&st->idx_next, sizeof(int32_t));
    if (e == cudaSuccess && any_sparse)
        e = cu_zalloc((void **)&st->pf_scratch, sizeof(float) * (size_t)st->sz.grid_pf *
                                                    index_heads_per_unit * st->sz.cap_blocks);
    if (e == cudaSuccess)
        e = cu_zalloc((void **)&st->part,
                      sizeof(float) * (size_t)st->sz.part_rows_cap * st->sz.part_stride);
    /* Prefill indexer on tensor cores: shapes it covers (cu_choose_paths'
     * idx_fast conditions on the model and the cache; the forward runs it
     * where the plan's paths take idx_fast) and a plan that can hold a
     * prefill request.  Its workspace: 64 rows of block scores
     * per CTA (CU_PFI_ROWS x cap_blocks floats, 256 KB a CTA at 128K
     * tokens).  The debugging option cuda_no_prefill_indexer keeps the
     * scalar role. */
    if (e == cudaSuccess && any_sparse && cs->pfi && cu_pfidx_shape(plan) &&
        st->sz.cap_q > CU_DEC_MAX_Q) {
        st->grid_pfi = cu_pfidx_grid(st->sz.num_sms);
        e = cu_zalloc((void **)&st->pfi_scratch,
                      sizeof(float) * cu_pfidx_scratch_floats(st->grid_pfi, st->sz.cap_blocks));
        if (e == cudaSuccess)
            e = cu_zalloc((void **)&st->pfi_split,
                          sizeof(int32_t) * cu_pfidx_split_words(st->grid_pfi));
        if (e == cudaSuccess)
            e = cu_pfidx_setup(
                cu_pfidx_smem(index_heads_per_unit, cfg->topk_blocks, W, st->sz.sel_cache));
        /* The Hopper tensor-map kernel where its shared memory fits (the
         * selection's words of eight warps beside the ring); else the
         * wgmma kernel with cp.async keys. */
        const size_t pfit_smem =
            cu_pfit_smem(index_heads_per_unit, cfg->topk_blocks, W, st->sz.sel_cache);
        if (e == cudaSuccess && st->pfi_wgmma && pfit_smem <= CU_PFIT_SMEM_LIMIT) {
            e = cu_pfit_setup(pfit_smem);
            st->pfit = e == cudaSuccess;
        }
    }
    if (e != cudaSuccess) {
        cu_state_release(st);
        cudaGetLastError();
        return msa_set_error(ctx,
                             e == cudaErrorMemoryAllocation ? MSA_ERR_OUT_OF_MEMORY
                                                            : MSA_ERR_BACKEND,
                             "CUDA plan allocation failed: %s", cudaGetErrorString(e));
    }
    cu_meta_carve(&st->sz, (uintptr_t)st->meta_dev, &st->dev);
    if (any_sparse) {
        e = cu_select_setup(
            cu_select_smem(index_heads_per_unit, cfg->topk_blocks, W, st->sz.sel_cache));
        if (e != cudaSuccess) {
            cu_state_release(st);
            return msa_set_error(ctx, MSA_ERR_BACKEND, "selection kernel setup: %s",
                                 cudaGetErrorString(e));
        }
    }
    /* Prefill attention on tensor cores: its grid, when a step can hold a
     * prefill request (else it is never launched). */
    st->grid_pfa = 0;
    if (st->sz.pf_tiles_cap[0] > 0) {
        e = cu_pfa_setup(cs->num_sms, W, &st->grid_pfa);
        /* and its Hopper version, on devices with the sm_90a products
         * (the debugging option cuda_no_prefill_tma keeps the mma.sync
         * kernel) */
        st->pfh = 0;
        if (e == cudaSuccess && cs->pf_tma && st->grid_pfa > 0) {
            e = cu_pfh_setup();
            st->pfh = e == cudaSuccess;
        }
        if (e != cudaSuccess) {
            cu_state_release(st);
            return msa_set_error(ctx, MSA_ERR_BACKEND, "prefill attention setup: %s",
                                 cudaGetErrorString(e));
        }
    }
    /* The kernels of every layer, once the state knows its grids, its
     * prefill kernels and its tensor maps. */
    if ((st->tma && (any_sparse || st->pfh) && cu_state_maps(plan, st) != 0) ||
        cu_plan_paths(plan, st) != 0) {
        cu_state_release(st);
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    (void)any_iv;
    *out = st;
    return MSA_OK;
}

msa_status cu_plan_init(msa_plan *plan)
{
    msa_context *ctx = plan->ctx;
    const cu_ctx_state *cs = (const cu_ctx_state *)ctx->backend_state;
    CU_TRY(ctx, cudaSetDevice(cs->device));
    cu_plan_state *st = NULL;
    msa_status status = cu_state_create(plan, &st);
    if (status != MSA_OK)
        return status;
    cu_state_release((cu_plan_state *)plan->backend);
    plan->backend = st;
    return MSA_OK;
}

void cu_plan_free(msa_plan *plan)
{
    if (!plan || !plan->backend)
        return;
    cu_state_release((cu_plan_state *)plan->backend);
    plan->backend = NULL;
}

int cu_attn_tma_shape(const msa_plan *plan, const cu_plan_state *st)
{
    const msa_model *m = plan->model;
    const msa_cache_config *cc = &plan->cache->cfg;
    return st->tma && st->wgmma && cc->page_size == 128 && m->cfg.block_size == 128 &&
           m->cfg.head_dim == 128 && m->group == 16;
}

/* ---- per-step schedule --------------------------------------------------- */

msa_status cu_plan_upload(msa_plan *plan, void *stream)
{
    msa_context *ctx = plan->ctx;
    const cu_ctx_state *cs = (const cu_ctx_state *)ctx->backend_state;
    cu_plan_state *st = (cu_plan_state *)plan->backend;
    CU_TRY(ctx, cudaSetDevice(cs->device));
    if (!st || st->sz.plan_caps[0] != plan->cap_requests ||
        st->sz.plan_caps[1] != plan->cap_tokens || st->sz.plan_caps[2] != plan->cap_kv_len ||
        st->sz.plan_caps[3] != plan->cap_pages_per_request) {
        msa_status status = cu_plan_init(plan);
        if (status != MSA_OK)
            return status;
        st = (cu_plan_state *)plan->backend;
    }
    /* A staging buffer may still be read by its previous async copy. */
    const int si = st->next_staging;
    if (st->staging_used[si])
        CU_TRY(ctx, cudaEventSynchronize(st->staged[si]));
    cu_meta h;
    cu_meta_carve(&st->sz, (uintptr_t)st->staging[si], &h);
    if (cu_sched_fill(plan, &st->sz, st->sparse_tma, &h, &st->step) != 0)
        return msa_set_error(ctx, MSA_ERR_BACKEND,
                             "CUDA plan: the step exceeds the capacities of its device state");

    const size_t bytes =
        st->sz.pt_offset + sizeof(int32_t) * (size_t)plan->num_requests * st->sz.cap_pages;
    cudaStream_t s = (cudaStream_t)stream;
    CU_TRY(ctx, cudaMemcpyAsync(st->meta_dev, st->staging[si], bytes, cudaMemcpyHostToDevice, s));
    CU_TRY(ctx, cudaEventRecord(st->staged[si], s));
    st->staging_used[si] = 1;
    st->next_staging = si ^ 1;
    return MSA_OK;
}
