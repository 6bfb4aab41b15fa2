/*
 * The CUDA backend's quantized formats (src/cuda/common/quant.cuh) against
 * the core's (src/core/quant.c), bit for bit (any NaN equals any NaN: the
 * sign of a NaN product is left open on both sides):
 *   - E4M3 and E2M1 decoding of every code;
 *   - E4M3 and E2M1 encoding of every float whose low 12 bits are one of
 *     0, 1, 0x7ff, 0x800, 0x801, 0xfff (every rounding boundary of both
 *     formats lies among them, and every exponent, sign, NaN and infinity);
 *   - fp8 reads of every code at scales down to subnormal products;
 *   - nvfp4 reads of every code pair with every group-scale byte, at
 *     several global scales;
 *   - nvfp4 group writes: random groups over many magnitudes, groups at
 *     the E2M1 midpoints, zero, tiny, huge, infinite and NaN groups;
 *   - nvfp4 rows found in a plane's (page, head) regions, read back as
 *     msa_dequantize_rows reads them;
 *   - the indexer's widening (quant_widen.cuh): every E4M3 code in every
 *     byte of a word, every E2M1 code in every nibble times every group
 *     scale byte, the same values as the decode above (NaN codes flagged),
 *     each exact in bf16 and in fp16 (host side);
 *   - the attention's pair widening (quant_widen.cuh): every E4M3 code in
 *     every byte of a word straight to fp16 and to bf16, bit for bit the
 *     decode's value, NaN codes NaN (the bits before the product on the
 *     host, the whole widening on a GPU);
 *   - the attention's fp16 nvfp4 widening (quant_widen.cuh, GPU only):
 *     every E2M1 code in every nibble of a chunk times every group-scale
 *     byte, bit for bit the decode's product, NaN scales NaN;
 *   - bf16 queries scaled into fp16 for products over fp8 codes
 *     (q_f16.cuh, GPU only): per warp a power of two that takes the
 *     largest finite magnitude into [2^14, 2^15) (or 2^24 for warps below
 *     2^-10), every value exact where SPEC's products need it, infinities
 *     and NaNs kept;
 *   - bf16 queries as two E4M3 terms for fp8 products (q_e4m3.cuh, GPU
 *     only, sm_89 and later): per row a power of two that takes the
 *     largest finite magnitude into [2^7, 2^8) (2^126 for rows below
 *     2^-119), NaN for rows with an infinity or a NaN, each value's two
 *     terms at its fragment place, their sum the value times 2^s exactly
 *     from 2^-2 up and within 2^-10 below.
 *   test_cuda_quant [--host]
 * The same checks run on the host (the functions compile for both) and, on
 * a GPU, in kernels; --host runs only the first.  Without a GPU the device
 * part prints "skipped" and the program exits 77 (after the host part).
 */
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda/common/quant.cuh"
#include "cuda/common/quant_widen.cuh"
#include "cuda/common/q_f16.cuh"
#include "cuda/common/q_e4m3.cuh"

extern "C" {
#include "core/internal.h" /* msa_f32_to_bf16 */
#include "core/quant.h"
}

#define EXIT_SKIPPED 77

/* ---- inputs ---------------------------------------------------------------- */

static const uint32_t LOW_BITS[] = {0u, 1u, 0x7ffu, 0x800u, 0x801u, 0xfffu};
#define N_LOW (sizeof LOW_BITS / sizeof LOW_BITS[0])
#define N_ENC (((size_t)1 << 20) * N_LOW)

static const float SCALES[] = {1.0f, 0.37f, 1e-40f, 3.0e-3f, 7.5e36f, 1.5e38f, 2.0f, 0.05f};
#define N_SCALES (sizeof SCALES / sizeof SCALES[0])
static const float GLOBALS[] = {1.0f, 0.5f, 1e-3f, 3.7f, 1e-30f, 1e30f, 0.01f};
#define N_GLOBALS (sizeof GLOBALS / sizeof GLOBALS[0])

/* Plane of the row test: nvfp4 regions of P rows of D elements. */
enum { PL_PAGES = 3, PL_HEADS = 2, PL_P = 8, PL_D = 48 };
#define PL_BYTES ((size_t)PL_PAGES * PL_HEADS * PL_P * PL_D * 9 / 16)
#define PL_ELEMS ((size_t)PL_PAGES * PL_HEADS * PL_P * PL_D)

typedef struct inputs {
    float *enc;          /* [N_ENC] floats to encode */
    int n_groups;        /* nvfp4 groups to encode */
    float *groups;       /* [n_groups][16] */
    float *group_global; /* [n_groups] */
    uint8_t *plane;      /* [PL_BYTES] an nvfp4 plane's bytes */
} inputs;

/* Results of one side (host or device), in the same layout. */
typedef struct results {
    uint8_t *e4m3_enc, *e2m1_enc;  /* [N_ENC] */
    float *e4m3_dec, *e2m1_dec;    /* [256], [16] */
    float *fp8_dq;                 /* [N_SCALES][256] */
    float *nv_dq;                  /* [N_GLOBALS][256 scale bytes][256 pairs][2] */
    uint8_t *nv_codes, *nv_scales; /* [n_groups][8], [n_groups] */
    float *plane_dq;               /* [PL_ELEMS] in (page, head, slot, d) order */
} results;

#define N_NV_DQ ((size_t)N_GLOBALS * 256 * 256 * 2)

static uint64_t rng_state = 0x7175616e74ull;
static uint32_t rng_u32(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}
static float rng_unit(void) /* in [-1, 1) */
{
    return (float)((int32_t)(rng_u32() & 0xffffffu) - 0x800000) / (float)0x800000;
}

