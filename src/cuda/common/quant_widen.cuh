/*
 * Quantized index-key codes widened to fp32 for the tensor-core indexer's
 * fragment loads: a few integer operations and one or two exact products
 * per element instead of cu_e4m3_to_f32's branches.  Each value is
 * exactly the one quant.cuh decodes (test_cuda_quant checks every code),
 * so packing it to bf16 or fp16 (cu_pack2) is exact too wherever the
 * value has a 16-bit form, which holds for every E4M3 value and every
 * E2M1 x E4M3 product (at most 7 significant bits, magnitudes from 2^-10
 * to 2688).  The functions compile for the host as well, where the test
 * checks them.
 */
#ifndef MSA_CUDA_COMMON_QUANT_WIDEN_CUH
#define MSA_CUDA_COMMON_QUANT_WIDEN_CUH

#include "cuda/common/quant.cuh"

/* 2^120 and 2^126 as fp32 bit patterns. */
#define CU_WIDEN_2P120 0x7b800000u
#define CU_WIDEN_2P126 0x7e800000u

/* The E4M3 code in byte K of w.  Its sign and its seven other bits go to
 * fp32's sign and to bits 20..26, where they read as the code's value
 * times 2^-120 (a normal code's exponent lands rebiased by 120 below its
 * own; a subnormal code lands as the fp32 subnormal of the same
 * mantissa), so one exact product by 2^120 gives the value.  The NaN
 * codes (S.1111.111) give 480 with their sign: the caller detects them
 * with cu_e4m3_nan_bytes. */
template <int K>
__host__ __device__ __forceinline__ float cu_e4m3_widen(uint32_t w)
{
    static_assert(K >= 0 && K < 4, "a byte of a 32-bit word");
    const int32_t top = (int32_t)(w << (24 - 8 * K)); /* the code in bits 24..31 */
    /* The arithmetic shift copies the sign into bits 27..31; the mask
     * keeps bit 31 and the code's low seven bits. */
    const uint32_t bits = (uint32_t)(top >> 4) & 0x87f00000u;
    return cu_q_mul(cu_q_float(bits), cu_q_float(CU_WIDEN_2P120));
}

/* Nonzero when a byte of w is an E4M3 NaN code: 0x7f in the low seven
 * bits is the one value that a +1 carries into the byte's top bit. */
__host__ __device__ __forceinline__ uint32_t cu_e4m3_nan_bytes(uint32_t w)
{
    return ((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
}

/* The E2M1 code in nibble J of w.  Its sign goes to fp32's sign and its
 * three other bits to bits 22..24, where they read as the code's value
 * times 2^-126 (exponent 0, the half of code 1, lands as an fp32
 * subnormal), so one exact product by 2^126 gives the value. */
template <int J>
__host__ __device__ __forceinline__ float cu_e2m1_widen(uint32_t w)
{
    static_assert(J >= 0 && J < 8, "a nibble of a 32-bit word");
    const int32_t top = (int32_t)(w << (28 - 4 * J)); /* the code in bits 28..31 */
    const uint32_t bits = (uint32_t)(top >> 6) & 0x81c00000u;
    return cu_q_mul(cu_q_float(bits), cu_q_float(CU_WIDEN_2P126));
}

/* One nvfp4 element without the layer scale: E2M1 code times the group's
 * E4M3 scale (scale: cu_e4m3_to_f32 of its byte, NaN for the NaN byte,
 * which makes the product NaN as the CPU's decode does). */
template <int J>
__host__ __device__ __forceinline__ float cu_nvfp4_widen(uint32_t w, float scale)
{
    return cu_q_mul(cu_e2m1_widen<J>(w), scale);
}

#endif /* MSA_CUDA_COMMON_QUANT_WIDEN_CUH */
