/*
 * Warpgroup matrix products of sm_90a (wgmma): four warps issue one
 * asynchronous 64 x N x 16 product on the tensor cores, the B operand read
 * straight from shared memory through a matrix descriptor, the A operand
 * from registers.  The instructions exist on sm_90a only (not in the
 * portable compute_90 PTX, not on later chips): code using them is compiled
 * under CU_HAVE_WGMMA and launched only on compute capability 9.x.
 *
 * Operand layouts used here:
 *   A (registers): warp w of the group holds rows 16w .. 16w + 15 in the
 *     m16n8k16 A-fragment layout (a0: row lane/4, k 2(lane%4) + {0,1};
 *     a1: row + 8; a2: k + 8; a3: both).
 *   B (shared): N rows of 128 bytes (64 16-bit k values) in the 128-byte
 *     swizzle a tensor-map copy writes (cu_tma.cuh), 8-row groups 1024
 *     bytes apart, K-major; the k-step ks of a box starts 32 * ks bytes in.
 *   D (registers, fp32): thread holds, for each 8-column group j,
 *     d[4j + e] = (row 16w + lane/4, column 8j + 2(lane%4) + e) and
 *     d[4j + 2 + e] = the same column, row + 8.
 */
#ifndef MSA_CU_WGMMA_CUH
#define MSA_CU_WGMMA_CUH

#include "cu_mma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CU_HAVE_WGMMA 1
#endif

#ifdef CU_HAVE_WGMMA

/* Descriptor of a K-major, 128-byte-swizzled operand at shared address
 * `addr` (its swizzle atom 1024-byte aligned, or offset by a k-step inside
 * the atom): start address, leading offset (unused with this swizzle: 1),
 * 8-row group stride 1024 bytes, layout type 1 = 128-byte swizzle. */
__device__ __forceinline__ uint64_t cu_wgmma_desc_sw128(uint32_t addr)
{
    return (uint64_t)((addr & 0x3ffffu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

__device__ __forceinline__ void cu_wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void cu_wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void cu_wgmma_wait_all()
{
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

/* Keeps the compiler from moving reads or writes of the accumulators across
 * the asynchronous product (the registers are its operands until the wait). */
__device__ __forceinline__ void cu_wgmma_hold(float (&d)[64])
{
#pragma unroll
    for (int i = 0; i < 64; ++i)
        asm volatile("" : "+f"(d[i])::"memory");
}

#define CU_WG_D8(i)                                                                      \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define CU_WG_D64 \
    CU_WG_D8(0), CU_WG_D8(8), CU_WG_D8(16), CU_WG_D8(24), CU_WG_D8(32), CU_WG_D8(40), CU_WG_D8(48), CU_WG_D8(56)
#define CU_WG_REGS64                                                                               \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,"  \
    "%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"

/* d (64 x 128, fp32) = (accumulate ? d : 0) + A (64 x 16, registers) x
 * B (128 x 16 at descriptor b, K-major). */
__device__ __forceinline__ void cu_wgmma_m64n128k16(float (&d)[64], const uint32_t (&a)[4], uint64_t b,
                                                    int accumulate, cu_bf16_tag)
{
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " CU_WG_REGS64
                 ", {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
                 : CU_WG_D64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

__device__ __forceinline__ void cu_wgmma_m64n128k16(float (&d)[64], const uint32_t (&a)[4], uint64_t b,
                                                    int accumulate, cu_f16_tag)
{
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " CU_WG_REGS64
                 ", {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
                 : CU_WG_D64
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

#undef CU_WG_D8
#undef CU_WG_D64
#undef CU_WG_REGS64

#endif /* CU_HAVE_WGMMA */

#endif /* MSA_CU_WGMMA_CUH */
