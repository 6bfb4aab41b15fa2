/*
 * The AVX512-BF16 decode attention kernels of src/cpu/cpu_bf16.h against
 * the plain forms of the same products: the scores of eight keys per pass
 * (key pairs as embedded-broadcast operands, with and without the next
 * block's prefetches) against one key at a time with a separate
 * broadcast, and P.V of four heads per pass against one
 * head at a time.  Each lane sums in the same order in both, so the
 * results must be the same bits; any regrouping that changed the order of
 * the sums fails here.  Also the fp8 e4m3 codes widened to bf16 by table
 * lookup (src/cpu/cpu_dequant_impl.h) against the conversion route, bit
 * for bit, for every code in every position of a 32-code vector.  Built
 * with the AVX512-BF16 level's flags; reports "skipped" (exit 77) on a
 * CPU without the instructions.
 */
#include "cpu/cpu_bf16.h"
#include "cpu/cpu_kernels.h"
#include "core/quant.h"

#include <immintrin.h>

/* The de-quantization header's row functions are not all used here. */
#pragma GCC diagnostic ignored "-Wunused-function"
#include "cpu/cpu_dequant_impl.h"

#include "check.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define DIM 128
#define HEADS 16
#define KEYS 45 /* five passes of eight and five single keys */
#define PAIRS 23

static uint32_t rng_state = 12345u;

/* A bf16 value of moderate magnitude and either sign. */
static uint16_t rand_bf16(void)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    const uint32_t r = rng_state >> 8;
    const uint16_t exp = (uint16_t)(120u + (r % 14u)); /* 2^-7 .. 2^6 */
    return (uint16_t)(((r >> 4) & 1u) << 15 | exp << 7 | ((r >> 5) & 0x7fu));
}

static uint8_t rand_byte(void)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return (uint8_t)(rng_state >> 24);
}

static uint32_t rand_pair(void)
{
    const uint32_t lo = rand_bf16();
    return lo | (uint32_t)rand_bf16() << 16;
}

/* One key at a time, the pair broadcast by its own instruction. */
static void scores_one_key(float *s, const uint32_t *qt2, const uint16_t *k, int n, float scale)
{
    for (int j = 0; j < n; j++) {
        __m512 a = _mm512_setzero_ps();
        for (int d = 0; d < DIM; d += 2) {
            uint32_t w;
            memcpy(&w, k + (int64_t)j * DIM + d, sizeof w);
            a = _mm512_dpbf16_ps(a,
                                 (__m512bh)_mm512_loadu_si512((const void *)(qt2 + d / 2 * HEADS)),
                                 (__m512bh)_mm512_set1_epi32((int)w));
        }
        _mm512_storeu_ps(s + (int64_t)j * HEADS, _mm512_mul_ps(a, _mm512_set1_ps(scale)));
    }
}

/* Every code at every position of a 32-code vector: the table route of
 * level_fp8_rows_bf16 against dq_fp8x16_bf16. */
static void check_fp8_lut(void)
{
#if MSA_CPU_DQ_FP8_BF16
    __m512i t[4];
    dq_fp8_bf16_tables(t);
    long bad = 0;
    for (int shift = 0; shift < 32; shift++)
        for (int base = 0; base < 256; base += 32) {
            uint8_t codes[32];
            for (int i = 0; i < 32; i++)
                codes[i] = (uint8_t)(base + (i + shift) % 32);
            uint16_t lut[32], ref[32];
            _mm512_storeu_si512((void *)lut, dq_fp8x32_bf16_lut(codes, t));
            _mm256_storeu_si256((__m256i *)ref, dq_fp8x16_bf16(codes));
            _mm256_storeu_si256((__m256i *)(ref + 16), dq_fp8x16_bf16(codes + 16));
            bad += memcmp(lut, ref, sizeof lut) != 0;
        }
    CHECK(bad == 0, "fp8 to bf16 by table: %ld of 256 vectors differ", bad);
#else
    CHECK(0, "this build's AVX512-BF16 flags do not give the fp8 table route");
#endif
}

/* nvfp4 rows widened to bf16 (level_nvfp4_rows_bf16, two groups a
 * permute) against the scalar read rule with a global scale of 1: the
 * same values bit for bit, NaN where the group scale is NaN; every scale
 * byte appears, and a row of an odd number of groups takes the last
 * group alone. */
static void check_nvfp4_rows(int dim)
{
#if MSA_CPU_DQ_FP8_BF16
    enum { P = 16, PAGES = 2 };
    const int64_t half = (int64_t)P * dim / 2, region = half + (int64_t)P * dim / 16;
    uint8_t *data = malloc((size_t)(region * PAGES));
    uint16_t *out = malloc(sizeof(uint16_t) * P * PAGES * (size_t)dim);
    float *ref = malloc(sizeof(float) * (size_t)dim);
    if (!data || !out || !ref) {
        CHECK(0, "out of memory");
        free(data), free(out), free(ref);
        return;
    }
    int sb = 0;
    for (int pg = 0; pg < PAGES; pg++) {
        uint8_t *base = data + pg * region;
        for (int64_t i = 0; i < half; i++)
            base[i] = rand_byte(); /* two codes */
        for (int64_t i = half; i < region; i++)
            base[i] = (uint8_t)(sb++ % 256);
    }
    const cpu_plane pl = {data, MSA_DTYPE_NVFP4, 1, dim, P, 1.0f, 0, 0, 0};
    const int32_t pages[PAGES] = {0, 1};
    level_nvfp4_rows_bf16(out, &pl, pages, 0, 0, P * PAGES);
    long bad = 0;
    for (int r = 0; r < P * PAGES; r++) {
        const uint8_t *codes, *scales;
        cpu_plane_nvfp4_row(&pl, pages[r / P], 0, r % P, &codes, &scales);
        msa_nvfp4_dequantize(ref, codes, scales, dim, 1.0f);
        for (int d = 0; d < dim; d++) {
            const uint32_t w = (uint32_t)out[(int64_t)r * dim + d] << 16;
            float v;
            memcpy(&v, &w, sizeof v);
            bad += ref[d] != ref[d] ? v == v : memcmp(&v, &ref[d], sizeof v) != 0;
        }
    }
    CHECK(bad == 0, "nvfp4 rows of dim %d as bf16: %ld of %d values differ", dim, bad,
          P * PAGES * dim);
    free(data), free(out), free(ref);
#else
    (void)dim;
    CHECK(0, "this build's AVX512-BF16 flags do not give the nvfp4 bf16 route");
#endif
}

