/*
 * 16-bit copies of quantized cache planes for the prefill kernels
 * (widen_pages.cu).  The tensor-core prefill kernels (indexer, sparse and
 * dense attention, index value) read 16-bit K and V tiles; a quantized
 * plane's pages are widened once per layer and step into a copy of the
 * plane in the activation type, and those kernels read the copy.
 *
 * The copy holds code values only: an fp8_e4m3 code's value, or an nvfp4
 * element's E2M1 value times its group's E4M3 scale.  Both are exact in
 * bf16 and fp16 (quant_widen.cuh).  The layer's plane scale stays out of
 * the copy and the kernels apply it (K's to the scores, V's to the
 * finished rows), so a prefill row sees exactly the values the CPU backend
 * de-quantizes, up to fp32 rounding of where the product is formed.
 *
 * The copy has the plane's page ids (a plane of the cache's page count in
 * the library layout), so the step's page table serves it unchanged and a
 * page two requests share is widened twice into the same place, with the
 * same bits.  Only the pages of the step's prefill requests are widened.
 */
#ifndef MSA_CUDA_KERNELS_PROLOGUE_WIDEN_PAGES_CUH
#define MSA_CUDA_KERNELS_PROLOGUE_WIDEN_PAGES_CUH

#include "cuda/common/common.cuh"

#include <cuda.h>

/* The cache planes a plan widens (by MSA_PLANE_*). */
#define CU_WIDEN_PLANES 4

/* A plan's copies: plane p's copy, NULL where plane p is not widened
 * (a plane in the activation type, a layer kind without it, or a shape
 * the prefill kernels do not take). */
typedef struct cu_widen_copies {
    void *copy[CU_WIDEN_PLANES];
    msa_plane_strides strides[CU_WIDEN_PLANES]; /* the library layout, in 16-bit elements */
    int32_t heads[CU_WIDEN_PLANES];
    /* Tensor maps of the copies for the Hopper prefill kernels, indexed
     * as a layer's in cu_plan_state.maps (CU_MAP_*; they lie after the
     * layers' there, aligned as the driver asks; NULL without tensor
     * maps); bit m of map_ok when map m exists. */
    const CUtensorMap *maps;
    unsigned map_ok;
} cu_widen_copies;

/* Whether plane `plane` of a cache is widened for a plan: quantized, dim
 * 128 (the prefill kernels' shapes), 16-bit activations; index planes
 * only for models with sparse layers (index V: with index value).  The
 * kernel loads code rows in 8- and 16-byte pieces: on CUDA every plane
 * and stride is a multiple of 16 bytes (the cache checks it), and nvfp4
 * planes lie in the library layout, whose rows of 128 values are 64 code
 * bytes and 8 scale bytes. */
int cu_widen_plane_wanted(const msa_plan *plan, int plane);

/* Bytes of the copy of one plane (num_pages x heads x P x dim 16-bit
 * values). */
size_t cu_widen_plane_bytes(const msa_plan *plan, int plane);

/* Fills copies->strides and heads of every plane: the layout its copy has
 * where the plan keeps one. */
void cu_widen_describe(const msa_plan *plan, cu_widen_copies *copies);

/* What the kernel reads: the planes of one layer to widen, the step. */
typedef struct cu_widen_params {
    int32_t n;              /* planes to widen */
    int32_t act_dtype;      /* bf16 or fp16 */
    int32_t units_per_page; /* sum of the planes' heads */
    int32_t page_size;      /* P */
    int32_t cap_pages;      /* page-table row length */
    const void *src[CU_WIDEN_PLANES];
    msa_plane_strides src_strides[CU_WIDEN_PLANES];
    int32_t src_dtype[CU_WIDEN_PLANES];
    int32_t heads[CU_WIDEN_PLANES];
    void *dst[CU_WIDEN_PLANES];
    msa_plane_strides dst_strides[CU_WIDEN_PLANES];
    const cu_step_hdr *hdr;
    const int32_t *q_len, *kv_len, *page_table;
} cu_widen_params;

/* The planes of `layer` that the prefill kernels read from copies
 * (bit p: plane p), as the layer's paths chose them. */
void cu_widen_build(const msa_plan *plan, const cu_widen_copies *copies, int32_t layer,
                    unsigned planes, int32_t act_dtype, const cu_meta *meta, int32_t cap_pages,
                    cu_widen_params *p);

/* Widens the pages of the step's prefill requests (a grid fixed by the
 * device's num_sms). */
void cu_launch_widen_pages(const cu_widen_params *p, int num_sms, int pdl, cudaStream_t s);

#endif /* MSA_CUDA_KERNELS_PROLOGUE_WIDEN_PAGES_CUH */
