/*
 * Decode attention, tensor-core path: bf16/fp16 queries and KV planes of the
 * same type (or quantized ones, below), head dim 128.  Serves the sparse
 * pass (key stream = union of the request's selected blocks), the dense
 * pass and the index-value pass.
 *
 * One CTA (4 warps) per work item: up to 64 query rows (tokens x heads of one
 * KV group) against one split of the key stream.  The item's stream
 * metadata (union entries, pages) is staged in shared memory once, then
 * 64-key tiles of K and V go through a 3-stage cp.async ring; warps whose
 * tokens use none of a tile's keys skip it.  Each key carries the bits of
 * the tokens that use it (membership and causal window), applied as -inf
 * before the softmax.  Rows map to warps in m16 tiles; with fewer than 64 rows the
 * warps also split each tile's keys and are merged by LSE at the end, so a
 * single decode token (16 rows) still keeps four warps busy.  Q stays in
 * registers, S = Q K^T and O += P V run on mma.sync m16n8k16 with fp32
 * accumulators; P is rounded to the 16-bit type for the second product.
 *
 * Quantized K/V planes (variants CU_PLANE_FP8 and CU_PLANE_NVFP4): the
 * ring holds the code rows (fp8: 128 bytes a key; nvfp4: 64 bytes of codes
 * and the key's 8 group-scale bytes), a stage of 16 KB instead of 32, and
 * once a tile has landed the whole CTA widens its K and V codes into one
 * pair of 16-bit tiles beside the ring (widen_tile.cuh), which the
 * 16-bit products then read as they read a 16-bit tile.  Each code is
 * widened once per tile, not once per warp that reads it (with 64 query
 * rows every warp reads every key), at the cost of one more barrier a
 * tile; tiles no warp uses are not widened.  K's scale joins the score
 * scale and V's multiplies the finished rows.  nvfp4 code rows are
 * copied in 16-byte pieces, so the host takes this variant only for even
 * page sizes (a page region is 72 bytes a row).
 */
#include "cuda/kernels/attention/key_stream.cuh"
#include "cuda/arch/mma_sm80.cuh"
#include "cuda/kernels/attention/rows_mma.cuh"
#include "cuda/kernels/attention/rows_mma_fp8.cuh"
#include "cuda/arch/launch.cuh"

#define ATT_MMA_STAGES 3
#define ATT_MMA_THREADS 128
#define ATT_MMA_TILE_BYTES (CU_TILE_KEYS * 256)
#define ATT_MMA_STAGE_BYTES (2 * ATT_MMA_TILE_BYTES + CU_TILE_KEYS * 4)
/* Stream metadata of one item, read once at its start (see cu_att_meta). */
#define ATT_MMA_META_BLK 512
#define ATT_MMA_META_PAGES 2048
#define ATT_MMA_META_BYTES (ATT_MMA_META_BLK * 8 + ATT_MMA_META_PAGES * 4)
#define ATT_MMA_SMEM_BYTES (ATT_MMA_STAGES * ATT_MMA_STAGE_BYTES + ATT_MMA_META_BYTES)
/* Codes: stages of K and V code tiles (fp8: 128-byte rows; nvfp4: 64-byte
 * code rows, then 8-byte scale rows, in the same space) and the token
 * bits, then the widened K and V tiles; both fit in the 16-bit ring's
 * space, before the metadata, so the variants share one shared-memory
 * size. */
#define ATT_FP8_TILE_BYTES (CU_TILE_KEYS * 128)
#define ATT_FP8_STAGE_BYTES (2 * ATT_FP8_TILE_BYTES + CU_TILE_KEYS * 4)
#define ATT_FP8_WIDE_OFFSET (ATT_MMA_STAGES * ATT_FP8_STAGE_BYTES)
static_assert(ATT_FP8_WIDE_OFFSET % 128 == 0, "widened tiles 128-byte aligned");
static_assert(ATT_FP8_WIDE_OFFSET + 2 * ATT_MMA_TILE_BYTES <= ATT_MMA_STAGES * ATT_MMA_STAGE_BYTES,
              "fp8 ring and widened tiles within the 16-bit ring's space");
