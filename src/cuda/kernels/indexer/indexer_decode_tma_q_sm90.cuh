/*
 * The Hopper decode indexer's consumer groups for quantized index keys
 * (fp8_e4m3 codes, nvfp4 codes with their group scales), included by
 * indexer_decode_tma_sm90.cu, whose producer fills the ring: an fp8 block
 * is one tensor-map box of 128 rows x 128 code bytes (128-byte swizzle),
 * an nvfp4 block its page's 128 rows of 64 code bytes and then their 8
 * group-scale bytes, as the page lies in the plane (two bulk copies).
 *
 * The 16-bit consumer reads the keys as the products' B operand, straight
 * from the ring; codes are no operand type of a product with 16-bit
 * queries.  Here the roles swap: the keys are the A side (M: 128 keys as
 * two m64 products), widened by each thread in registers from its own
 * rows as they are loaded from the ring (quant_widen.cuh: every E4M3
 * value, and every E2M1 code times its E4M3 group scale, is exact in bf16
 * and in fp16), and the request's query columns are the B side (N: 64
 * columns), a tile in shared memory the group writes when its request
 * changes.  Nothing widened goes back to shared memory, and the ring slot
 * is handed back as soon as the codes are in registers, before the
 * products.
 *
 * A thread widens 32 consecutive dims of each of its rows (two 16-byte
 * fp8 loads, or one of nvfp4 codes and two scale bytes), so the k-order
 * of the products is permuted: k-step ks of the thread with lane % 4 = c
 * takes dims 32 c + 4 ks + {0, 1} (its A registers 0 and 1) and
 * 32 c + 4 ks + {2, 3} (registers 2 and 3).  The query tile stores each
 * column's dims in that order, so the products' sums are the plain dot
 * products.  The layer's index-K scale multiplies the fp32 scores, before
 * the block max or log-sum-exp, as the de-quantized keys' products
 * would; an fp8 NaN code makes its key's score NaN.
 *
 * A thread's accumulators hold 4 keys x 16 columns; the block score of a
 * column is reduced over the thread's keys, the 8 lanes that share the
 * column, then the group's four warps through shared memory (one group
 * barrier a block, two reduction buffers used in turn).
 */
#ifndef MSA_CUDA_KERNELS_INDEXER_INDEXER_DECODE_TMA_Q_SM90_CUH
#define MSA_CUDA_KERNELS_INDEXER_INDEXER_DECODE_TMA_Q_SM90_CUH

#include "cuda/common/plane_rows.cuh"
#include "cuda/common/quant_widen.cuh"

/* Formats of the ring's key rows. */
enum { IDXT_KEYS_16 = 0, IDXT_KEYS_FP8 = 1, IDXT_KEYS_NVFP4 = 2 };

/* An nvfp4 block in its ring slot: 128 rows of 64 code bytes, then each
 * row's 8 scale bytes. */
#define IDXQ_NV_CODE_BYTES (128 * 64)
#define IDXQ_NV_SCALE_BYTES (128 * 8)
/* A group's query tile: 64 columns x 128 dims of the 16-bit type as two
 * 128-byte-swizzled boxes of 64 k values each (as a product's K-major B
 * operand); then its reduction buffers: [2][4 warps][64 columns] of m,
 * then of l. */
#define IDXQ_QTILE_BYTES (64 * 256)
#define IDXQ_RED_FLOATS (2 * 2 * 4 * 64)
#define IDXQ_GROUP_BYTES (IDXQ_QTILE_BYTES + IDXQ_RED_FLOATS * 4)

#ifdef CU_HAVE_WGMMA

/* The request of block gb, past the current one (kslot, di), for both
 * kinds of consumer: blocks come in ascending order, so the next
 * request's, or after a jump to a chunk further on, a search. */
__device__ __forceinline__ void cu_idxt_next_request(const cu_indexer_params &params, int32_t n_dec,
                                                     int32_t gb, int32_t &kslot, cu_dec_info &di)
{
    const int32_t nk = kslot + 1 < n_dec ? kslot + 1 : kslot;
    const cu_dec_info nd = params.meta.dec_info[nk];
    kslot = gb < nd.blk1 ? nk : cu_dec_of_block(params.meta.dec_blk0, n_dec, gb);
    di = gb < nd.blk1 ? nd : params.meta.dec_info[kslot];
}

