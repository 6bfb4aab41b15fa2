/*
 * Sparse decode attention, Hopper path: bf16/fp16 queries and KV planes of
 * the same type, D = 128, B = P = 128, G = 16 query heads per KV head (one
 * token's heads fill one m16 tile: a "unit").
 *
 * One CTA per SM walks the work units (up to eight tokens of one request and
 * KV head, one split of the union of the request's selected blocks: one or
 * two plan items of four tokens, see att_units).  A producer warp streams
 * the union's 64-key tiles that any of the unit's tokens uses, K and V,
 * through a ring of ATT_STAGES tensor-map copies; tiles no token of the unit
 * uses are never loaded, and the others are read once for all its tokens.
 * Two producer warps take the CTA's units in turns, each preparing its
 * next unit while the other issues.
 * Two consumer warpgroups share every tile without a CTA-wide barrier (a
 * tile's slot is handed back when all eight warps have signalled).  Of a
 * pair, each group serves one item (four tokens x 16 heads = the 64 rows of
 * its products); a single item is served by both groups on alternate
 * tiles, merged by LSE at the end.  A group whose tokens did not select a
 * tile's block signals at once and moves on.
 *
 * S = Q K^T and O += P V are warpgroup products (wgmma, sm_90a): Q in
 * registers, K and V read by the tensor cores from the ring slot (V
 * transposed), fp32 accumulators, P rounded to the 16-bit type for the
 * second product (as in the other tensor-core path).  The rows of a token
 * that does not use a tile get weight 0 from it.
 *
 * Rows past kv_len in a request's last page are stale cache contents: their
 * scores are masked, and the producer zeroes that tile's V rows before the
 * consumers see it, so a stale NaN cannot reach O through a zero weight.
 */
#include "cu_attn.cuh"
#include "cu_tma.cuh"
#include "cu_wgmma.cuh"
#include "cu_rows_state.cuh"
#include "cu_launch.cuh"
#include "cu_timeline.cuh"

/* Four 32 KB stages.  A deeper ring does not pay: on the H200, six stages
 * (as many as fit beside the merge scratch) were 0.2-5% slower than four
 * on twelve decode cases (batches of 8 to 128 requests), five 0.3-4% slower
 * (bench/RESULTS.md, v18), three about as fast as four; the stream is not
 * short of copies in flight.
 * (MSA_ATT_TMA_STAGES overrides it at build time, for measurements.) */
#ifndef MSA_ATT_TMA_STAGES
#define MSA_ATT_TMA_STAGES 4
#endif
#define ATT_STAGES MSA_ATT_TMA_STAGES
/* A unit's tail tile is finished after its end's slot is claimed
 * (cu_attt_tail_finish): that claim must not wait for the tail's slot. */
static_assert(ATT_STAGES >= 2, "the attention ring needs two stages");
#define ATT_CONSUMERS 8
/* Producer warps: two take the CTA's units in turns (see cu_attt_turn), so
 * that one prepares its unit while the other issues.  (MSA_ATT_PRODUCERS=1
 * keeps one, for measurements.) */
#ifndef MSA_ATT_PRODUCERS
#define MSA_ATT_PRODUCERS 2
#endif
#define ATT_PRODUCERS MSA_ATT_PRODUCERS
static_assert(ATT_PRODUCERS == 1 || ATT_PRODUCERS == 2, "one or two producer warps");
#define ATT_THREADS ((ATT_CONSUMERS + ATT_PRODUCERS) * 32)
#define ATT_TILE 64
#define ATT_HALF_BYTES (ATT_TILE * 256)          /* K or V of one tile */
#define ATT_STAGE_BYTES (2 * ATT_HALF_BYTES)
/* Partial state of a warp for the in-CTA merge: 16 x 128 O, then m, l.
 * Only the second group's warps save theirs (a single item): 4 slots. */
