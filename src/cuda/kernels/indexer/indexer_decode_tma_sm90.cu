/*
 * Decode indexer, Hopper path: bf16/fp16 index keys with Di = 128 and
 * B = P = 128 (a key block is one page: 32 KB of contiguous rows), at most
 * 64 query columns (q_len x Hi) per request.
 *
 * Work split: the blocks of all decode requests with more than K blocks
 * end to end (the others select every block: nothing to score).  The first
 * three quarters go in equal contiguous shares, one per CTA; the rest in
 * chunks of IDX_TMA_CHUNK blocks, taken on demand (a counter in the plan's
 * workspace) by the CTAs that finish their share first.  Equal shares
 * alone do not end together: with every SM reading, some get less of the
 * memory's bandwidth than others (the first CTAs ended 10-20% before the
 * last on the H200), and the last quarter evens that out.  Every CTA asks
 * until it is told there is none left, so the counter's last value is
 * known: the CTA that draws it puts the counter back to 0 for the next
 * launch (graph replays included).
 *
 * One producer warp looks up the pages of up to 32 blocks at a time and
 * streams whole blocks through a ring of tensor-map copies, telling the
 * consumers each slot's block (an id of -1 ends the CTA's work); two
 * consumer warpgroups take the blocks in turn, one block each, with no
 * CTA-wide barrier: a block's ring slot is handed back as soon as its
 * group's products are done.
 *
 * A consumer group multiplies every query column of the block's request
 * (the M side: 64 rows, columns past q_len x Hi are zero; held in registers
 * while the group stays in one request) with the block's 128 keys (the N
 * side, read by the tensor cores straight from the ring slot): eight
 * asynchronous 64 x 128 x 16 products (wgmma), so each index key is read
 * from memory once for all tokens and index heads, and a block costs the
 * group a few dozen instructions besides its score epilogue.  Products of
 * 16-bit values are exact in fp32 and accumulate in fp32.  A thread then
 * holds 32 keys of two query columns: the block max (or log-sum-exp) is
 * reduced in registers and across the four lanes of a column, and written
 * straight to the score rows.
 *
 * Quantized index keys (fp8_e4m3, nvfp4): the producer streams their
 * codes into a ring of their own, converter warps widen each block into
 * the 16-bit ring, and the consumers run unchanged, the index-K scale on
 * their scores (indexer_decode_tma_q_sm90.cuh).  Codes widen to fp16
 * whatever the activations' type; bf16 queries are scaled into fp16
 * (q_f16.cuh).
 *
 * The products exist on sm_90a only; other chips take the portable
 * indexer (forward.cu checks st->wgmma).
 */
#include "cuda/params.cuh"
#include "cuda/arch/tma_sm90.cuh"
#include "cuda/arch/wgmma_sm90.cuh"
#include "cuda/arch/launch.cuh"
#include "cuda/common/timeline.cuh"
#include "cuda/common/q_f16.cuh"

/* One ring slot per block in flight; block x goes to group x % IDX_TMA_GROUPS
 * and slot x % IDX_TMA_STAGES.  The stage count is a multiple of the group
 * count, so every slot is consumed in order by a single group and a barrier
 * phase is never waited on a lap early.  While a group computes, the other
 * slots load.  Four 32 KB stages: on the H200 six were up to 3% slower,
 * and at no measured shape faster; a guess: with less
 * shared memory held, the next kernel's CTAs find room on the SMs sooner. */
#define IDX_TMA_GROUPS 2
#define IDX_TMA_STAGES 4
static_assert(IDX_TMA_STAGES % IDX_TMA_GROUPS == 0, "indexer stages: a multiple of the groups");
/* Threads: the consumer groups, the producer warp, and for quantized
 * keys the converter warps. */
#define IDX_TMA_THREADS(KF) \
    ((IDX_TMA_GROUPS * 4 + 1 + ((KF) == CU_PLANE_16 ? 0 : IDXQ_CONVERTERS)) * 32)
/* The tile shapes: a key block is one page of IDX_TMA_BLOCK_ROWS index
 * keys of IDX_TMA_INDEX_DIM 16-bit dimensions, copied as two tensor-map
 * boxes of IDX_TMA_BOX_COLS columns (128-byte swizzle) and multiplied in
 * k-steps of 16 dimensions (m64n128k16). */
