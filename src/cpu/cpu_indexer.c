/* Stage 2 (sparse layers): index block scores and top-k selection.
 *
 * Each request's index keys are read once per chunk of up to
 * MSA_CPU_INDEX_CHUNK query tokens, for all of the chunk's tokens and index
 * heads.  Block scores of a wave of chunks are kept in the plan's score
 * buffer, then every token row selects its blocks (SPEC section 4). */
#include "cpu/cpu_kernels.h"
#include "cpu/cpu_bf16.h"
#include "cpu/cpu_math.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct select_job {
    msa_plan *plan;
    const msa_layer_io *io;
    int32_t layer;
    int64_t wave_lo, wave_hi;  /* chunk range of the wave */
    int64_t task_count;        /* scan tasks in the wave */
    int64_t *task_chunk_start; /* first task index of each chunk in the wave */
    atomic_llong next;
} select_job;

/* ---- scoring --------------------------------------------------------- */

/* Running block score of one (token, index head) row over sub-tiles. */
typedef struct score_acc {
    float mx;
    float sum; /* lse only: sum of exp(x - mx) */
    int nan;
} score_acc;

static void score_task(select_job *job, int64_t c, int32_t b0, int32_t b1, float *scratch)
{
    const msa_plan *p = job->plan;
    const msa_model *m = p->model;
    const msa_cache *cache = p->cache;
    cpu_plan *cp = p->backend;
    const cpu_chunk *ch = &cp->chunks[c];
    const int32_t Hi = m->cfg.num_index_heads, Di = m->cfg.index_dim, B = m->cfg.block_size;
    const int32_t TW = B < MSA_CPU_TILE ? B : MSA_CPU_TILE;
    const int lse = m->cfg.score_type == MSA_SCORE_LSE;
    const float c_scale = m->cfg.index_softmax_scale;
    const int32_t rows = ch->n * Hi;
    const cpu_plane ik = {cache->planes[job->layer * 4 + MSA_PLANE_INDEX_K], cache->cfg.index_dtype,
                          1, Di, cache->cfg.page_size};
    const int32_t *pt = p->page_table + (int64_t)ch->request * p->cap_pages_per_request;

    /* scratch: q [rows][Di] | key tile [TW16][Di] | raw scores [rows][TW16] | acc [rows] */
    float *q = scratch;
    float *tile = q + (int64_t)rows * Di;
    const int32_t TW16 = (TW + 15) & ~15;
    float *sr = tile + (int64_t)TW16 * Di;
    score_acc *acc = (score_acc *)(sr + (int64_t)rows * TW16);
    const char *q_src = (const char *)job->io->idx_q +
                        ch->row0 * Hi * Di * (int64_t)msa_dtype_size(job->io->act_dtype);
    /* bf16 queries and keys: dot products straight from the stored bf16
     * values (no conversion pass). */
    const int bf16_dot = MSA_CPU_HAVE_BF16_DOT && job->io->act_dtype == MSA_DTYPE_BF16 &&
                         ik.dtype == MSA_DTYPE_BF16 && Di % 32 == 0;
    if (!bf16_dot)
        msa_convert_to_f32(q, q_src, job->io->act_dtype, (int64_t)rows * Di);
    const int64_t p_last = ch->pos0 + ch->n - 1;
    float *out = cp->scores + ch->score_off;

    for (int32_t n = b0; n < b1; n++) {
        int64_t blk0 = (int64_t)n * B;
        int64_t blk1 = blk0 + B - 1 < p_last ? blk0 + B - 1 : p_last; /* last key to read */
        for (int32_t rr = 0; rr < rows; rr++)
            acc[rr] = (score_acc){-INFINITY, 0.0f, 0};
        for (int64_t j0 = blk0; j0 <= blk1; j0 += TW) {
            int32_t nk = (int32_t)(blk1 - j0 + 1 < TW ? blk1 - j0 + 1 : TW);
            /* Zero the rows up to the next multiple of 16 keys: the
             * 16-key dot products read them (their scores are not used). */
            int32_t nk16 = (nk + 15) & ~15;
            const uint16_t *keys = (const uint16_t *)tile;
            if (bf16_dot && (j0 % ik.page_size) + nk16 <= ik.page_size) {
                /* The 16-key groups lie inside one page: read them in place.
                 * Rows past the last key belong to the page too; their
                 * scores are never used. */
                keys = cpu_plane_row(&ik, pt[j0 / ik.page_size], 0, (int32_t)(j0 % ik.page_size));
            } else if (bf16_dot) {
                msa_cpu_copy_rows(tile, &ik, pt, 0, j0, nk);
                memset((uint16_t *)tile + (int64_t)nk * Di, 0, (size_t)(nk16 - nk) * Di * 2);
            } else {
                (void)keys; /* only the bf16 path reads keys in place */
                msa_cpu_load_rows(tile, &ik, pt, 0, j0, nk);
                for (int64_t i = (int64_t)nk * Di; i < (int64_t)nk16 * Di; i++)
                    tile[i] = 0.0f;
            }
            /* Raw scores of every row, one group of 16 keys at a time so the
             * group stays in L1 while all rows use it. */
            for (int32_t jj = 0; jj < nk; jj += 16) {
                if (jj + 16 < nk) /* the next group, while this one computes */
                    for (int64_t b = 0; b < (int64_t)16 * Di * (bf16_dot ? 2 : 4); b += 64)
                        __builtin_prefetch(
                            (const char *)(bf16_dot
                                               ? (const void *)(keys + (int64_t)(jj + 16) * Di)
                                               : (const void *)(tile + (int64_t)(jj + 16) * Di)) +
                            b);
                for (int32_t rr = 0; rr < rows; rr++) {
                    if (ch->pos0 + rr / Hi < j0 + jj)
                        continue; /* keys after this token */
                    float *out16 = sr + (int64_t)rr * TW16 + jj;
                    const float *qr = q + (int64_t)rr * Di;
#if MSA_CPU_HAVE_BF16_DOT
                    if (bf16_dot)
                        msa_dot16_rows_bf16(out16, (const uint16_t *)q_src + (int64_t)rr * Di,
                                            keys + (int64_t)jj * Di, Di);
                    else
#endif
                        if (Di % 16 == 0)
                        msa_dot16_rows(out16, qr, tile + (int64_t)jj * Di, Di);
                    else
                        for (int32_t l = 0; l < 16; l++)
                            out16[l] = msa_dot_f32(qr, tile + (int64_t)(jj + l) * Di, Di);
                }
            }
            for (int32_t rr = 0; rr < rows; rr++) {
                int64_t pos = ch->pos0 + rr / Hi;
                if (pos < j0)
                    continue; /* keys after this token */
                int32_t vis = pos - j0 + 1 < nk ? (int32_t)(pos - j0 + 1) : nk;
                float *sr_row = sr + (int64_t)rr * TW16;
                score_acc *a = &acc[rr];
                if (lse)
                    for (int32_t jj = 0; jj < vis; jj++)
                        sr_row[jj] *= c_scale;
                float mx = -INFINITY;
                for (int32_t jj = 0; jj < vis; jj++) {
                    if (isnan(sr_row[jj]))
                        a->nan = 1;
                    else if (sr_row[jj] > mx)
                        mx = sr_row[jj];
                }
                if (!lse || a->nan) {
                    if (mx > a->mx)
                        a->mx = mx;
                    continue;
                }
                /* lse: rescale the running sum when the maximum grows. */
                float nm = mx > a->mx ? mx : a->mx;
                if (isinf(nm)) {
                    a->mx = nm; /* +inf dominates; all -inf so far stays -inf */
                    continue;
                }
                float sum = a->sum * expf(a->mx - nm);
                for (int32_t jj = 0; jj < vis; jj++)
                    sum += expf(sr_row[jj] - nm);
                a->mx = nm;
                a->sum = sum;
            }
        }
        for (int32_t rr = 0; rr < rows; rr++) {
            if (ch->pos0 + rr / Hi < blk0)
                continue;
            const score_acc *a = &acc[rr];
            float score;
            if (a->nan)
                score = NAN; /* ranked below every number */
            else if (!lse || isinf(a->mx))
                score = a->mx;
            else
                score = a->mx + logf(a->sum);
            out[(int64_t)rr * ch->blocks + n] = score;
        }
    }
}

