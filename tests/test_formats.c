/*
 * Element formats: the test kit's own bf16 / fp16 / e4m3 / e2m1 / NVFP4
 * codecs against hand-picked values (ties, saturation, subnormals), round
 * trips over every code, and a cross-check of the library's conversions
 * (declared in src/core/internal.h) against the test kit's on every 16-bit
 * code and on a million random fp32 bit patterns.
 *
 * File formats of the `msa` program: replay meta.json, the benchmark
 * workload files and .npy headers refuse text that is not strict JSON
 * (trailing text, a second object, NUL bytes, invalid UTF-8, duplicate
 * keys), refuse a FIFO in place of a file without waiting on it, and say
 * precisely what is wrong.
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/internal.h"
#include "npy.h"
#include "replay_meta.h"
#include "testkit_internal.h"
#include "workload.h"

#ifndef MSA_SOURCE_DIR
#define MSA_SOURCE_DIR "."
#endif

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
    CHECK(isnan(tk_bf16_to_f32(tk_f32_to_bf16(bits_f32(0x7f800001u)))),
          "low-payload NaN stays NaN");
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

/* ---- the program's file readers ------------------------------------------ */

static char tmp_dir[] = "/tmp/msa_test_formats_XXXXXX";

static int has(const char *s, const char *sub)
{
    return strstr(s, sub) != NULL;
}

/* Writes bytes to tmp_dir/name; returns the path (static buffer). */
static const char *put_file(const char *name, const void *bytes, size_t len)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(bytes, 1, len, f) != len)
        CHECK(0, "cannot write %s", path);
    if (f)
        fclose(f);
    return path;
}

#define META_LAYER                                                                                \
    "\"layer\": {\"type\": \"sparse\", \"Hq\": 8, \"Hkv\": 2, \"D\": 16, \"Hi\": 2, \"Di\": 16, " \
    "\"block\": 16, \"topk\": 4}"
#define META_REST                                                                 \
    "\"cache\": {\"page_size\": 16, \"num_pages\": 8}, \"act_dtype\": \"bf16\", " \
    "\"tokens\": 1, \"requests\": [{\"q_len\": 1, \"kv_len\": 20, \"pages\": [1, 2]}]"
#define META "{" META_LAYER ", " META_REST "}"

/* meta.json text[0..len) must be refused with `want` and every substring
 * given (NULL-ended) in the message. */
static void meta_refused(const char *what, const char *text, size_t len, msa_status want, ...)
{
    replay_meta m;
    char msg[512] = "";
    msa_status st = replay_meta_parse(text, len, &m, msg, sizeof msg, NULL);
    CHECK(st == want, "meta %s: got %s, want %s (%s)", what, msa_status_name(st),
          msa_status_name(want), msg);
    CHECK(m.requests == NULL, "meta %s: nothing kept on failure", what);
    va_list ap;
    va_start(ap, want);
    for (const char *sub = va_arg(ap, const char *); sub; sub = va_arg(ap, const char *))
        CHECK(has(msg, sub), "meta %s: message '%s' lacks '%s'", what, msg, sub);
    va_end(ap);
    if (st == MSA_OK)
        replay_meta_free(&m);
}

#define META_REFUSED(what, lit, st, ...) \
    meta_refused(what, lit, sizeof(lit) - 1, st, __VA_ARGS__, NULL)

