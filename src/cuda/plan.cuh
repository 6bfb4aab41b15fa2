/*
 * Device-side plan of the CUDA backend.
 *
 * msa_plan_update (host) turns one step's metadata into a schedule
 * (schedule.h, plain C): request arrays, the list of decode requests
 * (q_len <= CU_DEC_MAX_Q) with their compact token rows, the prefill token
 * list and tiles, and the work items of the split decode attention.
 * Everything is packed into one pinned staging buffer and copied with one
 * async copy into a device blob whose layout is fixed by the plan's
 * capacities.  Kernels read only this blob (and the workspaces below), so a
 * graph captured once replays correctly after any later update: the
 * addresses never move, only the contents.
 */
#ifndef MSA_CUDA_PLAN_CUH
#define MSA_CUDA_PLAN_CUH

#include "cuda/common/common.cuh"

#include "cuda/kernels/attention/attention_prefill_kbm_ws.cuh"
#include "cuda/kernels/prologue/widen_pages.cuh"

#include <cuda.h>

/* A sparse layer's tensor maps (cu_plan_state.maps). */
enum { CU_MAP_INDEX_K = 0, CU_MAP_K = 1, CU_MAP_V = 2, CU_MAPS = 3 };

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
    int pf_kbm; /* the sparse pass's key-block-major (attention_prefill_kbm_sm90), when pf_tma */
    int lean;   /* the whole layer in the lean decode kernel (kernels/lean/lean_decode.cu) */
    int pf_idx; /* prefill rows' index scores and selection on tensor cores */
    int pf_idx_tma; /* and on the Hopper tensor-map kernel */
    /* Planes the prefill kernels read from their 16-bit copies (bit
     * MSA_PLANE_*: quantized planes, widened at each step; widen_pages.cuh). */
    unsigned pf_widen;
} cu_paths;

/* Bytes of a layer's fallback reason. */
#define CU_WHY_BYTES 512

