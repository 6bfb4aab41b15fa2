/*
 * Union of the blocks selected by the tokens of one decode request, per KV
 * head, with per-token membership bits.  The sparse decode attention walks
 * this list so that each selected block is read once for all q_len tokens
 * and all G query heads of the group.
 *
 * One warp per (decode request, KV head): lane i follows token i's
 * ascending row; each step takes the warp minimum, records which tokens
 * hold it (a ballot = the membership mask) and advances those lanes.
 */
#include "cu_plan.cuh"

#define UNION_WARPS 4

__global__ void __launch_bounds__(UNION_WARPS * 32) cu_union_kernel(cu_layer L)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int64_t total = (int64_t)L.m.hdr->n_dec * L.Hkv;
    for (int64_t w = (int64_t)blockIdx.x * UNION_WARPS + warp; w < total;
         w += (int64_t)gridDim.x * UNION_WARPS) {
        const int32_t k = (int32_t)(w / L.Hkv);
        const int32_t g = (int32_t)(w - (int64_t)k * L.Hkv);
        const int32_t r = L.m.dec_req[k];
        const int32_t ql = L.m.q_len[r];
        const int32_t t0 = L.m.q_start[r];
        const int32_t *row = L.sel + ((int64_t)(t0 + lane) * L.Hkv + g) * L.W;
        int32_t *uid = L.uids + w * L.cap_union;
        uint32_t *umk = L.umask + w * L.cap_union;
        int32_t ptr = 0, count = 0;
        int32_t v = INT32_MAX;
        if (lane < ql) {
            const int32_t x = row[0];
            v = x >= 0 ? x : INT32_MAX;
        }
        for (;;) {
            const int32_t m = cu_warp_min_int(v);
            if (m == INT32_MAX)
                break;
            const uint32_t holders = __ballot_sync(0xffffffffu, v == m);
            if (lane == 0 && count < L.cap_union) {
                uid[count] = m;
                umk[count] = holders;
            }
            ++count;
            if (v == m) {
                ++ptr;
                v = INT32_MAX;
                if (ptr < L.W) {
                    const int32_t x = row[ptr];
                    if (x >= 0)
                        v = x;
                }
            }
        }
        if (lane == 0)
            L.ucnt[w] = min(count, L.cap_union);
    }
}

void cu_launch_union(const cu_layer *L, const cu_plan_state *st, cudaStream_t s)
{
    cu_union_kernel<<<st->grid_union, UNION_WARPS * 32, 0, s>>>(*L);
}
