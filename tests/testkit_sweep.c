/*
 * The oracle sweep: a fixed list of cases covering every shape, head
 * mapping, dtype, page size and step kind of the SPEC, each run through
 * msa_case_run.  Cases are built from a few shapes and step kinds, with the
 * other axes rotating so that every value of every axis is visited without
 * running the full product.
 */
#include "testkit_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tk_shape {
    const char *name;
    int Hq, Hkv, D, Hi, Di, block, topk, init_blocks, local_blocks;
} tk_shape;

typedef struct tk_steps {
    const char *name;
    int num_requests;
    const int *q_len, *kv_len;
    int padding_rows, share_prefix, shuffle_pages;
} tk_steps;

/* One sweep entry: a single step, or a sequence of steps on one plan. */
#define TK_MAX_SEQ 5
typedef struct tk_entry {
    msa_case c[TK_MAX_SEQ];
    int n;
    const char *shape, *step[TK_MAX_SEQ];
    int quick;
    char name[320];
    /* Lengths of generated steps live here (c[i] points in once the list
     * stops moving). */
    int own_lengths;
    int q_store[TK_MAX_SEQ][8], kv_store[TK_MAX_SEQ][8];
} tk_entry;

typedef struct tk_list {
    tk_entry *e;
    int n, cap;
} tk_list;

/* ---- shapes: small head dims keep long contexts cheap ------------------- */
static const tk_shape SMALL = {"small", 8, 2, 32, 2, 32, 16, 8, 1, 2};   /* Hi == Hkv */
static const tk_shape UNION2 = {"union2", 8, 2, 32, 4, 32, 16, 6, 0, 1}; /* Hi = 2 Hkv */
static const tk_shape UNION4 = {"union4", 4, 1, 32, 4, 16, 16, 4, 1, 1}; /* Hi = 4 Hkv */
static const tk_shape SPLIT = {"split", 8, 4, 32, 2, 32, 32, 6, 1, 2};   /* Hkv = 2 Hi */
static const tk_shape MHA = {"mha", 4, 4, 16, 4, 16, 16, 5, 0, 3};       /* group of 1 */
static const tk_shape ODD = {"odd", 6, 3, 40, 3, 24, 16, 5, 0, 1};       /* unaligned dims */
static const tk_shape B32 = {"b32", 8, 2, 32, 2, 32, 32, 10, 2, 3};      /* I = 2, Lc = 3 */
static const tk_shape M3 = {"m3", 64, 4, 128, 4, 128, 128, 16, 0, 1};    /* the real layer */
static const tk_shape MID = {"mid", 16, 2, 64, 2, 64, 64, 8, 1, 1};      /* D = 64 */
static const tk_shape WIDE = {"wide", 4, 1, 256, 1, 256, 32, 4, 0, 1};   /* D = 256 */
static const tk_shape BIGK = {"bigk", 4, 1, 32, 4, 32, 16, 40, 2, 4};    /* width 4 x 40 */
static const tk_shape B24 = {"b24", 8, 2, 32, 2, 32, 24, 6, 1, 2};       /* blocks straddle pages */
static const tk_shape TIGHT = {"tight", 4, 2, 32, 2, 32, 16, 3, 1, 2};   /* I + Lc == K */
static const tk_shape B1 = {"b1", 4, 2, 16, 2, 16, 1, 8, 1, 2};          /* one key per block */
static const tk_shape HUGEG = {"hugeg", 320, 1, 16, 1, 16, 16, 4, 0, 1}; /* one group > 256 rows */

/* ---- step kinds (B = 16: 1100 tokens are 69 blocks) -------------------- */
static const int dec_q[] = {1, 1, 1, 1}, dec_kv[] = {1100, 517, 33, 1};
static const int ver_q[] = {2, 7, 16}, ver_kv[] = {1030, 260, 16};
static const int pre_q[] = {600}, pre_kv[] = {600};
static const int ext_q[] = {150, 40}, ext_kv[] = {1060, 300};
static const int mix_q[] = {1, 64, 0, 5}, mix_kv[] = {900, 200, 77, 5};
static const int few_q[] = {20, 1}, few_kv[] = {100, 60}; /* N <= K: dense equivalent */
static const int zero_q[] = {0, 0}, zero_kv[] = {40, 0};
static const int long_q[] = {1, 3}, long_kv[] = {2100, 1500}; /* 65 blocks of 32 */
static const int m3dec_q[] = {1, 1}, m3dec_kv[] = {8200, 2900};
static const int m3ver_q[] = {4, 8}, m3ver_kv[] = {8300, 1500};
static const int m3ver16_q[] = {16, 3}, m3ver16_kv[] = {5000, 900}; /* 64 index columns */
static const int m3ext_q[] = {24}, m3ext_kv[] = {2200};
static const int m3small_q[] = {1, 2}, m3small_kv[] = {2200, 300};
static const int long16_q[] = {1, 5, 30}, long16_kv[] = {2000, 1200, 700}; /* 125 blocks */
static const int m3long_q[] = {1}, m3long_kv[] = {33000};
static const int one_q[] = {3}, one_kv[] = {200};

static const tk_steps DECODE = {"decode", 4, dec_q, dec_kv, 0, 1, 1};
static const tk_steps VERIFY = {"verify", 3, ver_q, ver_kv, 0, 0, 1};
static const tk_steps PREFILL = {"prefill", 1, pre_q, pre_kv, 0, 0, 0};
static const tk_steps EXTEND = {"extend", 2, ext_q, ext_kv, 0, 1, 1};
static const tk_steps MIXED = {"mixed", 4, mix_q, mix_kv, 3, 1, 1};
static const tk_steps FEW = {"few-blocks", 2, few_q, few_kv, 0, 0, 1};
static const tk_steps ZERO_Q = {"zero-q", 2, zero_q, zero_kv, 0, 0, 0};
static const tk_steps ZERO_Q_PAD = {"zero-q-pad", 2, zero_q, zero_kv, 4, 0, 1};
static const tk_steps NO_REQUESTS = {"no-requests", 0, NULL, NULL, 0, 0, 0};
static const tk_steps NO_REQUESTS_PAD = {"no-requests-pad", 0, NULL, NULL, 2, 0, 0};
static const tk_steps LONG32 = {"long", 2, long_q, long_kv, 1, 1, 1};
static const tk_steps M3_DECODE = {"decode", 2, m3dec_q, m3dec_kv, 0, 1, 1};
static const tk_steps M3_VERIFY = {"verify", 2, m3ver_q, m3ver_kv, 2, 0, 1};
static const tk_steps M3_VERIFY16 = {"verify-16", 2, m3ver16_q, m3ver16_kv, 1, 0, 1};
static const tk_steps M3_EXTEND = {"extend", 1, m3ext_q, m3ext_kv, 0, 0, 1};
static const tk_steps M3_SMALL = {"decode-short", 2, m3small_q, m3small_kv, 1, 1, 1};
static const tk_steps LONG16 = {"long", 3, long16_q, long16_kv, 2, 1, 1};
static const tk_steps M3_LONG = {"decode-33k", 1, m3long_q, m3long_kv, 0, 0, 1};
static const tk_steps ONE = {"one", 1, one_q, one_kv, 1, 0, 1};

/* Activation / main plane / index plane dtypes. */
typedef struct tk_dtypes {
    msa_dtype act, kv, index;
} tk_dtypes;

static const tk_dtypes DTYPES[] = {
    {MSA_DTYPE_FP32, MSA_DTYPE_FP32, MSA_DTYPE_FP32},
    {MSA_DTYPE_BF16, MSA_DTYPE_BF16, MSA_DTYPE_BF16},
    {MSA_DTYPE_FP16, MSA_DTYPE_FP16, MSA_DTYPE_FP16},
    {MSA_DTYPE_FP32, MSA_DTYPE_BF16, MSA_DTYPE_BF16}, /* mixed: narrow cache */
    {MSA_DTYPE_BF16, MSA_DTYPE_FP32, MSA_DTYPE_BF16}, /* mixed: wide main planes */
    {MSA_DTYPE_FP16, MSA_DTYPE_BF16, MSA_DTYPE_FP16}, /* mixed: fp16 act, bf16 K/V */
};
#define N_DTYPES ((int)(sizeof DTYPES / sizeof DTYPES[0]))