#define ATT_SCR_FLOATS CU_ROWS_SLOT_FLOATS
#define ATT_SCR_SLOTS 4
#define ATT_SMEM_BYTES                                                                      \
    (1024 + ATT_STAGES * ATT_STAGE_BYTES + ATT_SCR_SLOTS * ATT_SCR_FLOATS * 4 +            \
     ATT_STAGES * 16 + (2 * ATT_STAGES + ATT_PRODUCERS) * 8 + 16)

static_assert(ATT_SMEM_BYTES <= 227 * 1024, "attention ring and scratch exceed shared memory");

#define LOG2E 1.4426950408889634f

/* What the producer tells the consumers about a ring slot. */
typedef struct cu_attt_meta {
    int32_t pos0;   /* position of the tile's first key; -1: end of the item */
    uint32_t bits;  /* item tokens (request-local bit) that use any key of it */
    int32_t pad0, pad1;
} cu_attt_meta;

#ifdef CU_HAVE_WGMMA

typedef struct cu_attt_smem {
    unsigned char *ring;
    float *scr;
    cu_attt_meta *meta;
    uint64_t *full, *empty;
    uint64_t *tail;  /* a barrier per producer for the tiles it finishes itself */
    uint32_t *handoff; /* the ring's slot count, from one producer to the next */
} cu_attt_smem;

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

__device__ __forceinline__ void cu_attt_take_turn(const cu_attt_smem &sm, cu_attt_turn &tn, uint32_t &gs)
{
    if (ATT_PRODUCERS == 1 || !tn.pending)
        return;
    tn.pending = false;
    /* Immediate barrier ids: a register id makes ptxas reserve all 16. */
    if (tn.j)
        asm volatile("bar.sync 3, 64;\n" ::: "memory");
    else
        asm volatile("bar.sync 2, 64;\n" ::: "memory");
    gs = *(volatile const uint32_t *)sm.handoff;
}

__device__ __forceinline__ void cu_attt_pass_turn(const cu_attt_smem &sm, int j, uint32_t gs)
{
    if (ATT_PRODUCERS == 1)
        return;
    if ((threadIdx.x & 31) == 0)
        *(volatile uint32_t *)sm.handoff = gs;
    __threadfence_block();
    __syncwarp();
#if MSA_ATT_TURN_SYNC
    /* The passing producer waits for the taker too (a full rendezvous). */
    if (j)
        asm volatile("bar.sync 2, 64;\n" ::: "memory");
    else
        asm volatile("bar.sync 3, 64;\n" ::: "memory");
#else
    if (j)
        asm volatile("bar.arrive 2, 64;\n" ::: "memory");
    else
        asm volatile("bar.arrive 3, 64;\n" ::: "memory");
#endif
}

/* A unit's tail tile (rows past kv_len) lands on its producer's own
 * barrier; the producer zeroes those V rows and then hands the slot to the
 * consumers.  It is issued as the unit's last tile and finished after the
 * turn has passed on: a claim waits only for the slot ATT_STAGES before
 * it, so no later claim of the unit waits for the tail. */
typedef struct cu_attt_tail {
    int s;         /* its ring slot; -1: none pending */
    int32_t valid; /* rows of the tile before kv_len */
} cu_attt_tail;

__device__ __forceinline__ void cu_attt_tail_finish(const cu_attt_smem &sm, cu_attt_tail &pend, int j,
                                                    uint32_t &tail_par)
{
    if (pend.s < 0)
        return;
    const int lane = threadIdx.x & 31;
    unsigned char *vd = sm.ring + pend.s * ATT_STAGE_BYTES + ATT_HALF_BYTES;
    cu_mbar_wait(&sm.tail[j], tail_par);
    tail_par ^= 1u;
    for (int e = pend.valid * 16 + lane; e < ATT_TILE * 16; e += 32) {
        const int r = e >> 4, c = e & 15;
        *(uint4 *)(vd + cu_tswz(ATT_TILE, r, c)) = make_uint4(0u, 0u, 0u, 0u);
    }
    /* A later tensor copy into this slot must land after these. */
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncwarp();
    if (lane == 0)
        cu_mbar_arrive(&sm.full[pend.s]);
    pend.s = -1;
}