#define IDX_TMA_INDEX_DIM 128
#define IDX_TMA_BLOCK_ROWS 128
#define IDX_TMA_BOX_COLS 64
#define IDX_TMA_ROW_BYTES (IDX_TMA_INDEX_DIM * 2)
#define IDX_TMA_ROW_WORDS (IDX_TMA_INDEX_DIM / 2) /* 32-bit words of a query row */
#define IDX_TMA_K_STEPS (IDX_TMA_INDEX_DIM / 16)
#define IDX_TMA_STEPS_PER_BOX (IDX_TMA_BOX_COLS / 16)
#define IDX_TMA_BLOCK_BYTES (IDX_TMA_BLOCK_ROWS * IDX_TMA_ROW_BYTES)
static_assert(IDX_TMA_BOX_COLS * 2 == 128, "a box row is one 128-byte swizzle span");
static_assert(2 * IDX_TMA_BOX_COLS == IDX_TMA_INDEX_DIM, "a key row is two boxes");
static_assert(IDX_TMA_BLOCK_ROWS == 128, "the products are m64n128: one block's keys per product");
static_assert(IDX_TMA_K_STEPS == 8, "the query fragments hold eight k-steps (a[8][4])");
/* Shared memory: the ring (16-bit keys), then for quantized keys the
 * code ring, then the barriers (full, empty, and the code ring's) and the
 * slots' blocks (and the code ring's). */
#define IDX_TMA_RING_BYTES (IDX_TMA_STAGES * IDX_TMA_BLOCK_BYTES)
#define IDX_TMA_QRING_BYTES(KF) ((KF) == CU_PLANE_16 ? 0 : IDX_TMA_STAGES * IDXQ_SLOT_BYTES)
#define IDX_TMA_SMEM_BYTES(KF) \
    (IDX_TMA_RING_BYTES + IDX_TMA_QRING_BYTES(KF) + 1024 + 6 * IDX_TMA_STAGES * 8)
/* Blocks per chunk taken on demand: small, for an even end; the next
 * chunk's number is asked for while the current one streams.  Steps of
 * fewer than IDX_TMA_CHUNKED_MIN blocks per CTA keep fixed shares only. */
#define IDX_TMA_CHUNK 2
#define IDX_TMA_CHUNKED_MIN 8

#include "cuda/kernels/indexer/indexer_decode_tma_q_sm90.cuh"

static_assert(IDXQ_NV_CODE_BYTES + IDXQ_NV_SCALE_BYTES <= IDXQ_SLOT_BYTES &&
                  IDX_TMA_BLOCK_ROWS * 128 == IDXQ_SLOT_BYTES,
              "a quantized block fits a code-ring slot");

#ifdef CU_HAVE_WGMMA

/* The decode slot of block gb, walking forward from slot k. */
__device__ __forceinline__ int32_t cu_idxt_slot(const cu_indexer_params &params, int32_t k,
                                                int32_t n_dec, int32_t gb)
{
    while (k + 1 < n_dec && params.meta.dec_blk0[k + 1] <= gb)
        ++k;
    return k;
}

/* max that returns NaN when either operand is NaN (a NaN key poisons its
 * block, SPEC 4; fmaxf would drop it). */
__device__ __forceinline__ float cu_fmax_nan(float a, float b)
{
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

/* A fragments of the request's query columns for the eight k-steps: rows
 * c_lo = 16 w + lane / 4 and c_hi = c_lo + 8 of the group's 64; columns at
 * or past nq are zero.  Word ks * 8 + lane % 4 holds dimensions
 * 16 ks + 2 (lane % 4) and the next. */
__device__ __forceinline__ void cu_idxt_afrags(const cu_indexer_params &params, int32_t t0,
                                               int32_t nq, int32_t c_lo, uint32_t (&a)[8][4])
{
    const int lane = threadIdx.x & 31;
    const uint32_t *q =
        (const uint32_t *)params.index_q + (int64_t)t0 * params.num_index_heads * IDX_TMA_ROW_WORDS;
    const bool ok_lo = c_lo < nq, ok_hi = c_lo + 8 < nq;
    const uint32_t *lo = q + (int64_t)c_lo * IDX_TMA_ROW_WORDS + (lane & 3);
    const uint32_t *hi = lo + 8 * IDX_TMA_ROW_WORDS;
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
        a[ks][0] = ok_lo ? __ldg(lo + ks * 8) : 0u;
        a[ks][1] = ok_hi ? __ldg(hi + ks * 8) : 0u;
        a[ks][2] = ok_lo ? __ldg(lo + ks * 8 + 4) : 0u;
        a[ks][3] = ok_hi ? __ldg(hi + ks * 8 + 4) : 0u;
    }
}

