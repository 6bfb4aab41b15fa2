#include "oracle_cmp.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "elem.h"
#include "oracle.h"
#include "plane.h"

/* A mismatched selection is excused when the last block the oracle took
 * and the best block it left differ by less than this (relative): fp32
 * accumulation of Di products can reorder such scores. */
#define NEAR_TIE_REL 1e-3

/* The layer's planes, read back and de-quantized: [pages][heads][P][dim]. */
typedef struct plane_copy {
    float *data[4];
} plane_copy;

static int read_planes(const cmp_inputs *in, plane_copy *pc, char *msg, size_t msg_size)
{
    msa_cache_config cc;
    msa_cache_get_config(in->cache, &cc);
    memset(pc, 0, sizeof *pc);
    for (int p = 0; p < 4; p++) {
        size_t bytes = msa_cache_plane_bytes(in->cache, in->layer, (msa_plane)p);
        if (bytes == 0)
            continue;
        plane_geom g;
        plane_geometry(in->model, in->layer, &cc, (msa_plane)p, &g);
        if (g.bytes != bytes) {
            snprintf(msg, msg_size, "plane %d of layer %d has an unexpected size", p, in->layer);
            return -1;
        }
        void *raw = malloc(bytes);
        pc->data[p] = malloc((size_t)(g.units * g.unit_elems) * sizeof(float));
        if (!raw || !pc->data[p]) {
            free(raw);
            snprintf(msg, msg_size, "out of memory reading the cache");
            return -1;
        }
        msa_status st =
            msa_copy_from_buffer(in->ctx, raw,
                                 msa_cache_plane_data(in->cache, in->layer, (msa_plane)p), bytes);
        if (st != MSA_OK) {
            free(raw);
            snprintf(msg, msg_size, "reading the cache: %s", msa_context_last_error(in->ctx));
            return -1;
        }
        elem_decode_plane(pc->data[p], g.dtype, raw, g.units, g.unit_elems, in->plane_scales[p]);
        free(raw);
    }
    return 0;
}

/* Logical rows 0..kv_len-1 of request r from the paged plane, [kv_len][heads][dim]. */
static float *gather(const float *plane, const msa_step *step, int32_t r, int32_t page_size,
                     int heads, int dim)
{
    int64_t kv = step->kv_len[r];
    float *out = malloc((size_t)(kv > 0 ? kv : 1) * (size_t)heads * (size_t)dim * sizeof(float));
    if (!out)
        return NULL;
    const int32_t *table = step->page_table + (int64_t)r * step->page_table_stride;
    for (int64_t j = 0; j < kv; j++) {
        int64_t page = table[j / page_size], slot = j % page_size;
        for (int h = 0; h < heads; h++)
            memcpy(out + (j * heads + h) * dim,
                   plane + ((page * heads + h) * page_size + slot) * dim,
                   (size_t)dim * sizeof(float));
    }
    return out;
}

