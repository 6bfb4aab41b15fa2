/*
 * The prologue's work on one token row, shared by the prologue kernel and
 * the lean decode kernel (kernels/lean/lean_decode.cu), which does a
 * step's cache writes itself.
 *   - real rows (when the caller did not pre-write them): store k, v, idx_k,
 *     idx_v at the row's position in the paged planes, converted to the
 *     plane's element type, or quantized as the CPU backend writes them
 *     (common/quant.cuh) in the variant for quantized planes (QUANT);
 *   - padding rows: write the padding outputs (o = 0, idx_o = 0, lse = -inf,
 *     selected ids = -1), so the later kernels only ever touch real rows.
 * Every thread of the CTA takes part (blockDim.x of them).
 */
#ifndef MSA_CUDA_KERNELS_PROLOGUE_PROLOGUE_ROW_CUH
#define MSA_CUDA_KERNELS_PROLOGUE_PROLOGUE_ROW_CUH

#include "cuda/params.cuh"

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
__device__ __forceinline__ void cu_prologue_row_vec(const cu_prologue_params &p, int32_t t,
                                                    int32_t page, int32_t slot)
{
    const int32_t pk = p.head_dim / 8;       /* pieces per KV head row */
    const int32_t nkv = p.num_kv_heads * pk; /* pieces of k (and of v) */
    const int32_t pi = p.index_dim / 8;      /* pieces of an index row */
    const int32_t nidx = p.sparse ? pi : 0;
    const int32_t niv = p.index_value ? pi : 0;
    const int32_t total = 2 * nkv + nidx + niv;
    for (int32_t e = threadIdx.x; e < total; e += blockDim.x) {
        const uint4 *src;
        uint4 *dst;
        if (e < 2 * nkv) {
            const int32_t v = e >= nkv;
            const int32_t x = e - v * nkv;
            const int32_t h = x / pk, c = x - h * pk;
            const int64_t d = cu_plane_row(v ? p.v_strides : p.k_strides, page, h, slot) / 8 + c;
            const int64_t sidx = (((int64_t)t * p.num_kv_heads + h) * p.head_dim) / 8 + c;
            src = (const uint4 *)(v ? p.v_rows : p.k_rows) + sidx;
            dst = (uint4 *)(v ? p.v_plane : p.k_plane) + d;
        } else {
            const int32_t x = e - 2 * nkv;
            const int32_t w = x >= nidx; /* index value */
            const int32_t c = x - w * nidx;
            const int64_t d =
                cu_plane_row(w ? p.index_v_strides : p.index_k_strides, page, 0, slot) / 8 + c;
            src = (const uint4 *)(w ? p.index_v_rows : p.index_k_rows) + (int64_t)t * pi + c;
            dst = (uint4 *)(w ? p.index_v_plane : p.index_k_plane) + d;
        }
        *dst = __ldg(src);
    }
}

/* One unit of a plane's row: element c (nvfp4: group c of 16) of the row
 * whose activations start at element `src` of `rows`, stored at `slot` of
 * (page, head) of the plane. */
__device__ __forceinline__ void cu_prologue_put(void *plane, int dtype, float scale,
                                                const msa_plane_strides &s, int32_t page_size,
                                                int32_t dim, int32_t page, int32_t head,
                                                int32_t slot, int32_t c, const void *rows,
                                                int act_dtype, int64_t src)
{
    uint8_t *b = (uint8_t *)plane;
    if (dtype == MSA_DTYPE_NVFP4) {
        const cu_qrow row = cu_nvfp4_row(cu_plane_row(s, page, head, 0), slot, page_size, dim);
        float x[CU_NVFP4_GROUP];
#pragma unroll
        for (int e = 0; e < CU_NVFP4_GROUP; ++e)
            x[e] = cu_load(rows, act_dtype, src + c * CU_NVFP4_GROUP + e);
        uint8_t codes[CU_NVFP4_GROUP / 2], sb;
        cu_nvfp4_quantize_group(codes, &sb, x, scale);
        /* Byte stores: a region of P * D * 9 / 16 bytes leaves the next
         * one's rows without any wider alignment when P * D < 128. */
#pragma unroll
        for (int i = 0; i < CU_NVFP4_GROUP / 2; ++i)
            b[row.at + c * (CU_NVFP4_GROUP / 2) + i] = codes[i];
        b[row.scales + c] = sb;
    } else if (dtype == MSA_DTYPE_FP8_E4M3) {
        b[cu_plane_row(s, page, head, slot) + c] =
            cu_fp8_quantize(cu_load(rows, act_dtype, src + c), scale);
    } else {
        cu_copy_elem(plane, dtype, cu_plane_row(s, page, head, slot) + c, rows, act_dtype, src + c);
    }
}

/* A real row into planes of which some are quantized: one unit (element,
 * or nvfp4 group) per thread. */