static float f32_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static void make_inputs(inputs *in)
{
    in->enc = (float *)malloc(N_ENC * sizeof(float));
    for (size_t hi = 0; hi < ((size_t)1 << 20); hi++)
        for (size_t k = 0; k < N_LOW; k++)
            in->enc[hi * N_LOW + k] = f32_of((uint32_t)(hi << 12) | LOW_BITS[k]);

    /* Groups: random at magnitudes 2^-30 .. 2^30, E2M1 points and midpoints
     * times a scale, specials; each with one of the globals. */
    static const float mids[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f,
                                 0.5f,  1.0f,  1.5f,  2.0f,  3.0f, 4.0f, 0.0f, 5.5f};
    const int n_random = 20000, n_special = 8;
    in->n_groups = (n_random + 16 + n_special) * (int)N_GLOBALS;
    in->groups = (float *)malloc((size_t)in->n_groups * 16 * sizeof(float));
    in->group_global = (float *)malloc((size_t)in->n_groups * sizeof(float));
    int g = 0;
    for (size_t gi = 0; gi < N_GLOBALS; gi++) {
        const float global = GLOBALS[gi];
        for (int r = 0; r < n_random; r++, g++) {
            const float mag = ldexpf(1.0f, (int)(rng_u32() % 61) - 30);
            for (int e = 0; e < 16; e++)
                in->groups[g * 16 + e] = rng_unit() * mag;
            in->group_global[g] = global;
        }
        /* Midpoints: amax 6 * 2^k * global makes the group scale 2^k
         * exactly, so x / (scale * global) lands on the listed values. */
        for (int k = 0; k < 16; k++, g++) {
            const float s = ldexpf(1.0f, k - 8);
            for (int e = 0; e < 16; e++)
                in->groups[g * 16 + e] = (e & 1 ? -1.0f : 1.0f) * mids[(e + k) % 16] * s * global;
            in->groups[g * 16 + (k % 16)] = 6.0f * s * global;
            in->group_global[g] = global;
        }
        for (int k = 0; k < n_special; k++, g++) {
            float *x = in->groups + g * 16;
            for (int e = 0; e < 16; e++)
                x[e] = rng_unit();
            switch (k) {
            case 0: memset(x, 0, 16 * sizeof(float)); break;
            case 1: x[5] = NAN; break;
            case 2: x[0] = INFINITY; break;
            case 3: x[15] = -INFINITY; break;
            case 4:
                for (int e = 0; e < 16; e++)
                    x[e] *= 1e-38f;
                break;
            case 5:
                for (int e = 0; e < 16; e++)
                    x[e] *= 3e38f;
                break;
            case 6:
                x[3] = -0.0f;
                x[4] = f32_of(1u);
                break;
            default:
                for (int e = 0; e < 16; e++)
                    x[e] = e % 2 ? -0.0f : 0.0f;
                break;
            }
            in->group_global[g] = global;
        }
    }
    in->plane = (uint8_t *)malloc(PL_BYTES);
    for (size_t b = 0; b < PL_BYTES; b++)
        in->plane[b] = (uint8_t)(b < 256 ? b : rng_u32());
}

static void alloc_results(results *r, int n_groups, int on_device)
{
    void **p[] = {(void **)&r->e4m3_enc, (void **)&r->e2m1_enc,  (void **)&r->e4m3_dec,
                  (void **)&r->e2m1_dec, (void **)&r->fp8_dq,    (void **)&r->nv_dq,
                  (void **)&r->nv_codes, (void **)&r->nv_scales, (void **)&r->plane_dq};
    const size_t bytes[] = {N_ENC,
                            N_ENC,
                            256 * sizeof(float),
                            16 * sizeof(float),
                            N_SCALES * 256 * sizeof(float),
                            N_NV_DQ * sizeof(float),
                            (size_t)n_groups * 8,
                            (size_t)n_groups,
                            PL_ELEMS * sizeof(float)};
    for (size_t i = 0; i < sizeof bytes / sizeof bytes[0]; i++) {
        if (on_device) {
            if (cudaMalloc(p[i], bytes[i]) != cudaSuccess)
                *p[i] = NULL;
        } else {
            *p[i] = malloc(bytes[i]);
        }
    }
}

/* ---- one item of each check: the same code on the host and the device --- */

/* The nvfp4 plane's element i in (page, head, slot, d) order. */
__host__ __device__ static float plane_elem(const uint8_t *plane, size_t i, float global)
{
    const int32_t d = (int32_t)(i % PL_D);
    const int32_t slot = (int32_t)(i / PL_D % PL_P);
    const int64_t region = (int64_t)(i / PL_D / PL_P) * PL_P * PL_D;
    return cu_qrow_load(plane, MSA_DTYPE_NVFP4, global, cu_nvfp4_row(region, slot, PL_P, PL_D), d);
}

__host__ __device__ static void run_item(const inputs &in, const results &out, size_t i,
                                         const float *scales, const float *globals)
{
    if (i < N_ENC) {
        out.e4m3_enc[i] = cu_f32_to_e4m3(in.enc[i]);
        out.e2m1_enc[i] = cu_f32_to_e2m1(in.enc[i]);
    }
    if (i < 256)
        out.e4m3_dec[i] = cu_e4m3_to_f32((uint32_t)i);
    if (i < 16)
        out.e2m1_dec[i] = cu_e2m1_to_f32((uint32_t)i);
    if (i < N_SCALES * 256)
        out.fp8_dq[i] = cu_fp8_dequantize((uint32_t)(i % 256), scales[i / 256]);
    if (i < N_NV_DQ / 2) {
        const uint32_t pair = (uint32_t)(i % 256), sb = (uint32_t)(i / 256 % 256);
        const float global = globals[i / 65536];
        out.nv_dq[2 * i] = cu_nvfp4_dequantize(pair & 0xfu, sb, global);
        out.nv_dq[2 * i + 1] = cu_nvfp4_dequantize(pair >> 4, sb, global);
    }
    if (i < (size_t)in.n_groups)
        cu_nvfp4_quantize_group(out.nv_codes + 8 * i, out.nv_scales + i, in.groups + 16 * i,
                                in.group_global[i]);
    if (i < PL_ELEMS)
        out.plane_dq[i] = plane_elem(in.plane, i, 0.75f);
}

static size_t n_items(const inputs &in)
{
    size_t n = N_ENC;
    if (N_NV_DQ / 2 > n)
        n = N_NV_DQ / 2;
    if ((size_t)in.n_groups > n)
        n = (size_t)in.n_groups;
    return n;
}

__global__ void run_items_kernel(inputs in, results out, size_t n, const float *scales,
                                 const float *globals)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        run_item(in, out, i, scales, globals);
}

/* ---- the reference and the comparison ------------------------------------ */

static int same_float(float a, float b)
{
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y || (isnan(a) && isnan(b));
}

