/* The CPU kernels compiled for the avx2 level (flags: CMakeLists.txt). */
#define MSA_CPU_LEVEL_ISA MSA_CPU_ISA_AVX2
#define MSA_CPU_LEVEL_TABLE msa_cpu_kernels_avx2
#define MSA_CPU_LEVEL_NAME "avx2"
#include "cpu/cpu_level.h"
