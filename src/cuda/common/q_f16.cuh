/*
 * The 16-bit type of the Hopper decode kernels' products over quantized
 * planes, and bf16 queries brought to it.
 *
 * fp8_e4m3 codes widen to fp16 with one conversion instruction a pair
 * (cvt.rn.f16x2.e4m3x2, sm_89 and later); to bf16 they take four
 * operations and a NaN test (quant_widen.cuh), which bounded the decode
 * indexer and attention over fp8 planes with bf16 activations.  Every
 * E4M3 value is exact in fp16, and so is every nvfp4 value (E2M1 code
 * times E4M3 group scale), which widens in fp16 arithmetic in fewer
 * operations than through fp32 (quant_widen.cuh); so with bf16
 * activations those kernels take their products in fp16 over both: each
 * warp's bf16 query fragments become fp16 values scaled by a power of
 * two (cu_q_bf16_to_f16), and the scores are scaled back in fp32.  The
 * probabilities of O = P V round to fp16 instead of bf16 (three more
 * significant bits; weights below 2^-24 of the row's largest, which is
 * 1, round to 0).  The output rows keep the activations' type.
 */
#ifndef MSA_CUDA_COMMON_Q_F16_CUH
#define MSA_CUDA_COMMON_Q_F16_CUH

#include "cuda/common/quant_widen.cuh"

#ifdef __CUDACC__

/* The products' type for activations Tag over planes of row format KF:
 * fp16 for quantized codes (nvfp4 codes times their group scales are
 * fp16 values too, widened in fp16 arithmetic: quant_widen.cuh), else
 * the activations' type (16-bit planes are read as they are). */
template <typename Tag, int KF>
struct cu_compute_tag {
    typedef Tag type;
};
template <>
struct cu_compute_tag<cu_bf16_tag, CU_PLANE_FP8> {
    typedef cu_f16_tag type;
};
template <>
struct cu_compute_tag<cu_bf16_tag, CU_PLANE_NVFP4> {
    typedef cu_f16_tag type;
};

/* Whether queries of activations Tag need cu_q_bf16_to_f16 before
 * products in CTag. */
template <typename Tag, typename CTag>
struct cu_q_converts {
    static constexpr bool value = false;
};
template <>
struct cu_q_converts<cu_bf16_tag, cu_f16_tag> {
    static constexpr bool value = true;
};

/* Limits of the power of two s a warp's queries are scaled by: 2^s and
 * 2^-s stay normal fp32 numbers. */
#define CU_QF16_SHIFT_MIN (-113)
#define CU_QF16_SHIFT_MAX 24

/* The shift s for a warp whose largest finite query magnitude has the
 * bf16 bits mx (sign cleared): that magnitude times 2^s lies below 2^15,
 * inside fp16's range (65504).  Every value within 2^31 of it then keeps
 * all eight significant bits in fp16 (normal down to 2^-14, subnormal
 * steps of 2^-24); smaller ones round as fp16 values do.  Infinities and
 * NaNs stay what they are.  A warp whose values are all below 2^-10 (or
 * zero) takes the largest shift: values down to 2^-41 stay exact. */
__host__ __device__ __forceinline__ int cu_qf16_shift(uint32_t mx)
{
    const int s = 141 - (int)(mx >> 7); /* 14 - (biased exponent - 127) */
    return s < CU_QF16_SHIFT_MIN   ? CU_QF16_SHIFT_MIN
           : s > CU_QF16_SHIFT_MAX ? CU_QF16_SHIFT_MAX
                                   : s;
}

/* 2^e as an fp32 number (e a normal exponent). */
__host__ __device__ __forceinline__ float cu_qf16_pow2(int e)
{
    return cu_q_float((uint32_t)(127 + e) << 23);
}

/* The warp's N x 4 words of bf16 query pairs, in place, as fp16 pairs of
 * the same values times 2^s (one s for the whole warp: its rows share
 * the scale the scores are scaled back by).  Returns 2^-s, the factor of
 * the fp32 scores.  Every lane of the warp calls it. */
template <int N>
__device__ __forceinline__ float cu_q_bf16_to_f16(uint32_t (&q)[N][4])
{
    uint32_t mx = 0u;
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint32_t lo = q[i][j] & 0x7fffu, hi = (q[i][j] >> 16) & 0x7fffu;
            mx = max(mx, lo < 0x7f80u ? lo : 0u); /* finite magnitudes only */
            mx = max(mx, hi < 0x7f80u ? hi : 0u);
        }
    mx = __reduce_max_sync(0xffffffffu, mx);
    const int s = cu_qf16_shift(mx);
    const float up = cu_qf16_pow2(s);
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            /* bf16 bits in the top half of an fp32 word are the same value;
             * the power of two is exact (fp32 keeps subnormals here). */
            const float lo = __uint_as_float(q[i][j] << 16) * up;
            const float hi = __uint_as_float(q[i][j] & 0xffff0000u) * up;
            q[i][j] = cu_pack2(lo, hi, cu_f16_tag());
        }
    return cu_qf16_pow2(-s);
}

#endif /* __CUDACC__ */

#endif /* MSA_CUDA_COMMON_Q_F16_CUH */
