/*
 * Tensor-core and async-copy primitives (sm_80 instructions, also the
 * fast path on Hopper): mma.sync m16n8k16 with fp32 accumulation,
 * ldmatrix, cp.async with zero fill, and the shared-memory swizzle used by
 * every tile of 128 16-bit elements per row.
 */
#ifndef MSA_CUDA_ARCH_MMA_SM80_CUH
#define MSA_CUDA_ARCH_MMA_SM80_CUH

#include "cuda/common/common.cuh"

/* Tags selecting the 16-bit element type of the fast kernels. */
struct cu_bf16_tag {
};
struct cu_f16_tag {
};

__device__ __forceinline__ void cu_mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                            uint32_t a3, uint32_t b0, uint32_t b1, cu_bf16_tag)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cu_mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                            uint32_t a3, uint32_t b0, uint32_t b1, cu_f16_tag)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Two floats to a packed pair of the 16-bit type (round to nearest even). */
__device__ __forceinline__ uint32_t cu_pack2(float lo, float hi, cu_bf16_tag)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ uint32_t cu_pack2(float lo, float hi, cu_f16_tag)
{
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* A packed pair of the 16-bit type to two floats (exact). */
__device__ __forceinline__ float2 cu_unpack2(uint32_t v, cu_bf16_tag)
{
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&v));
}

__device__ __forceinline__ float2 cu_unpack2(uint32_t v, cu_f16_tag)
{
    return __half22float2(*reinterpret_cast<const __half2 *>(&v));
}

__device__ __forceinline__ uint32_t cu_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cu_ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                           uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

__device__ __forceinline__ void cu_ldsm_x4_trans(uint32_t addr, uint32_t &r0, uint32_t &r1,
                                                 uint32_t &r2, uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* 16-byte async copy global -> shared; src_bytes 0 fills zeros (the source
 * address must still be a valid pointer, it is not read). */
__device__ __forceinline__ void cu_cp_async16(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}

/* 8-byte async copy global -> shared (zero fill as cu_cp_async16): an
 * nvfp4 row's group scales, 8-byte aligned in the plane. */
__device__ __forceinline__ void cu_cp_async8(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}

__device__ __forceinline__ void cu_cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N>
__device__ __forceinline__ void cu_cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Rows of 128 16-bit elements = 16 chunks of 16 bytes.  Chunk c of row r
 * lives at chunk c ^ (r & 7): eight consecutive rows read at one logical
 * chunk (ldmatrix) then hit eight different bank groups. */
__device__ __forceinline__ uint32_t cu_swz(int row, int chunk)
{
    return (uint32_t)(row * 256 + ((chunk ^ (row & 7)) << 4));
}

#endif /* MSA_CUDA_ARCH_MMA_SM80_CUH */
