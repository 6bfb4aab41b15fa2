/* What the measurement probes of bench/ (chunk_read.cu, ring_read.cu)
 * share: a CUDA call check that ends main, and a float order for medians. */
#ifndef MSA_BENCH_PROBE_COMMON_H
#define MSA_BENCH_PROBE_COMMON_H

#include <stdio.h>
#include <cuda_runtime.h>

#define CHECK(x)                                                                 \
    do {                                                                         \
        cudaError_t e_ = (x);                                                    \
        if (e_ != cudaSuccess) {                                                 \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));             \
            return 1;                                                            \
        }                                                                        \
    } while (0)

static inline int cmp_f(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

#endif /* MSA_BENCH_PROBE_COMMON_H */
