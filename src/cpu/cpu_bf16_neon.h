/* bf16 dot products on Arm64 CPUs with FEAT_BF16 (BFDOT), included by
 * cpu_bf16.h on the neon_bf16 level only.  The functions are those of the
 * AVX512-BF16 branch of cpu_bf16.h, with the same arguments, layouts and
 * results up to the rounding of the sums, on vectors of 4 fp32 lanes.
 *
 * BFDOT multiplies the two bf16 pairs of a lane and adds both products
 * to the fp32 lane.  With FPCR.EBF = 0 (the Linux default, and the only
 * behaviour of CPUs without FEAT_EBF16) each product is exact (8-bit
 * significands), the two products are added and that sum is added to
 * the lane, each addition rounded to odd instead of to nearest; inputs
 * and results below the normal range are taken as zero, as vdpbf16ps
 * does.  A rounding to odd errs by less than one unit in the last place
 * (to nearest: half a unit), so every sum is an fp32 sum with at most
 * twice the rounding error of the AVX512-BF16 level's: far below the
 * bf16 bound of SPEC section 11.  With FPCR.EBF = 1 the pair is fused
 * and rounded as FPCR says, which is no less accurate.
 *
 * A lane's products are always added in the order of the summed axis,
 * whichever form computes them: vbfdotq_f32 on a broadcast pair and
 * vbfdotq_laneq_f32 on a pair picked from a register are the same
 * operation. */
#ifndef MSA_CPU_BF16_NEON_H
#define MSA_CPU_BF16_NEON_H

#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

/* Eight bf16 values (four pairs) at p. */
static inline bfloat16x8_t nb_load16(const uint16_t *p)
{
    return vreinterpretq_bf16_u16(vld1q_u16(p));
}

/* Four bf16 pairs stored as 32-bit words at p. */
static inline bfloat16x8_t nb_load32(const uint32_t *p)
{
    return vreinterpretq_bf16_u32(vld1q_u32(p));
}

/* The pair w (low half first) in every lane. */
static inline bfloat16x8_t nb_bcast_word(uint32_t w)
{
    return vreinterpretq_bf16_u32(vdupq_n_u32(w));
}

/* The pair of bf16 values at p (any alignment) in every lane. */
static inline bfloat16x8_t nb_bcast(const uint16_t *p)
{
    uint32_t w;
    memcpy(&w, p, sizeof w);
    return nb_bcast_word(w);
}

/* out[j] = q . k[j] for 16 consecutive bf16 rows of `dim` (a multiple of
 * 8): one accumulator per key, each lane summing every fourth pair, then
 * the lanes added pairwise. */
static inline void msa_dot16_rows_bf16(float *out, const uint16_t *q, const uint16_t *k, int dim)
{
    float32x4_t acc[16];
    for (int j = 0; j < 16; j++)
        acc[j] = vdupq_n_f32(0.0f);
    for (int d = 0; d < dim; d += 8) {
        const bfloat16x8_t qd = nb_load16(q + d);
        for (int j = 0; j < 16; j++)
            acc[j] = vbfdotq_f32(acc[j], qd, nb_load16(k + (int64_t)j * dim + d));
    }
    for (int j = 0; j < 16; j += 4) {
        const float32x4_t s01 = vpaddq_f32(acc[j], acc[j + 1]);
        const float32x4_t s23 = vpaddq_f32(acc[j + 2], acc[j + 3]);
        vst1q_f32(out + j, vpaddq_f32(s01, s23));
    }
}

/* One step of nb_scores_keys: pair l of the four loaded from each key row
 * (kv) against the query pairs of row d / 2 + l of qt2. */
#define NB_SCORES_LANE(l)                                             \
    do {                                                              \
        bfloat16x8_t q[4];                                            \
        for (int v = 0; v < 4; v++)                                   \
            q[v] = nb_load32(qd + (int64_t)(l)*gp + 4 * v);           \
        for (int i = 0; i < NK; i++)                                  \
            for (int v = 0; v < 4; v++)                               \
                a[i][v] = vbfdotq_laneq_f32(a[i][v], q[v], kv[i], l); \
    } while (0)

/* s[i][h] = scale * (k[i] . q[h]) for NK (1 to 4, a constant after
 * inlining) keys at k0 and the 16 heads of qt2 (row stride gp): NK x 4
 * accumulators.  Four pairs of each key are loaded at once and picked by
 * lane; the pairs past the last multiple of 8 are broadcast. */
