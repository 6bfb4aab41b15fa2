/*
 * Decode indexer, tensor-core path: bf16/fp16 index keys and queries,
 * Di = 128, B a multiple of 64, at most 4 index heads.
 *
 * Work split as in the portable path: the blocks of all decode requests end
 * to end, an equal contiguous share per CTA.  Each 64-key tile of index keys
 * is streamed once through a 3-stage cp.async ring and multiplied with all
 * query columns of its request (q_len x Hi <= 64: every token and index head
 * at once) with the keys on the MMA's M side, so even a single query column
 * wastes only half an n-tile.  Products of 16-bit values are exact in fp32
 * and accumulate in fp32.  Block max (or log-sum-exp) is fused: per-warp
 * column reductions, then a running state across the tiles of a block.
 *
 * Quantized index keys (variants CU_PLANE_FP8 and CU_PLANE_NVFP4, 16-bit
 * queries): the ring holds the code rows as the plane stores them (fp8:
 * 128 bytes a key; nvfp4: 64 bytes of codes and the key's 8 group-scale
 * bytes), and each warp widens its keys' codes to the 16-bit type as it
 * builds the A fragments (quant_widen.cuh: every E4M3 value, and every
 * E2M1 code times its E4M3 group scale, is exact in bf16 and in fp16).
 * A thread widens 32 consecutive dims of each of its two rows, so the
 * k-order of the products is permuted the same way on both sides: the
 * B fragments then read each query column's dims in that order.  The
 * layer's scale multiplies the fp32 scores after the products, before the
 * block max or log-sum-exp, as the de-quantized keys' products would.
 * An fp8 NaN code makes its key's score NaN (a flag beside the widening).
 */
#include "cuda/params.cuh"
#include "cuda/arch/mma_sm80.cuh"
#include "cuda/arch/launch.cuh"
#include "cuda/common/quant_widen.cuh"
#include "cuda/kernels/attention/rows_mma_fp8.cuh"

#define IDX_MMA_STAGES 3
#define IDX_MMA_THREADS 128
#define IDX_MMA_TILE_BYTES (CU_TILE_KEYS * 256)
/* Page entries of the key rows, looked up IDX_MMA_STAGES tiles before their copies. */
#define IDX_MMA_PRING (2 * IDX_MMA_STAGES)
#define IDX_MMA_SMEM_BYTES                                                                    \
    (IDX_MMA_STAGES * IDX_MMA_TILE_BYTES + IDX_MMA_TILE_BYTES + 4 * 64 * 4 * 2 + 64 * 4 * 2 + \
     IDX_MMA_PRING * 64 * 4)

/* A position in this CTA's tile sequence, walked tile by tile (no search
 * per tile).  Two walk ahead of the consumer: one issues the copies of
 * tile f + STAGES - 1, one looks up the pages of tile f + 2*STAGES - 1.
 * Under full memory load a page-table read takes microseconds: issued that
 * far ahead, as a 4-byte cp.async into a ring in shared memory, it never
 * holds up the copies. */
typedef struct cu_idx_it {
    int32_t k, n, tb, gb, blk_end; /* decode slot, block in request, tile in block */
    int32_t r, kl;
} cu_idx_it;

typedef struct cu_idx_ctx {
    int32_t gb_begin, tpb, F, n_dec;
    unsigned char *ktile;
    unsigned char *qtile;
    float *red_m, *red_l, *run_m, *run_l;
    int32_t *pring; /* [IDX_MMA_PRING][64] */
    cu_idx_it issue, look;
} cu_idx_ctx;

__device__ __forceinline__ void cu_idx_it_slot(const cu_indexer_params &params, cu_idx_it &p,
                                               int32_t k)
{
    const cu_dec_info di = params.meta.dec_info[k];
    p.k = k;
    p.r = di.r;
    p.kl = di.kl;
    p.blk_end = di.blk1;
    p.n = p.gb - di.blk0;
}

