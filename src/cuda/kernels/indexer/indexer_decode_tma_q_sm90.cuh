/*
 * The Hopper decode indexer's converter warps for quantized index keys
 * (fp8_e4m3 codes, nvfp4 codes with their group scales), included by
 * indexer_decode_tma_sm90.cu.
 *
 * The producer streams the blocks' codes into a ring of their own: an fp8
 * block is one tensor-map box of 128 rows x 128 code bytes (128-byte
 * swizzle), an nvfp4 block its page's 128 rows of 64 code bytes and then
 * their 8 group-scale bytes, as the page lies in the plane (two bulk
 * copies).  A warpgroup of converters takes every block in order, widens
 * it into the 16-bit ring in the layout the 16-bit keys' copies write
 * (widen_tile.cuh), and hands it to the consumer groups, which run the
 * 16-bit products unchanged; the layer's index-K scale multiplies their
 * scores.  The widening is then the converters' whole work and bounds the
 * kernel: on the H200 at batch 8, 50K, 8 tokens, 42.2 us over fp8 keys
 * with bf16 queries (four operations a pair of codes) and 28.0 us with
 * fp16 queries (one conversion instruction a pair), against 32.4 over
 * 16-bit keys.  Consumers that widened their own rows in registers (the
 * keys as the products' A side, the query columns a shared-memory tile)
 * took 40.5 us with bf16 queries, instruction- and latency-bound too, and
 * kept a second epilogue.
 */
#ifndef MSA_CUDA_KERNELS_INDEXER_INDEXER_DECODE_TMA_Q_SM90_CUH
#define MSA_CUDA_KERNELS_INDEXER_INDEXER_DECODE_TMA_Q_SM90_CUH

#include "cuda/common/plane_rows.cuh"
#include "cuda/common/widen_tile.cuh"

/* A quantized block in its code-ring slot: fp8 128 x 128 bytes; nvfp4
 * 128 rows of 64 code bytes, then each row's 8 scale bytes. */
#define IDXQ_SLOT_BYTES (128 * 128)
#define IDXQ_NV_CODE_BYTES (128 * 64)
#define IDXQ_NV_SCALE_BYTES (128 * 8)
/* The converter warps (one warpgroup).  Two warpgroups, taking the
 * blocks in turns, would leave the kernel's 17 warps under 100 registers
 * a thread, and the consumers spill. */
#define IDXQ_CONVERTERS 4

#ifdef CU_HAVE_WGMMA

/* The request of block gb, past the current one (kslot, di): blocks come
 * in ascending order, so the next request's, or after a jump to a chunk
 * further on, a search. */
__device__ __forceinline__ void cu_idxt_next_request(const cu_indexer_params &params, int32_t n_dec,
                                                     int32_t gb, int32_t &kslot, cu_dec_info &di)
{
    const int32_t nk = kslot + 1 < n_dec ? kslot + 1 : kslot;
    const cu_dec_info nd = params.meta.dec_info[nk];
    kslot = gb < nd.blk1 ? nk : cu_dec_of_block(params.meta.dec_blk0, n_dec, gb);
    di = gb < nd.blk1 ? nd : params.meta.dec_info[kslot];
}

/* The converters (thread t of 128): ring use x of the code ring (qfull,
 * qempty, qslot_gb) becomes use x of the 16-bit ring (full, empty,
 * slot_gb), in order, until both groups' end marks (block id -1) have
 * passed.  Each converter lane arrives on the code slot's empty barrier
 * once its reads are done and on the 16-bit slot's full barrier once its
 * writes are (fence.proxy.async first: the products read the slot through
 * the async proxy). */
template <typename Tag, int KF>
__device__ void cu_idxq_converter(const unsigned char *qring, uint64_t *qfull, uint64_t *qempty,
                                  const volatile int32_t *qslot_gb, unsigned char *ring,
                                  uint64_t *full, uint64_t *empty, volatile int32_t *slot_gb, int t)
{
    int ends = 0;
    for (int32_t x = 0; ends < IDX_TMA_GROUPS; ++x) {
        const int s = x % IDX_TMA_STAGES;
        const int32_t use = x / IDX_TMA_STAGES;
        cu_mbar_wait(&qfull[s], (uint32_t)use & 1u);
        const int32_t gb = qslot_gb[s];
        if (use > 0) /* the 16-bit slot's previous block is done */
            cu_mbar_wait(&empty[s], (uint32_t)(use - 1) & 1u);
        if (gb >= 0) {
            const uint32_t src = cu_smem_addr(qring + s * IDXQ_SLOT_BYTES);
            const uint32_t dst = cu_smem_addr(ring + s * IDX_TMA_BLOCK_BYTES);
            if (KF == CU_PLANE_FP8)
                cu_widen_fp8_tile<Tag, IDX_TMA_BLOCK_ROWS>(src, dst, t);
            else
                cu_widen_nvfp4_tile<Tag, IDX_TMA_BLOCK_ROWS>(src, dst, t);
        } else {
            ++ends;
        }
        cu_mbar_arrive(&qempty[s]);
        if (t == 0)
            slot_gb[s] = gb;
        cu_fence_proxy_async();
        cu_mbar_arrive(&full[s]);
    }
}

#endif /* CU_HAVE_WGMMA */

#endif /* MSA_CUDA_KERNELS_INDEXER_INDEXER_DECODE_TMA_Q_SM90_CUH */
