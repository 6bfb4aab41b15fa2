/*
 * The lean decode step: one kernel that runs a whole sparse layer for steps
 * of few one-token requests (kernels/lean/lean_decode.cu; docs/CUDA.md,
 * "The lean decode step").
 */
#ifndef MSA_CUDA_KERNELS_LEAN_LEAN_DECODE_CUH
#define MSA_CUDA_KERNELS_LEAN_LEAN_DECODE_CUH

#include "cuda/params.cuh"

/* Plans of at most this many token rows, each request one token, take it
 * (where the layer's shapes allow). */
#define CU_LEAN_MAX_ROWS 8
/* Most KV heads (= index heads) of a layer it serves: one selecting warp
 * each. */
#define CU_LEAN_MAX_HEADS 8
/* Floats of one partial row: 128 values, the LSE, padding to 16 bytes. */
#define CU_LEAN_PART_STRIDE 132

/* What the kernel reads and writes: the three stage families' parameters
 * (their fields as the chain's kernels use them) and its own hand-over
 * words and partial rows. */
typedef struct cu_lean_params {
    cu_prologue_params pro;
    cu_select_params sel;
    cu_attn_params att;
    /* 1: the step's K, V and index-K rows are read from the call's
     * tensors where the attention and the scan need the new token's row
     * (16-byte aligned rows); 0: from the cache, which the caller wrote. */
    int32_t new_rows_from_input;
    int32_t *scan_done;  /* [slots] blocks of decode slot k scored (back to 0 by the last
                          * CTA that reads them) */
    int32_t *merge_done; /* [slots][Hkv] segments of a (slot, KV head) written (kept 0) */
    int32_t *ctas_done;  /* CTAs done with the scan counts (kept 0) */
    float *partials;     /* [slots * Hkv * K][16][CU_LEAN_PART_STRIDE] */
} cu_lean_params;

/* Decode slots a step of the plan can have: each holds a token. */
static inline int32_t cu_lean_slots(const cu_sched_sizes *sz)
{
    return sz->cap_tok < sz->cap_req ? sz->cap_tok : sz->cap_req;
}

/* Bytes of the kernel's workspace for a plan of `slots` decode slots
 * (cu_lean_ws_carve lays them out). */
size_t cu_lean_ws_bytes(int32_t slots, int32_t kv_heads, int32_t topk_blocks);
void cu_lean_ws_carve(void *base, int32_t slots, int32_t kv_heads, cu_lean_params *p);

/* Whether a layer's shapes fit it (why: the reason when not, else left). */
int cu_lean_fits(const msa_model *m, int32_t layer, const msa_cache_config *cc, msa_dtype act,
                 const char **why);

/* Dynamic shared memory of its CTA (the device must allow it). */
size_t cu_lean_smem(void);
cudaError_t cu_lean_setup(void);
void cu_launch_lean(const cu_lean_params *p, int grid, cudaStream_t s);

#endif /* MSA_CUDA_KERNELS_LEAN_LEAN_DECODE_CUH */
