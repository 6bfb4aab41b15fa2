#include "workmodel.h"

#include <stdlib.h>
#include <string.h>

#include "elem.h"

void work_layer_init(work_layer *w, const msa_model *model, int32_t layer, msa_dtype kv_dtype,
                     msa_dtype index_dtype)
{
    msa_model_config cfg;
    msa_model_get_config(model, &cfg);
    memset(w, 0, sizeof *w);
    w->Hq = cfg.num_q_heads;
    w->Hkv = cfg.num_kv_heads;
    w->D = cfg.head_dim;
    w->Hi = cfg.num_index_heads;
    w->Di = cfg.index_dim;
    w->block = cfg.block_size;
    w->width = msa_model_topk_width(model);
    w->sparse = msa_model_layer_is_sparse(model, layer);
    w->index_value = msa_model_layer_has_index_value(model, layer);
    w->kv_elem_bytes = elem_bytes_per_value(kv_dtype);
    w->index_elem_bytes = elem_bytes_per_value(index_dtype);
}

/* Keys of block n at or before position `last` (inclusive). */
static int64_t block_keys(int64_t n, int64_t block, int64_t last)
{
    int64_t k = last - n * block + 1;
    if (k < 0)
        return 0;
    return k < block ? k : block;
}

/* Per KV head, the union of the blocks the request's tokens selected:
 * adds the number of such blocks and the keys they hold (up to kv_len). */
static void union_scan(const work_layer *w, int64_t kv_len, int32_t q_len, const int32_t *topk,
                       int64_t *blocks, int64_t *keys)
{
    int64_t nblocks = (kv_len + w->block - 1) / w->block;
    size_t n = (size_t)(nblocks > 0 ? nblocks : 1);
    unsigned char *seen = malloc(n);
    *blocks = 0;
    *keys = 0;
    if (!seen)
        return; /* cannot happen at sane sizes; undercounts rather than crashes */
    for (int g = 0; g < w->Hkv; g++) {
        memset(seen, 0, n);
        for (int32_t i = 0; i < q_len; i++) {
            const int32_t *row = topk + ((int64_t)i * w->Hkv + g) * w->width;
            for (int j = 0; j < w->width; j++) {
                int32_t b = row[j];
                if (b < 0 || b >= nblocks || seen[b])
                    continue;
                seen[b] = 1;
                *blocks += 1;
                *keys += block_keys(b, w->block, kv_len - 1);
            }
        }
    }
    free(seen);
}

double work_decode_bytes(const work_layer *w, int64_t kv_len, int32_t q_len, const int32_t *topk)
{
    double kv_row = (double)w->D * w->kv_elem_bytes * 2.0; /* one token of K and V, one head */
    if (!w->sparse)
        return (double)kv_len * w->Hkv * kv_row;
    double bytes = (double)kv_len * w->Di * w->index_elem_bytes * (w->index_value ? 2.0 : 1.0);
    int64_t blocks, keys;
    union_scan(w, kv_len, q_len, topk, &blocks, &keys);
    return bytes + (double)keys * kv_row;
}

int64_t work_union_blocks(const work_layer *w, int64_t kv_len, int32_t q_len, const int32_t *topk)
{
    int64_t blocks = 0, keys;
    if (w->sparse)
        union_scan(w, kv_len, q_len, topk, &blocks, &keys);
    return blocks;
}

double work_prefill_flops(const work_layer *w, int64_t kv_len, int32_t q_len, const int32_t *topk)
{
    double flops = 0.0;
    int group = w->Hq / w->Hkv;
    for (int32_t i = 0; i < q_len; i++) {
        int64_t p = kv_len - q_len + i;
        double visible = (double)(p + 1);
        if (!w->sparse) {
            flops += 4.0 * w->Hq * w->D * visible;
            continue;
        }
        flops += 2.0 * w->Hi * w->Di * visible;
        if (w->index_value)
            flops += 4.0 * w->Hi * w->Di * visible;
        for (int g = 0; g < w->Hkv; g++) {
            const int32_t *row = topk + ((int64_t)i * w->Hkv + g) * w->width;
            int64_t keys = 0;
            for (int j = 0; j < w->width; j++)
                if (row[j] >= 0)
                    keys += block_keys(row[j], w->block, p);
            flops += 4.0 * w->D * group * (double)keys;
        }
    }
    return flops;
}

void work_selection_stats(const work_layer *w, int64_t kv_len, int32_t q_len, const int32_t *topk,
                          int64_t *selected, int64_t *reachable)
{
    *selected = 0;
    *reachable = 0;
    if (!w->sparse)
        return;
    for (int32_t i = 0; i < q_len; i++) {
        int64_t p = kv_len - q_len + i;
        for (int g = 0; g < w->Hkv; g++) {
            const int32_t *row = topk + ((int64_t)i * w->Hkv + g) * w->width;
            for (int j = 0; j < w->width; j++)
                *selected += row[j] >= 0;
            *reachable += p / w->block + 1;
        }
    }
}