/* Tokens of an item: bits [tok0, tok0 + units). */
__device__ __forceinline__ uint32_t cu_attt_item_bits(int32_t tok0, int32_t units)
{
    const uint32_t m = units >= 32 ? 0xffffffffu : ((1u << units) - 1u);
    return m << tok0;
}

/* Takes the next ring slot for the producer (waiting until the consumers
 * released its previous use) and publishes what it will hold. */
__device__ __forceinline__ int cu_attt_claim(const cu_attt_smem &sm, uint32_t &gs, int32_t pos0,
                                             uint32_t bits)
{
    const int s = gs % ATT_STAGES;
    const uint32_t par = (gs / ATT_STAGES) & 1u;
    ++gs;
    if ((threadIdx.x & 31) == 0) {
        if (gs > ATT_STAGES)
            cu_mbar_wait(&sm.empty[s], par ^ 1u);
        sm.meta[s].pos0 = pos0;
        sm.meta[s].bits = bits;
    }
    __syncwarp();
    return s;
}

/* One unit: item `first` and, for a pair, the next one; their key stream
 * is the same, their tokens follow each other.  The items themselves are
 * read where needed (an L1 hit), not kept in registers through the loop. */
typedef struct cu_attt_unit {
    int32_t first;
    int32_t ntok[2]; /* tokens of each item (ntok[1] = 0: single item) */
#ifdef MSA_TIMELINE
    bool first_of_cta; /* the CTA's first unit (timeline marks) */
#endif
} cu_attt_unit;

__device__ __forceinline__ cu_attt_unit cu_attt_unit_of(const cu_layer &L, int32_t u)
{
    cu_attt_unit un;
    const cu_att_item *items = L.m.att[CU_KIND_SPARSE];
    un.first = L.m.att_units[u];
    const cu_att_item it = items[un.first];
    un.ntok[0] = (it.nrows + 15) / 16;
    un.ntok[1] = it.unit_len == 2 ? (items[un.first + 1].nrows + 15) / 16 : 0;
#ifdef MSA_TIMELINE
    un.first_of_cta = u == (int32_t)blockIdx.x;
#endif
    return un;
}

/* What the producer needs to issue an item's tiles. */
typedef struct cu_attt_feed {
    cu_stream cs;       /* the item's split of its key stream; cs.uid NULL: blocks 0, 1, ... */
    const int32_t *pt;  /* the request's page-table row */
    int64_t prow_base;  /* the KV head's first row in a page */
    uint32_t mine;      /* the unit's tokens (request-local bits) */
    int tok0, ntok;
#ifdef MSA_TIMELINE
    bool first_of_cta;  /* the CTA's first unit (timeline marks) */
#endif
} cu_attt_feed;

/* Copies one tile (K and V, 64 rows from page row `row` on) into slot s,
 * completing on barrier bar. */
__device__ __forceinline__ void cu_attt_copy(const cu_layer &L, const CUtensorMap *mk, const CUtensorMap *mv,
                                             const cu_attt_smem &sm, const cu_attt_feed &f, int s, int32_t row,
                                             uint64_t *bar, uint32_t gs)
{
    unsigned char *kd = sm.ring + s * ATT_STAGE_BYTES;
    unsigned char *vd = kd + ATT_HALF_BYTES;
    if ((threadIdx.x & 31) == 0) {
        cu_mbar_arrive_tx(bar, ATT_STAGE_BYTES);
        /* A tile is read by one unit (two when q_len > 8, side by side):
         * its lines go first from L2, so the stream does not push out the
         * unions, the plan and the partial rows that the attention and the
         * merge read next.  On the H200 this took 1-8% off steps of 10K to
         * 200K context at batch 8-32 (bench/RESULTS.md, v17). */
        const uint64_t pol = cu_l2_evict_first();
        cu_tma_load2d_hint(kd, mk, 0, row, bar, pol);
        cu_tma_load2d_hint(kd + ATT_HALF_BYTES / 2, mk, 64, row, bar, pol);
        cu_tma_load2d_hint(vd, mv, 0, row, bar, pol);
        cu_tma_load2d_hint(vd + ATT_HALF_BYTES / 2, mv, 64, row, bar, pol);
#ifdef MSA_TIMELINE
        if (f.first_of_cta && gs == 1)
            CU_TL_MARK(L, CU_TL_ATTN, CU_TL_ISSUED);
#endif
    }
    (void)L;
    (void)f;
    (void)gs;
}

