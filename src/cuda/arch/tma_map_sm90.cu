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

/* A stride of the map in bytes (elements of elem_bytes each): a positive
 * multiple of 16 below 2^40, as the encoder takes it; 0 when the element
 * stride gives none. */
static cuuint64_t cu_tma_stride_bytes(int64_t elements, uint32_t elem_bytes)
{
    if (elements <= 0 || elements >= ((int64_t)1 << 38))
        return 0;
    const cuuint64_t b = (cuuint64_t)elements * elem_bytes;
    return b % 16u == 0 ? b : 0;
}

int cu_tma_map_plane(CUtensorMap *map, const void *base, const msa_plane_strides *s, uint64_t pages,
                     uint32_t page_size, uint32_t heads, uint32_t box_rows, uint32_t elem_bytes)
{
    PFN_cuTensorMapEncodeTiled_v12000 fn = cu_encode_fn();
    if (!fn || !base || ((uintptr_t)base & 15u) != 0 || pages == 0 || pages > (1ull << 31) ||
        heads == 0 || box_rows == 0 || box_rows > 256 || box_rows > page_size ||
        (elem_bytes != 1 && elem_bytes != 2))
        return 1;
    const cuuint64_t token = cu_tma_stride_bytes(s->token, elem_bytes);
    /* A dimension of one index (one head, one page) has no stride of its
     * own (the cache keeps 0 for the head of a single-head plane): any
     * valid one serves, as its coordinate is always 0. */
    const cuuint64_t head = heads > 1 ? cu_tma_stride_bytes(s->head, elem_bytes) : token;
    const cuuint64_t page = pages > 1 ? cu_tma_stride_bytes(s->page, elem_bytes) : token;
    if (token == 0 || head == 0 || page == 0)
        return 1;
    const cuuint64_t dims[4] = {128, page_size, heads, pages};
    const cuuint64_t strides[3] = {token, head, page};
    /* A box row is one 128-byte swizzle span: 64 16-bit values or 128
     * one-byte codes. */
    const cuuint32_t box[4] = {128 / elem_bytes, box_rows, 1, 1};
    const cuuint32_t estr[4] = {1, 1, 1, 1};
    CUresult r =
        fn(map, elem_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 4,
           (void *)base, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
           CU_TENSOR_MAP_SWIZZLE_128B, CU_TMA_L2_PROMOTION, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : 1;
}
