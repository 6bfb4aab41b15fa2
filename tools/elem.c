#include "elem.h"

#include <math.h>
#include <string.h>

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* ---- bf16 / fp16 -------------------------------------------------------- */

uint16_t elem_f32_to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float elem_bf16_to_f32(uint16_t x)
{
    return bits_f32((uint32_t)x << 16);
}

/* Shifts `mant` right by `shift` (1..31), rounding to nearest even. */
static uint32_t shift_rne(uint32_t mant, int shift)
{
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return q;
}

uint16_t elem_f32_to_f16(float x)
{
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) /* >= 65520: rounds past the largest half */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal half: exponent >= -14 */
        uint32_t e = (a >> 23) - 112u;
        uint32_t h = (e << 10) | ((a & 0x7fffffu) >> 13);
        uint32_t rem = a & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
            h++; /* a carry into the exponent is the correct result */
        return (uint16_t)(sign | h);
    }
    if (a <= 0x33000000u) /* <= 2^-25: rounds to zero (a tie goes to even 0) */
        return sign;
    /* Subnormal half: value = h * 2^-24. */
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - (int)(a >> 23);
    return (uint16_t)(sign | shift_rne(mant, shift));
}

float elem_f16_to_f32(uint16_t x)
{
    uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
    uint32_t e = (x >> 10) & 0x1fu;
    uint32_t m = x & 0x3ffu;
    if (e == 0) {
        float v = (float)m * 0x1p-24f; /* exact: m < 2^10 */
        return bits_f32(f32_bits(v) | sign);
    }
    if (e == 31)
        return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* ---- fp8 e4m3fn ---------------------------------------------------------- */

uint8_t elem_f32_to_e4m3(float x)
{
    uint32_t u = f32_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return 0x7f;
    if (a >= 0x43e00000u) /* >= 448 (and inf): saturate */
        return (uint8_t)(sign | 0x7e);
    int e = (int)(a >> 23) - 127;
    if (e >= -6) {
        uint32_t code = ((uint32_t)(e + 7) << 3) | ((a & 0x7fffffu) >> 20);
        uint32_t rem = a & 0xfffffu;
        if (rem > 0x80000u || (rem == 0x80000u && (code & 1u)))
            code++;
        if (code > 0x7eu)
            code = 0x7e;
        return (uint8_t)(sign | code);
    }
    /* Subnormal: value = m * 2^-9, m in 0..7 (8 is the smallest normal). */
    if (a < 0x3a000000u) /* < 2^-11: below a quarter of the smallest step, rounds to 0 */
        return sign;
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    int shift = 14 - e; /* value = mant * 2^(e-23); m = mant * 2^(e-23+9) */
    return (uint8_t)(sign | shift_rne(mant, shift));
}

float elem_e4m3_to_f32(uint8_t code)
{
    int e = (code >> 3) & 0xf;
    int m = code & 7;
    float v;
    if (e == 15 && m == 7)
        return NAN;
    if (e == 0)
        v = ldexpf((float)m, -9);
    else
        v = ldexpf((float)(8 + m), e - 10);
    return (code & 0x80) ? -v : v;
}

/* ---- e2m1 --------------------------------------------------------------- */

static const float e2m1_values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

uint8_t elem_f32_to_e2m1(float x)
{
    /* Midpoints between neighbouring codes; at a midpoint the even code wins. */
    static const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    if (isnan(x))
        return 0;
    float a = fabsf(x);
    uint8_t c = 0;
    while (c < 7 && a > mid[c])
        c++;
    if (c < 7 && a == mid[c] && (c & 1u))
        c++;
    return (uint8_t)(c | (signbit(x) ? 8u : 0u));
}

float elem_e2m1_to_f32(uint8_t code)
{
    float v = e2m1_values[code & 7];
    return (code & 8) ? -v : v;
}

/* ---- activations -------------------------------------------------------- */

int elem_is_act_dtype(msa_dtype dtype)
{
    return dtype == MSA_DTYPE_FP32 || dtype == MSA_DTYPE_BF16 || dtype == MSA_DTYPE_FP16;
}

void elem_from_f32(void *dst, msa_dtype dtype, const float *src, int64_t n)
{
    if (n <= 0)
        return; /* empty tensors may come with NULL pointers */
    if (dtype == MSA_DTYPE_FP32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dtype == MSA_DTYPE_BF16) {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = elem_f32_to_bf16(src[i]);
    } else if (dtype == MSA_DTYPE_FP16) {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = elem_f32_to_f16(src[i]);
    }
}

void elem_to_f32(float *dst, msa_dtype dtype, const void *src, int64_t n)
{
    if (n <= 0)
        return;
    if (dtype == MSA_DTYPE_FP32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dtype == MSA_DTYPE_BF16) {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = elem_bf16_to_f32(s[i]);
    } else if (dtype == MSA_DTYPE_FP16) {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = elem_f16_to_f32(s[i]);
    }
}

void elem_round_f32(float *x, msa_dtype dtype, int64_t n)
{
    if (dtype == MSA_DTYPE_BF16) {
        for (int64_t i = 0; i < n; i++)
            x[i] = elem_bf16_to_f32(elem_f32_to_bf16(x[i]));
    } else if (dtype == MSA_DTYPE_FP16) {
        for (int64_t i = 0; i < n; i++)
            x[i] = elem_f16_to_f32(elem_f32_to_f16(x[i]));
    }
}

/* ---- planes ------------------------------------------------------------- */

size_t elem_plane_bytes(msa_dtype dtype, int64_t units, int64_t unit_elems)
{
    if (dtype == MSA_DTYPE_NVFP4) {
        if (unit_elems % 16 != 0)
            return 0;
        return (size_t)(units * (unit_elems / 2 + unit_elems / 16));
    }
    return (size_t)(units * unit_elems) * msa_dtype_size(dtype);
}

double elem_bytes_per_value(msa_dtype dtype)
{
    if (dtype == MSA_DTYPE_NVFP4)
        return 0.5 + 1.0 / 16.0;
    return (double)msa_dtype_size(dtype);
}

/* One group of 16 values of an nvfp4 region (SPEC 8). */
static void nvfp4_encode_group(const float *x, float global, uint8_t *codes16, uint8_t *scale_out)
{
    float amax = 0.0f;
    for (int i = 0; i < 16; i++)
        if (fabsf(x[i]) > amax)
            amax = fabsf(x[i]);
    float s = amax / (6.0f * global);
    if (s > 448.0f)
        s = 448.0f;
    uint8_t sc = elem_f32_to_e4m3(s);
    float sv = elem_e4m3_to_f32(sc);
    *scale_out = sc;
    for (int i = 0; i < 16; i++)
        codes16[i] = sv == 0.0f ? 0 : elem_f32_to_e2m1(x[i] / (sv * global));
}

void elem_encode_plane(void *dst, msa_dtype dtype, const float *src, int64_t units,
                       int64_t unit_elems, float scale)
{
    int64_t n = units * unit_elems;
    if (elem_is_act_dtype(dtype)) {
        elem_from_f32(dst, dtype, src, n);
    } else if (dtype == MSA_DTYPE_FP8_E4M3) {
        uint8_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = elem_f32_to_e4m3(src[i] / scale);
    } else if (dtype == MSA_DTYPE_NVFP4) {
        uint8_t *d = dst;
        int64_t data_bytes = unit_elems / 2;
        int64_t unit_bytes = data_bytes + unit_elems / 16;
        for (int64_t u = 0; u < units; u++) {
            const float *x = src + u * unit_elems;
            uint8_t *codes = d + u * unit_bytes;
            uint8_t *scales = codes + data_bytes;
            for (int64_t g = 0; g < unit_elems / 16; g++) {
                uint8_t c[16];
                nvfp4_encode_group(x + g * 16, scale, c, &scales[g]);
                for (int i = 0; i < 8; i++)
                    codes[g * 8 + i] = (uint8_t)(c[2 * i] | (c[2 * i + 1] << 4));
            }
        }
    }
}

void elem_decode_plane(float *dst, msa_dtype dtype, const void *src, int64_t units,
                       int64_t unit_elems, float scale)
{
    int64_t n = units * unit_elems;
    if (elem_is_act_dtype(dtype)) {
        elem_to_f32(dst, dtype, src, n);
    } else if (dtype == MSA_DTYPE_FP8_E4M3) {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = elem_e4m3_to_f32(s[i]) * scale;
    } else if (dtype == MSA_DTYPE_NVFP4) {
        const uint8_t *s = src;
        int64_t data_bytes = unit_elems / 2;
        int64_t unit_bytes = data_bytes + unit_elems / 16;
        for (int64_t u = 0; u < units; u++) {
            const uint8_t *codes = s + u * unit_bytes;
            const uint8_t *scales = codes + data_bytes;
            for (int64_t e = 0; e < unit_elems; e++) {
                uint8_t c = (uint8_t)((codes[e / 2] >> ((e & 1) * 4)) & 0xf);
                dst[u * unit_elems + e] =
                    elem_e2m1_to_f32(c) * elem_e4m3_to_f32(scales[e / 16]) * scale;
            }
        }
    }
}
