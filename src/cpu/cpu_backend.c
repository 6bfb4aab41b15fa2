/* The CPU backend: memory, plan state and the order of the stages. */
#include "cpu/cpu_kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Picks the kernel table: the best level under the cap that this build
 * has and this CPU runs.  A cap that names a level the build or the CPU
 * lacks is refused rather than quietly lowered, so a test or a benchmark
 * that asks for a level runs that level. */
static msa_status cpu_init(msa_context *ctx, const msa_context_params *params, char *err, size_t n)
{
    const msa_cpu_isa cap = params->cpu_isa_max;
    msa_cpu_isa isa;
    if (cap == MSA_CPU_ISA_AUTO) {
        isa = msa_cpu_best_isa();
    } else if (cap < MSA_CPU_ISA_AUTO || cap > MSA_CPU_ISA_NEON_BF16) {
        snprintf(err, n, "cpu_isa_max %d is not a CPU kernel level", (int)cap);
        return MSA_ERR_INVALID_ARGUMENT;
    } else if (!msa_cpu_kernels_for(cap)) {
        snprintf(err, n, "cpu_isa_max %s: this build has no %s kernels (best here: %s)",
                 msa_cpu_isa_name(cap), msa_cpu_isa_name(cap),
                 msa_cpu_isa_name(msa_cpu_best_isa()));
        return MSA_ERR_UNSUPPORTED;
    } else if (!msa_cpu_isa_supported(cap)) {
        snprintf(err, n, "cpu_isa_max %s: this CPU does not run %s code (best here: %s)",
                 msa_cpu_isa_name(cap), msa_cpu_isa_name(cap),
                 msa_cpu_isa_name(msa_cpu_best_isa()));
        return MSA_ERR_UNSUPPORTED;
    } else {
        isa = cap;
    }
    ctx->backend_state = (void *)msa_cpu_kernels_for(isa);
    return MSA_OK;
}

static void cpu_shutdown(msa_context *ctx)
{
    ctx->backend_state = NULL;
}

static msa_status cpu_alloc(msa_context *ctx, size_t bytes, void **out)
{
    /* 64-byte alignment for vector loads; aligned_alloc needs a multiple. */
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = rounded >= bytes ? aligned_alloc(64, rounded) : NULL;
    if (!p)
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes", bytes);
    memset(p, 0, rounded);
    *out = p;
    return MSA_OK;
}

