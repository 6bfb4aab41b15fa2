/* The paged KV pool: per-layer planes, geometry, scales. */
#include "core/internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void msa_cache_config_default(msa_cache_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->num_pages = 0;
    cfg->page_size = 128;
    cfg->kv_dtype = MSA_DTYPE_BF16;
    cfg->index_dtype = MSA_DTYPE_BF16;
}

int32_t msa_plane_dim(const msa_model *model, msa_plane plane)
{
    return plane == MSA_PLANE_K || plane == MSA_PLANE_V ? model->cfg.head_dim
                                                        : model->cfg.index_dim;
}

int msa_layer_has_plane(const msa_model *model, int32_t layer, msa_plane plane)
{
    switch (plane) {
    case MSA_PLANE_K:
    case MSA_PLANE_V: return 1;
    case MSA_PLANE_INDEX_K: return model->layer_sparse[layer];
    case MSA_PLANE_INDEX_V: return model->layer_index_value[layer];
    }
    return 0;
}

/* Bytes of one (page, head) tile of P tokens x dim elements. */
static size_t tile_bytes(msa_dtype dtype, int64_t page_size, int64_t dim)
{
    int64_t n = page_size * dim;
    if (dtype == MSA_DTYPE_NVFP4) /* two codes per byte + one E4M3 scale per 16 */
        return (size_t)(n / 2 + n / 16);
    return (size_t)n * msa_dtype_size(dtype);
}

size_t msa_plane_bytes_for(const msa_model *model, const msa_cache_config *cfg, int32_t layer,
                           msa_plane plane)
{
    if (!msa_layer_has_plane(model, layer, plane))
        return 0;
    int main_plane = plane == MSA_PLANE_K || plane == MSA_PLANE_V;
    msa_dtype dt = main_plane ? cfg->kv_dtype : cfg->index_dtype;
    int64_t heads = main_plane ? model->cfg.num_kv_heads : 1;
    size_t tile = tile_bytes(dt, cfg->page_size, msa_plane_dim(model, plane));
    /* Sizes were bounded by validate_cache_config, so no overflow here. */
    return tile * (size_t)heads * (size_t)cfg->num_pages;
}

static int is_storage_dtype(msa_dtype d)
{
    return d == MSA_DTYPE_FP32 || d == MSA_DTYPE_BF16 || d == MSA_DTYPE_FP16 ||
           d == MSA_DTYPE_FP8_E4M3 || d == MSA_DTYPE_NVFP4;
}

static int is_quantized(msa_dtype d)
{
    return d == MSA_DTYPE_FP8_E4M3 || d == MSA_DTYPE_NVFP4;
}

static int has_index_planes(const msa_model *model)
{
    for (int32_t l = 0; l < model->cfg.num_layers; l++)
        if (model->layer_sparse[l])
            return 1;
    return 0;
}

static msa_status validate_cache_config(msa_context *ctx, const msa_model *model,
                                        const msa_cache_config *cfg)
{
    if (cfg->num_pages < 1 || cfg->num_pages > (INT64_C(1) << 31))
        return msa_set_error(ctx, MSA_ERR_INVALID_CONFIG, "num_pages must be in 1..2^31 (got %lld)",
                             (long long)cfg->num_pages);
    int32_t p = cfg->page_size;
    if (p < 1 || p > 256 || (p & (p - 1)) != 0)
        return msa_set_error(ctx, MSA_ERR_INVALID_CONFIG,
                             "page_size must be a power of two in 1..256 (got %d)", p);
    if (!is_storage_dtype(cfg->kv_dtype) || !is_storage_dtype(cfg->index_dtype))
        return msa_set_error(ctx, MSA_ERR_INVALID_CONFIG, "unknown cache dtype");
    /* The index dtype matters only when some layer has index planes. */
    /* Both backends read and write fp8_e4m3 and nvfp4 planes. */
    const int index_planes = has_index_planes(model);
    /* An NVFP4 group is 16 consecutive elements of one token's row. */
    if (cfg->kv_dtype == MSA_DTYPE_NVFP4 && model->cfg.head_dim % 16 != 0)
        return msa_set_error(ctx, MSA_ERR_INVALID_CONFIG,
                             "nvfp4 main planes need head_dim a multiple of 16 (got %d)",
                             model->cfg.head_dim);
    if (index_planes && cfg->index_dtype == MSA_DTYPE_NVFP4 && model->cfg.index_dim % 16 != 0)
        return msa_set_error(ctx, MSA_ERR_INVALID_CONFIG,
                             "nvfp4 index planes need index_dim a multiple of 16 (got %d)",
                             model->cfg.index_dim);
    /* Bound every plane below 2^46 bytes so size arithmetic cannot overflow. */
    int64_t dim = model->cfg.head_dim > model->cfg.index_dim ? model->cfg.head_dim
                                                             : model->cfg.index_dim;
    double bytes = (double)cfg->num_pages * p * dim * model->cfg.num_kv_heads * 4.0;
    if (bytes > (double)(INT64_C(1) << 46))
        return msa_set_error(ctx, MSA_ERR_INVALID_CONFIG, "cache plane would exceed 2^46 bytes");
    return MSA_OK;
}

