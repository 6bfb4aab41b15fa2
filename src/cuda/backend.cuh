/*
 * Context-level state of the CUDA backend and the entry points shared by
 * its host files (backend.cu: context, memory, benchmarks; plan.cu: plans;
 * forward.cu: one layer).
 */
#ifndef MSA_CUDA_BACKEND_CUH
#define MSA_CUDA_BACKEND_CUH

#include "cuda/plan.cuh"

typedef struct cu_ctx_state {
    int device;
    int num_sms;       /* the SMs the grids are sized for: all of the device's, or fewer
                             * (msa_debug_options.cuda_num_sms) */
    int grid_idx_fast; /* persistent grid of the tensor-core indexer */
    int grid_att_fast; /* persistent grid of the tensor-core attention */
    int pdl;           /* Hopper+: programmatic dependent launch (unless cuda_no_pdl) */
    int tma;           /* Hopper+: tensor-map kernels (unless cuda_no_tma) */
    int wgmma;         /* compute capability 9.x with tma: warpgroup products (sm_90a code) */
    int sel_warp_rows; /* msa_debug_options.cuda_sel_warp_rows */
    int sel_unions;    /* msa_debug_options.cuda_sel_unions */
    int pf_tma;        /* wgmma: the Hopper prefill attention (unless cuda_no_prefill_tma) */
    int pfi;           /* the tensor-core prefill indexer (unless cuda_no_prefill_indexer) */
    int pf_kbm;        /* pf_tma: the key-block-major sparse prefill (unless cuda_no_prefill_kbm) */
    int pf_kbm_chunk;  /* > 0: its chunk's tokens at most (cuda_prefill_kbm_chunk) */
    int lean;          /* the lean decode kernel can run here (unless cuda_no_lean_decode) */
    int pfi_wgmma;     /* wgmma: its products as warpgroup products (unless
                             * cuda_no_prefill_wgmma) */
    unsigned long long *tl; /* profiler (msa_debug_options.cuda_timeline_path): kernel
                             * timeline stamps (common/timeline.cuh), written to tl_path when
                             * the context ends */
    char *tl_path;
    struct cu_stage_marks *stages; /* set while msa_bench_stages runs, NULL otherwise */
} cu_ctx_state;

/* Stage boundaries of one forward for msa_bench_stages: ev[k] is recorded
 * where stage k starts (ev[MSA_STAGE_COUNT] after the last), and bit k of
 * skipped is set for a stage the layer does not run (its event is then
 * not recorded). */
typedef struct cu_stage_marks {
    cudaEvent_t ev[MSA_STAGE_COUNT + 1];
    unsigned skipped;
} cu_stage_marks;

msa_status cu_plan_init(msa_plan *plan);
msa_status cu_plan_upload(msa_plan *plan, void *stream);
msa_status cu_plan_workspace(const msa_plan *plan, size_t *bytes);
void cu_plan_free(msa_plan *plan);
void cu_describe(const msa_plan *plan, int32_t layer, const char **kernel, const char **reason);
msa_status cu_forward(msa_context *ctx, msa_plan *plan, int32_t layer, const msa_layer_io *io);
msa_status cu_bench_stages(msa_context *ctx, msa_plan *plan, int32_t layer,
                           const msa_layer_io *io_sets, int num_sets, int reps, double *stage_us);

/* Which kernels layer `layer` runs with activations of type act on plan
 * state st (its device flags, prefill kernels and tensor maps), and why a
 * fast path is not taken (appended to why). */
void cu_choose_paths(const msa_plan *plan, const cu_plan_state *st, int32_t layer, msa_dtype act,
                     cu_paths *out, char *why, size_t why_size);
/* Decides every layer's kernels for the plan's act_dtype into st->path
 * (host memory; returns nonzero when out of it). */
int cu_plan_paths(const msa_plan *plan, cu_plan_state *st);

/* The Hopper attention's conditions that a plan can see (plan.cu): sm_90a
 * products with tensor maps, key blocks of one 128-row page, head_dim 128
 * and 16 query heads per KV head.  cu_choose_paths adds the activations'
 * and the plane size's; the plan's schedule uses it before those are known. */
int cu_attn_tma_shape(const msa_plan *plan, const cu_plan_state *st);

#endif /* MSA_CUDA_BACKEND_CUH */
