/* The fp32 multiply-add ceiling (and the bf16 dot-product one of
 * AVX512-BF16): every thread runs FMAPEAK_CHAINS
 * independent multiply-add chains on registers, enough to cover the
 * latency of two FMA pipes (4 cycles x 2 pipes = 8 chains in flight), so
 * the loop runs at the throughput the CPU offers.  x = x * m + c with m
 * just below 1 converges to c / (1 - m): no overflow, no subnormals. */
#include "fmapeak.h"

#include <pthread.h>
#include <stdint.h>

#include "cli.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FMAPEAK_X86 1
#else
#define FMAPEAK_X86 0
#endif

#define FMAPEAK_CHAINS 12

typedef struct fma_job {
    int kind; /* 0: 4-lane mul + add, 1: AVX2 FMA, 2: AVX-512 FMA, 3: vdpbf16ps */
    int64_t iters;
    float sink;
} fma_job;

#if FMAPEAK_X86
__attribute__((target("avx2,fma"))) static float run_avx2(int64_t iters)
{
    __m256 x[FMAPEAK_CHAINS];
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-3f);
    for (int k = 0; k < FMAPEAK_CHAINS; k++)
        x[k] = _mm256_set1_ps((float)k);
    for (int64_t i = 0; i < iters; i++)
        for (int k = 0; k < FMAPEAK_CHAINS; k++)
            x[k] = _mm256_fmadd_ps(x[k], m, c);
    __m256 s = x[0];
    for (int k = 1; k < FMAPEAK_CHAINS; k++)
        s = _mm256_add_ps(s, x[k]);
    return _mm256_cvtss_f32(s);
}

__attribute__((target("avx512f"))) static float run_avx512(int64_t iters)
{
    __m512 x[FMAPEAK_CHAINS];
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-3f);
    for (int k = 0; k < FMAPEAK_CHAINS; k++)
        x[k] = _mm512_set1_ps((float)k);
    for (int64_t i = 0; i < iters; i++)
        for (int k = 0; k < FMAPEAK_CHAINS; k++)
            x[k] = _mm512_fmadd_ps(x[k], m, c);
    __m512 s = x[0];
    for (int k = 1; k < FMAPEAK_CHAINS; k++)
        s = _mm512_add_ps(s, x[k]);
    return _mm512_reduce_add_ps(s);
}

/* vdpbf16ps chains: each instruction adds two bf16 products per lane (64
 * FLOPs on 16 lanes).  The products are constant and small (2^-20 per
 * pair), so the sums stay normal and finite for any run length here. */
__attribute__((target("avx512f,avx512bf16"))) static float run_dpbf16(int64_t iters)
{
    __m512 x[FMAPEAK_CHAINS];
    /* bf16 pairs 2^-10 (0x3a80) times 2^-10 */
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3a803a80);
    for (int k = 0; k < FMAPEAK_CHAINS; k++)
        x[k] = _mm512_set1_ps((float)k);
    for (int64_t i = 0; i < iters; i++)
        for (int k = 0; k < FMAPEAK_CHAINS; k++)
            x[k] = _mm512_dpbf16_ps(x[k], a, a);
    __m512 s = x[0];
    for (int k = 1; k < FMAPEAK_CHAINS; k++)
        s = _mm512_add_ps(s, x[k]);
    return _mm512_reduce_add_ps(s);
}
#endif

/* Four lanes as a multiply and an add (no fused instruction assumed). */
static float run_plain(int64_t iters)
{
    typedef float v4 __attribute__((vector_size(16)));
    v4 x[FMAPEAK_CHAINS];
    const float m = 0.999999f, c = 1e-3f;
    for (int k = 0; k < FMAPEAK_CHAINS; k++)
        x[k] = (v4){(float)k, (float)k, (float)k, (float)k};
    for (int64_t i = 0; i < iters; i++)
        for (int k = 0; k < FMAPEAK_CHAINS; k++)
            x[k] = x[k] * m + c;
    float s = 0.0f;
    for (int k = 0; k < FMAPEAK_CHAINS; k++)
        s += x[k][0];
    return s;
}

static void *fma_thread(void *arg)
{
    fma_job *j = arg;
#if FMAPEAK_X86
    if (j->kind == 3) {
        j->sink = run_dpbf16(j->iters);
        return NULL;
    }
    if (j->kind == 2) {
        j->sink = run_avx512(j->iters);
        return NULL;
    }
    if (j->kind == 1) {
        j->sink = run_avx2(j->iters);
        return NULL;
    }
#endif
    j->sink = run_plain(j->iters);
    return NULL;
}

/* GFLOP/s of `threads` threads running `kind` (fma_job), `flops_per_op`
 * FLOPs per instruction: the best of three runs of about 0.1 s. */
static double probe(int threads, int kind, double flops_per_op)
{
    if (threads < 1 || threads > 1024)
        return 0.0;
    fma_job jobs[1024];
    pthread_t tids[1024];
    /* About 0.1 s at 3 GHz and one FMA per cycle per chain pair. */
    const int64_t iters = 25 * 1000 * 1000;
    double best = 0.0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = cli_now();
        int started = 0;
        for (int t = 0; t < threads; t++) {
            jobs[t] = (fma_job){kind, iters, 0.0f};
            if (pthread_create(&tids[t], NULL, fma_thread, &jobs[t]) != 0)
                break;
            started++;
        }
        for (int t = 0; t < started; t++)
            pthread_join(tids[t], NULL);
        double dt = cli_now() - t0;
        if (started < threads || !(dt > 0))
            return 0.0;
        double flops = (double)threads * (double)iters * FMAPEAK_CHAINS * flops_per_op;
        if (flops / dt * 1e-9 > best)
            best = flops / dt * 1e-9;
    }
    return best;
}

double fmapeak_gflops(int threads, msa_cpu_isa isa, const char **what)
{
    int kind = 0, lanes = 4;
    *what = "4-lane multiply and add";
#if FMAPEAK_X86
    if ((isa == MSA_CPU_ISA_AVX512 || isa == MSA_CPU_ISA_AVX512_BF16) &&
        __builtin_cpu_supports("avx512f")) {
        kind = 2;
        lanes = 16;
        *what = "AVX-512 FMA";
    } else if (isa == MSA_CPU_ISA_AVX2 && __builtin_cpu_supports("avx2") &&
               __builtin_cpu_supports("fma")) {
        kind = 1;
        lanes = 8;
        *what = "AVX2 FMA";
    }
#else
    (void)isa;
#endif
    return probe(threads, kind, lanes * 2.0);
}

double fmapeak_bf16_gflops(int threads, msa_cpu_isa isa)
{
#if FMAPEAK_X86
    if (isa == MSA_CPU_ISA_AVX512_BF16 && __builtin_cpu_supports("avx512bf16"))
        return probe(threads, 3, 64.0);
#else
    (void)threads;
    (void)isa;
#endif
    return 0.0;
}