/* The group's query tile for the request whose first token is t0 (nq
 * columns, zero past them): chunk j (16 bytes) of box b of column n holds
 * k-step ks = 4 b + j / 2, half h = j % 2, that is the 32-bit words
 * 16 c + 2 ks + h of the column's row for c = 0..3 (dims
 * 32 c + 4 ks + 2 h and the next).  The first barrier keeps the tile
 * until every warp of the group has finished the products that read it. */
__device__ __forceinline__ void cu_idxq_queries(const cu_indexer_params &params, int32_t t0,
                                                int32_t nq, unsigned char *qtile, int g)
{
    const int t = threadIdx.x & 127;
    const uint32_t *q =
        (const uint32_t *)params.index_q + (int64_t)t0 * params.num_index_heads * IDX_TMA_ROW_WORDS;
    cu_named_sync(1 + g, 128);
    for (int i = t; i < 64 * 16; i += 128) {
        const int n = i >> 4, chunk = i & 15;
        const int ks = 4 * (chunk >> 3) + ((chunk & 7) >> 1), h = chunk & 1;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (n < nq) {
            const uint32_t *w = q + n * IDX_TMA_ROW_WORDS + 2 * ks + h;
            v = make_uint4(__ldg(w), __ldg(w + 16), __ldg(w + 32), __ldg(w + 48));
        }
        *(uint4 *)(qtile + cu_tswz(64, n, chunk)) = v;
    }
    cu_fence_proxy_async(); /* the products read the tile through the async proxy */
    cu_named_sync(1 + g, 128);
}

/* This thread's A registers of the block's keys: m-tile mt holds keys
 * 64 mt + 16 w + lane / 4 (h = 0) and + 8 (h = 1), w the warp in the
 * group.  Returns bit 2 mt + h set when that key holds an fp8 NaN code
 * among this thread's dims (nvfp4: the NaN scale byte widens to NaN
 * itself; no flags). */
template <typename Tag, int KF>
__device__ __forceinline__ uint32_t cu_idxq_widen(const unsigned char *tile,
                                                  uint32_t (&a)[2][IDX_TMA_K_STEPS][4])
{
    const int lane = threadIdx.x & 31;
    const int w = (threadIdx.x >> 5) & 3;
    const int c = lane & 3;
    uint32_t nan = 0;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = 64 * mt + 16 * w + 8 * h + (lane >> 2);
            if (KF == IDXT_KEYS_FP8) {
                const uint4 p0 = *(const uint4 *)(tile + row * 128 + (((2 * c) ^ (row & 7)) << 4));
                const uint4 p1 =
                    *(const uint4 *)(tile + row * 128 + (((2 * c + 1) ^ (row & 7)) << 4));
                const uint32_t v[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
                uint32_t any = 0;
#pragma unroll
                for (int ks = 0; ks < IDX_TMA_K_STEPS; ++ks) {
                    a[mt][ks][h] = cu_e4m3_widen2<0>(v[ks], Tag());
                    a[mt][ks][2 + h] = cu_e4m3_widen2<1>(v[ks], Tag());
                    any |= cu_e4m3_nan_bytes(v[ks]);
                }
                nan |= (any != 0u ? 1u : 0u) << (2 * mt + h);
            } else {
                /* 16 code bytes: dims 32 c .. + 31, groups 2 c and 2 c + 1. */
                const uint4 p = *(const uint4 *)(tile + row * 64 + c * 16);
                const uint32_t sb =
                    *(const uint16_t *)(tile + IDXQ_NV_CODE_BYTES + row * 8 + 2 * c);
                const float s0 = cu_e4m3_to_f32(sb & 0xffu), s1 = cu_e4m3_to_f32(sb >> 8);
                const uint32_t v[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
                for (int ks = 0; ks < IDX_TMA_K_STEPS; ++ks) {
                    const uint32_t x = v[ks >> 1];
                    const float s = ks < 4 ? s0 : s1;
                    if (ks & 1) { /* nibbles 4..7 of the word */
                        a[mt][ks][h] =
                            cu_pack2(cu_nvfp4_widen<4>(x, s), cu_nvfp4_widen<5>(x, s), Tag());
                        a[mt][ks][2 + h] =
                            cu_pack2(cu_nvfp4_widen<6>(x, s), cu_nvfp4_widen<7>(x, s), Tag());
                    } else {
                        a[mt][ks][h] =
                            cu_pack2(cu_nvfp4_widen<0>(x, s), cu_nvfp4_widen<1>(x, s), Tag());
                        a[mt][ks][2 + h] =
                            cu_pack2(cu_nvfp4_widen<2>(x, s), cu_nvfp4_widen<3>(x, s), Tag());
                    }
                }
            }
        }
    }
    return nan;
}

