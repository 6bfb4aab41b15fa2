/*
 * Selection of prefill rows from their block scores, shared by the prefill
 * indexer kernels (indexer_prefill.cuh: one warpgroup, cp.async keys;
 * indexer_prefill_tma_sm90.cu: two consumer warpgroups, tensor-map keys):
 * the walk over the step's tiles (and key-range splits of them), the
 * selection of a tile's (token, unit) items by warps, and the candidates
 * and merge of split tiles.  Design: docs/PREFILL_INDEXER.md.
 */
#ifndef MSA_INDEXER_PREFILL_SELECT_CUH
#define MSA_INDEXER_PREFILL_SELECT_CUH

#include "cuda/kernels/indexer/indexer_prefill_mma_sm80.cuh"
/* select_row.cuh defines a device function that is not inline
 * (cu_select_list64), as select.cu does by the same header: in this
 * kernel's files it gets internal linkage, so the library links. */
namespace
{
#include "cuda/kernels/select/select_row.cuh"
}

/* Key-range splits of a tile at most (when the step has few tiles), and
 * the candidates a split keeps per row: the blocks chosen by score,
 * K - I - Lc, at most this many (else no splits). */
#define PFI_SPLIT_MAX 16
#define PFI_CAND 32

/* Shared words of one selecting warp: histogram / candidate list, mi lists
 * of K, one row of W, then the score cache (as the selection kernel's),
 * which the merge of split candidates uses for their scores and ids. */
__host__ __device__ __forceinline__ size_t cu_pfi_warp_words(int32_t mi, int32_t K, int32_t W,
                                                             int32_t cache)
{
    const int32_t merge = 2 * PFI_SPLIT_MAX * PFI_CAND;
    return 256 + (size_t)mi * K + (size_t)W + (size_t)(cache > merge ? cache : merge);
}

/* Tiles of request r: none for a decode request. */
__device__ __forceinline__ int32_t cu_pfi_tiles(const cu_pfidx_params &p, int32_t r)
{
    const int32_t ql = p.q_len[r];
    return ql > CU_DEC_MAX_Q ? (ql + p.tt - 1) / p.tt : 0;
}

/* How a kernel's CTA selects: its selecting warps (warps 0 .. warps - 1),
 * the rows of its tiles (the stride of the candidate workspace) and the
 * score cache of each warp's shared words (floats). */
typedef struct cu_pfi_shape {
    int warps;
    int rows;
    int32_t cache;
} cu_pfi_shape;

/* Item g of the step's list of (tile, split) items: requests in order,
 * each from its last tile back, a tile's S splits in order. */
typedef struct cu_pfi_item {
    int32_t r;      /* request */
    int32_t tg, sp; /* tile of the step's list, split of it */
    int32_t base;   /* position of the tile's first token */
    int32_t p_last; /* and of its last */
    int32_t t0;     /* its first token row */
    int32_t ntok;   /* its tokens */
    int32_t b0, b1; /* the split's blocks [b0, b1) of the tile's reachable ones */
} cu_pfi_item;

/* Splits per tile: with fewer tiles than half the grid, each tile's key
 * range is cut into S parts (items g = tile * S + split < grid), so that
 * small calls after long prefixes use the whole GPU. */
__device__ __forceinline__ int32_t cu_pfi_splits(const cu_pfidx_params &p, int32_t grid)
{
    int32_t n_tiles = 0;
    for (int32_t r = 0; r < p.hdr->num_requests; ++r)
        n_tiles += cu_pfi_tiles(p, r);
    const int32_t need = p.K - p.I - p.Lc;
    int32_t S = 1;
    if (p.cand_id && need >= 1 && need <= PFI_CAND && n_tiles > 0)
        S = min(PFI_SPLIT_MAX, grid / n_tiles);
    return S < 2 ? 1 : S;
}

/* A CTA's walk over the items: round k takes item k * grid + c in even
 * rounds and k * grid + grid - 1 - c in odd ones (a snake, so the CTAs'
 * sums of work stay even over a list whose longest tiles come first). */
typedef struct cu_pfi_walk {
    int32_t k, r, g0, ntr;
} cu_pfi_walk;

__device__ __forceinline__ void cu_pfi_walk_start(const cu_pfidx_params &p, cu_pfi_walk &w)
{
    w.k = 0;
    w.r = 0;
    w.g0 = 0;
    w.ntr = p.hdr->num_requests > 0 ? cu_pfi_tiles(p, 0) : 0;
}

