/* Plans: one step's request metadata, validated on the host and published
 * to the backend.  Capacities fixed at creation make msa_plan_update
 * allocation-free, which CUDA graph replay needs.
 *
 * msa_plan_update is transactional: it validates the step, builds
 * everything new aside (the step's host arrays, and for a grown plan new
 * arrays and new backend state), and installs it only once the backend took
 * the step.  Any failure leaves the previous step, its arrays and the
 * backend state as they were, so msa_forward keeps running that step. */
#include "core/internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- checked arithmetic and plan memory ---------------------------------- */

int msa_size_mul(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

int msa_size_add(size_t a, size_t b, size_t *out)
{
    if (b > SIZE_MAX - a)
        return 0;
    *out = a + b;
    return 1;
}

int64_t msa_capacity_grow(int64_t cap, int64_t need, int64_t max)
{
    if (need > max)
        return -1;
    if (cap >= need)
        return cap;
    /* Doubling amortizes the reallocations of a plan that grows step by
     * step; the halving test keeps 2 * cap from overflowing. */
    int64_t twice = cap > max / 2 ? max : cap * 2;
    return twice > need ? twice : need;
}

size_t msa_host_memory_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t bytes;
    if (pages <= 0 || page <= 0 || !msa_size_mul((size_t)pages, (size_t)page, &bytes))
        return SIZE_MAX;
    return bytes;
}

void *msa_plan_malloc(size_t bytes)
{
    if (msa_alloc_fault() || bytes > msa_host_memory_bytes())
        return NULL;
    return malloc(bytes ? bytes : 1);
}

void *msa_plan_aligned_alloc(size_t bytes)
{
    /* aligned_alloc needs a size that is a multiple of the alignment. */
    if (msa_alloc_fault() || bytes > msa_host_memory_bytes() || bytes > SIZE_MAX - 63)
        return NULL;
    size_t rounded = bytes ? (bytes + 63) & ~(size_t)63 : 64;
    return aligned_alloc(64, rounded);
}

/* ---- host arrays ------------------------------------------------------------ */

void msa_plan_params_default(msa_plan_params *params)
{
    if (!params)
        return;
    memset(params, 0, sizeof *params);
    params->act_dtype = MSA_DTYPE_BF16;
}

static void arrays_free(msa_plan_arrays *a)
{
    free(a->q_len);
    free(a->kv_len);
    free(a->page_table);
    free(a->token_request);
    free(a->q_start);
    free(a->token_pos);
    memset(a, 0, sizeof *a);
}

/* Byte sizes of one set of arrays; 0 when a size does not fit in size_t. */
typedef struct arrays_bytes {
    size_t req32, req64, table, tok32, tok64, total;
} arrays_bytes;

static int arrays_size(int64_t reqs, int64_t tokens, int64_t ppr, arrays_bytes *b)
{
    size_t cells, sum = 0;
    memset(b, 0, sizeof *b);
    int ok = msa_size_mul((size_t)reqs, sizeof(int32_t), &b->req32) &&
             msa_size_mul((size_t)reqs + 1, sizeof(int64_t), &b->req64) &&
             msa_size_mul((size_t)reqs, (size_t)ppr, &cells) &&
             msa_size_mul(cells, sizeof(int32_t), &b->table) &&
             msa_size_mul((size_t)tokens, sizeof(int32_t), &b->tok32) &&
             msa_size_mul((size_t)tokens, sizeof(int64_t), &b->tok64) &&
             msa_size_add(sum, b->req32, &sum) && msa_size_add(sum, b->req32, &sum) &&
             msa_size_add(sum, b->req64, &sum) && msa_size_add(sum, b->table, &sum) &&
             msa_size_add(sum, b->tok32, &sum) && msa_size_add(sum, b->tok64, &sum);
    b->total = sum;
    return ok;
}

/* Allocates one set; on failure frees what it got and leaves *a empty. */
static int arrays_alloc(msa_plan_arrays *a, const arrays_bytes *b)
{
    memset(a, 0, sizeof *a);
    /* One allocation at a time, so that an injected failure at any of them
     * is a failure of exactly that allocation. */
    if (!(a->q_len = msa_plan_malloc(b->req32)) || !(a->kv_len = msa_plan_malloc(b->req32)) ||
        !(a->q_start = msa_plan_malloc(b->req64)) || !(a->page_table = msa_plan_malloc(b->table)) ||
        !(a->token_request = msa_plan_malloc(b->tok32)) ||
        !(a->token_pos = msa_plan_malloc(b->tok64))) {
        arrays_free(a);
        return 0;
    }
    a->q_start[0] = 0;
    return 1;
}

