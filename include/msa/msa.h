/*
 * libmsa: MiniMax-M3 block-sparse attention (MSA) as an inference-engine
 * attention backend.  Public C11 API.  No CUDA headers: device pointers and
 * streams are passed as `void *`.
 *
 * Object graph (see docs/API.md):
 *
 *   msa_context  backend (CPU or CUDA), thread pool, last-error message
 *   msa_model    layer shapes and per-layer sparse / index-value flags
 *   msa_cache    paged KV pool: per-layer planes K, V, index K, index V
 *   msa_plan     one step's request metadata, sized by capacity limits
 *   msa_forward  one layer of one step: cache write, then attention
 *
 * Every function that can fail returns an msa_status.  Failures of calls that
 * take a context store a message retrievable with msa_context_last_error().
 * A rejected call writes nothing: neither outputs nor the cache.
 */
#ifndef MSA_MSA_H
#define MSA_MSA_H

#include <stddef.h>
#include <stdint.h>

/* MSA_API marks the library's public functions.  The library is compiled
 * with hidden visibility, so these are the only symbols its shared build
 * exports (with GCC and Clang); for a consumer the mark changes nothing. */
#ifndef MSA_API
#if defined(__GNUC__) || defined(__clang__)
#define MSA_API __attribute__((visibility("default")))
#else
#define MSA_API
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define MSA_VERSION_MAJOR 0
#define MSA_VERSION_MINOR 2
#define MSA_VERSION_PATCH 0
#define MSA_VERSION_NUMBER (MSA_VERSION_MAJOR * 10000 + MSA_VERSION_MINOR * 100 + MSA_VERSION_PATCH)

/* Runtime version of the linked library, e.g. "0.1.0" and 100. */
MSA_API const char *msa_version_string(void);
MSA_API unsigned msa_version_number(void);

/* ---- status codes (stable values; never renumbered) ------------------- */
typedef enum msa_status {
    MSA_OK = 0,
    MSA_ERR_INVALID_ARGUMENT = 1, /* null pointer, bad value, inconsistent lengths */
    MSA_ERR_INVALID_CONFIG = 2,   /* model or cache configuration is invalid */
    MSA_ERR_OUT_OF_RANGE = 3,     /* page id, layer index, token count out of range */
    MSA_ERR_UNSUPPORTED = 4,      /* dtype / backend / feature not in this build */
    MSA_ERR_OUT_OF_MEMORY = 5,
    MSA_ERR_IO = 6,       /* file could not be read or parsed */
    MSA_ERR_CAPACITY = 7, /* step exceeds the plan's capacity limits */
    MSA_ERR_BACKEND = 8,  /* device runtime error */
    MSA_ERR_NO_DEVICE = 9 /* backend compiled in but no device present */
} msa_status;

/* "MSA_OK", "MSA_ERR_INVALID_ARGUMENT", ...; "MSA_ERR_UNKNOWN" otherwise. */
MSA_API const char *msa_status_name(msa_status status);

/* ---- element types ----------------------------------------------------- */
typedef enum msa_dtype {
    MSA_DTYPE_FP32 = 0,
    MSA_DTYPE_BF16 = 1,
    MSA_DTYPE_FP16 = 2,
    MSA_DTYPE_FP8_E4M3 = 3, /* cache planes only */
    MSA_DTYPE_NVFP4 = 4     /* cache planes only */
} msa_dtype;

MSA_API const char *msa_dtype_name(msa_dtype dtype); /* "fp32", "bf16", ... */
/* Parses "fp32" / "bf16" / "fp16" / "fp8_e4m3" / "nvfp4". */
MSA_API msa_status msa_dtype_from_name(const char *name, msa_dtype *out);
/* Bytes per element for fp32/bf16/fp16/fp8; 0 for nvfp4 (sub-byte). */
MSA_API size_t msa_dtype_size(msa_dtype dtype);

/* ---- context ----------------------------------------------------------- */
typedef enum msa_backend { MSA_BACKEND_CPU = 0, MSA_BACKEND_CUDA = 1 } msa_backend;

