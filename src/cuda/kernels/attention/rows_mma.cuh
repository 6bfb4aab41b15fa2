/*
 * Online-softmax state of one warp's m16 tile of query rows in the
 * tensor-core attention kernels: O (16 rows x 128 dims in mma.sync
 * accumulator layout: a thread holds rows lane/4 and lane/4 + 8), and per
 * row the running max m (log2 units) and sum l.  Shared by the sm_80 path
 * (attention_decode_mma_sm80.cu) and the Hopper path (attention_decode_tma_sm90.cu).
 */
#ifndef MSA_CUDA_KERNELS_ATTENTION_ROWS_MMA_CUH
#define MSA_CUDA_KERNELS_ATTENTION_ROWS_MMA_CUH

#include "cuda/params.cuh"
#include "cuda/arch/mma_sm80.cuh"

#define CU_LN2 0.6931471805599453f
#define CU_LOG2E 1.4426950408889634f
/* Floats of a saved state: O, then m and l of the 16 rows. */
#define CU_ROWS_SLOT_FLOATS (16 * 128 + 32)

/* Query fragments (A operand) of the thread's rows q_lo / q_hi (rows of the
 * query tensor, D = 128); rows that do not exist read as zero. */
__device__ __forceinline__ void cu_rows_load_q(const void *q, int64_t q_lo, int64_t q_hi,
                                               bool ok_lo, bool ok_hi, uint32_t (&qa)[8][4])
{
    const int lane = threadIdx.x & 31;
    const uint32_t *qp = (const uint32_t *)q;
#pragma unroll
    for (int k8 = 0; k8 < 8; ++k8) {
        const int d = k8 * 16 + 2 * (lane & 3);
        qa[k8][0] = ok_lo ? qp[(q_lo * 128 + d) >> 1] : 0u;
        qa[k8][1] = ok_hi ? qp[(q_hi * 128 + d) >> 1] : 0u;
        qa[k8][2] = ok_lo ? qp[(q_lo * 128 + d + 8) >> 1] : 0u;
        qa[k8][3] = ok_hi ? qp[(q_hi * 128 + d + 8) >> 1] : 0u;
    }
}

/* The empty state: O = 0, running max -inf, sum 0. */
__device__ __forceinline__ void cu_rows_clear(float (&o)[16][4], float &m_lo, float &m_hi,
                                              float &l_lo, float &l_hi)
{
#pragma unroll
    for (int n = 0; n < 16; ++n)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    m_lo = m_hi = -INFINITY;
    l_lo = l_hi = 0.0f;
}

/* S = Q K^T for NS n-tiles of 8 keys starting at tile row k0.  Swz maps
 * (row, 16-byte chunk) to a byte offset in the tile; the n-tiles are
 * interleaved so their accumulation chains overlap in the tensor pipe. */
template <typename Tag, int NS, typename Swz>
__device__ __forceinline__ void cu_rows_qk(uint32_t ka, int k0, const uint32_t (&qa)[8][4],
                                           float (&sc)[NS][4])
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int n = 0; n < NS; ++n)
        sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
    for (int kpair = 0; kpair < 4; ++kpair) {
#pragma unroll
        for (int n = 0; n < NS; ++n) {
            uint32_t b0, b1, b2, b3;
            cu_ldsm_x4(ka + Swz()(k0 + n * 8 + (lane & 7), kpair * 4 + (lane >> 3)), b0, b1, b2,
                       b3);
            cu_mma16816(sc[n], qa[2 * kpair][0], qa[2 * kpair][1], qa[2 * kpair][2],
                        qa[2 * kpair][3], b0, b1, Tag());
            cu_mma16816(sc[n], qa[2 * kpair + 1][0], qa[2 * kpair + 1][1], qa[2 * kpair + 1][2],
                        qa[2 * kpair + 1][3], b2, b3, Tag());
        }
    }
}

/* O += P V for the KW keys at tile row k0; P (the weights in sc) is rounded
 * to the 16-bit type. */
