/*
 * Sparse decode attention, Hopper path: bf16/fp16 queries and KV planes of
 * the same type, D = 128, B = P = 128, G = 16 query heads per KV head (one
 * token's heads fill one m16 tile: a "unit").
 *
 * One CTA per SM walks its work units (up to eight tokens of one request and
 * KV head, one split of the union of the request's selected blocks: one or
 * two plan items of four tokens, see att_units; the plan deals them to the
 * CTAs by estimated cost, att_cta).  A producer warp streams
 * the union's 64-key tiles that any of the unit's tokens uses, K and V,
 * through a ring of ATT_TMA_STAGES tensor-map copies; tiles no token of the unit
 * uses are never loaded, and the others are read once for all its tokens.
 * Two producer warps take the CTA's units in turns, each preparing its
 * next unit while the other issues.
 * Two consumer warpgroups share every tile without a CTA-wide barrier (a
 * tile's slot is handed back when all eight warps have signalled).  Of a
 * pair, each group serves one item (four tokens x 16 heads = the 64 rows of
 * its products); a single item is served by both groups on alternate
 * tiles, merged by LSE at the end.  A group whose tokens did not select a
 * tile's block signals at once and moves on.
 *
 * S = Q K^T and O += P V are warpgroup products (wgmma, sm_90a): Q in
 * registers, K and V read by the tensor cores from the ring slot (V
 * transposed), fp32 accumulators, P rounded to the 16-bit type for the
 * second product (as in the other tensor-core path).  The rows of a token
 * that does not use a tile get weight 0 from it.
 *
 * Rows past kv_len in a request's last page are stale cache contents: their
 * scores are masked, and the producer zeroes that tile's V rows before the
 * consumers see it, so a stale NaN cannot reach O through a zero weight.
 *
 * Quantized K/V planes (KF: fp8_e4m3, nvfp4): the ring's slots hold the
 * tiles' codes (fp8: half the bytes; nvfp4: 9 KB a tile with the group
 * scales); a group that computes a tile widens its K and V codes into its
 * own pair of 16-bit tiles (every E4M3 value, and every E2M1 code times
 * its E4M3 group scale, is exact in bf16 and in fp16; NaN codes and NaN
 * group scales widen to NaN), hands the slot back, and its products read
 * the widened tiles as they read a 16-bit slot.  Codes widen to fp16
 * whatever the activations' type (fp8: one conversion a pair; bf16
 * queries are scaled into fp16 once a unit, q_f16.cuh).  K's scale joins the
 * score scale, V's multiplies the finished rows.  Each group widens only
 * the tiles it computes: of a pair, a tile both items use is widened
 * twice, once per group, which costs less than a CTA-wide barrier per
 * tile between groups that otherwise never wait for each other.  With
 * bf16 activations over fp8_e4m3 planes a group widens V only: S runs on
 * the fp8 tensor cores straight over the slot's K codes, each query row
 * held as two E4M3 terms times a power of two (q_e4m3.cuh), and the
 * softmax takes each row's power back with the score scale.
 */
#include "cuda/kernels/attention/attention_decode_tma_sm90_layout.cuh"
#include "cuda/kernels/attention/attention_decode_tma_sm90_producer.cuh"
#include "cuda/common/widen_tile.cuh"
#include "cuda/common/q_f16.cuh"
#include "cuda/common/q_e4m3.cuh"
#include "cuda/arch/launch.cuh"
#include "cuda/common/timeline.cuh"

#ifdef CU_HAVE_WGMMA

/* S = Q K^T: the group's 64 query rows (registers) against the tile's 64
 * keys (K-major in the slot: dimensions 0-63 in the first box, 64-127 in
 * the second). */
template <typename Tag>
__device__ __forceinline__ void cu_attt_qk(uint32_t ka, const uint32_t (&qa)[8][4],
                                           float (&sc)[8][4])
{
    cu_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
        const uint32_t at =
            ka + (uint32_t)(ks >> 2) * (ATT_TMA_HALF_BYTES / 2) + (uint32_t)(ks & 3) * 32u;
        if (ks == 0)
            cu_wgmma_m64n64k16_first(sc, qa[ks], cu_wgmma_desc(at, 16), Tag());
        else
            cu_wgmma_m64n64k16(sc, qa[ks], cu_wgmma_desc(at, 16), 1, Tag());
    }
    cu_wgmma_commit();
    cu_wgmma_wait_all();
    cu_wgmma_hold(sc);
}

