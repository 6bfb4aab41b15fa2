/*
 * Last launch of an attention pass, two jobs for every CTA:
 *   merge         split decode attention: each split left a normalized fp32
 *                 row and its LSE; the output is the LSE-weighted sum.  One
 *                 warp per output row.
 *   prefill rows  the rows of prefill requests (cu_rows.cuh), which depend
 *                 only on the selection, not on the decode items.
 */
#include "cu_rows.cuh"
#include "cu_merge_row.cuh"
#include "cu_launch.cuh"
#include "cu_timeline.cuh"

#define MERGE_WARPS 8

/* A warp's wait for the splits of item `it` (cu_att_merges) that the
 * attention still runs: lane 0 polls the item's count until every split
 * has counted (acquire; the warp barrier passes the rows on to the other
 * lanes), then counts itself among the item's nrows readers.  Returns, in
 * lane 0, the count before its own: the last reader's is nsplit + nrows - 1,
 * and it sets the count back to 0 for the next step (cu_merge_reset_count),
 * every reader having passed its wait by then. */
__device__ __forceinline__ int32_t cu_merge_wait_splits(const cu_layer &L, const cu_merge_item &it)
{
    int32_t prev = 0;
    if ((threadIdx.x & 31) == 0) {
        const int32_t *c = L.att_done + it.part_base;
        for (;;) {
            int32_t v;
            asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(c) : "memory");
            if (v >= it.nsplit)
                break;
            __nanosleep(64);
        }
    }
    __syncwarp();
    if ((threadIdx.x & 31) == 0)
        prev = atomicAdd(L.att_done + it.part_base, 1);
    return prev;
}

__device__ __forceinline__ void cu_merge_reset_count(const cu_layer &L, const cu_merge_item &it, int32_t prev)
{
    if ((threadIdx.x & 31) == 0 && prev == it.nsplit + it.nrows - 1)
        L.att_done[it.part_base] = 0;
}

__device__ __forceinline__ void cu_merge_role(const cu_layer &L, const cu_attn &A, int cta, int nctas)
{
    const int warp = threadIdx.x >> 5;
    const int32_t n_items = L.m.hdr->n_merge[A.kind];
    const cu_merge_item *items = L.m.merge[A.kind];
    /* Rows of all merge items enumerated item by item, CU_ROWS_PER_ITEM each. */
    const int64_t total = (int64_t)n_items * CU_ROWS_PER_ITEM;
    for (int64_t w = (int64_t)cta * MERGE_WARPS + warp; w < total; w += (int64_t)nctas * MERGE_WARPS) {
        const int32_t ii = (int32_t)(w / CU_ROWS_PER_ITEM);
        const int32_t rl = (int32_t)(w - (int64_t)ii * CU_ROWS_PER_ITEM);
        const cu_merge_item it = items[ii];
        if (rl >= it.nrows)
            continue;
        const bool early = cu_att_merges(A, it.nsplit);
        int32_t prev = 0;
        if (early)
            prev = cu_merge_wait_splits(L, it);
        else
            cu_pdl_wait(); /* the attention's partial rows (at once after the first) */
        if (threadIdx.x == 0 && w == (int64_t)cta * MERGE_WARPS)
            CU_TL_MARK(L, CU_TL_MERGE, CU_TL_WAITED);
        cu_merge_row(L, A, it.part_base, it.nrows, it.nsplit, rl,
                     cu_merge_qrow(A, it.t0, it.group, it.row0 + rl));
        if (early)
            cu_merge_reset_count(L, it, prev);
    }
}

__global__ void __launch_bounds__(MERGE_WARPS * 32, 2) cu_merge_prefill_kernel(cu_layer L, cu_attn A)
{
    cu_pdl_trigger();
    if (threadIdx.x == 0)
        CU_TL_MARK(L, CU_TL_MERGE, CU_TL_ENTRY);
    /* Both roles in every CTA: no CTAs that only check for absent work.
     * The merge reads its plan items before it waits for the partials. */
    cu_merge_role(L, A, blockIdx.x, gridDim.x);
    cu_pdl_wait(); /* the selection for the prefill rows; every CTA waits */
    cu_attn_prefill_role(L, A, blockIdx.x, gridDim.x, MERGE_WARPS);
    if (threadIdx.x == 0)
        CU_TL_MARK(L, CU_TL_MERGE, CU_TL_EXIT);
}

void cu_launch_merge_prefill(const cu_layer *L, const cu_plan_state *st, const cu_attn *A,
                             cudaStream_t s)
{
    cu_launch(cu_merge_prefill_kernel, st->grid_merge, MERGE_WARPS * 32, 0, s, st->pdl, *L, *A);
}
