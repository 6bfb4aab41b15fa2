/*
 * Key-block-major prefill attention on Hopper: see the header for the five
 * kernels of a chunk and docs/PREFILL.md for the design.
 *
 * The attend kernel: one CTA per SM claims the chunk's work items (one key
 * block of one KV head and up to CU_PFK_ITEM_TOKENS tokens that selected
 * it) one at a time.  Thirteen working warps:
 *   warp 12     the producer: claims an item, copies its K and V page into a ring
 *               slot (four tensor-map boxes each) and publishes the item;
 *               once the V copy has landed, it zeroes the rows after the
 *               last key any of the item's tokens may see (stale rows past
 *               kv_len would otherwise reach O as 0 x NaN) and releases V;
 *   warps 0-11  three consumer warpgroups take the CTA's token tiles in
 *               turn, across item boundaries (a tile is 64 rows: 64 / g
 *               tokens x g heads).  Per tile: its Q rows copied by tensor map (one
 *               tile ahead, issued by one thread of the group) into one of
 *               the group's two tile buffers, S = Q K^T (wgmma, both
 *               operands in shared memory), the causal mask (keys after
 *               the token's position, in its own block only), one softmax
 *               over the block's 128 keys, O = P V (wgmma, P from
 *               registers), and the normalized partial rows (staged in the
 *               tile buffer by stmatrix, sent out by tensor-map stores)
 *               and their LSE to the workspace.
 * The copies and stores take one thread's few instructions per token: the
 * warps' issue slots go to the products and the softmax (with per-thread
 * copies and stores, the address arithmetic took half the instructions).
 * Each partial row is written by exactly one tile, so the outputs do not
 * depend on the order in which the count kernel's atomics placed the
 * entries in their lists.
 */
#include "cuda/kernels/attention/attention_prefill_kbm_sm90.cuh"
#include "cuda/kernels/attention/prefill_tile_sm90.cuh"
#include "cuda/arch/launch.cuh"
#include "cuda/arch/smem.cuh"
#include "cuda/plan.cuh"

#include <string.h>

/* Three consumer groups: a tile is a chain (Q landed, S, softmax, O,
 * staged rows) that keeps one group's tensor-core share idle between its
 * products, so a third group overlaps what two leave bare. */
#define PFK_CONSUMER_WARPS 12
#define PFK_THREADS ((PFK_CONSUMER_WARPS + 4) * 32)
#define PFK_PRODUCER_REGS 32
#define PFK_CONSUMER_REGS 160
static_assert(4 * 32 * PFK_PRODUCER_REGS + PFK_CONSUMER_WARPS * 32 * PFK_CONSUMER_REGS <=
                  CU_LAUNCH_REGS(PFK_THREADS) * PFK_THREADS,
              "the CTA's registers hold the producer and the consumers");
#define PFK_GROUPS (PFK_CONSUMER_WARPS / 4)
#define PFK_GROUP_THREADS 128
/* Two stages of K and V (64 KB): an item's products take far longer than
 * the next item's copy. */
#define PFK_STAGES 2
#define PFK_STAGE_BYTES (2 * PFH_TILE_BYTES)
#define PFK_RING_BYTES (PFK_STAGES * PFK_STAGE_BYTES)
/* Per consumer group, two tile buffers of 64 rows x 256 bytes: a tile's
 * Q rows (copied in while the tile before is computed, two 8 KB column
 * halves in the 128-byte swizzle, the A operand of S = Q K^T), then its
 * output rows on their way to global memory. */
#define PFK_TILE_BYTES (PFH_GROUP_ROWS * PFH_ROW_BYTES)
#define PFK_QBUF_BYTES (PFK_GROUPS * 2 * PFK_TILE_BYTES)
/* Barriers per stage: K landed, V landed, V ready (stale rows zeroed),
 * empty; per tile buffer: its Q rows landed; then one meta word per stage
 * and the item's entries per stage. */
#define PFK_BAR_BYTES ((4 * PFK_STAGES + 2 * PFK_GROUPS) * 8)
#define PFK_ENT_BYTES (PFK_STAGES * CU_PFK_ITEM_TOKENS * (int)sizeof(int2))
#define PFK_SMEM \
    (1024 + PFK_RING_BYTES + PFK_QBUF_BYTES + PFK_BAR_BYTES + PFK_STAGES * 16 + PFK_ENT_BYTES)
static_assert(PFK_SMEM <= 227 * 1024, "the ring fits in shared memory");
#define PFK_EMPTY_ARRIVALS (PFK_CONSUMER_WARPS * 32)
static_assert(CU_PFK_ITEM_TOKENS <= 64, "the producer reads an item's entries two per lane");
static_assert((1 << CU_PFK_ENT_KEY_BITS) == PFH_KEYS, "an entry names any key of its block");
/* An entry costs at least g x 260 bytes (g >= 8) of partial row and LSE,
 * so a chunk's entries stay below the 2^24 rows an entry can name. */
static_assert(CU_PFK_CHUNK_BUDGET / (8 * (PFH_HEAD_DIM * 2 + 4)) < ((size_t)1 << 24),
              "an entry's packed partial row fits in 24 bits");

/* Grids of the small kernels: enough CTAs to fill the device, each
 * walking its share of the chunk. */
#define PFK_LIST_THREADS 256
#define PFK_SCAN_THREADS 1024

/* ---- lists: count, scan, scatter ----------------------------------------- */

/* Prefill tokens of chunk p.chunk (0 when the step has none there). */
__device__ __forceinline__ int32_t cu_pfk_chunk_len(const cu_pfk_params &p)
{
    const int32_t rest = p.hdr->n_pf - p.chunk * p.chunk_tokens;
    return rest <= 0 ? 0 : min(rest, p.chunk_tokens);
}

/* Entry e of the chunk (local token x KV head x selection slot): its token
 * row, KV head and selected block (-1: padding). */
__device__ __forceinline__ int32_t cu_pfk_entry(const cu_pfk_params &p, int32_t e, int32_t &t,
                                                int32_t &g)
{
    const int32_t per_tok = p.hkv * p.W;
    const int32_t tl = e / per_tok, rest = e - tl * per_tok;
    t = p.pf_tok[(int64_t)p.chunk * p.chunk_tokens + tl];
    g = rest / p.W;
    return p.sel[(int64_t)t * per_tok + rest];
}

__global__ void __launch_bounds__(PFK_LIST_THREADS)
    cu_pfk_count(const __grid_constant__ cu_pfk_params p)
{
    cu_pdl_wait(); /* the selection's rows */
    cu_pdl_trigger();
    const int32_t n = cu_pfk_chunk_len(p) * p.hkv * p.W;
    for (int32_t e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        int32_t t, g;
        const int32_t b = cu_pfk_entry(p, e, t, g);
        int32_t place = -1;
        if (b >= 0) {
            const int32_t r = p.tok_info[t].r;
            const int32_t blk = p.pf_blk0[r] + b;
            place = atomicAdd(&p.ws.cnt[(int64_t)g * p.blocks_cap + blk], 1);
            /* The list's first entry notes the block's page: one store a
             * list rather than hundreds to the same word. */
            if (place == 0)
                p.ws.blk_page[blk] = p.page_table[(int64_t)r * p.cap_pages + b];
        }
        p.ws.epos[e] = place;
        /* The row's count of valid blocks (its ids come first, then -1
         * padding), for both merges: from the entry of its last valid
         * block, or from its first entry when it has none. */
        const int32_t j = e % p.W;
        const bool ends =
            b >= 0 ? j == p.W - 1 || p.sel[(int64_t)t * p.hkv * p.W + g * p.W + j + 1] < 0 : j == 0;
        if (ends)
            p.ws.nval[e / p.W] = b >= 0 ? j + 1 : 0;
    }
}

