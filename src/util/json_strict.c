/* Strict JSON pre-check (RFC 8259) and regular-file reading; see json_strict.h. */
#include "util/json_strict.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A key of an open object: its decoded bytes in the arena and where it
 * starts in the text. */
typedef struct key_ref {
    size_t off, len; /* in the arena */
    size_t at;       /* byte offset of the opening quote */
    const char *p;   /* arena + off, set just before sorting */
} key_ref;

typedef struct checker {
    const unsigned char *s;
    size_t len, pos;
    char *err;
    size_t err_size;
    /* Decoded keys of every object still open, innermost last. */
    char *arena;
    size_t arena_len, arena_cap;
    key_ref *keys;
    size_t num_keys, keys_cap;
} checker;

static int fail_at(checker *c, size_t at, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int fail_at(checker *c, size_t at, const char *fmt, ...)
{
    if (!c->err || c->err_size == 0)
        return -1;
    int n = snprintf(c->err, c->err_size, "byte offset %zu: ", at);
    if (n >= 0 && (size_t)n < c->err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err + n, c->err_size - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static void skip_ws(checker *c)
{
    while (c->pos < c->len) {
        unsigned char b = c->s[c->pos];
        if (b != ' ' && b != '\t' && b != '\n' && b != '\r')
            return;
        c->pos++;
    }
}

/* Describes an unexpected byte for a message. */
static int unexpected(checker *c, const char *wanted)
{
    if (c->pos >= c->len)
        return fail_at(c, c->pos, "the text ends where %s was expected", wanted);
    unsigned char b = c->s[c->pos];
    if (b == 0)
        return fail_at(c, c->pos, "NUL byte where %s was expected", wanted);
    if (b >= 0x21 && b < 0x7f)
        return fail_at(c, c->pos, "unexpected '%c' where %s was expected", b, wanted);
    return fail_at(c, c->pos, "unexpected byte 0x%02X where %s was expected", b, wanted);
}

/* Length of the valid UTF-8 sequence at s[0..n) whose lead byte is >= 0x80,
 * or 0 with *why set.  Table 3-7 of the Unicode standard: the second byte's
 * range excludes overlong forms (E0, F0), surrogates (ED) and code points
 * above U+10FFFF (F4). */
static size_t utf8_sequence(const unsigned char *s, size_t n, const char **why)
{
    unsigned char b = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b < 0xC2) {
        *why = b < 0xC0 ? "a continuation byte without a lead byte" : "an overlong encoding";
        return 0;
    }
    if (b < 0xE0) {
        need = 2;
    } else if (b < 0xF0) {
        need = 3;
        if (b == 0xE0)
            lo = 0xA0;
        else if (b == 0xED)
            hi = 0x9F;
    } else if (b < 0xF5) {
        need = 4;
        if (b == 0xF0)
            lo = 0x90;
        else if (b == 0xF4)
            hi = 0x8F;
    } else {
        *why = "a byte that never occurs in UTF-8";
        return 0;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= n || s[i] < 0x80 || s[i] > 0xBF) {
            *why = "a truncated sequence";
            return 0;
        }
        if (i == 1 && (s[1] < lo || s[1] > hi)) {
            *why = b == 0xED   ? "a surrogate (U+D800..U+DFFF) encoded in UTF-8"
                   : b == 0xF4 ? "a code point above U+10FFFF"
                               : "an overlong encoding";
            return 0;
        }
    }
    return need;
}

static int arena_put(checker *c, const unsigned char *bytes, size_t n)
{
    if (c->arena_len + n > c->arena_cap) {
        size_t cap = c->arena_cap ? c->arena_cap : 256;
        while (cap < c->arena_len + n)
            cap *= 2;
        char *a = realloc(c->arena, cap);
        if (!a)
            return fail_at(c, c->pos, "out of memory");
        c->arena = a;
        c->arena_cap = cap;
    }
    memcpy(c->arena + c->arena_len, bytes, n);
    c->arena_len += n;
    return 0;
}

static int hex4(const unsigned char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char h = p[i];
        unsigned d;
        if (h >= '0' && h <= '9')
            d = (unsigned)(h - '0');
        else if (h >= 'a' && h <= 'f')
            d = (unsigned)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F')
            d = (unsigned)(h - 'A' + 10);
        else
            return -1;
        v = v << 4 | d;
    }
    *out = v;
    return 0;
}

/* A string at c->pos (the opening quote).  With `keep`, its decoded bytes
 * are appended to the arena, so that keys compare as Python compares them
 * ("a" and "\u0061" are the same key). */