__device__ __forceinline__ void cu_idx_it_advance(const cu_indexer_params &params, cu_idx_it &p,
                                                  int32_t n_dec)
{
    if (++p.tb < params.block_size / CU_TILE_KEYS)
        return;
    p.tb = 0;
    ++p.n;
    if (++p.gb == p.blk_end && p.k + 1 < n_dec)
        cu_idx_it_slot(params, p, p.k + 1);
}

__device__ __forceinline__ int32_t cu_idx_it_pos(const cu_indexer_params &params,
                                                 const cu_idx_it &p)
{
    return p.n * params.block_size + p.tb * CU_TILE_KEYS + (threadIdx.x >> 1);
}

/* Page-table entry of this thread's row of tile `look`, into ring slot x. */
__device__ __forceinline__ void cu_idx_look(const cu_indexer_params &params, const cu_idx_ctx &c,
                                            int32_t x)
{
    if (threadIdx.x & 1)
        return;
    const int32_t pos = cu_idx_it_pos(params, c.look);
    const bool valid = pos < c.look.kl;
    const int32_t *src = valid ? params.meta.page_table + (int64_t)c.look.r * params.cap_pages +
                                     (pos >> params.log_page_size)
                               : params.meta.page_table;
    const uint32_t dst = cu_smem_addr(c.pring + (x % IDX_MMA_PRING) * 64 + (threadIdx.x >> 1));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 4 : 0));
}

/* Copies of tile x (the `issue` position) into ring stage x % IDX_MMA_STAGES:
 * two threads a row, 16-byte pieces (16-bit rows: 16 pieces, cu_swz;
 * fp8: 8, cu_swz128; nvfp4: 4 pieces of codes, unswizzled, and one 8-byte
 * copy of the scales). */
template <int KF>
__device__ __forceinline__ void cu_idx_issue(const cu_indexer_params &params, const cu_idx_ctx &c,
                                             int32_t x)
{
    const int row = threadIdx.x >> 1;
    const int half = threadIdx.x & 1;
    const int32_t pos = cu_idx_it_pos(params, c.issue);
    const bool valid = pos < c.issue.kl;
    const unsigned char *plane = (const unsigned char *)params.index_k_plane;
    const unsigned char *src = plane, *scales = plane;
    if (valid) {
        const int32_t page = c.pring[(x % IDX_MMA_PRING) * 64 + row];
        const int32_t slot = pos & (params.page_size - 1);
        if (KF == CU_PLANE_16) {
            src = cu_plane_row16(params.index_k_plane, params.index_k_strides, page, 0, slot);
        } else if (KF == CU_PLANE_FP8) {
            /* One-byte codes: element offsets are byte offsets. */
            src = plane + cu_plane_row(params.index_k_strides, page, 0, slot);
        } else {
            /* The page's region: codes, then scales (cu_nvfp4_row).  Code
             * rows are 16-byte aligned for even page sizes (the host's
             * condition), scale rows 8-byte aligned always. */
            const cu_qrow q = cu_nvfp4_row(cu_plane_row(params.index_k_strides, page, 0, 0), slot,
                                           params.page_size, 128);
            src = plane + q.at;
            scales = plane + q.scales;
        }
    }
    const uint32_t dst = cu_smem_addr(c.ktile + (x % IDX_MMA_STAGES) * IDX_MMA_TILE_BYTES);
    constexpr int PIECES = KF == CU_PLANE_16 ? 8 : KF == CU_PLANE_FP8 ? 4 : 2;
#pragma unroll
    for (int i = 0; i < PIECES; ++i) {
        const int chunk = half * PIECES + i;
        const uint32_t at = KF == CU_PLANE_16    ? cu_swz(row, chunk)
                            : KF == CU_PLANE_FP8 ? cu_swz128(row, chunk)
                                                 : (uint32_t)(row * 64 + chunk * 16);
        cu_cp_async16(dst + at, src + (valid ? chunk * 16 : 0), valid ? 16 : 0);
    }
    if (KF == CU_PLANE_NVFP4 && half == 0)
        cu_cp_async8(dst + CU_NV_TILE_SCALES + row * 8, scales, valid ? 8 : 0);
}

