/*
 * Device-side plan of the CUDA backend.
 *
 * msa_plan_update (host) turns one step's metadata into a schedule: request
 * arrays, the list of decode requests (q_len <= CU_DEC_MAX_Q) with their
 * compact token rows, the prefill token list, and the work items of the
 * split decode attention.  Everything is packed into one pinned staging
 * buffer and copied with one async copy into a device blob whose layout is
 * fixed by the plan's capacities.  Kernels read only this blob (and the
 * workspaces below), so a graph captured once replays correctly after any
 * later update: the addresses never move, only the contents.
 */
#ifndef MSA_CUDA_PLAN_CUH
#define MSA_CUDA_PLAN_CUH

#include "cuda/common/common.cuh"

#include <cuda.h>

enum { CU_KIND_SPARSE = 0, CU_KIND_DENSE = 1, CU_KIND_IV = 2, CU_KINDS = 3 };

/* A sparse layer's tensor maps (cu_plan_state.maps). */
enum { CU_MAP_INDEX_K = 0, CU_MAP_K = 1, CU_MAP_V = 2, CU_MAPS = 3 };

/* Rows [row0, row0 + nrows) of one (decode request, KV head) row space
 * (row = token * G + head in group), split `split` of `nsplit` over the key
 * stream.  With nsplit > 1 the item writes partial rows starting at
 * part_base + split * nrows; a merge item combines them. */
typedef struct __align__(16) cu_att_item
{
    int32_t dec;
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
}
cu_att_item;

/* One decode request as the indexer sees it (one 32-byte load). */
typedef struct __align__(16) cu_dec_info
{
    int32_t r, ql, kl, t0;
    int32_t d0;         /* first compact decode row */
    int32_t blk0, blk1; /* its blocks in the end-to-end block sequence (none
                         * when it has at most K: nothing to score) */
    int32_t nblk;       /* blocks its last token reaches: ceil(kl / B) */
}
cu_dec_info;

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
typedef struct __align__(16) cu_tok_info
{
    int32_t r, pos, page, pad;
}
cu_tok_info;

/* One compact decode row, for the selection. */
typedef struct __align__(16) cu_dec_row
{
    int32_t t;    /* token row */
    int32_t nblk; /* blocks its position reaches: pos / B + 1 */
    int32_t slot; /* decode slot */
    int32_t ql;   /* the request's q_len */
}
cu_dec_row;

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
} cu_step_hdr;

/* Prefill attention tile (kernels/attention/attention_prefill_mma_sm80):
 * token rows t0 .. t0 + ntok - 1 of request r, at positions pos0 ... */
typedef struct __align__(16) cu_pf_tile
{
    int32_t r, t0, ntok, pos0;
}
cu_pf_tile;

/* Typed views into the metadata blob (device or staging copy). */
typedef struct cu_meta {
    cu_step_hdr *hdr;
    int32_t *q_len;             /* [cap_req] */
    int32_t *kv_len;            /* [cap_req] */
    int32_t *q_start;           /* [cap_req] */
    cu_tok_info *tok_info;      /* [cap_tok] request of a row (-1 padding), position, page */
    int32_t *dec_req;           /* [cap_req] request of decode slot k */
    int32_t *dec_row0;          /* [cap_req] first compact row of decode slot k */
    int32_t *dec_blk0;          /* [cap_req + 1] prefix sum of blocks over decode slots */
    cu_dec_info *dec_info;      /* [cap_req] */
    cu_dec_row *dec_row;        /* [dec_rows_cap] */
    int32_t *pf_tok;            /* [cap_tok] token rows of prefill requests */
    cu_pf_tile *pf_tiles[2];    /* [pf_tiles_cap[i]] prefill attention tiles (main, index value) */
    cu_att_item *att[CU_KINDS]; /* [att_cap] each */
    cu_merge_item *merge[CU_KINDS]; /* [merge_cap] each */
    /* Sparse pass, Hopper kernel: first item of each unit.  A unit is one
     * item, or two adjacent items of the same (request, KV head, split)
     * whose rows follow each other (8 tokens of 16 heads): the kernel
     * streams the union tiles once for both. */
    int32_t *att_units; /* [att_cap] */
    /* The units of the Hopper kernel's CTA c: att_units[att_cta[c] ..
     * att_cta[c + 1]), balanced by estimated cost (cu_balance_units). */
    int32_t *att_cta;    /* [num_sms + 1] */
    int32_t *page_table; /* [cap_req][cap_pages]; the last uploaded, so uploads copy a prefix */
    /* Host-only scratch of the schedule, after the page table: never
     * uploaded (the device copy of the blob leaves it unused). */
    uint64_t *sched_heap; /* [num_sms] */
    int32_t *sched_i32;   /* [4 * att_cap + num_sms + sched_costs] */
} cu_meta;