/* Block score of this thread's two columns over its 32 keys of the block
 * (key 8j + 2 (lane % 4) + e of d[j][e] / d[j][2 + e]), then across the
 * four lanes that share the columns.  Keys past a column's last visible
 * position (MASK) do not count: max of no keys is -inf.  kscale: the
 * index-K plane's scale, which turns products with quantized keys' codes
 * into the de-quantized keys' scores (1 for 16-bit keys), times the
 * factor of queries scaled into fp16 (q_f16.cuh); it multiplies
 * the scores before the log-sum-exp, and the max after (a positive factor
 * keeps the order, so the product of the max is the max of the products,
 * rounding included). */
template <bool LSE, bool MASK>
__device__ __forceinline__ void cu_idxt_epilogue(const float (&d)[16][4], int32_t key0,
                                                 int32_t last_lo, int32_t last_hi, float iscale,
                                                 float kscale, float &s_lo, float &s_hi)
{
    const int lane = threadIdx.x & 31;
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int32_t pos = key0 + 8 * j + 2 * (lane & 3) + e;
            const bool v_lo = !MASK || pos <= last_lo;
            const bool v_hi = !MASK || pos <= last_hi;
            const float x_lo = d[j][e], x_hi = d[j][2 + e];
            if (LSE) {
                if (v_lo)
                    cu_lse_merge(m_lo, l_lo, x_lo * kscale * iscale, 1.0f);
                if (v_hi)
                    cu_lse_merge(m_hi, l_hi, x_hi * kscale * iscale, 1.0f);
            } else {
                m_lo = cu_fmax_nan(m_lo, v_lo ? x_lo : -INFINITY);
                m_hi = cu_fmax_nan(m_hi, v_hi ? x_hi : -INFINITY);
            }
        }
    }
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
        const float a = __shfl_xor_sync(0xffffffffu, m_lo, o);
        const float b = __shfl_xor_sync(0xffffffffu, m_hi, o);
        if (LSE) {
            cu_lse_merge(m_lo, l_lo, a, __shfl_xor_sync(0xffffffffu, l_lo, o));
            cu_lse_merge(m_hi, l_hi, b, __shfl_xor_sync(0xffffffffu, l_hi, o));
        } else {
            m_lo = cu_fmax_nan(m_lo, a);
            m_hi = cu_fmax_nan(m_hi, b);
        }
    }
    if (LSE) {
        s_lo = cu_lse_value(m_lo, l_lo);
        s_hi = cu_lse_value(m_hi, l_hi);
    } else {
        s_lo = isnan(m_lo) ? __int_as_float(0x7fc00000) : m_lo * kscale;
        s_hi = isnan(m_hi) ? __int_as_float(0x7fc00000) : m_hi * kscale;
    }
}

/* What a consumer thread keeps of its block's request di: the query
 * columns (nq), the position of the first token (base), the last
 * position its two columns c_lo, c_lo + 8 see, and their A fragments;
 * QCVT: bf16 queries scaled into fp16 (q_f16.cuh), the warp's score
 * factor in q_back (else 1). */
template <bool QCVT>
__device__ __forceinline__ void cu_idxt_request(const cu_indexer_params &params,
                                                const cu_dec_info &di, int32_t c_lo, int32_t &nq,
                                                int32_t &base, int32_t &last_lo, int32_t &last_hi,
                                                uint32_t (&a)[8][4], float &q_back)
{
    nq = di.ql * params.num_index_heads;
    base = di.kl - di.ql;
    last_lo = base + ((c_lo * params.index_heads_magic) >> 16); /* column / Hi = token */
    last_hi = base + (((c_lo + 8) * params.index_heads_magic) >> 16);
    cu_idxt_afrags(params, di.t0, nq, c_lo, a);
    q_back = QCVT ? cu_q_bf16_to_f16(a) : 1.0f;
}

