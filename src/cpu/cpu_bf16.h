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
#include <immintrin.h>

/* s[j][h] = scale * (k[j] . q[h]) for keys j < n and heads h < gp (a
 * multiple of 16).  qt2 holds the queries as bf16 pairs along the head
 * dimension: qt2[d/2][h] = (q[h][d], q[h][d+1]). */
static inline void msa_scores_heads_bf16(float *restrict s, const uint32_t *restrict qt2, int gp,
                                         const uint16_t *restrict k, int dim, int n, float scale)
{
    const __m512 sc = _mm512_set1_ps(scale);
    for (int h0 = 0; h0 < gp; h0 += 16) {
        int j = 0;
        /* Four keys per pass: four independent accumulator chains. */
        for (; j + 4 <= n; j += 4) {
            const uint16_t *k0 = k + (int64_t)j * dim;
            __m512 a[4];
            for (int i = 0; i < 4; i++)
                a[i] = _mm512_setzero_ps();
            for (int d = 0; d < dim; d += 2) {
                const __m512bh q =
                    (__m512bh)_mm512_loadu_si512((const void *)(qt2 + (int64_t)(d / 2) * gp + h0));
                for (int i = 0; i < 4; i++) {
                    uint32_t w;
                    memcpy(&w, k0 + (int64_t)i * dim + d, 4);
                    a[i] = _mm512_dpbf16_ps(a[i], q, (__m512bh)_mm512_set1_epi32((int)w));
                }
            }
            for (int i = 0; i < 4; i++)
                _mm512_storeu_ps(s + (int64_t)(j + i) * gp + h0, _mm512_mul_ps(a[i], sc));
        }
        for (; j < n; j++) {
            const uint16_t *k0 = k + (int64_t)j * dim;
            __m512 a0 = _mm512_setzero_ps();
            for (int d = 0; d < dim; d += 2) {
                const __m512bh q =
                    (__m512bh)_mm512_loadu_si512((const void *)(qt2 + (int64_t)(d / 2) * gp + h0));
                uint32_t w0;
                memcpy(&w0, k0 + d, 4);
                a0 = _mm512_dpbf16_ps(a0, q, (__m512bh)_mm512_set1_epi32((int)w0));
            }
            _mm512_storeu_ps(s + (int64_t)j * gp + h0, _mm512_mul_ps(a0, sc));
        }
    }
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
#elif defined(__aarch64__) && defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
#define MSA_CPU_HAVE_BF16_DOT 1
#define MSA_CPU_BF16_DOT_INSN "BFDOT"
#include "cpu/cpu_bf16_neon.h"
#else
#define MSA_CPU_HAVE_BF16_DOT 0
#endif

#endif