/* Exclusive prefix sums of a and b over the CTA (PFK_SCAN_THREADS
 * threads); their totals in ta and tb. */
__device__ __forceinline__ void cu_pfk_block_scan(int32_t &a, int32_t &b, int32_t &ta, int32_t &tb)
{
    __shared__ int32_t wa[PFK_SCAN_THREADS / 32], wb[PFK_SCAN_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int32_t ia = a, ib = b;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int32_t ya = __shfl_up_sync(0xffffffffu, ia, o);
        const int32_t yb = __shfl_up_sync(0xffffffffu, ib, o);
        if (lane >= o) {
            ia += ya;
            ib += yb;
        }
    }
    if (lane == 31) {
        wa[warp] = ia;
        wb[warp] = ib;
    }
    __syncthreads();
    if (warp == 0) {
        int32_t xa = wa[lane], xb = wb[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int32_t ya = __shfl_up_sync(0xffffffffu, xa, o);
            const int32_t yb = __shfl_up_sync(0xffffffffu, xb, o);
            if (lane >= o) {
                xa += ya;
                xb += yb;
            }
        }
        wa[lane] = xa;
        wb[lane] = xb;
    }
    __syncthreads();
    const int32_t pa = warp > 0 ? wa[warp - 1] : 0, pb = warp > 0 ? wb[warp - 1] : 0;
    ta = wa[PFK_SCAN_THREADS / 32 - 1];
    tb = wb[PFK_SCAN_THREADS / 32 - 1];
    a = pa + ia - a;
    b = pb + ib - b;
    __syncthreads(); /* wa, wb are read before the next scan writes them */
}

/* The lists' offsets and their work items.  Whole items (of
 * CU_PFK_ITEM_TOKENS tokens) come first, every list's shorter last item
 * after them all: the attend CTAs claim items in this order, so the last
 * claims are the short ones and the CTAs end close together. */
__global__ void __launch_bounds__(PFK_SCAN_THREADS)
    cu_pfk_scan(const __grid_constant__ cu_pfk_params p)
{
    cu_pdl_wait(); /* the counts */
    cu_pdl_trigger();
    const int32_t nblk = cu_pfk_chunk_len(p) > 0 ? p.hdr->n_pf_blocks : 0;
    const int32_t lists = p.hkv * nblk;
    const int32_t it_tok = CU_PFK_ITEM_TOKENS;
    /* Pass 1: entry offsets and the whole items. */
    int32_t ent_base = 0, whole_base = 0;
    for (int32_t i0 = 0; i0 < lists; i0 += PFK_SCAN_THREADS) {
        const int32_t i = i0 + (int32_t)threadIdx.x;
        const int32_t g = i / max(nblk, 1), blk = i - g * nblk;
        const int64_t L = (int64_t)g * p.blocks_cap + blk;
        const int32_t c = i < lists ? p.ws.cnt[L] : 0;
        const int32_t nw = c / it_tok;
        int32_t ec = c, ei = nw, tc, ti;
        cu_pfk_block_scan(ec, ei, tc, ti);
        if (i < lists) {
            ec += ent_base;
            ei += whole_base;
            p.ws.off[L] = ec;
            const int32_t page = c > 0 ? p.ws.blk_page[blk] : 0;
            for (int32_t k = 0; k < nw; ++k)
                p.ws.items[ei + k] = make_int4(g, page, ec + k * it_tok, it_tok);
        }
        ent_base += tc;
        whole_base += ti;
    }
    /* Pass 2: each list's remainder, after every whole item. */
    int32_t part_base = whole_base;
    for (int32_t i0 = 0; i0 < lists; i0 += PFK_SCAN_THREADS) {
        const int32_t i = i0 + (int32_t)threadIdx.x;
        const int32_t g = i / max(nblk, 1), blk = i - g * nblk;
        const int64_t L = (int64_t)g * p.blocks_cap + blk;
        const int32_t c = i < lists ? p.ws.cnt[L] : 0;
        const int32_t rest = c % it_tok;
        int32_t np = rest > 0 ? 1 : 0, unused = 0, tp, tu;
        cu_pfk_block_scan(np, unused, tp, tu);
        if (i < lists) {
            if (rest > 0)
                p.ws.items[part_base + np] =
                    make_int4(g, p.ws.blk_page[blk], p.ws.off[L] + c - rest, rest);
            p.ws.cnt[L] = 0; /* for the next chunk */
        }
        part_base += tp;
    }
    if (threadIdx.x == 0) {
        p.ws.n_items[0] = part_base;
        p.ws.n_items[1] = 0; /* the attend CTAs' claim counter */
    }
}

__global__ void __launch_bounds__(PFK_LIST_THREADS)
    cu_pfk_scatter(const __grid_constant__ cu_pfk_params p)
{
    cu_pdl_wait(); /* the offsets */
    cu_pdl_trigger();
    const int32_t n = cu_pfk_chunk_len(p) * p.hkv * p.W;
    for (int32_t e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        const int32_t place = p.ws.epos[e];
        if (place < 0)
            continue;
        int32_t t, g;
        const int32_t b = cu_pfk_entry(p, e, t, g);
        const cu_tok_info ti = p.tok_info[t];
        const int32_t blk = p.pf_blk0[ti.r] + b;
        const int32_t at = p.ws.off[(int64_t)g * p.blocks_cap + blk] + place;
        p.ws.ent[at] = cu_pfk_ent_make(e, ti.pos - b * PFH_KEYS, t);
    }
}

/* ---- attend ------------------------------------------------------------------ */

typedef struct cu_pfk_smem_t {
    unsigned char *ring;
    unsigned char *qbuf; /* [PFK_GROUPS][2][PFK_TILE_BYTES] */
    uint64_t *full_k, *full_v, *v_ready, *empty;
    uint64_t *qfull; /* [PFK_GROUPS][2]: a tile buffer's Q rows landed */
    int4 *meta;      /* per slot: first entry, tokens, KV head */
    int2 *ent;       /* [PFK_STAGES][CU_PFK_ITEM_TOKENS] per slot: the item's entries */
} cu_pfk_smem_t;

