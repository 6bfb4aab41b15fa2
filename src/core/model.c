/* Model: layer shapes, per-layer flags, validation of SPEC section 2. */
#include "core/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void msa_model_config_default(msa_model_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->num_layers = 1;
    cfg->num_q_heads = 64;
    cfg->num_kv_heads = 4;
    cfg->head_dim = 128;
    cfg->num_index_heads = 4;
    cfg->index_dim = 128;
    cfg->block_size = 128;
    cfg->topk_blocks = 16;
    cfg->init_blocks = 0;
    cfg->local_blocks = 1;
    cfg->score_type = MSA_SCORE_MAX;
}

/* Bound sizes so that products of shapes stay far from overflow. */
#define MSA_MAX_HEADS 4096
#define MSA_MAX_DIM 4096
#define MSA_MAX_LAYERS 100000
#define MSA_MAX_BLOCK 65536

static msa_status validate_config(msa_context *ctx, const msa_model_config *c)
{
#define BAD(...) return msa_set_error(ctx, MSA_ERR_INVALID_CONFIG, __VA_ARGS__)
    if (c->num_layers < 1 || c->num_layers > MSA_MAX_LAYERS)
        BAD("num_hidden_layers must be in 1..%d (got %d)", MSA_MAX_LAYERS, c->num_layers);
    if (c->num_q_heads < 1 || c->num_q_heads > MSA_MAX_HEADS)
        BAD("num_attention_heads must be in 1..%d (got %d)", MSA_MAX_HEADS, c->num_q_heads);
    if (c->num_kv_heads < 1 || c->num_kv_heads > MSA_MAX_HEADS)
        BAD("num_key_value_heads must be in 1..%d (got %d)", MSA_MAX_HEADS, c->num_kv_heads);
    if (c->head_dim < 1 || c->head_dim > MSA_MAX_DIM)
        BAD("head_dim must be in 1..%d (got %d)", MSA_MAX_DIM, c->head_dim);
    if (c->num_q_heads % c->num_kv_heads != 0)
        BAD("num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)",
            c->num_q_heads, c->num_kv_heads);
    if (c->num_index_heads < 1 || c->num_index_heads > MSA_MAX_HEADS)
        BAD("sparse_num_index_heads must be in 1..%d (got %d)", MSA_MAX_HEADS, c->num_index_heads);
    if (c->index_dim < 1 || c->index_dim > MSA_MAX_DIM)
        BAD("sparse_index_dim must be in 1..%d (got %d)", MSA_MAX_DIM, c->index_dim);
    if (c->num_index_heads % c->num_kv_heads != 0 && c->num_kv_heads % c->num_index_heads != 0)
        BAD("sparse_num_index_heads (%d) and num_key_value_heads (%d) must divide one another",
            c->num_index_heads, c->num_kv_heads);
    if (c->block_size < 1 || c->block_size > MSA_MAX_BLOCK)
        BAD("sparse_block_size must be in 1..%d (got %d)", MSA_MAX_BLOCK, c->block_size);
    if (c->topk_blocks < 1 || c->topk_blocks > 65536)
        BAD("sparse_topk_blocks must be in 1..65536 (got %d)", c->topk_blocks);
    if (c->init_blocks < 0)
        BAD("sparse init blocks must be >= 0 (got %d)", c->init_blocks);
    if (c->local_blocks < 1)
        BAD("sparse local blocks must be >= 1: every token must see its own block (got %d)",
            c->local_blocks);
    if ((int64_t)c->init_blocks + c->local_blocks > c->topk_blocks)
        BAD("init blocks (%d) + local blocks (%d) exceed sparse_topk_blocks (%d)", c->init_blocks,
            c->local_blocks, c->topk_blocks);
    if (c->score_type != MSA_SCORE_MAX && c->score_type != MSA_SCORE_LSE)
        BAD("unknown sparse score type %d", (int)c->score_type);
    if (!(c->softmax_scale >= 0.0f) || isinf(c->softmax_scale))
        BAD("softmax scale must be finite and positive (or 0 for the default)");
    if (!(c->index_softmax_scale >= 0.0f) || isinf(c->index_softmax_scale))
        BAD("index softmax scale must be finite and positive (or 0 for the default)");
    for (int32_t l = 0; l < c->num_layers; l++) {
        if (c->layer_sparse && c->layer_sparse[l] > 1)
            BAD("sparse_attention_freq[%d] must be 0 or 1", l);
        if (c->layer_index_value && c->layer_index_value[l] > 1)
            BAD("sparse_disable_index_value[%d] must be 0 or 1", l);
    }
    return MSA_OK;
#undef BAD
}

