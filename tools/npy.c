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

#include "json_strict.h"

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

/* Why scan_string failed. */
enum { STR_OK = 0, STR_NONE = -1, STR_LONG = -2, STR_BAD_CHAR = -3, STR_OPEN = -4 };

/* A quoted Python string without escapes (all npy keys/values are plain
 * printable ASCII).  *n_out gets the length of the text between the quotes
 * even when it does not fit `out`, for the message. */
static int scan_string(scanner *s, char *out, size_t out_size, size_t *n_out)
{
    skip_ws(s);
    *n_out = 0;
    if (s->p >= s->end || (*s->p != '\'' && *s->p != '"'))
        return STR_NONE;
    char quote = *s->p++;
    size_t n = 0;
    int rc = STR_OK;
    while (s->p < s->end && *s->p != quote) {
        unsigned char b = (unsigned char)*s->p++;
        if (b == '\\' || b < 0x20 || b >= 0x7f)
            rc = rc ? rc : STR_BAD_CHAR;
        else if (n + 1 >= out_size)
            rc = rc ? rc : STR_LONG;
        else
            out[n] = (char)b;
        n++;
    }
    *n_out = n;
    if (s->p >= s->end)
        return STR_OPEN;
    s->p++;
    if (rc == STR_OK)
        out[n] = '\0';
    return rc;
}