static inline __attribute__((always_inline)) void nb_scores_keys(float *restrict s, int gp,
                                                                 const uint32_t *restrict qt2,
                                                                 const uint16_t *restrict k0,
                                                                 int dim, float32x4_t sc,
                                                                 const int NK)
{
    float32x4_t a[4][4];
    for (int i = 0; i < NK; i++)
        for (int v = 0; v < 4; v++)
            a[i][v] = vdupq_n_f32(0.0f);
    int d = 0;
    for (; d + 8 <= dim; d += 8) {
        bfloat16x8_t kv[4];
        for (int i = 0; i < NK; i++)
            kv[i] = nb_load16(k0 + (int64_t)i * dim + d);
        const uint32_t *qd = qt2 + (int64_t)(d / 2) * gp;
        NB_SCORES_LANE(0);
        NB_SCORES_LANE(1);
        NB_SCORES_LANE(2);
        NB_SCORES_LANE(3);
    }
    for (; d < dim; d += 2) {
        bfloat16x8_t q[4];
        for (int v = 0; v < 4; v++)
            q[v] = nb_load32(qt2 + (int64_t)(d / 2) * gp + 4 * v);
        for (int i = 0; i < NK; i++) {
            const bfloat16x8_t kw = nb_bcast(k0 + (int64_t)i * dim + d);
            for (int v = 0; v < 4; v++)
                a[i][v] = vbfdotq_f32(a[i][v], q[v], kw);
        }
    }
    for (int i = 0; i < NK; i++)
        for (int v = 0; v < 4; v++)
            vst1q_f32(s + (int64_t)i * gp + 4 * v, vmulq_f32(a[i][v], sc));
}

/* s[j][h] = scale * (k[j] . q[h]) for keys j < n and heads h < gp (a
 * multiple of 16).  qt2 holds the queries as bf16 pairs along the head
 * dimension: qt2[d/2][h] = (q[h][d], q[h][d+1]); dim is even. */
static inline void msa_scores_heads_bf16(float *restrict s, const uint32_t *restrict qt2, int gp,
                                         const uint16_t *restrict k, int dim, int n, float scale)
{
    const float32x4_t sc = vdupq_n_f32(scale);
    for (int h0 = 0; h0 < gp; h0 += 16) {
        int j = 0;
        for (; j + 4 <= n; j += 4)
            nb_scores_keys(s + (int64_t)j * gp + h0, gp, qt2 + h0, k + (int64_t)j * dim, dim, sc,
                           4);
        for (; j < n; j++)
            nb_scores_keys(s + (int64_t)j * gp + h0, gp, qt2 + h0, k + (int64_t)j * dim, dim, sc,
                           1);
    }
}

/* msa_scores_heads_bf16 for four tokens (gp == 16): s[t][j][h] for t < 4
 * at s + t * s_stride.  Four tokens' queries (16 vectors) and their
 * accumulators do not fit the 32 registers with keys beside them, so the
 * tokens take turns, each with msa_scores_heads_bf16 (the same bits).  A
 * token whose queries are those of an earlier one (the caller repeats
 * its first token to fill a group) is not computed again and its scores
 * are not written: the caller reads only the tokens of its group. */
static inline void msa_scores_heads_bf16_x4(float *restrict s, int64_t s_stride,
                                            const uint32_t *const qt2[4],
                                            const uint16_t *restrict k, int dim, int n, float scale)
{
    for (int t = 0; t < 4; t++) {
        int seen = 0;
        for (int u = 0; u < t; u++)
            seen |= qt2[u] == qt2[t];
        if (!seen)
            msa_scores_heads_bf16(s + t * s_stride, qt2[t], 16, k, dim, n, scale);
    }
}

/* acc = acc * corr + sum_j p[j] * v[j][:] with bf16 products: pp[jp * stride]
 * holds the weights of keys 2jp and 2jp+1 as a bf16 pair, vp[jp][d] the
 * values (v[2jp][d], v[2jp+1][d]).  dim a multiple of 16. */
static inline void msa_pv_tile_bf16(float *restrict acc, float corr, const uint32_t *restrict pp,
                                    int stride, const uint32_t *restrict vp, int dim, int npairs)
{
    const float32x4_t c = vdupq_n_f32(corr);
    int d0 = 0;
    for (; d0 + 64 <= dim; d0 += 64) {
        float32x4_t a[16];
        for (int x = 0; x < 16; x++)
            a[x] = vmulq_f32(vld1q_f32(acc + d0 + 4 * x), c);
        for (int jp = 0; jp < npairs; jp++) {
            const bfloat16x8_t w = nb_bcast_word(pp[(int64_t)jp * stride]);
            const uint32_t *vr = vp + (int64_t)jp * dim + d0;
            for (int x = 0; x < 16; x++)
                a[x] = vbfdotq_f32(a[x], w, nb_load32(vr + 4 * x));
        }
        for (int x = 0; x < 16; x++)
            vst1q_f32(acc + d0 + 4 * x, a[x]);
    }
    for (; d0 < dim; d0 += 16) {
        float32x4_t a[4];
        for (int x = 0; x < 4; x++)
            a[x] = vmulq_f32(vld1q_f32(acc + d0 + 4 * x), c);
        for (int jp = 0; jp < npairs; jp++) {
            const bfloat16x8_t w = nb_bcast_word(pp[(int64_t)jp * stride]);
            const uint32_t *vr = vp + (int64_t)jp * dim + d0;
            for (int x = 0; x < 4; x++)
                a[x] = vbfdotq_f32(a[x], w, nb_load32(vr + 4 * x));
        }
        for (int x = 0; x < 4; x++)
            vst1q_f32(acc + d0 + 4 * x, a[x]);
    }
}

#endif