static msa_plan_arrays arrays_current(const msa_plan *p)
{
    msa_plan_arrays a;
    a.q_len = p->q_len;
    a.kv_len = p->kv_len;
    a.q_start = p->q_start;
    a.page_table = p->page_table;
    a.token_request = p->token_request;
    a.token_pos = p->token_pos;
    return a;
}

static void arrays_install(msa_plan *p, const msa_plan_arrays *a)
{
    p->q_len = a->q_len;
    p->kv_len = a->kv_len;
    p->q_start = a->q_start;
    p->page_table = a->page_table;
    p->token_request = a->token_request;
    p->token_pos = a->token_pos;
}

static int64_t pages_for(int64_t kv_len, int32_t page_size)
{
    return (kv_len + page_size - 1) / page_size;
}

/* Builds the two array sets of the capacities (reqs, tokens, kv_len) aside.
 * `fn` names the public call for the message. */
static msa_status arrays_build(msa_plan *p, const char *fn, int64_t reqs, int64_t tokens,
                               int64_t kv_len, msa_plan_arrays *cur, msa_plan_arrays *spare,
                               int64_t *ppr_out)
{
    msa_context *ctx = p->ctx;
    const int64_t ppr = pages_for(kv_len, p->cache->cfg.page_size);
    arrays_bytes b;
    if (!arrays_size(reqs, tokens, ppr, &b) || b.total > SIZE_MAX / 2)
        return msa_set_error(
            ctx, MSA_ERR_CAPACITY,
            "%s: capacities (requests %lld, tokens %lld, kv_len %lld) are too large "
            "to address",
            fn, (long long)reqs, (long long)tokens, (long long)kv_len);
    if (!arrays_alloc(cur, &b))
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY,
                             "%s: out of memory for the step arrays (2 x %zu bytes)", fn, b.total);
    if (!arrays_alloc(spare, &b)) {
        arrays_free(cur);
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY,
                             "%s: out of memory for the step arrays (2 x %zu bytes)", fn, b.total);
    }
    *ppr_out = ppr;
    return MSA_OK;
}

/* Puts `fn: ` in front of the message a backend left, once: a message that
 * already starts with it, or with the generic "plan: ", is not prefixed
 * again. */
static msa_status backend_failed(msa_context *ctx, msa_status st, const char *fn)
{
    char msg[sizeof ctx->last_error];
    const char *m = ctx->last_error;
    const size_t n = strlen(fn);
    if (!strncmp(m, fn, n) && m[n] == ':')
        return st;
    if (!strncmp(m, "plan: ", 6))
        m += 6;
    memcpy(msg, m, strlen(m) + 1);
    return msa_set_error(ctx, st, "%s: %s", fn, msg[0] ? msg : "the backend failed");
}

/* ---- create / free ---------------------------------------------------------- */

/* Checks the arguments every plan-creating call shares and resolves the
 * params (NULL: the defaults) into *lim. */
static msa_status check_create(msa_context *ctx, const char *fn, const msa_model *model,
                               const msa_cache *cache, const msa_plan_params *params,
                               msa_plan_params *lim)
{
    if (!model || !cache)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
    if (cache->model != model)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "%s: the cache was created for another model", fn);
    if (cache->ctx != ctx)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "%s: the cache belongs to another context", fn);
    msa_plan_params_default(lim);
    if (params)
        *lim = *params;
    if (lim->max_requests < 0 || lim->max_tokens < 0 || lim->max_kv_len < 0 ||
        lim->max_tokens > MSA_PLAN_MAX_TOKENS || lim->max_kv_len > MSA_PLAN_MAX_KV_LEN)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "%s: limits must be >= 0, max_tokens <= 2^40 and max_kv_len <= 2^31 "
                             "(got %d, %lld, %lld)",
                             fn, lim->max_requests, (long long)lim->max_tokens,
                             (long long)lim->max_kv_len);
    if (lim->max_q_len < 0)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "%s: max_q_len must be >= 0 (got %d)",
                             fn, lim->max_q_len);
    if (lim->act_dtype != MSA_DTYPE_FP32 && lim->act_dtype != MSA_DTYPE_BF16 &&
        lim->act_dtype != MSA_DTYPE_FP16)
        return msa_set_error(ctx, MSA_ERR_UNSUPPORTED,
                             "%s: act_dtype %s: activations are fp32, bf16 or fp16", fn,
                             msa_dtype_name(lim->act_dtype));
    return MSA_OK;
}