/* Group g's ring uses g, g + IDX_TMA_GROUPS, ... until the producer's end
 * mark (block id -1); the CTA's fixed share starts at block gb_begin (F
 * blocks); kscale as for cu_idxt_epilogue.  Tag: the products' type;
 * QCVT: bf16 queries taken to it (cu_idxt_request). */
template <typename Tag, bool LSE, bool QCVT>
__device__ void cu_idxt_consumer(const cu_indexer_params &params, unsigned char *ring,
                                 uint64_t *full, uint64_t *empty, const volatile int32_t *slot_gb,
                                 int32_t gb_begin, int32_t F, int32_t n_dec, int g, float kscale)
{
    const int lane = threadIdx.x & 31;
    const int32_t c_lo = 16 * ((threadIdx.x >> 5) & 3) + (lane >> 2); /* query columns */
    const int32_t c_hi = c_lo + 8;
    const int32_t Hi = params.num_index_heads, cap_blocks = params.cap_blocks;
    const float iscale = params.index_scale;
    float *const scores = params.scores;
    /* The request of the share's first block is looked up, and its queries
     * loaded, while the block is on its way; without a share the first
     * block looks its request up (blk1 = 0). */
    int32_t kslot = -1, k = -1;
    cu_dec_info di = {};
    if (F > 0) {
        kslot = cu_dec_of_block(params.meta.dec_blk0, n_dec, gb_begin);
        di = params.meta.dec_info[kslot];
    }
    uint32_t a[8][4];
    int32_t nq = 0, base = 0, last_lo = 0, last_hi = 0;
    float q_back = 1.0f; /* the scores' factor of the queries' scale */
    float d[16][4];
#pragma unroll
    for (int j = 0; j < 16; ++j)
        d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.0f;
    for (int32_t i = g;; i += IDX_TMA_GROUPS) {
        if (kslot != k) {
            k = kslot;
            cu_idxt_request<QCVT>(params, di, c_lo, nq, base, last_lo, last_hi, a, q_back);
        }
        const int s = i % IDX_TMA_STAGES;
        cu_mbar_wait(&full[s], (uint32_t)(i / IDX_TMA_STAGES) & 1u);
        const int32_t gb = slot_gb[s];
        if (gb < 0)
            break;
        if (gb >= di.blk1) {
            cu_idxt_next_request(params, n_dec, gb, kslot, di);
            k = kslot;
            cu_idxt_request<QCVT>(params, di, c_lo, nq, base, last_lo, last_hi, a, q_back);
        }
        if (i == 0 && threadIdx.x == 0)
            CU_TL_MARK(params, CU_TL_INDEXER, CU_TL_FIRST);
        if (threadIdx.x == 0) /* overwritten by every tile: the last one stays */
            CU_TL_MARK(params, CU_TL_INDEXER, CU_TL_LAST);
        const uint32_t slot = cu_smem_addr(ring + s * IDX_TMA_BLOCK_BYTES);
        cu_wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < IDX_TMA_K_STEPS; ++ks) {
            /* Dimensions 0-63 in the first box, 64-127 in the second; a
             * k-step is 16 dimensions, 32 bytes of a swizzled row. */
            const uint32_t at = slot +
                                (uint32_t)(ks / IDX_TMA_STEPS_PER_BOX) * (IDX_TMA_BLOCK_BYTES / 2) +
                                (uint32_t)(ks % IDX_TMA_STEPS_PER_BOX) * 32u;
            cu_wgmma_m64n128k16<0>(d, a[ks], cu_wgmma_desc(at, 16), ks > 0, Tag());
        }
        cu_wgmma_commit();
        cu_wgmma_wait_all();
        cu_wgmma_hold(d);
        /* The group's reads of the slot are done: hand it back.  Every
         * lane arrives, each releasing its own reads of the slot (one
         * arrival per warp after a warp barrier is ordered too, but
         * compute-sanitizer's racecheck reports it). */
        cu_mbar_arrive(&empty[s]);
        const int32_t n = gb - di.blk0;
        const int32_t key0 = n * IDX_TMA_BLOCK_ROWS;
        float s_lo, s_hi;
        if (key0 + IDX_TMA_BLOCK_ROWS - 1 <= base) /* every key visible to every token */
            cu_idxt_epilogue<LSE, false>(d, key0, last_lo, last_hi, iscale, kscale * q_back, s_lo,
                                         s_hi);
        else
            cu_idxt_epilogue<LSE, true>(d, key0, last_lo, last_hi, iscale, kscale * q_back, s_lo,
                                        s_hi);
        if ((lane & 3) == 0) {
            /* Score row of column c: the request's rows start at d0 * Hi. */
            const int64_t row0 = (int64_t)di.d0 * Hi;
            if (c_lo < nq)
                scores[(row0 + c_lo) * cap_blocks + n] = s_lo;
            if (c_hi < nq)
                scores[(row0 + c_hi) * cap_blocks + n] = s_hi;
        }
    }
}