static void compare(const char *side, const inputs &in, const results &got)
{
    long bad = 0;
    size_t first = 0;
    for (size_t i = 0; i < N_ENC; i++)
        if (got.e4m3_enc[i] != msa_f32_to_e4m3(in.enc[i]) && !bad++)
            first = i;
    CHECK(bad == 0, "%s: e4m3 encode: %ld of %zu differ (first %a -> 0x%02x, want 0x%02x)", side,
          bad, (size_t)N_ENC, (double)in.enc[first], got.e4m3_enc[first],
          msa_f32_to_e4m3(in.enc[first]));
    bad = 0;
    for (size_t i = 0; i < N_ENC; i++)
        if (got.e2m1_enc[i] != msa_f32_to_e2m1(in.enc[i]) && !bad++)
            first = i;
    CHECK(bad == 0, "%s: e2m1 encode: %ld of %zu differ (first %a -> 0x%x, want 0x%x)", side, bad,
          (size_t)N_ENC, (double)in.enc[first], got.e2m1_enc[first],
          msa_f32_to_e2m1(in.enc[first]));
    bad = 0;
    for (int c = 0; c < 256; c++)
        bad += !same_float(got.e4m3_dec[c], msa_e4m3_to_f32((uint8_t)c));
    CHECK(bad == 0, "%s: e4m3 decode: %ld of 256 codes differ", side, bad);
    bad = 0;
    for (int c = 0; c < 16; c++)
        bad += !same_float(got.e2m1_dec[c], msa_e2m1_to_f32((uint8_t)c));
    CHECK(bad == 0, "%s: e2m1 decode: %ld of 16 codes differ", side, bad);

    for (size_t s = 0; s < N_SCALES; s++) {
        uint8_t codes[256];
        float want[256];
        for (int c = 0; c < 256; c++)
            codes[c] = (uint8_t)c;
        msa_fp8_dequantize(want, codes, 256, SCALES[s]);
        bad = 0;
        for (int c = 0; c < 256; c++)
            bad += !same_float(got.fp8_dq[s * 256 + c], want[c]);
        CHECK(bad == 0, "%s: fp8 read at scale %g: %ld of 256 codes differ", side,
              (double)SCALES[s], bad);
    }
    for (size_t gi = 0; gi < N_GLOBALS; gi++) {
        bad = 0;
        for (int sb = 0; sb < 256; sb++)
            for (int pair = 0; pair < 256; pair++) {
                uint8_t codes[8];
                const uint8_t scale = (uint8_t)sb;
                float want[16];
                memset(codes, pair, sizeof codes);
                msa_nvfp4_dequantize(want, codes, &scale, 16, GLOBALS[gi]);
                const float *g = got.nv_dq + ((gi * 256 + sb) * 256 + pair) * 2;
                bad += !same_float(g[0], want[0]) || !same_float(g[1], want[1]);
            }
        CHECK(bad == 0, "%s: nvfp4 read at global %g: %ld of 65536 pairs differ", side,
              (double)GLOBALS[gi], bad);
    }
    bad = 0;
    for (int g = 0; g < in.n_groups; g++) {
        uint8_t codes[8], scale;
        msa_nvfp4_quantize(codes, &scale, in.groups + 16 * g, 16, in.group_global[g]);
        if ((memcmp(codes, got.nv_codes + 8 * g, 8) || scale != got.nv_scales[g]) && !bad++)
            first = (size_t)g;
    }
    CHECK(bad == 0, "%s: nvfp4 group write: %ld of %d groups differ (first %zu)", side, bad,
          in.n_groups, first);

    /* The plane's regions as msa_dequantize_rows reads them: P rows of
     * codes, then P rows of group scales. */
    static float want[PL_ELEMS];
    const size_t region_bytes = (size_t)PL_P * PL_D * 9 / 16;
    for (size_t r = 0; r < (size_t)PL_PAGES * PL_HEADS; r++) {
        const uint8_t *base = in.plane + r * region_bytes;
        msa_status st = msa_dequantize_rows(NULL, MSA_DTYPE_NVFP4, 0.75f, base,
                                            base + PL_P * PL_D / 2, PL_P, PL_D,
                                            want + r * PL_P * PL_D, MSA_DTYPE_FP32);
        CHECK(st == MSA_OK, "msa_dequantize_rows: %d", (int)st);
    }
    bad = 0;
    for (size_t i = 0; i < PL_ELEMS; i++)
        bad += !same_float(got.plane_dq[i], want[i]);
    CHECK(bad == 0, "%s: nvfp4 plane rows: %ld of %zu elements differ", side, bad,
          (size_t)PL_ELEMS);
}

/* ---- the indexer's widening ---------------------------------------------- */

/* Items: 256 E4M3 codes x 4 bytes, then 16 E2M1 codes x 8 nibbles x 256
 * group-scale bytes.  The other bytes and nibbles of each word hold other
 * codes, which must not leak into the one read. */
#define N_WIDEN_FP8 (256 * 4)
#define N_WIDEN (N_WIDEN_FP8 + 16 * 8 * 256)

__host__ __device__ static float widen_fp8_at(uint32_t w, int k)
{
    switch (k) {
    case 0: return cu_e4m3_widen<0>(w);
    case 1: return cu_e4m3_widen<1>(w);
    case 2: return cu_e4m3_widen<2>(w);
    default: return cu_e4m3_widen<3>(w);
    }
}

__host__ __device__ static float widen_nv_at(uint32_t w, int j, float scale)
{
    switch (j) {
    case 0: return cu_nvfp4_widen<0>(w, scale);
    case 1: return cu_nvfp4_widen<1>(w, scale);
    case 2: return cu_nvfp4_widen<2>(w, scale);
    case 3: return cu_nvfp4_widen<3>(w, scale);
    case 4: return cu_nvfp4_widen<4>(w, scale);
    case 5: return cu_nvfp4_widen<5>(w, scale);
    case 6: return cu_nvfp4_widen<6>(w, scale);
    default: return cu_nvfp4_widen<7>(w, scale);
    }
}