/* Which kernels a layer runs: decided once per plan state, from the
 * device, the model, the cache and the plan's act_dtype (cu_plan_paths);
 * the schedule, the description and the forward read it. */
typedef struct cu_paths {
    int idx_fast;   /* tensor-core indexer (else SIMT) */
    int attn_fast;  /* tensor-core attention (else SIMT) */
    int iv_fast;    /* tensor-core index-value attention (else SIMT) */
    int idx_tma;    /* Hopper indexer (tensor maps), when idx_fast */
    int attn_tma;   /* Hopper sparse attention (tensor maps), when attn_fast */
    int pf_fast;    /* prefill rows of the main pass on tensor cores (attention_prefill_mma_sm80) */
    int pf_iv_fast; /* and of the index-value pass */
    int pf_tma;     /* the main pass's on Hopper (attention_prefill_tma_sm90), when pf_fast */
} cu_paths;

/* Bytes of a layer's fallback reason. */
#define CU_WHY_BYTES 512

typedef struct cu_plan_state {
    /* Capacities this state was built for (as the plan gave them, then as
     * used: at least 1). */
    int64_t plan_caps[4];
    int32_t cap_req;
    int32_t cap_tok;
    int32_t cap_q; /* longest request a step can hold: min(cap_tok, max_q_len) */
    int32_t cap_kv;
    int32_t cap_pages;
    int32_t cap_blocks;   /* ceil(cap_kv / B) (1 for dense-only models) */
    int32_t dec_rows_cap; /* min(cap_tok, CU_DEC_MAX_Q * cap_req) */
    int32_t cap_union;    /* union entries per (decode slot, KV head) */
    int32_t att_cap;      /* items per kind */
    int32_t merge_cap;
    int32_t part_rows_cap;
    int32_t part_stride;     /* floats per partial row */
    int32_t sched_costs;     /* distinct unit costs of the balancing (cu_balance_units) */
    int32_t pf_tiles_cap[2]; /* prefill attention tiles per list (0: the plan has no prefill) */

    /* Grids (fixed by device and capacities). */
    int grid_tok, grid_idx, grid_idx_fast, grid_pf, grid_att, grid_att_fast;
    int grid_sel; /* selection: decode rows on every CTA, prefill on grid_pf */
    int grid_merge;
    int grid_pfa; /* prefill attention on tensor cores (0: not set up, scalar rows) */
    int pfh;      /* and its Hopper kernel (attention_prefill_tma_sm90) set up */
    int num_sms;
    int pdl;       /* programmatic dependent launch between kernels */
    int tma;       /* Hopper tensor-map kernels available */
    int wgmma;     /* and the sm_90a warpgroup products (the Hopper indexer) */
    int pfi_wgmma; /* the prefill indexer's products as warpgroup products */

    /* Metadata blob: device copy, two pinned staging copies (an upload
     * never overwrites a staging buffer an earlier async copy may still
     * read: each has an event recorded after its copy). */
    size_t meta_bytes;
    size_t pt_offset; /* byte offset of the page table */
    void *meta_dev;
    void *staging[2];
    cudaEvent_t staged[2];
    int staging_used[2];
    int next_staging;
    cu_meta dev; /* views into meta_dev */

    /* Workspaces. */
    float *scores;     /* [dec_rows_cap][Hi][cap_blocks] block scores */
    int32_t *sel;      /* [cap_tok][Hkv][W] selected blocks per KV head */
    int32_t *uids;     /* [cap_req][Hkv][cap_union] union of a request's blocks */
    uint32_t *umask;   /* same shape: bit i = token i selected the block */
    int32_t *ucnt;     /* [cap_req][Hkv] */
    int32_t *sel_done; /* [cap_req][units] selection completion counters (kept 0) */
    int32_t *idx_next; /* the Hopper indexer's next on-demand chunk (back to 0 at each end) */
    int32_t sel_cache; /* scores cached per selecting warp (shared memory) */
    float *pf_scratch; /* [grid_pf][mi][cap_blocks] prefill block scores */
    float *part;       /* [part_rows_cap][part_stride] split partials */
    /* Prefill indexer on tensor cores (kernels/indexer/indexer_prefill_mma_sm80.cu):
     * its persistent grid and block-score workspace [grid_pfi][64][cap_blocks];
     * NULL where no layer's shapes fit it (the selection's scalar role then);
     * and its key-range splits' candidates and completion counts. */
    int grid_pfi;
    float *pfi_scratch;
    int32_t *pfi_split;

    /* Tensor maps of the layers' planes for the Hopper kernels (index K:
     * sparse layers; K and V: every layer, for the prefill kernel),
     * encoded once when the plan is created (the planes are fixed for the
     * cache's life): maps[layer * CU_MAPS + m], bit m of map_ok[layer] set
     * when map m could be encoded.  NULL without tensor-map kernels. */
    CUtensorMap *maps;
    uint8_t *map_ok;

    /* The kernels of every layer (cu_plan_paths), NULL before they are
     * decided, and why a fast path was not taken ("" when it was). */
    cu_paths *path;                 /* [num_layers] */
    char (*path_why)[CU_WHY_BYTES]; /* [num_layers] */
    int sparse_tma;                 /* some sparse layer runs the Hopper attention */

    /* Host view of the current step (for describe). */
    int32_t max_q_len;
    int32_t n_pf;
    char why_step[CU_WHY_BYTES]; /* describe()'s text when the step adds a note */
} cu_plan_state;

