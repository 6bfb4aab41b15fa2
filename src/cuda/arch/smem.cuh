/*
 * Shared memory by 32-bit shared addresses: loads, stores and a reduction
 * that compile to their shared-memory instructions whatever the compiler
 * knows of the pointer they came from.
 */
#ifndef MSA_CUDA_ARCH_SMEM_CUH
#define MSA_CUDA_ARCH_SMEM_CUH

#include <stdint.h>

#ifdef __CUDACC__

/* The Hopper attention reaches shared memory through pointers the
 * compiler cannot place (its layout is passed by reference), so plain
 * accesses compiled to generic loads, stores and GPU-scope atomics: in
 * its producer's union they took 4 µs of the first unit's start on the
 * H200, and the consumers' per-tile read of a slot's meta was a generic
 * load. */
__device__ __forceinline__ uint32_t cu_lds32(uint32_t a)
{
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(a) : "memory");
    return v;
}
__device__ __forceinline__ void cu_sts32(uint32_t a, uint32_t v)
{
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
}
__device__ __forceinline__ void cu_sts128(uint32_t a, uint4 v)
{
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}
__device__ __forceinline__ void cu_reds_or32(uint32_t a, uint32_t v)
{
    asm volatile("red.shared.or.b32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
}
__device__ __forceinline__ uint2 cu_lds64(uint32_t a)
{
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(a) : "memory");
    return v;
}
__device__ __forceinline__ uint4 cu_lds128(uint32_t a)
{
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(a)
                 : "memory");
    return v;
}

#endif /* __CUDACC__ */

#endif /* MSA_CUDA_ARCH_SMEM_CUH */
