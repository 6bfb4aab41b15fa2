/*
 * Double-precision reference of SPEC sections 4-6.  Written to be read, not
 * to be fast: every quantity is computed the long way, straight from the
 * definitions.  The only liberty taken is the usual max-subtraction in the
 * softmax sums, which is exact algebra and keeps exp() finite.
 */
#include "oracle.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* How many KV heads share one index head (Hkv = m * Hi), else 1. */
static int kv_per_index_head(const msa_oracle_layer *L)
{
    return L->Hkv > L->Hi ? L->Hkv / L->Hi : 1;
}

/* How many index heads feed one KV head (Hi = m * Hkv), else 1. */
static int index_heads_per_kv(const msa_oracle_layer *L)
{
    return L->Hi > L->Hkv ? L->Hi / L->Hkv : 1;
}

int msa_oracle_topk_width(const msa_oracle_layer *layer)
{
    return layer->topk * index_heads_per_kv(layer);
}

static int token_position(const msa_oracle_request *req, int i)
{
    return req->kv_len - req->q_len + i;
}

static double dot(const float *a, const float *b, int n)
{
    double s = 0.0;
    for (int e = 0; e < n; e++)
        s += (double)a[e] * (double)b[e];
    return s;
}

int msa_oracle_block_scores(const msa_oracle_layer *layer, const msa_oracle_request *req, int i,
                            int h, double *scores)
{
    const int p = token_position(req, i);
    const int B = layer->block;
    const int N = p / B + 1;
    const float *q = req->idx_q + ((size_t)i * layer->Hi + h) * layer->Di;

    for (int n = 0; n < N; n++) {
        int first = n * B;
        int last = (n + 1) * B - 1;
        if (last > p)
            last = p; /* only the final block can be cut by causality */

        /* Raw scores s_j of the visible keys of this block. */
        double best = -INFINITY;
        int any_nan = 0;
        for (int j = first; j <= last; j++) {
            double s = dot(q, req->idx_k + (size_t)j * layer->Di, layer->Di);
            if (isnan(s))
                any_nan = 1;
            else if (s > best)
                best = s;
        }
        if (any_nan) {
            /* A NaN key poisons its block under both score types. */
            scores[n] = NAN;
            continue;
        }
        if (!layer->score_lse) {
            scores[n] = best;
            continue;
        }
        /* lse: ln(sum exp(c*s_j)), shifted by the largest term. */
        double c = layer->index_scale;
        double shift = c * best;
        if (isinf(shift)) {
            scores[n] = shift;
            continue;
        }
        double sum = 0.0;
        for (int j = first; j <= last; j++)
            sum += exp(c * dot(q, req->idx_k + (size_t)j * layer->Di, layer->Di) - shift);
        scores[n] = shift + log(sum);
    }
    return N;
}

/* SPEC 4 ranking: higher score first, NaN below every number, lower id
 * first on equal scores and among NaNs.  Returns 1 when block a ranks
 * strictly before block b. */
static int ranks_before(int a, double sa, int b, double sb)
{
    int na = isnan(sa), nb = isnan(sb);
    if (na != nb)
        return nb; /* the number beats the NaN */
    if (!na && sa != sb)
        return sa > sb;
    return a < b;
}

/* Marks in chosen[0..N-1] the blocks index head h selects for token i. */
static void select_blocks(const msa_oracle_layer *L, const msa_oracle_request *req, int i, int h,
                          unsigned char *chosen, double *scores)
{
    const int N = msa_oracle_block_scores(L, req, i, h, scores);
    const int T = L->topk < N ? L->topk : N;
    int taken = 0;

    memset(chosen, 0, (size_t)N);
    for (int n = 0; n < N; n++) {
        if (n < L->init_blocks || n >= N - L->local_blocks) {
            chosen[n] = 1;
            taken++;
        }
    }
    /* Forced blocks count against K; fill the rest one best block at a time. */
    while (taken < T) {
        int best = -1;
        for (int n = 0; n < N; n++) {
            if (chosen[n])
                continue;
            if (best < 0 || ranks_before(n, scores[n], best, scores[best]))
                best = n;
        }
        if (best < 0)
            break; /* cannot happen: taken < T <= N leaves a block unchosen */
        chosen[best] = 1;
        taken++;
    }
}

