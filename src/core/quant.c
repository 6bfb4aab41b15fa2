/* Quantized cache formats (SPEC section 8), bit-level so that the results
 * do not depend on the FPU rounding mode; plus the public row helpers. */
#include "core/quant.h"

#include "core/internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- E4M3 (OCP e4m3fn: bias 7, no infinities, S.1111.111 is NaN) ------- */

float msa_e4m3_to_f32(uint8_t code)
{
    const uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    const uint32_t exp = (code >> 3) & 0xfu, man = code & 7u;
    if (exp == 0xf && man == 7)
        return msa_bits_f32(sign | 0x7fc00000u);
    if (exp == 0) /* subnormal: man * 2^-9, exact in fp32 */
        return msa_bits_f32(sign | msa_f32_bits((float)man * (1.0f / 512.0f)));
    /* normal: rebias 7 -> 127, the 3 mantissa bits on top of fp32's 23 */
    return msa_bits_f32(sign | (exp + 120u) << 23 | man << 20);
}

uint8_t msa_f32_to_e4m3(float x)
{
    const uint32_t u = msa_f32_bits(x);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return 0x7f;
    if (a >= 0x43e00000u) /* 448 and above, +-inf included: saturate */
        return (uint8_t)(sign | 0x7eu);
    if (a < 0x3c800000u) {
        /* below the smallest normal 2^-6: units of 2^-9, rounded to even.
         * a * 512 is exact; 8 units is the smallest normal's code. */
        const float t = msa_bits_f32(a) * 512.0f;
        uint32_t q = (uint32_t)t;
        const float frac = t - (float)q;
        if (frac > 0.5f || (frac == 0.5f && (q & 1u)))
            q++;
        return (uint8_t)(sign | q);
    }
    /* normal: keep 3 mantissa bits, round to even; a carry moves into the
     * exponent, which is the next code.  Values below 448 round to at most
     * 448 (code 0x7e), since 448 < a < 464 rounds down and a >= 448 left
     * above. */
    const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
    return (uint8_t)(sign | ((r >> 20) - (120u << 3)));
}

/* ---- E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives --------------- */

float msa_e2m1_to_f32(uint8_t code)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float v = mag[code & 7u];
    return (code & 8u) ? -v : v;
}

uint8_t msa_f32_to_e2m1(float x)
{
    if (isnan(x))
        return 0;
    const float a = fabsf(x);
    /* Midpoints between neighbours; at a midpoint the even code wins
     * (0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
     * 5 -> 4); beyond 5 everything saturates to 6. */
    uint8_t c;
    if (a <= 0.25f)
        c = 0;
    else if (a < 0.75f)
        c = 1;
    else if (a <= 1.25f)
        c = 2;
    else if (a < 1.75f)
        c = 3;
    else if (a <= 2.5f)
        c = 4;
    else if (a < 3.5f)
        c = 5;
    else if (a <= 5.0f)
        c = 6;
    else
        c = 7;
    return (uint8_t)(c | (signbit(x) ? 8u : 0u));
}

/* ---- rows ----------------------------------------------------------------- */

void msa_fp8_quantize(uint8_t *dst, const float *src, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = msa_f32_to_e4m3(src[i] / scale);
}

void msa_fp8_dequantize(float *dst, const uint8_t *src, int64_t n, float scale)
{
    if (n < 1024) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = msa_e4m3_to_f32(src[i]) * scale;
        return;
    }
    /* Long runs: a table of the 256 products, each computed as above. */
    float lut[256];
    for (int c = 0; c < 256; c++)
        lut[c] = msa_e4m3_to_f32((uint8_t)c) * scale;
    for (int64_t i = 0; i < n; i++)
        dst[i] = lut[src[i]];
}

/* One group of 16, SPEC 8: scale = e4m3_nearest(min(amax / (6 * global),
 * 448)); a zero scale gives all-zero codes; else each code is the E2M1
 * point nearest x / (scale * global).  The float operations are the ones
 * SPEC writes, in its order. */
