/* Element conversions between fp32 and the 16-bit activation formats.
 * Bit-level, round to nearest even, so results do not depend on the FPU
 * mode or on compiler support for _Float16. */
#include "core/internal.h"

#include <string.h>

float msa_bf16_to_f32(uint16_t x)
{
    return msa_bits_f32((uint32_t)x << 16);
}

uint16_t msa_f32_to_bf16(float x)
{
    uint32_t u = msa_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float msa_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) /* inf / NaN */
        return msa_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in fp32 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return msa_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t msa_f32_to_f16(float x)
{
    uint32_t u = msa_f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        /* result is subnormal (or zero): value / 2^-24 rounded to even */
        if (a < 0x33000000u) /* below half the smallest subnormal */
            return sign;
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24: m * 2^(e-150) / 2^-24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    /* normal: rebias the exponent, round the mantissa to 10 bits */
    uint32_t r = a - 0x38000000u; /* exponent -112 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

float msa_load_act(const void *base, msa_dtype dtype, int64_t i)
{
    switch (dtype) {
    case MSA_DTYPE_BF16: return msa_bf16_to_f32(((const uint16_t *)base)[i]);
    case MSA_DTYPE_FP16: return msa_f16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

void msa_store_act(void *base, msa_dtype dtype, int64_t i, float value)
{
    switch (dtype) {
    case MSA_DTYPE_BF16: ((uint16_t *)base)[i] = msa_f32_to_bf16(value); break;
    case MSA_DTYPE_FP16: ((uint16_t *)base)[i] = msa_f32_to_f16(value); break;
    default: ((float *)base)[i] = value; break;
    }
}

void msa_convert_from_f32(void *dst, msa_dtype dtype, const float *src, int64_t n)
{
    switch (dtype) {
    case MSA_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = msa_f32_to_bf16(src[i]);
        break;
    case MSA_DTYPE_FP16:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = msa_f32_to_f16(src[i]);
        break;
    default: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    }
}

void msa_convert_to_f32(float *dst, const void *src, msa_dtype dtype, int64_t n)
{
    switch (dtype) {
    case MSA_DTYPE_BF16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = msa_bits_f32((uint32_t)s[i] << 16);
        break;
    }
    case MSA_DTYPE_FP16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = msa_f16_to_f32(((const uint16_t *)src)[i]);
        break;
    default: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    }
}
