/*
 * Result output: aligned text tables for people, JSON files for programs.
 */
#ifndef MSA_TOOLS_TABLE_H
#define MSA_TOOLS_TABLE_H

#include <stdio.h>

#include <cjson/cJSON.h>

typedef struct table table;

/* A table with `ncols` columns; headers are copied.  NULL on out of memory. */
table *table_new(int ncols, const char *const *headers);
void table_free(table *t);
/* Appends a cell to the current row; the row ends after ncols cells. */
void table_cell(table *t, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Prints with columns right-aligned except the first (a name column). */
void table_print(const table *t, FILE *f);

/* Writes `root` to `path` through a temporary file and a rename, so a
 * reader never sees half a file.  Returns 0, or -1 with a message. */
int json_write_file(const char *path, const cJSON *root, char *err, size_t err_size);

#endif
