/*
 * Widening of quantized cache pages into 16-bit copies for the prefill
 * kernels (widen_pages.cuh says what the copies hold and why).
 *
 * Work: every (prefill request, logical page, plane head) of the step, one
 * CTA each in a fixed stride over them all (the grid is fixed by the
 * device, so a captured graph serves any step).  A CTA widens one
 * [P][128] tile: fp8 codes 16 at a time (one 16-byte load, two 16-byte
 * stores), nvfp4 groups of 16 (eight code bytes and their scale byte).
 */
#include "cuda/kernels/prologue/widen_pages.cuh"
#include "cuda/arch/launch.cuh"
#include "cuda/common/plane_rows.cuh"
#include "cuda/common/quant_widen.cuh"

#include <string.h>

#define WIDEN_THREADS 256
/* CTAs per SM: all resident (64 registers a thread), each with
 * WIDEN_ROUND 16-byte loads in flight per thread: 64 KB per SM. */
#define WIDEN_CTAS_PER_SM 4
/* Every copied plane has rows of 128 values (cu_widen_plane_wanted). */
#define WIDEN_DIM 128
#define WIDEN_PIECES_PER_ROW (WIDEN_DIM / 16)

int cu_widen_plane_wanted(const msa_plan *plan, int plane)
{
    const msa_model *m = plan->model;
    const msa_cache_config *cc = &plan->cache->cfg;
    const msa_dtype act = plan->params.act_dtype;
    if (act != MSA_DTYPE_BF16 && act != MSA_DTYPE_FP16)
        return 0;
    const int main_plane = plane == MSA_PLANE_K || plane == MSA_PLANE_V;
    const msa_dtype dt = main_plane ? cc->kv_dtype : cc->index_dtype;
    if (dt != MSA_DTYPE_FP8_E4M3 && dt != MSA_DTYPE_NVFP4)
        return 0;
    if (msa_plane_dim(m, (msa_plane)plane) != WIDEN_DIM)
        return 0;
    if (plane == MSA_PLANE_INDEX_K && !cu_sched_any_layer(m, 1, 0))
        return 0;
    if (plane == MSA_PLANE_INDEX_V && !cu_sched_any_layer(m, 1, 1))
        return 0;
    return 1;
}

static int32_t cu_widen_heads(const msa_plan *plan, int plane)
{
    return plane == MSA_PLANE_K || plane == MSA_PLANE_V ? plan->model->cfg.num_kv_heads : 1;
}

/* A copy lies in the library layout of its plane: element strides do not
 * depend on the element type. */
static msa_plane_strides cu_widen_strides(const msa_plan *plan, int plane)
{
    return msa_plane_library_strides(plan->model, &plan->cache->cfg, (msa_plane)plane);
}

size_t cu_widen_plane_bytes(const msa_plan *plan, int plane)
{
    return (size_t)plan->cache->cfg.num_pages * (size_t)cu_widen_strides(plan, plane).page * 2;
}

void cu_widen_describe(const msa_plan *plan, cu_widen_copies *copies)
{
    for (int pl = 0; pl < CU_WIDEN_PLANES; ++pl) {
        copies->heads[pl] = cu_widen_heads(plan, pl);
        copies->strides[pl] = cu_widen_strides(plan, pl);
    }
}

void cu_widen_build(const msa_plan *plan, const cu_widen_copies *copies, int32_t layer,
                    unsigned planes, int32_t act_dtype, const cu_meta *meta, int32_t cap_pages,
                    cu_widen_params *p)
{
    const msa_cache *cache = plan->cache;
    memset(p, 0, sizeof *p);
    p->act_dtype = act_dtype;
    p->page_size = cache->cfg.page_size;
    p->cap_pages = cap_pages;
    for (int pl = 0; pl < CU_WIDEN_PLANES; ++pl) {
        if (!(planes & (1u << pl)) || !copies->copy[pl])
            continue;
        const int i = p->n++;
        p->src[i] = cache->planes[(size_t)layer * 4 + pl];
        p->src_strides[i] = cache->strides[(size_t)layer * 4 + pl];
        p->src_dtype[i] = pl < 2 ? cache->cfg.kv_dtype : cache->cfg.index_dtype;
        p->heads[i] = copies->heads[pl];
        p->dst[i] = copies->copy[pl];
        p->dst_strides[i] = copies->strides[pl];
        p->units_per_page += copies->heads[pl];
    }
    p->hdr = meta->hdr;
    p->q_len = meta->q_len;
    p->kv_len = meta->kv_len;
    p->page_table = meta->page_table;
}

/* Head `head` of physical page `page` of plane i: P rows of 128 values.
 * A thread loads its pieces of a round (WIDEN_ROUND of them, a page of
 * 128 rows in one round) before it widens and stores any: the loads of a
 * round are in flight together, as the copy is bound by the memory. */
