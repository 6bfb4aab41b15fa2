/* Internal structures shared by the core and the backends.  No CUDA headers. */
#ifndef MSA_INTERNAL_H
#define MSA_INTERNAL_H

#include "msa/msa.h"

#include <stdarg.h>
#include <stdbool.h>
#include <string.h>

typedef struct msa_threadpool msa_threadpool;

/* ---- backend operation table ------------------------------------------
 * The core validates every call, then calls through this table.  A backend
 * never sees invalid input.  All pointers handed to the stage functions are
 * backend memory (host for CPU, device for CUDA). */
typedef struct msa_backend_ops {
    const char *name;
    /* Context lifetime. */
    msa_status (*init)(msa_context *ctx, const msa_context_params *params, char *err,
                       size_t err_size);
    void (*shutdown)(msa_context *ctx);
    /* Memory: alloc returns zero-filled memory. */
    msa_status (*alloc)(msa_context *ctx, size_t bytes, void **out);
    void (*free)(msa_context *ctx, void *ptr);
    msa_status (*copy_in)(msa_context *ctx, void *dst, const void *host_src, size_t bytes);
    msa_status (*copy_out)(msa_context *ctx, void *host_dst, const void *src, size_t bytes);
    msa_status (*synchronize)(msa_context *ctx);
    /* Plan: create backend state sized by plan->cap_* (called with
     * plan->backend == NULL; on failure plan->backend stays NULL and nothing
     * is left allocated), publish the host metadata of a validated step, free
     * it.  Everything a step within the capacities needs is allocated by
     * plan_init, so plan_upload allocates nothing; when plan_upload fails it
     * leaves the state of the previous step exactly as it was, because the
     * core then restores that step's host arrays and runs it again.  Every
     * allocation made for a plan asks msa_alloc_fault() first.  With
     * plan->workspace set, plan_init takes every work buffer from it
     * (plan_workspace's layout) and allocates no backend memory. */
    msa_status (*plan_init)(msa_plan *plan);
    /* Bytes of backend memory the work buffers of a plan with plan->cap_*
     * and plan->params take; the plan given holds only ctx, model, cache,
     * params and the capacities. */
    msa_status (*plan_workspace)(const msa_plan *plan, size_t *bytes);
    msa_status (*plan_upload)(msa_plan *plan, void *stream);
    void (*plan_free)(msa_plan *plan);
    /* Kernel path for a layer under the current plan; `reason` gets "" when
     * the fast path is taken. */
    void (*describe)(const msa_plan *plan, int32_t layer, const char **kernel, const char **reason);
    /* One layer, input already validated by msa_forward. */
    msa_status (*forward)(msa_context *ctx, msa_plan *plan, int32_t layer, const msa_layer_io *io);
    /* Benchmark helpers (arguments validated by the core). */
    msa_status (*bench_forward)(msa_context *ctx, msa_plan *plan, int32_t layer,
                                const msa_layer_io *io_sets, int num_sets, int warmup, int reps,
                                double *times_us);
    msa_status (*bench_read_bandwidth)(msa_context *ctx, size_t bytes, int reps, double *gbps);
    /* NULL: the backend does not time stages. */
    msa_status (*bench_stages)(msa_context *ctx, msa_plan *plan, int32_t layer,
                               const msa_layer_io *io_sets, int num_sets, int reps,
                               double *stage_us);
} msa_backend_ops;

extern const msa_backend_ops msa_cpu_backend_ops;
#ifdef MSA_HAVE_CUDA
extern const msa_backend_ops msa_cuda_backend_ops;
#endif

struct msa_context {
    msa_backend backend;
    const msa_backend_ops *ops;
    int num_threads;
    int device;
    msa_threadpool *pool; /* CPU backend */
    void *backend_state;  /* backend-private */
    char last_error[512];
};

struct msa_model {
    msa_model_config cfg; /* scales resolved; layer arrays point below */
    uint8_t *layer_sparse;
    uint8_t *layer_index_value;
    int32_t group;      /* Hq / Hkv */
    int32_t topk_width; /* W */
};

/* Where a plane keeps its rows: the row of (page, head, slot) starts at
 * element page * page + head * head + slot * token of the plane's data. */
typedef struct msa_plane_strides {
    int64_t page, head, token;
} msa_plane_strides;

struct msa_cache {
    msa_context *ctx;
    const msa_model *model;
    msa_cache_config cfg;
    int owns_memory;
    void **planes;       /* [num_layers * 4] */
    size_t *plane_bytes; /* [num_layers * 4]: bytes from planes[i] to its last row's end */
    float *scales;       /* [num_layers * 4] */
    /* [num_layers * 4] in elements: the library layout's
     * (msa_plane_library_strides) unless wrapped with other strides; for
     * nvfp4 planes, which only take the library layout, not read. */
    msa_plane_strides *strides;
};