/* Item i's widened value; nan: whether its code was flagged as NaN (fp8). */
__host__ __device__ static float widen_item(size_t i, int *nan)
{
    *nan = 0;
    if (i < N_WIDEN_FP8) {
        const uint32_t code = (uint32_t)(i / 4), k = (uint32_t)(i % 4);
        const uint32_t other = (code * 0x9du + 0x3bu) & 0xffu;
        const uint32_t w = (other * 0x01010101u & ~(0xffu << (8 * k))) | code << (8 * k);
        *nan = (cu_e4m3_nan_bytes(w) >> (8 * k + 7)) & 1u;
        return widen_fp8_at(w, (int)k);
    }
    const size_t x = i - N_WIDEN_FP8;
    const uint32_t sb = (uint32_t)(x % 256), j = (uint32_t)(x / 256 % 8),
                   code = (uint32_t)(x / 2048);
    const uint32_t other = (code * 7u + 5u) & 0xfu;
    const uint32_t w = (other * 0x11111111u & ~(0xfu << (4 * j))) | code << (4 * j);
    return widen_nv_at(w, (int)j, cu_e4m3_to_f32(sb));
}

__global__ static void widen_kernel(float *val, int *nan)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N_WIDEN;
         i += (size_t)gridDim.x * blockDim.x)
        val[i] = widen_item(i, &nan[i]);
}

/* Whether v has a bf16 (fp16) form: the same value after rounding. */
static int exact_bf16(float v)
{
    return isnan(v) || (cu_q_bits(v) & 0xffffu) == 0;
}

static int exact_f16(float v)
{
    if (isnan(v) || v == 0.0f)
        return 1;
    if (fabsf(v) > 65504.0f)
        return 0;
    int e = 0;
    frexpf(fabsf(v), &e); /* |v| = m 2^e, m in [0.5, 1) */
    /* Eleven significant bits down to the normal range (2^-14 = 0.5 *
     * 2^-13), a fixed quantum of 2^-24 below it. */
    const float q = ldexpf(1.0f, (e < -13 ? -13 : e) - 11);
    const float n = fabsf(v) / q;
    return n == floorf(n);
}

/* Compares widened values with the decode; host: also their 16-bit forms. */
static void check_widen(const char *side, const float *val, const int *nan, int host)
{
    long bad = 0, flags = 0, inexact = 0;
    for (size_t i = 0; i < N_WIDEN; i++) {
        float want;
        if (i < N_WIDEN_FP8) {
            const uint32_t code = (uint32_t)(i / 4);
            const int is_nan = (code & 0x7fu) == 0x7fu;
            flags += nan[i] != is_nan;
            if (is_nan)
                continue; /* any finite value; the flag stands for it */
            want = cu_e4m3_to_f32(code);
        } else {
            const size_t x = i - N_WIDEN_FP8;
            want =
                cu_q_mul(cu_e2m1_to_f32((uint32_t)(x / 2048)), cu_e4m3_to_f32((uint32_t)(x % 256)));
            flags += nan[i] != 0;
        }
        bad += !same_float(val[i], want);
        inexact += host && !(exact_bf16(want) && exact_f16(want));
    }
    CHECK(bad == 0, "%s: widened codes: %ld of %d differ from the decode", side, bad, N_WIDEN);
    CHECK(flags == 0, "%s: E4M3 NaN flags: %ld wrong", side, flags);
    if (host)
        CHECK(inexact == 0, "%s: %ld widened values without an exact bf16 or fp16 form", side,
              inexact);
}

static void run_widen_host(void)
{
    float *val = (float *)malloc(N_WIDEN * sizeof(float));
    int *nan = (int *)malloc(N_WIDEN * sizeof(int));
    CHECK(val && nan, "host: out of memory");
    if (val && nan) {
        for (size_t i = 0; i < N_WIDEN; i++)
            val[i] = widen_item(i, &nan[i]);
        check_widen("host", val, nan, 1);
    }
    free(val);
    free(nan);
}

