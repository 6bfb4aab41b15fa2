/*
 * Parameter structs of the CUDA kernel families: each holds what its
 * kernels read and write, nothing else, and is built on the host from the
 * plan state and the forward call (params.cu), then passed by value (kernel
 * parameter space: no registers, one constant-bank load per use).
 *
 *   cu_prologue_params  prologue (cache rows, padding outputs)
 *   cu_indexer_params   decode indexer, SIMT, mma.sync and Hopper variants
 *   cu_select_params    selection (decode rows, unions, scalar prefill rows);
 *                       the prefill indexer's cu_pfidx_params is built from it
 *   cu_attn_params      decode attention (SIMT, mma.sync, Hopper) and merge,
 *                       one per pass; the prefill attention's cu_pfa_params
 *                       and cu_pfh_params are built from it
 *
 * The step's metadata pointers (cu_meta, schedule.h) are the one shared
 * part: every family reads its plan items from the same blob.
 */
#ifndef MSA_CUDA_PARAMS_CUH
#define MSA_CUDA_PARAMS_CUH

#include "cuda/plan.cuh"
#include "cuda/common/plane_rows.cuh"

/* What the prologue reads and writes (kernels/prologue/prologue.cu): the
 * step's K, V, index-K and index-V rows into the layer's cache planes,
 * and the padding rows' outputs. */
typedef struct cu_prologue_params {
    /* Shapes. */
    int32_t num_q_heads;
    int32_t num_kv_heads;
    int32_t head_dim;
    int32_t num_index_heads;
    int32_t index_dim;
    int32_t page_size;  /* a power of two */
    int32_t topk_width; /* width of a selected-ids row per KV head */
    int32_t sparse;     /* the layer has index planes */
    int32_t index_value;
    /* Element types. */
    int32_t act_dtype, kv_dtype, index_dtype;
    /* 0: the caller wrote the cache rows itself; rows_in_pieces: in
     * 16-byte pieces (cu_prologue_rows_vec_ok). */
    int32_t write_cache;
    int32_t rows_in_pieces;
    /* The step's rows, [tokens][heads][dim]. */
    const void *k_rows, *v_rows, *index_k_rows, *index_v_rows;
    /* The layer's cache planes, rows at cu_plane_row of their strides. */
    void *k_plane, *v_plane, *index_k_plane, *index_v_plane;
    msa_plane_strides k_strides, v_strides, index_k_strides, index_v_strides;
    /* The planes' scales (msa_cache_set_scales), read by the quantized
     * formats only. */
    float k_scale, v_scale, index_k_scale, index_v_scale;
    /* Outputs of padding rows. */
    void *out;         /* [tokens][num_q_heads][head_dim] */
    void *index_out;   /* [tokens][num_index_heads][index_dim] (index value) */
    float *lse;        /* [tokens][num_q_heads], or NULL */
    int32_t *topk_ids; /* [tokens][num_kv_heads][topk_width], or NULL */
    /* The step's metadata. */
    const cu_step_hdr *hdr;
    const cu_tok_info *tok_info;
#ifdef MSA_TIMELINE
    unsigned long long *tl; /* kernel timeline (common/timeline.cuh), NULL: off */
#endif
} cu_prologue_params;

/* What the decode indexer reads and writes (kernels/indexer/indexer_decode_*):
 * the block scores of every decode token and index head of the requests
 * with more than K blocks. */
typedef struct cu_indexer_params {
    int32_t num_index_heads;
    int32_t index_dim;
    int32_t block_size;
    int32_t page_size; /* a power of two */
    int32_t log_page_size;
    /* ceil(65536 / num_index_heads): (c * magic) >> 16 == c / num_index_heads
     * for query columns c < 64. */
    int32_t index_heads_magic;
    int32_t score_lse; /* block score: log-sum-exp of its keys (else max) */
    float index_scale;
    int32_t act_dtype, index_dtype;
    int32_t cap_pages;         /* page-table row length */
    int32_t cap_blocks;        /* scores per (decode row, index head) */
    const void *index_q;       /* [tokens][num_index_heads][index_dim] */
    const void *index_k_plane; /* rows at cu_plane_at of index_k_strides */
    msa_plane_strides index_k_strides;
    /* Quantized index planes: the plane's scale (msa_cache_set_scales). */
    float index_k_scale;
    float *scores; /* [decode rows][num_index_heads][cap_blocks] */
    /* The Hopper indexer's next on-demand chunk (put back to 0 by its last
     * draw); NULL: every share is fixed. */
    int32_t *next_chunk;
    cu_meta meta; /* the step's metadata (schedule.h) */
#ifdef MSA_TIMELINE
    unsigned long long *tl;
#endif
} cu_indexer_params;

