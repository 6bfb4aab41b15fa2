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
 *   B (shared, K-major): N rows of 128 bytes (64 16-bit k values) in the
 *     128-byte swizzle a tensor-map copy writes (arch/tma_sm90.cuh), 8-row groups
 *     1024 bytes apart; the k-step ks of a box starts 32 * ks bytes in.
 *   B (shared, MN-major, for a transposed product): K rows of 128 bytes
 *     (64 MN values) in the same swizzle, 8-row groups 1024 bytes apart,
 *     the next 64 MN values `lbo` bytes further.
 *   D (registers, fp32): thread holds, for each 8-column group j,
 *     d[4j + e] = (row 16w + lane/4, column 8j + 2(lane%4) + e) and
 *     d[4j + 2 + e] = the same column, row + 8 (as d[j][e], d[j][2 + e]).
 */
#ifndef MSA_CUDA_ARCH_WGMMA_SM90_CUH
#define MSA_CUDA_ARCH_WGMMA_SM90_CUH

#include "cuda/arch/mma_sm80.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CU_HAVE_WGMMA 1
#endif

#ifdef CU_HAVE_WGMMA

/* Descriptor of an operand in the 128-byte swizzle at shared address
 * `addr` (its swizzle atoms 1024-byte aligned, or offset by a k-step inside
 * the atom): start address, leading offset `lbo` (K-major: unused, 16;
 * MN-major: bytes between blocks of 64 MN elements), 8-row group stride
 * 1024 bytes, layout type 1 = 128-byte swizzle. */
__device__ __forceinline__ uint64_t cu_wgmma_desc(uint32_t addr, uint32_t lbo)
{
    return (uint64_t)((addr & 0x3ffffu) >> 4) | ((uint64_t)((lbo & 0x3ffffu) >> 4) << 16) |
           ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
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

/* Waits until at most one committed group of products is pending (the
 * older ones have ended). */
__device__ __forceinline__ void cu_wgmma_wait_one()
{
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}

/* Keeps the compiler from moving reads or writes of the accumulators across
 * the asynchronous product (the registers are its operands until the wait). */
template <int NJ>
__device__ __forceinline__ void cu_wgmma_hold(float (&d)[NJ][4])
{
#pragma unroll
    for (int j = 0; j < NJ; ++j)
        asm volatile("" : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])::"memory");
}

/* Accumulators d[j][e] (the D layout above: d[j][e] is d[4j + e]). */
#define CU_WG_D4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define CU_WG_W4(j) "=f"(d[j][0]), "=f"(d[j][1]), "=f"(d[j][2]), "=f"(d[j][3])
#define CU_WG_W32                                                                              \
    CU_WG_W4(0), CU_WG_W4(1), CU_WG_W4(2), CU_WG_W4(3), CU_WG_W4(4), CU_WG_W4(5), CU_WG_W4(6), \
        CU_WG_W4(7)
#define CU_WG_D32                                                                              \
    CU_WG_D4(0), CU_WG_D4(1), CU_WG_D4(2), CU_WG_D4(3), CU_WG_D4(4), CU_WG_D4(5), CU_WG_D4(6), \
        CU_WG_D4(7)
#define CU_WG_D64                                                                                \
    CU_WG_D32, CU_WG_D4(8), CU_WG_D4(9), CU_WG_D4(10), CU_WG_D4(11), CU_WG_D4(12), CU_WG_D4(13), \
        CU_WG_D4(14), CU_WG_D4(15)
#define CU_WG_REGS32                                                                              \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24," \
    "%25,%26,%27,%28,%29,%30,%31}"
#define CU_WG_REGS64                                                                               \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,"  \
    "%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"

/* The 64 x 64 x 16 product's instruction (operands: 32 accumulators, four
 * A registers, the B descriptor, the accumulate flag), shared by the
 * accumulating form and the first step, which differ only in how the
 * accumulators are bound (read and written, or written only). */
#define CU_WG_M64N64(TY)                                                      \
    "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"                            \
    " wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " CU_WG_REGS32 \
    ", {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"

/* The products for one 16-bit input type (TAG, its PTX name TY): the
 * instruction strings differ only in the type. */
