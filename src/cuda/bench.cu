/*
 * Benchmark helpers of the CUDA backend.
 *
 * bench_forward: each input set's forward is captured once into a CUDA
 * graph (the path engines use for decode), warm-up replays run untimed,
 * then every replay is bracketed by events, rotating through the sets so
 * the working set can exceed the L2.
 *
 * bench_read_bandwidth: the ceiling the forward is compared with, a
 * streaming read of 16-byte loads over a buffer larger than the L2.
 */
#include "cuda/backend.cuh"

#include <stdlib.h>

msa_status cu_bench_forward(msa_context *ctx, msa_plan *plan, int32_t layer,
                            const msa_layer_io *io_sets, int num_sets, int warmup, int reps,
                            double *times_us);
msa_status cu_bench_read_bandwidth(msa_context *ctx, size_t bytes, int reps, double *gbps);

static int cu_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Holds the stream busy for `ns` nanoseconds, so the events and the graph
 * launch queued behind it reach the GPU before it gets to them: the timed
 * interval then holds the graph's execution, not the host's launch cost. */
__global__ void cu_spin_kernel(unsigned long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

typedef struct cu_bench_res {
    cudaStream_t stream;
    cudaGraph_t *graphs;
    cudaGraphExec_t *execs;
    cudaEvent_t *events;
    int num_sets, num_events;
} cu_bench_res;

static void cu_bench_release(cu_bench_res *r)
{
    if (r->stream)
        cudaStreamSynchronize(r->stream);
    for (int i = 0; r->execs && i < r->num_sets; ++i)
        if (r->execs[i])
            cudaGraphExecDestroy(r->execs[i]);
    for (int i = 0; r->graphs && i < r->num_sets; ++i)
        if (r->graphs[i])
            cudaGraphDestroy(r->graphs[i]);
    for (int i = 0; r->events && i < r->num_events; ++i)
        if (r->events[i])
            cudaEventDestroy(r->events[i]);
    if (r->stream)
        cudaStreamDestroy(r->stream);
    free(r->graphs);
    free(r->execs);
    free(r->events);
}

static msa_status cu_bench_run(msa_context *ctx, msa_plan *plan, int32_t layer,
                               const msa_layer_io *io_sets, int num_sets, int warmup, int reps,
                               double *times_us, cu_bench_res *r)
{
    r->graphs = (cudaGraph_t *)calloc((size_t)num_sets, sizeof(cudaGraph_t));
    r->execs = (cudaGraphExec_t *)calloc((size_t)num_sets, sizeof(cudaGraphExec_t));
    r->events = (cudaEvent_t *)calloc((size_t)reps * 2, sizeof(cudaEvent_t));
    r->num_sets = num_sets;
    if (!r->graphs || !r->execs || !r->events)
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY, "out of host memory");
    CU_TRY(ctx, cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking));
    for (int i = 0; i < reps * 2; ++i) {
        CU_TRY(ctx, cudaEventCreate(&r->events[i]));
        r->num_events = i + 1;
    }
    for (int i = 0; i < num_sets; ++i) {
        msa_layer_io io = io_sets[i];
        io.stream = r->stream;
        CU_TRY(ctx, cudaStreamBeginCapture(r->stream, cudaStreamCaptureModeThreadLocal));
        msa_status st = msa_forward(ctx, plan, layer, &io);
        cudaGraph_t g = NULL;
        cudaError_t e = cudaStreamEndCapture(r->stream, &g);
        r->graphs[i] = g;
        if (st != MSA_OK)
            return st;
        if (e != cudaSuccess)
            return msa_set_error(ctx, MSA_ERR_BACKEND, "graph capture of the forward failed: %s",
                                 cudaGetErrorString(e));
        CU_TRY(ctx, cudaGraphInstantiate(&r->execs[i], g, 0));
        /* Upload now, so the first timed launch does not pay for it. */
        CU_TRY(ctx, cudaGraphUpload(r->execs[i], r->stream));
    }
    for (int w = 0; w < warmup; ++w)
        CU_TRY(ctx, cudaGraphLaunch(r->execs[w % num_sets], r->stream));
    for (int i = 0; i < reps; ++i) {
        cu_spin_kernel<<<1, 1, 0, r->stream>>>(50000ull);
        CU_TRY(ctx, cudaGetLastError());
        CU_TRY(ctx, cudaEventRecord(r->events[2 * i], r->stream));
        CU_TRY(ctx, cudaGraphLaunch(r->execs[(warmup + i) % num_sets], r->stream));
        CU_TRY(ctx, cudaEventRecord(r->events[2 * i + 1], r->stream));
    }
    CU_TRY(ctx, cudaStreamSynchronize(r->stream));
    for (int i = 0; i < reps; ++i) {
        float ms = 0.0f;
        CU_TRY(ctx, cudaEventElapsedTime(&ms, r->events[2 * i], r->events[2 * i + 1]));
        times_us[i] = (double)ms * 1000.0;
    }
    return MSA_OK;
}