MSA_API const char *msa_backend_name(msa_backend backend); /* "cpu", "cuda" */
/* 1 when the backend is compiled into this build (CUDA: and a device exists). */
MSA_API int msa_backend_available(msa_backend backend);

/* Debugging aids of the CUDA backend (the CPU backend ignores them).  Each
 * one forces a path or a grid shape that the backend otherwise chooses from
 * the device; results stay within the oracle's tolerances, times do not.
 * Read once, at context creation.  All 0 / NULL: none. */
typedef struct msa_debug_options {
    /* > 0: size the persistent grids for this many SMs (at most the device's),
     * so that each CTA of the one-CTA-per-SM kernels takes several units even
     * at small steps. */
    int cuda_num_sms;
    /* 1: no Hopper tensor-map kernels (the mma kernels run). */
    int cuda_no_tma;
    /* 1: no programmatic dependent launch between kernels. */
    int cuda_no_pdl;
    /* 1: the selection gives every decode row one warp, as it does at large
     * batches, however few rows a step has. */
    int cuda_sel_warp_rows;
    /* 1: the selection builds every union, also those the Hopper attention
     * would build from the selected rows. */
    int cuda_sel_unions;
    /* 1: prefill rows of 128-row pages on Hopper run the mma.sync prefill
     * attention, not the tensor-map one. */
    int cuda_no_prefill_tma;
    /* 1: prefill rows of a sparse layer are scored and selected by the scalar
     * roles of the decode indexer and selection, not by the tensor-core
     * prefill indexer. */
    int cuda_no_prefill_indexer;
    /* 1: the prefill indexer computes its products with mma.sync on Hopper
     * too, not with warpgroup products. */
    int cuda_no_prefill_wgmma;
    /* Profiler: with a library built with -DMSA_TIMELINE, each forward's
     * kernels stamp named events (docs/CUDA.md) and the last forward's stamps
     * are written to this CSV file when the context is freed; NULL: off.
     * Copied at creation. */
    const char *cuda_timeline_path;
    /* 1: prefill rows of sparse layers on Hopper run the query tiles over
     * their tokens' block unions, not the key-block-major attention. */
    int cuda_no_prefill_kbm;
    /* > 0: the key-block-major prefill attention takes the prefill tokens
     * in chunks of at most this many (tests of several chunks); 0: as many
     * as its workspace budget allows. */
    int cuda_prefill_kbm_chunk;
    /* 1: plans of few one-token requests with short contexts keep the
     * decode chain's kernels, not the lean decode kernel (one kernel per
     * layer). */
    int cuda_no_lean_decode;
} msa_debug_options;

/* Instruction-set levels of the CPU kernels (docs/CPU.md).  A CPU context
 * runs the best level that this build has, the CPU runs and the cap
 * allows.  On x86-64 the levels rank PORTABLE < AVX2 (with FMA and F16C) <
 * AVX512 (F, BW, DQ, VL) < AVX512_BF16; on Arm64 PORTABLE < NEON <
 * NEON_BF16 (FEAT_BF16).  New levels take new numbers at the end, so a
 * value keeps its meaning across versions. */
typedef enum msa_cpu_isa {
    MSA_CPU_ISA_AUTO = 0, /* no cap: the best level */
    MSA_CPU_ISA_PORTABLE = 1,
    MSA_CPU_ISA_AVX2 = 2,
    MSA_CPU_ISA_AVX512 = 3,
    MSA_CPU_ISA_AVX512_BF16 = 4,
    MSA_CPU_ISA_NEON = 5,
    MSA_CPU_ISA_NEON_BF16 = 6
} msa_cpu_isa;