/* Host side of the plan (plan.cu): the state's sizes and metadata layout,
 * and one step's schedule written into host views of the metadata.  Pure
 * host arithmetic, so the scheduling test runs them without a GPU. */
void cu_state_size(const msa_plan *plan, int num_sms, int grid_idx_fast, int grid_att_fast,
                   cu_plan_state *st);
size_t cu_meta_carve(const cu_plan_state *st, uintptr_t base, cu_meta *m);
void cu_step_fill(const msa_plan *plan, cu_plan_state *st, cu_meta *h);

/* A Hopper attention producer stages a request's page-table row and
 * builds a union of several tokens in shared memory, for requests of at
 * most this many blocks (256K keys; longer ones: the selection builds the
 * union, the pages come from the table) and unions of at most
 * CU_ATT_UNION_LIST entries (cap_union at most). */
#define CU_ATT_UNION_BLOCKS 2048
#define CU_ATT_UNION_LIST 256

/* Everything a kernel needs for one layer, passed by value. */
typedef struct cu_layer {
    /* Shapes. */
    int32_t Hq, Hkv, D, G;
    int32_t Hi, Di, B, K, I, Lc, W;
    int32_t mi, mk, units; /* index heads per unit, KV heads per unit, units per token */
    int32_t hi_magic;      /* ceil(65536 / Hi): (c * hi_magic) >> 16 == c / Hi for c < 64 */
    int32_t score_lse, sparse, iv;
    float scale, iscale;
    int32_t P, logP;
    /* Element types. */
    int32_t act, kv_dt, idx_dt;
    /* Cache planes. */
    const void *kp, *vp, *ikp, *ivp;
    void *kp_w, *vp_w, *ikp_w, *ivp_w;
    /* Step tensors. */
    const void *q, *k, *v, *iq, *ik, *iv_in;
    void *o, *idx_o;
    float *lse;
    int32_t *topk;
    int32_t write_cache;
    int32_t row_vec; /* cache write in 16-byte pieces (cu_rows_vec_ok) */
    /* Plan. */
    cu_meta m;
    int32_t cap_pages, cap_blocks, cap_union, part_stride, sel_cache;
    int32_t pf_ctas;      /* CTAs of the selection that own a prefill scratch row */
    int32_t sel_cta_rows; /* decode rows (x units) up to which each is selected by a whole CTA */
    float *scores;
    int32_t *sel;
    int32_t *uids;
    uint32_t *umask;
    int32_t *ucnt;
    int32_t *sel_done;
    int32_t att_union; /* > 0: the Hopper attention builds the unions of requests of
                        * several tokens and at most this many blocks from the rows in
                        * sel (cu_attt_union), the selection the others; 0: the
                        * selection builds every union */
    int32_t *idx_next; /* NULL: the indexer's shares are all fixed (indexer_decode_tma_sm90.cu) */
    float *pf_scratch;
    float *part;
#ifdef MSA_TIMELINE
    unsigned long long *tl; /* kernel timeline (common/timeline.cuh), NULL: off */
#endif
} cu_layer;

