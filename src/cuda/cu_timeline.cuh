/*
 * Timeline of a layer's kernels (profiling aid, compiled in with
 * -DMSA_TIMELINE, e.g. CMAKE_CUDA_FLAGS; otherwise every mark compiles to
 * nothing).  With MSA_CUDA_TIMELINE=path in the environment the context
 * owns a device buffer, and one thread per CTA stamps the global timer (ns)
 * at up to six events of its kernel (three more for the aids below):
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
 * Two build flags move marks to finer steps, for measurements:
 * MSA_TL_SEL_STEPS (selection: a CTA's first row stamps "issued" when
 * selected and written, "first" when its completion count came back, "last"
 * when it built unions) and MSA_TL_ATT_UNION (attention: the first unit's
 * producer stamps "last" when its union's rows are in, "first" when the
 * union is built; cu_attt_union).  MSA_TL_ATT_STEPS (attention, the CTA's
 * first unit) stamps the three aux events: aux1 when the producer has its
 * stream after the wait (the union's length known), aux2 when it has read
 * its first window of ids and pages (just before its first slot), aux3
 * when the consumers' first tile is computed (thread 0's group).
 *
 * Every forward overwrites the stamps; when the context is destroyed the
 * last forward's stamps are written to `path` as CSV (bench/timeline.py
 * summarizes them).
 *
 * MSA_TL_SEL_CYCLES (selection) counts SM cycles beside the timer, to tell
 * a slow clock from a long chain: aux1 is "waited" plus the cycles from the
 * wait to the CTA's first row written (so aux1 - waited, read in µs, is
 * thousands of cycles), aux2 "entry" plus the cycles from entry to exit
 * ((aux2 - entry) / (exit - entry) is the SM clock in GHz); aux4 .. aux9,
 * "waited" plus the cycles to each step of the first row's list path
 * (cu_select.cuh, MSA_SEL_STAMPS: its entry, keys stored, thresholds,
 * list, ranks, ids).
 *
 * Without the variable the layer's pointer is NULL and
 * a mark is one untaken branch.  Graph replay keeps the pointer it was
 * captured with, which lives as long as the context.
 */
#ifndef MSA_CU_TIMELINE_CUH
#define MSA_CU_TIMELINE_CUH

#include <stdint.h>

enum { CU_TL_PROLOGUE, CU_TL_INDEXER, CU_TL_SELECT, CU_TL_ATTN, CU_TL_MERGE, CU_TL_KERNELS };
enum {
    CU_TL_ENTRY, CU_TL_WAITED, CU_TL_ISSUED, CU_TL_FIRST, CU_TL_LAST, CU_TL_EXIT,
    CU_TL_AUX1, CU_TL_AUX2, CU_TL_AUX3, /* finer steps of a measuring aid (below) */
    CU_TL_AUX4, CU_TL_AUX5, CU_TL_AUX6, CU_TL_AUX7, CU_TL_AUX8, CU_TL_AUX9,
    CU_TL_EVENTS
};
/* The CSV columns of the events, in enum order. */
#define CU_TL_EVENT_COLUMNS                                                                                  \
    "entry_ns,waited_ns,issued_ns,first_ns,last_ns,exit_ns,aux1_ns,aux2_ns,aux3_ns,aux4_ns,aux5_ns,aux6_ns,"  \
    "aux7_ns,aux8_ns,aux9_ns"
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
__device__ __forceinline__ void cu_tl_put(unsigned long long *tl, int kernel, int event, unsigned long long value)
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

#endif /* MSA_CU_TIMELINE_CUH */