msa_status cu_bench_forward(msa_context *ctx, msa_plan *plan, int32_t layer,
                            const msa_layer_io *io_sets, int num_sets, int warmup, int reps,
                            double *times_us)
{
    const cu_ctx_state *cs = (const cu_ctx_state *)ctx->backend_state;
    CU_TRY(ctx, cudaSetDevice(cs->device));
    cu_bench_res r = {0, NULL, NULL, NULL, 0, 0};
    msa_status st = cu_bench_run(ctx, plan, layer, io_sets, num_sets, warmup, reps, times_us, &r);
    cu_bench_release(&r);
    cudaGetLastError();
    return st;
}

/* bench_stages: eager forwards (no graph) with the stage events recorded
 * between the stages (cu_stage_marks); each run waits behind a spin kernel
 * so that its launches are queued before the GPU reaches them. */
static msa_status cu_stages_run(msa_context *ctx, msa_plan *plan, int32_t layer,
                                const msa_layer_io *io_sets, int num_sets, int reps,
                                double *samples, cudaStream_t stream, cu_stage_marks *marks)
{
    cu_ctx_state *cs = (cu_ctx_state *)ctx->backend_state;
    for (int i = 0; i < num_sets + reps; ++i) {
        msa_layer_io io = io_sets[i % num_sets];
        io.stream = stream;
        cu_spin_kernel<<<1, 1, 0, stream>>>(200000ull);
        CU_TRY(ctx, cudaGetLastError());
        marks->skipped = 0;
        cs->stages = marks;
        msa_status st = msa_forward(ctx, plan, layer, &io);
        cs->stages = NULL;
        if (st != MSA_OK)
            return st;
        CU_TRY(ctx, cudaStreamSynchronize(stream));
        if (i < num_sets) /* the untimed first run of each set */
            continue;
        for (int k = 0; k < MSA_STAGE_COUNT; ++k) {
            /* A stage ends where the next stage that runs starts (skipped
             * stages record no event). */
            int end = k + 1;
            while (end < MSA_STAGE_COUNT && (marks->skipped >> end & 1u))
                ++end;
            float ms = 0.0f;
            if (!(marks->skipped >> k & 1u))
                CU_TRY(ctx, cudaEventElapsedTime(&ms, marks->ev[k], marks->ev[end]));
            samples[(size_t)k * reps + (i - num_sets)] = (double)ms * 1000.0;
        }
    }
    return MSA_OK;
}

msa_status cu_bench_stages(msa_context *ctx, msa_plan *plan, int32_t layer,
                           const msa_layer_io *io_sets, int num_sets, int reps, double *stage_us)
{
    const cu_ctx_state *cs = (const cu_ctx_state *)ctx->backend_state;
    CU_TRY(ctx, cudaSetDevice(cs->device));
    double *samples = (double *)malloc(sizeof(double) * (size_t)reps * MSA_STAGE_COUNT);
    if (!samples)
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY, "out of host memory");
    cu_stage_marks marks = {};
    cudaStream_t stream = NULL;
    int made = 0;
    cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    for (; e == cudaSuccess && made < MSA_STAGE_COUNT + 1; ++made)
        e = cudaEventCreate(&marks.ev[made]);
    msa_status st =
        e == cudaSuccess
            ? cu_stages_run(ctx, plan, layer, io_sets, num_sets, reps, samples, stream, &marks)
            : msa_set_error(ctx, MSA_ERR_BACKEND, "stage timing: %s", cudaGetErrorString(e));
    if (stream)
        cudaStreamSynchronize(stream);
    for (int k = 0; k < made; ++k)
        if (marks.ev[k])
            cudaEventDestroy(marks.ev[k]);
    if (stream)
        cudaStreamDestroy(stream);
    cudaGetLastError();
    for (int k = 0; st == MSA_OK && k < MSA_STAGE_COUNT; ++k) {
        double *x = samples + (size_t)k * reps;
        qsort(x, (size_t)reps, sizeof(double), cu_cmp_double);
        stage_us[k] = reps % 2 ? x[reps / 2] : 0.5 * (x[reps / 2 - 1] + x[reps / 2]);
    }
    free(samples);
    return st;
}