typedef struct msa_context_params {
    msa_backend backend; /* default MSA_BACKEND_CPU */
    /* CPU worker threads; 0 = the CPUs this process may use: the online
     * CPUs, fewer where its affinity mask or its cgroup's CPU limit allows
     * fewer (docs/API.md) */
    int num_threads;
    int device;                     /* CUDA device ordinal; default 0 */
    const msa_debug_options *debug; /* debugging aids; NULL (default): none */
    /* CPU backend: the highest kernel level to use; MSA_CPU_ISA_AUTO
     * (default) = the best one.  A level that this build or this CPU lacks
     * is refused with MSA_ERR_UNSUPPORTED. */
    msa_cpu_isa cpu_isa_max;
    /* CPU backend: the engine's own threads (docs/API.md).  NULL (default):
     * the context starts num_threads - 1 threads of its own.  Otherwise it
     * starts none, and each parallel stage of a call calls
     * parallel_for(engine, n_tasks, task, arg) with n_tasks = num_threads
     * (0 = as above): the engine runs task(arg, i) once for every i in
     * 0 .. n_tasks - 1, in any order, on any of its threads, serially or at
     * the same time, and returns when all have returned.  Tasks never wait
     * for each other. */
    void (*parallel_for)(void *engine, int n_tasks, void (*task)(void *arg, int i), void *arg);
    void *engine; /* passed to parallel_for as is */
} msa_context_params;

MSA_API void msa_context_params_default(msa_context_params *params);

typedef struct msa_context msa_context;

/* On failure *out is NULL and, when errbuf is non-NULL, a message is written
 * there (NUL-terminated, truncated to errbuf_size). */
MSA_API msa_status msa_context_create(const msa_context_params *params, msa_context **out,
                                      char *errbuf, size_t errbuf_size);
MSA_API void msa_context_free(msa_context *ctx); /* NULL is fine */
/* Message of the last failed call on this context ("" when none). Owned by
 * the context; valid until the next call on it. */
MSA_API const char *msa_context_last_error(const msa_context *ctx);
MSA_API msa_backend msa_context_backend(const msa_context *ctx);
MSA_API int msa_context_num_threads(const msa_context *ctx);
/* "portable", "avx2", "avx512", "avx512_bf16", "neon", "neon_bf16"; "auto"; "?" when
 * not a level. */
MSA_API const char *msa_cpu_isa_name(msa_cpu_isa isa);
/* 1 when this build has the level's kernels and this CPU runs them. */
MSA_API int msa_cpu_isa_supported(msa_cpu_isa isa);
/* The level a CPU context runs; MSA_CPU_ISA_AUTO for other contexts. */
MSA_API msa_cpu_isa msa_context_cpu_isa(const msa_context *ctx);
/* What a CPU context runs for a stage: "indexer", "attention" or "gather";
 * NULL for another stage or context. */
MSA_API const char *msa_context_cpu_kernel(const msa_context *ctx, const char *stage);

/* ---- model ------------------------------------------------------------- */
typedef enum msa_score_type { MSA_SCORE_MAX = 0, MSA_SCORE_LSE = 1 } msa_score_type;

typedef struct msa_model_config {
    int32_t num_layers;        /* default 1 */
    int32_t num_q_heads;       /* Hq, default 64 */
    int32_t num_kv_heads;      /* Hkv, default 4 */
    int32_t head_dim;          /* D, default 128 */
    int32_t num_index_heads;   /* Hi, default 4 */
    int32_t index_dim;         /* Di, default 128 */
    int32_t block_size;        /* B, default 128 */
    int32_t topk_blocks;       /* K, default 16 */
    int32_t init_blocks;       /* I, default 0 */
    int32_t local_blocks;      /* Lc, default 1 */
    msa_score_type score_type; /* default MSA_SCORE_MAX */
    /* Per layer 0/1, num_layers entries, copied by msa_model_create.
     * layer_sparse NULL: every layer sparse.  layer_index_value NULL: no
     * layer keeps an index value. */
    const uint8_t *layer_sparse;
    const uint8_t *layer_index_value;
    float softmax_scale;       /* main attention; 0 = head_dim^-1/2 */
    float index_softmax_scale; /* c of SPEC 4/6; 0 = index_dim^-1/2 */
} msa_model_config;

/* M3 shape with one sparse layer without index value. */
MSA_API void msa_model_config_default(msa_model_config *cfg);

typedef struct msa_model msa_model;

