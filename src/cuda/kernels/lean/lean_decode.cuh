/*
 * The lean decode step: a whole layer in one kernel for steps of few
 * one-token requests with short contexts (kernels/lean/lean_decode.cu;
 * docs/CUDA.md, "The lean decode step").
 */
#ifndef MSA_CUDA_KERNELS_LEAN_LEAN_DECODE_CUH
#define MSA_CUDA_KERNELS_LEAN_LEAN_DECODE_CUH

#include "cuda/params.cuh"

/* Most blocks of 128 keys a request of such a plan reaches (a merge's
 * partial rows per (request, KV head)). */
#define CU_LEAN_MAX_BLOCKS 32
/* Floats of one partial row: 128 values, the LSE, padding to 16 bytes. */
#define CU_LEAN_PART_STRIDE 132

/* What the kernel reads and writes: the prologue's and the attention
 * pass's parameters (their fields as the chain's kernels use them), its
 * merge counts and partial rows. */
typedef struct cu_lean_params {
    cu_prologue_params pro;
    cu_attn_params att;
    /* 1: the step's K and V rows are read from the call's tensors where
     * the attention needs the new token's row (16-byte aligned rows); 0:
     * from the cache, which the caller wrote. */
    int32_t new_rows_from_input;
    int32_t *merge_done; /* [slots][Hkv] merge counts (kept 0); tasks words */
    float *partials;     /* [tasks][16][CU_LEAN_PART_STRIDE] */
} cu_lean_params;

/* The tasks (request, KV head, block of 128 keys) a step of the plan can
 * have when the plan takes the kernel, else 0: one-token requests
 * (q_len 1), blocks of 128 keys, every request keeping every block (at
 * most K of them in a model with sparse layers, at most
 * CU_LEAN_MAX_BLOCKS), and no more tasks than CTAs (one per SM), so that
 * each CTA holds at most one block.  Measured on the H200, steps that
 * score blocks or give a CTA more than one block ran faster on the
 * decode chain (docs/CUDA.md). */
int32_t cu_lean_plan_tasks(const cu_sched_sizes *sz, const msa_model *m, int num_sms);

/* Bytes of the kernel's workspace for a plan of `tasks` tasks
 * (cu_lean_ws_carve lays them out). */
size_t cu_lean_ws_bytes(int32_t tasks);
void cu_lean_ws_carve(void *base, int32_t tasks, cu_lean_params *p);

/* Whether a layer's shapes and types fit it (why: the reason when not). */
int cu_lean_fits(const msa_model *m, int32_t layer, const msa_cache_config *cc, msa_dtype act,
                 const char **why);

/* Dynamic shared memory of its CTA (the device must allow it). */
size_t cu_lean_smem(void);
cudaError_t cu_lean_setup(void);
void cu_launch_lean(const cu_lean_params *p, int grid, cudaStream_t s);

#endif /* MSA_CUDA_KERNELS_LEAN_LEAN_DECODE_CUH */