__device__ __forceinline__ cu_pfk_smem_t cu_pfk_smem_of(unsigned char *raw)
{
    cu_pfk_smem_t sm;
    sm.ring = (unsigned char *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
    sm.qbuf = sm.ring + PFK_RING_BYTES;
    sm.full_k = (uint64_t *)(sm.qbuf + PFK_QBUF_BYTES);
    sm.full_v = sm.full_k + PFK_STAGES;
    sm.v_ready = sm.full_v + PFK_STAGES;
    sm.empty = sm.v_ready + PFK_STAGES;
    sm.qfull = sm.empty + PFK_STAGES;
    sm.meta = (int4 *)(sm.qfull + 2 * PFK_GROUPS);
    sm.ent = (int2 *)(sm.meta + PFK_STAGES);
    return sm;
}

#ifdef CU_HAVE_WGMMA

/* A claimed slot whose V is not yet released: its use's parity and the
 * last key any of its tokens sees (rows after it are zeroed). */
typedef struct cu_pfk_pending {
    int s;
    uint32_t par;
    int32_t last_key;
} cu_pfk_pending;

/* Waits for the slot's V copy, zeroes the rows after last_key (none when
 * it is the block's last key) and releases V to the consumers. */
__device__ __forceinline__ void cu_pfk_release_v(const cu_pfk_smem_t &sm, const cu_pfk_pending &pd)
{
    const int lane = threadIdx.x & 31;
    cu_mbar_wait(&sm.full_v[pd.s], pd.par);
    if (pd.last_key < PFH_KEYS - 1) {
        unsigned char *vd = sm.ring + pd.s * PFK_STAGE_BYTES + PFH_TILE_BYTES;
        /* Whole rows: swizzling moves 16-byte chunks within a row only. */
        for (int32_t e = (pd.last_key + 1) * 16 + lane; e < PFH_KEYS * 16; e += 32) {
            const int32_t r = e >> 4, c = e & 15;
            *(uint4 *)(vd + (c >> 3) * (PFH_TILE_BYTES / 2) + r * PFH_BOX_ROW_BYTES +
                       (c & 7) * 16) = make_uint4(0u, 0u, 0u, 0u);
        }
        /* Seen by the products (async proxy). */
        cu_fence_proxy_async();
    }
    /* Every lane releases its own writes (the barrier counts 32). */
    cu_mbar_arrive(&sm.v_ready[pd.s]);
}

/* The producer claims the chunk's items one at a time from the shared
 * counter (whole items first, the scan's order), so a CTA that drew short
 * items takes more of them and the CTAs end close together; with a fixed
 * stride the kernel waited for the CTAs that had drawn the most tiles.
 * After the last item it publishes one slot marked "end" (meta.w = 1),
 * which the consumers stop at without handing it back. */
__device__ void cu_pfk_producer(const cu_pfk_params &p, const cu_pfk_smem_t &sm,
                                const CUtensorMap *map_k, const CUtensorMap *map_v, int32_t n_items)
{
    const int lane = threadIdx.x & 31;
    cu_pfk_pending pd = {-1, 0u, 0};
    for (uint32_t gs = 0;; ++gs) {
        int32_t w = 0;
        if (lane == 0)
            w = n_items > 0 ? atomicAdd(&p.ws.n_items[1], 1) : 0;
        w = __shfl_sync(0xffffffffu, w, 0);
        const bool end = w >= n_items;
        const int4 it = end ? make_int4(0, 0, 0, 0) : p.ws.items[w];
        const int s = (int)(gs % PFK_STAGES);
        const uint32_t par = (gs / PFK_STAGES) & 1u;
        /* The item's entries, loaded before the slot is claimed. */
        const bool h0 = lane < it.w, h1 = lane + 32 < it.w;
        const int2 none = make_int2(0, 0);
        const int2 e0 = h0 ? p.ws.ent[it.z + lane] : none;
        const int2 e1 = h1 ? p.ws.ent[it.z + lane + 32] : none;
        if (gs >= PFK_STAGES)
            cu_mbar_wait(&sm.empty[s], par ^ 1u);
        /* Published with the slot: every lane arrives on the K barrier
         * after its own writes (the barrier counts the warp's 32 lanes and
         * lane 0's copies). */
        sm.ent[s * CU_PFK_ITEM_TOKENS + lane] = e0;
        sm.ent[s * CU_PFK_ITEM_TOKENS + lane + 32] = e1;
        __syncwarp();
        if (lane != 0)
            cu_mbar_arrive(&sm.full_k[s]);
        if (lane == 0) {
            sm.meta[s] = make_int4(it.z, it.w, it.x, end ? 1 : 0);
            if (end) {
                cu_mbar_arrive(&sm.full_k[s]);
            } else {
                const uint32_t kd = cu_smem_addr(sm.ring + s * PFK_STAGE_BYTES);
                cu_mbar_arrive_tx(&sm.full_k[s], PFH_TILE_BYTES);
                cu_pfh_load_page(kd, map_k, it.y, it.x, &sm.full_k[s]);
                cu_mbar_arrive_tx(&sm.full_v[s], PFH_TILE_BYTES);
                cu_pfh_load_page(kd + PFH_TILE_BYTES, map_v, it.y, it.x, &sm.full_v[s]);
            }
        }
        __syncwarp();
        if (end)
            break;
        /* The last key the item's tokens see. */
        const int32_t lk = __reduce_max_sync(0xffffffffu, max(h0 ? cu_pfk_ent_key(e0) : -1,
                                                              h1 ? cu_pfk_ent_key(e1) : -1));
        if (pd.s >= 0)
            cu_pfk_release_v(sm, pd);
        pd.s = s;
        pd.par = par;
        pd.last_key = lk;
    }
    if (pd.s >= 0)
        cu_pfk_release_v(sm, pd);
}

/* The consumer group's barrier (ids 1 and 2; 0 is the CTA's). */
__device__ __forceinline__ void cu_pfk_group_sync(int wg)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + wg), "n"(PFK_GROUP_THREADS) : "memory");
}

/* Issued by one thread: the Q rows of the tile whose first token is the
 * item's t0 (tokens t0 .. t0 + tt - 1 that exist) into the tile buffer at
 * dst, completing on bar.  A token's g rows of KV head kvh are two boxes
 * of map_q (columns 0-63 into the buffer's first 8 KB, 64-127 into the
 * next), at row token x g, so the buffer holds the 64-row A operand of
 * S = Q K^T in the 128-byte swizzle.  Rows of missing tokens keep what
 * the buffer held: their scores are masked and their rows never stored. */
__device__ __forceinline__ void cu_pfk_issue_q(const CUtensorMap *map_q, const int2 *ent, int32_t n,
                                               int32_t t0, int32_t tt, int32_t g, int32_t kvh,
                                               uint32_t dst, uint64_t *bar)
{
    const int32_t k = min(tt, n - t0);
    cu_mbar_arrive_tx(bar, (uint32_t)(k * g * PFH_ROW_BYTES));
    for (int32_t tk = 0; tk < k; ++tk) {
        const uint32_t d = dst + (uint32_t)(tk * g * PFH_BOX_ROW_BYTES);
        const int32_t t = ent[t0 + tk].y;
        cu_tma_load_rows(d, map_q, 0, 0, kvh, t, bar);
        cu_tma_load_rows(d + PFK_TILE_BYTES / 2, map_q, PFH_BOX_COLS, 0, kvh, t, bar);
    }
}

/* Issued by one thread: the tile's staged output rows (the layout of
 * cu_pfk_issue_q) to the partial rows of its tokens, marked evict-first in
 * L2 (the merge reads them only after the whole chunk), as one bulk group. */
