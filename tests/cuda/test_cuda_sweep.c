/*
 * The CUDA backend against the oracle:
 *   1. the sweep's decode/verify cases (q_len <= 16 per request), every
 *      shape, head mapping, dtype and page size of the sweep; with
 *      quantized planes (fp8_e4m3, nvfp4) the cache the step wrote must
 *      also be the CPU backend's, byte for byte;
 *   2. long contexts in the real M3 layer shape (up to 300K tokens), where
 *      the split indexer, the union attention and the merges do real work:
 *      batch 1 and small batches, 1 to 16 tokens per request, every page
 *      size of the fast path and the portable fp32 path, plus a step that
 *      mixes decode requests with a prefill request;
 *   3. prefill rows (PF_CASES): the tensor-core indexer's shapes, every
 *      head mapping, prefixes, several requests, mixed steps;
 *   4. engine cache layouts (LAYOUT_CASES, msa_cache_wrap_strided) against
 *      the library layout: the same kernels (on CUDA), cache rows and
 *      outputs bit for bit;
 *   5. with --prefill, also the sweep's steps with prefill requests (q_len >
 *      16: the prefill rows' kernels), e.g. --prefill --filter pf for the
 *      cases at head dim 128 that the tensor-core prefill kernel serves.
 *   test_cuda_sweep [--quick] [--prefill] [--filter TEXT] [--cpu] [--shard I/N]
 *                   [--sms N] [--sel-warp-rows] [--sel-unions] [--no-prefill-tma]
 *                   [--no-prefill-indexer] [--no-prefill-wgmma] [--no-prefill-kbm]
 *                   [--kbm-chunk N] [--no-lean]
 * Without a GPU it prints "skipped" and exits 77.  --cpu runs the same
 * cases on the CPU backend instead: a check of the cases themselves (and
 * of the CPU backend at these lengths) on a machine without a GPU.
 * --shard I/N runs every N-th selected case from the I-th on (of each
 * part), so that N processes share the sweep (most of its time is the
 * single-threaded oracle's).  --sms, --sel-warp-rows, --sel-unions and the
 * --no-prefill-* flags set the CUDA backend's debugging aids
 * (msa_debug_options: cuda_num_sms, ..., cuda_no_prefill_tma,
 * cuda_no_prefill_indexer, cuda_no_prefill_wgmma, cuda_no_prefill_kbm) of
 * every context; --kbm-chunk N cuts the key-block-major prefill
 * attention's tokens into chunks of N (cuda_prefill_kbm_chunk); --no-lean
 * keeps plans of few one-token requests on the decode chain
 * (cuda_no_lean_decode).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testkit.h"

#ifdef MSA_TEST_HAVE_CUDART
#include <cuda_runtime_api.h>
#endif

#define EXIT_SKIPPED 77

#define CASE_REQS 4 /* requests a case lists (before its copies) */

typedef struct long_case {
    const char *name;
    msa_dtype act;
    int page, lse, index_value, quick;
    int nreq;
    int q[CASE_REQS], kv[CASE_REQS];
    int tie_blocks, nan_blocks; /* exact ties and NaN blocks (msa_case) */
    int steps;                  /* 2: a second step (new seed) on the same plan, else 1 */
    int out_offset;             /* msa_case.out_offset */
    int copies;                 /* the nreq requests this many times over (0: once) */
    int index_period;           /* msa_case.index_period */
    int lean; /* plan of exact limits (one-token requests): the lean decode kernel must run */
    /* Index-key planes of this type (fp8_e4m3, nvfp4) with index-K scale
     * index_k_scale; 0: the activations' type. */
    msa_dtype index_q;
    float index_k_scale;
    /* K/V planes of this type (fp8_e4m3, nvfp4) with scales k_scale, v_scale; 0:
     * the activations' type. */
    msa_dtype kv_q;
    float k_scale, v_scale;
} long_case;

#define MAX_COPIES 12

