/*
 * Compares one layer of one step, as the library computed it, with the
 * double-precision oracle on a sample of token rows.  The reference sees
 * exactly what the library saw: the cache is read back from the library
 * after the step (de-quantized), and the queries are the rounded values
 * that were passed in.
 */
#ifndef MSA_TOOLS_ORACLE_CMP_H
#define MSA_TOOLS_ORACLE_CMP_H

#include <stdint.h>

#include "msa/msa.h"

typedef struct cmp_inputs {
    msa_context *ctx;
    const msa_model *model;
    msa_cache *cache;
    const float *plane_scales; /* [4] as set with msa_cache_set_scales */
    int32_t layer;
    const msa_step *step;
    /* The step's queries as float, [T][Hq][D] and [T][Hi][Di] (sparse). */
    const float *q, *idx_q;
    /* The library's outputs as float / int32 (any may be NULL: not compared). */
    const float *o, *lse, *idx_o;
    const int32_t *topk; /* [T][Hkv][W] */
    /* Token rows to compare (each a row of a request, not padding). */
    const int64_t *rows;
    int num_rows;
} cmp_inputs;

typedef struct cmp_result {
    double o_err, lse_err, idx_o_err; /* max over rows of ||out-ref|| / ||ref|| */
    long topk_rows;                   /* (row, KV head) pairs compared */
    long topk_mismatches;             /* rows whose ids differ from the oracle */
    long near_ties;                   /* of those, explained by a near-tie of block scores */
    int nonfinite;                    /* an output held NaN/inf where the oracle did not */
    char message[256];                /* why the comparison could not run ("" when it did) */
} cmp_result;

/* Returns 0 when the comparison ran (judge the numbers in *res), -1 when it
 * could not (library call failed, out of memory; res->message says why). */
int cmp_layer(const cmp_inputs *in, cmp_result *res);

#endif
