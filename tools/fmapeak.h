/* The fp32 multiply-add ceiling of the CPU, measured: what `msa bench`
 * compares the CPU prefill rates against. */
#ifndef MSA_TOOLS_FMAPEAK_H
#define MSA_TOOLS_FMAPEAK_H

#include <msa/msa.h>

/* GFLOP/s of `threads` threads that each run independent chains of fused
 * multiply-adds (two FLOPs each) on registers of the widest vector that
 * the CPU kernel level `isa` uses (AVX-512: 16 floats, AVX2: 8, others: 4
 * with a multiply and an add); the best of three runs of about 0.1 s.
 * Writes what ran to *what.  0 when the probe cannot run here. */
double fmapeak_gflops(int threads, msa_cpu_isa isa, const char **what);

/* The same for vdpbf16ps (two bf16 products per fp32 lane, 64 FLOPs per
 * instruction) when `isa` is AVX512_BF16 and the CPU has it; else 0.
 * What the bf16 dot-product kernels of that level are measured against. */
double fmapeak_bf16_gflops(int threads, msa_cpu_isa isa);

#endif
