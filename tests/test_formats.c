/*
 * Element formats: the test kit's own bf16 / fp16 / e4m3 / e2m1 / NVFP4
 * codecs against hand-picked values (ties, saturation, subnormals), round
 * trips over every code, and a cross-check of the library's conversions
 * (declared in src/core/internal.h) against the test kit's on every 16-bit
 * code and on a million random fp32 bit patterns.
 */
#include <math.h>
#include <string.h>

#include "check.h"
#include "core/internal.h"
#include "testkit_internal.h"

static float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static void test_bf16(void)
{
    CHECK(tk_f32_to_bf16(1.0f) == 0x3f80, "1.0");
    CHECK(tk_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80, "tie to even (down)");
    CHECK(tk_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82, "tie to even (up)");
    CHECK(tk_f32_to_bf16(-2.0f) == 0xc000, "-2");
    CHECK(tk_f32_to_bf16(INFINITY) == 0x7f80, "inf");
    CHECK(tk_f32_to_bf16(bits_f32(0x7f7fffffu)) == 0x7f80, "max float rounds to inf");
    CHECK(isnan(tk_bf16_to_f32(tk_f32_to_bf16(NAN))), "NaN stays NaN");
    CHECK(isnan(tk_bf16_to_f32(tk_f32_to_bf16(bits_f32(0x7f800001u)))), "low-payload NaN stays NaN");
    long bad = 0;
    for (uint32_t c = 0; c < 65536; c++) {
        float x = tk_bf16_to_f32((uint16_t)c);
        if (!isnan(x) && tk_f32_to_bf16(x) != c)
            bad++;
    }
    CHECK(bad == 0, "bf16 round trip: %ld codes", bad);
}

static void test_f16(void)
{
    CHECK(tk_f32_to_f16(1.0f) == 0x3c00, "1.0");
    CHECK(tk_f32_to_f16(-2.0f) == 0xc000, "-2");
    CHECK(tk_f32_to_f16(65504.0f) == 0x7bff, "max");
    CHECK(tk_f32_to_f16(65519.0f) == 0x7bff, "below the overflow tie");
    CHECK(tk_f32_to_f16(65520.0f) == 0x7c00, "overflow tie goes to inf");
    CHECK(tk_f32_to_f16(0x1p-14f) == 0x0400, "smallest normal");
    CHECK(tk_f32_to_f16(0x1p-24f) == 0x0001, "smallest subnormal");
    CHECK(tk_f32_to_f16(0x1p-25f) == 0x0000, "half the smallest subnormal ties to 0");
    CHECK(tk_f32_to_f16(0x1.8p-25f) == 0x0001, "above the tie");
    CHECK(tk_f32_to_f16(0x1.8p-24f) == 0x0002, "1.5 units ties to 2");
    CHECK(tk_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00, "tie to even (down)");
    CHECK(tk_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02, "tie to even (up)");
    CHECK(tk_f32_to_f16(0x1.ffcp-15f) == 0x0400, "subnormal carry into the normal range");
    CHECK(tk_f32_to_f16(-INFINITY) == 0xfc00, "-inf");
    CHECK(isnan(tk_f16_to_f32(tk_f32_to_f16(NAN))), "NaN");
    long bad = 0;
    for (uint32_t c = 0; c < 65536; c++) {
        float x = tk_f16_to_f32((uint16_t)c);
        if (!isnan(x) && tk_f32_to_f16(x) != c)
            bad++;
    }
    CHECK(bad == 0, "fp16 round trip: %ld codes", bad);
}

static void test_e4m3(void)
{
    CHECK(tk_f32_to_e4m3(1.0f) == 0x38, "1.0");
    CHECK(tk_f32_to_e4m3(-1.0f) == 0xb8, "-1.0");
    CHECK(tk_f32_to_e4m3(448.0f) == 0x7e, "max");
    CHECK(tk_f32_to_e4m3(1e6f) == 0x7e && tk_f32_to_e4m3(-INFINITY) == 0xfe, "saturates");
    CHECK(tk_f32_to_e4m3(0x1p-9f) == 0x01, "smallest subnormal");
    CHECK(tk_f32_to_e4m3(0x1p-10f) == 0x00, "tie to zero");
    CHECK(tk_f32_to_e4m3(0x1.8p-9f) == 0x02, "tie to even code");
    CHECK(tk_f32_to_e4m3(1.0625f) == 0x38, "1 + half ulp ties to even");
    CHECK(tk_f32_to_e4m3(NAN) == 0x7f && isnan(tk_e4m3_to_f32(0xff)), "NaN");
    CHECK(tk_e4m3_to_f32(0x7e) == 448.0f && tk_e4m3_to_f32(0x08) == 0x1p-6f, "decode");
    long bad = 0;
    for (int c = 0; c < 256; c++) {
        float x = tk_e4m3_to_f32((uint8_t)c);
        if (!isnan(x) && x != 0.0f && tk_f32_to_e4m3(x) != c)
            bad++;
    }
    CHECK(bad == 0, "e4m3 round trip: %ld codes", bad);
}

