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

__global__ void __launch_bounds__(IDX_SIMT_THREADS, 1)
    cu_indexer_simt_kernel(cu_indexer_params params)
{
    cu_pdl_wait();
    cu_pdl_trigger();
    const cu_step_hdr *hdr = params.meta.hdr;
    const int32_t n_dec = hdr->n_dec;
    const int64_t total = hdr->total_dec_blocks;
    if (n_dec == 0 || total == 0)
        return;
    const int32_t gb_begin = (int32_t)(total * blockIdx.x / gridDim.x);
    const int32_t gb_end = (int32_t)(total * (blockIdx.x + 1) / gridDim.x);
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;

    for (int32_t gb = gb_begin; gb < gb_end; ++gb) {
        const int32_t k = cu_dec_of_block(params.meta.dec_blk0, n_dec, gb);
        const int32_t n = gb - params.meta.dec_blk0[k];
        const int32_t r = params.meta.dec_req[k];
        const int32_t ql = params.meta.q_len[r];
        const int32_t base = params.meta.kv_len[r] - ql;
        const int32_t t0 = params.meta.q_start[r];
        const int32_t d0 = params.meta.dec_row0[k];
        const int32_t nq = ql * params.num_index_heads;
        for (int32_t col = warp; col < nq; col += nwarps) {
            const int32_t i = col / params.num_index_heads;
            const int32_t h = col - i * params.num_index_heads;
            const int64_t qoff =
                ((int64_t)(t0 + i) * params.num_index_heads + h) * params.index_dim;
            const float score = cu_warp_block_score(params, r, qoff, n, base + i);
            if ((threadIdx.x & 31) == 0)
                params.scores[((int64_t)(d0 + i) * params.num_index_heads + h) * params.cap_blocks +
                              n] = score;
        }
    }
}

void cu_launch_indexer_simt(const cu_indexer_params *params, const cu_plan_state *st,
                            cudaStream_t s)
{
    cu_launch(cu_indexer_simt_kernel, st->sz.grid_idx, IDX_SIMT_THREADS, 0, s, st->pdl, *params);
}
