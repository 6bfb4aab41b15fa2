/*
 * Decode indexer, Hopper path: bf16/fp16 index keys with Di = 128 and
 * B = P = 128 (a key block is one page: 32 KB of contiguous rows), at most
 * 64 query columns (q_len x Hi) per request.
 *
 * Work split as in the other indexer paths: the blocks of all decode
 * requests end to end, an equal contiguous share per CTA.  One producer
 * warp looks up the pages of 32 blocks at a time and streams whole blocks
 * through a ring of tensor-map copies; six consumer warps take the blocks in
 * turn, one block each, with no CTA-wide barrier: a block's ring slot is
 * handed back as soon as its warp is done with it.
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

/* One ring slot per consumer warp: block x goes to slot x % IDXT_CONSUMERS
 * and is computed by that slot's warp, so every slot is consumed in order by
 * a single warp and a barrier phase is never waited on a lap early.  While a
 * warp computes, the other slots load. */
#define IDXT_CONSUMERS 6
#define IDXT_STAGES IDXT_CONSUMERS
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

/* Layer values the consumer loops use, in registers (the layer itself is
 * read through a pointer, which the compiler cannot keep in registers
 * across the stores). */
typedef struct cu_idxt_par {
    float *scores;
    int32_t hi_magic, Hi, cap_blocks;
    float iscale;
} cu_idxt_par;

/* n-tiles of query columns a request needs, rounded up to 1, 2, 4 or 8. */
__device__ __forceinline__ int cu_idxt_nr(int32_t nq)
{
    const int nt = (nq + 7) >> 3;
    return nt <= 1 ? 1 : nt <= 2 ? 2 : nt <= 4 ? 4 : 8;
}

/* Query fragments (B operand) of a request's columns: column g of n-tile
 * nt, dimensions ks*16 + 2t (+8).  Columns past nq are zero. */
template <int NR>
__device__ __forceinline__ void cu_idxt_qfrags(const cu_layer &L, int32_t t0, int32_t nq,
                                               uint32_t (&bq)[NR][8][2])
{
    const int lane = threadIdx.x & 31;
    const uint32_t *q = (const uint32_t *)L.iq + (int64_t)t0 * L.Hi * 64;
#pragma unroll
    for (int nt = 0; nt < NR; ++nt) {
        const int col = nt * 8 + (lane >> 2);
        const bool ok = col < nq;
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) {
            bq[nt][ks][0] = ok ? __ldg(q + col * 64 + ks * 8 + (lane & 3)) : 0u;
            bq[nt][ks][1] = ok ? __ldg(q + col * 64 + ks * 8 + 4 + (lane & 3)) : 0u;
        }
    }
}

/* acc[i] += keys of m-tile mt x query n-tiles, MT m-tiles at once (their
 * accumulation chains interleave in the tensor pipe). */
template <typename Tag, int NR, int MT>
__device__ __forceinline__ void cu_idxt_mma(uint32_t stage, int mt0, const uint32_t (&bq)[NR][8][2],
                                            float (&acc)[MT][NR][4])
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int nt = 0; nt < NR; ++nt)
            acc[i][nt][0] = acc[i][nt][1] = acc[i][nt][2] = acc[i][nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            uint32_t a0, a1, a2, a3;
            const int row = (mt0 + i) * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
            cu_ldsm_x4(stage + cu_tswz(128, row, 2 * ks + (lane >> 4)), a0, a1, a2, a3);
#pragma unroll
            for (int nt = 0; nt < NR; ++nt)
                cu_mma16816(acc[i][nt], a0, a1, a2, a3, bq[nt][ks][0], bq[nt][ks][1], Tag());
        }
    }
}

/* Running block score of the thread's keys for its query columns: max
 * (with a NaN flag: fmaxf drops NaN, and a NaN key poisons the block, SPEC
 * 4) or a log-sum-exp state. */
template <int NR, bool LSE>
struct cu_idxt_acc {
    float m[NR][2], l[NR][2];
    bool nan[NR][2];
};