static void run_widen_device(void)
{
    float *dval = NULL;
    int *dnan = NULL;
    const int ok = cudaMalloc(&dval, N_WIDEN * sizeof(float)) == cudaSuccess &&
                   cudaMalloc(&dnan, N_WIDEN * sizeof(int)) == cudaSuccess;
    CHECK(ok, "device: widening buffers");
    if (ok) {
        widen_kernel<<<64, 256>>>(dval, dnan);
        float *val = (float *)malloc(N_WIDEN * sizeof(float));
        int *nan = (int *)malloc(N_WIDEN * sizeof(int));
        const int copied =
            val && nan && cudaDeviceSynchronize() == cudaSuccess &&
            cudaMemcpy(val, dval, N_WIDEN * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess &&
            cudaMemcpy(nan, dnan, N_WIDEN * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
        CHECK(copied, "device: widening kernel and copies");
        if (copied)
            check_widen("device", val, nan, 0);
        free(val);
        free(nan);
    }
    cudaFree(dval);
    cudaFree(dnan);
}

/* ---- the attention's pair widening ----------------------------------------- */

/* Items: 256 E4M3 codes x 4 bytes of a word (other codes in the other
 * bytes, as above); each gives the 16-bit half that holds its code, for
 * fp16 (results [0, N)) and bf16 ([N, 2 N)). */
#define N_PAIR (256 * 4)

/* The word of item i and its byte k. */
__host__ __device__ static uint32_t pair_word(size_t i, int *k)
{
    const uint32_t code = (uint32_t)(i / 4);
    *k = (int)(i % 4);
    const uint32_t other = (code * 0x9du + 0x3bu) & 0xffu;
    return (other * 0x01010101u & ~(0xffu << (8 * *k))) | code << (8 * *k);
}

/* The widened pair holding byte k of w, NaN codes marked as the
 * attention's tile widening marks them. */
template <typename Tag>
__device__ static uint32_t pair_widen(uint32_t w, int k)
{
    const uint32_t n = cu_e4m3_nan_bytes(w);
    return k < 2 ? cu_e4m3_widen2<0>(w, Tag()) | cu_e4m3_nan_mask2<0>(n)
                 : cu_e4m3_widen2<1>(w, Tag()) | cu_e4m3_nan_mask2<1>(n);
}

__global__ static void pair_kernel(uint16_t *out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < N_PAIR;
         i += (size_t)gridDim.x * blockDim.x) {
        int k = 0;
        const uint32_t w = pair_word(i, &k);
        const int shift = 16 * (k & 1);
        out[i] = (uint16_t)(pair_widen<cu_f16_tag>(w, k) >> shift);
        out[N_PAIR + i] = (uint16_t)(pair_widen<cu_bf16_tag>(w, k) >> shift);
    }
}

/* A 16-bit value as a float (exact): fp16 or bf16 bits. */
static float f16_value(uint32_t h)
{
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float v;
    if (e == 0x1fu)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexpf((float)m, -24);
    else
        v = ldexpf((float)(m | 0x400u), (int)e - 25);
    return h & 0x8000u ? -v : v;
}

static float bf16_value(uint32_t h)
{
    return f32_of(h << 16);
}

/* Host: the bits before the product, scaled in float (exact), are the
 * decode; the NaN codes land on 480 with their sign. */
static void run_pair_host(void)
{
    long bad = 0;
    for (size_t i = 0; i < N_PAIR; i++) {
        int k = 0;
        const uint32_t w = pair_word(i, &k);
        const uint32_t code = (uint32_t)(i / 4), shift = 16u * (uint32_t)(k & 1);
        const uint32_t h16 = (k < 2 ? cu_e4m3_pair_bits<0, 0>(w) : cu_e4m3_pair_bits<1, 0>(w));
        const uint32_t hbf = (k < 2 ? cu_e4m3_pair_bits<0, 1>(w) : cu_e4m3_pair_bits<1, 1>(w));
        const float v16 = f16_value((h16 >> shift) & 0xffffu) * 256.0f;
        const float vbf = bf16_value((hbf >> shift) & 0xffffu) * ldexpf(1.0f, 120);
        const float want = (code & 0x7fu) == 0x7fu ? (code & 0x80u ? -480.0f : 480.0f)
                                                   : cu_e4m3_to_f32(code);
        bad += !same_float(v16, want) + !same_float(vbf, want);
    }
    CHECK(bad == 0, "host: pair widening bits: %ld of %d differ from the decode", bad, 2 * N_PAIR);
}

/* Device: every pair widened exactly, NaN codes to NaN. */
static void run_pair_device(void)
{
    uint16_t *dout = NULL;
    const int ok = cudaMalloc(&dout, 2 * N_PAIR * sizeof(uint16_t)) == cudaSuccess;
    CHECK(ok, "device: pair widening buffer");
    if (ok) {
        pair_kernel<<<8, 128>>>(dout);
        uint16_t out[2 * N_PAIR];
        const int copied = cudaDeviceSynchronize() == cudaSuccess &&
                           cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost) == cudaSuccess;
        CHECK(copied, "device: pair widening kernel and copy");
        long bad = 0;
        for (size_t i = 0; copied && i < N_PAIR; i++) {
            const float want = cu_e4m3_to_f32((uint32_t)(i / 4)); /* NaN for the NaN codes */
            bad += !same_float(f16_value(out[i]), want) +
                   !same_float(bf16_value(out[N_PAIR + i]), want);
        }
        CHECK(bad == 0, "device: pair widening: %ld of %d differ from the decode", bad, 2 * N_PAIR);
    }
    cudaFree(dout);
}

/* ---- the two sides ---------------------------------------------------------- */

static void run_host(const inputs &in)
{
    results r;
    alloc_results(&r, in.n_groups, 0);
    const size_t n = n_items(in);
    for (size_t i = 0; i < n; i++)
        run_item(in, r, i, SCALES, GLOBALS);
    compare("host", in, r);
    void *p[] = {r.e4m3_enc, r.e2m1_enc, r.e4m3_dec,  r.e2m1_dec, r.fp8_dq,
                 r.nv_dq,    r.nv_codes, r.nv_scales, r.plane_dq};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        free(p[i]);
}

#define CUDA_OK(call)                                                      \
    do {                                                                   \
        cudaError_t e_ = (call);                                           \
        CHECK(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_)); \
        if (e_ != cudaSuccess)                                             \
            return;                                                        \
    } while (0)

/* Copies n bytes to a new device buffer. */
template <typename T>
static T *to_device(const T *src, size_t n)
{
    void *d = NULL;
    if (cudaMalloc(&d, n) != cudaSuccess)
        return NULL;
    if (cudaMemcpy(d, src, n, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaFree(d);
        return NULL;
    }
    return (T *)d;
}

/* ---- nvfp4 chunks widened in fp16 ----------------------------------------- */

/* Chunk i: scale bytes i % 256 (group A) and its bit complement (group B);
 * code j of word k is (i / 256 + j + 3 k) % 16, so every code meets
 * every nibble of every word. */
#define NVF_CHUNKS (256 * 16)

__host__ __device__ static uint4 nvf_chunk(int i, uint32_t *g)
{
    *g = (uint32_t)(i % 256) | ((uint32_t)(255 - i % 256) << 8);
    uint32_t wd[4];
    for (int k = 0; k < 4; ++k) {
        wd[k] = 0u;
        for (int j = 0; j < 8; ++j)
            wd[k] |= (uint32_t)((i / 256 + j + 3 * k) % 16) << (4 * j);
    }
    return make_uint4(wd[0], wd[1], wd[2], wd[3]);
}

__global__ static void nvf_kernel(uint4 *out)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= NVF_CHUNKS)
        return;
    uint32_t g = 0;
    const uint4 p = nvf_chunk(i, &g);
    uint4 r[4];
    cu_nvfp4_chunk_widen<cu_f16_tag>(p, g, r);
    for (int k = 0; k < 4; ++k)
        out[4 * i + k] = r[k];
}

static void run_nvf_device(void)
{
    static uint4 out[4 * NVF_CHUNKS];
    uint4 *dout = NULL;
    const int ok = cudaMalloc(&dout, sizeof out) == cudaSuccess;
    CHECK(ok, "device: nvfp4 fp16 widening buffer");
    if (ok) {
        nvf_kernel<<<NVF_CHUNKS / 128, 128>>>(dout);
        const int copied = cudaDeviceSynchronize() == cudaSuccess &&
                           cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost) == cudaSuccess;
        CHECK(copied, "device: nvfp4 fp16 widening kernel and copy");
        long bad = 0;
        for (int i = 0; copied && i < NVF_CHUNKS; ++i) {
            uint32_t g = 0;
            const uint4 p = nvf_chunk(i, &g);
            const uint32_t wd[4] = {p.x, p.y, p.z, p.w};
            const uint32_t *o = (const uint32_t *)&out[4 * i];
            for (int v = 0; v < 32; ++v) { /* value v: word v / 8, nibble v % 8 */
                const uint32_t code = (wd[v / 8] >> (4 * (v % 8))) & 15u;
                const float scale = cu_e4m3_to_f32(v < 16 ? g & 0xffu : g >> 8);
                const float want = cu_e2m1_to_f32(code) * scale; /* exact */
                const float got = f16_value((o[v / 2] >> (16 * (v & 1))) & 0xffffu);
                bad += !same_float(got, want);
            }
        }
        CHECK(bad == 0, "device: nvfp4 fp16 widening: %ld of %d values differ", bad,
              32 * NVF_CHUNKS);
    }
    cudaFree(dout);
}

