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
#include "cuda/kernels/attention/attention_prefill_kbm_sm90.cuh"
#include "cuda/kernels/lean/lean_decode.cuh"

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
    for (int i = 0; i < 2; ++i) {
        if (st->staging[i])
            cudaFreeHost(st->staging[i]);
        if (st->staged[i])
            cudaEventDestroy(st->staged[i]);
    }
    /* The device buffers lie in one block: the library's (freed here) or
     * the caller's workspace (left alone). */
    cudaFree(st->ws_owned);
    free(st->maps);
    free(st->map_ok);
    free(st->path);
    free(st->path_why);
    free(st);
}

/* Zero-filled device memory, the plan's only device allocation.  Like
 * every allocation of the plan path it asks the failure injector first
 * (src/core/alloc_fault.c), so that tests can fail it and check that the
 * update leaves the previous step; tests count it. */
static cudaError_t cu_zalloc(void **p, size_t n)
{
    if (msa_alloc_fault()) {
        *p = NULL;
        return cudaErrorMemoryAllocation;
    }
    cudaError_t e = cudaMalloc(p, n);
    if (e != cudaSuccess) {
        *p = NULL;
        return e;
    }
    msa_count_device_allocation();
    return cudaMemset(*p, 0, n);
}

/* Offsets of a plan state's device buffers in its one block of device
 * memory (the library's, or the caller's workspace), each at a multiple of
 * MSA_PLAN_WORKSPACE_ALIGNMENT bytes and at least 16 bytes long; CU_WS_NONE
 * for a buffer the plan does not have (its pointer stays NULL). */
#define CU_WS_NONE SIZE_MAX
typedef struct cu_ws_layout {
    size_t meta, scores, sel, uids, umask, ucnt, sel_done, idx_next, pf_scratch, part;
    size_t pfi_scratch, pfi_split, pfk, lean;
    size_t widen[CU_WIDEN_PLANES];
    int grid_pfi;
    int32_t pfk_chunk;
    int32_t lean_tasks;
    size_t total;
} cu_ws_layout;

static size_t cu_ws_take(size_t *off, int present, size_t bytes)
{
    if (!present)
        return CU_WS_NONE;
    const size_t at = *off;
    const size_t a = MSA_PLAN_WORKSPACE_ALIGNMENT;
    *off = (at + (bytes < 16 ? 16 : bytes) + a - 1) / a * a;
    return at;
}

/* The layout of the device buffers of a plan of sizes sz on context state
 * cs (the capacities are bounded by cu_plan_check, so no size overflows). */
