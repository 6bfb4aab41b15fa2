/*
 * Prefill indexer and selection on tensor cores: the kernel template,
 * instantiated with mma.sync m16n8k16 products (sm_80 and later,
 * indexer_prefill_mma_sm80.cu) and with wgmma products (sm_90a,
 * indexer_prefill_wgmma_sm90.cu).  Design and measurements:
 * docs/PREFILL_INDEXER.md.
 *
 * Work: tiles of consecutive tokens of one prefill request, tt = 64 / Hi
 * tokens, so that a tile's tokens x index heads fill 64 MMA rows (row =
 * token * Hi + head, the layout of the step's idx_q: one contiguous piece).
 * A persistent grid (two CTAs per SM) takes the tiles in a snake order over
 * a list that puts every request's longest (last) tiles first, so the CTAs'
 * sums of work stay even.
 *
 * Per tile, four warps each own 16 query rows, their A fragments held in
 * registers for the whole tile.  The request's index keys up to the tile's
 * last token stream through a 3-stage cp.async ring, 64 keys (16 KB) a
 * stage, each stage read by all four warps: every key row is read from
 * memory once per tile.  Scores are products of the stored 16-bit values,
 * exact in fp32, summed in fp32 by the tensor cores (SPEC 4: no narrower
 * operand, no TF32).  The causal mask, the score scale and the block's max
 * or log-sum-exp are applied in registers: each thread reduces its keys of
 * a row, two shuffles finish the row's 64 keys, and a running state per
 * row carries a block's B / 64 stages.  Finished block scores go to this
 * CTA's rows of a workspace (CU_PFI_ROWS x cap_blocks floats a CTA, sized
 * at plan init), which stays in L2: the whole Hi x tokens x blocks matrix
 * is never written.
 *
 * Then the same CTA selects: each warp takes (token, unit) items of the
 * tile and runs the decode selection's lone-warp row (cu_select_row:
 * forced init and local blocks, the rest by score, ties to the lower id,
 * NaN last, ascending ids, -1 padding), unions of m index heads for
 * Hi = m * Hkv, repeated rows for Hkv = m * Hi, written as the plan's sel
 * rows and the caller's topk rows.
 */
#ifndef MSA_INDEXER_PREFILL_CUH
#define MSA_INDEXER_PREFILL_CUH

#include "cuda/kernels/indexer/indexer_prefill_mma_sm80.cuh"
#include "cuda/arch/mma_sm80.cuh"
#include "cuda/arch/launch.cuh"
#include "cuda/kernels/indexer/indexer_prefill_select.cuh"
#include "cuda/arch/wgmma_sm90.cuh"

#define PFI_WARPS 4
#define PFI_THREADS (PFI_WARPS * 32)
#define PFI_CHUNK 64 /* keys a stage */
#define PFI_STAGES 3
#define PFI_STAGE_BYTES (PFI_CHUNK * 256) /* 64 keys of 128 16-bit values */
#define PFI_Q_BYTES (CU_PFI_ROWS * 256)
/* The ring and the query tile, plus room to align the ring to the
 * 1024-byte swizzle atoms of the Hopper products. */
#define PFI_SCORE_SMEM (PFI_STAGES * PFI_STAGE_BYTES + PFI_Q_BYTES + 1024)

/* Byte offset of 16-byte piece `chunk` (0..15) of key row `row` in a stage
 * for the Hopper products (WG): two boxes of 64 dims (64 rows of 128 bytes,
 * 8 KB each), pieces swizzled within each 128-byte row by the row's low 3
 * bits, as a 128-byte-swizzle tensor copy lays them out (wgmma_sm90.cuh's
 * K-major B operand); else the mma path's swizzle (cu_swz). */
template <bool WG>
__device__ __forceinline__ uint32_t cu_pfi_swz(int row, int chunk)
{
    if (WG)
        return (uint32_t)((chunk >> 3) * (PFI_CHUNK * 128) + row * 128 +
                          (((chunk & 7) ^ (row & 7)) << 4));
    return cu_swz(row, chunk);
}

/* The cache offset (bytes) of this thread's key row of chunk c (keys
 * c*64 .. c*64+63 of request r; each thread copies half a row), or -1 for
 * a key past the tile's last position p_last: that row is zero-filled,
 * never read from the cache (its page may not exist), and the mask drops
 * it.  Looked up one stage before the copies that use it, so the
 * page-table load is not on the copies' path. */
