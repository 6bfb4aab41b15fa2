/* bf16 dot products on CPUs with AVX512-BF16 (vdpbf16ps) or, on Arm64,
 * FEAT_BF16 (BFDOT, cpu_bf16_neon.h): products of two bf16 values are
 * exact in fp32 and the sums run in fp32, so for bf16 operands this
 * computes what the generic path computes after converting (up to the
 * rounding of the sums), at twice the rate and without the conversion
 * pass.  MSA_CPU_BF16_DOT_INSN names the instruction in the kernel
 * descriptions. */
#ifndef MSA_CPU_BF16_H
#define MSA_CPU_BF16_H

#include <stdint.h>
#include <string.h>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define MSA_CPU_HAVE_BF16_DOT 1
#define MSA_CPU_BF16_DOT_INSN "vdpbf16ps"
/* msa_pv_tile4_bf16 (four heads per pass) and msa_scores16_bf16_prefetch
 * exist. */
#define MSA_CPU_HAVE_PV_TILE4 1
#define MSA_CPU_SCORES_PREFETCH 1
/* The row kernels (four tokens' scores per pass of eight keys, P.V four
 * heads per pass) also beat the blocked kernels on prefill rows of bf16
 * data with query groups of 16 heads: on Zen 4, over the 66
 * representative prefill cases scaled to 8K, the sparse layer ran at 66%
 * of the vdpbf16ps peak against 52%, the dense layer at 76% against 66%,
 * and no case slower (bench/RESULTS.md). */
#define MSA_CPU_BF16_ROWS_PREFILL 1
#include <immintrin.h>

#include "cpu/cpu_next_block.h"

/* acc + v . (the bf16 pair at p, broadcast to every lane): vdpbf16ps with
 * the pair as an embedded-broadcast memory operand, which the compilers
 * do not form from intrinsics.  A separate broadcast per product (what
 * _mm512_set1_epi32 of the pair compiles to) held the score loop at about
 * 80% of the instruction's rate on Zen 4; this form reaches it. */
static inline __m512 msa_dpbf16_bcast(__m512 acc, __m512bh v, const uint32_t *p)
{
    __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(v), "m"(*p));
    return acc;
}

/* One pass of eight keys (rows of k0, stride dim) against the 16 heads
 * h0 .. h0 + 15 of qt2 (rows of gp pairs): their scores times sc at s
 * (rows of gp floats).  With nx non-NULL, every fourth step over d also
 * prefetches the next line of its K and of its V (dr_next_line): half of
 * the next block's lines for a token's score passes, the other half for
 * its P.V passes (msa_pv_tile4_bf16), so that they go out over the whole
 * block.  Issued over the score passes alone they came twice as fast and
 * left the loads waiting for the miss buffers: the dense decode step was
 * 8-10% slower at 32K and 128K on Zen 4 (bench/RESULTS.md). */
static inline void msa_scores8_pass_bf16(float *restrict s, const uint32_t *restrict qt2, int gp,
                                         int h0, const uint16_t *restrict k0, int dim, __m512 sc,
                                         dr_next *nx)
{
    __m512 a[8];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_setzero_ps();
    for (int d = 0; d < dim; d += 2) {
        if (nx && (d & 7) == 0)
            dr_next_line(nx);
        const __m512bh q =
            (__m512bh)_mm512_loadu_si512((const void *)(qt2 + (int64_t)(d / 2) * gp + h0));
        for (int i = 0; i < 8; i++)
            a[i] = msa_dpbf16_bcast(a[i], q, (const uint32_t *)(k0 + (int64_t)i * dim + d));
    }
    for (int i = 0; i < 8; i++)
        _mm512_storeu_ps(s + (int64_t)i * gp + h0, _mm512_mul_ps(a[i], sc));
}

/* s[j][h] = scale * (k[j] . q[h]) for keys j < n and heads h < gp (a
 * multiple of 16).  qt2 holds the queries as bf16 pairs along the head
 * dimension: qt2[d/2][h] = (q[h][d], q[h][d+1]).  Eight keys per pass:
 * eight independent accumulator chains cover the latency of vdpbf16ps,
 * and each query pair loaded feeds eight products (with four, the loop
 * ran at about two thirds of the instruction's rate).  Every lane sums
 * over d in ascending order whatever the grouping of keys, so the scores
 * do not depend on it. */