/* Whether the consumers take S = Q K^T over fp8_e4m3 K codes on the fp8
 * products (q_e4m3.cuh) instead of widening K first: bf16 activations over
 * fp8_e4m3 planes.  fp16 queries have three significant bits more than
 * two E4M3 terms hold, and keep the widening. */
template <typename Tag, int KF>
struct cu_attt_qk8 {
    static constexpr bool value = false;
};
template <>
struct cu_attt_qk8<cu_bf16_tag, CU_PLANE_FP8> {
    static constexpr bool value = true;
};

/* S = Q K^T over the tile's K codes (one tensor-map box of 64 rows x 128
 * code bytes, 128-byte swizzle, at ka): the queries' hi and lo terms
 * against the same codes, eight fp8 products into one accumulator, issued
 * and committed; the caller waits for them. */
__device__ __forceinline__ void cu_attt_qk_e4m3_issue(uint32_t ka, const uint32_t (&qh)[4][4],
                                                      const uint32_t (&ql)[4][4], float (&sc)[8][4])
{
    cu_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
        const uint64_t b = cu_wgmma_desc(ka + (uint32_t)ks * 32u, 16);
        if (ks == 0)
            cu_wgmma_m64n64k32_e4m3_first(sc, qh[ks], b);
        else
            cu_wgmma_m64n64k32_e4m3(sc, qh[ks], b, 1);
        cu_wgmma_m64n64k32_e4m3(sc, ql[ks], b, 1);
    }
    cu_wgmma_commit();
}

/* A member warp's rows take one tile: raw scores sc, keys k <= lim of the
 * tile visible (lim >= 63: all), the scales sl2_lo / sl2_hi of the
 * thread's two rows (log2 units, > 0) applied inside the exponent. */
__device__ __forceinline__ void cu_attt_softmax(float (&sc)[8][4], int32_t lim, float sl2_lo,
                                                float sl2_hi, float (&o)[16][4], float &m_lo,
                                                float &m_hi, float &l_lo, float &l_hi)
{
    const int lane = threadIdx.x & 31;
    if (lim < ATT_TMA_TILE - 1) {
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const bool vis = n * 8 + 2 * (lane & 3) + e <= lim;
                sc[n][e] = vis ? sc[n][e] : -INFINITY;
                sc[n][2 + e] = vis ? sc[n][2 + e] : -INFINITY;
            }
        }
    }
    cu_rows_softmax_scaled2<8>(sc, sl2_lo, sl2_hi, o, m_lo, m_hi, l_lo, l_hi);
}

/* O += P V: the weights (rounded to the 16-bit type, in the A-fragment
 * layout the S accumulators already have) against the tile's V, read
 * MN-major: 16 keys per step (2048 bytes), dimensions 64-127 one box
 * (ATT_TMA_HALF_BYTES / 2) after 0-63.  A warp whose token does not use the
 * tile gives weight 0 to every key (its rows of the product add zero). */
template <typename Tag>
__device__ __forceinline__ void cu_attt_pv(uint32_t va, const float (&p)[8][4], bool member,
                                           float (&o)[16][4])
{
    uint32_t pa[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        pa[kk][0] = member ? cu_pack2(p[2 * kk][0], p[2 * kk][1], Tag()) : 0u;
        pa[kk][1] = member ? cu_pack2(p[2 * kk][2], p[2 * kk][3], Tag()) : 0u;
        pa[kk][2] = member ? cu_pack2(p[2 * kk + 1][0], p[2 * kk + 1][1], Tag()) : 0u;
        pa[kk][3] = member ? cu_pack2(p[2 * kk + 1][2], p[2 * kk + 1][3], Tag()) : 0u;
    }
    cu_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
        cu_wgmma_m64n128k16<1>(o, pa[kk],
                               cu_wgmma_desc(va + (uint32_t)kk * 2048u, ATT_TMA_HALF_BYTES / 2), 1,
                               Tag());
    cu_wgmma_commit();
    cu_wgmma_wait_all();
    cu_wgmma_hold(o);
}

