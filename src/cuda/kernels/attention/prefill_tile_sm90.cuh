/*
 * The pieces of the Hopper prefill attention kernels that work on one key
 * block (one page of 128 keys of one KV head, K and V brought by
 * tensor-map copies): the block's copy, S = Q K^T for a consumer
 * warpgroup's 64 rows, the masked online softmax step and O += P V.
 * attention_prefill_tma_sm90 (query tiles over the union of their blocks)
 * and attention_prefill_kbm_sm90 (one block against the queries that
 * selected it) share them.
 */
#ifndef MSA_PREFILL_TILE_SM90_CUH
#define MSA_PREFILL_TILE_SM90_CUH

#include "cuda/arch/tma_sm90.cuh"
#include "cuda/arch/wgmma_sm90.cuh"
#include "cuda/kernels/attention/rows_mma.cuh"

/* The tile shapes: a key block is one page of PFH_KEYS rows of one KV
 * head, each row PFH_HEAD_DIM 16-bit values; the tensor maps copy boxes of
 * PFH_BOX_ROWS rows x PFH_BOX_COLS columns (128-byte swizzle: a box row is
 * one swizzle row); a consumer warpgroup owns PFH_GROUP_ROWS rows (the M of
 * its warpgroup products). */
#define PFH_HEAD_DIM 128
#define PFH_KEYS 128
#define PFH_ROW_BYTES (PFH_HEAD_DIM * 2)
#define PFH_BOX_COLS 64
#define PFH_BOX_ROWS 64
#define PFH_BOX_ROW_BYTES (PFH_BOX_COLS * 2)
#define PFH_BOX_BYTES (PFH_BOX_ROWS * PFH_BOX_ROW_BYTES)
#define PFH_TILE_BYTES (PFH_KEYS * PFH_ROW_BYTES) /* K or V of one block */
#define PFH_GROUP_ROWS 64
static_assert(PFH_BOX_ROW_BYTES == 128, "a box row is one row of the 128-byte swizzle");
static_assert(PFH_HEAD_DIM == 2 * PFH_BOX_COLS && PFH_KEYS == 2 * PFH_BOX_ROWS,
              "a page is four boxes: two column halves of two row halves");

#ifdef CU_HAVE_WGMMA

/* The four boxes of one [128][128] page (the rows of `page` for KV head
 * `head`) into a slot half: columns 0-63 in its first 16 KB (rows 0-63,
 * then 64-127), columns 64-127 in the next.  No cache hint: a dense item's
 * pages are read again by every later tile of the request. */
__device__ __forceinline__ void cu_pfh_load_page(uint32_t dst, const CUtensorMap *map, int32_t page,
                                                 int32_t head, uint64_t *bar)
{
#pragma unroll
    for (int b = 0; b < 4; ++b)
        cu_tma_load_rows(dst + (uint32_t)b * PFH_BOX_BYTES, map, (b >> 1) * PFH_BOX_COLS,
                         (b & 1) * PFH_BOX_ROWS, head, page, bar);
}

/* Issues S = Q K^T for the group's 64 rows against the block's 128 keys
 * (K-major in the slot: dimensions 0-63 in the first 16 KB, 64-127 in the
 * next) as one committed group of products; sc is theirs until a wait. */
template <typename Tag>
__device__ __forceinline__ void cu_pfh_qk_issue(uint32_t ka, const uint32_t (&qa)[8][4],
                                                float (&sc)[16][4])
{
    cu_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
        const uint32_t at =
            ka + (uint32_t)(ks >> 2) * (PFH_TILE_BYTES / 2) + (uint32_t)(ks & 3) * 32u;
        cu_wgmma_m64n128k16<0>(sc, qa[ks], cu_wgmma_desc(at, 16), ks > 0, Tag());
    }
    cu_wgmma_commit();
}

/* The weights rounded to the 16-bit type: the S accumulators' layout is
 * the A fragments' already. */