/* The CTA's next item (false when the list is done). */
__device__ __forceinline__ bool cu_pfi_next(const cu_pfidx_params &p, int32_t grid, int32_t S,
                                            cu_pfi_walk &w, cu_pfi_item &it)
{
    const int32_t R = p.hdr->num_requests;
    const int32_t k = w.k++;
    const int32_t g = k * grid + ((k & 1) ? grid - 1 - (int32_t)blockIdx.x : (int32_t)blockIdx.x);
    it.tg = g / S;
    it.sp = g - it.tg * S;
    while (w.r < R && it.tg >= w.g0 + w.ntr) {
        w.g0 += w.ntr;
        ++w.r;
        w.ntr = w.r < R ? cu_pfi_tiles(p, w.r) : 0;
    }
    if (w.r >= R)
        return false;
    it.r = w.r;
    const int32_t ql = p.q_len[w.r], kl = p.kv_len[w.r];
    const int32_t i1 = ql - (it.tg - w.g0) * p.tt, i0 = max(0, i1 - p.tt);
    it.base = kl - ql + i0;
    it.p_last = kl - ql + i1 - 1;
    it.t0 = p.q_start[w.r] + i0;
    it.ntok = i1 - i0;
    const int32_t nblk = it.p_last / p.B + 1;
    it.b0 = (int32_t)((int64_t)nblk * it.sp / S);
    it.b1 = (int32_t)((int64_t)nblk * (it.sp + 1) / S);
    return true;
}

/* The unit's KV-head rows of token row t from its mi lists (lists, K ids
 * each, ascending, -1 padded; their union into row[W] when mi > 1),
 * written as the plan's sel rows and the caller's topk rows by one warp. */
__device__ __forceinline__ void cu_pfi_write_rows(const cu_pfidx_params &p, const int32_t *lists,
                                                  int32_t *row, int32_t t, int32_t u)
{
    const int lane = threadIdx.x & 31;
    const int32_t *src = lists;
    if (p.mi > 1) {
        cu_union_lists(lists, p.mi, p.K, p.W, row);
        src = row;
    }
    for (int gl = 0; gl < p.mk; ++gl) {
        const int32_t g = u * p.mk + gl;
        const int64_t off = ((int64_t)t * p.Hkv + g) * p.W;
        for (int32_t j = lane; j < p.W; j += 32) {
            p.sel[off + j] = src[j];
            if (p.topk)
                p.topk[off + j] = src[j];
        }
    }
    __syncwarp();
}

/* The unit's rows of token row t (block scores at scores + hl * cap_blocks
 * for its mi index heads, N reachable blocks) selected by this warp and
 * written.  wsm: the warp's shared words (cu_pfi_warp_words with a score
 * cache of cache_cap floats). */
__device__ __forceinline__ void cu_pfi_select_unit(const cu_pfidx_params &p, const float *scores,
                                                   int32_t N, int32_t t, int32_t u, uint32_t *wsm,
                                                   int32_t cache_cap)
{
    uint32_t *hist = wsm;
    int32_t *lists = (int32_t *)(wsm + 256);
    int32_t *row = lists + p.mi * p.K;
    float *cache = (float *)(row + p.W);
    for (int hl = 0; hl < p.mi; ++hl)
        cu_select_row(scores + (int64_t)hl * p.cap_blocks, N, p.K, p.I, p.Lc, lists + hl * p.K,
                      hist, cache, cache_cap);
    cu_pfi_write_rows(p, lists, row, t, u);
}

/* Split item g's candidates (key-range split of a tile over blocks [b0,
 * b1)): for each row of the tile whose token reaches more than K blocks,
 * the `need` best of its non-forced blocks in the range (SPEC 4's order,
 * the lone-warp row with no forced blocks), ascending, -1 padded, with
 * their scores, into the candidate workspace.  A global winner of a row is
 * a winner of its own split (whatever beats it there beats it overall), so
 * the union of the splits' lists holds every winner. */
__device__ __forceinline__ void cu_pfi_candidates(const cu_pfidx_params &p, const cu_pfi_shape sh,
                                                  const float *scratch, int32_t g, int32_t base,
                                                  int32_t nrow, int32_t b0, int32_t b1,
                                                  uint32_t *wsm)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int32_t need = p.K - p.I - p.Lc;
    uint32_t *hist = wsm;
    int32_t *list = (int32_t *)(wsm + 256);
    float *cache = (float *)(list + p.mi * p.K + p.W);
    for (int32_t row = warp; row < nrow; row += sh.warps) {
        const int32_t N = (base + row / p.Hi) / p.B + 1;
        if (N <= p.K)
            continue; /* every block selected: the merge needs no candidates */
        const int32_t lo = max(p.I, b0), hi = min(b1, N - p.Lc);
        const float *sr = scratch + (int64_t)row * p.cap_blocks;
        if (hi > lo)
            cu_select_row(sr + lo, hi - lo, need, 0, 0, list, hist, cache, sh.cache);
        const int64_t off = ((int64_t)g * sh.rows + row) * PFI_CAND;
        if (lane < need) {
            const int32_t rel = hi > lo ? list[lane] : -1;
            const int32_t id = rel >= 0 ? lo + rel : -1;
            p.cand_id[off + lane] = id;
            p.cand_score[off + lane] = id >= 0 ? sr[id] : 0.0f;
        }
        __syncwarp();
    }
}

/* The merge of a tile's S splits, by the CTA that finished its last split:
 * for each (token, unit) item a warp gathers, per index head, the splits'
 * candidates (ascending ids: splits in block order, each list ascending),
 * ranks them with the lone-warp row (lower position = lower id, so ties
 * still go to the lower id), adds the forced blocks and writes the rows.
 * Candidates of other CTAs are read with .cg loads (L2), after the fence
 * that follows their completion count. */
