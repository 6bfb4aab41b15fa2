/*
 * Decode indexer, Hopper path: bf16/fp16 index keys with Di = 128 and
 * B = P = 128 (a key block is one page: 32 KB of contiguous rows), at most
 * 64 query columns (q_len x Hi) per request.
 *
 * Work split as in the other indexer paths: the blocks of all decode
 * requests end to end, an equal contiguous share per CTA.  One producer
 * warp looks up the pages of 32 blocks at a time and streams whole blocks
 * through a ring of IDXT_STAGES tensor-map copies; four consumer warps take
 * the blocks in turn, one block each, with no CTA-wide barrier: a block's
 * ring slot is handed back as soon as its warp is done with it.
 *
 * A consumer multiplies its block (128 keys, the MMA's M side, eight m16
 * tiles) with every query column of the block's request (the N side, held
 * in registers while the warp stays in one request), so each index key is
 * read from memory once for all tokens and index heads.  Products of 16-bit
 * values are exact in fp32 and accumulate in fp32.  The block max (or
 * log-sum-exp) is reduced in registers and across the warp's lanes, and
 * written straight to the score rows.
 *
 * The summation order over the 128 dimensions does not matter to the MMA
 * (the same permutation applies to keys and queries), so queries load as
 * plain 32-bit words without a staging tile.
 */
#include "cu_plan.cuh"
#include "cu_tma.cuh"
#include "cu_launch.cuh"

#define IDXT_STAGES 6
#define IDXT_CONSUMERS 4
#define IDXT_THREADS ((IDXT_CONSUMERS + 1) * 32)
#define IDXT_BLOCK_BYTES (128 * 256)
#define IDXT_SMEM_BYTES (IDXT_STAGES * IDXT_BLOCK_BYTES + 1024 + 2 * IDXT_STAGES * 8)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

/* The decode slot of block gb, walking forward from slot k. */
__device__ __forceinline__ int32_t cu_idxt_slot(const cu_layer &L, int32_t k, int32_t n_dec,
                                                int32_t gb)
{
    while (k + 1 < n_dec && L.m.dec_blk0[k + 1] <= gb)
        ++k;
    return k;
}

/* Query fragments (B operand) of a request's nq columns: column g of n-tile
 * nt, dimensions ks*16 + 2t (+8).  Columns past nq are zero. */
__device__ __forceinline__ void cu_idxt_qfrags(const cu_layer &L, int32_t t0, int32_t nq,
                                               uint32_t (&bq)[8][8][2])
{
    const int lane = threadIdx.x & 31;
    const uint32_t *q = (const uint32_t *)L.iq + (int64_t)t0 * L.Hi * 64;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        const int col = nt * 8 + (lane >> 2);
        const bool ok = col < nq;
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) {
            bq[nt][ks][0] = ok ? __ldg(q + col * 64 + ks * 8 + (lane & 3)) : 0u;
            bq[nt][ks][1] = ok ? __ldg(q + col * 64 + ks * 8 + 4 + (lane & 3)) : 0u;
        }
    }
}

/* Scores of one block against NR n-tiles of query columns. */
template <typename Tag, int NR>
__device__ __forceinline__ void cu_idxt_block(const cu_layer &L, uint32_t stage,
                                              const uint32_t (&bq)[8][8][2], int32_t key0,
                                              int32_t base, int32_t nq, int64_t score_row0,
                                              int32_t n)
{
    const int lane = threadIdx.x & 31;
    /* Every key of the block visible to every token: no masks. */
    const bool whole = key0 + 127 <= base;
    float cm[NR][2], cl[NR][2];
#pragma unroll
    for (int nt = 0; nt < NR; ++nt)
        cm[nt][0] = cm[nt][1] = -INFINITY, cl[nt][0] = cl[nt][1] = 0.0f;
#pragma unroll 2
    for (int mt = 0; mt < 8; ++mt) {
        float acc[NR][4];
#pragma unroll
        for (int nt = 0; nt < NR; ++nt)
            acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) {
            uint32_t a0, a1, a2, a3;
            const int row = mt * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
            cu_ldsm_x4(stage + cu_tswz(128, row, 2 * ks + (lane >> 4)), a0, a1, a2, a3);
#pragma unroll
            for (int nt = 0; nt < NR; ++nt)
                cu_mma16816(acc[nt], a0, a1, a2, a3, bq[nt][ks][0], bq[nt][ks][1], Tag());
        }
        const int32_t pos_lo = key0 + mt * 16 + (lane >> 2);
        const int32_t pos_hi = pos_lo + 8;
#pragma unroll
        for (int nt = 0; nt < NR; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int32_t col = nt * 8 + 2 * (lane & 3) + e;
                const int32_t tok = (col * L.hi_magic) >> 16; /* col / Hi, col < 64 */
                const bool vlo = whole || pos_lo <= base + tok;
                const bool vhi = whole || pos_hi <= base + tok;
                if (L.score_lse) {
                    if (vlo)
                        cu_lse_merge(cm[nt][e], cl[nt][e], acc[nt][e] * L.iscale, 1.0f);
                    if (vhi)
                        cu_lse_merge(cm[nt][e], cl[nt][e], acc[nt][2 + e] * L.iscale, 1.0f);
                } else {
                    cm[nt][e] = cu_nanmax(cm[nt][e], cu_nanmax(vlo ? acc[nt][e] : -INFINITY,
                                                               vhi ? acc[nt][2 + e] : -INFINITY));
                }
            }
        }
    }
    /* Across the eight key rows of the lanes (lane >> 2), then write. */
