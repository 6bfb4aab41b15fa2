/* Stage 3: attention over the cache (SPEC sections 5 and 6).
 *
 * One work item = (chunk of a request's tokens, KV head, split).  The item
 * walks the union of the blocks its tokens use, converts each K/V tile to
 * fp32 once, and applies it to every (token, query head) row that needs it
 * (per-token membership and causal masks), with an online softmax.  When
 * there are too few items to feed the threads, each item's blocks are split
 * and the fp32 partials merged by their log-sum-exp. */
#include "cpu/cpu_kernels.h"
#include "cpu/cpu_math.h"

#include <math.h>

void msa_cpu_attn_store(const cpu_attention *a, const cpu_chunk *ch, int32_t g, int32_t t,
                        int32_t h, const float *acc, float mx, float l)
{
    const int32_t D = a->k.dim, Hq = a->q_heads;
    int64_t row = ch->row0 + t;
    int32_t hq = g * a->group + h;
    float inv = 1.0f / l;
    float tmp[512];
    for (int32_t d0 = 0; d0 < D; d0 += 512) {
        int32_t n = D - d0 < 512 ? D - d0 : 512;
        for (int32_t d = 0; d < n; d++)
            tmp[d] = acc[d0 + d] * inv;
        msa_convert_from_f32((char *)a->o +
                                 ((row * Hq + hq) * D + d0) * (int64_t)msa_dtype_size(a->act),
                             a->act, tmp, n);
    }
    if (a->lse)
        a->lse[row * Hq + hq] = mx + logf(l);
}

static void attn_work(void *arg, int ith, int nth)
{
    (void)nth;
    attn_job *job = arg;
    cpu_plan *cp = job->plan->backend;
    float *scratch = cp->scratch + (int64_t)ith * cp->scratch_per_thread;
    const msa_cpu_kernels *k = msa_cpu_kernels_of(job->plan->ctx);
    for (;;) {
        int64_t item = atomic_fetch_add(&job->next, 1);
        if (item >= job->items)
            break;
        /* Prefill rows with activation-format K and V planes: blocked
         * products (but msa_cpu_attn_blocked); everything else row by row. */
        const cpu_chunk *ch = &job->chunks[item / job->splits / job->kv_heads];
        if (msa_cpu_attn_blocked(k, job->a, job->plan->q_len[ch->request]))
            k->attn_blocked(job, item, scratch);
        else
            k->attn_item(job, item, scratch);
    }
}

/* Merges the splits of each (chunk, KV head) by log-sum-exp. */
static void merge_work(void *arg, int ith, int nth)
{
    attn_job *job = arg;
    const cpu_attention *a = job->a;
    cpu_plan *cp = job->plan->backend;
    const int32_t S = job->splits, D = a->k.dim, G = a->group;
    float *acc = cp->scratch + (int64_t)ith * cp->scratch_per_thread;
    int64_t pairs = job->items / S;
    for (int64_t pair = ith; pair < pairs; pair += nth) {
        const cpu_chunk *ch = &job->chunks[pair / job->kv_heads];
        int32_t g = (int32_t)(pair % job->kv_heads);
        for (int32_t r = 0; r < ch->n * G; r++) {
            float mx = -INFINITY;
            for (int32_t sp = 0; sp < S; sp++) {
                const float *pr = cp->partials + ((pair * S + sp) * cp->partial_rows + r) * (D + 2);
                if (pr[D] > mx)
                    mx = pr[D];
            }
            float l = 0.0f;
            for (int32_t d = 0; d < D; d++)
                acc[d] = 0.0f;
            for (int32_t sp = 0; sp < S; sp++) {
                const float *pr = cp->partials + ((pair * S + sp) * cp->partial_rows + r) * (D + 2);
                if (pr[D + 1] == 0.0f)
                    continue; /* this split saw no key of the row */
                float w = msa_exp_neg(pr[D] - mx);
                l += pr[D + 1] * w;
                msa_axpy_f32(acc, w, pr, D);
            }
            msa_cpu_attn_store(a, ch, g, r / G, r % G, acc, mx, l);
        }
    }
}

void msa_cpu_attention(msa_context *ctx, msa_plan *plan, const cpu_attention *a)
{
    cpu_plan *cp = plan->backend;
    attn_job job;
    job.plan = plan;
    job.a = a;
    job.kv_heads = a->k.heads;
    /* Chunks of up to MSA_CPU_ATTN_ROWS / group tokens per request. */
    int32_t tq = MSA_CPU_ATTN_ROWS / ((a->group + 15) & ~15);
    if (tq < 1)
        tq = 1;
    int64_t nc = 0;
    for (int32_t r = 0; r < plan->num_requests; r++) {
        for (int32_t t0 = 0; t0 < plan->q_len[r]; t0 += tq) {
            cpu_chunk *ch = &cp->attn_chunks[nc++];
            ch->request = r;
            ch->n = plan->q_len[r] - t0 < tq ? plan->q_len[r] - t0 : tq;
            ch->row0 = plan->q_start[r] + t0;
            ch->pos0 = (int64_t)plan->kv_len[r] - plan->q_len[r] + t0;
            ch->blocks = 0;
            ch->score_off = 0;
        }
    }
    job.chunks = cp->attn_chunks;
    job.num_chunks = nc;
    int64_t pairs = nc * job.kv_heads;
    int nth = msa_threadpool_size(ctx->pool);
    int32_t splits = 1;
    if (pairs > 0 && pairs < 2 * nth)
        splits = (int32_t)((2 * nth + pairs - 1) / pairs);
    job.splits = splits;
    job.items = pairs * splits;
    atomic_store(&job.next, 0);
    msa_threadpool_run(ctx->pool, attn_work, &job);
    if (splits > 1)
        msa_threadpool_run(ctx->pool, merge_work, &job);
}