static void test_replay_meta(void)
{
    replay_meta m;
    char msg[512] = "";
    static const char good[] = META;
    CHECK(replay_meta_parse(good, sizeof good - 1, &m, msg, sizeof msg, NULL) == MSA_OK &&
              m.Hq == 8 && m.num_requests == 1 && m.requests[0].pages[1] == 2,
          "meta base parses: %s", msg);
    replay_meta_free(&m);
    /* The same text from a file. */
    const char *path = put_file("meta.json", good, sizeof good - 1);
    CHECK(replay_meta_load(path, &m, msg, sizeof msg) == MSA_OK, "meta file loads: %s", msg);
    replay_meta_free(&m);

    META_REFUSED("trailing garbage", META " x", MSA_ERR_IO, "unexpected text after the value");
    META_REFUSED("second object", META "\n{\"tokens\": 2}", MSA_ERR_IO,
                 "unexpected text after the value", "byte offset");
    META_REFUSED("NUL byte in a string", "{" META_LAYER ", " META_REST ", \"x\": \"sp\0arse\"}",
                 MSA_ERR_IO, "NUL byte inside a string");
    META_REFUSED("NUL in the layer type",
                 "{\"layer\": {\"type\": \"sparse\0dense\", \"Hq\": 8, \"Hkv\": 2, \"D\": 16}, "
                 "\"act_dtype\": \"bf16\"}",
                 MSA_ERR_IO, "NUL byte inside a string");
    META_REFUSED("overlong UTF-8", "{" META_LAYER ", " META_REST ", \"x\": \"\xC1\xBF\"}",
                 MSA_ERR_IO, "invalid UTF-8", "overlong");
    META_REFUSED("lone continuation byte", "{" META_LAYER ", " META_REST ", \"x\": \"\xBF\"}",
                 MSA_ERR_IO, "invalid UTF-8", "continuation byte");
    META_REFUSED("surrogate in UTF-8", "{" META_LAYER ", " META_REST ", \"x\": \"\xED\xBF\xBF\"}",
                 MSA_ERR_IO, "invalid UTF-8", "surrogate");
    META_REFUSED("duplicate key at the top level", "{" META_LAYER ", " META_REST ", \"tokens\": 3}",
                 MSA_ERR_IO, "duplicate key \"tokens\"", "at the top level");
    META_REFUSED(
        "duplicate key in layer",
        "{\"layer\": {\"type\": \"dense\", \"Hq\": 8, \"Hkv\": 2, \"D\": 16, \"Hq\": 4}, " META_REST
        "}",
        MSA_ERR_IO, "duplicate key \"Hq\"", "in \"layer\"");
    META_REFUSED("duplicate key in a request",
                 "{" META_LAYER ", \"cache\": {\"page_size\": 16, \"num_pages\": 8}, "
                 "\"act_dtype\": \"bf16\", \"tokens\": 1, \"requests\": [{\"q_len\": 1, "
                 "\"kv_len\": 20, \"pages\": [1, 2], \"pages\": [3, 4]}]}",
                 MSA_ERR_IO, "duplicate key \"pages\"", "in the object at byte offset");
    META_REFUSED("layer not an object", "{\"layer\": 5, " META_REST "}", MSA_ERR_INVALID_ARGUMENT,
                 "\"layer\" must be an object");

    /* Number messages: no number, not whole, out of range. */
    META_REFUSED(
        "Hq 2^31",
        "{\"layer\": {\"type\": \"dense\", \"Hq\": 2147483648, \"Hkv\": 2, \"D\": 16}, " META_REST
        "}",
        MSA_ERR_INVALID_ARGUMENT, "layer.Hq is out of range", "2.14748e+09");
    META_REFUSED("Hq 1.5",
                 "{\"layer\": {\"type\": \"dense\", \"Hq\": 1.5, \"Hkv\": 2, \"D\": 16}, " META_REST
                 "}",
                 MSA_ERR_INVALID_ARGUMENT, "layer.Hq must be an integer (got 1.5)");
    META_REFUSED(
        "Hq a string",
        "{\"layer\": {\"type\": \"dense\", \"Hq\": \"8\", \"Hkv\": 2, \"D\": 16}, " META_REST "}",
        MSA_ERR_INVALID_ARGUMENT, "layer.Hq must be an integer, not a string");
    META_REFUSED("Hq 0",
                 "{\"layer\": {\"type\": \"dense\", \"Hq\": 0, \"Hkv\": 2, \"D\": 16}, " META_REST
                 "}",
                 MSA_ERR_INVALID_ARGUMENT, "layer.Hq is out of range: 0 is not in [1, 2147483647]");
    META_REFUSED("local_blocks 0",
                 "{\"layer\": {\"type\": \"sparse\", \"Hq\": 8, \"Hkv\": 2, \"D\": 16, \"Hi\": 2, "
                 "\"Di\": 16, \"block\": 16, \"topk\": 4, \"local_blocks\": 0}, " META_REST "}",
                 MSA_ERR_INVALID_ARGUMENT, "layer.local_blocks is out of range: 0 is not in [1,");
    META_REFUSED("page 1.5",
                 "{" META_LAYER ", \"cache\": {\"page_size\": 16, \"num_pages\": 8}, "
                 "\"act_dtype\": \"bf16\", \"tokens\": 1, \"requests\": [{\"q_len\": 1, "
                 "\"kv_len\": 20, \"pages\": [1, 2.5]}]}",
                 MSA_ERR_INVALID_ARGUMENT, "pages[1] must be an integer (got 2.5)");
    META_REFUSED("page 1e999",
                 "{" META_LAYER ", \"cache\": {\"page_size\": 16, \"num_pages\": 8}, "
                 "\"act_dtype\": \"bf16\", \"tokens\": 1, \"requests\": [{\"q_len\": 1, "
                 "\"kv_len\": 20, \"pages\": [1, 1e999]}]}",
                 MSA_ERR_OUT_OF_RANGE, "pages[1] = inf is outside the pool");
}