/* Issues the unit's tiles t_lo .. t_hi - 1 of its stream (those a token of
 * the unit uses) into the ring, the tail tile (rows past kv_len) last and
 * left pending in pend.  The turn is taken before the first slot, after
 * the window's ids and pages have been read. */
__device__ __forceinline__ void cu_attt_issue(const cu_layer &L, const cu_attn &A, const CUtensorMap *mk,
                                              const CUtensorMap *mv, const cu_attt_smem &sm,
                                              const cu_attt_feed &f, int32_t t_lo, int32_t t_hi, uint32_t &gs,
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
            const int32_t bi = t >> 1; /* two tiles per 128-key union entry */
            pos0 = (cs.uid ? cs.uid[bi] : bi) * 128 + (t & 1) * ATT_TILE;
            bits = (cs.uid ? cs.umk[bi] : 0xffffffffu) & cu_causal_bits(pos0, cs.base, cs.ql) & f.mine;
            if (bits)
                page = f.pt[pos0 >> 7];
        }
        /* At most one tile of a stream reaches past kv_len (the one holding
         * position kv_len - 1; a tile wholly past it has no token that
         * sees it), and it comes in the last window. */
        const bool tail = bits != 0u && pos0 + ATT_TILE > cs.kl;
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
            cu_attt_take_turn(sm, tn, gs);
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
            const int32_t p0 = __shfl_sync(0xffffffffu, pos0, j);
            const uint32_t b = __shfl_sync(0xffffffffu, bits, j);
            const int32_t pg = __shfl_sync(0xffffffffu, page, j);
            const int s = cu_attt_claim(sm, gs, p0, b);
            const int32_t row = (int32_t)((int64_t)pg * A.hkv * L.P + f.prow_base + (p0 & 127));
            cu_attt_copy(L, mk, mv, sm, f, s, row, &sm.full[s], gs);
            __syncwarp();
        }
        if (tail_lane) {
            /* It lands on the producer's own barrier: its V rows past
             * kv_len become zeros (see the header) before a plain arrival
             * hands the slot over (cu_attt_tail_finish). */
            const int j = __ffs(tail_lane) - 1;
            const int32_t p0 = __shfl_sync(0xffffffffu, pos0, j);
            const uint32_t b = __shfl_sync(0xffffffffu, bits, j);
            const int32_t pg = __shfl_sync(0xffffffffu, page, j);
            const int s = cu_attt_claim(sm, gs, p0, b);
            const int32_t row = (int32_t)((int64_t)pg * A.hkv * L.P + f.prow_base + (p0 & 127));
            cu_attt_copy(L, mk, mv, sm, f, s, row, &sm.tail[tn.j], gs);
            pend.s = s;
            pend.valid = cs.kl - p0;
            __syncwarp();
        }
    }
}

/* Producer j's part of a unit: its tiles, its end, the turn passed on
 * when the CTA has a next unit (`next`), then its pending tail tile.  The
 * turn is taken first unless the unit is the CTA's first (`first`).  Not
 * inlined: the producer's registers stay apart from the consumers'. */
