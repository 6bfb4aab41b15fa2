/*
 * Small decode steps in one kernel: the cache write, the index scan, the
 * selection, the attention and the merge of a layer, for steps of few token
 * rows (docs/CUDA.md, "Small steps in one kernel").
 *
 * The chain of separate kernels pays a hand-over of 1-4 us between each
 * pair of stages, more than the work of a small step.  Here one persistent
 * grid (at most one wave, launched cooperatively so that every CTA is
 * resident) walks one list of tasks in stage order:
 *
 *   cache write   token rows (kernels/prologue/prologue_row.cuh)
 *   index scan    ranges of the decode requests' blocks laid end to end
 *                 (kernels/indexer/indexer_decode_mma_sm80.cuh)
 *   selection     one (decode row, unit) per task, the whole CTA on the row
 *                 (kernels/select/select_roles.cuh)
 *   attention     the plan's split work items
 *                 (kernels/attention/attention_decode_mma_sm80.cuh); the
 *                 split that completes an item last merges its rows
 *                 (kernels/merge/merge_row.cuh)
 *
 * CTA b takes tasks b, b + G, b + 2G, ... (G CTAs).  A task waits only for
 * counters that tasks of lower numbers raise (rows written, blocks scored
 * per request, rows selected per request and unit), and every CTA is
 * resident, so every wait ends: the CTA holding the lowest unfinished task
 * never waits.  Counters are raised after a CTA barrier and a device fence
 * by one thread, and read by one thread with acquire loads before a CTA
 * barrier.  The last CTA to finish puts the step's counters back to 0 for
 * the next launch (graph replays included); the merge counters are put
 * back by the split that merges.
 */
#include "cuda/kernels/prologue/prologue_row.cuh"
#include "cuda/kernels/indexer/indexer_decode_mma_sm80.cuh"
#include "cuda/kernels/select/select_roles.cuh"
#include "cuda/kernels/attention/attention_decode_mma_sm80.cuh"
#include "cuda/kernels/merge/merge_row.cuh"

#define FUSED_THREADS 128
static_assert(FUSED_THREADS == IDX_MMA_THREADS && FUSED_THREADS == ATT_MMA_THREADS &&
                  FUSED_THREADS == SEL_WARPS * 32,
              "the stages' device code is written for CTAs of this size");
/* Token rows of one cache-write task. */
#define FUSED_WRITE_ROWS 2

__device__ __forceinline__ int32_t cu_fused_load_acquire(const int32_t *p)
{
    int32_t v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* Until *ctr reaches target (one thread polls; the barrier passes what it
 * acquired on to the CTA). */
__device__ __forceinline__ void cu_fused_wait(const int32_t *ctr, int32_t target)
{
    if (threadIdx.x == 0)
        while (cu_fused_load_acquire(ctr) < target)
            __nanosleep(32);
    __syncthreads();
}

/* Publishes the CTA's writes, then adds v to *ctr. */
__device__ __forceinline__ void cu_fused_raise(int32_t *ctr, int32_t v)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(ctr, v);
    }
}

/* Index scan of blocks [gb0, gb1): waits for the step's rows when a block
 * of the range holds a new position, then raises each request's count. */
template <typename Tag>
__device__ __noinline__ void cu_fused_scan(const cu_fused_params &p, unsigned char *smem,
                                           int32_t gb0, int32_t gb1, int32_t ntok)
{
    const cu_meta &mt = p.idx.meta;
    const int32_t n_dec = mt.hdr->n_dec;
    const int32_t k0 = cu_dec_of_block(mt.dec_blk0, n_dec, gb0);
    const int32_t k1 = cu_dec_of_block(mt.dec_blk0, n_dec, gb1 - 1);
    bool fresh = false;
    for (int32_t k = k0; k <= k1; ++k) {
        const cu_dec_info di = mt.dec_info[k];
        const int32_t last = min(gb1, di.blk1) - 1 - di.blk0; /* last block of k in the range */
        fresh |= (int64_t)(last + 1) * p.idx.block_size > di.kl - di.ql;
    }
    if (fresh)
        cu_fused_wait(p.written, ntok);
    cu_idx_mma_range<Tag>(p.idx, smem, gb0, gb1);
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        for (int32_t k = k0; k <= k1; ++k) {
            const cu_dec_info di = mt.dec_info[k];
            atomicAdd(p.scored + k, min(gb1, di.blk1) - max(gb0, di.blk0));
        }
    }
}