/* Folds the m-tiles [mt0, mt0 + MT) of this block into the score state;
 * MASK: keys past a token's position are dropped. */
template <typename Tag, int NR, int MT, bool LSE, bool MASK>
__device__ __forceinline__ void cu_idxt_fold(uint32_t stage, int mt0, const uint32_t (&bq)[NR][8][2],
                                             cu_idxt_acc<NR, LSE> &st, int32_t key0, int32_t base,
                                             int32_t hi_magic, float iscale)
{
    const int lane = threadIdx.x & 31;
    float acc[MT][NR][4];
    cu_idxt_mma<Tag, NR, MT>(stage, mt0, bq, acc);
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        const int32_t pos_lo = key0 + (mt0 + i) * 16 + (lane >> 2);
        const int32_t pos_hi = pos_lo + 8;
#pragma unroll
        for (int nt = 0; nt < NR; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float xlo = acc[i][nt][e], xhi = acc[i][nt][2 + e];
                bool vlo = true, vhi = true;
                if (MASK) {
                    const int32_t col = nt * 8 + 2 * (lane & 3) + e;
                    const int32_t last = base + ((col * hi_magic) >> 16); /* col / Hi */
                    vlo = pos_lo <= last;
                    vhi = pos_hi <= last;
                }
                if (LSE) {
                    if (vlo)
                        cu_lse_merge(st.m[nt][e], st.l[nt][e], xlo * iscale, 1.0f);
                    if (vhi)
                        cu_lse_merge(st.m[nt][e], st.l[nt][e], xhi * iscale, 1.0f);
                } else {
                    xlo = vlo ? xlo : -INFINITY;
                    xhi = vhi ? xhi : -INFINITY;
                    st.m[nt][e] = fmaxf(st.m[nt][e], fmaxf(xlo, xhi));
                    st.nan[nt][e] = st.nan[nt][e] || isnan(xlo) || isnan(xhi);
                }
            }
        }
    }
}

/* Scores of one block against NR n-tiles of query columns. */
template <typename Tag, int NR, bool LSE>
__device__ __forceinline__ void cu_idxt_block(const cu_idxt_par &P, uint32_t stage,
                                              const uint32_t (&bq)[NR][8][2], int32_t key0,
                                              int32_t base, int32_t nq, int64_t score_row0,
                                              int32_t n)
{
    constexpr int MT = NR >= 8 ? 1 : 2;
    const int lane = threadIdx.x & 31;
    cu_idxt_acc<NR, LSE> st;
#pragma unroll
    for (int nt = 0; nt < NR; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
            st.m[nt][e] = -INFINITY, st.l[nt][e] = 0.0f, st.nan[nt][e] = false;
    if (key0 + 127 <= base) {
        /* Every key of the block visible to every token: no masks. */
#pragma unroll 1
        for (int mt = 0; mt < 8; mt += MT)
            cu_idxt_fold<Tag, NR, MT, LSE, false>(stage, mt, bq, st, key0, base, P.hi_magic, P.iscale);
    } else {
#pragma unroll 1
        for (int mt = 0; mt < 8; mt += MT)
            cu_idxt_fold<Tag, NR, MT, LSE, true>(stage, mt, bq, st, key0, base, P.hi_magic, P.iscale);
    }
    /* Across the eight key rows of the lanes (lane >> 2), then write. */
#pragma unroll
    for (int nt = 0; nt < NR; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            float m = st.m[nt][e], l = st.l[nt][e];
            if (!LSE && st.nan[nt][e])
                m = __int_as_float(0x7fc00000);
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) {
                const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
                if (LSE)
                    cu_lse_merge(m, l, m2, __shfl_xor_sync(0xffffffffu, l, o));
                else
                    m = cu_nanmax(m, m2);
            }
            const int32_t col = nt * 8 + 2 * (lane & 3) + e;
            if (lane < 4 && col < nq) {
                const int32_t tok = (col * P.hi_magic) >> 16;
                const int32_t h = col - tok * P.Hi;
                P.scores[(score_row0 + (int64_t)tok * P.Hi + h) * P.cap_blocks + n] =
                    LSE ? cu_lse_value(m, l) : m;
            }
        }
    }
}