__device__ __forceinline__ int64_t cu_pfi_row_offset(const cu_pfidx_params &p, int32_t c, int32_t r,
                                                     int32_t p_last)
{
    const int32_t pos = c * PFI_CHUNK + (int32_t)(threadIdx.x >> 1);
    if (pos > p_last)
        return -1;
    const int32_t page = p.page_table[(int64_t)r * p.cap_pages + (pos >> p.logP)];
    return cu_plane_row(p.iks, page, 0, pos & (p.P - 1)) * 2;
}

/* Copies of this thread's half key row (8 pieces of 16 bytes, at cache
 * offset off from cu_pfi_row_offset) into ring stage x % PFI_STAGES. */
template <bool WG>
__device__ __forceinline__ void cu_pfi_issue(const cu_pfidx_params &p, unsigned char *stages,
                                             int32_t x, int64_t off)
{
    const int row = threadIdx.x >> 1;
    const int half = threadIdx.x & 1;
    const bool valid = off >= 0;
    const unsigned char *src = (const unsigned char *)p.ikp + (valid ? off : 0);
    const uint32_t dst = cu_smem_addr(stages + (x % PFI_STAGES) * PFI_STAGE_BYTES);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int chunk = half * 8 + i;
        cu_cp_async16(dst + cu_pfi_swz<WG>(row, chunk), src + (valid ? chunk * 16 : 0),
                      valid ? 16 : 0);
    }
}

/* One row's part of a chunk of 64 keys (this thread's 16 scores of it,
 * acc[J0 + nt][2h+e]: J0 = 8 is the second half of a 128-key product)
 * reduced over the visible keys and the row's four lanes, merged into the
 * row's running state (m, l). */
template <bool LSE, int J0 = 0, int NJ = 8>
__device__ __forceinline__ void cu_pfi_reduce(const float (&acc)[NJ][4], int h, int32_t key0,
                                              int32_t prow, bool full, float iscale, float &rm,
                                              float &rl)
{
    static_assert(J0 + 8 <= NJ, "the chunk's 8 column groups are in the accumulators");
    const int lane = threadIdx.x & 31;
    float v[16];
    bool vis[16];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int32_t key = key0 + nt * 8 + 2 * (lane & 3) + e;
            vis[2 * nt + e] = full || key <= prow;
            v[2 * nt + e] = LSE ? acc[J0 + nt][2 * h + e] * iscale : acc[J0 + nt][2 * h + e];
        }
    /* The largest visible score as a tree of depth 4 (most stages are
     * visible whole: `full` is the same for the whole CTA, and the branch
     * leaves them without masks); the max of a set does not depend on the
     * order, NaN included. */
    float w[16];
    if (full) {
#pragma unroll
        for (int i = 0; i < 16; ++i)
            w[i] = v[i];
    } else {
#pragma unroll
        for (int i = 0; i < 16; ++i)
            w[i] = vis[i] ? v[i] : -INFINITY;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i)
        w[i] = cu_nanmax(w[i], w[i + 8]);
#pragma unroll
    for (int i = 0; i < 4; ++i)
        w[i] = cu_nanmax(w[i], w[i + 4]);
    float m = cu_nanmax(cu_nanmax(w[0], w[2]), cu_nanmax(w[1], w[3]));
    if (!LSE) {
        m = cu_nanmax(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = cu_nanmax(m, __shfl_xor_sync(0xffffffffu, m, 2));
        rm = cu_nanmax(rm, m);
        return;
    }
    /* (m, l): this thread's largest term and sum of exp(x - m); a NaN or
     * infinite m alone is the state, -inf with l = 0 adds nothing. */
    float l = 0.0f;
    if (isnan(m) || isinf(m)) {
        l = m == -INFINITY ? 0.0f : 1.0f;
    } else {
#pragma unroll
        for (int i = 0; i < 16; ++i)
            l += vis[i] ? expf(v[i] - m) : 0.0f;
    }
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float l2 = __shfl_xor_sync(0xffffffffu, l, o);
        cu_lse_merge(m, l, m2, l2);
    }
    cu_lse_merge(rm, rl, m, l);
}

/* Block scores of one tile's rows over chunks [c_begin, c_end) (whole
 * blocks, the last one possibly cut at the tile's last key) into the CTA's
 * workspace rows. */