/* Selection row w (decode row w / units, unit w % units). */
__device__ __noinline__ void cu_fused_select(const cu_fused_params &p, unsigned char *smem,
                                             int32_t w)
{
    const int32_t units = p.sel.num_units;
    const int32_t d = w / units, u = w - d * units;
    const int32_t k = p.sel.meta.dec_row[d].slot;
    const cu_dec_info di = p.sel.meta.dec_info[k];
    if (di.blk1 > di.blk0)
        cu_fused_wait(p.scored + k, di.blk1 - di.blk0);
    uint32_t *words = (uint32_t *)smem;
    cu_select_decode_row(p.sel, d, u, words, true, cu_sel_grp_of(p.sel, words), false);
    cu_fused_raise(p.selected + (int64_t)k * units + u, 1);
}

/* Attention item ii; the split that completes a split item merges it. */
template <typename Tag>
__device__ __noinline__ void cu_fused_attend(const cu_fused_params &p, unsigned char *smem,
                                             int32_t ii, int32_t ntok)
{
    __shared__ int32_t merges;
    const cu_att_item it = p.att.meta.att[p.att.kind][ii];
    cu_fused_wait(p.written, ntok);
    /* A request of at most K blocks selects them all: its keys need not
     * wait for the selection. */
    const bool every_block = p.att.sparse && it.kl <= (int64_t)p.att.topk_blocks * p.att.block_size;
    if (p.att.sparse && !every_block) {
        const int32_t u = it.group / p.sel.kv_heads_per_unit;
        cu_fused_wait(p.selected + (int64_t)it.dec * p.sel.num_units + u, it.ql);
    }
    cu_att_item_any<Tag>(p.att, smem, it, every_block);
    if (it.nsplit <= 1)
        return;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        const int32_t done = atomicAdd(p.merged + it.part_base, 1) + 1;
        merges = done == it.nsplit;
        if (merges) {
            __threadfence(); /* the other splits' rows, before this CTA reads them */
            p.merged[it.part_base] = 0;
        }
    }
    __syncthreads();
    if (!merges)
        return;
    cu_merge_item mi;
    mi.dec = it.dec;
    mi.group = it.group;
    mi.row0 = it.row0;
    mi.nrows = it.nrows;
    mi.nsplit = it.nsplit;
    mi.part_base = it.part_base;
    mi.t0 = it.t0;
    mi.pad1 = 0;
    for (int32_t rl = threadIdx.x >> 5; rl < it.nrows; rl += FUSED_THREADS / 32)
        cu_merge_row(p.att, mi, rl);
}

/* The task counts of the step, in stage order, and the CTA's next task:
 * kept in shared memory, so that no register of the task loop lives across
 * the stages' calls (the attention's code alone takes 250 registers). */
struct cu_fused_tasks {
    int32_t n_write, n_scan, n_sel, n_att, blocks, ntok, units, next;
};

