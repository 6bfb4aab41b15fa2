/*
 * Attention of prefill rows on Hopper (sm_90a): warpgroup products (wgmma)
 * on K and V pages brought into shared memory by tensor-map copies.  The
 * same work as the portable kernel (attention_prefill_mma_sm80: tiles of
 * consecutive tokens of one request x KV head x chunk of query heads, the
 * key stream the union of the tile's tokens' selected blocks or every
 * causal key), for the main passes with head dim 128 and pages of 128
 * rows (the sparse pass: blocks of one page).  docs/PREFILL.md gives the design and its reasons.
 *
 * The kernel reads only its parameter struct (cu_pfh_params), filled by
 * cu_pfh_build from the pass's decode attention parameters (the plan and
 * the call), and the K and V tensor maps
 * the plan encoded (tma_sm90.cuh: 64-column x 64-row boxes, 128-byte
 * swizzle).
 */
#ifndef MSA_ATTENTION_PREFILL_TMA_SM90_CUH
#define MSA_ATTENTION_PREFILL_TMA_SM90_CUH

#include "cuda/kernels/attention/attention_prefill_mma_sm80.cuh"

#include <cuda.h>

/* What the kernel reads and writes, nothing else. */
typedef struct cu_pfh_params {
    int32_t act;               /* MSA_DTYPE_BF16 or MSA_DTYPE_FP16: activations and planes */
    int32_t hq_total;          /* query heads of a token row (q, o, lse) */
    int32_t hkv;               /* KV heads of the planes */
    int32_t g;                 /* query heads per KV head */
    int32_t tt;                /* tokens per tile: cu_pfa_tile_tokens(g) */
    int32_t nh;                /* query heads per chunk: min(g, 128) */
    int32_t hchunks;           /* chunks of a KV head's query heads */
    int32_t sparse;            /* keys of the tokens' selected blocks, else all causal keys */
    int32_t W;                 /* width of a selection row */
    int32_t cap_pages;         /* page-table row length */
    float scale_log2;          /* softmax scale x log2(e) (x K's plane scale on copies) */
    float v_mul;               /* V's plane scale on copies (cu_attn_params.pf_v_mul), else 1 */
    const void *q;             /* [tokens][hq_total][128] */
    void *o;                   /* [tokens][hq_total][128] */
    float *lse;                /* [tokens][hq_total] natural-log LSE, or NULL */
    const int32_t *sel;        /* [tokens][hkv][W] ascending block ids, -1 padded (sparse) */
    const int32_t *page_table; /* [cap_req][cap_pages] */
    const int32_t *kv_len;     /* [cap_req]: rows at and past it in a page are stale */
    const cu_step_hdr *hdr;    /* n_pf_tiles[CU_PFA_MAIN] */
    const cu_pf_tile *tiles;   /* the main list's tiles */
} cu_pfh_params;

/* Whether the kernel serves the main pass of this shape: head dim 128,
 * page size 128 and, for the sparse pass, block size 128 (a key block is
 * one page, four copies per K or V), and the selection rows fit its
 * staging area.  The caller checks
 * the types (16-bit activations and planes alike), the device (wgmma) and
 * the tensor maps.  why (may be NULL) receives the reason when it does not. */
int cu_pfh_fits(int32_t d, int32_t page, int32_t block, int32_t g, int32_t W, int sparse,
                const char **why);

/* The parameters of the main pass A (sparse or dense). */
void cu_pfh_build(const cu_attn_params *A, cu_pfh_params *p);

/* Launches the kernel, one CTA per SM; maps: the layer's K map, then its V map. */
void cu_launch_attn_prefill_tma(const cu_pfh_params *p, const cu_plan_state *st,
                                const CUtensorMap *maps, cudaStream_t s);

/* Kernel attributes (shared memory); call on devices with wgmma only. */
cudaError_t cu_pfh_setup(void);

#endif /* MSA_ATTENTION_PREFILL_TMA_SM90_CUH */