static const int PAGE_SIZES[] = {16, 1, 128, 256, 32, 64};
#define N_PAGE_SIZES ((int)(sizeof PAGE_SIZES / sizeof PAGE_SIZES[0]))

static msa_case *add(tk_list *l, int quick, const tk_shape *sh, const tk_steps *st, tk_dtypes dt,
                     int page_size, int score_lse, int index_value)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->e = realloc(l->e, sizeof(tk_entry) * (size_t)l->cap);
        if (!l->e) {
            fprintf(stderr, "testkit: out of memory\n");
            abort();
        }
    }
    tk_entry *e = &l->e[l->n++];
    memset(e, 0, sizeof *e);
    e->shape = sh->name;
    e->step[0] = st->name;
    e->n = 1;
    e->quick = quick;
    msa_case *c = &e->c[0];
    c->Hq = sh->Hq;
    c->Hkv = sh->Hkv;
    c->D = sh->D;
    c->Hi = sh->Hi;
    c->Di = sh->Di;
    c->block = sh->block;
    c->topk = sh->topk;
    c->init_blocks = sh->init_blocks;
    c->local_blocks = sh->local_blocks;
    c->score_lse = score_lse;
    c->sparse = 1;
    c->index_value = index_value;
    c->page_size = page_size;
    c->act_dtype = dt.act;
    c->kv_dtype = dt.kv;
    c->index_dtype = dt.index;
    c->num_requests = st->num_requests;
    c->q_len = st->q_len;
    c->kv_len = st->kv_len;
    c->padding_rows = st->padding_rows;
    c->share_prefix = st->share_prefix;
    c->shuffle_pages = st->shuffle_pages;
    c->write_cache = 1;
    c->seed = 0x6d7361ull * 1000003ull + (uint64_t)l->n * 7919ull;
    return c;
}

static void set_steps(msa_case *c, const tk_steps *st)
{
    c->num_requests = st->num_requests;
    c->q_len = st->q_len;
    c->kv_len = st->kv_len;
    c->padding_rows = st->padding_rows;
    c->share_prefix = st->share_prefix;
    c->shuffle_pages = st->shuffle_pages;
}

/* Appends a step to the last entry: same setup, new step and seed. */
static void then(tk_list *l, const tk_steps *st)
{
    tk_entry *e = &l->e[l->n - 1];
    if (e->n == TK_MAX_SEQ)
        abort();
    e->c[e->n] = e->c[e->n - 1];
    e->c[e->n].seed += 104729ull;
    set_steps(&e->c[e->n], st);
    e->step[e->n++] = st->name;
}

static void name_entry(tk_entry *e)
{
    const msa_case *c = &e->c[0];
    char tags[96] = "", step[96] = "";
    size_t n = 0, m = 0;
    for (int i = 0; i < e->n; i++)
        m += (size_t)snprintf(step + m, sizeof step - m, "%s%s", i ? ">" : "", e->step[i]);
#define TAG(cond, text)                                                    \
    do {                                                                   \
        if (cond)                                                          \
            n += (size_t)snprintf(tags + n, sizeof tags - n, "/%s", text); \
    } while (0)
    TAG(!c->write_cache, "prewritten");
    TAG(c->fixed_limits, "fixed");
    TAG(c->omit_optional, "no-lse-topk");
    TAG(c->tie_blocks, "ties");
    TAG(c->nan_blocks, "nan");
    TAG(c->garbage_nan, "nan-garbage");
    TAG(c->scale > 0 || c->index_scale > 0, "scales");
    TAG(c->engine_layout, msa_case_layout_name(c->engine_layout));
#undef TAG
    snprintf(e->name, sizeof e->name, "%s/%s/%s%s/%s-%s-%s/p%d%s", e->shape, step,
             c->sparse ? (c->score_lse ? "lse" : "max") : "dense",
             c->sparse && c->index_value ? "+iv" : "", msa_dtype_name(c->act_dtype),
             msa_dtype_name(c->kv_dtype), msa_dtype_name(c->index_dtype), c->page_size, tags);
}

/* Sparse small-shape matrix: every step kind in every dtype combination. */
static void add_core(tk_list *l)
{
    const tk_steps *steps[] = {&DECODE, &VERIFY, &PREFILL, &EXTEND, &MIXED, &FEW};
    for (int d = 0; d < N_DTYPES; d++)
        for (int s = 0; s < 6; s++) {
            int k = d * 6 + s;
            int quick = d < 3 && (s == 0 || s == 1 || s == 4) && (k % 2 == 0 || d == 0);
            add(l, quick, &SMALL, steps[s], DTYPES[d], PAGE_SIZES[k % N_PAGE_SIZES], (d + s) % 2,
                (k / 2) % 2);
        }
}

/* Every head mapping and odd shape, both score types. */
static void add_mappings(tk_list *l)
{
    const tk_shape *shapes[] = {&UNION2, &UNION4, &SPLIT, &MHA, &ODD, &B32};
    const tk_steps *steps[] = {&DECODE, &VERIFY, &EXTEND, &MIXED};
    int k = 0;
    for (int h = 0; h < 6; h++)
        for (int s = 0; s < 4; s++)
            for (int lse = 0; lse < 2; lse++, k++)
                add(l, s == 1 && lse == h % 2, shapes[h], steps[s], DTYPES[k % N_DTYPES],
                    PAGE_SIZES[(k / 2) % N_PAGE_SIZES], lse, (k / 3) % 2);
    /* 64+ blocks of 32 tokens. */
    add(l, 0, &B32, &LONG32, DTYPES[1], 32, 0, 1);
    add(l, 0, &SPLIT, &LONG32, DTYPES[0], 64, 1, 0);
}

static void add_dense(tk_list *l)
{
    const tk_steps *steps[] = {&DECODE, &VERIFY, &PREFILL, &EXTEND, &MIXED, &FEW};
    for (int s = 0; s < 6; s++) {
        msa_case *c = add(l, s == 0 || s == 4, &SMALL, steps[s], DTYPES[s % N_DTYPES],
                          PAGE_SIZES[s % N_PAGE_SIZES], 0, 0);
        c->sparse = 0;
    }
    for (int s = 0; s < 2; s++) {
        msa_case *c = add(l, 0, &ODD, s ? &EXTEND : &VERIFY, DTYPES[s ? 2 : 3], 16, 0, 0);
        c->sparse = 0;
    }
}

/* Page sizes 1..256 on one step with shared, shuffled pages. */
static void add_pages(tk_list *l)
{
    static const int sizes[] = {1, 2, 16, 128, 256};
    for (int i = 0; i < 5; i++) {
        add(l, i == 0 || i == 4, &SMALL, &EXTEND, DTYPES[1], sizes[i], i % 2, 1);
        add(l, 0, &SMALL, &MIXED, DTYPES[0], sizes[i], (i + 1) % 2, 0);
    }
}

/* Empty steps, padding, pre-written cache, limits, optional outputs, scales,
 * ties and NaN scores. */
