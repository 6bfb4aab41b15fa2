/* De-quantization of fp8_e4m3 and nvfp4 rows (SPEC 8's read rule) on
 * vector registers, compiled once per instruction-set level: included by
 * cpu_level.h only.  Every value is the one msa_fp8_dequantize and
 * msa_nvfp4_dequantize (src/core/quant.c) compute, bit for bit, NaNs
 * included; only the instructions differ.
 *
 * fp8 e4m3 through the half-precision converter: a code S.EEEE.MMM
 * placed as the fp16 bits S.0EEEE.MMM0000000 is the e4m3 value times
 * 2^-8, subnormals included (E = 0 is an fp16 subnormal with the same
 * mantissa), and vcvtph2ps widens it exactly.  Multiplying by 256 * scale
 * (exact: a power of two) rounds the exact product code * scale once, as
 * the scalar code does.  The only code that differs is S.1111.111, NaN in
 * e4m3 and 1.875 as fp16: those lanes become sign | 0x7fc00000, the NaN
 * that the scalar code's product carries.
 *
 * nvfp4: the 16 values a group can take, e2m1(c) * s * global in that
 * order, are one vector; the codes pick lanes of it with a permute. */

#include "cpu/cpu_nvfp4_table.h"

/* Whether 256 * scale stays finite, so that the fp16 route above is exact. */
static inline int dq_fp8_fast_scale(float scale)
{
    return scale * 256.0f <= 3.0e38f;
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define MSA_CPU_DQ_FP8_LANES 16

/* The 16 codes raw as fp32 values code * scale (s256 = 256 * scale),
 * the NaN codes as 480 * scale with their sign.  Sign-extended to 16 bits
 * and shifted left by 7, a code has its sign at bits 15 and 14 and its
 * other bits at 7..13: clearing bit 14 leaves the fp16 bits of the code
 * times 2^-8. */
static inline __m512 dq_fp8x16_no_nan(__m128i raw, __m512 s256)
{
    const __m256i b = _mm256_slli_epi16(_mm256_cvtepi8_epi16(raw), 7);
    const __m256i h = _mm256_and_si256(b, _mm256_set1_epi16((short)0xbfff));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), s256);
}

/* 16 e4m3 codes at src as fp32 values code * scale; s256 = 256 * scale. */
static inline __m512 dq_fp8x16(const uint8_t *src, __m512 s256)
{
    const __m128i raw = _mm_loadu_si128((const __m128i *)src);
    const __m512 f = dq_fp8x16_no_nan(raw, s256);
    const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_or_si128(raw, _mm_set1_epi8((char)0x80)),
                                              _mm_set1_epi8((char)0xff));
    /* NaN lanes: (f & sign) | quiet NaN. */
    return _mm512_castsi512_ps(_mm512_mask_ternarylogic_epi32(_mm512_castps_si512(f), nan,
                                                              _mm512_set1_epi32(INT32_MIN),
                                                              _mm512_set1_epi32(0x7fc00000), 0xea));
}
#elif defined(__AVX2__) && defined(__F16C__)
#define MSA_CPU_DQ_FP8_LANES 8

/* dq_fp8x16_no_nan on the 8 codes of the low half of raw. */
static inline __m256 dq_fp8x8_no_nan(__m128i raw, __m256 s256)
{
    const __m128i b = _mm_slli_epi16(_mm_cvtepi8_epi16(raw), 7);
    const __m128i h = _mm_and_si128(b, _mm_set1_epi16((short)0xbfff));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), s256);
}

