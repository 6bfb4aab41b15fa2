/*
 * Decode indexer, portable path (any element type, any Di and B): block
 * scores of every decode token and index head, written to the plan's score
 * workspace for the selection kernel.
 *
 * The blocks of all decode requests with more than K blocks (the others
 * select every block: nothing to score, cu_sched_fill) are laid end to end
 * and each CTA takes an equal contiguous share, so one long request still
 * spreads over the whole GPU.  Inside a block, one warp per query column
 * (token, index head).
 */
#include "cuda/kernels/indexer/block_score_simt.cuh"
#include "cuda/arch/launch.cuh"

#define IDX_SIMT_THREADS 128

__global__ void __launch_bounds__(IDX_SIMT_THREADS, 1) cu_indexer_simt_kernel(cu_layer L)
{
    cu_pdl_wait();
    cu_pdl_trigger();
    const cu_step_hdr *hdr = L.m.hdr;
    const int32_t n_dec = hdr->n_dec;
    const int64_t total = hdr->total_dec_blocks;
    if (n_dec == 0 || total == 0)
        return;
    const int32_t gb_begin = (int32_t)(total * blockIdx.x / gridDim.x);
    const int32_t gb_end = (int32_t)(total * (blockIdx.x + 1) / gridDim.x);
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;

    for (int32_t gb = gb_begin; gb < gb_end; ++gb) {
        const int32_t k = cu_dec_of_block(L.m.dec_blk0, n_dec, gb);
        const int32_t n = gb - L.m.dec_blk0[k];
        const int32_t r = L.m.dec_req[k];
        const int32_t ql = L.m.q_len[r];
        const int32_t base = L.m.kv_len[r] - ql;
        const int32_t t0 = L.m.q_start[r];
        const int32_t d0 = L.m.dec_row0[k];
        const int32_t nq = ql * L.Hi;
        for (int32_t col = warp; col < nq; col += nwarps) {
            const int32_t i = col / L.Hi;
            const int32_t h = col - i * L.Hi;
            const int64_t qoff = ((int64_t)(t0 + i) * L.Hi + h) * L.Di;
            const float score = cu_warp_block_score(L, r, qoff, n, base + i);
            if ((threadIdx.x & 31) == 0)
                L.scores[((int64_t)(d0 + i) * L.Hi + h) * L.cap_blocks + n] = score;
        }
    }
}

void cu_launch_indexer_simt(const cu_layer *L, const cu_plan_state *st, cudaStream_t s)
{
    cu_launch(cu_indexer_simt_kernel, st->sz.grid_idx, IDX_SIMT_THREADS, 0, s, st->pdl, *L);
}