static void add_special(tk_list *l)
{
    msa_case *c;
    add(l, 1, &SMALL, &ZERO_Q, DTYPES[1], 16, 0, 1);
    add(l, 1, &SMALL, &ZERO_Q_PAD, DTYPES[0], 16, 0, 1);
    add(l, 1, &SMALL, &NO_REQUESTS, DTYPES[1], 16, 0, 0);
    add(l, 1, &SMALL, &NO_REQUESTS_PAD, DTYPES[2], 16, 1, 1);
    c = add(l, 1, &SMALL, &ZERO_Q_PAD, DTYPES[0], 16, 0, 0);
    c->sparse = 0;

    c = add(l, 1, &SMALL, &DECODE, DTYPES[1], 16, 0, 1);
    c->write_cache = 0;
    c = add(l, 0, &UNION2, &EXTEND, DTYPES[0], 128, 1, 1);
    c->write_cache = 0;
    c = add(l, 0, &SMALL, &VERIFY, DTYPES[2], 16, 0, 0);
    c->write_cache = 0;
    c->sparse = 0;

    c = add(l, 1, &SMALL, &MIXED, DTYPES[0], 16, 1, 1);
    c->fixed_limits = 1;
    c = add(l, 0, &SPLIT, &VERIFY, DTYPES[1], 32, 0, 1);
    c->fixed_limits = 1;

    c = add(l, 1, &SMALL, &VERIFY, DTYPES[1], 16, 0, 1);
    c->omit_optional = 1;
    c = add(l, 0, &SMALL, &EXTEND, DTYPES[0], 16, 0, 0);
    c->omit_optional = 1;
    c->sparse = 0;

    c = add(l, 1, &SMALL, &EXTEND, DTYPES[0], 16, 1, 1);
    c->scale = 0.05f;
    c->index_scale = 0.4f;
    c = add(l, 0, &UNION2, &VERIFY, DTYPES[1], 16, 1, 1);
    c->scale = 0.3f;
    c->index_scale = 0.02f;
    c = add(l, 0, &SMALL, &MIXED, DTYPES[2], 16, 0, 0);
    c->sparse = 0;
    c->scale = 0.25f;

    for (int lse = 0; lse < 2; lse++) {
        c = add(l, lse == 0, &SMALL, &DECODE, DTYPES[lse ? 1 : 0], 16, lse, 0);
        c->tie_blocks = 9;
        c = add(l, 0, &UNION2, &VERIFY, DTYPES[lse ? 0 : 2], 32, lse, 1);
        c->tie_blocks = 8;
        c = add(l, lse == 1, &SMALL, &VERIFY, DTYPES[lse ? 0 : 1], 16, lse, 0);
        c->nan_blocks = 6;
    }
}

/* The fallback reasons of layers whose quantized index keys run on a
 * tensor-core indexer, the Hopper one or the mma.sync one
 * (msa_case.expect_cuda; the long cases of test_cuda_sweep check which
 * one on their device). */
#define EXPECT_FP8_INDEXER "fp8_e4m3 index planes: codes widened by the"
#define EXPECT_NVFP4_INDEXER "nvfp4 index planes: codes widened by the"
/* ... and of layers whose fp8 K/V run on a tensor-core decode attention. */
#define EXPECT_FP8_ATTENTION "fp8_e4m3 K/V planes: codes widened by the"
/* ... and of layers whose nvfp4 K/V run on the mma.sync one (pages other
 * than 128, dense layers). */
#define EXPECT_NVFP4_MMA_ATTENTION \
    "nvfp4 K/V planes: codes widened by the mma.sync decode attention"

/* Quantized planes (skipped where the backend does not support them):
 * every plane choice (main fp8 / nvfp4, index fp8 / nvfp4, both) against
 * the oracle on the de-quantized cache, with the cache rows checked
 * against the test kit's own encoder. */
