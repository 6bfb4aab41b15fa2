/*
 * The lean decode step: a whole sparse layer in one kernel, for steps of
 * few one-token requests (plans of at most CU_LEAN_MAX_ROWS token rows and
 * q_len 1), where the chain of five kernels costs more in hand-overs than
 * in work (docs/CUDA.md, "The lean decode step").
 *
 * One CTA per SM (its shared memory keeps a second one out), eight warps.
 * Every CTA walks the same phases; the only waits between CTAs are for a
 * request's scan counts, and the merge is done by whichever CTA finishes
 * a (request, KV head) last, without waiting:
 *
 *   1. Index scan: the blocks of the requests with more than K blocks, end
 *      to end, an equal contiguous share per CTA; each block's 128 index
 *      keys (cp.async, four stages of 32 KB, each copy's page-table read
 *      one copy ahead) times the token's index queries on mma.sync, block
 *      max or log-sum-exp fused.  A CTA adds the blocks it scored of a
 *      request to the request's count once their scores are written.
 *   2. Token rows: the cache writes and padding outputs of the prologue
 *      (prologue_row.cuh), one row per CTA from the grid's end, and the
 *      selection rows of requests that keep every block.  No phase reads
 *      what this one writes: the scan and the attention take the new
 *      token's own K, V and index-K rows from the call's tensors.
 *   3. Attention: the (request, KV head, selected block) tasks end to end,
 *      contiguous shares; a block's 128 keys are split over the eight
 *      warps (16 each, one m16 tile of the 16 query heads), K and V through
 *      two 64 KB stages.  Forced blocks (init, local) and requests that
 *      keep every block need no selection.  For the others, every CTA that
 *      needs a row waits until the request's count is complete and selects
 *      the row itself with the whole CTA (the selection's row code): a
 *      second hand-over, from one selecting CTA to the others, cost more
 *      than selecting the same row on several SMs at once.  The owner of
 *      the row's first selected task publishes it.  At the end of its part
 *      of a (request, KV head) a CTA merges its warps' states; if it holds
 *      all of it, it writes the output, else a normalized partial row and
 *      its LSE, and the CTA whose count completes the (request, KV head)
 *      merges the partials into the output.
 *
 * Counts go back to 0 for the next replay of a captured graph: a merge
 * count by the CTA that completes it, the scan counts by the last CTA to
 * be done reading them (a count of CTAs).  Waiting CTAs spin only on
 * counts that running CTAs complete without waiting themselves (every
 * scan share is done before its CTA waits for anything) with all CTAs
 * resident at once (the grid is at most one CTA per SM).
 */
#include "cuda/kernels/lean/lean_decode.cuh"
#include "cuda/kernels/prologue/prologue_row.cuh"
#include "cuda/kernels/select/select_row.cuh"
#include "cuda/kernels/attention/rows_mma.cuh"
#include "cuda/arch/mma_sm80.cuh"
#include "cuda/arch/launch.cuh"
#include "cuda/common/timeline.cuh"

#define LEAN_THREADS 256
#define LEAN_WARPS 8
#define LEAN_B 128                  /* keys of a block */
#define LEAN_TILE (LEAN_B * 256)    /* one block's K (or V, or index-K) rows */
#define LEAN_STAGE (2 * LEAN_TILE)  /* K and V of one block */
#define LEAN_SLOTS (2 * LEAN_STAGE) /* offset of the warps' saved states */
#define LEAN_SCAN_STAGES 4          /* index-key blocks in flight: the two stages' space */
#define LEAN_SLOT_BYTES (CU_ROWS_SLOT_FLOATS * 4)
/* A selecting CTA's scratch lies in the slots' space (nothing else uses
 * it between two tasks): the row's score keys (rows of up to LEAN_SEL_KEYS
 * blocks; longer ones take the lone-warp path of the selection's row
 * code), the candidate list (SEL_XS entries a warp), the warps'
 * thresholds, the list's counter, the winners, the K ids and the lone
 * warp's histogram. */
#define LEAN_SEL_KEYS 12288
#define LEAN_SEL_XS (LEAN_SEL_KEYS * 4)
#define LEAN_SEL_TW (LEAN_SEL_XS + LEAN_WARPS * SEL_XS * 8)
#define LEAN_SEL_CNT (LEAN_SEL_TW + LEAN_WARPS * SEL_TOP * 4)
#define LEAN_SEL_WIN (LEAN_SEL_CNT + 16)
#define LEAN_SEL_OUT (LEAN_SEL_WIN + 32 * 4)
#define LEAN_SEL_HIST (LEAN_SEL_OUT + 32 * 4)
#define LEAN_SEL_BYTES (LEAN_SEL_HIST + 256 * 4)
#define LEAN_SMALL (LEAN_SLOTS + LEAN_WARPS * LEAN_SLOT_BYTES)
/* Small words: the warps' block-score states [warp][head][m, l], then the
 * CTA's broadcast words. */
#define LEAN_RED_FLOATS (LEAN_WARPS * CU_LEAN_MAX_HEADS * 2)
/* The CTA's broadcast words: four single words, the segment starts of a
 * merge, the key of the row held and its ids. */
