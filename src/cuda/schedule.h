/*
 * Host scheduler of the CUDA backend, in plain C11.
 *
 * msa_plan_update turns one step's metadata into a schedule: request
 * arrays, the list of decode requests (q_len <= CU_DEC_MAX_Q) with their
 * compact token rows, the prefill token list and tiles, and the work items
 * of the split decode attention.  This file holds that arithmetic and the
 * layout of the metadata blob it is written into; it allocates nothing and
 * touches no device, so the CPU-only build compiles it and its unit test
 * (tests/test_cuda_schedule.c) runs without a GPU.  plan.cu allocates the
 * blob and its pinned staging copies and uploads a filled one with one
 * asynchronous copy; the kernels read only the device copy.
 */
#ifndef MSA_CUDA_SCHEDULE_H
#define MSA_CUDA_SCHEDULE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/internal.h"

/* Functions that host and device code both call (the tile size of the
 * prefill attention: the host cuts tiles, the kernel sizes its masks). */
#if defined(__CUDACC__)
#define CU_SCHED_HD __host__ __device__
#else
#define CU_SCHED_HD
#endif

/* The structures below are loaded by the kernels in 16-byte pieces: the
 * first member of each carries the alignment, which C and C++ spell
 * differently. */
#ifdef __cplusplus
#define CU_ALIGN16 alignas(16)
#define CU_ALIGNOF(type) alignof(type)
#define CU_SCHED_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define CU_ALIGN16 _Alignas(16)
#define CU_ALIGNOF(type) _Alignof(type)
#define CU_SCHED_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

/* Requests with at most this many new tokens take the decode/verify path
 * (split-context indexer, union attention); longer ones the prefill path. */
#define CU_DEC_MAX_Q 16
/* Query rows (tokens x heads of one KV group) one attention work item owns. */
#define CU_ROWS_PER_ITEM 64
/* Keys per attention / indexer tile. */
#define CU_TILE_KEYS 64
/* Most tokens of one prefill attention tile: a key's token mask is one
 * 32-bit word. */
#define CU_PFA_MAX_TOK 32
/* Most query rows of one prefill attention tile: 8 warps of m16 tiles. */
#define CU_PFA_ROWS 128

/* The attention passes of a layer. */
enum { CU_KIND_SPARSE = 0, CU_KIND_DENSE = 1, CU_KIND_IV = 2, CU_KINDS = 3 };
/* The two prefill tile lists of a step (cu_meta.pf_tiles). */
enum { CU_PFA_MAIN = 0, CU_PFA_IV = 1, CU_PFA_LISTS = 2 };

/* Rows [row0, row0 + nrows) of one (decode request, KV head) row space
 * (row = token * G + head in group), split `split` of `nsplit` over the key
 * stream.  With nsplit > 1 the item writes partial rows starting at
 * part_base + split * nrows; a merge item combines them. */
typedef struct cu_att_item {
    CU_ALIGN16 int32_t dec;
    int32_t group;
    int32_t row0;
    int32_t nrows;
    int32_t split;
    int32_t nsplit;
    int32_t part_base;
    int32_t r;  /* request, its q_len, kv_len and first token row: */
    int32_t ql; /* host-known, so an item starts without a chain of */
    int32_t kl; /* dependent loads */
    int32_t t0;
    int32_t unit_len; /* first item of a unit (att_units): its items, 1 or 2 */
} cu_att_item;

/* One decode request as the indexer sees it (one 32-byte load). */
typedef struct cu_dec_info {
    CU_ALIGN16 int32_t r;
    int32_t ql, kl, t0;
    int32_t d0;         /* first compact decode row */
    int32_t blk0, blk1; /* its blocks in the end-to-end block sequence (none
                         * when it has at most K: nothing to score) */
    int32_t nblk;       /* blocks its last token reaches: ceil(kl / B) */
} cu_dec_info;

typedef struct cu_merge_item {
    int32_t dec;
    int32_t group;
    int32_t row0;
    int32_t nrows;
    int32_t nsplit;
    int32_t part_base;
    int32_t t0; /* first token row of the request (host-known) */
    int32_t pad1;
} cu_merge_item;

/* Host-known facts a kernel would otherwise reach through a chain of
 * dependent loads of plan data.  Between layers the key streams evict the
 * plan from L2, and a kernel that starts only when the one before it ends
 * (no room on the SM earlier) pays each link as a DRAM round trip on the
 * step's critical path; one 16-byte load brings them all. */

/* One token row, for the prologue: request (-1: padding), position, and
 * the physical page holding that position. */
typedef struct cu_tok_info {
    CU_ALIGN16 int32_t r;
    int32_t pos, page, pad;
} cu_tok_info;

/* One compact decode row, for the selection. */
typedef struct cu_dec_row {
    CU_ALIGN16 int32_t t; /* token row */
    int32_t nblk;         /* blocks its position reaches: pos / B + 1 */
    int32_t slot;         /* decode slot */
    int32_t ql;           /* the request's q_len */
} cu_dec_row;