static void add_quantized(tk_list *l)
{
    static const tk_dtypes q[] = {
        {MSA_DTYPE_BF16, MSA_DTYPE_FP8_E4M3, MSA_DTYPE_BF16},
        {MSA_DTYPE_BF16, MSA_DTYPE_BF16, MSA_DTYPE_FP8_E4M3},
        {MSA_DTYPE_FP32, MSA_DTYPE_NVFP4, MSA_DTYPE_FP32},
        {MSA_DTYPE_BF16, MSA_DTYPE_BF16, MSA_DTYPE_NVFP4},
        {MSA_DTYPE_FP16, MSA_DTYPE_FP8_E4M3, MSA_DTYPE_NVFP4},
    };
    for (int i = 0; i < 5; i++) {
        msa_case *c = add(l, i < 2, &SMALL, i % 2 ? &VERIFY : &DECODE, q[i], 16, i % 2, 1);
        c->k_scale = 0.05f;
        c->v_scale = 0.5f;
        c->index_k_scale = i == 4 ? 0.1f : 2.0f;
        c->index_v_scale = 0.25f;
        c = add(l, 0, &SMALL, &EXTEND, q[i], 128, (i + 1) % 2, 0); /* default scales */
    }
    msa_case *c = add(l, 0, &SMALL, &MIXED, q[0], 16, 0, 0);
    c->sparse = 0;
    c = add(l, 0, &M3, &M3_DECODE, q[4], 128, 0, 0);
    c->expect_cuda = EXPECT_NVFP4_INDEXER;

    static const tk_dtypes nv_bf16 = {MSA_DTYPE_BF16, MSA_DTYPE_NVFP4, MSA_DTYPE_BF16};
    static const tk_dtypes nv_fp8 = {MSA_DTYPE_BF16, MSA_DTYPE_NVFP4, MSA_DTYPE_FP8_E4M3};
    static const tk_dtypes fp8_fp8 = {MSA_DTYPE_BF16, MSA_DTYPE_FP8_E4M3, MSA_DTYPE_FP8_E4M3};
    static const tk_dtypes nv_nv = {MSA_DTYPE_FP16, MSA_DTYPE_NVFP4, MSA_DTYPE_NVFP4};
    /* Mixed rows and padding; unions of index heads; KV heads sharing an
     * index head; one-token pages. */
    c = add(l, 1, &SMALL, &MIXED, nv_bf16, 16, 0, 1);
    c->k_scale = 0.02f;
    c->v_scale = 3.0f;
    c = add(l, 1, &UNION2, &VERIFY, nv_fp8, 32, 1, 1);
    c->index_k_scale = 0.03f;
    c->index_v_scale = 0.01f;
    add(l, 0, &SPLIT, &EXTEND, fp8_fp8, 1, 0, 1);
    add(l, 0, &UNION4, &MIXED, nv_nv, 8, 1, 1);
    c = add(l, 0, &SMALL, &MIXED, nv_nv, 32, 0, 0);
    c->sparse = 0;
    /* fp8 rows that are not whole 16-byte pieces (D 40, Di 24: row
     * starts off the 16-byte grid, a short last piece of each row) with
     * padding rows beside them. */
    add(l, 0, &ODD, &MIXED, fp8_fp8, 16, 0, 1);
    /* Entries cached before the step (write_cache = 0). */
    c = add(l, 1, &SMALL, &DECODE, q[4], 16, 0, 1);
    c->write_cache = 0;
    /* NaN index keys (fp8 NaN code; nvfp4 NaN group) rank below every
     * block; exact copies of a block still tie after quantization. */
    c = add(l, 1, &SMALL, &VERIFY, nv_nv, 16, 0, 0);
    c->nan_blocks = 6;
    c = add(l, 0, &SMALL, &VERIFY, fp8_fp8, 16, 1, 0);
    c->nan_blocks = 6;
    c = add(l, 0, &SMALL, &DECODE, fp8_fp8, 16, 0, 0);
    c->tie_blocks = 9;
    /* fp8 K/V with bf16 queries on the bf16 dot-product kernels (codes
     * widened to bf16, scales on the sums): the real layer's group of 16
     * (four tokens' scores per pass) and a group of 320 heads. */
    c = add(l, 0, &M3, &M3_DECODE, fp8_fp8, 128, 0, 1);
    c->k_scale = 0.004f;
    c->v_scale = 0.02f;
    c->expect_cuda = EXPECT_FP8_INDEXER;
    c = add(l, 1, &HUGEG, &VERIFY, fp8_fp8, 16, 1, 0);
    c->k_scale = 0.3f;
    c->v_scale = 7.0f;
    c = add(l, 0, &UNION2, &VERIFY, nv_nv, 32, 1, 1);
    c->tie_blocks = 8;
    /* One plan over several steps. */
    add(l, 1, &SMALL, &PREFILL, nv_fp8, 16, 0, 1);
    then(l, &DECODE);
    then(l, &VERIFY);
    c = add(l, 0, &M3, &M3_VERIFY, nv_fp8, 128, 0, 1);
    c->expect_cuda = EXPECT_FP8_INDEXER;
    /* nvfp4 K/V on the mma.sync decode attention: a sparse layer over
     * pages of 64 rows with NaN garbage past kv_len (codes and group
     * scales), and a dense layer over pages of 128 with fp16 queries. */
    c = add(l, 0, &M3, &M3_VERIFY, nv_bf16, 64, 1, 1);
    c->garbage_nan = 1;
    c->k_scale = 0.05f;
    c->v_scale = 2.0f;
    c->expect_cuda = EXPECT_NVFP4_MMA_ATTENTION;
    c = add(l, 0, &M3, &M3_DECODE, nv_nv, 128, 0, 0);
    c->sparse = 0;
    c->expect_cuda = EXPECT_NVFP4_MMA_ATTENTION;

    /* fp8 index keys with 16-bit queries on the mma.sync indexer (codes
     * widened in its fragment loads, the index-K scale on the scores):
     * both 16-bit types, both score types with scales, pages of 16 to
     * 128, 16 to 64 query columns, NaN codes in cached blocks, NaN codes
     * past kv_len (never read), exact ties. */
    static const tk_dtypes f16_f16_fp8 = {MSA_DTYPE_FP16, MSA_DTYPE_FP16, MSA_DTYPE_FP8_E4M3};
    static const tk_dtypes bf16_bf16_fp8 = {MSA_DTYPE_BF16, MSA_DTYPE_BF16, MSA_DTYPE_FP8_E4M3};
    c = add(l, 0, &M3, &M3_VERIFY, f16_f16_fp8, 64, 1, 0);
    c->index_k_scale = 0.03f;
    c->index_scale = 0.4f;
    c->expect_cuda = EXPECT_FP8_INDEXER;
    c = add(l, 1, &M3, &M3_DECODE, bf16_bf16_fp8, 16, 0, 0);
    c->nan_blocks = 6;
    c->garbage_nan = 1;
    c->index_k_scale = 3.0f;
    c->expect_cuda = EXPECT_FP8_INDEXER;
    c = add(l, 0, &M3, &M3_VERIFY16, bf16_bf16_fp8, 128, 1, 1);
    c->garbage_nan = 1;
    c->expect_cuda = EXPECT_FP8_INDEXER;
    c = add(l, 0, &M3, &M3_VERIFY, fp8_fp8, 128, 1, 0);
    c->tie_blocks = 9;
    c->expect_cuda = EXPECT_FP8_INDEXER;

    /* fp8 K/V on the tensor-core decode attention (each tile's codes
     * widened once into 16-bit tiles): NaN garbage in the K and V rows
     * past kv_len of each request's last page (and everywhere else a
     * step must not read), which the zero-filled rows of the tile keep
     * out of the products; both 16-bit types, both score types. */
    static const tk_dtypes bf16_fp8_bf16 = {MSA_DTYPE_BF16, MSA_DTYPE_FP8_E4M3, MSA_DTYPE_BF16};
    static const tk_dtypes f16_fp8_f16 = {MSA_DTYPE_FP16, MSA_DTYPE_FP8_E4M3, MSA_DTYPE_FP16};
    c = add(l, 1, &M3, &M3_VERIFY, bf16_fp8_bf16, 128, 0, 1);
    c->garbage_nan = 2;
    c->k_scale = 0.02f;
    c->v_scale = 0.5f;
    c->expect_cuda = EXPECT_FP8_ATTENTION;
    c = add(l, 0, &M3, &M3_DECODE, f16_fp8_f16, 64, 1, 0);
    c->garbage_nan = 2;
    c->v_scale = 3.0f;
    c->expect_cuda = EXPECT_FP8_ATTENTION;
    /* nvfp4 K/V in the real layer (the Hopper decode attention where it
     * runs, else the SIMT one): NaN garbage past kv_len in codes and group
     * scales, which the zeroed tail rows keep out. */
    static const tk_dtypes bf16_nv_bf16 = {MSA_DTYPE_BF16, MSA_DTYPE_NVFP4, MSA_DTYPE_BF16};
    c = add(l, 1, &M3, &M3_VERIFY, bf16_nv_bf16, 128, 0, 1);
    c->garbage_nan = 2;
    c->k_scale = 0.1f;
    c->v_scale = 4.0f;

    /* nvfp4 index keys the same way (E2M1 codes times their group scales
     * widened, the layer scale on the scores): NaN groups in cached
     * blocks and past kv_len, ties, both 16-bit types and score types;
     * pages of one row stay on the SIMT indexer. */
    static const tk_dtypes bf16_bf16_nv = {MSA_DTYPE_BF16, MSA_DTYPE_BF16, MSA_DTYPE_NVFP4};
    static const tk_dtypes f16_fp8_nv = {MSA_DTYPE_FP16, MSA_DTYPE_FP8_E4M3, MSA_DTYPE_NVFP4};
    c = add(l, 1, &M3, &M3_DECODE, bf16_bf16_nv, 16, 0, 0);
    c->nan_blocks = 6;
    c->garbage_nan = 1;
    c->index_k_scale = 0.07f;
    c->expect_cuda = EXPECT_NVFP4_INDEXER;
    c = add(l, 0, &M3, &M3_VERIFY16, f16_fp8_nv, 64, 1, 1);
    c->garbage_nan = 1;
    c->index_k_scale = 5.0f;
    c->index_scale = 0.2f;
    c->expect_cuda = EXPECT_NVFP4_INDEXER;
    c = add(l, 0, &M3, &M3_VERIFY, bf16_bf16_nv, 128, 1, 0);
    c->tie_blocks = 9;
    c->expect_cuda = EXPECT_NVFP4_INDEXER;
    c = add(l, 0, &M3, &M3_SMALL, bf16_bf16_nv, 1, 0, 0);
    c->expect_cuda = "nvfp4 index planes: SIMT indexer";
}

/* The real M3 layer shape. */
static void add_m3(tk_list *l)
{
    msa_case *c;
    add(l, 1, &M3, &M3_SMALL, DTYPES[1], 128, 0, 0);
    add(l, 0, &M3, &M3_DECODE, DTYPES[1], 128, 0, 0);
    add(l, 0, &M3, &M3_DECODE, DTYPES[0], 64, 1, 1);
    add(l, 0, &M3, &M3_VERIFY, DTYPES[1], 128, 0, 0);
    add(l, 0, &M3, &M3_VERIFY, DTYPES[2], 256, 1, 0);
    add(l, 0, &M3, &M3_EXTEND, DTYPES[1], 128, 0, 1);
    add(l, 0, &M3, &M3_LONG, DTYPES[1], 128, 0, 0);
    c = add(l, 0, &M3, &M3_VERIFY, DTYPES[3], 128, 0, 0);
    c->sparse = 0;
}