msa_status msa_model_create(msa_context *ctx, const msa_model_config *cfg, msa_model **out)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    if (!cfg || !out)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "msa_model_create: NULL argument");
    *out = NULL;
    msa_status st = validate_config(ctx, cfg);
    if (st != MSA_OK)
        return st;
    msa_model *m = calloc(1, sizeof *m);
    uint8_t *sparse = malloc((size_t)cfg->num_layers);
    uint8_t *ivalue = malloc((size_t)cfg->num_layers);
    if (!m || !sparse || !ivalue) {
        free(m);
        free(sparse);
        free(ivalue);
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY, "msa_model_create: out of memory");
    }
    for (int32_t l = 0; l < cfg->num_layers; l++) {
        sparse[l] = cfg->layer_sparse ? cfg->layer_sparse[l] : 1;
        /* Only sparse layers have an index branch, hence an index value. */
        ivalue[l] = (uint8_t)(sparse[l] && cfg->layer_index_value ? cfg->layer_index_value[l] : 0);
    }
    m->cfg = *cfg;
    m->cfg.layer_sparse = sparse;
    m->cfg.layer_index_value = ivalue;
    m->layer_sparse = sparse;
    m->layer_index_value = ivalue;
    if (m->cfg.softmax_scale == 0.0f)
        m->cfg.softmax_scale = (float)(1.0 / sqrt((double)cfg->head_dim));
    if (m->cfg.index_softmax_scale == 0.0f)
        m->cfg.index_softmax_scale = (float)(1.0 / sqrt((double)cfg->index_dim));
    m->group = cfg->num_q_heads / cfg->num_kv_heads;
    m->topk_width = cfg->num_index_heads > cfg->num_kv_heads
                        ? cfg->topk_blocks * (cfg->num_index_heads / cfg->num_kv_heads)
                        : cfg->topk_blocks;
    msa_clear_error(ctx);
    *out = m;
    return MSA_OK;
}

void msa_model_free(msa_model *model)
{
    if (!model)
        return;
    free(model->layer_sparse);
    free(model->layer_index_value);
    free(model);
}

void msa_model_get_config(const msa_model *model, msa_model_config *cfg)
{
    if (model && cfg)
        *cfg = model->cfg;
}

int msa_model_layer_is_sparse(const msa_model *model, int32_t layer)
{
    if (!model || layer < 0 || layer >= model->cfg.num_layers)
        return 0;
    return model->layer_sparse[layer];
}

int msa_model_layer_has_index_value(const msa_model *model, int32_t layer)
{
    if (!model || layer < 0 || layer >= model->cfg.num_layers)
        return 0;
    return model->layer_index_value[layer];
}

int32_t msa_model_topk_width(const msa_model *model)
{
    return model ? model->topk_width : 0;
}

/* ---- tensor parallelism ------------------------------------------------ */

/* A contiguous share of `count` heads for `rank` of `size`: count / size
 * heads each, or, with fewer heads than ranks, one head held by size / count
 * consecutive ranks (vLLM's replication of KV heads).  0 when neither
 * divides the other. */
static int tp_share(int32_t count, int32_t rank, int32_t size, int32_t *n, int32_t *begin,
                    int32_t *replicas)
{
    if (count % size == 0) {
        *n = count / size;
        *begin = rank * *n;
        *replicas = 1;
        return 1;
    }
    if (size % count == 0) {
        *n = 1;
        *replicas = size / count;
        *begin = rank / *replicas;
        return 1;
    }
    return 0;
}

/* The index heads whose selection KV head g uses (SPEC section 4):
 * [*lo, *hi] of a model of hkv KV heads and hi_count index heads. */
static void index_heads_of(int32_t g, int32_t hkv, int32_t hi_count, int32_t *lo, int32_t *hi)
{
    if (hi_count >= hkv) {
        int32_t m = hi_count / hkv;
        *lo = g * m;
        *hi = g * m + m - 1;
    } else {
        *lo = *hi = g / (hkv / hi_count);
    }
}

/* The index heads [*ib, *ib + *ni) that the KV heads [kv_begin, kv_begin +
 * nkv) of a rank use; 0 when a model of nkv KV and *ni index heads does not
 * map each of those KV heads to the index heads it uses in the full model
 * (*bad_kv then names one). */
static int tp_index_heads(const msa_model_config *full, int32_t kv_begin, int32_t nkv, int32_t *ib,
                          int32_t *ni, int32_t *bad_kv)
{
    int32_t lo, hi;
    index_heads_of(kv_begin, full->num_kv_heads, full->num_index_heads, ib, &hi);
    index_heads_of(kv_begin + nkv - 1, full->num_kv_heads, full->num_index_heads, &lo, &hi);
    *ni = hi + 1 - *ib;
    *bad_kv = kv_begin;
    if (*ni % nkv != 0 && nkv % *ni != 0)
        return 0;
    for (int32_t g = 0; g < nkv; g++) {
        int32_t flo, fhi, rlo, rhi;
        index_heads_of(kv_begin + g, full->num_kv_heads, full->num_index_heads, &flo, &fhi);
        index_heads_of(g, nkv, *ni, &rlo, &rhi);
        if (flo != *ib + rlo || fhi != *ib + rhi) {
            *bad_kv = kv_begin + g;
            return 0;
        }
    }
    return 1;
}

