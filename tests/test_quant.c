/*
 * Quantized cache formats (SPEC 8) in the library: src/core/quant.c against
 * values computed here from the bit fields, against the test kit's
 * independent encoders on random data, the public row helpers
 * (msa_quantize_rows / msa_dequantize_rows) and their bad input, and the
 * cache calls with fp8_e4m3 and nvfp4 planes (create, wrap, plane bytes,
 * scales, the CUDA backend's caches).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/internal.h"
#include "core/quant.h"
#include "cpu/cpu_kernels.h"
#include "testkit_internal.h"

/* E4M3 value of a code from its fields: bias 7, subnormals at exponent 0,
 * S.1111.111 NaN, no infinities. */
static double e4m3_value(unsigned c)
{
    const int s = (c >> 7) & 1, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7)
        return NAN;
    const double mag = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return s ? -mag : mag;
}

/* E2M1 value from its fields: bias 1, one mantissa bit, subnormal 0.5. */
static double e2m1_value(unsigned c)
{
    const int s = (c >> 3) & 1, e = (c >> 1) & 3, m = c & 1;
    const double mag = e == 0 ? 0.5 * m : ldexp(2 + m, e - 2);
    return s ? -mag : mag;
}

static void test_e4m3(void)
{
    long bad_decode = 0, bad_encode = 0;
    for (unsigned c = 0; c < 256; c++) {
        const double want = e4m3_value(c);
        const float got = msa_e4m3_to_f32((uint8_t)c);
        if (isnan(want)) {
            bad_decode += !isnan(got);
            bad_encode += msa_f32_to_e4m3(got) != 0x7f;
            continue;
        }
        bad_decode += (double)got != want || !signbit(got) != !signbit(want);
        bad_encode += msa_f32_to_e4m3(got) != c; /* -0.0 included: code 0x80 */
    }
    CHECK(bad_decode == 0, "e4m3 decode: %ld of 256 codes wrong", bad_decode);
    CHECK(bad_encode == 0, "e4m3 encode of every value: %ld codes wrong", bad_encode);
    CHECK(msa_e4m3_to_f32(0x7e) == 448.0f && msa_e4m3_to_f32(0x01) == 0x1p-9f, "448, 2^-9");

    /* Midpoints between neighbours (exact in fp32) go to the even code;
     * just above or below a midpoint, to the nearer code. */
    long bad_tie = 0, bad_near = 0;
    for (unsigned c = 0; c < 0x7e; c++) {
        const float lo = msa_e4m3_to_f32((uint8_t)c), hi = msa_e4m3_to_f32((uint8_t)(c + 1));
        const float mid = (float)(((double)lo + (double)hi) / 2);
        const unsigned even = (c & 1) ? c + 1 : c;
        bad_tie += msa_f32_to_e4m3(mid) != even;
        bad_tie += msa_f32_to_e4m3(-mid) != (even | 0x80);
        bad_near += msa_f32_to_e4m3(nextafterf(mid, 0.0f)) != c;
        bad_near += msa_f32_to_e4m3(nextafterf(mid, INFINITY)) != c + 1;
    }
    CHECK(bad_tie == 0, "e4m3 ties to even: %ld wrong", bad_tie);
    CHECK(bad_near == 0, "e4m3 nearest around midpoints: %ld wrong", bad_near);

    /* Saturation, infinities, NaN, the smallest values. */
    CHECK(msa_f32_to_e4m3(464.0f) == 0x7e, "464 saturates to 448");
    CHECK(msa_f32_to_e4m3(1e9f) == 0x7e && msa_f32_to_e4m3(-1e9f) == 0xfe, "large saturate");
    CHECK(msa_f32_to_e4m3(INFINITY) == 0x7e && msa_f32_to_e4m3(-INFINITY) == 0xfe,
          "infinities saturate");
    CHECK(msa_f32_to_e4m3(FLT_MAX) == 0x7e, "FLT_MAX saturates");
    CHECK(msa_f32_to_e4m3(NAN) == 0x7f && isnan(msa_e4m3_to_f32(msa_f32_to_e4m3(-NAN))),
          "NaN stays NaN");
    CHECK(msa_f32_to_e4m3(0x1p-10f) == 0x00, "half the smallest subnormal: tie to 0");
    CHECK(msa_f32_to_e4m3(nextafterf(0x1p-10f, 1.0f)) == 0x01, "above half: 2^-9");
    CHECK(msa_f32_to_e4m3(3 * 0x1p-10f) == 0x02, "1.5 * 2^-9: tie to even 2");
    CHECK(msa_f32_to_e4m3(0x1p-40f) == 0x00 && msa_f32_to_e4m3(-0x1p-40f) == 0x80,
          "tiny values flush to signed zero");
    CHECK(msa_f32_to_e4m3(nextafterf(0x1p-6f, 0.0f)) == 0x08, "just below 2^-6 rounds up");
}