/* Head dims, block sizes and K away from the common values. */
static void add_odd_geometry(tk_list *l)
{
    msa_case *c;
    add(l, 1, &MID, &VERIFY, DTYPES[1], 64, 0, 1);
    add(l, 0, &MID, &EXTEND, DTYPES[0], 16, 1, 0);
    add(l, 1, &WIDE, &VERIFY, DTYPES[2], 32, 1, 1);
    /* A GQA group wider than one work item's rows: items of one token, split
     * over the keys when there are few of them. */
    add(l, 1, &HUGEG, &ONE, DTYPES[0], 16, 0, 0);
    add(l, 0, &HUGEG, &DECODE, DTYPES[1], 16, 0, 1);
    add(l, 0, &WIDE, &MIXED, DTYPES[3], 128, 0, 0);
    add(l, 1, &BIGK, &LONG16, DTYPES[0], 16, 0, 1);
    add(l, 0, &BIGK, &LONG16, DTYPES[1], 64, 1, 0);
    add(l, 1, &B24, &EXTEND, DTYPES[1], 16, 0, 1);
    add(l, 0, &B24, &MIXED, DTYPES[0], 32, 1, 0);
    add(l, 0, &B24, &DECODE, DTYPES[2], 8, 0, 0);
    add(l, 1, &TIGHT, &MIXED, DTYPES[0], 16, 0, 0);
    add(l, 0, &TIGHT, &VERIFY, DTYPES[1], 4, 1, 1);
    add(l, 1, &B1, &ONE, DTYPES[0], 1, 0, 1);
    add(l, 0, &B1, &VERIFY, DTYPES[1], 2, 1, 0);
    c = add(l, 0, &B24, &EXTEND, DTYPES[1], 16, 0, 0);
    c->sparse = 0;
}

/* Scales that overflow exp() in fp32 unless the softmax and the lse block
 * score subtract their maxima; and tiny scales. */
static void add_extreme_scales(tk_list *l)
{
    msa_case *c = add(l, 1, &SMALL, &VERIFY, DTYPES[0], 16, 1, 1);
    c->scale = 8.0f;
    c->index_scale = 20.0f;
    c = add(l, 0, &UNION2, &EXTEND, DTYPES[1], 16, 1, 1);
    c->scale = 6.0f;
    c->index_scale = 12.0f;
    c = add(l, 0, &SMALL, &MIXED, DTYPES[0], 16, 0, 0);
    c->sparse = 0;
    c->scale = 10.0f;
    /* Max scoring here: with a tiny c every lse block score is ~ln(B). */
    c = add(l, 0, &SMALL, &DECODE, DTYPES[0], 16, 0, 1);
    c->scale = 1e-3f;
    c->index_scale = 1e-3f;
}

/* Seeded random cases: any small shape, random request mixes (decode,
 * verify, extend, fresh prefill, empty), dtypes, page sizes and flags. */
static void add_random(tk_list *l, int count)
{
    static const tk_shape *const shapes[] = {&SMALL, &UNION2, &UNION4, &SPLIT, &MHA, &ODD,
                                             &B32,   &MID,    &B24,    &TIGHT, &BIGK};
    static const tk_steps RANDOM = {"random", 0, NULL, NULL, 0, 0, 0};
    tk_rng rng = {0x72616e646f6dull};
    for (int i = 0; i < count; i++) {
        const tk_shape *sh = shapes[tk_rng_below(&rng, (int)(sizeof shapes / sizeof shapes[0]))];
        int page = 1 << tk_rng_below(&rng, 9);
        msa_case *c = add(l, i % 12 == 0, sh, &RANDOM, DTYPES[tk_rng_below(&rng, N_DTYPES)], page,
                          tk_rng_below(&rng, 2), tk_rng_below(&rng, 2));
        tk_entry *e = &l->e[l->n - 1];
        e->own_lengths = 1;
        c->num_requests = 1 + tk_rng_below(&rng, 5);
        for (int r = 0; r < c->num_requests; r++) {
            int kind = tk_rng_below(&rng, 10), q, kv;
            if (kind < 4) { /* decode */
                q = 1;
                kv = 1 + tk_rng_below(&rng, 1500);
            } else if (kind < 7) { /* verify */
                q = 2 + tk_rng_below(&rng, 15);
                kv = q + tk_rng_below(&rng, 1200);
            } else if (kind < 8) { /* extend a cached prefix */
                q = 17 + tk_rng_below(&rng, 180);
                kv = q + tk_rng_below(&rng, 900);
            } else if (kind < 9) { /* fresh prefill */
                q = 1 + tk_rng_below(&rng, 300);
                kv = q;
            } else { /* nothing new this step */
                q = 0;
                kv = tk_rng_below(&rng, 300);
            }
            e->q_store[0][r] = q;
            e->kv_store[0][r] = kv;
        }
        c->padding_rows = tk_rng_below(&rng, 4) == 0 ? 1 + tk_rng_below(&rng, 3) : 0;
        c->share_prefix = tk_rng_below(&rng, 2);
        c->shuffle_pages = tk_rng_below(&rng, 4) != 0;
        c->write_cache = tk_rng_below(&rng, 10) != 0;
        c->fixed_limits = tk_rng_below(&rng, 3) == 0;
        c->omit_optional = tk_rng_below(&rng, 10) == 0;
        c->sparse = tk_rng_below(&rng, 6) != 0;
        c->seed ^= tk_rng_next(&rng);
    }
}

/* Several steps on one plan, as an engine runs them: the plan is updated
 * in place, requests come and go, capacities grow (or are fixed). */
static void add_sequences(tk_list *l)
{
    msa_case *c;
    add(l, 1, &SMALL, &PREFILL, DTYPES[1], 16, 0, 1);
    then(l, &DECODE);
    then(l, &VERIFY);
    then(l, &ZERO_Q_PAD);
    then(l, &MIXED);
    c = add(l, 1, &SMALL, &MIXED, DTYPES[0], 32, 1, 0);
    c->fixed_limits = 1;
    then(l, &DECODE);
    then(l, &NO_REQUESTS_PAD);
    then(l, &EXTEND);
    add(l, 0, &UNION2, &VERIFY, DTYPES[0], 16, 1, 1);
    then(l, &EXTEND);
    then(l, &DECODE);
    c = add(l, 0, &SMALL, &EXTEND, DTYPES[2], 128, 0, 0);
    c->sparse = 0;
    then(l, &DECODE);
    then(l, &PREFILL);
    add(l, 1, &SPLIT, &DECODE, DTYPES[1], 16, 0, 0); /* decode-only sequence */
    then(l, &VERIFY);
    then(l, &DECODE);
    c = add(l, 0, &M3, &M3_DECODE, DTYPES[1], 128, 0, 0);
    c->fixed_limits = 1;
    then(l, &M3_VERIFY);
    then(l, &M3_SMALL);
}

/* ---- prefill rows at head dim 128 (the tensor-core prefill kernel) ---- */
/* 4 query heads per KV head: 32-token tiles, index-value pass of 2 heads. */
static const tk_shape PF128 = {"pf128", 8, 2, 128, 2, 128, 64, 8, 1, 1};
/* M3's block, K and group of 16 with one KV head: 8-token tiles. */
static const tk_shape PFM3 = {"pfm3", 16, 1, 128, 1, 128, 128, 16, 0, 1};
/* 3 heads per KV head: a warp's rows span tokens; blocks of 32. */
static const tk_shape PFODD = {"pfodd", 6, 2, 128, 2, 128, 32, 6, 1, 2};
/* 160 heads per KV head: a token's heads take two chunks of the tile. */
static const tk_shape PFWIDEG = {"pfwideg", 160, 1, 128, 1, 128, 64, 4, 0, 1};
/* Few heads: long dense prompts stay affordable for the oracle. */
static const tk_shape PFD = {"pfd", 4, 1, 128, 1, 128, 64, 8, 1, 1};

static const int pfq_q[] = {200, 1, 40, 0}, pfq_kv[] = {1200, 300, 40, 90};
static const int pfmix_q[] = {700, 33, 1, 300, 17, 5}, pfmix_kv[] = {700, 2033, 500, 4300, 17, 900};
static const int pf2k_q[] = {2048}, pf2k_kv[] = {2048};
static const int pf8k_q[] = {8192}, pf8k_kv[] = {8192};
static const int pfext_q[] = {3000}, pfext_kv[] = {11000};
static const int pf20k_q[] = {1500, 2}, pf20k_kv[] = {20480, 7000};
static const int pf32k_q[] = {1024}, pf32k_kv[] = {32768};
static const int pfsmall_q[] = {40}, pfsmall_kv[] = {300};

