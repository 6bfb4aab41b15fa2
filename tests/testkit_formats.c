/*
 * Element formats of SPEC 8, written independently of the library: bf16,
 * fp16, OCP fp8 e4m3fn and NVFP4 (E2M1 codes with E4M3 group scales), plus
 * the byte layout of a cache plane.  Encoders pick the nearest value by
 * plain search where that is the most obviously correct way.
 */
#include "testkit_internal.h"

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

/* ---- random numbers ----------------------------------------------------- */

uint64_t tk_rng_next(tk_rng *rng)
{
    uint64_t z = (rng->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double tk_rng_uniform(tk_rng *rng)
{
    return (double)(tk_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

float tk_rng_gauss(tk_rng *rng)
{
    /* Box-Muller; 1 - u keeps the log argument in (0, 1]. */
    double u = 1.0 - tk_rng_uniform(rng);
    double w = tk_rng_uniform(rng);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w));
}

int tk_rng_below(tk_rng *rng, int n)
{
    return n <= 1 ? 0 : (int)(tk_rng_next(rng) % (uint64_t)n);
}

/* ---- bf16 / fp16 --------------------------------------------------------- */

uint16_t tk_f32_to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if (isnan(x))
        return (uint16_t)((u >> 16) | 0x40); /* keep it a (quiet) NaN */
    u += 0x7fffu + ((u >> 16) & 1u);         /* ties to even; carries into inf */
    return (uint16_t)(u >> 16);
}

float tk_bf16_to_f32(uint16_t x)
{
    return bits_f32((uint32_t)x << 16);
}

/* m / 2^sh rounded to nearest, ties to even (1 <= sh <= 31). */
static uint32_t shift_rne(uint32_t m, int sh)
{
    uint32_t q = m >> sh;
    uint32_t rem = m & ((1u << sh) - 1u);
    uint32_t half = 1u << (sh - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return q;
}

uint16_t tk_f32_to_f16(float x)
{
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    int ex = (int)((u >> 23) & 0xffu);
    uint32_t man = u & 0x7fffffu;

    if (ex == 255)
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0u));
    if (ex == 0)
        return sign; /* fp32 subnormals are far below the smallest fp16 */

    uint32_t m = man | 0x800000u; /* value = m * 2^(e - 23) */
    int e = ex - 127;
    if (e >= -14) {
        uint32_t hm = shift_rne(m, 13); /* 11 significant bits */
        int he = e + 15;
        if (hm == (1u << 11)) {
            hm >>= 1;
            he++;
        }
        if (he >= 31)
            return (uint16_t)(sign | 0x7c00u);
        return (uint16_t)(sign | (uint32_t)he << 10 | (hm & 0x3ffu));
    }
    /* fp16 subnormal: units of 2^-24, value / 2^-24 = m * 2^(e + 1). A carry
     * into bit 10 lands exactly on the smallest normal encoding. */
    int sh = -e - 1;
    uint32_t hm = sh >= 32 ? 0u : shift_rne(m, sh);
    return (uint16_t)(sign | hm);
}

float tk_f16_to_f32(uint16_t x)
{
    int sign = (x >> 15) & 1;
    int ex = (x >> 10) & 0x1f;
    int man = x & 0x3ff;
    double v;
    if (ex == 0x1f)
        v = man ? NAN : INFINITY;
    else if (ex == 0)
        v = ldexp((double)man, -24);
    else
        v = ldexp((double)(man | 0x400), ex - 25);
    return (float)(sign ? -v : v);
}

/* ---- fp8 e4m3fn ------------------------------------------------------------ */

float tk_e4m3_to_f32(uint8_t x)
{
    int sign = x >> 7;
    int ex = (x >> 3) & 0xf;
    int man = x & 7;
    double v;
    if (ex == 0xf && man == 7)
        return NAN;
    if (ex == 0)
        v = ldexp((double)man, -9);
    else
        v = ldexp((double)(8 + man), ex - 10);
    return (float)(sign ? -v : v);
}