/* Strides of a plane in the library layout: [pages][heads][P][dim]. */
msa_plane_strides msa_plane_library_strides(const msa_model *model, const msa_cache_config *cfg,
                                            msa_plane plane);
/* 1 when every plane of the layer is in the library layout. */
int msa_cache_layer_is_library_layout(const msa_cache *cache, int32_t layer);

/* Host arrays of one step, sized by the plan's capacities. */
typedef struct msa_plan_arrays {
    int32_t *q_len, *kv_len, *page_table, *token_request;
    int64_t *q_start, *token_pos;
} msa_plan_arrays;

/* Host copy of one validated step, plus capacities. */
struct msa_plan {
    msa_context *ctx;
    const msa_model *model;
    msa_cache *cache;
    msa_plan_params params; /* as given (limits 0 = grow); act_dtype fixes every forward's */

    /* Current capacities (== limits when fixed). */
    int32_t cap_requests;
    int64_t cap_tokens;
    int64_t cap_kv_len;
    int64_t cap_pages_per_request; /* ceil(cap_kv_len / page_size) */

    /* Current step. */
    int32_t num_requests;
    int64_t num_tokens;    /* rows of the token tensors */
    int64_t active_tokens; /* sum(q_len) */
    int64_t max_kv_len;    /* max kv_len of this step */
    int32_t max_q_len;
    int32_t *q_len;         /* [cap_requests] */
    int32_t *kv_len;        /* [cap_requests] */
    int64_t *q_start;       /* [cap_requests + 1] first token row of request r */
    int32_t *page_table;    /* [cap_requests * cap_pages_per_request], -1 unused */
    int32_t *token_request; /* [cap_tokens]: request of a row, -1 for padding */
    int64_t *token_pos;     /* [cap_tokens]: absolute position, -1 for padding */
    /* A second set of the arrays above, same capacities: msa_plan_update
     * writes the next step here and swaps the sets only when the backend
     * took the step, so a failed update leaves the current step intact. */
    msa_plan_arrays spare;
    int has_step; /* 1 once an msa_plan_update succeeded */
    /* Where the current step's page table lives.  With a device table (the
     * CUDA backend; the CPU backend reads a device table as a host one) the
     * host page_table array holds -1 everywhere and the backend reads the
     * step's rows, device_table_stride apart, from device_table. */
    int table_on_device;
    const int32_t *device_table;
    int64_t device_table_stride;
    /* Caller workspace (msa_plan_create_with_workspace): the backend's work
     * buffers, carved by plan_init; NULL when the backend allocates them. */
    void *workspace;
    size_t workspace_bytes;

    void *backend; /* backend-private plan state */

    /* [ceil(num_pages / 64)] scratch of the page-collision check, all-zero
     * between updates (src/core/step_pages.c). */
    uint64_t *page_marks;
};

