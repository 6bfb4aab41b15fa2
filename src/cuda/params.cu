/*
 * Host builders of the kernels' parameter structs (params.cuh), from the
 * plan state and the forward call.
 */
#include "cuda/params.cuh"

#include <string.h>

/* Whether the prologue may copy the step's rows into the cache in 16-byte
 * pieces: same 16-bit element type on both sides, rows a multiple of 8
 * elements and every base pointer 16-byte aligned. */
static int cu_prologue_rows_vec_ok(const cu_prologue_params *p)
{
    const int half = p->act_dtype == MSA_DTYPE_BF16 || p->act_dtype == MSA_DTYPE_FP16;
    if (!half || p->kv_dtype != p->act_dtype || p->head_dim % 8 != 0)
        return 0;
    const void *ptrs[8] = {p->k_rows, p->v_rows, p->k_plane, p->v_plane, NULL, NULL, NULL, NULL};
    if (p->sparse) {
        if (p->index_dtype != p->act_dtype || p->index_dim % 8 != 0)
            return 0;
        ptrs[4] = p->index_k_rows;
        ptrs[5] = p->index_k_plane;
        if (p->index_value) {
            ptrs[6] = p->index_v_rows;
            ptrs[7] = p->index_v_plane;
        }
    }
    for (int i = 0; i < 8; ++i)
        if ((uintptr_t)ptrs[i] % 16 != 0)
            return 0;
    return 1;
}

/* log2 of a page size (a power of two, checked when the cache is made). */
static int32_t cu_log2_page(int32_t page_size)
{
    int32_t log = 0;
    while ((1 << log) < page_size)
        ++log;
    return log;
}

void cu_prologue_build(const msa_plan *plan, const cu_plan_state *st, int32_t layer,
                       const msa_layer_io *io, unsigned long long *timeline, cu_prologue_params *p)
{
    const msa_model *m = plan->model;
    const msa_model_config *cfg = &m->cfg;
    const msa_cache *cache = plan->cache;
    void *const *planes = cache->planes + (size_t)layer * 4;
    memset(p, 0, sizeof(*p));
    p->num_q_heads = cfg->num_q_heads;
    p->num_kv_heads = cfg->num_kv_heads;
    p->head_dim = cfg->head_dim;
    p->num_index_heads = cfg->num_index_heads;
    p->index_dim = cfg->index_dim;
    p->page_size = cache->cfg.page_size;
    p->topk_width = m->topk_width;
    p->sparse = m->layer_sparse[layer] != 0;
    p->index_value = p->sparse && m->layer_index_value[layer] != 0;
    p->act_dtype = io->act_dtype;
    p->kv_dtype = cache->cfg.kv_dtype;
    p->index_dtype = cache->cfg.index_dtype;
    p->k_rows = io->k;
    p->v_rows = io->v;
    p->index_k_rows = io->idx_k;
    p->index_v_rows = io->idx_v;
    p->k_plane = planes[MSA_PLANE_K];
    p->v_plane = planes[MSA_PLANE_V];
    p->index_k_plane = planes[MSA_PLANE_INDEX_K];
    p->index_v_plane = planes[MSA_PLANE_INDEX_V];
    const msa_plane_strides *strides = cache->strides + (size_t)layer * 4;
    p->k_strides = strides[MSA_PLANE_K];
    p->v_strides = strides[MSA_PLANE_V];
    p->index_k_strides = strides[MSA_PLANE_INDEX_K];
    p->index_v_strides = strides[MSA_PLANE_INDEX_V];
    const float *scales = cache->scales + (size_t)layer * 4;
    p->k_scale = scales[MSA_PLANE_K];
    p->v_scale = scales[MSA_PLANE_V];
    p->index_k_scale = scales[MSA_PLANE_INDEX_K];
    p->index_v_scale = scales[MSA_PLANE_INDEX_V];
    p->out = io->o;
    p->index_out = io->idx_o;
    p->lse = io->lse;
    p->topk_ids = io->topk;
    p->hdr = st->dev.hdr;
    p->tok_info = st->dev.tok_info;
    p->write_cache = io->write_cache;
    p->rows_in_pieces = p->write_cache && cu_prologue_rows_vec_ok(p);
#ifdef MSA_TIMELINE
    p->tl = timeline;
#else
    (void)timeline;
#endif
}

