/*
 * Prefill indexer and selection on Hopper: tensor-map copies of whole index
 * key pages, two consumer warpgroups of warpgroup products.  See the header
 * for where it applies and docs/PREFILL_INDEXER.md for the design.
 *
 * One CTA per SM walks the same (tile, split) items as the portable kernel
 * (cu_pfi_next), with tiles of CU_PFIT_ROWS rows (row = token x Hi + head:
 * 32 tokens of M3's four index heads).  Nine warps:
 *   warp 8      the producer: for each block the item reaches (a block is
 *               one page of 128 keys), waits for a free ring slot and
 *               copies the page's index keys into it (two boxes of 64
 *               columns x 128 rows, 128-byte swizzle);
 *   warps 0-7   two consumer warpgroups, group h owning tile rows
 *               64h .. 64h + 63, their queries in registers for the item.
 *               Per block: S = Q K^T for each half of its keys as 8
 *               wgmma.m64n64k16 (keys as N, read from the slot), both
 *               halves issued together; the first half's causal mask,
 *               score scale and max or log-sum-exp (cu_pfi_reduce) run
 *               while the second half's products do; the slot is handed
 *               back as soon as those end; the block score goes to the
 *               CTA's workspace rows.  After the item's blocks the eight
 *               warps select (or keep a split's candidates and merge), as
 *               the portable kernel does.
 * Every key page is read once per tile of 128 rows (twice the rows of the
 * portable kernel's tiles), the copies run ahead of the products by the
 * ring's depth, and while one consumer group reduces its scores the other's
 * products run.
 */
#include "cuda/kernels/indexer/indexer_prefill_tma_sm90.cuh"
#include "cuda/kernels/indexer/indexer_prefill.cuh"
#include "cuda/kernels/attention/rows_mma.cuh"
#include "cuda/arch/tma_sm90.cuh"

#define PFIT_CONSUMER_WARPS 8
/* Nine warps and no register reallocation (setmaxnreg works per
 * warpgroup, and the producer is one warp): nine warps are three per SM
 * sub-partition, which caps every thread at 168 registers; the consumers
 * use them (their queries, two halves of a page's scores, the selection). */
#define PFIT_THREADS ((PFIT_CONSUMER_WARPS + 1) * 32)
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

/* Starts S = Q K^T for the group's 64 rows against keys 64h .. 64h + 63
 * of the slot (rows 64h on of each box), one committed group of products;
 * the caller waits for it (cu_wgmma_wait_one / _all, then cu_wgmma_hold).
 * Products of 64 keys, not 128, keep a thread's scores of one half at 32
 * registers: both halves and the queries in registers stay within the 168
 * registers that three warps of a CTA of nine per SM sub-partition leave. */
template <typename Tag>
__device__ __forceinline__ void cu_pfit_qk(uint32_t ka, int h, const uint32_t (&qa)[8][4],
                                           float (&sc)[8][4])
{
    const uint32_t kh = ka + (uint32_t)h * (PFIT_KEYS / 2) * 128u;
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
        const uint32_t at = kh + (uint32_t)(ks >> 2) * PFIT_BOX_BYTES + (uint32_t)(ks & 3) * 32u;
        if (ks == 0)
            cu_wgmma_m64n64k16_first(sc, qa[ks], cu_wgmma_desc(at, 16), Tag());
        else
            cu_wgmma_m64n64k16(sc, qa[ks], cu_wgmma_desc(at, 16), 1, Tag());
    }
    cu_wgmma_commit();
}

/* One half's scores (keys k0 .. k0 + 63) into the rows' running states. */
__device__ __forceinline__ void cu_pfit_reduce_half(const cu_pfidx_params &p,
                                                    const float (&acc)[8][4], int32_t k0,
                                                    int32_t pos_lo, int32_t pos_hi, bool full,
                                                    float &m_lo, float &l_lo, float &m_hi,
                                                    float &l_hi)
{
    if (p.score_lse) {
        cu_pfi_reduce<true>(acc, 0, k0, pos_lo, full, p.iscale, m_lo, l_lo);
        cu_pfi_reduce<true>(acc, 1, k0, pos_hi, full, p.iscale, m_hi, l_hi);
    } else {
        cu_pfi_reduce<false>(acc, 0, k0, pos_lo, full, p.iscale, m_lo, l_lo);
        cu_pfi_reduce<false>(acc, 1, k0, pos_hi, full, p.iscale, m_hi, l_hi);
    }
}