MSA_API msa_status msa_model_create(msa_context *ctx, const msa_model_config *cfg, msa_model **out);
/* Hugging Face config.json: keys at top level or under "text_config". */
MSA_API msa_status msa_model_load_config_file(msa_context *ctx, const char *path, msa_model **out);
MSA_API msa_status msa_model_load_config_json(msa_context *ctx, const char *json, size_t len,
                                              msa_model **out);
MSA_API void msa_model_free(msa_model *model);
/* Fills *cfg; its layer arrays point into the model (valid while it lives)
 * and the scales hold the resolved values. */
MSA_API void msa_model_get_config(const msa_model *model, msa_model_config *cfg);
MSA_API int msa_model_layer_is_sparse(const msa_model *model,
                                      int32_t layer); /* 0 if out of range */
MSA_API int msa_model_layer_has_index_value(const msa_model *model,
                                            int32_t layer); /* 0 if out of range */
/* Width W of a selected-ids row: K, or m*K when Hi = m*Hkv (unions). */
MSA_API int32_t msa_model_topk_width(const msa_model *model);

/* ---- tensor parallelism ------------------------------------------------ */
/* Where one tensor-parallel rank's heads lie among the full model's.  The
 * rank holds query heads [q_head_begin, q_head_begin + num_q_heads) of the
 * full model, KV heads and index heads likewise (counts in the rank's
 * msa_model_config); each KV head is held by kv_replicas ranks and each
 * index head by index_replicas ranks (1: not replicated). */
typedef struct msa_tp_shard {
    int32_t q_head_begin;
    int32_t kv_head_begin;
    int32_t index_head_begin;
    int32_t kv_replicas;
    int32_t index_replicas;
} msa_tp_shard;

/* Derives the model config of rank `rank` of `size` tensor-parallel ranks
 * from the full model's config, as engines shard M3: every rank takes a
 * contiguous share of the query heads (Hq must be a multiple of size), of
 * the KV heads (Hkv a multiple of size; when there are fewer KV heads than
 * ranks, size a multiple of Hkv and each KV head replicated on size / Hkv
 * consecutive ranks) and of the index heads (the same rule; the rank takes
 * the index heads whose selection its KV heads use, so that each KV head
 * keeps its full selection).  Every other field is copied; the layer
 * arrays point to the full config's.  *shard (may be NULL) gets where the
 * rank's heads lie.  Shapes that do not divide are refused with
 * MSA_ERR_INVALID_CONFIG and a message; nothing is written then. */
MSA_API msa_status msa_model_config_for_rank(msa_context *ctx, const msa_model_config *full,
                                             int32_t rank, int32_t size, msa_model_config *out,
                                             msa_tp_shard *shard);

/* ---- cache ------------------------------------------------------------- */
/*
 * Layout of the planes (element = the plane's dtype), per layer:
 *   K, V        [num_pages][Hkv][page_size][D]
 *   index K, V  [num_pages][page_size][Di]
 * Dense layers have no index planes; layers without index value have no
 * index V plane.  fp8_e4m3 / nvfp4 layouts are described in docs/API.md.
 * With the CUDA backend every plane lives in device memory.
 */
typedef enum msa_plane {
    MSA_PLANE_K = 0,
    MSA_PLANE_V = 1,
    MSA_PLANE_INDEX_K = 2,
    MSA_PLANE_INDEX_V = 3
} msa_plane;

typedef struct msa_cache_config {
    int64_t num_pages;     /* default 0: must be set */
    int32_t page_size;     /* P, power of two in 1..256; default 128 */
    msa_dtype kv_dtype;    /* main K and V planes; default bf16 */
    msa_dtype index_dtype; /* index K and V planes; default bf16 */
} msa_cache_config;

MSA_API void msa_cache_config_default(msa_cache_config *cfg);

typedef struct msa_cache msa_cache;

/* Library-allocated pool (zero-filled). */
MSA_API msa_status msa_cache_create(msa_context *ctx, const msa_model *model,
                                    const msa_cache_config *cfg, msa_cache **out);
