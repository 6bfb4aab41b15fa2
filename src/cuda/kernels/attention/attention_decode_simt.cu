/*
 * Decode attention, portable path (any element type, head dim <= 512):
 * one warp per query row of a work item, online softmax over the item's
 * range of the key stream (key_stream.cuh), fp32 throughout; the result goes
 * to the output (one split) or to a partial row for the merge.
 */
#include "cuda/kernels/attention/rows_simt.cuh"
#include "cuda/arch/launch.cuh"

#define ATT_SIMT_WARPS 4

/* At least one CTA per SM, nothing more asked: without the bound ptxas
 * traded registers for occupancy on sm_90a (80 registers and 12 bytes of
 * spills); with it the kernel keeps every value in registers (96).  QUANT:
 * the variant for quantized planes, whose de-quantizing loads the other
 * one leaves out (116 registers against 155 with them, sm_90a). */
template <bool QUANT>
__global__ void __launch_bounds__(ATT_SIMT_WARPS * 32, 1)
    cu_attn_decode_simt_kernel(cu_attn_params params)
{
    cu_pdl_wait();
    cu_pdl_trigger();
    const int warp = threadIdx.x >> 5;
    const int32_t n_items = params.meta.hdr->n_att[params.kind];
    const cu_att_item *items = params.meta.att[params.kind];
    for (int32_t ii = blockIdx.x; ii < n_items; ii += gridDim.x) {
        const cu_att_item it = items[ii];
        const cu_stream s = cu_stream_of(params, it);
        for (int32_t rl = warp; rl < it.nrows; rl += ATT_SIMT_WARPS) {
            const int32_t row = it.row0 + rl;
            const int32_t i = row / params.group;
            const int32_t hq = it.group * params.group + (row - i * params.group);
            const int64_t qrow = ((int64_t)(s.t0 + i) * params.q_heads + hq);
            cu_row_state st;
            cu_row_init(st, params, qrow * params.head_dim);
            for (int32_t u = s.u0; u < s.u1; ++u) {
                int32_t pos;
                const uint32_t use = cu_stream_key(s, u, &pos);
                if ((use >> i) & 1u)
                    cu_row_add<QUANT>(st, params, cu_plane_off<QUANT>(params, s.r, it.group, pos));
            }
            if (it.nsplit == 1)
                cu_row_write_out(st, params, qrow * params.head_dim, qrow);
            else
                cu_row_write_part(st, params,
                                  params.partials +
                                      ((int64_t)it.part_base + (int64_t)it.split * it.nrows + rl) *
                                          params.partial_stride);
        }
    }
}

void cu_launch_attn_decode_simt(const cu_attn_params *params, const cu_plan_state *st,
                                cudaStream_t s)
{
    if (cu_is_quantized(params->kv_dtype))
        cu_launch(cu_attn_decode_simt_kernel<true>, st->sz.grid_att, ATT_SIMT_WARPS * 32, 0, s,
                  st->pdl, *params);
    else
        cu_launch(cu_attn_decode_simt_kernel<false>, st->sz.grid_att, ATT_SIMT_WARPS * 32, 0, s,
                  st->pdl, *params);
}
