/* Stage 1: the step's k, v, idx_k, idx_v rows go into their cache slots
 * (converted to the plane's format) before any attention reads them. */
#include "cpu/cpu_kernels.h"

#include <string.h>

typedef struct write_job {
    const msa_plan *plan;
    const msa_layer_io *io;
    int32_t layer;
} write_job;

/* Converts one row of `dim` activations into a plane row. */
static void store_row(void *dst, msa_dtype plane_dtype, const void *src, msa_dtype act,
                      int64_t src_off, int32_t dim)
{
    size_t es = msa_dtype_size(act);
    const char *s = (const char *)src + src_off * (int64_t)es;
    if (plane_dtype == act) {
        memcpy(dst, s, (size_t)dim * es);
        return;
    }
    float tmp[512];
    for (int32_t d0 = 0; d0 < dim; d0 += 512) {
        int32_t n = dim - d0 < 512 ? dim - d0 : 512;
        msa_convert_to_f32(tmp, s + (int64_t)d0 * es, act, n);
        msa_convert_from_f32((char *)dst + (int64_t)d0 * msa_dtype_size(plane_dtype), plane_dtype,
                             tmp, n);
    }
}

static void write_work(void *arg, int ith, int nth)
{
    const write_job *job = arg;
    const msa_plan *p = job->plan;
    const msa_model *m = p->model;
    const msa_cache *c = p->cache;
    const msa_layer_io *io = job->io;
    const int32_t L = job->layer, P = c->cfg.page_size;
    const int32_t Hkv = m->cfg.num_kv_heads, D = m->cfg.head_dim, Di = m->cfg.index_dim;
    const int sparse = m->layer_sparse[L], ivalue = m->layer_index_value[L];
    int64_t rows = p->active_tokens;
    int64_t lo = rows * ith / nth, hi = rows * (ith + 1) / nth;
    for (int64_t t = lo; t < hi; t++) {
        int32_t r = p->token_request[t];
        int64_t pos = p->token_pos[t];
        int32_t page = p->page_table[(int64_t)r * p->cap_pages_per_request + pos / P];
        int32_t off = (int32_t)(pos % P);
        for (int32_t g = 0; g < Hkv; g++) {
            cpu_plane kp = {c->planes[L * 4 + MSA_PLANE_K], c->cfg.kv_dtype, Hkv, D, P};
            cpu_plane vp = {c->planes[L * 4 + MSA_PLANE_V], c->cfg.kv_dtype, Hkv, D, P};
            store_row((void *)cpu_plane_row(&kp, page, g, off), kp.dtype, io->k, io->act_dtype,
                      (t * Hkv + g) * D, D);
            store_row((void *)cpu_plane_row(&vp, page, g, off), vp.dtype, io->v, io->act_dtype,
                      (t * Hkv + g) * D, D);
        }
        if (sparse) {
            cpu_plane ik = {c->planes[L * 4 + MSA_PLANE_INDEX_K], c->cfg.index_dtype, 1, Di, P};
            store_row((void *)cpu_plane_row(&ik, page, 0, off), ik.dtype, io->idx_k, io->act_dtype,
                      t * Di, Di);
        }
        if (ivalue) {
            cpu_plane iv = {c->planes[L * 4 + MSA_PLANE_INDEX_V], c->cfg.index_dtype, 1, Di, P};
            store_row((void *)cpu_plane_row(&iv, page, 0, off), iv.dtype, io->idx_v, io->act_dtype,
                      t * Di, Di);
        }
    }
}

void msa_cpu_write_cache(msa_context *ctx, msa_plan *plan, int32_t layer, const msa_layer_io *io)
{
    write_job job = {plan, io, layer};
    msa_threadpool_run(ctx->pool, write_work, &job);
}

void msa_cpu_copy_rows(void *dst, const cpu_plane *plane, const int32_t *page_row, int32_t head,
                       int64_t j0, int32_t n)
{
    const int32_t P = plane->page_size;
    const size_t row_bytes = (size_t)plane->dim * msa_dtype_size(plane->dtype);
    int32_t i = 0;
    while (i < n) {
        int64_t j = j0 + i;
        int32_t off = (int32_t)(j % P);
        int32_t run = P - off < n - i ? P - off : n - i;
        memcpy((char *)dst + (size_t)i * row_bytes,
               cpu_plane_row(plane, page_row[j / P], head, off), (size_t)run * row_bytes);
        i += run;
    }
}