static void cu_ws_layout_of(const msa_plan *plan, const cu_ctx_state *cs, const cu_sched_sizes *sz,
                            cu_ws_layout *L)
{
    const msa_model *m = plan->model;
    const msa_model_config *cfg = &m->cfg;
    const int any_sparse = cu_sched_any_layer(m, 1, 0);
    const size_t Hkv = (size_t)cfg->num_kv_heads, Hi = (size_t)cfg->num_index_heads;
    const size_t W = (size_t)m->topk_width;
    const size_t index_heads_per_unit = Hi >= Hkv ? Hi / Hkv : 1;
    const size_t units = Hi < Hkv ? Hi : Hkv;
    const size_t req = (size_t)sz->cap_req, blocks = (size_t)sz->cap_blocks;
    size_t off = 0;
    L->meta = cu_ws_take(&off, 1, sz->meta_bytes);
    L->scores =
        cu_ws_take(&off, any_sparse, sizeof(float) * (size_t)sz->dec_rows_cap * Hi * blocks);
    L->sel = cu_ws_take(&off, any_sparse, sizeof(int32_t) * (size_t)sz->cap_tok * Hkv * W);
    L->uids = cu_ws_take(&off, any_sparse, sizeof(int32_t) * req * Hkv * (size_t)sz->cap_union);
    L->umask = cu_ws_take(&off, any_sparse, sizeof(uint32_t) * req * Hkv * (size_t)sz->cap_union);
    L->ucnt = cu_ws_take(&off, any_sparse, sizeof(int32_t) * req * Hkv);
    L->sel_done = cu_ws_take(&off, any_sparse, sizeof(int32_t) * req * units);
    L->idx_next = cu_ws_take(&off, any_sparse, sizeof(int32_t));
    L->pf_scratch = cu_ws_take(&off, any_sparse,
                               sizeof(float) * (size_t)sz->grid_pf * index_heads_per_unit * blocks);
    L->part = cu_ws_take(&off, 1, sizeof(float) * (size_t)sz->part_rows_cap * sz->part_stride);
    /* Prefill indexer on tensor cores: shapes it covers (cu_choose_paths'
     * idx_fast conditions on the model and the cache; the forward runs it
     * where the plan's paths take idx_fast) and a plan that can hold a
     * prefill request.  Its workspace: 64 rows of block scores
     * per CTA (CU_PFI_ROWS x cap_blocks floats, 256 KB a CTA at 128K
     * tokens).  The debugging option cuda_no_prefill_indexer keeps the
     * scalar role. */
    /* 16-bit copies of the quantized planes, which the prefill kernels
     * read (widen_pages.cuh): a plane of the cache's pages each, where a
     * step can hold a prefill request. */
    int widen_kv = 0, widen_index = 0;
    for (int pl = 0; pl < CU_WIDEN_PLANES; ++pl) {
        const int want = sz->cap_q > CU_DEC_MAX_Q && cu_widen_plane_wanted(plan, pl);
        L->widen[pl] = cu_ws_take(&off, want, want ? cu_widen_plane_bytes(plan, pl) : 0);
        if (want && pl == MSA_PLANE_K)
            widen_kv = 1;
        if (want && pl == MSA_PLANE_INDEX_K)
            widen_index = 1;
    }
    const int pfi = any_sparse && cs->pfi && cu_pfidx_shape(plan, widen_index) &&
                    sz->cap_q > CU_DEC_MAX_Q;
    L->grid_pfi = pfi ? cu_pfidx_grid(sz->num_sms) : 0;
    L->pfi_scratch =
        cu_ws_take(&off, pfi, sizeof(float) * cu_pfidx_scratch_floats(L->grid_pfi, sz->cap_blocks));
    L->pfi_split = cu_ws_take(&off, pfi, sizeof(int32_t) * cu_pfidx_split_words(L->grid_pfi));
    /* Key-block-major prefill attention: sparse layers whose shapes fit
     * it, 16-bit activations and K/V planes alike (the Hopper prefill
     * kernel's conditions), a plan that can hold a prefill request. */
    const msa_dtype act = plan->params.act_dtype;
    const int pfk =
        any_sparse && cs->pf_kbm && sz->pf_blocks_cap > 0 && sz->pf_tiles_cap[0] > 0 &&
        (act == MSA_DTYPE_BF16 || act == MSA_DTYPE_FP16) &&
        (plan->cache->cfg.kv_dtype == act || widen_kv) &&
        cu_pfk_fits(cfg->head_dim, plan->cache->cfg.page_size, cfg->block_size, m->group, NULL);
    L->pfk_chunk =
        pfk ? cu_pfk_chunk_tokens(sz->cap_tok, cfg->num_kv_heads, m->group, m->topk_width) : 0;
    if (cs->pf_kbm_chunk > 0 && cs->pf_kbm_chunk < L->pfk_chunk)
        L->pfk_chunk = cs->pf_kbm_chunk;
    L->pfk = cu_ws_take(&off, pfk && L->pfk_chunk > 0,
                        cu_pfk_ws_carve(NULL, cfg->num_kv_heads, m->group, m->topk_width,
                                        L->pfk_chunk, sz->pf_blocks_cap, NULL, NULL));
    /* The lean decode kernel where the plan's steps fit it (its merge
     * counts and partial rows). */
    L->lean_tasks = cs->lean ? cu_lean_plan_tasks(sz, m, cs->num_sms) : 0;
    L->lean = cu_ws_take(&off, L->lean_tasks > 0, cu_lean_ws_bytes(L->lean_tasks));
    L->total = off;
}

