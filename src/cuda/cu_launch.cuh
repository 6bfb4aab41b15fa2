/*
 * Kernel launches inside a layer use programmatic dependent launch on
 * Hopper: the next kernel's CTAs may be scheduled while the previous one
 * drains, and wait in cu_pdl_wait() until it has finished and its writes are
 * visible.  This hides most of the gap between the small kernels of a decode
 * step.  The first kernel of a layer is launched plainly (it follows the
 * caller's own work); on older GPUs every launch is plain.
 */
#ifndef MSA_CU_LAUNCH_CUH
#define MSA_CU_LAUNCH_CUH

#include "cu_common.cuh"

/* Every kernel launched with CU_LAUNCH_PDL calls this before reading anything an
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

/* How the kernels of a layer are launched (cu_plan_state.launch). */
#define CU_LAUNCH_PDL 1        /* programmatic dependent launch (Hopper+) */
#define CU_LAUNCH_MAX_SHARED 2 /* every kernel asks for the largest shared-memory carveout */

/* Launches `kernel`; `flags` as CU_LAUNCH_*.  With CU_LAUNCH_MAX_SHARED all
 * kernels of a layer ask for one L1 / shared-memory split, so that an SM
 * need not change its split (which waits for its CTAs to drain) between
 * one kernel and the next. */
template <typename... KArgs, typename... Args>
static inline void cu_launch(void (*kernel)(KArgs...), int grid, int block, size_t smem,
                             cudaStream_t stream, int flags, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid);
    cfg.blockDim = dim3((unsigned)block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (flags & CU_LAUNCH_PDL) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (flags & CU_LAUNCH_MAX_SHARED) {
        attr[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
        attr[n++].val.sharedMemCarveout = (unsigned)cudaSharedmemCarveoutMaxShared;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
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

#endif /* MSA_CU_LAUNCH_CUH */