/* Ring use x (lane 0): slot x % IDX_TMA_STAGES, once its previous use is
 * handed back, announced as block gb; a block (gb >= 0, page pg) arrives
 * by its copies (16-bit rows: two boxes; fp8 codes: one; nvfp4: the
 * page's codes and scales, two bulk copies), an end mark by a plain
 * arrival. */
template <int KF>
__device__ __forceinline__ void cu_idxt_put(const cu_indexer_params &params, const CUtensorMap *map,
                                            unsigned char *ring, uint64_t *full, uint64_t *empty,
                                            volatile int32_t *slot_gb, int32_t x, int32_t gb,
                                            int32_t pg)
{
    const int s = x % IDX_TMA_STAGES;
    const int32_t use = x / IDX_TMA_STAGES;
    if (use > 0)
        cu_mbar_wait(&empty[s], (uint32_t)(use - 1) & 1u);
    slot_gb[s] = gb;
    if (gb < 0) {
        cu_mbar_arrive(&full[s]);
        return;
    }
    unsigned char *dst = ring + s * (KF == CU_PLANE_16 ? IDX_TMA_BLOCK_BYTES : IDXQ_SLOT_BYTES);
    /* Index keys are read once per step: their lines go first from L2, so
     * the stream does not push out what the next kernels read again (the
     * block scores, the plan).  On the H200 this took 0.5-3% off steps of
     * 10K to 200K context. */
    const uint64_t pol = cu_l2_evict_first();
    if (KF == CU_PLANE_16) {
        cu_mbar_arrive_tx(&full[s], IDX_TMA_BLOCK_BYTES);
        cu_tma_load_rows_hint(dst, map, 0, 0, 0, pg, &full[s], pol);
        cu_tma_load_rows_hint(dst + IDX_TMA_BLOCK_BYTES / 2, map, IDX_TMA_BOX_COLS, 0, 0, pg,
                              &full[s], pol);
    } else if (KF == CU_PLANE_FP8) {
        cu_mbar_arrive_tx(&full[s], IDXQ_SLOT_BYTES);
        cu_tma_load_rows_hint(dst, map, 0, 0, 0, pg, &full[s], pol);
    } else {
        /* The page's region in the library layout (cu_nvfp4_row): its
         * codes, then its scales; 16-byte aligned (cu_nvfp4_pages_bulk). */
        const cu_qrow q = cu_nvfp4_row(cu_plane_row(params.index_k_strides, pg, 0, 0), 0,
                                       IDX_TMA_BLOCK_ROWS, IDX_TMA_INDEX_DIM);
        const unsigned char *plane = (const unsigned char *)params.index_k_plane;
        cu_mbar_arrive_tx(&full[s], IDXQ_NV_CODE_BYTES + IDXQ_NV_SCALE_BYTES);
        cu_bulk_load_hint(dst, plane + q.at, IDXQ_NV_CODE_BYTES, &full[s], pol);
        cu_bulk_load_hint(dst + IDXQ_NV_CODE_BYTES, plane + q.scales, IDXQ_NV_SCALE_BYTES, &full[s],
                          pol);
    }
}

/* Blocks gb0 .. gb0 + cnt - 1 (cnt <= 32) into the ring from use x on:
 * their pages looked up one per lane (k: the decode slot of gb0 or an
 * earlier one), then the copies issued in order. */
