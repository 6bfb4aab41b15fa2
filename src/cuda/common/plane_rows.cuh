/*
 * Where a kernel finds a cache row: the one address computation of the
 * cache planes, through the plane's element strides (msa_plane_strides of
 * the cache: the library layout's, or an engine's given to
 * msa_cache_wrap_strided).
 */
#ifndef MSA_CUDA_COMMON_PLANE_ROWS_CUH
#define MSA_CUDA_COMMON_PLANE_ROWS_CUH

#include "cuda/common/common.cuh"
#include "cuda/common/quant.cuh"

/* Element offset of the row of (page, head, slot); its dim elements follow
 * it.  Index planes have one head: head is 0 for them. */
__host__ __device__ __forceinline__ int64_t cu_plane_row(const msa_plane_strides &s, int32_t page,
                                                         int32_t head, int32_t slot)
{
    return (int64_t)page * s.page + (int64_t)head * s.head + (int64_t)slot * s.token;
}

/* The first byte of that row in a plane of 16-bit elements, as the
 * tensor-core kernels copy it (16-byte pieces): the row starts on a
 * 16-byte boundary, since the plane's base and every stride are multiples
 * of 16 bytes (msa_cache_wrap_strided checks it on CUDA; the library
 * layout's rows are dim * 2 bytes, dim a multiple of 8 on those kernels). */
__device__ __forceinline__ const unsigned char *cu_plane_row16(const void *plane,
                                                               const msa_plane_strides &s,
                                                               int32_t page, int32_t head,
                                                               int32_t slot)
{
    return (const unsigned char *)plane + cu_plane_row(s, page, head, slot) * 2;
}

/* The row of (page, head, slot) in a plane of element type dtype, for
 * cu_plane_load.  nvfp4 planes lie in the library layout, where their
 * rows are found by their own arithmetic (SPEC 8); every other format
 * through the strides.  QUANT false: a kernel variant that never sees a
 * quantized plane (the host chose it), without their code. */
template <bool QUANT = true>
__device__ __forceinline__ cu_qrow cu_plane_at(const msa_plane_strides &s, int dtype, int32_t page,
                                               int32_t head, int32_t slot, int32_t page_size,
                                               int32_t dim)
{
    if (QUANT && dtype == MSA_DTYPE_NVFP4)
        return cu_nvfp4_row(cu_plane_row(s, page, head, 0), slot, page_size, dim);
    cu_qrow r;
    r.at = cu_plane_row(s, page, head, slot);
    r.scales = 0;
    return r;
}

/* Element d of a row, in fp32: the stored value widened (fp32, bf16,
 * fp16), or de-quantized with the plane's scale exactly as the CPU backend
 * reads it (fp8_e4m3, nvfp4).  The one load of a cache element in the SIMT
 * kernels.  QUANT as for cu_plane_at. */
template <bool QUANT = true>
__device__ __forceinline__ float cu_plane_load(const void *plane, int dtype, float scale,
                                               cu_qrow row, int32_t d)
{
    if (QUANT && cu_is_quantized(dtype))
        return cu_qrow_load(plane, dtype, scale, row, d);
    return cu_load(plane, dtype, row.at + d);
}

#endif /* MSA_CUDA_COMMON_PLANE_ROWS_CUH */