static int check_string(checker *c, int keep)
{
    c->pos++;
    for (;;) {
        if (c->pos >= c->len)
            return fail_at(c, c->pos, "the text ends inside a string");
        const size_t at = c->pos;
        unsigned char b = c->s[at];
        if (b == '"') {
            c->pos++;
            return 0;
        }
        if (b == 0)
            return fail_at(c, at, "NUL byte inside a string");
        if (b < 0x20)
            return fail_at(c, at, "control byte 0x%02X inside a string (write it as an escape)", b);
        if (b >= 0x80) {
            const char *why = "";
            size_t n = utf8_sequence(c->s + at, c->len - at, &why);
            if (n == 0)
                return fail_at(c, at, "invalid UTF-8 (%s)", why);
            if (keep && arena_put(c, c->s + at, n) != 0)
                return -1;
            c->pos += n;
            continue;
        }
        if (b != '\\') {
            if (keep && arena_put(c, &b, 1) != 0)
                return -1;
            c->pos++;
            continue;
        }
        if (at + 1 >= c->len)
            return fail_at(c, at, "the text ends inside a string");
        unsigned char e = c->s[at + 1];
        static const char simple_in[] = "\"\\/bfnrt", simple_out[] = "\"\\/\b\f\n\r\t";
        const char *k = e ? strchr(simple_in, e) : NULL;
        if (k) {
            unsigned char o = (unsigned char)simple_out[k - simple_in];
            if (keep && arena_put(c, &o, 1) != 0)
                return -1;
            c->pos += 2;
            continue;
        }
        if (e != 'u')
            return fail_at(c, at, "invalid escape in a string");
        unsigned u, u2 = 0;
        if (at + 6 > c->len || hex4(c->s + at + 2, &u) != 0)
            return fail_at(c, at, "\\u needs four hexadecimal digits");
        size_t used = 6;
        if (u == 0)
            return fail_at(c, at, "escaped NUL (\\u0000) inside a string");
        if (u >= 0xDC00 && u <= 0xDFFF)
            return fail_at(c, at, "unpaired surrogate escape \\u%04X", u);
        if (u >= 0xD800 && u <= 0xDBFF) {
            if (at + 12 > c->len || c->s[at + 6] != '\\' || c->s[at + 7] != 'u' ||
                hex4(c->s + at + 8, &u2) != 0 || u2 < 0xDC00 || u2 > 0xDFFF)
                return fail_at(c, at, "unpaired surrogate escape \\u%04X", u);
            u = 0x10000 + ((u - 0xD800) << 10) + (u2 - 0xDC00);
            used = 12;
        }
        if (keep) {
            unsigned char o[4];
            size_t n;
            if (u < 0x80) {
                o[0] = (unsigned char)u;
                n = 1;
            } else if (u < 0x800) {
                o[0] = (unsigned char)(0xC0 | u >> 6);
                o[1] = (unsigned char)(0x80 | (u & 0x3F));
                n = 2;
            } else if (u < 0x10000) {
                o[0] = (unsigned char)(0xE0 | u >> 12);
                o[1] = (unsigned char)(0x80 | (u >> 6 & 0x3F));
                o[2] = (unsigned char)(0x80 | (u & 0x3F));
                n = 3;
            } else {
                o[0] = (unsigned char)(0xF0 | u >> 18);
                o[1] = (unsigned char)(0x80 | (u >> 12 & 0x3F));
                o[2] = (unsigned char)(0x80 | (u >> 6 & 0x3F));
                o[3] = (unsigned char)(0x80 | (u & 0x3F));
                n = 4;
            }
            if (arena_put(c, o, n) != 0)
                return -1;
        }
        c->pos += used;
    }
}

