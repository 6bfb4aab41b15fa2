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

/* The row formats of a cache plane as the decode kernels read it: 16-bit
 * values, fp8_e4m3 codes, nvfp4 codes with their group scales.  Kernels
 * that widen codes take one as their template parameter KF. */
enum { CU_PLANE_16 = 0, CU_PLANE_FP8 = 1, CU_PLANE_NVFP4 = 2 };

/* The row format of a plane of dtype d (an msa_dtype; 16-bit for bf16
 * and fp16). */
static inline int cu_plane_format(int32_t d)
{
    return d == MSA_DTYPE_FP8_E4M3 ? CU_PLANE_FP8
           : d == MSA_DTYPE_NVFP4  ? CU_PLANE_NVFP4
                                   : CU_PLANE_16;
}

/* LAUNCH(TAG, KF) for the activations' 16-bit tag (bf16, else fp16) and
 * the plane's row format: one of a kernel's six variants. */
#define CU_LAUNCH_BY_FORMAT(act_dtype, plane_dtype, LAUNCH) \
    do {                                                    \
        const int kf_ = cu_plane_format(plane_dtype);       \
        if ((act_dtype) == MSA_DTYPE_BF16) {                \
            if (kf_ == CU_PLANE_FP8)                        \
                LAUNCH(cu_bf16_tag, CU_PLANE_FP8);          \
            else if (kf_ == CU_PLANE_NVFP4)                 \
                LAUNCH(cu_bf16_tag, CU_PLANE_NVFP4);        \
            else                                            \
                LAUNCH(cu_bf16_tag, CU_PLANE_16);           \
        } else {                                            \
            if (kf_ == CU_PLANE_FP8)                        \
                LAUNCH(cu_f16_tag, CU_PLANE_FP8);           \
            else if (kf_ == CU_PLANE_NVFP4)                 \
                LAUNCH(cu_f16_tag, CU_PLANE_NVFP4);         \
            else                                            \
                LAUNCH(cu_f16_tag, CU_PLANE_16);            \
        }                                                   \
    } while (0)

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

/* ---- pairs of E4M3 codes straight to the 16-bit types ------------------
 * The decode attention widens whole tiles of K and V codes to bf16 or
 * fp16 in shared memory; two codes (bytes 2 P and 2 P + 1 of w) become
 * one packed pair.  fp16 takes the hardware conversion on sm_89 and
 * later (cu_e4m3_widen2); bf16, and fp16 on older chips, four
 * operations: a byte permute puts each code in the top byte of its half,
 * a shift and a mask move its seven low bits under the 16-bit type's
 * exponent field (the sign stays in the top bit),
 * and one exact product of the pair scales them.  fp16 (5 exponent bits,
 * bias 15): the code's bits land at 7..13, reading as its value times
 * 2^-8; bf16 (8 exponent bits, bias 127): at 4..10, its value times
 * 2^-120.  A subnormal code lands as the 16-bit subnormal of the same
 * mantissa, so the same product serves it.  The NaN codes give 480 with
 * their sign, as cu_e4m3_widen; cu_e4m3_nan_mask2 marks them. */
#define CU_WIDEN_F16_2P8 0x5c005c00u    /* 2^8 in both fp16 halves */
#define CU_WIDEN_BF16_2P120 0x7b807b80u /* 2^120 in both bf16 halves */
#define CU_WIDEN_NEG_ZERO2 0x80008000u  /* -0 in both halves of either type */

/* Codes 2 P and 2 P + 1 of w in the top bytes of the low and high halves. */
template <int P>
__host__ __device__ __forceinline__ uint32_t cu_e4m3_pair_top(uint32_t w)
{
    static_assert(P == 0 || P == 1, "a pair of bytes of a 32-bit word");
    const uint32_t lo = (w >> (16 * P)) & 0xffu, hi = (w >> (16 * P + 8)) & 0xffu;
    return (lo << 8) | (hi << 24);
}

/* The pair's bits before the product (bf16: BF16 = 1), exposed for the
 * host test: signs kept, seven bits shifted under the exponent. */
template <int P, int BF16>
__host__ __device__ __forceinline__ uint32_t cu_e4m3_pair_bits(uint32_t w)
{
    const uint32_t t = cu_e4m3_pair_top<P>(w);
    return BF16 ? (t & 0x80008000u) | ((t >> 4) & 0x07f007f0u)
                : (t & 0x80008000u) | ((t >> 1) & 0x3f803f80u);
}

#ifdef __CUDACC__
#include "cuda/arch/mma_sm80.cuh"

