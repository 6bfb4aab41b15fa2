/*
 * Key-block-major attention of the sparse pass's prefill rows on Hopper
 * (sm_90a): each selected key block (one page of 128 keys of one KV head)
 * is copied into shared memory once per chunk of prefill tokens and
 * multiplied with the queries of every token that selected it; each
 * (token, block) pair leaves a partial output row and its LSE, and a merge
 * combines a token's partials.  docs/PREFILL.md gives the design and why it
 * is chosen over query tiles streaming the union of their tokens' blocks.
 *
 * Per chunk of prefill tokens, five kernels:
 *   count    each (token, KV head, selected block) entry takes a place in
 *            its block's list (an atomic count per (KV head, block));
 *   scan     one CTA turns the counts into list offsets and work items
 *            (at most CU_PFK_ITEM_TOKENS tokens of one list each; the
 *            whole items first, the lists' shorter remainders last) and
 *            sets the counts back to 0;
 *   scatter  the entries into their lists;
 *   attend   persistent CTAs claim items from a counter, copy an item's
 *            block and compute its tokens' partial rows (warpgroup
 *            products, one softmax per block);
 *   merge    each (token, query head) row from its partials, by LSE.
 * The prefill tokens go through in chunks of chunk_tokens, so the partials
 * of one chunk bound the workspace.
 */
#ifndef MSA_ATTENTION_PREFILL_KBM_SM90_CUH
#define MSA_ATTENTION_PREFILL_KBM_SM90_CUH

#include "cuda/kernels/attention/attention_prefill_kbm_ws.cuh"
#include "cuda/params.cuh"

#include <cuda.h>

/* Tokens of one work item: a list longer than this is cut into items. */
#define CU_PFK_ITEM_TOKENS 64
/* Bytes of partial rows and list entries the plan may give one chunk; the
 * chunk's token count follows from it (cu_pfk_chunk_tokens). */
#define CU_PFK_CHUNK_BUDGET ((size_t)2 << 30)

/* What the kernels read and write. */
typedef struct cu_pfk_params {
    int32_t act;          /* MSA_DTYPE_BF16 or MSA_DTYPE_FP16 */
    int32_t hq_total;     /* query heads of a token row */
    int32_t hkv;          /* KV heads */
    int32_t g;            /* query heads per KV head (a power of two, at most 64) */
    int32_t W;            /* width of a selection row */
    int32_t cap_pages;    /* page-table row length */
    int32_t chunk_tokens; /* prefill tokens of one chunk */
    int32_t blocks_cap;   /* list stride per KV head */
    int32_t items_cap;
    int32_t chunk;    /* this launch's chunk */
    float scale_log2; /* softmax scale x log2(e) (x K's plane scale on copies) */
    float v_mul;      /* V's plane scale on copies (cu_attn_params.pf_v_mul), else 1 */
    const void *q;    /* [tokens][hq_total][128] */
    void *o;          /* [tokens][hq_total][128] */
    float *lse;       /* [tokens][hq_total], or NULL */
    const int32_t *sel;
    const int32_t *page_table;
    const cu_tok_info *tok_info;
    const int32_t *pf_tok;
    const int32_t *pf_blk0;
    const cu_step_hdr *hdr;
    cu_pfk_ws ws;
} cu_pfk_params;

/* Whether the kernels serve a model of this shape: head dim 128, pages and
 * blocks of 128 keys, g a power of two from 8 to 64 (a warpgroup's 64 rows
 * are whole tokens, each token's rows one copy of at least 1024 bytes).
 * why (may be NULL) receives the reason when not. */
int cu_pfk_fits(int32_t d, int32_t page, int32_t block, int32_t g, const char **why);

/* Tokens of a chunk for a plan of cap_tok token rows: as many as the
 * budget's partial rows and entries allow, at most cap_tok. */
int32_t cu_pfk_chunk_tokens(int32_t cap_tok, int32_t hkv, int32_t g, int32_t W);

/* Bytes of the workspace, and its buffers carved from base (NULL: sizes
 * only). */
size_t cu_pfk_ws_carve(void *base, int32_t hkv, int32_t g, int32_t W, int32_t chunk_tokens,
                       int32_t blocks_cap, cu_pfk_ws *ws, int32_t *items_cap);

/* The parameters of the sparse pass A with the plan's workspace. */
void cu_pfk_build(const cu_attn_params *A, const cu_pfk_ws *ws, int32_t chunk_tokens,
                  int32_t blocks_cap, int32_t items_cap, cu_pfk_params *p);

/* Encodes qo[0], the map of the queries p->q (q_tokens token rows, boxes
 * of one token's g rows of one KV head), and qo[1], the map of the partial
 * rows (boxes of one entry's g rows).  0 on success; nonzero when the
 * driver refuses them (a query pointer not 16-byte aligned). */
int cu_pfk_encode_maps(const cu_pfk_params *p, int32_t q_tokens, CUtensorMap *qo);

/* Enqueues chunks 0 .. chunks - 1 (five kernels each); maps: the layer's K
 * map, then its V map; qo: the maps of cu_pfk_encode_maps. */
void cu_launch_attn_prefill_kbm(cu_pfk_params *p, int32_t chunks, const cu_plan_state *st,
                                const CUtensorMap *maps, const CUtensorMap *qo, cudaStream_t s);

/* Kernel attributes (shared memory); call on devices with wgmma only. */
cudaError_t cu_pfk_setup(void);

#endif /* MSA_ATTENTION_PREFILL_KBM_SM90_CUH */