__device__ __noinline__ void cu_attt_producer(const cu_layer &L, const cu_attn &A,
                                              const CUtensorMap *mk, const CUtensorMap *mv,
                                              const cu_attt_smem &sm, const cu_attt_unit &un,
                                              uint32_t &gs, uint32_t &tail_par, int j, bool first,
                                              bool next)
{
    cu_attt_turn tn;
    tn.j = j;
    tn.pending = !first;
    cu_attt_tail pend;
    pend.s = -1;
    pend.valid = 0;
    const int lane = threadIdx.x & 31;
    const cu_att_item it = L.m.att[CU_KIND_SPARSE][un.first];
    cu_attt_feed f;
    /* The request's page-table row into L2 while the selection still runs
     * (plan data): the page lookups after the wait then skip a DRAM round
     * trip between the union and the first copy. */
    f.pt = L.m.page_table + (int64_t)it.r * L.cap_pages;
    const int32_t pages = (it.kl + 127) >> 7;
    for (int32_t i = lane * 32; i < pages; i += 32 * 32)
        cu_prefetch_l2(f.pt + i);
    f.prow_base = (int64_t)it.group * L.P;
    f.tok0 = it.row0 / 16;
    f.ntok = un.ntok[0] + un.ntok[1];
    f.mine = cu_attt_item_bits(f.tok0, f.ntok);
#ifdef MSA_TIMELINE
    f.first_of_cta = un.first_of_cta;
#endif
    /* A request that reaches at most K blocks selects all of them, whatever
     * the scores (SPEC 4): its union is blocks 0 .. N-1, known from the
     * plan.  Its tiles wholly before the step's first new position hold no
     * key this step writes, so they are issued before the launch wait and
     * stream while the indexer and the selection still run. */
    const int32_t nblk = pages; /* B == P == 128 on this path */
    const bool known = nblk <= L.K;
    int32_t t_hi = 0; /* end of the tiles issued before the wait */
    /* One copy of the issue loop for both phases (code size). */
#pragma unroll 1
    for (int phase = 0; phase < 2; ++phase) {
        if (phase == 1) {
            cu_pdl_wait(); /* the union's count and ids (at once after the first unit) */
#ifdef MSA_TIMELINE
            if (lane == 0 && un.first_of_cta)
                CU_TL_MARK(L, CU_TL_ATTN, CU_TL_WAITED);
#endif
        }
        if (phase == (known ? 0 : 1))
            f.cs = cu_stream_of(L, A, it, known);
        else if (phase == 0)
            continue; /* nothing known before the wait */
        int32_t t_lo = max(f.cs.u0 / ATT_TILE, t_hi);
        if (phase == 0) /* tiles wholly before the step's first new position */
            t_hi = max(t_lo, min(f.cs.base / ATT_TILE, f.cs.u1 / ATT_TILE));
        else
            t_hi = (f.cs.u1 + ATT_TILE - 1) / ATT_TILE;
        cu_attt_issue(L, A, mk, mv, sm, f, t_lo, t_hi, gs, tn, pend);
    }
    /* End of the item. */
    cu_attt_take_turn(sm, tn, gs); /* a stream without tiles */
    const int s = cu_attt_claim(sm, gs, -1, 0u);
    if (lane == 0)
        cu_mbar_arrive(&sm.full[s]);
    __syncwarp();
    if (next)
        cu_attt_pass_turn(sm, j, gs);
    cu_attt_tail_finish(sm, pend, j, tail_par);
}

/* S = Q K^T: the group's 64 query rows (registers) against the tile's 64
 * keys (K-major in the slot: dimensions 0-63 in the first box, 64-127 in
 * the second). */
template <typename Tag>
__device__ __forceinline__ void cu_attt_qk(uint32_t ka, const uint32_t (&qa)[8][4], float (&sc)[8][4])
{
    cu_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
        const uint32_t at = ka + (uint32_t)(ks >> 2) * (ATT_HALF_BYTES / 2) + (uint32_t)(ks & 3) * 32u;
        if (ks == 0)
            cu_wgmma_m64n64k16_first(sc, qa[ks], cu_wgmma_desc(at, 16), Tag());
        else
            cu_wgmma_m64n64k16(sc, qa[ks], cu_wgmma_desc(at, 16), 1, Tag());
    }
    cu_wgmma_commit();
    cu_wgmma_wait_all();
    cu_wgmma_hold(sc);
}

/* A member warp's rows take one tile: raw scores sc, keys k <= lim of the
 * tile visible (lim >= 63: all).  As cu_rows_softmax, with the scale sl2
 * (log2 units, > 0) applied inside the exponent: the max of the scaled
 * scores is the scaled max.  O keeps its scale while both rows' maxima
 * hold in every lane of the warp, as they do on most tiles once the max
 * has settled. */