/* The message for a failed scan_string of `what`. */
static void string_err(int rc, const char *what, size_t n, size_t max, char *err, size_t err_size)
{
    if (rc == STR_LONG)
        set_err(err, err_size, "%s is too long (%zu characters; at most %zu)", what, n, max);
    else if (rc == STR_BAD_CHAR)
        set_err(err, err_size, "%s holds a backslash or a byte that is not printable ASCII", what);
    else if (rc == STR_OPEN)
        set_err(err, err_size, "%s has no closing quote", what);
    else
        set_err(err, err_size, "%s is not a quoted string", what);
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
        size_t n;
        int rc = scan_string(&s, key, sizeof key, &n);
        if (rc == STR_NONE) {
            set_err(err, err_size, "header dictionary is malformed (a key is not a string)");
            return -1;
        }
        if (rc != STR_OK) {
            string_err(rc, "a header key", n, sizeof key - 1, err, err_size);
            return -1;
        }
        if (!accept_char(&s, ':')) {
            set_err(err, err_size, "header dictionary is malformed (no ':' after '%s')", key);
            return -1;
        }
        if (strcmp(key, "descr") == 0 && !have_descr) {
            char descr[32];
            if ((rc = scan_string(&s, descr, sizeof descr, &n)) != STR_OK) {
                string_err(rc, "'descr'", n, sizeof descr - 1, err, err_size);
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
        set_err(err, err_size, "header dictionary is malformed (no ',' or '}' after '%s')", key);
        return -1;
    }
    skip_ws(&s);
    if (s.p != s.end) {
        set_err(err, err_size, "unexpected text after the header dictionary");
        return -1;
    }
    if (!have_descr || !have_order || !have_shape) {
        set_err(err, err_size, "header lacks '%s'",
                !have_descr   ? "descr"
                : !have_order ? "fortran_order"
                              : "shape");
        return -1;
    }
    return 0;
}

/* ---- reading ----------------------------------------------------------- */

/* The lengths of the fixed prefix (magic, version, header length) and of
 * the header dictionary, from the first n bytes of a file. */
static int parse_prefix(const unsigned char *p, size_t n, size_t *prefix_len, size_t *header_len,
                        char *err, size_t err_size)
{
    if (n < 6 || memcmp(p, npy_magic, 6) != 0) {
        set_err(err, err_size, "not a .npy file (bad magic)");
        return -1;
    }
    if (n < 8) {
        set_err(err, err_size, "truncated header");
        return -1;
    }
    const int major = p[6];
    if (major == 1) {
        *prefix_len = 10;
    } else if (major == 2 || major == 3) {
        *prefix_len = 12;
    } else {
        set_err(err, err_size, "unsupported format version %d.%d", major, p[7]);
        return -1;
    }
    if (n < *prefix_len) {
        set_err(err, err_size, "truncated header");
        return -1;
    }
    *header_len = major == 1 ? (size_t)p[8] | (size_t)p[9] << 8
                             : (size_t)p[8] | (size_t)p[9] << 8 | (size_t)p[10] << 16 |
                                   (size_t)p[11] << 24;
    if (*header_len == 0 || *header_len > NPY_MAX_HEADER) {
        set_err(err, err_size, "header length %zu is out of range (1..%u)", *header_len,
                NPY_MAX_HEADER);
        return -1;
    }
    return 0;
}

int npy_parse_header(const void *buf, size_t len, npy_array *a, size_t *data_offset, char *err,
                     size_t err_size)
{
    const unsigned char *p = buf;
    size_t prefix_len = 0, header_len = 0;
    memset(a, 0, sizeof *a);
    if (parse_prefix(p, len, &prefix_len, &header_len, err, err_size) != 0)
        return -1;
    if (len - prefix_len < header_len) {
        set_err(err, err_size, "header length %zu does not fit the %zu bytes present", header_len,
                len - prefix_len);
        return -1;
    }
    if (parse_header((const char *)p + prefix_len, header_len, a, err, err_size) != 0)
        return -1;
    a->count = 1;
    for (int i = 0; i < a->ndim; i++) {
        if (a->shape[i] != 0 && a->count > INT64_MAX / 4 / a->shape[i]) {
            set_err(err, err_size, "array is too large");
            return -1;
        }
        a->count *= a->shape[i];
    }
    *data_offset = prefix_len + header_len;
    return 0;
}

static int read_exact(FILE *f, void *buf, size_t n)
{
    return fread(buf, 1, n, f) == n ? 0 : -1;
}

int npy_read(const char *path, npy_array *out, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    /* A FIFO in the file's place is refused at once, never waited on. */
    FILE *f = msa_open_regular_file(path, err, err_size);
    if (!f)
        return -1;
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        set_err(err, err_size, "%s: cannot stat: %s", path, strerror(errno));
        fclose(f);
        return -1;
    }
    unsigned char pre[12];
    unsigned char *head = NULL;
    npy_array a;
    memset(&a, 0, sizeof a);
    char why[200] = "";
    size_t prefix_len = 0, header_len = 0, data_offset = 0;

    const size_t avail = (uint64_t)st.st_size < sizeof pre ? (size_t)st.st_size : sizeof pre;
    if (read_exact(f, pre, avail) != 0) {
        snprintf(why, sizeof why, "cannot read the header");
        goto fail;
    }
    if (parse_prefix(pre, avail, &prefix_len, &header_len, why, sizeof why) != 0)
        goto fail;
    if ((uint64_t)st.st_size < prefix_len + header_len) {
        snprintf(why, sizeof why, "header length %zu does not fit the file", header_len);
        goto fail;
    }
    const size_t total = prefix_len + header_len;
    head = malloc(total);
    if (!head) {
        snprintf(why, sizeof why, "out of memory for the header");
        goto fail;
    }
    /* A tiny version 1 header may end inside the 12 bytes read so far. */
    const size_t have = avail < total ? avail : total;
    memcpy(head, pre, have);
    if (read_exact(f, head + have, total - have) != 0) {
        snprintf(why, sizeof why, "cannot read the header");
        goto fail;
    }
    if (npy_parse_header(head, total, &a, &data_offset, why, sizeof why) != 0)
        goto fail;
    if (fseek(f, (long)data_offset, SEEK_SET) != 0) {
        snprintf(why, sizeof why, "cannot seek to the data");
        goto fail;
    }

    uint64_t data_bytes = (uint64_t)a.count * 4;
    uint64_t expect = data_offset + data_bytes;
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
    free(head);
    fclose(f);
    *out = a;
    return 0;

fail:
    set_err(err, err_size, "%s: %s", path, why);
    free(a.data);
    free(head);
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

int npy_write(const char *path, npy_type type, int ndim, const int64_t *shape, const void *data,
              char *err, size_t err_size)
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
    int dict_len = snprintf(dict, sizeof dict,
                            "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
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
