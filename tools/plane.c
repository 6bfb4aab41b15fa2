#include "plane.h"

#include "elem.h"

void plane_geometry(const msa_model *model, int32_t layer, const msa_cache_config *cache,
                    msa_plane p, plane_geom *g)
{
    msa_model_config cfg;
    msa_model_get_config(model, &cfg);
    int main_plane = p == MSA_PLANE_K || p == MSA_PLANE_V;
    int present = main_plane ||
                  (msa_model_layer_is_sparse(model, layer) &&
                   (p == MSA_PLANE_INDEX_K || msa_model_layer_has_index_value(model, layer)));
    g->dtype = main_plane ? cache->kv_dtype : cache->index_dtype;
    g->units = cache->num_pages * (main_plane ? cfg.num_kv_heads : 1);
    g->unit_elems = (int64_t)cache->page_size * (main_plane ? cfg.head_dim : cfg.index_dim);
    g->bytes = present ? elem_plane_bytes(g->dtype, g->units, g->unit_elems) : 0;
}
