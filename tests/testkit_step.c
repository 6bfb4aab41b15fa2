/*
 * Builds the host side of one case: page tables, activations and the cache
 * images before and after the step.  The "after" image is what a correct
 * library leaves in the pool; the test compares the real pool with it and
 * runs the oracle on the real pool.
 */
#include "testkit_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Spare pool pages that no request uses: reading them is a bug. */
#define TK_SPARE_PAGES 3
/* Scale of the values left in slots no request owns. */
#define TK_GARBAGE_SCALE 3.0f
/* Strength of the duplicated block in tie cases, so it outranks the rest. */
#define TK_TIE_BOOST 3.0f

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "testkit: out of memory\n");
        abort();
    }
    return p;
}

static float *random_rows(tk_rng *rng, msa_dtype act, int64_t rows, size_t width)
{
    size_t n = (size_t)rows * width;
    float *x = xcalloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = tk_round_act(act, tk_rng_gauss(rng));
    return x;
}

static void fill_layer(const msa_case *c, tk_step *s)
{
    msa_oracle_layer *L = &s->layer;
    L->Hq = c->Hq;
    L->Hkv = c->Hkv;
    L->D = c->D;
    L->Hi = c->Hi;
    L->Di = c->Di;
    L->block = c->block;
    L->topk = c->topk;
    L->init_blocks = c->init_blocks;
    L->local_blocks = c->local_blocks;
    L->score_lse = c->score_lse;
    L->sparse = c->sparse;
    L->index_value = c->sparse && c->index_value;
    /* The API carries scales as float, so the defaults are rounded the same way. */
    L->scale = c->scale > 0 ? (double)c->scale : (double)(float)(1.0 / sqrt((double)c->D));
    L->index_scale = c->index_scale > 0 ? (double)c->index_scale
                                        : (double)(float)(1.0 / sqrt((double)c->Di));
}

static void fill_planes(const msa_case *c, tk_step *s)
{
    const float scales[4] = {c->k_scale, c->v_scale, c->index_k_scale, c->index_v_scale};
    s->has_plane[MSA_PLANE_K] = 1;
    s->has_plane[MSA_PLANE_V] = 1;
    s->has_plane[MSA_PLANE_INDEX_K] = s->layer.sparse;
    s->has_plane[MSA_PLANE_INDEX_V] = s->layer.index_value;
    for (int p = 0; p < 4; p++) {
        tk_plane *pl = &s->plane[p];
        int index = p >= MSA_PLANE_INDEX_K;
        pl->dtype = index ? c->index_dtype : c->kv_dtype;
        pl->heads = index ? 1 : c->Hkv;
        pl->dim = index ? c->Di : c->D;
        pl->page_size = c->page_size;
        pl->pages = s->num_pages;
        pl->scale = scales[p] > 0 ? scales[p] : 1.0f;
    }
}