int main(void)
{
    if (!__builtin_cpu_supports("avx512bf16")) {
        printf("this CPU has no AVX512-BF16: skipped\n");
        return 77;
    }
    uint32_t *qt2 = malloc(sizeof(uint32_t) * DIM / 2 * HEADS);
    uint16_t *k = malloc(sizeof(uint16_t) * KEYS * DIM);
    float *s_new = malloc(sizeof(float) * KEYS * HEADS);
    float *s_ref = malloc(sizeof(float) * KEYS * HEADS);
    uint32_t *pp = malloc(sizeof(uint32_t) * PAIRS * HEADS);
    uint32_t *vp = malloc(sizeof(uint32_t) * PAIRS * DIM);
    float *o_new = malloc(sizeof(float) * HEADS * DIM);
    float *o_ref = malloc(sizeof(float) * HEADS * DIM);
    if (!qt2 || !k || !s_new || !s_ref || !pp || !vp || !o_new || !o_ref) {
        CHECK(0, "out of memory");
        return check_finish();
    }
    check_fp8_lut();
    check_nvfp4_rows(128);
    check_nvfp4_rows(48);
    for (int i = 0; i < DIM / 2 * HEADS; i++)
        qt2[i] = rand_pair();
    for (int i = 0; i < KEYS * DIM; i++)
        k[i] = rand_bf16();
    for (int i = 0; i < PAIRS * HEADS; i++)
        pp[i] = rand_pair();
    for (int i = 0; i < PAIRS * DIM; i++)
        vp[i] = rand_pair();

    for (int n = 1; n <= KEYS; n += 11) {
        msa_scores_heads_bf16(s_new, qt2, HEADS, k, DIM, n, 0.125f);
        scores_one_key(s_ref, qt2, k, n, 0.125f);
        CHECK(memcmp(s_new, s_ref, sizeof(float) * (size_t)n * HEADS) == 0,
              "scores of %d keys differ from one key at a time", n);
    }
    /* The same scores while prefetching another buffer's lines. */
    for (int n = 5; n <= KEYS; n += 20) {
        const int64_t bytes = (int64_t)sizeof(uint16_t) * KEYS * DIM / 2;
        dr_next nx = {(const char *)k, (const char *)vp, bytes};
        msa_scores16_bf16_prefetch(s_new, qt2, k, DIM, n, 0.125f, &nx);
        scores_one_key(s_ref, qt2, k, n, 0.125f);
        CHECK(memcmp(s_new, s_ref, sizeof(float) * (size_t)n * HEADS) == 0,
              "prefetching scores of %d keys differ from one key at a time", n);
        CHECK(nx.left >= 0 && nx.k - (const char *)k == bytes - nx.left &&
                  nx.v - (const char *)vp == bytes - nx.left,
              "the prefetch stream of %d keys advanced inconsistently", n);
    }
    float corr[HEADS];
    for (int h = 0; h < HEADS; h++) {
        corr[h] = 0.5f + 0.03125f * (float)h;
        for (int d = 0; d < DIM; d++)
            o_ref[h * DIM + d] = o_new[h * DIM + d] = (float)((h * 7 + d) % 13) - 6.0f;
    }
    /* Four heads per pass, the first pass also prefetching another
     * buffer's lines (they must not change a bit). */
    const int64_t pf_bytes = (int64_t)sizeof(uint16_t) * KEYS * DIM / 2;
    dr_next pv_nx = {(const char *)k, (const char *)vp, pf_bytes};
    for (int h = 0; h < HEADS; h += 4)
        msa_pv_tile4_bf16(o_new + h * DIM, corr + h, pp + h, HEADS, vp, DIM, PAIRS,
                          h == 0 ? &pv_nx : NULL);
    CHECK(pv_nx.left < pf_bytes && pv_nx.k - (const char *)k == pf_bytes - pv_nx.left,
          "the P.V passes did not advance the prefetch stream");
    for (int h = 0; h < HEADS; h++)
        msa_pv_tile_bf16(o_ref + h * DIM, corr[h], pp + h, HEADS, vp, DIM, PAIRS);
    CHECK(memcmp(o_new, o_ref, sizeof(float) * HEADS * DIM) == 0,
          "P.V of four heads per pass differs from one head at a time");
    int finite = 1;
    for (int i = 0; i < HEADS * DIM; i++)
        finite &= o_new[i] == o_new[i] && o_new[i] - o_new[i] == 0.0f;
    CHECK(finite, "P.V outputs are not all finite");

    free(qt2);
    free(k);
    free(s_new);
    free(s_ref);
    free(pp);
    free(vp);
    free(o_new);
    free(o_ref);
    return check_finish();
}
