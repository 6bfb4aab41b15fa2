/*
 * Prefill attention on Hopper: warpgroup products (wgmma, sm_90a) on K and
 * V pages streamed into shared memory by tensor-map copies.  See the header
 * for what it serves and docs/PREFILL.md for the design.
 *
 * One CTA per SM walks the work items (tile of tokens x KV head x chunk of
 * query heads, the same items as the portable kernel).  Three warpgroups:
 *   warp 8      the producer (the other warps of its group end at once and
 *               give their registers to the consumers): walks the item's
 *               key stream, one 128-key block (one page of one KV head: a
 *               [128][128] tile) at a time, and copies its K and V into a
 *               ring slot (four boxes each), with the slot's meta: the
 *               block's first position, the tokens that selected it,
 *               whether it ends the item;
 *   warps 0-7   two consumer warpgroups, group h owning tile rows
 *               64h .. 64h + 63 (row = token x heads + head: four tokens
 *               of 16 heads for M3).  Per block: S = Q K^T (wgmma
 *               m64n128k16, Q in registers, K from the slot), the masks
 *               and the online softmax in registers, P rounded to the
 *               16-bit type in registers and O += P V (wgmma, P as the A
 *               operand from registers, V read MN-major from the slot).
 *               Block j's S and block j-1's O += P V are issued together
 *               in the group's turn; the two groups take turns (one
 *               group's softmax runs while the other's products do).
 * Sparse: the stream is the union of the tile's tokens' selected blocks;
 * the producer merges the tokens' ascending rows (lane = token: warp min,
 * ballot of the lanes holding it, those lanes advance) into a list, so each
 * block comes with the bits of the tokens that chose it.  Dense: blocks 0
 * to the tile's last position's.  A key counts for a row when its token
 * chose the block and the key's position is at most the token's (the
 * causal mask, which also covers the local block and the tile's later
 * tokens).  A group none of whose rows use a block skips its products.
 * Output rows and LSE are written once (prefill rows are never split).
 *
 * Rows at and past the request's kv_len in its last page are stale cache
 * contents: their scores are masked, and the producer zeroes that page's
 * V rows before the consumers see it, so a stale NaN cannot reach O
 * through a zero weight.
 */
#include "cuda/kernels/attention/attention_prefill_tma_sm90.cuh"
#include "cuda/kernels/attention/prefill_tile_sm90.cuh"
#include "cuda/arch/launch.cuh"

#include <string.h>

#define PFH_CONSUMER_WARPS 8
/* Three warpgroups: the registers are allocated per warpgroup, so the
 * producer takes a whole one (its first warp works, the others end) and
 * gives most of its registers to the consumers (setmaxnreg). */
#define PFH_THREADS ((PFH_CONSUMER_WARPS + 4) * 32)
#define PFH_PRODUCER_REGS 40
#define PFH_CONSUMER_REGS 232
static_assert(4 * 32 * PFH_PRODUCER_REGS + PFH_CONSUMER_WARPS * 32 * PFH_CONSUMER_REGS <=
                  CU_LAUNCH_REGS(PFH_THREADS) * PFH_THREADS,
              "the CTA's registers hold the producer and the consumers");
static_assert(PFH_GROUP_ROWS * (PFH_CONSUMER_WARPS / 4) == 128,
              "the consumer warpgroups cover a tile's 128 rows");
#define PFH_STAGE_BYTES (2 * PFH_TILE_BYTES)
/* Three stages of 64 KB: the next two blocks are in flight while one is
 * computed (a block's products take about as long as a copy's latency). */
#ifndef MSA_PFH_STAGES
#define MSA_PFH_STAGES 3
#endif
#define PFH_STAGES MSA_PFH_STAGES
#define PFH_RING_BYTES (PFH_STAGES * PFH_STAGE_BYTES)
/* Barriers (full K, full V, empty per stage; the tail's), then the metas. */
#define PFH_BAR_BYTES ((3 * PFH_STAGES + 1) * 8)
#define PFH_META_BYTES (PFH_STAGES * 16)
#define PFH_FIXED_BYTES (1024 + PFH_RING_BYTES + PFH_BAR_BYTES + PFH_META_BYTES)
/* Shared memory a block may have on the H100 / H200. */
#define PFH_SMEM_LIMIT (227 * 1024)
/* Every consumer lane arrives on a slot's empty barrier (its own reads of
 * the slot released by its own arrival, as racecheck asks). */