/* ---- core helpers ------------------------------------------------------ */
msa_status msa_set_error(msa_context *ctx, msa_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void msa_clear_error(msa_context *ctx);

/* Allocation-failure injection (src/core/alloc_fault.c).  Code that allocates
 * for a plan calls msa_alloc_fault() before each allocation and fails as out
 * of memory when it returns 1.  msa_test_fail_allocation(n) makes the n-th
 * allocation from now fail (0: the next one) and every later one succeed;
 * a negative n turns injection off. */
int msa_alloc_fault(void);
void msa_test_fail_allocation(long n);
/* Allocation counts for tests: msa_test_allocations() counts the calls of
 * msa_alloc_fault() so far (every allocation made for a plan, host or
 * device), msa_test_device_allocations() the backend memory allocated for
 * plans' work buffers (device memory with CUDA), which the backends report
 * with msa_count_device_allocation(). */
void msa_count_device_allocation(void);
long msa_test_allocations(void);
long msa_test_device_allocations(void);

/* Plan memory (src/core/plan.c).  msa_plan_malloc asks msa_alloc_fault()
 * first, refuses a block larger than the machine's physical memory (so an
 * absurd capacity fails as out of memory instead of relying on overcommit)
 * and allocates at least one byte, so NULL always means failure.
 * msa_plan_aligned_alloc does the same with 64-byte alignment.  Both are released with free(). */
void *msa_plan_malloc(size_t bytes);
void *msa_plan_aligned_alloc(size_t bytes);
/* Physical memory of the machine in bytes (SIZE_MAX when unknown). */
size_t msa_host_memory_bytes(void);
/* Overflow-checked size arithmetic: stores the result and returns 1 when it
 * fits in size_t, returns 0 (and stores nothing) otherwise. */
int msa_size_mul(size_t a, size_t b, size_t *out);
int msa_size_add(size_t a, size_t b, size_t *out);
/* Capacity after growing `cap` to hold `need`: at least double the old
 * capacity (amortized growth), never above `max`.  Returns -1 when need
 * exceeds max. */
int64_t msa_capacity_grow(int64_t cap, int64_t need, int64_t max);
/* Largest capacities a plan can have. */
#define MSA_PLAN_MAX_REQUESTS INT64_C(2147483647)
#define MSA_PLAN_MAX_TOKENS (INT64_C(1) << 40)
#define MSA_PLAN_MAX_KV_LEN (INT64_C(1) << 31)
/* Page-collision check of a step (SPEC section 10, src/core/step_pages.c).
 * init allocates plan->page_marks for the cache's pool; check rejects, with
 * MSA_ERR_INVALID_ARGUMENT, a validated step in which a page that the step
 * writes into appears more than once among the page-table entries it uses.
 * check never allocates and changes nothing but scratch it restores. */
msa_status msa_step_pages_init(msa_plan *plan);
void msa_step_pages_free(msa_plan *plan);
msa_status msa_step_pages_check(msa_plan *plan, const msa_step *step, const char *fn);

/* The bits of an fp32 value, and the value of fp32 bits (no aliasing). */
static inline uint32_t msa_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float msa_bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Element conversions (exact bit-level implementations, no FPU mode tricks). */
float msa_bf16_to_f32(uint16_t x);
uint16_t msa_f32_to_bf16(float x); /* round to nearest even, NaN kept */
float msa_f16_to_f32(uint16_t x);
uint16_t msa_f32_to_f16(float x); /* round to nearest even, overflow to inf */
/* Reads element i of an fp32/bf16/fp16 array as float. */
float msa_load_act(const void *base, msa_dtype dtype, int64_t i);
void msa_store_act(void *base, msa_dtype dtype, int64_t i, float value);
/* Converts n floats into an fp32/bf16/fp16 array (and back). */
void msa_convert_from_f32(void *dst, msa_dtype dtype, const float *src, int64_t n);
void msa_convert_to_f32(float *dst, const void *src, msa_dtype dtype, int64_t n);

/* Row width of plane elements per token (D for K/V, Di for index). */
int32_t msa_plane_dim(const msa_model *model, msa_plane plane);
int msa_layer_has_plane(const msa_model *model, int32_t layer, msa_plane plane);
size_t msa_plane_bytes_for(const msa_model *model, const msa_cache_config *cfg, int32_t layer,
                           msa_plane plane);

/* Thread pool: run fn(arg, ith, nth) on nth = pool size threads (caller is
 * thread 0) and wait for all. */
typedef void (*msa_work_fn)(void *arg, int ith, int nth);
msa_status msa_threadpool_create(int num_threads, msa_threadpool **out);
/* A pool that starts no threads: every run goes through the engine's
 * parallel_for (msa_context_params). */
msa_status msa_threadpool_create_engine(int num_threads,
                                        void (*parallel_for)(void *engine, int n_tasks,
                                                             void (*task)(void *arg, int i),
                                                             void *arg),
                                        void *engine, msa_threadpool **out);
void msa_threadpool_free(msa_threadpool *pool);
void msa_threadpool_run(msa_threadpool *pool, msa_work_fn fn, void *arg);
int msa_threadpool_size(const msa_threadpool *pool);

/* The CPUs this process may use (cpu_budget.c): the online CPUs, those of
 * its affinity mask (0: unknown) and the whole CPUs of its cgroup's CPU
 * bandwidth limit (0: none).  The default number of a context's threads
 * is the smallest of the three that is known, at most 256. */
typedef struct msa_cpu_budget {
    int online;
    int affinity;
    int quota;
} msa_cpu_budget;
void msa_cpu_budget_read(msa_cpu_budget *b);
int msa_cpu_budget_threads(const msa_cpu_budget *b);
/* The cgroup CPU limit in whole CPUs (at least 1; 0: none found) of the
 * process whose cgroup file (/proc/self/cgroup) is proc_cgroup: the v2
 * hierarchy mounted at v2_root (cpu.max), the v1 cpu controller at
 * v1_root (cpu.cfs_quota_us, cpu.cfs_period_us); the smallest limit of
 * the process's cgroup and its ancestors. */
int msa_cgroup_cpu_limit(const char *proc_cgroup, const char *v2_root, const char *v1_root);

#endif /* MSA_INTERNAL_H */
