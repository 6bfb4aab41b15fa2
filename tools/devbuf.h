/*
 * Backend memory for a verb's tensors: every buffer comes from
 * msa_buffer_alloc (host memory on the CPU, device memory with CUDA) and is
 * released together, so the verbs work unchanged on either backend.
 */
#ifndef MSA_TOOLS_DEVBUF_H
#define MSA_TOOLS_DEVBUF_H

#include <stddef.h>
#include <stdint.h>

#include "msa/msa.h"

typedef struct dev_pool {
    msa_context *ctx;
    void **ptr;
    int count, cap;
    msa_status status; /* of the last failure; MSA_OK when none */
} dev_pool;

void dev_pool_init(dev_pool *pool, msa_context *ctx);
/* `bytes` of backend memory (at least 16, so an empty tensor still gets a
 * valid pointer), filled from `host` when it is non-NULL.  NULL on failure:
 * pool->status says which, the context's last error why. */
void *dev_pool_alloc(dev_pool *pool, const void *host, size_t bytes);
/* n floats converted to the activation dtype `dtype` in backend memory. */
void *dev_pool_act(dev_pool *pool, msa_dtype dtype, const float *x, int64_t n);
void dev_pool_release(dev_pool *pool);

#endif