/* Barrier of consumer group h's 128 threads (immediate ids: a register
 * id makes ptxas reserve all 16; 1 is the consumers', 2 and 3 the
 * producers'). */
__device__ __forceinline__ void cu_attt_group_sync(int h)
{
    if (h)
        asm volatile("bar.sync 5, %0;\n" ::"n"(ATT_TMA_GROUP_THREADS) : "memory");
    else
        asm volatile("bar.sync 4, %0;\n" ::"n"(ATT_TMA_GROUP_THREADS) : "memory");
}

/* A slot's K and V codes (KF) widened by the group's 128 threads into its
 * 16-bit tiles at `wide` (a 16-bit slot's layout; widen_tile.cuh). */
template <typename Tag, int KF>
__device__ __forceinline__ void cu_attt_widen(uint32_t codes, uint32_t wide)
{
    const int t = threadIdx.x & (ATT_TMA_GROUP_THREADS - 1);
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
        const uint32_t src = codes + (uint32_t)(kv * ATT_Q_HALF_BYTES);
        const uint32_t dst = wide + (uint32_t)(kv * ATT_TMA_HALF_BYTES);
        if (KF == CU_PLANE_FP8)
            cu_widen_fp8_tile<Tag, ATT_TMA_TILE>(src, dst, t);
        else
            cu_widen_nvfp4_tile<Tag, ATT_TMA_TILE>(src, dst, t);
    }
}

/* A consumer warp is done with slot s: the producer may refill it. */
__device__ __forceinline__ void cu_attt_release(const cu_attt_smem &sm, int s)
{
    cu_mbar_arrive(&sm.empty[s]); /* every lane: see ATT_TMA_EMPTY_ARRIVALS */
}

/* A warp's 16 finished rows of a single-split item (one token's heads:
 * 4 KB in a row of the output), normalized and rounded: staged in shared
 * memory at `stage` (16-byte chunks XOR-swizzled by row, so the fragment's
 * 4-byte writes meet no bank twice), then stored as 16-byte pieces.  Eight
 * whole-line stores per lane instead of 32 scattered 4-byte ones, which
 * filled the store queue at every unit's end (stall profile, batch 128,
 * 1K, 8 tokens). */
template <typename Tag>
__device__ __forceinline__ void cu_attt_write_rows(const cu_attn_params &params, int64_t q_lo,
                                                   uint32_t stage, const float (&o)[16][4],
                                                   float m_lo, float m_hi, float l_lo, float l_hi)
{
    const int lane = threadIdx.x & 31;
    const uint32_t r_lo = (uint32_t)lane >> 2, r_hi = r_lo + 8u, cb = (uint32_t)(lane & 3) * 4u;
    const float inv_lo = cu_rows_inv(l_lo), inv_hi = cu_rows_inv(l_hi);
    __syncwarp(); /* the warp's lanes have read the slot (cu_rows_absorb) */
#pragma unroll
    for (uint32_t n = 0; n < 16; ++n) {
        cu_sts32(stage + r_lo * 256u + ((n ^ r_lo) << 4) + cb,
                 cu_pack2(o[n][0] * inv_lo, o[n][1] * inv_lo, Tag()));
        cu_sts32(stage + r_hi * 256u + ((n ^ r_hi) << 4) + cb,
                 cu_pack2(o[n][2] * inv_hi, o[n][3] * inv_hi, Tag()));
    }
    __syncwarp();
    uint4 *dst = (uint4 *)((char *)params.out +
                           (q_lo - r_lo) * ATT_TMA_ROW_BYTES); /* the warp's first row */
#pragma unroll
    for (uint32_t i = 0; i < 8; ++i) {
        const uint32_t e = i * 32u + (uint32_t)lane; /* 16-byte piece: row e / 16, chunk e % 16 */
        dst[e] = cu_lds128(stage + (e >> 4) * 256u + (((e & 15u) ^ (e >> 4)) << 4));
    }
    __syncwarp();
    if (params.lse && (lane & 3) == 0) {
        params.lse[q_lo] = cu_rows_lse(m_lo, l_lo);
        params.lse[q_lo + 8] = cu_rows_lse(m_hi, l_hi);
    }
}