#define PFH_EMPTY_ARRIVALS (PFH_CONSUMER_WARPS * 32)

static_assert(PFH_STAGES >= 2,
              "the ring needs two stages (a pending tail is finished before the next claim)");
static_assert(PFH_FIXED_BYTES <= PFH_SMEM_LIMIT, "the ring exceeds shared memory");

/* Shared memory of a launch: the fixed part and the producer's staging of
 * the tile's selection rows and of their union (sparse). */
static size_t cu_pfh_smem(int32_t tt, int32_t W, int sparse)
{
    const size_t n = (size_t)tt * (size_t)W;
    return (size_t)PFH_FIXED_BYTES + (sparse ? ((n + 1) & ~(size_t)1) * 4 + n * 8 : 0);
}

/* One work item as the CTA sees it. */
typedef struct cu_pfh_item {
    int32_t r, t0, ntok, pos0;
    int32_t g, h0, nh; /* KV head, first query head of the chunk, heads in it */
    int32_t kv_end;    /* last token's position + 1 */
} cu_pfh_item;

__device__ __forceinline__ cu_pfh_item cu_pfh_item_of(const cu_pfh_params &p, int64_t w,
                                                      int32_t per_tile)
{
    const int32_t ti = (int32_t)(w / per_tile);
    const int32_t rest = (int32_t)(w - (int64_t)ti * per_tile);
    const cu_pf_tile t = p.tiles[ti];
    cu_pfh_item it;
    it.r = t.r;
    it.t0 = t.t0;
    it.ntok = t.ntok;
    it.pos0 = t.pos0;
    it.g = rest / p.hchunks;
    it.h0 = (rest - it.g * p.hchunks) * p.nh;
    it.nh = min(p.nh, p.g - it.h0);
    it.kv_end = t.pos0 + t.ntok;
    return it;
}

typedef struct cu_pfh_smem_t {
    unsigned char *ring;
    uint64_t *full_k, *full_v, *empty, *tail;
    int4 *meta;     /* per slot: first position, token bits, last (1: ends the item) */
    int32_t *stage; /* [tt * W] the tile's selection rows (producer) */
    int2 *list;     /* [tt * W] their union: block id, bits of the tokens that chose it */
} cu_pfh_smem_t;

/* The layout: the ring (1024-byte aligned, as the 128-byte swizzle's
 * atoms must be), the barriers, the metas, the staging area and the union
 * list (tt x W entries each; the list 8-byte aligned). */