template <typename Tag, int KW, typename Swz>
__device__ __forceinline__ void cu_rows_pv(uint32_t va, int k0, const float (&sc)[KW / 8][4],
                                           float (&o)[16][4])
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < KW / 16; ++kk) {
        const uint32_t p0 = cu_pack2(sc[2 * kk][0], sc[2 * kk][1], Tag());
        const uint32_t p1 = cu_pack2(sc[2 * kk][2], sc[2 * kk][3], Tag());
        const uint32_t p2 = cu_pack2(sc[2 * kk + 1][0], sc[2 * kk + 1][1], Tag());
        const uint32_t p3 = cu_pack2(sc[2 * kk + 1][2], sc[2 * kk + 1][3], Tag());
        const int vrow = k0 + kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
        for (int dp = 0; dp < 8; ++dp) {
            uint32_t b0, b1, b2, b3;
            cu_ldsm_x4_trans(va + Swz()(vrow, dp * 2 + (lane >> 4)), b0, b1, b2, b3);
            cu_mma16816(o[2 * dp], p0, p1, p2, p3, b0, b1, Tag());
            cu_mma16816(o[2 * dp + 1], p0, p1, p2, p3, b2, b3, Tag());
        }
    }
}

/* Maxima of a tile of scores in the thread's two rows, over the four
 * lanes that hold each row. */
template <int NS>
__device__ __forceinline__ void cu_rows_tile_max(const float (&sc)[NS][4], float &mx_lo,
                                                 float &mx_hi)
{
    mx_lo = -INFINITY;
    mx_hi = -INFINITY;
#pragma unroll
    for (int n = 0; n < NS; ++n) {
        mx_lo = fmaxf(mx_lo, fmaxf(sc[n][0], sc[n][1]));
        mx_hi = fmaxf(mx_hi, fmaxf(sc[n][2], sc[n][3]));
    }
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
}

/* O's rows scaled by their corrections. */
__device__ __forceinline__ void cu_rows_rescale(float (&o)[16][4], float corr_lo, float corr_hi)
{
#pragma unroll
    for (int n = 0; n < 16; ++n) {
        o[n][0] *= corr_lo;
        o[n][1] *= corr_lo;
        o[n][2] *= corr_hi;
        o[n][3] *= corr_hi;
    }
}

/* The rows' maxima m after a tile whose maxima (in log2 units) are mx:
 * the reference the tile's weights are taken against and the factors for
 * the rows' O and l.  A row with no key yet keeps m = -inf; its reference
 * is 0, so exp2(-inf - 0) = 0 leaves it empty. */
__device__ __forceinline__ void cu_rows_new_max(float mx_lo, float mx_hi, float &m_lo, float &m_hi,
                                                float &ref_lo, float &ref_hi, float &corr_lo,
                                                float &corr_hi)
{
    const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
    ref_lo = mn_lo == -INFINITY ? 0.0f : mn_lo;
    ref_hi = mn_hi == -INFINITY ? 0.0f : mn_hi;
    corr_lo = exp2f(m_lo - ref_lo);
    corr_hi = exp2f(m_hi - ref_hi);
    m_lo = mn_lo;
    m_hi = mn_hi;
}

/* One tile of scores sc (already scaled to log2 units, -inf where masked)
 * enters the state: new maxima, O and l rescaled, sc turned into weights. */
template <int NS>
__device__ __forceinline__ void cu_rows_softmax(float (&sc)[NS][4], float (&o)[16][4], float &m_lo,
                                                float &m_hi, float &l_lo, float &l_hi)
{
    float mx_lo, mx_hi, ref_lo, ref_hi, corr_lo, corr_hi;
    cu_rows_tile_max<NS>(sc, mx_lo, mx_hi);
    cu_rows_new_max(mx_lo, mx_hi, m_lo, m_hi, ref_lo, ref_hi, corr_lo, corr_hi);
    float ps_lo = 0.0f, ps_hi = 0.0f;
#pragma unroll
    for (int n = 0; n < NS; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            sc[n][e] = exp2f(sc[n][e] - ref_lo);
            sc[n][2 + e] = exp2f(sc[n][2 + e] - ref_hi);
            ps_lo += sc[n][e];
            ps_hi += sc[n][2 + e];
        }
    }
    l_lo = l_lo * corr_lo + ps_lo;
    l_hi = l_hi * corr_hi + ps_hi;
    cu_rows_rescale(o, corr_lo, corr_hi);
}