static void nvfp4_group(uint8_t *codes8, uint8_t *scale_byte, const float *x, float global)
{
    float amax = 0.0f;
    int nan = 0;
    for (int e = 0; e < MSA_NVFP4_GROUP; e++) {
        if (isnan(x[e]))
            nan = 1;
        else if (fabsf(x[e]) > amax)
            amax = fabsf(x[e]);
    }
    if (nan) { /* the whole group reads NaN */
        *scale_byte = 0x7f;
        memset(codes8, 0, MSA_NVFP4_GROUP / 2);
        return;
    }
    float want = amax / (6.0f * global);
    if (want > 448.0f)
        want = 448.0f;
    const uint8_t sb = msa_f32_to_e4m3(want);
    const float s = msa_e4m3_to_f32(sb);
    *scale_byte = sb;
    if (s == 0.0f) {
        memset(codes8, 0, MSA_NVFP4_GROUP / 2);
        return;
    }
    const float denom = s * global;
    for (int e = 0; e < MSA_NVFP4_GROUP; e += 2)
        codes8[e / 2] =
            (uint8_t)(msa_f32_to_e2m1(x[e] / denom) | msa_f32_to_e2m1(x[e + 1] / denom) << 4);
}

void msa_nvfp4_quantize(uint8_t *codes, uint8_t *group_scales, const float *src, int64_t n,
                        float global)
{
    for (int64_t g = 0; g < n / MSA_NVFP4_GROUP; g++)
        nvfp4_group(codes + g * (MSA_NVFP4_GROUP / 2), group_scales + g, src + g * MSA_NVFP4_GROUP,
                    global);
}

void msa_nvfp4_dequantize(float *dst, const uint8_t *codes, const uint8_t *group_scales, int64_t n,
                          float global)
{
    float e2m1[16];
    for (int c = 0; c < 16; c++)
        e2m1[c] = msa_e2m1_to_f32((uint8_t)c);
    for (int64_t g = 0; g < n / MSA_NVFP4_GROUP; g++) {
        const float s = msa_e4m3_to_f32(group_scales[g]);
        /* The group's 16 values, e2m1(code) * scale * global in that order. */
        float v[16];
        for (int c = 0; c < 16; c++)
            v[c] = e2m1[c] * s * global;
        const uint8_t *c = codes + g * (MSA_NVFP4_GROUP / 2);
        float *d = dst + g * MSA_NVFP4_GROUP;
        for (int e = 0; e < MSA_NVFP4_GROUP; e += 2) {
            d[e] = v[c[e / 2] & 0xfu];
            d[e + 1] = v[c[e / 2] >> 4];
        }
    }
}

/* ---- public helpers --------------------------------------------------------- */

/* Sets the context's message when there is a context; the status either way. */
static msa_status helper_error(msa_context *ctx, msa_status st, const char *what)
{
    if (ctx)
        return msa_set_error(ctx, st, "%s", what);
    return st;
}

static int is_act(msa_dtype d)
{
    return d == MSA_DTYPE_FP32 || d == MSA_DTYPE_BF16 || d == MSA_DTYPE_FP16;
}

static msa_status check_rows_args(msa_context *ctx, const char *fn, msa_dtype dtype, float scale,
                                  const void *a, msa_dtype act, int64_t rows, int32_t dim,
                                  const void *b, const void *group_scales)
{
    char msg[200];
    if (dtype != MSA_DTYPE_FP8_E4M3 && dtype != MSA_DTYPE_NVFP4) {
        snprintf(msg, sizeof msg, "%s: dtype %d is not a quantized format (fp8_e4m3, nvfp4)", fn,
                 (int)dtype);
        return helper_error(ctx, MSA_ERR_INVALID_ARGUMENT, msg);
    }
    if (!is_act(act)) {
        snprintf(msg, sizeof msg, "%s: the activation dtype must be fp32, bf16 or fp16 (got %d)",
                 fn, (int)act);
        return helper_error(ctx, MSA_ERR_INVALID_ARGUMENT, msg);
    }
    if (!(scale > 0.0f) || isinf(scale)) {
        snprintf(msg, sizeof msg, "%s: scale must be finite and positive (got %g)", fn,
                 (double)scale);
        return helper_error(ctx, MSA_ERR_INVALID_ARGUMENT, msg);
    }
    if (rows < 0 || dim < 1) {
        snprintf(msg, sizeof msg, "%s: rows must be >= 0 and dim >= 1 (got %lld, %d)", fn,
                 (long long)rows, dim);
        return helper_error(ctx, MSA_ERR_INVALID_ARGUMENT, msg);
    }
    if (dtype == MSA_DTYPE_NVFP4 && dim % MSA_NVFP4_GROUP != 0) {
        snprintf(msg, sizeof msg, "%s: nvfp4 rows need dim a multiple of 16 (got %d)", fn, dim);
        return helper_error(ctx, MSA_ERR_INVALID_ARGUMENT, msg);
    }
    if (rows > 0 && (!a || !b || (dtype == MSA_DTYPE_NVFP4 && !group_scales))) {
        snprintf(msg, sizeof msg, "%s: NULL data pointer", fn);
        return helper_error(ctx, MSA_ERR_INVALID_ARGUMENT, msg);
    }
    if ((double)rows * dim > (double)(INT64_C(1) << 50)) {
        snprintf(msg, sizeof msg, "%s: %lld rows of %d elements is too many", fn, (long long)rows,
                 dim);
        return helper_error(ctx, MSA_ERR_INVALID_ARGUMENT, msg);
    }
    return MSA_OK;
}