__device__ __forceinline__ cu_pfh_smem_t cu_pfh_smem_of(unsigned char *raw, int32_t n)
{
    cu_pfh_smem_t sm;
    sm.ring = (unsigned char *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
    sm.full_k = (uint64_t *)(sm.ring + PFH_RING_BYTES);
    sm.full_v = sm.full_k + PFH_STAGES;
    sm.empty = sm.full_v + PFH_STAGES;
    sm.tail = sm.empty + PFH_STAGES;
    sm.meta = (int4 *)(sm.tail + 1);
    sm.stage = (int32_t *)(sm.meta + PFH_STAGES);
    sm.list = (int2 *)(sm.stage + ((n + 1) & ~1));
    return sm;
}

#ifdef CU_HAVE_WGMMA

/* ---- producer -------------------------------------------------------------- */

/* The producer's ring position and its pending tail: a block whose page
 * holds stale rows (at and past kv_len) has its V land on the tail barrier;
 * the producer zeroes those rows and then releases the slot's V to the
 * consumers.  That is done after the next block's copies are issued (not
 * at once, so the copy's latency is not waited for with nothing else in
 * flight), and always before the following claim: that claim may wait for
 * the tail's own slot.  There is one tail barrier, so at most one tail is
 * armed at a time: a tail block right after another (an item ending in its
 * request's last page, then an item whose first block is its request's
 * last page: kv_len <= 128) first finishes the pending one. */
typedef struct cu_pfh_prod {
    uint32_t gs;        /* slots claimed so far */
    uint32_t tail_par;  /* the tail barrier's next phase parity */
    int pend_s;         /* slot of the pending tail, -1: none */
    int32_t pend_valid; /* rows of it before kv_len */
} cu_pfh_prod;

__device__ __forceinline__ void cu_pfh_tail_finish(const cu_pfh_smem_t &sm, cu_pfh_prod &pr)
{
    if (pr.pend_s < 0)
        return;
    const int lane = threadIdx.x & 31;
    cu_mbar_wait(sm.tail, pr.tail_par);
    pr.tail_par ^= 1u;
    unsigned char *vd = sm.ring + pr.pend_s * PFH_STAGE_BYTES + PFH_TILE_BYTES;
    /* Row r's bytes of each column half: swizzling moves 16-byte chunks
     * within a row only, so whole rows are cleared wherever their chunks
     * sit.  A row has PFH_ROW_BYTES / 16 chunks, 8 per column half. */
    for (int32_t e = pr.pend_valid * 16 + lane; e < PFH_KEYS * 16; e += 32) {
        const int32_t r = e >> 4, c = e & 15;
        *(uint4 *)(vd + (c >> 3) * (PFH_TILE_BYTES / 2) + r * PFH_BOX_ROW_BYTES + (c & 7) * 16) =
            make_uint4(0u, 0u, 0u, 0u);
    }
    /* Seen by the products (async proxy), and a later copy into this slot
     * lands after these writes. */
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncwarp();
    if (lane == 0)
        cu_mbar_arrive(&sm.full_v[pr.pend_s]);
    pr.pend_s = -1;
}

/* Claims the next slot (lane 0 waits until the consumers released its
 * previous use), publishes its meta and issues the block's copies: page
 * `page` of the request (-1: no block, an empty item's end marker), first
 * position pos, token bits, last flag.  kv_len: the request's. */
__device__ __forceinline__ void cu_pfh_issue(const cu_pfh_params &p, const cu_pfh_smem_t &sm,
                                             cu_pfh_prod &pr, const CUtensorMap *map_k,
                                             const CUtensorMap *map_v, const cu_pfh_item &it,
                                             int32_t page, int32_t pos, uint32_t bits, int last,
                                             int32_t kv_len)
{
    const int lane = threadIdx.x & 31;
    const int s = (int)(pr.gs % PFH_STAGES);
    const uint32_t par = (pr.gs / PFH_STAGES) & 1u;
    const bool tail = page >= 0 && pos + PFH_KEYS > kv_len;
    /* Arming the tail barrier again while the pending tail's phase has not
     * completed would merge both copies into one phase (the second arrival
     * on a phase whose count is already reached): the second tail's wait
     * would then never see its phase complete. */
    if (tail)
        cu_pfh_tail_finish(sm, pr);
    if (lane == 0) {
        if (pr.gs >= PFH_STAGES)
            cu_mbar_wait(&sm.empty[s], par ^ 1u);
        sm.meta[s] = make_int4(pos, (int32_t)bits, last, 0);
        if (page >= 0) {
            const uint32_t kd = cu_smem_addr(sm.ring + s * PFH_STAGE_BYTES);
            cu_mbar_arrive_tx(&sm.full_k[s], PFH_TILE_BYTES);
            cu_pfh_load_page(kd, map_k, page, it.g, &sm.full_k[s]);
            uint64_t *vbar = tail ? sm.tail : &sm.full_v[s];
            cu_mbar_arrive_tx(vbar, PFH_TILE_BYTES);
            cu_pfh_load_page(kd + PFH_TILE_BYTES, map_v, page, it.g, vbar);
        } else {
            cu_mbar_arrive(&sm.full_k[s]);
            cu_mbar_arrive(&sm.full_v[s]);
        }
    }
    __syncwarp();
    ++pr.gs;
    cu_pfh_tail_finish(sm, pr); /* the previous block's, if any */
    if (tail) {
        pr.pend_s = s;
        pr.pend_valid = kv_len - pos;
    }
}

__device__ void cu_pfh_producer(const cu_pfh_params &p, const cu_pfh_smem_t &sm,
                                const CUtensorMap *map_k, const CUtensorMap *map_v,
                                const cu_pfh_item &it, cu_pfh_prod &pr)
{
    const int lane = threadIdx.x & 31;
    const int32_t *pt = p.page_table + (int64_t)it.r * p.cap_pages;
    const int32_t kv_len = p.kv_len[it.r];
    const uint32_t all = it.ntok >= 32 ? 0xffffffffu : ((1u << it.ntok) - 1u);
    if (!p.sparse) {
        const int32_t nblk = (it.kv_end - 1) / PFH_KEYS + 1;
        for (int32_t b = 0; b < nblk; ++b)
            cu_pfh_issue(p, sm, pr, map_k, map_v, it, pt[b], b * PFH_KEYS, all, b + 1 == nblk,
                         kv_len);
        return;
    }
    /* The tokens' rows into the staging area, their merge into the union
     * list (block id, bits of the tokens that chose it), then the copies:
     * the merge and the copies in one loop would need more than the
     * producer's registers. */
    for (int32_t tok = 0; tok < it.ntok; ++tok) {
        const int32_t *src = p.sel + ((int64_t)(it.t0 + tok) * p.hkv + it.g) * p.W;
#pragma unroll 1
        for (int32_t c = lane; c < p.W; c += 32)
            sm.stage[tok * p.W + c] = src[c];
    }
    __syncwarp();
    int2 *list = sm.list;
    int32_t nu = 0;
    {
        const int32_t *row = sm.stage + lane * p.W;
        int32_t i = 0;
        int32_t h = lane < it.ntok && p.W > 0 && row[0] >= 0 ? row[0] : INT32_MAX;
        for (int32_t cur = __reduce_min_sync(0xffffffffu, h); cur != INT32_MAX;
             cur = __reduce_min_sync(0xffffffffu, h)) {
            const uint32_t bits = __ballot_sync(0xffffffffu, h == cur);
            if (lane == 0)
                list[nu] = make_int2(cur, (int32_t)(bits & all));
            ++nu;
            if (h == cur) {
                ++i;
                h = i < p.W && row[i] >= 0 ? row[i] : INT32_MAX;
            }
        }
    }
    __syncwarp();
    if (nu == 0) { /* no block at all: the end marker alone */
        cu_pfh_issue(p, sm, pr, map_k, map_v, it, -1, 0, 0u, 1, kv_len);
        return;
    }
    for (int32_t u = 0; u < nu; ++u) {
        const int2 e = list[u];
        cu_pfh_issue(p, sm, pr, map_k, map_v, it, pt[e.x], e.x * PFH_KEYS, (uint32_t)e.y,
                     u + 1 == nu, kv_len);
    }
}

/* ---- consumers ------------------------------------------------------------- */

/* The two consumer groups take turns at issuing products (ping-pong): so
 * that one group's softmax runs while the other's products are on the
 * tensor cores, rather than both groups waiting for the same slot, issuing
 * together and computing their softmax together while the tensor cores
 * idle.  Group g waits for its turn on barrier PFH_TURN_BAR + g (its 128
 * threads and the other group's 128 arrivals) and hands the turn on right
 * after issuing.  Group 1 hands group 0 the first turn (cu_pfh_turns_begin)
 * and group 0 takes the last hand-over back at the end (cu_pfh_turns_end),
 * so that no arrival is left pending when the CTA ends. */
#define PFH_TURN_BAR 1
#define PFH_TURN_THREADS (PFH_CONSUMER_WARPS * 32)
static_assert(PFH_CONSUMER_WARPS == 8, "the turns are those of two consumer warpgroups");

__device__ __forceinline__ void cu_pfh_turn_wait(int wg)
{
    cu_named_sync(PFH_TURN_BAR + wg, PFH_TURN_THREADS);
}

__device__ __forceinline__ void cu_pfh_turn_pass(int wg)
{
    cu_named_arrive(PFH_TURN_BAR + (wg ^ 1), PFH_TURN_THREADS);
}

__device__ __forceinline__ void cu_pfh_turns_begin(int wg)
{
    if (wg == 1)
        cu_pfh_turn_pass(wg);
}

__device__ __forceinline__ void cu_pfh_turns_end(int wg)
{
    if (wg == 0)
        cu_pfh_turn_wait(wg);
}

/* Issues the pending O += P V: the weights pa against slot ps's V (the
 * caller has waited for it). */
template <typename Tag>
__device__ __forceinline__ void cu_pfh_pv_issue_pending(const cu_pfh_smem_t &sm,
                                                        const uint32_t (&pa)[8][4],
                                                        float (&o)[16][4], int ps)
{
    cu_pfh_pv_issue<Tag>(cu_smem_addr(sm.ring + ps * PFH_STAGE_BYTES) + PFH_TILE_BYTES, pa, o);
}

/* The pending O += P V has ended (after the wait): its operands are the
 * thread's again and slot ps goes back to the producer. */
__device__ __forceinline__ void cu_pfh_pv_release(const cu_pfh_smem_t &sm, uint32_t (&pa)[8][4],
                                                  float (&o)[16][4], int ps)
{
    cu_wgmma_hold(o);
    cu_pfh_hold_a(pa);
    cu_mbar_arrive(&sm.empty[ps]);
}

/* One turn: the pending O += P V (weights pa of slot ps, its V of phase
 * pv) issued and waited for, its slot handed back; without one, the turn
 * is passed on at once. */
template <typename Tag>
__device__ __forceinline__ void cu_pfh_pv_pending(const cu_pfh_smem_t &sm, int wg,
                                                  uint32_t (&pa)[8][4], float (&o)[16][4], int &ps,
                                                  uint32_t pv)
{
    if (ps >= 0) {
        cu_mbar_wait(&sm.full_v[ps], pv);
        cu_pfh_turn_wait(wg);
        cu_pfh_pv_issue_pending<Tag>(sm, pa, o, ps);
        cu_pfh_turn_pass(wg);
        cu_wgmma_wait_all();
        cu_pfh_pv_release(sm, pa, o, ps);
        ps = -1;
    } else {
        cu_pfh_turn_wait(wg);
        cu_pfh_turn_pass(wg);
    }
}

template <typename Tag>
__device__ void cu_pfh_consumer(const cu_pfh_params &p, const cu_pfh_smem_t &sm,
                                const cu_pfh_item &it, uint32_t &gs)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int wg = warp >> 2;

    /* The thread's rows: tile row = token x nh + head in the chunk. */
    const int32_t nrows = it.ntok * it.nh;
    const int32_t row_lo = warp * 16 + (lane >> 2), row_hi = row_lo + 8;
    const bool ok_lo = row_lo < nrows, ok_hi = row_hi < nrows;
    int32_t pos_lo = -1, pos_hi = -1; /* the rows' token positions (-1: no row) */
    uint32_t tb_lo = 0u, tb_hi = 0u;
    int64_t q_lo = 0, q_hi = 0;
    if (ok_lo) {
        const int32_t tok = row_lo / it.nh;
        tb_lo = 1u << tok;
        pos_lo = it.pos0 + tok;
        q_lo = (int64_t)(it.t0 + tok) * p.hq_total + it.g * p.g + it.h0 + (row_lo - tok * it.nh);
    }
    if (ok_hi) {
        const int32_t tok = row_hi / it.nh;
        tb_hi = 1u << tok;
        pos_hi = it.pos0 + tok;
        q_hi = (int64_t)(it.t0 + tok) * p.hq_total + it.g * p.g + it.h0 + (row_hi - tok * it.nh);
    }
    /* The group's tokens and its last position (uniform over the group:
     * its products are collective). */
    const int32_t r0 = wg * PFH_GROUP_ROWS;
    uint32_t wbits = 0u;
    int32_t wlast = -1;
    if (r0 < nrows) {
        const int32_t tf = r0 / it.nh, tl = (min(r0 + PFH_GROUP_ROWS, nrows) - 1) / it.nh;
        wbits = (tl >= 31 ? 0xffffffffu : ((2u << tl) - 1u)) & ~((1u << tf) - 1u);
        wlast = it.pos0 + tl;
    }

    uint32_t qa[8][4];
    cu_rows_load_q(p.q, q_lo, q_hi, ok_lo, ok_hi, qa);
    float o[16][4], m_lo, m_hi, l_lo, l_hi;
    cu_rows_clear(o, m_lo, m_hi, l_lo, l_hi);

    /* The products run one block apart: block j's S = Q K^T and block
     * j-1's O += P V are issued together in the group's turn (between
     * cu_pfh_turn_wait and cu_pfh_turn_pass), then block j's softmax runs
     * while the other group's products are on the tensor cores.  pa holds
     * the pending weights, ps their slot (-1: none) and pv its V's phase.  Every block is one turn of each group
     * (with products or without), so both groups take the same turns.
     * Each branch waits for the products it issues (ptxas serializes
     * products whose wait lies in another branch). */
    uint32_t pa[8][4];
    int ps = -1;
    uint32_t pv = 0u;
    for (;;) {
        const int s = (int)(gs % PFH_STAGES);
        const uint32_t par = (gs / PFH_STAGES) & 1u;
        ++gs;
        cu_mbar_wait(&sm.full_k[s], par);
        const int4 mt = sm.meta[s];
        const uint32_t bits = (uint32_t)mt.y;
        const bool use = (bits & wbits) != 0u && mt.x <= wlast;
        const uint32_t ka = cu_smem_addr(sm.ring + s * PFH_STAGE_BYTES);
        const int32_t lim_lo = (bits & tb_lo) ? pos_lo - mt.x : -1;
        const int32_t lim_hi = (bits & tb_hi) ? pos_hi - mt.x : -1;
        if (use) {
            float sc[16][4];
            if (ps >= 0) {
                cu_mbar_wait(&sm.full_v[ps], pv);
                cu_pfh_turn_wait(wg);
                cu_pfh_qk_issue<Tag>(ka, qa, sc);
                cu_pfh_pv_issue_pending<Tag>(sm, pa, o, ps);
                cu_pfh_turn_pass(wg);
                cu_wgmma_wait_all();
                cu_wgmma_hold(sc);
                cu_pfh_pv_release(sm, pa, o, ps);
            } else {
                cu_pfh_turn_wait(wg);
                cu_pfh_qk_issue<Tag>(ka, qa, sc);
                cu_pfh_turn_pass(wg);
                cu_wgmma_wait_all();
                cu_wgmma_hold(sc);
            }
            cu_pfh_softmax(sc, lim_lo, lim_hi, p.scale_log2, o, m_lo, m_hi, l_lo, l_hi);
            cu_pfh_pack_p<Tag>(sc, pa);
            ps = s;
            pv = par;
        } else {
            cu_pfh_pv_pending<Tag>(sm, wg, pa, o, ps, pv);
            /* The slot's V copy must have landed before it is handed back. */
            cu_mbar_wait(&sm.full_v[s], par);
            cu_mbar_arrive(&sm.empty[s]);
        }
        if (mt.z)
            break;
    }
    cu_pfh_pv_pending<Tag>(sm, wg, pa, o, ps, pv);
    cu_rows_sum_quads(l_lo, l_hi);

    const float inv_lo = cu_rows_inv(l_lo) * p.v_mul, inv_hi = cu_rows_inv(l_hi) * p.v_mul;
    uint32_t *op = (uint32_t *)p.o;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
        const int d = n * 8 + 2 * (lane & 3);
        if (ok_lo)
            op[(q_lo * PFH_HEAD_DIM + d) >> 1] =
                cu_pack2(o[n][0] * inv_lo, o[n][1] * inv_lo, Tag());
        if (ok_hi)
            op[(q_hi * PFH_HEAD_DIM + d) >> 1] =
                cu_pack2(o[n][2] * inv_hi, o[n][3] * inv_hi, Tag());
    }
    if (p.lse && (lane & 3) == 0) {
        if (ok_lo)
            p.lse[q_lo] = cu_rows_lse(m_lo, l_lo);
        if (ok_hi)
            p.lse[q_hi] = cu_rows_lse(m_hi, l_hi);
    }
}

