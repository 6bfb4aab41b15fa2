/*
 * The key stream of one decode attention item.
 *
 * Sparse pass: the union of the request's selected blocks for this KV head,
 * laid end to end (key u is offset u % B of union entry u / B), each key
 * carrying the membership bits of the block.  Dense and index-value passes:
 * positions 0 .. kv_len-1, every token a member.  A key is used by token i
 * when i is a member and the key is inside i's causal window.
 *
 * Splits divide the stream in whole 64-key tiles, evenly, so the work of an
 * item follows the actual union size known only on the device.
 */
#ifndef MSA_CUDA_KERNELS_ATTENTION_KEY_STREAM_CUH
#define MSA_CUDA_KERNELS_ATTENTION_KEY_STREAM_CUH

#include "cuda/params.cuh"

typedef struct cu_stream {
    int32_t r, ql, kl, base, t0;
    int32_t u0, u1;        /* this split's keys */
    const int32_t *uid;    /* sparse: union ids */
    const uint32_t *masks; /* sparse: membership */
    int32_t B;
    int32_t sparse;
} cu_stream;

/* Item it's split of a stream of len keys: [s.u0, s.u1). */
__device__ __forceinline__ void cu_stream_split(cu_stream &s, const cu_att_item &it, int32_t len)
{
    const int32_t tiles = (len + CU_TILE_KEYS - 1) / CU_TILE_KEYS;
    const int32_t tb = (int32_t)((int64_t)tiles * it.split / it.nsplit);
    const int32_t te = (int32_t)((int64_t)tiles * (it.split + 1) / it.nsplit);
    s.u0 = tb * CU_TILE_KEYS;
    s.u1 = min(te * CU_TILE_KEYS, len);
}

/* all_blocks (sparse pass, Hopper kernel only): the request reaches at
 * most K blocks, so its union is all of them (SPEC 4), known without the
 * selection's results: uid and masks stay NULL (blocks 0, 1, ..., every
 * token a member).  own_uid, own_masks, own_cnt (sparse pass, Hopper kernel
 * only): the union the kernel built itself (cu_attt_union), in place of
 * the selection's. */
__device__ __forceinline__ cu_stream cu_stream_of(const cu_attn_params &params,
                                                  const cu_att_item &it, bool all_blocks = false,
                                                  const int32_t *own_uid = NULL,
                                                  const uint32_t *own_masks = NULL,
                                                  int32_t own_cnt = 0)
{
    cu_stream s;
    s.r = it.r;
    s.ql = it.ql;
    s.kl = it.kl;
    s.base = s.kl - s.ql;
    s.t0 = it.t0;
    s.B = params.block_size;
    s.sparse = params.sparse;
    int32_t len;
    if (params.sparse && all_blocks) {
        s.uid = NULL;
        s.masks = NULL;
        len = (s.kl + params.block_size - 1) / params.block_size * params.block_size;
    } else if (params.sparse && own_uid) {
        s.uid = own_uid;
        s.masks = own_masks;
        len = own_cnt * params.block_size;
    } else if (params.sparse) {
        const int64_t w = (int64_t)it.dec * params.layer_kv_heads + it.group;
        s.uid = params.union_ids + w * params.cap_union;
        s.masks = params.union_masks + w * params.cap_union;
        len = params.union_counts[w] * params.block_size;
    } else {
        s.uid = NULL;
        s.masks = NULL;
        len = s.kl;
    }
    cu_stream_split(s, it, len);
    return s;
}

/* Position of stream key u and the tokens that use it (0 when none). */
__device__ __forceinline__ uint32_t cu_stream_key(const cu_stream &s, int32_t u, int32_t *pos)
{
    uint32_t member;
    int32_t p;
    if (s.sparse) {
        const int32_t bi = u / s.B;
        p = s.uid[bi] * s.B + (u - bi * s.B);
        member = s.masks[bi];
    } else {
        p = u;
        member = 0xffffffffu;
    }
    *pos = p;
    if (p >= s.kl)
        return 0u;
    return member & cu_causal_bits(p, s.base, s.ql);
}

#endif /* MSA_CUDA_KERNELS_ATTENTION_KEY_STREAM_CUH */
