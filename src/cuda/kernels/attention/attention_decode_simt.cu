/*
 * Decode attention, portable path (any element type, head dim <= 512):
 * one warp per query row of a work item, online softmax over the item's
 * range of the key stream (key_stream.cuh), fp32 throughout; the result goes
 * to the output (one split) or to a partial row for the merge.
 */
#include "cuda/kernels/attention/rows_simt.cuh"
#include "cuda/arch/launch.cuh"

#define ATT_SIMT_WARPS 4

__global__ void __launch_bounds__(ATT_SIMT_WARPS * 32)
    cu_attn_decode_simt_kernel(cu_layer L, cu_attn A)
{
    cu_pdl_wait();
    cu_pdl_trigger();
    const int warp = threadIdx.x >> 5;
    const int32_t n_items = L.m.hdr->n_att[A.kind];
    const cu_att_item *items = L.m.att[A.kind];
    for (int32_t ii = blockIdx.x; ii < n_items; ii += gridDim.x) {
        const cu_att_item it = items[ii];
        const cu_stream s = cu_stream_of(L, A, it);
        for (int32_t rl = warp; rl < it.nrows; rl += ATT_SIMT_WARPS) {
            const int32_t row = it.row0 + rl;
            const int32_t i = row / A.g;
            const int32_t hq = it.group * A.g + (row - i * A.g);
            const int64_t qrow = ((int64_t)(s.t0 + i) * A.hq_total + hq);
            cu_row_state st;
            cu_row_init(st, A, qrow * A.d);
            for (int32_t u = s.u0; u < s.u1; ++u) {
                int32_t pos;
                const uint32_t use = cu_stream_key(s, u, &pos);
                if ((use >> i) & 1u)
                    cu_row_add(st, A, cu_plane_off(L, A, s.r, it.group, pos));
            }
            if (it.nsplit == 1)
                cu_row_write_out(st, A, qrow * A.d, qrow);
            else
                cu_row_write_part(st, A,
                                  L.part +
                                      ((int64_t)it.part_base + (int64_t)it.split * it.nrows + rl) *
                                          L.part_stride);
        }
    }
}

void cu_launch_attn_decode_simt(const cu_layer *L, const cu_plan_state *st, const cu_attn *A,
                                cudaStream_t s)
{
    cu_launch(cu_attn_decode_simt_kernel, st->sz.grid_att, ATT_SIMT_WARPS * 32, 0, s, st->pdl, *L,
              *A);
}