__device__ __forceinline__ void cu_pfk_issue_o(const CUtensorMap *map_o, const int2 *ent, int32_t n,
                                               int32_t t0, int32_t tt, int32_t g, uint32_t src,
                                               uint64_t policy)
{
    const int32_t k = min(tt, n - t0);
    for (int32_t tk = 0; tk < k; ++tk) {
        const uint32_t a = src + (uint32_t)(tk * g * PFH_BOX_ROW_BYTES);
        const int32_t e = cu_pfk_ent_row(ent[t0 + tk]);
        cu_tma_store_rows_hint(a, map_o, 0, 0, 0, e, policy);
        cu_tma_store_rows_hint(a + PFK_TILE_BYTES / 2, map_o, PFH_BOX_COLS, 0, 0, e, policy);
    }
    cu_bulk_commit();
}

/* S = Q K^T for the group's 64 rows, Q from a tile buffer (both operands
 * K-major in the 128-byte swizzle: 32 bytes per k-step within a column
 * half, the halves 8 KB (Q) and 16 KB (K) apart). */
template <typename Tag>
__device__ __forceinline__ void cu_pfk_qk(uint32_t qa, uint32_t ka, float (&sc)[16][4])
{
    cu_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
        const uint32_t k32 = (uint32_t)(ks & 3) * 32u;
        cu_wgmma_m64n128k16_ss(
            sc, cu_wgmma_desc(qa + (uint32_t)(ks >> 2) * (PFK_TILE_BYTES / 2) + k32, 16),
            cu_wgmma_desc(ka + (uint32_t)(ks >> 2) * (PFH_TILE_BYTES / 2) + k32, 16), ks > 0,
            Tag());
    }
    cu_wgmma_commit();
    cu_wgmma_wait_all();
    cu_wgmma_hold(sc);
}

/* One block's scores into weights, in one pass (a tile sees one block):
 * keys j <= lim_lo (lim_hi) count for the thread's low (high) row (lim -1:
 * none), the scale sl2 (log2 units, > 0) applied inside the exponent; the
 * rows' maxima (log2 units) and sums (this thread's keys only). */
__device__ __forceinline__ void cu_pfk_softmax(float (&sc)[16][4], int32_t lim_lo, int32_t lim_hi,
                                               float sl2, float &m_lo, float &m_hi, float &l_lo,
                                               float &l_hi)
{
    cu_pfh_mask(sc, lim_lo, lim_hi);
    float mx_lo, mx_hi;
    cu_rows_tile_max<16>(sc, mx_lo, mx_hi);
    m_lo = mx_lo * sl2;
    m_hi = mx_hi * sl2;
    const float ref_lo = m_lo == -INFINITY ? 0.0f : m_lo;
    const float ref_hi = m_hi == -INFINITY ? 0.0f : m_hi;
    l_lo = l_hi = 0.0f;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            sc[n][e] = cu_rows_exp2_ftz(fmaf(sc[n][e], sl2, -ref_lo));
            sc[n][2 + e] = cu_rows_exp2_ftz(fmaf(sc[n][2 + e], sl2, -ref_hi));
            l_lo += sc[n][e];
            l_hi += sc[n][2 + e];
        }
    }
}

/* The tile's normalized output rows into the tile buffer at buf as 16-bit
 * values, in the layout cu_pfk_issue_q reads Q into (row r's 16-byte chunk
 * c at c / 8 x 8 KB + r x 128 + ((c % 8) ^ (r % 8)) x 16): one stmatrix
 * per two chunks, lane i addressing row i % 8 (+ 8 for i / 8 odd) of chunk
 * pair member i / 16. */
template <typename Tag>
__device__ __forceinline__ void cu_pfk_stage_o(uint32_t buf, const float (&o)[16][4], float inv_lo,
                                               float inv_hi)
{
    const int lane = threadIdx.x & 31;
    const int32_t row = ((threadIdx.x >> 5) & 3) * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
    const uint32_t base = buf + (uint32_t)row * PFH_BOX_ROW_BYTES;
    const int32_t half = lane >> 4, r8 = lane & 7;
#pragma unroll
    for (int j = 0; j < 16; j += 2) {
        const uint32_t at = base + (uint32_t)(j >> 3) * (PFK_TILE_BYTES / 2) +
                            (uint32_t)((((j & 7) + half) ^ r8) << 4);
        cu_stmatrix_x4(at, cu_pack2(o[j][0] * inv_lo, o[j][1] * inv_lo, Tag()),
                       cu_pack2(o[j][2] * inv_hi, o[j][3] * inv_hi, Tag()),
                       cu_pack2(o[j + 1][0] * inv_lo, o[j + 1][1] * inv_lo, Tag()),
                       cu_pack2(o[j + 1][2] * inv_hi, o[j + 1][3] * inv_hi, Tag()));
    }
}

/* The consumer groups.  The tiles of the CTA's items, taken in order,
 * go to the groups in turn (tile i of the sequence to group i % 3, across
 * item boundaries): restarting at group 0 in every item gave group 0 the
 * odd tiles of every item, and the slot's release waited for it.  A
 * group's tiles of all items form one sequence whose tile seq uses buffer
 * seq % 2.  One thread of the group (lead) copies in the next tile's Q
 * rows (of this item, or of the group's first tile of the next item)
 * while the group computes the current one, and sends each finished
 * tile's rows out by tensor-map stores; a buffer is loaded again only
 * after the stores of its rows have read it. */
