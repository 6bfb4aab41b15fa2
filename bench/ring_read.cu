/*
 * Read bandwidth of the Hopper attention's data path without its
 * arithmetic: per CTA one producer lane streams random 128-key blocks of a
 * K and a V plane (rows of 256 bytes) as 64-key tiles, each tile four
 * tensor-map boxes of 64 rows x 128 bytes (the attention's copies), through
 * a ring of 32 KB slots; consumer warps wait for each tile, optionally hold
 * it for a while (standing in for their products), and release it with an
 * arrival of every lane.  Varies the ring's depth, the hold and the CTAs per
 * SM, to tell what the ring itself can stream.  A measurement tool, not part
 * of the library:
 *   nvcc -std=c++17 -O3 -arch=sm_90a -Iinclude -Isrc -Isrc/cuda \
 *        bench/ring_read.cu src/cuda/tma_map.cu -o ring_read
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "probe_common.h"

#include "cu_tma.cuh"

#define SLOT_BYTES 32768
#define CONSUMER_WARPS 8

__global__ void __launch_bounds__(32 * (1 + CONSUMER_WARPS))
    ring_read(const __grid_constant__ CUtensorMap mk, const __grid_constant__ CUtensorMap mv,
              const uint32_t *blocks, int32_t per_cta, int stages, int64_t hold_cycles)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *ring = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint64_t *full = (uint64_t *)(ring + stages * SLOT_BYTES);
    uint64_t *empty = full + stages;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; ++s) {
            cu_mbar_init(&full[s], 1);
            cu_mbar_init(&empty[s], CONSUMER_WARPS * 32);
        }
        cu_mbar_fence_init();
    }
    __syncthreads();
    const int32_t tiles = 2 * per_cta; /* two 64-key tiles per block */
    const uint32_t *mine = blocks + (int64_t)blockIdx.x * per_cta;
    if (warp == CONSUMER_WARPS) {
        if (lane == 0) {
            const uint64_t pol = cu_l2_evict_first();
            for (int32_t t = 0; t < tiles; ++t) {
                const int s = t % stages;
                if (t >= stages)
                    cu_mbar_wait(&empty[s], ((t / stages) & 1u) ^ 1u);
                const int32_t row = (int32_t)(mine[t >> 1] * 128u + (t & 1) * 64u);
                unsigned char *kd = ring + s * SLOT_BYTES, *vd = kd + SLOT_BYTES / 2;
                cu_mbar_arrive_tx(&full[s], SLOT_BYTES);
                cu_tma_load2d_hint(kd, &mk, 0, row, &full[s], pol);
                cu_tma_load2d_hint(kd + SLOT_BYTES / 4, &mk, 64, row, &full[s], pol);
                cu_tma_load2d_hint(vd, &mv, 0, row, &full[s], pol);
                cu_tma_load2d_hint(vd + SLOT_BYTES / 4, &mv, 64, row, &full[s], pol);
            }
        }
        return;
    }
    for (int32_t t = 0; t < tiles; ++t) {
        const int s = t % stages;
        cu_mbar_wait(&full[s], (t / stages) & 1u);
        /* Half the tiles held by one group of warps, half by the other, as
         * at long context where one token's group computes a tile. */
        if (hold_cycles > 0 && ((t & 1) == (warp >> 2))) {
            const int64_t t0 = clock64();
            while (clock64() - t0 < hold_cycles) {
            }
        }
        cu_mbar_arrive(&empty[s]);
    }
#else
    (void)mk;
    (void)mv;
    (void)blocks;
    (void)per_cta;
    (void)stages;
    (void)hold_cycles;
#endif
}

int main(void)
{
    const int64_t plane_bytes = (int64_t)8 << 30;
    const uint64_t rows = (uint64_t)plane_bytes / 256, nblocks = rows / 128;
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    void *k = NULL, *v = NULL;
    CHECK(cudaMalloc(&k, plane_bytes));
    CHECK(cudaMalloc(&v, plane_bytes));
    CHECK(cudaMemset(k, 1, plane_bytes));
    CHECK(cudaMemset(v, 2, plane_bytes));
    CUtensorMap mk, mv;
    if (cu_tma_map_rows(&mk, k, rows, 64) || cu_tma_map_rows(&mv, v, rows, 64)) {
        fprintf(stderr, "tensor maps: not available\n");
        return 1;
    }
    /* 2 GiB per run: 32768 blocks of 64 KB (K and V), random. */
    const int32_t total_blocks = 32768;
    uint32_t *h = (uint32_t *)malloc(sizeof(uint32_t) * total_blocks);
    uint64_t x = 88172645463325252ull;
    for (int32_t i = 0; i < total_blocks; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        h[i] = (uint32_t)(x % nblocks);
    }
    uint32_t *blocks = NULL;
    CHECK(cudaMalloc(&blocks, sizeof(uint32_t) * total_blocks));
    CHECK(cudaMemcpy(blocks, h, sizeof(uint32_t) * total_blocks, cudaMemcpyHostToDevice));
    CHECK(cudaFuncSetAttribute(ring_read, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    /* stages, CTAs per SM, hold (cycles at ~1.98 GHz: 1000 = 0.5 us) */
    static const int cfgs[][3] = {{4, 1, 0},    {2, 1, 0},    {3, 1, 0},   {5, 1, 0},   {6, 1, 0},
                                  {4, 1, 500},  {4, 1, 1000}, {4, 1, 2000}, {6, 1, 1000},
                                  {3, 2, 0},    {3, 2, 1000}, {2, 2, 0}};
    printf("stages  CTAs/SM  hold cycles  GB/s (median of 9)\n");
    for (size_t c = 0; c < sizeof cfgs / sizeof *cfgs; ++c) {
        const int stages = cfgs[c][0], per_sm = cfgs[c][1], hold = cfgs[c][2];
        const int grid = sms * per_sm;
        const int32_t per_cta = total_blocks / grid;
        const size_t smem = 1024 + (size_t)stages * SLOT_BYTES + 2 * stages * 8;
        float ms[9];
        for (int r = 0; r < 10; ++r) {
            CHECK(cudaEventRecord(e0));
            ring_read<<<grid, 32 * (1 + CONSUMER_WARPS), smem>>>(mk, mv, blocks, per_cta, stages, hold);
            CHECK(cudaEventRecord(e1));
            CHECK(cudaEventSynchronize(e1));
            if (r > 0)
                CHECK(cudaEventElapsedTime(&ms[r - 1], e0, e1));
        }
        CHECK(cudaGetLastError());
        qsort(ms, 9, sizeof(float), cmp_f);
        const double bytes = (double)grid * per_cta * 2 * SLOT_BYTES;
        printf("%6d  %7d  %11d  %8.1f\n", stages, per_sm, hold, bytes / (ms[4] * 1e-3) / 1e9);
    }
    return 0;
}
