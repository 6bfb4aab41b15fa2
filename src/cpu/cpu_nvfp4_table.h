/* The bf16 values of nvfp4 elements before the global scale: for each
 * E4M3 group-scale byte s and E2M1 code c, e2m1(c) * e4m3(s).  An E2M1
 * value (two significant bits) times an E4M3 one (four) has at most six
 * significant bits and lies in bf16's exponent range, so every entry is
 * exact; a NaN scale byte gives NaN for all 16 codes, as SPEC 8's read
 * rule does.  Kernels widen a group of 16 codes by one permute of the
 * scale's 16 entries. */
#ifndef MSA_CPU_NVFP4_TABLE_H
#define MSA_CPU_NVFP4_TABLE_H

#include <stdint.h>

/* [256][16] bf16 bits, built on first use (thread-safe), then read only. */
const uint16_t *msa_cpu_nvfp4_bf16_table(void);

#endif
