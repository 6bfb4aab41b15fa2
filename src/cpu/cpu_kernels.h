/* CPU backend internals: plan state, work-list types and the stage entry
 * points.  Every stage is a `work(args, ith, nth)` function run by the
 * context's thread pool. */
#ifndef MSA_CPU_KERNELS_H
#define MSA_CPU_KERNELS_H

#include "core/internal.h"

#include <stdatomic.h>

/* Query tokens that share one pass over the keys (index scan and attention
 * tiles).  Attention rows per work item = tokens * query heads <= this. */
#define MSA_CPU_INDEX_CHUNK 16
#define MSA_CPU_ATTN_ROWS 256
/* Query tokens whose attention scores of a key tile are computed in one
 * pass (register blocking of the bf16 score kernel). */
#define MSA_CPU_ATTN_GROUP 4
/* Keys converted to fp32 at a time (blocks larger than this are sub-tiled). */
#define MSA_CPU_TILE 128
/* Blocks of the index scan handed to one worker at a time. */
#define MSA_CPU_SCAN_BLOCKS 8
/* Budget of the block-score buffer; longer prefills are scored in waves. */
#define MSA_CPU_SCORE_BUDGET_FLOATS ((int64_t)8 << 20)
/* Requests with at least this many new tokens (above the decode and
 * verify range of SPEC section 7) take the blocked prefill kernels
 * (cpu_blocked_impl.h) when their planes are in an activation format. */
#define MSA_CPU_BLOCKED_MIN_Q 17
/* Largest register block of the blocked kernels on any level (rows x key
 * columns); the scratch bound below holds for every level up to it. */
#define MSA_CPU_BK_MR_MAX 8
#define MSA_CPU_BK_NR_MAX 32

/* One chunk of a request's query tokens: rows [row0, row0 + n). */
typedef struct cpu_chunk {
    int32_t request;
    int32_t n;
    int64_t row0;
    int64_t pos0;      /* position of the first token */
    int32_t blocks;    /* blocks reachable by the last token: floor(p/B) + 1 */
    int64_t score_off; /* offset of its scores in the wave's buffer */
} cpu_chunk;

typedef struct cpu_plan {
    /* Index scan schedule (sparse layers), rebuilt by plan_upload. */
    cpu_chunk *chunks; /* chunks of the index scan, MSA_CPU_INDEX_CHUNK tokens */
    int64_t num_chunks;
    int64_t chunk_cap;
    int64_t *wave_start; /* chunk index where each wave starts, num_waves + 1 */
    int64_t *task_start; /* [chunk_cap]: first scan task of each chunk of a wave */
    int64_t num_waves;
    float *scores; /* [score budget] */
    int64_t score_cap;
    cpu_chunk *attn_chunks; /* [cap_tokens]: attention chunks of one call */
    /* Selection rows of every token row: [cap_tokens][Hkv][W]. */
    int32_t *sel;
    /* Attention partials for split work items and per-thread scratch. */
    float *partials;
    int64_t partial_cap;  /* floats */
    int64_t partial_rows; /* rows of one partial slot: >= every item's rows */
    float *scratch;       /* nth * scratch_per_thread floats */
    int64_t scratch_per_thread;
} cpu_plan;

/* Where a plane keeps the row of (page, head, offset): at element
 * page * page_stride + head * head_stride + offset * row_stride of data
 * (the cache's strides, msa_cache_wrap_strided).  scale is the layer's
 * scale of the plane (msa_cache_set_scales), read by the quantized formats
 * only.  nvfp4 planes are in the library layout and use their own region
 * arithmetic (cpu_plane_nvfp4_row). */
typedef struct cpu_plane {
    const void *data;
    msa_dtype dtype;
    int32_t heads;
    int32_t dim;
    int32_t page_size;
    float scale;
    int64_t page_stride, head_stride, row_stride;
} cpu_plane;

