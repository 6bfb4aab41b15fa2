/*
 * Plans of the CUDA backend: sizing from the capacities (plan_init), the
 * per-step schedule built on the host and published with one async copy
 * (plan_upload), and release (plan_free).  See plan.cuh for the layout.
 */
#include "cuda/backend.cuh"
#include "cuda/arch/tma_sm90.cuh"
#include "cuda/kernels/indexer/indexer_prefill_mma_sm80.cuh"
#include "cuda/kernels/attention/attention_prefill_mma_sm80.cuh"
#include "cuda/kernels/attention/attention_prefill_tma_sm90.cuh"

#include <stdlib.h>
#include <string.h>

/* Selection CTAs per SM (build-time setting, for measurements).  With 4
 * (the default) a step's rows run on many warps side by side.  With 1, a
 * selection CTA fits beside an indexer CTA and beside an attention CTA on
 * one SM (registers: 128 x 120 + 288 x 168 <= 64K), so the attention's
 * CTAs can enter while the selection runs.  Measured on the H200: 1 gained
 * 0.5 µs at batch 8, 1K, 1 token and cost 7% at batch 128, 10K, 8 tokens;
 * 2 was slower or level on the H200.  (That was with one
 * attention producer warp; with two, 320 x 168 registers, the attention
 * no longer fits beside a selection CTA.) */
#define SEL_CTAS_PER_SM 4

static size_t cu_align16(size_t x)
{
    return (x + 15) & ~(size_t)15;
}

static int32_t cu_ceil_div32(int64_t a, int64_t b)
{
    return (int32_t)((a + b - 1) / b);
}

/* Views of a blob at `base` (device or staging) with the state's layout;
 * returns the blob size.  With base 0 the views hold plain offsets. */
size_t cu_meta_carve(const cu_plan_state *st, uintptr_t base, cu_meta *m)
{
    size_t off = 0;
#define CARVE(field, type, count)               \
    m->field = (type *)(base + (uintptr_t)off); \
    off = cu_align16(off + sizeof(type) * (size_t)(count))
    CARVE(hdr, cu_step_hdr, 1);
    CARVE(q_len, int32_t, st->cap_req);
    CARVE(kv_len, int32_t, st->cap_req);
    CARVE(q_start, int32_t, st->cap_req);
    CARVE(tok_info, cu_tok_info, st->cap_tok);
    CARVE(dec_req, int32_t, st->cap_req);
    CARVE(dec_row0, int32_t, st->cap_req);
    CARVE(dec_blk0, int32_t, st->cap_req + 1);
    CARVE(dec_info, cu_dec_info, st->cap_req);
    CARVE(dec_row, cu_dec_row, st->dec_rows_cap);
    CARVE(pf_tok, int32_t, st->cap_tok);
    CARVE(pf_tiles[0], cu_pf_tile, st->pf_tiles_cap[0]);
    CARVE(pf_tiles[1], cu_pf_tile, st->pf_tiles_cap[1]);
    for (int k = 0; k < CU_KINDS; ++k) {
        CARVE(att[k], cu_att_item, st->att_cap);
    }
    for (int k = 0; k < CU_KINDS; ++k) {
        CARVE(merge[k], cu_merge_item, st->merge_cap);
    }
    CARVE(att_units, int32_t, st->att_cap);
    CARVE(att_cta, int32_t, (int64_t)st->num_sms + 1);
    CARVE(page_table, int32_t, (int64_t)st->cap_req * st->cap_pages);
    CARVE(sched_heap, uint64_t, st->num_sms);
    CARVE(sched_i32, int32_t, 4 * (int64_t)st->att_cap + st->num_sms + st->sched_costs);
#undef CARVE
    return off;
}

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

