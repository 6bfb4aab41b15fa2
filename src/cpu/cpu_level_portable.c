/* The CPU kernels compiled for the portable level (flags: CMakeLists.txt). */
#define MSA_CPU_LEVEL_ISA MSA_CPU_ISA_PORTABLE
#define MSA_CPU_LEVEL_TABLE msa_cpu_kernels_portable
#define MSA_CPU_LEVEL_NAME "portable"
#include "cpu/cpu_level.h"
