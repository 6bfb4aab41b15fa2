/*
 * bf16 queries as sums of two fp8_e4m3 terms, so that scores over fp8_e4m3
 * key codes run on the tensor cores' fp8 products (wgmma .e4m3, sm_90a)
 * with the codes read as they lie in shared memory, not widened first.
 *
 * Each query row q takes a power of two 2^s that brings its largest finite
 * magnitude into [2^7, 2^8); then q x 2^s = hi + lo, hi the E4M3 value
 * nearest q x 2^s and lo the rest, rounded to E4M3 again.  A bf16 value
 * has eight significant bits and hi holds its top four, so the rest is at
 * most eight units of the value's last place and fits E4M3's four
 * significant bits: the sum is exact wherever that unit is on E4M3's grid
 * (2^-9 and up), that is for every value of the row within 2^9 of its
 * largest.  Smaller values keep an error below 2^-10 at the scaled level,
 * below 2^-17 of the row's largest magnitude: products of E4M3 codes are
 * exact in the fp32 accumulators, so a score differs from the one over
 * widened keys by at most that share of the row's products.  (The indexer
 * ranks blocks on exact products, SPEC 4, and keeps widening its codes.)
 * A row holding an infinity or a NaN gets the factor NaN: its scores are
 * NaN, as products with such a query would make them.
 *
 * The fragments are the A operand of cu_wgmma_m64n64k32_e4m3 for rows of
 * 128 dimensions: four k-steps of 32, in each a0 = row lo, dimensions
 * 32 ks + 4 (lane % 4) .. + 3; a1 = row hi, the same; a2, a3 = 16 further.
 */
#ifndef MSA_CUDA_COMMON_Q_E4M3_CUH
#define MSA_CUDA_COMMON_Q_E4M3_CUH

#include <stdint.h>

#ifdef __CUDACC__

/* The shift s for a row whose largest finite magnitude has the bf16 bits
 * mx (sign cleared, below 0x7f80): that magnitude times 2^s lies in
 * [2^7, 2^8).  Rows whose largest is below 2^-119 (or zero) take s = 126,
 * so 2^s and 2^-s stay normal fp32 numbers. */
__host__ __device__ __forceinline__ int cu_qe4m3_shift(uint32_t mx)
{
    const int s = 134 - (int)(mx >> 7); /* 7 - (biased exponent - 127) */
    return s > 126 ? 126 : s;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890

/* Two fp32 values as E4M3 codes rounded to nearest even: x0 in the low
 * byte.  Finite inputs here are below 2^8 in magnitude, inside E4M3's
 * range, so the saturating form never saturates. */
__device__ __forceinline__ uint32_t cu_qe4m3_pack2(float x0, float x1)
{
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(x1), "f"(x0));
    return r;
}

/* The values of the two codes of cu_qe4m3_pack2 (exact: E4M3 values are
 * fp16 values). */
__device__ __forceinline__ void cu_qe4m3_unpack2(uint32_t c, float &x0, float &x1)
{
    uint32_t h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"((unsigned short)c));
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(x0) : "h"((unsigned short)(h & 0xffffu)));
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(x1) : "h"((unsigned short)(h >> 16)));
}

/* Four bf16 values (two words, low half first) times up as the hi and lo
 * terms' four codes each, the first value in the low byte. */
__device__ __forceinline__ void cu_qe4m3_split4(uint32_t w0, uint32_t w1, float up, uint32_t &hi,
                                                uint32_t &lo)
{
    const float x[4] = {__uint_as_float(w0 << 16) * up, __uint_as_float(w0 & 0xffff0000u) * up,
                        __uint_as_float(w1 << 16) * up, __uint_as_float(w1 & 0xffff0000u) * up};
    const uint32_t h01 = cu_qe4m3_pack2(x[0], x[1]), h23 = cu_qe4m3_pack2(x[2], x[3]);
    float y[4];
    cu_qe4m3_unpack2(h01, y[0], y[1]);
    cu_qe4m3_unpack2(h23, y[2], y[3]);
    hi = h01 | (h23 << 16);
    lo = cu_qe4m3_pack2(x[0] - y[0], x[1] - y[1]) |
         (cu_qe4m3_pack2(x[2] - y[2], x[3] - y[3]) << 16);
}

/* Largest finite magnitude among the two bf16 values of w (bits, sign
 * cleared), or 0x8000 if either is an infinity or a NaN. */
__device__ __forceinline__ uint32_t cu_qe4m3_mag(uint32_t w)
{
    const uint32_t a = w & 0x7fffu, b = (w >> 16) & 0x7fffu;
    return max(a >= 0x7f80u ? 0x8000u : a, b >= 0x7f80u ? 0x8000u : b);
}

/* A row's factor from its lanes' magnitudes: up = 2^s, and the return
 * value 2^-s (NaN for a row with an infinity or a NaN). */
__device__ __forceinline__ float cu_qe4m3_row_scale(uint32_t mx, float &up)
{
    mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const int s = cu_qe4m3_shift(mx & 0x7fffu);
    up = __uint_as_float((uint32_t)(127 + s) << 23);
    return mx >= 0x8000u ? __uint_as_float(0x7fc00000u)
                         : __uint_as_float((uint32_t)(127 - s) << 23);
}

/* The hi and lo fragments of the thread's query rows q_lo / q_hi (bf16,
 * rows of 128; rows that do not exist read as zero), and each row's
 * factor 2^-s for its scores.  Every lane of the warp calls it. */
__device__ __forceinline__ void cu_q_bf16_to_e4m3(const void *q, int64_t q_lo, int64_t q_hi,
                                                  bool ok_lo, bool ok_hi, uint32_t (&qh)[4][4],
                                                  uint32_t (&ql)[4][4], float &back_lo,
                                                  float &back_hi)
{
    const int lane = threadIdx.x & 31;
    const uint32_t *qp = (const uint32_t *)q;
    uint32_t w[4][4][2];
    uint32_t m_lo = 0u, m_hi = 0u;
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const bool hi_row = (r & 1) != 0;
            const bool ok = hi_row ? ok_hi : ok_lo;
            const int64_t d =
                (hi_row ? q_hi : q_lo) * 128 + ks * 32 + (r >> 1) * 16 + 4 * (lane & 3);
            w[ks][r][0] = ok ? qp[d >> 1] : 0u;
            w[ks][r][1] = ok ? qp[(d >> 1) + 1] : 0u;
            const uint32_t m = max(cu_qe4m3_mag(w[ks][r][0]), cu_qe4m3_mag(w[ks][r][1]));
            if (hi_row)
                m_hi = max(m_hi, m);
            else
                m_lo = max(m_lo, m);
        }
    }
    float up_lo, up_hi;
    back_lo = cu_qe4m3_row_scale(m_lo, up_lo);
    back_hi = cu_qe4m3_row_scale(m_hi, up_hi);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int r = 0; r < 4; ++r)
            cu_qe4m3_split4(w[ks][r][0], w[ks][r][1], (r & 1) ? up_hi : up_lo, qh[ks][r],
                            ql[ks][r]);
}

#endif /* __CUDA_ARCH__ >= 890 */

#endif /* __CUDACC__ */

#endif /* MSA_CUDA_COMMON_Q_E4M3_CUH */