/* A plan in a fixed workspace can never grow: every limit must be set. */
static msa_status check_fixed(msa_context *ctx, const char *fn, const msa_plan_params *lim)
{
    if (lim->max_requests > 0 && lim->max_tokens > 0 && lim->max_kv_len > 0)
        return MSA_OK;
    return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                         "%s: a plan on caller workspace needs every limit set (max_requests %d, "
                         "max_tokens %lld, max_kv_len %lld; 0 means grow on update, which "
                         "reallocates)",
                         fn, lim->max_requests, (long long)lim->max_tokens,
                         (long long)lim->max_kv_len);
}

/* The backend's workspace bytes of a fixed-limit plan, asked on a plan
 * that holds only what plan_workspace reads. */
static msa_status workspace_need(msa_context *ctx, const char *fn, const msa_model *model,
                                 const msa_cache *cache, const msa_plan_params *lim, size_t *bytes)
{
    msa_plan t;
    memset(&t, 0, sizeof t);
    t.ctx = ctx;
    t.model = model;
    t.cache = (msa_cache *)cache; /* read only */
    t.params = *lim;
    t.cap_requests = lim->max_requests;
    t.cap_tokens = lim->max_tokens;
    t.cap_kv_len = lim->max_kv_len;
    t.cap_pages_per_request = pages_for(lim->max_kv_len, cache->cfg.page_size);
    msa_status st = ctx->ops->plan_workspace(&t, bytes);
    return st == MSA_OK ? MSA_OK : backend_failed(ctx, st, fn);
}

msa_status msa_plan_workspace_size(msa_context *ctx, const msa_model *model, const msa_cache *cache,
                                   const msa_plan_params *params, size_t *bytes)
{
    static const char fn[] = "msa_plan_workspace_size";
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    if (!bytes)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
    msa_plan_params lim;
    size_t need = 0;
    msa_status st = check_create(ctx, fn, model, cache, params, &lim);
    if (st == MSA_OK)
        st = check_fixed(ctx, fn, &lim);
    if (st == MSA_OK)
        st = workspace_need(ctx, fn, model, cache, &lim, &need);
    if (st != MSA_OK)
        return st;
    *bytes = need;
    msa_clear_error(ctx);
    return MSA_OK;
}

