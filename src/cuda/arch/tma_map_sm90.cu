/*
 * Tensor maps for the Hopper kernels, encoded on the host through the
 * driver's entry point (found at run time, so the library links only the
 * CUDA runtime).  Encoding is pure host work: a forward pass may encode its
 * maps on every call, and a captured graph keeps the maps it was given.
 */
#include "cuda/arch/tma_sm90.cuh"

#include <cudaTypedefs.h>

static PFN_cuTensorMapEncodeTiled_v12000 cu_encode_lookup(void)
{
    void *p = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        return (PFN_cuTensorMapEncodeTiled_v12000)p;
    cudaGetLastError();
    return NULL;
}

/* Looked up once; the initialization of a function-local static is
 * thread-safe, so contexts on several threads may encode at once. */
static PFN_cuTensorMapEncodeTiled_v12000 cu_encode_fn(void)
{
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = cu_encode_lookup();
    return fn;
}

/* How far L2 widens a copy's requests (CUtensorMapL2promotion: 0 none,
 * 1 64 B, 2 128 B, 3 256 B).  A box reads 128 bytes of each 256-byte row.
 * With the copies marked evict-first, 256 B was 3-5% slower than 128 B or
 * none on steps of 100K-200K context on the H200 (measured on the
 * indexer's stream). */
#define CU_TMA_L2_PROMOTION CU_TENSOR_MAP_L2_PROMOTION_L2_128B

int cu_tma_map_rows(CUtensorMap *map, const void *base, uint64_t rows, uint32_t box_rows)
{
    PFN_cuTensorMapEncodeTiled_v12000 fn = cu_encode_fn();
    if (!fn || !base || ((uintptr_t)base & 15u) != 0 || rows == 0 || rows >= (1ull << 31) ||
        box_rows == 0 || box_rows > 256)
        return 1;
    const cuuint64_t dims[2] = {128, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {256};
    const cuuint32_t box[2] = {64, box_rows};
    const cuuint32_t estr[2] = {1, 1};
    CUresult r = fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, (void *)base, dims, strides, box, estr,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TMA_L2_PROMOTION,
                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : 1;
}