template <typename Tag>
__device__ __forceinline__ void cu_pfh_pack_p(const float (&pw)[16][4], uint32_t (&pa)[8][4])
{
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
        pa[kk][0] = cu_pack2(pw[2 * kk][0], pw[2 * kk][1], Tag());
        pa[kk][1] = cu_pack2(pw[2 * kk][2], pw[2 * kk][3], Tag());
        pa[kk][2] = cu_pack2(pw[2 * kk + 1][0], pw[2 * kk + 1][1], Tag());
        pa[kk][3] = cu_pack2(pw[2 * kk + 1][2], pw[2 * kk + 1][3], Tag());
    }
}

/* Keeps the compiler from reusing the registers of A fragments that an
 * issued product still reads (until its wait). */
__device__ __forceinline__ void cu_pfh_hold_a(uint32_t (&pa)[8][4])
{
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
        asm volatile(""
                     : "+r"(pa[kk][0]), "+r"(pa[kk][1]), "+r"(pa[kk][2]),
                       "+r"(pa[kk][3])::"memory");
}

/* Issues O += P V (ADD) or O = P V as one committed group of products, V
 * read MN-major: 16 keys per step (2048 bytes), dimensions 64-127 16 KB
 * after 0-63.  o and pa are the products' until a wait. */
template <typename Tag, bool ADD = true>
__device__ __forceinline__ void cu_pfh_pv_issue(uint32_t va, const uint32_t (&pa)[8][4],
                                                float (&o)[16][4])
{
    cu_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
        cu_wgmma_m64n128k16<1>(o, pa[kk],
                               cu_wgmma_desc(va + (uint32_t)kk * 2048u, PFH_TILE_BYTES / 2),
                               ADD || kk > 0, Tag());
    cu_wgmma_commit();
}

/* O += P V (ADD) or O = P V from the weights pw, waited for. */
template <typename Tag, bool ADD = true>
__device__ __forceinline__ void cu_pfh_pv(uint32_t va, const float (&pw)[16][4], float (&o)[16][4])
{
    uint32_t pa[8][4];
    cu_pfh_pack_p<Tag>(pw, pa);
    cu_pfh_pv_issue<Tag, ADD>(va, pa, o);
    cu_wgmma_wait_all();
    cu_wgmma_hold(o);
}

/* The block's 128 scores of the thread's two rows with the keys after
 * lim_lo (lim_hi) set to -inf: j <= lim counts for the low (high) row,
 * lim -1 none. */
__device__ __forceinline__ void cu_pfh_mask(float (&sc)[16][4], int32_t lim_lo, int32_t lim_hi)
{
    const int lane = threadIdx.x & 31;
    if (min(lim_lo, lim_hi) < PFH_KEYS - 1) {
#pragma unroll
        for (int n = 0; n < 16; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int32_t j = n * 8 + 2 * (lane & 3) + e;
                sc[n][e] = j <= lim_lo ? sc[n][e] : -INFINITY;
                sc[n][2 + e] = j <= lim_hi ? sc[n][2 + e] : -INFINITY;
            }
        }
    }
}

/* The block's scores into weights: keys j <= lim_lo (lim_hi) count for the
 * thread's low (high) row (lim -1: none), the scale sl2 (log2 units, > 0)
 * applied inside the exponent; running max, sum and O's scale updated. */
__device__ __forceinline__ void cu_pfh_softmax(float (&sc)[16][4], int32_t lim_lo, int32_t lim_hi,
                                               float sl2, float (&o)[16][4], float &m_lo,
                                               float &m_hi, float &l_lo, float &l_hi)
{
    cu_pfh_mask(sc, lim_lo, lim_hi);
    cu_rows_softmax_scaled<16>(sc, sl2, o, m_lo, m_hi, l_lo, l_hi);
}

#endif /* CU_HAVE_WGMMA */

#endif /* MSA_PREFILL_TILE_SM90_CUH */
