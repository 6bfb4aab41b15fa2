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
 * Eight consumer warps share every tile without a CTA-wide barrier (a tile's
 * slot is handed back when all eight have signalled): each warp serves one
 * token, and when the unit has fewer than eight tokens several warps serve
 * the same token on different keys (16 or 32 keys of a tile each, or
 * alternate tiles) and are merged by LSE at the end.  A warp whose token did
 * not select a tile's block signals at once and moves on, so the work
 * follows the per-token selections, not the union.
 *
 * S = Q K^T and O += P V run on mma.sync m16n8k16 with fp32 accumulators,
 * Q in registers, P rounded to the 16-bit type for the second product (as
 * in the other tensor-core path).
 *
 * Rows past kv_len in a request's last page are stale cache contents: their
 * scores are masked, and the producer zeroes that tile's V rows before the
 * consumers see it, so a stale NaN cannot reach O through a zero weight.
 */
#include "cu_attn.cuh"
#include "cu_tma.cuh"
#include "cu_rows_state.cuh"
#include "cu_launch.cuh"

/* Five 32 KB stages: a deeper ring lets the warps of tokens that skip a
 * tile run further ahead of the one computing it. */
#define ATT_STAGES 5
#define ATT_CONSUMERS 8
#define ATT_THREADS ((ATT_CONSUMERS + 1) * 32)
#define ATT_TILE 64
#define ATT_HALF_BYTES (ATT_TILE * 256)          /* K or V of one tile */
#define ATT_STAGE_BYTES (2 * ATT_HALF_BYTES)
/* Partial state of a warp for the in-CTA merge: 16 x 128 O, then m, l.
 * Only warps beyond the first U (one per token) save theirs: 7 slots. */
#define ATT_SCR_FLOATS CU_ROWS_SLOT_FLOATS
#define ATT_SCR_SLOTS (ATT_CONSUMERS - 1)
#define ATT_SMEM_BYTES                                                                      \
    (1024 + ATT_STAGES * ATT_STAGE_BYTES + ATT_SCR_SLOTS * ATT_SCR_FLOATS * 4 +            \
     ATT_STAGES * 16 + (2 * ATT_STAGES + 1) * 8)

static_assert(ATT_SMEM_BYTES <= 227 * 1024, "attention ring and scratch exceed shared memory");

#define LOG2E 1.4426950408889634f

/* What the producer tells the consumers about a ring slot. */
typedef struct cu_attt_meta {
    int32_t pos0;   /* position of the tile's first key; -1: end of the item */
    uint32_t bits;  /* item tokens (request-local bit) that use any key of it */
    int32_t pad0, pad1;
} cu_attt_meta;

/* The tiles of this path: 64 rows in two swizzled 64-column boxes. */
struct cu_swz_tile {
    __device__ __forceinline__ uint32_t operator()(int row, int chunk) const
    {
        return cu_tswz(ATT_TILE, row, chunk);
    }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

typedef struct cu_attt_smem {
    unsigned char *ring;
    float *scr;
    cu_attt_meta *meta;
    uint64_t *full, *empty;
    uint64_t *tail;  /* the producer's own barrier for tiles it finishes itself */
} cu_attt_smem;

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
} cu_attt_unit;

__device__ __forceinline__ cu_attt_unit cu_attt_unit_of(const cu_layer &L, int32_t u)
{
    cu_attt_unit un;
    const cu_att_item *items = L.m.att[CU_KIND_SPARSE];
    un.first = L.m.att_units[u];
    const cu_att_item it = items[un.first];
    un.ntok[0] = (it.nrows + 15) / 16;
    un.ntok[1] = it.unit_len == 2 ? (items[un.first + 1].nrows + 15) / 16 : 0;
    return un;
}

