/*
 * Latency of one selection row (SPEC 4: the K block ids of a row of N
 * block scores) by the selection kernel's two paths, outside the step's
 * chain of kernels: a whole CTA (cu_select_row_list, the path of steps
 * with few rows; the kernel's 128 threads, and 256 and 512 to see whether
 * more threads on a row would shorten it) and a lone warp (cu_select_row,
 * the path of steps with many).  Inside a step the CTA's row of 1024
 * blocks takes 5.3 µs from its launch wait to its ids written, 3.5 µs for
 * 78 blocks, and a warm instruction cache saves only 0.7 of them
 * (bench/RESULTS.md, v30).  This times the same device code alone, every
 * CTA selecting its own row from scores just copied (so in L2, as the
 * indexer leaves them), to tell the row's own cost from the chain's: a
 * size's first launch (for the first size, the code not yet fetched) and
 * the median of 20 later ones, in SM cycles from the first score load to
 * the ids in shared memory (the median CTA's and the slowest's), and the
 * list path's steps.  Rows of random scores, then rows longer than 512
 * blocks whose scores repeat every 512 blocks, as the index keys `msa
 * bench` writes do (equal block scores in pairs, threes past 1024
 * blocks).  Every row's ids are
 * checked against a top-K computed here.  A measurement
 * tool, not part of the library (the build compiles it as probe_sel_row):
 *   nvcc -std=c++17 -O3 -arch=sm_90a -Iinclude -Isrc -Isrc/cuda \
 *        bench/sel_row.cu -o sel_row && ./sel_row
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe_common.h"

#define MSA_SEL_STAMPS /* the list path's steps timed, as in a timeline build */
#include "cu_select.cuh"

#define NT_MAX 512                /* the widest CTA timed */
#define XS_CAP (4 * CU_SEL_XS)    /* the selection kernel's list entries (SEL_WARPS = 4) */
#define K_SEL 16                  /* M3: K 16, no init block, one local block */
#define I_SEL 0
#define LC_SEL 1
#define ROWS 132                  /* one CTA per SM of an H200 */
#define REPS 20
#define PERIOD 512                /* blocks after which `msa bench`'s index keys repeat */

/* Shared words: the ids (32), the lone warp's histogram (256), the scores
 * or keys (n, rounded up to even), then the CTA path's list scratch (its
 * warps' CU_SEL_TOP keys each). */
static size_t smem_words(int32_t n)
{
    return 32 + 256 + (size_t)((n + 1) & ~1) + 2 * XS_CAP + NT_MAX / 32 * CU_SEL_TOP + 2 + 32;
}

/* NT threads select each CTA's row: NT = 32 the lone warp's path, more the
 * CTA's list path (its fallback, many equal scores, by the first warp). */
template <int NT>
__global__ void __launch_bounds__(NT_MAX) sel_row(const float *scores, int32_t n, int32_t *ids, long long *cycles,
                                                  long long *steps)
{
    __shared__ long long stamps[CU_SEL_STAMPS];
    extern __shared__ __align__(8) uint32_t smem[];
    int32_t *out = (int32_t *)smem;
    uint32_t *hist = smem + 32;
    uint32_t *cache = hist + 256;
    uint32_t *grp = cache + ((n + 1) & ~1);
    cu_sel_grp g;
    g.xs = (unsigned long long *)grp;
    g.cap = XS_CAP;
    g.tw = grp + 2 * XS_CAP;
    g.cnt = g.tw + NT_MAX / 32 * CU_SEL_TOP;
    g.win = (int32_t *)(g.cnt + 2);
    g.stamps = stamps;
    const float *row = scores + (int64_t)blockIdx.x * n;
    __syncthreads();
    const long long t0 = clock64();
    if (NT > 32) {
        if (!cu_select_row_list<NT>(row, n, K_SEL, I_SEL, LC_SEL, out, cache, g)) {
            if (threadIdx.x < 32)
                cu_select_row(row, n, K_SEL, I_SEL, LC_SEL, out, hist, (float *)cache, n);
            __syncthreads();
        }
    } else {
        cu_select_row(row, n, K_SEL, I_SEL, LC_SEL, out, hist, (float *)cache, n);
    }
    const long long t1 = clock64();
    if (threadIdx.x < K_SEL)
        ids[blockIdx.x * K_SEL + threadIdx.x] = out[threadIdx.x];
    if (threadIdx.x == 0) {
        cycles[blockIdx.x] = t1 - t0;
        /* The list path's steps, cycles after t0 (not written by the lone
         * warp's path). */
        for (int i = 0; i < CU_SEL_STAMPS; ++i)
            steps[blockIdx.x * CU_SEL_STAMPS + i] = NT > 32 ? stamps[i] - t0 : 0;
    }
}