/* The same for a split's partial rows (fp32, normalized, the LSE after
 * the 128 values; rows part_stride floats apart, 16-byte aligned): the 16
 * rows in two halves of eight (4 KB each in the staging area; 16-byte
 * chunks XOR-swizzled by row so the fragment's 8-byte writes take the
 * fewest wavefronts), each row then stored whole, 512 bytes per warp
 * store.  For pairs only, where eight warps write at once: batch 8, 50K,
 * 8 tokens 1.5% faster; a single item's one or few warps were 1-2% slower
 * so (batch 8 and 32, 10K and batch 1, 128K, 1 token: the round trip
 * through shared memory at the end of the step's critical path, as
 * measured on the H200). */
__device__ __forceinline__ void cu_attt_write_part(const cu_attn_params &params,
                                                   const cu_att_item &it, int32_t row0,
                                                   uint32_t stage, const float (&o)[16][4],
                                                   float m_lo, float m_hi, float l_lo, float l_hi)
{
    const int lane = threadIdx.x & 31;
    const uint32_t r = (uint32_t)lane >> 2, q = (uint32_t)(lane & 3);
    const float inv_lo = cu_rows_inv(l_lo), inv_hi = cu_rows_inv(l_hi);
    /* Row row0 + i of the item's partials of this split. */
    float *pb = params.partials + ((int64_t)it.part_base + (int64_t)it.split * it.nrows + row0) *
                                      params.partial_stride;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const float inv = half ? inv_hi : inv_lo;
        __syncwarp(); /* the area is free: absorbed (cu_rows_absorb) or stored */
#pragma unroll
        for (uint32_t n = 0; n < 16; ++n) {
            /* floats 8n + 2q, +1 of row r: chunk 2n + q / 2, bytes 8 (q & 1) in it */
            const uint32_t c = (2u * n + (q >> 1)) ^ ((r & 3u) << 1);
            const uint32_t a = stage + r * 512u + c * 16u + (q & 1u) * 8u;
            const float x = o[n][2 * half] * inv, y = o[n][2 * half + 1] * inv;
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a), "f"(x), "f"(y) : "memory");
        }
        __syncwarp();
#pragma unroll
        for (uint32_t i = 0; i < 8; ++i) { /* row i of the half, chunk `lane` */
            const uint32_t c = (uint32_t)lane ^ ((i & 3u) << 1);
            *(uint4 *)(pb + (int64_t)(8 * half + i) * params.partial_stride + 4 * lane) =
                cu_lds128(stage + i * 512u + c * 16u);
        }
    }
    __syncwarp();
    if (q == 0) {
        pb[(int64_t)r * params.partial_stride + ATT_TMA_HEAD_DIM] = cu_rows_lse(m_lo, l_lo);
        pb[(int64_t)(r + 8) * params.partial_stride + ATT_TMA_HEAD_DIM] = cu_rows_lse(m_hi, l_hi);
    }
}

/* One consumer warpgroup (h = 0 or 1) of a unit.  Warp w of the group
 * holds rows 16w .. 16w + 15 of its item: token w, its 16 heads.  Of a
 * pair, group h serves item h and takes every tile one of its tokens uses;
 * a single item is served by both groups, alternate tiles each, and merged
 * at the end.  A tile's product covers all four tokens of the group; the
 * warps of tokens that do not use it skip the softmax and give the product
 * weight 0, so their state does not change. */
