/*
 * Quantized K and V tiles of the mma.sync kernels: fp8_e4m3 rows of 128
 * one-byte codes (cu_swz128), or nvfp4 rows of 64 code bytes followed by
 * the tile's rows of 8 group-scale bytes.  The decode attention widens a
 * tile's codes with the whole CTA (widen_tile.cuh, into its rows of 256
 * bytes: cu_swz256 below) into tiles of the 16-bit type that its 16-bit
 * products (rows_mma.cuh) read unchanged; the decode indexer widens its
 * keys in its fragment loads.  Every E4M3 value, and every E2M1 code
 * times its E4M3 group scale, is exact in bf16 and in fp16, so the
 * products see the codes' values; the planes' scales are applied by the
 * caller after the products (K's on the scores, V's on the finished
 * rows).  NaN codes and NaN group scales widen to NaN; the rows the
 * copies did not fill are zero codes (and zero scales) and widen to zeros.
 */
#ifndef MSA_CUDA_KERNELS_ATTENTION_ROWS_MMA_FP8_CUH
#define MSA_CUDA_KERNELS_ATTENTION_ROWS_MMA_FP8_CUH

#include "cuda/arch/mma_sm80.cuh"
#include "cuda/common/widen_tile.cuh"

/* Rows of 128 bytes = 8 chunks of 16 bytes; chunk c of row r lives at
 * chunk c ^ (r & 7), as cu_swz does for 256-byte rows (and as a
 * tensor-map box with the 128-byte swizzle lays them, which
 * cu_widen_fp8_tile reads). */
__device__ __forceinline__ uint32_t cu_swz128(int row, int chunk)
{
    return (uint32_t)(row * 128 + ((chunk ^ (row & 7)) << 4));
}

/* An nvfp4 tile: CU_TILE_KEYS rows of 64 code bytes (unswizzled), then
 * each row's 8 group-scale bytes from byte CU_NV_TILE_SCALES (the layout
 * cu_widen_nvfp4_tile reads for CU_TILE_KEYS rows). */
#define CU_NV_TILE_SCALES (CU_TILE_KEYS * 64)

/* The mma.sync kernels' 16-bit tiles: rows of 256 bytes, cu_swz. */
struct cu_swz256 {
    __device__ __forceinline__ uint32_t operator()(int row, int chunk) const
    {
        return cu_swz(row, chunk);
    }
};

#endif /* MSA_CUDA_KERNELS_ATTENTION_ROWS_MMA_FP8_CUH */
