/*
 * The Hopper sparse attention's producer warps (attention_decode_tma_sm90.cu): each streams
 * its units' tiles, K and V, into the ring by tensor-map copies; two take a
 * CTA's units in turns.
 */
#ifndef MSA_CUDA_KERNELS_ATTENTION_ATTENTION_DECODE_TMA_SM90_PRODUCER_CUH
#define MSA_CUDA_KERNELS_ATTENTION_ATTENTION_DECODE_TMA_SM90_PRODUCER_CUH

#include "cuda/kernels/attention/attention_decode_tma_sm90_layout.cuh"
#include "cuda/arch/launch.cuh"
#include "cuda/common/plane_rows.cuh"
#include "cuda/common/timeline.cuh"

#ifdef CU_HAVE_WGMMA

/* The producers' turns.  Producer j issues the CTA's units k with k % 2 ==
 * j: it reads its unit's item, stream, union ids and pages while the other
 * one issues, takes the turn (and the ring's slot count) before its first
 * slot, and passes both on after its unit's last slot.  A unit's boundary
 * then costs no dependent plan loads on the ring's path, and the wait for
 * a unit's tail tile (below) no longer holds up the next unit. */
typedef struct cu_attt_turn {
    int j;        /* which producer */
    bool pending; /* the turn is still to be taken */
} cu_attt_turn;

__device__ __forceinline__ void cu_attt_take_turn(const cu_attt_smem &sm, cu_attt_turn &tn,
                                                  uint32_t &ring_uses)
{
    if (!tn.pending)
        return;
    tn.pending = false;
    /* Immediate barrier ids: a register id makes ptxas reserve all 16. */
    if (tn.j)
        asm volatile("bar.sync 3, %0;\n" ::"n"(ATT_TMA_PRODUCERS * 32) : "memory");
    else
        asm volatile("bar.sync 2, %0;\n" ::"n"(ATT_TMA_PRODUCERS * 32) : "memory");
    ring_uses = *(volatile const uint32_t *)sm.handoff;
}

__device__ __forceinline__ void cu_attt_pass_turn(const cu_attt_smem &sm, int j, uint32_t ring_uses)
{
    if ((threadIdx.x & 31) == 0)
        *(volatile uint32_t *)sm.handoff = ring_uses;
    __syncwarp();
    /* The barrier orders the count's write before the taker's read (no
     * fence needed).  The passing producer waits for the taker too (a
     * rendezvous): with bar.arrive on this side the hand-over is ordered
     * as well, but racecheck reports the next write of the count against
     * the taker's read; the rendezvous cost nothing measurable
     * on the H200. */
    if (j)
        asm volatile("bar.sync 2, %0;\n" ::"n"(ATT_TMA_PRODUCERS * 32) : "memory");
    else
        asm volatile("bar.sync 3, %0;\n" ::"n"(ATT_TMA_PRODUCERS * 32) : "memory");
}

/* A unit's tail tile (rows past kv_len) lands on its producer's own
 * barrier; the producer zeroes those V rows and then hands the slot to the
 * consumers.  It is issued as the unit's last tile and finished after the
 * turn has passed on: a claim waits only for the slot ATT_TMA_STAGES before
 * it, so no later claim of the unit waits for the tail. */
typedef struct cu_attt_tail {
    int s;         /* its ring slot; -1: none pending */
    int32_t valid; /* rows of the tile before kv_len */
} cu_attt_tail;

