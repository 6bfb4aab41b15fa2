#include "devbuf.h"

#include <stdlib.h>

#include "elem.h"

void dev_pool_init(dev_pool *pool, msa_context *ctx)
{
    pool->ctx = ctx;
    pool->ptr = NULL;
    pool->count = pool->cap = 0;
    pool->status = MSA_OK;
}

void *dev_pool_alloc(dev_pool *pool, const void *host, size_t bytes)
{
    if (pool->count == pool->cap) {
        int cap = pool->cap ? 2 * pool->cap : 16;
        void **grown = realloc(pool->ptr, sizeof(void *) * (size_t)cap);
        if (!grown) {
            pool->status = MSA_ERR_OUT_OF_MEMORY;
            return NULL;
        }
        pool->ptr = grown;
        pool->cap = cap;
    }
    void *p = NULL;
    msa_status st = msa_buffer_alloc(pool->ctx, bytes ? bytes : 16, &p);
    if (st != MSA_OK) {
        pool->status = st;
        return NULL;
    }
    pool->ptr[pool->count++] = p;
    if (host && bytes && (st = msa_copy_to_buffer(pool->ctx, p, host, bytes)) != MSA_OK) {
        pool->status = st;
        return NULL;
    }
    return p;
}

void *dev_pool_act(dev_pool *pool, msa_dtype dtype, const float *x, int64_t n)
{
    size_t bytes = (size_t)(n > 0 ? n : 0) * msa_dtype_size(dtype);
    void *host = malloc(bytes ? bytes : 1);
    if (!host) {
        pool->status = MSA_ERR_OUT_OF_MEMORY;
        return NULL;
    }
    elem_from_f32(host, dtype, x, n);
    void *dev = dev_pool_alloc(pool, host, bytes);
    free(host);
    return dev;
}

void dev_pool_release(dev_pool *pool)
{
    for (int i = 0; i < pool->count; i++)
        msa_buffer_free(pool->ctx, pool->ptr[i]);
    free(pool->ptr);
    pool->ptr = NULL;
    pool->count = pool->cap = 0;
}
