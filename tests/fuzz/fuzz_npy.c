/*
 * libFuzzer harness: arbitrary bytes as the start of a .npy file, through
 * the `msa` program's header parser (tools/npy.c).  It must never crash,
 * must say why on failure, and on success must describe a shape it can
 * stand behind: at most NPY_MAX_DIMS non-negative dimensions whose product
 * is the element count, and data that starts inside the bytes given.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    npy_array a;
    size_t off = 0;
    char err[256];
    err[0] = '\0';
    if (npy_parse_header(data, size, &a, &off, err, sizeof err) != 0) {
        if (!err[0] || strlen(err) >= sizeof err)
            abort();
        return 0;
    }
    if (a.data || off > size || off < 11 || (a.type != NPY_F32 && a.type != NPY_I32) ||
        a.ndim < 0 || a.ndim > NPY_MAX_DIMS || a.count < 0)
        abort();
    int64_t count = 1;
    for (int i = 0; i < a.ndim; i++) {
        if (a.shape[i] < 0)
            abort();
        count *= a.shape[i];
    }
    if (count != a.count || a.count > INT64_MAX / 4)
        abort();
    return 0;
}