msa_plane_strides msa_plane_library_strides(const msa_model *model, const msa_cache_config *cfg,
                                            msa_plane plane)
{
    const int main_plane = plane == MSA_PLANE_K || plane == MSA_PLANE_V;
    const int64_t heads = main_plane ? model->cfg.num_kv_heads : 1;
    const int64_t row = msa_plane_dim(model, plane);
    msa_plane_strides s;
    s.token = row;
    s.head = row * cfg->page_size;
    s.page = s.head * heads;
    return s;
}

int msa_cache_layer_is_library_layout(const msa_cache *cache, int32_t layer)
{
    for (int pl = 0; pl < 4; pl++) {
        if (!msa_layer_has_plane(cache->model, layer, (msa_plane)pl))
            continue;
        const msa_plane_strides want =
            msa_plane_library_strides(cache->model, &cache->cfg, (msa_plane)pl);
        const msa_plane_strides got = cache->strides[layer * 4 + pl];
        if (got.page != want.page || got.token != want.token ||
            (pl < 2 && cache->model->cfg.num_kv_heads > 1 && got.head != want.head))
            return 0;
    }
    return 1;
}

static msa_status cache_alloc_struct(msa_context *ctx, const msa_model *model,
                                     const msa_cache_config *cfg, msa_cache **out)
{
    size_t n = (size_t)model->cfg.num_layers * 4;
    msa_cache *c = calloc(1, sizeof *c);
    if (c) {
        c->planes = calloc(n, sizeof *c->planes);
        c->plane_bytes = calloc(n, sizeof *c->plane_bytes);
        c->scales = malloc(n * sizeof *c->scales);
        c->strides = calloc(n, sizeof *c->strides);
    }
    if (!c || !c->planes || !c->plane_bytes || !c->scales || !c->strides) {
        if (c) {
            free(c->planes);
            free(c->plane_bytes);
            free(c->scales);
            free(c->strides);
        }
        free(c);
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY, "cache: out of memory");
    }
    c->ctx = ctx;
    c->model = model;
    c->cfg = *cfg;
    for (size_t i = 0; i < n; i++)
        c->scales[i] = 1.0f;
    for (int32_t l = 0; l < model->cfg.num_layers; l++)
        for (int pl = 0; pl < 4; pl++) {
            c->plane_bytes[l * 4 + pl] = msa_plane_bytes_for(model, cfg, l, (msa_plane)pl);
            c->strides[l * 4 + pl] = msa_plane_library_strides(model, cfg, (msa_plane)pl);
        }
    *out = c;
    return MSA_OK;
}

msa_status msa_cache_create(msa_context *ctx, const msa_model *model, const msa_cache_config *cfg,
                            msa_cache **out)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    if (!model || !cfg || !out)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "msa_cache_create: NULL argument");
    *out = NULL;
    msa_status st = validate_cache_config(ctx, model, cfg);
    if (st != MSA_OK)
        return st;
    msa_cache *c;
    if ((st = cache_alloc_struct(ctx, model, cfg, &c)) != MSA_OK)
        return st;
    c->owns_memory = 1;
    for (int32_t i = 0; i < model->cfg.num_layers * 4; i++) {
        if (!c->plane_bytes[i])
            continue;
        st = ctx->ops->alloc(ctx, c->plane_bytes[i], &c->planes[i]);
        if (st != MSA_OK) {
            msa_cache_free(c);
            return msa_set_error(ctx, st, "cache: cannot allocate %zu bytes for layer %d plane %d",
                                 msa_plane_bytes_for(model, cfg, i / 4, (msa_plane)(i % 4)), i / 4,
                                 i % 4);
        }
    }
    msa_clear_error(ctx);
    *out = c;
    return MSA_OK;
}

/* Largest extent of a wrapped plane, in bytes (the bound of
 * validate_cache_config, so that offsets stay far from overflow). */
#define MSA_PLANE_MAX_BYTES (INT64_C(1) << 46)

static const char *const plane_names[4] = {"K", "V", "index K", "index V"};

/* Checks the strides of one plane with explicit strides and computes its
 * extent: ordered by stride, each dimension of more than one entry must
 * step at least over everything the smaller ones span, which is what keeps
 * two (page, head, slot) rows from sharing an element.  *bytes gets the
 * extent from the first element to the end of the last row. */