static void cpu_free(msa_context *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static msa_status cpu_copy(msa_context *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    memmove(dst, src, bytes);
    return MSA_OK;
}

static msa_status cpu_sync(msa_context *ctx)
{
    (void)ctx;
    return MSA_OK;
}

static void cpu_plan_free(msa_plan *plan)
{
    cpu_plan *cp = plan->backend;
    if (!cp)
        return;
    if (plan->workspace) {
        /* The buffers lie in the caller's workspace. */
        free(cp);
        plan->backend = NULL;
        return;
    }
    free(cp->chunks);
    free(cp->attn_chunks);
    free(cp->wave_start);
    free(cp->task_start);
    free(cp->scores);
    free(cp->sel);
    free(cp->partials);
    free(cp->scratch);
    free(cp);
    plan->backend = NULL;
}

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

/* Per-thread scratch (floats) of the largest stage; see the layouts in
 * cpu_indexer.c and cpu_attention.c. */
static int64_t scratch_floats(const msa_model *m)
{
    const int64_t D = max64(m->cfg.head_dim, m->cfg.index_dim);
    const int64_t TW = m->cfg.block_size < MSA_CPU_TILE ? m->cfg.block_size : MSA_CPU_TILE;
    const int64_t TWa = MSA_CPU_TILE; /* dense tiles */
    /* Heads padded to 16 lanes; a chunk holds at least one token. */
    const int64_t gp = max64((m->group + 15) & ~15, (m->cfg.num_index_heads + 15) & ~15);
    const int64_t rows = max64(MSA_CPU_ATTN_ROWS, gp);
    int64_t attn = rows * D * 2 + 2 * rows + 2 * max64(TW, TWa) * D +
                   MSA_CPU_ATTN_GROUP * (int64_t)MSA_CPU_TILE * gp + rows * m->topk_width + rows +
                   MSA_CPU_TILE * 8;
    int64_t rows_i = (int64_t)MSA_CPU_INDEX_CHUNK * m->cfg.num_index_heads;
    const int64_t TW16 = (TW + 15) & ~15;
    int64_t index = rows_i * m->cfg.index_dim + TW16 * m->cfg.index_dim + rows_i * TW16 +
                    rows_i * 3 + ((rows_i + 15) & ~(int64_t)15) * m->cfg.index_dim;
    int64_t select = (int64_t)m->cfg.num_index_heads * m->cfg.topk_blocks;
    return max64(max64(max64(attn, index), select), msa_cpu_blocked_scratch(m)) + 64;
}

static int has_sparse_layer(const msa_model *m)
{
    for (int32_t l = 0; l < m->cfg.num_layers; l++)
        if (m->layer_sparse[l])
            return 1;
    return 0;
}

/* Floats of the block-score buffer that every step within the plan's
 * capacities fits in; 0 when it does not fit in size_t.  A wave of the
 * index scan holds either several chunks whose scores fit the budget, or a
 * single chunk: at most MSA_CPU_INDEX_CHUNK tokens times Hi times the
 * blocks of the longest context.  No wave holds more than all tokens of a
 * step. */
static size_t score_floats(const msa_plan *plan)
{
    const msa_model *m = plan->model;
    if (!has_sparse_layer(m))
        return 0;
    const int64_t B = m->cfg.block_size;
    const size_t blocks = (size_t)((plan->cap_kv_len + B - 1) / B);
    const size_t chunk =
        (size_t)(plan->cap_tokens < MSA_CPU_INDEX_CHUNK ? plan->cap_tokens : MSA_CPU_INDEX_CHUNK);
    size_t per_token, single, total;
    if (!msa_size_mul(blocks, (size_t)m->cfg.num_index_heads, &per_token) ||
        !msa_size_mul(per_token, chunk, &single) ||
        !msa_size_mul(per_token, (size_t)plan->cap_tokens, &total))
        return 0;
    size_t wave =
        single > (size_t)MSA_CPU_SCORE_BUDGET_FLOATS ? single : (size_t)MSA_CPU_SCORE_BUDGET_FLOATS;
    return wave < total ? wave : total;
}

/* The CPU plan's work buffers. */
enum { CHUNKS, ATTN_CHUNKS, WAVES, TASKS, SEL, PARTIALS, SCRATCH, SCORES, NBUF };

/* Sizes of the work buffers of a plan with plan->cap_*: bytes[i] of each
 * (0 for the block scores without a sparse layer) and, in *total, the bytes
 * of all of them laid out one after another at 64-byte boundaries (the
 * layout of a caller workspace).  Every product is checked: capacities come
 * from the caller. */
typedef struct cpu_sizes {
    size_t bytes[NBUF];
    size_t total;
    size_t scores;
    size_t partial_floats;
    int64_t partial_rows;
    int64_t scratch_per_thread;
} cpu_sizes;

static msa_status cpu_plan_sizes(const msa_plan *plan, cpu_sizes *z)
{
    msa_context *ctx = plan->ctx;
    const msa_model *m = plan->model;
    const int nth = msa_threadpool_size(ctx->pool);
    const size_t T = (size_t)plan->cap_tokens;
    const int64_t D = max64(m->cfg.head_dim, m->cfg.index_dim);
    /* An item holds at most MSA_CPU_ATTN_ROWS rows, or one token's query
     * heads when a group alone is larger. */
    z->partial_rows = max64(MSA_CPU_ATTN_ROWS, max64(m->group, m->cfg.num_index_heads));
    z->scratch_per_thread = (scratch_floats(m) + 15) & ~(int64_t)15;
    z->scores = score_floats(plan);
    size_t *bytes = z->bytes, sel_cells;
    z->total = 0;
    int ok =
        msa_size_mul(T, sizeof(cpu_chunk), &bytes[CHUNKS]) &&
        msa_size_mul(T, sizeof(cpu_chunk), &bytes[ATTN_CHUNKS]) &&
        msa_size_mul(T + 1, sizeof(int64_t), &bytes[WAVES]) &&
        msa_size_mul(T, sizeof(int64_t), &bytes[TASKS]) &&
        msa_size_mul(T, (size_t)m->cfg.num_kv_heads * (size_t)m->topk_width, &sel_cells) &&
        msa_size_mul(sel_cells, sizeof(int32_t), &bytes[SEL]) &&
        msa_size_mul((size_t)(4 * nth), (size_t)(z->partial_rows * (D + 2)), &z->partial_floats) &&
        msa_size_mul(z->partial_floats, sizeof(float), &bytes[PARTIALS]) &&
        msa_size_mul((size_t)z->scratch_per_thread * sizeof(float), (size_t)nth, &bytes[SCRATCH]) &&
        (z->scores != 0 || !has_sparse_layer(m)) &&
        msa_size_mul(z->scores, sizeof(float), &bytes[SCORES]);
    for (int i = 0; ok && i < NBUF; i++)
        ok = bytes[i] <= SIZE_MAX - 63 &&
             msa_size_add(z->total, (bytes[i] + 63) & ~(size_t)63, &z->total);
    if (!ok)
        return msa_set_error(ctx, MSA_ERR_CAPACITY,
                             "the CPU workspaces of these capacities (tokens %lld, kv_len %lld) "
                             "are too large to address",
                             (long long)plan->cap_tokens, (long long)plan->cap_kv_len);
    return MSA_OK;
}

static msa_status cpu_plan_workspace(const msa_plan *plan, size_t *bytes)
{
    cpu_sizes z;
    msa_status st = cpu_plan_sizes(plan, &z);
    if (st == MSA_OK)
        *bytes = z.total;
    return st;
}

/* Everything a step within the plan's capacities needs is allocated here
 * (or carved from the caller's workspace, plan->workspace), so
 * cpu_plan_upload allocates nothing.  On failure nothing is left allocated
 * and plan->backend stays NULL. */
static msa_status cpu_plan_init(msa_plan *plan)
{
    msa_context *ctx = plan->ctx;
    static const char *const what[NBUF] = {"index chunks", "attention chunks", "waves",
                                           "scan tasks",   "selections",       "partials",
                                           "scratch",      "block scores"};
    cpu_sizes z;
    msa_status status = cpu_plan_sizes(plan, &z);
    if (status != MSA_OK)
        return status;
    const size_t host = msa_host_memory_bytes();
    if (!plan->workspace && z.total > host)
        return msa_set_error(
            ctx, MSA_ERR_OUT_OF_MEMORY,
            "the CPU workspaces of these capacities (tokens %lld, kv_len %lld) need "
            "%.1f GiB, more than the %.1f GiB of memory of this machine",
            (long long)plan->cap_tokens, (long long)plan->cap_kv_len, (double)z.total / (1 << 30),
            (double)host / (1 << 30));
    if (plan->workspace && plan->workspace_bytes < z.total)
        return msa_set_error(ctx, MSA_ERR_INVALID_ARGUMENT,
                             "workspace of %zu bytes, the CPU plan needs %zu",
                             plan->workspace_bytes, z.total);

    cpu_plan *cp = msa_plan_malloc(sizeof *cp);
    if (!cp)
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY, "out of memory for the CPU plan state");
    memset(cp, 0, sizeof *cp);
    void *got[NBUF] = {NULL};
    size_t off = 0;
    for (int i = 0; i < NBUF; i++) {
        if (i == SCORES && z.scores == 0)
            break; /* no sparse layer: no block scores */
        if (plan->workspace) {
            /* Each buffer at a 64-byte boundary of the caller's block (the
             * scratch is read with aligned vector loads). */
            got[i] = (char *)plan->workspace + off;
            off += (z.bytes[i] + 63) & ~(size_t)63;
            continue;
        }
        got[i] = i == SCRATCH ? msa_plan_aligned_alloc(z.bytes[i]) : msa_plan_malloc(z.bytes[i]);
        if (!got[i]) {
            for (int j = 0; j < i; j++)
                free(got[j]);
            free(cp);
            return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY,
                                 "out of memory for the CPU %s (%zu bytes)", what[i], z.bytes[i]);
        }
        msa_count_device_allocation(); /* the CPU backend's device memory is host memory */
    }
    cp->chunks = got[CHUNKS];
    cp->attn_chunks = got[ATTN_CHUNKS];
    cp->wave_start = got[WAVES];
    cp->task_start = got[TASKS];
    cp->sel = got[SEL];
    cp->partials = got[PARTIALS];
    cp->scratch = got[SCRATCH];
    cp->scores = got[SCORES];
    cp->chunk_cap = plan->cap_tokens;
    cp->score_cap = (int64_t)z.scores;
    cp->partial_rows = z.partial_rows;
    cp->partial_cap = (int64_t)z.partial_floats;
    cp->scratch_per_thread = z.scratch_per_thread;
    plan->backend = cp;
    return MSA_OK;
}