/* B fragments (query columns nt0*8 .. +NR*8, all 128 dims) from the Q tile. */
template <int NR>
__device__ __forceinline__ void cu_idx_bfrags(const unsigned char *qtile, int nt0,
                                              uint32_t (&bq)[NR][8][2])
{
    const int lane = threadIdx.x & 31;
    const uint32_t qa = cu_smem_addr(qtile);
#pragma unroll
    for (int nt = 0; nt < NR; ++nt) {
#pragma unroll
        for (int kpair = 0; kpair < 4; ++kpair) {
            const int row = (nt0 + nt) * 8 + (lane & 7);
            const int chunk = kpair * 4 + (lane >> 3);
            cu_ldsm_x4(qa + cu_swz(row, chunk), bq[nt][2 * kpair][0], bq[nt][2 * kpair][1],
                       bq[nt][2 * kpair + 1][0], bq[nt][2 * kpair + 1][1]);
        }
    }
}

/* B fragments of quantized keys' products: the same columns, each
 * thread's dims in the A side's order (cu_idx_afrags_q): k-step ks pairs
 * dims 32 (lane % 4) + 4 ks + {0, 1} and + {2, 3}, 8 bytes of the row. */
template <int NR>
__device__ __forceinline__ void cu_idx_bfrags_q(const unsigned char *qtile, int nt0,
                                                uint32_t (&bq)[NR][8][2])
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int nt = 0; nt < NR; ++nt) {
        const int row = (nt0 + nt) * 8 + (lane >> 2);
#pragma unroll
        for (int kp = 0; kp < 4; ++kp) {
            const uint4 v = *(const uint4 *)(qtile + cu_swz(row, 4 * (lane & 3) + kp));
            bq[nt][2 * kp][0] = v.x;
            bq[nt][2 * kp][1] = v.y;
            bq[nt][2 * kp + 1][0] = v.z;
            bq[nt][2 * kp + 1][1] = v.w;
        }
    }
}

/* A fragments of this warp's 16 keys from a quantized tile, widened to
 * the 16-bit type: the thread's rows warp*16 + lane/4 (h = 0) and + 8
 * (h = 1), dims 32 (lane % 4) .. + 31 of each, k-step ks taking dims
 * 4 ks .. 4 ks + 3 of those (a[ks][h]: the first two, a[ks][2 + h]: the
 * other two, the m16n8k16 A layout).  Returns bit h set when row h holds
 * an fp8 NaN code among those dims (nvfp4: the NaN scale byte widens to
 * NaN itself; no flags). */
template <typename Tag, int KF>
__device__ __forceinline__ uint32_t cu_idx_afrags_q(const unsigned char *tile, uint32_t (&a)[8][4])
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int c4 = lane & 3;
    uint32_t nan = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = warp * 16 + h * 8 + (lane >> 2);
        if (KF == CU_PLANE_FP8) {
            const uint4 p0 = *(const uint4 *)(tile + cu_swz128(row, 2 * c4));
            const uint4 p1 = *(const uint4 *)(tile + cu_swz128(row, 2 * c4 + 1));
            const uint32_t w[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
            uint32_t any = 0;
#pragma unroll
            for (int ks = 0; ks < 8; ++ks) {
                a[ks][h] = cu_pack2(cu_e4m3_widen<0>(w[ks]), cu_e4m3_widen<1>(w[ks]), Tag());
                a[ks][2 + h] = cu_pack2(cu_e4m3_widen<2>(w[ks]), cu_e4m3_widen<3>(w[ks]), Tag());
                any |= cu_e4m3_nan_bytes(w[ks]);
            }
            nan |= (any != 0u ? 1u : 0u) << h;
        } else {
            /* 16 code bytes: dims 32 c4 .. + 31, groups 2 c4 and 2 c4 + 1. */
            const uint4 p = *(const uint4 *)(tile + row * 64 + c4 * 16);
            const uint32_t sb = *(const uint16_t *)(tile + CU_NV_TILE_SCALES + row * 8 + 2 * c4);
            const float s0 = cu_e4m3_to_f32(sb & 0xffu), s1 = cu_e4m3_to_f32(sb >> 8);
            const uint32_t w[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
            for (int ks = 0; ks < 8; ++ks) {
                const uint32_t x = w[ks >> 1];
                const float s = ks < 4 ? s0 : s1;
                if (ks & 1) { /* nibbles 4..7 of the word */
                    a[ks][h] = cu_pack2(cu_nvfp4_widen<4>(x, s), cu_nvfp4_widen<5>(x, s), Tag());
                    a[ks][2 + h] =
                        cu_pack2(cu_nvfp4_widen<6>(x, s), cu_nvfp4_widen<7>(x, s), Tag());
                } else {
                    a[ks][h] = cu_pack2(cu_nvfp4_widen<0>(x, s), cu_nvfp4_widen<1>(x, s), Tag());
                    a[ks][2 + h] =
                        cu_pack2(cu_nvfp4_widen<2>(x, s), cu_nvfp4_widen<3>(x, s), Tag());
                }
            }
        }
    }
    return nan;
}