/* Per-step counts, read by the kernels from device memory. */
typedef struct cu_step_hdr {
    int32_t num_requests;
    int32_t num_tokens;       /* rows of the token tensors */
    int32_t n_dec;            /* decode requests */
    int32_t n_dec_rows;       /* their tokens */
    int32_t n_pf;             /* prefill tokens */
    int32_t total_dec_blocks; /* sum of ceil(kv_len / B) over the decode requests
                               * with more than K blocks (those the indexer scores) */
    int32_t n_att[CU_KINDS];
    int32_t n_merge[CU_KINDS];
    int32_t n_att_units;   /* sparse pass: entries of att_units */
    int32_t max_dec_nblk;  /* largest nblk of the decode rows (0: none) */
    int32_t n_pf_tiles[2]; /* prefill attention tiles: main passes, index-value pass */
    int32_t n_pf_blocks;   /* sum of ceil(kv_len / B) over the prefill requests */
} cu_step_hdr;

/* Prefill attention tile (kernels/attention/attention_prefill_*): token
 * rows t0 .. t0 + ntok - 1 of request r, at positions pos0 ... */
typedef struct cu_pf_tile {
    CU_ALIGN16 int32_t r;
    int32_t t0, ntok, pos0;
} cu_pf_tile;

CU_SCHED_ASSERT(sizeof(cu_att_item) == 48 && CU_ALIGNOF(cu_att_item) == 16,
                "work items are loaded in 16-byte pieces");
CU_SCHED_ASSERT(sizeof(cu_dec_info) == 32 && CU_ALIGNOF(cu_dec_info) == 16,
                "a decode request is two 16-byte loads");
CU_SCHED_ASSERT(sizeof(cu_tok_info) == 16 && sizeof(cu_dec_row) == 16 && sizeof(cu_pf_tile) == 16,
                "per-row facts are one 16-byte load");
CU_SCHED_ASSERT(sizeof(cu_merge_item) == 32, "merge items are two 16-byte loads");

/* Typed views into the metadata blob (device or staging copy). */
typedef struct cu_meta {
    cu_step_hdr *hdr;
    int32_t *q_len;          /* [cap_req] */
    int32_t *kv_len;         /* [cap_req] */
    int32_t *q_start;        /* [cap_req] */
    cu_tok_info *tok_info;   /* [cap_tok] request of a row (-1 padding), position, page */
    int32_t *dec_req;        /* [cap_req] request of decode slot k */
    int32_t *dec_row0;       /* [cap_req] first compact row of decode slot k */
    int32_t *dec_blk0;       /* [cap_req + 1] prefix sum of blocks over decode slots */
    cu_dec_info *dec_info;   /* [cap_req] */
    cu_dec_row *dec_row;     /* [dec_rows_cap] */
    int32_t *pf_tok;         /* [cap_tok] token rows of prefill requests */
    cu_pf_tile *pf_tiles[2]; /* [pf_tiles_cap[i]] prefill attention tiles (main, index value) */
    /* [cap_req] first of request r's blocks in the end-to-end block
     * sequence of the step's prefill requests (-1: not a prefill request);
     * the key-block-major prefill attention keys its lists on it. */
    int32_t *pf_blk0;
    cu_att_item *att[CU_KINDS];     /* [att_cap] each */
    cu_merge_item *merge[CU_KINDS]; /* [merge_cap] each */
    /* Sparse pass, Hopper kernel: first item of each unit.  A unit is one
     * item, or two adjacent items of the same (request, KV head, split)
     * whose rows follow each other (8 tokens of 16 heads): the kernel
     * streams the union tiles once for both. */
    int32_t *att_units; /* [att_cap] */
    /* The units of the Hopper kernel's CTA c: att_units[att_cta[c] ..
     * att_cta[c + 1]), balanced by estimated cost (cu_sched_balance_units). */
    int32_t *att_cta;    /* [num_sms + 1] */
    int32_t *page_table; /* [cap_req][cap_pages]; the last uploaded, so uploads copy a prefix
                          * (a device table's rows are copied on the device) */
    /* Host-only scratch of the schedule, after the page table: never
     * uploaded (the device copy of the blob leaves it unused). */
    uint64_t *sched_heap; /* [num_sms] */
    int32_t *sched_i32;   /* [4 * att_cap + num_sms + sched_costs] */
} cu_meta;

/* What the device gives the sizing: SMs, and the grids the occupancy
 * calculator gave the tensor-core indexer and attention. */
typedef struct cu_sched_device {
    int32_t num_sms;
    int32_t grid_idx_fast;
    int32_t grid_att_fast;
} cu_sched_device;

/* Capacities, grids and the metadata layout of a plan's device state,
 * fixed when the state is created (cu_sched_size). */
