/*
 * Attention of one query row spread over a warp, portable path (any element
 * type, quantized planes de-quantized on read, head dim <= 512): lane
 * holds dims lane, lane + 32, ...; online softmax in fp32.  Used by the SIMT decode items and the prefill rows.
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

__device__ __forceinline__ void cu_row_init(cu_row_state &st, const cu_attn_params &params,
                                            int64_t qoff)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int e = 0; e < ATT_SIMT_VEC; ++e) {
        const int d = lane + 32 * e;
        st.q[e] = d < params.head_dim ? cu_load(params.q, params.act_dtype, qoff + d) : 0.0f;
        st.acc[e] = 0.0f;
    }
    st.m = -INFINITY;
    st.l = 0.0f;
}

/* Where one key's K row and V row lie (cu_plane_at). */
struct cu_kv_rows {
    cu_qrow k, v;
};

/* Adds the key/value rows `off` of the planes, read through cu_plane_load
 * (quantized planes de-quantized; QUANT false: the planes are not
 * quantized). */
template <bool QUANT = true>
__device__ __forceinline__ void cu_row_add(cu_row_state &st, const cu_attn_params &params,
                                           cu_kv_rows off)
{
    const int lane = threadIdx.x & 31;
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < ATT_SIMT_VEC; ++e) {
        const int d = lane + 32 * e;
        if (d < params.head_dim)
            s = fmaf(st.q[e],
                     cu_plane_load<QUANT>(params.k_plane, params.kv_dtype, params.k_scale, off.k,
                                          d),
                     s);
    }
    s = cu_warp_sum(s) * params.scale;
    const float m_new = fmaxf(st.m, s);
    const float corr = st.m == -INFINITY ? 0.0f : expf(st.m - m_new);
    const float p = expf(s - m_new);
    st.l = st.l * corr + p;
    st.m = m_new;
#pragma unroll
    for (int e = 0; e < ATT_SIMT_VEC; ++e) {
        const int d = lane + 32 * e;
        if (d < params.head_dim)
            st.acc[e] = fmaf(p,
                             cu_plane_load<QUANT>(params.v_plane, params.kv_dtype, params.v_scale,
                                                  off.v, d),
                             st.acc[e] * corr);
    }
}

/* Final output row (act dtype) and LSE (natural log). */
__device__ __forceinline__ void cu_row_write_out(const cu_row_state &st,
                                                 const cu_attn_params &params, int64_t orow,
                                                 int64_t lse_idx)
{
    const int lane = threadIdx.x & 31;
    const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
#pragma unroll
    for (int e = 0; e < ATT_SIMT_VEC; ++e) {
        const int d = lane + 32 * e;
        if (d < params.head_dim)
            cu_store(params.out, params.act_dtype, orow + d, st.acc[e] * inv);
    }
    if (params.lse && lane == 0)
        params.lse[lse_idx] = st.l > 0.0f ? st.m + logf(st.l) : -INFINITY;
}

/* Partial row: normalized values, then the LSE at index d. */
__device__ __forceinline__ void cu_row_write_part(const cu_row_state &st,
                                                  const cu_attn_params &params, float *prow)
{
    const int lane = threadIdx.x & 31;
    const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
#pragma unroll
    for (int e = 0; e < ATT_SIMT_VEC; ++e) {
        const int d = lane + 32 * e;
        if (d < params.head_dim)
            prow[d] = st.acc[e] * inv;
    }
    if (lane == 0)
        prow[params.head_dim] = st.l > 0.0f ? st.m + logf(st.l) : -INFINITY;
}

/* The K row and the V row of request r's key `pos` for KV head g. */
template <bool QUANT = true>
__device__ __forceinline__ cu_kv_rows cu_plane_off(const cu_attn_params &params, int32_t r,
                                                   int32_t g, int32_t pos)
{
    const int32_t page =
        cu_page_of(params.meta.page_table, params.cap_pages, r, pos, params.log_page_size);
    const int32_t slot = pos & (params.page_size - 1);
    cu_kv_rows rows;
    rows.k = cu_plane_at<QUANT>(params.k_strides, params.kv_dtype, page, g, slot, params.page_size,
                                params.head_dim);
    rows.v = cu_plane_at<QUANT>(params.v_strides, params.kv_dtype, page, g, slot, params.page_size,
                                params.head_dim);
    return rows;
}

/* Prefill rows (requests with q_len > 16): one warp per (token, query head)
 * over the token's own keys, its selected blocks (sparse) or every causal
 * key; writes o and lse.  CTAs cta .. of nctas, `warps` warps each. */
static __device__ __forceinline__ void cu_attn_prefill_role(const cu_attn_params &params, int cta,
                                                            int nctas, int warps)
{
    const int warp = threadIdx.x >> 5;
    const int64_t total = (int64_t)params.meta.hdr->n_pf * params.q_heads;
    for (int64_t w = (int64_t)cta * warps + warp; w < total; w += (int64_t)nctas * warps) {
        const int32_t pf = (int32_t)(w / params.q_heads);
        const int32_t hq = (int32_t)(w - (int64_t)pf * params.q_heads);
        const int32_t g = hq / params.group;
        const int32_t t = params.meta.pf_tok[pf];
        const cu_tok_info ti = params.meta.tok_info[t];
        const int32_t r = ti.r, p = ti.pos;
        const int64_t qrow = (int64_t)t * params.q_heads + hq;
        cu_row_state st;
        cu_row_init(st, params, qrow * params.head_dim);
        if (params.sparse) {
            const int32_t *sel =
                params.selected + ((int64_t)t * params.layer_kv_heads + g) * params.topk_width;
            for (int32_t b = 0; b < params.topk_width; ++b) {
                const int32_t blk = sel[b];
                if (blk < 0)
                    break;
                const int32_t j1 = min(blk * params.block_size + params.block_size, p + 1);
                for (int32_t j = blk * params.block_size; j < j1; ++j)
                    cu_row_add(st, params, cu_plane_off(params, r, g, j));
            }
        } else {
            for (int32_t j = 0; j <= p; ++j)
                cu_row_add(st, params, cu_plane_off(params, r, g, j));
        }
        cu_row_write_out(st, params, qrow * params.head_dim, qrow);
    }
}

#endif /* MSA_CUDA_KERNELS_ATTENTION_ROWS_SIMT_CUH */