template <typename Tag>
__device__ void cu_pfk_consumer(const cu_pfk_params &p, const cu_pfk_smem_t &sm,
                                const CUtensorMap *map_q, const CUtensorMap *map_o)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int wg = warp >> 2;
    const bool lead = (threadIdx.x & (PFK_GROUP_THREADS - 1)) == 0;
    /* The thread's two rows of a tile: row = token x g + head. */
    const int32_t lg = __ffs(p.g) - 1;
    const int32_t tt = PFH_GROUP_ROWS >> lg;
    const int32_t row_lo = (warp & 3) * 16 + (lane >> 2), row_hi = row_lo + 8;
    const int32_t tok_lo = row_lo >> lg, tok_hi = row_hi >> lg;
    const int32_t head_lo = row_lo & (p.g - 1), head_hi = row_hi & (p.g - 1);
    const uint32_t bufs = cu_smem_addr(sm.qbuf + wg * 2 * PFK_TILE_BYTES);
    uint64_t *qfull = sm.qfull + wg * 2;
    const int32_t step = PFK_GROUPS * tt;
    const uint64_t evict = cu_l2_evict_first();
    uint32_t seq = 0;
    /* The index (mod PFK_GROUPS) of the current item's first tile in the
     * CTA's sequence of tiles. */
    int32_t base = 0;
    bool ahead = false; /* lead: the next item's first tile is already issued */
    /* A slot's meta is read once its K barrier has completed; the loop
     * ends at the slot marked "end" (written as a loop whose test reads
     * the slot: with a break inside, ptxas serialized the wgmma). */
    cu_mbar_wait(&sm.full_k[0], 0u);
    for (uint32_t gs = 0; !sm.meta[gs % PFK_STAGES].w;) {
        const int s = (int)(gs % PFK_STAGES);
        const uint32_t par = (gs / PFK_STAGES) & 1u;
        const int32_t n = sm.meta[s].y, kvh = sm.meta[s].z;
        /* The group's first token of this item. */
        const int32_t first = ((wg - base + PFK_GROUPS) % PFK_GROUPS) * tt;
        const int2 *ent = sm.ent + s * CU_PFK_ITEM_TOKENS;
        const uint32_t ka = cu_smem_addr(sm.ring + s * PFK_STAGE_BYTES);
        bool v_seen = false;
        if (lead && !ahead && first < n)
            cu_pfk_issue_q(map_q, ent, n, first, tt, p.g, kvh, bufs + (seq & 1u) * PFK_TILE_BYTES,
                           &qfull[seq & 1u]);
        ahead = false;
        for (int32_t t0 = first; t0 < n; t0 += step, ++seq) {
            const uint32_t b = seq & 1u;
            const uint32_t buf = bufs + b * PFK_TILE_BYTES;
            cu_mbar_wait(&qfull[b], (seq >> 1) & 1u);
            float sc[16][4];
            cu_pfk_qk<Tag>(buf, ka, sc);
            if (lead) {
                /* The next tile: this item's, or the next item's first. */
                const int2 *ne = ent;
                int32_t nn = n, nt = t0 + step, nk = kvh;
                if (nt >= n) {
                    /* Only if the next item's slot is already published:
                     * waiting for its K copy here would hold up this
                     * tile (short items have one tile a group). */
                    nn = 0;
                    const int s2 = (int)((gs + 1) % PFK_STAGES);
                    if (cu_mbar_test(&sm.full_k[s2], ((gs + 1) / PFK_STAGES) & 1u) &&
                        !sm.meta[s2].w) {
                        ne = sm.ent + s2 * CU_PFK_ITEM_TOKENS;
                        nn = sm.meta[s2].y;
                        nk = sm.meta[s2].z;
                        const int32_t nbase = (base + (n + tt - 1) / tt) % PFK_GROUPS;
                        nt = ((wg - nbase + PFK_GROUPS) % PFK_GROUPS) * tt;
                        ahead = nt < nn;
                    }
                }
                if (nt < nn) {
                    cu_bulk_wait_read(); /* the other buffer's rows have left */
                    cu_pfk_issue_q(map_q, ne, nn, nt, tt, p.g, nk, bufs + (b ^ 1u) * PFK_TILE_BYTES,
                                   &qfull[b ^ 1u]);
                }
            }
            const bool ok_lo = t0 + tok_lo < n, ok_hi = t0 + tok_hi < n;
            const int32_t lim_lo = ok_lo ? cu_pfk_ent_key(ent[t0 + tok_lo]) : -1;
            const int32_t lim_hi = ok_hi ? cu_pfk_ent_key(ent[t0 + tok_hi]) : -1;
            float m_lo, m_hi, l_lo, l_hi;
            cu_pfk_softmax(sc, lim_lo, lim_hi, p.scale_log2, m_lo, m_hi, l_lo, l_hi);
            if (!v_seen) {
                cu_mbar_wait(&sm.v_ready[s], par);
                v_seen = true;
            }
            float o[16][4];
            cu_pfh_pv<Tag, false>(ka + PFH_TILE_BYTES, sc, o);
            cu_rows_sum_quads(l_lo, l_hi);
            if ((lane & 3) == 0) {
                if (ok_lo)
                    p.ws.part_lse[(int64_t)cu_pfk_ent_row(ent[t0 + tok_lo]) * p.g + head_lo] =
                        cu_rows_lse(m_lo, l_lo);
                if (ok_hi)
                    p.ws.part_lse[(int64_t)cu_pfk_ent_row(ent[t0 + tok_hi]) * p.g + head_hi] =
                        cu_rows_lse(m_hi, l_hi);
            }
            /* The products have read the Q rows: the buffer takes the
             * output rows, which leave by tensor-map stores. */
            cu_pfk_stage_o<Tag>(buf, o, cu_rows_inv(l_lo), cu_rows_inv(l_hi));
            cu_fence_proxy_async();
            cu_pfk_group_sync(wg);
            if (lead)
                cu_pfk_issue_o(map_o, ent, n, t0, tt, p.g, buf, evict);
        }
        base = (base + (n + tt - 1) / tt) % PFK_GROUPS;
        /* The slot's V is released (and its copy landed) before the slot is
         * handed back. */
        if (!v_seen)
            cu_mbar_wait(&sm.v_ready[s], par);
        cu_mbar_arrive(&sm.empty[s]);
        ++gs;
        cu_mbar_wait(&sm.full_k[gs % PFK_STAGES], (gs / PFK_STAGES) & 1u);
    }
    if (lead)
        cu_bulk_wait();
}

#endif /* CU_HAVE_WGMMA */

template <typename Tag>
__global__ void __launch_bounds__(PFK_THREADS, 1)
    cu_pfk_attend(const __grid_constant__ cu_pfk_params p,
                  const __grid_constant__ CUtensorMap map_k,
                  const __grid_constant__ CUtensorMap map_v,
                  const __grid_constant__ CUtensorMap map_q,
                  const __grid_constant__ CUtensorMap map_o)
{
#ifdef CU_HAVE_WGMMA
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const int warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        const cu_pfk_smem_t sm = cu_pfk_smem_of(smem_raw);
        for (int s = 0; s < PFK_STAGES; ++s) {
            cu_mbar_init(&sm.full_k[s], 32);
            cu_mbar_init(&sm.full_v[s], 1);
            cu_mbar_init(&sm.v_ready[s], 32);
            cu_mbar_init(&sm.empty[s], PFK_EMPTY_ARRIVALS);
        }
        for (int b = 0; b < 2 * PFK_GROUPS; ++b)
            cu_mbar_init(&sm.qfull[b], 1);
        cu_mbar_fence_init();
    }
    if (warp == PFK_CONSUMER_WARPS && (threadIdx.x & 31) == 0) {
        cu_tma_prefetch_map(&map_k);
        cu_tma_prefetch_map(&map_v);
        cu_tma_prefetch_map(&map_q);
        cu_tma_prefetch_map(&map_o);
    }
    __syncthreads();
    cu_pdl_wait(); /* the lists */
    cu_pdl_trigger();
    const int32_t n_items = cu_pfk_chunk_len(p) > 0 ? p.ws.n_items[0] : 0;
    if (warp >= PFK_CONSUMER_WARPS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PFK_PRODUCER_REGS));
        if (warp != PFK_CONSUMER_WARPS)
            return;
        cu_pfk_producer(p, cu_pfk_smem_of(smem_raw), &map_k, &map_v, n_items);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(PFK_CONSUMER_REGS));
        cu_pfk_consumer<Tag>(p, cu_pfk_smem_of(smem_raw), &map_q, &map_o);
    }
#else
    (void)p;
    (void)map_k;
    (void)map_v;
    (void)map_q;
    (void)map_o;
#endif
}

/* ---- merge ------------------------------------------------------------------- */

