/* Small numeric helpers of the CPU kernels, written so that loops calling
 * them vectorize without -ffast-math. */
#ifndef MSA_CPU_MATH_H
#define MSA_CPU_MATH_H

#include <stdint.h>
#include <string.h>

/* 16 floats as one value.  GCC/Clang vector extensions lower this to the
 * widest registers of the target (one AVX-512 register, two AVX2 ...), so
 * the hot loops below say exactly which sums run side by side instead of
 * hoping that the vectorizer picks the right loop.
 *
 * No function here takes or returns an msa_v16 by value: loads and stores
 * are macros, a scalar operand of a vector operation is broadcast by the
 * compiler (v * x), and helpers that work on whole vectors take pointers.
 * Without AVX-512 a 64-byte vector argument would be passed in memory and
 * with AVX-512 in a register, which GCC and Clang flag with -Wpsabi; since
 * no such argument exists, the question does not arise on any target. */
typedef float msa_v16 __attribute__((vector_size(64)));
typedef float msa_v16u __attribute__((vector_size(64), aligned(4)));

/* 16 floats at p (aligned to 4 bytes only), as a vector value or as the
 * target of a vector store. */
#define MSA_V16_LOAD(p) (*(const msa_v16u *)(p))
#define MSA_V16_STORE(p, v) (*(msa_v16u *)(p) = (v))

/* Sum of the 16 lanes of *v, pairwise. */
static inline float msa_v16_sum(const msa_v16 *v)
{
    float t[16];
    MSA_V16_STORE(t, *v);
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++)
            t[l] += t[l + w];
    return t[0];
}

/* Dot product with 16 independent partial sums. */
static inline float msa_dot_f32(const float *a, const float *b, int n)
{
    msa_v16 acc = {0};
    int d = 0;
    for (; d + 16 <= n; d += 16)
        acc += MSA_V16_LOAD(a + d) * MSA_V16_LOAD(b + d);
    float tail = 0.0f;
    for (; d < n; d++)
        tail += a[d] * b[d];
    return msa_v16_sum(&acc) + tail;
}

#if defined(__clang__)
#define MSA_SHUFFLE2(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
typedef int32_t msa_v16i __attribute__((vector_size(64)));
#define MSA_SHUFFLE2(a, b, ...) __builtin_shuffle(a, b, (msa_v16i){__VA_ARGS__})
#endif

/* Sums of 16 vectors, out[l] = sum of p[l]'s lanes: four levels of
 * pairwise shuffles and adds instead of 16 separate horizontal
 * reductions. */
