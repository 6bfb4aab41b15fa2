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
