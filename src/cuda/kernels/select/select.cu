/*
 * Selection stage of a sparse layer, one launch:
 *
 *   decode rows   one warp per (decode token, unit), reading the scores the
 *                 indexer left in the workspace; the warp that finishes the
 *                 last token of a (request, unit) also builds the request's
 *                 union for the unit's KV heads (a completion counter, reset
 *                 by that warp, so graph replays start from zero), unless
 *                 the Hopper attention builds it from the rows itself
 *                 (attention_union_blocks); a one-token request's union is its
 *                 row, written at once;
 *   prefill items (the simple path) one CTA per (prefill token, unit): block
 *                 scores into a per-CTA scratch row, then warp 0 selects.
 *
 * A "unit" is what one warp turns into KV-head rows: with Hi = m*Hkv the m
 * index heads of one KV head (their lists are merged), with Hkv = m*Hi one
 * index head whose row is repeated for its m KV heads.
 *
 * The union of a (decode request, KV head) lists every block selected by
 * any of its tokens, ascending, with a bit per token that selected it: the
 * decode attention reads each such block once for all tokens and heads.
 */
#include "cuda/params.cuh"
#include "cuda/kernels/indexer/block_score_simt.cuh"
#include "cuda/kernels/select/select_row.cuh"
#include "cuda/arch/launch.cuh"
#include "cuda/common/timeline.cuh"

#define SEL_WARPS 4

/* Per-warp shared memory, in 32-bit words: histogram, one list of
 * topk_blocks per index head of the unit, one row of topk_width, then the
 * score cache (also the union's per-block masks). */
__host__ __device__ __forceinline__ size_t cu_sel_warp_words(int32_t index_heads_per_unit,
                                                             int32_t topk_blocks,
                                                             int32_t topk_width,
                                                             int32_t cached_blocks)
{
    return 256 + (size_t)index_heads_per_unit * topk_blocks + (size_t)topk_width +
           (size_t)cached_blocks;
}

/* Words of the CTA's list-path scratch after the warps' regions (16-byte
 * aligned): SEL_WARPS * SEL_XS list entries, SEL_TOP keys per warp,
 * the fill counter, a pad word and 32 winners. */
#define SEL_GRP_WORDS (2 * SEL_WARPS * SEL_XS + SEL_WARPS * SEL_TOP + 2 + 32)

__host__ __device__ __forceinline__ size_t cu_sel_grp_offset(int32_t index_heads_per_unit,
                                                             int32_t topk_blocks,
                                                             int32_t topk_width,
                                                             int32_t cached_blocks)
{
    return (SEL_WARPS *
                cu_sel_warp_words(index_heads_per_unit, topk_blocks, topk_width, cached_blocks) +
            3) &
           ~(size_t)3;
}

/* The CTA's list-path scratch. */
__device__ __forceinline__ cu_sel_grp cu_sel_grp_of(const cu_select_params &params, uint32_t *smem)
{
    uint32_t *base = smem + cu_sel_grp_offset(params.index_heads_per_unit, params.topk_blocks,
                                              params.topk_width, params.cached_blocks);
    uint32_t *small = base + 2 * SEL_WARPS * SEL_XS;
    cu_sel_grp g;
    g.xs = (unsigned long long *)base;
    g.cap = SEL_WARPS * SEL_XS;
    g.tw = small;
    g.cnt = small + SEL_WARPS * SEL_TOP;
    g.win = (int32_t *)(small + SEL_WARPS * SEL_TOP + 2);
    return g;
}

/* Selects the unit's index heads (score rows at scores + hl * row_stride)
 * with the whole CTA (cta) or one warp, then, in the first warp, writes the
 * KV-head rows of token t and returns the row (that warp's shared memory
 * wsm, W ids ascending, -1 padded); the CTA's other warps get NULL. */
__device__ __forceinline__ const int32_t *cu_select_unit(const cu_select_params &params,
                                                         const float *scores, int64_t row_stride,
                                                         int32_t N, int32_t t, int32_t u,
                                                         uint32_t *wsm, bool cta,
                                                         const cu_sel_grp &g)
{
    const int lane = threadIdx.x & 31;
    uint32_t *hist = wsm;
    int32_t *lists = (int32_t *)(wsm + 256);
    int32_t *row = lists + params.index_heads_per_unit * params.topk_blocks;
    float *cache = (float *)(row + params.topk_width);
    for (int hl = 0; hl < params.index_heads_per_unit; ++hl)
        cu_select_row_by<SEL_WARPS * 32>(cta, scores + hl * row_stride, N, params.topk_blocks,
                                         params.init_blocks, params.local_blocks,
                                         lists + hl * params.topk_blocks, hist, cache,
                                         params.cached_blocks, g);
    if (cta && threadIdx.x >= 32)
        return NULL;
    const int32_t *src = lists;
    if (params.index_heads_per_unit > 1) {
        cu_union_lists(lists, params.index_heads_per_unit, params.topk_blocks, params.topk_width,
                       row);
        src = row;
    }
    for (int gl = 0; gl < params.kv_heads_per_unit; ++gl) {
        const int32_t g = u * params.kv_heads_per_unit + gl;
        const int64_t off = ((int64_t)t * params.num_kv_heads + g) * params.topk_width;
        for (int32_t j = lane; j < params.topk_width; j += 32) {
            params.selected[off + j] = src[j];
            if (params.topk_ids)
                params.topk_ids[off + j] = src[j];
        }
    }
    __syncwarp();
    return src;
}

