/* Stage 1: the step's k, v, idx_k, idx_v rows go into their cache slots
 * (converted to the plane's format) before any attention reads them. */
#include "cpu/cpu_kernels.h"

#include "core/quant.h"

#include <string.h>

typedef struct write_job {
    const msa_plan *plan;
    const msa_layer_io *io;
    int32_t layer;
} write_job;

/* Quantizes one row of `dim` activations into the row of (page, head,
 * off) of an fp8_e4m3 or nvfp4 plane, with the plane's scale. */
static void store_quant_row(const cpu_plane *pl, int32_t page, int32_t head, int32_t off,
                            const void *src, msa_dtype act, int64_t src_off)
{
    const size_t es = msa_dtype_size(act);
    const char *s = (const char *)src + src_off * (int64_t)es;
    const int32_t dim = pl->dim;
    uint8_t *codes, *scales = NULL;
    if (pl->dtype == MSA_DTYPE_NVFP4) {
        const uint8_t *c, *sc;
        cpu_plane_nvfp4_row(pl, page, head, off, &c, &sc);
        codes = (uint8_t *)c;
        scales = (uint8_t *)sc;
    } else {
        codes = (uint8_t *)cpu_plane_row(pl, page, head, off);
    }
    /* Pieces of 512 elements: whole NVFP4 groups (dim is a multiple of 16). */
    float tmp[512];
    for (int32_t d0 = 0; d0 < dim; d0 += 512) {
        int32_t n = dim - d0 < 512 ? dim - d0 : 512;
        msa_convert_to_f32(tmp, s + (int64_t)d0 * (int64_t)es, act, n);
        if (pl->dtype == MSA_DTYPE_NVFP4)
            msa_nvfp4_quantize(codes + d0 / 2, scales + d0 / MSA_NVFP4_GROUP, tmp, n, pl->scale);
        else
            msa_fp8_quantize(codes + d0, tmp, n, pl->scale);
    }
}

/* Converts one row of `dim` activations into the row of (page, head, off). */
static void store_row(const cpu_plane *pl, int32_t page, int32_t head, int32_t off, const void *src,
                      msa_dtype act, int64_t src_off)
{
    if (cpu_plane_quantized(pl)) {
        store_quant_row(pl, page, head, off, src, act, src_off);
        return;
    }
    const msa_dtype plane_dtype = pl->dtype;
    const int32_t dim = pl->dim;
    void *dst = (void *)cpu_plane_row(pl, page, head, off);
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
    const cpu_plane kp = cpu_plane_of(c, L, MSA_PLANE_K), vp = cpu_plane_of(c, L, MSA_PLANE_V);
    cpu_plane ik, iv;
    if (sparse)
        ik = cpu_plane_of(c, L, MSA_PLANE_INDEX_K);
    if (ivalue)
        iv = cpu_plane_of(c, L, MSA_PLANE_INDEX_V);
    int64_t rows = p->active_tokens;
    int64_t lo = rows * ith / nth, hi = rows * (ith + 1) / nth;
    for (int64_t t = lo; t < hi; t++) {
        int32_t r = p->token_request[t];
        int64_t pos = p->token_pos[t];
        int32_t page = p->page_table[(int64_t)r * p->cap_pages_per_request + pos / P];
        int32_t off = (int32_t)(pos % P);
        for (int32_t g = 0; g < Hkv; g++) {
            store_row(&kp, page, g, off, io->k, io->act_dtype, (t * Hkv + g) * D);
            store_row(&vp, page, g, off, io->v, io->act_dtype, (t * Hkv + g) * D);
        }
        if (sparse)
            store_row(&ik, page, 0, off, io->idx_k, io->act_dtype, t * Di);
        if (ivalue)
            store_row(&iv, page, 0, off, io->idx_v, io->act_dtype, t * Di);
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
    const int packed = cpu_plane_packed(plane);
    const int64_t step = plane->row_stride * (int64_t)msa_dtype_size(plane->dtype);
    int32_t i = 0;
    while (i < n) {
        int64_t j = j0 + i;
        int32_t off = (int32_t)(j % P);
        int32_t run = P - off < n - i ? P - off : n - i;
        const char *src = cpu_plane_row(plane, page_row[j / P], head, off);
        char *out = (char *)dst + (size_t)i * row_bytes;
        if (packed) /* the run is one block */
            memcpy(out, src, (size_t)run * row_bytes);
        else
            for (int32_t k = 0; k < run; k++)
                memcpy(out + (size_t)k * row_bytes, src + k * step, row_bytes);
        i += run;
    }
}

void msa_cpu_dequant_rows(float *dst, const cpu_plane *plane, const int32_t *page_row, int32_t head,
                          int64_t j0, int32_t n)
{
    const int32_t P = plane->page_size, dim = plane->dim;
    int32_t i = 0;
    while (i < n) {
        int64_t j = j0 + i;
        int32_t off = (int32_t)(j % P);
        int32_t run = P - off < n - i ? P - off : n - i;
        int32_t page = page_row[j / P];
        /* The rows of one page and head are consecutive in both arrays of
         * the region, so a run is one call. */
        if (plane->dtype == MSA_DTYPE_NVFP4) {
            const uint8_t *codes, *scales;
            cpu_plane_nvfp4_row(plane, page, head, off, &codes, &scales);
            msa_nvfp4_dequantize(dst + (int64_t)i * dim, codes, scales, (int64_t)run * dim,
                                 plane->scale);
        } else {
            msa_fp8_dequantize(dst + (int64_t)i * dim,
                               (const uint8_t *)cpu_plane_row(plane, page, head, off),
                               (int64_t)run * dim, plane->scale);
        }
        i += run;
    }
}