/* Wraps caller memory.  planes[layer * 4 + plane] points to the plane's
 * storage in the layout above (NULL for planes the layer does not have).
 * The caller keeps ownership; the memory must outlive the cache.
 * Alignment: each plane starts at a multiple of its element size (CPU) or
 * of 16 bytes (CUDA, whose kernels copy rows in 16-byte pieces; cudaMalloc
 * and msa_buffer_alloc give more); a misaligned plane is rejected with
 * MSA_ERR_INVALID_ARGUMENT. */
MSA_API msa_status msa_cache_wrap(msa_context *ctx, const msa_model *model,
                                  const msa_cache_config *cfg, void *const *planes,
                                  msa_cache **out);
/* One plane of an engine's own cache, wrapped in place: the row of
 * (page, head, token slot) starts at element
 *   page * page_stride + head * head_stride + slot * token_stride
 * of `data`, and its D (or Di) elements are consecutive.  Strides count
 * elements of the plane's dtype.  All three 0: the library's layout above.
 * Index planes have one head, so their head_stride is not read. */
typedef struct msa_plane_view {
    void *data; /* NULL for a plane the layer does not have */
    int64_t page_stride;
    int64_t head_stride;
    int64_t token_stride;
} msa_plane_view;

/* msa_cache_wrap for caches in an engine's layout (docs/API.md draws
 * vLLM's, SGLang's and llama.cpp's): views[layer * 4 + plane] describes
 * each plane, and every kernel reads and writes the rows through the
 * strides.  Checked, with MSA_ERR_INVALID_ARGUMENT and a message naming
 * the plane: strides positive (or all 0), no two (page, head, slot) rows
 * of one plane sharing an element (the dimensions, ordered by stride, must
 * nest: each stride at least the extent of the smaller ones), the plane's
 * extent below 2^46 bytes, and alignment: data at a multiple of the
 * element size (CPU) or of 16 bytes, with every stride a multiple of 16
 * bytes (CUDA).  Quantized planes (fp8_e4m3, nvfp4) take only the
 * library's layout (strides 0; MSA_ERR_UNSUPPORTED otherwise).
 * msa_cache_plane_data gives `data`, msa_cache_plane_bytes the bytes from
 * `data` to the end of the plane's last row.  The caller keeps ownership. */
MSA_API msa_status msa_cache_wrap_strided(msa_context *ctx, const msa_model *model,
                                          const msa_cache_config *cfg, const msa_plane_view *views,
                                          msa_cache **out);
MSA_API void msa_cache_free(msa_cache *cache);
MSA_API void msa_cache_get_config(const msa_cache *cache, msa_cache_config *cfg);
/* Bytes of one plane of one layer (0 when the layer has no such plane). */
MSA_API size_t msa_cache_plane_bytes(const msa_cache *cache, int32_t layer, msa_plane plane);
/* Pointer to the plane (device pointer with CUDA); NULL when absent. */
MSA_API void *msa_cache_plane_data(const msa_cache *cache, int32_t layer, msa_plane plane);
/* Per-layer quantization scales (fp8: dequant scale; nvfp4: global scale).
 * Default 1.0; must be finite and positive. */
MSA_API msa_status msa_cache_set_scales(msa_cache *cache, int32_t layer, float k_scale,
                                        float v_scale, float index_k_scale, float index_v_scale);

/* ---- quantized planes (host memory, both backends) --------------------- */
/* For engines that fill or read quantized cache planes themselves (SPEC 8,
 * docs/API.md): `rows` rows of `dim` elements, row-major.  `dtype` is
 * fp8_e4m3 or nvfp4; `scale` is the plane's per-layer scale as given to
 * msa_cache_set_scales (fp8: value = code * scale; nvfp4: the global
 * scale); activations are fp32, bf16 or fp16.
 *   fp8_e4m3: codes [rows][dim] bytes; group_scales is not used (may be NULL).
 *   nvfp4:    codes [rows][dim / 2] bytes (low nibble = even element),
 *             group_scales [rows][dim / 16] E4M3 bytes; dim a multiple of 16.
 * In a cache plane's (page, head) region of P rows the nvfp4 codes of slot t
 * start at byte t * dim / 2 and its group scales at P * dim / 2 + t * dim / 16,
 * so consecutive slots of one page are consecutive rows of both arrays.
 * Encoding rounds to nearest even and saturates (infinities too); a NaN
 * stays NaN: the fp8 NaN code, or an nvfp4 group whose 16 values all read
 * NaN.  ctx may be NULL (no message is stored then).  Bad arguments give
 * MSA_ERR_INVALID_ARGUMENT and write nothing. */
