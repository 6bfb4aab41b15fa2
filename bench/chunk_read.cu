/*
 * Read bandwidth of a GPU's memory when the bytes come in chunks of a given
 * size at random places (as the sparse attention reads K and V: one block
 * of one KV head is a 32 KB chunk of each plane) against one long stream
 * (as the indexer reads a request's index keys).  A measurement tool, not
 * part of the library: nvcc -O3 -arch=sm_90 bench/chunk_read.cu -o chunk_read
 *
 * Each CTA reads whole chunks, every thread with 16-byte loads, eight in
 * flight; chunk i of the run is a random chunk of a buffer far beyond the
 * L2 (a fixed permutation, the same for every size's number of chunks).
 * Prints GB/s per chunk size, the median of 9 runs.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include "probe_common.h"

__global__ void read_chunks(const uint4 *buf, const uint32_t *order, int64_t nchunks, int64_t chunk_vec,
                            uint4 *sink)
{
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
        const uint4 *p = buf + (int64_t)order[c] * chunk_vec;
        for (int64_t v0 = 0; v0 < chunk_vec; v0 += 8 * (int64_t)blockDim.x) {
            uint4 x[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int64_t v = v0 + j * (int64_t)blockDim.x + threadIdx.x;
                x[j] = v < chunk_vec ? __ldcs(p + v) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                acc.x ^= x[j].x;
                acc.y ^= x[j].y;
                acc.z ^= x[j].z;
                acc.w ^= x[j].w;
            }
        }
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) /* never, in practice: keeps the loads */
        sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

int main(int argc, char **argv)
{
    const int64_t buf_bytes = (argc > 1 ? atoll(argv[1]) : 16) << 30; /* GiB */
    const int64_t read_bytes = (int64_t)2 << 30;                       /* per run */
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    uint4 *buf = NULL, *sink = NULL;
    uint32_t *order = NULL;
    CHECK(cudaMalloc(&buf, buf_bytes));
    CHECK(cudaMemset(buf, 1, buf_bytes));
    const int grid = sms * 4, block = 256;
    CHECK(cudaMalloc(&sink, sizeof(uint4) * grid * block));
    static const int64_t sizes[] = {4 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10,
                                    1 << 20, 16 << 20};
    const int64_t max_chunks = read_bytes / sizes[0];
    uint32_t *h_order = (uint32_t *)malloc(sizeof(uint32_t) * max_chunks);
    CHECK(cudaMalloc(&order, sizeof(uint32_t) * max_chunks));
    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    printf("chunk bytes, GB/s random (median of 9), GB/s in order\n");
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; ++si) {
        const int64_t cs = sizes[si], n = read_bytes / cs, slots = buf_bytes / cs;
        float gbs[2];
        for (int mode = 0; mode < 2; ++mode) {
            /* random distinct slots (mode 0) or slots 0, 1, 2, ... (mode 1) */
            uint64_t s = 88172645463325252ull;
            for (int64_t i = 0; i < n; ++i) {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                h_order[i] = mode ? (uint32_t)i : (uint32_t)(s % (uint64_t)slots);
            }
            CHECK(cudaMemcpy(order, h_order, sizeof(uint32_t) * n, cudaMemcpyHostToDevice));
            float ms[9];
            for (int r = 0; r < 10; ++r) {
                CHECK(cudaEventRecord(t0));
                read_chunks<<<grid, block>>>(buf, order, n, cs / 16, sink);
                CHECK(cudaEventRecord(t1));
                CHECK(cudaEventSynchronize(t1));
                if (r > 0)
                    CHECK(cudaEventElapsedTime(&ms[r - 1], t0, t1));
            }
            qsort(ms, 9, sizeof(float), cmp_f);
            gbs[mode] = (float)((double)n * cs / (ms[4] * 1e-3) / 1e9);
        }
        printf("%9lld  %8.1f  %8.1f\n", (long long)cs, gbs[0], gbs[1]);
    }
    return 0;
}
