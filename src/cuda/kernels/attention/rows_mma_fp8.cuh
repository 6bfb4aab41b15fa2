/*
 * The two products of the mma.sync decode attention (rows_mma.cuh) for
 * fp8_e4m3 K and V tiles: rows of 128 one-byte codes in shared memory
 * (cu_swz128), widened to the 16-bit type while the B fragments are
 * loaded.  Every E4M3 value is exact in bf16 and in fp16, so the products
 * see the codes' values; the planes' scales are applied by the caller
 * after the products (K's on the scores, V's on the finished rows).
 */
#ifndef MSA_CUDA_KERNELS_ATTENTION_ROWS_MMA_FP8_CUH
#define MSA_CUDA_KERNELS_ATTENTION_ROWS_MMA_FP8_CUH

#include "cuda/arch/mma_sm80.cuh"
#include "cuda/common/quant.cuh"

/* Rows of 128 bytes = 8 chunks of 16 bytes; chunk c of row r lives at
 * chunk c ^ (r & 7), as cu_swz does for 256-byte rows. */
__device__ __forceinline__ uint32_t cu_swz128(int row, int chunk)
{
    return (uint32_t)(row * 128 + ((chunk ^ (row & 7)) << 4));
}

/* Byte d of row `row` of a tile of 128-byte rows. */
__device__ __forceinline__ uint32_t cu_fp8_tile_byte(const unsigned char *tile, int row, int d)
{
    return tile[cu_swz128(row, d >> 4) + (d & 15)];
}

/* Two E4M3 codes (lo, hi) as a packed pair of the 16-bit type, exactly;
 * the NaN code gives NaN. */
template <typename Tag>
__device__ __forceinline__ uint32_t cu_fp8_widen2(uint32_t lo, uint32_t hi, Tag)
{
    return cu_pack2(cu_e4m3_to_f32(lo), cu_e4m3_to_f32(hi), Tag());
}

/* S = Q codes^T for NS n-tiles of 8 keys from tile row k0 (head dim 128):
 * the B fragment of k-step ks holds, for key k0 + 8 n + lane / 4, the
 * dims 16 ks + 2 (lane % 4) + {0, 1} and the same + 8. */
template <typename Tag, int NS>
__device__ __forceinline__ void cu_rows_qk_fp8(const unsigned char *ktile, int k0,
                                               const uint32_t (&qa)[8][4], float (&sc)[NS][4])
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int n = 0; n < NS; ++n)
        sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
        for (int n = 0; n < NS; ++n) {
            const int row = k0 + n * 8 + (lane >> 2);
            const int d = ks * 16 + 2 * (lane & 3);
            const uint32_t b0 = cu_fp8_widen2(cu_fp8_tile_byte(ktile, row, d),
                                              cu_fp8_tile_byte(ktile, row, d + 1), Tag());
            const uint32_t b1 = cu_fp8_widen2(cu_fp8_tile_byte(ktile, row, d + 8),
                                              cu_fp8_tile_byte(ktile, row, d + 9), Tag());
            cu_mma16816(sc[n], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b0, b1, Tag());
        }
    }
}

/* O += P codes for the KW keys at tile row k0; P (the weights in sc) is
 * rounded to the 16-bit type.  The B fragment of the n-tile of dims
 * 8 j .. 8 j + 7 holds, for dim 8 j + lane / 4, the keys 2 (lane % 4) +
 * {0, 1} and the same + 8 of the k-step. */
template <typename Tag, int KW>
__device__ __forceinline__ void cu_rows_pv_fp8(const unsigned char *vtile, int k0,
                                               const float (&sc)[KW / 8][4], float (&o)[16][4])
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < KW / 16; ++kk) {
        const uint32_t p0 = cu_pack2(sc[2 * kk][0], sc[2 * kk][1], Tag());
        const uint32_t p1 = cu_pack2(sc[2 * kk][2], sc[2 * kk][3], Tag());
        const uint32_t p2 = cu_pack2(sc[2 * kk + 1][0], sc[2 * kk + 1][1], Tag());
        const uint32_t p3 = cu_pack2(sc[2 * kk + 1][2], sc[2 * kk + 1][3], Tag());
        const int r = k0 + kk * 16 + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int d = j * 8 + (lane >> 2);
            const uint32_t b0 = cu_fp8_widen2(cu_fp8_tile_byte(vtile, r, d),
                                              cu_fp8_tile_byte(vtile, r + 1, d), Tag());
            const uint32_t b1 = cu_fp8_widen2(cu_fp8_tile_byte(vtile, r + 8, d),
                                              cu_fp8_tile_byte(vtile, r + 9, d), Tag());
            cu_mma16816(o[j], p0, p1, p2, p3, b0, b1, Tag());
        }
    }
}

#endif /* MSA_CUDA_KERNELS_ATTENTION_ROWS_MMA_FP8_CUH */