MSA_API msa_status msa_quantize_rows(msa_context *ctx, msa_dtype dtype, float scale,
                                     const void *src, msa_dtype src_dtype, int64_t rows,
                                     int32_t dim, void *codes, void *group_scales);
MSA_API msa_status msa_dequantize_rows(msa_context *ctx, msa_dtype dtype, float scale,
                                       const void *codes, const void *group_scales, int64_t rows,
                                       int32_t dim, void *dst, msa_dtype dst_dtype);

/* ---- memory helpers (work for both backends) --------------------------- */
/* Allocates memory the backend's kernels can read (host memory for CPU,
 * device memory for CUDA; aligned to at least 64 bytes), copies between it
 * and the host. */
MSA_API msa_status msa_buffer_alloc(msa_context *ctx, size_t bytes, void **out);
MSA_API void msa_buffer_free(msa_context *ctx, void *ptr);
MSA_API msa_status msa_copy_to_buffer(msa_context *ctx, void *dst, const void *host_src,
                                      size_t bytes);
MSA_API msa_status msa_copy_from_buffer(msa_context *ctx, void *host_dst, const void *src,
                                        size_t bytes);
/* Waits for all work the context enqueued (no-op on the CPU). */
MSA_API msa_status msa_synchronize(msa_context *ctx);

/* ---- plan -------------------------------------------------------------- */
/* What a plan is built for: capacities and the activations' element type.
 * The backend chooses every layer's kernels when the plan is created (and
 * again when its capacities grow), from the device, the model, the cache
 * and act_dtype; msa_forward refuses an msa_layer_io whose act_dtype
 * differs. */
typedef struct msa_plan_params {
    int32_t max_requests; /* 0 = grow on update */
    int64_t max_tokens;   /* rows of the token tensors; 0 = grow */
    int64_t max_kv_len;   /* longest context of any request; 0 = grow */
    msa_dtype act_dtype;  /* activations of every forward: fp32 / bf16 / fp16; default bf16 */
    /* Longest q_len of any request; 0 (default) = no limit beyond max_tokens.
     * A plan whose max_q_len is at most 16 never holds a prefill request, so
     * the CUDA backend neither sets up nor launches its prefill kernels:
     * decode-only plans (and the graphs captured on them) keep the decode
     * path's launch sequence. */
    int32_t max_q_len;
} msa_plan_params;

MSA_API void msa_plan_params_default(msa_plan_params *params); /* limits 0, act_dtype bf16 */

typedef struct msa_step {
    int32_t num_requests;
    int64_t num_tokens;    /* rows of the token tensors, >= sum(q_len) */
    const int32_t *q_len;  /* [num_requests], host memory */
    const int32_t *kv_len; /* [num_requests], total tokens after the step */
    /* Row r (at page_table + r * page_table_stride) maps logical page n of
     * request r to its physical page, n < ceil(kv_len[r] / page_size). */
    const int32_t *page_table;
    int64_t page_table_stride;
} msa_step;

typedef struct msa_plan msa_plan;

/* The plan captures model and cache; both must outlive it (params NULL:
 * the defaults).  With non-zero limits every buffer is sized once here, so msa_plan_update never
 * allocates and a captured CUDA graph stays valid across updates. */
MSA_API msa_status msa_plan_create(msa_context *ctx, const msa_model *model, msa_cache *cache,
                                   const msa_plan_params *params, msa_plan **out);
MSA_API void msa_plan_free(msa_plan *plan);
/* Host-side: validates the step and (CUDA) uploads it on `stream`.  A
 * rejected step leaves the plan as it was. */
