/* Stage 2 (sparse layers): index block scores and top-k selection.
 *
 * Each request's index keys are read once per chunk of up to
 * MSA_CPU_INDEX_CHUNK query tokens, for all of the chunk's tokens and index
 * heads.  Block scores of a wave of chunks are kept in the plan's score
 * buffer, then every token row selects its blocks (SPEC section 4). */
#include "cpu/cpu_kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- scoring --------------------------------------------------------- */

/* Claims a task of span `sp`: its first (the owner walks its keys in
 * order, so each thread streams one contiguous range of the index keys)
 * or, when `back`, its last (a thread done with its own span helps the
 * others from their far end).  -1 when the span is empty. */
static int64_t claim_task(scan_span *sp, int back)
{
    unsigned long long r = atomic_load(&sp->range);
    for (;;) {
        uint32_t front = (uint32_t)r, end = (uint32_t)(r >> 32);
        if (front >= end)
            return -1;
        unsigned long long next = back ? (unsigned long long)(end - 1) << 32 | front
                                       : (unsigned long long)end << 32 | (front + 1);
        if (atomic_compare_exchange_weak(&sp->range, &r, next))
            return back ? (int64_t)end - 1 : (int64_t)front;
    }
}

/* The next task of thread ith: from its own span, then from the others'. */
static int64_t next_task(select_job *job, int ith)
{
    const int32_t S = job->spans, own = ith % S;
    int64_t task = claim_task(&job->span[own], 0);
    for (int32_t k = 1; task < 0 && k < S; k++)
        task = claim_task(&job->span[(own + k) % S], 1);
    return task;
}

static void score_work(void *arg, int ith, int nth)
{
    (void)nth;
    select_job *job = arg;
    cpu_plan *cp = job->plan->backend;
    float *scratch = cp->scratch + (int64_t)ith * cp->scratch_per_thread;
    for (;;) {
        int64_t task = next_task(job, ith);
        if (task < 0)
            break;
        /* Find the chunk of this task (few chunks per wave: linear is fine
         * for decode; binary search keeps prefill waves cheap). */
        int64_t lo = job->wave_lo, hi = job->wave_hi - 1;
        while (lo < hi) {
            int64_t mid = (lo + hi + 1) / 2;
            if (job->task_chunk_start[mid - job->wave_lo] <= task)
                lo = mid;
            else
                hi = mid - 1;
        }
        int64_t first = job->task_chunk_start[lo - job->wave_lo];
        int32_t b0 = (int32_t)((task - first) * MSA_CPU_SCAN_BLOCKS);
        int32_t blocks = cp->chunks[lo].blocks;
        int32_t b1 = b0 + MSA_CPU_SCAN_BLOCKS < blocks ? b0 + MSA_CPU_SCAN_BLOCKS : blocks;
        /* Prefill rows with activation-format index keys: blocked products. */
        const msa_cpu_kernels *k = msa_cpu_kernels_of(job->plan->ctx);
        if (job->plan->q_len[cp->chunks[lo].request] >= MSA_CPU_BLOCKED_MIN_Q &&
            msa_cpu_blocked_dtype(job->plan->cache->cfg.index_dtype))
            k->score_blocked(job, lo, b0, b1, scratch);
        else
            k->score_task(job, lo, b0, b1, scratch);
    }
}

/* ---- selection ------------------------------------------------------- */

