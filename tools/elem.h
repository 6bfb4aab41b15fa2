/*
 * Element formats of activations and cache planes, implemented on the host
 * from SPEC section 8 so the program can fill planes and read them back
 * without reaching into the library's internals.  Every conversion rounds to
 * nearest, ties to even, with integer arithmetic (no dependence on the FPU
 * rounding mode).
 */
#ifndef MSA_TOOLS_ELEM_H
#define MSA_TOOLS_ELEM_H

#include <stddef.h>
#include <stdint.h>

#include "msa/msa.h"

uint16_t elem_f32_to_bf16(float x);
float elem_bf16_to_f32(uint16_t x);
uint16_t elem_f32_to_f16(float x);
float elem_f16_to_f32(uint16_t x);
/* OCP e4m3fn: saturates to +-448, NaN -> 0x7f. */
uint8_t elem_f32_to_e4m3(float x);
float elem_e4m3_to_f32(uint8_t code);
/* E2M1 code (sign in bit 3) nearest to x, saturating at +-6. */
uint8_t elem_f32_to_e2m1(float x);
float elem_e2m1_to_f32(uint8_t code);

/* Activations: fp32 / bf16 / fp16. */
int elem_is_act_dtype(msa_dtype dtype);
void elem_from_f32(void *dst, msa_dtype dtype, const float *src, int64_t n);
void elem_to_f32(float *dst, msa_dtype dtype, const void *src, int64_t n);
/* Rounds n floats to `dtype` and back in place. */
void elem_round_f32(float *x, msa_dtype dtype, int64_t n);

/*
 * A cache plane is `units` regions of `unit_elems` values each (one region
 * per (page, head) in the layouts of msa.h).  For nvfp4 a region is its
 * codes (unit_elems / 2 bytes, low nibble = even element) followed by one
 * e4m3 scale byte per 16 elements.  `scale` is the plane's fp8 scale or
 * nvfp4 global scale, ignored by the other formats.
 */
/* Bytes of such a plane; 0 when the format cannot hold it (nvfp4 needs
 * unit_elems % 16 == 0). */
size_t elem_plane_bytes(msa_dtype dtype, int64_t units, int64_t unit_elems);
void elem_encode_plane(void *dst, msa_dtype dtype, const float *src, int64_t units,
                       int64_t unit_elems, float scale);
void elem_decode_plane(float *dst, msa_dtype dtype, const void *src, int64_t units,
                       int64_t unit_elems, float scale);
/* Storage bytes per element, fractional for nvfp4 (codes + scales). */
double elem_bytes_per_value(msa_dtype dtype);

#endif
