/*
 * Hopper bulk-copy primitives: tensor-map (TMA) tile loads completing on
 * shared-memory barriers, and the barrier operations of a producer /
 * consumer ring.
 *
 * Every plane of 16-bit rows of 128 elements (K, V, index K with page size
 * 128) is described to the copy engine as a 4-D tensor over (column, slot,
 * head, page) with the plane's own strides (msa_plane_strides: the library
 * layout's or an engine's), so one map serves every layout whose strides
 * are multiples of 16 bytes.  A box of 64 columns x R slots of one (page,
 * head) lands in shared memory with the 128-byte swizzle: row r at r * 128,
 * its 16-byte chunk c at chunk c ^ (r & 7), so ldmatrix reads of eight rows
 * at one logical chunk hit eight different bank groups.  A 128-column tile
 * is two such boxes, columns 0-63 first.  The rows of a box need not be
 * contiguous in memory (token-major pages): the copy engine walks the
 * slot stride.
 *
 * One thread issues a whole tile, so the copies cost the SM no address
 * arithmetic and no registers; the kernels are free to spend their warps on
 * the tensor cores.  Device functions exist for sm_90 and later only.
 */
#ifndef MSA_CUDA_ARCH_TMA_SM90_CUH
#define MSA_CUDA_ARCH_TMA_SM90_CUH

#include "cuda/arch/mma_sm80.cuh"
#include "cuda/params.cuh"

#include <cuda.h>

/* Byte offset of (row, 16-byte chunk 0..15) in a swizzled 128-column tile
 * of `rows` rows (two boxes of rows * 128 bytes). */
__device__ __forceinline__ uint32_t cu_tswz(int rows, int row, int chunk)
{
    return (uint32_t)((chunk >> 3) * rows * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

__device__ __forceinline__ void cu_mbar_init(uint64_t *bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(cu_smem_addr(bar)), "r"(count));
}

/* Makes initialized barriers visible to the copy engine. */
__device__ __forceinline__ void cu_mbar_fence_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void cu_mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(cu_smem_addr(bar)) : "memory");
}

/* Arrival that also announces `bytes` of copies completing on the barrier. */
__device__ __forceinline__ void cu_mbar_arrive_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                     cu_smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

/* Waits until the barrier's phase with this parity has completed. */
__device__ __forceinline__ void cu_mbar_wait(uint64_t *bar, uint32_t parity)
{
    const uint32_t a = cu_smem_addr(bar);
    uint32_t done = 0;
    while (!done) {
        asm volatile("{\n .reg .pred p;\n"
                     " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    }
}

/* Whether the barrier's phase with this parity has completed (does not
 * wait). */
__device__ __forceinline__ bool cu_mbar_test(uint64_t *bar, uint32_t parity)
{
    uint32_t done;
    asm volatile("{\n .reg .pred p;\n"
                 " mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(cu_smem_addr(bar)), "r"(parity)
                 : "memory");
    return done != 0;
}

/* The box of columns col.. and slots slot.. of the rows of (page, head)
 * into shared memory at dst, completing on bar, its lines in L2 under
 * `policy` (cu_l2_evict_first). */
__device__ __forceinline__ void cu_tma_load_rows_hint(void *dst, const CUtensorMap *map,
                                                      int32_t col, int32_t slot, int32_t head,
                                                      int32_t page, uint64_t *bar, uint64_t policy)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(
                     cu_smem_addr(dst)),
                 "l"((uint64_t)map), "r"(col), "r"(slot), "r"(head), "r"(page),
                 "r"(cu_smem_addr(bar)), "l"(policy)
                 : "memory");
}

/* `bytes` contiguous bytes (a multiple of 16, both addresses 16-byte
 * aligned) from global memory at src into shared memory at dst,
 * completing on bar, its lines in L2 under `policy`. */
__device__ __forceinline__ void cu_bulk_load_hint(void *dst, const void *src, uint32_t bytes,
                                                  uint64_t *bar, uint64_t policy)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;\n" ::"r"(cu_smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(cu_smem_addr(bar)), "l"(policy)
                 : "memory");
}

/* The same box into shared memory at shared address dst, without a cache
 * hint (for data read again by later tiles, which should stay in L2). */