/* ---- bf16 queries scaled into fp16 ---------------------------------------- */

/* Warps of test queries: each lane's 8 x 4 words of bf16 pairs. */
#define QF_WARPS 7
#define QF_WORDS (32 * 32)

__global__ static void q_f16_kernel(const uint32_t *in, uint32_t *out, float *back)
{
    uint32_t q[8][4];
    const uint32_t *src = in + (size_t)blockIdx.x * QF_WORDS + threadIdx.x * 32;
    for (int i = 0; i < 32; ++i)
        q[i / 4][i % 4] = src[i];
    const float b = cu_q_bf16_to_f16(q);
    for (int i = 0; i < 32; ++i)
        out[(size_t)blockIdx.x * QF_WORDS + threadIdx.x * 32 + i] = q[i / 4][i % 4];
    back[blockIdx.x * 32 + threadIdx.x] = b;
}

/* Warp w's 1024 values: 0 Gaussian-like around 1; 1 wide magnitudes with
 * the largest finite bf16, infinities and NaNs; 2 all zeros (signed); 3
 * bf16 subnormals only; 4 below 2^-10 with a spread down to 2^-60; 5
 * magnitudes near 2^15 and 2^-20; 6 one value of 2^-9 among tiny ones. */
static uint16_t q_f16_input(int w, int i)
{
    const float sign = (rng_u32() & 1u) ? -1.0f : 1.0f;
    const float u = rng_unit();
    switch (w) {
    case 0: return msa_f32_to_bf16(u * 3.0f);
    case 1:
        if (i == 5)
            return 0x7f7fu; /* the largest finite bf16 */
        if (i == 17)
            return 0xff80u; /* -inf */
        if (i == 600)
            return 0x7fc1u; /* NaN */
        return msa_f32_to_bf16(sign * ldexpf(1.0f + fabsf(u), (int)(rng_u32() % 250) - 125));
    case 2: return (i & 1) ? 0x8000u : 0u;
    case 3: return (uint16_t)((sign < 0 ? 0x8000u : 0u) | (1u + rng_u32() % 0x7fu));
    case 4: return msa_f32_to_bf16(sign * ldexpf(1.0f + fabsf(u), -11 - (int)(rng_u32() % 50)));
    case 5: return msa_f32_to_bf16(sign * ldexpf(1.0f + fabsf(u), (i & 1) ? 15 : -20));
    default:
        return i == 999
                   ? msa_f32_to_bf16(ldexpf(1.0f, -9))
                   : msa_f32_to_bf16(sign * ldexpf(1.0f + fabsf(u), -30 - (int)(rng_u32() % 20)));
    }
}

/* One warp's results: the factor 2^-s is one power of two for every lane;
 * the largest finite |value| times 2^s lies in [2^14, 2^15), or s = 24 if
 * that value is below 2^-10; each fp16 output is the input times 2^s,
 * exactly wherever that product is at least 2^-17 (eight significant
 * bits in fp16) and within half of fp16's smallest step (2^-25) below it;
 * infinities and NaNs stay so. */
static long q_f16_check(int w, const uint16_t *in, const uint32_t *out, const float *back)
{
    long bad = 0;
    for (int l = 1; l < 32; ++l)
        bad += back[l] != back[0];
    int e = 0;
    const float m = frexpf(back[0], &e);
    if (m != 0.5f)
        return bad + 1;
    const int s = 1 - e; /* back = 2^-s */
    float mx = 0.0f;
    for (int i = 0; i < 2 * QF_WORDS; ++i) {
        const float v = bf16_value(in[i]);
        if (isfinite(v))
            mx = fmaxf(mx, fabsf(v));
    }
    if (mx < ldexpf(1.0f, -10))
        bad += s != 24;
    else
        bad += !(ldexpf(mx, s) >= 16384.0f && ldexpf(mx, s) < 32768.0f);
    for (int i = 0; i < 2 * QF_WORDS; ++i) {
        const float v = bf16_value(in[i]);
        const float got = f16_value((out[i / 2] >> (16 * (i & 1))) & 0xffffu);
        const double want = ldexp((double)v, s);
        if (isnan(v))
            bad += !isnan(got);
        else if (isinf(v))
            bad += got != v;
        else if (fabs(want) >= ldexp(1.0, -17))
            bad += (double)got != want;
        else
            bad += !(fabs((double)got - want) <= ldexp(1.0, -25));
    }
    if (bad)
        fprintf(stderr, "q_f16 warp %d: %ld wrong (2^-s = %g)\n", w, bad, (double)back[0]);
    return bad;
}

static void run_q_f16_device(void)
{
    static uint16_t in[QF_WARPS * 2 * QF_WORDS];
    static uint32_t in_words[QF_WARPS * QF_WORDS], out[QF_WARPS * QF_WORDS];
    float back[QF_WARPS * 32];
    for (int w = 0; w < QF_WARPS; ++w)
        for (int i = 0; i < 2 * QF_WORDS; ++i)
            in[w * 2 * QF_WORDS + i] = q_f16_input(w, i);
    for (int i = 0; i < QF_WARPS * QF_WORDS; ++i)
        in_words[i] = (uint32_t)in[2 * i] | ((uint32_t)in[2 * i + 1] << 16);
    uint32_t *din = to_device(in_words, sizeof in_words), *dout = NULL;
    float *dback = NULL;
    const int ok = din && cudaMalloc(&dout, sizeof out) == cudaSuccess &&
                   cudaMalloc(&dback, sizeof back) == cudaSuccess;
    CHECK(ok, "device: q_f16 buffers");
    if (ok) {
        q_f16_kernel<<<QF_WARPS, 32>>>(din, dout, dback);
        const int copied =
            cudaDeviceSynchronize() == cudaSuccess &&
            cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost) == cudaSuccess &&
            cudaMemcpy(back, dback, sizeof back, cudaMemcpyDeviceToHost) == cudaSuccess;
        CHECK(copied, "device: q_f16 kernel and copies");
        long bad = 0;
        for (int w = 0; copied && w < QF_WARPS; ++w)
            bad += q_f16_check(w, in + w * 2 * QF_WORDS, out + w * QF_WORDS, back + w * 32);
        CHECK(copied && bad == 0, "device: bf16 queries scaled into fp16: %ld wrong", bad);
    }
    cudaFree(din);
    cudaFree(dout);
    cudaFree(dback);
}