#define LEAN_BC_STARTS 4
#define LEAN_BC_KEY 36
#define LEAN_BC_IDS 37
#define LEAN_BC_WORDS 72
#define LEAN_SMEM_BYTES (LEAN_SMALL + LEAN_RED_FLOATS * 4 + 4 * LEAN_BC_WORDS)
static_assert(LEAN_SEL_BYTES <= LEAN_WARPS * LEAN_SLOT_BYTES, "selection scratch within the slots");

#define LEAN_LOG2E 1.4426950408889634f

struct cu_lean_swz {
    __device__ __forceinline__ uint32_t operator()(int row, int chunk) const
    {
        return cu_swz(row, chunk);
    }
};

/* The one 32-byte fact record of decode slot k. */
__device__ __forceinline__ cu_dec_info cu_lean_slot(const cu_lean_params &p, int32_t k)
{
    return p.sel.meta.dec_info[k];
}

/* Where this thread's row of a 128-row copy comes from: positions pos0 ..
 * pos0 + 127 of request r in a plane of KV head `head`, two threads a row.
 * Rows at or past kl are zero-filled (no bytes read); the row at kl - 1
 * comes from `fresh` when it is not NULL (the step's own row). */
typedef struct cu_lean_src {
    const unsigned char *at;
    int nbytes;
} cu_lean_src;

__device__ __forceinline__ cu_lean_src cu_lean_row_src(const cu_lean_params &p, const void *plane,
                                                       const msa_plane_strides &s, int32_t head,
                                                       int32_t r, int32_t pos0, int32_t kl,
                                                       const void *fresh)
{
    const int32_t pos = pos0 + (int32_t)(threadIdx.x >> 1);
    cu_lean_src x;
    x.at = (const unsigned char *)plane;
    x.nbytes = 0;
    if (pos < kl) {
        x.nbytes = 16;
        if (fresh && pos == kl - 1) {
            x.at = (const unsigned char *)fresh;
        } else {
            const int32_t page =
                cu_page_of(p.att.meta.page_table, p.att.cap_pages, r, pos, p.att.log_page_size);
            x.at = cu_plane_row16(plane, s, page, head, pos & (p.att.page_size - 1));
        }
    }
    return x;
}

/* The thread's eight 16-byte pieces of its row into a swizzled tile. */
__device__ __forceinline__ void cu_lean_copy(uint32_t dst, const cu_lean_src &x)
{
    const int row = threadIdx.x >> 1;
    const int half = threadIdx.x & 1;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int chunk = half * 8 + i;
        cu_cp_async16(dst + cu_swz(row, chunk), x.at + (x.nbytes ? chunk * 16 : 0), x.nbytes);
    }
}

/* ---- phase 2: index scan and selection ---------------------------------- */

/* Block scores of one block of index keys (in the tile at ka) for the
 * token's index heads: each warp takes 16 keys on the M side of the
 * products, the heads are the N columns (q fragments qb); per head a max
 * (or log-sum-exp of the scaled scores) over the visible keys, reduced in
 * the warp, then over the warps into red[]. */
template <typename Tag>
__device__ __forceinline__ void cu_lean_block_scores(const cu_lean_params &p, uint32_t ka,
                                                     const uint32_t (&qb)[8][2], int32_t pos0,
                                                     int32_t kl, float *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
        uint32_t a0, a1, a2, a3;
        cu_ldsm_x4(ka + cu_swz(warp * 16 + (lane & 15), 2 * ks + (lane >> 4)), a0, a1, a2, a3);
        cu_mma16816(acc, a0, a1, a2, a3, qb[ks][0], qb[ks][1], Tag());
    }
    const int32_t key_lo = pos0 + warp * 16 + (lane >> 2);
    const bool ok_lo = key_lo < kl, ok_hi = key_lo + 8 < kl;
    const bool lse = p.sel.score_lse != 0;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        float m = -INFINITY, l = 0.0f;
        if (lse) {
            if (ok_lo)
                cu_lse_merge(m, l, p.sel.index_scale * acc[e], 1.0f);
            if (ok_hi)
                cu_lse_merge(m, l, p.sel.index_scale * acc[2 + e], 1.0f);
        } else {
            if (ok_lo)
                m = cu_nanmax(m, acc[e]);
            if (ok_hi)
                m = cu_nanmax(m, acc[2 + e]);
        }
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
            const float l2 = __shfl_xor_sync(0xffffffffu, l, o);
            if (lse)
                cu_lse_merge(m, l, m2, l2);
            else
                m = cu_nanmax(m, m2);
        }
        const int head = 2 * (lane & 3) + e;
        if (lane < 4) {
            red[(warp * CU_LEAN_MAX_HEADS + head) * 2] = m;
            red[(warp * CU_LEAN_MAX_HEADS + head) * 2 + 1] = l;
        }
    }
}

/* The index-query fragments (B operand, one column per head) of token t;
 * columns past the heads are zero. */