typedef struct cu_sched_sizes {
    /* Capacities the state was built for (as the plan gave them, then as
     * used: at least 1). */
    int64_t plan_caps[4];
    int32_t cap_req;
    int32_t cap_tok;
    int32_t cap_q; /* longest request a step can hold: min(cap_tok, max_q_len) */
    int32_t cap_kv;
    int32_t cap_pages;
    int32_t cap_blocks;      /* ceil(cap_kv / B) (1 for dense-only models) */
    int32_t dec_rows_cap;    /* min(cap_tok, CU_DEC_MAX_Q * cap_req) */
    int32_t cap_union;       /* union entries per (decode slot, KV head) */
    int32_t att_cap;         /* items per kind */
    int32_t merge_cap;       /* merge items per kind */
    int32_t part_rows_cap;   /* partial rows of the split items */
    int32_t part_stride;     /* floats per partial row */
    int32_t sched_costs;     /* distinct unit costs of the balancing (cu_sched_balance_units) */
    int32_t pf_tiles_cap[2]; /* prefill attention tiles per list (0: the plan has no prefill) */
    int32_t pf_blocks_cap;   /* blocks of a step's prefill requests (sparse models), at most */
    /* Grids (fixed by the device and the capacities). */
    int32_t num_sms;
    int32_t grid_tok;      /* prologue */
    int32_t grid_idx;      /* SIMT indexer */
    int32_t grid_idx_fast; /* tensor-core indexer */
    int32_t grid_pf;       /* CTAs of the selection that own a prefill scratch row */
    int32_t grid_att;      /* SIMT attention */
    int32_t grid_att_fast; /* tensor-core attention */
    int32_t grid_sel;      /* selection: decode rows on every CTA, prefill on grid_pf */
    int32_t grid_merge;
    /* Scores of a row kept in shared memory by the selecting warp. */
    int32_t sel_cache;
    /* Bytes of the metadata blob, and the page table's offset in it. */
    size_t meta_bytes;
    size_t pt_offset;
} cu_sched_sizes;

/* The step's host facts the backend keeps beside the schedule (describe). */
typedef struct cu_sched_step {
    int32_t max_q_len;
    int32_t n_pf; /* prefill tokens */
} cu_sched_step;

/* Tokens of one prefill attention tile for g query heads per KV head: the
 * largest count whose rows fit in CU_PFA_ROWS (at least 1: with g > 128 a
 * token's heads take several chunks), at most CU_PFA_MAX_TOK. */
static inline CU_SCHED_HD int32_t cu_pfa_tile_tokens(int32_t g)
{
    const int32_t t = g >= CU_PFA_ROWS ? 1 : CU_PFA_ROWS / g;
    return t < CU_PFA_MAX_TOK ? t : CU_PFA_MAX_TOK;
}

/* Query heads of one KV head that a prefill attention item covers: all g,
 * or chunks of CU_PFA_ROWS when a token's heads fill more than one tile;
 * an item is (tile, KV head, chunk), ceil(g / chunk) chunks per tile. */
static inline CU_SCHED_HD int32_t cu_pfa_head_chunk(int32_t g)
{
    return g < CU_PFA_ROWS ? g : CU_PFA_ROWS;
}

/* Tiles a list needs at most: every prefill request of q_len tokens takes
 * ceil(q_len / tt) of them. */
static inline int32_t cu_pfa_tiles_cap(int32_t cap_tok, int32_t cap_req, int32_t tt)
{
    return cap_tok / tt + cap_req;
}

/* Whether any layer of the model is sparse (want_sparse 1), dense
 * (want_sparse 0) or sparse with an index-value pass (want_iv 1). */
int cu_sched_any_layer(const msa_model *m, int want_sparse, int want_iv);

/* Capacities, grids and the metadata layout for a plan on a device. */
void cu_sched_size(const msa_plan *plan, const cu_sched_device *dev, cu_sched_sizes *sz);

/* Views of a blob at `base` (device or staging) with the layout of sz;
 * returns the blob size.  With base 0 the views hold plain offsets. */
size_t cu_meta_carve(const cu_sched_sizes *sz, uintptr_t base, cu_meta *m);

/* The schedule of the plan's current step into the host views h: request
 * arrays, decode and prefill lists, page tables, the work items of every
 * attention pass and the prefill tiles.  sparse_one_round: the sparse pass
 * runs on the Hopper kernel (one CTA per SM, units dealt by cost).  A
 * step whose table is on the device (plan->table_on_device) leaves the
 * page table and the pages of tok_info (-1) to the device (plan.cu).
 * Returns 0, or -1 with nothing written when the step does not fit the
 * capacities sz was sized for (the plan re-sizes its state before that). */
int cu_sched_fill(const msa_plan *plan, const cu_sched_sizes *sz, int sparse_one_round, cu_meta *h,
                  cu_sched_step *step);

/* The step's prefill tiles into h: per list, each prefill request's
 * tokens cut into tiles, the request's last tile first (dense tiles cost
 * more the later they sit).  Part of cu_sched_fill. */
void cu_sched_fill_pf_tiles(const msa_plan *plan, const cu_sched_sizes *sz, cu_meta *h);

#ifdef __cplusplus
}
#endif

#endif /* MSA_CUDA_SCHEDULE_H */