/* Requests, rows and page tables. */
static int build_layout(const msa_case *c, int64_t min_pages, tk_step *s, tk_rng *rng, char *err,
                        size_t n)
{
    const int R = c->num_requests, P = c->page_size;
    s->R = R;
    s->page_size = P;
    s->q_len = xcalloc((size_t)R, sizeof(int));
    s->kv_len = xcalloc((size_t)R, sizeof(int));
    s->row0 = xcalloc((size_t)R + 1, sizeof(int64_t));
    int *pages = xcalloc((size_t)R, sizeof(int));
    int max_pages = 0;
    for (int r = 0; r < R; r++) {
        s->q_len[r] = c->q_len[r];
        s->kv_len[r] = c->kv_len[r];
        if (c->q_len[r] < 0 || c->kv_len[r] < c->q_len[r]) {
            snprintf(err, n, "case has bad lengths for request %d", r);
            free(pages);
            return -1;
        }
        s->row0[r + 1] = s->row0[r] + c->q_len[r];
        pages[r] = (c->kv_len[r] + P - 1) / P;
        if (pages[r] > max_pages)
            max_pages = pages[r];
        if (c->kv_len[r] > s->max_kv)
            s->max_kv = c->kv_len[r];
    }
    s->active = s->row0[R];
    s->rows = s->active + c->padding_rows;

    /* Prefix sharing: every request whose cached prefix holds at least one
     * full page shares the first `shared` pages of the first such request.
     * Only pages wholly inside every sharer's prefix qualify, so the step
     * never writes into a shared page. */
    int shared = 0, sharers = 0, first_sharer = -1;
    if (c->share_prefix) {
        for (int r = 0; r < R; r++) {
            int full = (c->kv_len[r] - c->q_len[r]) / P;
            if (full < 1)
                continue;
            if (first_sharer < 0 || full < shared)
                shared = full;
            if (first_sharer < 0)
                first_sharer = r;
            sharers++;
        }
        if (sharers < 2)
            shared = 0;
    }

    int64_t needed = 0;
    for (int r = 0; r < R; r++)
        needed += pages[r];
    if (shared > 0)
        needed -= (int64_t)(sharers - 1) * shared;
    s->num_pages = needed + TK_SPARE_PAGES;
    if (s->num_pages < min_pages)
        s->num_pages = min_pages;

    /* Physical ids handed out in this order: identity or shuffled. */
    int32_t *order = xcalloc((size_t)s->num_pages, sizeof(int32_t));
    for (int64_t i = 0; i < s->num_pages; i++)
        order[i] = (int32_t)i;
    if (c->shuffle_pages) {
        for (int64_t i = s->num_pages - 1; i > 0; i--) {
            int64_t j = (int64_t)(tk_rng_next(rng) % (uint64_t)(i + 1));
            int32_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
    }

    /* One spare column keeps the stride different from the row length. */
    s->stride = max_pages + 1;
    s->table = xcalloc((size_t)(R ? R : 1) * (size_t)s->stride, sizeof(int32_t));
    for (int64_t i = 0; i < (int64_t)(R ? R : 1) * s->stride; i++)
        s->table[i] = -1;
    int64_t next = 0;
    for (int r = 0; r < R; r++) {
        int full = (c->kv_len[r] - c->q_len[r]) / P;
        int shares = shared > 0 && r != first_sharer && full >= 1;
        for (int pg = 0; pg < pages[r]; pg++) {
            if (shares && pg < shared)
                s->table[(int64_t)r * s->stride + pg] =
                    s->table[(int64_t)first_sharer * s->stride + pg];
            else
                s->table[(int64_t)r * s->stride + pg] = order[next++];
        }
    }
    free(order);
    free(pages);
    return 0;
}

static int32_t phys_page(const tk_step *s, int r, int pos)
{
    return s->table[(int64_t)r * s->stride + pos / s->page_size];
}

/* Does position `pos` of request r live in a page already written through
 * another request's table (a shared page)? */
static int owned_elsewhere(const tk_step *s, int r, int pos)
{
    int32_t pg = phys_page(s, r, pos);
    for (int o = 0; o < r; o++) {
        int pages = (s->kv_len[o] + s->page_size - 1) / s->page_size;
        for (int n = 0; n < pages; n++)
            if (s->table[(int64_t)o * s->stride + n] == pg)
                return 1;
    }
    return 0;
}

/* Index-key rows of the special blocks: copies of one boosted block (tie
 * rule) at n = 1, 4, 7, ... and NaN blocks at n = 3, 9, 15, ...  Only blocks
 * wholly inside the cached prefix are touched.  Returns 1 when the row was
 * produced here. */
static int special_index_key(const msa_case *c, const float *tie_rows, int prefix, int pos,
                             float *row)
{
    const int B = c->block, n = pos / B;
    if ((n + 1) * B > prefix)
        return 0;
    if (c->tie_blocks > 0 && n % 3 == 1 && n / 3 < c->tie_blocks) {
        memcpy(row, tie_rows + (size_t)(pos % B) * (size_t)c->Di, sizeof(float) * (size_t)c->Di);
        return 1;
    }
    if (c->nan_blocks > 0 && n % 6 == 3 && n / 6 < c->nan_blocks) {
        for (int e = 0; e < c->Di; e++)
            row[e] = NAN;
        return 1;
    }
    return 0;
}

/* Index-key rows of a block past the first index_period blocks of its
 * request: those of block n mod index_period (written before it), so blocks
 * tie exactly in pairs or more, as `msa bench`'s repeated data makes them.
 * Returns 1 when the row was produced here. */
static int repeated_index_key(const msa_case *c, const tk_step *s, int r, int pos, int h,
                              float *row)
{
    const int B = c->block, P = c->index_period, n = pos / B;
    if (P <= 0 || n < P)
        return 0;
    const int src = (n % P) * B + pos % B;
    tk_plane_get(&s->plane[MSA_PLANE_INDEX_K], s->after[MSA_PLANE_INDEX_K], phys_page(s, r, src), h,
                 src % s->page_size, row);
    return 1;
}

static void fill_images(const msa_case *c, tk_step *s, tk_rng *rng)
{
    float row[1024];
    float *tie_rows = NULL;

    /* Everything starts as garbage: unused pages, slots past kv_len, and the
     * slots the step is about to write. */
    for (int p = 0; p < 4; p++) {
        if (!s->has_plane[p])
            continue;
        const tk_plane *pl = &s->plane[p];
        s->after[p] = xcalloc(tk_plane_bytes(pl), 1);
        for (int64_t pg = 0; pg < pl->pages; pg++)
            for (int h = 0; h < pl->heads; h++)
                for (int t = 0; t < pl->page_size; t++) {
                    for (int e = 0; e < pl->dim; e++)
                        row[e] = TK_GARBAGE_SCALE * tk_rng_gauss(rng);
                    const int nan_plane =
                        p == MSA_PLANE_INDEX_K ||
                        (c->garbage_nan == 2 && (p == MSA_PLANE_K || p == MSA_PLANE_V));
                    if (c->garbage_nan && nan_plane && (t & 1))
                        for (int e = 0; e < pl->dim; e++)
                            row[e] = NAN;
                    tk_plane_put(pl, s->after[p], pg, h, t, row);
                }
    }

    if (s->has_plane[MSA_PLANE_INDEX_K] && c->tie_blocks > 0) {
        tie_rows = xcalloc((size_t)c->block * (size_t)c->Di, sizeof(float));
        for (size_t i = 0; i < (size_t)c->block * (size_t)c->Di; i++)
            tie_rows[i] = TK_TIE_BOOST * tk_rng_gauss(rng);
    }

    /* The cached prefix of every request, each shared page written once. */
    for (int r = 0; r < s->R; r++) {
        int prefix = s->kv_len[r] - s->q_len[r];
        for (int pos = 0; pos < prefix; pos++) {
            if (owned_elsewhere(s, r, pos))
                continue;
            int32_t pg = phys_page(s, r, pos);
            for (int p = 0; p < 4; p++) {
                if (!s->has_plane[p])
                    continue;
                const tk_plane *pl = &s->plane[p];
                for (int h = 0; h < pl->heads; h++) {
                    if (!(p == MSA_PLANE_INDEX_K &&
                          (special_index_key(c, tie_rows, prefix, pos, row) ||
                           repeated_index_key(c, s, r, pos, h, row))))
                        for (int e = 0; e < pl->dim; e++)
                            row[e] = tk_rng_gauss(rng);
                    tk_plane_put(pl, s->after[p], pg, h, pos % s->page_size, row);
                }
            }
        }
    }
    free(tie_rows);

    /* The step's own entries: activations converted to each plane's format.
     * With write_cache == 0 the test stores them itself, before the call. */
    for (int p = 0; p < 4; p++) {
        if (!s->has_plane[p])
            continue;
        s->before[p] = xcalloc(tk_plane_bytes(&s->plane[p]), 1);
        memcpy(s->before[p], s->after[p], tk_plane_bytes(&s->plane[p]));
    }
    const float *src[4] = {s->k, s->v, s->idx_k, s->idx_v};
    for (int r = 0; r < s->R; r++) {
        for (int i = 0; i < s->q_len[r]; i++) {
            int pos = s->kv_len[r] - s->q_len[r] + i;
            int64_t rowi = s->row0[r] + i;
            int32_t pg = phys_page(s, r, pos);
            for (int p = 0; p < 4; p++) {
                if (!s->has_plane[p])
                    continue;
                const tk_plane *pl = &s->plane[p];
                for (int h = 0; h < pl->heads; h++) {
                    const float *x =
                        src[p] + ((size_t)rowi * (size_t)pl->heads + (size_t)h) * (size_t)pl->dim;
                    tk_plane_put(pl, s->after[p], pg, h, pos % s->page_size, x);
                    if (!c->write_cache)
                        tk_plane_put(pl, s->before[p], pg, h, pos % s->page_size, x);
                }
            }
        }
    }
}

static int check_case(const msa_case *c, char *err, size_t n)
{
    if (c->num_requests < 0 || (c->num_requests > 0 && (!c->q_len || !c->kv_len)) ||
        c->padding_rows < 0 || c->Hq <= 0 || c->Hkv <= 0 || c->D <= 0 || c->page_size <= 0 ||
        c->D > 1024 || c->Di > 1024 || (c->sparse && (c->Hi <= 0 || c->Di <= 0 || c->block <= 0))) {
        snprintf(err, n, "malformed case");
        return -1;
    }
    return 0;
}

int64_t tk_step_pages(const msa_case *c)
{
    tk_step s;
    tk_rng rng = {c->seed};
    char err[64];
    memset(&s, 0, sizeof s);
    int64_t pages = 0;
    if (!check_case(c, err, sizeof err) && !build_layout(c, 0, &s, &rng, err, sizeof err))
        pages = s.num_pages;
    tk_step_free(&s);
    return pages;
}

int tk_step_build(const msa_case *c, int64_t min_pages, tk_step *s, char *err, size_t err_size)
{
    tk_rng rng = {c->seed};
    memset(s, 0, sizeof *s);
    if (check_case(c, err, err_size))
        return -1;
    s->act = c->act_dtype;
    fill_layer(c, s);
    if (build_layout(c, min_pages, s, &rng, err, err_size))
        return -1;
    fill_planes(c, s);

    const msa_oracle_layer *L = &s->layer;
    s->q = random_rows(&rng, s->act, s->rows, (size_t)L->Hq * (size_t)L->D);
    s->k = random_rows(&rng, s->act, s->rows, (size_t)L->Hkv * (size_t)L->D);
    s->v = random_rows(&rng, s->act, s->rows, (size_t)L->Hkv * (size_t)L->D);
    if (L->sparse) {
        s->idx_q = random_rows(&rng, s->act, s->rows, (size_t)L->Hi * (size_t)L->Di);
        s->idx_k = random_rows(&rng, s->act, s->rows, (size_t)L->Di);
        if (L->index_value)
            s->idx_v = random_rows(&rng, s->act, s->rows, (size_t)L->Di);
    }
    fill_images(c, s, &rng);
    return 0;
}

void tk_step_free(tk_step *s)
{
    free(s->q_len);
    free(s->kv_len);
    free(s->row0);
    free(s->table);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->idx_q);
    free(s->idx_k);
    free(s->idx_v);
    for (int p = 0; p < 4; p++) {
        free(s->before[p]);
        free(s->after[p]);
    }
    memset(s, 0, sizeof *s);
}

