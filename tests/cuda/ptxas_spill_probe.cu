/*
 * A kernel that must spill: 64 values live at once under a 32-register
 * limit.  test_cuda_ptxas_probe runs check_ptxas.sh on it and passes only on
 * its report of the spill, so the check is known to see one.
 */
__global__ void __launch_bounds__(1024, 2) ptxas_spill_probe(float *out, const float *in)
{
    float v[64];
#pragma unroll
    for (int i = 0; i < 64; ++i)
        v[i] = in[threadIdx.x * 64 + i];
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 64; ++i)
#pragma unroll
        for (int j = i + 1; j < 64; ++j)
            s += v[i] * v[j];
    out[threadIdx.x] = s;
}