/* The block scores of the request's columns from this thread's
 * accumulators (d[mt]: keys of m-tile mt x 64 columns, the products with
 * the codes): scaled by the layer's index-K scale, keys flagged in nan
 * made NaN, keys past a column's last visible position (MASK) left out;
 * reduced over the warp's 16 keys of each m-tile into red_m / red_l
 * [warp][column] (lanes 0-3 write). */
template <bool LSE, bool MASK, int KF>
__device__ __forceinline__ void cu_idxq_reduce(const cu_indexer_params &params,
                                               const float (&d)[2][8][4], uint32_t nan,
                                               int32_t key0, int32_t base, int32_t nq, float *red_m,
                                               float *red_l)
{
    const int lane = threadIdx.x & 31;
    const int w = (threadIdx.x >> 5) & 3;
    if (KF == IDXT_KEYS_FP8) { /* a key's flag from any lane of its quad */
        nan |= __shfl_xor_sync(0xffffffffu, nan, 1);
        nan |= __shfl_xor_sync(0xffffffffu, nan, 2);
    }
    const float kscale = params.index_k_scale, iscale = params.index_scale;
    const int32_t pos0 = key0 + 16 * w + (lane >> 2); /* key of (mt, h): + 64 mt + 8 h */
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if (8 * j >= nq) /* the group's columns: the same for all its threads */
            break;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int32_t col = 8 * j + 2 * (lane & 3) + e;
            const int32_t last = base + ((col * params.index_heads_magic) >> 16);
            const bool in = col < nq;
            float x[4];
            bool v[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) { /* q = 2 mt + h */
                const int mt = q >> 1, h = q & 1;
                float y = d[mt][j][2 * h + e] * kscale;
                if (KF == IDXT_KEYS_FP8 && ((nan >> q) & 1u))
                    y = __uint_as_float(0x7fc00000u);
                x[q] = LSE ? y * iscale : y;
                v[q] = in && (!MASK || pos0 + 64 * mt + 8 * h <= last);
            }
            float m = -INFINITY;
#pragma unroll
            for (int q = 0; q < 4; ++q)
                m = cu_nanmax(m, v[q] ? x[q] : -INFINITY);
#pragma unroll
            for (int o = 4; o < 32; o <<= 1)
                m = cu_nanmax(m, __shfl_xor_sync(0xffffffffu, m, o));
            float l = 0.0f;
            if (LSE) {
                /* Shuffles stay outside any branch on m: it differs per column. */
                const bool decided = isnan(m) || isinf(m); /* m alone is the state */
                if (!decided) {
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        l += v[q] ? expf(x[q] - m) : 0.0f;
                }
#pragma unroll
                for (int o = 4; o < 32; o <<= 1)
                    l += __shfl_xor_sync(0xffffffffu, l, o);
                if (decided)
                    l = 1.0f;
            }
            if (lane < 4) {
                red_m[w * 64 + col] = m;
                red_l[w * 64 + col] = l;
            }
        }
    }
}

/* Group g's blocks, as cu_idxt_consumer takes them, for quantized keys;
 * qtile and red: the group's query tile and reduction buffers. */