/* The plane `pl` of `layer` of the cache, as the kernels read it. */
static inline cpu_plane cpu_plane_of(const msa_cache *c, int32_t layer, msa_plane pl)
{
    const int main_plane = pl == MSA_PLANE_K || pl == MSA_PLANE_V;
    const msa_plane_strides *s = &c->strides[layer * 4 + pl];
    cpu_plane p;
    p.data = c->planes[layer * 4 + pl];
    p.dtype = main_plane ? c->cfg.kv_dtype : c->cfg.index_dtype;
    p.heads = main_plane ? c->model->cfg.num_kv_heads : 1;
    p.dim = msa_plane_dim(c->model, pl);
    p.page_size = c->cfg.page_size;
    p.scale = c->scales[layer * 4 + pl];
    p.page_stride = s->page;
    p.head_stride = s->head;
    p.row_stride = s->token;
    return p;
}

/* 1 when the rows of one (page, head) follow each other with no gap, so
 * that a run of them inside one page is one block of memory.  Strided
 * planes whose rows are not packed are read one row at a time. */
static inline int cpu_plane_packed(const cpu_plane *p)
{
    return p->row_stride == p->dim;
}

static inline int cpu_plane_quantized(const cpu_plane *p)
{
    return p->dtype == MSA_DTYPE_FP8_E4M3 || p->dtype == MSA_DTYPE_NVFP4;
}

/* An nvfp4 row of (page, head, offset): its dim / 2 code bytes and its
 * dim / 16 group-scale bytes.  The (page, head) region holds the codes of
 * its page_size rows, then their scales (SPEC 8). */
static inline void cpu_plane_nvfp4_row(const cpu_plane *p, int32_t page, int32_t head, int32_t off,
                                       const uint8_t **codes, const uint8_t **scales)
{
    const int64_t half = (int64_t)p->page_size * p->dim / 2;
    const int64_t region = half + (int64_t)p->page_size * p->dim / 16;
    const uint8_t *base = (const uint8_t *)p->data + ((int64_t)page * p->heads + head) * region;
    *codes = base + (int64_t)off * p->dim / 2;
    *scales = base + half + (int64_t)off * p->dim / 16;
}

static inline const void *cpu_plane_row(const cpu_plane *p, int32_t page, int32_t head, int32_t off)
{
    const int64_t idx = (int64_t)page * p->page_stride + (int64_t)head * p->head_stride +
                        (int64_t)off * p->row_stride;
    return (const char *)p->data + idx * (int64_t)msa_dtype_size(p->dtype);
}

/* Whether a plane format takes the blocked prefill kernels: the
 * activation formats, which the kernels widen to fp32 exactly.  Other
 * formats (quantized planes) stay on the row kernels. */
static inline int msa_cpu_blocked_dtype(msa_dtype t)
{
    return t == MSA_DTYPE_BF16 || t == MSA_DTYPE_FP16 || t == MSA_DTYPE_FP32;
}

/* Copies key rows [j0, j0 + n) of one head into dst[n][dim] unconverted. */
void msa_cpu_copy_rows(void *dst, const cpu_plane *plane, const int32_t *page_row, int32_t head,
                       int64_t j0, int32_t n);

/* Rows [j0, j0 + n) of one head of a quantized plane (fp8_e4m3, nvfp4)
 * de-quantized into dst[n][dim] as fp32, by the read rule of SPEC 8. */
void msa_cpu_dequant_rows(float *dst, const cpu_plane *plane, const int32_t *page_row, int32_t head,
                          int64_t j0, int32_t n);

/* Stage entry points (cpu_cache_write.c, cpu_indexer.c, cpu_attention.c). */
void msa_cpu_write_cache(msa_context *ctx, msa_plan *plan, int32_t layer, const msa_layer_io *io);
void msa_cpu_select(msa_context *ctx, msa_plan *plan, int32_t layer, const msa_layer_io *io);

