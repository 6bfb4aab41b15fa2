/*
 * The CUDA backend's host scheduler (src/cuda/schedule.c, plain C: this
 * test runs in every build, without a GPU): cu_sched_size and
 * cu_sched_fill run on hand-built plans over a grid of batches, query
 * lengths, contexts and device sizes, and every schedule is held to what
 * the kernels rely on:
 *   - every (decode request, token, head) row of every pass is covered by
 *     the splits of its chunk exactly once each, every decode token is one
 *     compact decode row and every prefill token one prefill token row;
 *   - each (decode request, KV head, 64-row chunk) is covered by splits
 *     0 .. S-1 exactly once, with the request's lengths in every item;
 *   - a chunk with S > 1 has one merge item with the same rows and splits,
 *     and the partial-row ranges of all chunks are disjoint and in bounds;
 *   - the Hopper units (att_units) cover every sparse item once, a pair
 *     being two chunks of one (request, KV head, split) whose rows follow
 *     each other; pairs are all or none per step;
 *   - the units' runs per CTA (att_cta) partition them, largest first,
 *     and no CTA's estimated cost exceeds the mean by more than one unit;
 *   - with split units on the Hopper path, at most one unit per SM;
 *   - no list exceeds its capacity;
 *   - the per-row facts the kernels load in one piece (tok_info, dec_row,
 *     a merge item's t0) equal what the plan's arrays say;
 *   - the indexer's block list holds exactly the decode requests of more
 *     than K blocks, end to end (the others select every block);
 *   - splits stay within the policy's limits (one unit per SM on the
 *     Hopper kernel, about two items per CTA elsewhere);
 *   - prefill tiles cover each prefill token once, last tile first;
 *   - a step beyond the sized capacities is refused with nothing written;
 *   - a step whose page table is on the device leaves the table and the
 *     rows' pages alone (plan.cu fills them on the device).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/schedule.h"

static int g_failed = 0, g_checks = 0;

#define EXPECT(cond, ...)                                   \
    do {                                                    \
        ++g_checks;                                         \
        if (!(cond)) {                                      \
            if (g_failed < 20) {                            \
                printf("FAIL %s:%d: ", __FILE__, __LINE__); \
                printf(__VA_ARGS__);                        \
                printf("\n");                               \
            }                                               \
            ++g_failed;                                     \
        }                                                   \
    } while (0)

static int cmp_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

typedef struct sched_case {
    int sms, tma, batch, q, ctx, prefill;
} sched_case;

/* Items of one pass checked against the plan. */
static void check_kind(const msa_plan *plan, const cu_sched_sizes *sz, const cu_meta *h, int kind,
                       int32_t groups, int32_t g, int one_round, const char *what)
{
    const int32_t n_items = h->hdr->n_att[kind], n_merge = h->hdr->n_merge[kind];
    const cu_att_item *items = h->att[kind];
    const cu_merge_item *merges = h->merge[kind];
    EXPECT(n_items <= sz->att_cap, "%s: %d items > capacity %d", what, n_items, sz->att_cap);
    EXPECT(n_merge <= sz->merge_cap, "%s: %d merges > capacity %d", what, n_merge, sz->merge_cap);

    /* Coverage: count the items of each (slot, group, chunk, split). */
    const int32_t n_dec = h->hdr->n_dec;
    const int32_t chunks_max = (CU_DEC_MAX_Q * g + CU_ROWS_PER_ITEM - 1) / CU_ROWS_PER_ITEM;
    const size_t ncells = (size_t)n_dec * groups * chunks_max;
    int32_t *nsplit = (int32_t *)calloc(ncells ? ncells : 1, sizeof(int32_t));
    /* (cell, split) keys, sorted below: each cell must list 0 .. S-1. */
    uint64_t *keys = (uint64_t *)calloc(n_items ? (size_t)n_items : 1, sizeof(uint64_t));
    int32_t n_keys = 0;
    for (int32_t i = 0; i < n_items; ++i) {
        const cu_att_item *it = &items[i];
        EXPECT(it->dec >= 0 && it->dec < n_dec && it->group >= 0 && it->group < groups,
               "%s: item %d slot %d group %d", what, i, it->dec, it->group);
        if (!(it->dec >= 0 && it->dec < n_dec && it->group >= 0 && it->group < groups))
            continue;
        const int32_t r = h->dec_req[it->dec];
        const int32_t rows = plan->q_len[r] * g;
        EXPECT(it->r == r && it->ql == plan->q_len[r] && it->kl == plan->kv_len[r] &&
                   it->t0 == (int32_t)plan->q_start[r],
               "%s: item %d lengths", what, i);
        EXPECT(it->row0 % CU_ROWS_PER_ITEM == 0 && it->row0 < rows, "%s: item %d row0 %d", what, i,
               it->row0);
        const int32_t want_rows = rows - it->row0 < CU_ROWS_PER_ITEM ? rows - it->row0
                                                                     : CU_ROWS_PER_ITEM;
        EXPECT(it->nrows == want_rows, "%s: item %d rows %d, want %d", what, i, it->nrows,
               want_rows);
        EXPECT(it->nsplit >= 1 && it->split >= 0 && it->split < it->nsplit,
               "%s: item %d split %d of %d", what, i, it->split, it->nsplit);
        const size_t cell =
            ((size_t)it->dec * groups + it->group) * chunks_max + it->row0 / CU_ROWS_PER_ITEM;
        if (nsplit[cell] == 0)
            nsplit[cell] = it->nsplit;
        EXPECT(nsplit[cell] == it->nsplit, "%s: chunk with mixed split counts", what);
        keys[n_keys++] = ((uint64_t)cell << 24) | (uint64_t)(it->split & 0xffffff);
    }
    qsort(keys, (size_t)n_keys, sizeof(uint64_t), cmp_u64);
    int32_t next_split = 0;
    for (int32_t i = 0; i < n_keys; ++i) {
        const uint64_t cell = keys[i] >> 24;
        if (i > 0 && (keys[i - 1] >> 24) != cell)
            next_split = 0;
        const int32_t split = (int32_t)(keys[i] & 0xffffff);
        EXPECT(split == next_split, "%s: chunk %llu: split %d where %d belongs (missing or twice)",
               what, (unsigned long long)cell, split, next_split);
        next_split = split + 1;
        if (i + 1 == n_keys || (keys[i + 1] >> 24) != cell)
            EXPECT(next_split == nsplit[cell], "%s: chunk %llu has %d of %d splits", what,
                   (unsigned long long)cell, next_split, nsplit[cell]);
    }
    for (int32_t k = 0; k < n_dec; ++k) {
        const int32_t rows = plan->q_len[h->dec_req[k]] * g;
        for (int32_t grp = 0; grp < groups; ++grp)
            for (int32_t c = 0; c < chunks_max; ++c) {
                const size_t cell = ((size_t)k * groups + grp) * chunks_max + c;
                const int32_t S = nsplit[cell];
                if (c * CU_ROWS_PER_ITEM >= rows) {
                    EXPECT(S == 0, "%s: items past the rows of slot %d", what, k);
                    continue;
                }
                EXPECT(S >= 1, "%s: slot %d group %d chunk %d not covered", what, k, grp, c);
            }
    }

    /* Rows: each (decode slot, KV head, token x head row) is computed by
     * each split of its chunk once, so it is counted nsplit times, and
     * no row past the request's tokens is. */
    {
        const int32_t rows_max = CU_DEC_MAX_Q * g;
        int32_t *row_count =
            (int32_t *)calloc((size_t)(n_dec ? n_dec : 1) * groups * rows_max, sizeof(int32_t));
        for (int32_t i = 0; i < n_items; ++i) {
            const cu_att_item *it = &items[i];
            if (!(it->dec >= 0 && it->dec < n_dec && it->group >= 0 && it->group < groups))
                continue;
            for (int32_t row = it->row0; row < it->row0 + it->nrows && row < rows_max; ++row)
                ++row_count[((size_t)it->dec * groups + it->group) * rows_max + row];
        }
        int32_t bad = 0;
        for (int32_t k = 0; k < n_dec; ++k) {
            const int32_t rows = plan->q_len[h->dec_req[k]] * g;
            for (int32_t grp = 0; grp < groups; ++grp)
                for (int32_t row = 0; row < rows_max; ++row) {
                    const size_t cell =
                        ((size_t)k * groups + grp) * chunks_max + row / CU_ROWS_PER_ITEM;
                    const int32_t want = row < rows ? nsplit[cell] : 0;
                    bad += row_count[((size_t)k * groups + grp) * rows_max + row] != want ||
                           (row < rows && want < 1);
                }
        }
        EXPECT(bad == 0, "%s: %d rows not covered exactly once by each split", what, bad);
        free(row_count);
    }

    /* Splits within the policy: the Hopper kernel (one CTA per SM) at
     * most one unit per SM once split, elsewhere about two items per CTA
     * of the grid; never more splits than the key tiles allow. */
    {
        int64_t n_units = 0;
        const int pair = one_round && kind == CU_KIND_SPARSE;
        for (int32_t k = 0; k < n_dec; ++k) {
            const int32_t chunks =
                (plan->q_len[h->dec_req[k]] * g + CU_ROWS_PER_ITEM - 1) / CU_ROWS_PER_ITEM;
            n_units += (int64_t)groups * (pair ? (chunks + 1) / 2 : chunks);
        }
        const int64_t target = 2 * (int64_t)sz->grid_att_fast;
        int64_t limit = 1;
        if (one_round)
            limit = n_units == 0 || n_units >= sz->num_sms ? 1 : sz->num_sms / n_units;
        else
            limit = n_units == 0 || n_units >= target ? 1 : (target + n_units - 1) / n_units;
        int32_t over = 0;
        for (int32_t i = 0; i < n_items; ++i)
            over += items[i].nsplit > limit;
        EXPECT(over == 0, "%s: %d items split beyond %lld (%lld units)", what, over,
               (long long)limit, (long long)n_units);
    }

    /* Merges: one per split chunk, partial ranges disjoint and in bounds. */
    int32_t split_chunks = 0;
    for (size_t cell = 0; cell < ncells; ++cell)
        split_chunks += nsplit[cell] > 1;
    EXPECT(n_merge == split_chunks, "%s: %d merges for %d split chunks", what, n_merge,
           split_chunks);
    char *used = (char *)calloc((size_t)sz->part_rows_cap, 1);
    for (int32_t i = 0; i < n_merge; ++i) {
        const cu_merge_item *merge = &merges[i];
        const int64_t end = (int64_t)merge->part_base + (int64_t)merge->nsplit * merge->nrows;
        EXPECT(merge->part_base >= 0 && end <= sz->part_rows_cap, "%s: merge %d rows out of bounds",
               what, i);
        if (merge->part_base >= 0 && end <= sz->part_rows_cap)
            for (int64_t p = merge->part_base; p < end; ++p) {
                EXPECT(!used[p], "%s: partial row %lld used twice", what, (long long)p);
                used[p] = 1;
            }
        int found = 0;
        for (int32_t j = 0; j < n_items; ++j) {
            const cu_att_item *it = &items[j];
            if (it->dec == merge->dec && it->group == merge->group && it->row0 == merge->row0) {
                EXPECT(merge->t0 == it->t0, "%s: merge %d first token row %d, item's %d", what, i,
                       merge->t0, it->t0);
                found += it->nsplit == merge->nsplit && it->nrows == merge->nrows &&
                         it->part_base == merge->part_base;
            }
        }
        EXPECT(found == merge->nsplit, "%s: merge %d matches %d of %d splits", what, i, found,
               merge->nsplit);
    }
    free(used);
    free(nsplit);
    free(keys);
}