template <typename Tag, bool LSE, bool WG>
__device__ __forceinline__ void cu_pfi_scores(const cu_pfidx_params &p, unsigned char *smem,
                                              float *scratch, int32_t r, int32_t t0, int32_t base,
                                              int32_t nrow, int32_t p_last, int32_t c_begin,
                                              int32_t c_end)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    unsigned char *stages = (unsigned char *)(((uintptr_t)smem + 1023) & ~(uintptr_t)1023);
    unsigned char *qtile = stages + PFI_STAGES * PFI_STAGE_BYTES;

    /* Query rows t0 * Hi .. + nrow (zeros after), then this warp's A
     * fragments: rows warp*16 .. +15, all 128 dims. */
    const uint4 *q = (const uint4 *)((const unsigned char *)p.iq + (int64_t)t0 * p.Hi * 256);
    for (int i = threadIdx.x; i < CU_PFI_ROWS * 16; i += PFI_THREADS) {
        const int row = i >> 4, chunk = i & 15;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (row < nrow)
            v = q[row * 16 + chunk];
        *(uint4 *)(qtile + cu_swz(row, chunk)) = v;
    }
    const int32_t F = c_end - c_begin;
    for (int s = 0; s < PFI_STAGES - 1; ++s) {
        if (s < F)
            cu_pfi_issue<WG>(p, stages, s, cu_pfi_row_offset(p, c_begin + s, r, p_last));
        cu_cp_async_commit();
    }
    /* The row of the next stage to copy, looked up a stage ahead. */
    int64_t next_off =
        PFI_STAGES - 1 < F ? cu_pfi_row_offset(p, c_begin + PFI_STAGES - 1, r, p_last) : -1;
    __syncthreads();
    uint32_t a[8][4];
    {
        const uint32_t qa = cu_smem_addr(qtile);
        const int row = warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
        for (int ks = 0; ks < 8; ++ks)
            cu_ldsm_x4(qa + cu_swz(row, 2 * ks + (lane >> 4)), a[ks][0], a[ks][1], a[ks][2],
                       a[ks][3]);
    }
    /* This thread's two rows: g and g + 8 of the warp's 16. */
    const int row_lo = warp * 16 + (lane >> 2);
    const int32_t pos_lo = base + row_lo / p.Hi;
    const int32_t pos_hi = base + (row_lo + 8) / p.Hi;
    const int32_t cpb = p.B / PFI_CHUNK;
    float rm[2] = {-INFINITY, -INFINITY}, rl[2] = {0.0f, 0.0f};

    /* Stage x's copies waited for, the ring's next copies issued (their
     * rows looked up one stage earlier) and its products started into acc
     * (on Hopper asynchronous: products_wait ends them). */
    auto products = [&](int32_t x, float(&acc)[8][4]) {
        cu_cp_async_wait<PFI_STAGES - 2>();
#ifdef CU_HAVE_WGMMA
        if (WG) /* the copies' writes seen by the products' operand reads */
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
        __syncthreads(); /* stage x landed for all; stage x - 1 read by all */
        if (x + PFI_STAGES - 1 < F) {
            cu_pfi_issue<WG>(p, stages, x + PFI_STAGES - 1, next_off);
            if (x + PFI_STAGES < F)
                next_off = cu_pfi_row_offset(p, c_begin + x + PFI_STAGES, r, p_last);
        }
        cu_cp_async_commit();
        const uint32_t ka = cu_smem_addr(stages + (x % PFI_STAGES) * PFI_STAGE_BYTES);
        if (WG) {
#ifdef CU_HAVE_WGMMA
            /* One warpgroup: 64 rows x 64 keys x 128 dims in 8 products,
             * A (the rows) from registers, B (the keys) from the stage;
             * acc ends in the layout of the mma path's acc[nt][4]. */
            cu_wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 8; ++ks) {
                const uint32_t at =
                    ka + (uint32_t)(ks >> 2) * (PFI_CHUNK * 128) + (uint32_t)(ks & 3) * 32u;
                if (ks == 0)
                    cu_wgmma_m64n64k16_first(acc, a[ks], cu_wgmma_desc(at, 16), Tag());
                else
                    cu_wgmma_m64n64k16(acc, a[ks], cu_wgmma_desc(at, 16), 1, Tag());
            }
            cu_wgmma_commit();
#else
            __trap(); /* launched only with sm_90a code (cu_launch_indexer_prefill_mma) */
#endif
        } else {
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
                acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
                for (int n2 = 0; n2 < 4; ++n2) {
                    uint32_t b0, b1, b2, b3;
                    const int krow = n2 * 16 + ((lane >> 4) & 1) * 8 + (lane & 7);
                    cu_ldsm_x4(ka + cu_swz(krow, 2 * ks + ((lane >> 3) & 1)), b0, b1, b2, b3);
                    cu_mma16816(acc[2 * n2], a[ks][0], a[ks][1], a[ks][2], a[ks][3], b0, b1, Tag());
                    cu_mma16816(acc[2 * n2 + 1], a[ks][0], a[ks][1], a[ks][2], a[ks][3], b2, b3,
                                Tag());
                }
            }
        }
    };
    auto products_wait = [&](float(&acc)[8][4]) {
#ifdef CU_HAVE_WGMMA
        if (WG) {
            cu_wgmma_wait_all();
            cu_wgmma_hold(acc);
        }
#else
        (void)acc;
#endif
    };
    /* Stage x's scores (in acc) reduced into the rows' running states; a
     * block's last stage (or the range's) writes the block scores.  c_begin
     * starts a block, so stage x is chunk x % cpb of its block. */
    auto reduce = [&](int32_t x, const float(&acc)[8][4]) {
        const int32_t c = c_begin + x;
        const int32_t cb = x % cpb;
        const int32_t key0 = c * PFI_CHUNK;
        const bool full = key0 + PFI_CHUNK - 1 <= base; /* visible to every row of the tile */
        if (cb == 0) {
            rm[0] = rm[1] = -INFINITY;
            rl[0] = rl[1] = 0.0f;
        }
        cu_pfi_reduce<LSE>(acc, 0, key0, pos_lo, full, p.iscale, rm[0], rl[0]);
        cu_pfi_reduce<LSE>(acc, 1, key0, pos_hi, full, p.iscale, rm[1], rl[1]);
        if (cb == cpb - 1 || x == F - 1) {
            const int32_t n = c / cpb;
            if ((lane & 3) == 0) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = row_lo + 8 * h;
                    if (row < nrow)
                        scratch[(int64_t)row * p.cap_blocks + n] = LSE ? cu_lse_value(rm[h], rl[h])
                                                                       : rm[h];
                }
            }
        }
    };

    for (int32_t x = 0; x < F; ++x) {
        float acc[8][4];
        products(x, acc);
        products_wait(acc);
        reduce(x, acc);
    }
    cu_cp_async_wait<0>();
    __syncthreads(); /* the workspace rows written; the ring free for reuse */
}