void cu_indexer_build(const msa_plan *plan, const cu_plan_state *st, int32_t layer,
                      const msa_layer_io *io, unsigned long long *timeline, cu_indexer_params *p)
{
    const msa_model_config *cfg = &plan->model->cfg;
    const msa_cache *cache = plan->cache;
    memset(p, 0, sizeof(*p));
    p->num_index_heads = cfg->num_index_heads;
    p->index_dim = cfg->index_dim;
    p->block_size = cfg->block_size;
    p->page_size = cache->cfg.page_size;
    p->log_page_size = cu_log2_page(p->page_size);
    p->index_heads_magic = (65536 + p->num_index_heads - 1) / p->num_index_heads;
    p->score_lse = cfg->score_type == MSA_SCORE_LSE;
    p->index_scale = cfg->index_softmax_scale;
    p->act_dtype = io->act_dtype;
    p->index_dtype = cache->cfg.index_dtype;
    p->cap_pages = st->sz.cap_pages;
    p->cap_blocks = st->sz.cap_blocks;
    p->index_q = io->idx_q;
    p->index_k_plane = cache->planes[(size_t)layer * 4 + MSA_PLANE_INDEX_K];
    p->index_k_strides = cache->strides[(size_t)layer * 4 + MSA_PLANE_INDEX_K];
    p->index_k_scale = cache->scales[(size_t)layer * 4 + MSA_PLANE_INDEX_K];
    p->scores = st->scores;
    p->next_chunk = st->idx_next;
    p->meta = st->dev;
#ifdef MSA_TIMELINE
    p->tl = timeline;
#else
    (void)timeline;
#endif
}

void cu_select_build(const msa_plan *plan, const cu_plan_state *st, int32_t layer,
                     const msa_layer_io *io, int32_t cta_rows_limit, int32_t prefill_ctas,
                     int32_t attention_union_blocks, unsigned long long *timeline,
                     cu_select_params *p)
{
    const msa_model *m = plan->model;
    const msa_model_config *cfg = &m->cfg;
    const msa_cache *cache = plan->cache;
    memset(p, 0, sizeof(*p));
    p->num_kv_heads = cfg->num_kv_heads;
    p->num_index_heads = cfg->num_index_heads;
    p->index_dim = cfg->index_dim;
    p->num_units = p->num_index_heads < p->num_kv_heads ? p->num_index_heads : p->num_kv_heads;
    p->index_heads_per_unit =
        p->num_index_heads >= p->num_kv_heads ? p->num_index_heads / p->num_kv_heads : 1;
    p->kv_heads_per_unit =
        p->num_kv_heads > p->num_index_heads ? p->num_kv_heads / p->num_index_heads : 1;
    p->block_size = cfg->block_size;
    p->page_size = cache->cfg.page_size;
    p->log_page_size = cu_log2_page(p->page_size);
    p->topk_blocks = cfg->topk_blocks;
    p->init_blocks = cfg->init_blocks;
    p->local_blocks = cfg->local_blocks;
    p->topk_width = m->topk_width;
    p->score_lse = cfg->score_type == MSA_SCORE_LSE;
    p->index_scale = cfg->index_softmax_scale;
    p->act_dtype = io->act_dtype;
    p->index_dtype = cache->cfg.index_dtype;
    p->cap_pages = st->sz.cap_pages;
    p->cap_blocks = st->sz.cap_blocks;
    p->cap_union = st->sz.cap_union;
    p->cached_blocks = st->sz.sel_cache;
    p->cta_rows_limit = cta_rows_limit;
    p->prefill_ctas = prefill_ctas;
    p->attention_union_blocks = attention_union_blocks;
    p->index_q = io->idx_q;
    p->index_k_plane = cache->planes[(size_t)layer * 4 + MSA_PLANE_INDEX_K];
    p->index_k_strides = cache->strides[(size_t)layer * 4 + MSA_PLANE_INDEX_K];
    p->index_k_scale = cache->scales[(size_t)layer * 4 + MSA_PLANE_INDEX_K];
    const int ik_copy = cu_is_quantized(p->index_dtype) && st->widen.copy[MSA_PLANE_INDEX_K];
    p->pf_index_k_plane = ik_copy ? st->widen.copy[MSA_PLANE_INDEX_K] : p->index_k_plane;
    p->pf_index_k_strides = ik_copy ? st->widen.strides[MSA_PLANE_INDEX_K] : p->index_k_strides;
    p->pf_index_k_mul = ik_copy ? p->index_k_scale : 1.0f;
    p->scores = st->scores;
    p->selected = st->sel;
    p->topk_ids = io->topk;
    p->union_ids = st->uids;
    p->union_masks = st->umask;
    p->union_counts = st->ucnt;
    p->rows_done = st->sel_done;
    p->prefill_scores = st->pf_scratch;
    p->meta = st->dev;
#ifdef MSA_TIMELINE
    p->tl = timeline;
#else
    (void)timeline;
#endif
}