/* What the selection reads and writes (kernels/select/select.cu): the
 * exact top-K blocks of every (decode token, unit) row from the indexer's
 * scores, the per-request unions, and the scalar prefill rows (scored
 * here, by the fields it shares with cu_indexer_params). */
typedef struct cu_select_params {
    /* Shapes.  A unit is the index heads that feed one KV head (or the KV
     * heads one index head feeds). */
    int32_t num_kv_heads;
    int32_t num_index_heads;
    int32_t index_dim;
    int32_t num_units;            /* units per token: min(index heads, KV heads) */
    int32_t index_heads_per_unit; /* index heads of a unit: max(Hi / Hkv, 1) */
    int32_t kv_heads_per_unit;    /* KV heads of a unit: max(Hkv / Hi, 1) */
    int32_t block_size;
    int32_t page_size; /* a power of two */
    int32_t log_page_size;
    int32_t topk_blocks;  /* K */
    int32_t init_blocks;  /* forced first blocks */
    int32_t local_blocks; /* forced last blocks */
    int32_t topk_width;   /* width of a selection row */
    int32_t score_lse;    /* block score: log-sum-exp of its keys (else max) */
    float index_scale;
    int32_t act_dtype, index_dtype;
    /* Capacities and workspaces. */
    int32_t cap_pages;     /* page-table row length */
    int32_t cap_blocks;    /* scores per (decode row, index head) */
    int32_t cap_union;     /* union entries per (decode slot, KV head) */
    int32_t cached_blocks; /* scores of a row a selecting warp keeps in shared memory */
    /* Decode rows (x units) up to which a whole CTA selects each row (0:
     * a warp per row). */
    int32_t cta_rows_limit;
    /* CTAs that own a prefill scratch row (0: the tensor-core prefill
     * indexer serves the prefill rows). */
    int32_t prefill_ctas;
    /* Requests of several tokens and at most this many blocks have their
     * unions built by the Hopper attention (cu_att_builds_union); 0: the
     * selection builds every union. */
    int32_t attention_union_blocks;
    const void *index_q;       /* [tokens][num_index_heads][index_dim] */
    const void *index_k_plane; /* rows at cu_plane_at of index_k_strides */
    msa_plane_strides index_k_strides;
    /* Quantized index planes: the plane's scale (msa_cache_set_scales). */
    float index_k_scale;
    /* The index-key plane of the prefill indexer: the plane, or its 16-bit
     * copy (widen_pages.cuh) with the plane's scale as pf_index_k_mul
     * (1 for the plane itself). */
    const void *pf_index_k_plane;
    msa_plane_strides pf_index_k_strides;
    float pf_index_k_mul;
    float *scores;         /* [decode rows][num_index_heads][cap_blocks] */
    int32_t *selected;     /* [tokens][num_kv_heads][topk_width] ascending ids, -1 padded */
    int32_t *topk_ids;     /* the caller's copy of selected, or NULL */
    int32_t *union_ids;    /* [requests][num_kv_heads][cap_union] */
    uint32_t *union_masks; /* same shape: bit i = token i selected the block */
    int32_t *union_counts; /* [requests][num_kv_heads] */
    int32_t *rows_done;    /* [requests][num_units] completion counters (kept 0) */
    float *prefill_scores; /* [prefill_ctas][index_heads_per_unit][cap_blocks] */
    cu_meta meta;          /* the step's metadata (schedule.h) */
#ifdef MSA_TIMELINE
    unsigned long long *tl;
#endif
} cu_select_params;

/* What the decode attention and the merge read and write, for one pass
 * (main sparse, main dense or index value) seen as generic paged
 * attention (kernels/attention/attention_decode_*, kernels/merge): rows of
 * q with q_heads heads, planes of kv_heads heads, group query heads per KV
 * head; the sparse pass's keys come from the selection's rows and unions. */