/* Token rows and decode rows against the plan (page table included). */
static void check_rows(const msa_plan *plan, const cu_meta *h)
{
    const int32_t B = plan->model->cfg.block_size, P = plan->cache->cfg.page_size;
    for (int64_t t = 0; t < plan->num_tokens; ++t) {
        const cu_tok_info *ti = &h->tok_info[t];
        const int32_t r = plan->token_request[t];
        const int64_t pos = plan->token_pos[t];
        const int32_t page =
            r >= 0 ? plan->page_table[(int64_t)r * plan->cap_pages_per_request + pos / P] : -1;
        EXPECT(ti->r == r && ti->pos == (int32_t)pos && ti->page == page,
               "token %lld: info (%d, %d, %d), want (%d, %lld, %d)", (long long)t, ti->r, ti->pos,
               ti->page, r, (long long)pos, page);
    }
    int32_t d = 0, max_nblk = 0;
    for (int32_t k = 0; k < h->hdr->n_dec; ++k) {
        const int32_t r = h->dec_req[k];
        for (int32_t i = 0; i < plan->q_len[r]; ++i, ++d) {
            const cu_dec_row *dr = &h->dec_row[d];
            const int64_t t = plan->q_start[r] + i;
            EXPECT(dr->t == (int32_t)t && dr->nblk == (int32_t)(plan->token_pos[t] / B) + 1 &&
                       dr->slot == k && dr->ql == plan->q_len[r],
                   "decode row %d: (%d, %d, %d, %d)", d, dr->t, dr->nblk, dr->slot, dr->ql);
            if (dr->nblk > max_nblk)
                max_nblk = dr->nblk;
        }
    }
    EXPECT(d == h->hdr->n_dec_rows, "%d decode rows listed, header says %d", d, h->hdr->n_dec_rows);
    /* Every token of a prefill request once in the prefill token rows, in
     * order, and no other. */
    {
        int32_t n = 0;
        for (int32_t r = 0; r < plan->num_requests; ++r) {
            if (plan->q_len[r] <= CU_DEC_MAX_Q)
                continue;
            for (int32_t i = 0; i < plan->q_len[r]; ++i, ++n)
                EXPECT(n < h->hdr->n_pf && h->pf_tok[n] == (int32_t)(plan->q_start[r] + i),
                       "prefill token row %d: %d, want %lld", n,
                       n < h->hdr->n_pf ? h->pf_tok[n] : -1, (long long)(plan->q_start[r] + i));
        }
        EXPECT(n == h->hdr->n_pf, "%d prefill token rows, header says %d", n, h->hdr->n_pf);
    }
    /* The indexer's blocks, end to end: only requests with more than K
     * blocks (at most K: all selected, their scores never read). */
    int32_t blocks = 0;
    for (int32_t k = 0; k < h->hdr->n_dec; ++k) {
        const cu_dec_info *di = &h->dec_info[k];
        const int32_t nb = (plan->kv_len[h->dec_req[k]] + B - 1) / B;
        const int32_t want = nb > plan->model->cfg.topk_blocks ? nb : 0;
        EXPECT(h->dec_blk0[k] == blocks && di->blk0 == blocks && di->blk1 == blocks + want,
               "decode slot %d (%d blocks): indexer blocks [%d, %d), prefix %d, want [%d, %d)", k,
               nb, di->blk0, di->blk1, h->dec_blk0[k], blocks, blocks + want);
        /* Its reach, for the selection's test of who builds its unions. */
        EXPECT(di->nblk == nb, "decode slot %d: reach %d blocks, want %d", k, di->nblk, nb);
        blocks += want;
    }
    EXPECT(h->dec_blk0[h->hdr->n_dec] == blocks && h->hdr->total_dec_blocks == blocks,
           "indexer blocks: prefix end %d, total %d, want %d", h->dec_blk0[h->hdr->n_dec],
           h->hdr->total_dec_blocks, blocks);
    /* The selection picks its mode (a CTA or a warp per row) from it. */
    EXPECT(h->hdr->max_dec_nblk == max_nblk, "largest decode row reach %d, want %d",
           h->hdr->max_dec_nblk, max_nblk);
}