uint8_t tk_f32_to_e4m3(float x)
{
    if (isnan(x))
        return 0x7f;
    double a = fabs((double)x);
    /* Codes 0..0x7e are the non-negative finite values in increasing order:
     * find the last code not above a, then pick the nearer of it and the
     * next one (ties to the even code; above 448 the last code saturates). */
    int lo = 0, hi = 0x7e;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if ((double)tk_e4m3_to_f32((uint8_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    int best = lo;
    if (lo < 0x7e) {
        double below = a - (double)tk_e4m3_to_f32((uint8_t)lo);
        double above = (double)tk_e4m3_to_f32((uint8_t)(lo + 1)) - a;
        if (above < below || (above == below && ((lo + 1) & 1) == 0))
            best = lo + 1;
    }
    return (uint8_t)(best | (x < 0 ? 0x80 : 0));
}

/* ---- e2m1 ------------------------------------------------------------------- */

static const float e2m1_values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float tk_e2m1_to_f32(unsigned code)
{
    float v = e2m1_values[code & 7u];
    return (code & 8u) ? -v : v;
}

unsigned tk_f32_to_e2m1(float x)
{
    double a = fabs((double)x);
    unsigned best = 0;
    double best_d = INFINITY;
    for (unsigned c = 0; c < 8; c++) {
        double d = fabs(a - (double)e2m1_values[c]);
        if (d < best_d || (d == best_d && (c & 1u) == 0)) {
            best = c;
            best_d = d;
        }
    }
    return best | (x < 0 ? 8u : 0u);
}

/* ---- activations ---------------------------------------------------------- */

float tk_round_act(msa_dtype dtype, float x)
{
    switch (dtype) {
    case MSA_DTYPE_BF16: return tk_bf16_to_f32(tk_f32_to_bf16(x));
    case MSA_DTYPE_FP16: return tk_f16_to_f32(tk_f32_to_f16(x));
    default: return x;
    }
}

void tk_store_act(void *base, msa_dtype dtype, size_t i, float x)
{
    if (dtype == MSA_DTYPE_FP32) {
        ((float *)base)[i] = x;
    } else {
        uint16_t h = dtype == MSA_DTYPE_BF16 ? tk_f32_to_bf16(x) : tk_f32_to_f16(x);
        ((uint16_t *)base)[i] = h;
    }
}

float tk_load_act(const void *base, msa_dtype dtype, size_t i)
{
    switch (dtype) {
    case MSA_DTYPE_BF16: return tk_bf16_to_f32(((const uint16_t *)base)[i]);
    case MSA_DTYPE_FP16: return tk_f16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

void tk_poison_act(void *base, msa_dtype dtype, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (dtype == MSA_DTYPE_FP32)
            ((uint32_t *)base)[i] = 0x7fc00000u;
        else
            ((uint16_t *)base)[i] = dtype == MSA_DTYPE_BF16 ? 0x7fc0u : 0x7e00u;
    }
}

/* ---- plane layout ----------------------------------------------------------- */

/* Bytes of one (page, head) region. */
static size_t region_bytes(const tk_plane *pl)
{
    size_t elems = (size_t)pl->page_size * (size_t)pl->dim;
    if (pl->dtype == MSA_DTYPE_NVFP4)
        return elems / 2 + elems / 16; /* codes, then one E4M3 scale per 16 */
    if (pl->dtype == MSA_DTYPE_FP8_E4M3)
        return elems;
    return elems * (pl->dtype == MSA_DTYPE_FP32 ? 4 : 2);
}

size_t tk_plane_bytes(const tk_plane *pl)
{
    return (size_t)pl->pages * (size_t)pl->heads * region_bytes(pl);
}

static uint8_t *region(const tk_plane *pl, const uint8_t *img, int64_t page, int head)
{
    return (uint8_t *)img + ((size_t)page * (size_t)pl->heads + (size_t)head) * region_bytes(pl);
}

/* One NVFP4 group of 16 values, SPEC 8; float arithmetic as written there. */
void tk_nvfp4_encode_group(const float *x, float global, uint8_t *scale_byte, unsigned codes[16])
{
    float amax = 0.0f;
    int nan = 0;
    for (int e = 0; e < 16; e++) {
        nan |= isnan(x[e]);
        if (fabsf(x[e]) > amax)
            amax = fabsf(x[e]);
    }
    if (nan) { /* a group with a NaN: NaN scale byte, zero codes; reads NaN */
        *scale_byte = 0x7f;
        for (int e = 0; e < 16; e++)
            codes[e] = 0;
        return;
    }
    float want = amax / (6.0f * global);
    if (want > 448.0f)
        want = 448.0f;
    uint8_t sb = tk_f32_to_e4m3(want);
    float s = tk_e4m3_to_f32(sb);
    *scale_byte = sb;
    for (int e = 0; e < 16; e++)
        codes[e] = s == 0.0f ? 0u : tk_f32_to_e2m1(x[e] / (s * global));
}

void tk_plane_put(const tk_plane *pl, uint8_t *img, int64_t page, int head, int slot,
                  const float *x)
{
    uint8_t *base = region(pl, img, page, head);
    const size_t D = (size_t)pl->dim, t = (size_t)slot;
    switch (pl->dtype) {
    case MSA_DTYPE_FP32: memcpy(base + t * D * 4, x, D * 4); break;
    case MSA_DTYPE_BF16:
    case MSA_DTYPE_FP16:
        for (size_t e = 0; e < D; e++)
            tk_store_act(base, pl->dtype, t * D + e, x[e]);
        break;
    case MSA_DTYPE_FP8_E4M3:
        for (size_t e = 0; e < D; e++)
            base[t * D + e] = tk_f32_to_e4m3(x[e] / pl->scale);
        break;
    case MSA_DTYPE_NVFP4: {
        uint8_t *codes = base + t * D / 2;
        uint8_t *scales = base + (size_t)pl->page_size * D / 2 + t * D / 16;
        for (size_t g = 0; g < D / 16; g++) {
            unsigned c[16];
            tk_nvfp4_encode_group(x + g * 16, pl->scale, &scales[g], c);
            for (int e = 0; e < 16; e += 2) /* low nibble = even element */
                codes[g * 8 + (size_t)e / 2] = (uint8_t)(c[e] | c[e + 1] << 4);
        }
        break;
    }
    }
}

void tk_plane_get(const tk_plane *pl, const uint8_t *img, int64_t page, int head, int slot,
                  float *x)
{
    const uint8_t *base = region(pl, img, page, head);
    const size_t D = (size_t)pl->dim, t = (size_t)slot;
    switch (pl->dtype) {
    case MSA_DTYPE_FP32: memcpy(x, base + t * D * 4, D * 4); break;
    case MSA_DTYPE_BF16:
    case MSA_DTYPE_FP16:
        for (size_t e = 0; e < D; e++)
            x[e] = tk_load_act(base, pl->dtype, t * D + e);
        break;
    case MSA_DTYPE_FP8_E4M3:
        for (size_t e = 0; e < D; e++)
            x[e] = tk_e4m3_to_f32(base[t * D + e]) * pl->scale;
        break;
    case MSA_DTYPE_NVFP4: {
        const uint8_t *codes = base + t * D / 2;
        const uint8_t *scales = base + (size_t)pl->page_size * D / 2 + t * D / 16;
        for (size_t e = 0; e < D; e++) {
            unsigned c = (codes[e / 2] >> ((e & 1) * 4)) & 0xfu;
            x[e] = tk_e2m1_to_f32(c) * tk_e4m3_to_f32(scales[e / 16]) * pl->scale;
        }
        break;
    }
    }
}

int tk_plane_row_equal(const tk_plane *pl, const uint8_t *a, const uint8_t *b, int64_t page,
                       int head, int slot)
{
    const size_t D = (size_t)pl->dim, t = (size_t)slot;
    const uint8_t *ra = region(pl, a, page, head), *rb = region(pl, b, page, head);
    if (pl->dtype == MSA_DTYPE_NVFP4) {
        size_t sc = (size_t)pl->page_size * D / 2;
        if (!memcmp(ra + t * D / 2, rb + t * D / 2, D / 2) &&
            !memcmp(ra + sc + t * D / 16, rb + sc + t * D / 16, D / 16))
            return 1;
    } else {
        size_t w = pl->dtype == MSA_DTYPE_FP32 ? 4 : pl->dtype == MSA_DTYPE_FP8_E4M3 ? 1 : 2;
        if (!memcmp(ra + t * D * w, rb + t * D * w, D * w))
            return 1;
        if (pl->dtype != MSA_DTYPE_FP8_E4M3)
            return 0;
    }
    /* Quantized rows may differ only in the sign of a zero code. */
    float xa[1024], xb[1024];
    if (D > 1024)
        return 0;
    tk_plane_get(pl, a, page, head, slot, xa);
    tk_plane_get(pl, b, page, head, slot, xb);
    for (size_t e = 0; e < D; e++)
        if (!(xa[e] == xb[e] || (isnan(xa[e]) && isnan(xb[e]))))
            return 0;
    return 1;
}