/* 2^x flushed to 0 below 2^-126 (ex2.approx.ftz), for the Hopper
 * kernels' weights.  exp2f compiles to ex2.approx.f32, which keeps
 * denormal results with a range fix-up around the MUFU instruction: three
 * more instructions per weight on the consumers' path (on the H200, the
 * decode workload's batch 128 at 4K and 5K with 8 tokens ran 2.0-2.6%
 * faster without them).  A key whose weight is below 2^-126 of its row's
 * largest would add less than 2^-126 of the row's sum to l, and to O less
 * than that times its V: nothing the fp32 sums or the 16-bit output can
 * show. */
__device__ __forceinline__ float cu_rows_exp2_ftz(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* As cu_rows_softmax for raw scores sc (masked keys -inf), with the scales
 * sl2_lo / sl2_hi of the thread's two rows (log2 units, > 0) applied
 * inside the exponent (the max of the scaled scores is the scaled max) and
 * cu_rows_exp2_ftz.  O keeps its scale while both rows' maxima hold in
 * every lane of the warp, as they do on most tiles once the max has
 * settled. */
template <int NS>
__device__ __forceinline__ void cu_rows_softmax_scaled2(float (&sc)[NS][4], float sl2_lo,
                                                        float sl2_hi, float (&o)[16][4],
                                                        float &m_lo, float &m_hi, float &l_lo,
                                                        float &l_hi)
{
    float mx_lo, mx_hi, ref_lo, ref_hi, corr_lo, corr_hi;
    cu_rows_tile_max<NS>(sc, mx_lo, mx_hi);
    cu_rows_new_max(mx_lo * sl2_lo, mx_hi * sl2_hi, m_lo, m_hi, ref_lo, ref_hi, corr_lo, corr_hi);
    float ps_lo = 0.0f, ps_hi = 0.0f;
#pragma unroll
    for (int n = 0; n < NS; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            sc[n][e] = cu_rows_exp2_ftz(fmaf(sc[n][e], sl2_lo, -ref_lo));
            sc[n][2 + e] = cu_rows_exp2_ftz(fmaf(sc[n][2 + e], sl2_hi, -ref_hi));
            ps_lo += sc[n][e];
            ps_hi += sc[n][2 + e];
        }
    }
    l_lo = l_lo * corr_lo + ps_lo;
    l_hi = l_hi * corr_hi + ps_hi;
    if (__any_sync(0xffffffffu, corr_lo != 1.0f || corr_hi != 1.0f))
        cu_rows_rescale(o, corr_lo, corr_hi);
}

/* The same with one scale for both rows. */
template <int NS>
__device__ __forceinline__ void cu_rows_softmax_scaled(float (&sc)[NS][4], float sl2,
                                                       float (&o)[16][4], float &m_lo, float &m_hi,
                                                       float &l_lo, float &l_hi)
{
    cu_rows_softmax_scaled2<NS>(sc, sl2, sl2, o, m_lo, m_hi, l_lo, l_hi);
}

/* Row sums over the four lanes that hold a row (after the key loop). */
__device__ __forceinline__ void cu_rows_sum_quads(float &l_lo, float &l_hi)
{
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
}

/* Saves the state into a slot of CU_ROWS_SLOT_FLOATS (shared memory). */
__device__ __forceinline__ void cu_rows_save(float *sl, const float (&o)[16][4], float m_lo,
                                             float m_hi, float l_lo, float l_hi)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
        const int d = n * 8 + 2 * (lane & 3);
        *(float2 *)&sl[(lane >> 2) * 128 + d] = make_float2(o[n][0], o[n][1]);
        *(float2 *)&sl[((lane >> 2) + 8) * 128 + d] = make_float2(o[n][2], o[n][3]);
    }
    if ((lane & 3) == 0) {
        sl[2048 + (lane >> 2)] = m_lo;
        sl[2048 + (lane >> 2) + 8] = m_hi;
        sl[2064 + (lane >> 2)] = l_lo;
        sl[2064 + (lane >> 2) + 8] = l_hi;
    }
}

