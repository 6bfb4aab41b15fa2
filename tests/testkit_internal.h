/*
 * Pieces of the test kit shared between its files.  Nothing here is part of
 * the library: element formats are re-implemented from SPEC 8 so that the
 * tests do not trust the code they test.
 */
#ifndef MSA_TESTKIT_INTERNAL_H
#define MSA_TESTKIT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "msa/msa.h"
#include "oracle.h"
#include "testkit.h"

/* ---- random numbers: splitmix64, reproducible from a case's seed -------- */
typedef struct tk_rng {
    uint64_t state;
} tk_rng;

uint64_t tk_rng_next(tk_rng *rng);
double tk_rng_uniform(tk_rng *rng);   /* [0, 1) */
float tk_rng_gauss(tk_rng *rng);      /* standard normal */
int tk_rng_below(tk_rng *rng, int n); /* [0, n) */

/* ---- element formats (testkit_formats.c) ------------------------------- */
uint16_t tk_f32_to_bf16(float x); /* round to nearest even, NaN stays NaN */
float tk_bf16_to_f32(uint16_t x);
uint16_t tk_f32_to_f16(float x); /* round to nearest even, overflow to inf */
float tk_f16_to_f32(uint16_t x);
uint8_t tk_f32_to_e4m3(float x); /* nearest, ties to even, saturating; NaN -> 0x7f */
float tk_e4m3_to_f32(uint8_t x);
float tk_e2m1_to_f32(unsigned code);
unsigned tk_f32_to_e2m1(float x); /* nearest, ties to even code, saturating */
/* One NVFP4 group of 16 values (SPEC 8): its E4M3 scale byte and E2M1 codes. */
void tk_nvfp4_encode_group(const float *x, float global, uint8_t *scale_byte, unsigned codes[16]);

/* Activations: fp32 / bf16 / fp16 arrays. */
float tk_round_act(msa_dtype dtype, float x); /* x as the dtype would hold it */
void tk_store_act(void *base, msa_dtype dtype, size_t i, float x);
float tk_load_act(const void *base, msa_dtype dtype, size_t i);
/* Bit pattern of a quiet NaN in the dtype, used to poison outputs. */
void tk_poison_act(void *base, msa_dtype dtype, size_t n);

/* ---- one cache plane of one layer (layout of msa.h / SPEC 8) ----------- */
typedef struct tk_plane {
    msa_dtype dtype;
    int heads; /* Hkv for K/V, 1 for index planes */
    int dim;   /* D or Di */
    int page_size;
    int64_t pages;
    float scale; /* fp8 dequant scale / nvfp4 global scale */
} tk_plane;

size_t tk_plane_bytes(const tk_plane *pl);
/* Encodes / decodes the row of one (page, head, slot). */
void tk_plane_put(const tk_plane *pl, uint8_t *img, int64_t page, int head, int slot,
                  const float *x);
void tk_plane_get(const tk_plane *pl, const uint8_t *img, int64_t page, int head, int slot,
                  float *x);
/* 1 when the rows hold the same values (bytes equal, or for quantized
 * planes the same decoded values, so -0 and +0 codes agree). */
int tk_plane_row_equal(const tk_plane *pl, const uint8_t *a, const uint8_t *b, int64_t page,
                       int head, int slot);

/* ---- one step of one case, host side (testkit_step.c) -------------------- */
typedef struct tk_step {
    msa_oracle_layer layer;
    msa_dtype act;
    int has_plane[4]; /* indexed by msa_plane */
    tk_plane plane[4];

    /* Requests and rows of the token tensors. */
    int R;
    int *q_len, *kv_len;
    int64_t *row0;  /* [R + 1] first row of each request */
    int64_t rows;   /* num_tokens, padding included */
    int64_t active; /* sum(q_len) */
    int max_kv;

    /* Page tables: row r at table + r * stride, -1 where unused. */
    int page_size;
    int64_t num_pages;
    int64_t stride;
    int32_t *table;

    /* Activations as the act dtype holds them, [rows][heads][dim]. */
    float *q, *k, *v, *idx_q, *idx_k, *idx_v;

    /* Cache images: before the call, and what it must hold after it. */
    uint8_t *before[4], *after[4];
} tk_step;

/* Builds everything from the case's seed, in a pool of at least min_pages
 * pages (spare pages hold garbage).  Returns 0, or -1 with err set. */
int tk_step_build(const msa_case *c, int64_t min_pages, tk_step *s, char *err, size_t err_size);
/* Pool pages the case needs (its own pages plus spares). */
int64_t tk_step_pages(const msa_case *c);
void tk_step_free(tk_step *s);

/* One request's logical cache, decoded from a set of plane images. */
typedef struct tk_view {
    float *k, *v, *idx_k, *idx_v;
} tk_view;

void tk_view_gather(const tk_step *s, uint8_t *const img[4], int r, tk_view *view);
void tk_view_free(tk_view *view);

/* Oracle request of r over `view`, with the step's query rows. */
msa_oracle_request tk_oracle_request(const tk_step *s, const tk_view *view, int r);

/* Redraws index queries until no token's selection hinges on a near-tie of
 * block scores (SPEC 11).  Returns 0, or -1 with err set. */
int tk_avoid_near_ties(tk_step *s, uint64_t seed, char *err, size_t err_size);

#endif
