/*
 * The lean decode step: a whole layer in one kernel for steps of few
 * one-token requests with short contexts, where the decode chain's five
 * kernels cost more in hand-overs than in work (docs/CUDA.md, "The lean
 * decode step").
 *
 * The plan takes it where every request keeps every block (at most K
 * blocks of 128 keys: nothing to score or select) and the step's
 * (request, KV head, block) tasks fit the grid one per CTA
 * (cu_lean_plan_tasks).  One CTA per SM, eight warps; CTA i:
 *
 *   1. writes token row G - 1 - i (and every G-th after it): the cache
 *      writes and padding outputs of the prologue (prologue_row.cuh) and,
 *      in a sparse layer, the request's rows of selected ids (all its
 *      blocks, ascending);
 *   2. attends task i: the 16 query heads of one KV head of one token
 *      against one block of 128 keys, K and V copied with cp.async (64 KB),
 *      the keys split over the eight warps (16 each, one m16 tile: S =
 *      Q K^T and O += P V on mma.sync), the warps' states merged in shared
 *      memory.  The new token's own K and V rows come from the call's
 *      tensors, so nothing waits for the cache write;
 *   3. writes the output if the (request, KV head) has one block, else a
 *      normalized partial row and its LSE; the CTA whose count completes
 *      the (request, KV head) merges its partials into the output and puts
 *      the count back to 0 (a captured graph replays from zeros).
 *
 * No CTA waits for another: the only hand-over is the merge count.
 */
#include "cuda/kernels/lean/lean_decode.cuh"
#include "cuda/kernels/prologue/prologue_row.cuh"
#include "cuda/kernels/attention/rows_mma.cuh"
#include "cuda/arch/mma_sm80.cuh"
#include "cuda/arch/launch.cuh"
#include "cuda/common/timeline.cuh"

#define LEAN_THREADS 256
#define LEAN_WARPS 8
#define LEAN_B 128                 /* keys of a block */
#define LEAN_TILE (LEAN_B * 256)   /* one block's K (or V) rows */
#define LEAN_SLOTS (2 * LEAN_TILE) /* offset of the warps' saved states */
#define LEAN_SLOT_BYTES (CU_ROWS_SLOT_FLOATS * 4)
#define LEAN_SMALL (LEAN_SLOTS + LEAN_WARPS * LEAN_SLOT_BYTES)
/* The merge's per-row LSEs (16 rows, a partial per block) and one word. */
#define LEAN_SMEM_BYTES (LEAN_SMALL + 16 * CU_LEAN_MAX_BLOCKS * 4 + 16)

struct cu_lean_swz {
    __device__ __forceinline__ uint32_t operator()(int row, int chunk) const
    {
        return cu_swz(row, chunk);
    }
};

/* Where this thread's row of a 128-row copy comes from: positions pos0 ..
 * pos0 + 127 of request r in a plane of KV head `head`, two threads a row.
 * Rows at or past kl are zero-filled (no bytes read); the row at kl - 1
 * comes from `fresh` when it is not NULL (the step's own row). */
typedef struct cu_lean_src {
    const unsigned char *at;
    int nbytes;
} cu_lean_src;

__device__ __forceinline__ cu_lean_src cu_lean_row_src(const cu_lean_params &p, const void *plane,
                                                       const msa_plane_strides &s, int32_t head,
                                                       int32_t r, int32_t pos0, int32_t kl,
                                                       const void *fresh)
{
    const int32_t pos = pos0 + (int32_t)(threadIdx.x >> 1);
    cu_lean_src x;
    x.at = (const unsigned char *)plane;
    x.nbytes = 0;
    if (pos < kl) {
        x.nbytes = 16;
        if (fresh && pos == kl - 1) {
            x.at = (const unsigned char *)fresh;
        } else {
            const int32_t page =
                cu_page_of(p.att.meta.page_table, p.att.cap_pages, r, pos, p.att.log_page_size);
            x.at = cu_plane_row16(plane, s, page, head, pos & (p.att.page_size - 1));
        }
    }
    return x;
}

/* The thread's eight 16-byte pieces of its row into a swizzled tile. */
__device__ __forceinline__ void cu_lean_copy(uint32_t dst, const cu_lean_src &x)
{
    const int row = threadIdx.x >> 1;
    const int half = threadIdx.x & 1;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int chunk = half * 8 + i;
        cu_cp_async16(dst + cu_swz(row, chunk), x.at + (x.nbytes ? chunk * 16 : 0), x.nbytes);
    }
}