#define CU_WGMMA_PRODUCTS(TAG, TY)                                                                      \
    /* d (64 x 64, fp32) = (accumulate ? d : 0) + A (64 x 16, registers) x                            \
     * B (64 x 16 at descriptor b, K-major). */ \
    __device__ __forceinline__ void cu_wgmma_m64n64k16(float(&d)[8][4], const uint32_t(&a)[4],          \
                                                       uint64_t b, int accumulate, TAG)                 \
    {                                                                                                   \
        asm volatile(CU_WG_M64N64(TY)                                                                   \
                     : CU_WG_D32                                                                        \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));            \
    }                                                                                                   \
    /* The same with d written only (the first step of a product, so the                              \
     * compiler does not clear d first). */ \
    __device__ __forceinline__ void cu_wgmma_m64n64k16_first(float(&d)[8][4],                           \
                                                             const uint32_t(&a)[4], uint64_t b,         \
                                                             TAG)                                       \
    {                                                                                                   \
        asm volatile(CU_WG_M64N64(TY)                                                                   \
                     : CU_WG_W32                                                                        \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(0));                     \
    }                                                                                                   \
    /* d (64 x 128, fp32) = (accumulate ? d : 0) + A (64 x 16, registers) x                           \
     * B (128 x 16 at descriptor b; TB 0: K-major, 1: MN-major). */ \
    template <int TB>                                                                                   \
    __device__ __forceinline__ void cu_wgmma_m64n128k16(float(&d)[16][4], const uint32_t(&a)[4],        \
                                                        uint64_t b, int accumulate, TAG)                \
    {                                                                                                   \
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"                                     \
                     " wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " CU_WG_REGS64         \
                     ", {%64,%65,%66,%67}, %68, p, 1, 1, %70;\n}\n"                                     \
                     : CU_WG_D64                                                                        \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate),             \
                       "n"(TB));                                                                        \
    }                                                                                                   \
    /* d (64 x 128, fp32) = (accumulate ? d : 0) + A (64 x 16 at descriptor a,                        \
     * K-major) x B (128 x 16 at descriptor b, K-major): both from shared. */ \
    __device__ __forceinline__ void cu_wgmma_m64n128k16_ss(float(&d)[16][4], uint64_t a,                \
                                                           uint64_t b, int accumulate, TAG)             \
    {                                                                                                   \
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"                                     \
                     " wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " CU_WG_REGS64         \
                     ", %64, %65, p, 1, 1, 0, 0;\n}\n"                                                  \
                     : CU_WG_D64                                                                        \
                     : "l"(a), "l"(b), "r"(accumulate));                                                \
    }

CU_WGMMA_PRODUCTS(cu_bf16_tag, "bf16")
CU_WGMMA_PRODUCTS(cu_f16_tag, "f16")
#undef CU_WGMMA_PRODUCTS

/* d (64 x 64, fp32) = (accumulate ? d : 0) + A (64 x 32 fp8_e4m3,
 * registers) x B (64 x 32 fp8_e4m3 at descriptor b, K-major; fp8 products
 * take no transposed operand).  The A fragment holds the same bytes of a
 * row as the 16-bit one: a0 row lane/4, k 4(lane%4) .. 4(lane%4) + 3
 * (low byte first); a1 row + 8; a2 k + 16; a3 both.  A k-step is 32
 * bytes of a B row, as for 16-bit operands.  The _first form writes d
 * only (the first step of a product). */
#define CU_WG_M64N64K32_E4M3()                                            \
    "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"                        \
    " wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " CU_WG_REGS32 \
    ", {%32,%33,%34,%35}, %36, p, 1, 1;\n}\n"
__device__ __forceinline__ void cu_wgmma_m64n64k32_e4m3(float (&d)[8][4], const uint32_t (&a)[4],
                                                        uint64_t b, int accumulate)
{
    asm volatile(CU_WG_M64N64K32_E4M3()
                 : CU_WG_D32
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}
__device__ __forceinline__ void cu_wgmma_m64n64k32_e4m3_first(float (&d)[8][4],
                                                              const uint32_t (&a)[4], uint64_t b)
{
    asm volatile(CU_WG_M64N64K32_E4M3()
                 : CU_WG_W32
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(0));
}
#undef CU_WG_M64N64K32_E4M3

#undef CU_WG_D4
#undef CU_WG_W4
#undef CU_WG_W32
#undef CU_WG_D32
#undef CU_WG_D64
#undef CU_WG_REGS32
#undef CU_WG_REGS64
#undef CU_WG_M64N64

#endif /* CU_HAVE_WGMMA */

#endif /* MSA_CUDA_ARCH_WGMMA_SM90_CUH */