/* Union of the selections feeding KV head g, as a 0/1 mask over N blocks. */
static void kv_head_blocks(const msa_oracle_layer *L, const msa_oracle_request *req, int i, int g,
                           unsigned char *mask, unsigned char *tmp, double *scores, int N)
{
    const int per_kv = index_heads_per_kv(L);
    const int first_h = L->Hi >= L->Hkv ? g * per_kv : g / kv_per_index_head(L);

    memset(mask, 0, (size_t)N);
    for (int h = first_h; h < first_h + per_kv; h++) {
        select_blocks(L, req, i, h, tmp, scores);
        for (int n = 0; n < N; n++)
            mask[n] |= tmp[n];
    }
}

/* Softmax-weighted sum over the keys j in [0, p] for which use[j / B] (or all
 * keys when use is NULL).  Writes out[dim] and returns the log-sum-exp. */
static double attend(const float *q, const float *keys, const float *vals, size_t stride, int dim,
                     double scale, int p, int B, const unsigned char *use, double *out)
{
    double m = -INFINITY;
    for (int j = 0; j <= p; j++) {
        if (use && !use[j / B])
            continue;
        double l = scale * dot(q, keys + (size_t)j * stride, dim);
        if (l > m)
            m = l;
    }
    double sum = 0.0;
    for (int e = 0; e < dim; e++)
        out[e] = 0.0;
    for (int j = 0; j <= p; j++) {
        if (use && !use[j / B])
            continue;
        double w = exp(scale * dot(q, keys + (size_t)j * stride, dim) - m);
        sum += w;
        const float *v = vals + (size_t)j * stride;
        for (int e = 0; e < dim; e++)
            out[e] += w * (double)v[e];
    }
    for (int e = 0; e < dim; e++)
        out[e] /= sum;
    return m + log(sum);
}

void msa_oracle_token(const msa_oracle_layer *layer, const msa_oracle_request *req, int i,
                      double *o, double *lse, int32_t *topk, double *idx_o)
{
    const msa_oracle_layer *L = layer;
    const int p = token_position(req, i);
    const int group = L->Hq / L->Hkv;
    const int N = p / L->block + 1;
    const int W = msa_oracle_topk_width(L);
    const size_t kv_stride = (size_t)L->Hkv * L->D;

    unsigned char *mask = NULL, *tmp = NULL;
    double *scores = NULL, *acc = malloc(sizeof(double) * (size_t)L->D);
    if (L->sparse) {
        mask = malloc((size_t)N * (size_t)L->Hkv);
        tmp = malloc((size_t)N);
        scores = malloc(sizeof(double) * (size_t)N);
        for (int g = 0; g < L->Hkv; g++)
            kv_head_blocks(L, req, i, g, mask + (size_t)g * N, tmp, scores, N);
    }

    for (int hq = 0; hq < L->Hq; hq++) {
        const int g = hq / group;
        const float *q = req->q + ((size_t)i * L->Hq + hq) * L->D;
        const unsigned char *use = L->sparse ? mask + (size_t)g * N : NULL;
        double l = attend(q, req->k + (size_t)g * L->D, req->v + (size_t)g * L->D, kv_stride, L->D,
                          L->scale, p, L->block, use, acc);
        if (o)
            memcpy(o + (size_t)hq * L->D, acc, sizeof(double) * (size_t)L->D);
        if (lse)
            lse[hq] = l;
    }

    if (topk && L->sparse) {
        for (int g = 0; g < L->Hkv; g++) {
            int32_t *row = topk + (size_t)g * W;
            int w = 0;
            for (int n = 0; n < N; n++) /* ascending ids */
                if (mask[(size_t)g * N + n])
                    row[w++] = n;
            while (w < W)
                row[w++] = -1;
        }
    }

    if (idx_o && L->sparse && L->index_value) {
        for (int h = 0; h < L->Hi; h++) {
            const float *q = req->idx_q + ((size_t)i * L->Hi + h) * L->Di;
            attend(q, req->idx_k, req->idx_v, (size_t)L->Di, L->Di, L->index_scale, p, L->block,
                   NULL, idx_o + (size_t)h * L->Di);
        }
    }

    free(mask);
    free(tmp);
    free(scores);
    free(acc);
}
