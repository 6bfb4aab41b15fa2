/*
 * Per-union readiness between the selection and the Hopper attention, a
 * build-time option (MSA_ATT_FLAGS, off by default; for measurements).
 *
 * Without it, the attention's producer waits for the whole selection grid
 * (the launch wait) before it reads a union, so every request waits for
 * the slowest selection row of the step.  With it, the selection marks
 * each (decode slot, KV head) union ready once written (a release store),
 * and the producer of each unit waits only for its own union's flag (an
 * acquire load), then reads the union with L2-coherent loads: the
 * selection may still be running.  Every CTA still waits for the whole
 * selection before it ends (cu_launch.cuh), so the kernels after the
 * attention see what they saw before.
 *
 * No deadlock: the attention grid is launched only once every selection
 * CTA has started (they signal at once), and the selection waits only for
 * the indexer.  The flags go back to 0 for the next step: the units that
 * read a union count themselves, and the last one clears it.  The count
 * needs no host data: a (request, KV head) has ceil(q_len / 8) row groups
 * of 128 rows (a unit each per split, plan.cu), each with its own split
 * count.  The forward sets L.att_flags only when the Hopper attention runs
 * the sparse pass, so flags are never set without their readers.
 */
#ifndef MSA_CU_READY_CUH
#define MSA_CU_READY_CUH

#include "cu_plan.cuh"

#ifdef MSA_ATT_FLAGS

/* Selection, the warp that wrote union (k, g) (every lane). */
__device__ __forceinline__ void cu_ready_set(const cu_layer &L, int32_t k, int32_t g)
{
    if (!L.att_flags)
        return;
    __syncwarp();
    __threadfence(); /* every lane's union stores, before the flag */
    __syncwarp();
    if ((threadIdx.x & 31) == 0) {
        int32_t *f = L.att_flags + (int64_t)k * L.Hkv + g;
        asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(f), "r"(1) : "memory");
    }
}

/* Attention producer (every lane): until union (k, g) is ready. */
__device__ __forceinline__ void cu_ready_wait(const cu_layer &L, int32_t k, int32_t g)
{
    const int32_t *f = L.att_flags + (int64_t)k * L.Hkv + g;
    for (;;) {
        int32_t v;
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(f) : "memory");
        if (v != 0)
            break;
        __nanosleep(64);
    }
}

/* Attention producer (one lane), after the last tile of the unit whose
 * first item is `it`: one reader of its union less; the last one of all
 * row groups clears the flag.  Counters [3] per union: one per row group
 * (128 rows: q_len <= 16 gives at most two), then the groups done. */
__device__ __forceinline__ void cu_ready_release(const cu_layer &L, const cu_att_item &it)
{
    const int64_t kg = (int64_t)it.dec * L.Hkv + it.group;
    int32_t *rd = L.att_readers + kg * 3;
    const int j = it.row0 / 128;
    if (atomicAdd(&rd[j], 1) == it.nsplit - 1) {
        rd[j] = 0;
        if (atomicAdd(&rd[2], 1) == (it.ql + 7) / 8 - 1) {
            rd[2] = 0;
            L.att_flags[kg] = 0;
        }
    }
}

/* A union written by a selection that may still run (see above). */
#define CU_UNION_LOAD(p) __ldcg(p)

#else

#define CU_UNION_LOAD(p) (*(p))

#endif /* MSA_ATT_FLAGS */

#endif /* MSA_CU_READY_CUH */
