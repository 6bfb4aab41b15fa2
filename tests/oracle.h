/*
 * The oracle: a plain, obviously correct double-precision implementation of
 * SPEC sections 4-6 for one request.  It never sees pages or dtypes: it reads
 * the logical per-request cache (the values the cache holds after the step,
 * already de-quantized to float) and the step's query rows.  For quantized
 * planes the caller applies SPEC 8's read rule first (fp8: code * scale;
 * nvfp4: e2m1(code) * e4m3(group scale) * global, as tk_plane_get does on
 * the bytes the backend wrote), so the oracle runs on exactly the values
 * the kernels read.  Never optimise this file; it is the reference
 * everything else is held to.
 */
#ifndef MSA_ORACLE_H
#define MSA_ORACLE_H

#include <stdint.h>

typedef struct msa_oracle_layer {
    int Hq, Hkv, D;
    int Hi, Di;
    int block;          /* B */
    int topk;           /* K */
    int init_blocks;    /* I */
    int local_blocks;   /* Lc */
    int score_lse;      /* 0 = max, 1 = lse */
    int sparse;         /* 0 = dense layer */
    int index_value;    /* sparse layer keeps an index value */
    double scale;       /* main softmax scale (already resolved) */
    double index_scale; /* c (already resolved) */
} msa_oracle_layer;

typedef struct msa_oracle_request {
    int q_len, kv_len;
    const float *k;     /* [kv_len][Hkv][D]  logical positions 0..kv_len-1 */
    const float *v;     /* [kv_len][Hkv][D] */
    const float *idx_k; /* [kv_len][Di]      sparse layers */
    const float *idx_v; /* [kv_len][Di]      index-value layers */
    const float *q;     /* [q_len][Hq][D]    the request's query rows */
    const float *idx_q; /* [q_len][Hi][Di]   sparse layers */
} msa_oracle_request;

/* Row width of selected ids: K, or m*K when Hi = m*Hkv. */
int msa_oracle_topk_width(const msa_oracle_layer *layer);

/* Outputs of token i (0 <= i < q_len) of the request.  Any output pointer may
 * be NULL.  Shapes: o [Hq][D], lse [Hq], topk [Hkv][W] (sparse layers),
 * idx_o [Hi][Di] (index-value layers). */
void msa_oracle_token(const msa_oracle_layer *layer, const msa_oracle_request *req, int i,
                      double *o, double *lse, int32_t *topk, double *idx_o);

/* Block scores of token i for index head h over its N reachable blocks
 * (scores[N]); used by tests to build inputs without near-ties. Returns N. */
int msa_oracle_block_scores(const msa_oracle_layer *layer, const msa_oracle_request *req, int i,
                            int h, double *scores);

#endif