/* Whether the Hopper attention builds the union of a decode request of ql
 * tokens that reaches nblk >= 1 blocks, from the selection's rows
 * (cu_attt_union), so that the selection does not (cu_request_union): the
 * one test both kernels ask (att_union 0: never).  (A request of at most K
 * blocks needs no union, all its blocks being selected; the attention
 * tests that first.) */
__device__ __forceinline__ bool cu_att_builds_union(const cu_layer &L, int32_t ql, int32_t nblk)
{
    return ql > 1 && nblk <= L.att_union;
}

/* One attention pass (main sparse, main dense or index value) seen as
 * generic paged attention: rows of `q` with `hq_total` heads, KV planes of
 * `hkv` heads, `g` query heads per KV head. */
typedef struct cu_attn {
    int32_t kind;
    int32_t hq_total, hkv, d, g;
    float scale;
    int32_t act, kv_dt;
    const void *q;
    const void *kp, *vp;
    void *o;
    float *lse;      /* NULL for the index-value pass */
    int32_t B;       /* key-stream block size (sparse unions) */
    int32_t sparse;  /* keys from the union / sel rows, else all causal keys */
    int32_t W;       /* width of sel rows */
    int32_t pf_fast; /* prefill rows run on tensor cores (attention_prefill_mma_sm80),
                      * not in the merge kernel */
} cu_attn;

/* Physical page of logical position pos of request r. */
__device__ __forceinline__ int32_t cu_page_of(const int32_t *page_table, int32_t cap_pages,
                                              int32_t r, int32_t pos, int32_t logP)
{
    return page_table[(int64_t)r * cap_pages + (pos >> logP)];
}

/* Decode slot owning global indexer block gb (blocks of all decode
 * requests laid end to end): the last k with dec_blk0[k] <= gb. */
__device__ __forceinline__ int32_t cu_dec_of_block(const int32_t *dec_blk0, int32_t n_dec,
                                                   int32_t gb)
{
    int32_t lo = 0, hi = n_dec - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) >> 1;
        if (dec_blk0[mid] <= gb)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* ---- launchers (one per kernel file) ---------------------------------- */
void cu_launch_prologue(const cu_layer *L, const cu_plan_state *st, cudaStream_t s);
void cu_launch_indexer_simt(const cu_layer *L, const cu_plan_state *st, cudaStream_t s);
void cu_launch_indexer_mma(const cu_layer *L, const cu_plan_state *st, cudaStream_t s);
void cu_launch_select(const cu_layer *L, const cu_plan_state *st, cudaStream_t s);
void cu_launch_attn_decode_simt(const cu_layer *L, const cu_plan_state *st, const cu_attn *A,
                                cudaStream_t s);
void cu_launch_attn_decode_mma(const cu_layer *L, const cu_plan_state *st, const cu_attn *A,
                               cudaStream_t s);
/* Merge of split partials and, in the same launch, the prefill rows. */
void cu_launch_merge_prefill(const cu_layer *L, const cu_plan_state *st, const cu_attn *A,
                             cudaStream_t s);
size_t cu_select_smem(const cu_layer *L);
cudaError_t cu_select_setup(size_t smem); /* raises the kernels' shared-memory limit */

/* Kernel attributes and occupancy-derived grid sizes (context init). */
cudaError_t cu_indexer_mma_setup(int num_sms, int *grid);
cudaError_t cu_attn_mma_setup(int num_sms, int *grid);

#endif /* MSA_CUDA_PLAN_CUH */
