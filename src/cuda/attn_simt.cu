/*
 * Attention, portable path (any element type, head dim <= 512).
 *
 * Decode items: one warp per query row of the item, online softmax over the
 * item's key range of the stream (cu_attn.cuh), fp32 throughout; the result
 * goes to the output (one split) or to a partial row for the merge.
 *
 * Prefill rows (requests with q_len > 16): the simple path, one warp per
 * (token, query head) over the token's own keys: its selected blocks
 * (sparse) or every causal key (dense, index value); writes o and lse.
 */
#include "cu_attn.cuh"

#define ATT_SIMT_WARPS 4
#define ATT_SIMT_VEC (CU_SIMT_MAX_DIM / 32)

/* Online-softmax state of one query row spread over a warp: lane holds
 * dims lane, lane + 32, ... */
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

__global__ void __launch_bounds__(ATT_SIMT_WARPS * 32) cu_attn_decode_simt_kernel(cu_layer L,
                                                                                  cu_attn A)
{
    const int warp = threadIdx.x >> 5;
    const int32_t n_items = L.m.hdr->n_att[A.kind];
    const cu_att_item *items = L.m.att[A.kind];
    for (int32_t ii = blockIdx.x; ii < n_items; ii += gridDim.x) {
        const cu_att_item it = items[ii];
        const cu_stream s = cu_stream_of(L, A, it);
        for (int32_t rl = warp; rl < it.nrows; rl += ATT_SIMT_WARPS) {
            const int32_t row = it.row0 + rl;
            const int32_t i = row / A.g;
            const int32_t hq = it.group * A.g + (row - i * A.g);
            const int64_t qrow = ((int64_t)(s.t0 + i) * A.hq_total + hq);
            cu_row_state st;
            cu_row_init(st, A, qrow * A.d);
            for (int32_t u = s.u0; u < s.u1; ++u) {
                int32_t pos;
                const uint32_t use = cu_stream_key(s, u, &pos);
                if ((use >> i) & 1u)
                    cu_row_add(st, A, cu_plane_off(L, A, s.r, it.group, pos));
            }
            if (it.nsplit == 1)
                cu_row_write_out(st, A, qrow * A.d, qrow);
            else
                cu_row_write_part(st, A,
                                  L.part + ((int64_t)it.part_base + (int64_t)it.split * it.nrows + rl) *
                                               L.part_stride);
        }
    }
}

__global__ void __launch_bounds__(ATT_SIMT_WARPS * 32) cu_attn_prefill_kernel(cu_layer L, cu_attn A)
{
    const int warp = threadIdx.x >> 5;
    const int64_t total = (int64_t)L.m.hdr->n_pf * A.hq_total;
    for (int64_t w = (int64_t)blockIdx.x * ATT_SIMT_WARPS + warp; w < total;
         w += (int64_t)gridDim.x * ATT_SIMT_WARPS) {
        const int32_t pf = (int32_t)(w / A.hq_total);
        const int32_t hq = (int32_t)(w - (int64_t)pf * A.hq_total);
        const int32_t g = hq / A.g;
        const int32_t t = L.m.pf_tok[pf];
        const int32_t r = L.m.token_req[t];
        const int32_t p = L.m.token_pos[t];
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

void cu_launch_attn_decode_simt(const cu_layer *L, const cu_plan_state *st, const cu_attn *A,
                                cudaStream_t s);
void cu_launch_attn_decode_simt(const cu_layer *L, const cu_plan_state *st, const cu_attn *A,
                                cudaStream_t s)
{
    cu_attn_decode_simt_kernel<<<st->grid_att, ATT_SIMT_WARPS * 32, 0, s>>>(*L, *A);
}

void cu_launch_attn_prefill(const cu_layer *L, const cu_plan_state *st, const cu_attn *A,
                            cudaStream_t s)
{
    cu_attn_prefill_kernel<<<st->grid_pf * 4, ATT_SIMT_WARPS * 32, 0, s>>>(*L, *A);
}