__device__ __forceinline__ void cu_attt_softmax(float (&sc)[8][4], int32_t lim, float sl2, float (&o)[16][4],
                                                float &m_lo, float &m_hi, float &l_lo, float &l_hi)
{
    const int lane = threadIdx.x & 31;
    if (lim < ATT_TILE - 1) {
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const bool vis = n * 8 + 2 * (lane & 3) + e <= lim;
                sc[n][e] = vis ? sc[n][e] : -INFINITY;
                sc[n][2 + e] = vis ? sc[n][2 + e] : -INFINITY;
            }
        }
    }
    float mx_lo, mx_hi, ref_lo, ref_hi, corr_lo, corr_hi;
    cu_rows_tile_max<8>(sc, mx_lo, mx_hi);
    cu_rows_new_max(mx_lo * sl2, mx_hi * sl2, m_lo, m_hi, ref_lo, ref_hi, corr_lo, corr_hi);
    float ps_lo = 0.0f, ps_hi = 0.0f;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            sc[n][e] = exp2f(fmaf(sc[n][e], sl2, -ref_lo));
            sc[n][2 + e] = exp2f(fmaf(sc[n][2 + e], sl2, -ref_hi));
            ps_lo += sc[n][e];
            ps_hi += sc[n][2 + e];
        }
    }
    l_lo = l_lo * corr_lo + ps_lo;
    l_hi = l_hi * corr_hi + ps_hi;
    if (__any_sync(0xffffffffu, corr_lo != 1.0f || corr_hi != 1.0f))
        cu_rows_rescale(o, corr_lo, corr_hi);
}

/* O += P V: the weights (rounded to the 16-bit type, in the A-fragment
 * layout the S accumulators already have) against the tile's V, read
 * MN-major: 16 keys per step (2048 bytes), dimensions 64-127 one box
 * (ATT_HALF_BYTES / 2) after 0-63.  A warp whose token does not use the
 * tile gives weight 0 to every key (its rows of the product add zero). */
template <typename Tag>
__device__ __forceinline__ void cu_attt_pv(uint32_t va, const float (&p)[8][4], bool member, float (&o)[16][4])
{
    uint32_t pa[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        pa[kk][0] = member ? cu_pack2(p[2 * kk][0], p[2 * kk][1], Tag()) : 0u;
        pa[kk][1] = member ? cu_pack2(p[2 * kk][2], p[2 * kk][3], Tag()) : 0u;
        pa[kk][2] = member ? cu_pack2(p[2 * kk + 1][0], p[2 * kk + 1][1], Tag()) : 0u;
        pa[kk][3] = member ? cu_pack2(p[2 * kk + 1][2], p[2 * kk + 1][3], Tag()) : 0u;
    }
    cu_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
        cu_wgmma_m64n128k16<1>(o, pa[kk], cu_wgmma_desc(va + (uint32_t)kk * 2048u, ATT_HALF_BYTES / 2), 1,
                               Tag());
    cu_wgmma_commit();
    cu_wgmma_wait_all();
    cu_wgmma_hold(o);
}

/* One consumer warpgroup (h = 0 or 1) of a unit.  Warp w of the group
 * holds rows 16w .. 16w + 15 of its item: token w, its 16 heads.  Of a
 * pair, group h serves item h and takes every tile one of its tokens uses;
 * a single item is served by both groups, alternate tiles each, and merged
 * at the end.  A tile's product covers all four tokens of the group; the
 * warps of tokens that do not use it skip the softmax and give the product
 * weight 0, so their state does not change. */
