/* Plans: one step's request metadata, validated on the host and published
 * to the backend.  Capacities fixed at creation make msa_plan_update
 * allocation-free, which CUDA graph replay needs. */
#include "core/internal.h"

#include <stdlib.h>
#include <string.h>

#define MSA_MAX_KV_LEN (INT64_C(1) << 31)

void msa_plan_limits_default(msa_plan_limits *limits)
{
    if (limits)
        memset(limits, 0, sizeof *limits);
}

typedef struct plan_arrays {
    int32_t *q_len, *kv_len, *page_table, *token_request;
    int64_t *q_start, *token_pos;
} plan_arrays;

static void arrays_free(plan_arrays *a)
{
    free(a->q_len);
    free(a->kv_len);
    free(a->page_table);
    free(a->token_request);
    free(a->q_start);
    free(a->token_pos);
}

static int arrays_alloc(plan_arrays *a, int32_t reqs, int64_t tokens, int64_t pages_per_req)
{
    memset(a, 0, sizeof *a);
    a->q_len = calloc((size_t)reqs, sizeof *a->q_len);
    a->kv_len = calloc((size_t)reqs, sizeof *a->kv_len);
    a->q_start = calloc((size_t)reqs + 1, sizeof *a->q_start);
    a->page_table = malloc((size_t)reqs * (size_t)pages_per_req * sizeof *a->page_table);
    a->token_request = malloc((size_t)tokens * sizeof *a->token_request);
    a->token_pos = malloc((size_t)tokens * sizeof *a->token_pos);
    if (!a->q_len || !a->kv_len || !a->q_start || !a->page_table || !a->token_request || !a->token_pos) {
        arrays_free(a);
        return 0;
    }
    return 1;
}

static void arrays_install(msa_plan *p, plan_arrays *a)
{
    p->q_len = a->q_len;
    p->kv_len = a->kv_len;
    p->q_start = a->q_start;
    p->page_table = a->page_table;
    p->token_request = a->token_request;
    p->token_pos = a->token_pos;
}

static void arrays_take(msa_plan *p, plan_arrays *a)
{
    a->q_len = p->q_len;
    a->kv_len = p->kv_len;
    a->q_start = p->q_start;
    a->page_table = p->page_table;
    a->token_request = p->token_request;
    a->token_pos = p->token_pos;
}

static int64_t pages_for(int64_t kv_len, int32_t page_size)
{
    return (kv_len + page_size - 1) / page_size;
}

/* (Re)sizes host arrays and the backend state.  On failure the plan keeps
 * its previous arrays and state. */
static msa_status plan_resize(msa_plan *p, int32_t reqs, int64_t tokens, int64_t kv_len)
{
    msa_context *ctx = p->ctx;
    if (reqs < 1)
        reqs = 1;
    if (tokens < 1)
        tokens = 1;
    if (kv_len < 1)
        kv_len = 1;
    int64_t ppr = pages_for(kv_len, p->cache->cfg.page_size);
    if ((double)reqs * (double)ppr > (double)(INT64_C(1) << 40) || tokens > (INT64_C(1) << 40))
        return msa_set_error(ctx, MSA_ERR_CAPACITY, "plan capacity too large");
    plan_arrays fresh, old;
    if (!arrays_alloc(&fresh, reqs, tokens, ppr))
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY, "plan: out of memory");

    /* Swap in the new capacities, rebuild the backend state, roll back on failure. */
    arrays_take(p, &old);
    int32_t o_reqs = p->cap_requests;
    int64_t o_tokens = p->cap_tokens, o_kv = p->cap_kv_len, o_ppr = p->cap_pages_per_request;
    void *o_backend = p->backend;
    p->cap_requests = reqs;
    p->cap_tokens = tokens;
    p->cap_kv_len = kv_len;
    p->cap_pages_per_request = ppr;
    p->backend = NULL;
    arrays_install(p, &fresh);
    msa_status st = ctx->ops->plan_init(p);
    if (st != MSA_OK) {
        arrays_free(&fresh);
        arrays_install(p, &old);
        p->cap_requests = o_reqs;
        p->cap_tokens = o_tokens;
        p->cap_kv_len = o_kv;
        p->cap_pages_per_request = o_ppr;
        p->backend = o_backend;
        return st;
    }
    if (o_backend) {
        void *nb = p->backend;
        p->backend = o_backend;
        ctx->ops->plan_free(p);
        p->backend = nb;
    }
    arrays_free(&old);
    /* The step in the new arrays is empty until filled. */
    p->num_requests = 0;
    p->num_tokens = 0;
    p->active_tokens = 0;
    p->max_kv_len = 0;
    p->max_q_len = 0;
    return MSA_OK;
}

