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

#endif /* MSA_CUDA_COMMON_PLANE_ROWS_CUH */