typedef struct cu_attn_params {
    /* The pass. */
    int32_t kind;     /* CU_KIND_SPARSE, CU_KIND_DENSE or CU_KIND_IV */
    int32_t q_heads;  /* heads of a token row of q, out and lse */
    int32_t kv_heads; /* heads of the planes */
    int32_t head_dim;
    int32_t group; /* query heads per KV head */
    float scale;
    int32_t act_dtype, kv_dtype;
    const void *q;                 /* [tokens][q_heads][head_dim] */
    const void *k_plane, *v_plane; /* rows at cu_plane_at of k_strides, v_strides */
    msa_plane_strides k_strides, v_strides;
    /* Quantized planes: the planes' scales (msa_cache_set_scales). */
    float k_scale, v_scale;
    /* The planes of the prefill kernels: k_plane and v_plane, or their
     * 16-bit copies (widen_pages.cuh) with the planes' scales as pf_k_mul
     * (scores) and pf_v_mul (finished rows); 1 for the planes themselves. */
    const void *pf_k_plane, *pf_v_plane;
    msa_plane_strides pf_k_strides, pf_v_strides;
    float pf_k_mul, pf_v_mul;
    void *out;          /* [tokens][q_heads][head_dim] */
    float *lse;         /* [tokens][q_heads], or NULL (index-value pass) */
    int32_t block_size; /* key-stream block size (sparse unions) */
    int32_t sparse;     /* keys from the unions / selection rows, else all causal keys */
    int32_t topk_width; /* width of a selection row */
    /* Prefill rows run on tensor cores (attention_prefill_*), not in the
     * merge kernel. */
    int32_t prefill_on_tensor_cores;
    /* The layer. */
    int32_t layer_kv_heads; /* KV heads of the selection rows and unions */
    int32_t topk_blocks;    /* K */
    int32_t page_size;      /* a power of two */
    int32_t log_page_size;
    int32_t cap_pages; /* page-table row length */
    int32_t cap_union; /* union entries per (decode slot, KV head) */
    /* > 0: the Hopper attention builds the unions of requests of several
     * tokens and at most this many blocks from the selection rows
     * (cu_attt_union), the selection the others; 0: the selection builds
     * every union. */
    int32_t attention_union_blocks;
    int32_t partial_stride; /* floats per partial row */
    float *partials;        /* [partial rows][partial_stride] split partials */
    int32_t *selected;      /* [tokens][layer_kv_heads][topk_width] */
    int32_t *union_ids;     /* [requests][layer_kv_heads][cap_union] */
    uint32_t *union_masks;  /* same shape: bit i = token i selected the block */
    int32_t *union_counts;  /* [requests][layer_kv_heads] */
    cu_meta meta;           /* the step's metadata (schedule.h) */
#ifdef MSA_TIMELINE
    unsigned long long *tl;
#endif
} cu_attn_params;

/* The prologue's parameters for one layer's forward (params.cu). */
void cu_prologue_build(const msa_plan *plan, const cu_plan_state *st, int32_t layer,
                       const msa_layer_io *io, unsigned long long *timeline, cu_prologue_params *p);

void cu_launch_prologue(const cu_prologue_params *p, const cu_plan_state *st, cudaStream_t s);

/* The decode indexer's parameters for a sparse layer (params.cu). */
void cu_indexer_build(const msa_plan *plan, const cu_plan_state *st, int32_t layer,
                      const msa_layer_io *io, unsigned long long *timeline, cu_indexer_params *p);

void cu_launch_indexer_simt(const cu_indexer_params *p, const cu_plan_state *st, cudaStream_t s);
void cu_launch_indexer_mma(const cu_indexer_params *p, const cu_plan_state *st, cudaStream_t s);

/* The selection's parameters for a sparse layer (params.cu):
 * attention_union_blocks and prefill_ctas are the forward's choices. */
void cu_select_build(const msa_plan *plan, const cu_plan_state *st, int32_t layer,
                     const msa_layer_io *io, int32_t cta_rows_limit, int32_t prefill_ctas,
                     int32_t attention_union_blocks, unsigned long long *timeline,
                     cu_select_params *p);

void cu_launch_select(const cu_select_params *p, const cu_plan_state *st, cudaStream_t s);
/* An attention pass's parameters (params.cu): kind CU_KIND_SPARSE or
 * CU_KIND_DENSE for the main pass, CU_KIND_IV for the index-value pass
 * (dense multi-query attention over the index planes);
 * attention_union_blocks is the forward's choice (0 but for the sparse
 * pass on the Hopper kernel). */
void cu_attn_build(const msa_plan *plan, const cu_plan_state *st, int32_t layer,
                   const msa_layer_io *io, int kind, int prefill_on_tensor_cores,
                   int32_t attention_union_blocks, unsigned long long *timeline, cu_attn_params *p);

void cu_launch_attn_decode_simt(const cu_attn_params *p, const cu_plan_state *st, cudaStream_t s);
void cu_launch_attn_decode_mma(const cu_attn_params *p, const cu_plan_state *st, cudaStream_t s);
/* Merge of split partials and, in the same launch, the prefill rows the
 * tensor-core prefill kernels do not serve. */
void cu_launch_merge_prefill(const cu_attn_params *p, const cu_plan_state *st, cudaStream_t s);

/* Dynamic shared memory of a selection CTA. */
size_t cu_select_smem(int32_t index_heads_per_unit, int32_t topk_blocks, int32_t topk_width,
                      int32_t cached_blocks);

#endif /* MSA_CUDA_PARAMS_CUH */