static int cu_any_layer(const msa_model *m, int want_sparse, int want_iv)
{
    for (int32_t l = 0; l < m->cfg.num_layers; ++l) {
        const int sp = m->layer_sparse[l] != 0;
        const int iv = sp && m->layer_index_value[l] != 0;
        if (want_iv ? iv : (want_sparse ? sp : !sp))
            return 1;
    }
    return 0;
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

static int32_t cu_max32(int32_t a, int32_t b)
{
    return a > b ? a : b;
}

static int32_t cu_min32(int32_t a, int32_t b)
{
    return a < b ? a : b;
}

/* Capacities, grids and the metadata layout of a plan's device state, from
 * the plan's capacities and the device (host arithmetic only). */
void cu_state_size(const msa_plan *plan, int num_sms, int grid_idx_fast, int grid_att_fast,
                   cu_plan_state *st)
{
    const msa_model *m = plan->model;
    const msa_model_config *cfg = &m->cfg;
    const int any_sparse = cu_any_layer(m, 1, 0);
    const int32_t Hkv = cfg->num_kv_heads, Hi = cfg->num_index_heads;
    const int32_t G = m->group;
    const int32_t W = m->topk_width;
    st->cap_req = cu_max32((int32_t)plan->cap_requests, 1);
    st->cap_tok = cu_max32((int32_t)plan->cap_tokens, 1);
    /* The longest request a step of this plan can hold: its token rows,
     * or the plan's max_q_len when that is lower. */
    st->cap_q = plan->params.max_q_len > 0 && plan->params.max_q_len < st->cap_tok
                    ? plan->params.max_q_len
                    : st->cap_tok;
    st->cap_kv = cu_max32((int32_t)plan->cap_kv_len, 1);
    st->cap_pages = cu_max32((int32_t)plan->cap_pages_per_request, 1);
    st->cap_blocks = any_sparse ? cu_ceil_div32(st->cap_kv, cfg->block_size) : 1;
    st->dec_rows_cap = (int32_t)((int64_t)st->cap_tok < (int64_t)CU_DEC_MAX_Q * st->cap_req
                                     ? st->cap_tok
                                     : CU_DEC_MAX_Q * st->cap_req);
    st->cap_union = any_sparse ? cu_min32(CU_DEC_MAX_Q * W, st->cap_blocks) : 1;
    /* A unit's estimated cost is at most its union's tiles + 2 (see
     * cu_build_items). */
    st->sched_costs = cu_ceil_div32((int64_t)st->cap_union * cfg->block_size, CU_TILE_KEYS) + 3;
    st->num_sms = num_sms;

    const int sms = num_sms;
    st->grid_tok = cu_max32(cu_min32(st->cap_tok, sms * 8), 1);
    st->grid_idx = sms * 4;
    st->grid_idx_fast = grid_idx_fast;
    /* Scores of a row kept in shared memory by the selecting warp (and the
     * union's per-block bits): the whole row up to 4096 blocks. */
    st->sel_cache = any_sparse ? cu_min32(st->cap_blocks, 4096) : 0;
    /* More warps than rows at batch 128 x 8 tokens x 4 units: a warp's row
     * is a chain of latencies, so rows run side by side, not in turn. */
    st->grid_sel = sms * SEL_CTAS_PER_SM;
    /* Prefill items go to the selection's first grid_pf CTAs. */
    st->grid_pf = cu_min32(sms * 2, st->grid_sel);
    st->grid_att = sms * 4;
    st->grid_att_fast = grid_att_fast;
    st->grid_merge = sms * 2;

    /* Work units of one step: (decode request, KV head, 64-row chunk). */
    const int32_t chunks_main = cu_ceil_div32((int64_t)CU_DEC_MAX_Q * G, CU_ROWS_PER_ITEM);
    const int32_t chunks_iv = cu_ceil_div32((int64_t)CU_DEC_MAX_Q * Hi, CU_ROWS_PER_ITEM);
    const int64_t units_cap =
        (int64_t)st->cap_req * (Hkv * chunks_main > chunks_iv ? Hkv * chunks_main : chunks_iv);
    const int32_t target = 2 * st->grid_att_fast;
    st->att_cap = (int32_t)(units_cap + target);
    st->merge_cap = (int32_t)units_cap;
    st->part_rows_cap = 2 * target * CU_ROWS_PER_ITEM;
    {
        int32_t dmax = cfg->head_dim > cfg->index_dim ? cfg->head_dim : cfg->index_dim;
        st->part_stride = (dmax + 1 + 3) & ~3;
    }

    /* Prefill attention tiles (attention_prefill_mma_sm80): none when no
     * request can exceed the decode path's q_len. */
    st->pf_tiles_cap[0] = st->pf_tiles_cap[1] = 0;
    if (st->cap_q > CU_DEC_MAX_Q) {
        st->pf_tiles_cap[0] = cu_pfa_tiles_cap(st->cap_tok, st->cap_req, cu_pfa_tile_tokens(G));
        if (cu_any_layer(m, 1, 1))
            st->pf_tiles_cap[1] =
                cu_pfa_tiles_cap(st->cap_tok, st->cap_req, cu_pfa_tile_tokens(Hi));
    }

    {
        cu_meta offs;
        st->meta_bytes = cu_meta_carve(st, 0, &offs);
        st->pt_offset = (size_t)(uintptr_t)offs.page_table;
    }
    st->plan_caps[0] = plan->cap_requests;
    st->plan_caps[1] = plan->cap_tokens;
    st->plan_caps[2] = plan->cap_kv_len;
    st->plan_caps[3] = plan->cap_pages_per_request;
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

    const int any_sparse = cu_any_layer(m, 1, 0);
    const int any_iv = cu_any_layer(m, 1, 1);
    const int32_t Hkv = cfg->num_kv_heads, Hi = cfg->num_index_heads;
    const int32_t W = m->topk_width;
    const int32_t mi = Hi >= Hkv ? Hi / Hkv : 1;
    const int32_t units = Hi < Hkv ? Hi : Hkv;

    cu_state_size(plan, cs->num_sms, cs->grid_idx_fast, cs->grid_att_fast, st);
    st->pdl = cs->pdl;
    st->tma = cs->tma;
    st->wgmma = cs->wgmma;
    st->pfi_wgmma = cs->pfi_wgmma;

    cudaError_t e = cu_zalloc(&st->meta_dev, st->meta_bytes);
    for (int i = 0; i < 2 && e == cudaSuccess; ++i) {
        e = msa_alloc_fault() ? cudaErrorMemoryAllocation
                              : cudaMallocHost(&st->staging[i], st->meta_bytes);
        if (e == cudaSuccess) {
            memset(st->staging[i], 0, st->meta_bytes);
            e = cudaEventCreateWithFlags(&st->staged[i], cudaEventDisableTiming);
        }
    }
    if (e == cudaSuccess && any_sparse)
        e = cu_zalloc((void **)&st->scores,
                      sizeof(float) * (size_t)st->dec_rows_cap * Hi * st->cap_blocks);
    if (e == cudaSuccess && any_sparse)
        e = cu_zalloc((void **)&st->sel, sizeof(int32_t) * (size_t)st->cap_tok * Hkv * W);
    if (e == cudaSuccess && any_sparse)
        e = cu_zalloc((void **)&st->uids,
                      sizeof(int32_t) * (size_t)st->cap_req * Hkv * st->cap_union);
    if (e == cudaSuccess && any_sparse)
        e = cu_zalloc((void **)&st->umask,
                      sizeof(uint32_t) * (size_t)st->cap_req * Hkv * st->cap_union);
    if (e == cudaSuccess && any_sparse)
        e = cu_zalloc((void **)&st->ucnt, sizeof(int32_t) * (size_t)st->cap_req * Hkv);
    if (e == cudaSuccess && any_sparse)
        e = cu_zalloc((void **)&st->sel_done, sizeof(int32_t) * (size_t)st->cap_req * units);
    if (e == cudaSuccess && any_sparse)
        e = cu_zalloc((void **)&st->idx_next, sizeof(int32_t));
    if (e == cudaSuccess && any_sparse)
        e = cu_zalloc((void **)&st->pf_scratch,
                      sizeof(float) * (size_t)st->grid_pf * mi * st->cap_blocks);
    if (e == cudaSuccess)
        e = cu_zalloc((void **)&st->part,
                      sizeof(float) * (size_t)st->part_rows_cap * st->part_stride);
    /* Prefill indexer on tensor cores: shapes it covers (cu_choose_paths'
     * idx_fast conditions on the model and the cache; the forward runs it
     * where the plan's paths take idx_fast) and a plan that can hold a
     * prefill request.  Its workspace: 64 rows of block scores
     * per CTA (CU_PFI_ROWS x cap_blocks floats, 256 KB a CTA at 128K
     * tokens).  The debugging option cuda_no_prefill_indexer keeps the
     * scalar role. */
    if (e == cudaSuccess && any_sparse && cs->pfi && cu_pfidx_shape(plan) &&
        st->cap_q > CU_DEC_MAX_Q) {
        st->grid_pfi = cu_pfidx_grid(st->num_sms);
        e = cu_zalloc((void **)&st->pfi_scratch,
                      sizeof(float) * cu_pfidx_scratch_floats(st->grid_pfi, st->cap_blocks));
        if (e == cudaSuccess)
            e = cu_zalloc((void **)&st->pfi_split,
                          sizeof(int32_t) * cu_pfidx_split_words(st->grid_pfi));
        if (e == cudaSuccess)
            e = cu_pfidx_setup(cu_pfidx_smem(mi, cfg->topk_blocks, W, st->sel_cache));
    }
    if (e != cudaSuccess) {
        cu_state_release(st);
        cudaGetLastError();
        return msa_set_error(ctx,
                             e == cudaErrorMemoryAllocation ? MSA_ERR_OUT_OF_MEMORY
                                                            : MSA_ERR_BACKEND,
                             "CUDA plan allocation failed: %s", cudaGetErrorString(e));
    }
    cu_meta_carve(st, (uintptr_t)st->meta_dev, &st->dev);
    if (any_sparse) {
        cu_layer probe;
        memset(&probe, 0, sizeof probe);
        probe.mi = mi;
        probe.K = cfg->topk_blocks;
        probe.W = W;
        probe.sel_cache = st->sel_cache;
        e = cu_select_setup(cu_select_smem(&probe));
        if (e != cudaSuccess) {
            cu_state_release(st);
            return msa_set_error(ctx, MSA_ERR_BACKEND, "selection kernel setup: %s",
                                 cudaGetErrorString(e));
        }
    }
    /* Prefill attention on tensor cores: its grid, when a step can hold a
     * prefill request (else it is never launched). */
    st->grid_pfa = 0;
    if (st->pf_tiles_cap[0] > 0) {
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

/* ---- per-step schedule --------------------------------------------------- */

typedef struct cu_sched_kind {
    int kind;
    int32_t groups;    /* KV heads of the pass */
    int32_t g;         /* query heads per KV head */
    int32_t one_round; /* the Hopper kernel: one CTA per SM, items in turn */
} cu_sched_kind;

int cu_attn_tma_shape(const msa_plan *plan, const cu_plan_state *st)
{
    const msa_model *m = plan->model;
    const msa_cache_config *cc = &plan->cache->cfg;
    return st->tma && st->wgmma && cc->page_size == 128 && m->cfg.block_size == 128 &&
           m->cfg.head_dim == 128 && m->group == 16;
}

/* Whether the sparse pass runs on the Hopper attention: the plan state's
 * decision (cu_plan_paths).  A state whose kernels are not decided (the
 * schedule test's hand-built ones) takes the Hopper shape test with 16-bit
 * K/V planes. */
static int cu_sparse_on_tma(const msa_plan *plan, const cu_plan_state *st)
{
    if (st->path)
        return st->sparse_tma;
    const msa_cache_config *cc = &plan->cache->cfg;
    const int kv16 = cc->kv_dtype == MSA_DTYPE_BF16 || cc->kv_dtype == MSA_DTYPE_FP16;
    return kv16 && cu_attn_tma_shape(plan, st);
}

/* Min-heap of CTA loads, keyed (load << 32 | CTA): the least loaded CTA,
 * the lower index among equals, on top. */
static void cu_heap_sift_down(uint64_t *hp, int32_t n, int32_t i)
{
    for (;;) {
        const int32_t l = 2 * i + 1, r = l + 1;
        int32_t m = i;
        if (l < n && hp[l] < hp[m])
            m = l;
        if (r < n && hp[r] < hp[m])
            m = r;
        if (m == i)
            return;
        const uint64_t t = hp[i];
        hp[i] = hp[m];
        hp[m] = t;
        i = m;
    }
}

/* Deals the sparse pass's n units (costs in the scratch, each below
 * st->sched_costs) to the Hopper kernel's st->num_sms CTAs, largest first,
 * each to the CTA with the least cost so far (longest processing time
 * first), and reorders att_units so that each CTA's units are contiguous,
 * largest first, with att_cta their bounds.  Each CTA walks its units one
 * after another, so the step lasts as long as its most loaded CTA: dealt
 * in plan order, batches of requests whose contexts differ by +-25% left
 * the most loaded CTA 13-25% above the mean at 1K-10K context and 8 tokens
 * (the decode workload's lengths, by the estimate of bench/unit_balance.py);
 * this way 3-5%, and on the H200 such steps ran 3-10% faster
 * than with units dealt in order.  With equal costs (one
 * token per request past K blocks) it deals as before: unit u to CTA u mod
 * num_sms.  Counting sort and a heap: O(n log num_sms) host work. */
static void cu_balance_units(const cu_plan_state *st, cu_meta *h, int32_t n)
{
    const int32_t S = st->num_sms, C = st->sched_costs;
    int32_t *cost = h->sched_i32;
    int32_t *order = cost + st->att_cap;
    int32_t *cta_of = order + st->att_cap;
    int32_t *placed = cta_of + st->att_cap;
    int32_t *fill = placed + st->att_cap; /* [S] */
    int32_t *bucket = fill + S;           /* [C] */
    uint64_t *hp = h->sched_heap;
    /* Units by decreasing cost, plan order among equals. */
    memset(bucket, 0, sizeof(int32_t) * (size_t)C);
    for (int32_t u = 0; u < n; ++u)
        ++bucket[cost[u]];
    for (int32_t c = C - 1, pos = 0; c >= 0; --c) {
        const int32_t k = bucket[c];
        bucket[c] = pos;
        pos += k;
    }
    for (int32_t u = 0; u < n; ++u)
        order[bucket[cost[u]]++] = u;
    /* Each unit to the least loaded CTA. */
    for (int32_t c = 0; c < S; ++c) {
        hp[c] = (uint64_t)c;
        fill[c] = 0;
    }
    for (int32_t i = 0; i < n; ++i) {
        const int32_t u = order[i];
        const int32_t c = (int32_t)(hp[0] & 0xffffffffu);
        cta_of[u] = c;
        ++fill[c];
        hp[0] += (uint64_t)cost[u] << 32;
        cu_heap_sift_down(hp, S, 0);
    }
    /* Contiguous per CTA, in dealing order. */
    int32_t pos = 0;
    for (int32_t c = 0; c < S; ++c) {
        h->att_cta[c] = pos;
        pos += fill[c];
        fill[c] = h->att_cta[c];
    }
    h->att_cta[S] = pos;
    for (int32_t i = 0; i < n; ++i) {
        const int32_t u = order[i];
        placed[fill[cta_of[u]]++] = h->att_units[u];
    }
    memcpy(h->att_units, placed, sizeof(int32_t) * (size_t)n);
}

static void cu_build_items(const msa_plan *plan, const cu_plan_state *st, cu_meta *h,
                           const cu_sched_kind *sk, int32_t *part_used)
{
    const msa_model *m = plan->model;
    const int32_t n_dec = h->hdr->n_dec;
    const int32_t target = 2 * st->grid_att_fast;
    /* A unit of work is one 64-row chunk, or on the Hopper kernel two
     * chunks that share the key stream (see att_units): the union is then
     * read once for 8 tokens, and the kernel's two consumer warpgroups
     * compute the two chunks side by side, so a pair takes about as long
     * as one chunk.  Every second chunk of a (request, KV head) joins the
     * one before it. */
    const int pair = sk->one_round && sk->kind == CU_KIND_SPARSE;
    int64_t n_units = 0;
    for (int32_t k = 0; k < n_dec; ++k) {
        const int32_t chunks = cu_ceil_div32(plan->q_len[h->dec_req[k]] * sk->g, CU_ROWS_PER_ITEM);
        n_units += (int64_t)sk->groups * cu_ceil_div32(chunks, pair ? 2 : 1);
    }
    /* Splits per unit so that the items fill the GPU.  The Hopper kernel
     * runs one CTA per SM and each CTA its units one after another, each
     * paying the pipeline's fill latency again: there the units should
     * number at most one per SM (rounded down), larger rather than more. */
    int32_t s_policy;
    if (sk->one_round)
        s_policy = n_units == 0 || n_units >= st->num_sms ? 1 : st->num_sms / (int32_t)n_units;
    else
        s_policy = n_units == 0 || n_units >= target ? 1 : cu_ceil_div32(target, n_units);
    int32_t n_items = 0, n_merge = 0, n_att_units = 0;
    cu_att_item *items = h->att[sk->kind];
    cu_merge_item *merges = h->merge[sk->kind];
    for (int32_t k = 0; k < n_dec; ++k) {
        const int32_t r = h->dec_req[k];
        const int32_t ql = plan->q_len[r];
        const int32_t kl = plan->kv_len[r];
        const int32_t rows = ql * sk->g;
        int64_t est_keys;
        const int32_t B = m->cfg.block_size;
        const int64_t reach = (kl + B - 1) / B; /* blocks of a sparse request */
        if (sk->kind == CU_KIND_SPARSE) {
            const int64_t sel = (int64_t)ql * m->topk_width;
            est_keys = (reach < sel ? reach : sel) * B;
        } else {
            est_keys = kl;
        }
        const int32_t est_tiles = cu_max32(cu_ceil_div32(est_keys, CU_TILE_KEYS), 1);
        const int32_t unit_rows = (pair ? 2 : 1) * CU_ROWS_PER_ITEM;
        for (int32_t grp = 0; grp < sk->groups; ++grp) {
            for (int32_t urow0 = 0; urow0 < rows; urow0 += unit_rows) {
                const int32_t urows = cu_min32(unit_rows, rows - urow0);
                const int32_t nch = cu_ceil_div32(urows, CU_ROWS_PER_ITEM);
                const int32_t nrows0 = cu_min32(CU_ROWS_PER_ITEM, urows);
                /* A split writes nrows partial rows (D+1 floats each) and the
                 * merge reads them back: keep each split's keys worth that. */
                const int32_t s_work = cu_max32((int32_t)((int64_t)est_tiles * 8 / nrows0), 1);
                int32_t S = cu_min32(s_policy, s_work);
                if (S > 1 &&
                    (*part_used + (int64_t)S * urows > st->part_rows_cap ||
                     n_items + (int64_t)S * nch > st->att_cap || n_merge + nch > st->merge_cap))
                    S = 1;
                int32_t pbase[2] = {0, 0};
                for (int32_t c = 0; c < nch && S > 1; ++c) {
                    const int32_t row0 = urow0 + c * CU_ROWS_PER_ITEM;
                    const int32_t nrows = cu_min32(CU_ROWS_PER_ITEM, rows - row0);
                    pbase[c] = *part_used;
                    *part_used += S * nrows;
                    cu_merge_item *mi = &merges[n_merge++];
                    mi->dec = k;
                    mi->group = grp;
                    mi->row0 = row0;
                    mi->nrows = nrows;
                    mi->nsplit = S;
                    mi->part_base = pbase[c];
                    mi->t0 = (int32_t)plan->q_start[r];
                    mi->pad1 = 0;
                }
                /* The unit's cost for the balancing: the tiles of its
                 * tokens' union at most (each token selects W blocks),
                 * its share of them when split, and two tiles' worth for
                 * its fixed costs (queries, partial rows, the ring's
                 * fill). */
                int32_t unit_cost = 0;
                if (sk->kind == CU_KIND_SPARSE) {
                    const int64_t utok = cu_ceil_div32(urows, sk->g);
                    const int64_t ublk = reach < utok * m->topk_width ? reach
                                                                      : utok * m->topk_width;
                    const int32_t tiles = cu_ceil_div32(ublk * B, CU_TILE_KEYS);
                    unit_cost = cu_min32(cu_ceil_div32(tiles, S) + 2, st->sched_costs - 1);
                }
                for (int32_t s = 0; s < S; ++s) {
                    if (sk->kind == CU_KIND_SPARSE) {
                        h->sched_i32[n_att_units] = unit_cost;
                        h->att_units[n_att_units++] = n_items;
                    }
                    for (int32_t c = 0; c < nch; ++c) {
                        const int32_t row0 = urow0 + c * CU_ROWS_PER_ITEM;
                        cu_att_item *it = &items[n_items++];
                        it->dec = k;
                        it->group = grp;
                        it->row0 = row0;
                        it->nrows = cu_min32(CU_ROWS_PER_ITEM, rows - row0);
                        it->split = s;
                        it->nsplit = S;
                        it->part_base = pbase[c];
                        it->r = r;
                        it->ql = ql;
                        it->kl = kl;
                        it->t0 = (int32_t)plan->q_start[r];
                        it->unit_len = c == 0 ? nch : 0;
                    }
                }
            }
        }
    }
    if (sk->kind == CU_KIND_SPARSE) {
        h->hdr->n_att_units = n_att_units;
        cu_balance_units(st, h, n_att_units);
    }
    h->hdr->n_att[sk->kind] = n_items;
    h->hdr->n_merge[sk->kind] = n_merge;
}

/* The schedule of the plan's current step into the metadata views h
 * (host memory): request arrays, decode and prefill lists, page tables and
 * the work items of every attention pass (host work only). */
void cu_step_fill(const msa_plan *plan, cu_plan_state *st, cu_meta *h)
{
    const msa_model *m = plan->model;
    const int32_t B = m->cfg.block_size;
    const int any_sparse = cu_any_layer(m, 1, 0);
    memset(h->hdr, 0, sizeof(*h->hdr));

    const int32_t R = plan->num_requests;
    h->hdr->num_requests = R;
    h->hdr->num_tokens = (int32_t)plan->num_tokens;
    int32_t n_dec = 0, dec_rows = 0, n_pf = 0, blocks = 0, max_nblk = 0;
    for (int32_t r = 0; r < R; ++r) {
        const int32_t ql = plan->q_len[r];
        h->q_len[r] = ql;
        h->kv_len[r] = plan->kv_len[r];
        h->q_start[r] = (int32_t)plan->q_start[r];
        if (ql == 0)
            continue;
        if (ql <= CU_DEC_MAX_Q) {
            h->dec_req[n_dec] = r;
            h->dec_row0[n_dec] = dec_rows;
            h->dec_blk0[n_dec] = blocks;
            for (int32_t i = 0; i < ql; ++i) {
                const int64_t t = plan->q_start[r] + i;
                cu_dec_row *dr = &h->dec_row[dec_rows + i];
                dr->t = (int32_t)t;
                dr->nblk = (int32_t)(plan->token_pos[t] / B) + 1;
                max_nblk = cu_max32(max_nblk, dr->nblk);
                dr->slot = n_dec;
                dr->ql = ql;
            }
            dec_rows += ql;
            cu_dec_info *di = &h->dec_info[n_dec];
            di->r = r;
            di->ql = ql;
            di->kl = plan->kv_len[r];
            di->t0 = (int32_t)plan->q_start[r];
            di->d0 = dec_rows - ql;
            di->blk0 = blocks;
            /* The indexer scores only requests with more than K blocks:
             * with at most K every reachable block is selected whatever
             * the scores (SPEC 4), and nothing else reads them. */
            const int32_t req_blocks = cu_ceil_div32(plan->kv_len[r], B);
            if (any_sparse && req_blocks > m->cfg.topk_blocks)
                blocks += req_blocks;
            di->blk1 = blocks;
            di->nblk = req_blocks;
            ++n_dec;
        } else {
            for (int32_t i = 0; i < ql; ++i)
                h->pf_tok[n_pf++] = (int32_t)plan->q_start[r] + i;
        }
    }
    h->dec_blk0[n_dec] = blocks;
    h->hdr->n_dec = n_dec;
    h->hdr->n_dec_rows = dec_rows;
    h->hdr->max_dec_nblk = max_nblk;
    h->hdr->n_pf = n_pf;
    h->hdr->total_dec_blocks = blocks;
    const int32_t P = plan->cache->cfg.page_size;
    for (int64_t t = 0; t < plan->num_tokens; ++t) {
        const int32_t r = plan->token_request[t];
        const int64_t pos = plan->token_pos[t];
        cu_tok_info *ti = &h->tok_info[t];
        ti->r = r;
        ti->pos = (int32_t)pos;
        ti->page = r >= 0 ? plan->page_table[(int64_t)r * plan->cap_pages_per_request + pos / P]
                          : -1;
        ti->pad = 0;
    }
    for (int32_t r = 0; r < R; ++r)
        memcpy(h->page_table + (int64_t)r * st->cap_pages,
               plan->page_table + (int64_t)r * plan->cap_pages_per_request,
               sizeof(int32_t) * (size_t)plan->cap_pages_per_request);

    int32_t part_used = 0;
    if (any_sparse) {
        cu_sched_kind sk = {CU_KIND_SPARSE, m->cfg.num_kv_heads, m->group,
                            cu_sparse_on_tma(plan, st)};
        cu_build_items(plan, st, h, &sk, &part_used);
    }
    if (cu_any_layer(m, 0, 0)) {
        cu_sched_kind sk = {CU_KIND_DENSE, m->cfg.num_kv_heads, m->group, 0};
        part_used = 0; /* passes run one after another: partials are reused */
        cu_build_items(plan, st, h, &sk, &part_used);
    }
    if (cu_any_layer(m, 1, 1)) {
        cu_sched_kind sk = {CU_KIND_IV, 1, m->cfg.num_index_heads, 0};
        part_used = 0;
        cu_build_items(plan, st, h, &sk, &part_used);
    }

    cu_pfa_fill_tiles(plan, st, h);

    int32_t max_q = 0;
    for (int32_t r = 0; r < R; ++r)
        max_q = plan->q_len[r] > max_q ? plan->q_len[r] : max_q;
    st->max_q_len = max_q;
    st->n_pf = n_pf;
}

msa_status cu_plan_upload(msa_plan *plan, void *stream)
{
    msa_context *ctx = plan->ctx;
    const cu_ctx_state *cs = (const cu_ctx_state *)ctx->backend_state;
    cu_plan_state *st = (cu_plan_state *)plan->backend;
    CU_TRY(ctx, cudaSetDevice(cs->device));
    if (!st || st->plan_caps[0] != plan->cap_requests || st->plan_caps[1] != plan->cap_tokens ||
        st->plan_caps[2] != plan->cap_kv_len || st->plan_caps[3] != plan->cap_pages_per_request) {
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
    cu_meta_carve(st, (uintptr_t)st->staging[si], &h);
    cu_step_fill(plan, st, &h);

    const size_t bytes =
        st->pt_offset + sizeof(int32_t) * (size_t)plan->num_requests * st->cap_pages;
    cudaStream_t s = (cudaStream_t)stream;
    CU_TRY(ctx, cudaMemcpyAsync(st->meta_dev, st->staging[si], bytes, cudaMemcpyHostToDevice, s));
    CU_TRY(ctx, cudaEventRecord(st->staged[si], s));
    st->staging_used[si] = 1;
    st->next_staging = si ^ 1;
    return MSA_OK;
}
