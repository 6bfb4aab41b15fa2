/*
 * Test kit shared by the CTest programs and `msa check`: builds random steps,
 * runs them through a backend with poisoned outputs, and compares with the
 * oracle.  Linked into the tests and the `msa` program, never the library.
 */
#ifndef MSA_TESTKIT_H
#define MSA_TESTKIT_H

#include <stdint.h>
#include <stdio.h>

#include "msa/msa.h"

typedef struct msa_case {
    const char *name;
    /* layer */
    int Hq, Hkv, D, Hi, Di, block, topk, init_blocks, local_blocks;
    int score_lse, sparse, index_value;
    float scale, index_scale; /* 0 = defaults */
    /* cache */
    int page_size;
    msa_dtype act_dtype, kv_dtype, index_dtype;
    /* step: requests with (q_len, kv_len); padding rows after them */
    int num_requests;
    const int *q_len;
    const int *kv_len;
    int padding_rows;
    int share_prefix;  /* requests share the physical pages of a common prefix */
    int shuffle_pages; /* physical pages in random order */
    int write_cache;   /* 1 normally; 0 = entries pre-written by the test */
    uint64_t seed;
    /* Additions (kept at the end so existing initialisers stay valid). */
    int tie_blocks;    /* >0: this many exact copies of one strong index-key block,
                           so the tie rule (lower id first) decides the selection */
    int nan_blocks;    /* >0: this many cached blocks whose index keys are NaN */
    int fixed_limits;  /* plan created with exact capacity limits (no growth) */
    int omit_optional; /* lse and topk outputs not requested */
    int out_offset;    /* bytes (a multiple of 4, < 64) the output `o` starts after its
                        * buffer's start: 4 keeps 4-byte alignment but not 16 */
    float k_scale, v_scale, index_k_scale, index_v_scale; /* quantized planes; 0 = 1.0 */
    int index_period;  /* >0: the cached index keys of block n >= index_period of a
                       * request repeat those of block n mod index_period (exact
                       * ties in pairs or more, like `msa bench`'s repeated data) */
    int engine_layout; /* msa_case_layout: the pool lies in an engine's layout, wrapped
                        * in place with msa_cache_wrap_strided (activation formats) */
    /* 1: the index-K plane's garbage (slots past kv_len, unused pages) is
     * NaN in every odd slot, so that a read past kv_len shows; 2: the K
     * and V planes' garbage as well. */
    int garbage_nan;
    /* On the CUDA backend the case fails unless the kernel name and
     * fallback reason (msa_case_result.kernel) contain this text: a path
     * that must not fall back silently.  NULL: any path. */
    const char *expect_cuda;
} msa_case;

/* Cache layouts of the engines (docs/API.md), for msa_case.engine_layout.
 * Per layer, elements of the plane's dtype:
 *   VLLM             K/V [pages][2][P][Hkv][D], index [pages][2][P][Di]
 *   VLLM_HEAD_MAJOR  K/V [pages][2][Hkv][P][D], index [pages][2][P][Di]
 *   SGLANG           K, V [pages * P][Hkv][D] each, index K, V [pages * P][Di],
 *                    every pool in a buffer of its own (page size 1 in SGLang)
 *   LLAMA_CPP        K, V [cells][Hkv * D] each, index K, V [cells][Di]; cell =
 *                    page * P + slot, K before V in one buffer */
typedef enum msa_case_layout {
    MSA_CASE_LAYOUT_LIBRARY = 0,
    MSA_CASE_LAYOUT_VLLM,
    MSA_CASE_LAYOUT_VLLM_HEAD_MAJOR,
    MSA_CASE_LAYOUT_SGLANG,
    MSA_CASE_LAYOUT_LLAMA_CPP,
    MSA_CASE_LAYOUT_COUNT
} msa_case_layout;

/* "library", "vllm", "vllm-head-major", "sglang", "llama.cpp". */
const char *msa_case_layout_name(int layout);

typedef struct msa_case_result {
    double o_err, lse_err, idx_o_err; /* relative errors (||out-ref|| / ||ref||) */
    long topk_mismatches;             /* rows whose ids differ from the oracle */
    long unwritten;                   /* poisoned elements left unwritten / NaN */
    double tolerance;                 /* the SPEC 11 bound that applied */
    int passed;
    int skipped; /* backend not available */
    char message[256];
    /* Additions. */
    long cache_errors;   /* cache rows that differ from the expected image */
    long padding_errors; /* padding-row outputs other than 0 / -inf / -1 */
    double seconds;      /* wall time of the whole case */
    uint64_t out_hash;   /* hash of every step's outputs, bit for bit (o, idx_o, lse,
                          * topk of all rows) */
    uint64_t cache_hash; /* hash of every step's cache rows after the call, read back
                          * through the layout and laid out as the library's */
    char kernel[400];    /* msa_plan_kernel_name and fallback reason of the last step */
} msa_case_result;

/* Runs one case on `ctx`'s backend against the oracle. Returns result->passed. */
int msa_case_run(msa_context *ctx, const msa_case *c, msa_case_result *result);

/* Runs the steps of cases[0..n-1] one after another on one model, cache and
 * plan, the plan updated in place between steps (as an engine does).  The
 * cases must agree on everything but their steps and seeds; each step gets
 * fresh pool contents.  The result holds the worst error over the steps. */
int msa_case_run_sequence(msa_context *ctx, const msa_case *cases, int n, msa_case_result *result);

/* Runs the steps of cases (whose engine_layout is not the library's) in
 * their engine layout and again in the library layout, each against the
 * oracle, and passes when both pass, both ran the same kernels (the same
 * msa_plan_kernel_name and fallback reason: every kernel of both backends
 * reads rows through the strides), and the cache rows and the outputs of
 * both are the same bit for bit. */
int msa_case_run_layout_pair(msa_context *ctx, const msa_case *cases, int n,
                             msa_case_result *result);

typedef struct msa_sweep_options {
    msa_backend backend;
    int quick;          /* smaller sweep (sanitizer builds, smoke runs) */
    int decode_only;    /* only decode/verify cases (q_len <= 16 per request) */
    const char *filter; /* substring of case names; NULL = all */
    FILE *log;          /* one line per case; NULL = silent */
    /* Additions. */
    int num_threads;   /* CPU worker threads of the sweep's context; 0 = all cores */
    int shard, shards; /* shards > 1: only the selected cases i with i % shards == shard,
                        * so that several processes can share a sweep */
    const msa_debug_options *debug; /* the sweep's context's debugging aids; NULL: none */
    msa_cpu_isa cpu_isa_max;        /* CPU kernel level cap of the sweep's context */
    /* The sweep's context runs its CPU work on this engine pool
     * (msa_context_params.parallel_for); NULL: the library's own threads. */
    void (*parallel_for)(void *engine, int n_tasks, void (*task)(void *arg, int i), void *arg);
    void *engine;
    /* 1: every case runs again on a second context with the library's own
     * threads (same thread count and level), and fails unless both wrote
     * the same outputs bit for bit. */
    int compare_own_pool;
    /* 1: every case with quantized planes (fp8_e4m3, nvfp4) runs again on
     * a CPU context, and fails unless the cache both wrote is the same
     * bytes (codes and group scales) after every step. */
    int compare_cpu_quantized_cache;
} msa_sweep_options;

/* Runs the oracle sweep; counts go to *passed / *failed / *skipped.
 * Returns 0 when nothing failed. */
int msa_sweep_run(const msa_sweep_options *opts, int *passed, int *failed, int *skipped);

#endif