#define WIDEN_ROUND 4
template <typename Tag>
__device__ void cu_widen_tile(const cu_widen_params &p, int i, int32_t page, int32_t head)
{
    const int32_t pieces = p.page_size * WIDEN_PIECES_PER_ROW;
    unsigned char *dst = (unsigned char *)p.dst[i];
    const unsigned char *src = (const unsigned char *)p.src[i];
    const int64_t dst_at = cu_plane_row(p.dst_strides[i], page, head, 0) * 2;
    const bool fp8 = p.src_dtype[i] == MSA_DTYPE_FP8_E4M3;
    /* nvfp4: the (page, head) region of the library layout. */
    const cu_qrow r0 =
        cu_nvfp4_row(cu_plane_row(p.src_strides[i], page, head, 0), 0, p.page_size, WIDEN_DIM);
    for (int32_t e0 = 0; e0 < pieces; e0 += WIDEN_ROUND * WIDEN_THREADS) {
        uint4 codes[WIDEN_ROUND];
        uint32_t sb[WIDEN_ROUND];
#pragma unroll
        for (int k = 0; k < WIDEN_ROUND; ++k) {
            const int32_t e = e0 + k * WIDEN_THREADS + (int32_t)threadIdx.x;
            const int32_t row = e / WIDEN_PIECES_PER_ROW, c = e % WIDEN_PIECES_PER_ROW;
            if (e >= pieces)
                continue;
            if (fp8) {
                codes[k] = *(const uint4 *)(src + cu_plane_row(p.src_strides[i], page, head, row) +
                                            16 * c);
            } else {
                const uint2 c2 =
                    *(const uint2 *)(src + r0.at + (int64_t)row * (WIDEN_DIM / 2) + 8 * c);
                codes[k] = make_uint4(c2.x, c2.y, 0u, 0u);
                sb[k] = src[r0.scales + (int64_t)row * (WIDEN_DIM / 16) + c];
            }
        }
#pragma unroll
        for (int k = 0; k < WIDEN_ROUND; ++k) {
            const int32_t e = e0 + k * WIDEN_THREADS + (int32_t)threadIdx.x;
            const int32_t row = e / WIDEN_PIECES_PER_ROW, c = e % WIDEN_PIECES_PER_ROW;
            if (e >= pieces)
                continue;
            /* fp8: sixteen codes; nvfp4: one group of sixteen (eight code
             * bytes, low nibble first) and its scale byte. */
            uint4 lo, hi;
            if (fp8) {
                cu_fp8_chunk_widen<Tag>(codes[k], lo, hi);
            } else {
                const float scale = cu_e4m3_to_f32(sb[k]);
                lo = cu_nvfp4_widen8<Tag>(codes[k].x, scale);
                hi = cu_nvfp4_widen8<Tag>(codes[k].y, scale);
            }
            uint4 *out = (uint4 *)(dst + dst_at + ((int64_t)row * WIDEN_DIM + 16 * c) * 2);
            out[0] = lo;
            out[1] = hi;
        }
    }
}

template <typename Tag>
__global__ void __launch_bounds__(WIDEN_THREADS, WIDEN_CTAS_PER_SM)
    cu_widen_kernel(const __grid_constant__ cu_widen_params p)
{
    cu_pdl_trigger();
    /* The prologue wrote the step's rows into the pages read here. */
    cu_pdl_wait();
    const int32_t nreq = p.hdr->num_requests;
    const int64_t G = gridDim.x;
    int64_t base = 0; /* units of the prefill requests before r */
    for (int32_t r = 0; r < nreq; ++r) {
        if (p.q_len[r] <= CU_DEC_MAX_Q)
            continue;
        const int32_t pages = (p.kv_len[r] + p.page_size - 1) / p.page_size;
        const int64_t units = (int64_t)pages * p.units_per_page;
        /* This CTA's first unit at or after base: u = blockIdx.x mod G. */
        int64_t u = base + ((int64_t)blockIdx.x - base % G + G) % G;
        for (; u < base + units; u += G) {
            const int64_t k = u - base;
            const int32_t n = (int32_t)(k / p.units_per_page);
            int32_t h = (int32_t)(k % p.units_per_page);
            int i = 0;
            while (h >= p.heads[i]) {
                h -= p.heads[i];
                ++i;
            }
            const int32_t page = p.page_table[(int64_t)r * p.cap_pages + n];
            cu_widen_tile<Tag>(p, i, page, h);
        }
        base += units;
    }
}

void cu_launch_widen_pages(const cu_widen_params *p, int num_sms, int pdl, cudaStream_t s)
{
    if (p->n == 0)
        return;
    const int grid = num_sms * WIDEN_CTAS_PER_SM;
    if (p->act_dtype == MSA_DTYPE_BF16)
        cu_launch(cu_widen_kernel<cu_bf16_tag>, grid, WIDEN_THREADS, 0, s, pdl, *p);
    else
        cu_launch(cu_widen_kernel<cu_f16_tag>, grid, WIDEN_THREADS, 0, s, pdl, *p);
}
