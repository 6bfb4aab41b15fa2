/*
 * Prefill attention on tensor cores, portable path (mma.sync m16n8k16,
 * bf16/fp16 with fp32 accumulation; sm_80 and later, the fast path on
 * Hopper until a warpgroup version exists).  See the header for the work
 * decomposition and docs/PREFILL.md for the design.
 *
 * One CTA (8 warps) per work item: a tile of consecutive tokens of one
 * request, one KV head, one chunk of its query heads.  Warp w owns rows
 * 16w .. 16w + 15 of the tile (row = token x heads + head), so with 16
 * heads per KV head a warp is one token.  The key stream is:
 *   sparse  the union of the tile's tokens' selected blocks, built in
 *           shared memory by one warp merging the tokens' ascending rows
 *           (lane = token: min, ballot, advance), each union block with
 *           the bits of the tokens that selected it;
 *   dense   every key from 0 to the tile's last position.
 * 64-key tiles of K and V go through a 3-stage cp.async ring; each key
 * carries the bits of the tile's tokens that use it (selected block and
 * causal window: key position <= token position), applied as -inf before
 * the online softmax.  A warp none of whose rows use a tile's keys skips
 * it.  Q stays in registers, S = Q K^T and O += P V run on mma.sync, P
 * rounded to the 16-bit type for the second product (as the decode path).
 */
#include "cuda/kernels/attention/attention_prefill_mma_sm80.cuh"
#include "cuda/arch/mma_sm80.cuh"
#include "cuda/kernels/attention/rows_mma.cuh"
#include "cuda/arch/launch.cuh"

#include <string.h>

#define PFA_THREADS 256
#define PFA_WARPS (PFA_THREADS / 32)
#define PFA_STAGES 3
#define PFA_KEYS 64
#define PFA_TILE_BYTES (PFA_KEYS * 256)
#define PFA_STAGE_BYTES (2 * PFA_TILE_BYTES + PFA_KEYS * 4)
#define PFA_RING_BYTES (PFA_STAGES * PFA_STAGE_BYTES)
/* Shared memory the kernel may ask for: within every sm_80+ part's
 * opt-in limit (163 KB on the A100). */
#define PFA_SMEM_LIMIT (160 * 1024)

static_assert(PFA_WARPS * 16 == CU_PFA_ROWS, "one m16 row tile per warp");

/* The ring's tiles: rows of 256 bytes, cu_swz. */
struct cu_pfa_swz {
    __device__ __forceinline__ uint32_t operator()(int row, int chunk) const
    {
        return cu_swz(row, chunk);
    }
};

/* One work item as the CTA sees it. */
typedef struct cu_pfa_item {
    int32_t r, t0, ntok, pos0;
    int32_t g, h0, nh; /* KV head, first query head of the chunk, heads in it */
    int32_t kv_end;    /* last token's position + 1 */
    int32_t nkeys;     /* keys of the stream */
    int32_t nunion;    /* sparse: union blocks */
} cu_pfa_item;

/* Where the union lives in shared memory (after the ring). */
typedef struct cu_pfa_union {
    int32_t *stage; /* [tt * W] the tokens' selection rows */
    int32_t *blk;   /* [tt * W] union block ids, ascending */
    uint32_t *msk;  /* [tt * W] bit i: token i selected the block */
    int32_t *count; /* union blocks */
} cu_pfa_union;

/* Key u of the stream: its position, page (-1: no token uses it) and the
 * tokens that use it. */
typedef struct cu_pfa_loc {
    int32_t pos, page;
    uint32_t use;
} cu_pfa_loc;

__device__ __forceinline__ cu_pfa_loc cu_pfa_locate(const cu_pfa_params &p, const cu_pfa_item &it,
                                                    const cu_pfa_union &un, int32_t u)
{
    cu_pfa_loc b;
    b.pos = 0;
    b.page = -1;
    b.use = 0u;
    if (u >= it.nkeys)
        return b;
    uint32_t member = 0xffffffffu;
    if (p.sparse) {
        const int32_t bi = u / p.B;
        b.pos = un.blk[bi] * p.B + (u - bi * p.B);
        member = un.msk[bi];
    } else {
        b.pos = u;
    }
    if (b.pos < it.kv_end)
        b.use = member & cu_causal_bits(b.pos, it.pos0, it.ntok);
    if (b.use)
        b.page = cu_page_of(p.page_table, p.cap_pages, it.r, b.pos, p.logP);
    return b;
}

/* Copies of one key row (K and V, a quarter each per thread) into a
 * stage, and its token mask. */