typedef struct cpu_attention {
    const void *q;   /* token rows, act dtype */
    int64_t q_row;   /* elements per token row */
    int32_t q_heads; /* query heads of the whole layer (rows of o) */
    int32_t group;   /* query heads per KV head */
    cpu_plane k, v;  /* K and V planes (heads = KV heads) */
    float scale;
    int32_t block;      /* tile size in keys (the selection block for sparse) */
    const int32_t *sel; /* [tokens][kv heads][width] or NULL for dense */
    int32_t sel_width;
    void *o;    /* [tokens][q_heads][dim] act dtype */
    float *lse; /* [tokens][q_heads] or NULL */
    msa_dtype act;
} cpu_attention;

void msa_cpu_attention(msa_context *ctx, msa_plan *plan, const cpu_attention *a);
/* Row (chunk ch's token t, query head h of KV head g) of the output from
 * its fp32 accumulator acc[D] and softmax state (max mx, sum l): o = acc /
 * l in the activation type, and lse = mx + ln l when the call asks for it.
 * Shared by every kernel level (the per-level attention and the merge of
 * split partials). */
void msa_cpu_attn_store(const cpu_attention *a, const cpu_chunk *ch, int32_t g, int32_t t,
                        int32_t h, const float *acc, float mx, float l);

/* Work of one attention call (cpu_attention.c): the chunks of its tokens,
 * each split over `splits` work items per KV head. */
typedef struct attn_job {
    msa_plan *plan;
    const cpu_attention *a;
    cpu_chunk *chunks; /* attention chunks of this call */
    int64_t num_chunks;
    int32_t kv_heads;
    int32_t splits; /* per (chunk, KV head) */
    int64_t items;
    atomic_llong next;
} attn_job;

/* Work of one wave of the index scan (cpu_indexer.c). */
/* Most spans of the index scan's task list (threads beyond share them). */
#define MSA_CPU_SCAN_SPANS 64

/* One thread's contiguous share of the scan tasks: the tasks [front, back)
 * not yet claimed, packed in one word (front in the low 32 bits) so that
 * the owner taking the front and another thread taking the back agree
 * through one compare-and-swap.  Each on its own cache line. */
typedef struct scan_span {
    _Alignas(64) atomic_ullong range;
} scan_span;

typedef struct select_job {
    msa_plan *plan;
    const msa_layer_io *io;
    int32_t layer;
    int64_t wave_lo, wave_hi;  /* chunk range of the wave */
    int64_t task_count;        /* scan tasks in the wave */
    int64_t *task_chunk_start; /* first task index of each chunk in the wave */
    int32_t spans;             /* spans in use: min(threads, MSA_CPU_SCAN_SPANS) */
    scan_span span[MSA_CPU_SCAN_SPANS];
} select_job;

/* The kernels of one instruction-set level.  Each level is the same source
 * (cpu_level.h) compiled with that level's flags in its own translation
 * unit (cpu_level_*.c); a context picks one table when it is created
 * (cpu_dispatch.c), so one binary runs the best code every CPU offers. */
typedef struct msa_cpu_kernels {
    msa_cpu_isa isa;
    const char *indexer, *attention, *gather; /* what each stage runs, for `msa info` */
    /* Block scores of chunk c, blocks [b0, b1) (cpu_indexer.c). */
    void (*score_task)(select_job *job, int64_t c, int32_t b0, int32_t b1, float *scratch);
    /* One attention work item (cpu_attention.c). */
    void (*attn_item)(attn_job *job, int64_t item, float *scratch);
    /* The blocked prefill kernels (cpu_blocked_impl.h): the same work as
     * score_task and attn_item, for requests with at least
     * MSA_CPU_BLOCKED_MIN_Q new tokens and activation-format planes. */
    void (*score_blocked)(select_job *job, int64_t c, int32_t b0, int32_t b1, float *scratch);
    void (*attn_blocked)(attn_job *job, int64_t item, float *scratch);
    /* The layers (MSA_CPU_ROWS_SPARSE, MSA_CPU_ROWS_DENSE) whose prefill
     * attention over bf16 activations, K and V with query groups of a
     * multiple of 16 heads runs faster on attn_item than on the blocked
     * kernels (msa_cpu_attn_blocked). */
    int rows_prefill;
    /* Key rows [j0, j0 + n) of one head into dst[n][dim] as fp32. */
    void (*load_rows)(float *dst, const cpu_plane *plane, const int32_t *page_row, int32_t head,
                      int64_t j0, int32_t n);
} msa_cpu_kernels;

