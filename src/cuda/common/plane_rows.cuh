/*
 * Where a kernel finds a cache row: the one address computation of the
 * cache planes, through the plane's element strides (msa_plane_strides of
 * the cache: the library layout's, or an engine's given to
 * msa_cache_wrap_strided).
 */
#ifndef MSA_CUDA_COMMON_PLANE_ROWS_CUH
#define MSA_CUDA_COMMON_PLANE_ROWS_CUH

#include "cuda/common/common.cuh"

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

#endif /* MSA_CUDA_COMMON_PLANE_ROWS_CUH */