/* Eight threads per (token, query head), 16 dimensions each. */
#define PFK_MERGE_THREADS 256
#define PFK_MERGE_DIMS 16

template <typename Tag>
__global__ void __launch_bounds__(PFK_MERGE_THREADS)
    cu_pfk_merge(const __grid_constant__ cu_pfk_params p)
{
    cu_pdl_wait(); /* the partial rows */
    cu_pdl_trigger();
    const int32_t per_row = PFH_HEAD_DIM / PFK_MERGE_DIMS;
    const int64_t n = (int64_t)cu_pfk_chunk_len(p) * p.hkv * p.g * per_row;
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < n;
         u += (int64_t)gridDim.x * blockDim.x) {
        const int32_t part = (int32_t)(u % per_row);
        const int64_t row = u / per_row; /* (local token x hkv + KV head) x g + head */
        const int32_t head = (int32_t)(row % p.g);
        const int64_t tg = row / p.g;
        const int32_t g = (int32_t)(tg % p.hkv);
        const int32_t tl = (int32_t)(tg / p.hkv);
        const int32_t t = p.pf_tok[(int64_t)p.chunk * p.chunk_tokens + tl];
        const int64_t e0 = tg * p.W; /* the token's first entry */
        /* The row's count of valid blocks (the count kernel's), then its
         * partials with their loads free to be issued several at a time. */
        const int32_t nv = p.ws.nval[tg];
        float M = -INFINITY;
#pragma unroll 4
        for (int32_t j = 0; j < nv; ++j)
            M = fmaxf(M, p.ws.part_lse[(e0 + j) * p.g + head]);
        float acc[PFK_MERGE_DIMS];
#pragma unroll
        for (int k = 0; k < PFK_MERGE_DIMS; ++k)
            acc[k] = 0.0f;
        float wsum = 0.0f;
#pragma unroll 4
        for (int32_t j = 0; j < nv; ++j) {
            const int64_t pr = (e0 + j) * p.g + head;
            const float ls = p.ws.part_lse[pr];
            const float w = ls == -INFINITY ? 0.0f : expf(ls - M);
            wsum += w;
            const uint4 *src = (const uint4 *)((const uint16_t *)p.ws.part_o + pr * PFH_HEAD_DIM +
                                               part * PFK_MERGE_DIMS);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint4 x = src[h];
                const uint32_t xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const float2 f = cu_unpack2(xs[k], Tag());
                    acc[h * 8 + 2 * k] = fmaf(w, f.x, acc[h * 8 + 2 * k]);
                    acc[h * 8 + 2 * k + 1] = fmaf(w, f.y, acc[h * 8 + 2 * k + 1]);
                }
            }
        }
        const float inv = wsum > 0.0f ? 1.0f / wsum * p.v_mul : 0.0f;
        const int64_t q = (int64_t)t * p.hq_total + (int64_t)g * p.g + head;
        uint4 *dst = (uint4 *)((uint16_t *)p.o + q * PFH_HEAD_DIM + part * PFK_MERGE_DIMS);
#pragma unroll
        for (int h = 0; h < 2; ++h)
            dst[h] = make_uint4(cu_pack2(acc[h * 8] * inv, acc[h * 8 + 1] * inv, Tag()),
                                cu_pack2(acc[h * 8 + 2] * inv, acc[h * 8 + 3] * inv, Tag()),
                                cu_pack2(acc[h * 8 + 4] * inv, acc[h * 8 + 5] * inv, Tag()),
                                cu_pack2(acc[h * 8 + 6] * inv, acc[h * 8 + 7] * inv, Tag()));
        if (p.lse && part == 0)
            p.lse[q] = wsum > 0.0f ? M + logf(wsum) : -INFINITY;
    }
}

/* ---- merge by bulk copies ------------------------------------------------------
 * One CTA per SM (its shared memory keeps a second one out) walks the
 * chunk's units (one token and KV head each).  One thread copies a unit's
 * whole set of partial rows (W x g rows, contiguous) and their LSE by bulk
 * copies into a ring of PFKM_STAGES slots, so an SM keeps up to three
 * units' bytes in flight, and eight warps merge from shared memory.
 * Nothing on a unit's path waits on a global load: the unit's token row
 * and its count of valid blocks (which the count kernel wrote) are loaded
 * one unit ahead.  Per unit, first each (block, head) pair's weight
 * exp(LSE - max) once, by a lane of the head's group of Wp lanes (Wp: W
 * rounded up to a power of two), then each thread sums 8 dimensions of one
 * head's row over the blocks.  The grid-stride merge (cu_pfk_merge, one
 * thread per 16 dimensions of a row, each computing its row's weights
 * itself) serves units that do not fit a slot. */
#define PFKM_WARPS 8
#define PFKM_CONSUMERS (PFKM_WARPS * 32)
#define PFKM_THREADS (PFKM_CONSUMERS + 32)
#define PFKM_STAGES 3
#define PFKM_ROWS_BYTES (64 * 1024) /* a unit's partial rows, W x g x 256 bytes at most */
#define PFKM_LSE_BYTES (PFKM_ROWS_BYTES / (PFH_HEAD_DIM * 2) * 4)
#define PFKM_STAGE_BYTES (PFKM_ROWS_BYTES + PFKM_LSE_BYTES)
/* Two sets of per-unit weights (a unit's are written while the unit
 * before may still be summed) and per-head factors, then the barriers. */
#define PFKM_PAIRS (PFKM_ROWS_BYTES / (PFH_HEAD_DIM * 2))
#define PFKM_WTS_BYTES (2 * (PFKM_PAIRS + 64) * 4)
#define PFKM_SMEM (PFKM_STAGES * PFKM_STAGE_BYTES + PFKM_WTS_BYTES + 2 * PFKM_STAGES * 8)
static_assert(PFKM_SMEM > 114 * 1024 && PFKM_SMEM <= 227 * 1024,
              "one merge CTA per SM, within the shared memory");
static_assert(PFKM_PAIRS <= PFKM_CONSUMERS, "a consumer thread per (block, head) pair");
/* A piece is 8 dimensions (16 bytes) of one head's row. */
#define PFKM_PIECE_DIMS 8

/* W rounded up to a power of two. */
__host__ __device__ __forceinline__ int32_t cu_pfk_w_pow2(int32_t W)
{
    int32_t w = 1;
    while (w < W)
        w <<= 1;
    return w;
}

/* Whether a unit fits the bulk merge: its W x g partial rows in a slot,
 * a lane for each of its Wp x g (block, head) pairs, Wp <= 32. */
static int cu_pfk_merge_bulk_fits(int32_t W, int32_t g)
{
    const int32_t wp = cu_pfk_w_pow2(W);
    return wp <= 32 && (size_t)wp * (size_t)g <= PFKM_PAIRS;
}