/* The block scores of the item's blocks [b0, b1) for this thread's rows
 * into the CTA's workspace rows.  gs: the ring position (the consumers
 * and the producer count the same blocks). */
template <typename Tag>
__device__ __forceinline__ void cu_pfit_scores(const cu_pfidx_params &p, const cu_pfit_smem_t &sm,
                                               const cu_pfi_item &it, float *scratch, uint32_t &gs)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int wg = warp >> 2;
    const int32_t nrow = it.ntok * p.Hi;
    const int32_t row_lo = warp * 16 + (lane >> 2), row_hi = row_lo + 8;
    const bool ok_lo = row_lo < nrow, ok_hi = row_hi < nrow;
    const int32_t pos_lo = it.base + row_lo / p.Hi, pos_hi = it.base + row_hi / p.Hi;
    /* Whether the group has rows (uniform over the group: its products
     * are collective), and the position of its first token. */
    const bool active = wg * PFIT_GROUP_ROWS < nrow;
    const int32_t pos_first = it.base + (wg * PFIT_GROUP_ROWS) / p.Hi;
    const int64_t q0 = (int64_t)it.t0 * p.Hi;
    uint32_t qa[8][4];
    cu_rows_load_q(p.iq, q0 + row_lo, q0 + row_hi, ok_lo, ok_hi, qa);
    for (int32_t c = it.b0; c < it.b1; ++c, ++gs) {
        const int s = (int)(gs % PFIT_STAGES);
        const uint32_t par = (gs / PFIT_STAGES) & 1u;
        cu_mbar_wait(&sm.full[s], par);
        if (!active) {
            cu_mbar_arrive(&sm.empty[s]);
            continue;
        }
        const uint32_t ka = cu_smem_addr(sm.ring + s * PFIT_STAGE_BYTES);
        /* The whole block visible to the group's first (so every) row. */
        const int32_t key0 = c * PFIT_KEYS;
        const bool full = key0 + PFIT_KEYS - 1 <= pos_first;
        float m_lo = -INFINITY, l_lo = 0.0f, m_hi = -INFINITY, l_hi = 0.0f;
        /* Both halves' products issued, the first half reduced while the
         * second's run on the tensor cores. */
        float acc0[8][4], acc1[8][4];
        cu_wgmma_fence();
        cu_pfit_qk<Tag>(ka, 0, qa, acc0);
        cu_pfit_qk<Tag>(ka, 1, qa, acc1);
        cu_wgmma_wait_one();
        cu_wgmma_hold(acc0);
        cu_pfit_reduce_half(p, acc0, key0, pos_lo, pos_hi, full, m_lo, l_lo, m_hi, l_hi);
        cu_wgmma_wait_all();
        cu_wgmma_hold(acc1);
        cu_mbar_arrive(&sm.empty[s]); /* the products have read the slot */
        cu_pfit_reduce_half(p, acc1, key0 + PFIT_KEYS / 2, pos_lo, pos_hi, full, m_lo, l_lo, m_hi,
                            l_hi);
        if (p.score_lse) {
            m_lo = cu_lse_value(m_lo, l_lo);
            m_hi = cu_lse_value(m_hi, l_hi);
        }
        if ((lane & 3) == 0) {
            if (ok_lo)
                scratch[(int64_t)row_lo * p.cap_blocks + c] = m_lo;
            if (ok_hi)
                scratch[(int64_t)row_hi * p.cap_blocks + c] = m_hi;
        }
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
    const int32_t S = cu_pfi_splits(p, (int32_t)gridDim.x);
    if (warp == PFIT_CONSUMER_WARPS)
        cu_pfit_producer(p, cu_pfit_smem_of(smem_raw), &map, S);
    else
        cu_pfit_consumer<Tag>(p, cu_pfit_smem_of(smem_raw), S);
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