void tk_view_gather(const tk_step *s, uint8_t *const img[4], int r, tk_view *view)
{
    float *dst[4];
    const int kv = s->kv_len[r];
    for (int p = 0; p < 4; p++) {
        dst[p] = NULL;
        if (!s->has_plane[p])
            continue;
        const tk_plane *pl = &s->plane[p];
        dst[p] = xcalloc((size_t)kv * (size_t)pl->heads * (size_t)pl->dim, sizeof(float));
        for (int pos = 0; pos < kv; pos++)
            for (int h = 0; h < pl->heads; h++)
                tk_plane_get(pl, img[p], phys_page(s, r, pos), h, pos % s->page_size,
                             dst[p] +
                                 ((size_t)pos * (size_t)pl->heads + (size_t)h) * (size_t)pl->dim);
    }
    view->k = dst[MSA_PLANE_K];
    view->v = dst[MSA_PLANE_V];
    view->idx_k = dst[MSA_PLANE_INDEX_K];
    view->idx_v = dst[MSA_PLANE_INDEX_V];
}

void tk_view_free(tk_view *view)
{
    free(view->k);
    free(view->v);
    free(view->idx_k);
    free(view->idx_v);
    memset(view, 0, sizeof *view);
}

msa_oracle_request tk_oracle_request(const tk_step *s, const tk_view *view, int r)
{
    const msa_oracle_layer *L = &s->layer;
    msa_oracle_request q;
    memset(&q, 0, sizeof q);
    q.q_len = s->q_len[r];
    q.kv_len = s->kv_len[r];
    q.k = view->k;
    q.v = view->v;
    q.idx_k = view->idx_k;
    q.idx_v = view->idx_v;
    q.q = s->q + (size_t)s->row0[r] * (size_t)L->Hq * (size_t)L->D;
    if (L->sparse)
        q.idx_q = s->idx_q + (size_t)s->row0[r] * (size_t)L->Hi * (size_t)L->Di;
    return q;
}