template <int KF>
__device__ __forceinline__ void cu_idxt_stream(const cu_indexer_params &params,
                                               const CUtensorMap *map, unsigned char *ring,
                                               uint64_t *full, uint64_t *empty,
                                               volatile int32_t *slot_gb, int32_t &x, int32_t k,
                                               int32_t n_dec, int32_t gb0, int32_t cnt,
                                               bool wait_first)
{
    const int lane = threadIdx.x & 31;
    int32_t page = 0;
    if (lane < cnt) {
        const int32_t gb = gb0 + lane;
        const int32_t kk = cu_idxt_slot(params, k, n_dec, gb);
        const cu_dec_info di = params.meta.dec_info[kk];
        page = params.meta.page_table[(int64_t)di.r * params.cap_pages + (gb - di.blk0)];
    }
    if (wait_first) {
        cu_pdl_wait(); /* the prologue's index keys, before the first copy */
        if (lane == 0)
            CU_TL_MARK(params, CU_TL_INDEXER, CU_TL_WAITED);
    }
    for (int32_t j = 0; j < cnt; ++j) {
        const int32_t pg = __shfl_sync(0xffffffffu, page, j);
        if (lane == 0) {
            cu_idxt_put<KF>(params, map, ring, full, empty, slot_gb, x, gb0 + j, pg);
            if (x == 0)
                CU_TL_MARK(params, CU_TL_INDEXER, CU_TL_ISSUED);
        }
        ++x;
        __syncwarp();
    }
}

/* The CTA's fixed share [gb_begin, gb_begin + F), then chunks on demand
 * from blocks stat .. total - 1, then an end mark for each group. */
template <int KF>
__device__ void cu_idxt_producer(const cu_indexer_params &params, const CUtensorMap *map,
                                 unsigned char *ring, uint64_t *full, uint64_t *empty,
                                 volatile int32_t *slot_gb, int32_t gb_begin, int32_t F,
                                 int32_t stat, int32_t total, int32_t n_dec)
{
    const int lane = threadIdx.x & 31;
    int32_t x = 0;
    int32_t k = F > 0 ? cu_dec_of_block(params.meta.dec_blk0, n_dec, gb_begin) : 0;
    for (int32_t c0 = 0; c0 < F; c0 += 32) {
        const int32_t cnt = min(32, F - c0);
        cu_idxt_stream<KF>(params, map, ring, full, empty, slot_gb, x, k, n_dec, gb_begin + c0, cnt,
                           c0 == 0);
        k = cu_idxt_slot(params, k, n_dec, gb_begin + c0 + cnt - 1);
    }
    if (F == 0) {
        cu_pdl_wait(); /* the prologue's index keys, before any copy */
        if (lane == 0)
            CU_TL_MARK(params, CU_TL_INDEXER, CU_TL_WAITED);
    }
    if (stat < total) {
        /* Chunk numbers: the next one is asked for before the current
         * chunk's pages, so the counter's round trip overlaps its copies.
         * Each CTA draws one number past the last chunk, then stops. */
        const int32_t chunks = (total - stat + IDX_TMA_CHUNK - 1) / IDX_TMA_CHUNK;
        int32_t next = 0;
        if (lane == 0)
            next = atomicAdd(params.next_chunk, 1);
        for (;;) {
            const int32_t c = __shfl_sync(0xffffffffu, next, 0);
            if (c >= chunks) {
                if (lane == 0 && c == chunks + (int32_t)gridDim.x - 1)
                    *params.next_chunk = 0; /* the last draw of this launch */
                break;
            }
            const int32_t gb0 = stat + c * IDX_TMA_CHUNK;
            if (lane == 0)
                next = atomicAdd(params.next_chunk, 1);
            cu_idxt_stream<KF>(params, map, ring, full, empty, slot_gb, x,
                               cu_dec_of_block(params.meta.dec_blk0, n_dec, gb0), n_dec, gb0,
                               min(IDX_TMA_CHUNK, total - gb0), false);
        }
    }
    if (lane == 0)
        for (int e = 0; e < IDX_TMA_GROUPS; ++e)
            cu_idxt_put<KF>(params, map, ring, full, empty, slot_gb, x + e, -1, 0);
    __syncwarp();
}