MSA_API msa_status msa_plan_update(msa_plan *plan, const msa_step *step, void *stream);

/* Engine-owned resources (docs/API.md).  Where a step's page table lives. */
typedef enum msa_memory {
    MSA_MEMORY_HOST = 0,  /* host memory (msa_plan_update) */
    MSA_MEMORY_DEVICE = 1 /* memory the backend's kernels read: a device pointer with CUDA */
} msa_memory;

/* msa_plan_update with the step's page table in `page_table_memory`;
 * MSA_MEMORY_HOST is msa_plan_update.  MSA_MEMORY_DEVICE: page_table is
 * device memory aligned to 4 bytes, row r at page_table +
 * r * page_table_stride holding ceil(kv_len[r] / page_size) entries;
 * q_len and kv_len stay host arrays and are checked as always.  The CUDA
 * backend reads the rows on the device, in the order of `stream`, without
 * copying them to the host: it cannot check the entries (page ids inside
 * the pool, pages written once: SPEC section 10).  An entry outside the
 * pool is read as page 0 and a row written to it is dropped, so no kernel
 * reads or writes outside the cache; the outputs of its request are then
 * unspecified, as are those of a step whose written pages collide.  The
 * CPU backend reads such a table as host memory, with every check. */
MSA_API msa_status msa_plan_update_ex(msa_plan *plan, const msa_step *step,
                                      msa_memory page_table_memory, void *stream);

/* Caller workspace of a plan starts at a multiple of this many bytes on
 * the CUDA backend (64 on the CPU); msa_buffer_alloc and cudaMalloc give
 * that. */
#define MSA_PLAN_WORKSPACE_ALIGNMENT 256

/* Device bytes (host bytes with the CPU backend) of the work buffers of a
 * plan with these params on this cache: the size msa_plan_create_with_workspace
 * needs.  Every limit (max_requests, max_tokens, max_kv_len) must be set:
 * a plan that grows on update reallocates, so it cannot live in a fixed
 * workspace (MSA_ERR_INVALID_ARGUMENT otherwise). */
MSA_API msa_status msa_plan_workspace_size(msa_context *ctx, const msa_model *model,
                                           const msa_cache *cache, const msa_plan_params *params,
                                           size_t *bytes);
/* msa_plan_create on caller workspace: `workspace` (backend memory,
 * aligned to MSA_PLAN_WORKSPACE_ALIGNMENT, at least msa_plan_workspace_size
 * bytes) holds every work buffer of the plan, so that neither this call
 * nor any update or forward of the plan allocates device memory.  The
 * caller keeps ownership; the memory must outlive the plan and is not to
 * be touched while the plan lives (the call zeroes it).  Host memory of
 * the plan (its step arrays and, with CUDA, two pinned staging copies of
 * the step's metadata) stays the library's.  Limits of 0 are refused. */
MSA_API msa_status msa_plan_create_with_workspace(msa_context *ctx, const msa_model *model,
                                                  msa_cache *cache, const msa_plan_params *params,
                                                  void *workspace, size_t workspace_bytes,
                                                  msa_plan **out);

/* ---- forward ----------------------------------------------------------- */
/* Alignment: every tensor msa_forward reads or writes starts at a multiple
 * of its element size: q, k, v, idx_q, idx_k, idx_v, o and idx_o at 2
 * bytes (bf16, fp16) or 4 bytes (fp32); lse and topk at 4 bytes.  A
 * misaligned tensor is rejected with MSA_ERR_INVALID_ARGUMENT and a message
 * naming it; tensors the call does not use are not checked.  The CUDA
 * backend's fast kernels access 4- or 16-byte pieces and take a slower path
 * for tensors not aligned to them, so 16-byte alignment is fastest. */
