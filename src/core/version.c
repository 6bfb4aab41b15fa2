/* Version, status, dtype and backend names. */
#include "core/internal.h"

#include <string.h>

#define MSA_STR2(x) #x
#define MSA_STR(x) MSA_STR2(x)

const char *msa_version_string(void)
{
    return MSA_STR(MSA_VERSION_MAJOR) "." MSA_STR(MSA_VERSION_MINOR) "." MSA_STR(MSA_VERSION_PATCH);
}

unsigned msa_version_number(void)
{
    return MSA_VERSION_NUMBER;
}

const char *msa_status_name(msa_status status)
{
    switch (status) {
    case MSA_OK: return "MSA_OK";
    case MSA_ERR_INVALID_ARGUMENT: return "MSA_ERR_INVALID_ARGUMENT";
    case MSA_ERR_INVALID_CONFIG: return "MSA_ERR_INVALID_CONFIG";
    case MSA_ERR_OUT_OF_RANGE: return "MSA_ERR_OUT_OF_RANGE";
    case MSA_ERR_UNSUPPORTED: return "MSA_ERR_UNSUPPORTED";
    case MSA_ERR_OUT_OF_MEMORY: return "MSA_ERR_OUT_OF_MEMORY";
    case MSA_ERR_IO: return "MSA_ERR_IO";
    case MSA_ERR_CAPACITY: return "MSA_ERR_CAPACITY";
    case MSA_ERR_BACKEND: return "MSA_ERR_BACKEND";
    case MSA_ERR_NO_DEVICE: return "MSA_ERR_NO_DEVICE";
    }
    return "MSA_ERR_UNKNOWN";
}

static const char *const dtype_names[] = {"fp32", "bf16", "fp16", "fp8_e4m3", "nvfp4"};

const char *msa_dtype_name(msa_dtype dtype)
{
    if ((unsigned)dtype < sizeof dtype_names / sizeof dtype_names[0])
        return dtype_names[dtype];
    return "unknown";
}

msa_status msa_dtype_from_name(const char *name, msa_dtype *out)
{
    if (!name || !out)
        return MSA_ERR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++) {
        if (strcmp(name, dtype_names[i]) == 0) {
            *out = (msa_dtype)i;
            return MSA_OK;
        }
    }
    return MSA_ERR_INVALID_ARGUMENT;
}

size_t msa_dtype_size(msa_dtype dtype)
{
    switch (dtype) {
    case MSA_DTYPE_FP32: return 4;
    case MSA_DTYPE_BF16:
    case MSA_DTYPE_FP16: return 2;
    case MSA_DTYPE_FP8_E4M3: return 1;
    case MSA_DTYPE_NVFP4: return 0;
    }
    return 0;
}

const char *msa_backend_name(msa_backend backend)
{
    switch (backend) {
    case MSA_BACKEND_CPU: return "cpu";
    case MSA_BACKEND_CUDA: return "cuda";
    }
    return "unknown";
}