/* Estimated cost of a unit as the balancing takes it: its tokens' union
 * tiles at most, shared by the splits, and two more (cu_sched_items). */
static int64_t unit_cost(const msa_model *model, const cu_att_item *a)
{
    const int64_t rows = a->nrows + (a->unit_len == 2 ? a[1].nrows : 0);
    const int64_t utok = (rows + model->group - 1) / model->group;
    const int64_t B = model->cfg.block_size;
    const int64_t reach = (a->kl + B - 1) / B;
    const int64_t blk = reach < utok * model->topk_width ? reach : utok * model->topk_width;
    const int64_t tiles = (blk * B + CU_TILE_KEYS - 1) / CU_TILE_KEYS;
    return (tiles + a->nsplit - 1) / a->nsplit + 2;
}

/* The Hopper units of the sparse pass. */
static void check_units(const msa_model *model, const cu_sched_sizes *sz, const cu_meta *h,
                        int on_tma)
{
    const int32_t n_items = h->hdr->n_att[CU_KIND_SPARSE];
    const int32_t n_units = h->hdr->n_att_units;
    const cu_att_item *items = h->att[CU_KIND_SPARSE];
    int32_t pairs = 0, pairable = 0, split_units = 0, covered = 0;
    int32_t *seen = (int32_t *)calloc(n_items ? (size_t)n_items : 1, sizeof(int32_t));
    for (int32_t u = 0; u < n_units; ++u) {
        const int32_t first = h->att_units[u];
        EXPECT(first >= 0 && first < n_items, "unit %d starts at item %d of %d", u, first, n_items);
        if (first < 0 || first >= n_items)
            break;
        const cu_att_item *a = &items[first];
        EXPECT(a->unit_len == 1 || a->unit_len == 2, "unit %d length %d", u, a->unit_len);
        split_units += a->nsplit > 1;
        ++seen[first];
        ++covered;
        if (a->unit_len == 2) {
            EXPECT(first + 1 < n_items, "unit %d pair past the items", u);
            if (first + 1 >= n_items)
                break;
            const cu_att_item *b = &items[first + 1];
            EXPECT(b->unit_len == 0 && b->dec == a->dec && b->group == a->group &&
                       b->split == a->split && b->nsplit == a->nsplit && a->nrows == 64 &&
                       b->row0 == a->row0 + 64,
                   "unit %d: items %d and %d do not form a pair", u, first, first + 1);
            ++seen[first + 1];
            ++covered;
            ++pairs;
        } else if (a->nrows == 64 && a->row0 + 64 < a->ql * 16 && (a->row0 / 64) % 2 == 0) {
            ++pairable; /* a chunk left alone though a second one follows it */
        }
    }
    int32_t once = 0;
    for (int32_t i = 0; i < n_items; ++i)
        once += seen[i] == 1;
    EXPECT(covered == n_items && once == n_items, "units cover %d of %d items (%d once)", covered,
           n_items, once);
    free(seen);
    EXPECT(pairs == 0 || pairable == 0, "step mixes pairs (%d) and pairable singles (%d)", pairs,
           pairable);
    if (on_tma && split_units > 0)
        EXPECT(n_units <= sz->num_sms, "%d split units on %d SMs", n_units, sz->num_sms);
    if (!on_tma)
        EXPECT(pairs == 0, "pairs without the Hopper kernel");

    /* The CTAs' runs partition the units; each run is in decreasing cost;
     * no CTA carries more than the mean plus one unit (what dealing the
     * largest first to the least loaded CTA guarantees). */
    const int32_t S = sz->num_sms;
    EXPECT(h->att_cta[0] == 0 && h->att_cta[S] == n_units, "CTA runs span %d .. %d of %d units",
           h->att_cta[0], h->att_cta[S], n_units);
    int64_t total = 0, largest = 0, most = 0;
    for (int32_t u = 0; u < n_units; ++u) {
        const int64_t c = unit_cost(model, &items[h->att_units[u]]);
        total += c;
        largest = c > largest ? c : largest;
    }
    for (int32_t c = 0; c < S; ++c) {
        const int32_t b = h->att_cta[c], e = h->att_cta[c + 1];
        EXPECT(b <= e && e <= n_units, "CTA %d run %d .. %d", c, b, e);
        if (!(b <= e && e <= n_units))
            return;
        int64_t load = 0, prev = INT64_MAX;
        for (int32_t u = b; u < e; ++u) {
            const int64_t cost = unit_cost(model, &items[h->att_units[u]]);
            EXPECT(cost <= prev, "CTA %d: unit %d costs %lld after %lld", c, u, (long long)cost,
                   (long long)prev);
            prev = cost;
            load += cost;
        }
        most = load > most ? load : most;
    }
    EXPECT(most * S <= total + largest * S, "most loaded CTA %lld, mean %.1f, largest unit %lld",
           (long long)most, (double)total / S, (long long)largest);
}

