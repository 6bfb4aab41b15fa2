/*
 * First kernel of every layer: one pass over the step's token rows.
 *   - real rows (when the caller did not pre-write them): store k, v, idx_k,
 *     idx_v at the row's position in the paged planes, converted to the
 *     plane's element type;
 *   - padding rows: write the padding outputs (o = 0, idx_o = 0, lse = -inf,
 *     selected ids = -1), so the later kernels only ever touch real rows.
 */
#include "cuda/plan.cuh"
#include "cuda/arch/launch.cuh"
#include "cuda/common/timeline.cuh"

/* One element, converted when the element types differ.  Equal types copy
 * the bits, so NaN payloads survive as on the CPU. */
__device__ __forceinline__ void cu_copy_elem(void *dst, int dst_dt, int64_t di, const void *src,
                                             int src_dt, int64_t si)
{
    if (dst_dt == src_dt) {
        if (dst_dt == MSA_DTYPE_FP32)
            ((uint32_t *)dst)[di] = ((const uint32_t *)src)[si];
        else
            ((uint16_t *)dst)[di] = ((const uint16_t *)src)[si];
    } else {
        cu_store(dst, dst_dt, di, cu_load(src, src_dt, si));
    }
}

/* Row copy in 16-byte pieces: equal 16-bit element types, every row length
 * a multiple of 8 and every base 16-byte aligned (checked on the host).
 * One piece per thread: the loads of a token row are all in flight at once
 * instead of one dependent round trip per element loop iteration. */
__device__ __forceinline__ void cu_prologue_row_vec(const cu_layer &L, int32_t t, int32_t page,
                                                    int32_t slot)
{
    const int32_t pk = L.D / 8;     /* pieces per KV head row */
    const int32_t nkv = L.Hkv * pk; /* pieces of k (and of v) */
    const int32_t pi = L.Di / 8;    /* pieces of an index row */
    const int32_t nidx = L.sparse ? pi : 0;
    const int32_t niv = L.iv ? pi : 0;
    const int32_t total = 2 * nkv + nidx + niv;
    for (int32_t e = threadIdx.x; e < total; e += blockDim.x) {
        const uint4 *src;
        uint4 *dst;
        if (e < 2 * nkv) {
            const int32_t v = e >= nkv;
            const int32_t x = e - v * nkv;
            const int32_t h = x / pk, c = x - h * pk;
            const int64_t d = ((((int64_t)page * L.Hkv + h) * L.P + slot) * L.D) / 8 + c;
            const int64_t sidx = (((int64_t)t * L.Hkv + h) * L.D) / 8 + c;
            src = (const uint4 *)(v ? L.v : L.k) + sidx;
            dst = (uint4 *)(v ? L.vp_w : L.kp_w) + d;
        } else {
            const int32_t x = e - 2 * nkv;
            const int32_t w = x >= nidx; /* index value */
            const int32_t c = x - w * nidx;
            const int64_t d = (((int64_t)page * L.P + slot) * L.Di) / 8 + c;
            src = (const uint4 *)(w ? L.iv_in : L.ik) + (int64_t)t * pi + c;
            dst = (uint4 *)(w ? L.ivp_w : L.ikp_w) + d;
        }
        *dst = __ldg(src);
    }
}

/* Eight CTAs per SM (32 registers): the grid (up to 8 per SM, one per
 * token) is then a single wave. */
__global__ void __launch_bounds__(256, 8) cu_prologue_kernel(cu_layer L)
{
    cu_pdl_trigger(); /* the indexer may be scheduled; it waits for us */
    if (threadIdx.x == 0)
        CU_TL_MARK(L, CU_TL_PROLOGUE, CU_TL_ENTRY);
    /* The first row's facts load beside the row count, not after it
     * (grid_tok <= cap_tok: the entry exists). */
    cu_tok_info ti = L.m.tok_info[blockIdx.x];
    const int32_t ntok = L.m.hdr->num_tokens;
    for (int32_t t = blockIdx.x; t < ntok; t += gridDim.x) {
        if (t != (int32_t)blockIdx.x)
            ti = L.m.tok_info[t];
        const int32_t r = ti.r;
        if (r >= 0) {
            if (!L.write_cache)
                continue;
            const int32_t page = ti.page;
            const int32_t slot = ti.pos & (L.P - 1);
            if (L.row_vec) {
                cu_prologue_row_vec(L, t, page, slot);
                continue;
            }
            /* All elements of the row's planes at once: independent loads. */
            const int32_t nkv = L.Hkv * L.D;
            const int32_t nidx = L.sparse ? L.Di : 0;
            const int32_t niv = L.iv ? L.Di : 0;
            const int32_t total = 2 * nkv + nidx + niv;
            for (int32_t e = threadIdx.x; e < total; e += blockDim.x) {
                if (e < 2 * nkv) {
                    const int32_t v = e >= nkv;
                    const int32_t x = e - v * nkv;
                    const int32_t h = x / L.D, d = x - h * L.D;
                    const int64_t dst = (((int64_t)page * L.Hkv + h) * L.P + slot) * L.D + d;
                    const int64_t src = ((int64_t)t * L.Hkv + h) * L.D + d;
                    if (v)
                        cu_copy_elem(L.vp_w, L.kv_dt, dst, L.v, L.act, src);
                    else
                        cu_copy_elem(L.kp_w, L.kv_dt, dst, L.k, L.act, src);
                } else {
                    const int32_t x = e - 2 * nkv;
                    const int32_t w = x >= nidx; /* index value */
                    const int32_t d = x - w * nidx;
                    const int64_t dst = ((int64_t)page * L.P + slot) * L.Di + d;
                    const int64_t src = (int64_t)t * L.Di + d;
                    if (w)
                        cu_copy_elem(L.ivp_w, L.idx_dt, dst, L.iv_in, L.act, src);
                    else
                        cu_copy_elem(L.ikp_w, L.idx_dt, dst, L.ik, L.act, src);
                }
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
    if (threadIdx.x == 0)
        CU_TL_MARK(L, CU_TL_PROLOGUE, CU_TL_EXIT);
}

void cu_launch_prologue(const cu_layer *L, const cu_plan_state *st, cudaStream_t s)
{
    cu_prologue_kernel<<<st->sz.grid_tok, 256, 0, s>>>(*L);
}