/* Bytes 2 P and 2 P + 1 of w as a packed pair of the 16-bit type (the
 * low half from byte 2 P).  fp16: the conversion instruction of sm_89
 * and later (one operation a pair, NaN codes to NaN; exact, as every
 * E4M3 value is an fp16 value).  bf16 has none: the product is
 * fma(x, 2^120, -0), exact, and -0 keeps the sign of a zero code (the
 * fma keeps subnormal inputs: it is not the .ftz form); its NaN codes
 * give 480 (cu_e4m3_nan_mask2 marks them). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define CU_E4M3_CVT 1
#else
#define CU_E4M3_CVT 0
#endif

template <int P>
__device__ __forceinline__ uint32_t cu_e4m3_widen2(uint32_t w, cu_f16_tag)
{
    uint32_t x;
#if CU_E4M3_CVT
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(x) : "h"((unsigned short)(w >> (16 * P))));
#else
    /* Older chips: the bits under fp16's exponent (7..13: the value times
     * 2^-8), then the exact product by 2^8. */
    const uint32_t t = __byte_perm(w, 0u, P ? 0x3424 : 0x1404);
    const uint32_t b = (t & 0x80008000u) | ((t >> 1) & 0x3f803f80u);
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n"
        : "=r"(x)
        : "r"(b), "r"(CU_WIDEN_F16_2P8), "r"(CU_WIDEN_NEG_ZERO2));
#endif
    return x;
}

template <int P>
__device__ __forceinline__ uint32_t cu_e4m3_widen2(uint32_t w, cu_bf16_tag)
{
    const uint32_t t = __byte_perm(w, 0u, P ? 0x3424 : 0x1404);
    const uint32_t b = (t & 0x80008000u) | ((t >> 4) & 0x07f007f0u);
    uint32_t x;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n"
        : "=r"(x)
        : "r"(b), "r"(CU_WIDEN_BF16_2P120), "r"(CU_WIDEN_NEG_ZERO2));
    return x;
}

/* Whether cu_e4m3_widen2 of the type already makes NaN codes NaN (no
 * mask needed). */
__device__ __forceinline__ constexpr bool cu_e4m3_widen2_nan(cu_f16_tag)
{
    return CU_E4M3_CVT != 0;
}
__device__ __forceinline__ constexpr bool cu_e4m3_widen2_nan(cu_bf16_tag)
{
    return false;
}

/* All ones in each half of pair P whose code is a NaN code, from n =
 * cu_e4m3_nan_bytes(w): or-ed into the widened pair it gives 0xffff,
 * a NaN in bf16 and in fp16. */
template <int P>
__device__ __forceinline__ uint32_t cu_e4m3_nan_mask2(uint32_t n)
{
    /* prmt's selector nibble 8 + i copies byte i's top bit into a whole
     * byte (__byte_perm reads only the low three bits of a nibble). */
    uint32_t m;
    asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(m) : "r"(n), "n"(P ? 0xbbaa : 0x9988));
    return m;
}
/* One 16-byte chunk of codes (16 dims) as two 16-byte chunks of the
 * 16-bit type: lo holds the first 8 dims, hi the other 8. */
template <typename Tag>
__device__ __forceinline__ void cu_fp8_chunk_widen(uint4 c, uint4 &lo, uint4 &hi)
{
    lo.x = cu_e4m3_widen2<0>(c.x, Tag());
    lo.y = cu_e4m3_widen2<1>(c.x, Tag());
    lo.z = cu_e4m3_widen2<0>(c.y, Tag());
    lo.w = cu_e4m3_widen2<1>(c.y, Tag());
    hi.x = cu_e4m3_widen2<0>(c.z, Tag());
    hi.y = cu_e4m3_widen2<1>(c.z, Tag());
    hi.z = cu_e4m3_widen2<0>(c.w, Tag());
    hi.w = cu_e4m3_widen2<1>(c.w, Tag());
    if (cu_e4m3_widen2_nan(Tag())) /* fp16: NaN codes converted to NaN */
        return;
    const uint32_t nx = cu_e4m3_nan_bytes(c.x), ny = cu_e4m3_nan_bytes(c.y);
    const uint32_t nz = cu_e4m3_nan_bytes(c.z), nw = cu_e4m3_nan_bytes(c.w);
    /* NaN codes are rare: the masks are built only for a chunk that has
     * one (a branch around them, not their cost on every chunk). */
    if ((nx | ny | nz | nw) != 0u) {
        lo.x |= cu_e4m3_nan_mask2<0>(nx);
        lo.y |= cu_e4m3_nan_mask2<1>(nx);
        lo.z |= cu_e4m3_nan_mask2<0>(ny);
        lo.w |= cu_e4m3_nan_mask2<1>(ny);
        hi.x |= cu_e4m3_nan_mask2<0>(nz);
        hi.y |= cu_e4m3_nan_mask2<1>(nz);
        hi.z |= cu_e4m3_nan_mask2<0>(nw);
        hi.w |= cu_e4m3_nan_mask2<1>(nw);
    }
}

/* Eight E2M1 codes of w (code j in nibble j) times their group scale s
 * (cu_e4m3_to_f32 of its byte), packed as a 16-byte chunk of the 16-bit
 * type, element j from code j. */
