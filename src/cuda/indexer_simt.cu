/*
 * Decode indexer, portable path (any element type, any Di and B): block
 * scores of every decode token and index head, written to the plan's score
 * workspace for the selection kernel.
 *
 * The blocks of all decode requests are laid end to end and each CTA takes
 * an equal contiguous share, so one long request still spreads over the
 * whole GPU.  Inside a block, one warp per query column (token, index head);
 * lanes split the keys and each computes whole dot products in fp32 FMA
 * from the stored operand values (exact products, no re-rounding).
 */
#include "cu_plan.cuh"

#define CU_IDX_SIMT_THREADS 128

__global__ void __launch_bounds__(CU_IDX_SIMT_THREADS) cu_indexer_simt_kernel(cu_layer L)
{
    const cu_step_hdr *hdr = L.m.hdr;
    const int32_t n_dec = hdr->n_dec;
    const int64_t total = hdr->total_dec_blocks;
    if (n_dec == 0 || total == 0)
        return;
    const int32_t gb_begin = (int32_t)(total * blockIdx.x / gridDim.x);
    const int32_t gb_end = (int32_t)(total * (blockIdx.x + 1) / gridDim.x);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;

    for (int32_t gb = gb_begin; gb < gb_end; ++gb) {
        const int32_t k = cu_dec_of_block(L.m.dec_blk0, n_dec, gb);
        const int32_t n = gb - L.m.dec_blk0[k];
        const int32_t r = L.m.dec_req[k];
        const int32_t ql = L.m.q_len[r];
        const int32_t kl = L.m.kv_len[r];
        const int32_t base = kl - ql;
        const int32_t t0 = L.m.q_start[r];
        const int32_t d0 = L.m.dec_row0[k];
        const int32_t nq = ql * L.Hi;
        for (int32_t col = warp; col < nq; col += nwarps) {
            const int32_t i = col / L.Hi;
            const int32_t h = col - i * L.Hi;
            const int32_t p = base + i;
            const int64_t qoff = ((int64_t)(t0 + i) * L.Hi + h) * L.Di;
            const int32_t j0 = n * L.B;
            const int32_t j1 = min(j0 + L.B, p + 1);
            float m = -INFINITY, l = 0.0f;
            for (int32_t j = j0 + lane; j < j1; j += 32) {
                const int32_t page = cu_page_of(L.m.page_table, L.cap_pages, r, j, L.logP);
                const int64_t koff = ((int64_t)page * L.P + (j & (L.P - 1))) * L.Di;
                float s = 0.0f;
                for (int32_t d = 0; d < L.Di; ++d)
                    s = fmaf(cu_load(L.iq, L.act, qoff + d), cu_load(L.ikp, L.idx_dt, koff + d), s);
                if (L.score_lse)
                    cu_lse_merge(m, l, L.iscale * s, 1.0f);
                else
                    m = fmaxf(m, s);
            }
            /* Combine the lanes. */
            for (int o = 16; o > 0; o >>= 1) {
                float m2 = __shfl_xor_sync(0xffffffffu, m, o);
                float l2 = __shfl_xor_sync(0xffffffffu, l, o);
                if (L.score_lse)
                    cu_lse_merge(m, l, m2, l2);
                else
                    m = fmaxf(m, m2);
            }
            if (lane == 0) {
                float score = m;
                if (L.score_lse)
                    score = (m == -INFINITY) ? -INFINITY : m + logf(l);
                L.scores[((int64_t)(d0 + i) * L.Hi + h) * L.cap_blocks + n] = score;
            }
        }
    }
}

void cu_launch_indexer_simt(const cu_layer *L, const cu_plan_state *st, cudaStream_t s);
void cu_launch_indexer_simt(const cu_layer *L, const cu_plan_state *st, cudaStream_t s)
{
    cu_indexer_simt_kernel<<<st->grid_idx, CU_IDX_SIMT_THREADS, 0, s>>>(*L);
}
