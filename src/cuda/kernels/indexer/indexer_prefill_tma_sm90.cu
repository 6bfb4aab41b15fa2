/*
 * Prefill indexer and selection on Hopper: tensor-map copies of whole index
 * key pages, two consumer warpgroups of warpgroup products.  See the header
 * for where it applies and docs/PREFILL_INDEXER.md for the design.
 *
 * One CTA per SM walks the same (tile, split) items as the portable kernel
 * (cu_pfi_next), with tiles of CU_PFIT_ROWS rows (row = token x Hi + head:
 * 32 tokens of M3's four index heads).  Three warpgroups:
 *   warp 8      the producer (the other warps of its group end at once and
 *               give their registers to the consumers): for each block the
 *               item reaches (a block is one page of 128 keys), waits for a
 *               free ring slot and copies the page's index keys into it
 *               (two boxes of 64 columns x 128 rows, 128-byte swizzle);
 *   warps 0-7   two consumer warpgroups, group h owning tile rows
 *               64h .. 64h + 63, their queries in registers for the item.
 *               Per block: S = Q K^T as 8 wgmma.m64n128k16 (keys as N,
 *               read from the slot) into one of two accumulator sets; while
 *               they run, the block before is finished from the other set:
 *               its slot handed back, its causal mask, score scale and max
 *               or log-sum-exp (cu_pfi_reduce), its block score to the
 *               CTA's workspace rows.  After the item's blocks the eight
 *               warps select (or keep a split's candidates and merge), as
 *               the portable kernel does.
 * Every key page is read once per tile of 128 rows (twice the rows of the
 * portable kernel's tiles), the copies run ahead of the products by the
 * ring's depth, and a group's reductions run while its own next products
 * (and the other group's) are on the tensor cores.
 */
#include "cuda/kernels/indexer/indexer_prefill_tma_sm90.cuh"
#include "cuda/kernels/indexer/indexer_prefill.cuh"
#include "cuda/kernels/attention/rows_mma.cuh"
#include "cuda/arch/tma_sm90.cuh"
#include "cuda/arch/launch.cuh"

#define PFIT_CONSUMER_WARPS 8
/* Three warpgroups: registers move per warpgroup (setmaxnreg), so the
 * producer takes a whole one and keeps few; the consumers hold their
 * queries (32 registers) and two sets of a block's 64 scores (128). */
#define PFIT_THREADS ((PFIT_CONSUMER_WARPS + 4) * 32)
#define PFIT_PRODUCER_REGS 40
#define PFIT_CONSUMER_REGS 232
static_assert(4 * 32 * PFIT_PRODUCER_REGS + PFIT_CONSUMER_WARPS * 32 * PFIT_CONSUMER_REGS <=
                  CU_LAUNCH_REGS(PFIT_THREADS) * PFIT_THREADS,
              "the CTA's registers hold the producer and the consumers");
/* A stage: one page of PFIT_KEYS index keys of PFIT_DIM 16-bit values, as
 * two boxes of PFIT_BOX_COLS columns (one 128-byte swizzle row each). */
#define PFIT_KEYS 128
#define PFIT_DIM 128
#define PFIT_BOX_COLS 64
#define PFIT_BOX_BYTES (PFIT_KEYS * PFIT_BOX_COLS * 2)
#define PFIT_STAGE_BYTES (2 * PFIT_BOX_BYTES)
#define PFIT_GROUP_ROWS 64
static_assert(PFIT_DIM == 2 * PFIT_BOX_COLS, "a key row is two boxes' rows");
static_assert(PFIT_GROUP_ROWS * (PFIT_CONSUMER_WARPS / 4) == CU_PFIT_ROWS,
              "the consumer warpgroups cover a tile's rows");
/* Four stages of 32 KB: the copies of the next three pages are in flight
 * while one is scored. */