/* The rows of (slot k, KV head h): output row q0 + row, LSE likewise. */
template <typename Tag>
__device__ __forceinline__ void cu_lean_store(const cu_lean_params &p, int64_t q0, int row, int d0,
                                              const float (&v)[8], float lse)
{
    uint32_t *op = (uint32_t *)p.att.out + (((q0 + row) * 128 + d0) >> 1);
#pragma unroll
    for (int e = 0; e < 4; ++e)
        op[e] = cu_pack2(v[2 * e], v[2 * e + 1], Tag());
    if (p.att.lse && d0 == 0)
        p.att.lse[q0 + row] = lse;
}

/* Task i (< the step's tasks): its decode slot k (facts di, di.nblk
 * blocks), KV head h and block j. */
typedef struct cu_lean_task {
    int32_t k, h, j, i0; /* i0: the (slot, KV head)'s first task */
    cu_dec_info di;
} cu_lean_task;

/* Finds task i by walking the slots; false when the step has fewer. */
__device__ __forceinline__ bool cu_lean_task_at(const cu_lean_params &p, int32_t i, cu_lean_task &x)
{
    const int32_t n_dec = p.att.meta.hdr->n_dec;
    int32_t g0 = 0;
    for (int32_t k = 0; k < n_dec; ++k) {
        const cu_dec_info di = p.att.meta.dec_info[k];
        const int32_t all = di.nblk * p.att.kv_heads;
        if (i < g0 + all) {
            x.k = k;
            x.di = di;
            x.h = (i - g0) / di.nblk;
            x.i0 = g0 + x.h * di.nblk;
            x.j = i - x.i0;
            return true;
        }
        g0 += all;
    }
    return false;
}

/* The token rows of this CTA (phase 1). */
__device__ __forceinline__ void cu_lean_token_rows(const cu_lean_params &p)
{
    const int32_t G = gridDim.x;
    const int32_t ntok = p.pro.hdr->num_tokens;
    for (int32_t t = G - 1 - (int32_t)blockIdx.x; t < ntok; t += G) {
        const cu_tok_info ti = p.pro.tok_info[t];
        cu_prologue_token(p.pro, t, ti);
        /* A sparse layer's request keeps all its blocks: ids 0 .. nblk-1
         * in each KV head's row, then -1. */
        if (ti.r >= 0 && p.pro.sparse && p.pro.topk_ids) {
            const int32_t nblk = ti.pos / LEAN_B + 1;
            const int32_t W = p.pro.topk_width;
            const int64_t off = (int64_t)t * p.pro.num_kv_heads * W;
            for (int32_t e = threadIdx.x; e < p.pro.num_kv_heads * W; e += LEAN_THREADS) {
                const int32_t j = e % W;
                p.pro.topk_ids[off + e] = j < nblk ? j : -1;
            }
        }
    }
}

