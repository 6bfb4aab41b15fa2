/*
 * Geometry of a cache plane in the layouts of msa.h, computed in one place
 * for every verb that fills or reads planes directly.
 */
#ifndef MSA_TOOLS_PLANE_H
#define MSA_TOOLS_PLANE_H

#include <stddef.h>
#include <stdint.h>

#include "msa/msa.h"

typedef struct plane_geom {
    msa_dtype dtype;
    int64_t units;      /* regions: (page, KV head) for K/V, pages for index planes */
    int64_t unit_elems; /* values per region: page_size * head dim */
    size_t bytes;       /* whole plane; 0 when the layer has no such plane */
} plane_geom;

/* Plane p of `layer` in a pool configured as `cache`. */
void plane_geometry(const msa_model *model, int32_t layer, const msa_cache_config *cache,
                    msa_plane p, plane_geom *g);

#endif