__device__ __forceinline__ void cu_lean_index_q(const cu_lean_params &p, int32_t t,
                                                uint32_t (&qb)[8][2])
{
    const int lane = threadIdx.x & 31;
    const int head = lane >> 2;
    const bool ok = head < p.sel.num_index_heads;
    const uint32_t *q = (const uint32_t *)p.sel.index_q +
                        (((int64_t)t * p.sel.num_index_heads + (ok ? head : 0)) * 128 >> 1);
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
        const int d = ks * 16 + 2 * (lane & 3);
        qb[ks][0] = ok ? q[d >> 1] : 0u;
        qb[ks][1] = ok ? q[(d + 8) >> 1] : 0u;
    }
}

/* Row (decode slot of di, KV head = index head h) selected by the whole
 * CTA (the selection's row code) into ids[] (shared memory, K entries);
 * with `publish`, also written to the selection rows (and the caller's
 * ids). */
__device__ __forceinline__ void cu_lean_select(const cu_lean_params &p, const cu_dec_info &di,
                                               int32_t h, bool publish, unsigned char *smem,
                                               int32_t *ids)
{
    const cu_select_params &sp = p.sel;
    unsigned char *scratch = smem + LEAN_SLOTS;
    cu_sel_grp g;
    g.xs = (unsigned long long *)(scratch + LEAN_SEL_XS);
    g.cap = LEAN_WARPS * SEL_XS;
    g.tw = (uint32_t *)(scratch + LEAN_SEL_TW);
    g.cnt = (uint32_t *)(scratch + LEAN_SEL_CNT);
    g.win = (int32_t *)(scratch + LEAN_SEL_WIN);
    int32_t *out = (int32_t *)(scratch + LEAN_SEL_OUT);
    const float *scores = sp.scores + ((int64_t)di.d0 * sp.num_index_heads + h) * sp.cap_blocks;
    cu_select_row_by<LEAN_THREADS>(true, scores, di.nblk, sp.topk_blocks, sp.init_blocks,
                                   sp.local_blocks, out, (uint32_t *)(scratch + LEAN_SEL_HIST),
                                   (float *)scratch, LEAN_SEL_KEYS, g);
    const int64_t off = ((int64_t)di.t0 * sp.num_kv_heads + h) * sp.topk_width;
    for (int32_t j = threadIdx.x; j < sp.topk_width; j += LEAN_THREADS) {
        const int32_t id = j < sp.topk_blocks ? out[j] : -1;
        if (j < sp.topk_blocks)
            ids[j] = id;
        if (publish) {
            sp.selected[off + j] = id;
            if (sp.topk_ids)
                sp.topk_ids[off + j] = id;
        }
    }
    __syncthreads(); /* ids[] complete */
}

/* Copy source of this thread's row of scored block gb (walker: slot ik,
 * its facts dn). */
__device__ __forceinline__ cu_lean_src cu_lean_scan_src(const cu_lean_params &p, int32_t gb,
                                                        int32_t &ik, cu_dec_info &dn)
{
    while (gb >= dn.blk1)
        dn = cu_lean_slot(p, ++ik);
    const void *fresh = p.new_rows_from_input
                            ? (const void *)((const uint16_t *)p.pro.index_k_rows +
                                             (int64_t)dn.t0 * p.sel.index_dim)
                            : NULL;
    return cu_lean_row_src(p, p.sel.index_k_plane, p.sel.index_k_strides, 0, dn.r,
                           (gb - dn.blk0) * LEAN_B, dn.kl, fresh);
}

/* This CTA's share of the scored blocks.  Each slot's count of scored
 * blocks (scan_done) grows by a CTA's blocks of it once they are written;
 * the selectors wait until it is complete. */