template <typename Tag>
__global__ void __launch_bounds__(LEAN_THREADS, 1) cu_lean_kernel(cu_lean_params p)
{
    extern __shared__ __align__(128) unsigned char smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *slots = (float *)(smem + LEAN_SLOTS);
    float *lses = (float *)(smem + LEAN_SMALL);
    int32_t *bcast = (int32_t *)(lses + 16 * CU_LEAN_MAX_BLOCKS);
    if (threadIdx.x == 0)
        CU_TL_MARK(p.att, CU_TL_ATTN, CU_TL_ENTRY);

    /* Step 2's copies go out before step 1's rows: they are the step's
     * longest wait. */
    cu_lean_task x;
    const bool busy = cu_lean_task_at(p, blockIdx.x, x);
    const uint32_t ka = cu_smem_addr(smem), va = ka + LEAN_TILE;
    if (busy) {
        const int64_t fresh = ((int64_t)x.di.t0 * p.att.kv_heads + x.h) * 128;
        const uint16_t *kf = p.new_rows_from_input ? (const uint16_t *)p.pro.k_rows + fresh : NULL;
        const uint16_t *vf = p.new_rows_from_input ? (const uint16_t *)p.pro.v_rows + fresh : NULL;
        cu_lean_copy(ka, cu_lean_row_src(p, p.att.k_plane, p.att.k_strides, x.h, x.di.r,
                                         x.j * LEAN_B, x.di.kl, kf));
        cu_lean_copy(va, cu_lean_row_src(p, p.att.v_plane, p.att.v_strides, x.h, x.di.r,
                                         x.j * LEAN_B, x.di.kl, vf));
        cu_cp_async_commit();
    }
    cu_lean_token_rows(p);
    if (!busy)
        return;
    if (threadIdx.x == 0)
        CU_TL_MARK(p.att, CU_TL_ATTN, CU_TL_ISSUED);

    /* The query fragments meanwhile, then the block. */
    const int64_t q_lo = (int64_t)x.di.t0 * p.att.q_heads + x.h * 16 + (lane >> 2);
    uint32_t qa[8][4];
    cu_rows_load_q(p.att.q, q_lo, q_lo + 8, true, true, qa);
    cu_cp_async_wait<0>();
    __syncthreads();
    if (threadIdx.x == 0)
        CU_TL_MARK(p.att, CU_TL_ATTN, CU_TL_FIRST);
    float o[16][4], m_lo, m_hi, l_lo, l_hi;
    cu_rows_clear(o, m_lo, m_hi, l_lo, l_hi);
    float sc[2][4];
    cu_rows_qk<Tag, 2, cu_lean_swz>(ka, warp * 16, qa, sc);
    /* Keys at or past kl (zero-filled rows of the last block) are out. */
    const float sl2 = p.att.scale * CU_LOG2E;
    const int32_t key0 = x.j * LEAN_B + warp * 16 + 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const bool ok = key0 + n * 8 + e < x.di.kl;
            sc[n][e] = ok ? sc[n][e] * sl2 : -INFINITY;
            sc[n][2 + e] = ok ? sc[n][2 + e] * sl2 : -INFINITY;
        }
    cu_rows_softmax<2>(sc, o, m_lo, m_hi, l_lo, l_hi);
    cu_rows_pv<Tag, 16, cu_lean_swz>(va, warp * 16, sc, o);

    /* The warps' states merged: thread = row (of 16) and 8 dims. */
    cu_rows_sum_quads(l_lo, l_hi);
    cu_rows_save(slots + warp * CU_ROWS_SLOT_FLOATS, o, m_lo, m_hi, l_lo, l_hi);
    __syncthreads();
    const int row = threadIdx.x >> 4, d0 = (threadIdx.x & 15) * 8;
    float M = -INFINITY;
    for (int w = 0; w < LEAN_WARPS; ++w)
        M = fmaxf(M, slots[w * CU_ROWS_SLOT_FLOATS + 2048 + row]);
    const float R = M == -INFINITY ? 0.0f : M;
    float L = 0.0f, v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e)
        v[e] = 0.0f;
    for (int w = 0; w < LEAN_WARPS; ++w) {
        const float *sl = slots + w * CU_ROWS_SLOT_FLOATS;
        const float a = exp2f(sl[2048 + row] - R);
        L += a * sl[2064 + row];
#pragma unroll
        for (int e = 0; e < 8; ++e)
            v[e] += a * sl[row * 128 + d0 + e];
    }
    const float inv = cu_rows_inv(L);
#pragma unroll
    for (int e = 0; e < 8; ++e)
        v[e] *= inv;
    const int64_t q0 = (int64_t)x.di.t0 * p.att.q_heads + (int64_t)x.h * 16;
    const int32_t nseg = x.di.nblk;
    if (nseg == 1) {
        cu_lean_store<Tag>(p, q0, row, d0, v, cu_rows_lse(M, L));
        return;
    }
    /* A partial row at its task's slot; the CTA that completes the count
     * of the (slot, KV head) merges them. */
    float *part = p.partials + ((int64_t)blockIdx.x * 16 + row) * CU_LEAN_PART_STRIDE;
    *(float4 *)&part[d0] = make_float4(v[0], v[1], v[2], v[3]);
    *(float4 *)&part[d0 + 4] = make_float4(v[4], v[5], v[6], v[7]);
    if (d0 == 0)
        part[128] = cu_rows_lse(M, L);
    __syncthreads();
    int32_t *cnt = &p.merge_done[(int64_t)x.k * p.att.kv_heads + x.h];
    if (threadIdx.x == 0) {
        __threadfence();
        const int32_t before = atomicAdd(cnt, 1);
        const int last = before == nseg - 1;
        if (last) {
            *cnt = 0;
            __threadfence();
        }
        bcast[0] = last;
    }
    __syncthreads();
    if (!bcast[0])
        return;
    /* The merge: every block's rows weighted by exp(LSE - max); the LSEs
     * first, through shared memory, so that each pass keeps several
     * loads in flight. */
    const float *parts = p.partials + (int64_t)x.i0 * 16 * CU_LEAN_PART_STRIDE;
    float *ls = lses + row * CU_LEAN_MAX_BLOCKS;
    for (int32_t q = threadIdx.x & 15; q < nseg; q += 16)
        ls[q] = __ldcg(&parts[((int64_t)q * 16 + row) * CU_LEAN_PART_STRIDE + 128]);
    __syncthreads();
    float Ms = -INFINITY;
    for (int32_t q = 0; q < nseg; ++q)
        Ms = fmaxf(Ms, ls[q]);
    const float Rs = Ms == -INFINITY ? 0.0f : Ms;
    float W = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e)
        v[e] = 0.0f;
    for (int32_t qb = 0; qb < nseg; qb += 8) { /* eight blocks' rows in flight */
        float4 xa[8], xb[8];
        float a[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const bool on = qb + u < nseg;
            const float *pr = parts + ((int64_t)(on ? qb + u : 0) * 16 + row) * CU_LEAN_PART_STRIDE;
            xa[u] = on ? __ldcg((const float4 *)&pr[d0]) : make_float4(0.f, 0.f, 0.f, 0.f);
            xb[u] = on ? __ldcg((const float4 *)&pr[d0 + 4]) : make_float4(0.f, 0.f, 0.f, 0.f);
            a[u] = on ? expf(ls[qb + u] - Rs) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            W += a[u];
            v[0] += a[u] * xa[u].x;
            v[1] += a[u] * xa[u].y;
            v[2] += a[u] * xa[u].z;
            v[3] += a[u] * xa[u].w;
            v[4] += a[u] * xb[u].x;
            v[5] += a[u] * xb[u].y;
            v[6] += a[u] * xb[u].z;
            v[7] += a[u] * xb[u].w;
        }
    }
    const float winv = W > 0.0f ? 1.0f / W : 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e)
        v[e] *= winv;
    cu_lean_store<Tag>(p, q0, row, d0, v, W > 0.0f ? Rs + logf(W) : -INFINITY);
    if (threadIdx.x == 0)
        CU_TL_MARK(p.att, CU_TL_ATTN, CU_TL_EXIT);
}