typedef struct msa_layer_io {
    msa_dtype act_dtype; /* fp32 / bf16 / fp16, the plan's (msa_plan_params); default bf16 */
    /* Inputs, rows = step.num_tokens, C order. */
    const void *q;     /* [T][Hq][D] */
    const void *k;     /* [T][Hkv][D]   (unused when write_cache == 0) */
    const void *v;     /* [T][Hkv][D]   (unused when write_cache == 0) */
    const void *idx_q; /* [T][Hi][Di]   sparse layers */
    const void *idx_k; /* [T][Di]       sparse layers, write_cache */
    const void *idx_v; /* [T][Di]       index-value layers, write_cache */
    /* Outputs. */
    void *o;         /* [T][Hq][D] act_dtype, required */
    void *idx_o;     /* [T][Hi][Di] act_dtype, required for index-value layers */
    float *lse;      /* [T][Hq] optional: natural-log sum-exp of scaled logits */
    int32_t *topk;   /* [T][Hkv][W] optional, sparse layers: selected block ids */
    int write_cache; /* default 1; 0 = the step's entries are already cached */
    void *stream;    /* CUDA stream (cudaStream_t); NULL = default stream */
} msa_layer_io;

MSA_API void msa_layer_io_default(msa_layer_io *io);

/* One layer of the step held by `plan`. */
MSA_API msa_status msa_forward(msa_context *ctx, msa_plan *plan, int32_t layer,
                               const msa_layer_io *io);

/* Which kernel path the plan chose for this layer (at creation, for its
 * act_dtype), and why a fast path was not taken ("" when it was; a step with
 * prefill rows adds a note).  Strings owned by the plan. */
MSA_API const char *msa_plan_kernel_name(const msa_plan *plan, int32_t layer);
MSA_API const char *msa_plan_fallback_reason(const msa_plan *plan, int32_t layer);

/* ---- benchmark helpers ------------------------------------------------- */
/* Times msa_forward of `layer` on the current plan.  `io_sets` holds
 * num_sets input/output sets used in rotation (so the working set can exceed
 * the caches).  After `warmup` untimed runs, writes the time of each of
 * `reps` runs in microseconds to times_us[reps].  CUDA: each set's forward is
 * captured once in a graph and replays are timed with events. */
MSA_API msa_status msa_bench_forward(msa_context *ctx, msa_plan *plan, int32_t layer,
                                     const msa_layer_io *io_sets, int num_sets, int warmup,
                                     int reps, double *times_us);
/* The stages of one layer's forward, in launch order.  The prefill indexer
 * stage scores and selects the blocks of prefill rows (requests of more
 * new tokens than the decode path takes) in one kernel; the indexer and
 * selection stages serve the other rows. */
typedef enum msa_stage {
    MSA_STAGE_CACHE_WRITE = 0,
    MSA_STAGE_INDEXER,
    MSA_STAGE_SELECTION,
    MSA_STAGE_PREFILL_INDEXER,
    MSA_STAGE_ATTENTION,
    MSA_STAGE_INDEX_VALUE,
    MSA_STAGE_COUNT
} msa_stage;
/* "cache_write", "indexer", ...; "?" for a value out of range. */
MSA_API const char *msa_stage_name(msa_stage stage);
/* Times each stage of msa_forward of `layer` on the current plan: `reps`
 * runs rotating through the io sets (after one untimed run per set), and
 * writes each stage's median time in microseconds to
 * stage_us[MSA_STAGE_COUNT] (0 for a stage the layer does not run).  The
 * runs are not graphs and each stage boundary is a full dependency (no
 * overlap of a kernel's start with its predecessor's end), so the stages
 * add up to somewhat more than msa_bench_forward's time.  CUDA backend
 * only: the CPU backend returns MSA_ERR_UNSUPPORTED. */
MSA_API msa_status msa_bench_stages(msa_context *ctx, msa_plan *plan, int32_t layer,
                                    const msa_layer_io *io_sets, int num_sets, int reps,
                                    double *stage_us);
/* Streaming-read bandwidth of the backend's memory (GB/s, 1e9 bytes/s):
 * reads `bytes` bytes `reps` times and reports the median rate. */
MSA_API msa_status msa_bench_read_bandwidth(msa_context *ctx, size_t bytes, int reps, double *gbps);

#ifdef __cplusplus
}
#endif
#endif /* MSA_MSA_H */