static int is_digit(const checker *c)
{
    return c->pos < c->len && c->s[c->pos] >= '0' && c->s[c->pos] <= '9';
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static int check_number(checker *c)
{
    const size_t at = c->pos;
    if (c->s[c->pos] == '-')
        c->pos++;
    if (!is_digit(c))
        return fail_at(c, at, "malformed number");
    if (c->s[c->pos] == '0') {
        c->pos++;
        if (is_digit(c))
            return fail_at(c, at, "malformed number (leading zero)");
    } else {
        while (is_digit(c))
            c->pos++;
    }
    if (c->pos < c->len && c->s[c->pos] == '.') {
        c->pos++;
        if (!is_digit(c))
            return fail_at(c, at, "malformed number (no digit after '.')");
        while (is_digit(c))
            c->pos++;
    }
    if (c->pos < c->len && (c->s[c->pos] == 'e' || c->s[c->pos] == 'E')) {
        c->pos++;
        if (c->pos < c->len && (c->s[c->pos] == '+' || c->s[c->pos] == '-'))
            c->pos++;
        if (!is_digit(c))
            return fail_at(c, at, "malformed number (no digit in the exponent)");
        while (is_digit(c))
            c->pos++;
    }
    return 0;
}

static int cmp_key(const void *pa, const void *pb)
{
    const key_ref *a = pa, *b = pb;
    size_t n = a->len < b->len ? a->len : b->len;
    int r = memcmp(a->p, b->p, n);
    if (r == 0)
        r = (a->len > b->len) - (a->len < b->len);
    if (r == 0)
        r = (a->at > b->at) - (a->at < b->at);
    return r;
}

/* Fails when two keys of the object whose keys are keys[base..] are equal;
 * names the later occurrence that comes first in the text, and `where` the
 * object is. */
static int check_duplicates(checker *c, size_t base, const char *where)
{
    size_t n = c->num_keys - base;
    if (n < 2)
        return 0;
    key_ref *k = c->keys + base;
    /* Keys that are all empty leave the arena unallocated: point them at
     * an empty string rather than offset a null pointer. */
    for (size_t i = 0; i < n; i++)
        k[i].p = c->arena ? c->arena + k[i].off : "";
    qsort(k, n, sizeof *k, cmp_key);
    const key_ref *dup = NULL;
    for (size_t i = 1; i < n; i++)
        if (k[i].len == k[i - 1].len && memcmp(k[i].p, k[i - 1].p, k[i].len) == 0 &&
            (!dup || k[i].at < dup->at))
            dup = &k[i];
    if (!dup)
        return 0;
    char name[80];
    size_t m = 0;
    for (size_t i = 0; i < dup->len && m + 4 < sizeof name; i++) {
        unsigned char b = (unsigned char)dup->p[i];
        name[m++] = b >= 0x20 && b != 0x7f ? (char)b : '?';
    }
    if (m < dup->len) {
        memcpy(name + m, "...", 3);
        m += 3;
    }
    name[m] = '\0';
    return fail_at(c, dup->at, "duplicate key \"%s\" %s", name, where);
}

static int check_value(checker *c, int depth, const char *parent, size_t parent_len);

static int check_object(checker *c, int depth, const char *parent, size_t parent_len)
{
    const size_t obj_at = c->pos;
    const size_t base = c->num_keys, arena_base = c->arena_len;
    c->pos++;
    skip_ws(c);
    if (c->pos < c->len && c->s[c->pos] == '}') {
        c->pos++;
        return 0;
    }
    for (;;) {
        skip_ws(c);
        if (c->pos >= c->len || c->s[c->pos] != '"')
            return unexpected(c, "a key (a string)");
        if (c->num_keys == c->keys_cap) {
            size_t cap = c->keys_cap ? c->keys_cap * 2 : 32;
            key_ref *k = realloc(c->keys, cap * sizeof *k);
            if (!k)
                return fail_at(c, c->pos, "out of memory");
            c->keys = k;
            c->keys_cap = cap;
        }
        key_ref *key = &c->keys[c->num_keys];
        key->at = c->pos;
        key->off = c->arena_len;
        if (check_string(c, 1) != 0)
            return -1;
        key->len = c->arena_len - key->off;
        c->num_keys++;
        /* The raw key (without quotes) names the member's value in messages. */
        const char *raw = (const char *)c->s + key->at + 1;
        const size_t raw_len = c->pos - key->at - 2;
        skip_ws(c);
        if (c->pos >= c->len || c->s[c->pos] != ':')
            return unexpected(c, "':'");
        c->pos++;
        if (check_value(c, depth, raw, raw_len > 64 ? 64 : raw_len) != 0)
            return -1;
        skip_ws(c);
        if (c->pos < c->len && c->s[c->pos] == ',') {
            c->pos++;
            continue;
        }
        if (c->pos < c->len && c->s[c->pos] == '}') {
            c->pos++;
            break;
        }
        return unexpected(c, "',' or '}'");
    }
    if (c->num_keys - base >= 2) {
        char where[112];
        if (parent)
            snprintf(where, sizeof where, "in \"%.*s\"", (int)parent_len, parent);
        else if (depth == 1)
            snprintf(where, sizeof where, "at the top level");
        else
            snprintf(where, sizeof where, "in the object at byte offset %zu", obj_at);
        if (check_duplicates(c, base, where) != 0)
            return -1;
    }
    c->num_keys = base;
    c->arena_len = arena_base;
    return 0;
}

static int check_array(checker *c, int depth)
{
    c->pos++;
    skip_ws(c);
    if (c->pos < c->len && c->s[c->pos] == ']') {
        c->pos++;
        return 0;
    }
    for (;;) {
        if (check_value(c, depth, NULL, 0) != 0)
            return -1;
        skip_ws(c);
        if (c->pos < c->len && c->s[c->pos] == ',') {
            c->pos++;
            continue;
        }
        if (c->pos < c->len && c->s[c->pos] == ']') {
            c->pos++;
            return 0;
        }
        return unexpected(c, "',' or ']'");
    }
}

static int check_word(checker *c, const char *word)
{
    size_t n = strlen(word);
    if (c->len - c->pos < n || memcmp(c->s + c->pos, word, n) != 0)
        return unexpected(c, "a value");
    c->pos += n;
    return 0;
}

/* One value at c->pos (after whitespace).  `parent` is the key whose value
 * this is, NULL for array elements and the top level. */
static int check_value(checker *c, int depth, const char *parent, size_t parent_len)
{
    skip_ws(c);
    if (c->pos >= c->len)
        return unexpected(c, "a value");
    unsigned char b = c->s[c->pos];
    if (b == '{' || b == '[') {
        if (depth >= MSA_JSON_MAX_DEPTH)
            return fail_at(c, c->pos, "nesting deeper than %d levels", MSA_JSON_MAX_DEPTH);
        return b == '{' ? check_object(c, depth + 1, parent, parent_len)
                        : check_array(c, depth + 1);
    }
    if (b == '"')
        return check_string(c, 0);
    if (b == '-' || (b >= '0' && b <= '9'))
        return check_number(c);
    if (b == 't')
        return check_word(c, "true");
    if (b == 'f')
        return check_word(c, "false");
    if (b == 'n')
        return check_word(c, "null");
    return unexpected(c, "a value");
}

int msa_json_check(const char *text, size_t len, char *err, size_t err_size)
{
    if (err && err_size)
        err[0] = '\0';
    checker c;
    memset(&c, 0, sizeof c);
    c.s = (const unsigned char *)text;
    c.len = text ? len : 0;
    c.err = err;
    c.err_size = err_size;
    int rc = check_value(&c, 0, NULL, 0);
    if (rc == 0) {
        skip_ws(&c);
        if (c.pos < c.len)
            rc = c.s[c.pos] == 0 ? fail_at(&c, c.pos, "NUL byte after the value")
                                 : fail_at(&c, c.pos,
                                           "unexpected text after the value "
                                           "(only whitespace may follow it)");
    }
    free(c.arena);
    free(c.keys);
    return rc;
}

/* ---- files -------------------------------------------------------------- */

static void set_err(char *err, size_t err_size, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static void set_err(char *err, size_t err_size, const char *fmt, ...)
{
    if (!err || err_size == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
}

static const char *file_kind(mode_t m)
{
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISSOCK(m))
        return "a socket";
    return "not a plain file";
}

FILE *msa_open_regular_file(const char *path, char *err, size_t err_size)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        set_err(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        set_err(err, err_size, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        set_err(err, err_size, "%s: not a regular file (%s)", path, file_kind(st.st_mode));
        close(fd);
        return NULL;
    }
    /* Reads of a regular file never block; the flag is cleared all the same
     * so that the stream behaves as one opened by fopen. */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        set_err(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        set_err(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

char *msa_read_regular_file(const char *path, size_t max_bytes, size_t *len, char *err,
                            size_t err_size)
{
    FILE *f = msa_open_regular_file(path, err, err_size);
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    int too_large = 0;
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1)
            break;
        if (n > max_bytes) {
            too_large = 1;
            break;
        }
        char *grown = realloc(buf, cap * 2);
        if (!grown) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = grown;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (buf && !too_large && n > max_bytes)
        too_large = 1;
    if (!buf || bad || too_large) {
        free(buf);
        if (too_large)
            set_err(err, err_size, "%s: larger than %zu bytes", path, max_bytes);
        else if (bad)
            set_err(err, err_size, "%s: read error", path);
        else
            set_err(err, err_size, "%s: out of memory", path);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}