#define PFIT_STAGES 4
#define PFIT_RING_BYTES (PFIT_STAGES * PFIT_STAGE_BYTES)
/* Barriers (full and empty per stage), then the last-split flag. */
#define PFIT_BAR_BYTES (2 * PFIT_STAGES * 8 + 16)
#define PFIT_FIXED_BYTES (1024 + PFIT_RING_BYTES + PFIT_BAR_BYTES)
/* The score cache of a selecting warp: at most this many floats, so that
 * eight warps' shared words fit beside the ring (a longer row is read
 * from the workspace in L2). */
#define PFIT_SEL_CACHE 2048
/* Every consumer lane arrives on a slot's empty barrier. */
#define PFIT_EMPTY_ARRIVALS (PFIT_CONSUMER_WARPS * 32)

__host__ __device__ __forceinline__ int32_t cu_pfit_cache(int32_t sel_cache)
{
    return sel_cache < PFIT_SEL_CACHE ? sel_cache : PFIT_SEL_CACHE;
}

size_t cu_pfit_smem(int32_t mi, int32_t K, int32_t W, int32_t sel_cache)
{
    return PFIT_FIXED_BYTES + PFIT_CONSUMER_WARPS *
                                  cu_pfi_warp_words(mi, K, W, cu_pfit_cache(sel_cache)) *
                                  sizeof(uint32_t);
}

typedef struct cu_pfit_smem_t {
    unsigned char *ring;
    uint64_t *full, *empty;
    volatile int32_t *last_split;
    uint32_t *words; /* the selecting warps' shared words */
} cu_pfit_smem_t;

__device__ __forceinline__ cu_pfit_smem_t cu_pfit_smem_of(unsigned char *raw)
{
    cu_pfit_smem_t sm;
    sm.ring = (unsigned char *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
    sm.full = (uint64_t *)(sm.ring + PFIT_RING_BYTES);
    sm.empty = sm.full + PFIT_STAGES;
    sm.last_split = (volatile int32_t *)(sm.empty + PFIT_STAGES);
    sm.words = (uint32_t *)((unsigned char *)sm.empty + PFIT_STAGES * 8 + 16);
    return sm;
}

#ifdef CU_HAVE_WGMMA

/* The producer: every block of every item of this CTA, in the consumers'
 * order, copied into the ring (lane 0 issues; the warp walks along). */
__device__ void cu_pfit_producer(const cu_pfidx_params &p, const cu_pfit_smem_t &sm,
                                 const CUtensorMap *map, int32_t S)
{
    const int lane = threadIdx.x & 31;
    uint32_t gs = 0;
    cu_pfi_walk walk;
    cu_pfi_walk_start(p, walk);
    cu_pfi_item it;
    while (cu_pfi_next(p, (int32_t)gridDim.x, S, walk, it)) {
        const int32_t *pt = p.page_table + (int64_t)it.r * p.cap_pages;
        for (int32_t c = it.b0; c < it.b1; ++c, ++gs) {
            if (lane == 0) {
                const int s = (int)(gs % PFIT_STAGES);
                const uint32_t par = (gs / PFIT_STAGES) & 1u;
                const int32_t page = pt[c]; /* page c: block c (P = B = 128) */
                if (gs >= PFIT_STAGES)
                    cu_mbar_wait(&sm.empty[s], par ^ 1u);
                const uint32_t dst = cu_smem_addr(sm.ring + s * PFIT_STAGE_BYTES);
                cu_mbar_arrive_tx(&sm.full[s], PFIT_STAGE_BYTES);
                cu_tma_load_rows(dst, map, 0, 0, 0, page, &sm.full[s]);
                cu_tma_load_rows(dst + PFIT_BOX_BYTES, map, PFIT_BOX_COLS, 0, 0, page, &sm.full[s]);
            }
            __syncwarp();
        }
    }
}

/* Starts S = Q K^T of the group's 64 rows against the slot's 128 keys as
 * 8 wgmma.m64n128k16 (keys as N), one committed group of products; the
 * caller waits for it (cu_wgmma_wait_one / _all) and then finishes it. */
template <typename Tag>
__device__ __forceinline__ void cu_pfit_qk(uint32_t ka, const uint32_t (&qa)[8][4],
                                           float (&sc)[16][4])
{
    cu_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
        const uint32_t at = ka + (uint32_t)(ks >> 2) * PFIT_BOX_BYTES + (uint32_t)(ks & 3) * 32u;
        cu_wgmma_m64n128k16<0>(sc, qa[ks], cu_wgmma_desc(at, 16), ks != 0, Tag());
    }
    cu_wgmma_commit();
}

