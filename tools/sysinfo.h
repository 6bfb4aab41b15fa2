/* Facts about the host the program reports and sizes its benchmarks by. */
#ifndef MSA_TOOLS_SYSINFO_H
#define MSA_TOOLS_SYSINFO_H

#include <stddef.h>

/* Last-level cache of CPU 0 in bytes (sysfs), or `fallback` when unknown. */
size_t sysinfo_llc_bytes(size_t fallback);
/* Physical memory in bytes, or `fallback` when unknown. */
size_t sysinfo_phys_bytes(size_t fallback);
/* Directory of the running executable (Linux /proc/self/exe); 0 on success. */
int sysinfo_exe_dir(char *buf, size_t size);
/* Online CPUs, at least 1. */
int sysinfo_online_cpus(void);
/* Writes the x86 SIMD features the CPU kernels care about, e.g.
 * "AVX2 FMA AVX-512F AVX512-BF16" ("none" when absent or not x86). */
void sysinfo_cpu_features(char *buf, size_t size);
/* CPU model name from /proc/cpuinfo, or "unknown". */
void sysinfo_cpu_model(char *buf, size_t size);

#endif
