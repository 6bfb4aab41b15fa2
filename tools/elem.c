#include "elem.h"

#include "testkit_internal.h"

#include <math.h>
#include <string.h>

/* The scalar formats are the test kit's (tests/testkit_formats.c), written
 * from the spec independently of the library: replay converts files with
 * the same code that the tests trust. */

uint16_t elem_f32_to_bf16(float x)
{
    return tk_f32_to_bf16(x);
}
float elem_bf16_to_f32(uint16_t x)
{
    return tk_bf16_to_f32(x);
}
uint16_t elem_f32_to_f16(float x)
{
    return tk_f32_to_f16(x);
}
float elem_f16_to_f32(uint16_t x)
{
    return tk_f16_to_f32(x);
}
uint8_t elem_f32_to_e4m3(float x)
{
    return tk_f32_to_e4m3(x);
}
float elem_e4m3_to_f32(uint8_t code)
{
    return tk_e4m3_to_f32(code);
}
uint8_t elem_f32_to_e2m1(float x)
{
    return (uint8_t)tk_f32_to_e2m1(x);
}
float elem_e2m1_to_f32(uint8_t code)
{
    return tk_e2m1_to_f32(code);
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

/* One group of 16 values of an nvfp4 region (SPEC 8), by the test kit's encoder. */
static void nvfp4_encode_group(const float *x, float global, uint8_t *codes16, uint8_t *scale_out)
{
    unsigned codes[16];
    tk_nvfp4_encode_group(x, global, scale_out, codes);
    for (int i = 0; i < 16; i++)
        codes16[i] = (uint8_t)codes[i];
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
