/*
 * The prologue's work on one token row, shared by the prologue kernel and
 * the lean decode kernel (kernels/lean/lean_decode.cu), which does a
 * step's cache writes itself.
 *   - real rows (when the caller did not pre-write them): store k, v, idx_k,
 *     idx_v at the row's position in the paged planes, converted to the
 *     plane's element type (cu_prologue_token), or, where some planes are
 *     quantized, in units of 16 elements quantized as the CPU backend
 *     writes them (common/quant.cuh; cu_prologue_unit_quant);
 *   - padding rows: write the padding outputs (o = 0, idx_o = 0, lse = -inf,
 *     selected ids = -1), so the later kernels only ever touch real rows.
 * In cu_prologue_token and cu_prologue_padding every thread of the CTA
 * takes part (blockDim.x of them).
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

/* Units of quantized rows: 16 consecutive elements of a row (an nvfp4
 * group; for fp8, one 16-byte store of codes). */
#define CU_PRO_UNIT 16

__device__ __forceinline__ int32_t cu_prologue_units(int32_t dim)
{
    return (dim + CU_PRO_UNIT - 1) / CU_PRO_UNIT;
}

/* Elements [e0, e0 + n) of `rows` from element `src` on, n <= 16, as
 * floats (exact: every activation type widens to fp32 without rounding).
 * A whole unit of 16-bit activations at a 16-byte aligned address comes
 * in two 16-byte loads. */
__device__ __forceinline__ void cu_prologue_load16(const void *rows, int act_dtype, int64_t src,
                                                   int32_t n, float x[CU_PRO_UNIT])
{
    const uint16_t *h = (const uint16_t *)rows + src;
    if (act_dtype != MSA_DTYPE_FP32 && n == CU_PRO_UNIT && ((uintptr_t)h & 15u) == 0) {
        const uint4 a = __ldg((const uint4 *)h), b = __ldg((const uint4 *)h + 1);
        const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            x[2 * i] = cu_bits16_to_f32((uint16_t)(w[i] & 0xffffu), act_dtype);
            x[2 * i + 1] = cu_bits16_to_f32((uint16_t)(w[i] >> 16), act_dtype);
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < CU_PRO_UNIT; ++i)
        x[i] = i < n ? cu_load(rows, act_dtype, src + i) : 0.0f;
}

/* Unit c (elements 16c .. 16c + 15, fewer at the end of the row) of the
 * row whose activations start at element `src` of `rows`, stored at
 * `slot` of (page, head) of the plane, quantized as the CPU backend
 * writes it.  nvfp4 rows are whole groups (the cache refuses other
 * dims).  Codes that do not start on the wide store's alignment take byte
 * stores: fp8 rows whose dim is not a multiple of 16, and nvfp4 rows of
 * regions that do not start on 8 bytes, as some do where a region (P x D
 * x 9 / 16 bytes) is not a multiple of 8 bytes (P x D not a multiple of
 * 128). */
__device__ __forceinline__ void cu_prologue_put16(void *plane, int dtype, float scale,
                                                  const msa_plane_strides &s, int32_t page_size,
                                                  int32_t dim, int32_t page, int32_t head,
                                                  int32_t slot, int32_t c, const void *rows,
                                                  int act_dtype, int64_t src)
{
    uint8_t *b = (uint8_t *)plane;
    const int32_t e0 = c * CU_PRO_UNIT;
    const int32_t n = min(CU_PRO_UNIT, dim - e0);
    if (!cu_is_quantized(dtype)) {
        const int64_t d = cu_plane_row(s, page, head, slot) + e0;
        for (int32_t i = 0; i < n; ++i)
            cu_copy_elem(plane, dtype, d + i, rows, act_dtype, src + e0 + i);
        return;
    }
    float x[CU_PRO_UNIT];
    cu_prologue_load16(rows, act_dtype, src + e0, n, x);
    if (dtype == MSA_DTYPE_NVFP4) {
        const cu_qrow row = cu_nvfp4_row(cu_plane_row(s, page, head, 0), slot, page_size, dim);
        uint8_t codes[CU_NVFP4_GROUP / 2], sb;
        cu_nvfp4_quantize_group(codes, &sb, x, scale);
        uint8_t *dst = b + row.at + c * (CU_NVFP4_GROUP / 2);
        if (((uintptr_t)dst & 7u) == 0) {
            uint32_t w[2] = {0u, 0u};
#pragma unroll
            for (int i = 0; i < CU_NVFP4_GROUP / 2; ++i)
                w[i / 4] |= (uint32_t)codes[i] << (8 * (i % 4));
            *(uint2 *)dst = make_uint2(w[0], w[1]);
        } else {
#pragma unroll
            for (int i = 0; i < CU_NVFP4_GROUP / 2; ++i)
                dst[i] = codes[i];
        }
        b[row.scales + c] = sb;
        return;
    }
    uint32_t w[CU_PRO_UNIT / 4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int i = 0; i < CU_PRO_UNIT; ++i)
        w[i / 4] |= (uint32_t)cu_fp8_quantize(x[i], scale) << (8 * (i % 4));
    uint8_t *dst = b + cu_plane_row(s, page, head, slot) + e0;
    if (n == CU_PRO_UNIT && ((uintptr_t)dst & 15u) == 0) {
        *(uint4 *)dst = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
#pragma unroll
        for (int i = 0; i < CU_PRO_UNIT; ++i)
            if (i < n)
                dst[i] = (uint8_t)(w[i / 4] >> (8 * (i % 4)));
    }
}

