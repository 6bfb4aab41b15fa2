/*
 * .npy files: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
 *
 *   "\x93NUMPY" major minor  header_len (u16 for v1, u32 for v2/v3)  header
 *
 * The header is a Python dict literal with exactly the keys 'descr',
 * 'fortran_order' and 'shape', padded with spaces and ended by '\n'.  We
 * parse it with a small hand-written scanner instead of trusting sscanf so a
 * malformed file produces a precise message instead of garbage shapes.
 */
#include "npy.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
/* Headers of real files are tiny; a bound keeps a corrupt length from
 * triggering a huge allocation. */
#define NPY_MAX_HEADER (1u << 20)

static void set_err(char *err, size_t err_size, const char *fmt, ...)
{
    if (!err || err_size == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
}

static int host_is_little_endian(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* The file is little-endian; swap 4-byte elements in place on big-endian
 * hosts so callers always see host order. */
static void swap32_if_needed(void *data, int64_t count)
{
    if (host_is_little_endian())
        return;
    unsigned char *p = data;
    for (int64_t i = 0; i < count; i++, p += 4) {
        unsigned char t = p[0];
        p[0] = p[3];
        p[3] = t;
        t = p[1];
        p[1] = p[2];
        p[2] = t;
    }
}

void npy_shape_str(int ndim, const int64_t *shape, char *buf, size_t buf_size)
{
    size_t used = 0;
    if (buf_size == 0)
        return;
    buf[0] = '\0';
    used += (size_t)snprintf(buf + used, buf_size - used, "(");
    for (int i = 0; i < ndim && used < buf_size; i++)
        used += (size_t)snprintf(buf + used, buf_size - used, "%s%lld", i ? ", " : "",
                                 (long long)shape[i]);
    if (used < buf_size)
        used += (size_t)snprintf(buf + used, buf_size - used, ndim == 1 ? ",)" : ")");
    (void)used;
}

/* ---- header dictionary scanner ----------------------------------------- */

typedef struct scanner {
    const char *p, *end;
} scanner;

static void skip_ws(scanner *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static int accept_char(scanner *s, char c)
{
    skip_ws(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return 1;
    }
    return 0;
}

/* A quoted Python string without escapes (all npy keys/values are plain). */
static int scan_string(scanner *s, char *out, size_t out_size)
{
    skip_ws(s);
    if (s->p >= s->end || (*s->p != '\'' && *s->p != '"'))
        return -1;
    char quote = *s->p++;
    size_t n = 0;
    while (s->p < s->end && *s->p != quote) {
        if (*s->p == '\\' || n + 1 >= out_size)
            return -1;
        out[n++] = *s->p++;
    }
    if (s->p >= s->end)
        return -1;
    s->p++;
    out[n] = '\0';
    return 0;
}

static int scan_word(scanner *s, const char *word)
{
    skip_ws(s);
    size_t n = strlen(word);
    if ((size_t)(s->end - s->p) >= n && memcmp(s->p, word, n) == 0) {
        s->p += n;
        return 1;
    }
    return 0;
}

/* "(a, b, c)" with an optional trailing comma; "()" is a 0-d array. */
static int scan_shape(scanner *s, npy_array *a, char *err, size_t err_size)
{
    if (!accept_char(s, '(')) {
        set_err(err, err_size, "'shape' is not a tuple");
        return -1;
    }
    a->ndim = 0;
    for (;;) {
        if (accept_char(s, ')'))
            return 0;
        skip_ws(s);
        if (s->p >= s->end || *s->p < '0' || *s->p > '9') {
            set_err(err, err_size, "'shape' holds something other than non-negative integers");
            return -1;
        }
        int64_t v = 0;
        while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
            int digit = *s->p++ - '0';
            if (v > (INT64_MAX - digit) / 10) {
                set_err(err, err_size, "a dimension of 'shape' overflows 64 bits");
                return -1;
            }
            v = v * 10 + digit;
        }
        if (s->p < s->end && *s->p == 'L') /* files written by Python 2 */
            s->p++;
        if (a->ndim == NPY_MAX_DIMS) {
            set_err(err, err_size, "more than %d dimensions", NPY_MAX_DIMS);
            return -1;
        }
        a->shape[a->ndim++] = v;
        if (accept_char(s, ','))
            continue;
        if (accept_char(s, ')'))
            return 0;
        set_err(err, err_size, "'shape' tuple is malformed");
        return -1;
    }
}

static int parse_header(const char *text, size_t len, npy_array *a, char *err, size_t err_size)
{
    scanner s = {text, text + len};
    int have_descr = 0, have_order = 0, have_shape = 0;
    if (!accept_char(&s, '{')) {
        set_err(err, err_size, "header is not a dictionary");
        return -1;
    }
    for (;;) {
        if (accept_char(&s, '}'))
            break;
        char key[32];
        if (scan_string(&s, key, sizeof key) != 0 || !accept_char(&s, ':')) {
            set_err(err, err_size, "header dictionary is malformed");
            return -1;
        }
        if (strcmp(key, "descr") == 0 && !have_descr) {
            char descr[32];
            if (scan_string(&s, descr, sizeof descr) != 0) {
                set_err(err, err_size, "'descr' is not a string");
                return -1;
            }
            if (strcmp(descr, "<f4") == 0) {
                a->type = NPY_F32;
            } else if (strcmp(descr, "<i4") == 0) {
                a->type = NPY_I32;
            } else {
                set_err(err, err_size,
                        "element type '%s' is not supported (need little-endian float32 '<f4'"
                        " or int32 '<i4')",
                        descr);
                return -1;
            }
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            if (scan_word(&s, "True")) {
                set_err(err, err_size, "Fortran-order arrays are not supported (save in C order)");
                return -1;
            }
            if (!scan_word(&s, "False")) {
                set_err(err, err_size, "'fortran_order' is neither True nor False");
                return -1;
            }
            have_order = 1;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            if (scan_shape(&s, a, err, err_size) != 0)
                return -1;
            have_shape = 1;
        } else {
            set_err(err, err_size, "unexpected or repeated header key '%s'", key);
            return -1;
        }
        if (accept_char(&s, ','))
            continue;
        if (accept_char(&s, '}'))
            break;
        set_err(err, err_size, "header dictionary is malformed");
        return -1;
    }
    skip_ws(&s);
    if (s.p != s.end) {
        set_err(err, err_size, "unexpected text after the header dictionary");
        return -1;
    }
    if (!have_descr || !have_order || !have_shape) {
        set_err(err, err_size, "header lacks '%s'",
                !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
        return -1;
    }
    return 0;
}

/* ---- reading ----------------------------------------------------------- */

static int read_exact(FILE *f, void *buf, size_t n)
{
    return fread(buf, 1, n, f) == n ? 0 : -1;
}

int npy_read(const char *path, npy_array *out, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) {
        set_err(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        set_err(err, err_size, "%s: not a regular file", path);
        fclose(f);
        return -1;
    }
    unsigned char pre[10];
    char *header = NULL;
    npy_array a;
    memset(&a, 0, sizeof a);
    char why[200] = "";

    if (read_exact(f, pre, 8) != 0 || memcmp(pre, npy_magic, 6) != 0) {
        snprintf(why, sizeof why, "not a .npy file (bad magic)");
        goto fail;
    }
    int major = pre[6];
    size_t header_len, prefix_len;
    if (major == 1) {
        if (read_exact(f, pre + 8, 2) != 0) {
            snprintf(why, sizeof why, "truncated header");
            goto fail;
        }
        header_len = (size_t)pre[8] | (size_t)pre[9] << 8;
        prefix_len = 10;
    } else if (major == 2 || major == 3) {
        unsigned char l4[4];
        if (read_exact(f, l4, 4) != 0) {
            snprintf(why, sizeof why, "truncated header");
            goto fail;
        }
        header_len = (size_t)l4[0] | (size_t)l4[1] << 8 | (size_t)l4[2] << 16 |
                     (size_t)l4[3] << 24;
        prefix_len = 12;
    } else {
        snprintf(why, sizeof why, "unsupported format version %d.%d", major, pre[7]);
        goto fail;
    }
    if (header_len == 0 || header_len > NPY_MAX_HEADER ||
        (uint64_t)st.st_size < prefix_len + header_len) {
        snprintf(why, sizeof why, "header length %zu does not fit the file", header_len);
        goto fail;
    }
    header = malloc(header_len);
    if (!header || read_exact(f, header, header_len) != 0) {
        snprintf(why, sizeof why, "cannot read the header");
        goto fail;
    }
    if (parse_header(header, header_len, &a, why, sizeof why) != 0)
        goto fail;

    a.count = 1;
    for (int i = 0; i < a.ndim; i++) {
        if (a.shape[i] != 0 && a.count > INT64_MAX / 4 / a.shape[i]) {
            snprintf(why, sizeof why, "array is too large");
            goto fail;
        }
        a.count *= a.shape[i];
    }
    uint64_t data_bytes = (uint64_t)a.count * 4;
    uint64_t expect = prefix_len + header_len + data_bytes;
    if ((uint64_t)st.st_size != expect) {
        char shp[96];
        npy_shape_str(a.ndim, a.shape, shp, sizeof shp);
        snprintf(why, sizeof why, "file has %llu bytes, shape %s needs %llu",
                 (unsigned long long)st.st_size, shp, (unsigned long long)expect);
        goto fail;
    }
    if (a.count > 0) {
        if (data_bytes > SIZE_MAX || !(a.data = malloc((size_t)data_bytes))) {
            snprintf(why, sizeof why, "out of memory for %llu bytes",
                     (unsigned long long)data_bytes);
            goto fail;
        }
        if (read_exact(f, a.data, (size_t)data_bytes) != 0) {
            snprintf(why, sizeof why, "cannot read the data");
            goto fail;
        }
        swap32_if_needed(a.data, a.count);
    }
    free(header);
    fclose(f);
    *out = a;
    return 0;

fail:
    set_err(err, err_size, "%s: %s", path, why);
    free(a.data);
    free(header);
    fclose(f);
    return -1;
}

void npy_free(npy_array *a)
{
    if (!a)
        return;
    free(a->data);
    a->data = NULL;
    a->count = 0;
}

/* ---- writing ----------------------------------------------------------- */

int npy_write(const char *path, npy_type type, int ndim, const int64_t *shape,
              const void *data, char *err, size_t err_size)
{
    if (ndim < 0 || ndim > NPY_MAX_DIMS) {
        set_err(err, err_size, "%s: %d dimensions not supported", path, ndim);
        return -1;
    }
    int64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            set_err(err, err_size, "%s: negative dimension", path);
            return -1;
        }
        count *= shape[i];
    }
    char shp[200];
    npy_shape_str(ndim, shape, shp, sizeof shp);
    char dict[300];
    int dict_len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                            type == NPY_F32 ? "<f4" : "<i4", shp);
    /* magic(6) + version(2) + length(2) + dict + padding + '\n' = 64*k */
    size_t total = 10 + (size_t)dict_len + 1;
    size_t padded = (total + 63) / 64 * 64;
    size_t header_len = padded - 10;
    char header[400];
    memcpy(header, dict, (size_t)dict_len);
    memset(header + dict_len, ' ', header_len - (size_t)dict_len - 1);
    header[header_len - 1] = '\n';

    FILE *f = fopen(path, "wb");
    if (!f) {
        set_err(err, err_size, "%s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    unsigned char pre[10];
    memcpy(pre, npy_magic, 6);
    pre[6] = 1;
    pre[7] = 0;
    pre[8] = (unsigned char)(header_len & 0xff);
    pre[9] = (unsigned char)(header_len >> 8);
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(header, 1, header_len, f) == header_len;
    if (ok && count > 0) {
        if (host_is_little_endian()) {
            ok = fwrite(data, 4, (size_t)count, f) == (size_t)count;
        } else {
            const unsigned char *p = data;
            for (int64_t i = 0; ok && i < count; i++, p += 4) {
                unsigned char le[4] = {p[3], p[2], p[1], p[0]};
                ok = fwrite(le, 1, 4, f) == 4;
            }
        }
    }
    if (fclose(f) != 0)
        ok = 0;
    if (!ok) {
        set_err(err, err_size, "%s: write failed: %s", path, strerror(errno));
        unlink(path);
        return -1;
    }
    return 0;
}