static msa_status check_plane_strides(msa_context *ctx, const char *fn, int32_t layer, int pl,
                                      const msa_plane_view *v, int64_t heads, int64_t dim,
                                      int64_t pages, int64_t page_size, size_t es, size_t *bytes)
{
    const char *name = plane_names[pl];
    int64_t stride[3] = {v->page_stride, heads > 1 ? v->head_stride : 1, v->token_stride};
    int64_t count[3] = {pages, heads, page_size};
    const char *what[3] = {"page", "head", "token"};
    for (int i = 0; i < 3; i++)
        if (stride[i] <= 0)
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                 "%s: layer %d plane %s: %s stride %lld must be positive (or "
                                 "all strides 0 for the library layout)",
                                 fn, layer, name, what[i], (long long)stride[i]);
    /* Insertion sort of the three dimensions by stride. */
    int order[3] = {0, 1, 2};
    for (int i = 1; i < 3; i++)
        for (int j = i; j > 0 && stride[order[j]] < stride[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    const int64_t limit = MSA_PLANE_MAX_BYTES / (int64_t)es;
    int64_t extent = dim; /* elements spanned by the dimensions so far */
    for (int k = 0; k < 3; k++) {
        const int i = order[k];
        if (count[i] == 1)
            continue;
        if (stride[i] < extent)
            return msa_set_error(
                ctx, MSA_ERR_INVALID_ARGUMENT,
                "%s: layer %d plane %s: %s stride %lld is below the %lld elements that one %s "
                "spans (rows of %lld elements and the smaller strides), so rows would overlap",
                fn, layer, name, what[i], (long long)stride[i], (long long)extent, what[i],
                (long long)dim);
        if (stride[i] > (limit - extent) / (count[i] - 1))
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                 "%s: layer %d plane %s spans more than 2^46 bytes", fn, layer,
                                 name);
        extent += stride[i] * (count[i] - 1);
    }
    *bytes = (size_t)extent * es;
    return MSA_OK;
}

/* msa_cache_wrap and msa_cache_wrap_strided: every check, then the cache. */
static msa_status wrap_views(msa_context *ctx, const msa_model *model, const msa_cache_config *cfg,
                             const msa_plane_view *views, msa_cache **out, const char *fn)
{
    const int32_t L = model->cfg.num_layers;
    for (int32_t l = 0; l < L; l++)
        for (int pl = 0; pl < 4; pl++)
            if (msa_layer_has_plane(model, l, (msa_plane)pl) && !views[l * 4 + pl].data)
                return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "%s: layer %d plane %d is NULL",
                                     fn, l, pl);
    size_t *bytes = calloc((size_t)L * 4, sizeof *bytes);
    if (!bytes)
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    msa_status st = MSA_OK;
    for (int32_t l = 0; l < L && st == MSA_OK; l++)
        for (int pl = 0; pl < 4 && st == MSA_OK; pl++) {
            if (!msa_layer_has_plane(model, l, (msa_plane)pl))
                continue;
            const msa_plane_view *v = &views[l * 4 + pl];
            const msa_dtype dt = pl < 2 ? cfg->kv_dtype : cfg->index_dtype;
            const int64_t heads = pl < 2 ? model->cfg.num_kv_heads : 1;
            const int library = v->page_stride == 0 && v->token_stride == 0 &&
                                (heads == 1 || v->head_stride == 0);
            if (!library && is_quantized(dt)) {
                st = msa_set_error(ctx, MSA_ERR_UNSUPPORTED,
                                   "%s: layer %d plane %s: %s planes take only the library "
                                   "layout (strides 0)",
                                   fn, l, plane_names[pl], msa_dtype_name(dt));
                break;
            }
            if (!library)
                st = check_plane_strides(ctx, fn, l, pl, v, heads,
                                         msa_plane_dim(model, (msa_plane)pl), cfg->num_pages,
                                         cfg->page_size, msa_dtype_size(dt), &bytes[l * 4 + pl]);
            if (st != MSA_OK)
                break;
            /* The CPU kernels read plane elements one at a time; the CUDA
             * kernels copy cache rows in 16-byte pieces (cp.async, tensor
             * maps), so a CUDA row starts on a 16-byte boundary (cudaMalloc
             * gives 256). */
            size_t align = msa_dtype_size(dt);
            if (ctx->backend == MSA_BACKEND_CUDA)
                align = 16;
            if (align > 1 && (uintptr_t)v->data % align != 0) {
                st = msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                   "%s: layer %d plane %d at %p is not aligned to %zu "
                                   "bytes (%s planes, %s backend)",
                                   fn, l, pl, v->data, align, msa_dtype_name(dt),
                                   msa_backend_name(ctx->backend));
                break;
            }
            const int64_t s[3] = {v->page_stride, heads > 1 ? v->head_stride : 0, v->token_stride};
            for (int i = 0; i < 3 && !library && ctx->backend == MSA_BACKEND_CUDA; i++)
                if ((s[i] * (int64_t)msa_dtype_size(dt)) % 16 != 0) {
                    st = msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                       "%s: layer %d plane %s: %s stride of %lld bytes is not a "
                                       "multiple of 16 (the CUDA kernels copy rows in 16-byte "
                                       "pieces)",
                                       fn, l, plane_names[pl],
                                       i == 0   ? "page"
                                       : i == 1 ? "head"
                                                : "token",
                                       (long long)(s[i] * (int64_t)msa_dtype_size(dt)));
                    break;
                }
        }
    msa_cache *c = NULL;
    if (st == MSA_OK)
        st = cache_alloc_struct(ctx, model, cfg, &c);
    if (st != MSA_OK) {
        free(bytes);
        return st;
    }
    for (int32_t i = 0; i < L * 4; i++) {
        const msa_plane_view *v = &views[i];
        c->planes[i] = c->plane_bytes[i] ? v->data : NULL;
        if (!bytes[i])
            continue; /* the library layout */
        c->plane_bytes[i] = bytes[i];
        c->strides[i].page = v->page_stride;
        c->strides[i].head = i % 4 < 2 && model->cfg.num_kv_heads > 1 ? v->head_stride : 0;
        c->strides[i].token = v->token_stride;
    }
    free(bytes);
    msa_clear_error(ctx);
    *out = c;
    return MSA_OK;
}