#endif /* CU_HAVE_WGMMA */

template <typename Tag>
__global__ void __launch_bounds__(PFH_THREADS, 1)
    cu_pfh_kernel(const __grid_constant__ cu_pfh_params p,
                  const __grid_constant__ CUtensorMap map_k,
                  const __grid_constant__ CUtensorMap map_v)
{
#ifdef CU_HAVE_WGMMA
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const int warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        const cu_pfh_smem_t sm = cu_pfh_smem_of(smem_raw, p.tt * p.W);
        for (int s = 0; s < PFH_STAGES; ++s) {
            cu_mbar_init(&sm.full_k[s], 1);
            cu_mbar_init(&sm.full_v[s], 1);
            cu_mbar_init(&sm.empty[s], PFH_EMPTY_ARRIVALS);
        }
        cu_mbar_init(sm.tail, 1);
        cu_mbar_fence_init();
    }
    if (warp == PFH_CONSUMER_WARPS && (threadIdx.x & 31) == 0) {
        cu_tma_prefetch_map(&map_k);
        cu_tma_prefetch_map(&map_v);
    }
    __syncthreads();
    cu_pdl_wait(); /* the selection's rows and the prologue's cache rows */
    cu_pdl_trigger();

    /* Each side computes its state after its register change: nothing is
     * live across it (ptxas would keep such values in local memory). */
    if (warp >= PFH_CONSUMER_WARPS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PFH_PRODUCER_REGS));
        if (warp != PFH_CONSUMER_WARPS)
            return;
        const cu_pfh_smem_t sm = cu_pfh_smem_of(smem_raw, p.tt * p.W);
        const int32_t per_tile = p.hkv * p.hchunks;
        const int64_t total = (int64_t)p.hdr->n_pf_tiles[CU_PFA_MAIN] * per_tile;
        cu_pfh_prod pr;
        pr.gs = 0;
        pr.tail_par = 0;
        pr.pend_s = -1;
        pr.pend_valid = 0;
        for (int64_t w = blockIdx.x; w < total; w += gridDim.x)
            cu_pfh_producer(p, sm, &map_k, &map_v, cu_pfh_item_of(p, w, per_tile), pr);
        cu_pfh_tail_finish(sm, pr);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(PFH_CONSUMER_REGS));
        const cu_pfh_smem_t sm = cu_pfh_smem_of(smem_raw, p.tt * p.W);
        const int32_t per_tile = p.hkv * p.hchunks;
        const int64_t total = (int64_t)p.hdr->n_pf_tiles[CU_PFA_MAIN] * per_tile;
        uint32_t gs = 0;
        const int wg = (int)(threadIdx.x >> 7);
        cu_pfh_turns_begin(wg);
        for (int64_t w = blockIdx.x; w < total; w += gridDim.x)
            cu_pfh_consumer<Tag>(p, sm, cu_pfh_item_of(p, w, per_tile), gs);
        cu_pfh_turns_end(wg);
    }
