/*
 * Shared definitions of the CUDA backend: the core's structures (with C
 * linkage), error helpers, element loads/stores by run-time dtype and small
 * warp utilities.  Every .cu file of the backend includes this first.
 */
#ifndef MSA_CUDA_COMMON_COMMON_CUH
#define MSA_CUDA_COMMON_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

extern "C" {
#include "core/internal.h"
}
/* The scheduler's constants (CU_DEC_MAX_Q, CU_ROWS_PER_ITEM, CU_TILE_KEYS)
 * and the metadata the kernels read. */
#include "cuda/schedule.h"

/* Largest head dims the SIMT kernels keep in registers (32 lanes x 16). */
#define CU_SIMT_MAX_DIM 512
/* Floats per partial-result row: D values, the LSE, padding to 16 bytes. */
#define CU_PART_STRIDE(d) ((d) + 4)

/* Records a CUDA error on the context and returns MSA_ERR_BACKEND. */
#define CU_TRY(ctx, call)                                                          \
    do {                                                                           \
        cudaError_t cu_err_ = (call);                                              \
        if (cu_err_ != cudaSuccess) {                                              \
            return msa_set_error((ctx), MSA_ERR_BACKEND, "%s: %s (%s:%d)", #call,  \
                                 cudaGetErrorString(cu_err_), __FILE__, __LINE__); \
        }                                                                          \
    } while (0)

/* ---- element access by run-time dtype (fp32 / bf16 / fp16) ------------ */

__device__ __forceinline__ float cu_bf16_bits_to_f32(uint16_t u)
{
    return __uint_as_float((uint32_t)u << 16);
}

/* Round to nearest even; NaN stays NaN (quiet).  Same bits as the core's
 * msa_f32_to_bf16, so a cache written here equals one written on the CPU. */
__device__ __forceinline__ uint16_t cu_f32_to_bf16_bits(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* A 16-bit element's bits (bf16, or fp16 for any other dtype) as fp32. */
__device__ __forceinline__ float cu_bits16_to_f32(uint16_t u, int dtype)
{
    if (dtype == MSA_DTYPE_BF16)
        return cu_bf16_bits_to_f32(u);
    return __half2float(__ushort_as_half(u));
}

__device__ __forceinline__ float cu_load(const void *base, int dtype, int64_t i)
{
    if (dtype == MSA_DTYPE_FP32)
        return ((const float *)base)[i];
    return cu_bits16_to_f32(((const uint16_t *)base)[i], dtype);
}

__device__ __forceinline__ void cu_store(void *base, int dtype, int64_t i, float v)
{
    if (dtype == MSA_DTYPE_FP32) {
        ((float *)base)[i] = v;
    } else if (dtype == MSA_DTYPE_BF16) {
        ((uint16_t *)base)[i] = cu_f32_to_bf16_bits(v);
    } else {
        ((uint16_t *)base)[i] = __half_as_ushort(__float2half_rn(v));
    }
}

/* ---- warp helpers ------------------------------------------------------- */

/* Asks L2 for the 128-byte line holding p (no register result, no wait). */
__device__ __forceinline__ void cu_prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ float cu_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float cu_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ int cu_warp_min_int(int v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Max that propagates NaN: a NaN key poisons its block (SPEC 4, as the
 * oracle has it), where fmaxf would drop it. */
__device__ __forceinline__ float cu_nanmax(float a, float b)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    /* One instruction: max.NaN gives the canonical NaN when either operand
     * is NaN and is max otherwise, as the expression below. */
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return (isnan(a) || isnan(b)) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
#endif
}

/* Log-sum-exp state (m, l): the largest term and sum of exp(x - m).  NaN
 * poisons the state, an infinite m decides it alone, and -inf maxima never
 * meet in exp(-inf - -inf). */
__device__ __forceinline__ void cu_lse_merge(float &m, float &l, float m2, float l2)
{
    if (isnan(m) || isnan(m2)) {
        m = __int_as_float(0x7fc00000);
        return;
    }
    if (m2 == -INFINITY)
        return;
    if (m == -INFINITY || m2 == INFINITY) {
        m = m2;
        l = l2;
        return;
    }
    if (m == INFINITY)
        return;
    const float mx = fmaxf(m, m2);
    l = l * expf(m - mx) + l2 * expf(m2 - mx);
    m = mx;
}

/* Block score from a log-sum-exp state: ln(sum exp(x)). */
__device__ __forceinline__ float cu_lse_value(float m, float l)
{
    if (isnan(m) || isinf(m))
        return m;
    return m + logf(l);
}

/* Bits of the request's tokens (0..q_len-1) whose causal window contains
 * absolute position `pos`: token i sits at base + i and sees pos <= base + i. */
__device__ __forceinline__ uint32_t cu_causal_bits(int32_t pos, int32_t base, int32_t q_len)
{
    uint32_t all = q_len >= 32 ? 0xffffffffu : ((1u << q_len) - 1u);
    int32_t first = pos - base; /* lowest token index that sees pos */
    if (first <= 0)
        return all;
    if (first >= q_len)
        return 0u;
    return all & ~((1u << first) - 1u);
}

#endif /* MSA_CUDA_COMMON_COMMON_CUH */
