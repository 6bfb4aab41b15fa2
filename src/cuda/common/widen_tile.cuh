/*
 * Tiles of quantized codes in shared memory widened by 128 threads into
 * 16-bit tiles laid out as a tensor-map copy of 16-bit rows lays them out
 * (two boxes of 64 columns, 128-byte swizzle: cu_tswz), so that the
 * Hopper kernels' products read them as they read 16-bit rows.  Every
 * E4M3 value, and every E2M1 code times its E4M3 group scale, is exact in
 * bf16 and in fp16 (quant_widen.cuh); NaN codes and NaN group scales
 * widen to NaN.  Thread t of the 128 takes row t % ROWS and every
 * (128 / ROWS)-th 16-byte chunk of it from t / ROWS on: eight threads of
 * a quarter warp hold eight consecutive rows of one chunk, whose swizzled
 * writes (and fp8 reads) meet no bank group twice; nvfp4 code rows are
 * 64 bytes and unswizzled, so their reads take four bank-group passes a
 * quarter warp.  The mma.sync decode attention lays its 16-bit tiles out
 * otherwise (rows of 256 bytes, cu_swz) and passes its own Swz.
 */
#ifndef MSA_CUDA_COMMON_WIDEN_TILE_CUH
#define MSA_CUDA_COMMON_WIDEN_TILE_CUH

#include "cuda/arch/smem.cuh"
#include "cuda/arch/tma_sm90.cuh"
#include "cuda/common/quant_widen.cuh"

#ifdef __CUDACC__

/* Where 16-byte chunk c (0..15) of row r of a 16-bit tile lies: by
 * default as a tensor-map copy of ROWS rows lays it (cu_tswz). */
template <int ROWS>
struct cu_tile_swz {
    __device__ __forceinline__ uint32_t operator()(int row, int chunk) const
    {
        return cu_tswz(ROWS, row, chunk);
    }
};

/* fp8: ROWS rows of 128 code bytes at shared address `codes`, as a
 * tensor-map box with the 128-byte swizzle lays them (chunk c of row r at
 * r * 128 + (c ^ (r & 7)) * 16), into the 16-bit tile at `wide`. */
template <typename Tag, int ROWS, typename Swz = cu_tile_swz<ROWS>>
__device__ __forceinline__ void cu_widen_fp8_tile(uint32_t codes, uint32_t wide, int t)
{
    static_assert(ROWS == 64 || ROWS == 128, "64 or 128 rows for 128 threads");
    constexpr int STEP = 128 / ROWS;
    const int row = t % ROWS;
#pragma unroll
    for (int i = 0; i < 8 / STEP; ++i) {
        const int c = t / ROWS + STEP * i;
        const uint4 p = cu_lds128(codes + (uint32_t)(row * 128 + ((c ^ (row & 7)) << 4)));
        uint4 lo, hi;
        cu_fp8_chunk_widen<Tag>(p, lo, hi);
        cu_sts128(wide + Swz()(row, 2 * c), lo);
        cu_sts128(wide + Swz()(row, 2 * c + 1), hi);
    }
}

/* nvfp4: ROWS rows of 64 code bytes at `codes` (unswizzled), then each
 * row's 8 group-scale bytes, as a page region lays them out (SPEC 8),
 * into the 16-bit tile at `wide`: a 16-byte code chunk is 32 values of
 * two groups, four 16-bit chunks. */
template <typename Tag, int ROWS, typename Swz = cu_tile_swz<ROWS>>
__device__ __forceinline__ void cu_widen_nvfp4_tile(uint32_t codes, uint32_t wide, int t)
{
    static_assert(ROWS == 64 || ROWS == 128, "64 or 128 rows for 128 threads");
    constexpr int STEP = 128 / ROWS;
    const int row = t % ROWS;
    const uint2 sb = cu_lds64(codes + (uint32_t)(ROWS * 64 + row * 8));
#pragma unroll
    for (int i = 0; i < 4 / STEP; ++i) {
        const int c = t / ROWS + STEP * i;
        const uint4 p = cu_lds128(codes + (uint32_t)(row * 64 + c * 16));
        /* Groups 2 c and 2 c + 1: bytes 2 c, 2 c + 1 of the scale row. */
        const uint32_t g = ((c < 2 ? sb.x : sb.y) >> (16 * (c & 1))) & 0xffffu;
        uint4 out[4];
        cu_nvfp4_chunk_widen<Tag>(p, g, out);
#pragma unroll
        for (int k = 0; k < 4; ++k)
            cu_sts128(wide + Swz()(row, 4 * c + k), out[k]);
    }
}

#endif /* __CUDACC__ */

#endif /* MSA_CUDA_COMMON_WIDEN_TILE_CUH */