/* The union of a one-token request for KV head g: its own row (src, this
 * warp's shared memory), written by the warp that selected it (no other
 * token to wait for, no read back of the row). */
__device__ __forceinline__ void cu_single_union(const cu_select_params &params, int32_t k,
                                                int32_t g, const int32_t *src)
{
    const int lane = threadIdx.x & 31;
    const int64_t w = (int64_t)k * params.num_kv_heads + g;
    int32_t *uid = params.union_ids + w * params.cap_union;
    uint32_t *masks = params.union_masks + w * params.cap_union;
    int32_t count = 0;
    for (int32_t j0 = 0; j0 < params.topk_width; j0 += 32) {
        const int32_t j = j0 + lane;
        const int32_t id = j < params.topk_width ? src[j] : -1;
        if (id >= 0 && j < params.cap_union) {
            uid[j] = id;
            masks[j] = 1u;
        }
        count += __popc(__ballot_sync(0xffffffffu, id >= 0));
    }
    if (lane == 0)
        params.union_counts[w] = min(count, params.cap_union);
    __syncwarp();
}

/* Union of decode slot k's selections (q_len > 1) for KV head g into the
 * plan's union arrays.  Rows are read with .cg loads: other SMs wrote them
 * in this launch. */
__device__ __forceinline__ void cu_request_union(const cu_select_params &params, int32_t k,
                                                 int32_t g, uint32_t *wsm)
{
    const int lane = threadIdx.x & 31;
    const uint32_t below = (1u << lane) - 1u;
    const int32_t r = params.meta.dec_req[k];
    const int32_t ql = params.meta.q_len[r];
    const int32_t t0 = params.meta.q_start[r];
    const int32_t N =
        (params.meta.kv_len[r] - 1) / params.block_size + 1; /* reach of the last token */
    const int64_t w = (int64_t)k * params.num_kv_heads + g;
    int32_t *uid = params.union_ids + w * params.cap_union;
    uint32_t *masks = params.union_masks + w * params.cap_union;
    int32_t count = 0;
    if (N <= params.cached_blocks) {
        /* Per-block token bits in shared memory, then an ordered compaction. */
        uint32_t *mask = wsm + 256 + (size_t)params.index_heads_per_unit * params.topk_blocks +
                         params.topk_width;
        for (int32_t n = lane; n < N; n += 32)
            mask[n] = 0u;
        __syncwarp();
        /* The ql rows' entries four per lane, loads issued together. */
        const int32_t tot = ql * params.topk_width;
        for (int32_t e0 = 0; e0 < tot; e0 += 128) {
            int32_t id[4], tok[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int32_t e = e0 + 32 * j + lane;
                id[j] = -1;
                tok[j] = e / params.topk_width;
                const int64_t row =
                    ((int64_t)(t0 + tok[j]) * params.num_kv_heads + g) * params.topk_width;
                if (e < tot)
                    id[j] = __ldcg(params.selected + row + (e - tok[j] * params.topk_width));
            }
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (id[j] >= 0)
                    atomicOr(&mask[id[j]], 1u << tok[j]);
        }
        __syncwarp();
        for (int32_t b0 = 0; b0 < N; b0 += 32) {
            const int32_t n = b0 + lane;
            const uint32_t m = n < N ? mask[n] : 0u;
            const uint32_t bal = __ballot_sync(0xffffffffu, m != 0u);
            if (m) {
                const int32_t pos = count + __popc(bal & below);
                if (pos < params.cap_union) {
                    uid[pos] = n;
                    masks[pos] = m;
                }
            }
            count += __popc(bal);
        }
    } else {
        /* Long context beyond the shared-memory bitmap: k-way merge, lane i
         * following token i's ascending row. */
        const int32_t *row =
            params.selected + ((int64_t)(t0 + lane) * params.num_kv_heads + g) * params.topk_width;
        int32_t ptr = 0;
        int32_t v = INT32_MAX;
        if (lane < ql) {
            const int32_t x = __ldcg(row);
            v = x >= 0 ? x : INT32_MAX;
        }
        for (;;) {
            const int32_t m = cu_warp_min_int(v);
            if (m == INT32_MAX)
                break;
            const uint32_t holders = __ballot_sync(0xffffffffu, v == m);
            if (lane == 0 && count < params.cap_union) {
                uid[count] = m;
                masks[count] = holders;
            }
            ++count;
            if (v == m) {
                ++ptr;
                v = INT32_MAX;
                if (ptr < params.topk_width) {
                    const int32_t x = __ldcg(row + ptr);
                    if (x >= 0)
                        v = x;
                }
            }
        }
    }
    if (lane == 0)
        params.union_counts[w] = min(count, params.cap_union);
    __syncwarp();
}

