/* Quantized cache formats of SPEC section 8: OCP fp8 e4m3fn and NVFP4
 * (E2M1 codes with E4M3 group scales and a per-layer fp32 global scale).
 *
 * Rules that hold for every function here:
 * - Encoding rounds to the nearest representable value, ties to the even
 *   code, and saturates: anything beyond the largest magnitude (448 for
 *   E4M3, 6 for E2M1), infinities included, becomes that magnitude with
 *   its sign.
 * - fp8: a NaN input is stored as the NaN code 0x7f and reads back NaN.
 * - nvfp4: a group of 16 values that holds a NaN gets the NaN scale byte
 *   0x7f and all-zero codes, so each of its 16 elements reads back NaN;
 *   E2M1 itself has no NaN.
 */
#ifndef MSA_QUANT_H
#define MSA_QUANT_H

#include <stdint.h>

/* Elements per NVFP4 group (one E4M3 scale byte each). */
#define MSA_NVFP4_GROUP 16

float msa_e4m3_to_f32(uint8_t code);
uint8_t msa_f32_to_e4m3(float x);
float msa_e2m1_to_f32(uint8_t code); /* low 4 bits: sign, 2 exponent, 1 mantissa */
uint8_t msa_f32_to_e2m1(float x);    /* a NaN gives code 0 */

/* fp8: dst[i] = e4m3(src[i] / scale) and back, code * scale. */
void msa_fp8_quantize(uint8_t *dst, const float *src, int64_t n, float scale);
void msa_fp8_dequantize(float *dst, const uint8_t *src, int64_t n, float scale);

/* nvfp4: n elements (a multiple of 16) of one row.  codes[n/2] holds two
 * codes per byte (low nibble = even element), group_scales[n/16] one E4M3
 * byte per 16 elements; `global` is the layer's scale of the plane. */
void msa_nvfp4_quantize(uint8_t *codes, uint8_t *group_scales, const float *src, int64_t n,
                        float global);
void msa_nvfp4_dequantize(float *dst, const uint8_t *codes, const uint8_t *group_scales, int64_t n,
                          float global);

#endif