#else
    (void)p;
    (void)map_k;
    (void)map_v;
#endif
}

/* ---- host side ----------------------------------------------------------- */

int cu_pfh_fits(int32_t d, int32_t page, int32_t block, int32_t g, int32_t W, int sparse,
                const char **why)
{
    if (d != PFH_HEAD_DIM) {
        if (why)
            *why = "head dim != 128: mma.sync prefill kernel";
        return 0;
    }
    /* The dense stream walks pages whatever the block size; the sparse
     * one walks blocks, each of which must be one page. */
    if (page != PFH_KEYS || (sparse && block != PFH_KEYS)) {
        if (why)
            *why = sparse ? "page or block size != 128: mma.sync prefill kernel"
                          : "page size != 128: mma.sync prefill kernel";
        return 0;
    }
    if (cu_pfh_smem(cu_pfa_tile_tokens(g), W, sparse) > PFH_SMEM_LIMIT) {
        if (why)
            *why = "selection rows too wide for the Hopper prefill kernel: mma.sync prefill kernel";
        return 0;
    }
    return 1;
}

void cu_pfh_build(const cu_attn_params *A, cu_pfh_params *p)
{
    memset(p, 0, sizeof(*p));
    p->act = A->act_dtype;
    p->hq_total = A->q_heads;
    p->hkv = A->kv_heads;
    p->g = A->group;
    p->tt = cu_pfa_tile_tokens(A->group);
    p->nh = cu_pfa_head_chunk(A->group);
    p->hchunks = (A->group + p->nh - 1) / p->nh;
    p->sparse = A->sparse;
    p->W = A->topk_width;
    p->cap_pages = A->cap_pages;
    p->scale_log2 = A->scale * A->pf_k_mul * CU_LOG2E;
    p->v_mul = A->pf_v_mul;
    p->q = A->q;
    p->o = A->out;
    p->lse = A->lse;
    p->sel = A->selected;
    p->page_table = A->meta.page_table;
    p->kv_len = A->meta.kv_len;
    p->hdr = A->meta.hdr;
    p->tiles = A->meta.pf_tiles[CU_PFA_MAIN];
}

void cu_launch_attn_prefill_tma(const cu_pfh_params *p, const cu_plan_state *st,
                                const CUtensorMap *maps, cudaStream_t s)
{
    const size_t smem = cu_pfh_smem(p->tt, p->W, p->sparse);
    if (p->act == MSA_DTYPE_BF16)
        cu_launch(cu_pfh_kernel<cu_bf16_tag>, st->sz.num_sms, PFH_THREADS, smem, s, st->pdl, *p,
                  maps[0], maps[1]);
    else
        cu_launch(cu_pfh_kernel<cu_f16_tag>, st->sz.num_sms, PFH_THREADS, smem, s, st->pdl, *p,
                  maps[0], maps[1]);
}

cudaError_t cu_pfh_setup(void)
{
    return cu_allow_smem(PFH_SMEM_LIMIT, cu_pfh_kernel<cu_bf16_tag>, cu_pfh_kernel<cu_f16_tag>);
}