/* The prefill attention's tiles of one list: every token of every request
 * with q_len > CU_DEC_MAX_Q in exactly one tile, a tile at most tt
 * consecutive tokens of one request at their positions, within the list's
 * capacity, a request's later tiles first. */
/* The prefill requests' blocks laid end to end (the key-block-major
 * attention's list keys): each prefill request's first block, -1 for the
 * others, the total in the header and within the sized capacity. */
static void check_pf_blocks(const msa_plan *plan, const cu_sched_sizes *sz, const cu_meta *h)
{
    const int32_t B = plan->model->cfg.block_size;
    int32_t blocks = 0;
    for (int32_t r = 0; r < plan->num_requests; ++r) {
        if (plan->q_len[r] > CU_DEC_MAX_Q) {
            EXPECT(h->pf_blk0[r] == blocks, "request %d: first prefill block %d, want %d", r,
                   h->pf_blk0[r], blocks);
            blocks += (plan->kv_len[r] + B - 1) / B;
        } else {
            EXPECT(h->pf_blk0[r] == -1, "request %d (q_len %d): first prefill block %d, want -1", r,
                   plan->q_len[r], h->pf_blk0[r]);
        }
    }
    EXPECT(h->hdr->n_pf_blocks == blocks, "header: %d prefill blocks, want %d", h->hdr->n_pf_blocks,
           blocks);
    /* A plan of a sparse model that can hold a prefill request sizes the
     * lists; one that cannot hold one sees none. */
    if (sz->pf_tiles_cap[0] > 0 && cu_sched_any_layer(plan->model, 1, 0))
        EXPECT(sz->pf_blocks_cap > 0 && blocks <= sz->pf_blocks_cap,
               "%d prefill blocks, capacity %d", blocks, sz->pf_blocks_cap);
    else
        EXPECT(blocks == 0, "%d prefill blocks in a plan without prefill capacity", blocks);
}

