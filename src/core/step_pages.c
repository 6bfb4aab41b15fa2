/* Page collisions of a step (SPEC section 10): a page that the step writes
 * into must appear only once among all the page-table entries the step uses.
 *
 * Entry (r, n) is logical page n of request r, for n < ceil(kv_len / P).  It
 * is a write entry when the page holds one of the positions
 * [kv_len - q_len, kv_len), that is for n in [(kv_len - q_len) / P,
 * need - 1] when q_len > 0, and a read entry otherwise.  The plan does not
 * know write_cache (it comes with each forward call), so every step is
 * checked as if its entries were written.
 *
 * One bitmap of num_pages bits, allocated with the plan (the pool size is
 * fixed per cache), is all-zero between calls.  The check sets the bit of
 * every write entry's page, finding a page that two write entries share
 * when its bit is already set; then it tests the bit of every read entry's
 * page, finding a page that is read and written; then it clears the bits it
 * set.  That is O(write entries) + O(read entries) bit operations, no
 * allocation, and the step's arrays are only read.  The callers have
 * validated the step before (lengths, page ids inside the pool). */
#include "core/internal.h"

#include <stdlib.h>

static int64_t pages_for(int64_t kv_len, int32_t page_size)
{
    return (kv_len + page_size - 1) / page_size;
}

/* First logical page request r writes into; `need` when it writes none. */
static int64_t first_write(const msa_step *s, int32_t r, int32_t P, int64_t need)
{
    int32_t q = s->q_len[r], kv = s->kv_len[r];
    return q > 0 ? (int64_t)(kv - q) / P : need;
}

msa_status msa_step_pages_init(msa_plan *p)
{
    int64_t words = (p->cache->cfg.num_pages + 63) / 64;
    p->page_marks = msa_alloc_fault() ? NULL : calloc((size_t)words, sizeof *p->page_marks);
    if (!p->page_marks)
        return msa_set_error(p->ctx, MSA_ERR_OUT_OF_MEMORY,
                             "msa_plan_create: out of memory for the page-collision bitmap "
                             "(%lld bytes)",
                             (long long)words * 8);
    return MSA_OK;
}

void msa_step_pages_free(msa_plan *p)
{
    free(p->page_marks);
    p->page_marks = NULL;
}

/* Clears the bits of every write entry's page, set or not, which returns the
 * bitmap to all-zero after a full or a partial marking pass. */
static void clear_writes(uint64_t *marks, const msa_step *s, int32_t P)
{
    for (int32_t r = 0; r < s->num_requests; r++) {
        int64_t need = pages_for(s->kv_len[r], P);
        if (need == 0)
            continue; /* no entries; page_table may be NULL */
        const int32_t *row = s->page_table + (int64_t)r * s->page_table_stride;
        for (int64_t n = first_write(s, r, P, need); n < need; n++)
            marks[row[n] >> 6] = 0;
    }
}

/* The first write entry (in request order, then logical page order) of
 * `page` other than entry (skip_r, skip_n); 0 when there is none. */
static int find_write(const msa_step *s, int32_t P, int32_t page, int32_t skip_r, int64_t skip_n,
                      int32_t *wr, int64_t *wn)
{
    for (int32_t r = 0; r < s->num_requests; r++) {
        int64_t need = pages_for(s->kv_len[r], P);
        if (need == 0)
            continue; /* no entries; page_table may be NULL */
        const int32_t *row = s->page_table + (int64_t)r * s->page_table_stride;
        for (int64_t n = first_write(s, r, P, need); n < need; n++)
            if (row[n] == page && !(r == skip_r && n == skip_n)) {
                *wr = r;
                *wn = n;
                return 1;
            }
    }
    return 0;
}

msa_status msa_step_pages_check(msa_plan *p, const msa_step *s, const char *fn)
{
    const int32_t P = p->cache->cfg.page_size;
    uint64_t *marks = p->page_marks;
    int32_t bad_r = -1, first_r = -1;
    int64_t bad_n = -1, first_n = -1;
    int both_write = 0;

    /* Marks the write entries; a page marked already has two writers. */
    for (int32_t r = 0; r < s->num_requests && bad_r < 0; r++) {
        int64_t need = pages_for(s->kv_len[r], P);
        if (need == 0)
            continue; /* no entries; page_table may be NULL */
        const int32_t *row = s->page_table + (int64_t)r * s->page_table_stride;
        for (int64_t n = first_write(s, r, P, need); n < need; n++) {
            uint32_t pg = (uint32_t)row[n];
            uint64_t bit = UINT64_C(1) << (pg & 63);
            if (marks[pg >> 6] & bit) {
                bad_r = r;
                bad_n = n;
                both_write = 1;
                break;
            }
            marks[pg >> 6] |= bit;
        }
    }
    /* Tests the read entries against the marks. */
    for (int32_t r = 0; r < s->num_requests && bad_r < 0; r++) {
        int64_t need = pages_for(s->kv_len[r], P);
        if (need == 0)
            continue; /* no entries; page_table may be NULL */
        const int32_t *row = s->page_table + (int64_t)r * s->page_table_stride;
        int64_t reads = first_write(s, r, P, need);
        for (int64_t n = 0; n < reads; n++) {
            uint32_t pg = (uint32_t)row[n];
            if (marks[pg >> 6] >> (pg & 63) & 1) {
                bad_r = r;
                bad_n = n;
                break;
            }
        }
    }
    /* Word-wise clearing also zeroes neighbouring bits, which are zero
     * anyway between calls or belong to other write entries cleared here. */
    clear_writes(marks, s, P);
    if (bad_r < 0)
        return MSA_OK;

    /* Names the entry the collision was found at and a write entry of the
     * same page: for two writers the earlier one, for a read the first. */
    int32_t page = s->page_table[(int64_t)bad_r * s->page_table_stride + bad_n];
    if (!find_write(s, P, page, bad_r, bad_n, &first_r, &first_n)) {
        first_r = bad_r; /* not reached: a marked page has a write entry */
        first_n = bad_n;
    }
    return msa_set_error(p->ctx, MSA_ERR_INVALID_ARGUMENT,
                         "%s: request %d writes page %d (logical page %lld), which "
                         "request %d also %s "
                         "(logical page %lld); a page the step writes into must appear once among "
                         "the step's page-table entries",
                         fn, first_r, page, (long long)first_n, bad_r,
                         both_write ? "writes" : "uses", (long long)bad_n);
}