/* Sums the words so the loads cannot be removed; the store never happens
 * for real data (the sum would have to equal the flag). */
__global__ void cu_read_kernel(const uint4 *__restrict__ p, size_t n, unsigned flag, unsigned *out)
{
    unsigned acc = 0u;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride);
        const uint4 c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
        acc ^= c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        const uint4 a = __ldcs(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == flag)
        *out = acc;
}

msa_status cu_bench_read_bandwidth(msa_context *ctx, size_t bytes, int reps, double *gbps)
{
    const cu_ctx_state *cs = (const cu_ctx_state *)ctx->backend_state;
    CU_TRY(ctx, cudaSetDevice(cs->device));
    const size_t n = bytes / sizeof(uint4);
    if (n == 0)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "read bandwidth: fewer than 16 bytes");
    void *buf = NULL;
    unsigned *flag = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    double *rates = (double *)calloc((size_t)reps, sizeof(double));
    msa_status st = MSA_OK;
    cudaError_t e = rates ? cudaSuccess : cudaErrorMemoryAllocation;
    if (e == cudaSuccess)
        e = cudaMalloc(&buf, n * sizeof(uint4));
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&flag, sizeof(unsigned));
    if (e == cudaSuccess)
        e = cudaMemset(buf, 0x5a, n * sizeof(uint4));
    if (e == cudaSuccess)
        e = cudaEventCreate(&ev[0]);
    if (e == cudaSuccess)
        e = cudaEventCreate(&ev[1]);
    const int grid = cs->num_sms * 8;
    if (e == cudaSuccess) {
        cu_read_kernel<<<grid, 512>>>((const uint4 *)buf, n, 0x12345u, flag); /* warm-up */
        e = cudaGetLastError();
    }
    for (int i = 0; i < reps && e == cudaSuccess; ++i) {
        e = cudaEventRecord(ev[0]);
        if (e == cudaSuccess) {
            cu_read_kernel<<<grid, 512>>>((const uint4 *)buf, n, 0x12345u, flag);
            e = cudaGetLastError();
        }
        if (e == cudaSuccess)
            e = cudaEventRecord(ev[1]);
        if (e == cudaSuccess)
            e = cudaEventSynchronize(ev[1]);
        float ms = 0.0f;
        if (e == cudaSuccess)
            e = cudaEventElapsedTime(&ms, ev[0], ev[1]);
        if (e == cudaSuccess)
            rates[i] = (double)(n * sizeof(uint4)) / ((double)ms * 1e-3) / 1e9;
    }
    if (e != cudaSuccess) {
        st = msa_set_error(ctx,
                           e == cudaErrorMemoryAllocation ? MSA_ERR_OUT_OF_MEMORY : MSA_ERR_BACKEND,
                           "read bandwidth: %s", cudaGetErrorString(e));
    } else {
        qsort(rates, (size_t)reps, sizeof(double), cu_cmp_double);
        *gbps = reps % 2 ? rates[reps / 2] : 0.5 * (rates[reps / 2 - 1] + rates[reps / 2]);
    }
    cudaGetLastError();
    for (int i = 0; i < 2; ++i)
        if (ev[i])
            cudaEventDestroy(ev[i]);
    cudaFree(buf);
    cudaFree(flag);
    free(rates);
    return st;
}