/* The block reduction of one tile's scores (acc: this warp's 16 keys x NR
 * n-tiles) into red_m / red_l [warp][column].  Quantized keys (KF): acc
 * holds the products with the codes, which the layer's index-K scale
 * turns into the de-quantized keys' scores, and rows flagged in nan
 * (bit 0: the thread's low row, bit 1: its high row, from any lane of
 * its quad) score NaN. */
template <int NR, int KF>
__device__ __forceinline__ void cu_idx_reduce(const cu_indexer_params &params, const cu_idx_ctx &c,
                                              const float (&acc)[NR][4], uint32_t nan, int nt0,
                                              int32_t key0, int32_t base, int32_t nq)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (KF == CU_PLANE_FP8) {
        nan |= __shfl_xor_sync(0xffffffffu, nan, 1);
        nan |= __shfl_xor_sync(0xffffffffu, nan, 2);
    }
    const int32_t pos_lo = key0 + warp * 16 + (lane >> 2);
    const int32_t pos_hi = pos_lo + 8;
#pragma unroll
    for (int nt = 0; nt < NR; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int32_t col = (nt0 + nt) * 8 + 2 * (lane & 3) + e;
            const int32_t tok = (col * params.index_heads_magic) >> 16; /* col / Hi, col < 64 */
            const bool in = col < nq;
            const bool vlo = in && pos_lo <= base + tok;
            const bool vhi = in && pos_hi <= base + tok;
            float xlo = acc[nt][e], xhi = acc[nt][2 + e];
            if (KF != CU_PLANE_16) {
                xlo *= params.index_k_scale;
                xhi *= params.index_k_scale;
            }
            if (KF == CU_PLANE_FP8) {
                if (nan & 1u)
                    xlo = __uint_as_float(0x7fc00000u);
                if (nan & 2u)
                    xhi = __uint_as_float(0x7fc00000u);
            }
            if (params.score_lse) {
                xlo *= params.index_scale;
                xhi *= params.index_scale;
            }
            float m = cu_nanmax(vlo ? xlo : -INFINITY, vhi ? xhi : -INFINITY);
#pragma unroll
            for (int o = 4; o < 32; o <<= 1)
                m = cu_nanmax(m, __shfl_xor_sync(0xffffffffu, m, o));
            float l = 0.0f;
            if (params.score_lse) {
                /* Shuffles stay outside any branch on m: it differs per column. */
                const bool decided = isnan(m) || isinf(m); /* m alone is the state */
                if (!decided)
                    l = (vlo ? expf(xlo - m) : 0.0f) + (vhi ? expf(xhi - m) : 0.0f);
#pragma unroll
                for (int o = 4; o < 32; o <<= 1)
                    l += __shfl_xor_sync(0xffffffffu, l, o);
                if (decided)
                    l = 1.0f;
            }
            if (lane < 4 && col < 64) {
                c.red_m[warp * 64 + col] = m;
                c.red_l[warp * 64 + col] = l;
            }
        }
    }
}

/* Scores of this warp's 16 keys of a 16-bit tile against NR n-tiles,
 * reduced over the keys into red_m / red_l [warp][column]. */
