/*
 * The workspace of the key-block-major prefill attention
 * (attention_prefill_kbm_sm90.cuh), apart so that the plan state can hold
 * it without the kernels' parameters.
 */
#ifndef MSA_ATTENTION_PREFILL_KBM_WS_CUH
#define MSA_ATTENTION_PREFILL_KBM_WS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* The workspace of the kernels, carved from one region (cu_pfk_ws_carve). */
typedef struct cu_pfk_ws {
    int32_t *cnt;      /* [hkv][blocks_cap] list lengths; 0 between chunks */
    int32_t *off;      /* [hkv][blocks_cap] list offsets in ent */
    int32_t *blk_page; /* [blocks_cap] page of each block of the step's prefill requests */
    int32_t *epos;     /* [chunk_tokens][hkv][W] place of an entry in its list (-1: none) */
    int4 *ent;         /* [chunk_tokens * hkv * W] entries: partial row, last visible key,
                        * first query row of the token's KV head, 0 */
    int4 *items;       /* [items_cap] KV head, page, first entry, tokens */
    int32_t *n_items;  /* [1] items of the chunk */
    void *part_o;      /* [chunk_tokens * hkv * W][g][128] 16-bit partial rows */
    float *part_lse;   /* [chunk_tokens * hkv * W][g] their natural-log LSE */
} cu_pfk_ws;

#endif /* MSA_ATTENTION_PREFILL_KBM_WS_CUH */
