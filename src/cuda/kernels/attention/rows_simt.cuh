/*
 * Attention of one query row spread over a warp, portable path (any element
 * type, head dim <= 512): lane holds dims lane, lane + 32, ...; online
 * softmax in fp32.  Used by the SIMT decode items and the prefill rows.
 */
#ifndef MSA_CUDA_KERNELS_ATTENTION_ROWS_SIMT_CUH
#define MSA_CUDA_KERNELS_ATTENTION_ROWS_SIMT_CUH

#include "cuda/kernels/attention/key_stream.cuh"

#define ATT_SIMT_VEC (CU_SIMT_MAX_DIM / 32)

typedef struct cu_row_state {
    float q[ATT_SIMT_VEC];
    float acc[ATT_SIMT_VEC];
    float m, l;
} cu_row_state;

__device__ __forceinline__ void cu_row_init(cu_row_state &st, const cu_attn &A, int64_t qoff)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int e = 0; e < ATT_SIMT_VEC; ++e) {
        const int d = lane + 32 * e;
        st.q[e] = d < A.d ? cu_load(A.q, A.act, qoff + d) : 0.0f;
        st.acc[e] = 0.0f;
    }
    st.m = -INFINITY;
    st.l = 0.0f;
}

/* Adds key/value row at element offset `off` of the planes. */
__device__ __forceinline__ void cu_row_add(cu_row_state &st, const cu_attn &A, int64_t off)
{
    const int lane = threadIdx.x & 31;
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < ATT_SIMT_VEC; ++e) {
        const int d = lane + 32 * e;
        if (d < A.d)
            s = fmaf(st.q[e], cu_load(A.kp, A.kv_dt, off + d), s);
    }
    s = cu_warp_sum(s) * A.scale;
    const float m_new = fmaxf(st.m, s);
    const float corr = st.m == -INFINITY ? 0.0f : expf(st.m - m_new);
    const float p = expf(s - m_new);
    st.l = st.l * corr + p;
    st.m = m_new;
#pragma unroll
    for (int e = 0; e < ATT_SIMT_VEC; ++e) {
        const int d = lane + 32 * e;
        if (d < A.d)
            st.acc[e] = fmaf(p, cu_load(A.vp, A.kv_dt, off + d), st.acc[e] * corr);
    }
}

/* Final output row (act dtype) and LSE (natural log). */
__device__ __forceinline__ void cu_row_write_out(const cu_row_state &st, const cu_attn &A,
                                                 int64_t orow, int64_t lse_idx)
{
    const int lane = threadIdx.x & 31;
    const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
#pragma unroll
    for (int e = 0; e < ATT_SIMT_VEC; ++e) {
        const int d = lane + 32 * e;
        if (d < A.d)
            cu_store(A.o, A.act, orow + d, st.acc[e] * inv);
    }
    if (A.lse && lane == 0)
        A.lse[lse_idx] = st.l > 0.0f ? st.m + logf(st.l) : -INFINITY;
}

/* Partial row: normalized values, then the LSE at index d. */
__device__ __forceinline__ void cu_row_write_part(const cu_row_state &st, const cu_attn &A,
                                                  float *prow)
{
    const int lane = threadIdx.x & 31;
    const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
#pragma unroll
    for (int e = 0; e < ATT_SIMT_VEC; ++e) {
        const int d = lane + 32 * e;
        if (d < A.d)
            prow[d] = st.acc[e] * inv;
    }
    if (lane == 0)
        prow[A.d] = st.l > 0.0f ? st.m + logf(st.l) : -INFINITY;
}

__device__ __forceinline__ int64_t cu_plane_off(const cu_layer &L, const cu_attn &A, int32_t r,
                                                int32_t g, int32_t pos)
{
    const int32_t page = cu_page_of(L.m.page_table, L.cap_pages, r, pos, L.logP);
    return (((int64_t)page * A.hkv + g) * L.P + (pos & (L.P - 1))) * A.d;
}

/* Prefill rows (requests with q_len > 16): one warp per (token, query head)
 * over the token's own keys, its selected blocks (sparse) or every causal
 * key; writes o and lse.  CTAs cta .. of nctas, `warps` warps each. */
static __device__ __forceinline__ void cu_attn_prefill_role(const cu_layer &L, const cu_attn &A,
                                                            int cta, int nctas, int warps)
{
    const int warp = threadIdx.x >> 5;
    const int64_t total = (int64_t)L.m.hdr->n_pf * A.hq_total;
    for (int64_t w = (int64_t)cta * warps + warp; w < total; w += (int64_t)nctas * warps) {
        const int32_t pf = (int32_t)(w / A.hq_total);
        const int32_t hq = (int32_t)(w - (int64_t)pf * A.hq_total);
        const int32_t g = hq / A.g;
        const int32_t t = L.m.pf_tok[pf];
        const cu_tok_info ti = L.m.tok_info[t];
        const int32_t r = ti.r, p = ti.pos;
        const int64_t qrow = (int64_t)t * A.hq_total + hq;
        cu_row_state st;
        cu_row_init(st, A, qrow * A.d);
        if (A.sparse) {
            const int32_t *sel = L.sel + ((int64_t)t * L.Hkv + g) * A.W;
            for (int32_t b = 0; b < A.W; ++b) {
                const int32_t blk = sel[b];
                if (blk < 0)
                    break;
                const int32_t j1 = min(blk * A.B + A.B, p + 1);
                for (int32_t j = blk * A.B; j < j1; ++j)
                    cu_row_add(st, A, cu_plane_off(L, A, r, g, j));
            }
        } else {
            for (int32_t j = 0; j <= p; ++j)
                cu_row_add(st, A, cu_plane_off(L, A, r, g, j));
        }
        cu_row_write_out(st, A, qrow * A.d, qrow);
    }
}

#endif /* MSA_CUDA_KERNELS_ATTENTION_ROWS_SIMT_CUH */