typedef struct cu_plan_state {
    /* Capacities, grids and the metadata layout (schedule.h). */
    cu_sched_sizes sz;
    int grid_pfa;  /* prefill attention on tensor cores (0: not set up, scalar rows) */
    int pfh;       /* and its Hopper kernel (attention_prefill_tma_sm90) set up */
    int pdl;       /* programmatic dependent launch between kernels */
    int tma;       /* Hopper tensor-map kernels available */
    int wgmma;     /* and the sm_90a warpgroup products (the Hopper indexer) */
    int pfi_wgmma; /* the prefill indexer's products as warpgroup products */
    int pfit;      /* and its Hopper tensor-map kernel set up (its shared memory fits) */

    /* Metadata blob: device copy, two pinned staging copies (an upload
     * never overwrites a staging buffer an earlier async copy may still
     * read: each has an event recorded after its copy). */
    void *meta_dev;
    void *staging[2];
    cudaEvent_t staged[2];
    int staging_used[2];
    int next_staging;
    cu_meta dev; /* views into meta_dev */

    /* The library's block of device memory that holds meta_dev and the
     * workspaces below; NULL on caller workspace (msa_plan.workspace). */
    void *ws_owned;

    /* Workspaces. */
    float *scores;     /* [dec_rows_cap][Hi][cap_blocks] block scores */
    int32_t *sel;      /* [cap_tok][Hkv][W] selected blocks per KV head */
    int32_t *uids;     /* [cap_req][Hkv][cap_union] union of a request's blocks */
    uint32_t *umask;   /* same shape: bit i = token i selected the block */
    int32_t *ucnt;     /* [cap_req][Hkv] */
    int32_t *sel_done; /* [cap_req][units] selection completion counters (kept 0) */
    int32_t *idx_next; /* the Hopper indexer's next on-demand chunk (back to 0 at each end) */
    float *pf_scratch; /* [grid_pf][mi][cap_blocks] prefill block scores */
    float *part;       /* [part_rows_cap][part_stride] split partials */
    /* Prefill indexer on tensor cores (kernels/indexer/indexer_prefill_mma_sm80.cu):
     * its persistent grid and block-score workspace [grid_pfi][64][cap_blocks];
     * NULL where no layer's shapes fit it (the selection's scalar role then);
     * and its key-range splits' candidates and completion counts. */
    int grid_pfi;
    float *pfi_scratch;
    int32_t *pfi_split;
    /* Key-block-major prefill attention of sparse layers
     * (kernels/attention/attention_prefill_kbm_sm90.cu): set up when the
     * shapes and types fit it on a device with the sm_90a products; its
     * workspace holds the lists and partial rows of pfk_chunk prefill
     * tokens. */
    int pfk;
    int32_t pfk_chunk;
    /* The lean decode kernel's workspace (merge counts, partial rows) and
     * its grid (the most tasks a step can have), where the plan's steps
     * fit it (cu_lean_plan_tasks) and the context can run it; NULL and 0
     * otherwise. */
    void *lean_ws;
    int32_t lean_tasks;
    int32_t pfk_items_cap;
    cu_pfk_ws pfk_ws;

    /* Tensor maps of the layers' planes for the Hopper kernels (index K:
     * sparse layers; K and V: every layer, for the prefill kernel),
     * encoded once when the plan is created (the planes are fixed for the
     * cache's life): maps[layer * CU_MAPS + m], bit m of map_ok[layer] set
     * when map m could be encoded (16-bit planes and fp8 codes).  nvfp4
     * planes have no map: the Hopper kernels copy their tiles by plain
     * bulk copies, and the bit says that the plane allows it.  NULL
     * without tensor-map kernels. */
    CUtensorMap *maps;
    uint8_t *map_ok;

    /* 16-bit copies of the quantized planes for the prefill kernels, in
     * the plan's workspace (copy[p] NULL: plane p is not copied). */
    cu_widen_copies widen;

    /* The kernels of every layer (cu_plan_paths), NULL before they are
     * decided, and why a fast path was not taken ("" when it was). */
    cu_paths *path;                 /* [num_layers] */
    char (*path_why)[CU_WHY_BYTES]; /* [num_layers] */
    int sparse_tma;                 /* some sparse layer runs the Hopper attention */

    /* Host view of the current step (for describe). */
    cu_sched_step step;
    char why_step[CU_WHY_BYTES]; /* describe()'s text when the step adds a note */
} cu_plan_state;

/* A Hopper attention producer stages a request's page-table row and
 * builds a union of several tokens in shared memory, for requests of at
 * most this many blocks (256K keys; longer ones: the selection builds the
 * union, the pages come from the table) and unions of at most
 * CU_ATT_UNION_LIST entries (cap_union at most). */
#define CU_ATT_UNION_BLOCKS 2048
#define CU_ATT_UNION_LIST 256

/* Whether the Hopper attention builds the union of a decode request of ql
 * tokens that reaches nblk >= 1 blocks, from the selection's rows
 * (cu_attt_union), so that the selection does not (cu_request_union): the
 * one test both kernels ask, with union_blocks the layer's limit
 * (attention_union_blocks of cu_select_params and cu_attn_params; 0:
 * never).  (A request of at most K blocks needs no union, all its blocks
 * being selected; the attention tests that first.) */
__device__ __forceinline__ bool cu_att_builds_union(int32_t union_blocks, int32_t ql, int32_t nblk)
{
    return ql > 1 && nblk <= union_blocks;
}

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

/* ---- kernel setup (launchers: params.cuh) -------------------------------- */
cudaError_t cu_select_setup(size_t smem); /* raises the kernels' shared-memory limit */

/* Kernel attributes and occupancy-derived grid sizes (context init). */
cudaError_t cu_indexer_mma_setup(int num_sms, int *grid);
cudaError_t cu_attn_mma_setup(int num_sms, int *grid);

#endif /* MSA_CUDA_PLAN_CUH */