__device__ __forceinline__ void cu_select_prefill_role(const cu_select_params &params, int cta,
                                                       int nctas, uint32_t *smem)
{
    const int warp = threadIdx.x >> 5;
    float *scratch =
        params.prefill_scores + (int64_t)cta * params.index_heads_per_unit * params.cap_blocks;
    const int64_t total = (int64_t)params.meta.hdr->n_pf * params.num_units;
    for (int64_t item = cta; item < total; item += nctas) {
        const int32_t pf = (int32_t)(item / params.num_units);
        const int32_t u = (int32_t)(item - (int64_t)pf * params.num_units);
        const int32_t t = params.meta.pf_tok[pf];
        const cu_tok_info ti = params.meta.tok_info[t];
        const int32_t r = ti.r, p = ti.pos;
        const int32_t N = p / params.block_size + 1;
        for (int hl = 0; hl < params.index_heads_per_unit; ++hl) {
            const int32_t h = u * params.index_heads_per_unit + hl;
            const int64_t qoff = ((int64_t)t * params.num_index_heads + h) * params.index_dim;
            for (int32_t n = warp; n < N; n += SEL_WARPS) {
                const float s = cu_warp_block_score(params, r, qoff, n, p);
                if ((threadIdx.x & 31) == 0)
                    scratch[(int64_t)hl * params.cap_blocks + n] = s;
            }
        }
        __syncthreads();
        if (warp == 0)
            cu_select_unit(params, scratch, params.cap_blocks, N, t, u, smem, false,
                           cu_sel_grp_of(params, smem));
        __syncthreads();
    }
}

/* Decode row (token row d, unit u) by the whole CTA (cta) or one warp:
 * the row, then, in the first warp, the union(s) it completes. */
__device__ __forceinline__ void cu_select_decode_row(const cu_select_params &params, int32_t d,
                                                     int32_t u, uint32_t *wsm, bool cta,
                                                     const cu_sel_grp &g, bool first_row)
{
    const bool mark = first_row && threadIdx.x == 0; /* the CTA's timeline marks */
    const int lane = threadIdx.x & 31;
    const cu_dec_row dr = params.meta.dec_row[d];
    const int32_t t = dr.t, N = dr.nblk, k = dr.slot, ql = dr.ql;
    const float *scores = params.scores + ((int64_t)d * params.num_index_heads +
                                           (int64_t)u * params.index_heads_per_unit) *
                                              params.cap_blocks;
    /* Whether the attention builds this request's unions (plan data, read
     * before the wait). */
    const bool att_builds =
        cu_att_builds_union(params.attention_union_blocks, ql, params.meta.dec_info[k].nblk);
    cu_pdl_wait(); /* the indexer's scores (at once after the first row) */
    if (mark)
        CU_TL_MARK(params, CU_TL_SELECT, CU_TL_WAITED);
    const int32_t *row = cu_select_unit(params, scores, params.cap_blocks, N, t, u, wsm, cta, g);
    if (!row)
        return;
    if (ql == 1) {
        for (int gl = 0; gl < params.kv_heads_per_unit; ++gl)
            cu_single_union(params, k, u * params.kv_heads_per_unit + gl, row);
    } else if (!att_builds) {
        /* Completion count of (request, unit); the last token's warp
         * builds the unions of the unit's KV heads. */
        int32_t *done = params.rows_done + (int64_t)k * params.num_units + u;
        __threadfence();
        int32_t prev = 0;
        if (lane == 0)
            prev = atomicAdd(done, 1);
        prev = __shfl_sync(0xffffffffu, prev, 0);
        if (prev == ql - 1) {
            __threadfence();
            for (int gl = 0; gl < params.kv_heads_per_unit; ++gl)
                cu_request_union(params, k, u * params.kv_heads_per_unit + gl, wsm);
            if (lane == 0) {
                *done = 0;
                CU_TL_MARK(params, CU_TL_SELECT, CU_TL_ISSUED); /* a request's unions built */
            }
        }
    }
    if (mark)
        CU_TL_MARK(params, CU_TL_SELECT, CU_TL_FIRST);
    if (threadIdx.x == 0) /* overwritten by every row: the last one stays */
        CU_TL_MARK(params, CU_TL_SELECT, CU_TL_LAST);
}