static const long_case LONG_CASES[] = {
    {"m3 bf16 P128 b1 q1 200K",
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     0,
     1,
     {1},
     {200000},
     0,
     0,
     1,
     0,
     0,
     0,
     0,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    /* Two steps on one plan: state a step leaves in the workspace (the
     * Hopper indexer's chunk counter, the selection's completion counts)
     * must not change the next.  Over eight blocks per SM (1149 blocks
     * here; 1056 on an H200), so the Hopper indexer takes chunks on demand. */
    {"m3 bf16 P128 b2 q8 130K/17K x2",
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     0,
     2,
     {8, 8},
     {130000, 17003},
     0,
     0,
     2,
     0,
     0,
     0,
     0,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    {"m3 fp16 P64 b3 q16/3/1 lse",
     MSA_DTYPE_FP16,
     64,
     1,
     0,
     0,
     3,
     {16, 3, 1},
     {40000, 9001, 130},
     0,
     0,
     1,
     0,
     0,
     0,
     0,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    {"m3 bf16 P256 b1 q4 index-value",
     MSA_DTYPE_BF16,
     256,
     0,
     1,
     0,
     1,
     {4},
     {65536},
     0,
     0,
     1,
     0,
     0,
     0,
     0,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    {"m3 bf16 P16 b2 q2/1",
     MSA_DTYPE_BF16,
     16,
     0,
     0,
     1,
     2,
     {2, 1},
     {20000, 12345},
     0,
     0,
     1,
     0,
     0,
     0,
     0,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    {"m3 fp32 P128 b1 q8 (portable path)",
     MSA_DTYPE_FP32,
     128,
     0,
     1,
     0,
     1,
     {8},
     {30000},
     0,
     0,
     1,
     0,
     0,
     0,
     0,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    /* In the quick set: chunks on demand (1158 decode blocks), two steps. */
    {"m3 bf16 P128 decode+prefill 140K x2",
     MSA_DTYPE_BF16,
     128,
     0,
     1,
     1,
     3,
     {8, 40, 1},
     {140000, 5000, 3000},
     0,
     0,
     2,
     0,
     0,
     0,
     0,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    /* Hopper attention units of two items: 16 tokens (two pairs) and 5
     * tokens (a pair of 4 + 1). */
    {"m3 bf16 P128 b2 q16/5 50K/20K lse",
     MSA_DTYPE_BF16,
     128,
     1,
     0,
     0,
     2,
     {16, 5},
     {50000, 20000},
     0,
     0,
     1,
     0,
     0,
     0,
     0,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    /* More tied winners than the selection's candidate list holds (its
     * fallback), and a few ties plus NaN blocks (its filter). */
    {"m3 bf16 P128 b1 q4 120K 312 tied x2",
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     1,
     1,
     {4},
     {120000},
     400,
     0,
     2,
     0,
     0,
     0,
     0,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    /* Requests that reach at most K blocks (their union known from the
     * plan, its cached tiles read before the launch wait) beside one that
     * reaches more: 16 blocks exactly, 17, and a short one. */
    {"m3 bf16 P128 b4 q8/1/3/16 2048/30K/200/2049 x2",
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     1,
     4,
     {8, 1, 3, 16},
     {2048, 30000, 200, 2049},
     0,
     0,
     2,
     0,
     0,
     0,
     0,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    {"m3 bf16 P128 b2 q1 30K ties+NaN",
     MSA_DTYPE_BF16,
     128,
     1,
     0,
     1,
     2,
     {1, 2},
     {30000, 9000},
     20,
     40,
     1,
     0,
     0,
     0,
     0,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    /* 40 tied winners: more than a lone warp's one-per-lane list holds
     * (32), within its two-per-lane path (64), and a CTA's list of 40
     * entries to rank; then index keys that repeat every 100 blocks
     * (blocks tied in threes, as `msa bench`'s data ties them in pairs),
     * rows of over 256 blocks, so that the CTA's merged threshold applies. */
    {"m3 bf16 P128 b2 q2/1 20K/16K 40 tied",
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     1,
     2,
     {2, 1},
     {20000, 16500},
     40,
     0,
     1,
     0,
     0,
     0,
     0,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    {"m3 bf16 P128 b2 q1/3 40K/35K keys every 100",
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     1,
     2,
     {1, 3},
     {40000, 35000},
     0,
     0,
     1,
     0,
     0,
     100,
     0,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    /* The Hopper attention builds the unions of requests of at most 2048
     * blocks itself and stages their pages; the selection builds those of
     * longer ones (here 2345 blocks), in the same step (and the one-token
     * request's pages come from the table). */
    {"m3 bf16 P128 b3 q8/3/1 300K/20K/270K",
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     0,
     3,
     {8, 3, 1},
     {300000, 20000, 270000},
     0,
     0,
     1,
     0,
     0,
     0,
     0,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    /* An output 4-byte but not 16-byte aligned: on grids for 8 SMs the 12
     * units (a pair, single items of 1 and 3 tokens) are not split, and the
     * Hopper attention stores their rows directly instead of through shared
     * memory; on full grids they are split and the merge writes them. */
    {"m3 bf16 P128 b3 q8/1/3 20K/9K/4K o+4B",
     MSA_DTYPE_BF16,
     128,
     1,
     0,
     1,
     3,
     {8, 1, 3},
     {20000, 9000, 4000},
     0,
     0,
     1,
     4,
     0,
     0,
     0,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    /* 144 units of uneven length (pairs and single items), unsplit on any
     * grid: one or two per CTA on a full grid, many on grids for 8 SMs,
     * dealt by estimated cost.  Two steps on one plan.  (With the build
     * option of bench/patches/att-help.patch the CTAs that finish first
     * take the backs of others' units here, and the merge combines the
     * halves.) */
    {"m3 bf16 P128 b36 q8/1/3/2 9K/3K/6K/4K x2",
     MSA_DTYPE_BF16,
     128,
     1,
     0,
     1,
     4,
     {8, 1, 3, 2},
     {9000, 3000, 6000, 4100},
     0,
     0,
     2,
     0,
     9,
     0,
     0,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    /* The lean decode kernel: plans of one-token requests that keep every
     * block (contexts up to K blocks) with at most one (request, KV head,
     * block) task per SM; requests of one block and of 16, page sizes 16
     * to 128, both score types, six requests, two steps on one plan (its
     * merge counts back at zero). */
    {"lean-decode bf16 P128 b1 q1 1K",
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     1,
     1,
     {1},
     {1000},
     0,
     0,
     1,
     0,
     0,
     0,
     1,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    {"lean-decode bf16 P128 b1 q1 2048 x2",
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     1,
     1,
     {1},
     {2048},
     0,
     0,
     2,
     0,
     0,
     0,
     1,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    {"lean-decode fp16 P64 b2 q1 lse 2048/130 x2",
     MSA_DTYPE_FP16,
     64,
     1,
     0,
     0,
     2,
     {1, 1},
     {2048, 130},
     0,
     0,
     2,
     0,
     0,
     0,
     1,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    {"lean-decode bf16 P16 b4 q1 1000/999/517/1",
     MSA_DTYPE_BF16,
     16,
     0,
     0,
     0,
     4,
     {1, 1, 1, 1},
     {1000, 999, 517, 1},
     0,
     0,
     1,
     0,
     0,
     0,
     1,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    {"lean-decode fp16 P128 b6 q1 512/300 x2",
     MSA_DTYPE_FP16,
     128,
     1,
     0,
     0,
     2,
     {1, 1},
     {512, 300},
     0,
     0,
     2,
     0,
     3,
     0,
     1,
     0,
     0.0f,
     0,
     0.0f,
     0.0f},
    /* Quantized index keys in the real layer (the Hopper indexer on a
     * 9.x device: fp8 codes through a tensor map, nvfp4 pages by bulk
     * copies, widened in registers): shares and chunks on demand over two
     * steps, several requests a CTA, both score types, 1 to 16 tokens,
     * NaN blocks and ties. */
    {"m3 bf16 P128 b2 q8 130K/17K fp8-index x2",
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     1,
     2,
     {8, 8},
     {130000, 17003},
     0,
     0,
     2,
     0,
     0,
     0,
     0,
     MSA_DTYPE_FP8_E4M3,
     0.05f,
     0,
     0.0f,
     0.0f},
    {"m3 fp16 P128 b3 q16/3/1 lse nvfp4-index",
     MSA_DTYPE_FP16,
     128,
     1,
     0,
     0,
     3,
     {16, 3, 1},
     {40000, 9001, 130},
     0,
     0,
     1,
     0,
     0,
     0,
     0,
     MSA_DTYPE_NVFP4,
     3.0f,
     0,
     0.0f,
     0.0f},
    {"m3 bf16 P128 b2 q1 30K ties+NaN fp8-index",
     MSA_DTYPE_BF16,
     128,
     1,
     0,
     0,
     2,
     {1, 2},
     {30000, 9000},
     20,
     40,
     1,
     0,
     0,
     0,
     0,
     MSA_DTYPE_FP8_E4M3,
     0.5f,
     0,
     0.0f,
     0.0f},
    {"m3 bf16 P128 b24 q4/1/8 nvfp4-index x2",
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     1,
     3,
     {4, 1, 8},
     {6000, 21000, 2500},
     0,
     12,
     2,
     0,
     8,
     0,
     0,
     MSA_DTYPE_NVFP4,
     0.0f,
     0,
     0.0f,
     0.0f},
    /* fp8 K/V in the real layer (the Hopper decode attention on a 9.x
     * device: code tiles through tensor maps, widened by each group that
     * computes them): pairs of items over two steps with fp8 index keys,
     * single items and a 16-token request with nvfp4 index keys and the
     * log-sum-exp score, many units of uneven length on one plan. */
    {"m3 bf16 P128 b2 q8 130K/17K fp8-kv x2",
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     1,
     2,
     {8, 8},
     {130000, 17003},
     0,
     0,
     2,
     0,
     0,
     0,
     0,
     MSA_DTYPE_FP8_E4M3,
     0.05f,
     MSA_DTYPE_FP8_E4M3,
     0.02f,
     0.5f},
    {"m3 fp16 P128 b3 q16/3/1 lse fp8-kv",
     MSA_DTYPE_FP16,
     128,
     1,
     0,
     0,
     3,
     {16, 3, 1},
     {40000, 9001, 130},
     0,
     0,
     1,
     0,
     0,
     0,
     0,
     MSA_DTYPE_NVFP4,
     3.0f,
     MSA_DTYPE_FP8_E4M3,
     0.3f,
     7.0f},
    {"m3 bf16 P128 b36 q8/1/3/2 fp8-kv x2",
     MSA_DTYPE_BF16,
     128,
     1,
     0,
     0,
     4,
     {8, 1, 3, 2},
     {9000, 3000, 6000, 4100},
     0,
     0,
     2,
     0,
     9,
     0,
     0,
     0,
     0.0f,
     MSA_DTYPE_FP8_E4M3,
     0.0f,
     0.0f},
    /* nvfp4 K/V the same way (codes and group scales by bulk copies,
     * widened with their scales): pairs over two steps with nvfp4 index
     * keys, single items and 16 tokens with fp8 index keys. */
    {"m3 bf16 P128 b2 q8 130K/17K nvfp4-kv x2",
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     1,
     2,
     {8, 8},
     {130000, 17003},
     0,
     0,
     2,
     0,
     0,
     0,
     0,
     MSA_DTYPE_NVFP4,
     0.0f,
     MSA_DTYPE_NVFP4,
     0.05f,
     2.0f},
    {"m3 fp16 P128 b3 q16/3/1 lse nvfp4-kv",
     MSA_DTYPE_FP16,
     128,
     1,
     0,
     0,
     3,
     {16, 3, 1},
     {40000, 9001, 130},
     0,
     0,
     1,
     0,
     0,
     0,
     0,
     MSA_DTYPE_FP8_E4M3,
     0.5f,
     MSA_DTYPE_NVFP4,
     0.0f,
     0.0f}};

/* Prefill rows (q_len > 16) on the tensor-core indexer and selection:
 * index dim 128 and blocks a multiple of 64 (its shapes), every head
 * mapping (eq, union of 2 and 4, shared), 1 to 4 index heads (tiles of 64,
 * 32, 21 and 16 tokens), both score types, page sizes 16 to 256, several
 * requests, prefixes, mixed steps, ties and NaN blocks, two steps on one
 * plan.  Most use a lean main layer (few heads, head dim 32) so that the
 * oracle spends its time on the index scores; every row's selected ids are
 * compared with the oracle's (msa_case topk), every output too. */
typedef struct pf_case {
    const char *name;
    int Hq, Hkv, D, Hi, B, K, I, Lc; /* Di = 128 */
    msa_dtype act;
    int page, lse, index_value, quick;
    int nreq;
    int q[CASE_REQS], kv[CASE_REQS];
    int tie_blocks, nan_blocks, steps;
} pf_case;

static const pf_case PF_CASES[] = {
    {"pfsel m3 bf16 P128 q300 after 30K",
     64,
     4,
     128,
     4,
     128,
     16,
     0,
     1,
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     1,
     1,
     {300},
     {30300},
     0,
     0,
     1},
    {"pfsel m3 bf16 P128 mixed 1/8/120/17",
     64,
     4,
     128,
     4,
     128,
     16,
     0,
     1,
     MSA_DTYPE_BF16,
     128,
     0,
     1,
     1,
     4,
     {1, 8, 120, 17},
     {40000, 9000, 15000, 17},
     0,
     0,
     1},
    {"pfsel m3 bf16 P128 q64 20K 40 tied",
     64,
     4,
     128,
     4,
     128,
     16,
     0,
     1,
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     1,
     1,
     {64},
     {20064},
     40,
     0,
     1},
    {"pfsel lean fp16 P64 lse q100/40 20K/3K",
     4,
     4,
     32,
     4,
     128,
     16,
     0,
     1,
     MSA_DTYPE_FP16,
     64,
     1,
     0,
     1,
     2,
     {100, 40},
     {20100, 3040},
     0,
     0,
     1},
    {"pfsel union2 bf16 P128 q70/1 9K/5K",
     8,
     2,
     32,
     4,
     128,
     16,
     1,
     2,
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     1,
     2,
     {70, 1},
     {9000, 5000},
     0,
     0,
     1},
    {"pfsel union4 fp16 P16 lse q50 8K",
     4,
     1,
     32,
     4,
     128,
     16,
     0,
     2,
     MSA_DTYPE_FP16,
     16,
     1,
     0,
     1,
     1,
     {50},
     {8000},
     0,
     0,
     1},
    {"pfsel shared bf16 P32 B64 q90 12K",
     8,
     4,
     32,
     2,
     64,
     16,
     1,
     1,
     MSA_DTYPE_BF16,
     32,
     0,
     0,
     1,
     1,
     {90},
     {12000},
     0,
     0,
     1},
    {"pfsel hi3 bf16 P256 q100/30 6K/2K",
     6,
     3,
     32,
     3,
     128,
     12,
     0,
     1,
     MSA_DTYPE_BF16,
     256,
     1,
     0,
     1,
     2,
     {100, 30},
     {6000, 2000},
     0,
     0,
     1},
    {"pfsel hi1 bf16 P128 q150 20K",
     2,
     1,
     32,
     1,
     128,
     16,
     0,
     1,
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     1,
     1,
     {150},
     {20000},
     0,
     0,
     1},
    {"pfsel lean bf16 P128 q80 15K ties+NaN",
     4,
     4,
     32,
     4,
     128,
     16,
     0,
     1,
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     1,
     1,
     {80},
     {15000},
     20,
     30,
     1},
    {"pfsel lean bf16 P128 q200/33 25K/33 x2",
     4,
     4,
     32,
     4,
     128,
     16,
     0,
     1,
     MSA_DTYPE_BF16,
     128,
     1,
     0,
     1,
     2,
     {200, 33},
     {25000, 33},
     0,
     0,
     2},
    /* More tiles than half the grid of an H200 (188): no key-range splits. */
    {"pfsel lean fp16 P128 fresh 3000 lse",
     4,
     4,
     32,
     4,
     128,
     16,
     0,
     1,
     MSA_DTYPE_FP16,
     128,
     1,
     0,
     1,
     1,
     {3000},
     {3000},
     0,
     0,
     1},
    {"pfsel lean bf16 P128 fresh 8K",
     4,
     4,
     32,
     4,
     128,
     16,
     0,
     1,
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     0,
     1,
     {8192},
     {8192},
     0,
     0,
     1},
    /* One index head: a quarter of the oracle's index work (about 2.5 min). */
    {"pfsel hi1 bf16 P128 fresh 32K lse",
     2,
     1,
     32,
     1,
     128,
     16,
     0,
     1,
     MSA_DTYPE_BF16,
     128,
     1,
     0,
     0,
     1,
     {32768},
     {32768},
     0,
     0,
     1},
    {"pfsel lean bf16 P64 q1K after 127K",
     4,
     4,
     32,
     4,
     128,
     16,
     0,
     1,
     MSA_DTYPE_BF16,
     64,
     0,
     0,
     0,
     1,
     {1024},
     {131072},
     0,
     0,
     1},
    {"pfsel m3 bf16 P128 q2K after 30K x3",
     64,
     4,
     128,
     4,
     128,
     16,
     0,
     1,
     MSA_DTYPE_BF16,
     128,
     0,
     0,
     0,
     3,
     {2048, 700, 17},
     {32768, 9000, 4000},
     0,
     0,
     1},
    /* Key-block-major attention on other shapes than M3's: 32 query
     * heads per KV head (a unit's 16 x 32 partial rows overflow the bulk
     * merge's slot, so the grid-stride merge runs), and 8 per KV head with
     * selection rows of 12 blocks (the bulk merge with lanes past W). */
    {"pfsel kbm g32 bf16 P128 q200 after 6K",
     64,
     2,
     128,
     2,
     128,
     16,
     0,
     1,
     MSA_DTYPE_BF16,
     128,
     1,
     0,
     0,
     1,
     {200},
     {6200},
     0,
     0,
     1},
    {"pfsel kbm g8 fp16 P128 K12 q150/40 5K/3K",
     16,
     2,
     128,
     2,
     128,
     12,
     1,
     1,
     MSA_DTYPE_FP16,
     128,
     1,
     0,
     0,
     2,
     {150, 40},
     {5150, 3040},
     0,
     0,
     1},
};

/* Prints a case's line and counts it; returns 0 when it was skipped. */
static int report_case(const char *name, const msa_case_result *res, int *passed, int *failed)
{
    printf("%-40s %s  o %.2e  lse %.2e  idx_o %.2e  ids %ld  unwritten %ld  %.1fs %s\n", name,
           res->skipped  ? "SKIP"
           : res->passed ? "ok  "
                         : "FAIL",
           res->o_err, res->lse_err, res->idx_o_err, res->topk_mismatches, res->unwritten,
           res->seconds, res->message);
    fflush(stdout);
    if (res->skipped)
        return 0;
    if (res->passed)
        ++*passed;
    else
        ++*failed;
    return 1;
}

/* The M3 sparse layer's shape (64 query heads on 4 KV heads of 128, 4
 * index heads of 128, blocks of 128, top 16 and one local block). */
static void m3_sparse_shape(msa_case *c)
{
    c->Hq = 64;
    c->Hkv = 4;
    c->D = 128;
    c->Hi = 4;
    c->Di = 128;
    c->block = 128;
    c->topk = 16;
    c->init_blocks = 0;
    c->local_blocks = 1;
    c->sparse = 1;
}

static int run_pf(msa_context *ctx, const pf_case *pc, int *passed, int *failed)
{
    msa_case c;
    memset(&c, 0, sizeof c);
    c.name = pc->name;
    c.Hq = pc->Hq;
    c.Hkv = pc->Hkv;
    c.D = pc->D;
    c.Hi = pc->Hi;
    c.Di = 128;
    c.block = pc->B;
    c.topk = pc->K;
    c.init_blocks = pc->I;
    c.local_blocks = pc->Lc;
    c.score_lse = pc->lse;
    c.sparse = 1;
    c.index_value = pc->index_value;
    c.page_size = pc->page;
    c.act_dtype = pc->act;
    c.kv_dtype = pc->act;
    c.index_dtype = pc->act;
    c.num_requests = pc->nreq;
    c.q_len = pc->q;
    c.kv_len = pc->kv;
    c.padding_rows = 3;
    c.shuffle_pages = 1;
    c.write_cache = 1;
    c.seed = 0x9f11a000u + (uint64_t)pc->page * 131u + (uint64_t)pc->q[0];
    c.tie_blocks = pc->tie_blocks;
    c.nan_blocks = pc->nan_blocks;
    msa_case_result res;
    memset(&res, 0, sizeof res);
    if (pc->steps == 2) {
        msa_case seq[2] = {c, c};
        seq[1].seed = c.seed + 1;
        msa_case_run_sequence(ctx, seq, 2, &res);
    } else {
        msa_case_run(ctx, &c, &res);
    }
    return report_case(pc->name, &res, passed, failed);
}

/* The CUDA device's compute capability major (0 when unknown). */
static int device_major(void)
{
#ifdef MSA_TEST_HAVE_CUDART
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess)
        return major;
    cudaGetLastError();
#endif
    return 0;
}

/* The lean cases must run the lean decode kernel: not with --no-lean (off)
 * or --sms (fewer CTAs than their tasks). */
static int expect_lean = 1;

static int run_long(msa_context *ctx, const long_case *lc, int *passed, int *failed)
{
    msa_case c;
    memset(&c, 0, sizeof c);
    c.name = lc->name;
    m3_sparse_shape(&c);
    c.score_lse = lc->lse;
    c.index_value = lc->index_value;
    c.page_size = lc->page;
    c.act_dtype = lc->act;
    c.kv_dtype = lc->kv_q ? lc->kv_q : lc->act;
    c.index_dtype = lc->index_q ? lc->index_q : lc->act;
    c.index_k_scale = lc->index_k_scale;
    c.k_scale = lc->k_scale;
    c.v_scale = lc->v_scale;
    int q[CASE_REQS * MAX_COPIES], kv[CASE_REQS * MAX_COPIES];
    const int copies = lc->copies > 0 ? lc->copies : 1;
    if (copies > MAX_COPIES || lc->nreq > CASE_REQS) {
        printf("%-40s FAIL  the case table asks for more requests than it holds\n", lc->name);
        ++*failed;
        return 1;
    }
    for (int k = 0; k < copies; ++k)
        for (int r = 0; r < lc->nreq; ++r) {
            q[k * lc->nreq + r] = lc->q[r];
            kv[k * lc->nreq + r] = lc->kv[r] + 7 * k; /* a little uneven */
        }
    c.num_requests = lc->nreq * copies;
    c.q_len = q;
    c.kv_len = kv;
    c.padding_rows = 2;
    c.shuffle_pages = 1;
    c.write_cache = 1;
    c.seed = 0x5eed0000u + (uint64_t)lc->page * 31u + (uint64_t)lc->nreq;
    c.tie_blocks = lc->tie_blocks;
    c.nan_blocks = lc->nan_blocks;
    c.out_offset = lc->out_offset;
    c.index_period = lc->index_period;
    if (lc->lean) {
        c.fixed_limits = 1;
        if (expect_lean)
            c.expect_cuda = "cuda.sparse.lean";
    }
    /* Quantized planes: a 9.x device runs the Hopper kernels over pages of
     * 128 (the library's sm_90a code); other devices the mma.sync ones. */
    const char *kernels = device_major() == 9 && lc->page == 128 ? "Hopper" : "mma.sync";
    char expect[96];
    if (lc->kv_q) {
        snprintf(expect, sizeof expect, "%s K/V planes: codes widened by the %s decode",
                 lc->kv_q == MSA_DTYPE_NVFP4 ? "nvfp4" : "fp8_e4m3", kernels);
        c.expect_cuda = expect;
    } else if (lc->index_q) {
        snprintf(expect, sizeof expect, "%s index planes: codes widened by the %s indexer",
                 lc->index_q == MSA_DTYPE_NVFP4 ? "nvfp4" : "fp8_e4m3", kernels);
        c.expect_cuda = expect;
    }
    msa_case_result res;
    memset(&res, 0, sizeof res);
    if (lc->steps == 2) {
        msa_case seq[2] = {c, c};
        seq[1].seed = c.seed + 1;
        msa_case_run_sequence(ctx, seq, 2, &res);
    } else {
        msa_case_run(ctx, &c, &res);
    }
    return report_case(lc->name, &res, passed, failed);
}

/* Engine cache layouts (msa_cache_wrap_strided) in the real layer's shape:
 * each case runs in the engine's layout and in the library layout, and
 * the cache rows and the outputs must match bit for bit.  The tensor-core
 * kernels read rows through the strides, so the engine layout runs the
 * library layout's kernels
 * (same name and reason: msa_case_run_layout_pair), whose name begins
 * with `expect`: the mma.sync kernels for pages other than 128 (no tensor
 * map serves them), SIMT for fp32 activations; NULL where the device
 * decides (the tensor-map kernels on Hopper, mma.sync before it), never
 * SIMT. */
typedef struct layout_case {
    const char *name;
    int layout; /* msa_case_layout */
    msa_dtype act;
    int page, index_value, quick;
    int nreq;
    int q[CASE_REQS], kv[CASE_REQS];
    const char *expect;
} layout_case;

static const layout_case LAYOUT_CASES[] = {
    {"layout vllm bf16 P16 decode+prefill",
     MSA_CASE_LAYOUT_VLLM,
     MSA_DTYPE_BF16,
     16,
     1,
     1,
     3,
     {1, 4, 300},
     {9000, 2100, 1300},
     "cuda.sparse.mma"},
    {"layout vllm-head-major bf16 P128",
     MSA_CASE_LAYOUT_VLLM_HEAD_MAJOR,
     MSA_DTYPE_BF16,
     128,
     0,
     1,
     2,
     {1, 40},
     {20000, 700},
     NULL},
    /* Token-major pages of 128: rows Hkv x D elements apart, a head's
     * rows of a page not contiguous; prefill rows beside decode rows. */
    {"layout vllm bf16 P128 decode+prefill",
     MSA_CASE_LAYOUT_VLLM,
     MSA_DTYPE_BF16,
     128,
     1,
     1,
     3,
     {1, 9, 400},
     {12000, 5000, 1500},
     NULL},
    {"layout sglang bf16 P1",
     MSA_CASE_LAYOUT_SGLANG,
     MSA_DTYPE_BF16,
     1,
     1,
     1,
     2,
     {1, 8},
     {5000, 900},
     "cuda.sparse.mma"},
    {"layout llama.cpp fp16 P32",
     MSA_CASE_LAYOUT_LLAMA_CPP,
     MSA_DTYPE_FP16,
     32,
     0,
     0,
     2,
     {2, 100},
     {7000, 400},
     "cuda.sparse.mma"},
    {"layout llama.cpp fp16 P128 prefill",
     MSA_CASE_LAYOUT_LLAMA_CPP,
     MSA_DTYPE_FP16,
     128,
     0,
     0,
     2,
     {600, 3},
     {2600, 9000},
     NULL},
    {"layout vllm fp32 P16 (same kernels)",
     MSA_CASE_LAYOUT_VLLM,
     MSA_DTYPE_FP32,
     16,
     1,
     1,
     2,
     {1, 20},
     {3000, 300},
     "cuda.sparse.simt"},
};

static int run_layout(msa_context *ctx, const layout_case *lc, int cuda, int *passed, int *failed)
{
    msa_case c;
    memset(&c, 0, sizeof c);
    c.name = lc->name;
    m3_sparse_shape(&c);
    c.index_value = lc->index_value;
    c.page_size = lc->page;
    c.act_dtype = lc->act;
    c.kv_dtype = lc->act;
    c.index_dtype = lc->act;
    c.num_requests = lc->nreq;
    c.q_len = lc->q;
    c.kv_len = lc->kv;
    c.padding_rows = 2;
    c.shuffle_pages = 1;
    c.write_cache = 1;
    c.seed = 0x1a70u + (uint64_t)lc->layout * 7919u + (uint64_t)lc->page;
    c.engine_layout = lc->layout;
    msa_case_result res;
    memset(&res, 0, sizeof res);
    msa_case_run_layout_pair(ctx, &c, 1, &res);
    /* The path (the pair checked that the library layout ran the same). */
    const char *want = lc->expect ? lc->expect : "tensor-core";
    const int simt = strstr(res.kernel, ".simt") != NULL;
    if (res.passed && cuda &&
        (lc->expect ? strncmp(res.kernel, lc->expect, strlen(lc->expect)) != 0 : simt)) {
        res.passed = 0;
        snprintf(res.message, sizeof res.message, "ran %.160s, expected a %s kernel", res.kernel,
                 want);
    } else if (res.passed && cuda) {
        snprintf(res.message, sizeof res.message, "%.200s", res.kernel);
    }
    return report_case(lc->name, &res, passed, failed);
}

int main(int argc, char **argv)
{
    int quick = 0, prefill = 0, shard = 0, shards = 1;
    const char *filter = NULL;
    msa_backend backend = MSA_BACKEND_CUDA;
    msa_debug_options debug;
    memset(&debug, 0, sizeof debug);
    for (int i = 1; i < argc; i++) {
        char end = 0;
        if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--prefill")) {
            prefill = 1;
        } else if (!strcmp(argv[i], "--filter") && i + 1 < argc) {
            filter = argv[++i];
        } else if (!strcmp(argv[i], "--cpu")) {
            backend = MSA_BACKEND_CPU;
        } else if (!strcmp(argv[i], "--sms") && i + 1 < argc && atoi(argv[i + 1]) > 0) {
            debug.cuda_num_sms = atoi(argv[++i]);
            expect_lean = 0;
        } else if (!strcmp(argv[i], "--sel-warp-rows")) {
            debug.cuda_sel_warp_rows = 1;
        } else if (!strcmp(argv[i], "--sel-unions")) {
            debug.cuda_sel_unions = 1;
        } else if (!strcmp(argv[i], "--no-prefill-tma")) {
            debug.cuda_no_prefill_tma = 1;
        } else if (!strcmp(argv[i], "--no-prefill-kbm")) {
            debug.cuda_no_prefill_kbm = 1;
        } else if (!strcmp(argv[i], "--kbm-chunk") && i + 1 < argc && atoi(argv[i + 1]) > 0) {
            debug.cuda_prefill_kbm_chunk = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--no-prefill-indexer")) {
            debug.cuda_no_prefill_indexer = 1;
        } else if (!strcmp(argv[i], "--no-prefill-wgmma")) {
            debug.cuda_no_prefill_wgmma = 1;
        } else if (!strcmp(argv[i], "--no-lean")) {
            debug.cuda_no_lean_decode = 1;
            expect_lean = 0;
        } else if (!strcmp(argv[i], "--shard") && i + 1 < argc &&
                   sscanf(argv[i + 1], "%d/%d%c", &shard, &shards, &end) == 2 && shards >= 1 &&
                   shard >= 0 && shard < shards) {
            ++i;
        } else {
            fprintf(stderr,
                    "usage: test_cuda_sweep [--quick] [--prefill] [--filter TEXT] [--cpu] "
                    "[--shard I/N] [--sms N] [--sel-warp-rows] [--sel-unions] [--no-prefill-tma] "
                    "[--no-prefill-indexer] [--no-prefill-wgmma] [--no-prefill-kbm] "
                    "[--kbm-chunk N] [--no-lean]\n");
            return 2;
        }
    }
    if (!msa_backend_available(backend)) {
        printf("skipped: no CUDA device (or the CUDA backend is not built)\n");
        printf("0 passed, 0 failed, 1 skipped\n");
        return EXIT_SKIPPED;
    }

    msa_sweep_options opts;
    memset(&opts, 0, sizeof opts);
    opts.backend = backend;
    opts.quick = quick;
    opts.debug = &debug;
    opts.decode_only = !prefill;
    opts.filter = filter;
    opts.shard = shard;
    opts.shards = shards;
    opts.log = stdout;
    /* Quantized planes: the cache the CUDA backend wrote must be the CPU
     * backend's, codes and group scales bit for bit. */
    opts.compare_cpu_quantized_cache = backend == MSA_BACKEND_CUDA;
    int passed = 0, failed = 0, skipped = 0;
    msa_sweep_run(&opts, &passed, &failed, &skipped);

    msa_context_params cp;
    msa_context_params_default(&cp);
    cp.backend = backend;
    cp.debug = &debug;
    msa_context *ctx = NULL;
    char err[256];
    if (msa_context_create(&cp, &ctx, err, sizeof err) != MSA_OK) {
        printf("FAIL: %s context: %s\n", msa_backend_name(backend), err);
        ++failed;
    } else {
        int selected = 0;
        for (size_t i = 0; i < sizeof LONG_CASES / sizeof LONG_CASES[0]; ++i) {
            const long_case *lc = &LONG_CASES[i];
            if ((quick && !lc->quick) || (filter && !strstr(lc->name, filter)))
                continue;
            if (selected++ % shards != shard)
                continue;
            if (!run_long(ctx, lc, &passed, &failed))
                ++skipped;
        }
        for (size_t i = 0; i < sizeof PF_CASES / sizeof PF_CASES[0]; ++i) {
            const pf_case *pc = &PF_CASES[i];
            if ((quick && !pc->quick) || (filter && !strstr(pc->name, filter)))
                continue;
            if (selected++ % shards != shard)
                continue;
            if (!run_pf(ctx, pc, &passed, &failed))
                ++skipped;
        }
        for (size_t i = 0; i < sizeof LAYOUT_CASES / sizeof LAYOUT_CASES[0]; ++i) {
            const layout_case *lc = &LAYOUT_CASES[i];
            if ((quick && !lc->quick) || (filter && !strstr(lc->name, filter)))
                continue;
            if (selected++ % shards != shard)
                continue;
            if (!run_layout(ctx, lc, backend == MSA_BACKEND_CUDA, &passed, &failed))
                ++skipped;
        }
        msa_context_free(ctx);
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    if (failed)
        return 1;
    return passed == 0 ? EXIT_SKIPPED : 0;
}
