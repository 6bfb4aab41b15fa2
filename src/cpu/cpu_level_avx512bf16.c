/* The CPU kernels compiled for the avx512bf16 level (flags: CMakeLists.txt). */
#define MSA_CPU_LEVEL_ISA MSA_CPU_ISA_AVX512_BF16
#define MSA_CPU_LEVEL_TABLE msa_cpu_kernels_avx512bf16
#define MSA_CPU_LEVEL_NAME "avx512_bf16"
#include "cpu/cpu_level.h"