template <typename Tag>
__device__ void cu_attt_consumer(const cu_layer &L, const cu_attn &A, const cu_attt_smem &sm,
                                 const cu_attt_unit &un, uint32_t &gs)
{
    const int lane = threadIdx.x & 31;
    const int w = (threadIdx.x >> 5) & 3;
    const int h = threadIdx.x >> 7;
    const bool pair = un.ntok[1] > 0;
    const int half = pair ? h : 0;
    const cu_att_item *itp = L.m.att[CU_KIND_SPARSE] + un.first + half;
    const cu_att_item it = *itp;
    const int ntok = un.ntok[half];
    const bool active = w < ntok;                    /* the warp's rows exist */
    const int32_t tok0 = it.row0 / 16;
    const int32_t tok = tok0 + w;                    /* request-local token */
    const int32_t last = it.kl - it.ql + tok;        /* its position */
    const uint32_t tbit = active ? 1u << tok : 0u;
    const uint32_t gbits = cu_attt_item_bits(tok0, ntok); /* the group's tokens */

    const int64_t q_lo = (int64_t)(it.t0 + tok) * A.hq_total + it.group * 16 + (lane >> 2);
    const int64_t q_hi = q_lo + 8;
    uint32_t qa[8][4];
    cu_rows_load_q(A.q, q_lo, q_hi, active, active, qa);
    float o[16][4], m_lo, m_hi, l_lo, l_hi;
    cu_rows_clear(o, m_lo, m_hi, l_lo, l_hi);
    const float sl2 = A.scale * LOG2E;

    for (int32_t c = 0;; ++c) {
        const int s = gs % ATT_STAGES;
        cu_mbar_wait(&sm.full[s], (gs / ATT_STAGES) & 1u);
        ++gs;
#ifdef MSA_TIMELINE
        if (c == 0 && threadIdx.x == 0 && un.first_of_cta)
            CU_TL_MARK(L, CU_TL_ATTN, CU_TL_FIRST);
        if (threadIdx.x == 0) /* overwritten by every tile: the last one stays */
            CU_TL_MARK(L, CU_TL_ATTN, CU_TL_LAST);
#endif
#if MSA_RING_META_LANE0
        /* Lane 0 alone reads what the slot holds (see cu_tma.cuh). */
        cu_attt_meta mt;
        {
            int32_t p = 0;
            uint32_t b = 0u;
            if (lane == 0) {
                p = sm.meta[s].pos0;
                b = sm.meta[s].bits;
            }
            mt.pos0 = __shfl_sync(0xffffffffu, p, 0);
            mt.bits = __shfl_sync(0xffffffffu, b, 0);
        }
#else
        const cu_attt_meta mt = sm.meta[s];
#endif
        if (mt.pos0 < 0) {
            __syncwarp();
            if (lane == 0)
                cu_mbar_arrive(&sm.empty[s]);
            break;
        }
        /* Group-uniform: whether this group computes the tile. */
        if ((mt.bits & gbits) && (pair || (c & 1) == h)) {
            const uint32_t ka = cu_smem_addr(sm.ring + s * ATT_STAGE_BYTES);
            const uint32_t va = ka + ATT_HALF_BYTES;
            float sc[8][4];
            cu_attt_qk<Tag>(ka, qa, sc);
            /* The warp's token uses the tile: its keys inside the causal
             * window count (rows past kv_len are beyond every window). */
            const bool member = (mt.bits & tbit) != 0u;
            if (member)
                cu_attt_softmax(sc, last - mt.pos0, sl2, o, m_lo, m_hi, l_lo, l_hi);
            cu_attt_pv<Tag>(va, sc, member, o);
        }
        __syncwarp();
        if (lane == 0)
            cu_mbar_arrive(&sm.empty[s]);
    }
    cu_rows_sum_quads(l_lo, l_hi);

    /* A single item: group 1's state joins group 0's, warp by warp. */
    if (!pair && h == 1 && active)
        cu_rows_save(sm.scr + w * ATT_SCR_FLOATS, o, m_lo, m_hi, l_lo, l_hi);
    cu_named_sync(1, ATT_CONSUMERS * 32);
    if (active && (pair || h == 0)) {
        if (!pair)
            cu_rows_absorb(sm.scr + w * ATT_SCR_FLOATS, o, m_lo, m_hi, l_lo, l_hi);
        cu_rows_write<Tag>(L, A, *itp, w * 16 + (lane >> 2), q_lo, q_hi, true, true, o, m_lo, m_hi,
                           l_lo, l_hi);
    }
    cu_named_sync(1, ATT_CONSUMERS * 32); /* the scratch is reused by the next unit */
}