__device__ __forceinline__ void cu_pfa_issue(const cu_pfa_params &p, const cu_pfa_item &it,
                                             unsigned char *smem, const cu_pfa_loc &b, int stage)
{
    unsigned char *st = smem + stage * PFA_STAGE_BYTES;
    uint32_t *kmask = (uint32_t *)(st + 2 * PFA_TILE_BYTES);
    const int row = threadIdx.x >> 2;
    const int quarter = threadIdx.x & 3;
    const unsigned char *ksrc = (const unsigned char *)p.kp;
    const unsigned char *vsrc = (const unsigned char *)p.vp;
    const bool use = b.use != 0u;
    if (use) {
        const int32_t slot = b.pos & (p.P - 1);
        ksrc = cu_plane_row16(p.kp, p.ks, b.page, it.g, slot);
        vsrc = cu_plane_row16(p.vp, p.vs, b.page, it.g, slot);
    }
    const uint32_t kd = cu_smem_addr(st);
    const uint32_t vd = kd + PFA_TILE_BYTES;
    const int nbytes = use ? 16 : 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int chunk = quarter * 4 + i;
        const int so = use ? chunk * 16 : 0;
        cu_cp_async16(kd + cu_swz(row, chunk), ksrc + so, nbytes);
        cu_cp_async16(vd + cu_swz(row, chunk), vsrc + so, nbytes);
    }
    if (quarter == 0)
        kmask[row] = b.use;
}

/* The union of the tile's tokens' selection rows (ascending, -1 padded)
 * with the bits of the tokens that chose each block.  All threads stage
 * the rows; warp 0 merges them, lane i walking token i's row: each round
 * takes the smallest head, and the lanes holding it advance. */
__device__ __forceinline__ void cu_pfa_build_union(const cu_pfa_params &p, const cu_pfa_item &it,
                                                   const cu_pfa_union &un)
{
    const int32_t n = it.ntok * p.W;
    for (int32_t e = threadIdx.x; e < n; e += PFA_THREADS) {
        const int32_t tok = e / p.W;
        un.stage[e] = p.sel[((int64_t)(it.t0 + tok) * p.hkv + it.g) * p.W + (e - tok * p.W)];
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        const int32_t *row = un.stage + lane * p.W;
        int32_t i = 0;
        int32_t h = lane < it.ntok && p.W > 0 && row[0] >= 0 ? row[0] : INT32_MAX;
        int32_t cnt = 0;
        for (;;) {
            const int32_t mn = __reduce_min_sync(0xffffffffu, h);
            if (mn == INT32_MAX)
                break;
            const uint32_t bits = __ballot_sync(0xffffffffu, h == mn);
            if (lane == 0) {
                un.blk[cnt] = mn;
                un.msk[cnt] = bits;
            }
            ++cnt;
            if (h == mn) {
                ++i;
                h = i < p.W && row[i] >= 0 ? row[i] : INT32_MAX;
            }
        }
        if (lane == 0)
            *un.count = cnt;
    }
    __syncthreads();
}