static void check_pf_tiles(const msa_plan *plan, const cu_sched_sizes *sz, const cu_meta *h,
                           int list, int32_t g, const char *what)
{
    const int32_t tt = cu_pfa_tile_tokens(g);
    const int32_t n = h->hdr->n_pf_tiles[list];
    EXPECT(n >= 0 && n <= sz->pf_tiles_cap[list], "%s: %d tiles, capacity %d", what, n,
           sz->pf_tiles_cap[list]);
    uint8_t *seen = (uint8_t *)calloc((size_t)plan->num_tokens + 1, 1);
    int64_t want = 0;
    for (int32_t r = 0; r < plan->num_requests; ++r)
        if (plan->q_len[r] > CU_DEC_MAX_Q)
            want += plan->q_len[r];
    int64_t got = 0;
    for (int32_t i = 0; i < n; ++i) {
        const cu_pf_tile *t = &h->pf_tiles[list][i];
        EXPECT(t->r >= 0 && t->r < plan->num_requests && plan->q_len[t->r] > CU_DEC_MAX_Q,
               "%s tile %d: request %d", what, i, t->r);
        if (!(t->r >= 0 && t->r < plan->num_requests))
            continue;
        EXPECT(t->ntok >= 1 && t->ntok <= tt, "%s tile %d: %d tokens (tt %d)", what, i, t->ntok,
               tt);
        const int64_t first = t->t0 - plan->q_start[t->r];
        EXPECT(first >= 0 && first + t->ntok <= plan->q_len[t->r], "%s tile %d: tokens %lld+%d",
               what, i, (long long)first, t->ntok);
        EXPECT(t->pos0 == plan->kv_len[t->r] - plan->q_len[t->r] + first, "%s tile %d: pos0 %d",
               what, i, t->pos0);
        if (i > 0 && h->pf_tiles[list][i - 1].r == t->r)
            EXPECT(h->pf_tiles[list][i - 1].t0 > t->t0, "%s tile %d: not after its later tile",
                   what, i);
        for (int32_t k = 0; k < t->ntok && t->t0 + k < plan->num_tokens; ++k) {
            EXPECT(!seen[t->t0 + k], "%s: token %d in two tiles", what, t->t0 + k);
            seen[t->t0 + k] = 1;
            ++got;
        }
    }
    EXPECT(got == want, "%s: tiles hold %lld tokens, want %lld", what, (long long)got,
           (long long)want);
    free(seen);
}

