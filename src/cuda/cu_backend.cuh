/*
 * Context-level state of the CUDA backend and the entry points shared by
 * its host files (backend.cu: context, memory, benchmarks; plan.cu: plans;
 * forward.cu: one layer).
 */
#ifndef MSA_CU_BACKEND_CUH
#define MSA_CU_BACKEND_CUH

#include "cu_plan.cuh"

typedef struct cu_ctx_state {
    int device;
    int num_sms;        /* the SMs the grids are sized for: all of the device's, or fewer
                         * (test aid, MSA_CUDA_SMS=n: the one-CTA-per-SM kernels then give
                         * each CTA several units at the small steps of the tests) */
    int grid_idx_fast;  /* persistent grid of the tensor-core indexer */
    int grid_att_fast;  /* persistent grid of the tensor-core attention */
    int pdl;            /* Hopper+: programmatic dependent launch (MSA_CUDA_PDL=0 disables) */
    int tma;            /* Hopper+: tensor-map kernels (MSA_CUDA_TMA=0 disables) */
    int wgmma;          /* compute capability 9.x with tma: warpgroup products (sm_90a code) */
    int stop_after;     /* profiling aid (MSA_CUDA_STOP_AFTER=n): a layer enqueues only its
                         * first n kernels, so timing the ladder n = 1, 2, ... shows what each
                         * kernel adds to a step; outputs are then incomplete.  0: all. */
    int sel_warp_rows;  /* test aid (MSA_CUDA_SEL_WARP_ROWS=1): the selection gives every
                         * decode row one warp, as it does at large batches, however few
                         * rows a step has */
    int sel_unions;     /* test and measuring aid (MSA_CUDA_SEL_UNIONS=1): the selection builds
                         * every union, also where the Hopper attention would build it */
    int idx_fixed;      /* measuring aid (MSA_CUDA_IDX_FIXED=1): the Hopper indexer keeps its equal
                         * fixed shares only, with no chunks taken on demand */
    unsigned long long *tl; /* profiling aid (MSA_CUDA_TIMELINE=path): kernel timeline stamps
                             * (cu_timeline.cuh), written to tl_path when the context ends */
    char *tl_path;
} cu_ctx_state;

msa_status cu_plan_init(msa_plan *plan);
msa_status cu_plan_upload(msa_plan *plan, void *stream);
void cu_plan_free(msa_plan *plan);
void cu_describe(const msa_plan *plan, int32_t layer, const char **kernel, const char **reason);
msa_status cu_forward(msa_context *ctx, msa_plan *plan, int32_t layer, const msa_layer_io *io);

/* Which kernels a layer runs with the given activation type. */
typedef struct cu_paths {
    int idx_fast;
    int attn_fast;
    int iv_fast;
    int idx_tma;   /* Hopper indexer (tensor maps), when idx_fast */
    int attn_tma;  /* Hopper sparse attention (tensor maps), when attn_fast */
    int pf_fast;   /* prefill rows of the main pass on tensor cores (attention_prefill_mma_sm80) */
    int pf_iv_fast;/* and of the index-value pass */
    int pf_tma;    /* the main pass's on Hopper (attention_prefill_tma_sm90), when pf_fast */
} cu_paths;

void cu_choose_paths(const msa_plan *plan, int32_t layer, msa_dtype act, const msa_layer_io *io,
                     cu_paths *out, char *why, size_t why_size);

/* The Hopper attention's conditions that a plan can see (plan.cu): sm_90a
 * products with tensor maps, key blocks of one 128-row page, head_dim 128
 * and 16 query heads per KV head.  cu_choose_paths adds the activations'
 * and the plane size's; the plan's schedule uses it before those are known. */
int cu_attn_tma_shape(const msa_plan *plan, const cu_plan_state *st);

#endif /* MSA_CU_BACKEND_CUH */