template <typename Tag, int NR>
__device__ __forceinline__ void cu_idx_tile(const cu_indexer_params &params, const cu_idx_ctx &c,
                                            int stage, const uint32_t (&bq)[NR][8][2], int nt0,
                                            int32_t key0, int32_t base, int32_t nq)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    float acc[NR][4];
#pragma unroll
    for (int nt = 0; nt < NR; ++nt)
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    const uint32_t ka = cu_smem_addr(c.ktile + stage * IDX_MMA_TILE_BYTES);
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
        uint32_t a0, a1, a2, a3;
        const int row = warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
        const int chunk = 2 * ks + (lane >> 4);
        cu_ldsm_x4(ka + cu_swz(row, chunk), a0, a1, a2, a3);
#pragma unroll
        for (int nt = 0; nt < NR; ++nt)
            cu_mma16816(acc[nt], a0, a1, a2, a3, bq[nt][ks][0], bq[nt][ks][1], Tag());
    }
    cu_idx_reduce<NR, CU_PLANE_16>(params, c, acc, 0u, nt0, key0, base, nq);
}

/* The same for a quantized tile whose A fragments (and NaN flags) the
 * warp widened once for the tile (cu_idx_afrags_q). */
template <typename Tag, int NR, int KF>
__device__ __forceinline__ void cu_idx_tile_q(const cu_indexer_params &params, const cu_idx_ctx &c,
                                              const uint32_t (&a)[8][4], uint32_t nan,
                                              const uint32_t (&bq)[NR][8][2], int nt0, int32_t key0,
                                              int32_t base, int32_t nq)
{
    float acc[NR][4];
#pragma unroll
    for (int nt = 0; nt < NR; ++nt)
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 8; ++ks)
#pragma unroll
        for (int nt = 0; nt < NR; ++nt)
            cu_mma16816(acc[nt], a[ks][0], a[ks][1], a[ks][2], a[ks][3], bq[nt][ks][0],
                        bq[nt][ks][1], Tag());
    cu_idx_reduce<NR, KF>(params, c, acc, nan, nt0, key0, base, nq);
}

template <typename Tag, int KF, int NT>
__device__ void cu_idx_segment(const cu_indexer_params &params, cu_idx_ctx &c, int32_t f_begin,
                               int32_t f_end, int32_t n0, int32_t base, int32_t d0, int32_t nq)
{
    constexpr int NR = NT < 4 ? NT : 4;
    uint32_t bq[NR][8][2];
    if (KF == CU_PLANE_16)
        cu_idx_bfrags<NR>(c.qtile, 0, bq);
    else
        cu_idx_bfrags_q<NR>(c.qtile, 0, bq);
    for (int32_t f = f_begin; f < f_end; ++f) {
        cu_cp_async_wait<IDX_MMA_STAGES - 2>();
        __syncthreads();
        const int32_t fn = f + IDX_MMA_STAGES - 1;
        if (fn < c.F)
            cu_idx_issue<KF>(params, c, fn);
        if (fn + IDX_MMA_STAGES < c.F) {
            cu_idx_look(params, c, fn + IDX_MMA_STAGES);
            if (fn + IDX_MMA_STAGES + 1 < c.F)
                cu_idx_it_advance(params, c.look, c.n_dec);
        }
        cu_cp_async_commit();
        if (fn + 1 < c.F)
            cu_idx_it_advance(params, c.issue, c.n_dec);
        const int stage = f % IDX_MMA_STAGES;
        const int32_t blk = f / c.tpb; /* block index in this CTA's range */
        const int32_t tb = f - blk * c.tpb;
        const int32_t n = n0 + blk - f_begin / c.tpb; /* block id within the request */
        const int32_t key0 = n * params.block_size + tb * CU_TILE_KEYS;
        if (KF == CU_PLANE_16 && NT > 4) {
            cu_idx_bfrags<NR>(c.qtile, 0, bq);
            cu_idx_tile<Tag, NR>(params, c, stage, bq, 0, key0, base, nq);
            cu_idx_bfrags<NR>(c.qtile, 4, bq);
            cu_idx_tile<Tag, NR>(params, c, stage, bq, 4, key0, base, nq);
        } else if (KF == CU_PLANE_16) {
            cu_idx_tile<Tag, NR>(params, c, stage, bq, 0, key0, base, nq);
        } else {
            /* Widened once, multiplied with every column. */
            uint32_t a[8][4];
            const uint32_t nan = cu_idx_afrags_q<Tag, KF>(c.ktile + stage * IDX_MMA_TILE_BYTES, a);
            if (NT > 4) {
                cu_idx_bfrags_q<NR>(c.qtile, 0, bq);
                cu_idx_tile_q<Tag, NR, KF>(params, c, a, nan, bq, 0, key0, base, nq);
                cu_idx_bfrags_q<NR>(c.qtile, 4, bq);
                cu_idx_tile_q<Tag, NR, KF>(params, c, a, nan, bq, 4, key0, base, nq);
            } else {
                cu_idx_tile_q<Tag, NR, KF>(params, c, a, nan, bq, 0, key0, base, nq);
            }
        }
        __syncthreads();
        const int col = threadIdx.x;
        if (col < nq) {
            float m = -INFINITY, l = 0.0f;
            if (tb > 0) {
                m = c.run_m[col];
                l = c.run_l[col];
            }
#pragma unroll
            for (int w = 0; w < IDX_MMA_THREADS / 32; ++w) {
                const float m2 = c.red_m[w * 64 + col];
                if (params.score_lse) {
                    cu_lse_merge(m, l, m2, c.red_l[w * 64 + col]);
                } else {
                    m = cu_nanmax(m, m2);
                }
            }
            if (tb == c.tpb - 1) {
                const float score = params.score_lse ? cu_lse_value(m, l) : m;
                const int32_t tok = (col * params.index_heads_magic) >> 16;
                const int32_t h = col - tok * params.num_index_heads;
                params
                    .scores[((int64_t)(d0 + tok) * params.num_index_heads + h) * params.cap_blocks +
                            n] = score;
            } else {
                c.run_m[col] = m;
                c.run_l[col] = l;
            }
        }
    }
}