static void run_case(msa_model *model, const sched_case *sc, unsigned seed)
{
    const int32_t R = sc->batch + (sc->prefill ? 1 : 0);
    int32_t *q_len = (int32_t *)calloc((size_t)R, sizeof(int32_t));
    int32_t *kv_len = (int32_t *)calloc((size_t)R, sizeof(int32_t));
    int64_t *q_start = (int64_t *)calloc((size_t)R + 1, sizeof(int64_t));
    int64_t tokens = 0, max_kv = 1;
    for (int32_t r = 0; r < R; ++r) {
        seed = seed * 1103515245u + 12345u;
        const int prefill = sc->prefill && r == R - 1;
        q_len[r] = prefill ? 40 : sc->q;
        /* Contexts spread over +-25% of the case's mean. */
        const int32_t spread = sc->ctx / 2;
        kv_len[r] = sc->ctx - spread / 2 + (int32_t)((seed >> 8) % (uint32_t)(spread + 1));
        if (kv_len[r] < q_len[r])
            kv_len[r] = q_len[r];
        q_start[r] = tokens;
        tokens += q_len[r];
        max_kv = kv_len[r] > max_kv ? kv_len[r] : max_kv;
    }
    q_start[R] = tokens;
    const int64_t pages = (max_kv + 127) / 128;

    msa_cache cache;
    memset(&cache, 0, sizeof cache);
    msa_cache_config_default(&cache.cfg);
    cache.cfg.page_size = 128;
    cache.cfg.kv_dtype = MSA_DTYPE_BF16;
    cache.cfg.index_dtype = MSA_DTYPE_BF16;
    cache.cfg.num_pages = R * pages;
    cache.model = model;

    msa_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.model = model;
    plan.cache = &cache;
    plan.cap_requests = R;
    plan.cap_tokens = tokens;
    plan.cap_kv_len = max_kv;
    plan.cap_pages_per_request = pages;
    plan.num_requests = R;
    plan.num_tokens = tokens;
    plan.q_len = q_len;
    plan.kv_len = kv_len;
    plan.q_start = q_start;
    plan.page_table = (int32_t *)calloc((size_t)(R * pages), sizeof(int32_t));
    plan.token_request = (int32_t *)calloc((size_t)tokens, sizeof(int32_t));
    plan.token_pos = (int64_t *)calloc((size_t)tokens, sizeof(int64_t));
    for (int32_t r = 0; r < R; ++r) {
        for (int64_t p = 0; p < pages; ++p)
            plan.page_table[r * pages + p] = (int32_t)(R * pages - 1 - (r * pages + p));
        for (int32_t i = 0; i < q_len[r]; ++i) {
            plan.token_request[q_start[r] + i] = r;
            plan.token_pos[q_start[r] + i] = kv_len[r] - q_len[r] + i;
        }
    }

    const cu_sched_device dev = {sc->sms, sc->sms * 3, sc->sms * 2};
    cu_sched_sizes sz;
    cu_sched_size(&plan, &dev, &sz);
    const int on_tma = sc->tma && model->group == 16;
    void *blob = aligned_alloc(256, (sz.meta_bytes + 255) / 256 * 256);
    memset(blob, 0, sz.meta_bytes);
    cu_meta h;
    EXPECT(cu_meta_carve(&sz, (uintptr_t)blob, &h) == sz.meta_bytes, "blob size");
    EXPECT((uintptr_t)h.page_table - (uintptr_t)blob == sz.pt_offset, "page table offset");
    cu_sched_step step = {-1, -1};
    EXPECT(cu_sched_fill(&plan, &sz, on_tma, &h, &step) == 0, "step refused");

    const msa_model_config *cfg = &model->cfg;
    EXPECT(h.hdr->n_dec == sc->batch, "%d decode requests, want %d", h.hdr->n_dec, sc->batch);
    EXPECT(h.hdr->n_pf == (sc->prefill ? 40 : 0), "prefill tokens %d", h.hdr->n_pf);
    EXPECT(step.n_pf == h.hdr->n_pf && step.max_q_len == (sc->prefill && sc->q < 40 ? 40 : sc->q),
           "step facts: %d prefill tokens, longest request %d", step.n_pf, step.max_q_len);
    check_kind(&plan, &sz, &h, CU_KIND_SPARSE, cfg->num_kv_heads, model->group, on_tma, "sparse");
    check_units(model, &sz, &h, on_tma);
    check_rows(&plan, &h);
    check_pf_blocks(&plan, &sz, &h);
    check_pf_tiles(&plan, &sz, &h, CU_PFA_MAIN, model->group, "prefill tiles");
    if (model->layer_index_value[0] || (cfg->num_layers > 1 && model->layer_index_value[1]))
        check_pf_tiles(&plan, &sz, &h, CU_PFA_IV, cfg->num_index_heads,
                       "prefill index-value tiles");
    if (model->layer_index_value[0] || (cfg->num_layers > 1 && model->layer_index_value[1]))
        check_kind(&plan, &sz, &h, CU_KIND_IV, 1, cfg->num_index_heads, 0, "index value");
    if (cfg->num_layers > 1)
        check_kind(&plan, &sz, &h, CU_KIND_DENSE, cfg->num_kv_heads, model->group, 0, "dense");

    /* A step beyond the sized capacities is refused before anything is
     * written: one request more than cap_req, then one token more than
     * cap_tok. */
    if (sc->batch == 8 && sc->q == 4) {
        uint8_t *before = (uint8_t *)malloc(sz.meta_bytes);
        memcpy(before, blob, sz.meta_bytes);
        cu_sched_sizes small = sz;
        small.cap_req = R - 1;
        EXPECT(cu_sched_fill(&plan, &small, on_tma, &h, &step) != 0,
               "a step of %d requests fits a capacity of %d", R, small.cap_req);
        small = sz;
        small.cap_tok = (int32_t)tokens - 1;
        EXPECT(cu_sched_fill(&plan, &small, on_tma, &h, &step) != 0,
               "a step of %lld tokens fits a capacity of %d", (long long)tokens, small.cap_tok);
        small = sz;
        small.cap_kv = (int32_t)max_kv - 1;
        EXPECT(cu_sched_fill(&plan, &small, on_tma, &h, &step) != 0,
               "a context of %lld fits a capacity of %d", (long long)max_kv, small.cap_kv);
        EXPECT(memcmp(before, blob, sz.meta_bytes) == 0, "a refused step wrote the schedule");

        /* A step whose table is on the device: the same schedule, but the
         * page table and the rows' pages are left to the device. */
        const size_t pt_bytes = sizeof(int32_t) * (size_t)R * (size_t)sz.cap_pages;
        memset((uint8_t *)blob + sz.pt_offset, 0x77, pt_bytes);
        plan.table_on_device = 1;
        EXPECT(cu_sched_fill(&plan, &sz, on_tma, &h, &step) == 0, "device-table step refused");
        plan.table_on_device = 0;
        int64_t left = 0, paged = 0;
        for (size_t i = 0; i < pt_bytes; ++i)
            left += ((uint8_t *)blob)[sz.pt_offset + i] != 0x77;
        for (int64_t t = 0; t < tokens; ++t)
            paged += h.tok_info[t].page != -1;
        EXPECT(left == 0, "a device-table step wrote %lld bytes of the page table",
               (long long)left);
        EXPECT(paged == 0, "a device-table step set %lld row pages", (long long)paged);
        EXPECT(memcmp(before, blob, (uintptr_t)h.tok_info - (uintptr_t)blob) == 0,
               "a device-table step changed the request arrays");
        free(before);
    }

    free(blob);
    free(plan.page_table);
    free(plan.token_request);
    free(plan.token_pos);
    free(q_len);
    free(kv_len);
    free(q_start);
}

