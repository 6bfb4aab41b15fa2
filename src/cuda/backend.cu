/*
 * The CUDA backend's operation table and its context-level operations:
 * device selection, memory, copies, synchronisation.  Plans live in
 * plan.cu, the layer forward in forward.cu, benchmarks in bench.cu.
 */
#include "cuda/backend.cuh"
#include "cuda/arch/tma_sm90.cuh"
#include "cuda/common/timeline.cuh"
#include "cuda/kernels/lean/lean_decode.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

msa_status cu_bench_forward(msa_context *ctx, msa_plan *plan, int32_t layer,
                            const msa_layer_io *io_sets, int num_sets, int warmup, int reps,
                            double *times_us);
msa_status cu_bench_read_bandwidth(msa_context *ctx, size_t bytes, int reps, double *gbps);

static msa_status cu_init(msa_context *ctx, const msa_context_params *params, char *err,
                          size_t err_size)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        if (err && err_size)
            snprintf(err, err_size, "no CUDA device available: %s",
                     e != cudaSuccess ? cudaGetErrorString(e) : "device count is 0");
        cudaGetLastError();
        return MSA_ERR_NO_DEVICE;
    }
    const int dev = params ? params->device : 0;
    if (dev < 0 || dev >= count) {
        if (err && err_size)
            snprintf(err, err_size, "CUDA device %d not present (%d device%s)", dev, count,
                     count == 1 ? "" : "s");
        return MSA_ERR_NO_DEVICE;
    }
    msa_debug_options none;
    memset(&none, 0, sizeof none);
    const msa_debug_options *dbg = params && params->debug ? params->debug : &none;
    const char *tl_path =
        dbg->cuda_timeline_path && dbg->cuda_timeline_path[0] ? dbg->cuda_timeline_path : NULL;
#ifndef MSA_TIMELINE
    if (tl_path) {
        if (err && err_size)
            snprintf(err, err_size,
                     "cuda_timeline_path is set but the library was built without -DMSA_TIMELINE");
        return MSA_ERR_UNSUPPORTED;
    }
#endif
    cu_ctx_state *cs = (cu_ctx_state *)calloc(1, sizeof(*cs));
    if (!cs) {
        if (err && err_size)
            snprintf(err, err_size, "out of host memory");
        return MSA_ERR_OUT_OF_MEMORY;
    }
    cs->device = dev;
    e = cudaSetDevice(dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&cs->num_sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess && dbg->cuda_num_sms >= 1 && dbg->cuda_num_sms < cs->num_sms)
        cs->num_sms = dbg->cuda_num_sms;
    int major = 0;
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cs->pdl = major >= 9 && !dbg->cuda_no_pdl;
    cs->tma = major >= 9 && !dbg->cuda_no_tma;
    /* wgmma exists in the sm_90a code only: later chips run the portable
     * PTX, where the Hopper indexer has no body. */
    cs->wgmma = cs->tma && major == 9;
    cs->sel_warp_rows = dbg->cuda_sel_warp_rows != 0;
    cs->sel_unions = dbg->cuda_sel_unions != 0;
    cs->pf_tma = cs->wgmma && !dbg->cuda_no_prefill_tma;
    cs->pfi = !dbg->cuda_no_prefill_indexer;
    cs->pf_kbm = cs->pf_tma && !dbg->cuda_no_prefill_kbm;
    cs->pf_kbm_chunk = dbg->cuda_prefill_kbm_chunk;
    cs->pfi_wgmma = cs->wgmma && !dbg->cuda_no_prefill_wgmma;
    if (e == cudaSuccess)
        e = cu_indexer_mma_setup(cs->num_sms, &cs->grid_idx_fast);
    if (e == cudaSuccess)
        e = cu_attn_mma_setup(cs->num_sms, &cs->grid_att_fast);
    if (e == cudaSuccess && cs->wgmma)
        e = cu_indexer_tma_setup();
    if (e == cudaSuccess && cs->wgmma)
        e = cu_attn_tma_setup();
    /* The lean decode kernel: mma.sync products and its one CTA's shared
     * memory on an SM. */
    int smem_optin = 0;
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cs->lean = major >= 8 && !dbg->cuda_no_lean_decode && (size_t)smem_optin >= cu_lean_smem();
    if (e == cudaSuccess && cs->lean)
        e = cu_lean_setup();
    if (e == cudaSuccess && tl_path) {
        cs->tl_path = (char *)malloc(strlen(tl_path) + 1);
        if (cs->tl_path)
            strcpy(cs->tl_path, tl_path);
        e = cudaMalloc((void **)&cs->tl, CU_TL_WORDS * sizeof(unsigned long long));
        if (e == cudaSuccess)
            e = cudaMemset(cs->tl, 0, CU_TL_WORDS * sizeof(unsigned long long));
    }
    if (e != cudaSuccess) {
        if (err && err_size)
            snprintf(err, err_size, "CUDA device %d: %s", dev, cudaGetErrorString(e));
        cudaFree(cs->tl);
        free(cs->tl_path);
        free(cs);
        cudaGetLastError();
        return MSA_ERR_BACKEND;
    }
    ctx->device = dev;
    ctx->backend_state = cs;
    return MSA_OK;
}