/* 8 e4m3 codes at src as fp32 values code * scale; s256 = 256 * scale. */
static inline __m256 dq_fp8x8(const uint8_t *src, __m256 s256)
{
    const __m128i raw = _mm_loadl_epi64((const __m128i *)src);
    const __m256 f = dq_fp8x8_no_nan(raw, s256);
    /* NaN codes: all ones once the sign bit is set; the byte masks are
     * sign-extended to the lanes. */
    const __m128i nan8 =
        _mm_cmpeq_epi8(_mm_or_si128(raw, _mm_set1_epi8((char)0x80)), _mm_set1_epi8((char)0xff));
    const __m256 nan = _mm256_castsi256_ps(_mm256_cvtepi8_epi32(nan8));
    const __m256 qnan = _mm256_or_ps(_mm256_and_ps(f, _mm256_set1_ps(-0.0f)),
                                     _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
    return _mm256_blendv_ps(f, qnan, nan);
}
#else
#define MSA_CPU_DQ_FP8_LANES 0
#endif

/* dst[i] = e4m3(src[i]) * scale for i < n. */
static void dq_fp8_row(float *restrict dst, const uint8_t *restrict src, int64_t n, float scale)
{
    int64_t i = 0;
#if MSA_CPU_DQ_FP8_LANES == 16
    if (dq_fp8_fast_scale(scale)) {
        const __m512 s256 = _mm512_set1_ps(scale * 256.0f);
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(dst + i, dq_fp8x16(src + i, s256));
    }
#elif MSA_CPU_DQ_FP8_LANES == 8
    if (dq_fp8_fast_scale(scale)) {
        const __m256 s256 = _mm256_set1_ps(scale * 256.0f);
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, dq_fp8x8(src + i, s256));
    }
#endif
    if (i < n)
        msa_fp8_dequantize(dst + i, src + i, n - i, scale);
}

#if defined(__AVX2__)
/* The low (even element) and high (odd element) nibbles of code bytes b. */
static inline void dq_nvfp4_nibbles(__m128i b, __m128i *lo, __m128i *hi)
{
    *lo = _mm_and_si128(b, _mm_set1_epi8(0x0f));
    *hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f));
}

/* The 16 E2M1 codes of a group (eight bytes, the low nibble the even
 * element) as 16 bytes, element order. */
static inline __m128i dq_nvfp4_codes16(const uint8_t *codes)
{
    __m128i lo, hi;
    dq_nvfp4_nibbles(_mm_loadl_epi64((const __m128i *)codes), &lo, &hi);
    return _mm_unpacklo_epi8(lo, hi);
}

/* The same for two groups (16 bytes): 32 bytes, element order. */
static inline __m256i dq_nvfp4_codes32(const uint8_t *codes)
{
    __m128i lo, hi;
    dq_nvfp4_nibbles(_mm_loadu_si128((const __m128i *)codes), &lo, &hi);
    return _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
}
#endif

#if defined(__AVX512F__)
/* The 16 E2M1 values in code order (bit 3 the sign). */
static inline __m512 dq_e2m1x16(void)
{
    return _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f,
                          -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
}
#endif

/* n elements (a multiple of 16) of nvfp4: codes[n / 2], one E4M3 group
 * scale per 16 elements, the layer's global scale. */