void cu_attn_build(const msa_plan *plan, const cu_plan_state *st, int32_t layer,
                   const msa_layer_io *io, int kind, int prefill_on_tensor_cores,
                   int32_t attention_union_blocks, unsigned long long *timeline, cu_attn_params *p)
{
    const msa_model *m = plan->model;
    const msa_model_config *cfg = &m->cfg;
    const msa_cache *cache = plan->cache;
    void *const *planes = cache->planes + (size_t)layer * 4;
    memset(p, 0, sizeof(*p));
    p->kind = kind;
    if (kind == CU_KIND_IV) {
        /* Dense multi-query attention over the index planes: every index
         * head reads the one index-K / index-V plane. */
        p->q_heads = cfg->num_index_heads;
        p->kv_heads = 1;
        p->head_dim = cfg->index_dim;
        p->group = cfg->num_index_heads;
        p->scale = cfg->index_softmax_scale;
        p->kv_dtype = cache->cfg.index_dtype;
        p->q = io->idx_q;
        p->k_plane = planes[MSA_PLANE_INDEX_K];
        p->v_plane = planes[MSA_PLANE_INDEX_V];
        p->k_strides = cache->strides[(size_t)layer * 4 + MSA_PLANE_INDEX_K];
        p->v_strides = cache->strides[(size_t)layer * 4 + MSA_PLANE_INDEX_V];
        p->k_scale = cache->scales[(size_t)layer * 4 + MSA_PLANE_INDEX_K];
        p->v_scale = cache->scales[(size_t)layer * 4 + MSA_PLANE_INDEX_V];
        p->out = io->idx_o;
        p->lse = NULL;
        p->sparse = 0;
    } else {
        p->q_heads = cfg->num_q_heads;
        p->kv_heads = cfg->num_kv_heads;
        p->head_dim = cfg->head_dim;
        p->group = m->group;
        p->scale = cfg->softmax_scale;
        p->kv_dtype = cache->cfg.kv_dtype;
        p->q = io->q;
        p->k_plane = planes[MSA_PLANE_K];
        p->v_plane = planes[MSA_PLANE_V];
        p->k_strides = cache->strides[(size_t)layer * 4 + MSA_PLANE_K];
        p->v_strides = cache->strides[(size_t)layer * 4 + MSA_PLANE_V];
        p->k_scale = cache->scales[(size_t)layer * 4 + MSA_PLANE_K];
        p->v_scale = cache->scales[(size_t)layer * 4 + MSA_PLANE_V];
        p->out = io->o;
        p->lse = io->lse;
        p->sparse = kind == CU_KIND_SPARSE;
    }
    /* The prefill kernels' planes: the 16-bit copies of quantized ones. */
    const int kp = kind == CU_KIND_IV ? MSA_PLANE_INDEX_K : MSA_PLANE_K;
    const int vp = kind == CU_KIND_IV ? MSA_PLANE_INDEX_V : MSA_PLANE_V;
    const int copies = cu_is_quantized(p->kv_dtype) && st->widen.copy[kp] && st->widen.copy[vp];
    p->pf_k_plane = copies ? st->widen.copy[kp] : p->k_plane;
    p->pf_v_plane = copies ? st->widen.copy[vp] : p->v_plane;
    p->pf_k_strides = copies ? st->widen.strides[kp] : p->k_strides;
    p->pf_v_strides = copies ? st->widen.strides[vp] : p->v_strides;
    p->pf_k_mul = copies ? p->k_scale : 1.0f;
    p->pf_v_mul = copies ? p->v_scale : 1.0f;
    p->act_dtype = io->act_dtype;
    p->block_size = cfg->block_size;
    p->topk_width = m->topk_width;
    p->prefill_on_tensor_cores = prefill_on_tensor_cores;
    p->layer_kv_heads = cfg->num_kv_heads;
    p->topk_blocks = cfg->topk_blocks;
    p->page_size = cache->cfg.page_size;
    p->log_page_size = cu_log2_page(p->page_size);
    p->cap_pages = st->sz.cap_pages;
    p->cap_union = st->sz.cap_union;
    p->attention_union_blocks = attention_union_blocks;
    p->partial_stride = st->sz.part_stride;
    p->partials = st->part;
    p->selected = st->sel;
    p->union_ids = st->uids;
    p->union_masks = st->umask;
    p->union_counts = st->ucnt;
    p->meta = st->dev;
#ifdef MSA_TIMELINE
    p->tl = timeline;
#else
    (void)timeline;
#endif
}