/* The last forward's timeline stamps as CSV, in ns after the earliest
 * stamp: kernel, CTA, then the events of common/timeline.cuh (empty: not
 * stamped).  Best effort: a profiling aid reports its own failures on
 * stderr and never fails the context's shutdown. */
static void cu_timeline_write(const cu_ctx_state *cs)
{
    static const char *names[CU_TL_KERNELS] = {"prologue", "indexer", "select", "attention",
                                               "merge"};
    unsigned long long *h = (unsigned long long *)malloc(CU_TL_WORDS * sizeof(*h));
    FILE *f = h ? fopen(cs->tl_path, "w") : NULL;
    if (!f || cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(h, cs->tl, CU_TL_WORDS * sizeof(*h), cudaMemcpyDeviceToHost) != cudaSuccess) {
        fprintf(stderr, "libmsa: timeline: cannot write %s\n", cs->tl_path);
        cudaGetLastError();
        if (f)
            fclose(f);
        free(h);
        return;
    }
    unsigned long long t0 = ~0ull;
    for (size_t i = 0; i < CU_TL_WORDS; ++i)
        if (h[i] && h[i] < t0)
            t0 = h[i];
    fprintf(f, "kernel,cta," CU_TL_EVENT_COLUMNS "\n");
    for (int k = 0; k < CU_TL_KERNELS; ++k)
        for (int c = 0; c < CU_TL_MAX_CTAS; ++c) {
            const unsigned long long *e = h + ((size_t)k * CU_TL_MAX_CTAS + c) * CU_TL_EVENTS;
            if (!e[CU_TL_ENTRY])
                continue;
            fprintf(f, "%s,%d", names[k], c);
            for (int j = 0; j < CU_TL_EVENTS; ++j) {
                if (e[j])
                    fprintf(f, ",%llu", e[j] - t0);
                else
                    fprintf(f, ",");
            }
            fprintf(f, "\n");
        }
    fclose(f);
    free(h);
}

static void cu_shutdown(msa_context *ctx)
{
    cu_ctx_state *cs = (cu_ctx_state *)ctx->backend_state;
    if (cs && cs->tl) {
        cudaSetDevice(cs->device);
        if (cs->tl_path)
            cu_timeline_write(cs);
        cudaFree(cs->tl);
    }
    if (cs)
        free(cs->tl_path);
    free(ctx->backend_state);
    ctx->backend_state = NULL;
}

static int cu_device(const msa_context *ctx)
{
    return ((const cu_ctx_state *)ctx->backend_state)->device;
}

static msa_status cu_alloc(msa_context *ctx, size_t bytes, void **out)
{
    *out = NULL;
    CU_TRY(ctx, cudaSetDevice(cu_device(ctx)));
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return msa_set_error(ctx,
                             e == cudaErrorMemoryAllocation ? MSA_ERR_OUT_OF_MEMORY
                                                            : MSA_ERR_BACKEND,
                             "cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e));
    }
    e = cudaMemset(p, 0, bytes);
    if (e != cudaSuccess) {
        cudaFree(p);
        return msa_set_error(ctx, MSA_ERR_BACKEND, "cudaMemset: %s", cudaGetErrorString(e));
    }
    *out = p;
    return MSA_OK;
}

static void cu_free(msa_context *ctx, void *ptr)
{
    if (!ptr)
        return;
    cudaSetDevice(cu_device(ctx));
    cudaFree(ptr);
}

static msa_status cu_copy_in(msa_context *ctx, void *dst, const void *host_src, size_t bytes)
{
    CU_TRY(ctx, cudaSetDevice(cu_device(ctx)));
    CU_TRY(ctx, cudaMemcpy(dst, host_src, bytes, cudaMemcpyDefault));
    return MSA_OK;
}

static msa_status cu_copy_out(msa_context *ctx, void *host_dst, const void *src, size_t bytes)
{
    CU_TRY(ctx, cudaSetDevice(cu_device(ctx)));
    CU_TRY(ctx, cudaMemcpy(host_dst, src, bytes, cudaMemcpyDefault));
    return MSA_OK;
}

static msa_status cu_synchronize(msa_context *ctx)
{
    CU_TRY(ctx, cudaSetDevice(cu_device(ctx)));
    CU_TRY(ctx, cudaDeviceSynchronize());
    return MSA_OK;
}

extern "C" const msa_backend_ops msa_cuda_backend_ops = {
    "cuda",          cu_init,           cu_shutdown,      cu_alloc,
    cu_free,         cu_copy_in,        cu_copy_out,      cu_synchronize,
    cu_plan_init,    cu_plan_workspace, cu_plan_upload,   cu_plan_free,
    cu_describe,     cu_forward,        cu_bench_forward, cu_bench_read_bandwidth,
    cu_bench_stages,
};