/* Units of a real row into planes of which some are quantized. */
__device__ __forceinline__ int32_t cu_prologue_quant_units(const cu_prologue_params &p)
{
    const int32_t ukv = cu_prologue_units(p.head_dim), uidx = cu_prologue_units(p.index_dim);
    return 2 * p.num_kv_heads * ukv + (p.sparse ? uidx : 0) + (p.index_value ? uidx : 0);
}

/* Unit e of real row t (at `slot` of `page`), e < cu_prologue_quant_units:
 * K's heads first, then V's, the index key, the index value.  The plane's
 * facts are chosen first and the unit's code runs once: a warp's units
 * straddle planes (72 units a row for M3), and a call per plane would run
 * each inlined copy in turn. */
__device__ __forceinline__ void cu_prologue_unit_quant(const cu_prologue_params &p, int32_t t,
                                                       int32_t page, int32_t slot, int32_t e)
{
    const int32_t ukv = cu_prologue_units(p.head_dim), uidx = cu_prologue_units(p.index_dim);
    const int32_t nkv = p.num_kv_heads * ukv; /* units of k (and of v) */
    const int32_t nidx = p.sparse ? uidx : 0;
    void *plane;
    int dtype;
    float scale;
    msa_plane_strides st;
    int32_t dim, head, c;
    const void *rows;
    int64_t src;
    if (e < 2 * nkv) {
        const int32_t v = e >= nkv;
        const int32_t x = e - v * nkv;
        head = x / ukv;
        c = x - head * ukv;
        plane = v ? p.v_plane : p.k_plane;
        dtype = p.kv_dtype;
        scale = v ? p.v_scale : p.k_scale;
        st = v ? p.v_strides : p.k_strides;
        dim = p.head_dim;
        rows = v ? p.v_rows : p.k_rows;
        src = ((int64_t)t * p.num_kv_heads + head) * p.head_dim;
    } else {
        const int32_t x = e - 2 * nkv;
        const int32_t w = x >= nidx; /* index value */
        head = 0;
        c = x - w * nidx;
        plane = w ? p.index_v_plane : p.index_k_plane;
        dtype = p.index_dtype;
        scale = w ? p.index_v_scale : p.index_k_scale;
        st = w ? p.index_v_strides : p.index_k_strides;
        dim = p.index_dim;
        rows = w ? p.index_v_rows : p.index_k_rows;
        src = (int64_t)t * p.index_dim;
    }
    cu_prologue_put16(plane, dtype, scale, st, p.page_size, dim, page, head, slot, c, rows,
                      p.act_dtype, src);
}

/* The outputs of padding row t: o = 0, idx_o = 0, lse = -inf, ids = -1. */
__device__ __forceinline__ void cu_prologue_padding(const cu_prologue_params &p, int32_t t)
{
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

/* Token row t, whose facts are ti, into 16-bit or fp32 planes (rows of
 * quantized planes go by units: cu_prologue_unit_quant). */
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
        cu_prologue_padding(p, t);
    }
}

#endif /* MSA_CUDA_KERNELS_PROLOGUE_PROLOGUE_ROW_CUH */