template <int KF>
__device__ __forceinline__ void cu_attt_tail_finish(const cu_attt_smem &sm, cu_attt_tail &pend,
                                                    int j, uint32_t &tail_par)
{
    if (pend.s < 0)
        return;
    const int lane = threadIdx.x & 31;
    unsigned char *vd = sm.ring + pend.s * cu_attt_stage_bytes<KF>() + cu_attt_half_bytes<KF>();
    cu_mbar_wait(&sm.tail[j], tail_par);
    tail_par ^= 1u;
    if (KF == CU_PLANE_FP8) {
        /* Rows of 128 code bytes, each zeroed whole (zero codes widen to
         * zeros): 16-byte piece e is row e / 8, whatever the swizzle. */
        for (int e = pend.valid * 8 + lane; e < ATT_TMA_TILE * 8; e += 32)
            *(uint4 *)(vd + e * 16) = make_uint4(0u, 0u, 0u, 0u);
    } else if (KF == CU_PLANE_NVFP4) {
        /* Rows of 64 code bytes, and their scale rows: a stale NaN scale
         * would make even zero codes NaN. */
        for (int e = pend.valid * 4 + lane; e < ATT_TMA_TILE * 4; e += 32)
            *(uint4 *)(vd + e * 16) = make_uint4(0u, 0u, 0u, 0u);
        for (int r = pend.valid + lane; r < ATT_TMA_TILE; r += 32)
            *(uint2 *)(vd + ATT_NV_CODE_BYTES + r * 8) = make_uint2(0u, 0u);
    } else {
        for (int e = pend.valid * 16 + lane; e < ATT_TMA_TILE * 16; e += 32) {
            const int r = e >> 4, c = e & 15;
            *(uint4 *)(vd + cu_tswz(ATT_TMA_TILE, r, c)) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
    /* Seen by the products, and a later tensor copy into this slot must
     * land after these. */
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncwarp();
    if (lane == 0)
        cu_mbar_arrive(&sm.full[pend.s]);
    pend.s = -1;
}

/* Takes the next ring slot for the producer (waiting until the consumers
 * released its previous use) and publishes what it will hold. */
__device__ __forceinline__ int cu_attt_claim(const cu_attt_smem &sm, uint32_t &ring_uses,
                                             int32_t pos0, uint32_t bits)
{
    const int s = ring_uses % ATT_TMA_STAGES;
    const uint32_t par = (ring_uses / ATT_TMA_STAGES) & 1u;
    ++ring_uses;
    if ((threadIdx.x & 31) == 0) {
        if (ring_uses > ATT_TMA_STAGES)
            cu_mbar_wait(&sm.empty[s], par ^ 1u);
        const uint32_t ma = cu_smem_addr(sm.meta + s);
        cu_sts32(ma, (uint32_t)pos0);
        cu_sts32(ma + 4u, bits);
    }
    __syncwarp();
    return s;
}

/* Producer j's area of shared memory for its own unions (32-bit shared
 * addresses; cu_attt_union_words). */
typedef struct cu_attt_uarea {
    uint32_t bm;    /* bitmap: a word per block, its tokens' bits */
    uint32_t sum;   /* summary: a bit per bitmap word in use */
    uint32_t pages; /* the request's page-table row */
    uint32_t uid, masks;
    const uint32_t *list; /* the ids, then the masks, as a generic pointer (the stream's) */
} cu_attt_uarea;

__device__ __forceinline__ cu_attt_uarea cu_attt_uarea_of(const cu_attt_smem &sm, int32_t U, int j)
{
    cu_attt_uarea a;
    const uint32_t *base = sm.uarea + j * sm.uwords;
    a.list = base + cu_attt_union_list_off(U);
    a.bm = cu_smem_addr(base);
    a.sum = a.bm + 4u * (uint32_t)cu_attt_union_sum_off(U);
    a.pages = a.bm + 4u * (uint32_t)cu_attt_union_pages_off(U);
    a.uid = cu_smem_addr(a.list);
    a.masks = a.uid + 4u * CU_ATT_UNION_LIST;
    return a;
}

/* Producer j's bitmap and summary to zero (once, at the kernel's start;
 * each use leaves them zero again). */
__device__ __forceinline__ void cu_attt_union_clear(const cu_attn_params &params,
                                                    const cu_attt_smem &sm, int j)
{
    const cu_attt_uarea a = cu_attt_uarea_of(sm, params.attention_union_blocks, j);
    for (int32_t n = threadIdx.x & 31;
         n < params.attention_union_blocks + params.attention_union_blocks / 32; n += 32)
        cu_sts32(a.bm + 4u * (uint32_t)n, 0u);
    __syncwarp();
}

/* The request's page-table row (N pages) into producer j's area, before
 * the launch wait: plan data, so the page of each tile is a shared-memory
 * load on the way from the union to the first copy, not a trip to L2. */
__device__ __forceinline__ void cu_attt_stage_pages(const cu_attt_uarea &a, const int32_t *pt,
                                                    int32_t N)
{
    for (int32_t n0 = 0; n0 < N; n0 += 32 * 8) {
        int32_t v[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            const int32_t n = n0 + 32 * q + (threadIdx.x & 31);
            v[q] = n < N ? pt[n] : 0;
        }
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            const int32_t n = n0 + 32 * q + (threadIdx.x & 31);
            if (n < N)
                cu_sts32(a.pages + 4u * (uint32_t)n, (uint32_t)v[q]);
        }
    }
    __syncwarp();
}

/* The union of a request's selected blocks for one KV head, built by a
 * producer from the selection's rows (rows: its first token's row;
 * tok_stride: the distance between its tokens' rows; tot: ids in all;
 * written by the selection kernel, so read with .cg loads): each id sets
 * its token's bit in the bitmap of the request's N blocks and the word's
 * bit in the summary; the words the summary marks are then compacted into
 * ascending ids and membership masks (and left zero), 32 summary bits per
 * lane and round, placed by a warp scan.  The same union the selection
 * would build (cu_request_union), without the selection's completion
 * count and the dependent loads and stores on the way from the last row to
 * the first copy.  Returns its length. */
__device__ __forceinline__ int32_t cu_attt_union(const cu_attn_params &params,
                                                 const cu_attt_uarea &a, const int32_t *rows,
                                                 int64_t tok_stride, int32_t tot, int32_t N)
{
    const int lane = threadIdx.x & 31;
    for (int32_t e0 = 0; e0 < tot; e0 += 128) {
        int32_t id[4], tok[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int32_t e = e0 + 32 * q + lane;
            tok[q] = e / params.topk_width;
            id[q] = e < tot ? __ldcg(rows + tok[q] * tok_stride + (e - tok[q] * params.topk_width))
                            : -1;
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
            if (id[q] >= 0 && id[q] < N) {
                cu_reds_or32(a.bm + 4u * (uint32_t)id[q], 1u << tok[q]);
                cu_reds_or32(a.sum + 4u * (uint32_t)(id[q] >> 5), 1u << (id[q] & 31));
            }
    }
    __syncwarp();
    int32_t base = 0;
    for (int32_t g0 = 0; g0 < (N + 31) / 32; g0 += 32) {
        const int32_t g = g0 + lane; /* this lane's 32 blocks */
        uint32_t s = g < (N + 31) / 32 ? cu_lds32(a.sum + 4u * (uint32_t)g) : 0u;
        const int32_t mine = __popc(s);
        int32_t pos = mine; /* inclusive scan over the lanes */
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int32_t v = __shfl_up_sync(0xffffffffu, pos, o);
            if (lane >= o)
                pos += v;
        }
        const int32_t total = __shfl_sync(0xffffffffu, pos, 31);
        pos += base - mine;
        if (s)
            cu_sts32(a.sum + 4u * (uint32_t)g, 0u);
        while (s) {
            const int32_t n = g * 32 + __ffs(s) - 1;
            s &= s - 1u;
            const uint32_t m = cu_lds32(a.bm + 4u * (uint32_t)n);
            cu_sts32(a.bm + 4u * (uint32_t)n, 0u);
            if (pos < CU_ATT_UNION_LIST) {
                cu_sts32(a.uid + 4u * (uint32_t)pos, (uint32_t)n);
                cu_sts32(a.masks + 4u * (uint32_t)pos, m);
            }
            ++pos;
        }
        base += total;
    }
    __syncwarp();
    return min(base, (int32_t)CU_ATT_UNION_LIST);
}

/* What the producer needs to issue an item's tiles. */
typedef struct cu_attt_feed {
    cu_stream cs;       /* the item's split of its key stream; cs.uid NULL: blocks 0, 1, ... */
    const int32_t *pt;  /* the request's page-table row */
    int32_t head;       /* the unit's KV head */
    uint32_t mine;      /* the unit's tokens (request-local bits) */
    bool own;           /* cs.uid, cs.masks: the producer's own union (shared memory) */
    bool staged;        /* the pages are in area.pages, not only in pt */
    cu_attt_uarea area; /* the producer's shared memory for both */
    int tok0, ntok;
#ifdef MSA_TIMELINE
    bool first_of_cta;        /* the CTA's first unit (timeline marks) */
    uint32_t ring_uses_first; /* the slot count before its first tile's claim */
#endif
} cu_attt_feed;

/* Copies one tile (K and V, the 64 rows of the unit's KV head in `page`
 * from `slot` on) into slot s, completing on barrier bar: 16-bit rows as
 * two boxes each, fp8 codes as one, nvfp4 codes and group scales by plain
 * bulk copies from the page region (cu_nvfp4_row; 16-byte aligned, as
 * forward.cu checks). */
template <int KF>
__device__ __forceinline__ void cu_attt_copy(const cu_attn_params &params, const CUtensorMap *map_k,
                                             const CUtensorMap *map_v, const cu_attt_smem &sm,
                                             const cu_attt_feed &f, int s, int32_t page,
                                             int32_t slot, uint64_t *bar, uint32_t ring_uses)
{
    unsigned char *kd = sm.ring + s * cu_attt_stage_bytes<KF>();
    unsigned char *vd = kd + cu_attt_half_bytes<KF>();
    if ((threadIdx.x & 31) == 0 && KF == CU_PLANE_NVFP4) {
        const cu_qrow k = cu_nvfp4_row(cu_plane_row(params.k_strides, page, f.head, 0), slot,
                                       ATT_TMA_PAGE_ROWS, ATT_TMA_HEAD_DIM);
        const cu_qrow v = cu_nvfp4_row(cu_plane_row(params.v_strides, page, f.head, 0), slot,
                                       ATT_TMA_PAGE_ROWS, ATT_TMA_HEAD_DIM);
        const unsigned char *kp = (const unsigned char *)params.k_plane;
        const unsigned char *vp = (const unsigned char *)params.v_plane;
        cu_mbar_arrive_tx(bar, 2 * (ATT_NV_CODE_BYTES + ATT_NV_SCALE_BYTES));
        const uint64_t pol = cu_l2_evict_first();
        cu_bulk_load_hint(kd, kp + k.at, ATT_NV_CODE_BYTES, bar, pol);
        cu_bulk_load_hint(kd + ATT_NV_CODE_BYTES, kp + k.scales, ATT_NV_SCALE_BYTES, bar, pol);
        cu_bulk_load_hint(vd, vp + v.at, ATT_NV_CODE_BYTES, bar, pol);
        cu_bulk_load_hint(vd + ATT_NV_CODE_BYTES, vp + v.scales, ATT_NV_SCALE_BYTES, bar, pol);
    } else if ((threadIdx.x & 31) == 0) {
        cu_mbar_arrive_tx(bar, cu_attt_stage_bytes<KF>());
        /* A tile is read by one unit (two when q_len > 8, side by side):
         * its lines go first from L2, so the stream does not push out the
         * unions, the plan and the partial rows that the attention and the
         * merge read next.  On the H200 this took 1-8% off steps of 10K to
         * 200K context at batch 8-32. */
        const uint64_t pol = cu_l2_evict_first();
        cu_tma_load_rows_hint(kd, map_k, 0, slot, f.head, page, bar, pol);
        cu_tma_load_rows_hint(vd, map_v, 0, slot, f.head, page, bar, pol);
        if (KF == CU_PLANE_16) {
            cu_tma_load_rows_hint(kd + ATT_TMA_HALF_BYTES / 2, map_k, ATT_TMA_BOX_COLS, slot,
                                  f.head, page, bar, pol);
            cu_tma_load_rows_hint(vd + ATT_TMA_HALF_BYTES / 2, map_v, ATT_TMA_BOX_COLS, slot,
                                  f.head, page, bar, pol);
        }
#ifdef MSA_TIMELINE
        if (f.first_of_cta && ring_uses == f.ring_uses_first + 1u)
            CU_TL_MARK(params, CU_TL_ATTN, CU_TL_ISSUED);
#endif
    }
    (void)params;
    (void)f;
    (void)ring_uses;
}

/* Issues the tile that lane j of the window holds (its first key's
 * position, token bits and page) into the next ring slot, which it
 * returns.  A tail tile lands on producer pj's own barrier (its V rows
 * past kv_len are zeroed before the slot is handed over), any other on the
 * slot's full barrier. */
template <int KF>
__device__ __forceinline__ int cu_attt_issue_tile(const cu_attn_params &params,
                                                  const CUtensorMap *map_k,
                                                  const CUtensorMap *map_v, const cu_attt_smem &sm,
                                                  const cu_attt_feed &f, int j, int32_t pos0,
                                                  uint32_t bits, int32_t page, uint32_t &ring_uses,
                                                  bool tail, int pj)
{
    const int32_t p0 = __shfl_sync(0xffffffffu, pos0, j);
    const uint32_t b = __shfl_sync(0xffffffffu, bits, j);
    const int32_t pg = __shfl_sync(0xffffffffu, page, j);
    const int s = cu_attt_claim(sm, ring_uses, p0, b);
    cu_attt_copy<KF>(params, map_k, map_v, sm, f, s, pg, p0 & (ATT_TMA_PAGE_ROWS - 1),
                     tail ? &sm.tail[pj] : &sm.full[s], ring_uses);
    __syncwarp();
    return s;
}

/* Issues the unit's tiles t_lo .. t_hi - 1 of its stream (those a token of
 * the unit uses) into the ring, the tail tile (rows past kv_len) last and
 * left pending in pend.  The turn is taken before the first slot, after
 * the window's ids and pages have been read. */
template <int KF>
__device__ __forceinline__ void cu_attt_issue(const cu_attn_params &params,
                                              const CUtensorMap *map_k, const CUtensorMap *map_v,
                                              const cu_attt_smem &sm, const cu_attt_feed &f,
                                              int32_t t_lo, int32_t t_hi, uint32_t &ring_uses,
                                              cu_attt_turn &tn, cu_attt_tail &pend)
{
    const int lane = threadIdx.x & 31;
    const cu_stream &cs = f.cs;
    const int tok0 = f.tok0, ntok = f.ntok;
    for (int32_t c0 = t_lo; c0 < t_hi; c0 += 32) {
        const int32_t t = c0 + lane;
        int32_t pos0 = 0, page = 0;
        uint32_t bits = 0u;
        if (t < t_hi) {
            const int32_t bi = t >> 1; /* ATT_TMA_TILES_PER_PAGE tiles per union entry */
            int32_t id = bi;
            uint32_t member = 0xffffffffu; /* tokens whose rows chose the block */
            if (f.own) {
                id = (int32_t)cu_lds32(f.area.uid + 4u * (uint32_t)bi);
                member = cu_lds32(f.area.masks + 4u * (uint32_t)bi);
            } else if (cs.uid) {
                id = cs.uid[bi];
                member = cs.masks[bi];
            }
            pos0 = id * ATT_TMA_PAGE_ROWS + (t & 1) * ATT_TMA_TILE;
            bits = member & cu_causal_bits(pos0, cs.base, cs.ql) & f.mine;
            if (bits)
                page = f.staged ? (int32_t)cu_lds32(f.area.pages +
                                                    4u * (uint32_t)(pos0 >> ATT_TMA_LOG_PAGE_ROWS))
                                : f.pt[pos0 >> ATT_TMA_LOG_PAGE_ROWS];
        }
        /* At most one tile of a stream reaches past kv_len (the one holding
         * position kv_len - 1; a tile wholly past it has no token that
         * sees it), and it comes in the last window. */
        const bool tail = bits != 0u && pos0 + ATT_TMA_TILE > cs.kl;
        const uint32_t tail_lane = __ballot_sync(0xffffffffu, tail);
        /* Issue order: round robin over the unit's tokens, each turn the
         * next tile its token uses.  Most tiles serve one token, and only
         * that token's warp computes them; in id order a token's tiles come
         * in runs, and the other warps, the ring full, wait.  Interleaved,
         * the ring holds tiles of several tokens and their warps overlap.
         * (Online softmax may take a token's keys in any order.) */
        uint32_t todo = __ballot_sync(0xffffffffu, bits != 0u) & ~tail_lane;
        uint32_t tok_tiles = 0u; /* lane q: this window's tiles of token q */
        for (int q = 0; q < ntok; ++q) {
            const uint32_t b = __ballot_sync(0xffffffffu, (bits >> (tok0 + q)) & 1u);
            if (lane == q)
                tok_tiles = b;
        }
        if (todo | tail_lane)
            cu_attt_take_turn(sm, tn, ring_uses);
        int q = 0;
        while (todo) {
            uint32_t cand = 0u;
            for (int k = 0; k < ntok; ++k) {
                cand = __shfl_sync(0xffffffffu, tok_tiles, q) & todo;
                q = q + 1 == ntok ? 0 : q + 1;
                if (cand)
                    break;
            }
            const int j = __ffs(cand) - 1;
            todo &= ~(1u << j);
            cu_attt_issue_tile<KF>(params, map_k, map_v, sm, f, j, pos0, bits, page, ring_uses,
                                   false, tn.j);
        }
        if (tail_lane) {
            /* It lands on the producer's own barrier: its V rows past
             * kv_len become zeros (see the header) before a plain arrival
             * hands the slot over (cu_attt_tail_finish). */
            const int j = __ffs(tail_lane) - 1;
            pend.s = cu_attt_issue_tile<KF>(params, map_k, map_v, sm, f, j, pos0, bits, page,
                                            ring_uses, true, tn.j);
            pend.valid = cs.kl - __shfl_sync(0xffffffffu, pos0, j);
        }
    }
}

/* Producer j's part of a unit: its tiles, its end, the turn passed on
 * when the CTA has a next unit (`next`), then its pending tail tile.  The
 * turn is taken first unless the unit is the CTA's first (`first`).  Not
 * inlined: the producer's registers stay apart from the consumers'. */
template <int KF>
__device__ __noinline__ void cu_attt_producer(const cu_attn_params &params,
                                              const CUtensorMap *map_k, const CUtensorMap *map_v,
                                              const cu_attt_smem &sm, const cu_attt_unit &un,
                                              uint32_t &ring_uses, uint32_t &tail_par, int j,
                                              bool first, bool next)
{
    cu_attt_turn tn;
    tn.j = j;
    tn.pending = !first;
    cu_attt_tail pend;
    pend.s = -1;
    pend.valid = 0;
    const int lane = threadIdx.x & 31;
    const cu_att_item it = params.meta.att[CU_KIND_SPARSE][un.first];
    cu_attt_feed f;
    f.pt = params.meta.page_table + (int64_t)it.r * params.cap_pages;
    const int32_t pages = (it.kl + ATT_TMA_PAGE_ROWS - 1) >> ATT_TMA_LOG_PAGE_ROWS;
    /* A request that reaches at most K blocks selects all of them, whatever
     * the scores (SPEC 4): its union is blocks 0 .. N-1, known from the
     * plan.  Its tiles wholly before the step's first new position hold no
     * key this step writes, so they are issued before the launch wait and
     * stream while the indexer and the selection still run. */
    const int32_t nblk = pages; /* B == P == 128 on this path */
    const bool known = nblk <= params.topk_blocks;
    /* A request of more than K and at most att_union blocks: its pages are
     * staged in shared memory below, for the lookups after the wait, and, of
     * several tokens, its union is built here after the wait
     * (cu_att_builds_union: the selection asks the same).  (A known
     * request's tiles are mostly issued before the wait, looking their
     * pages up in L2.) */
    f.staged = !known && nblk <= params.attention_union_blocks;
    f.own = !known && cu_att_builds_union(params.attention_union_blocks, it.ql, nblk);
    /* Otherwise the request's page-table row into L2 while the selection
     * still runs (plan data): the page lookups after the wait then skip a
     * DRAM round trip between the union and the first copy. */
    if (!f.staged)
        for (int32_t i = lane * 32; i < pages; i += 32 * 32)
            cu_prefetch_l2(f.pt + i);
    f.head = it.group;
    f.tok0 = it.row0 / 16;
    f.ntok = un.ntok[0] + un.ntok[1];
    f.mine = cu_attt_item_bits(f.tok0, f.ntok);
#ifdef MSA_TIMELINE
    f.first_of_cta = un.first_of_cta;
    f.ring_uses_first = ring_uses;
#endif
    f.area = cu_attt_uarea_of(sm, params.attention_union_blocks, j);
    if (f.staged)
        cu_attt_stage_pages(f.area, f.pt, nblk);
    int32_t t_hi = 0; /* end of the tiles issued before the wait */
    /* One copy of the issue loop for both phases (code size). */
#pragma unroll 1
    for (int phase = 0; phase < 2; ++phase) {
        if (phase == 1) {
            cu_pdl_wait(); /* the union's count and ids (at once after the first unit) */
#ifdef MSA_TIMELINE
            if (lane == 0 && un.first_of_cta)
                CU_TL_MARK(params, CU_TL_ATTN, CU_TL_WAITED);
#endif
        }
        if (phase == 1 && f.own) {
            const int32_t cnt =
                cu_attt_union(params, f.area,
                              params.selected +
                                  ((int64_t)it.t0 * params.layer_kv_heads + it.group) *
                                      params.topk_width,
                              (int64_t)params.layer_kv_heads * params.topk_width,
                              it.ql * params.topk_width, nblk);
            /* The issue loop reads them by their shared addresses (f.own). */
            f.cs = cu_stream_of(params, it, false, (const int32_t *)f.area.list,
                                f.area.list + CU_ATT_UNION_LIST, cnt);
        } else if (phase == (known ? 0 : 1))
            f.cs = cu_stream_of(params, it, known);
        else if (phase == 0)
            continue; /* nothing known before the wait */
        int32_t t_lo = max(f.cs.u0 / ATT_TMA_TILE, t_hi);
        if (phase == 0) /* tiles wholly before the step's first new position */
            t_hi = max(t_lo, min(f.cs.base / ATT_TMA_TILE, f.cs.u1 / ATT_TMA_TILE));
        else
            t_hi = (f.cs.u1 + ATT_TMA_TILE - 1) / ATT_TMA_TILE;
        cu_attt_issue<KF>(params, map_k, map_v, sm, f, t_lo, t_hi, ring_uses, tn, pend);
    }
    /* End of the item. */
    cu_attt_take_turn(sm, tn, ring_uses); /* a stream without tiles */
    const int s = cu_attt_claim(sm, ring_uses, -1, 0u);
    if (lane == 0)
        cu_mbar_arrive(&sm.full[s]);
    __syncwarp();
    if (next)
        cu_attt_pass_turn(sm, j, ring_uses);
    cu_attt_tail_finish<KF>(sm, pend, j, tail_par);
}

#endif /* CU_HAVE_WGMMA */

#endif /* MSA_CUDA_KERNELS_ATTENTION_ATTENTION_DECODE_TMA_SM90_PRODUCER_CUH */