__device__ __forceinline__ void cu_prologue_row_quant(const cu_prologue_params &p, int32_t t,
                                                      int32_t page, int32_t slot)
{
    const int32_t ukv = p.kv_dtype == MSA_DTYPE_NVFP4 ? p.head_dim / CU_NVFP4_GROUP : p.head_dim;
    const int32_t uidx = p.index_dtype == MSA_DTYPE_NVFP4 ? p.index_dim / CU_NVFP4_GROUP
                                                          : p.index_dim;
    const int32_t nkv = p.num_kv_heads * ukv; /* units of k (and of v) */
    const int32_t nidx = p.sparse ? uidx : 0;
    const int32_t niv = p.index_value ? uidx : 0;
    const int32_t total = 2 * nkv + nidx + niv;
    for (int32_t e = threadIdx.x; e < total; e += blockDim.x) {
        if (e < 2 * nkv) {
            const int32_t v = e >= nkv;
            const int32_t x = e - v * nkv;
            const int32_t h = x / ukv, c = x - h * ukv;
            const int64_t src = ((int64_t)t * p.num_kv_heads + h) * p.head_dim;
            if (v)
                cu_prologue_put(p.v_plane, p.kv_dtype, p.v_scale, p.v_strides, p.page_size,
                                p.head_dim, page, h, slot, c, p.v_rows, p.act_dtype, src);
            else
                cu_prologue_put(p.k_plane, p.kv_dtype, p.k_scale, p.k_strides, p.page_size,
                                p.head_dim, page, h, slot, c, p.k_rows, p.act_dtype, src);
        } else {
            const int32_t x = e - 2 * nkv;
            const int32_t w = x >= nidx; /* index value */
            const int32_t c = x - w * nidx;
            const int64_t src = (int64_t)t * p.index_dim;
            if (w)
                cu_prologue_put(p.index_v_plane, p.index_dtype, p.index_v_scale, p.index_v_strides,
                                p.page_size, p.index_dim, page, 0, slot, c, p.index_v_rows,
                                p.act_dtype, src);
            else
                cu_prologue_put(p.index_k_plane, p.index_dtype, p.index_k_scale, p.index_k_strides,
                                p.page_size, p.index_dim, page, 0, slot, c, p.index_k_rows,
                                p.act_dtype, src);
        }
    }
}

/* Token row t, whose facts are ti. */
template <bool QUANT>
__device__ __forceinline__ void cu_prologue_token(const cu_prologue_params &p, int32_t t,
                                                  const cu_tok_info &ti)
{
    const int32_t r = ti.r;
    if (r >= 0) {
        if (!p.write_cache)
            return;
        const int32_t page = ti.page;
        /* -1: the row's page-table entry, read on the device, lies
         * outside the pool (plan.cu): the row is not written. */
        if (page < 0)
            return;
        const int32_t slot = ti.pos & (p.page_size - 1);
        if (QUANT) {
            cu_prologue_row_quant(p, t, page, slot);
            return;
        }
        if (p.rows_in_pieces) {
            cu_prologue_row_vec(p, t, page, slot);
            return;
        }
        /* All elements of the row's planes at once: independent loads. */
        const int32_t nkv = p.num_kv_heads * p.head_dim;
        const int32_t nidx = p.sparse ? p.index_dim : 0;
        const int32_t niv = p.index_value ? p.index_dim : 0;
        const int32_t total = 2 * nkv + nidx + niv;
        for (int32_t e = threadIdx.x; e < total; e += blockDim.x) {
            if (e < 2 * nkv) {
                const int32_t v = e >= nkv;
                const int32_t x = e - v * nkv;
                const int32_t h = x / p.head_dim, d = x - h * p.head_dim;
                const int64_t dst = cu_plane_row(v ? p.v_strides : p.k_strides, page, h, slot) + d;
                const int64_t src = ((int64_t)t * p.num_kv_heads + h) * p.head_dim + d;
                if (v)
                    cu_copy_elem(p.v_plane, p.kv_dtype, dst, p.v_rows, p.act_dtype, src);
                else
                    cu_copy_elem(p.k_plane, p.kv_dtype, dst, p.k_rows, p.act_dtype, src);
            } else {
                const int32_t x = e - 2 * nkv;
                const int32_t w = x >= nidx; /* index value */
                const int32_t d = x - w * nidx;
                const int64_t dst =
                    cu_plane_row(w ? p.index_v_strides : p.index_k_strides, page, 0, slot) + d;
                const int64_t src = (int64_t)t * p.index_dim + d;
                if (w)
                    cu_copy_elem(p.index_v_plane, p.index_dtype, dst, p.index_v_rows, p.act_dtype,
                                 src);
                else
                    cu_copy_elem(p.index_k_plane, p.index_dtype, dst, p.index_k_rows, p.act_dtype,
                                 src);
            }
        }
    } else {
        const int64_t no = (int64_t)p.num_q_heads * p.head_dim;
        for (int64_t i = threadIdx.x; i < no; i += blockDim.x)
            cu_store(p.out, p.act_dtype, (int64_t)t * no + i, 0.0f);
        if (p.lse)
            for (int i = threadIdx.x; i < p.num_q_heads; i += blockDim.x)
                p.lse[(int64_t)t * p.num_q_heads + i] = -INFINITY;
        if (p.sparse && p.topk_ids) {
            const int64_t nw = (int64_t)p.num_kv_heads * p.topk_width;
            for (int64_t i = threadIdx.x; i < nw; i += blockDim.x)
                p.topk_ids[(int64_t)t * nw + i] = -1;
        }
        if (p.index_value) {
            const int64_t ni = (int64_t)p.num_index_heads * p.index_dim;
            for (int64_t i = threadIdx.x; i < ni; i += blockDim.x)
                cu_store(p.index_out, p.act_dtype, (int64_t)t * ni + i, 0.0f);
        }
    }
}

#endif /* MSA_CUDA_KERNELS_PROLOGUE_PROLOGUE_ROW_CUH */