msa_status msa_quantize_rows(msa_context *ctx, msa_dtype dtype, float scale, const void *src,
                             msa_dtype src_dtype, int64_t rows, int32_t dim, void *codes,
                             void *group_scales)
{
    msa_status st = check_rows_args(ctx, "msa_quantize_rows", dtype, scale, src, src_dtype, rows,
                                    dim, codes, group_scales);
    if (st != MSA_OK)
        return st;
    const size_t es = msa_dtype_size(src_dtype);
    float tmp[1024];
    for (int64_t r = 0; r < rows; r++) {
        const char *s = (const char *)src + r * dim * (int64_t)es;
        /* Pieces of whole groups, so that no group is split. */
        for (int32_t d0 = 0; d0 < dim; d0 += 1024) {
            const int32_t n = dim - d0 < 1024 ? dim - d0 : 1024;
            msa_convert_to_f32(tmp, s + (int64_t)d0 * (int64_t)es, src_dtype, n);
            if (dtype == MSA_DTYPE_FP8_E4M3)
                msa_fp8_quantize((uint8_t *)codes + r * dim + d0, tmp, n, scale);
            else
                msa_nvfp4_quantize((uint8_t *)codes + (r * dim + d0) / 2,
                                   (uint8_t *)group_scales + (r * dim + d0) / MSA_NVFP4_GROUP, tmp,
                                   n, scale);
        }
    }
    if (ctx)
        msa_clear_error(ctx);
    return MSA_OK;
}

msa_status msa_dequantize_rows(msa_context *ctx, msa_dtype dtype, float scale, const void *codes,
                               const void *group_scales, int64_t rows, int32_t dim, void *dst,
                               msa_dtype dst_dtype)
{
    msa_status st = check_rows_args(ctx, "msa_dequantize_rows", dtype, scale, codes, dst_dtype,
                                    rows, dim, dst, group_scales);
    if (st != MSA_OK)
        return st;
    const size_t es = msa_dtype_size(dst_dtype);
    float tmp[1024];
    for (int64_t r = 0; r < rows; r++) {
        char *d = (char *)dst + r * dim * (int64_t)es;
        for (int32_t d0 = 0; d0 < dim; d0 += 1024) {
            const int32_t n = dim - d0 < 1024 ? dim - d0 : 1024;
            if (dtype == MSA_DTYPE_FP8_E4M3)
                msa_fp8_dequantize(tmp, (const uint8_t *)codes + r * dim + d0, n, scale);
            else
                msa_nvfp4_dequantize(tmp, (const uint8_t *)codes + (r * dim + d0) / 2,
                                     (const uint8_t *)group_scales +
                                         (r * dim + d0) / MSA_NVFP4_GROUP,
                                     n, scale);
            msa_convert_from_f32(d + (int64_t)d0 * (int64_t)es, dst_dtype, tmp, n);
        }
    }
    if (ctx)
        msa_clear_error(ctx);
    return MSA_OK;
}