static void test_e2m1(void)
{
    long bad = 0;
    for (unsigned c = 0; c < 16; c++) {
        const float got = msa_e2m1_to_f32((uint8_t)c);
        bad += (double)got != e2m1_value(c) || !signbit(got) != !(c >= 8);
        bad += msa_f32_to_e2m1(got) != c;
    }
    CHECK(bad == 0, "e2m1: %ld of 16 codes wrong", bad);
    static const struct {
        float x;
        unsigned code;
    } ties[] = {{0.25f, 0}, {0.75f, 2}, {1.25f, 2},  {1.75f, 4},    {2.5f, 4},
                {3.5f, 6},  {5.0f, 6},  {-5.0f, 14}, {-0.25f, 8},   {0.26f, 1},
                {6.5f, 7},  {1e30f, 7}, {-7.0f, 15}, {INFINITY, 7}, {-INFINITY, 15},
                {NAN, 0},   {4.99f, 6}, {5.01f, 7},  {0.7499f, 1}};
    for (size_t i = 0; i < sizeof ties / sizeof ties[0]; i++)
        CHECK(msa_f32_to_e2m1(ties[i].x) == ties[i].code, "e2m1(%g) = %u, want %u",
              (double)ties[i].x, msa_f32_to_e2m1(ties[i].x), ties[i].code);
}

/* One group through the library: scale byte and the 16 codes. */
static void nvfp4_group(const float *x, float global, uint8_t *sb, unsigned codes[16])
{
    uint8_t packed[8];
    msa_nvfp4_quantize(packed, sb, x, 16, global);
    for (int e = 0; e < 16; e++)
        codes[e] = (packed[e / 2] >> ((e & 1) * 4)) & 0xfu;
}

