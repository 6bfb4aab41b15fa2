/*
 * Attention of prefill rows on tensor cores (mma.sync m16n8k16, sm_80 and
 * later): the rows of requests with q_len > CU_DEC_MAX_Q, for the sparse
 * pass (each token's selected blocks), the dense pass (every causal key)
 * and the index-value pass (dense MQA over the index planes).
 *
 * Work: tiles of consecutive tokens of one request (cu_pf_tile, built on
 * the host with the step's schedule), times KV heads, times chunks of at
 * most 128 query heads.  A tile's rows are its tokens x the KV head's
 * query heads (128 rows: 8 tokens of 16 heads for the M3 main passes, 32
 * tokens of 4 index heads for the index-value pass), so every K/V tile
 * loaded into shared memory serves all of them.  docs/PREFILL.md gives
 * the design and its reasons.
 *
 * The kernel reads only its parameter struct (cu_pfa_params), filled by
 * cu_pfa_build from the pass's decode attention parameters (the plan
 * and the call).
 */
#ifndef MSA_ATTENTION_PREFILL_MMA_SM80_CUH
#define MSA_ATTENTION_PREFILL_MMA_SM80_CUH

#include "cuda/params.cuh"

/* The tile lists (CU_PFA_MAIN, CU_PFA_IV), the tile size
 * (cu_pfa_tile_tokens, CU_PFA_ROWS, CU_PFA_MAX_TOK) and the tiles
 * themselves (cu_sched_fill_pf_tiles) are the scheduler's: schedule.h. */

/* What the kernel reads and writes, nothing else. */
typedef struct cu_pfa_params {
    int32_t act;               /* MSA_DTYPE_BF16 or MSA_DTYPE_FP16: activations and planes */
    int32_t hq_total;          /* query heads of a token row (q, o, lse) */
    int32_t hkv;               /* KV heads of the planes */
    int32_t g;                 /* query heads per KV head */
    int32_t tt;                /* tokens per tile: cu_pfa_tile_tokens(g) */
    int32_t nh;                /* query heads per chunk: min(g, 128) */
    int32_t hchunks;           /* chunks of a KV head's query heads: ceil(g / nh) */
    int32_t sparse;            /* keys of the tokens' selected blocks, else all causal keys */
    int32_t W;                 /* width of a selection row */
    int32_t B;                 /* block size */
    int32_t P, logP;           /* page size (a power of two) and its log */
    int32_t cap_pages;         /* page-table row length */
    int32_t list;              /* CU_PFA_MAIN or CU_PFA_IV */
    float scale_log2;          /* softmax scale x log2(e) (x K's plane scale on copies) */
    float v_mul;               /* V's plane scale on copies (cu_attn_params.pf_v_mul), else 1 */
    const void *q;             /* [tokens][hq_total][128] */
    const void *kp, *vp;       /* planes, rows at cu_plane_row of ks, vs */
    msa_plane_strides ks, vs;  /* the planes' strides (library or engine layout) */
    void *o;                   /* [tokens][hq_total][128] */
    float *lse;                /* [tokens][hq_total] natural-log LSE, or NULL */
    const int32_t *sel;        /* [tokens][hkv][W] ascending block ids, -1 padded (sparse) */
    const int32_t *page_table; /* [cap_req][cap_pages] */
    const cu_step_hdr *hdr;    /* n_pf_tiles[list] */
    const cu_pf_tile *tiles;   /* the list's tiles */
} cu_pfa_params;

/* Dynamic shared memory of one CTA for tiles of tt tokens and selection
 * rows of width W (0 when no CTA of the launch builds a union). */
size_t cu_pfa_smem(int32_t tt, int32_t W);

/* Whether the kernel serves a pass with these shapes on this device: head
 * dim 128, 16-bit activations and planes of the same type (the caller
 * checks the types), and the shared memory the union needs fits.  why (may
 * be NULL) receives the reason when it does not. */
int cu_pfa_fits(int32_t d, int32_t g, int32_t W, int sparse, const char **why);

/* The parameters of one pass (A: main sparse, main dense or index value),
 * from the pass's decode attention parameters. */
void cu_pfa_build(const cu_attn_params *A, cu_pfa_params *p);

/* Launches the kernel on the plan's persistent grid (st->grid_pfa). */
void cu_launch_attn_prefill_mma(const cu_pfa_params *p, const cu_plan_state *st, cudaStream_t s);

/* Kernel attributes (shared memory limit) and the persistent grid; grid 0
 * where the device cannot give a block the shared memory (scalar rows). */
cudaError_t cu_pfa_setup(int num_sms, int32_t W, int *grid);

#endif /* MSA_ATTENTION_PREFILL_MMA_SM80_CUH */