/* ---- bf16 queries as two E4M3 terms ---------------------------------------- */

/* Warps of test queries: 16 rows of 128 bf16 values each, as the
 * attention's warps hold them (row lane / 4 and that + 8). */
#define QE_WARPS 6
#define QE_VALUES (16 * 128)

/* Per lane: 32 words of codes (hi, then lo, k-steps 0-3, registers 0-3)
 * and the two rows' factors; ran[0] = 1 where the kernel had the code. */
__global__ static void q_e4m3_kernel(const uint16_t *in, uint32_t *codes, float *back, int *ran)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    const int lane = threadIdx.x;
    uint32_t qh[4][4], ql[4][4];
    float b_lo, b_hi;
    cu_q_bf16_to_e4m3(in + (size_t)blockIdx.x * QE_VALUES, lane / 4, lane / 4 + 8, true, true, qh,
                      ql, b_lo, b_hi);
    uint32_t *out = codes + ((size_t)blockIdx.x * 32 + lane) * 32;
    for (int i = 0; i < 16; ++i) {
        out[i] = qh[i / 4][i % 4];
        out[16 + i] = ql[i / 4][i % 4];
    }
    back[(blockIdx.x * 32 + lane) * 2] = b_lo;
    back[(blockIdx.x * 32 + lane) * 2 + 1] = b_hi;
    if (blockIdx.x == 0 && lane == 0)
        ran[0] = 1;
#else
    (void)in;
    (void)codes;
    (void)back;
    (void)ran;
#endif
}

/* Row r of warp w, value i: 0 Gaussian-like; 1 magnitudes spread over
 * 2^-30 .. 2^10 in each row; 2 rows with an infinity (row 3), a NaN (row
 * 7), the largest finite bf16 (row 12); 3 zero rows (signed), bf16
 * subnormal rows, rows below 2^-119; 4 every 7-bit mantissa within 2^9 of
 * each row's largest, rows at exponents from 2^-40 to 2^40; 5 one value
 * of 2^-3 among values near 2^-20. */
static uint16_t q_e4m3_input(int w, int r, int i)
{
    const float sign = (rng_u32() & 1u) ? -1.0f : 1.0f;
    const float u = rng_unit();
    switch (w) {
    case 0: return msa_f32_to_bf16(u * 2.5f);
    case 1: return msa_f32_to_bf16(sign * ldexpf(1.0f + fabsf(u), (int)(rng_u32() % 41) - 30));
    case 2:
        if (r == 3 && i == 77)
            return 0xff80u; /* -inf */
        if (r == 7 && i == 5)
            return 0x7fc1u; /* NaN */
        if (r == 12 && i == 100)
            return 0x7f7fu;
        return msa_f32_to_bf16(u);
    case 3:
        if (r < 4)
            return (i & 1) ? 0x8000u : 0u;
        if (r < 10)
            return (uint16_t)((sign < 0 ? 0x8000u : 0u) | (1u + rng_u32() % 0x7fu));
        return msa_f32_to_bf16(sign * ldexpf(1.0f + fabsf(u), -121 - (int)(rng_u32() % 5)));
    case 4: {
        const uint32_t e = (uint32_t)(87 + 5 * r) + (uint32_t)(i % 10); /* biased, 2^-40 up */
        return (uint16_t)((sign < 0 ? 0x8000u : 0u) | (e << 7) | (uint32_t)(i & 0x7f));
    }
    default:
        return i == 64 ? msa_f32_to_bf16(0.125f)
                       : msa_f32_to_bf16(sign * ldexpf(1.0f + fabsf(u), -20));
    }
}

/* One warp's results against the rule in the file's head. */
static long q_e4m3_check(int w, const uint16_t *in, const uint32_t *codes, const float *back)
{
    long bad = 0;
    for (int row = 0; row < 16; ++row) {
        const uint16_t *v = in + row * 128;
        int nonfinite = 0;
        float mx = 0.0f;
        for (int i = 0; i < 128; ++i) {
            const float x = bf16_value(v[i]);
            if (!isfinite(x))
                nonfinite = 1;
            else
                mx = fmaxf(mx, fabsf(x));
        }
        /* Lanes 4 (row % 8) .. + 3 hold the row, as row lo or row hi. */
        const int half = row >= 8, lane0 = 4 * (row % 8);
        const float b = back[lane0 * 2 + half];
        for (int l = 1; l < 4; ++l)
            bad += memcmp(&back[(lane0 + l) * 2 + half], &b, sizeof b) != 0;
        if (nonfinite) {
            bad += !isnan(b);
            continue;
        }
        int e = 0;
        if (frexpf(b, &e) != 0.5f) {
            ++bad;
            continue;
        }
        const int s = 1 - e; /* b = 2^-s */
        if (mx < ldexpf(1.0f, -119))
            bad += s != 126;
        else
            bad += !(ldexpf(mx, s) >= 128.0f && ldexpf(mx, s) < 256.0f);
        for (int i = 0; i < 128; ++i) {
            /* Dimension i: k-step i / 32, register 2 ((i % 32) / 16) + half
             * of lane lane0 + (i % 16) / 4, byte i % 4. */
            const int ks = i / 32, reg = 2 * ((i % 32) / 16) + half, lane = lane0 + (i % 16) / 4;
            const int byte = i % 4;
            const uint32_t *lw = codes + (size_t)lane * 32;
            const uint32_t ch = (lw[ks * 4 + reg] >> (8 * byte)) & 0xffu;
            const uint32_t cl = (lw[16 + ks * 4 + reg] >> (8 * byte)) & 0xffu;
            const double got = (double)cu_e4m3_to_f32(ch) + (double)cu_e4m3_to_f32(cl);
            const double want = ldexp((double)bf16_value(v[i]), s);
            if (fabs(want) >= 0.25)
                bad += got != want;
            else
                bad += !(fabs(got - want) <= ldexp(1.0, -10));
        }
    }
    if (bad)
        fprintf(stderr, "q_e4m3 warp %d: %ld wrong\n", w, bad);
    return bad;
}