template <typename Tag>
__device__ void cu_lean_scan(const cu_lean_params &p, unsigned char *smem, float *red)
{
    const cu_select_params &sp = p.sel;
    const int32_t S = sp.meta.hdr->total_dec_blocks;
    const int32_t n_dec = sp.meta.hdr->n_dec;
    const int32_t G = gridDim.x, c = blockIdx.x;
    const int32_t gb0 = (int32_t)((int64_t)S * c / G), gb1 = (int32_t)((int64_t)S * (c + 1) / G);
    if (gb0 >= gb1)
        return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t base = cu_smem_addr(smem);
    /* Where block gb lies: slot k (its facts di) and its block n. */
    int32_t k = cu_dec_of_block(sp.meta.dec_blk0, n_dec, gb0);
    cu_dec_info di = cu_lean_slot(p, k);
    int32_t ik = k; /* the slot of the next copy */
    cu_dec_info dn = di;
    int32_t first_of_k = gb0; /* first of this CTA's blocks of slot k */
    uint32_t qb[8][2];
    cu_lean_index_q(p, di.t0, qb);
    /* Four stages of 32 KB, three blocks ahead (empty groups past the
     * share keep the wait's count); each copy's source (its page-table
     * read) is looked up one copy earlier, so the read overlaps a block's
     * scoring instead of holding up the copy. */
    cu_lean_src next = cu_lean_scan_src(p, gb0, ik, dn);
    int32_t gn = gb0; /* the next block to copy */
    for (int s = 0; s < LEAN_SCAN_STAGES - 1; ++s, ++gn) {
        if (gn < gb1) {
            cu_lean_copy(base + s * LEAN_TILE, next);
            if (gn + 1 < gb1)
                next = cu_lean_scan_src(p, gn + 1, ik, dn);
        }
        cu_cp_async_commit();
    }
    for (int32_t sb = gb0; sb < gb1; ++sb, ++gn) {
        cu_cp_async_wait<LEAN_SCAN_STAGES - 2>();
        /* Block sb landed; block sb - 1 is scored and its stage free. */
        __syncthreads();
        if (gn < gb1) {
            cu_lean_copy(base + ((gn - gb0) % LEAN_SCAN_STAGES) * LEAN_TILE, next);
            if (gn + 1 < gb1)
                next = cu_lean_scan_src(p, gn + 1, ik, dn);
        }
        cu_cp_async_commit();
        if (sb >= di.blk1) { /* a new slot: its queries */
            while (sb >= di.blk1)
                di = cu_lean_slot(p, ++k);
            first_of_k = sb;
            cu_lean_index_q(p, di.t0, qb);
        }
        const int32_t n = sb - di.blk0;
        cu_lean_block_scores<Tag>(p, base + ((sb - gb0) % LEAN_SCAN_STAGES) * LEAN_TILE, qb,
                                  n * LEAN_B, di.kl, red);
        __syncthreads();
        /* Warp 0: the heads' scores, and at the last of this CTA's blocks
         * of slot k its count (the score stores ordered before it). */
        if (warp == 0) {
            if (lane < sp.num_index_heads) {
                const int h = lane;
                float m = red[h * 2], l = red[h * 2 + 1];
                for (int w = 1; w < LEAN_WARPS; ++w) {
                    const float m2 = red[(w * CU_LEAN_MAX_HEADS + h) * 2];
                    if (sp.score_lse)
                        cu_lse_merge(m, l, m2, red[(w * CU_LEAN_MAX_HEADS + h) * 2 + 1]);
                    else
                        m = cu_nanmax(m, m2);
                }
                sp.scores[((int64_t)di.d0 * sp.num_index_heads + h) * sp.cap_blocks + n] =
                    sp.score_lse ? cu_lse_value(m, l) : m;
            }
            __syncwarp();
            if (lane == 0 && (sb + 1 == gb1 || sb + 1 == di.blk1)) {
                __threadfence();
                atomicAdd(&p.scan_done[k], sb + 1 - first_of_k);
            }
        }
    }
    cu_cp_async_wait<0>(); /* the empty groups */
    __syncthreads();       /* the stages are the attention's now */
}

/* ---- phase 3: attention ------------------------------------------------- */

/* Task i of the end-to-end list: (slot, KV head, j-th selected block). */
typedef struct cu_lean_task {
    int32_t k, h, j;
    int32_t g0, g1; /* the (slot, KV head)'s tasks [g0, g1) */
    int32_t nsel;
} cu_lean_task;

/* Steps a task position to the next task. */
__device__ __forceinline__ void cu_lean_task_next(const cu_lean_params &p, cu_lean_task &x)
{
    if (++x.j < x.nsel)
        return;
    x.j = 0;
    x.g0 = x.g1;
    if (++x.h == p.att.kv_heads) {
        x.h = 0;
        ++x.k;
        const int32_t nb = cu_lean_slot(p, x.k).nblk;
        x.nsel = nb < p.att.topk_blocks ? nb : p.att.topk_blocks;
    }
    x.g1 = x.g0 + x.nsel;
}

/* Task i's position (a walk over the slots: at most CU_LEAN_MAX_ROWS). */
__device__ __forceinline__ cu_lean_task cu_lean_task_at(const cu_lean_params &p, int32_t i)
{
    cu_lean_task x;
    x.k = 0;
    x.h = 0;
    x.g0 = 0;
    for (;;) {
        const int32_t nb = cu_lean_slot(p, x.k).nblk;
        x.nsel = nb < p.att.topk_blocks ? nb : p.att.topk_blocks;
        const int32_t all = x.nsel * p.att.kv_heads;
        if (i < x.g0 + all)
            break;
        x.g0 += all;
        ++x.k;
    }
    x.h = (i - x.g0) / x.nsel;
    x.g0 += x.h * x.nsel;
    x.g1 = x.g0 + x.nsel;
    x.j = i - x.g0;
    return x;
}

/* The CTA that owns task i of A on a grid of G: tasks are dealt in
 * contiguous runs, CTA c taking [ceil(c A / G), ceil((c + 1) A / G)). */
__device__ __forceinline__ int32_t cu_lean_owner(int32_t i, int32_t A, int32_t G)
{
    return i * G / A; /* i < A <= CU_LEAN_MAX_ROWS * 8 * 32 tasks, G < 2^16 */
}

/* Spins (thread 0) until the word reaches `value`; acquire. */
__device__ __forceinline__ void cu_lean_wait_word(const int32_t *w, int32_t value)
{
    int32_t v;
    do {
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(w) : "memory");
    } while (v < value);
}