/* The workload file `text` must be refused with every substring given. */
static void workload_refused(const char *what, const char *text, size_t len, ...)
{
    const char *path = put_file("workload.json", text, len);
    workload_filter f = {"all", NULL, 0, 0};
    bench_case *cases = NULL;
    int n = 0;
    char err[512] = "";
    int rc = workload_load(path, 0, &f, &cases, &n, err, sizeof err);
    CHECK(rc != 0 && cases == NULL && n == 0, "workload %s: refused (%s)", what, err);
    va_list ap;
    va_start(ap, len);
    for (const char *sub = va_arg(ap, const char *); sub; sub = va_arg(ap, const char *))
        CHECK(has(err, sub), "workload %s: message '%s' lacks '%s'", what, err, sub);
    va_end(ap);
    if (rc == 0)
        workload_free(cases, n);
}

#define WL_BODY \
    "\"q_len_per_request\": 8, \"cases\": [{\"id\": \"a\", \"suite\": \"full\", \"kv_lens\": [100, 200]}]"
#define WL "{" WL_BODY "}"
#define WL_REFUSED(what, lit, ...) workload_refused(what, lit, sizeof(lit) - 1, __VA_ARGS__, NULL)

static void test_workload(void)
{
    workload_filter all = {"all", NULL, 0, 0};
    bench_case *cases = NULL;
    int n = 0;
    char err[512] = "";
    const char *path = put_file("workload.json", WL, sizeof WL - 1);
    CHECK(workload_load(path, 0, &all, &cases, &n, err, sizeof err) == 0 && n == 1 &&
              cases[0].num_requests == 2 && cases[0].kv_len[1] == 200,
          "workload base loads: %s", err);
    workload_free(cases, n);

    WL_REFUSED("trailing garbage", WL " x", "unexpected text after the value");
    WL_REFUSED("second object", WL "{\"cases\": []}", "unexpected text after the value");
    WL_REFUSED("NUL byte in a string",
               "{\"q_len_per_request\": 8, \"cases\": [{\"id\": \"a\0b\", \"kv_lens\": [100]}]}",
               "NUL byte inside a string");
    WL_REFUSED("overlong UTF-8", "{" WL_BODY ", \"description\": \"\xC0\x80\"}", "invalid UTF-8",
               "overlong");
    WL_REFUSED("lone continuation byte", "{" WL_BODY ", \"description\": \"x\x9Fy\"}",
               "invalid UTF-8", "continuation byte");
    WL_REFUSED("surrogate in UTF-8", "{" WL_BODY ", \"description\": \"\xED\xA0\xBD\"}",
               "invalid UTF-8", "surrogate");
    WL_REFUSED("duplicate key at the top level", "{" WL_BODY ", \"q_len_per_request\": 1}",
               "duplicate key \"q_len_per_request\"", "at the top level");
    WL_REFUSED("duplicate key in a case",
               "{\"q_len_per_request\": 8, \"cases\": [{\"id\": \"a\", \"kv_lens\": [100], "
               "\"kv_lens\": [5]}]}",
               "duplicate key \"kv_lens\"", "in the object at byte offset");

    /* The project's own workload files load in full. */
    static const char *const files[2] = {MSA_SOURCE_DIR "/bench/workloads/decode.json",
                                         MSA_SOURCE_DIR "/bench/workloads/prefill.json"};
    for (int prefill = 0; prefill < 2; prefill++) {
        cases = NULL;
        n = 0;
        CHECK(workload_load(files[prefill], prefill, &all, &cases, &n, err, sizeof err) == 0 &&
                  n > 0,
              "%s loads: %s", files[prefill], err);
        workload_free(cases, n);
    }
}

/* A v1 .npy prefix and header holding `dict`, padded as numpy pads. */
static size_t npy_bytes(const char *dict, unsigned char *out, size_t cap)
{
    size_t d = strlen(dict);
    size_t header_len = (10 + d + 1 + 63) / 64 * 64 - 10;
    if (10 + header_len > cap)
        return 0;
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (unsigned char)(header_len & 0xff);
    out[9] = (unsigned char)(header_len >> 8);
    memcpy(out + 10, dict, d);
    memset(out + 10 + d, ' ', header_len - d - 1);
    out[10 + header_len - 1] = '\n';
    return 10 + header_len;
}