template <typename Tag>
__device__ void cu_pfa_item_run(const cu_pfa_params &p, unsigned char *smem, const cu_pfa_union &un,
                                cu_pfa_item &it)
{
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;

    if (p.sparse) {
        cu_pfa_build_union(p, it, un);
        it.nunion = *un.count;
        it.nkeys = it.nunion * p.B;
    } else {
        it.nunion = 0;
        it.nkeys = it.kv_end;
    }
    const int32_t ntiles = (it.nkeys + PFA_KEYS - 1) / PFA_KEYS;

    /* The thread's rows: tile row = token x nh + head in the chunk. */
    const int32_t nrows = it.ntok * it.nh;
    const int row_lo = warp * 16 + (lane >> 2);
    const int row_hi = row_lo + 8;
    const bool ok_lo = row_lo < nrows, ok_hi = row_hi < nrows;
    uint32_t tb_lo = 0u, tb_hi = 0u;
    int64_t q_lo = 0, q_hi = 0;
    if (ok_lo) {
        const int32_t tok = row_lo / it.nh;
        tb_lo = 1u << tok;
        q_lo = (int64_t)(it.t0 + tok) * p.hq_total + it.g * p.g + it.h0 + (row_lo - tok * it.nh);
    }
    if (ok_hi) {
        const int32_t tok = row_hi / it.nh;
        tb_hi = 1u << tok;
        q_hi = (int64_t)(it.t0 + tok) * p.hq_total + it.g * p.g + it.h0 + (row_hi - tok * it.nh);
    }
    /* Tokens of the warp's rows: a tile none of them uses is skipped. */
    const uint32_t wtb = __reduce_or_sync(0xffffffffu, tb_lo | tb_hi);

    uint32_t qa[8][4];
    cu_rows_load_q(p.q, q_lo, q_hi, ok_lo, ok_hi, qa);
    float o[16][4], m_lo, m_hi, l_lo, l_hi;
    cu_rows_clear(o, m_lo, m_hi, l_lo, l_hi);

    const int krow = threadIdx.x >> 2;
    for (int s = 0; s < PFA_STAGES - 1; ++s) {
        if (s < ntiles)
            cu_pfa_issue(p, it, smem, cu_pfa_locate(p, it, un, s * PFA_KEYS + krow), s);
        cu_cp_async_commit();
    }
    /* The next tile's key row, located one tile ahead of its copy: the
     * page-table load runs under the current tile's products. */
    cu_pfa_loc ahead = cu_pfa_locate(p, it, un, (PFA_STAGES - 1) * PFA_KEYS + krow);
    for (int32_t j = 0; j < ntiles; ++j) {
        cu_cp_async_wait<PFA_STAGES - 2>();
        __syncthreads();
        const int32_t jn = j + PFA_STAGES - 1;
        if (jn < ntiles) {
            cu_pfa_issue(p, it, smem, ahead, jn % PFA_STAGES);
            if (jn + 1 < ntiles)
                ahead = cu_pfa_locate(p, it, un, (jn + 1) * PFA_KEYS + krow);
        }
        cu_cp_async_commit();

        const unsigned char *st = smem + (j % PFA_STAGES) * PFA_STAGE_BYTES;
        const uint32_t *kmask = (const uint32_t *)(st + 2 * PFA_TILE_BYTES);
        if (!__any_sync(0xffffffffu, ((kmask[lane] | kmask[lane + 32]) & wtb) != 0u))
            continue;
        const uint32_t ka = cu_smem_addr(st);
        const uint32_t va = ka + PFA_TILE_BYTES;

        float sc[PFA_KEYS / 8][4];
        cu_rows_qk<Tag, PFA_KEYS / 8, cu_pfa_swz>(ka, 0, qa, sc);
#pragma unroll
        for (int n = 0; n < PFA_KEYS / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const uint32_t km = kmask[n * 8 + 2 * (lane & 3) + e];
                sc[n][e] = (km & tb_lo) ? sc[n][e] * p.scale_log2 : -INFINITY;
                sc[n][2 + e] = (km & tb_hi) ? sc[n][2 + e] * p.scale_log2 : -INFINITY;
            }
        }
        cu_rows_softmax<PFA_KEYS / 8>(sc, o, m_lo, m_hi, l_lo, l_hi);
        cu_rows_pv<Tag, PFA_KEYS, cu_pfa_swz>(va, 0, sc, o);
    }
    cu_cp_async_wait<0>();
    cu_rows_sum_quads(l_lo, l_hi);

    const float inv_lo = cu_rows_inv(l_lo) * p.v_mul, inv_hi = cu_rows_inv(l_hi) * p.v_mul;
    uint32_t *op = (uint32_t *)p.o;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
        const int d = n * 8 + 2 * (lane & 3);
        if (ok_lo)
            op[(q_lo * 128 + d) >> 1] = cu_pack2(o[n][0] * inv_lo, o[n][1] * inv_lo, Tag());
        if (ok_hi)
            op[(q_hi * 128 + d) >> 1] = cu_pack2(o[n][2] * inv_hi, o[n][3] * inv_hi, Tag());
    }
    if (p.lse && (lane & 3) == 0) {
        if (ok_lo)
            p.lse[q_lo] = cu_rows_lse(m_lo, l_lo);
        if (ok_hi)
            p.lse[q_hi] = cu_rows_lse(m_hi, l_hi);
    }
    __syncthreads(); /* the ring and the union are reused by the next item */
}

