/*
 * Kernel launches inside a layer use programmatic dependent launch on
 * Hopper: the next kernel's CTAs may be scheduled while the previous one
 * drains, and wait in cu_pdl_wait() until it has finished and its writes are
 * visible.  This hides most of the gap between the small kernels of a decode
 * step.  The first kernel of a layer is launched plainly (it follows the
 * caller's own work); on older GPUs every launch is plain.
 */
#ifndef MSA_CUDA_ARCH_LAUNCH_CUH
#define MSA_CUDA_ARCH_LAUNCH_CUH

#include "cuda/common/common.cuh"

/* Registers per thread of a kernel launched as one CTA of `threads` per
 * SM (__launch_bounds__(threads, 1)): the register file's 64K shared out in
 * steps of 8.  A CTA's warps may move registers between them (setmaxnreg),
 * but only within the CTA's own CU_LAUNCH_REGS(threads) x threads: a
 * setmaxnreg.inc that asks for more waits forever. */
#define CU_LAUNCH_REGS(threads) ((65536 / (threads)) & ~7)

/* Every kernel launched with pdl = 1 calls this before reading anything an
 * earlier kernel of the layer wrote (plan data and the caller's inputs may
 * be read before: they were in place before the layer's first kernel,
 * which is launched plainly).  Every CTA calls it before it ends, so that
 * a grid's completion implies its predecessors': a later kernel that waits
 * only for its own predecessor then sees every earlier kernel's writes. */
__device__ __forceinline__ void cu_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Lets the next kernel be scheduled now (it still waits for this one to
 * finish before it reads our results). */
__device__ __forceinline__ void cu_pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <typename... KArgs, typename... Args>
static inline void cu_launch(void (*kernel)(KArgs...), int grid, int block, size_t smem,
                             cudaStream_t stream, int pdl, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid);
    cfg.blockDim = dim3((unsigned)block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* Allows each kernel `bytes` of dynamic shared memory (beyond the default
 * 48 KB); stops at the first error. */
static inline cudaError_t cu_allow_smem(size_t)
{
    return cudaSuccess;
}

template <typename Kernel, typename... More>
static inline cudaError_t cu_allow_smem(size_t bytes, Kernel kernel, More... more)
{
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    return e != cudaSuccess ? e : cu_allow_smem(bytes, more...);
}

#endif /* MSA_CUDA_ARCH_LAUNCH_CUH */