static msa_status plan_create(msa_context *ctx, const char *fn, const msa_model *model,
                              msa_cache *cache, const msa_plan_params *params, void *workspace,
                              size_t workspace_bytes, int with_workspace, msa_plan **out)
{
    if (!ctx)
        return MSA_ERR_INVALID_ARGUMENT;
    if (!out)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
    *out = NULL;
    msa_plan_params lim;
    msa_status st = check_create(ctx, fn, model, cache, params, &lim);
    if (st != MSA_OK)
        return st;
    if (with_workspace) {
        st = check_fixed(ctx, fn, &lim);
        if (st != MSA_OK)
            return st;
        const uintptr_t align = ctx->backend == MSA_BACKEND_CPU ? 64 : MSA_PLAN_WORKSPACE_ALIGNMENT;
        if (!workspace)
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "%s: workspace is NULL", fn);
        if ((uintptr_t)workspace % align)
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                 "%s: workspace %p is not aligned to %u bytes", fn, workspace,
                                 (unsigned)align);
        size_t need = 0;
        st = workspace_need(ctx, fn, model, cache, &lim, &need);
        if (st != MSA_OK)
            return st;
        if (workspace_bytes < need)
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                 "%s: workspace of %zu bytes, the plan needs %zu "
                                 "(msa_plan_workspace_size)",
                                 fn, workspace_bytes, need);
    }
    msa_plan *p = msa_plan_malloc(sizeof *p);
    if (!p)
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    memset(p, 0, sizeof *p);
    p->ctx = ctx;
    p->model = model;
    p->cache = cache;
    p->params = lim;
    if (with_workspace) {
        p->workspace = workspace;
        p->workspace_bytes = workspace_bytes;
    }
    if (msa_step_pages_init(p) != MSA_OK) {
        free(p);
        return MSA_ERR_OUT_OF_MEMORY;
    }
    /* Growable limits start small and grow with the steps they see. */
    const int64_t reqs = lim.max_requests ? lim.max_requests : 8;
    const int64_t tokens = lim.max_tokens ? lim.max_tokens : 64;
    const int64_t kv_len = lim.max_kv_len ? lim.max_kv_len : 1024;
    msa_plan_arrays cur, spare;
    int64_t ppr = 0;
    st = arrays_build(p, fn, reqs, tokens, kv_len, &cur, &spare, &ppr);
    if (st != MSA_OK) {
        msa_step_pages_free(p);
        free(p);
        return st;
    }
    arrays_install(p, &cur);
    p->spare = spare;
    p->cap_requests = (int32_t)reqs;
    p->cap_tokens = tokens;
    p->cap_kv_len = kv_len;
    p->cap_pages_per_request = ppr;
    /* The backend sizes everything a step within these capacities needs. */
    st = ctx->ops->plan_init(p);
    if (st != MSA_OK) {
        arrays_free(&cur);
        arrays_free(&spare);
        msa_step_pages_free(p);
        free(p);
        return backend_failed(ctx, st, fn);
    }
    msa_clear_error(ctx);
    *out = p;
    return MSA_OK;
}

msa_status msa_plan_create(msa_context *ctx, const msa_model *model, msa_cache *cache,
                           const msa_plan_params *params, msa_plan **out)
{
    return plan_create(ctx, "msa_plan_create", model, cache, params, NULL, 0, 0, out);
}

msa_status msa_plan_create_with_workspace(msa_context *ctx, const msa_model *model,
                                          msa_cache *cache, const msa_plan_params *params,
                                          void *workspace, size_t workspace_bytes, msa_plan **out)
{
    return plan_create(ctx, "msa_plan_create_with_workspace", model, cache, params, workspace,
                       workspace_bytes, 1, out);
}

void msa_plan_free(msa_plan *plan)
{
    if (!plan)
        return;
    if (plan->backend)
        plan->ctx->ops->plan_free(plan);
    msa_plan_arrays a = arrays_current(plan);
    arrays_free(&a);
    arrays_free(&plan->spare);
    msa_step_pages_free(plan);
    free(plan);
}

/* ---- update ------------------------------------------------------------------- */

/* SPEC section 10: everything about the step is checked before anything
 * of the plan changes. */