/* a ranks above b: larger score, NaN below every number, lower id on ties. */
static int ranks_above(float sa, int32_t ia, float sb, int32_t ib)
{
    int na = isnan(sa), nb = isnan(sb);
    if (na != nb)
        return nb;
    if (!na && sa != sb)
        return sa > sb;
    return ia < ib;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Selects min(K, N) blocks of one (token, index head); ids ascending. */
static int32_t select_blocks(const float *score, int32_t N, int32_t K, int32_t I, int32_t Lc,
                             int32_t *ids)
{
    int32_t cnt = 0;
    int32_t init_end = I < N ? I : N;
    int32_t local_begin = N - Lc > 0 ? N - Lc : 0;
    for (int32_t n = 0; n < N; n++)
        if (n < init_end || n >= local_begin)
            ids[cnt++] = n;
    int32_t T = K < N ? K : N;
    int32_t forced = cnt;
    /* Best (T - forced) of the others, kept sorted best-first. */
    int32_t want = T - forced, have = 0;
    int32_t *best = ids + forced;
    for (int32_t n = init_end; n < local_begin && want > 0; n++) {
        float sn = score[n];
        if (have == want && !ranks_above(sn, n, score[best[have - 1]], best[have - 1]))
            continue;
        int32_t pos = have < want ? have++ : want - 1;
        while (pos > 0 && ranks_above(sn, n, score[best[pos - 1]], best[pos - 1])) {
            best[pos] = best[pos - 1];
            pos--;
        }
        best[pos] = n;
    }
    cnt = forced + have;
    qsort(ids, (size_t)cnt, sizeof *ids, cmp_i32);
    return cnt;
}

/* Selection rows of the wave, one (token, KV head) row per unit, the
 * units dealt round-robin over the threads: a decode step's few rows are
 * spread too, instead of one thread selecting a whole chunk.  A row takes
 * the selection of the index head of its KV head, or the union of its
 * index heads' selections (SPEC section 4). */
static void select_work(void *arg, int ith, int nth)
{
    select_job *job = arg;
    msa_plan *p = job->plan;
    const msa_model *m = p->model;
    cpu_plan *cp = p->backend;
    const int32_t Hi = m->cfg.num_index_heads, Hkv = m->cfg.num_kv_heads, K = m->cfg.topk_blocks;
    const int32_t W = m->topk_width;
    /* index heads per row: one, or the mm of a union */
    const int32_t mm = Hi > Hkv ? Hi / Hkv : 1;
    int32_t per_head[64 * 4];
    int32_t *heads_sel = mm * K <= (int32_t)(sizeof per_head / sizeof per_head[0])
                             ? per_head
                             : (int32_t *)(cp->scratch + (int64_t)ith * cp->scratch_per_thread);
    int32_t heads_cnt[4096];
    int64_t unit = 0;
    for (int64_t c = job->wave_lo; c < job->wave_hi; c++) {
        const cpu_chunk *ch = &cp->chunks[c];
        for (int32_t t = 0; t < ch->n; t++) {
            int64_t pos = ch->pos0 + t;
            int32_t N = (int32_t)(pos / m->cfg.block_size) + 1;
            for (int32_t g = 0; g < Hkv; g++, unit++) {
                if (unit % nth != ith)
                    continue;
                const int32_t h0 = Hi <= Hkv ? g / (Hkv / Hi) : g * mm;
                for (int32_t k = 0; k < mm; k++) {
                    const float *sc =
                        cp->scores + ch->score_off + ((int64_t)t * Hi + h0 + k) * ch->blocks;
                    heads_cnt[k] = select_blocks(sc, N, K, m->cfg.init_blocks, m->cfg.local_blocks,
                                                 heads_sel + (int64_t)k * K);
                }
                int32_t *row = cp->sel + ((ch->row0 + t) * Hkv + g) * W;
                int32_t cnt = 0;
                if (mm == 1) {
                    for (int32_t i = 0; i < heads_cnt[0]; i++)
                        row[cnt++] = heads_sel[i];
                } else {
                    /* Union of the mm index heads: merge sorted lists. */
                    int32_t cur[4096];
                    for (int32_t k = 0; k < mm; k++)
                        cur[k] = 0;
                    for (;;) {
                        int32_t best = -1;
                        for (int32_t k = 0; k < mm; k++)
                            if (cur[k] < heads_cnt[k]) {
                                int32_t v = heads_sel[(int64_t)k * K + cur[k]];
                                if (best < 0 || v < best)
                                    best = v;
                            }
                        if (best < 0)
                            break;
                        for (int32_t k = 0; k < mm; k++)
                            if (cur[k] < heads_cnt[k] && heads_sel[(int64_t)k * K + cur[k]] == best)
                                cur[k]++;
                        row[cnt++] = best;
                    }
                }
                for (; cnt < W; cnt++)
                    row[cnt] = -1;
            }
        }
    }
}

void msa_cpu_select(msa_context *ctx, msa_plan *plan, int32_t layer, const msa_layer_io *io)
{
    cpu_plan *cp = plan->backend;
    select_job job;
    job.plan = plan;
    job.io = io;
    job.layer = layer;
    const int nth = msa_threadpool_size(ctx->pool);
    job.spans = nth < MSA_CPU_SCAN_SPANS ? nth : MSA_CPU_SCAN_SPANS;
    for (int64_t w = 0; w < cp->num_waves; w++) {
        job.wave_lo = cp->wave_start[w];
        job.wave_hi = cp->wave_start[w + 1];
        job.task_chunk_start = cp->task_start;
        int64_t tasks = 0;
        for (int64_t c = job.wave_lo; c < job.wave_hi; c++) {
            job.task_chunk_start[c - job.wave_lo] = tasks;
            tasks += (cp->chunks[c].blocks + MSA_CPU_SCAN_BLOCKS - 1) / MSA_CPU_SCAN_BLOCKS;
        }
        job.task_count = tasks;
        /* Span k: tasks [tasks * k / S, tasks * (k + 1) / S). */
        for (int32_t k = 0; k < job.spans; k++) {
            uint64_t lo = (uint64_t)(tasks * k / job.spans),
                     hi = (uint64_t)(tasks * (k + 1) / job.spans);
            atomic_store(&job.span[k].range, (unsigned long long)(hi << 32 | lo));
        }
        msa_threadpool_run(ctx->pool, score_work, &job);
        msa_threadpool_run(ctx->pool, select_work, &job);
    }
}