/* Block id of task x (call with the whole CTA).  Forced blocks (init,
 * local) and requests that keep every block need no selection.  For the
 * others the CTA selects the row itself, once all the slot's blocks are
 * scored, and keeps it (bcast[LEAN_BC_KEY] names the row held in
 * bcast[LEAN_BC_IDS..]): every CTA that needs a row selects it, so no
 * CTA waits for another's selection.  The owner of the row's first
 * selected task publishes it. */
__device__ __forceinline__ int32_t cu_lean_block_of(const cu_lean_params &p, const cu_lean_task &x,
                                                    const cu_dec_info &di, unsigned char *smem,
                                                    int32_t *bcast)
{
    const int32_t K = p.att.topk_blocks, I = p.sel.init_blocks;
    if (di.nblk <= K || x.j < I)
        return x.j;
    if (x.j >= K - p.sel.local_blocks)
        return di.nblk - (K - x.j);
    const int32_t key = x.k * p.att.kv_heads + x.h;
    if (bcast[LEAN_BC_KEY] != key) { /* CTA-uniform */
        if (threadIdx.x == 0)
            cu_lean_wait_word(&p.scan_done[x.k], di.blk1 - di.blk0);
        __syncthreads();
        cu_lean_select(p, di, x.h, x.j == I, smem, bcast + LEAN_BC_IDS);
        if (threadIdx.x == 0)
            bcast[LEAN_BC_KEY] = key;
        __syncthreads();
    }
    return bcast[LEAN_BC_IDS + x.j];
}

/* Copies of task x's block (K and V of KV head x.h) into stage `stage`. */
__device__ __forceinline__ void cu_lean_issue(const cu_lean_params &p, uint32_t base,
                                              const cu_lean_task &x, const cu_dec_info &di,
                                              int32_t id, int stage)
{
    const int64_t fresh = ((int64_t)di.t0 * p.att.kv_heads + x.h) * 128;
    const uint16_t *kf = p.new_rows_from_input ? (const uint16_t *)p.pro.k_rows + fresh : NULL;
    const uint16_t *vf = p.new_rows_from_input ? (const uint16_t *)p.pro.v_rows + fresh : NULL;
    const uint32_t kd = base + stage * LEAN_STAGE;
    cu_lean_copy(kd, cu_lean_row_src(p, p.att.k_plane, p.att.k_strides, x.h, di.r, id * LEAN_B,
                                     di.kl, kf));
    cu_lean_copy(kd + LEAN_TILE, cu_lean_row_src(p, p.att.v_plane, p.att.v_strides, x.h, di.r,
                                                 id * LEAN_B, di.kl, vf));
}

/* The rows of (slot k, KV head h): output row q0 + row, LSE likewise. */
template <typename Tag>
__device__ __forceinline__ void cu_lean_store(const cu_lean_params &p, int64_t q0, int row, int d0,
                                              const float (&v)[8], float lse)
{
    uint32_t *op = (uint32_t *)p.att.out + (((q0 + row) * 128 + d0) >> 1);
#pragma unroll
    for (int e = 0; e < 4; ++e)
        op[e] = cu_pack2(v[2 * e], v[2 * e + 1], Tag());
    if (p.att.lse && d0 == 0)
        p.att.lse[q0 + row] = lse;
}

/* The end of this CTA's part [s0, s1) of (slot k, KV head h): the warps'
 * states merged; the output written, or a partial row and, for the CTA
 * that completes the (slot, KV head), the merge of all its partials. */
template <typename Tag>
__device__ void cu_lean_finish(const cu_lean_params &p, unsigned char *smem, const cu_lean_task &x,
                               const cu_dec_info &di, int32_t s0, int32_t s1, int32_t A,
                               float (&o)[16][4], float m_lo, float m_hi, float l_lo, float l_hi,
                               int32_t *bcast)
{
    const int warp = threadIdx.x >> 5;
    float *slots = (float *)(smem + LEAN_SLOTS);
    cu_rows_sum_quads(l_lo, l_hi);
    cu_rows_save(slots + warp * CU_ROWS_SLOT_FLOATS, o, m_lo, m_hi, l_lo, l_hi);
    __syncthreads();
    /* Thread: row (16 of them) and 8 dims. */
    const int row = threadIdx.x >> 4, d0 = (threadIdx.x & 15) * 8;
    float M = -INFINITY;
    for (int w = 0; w < LEAN_WARPS; ++w)
        M = fmaxf(M, slots[w * CU_ROWS_SLOT_FLOATS + 2048 + row]);
    const float R = M == -INFINITY ? 0.0f : M;
    float L = 0.0f, v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e)
        v[e] = 0.0f;
    for (int w = 0; w < LEAN_WARPS; ++w) {
        const float *sl = slots + w * CU_ROWS_SLOT_FLOATS;
        const float a = exp2f(sl[2048 + row] - R);
        L += a * sl[2064 + row];
#pragma unroll
        for (int e = 0; e < 8; ++e)
            v[e] += a * sl[row * 128 + d0 + e];
    }
    const float inv = cu_rows_inv(L), lse = cu_rows_lse(M, L);
