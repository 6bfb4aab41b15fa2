/*
 * Strict JSON checks run before cJSON, which is lenient: it stops after the
 * first value (so trailing text or a second object passes), keeps the first
 * of two equal keys where Python's json keeps the last, and reads strings as
 * C strings (so a NUL byte cuts them short).  msa_json_check accepts exactly
 * RFC 8259 text, so that what cJSON then builds is what any other reader of
 * the file sees.  Shared by the library's config loader and the `msa`
 * program's meta.json and workload readers.
 */
#ifndef MSA_JSON_STRICT_H
#define MSA_JSON_STRICT_H

#include <stddef.h>
#include <stdio.h>

/* Deepest nesting of arrays and objects accepted.  Real files nest a few
 * levels; the bound keeps the checker's recursion and cJSON's small. */
#define MSA_JSON_MAX_DEPTH 64

/* Checks that text[0..len) is one JSON value (RFC 8259) surrounded only by
 * whitespace: valid UTF-8 with no overlong forms, no surrogates and nothing
 * above U+10FFFF; no NUL byte, raw or escaped as \u0000; no unpaired
 * surrogate escape; no key twice in one object; at most MSA_JSON_MAX_DEPTH
 * levels of nesting.  Returns 0, or -1 with a message in err that names the
 * byte offset (and the key, for a duplicate). */
int msa_json_check(const char *text, size_t len, char *err, size_t err_size);

/* Opens `path` for reading if and only if it is a regular file.  The open
 * does not block (O_NONBLOCK), so a FIFO or a device in the file's place is
 * refused at once with "not a regular file" instead of waiting for a
 * writer; the check is on the opened descriptor (fstat), so the file cannot
 * be swapped between check and read.  Returns the stream, or NULL with a
 * message in err ("PATH: cannot open: ...", "PATH: not a regular file"). */
FILE *msa_open_regular_file(const char *path, char *err, size_t err_size);

/* Reads the whole regular file `path` (at most max_bytes) into a new
 * buffer with a NUL after the last byte; *len gets the byte count.  Returns
 * NULL with a message in err when the file cannot be opened, is not a
 * regular file, cannot be read or is larger than max_bytes. */
char *msa_read_regular_file(const char *path, size_t max_bytes, size_t *len, char *err,
                            size_t err_size);

#endif