/* Merges a saved state (same rows, other keys) into this one. */
__device__ __forceinline__ void cu_rows_absorb(const float *sl, float (&o)[16][4], float &m_lo,
                                               float &m_hi, float &l_lo, float &l_hi)
{
    const int lane = threadIdx.x & 31;
    const float m2_lo = sl[2048 + (lane >> 2)], m2_hi = sl[2048 + (lane >> 2) + 8];
    const float l2_lo = sl[2064 + (lane >> 2)], l2_hi = sl[2064 + (lane >> 2) + 8];
    const float M_lo = fmaxf(m_lo, m2_lo), M_hi = fmaxf(m_hi, m2_hi);
    const float R_lo = M_lo == -INFINITY ? 0.0f : M_lo;
    const float R_hi = M_hi == -INFINITY ? 0.0f : M_hi;
    const float a_lo = exp2f(m_lo - R_lo), b_lo = exp2f(m2_lo - R_lo);
    const float a_hi = exp2f(m_hi - R_hi), b_hi = exp2f(m2_hi - R_hi);
#pragma unroll
    for (int n = 0; n < 16; ++n) {
        const int d = n * 8 + 2 * (lane & 3);
        const float2 x = *(const float2 *)&sl[(lane >> 2) * 128 + d];
        const float2 y = *(const float2 *)&sl[((lane >> 2) + 8) * 128 + d];
        o[n][0] = o[n][0] * a_lo + x.x * b_lo;
        o[n][1] = o[n][1] * a_lo + x.y * b_lo;
        o[n][2] = o[n][2] * a_hi + y.x * b_hi;
        o[n][3] = o[n][3] * a_hi + y.y * b_hi;
    }
    l_lo = l_lo * a_lo + l2_lo * b_lo;
    l_hi = l_hi * a_hi + l2_hi * b_hi;
    m_lo = M_lo;
    m_hi = M_hi;
}

/* A finished row's normalizer (1 / l; 0 for a row that saw no key) and
 * its LSE (natural log; m in log2 units; -inf for a row that saw no key):
 * shared by every way the rows are stored. */
__device__ __forceinline__ float cu_rows_inv(float l)
{
    return l > 0.0f ? 1.0f / l : 0.0f;
}
__device__ __forceinline__ float cu_rows_lse(float m, float l)
{
    return l > 0.0f ? m * CU_LN2 + logf(l) : -INFINITY;
}

/* Final rows of an item: the normalized output and its LSE (one split), or
 * a normalized partial row and its LSE for the merge (several splits).
 * row_lo: the thread's first row within the item; q_lo / q_hi: its rows of
 * the output (token row x heads + head); ok_*: the row exists. */
template <typename Tag>
__device__ __forceinline__ void cu_rows_write(const cu_attn_params &params, const cu_att_item &it,
                                              int row_lo, int64_t q_lo, int64_t q_hi, bool ok_lo,
                                              bool ok_hi, const float (&o)[16][4], float m_lo,
                                              float m_hi, float l_lo, float l_hi)
{
    const int lane = threadIdx.x & 31;
    const float inv_lo = cu_rows_inv(l_lo), inv_hi = cu_rows_inv(l_hi);
    const float lse_lo = cu_rows_lse(m_lo, l_lo), lse_hi = cu_rows_lse(m_hi, l_hi);
    if (it.nsplit == 1) {
        uint32_t *op = (uint32_t *)params.out;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            const int d = n * 8 + 2 * (lane & 3);
            if (ok_lo)
                op[(q_lo * 128 + d) >> 1] = cu_pack2(o[n][0] * inv_lo, o[n][1] * inv_lo, Tag());
            if (ok_hi)
                op[(q_hi * 128 + d) >> 1] = cu_pack2(o[n][2] * inv_hi, o[n][3] * inv_hi, Tag());
        }
        if (params.lse && (lane & 3) == 0) {
            if (ok_lo)
                params.lse[q_lo] = lse_lo;
            if (ok_hi)
                params.lse[q_hi] = lse_hi;
        }
    } else {
        float *pb = params.partials +
                    ((int64_t)it.part_base + (int64_t)it.split * it.nrows) * params.partial_stride;
        float *p_lo = pb + (int64_t)row_lo * params.partial_stride;
        float *p_hi = p_lo + 8 * (int64_t)params.partial_stride;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            const int d = n * 8 + 2 * (lane & 3);
            if (ok_lo)
                *(float2 *)&p_lo[d] = make_float2(o[n][0] * inv_lo, o[n][1] * inv_lo);
            if (ok_hi)
                *(float2 *)&p_hi[d] = make_float2(o[n][2] * inv_hi, o[n][3] * inv_hi);
        }
        if ((lane & 3) == 0) {
            if (ok_lo)
                p_lo[128] = lse_lo;
            if (ok_hi)
                p_hi[128] = lse_hi;
        }
    }
}

#endif /* MSA_CUDA_KERNELS_ATTENTION_ROWS_MMA_CUH */