/* Not inlined: the producer's registers stay apart from the consumers'. */
__device__ __noinline__ void cu_attt_producer(const cu_layer &L, const cu_attn &A,
                                              const CUtensorMap *mk, const CUtensorMap *mv,
                                              const cu_attt_smem &sm, const cu_attt_unit &un,
                                              uint32_t &gs, uint32_t &tail_par)
{
    const int lane = threadIdx.x & 31;
    const cu_att_item it = L.m.att[CU_KIND_SPARSE][un.first];
    const cu_stream cs = cu_stream_of(L, A, it);
    const int tok0 = it.row0 / 16, ntok = un.ntok[0] + un.ntok[1];
    const uint32_t mine = cu_attt_item_bits(tok0, ntok);
    const int32_t t_begin = cs.u0 / ATT_TILE;
    const int32_t t_end = (cs.u1 + ATT_TILE - 1) / ATT_TILE;
    const int64_t prow_base = (int64_t)it.group * L.P;
    const int32_t *pt = L.m.page_table + (int64_t)cs.r * L.cap_pages;
    for (int32_t c0 = t_begin; c0 < t_end; c0 += 32) {
        const int32_t t = c0 + lane;
        int32_t pos0 = 0, page = 0;
        uint32_t bits = 0u;
        if (t < t_end) {
            const int32_t bi = t >> 1; /* two tiles per 128-key union entry */
            pos0 = cs.uid[bi] * 128 + (t & 1) * ATT_TILE;
            bits = cs.umk[bi] & cu_causal_bits(pos0, cs.base, cs.ql) & mine;
            if (bits)
                page = pt[pos0 >> 7];
        }
        /* Issue order: round robin over the unit's tokens, each turn the
         * next tile its token uses.  Most tiles serve one token, and only
         * that token's warp computes them; in id order a token's tiles come
         * in runs, and the other warps, the ring full, wait.  Interleaved,
         * the ring holds tiles of several tokens and their warps overlap.
         * (Online softmax may take a token's keys in any order.) */
        uint32_t todo = __ballot_sync(0xffffffffu, bits != 0u);
        uint32_t tok_tiles = 0u; /* lane q: this window's tiles of token q */
        for (int q = 0; q < ntok; ++q) {
            const uint32_t b = __ballot_sync(0xffffffffu, (bits >> (tok0 + q)) & 1u);
            if (lane == q)
                tok_tiles = b;
        }
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
            unsigned char *kd = sm.ring + s * ATT_STAGE_BYTES;
            unsigned char *vd = kd + ATT_HALF_BYTES;
            const int32_t row = (int32_t)((int64_t)pg * A.hkv * L.P + prow_base + (p0 & 127));
            /* A tile with rows past kv_len completes on the producer's own
             * barrier: those V rows become zeros (see the header) before a
             * plain arrival hands the slot over; its release is what the
             * consumers acquire with their wait. */
            const bool tail = p0 + ATT_TILE > cs.kl;
            uint64_t *bar = tail ? sm.tail : &sm.full[s];
            if (lane == 0) {
                cu_mbar_arrive_tx(bar, ATT_STAGE_BYTES);
                cu_tma_load2d(kd, mk, 0, row, bar);
                cu_tma_load2d(kd + ATT_HALF_BYTES / 2, mk, 64, row, bar);
                cu_tma_load2d(vd, mv, 0, row, bar);
                cu_tma_load2d(vd + ATT_HALF_BYTES / 2, mv, 64, row, bar);
            }
            if (tail) {
                cu_mbar_wait(sm.tail, tail_par);
                tail_par ^= 1u;
                const int32_t valid = cs.kl - p0; /* rows of the tile before kv_len */
                for (int e = valid * 16 + lane; e < ATT_TILE * 16; e += 32) {
                    const int r = e >> 4, c = e & 15;
                    *(uint4 *)(vd + cu_tswz(ATT_TILE, r, c)) = make_uint4(0u, 0u, 0u, 0u);
                }
                /* A later tensor copy into this slot must land after these. */
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                __syncwarp();
                if (lane == 0)
                    cu_mbar_arrive(&sm.full[s]);
            }
            __syncwarp();
        }
    }
    /* End of the item. */
    const int s = cu_attt_claim(sm, gs, -1, 0u);
    if (lane == 0)
        cu_mbar_arrive(&sm.full[s]);
    __syncwarp();
}

/* One warp's share of one tile: keys [k0, k0 + KW) against its 16 rows. */
template <typename Tag, int KW>
__device__ __forceinline__ void cu_attt_tile(uint32_t ka, uint32_t va, int k0, int32_t pos0,
                                             int32_t last, const uint32_t (&qa)[8][4],
                                             float (&o)[16][4], float &m_lo, float &m_hi,
                                             float &l_lo, float &l_hi, float sl2)
{
    constexpr int NS = KW / 8;
    const int lane = threadIdx.x & 31;
    float sc[NS][4];
    cu_rows_qk<Tag, NS, cu_swz_tile>(ka, k0, qa, sc);
    /* Keys past the token's position (only in its own last block). */
    const bool whole = pos0 + k0 + KW - 1 <= last;
#pragma unroll
    for (int n = 0; n < NS; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const bool vis = whole || pos0 + k0 + n * 8 + 2 * (lane & 3) + e <= last;
            sc[n][e] = vis ? sc[n][e] * sl2 : -INFINITY;
            sc[n][2 + e] = vis ? sc[n][2 + e] * sl2 : -INFINITY;
        }
    }
    cu_rows_softmax<NS>(sc, o, m_lo, m_hi, l_lo, l_hi);
    cu_rows_pv<Tag, KW, cu_swz_tile>(va, k0, sc, o);
}