static_assert(CU_NV_TILE_SCALES + CU_TILE_KEYS * 8 <= ATT_FP8_TILE_BYTES,
              "an nvfp4 tile's codes and scales fit an fp8 tile's place");

/* Bytes of a stage and of one of its K / V tiles. */
template <int KF>
struct cu_att_ring {
    static constexpr bool CODES = KF != CU_PLANE_16;
    static constexpr int STAGE = CODES ? ATT_FP8_STAGE_BYTES : ATT_MMA_STAGE_BYTES;
    static constexpr int TILE = CODES ? ATT_FP8_TILE_BYTES : ATT_MMA_TILE_BYTES;
};

/* Row metadata of a tile read straight from memory (union entry, then page
 * table): the fallback when the item's metadata does not fit in shared
 * memory (cu_att_meta). */
typedef struct cu_att_look {
    int32_t blk, off;
    uint32_t member;
} cu_att_look;

typedef struct cu_att_loc {
    int32_t pos, page;
    uint32_t use;
} cu_att_loc;

__device__ __forceinline__ cu_att_look cu_att_lookup(const cu_stream &s, int32_t j)
{
    cu_att_look a;
    const int32_t u = s.u0 + j * CU_TILE_KEYS + (threadIdx.x >> 1);
    a.blk = -1;
    a.off = 0;
    a.member = 0u;
    if (u < s.u1) {
        if (s.sparse) {
            const int32_t bi = u / s.B;
            a.blk = s.uid[bi];
            a.member = s.masks[bi];
            a.off = u - bi * s.B;
        } else {
            a.blk = 0;
            a.off = u;
            a.member = 0xffffffffu;
        }
    }
    return a;
}

__device__ __forceinline__ cu_att_loc cu_att_locate(const cu_attn_params &params,
                                                    const cu_stream &s, const cu_att_look &a)
{
    cu_att_loc b;
    b.pos = a.blk * s.B + a.off;
    b.use = (a.blk >= 0 && b.pos < s.kl) ? a.member & cu_causal_bits(b.pos, s.base, s.ql) : 0u;
    b.page = b.use ? cu_page_of(params.meta.page_table, params.cap_pages, s.r, b.pos,
                                params.log_page_size)
                   : 0;
    return b;
}

/* The K and V rows of one key into a stage: two threads a row, 16-byte
 * pieces (fp8: rows of 128 one-byte codes, cu_swz128; nvfp4: 64 code
 * bytes, unswizzled, and an 8-byte copy of the group scales each, K's by
 * the first thread and V's by the second; else rows of 128 16-bit
 * values, cu_swz). */