template <typename Tag, int KF>
/* Three CTAs per SM (68 KB of shared memory each): the loop is bound by
 * instruction latency more than by bytes in flight, so warps beat stages. */
__global__ void __launch_bounds__(IDX_MMA_THREADS, 3)
    cu_indexer_mma_kernel(cu_indexer_params params)
{
    cu_pdl_wait();
    cu_pdl_trigger();
    extern __shared__ __align__(128) unsigned char smem[];
    const cu_step_hdr *hdr = params.meta.hdr;
    cu_idx_ctx c;
    c.n_dec = hdr->n_dec;
    const int64_t total = hdr->total_dec_blocks;
    if (c.n_dec == 0 || total == 0)
        return;
    c.gb_begin = (int32_t)(total * blockIdx.x / gridDim.x);
    const int32_t gb_end = (int32_t)(total * (blockIdx.x + 1) / gridDim.x);
    c.tpb = params.block_size / CU_TILE_KEYS;
    c.F = (gb_end - c.gb_begin) * c.tpb;
    if (c.F == 0)
        return;
    c.ktile = smem;
    c.qtile = smem + IDX_MMA_STAGES * IDX_MMA_TILE_BYTES;
    c.red_m = (float *)(c.qtile + IDX_MMA_TILE_BYTES);
    c.red_l = c.red_m + 4 * 64;
    c.run_m = c.red_l + 4 * 64;
    c.run_l = c.run_m + 64;
    c.pring = (int32_t *)(c.run_l + 64);

    /* Prologue: pages of tiles 0 .. 2*STAGES-2, then the copies of tiles
     * 0 .. STAGES-2 (the loop issues the rest, one of each per tile). */
    c.issue.gb = c.gb_begin;
    c.issue.tb = 0;
    cu_idx_it_slot(params, c.issue, cu_dec_of_block(params.meta.dec_blk0, c.n_dec, c.gb_begin));
    c.look = c.issue;
    for (int32_t x = 0; x < 2 * IDX_MMA_STAGES - 1 && x < c.F; ++x) {
        cu_idx_look(params, c, x);
        if (x + 1 < c.F)
            cu_idx_it_advance(params, c.look, c.n_dec);
    }
    cu_cp_async_commit();
    cu_cp_async_wait<0>();
    __syncthreads();
    for (int s = 0; s < IDX_MMA_STAGES - 1; ++s) {
        if (s < c.F)
            cu_idx_issue<KF>(params, c, s);
        cu_cp_async_commit();
        if (s + 1 < c.F)
            cu_idx_it_advance(params, c.issue, c.n_dec);
    }
    int32_t f = 0;
    while (f < c.F) {
        const int32_t gb = c.gb_begin + f / c.tpb;
        const int32_t k = cu_dec_of_block(params.meta.dec_blk0, c.n_dec, gb);
        const cu_dec_info di = params.meta.dec_info[k];
        const int32_t seg_end = min(c.F, (di.blk1 - c.gb_begin) * c.tpb);
        const int32_t ql = di.ql;
        const int32_t base = di.kl - ql;
        const int32_t t0 = di.t0;
        const int32_t nq = ql * params.num_index_heads;
        const int32_t n0 = gb - di.blk0;
        __syncthreads(); /* every warp is done with the previous request's Q tile */
        const uint4 *q = (const uint4 *)((const unsigned char *)params.index_q +
                                         (int64_t)t0 * params.num_index_heads * 256);
        for (int i = threadIdx.x; i < 64 * 16; i += IDX_MMA_THREADS) {
            const int row = i >> 4, chunk = i & 15;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (row < nq)
                v = q[row * 16 + chunk];
            *(uint4 *)(c.qtile + cu_swz(row, chunk)) = v;
        }
        __syncthreads();
        const int nt = (nq + 7) >> 3;
        const int32_t d0 = di.d0;
        if (nt <= 1)
            cu_idx_segment<Tag, KF, 1>(params, c, f, seg_end, n0, base, d0, nq);
        else if (nt <= 2)
            cu_idx_segment<Tag, KF, 2>(params, c, f, seg_end, n0, base, d0, nq);
        else if (nt <= 4)
            cu_idx_segment<Tag, KF, 4>(params, c, f, seg_end, n0, base, d0, nq);
        else
            cu_idx_segment<Tag, KF, 8>(params, c, f, seg_end, n0, base, d0, nq);
        f = seg_end;
    }
    cu_cp_async_wait<0>();
}

