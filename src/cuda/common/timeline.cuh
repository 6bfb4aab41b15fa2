/*
 * Timeline of a layer's kernels: the profiler, compiled in with
 * -DMSA_TIMELINE (e.g. CMAKE_CUDA_FLAGS); otherwise every mark compiles to
 * nothing.  With msa_debug_options.cuda_timeline_path set the context owns
 * a device buffer, and one thread per CTA stamps the global timer (ns) at
 * six named events of its kernel, the same in every build:
 *
 *   entry    the CTA started;
 *   waited   its working thread came back from the launch wait (the kernel
 *            before it had finished);
 *   issued   its producer issued its first tensor copy (indexer, attention);
 *            selection: it built the unions of a request of several tokens
 *            (the last such request of the CTA);
 *   first    the first piece of work was in hand (indexer and attention:
 *            the first tile landed in shared memory; selection: the first
 *            row selected and written);
 *   last     the last piece of work was in hand (the last tile landed, the
 *            last row written);
 *   exit     the CTA's last wait returned, it is about to end.
 *
 * Every forward overwrites the stamps; when the context is destroyed the
 * last forward's stamps are written to the path as CSV (bench/timeline.py
 * summarizes them).  Without a path the layer's pointer is NULL and a mark
 * is one untaken branch.  Graph replay keeps the pointer it was captured
 * with, which lives as long as the context.
 */
#ifndef MSA_CUDA_COMMON_TIMELINE_CUH
#define MSA_CUDA_COMMON_TIMELINE_CUH

#include <stdint.h>

enum { CU_TL_PROLOGUE, CU_TL_INDEXER, CU_TL_SELECT, CU_TL_ATTN, CU_TL_MERGE, CU_TL_KERNELS };
enum { CU_TL_ENTRY, CU_TL_WAITED, CU_TL_ISSUED, CU_TL_FIRST, CU_TL_LAST, CU_TL_EXIT, CU_TL_EVENTS };
/* The CSV columns of the events, in enum order. */
#define CU_TL_EVENT_COLUMNS "entry_ns,waited_ns,issued_ns,first_ns,last_ns,exit_ns"
#define CU_TL_MAX_CTAS 4096
#define CU_TL_WORDS ((size_t)CU_TL_KERNELS * CU_TL_MAX_CTAS * CU_TL_EVENTS)

#if defined(__CUDACC__) && defined(MSA_TIMELINE)
/* The global timer, ns. */
__device__ __forceinline__ unsigned long long cu_tl_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* Stores `value` as event `event` of kernel `kernel` for this CTA. */
__device__ __forceinline__ void cu_tl_put(unsigned long long *tl, int kernel, int event,
                                          unsigned long long value)
{
    if (tl && blockIdx.x < CU_TL_MAX_CTAS)
        tl[((size_t)kernel * CU_TL_MAX_CTAS + blockIdx.x) * CU_TL_EVENTS + event] = value;
}
/* Stamps event `event` of kernel `kernel` for this CTA (one thread calls). */
__device__ __forceinline__ void cu_tl_mark(unsigned long long *tl, int kernel, int event)
{
    cu_tl_put(tl, kernel, event, cu_tl_now());
}
#define CU_TL_MARK(L, kernel, event) cu_tl_mark((L).tl, kernel, event)
#else
#define CU_TL_MARK(L, kernel, event) ((void)0)
#endif

#endif /* MSA_CUDA_COMMON_TIMELINE_CUH */