/* WG: the Hopper products (sm_90a code, launched on compute capability 9.x
 * only); else mma.sync. */
template <typename Tag, bool WG>
__global__ void __launch_bounds__(PFI_THREADS, 2) cu_pfidx_kernel(const cu_pfidx_params p)
{
    /* The next kernel (the attention) may be scheduled now: it waits for
     * this grid's end before it reads the sel rows. */
    cu_pdl_trigger();
    cu_pdl_wait(); /* the step's index keys in the cache (prologue) */
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int32_t last_split;
    if (p.hdr->n_pf == 0)
        return;
    const int warp = threadIdx.x >> 5;
    const int32_t grid = (int32_t)gridDim.x;
    const cu_pfi_shape sh = {PFI_WARPS, CU_PFI_ROWS, p.sel_cache};
    float *scratch = p.scratch + (int64_t)blockIdx.x * CU_PFI_ROWS * p.cap_blocks;
    uint32_t *wsm = (uint32_t *)smem + warp * cu_pfi_warp_words(p.mi, p.K, p.W, p.sel_cache);
    const int32_t S = cu_pfi_splits(p, grid);
    const int32_t cpb = p.B / PFI_CHUNK;
    cu_pfi_walk walk;
    cu_pfi_walk_start(p, walk);
    cu_pfi_item it;
    while (cu_pfi_next(p, grid, S, walk, it)) {
        const int32_t c_begin = it.b0 * cpb, c_end = min(it.b1 * cpb, it.p_last / PFI_CHUNK + 1);
        if (c_begin < c_end) {
            if (p.score_lse)
                cu_pfi_scores<Tag, true, WG>(p, smem, scratch, it.r, it.t0, it.base, it.ntok * p.Hi,
                                             it.p_last, c_begin, c_end);
            else
                cu_pfi_scores<Tag, false, WG>(p, smem, scratch, it.r, it.t0, it.base,
                                              it.ntok * p.Hi, it.p_last, c_begin, c_end);
        }
        cu_pfi_select_item(p, sh, it, S, scratch, wsm, &last_split, [] { __syncthreads(); });
        __syncthreads(); /* shared memory free for the next item's ring */
    }
}

#endif /* MSA_INDEXER_PREFILL_CUH */
