/* Choice of the CPU kernel level: which levels this build compiled
 * (MSA_CPU_HAVE_* from CMakeLists.txt), which of them this CPU runs, and
 * the public queries about them. */
#include "cpu/cpu_kernels.h"

#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#define MSA_CPU_X86 1
#else
#define MSA_CPU_X86 0
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

extern const msa_cpu_kernels msa_cpu_kernels_portable;
#ifdef MSA_CPU_HAVE_AVX2
extern const msa_cpu_kernels msa_cpu_kernels_avx2;
#endif
#ifdef MSA_CPU_HAVE_AVX512
extern const msa_cpu_kernels msa_cpu_kernels_avx512;
#endif
#ifdef MSA_CPU_HAVE_AVX512_BF16
extern const msa_cpu_kernels msa_cpu_kernels_avx512bf16;
#endif
#ifdef MSA_CPU_HAVE_NEON
extern const msa_cpu_kernels msa_cpu_kernels_neon;
#endif
#ifdef MSA_CPU_HAVE_NEON_BF16
extern const msa_cpu_kernels msa_cpu_kernels_neonbf16;
#endif

const msa_cpu_kernels *msa_cpu_kernels_for(msa_cpu_isa isa)
{
    switch (isa) {
    case MSA_CPU_ISA_PORTABLE: return &msa_cpu_kernels_portable;
#ifdef MSA_CPU_HAVE_AVX2
    case MSA_CPU_ISA_AVX2: return &msa_cpu_kernels_avx2;
#endif
#ifdef MSA_CPU_HAVE_AVX512
    case MSA_CPU_ISA_AVX512: return &msa_cpu_kernels_avx512;
#endif
#ifdef MSA_CPU_HAVE_AVX512_BF16
    case MSA_CPU_ISA_AVX512_BF16: return &msa_cpu_kernels_avx512bf16;
#endif
#ifdef MSA_CPU_HAVE_NEON
    case MSA_CPU_ISA_NEON: return &msa_cpu_kernels_neon;
#endif
#ifdef MSA_CPU_HAVE_NEON_BF16
    case MSA_CPU_ISA_NEON_BF16: return &msa_cpu_kernels_neonbf16;
#endif
    default: return NULL;
    }
}

#if MSA_CPU_X86
/* XCR0: the register state the operating system saves on a context
 * switch.  A unit whose registers it does not save cannot be used even
 * when cpuid lists it. */
static uint64_t xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* The x86-64 levels this CPU and its operating system run. */
static int x86_runs(msa_cpu_isa isa)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    const int osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1,
              avx = (c >> 28) & 1;
    if (!osxsave || !avx)
        return 0;
    const uint64_t x = xcr0();
    if ((x & 0x6) != 0x6) /* XMM and YMM state */
        return 0;
    if (__get_cpuid_max(0, NULL) < 7)
        return 0;
    unsigned b7, c7, d7, a7;
    __cpuid_count(7, 0, a7, b7, c7, d7);
    const int avx2 = (b7 >> 5) & 1;
    if (isa == MSA_CPU_ISA_AVX2)
        return avx2 && fma && f16c;
    const int avx512 = ((b7 >> 16) & 1) /* F */ && ((b7 >> 17) & 1) /* DQ */ &&
                       ((b7 >> 30) & 1) /* BW */ && ((b7 >> 31) & 1) /* VL */ &&
                       (x & 0xe6) == 0xe6; /* opmask, ZMM0-15 upper halves, ZMM16-31 */
    if (isa == MSA_CPU_ISA_AVX512)
        return avx2 && fma && f16c && avx512;
    if (isa == MSA_CPU_ISA_AVX512_BF16) {
        unsigned a71, b71, c71, d71;
        __cpuid_count(7, 1, a71, b71, c71, d71);
        return avx2 && fma && f16c && avx512 && ((a71 >> 5) & 1);
    }
    return 0;
}
#endif

/* Whether the CPU runs a level (compiled in or not). */
static int cpu_runs(msa_cpu_isa isa)
{
    if (isa == MSA_CPU_ISA_PORTABLE)
        return 1;
#if MSA_CPU_X86
    return x86_runs(isa);
#elif defined(__aarch64__)
        /* Advanced SIMD is part of every Arm64 CPU that Linux runs on; the
     * auxiliary vector says so all the same (HWCAP_ASIMD).  The BF16
     * instructions (FEAT_BF16: BFDOT, BFMMLA, BFCVT) are optional from
     * Armv8.2 on: HWCAP2_BF16 says the CPU has them and the kernel lets
     * user code run them. */
#if defined(__linux__)
    const int asimd = (getauxval(AT_HWCAP) & (1ul << 1)) != 0;
    const int bf16 = (getauxval(AT_HWCAP2) & (1ul << 14)) != 0;
    if (isa == MSA_CPU_ISA_NEON)
        return asimd;
    return isa == MSA_CPU_ISA_NEON_BF16 && asimd && bf16;
#else
    return isa == MSA_CPU_ISA_NEON;
#endif
#else
    return 0;
#endif
}

int msa_cpu_isa_supported(msa_cpu_isa isa)
{
    return msa_cpu_kernels_for(isa) != NULL && cpu_runs(isa);
}

/* Levels from the best down. */
static const msa_cpu_isa isa_order[] = {
    MSA_CPU_ISA_AVX512_BF16, MSA_CPU_ISA_AVX512, MSA_CPU_ISA_AVX2,
    MSA_CPU_ISA_NEON_BF16,   MSA_CPU_ISA_NEON,   MSA_CPU_ISA_PORTABLE,
};

msa_cpu_isa msa_cpu_best_isa(void)
{
    for (size_t i = 0; i < sizeof isa_order / sizeof isa_order[0]; i++)
        if (msa_cpu_isa_supported(isa_order[i]))
            return isa_order[i];
    return MSA_CPU_ISA_PORTABLE;
}

const char *msa_cpu_isa_name(msa_cpu_isa isa)
{
    switch (isa) {
    case MSA_CPU_ISA_AUTO: return "auto";
    case MSA_CPU_ISA_PORTABLE: return "portable";
    case MSA_CPU_ISA_AVX2: return "avx2";
    case MSA_CPU_ISA_AVX512: return "avx512";
    case MSA_CPU_ISA_AVX512_BF16: return "avx512_bf16";
    case MSA_CPU_ISA_NEON: return "neon";
    case MSA_CPU_ISA_NEON_BF16: return "neon_bf16";
    }
    return "?";
}

msa_cpu_isa msa_context_cpu_isa(const msa_context *ctx)
{
    if (!ctx || ctx->backend != MSA_BACKEND_CPU || !ctx->backend_state)
        return MSA_CPU_ISA_AUTO;
    return msa_cpu_kernels_of(ctx)->isa;
}

const char *msa_context_cpu_kernel(const msa_context *ctx, const char *stage)
{
    if (!ctx || !stage || ctx->backend != MSA_BACKEND_CPU || !ctx->backend_state)
        return NULL;
    const msa_cpu_kernels *k = msa_cpu_kernels_of(ctx);
    if (strcmp(stage, "indexer") == 0)
        return k->indexer;
    if (strcmp(stage, "attention") == 0)
        return k->attention;
    if (strcmp(stage, "gather") == 0)
        return k->gather;
    return NULL;
}