#endif /* CU_HAVE_WGMMA */

template <typename Tag>
__global__ void __launch_bounds__(ATT_THREADS, 1)
    cu_attn_tma_kernel(const __grid_constant__ cu_layer L, const __grid_constant__ cu_attn A,
                       const __grid_constant__ CUtensorMap map_k,
                       const __grid_constant__ CUtensorMap map_v)
{
#ifdef CU_HAVE_WGMMA
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    cu_attt_smem sm;
    sm.ring = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    sm.scr = (float *)(sm.ring + ATT_STAGES * ATT_STAGE_BYTES);
    sm.meta = (cu_attt_meta *)(sm.scr + ATT_SCR_SLOTS * ATT_SCR_FLOATS);
    sm.full = (uint64_t *)(sm.meta + ATT_STAGES);
    sm.empty = sm.full + ATT_STAGES;
    sm.tail = sm.empty + ATT_STAGES;
    sm.handoff = (uint32_t *)(sm.tail + ATT_PRODUCERS);
    const int warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        CU_TL_MARK(L, CU_TL_ATTN, CU_TL_ENTRY);
        for (int s = 0; s < ATT_STAGES; ++s) {
            cu_mbar_init(&sm.full[s], 1);
            cu_mbar_init(&sm.empty[s], ATT_CONSUMERS);
        }
        for (int j = 0; j < ATT_PRODUCERS; ++j)
            cu_mbar_init(&sm.tail[j], 1);
        cu_mbar_fence_init();
        cu_tma_prefetch_map(&map_k);
        cu_tma_prefetch_map(&map_v);
    }
    __syncthreads();
    /* The selection writes the unions, the prologue the cache rows: the
     * producer waits for them before it reads a union; the consumers read
     * only the plan, the queries and the ring. */
    cu_pdl_trigger();
    /* The sparse pass only (the units are built for it). */
    const int32_t n_units = L.m.hdr->n_att_units;
    uint32_t gs = 0, tail_par = 0;
    int k = 0; /* the unit's place among the CTA's units */
    for (int32_t ui = blockIdx.x; ui < n_units; ui += gridDim.x, ++k) {
        const cu_attt_unit un = cu_attt_unit_of(L, ui);
        if (warp >= ATT_CONSUMERS) {
            const int j = warp - ATT_CONSUMERS;
            if (k % ATT_PRODUCERS == j)
                cu_attt_producer(L, A, &map_k, &map_v, sm, un, gs, tail_par, j, k == 0,
                                 ui + (int32_t)gridDim.x < n_units);
        } else {
            cu_attt_consumer<Tag>(L, A, sm, un, gs);
        }
    }
    cu_pdl_wait(); /* every CTA, before it ends (cu_launch.cuh) */
    if (threadIdx.x == 0)
        CU_TL_MARK(L, CU_TL_ATTN, CU_TL_EXIT);
#else
    (void)L;
    (void)A;
    (void)map_k;
    (void)map_v;
#endif
}

void cu_launch_attn_tma(const cu_layer *L, const cu_plan_state *st, const cu_attn *A,
                        const CUtensorMap *map_k, const CUtensorMap *map_v, cudaStream_t s)
{
    if (A->act == MSA_DTYPE_BF16)
        cu_launch(cu_attn_tma_kernel<cu_bf16_tag>, st->num_sms, ATT_THREADS, ATT_SMEM_BYTES, s,
                  st->pdl, *L, *A, *map_k, *map_v);
    else
        cu_launch(cu_attn_tma_kernel<cu_f16_tag>, st->num_sms, ATT_THREADS, ATT_SMEM_BYTES, s,
                  st->pdl, *L, *A, *map_k, *map_v);
}

cudaError_t cu_attn_tma_setup(void)
{
    return cu_allow_smem(ATT_SMEM_BYTES, cu_attn_tma_kernel<cu_bf16_tag>,
                         cu_attn_tma_kernel<cu_f16_tag>);
}
