/*
 * Quantized cache formats of SPEC 8 on the device: each function mirrors
 * the one of src/core/quant.c with the same name (cu_ for msa_), so that
 * a row the CUDA backend writes or reads is the CPU backend's bit for bit.
 * The functions also compile for the host, where
 * tests/cuda/test_cuda_quant.cu checks them without a GPU; there the bit
 * casts go through memcpy.
 *
 * Every product, quotient and sum here is rounded once (nearest even) and
 * none is fused with another: the only sum, in the subnormal E4M3
 * encoding, adds 2^23 to an exact product, so a fused form would give the
 * same result anyway.  The functions give the core's results bit for bit;
 * where a form without branches is faster on a GPU (cu_f32_to_e4m3) they
 * compute them differently, and test_cuda_quant checks them against the
 * core's at every rounding boundary.
 */
#ifndef MSA_CUDA_COMMON_QUANT_CUH
#define MSA_CUDA_COMMON_QUANT_CUH

#include <stdint.h>
#include <string.h>

#include "msa/msa.h"

/* Elements per NVFP4 group (one E4M3 scale byte each), as MSA_NVFP4_GROUP. */
#define CU_NVFP4_GROUP 16

__host__ __device__ __forceinline__ uint32_t cu_q_bits(float x)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

__host__ __device__ __forceinline__ float cu_q_float(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

__host__ __device__ __forceinline__ float cu_q_mul(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

__host__ __device__ __forceinline__ float cu_q_div(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

/* ---- E4M3 (OCP e4m3fn: bias 7, no infinities, S.1111.111 is NaN) ------- */

__host__ __device__ __forceinline__ float cu_e4m3_to_f32(uint32_t code)
{
    const uint32_t sign = (code & 0x80u) << 24;
    const uint32_t exp = (code >> 3) & 0xfu, man = code & 7u;
    if (exp == 0xf && man == 7)
        return cu_q_float(sign | 0x7fc00000u);
    if (exp == 0) /* subnormal: man * 2^-9, exact in fp32 */
        return cu_q_float(sign | cu_q_bits(cu_q_mul((float)man, 1.0f / 512.0f)));
    return cu_q_float(sign | (exp + 120u) << 23 | man << 20);
}

__host__ __device__ __forceinline__ float cu_q_add(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

/* The same code as msa_f32_to_e4m3, computed for every case and chosen by
 * selects (no branch: the prologue quantizes whole rows, and a branch per
 * element diverges within a warp wherever a few elements are small). */
__host__ __device__ __forceinline__ uint8_t cu_f32_to_e4m3(float x)
{
    const uint32_t u = cu_q_bits(x);
    const uint32_t sign = (u >> 24) & 0x80u;
    const uint32_t a = u & 0x7fffffffu;
    /* Below 2^-6: units of 2^-9 (a * 512 < 8 is exact), ties to even: the
     * sum with 2^23 rounds to an integer (its unit is 1), nearest even. */
    const uint32_t sub =
        cu_q_bits(cu_q_add(cu_q_mul(cu_q_float(a), 512.0f), 8388608.0f)) - 0x4b000000u;
    /* Normal: three mantissa bits kept, ties to even; a carry is the next
     * code, and nothing below 448 rounds past it. */
    const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
    const uint32_t nrm = (r >> 20) - (120u << 3);
    uint32_t c = a < 0x3c800000u ? sub : nrm;
    /* 448 and above, infinities included: saturate. */
    c = a >= 0x43e00000u ? 0x7eu : c;
    c |= sign;
    return (uint8_t)(a > 0x7f800000u ? 0x7fu : c); /* NaN */
}

/* ---- E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives --------------- */

/* The low four bits of code: sign, two exponent bits (bias 1), one
 * mantissa bit; exponent 0 is the subnormal 0.5 * mantissa. */
__host__ __device__ __forceinline__ float cu_e2m1_to_f32(uint32_t code)
{
    const uint32_t e = (code >> 1) & 3u, m = code & 1u;
    const uint32_t mag = e ? ((e + 126u) << 23 | m << 22) : (m ? 0x3f000000u : 0u);
    return cu_q_float(mag | (code & 8u) << 28);
}

/* Nearest point, ties to the even code, saturating at 6; NaN gives 0. */
__host__ __device__ __forceinline__ uint8_t cu_f32_to_e2m1(float x)
{
    const uint32_t u = cu_q_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0;
    const float a = cu_q_float(u & 0x7fffffffu);
    uint8_t c;
    if (a <= 0.25f)
        c = 0;
    else if (a < 0.75f)
        c = 1;
    else if (a <= 1.25f)
        c = 2;
    else if (a < 1.75f)
        c = 3;
    else if (a <= 2.5f)
        c = 4;
    else if (a < 3.5f)
        c = 5;
    else if (a <= 5.0f)
        c = 6;
    else
        c = 7;
    return (uint8_t)(c | ((u >> 31) ? 8u : 0u));
}

/* ---- elements and groups ---------------------------------------------------- */

/* fp8 write and read: e4m3(x / scale), code * scale. */
__host__ __device__ __forceinline__ uint8_t cu_fp8_quantize(float x, float scale)
{
    return cu_f32_to_e4m3(cu_q_div(x, scale));
}

__host__ __device__ __forceinline__ float cu_fp8_dequantize(uint32_t code, float scale)
{
    return cu_q_mul(cu_e4m3_to_f32(code), scale);
}

/* One nvfp4 element: e2m1(code) * e4m3(group scale) * global, in that order. */
__host__ __device__ __forceinline__ float cu_nvfp4_dequantize(uint32_t code, uint32_t scale_byte,
                                                              float global)
{
    return cu_q_mul(cu_q_mul(cu_e2m1_to_f32(code), cu_e4m3_to_f32(scale_byte)), global);
}

/* One group of 16 (SPEC 8): scale = e4m3_nearest(min(amax / (6 * global),
 * 448)); a zero scale gives all-zero codes; a NaN anywhere gives the NaN
 * scale byte and all-zero codes; else each code is the E2M1 point nearest
 * x / (scale * global).  codes8: two codes a byte, low nibble the even
 * element. */
__host__ __device__ __forceinline__ void cu_nvfp4_quantize_group(uint8_t codes8[8],
                                                                 uint8_t *scale_byte,
                                                                 const float x[CU_NVFP4_GROUP],
                                                                 float global)
{
    float amax = 0.0f;
    int nan = 0;
    for (int e = 0; e < CU_NVFP4_GROUP; e++) {
        const float a = cu_q_float(cu_q_bits(x[e]) & 0x7fffffffu);
        if (cu_q_bits(a) > 0x7f800000u)
            nan = 1;
        else if (a > amax)
            amax = a;
    }
    float s = 0.0f;
    if (nan) {
        *scale_byte = 0x7f;
    } else {
        float want = cu_q_div(amax, cu_q_mul(6.0f, global));
        if (want > 448.0f)
            want = 448.0f;
        const uint8_t sb = cu_f32_to_e4m3(want);
        s = cu_e4m3_to_f32(sb);
        *scale_byte = sb;
    }
    if (s == 0.0f) { /* the NaN group too */
        for (int b = 0; b < CU_NVFP4_GROUP / 2; b++)
            codes8[b] = 0;
        return;
    }
    const float denom = cu_q_mul(s, global);
    for (int e = 0; e < CU_NVFP4_GROUP; e += 2)
        codes8[e / 2] = (uint8_t)(cu_f32_to_e2m1(cu_q_div(x[e], denom)) |
                                  cu_f32_to_e2m1(cu_q_div(x[e + 1], denom)) << 4);
}

/* ---- rows of a quantized plane ---------------------------------------------- */

/* Where one cache row lies.  at: its first element, as an element offset
 * of the plane's data, which for fp8 is the byte offset of its codes, and
 * for nvfp4 the byte offset of its code pairs (two elements a byte);
 * scales: the byte offset of its nvfp4 group scales (else unused). */
typedef struct cu_qrow {
    int64_t at, scales;
} cu_qrow;

/* The nvfp4 row of `slot`.  region: element offset of the row's (page,
 * head) region in the library layout (the row of slot 0), which nvfp4
 * planes always have.  A region of P rows of D elements is P * D * 9 / 16
 * bytes: codes first (row t at t * D / 2), then the group scales (row t at
 * P * D / 2 + t * D / 16). */
__host__ __device__ __forceinline__ cu_qrow cu_nvfp4_row(int64_t region, int32_t slot,
                                                         int32_t page_size, int32_t dim)
{
    const int64_t base = region / CU_NVFP4_GROUP * 9;
    cu_qrow r;
    r.at = base + (int64_t)slot * (dim / 2);
    r.scales = base + (int64_t)page_size * (dim / 2) + (int64_t)slot * (dim / CU_NVFP4_GROUP);
    return r;
}

/* Element d of a quantized row (fp8_e4m3 or nvfp4), as the CPU reads it. */
__host__ __device__ __forceinline__ float cu_qrow_load(const void *plane, int dtype, float scale,
                                                       cu_qrow row, int32_t d)
{
    const uint8_t *b = (const uint8_t *)plane;
    if (dtype == MSA_DTYPE_FP8_E4M3)
        return cu_fp8_dequantize(b[row.at + d], scale);
    const uint32_t pair = b[row.at + d / 2];
    return cu_nvfp4_dequantize((d & 1) ? pair >> 4 : pair & 0xfu,
                               b[row.scales + d / CU_NVFP4_GROUP], scale);
}

__host__ __device__ __forceinline__ int cu_is_quantized(int dtype)
{
    return dtype == MSA_DTYPE_FP8_E4M3 || dtype == MSA_DTYPE_NVFP4;
}

#endif /* MSA_CUDA_COMMON_QUANT_CUH */