static msa_status validate_step(msa_plan *p, const msa_step *s, int device, const char *fn,
                                int64_t *active, int64_t *max_kv)
{
    msa_context *ctx = p->ctx;
    const msa_cache_config *cc = &p->cache->cfg;
    if (s->num_requests < 0)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "%s: num_requests is negative (%d)", fn,
                             s->num_requests);
    if (s->num_tokens < 0)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "%s: num_tokens is negative (%lld)", fn,
                             (long long)s->num_tokens);
    if (s->num_requests > 0 && (!s->q_len || !s->kv_len))
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "%s: q_len or kv_len is NULL", fn);
    int64_t sum = 0, mkv = 0;
    for (int32_t r = 0; r < s->num_requests; r++) {
        int32_t q = s->q_len[r], kv = s->kv_len[r];
        if (q < 0 || kv < 0)
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                 "%s: request %d: negative length (q_len %d, kv_len %d)", fn, r, q,
                                 kv);
        if (q > kv)
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                 "%s: request %d: q_len %d exceeds kv_len %d", fn, r, q, kv);
        sum += q;
        if (kv > mkv)
            mkv = kv;
        if (kv == 0)
            continue;
        int64_t need = pages_for(kv, cc->page_size);
        if (!s->page_table)
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "%s: page_table is NULL", fn);
        if (s->page_table_stride < need)
            return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                 "%s: request %d: page_table_stride %lld < %lld pages needed for "
                                 "kv_len %d",
                                 fn, r, (long long)s->page_table_stride, (long long)need, kv);
        if (device)
            continue; /* the entries are on the device: the kernels guard them */
        const int32_t *row = s->page_table + (int64_t)r * s->page_table_stride;
        for (int64_t n = 0; n < need; n++) {
            if (row[n] < 0)
                return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                                     "%s: request %d: no page for logical page %lld (positions in "
                                     "use up to %d)",
                                     fn, r, (long long)n, kv - 1);
            if (row[n] >= cc->num_pages)
                return msa_set_error(ctx, MSA_ERR_OUT_OF_RANGE,
                                     "%s: request %d: page id %d outside the pool of %lld pages",
                                     fn, r, row[n], (long long)cc->num_pages);
        }
    }
    if (sum > s->num_tokens)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "%s: num_tokens %lld is smaller than sum(q_len) = %lld", fn,
                             (long long)s->num_tokens, (long long)sum);
    const msa_plan_params *l = &p->params;
    if ((l->max_requests && s->num_requests > l->max_requests) ||
        (l->max_tokens && s->num_tokens > l->max_tokens) || (l->max_kv_len && mkv > l->max_kv_len))
        return msa_set_error(ctx, MSA_ERR_CAPACITY,
                             "%s: step (requests %d, tokens %lld, max kv_len %lld) exceeds the "
                             "plan's limits (%d, %lld, %lld)",
                             fn, s->num_requests, (long long)s->num_tokens, (long long)mkv,
                             l->max_requests, (long long)l->max_tokens, (long long)l->max_kv_len);
    if (l->max_q_len) {
        for (int32_t r = 0; r < s->num_requests; r++)
            if (s->q_len[r] > l->max_q_len)
                return msa_set_error(ctx, MSA_ERR_CAPACITY,
                                     "%s: request %d: q_len %d exceeds the plan's max_q_len %d", fn,
                                     r, s->q_len[r], l->max_q_len);
    }
    if (s->num_tokens > MSA_PLAN_MAX_TOKENS)
        return msa_set_error(ctx, MSA_ERR_CAPACITY,
                             "%s: num_tokens %lld exceeds the largest plan capacity (2^40 rows)",
                             fn, (long long)s->num_tokens);
    if (device && s->page_table && (uintptr_t)s->page_table % sizeof(int32_t))
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "%s: the device page table %p is not aligned to 4 bytes", fn,
                             (const void *)s->page_table);
    if (!device) {
        msa_status st = msa_step_pages_check(p, s, fn);
        if (st != MSA_OK)
            return st;
    }
    *active = sum;
    *max_kv = mkv;
    return MSA_OK;
}

/* Writes step `s` into the array set `a` (capacities of p); returns the
 * longest q_len.  A device table (device 1) is not read: its host rows
 * hold -1. */
static int32_t fill_step(const msa_plan *p, const msa_plan_arrays *a, const msa_step *s, int device)
{
    const int32_t P = p->cache->cfg.page_size;
    const int64_t ppr = p->cap_pages_per_request;
    int64_t row = 0;
    int32_t mq = 0;
    for (int32_t r = 0; r < s->num_requests; r++) {
        int32_t q = s->q_len[r], kv = s->kv_len[r];
        a->q_len[r] = q;
        a->kv_len[r] = kv;
        a->q_start[r] = row;
        int32_t *dst = a->page_table + (int64_t)r * ppr;
        int64_t need = device ? 0 : pages_for(kv, P);
        for (int64_t n = 0; n < ppr; n++)
            dst[n] = n < need ? s->page_table[(int64_t)r * s->page_table_stride + n] : -1;
        for (int32_t i = 0; i < q; i++, row++) {
            a->token_request[row] = r;
            a->token_pos[row] = (int64_t)kv - q + i;
        }
        if (q > mq)
            mq = q;
    }
    a->q_start[s->num_requests] = row;
    for (; row < p->cap_tokens; row++) {
        a->token_request[row] = -1;
        a->token_pos[row] = -1;
    }
    return mq;
}

