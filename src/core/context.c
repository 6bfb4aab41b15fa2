/* Context: backend selection, thread pool, memory helpers. */
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const msa_backend_ops *backend_ops(msa_backend backend)
{
    switch (backend) {
    case MSA_BACKEND_CPU: return &msa_cpu_backend_ops;
    case MSA_BACKEND_CUDA:
#ifdef MSA_HAVE_CUDA
        return &msa_cuda_backend_ops;
#else
        return NULL;
#endif
    }
    return NULL;
}

int msa_backend_available(msa_backend backend)
{
    if (backend == MSA_BACKEND_CPU)
        return 1;
    if (!backend_ops(backend))
        return 0;
    msa_context_params p;
    msa_context_params_default(&p);
    p.backend = backend;
    p.num_threads = 1;
    msa_context *ctx = NULL;
    if (msa_context_create(&p, &ctx, NULL, 0) != MSA_OK)
        return 0;
    msa_context_free(ctx);
    return 1;
}

void msa_context_params_default(msa_context_params *params)
{
    if (!params)
        return;
    memset(params, 0, sizeof *params);
    params->backend = MSA_BACKEND_CPU;
    params->num_threads = 0;
    params->device = 0;
}

static msa_status create_fail(char *errbuf, size_t errbuf_size, msa_status st, const char *msg)
{
    if (errbuf && errbuf_size)
        snprintf(errbuf, errbuf_size, "%s", msg);
    return st;
}

msa_status msa_context_create(const msa_context_params *params, msa_context **out, char *errbuf,
                              size_t errbuf_size)
{
    if (errbuf && errbuf_size)
        errbuf[0] = '\0';
    if (!out)
        return create_fail(errbuf, errbuf_size, MSA_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    msa_context_params def;
    if (!params) {
        msa_context_params_default(&def);
        params = &def;
    }
    if (params->num_threads < 0 || params->num_threads > 1024)
        return create_fail(errbuf, errbuf_size, MSA_ERR_INVALID_ARGUMENT,
                           "num_threads must be in 0..1024");
    if (params->backend != MSA_BACKEND_CPU && params->backend != MSA_BACKEND_CUDA)
        return create_fail(errbuf, errbuf_size, MSA_ERR_INVALID_ARGUMENT, "unknown backend");
    if (params->debug &&
        (params->debug->cuda_num_sms < 0 || params->debug->cuda_no_tma < 0 ||
         params->debug->cuda_no_pdl < 0 || params->debug->cuda_sel_warp_rows < 0 ||
         params->debug->cuda_sel_unions < 0 || params->debug->cuda_no_prefill_tma < 0 ||
         params->debug->cuda_no_prefill_indexer < 0 || params->debug->cuda_no_prefill_wgmma < 0 ||
         params->debug->cuda_no_prefill_kbm < 0 || params->debug->cuda_prefill_kbm_chunk < 0 ||
         params->debug->cuda_no_lean_decode < 0))
        return create_fail(errbuf, errbuf_size, MSA_ERR_INVALID_ARGUMENT,
                           "debug options must not be negative");
    const msa_backend_ops *ops = backend_ops(params->backend);
    if (!ops)
        return create_fail(errbuf, errbuf_size, MSA_ERR_UNSUPPORTED,
                           "the CUDA backend is not compiled into this build");

    msa_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return create_fail(errbuf, errbuf_size, MSA_ERR_OUT_OF_MEMORY, "out of memory");
    ctx->backend = params->backend;
    ctx->ops = ops;
    ctx->device = params->device;
    int n = params->num_threads;
    if (n == 0) { /* the CPUs this process may use, not the machine's */
        msa_cpu_budget budget;
        msa_cpu_budget_read(&budget);
        n = msa_cpu_budget_threads(&budget);
    }
    ctx->num_threads = n;
    msa_status st = params->parallel_for ? msa_threadpool_create_engine(n, params->parallel_for,
                                                                        params->engine, &ctx->pool)
                                         : msa_threadpool_create(n, &ctx->pool);
    if (st != MSA_OK) {
        free(ctx);
        return create_fail(errbuf, errbuf_size, st, "could not start the thread pool");
    }
    char msg[256] = "";
    st = ops->init(ctx, params, msg, sizeof msg);
    if (st != MSA_OK) {
        msa_threadpool_free(ctx->pool);
        free(ctx);
        return create_fail(errbuf, errbuf_size, st, msg[0] ? msg : "backend init failed");
    }
    *out = ctx;
    return MSA_OK;
}

void msa_context_free(msa_context *ctx)
{
    if (!ctx)
        return;
    ctx->ops->shutdown(ctx);
    msa_threadpool_free(ctx->pool);
    free(ctx);
}

msa_backend msa_context_backend(const msa_context *ctx)
{
    return ctx ? ctx->backend : MSA_BACKEND_CPU;
}
int msa_context_num_threads(const msa_context *ctx)
{
    return ctx ? ctx->num_threads : 0;
}

msa_status msa_buffer_alloc(msa_context *ctx, size_t bytes, void **out)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    if (!out)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "msa_buffer_alloc: out is NULL");
    *out = NULL;
    if (bytes == 0)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "msa_buffer_alloc: zero bytes");
    msa_clear_error(ctx);
    return ctx->ops->alloc(ctx, bytes, out);
}

void msa_buffer_free(msa_context *ctx, void *ptr)
{
    if (ctx && ptr)
        ctx->ops->free(ctx, ptr);
}

msa_status msa_copy_to_buffer(msa_context *ctx, void *dst, const void *host_src, size_t bytes)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    if (bytes && (!dst || !host_src))
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "msa_copy_to_buffer: NULL pointer");
    msa_clear_error(ctx);
    return bytes ? ctx->ops->copy_in(ctx, dst, host_src, bytes) : MSA_OK;
}

msa_status msa_copy_from_buffer(msa_context *ctx, void *host_dst, const void *src, size_t bytes)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    if (bytes && (!host_dst || !src))
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "msa_copy_from_buffer: NULL pointer");
    msa_clear_error(ctx);
    return bytes ? ctx->ops->copy_out(ctx, host_dst, src, bytes) : MSA_OK;
}

msa_status msa_synchronize(msa_context *ctx)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    msa_clear_error(ctx);
    return ctx->ops->synchronize(ctx);
}

msa_status msa_bench_read_bandwidth(msa_context *ctx, size_t bytes, int reps, double *gbps)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    if (!gbps || bytes < 4096 || reps < 1)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "msa_bench_read_bandwidth: need gbps, bytes >= 4096, reps >= 1");
    msa_clear_error(ctx);
    return ctx->ops->bench_read_bandwidth(ctx, bytes, reps, gbps);
}
