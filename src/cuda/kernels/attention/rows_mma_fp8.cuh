/*
 * Quantized K and V tiles of the mma.sync decode attention, widened by the
 * whole CTA into tiles of the 16-bit type (rows of 256 bytes, cu_swz) that
 * the 16-bit products (rows_mma.cuh) read unchanged: fp8_e4m3 rows of 128
 * one-byte codes (cu_swz128), or nvfp4 rows of 64 code bytes followed by
 * the tile's rows of 8 group-scale bytes.  Every E4M3 value, and every
 * E2M1 code times its E4M3 group scale, is exact in bf16 and in fp16, so
 * the products see the codes' values; the planes' scales are applied by
 * the caller after the products (K's on the scores, V's on the finished
 * rows).  NaN codes and NaN group scales widen to NaN.
 */
#ifndef MSA_CUDA_KERNELS_ATTENTION_ROWS_MMA_FP8_CUH
#define MSA_CUDA_KERNELS_ATTENTION_ROWS_MMA_FP8_CUH

#include "cuda/arch/mma_sm80.cuh"
#include "cuda/common/quant_widen.cuh"

/* Rows of 128 bytes = 8 chunks of 16 bytes; chunk c of row r lives at
 * chunk c ^ (r & 7), as cu_swz does for 256-byte rows. */
__device__ __forceinline__ uint32_t cu_swz128(int row, int chunk)
{
    return (uint32_t)(row * 128 + ((chunk ^ (row & 7)) << 4));
}

/* A tile of CU_TILE_KEYS rows of 128 codes (cu_swz128) into the 16-bit
 * tile `wide` (cu_swz), by all NT threads of the CTA; each code is read
 * and widened once.  Thread t takes row t % 64 and every (NT / 64)-th
 * chunk from t / 64: eight threads of a quarter warp then hold eight
 * consecutive rows of one chunk, whose 16-byte reads (chunk c ^ (r & 7))
 * and writes (chunks 2 c and 2 c + 1, each ^ (r & 7)) fall on eight
 * different bank groups, free of conflicts.  The rows the copies did not
 * fill are zeros (cp.async zero fill) and widen to zeros. */
template <typename Tag, int NT>
__device__ __forceinline__ void cu_fp8_tile_widen(const unsigned char *codes, unsigned char *wide)
{
    static_assert(NT % CU_TILE_KEYS == 0 && 8 % (NT / CU_TILE_KEYS) == 0, "threads per tile");
    constexpr int STEP = NT / CU_TILE_KEYS;
    const int row = threadIdx.x % CU_TILE_KEYS;
#pragma unroll
    for (int i = 0; i < 8 / STEP; ++i) {
        const int c = (int)threadIdx.x / CU_TILE_KEYS + i * STEP;
        const uint4 p = *(const uint4 *)(codes + cu_swz128(row, c));
        uint4 lo, hi;
        cu_fp8_chunk_widen<Tag>(p, lo, hi);
        *(uint4 *)(wide + cu_swz(row, 2 * c)) = lo;
        *(uint4 *)(wide + cu_swz(row, 2 * c + 1)) = hi;
    }
}

/* An nvfp4 tile: CU_TILE_KEYS rows of 64 code bytes (unswizzled), then
 * each row's 8 group-scale bytes from byte CU_NV_TILE_SCALES. */
#define CU_NV_TILE_SCALES (CU_TILE_KEYS * 64)

/* The same for an nvfp4 tile.  Thread t takes row t % 64 and every
 * (NT / 64)-th 16-byte code chunk (32 codes, two groups) from t / 64, and
 * writes its four 16-bit chunks.  The code rows are 64 bytes apart and
 * unswizzled, so a quarter warp's reads take four bank-group passes; the
 * writes meet no bank group twice.  The rows the copies did not fill are
 * zero codes with zero scales and widen to zeros. */
template <typename Tag, int NT>
__device__ __forceinline__ void cu_nvfp4_tile_widen(const unsigned char *codes, unsigned char *wide)
{
    static_assert(NT % CU_TILE_KEYS == 0 && 4 % (NT / CU_TILE_KEYS) == 0, "threads per tile");
    constexpr int STEP = NT / CU_TILE_KEYS;
    const int row = threadIdx.x % CU_TILE_KEYS;
#pragma unroll
    for (int i = 0; i < 4 / STEP; ++i) {
        const int c = (int)threadIdx.x / CU_TILE_KEYS + i * STEP;
        const uint4 p = *(const uint4 *)(codes + row * 64 + c * 16);
        /* Groups 2 c and 2 c + 1: bytes 2 c and 2 c + 1 of the scale row. */
        const uint32_t g = *(const uint16_t *)(codes + CU_NV_TILE_SCALES + row * 8 + 2 * c);
        uint4 out[4];
        cu_nvfp4_chunk_widen<Tag>(p, g, out);
#pragma unroll
        for (int k = 0; k < 4; ++k)
            *(uint4 *)(wide + cu_swz(row, 4 * c + k)) = out[k];
    }
}

#endif /* MSA_CUDA_KERNELS_ATTENTION_ROWS_MMA_FP8_CUH */