template <typename Tag, int KF>
__device__ void cu_attt_consumer(const cu_attn_params &params, const cu_attt_smem &sm,
                                 const cu_attt_unit &un, uint32_t &ring_uses)
{
    const int lane = threadIdx.x & 31;
    const int w = (threadIdx.x >> 5) & 3;
    const int h = threadIdx.x / ATT_TMA_GROUP_THREADS;
    const bool pair = un.ntok[1] > 0;
    const int half = pair ? h : 0;
    const cu_att_item *itp = params.meta.att[CU_KIND_SPARSE] + un.first + half;
    const cu_att_item it = *itp;
    const int ntok = un.ntok[half];
    const bool active = w < ntok; /* the warp's rows exist */
    const int32_t tok0 = it.row0 / 16;
    const int32_t tok = tok0 + w;             /* request-local token */
    const int32_t last = it.kl - it.ql + tok; /* its position */
    const uint32_t tbit = active ? 1u << tok : 0u;
    const uint32_t gbits = cu_attt_item_bits(tok0, ntok); /* the group's tokens */

    const int64_t q_lo = (int64_t)(it.t0 + tok) * params.q_heads + it.group * 16 + (lane >> 2);
    const int64_t q_hi = q_lo + 8;
    /* The products' type: fp16 over codes (q_f16.cuh), and S over fp8
     * codes on the fp8 products (QK8: the queries as two E4M3 terms a row,
     * q_e4m3.cuh; V still widened to fp16). */
    typedef typename cu_compute_tag<Tag, KF>::type CTag;
    constexpr bool QK8 = cu_attt_qk8<Tag, KF>::value;
    uint32_t qa[8][4], qh[4][4], ql[4][4];
    float back_lo = 1.0f, back_hi = 1.0f;
    if (QK8) {
        cu_q_bf16_to_e4m3(params.q, q_lo, q_hi, active, active, qh, ql, back_lo, back_hi);
    } else {
        cu_rows_load_q(params.q, q_lo, q_hi, active, active, qa);
        if (cu_q_converts<Tag, CTag>::value)
            back_lo = back_hi = cu_q_bf16_to_f16(qa);
    }
    float o[16][4], m_lo, m_hi, l_lo, l_hi;
    cu_rows_clear(o, m_lo, m_hi, l_lo, l_hi);
    /* Codes: the products take their values; K's scale joins the score
     * scale, and so do the queries' powers of two. */
    const float sl2 = params.scale * CU_LOG2E * (KF != CU_PLANE_16 ? params.k_scale : 1.0f);
    const float sl2_lo = sl2 * back_lo, sl2_hi = sl2 * back_hi;

    for (int32_t c = 0;; ++c) {
        const int s = ring_uses % ATT_TMA_STAGES;
        cu_mbar_wait(&sm.full[s], (ring_uses / ATT_TMA_STAGES) & 1u);
        ++ring_uses;
#ifdef MSA_TIMELINE
        if (c == 0 && threadIdx.x == 0 && un.first_of_cta)
            CU_TL_MARK(params, CU_TL_ATTN, CU_TL_FIRST);
        if (threadIdx.x == 0) /* overwritten by every tile: the last one stays */
            CU_TL_MARK(params, CU_TL_ATTN, CU_TL_LAST);
#endif
        const uint2 meta = cu_lds64(cu_smem_addr(sm.meta + s));
        cu_attt_meta mt;
        mt.pos0 = (int32_t)meta.x;
        mt.bits = meta.y;
        if (mt.pos0 < 0) {
            cu_attt_release(sm, s);
            break;
        }
        /* Group-uniform: whether this group computes the tile. */
        const bool computes = (mt.bits & gbits) && (pair || (c & 1) == h);
        if (computes) {
            uint32_t ka = cu_smem_addr(sm.ring + s * cu_attt_stage_bytes<KF>());
            const uint32_t wide =
                cu_smem_addr(sm.ring + ATT_Q_WIDE_OFFSET + h * ATT_TMA_STAGE_BYTES);
            uint32_t va;
            float sc[8][4];
            if (QK8) {
                /* The group's product of its previous tile is done with
                 * the widened V; S runs on the K codes while the group
                 * widens this tile's V codes, then the slot goes back and
                 * V is whole before O += P V. */
                va = wide + ATT_TMA_HALF_BYTES;
                cu_attt_group_sync(h);
                cu_attt_qk_e4m3_issue(ka, qh, ql, sc);
                cu_widen_fp8_tile<CTag, ATT_TMA_TILE>(ka + ATT_Q_HALF_BYTES, va,
                                                      threadIdx.x & (ATT_TMA_GROUP_THREADS - 1));
                cu_wgmma_wait_all();
                cu_wgmma_hold(sc);
                cu_attt_release(sm, s);
                cu_fence_proxy_async();
                cu_attt_group_sync(h);
            } else {
                if (KF != CU_PLANE_16) {
                    /* The group's products of its previous tile are done
                     * with the widened tiles; then the codes go in and
                     * the slot back, and the tiles are whole before any
                     * product. */
                    cu_attt_group_sync(h);
                    cu_attt_widen<CTag, KF>(ka, wide);
                    cu_attt_release(sm, s);
                    cu_fence_proxy_async();
                    cu_attt_group_sync(h);
                    ka = wide;
                }
                va = ka + ATT_TMA_HALF_BYTES;
                cu_attt_qk<CTag>(ka, qa, sc);
            }
            /* The warp's token uses the tile: its keys inside the causal
             * window count (rows past kv_len are beyond every window). */
            const bool member = (mt.bits & tbit) != 0u;
            if (member)
                cu_attt_softmax(sc, last - mt.pos0, sl2_lo, sl2_hi, o, m_lo, m_hi, l_lo, l_hi);
            cu_attt_pv<CTag>(va, sc, member, o);
        }
        if (KF == CU_PLANE_16 || !computes)
            cu_attt_release(sm, s);
    }
    cu_rows_sum_quads(l_lo, l_hi);

    /* A single item: group 1's state joins group 0's, warp by warp. */
    if (!pair && h == 1 && active)
        cu_rows_save(sm.scr + w * ATT_TMA_SCR_FLOATS, o, m_lo, m_hi, l_lo, l_hi);
    cu_named_sync(1, ATT_TMA_CONSUMERS * 32);
    if (active && (pair || h == 0)) {
        if (!pair)
            cu_rows_absorb(sm.scr + w * ATT_TMA_SCR_FLOATS, o, m_lo, m_hi, l_lo, l_hi);
        if (KF != CU_PLANE_16) /* O holds sums of weights times V codes */
            cu_rows_rescale(o, params.v_scale, params.v_scale);
        /* The warp's staging area: its slot of the scratch, half h of it
         * for a pair (the slot's own state is absorbed by then). */
        const uint32_t stage =
            cu_smem_addr(sm.scr + w * ATT_TMA_SCR_FLOATS) + (pair ? h : 0) * 4096u;
        /* The item's split fields from memory again (*itp), not kept in
         * registers through the tile loop. */
        const cu_att_item wi = *itp;
        if (wi.nsplit == 1 && ((uintptr_t)params.out & 15u) == 0u)
            cu_attt_write_rows<Tag>(params, q_lo, stage, o, m_lo, m_hi, l_lo, l_hi);
        else if (wi.nsplit > 1 && pair)
            cu_attt_write_part(params, wi, w * 16, stage, o, m_lo, m_hi, l_lo, l_hi);
        else
            cu_rows_write<Tag>(params, wi, w * 16 + (lane >> 2), q_lo, q_hi, true, true, o, m_lo,
                               m_hi, l_lo, l_hi);
    }
    cu_named_sync(1, ATT_TMA_CONSUMERS * 32); /* the scratch is reused by the next unit */
}