static double rel_err_f(const float *out, const double *ref, int64_t n, int *nonfinite)
{
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(out[i]) && isfinite(ref[i]))
            *nonfinite = 1;
        double d = (double)out[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    if (*nonfinite)
        return INFINITY;
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static int cmp_desc(const void *a, const void *b)
{
    /* Scores sorted high to low, NaN last (SPEC 4 ranking without ids). */
    double x = *(const double *)a, y = *(const double *)b;
    if (isnan(x) || isnan(y))
        return isnan(x) - isnan(y);
    return (x < y) - (x > y);
}

/* Whether index head h's choice for token i sits on a near-tie: the K-th
 * best free block and the next one score almost the same. */
static int near_tie(const msa_oracle_layer *L, const msa_oracle_request *req, int i, int h)
{
    int p = req->kv_len - req->q_len + i;
    int N = p / L->block + 1;
    if (N <= L->topk)
        return 0; /* everything reachable is selected: no choice was made */
    double *scores = malloc(sizeof(double) * (size_t)N);
    double *free_scores = malloc(sizeof(double) * (size_t)N);
    if (!scores || !free_scores) {
        free(scores);
        free(free_scores);
        return 0;
    }
    msa_oracle_block_scores(L, req, i, h, scores);
    int nfree = 0, forced = 0;
    for (int n = 0; n < N; n++) {
        if (n < L->init_blocks || n >= N - L->local_blocks)
            forced++;
        else
            free_scores[nfree++] = scores[n];
    }
    int need = L->topk - forced; /* free blocks taken; nfree > need since N > K */
    int tie = 0;
    if (need > 0 && need < nfree) {
        qsort(free_scores, (size_t)nfree, sizeof(double), cmp_desc);
        double a = free_scores[need - 1], b = free_scores[need];
        tie = (isnan(a) && isnan(b)) || a == b ||
              fabs(a - b) <= NEAR_TIE_REL * fmax(1.0, fmax(fabs(a), fabs(b)));
    }
    free(scores);
    free(free_scores);
    return tie;
}

/* Index heads feeding KV head g (SPEC 4). */
static void index_heads_of(const msa_oracle_layer *L, int g, int *first, int *count)
{
    if (L->Hi >= L->Hkv) {
        *count = L->Hi / L->Hkv;
        *first = g * *count;
    } else {
        *count = 1;
        *first = g / (L->Hkv / L->Hi);
    }
}

/* The oracle's outputs of a request's sampled rows, computed on several
 * threads (rows are independent and msa_oracle_token keeps no state), so
 * the check of a long prefill does not take longer than the step. */
typedef struct oracle_rows {
    const msa_oracle_layer *L;
    const msa_oracle_request *req;
    const int *tok; /* token index within the request of each row */
    int n, W;
    double *o, *lse, *io; /* [n][Hq*D], [n][Hq], [n][Hi*Di] */
    int32_t *topk;        /* [n][Hkv*W] */
    int nth;
} oracle_rows;

typedef struct oracle_worker {
    oracle_rows *job;
    int ith;
} oracle_worker;

static void *oracle_rows_work(void *arg)
{
    oracle_worker *w = arg;
    oracle_rows *j = w->job;
    const msa_oracle_layer *L = j->L;
    for (int s = w->ith; s < j->n; s += j->nth)
        msa_oracle_token(L, j->req, j->tok[s], j->o + (int64_t)s * L->Hq * L->D,
                         j->lse + (int64_t)s * L->Hq, j->topk + (int64_t)s * L->Hkv * j->W,
                         j->io + (int64_t)s * L->Hi * L->Di);
    return NULL;
}

/* Runs the job on up to 8 threads; the calling thread takes a share, and
 * a thread that cannot be started leaves its rows to it. */
static void oracle_rows_run(oracle_rows *j)
{
    enum { MAX_THREADS = 8 };
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int nth = cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : (int)cpus;
    if (nth > j->n)
        nth = j->n > 0 ? j->n : 1;
    pthread_t tid[MAX_THREADS];
    oracle_worker w[MAX_THREADS];
    int started = 1;
    j->nth = nth;
    for (int t = 1; t < nth; t++) {
        w[t] = (oracle_worker){j, t};
        if (pthread_create(&tid[t], NULL, oracle_rows_work, &w[t]) != 0)
            break;
        started++;
    }
    w[0] = (oracle_worker){j, 0};
    if (started < nth) { /* run every row here instead */
        for (int t = 1; t < started; t++)
            pthread_join(tid[t], NULL);
        j->nth = 1;
        oracle_rows_work(&w[0]);
        return;
    }
    oracle_rows_work(&w[0]);
    for (int t = 1; t < nth; t++)
        pthread_join(tid[t], NULL);
}

int cmp_layer(const cmp_inputs *in, cmp_result *res)
{
    memset(res, 0, sizeof *res);
    msa_model_config cfg;
    msa_cache_config cc;
    msa_model_get_config(in->model, &cfg);
    msa_cache_get_config(in->cache, &cc);
    msa_oracle_layer L = {
        .Hq = cfg.num_q_heads,
        .Hkv = cfg.num_kv_heads,
        .D = cfg.head_dim,
        .Hi = cfg.num_index_heads,
        .Di = cfg.index_dim,
        .block = cfg.block_size,
        .topk = cfg.topk_blocks,
        .init_blocks = cfg.init_blocks,
        .local_blocks = cfg.local_blocks,
        .score_lse = cfg.score_type == MSA_SCORE_LSE,
        .sparse = msa_model_layer_is_sparse(in->model, in->layer),
        .index_value = msa_model_layer_has_index_value(in->model, in->layer),
        .scale = cfg.softmax_scale,
        .index_scale = cfg.index_softmax_scale,
    };
    const msa_step *step = in->step;
    const int W = msa_oracle_topk_width(&L);

    plane_copy pc;
    if (read_planes(in, &pc, res->message, sizeof res->message) != 0) {
        for (int p = 0; p < 4; p++)
            free(pc.data[p]);
        return -1;
    }
    const size_t nr = (size_t)(in->num_rows > 0 ? in->num_rows : 1);
    double *o_all = malloc(sizeof(double) * (size_t)L.Hq * (size_t)L.D * nr);
    double *lse_all = malloc(sizeof(double) * (size_t)L.Hq * nr);
    double *io_all = malloc(sizeof(double) * (size_t)L.Hi * (size_t)L.Di * nr);
    int32_t *topk_all = malloc(sizeof(int32_t) * (size_t)L.Hkv * (size_t)W * nr);
    int *tok = malloc(sizeof(int) * nr);
    int rc = (o_all && lse_all && io_all && topk_all && tok) ? 0 : -1;
    if (rc)
        snprintf(res->message, sizeof res->message, "out of memory");

    /* Rows are visited request by request so each logical cache is gathered once. */
    int64_t q_start = 0;
    for (int32_t r = 0; rc == 0 && r < step->num_requests; q_start += step->q_len[r], r++) {
        int64_t q_end = q_start + step->q_len[r];
        int any = 0;
        for (int s = 0; s < in->num_rows && !any; s++)
            any = in->rows[s] >= q_start && in->rows[s] < q_end;
        if (!any)
            continue;
        msa_oracle_request req = {.q_len = step->q_len[r], .kv_len = step->kv_len[r]};
        float *k = gather(pc.data[MSA_PLANE_K], step, r, cc.page_size, L.Hkv, L.D);
        float *v = gather(pc.data[MSA_PLANE_V], step, r, cc.page_size, L.Hkv, L.D);
        float *ik = L.sparse ? gather(pc.data[MSA_PLANE_INDEX_K], step, r, cc.page_size, 1, L.Di)
                             : NULL;
        float *iv = L.index_value
                        ? gather(pc.data[MSA_PLANE_INDEX_V], step, r, cc.page_size, 1, L.Di)
                        : NULL;
        if (!k || !v || (L.sparse && !ik) || (L.index_value && !iv)) {
            snprintf(res->message, sizeof res->message, "out of memory gathering the cache");
            rc = -1;
        }
        req.k = k;
        req.v = v;
        req.idx_k = ik;
        req.idx_v = iv;
        req.q = in->q + q_start * L.Hq * L.D;
        req.idx_q = L.sparse ? in->idx_q + q_start * L.Hi * L.Di : NULL;
        /* The oracle of this request's rows first, in parallel. */
        int n = 0;
        for (int s = 0; s < in->num_rows; s++)
            if (in->rows[s] >= q_start && in->rows[s] < q_end)
                tok[n++] = (int)(in->rows[s] - q_start);
        if (rc == 0) {
            oracle_rows job = {&L, &req, tok, n, W, o_all, lse_all, io_all, topk_all, 1};
            oracle_rows_run(&job);
        }
        for (int s = 0, at = 0; rc == 0 && s < in->num_rows; s++) {
            int64_t t = in->rows[s];
            if (t < q_start || t >= q_end)
                continue;
            int i = (int)(t - q_start);
            const double *o_ref = o_all + (int64_t)at * L.Hq * L.D;
            const double *lse_ref = lse_all + (int64_t)at * L.Hq;
            const double *io_ref = io_all + (int64_t)at * L.Hi * L.Di;
            const int32_t *topk_ref = topk_all + (int64_t)at * L.Hkv * W;
            at++;
            int tie_row = 0;
            if (L.sparse && in->topk) {
                for (int g = 0; g < L.Hkv; g++) {
                    const int32_t *got = in->topk + (t * L.Hkv + g) * W;
                    res->topk_rows++;
                    if (memcmp(got, topk_ref + (int64_t)g * W, sizeof(int32_t) * (size_t)W) == 0)
                        continue;
                    res->topk_mismatches++;
                    int first, count, tie = 0;
                    index_heads_of(&L, g, &first, &count);
                    for (int h = first; h < first + count && !tie; h++)
                        tie = near_tie(&L, &req, i, h);
                    res->near_ties += tie;
                    tie_row |= tie;
                }
            }
            /* A near-tie legitimately changes which keys a head attends, so
             * that row's outputs cannot be held to the oracle's. */
            if (tie_row)
                continue;
            double e;
            if (in->o) {
                e = rel_err_f(in->o + t * L.Hq * L.D, o_ref, (int64_t)L.Hq * L.D, &res->nonfinite);
                res->o_err = fmax(res->o_err, e);
            }
            if (in->lse) {
                e = rel_err_f(in->lse + t * L.Hq, lse_ref, L.Hq, &res->nonfinite);
                res->lse_err = fmax(res->lse_err, e);
            }
            if (in->idx_o && L.index_value) {
                e = rel_err_f(in->idx_o + t * L.Hi * L.Di, io_ref, (int64_t)L.Hi * L.Di,
                              &res->nonfinite);
                res->idx_o_err = fmax(res->idx_o_err, e);
            }
        }
        free(k);
        free(v);
        free(ik);
        free(iv);
    }
    free(o_all);
    free(lse_all);
    free(io_all);
    free(topk_all);
    free(tok);
    for (int p = 0; p < 4; p++)
        free(pc.data[p]);
    return rc;
}