msa_status msa_plan_create(msa_context *ctx, const msa_model *model, msa_cache *cache,
                           const msa_plan_limits *limits, msa_plan **out)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    if (!model || !cache || !out)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "msa_plan_create: NULL argument");
    *out = NULL;
    if (cache->model != model)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "msa_plan_create: the cache was created for another model");
    if (cache->ctx != ctx)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "msa_plan_create: the cache belongs to another context");
    msa_plan_limits lim;
    msa_plan_limits_default(&lim);
    if (limits)
        lim = *limits;
    if (lim.max_requests < 0 || lim.max_tokens < 0 || lim.max_kv_len < 0 ||
        lim.max_kv_len > MSA_MAX_KV_LEN)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "plan limits must be >= 0 (max_kv_len <= 2^31)");
    msa_plan *p = calloc(1, sizeof *p);
    if (!p)
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY, "plan: out of memory");
    p->ctx = ctx;
    p->model = model;
    p->cache = cache;
    p->limits = lim;
    /* Growable limits start small and grow with the steps they see. */
    msa_status st = plan_resize(p, lim.max_requests ? lim.max_requests : 8,
                                lim.max_tokens ? lim.max_tokens : 64,
                                lim.max_kv_len ? lim.max_kv_len : 1024);
    if (st != MSA_OK) {
        free(p);
        return st;
    }
    p->q_start[0] = 0;
    msa_clear_error(ctx);
    *out = p;
    return MSA_OK;
}

void msa_plan_free(msa_plan *plan)
{
    if (!plan)
        return;
    if (plan->backend)
        plan->ctx->ops->plan_free(plan);
    plan_arrays a;
    arrays_take(plan, &a);
    arrays_free(&a);
    free(plan);
}

/* SPEC section 10: everything about the step is checked before anything
 * of the plan changes. */
static msa_status validate_step(msa_plan *p, const msa_step *s, int64_t *active, int64_t *max_kv)
{
    msa_context *ctx = p->ctx;
    const msa_cache_config *cc = &p->cache->cfg;
    if (s->num_requests < 0)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "num_requests is negative (%d)", s->num_requests);
    if (s->num_tokens < 0)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "num_tokens is negative (%lld)",
                             (long long)s->num_tokens);
    if (s->num_requests > 0 && (!s->q_len || !s->kv_len))
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "q_len or kv_len is NULL");
    int64_t sum = 0, mkv = 0;
    for (int32_t r = 0; r < s->num_requests; r++) {
        int32_t q = s->q_len[r], kv = s->kv_len[r];
        if (q < 0 || kv < 0)
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                 "request %d: negative length (q_len %d, kv_len %d)", r, q, kv);
        if (q > kv)
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                 "request %d: q_len %d exceeds kv_len %d", r, q, kv);
        sum += q;
        if (kv > mkv)
            mkv = kv;
        if (kv == 0)
            continue;
        int64_t need = pages_for(kv, cc->page_size);
        if (!s->page_table)
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "page_table is NULL");
        if (s->page_table_stride < need)
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                 "request %d: page_table_stride %lld < %lld pages needed for kv_len %d",
                                 r, (long long)s->page_table_stride, (long long)need, kv);
        const int32_t *row = s->page_table + (int64_t)r * s->page_table_stride;
        for (int64_t n = 0; n < need; n++) {
            if (row[n] < 0)
                return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                     "request %d: no page for logical page %lld (positions in use up to %d)",
                                     r, (long long)n, kv - 1);
            if (row[n] >= cc->num_pages)
                return msa_set_error(ctx, MSA_ERR_OUT_OF_RANGE,
                                     "request %d: page id %d outside the pool of %lld pages", r,
                                     row[n], (long long)cc->num_pages);
        }
    }
    if (sum > s->num_tokens)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "num_tokens %lld is smaller than sum(q_len) = %lld",
                             (long long)s->num_tokens, (long long)sum);
    const msa_plan_limits *l = &p->limits;
    if ((l->max_requests && s->num_requests > l->max_requests) ||
        (l->max_tokens && s->num_tokens > l->max_tokens) || (l->max_kv_len && mkv > l->max_kv_len))
        return msa_set_error(ctx, MSA_ERR_CAPACITY,
                             "step (requests %d, tokens %lld, max kv_len %lld) exceeds the plan's "
                             "limits (%d, %lld, %lld)",
                             s->num_requests, (long long)s->num_tokens, (long long)mkv,
                             l->max_requests, (long long)l->max_tokens, (long long)l->max_kv_len);
    *active = sum;
    *max_kv = mkv;
    return MSA_OK;
}