void cu_launch_indexer_mma(const cu_indexer_params *params, const cu_plan_state *st, cudaStream_t s)
{
#define IDX_MMA_LAUNCH(TAG, KF)                                                      \
    cu_launch(cu_indexer_mma_kernel<TAG, KF>, st->sz.grid_idx_fast, IDX_MMA_THREADS, \
              IDX_MMA_SMEM_BYTES, s, st->pdl, *params)
    CU_LAUNCH_BY_FORMAT(params->act_dtype, params->index_dtype, IDX_MMA_LAUNCH);
#undef IDX_MMA_LAUNCH
}

cudaError_t cu_indexer_mma_setup(int num_sms, int *grid)
{
    cudaError_t e = cu_allow_smem(IDX_MMA_SMEM_BYTES,
                                  cu_indexer_mma_kernel<cu_bf16_tag, CU_PLANE_16>,
                                  cu_indexer_mma_kernel<cu_f16_tag, CU_PLANE_16>,
                                  cu_indexer_mma_kernel<cu_bf16_tag, CU_PLANE_FP8>,
                                  cu_indexer_mma_kernel<cu_f16_tag, CU_PLANE_FP8>,
                                  cu_indexer_mma_kernel<cu_bf16_tag, CU_PLANE_NVFP4>,
                                  cu_indexer_mma_kernel<cu_f16_tag, CU_PLANE_NVFP4>);
    if (e != cudaSuccess)
        return e;
    int occ = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &occ, cu_indexer_mma_kernel<cu_bf16_tag, CU_PLANE_16>, IDX_MMA_THREADS, IDX_MMA_SMEM_BYTES);
    if (e != cudaSuccess)
        return e;
    *grid = num_sms * (occ > 0 ? occ : 1);
    return cudaSuccess;
}