__device__ __forceinline__ void cu_tma_load_rows(uint32_t dst, const CUtensorMap *map, int32_t col,
                                                 int32_t slot, int32_t head, int32_t page,
                                                 uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(col), "r"(slot), "r"(head), "r"(page),
                 "r"(cu_smem_addr(bar))
                 : "memory");
}

/* The box of columns col.. and slots slot.. of the rows of (page, head)
 * from shared memory at src (laid out as a load of the same box writes it)
 * to global memory, in this thread's current bulk group, its lines in L2
 * under `policy`.  The writes of other threads to src must be ordered
 * before it (fence.proxy.async by each writer, then a barrier). */
__device__ __forceinline__ void cu_tma_store_rows_hint(uint32_t src, const CUtensorMap *map,
                                                       int32_t col, int32_t slot, int32_t head,
                                                       int32_t page, uint64_t policy)
{
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group.L2::cache_hint"
                 " [%0, {%2, %3, %4, %5}], [%1], %6;\n" ::"l"((uint64_t)map),
                 "r"(src), "r"(col), "r"(slot), "r"(head), "r"(page), "l"(policy)
                 : "memory");
}

/* Closes this thread's current bulk group of stores. */
__device__ __forceinline__ void cu_bulk_commit()
{
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

/* Waits until this thread's bulk stores have read their shared memory
 * (the buffers may be written again). */
__device__ __forceinline__ void cu_bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

/* Waits until this thread's bulk stores are complete. */
__device__ __forceinline__ void cu_bulk_wait()
{
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

/* Orders this thread's shared-memory writes before later reads by the
 * async proxy (tensor-map copies, warpgroup products). */
__device__ __forceinline__ void cu_fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* Four 8 x 8 matrices of 16-bit values from registers to shared memory:
 * lane i gives the address of row i % 8 of matrix i / 8, and register k
 * holds, for matrix k, row lane / 4, columns 2 (lane % 4) + {0, 1} (the
 * layout of an mma accumulator pair packed to 16 bits). */
__device__ __forceinline__ void cu_stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                               uint32_t r3)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

/* An L2 policy for data read once: its lines are the first evicted. */
__device__ __forceinline__ uint64_t cu_l2_evict_first()
{
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}

__device__ __forceinline__ void cu_tma_prefetch_map(const CUtensorMap *map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
}

/* Barrier id (1..15) of `threads` threads (whole warps): waits until that
 * many have arrived, this warp's included. */
__device__ __forceinline__ void cu_named_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* Arrives on barrier id (1..15) of `threads` threads without waiting: the
 * threads that wait there (cu_named_sync) go on once the count is met. */
__device__ __forceinline__ void cu_named_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

#endif /* sm_90+ */

/* ---- host side (arch/tma_map_sm90.cu) ---------------------------------------------- */

/* Describes a plane of rows of 128 elements of elem_bytes each (2: bf16
 * or fp16; 1: fp8_e4m3 codes) at base: `pages` pages of `heads` heads of
 * page_size slots, the row of (page, head, slot) at element
 * cu_plane_row(*s, page, head, slot), read in boxes of 128 bytes of
 * columns (64 16-bit values, 128 codes) x box_rows slots of one (page,
 * head) with the 128-byte swizzle.  Returns 0 on success; nonzero when
 * the driver lacks tensor maps or the plane does not qualify (base
 * alignment, a stride not a positive multiple of 16 bytes below 2^40, a
 * box beyond the page). */
int cu_tma_map_plane(CUtensorMap *map, const void *base, const msa_plane_strides *s, uint64_t pages,
                     uint32_t page_size, uint32_t heads, uint32_t box_rows, uint32_t elem_bytes);

/* ---- Hopper kernels (indexer_decode_tma_sm90.cu, attention_decode_tma_sm90.cu) -------------------------- */
/* map: the index-key plane, boxes of 128 rows. */
void cu_launch_indexer_tma(const cu_indexer_params *p, const cu_plan_state *st,
                           const CUtensorMap *map, cudaStream_t s);
/* map_k, map_v: the K and V planes, boxes of 64 rows. */
void cu_launch_attn_tma(const cu_attn_params *params, const cu_plan_state *st,
                        const CUtensorMap *map_k, const CUtensorMap *map_v, cudaStream_t s);
cudaError_t cu_indexer_tma_setup(void);
cudaError_t cu_attn_tma_setup(void);

#endif /* MSA_CUDA_ARCH_TMA_SM90_CUH */