static void test_nvfp4_groups(void)
{
    float x[16];
    uint8_t sb;
    unsigned codes[16];
    float back[16];

    memset(x, 0, sizeof x);
    nvfp4_group(x, 1.0f, &sb, codes);
    int zero = sb == 0;
    for (int e = 0; e < 16; e++)
        zero &= codes[e] == 0;
    CHECK(zero, "all-zero group: scale 0, codes 0");

    /* amax / (6 * global) = 1000 > 448: the scale is clamped to 448 and the
     * largest values saturate at 6 * 448 * global. */
    for (int e = 0; e < 16; e++)
        x[e] = (e % 2 ? -1.0f : 1.0f) * (float)(e + 1) * 375.0f;
    nvfp4_group(x, 1.0f, &sb, codes);
    CHECK(sb == 0x7e, "scale clamped at 448 (byte %#x)", sb);
    CHECK(codes[15] == 15 && codes[14] == 7, "largest values saturate (%u, %u)", codes[15],
          codes[14]);

    /* A tiny group: amax / 6 below half the smallest E4M3 value gives a zero
     * scale, so every code is 0. */
    for (int e = 0; e < 16; e++)
        x[e] = 1e-4f * (float)(e - 8);
    nvfp4_group(x, 1.0f, &sb, codes);
    zero = sb == 0;
    for (int e = 0; e < 16; e++)
        zero &= codes[e] == 0;
    CHECK(zero, "scale rounding to 0: all codes 0");

    /* Exact points: amax 6 at global 0.5 gives scale 2, values = code * 1. */
    static const float pts[16] = {0,     0.5f, 1,     1.5f, 2,  3,  4,  6,
                                  -0.5f, -1,   -1.5f, -2,   -3, -4, -6, 3};
    nvfp4_group(pts, 0.5f, &sb, codes);
    uint8_t packed[8];
    msa_nvfp4_quantize(packed, &sb, pts, 16, 0.5f);
    msa_nvfp4_dequantize(back, packed, &sb, 16, 0.5f);
    CHECK(sb == 0x40 && memcmp(back, pts, sizeof pts) == 0, "exact points round trip (%#x)", sb);

    /* NaN: the group's scale byte is the NaN code and all 16 values read NaN. */
    memcpy(x, pts, sizeof x);
    x[5] = NAN;
    msa_nvfp4_quantize(packed, &sb, x, 16, 1.0f);
    msa_nvfp4_dequantize(back, packed, &sb, 16, 1.0f);
    int all_nan = sb == 0x7f;
    for (int e = 0; e < 16; e++)
        all_nan &= isnan(back[e]);
    CHECK(all_nan, "a NaN makes its group read NaN");

    /* Infinity: amax = inf clamps the scale to 448, inf saturates to 6,
     * the finite values round to 0 next to it. */
    memcpy(x, pts, sizeof x);
    x[2] = -INFINITY;
    nvfp4_group(x, 1.0f, &sb, codes);
    CHECK(sb == 0x7e && codes[2] == 15 && codes[7] == 0, "infinity saturates (%#x, %u, %u)", sb,
          codes[2], codes[7]);

    /* Random groups at several global scales: the library's bytes equal
     * the test kit's independent encoder's. */
    tk_rng rng = {0x71756e74ull};
    static const float globals[] = {1.0f, 0.01f, 3.0f, 1e-3f, 250.0f};
    long bad = 0;
    for (int it = 0; it < 20000; it++) {
        const float g = globals[it % 5];
        const float mag = (float)ldexp(1.0, tk_rng_below(&rng, 30) - 15);
        for (int e = 0; e < 16; e++)
            x[e] = tk_rng_gauss(&rng) * mag * (tk_rng_below(&rng, 8) == 0 ? 20.0f : 1.0f);
        unsigned want[16];
        uint8_t want_sb;
        tk_nvfp4_encode_group(x, g, &want_sb, want);
        nvfp4_group(x, g, &sb, codes);
        int diff = sb != want_sb;
        for (int e = 0; e < 16; e++) /* zero codes may differ in sign only */
            diff |= codes[e] != want[e] && !((codes[e] & 7) == 0 && (want[e] & 7) == 0);
        bad += diff;
    }
    CHECK(bad == 0, "nvfp4 groups against the test kit: %ld of 20000 differ", bad);

    /* fp8 rows against the test kit, random magnitudes and scales. */
    bad = 0;
    for (int it = 0; it < 200000; it++) {
        const float s = globals[it % 5];
        const float v = tk_rng_gauss(&rng) * (float)ldexp(1.0, tk_rng_below(&rng, 40) - 20);
        uint8_t got;
        msa_fp8_quantize(&got, &v, 1, s);
        const uint8_t want = tk_f32_to_e4m3(v / s);
        bad += got != want && !((got & 0x7f) == 0 && (want & 0x7f) == 0);
    }
    CHECK(bad == 0, "fp8 against the test kit: %ld of 200000 differ", bad);
}

