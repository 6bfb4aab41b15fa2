/* Small numeric helpers of the CPU kernels, written so that loops calling
 * them vectorize without -ffast-math. */
#ifndef MSA_CPU_MATH_H
#define MSA_CPU_MATH_H

#include <stdint.h>
#include <string.h>

/* Dot product with 16 independent partial sums: the compiler maps them to
 * one vector register and needs no reassociation licence to vectorize. */
static inline float msa_dot_f32(const float *a, const float *b, int n)
{
    float acc[16] = {0};
    int d = 0;
    for (; d + 16 <= n; d += 16)
        for (int l = 0; l < 16; l++)
            acc[l] += a[d + l] * b[d + l];
    float tail = 0.0f;
    for (; d < n; d++)
        tail += a[d] * b[d];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++)
            acc[l] += acc[l + w];
    return acc[0] + tail;
}

/* y += a * x */
static inline void msa_axpy_f32(float *restrict y, float a, const float *restrict x, int n)
{
    for (int d = 0; d < n; d++)
        y[d] += a * x[d];
}

static inline float msa_bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
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
