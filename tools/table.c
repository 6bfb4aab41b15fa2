#include "table.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TABLE_CELL_MAX 64

struct table {
    int ncols;
    int nrows; /* rows started, including the header row */
    int cap_rows;
    int filled;                    /* cells in the current row */
    char (*cells)[TABLE_CELL_MAX]; /* [cap_rows * ncols] */
    int oom;
};

static int table_start_row(table *t)
{
    if (t->nrows == t->cap_rows) {
        int cap = t->cap_rows ? t->cap_rows * 2 : 16;
        void *p = realloc(t->cells, (size_t)cap * (size_t)t->ncols * TABLE_CELL_MAX);
        if (!p) {
            t->oom = 1;
            return -1;
        }
        t->cells = p;
        t->cap_rows = cap;
    }
    memset(t->cells[(size_t)t->nrows * (size_t)t->ncols], 0, (size_t)t->ncols * TABLE_CELL_MAX);
    t->nrows++;
    t->filled = 0;
    return 0;
}

table *table_new(int ncols, const char *const *headers)
{
    table *t = calloc(1, sizeof *t);
    if (!t || ncols <= 0)
        return free(t), NULL;
    t->ncols = ncols;
    if (table_start_row(t) != 0)
        return table_free(t), NULL;
    for (int c = 0; c < ncols; c++)
        table_cell(t, "%s", headers[c]);
    return t;
}

void table_free(table *t)
{
    if (!t)
        return;
    free(t->cells);
    free(t);
}

void table_cell(table *t, const char *fmt, ...)
{
    if (!t || t->oom)
        return;
    if (t->filled == t->ncols && table_start_row(t) != 0)
        return;
    char *cell = t->cells[(size_t)(t->nrows - 1) * (size_t)t->ncols + (size_t)t->filled];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cell, TABLE_CELL_MAX, fmt, ap);
    va_end(ap);
    t->filled++;
}

void table_print(const table *t, FILE *f)
{
    if (!t)
        return;
    if (t->oom) {
        fprintf(f, "(table lost: out of memory)\n");
        return;
    }
    int width[64] = {0};
    int ncols = t->ncols < 64 ? t->ncols : 64;
    for (int r = 0; r < t->nrows; r++)
        for (int c = 0; c < ncols; c++) {
            int w = (int)strlen(t->cells[(size_t)r * (size_t)t->ncols + (size_t)c]);
            if (w > width[c])
                width[c] = w;
        }
    for (int r = 0; r < t->nrows; r++) {
        for (int c = 0; c < ncols; c++) {
            const char *s = t->cells[(size_t)r * (size_t)t->ncols + (size_t)c];
            if (c == 0)
                fprintf(f, "%-*s", width[c], s);
            else
                fprintf(f, "  %*s", width[c], s);
        }
        fputc('\n', f);
        if (r == 0) {
            int total = 0;
            for (int c = 0; c < ncols; c++)
                total += width[c] + (c ? 2 : 0);
            for (int i = 0; i < total; i++)
                fputc('-', f);
            fputc('\n', f);
        }
    }
}

int json_write_file(const char *path, const cJSON *root, char *err, size_t err_size)
{
    char *text = cJSON_Print(root);
    if (!text) {
        snprintf(err, err_size, "%s: out of memory while formatting JSON", path);
        return -1;
    }
    size_t n = strlen(path) + 8;
    char *tmp = malloc(n);
    FILE *f = NULL;
    int ok = 0;
    if (tmp) {
        snprintf(tmp, n, "%s.tmp", path);
        f = fopen(tmp, "w");
    }
    if (f) {
        ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
        ok = (fclose(f) == 0) && ok;
        ok = ok && rename(tmp, path) == 0;
        if (!ok)
            unlink(tmp);
    }
    if (!ok)
        snprintf(err, err_size, "%s: cannot write: %s", path, strerror(errno));
    free(tmp);
    free(text);
    return ok ? 0 : -1;
}