/* A buffer of the block at `base`, NULL when the layout has none. */
template <typename T>
static T *cu_ws_at(char *base, size_t off)
{
    return off == CU_WS_NONE ? NULL : (T *)(base + off);
}

/* What the CUDA backend cannot hold, from the capacities and the model. */
static msa_status cu_plan_check(const msa_plan *plan)
{
    msa_context *ctx = plan->ctx;
    const msa_model_config *cfg = &plan->model->cfg;
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
    return MSA_OK;
}

/* The sizes of a plan on this context's device. */
static void cu_plan_sizes(const msa_plan *plan, cu_sched_sizes *sz)
{
    const cu_ctx_state *cs = (const cu_ctx_state *)plan->ctx->backend_state;
    const cu_sched_device dev = {cs->num_sms, cs->grid_idx_fast, cs->grid_att_fast};
    cu_sched_size(plan, &dev, sz);
}

msa_status cu_plan_workspace(const msa_plan *plan, size_t *bytes)
{
    msa_status status = cu_plan_check(plan);
    if (status != MSA_OK)
        return status;
    cu_sched_sizes sz;
    cu_ws_layout L;
    cu_plan_sizes(plan, &sz);
    cu_ws_layout_of(plan, (const cu_ctx_state *)plan->ctx->backend_state, &sz, &L);
    *bytes = L.total;
    return MSA_OK;
}

/* Bytes of an element in the Hopper kernels' maps of a plane of this
 * type: 16-bit rows and fp8 codes; 0 (no map) for every other. */
static uint32_t cu_map_elem_bytes(msa_dtype d)
{
    return d == MSA_DTYPE_BF16 || d == MSA_DTYPE_FP16 ? 2u : d == MSA_DTYPE_FP8_E4M3 ? 1u : 0u;
}

/* Whether the Hopper kernels may copy an nvfp4 plane's tiles by plain
 * bulk copies: a (page, head) region (library layout: 128 rows of 64
 * code bytes, then their 8-byte group-scale rows, SPEC 8) starts on a
 * 16-byte boundary, as the copies need, when the base does and the page
 * and head strides' bytes (9 per 16 elements) are multiples of 16. */