template <typename Tag, bool LSE, int KF>
__device__ void cu_idxq_consumer(const cu_indexer_params &params, unsigned char *ring,
                                 uint64_t *full, uint64_t *empty, const volatile int32_t *slot_gb,
                                 int32_t gb_begin, int32_t F, int32_t n_dec, int g,
                                 unsigned char *qtile, float *red)
{
    const int t = threadIdx.x & 127;
    const int32_t Hi = params.num_index_heads, cap_blocks = params.cap_blocks;
    float *const scores = params.scores;
    const uint32_t qaddr = cu_smem_addr(qtile);
    int32_t kslot = -1, k = -1;
    cu_dec_info di = {};
    if (F > 0) {
        kslot = cu_dec_of_block(params.meta.dec_blk0, n_dec, gb_begin);
        di = params.meta.dec_info[kslot];
    }
    int32_t nq = 0, base = 0;
    int32_t turn = 0; /* which reduction buffer */
    float d[2][8][4];
    for (int32_t i = g;; i += IDX_TMA_GROUPS) {
        if (kslot != k) {
            k = kslot;
            nq = di.ql * Hi;
            base = di.kl - di.ql;
            cu_idxq_queries(params, di.t0, nq, qtile, g);
        }
        const int s = i % IDX_TMA_STAGES;
        cu_mbar_wait(&full[s], (uint32_t)(i / IDX_TMA_STAGES) & 1u);
        const int32_t gb = slot_gb[s];
        if (gb < 0)
            break;
        /* The slot's codes into registers, then the slot goes back. */
        uint32_t a[2][IDX_TMA_K_STEPS][4];
        const uint32_t nan = cu_idxq_widen<Tag, KF>(ring + s * IDX_TMA_BLOCK_BYTES, a);
        cu_mbar_arrive(&empty[s]);
        if (gb >= di.blk1) {
            cu_idxt_next_request(params, n_dec, gb, kslot, di);
            k = kslot;
            nq = di.ql * Hi;
            base = di.kl - di.ql;
            cu_idxq_queries(params, di.t0, nq, qtile, g);
        }
        if (i == 0 && threadIdx.x == 0)
            CU_TL_MARK(params, CU_TL_INDEXER, CU_TL_FIRST);
        if (threadIdx.x == 0) /* overwritten by every tile: the last one stays */
            CU_TL_MARK(params, CU_TL_INDEXER, CU_TL_LAST);
        cu_wgmma_fence();
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
            for (int ks = 0; ks < IDX_TMA_K_STEPS; ++ks) {
                const uint32_t at =
                    qaddr + (uint32_t)(ks / IDX_TMA_STEPS_PER_BOX) * (IDXQ_QTILE_BYTES / 2) +
                    (uint32_t)(ks % IDX_TMA_STEPS_PER_BOX) * 32u;
                if (ks == 0)
                    cu_wgmma_m64n64k16_first(d[mt], a[mt][ks], cu_wgmma_desc(at, 16), Tag());
                else
                    cu_wgmma_m64n64k16(d[mt], a[mt][ks], cu_wgmma_desc(at, 16), 1, Tag());
            }
        }
        cu_wgmma_commit();
        cu_wgmma_wait_all();
        cu_wgmma_hold(d[0]);
        cu_wgmma_hold(d[1]);
        const int32_t n = gb - di.blk0;
        const int32_t key0 = n * IDX_TMA_BLOCK_ROWS;
        float *red_m = red + turn * (2 * 4 * 64), *red_l = red_m + 4 * 64;
        turn ^= 1;
        if (key0 + IDX_TMA_BLOCK_ROWS - 1 <= base) /* every key visible to every token */
            cu_idxq_reduce<LSE, false, KF>(params, d, nan, key0, base, nq, red_m, red_l);
        else
            cu_idxq_reduce<LSE, true, KF>(params, d, nan, key0, base, nq, red_m, red_l);
        cu_named_sync(1 + g, 128);
        if (t < nq) {
            float m = red_m[t], l = red_l[t];
#pragma unroll
            for (int w = 1; w < 4; ++w) {
                if (LSE)
                    cu_lse_merge(m, l, red_m[w * 64 + t], red_l[w * 64 + t]);
                else
                    m = cu_nanmax(m, red_m[w * 64 + t]);
            }
            const float score = LSE ? cu_lse_value(m, l)
                                    : (isnan(m) ? __uint_as_float(0x7fc00000u) : m);
            /* Score row of column t: the request's rows start at d0 * Hi. */
            scores[((int64_t)di.d0 * Hi + t) * cap_blocks + n] = score;
        }
    }
}

#endif /* CU_HAVE_WGMMA */

#endif /* MSA_CUDA_KERNELS_INDEXER_INDEXER_DECODE_TMA_Q_SM90_CUH */