#pragma unroll
    for (int nt = 0; nt < NR; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            float m = cm[nt][e], l = cl[nt][e];
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) {
                const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
                const float l2 = __shfl_xor_sync(0xffffffffu, l, o);
                if (L.score_lse)
                    cu_lse_merge(m, l, m2, l2);
                else
                    m = cu_nanmax(m, m2);
            }
            const int32_t col = nt * 8 + 2 * (lane & 3) + e;
            if (lane < 4 && col < nq) {
                const int32_t tok = (col * L.hi_magic) >> 16;
                const int32_t h = col - tok * L.Hi;
                L.scores[(score_row0 + (int64_t)tok * L.Hi + h) * L.cap_blocks + n] =
                    L.score_lse ? cu_lse_value(m, l) : m;
            }
        }
    }
}

template <typename Tag>
__device__ void cu_idxt_consumer(const cu_layer &L, unsigned char *ring, uint64_t *full,
                                 uint64_t *empty, int32_t gb_begin, int32_t F, int32_t n_dec)
{
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    uint32_t bq[8][8][2];
    int32_t k = -1;
    int32_t kslot = cu_dec_of_block(L.m.dec_blk0, n_dec, gb_begin);
    cu_dec_info di = L.m.dec_info[kslot];
    int32_t nq = 0;
    for (int32_t i = warp; i < F; i += IDXT_CONSUMERS) {
        const int32_t gb = gb_begin + i;
        if (gb >= di.blk1) {
            kslot = cu_idxt_slot(L, kslot, n_dec, gb);
            di = L.m.dec_info[kslot];
        }
        if (kslot != k) {
            k = kslot;
            nq = di.ql * L.Hi;
            cu_idxt_qfrags(L, di.t0, nq, bq);
        }
        const int s = i % IDXT_STAGES;
        cu_mbar_wait(&full[s], (uint32_t)(i / IDXT_STAGES) & 1u);
        const int32_t n = gb - di.blk0;
        const uint32_t st = cu_smem_addr(ring + s * IDXT_BLOCK_BYTES);
        const int32_t base = di.kl - di.ql;
        const int64_t row0 = (int64_t)di.d0 * L.Hi;
        const int nt = (nq + 7) >> 3;
        if (nt <= 1)
            cu_idxt_block<Tag, 1>(L, st, bq, n * 128, base, nq, row0, n);
        else if (nt <= 2)
            cu_idxt_block<Tag, 2>(L, st, bq, n * 128, base, nq, row0, n);
        else if (nt <= 4)
            cu_idxt_block<Tag, 4>(L, st, bq, n * 128, base, nq, row0, n);
        else
            cu_idxt_block<Tag, 8>(L, st, bq, n * 128, base, nq, row0, n);
        __syncwarp();
        if (lane == 0)
            cu_mbar_arrive(&empty[s]);
    }
}