/* Index-scan schedule: chunks of each request's tokens, grouped in waves
 * whose block scores fit the score buffer.  With chunks == NULL it only
 * counts chunks and waves and measures the largest wave. */
static void schedule(const msa_plan *plan, cpu_chunk *chunks, int64_t *wave_start,
                     int64_t *num_chunks, int64_t *num_waves, int64_t *need)
{
    const msa_model *m = plan->model;
    const int32_t B = m->cfg.block_size, Hi = m->cfg.num_index_heads;
    int64_t nc = 0, nw = 0, wave_floats = 0, most = 0;
    if (chunks)
        wave_start[0] = 0;
    for (int32_t r = 0; r < plan->num_requests; r++) {
        for (int32_t t0 = 0; t0 < plan->q_len[r]; t0 += MSA_CPU_INDEX_CHUNK) {
            cpu_chunk ch;
            ch.request = r;
            ch.n = plan->q_len[r] - t0 < MSA_CPU_INDEX_CHUNK ? plan->q_len[r] - t0
                                                             : MSA_CPU_INDEX_CHUNK;
            ch.row0 = plan->q_start[r] + t0;
            ch.pos0 = (int64_t)plan->kv_len[r] - plan->q_len[r] + t0;
            ch.blocks = (int32_t)((ch.pos0 + ch.n - 1) / B) + 1;
            int64_t f = (int64_t)ch.n * Hi * ch.blocks;
            if (wave_floats > 0 && wave_floats + f > MSA_CPU_SCORE_BUDGET_FLOATS) {
                ++nw;
                if (chunks)
                    wave_start[nw] = nc;
                wave_floats = 0;
            }
            ch.score_off = wave_floats;
            wave_floats += f;
            most = max64(most, wave_floats);
            if (chunks)
                chunks[nc] = ch;
            nc++;
        }
    }
    if (wave_floats > 0) {
        ++nw;
        if (chunks)
            wave_start[nw] = nc;
    }
    *num_chunks = nc;
    *num_waves = nw;
    *need = most;
}