template <int KF>
__device__ __forceinline__ void cu_att_issue(const cu_attn_params &params, unsigned char *smem,
                                             int32_t group, const cu_att_loc &b, int stage)
{
    unsigned char *st = smem + stage * cu_att_ring<KF>::STAGE;
    uint32_t *kmask = (uint32_t *)(st + 2 * cu_att_ring<KF>::TILE);
    const int row = threadIdx.x >> 1;
    const int half = threadIdx.x & 1;
    const unsigned char *ksrc = (const unsigned char *)params.k_plane;
    const unsigned char *vsrc = (const unsigned char *)params.v_plane;
    const unsigned char *kscl = ksrc, *vscl = vsrc;
    if (b.use) {
        const int32_t slot = b.pos & (params.page_size - 1);
        if (KF == CU_PLANE_FP8) {
            /* One-byte codes: element offsets are byte offsets. */
            ksrc += cu_plane_row(params.k_strides, b.page, group, slot);
            vsrc += cu_plane_row(params.v_strides, b.page, group, slot);
        } else if (KF == CU_PLANE_NVFP4) {
            /* The (page, head) region: codes, then scales (cu_nvfp4_row). */
            const cu_qrow k = cu_nvfp4_row(cu_plane_row(params.k_strides, b.page, group, 0), slot,
                                           params.page_size, 128);
            const cu_qrow v = cu_nvfp4_row(cu_plane_row(params.v_strides, b.page, group, 0), slot,
                                           params.page_size, 128);
            kscl = ksrc + k.scales;
            vscl = vsrc + v.scales;
            ksrc += k.at;
            vsrc += v.at;
        } else {
            ksrc = cu_plane_row16(params.k_plane, params.k_strides, b.page, group, slot);
            vsrc = cu_plane_row16(params.v_plane, params.v_strides, b.page, group, slot);
        }
    }
    const uint32_t kd = cu_smem_addr(st);
    const uint32_t vd = kd + cu_att_ring<KF>::TILE;
    const int nbytes = b.use ? 16 : 0;
    /* Chunks of 16 bytes a row: 4 (nvfp4), 8 (fp8) or 16, half of them
     * each thread. */
    constexpr int PIECES = KF == CU_PLANE_NVFP4 ? 2 : KF == CU_PLANE_FP8 ? 4 : 8;
#pragma unroll
    for (int i = 0; i < PIECES; ++i) {
        const int chunk = half * PIECES + i;
        const int so = b.use ? chunk * 16 : 0;
        const uint32_t at = KF == CU_PLANE_NVFP4 ? (uint32_t)(row * 64 + chunk * 16)
                            : KF == CU_PLANE_FP8 ? cu_swz128(row, chunk)
                                                 : cu_swz(row, chunk);
        cu_cp_async16(kd + at, ksrc + so, nbytes);
        cu_cp_async16(vd + at, vsrc + so, nbytes);
    }
    if (KF == CU_PLANE_NVFP4)
        cu_cp_async8((half ? vd : kd) + CU_NV_TILE_SCALES + row * 8, half ? vscl : kscl,
                     b.use ? 8 : 0);
    if (half == 0)
        kmask[row] = b.use;
}

/* The item's stream metadata in shared memory: its union entries (block id,
 * token bits) and the page of every P-chunk of them (sparse), or the pages
 * of its key range (dense).  Loaded once, in two parallel rounds, so the
 * tile loop issues its copies without waiting on memory.  Returns 0 when it
 * does not fit (tiny pages over a long range): the tile loop then looks the
 * rows up itself, a few tiles ahead. */
typedef struct cu_att_meta {
    int32_t bi0, ppb, first;
    int32_t *blk;
    uint32_t *msk;
    int32_t *page;
} cu_att_meta;

__device__ __forceinline__ int cu_att_meta_load(const cu_attn_params &params, const cu_stream &s,
                                                unsigned char *smem, cu_att_meta &mt)
{
    unsigned char *base = smem + ATT_MMA_STAGES * ATT_MMA_STAGE_BYTES;
    mt.blk = (int32_t *)base;
    mt.msk = (uint32_t *)(base + ATT_MMA_META_BLK * 4);
    mt.page = (int32_t *)(base + ATT_MMA_META_BLK * 8);
    mt.ppb = s.B > params.page_size ? s.B >> params.log_page_size : 1;
    mt.bi0 = 0;
    mt.first = 0;
    if (s.u1 <= s.u0)
        return 1;
    const int32_t *pt = params.meta.page_table + (int64_t)s.r * params.cap_pages;
    if (s.sparse) {
        mt.bi0 = s.u0 / s.B;
        const int32_t nblk = (s.u1 + s.B - 1) / s.B - mt.bi0;
        if (nblk > ATT_MMA_META_BLK || nblk * mt.ppb > ATT_MMA_META_PAGES)
            return 0;
        for (int32_t i = threadIdx.x; i < nblk; i += ATT_MMA_THREADS) {
            mt.blk[i] = s.uid[mt.bi0 + i];
            mt.msk[i] = s.masks[mt.bi0 + i];
        }
        __syncthreads();
        for (int32_t e = threadIdx.x; e < nblk * mt.ppb; e += ATT_MMA_THREADS) {
            const int32_t b = e / mt.ppb;
            const int32_t pos0 = mt.blk[b] * s.B + (e - b * mt.ppb) * params.page_size;
            mt.page[e] = pt[pos0 >> params.log_page_size];
        }
    } else {
        mt.first = s.u0 >> params.log_page_size;
        const int32_t np = ((s.u1 - 1) >> params.log_page_size) - mt.first + 1;
        if (np > ATT_MMA_META_PAGES)
            return 0;
        for (int32_t e = threadIdx.x; e < np; e += ATT_MMA_THREADS)
            mt.page[e] = pt[mt.first + e];
    }
    __syncthreads();
    return 1;
}