/* Few rows (at most params.cta_rows_limit, e.g. batch 1-8 or one token per
 * request) of more than K blocks: each CTA takes whole rows, its warps
 * sharing each, so a row costs a few dependent steps instead of a lone
 * warp's long chain.  Many rows, or only rows that keep every block (short
 * contexts: nothing to select, a CTA per row only waits on barriers): one
 * warp per row, rows side by side.  One loop for both, so the row code is
 * inlined once. */
__device__ __forceinline__ void cu_select_decode_role(const cu_select_params &params, int cta,
                                                      int nctas, uint32_t *smem)
{
    const int warp = threadIdx.x >> 5;
    const int64_t total = (int64_t)params.meta.hdr->n_dec_rows * params.num_units;
    const bool by_cta = total <= params.cta_rows_limit &&
                        params.meta.hdr->max_dec_nblk > params.topk_blocks; /* CTA-uniform */
    uint32_t *wsm = by_cta ? smem
                           : smem + warp * cu_sel_warp_words(params.index_heads_per_unit,
                                                             params.topk_blocks, params.topk_width,
                                                             params.cached_blocks);
    const cu_sel_grp g = cu_sel_grp_of(params, smem);
    /* Row w is token row w / units, unit w % units; both are carried along
     * from the first row's, not divided again for every row (divisions were
     * a tenth of a lone warp's instructions at batch 128, 5K, 8 tokens).
     * 32-bit: rows x units fit (plan capacities). */
    const int32_t w0 = by_cta ? cta : cta * SEL_WARPS + warp;
    const int32_t step = by_cta ? nctas : nctas * SEL_WARPS;
    const int32_t d_step = step / params.num_units, u_step = step - d_step * params.num_units;
    int32_t d = w0 / params.num_units, u = w0 - d * params.num_units;
    for (int32_t w = w0; w < total; w += step) {
        cu_select_decode_row(params, d, u, wsm, by_cta, g, w == w0);
        if (by_cta)
            __syncthreads(); /* the first warp's union read the shared row */
        d += d_step;
        u += u_step;
        if (u >= params.num_units) {
            u -= params.num_units;
            ++d;
        }
    }
}

__global__ void __launch_bounds__(SEL_WARPS * 32, 1) cu_select_kernel(cu_select_params params)
{
    /* Plan data first; each role waits for the indexer before it reads
     * scores or the cache. */
    cu_pdl_trigger();
    if (threadIdx.x == 0)
        CU_TL_MARK(params, CU_TL_SELECT, CU_TL_ENTRY);
    extern __shared__ __align__(8) uint32_t sel_smem[];
    /* Every CTA takes decode rows; the first pf_ctas then take prefill items,
     * each with its own scratch row. */
    cu_select_decode_role(params, blockIdx.x, gridDim.x, sel_smem);
    cu_pdl_wait(); /* every CTA, before it ends (arch/launch.cuh) */
    if (threadIdx.x == 0)
        CU_TL_MARK(params, CU_TL_SELECT, CU_TL_EXIT);
    if (blockIdx.x >= params.prefill_ctas)
        return;
    __syncthreads();
    cu_select_prefill_role(params, blockIdx.x, params.prefill_ctas, sel_smem);
}

size_t cu_select_smem(int32_t index_heads_per_unit, int32_t topk_blocks, int32_t topk_width,
                      int32_t cached_blocks)
{
    return (cu_sel_grp_offset(index_heads_per_unit, topk_blocks, topk_width, cached_blocks) +
            SEL_GRP_WORDS) *
           sizeof(uint32_t);
}

cudaError_t cu_select_setup(size_t smem)
{
    if (smem <= 48 * 1024)
        return cudaSuccess;
    return cudaFuncSetAttribute(cu_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)smem);
}

void cu_launch_select(const cu_select_params *params, const cu_plan_state *st, cudaStream_t s)
{
    /* The first grid_pf CTAs also serve the prefill role, each with its own
     * scratch row. */
    cu_launch(cu_select_kernel, st->sz.grid_sel, SEL_WARPS * 32,
              cu_select_smem(params->index_heads_per_unit, params->topk_blocks, params->topk_width,
                             params->cached_blocks),
              s, st->pdl, *params);
}