/* The rows of this thread and what masks them, fixed for an item. */
typedef struct cu_pfit_rows {
    int32_t row_lo, row_hi; /* tile rows (row_hi = row_lo + 8) */
    int32_t pos_lo, pos_hi; /* their tokens' positions */
    int32_t pos_first;      /* the position of the group's first token */
    bool ok_lo, ok_hi;      /* rows of the item */
} cu_pfit_rows;

/* Waits for the ring slot of position gs and starts the products of the
 * page in it. */
template <typename Tag>
__device__ __forceinline__ void cu_pfit_issue(const cu_pfit_smem_t &sm, uint32_t gs,
                                              const uint32_t (&qa)[8][4], float (&sc)[16][4])
{
    const int s = (int)(gs % PFIT_STAGES);
    cu_mbar_wait(&sm.full[s], (gs / PFIT_STAGES) & 1u);
    cu_pfit_qk<Tag>(cu_smem_addr(sm.ring + s * PFIT_STAGE_BYTES), qa, sc);
}

/* Block c's products (ring position gs) have ended: hands the slot back,
 * reduces the two halves of its keys into the rows' block scores and
 * writes them to the CTA's workspace rows. */
__device__ __forceinline__ void cu_pfit_finish(const cu_pfidx_params &p, const cu_pfit_smem_t &sm,
                                               float (&sc)[16][4], int32_t c, uint32_t gs,
                                               const cu_pfit_rows &rw, float *scratch)
{
    cu_wgmma_hold(sc);
    cu_mbar_arrive(&sm.empty[gs % PFIT_STAGES]); /* the products have read the slot */
    const int32_t key0 = c * PFIT_KEYS;
    /* The whole block visible to the group's first (so every) row. */
    const bool full = key0 + PFIT_KEYS - 1 <= rw.pos_first;
    float m_lo = -INFINITY, l_lo = 0.0f, m_hi = -INFINITY, l_hi = 0.0f;
    if (p.score_lse) {
        cu_pfi_reduce<true, 0>(sc, 0, key0, rw.pos_lo, full, p.iscale, m_lo, l_lo);
        cu_pfi_reduce<true, 0>(sc, 1, key0, rw.pos_hi, full, p.iscale, m_hi, l_hi);
        cu_pfi_reduce<true, 8>(sc, 0, key0 + 64, rw.pos_lo, full, p.iscale, m_lo, l_lo);
        cu_pfi_reduce<true, 8>(sc, 1, key0 + 64, rw.pos_hi, full, p.iscale, m_hi, l_hi);
        m_lo = cu_lse_value(m_lo, l_lo);
        m_hi = cu_lse_value(m_hi, l_hi);
    } else {
        cu_pfi_reduce<false, 0>(sc, 0, key0, rw.pos_lo, full, p.iscale, m_lo, l_lo);
        cu_pfi_reduce<false, 0>(sc, 1, key0, rw.pos_hi, full, p.iscale, m_hi, l_hi);
        cu_pfi_reduce<false, 8>(sc, 0, key0 + 64, rw.pos_lo, full, p.iscale, m_lo, l_lo);
        cu_pfi_reduce<false, 8>(sc, 1, key0 + 64, rw.pos_hi, full, p.iscale, m_hi, l_hi);
    }
    if ((threadIdx.x & 3) == 0) {
        if (rw.ok_lo)
            scratch[(int64_t)rw.row_lo * p.cap_blocks + c] = m_lo;
        if (rw.ok_hi)
            scratch[(int64_t)rw.row_hi * p.cap_blocks + c] = m_hi;
    }
}