static msa_status plan_update(msa_plan *p, const msa_step *s, msa_memory where, void *stream,
                              const char *fn)
{
    if (!p)
        return MSA_ERR_INVALID_ARGUMENT;
    msa_context *ctx = p->ctx;
    if (!s)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT, "%s: step is NULL", fn);
    if (where != MSA_MEMORY_HOST && where != MSA_MEMORY_DEVICE)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "%s: page_table_memory %d is neither MSA_MEMORY_HOST nor "
                             "MSA_MEMORY_DEVICE",
                             fn, (int)where);
    /* The CPU backend's device memory is host memory: its table is read and
     * checked as a host table. */
    const int device = where == MSA_MEMORY_DEVICE && ctx->backend != MSA_BACKEND_CPU;
    int64_t active = 0, mkv = 0;
    msa_status st = validate_step(p, s, device, fn, &active, &mkv);
    if (st != MSA_OK)
        return st;

    /* Everything the rollback needs: the plan as it is now. */
    const msa_plan saved = *p;
    const int grow = s->num_requests > p->cap_requests || s->num_tokens > p->cap_tokens ||
                     mkv > p->cap_kv_len;
    msa_plan_arrays next, next_spare;
    memset(&next_spare, 0, sizeof next_spare);
    if (grow) {
        /* A plan with all limits set never gets here: validate_step rejects
         * a step beyond a limit, and the capacities equal the limits. */
        const int64_t reqs =
            msa_capacity_grow(p->cap_requests, s->num_requests, MSA_PLAN_MAX_REQUESTS);
        const int64_t tokens = msa_capacity_grow(p->cap_tokens, s->num_tokens, MSA_PLAN_MAX_TOKENS);
        const int64_t kv_len = msa_capacity_grow(p->cap_kv_len, mkv, MSA_PLAN_MAX_KV_LEN);
        if (reqs < 0 || tokens < 0 || kv_len < 0)
            return msa_set_error(ctx, MSA_ERR_CAPACITY,
                                 "%s: step (requests %d, tokens %lld, max kv_len %lld) exceeds the "
                                 "largest plan capacities",
                                 fn, s->num_requests, (long long)s->num_tokens, (long long)mkv);
        int64_t ppr = 0;
        st = arrays_build(p, fn, reqs, tokens, kv_len, &next, &next_spare, &ppr);
        if (st != MSA_OK)
            return st;
        p->cap_requests = (int32_t)reqs;
        p->cap_tokens = tokens;
        p->cap_kv_len = kv_len;
        p->cap_pages_per_request = ppr;
        p->backend = NULL;
        st = ctx->ops->plan_init(p);
        if (st != MSA_OK) {
            arrays_free(&next);
            arrays_free(&next_spare);
            *p = saved;
            return backend_failed(ctx, st, fn);
        }
    } else {
        next = p->spare;
    }

    /* The step goes into arrays the current step does not use. */
    const int32_t mq = fill_step(p, &next, s, device);
    arrays_install(p, &next);
    p->table_on_device = device;
    p->device_table = device ? s->page_table : NULL;
    p->device_table_stride = device ? s->page_table_stride : 0;
    p->spare = grow ? next_spare : arrays_current(&saved);
    p->num_requests = s->num_requests;
    p->num_tokens = s->num_tokens;
    p->active_tokens = active;
    p->max_kv_len = mkv;
    p->max_q_len = mq;
    st = ctx->ops->plan_upload(p, stream);
    if (st != MSA_OK) {
        if (grow) {
            ctx->ops->plan_free(p);
            arrays_free(&next);
            arrays_free(&next_spare);
        }
        *p = saved;
        return backend_failed(ctx, st, fn);
    }
    if (grow) {
        /* The new state is in place: release the old one. */
        void *fresh = p->backend;
        p->backend = saved.backend;
        if (p->backend)
            ctx->ops->plan_free(p);
        p->backend = fresh;
        msa_plan_arrays old = arrays_current(&saved), old_spare = saved.spare;
        arrays_free(&old);
        arrays_free(&old_spare);
    }
    p->has_step = 1;
    msa_clear_error(ctx);
    return MSA_OK;
}

msa_status msa_plan_update(msa_plan *p, const msa_step *s, void *stream)
{
    return plan_update(p, s, MSA_MEMORY_HOST, stream, "msa_plan_update");
}

msa_status msa_plan_update_ex(msa_plan *p, const msa_step *s, msa_memory page_table_memory,
                              void *stream)
{
    return plan_update(p, s, page_table_memory, stream, "msa_plan_update_ex");
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