static void score_work(void *arg, int ith, int nth)
{
    (void)nth;
    select_job *job = arg;
    cpu_plan *cp = job->plan->backend;
    float *scratch = cp->scratch + (int64_t)ith * cp->scratch_per_thread;
    for (;;) {
        int64_t task = atomic_fetch_add(&job->next, 1);
        if (task >= job->task_count)
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
        score_task(job, lo, b0, b1, scratch);
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

static void select_work(void *arg, int ith, int nth)
{
    select_job *job = arg;
    msa_plan *p = job->plan;
    const msa_model *m = p->model;
    cpu_plan *cp = p->backend;
    const int32_t Hi = m->cfg.num_index_heads, Hkv = m->cfg.num_kv_heads, K = m->cfg.topk_blocks;
    const int32_t W = m->topk_width;
    int32_t per_head[64 * 4];
    int32_t *heads_sel = Hi * K <= (int32_t)(sizeof per_head / sizeof per_head[0])
                             ? per_head
                             : (int32_t *)(cp->scratch + (int64_t)ith * cp->scratch_per_thread);
    int32_t heads_cnt[4096];
    for (int64_t c = job->wave_lo + ith; c < job->wave_hi; c += nth) {
        const cpu_chunk *ch = &cp->chunks[c];
        for (int32_t t = 0; t < ch->n; t++) {
            int64_t pos = ch->pos0 + t;
            int32_t N = (int32_t)(pos / m->cfg.block_size) + 1;
            for (int32_t h = 0; h < Hi; h++) {
                const float *sc = cp->scores + ch->score_off + ((int64_t)t * Hi + h) * ch->blocks;
                heads_cnt[h] = select_blocks(sc, N, K, m->cfg.init_blocks, m->cfg.local_blocks,
                                             heads_sel + (int64_t)h * K);
            }
            int32_t *rows = cp->sel + (ch->row0 + t) * Hkv * W;
            for (int32_t g = 0; g < Hkv; g++) {
                int32_t *row = rows + (int64_t)g * W;
                int32_t cnt = 0;
                if (Hi <= Hkv) {
                    int32_t h = g / (Hkv / Hi);
                    for (int32_t i = 0; i < heads_cnt[h]; i++)
                        row[cnt++] = heads_sel[(int64_t)h * K + i];
                } else {
                    /* Union of index heads g*mm .. g*mm+mm-1: merge sorted lists. */
                    int32_t mm = Hi / Hkv;
                    int32_t cur[4096];
                    for (int32_t k = 0; k < mm; k++)
                        cur[k] = 0;
                    for (;;) {
                        int32_t best = -1;
                        for (int32_t k = 0; k < mm; k++) {
                            int32_t h = g * mm + k;
                            if (cur[k] < heads_cnt[h]) {
                                int32_t v = heads_sel[(int64_t)h * K + cur[k]];
                                if (best < 0 || v < best)
                                    best = v;
                            }
                        }
                        if (best < 0)
                            break;
                        for (int32_t k = 0; k < mm; k++) {
                            int32_t h = g * mm + k;
                            if (cur[k] < heads_cnt[h] && heads_sel[(int64_t)h * K + cur[k]] == best)
                                cur[k]++;
                        }
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
        atomic_store(&job.next, 0);
        msa_threadpool_run(ctx->pool, score_work, &job);
        msa_threadpool_run(ctx->pool, select_work, &job);
    }
}