static const tk_steps PF_QUICK = {"prefill-mix", 4, pfq_q, pfq_kv, 2, 1, 1};
static const tk_steps PF_MIX = {"prefill-several", 6, pfmix_q, pfmix_kv, 3, 1, 1};
static const tk_steps PF_2K = {"prefill-2k", 1, pf2k_q, pf2k_kv, 0, 0, 1};
static const tk_steps PF_8K = {"prefill-8k", 1, pf8k_q, pf8k_kv, 0, 0, 1};
static const tk_steps PF_EXT = {"extend-3k-11k", 1, pfext_q, pfext_kv, 0, 0, 1};
static const tk_steps PF_20K = {"extend-20k", 2, pf20k_q, pf20k_kv, 1, 0, 1};
static const tk_steps PF_32K = {"extend-32k", 1, pf32k_q, pf32k_kv, 0, 0, 1};
static const tk_steps PF_SMALL = {"prefill-small", 1, pfsmall_q, pfsmall_kv, 0, 0, 1};

/* Prefill and extend steps whose main and index-value passes take the
 * tensor-core prefill kernel (16-bit types, head dim 128): several
 * requests with prefixes beside decode rows, page sizes other than 128,
 * contexts to 32K, every tile shape (8 and 32 tokens, rows spanning
 * tokens, head chunks); fp32 and mixed types check the scalar fallback. */
static void add_prefill(tk_list *l)
{
    msa_case *c;
    add(l, 1, &PF128, &PF_QUICK, DTYPES[1], 16, 0, 1);
    add(l, 1, &PFM3, &PF_QUICK, DTYPES[2], 128, 1, 0);
    add(l, 1, &PFODD, &PF_MIX, DTYPES[1], 8, 1, 1);
    c = add(l, 1, &PF128, &PF_MIX, DTYPES[2], 64, 0, 0);
    c->sparse = 0;
    add(l, 1, &PFWIDEG, &PF_SMALL, DTYPES[1], 32, 0, 1);
    add(l, 1, &PF128, &PF_QUICK, DTYPES[0], 16, 0, 1);  /* fp32: scalar rows */
    add(l, 0, &PF128, &PF_QUICK, DTYPES[5], 256, 1, 1); /* fp16 act, bf16 K/V: scalar */
    add(l, 0, &PFM3, &PF_2K, DTYPES[1], 128, 0, 1);
    add(l, 0, &PFM3, &PF_EXT, DTYPES[2], 64, 1, 0);
    add(l, 0, &PFM3, &PF_20K, DTYPES[1], 256, 0, 1);
    add(l, 0, &PFM3, &PF_32K, DTYPES[1], 128, 1, 0);
    add(l, 0, &PF128, &PF_8K, DTYPES[1], 1, 0, 1);
    c = add(l, 0, &PFD, &PF_8K, DTYPES[1], 128, 0, 0);
    c->sparse = 0;
    c = add(l, 0, &PFD, &PF_EXT, DTYPES[2], 32, 0, 0);
    c->sparse = 0;
    add(l, 0, &M3, &PF_SMALL, DTYPES[1], 128, 0, 1);
    /* A plan that serves a prefill step, then decode, then prefill again. */
    add(l, 1, &PFM3, &PF_QUICK, DTYPES[1], 128, 0, 1);
    then(l, &M3_SMALL);
    then(l, &PF_MIX);
    /* Dense layers of 16 heads per KV head at page 128 (on Hopper, the
     * prefill kernel's dense stream over whole pages): several requests
     * with prefixes and ragged last pages, and a 2K prompt. */
    c = add(l, 1, &PFM3, &PF_MIX, DTYPES[1], 128, 0, 0);
    c->sparse = 0;
    c = add(l, 0, &PFM3, &PF_2K, DTYPES[2], 128, 0, 0);
    c->sparse = 0;
}

/* The fallback reason of layers whose prefill kernels read 16-bit copies
 * of quantized planes (CUDA, head dim and index dim 128). */
#define EXPECT_PREFILL_COPIES "prefill rows read 16-bit copies of the pages"

/* Prefill and extend rows over quantized planes.  At dims of 128 the CUDA
 * backend's prefill kernels read 16-bit copies of the step's pages (codes
 * widened, the plane scales on the scores and rows): the key-block-major
 * attention and the tensor-map indexer at pages of 128, the mma.sync
 * kernels at other pages, the dense stream, the index-value pass, with
 * scales and NaN garbage past kv_len; the odd shape keeps the
 * de-quantizing rows. */
static void add_quantized_prefill(tk_list *l)
{
    static const tk_dtypes fp8_nv = {MSA_DTYPE_BF16, MSA_DTYPE_FP8_E4M3, MSA_DTYPE_NVFP4};
    static const tk_dtypes nv_nv = {MSA_DTYPE_BF16, MSA_DTYPE_NVFP4, MSA_DTYPE_NVFP4};
    static const tk_dtypes nv_fp8 = {MSA_DTYPE_FP16, MSA_DTYPE_NVFP4, MSA_DTYPE_FP8_E4M3};
    static const tk_dtypes fp8_fp8 = {MSA_DTYPE_BF16, MSA_DTYPE_FP8_E4M3, MSA_DTYPE_FP8_E4M3};
    static const tk_dtypes f16_fp8_nv = {MSA_DTYPE_FP16, MSA_DTYPE_FP8_E4M3, MSA_DTYPE_NVFP4};
    msa_case *c = add(l, 1, &PF128, &PF_QUICK, fp8_nv, 16, 0, 1);
    c->k_scale = 0.1f;
    c->index_k_scale = 0.5f;
    c->expect_cuda = EXPECT_PREFILL_COPIES;
    c = add(l, 0, &PFM3, &PF_QUICK, nv_nv, 128, 1, 0);
    c->expect_cuda = EXPECT_PREFILL_COPIES;
    add(l, 0, &PFODD, &PF_MIX, nv_fp8, 8, 1, 1);
    c = add(l, 0, &PF128, &PF_MIX, nv_nv, 64, 0, 0);
    c->sparse = 0;
    c->expect_cuda = EXPECT_PREFILL_COPIES;
    /* The real layer: prefixes, decode rows beside, scales on every plane,
     * NaN codes in the K, V and index-K rows past kv_len. */
    c = add(l, 1, &M3, &PF_QUICK, fp8_fp8, 128, 0, 0);
    c->k_scale = 0.03f;
    c->v_scale = 4.0f;
    c->index_k_scale = 0.25f;
    c->garbage_nan = 2;
    c->expect_cuda = EXPECT_PREFILL_COPIES;
    c = add(l, 0, &PFM3, &PF_EXT, nv_nv, 128, 1, 1);
    c->k_scale = 2.0f;
    c->v_scale = 0.05f;
    c->index_k_scale = 0.5f;
    c->index_v_scale = 8.0f;
    c->garbage_nan = 2;
    c->expect_cuda = EXPECT_PREFILL_COPIES;
    c = add(l, 1, &PF128, &PF_MIX, f16_fp8_nv, 16, 1, 1);
    c->v_scale = 0.3f;
    c->index_v_scale = 0.2f;
    c->garbage_nan = 2;
    c->expect_cuda = EXPECT_PREFILL_COPIES;
    /* Dense layers: every causal key of the copy. */
    c = add(l, 0, &PFM3, &PF_MIX, fp8_fp8, 128, 0, 0);
    c->sparse = 0;
    c->k_scale = 0.2f;
    c->v_scale = 0.7f;
    c->garbage_nan = 2;
    c->expect_cuda = EXPECT_PREFILL_COPIES;
}

/* ---- prefill rows on the CPU's blocked kernels -------------------------- */
/* Blocks of 256 keys: two key tiles per block, so a token can sit before
 * the second tile of a block it uses. */