static void test_helpers(void)
{
    msa_context *ctx = NULL;
    msa_context_params cp;
    msa_context_params_default(&cp);
    cp.num_threads = 1;
    CHECK(msa_context_create(&cp, &ctx, NULL, 0) == MSA_OK, "context");
    if (!ctx)
        return;
    enum { ROWS = 5, DIM = 48 };
    float src[ROWS * DIM];
    uint16_t src_bf16[ROWS * DIM];
    tk_rng rng = {0x68656c70ull};
    for (int i = 0; i < ROWS * DIM; i++) {
        src[i] = tk_rng_gauss(&rng) * (i % DIM == 3 ? 30.0f : 1.0f);
        src_bf16[i] = tk_f32_to_bf16(src[i]);
    }

    /* fp8 round trip from bf16 activations: codes = e4m3(x / s), back =
     * code * s as fp32. */
    uint8_t codes[ROWS * DIM];
    float back[ROWS * DIM];
    const float s8 = 0.125f;
    CHECK(msa_quantize_rows(ctx, MSA_DTYPE_FP8_E4M3, s8, src_bf16, MSA_DTYPE_BF16, ROWS, DIM, codes,
                            NULL) == MSA_OK,
          "fp8 quantize");
    CHECK(msa_dequantize_rows(ctx, MSA_DTYPE_FP8_E4M3, s8, codes, NULL, ROWS, DIM, back,
                              MSA_DTYPE_FP32) == MSA_OK,
          "fp8 dequantize");
    long bad = 0;
    double err2 = 0, ref2 = 0;
    for (int i = 0; i < ROWS * DIM; i++) {
        const float x = tk_bf16_to_f32(src_bf16[i]);
        bad += codes[i] != tk_f32_to_e4m3(x / s8) && (codes[i] & 0x7f) != 0;
        bad += back[i] != tk_e4m3_to_f32(codes[i]) * s8;
        err2 += (back[i] - x) * (double)(back[i] - x);
        ref2 += (double)x * x;
    }
    CHECK(bad == 0, "fp8 helpers: %ld elements differ from the test kit", bad);
    CHECK(sqrt(err2 / ref2) < 0.04, "fp8 round trip error %.3g", sqrt(err2 / ref2));

    /* nvfp4 round trip from fp32, back to bf16. */
    uint8_t nv_codes[ROWS * DIM / 2], nv_scales[ROWS * DIM / 16];
    uint16_t back16[ROWS * DIM];
    const float g = 0.02f;
    CHECK(msa_quantize_rows(ctx, MSA_DTYPE_NVFP4, g, src, MSA_DTYPE_FP32, ROWS, DIM, nv_codes,
                            nv_scales) == MSA_OK,
          "nvfp4 quantize");
    CHECK(msa_dequantize_rows(NULL, MSA_DTYPE_NVFP4, g, nv_codes, nv_scales, ROWS, DIM, back16,
                              MSA_DTYPE_BF16) == MSA_OK,
          "nvfp4 dequantize (no context)");
    bad = 0;
    err2 = ref2 = 0;
    for (int grp = 0; grp < ROWS * DIM / 16; grp++) {
        unsigned want[16];
        uint8_t want_sb;
        tk_nvfp4_encode_group(src + grp * 16, g, &want_sb, want);
        bad += nv_scales[grp] != want_sb;
        for (int e = 0; e < 16; e++) {
            const int i = grp * 16 + e;
            const unsigned c = (nv_codes[i / 2] >> ((i & 1) * 4)) & 0xfu;
            bad += c != want[e] && !((c & 7) == 0 && (want[e] & 7) == 0);
            const float v = tk_e2m1_to_f32(c) * tk_e4m3_to_f32(want_sb) * g;
            bad += back16[i] != tk_f32_to_bf16(v);
            err2 += (v - src[i]) * (double)(v - src[i]);
            ref2 += (double)src[i] * src[i];
        }
    }
    CHECK(bad == 0, "nvfp4 helpers: %ld elements differ from the test kit", bad);
    CHECK(sqrt(err2 / ref2) < 0.2, "nvfp4 round trip error %.3g", sqrt(err2 / ref2));

    /* Bad input: an error status, a message, nothing written. */
    uint8_t guard[ROWS * DIM];
    memset(guard, 0xa5, sizeof guard);
    struct {
        const char *what;
        msa_dtype dtype, act;
        float scale;
        int64_t rows;
        int32_t dim;
        int null_src, null_scales;
    } bad_args[] = {
        {"activation dtype as plane", MSA_DTYPE_BF16, MSA_DTYPE_FP32, 1.0f, ROWS, DIM, 0, 0},
        {"unknown plane dtype", (msa_dtype)9, MSA_DTYPE_FP32, 1.0f, ROWS, DIM, 0, 0},
        {"fp8 activations", MSA_DTYPE_FP8_E4M3, MSA_DTYPE_FP8_E4M3, 1.0f, ROWS, DIM, 0, 0},
        {"zero scale", MSA_DTYPE_FP8_E4M3, MSA_DTYPE_FP32, 0.0f, ROWS, DIM, 0, 0},
        {"negative scale", MSA_DTYPE_NVFP4, MSA_DTYPE_FP32, -1.0f, ROWS, DIM, 0, 0},
        {"NaN scale", MSA_DTYPE_NVFP4, MSA_DTYPE_FP32, NAN, ROWS, DIM, 0, 0},
        {"infinite scale", MSA_DTYPE_FP8_E4M3, MSA_DTYPE_FP32, INFINITY, ROWS, DIM, 0, 0},
        {"negative rows", MSA_DTYPE_FP8_E4M3, MSA_DTYPE_FP32, 1.0f, -1, DIM, 0, 0},
        {"zero dim", MSA_DTYPE_FP8_E4M3, MSA_DTYPE_FP32, 1.0f, ROWS, 0, 0, 0},
        {"nvfp4 dim 24", MSA_DTYPE_NVFP4, MSA_DTYPE_FP32, 1.0f, 2, 24, 0, 0},
        {"NULL source", MSA_DTYPE_FP8_E4M3, MSA_DTYPE_FP32, 1.0f, ROWS, DIM, 1, 0},
        {"NULL nvfp4 scales", MSA_DTYPE_NVFP4, MSA_DTYPE_FP32, 1.0f, ROWS, DIM, 0, 1},
    };
    for (size_t i = 0; i < sizeof bad_args / sizeof bad_args[0]; i++) {
        uint8_t out[ROWS * DIM], out_sc[ROWS * DIM / 16 + 1];
        memset(out, 0xa5, sizeof out);
        memset(out_sc, 0xa5, sizeof out_sc);
        msa_status st = msa_quantize_rows(ctx, bad_args[i].dtype, bad_args[i].scale,
                                          bad_args[i].null_src ? NULL : src, bad_args[i].act,
                                          bad_args[i].rows, bad_args[i].dim, out,
                                          bad_args[i].null_scales ? NULL : out_sc);
        CHECK(st == MSA_ERR_INVALID_ARGUMENT, "quantize %s: %s", bad_args[i].what,
              msa_status_name(st));
        CHECK(msa_context_last_error(ctx)[0] != '\0', "quantize %s: a message", bad_args[i].what);
        CHECK(memcmp(out, guard, sizeof out) == 0 && memcmp(out_sc, guard, sizeof out_sc) == 0,
              "quantize %s: nothing written", bad_args[i].what);
        float fout[ROWS * DIM], fguard[ROWS * DIM];
        memset(fout, 0xa5, sizeof fout);
        memset(fguard, 0xa5, sizeof fguard);
        st = msa_dequantize_rows(NULL, bad_args[i].dtype, bad_args[i].scale,
                                 bad_args[i].null_src ? NULL : codes,
                                 bad_args[i].null_scales ? NULL : nv_scales, bad_args[i].rows,
                                 bad_args[i].dim, fout, bad_args[i].act);
        CHECK(st == MSA_ERR_INVALID_ARGUMENT, "dequantize %s: %s", bad_args[i].what,
              msa_status_name(st));
        CHECK(memcmp(fout, fguard, sizeof fout) == 0, "dequantize %s: nothing written",
              bad_args[i].what);
    }
    CHECK(msa_quantize_rows(ctx, MSA_DTYPE_NVFP4, 1.0f, NULL, MSA_DTYPE_FP32, 0, 16, NULL, NULL) ==
              MSA_OK,
          "zero rows: nothing to do");
    msa_context_free(ctx);
}

