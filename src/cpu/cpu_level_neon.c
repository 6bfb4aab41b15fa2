/* The CPU kernels compiled for the neon level (flags: CMakeLists.txt). */
#define MSA_CPU_LEVEL_ISA MSA_CPU_ISA_NEON
#define MSA_CPU_LEVEL_TABLE msa_cpu_kernels_neon
#define MSA_CPU_LEVEL_NAME "neon"
#include "cpu/cpu_level.h"