static void test_e2m1(void)
{
    CHECK(tk_f32_to_e2m1(0.25f) == 0, "0.25 ties to 0");
    CHECK(tk_f32_to_e2m1(0.75f) == 2, "0.75 ties to 1.0");
    CHECK(tk_f32_to_e2m1(1.25f) == 2, "1.25 ties to 1.0");
    CHECK(tk_f32_to_e2m1(1.75f) == 4, "1.75 ties to 2.0");
    CHECK(tk_f32_to_e2m1(2.5f) == 4, "2.5 ties to 2.0");
    CHECK(tk_f32_to_e2m1(3.5f) == 6, "3.5 ties to 4.0");
    CHECK(tk_f32_to_e2m1(5.0f) == 6, "5 ties to 4.0");
    CHECK(tk_f32_to_e2m1(7.0f) == 7 && tk_f32_to_e2m1(100.0f) == 7, "saturates at 6");
    CHECK(tk_f32_to_e2m1(-3.0f) == 0xd, "-3");
    CHECK(tk_e2m1_to_f32(0xf) == -6.0f, "decode -6");
}

static void test_nvfp4_plane(void)
{
    tk_plane pl = {MSA_DTYPE_NVFP4, 2, 32, 16, 3, 1.0f};
    CHECK(tk_plane_bytes(&pl) == 3 * 2 * (16 * 32 / 2 + 16 * 32 / 16), "nvfp4 bytes %zu",
          tk_plane_bytes(&pl));
    uint8_t img[1728];
    memset(img, 0, sizeof img);
    /* amax 6 with global 1 gives scale exactly 1: values on the grid survive. */
    float x[32], y[32];
    static const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    for (int e = 0; e < 32; e++)
        x[e] = (e & 1 ? -1.0f : 1.0f) * grid[e % 8];
    x[7] = 6.0f;
    x[23] = 6.0f;
    tk_plane_put(&pl, img, 2, 1, 5, x);
    tk_plane_get(&pl, img, 2, 1, 5, y);
    CHECK(memcmp(x, y, sizeof x) == 0, "nvfp4 grid round trip");
    /* Layout: region (2,1) starts at (2*2+1) * 288; codes of slot 5 at 5*16,
     * scales after the P*D/2 code bytes at 256 + 5*2. */
    const uint8_t *r = img + 5 * 288;
    CHECK(r[5 * 16] == (uint8_t)(tk_f32_to_e2m1(x[0]) | tk_f32_to_e2m1(x[1]) << 4),
          "low nibble holds the even element");
    CHECK(r[256 + 10] == 0x38 && r[256 + 11] == 0x38, "group scales are 1.0");
    /* Global scale divides the group scale: amax 3, global 0.5 -> scale 1. */
    pl.scale = 0.5f;
    for (int e = 0; e < 32; e++)
        x[e] = e % 16 == 0 ? 3.0f : 0.25f;
    tk_plane_put(&pl, img, 0, 0, 0, x);
    tk_plane_get(&pl, img, 0, 0, 0, y);
    CHECK(img[256] == 0x38 && y[0] == 3.0f && y[1] == 0.25f, "global scale");
    /* An all-zero group has scale 0 and zero codes. */
    memset(x, 0, sizeof x);
    tk_plane_put(&pl, img, 0, 0, 1, x);
    CHECK(img[256 + 2] == 0 && img[16] == 0, "zero group");
}

static void test_fp8_plane(void)
{
    tk_plane pl = {MSA_DTYPE_FP8_E4M3, 1, 16, 4, 2, 0.5f};
    uint8_t img[128];
    float x[16], y[16];
    for (int e = 0; e < 16; e++)
        x[e] = (float)(e - 8) * 0.25f;
    tk_plane_put(&pl, img, 1, 0, 3, x);
    tk_plane_get(&pl, img, 1, 0, 3, y);
    CHECK(memcmp(x, y, sizeof x) == 0, "fp8 exact values with scale 0.5");
    CHECK(img[64 + 48 + 12] == tk_f32_to_e4m3(2.0f), "stored x / scale");
}

/* The library's conversions must agree with the test kit's. */
static void test_library_conversions(void)
{
    long bad_bf = 0, bad_h = 0, bad_dec = 0;
    for (uint32_t c = 0; c < 65536; c++) {
        float a = msa_bf16_to_f32((uint16_t)c), b = tk_bf16_to_f32((uint16_t)c);
        float ha = msa_f16_to_f32((uint16_t)c), hb = tk_f16_to_f32((uint16_t)c);
        if (memcmp(&a, &b, 4) && !(isnan(a) && isnan(b)))
            bad_dec++;
        if (memcmp(&ha, &hb, 4) && !(isnan(ha) && isnan(hb)))
            bad_dec++;
    }
    tk_rng rng = {12345};
    for (long i = 0; i < 1000000; i++) {
        uint32_t u = (uint32_t)tk_rng_next(&rng);
        /* Half the draws near the fp16 range, where rounding is interesting. */
        if (i & 1)
            u = (u & 0x807fffffu) | ((uint32_t)(100 + (u >> 23) % 50) << 23);
        float x = bits_f32(u);
        uint16_t a = msa_f32_to_bf16(x), b = tk_f32_to_bf16(x);
        if (a != b && !(isnan(x) && isnan(tk_bf16_to_f32(a))))
            bad_bf++;
        a = msa_f32_to_f16(x);
        b = tk_f32_to_f16(x);
        if (a != b && !(isnan(x) && isnan(tk_f16_to_f32(a))))
            bad_h++;
    }
    CHECK(bad_dec == 0, "library decode disagrees on %ld codes", bad_dec);
    CHECK(bad_bf == 0, "library f32->bf16 disagrees on %ld values", bad_bf);
    CHECK(bad_h == 0, "library f32->fp16 disagrees on %ld values", bad_h);
}

int main(void)
{
    test_bf16();
    test_f16();
    test_e4m3();
    test_e2m1();
    test_nvfp4_plane();
    test_fp8_plane();
    test_library_conversions();
    return check_finish();
}