__device__ void cu_idxt_producer(const cu_layer &L, const CUtensorMap *map, unsigned char *ring,
                                 uint64_t *full, uint64_t *empty, int32_t gb_begin, int32_t F,
                                 int32_t n_dec)
{
    const int lane = threadIdx.x & 31;
    int32_t k = cu_dec_of_block(L.m.dec_blk0, n_dec, gb_begin);
    for (int32_t c0 = 0; c0 < F; c0 += 32) {
        /* Pages of the next 32 blocks, one lane each. */
        int32_t page = 0;
        const int32_t i = c0 + lane;
        if (i < F) {
            const int32_t gb = gb_begin + i;
            const int32_t kk = cu_idxt_slot(L, k, n_dec, gb);
            const cu_dec_info di = L.m.dec_info[kk];
            page = L.m.page_table[(int64_t)di.r * L.cap_pages + (gb - di.blk0)];
        }
        k = cu_idxt_slot(L, k, n_dec, gb_begin + min(c0 + 31, F - 1));
        const int32_t cnt = min(32, F - c0);
        for (int32_t j = 0; j < cnt; ++j) {
            const int32_t pg = __shfl_sync(0xffffffffu, page, j);
            if (lane == 0) {
                const int32_t x = c0 + j;
                const int s = x % IDXT_STAGES;
                if (x >= IDXT_STAGES)
                    cu_mbar_wait(&empty[s], (uint32_t)(x / IDXT_STAGES - 1) & 1u);
                unsigned char *dst = ring + s * IDXT_BLOCK_BYTES;
                cu_mbar_arrive_tx(&full[s], IDXT_BLOCK_BYTES);
                cu_tma_load2d(dst, map, 0, pg * 128, &full[s]);
                cu_tma_load2d(dst + IDXT_BLOCK_BYTES / 2, map, 64, pg * 128, &full[s]);
            }
            __syncwarp();
        }
    }
}

#endif /* sm_90+ */

template <typename Tag>
__global__ void __launch_bounds__(IDXT_THREADS, 1)
    cu_indexer_tma_kernel(cu_layer L, const __grid_constant__ CUtensorMap map)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *ring =
        (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023); /* swizzle atoms */
    uint64_t *full = (uint64_t *)(ring + IDXT_STAGES * IDXT_BLOCK_BYTES);
    uint64_t *empty = full + IDXT_STAGES;
    const int warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        for (int s = 0; s < IDXT_STAGES; ++s) {
            cu_mbar_init(&full[s], 1);
            cu_mbar_init(&empty[s], 1);
        }
        cu_mbar_fence_init();
        cu_tma_prefetch_map(&map);
    }
    __syncthreads();
    /* The prologue wrote this step's index keys: wait for it. */
    cu_pdl_wait();
    cu_pdl_trigger();
    const int32_t n_dec = L.m.hdr->n_dec;
    const int64_t total = L.m.hdr->total_dec_blocks;
    if (n_dec == 0 || total == 0)
        return;
    const int32_t gb_begin = (int32_t)(total * blockIdx.x / gridDim.x);
    const int32_t gb_end = (int32_t)(total * (blockIdx.x + 1) / gridDim.x);
    const int32_t F = gb_end - gb_begin;
    if (F == 0)
        return;
    if (warp == IDXT_CONSUMERS)
        cu_idxt_producer(L, &map, ring, full, empty, gb_begin, F, n_dec);
    else
        cu_idxt_consumer<Tag>(L, ring, full, empty, gb_begin, F, n_dec);
#else
    (void)L;
    (void)map;
#endif
}

void cu_launch_indexer_tma(const cu_layer *L, const cu_plan_state *st, const CUtensorMap *map,
                           cudaStream_t s)
{
    if (L->act == MSA_DTYPE_BF16)
        cu_launch(cu_indexer_tma_kernel<cu_bf16_tag>, st->num_sms, IDXT_THREADS, IDXT_SMEM_BYTES, s,
                  st->pdl, *L, *map);
    else
        cu_launch(cu_indexer_tma_kernel<cu_f16_tag>, st->num_sms, IDXT_THREADS, IDXT_SMEM_BYTES, s,
                  st->pdl, *L, *map);
}

cudaError_t cu_indexer_tma_setup(void)
{
    cudaError_t e = cudaFuncSetAttribute(cu_indexer_tma_kernel<cu_bf16_tag>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, IDXT_SMEM_BYTES);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(cu_indexer_tma_kernel<cu_f16_tag>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, IDXT_SMEM_BYTES);
    return e;
}