/* Publishes the step's schedule.  It is measured first: a step that would
 * not fit the buffers sized by cpu_plan_init is refused before anything of
 * the previous schedule changes (the core keeps steps within the
 * capacities, so this does not happen). */
static msa_status cpu_plan_upload(msa_plan *plan, void *stream)
{
    (void)stream;
    cpu_plan *cp = plan->backend;
    int64_t nc, nw, need;
    schedule(plan, NULL, NULL, &nc, &nw, &need);
    if (nc > cp->chunk_cap || (has_sparse_layer(plan->model) && need > cp->score_cap))
        return msa_set_error(plan->ctx, MSA_ERR_CAPACITY,
                             "the step needs %lld index chunks and %lld block scores, the CPU plan "
                             "holds %lld and %lld",
                             (long long)nc, (long long)need, (long long)cp->chunk_cap,
                             (long long)cp->score_cap);
    schedule(plan, cp->chunks, cp->wave_start, &cp->num_chunks, &cp->num_waves, &need);
    return MSA_OK;
}

/* The fast path reads bf16 planes with bf16 dot products, AVX512-BF16 or
 * Arm's BFDOT (bf16 activations needed too, which only msa_forward sees). */
static void cpu_describe(const msa_plan *plan, int32_t layer, const char **kernel,
                         const char **reason)
{
    const int sparse = plan->model->layer_sparse[layer];
    const msa_cache_config *c = &plan->cache->cfg;
    const int bf16 = c->kv_dtype == MSA_DTYPE_BF16 && (!sparse || c->index_dtype == MSA_DTYPE_BF16);
    const msa_cpu_isa isa = msa_cpu_kernels_of(plan->ctx)->isa;
    const int bf16_dot = isa == MSA_CPU_ISA_AVX512_BF16 || isa == MSA_CPU_ISA_NEON_BF16;
    if (bf16_dot && bf16) {
        *kernel = sparse ? "cpu_sparse_bf16dot" : "cpu_dense_bf16dot";
        *reason = "";
    } else {
        *kernel = sparse ? "cpu_sparse" : "cpu_dense";
        *reason = !bf16_dot ? "fp32 dot products: the context's CPU level has no bf16 dot "
                              "products (AVX512-BF16, Arm BF16)"
                            : "fp32 dot products: bf16 dot products need bf16 cache planes";
    }
}