static inline void msa_v16_transpose_sum(float *out, const msa_v16 *p)
{
    msa_v16 x[8], y[4], z[2];
    for (int k = 0; k < 8; k++)
        x[k] = MSA_SHUFFLE2(p[2 * k], p[2 * k + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21,
                            22, 23) +
               MSA_SHUFFLE2(p[2 * k], p[2 * k + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27,
                            28, 29, 30, 31);
    for (int k = 0; k < 4; k++)
        y[k] = MSA_SHUFFLE2(x[2 * k], x[2 * k + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24,
                            25, 26, 27) +
               MSA_SHUFFLE2(x[2 * k], x[2 * k + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28,
                            29, 30, 31);
    for (int k = 0; k < 2; k++)
        z[k] = MSA_SHUFFLE2(y[2 * k], y[2 * k + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24,
                            25, 28, 29) +
               MSA_SHUFFLE2(y[2 * k], y[2 * k + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26,
                            27, 30, 31);
    MSA_V16_STORE(out, MSA_SHUFFLE2(z[0], z[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                    28, 30) +
                           MSA_SHUFFLE2(z[0], z[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25,
                                        27, 29, 31));
}

/* MSA_CPU_WIDE: the target has 32 vector registers of 64 bytes
 * (AVX-512), so sixteen 16-float accumulators stay in registers.  On
 * narrower targets (AVX2: 16 registers of 32 bytes, NEON: 32 of 16) the
 * kernels below keep fewer accumulators live, which changes only the order
 * of some fp32 sums (docs/CPU.md). */
#if defined(__AVX512F__)
#define MSA_CPU_WIDE 1
#else
#define MSA_CPU_WIDE 0
#endif

#if MSA_CPU_WIDE
/* out[j] = q . k[j] for 16 consecutive rows k[j] of `dim` floats (dim a
 * multiple of 16). */
static inline void msa_dot16_rows(float *out, const float *q, const float *k, int dim)
{
    msa_v16 p[16];
    for (int j = 0; j < 16; j++)
        p[j] = (msa_v16){0};
    for (int d = 0; d < dim; d += 16) {
        const msa_v16 qd = MSA_V16_LOAD(q + d);
        for (int j = 0; j < 16; j++)
            p[j] += qd * MSA_V16_LOAD(k + (int64_t)j * dim + d);
    }
    msa_v16_transpose_sum(out, p);
}
#else
/* 8 floats as one value: one AVX2 register, two NEON registers. */
typedef float msa_v8 __attribute__((vector_size(32)));
typedef float msa_v8u __attribute__((vector_size(32), aligned(4)));
#define MSA_V8_LOAD(p) (*(const msa_v8u *)(p))
#define MSA_V8_STORE(p, v) (*(msa_v8u *)(p) = (v))
#if defined(__clang__)
#define MSA_SHUFFLE8(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
typedef int32_t msa_v8i __attribute__((vector_size(32)));
#define MSA_SHUFFLE8(a, b, ...) __builtin_shuffle(a, b, (msa_v8i){__VA_ARGS__})
#endif

/* out[l] = sum of p[l]'s 8 lanes for l < 8: three levels of pairwise
 * shuffles and adds (lanes l and l+4, then l and l+2, then l and l+1). */
static inline void msa_v8_transpose_sum(float *out, const msa_v8 *p)
{
    msa_v8 x[4], y[2];
    for (int k = 0; k < 4; k++)
        x[k] = MSA_SHUFFLE8(p[2 * k], p[2 * k + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
               MSA_SHUFFLE8(p[2 * k], p[2 * k + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    for (int k = 0; k < 2; k++)
        y[k] = MSA_SHUFFLE8(x[2 * k], x[2 * k + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
               MSA_SHUFFLE8(x[2 * k], x[2 * k + 1], 2, 3, 6, 7, 10, 11, 14, 15);
    MSA_V8_STORE(out, MSA_SHUFFLE8(y[0], y[1], 0, 2, 4, 6, 8, 10, 12, 14) +
                          MSA_SHUFFLE8(y[0], y[1], 1, 3, 5, 7, 9, 11, 13, 15));
}

/* out[j] = q . k[j] for 16 consecutive rows k[j] of `dim` floats (dim a
 * multiple of 8), eight rows at a time with 8-lane partial sums: eight
 * accumulators and one broadcast-free load of q per step fit 16 registers. */
static inline void msa_dot16_rows(float *out, const float *q, const float *k, int dim)
{
    for (int h = 0; h < 16; h += 8) {
        msa_v8 p[8];
        for (int j = 0; j < 8; j++)
            p[j] = (msa_v8){0};
        for (int d = 0; d < dim; d += 8) {
            const msa_v8 qd = MSA_V8_LOAD(q + d);
            for (int j = 0; j < 8; j++)
                p[j] += qd * MSA_V8_LOAD(k + (int64_t)(h + j) * dim + d);
        }
        msa_v8_transpose_sum(out + h, p);
    }
}
#endif

/* y += a * x */
static inline void msa_axpy_f32(float *restrict y, float a, const float *restrict x, int n)
{
    for (int d = 0; d < n; d++)
        y[d] += a * x[d];
}

/* s[j] = q . kt[:, j] for j < n rounded up to 16; kt is [dim][ld] (keys
 * along rows), so 16 keys' sums stay in one register; two groups of keys
 * share each broadcast of q. */
static inline void msa_scores_tile(float *restrict s, const float *restrict q,
                                   const float *restrict kt, int ld, int dim, int n)
{
    const int n16 = (n + 15) & ~15;
    int j0 = 0;
    for (; j0 + 32 <= n16; j0 += 32) {
        msa_v16 a0 = {0}, a1 = a0;
        for (int d = 0; d < dim; d++) {
            const float qd = q[d];
            const float *k = kt + (int64_t)d * ld + j0;
            a0 += qd * MSA_V16_LOAD(k);
            a1 += qd * MSA_V16_LOAD(k + 16);
        }
        MSA_V16_STORE(s + j0, a0);
        MSA_V16_STORE(s + j0 + 16, a1);
    }
    for (; j0 < n; j0 += 16) {
        msa_v16 a0 = {0};
        for (int d = 0; d < dim; d++)
            a0 += q[d] * MSA_V16_LOAD(kt + (int64_t)d * ld + j0);
        MSA_V16_STORE(s + j0, a0);
    }
}

/* Lane l of *a becomes max(a[l], p[l]); a NaN in p is not taken.  The
 * lanes go through local arrays, which the compilers turn into one vector
 * max. */
static inline void msa_v16_max(msa_v16 *a, const float *p)
{
    float x[16], y[16];
    MSA_V16_STORE(x, *a);
    MSA_V16_STORE(y, MSA_V16_LOAD(p));
    for (int l = 0; l < 16; l++)
        x[l] = y[l] > x[l] ? y[l] : x[l];
    *a = MSA_V16_LOAD(x);
}

#if MSA_CPU_WIDE
/* s[j][h] = k[j] . qt[:, h] for keys j < n and heads h < gp (gp a multiple
 * of 16): heads along the lanes, four keys per pass: each load of qt
 * feeds four independent fused multiply-add chains. */
static inline void msa_scores_heads(float *restrict s, const float *restrict qt, int gp,
                                    const float *restrict k, int dim, int n)
{
    for (int h0 = 0; h0 < gp; h0 += 16) {
        int j = 0;
        for (; j + 4 <= n; j += 4) {
            const float *k0 = k + (int64_t)j * dim;
            msa_v16 a[4];
            for (int i = 0; i < 4; i++)
                a[i] = (msa_v16){0};
            for (int d = 0; d < dim; d++) {
                const msa_v16 q = MSA_V16_LOAD(qt + (int64_t)d * gp + h0);
                for (int i = 0; i < 4; i++)
                    a[i] += k0[(int64_t)i * dim + d] * q;
            }
            for (int i = 0; i < 4; i++)
                MSA_V16_STORE(s + (int64_t)(j + i) * gp + h0, a[i]);
        }
        for (; j < n; j++) {
            const float *k0 = k + (int64_t)j * dim;
            msa_v16 a0 = {0};
            for (int d = 0; d < dim; d++)
                a0 += k0[d] * MSA_V16_LOAD(qt + (int64_t)d * gp + h0);
            MSA_V16_STORE(s + (int64_t)j * gp + h0, a0);
        }
    }
}
#else
/* Native vectors of narrow targets: 8 floats with AVX (one register), 4
 * elsewhere (SSE2, NEON). */
#if defined(__AVX__)
#define MSA_VN 8
#else
#define MSA_VN 4
#endif
typedef float msa_vn __attribute__((vector_size(4 * MSA_VN)));
typedef float msa_vnu __attribute__((vector_size(4 * MSA_VN), aligned(4)));
#define MSA_VN_LOAD(p) (*(const msa_vnu *)(p))
#define MSA_VN_STORE(p, v) (*(msa_vnu *)(p) = (v))

/* s[j][h] = k[j] . qt[:, h] as above, MSA_VN heads per register and eight
 * keys per pass: eight independent chains, each load of qt feeds eight
 * multiply-adds.  Every lane sums over d in order, as the wide version. */
static inline void msa_scores_heads(float *restrict s, const float *restrict qt, int gp,
                                    const float *restrict k, int dim, int n)
{
    for (int h0 = 0; h0 < gp; h0 += MSA_VN) {
        int j = 0;
        for (; j + 8 <= n; j += 8) {
            const float *k0 = k + (int64_t)j * dim;
            msa_vn a[8];
            for (int i = 0; i < 8; i++)
                a[i] = (msa_vn){0};
            for (int d = 0; d < dim; d++) {
                const msa_vn q = MSA_VN_LOAD(qt + (int64_t)d * gp + h0);
                for (int i = 0; i < 8; i++)
                    a[i] += k0[(int64_t)i * dim + d] * q;
            }
            for (int i = 0; i < 8; i++)
                MSA_VN_STORE(s + (int64_t)(j + i) * gp + h0, a[i]);
        }
        for (; j < n; j++) {
            const float *k0 = k + (int64_t)j * dim;
            msa_vn a0 = {0};
            for (int d = 0; d < dim; d++)
                a0 += k0[d] * MSA_VN_LOAD(qt + (int64_t)d * gp + h0);
            MSA_VN_STORE(s + (int64_t)j * gp + h0, a0);
        }
    }
}
#endif

/* Columns of msa_pv_tile per pass: eight accumulator registers. */
#if MSA_CPU_WIDE
#define MSA_PV_VECS 8
typedef msa_v16 msa_pv_vec;
typedef msa_v16u msa_pv_vecu;
#define MSA_PV_LANES 16
#else
#define MSA_PV_VECS 8
typedef msa_vn msa_pv_vec;
typedef msa_vnu msa_pv_vecu;
#define MSA_PV_LANES MSA_VN
#endif
#define MSA_PV_LOAD(p) (*(const msa_pv_vecu *)(p))
#define MSA_PV_STORE(p, v) (*(msa_pv_vecu *)(p) = (v))

/* acc = acc * corr + sum_j p[j * p_stride] * v[j][:].  MSA_PV_LANES * MSA_PV_VECS
 * output columns at a time (of the target's vector width): independent accumulator chains hide the FMA
 * latency (two chains left this loop latency-bound).  Every column's sum
 * runs over j in order, so the width does not change the result. */
static inline void msa_pv_tile(float *restrict acc, float corr, const float *restrict p,
                               int p_stride, const float *restrict v, int dim, int n)
{
    int d0 = 0;
    for (; d0 + MSA_PV_LANES * MSA_PV_VECS <= dim; d0 += MSA_PV_LANES * MSA_PV_VECS) {
        msa_pv_vec a[MSA_PV_VECS];
        for (int k = 0; k < MSA_PV_VECS; k++)
            a[k] = MSA_PV_LOAD(acc + d0 + MSA_PV_LANES * k) * corr;
        for (int j = 0; j < n; j++) {
            const float pj = p[(int64_t)j * p_stride];
            const float *vr = v + (int64_t)j * dim + d0;
            for (int k = 0; k < MSA_PV_VECS; k++)
                a[k] += pj * MSA_PV_LOAD(vr + MSA_PV_LANES * k);
        }
        for (int k = 0; k < MSA_PV_VECS; k++)
            MSA_PV_STORE(acc + d0 + MSA_PV_LANES * k, a[k]);
    }
    for (; d0 + MSA_PV_LANES <= dim; d0 += MSA_PV_LANES) {
        msa_pv_vec a0 = MSA_PV_LOAD(acc + d0) * corr;
        for (int j = 0; j < n; j++)
            a0 += p[(int64_t)j * p_stride] * MSA_PV_LOAD(v + (int64_t)j * dim + d0);
        MSA_PV_STORE(acc + d0, a0);
    }
    for (; d0 < dim; d0++) {
        float a = acc[d0] * corr;
        for (int j = 0; j < n; j++)
            a += p[(int64_t)j * p_stride] * v[(int64_t)j * dim + d0];
        acc[d0] = a;
    }
}

static inline float msa_bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* fp32 to bf16, round to nearest even, a NaN kept a quiet NaN: what
 * msa_f32_to_bf16 (src/core/convert.c) computes, inline so that the loops
 * of the kernels that call it vectorize. */
static inline uint16_t msa_bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x0040u : r);
}

/* exp(x) for x <= 0 (softmax arguments), relative error about 2e-7;
 * exactly 0 below -87.  Branch-free so that loops over it vectorize. */
static inline float msa_exp_neg(float x)
{
    const float lo = -87.0f;
    float xc = x < lo ? lo : x;
    float t = xc * 1.44269504088896341f;
    float n = __builtin_rintf(t);
    float r = xc - n * 0.693145751953125f; /* ln2 split in hi + lo parts */
    r = r - n * 1.428606765330187e-06f;
    /* Taylor to degree 7 on |r| <= ln2/2 */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t e = (int32_t)n + 127;
    float scale = msa_bits_to_f32((uint32_t)e << 23);
    float y = p * scale;
    return x < lo ? 0.0f : y;
}

#endif
