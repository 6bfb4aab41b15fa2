/* The CPU kernels compiled for the neon_bf16 level (flags: CMakeLists.txt). */
#define MSA_CPU_LEVEL_ISA MSA_CPU_ISA_NEON_BF16
#define MSA_CPU_LEVEL_TABLE msa_cpu_kernels_neonbf16
#define MSA_CPU_LEVEL_NAME "neon_bf16"
#include "cpu/cpu_level.h"