template <typename Tag>
__global__ void __launch_bounds__(PFA_THREADS, 1) cu_pfa_kernel(cu_pfa_params p)
{
    cu_pdl_wait(); /* the selection's rows and the prologue's cache rows */
    cu_pdl_trigger();
    extern __shared__ __align__(128) unsigned char smem[];
    cu_pfa_union un;
    un.stage = (int32_t *)(smem + PFA_RING_BYTES);
    un.blk = un.stage + p.tt * p.W;
    un.msk = (uint32_t *)(un.blk + p.tt * p.W);
    un.count = (int32_t *)(un.msk + p.tt * p.W);

    const int32_t per_tile = p.hkv * p.hchunks;
    const int64_t total = (int64_t)p.hdr->n_pf_tiles[p.list] * per_tile;
    for (int64_t w = blockIdx.x; w < total; w += gridDim.x) {
        const int32_t ti = (int32_t)(w / per_tile);
        const int32_t rest = (int32_t)(w - (int64_t)ti * per_tile);
        const cu_pf_tile t = p.tiles[ti];
        cu_pfa_item it;
        it.r = t.r;
        it.t0 = t.t0;
        it.ntok = t.ntok;
        it.pos0 = t.pos0;
        it.g = rest / p.hchunks;
        it.h0 = (rest - it.g * p.hchunks) * p.nh;
        it.nh = min(p.nh, p.g - it.h0);
        it.kv_end = t.pos0 + t.ntok;
        cu_pfa_item_run<Tag>(p, smem, un, it);
    }
}

/* ---- host side ----------------------------------------------------------- */

size_t cu_pfa_smem(int32_t tt, int32_t W)
{
    const size_t uni = W > 0 ? (size_t)3 * sizeof(int32_t) * (size_t)tt * (size_t)W + 16 : 0;
    return (size_t)PFA_RING_BYTES + uni;
}

int cu_pfa_fits(int32_t d, int32_t g, int32_t W, int sparse, const char **why)
{
    if (d != 128) {
        if (why)
            *why = "head dim != 128: scalar prefill rows";
        return 0;
    }
    if (cu_pfa_smem(cu_pfa_tile_tokens(g), sparse ? W : 0) > PFA_SMEM_LIMIT) {
        if (why)
            *why = "selection rows too wide for a shared-memory union: scalar prefill rows";
        return 0;
    }
    return 1;
}

void cu_pfa_build(const cu_attn_params *A, cu_pfa_params *p)
{
    memset(p, 0, sizeof(*p));
    p->act = A->act_dtype;
    p->hq_total = A->q_heads;
    p->hkv = A->kv_heads;
    p->g = A->group;
    p->tt = cu_pfa_tile_tokens(A->group);
    p->nh = cu_pfa_head_chunk(A->group);
    p->hchunks = (A->group + p->nh - 1) / p->nh;
    p->sparse = A->sparse;
    p->W = A->topk_width;
    p->B = A->block_size;
    p->P = A->page_size;
    p->logP = A->log_page_size;
    p->cap_pages = A->cap_pages;
    p->list = A->kind == CU_KIND_IV ? CU_PFA_IV : CU_PFA_MAIN;
    p->scale_log2 = A->scale * A->pf_k_mul * CU_LOG2E;
    p->v_mul = A->pf_v_mul;
    p->q = A->q;
    p->kp = A->pf_k_plane;
    p->vp = A->pf_v_plane;
    p->ks = A->pf_k_strides;
    p->vs = A->pf_v_strides;
    p->o = A->out;
    p->lse = A->lse;
    p->sel = A->selected;
    p->page_table = A->meta.page_table;
    p->hdr = A->meta.hdr;
    p->tiles = A->meta.pf_tiles[p->list];
}

void cu_launch_attn_prefill_mma(const cu_pfa_params *p, const cu_plan_state *st, cudaStream_t s)
{
    const size_t smem = cu_pfa_smem(p->tt, p->sparse ? p->W : 0);
    if (p->act == MSA_DTYPE_BF16)
        cu_launch(cu_pfa_kernel<cu_bf16_tag>, st->grid_pfa, PFA_THREADS, smem, s, st->pdl, *p);
    else
        cu_launch(cu_pfa_kernel<cu_f16_tag>, st->grid_pfa, PFA_THREADS, smem, s, st->pdl, *p);
}

cudaError_t cu_pfa_setup(int num_sms, int32_t W, int *grid)
{
    /* A device whose blocks may not reach the limit keeps the scalar rows
     * (grid 0). */
    int dev = 0, optin = 0;
    *grid = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess || optin < PFA_SMEM_LIMIT)
        return e;
    e = cu_allow_smem(PFA_SMEM_LIMIT, cu_pfa_kernel<cu_bf16_tag>, cu_pfa_kernel<cu_f16_tag>);
    if (e != cudaSuccess)
        return e;
    int occ = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, cu_pfa_kernel<cu_bf16_tag>, PFA_THREADS,
                                                      cu_pfa_smem(CU_PFA_MAX_TOK, W));
    if (e != cudaSuccess)
        return e;
    *grid = num_sms * (occ > 0 ? occ : 1);
    return cudaSuccess;
}