static msa_model *make_model(msa_context *ctx, int D, int Di, int sparse)
{
    msa_model_config mc;
    msa_model_config_default(&mc);
    const uint8_t sp[2] = {(uint8_t)sparse, (uint8_t)sparse}, iv[2] = {0, (uint8_t)sparse};
    mc.num_layers = 2;
    mc.num_q_heads = 4;
    mc.num_kv_heads = 2;
    mc.head_dim = D;
    mc.num_index_heads = 2;
    mc.index_dim = Di;
    mc.block_size = 16;
    mc.topk_blocks = 4;
    mc.layer_sparse = sp;
    mc.layer_index_value = iv;
    msa_model *m = NULL;
    return msa_model_create(ctx, &mc, &m) == MSA_OK ? m : NULL;
}

static void test_cache(void)
{
    msa_context *ctx = NULL;
    msa_context_params cp;
    msa_context_params_default(&cp);
    cp.num_threads = 1;
    CHECK(msa_context_create(&cp, &ctx, NULL, 0) == MSA_OK, "context");
    if (!ctx)
        return;
    msa_model *m = make_model(ctx, 32, 48, 1);
    CHECK(m != NULL, "model");
    if (!m) {
        msa_context_free(ctx);
        return;
    }
    enum { PAGES = 3, P = 8 };
    msa_cache_config cc;
    msa_cache_config_default(&cc);
    cc.num_pages = PAGES;
    cc.page_size = P;
    cc.kv_dtype = MSA_DTYPE_NVFP4;
    cc.index_dtype = MSA_DTYPE_FP8_E4M3;
    msa_cache *c = NULL;
    CHECK(msa_cache_create(ctx, m, &cc, &c) == MSA_OK, "nvfp4 / fp8 cache: %s",
          msa_context_last_error(ctx));
    if (c) {
        const size_t kv = (size_t)PAGES * 2 * (P * 32 / 2 + P * 32 / 16);
        const size_t ix = (size_t)PAGES * P * 48;
        CHECK(msa_cache_plane_bytes(c, 0, MSA_PLANE_K) == kv &&
                  msa_cache_plane_bytes(c, 1, MSA_PLANE_V) == kv,
              "nvfp4 plane bytes %zu, want %zu", msa_cache_plane_bytes(c, 0, MSA_PLANE_K), kv);
        CHECK(msa_cache_plane_bytes(c, 0, MSA_PLANE_INDEX_K) == ix &&
                  msa_cache_plane_bytes(c, 0, MSA_PLANE_INDEX_V) == 0 &&
                  msa_cache_plane_bytes(c, 1, MSA_PLANE_INDEX_V) == ix,
              "fp8 index plane bytes");
        CHECK(msa_cache_set_scales(c, 1, 0.5f, 2.0f, 0.01f, 100.0f) == MSA_OK, "scales");
        CHECK(msa_cache_set_scales(c, 1, 0.5f, 2.0f, 0.0f, 1.0f) == MSA_ERR_INVALID_ARGUMENT,
              "zero scale refused");
        CHECK(c->scales[4] == 0.5f && c->scales[5] == 2.0f && c->scales[6] == 0.01f &&
                  c->scales[7] == 100.0f && c->scales[0] == 1.0f,
              "scales stored, others default to 1");
        msa_cache_free(c);
    }

    /* Wrap: fp8 planes need no alignment beyond a byte, nvfp4 none either. */
    size_t bytes[8], total = 0;
    cc.kv_dtype = MSA_DTYPE_FP8_E4M3;
    cc.index_dtype = MSA_DTYPE_NVFP4;
    for (int i = 0; i < 8; i++) {
        bytes[i] = msa_plane_bytes_for(m, &cc, i / 4, (msa_plane)(i % 4));
        total += bytes[i] + 1;
    }
    uint8_t *mem = calloc(total + 1, 1);
    void *planes[8];
    size_t off = 1; /* odd addresses */
    for (int i = 0; i < 8; i++) {
        planes[i] = bytes[i] ? mem + off : NULL;
        off += bytes[i] + 1;
    }
    c = NULL;
    CHECK(msa_cache_wrap(ctx, m, &cc, planes, &c) == MSA_OK,
          "wrap fp8 / nvfp4 at odd addresses: %s", msa_context_last_error(ctx));
    if (c) {
        CHECK(msa_cache_plane_data(c, 1, MSA_PLANE_INDEX_V) == planes[7], "wrapped plane");
        CHECK(msa_cache_plane_bytes(c, 0, MSA_PLANE_INDEX_K) ==
                  (size_t)PAGES * (P * 48 / 2 + P * 3),
              "nvfp4 index plane bytes");
    }
    msa_cache_free(c);
    free(mem);

    /* nvfp4 needs rows of whole groups: head_dim 24 is refused. */
    msa_model *m24 = make_model(ctx, 24, 24, 1);
    cc.kv_dtype = MSA_DTYPE_NVFP4;
    cc.index_dtype = MSA_DTYPE_BF16;
    c = (msa_cache *)1;
    msa_status st = m24 ? msa_cache_create(ctx, m24, &cc, &c) : MSA_ERR_INVALID_CONFIG;
    CHECK(st == MSA_ERR_INVALID_CONFIG && c == NULL &&
              strstr(msa_context_last_error(ctx), "multiple of 16"),
          "nvfp4 head_dim 24: %s (%s)", msa_status_name(st), msa_context_last_error(ctx));
    cc.kv_dtype = MSA_DTYPE_FP8_E4M3;
    cc.index_dtype = MSA_DTYPE_NVFP4;
    c = (msa_cache *)1;
    st = m24 ? msa_cache_create(ctx, m24, &cc, &c) : MSA_ERR_INVALID_CONFIG;
    CHECK(st == MSA_ERR_INVALID_CONFIG && c == NULL, "nvfp4 index_dim 24: %s", msa_status_name(st));
    msa_model_free(m24);
    /* A dense model has no index planes: its index dtype is not checked
     * against the index dim. */
    msa_model *dense = make_model(ctx, 32, 24, 0);
    c = NULL;
    CHECK(dense && msa_cache_create(ctx, dense, &cc, &c) == MSA_OK, "dense model, nvfp4 index");
    msa_cache_free(c);
    msa_model_free(dense);

    /* The CUDA backend takes quantized planes too, main and index planes
     * independently, with the CPU backend's plane sizes. */
    msa_context *gpu = NULL;
    if (msa_backend_available(MSA_BACKEND_CUDA)) {
        cp.backend = MSA_BACKEND_CUDA;
        if (msa_context_create(&cp, &gpu, NULL, 0) == MSA_OK) {
            msa_model *gm = make_model(gpu, 32, 48, 1);
            msa_model *cm = make_model(ctx, 32, 48, 1);
            static const msa_dtype q[3] = {MSA_DTYPE_FP8_E4M3, MSA_DTYPE_NVFP4, MSA_DTYPE_BF16};
            for (int i = 0; i < 9 && gm && cm; i++) {
                msa_cache_config_default(&cc);
                cc.num_pages = PAGES;
                cc.page_size = P;
                cc.kv_dtype = q[i % 3];
                cc.index_dtype = q[i / 3];
                msa_cache *gc = NULL, *hc = NULL;
                st = msa_cache_create(gpu, gm, &cc, &gc);
                CHECK(st == MSA_OK && gc != NULL, "CUDA kv %s index %s planes: %s (%s)",
                      msa_dtype_name(cc.kv_dtype), msa_dtype_name(cc.index_dtype),
                      msa_status_name(st), msa_context_last_error(gpu));
                if (msa_cache_create(ctx, cm, &cc, &hc) == MSA_OK && gc) {
                    int same = 1;
                    for (int l = 0; l < 2; l++)
                        for (int pl = 0; pl < 4; pl++)
                            same &= msa_cache_plane_bytes(gc, l, (msa_plane)pl) ==
                                    msa_cache_plane_bytes(hc, l, (msa_plane)pl);
                    CHECK(same, "CUDA kv %s index %s: plane bytes as on the CPU",
                          msa_dtype_name(cc.kv_dtype), msa_dtype_name(cc.index_dtype));
                    CHECK(msa_cache_set_scales(gc, 0, 0.5f, 2.0f, 0.25f, 4.0f) == MSA_OK,
                          "CUDA cache scales");
                }
                msa_cache_free(hc);
                msa_cache_free(gc);
            }
            msa_model_free(cm);
            msa_model_free(gm);
            msa_context_free(gpu);
        } else {
            SKIP("CUDA context could not be created");
        }
    } else {
        SKIP("CUDA quantized planes: no CUDA device in this build or machine");
    }
    msa_model_free(m);
    msa_context_free(ctx);
}