template <typename Tag>
__global__ void __launch_bounds__(PFKM_THREADS, 1)
    cu_pfk_merge_bulk(const __grid_constant__ cu_pfk_params p)
{
#ifdef CU_HAVE_WGMMA
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    float *wts = (float *)(smem_raw + PFKM_STAGES * PFKM_STAGE_BYTES); /* [2][PAIRS + 64] */
    uint64_t *full = (uint64_t *)((unsigned char *)wts + PFKM_WTS_BYTES);
    uint64_t *empty = full + PFKM_STAGES;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int s = 0; s < PFKM_STAGES; ++s) {
            cu_mbar_init(&full[s], 1);
            cu_mbar_init(&empty[s], PFKM_CONSUMERS);
        }
        cu_mbar_fence_init();
    }
    __syncthreads();
    cu_pdl_wait(); /* the partial rows */
    cu_pdl_trigger();
    const int32_t ctas = (int32_t)gridDim.x;
    const int32_t units = cu_pfk_chunk_len(p) * p.hkv; /* (local token, KV head) */
    const int32_t unit_rows = p.W * p.g;
    if (warp == PFKM_WARPS) {
        if (lane == 0) {
            const uint64_t policy = cu_l2_evict_first();
            int32_t k = 0;
            for (int32_t u = (int32_t)blockIdx.x; u < units; u += ctas, ++k) {
                const int s = k % PFKM_STAGES;
                if (k >= PFKM_STAGES)
                    cu_mbar_wait(&empty[s], (uint32_t)(k / PFKM_STAGES - 1) & 1u);
                const int64_t r0 = (int64_t)u * unit_rows;
                unsigned char *slot = smem_raw + s * PFKM_STAGE_BYTES;
                cu_mbar_arrive_tx(&full[s], (uint32_t)unit_rows * (PFH_HEAD_DIM * 2 + 4));
                cu_bulk_load_hint(slot, (const uint16_t *)p.ws.part_o + r0 * PFH_HEAD_DIM,
                                  (uint32_t)unit_rows * PFH_HEAD_DIM * 2, &full[s], policy);
                cu_bulk_load_hint(slot + PFKM_ROWS_BYTES, p.ws.part_lse + r0,
                                  (uint32_t)unit_rows * 4, &full[s], policy);
            }
        }
        return;
    }
    const int32_t wp = cu_pfk_w_pow2(p.W);
    const int32_t pieces = p.g * (PFH_HEAD_DIM / PFKM_PIECE_DIMS);
    const int32_t tid = (int32_t)threadIdx.x;
    /* This thread's (block j, head) pair of the weight pass. */
    const int32_t pj = tid & (wp - 1), ph = tid / wp;
    const int32_t *nval = p.ws.nval;
    const int32_t *tok = p.pf_tok + (int64_t)p.chunk * p.chunk_tokens;
    int32_t u = (int32_t)blockIdx.x;
    int32_t nv_next = u < units ? nval[u] : 0;
    int32_t t_next = u < units ? tok[u / p.hkv] : 0;
    for (int32_t k = 0; u < units; u += ctas, ++k) {
        const int s = k % PFKM_STAGES;
        const int32_t nv = nv_next, t = t_next, g = u % p.hkv;
        const int32_t un = u + ctas;
        nv_next = un < units ? nval[un] : 0;
        t_next = un < units ? tok[un / p.hkv] : 0;
        float *w_of = wts + (k & 1) * (PFKM_PAIRS + 64); /* [j * g + head], then 64 factors */
        const uint32_t w_at = cu_smem_addr(w_of);
        cu_mbar_wait(&full[s], (uint32_t)(k / PFKM_STAGES) & 1u);
        const uint32_t rows = cu_smem_addr(smem_raw + s * PFKM_STAGE_BYTES);
        {
            /* Every lane takes part in the shuffles (a group of Wp lanes
             * never spans two warps); pairs past the unit's carry -inf. */
            const bool valid = ph < p.g && pj < nv;
            const float ls = valid ? __uint_as_float(cu_lds32(rows + PFKM_ROWS_BYTES +
                                                              (uint32_t)(pj * p.g + ph) * 4u))
                                   : -INFINITY;
            float M = ls;
            for (int o = 1; o < wp; o <<= 1)
                M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
            const float w = ls == -INFINITY ? 0.0f : expf(ls - M);
            float wsum = w;
            for (int o = 1; o < wp; o <<= 1)
                wsum += __shfl_xor_sync(0xffffffffu, wsum, o);
            if (valid)
                w_of[pj * p.g + ph] = w;
            if (pj == 0 && ph < p.g) {
                w_of[PFKM_PAIRS + ph] = wsum > 0.0f ? 1.0f / wsum * p.v_mul : 0.0f;
                if (p.lse)
                    p.lse[(int64_t)t * p.hq_total + (int64_t)g * p.g + ph] =
                        wsum > 0.0f ? M + logf(wsum) : -INFINITY;
            }
        }
        cu_named_sync(1, PFKM_CONSUMERS);
        for (int32_t pc = tid; pc < pieces; pc += PFKM_CONSUMERS) {
            const int32_t head = pc / (PFH_HEAD_DIM / PFKM_PIECE_DIMS);
            const int32_t part = pc % (PFH_HEAD_DIM / PFKM_PIECE_DIMS);
            float acc[PFKM_PIECE_DIMS];
#pragma unroll
            for (int i = 0; i < PFKM_PIECE_DIMS; ++i)
                acc[i] = 0.0f;
#pragma unroll 4
            for (int32_t j = 0; j < nv; ++j) {
                const uint32_t r = (uint32_t)(j * p.g + head);
                const float w = __uint_as_float(cu_lds32(w_at + r * 4u));
                const uint4 x =
                    cu_lds128(rows + r * (PFH_HEAD_DIM * 2) + (uint32_t)part * PFKM_PIECE_DIMS * 2);
                const uint32_t xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float2 f = cu_unpack2(xs[i], Tag());
                    acc[2 * i] = fmaf(w, f.x, acc[2 * i]);
                    acc[2 * i + 1] = fmaf(w, f.y, acc[2 * i + 1]);
                }
            }
            const float inv = __uint_as_float(cu_lds32(w_at + (PFKM_PAIRS + head) * 4u));
            const int64_t q = (int64_t)t * p.hq_total + (int64_t)g * p.g + head;
            *(uint4 *)((uint16_t *)p.o + q * PFH_HEAD_DIM + part * PFKM_PIECE_DIMS) =
                make_uint4(cu_pack2(acc[0] * inv, acc[1] * inv, Tag()),
                           cu_pack2(acc[2] * inv, acc[3] * inv, Tag()),
                           cu_pack2(acc[4] * inv, acc[5] * inv, Tag()),
                           cu_pack2(acc[6] * inv, acc[7] * inv, Tag()));
        }
        cu_mbar_arrive(&empty[s]); /* every consumer lane: its own reads */
    }
#else
    (void)p;
#endif
}

/* ---- host side ----------------------------------------------------------- */

int cu_pfk_fits(int32_t d, int32_t page, int32_t block, int32_t g, const char **why)
{
    if (d != PFH_HEAD_DIM || page != PFH_KEYS || block != PFH_KEYS) {
        if (why)
            *why = "head dim, page or block size != 128: prefill tiles over block unions";
        return 0;
    }
    /* A token's rows are one tensor-map box of g rows; 8 or more keep
     * each box on a whole 1024-byte swizzle atom of the tile buffer. */
    if (g < 8 || g > PFH_GROUP_ROWS || (g & (g - 1)) != 0) {
        if (why)
            *why = "query heads per KV head not a power of two from 8 to 64: prefill tiles "
                   "over block unions";
        return 0;
    }
    return 1;
}