/* The block scores of the item's blocks [b0, b1) for this thread's rows
 * into the CTA's workspace rows.  gs: the ring position (the consumers
 * and the producer count the same blocks).  Two accumulator sets take
 * the blocks in turn: block c + 1's products are issued before block c
 * is finished, so one set's products are always in flight.  The loop
 * body issues unconditionally (two blocks a round, each set's registers
 * named at compile time); the last one or two blocks are finished after
 * it. */
template <typename Tag>
__device__ __forceinline__ void cu_pfit_scores(const cu_pfidx_params &p, const cu_pfit_smem_t &sm,
                                               const cu_pfi_item &it, float *scratch, uint32_t &gs)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int wg = warp >> 2;
    const int32_t nrow = it.ntok * p.Hi;
    cu_pfit_rows rw;
    rw.row_lo = warp * 16 + (lane >> 2);
    rw.row_hi = rw.row_lo + 8;
    rw.ok_lo = rw.row_lo < nrow;
    rw.ok_hi = rw.row_hi < nrow;
    rw.pos_lo = it.base + rw.row_lo / p.Hi;
    rw.pos_hi = it.base + rw.row_hi / p.Hi;
    rw.pos_first = it.base + (wg * PFIT_GROUP_ROWS) / p.Hi;
    /* Whether the group has rows (uniform over the group: its products
     * are collective). */
    if (wg * PFIT_GROUP_ROWS >= nrow) {
        for (int32_t c = it.b0; c < it.b1; ++c, ++gs) {
            const int s = (int)(gs % PFIT_STAGES);
            cu_mbar_wait(&sm.full[s], (gs / PFIT_STAGES) & 1u);
            cu_mbar_arrive(&sm.empty[s]);
        }
        return;
    }
    if (it.b0 >= it.b1)
        return;
    const int64_t q0 = (int64_t)it.t0 * p.Hi;
    uint32_t qa[8][4];
    cu_rows_load_q(p.iq, q0 + rw.row_lo, q0 + rw.row_hi, rw.ok_lo, rw.ok_hi, qa);
    float sa[16][4], sb[16][4];
    int32_t c = it.b0;
    cu_pfit_issue<Tag>(sm, gs, qa, sa);
    /* In flight at the top of a round: block c in sa. */
    for (; c + 2 < it.b1; c += 2, gs += 2) {
        cu_pfit_issue<Tag>(sm, gs + 1, qa, sb);
        cu_wgmma_wait_one();
        cu_pfit_finish(p, sm, sa, c, gs, rw, scratch);
        cu_pfit_issue<Tag>(sm, gs + 2, qa, sa);
        cu_wgmma_wait_one();
        cu_pfit_finish(p, sm, sb, c + 1, gs + 1, rw, scratch);
    }
    if (c + 1 < it.b1) {
        cu_pfit_issue<Tag>(sm, gs + 1, qa, sb);
        cu_wgmma_wait_one();
        cu_pfit_finish(p, sm, sa, c, gs, rw, scratch);
        cu_wgmma_wait_all();
        cu_pfit_finish(p, sm, sb, c + 1, gs + 1, rw, scratch);
        gs += 2;
    } else {
        cu_wgmma_wait_all();
        cu_pfit_finish(p, sm, sa, c, gs, rw, scratch);
        gs += 1;
    }
}