/* Row metadata of tile j from the shared copy. */
__device__ __forceinline__ cu_att_loc cu_att_meta_loc(const cu_attn_params &params,
                                                      const cu_stream &s, const cu_att_meta &mt,
                                                      int32_t j)
{
    cu_att_loc b;
    const int32_t u = s.u0 + j * CU_TILE_KEYS + (threadIdx.x >> 1);
    b.pos = 0;
    b.page = 0;
    b.use = 0u;
    if (u >= s.u1)
        return b;
    if (s.sparse) {
        const int32_t bi = u / s.B;
        const int32_t off = u - bi * s.B;
        const int32_t i = bi - mt.bi0;
        b.pos = mt.blk[i] * s.B + off;
        b.page = mt.page[i * mt.ppb + (mt.ppb > 1 ? off >> params.log_page_size : 0)];
        b.use = b.pos < s.kl ? mt.msk[i] & cu_causal_bits(b.pos, s.base, s.ql) : 0u;
    } else {
        b.pos = u;
        b.page = mt.page[(u >> params.log_page_size) - mt.first];
        b.use = cu_causal_bits(u, s.base, s.ql);
    }
    return b;
}

template <typename Tag, int KF, int RT>
__device__ void cu_att_item_run(const cu_attn_params &params, unsigned char *smem,
                                const cu_att_item &it)
{
    constexpr int KS = 4 / RT;            /* warps sharing one row tile */
    constexpr int KW = CU_TILE_KEYS / KS; /* keys per warp per tile */
    constexpr int NS = KW / 8;            /* S n-tiles */
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int rt = warp % RT;
    const int ks = warp / RT;
    const int key_base = ks * KW;

    const cu_stream cs = cu_stream_of(params, it);
    const int32_t ntiles = (cs.u1 - cs.u0 + CU_TILE_KEYS - 1) / CU_TILE_KEYS;

    /* Rows of this thread and their query fragments. */
    const int row_lo = rt * 16 + (lane >> 2);
    const int row_hi = row_lo + 8;
    const bool ok_lo = row_lo < it.nrows, ok_hi = row_hi < it.nrows;
    int tok_lo = 31, tok_hi = 31;
    int64_t q_lo = 0, q_hi = 0;
    if (ok_lo) {
        const int32_t row = it.row0 + row_lo;
        tok_lo = row / params.group;
        q_lo = (int64_t)(cs.t0 + tok_lo) * params.q_heads + it.group * params.group +
               (row - tok_lo * params.group);
    }
    if (ok_hi) {
        const int32_t row = it.row0 + row_hi;
        tok_hi = row / params.group;
        q_hi = (int64_t)(cs.t0 + tok_hi) * params.q_heads + it.group * params.group +
               (row - tok_hi * params.group);
    }
    uint32_t qa[8][4];
    cu_rows_load_q(params.q, q_lo, q_hi, ok_lo, ok_hi, qa);
    float o[16][4], m_lo, m_hi, l_lo, l_hi;
    cu_rows_clear(o, m_lo, m_hi, l_lo, l_hi);
    /* Scores in log2 units; quantized keys' scores are products with the
     * codes' values. */
    constexpr bool CODES = cu_att_ring<KF>::CODES;
    const float sl2 = params.scale * CU_LOG2E * (CODES ? params.k_scale : 1.0f);

    cu_att_meta mt;
    const int meta = cu_att_meta_load(params, cs, smem, mt);
    for (int s = 0; s < ATT_MMA_STAGES - 1; ++s) {
        if (s < ntiles)
            cu_att_issue<KF>(params, smem, it.group,
                             meta ? cu_att_meta_loc(params, cs, mt, s)
                                  : cu_att_locate(params, cs, cu_att_lookup(cs, s)),
                             s);
        cu_cp_async_commit();
    }
    /* The token bits of the prologue's tiles, visible to every warp
     * before the loop reads them. */
    __syncthreads();
    unsigned char *wide = smem + ATT_FP8_WIDE_OFFSET; /* codes: widened K, then V */
    for (int32_t j = 0; j < ntiles; ++j) {
        cu_cp_async_wait<ATT_MMA_STAGES - 2>();
        const unsigned char *st = smem + (j % ATT_MMA_STAGES) * cu_att_ring<KF>::STAGE;
        const uint32_t *kmask = (const uint32_t *)(st + 2 * cu_att_ring<KF>::TILE);

        /* A warp whose tokens use none of its keys in this tile skips it:
         * with selections that differ per token most of a union is such.
         * The token bits were written before the last barrier (the
         * prologue's or the previous tile's), so they are read before
         * this tile's. */
        uint32_t used = 0u;
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const uint32_t km = kmask[key_base + n * 8 + 2 * (lane & 3) + e];
                used |= (km >> tok_lo) | (km >> tok_hi);
            }
        const bool warp_used = __any_sync(0xffffffffu, used & 1u);
        /* Codes: the barrier also says whether any warp uses the tile. */
        bool cta_used = true;
        if (CODES)
            cta_used = __syncthreads_or(used & 1u) != 0;
        else
            __syncthreads();
        const int32_t jn = j + ATT_MMA_STAGES - 1;
        if (jn < ntiles)
            cu_att_issue<KF>(params, smem, it.group,
                             meta ? cu_att_meta_loc(params, cs, mt, jn)
                                  : cu_att_locate(params, cs, cu_att_lookup(cs, jn)),
                             jn % ATT_MMA_STAGES);
        cu_cp_async_commit();

        uint32_t ka = cu_smem_addr(st);
        uint32_t va = ka + ATT_MMA_TILE_BYTES;
        if (CODES) {
            /* Every warp read the previous tile's widened rows before the
             * barrier above; after this one, every warp sees these. */
            if (!cta_used)
                continue;
            /* The CTA's 128 threads, each code once (widen_tile.cuh). */
            static_assert(ATT_MMA_THREADS == 128, "the tile widening takes 128 threads");
            const uint32_t cs = cu_smem_addr(st), ws = cu_smem_addr(wide);
#pragma unroll
            for (int kv = 0; kv < 2; ++kv) {
                const uint32_t src = cs + (uint32_t)(kv * ATT_FP8_TILE_BYTES);
                const uint32_t dst = ws + (uint32_t)(kv * ATT_MMA_TILE_BYTES);
                if (KF == CU_PLANE_NVFP4)
                    cu_widen_nvfp4_tile<Tag, CU_TILE_KEYS, cu_swz256>(src, dst, threadIdx.x);
                else
                    cu_widen_fp8_tile<Tag, CU_TILE_KEYS, cu_swz256>(src, dst, threadIdx.x);
            }
            __syncthreads();
            ka = cu_smem_addr(wide);
            va = ka + ATT_MMA_TILE_BYTES;
        }
        if (!warp_used)
            continue;

        float sc[NS][4];
        cu_rows_qk<Tag, NS, cu_swz256>(ka, key_base, qa, sc);
        /* Mask, scale to log2 units, online softmax. */
#pragma unroll
        for (int n = 0; n < NS; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const uint32_t km = kmask[key_base + n * 8 + 2 * (lane & 3) + e];
                sc[n][e] = ((km >> tok_lo) & 1u) ? sc[n][e] * sl2 : -INFINITY;
                sc[n][2 + e] = ((km >> tok_hi) & 1u) ? sc[n][2 + e] * sl2 : -INFINITY;
            }
        }
        cu_rows_softmax<NS>(sc, o, m_lo, m_hi, l_lo, l_hi);
        cu_rows_pv<Tag, KW, cu_swz256>(va, key_base, sc, o);
    }
    cu_cp_async_wait<0>();
    cu_rows_sum_quads(l_lo, l_hi);

    /* Merge the key slices of one row tile (warps ks > 0 into ks = 0). */
    __syncthreads();
    if (KS > 1) {
        float *comb = (float *)smem;
        if (ks > 0)
            cu_rows_save(comb + ((ks - 1) * RT + rt) * CU_ROWS_SLOT_FLOATS, o, m_lo, m_hi, l_lo,
                         l_hi);
        __syncthreads();
        if (ks == 0)
            for (int k2 = 1; k2 < KS; ++k2)
                cu_rows_absorb(comb + ((k2 - 1) * RT + rt) * CU_ROWS_SLOT_FLOATS, o, m_lo, m_hi,
                               l_lo, l_hi);
    }
    if (CODES && ks == 0) /* O holds sums of weights times the V codes' values */
        cu_rows_rescale(o, params.v_scale, params.v_scale);
    if (ks == 0)
        cu_rows_write<Tag>(params, it, row_lo, q_lo, q_hi, ok_lo, ok_hi, o, m_lo, m_hi, l_lo, l_hi);
    __syncthreads(); /* the shared memory is reused by the next item */
}