#pragma unroll
    for (int e = 0; e < 8; ++e)
        v[e] *= inv;
    const int64_t q0 = (int64_t)di.t0 * p.att.q_heads + (int64_t)x.h * 16;
    if (s0 == x.g0 && s1 == x.g1) { /* the whole (slot, KV head) */
        cu_lean_store<Tag>(p, q0, row, d0, v, lse);
        __syncthreads(); /* the slots are reused */
        return;
    }
    /* A partial row at the slot of its first task. */
    const int32_t G = gridDim.x;
    float *part = p.partials + ((int64_t)s0 * 16 + row) * CU_LEAN_PART_STRIDE;
    *(float4 *)&part[d0] = make_float4(v[0], v[1], v[2], v[3]);
    *(float4 *)&part[d0 + 4] = make_float4(v[4], v[5], v[6], v[7]);
    if (d0 == 0)
        part[128] = lse;
    /* The segments' first tasks (at most K of them), in shared memory:
     * warp 0 marks the tasks where the owner changes. */
    int32_t *starts = bcast + LEAN_BC_STARTS;
    if (threadIdx.x < 32) {
        const int32_t i = x.g0 + (int32_t)threadIdx.x;
        const bool start = i < x.g1 &&
                           (i == x.g0 || cu_lean_owner(i, A, G) != cu_lean_owner(i - 1, A, G));
        const uint32_t mask = __ballot_sync(0xffffffffu, start);
        if (start)
            starts[__popc(mask & ((1u << threadIdx.x) - 1u))] = i;
        if (threadIdx.x == 0)
            bcast[3] = __popc(mask);
    }
    __syncthreads();
    const int32_t nseg = bcast[3];
    int32_t *cnt = &p.merge_done[(int64_t)x.k * p.att.kv_heads + x.h];
    if (threadIdx.x == 0) {
        __threadfence();
        const int32_t before = atomicAdd(cnt, 1);
        const int last = before == nseg - 1;
        if (last) {
            *cnt = 0;
            __threadfence();
        }
        bcast[0] = last;
    }
    __syncthreads();
    if (!bcast[0])
        return;
    /* The merge: every segment's rows weighted by exp(LSE - max).  The
     * LSEs go through shared memory (the slots are free again) so that
     * each pass keeps several loads in flight. */
    float *lses = slots + row * 32;
    for (int32_t q = threadIdx.x & 15; q < nseg; q += 16)
        lses[q] = __ldcg(&p.partials[((int64_t)starts[q] * 16 + row) * CU_LEAN_PART_STRIDE + 128]);
    __syncthreads();
    float Ms = -INFINITY;
    for (int32_t q = 0; q < nseg; ++q)
        Ms = fmaxf(Ms, lses[q]);
    const float Rs = Ms == -INFINITY ? 0.0f : Ms;
    float W = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e)
        v[e] = 0.0f;
    for (int32_t qb = 0; qb < nseg; qb += 8) { /* eight segments' loads in flight */
        float4 xa[8], xb[8];
        float a[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const bool on = qb + u < nseg;
            const float *pr =
                p.partials + ((int64_t)starts[on ? qb + u : 0] * 16 + row) * CU_LEAN_PART_STRIDE;
            xa[u] = on ? __ldcg((const float4 *)&pr[d0]) : make_float4(0.f, 0.f, 0.f, 0.f);
            xb[u] = on ? __ldcg((const float4 *)&pr[d0 + 4]) : make_float4(0.f, 0.f, 0.f, 0.f);
            a[u] = on ? expf(lses[qb + u] - Rs) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            W += a[u];
            v[0] += a[u] * xa[u].x;
            v[1] += a[u] * xa[u].y;
            v[2] += a[u] * xa[u].z;
            v[3] += a[u] * xa[u].w;
            v[4] += a[u] * xb[u].x;
            v[5] += a[u] * xb[u].y;
            v[6] += a[u] * xb[u].z;
            v[7] += a[u] * xb[u].w;
        }
    }
    const float winv = W > 0.0f ? 1.0f / W : 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e)
        v[e] *= winv;
    cu_lean_store<Tag>(p, q0, row, d0, v, W > 0.0f ? Rs + logf(W) : -INFINITY);
}

/* Thread 0, once its CTA reads no more scan counts: the last CTA to
 * arrive puts them back to 0 (and the arrival count). */
__device__ __forceinline__ void cu_lean_arrive(const cu_lean_params &p)
{
    if (atomicAdd(p.ctas_done, 1) == (int32_t)gridDim.x - 1) {
        const int32_t n_dec = p.sel.meta.hdr->n_dec;
        for (int32_t k = 0; k < n_dec; ++k)
            p.scan_done[k] = 0;
        *p.ctas_done = 0;
    }
}

