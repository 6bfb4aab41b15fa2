/*
 * Minimal .npy reader/writer for the two element types the program exchanges
 * with other tools: little-endian float32 ("<f4") and int32 ("<i4"), C order.
 * The reader validates the whole file (magic, version, header dictionary,
 * element type, shape, exact data size) and explains what is wrong.
 */
#ifndef MSA_TOOLS_NPY_H
#define MSA_TOOLS_NPY_H

#include <stddef.h>
#include <stdint.h>

#define NPY_MAX_DIMS 8

typedef enum npy_type {
    NPY_F32 = 0, /* "<f4" */
    NPY_I32 = 1  /* "<i4" */
} npy_type;

typedef struct npy_array {
    npy_type type;
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    int64_t count; /* product of the shape */
    void *data;    /* count elements, host order; NULL when count == 0 */
} npy_array;

/* Reads `path`.  Returns 0 on success; otherwise -1 with a message in err. */
int npy_read(const char *path, npy_array *out, char *err, size_t err_size);
void npy_free(npy_array *a);

/* Parses the start of a .npy file held in buf[0..len): magic, version,
 * header length and header dictionary.  On success fills a's type, ndim,
 * shape and count (data stays NULL) and *data_offset (where the elements
 * begin) and returns 0; otherwise -1 with a message in err.  The data
 * itself is not looked at: len may end right after the header. */
int npy_parse_header(const void *buf, size_t len, npy_array *a, size_t *data_offset, char *err,
                     size_t err_size);

/* Writes a v1.0 file (header padded to a 64-byte multiple).  Returns 0 on
 * success; otherwise -1 with a message in err (a partial file is removed). */
int npy_write(const char *path, npy_type type, int ndim, const int64_t *shape, const void *data,
              char *err, size_t err_size);

/* "(3, 4)" style text of a shape, for messages. */
void npy_shape_str(int ndim, const int64_t *shape, char *buf, size_t buf_size);

#endif