#endif /* CU_HAVE_WGMMA */

/* Asks L2 for `bytes` of plan data at p, this lane's lines from `first`
 * on, every `stride` bytes. */
__device__ __forceinline__ void cu_idxt_prefetch_span(const void *p, int64_t bytes, int64_t first,
                                                      int64_t stride)
{
    for (int64_t off = first; off < bytes; off += stride)
        cu_prefetch_l2((const char *)p + off);
}

/* The sparse attention starts with a chain of dependent loads of plan data
 * that only it reads (its unit, the unit's items, then the page row); a
 * request whose union is known from the plan copies its first tiles right
 * after that chain (attention_decode_tma_sm90.cu).  One warp per CTA asks L2 for those
 * lines now, while the indexer waits for the prologue, so the chain hits
 * L2 instead of DRAM.  Plan data may be read before the launch wait. */
__device__ __forceinline__ void cu_idxt_prefetch_att_plan(const cu_indexer_params &params)
{
    const int lane = threadIdx.x & 31;
    const int64_t stride = (int64_t)gridDim.x * 32 * 128;
    const int64_t first = ((int64_t)blockIdx.x * 32 + lane) * 128;
    cu_idxt_prefetch_span(params.meta.att_units,
                          (int64_t)params.meta.hdr->n_att_units * (int64_t)sizeof(int32_t), first,
                          stride);
    /* The attention CTAs' unit bounds (its grid is this one's). */
    cu_idxt_prefetch_span(params.meta.att_cta, ((int64_t)gridDim.x + 1) * (int64_t)sizeof(int32_t),
                          first, stride);
    cu_idxt_prefetch_span(params.meta.att[CU_KIND_SPARSE],
                          (int64_t)params.meta.hdr->n_att[CU_KIND_SPARSE] *
                              (int64_t)sizeof(cu_att_item),
                          first, stride);
}

/* KF: the format of the index keys (CU_PLANE_*); map: their tensor map
 * (none is read for nvfp4 keys). */