template <typename Tag, int KF>
__global__ void __launch_bounds__(ATT_MMA_THREADS, 2) cu_attn_mma_kernel(cu_attn_params params)
{
    cu_pdl_wait();
    cu_pdl_trigger();
    extern __shared__ __align__(128) unsigned char smem[];
    const int32_t n_items = params.meta.hdr->n_att[params.kind];
    const cu_att_item *items = params.meta.att[params.kind];
    for (int32_t ii = blockIdx.x; ii < n_items; ii += gridDim.x) {
        const cu_att_item it = items[ii];
        if (it.nrows <= 16)
            cu_att_item_run<Tag, KF, 1>(params, smem, it);
        else if (it.nrows <= 32)
            cu_att_item_run<Tag, KF, 2>(params, smem, it);
        else
            cu_att_item_run<Tag, KF, 4>(params, smem, it);
    }
}

void cu_launch_attn_decode_mma(const cu_attn_params *params, const cu_plan_state *st,
                               cudaStream_t s)
{
#define ATT_MMA_LAUNCH(TAG, KF)                                                   \
    cu_launch(cu_attn_mma_kernel<TAG, KF>, st->sz.grid_att_fast, ATT_MMA_THREADS, \
              ATT_MMA_SMEM_BYTES, s, st->pdl, *params)
    CU_LAUNCH_BY_FORMAT(params->act_dtype, params->kv_dtype, ATT_MMA_LAUNCH);
#undef ATT_MMA_LAUNCH
}

cudaError_t cu_attn_mma_setup(int num_sms, int *grid)
{
    cudaError_t e = cu_allow_smem(ATT_MMA_SMEM_BYTES, cu_attn_mma_kernel<cu_bf16_tag, CU_PLANE_16>,
                                  cu_attn_mma_kernel<cu_f16_tag, CU_PLANE_16>,
                                  cu_attn_mma_kernel<cu_bf16_tag, CU_PLANE_FP8>,
                                  cu_attn_mma_kernel<cu_f16_tag, CU_PLANE_FP8>,
                                  cu_attn_mma_kernel<cu_bf16_tag, CU_PLANE_NVFP4>,
                                  cu_attn_mma_kernel<cu_f16_tag, CU_PLANE_NVFP4>);
    if (e != cudaSuccess)
        return e;
    int occ = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ,
                                                      cu_attn_mma_kernel<cu_bf16_tag, CU_PLANE_16>,
                                                      ATT_MMA_THREADS, ATT_MMA_SMEM_BYTES);
    if (e != cudaSuccess)
        return e;
    *grid = num_sms * (occ > 0 ? occ : 1);
    return cudaSuccess;
}