template <typename Tag>
__device__ void cu_attt_consumer(const cu_layer &L, const cu_attn &A, const cu_attt_smem &sm,
                                 const cu_attt_unit &un, uint32_t &gs)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int U = un.ntok[0] + un.ntok[1];          /* tokens of the unit */
    const int nsub = U == 1 ? 8 : U == 2 ? 4 : U <= 4 ? 2 : 1; /* warps per token */
    const int u = warp % U;
    const int j = warp / U;
    const bool active = j < nsub;
    /* The warp's token: item `half` of the unit, token ul of that item. */
    const int half = u >= un.ntok[0];
    const cu_att_item *itp = L.m.att[CU_KIND_SPARSE] + un.first + half;
    const cu_att_item it = *itp;
    const int ul = u - half * un.ntok[0];
    const int32_t tok = it.row0 / 16 + ul;          /* request-local token */
    const int32_t last = it.kl - it.ql + tok;       /* its position */
    const uint32_t tbit = 1u << tok;
    /* Key slice of this warp in a tile: 16 keys (nsub 4 or 8), 32 (nsub 2),
     * the whole tile (nsub 1); with nsub 8 the two halves of the warps take
     * alternate tiles. */
    const int kw = nsub == 1 ? 64 : nsub == 2 ? 32 : 16;
    const int k0 = (j & 3) * kw;
    const int parity_sel = nsub == 8 ? (j >> 2) : -1;

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
        const cu_attt_meta mt = sm.meta[s];
        if (mt.pos0 < 0) {
            __syncwarp();
            if (lane == 0)
                cu_mbar_arrive(&sm.empty[s]);
            break;
        }
        if (active && (mt.bits & tbit) && (parity_sel < 0 || (c & 1) == parity_sel)) {
            const uint32_t ka = cu_smem_addr(sm.ring + s * ATT_STAGE_BYTES);
            const uint32_t va = ka + ATT_HALF_BYTES;
            if (kw == 16)
                cu_attt_tile<Tag, 16>(ka, va, k0, mt.pos0, last, qa, o, m_lo, m_hi, l_lo, l_hi, sl2);
            else if (kw == 32)
                cu_attt_tile<Tag, 32>(ka, va, k0, mt.pos0, last, qa, o, m_lo, m_hi, l_lo, l_hi, sl2);
            else {
                /* The whole tile as two 32-key halves: a 64-key product would
                 * not fit the registers of this kernel's 9 warps. */
                cu_attt_tile<Tag, 32>(ka, va, 0, mt.pos0, last, qa, o, m_lo, m_hi, l_lo, l_hi, sl2);
                cu_attt_tile<Tag, 32>(ka, va, 32, mt.pos0, last, qa, o, m_lo, m_hi, l_lo, l_hi, sl2);
            }
        }
        __syncwarp();
        if (lane == 0)
            cu_mbar_arrive(&sm.empty[s]);
    }
    cu_rows_sum_quads(l_lo, l_hi);

    /* Merge the warps of one token into warp j == 0. */
    if (active && j > 0)
        cu_rows_save(sm.scr + (warp - U) * ATT_SCR_FLOATS, o, m_lo, m_hi, l_lo, l_hi);
    cu_named_sync(1, ATT_CONSUMERS * 32);
    if (active && j == 0) {
        for (int j2 = 1; j2 < nsub; ++j2)
            cu_rows_absorb(sm.scr + ((j2 - 1) * U + u) * ATT_SCR_FLOATS, o, m_lo, m_hi, l_lo, l_hi);
        cu_rows_write<Tag>(L, A, *itp, ul * 16 + (lane >> 2), q_lo, q_hi, true, true, o, m_lo, m_hi,
                           l_lo, l_hi);
    }
    cu_named_sync(1, ATT_CONSUMERS * 32); /* the scratch is reused by the next item */
}

#endif /* sm_90+ */

template <typename Tag>
__global__ void __launch_bounds__(ATT_THREADS, 1)
    cu_attn_tma_kernel(const __grid_constant__ cu_layer L, const __grid_constant__ cu_attn A,
                       const __grid_constant__ CUtensorMap map_k,
                       const __grid_constant__ CUtensorMap map_v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    cu_attt_smem sm;
    sm.ring = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    sm.scr = (float *)(sm.ring + ATT_STAGES * ATT_STAGE_BYTES);
    sm.meta = (cu_attt_meta *)(sm.scr + ATT_SCR_SLOTS * ATT_SCR_FLOATS);
    sm.full = (uint64_t *)(sm.meta + ATT_STAGES);
    sm.empty = sm.full + ATT_STAGES;
    sm.tail = sm.empty + ATT_STAGES;
    const int warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        for (int s = 0; s < ATT_STAGES; ++s) {
            cu_mbar_init(&sm.full[s], 1);
            cu_mbar_init(&sm.empty[s], ATT_CONSUMERS);
        }
        cu_mbar_init(sm.tail, 1);
        cu_mbar_fence_init();
        cu_tma_prefetch_map(&map_k);
        cu_tma_prefetch_map(&map_v);
    }
    __syncthreads();
    /* The selection wrote the unions; the prologue the cache rows. */
    cu_pdl_wait();
    cu_pdl_trigger();
    /* The sparse pass only (the units are built for it). */
    const int32_t n_units = L.m.hdr->n_att_units;
    uint32_t gs = 0, tail_par = 0;
    for (int32_t ui = blockIdx.x; ui < n_units; ui += gridDim.x) {
        const cu_attt_unit un = cu_attt_unit_of(L, ui);
        if (warp == ATT_CONSUMERS) {
            cu_attt_producer(L, A, &map_k, &map_v, sm, un, gs, tail_par);
        } else {
            cu_attt_consumer<Tag>(L, A, sm, un, gs);
        }
    }
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