/* This warp's blocks i, i + IDXT_CONSUMERS, ... while their requests need
 * NR n-tiles; returns the first block that needs another NR (or F). */
template <typename Tag, int NR, bool LSE>
__device__ __noinline__ int32_t cu_idxt_run(const cu_layer &L, unsigned char *ring, uint64_t *full,
                               uint64_t *empty, int32_t gb_begin, int32_t F, int32_t n_dec,
                               int32_t i, int32_t &kslot)
{
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    uint32_t bq[NR][8][2];
    int32_t k = -1;
    cu_dec_info di = L.m.dec_info[kslot];
    cu_idxt_par P;
    P.scores = L.scores;
    P.hi_magic = L.hi_magic;
    P.Hi = L.Hi;
    P.cap_blocks = L.cap_blocks;
    P.iscale = L.iscale;
    for (; i < F; i += IDXT_CONSUMERS) {
        const int32_t gb = gb_begin + i;
        if (gb >= di.blk1) {
            kslot = cu_idxt_slot(L, kslot, n_dec, gb);
            di = L.m.dec_info[kslot];
        }
        const int32_t nq = di.ql * L.Hi;
        if (kslot != k) {
            if (cu_idxt_nr(nq) != NR)
                return i;
            k = kslot;
            cu_idxt_qfrags<NR>(L, di.t0, nq, bq);
        }
        const int32_t use = i / IDXT_CONSUMERS;
        cu_mbar_wait(&full[warp], (uint32_t)use & 1u);
        const int32_t n = gb - di.blk0;
        const uint32_t st = cu_smem_addr(ring + warp * IDXT_BLOCK_BYTES);
        cu_idxt_block<Tag, NR, LSE>(P, st, bq, n * 128, di.kl - di.ql, nq, (int64_t)di.d0 * P.Hi, n);
        __syncwarp();
        if (lane == 0)
            cu_mbar_arrive(&empty[warp]);
    }
    return i;
}

template <typename Tag, bool LSE>
__device__ void cu_idxt_consumer(const cu_layer &L, unsigned char *ring, uint64_t *full,
                                 uint64_t *empty, int32_t gb_begin, int32_t F, int32_t n_dec)
{
    const int warp = threadIdx.x >> 5;
    int32_t kslot = cu_dec_of_block(L.m.dec_blk0, n_dec, gb_begin);
    int32_t i = warp;
    while (i < F) {
        kslot = cu_idxt_slot(L, kslot, n_dec, gb_begin + i);
        switch (cu_idxt_nr(L.m.dec_info[kslot].ql * L.Hi)) {
        case 1:
            i = cu_idxt_run<Tag, 1, LSE>(L, ring, full, empty, gb_begin, F, n_dec, i, kslot);
            break;
        case 2:
            i = cu_idxt_run<Tag, 2, LSE>(L, ring, full, empty, gb_begin, F, n_dec, i, kslot);
            break;
        case 4:
            i = cu_idxt_run<Tag, 4, LSE>(L, ring, full, empty, gb_begin, F, n_dec, i, kslot);
            break;
        default:
            i = cu_idxt_run<Tag, 8, LSE>(L, ring, full, empty, gb_begin, F, n_dec, i, kslot);
            break;
        }
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
                const int32_t use = x / IDXT_STAGES;
                if (use > 0)
                    cu_mbar_wait(&empty[s], (uint32_t)(use - 1) & 1u);
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
    cu_indexer_tma_kernel(const __grid_constant__ cu_layer L, const __grid_constant__ CUtensorMap map)
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
    else if (L.score_lse)
        cu_idxt_consumer<Tag, true>(L, ring, full, empty, gb_begin, F, n_dec);
    else
        cu_idxt_consumer<Tag, false>(L, ring, full, empty, gb_begin, F, n_dec);
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
    return cu_allow_smem(IDXT_SMEM_BYTES, cu_indexer_tma_kernel<cu_bf16_tag>,
                         cu_indexer_tma_kernel<cu_f16_tag>);
}