template <typename Tag, int KF>
__global__ void __launch_bounds__(IDX_TMA_THREADS(KF), 1)
    cu_indexer_tma_kernel(const __grid_constant__ cu_indexer_params params,
                          const __grid_constant__ CUtensorMap map)
{
#ifdef CU_HAVE_WGMMA
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *ring =
        (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023); /* swizzle atoms */
    /* Quantized keys: the code ring after the 16-bit one (1024-byte
     * aligned: swizzle atoms), with barriers and blocks of its own. */
    unsigned char *qring = ring + IDX_TMA_RING_BYTES;
    uint64_t *full = (uint64_t *)(qring + IDX_TMA_QRING_BYTES(KF));
    uint64_t *empty = full + IDX_TMA_STAGES;
    uint64_t *qfull = empty + IDX_TMA_STAGES, *qempty = qfull + IDX_TMA_STAGES;
    volatile int32_t *slot_gb =
        (volatile int32_t *)(qempty + IDX_TMA_STAGES); /* block of each slot */
    volatile int32_t *qslot_gb = slot_gb + IDX_TMA_STAGES;
    const int warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        CU_TL_MARK(params, CU_TL_INDEXER, CU_TL_ENTRY);
        for (int s = 0; s < IDX_TMA_STAGES; ++s) {
            /* 16-bit keys: the producer's copies; codes: every converter
             * lane's widening. */
            cu_mbar_init(&full[s], KF == CU_PLANE_16 ? 1 : IDXQ_CONVERTERS * 32);
            cu_mbar_init(&empty[s], 4 * 32); /* every lane of the slot's group */
            cu_mbar_init(&qfull[s], 1);
            cu_mbar_init(&qempty[s], IDXQ_CONVERTERS * 32);
        }
        cu_mbar_fence_init();
        if (KF != CU_PLANE_NVFP4)
            cu_tma_prefetch_map(&map);
    }
    __syncthreads();
    /* The prologue writes this step's index keys: the producer waits for
     * it before its first copy; the plan and the queries are read at once. */
    cu_pdl_trigger();
    if (warp == 0)
        cu_idxt_prefetch_att_plan(params);
    const int32_t n_dec = params.meta.hdr->n_dec;
    const int32_t total = (int32_t)params.meta.hdr->total_dec_blocks;
    /* Fixed shares of the first three quarters; all of it without the
     * counter, or below IDX_TMA_CHUNKED_MIN blocks per CTA (a short step:
     * nothing to even out that would pay for the counter's round trips). */
    const int32_t stat = params.next_chunk && total >= IDX_TMA_CHUNKED_MIN * (int32_t)gridDim.x
                             ? total - total / 4
                             : total;
    const int32_t gb_begin = (int32_t)((int64_t)stat * blockIdx.x / gridDim.x);
    const int32_t gb_end = (int32_t)((int64_t)stat * (blockIdx.x + 1) / gridDim.x);
    const int32_t F = gb_end - gb_begin;
    if (n_dec > 0 && total > 0) {
        /* The products' type: fp16 over codes (q_f16.cuh). */
        typedef typename cu_compute_tag<Tag, KF>::type CTag;
        constexpr bool QCVT = cu_q_converts<Tag, CTag>::value;
        const int g = warp >> 2;
        const float kscale = KF == CU_PLANE_16 ? 1.0f : params.index_k_scale;
        if (warp == IDX_TMA_GROUPS * 4 && KF == CU_PLANE_16)
            cu_idxt_producer<KF>(params, &map, ring, full, empty, slot_gb, gb_begin, F, stat, total,
                                 n_dec);
        else if (warp == IDX_TMA_GROUPS * 4) /* codes into the code ring */
            cu_idxt_producer<KF>(params, &map, qring, qfull, qempty, qslot_gb, gb_begin, F, stat,
                                 total, n_dec);
        else if (warp > IDX_TMA_GROUPS * 4)
            cu_idxq_converter<CTag, KF>(qring, qfull, qempty, qslot_gb, ring, full, empty, slot_gb,
                                        threadIdx.x - (IDX_TMA_GROUPS * 4 + 1) * 32);
        else if (params.score_lse)
            cu_idxt_consumer<CTag, true, QCVT>(params, ring, full, empty, slot_gb, gb_begin, F,
                                               n_dec, g, kscale);
        else
            cu_idxt_consumer<CTag, false, QCVT>(params, ring, full, empty, slot_gb, gb_begin, F,
                                                n_dec, g, kscale);
    }
    cu_pdl_wait(); /* every CTA, before it ends (arch/launch.cuh) */
    if (threadIdx.x == 0)
        CU_TL_MARK(params, CU_TL_INDEXER, CU_TL_EXIT);
#else
    (void)params;
    (void)map;
#endif
}

void cu_launch_indexer_tma(const cu_indexer_params *params, const cu_plan_state *st,
                           const CUtensorMap *map, cudaStream_t s)
{
#define IDX_TMA_LAUNCH(TAG, KF)                                                    \
    cu_launch(cu_indexer_tma_kernel<TAG, KF>, st->sz.num_sms, IDX_TMA_THREADS(KF), \
              IDX_TMA_SMEM_BYTES(KF), s, st->pdl, *params, *map)
    CU_LAUNCH_BY_FORMAT(params->act_dtype, params->index_dtype, IDX_TMA_LAUNCH);
#undef IDX_TMA_LAUNCH
}

cudaError_t cu_indexer_tma_setup(void)
{
    cudaError_t e = cu_allow_smem(IDX_TMA_SMEM_BYTES(CU_PLANE_16),
                                  cu_indexer_tma_kernel<cu_bf16_tag, CU_PLANE_16>,
                                  cu_indexer_tma_kernel<cu_f16_tag, CU_PLANE_16>);
    if (e != cudaSuccess)
        return e;
    return cu_allow_smem(IDX_TMA_SMEM_BYTES(CU_PLANE_FP8),
                         cu_indexer_tma_kernel<cu_bf16_tag, CU_PLANE_FP8>,
                         cu_indexer_tma_kernel<cu_f16_tag, CU_PLANE_FP8>,
                         cu_indexer_tma_kernel<cu_bf16_tag, CU_PLANE_NVFP4>,
                         cu_indexer_tma_kernel<cu_f16_tag, CU_PLANE_NVFP4>);
}