static void fill_padding(const msa_plan *plan, int32_t layer, const msa_layer_io *io)
{
    const msa_model *m = plan->model;
    const int64_t a = plan->active_tokens, T = plan->num_tokens;
    if (T <= a)
        return;
    const int64_t Hq = m->cfg.num_q_heads, D = m->cfg.head_dim, Hi = m->cfg.num_index_heads,
                  Di = m->cfg.index_dim, Hkv = m->cfg.num_kv_heads, W = m->topk_width;
    const size_t es = msa_dtype_size(io->act_dtype);
    /* All-zero bits are +0.0 in every activation format. */
    memset((char *)io->o + a * Hq * D * (int64_t)es, 0, (size_t)((T - a) * Hq * D) * es);
    if (m->layer_index_value[layer])
        memset((char *)io->idx_o + a * Hi * Di * (int64_t)es, 0, (size_t)((T - a) * Hi * Di) * es);
    if (io->lse)
        for (int64_t i = a * Hq; i < T * Hq; i++)
            io->lse[i] = -INFINITY;
    if (io->topk && m->layer_sparse[layer])
        for (int64_t i = a * Hkv * W; i < T * Hkv * W; i++)
            io->topk[i] = -1;
}

static msa_status cpu_forward(msa_context *ctx, msa_plan *plan, int32_t layer,
                              const msa_layer_io *io)
{
    const msa_model *m = plan->model;
    const msa_cache *c = plan->cache;
    cpu_plan *cp = plan->backend;
    const int sparse = m->layer_sparse[layer];
    if (io->write_cache && plan->active_tokens > 0)
        msa_cpu_write_cache(ctx, plan, layer, io);
    fill_padding(plan, layer, io);
    if (plan->active_tokens == 0)
        return MSA_OK;
    if (sparse) {
        msa_cpu_select(ctx, plan, layer, io);
        if (io->topk)
            memcpy(io->topk, cp->sel,
                   (size_t)(plan->active_tokens * m->cfg.num_kv_heads * m->topk_width) *
                       sizeof(int32_t));
    }
    cpu_attention a;
    a.q = io->q;
    a.q_row = (int64_t)m->cfg.num_q_heads * m->cfg.head_dim;
    a.q_heads = m->cfg.num_q_heads;
    a.group = m->group;
    a.k = cpu_plane_of(c, layer, MSA_PLANE_K);
    a.v = cpu_plane_of(c, layer, MSA_PLANE_V);
    a.scale = m->cfg.softmax_scale;
    a.block = sparse ? m->cfg.block_size : MSA_CPU_TILE;
    a.sel = sparse ? cp->sel : NULL;
    a.sel_width = m->topk_width;
    a.o = io->o;
    a.lse = io->lse;
    a.act = io->act_dtype;
    msa_cpu_attention(ctx, plan, &a);

    if (m->layer_index_value[layer]) {
        cpu_attention b;
        b.q = io->idx_q;
        b.q_row = (int64_t)m->cfg.num_index_heads * m->cfg.index_dim;
        b.q_heads = m->cfg.num_index_heads;
        b.group = m->cfg.num_index_heads;
        b.k = cpu_plane_of(c, layer, MSA_PLANE_INDEX_K);
        b.v = cpu_plane_of(c, layer, MSA_PLANE_INDEX_V);
        b.scale = m->cfg.index_softmax_scale;
        b.block = MSA_CPU_TILE;
        b.sel = NULL;
        b.sel_width = m->topk_width;
        b.o = io->idx_o;
        b.lse = NULL;
        b.act = io->act_dtype;
        msa_cpu_attention(ctx, plan, &b);
    }
    return MSA_OK;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static msa_status cpu_bench_forward(msa_context *ctx, msa_plan *plan, int32_t layer,
                                    const msa_layer_io *io_sets, int num_sets, int warmup, int reps,
                                    double *times_us)
{
    for (int i = 0; i < warmup + reps; i++) {
        const msa_layer_io *io = &io_sets[i % num_sets];
        double t0 = now_us();
        msa_status st = cpu_forward(ctx, plan, layer, io);
        double t1 = now_us();
        if (st != MSA_OK)
            return st;
        if (i >= warmup)
            times_us[i - warmup] = t1 - t0;
    }
    return MSA_OK;
}

typedef struct read_job {
    const uint64_t *data;
    int64_t words;
    uint64_t sums[256];
} read_job;

static void read_work(void *arg, int ith, int nth)
{
    read_job *job = arg;
    int64_t lo = job->words * ith / nth, hi = job->words * (ith + 1) / nth;
    uint64_t acc[8] = {0};
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] ^= job->data[i + l];
    for (; i < hi; i++)
        acc[0] ^= job->data[i];
    job->sums[ith % 256] = acc[0] ^ acc[1] ^ acc[2] ^ acc[3] ^ acc[4] ^ acc[5] ^ acc[6] ^ acc[7];
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static msa_status cpu_bench_read_bandwidth(msa_context *ctx, size_t bytes, int reps, double *gbps)
{
    uint64_t *buf = NULL;
    msa_status st = cpu_alloc(ctx, bytes, (void **)&buf);
    if (st != MSA_OK)
        return st;
    double *rates = malloc((size_t)reps * sizeof *rates);
    if (!rates) {
        free(buf);
        return msa_set_error(ctx, MSA_ERR_OUT_OF_MEMORY, "out of memory");
    }
    read_job job;
    job.data = buf;
    job.words = (int64_t)(bytes / sizeof(uint64_t));
    for (int64_t i = 0; i < job.words; i++)
        buf[i] = (uint64_t)i * 0x9e3779b97f4a7c15ull;
    msa_threadpool_run(ctx->pool, read_work, &job); /* warm-up: page faults */
    for (int r = 0; r < reps; r++) {
        double t0 = now_us();
        msa_threadpool_run(ctx->pool, read_work, &job);
        double t1 = now_us();
        rates[r] = (double)job.words * 8.0 / ((t1 - t0) * 1e3);
    }
    qsort(rates, (size_t)reps, sizeof *rates, cmp_double);
    *gbps = rates[reps / 2];
    free(rates);
    free(buf);
    return MSA_OK;
}

const msa_backend_ops msa_cpu_backend_ops = {
    .name = "cpu",
    .init = cpu_init,
    .shutdown = cpu_shutdown,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_in = cpu_copy,
    .copy_out = cpu_copy,
    .synchronize = cpu_sync,
    .plan_init = cpu_plan_init,
    .plan_workspace = cpu_plan_workspace,
    .plan_upload = cpu_plan_upload,
    .plan_free = cpu_plan_free,
    .describe = cpu_describe,
    .forward = cpu_forward,
    .bench_forward = cpu_bench_forward,
    .bench_read_bandwidth = cpu_bench_read_bandwidth,
};