__device__ __forceinline__ void cu_pfi_merge(const cu_pfidx_params &p, const cu_pfi_shape sh,
                                             int32_t g_first, int32_t S, int32_t base, int32_t ntok,
                                             int32_t t0, uint32_t *wsm)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const uint32_t below = (1u << lane) - 1u;
    const int32_t need = p.K - p.I - p.Lc;
    uint32_t *hist = wsm;
    int32_t *lists = (int32_t *)(wsm + 256);
    int32_t *row = lists + p.mi * p.K;
    float *cs = (float *)(row + p.W);
    int32_t *ci = (int32_t *)(cs + PFI_SPLIT_MAX * PFI_CAND);
    for (int32_t item = warp; item < ntok * p.units; item += sh.warps) {
        const int32_t tok = item / p.units;
        const int32_t u = item - tok * p.units;
        const int32_t N = (base + tok) / p.B + 1;
        for (int hl = 0; hl < p.mi; ++hl) {
            int32_t *out = lists + hl * p.K;
            if (N <= p.K) {
                for (int32_t j = lane; j < p.K; j += 32)
                    out[j] = j < N ? j : -1;
                __syncwarp();
                continue;
            }
            const int32_t r = tok * p.Hi + u * p.mi + hl;
            /* Every split's candidates loaded before the first is used, so
             * their L2 round trips overlap (one, not S, per row). */
            int32_t ids[PFI_SPLIT_MAX];
            float scs[PFI_SPLIT_MAX];
#pragma unroll
            for (int sp = 0; sp < PFI_SPLIT_MAX; ++sp) {
                const bool on = sp < S && lane < need;
                const int64_t off = ((int64_t)(g_first + sp) * sh.rows + r) * PFI_CAND;
                ids[sp] = on ? __ldcg(p.cand_id + off + lane) : -1;
                scs[sp] = on ? __ldcg(p.cand_score + off + lane) : 0.0f;
            }
            int32_t M = 0;
#pragma unroll
            for (int sp = 0; sp < PFI_SPLIT_MAX; ++sp) {
                const uint32_t bal = __ballot_sync(0xffffffffu, ids[sp] >= 0);
                if (ids[sp] >= 0) {
                    cs[M + __popc(bal & below)] = scs[sp];
                    ci[M + __popc(bal & below)] = ids[sp];
                }
                M += __popc(bal);
            }
            __syncwarp();
            /* M >= need: the row has N - I - Lc > need candidates, and each
             * split kept min(need, its share). */
            cu_select_row(cs, M, need, 0, 0, row, hist, NULL, 0);
            if (lane < p.I)
                out[lane] = lane;
            if (lane < need)
                out[p.I + lane] = ci[row[lane]];
            if (lane < p.Lc)
                out[p.I + need + lane] = N - p.Lc + lane;
            __syncwarp();
        }
        cu_pfi_write_rows(p, lists, row, t0 + tok, u);
    }
}

/* After an item's block scores (in the CTA's workspace rows `scratch`,
 * visible to every selecting thread): a whole tile (S = 1) selects its
 * (token, unit) items, a warp each; a split keeps its candidates, and the
 * CTA that completes the tile's count (fence, atomic add; it returns the
 * count to 0 after, so graph replays start from zero) merges the splits.
 * sync() is the barrier of the CTA's selecting threads; *last_split a
 * shared word. */
template <typename Sync>
__device__ __forceinline__ void cu_pfi_select_item(const cu_pfidx_params &p, const cu_pfi_shape sh,
                                                   const cu_pfi_item &it, int32_t S,
                                                   const float *scratch, uint32_t *wsm,
                                                   volatile int32_t *last_split, Sync sync)
{
    const int warp = threadIdx.x >> 5;
    if (S == 1) {
        for (int32_t item = warp; item < it.ntok * p.units; item += sh.warps) {
            const int32_t tok = item / p.units;
            const int32_t u = item - tok * p.units;
            const int32_t N = (it.base + tok) / p.B + 1;
            cu_pfi_select_unit(p,
                               scratch + ((int64_t)tok * p.Hi + (int64_t)u * p.mi) * p.cap_blocks,
                               N, it.t0 + tok, u, wsm, sh.cache);
        }
        return;
    }
    cu_pfi_candidates(p, sh, scratch, it.tg * S + it.sp, it.base, it.ntok * p.Hi, it.b0, it.b1,
                      wsm);
    __threadfence(); /* every thread's candidates visible device-wide before the count */
    sync();
    if (threadIdx.x == 0)
        *last_split = atomicAdd(p.split_done + it.tg, 1) == S - 1;
    sync();
    if (*last_split) {
        __threadfence();
        cu_pfi_merge(p, sh, it.tg * S, S, it.base, it.ntok, it.t0, wsm);
        if (threadIdx.x == 0)
            p.split_done[it.tg] = 0;
    }
}

#endif /* MSA_INDEXER_PREFILL_SELECT_CUH */
