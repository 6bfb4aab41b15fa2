/*
 * First kernel of every layer: one pass over the step's token rows.
 *   - real rows (when the caller did not pre-write them): store k, v, idx_k,
 *     idx_v at the row's position in the paged planes, converted to the
 *     plane's element type;
 *   - padding rows: write the padding outputs (o = 0, idx_o = 0, lse = -inf,
 *     selected ids = -1), so the later kernels only ever touch real rows.
 */
#include "cu_plan.cuh"
#include "cu_launch.cuh"

/* Copies n elements of one row, converting when the element types differ.
 * Equal types copy the bits, so NaN payloads survive as on the CPU. */
__device__ static void cu_copy_row(void *dst, int dst_dt, const void *src, int src_dt, int n)
{
    if (dst_dt == src_dt) {
        if (dst_dt == MSA_DTYPE_FP32) {
            for (int i = threadIdx.x; i < n; i += blockDim.x)
                ((uint32_t *)dst)[i] = ((const uint32_t *)src)[i];
        } else {
            for (int i = threadIdx.x; i < n; i += blockDim.x)
                ((uint16_t *)dst)[i] = ((const uint16_t *)src)[i];
        }
        return;
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        cu_store(dst, dst_dt, i, cu_load(src, src_dt, i));
}

__device__ static size_t cu_elem_size(int dt)
{
    return dt == MSA_DTYPE_FP32 ? 4 : 2;
}

__global__ void cu_prologue_kernel(cu_layer L)
{
    cu_pdl_trigger(); /* the indexer may be scheduled; it waits for us */
    const int32_t ntok = L.m.hdr->num_tokens;
    for (int32_t t = blockIdx.x; t < ntok; t += gridDim.x) {
        const int32_t r = L.m.token_req[t];
        if (r >= 0) {
            if (!L.write_cache)
                continue;
            const int32_t pos = L.m.token_pos[t];
            const int32_t page = cu_page_of(L.m.page_table, L.cap_pages, r, pos, L.logP);
            const int32_t slot = pos & (L.P - 1);
            const size_t es_act = cu_elem_size(L.act);
            const size_t es_kv = cu_elem_size(L.kv_dt);
            for (int h = 0; h < L.Hkv; ++h) {
                const int64_t dst = (((int64_t)page * L.Hkv + h) * L.P + slot) * L.D;
                const int64_t src = ((int64_t)t * L.Hkv + h) * L.D;
                cu_copy_row((char *)L.kp_w + dst * es_kv, L.kv_dt,
                            (const char *)L.k + src * es_act, L.act, L.D);
                cu_copy_row((char *)L.vp_w + dst * es_kv, L.kv_dt,
                            (const char *)L.v + src * es_act, L.act, L.D);
            }
            if (L.sparse) {
                const size_t es_idx = cu_elem_size(L.idx_dt);
                const int64_t dst = ((int64_t)page * L.P + slot) * L.Di;
                const int64_t src = (int64_t)t * L.Di;
                cu_copy_row((char *)L.ikp_w + dst * es_idx, L.idx_dt,
                            (const char *)L.ik + src * es_act, L.act, L.Di);
                if (L.iv)
                    cu_copy_row((char *)L.ivp_w + dst * es_idx, L.idx_dt,
                                (const char *)L.iv_in + src * es_act, L.act, L.Di);
            }
        } else {
            const int64_t no = (int64_t)L.Hq * L.D;
            for (int64_t i = threadIdx.x; i < no; i += blockDim.x)
                cu_store(L.o, L.act, (int64_t)t * no + i, 0.0f);
            if (L.lse)
                for (int i = threadIdx.x; i < L.Hq; i += blockDim.x)
                    L.lse[(int64_t)t * L.Hq + i] = -INFINITY;
            if (L.sparse && L.topk) {
                const int64_t nw = (int64_t)L.Hkv * L.W;
                for (int64_t i = threadIdx.x; i < nw; i += blockDim.x)
                    L.topk[(int64_t)t * nw + i] = -1;
            }
            if (L.iv) {
                const int64_t ni = (int64_t)L.Hi * L.Di;
                for (int64_t i = threadIdx.x; i < ni; i += blockDim.x)
                    cu_store(L.idx_o, L.act, (int64_t)t * ni + i, 0.0f);
            }
        }
    }
}

void cu_launch_prologue(const cu_layer *L, const cu_plan_state *st, cudaStream_t s)
{
    cu_prologue_kernel<<<st->grid_tok, 128, 0, s>>>(*L);
}
