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
    int2 *ent;         /* [chunk_tokens * hkv * W] entries (cu_pfk_ent_make) */
    int4 *items;       /* [items_cap] KV head, page, first entry, tokens */
    int32_t *n_items;  /* [2] items of the chunk; the attend CTAs' claim counter */
    int32_t *nval;     /* [chunk_tokens * hkv] valid blocks of each (token, KV head)'s row */
    void *part_o;      /* [chunk_tokens * hkv * W][g][128] 16-bit partial rows */
    float *part_lse;   /* [chunk_tokens * hkv * W][g] their natural-log LSE */
} cu_pfk_ws;

/* A list entry in 8 bytes: x = its partial row x 128 + the last key of
 * the block of 128 keys its token sees (a later position counts as the
 * block's last key, 127),
 * y = the token's row in the step.  The chunk budget keeps partial rows
 * below 2^24 (cu_pfk_chunk_tokens), so x stays a non-negative int32. */
#define CU_PFK_ENT_KEY_BITS 7
__host__ __device__ __forceinline__ int2 cu_pfk_ent_make(int32_t row, int32_t last_key, int32_t tok)
{
    const int32_t top = (1 << CU_PFK_ENT_KEY_BITS) - 1;
    const int32_t k = last_key < top ? last_key : top;
    return make_int2((row << CU_PFK_ENT_KEY_BITS) | k, tok);
}
__host__ __device__ __forceinline__ int32_t cu_pfk_ent_row(int2 e)
{
    return e.x >> CU_PFK_ENT_KEY_BITS;
}
__host__ __device__ __forceinline__ int32_t cu_pfk_ent_key(int2 e)
{
    return e.x & ((1 << CU_PFK_ENT_KEY_BITS) - 1);
}

#endif /* MSA_ATTENTION_PREFILL_KBM_WS_CUH */