static void dq_nvfp4_row(float *restrict dst, const uint8_t *restrict codes,
                         const uint8_t *restrict group_scales, int64_t n, float global)
{
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    const __m512 e2m1 = dq_e2m1x16();
    const __m512 gv = _mm512_set1_ps(global);
    for (int64_t g = 0; g < n / MSA_NVFP4_GROUP; g++) {
        /* The group's 16 values, e2m1(code) * scale * global in that order. */
        const __m512 v =
            _mm512_mul_ps(_mm512_mul_ps(e2m1, _mm512_set1_ps(msa_e4m3_to_f32(group_scales[g]))),
                          gv);
        const __m512i idx =
            _mm512_cvtepu8_epi32(dq_nvfp4_codes16(codes + g * (MSA_NVFP4_GROUP / 2)));
        _mm512_storeu_ps(dst + g * MSA_NVFP4_GROUP, _mm512_permutexvar_ps(idx, v));
    }
#elif defined(__AVX2__)
    const __m256 pos = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256 neg = _mm256_setr_ps(-0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
    const __m256 gv = _mm256_set1_ps(global);
    for (int64_t g = 0; g < n / MSA_NVFP4_GROUP; g++) {
        const __m256 s = _mm256_set1_ps(msa_e4m3_to_f32(group_scales[g]));
        const __m256 vp = _mm256_mul_ps(_mm256_mul_ps(pos, s), gv);
        const __m256 vn = _mm256_mul_ps(_mm256_mul_ps(neg, s), gv);
        const __m128i c = dq_nvfp4_codes16(codes + g * (MSA_NVFP4_GROUP / 2));
        for (int half = 0; half < 2; half++) {
            const __m256i idx = _mm256_cvtepu8_epi32(half ? _mm_srli_si128(c, 8) : c);
            /* bit 3 (the sign) picks the table; vpermps reads the low 3 bits */
            const __m256 sign = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
            const __m256 x = _mm256_blendv_ps(_mm256_permutevar8x32_ps(vp, idx),
                                              _mm256_permutevar8x32_ps(vn, idx), sign);
            _mm256_storeu_ps(dst + g * MSA_NVFP4_GROUP + 8 * half, x);
        }
    }
#else
    msa_nvfp4_dequantize(dst, codes, group_scales, n, global);
#endif
}

/* Rows [j0, j0 + n) of one head of a quantized plane, de-quantized into
 * dst[n][dim]: the rows of one page and head are consecutive in both
 * arrays of the region, so a run within a page is one call. */
static void level_dequant_rows(float *dst, const cpu_plane *plane, const int32_t *page_row,
                               int32_t head, int64_t j0, int32_t n)
{
    const int32_t P = plane->page_size, dim = plane->dim;
    int32_t i = 0;
    while (i < n) {
        const int64_t j = j0 + i;
        const int32_t off = (int32_t)(j % P);
        const int32_t run = P - off < n - i ? P - off : n - i;
        const int32_t page = page_row[j / P];
        if (plane->dtype == MSA_DTYPE_NVFP4) {
            const uint8_t *codes, *scales;
            cpu_plane_nvfp4_row(plane, page, head, off, &codes, &scales);
            dq_nvfp4_row(dst + (int64_t)i * dim, codes, scales, (int64_t)run * dim, plane->scale);
        } else {
            dq_fp8_row(dst + (int64_t)i * dim,
                       (const uint8_t *)cpu_plane_row(plane, page, head, off), (int64_t)run * dim,
                       plane->scale);
        }
        i += run;
    }
}

#if MSA_CPU_DQ_FP8_LANES == 16 && MSA_CPU_HAVE_BF16_DOT
#define MSA_CPU_DQ_FP8_BF16 1
/* fp8 e4m3 as bf16, for the bf16 dot-product kernels: every e4m3 value
 * has at most four significant bits and its exponent fits bf16's, so the
 * code times 2^-8 (the fp16 route above, widened exactly) is exact in
 * bf16 and its upper half is that bf16.  The scale of the plane, times
 * 256, is applied to the fp32 sums instead of to each element. */

/* 16 e4m3 codes at src as the bf16 values code * 2^-8; NaN codes become
 * the quiet bf16 NaN of their sign. */
static inline __m256i dq_fp8x16_bf16(const uint8_t *src)
{
    const __m128i raw = _mm_loadu_si128((const __m128i *)src);
    const __m256i b = _mm256_slli_epi16(_mm256_cvtepu8_epi16(raw), 7);
    const __m256i h = _mm256_add_epi16(b, _mm256_and_si256(b, _mm256_set1_epi16(0x4000)));
    const __m512i f = _mm512_castps_si512(_mm512_cvtph_ps(h));
    const __m256i r = _mm512_cvtepi32_epi16(_mm512_srli_epi32(f, 16));
    const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_or_si128(raw, _mm_set1_epi8((char)0x80)),
                                              _mm_set1_epi8((char)0xff));
    const __m256i qnan = _mm256_or_si256(_mm256_and_si256(r, _mm256_set1_epi16((short)0x8000)),
                                         _mm256_set1_epi16(0x7fc0));
    return _mm256_mask_blend_epi16(nan, r, qnan);
}

/* The bf16 forms of codes 0..127 (dq_fp8x16_bf16's values; code 0x7f
 * the quiet NaN) as the four 32-entry word tables that two-source word
 * permutes read: codes 0-31, 32-63, 64-95, 96-127. */
static inline void dq_fp8_bf16_tables(__m512i t[4])
{
    uint8_t codes[128];
    for (int c = 0; c < 128; c++)
        codes[c] = (uint8_t)c;
    for (int k = 0; k < 4; k++)
        t[k] = _mm512_inserti64x4(_mm512_castsi256_si512(dq_fp8x16_bf16(codes + 32 * k)),
                                  dq_fp8x16_bf16(codes + 32 * k + 16), 1);
}

/* 32 e4m3 codes at src as dq_fp8x16_bf16 makes them, by table: the low
 * six bits of a code pick a word of two tables (one two-source permute
 * per half of the codes), bit 6 picks the half, and bit 7 is the sign.
 * Eight instructions for 32 codes, where the conversion route takes 26. */