template <typename Tag>
__device__ __forceinline__ uint4 cu_nvfp4_widen8(uint32_t w, float s)
{
    uint4 r;
    r.x = cu_pack2(cu_nvfp4_widen<0>(w, s), cu_nvfp4_widen<1>(w, s), Tag());
    r.y = cu_pack2(cu_nvfp4_widen<2>(w, s), cu_nvfp4_widen<3>(w, s), Tag());
    r.z = cu_pack2(cu_nvfp4_widen<4>(w, s), cu_nvfp4_widen<5>(w, s), Tag());
    r.w = cu_pack2(cu_nvfp4_widen<6>(w, s), cu_nvfp4_widen<7>(w, s), Tag());
    return r;
}

/* A 16-byte chunk of nvfp4 codes (32 values: groups A and B of 16, code
 * j of word k in nibble j) times the groups' scales (g: scale byte of A
 * in bits 0..7, of B in 8..15), as four 16-byte chunks of the 16-bit
 * type: out[k] from word k (words 0 and 1 are group A). */
template <typename Tag>
__device__ __forceinline__ void cu_nvfp4_chunk_widen(uint4 p, uint32_t g, uint4 (&out)[4])
{
    const float s0 = cu_e4m3_to_f32(g & 0xffu), s1 = cu_e4m3_to_f32((g >> 8) & 0xffu);
    out[0] = cu_nvfp4_widen8<Tag>(p.x, s0);
    out[1] = cu_nvfp4_widen8<Tag>(p.y, s0);
    out[2] = cu_nvfp4_widen8<Tag>(p.z, s1);
    out[3] = cu_nvfp4_widen8<Tag>(p.w, s1);
}

/* fp16, in fp16 arithmetic: a byte permute looks the
 * eight codes' magnitudes up in a table of their fp16 forms (0, 0.5, 1,
 * 1.5, 2, 3, 4, 6: only the high byte is nonzero), two more put the
 * codes' signs on the table's bytes, two spread each pair into the high
 * bytes of a packed pair, and one exact fp16 product a pair applies the
 * group's scale (converted from E4M3 by the conversion instruction of
 * sm_89 and later, exactly: every E4M3 value is an fp16 value; every
 * code times scale, 2^-10 to 2688 with at most six significant bits, is
 * an fp16 value, and a NaN scale makes its group NaN as in fp32).  About
 * two operations a code where the fp32 path takes five. */
__device__ __forceinline__ uint4 cu_nvfp4_widen8_f16(uint32_t w, uint32_t s2)
{
    const uint32_t m = w & 0x77777777u; /* the magnitudes' table indices */
    /* Table bytes 0..7: fp16 high bytes of the E2M1 magnitudes. */
    uint32_t a = __byte_perm(0x3e3c3800u, 0x46444240u, m);       /* codes 0-3 */
    uint32_t b = __byte_perm(0x3e3c3800u, 0x46444240u, m >> 16); /* codes 4-7 */
    /* Code j's sign is bit 4 j + 3 of w: the top bit of a byte of w << 4
     * (even j) or of w (odd j); gathered into byte j's top bit. */
    const uint32_t e = w << 4;
    a |= __byte_perm(e, w, 0x5140) & 0x80808080u;
    b |= __byte_perm(e, w, 0x7362) & 0x80808080u;
    uint4 r;
    r.x = __byte_perm(a, 0u, 0x1404); /* codes 0, 1 in the halves' high bytes */
    r.y = __byte_perm(a, 0u, 0x3424);
    r.z = __byte_perm(b, 0u, 0x1404);
    r.w = __byte_perm(b, 0u, 0x3424);
    asm("mul.rn.f16x2 %0, %0, %1;\n" : "+r"(r.x) : "r"(s2));
    asm("mul.rn.f16x2 %0, %0, %1;\n" : "+r"(r.y) : "r"(s2));
    asm("mul.rn.f16x2 %0, %0, %1;\n" : "+r"(r.z) : "r"(s2));
    asm("mul.rn.f16x2 %0, %0, %1;\n" : "+r"(r.w) : "r"(s2));
    return r;
}

template <>
__device__ __forceinline__ void cu_nvfp4_chunk_widen<cu_f16_tag>(uint4 p, uint32_t g,
                                                                 uint4 (&out)[4])
{
    uint32_t s; /* the two scales as an fp16 pair, A's in the low half */
#if CU_E4M3_CVT
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(s) : "h"((unsigned short)g));
#else
    s = cu_pack2(cu_e4m3_to_f32(g & 0xffu), cu_e4m3_to_f32((g >> 8) & 0xffu), cu_f16_tag());
#endif
    const uint32_t sa = __byte_perm(s, 0u, 0x1010), sb = __byte_perm(s, 0u, 0x3232);
    out[0] = cu_nvfp4_widen8_f16(p.x, sa);
    out[1] = cu_nvfp4_widen8_f16(p.y, sa);
    out[2] = cu_nvfp4_widen8_f16(p.z, sb);
    out[3] = cu_nvfp4_widen8_f16(p.w, sb);
}
#endif /* __CUDACC__ */

#endif /* MSA_CUDA_COMMON_QUANT_WIDEN_CUH */