static void run_q_e4m3_device(void)
{
    static uint16_t in[QE_WARPS * QE_VALUES];
    static uint32_t codes[QE_WARPS * 32 * 32];
    static float back[QE_WARPS * 64];
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (major * 10 + minor < 89) {
        printf("skipped: queries as E4M3 terms (sm_89 and later)\n");
        return;
    }
    for (int w = 0; w < QE_WARPS; ++w)
        for (int r = 0; r < 16; ++r)
            for (int i = 0; i < 128; ++i)
                in[w * QE_VALUES + r * 128 + i] = q_e4m3_input(w, r, i);
    uint16_t *din = to_device(in, sizeof in);
    uint32_t *dcodes = NULL;
    float *dback = NULL;
    int *dran = NULL, ran = 0;
    const int ok = din && cudaMalloc(&dcodes, sizeof codes) == cudaSuccess &&
                   cudaMalloc(&dback, sizeof back) == cudaSuccess &&
                   cudaMalloc(&dran, sizeof ran) == cudaSuccess &&
                   cudaMemset(dran, 0, sizeof ran) == cudaSuccess;
    CHECK(ok, "device: q_e4m3 buffers");
    if (ok) {
        q_e4m3_kernel<<<QE_WARPS, 32>>>(din, dcodes, dback, dran);
        const int copied =
            cudaDeviceSynchronize() == cudaSuccess &&
            cudaMemcpy(codes, dcodes, sizeof codes, cudaMemcpyDeviceToHost) == cudaSuccess &&
            cudaMemcpy(back, dback, sizeof back, cudaMemcpyDeviceToHost) == cudaSuccess &&
            cudaMemcpy(&ran, dran, sizeof ran, cudaMemcpyDeviceToHost) == cudaSuccess;
        CHECK(copied && ran == 1, "device: q_e4m3 kernel and copies (ran %d)", ran);
        long bad = 0;
        for (int w = 0; copied && ran && w < QE_WARPS; ++w)
            bad += q_e4m3_check(w, in + w * QE_VALUES, codes + w * 32 * 32, back + w * 64);
        CHECK(copied && ran && bad == 0, "device: bf16 queries as E4M3 terms: %ld wrong", bad);
    }
    cudaFree(din);
    cudaFree(dcodes);
    cudaFree(dback);
    cudaFree(dran);
}

static void run_device(const inputs &in)
{
    inputs din = in;
    din.enc = to_device(in.enc, N_ENC * sizeof(float));
    din.groups = to_device(in.groups, (size_t)in.n_groups * 16 * sizeof(float));
    din.group_global = to_device(in.group_global, (size_t)in.n_groups * sizeof(float));
    din.plane = to_device(in.plane, PL_BYTES);
    float *scales = to_device(SCALES, sizeof SCALES);
    float *globals = to_device(GLOBALS, sizeof GLOBALS);
    results d;
    alloc_results(&d, in.n_groups, 1);
    void *dev[] = {din.enc,  din.groups, din.group_global, din.plane,   scales,
                   globals,  d.e4m3_enc, d.e2m1_enc,       d.e4m3_dec,  d.e2m1_dec,
                   d.fp8_dq, d.nv_dq,    d.nv_codes,       d.nv_scales, d.plane_dq};
    int missing = 0;
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        missing += dev[i] == NULL;
    CHECK(missing == 0, "device buffers: %d of %zu could not be made", missing,
          sizeof dev / sizeof dev[0]);
    if (missing == 0) {
        run_items_kernel<<<1024, 256>>>(din, d, n_items(in), scales, globals);
        cudaError_t e = cudaDeviceSynchronize();
        CHECK(e == cudaSuccess, "kernel: %s", cudaGetErrorString(e));
        if (e == cudaSuccess) {
            results h;
            alloc_results(&h, in.n_groups, 0);
            const size_t bytes[] = {N_ENC,
                                    N_ENC,
                                    256 * sizeof(float),
                                    16 * sizeof(float),
                                    N_SCALES * 256 * sizeof(float),
                                    N_NV_DQ * sizeof(float),
                                    (size_t)in.n_groups * 8,
                                    (size_t)in.n_groups,
                                    PL_ELEMS * sizeof(float)};
            void *hp[] = {h.e4m3_enc, h.e2m1_enc, h.e4m3_dec,  h.e2m1_dec, h.fp8_dq,
                          h.nv_dq,    h.nv_codes, h.nv_scales, h.plane_dq};
            void *dp[] = {d.e4m3_enc, d.e2m1_enc, d.e4m3_dec,  d.e2m1_dec, d.fp8_dq,
                          d.nv_dq,    d.nv_codes, d.nv_scales, d.plane_dq};
            int copied = 1;
            for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++)
                copied &= cudaMemcpy(hp[i], dp[i], bytes[i], cudaMemcpyDeviceToHost) == cudaSuccess;
            CHECK(copied, "copies of the device results");
            if (copied)
                compare("device", in, h);
            for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++)
                free(hp[i]);
        }
    }
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        cudaFree(dev[i]);
}

int main(int argc, char **argv)
{
    const int host_only = argc > 1 && !strcmp(argv[1], "--host");
    if (argc > 2 || (argc == 2 && !host_only)) {
        fprintf(stderr, "usage: test_cuda_quant [--host]\n");
        return 2;
    }
    inputs in;
    make_inputs(&in);
    run_host(in);
    run_widen_host();
    run_pair_host();
    int skipped = 0;
    if (!host_only) {
        int count = 0;
        if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
            cudaGetLastError();
            printf("skipped: the device part (no CUDA device)\n");
            skipped = 1;
        } else {
            run_device(in);
            run_widen_device();
            run_pair_device();
            run_q_f16_device();
            run_q_e4m3_device();
            run_nvf_device();
        }
    }
    free(in.enc);
    free(in.groups);
    free(in.group_global);
    free(in.plane);
    const int rc = check_finish();
    return rc == 0 && skipped ? EXIT_SKIPPED : rc;
}