static int cu_nvfp4_pages_bulk(const void *base, const msa_plane_strides *s, uint64_t pages,
                               uint32_t page_size, uint32_t heads)
{
    if (!base || ((uintptr_t)base & 15u) != 0 || page_size != 128)
        return 0;
    return (pages == 1 || (s->page > 0 && s->page % 256 == 0)) &&
           (heads == 1 || (s->head > 0 && s->head % 256 == 0));
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
     * multiple of that; the copies' maps after the layers'. */
    const size_t map_bytes = (size_t)(layers + 1) * CU_MAPS * sizeof(CUtensorMap);
    st->maps = (CUtensorMap *)aligned_alloc(alignof(CUtensorMap), map_bytes);
    st->map_ok = (uint8_t *)calloc((size_t)layers, 1);
    if (!st->maps || !st->map_ok)
        return 1;
    memset(st->maps, 0, map_bytes);
    const uint64_t pages = (uint64_t)cache->cfg.num_pages;
    const uint32_t P = (uint32_t)cache->cfg.page_size;
    const uint32_t hkv = (uint32_t)m->cfg.num_kv_heads;
    for (int32_t l = 0; l < layers; ++l) {
        /* Dense layers: K and V only, for the Hopper prefill kernel.  The
         * maps take the planes' strides: the library layout's or an
         * engine's (msa_cache_wrap_strided). */
        void *const *planes = cache->planes + (size_t)l * 4;
        const msa_plane_strides *s = cache->strides + (size_t)l * 4;
        CUtensorMap *mp = st->maps + (size_t)l * CU_MAPS;
        uint8_t ok = 0;
        const uint32_t ib = cu_map_elem_bytes(cache->cfg.index_dtype);
        const uint32_t kb = cu_map_elem_bytes(cache->cfg.kv_dtype);
        if (m->layer_sparse[l] && cache->cfg.index_dtype == MSA_DTYPE_NVFP4) {
            if (cu_nvfp4_pages_bulk(planes[MSA_PLANE_INDEX_K], &s[MSA_PLANE_INDEX_K], pages, P, 1))
                ok |= 1u << CU_MAP_INDEX_K;
        } else if (m->layer_sparse[l] && ib &&
                   cu_tma_map_plane(&mp[CU_MAP_INDEX_K], planes[MSA_PLANE_INDEX_K],
                                    &s[MSA_PLANE_INDEX_K], pages, P, 1, 128, ib) == 0) {
            ok |= 1u << CU_MAP_INDEX_K;
        }
        if (cache->cfg.kv_dtype == MSA_DTYPE_NVFP4) {
            if (cu_nvfp4_pages_bulk(planes[MSA_PLANE_K], &s[MSA_PLANE_K], pages, P, hkv))
                ok |= 1u << CU_MAP_K;
            if (cu_nvfp4_pages_bulk(planes[MSA_PLANE_V], &s[MSA_PLANE_V], pages, P, hkv))
                ok |= 1u << CU_MAP_V;
        }
        if (kb && cu_tma_map_plane(&mp[CU_MAP_K], planes[MSA_PLANE_K], &s[MSA_PLANE_K], pages, P,
                                   hkv, 64, kb) == 0)
            ok |= 1u << CU_MAP_K;
        if (kb && cu_tma_map_plane(&mp[CU_MAP_V], planes[MSA_PLANE_V], &s[MSA_PLANE_V], pages, P,
                                   hkv, 64, kb) == 0)
            ok |= 1u << CU_MAP_V;
        st->map_ok[l] = ok;
    }
    /* The copies' maps (one set: every layer's copy lies in the same
     * place). */
    cu_widen_copies *w = &st->widen;
    CUtensorMap *wm = st->maps + (size_t)layers * CU_MAPS;
    w->maps = wm;
    const int map_of[CU_MAPS] = {MSA_PLANE_INDEX_K, MSA_PLANE_K, MSA_PLANE_V};
    static_assert(CU_MAP_INDEX_K == 0 && CU_MAP_K == 1 && CU_MAP_V == 2 && CU_MAPS == 3,
                  "map order");
    for (int i = 0; i < CU_MAPS; ++i) {
        const int pl = map_of[i];
        if (w->copy[pl] &&
            cu_tma_map_plane(&wm[i], w->copy[pl], &w->strides[pl], pages, P, (uint32_t)w->heads[pl],
                             pl == MSA_PLANE_INDEX_K ? 128 : 64, 2) == 0)
            w->map_ok |= 1u << i;
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

    msa_status status = cu_plan_check(plan);
    if (status != MSA_OK)
        return status;

    cu_plan_state *st = msa_alloc_fault() ? NULL : (cu_plan_state *)calloc(1, sizeof(*st));
    if (!st)
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY, "out of host memory");

    const int any_sparse = cu_sched_any_layer(m, 1, 0);
    const int any_iv = cu_sched_any_layer(m, 1, 1);
    const int32_t Hkv = cfg->num_kv_heads, Hi = cfg->num_index_heads;
    const int32_t W = m->topk_width;
    const int32_t index_heads_per_unit = Hi >= Hkv ? Hi / Hkv : 1;

    cu_plan_sizes(plan, &st->sz);
    st->pdl = cs->pdl;
    st->tma = cs->tma;
    st->wgmma = cs->wgmma;
    st->pfi_wgmma = cs->pfi_wgmma;

    /* Every device buffer in one block: the caller's workspace (zeroed
     * here, as the kernels expect their counters at 0) or the library's. */
    cu_ws_layout L;
    cu_ws_layout_of(plan, cs, &st->sz, &L);
    cudaError_t e;
    char *base;
    if (plan->workspace) {
        if (plan->workspace_bytes < L.total) {
            cu_state_release(st);
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                 "workspace of %zu bytes, the CUDA plan needs %zu",
                                 plan->workspace_bytes, L.total);
        }
        base = (char *)plan->workspace;
        e = cudaMemset(base, 0, L.total);
        if (e != cudaSuccess) {
            cu_state_release(st);
            cudaGetLastError();
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                 "the workspace (%zu bytes at %p) cannot be zeroed on the "
                                 "context's device: %s",
                                 L.total, plan->workspace, cudaGetErrorString(e));
        }
    } else {
        e = cu_zalloc(&st->ws_owned, L.total);
        base = (char *)st->ws_owned;
    }
    /* The zeroing runs on the legacy stream: done before any stream of the
     * engine's uses the buffers. */
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(cudaStreamLegacy);
    for (int i = 0; i < 2 && e == cudaSuccess; ++i) {
        e = msa_alloc_fault() ? cudaErrorMemoryAllocation
                              : cudaMallocHost(&st->staging[i], st->sz.meta_bytes);
        if (e == cudaSuccess) {
            memset(st->staging[i], 0, st->sz.meta_bytes);
            e = cudaEventCreateWithFlags(&st->staged[i], cudaEventDisableTiming);
        }
    }
    if (e == cudaSuccess) {
        st->meta_dev = cu_ws_at<void>(base, L.meta);
        st->scores = cu_ws_at<float>(base, L.scores);
        st->sel = cu_ws_at<int32_t>(base, L.sel);
        st->uids = cu_ws_at<int32_t>(base, L.uids);
        st->umask = cu_ws_at<uint32_t>(base, L.umask);
        st->ucnt = cu_ws_at<int32_t>(base, L.ucnt);
        st->sel_done = cu_ws_at<int32_t>(base, L.sel_done);
        st->idx_next = cu_ws_at<int32_t>(base, L.idx_next);
        st->pf_scratch = cu_ws_at<float>(base, L.pf_scratch);
        st->part = cu_ws_at<float>(base, L.part);
        st->grid_pfi = L.grid_pfi;
        st->pfi_scratch = cu_ws_at<float>(base, L.pfi_scratch);
        st->pfi_split = cu_ws_at<int32_t>(base, L.pfi_split);
        st->lean_ws = cu_ws_at<void>(base, L.lean);
        cu_widen_describe(plan, &st->widen);
        for (int pl = 0; pl < CU_WIDEN_PLANES; ++pl)
            st->widen.copy[pl] = cu_ws_at<void>(base, L.widen[pl]);
        st->lean_tasks = L.lean_tasks;
        if (L.pfk != CU_WS_NONE) {
            cu_pfk_ws_carve(base + L.pfk, cfg->num_kv_heads, m->group, m->topk_width, L.pfk_chunk,
                            st->sz.pf_blocks_cap, &st->pfk_ws, &st->pfk_items_cap);
            st->pfk_chunk = L.pfk_chunk;
            /* Where its kernels cannot be set up, the union kernel serves. */
            st->pfk = cu_pfk_setup() == cudaSuccess;
            if (!st->pfk)
                cudaGetLastError();
        }
        if (st->pfi_scratch)
            e = cu_pfidx_setup(
                cu_pfidx_smem(index_heads_per_unit, cfg->topk_blocks, W, st->sz.sel_cache));
        /* The Hopper tensor-map kernel where its shared memory fits (the
         * selection's words of eight warps beside the ring); else the
         * wgmma kernel with cp.async keys. */
        const size_t pfit_smem =
            cu_pfit_smem(index_heads_per_unit, cfg->topk_blocks, W, st->sz.sel_cache);
        if (e == cudaSuccess && st->pfi_scratch && st->pfi_wgmma &&
            pfit_smem <= CU_PFIT_SMEM_LIMIT) {
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

/* The step's page table from the caller's device rows (msa_plan_update_ex
 * with MSA_MEMORY_DEVICE), after the upload of the rest of the blob in
 * stream order: copies the entries each request uses into the blob's table
 * (rows cap_pages apart, -1 after them, as a host upload leaves them) and
 * sets the page of each token row's cache write.  The host could not check
 * the entries: one outside the pool becomes page 0 in the table, so that
 * every kernel's reads stay inside the cache, and page -1 for the write,
 * which the prologue drops.  One thread per table cell, then per token. */
__global__ void cu_device_table_kernel(const int32_t *src, int64_t stride, int32_t *dst,
                                       int32_t cap_pages, int32_t num_requests,
                                       const int32_t *kv_len, int32_t log_page, int64_t num_pages,
                                       cu_tok_info *tok, int32_t num_tokens)
{
    const int64_t cells = (int64_t)num_requests * cap_pages;
    const int64_t all = cells + num_tokens;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < all;
         i += (int64_t)gridDim.x * blockDim.x) {
        if (i < cells) {
            const int32_t r = (int32_t)(i / cap_pages);
            const int64_t n = i - (int64_t)r * cap_pages;
            const int64_t need = ((int64_t)kv_len[r] + (1 << log_page) - 1) >> log_page;
            int32_t v = -1;
            if (n < need) {
                v = src[(int64_t)r * stride + n];
                if (v < 0 || v >= num_pages)
                    v = 0;
            }
            dst[i] = v;
        } else {
            cu_tok_info *ti = &tok[i - cells];
            const int32_t r = ti->r;
            if (r >= 0) {
                const int32_t v = src[(int64_t)r * stride + (ti->pos >> log_page)];
                ti->page = v >= 0 && v < num_pages ? v : -1;
            }
        }
    }
}

/* Launches cu_device_table_kernel for the plan's current step on s. */
static cudaError_t cu_device_table(const msa_plan *plan, const cu_plan_state *st, cudaStream_t s)
{
    const int64_t all = (int64_t)plan->num_requests * st->sz.cap_pages + plan->num_tokens;
    if (all == 0)
        return cudaSuccess;
    int32_t log_page = 0;
    while ((1 << log_page) < plan->cache->cfg.page_size)
        ++log_page;
    const int threads = 256;
    const int64_t want = (all + threads - 1) / threads;
    const int grid = (int)(want < 8 * (int64_t)st->sz.num_sms ? want : 8 * (int64_t)st->sz.num_sms);
    cu_device_table_kernel<<<grid, threads, 0, s>>>(plan->device_table, plan->device_table_stride,
                                                    st->dev.page_table, st->sz.cap_pages,
                                                    plan->num_requests, st->dev.kv_len, log_page,
                                                    plan->cache->cfg.num_pages, st->dev.tok_info,
                                                    (int32_t)plan->num_tokens);
    return cudaGetLastError();
}

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

    /* A device table is not in the staging copy: its rows are copied on
     * the device after the upload of everything before them. */
    const size_t bytes =
        st->sz.pt_offset + (plan->table_on_device
                                ? 0
                                : sizeof(int32_t) * (size_t)plan->num_requests * st->sz.cap_pages);
    cudaStream_t s = (cudaStream_t)stream;
    CU_TRY(ctx, cudaMemcpyAsync(st->meta_dev, st->staging[si], bytes, cudaMemcpyHostToDevice, s));
    if (plan->table_on_device)
        CU_TRY(ctx, cu_device_table(plan, st, s));
    CU_TRY(ctx, cudaEventRecord(st->staged[si], s));
    st->staging_used[si] = 1;
    st->next_staging = si ^ 1;
    return MSA_OK;
}