/* Layers of msa_cpu_kernels.rows_prefill: sparse (the selected blocks;
 * a->sel set) and dense (every block: dense layers, index values). */
#define MSA_CPU_ROWS_SPARSE 1
#define MSA_CPU_ROWS_DENSE 2

/* Whether the attention of a request with q_len new tokens takes the
 * blocked prefill kernels of level k rather than attn_item: prefill rows
 * (at least MSA_CPU_BLOCKED_MIN_Q tokens) of activation-format planes,
 * except where the level's row kernels are faster on bf16 data
 * (rows_prefill). */
static inline int msa_cpu_attn_blocked(const msa_cpu_kernels *k, const cpu_attention *a,
                                       int32_t q_len)
{
    if (q_len < MSA_CPU_BLOCKED_MIN_Q || !msa_cpu_blocked_dtype(a->k.dtype) ||
        !msa_cpu_blocked_dtype(a->v.dtype))
        return 0;
    const int layer = a->sel ? MSA_CPU_ROWS_SPARSE : MSA_CPU_ROWS_DENSE;
    return !((k->rows_prefill & layer) && a->act == MSA_DTYPE_BF16 &&
             a->k.dtype == MSA_DTYPE_BF16 && a->v.dtype == MSA_DTYPE_BF16 && a->group % 16 == 0 &&
             a->k.dim % 16 == 0);
}

/* Per-thread scratch (floats) of the blocked kernels for model m: an
 * attention item holds at most max(MSA_CPU_ATTN_ROWS, group, index heads)
 * rows (cpu_attention.c makes its chunks so), an index chunk
 * MSA_CPU_INDEX_CHUNK tokens of every index head; see the layouts in
 * cpu_blocked_impl.h. */
static inline int64_t msa_cpu_blocked_scratch(const msa_model *m)
{
    const int64_t D = m->cfg.head_dim > m->cfg.index_dim ? m->cfg.head_dim : m->cfg.index_dim;
    int64_t R = MSA_CPU_ATTN_ROWS;
    if (m->group > R)
        R = m->group;
    if (m->cfg.num_index_heads > R)
        R = m->cfg.num_index_heads;
    const int64_t TW = MSA_CPU_TILE, TWP = TW + MSA_CPU_BK_NR_MAX, DP = D + MSA_CPU_BK_NR_MAX;
    const int64_t LDR = R + MSA_CPU_BK_NR_MAX + MSA_CPU_BK_MR_MAX;
    const int64_t attn = R * D + R * DP + 2 * R + (TW + MSA_CPU_BK_MR_MAX) * D + TW * DP + LDR * D +
                         (TW + MSA_CPU_BK_MR_MAX) * LDR + 4 * LDR + DP + LDR + R * m->topk_width +
                         R;
    const int64_t Ri = (int64_t)MSA_CPU_INDEX_CHUNK * m->cfg.num_index_heads,
                  RPi = Ri + MSA_CPU_BK_MR_MAX, Di = m->cfg.index_dim;
    const int64_t index = Ri * Di + RPi * Di + TW * Di + TWP * Di + RPi * TWP + 4 * Ri;
    return (attn > index ? attn : index) + 64;
}

/* Tables of the levels compiled into this build (NULL where not). */
const msa_cpu_kernels *msa_cpu_kernels_for(msa_cpu_isa isa);
/* The best level of this build that the CPU runs. */
msa_cpu_isa msa_cpu_best_isa(void);
/* The context's table (set by the CPU backend's init). */
static inline const msa_cpu_kernels *msa_cpu_kernels_of(const msa_context *ctx)
{
    return (const msa_cpu_kernels *)ctx->backend_state;
}

#endif