static inline __m512i dq_fp8x32_bf16_lut(const uint8_t *src, const __m512i t[4])
{
    const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)src));
    const __m512i lo = _mm512_permutex2var_epi16(t[0], w, t[1]);
    const __m512i hi = _mm512_permutex2var_epi16(t[2], w, t[3]);
    const __m512i m =
        _mm512_mask_blend_epi16(_mm512_test_epi16_mask(w, _mm512_set1_epi16(0x40)), lo, hi);
    /* m | (w << 8 & 0x8000): the code's sign on its magnitude's value */
    return _mm512_ternarylogic_epi32(m, _mm512_slli_epi16(w, 8), _mm512_set1_epi16((short)0x8000),
                                     0xf8);
}

/* Rows [j0, j0 + n) of one head of an fp8_e4m3 plane into dst[n][dim] as
 * the bf16 values code * 2^-8 (dim a multiple of 16; a run of rows within
 * a page is one block of codes, as in level_dequant_rows). */
static void level_fp8_rows_bf16(uint16_t *dst, const cpu_plane *plane, const int32_t *page_row,
                                int32_t head, int64_t j0, int32_t n)
{
    const int32_t P = plane->page_size, dim = plane->dim;
    __m512i t[4];
    dq_fp8_bf16_tables(t);
    int32_t i = 0;
    while (i < n) {
        const int64_t j = j0 + i;
        const int32_t off = (int32_t)(j % P);
        const int32_t run = P - off < n - i ? P - off : n - i;
        const uint8_t *src = cpu_plane_row(plane, page_row[j / P], head, off);
        uint16_t *d = dst + (int64_t)i * dim;
        const int64_t len = (int64_t)run * dim;
        int64_t e = 0;
        for (; e + 32 <= len; e += 32)
            _mm512_storeu_si512((void *)(d + e), dq_fp8x32_bf16_lut(src + e, t));
        if (e < len) /* 16 codes left (len is a multiple of 16) */
            _mm256_storeu_si256((__m256i *)(d + e), dq_fp8x16_bf16(src + e));
        i += run;
    }
}

/* nvfp4 as bf16 for the same kernels: each element e2m1(code) times its
 * group scale, exact in bf16 (cpu_nvfp4_table.h); the plane's global scale
 * multiplies the fp32 sums instead, as fp8's scale does.  Two groups at a
 * time: their scales' 16-entry rows of the table side by side, and one
 * permute of 32 words by the codes (the second group's indexes + 16). */
static void level_nvfp4_rows_bf16(uint16_t *dst, const cpu_plane *plane, const int32_t *page_row,
                                  int32_t head, int64_t j0, int32_t n)
{
    const int32_t P = plane->page_size, dim = plane->dim, ngroups = dim / MSA_NVFP4_GROUP;
    const uint16_t *tab = msa_cpu_nvfp4_bf16_table();
    const __m512i second = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(16), 1);
    for (int32_t i = 0; i < n; i++) {
        const int64_t j = j0 + i;
        const uint8_t *codes, *scales;
        cpu_plane_nvfp4_row(plane, page_row[j / P], head, (int32_t)(j % P), &codes, &scales);
        uint16_t *d = dst + (int64_t)i * dim;
        int32_t g = 0;
        for (; g + 2 <= ngroups; g += 2) {
            const __m512i t = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(tab + scales[g] * 16))),
                _mm256_loadu_si256((const __m256i *)(tab + scales[g + 1] * 16)), 1);
            const __m512i idx =
                _mm512_or_si512(_mm512_cvtepu8_epi16(dq_nvfp4_codes32(codes + g * 8)), second);
            _mm512_storeu_si512((void *)(d + g * MSA_NVFP4_GROUP),
                                _mm512_permutexvar_epi16(idx, t));
        }
        if (g < ngroups) { /* an odd last group */
            const __m256i t = _mm256_loadu_si256((const __m256i *)(tab + scales[g] * 16));
            const __m256i idx = _mm256_cvtepu8_epi16(dq_nvfp4_codes16(codes + g * 8));
            _mm256_storeu_si256((__m256i *)(d + g * MSA_NVFP4_GROUP),
                                _mm256_permutexvar_epi16(idx, t));
        }
    }
}
#else
#define MSA_CPU_DQ_FP8_BF16 0
#endif