template <typename Tag>
__global__ void __launch_bounds__(FUSED_THREADS, 1)
    cu_fused_kernel(const __grid_constant__ cu_fused_params p)
{
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ cu_fused_tasks tk;
    if (threadIdx.x == 0) {
        const cu_step_hdr *hdr = p.att.meta.hdr;
        tk.ntok = hdr->num_tokens;
        tk.units = p.att.sparse ? p.sel.num_units : 0;
        tk.n_write = (tk.ntok + FUSED_WRITE_ROWS - 1) / FUSED_WRITE_ROWS;
        tk.blocks = p.att.sparse ? hdr->total_dec_blocks : 0;
        tk.n_scan = min(tk.blocks, (int32_t)gridDim.x);
        tk.n_sel = hdr->n_dec_rows * tk.units;
        tk.n_att = hdr->n_att[p.att.kind];
        tk.next = blockIdx.x;
    }
    __syncthreads();
    while (tk.next < tk.n_write + tk.n_scan + tk.n_sel + tk.n_att) {
        int32_t x = tk.next;
        if (x < tk.n_write) {
            const int32_t t1 = min(tk.ntok, (x + 1) * FUSED_WRITE_ROWS);
            for (int32_t t = x * FUSED_WRITE_ROWS; t < t1; ++t)
                cu_prologue_token(p.pro, t, p.pro.tok_info[t]);
            cu_fused_raise(p.written, t1 - x * FUSED_WRITE_ROWS);
        } else if ((x -= tk.n_write) < tk.n_scan) {
            cu_fused_scan<Tag>(p, smem, (int32_t)((int64_t)tk.blocks * x / tk.n_scan),
                               (int32_t)((int64_t)tk.blocks * (x + 1) / tk.n_scan), tk.ntok);
        } else if ((x -= tk.n_scan) < tk.n_sel) {
            cu_fused_select(p, smem, x);
        } else {
            cu_fused_attend<Tag>(p, smem, x - tk.n_sel, tk.ntok);
        }
        __syncthreads(); /* the next task reuses the shared memory */
        if (threadIdx.x == 0)
            tk.next += gridDim.x;
        __syncthreads();
    }
    /* The last CTA out puts the step's counters back to 0. */
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(p.exits, 1) == (int32_t)gridDim.x - 1) {
            __threadfence();
            *p.written = 0;
            const int32_t n_dec = p.att.meta.hdr->n_dec;
            for (int32_t k = 0; k < n_dec; ++k) {
                p.scored[k] = 0;
                for (int32_t u = 0; u < tk.units; ++u)
                    p.selected[(int64_t)k * tk.units + u] = 0;
            }
            *p.exits = 0;
        }
    }
}

size_t cu_fused_smem(size_t select_smem)
{
    size_t b = IDX_MMA_SMEM_BYTES > ATT_MMA_SMEM_BYTES ? IDX_MMA_SMEM_BYTES : ATT_MMA_SMEM_BYTES;
    return select_smem > b ? select_smem : b;
}

cudaError_t cu_fused_setup(int num_sms, size_t smem, int *grid)
{
    cudaError_t e = cu_allow_smem(smem, cu_fused_kernel<cu_bf16_tag>, cu_fused_kernel<cu_f16_tag>);
    if (e != cudaSuccess)
        return e;
    int occ = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, cu_fused_kernel<cu_bf16_tag>,
                                                      FUSED_THREADS, smem);
    if (e != cudaSuccess)
        return e;
    if (occ < 1)
        return cudaErrorInvalidConfiguration;
    *grid = num_sms * (occ < 2 ? occ : 2);
    return cudaSuccess;
}

void cu_launch_fused(const cu_fused_params *p, const cu_plan_state *st, cudaStream_t s)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)st->grid_fused);
    cfg.blockDim = dim3(FUSED_THREADS);
    cfg.dynamicSmemBytes = st->fused_smem;
    cfg.stream = s;
    /* Cooperative: the launch fails rather than leave a CTA waiting for one
     * that cannot become resident. */
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (p->att.act_dtype == MSA_DTYPE_BF16)
        cudaLaunchKernelEx(&cfg, cu_fused_kernel<cu_bf16_tag>, *p);
    else
        cudaLaunchKernelEx(&cfg, cu_fused_kernel<cu_f16_tag>, *p);
}