/* x and y hold the same bits, except that any two NaNs are equal: C
 * leaves the sign of a NaN product open (the scalar nvfp4 read of a NaN
 * group scale may give either), and a NaN reads as NaN whatever its sign. */
static int same_floats(const float *x, const float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &x[i], 4);
        memcpy(&b, &y[i], 4);
        if (a != b && !(isnan(x[i]) && isnan(y[i])))
            return 0;
    }
    return 1;
}

/* The CPU gather of every kernel level on quantized planes: rows read
 * through a level's load_rows equal the scalar read rule
 * (msa_cpu_dequant_rows) bit for bit, signed zeros included (NaN for NaN), for
 * every code, runs that cross pages, scales whose products are subnormal
 * and scales too large for the vector route. */
static void test_cpu_dequant_levels(void)
{
    enum { PAGES = 3, P = 8, HEADS = 2, ROWS = PAGES * P };
    static const int32_t page_row[PAGES] = {2, 0, 1};
    static const float scales[] = {1.0f, 0.37f, 1e-40f, 3.0e-3f, 7.5e36f, 1.5e38f};
    static const int32_t fp8_dims[] = {48, 21, 128};
    tk_rng rng = {0x6465717561ull};
    /* Largest region: fp8 rows of dim 128. */
    static uint8_t data[PAGES * HEADS * P * 128];
    static float want[ROWS * 128], got[ROWS * 128];
    int levels = 0;
    for (int isa = MSA_CPU_ISA_PORTABLE; isa <= MSA_CPU_ISA_NEON_BF16; isa++) {
        const msa_cpu_kernels *k = msa_cpu_kernels_for((msa_cpu_isa)isa);
        if (!k || !msa_cpu_isa_supported((msa_cpu_isa)isa))
            continue;
        levels++;
        for (int fmt = 0; fmt < 2; fmt++) {
            const msa_dtype dt = fmt ? MSA_DTYPE_NVFP4 : MSA_DTYPE_FP8_E4M3;
            for (size_t di = 0; di < sizeof fp8_dims / sizeof fp8_dims[0]; di++) {
                const int32_t dim = fmt ? 32 * (int32_t)(di + 1) : fp8_dims[di];
                const size_t bytes = fmt ? (size_t)PAGES * HEADS * P * (dim / 2 + dim / 16)
                                         : (size_t)PAGES * HEADS * P * dim;
                /* Every byte value appears; a few NaN group scales too. */
                for (size_t b = 0; b < bytes; b++)
                    data[b] = (uint8_t)(b < 256 ? (int)b : tk_rng_below(&rng, 256));
                for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
                    /* The library layout's strides, in elements (nvfp4 rows are
                     * found by their own arithmetic). */
                    const cpu_plane pl = {data,
                                          dt,
                                          HEADS,
                                          dim,
                                          P,
                                          scales[si],
                                          (int64_t)HEADS * P * dim,
                                          (int64_t)P * dim,
                                          dim};
                    long bad = 0;
                    for (int32_t head = 0; head < HEADS; head++)
                        for (int32_t j0 = 0; j0 < ROWS; j0 += 5) {
                            const int32_t n = ROWS - j0 < 11 ? ROWS - j0 : 11;
                            memset(got, 0xa5, sizeof got);
                            msa_cpu_dequant_rows(want, &pl, page_row, head, j0, n);
                            k->load_rows(got, &pl, page_row, head, j0, n);
                            bad += !same_floats(got, want, (int64_t)n * dim);
                        }
                    CHECK(bad == 0, "%s: %s rows of dim %d at scale %g: %ld runs differ",
                          msa_cpu_isa_name((msa_cpu_isa)isa), fmt ? "nvfp4" : "fp8_e4m3", dim,
                          (double)scales[si], bad);
                }
            }
        }
    }
    CHECK(levels >= 1, "at least the portable level runs (%d levels)", levels);
}

int main(void)
{
    test_e4m3();
    test_e2m1();
    test_nvfp4_groups();
    test_cpu_dequant_levels();
    test_helpers();
    test_cache();
    return check_finish();
}