#endif /* CU_HAVE_WGMMA */

template <typename Tag, int KF>
__global__ void __launch_bounds__(ATT_TMA_THREADS, 1)
    cu_attn_tma_kernel(const __grid_constant__ cu_attn_params params,
                       const __grid_constant__ CUtensorMap map_k,
                       const __grid_constant__ CUtensorMap map_v)
{
#ifdef CU_HAVE_WGMMA
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    cu_attt_smem sm;
    sm.ring = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    sm.scr = (float *)(sm.ring + ATT_TMA_STAGES * ATT_TMA_STAGE_BYTES);
    sm.meta = (cu_attt_meta *)(sm.scr + ATT_TMA_SCR_SLOTS * ATT_TMA_SCR_FLOATS);
    sm.full = (uint64_t *)(sm.meta + ATT_TMA_STAGES);
    sm.empty = sm.full + ATT_TMA_STAGES;
    sm.tail = sm.empty + ATT_TMA_STAGES;
    sm.handoff = (uint32_t *)(sm.tail + ATT_TMA_PRODUCERS);
    sm.uwords = cu_attt_union_words(params.attention_union_blocks);
    sm.uarea = (uint32_t *)(sm.ring + (ATT_TMA_SMEM_BYTES - 1024));
    const int warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        CU_TL_MARK(params, CU_TL_ATTN, CU_TL_ENTRY);
        for (int s = 0; s < ATT_TMA_STAGES; ++s) {
            cu_mbar_init(&sm.full[s], 1);
            cu_mbar_init(&sm.empty[s], ATT_TMA_EMPTY_ARRIVALS);
        }
        for (int j = 0; j < ATT_TMA_PRODUCERS; ++j)
            cu_mbar_init(&sm.tail[j], 1);
        cu_mbar_fence_init();
        if (KF != CU_PLANE_NVFP4) { /* nvfp4 tiles come by plain bulk copies */
            cu_tma_prefetch_map(&map_k);
            cu_tma_prefetch_map(&map_v);
        }
    }
    __syncthreads();
    if (warp >= ATT_TMA_CONSUMERS)
        cu_attt_union_clear(params, sm, warp - ATT_TMA_CONSUMERS);
    /* The selection writes the unions (or the rows the producers build
     * them from), the prologue the cache rows: the
     * producer waits for them before it reads a union; the consumers read
     * only the plan, the queries and the ring. */
    cu_pdl_trigger();
    /* The sparse pass only (the units are built for it); this CTA's units
     * are a contiguous run of them, dealt by the plan. */
    const int32_t u_begin = params.meta.att_cta[blockIdx.x],
                  u_end = params.meta.att_cta[blockIdx.x + 1];
    uint32_t ring_uses = 0, tail_par = 0;
    int k = 0; /* the unit's place among the CTA's units */
    for (int32_t ui = u_begin; ui < u_end; ++ui, ++k) {
        const cu_attt_unit un = cu_attt_unit_of(params, ui, k == 0);
        if (warp >= ATT_TMA_CONSUMERS) {
            const int j = warp - ATT_TMA_CONSUMERS;
            if (k % ATT_TMA_PRODUCERS == j)
                cu_attt_producer<KF>(params, &map_k, &map_v, sm, un, ring_uses, tail_par, j, k == 0,
                                     ui + 1 < u_end);
        } else {
            cu_attt_consumer<Tag, KF>(params, sm, un, ring_uses);
        }
    }
    cu_pdl_wait(); /* every CTA, before it ends (arch/launch.cuh) */
    if (threadIdx.x == 0)
        CU_TL_MARK(params, CU_TL_ATTN, CU_TL_EXIT);