/* cu_score_key on the host: larger score, larger key; NaN lowest; -0 == +0. */
static uint32_t host_key(float f)
{
    if (isnan(f))
        return 0u;
    if (f == 0.0f)
        f = 0.0f;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static const float *g_row; /* the row qsort ranks (by key descending, id ascending) */
static int cmp_rank(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const uint32_t kx = host_key(g_row[x]), ky = host_key(g_row[y]);
    if (kx != ky)
        return kx > ky ? -1 : 1;
    return (x > y) - (x < y);
}
static int cmp_int(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* SPEC 4's row: the forced blocks, the best of the others, ascending. */
static void host_topk(const float *row, int32_t n, int32_t *want)
{
    const int32_t c_end = n - LC_SEL, need = K_SEL - I_SEL - LC_SEL;
    int32_t *cand = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    int32_t m = 0;
    for (int32_t i = I_SEL; i < c_end; ++i)
        cand[m++] = i;
    g_row = row;
    qsort(cand, (size_t)m, sizeof(int32_t), cmp_rank);
    int32_t k = 0;
    for (int32_t i = 0; i < I_SEL; ++i)
        want[k++] = i;
    for (int32_t i = 0; i < need; ++i)
        want[k++] = cand[i];
    for (int32_t i = c_end; i < n; ++i)
        want[k++] = i;
    qsort(want, (size_t)K_SEL, sizeof(int32_t), cmp_int);
    free(cand);
}

static long long median_ll(long long *v, int n)
{
    for (int i = 1; i < n; ++i) /* insertion sort: n is small */
        for (int j = i; j > 0 && v[j - 1] > v[j]; --j) {
            const long long t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}

/* One launch: the rows' ids checked; the slowest and the median CTA's
 * cycles into *slow, *mid, the median CTA's cycles to each step of the list
 * path into step_mid[CU_SEL_STAMPS].  d_cyc: ROWS counts, then ROWS x
 * CU_SEL_STAMPS steps.  Returns 1 on a CUDA error, 2 on a wrong row. */
template <int NT>
static int run_once(const float *d_src, float *d_scores, int32_t n, int32_t *d_ids, long long *d_cyc,
                    const int32_t *want, long long *slow, long long *mid, long long *step_mid)
{
    const size_t bytes = sizeof(float) * (size_t)n * ROWS;
    CHECK(cudaMemcpy(d_scores, d_src, bytes, cudaMemcpyDeviceToDevice)); /* into L2 */
    const size_t smem = smem_words(n) * 4;
    CHECK(cudaFuncSetAttribute(sel_row<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    sel_row<NT><<<ROWS, NT, smem>>>(d_scores, n, d_ids, d_cyc, d_cyc + ROWS);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    int32_t got[ROWS * K_SEL];
    long long cyc[ROWS], steps[ROWS * CU_SEL_STAMPS];
    CHECK(cudaMemcpy(got, d_ids, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(cyc, d_cyc, sizeof cyc, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(steps, d_cyc + ROWS, sizeof steps, cudaMemcpyDeviceToHost));
    if (memcmp(got, want, sizeof got) != 0) {
        fprintf(stderr, "wrong ids: %d threads, %d blocks\n", NT, n);
        return 2;
    }
    long long mx = 0;
    for (int r = 0; r < ROWS; ++r)
        mx = cyc[r] > mx ? cyc[r] : mx;
    *slow = mx;
    *mid = median_ll(cyc, ROWS);
    for (int i = 0; i < CU_SEL_STAMPS; ++i) {
        long long v[ROWS];
        for (int r = 0; r < ROWS; ++r)
            v[r] = steps[r * CU_SEL_STAMPS + i];
        step_mid[i] = median_ll(v, ROWS);
    }
    return 0;
}

template <int NT>
static int measure(const float *d_src, float *d_scores, int32_t n, int32_t *d_ids, long long *d_cyc,
                   const int32_t *want)
{
    long long cold_slow, cold_mid, slow[REPS], mid[REPS], cold_steps[CU_SEL_STAMPS], steps[CU_SEL_STAMPS];
    int rc = run_once<NT>(d_src, d_scores, n, d_ids, d_cyc, want, &cold_slow, &cold_mid, cold_steps);
    for (int i = 0; rc == 0 && i < REPS; ++i)
        rc = run_once<NT>(d_src, d_scores, n, d_ids, d_cyc, want, &slow[i], &mid[i], steps);
    if (rc)
        return rc;
    printf("%7d %6d %12lld %12lld %12lld %12lld", NT, n, cold_mid, cold_slow, median_ll(mid, REPS),
           median_ll(slow, REPS));
    if (NT > 32) /* the list path's steps: first launch | last launch */
        for (int i = 0; i < CU_SEL_STAMPS; ++i)
            printf("%s%lld|%lld", i ? " " : "   steps ", cold_steps[i], steps[i]);
    printf("\n");
    return 0;
}

int main(void)
{
    static const int32_t sizes[] = {78, 256, 782, 1024, 1563};
    const int32_t nmax = 1563;
    float *h = (float *)malloc(sizeof(float) * (size_t)nmax * ROWS);
    int32_t *want = (int32_t *)malloc(sizeof(int32_t) * ROWS * K_SEL);
    float *d_src = NULL, *d_scores = NULL;
    int32_t *d_ids = NULL;
    long long *d_cyc = NULL;
    CHECK(cudaMalloc((void **)&d_src, sizeof(float) * (size_t)nmax * ROWS));
    CHECK(cudaMalloc((void **)&d_scores, sizeof(float) * (size_t)nmax * ROWS));
    CHECK(cudaMalloc((void **)&d_ids, sizeof(int32_t) * ROWS * K_SEL));
    CHECK(cudaMalloc((void **)&d_cyc, sizeof(long long) * ROWS * (1 + CU_SEL_STAMPS)));
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    printf("one row per CTA, %d CTAs, K %d; SM cycles (%.2f GHz max) from the first load to the ids\n", ROWS,
           K_SEL, clock_khz * 1e-6);
    printf("%7s %6s %12s %12s %12s %12s\n", "threads", "blocks", "first mid", "first max", "later mid",
           "later max");
    printf("steps (list path): cycles after the row's start to its entry, keys, thresholds, list, ranks, ids;\n"
           "median CTA, first launch | last launch\n");
    uint64_t s = 0x5e1ec7ull;
    int rc = 0;
    for (int rep = 0; rc == 0 && rep < 2; ++rep)
    for (size_t si = 0; rc == 0 && si < sizeof sizes / sizeof sizes[0]; ++si) {
        const int32_t n = sizes[si];
        if (rep && n <= PERIOD)
            continue;
        if (!rep && si == 0)
            printf("random scores, ties rare (the indexer's block maxima)\n");
        if (rep && sizes[si - 1] <= PERIOD)
            printf("scores repeating every %d blocks (the bench's index keys: a 16 MB tile)\n", PERIOD);
        /* Scores like the indexer's block maxima: random, ties rare; or
         * each row's first PERIOD repeated, as `msa bench` fills the index
         * keys (one random tile of 512 pages, repeated). */
        for (int64_t i = 0; i < (int64_t)n * ROWS; ++i) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            const int64_t c = i % n;
            h[i] = rep && c >= PERIOD ? h[i - c + c % PERIOD]
                                      : (float)((double)(s >> 11) * (1.0 / 9007199254740992.0)) * 8.0f - 4.0f;
        }
        for (int r = 0; r < ROWS; ++r)
            host_topk(h + (int64_t)r * n, n, want + r * K_SEL);
        if (cudaMemcpy(d_src, h, sizeof(float) * (size_t)n * ROWS, cudaMemcpyHostToDevice) != cudaSuccess) {
            rc = 1;
            break;
        }
        rc = measure<128>(d_src, d_scores, n, d_ids, d_cyc, want);
        if (rc == 0)
            rc = measure<32>(d_src, d_scores, n, d_ids, d_cyc, want);
        if (rc == 0)
            rc = measure<256>(d_src, d_scores, n, d_ids, d_cyc, want);
        if (rc == 0)
            rc = measure<512>(d_src, d_scores, n, d_ids, d_cyc, want);
    }
    cudaFree(d_src);
    cudaFree(d_scores);
    cudaFree(d_ids);
    cudaFree(d_cyc);
    free(h);
    free(want);
    return rc;
}