static inline void msa_scores_heads_bf16(float *restrict s, const uint32_t *restrict qt2, int gp,
                                         const uint16_t *restrict k, int dim, int n, float scale)
{
    const __m512 sc = _mm512_set1_ps(scale);
    for (int h0 = 0; h0 < gp; h0 += 16) {
        int j = 0;
        for (; j + 8 <= n; j += 8)
            msa_scores8_pass_bf16(s + (int64_t)j * gp, qt2, gp, h0, k + (int64_t)j * dim, dim, sc,
                                  NULL);
        for (; j < n; j++) {
            const uint16_t *k0 = k + (int64_t)j * dim;
            __m512 a0 = _mm512_setzero_ps();
            for (int d = 0; d < dim; d += 2) {
                const __m512bh q =
                    (__m512bh)_mm512_loadu_si512((const void *)(qt2 + (int64_t)(d / 2) * gp + h0));
                a0 = msa_dpbf16_bcast(a0, q, (const uint32_t *)(k0 + d));
            }
            _mm512_storeu_ps(s + (int64_t)j * gp + h0, _mm512_mul_ps(a0, sc));
        }
    }
}

/* msa_scores_heads_bf16 for the 16 heads of one KV head (gp 16) while the
 * rows of the next block stream in: every second step over d of an
 * eight-key pass prefetches the next line of nx's K and of its V
 * (msa_scores8_pass_bf16), so a pass requests about the bytes of its own
 * eight keys.  Issued instead as one burst of 4 KB of each per 16 keys,
 * the prefetches filled the core's miss buffers while the passes ran (2
 * threads on Zen 4, 32K decode, eight alternating rounds: sparse
 * 0.67-0.78 against 0.73-1.07 ms, dense 5.0-6.2 against 5.4-8.1 ms).  The
 * scores are those of msa_scores_heads_bf16, bit for bit. */
static inline void msa_scores16_bf16_prefetch(float *restrict s, const uint32_t *restrict qt2,
                                              const uint16_t *restrict k, int dim, int n,
                                              float scale, dr_next *nx)
{
    const __m512 sc = _mm512_set1_ps(scale);
    int j = 0;
    for (; j + 8 <= n; j += 8)
        msa_scores8_pass_bf16(s + (int64_t)j * 16, qt2, 16, 0, k + (int64_t)j * dim, dim, sc, nx);
    if (j < n)
        msa_scores_heads_bf16(s + (int64_t)j * 16, qt2, 16, k + (int64_t)j * dim, dim, n - j,
                              scale);
}

/* msa_scores_heads_bf16 for four tokens at once: s[t][j][h] = scale *
 * (k[j] . q_t[h]) for t < 4, keys j < n and the 16 heads of qt2[t] (gp ==
 * 16), s[t] at s + t * s_stride.  Each broadcast key pair feeds the four
 * tokens' queries: sixteen independent accumulator chains instead of
 * four, so the products no longer wait on the latency of vdpbf16ps, and a
 * key pair is read once per four tokens.  Every lane sums over d in the
 * same order as msa_scores_heads_bf16, so the scores are the same bits. */
static inline void msa_scores_heads_bf16_x4(float *restrict s, int64_t s_stride,
                                            const uint32_t *const qt2[4],
                                            const uint16_t *restrict k, int dim, int n, float scale)
{
    const __m512 sc = _mm512_set1_ps(scale);
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const uint16_t *k0 = k + (int64_t)j * dim;
        __m512 a[4][4];
        for (int t = 0; t < 4; t++)
            for (int i = 0; i < 4; i++)
                a[t][i] = _mm512_setzero_ps();
        for (int d = 0; d < dim; d += 2) {
            __m512bh q[4];
            for (int t = 0; t < 4; t++)
                q[t] = (__m512bh)_mm512_loadu_si512((const void *)(qt2[t] + (int64_t)(d / 2) * 16));
            for (int i = 0; i < 4; i++) {
                uint32_t w;
                memcpy(&w, k0 + (int64_t)i * dim + d, 4);
                const __m512bh kw = (__m512bh)_mm512_set1_epi32((int)w);
                for (int t = 0; t < 4; t++)
                    a[t][i] = _mm512_dpbf16_ps(a[t][i], q[t], kw);
            }
        }
        for (int t = 0; t < 4; t++)
            for (int i = 0; i < 4; i++)
                _mm512_storeu_ps(s + t * s_stride + (int64_t)(j + i) * 16,
                                 _mm512_mul_ps(a[t][i], sc));
    }
    for (; j < n; j++) {
        const uint16_t *k0 = k + (int64_t)j * dim;
        __m512 a[4];
        for (int t = 0; t < 4; t++)
            a[t] = _mm512_setzero_ps();
        for (int d = 0; d < dim; d += 2) {
            uint32_t w;
            memcpy(&w, k0 + d, 4);
            const __m512bh kw = (__m512bh)_mm512_set1_epi32((int)w);
            for (int t = 0; t < 4; t++)
                a[t] = _mm512_dpbf16_ps(a[t],
                                        (__m512bh)_mm512_loadu_si512(
                                            (const void *)(qt2[t] + (int64_t)(d / 2) * 16)),
                                        kw);
        }
        for (int t = 0; t < 4; t++)
            _mm512_storeu_ps(s + t * s_stride + (int64_t)j * 16, _mm512_mul_ps(a[t], sc));
    }
}