/* ---- host ---------------------------------------------------------------- */

/* The merge counts first (one word per slot and KV head), then the
 * partial rows (one task's 16 rows each) at a 16-byte boundary. */
static size_t cu_lean_words(int32_t tasks)
{
    return ((size_t)tasks + 3) / 4 * 4;
}

size_t cu_lean_ws_bytes(int32_t tasks)
{
    return cu_lean_words(tasks) * 4 + (size_t)tasks * 16 * CU_LEAN_PART_STRIDE * 4;
}

void cu_lean_ws_carve(void *base, int32_t tasks, cu_lean_params *p)
{
    p->merge_done = (int32_t *)base;
    p->partials = (float *)((int32_t *)base + cu_lean_words(tasks));
}

int32_t cu_lean_plan_tasks(const cu_sched_sizes *sz, const msa_model *m, int num_sms)
{
    const msa_model_config *cfg = &m->cfg;
    const int32_t slots = sz->cap_tok < sz->cap_req ? sz->cap_tok : sz->cap_req;
    const int32_t blocks = (sz->cap_kv + LEAN_B - 1) / LEAN_B;
    const int any_sparse = cu_sched_any_layer(m, 1, 0);
    if (sz->cap_q != 1 || cfg->block_size != LEAN_B || blocks > CU_LEAN_MAX_BLOCKS ||
        (any_sparse && blocks > cfg->topk_blocks))
        return 0;
    const int64_t tasks = (int64_t)slots * cfg->num_kv_heads * blocks;
    return tasks <= num_sms ? (int32_t)tasks : 0;
}

int cu_lean_fits(const msa_model *m, int32_t layer, const msa_cache_config *cc, msa_dtype act,
                 const char **why)
{
    const msa_model_config *cfg = &m->cfg;
    const int sparse = m->layer_sparse[layer] != 0;
    const char *no = NULL;
    if (sparse && m->layer_index_value[layer])
        no = "layer with an index-value pass";
    else if ((act != MSA_DTYPE_BF16 && act != MSA_DTYPE_FP16) || cc->kv_dtype != act ||
             (sparse && cc->index_dtype != act))
        no = "activations and planes not of one 16-bit type";
    else if (cfg->head_dim != 128)
        no = "head dim not 128";
    else if (m->group != 16)
        no = "not 16 query heads per KV head";
    if (no && why)
        *why = no;
    return no == NULL;
}

size_t cu_lean_smem(void)
{
    return LEAN_SMEM_BYTES;
}

cudaError_t cu_lean_setup(void)
{
    return cu_allow_smem(LEAN_SMEM_BYTES, cu_lean_kernel<cu_bf16_tag>, cu_lean_kernel<cu_f16_tag>);
}

/* The layer's only kernel: launched plainly, after the caller's work. */
void cu_launch_lean(const cu_lean_params *p, int grid, cudaStream_t s)
{
    if (p->att.act_dtype == MSA_DTYPE_BF16)
        cu_lean_kernel<cu_bf16_tag><<<grid, LEAN_THREADS, LEAN_SMEM_BYTES, s>>>(*p);
    else
        cu_lean_kernel<cu_f16_tag><<<grid, LEAN_THREADS, LEAN_SMEM_BYTES, s>>>(*p);
}