/* Bytes of one token's entries (partial rows and LSE, list place, entry)
 * and of its rows' counts of valid blocks. */
static size_t cu_pfk_token_bytes(int32_t hkv, int32_t g, int32_t W)
{
    return (size_t)hkv * ((size_t)W * ((size_t)g * (PFH_HEAD_DIM * 2 + sizeof(float)) +
                                       sizeof(int32_t) + sizeof(int2)) +
                          sizeof(int32_t));
}

int32_t cu_pfk_chunk_tokens(int32_t cap_tok, int32_t hkv, int32_t g, int32_t W)
{
    const size_t fit = CU_PFK_CHUNK_BUDGET / cu_pfk_token_bytes(hkv, g, W);
    return fit < (size_t)cap_tok ? (int32_t)fit : cap_tok;
}

size_t cu_pfk_ws_carve(void *base, int32_t hkv, int32_t g, int32_t W, int32_t chunk_tokens,
                       int32_t blocks_cap, cu_pfk_ws *ws, int32_t *items_cap)
{
    const size_t entries = (size_t)chunk_tokens * (size_t)hkv * (size_t)W;
    const size_t lists = (size_t)hkv * (size_t)blocks_cap;
    const size_t items = entries / CU_PFK_ITEM_TOKENS + lists;
    size_t off = 0;
    char *b = (char *)base;
#define PFK_CARVE(field, type, count)                                      \
    do {                                                                   \
        if (ws)                                                            \
            ws->field = (type *)(b + off);                                 \
        off = (off + sizeof(type) * (size_t)(count) + 255) & ~(size_t)255; \
    } while (0)
    PFK_CARVE(cnt, int32_t, lists);
    PFK_CARVE(off, int32_t, lists);
    PFK_CARVE(blk_page, int32_t, blocks_cap);
    PFK_CARVE(epos, int32_t, entries);
    PFK_CARVE(ent, int2, entries);
    PFK_CARVE(items, int4, items);
    PFK_CARVE(n_items, int32_t, 2);
    PFK_CARVE(nval, int32_t, (size_t)chunk_tokens * (size_t)hkv);
    PFK_CARVE(part_o, uint16_t, entries * (size_t)g * PFH_HEAD_DIM);
    PFK_CARVE(part_lse, float, entries *(size_t)g);
#undef PFK_CARVE
    if (items_cap)
        *items_cap = (int32_t)items;
    return off;
}

void cu_pfk_build(const cu_attn_params *A, const cu_pfk_ws *ws, int32_t chunk_tokens,
                  int32_t blocks_cap, int32_t items_cap, cu_pfk_params *p)
{
    memset(p, 0, sizeof(*p));
    p->act = A->act_dtype;
    p->hq_total = A->q_heads;
    p->hkv = A->kv_heads;
    p->g = A->group;
    p->W = A->topk_width;
    p->cap_pages = A->cap_pages;
    p->chunk_tokens = chunk_tokens;
    p->blocks_cap = blocks_cap;
    p->items_cap = items_cap;
    p->scale_log2 = A->scale * A->pf_k_mul * CU_LOG2E;
    p->v_mul = A->pf_v_mul;
    p->q = A->q;
    p->o = A->out;
    p->lse = A->lse;
    p->sel = A->selected;
    p->page_table = A->meta.page_table;
    p->tok_info = A->meta.tok_info;
    p->pf_tok = A->meta.pf_tok;
    p->pf_blk0 = A->meta.pf_blk0;
    p->hdr = A->meta.hdr;
    p->ws = *ws;
}

int cu_pfk_encode_maps(const cu_pfk_params *p, int32_t q_tokens, CUtensorMap *qo)
{
    /* Queries: the g rows of (token, KV head) are slots 0 .. g - 1 of
     * "page" token, "head" KV head. */
    const msa_plane_strides sq = {(int64_t)p->hq_total * PFH_HEAD_DIM, (int64_t)p->g * PFH_HEAD_DIM,
                                  PFH_HEAD_DIM};
    if (cu_tma_map_plane(&qo[0], p->q, &sq, (uint64_t)q_tokens, (uint32_t)p->g, (uint32_t)p->hkv,
                         (uint32_t)p->g, 2) != 0)
        return 1;
    /* Partial rows: the g rows of entry e are "page" e. */
    const msa_plane_strides so = {(int64_t)p->g * PFH_HEAD_DIM, 0, PFH_HEAD_DIM};
    const uint64_t entries = (uint64_t)p->chunk_tokens * (uint64_t)p->hkv * (uint64_t)p->W;
    return cu_tma_map_plane(&qo[1], p->ws.part_o, &so, entries, (uint32_t)p->g, 1u, (uint32_t)p->g,
                            2);
}

template <typename Tag>
static void cu_pfk_launch_chunk(const cu_pfk_params *p, const cu_plan_state *st,
                                const CUtensorMap *maps, const CUtensorMap *qo, cudaStream_t s)
{
    const int lists_grid = st->sz.num_sms * 4;
    cu_launch(cu_pfk_count, lists_grid, PFK_LIST_THREADS, 0, s, st->pdl, *p);
    cu_launch(cu_pfk_scan, 1, PFK_SCAN_THREADS, 0, s, st->pdl, *p);
    cu_launch(cu_pfk_scatter, lists_grid, PFK_LIST_THREADS, 0, s, st->pdl, *p);
    cu_launch(cu_pfk_attend<Tag>, st->sz.num_sms, PFK_THREADS, (size_t)PFK_SMEM, s, st->pdl, *p,
              maps[0], maps[1], qo[0], qo[1]);
    if (cu_pfk_merge_bulk_fits(p->W, p->g))
        cu_launch(cu_pfk_merge_bulk<Tag>, st->sz.num_sms, PFKM_THREADS, (size_t)PFKM_SMEM, s,
                  st->pdl, *p);
    else
        cu_launch(cu_pfk_merge<Tag>, st->sz.num_sms * 8, PFK_MERGE_THREADS, 0, s, st->pdl, *p);
}

void cu_launch_attn_prefill_kbm(cu_pfk_params *p, int32_t chunks, const cu_plan_state *st,
                                const CUtensorMap *maps, const CUtensorMap *qo, cudaStream_t s)
{
    for (int32_t c = 0; c < chunks; ++c) {
        p->chunk = c;
        if (p->act == MSA_DTYPE_BF16)
            cu_pfk_launch_chunk<cu_bf16_tag>(p, st, maps, qo, s);
        else
            cu_pfk_launch_chunk<cu_f16_tag>(p, st, maps, qo, s);
    }
}

cudaError_t cu_pfk_setup(void)
{
    const cudaError_t e =
        cu_allow_smem(PFK_SMEM, cu_pfk_attend<cu_bf16_tag>, cu_pfk_attend<cu_f16_tag>);
    return e != cudaSuccess ? e
                            : cu_allow_smem(PFKM_SMEM, cu_pfk_merge_bulk<cu_bf16_tag>,
                                            cu_pfk_merge_bulk<cu_f16_tag>);
}