static const tk_shape CPF256 = {"cpf256", 8, 2, 32, 2, 32, 256, 4, 0, 1};
static const tk_shape CPFUNION = {"cpfunion", 8, 2, 32, 4, 32, 16, 6, 0, 1};   /* Hi = 2 Hkv */
static const tk_shape CPFUNION4 = {"cpfunion4", 4, 1, 32, 4, 16, 16, 4, 1, 1}; /* Hi = 4 Hkv */
static const tk_shape CPFSPLIT = {"cpfsplit", 8, 4, 32, 2, 32, 32, 6, 1, 2};   /* Hkv = 2 Hi */
static const tk_shape CPFODD = {"cpfodd", 6, 3, 40, 3, 24, 16, 5, 0, 1};       /* unaligned dims */
static const tk_shape CPFODDD = {"cpfoddd", 4, 2, 37, 2, 21, 16, 4, 0, 1};     /* odd dims */
static const tk_shape CPFMHA = {"cpfmha", 4, 4, 16, 4, 16, 16, 5, 0, 3};       /* group of 1 */
static const tk_shape CPFHUGEG = {"cpfhugeg", 320, 1, 16, 1, 16, 16, 4, 0, 1}; /* > 256 rows */
static const tk_shape CPFB1 = {"cpfb1", 4, 2, 16, 2, 16, 1, 8, 1, 2};          /* 1-key blocks */
static const tk_shape CPFMID = {"cpfmid", 16, 2, 64, 2, 64, 64, 8, 1, 1};      /* group of 8 */
static const tk_shape CPFG16 = {"cpfg16", 32, 2, 32, 2, 32, 256, 4, 1, 1};     /* group of 16 */

static const int cpfmix_q[] = {300, 1, 40, 0, 90, 17}, cpfmix_kv[] = {300, 500, 1040, 60, 2000, 17};
static const int cpflong_q[] = {1500}, cpflong_kv[] = {1500};
static const int cpfext_q[] = {700, 5}, cpfext_kv[] = {3100, 900};
static const int cpfsmall_q[] = {40, 20}, cpfsmall_kv[] = {300, 20};
static const int cpfb1_q[] = {120, 3}, cpfb1_kv[] = {160, 50};

static const tk_steps CPF_MIX = {"cpu-prefill-several", 6, cpfmix_q, cpfmix_kv, 2, 1, 1};
static const tk_steps CPF_LONG = {"cpu-prefill-1500", 1, cpflong_q, cpflong_kv, 0, 0, 1};
static const tk_steps CPF_EXT = {"cpu-extend-3k", 2, cpfext_q, cpfext_kv, 1, 1, 1};
static const tk_steps CPF_SMALL = {"cpu-prefill-small", 2, cpfsmall_q, cpfsmall_kv, 0, 0, 1};
static const tk_steps CPF_B1 = {"cpu-prefill-b1", 2, cpfb1_q, cpfb1_kv, 1, 0, 1};

/* Prefill and extend steps at small head dims, so long prompts stay cheap
 * for the oracle: the CPU's blocked prefill kernels over many key tiles,
 * prefixes (chunked prefill), several requests beside decode rows, page
 * sizes from 2 to 256, GQA groups of 1 to 320, union and shared index head
 * mappings, blocks of 1 and 256 keys, unaligned head dims, both scores,
 * index values, dense layers and every activation format. */
static void add_cpu_prefill(tk_list *l)
{
    msa_case *c;
    add(l, 1, &CPFUNION, &CPF_MIX, DTYPES[1], 16, 1, 1);
    add(l, 1, &CPFUNION4, &CPF_EXT, DTYPES[0], 32, 0, 1);
    add(l, 1, &CPFSPLIT, &CPF_MIX, DTYPES[2], 64, 1, 1);
    add(l, 1, &CPFODD, &CPF_EXT, DTYPES[0], 8, 0, 1);
    add(l, 1, &CPF256, &CPF_EXT, DTYPES[1], 128, 1, 1);
    add(l, 1, &CPF256, &CPF_LONG, DTYPES[3], 256, 0, 0);
    add(l, 1, &CPFMHA, &CPF_LONG, DTYPES[4], 16, 1, 1);
    add(l, 1, &CPFHUGEG, &CPF_SMALL, DTYPES[0], 16, 0, 1);
    add(l, 1, &CPFB1, &CPF_B1, DTYPES[5], 2, 1, 1);
    add(l, 1, &CPFMID, &CPF_EXT, DTYPES[1], 64, 0, 0);
    c = add(l, 1, &CPFMID, &CPF_LONG, DTYPES[2], 256, 0, 0);
    c->sparse = 0;
    c = add(l, 1, &CPFODD, &CPF_MIX, DTYPES[0], 16, 0, 0);
    c->sparse = 0;
    /* bf16 throughout (the bf16 dot-product kernels where the CPU has
     * them): head dims that are not a multiple of the register block,
     * rows copied from small pages, 1-key blocks (odd key tiles) and a
     * group of 320 heads. */
    add(l, 1, &CPFODD, &CPF_MIX, DTYPES[1], 8, 1, 1);
    /* odd head dims: the bf16 pair kernels leave them to the fp32 ones */
    add(l, 1, &CPFODDD, &CPF_EXT, DTYPES[1], 16, 0, 1);
    add(l, 1, &CPFB1, &CPF_B1, DTYPES[1], 2, 0, 1);
    add(l, 1, &CPFHUGEG, &CPF_SMALL, DTYPES[1], 16, 0, 1);
    /* bf16 with query groups of 16 heads, whose prefill rows take the row
     * kernels on AVX512-BF16 (msa_cpu_attn_blocked): blocks of two key
     * tiles, prefixes, requests beside decode rows, a dense layer. */
    add(l, 1, &CPFG16, &CPF_EXT, DTYPES[1], 32, 1, 1);
    c = add(l, 1, &CPFG16, &CPF_MIX, DTYPES[1], 64, 0, 0);
    c->sparse = 0;
    /* A chunked prefill on one plan: the prompt, then more on its prefix,
     * then decode rows. */
    add(l, 1, &CPFUNION, &CPF_SMALL, DTYPES[0], 16, 0, 1);
    then(l, &CPF_EXT);
    then(l, &M3_SMALL);
}

/* Engine cache layouts (msa_case.engine_layout): each case runs in the
 * engine's layout and in the library's, and must give the same outputs and
 * cache rows bit for bit (msa_case_run_layout_pair).  Decode, verify and
 * prefill rows (the blocked kernels), sparse layers with and without index
 * values, a dense layer, every activation format, packed rows (head-major
 * pages, one KV head) and rows one token apart (token-major pages), page
 * sizes 1 (SGLang) to 128, and on CUDA the tensor-core kernels (head dim
 * 128), which must run in the engine layout where they run in the
 * library layout. */