#else
    (void)params;
    (void)params;
    (void)map_k;
    (void)map_v;
#endif
}

void cu_launch_attn_tma(const cu_attn_params *params, const cu_plan_state *st,
                        const CUtensorMap *map_k, const CUtensorMap *map_v, cudaStream_t s)
{
    const size_t smem = ATT_TMA_SMEM_BYTES + cu_attt_union_bytes(*params);
#define ATT_TMA_LAUNCH(TAG, KF)                                                               \
    cu_launch(cu_attn_tma_kernel<TAG, KF>, st->sz.num_sms, ATT_TMA_THREADS, smem, s, st->pdl, \
              *params, *map_k, *map_v)
    CU_LAUNCH_BY_FORMAT(params->act_dtype, params->kv_dtype, ATT_TMA_LAUNCH);
#undef ATT_TMA_LAUNCH
}

cudaError_t cu_attn_tma_setup(void)
{
    return cu_allow_smem(ATT_TMA_SMEM_BYTES + ATT_TMA_UNION_MAX_BYTES,
                         cu_attn_tma_kernel<cu_bf16_tag, CU_PLANE_16>,
                         cu_attn_tma_kernel<cu_f16_tag, CU_PLANE_16>,
                         cu_attn_tma_kernel<cu_bf16_tag, CU_PLANE_FP8>,
                         cu_attn_tma_kernel<cu_f16_tag, CU_PLANE_FP8>,
                         cu_attn_tma_kernel<cu_bf16_tag, CU_PLANE_NVFP4>,
                         cu_attn_tma_kernel<cu_f16_tag, CU_PLANE_NVFP4>);
}