template <typename Tag>
__device__ void cu_pfit_consumer(const cu_pfidx_params &p, const cu_pfit_smem_t &sm, int32_t S)
{
    const int warp = threadIdx.x >> 5;
    const cu_pfi_shape sh = {PFIT_CONSUMER_WARPS, CU_PFIT_ROWS, cu_pfit_cache(p.sel_cache)};
    float *scratch = p.scratch + (int64_t)blockIdx.x * CU_PFIT_ROWS * p.cap_blocks;
    uint32_t *wsm = sm.words + warp * cu_pfi_warp_words(p.mi, p.K, p.W, sh.cache);
    uint32_t gs = 0;
    cu_pfi_walk walk;
    cu_pfi_walk_start(p, walk);
    cu_pfi_item it;
    while (cu_pfi_next(p, (int32_t)gridDim.x, S, walk, it)) {
        cu_pfit_scores<Tag>(p, sm, it, scratch, gs);
        /* The workspace rows written (the consumers' barrier orders their
         * memory accesses). */
        cu_named_sync(1, PFIT_CONSUMER_WARPS * 32);
        cu_pfi_select_item(p, sh, it, S, scratch, wsm, sm.last_split,
                           [] { cu_named_sync(1, PFIT_CONSUMER_WARPS * 32); });
        /* Every warp done with the workspace rows and the flag before the
         * next item writes them. */
        cu_named_sync(1, PFIT_CONSUMER_WARPS * 32);
    }
}

#endif /* CU_HAVE_WGMMA */

template <typename Tag>
__global__ void __launch_bounds__(PFIT_THREADS, 1)
    cu_pfit_kernel(const __grid_constant__ cu_pfidx_params p,
                   const __grid_constant__ CUtensorMap map)
{
#ifdef CU_HAVE_WGMMA
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    /* The next kernel (the attention) may be scheduled now: it waits for
     * this grid's end before it reads the sel rows. */
    cu_pdl_trigger();
    cu_pdl_wait(); /* the step's index keys in the cache (prologue) */
    if (p.hdr->n_pf == 0)
        return;
    const int warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        const cu_pfit_smem_t sm = cu_pfit_smem_of(smem_raw);
        for (int s = 0; s < PFIT_STAGES; ++s) {
            cu_mbar_init(&sm.full[s], 1);
            cu_mbar_init(&sm.empty[s], PFIT_EMPTY_ARRIVALS);
        }
        cu_mbar_fence_init();
    }
    if (warp == PFIT_CONSUMER_WARPS && (threadIdx.x & 31) == 0)
        cu_tma_prefetch_map(&map);
    __syncthreads();
    /* Each side computes its state after its register change: nothing is
     * live across it (ptxas would keep such values in local memory). */
    if (warp >= PFIT_CONSUMER_WARPS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PFIT_PRODUCER_REGS));
        if (warp == PFIT_CONSUMER_WARPS)
            cu_pfit_producer(p, cu_pfit_smem_of(smem_raw), &map,
                             cu_pfi_splits(p, (int32_t)gridDim.x));
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(PFIT_CONSUMER_REGS));
        cu_pfit_consumer<Tag>(p, cu_pfit_smem_of(smem_raw), cu_pfi_splits(p, (int32_t)gridDim.x));
    }
#else
    (void)p;
    (void)map;
#endif
}

cudaError_t cu_pfit_setup(size_t smem)
{
    return cu_allow_smem(smem, cu_pfit_kernel<cu_bf16_tag>, cu_pfit_kernel<cu_f16_tag>);
}

void cu_pfit_launch(const cu_pfidx_params *p, int bf16, int num_sms, size_t smem,
                    const CUtensorMap *map, cudaStream_t s, int pdl)
{
    if (bf16)
        cu_launch(cu_pfit_kernel<cu_bf16_tag>, num_sms, PFIT_THREADS, smem, s, pdl, *p, *map);
    else
        cu_launch(cu_pfit_kernel<cu_f16_tag>, num_sms, PFIT_THREADS, smem, s, pdl, *p, *map);
}