/* acc = acc * corr + sum_j p[j] * v[j][:] with bf16 products: pp[jp * stride]
 * holds the weights of keys 2jp and 2jp+1 as a bf16 pair, vp[jp][d] the
 * values (v[2jp][d], v[2jp+1][d]).  dim a multiple of 16. */
static inline void msa_pv_tile_bf16(float *restrict acc, float corr, const uint32_t *restrict pp,
                                    int stride, const uint32_t *restrict vp, int dim, int npairs)
{
    const __m512 c = _mm512_set1_ps(corr);
    int d0 = 0;
    for (; d0 + 128 <= dim; d0 += 128) {
        __m512 a[8];
        for (int k = 0; k < 8; k++)
            a[k] = _mm512_mul_ps(_mm512_loadu_ps(acc + d0 + 16 * k), c);
        for (int jp = 0; jp < npairs; jp++) {
            const __m512bh w = (__m512bh)_mm512_set1_epi32((int)pp[(int64_t)jp * stride]);
            const uint32_t *vr = vp + (int64_t)jp * dim + d0;
            for (int k = 0; k < 8; k++)
                a[k] = _mm512_dpbf16_ps(a[k], w,
                                        (__m512bh)_mm512_loadu_si512((const void *)(vr + 16 * k)));
        }
        for (int k = 0; k < 8; k++)
            _mm512_storeu_ps(acc + d0 + 16 * k, a[k]);
    }
    for (; d0 < dim; d0 += 16) {
        __m512 a0 = _mm512_mul_ps(_mm512_loadu_ps(acc + d0), c);
        for (int jp = 0; jp < npairs; jp++)
            a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_set1_epi32((int)pp[(int64_t)jp * stride]),
                                  (__m512bh)_mm512_loadu_si512(
                                      (const void *)(vp + (int64_t)jp * dim + d0)));
        _mm512_storeu_ps(acc + d0, a0);
    }
}

/* msa_pv_tile_bf16 for four heads at once: acc[l] (l < 4, rows at acc +
 * l * dim) = acc[l] * corr[l] + sum_j p_l[j] * v[j][:], the weights of head
 * l at pp[jp * stride + l].  Each value pair loaded feeds four heads'
 * products (one head per pass loads a value vector per product, which
 * held the loop at about half of vdpbf16ps's rate); 64 dimensions per
 * pass keep the sixteen accumulators in registers.  Every lane sums over
 * jp in ascending order as msa_pv_tile_bf16 does, so the results are the
 * same bits.  dim a multiple of 64.  With nx non-NULL, every second pair
 * also prefetches the next line of the next block's K and of its V
 * (msa_scores8_pass_bf16). */
static inline void msa_pv_tile4_bf16(float *restrict acc, const float corr[4],
                                     const uint32_t *restrict pp, int stride,
                                     const uint32_t *restrict vp, int dim, int npairs, dr_next *nx)
{
    for (int d0 = 0; d0 < dim; d0 += 64) {
        __m512 a[4][4];
        for (int l = 0; l < 4; l++) {
            const __m512 c = _mm512_set1_ps(corr[l]);
            for (int k = 0; k < 4; k++)
                a[l][k] = _mm512_mul_ps(_mm512_loadu_ps(acc + (int64_t)l * dim + d0 + 16 * k), c);
        }
        for (int jp = 0; jp < npairs; jp++) {
            if (nx && (jp & 1) == 0)
                dr_next_line(nx);
            const uint32_t *vr = vp + (int64_t)jp * dim + d0;
            const uint32_t *w = pp + (int64_t)jp * stride;
            for (int k = 0; k < 4; k++) {
                const __m512bh v = (__m512bh)_mm512_loadu_si512((const void *)(vr + 16 * k));
                for (int l = 0; l < 4; l++)
                    a[l][k] = msa_dpbf16_bcast(a[l][k], v, w + l);
            }
        }
        for (int l = 0; l < 4; l++)
            for (int k = 0; k < 4; k++)
                _mm512_storeu_ps(acc + (int64_t)l * dim + d0 + 16 * k, a[l][k]);
    }
}
#elif defined(__aarch64__) && defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
#define MSA_CPU_HAVE_BF16_DOT 1
#define MSA_CPU_BF16_DOT_INSN "BFDOT"
#include "cpu/cpu_bf16_neon.h"
#else
#define MSA_CPU_HAVE_BF16_DOT 0
#endif

/* 1 where the prefill attention of bf16 data takes the row kernels. */
#ifndef MSA_CPU_BF16_ROWS_PREFILL
#define MSA_CPU_BF16_ROWS_PREFILL 0
#endif

/* 1 where msa_scores16_bf16_prefetch exists. */
#ifndef MSA_CPU_SCORES_PREFETCH
#define MSA_CPU_SCORES_PREFETCH 0
#endif

#endif