msa_status msa_cache_wrap(msa_context *ctx, const msa_model *model, const msa_cache_config *cfg,
                          void *const *planes, msa_cache **out)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    if (!model || !cfg || !planes || !out)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "msa_cache_wrap: NULL argument");
    *out = NULL;
    msa_status st = validate_cache_config(ctx, model, cfg);
    if (st != MSA_OK)
        return st;
    const size_t n = (size_t)model->cfg.num_layers * 4;
    msa_plane_view *views = calloc(n, sizeof *views);
    if (!views)
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY, "msa_cache_wrap: out of memory");
    for (size_t i = 0; i < n; i++)
        views[i].data = planes[i];
    st = wrap_views(ctx, model, cfg, views, out, "msa_cache_wrap");
    free(views);
    return st;
}

msa_status msa_cache_wrap_strided(msa_context *ctx, const msa_model *model,
                                  const msa_cache_config *cfg, const msa_plane_view *views,
                                  msa_cache **out)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    if (!model || !cfg || !views || !out)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "msa_cache_wrap_strided: NULL argument");
    *out = NULL;
    msa_status st = validate_cache_config(ctx, model, cfg);
    if (st != MSA_OK)
        return st;
    return wrap_views(ctx, model, cfg, views, out, "msa_cache_wrap_strided");
}

void msa_cache_free(msa_cache *cache)
{
    if (!cache)
        return;
    if (cache->owns_memory)
        for (int32_t i = 0; i < cache->model->cfg.num_layers * 4; i++)
            if (cache->planes[i])
                cache->ctx->ops->free(cache->ctx, cache->planes[i]);
    free(cache->planes);
    free(cache->plane_bytes);
    free(cache->scales);
    free(cache->strides);
    free(cache);
}

void msa_cache_get_config(const msa_cache *cache, msa_cache_config *cfg)
{
    if (cache && cfg)
        *cfg = cache->cfg;
}

static int plane_index_ok(const msa_cache *cache, int32_t layer, msa_plane plane)
{
    return cache && layer >= 0 && layer < cache->model->cfg.num_layers && (unsigned)plane < 4u;
}

size_t msa_cache_plane_bytes(const msa_cache *cache, int32_t layer, msa_plane plane)
{
    return plane_index_ok(cache, layer, plane) ? cache->plane_bytes[layer * 4 + plane] : 0;
}

void *msa_cache_plane_data(const msa_cache *cache, int32_t layer, msa_plane plane)
{
    return plane_index_ok(cache, layer, plane) ? cache->planes[layer * 4 + plane] : NULL;
}

msa_status msa_cache_set_scales(msa_cache *cache, int32_t layer, float k_scale, float v_scale,
                                float index_k_scale, float index_v_scale)
{
    if (!cache)
        return MSA_ERR_INVALID_ARGUMENT;
    msa_context *ctx = cache->ctx;
    if (layer < 0 || layer >= cache->model->cfg.num_layers)
        return msa_set_error(ctx, MSA_ERR_OUT_OF_RANGE, "layer %d out of range 0..%d", layer,
                             cache->model->cfg.num_layers - 1);
    const float s[4] = {k_scale, v_scale, index_k_scale, index_v_scale};
    for (int i = 0; i < 4; i++)
        if (!(s[i] > 0.0f) || isinf(s[i]))
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                 "cache scales must be finite and positive");
    memcpy(&cache->scales[layer * 4], s, sizeof s);
    msa_clear_error(ctx);
    return MSA_OK;
}