/* The rank's share of heads, or a message in ctx and a status.  A split is
 * accepted only when every rank gets the same shapes with the full model's
 * mappings, so that all ranks of one model are accepted or none is. */
static msa_status tp_rank_heads(msa_context *ctx, const msa_model_config *full, int32_t rank,
                                int32_t size, msa_model_config *cfg, msa_tp_shard *sh)
{
#define BAD(...) \
    return msa_set_error(ctx, MSA_ERR_INVALID_CONFIG, "msa_model_config_for_rank: " __VA_ARGS__)
    if (full->num_q_heads % size != 0)
        BAD("num_attention_heads (%d) is not a multiple of the tensor-parallel size (%d)",
            full->num_q_heads, size);
    int32_t nkv = 0, kv_begin = 0, kv_rep = 0, ib = 0, ni = 0, index_rep = 0;
    for (int32_t r = 0; r < size; r++) {
        int32_t n, b, rep, rib, rni, bad;
        if (!tp_share(full->num_kv_heads, r, size, &n, &b, &rep))
            BAD("num_key_value_heads (%d) and the tensor-parallel size (%d): neither is a "
                "multiple of the other",
                full->num_kv_heads, size);
        /* The index heads follow the KV heads whose selection they make. */
        if (!tp_index_heads(full, b, n, &rib, &rni, &bad)) {
            int32_t flo, fhi;
            index_heads_of(bad, full->num_kv_heads, full->num_index_heads, &flo, &fhi);
            BAD("sparse_num_index_heads (%d) over num_key_value_heads (%d) cannot be split over "
                "%d ranks: rank %d holds KV heads %d..%d, which use index heads %d..%d, and no "
                "model of %d KV heads and %d index heads maps them so (KV head %d uses index "
                "heads %d..%d)",
                full->num_index_heads, full->num_kv_heads, size, r, b, b + n - 1, rib,
                rib + rni - 1, n, rni, bad, flo, fhi);
        }
        if (r == 0)
            ni = rni;
        else if (rni != ni)
            BAD("sparse_num_index_heads (%d) over num_key_value_heads (%d) cannot be split over "
                "%d ranks: rank 0 would hold %d index heads, rank %d %d",
                full->num_index_heads, full->num_kv_heads, size, ni, r, rni);
        if (r == rank) {
            nkv = n;
            kv_begin = b;
            kv_rep = rep;
            ib = rib;
        }
    }
    /* Ranks that hold the same index heads as this one. */
    for (int32_t r = 0; r < size; r++) {
        int32_t n = 0, b = 0, rep = 0, rib = 0, rni = 0, bad = 0;
        tp_share(full->num_kv_heads, r, size, &n, &b, &rep);
        tp_index_heads(full, b, n, &rib, &rni, &bad);
        index_rep += rib == ib;
    }
    *cfg = *full;
    cfg->num_q_heads = full->num_q_heads / size;
    cfg->num_kv_heads = nkv;
    cfg->num_index_heads = ni;
    sh->q_head_begin = rank * cfg->num_q_heads;
    sh->kv_head_begin = kv_begin;
    sh->index_head_begin = ib;
    sh->kv_replicas = kv_rep;
    sh->index_replicas = index_rep;
    return MSA_OK;
#undef BAD
}

msa_status msa_model_config_for_rank(msa_context *ctx, const msa_model_config *full, int32_t rank,
                                     int32_t size, msa_model_config *out, msa_tp_shard *shard)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    if (!full || !out)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "msa_model_config_for_rank: NULL argument");
    if (size < 1 || rank < 0 || rank >= size)
        return msa_set_error(
            ctx, MSA_ERR_INVALID_ARGUMENT,
            "msa_model_config_for_rank: rank %d of %d ranks: need 0 <= rank < size", rank, size);
    msa_status st = validate_config(ctx, full);
    if (st != MSA_OK)
        return st;
    msa_model_config cfg;
    msa_tp_shard sh;
    st = tp_rank_heads(ctx, full, rank, size, &cfg, &sh);
    if (st != MSA_OK)
        return st;
    /* The rank's shapes are a model of their own (SPEC section 2). */
    st = validate_config(ctx, &cfg);
    if (st != MSA_OK)
        return st;
    *out = cfg;
    if (shard)
        *shard = sh;
    msa_clear_error(ctx);
    return MSA_OK;
}