static void add_layouts(tk_list *l)
{
    enum {
        VLLM = MSA_CASE_LAYOUT_VLLM,
        HEAD = MSA_CASE_LAYOUT_VLLM_HEAD_MAJOR,
        SGL = MSA_CASE_LAYOUT_SGLANG,
        LLAMA = MSA_CASE_LAYOUT_LLAMA_CPP
    };
    msa_case *c;
    for (int layout = VLLM; layout <= LLAMA; layout++) {
        const int page = layout == SGL ? 1 : 16;
        c = add(l, 1, &SMALL, &MIXED, DTYPES[1], page, 0, 1); /* bf16, decode + prefill */
        c->engine_layout = layout;
        c = add(l, layout != SGL, &CPFSPLIT, &CPF_MIX, DTYPES[0], page, 1, 1); /* fp32 */
        c->engine_layout = layout;
        c = add(l, 0, &UNION4, &VERIFY, DTYPES[2], layout == SGL ? 1 : 32, 1, 0); /* fp16 */
        c->engine_layout = layout;
        c = add(l, 0, &ODD, &EXTEND, DTYPES[5], page, 0, 1); /* unaligned dims, mixed */
        c->engine_layout = layout;
        c = add(l, layout == HEAD, &CPFMID, &CPF_SMALL, DTYPES[1], layout == SGL ? 1 : 64, 0, 0);
        c->engine_layout = layout;
        c->sparse = 0; /* dense layer */
    }
    /* The real layer's shape with whole 128-token pages. */
    c = add(l, 0, &M3, &M3_SMALL, DTYPES[1], 128, 0, 1);
    c->engine_layout = VLLM;
    c = add(l, 0, &M3, &M3_EXTEND, DTYPES[1], 128, 0, 0);
    c->engine_layout = HEAD;
    /* Prefill steps at head dim 128, whose rows the CUDA backend's
     * tensor-core kernels read through the strides: the mma.sync kernels
     * (pages of 16), the Hopper tensor-map kernels (pages of 128, one KV
     * head: a head stride the layout does not use), a dense layer. */
    c = add(l, 1, &PF128, &PF_QUICK, DTYPES[1], 16, 0, 1);
    c->engine_layout = VLLM;
    c = add(l, 1, &PFM3, &PF_QUICK, DTYPES[2], 128, 1, 0);
    c->engine_layout = VLLM;
    c = add(l, 0, &PFM3, &PF_QUICK, DTYPES[1], 128, 0, 1);
    c->engine_layout = HEAD;
    c = add(l, 0, &PF128, &PF_QUICK, DTYPES[1], 128, 0, 0);
    c->engine_layout = LLAMA;
    c->sparse = 0; /* dense layer */
    /* A sequence of steps on one plan over one wrapped pool. */
    c = add(l, 1, &CPFUNION, &CPF_SMALL, DTYPES[1], 16, 0, 1);
    c->engine_layout = LLAMA;
    then(l, &CPF_EXT);
    then(l, &M3_SMALL);
}

static void build(tk_list *l)
{
    add_core(l);
    add_mappings(l);
    add_dense(l);
    add_pages(l);
    add_special(l);
    add_quantized(l);
    add_m3(l);
    add_odd_geometry(l);
    add_extreme_scales(l);
    add_sequences(l);
    add_random(l, 120);
    add_prefill(l);
    add_quantized_prefill(l);
    add_cpu_prefill(l);
    add_layouts(l);
    for (int i = 0; i < l->n; i++) {
        tk_entry *e = &l->e[i];
        for (int j = 0; j < e->n; j++) {
            if (e->own_lengths) {
                e->c[j].q_len = e->q_store[j];
                e->c[j].kv_len = e->kv_store[j];
            }
        }
        name_entry(e);
        if (e->own_lengths) /* the seed tells random cases apart */
            snprintf(e->name + strlen(e->name), sizeof e->name - strlen(e->name), "/s%llx",
                     (unsigned long long)(e->c[0].seed & 0xffffff));
        for (int j = 0; j < e->n; j++)
            e->c[j].name = e->name;
    }
}

static int decode_like(const tk_entry *e)
{
    for (int i = 0; i < e->n; i++)
        for (int r = 0; r < e->c[i].num_requests; r++)
            if (e->c[i].q_len[r] > 16)
                return 0;
    return 1;
}

/* A case whose cache has fp8_e4m3 or nvfp4 planes. */
static int has_quantized_plane(const msa_case *c)
{
    const int kv = c->kv_dtype == MSA_DTYPE_FP8_E4M3 || c->kv_dtype == MSA_DTYPE_NVFP4;
    const int idx = c->index_dtype == MSA_DTYPE_FP8_E4M3 || c->index_dtype == MSA_DTYPE_NVFP4;
    return kv || (c->sparse && idx);
}

int msa_sweep_run(const msa_sweep_options *opts, int *passed, int *failed, int *skipped)
{
    tk_list list = {NULL, 0, 0};
    msa_context *ctx = NULL;
    msa_context_params cp;
    char err[256] = "";
    int np = 0, nf = 0, ns = 0;

    build(&list);
    msa_context_params_default(&cp);
    cp.backend = opts->backend;
    cp.num_threads = opts->num_threads;
    cp.debug = opts->debug;
    cp.cpu_isa_max = opts->cpu_isa_max;
    msa_context *own = NULL;
    if (opts->compare_own_pool && msa_context_create(&cp, &own, err, sizeof err) != MSA_OK)
        own = NULL; /* every case fails below */
    msa_context *cpu = NULL;
    if (opts->compare_cpu_quantized_cache) {
        msa_context_params cpu_cp;
        msa_context_params_default(&cpu_cp);
        cpu_cp.backend = MSA_BACKEND_CPU;
        if (msa_context_create(&cpu_cp, &cpu, NULL, 0) != MSA_OK)
            cpu = NULL; /* every quantized case fails below */
    }
    cp.parallel_for = opts->parallel_for;
    cp.engine = opts->engine;
    msa_status st = msa_context_create(&cp, &ctx, err, sizeof err);
    if (st != MSA_OK && opts->log)
        fprintf(opts->log, "backend %s not usable (%s: %s): every case skipped\n",
                msa_backend_name(opts->backend), msa_status_name(st), err);

    int selected = 0;
    for (int i = 0; i < list.n; i++) {
        const tk_entry *e = &list.e[i];
        const msa_case *c = &e->c[0];
        if (opts->quick && !e->quick)
            continue;
        if (opts->decode_only && !decode_like(e))
            continue;
        if (opts->filter && !strstr(c->name, opts->filter))
            continue;
        if (opts->shards > 1 && selected++ % opts->shards != opts->shard)
            continue;
        msa_case_result res;
        memset(&res, 0, sizeof res);
        if (!ctx) {
            res.skipped = 1;
            snprintf(res.message, sizeof res.message, "no context");
        } else {
            if (c->engine_layout != MSA_CASE_LAYOUT_LIBRARY)
                msa_case_run_layout_pair(ctx, e->c, e->n, &res);
            else
                msa_case_run_sequence(ctx, e->c, e->n, &res);
            if (opts->compare_own_pool && res.passed) {
                msa_case_result twin;
                memset(&twin, 0, sizeof twin);
                if (!own || !msa_case_run_sequence(own, e->c, e->n, &twin)) {
                    res.passed = 0;
                    snprintf(res.message, sizeof res.message,
                             "the run on the library's own threads failed");
                } else if (twin.out_hash != res.out_hash) {
                    res.passed = 0;
                    snprintf(res.message, sizeof res.message,
                             "outputs differ from the run on the library's own threads");
                }
            }
            if (opts->compare_cpu_quantized_cache && res.passed && has_quantized_plane(c)) {
                msa_case_result twin;
                memset(&twin, 0, sizeof twin);
                if (!cpu || !msa_case_run_sequence(cpu, e->c, e->n, &twin)) {
                    res.passed = 0;
                    snprintf(res.message, sizeof res.message,
                             "the CPU backend's run failed: %.200s",
                             cpu ? twin.message : "no CPU context");
                } else if (twin.cache_hash != res.cache_hash) {
                    res.passed = 0;
                    snprintf(res.message, sizeof res.message,
                             "quantized cache bytes differ from the CPU backend's");
                }
            }
        }
        const char *verdict = res.passed ? "PASS" : res.skipped ? "SKIP" : "FAIL";
        np += res.passed;
        ns += !res.passed && res.skipped;
        nf += !res.passed && !res.skipped;
        if (opts->log) {
            fprintf(opts->log, "%-64s o %.1e lse %.1e idx_o %.1e topk %ld  %5.2fs  %s", c->name,
                    res.o_err, res.lse_err, res.idx_o_err, res.topk_mismatches, res.seconds,
                    verdict);
            if (!res.passed && res.message[0])
                fprintf(opts->log, "  (%s)", res.message);
            fputc('\n', opts->log);
            fflush(opts->log);
        }
    }
    msa_context_free(ctx);
    msa_context_free(own);
    msa_context_free(cpu);
    free(list.e);
    *passed = np;
    *failed = nf;
    *skipped = ns;
    return nf != 0;
}