int main(void)
{
    msa_context_params cp;
    msa_context_params_default(&cp);
    cp.backend = MSA_BACKEND_CPU;
    cp.num_threads = 1;
    msa_context *ctx = NULL;
    char err[256];
    if (msa_context_create(&cp, &ctx, err, sizeof err) != MSA_OK) {
        printf("FAIL: context: %s\n", err);
        return 1;
    }
    /* M3 (one sparse layer, Hopper shape), and a two-layer model (dense +
     * sparse with index value, 8 query heads per KV head: no Hopper units). */
    msa_model *models[2] = {NULL, NULL};
    msa_model_config cfg;
    msa_model_config_default(&cfg);
    if (msa_model_create(ctx, &cfg, &models[0]) != MSA_OK) {
        printf("FAIL: model: %s\n", msa_context_last_error(ctx));
        return 1;
    }
    static const uint8_t sparse[2] = {0, 1}, iv[2] = {0, 1};
    cfg.num_layers = 2;
    cfg.num_q_heads = 32;
    cfg.layer_sparse = sparse;
    cfg.layer_index_value = iv;
    if (msa_model_create(ctx, &cfg, &models[1]) != MSA_OK) {
        printf("FAIL: model: %s\n", msa_context_last_error(ctx));
        return 1;
    }

    static const int sms_list[] = {132, 78, 8};
    static const int batches[] = {1, 2, 8, 32, 64, 128};
    static const int qs[] = {1, 2, 4, 5, 8, 12, 16};
    /* 2000: requests on both sides of K = 16 blocks in one step. */
    static const int ctxs[] = {1000, 2000, 4000, 10000, 100000, 200000};
    int cases = 0;
    unsigned seed = 12345u;
    for (int mi = 0; mi < 2; ++mi)
        for (int si = 0; si < (int)(sizeof sms_list / sizeof *sms_list); ++si)
            for (int tma = 0; tma < 2; ++tma)
                for (int bi = 0; bi < (int)(sizeof batches / sizeof *batches); ++bi)
                    for (int qi = 0; qi < (int)(sizeof qs / sizeof *qs); ++qi)
                        for (int ci = 0; ci < (int)(sizeof ctxs / sizeof *ctxs); ++ci) {
                            const sched_case sc = {sms_list[si], tma,      batches[bi],
                                                   qs[qi],       ctxs[ci], (bi + qi + ci) % 4 == 0};
                            const int before = g_failed;
                            run_case(models[mi], &sc, seed += 7919u);
                            ++cases;
                            if (g_failed != before)
                                printf("  in: model %d, %d SMs, tma %d, batch %d, q %d, ctx %d, "
                                       "prefill %d\n",
                                       mi, sc.sms, sc.tma, sc.batch, sc.q, sc.ctx, sc.prefill);
                        }
    msa_model_free(models[0]);
    msa_model_free(models[1]);
    msa_context_free(ctx);
    printf("%d schedules, %d checks, %d failed\n", cases, g_checks, g_failed);
    return g_failed ? 1 : 0;
}