static int64_t grown(int64_t cap, int64_t need)
{
    while (cap < need)
        cap = cap * 2 > need ? cap * 2 : need;
    return cap;
}

msa_status msa_plan_update(msa_plan *p, const msa_step *s, void *stream)
{
    if (!p)
        return MSA_ERR_INVALID_ARGUMENT;
    msa_context *ctx = p->ctx;
    if (!s)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "msa_plan_update: step is NULL");
    int64_t active = 0, mkv = 0;
    msa_status st = validate_step(p, s, &active, &mkv);
    if (st != MSA_OK)
        return st;
    if (s->num_requests > p->cap_requests || s->num_tokens > p->cap_tokens || mkv > p->cap_kv_len) {
        st = plan_resize(p, (int32_t)grown(p->cap_requests, s->num_requests),
                         grown(p->cap_tokens, s->num_tokens), grown(p->cap_kv_len, mkv));
        if (st != MSA_OK)
            return st;
    }
    const int32_t P = p->cache->cfg.page_size;
    int64_t row = 0;
    int32_t mq = 0;
    for (int32_t r = 0; r < s->num_requests; r++) {
        int32_t q = s->q_len[r], kv = s->kv_len[r];
        p->q_len[r] = q;
        p->kv_len[r] = kv;
        p->q_start[r] = row;
        int32_t *dst = p->page_table + (int64_t)r * p->cap_pages_per_request;
        int64_t need = pages_for(kv, P);
        for (int64_t n = 0; n < p->cap_pages_per_request; n++)
            dst[n] = n < need ? s->page_table[(int64_t)r * s->page_table_stride + n] : -1;
        for (int32_t i = 0; i < q; i++, row++) {
            p->token_request[row] = r;
            p->token_pos[row] = (int64_t)kv - q + i;
        }
        if (q > mq)
            mq = q;
    }
    p->q_start[s->num_requests] = row;
    for (; row < p->cap_tokens; row++) {
        p->token_request[row] = -1;
        p->token_pos[row] = -1;
    }
    p->num_requests = s->num_requests;
    p->num_tokens = s->num_tokens;
    p->active_tokens = active;
    p->max_kv_len = mkv;
    p->max_q_len = mq;
    st = ctx->ops->plan_upload(p, stream);
    if (st != MSA_OK)
        return st;
    msa_clear_error(ctx);
    return MSA_OK;
}

const char *msa_plan_kernel_name(const msa_plan *plan, int32_t layer)
{
    if (!plan || layer < 0 || layer >= plan->model->cfg.num_layers)
        return "";
    const char *k = "", *r = "";
    plan->ctx->ops->describe(plan, layer, &k, &r);
    return k;
}

const char *msa_plan_fallback_reason(const msa_plan *plan, int32_t layer)
{
    if (!plan || layer < 0 || layer >= plan->model->cfg.num_layers)
        return "";
    const char *k = "", *r = "";
    plan->ctx->ops->describe(plan, layer, &k, &r);
    return r;
}