template <typename Tag>
__device__ void cu_lean_attend(const cu_lean_params &p, unsigned char *smem, int32_t *bcast)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int32_t n_dec = p.sel.meta.hdr->n_dec;
    const int32_t G = gridDim.x, c = blockIdx.x;
    int32_t A = 0;
    for (int32_t k = 0; k < n_dec; ++k) {
        const int32_t nb = cu_lean_slot(p, k).nblk;
        A += (nb < p.att.topk_blocks ? nb : p.att.topk_blocks) * p.att.kv_heads;
    }
    const int32_t i0 = (int32_t)(((int64_t)c * A + G - 1) / G);
    const int32_t i1 = (int32_t)(((int64_t)(c + 1) * A + G - 1) / G);
    if (i0 >= i1) {
        if (threadIdx.x == 0)
            cu_lean_arrive(p);
        return;
    }
    const uint32_t base = cu_smem_addr(smem);
    const float sl2 = p.att.scale * LEAN_LOG2E;

    if (threadIdx.x == 0)
        CU_TL_MARK(p.att, CU_TL_ATTN, CU_TL_ENTRY);
    cu_lean_task x = cu_lean_task_at(p, i0); /* the task computed */
    cu_lean_task y = x;                      /* the task copied next */
    cu_dec_info di = cu_lean_slot(p, x.k), dy = di;
    int32_t id_x = cu_lean_block_of(p, x, di, smem, bcast);
    if (threadIdx.x == 0 && i0 + 1 == i1)
        cu_lean_arrive(p);
    if (threadIdx.x == 0)
        CU_TL_MARK(p.att, CU_TL_ATTN, CU_TL_WAITED);
    cu_lean_issue(p, base, x, di, id_x, 0);
    cu_cp_async_commit();
    if (threadIdx.x == 0)
        CU_TL_MARK(p.att, CU_TL_ATTN, CU_TL_ISSUED);

    uint32_t qa[8][4];
    float o[16][4], m_lo, m_hi, l_lo, l_hi;
    int32_t s0 = i0; /* the first task of this CTA's part of x's (slot, KV head) */
    for (int32_t i = i0; i < i1; ++i) {
        if (i == s0) {
            const int64_t q_lo = (int64_t)di.t0 * p.att.q_heads + x.h * 16 + (lane >> 2);
            cu_rows_load_q(p.att.q, q_lo, q_lo + 8, true, true, qa);
            cu_rows_clear(o, m_lo, m_hi, l_lo, l_hi);
        }
        /* The copies of task i + 1 go out before task i is computed. */
        int32_t id_y = 0;
        if (i + 1 < i1) {
            cu_lean_task_next(p, y);
            dy = cu_lean_slot(p, y.k);
            id_y = cu_lean_block_of(p, y, dy, smem, bcast);
            if (threadIdx.x == 0 && i + 2 == i1)
                cu_lean_arrive(p);
            cu_lean_issue(p, base, y, dy, id_y, (i + 1 - i0) & 1);
            cu_cp_async_commit();
            cu_cp_async_wait<1>();
        } else {
            cu_cp_async_wait<0>();
        }
        __syncthreads();
        if (i == i0 && threadIdx.x == 0)
            CU_TL_MARK(p.att, CU_TL_ATTN, CU_TL_FIRST);
        const uint32_t ka = base + ((i - i0) & 1) * LEAN_STAGE;
        float sc[2][4];
        cu_rows_qk<Tag, 2, cu_lean_swz>(ka, warp * 16, qa, sc);
        /* Keys at or past kl (zero-filled rows of the last block) are out. */
        const int32_t key0 = id_x * LEAN_B + warp * 16 + 2 * (lane & 3);
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const bool ok = key0 + n * 8 + e < di.kl;
                sc[n][e] = ok ? sc[n][e] * sl2 : -INFINITY;
                sc[n][2 + e] = ok ? sc[n][2 + e] * sl2 : -INFINITY;
            }
        cu_rows_softmax<2>(sc, o, m_lo, m_hi, l_lo, l_hi);
        cu_rows_pv<Tag, 16, cu_lean_swz>(ka + LEAN_TILE, warp * 16, sc, o);
        if (i + 1 == i1 || i + 1 == x.g1) {
            cu_lean_finish<Tag>(p, smem, x, di, s0, i + 1, A, o, m_lo, m_hi, l_lo, l_hi, bcast);
            s0 = i + 1;
            if (threadIdx.x == 0)
                CU_TL_MARK(p.att, CU_TL_ATTN, CU_TL_LAST);
        }
        __syncthreads(); /* the stage is free for the copies of task i + 2 */
        x = y;
        di = dy;
        id_x = id_y;
    }
}

