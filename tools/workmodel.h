/*
 * The work models of docs/PERFORMANCE.md, shared by `demo` and `bench` so
 * both report the same GB/s and FLOP/s for the same step.
 *
 * Decode (memory-bound): bytes a layer must read for one request.
 *   sparse: index keys of the whole context once (plus index values when the
 *           layer keeps them) + per KV head the union of the blocks its tokens
 *           selected, K and V, a partial last block counted by its tokens.
 *   dense:  all K and V of the context.
 * Prefill (compute-bound): useful FLOPs.
 *   sparse: 4*D per query head per selected visible key
 *           + 2*Hi*Di per visible key (indexer) [+ 4*Hi*Di per visible key
 *           for the index-value attention].
 *   dense:  4*Hq*D per visible key.
 */
#ifndef MSA_TOOLS_WORKMODEL_H
#define MSA_TOOLS_WORKMODEL_H

#include <stdint.h>

#include "msa/msa.h"

typedef struct work_layer {
    int Hq, Hkv, D, Hi, Di, block, width; /* width: selected-id row width W */
    int sparse, index_value;
    double kv_elem_bytes, index_elem_bytes; /* storage bytes per element */
} work_layer;

/* Fills *w for `layer` of `model` with the cache's formats. */
void work_layer_init(work_layer *w, const msa_model *model, int32_t layer, msa_dtype kv_dtype,
                     msa_dtype index_dtype);

/* One request of a step: kv_len after the step, q_len new tokens, and for
 * sparse layers its rows of selected ids, [q_len][Hkv][width]. */
double work_decode_bytes(const work_layer *w, int64_t kv_len, int32_t q_len, const int32_t *topk);
double work_prefill_flops(const work_layer *w, int64_t kv_len, int32_t q_len, const int32_t *topk);

/* Blocks a sparse layer reads for the request, summed over KV heads (the
 * union over its tokens per head); 0 for dense layers. */
int64_t work_union_blocks(const work_layer *w, int64_t kv_len, int32_t q_len, const int32_t *topk);

/* Selected blocks summed over (token, KV head), and the blocks those tokens
 * could reach (N = floor(p/B) + 1 each), for "fraction kept". */
void work_selection_stats(const work_layer *w, int64_t kv_len, int32_t q_len, const int32_t *topk,
                          int64_t *selected, int64_t *reachable);

#endif
