/* The CPU kernels compiled for the avx512 level (flags: CMakeLists.txt). */
#define MSA_CPU_LEVEL_ISA MSA_CPU_ISA_AVX512
#define MSA_CPU_LEVEL_TABLE msa_cpu_kernels_avx512
#define MSA_CPU_LEVEL_NAME "avx512"
#include "cpu/cpu_level.h"