template <typename Tag>
__global__ void __launch_bounds__(LEAN_THREADS, 1) cu_lean_kernel(cu_lean_params p)
{
    extern __shared__ __align__(128) unsigned char smem[];
    float *red = (float *)(smem + LEAN_SMALL);
    int32_t *bcast = (int32_t *)(red + LEAN_RED_FLOATS);
    const int32_t G = gridDim.x;
    if (threadIdx.x == 0) {
        CU_TL_MARK(p.pro, CU_TL_PROLOGUE, CU_TL_ENTRY);
        bcast[LEAN_BC_KEY] = -1; /* no row selected yet */
    }

    /* 1. Index scan (its copies first: the scan starts the step's longest
     * chain of dependent work). */
    cu_lean_scan<Tag>(p, smem, red);
    if (threadIdx.x == 0)
        CU_TL_MARK(p.pro, CU_TL_PROLOGUE, CU_TL_FIRST);

    /* 2. Token rows, one per CTA from the grid's end. */
    const int32_t ntok = p.pro.hdr->num_tokens;
    for (int32_t t = G - 1 - (int32_t)blockIdx.x; t < ntok; t += G) {
        const cu_tok_info ti = p.pro.tok_info[t];
        cu_prologue_token<false>(p.pro, t, ti);
        /* A request that keeps every block: its rows of ids. */
        if (ti.r >= 0) {
            const int32_t nblk = ti.pos / p.sel.block_size + 1;
            if (nblk <= p.sel.topk_blocks) {
                const int32_t W = p.sel.topk_width;
                const int64_t off = (int64_t)t * p.sel.num_kv_heads * W;
                for (int32_t e = threadIdx.x; e < p.sel.num_kv_heads * W; e += LEAN_THREADS) {
                    const int32_t j = e % W;
                    const int32_t id = j < nblk ? j : -1;
                    p.sel.selected[off + e] = id;
                    if (p.sel.topk_ids)
                        p.sel.topk_ids[off + e] = id;
                }
            }
        }
    }
    __syncthreads(); /* bcast[LEAN_BC_KEY] seen by every thread */

    /* 3. Selection (where needed) and attention. */
    cu_lean_attend<Tag>(p, smem, bcast);
    if (threadIdx.x == 0)
        CU_TL_MARK(p.pro, CU_TL_PROLOGUE, CU_TL_EXIT);
}

/* ---- host ---------------------------------------------------------------- */

/* Counters first (1 + Hkv words a decode slot, and one), then the
 * partial rows (one task's 16 rows each) at a 16-byte boundary. */
static size_t cu_lean_words(int32_t slots, int32_t kv_heads)
{
    const size_t w = (size_t)slots * (1 + (size_t)kv_heads) + 1;
    return (w + 3) / 4 * 4;
}

size_t cu_lean_ws_bytes(int32_t slots, int32_t kv_heads, int32_t topk_blocks)
{
    const size_t tasks = (size_t)slots * kv_heads * topk_blocks;
    return cu_lean_words(slots, kv_heads) * 4 + tasks * 16 * CU_LEAN_PART_STRIDE * 4;
}

void cu_lean_ws_carve(void *base, int32_t slots, int32_t kv_heads, cu_lean_params *p)
{
    int32_t *w = (int32_t *)base;
    p->scan_done = w;
    p->merge_done = w + slots;
    p->ctas_done = p->merge_done + (size_t)slots * kv_heads;
    p->partials = (float *)(w + cu_lean_words(slots, kv_heads));
}

int cu_lean_fits(const msa_model *m, int32_t layer, const msa_cache_config *cc, msa_dtype act,
                 const char **why)
{
    const msa_model_config *cfg = &m->cfg;
    const char *no = NULL;
    if (!m->layer_sparse[layer])
        no = "dense layer";
    else if (m->layer_index_value[layer])
        no = "layer with an index-value pass";
    else if ((act != MSA_DTYPE_BF16 && act != MSA_DTYPE_FP16) || cc->kv_dtype != act ||
             cc->index_dtype != act)
        no = "activations and planes not of one 16-bit type";
    else if (cfg->head_dim != 128 || cfg->index_dim != 128 || cfg->block_size != LEAN_B)
        no = "head or index dim, or block size, not 128";
    else if (m->group != 16)
        no = "not 16 query heads per KV head";
    else if (cfg->num_index_heads != cfg->num_kv_heads || cfg->num_kv_heads > CU_LEAN_MAX_HEADS)
        no = "index heads not one per KV head (at most 8)";
    else if (cfg->topk_blocks > 32 || cfg->init_blocks + cfg->local_blocks > cfg->topk_blocks)
        no = "K above 32 or forced blocks above K";
    if (no && why)
        *why = no;
    return no == NULL;
}

size_t cu_lean_smem(void)
{
    return LEAN_SMEM_BYTES;
}

cudaError_t cu_lean_setup(void)
{
    return cu_allow_smem(LEAN_SMEM_BYTES, cu_lean_kernel<cu_bf16_tag>, cu_lean_kernel<cu_f16_tag>);
}

/* The layer's first kernel: launched plainly, after the caller's work. */
void cu_launch_lean(const cu_lean_params *p, int grid, cudaStream_t s)
{
    if (p->att.act_dtype == MSA_DTYPE_BF16)
        cu_lean_kernel<cu_bf16_tag><<<grid, LEAN_THREADS, LEAN_SMEM_BYTES, s>>>(*p);
    else
        cu_lean_kernel<cu_f16_tag><<<grid, LEAN_THREADS, LEAN_SMEM_BYTES, s>>>(*p);
}