static void test_npy_header(void)
{
    static unsigned char buf[8192];
    npy_array a;
    size_t off = 0;
    char err[512] = "";
    size_t n =
        npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", buf, sizeof buf);
    CHECK(npy_parse_header(buf, n, &a, &off, err, sizeof err) == 0 && a.type == NPY_F32 &&
              a.ndim == 2 && a.count == 6 && off == n && n % 64 == 0,
          "npy header parses: %s", err);

    /* A 5,000-character descr is too long, not "not a string". */
    char dict[6000];
    char *p = dict + snprintf(dict, sizeof dict, "{'descr': '");
    memset(p, 'f', 5000);
    p += 5000;
    snprintf(p, sizeof dict - (size_t)(p - dict), "', 'fortran_order': False, 'shape': (1,), }");
    n = npy_bytes(dict, buf, sizeof buf);
    CHECK(n > 0 && npy_parse_header(buf, n, &a, &off, err, sizeof err) != 0 &&
              has(err, "'descr' is too long (5000 characters") && !has(err, "not a string"),
          "long descr: %s", err);

    /* A NUL byte would have made "<f4\0x" compare equal to "<f4". */
    n = npy_bytes("{'descr': '<f4_x', 'fortran_order': False, 'shape': (1,), }", buf, sizeof buf);
    buf[10 + 14] = 0; /* the '_' after "<f4" */
    CHECK(npy_parse_header(buf, n, &a, &off, err, sizeof err) != 0 &&
              has(err, "not printable ASCII"),
          "NUL in descr: %s", err);
    n = npy_bytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", buf,
                  sizeof buf);
    CHECK(npy_parse_header(buf, n, &a, &off, err, sizeof err) != 0 && has(err, "repeated"),
          "repeated descr: %s", err);
    n = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'abcdefghijklmnopq"
                  "rstuvwxyzabcdefghij': 1}",
                  buf, sizeof buf);
    CHECK(npy_parse_header(buf, n, &a, &off, err, sizeof err) != 0 && has(err, "key is too long"),
          "long key: %s", err);
    /* Truncated and tiny headers. */
    CHECK(npy_parse_header(buf, 9, &a, &off, err, sizeof err) != 0 && has(err, "truncated"),
          "9 bytes: %s", err);
    CHECK(npy_parse_header(buf, 40, &a, &off, err, sizeof err) != 0 && has(err, "does not fit"),
          "cut header: %s", err);
    static const unsigned char tiny[11] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 1, 0, '{'};
    const char *path = put_file("tiny.npy", tiny, sizeof tiny);
    CHECK(npy_read(path, &a, err, sizeof err) != 0 && has(err, "header"), "tiny file: %s", err);

    /* Round trip through a file. */
    const float x[6] = {1, 2, 3, 4, 5, 6};
    const int64_t shape[2] = {2, 3};
    snprintf(dict, sizeof dict, "%s/x.npy", tmp_dir);
    CHECK(npy_write(dict, NPY_F32, 2, shape, x, err, sizeof err) == 0, "npy write: %s", err);
    CHECK(npy_read(dict, &a, err, sizeof err) == 0 && a.count == 6 &&
              ((const float *)a.data)[5] == 6.0f,
          "npy read back: %s", err);
    npy_free(&a);
}

/* Every reader refuses a FIFO at once (CTest's TIMEOUT catches a wait). */
static void test_fifos(void)
{
    char path[256], err[512] = "";
    static const char *const names[3] = {"q.npy", "meta_fifo.json", "workload_fifo.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", tmp_dir, names[i]);
        if (mkfifo(path, 0600) != 0) {
            CHECK(0, "mkfifo %s", path);
            continue;
        }
        err[0] = '\0';
        int refused;
        if (i == 0) {
            npy_array a;
            refused = npy_read(path, &a, err, sizeof err) != 0;
        } else if (i == 1) {
            replay_meta m;
            refused = replay_meta_load(path, &m, err, sizeof err) == MSA_ERR_IO;
        } else {
            workload_filter f = {"all", NULL, 0, 0};
            bench_case *cases = NULL;
            int n = 0;
            refused = workload_load(path, 0, &f, &cases, &n, err, sizeof err) != 0;
        }
        CHECK(refused && has(err, "not a regular file"), "FIFO %s: %s", names[i], err);
        unlink(path);
    }
    npy_array a;
    CHECK(npy_read(tmp_dir, &a, err, sizeof err) != 0 && has(err, "not a regular file"),
          "directory as .npy: %s", err);
}

static void test_file_readers(void)
{
    if (!mkdtemp(tmp_dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    test_replay_meta();
    test_workload();
    test_npy_header();
    test_fifos();
    static const char *const left[] = {"meta.json", "workload.json", "tiny.npy", "x.npy"};
    char path[256];
    for (size_t i = 0; i < sizeof left / sizeof left[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", tmp_dir, left[i]);
        unlink(path);
    }
    rmdir(tmp_dir);
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
    test_file_readers();
    return check_finish();
}
