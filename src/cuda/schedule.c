/*
 * Host scheduler of the CUDA backend (schedule.h): the sizes of a plan's
 * device state and one step's schedule, in plain C so that the CPU-only
 * build compiles and tests it.
 */
#include "cuda/schedule.h"

#include <string.h>

static size_t cu_align16(size_t x)
{
    return (x + 15) & ~(size_t)15;
}

static int32_t cu_ceil_div32(int64_t a, int64_t b)
{
    return (int32_t)((a + b - 1) / b);
}

static int32_t cu_max32(int32_t a, int32_t b)
{
    return a > b ? a : b;
}

static int32_t cu_min32(int32_t a, int32_t b)
{
    return a < b ? a : b;
}

/* Selection CTAs per SM (build-time setting, for measurements).  With 4
 * (the default) a step's rows run on many warps side by side.  With 1, a
 * selection CTA fits beside an indexer CTA and beside an attention CTA on
 * one SM (registers: 128 x 120 + 288 x 168 <= 64K), so the attention's
 * CTAs can enter while the selection runs.  Measured on the H200: 1 gained
 * 0.5 µs at batch 8, 1K, 1 token and cost 7% at batch 128, 10K, 8 tokens;
 * 2 was slower or level on the H200.  (That was with one
 * attention producer warp; with two, 320 x 168 registers, the attention
 * no longer fits beside a selection CTA.) */
#define SEL_CTAS_PER_SM 4

int cu_sched_any_layer(const msa_model *m, int want_sparse, int want_iv)
{
    for (int32_t l = 0; l < m->cfg.num_layers; ++l) {
        const int sp = m->layer_sparse[l] != 0;
        const int iv = sp && m->layer_index_value[l] != 0;
        if (want_iv ? iv : (want_sparse ? sp : !sp))
            return 1;
    }
    return 0;
}

size_t cu_meta_carve(const cu_sched_sizes *sz, uintptr_t base, cu_meta *m)
{
    size_t off = 0;
#define CARVE(field, type, count)               \
    m->field = (type *)(base + (uintptr_t)off); \
    off = cu_align16(off + sizeof(type) * (size_t)(count))
    CARVE(hdr, cu_step_hdr, 1);
    CARVE(q_len, int32_t, sz->cap_req);
    CARVE(kv_len, int32_t, sz->cap_req);
    CARVE(q_start, int32_t, sz->cap_req);
    CARVE(tok_info, cu_tok_info, sz->cap_tok);
    CARVE(dec_req, int32_t, sz->cap_req);
    CARVE(dec_row0, int32_t, sz->cap_req);
    CARVE(dec_blk0, int32_t, sz->cap_req + 1);
    CARVE(dec_info, cu_dec_info, sz->cap_req);
    CARVE(dec_row, cu_dec_row, sz->dec_rows_cap);
    CARVE(pf_tok, int32_t, sz->cap_tok);
    CARVE(pf_tiles[0], cu_pf_tile, sz->pf_tiles_cap[0]);
    CARVE(pf_tiles[1], cu_pf_tile, sz->pf_tiles_cap[1]);
    CARVE(pf_blk0, int32_t, sz->cap_req);
    for (int k = 0; k < CU_KINDS; ++k) {
        CARVE(att[k], cu_att_item, sz->att_cap);
    }
    for (int k = 0; k < CU_KINDS; ++k) {
        CARVE(merge[k], cu_merge_item, sz->merge_cap);
    }
    CARVE(att_units, int32_t, sz->att_cap);
    CARVE(att_cta, int32_t, (int64_t)sz->num_sms + 1);
    CARVE(page_table, int32_t, (int64_t)sz->cap_req * sz->cap_pages);
    CARVE(sched_heap, uint64_t, sz->num_sms);
    CARVE(sched_i32, int32_t, 4 * (int64_t)sz->att_cap + sz->num_sms + sz->sched_costs);
#undef CARVE
    return off;
}

void cu_sched_size(const msa_plan *plan, const cu_sched_device *dev, cu_sched_sizes *sz)
{
    const msa_model *m = plan->model;
    const msa_model_config *cfg = &m->cfg;
    const int any_sparse = cu_sched_any_layer(m, 1, 0);
    const int32_t num_kv_heads = cfg->num_kv_heads, num_index_heads = cfg->num_index_heads;
    const int32_t group = m->group;
    const int32_t topk_width = m->topk_width;
    memset(sz, 0, sizeof(*sz));
    sz->cap_req = cu_max32((int32_t)plan->cap_requests, 1);
    sz->cap_tok = cu_max32((int32_t)plan->cap_tokens, 1);
    /* The longest request a step of this plan can hold: its token rows,
     * or the plan's max_q_len when that is lower. */
    sz->cap_q = plan->params.max_q_len > 0 && plan->params.max_q_len < sz->cap_tok
                    ? plan->params.max_q_len
                    : sz->cap_tok;
    sz->cap_kv = cu_max32((int32_t)plan->cap_kv_len, 1);
    sz->cap_pages = cu_max32((int32_t)plan->cap_pages_per_request, 1);
    sz->cap_blocks = any_sparse ? cu_ceil_div32(sz->cap_kv, cfg->block_size) : 1;
    sz->dec_rows_cap = (int32_t)((int64_t)sz->cap_tok < (int64_t)CU_DEC_MAX_Q * sz->cap_req
                                     ? sz->cap_tok
                                     : CU_DEC_MAX_Q * sz->cap_req);
    sz->cap_union = any_sparse ? cu_min32(CU_DEC_MAX_Q * topk_width, sz->cap_blocks) : 1;
    /* A unit's estimated cost is at most its union's tiles + 2 (see
     * cu_sched_items). */
    sz->sched_costs = cu_ceil_div32((int64_t)sz->cap_union * cfg->block_size, CU_TILE_KEYS) + 3;
    sz->num_sms = dev->num_sms;

    const int32_t sms = dev->num_sms;
    sz->grid_tok = cu_max32(cu_min32(sz->cap_tok, sms * 8), 1);
    sz->grid_idx = sms * 4;
    sz->grid_idx_fast = dev->grid_idx_fast;
    /* Scores of a row kept in shared memory by the selecting warp (and the
     * union's per-block bits): the whole row up to 4096 blocks. */
    sz->sel_cache = any_sparse ? cu_min32(sz->cap_blocks, 4096) : 0;
    /* More warps than rows at batch 128 x 8 tokens x 4 units: a warp's row
     * is a chain of latencies, so rows run side by side, not in turn. */
    sz->grid_sel = sms * SEL_CTAS_PER_SM;
    /* Prefill items go to the selection's first grid_pf CTAs. */
    sz->grid_pf = cu_min32(sms * 2, sz->grid_sel);
    sz->grid_att = sms * 4;
    sz->grid_att_fast = dev->grid_att_fast;
    sz->grid_merge = sms * 2;

    /* Work units of one step: (decode request, KV head, 64-row chunk). */
    const int32_t chunks_main = cu_ceil_div32((int64_t)CU_DEC_MAX_Q * group, CU_ROWS_PER_ITEM);
    const int32_t chunks_iv =
        cu_ceil_div32((int64_t)CU_DEC_MAX_Q * num_index_heads, CU_ROWS_PER_ITEM);
    const int64_t units_cap =
        (int64_t)sz->cap_req *
        (num_kv_heads * chunks_main > chunks_iv ? num_kv_heads * chunks_main : chunks_iv);
    const int32_t target = 2 * sz->grid_att_fast;
    sz->att_cap = (int32_t)(units_cap + target);
    sz->merge_cap = (int32_t)units_cap;
    sz->part_rows_cap = 2 * target * CU_ROWS_PER_ITEM;
    {
        const int32_t dmax = cfg->head_dim > cfg->index_dim ? cfg->head_dim : cfg->index_dim;
        sz->part_stride = (dmax + 1 + 3) & ~3;
    }

    /* Prefill attention tiles: none when no request can exceed the decode
     * path's q_len. */
    sz->pf_tiles_cap[0] = sz->pf_tiles_cap[1] = 0;
    if (sz->cap_q > CU_DEC_MAX_Q) {
        sz->pf_tiles_cap[0] = cu_pfa_tiles_cap(sz->cap_tok, sz->cap_req, cu_pfa_tile_tokens(group));
        if (cu_sched_any_layer(m, 1, 1))
            sz->pf_tiles_cap[1] =
                cu_pfa_tiles_cap(sz->cap_tok, sz->cap_req, cu_pfa_tile_tokens(num_index_heads));
        /* A prefill request has more than CU_DEC_MAX_Q tokens, so a step
         * holds at most cap_tok / (CU_DEC_MAX_Q + 1) of them. */
        const int32_t pf_req_cap = sz->cap_tok / (CU_DEC_MAX_Q + 1) < sz->cap_req
                                       ? sz->cap_tok / (CU_DEC_MAX_Q + 1)
                                       : sz->cap_req;
        const int64_t pf_blocks = (int64_t)pf_req_cap * sz->cap_blocks;
        /* Beyond 2^24 blocks the key-block-major attention is not set up
         * (its per-block lists would be larger than its use). */
        if (any_sparse && pf_blocks <= ((int64_t)1 << 24))
            sz->pf_blocks_cap = (int32_t)pf_blocks;
    }

    {
        cu_meta offs;
        sz->meta_bytes = cu_meta_carve(sz, 0, &offs);
        sz->pt_offset = (size_t)(uintptr_t)offs.page_table;
    }
    sz->plan_caps[0] = plan->cap_requests;
    sz->plan_caps[1] = plan->cap_tokens;
    sz->plan_caps[2] = plan->cap_kv_len;
    sz->plan_caps[3] = plan->cap_pages_per_request;
}

/* One attention pass as the scheduler sees it. */
typedef struct cu_sched_kind {
    int kind;
    int32_t groups;    /* KV heads of the pass */
    int32_t g;         /* query heads per KV head */
    int32_t one_round; /* the Hopper kernel: one CTA per SM, items in turn */
} cu_sched_kind;

/* Min-heap of CTA loads, keyed (load << 32 | CTA): the least loaded CTA,
 * the lower index among equals, on top. */
static void cu_heap_sift_down(uint64_t *hp, int32_t n, int32_t i)
{
    for (;;) {
        const int32_t l = 2 * i + 1, r = l + 1;
        int32_t m = i;
        if (l < n && hp[l] < hp[m])
            m = l;
        if (r < n && hp[r] < hp[m])
            m = r;
        if (m == i)
            return;
        const uint64_t t = hp[i];
        hp[i] = hp[m];
        hp[m] = t;
        i = m;
    }
}

/* Deals the sparse pass's n units (costs in the scratch, each below
 * sz->sched_costs) to the Hopper kernel's sz->num_sms CTAs, largest first,
 * each to the CTA with the least cost so far (longest processing time
 * first), and reorders att_units so that each CTA's units are contiguous,
 * largest first, with att_cta their bounds.  Each CTA walks its units one
 * after another, so the step lasts as long as its most loaded CTA: dealt
 * in plan order, batches of requests whose contexts differ by +-25% left
 * the most loaded CTA 13-25% above the mean at 1K-10K context and 8 tokens
 * (the decode workload's lengths, by the estimate of bench/unit_balance.py);
 * this way 3-5%, and on the H200 such steps ran 3-10% faster
 * than with units dealt in order.  With equal costs (one
 * token per request past K blocks) it deals as before: unit u to CTA u mod
 * num_sms.  Counting sort and a heap: O(n log num_sms) host work. */
static void cu_sched_balance_units(const cu_sched_sizes *sz, cu_meta *h, int32_t n)
{
    const int32_t S = sz->num_sms, C = sz->sched_costs;
    int32_t *cost = h->sched_i32;
    int32_t *order = cost + sz->att_cap;
    int32_t *cta_of = order + sz->att_cap;
    int32_t *placed = cta_of + sz->att_cap;
    int32_t *fill = placed + sz->att_cap; /* [S] */
    int32_t *bucket = fill + S;           /* [C] */
    uint64_t *hp = h->sched_heap;
    /* Units by decreasing cost, plan order among equals. */
    memset(bucket, 0, sizeof(int32_t) * (size_t)C);
    for (int32_t u = 0; u < n; ++u)
        ++bucket[cost[u]];
    for (int32_t c = C - 1, pos = 0; c >= 0; --c) {
        const int32_t k = bucket[c];
        bucket[c] = pos;
        pos += k;
    }
    for (int32_t u = 0; u < n; ++u)
        order[bucket[cost[u]]++] = u;
    /* Each unit to the least loaded CTA. */
    for (int32_t c = 0; c < S; ++c) {
        hp[c] = (uint64_t)c;
        fill[c] = 0;
    }
    for (int32_t i = 0; i < n; ++i) {
        const int32_t u = order[i];
        const int32_t c = (int32_t)(hp[0] & 0xffffffffu);
        cta_of[u] = c;
        ++fill[c];
        hp[0] += (uint64_t)cost[u] << 32;
        cu_heap_sift_down(hp, S, 0);
    }
    /* Contiguous per CTA, in dealing order. */
    int32_t pos = 0;
    for (int32_t c = 0; c < S; ++c) {
        h->att_cta[c] = pos;
        pos += fill[c];
        fill[c] = h->att_cta[c];
    }
    h->att_cta[S] = pos;
    for (int32_t i = 0; i < n; ++i) {
        const int32_t u = order[i];
        placed[fill[cta_of[u]]++] = h->att_units[u];
    }
    memcpy(h->att_units, placed, sizeof(int32_t) * (size_t)n);
}

static void cu_sched_items(const msa_plan *plan, const cu_sched_sizes *sz, cu_meta *h,
                           const cu_sched_kind *sk, int32_t *part_used)
{
    const msa_model *m = plan->model;
    const int32_t n_dec = h->hdr->n_dec;
    const int32_t target = 2 * sz->grid_att_fast;
    /* A unit of work is one 64-row chunk, or on the Hopper kernel two
     * chunks that share the key stream (see att_units): the union is then
     * read once for 8 tokens, and the kernel's two consumer warpgroups
     * compute the two chunks side by side, so a pair takes about as long
     * as one chunk.  Every second chunk of a (request, KV head) joins the
     * one before it. */
    const int pair = sk->one_round && sk->kind == CU_KIND_SPARSE;
    int64_t n_units = 0;
    for (int32_t k = 0; k < n_dec; ++k) {
        const int32_t chunks = cu_ceil_div32(plan->q_len[h->dec_req[k]] * sk->g, CU_ROWS_PER_ITEM);
        n_units += (int64_t)sk->groups * cu_ceil_div32(chunks, pair ? 2 : 1);
    }
    /* Splits per unit so that the items fill the GPU.  The Hopper kernel
     * runs one CTA per SM and each CTA its units one after another, each
     * paying the pipeline's fill latency again: there the units should
     * number at most one per SM (rounded down), larger rather than more. */
    int32_t s_policy;
    if (sk->one_round)
        s_policy = n_units == 0 || n_units >= sz->num_sms ? 1 : sz->num_sms / (int32_t)n_units;
    else
        s_policy = n_units == 0 || n_units >= target ? 1 : cu_ceil_div32(target, n_units);
    int32_t n_items = 0, n_merge = 0, n_att_units = 0;
    cu_att_item *items = h->att[sk->kind];
    cu_merge_item *merges = h->merge[sk->kind];
    for (int32_t k = 0; k < n_dec; ++k) {
        const int32_t r = h->dec_req[k];
        const int32_t ql = plan->q_len[r];
        const int32_t kl = plan->kv_len[r];
        const int32_t rows = ql * sk->g;
        int64_t est_keys;
        const int32_t B = m->cfg.block_size;
        const int64_t reach = (kl + B - 1) / B; /* blocks of a sparse request */
        if (sk->kind == CU_KIND_SPARSE) {
            const int64_t sel = (int64_t)ql * m->topk_width;
            est_keys = (reach < sel ? reach : sel) * B;
        } else {
            est_keys = kl;
        }
        const int32_t est_tiles = cu_max32(cu_ceil_div32(est_keys, CU_TILE_KEYS), 1);
        const int32_t unit_rows = (pair ? 2 : 1) * CU_ROWS_PER_ITEM;
        for (int32_t grp = 0; grp < sk->groups; ++grp) {
            for (int32_t urow0 = 0; urow0 < rows; urow0 += unit_rows) {
                const int32_t urows = cu_min32(unit_rows, rows - urow0);
                const int32_t nch = cu_ceil_div32(urows, CU_ROWS_PER_ITEM);
                const int32_t nrows0 = cu_min32(CU_ROWS_PER_ITEM, urows);
                /* A split writes nrows partial rows (D+1 floats each) and the
                 * merge reads them back: keep each split's keys worth that. */
                const int32_t s_work = cu_max32((int32_t)((int64_t)est_tiles * 8 / nrows0), 1);
                int32_t S = cu_min32(s_policy, s_work);
                if (S > 1 &&
                    (*part_used + (int64_t)S * urows > sz->part_rows_cap ||
                     n_items + (int64_t)S * nch > sz->att_cap || n_merge + nch > sz->merge_cap))
                    S = 1;
                int32_t pbase[2] = {0, 0};
                for (int32_t c = 0; c < nch && S > 1; ++c) {
                    const int32_t row0 = urow0 + c * CU_ROWS_PER_ITEM;
                    const int32_t nrows = cu_min32(CU_ROWS_PER_ITEM, rows - row0);
                    pbase[c] = *part_used;
                    *part_used += S * nrows;
                    cu_merge_item *merge = &merges[n_merge++];
                    merge->dec = k;
                    merge->group = grp;
                    merge->row0 = row0;
                    merge->nrows = nrows;
                    merge->nsplit = S;
                    merge->part_base = pbase[c];
                    merge->t0 = (int32_t)plan->q_start[r];
                    merge->pad1 = 0;
                }
                /* The unit's cost for the balancing: the tiles of its
                 * tokens' union at most (each token selects W blocks),
                 * its share of them when split, and two tiles' worth for
                 * its fixed costs (queries, partial rows, the ring's
                 * fill). */
                int32_t unit_cost = 0;
                if (sk->kind == CU_KIND_SPARSE) {
                    const int64_t utok = cu_ceil_div32(urows, sk->g);
                    const int64_t ublk = reach < utok * m->topk_width ? reach
                                                                      : utok * m->topk_width;
                    const int32_t tiles = cu_ceil_div32(ublk * B, CU_TILE_KEYS);
                    unit_cost = cu_min32(cu_ceil_div32(tiles, S) + 2, sz->sched_costs - 1);
                }
                for (int32_t s = 0; s < S; ++s) {
                    if (sk->kind == CU_KIND_SPARSE) {
                        h->sched_i32[n_att_units] = unit_cost;
                        h->att_units[n_att_units++] = n_items;
                    }
                    for (int32_t c = 0; c < nch; ++c) {
                        const int32_t row0 = urow0 + c * CU_ROWS_PER_ITEM;
                        cu_att_item *it = &items[n_items++];
                        it->dec = k;
                        it->group = grp;
                        it->row0 = row0;
                        it->nrows = cu_min32(CU_ROWS_PER_ITEM, rows - row0);
                        it->split = s;
                        it->nsplit = S;
                        it->part_base = pbase[c];
                        it->r = r;
                        it->ql = ql;
                        it->kl = kl;
                        it->t0 = (int32_t)plan->q_start[r];
                        it->unit_len = c == 0 ? nch : 0;
                    }
                }
            }
        }
    }
    if (sk->kind == CU_KIND_SPARSE) {
        h->hdr->n_att_units = n_att_units;
        cu_sched_balance_units(sz, h, n_att_units);
    }
    h->hdr->n_att[sk->kind] = n_items;
    h->hdr->n_merge[sk->kind] = n_merge;
}

/* Whether the step fits the capacities the state was sized for: every
 * list below is cut to them, so a step beyond them would lose rows. */
static int cu_sched_fits(const msa_plan *plan, const cu_sched_sizes *sz)
{
    if (plan->num_requests < 0 || plan->num_requests > sz->cap_req || plan->num_tokens < 0 ||
        plan->num_tokens > sz->cap_tok || plan->cap_pages_per_request > sz->cap_pages)
        return 0;
    int64_t dec_rows = 0;
    for (int32_t r = 0; r < plan->num_requests; ++r) {
        const int32_t ql = plan->q_len[r];
        if (ql < 0 || ql > sz->cap_q || plan->kv_len[r] > sz->cap_kv)
            return 0;
        if (ql > 0 && ql <= CU_DEC_MAX_Q)
            dec_rows += ql;
    }
    return dec_rows <= sz->dec_rows_cap;
}

int cu_sched_fill(const msa_plan *plan, const cu_sched_sizes *sz, int sparse_one_round, cu_meta *h,
                  cu_sched_step *step)
{
    if (!cu_sched_fits(plan, sz))
        return -1;
    const msa_model *m = plan->model;
    const int32_t B = m->cfg.block_size;
    const int any_sparse = cu_sched_any_layer(m, 1, 0);
    memset(h->hdr, 0, sizeof(*h->hdr));

    const int32_t R = plan->num_requests;
    h->hdr->num_requests = R;
    h->hdr->num_tokens = (int32_t)plan->num_tokens;
    int32_t n_dec = 0, dec_rows = 0, n_pf = 0, blocks = 0, max_nblk = 0, pf_blocks = 0;
    for (int32_t r = 0; r < R; ++r) {
        const int32_t ql = plan->q_len[r];
        h->q_len[r] = ql;
        h->pf_blk0[r] = -1;
        h->kv_len[r] = plan->kv_len[r];
        h->q_start[r] = (int32_t)plan->q_start[r];
        if (ql == 0)
            continue;
        if (ql <= CU_DEC_MAX_Q) {
            h->dec_req[n_dec] = r;
            h->dec_row0[n_dec] = dec_rows;
            h->dec_blk0[n_dec] = blocks;
            for (int32_t i = 0; i < ql; ++i) {
                const int64_t t = plan->q_start[r] + i;
                cu_dec_row *dr = &h->dec_row[dec_rows + i];
                dr->t = (int32_t)t;
                dr->nblk = (int32_t)(plan->token_pos[t] / B) + 1;
                max_nblk = cu_max32(max_nblk, dr->nblk);
                dr->slot = n_dec;
                dr->ql = ql;
            }
            dec_rows += ql;
            cu_dec_info *di = &h->dec_info[n_dec];
            di->r = r;
            di->ql = ql;
            di->kl = plan->kv_len[r];
            di->t0 = (int32_t)plan->q_start[r];
            di->d0 = dec_rows - ql;
            di->blk0 = blocks;
            /* The indexer scores only requests with more than K blocks:
             * with at most K every reachable block is selected whatever
             * the scores (SPEC 4), and nothing else reads them. */
            const int32_t req_blocks = cu_ceil_div32(plan->kv_len[r], B);
            if (any_sparse && req_blocks > m->cfg.topk_blocks)
                blocks += req_blocks;
            di->blk1 = blocks;
            di->nblk = req_blocks;
            ++n_dec;
        } else {
            for (int32_t i = 0; i < ql; ++i)
                h->pf_tok[n_pf++] = (int32_t)plan->q_start[r] + i;
            h->pf_blk0[r] = pf_blocks;
            pf_blocks += cu_ceil_div32(plan->kv_len[r], B);
        }
    }
    h->dec_blk0[n_dec] = blocks;
    h->hdr->n_dec = n_dec;
    h->hdr->n_dec_rows = dec_rows;
    h->hdr->max_dec_nblk = max_nblk;
    h->hdr->n_pf = n_pf;
    h->hdr->n_pf_blocks = pf_blocks;
    h->hdr->total_dec_blocks = blocks;
    const int32_t P = plan->cache->cfg.page_size;
    for (int64_t t = 0; t < plan->num_tokens; ++t) {
        const int32_t r = plan->token_request[t];
        const int64_t pos = plan->token_pos[t];
        cu_tok_info *ti = &h->tok_info[t];
        ti->r = r;
        ti->pos = (int32_t)pos;
        /* A device table's pages are set on the device (plan.cu). */
        ti->page = r >= 0 && !plan->table_on_device
                       ? plan->page_table[(int64_t)r * plan->cap_pages_per_request + pos / P]
                       : -1;
        ti->pad = 0;
    }
    for (int32_t r = 0; r < R && !plan->table_on_device; ++r)
        memcpy(h->page_table + (int64_t)r * sz->cap_pages,
               plan->page_table + (int64_t)r * plan->cap_pages_per_request,
               sizeof(int32_t) * (size_t)plan->cap_pages_per_request);

    int32_t part_used = 0;
    if (any_sparse) {
        cu_sched_kind sk = {CU_KIND_SPARSE, m->cfg.num_kv_heads, m->group, sparse_one_round};
        cu_sched_items(plan, sz, h, &sk, &part_used);
    }
    if (cu_sched_any_layer(m, 0, 0)) {
        cu_sched_kind sk = {CU_KIND_DENSE, m->cfg.num_kv_heads, m->group, 0};
        part_used = 0; /* passes run one after another: partials are reused */
        cu_sched_items(plan, sz, h, &sk, &part_used);
    }
    if (cu_sched_any_layer(m, 1, 1)) {
        cu_sched_kind sk = {CU_KIND_IV, 1, m->cfg.num_index_heads, 0};
        part_used = 0;
        cu_sched_items(plan, sz, h, &sk, &part_used);
    }

    cu_sched_fill_pf_tiles(plan, sz, h);

    int32_t max_q = 0;
    for (int32_t r = 0; r < R; ++r)
        max_q = plan->q_len[r] > max_q ? plan->q_len[r] : max_q;
    step->max_q_len = max_q;
    step->n_pf = n_pf;
    return 0;
}

void cu_sched_fill_pf_tiles(const msa_plan *plan, const cu_sched_sizes *sz, cu_meta *h)
{
    const msa_model *m = plan->model;
    const int32_t heads_per_list[CU_PFA_LISTS] = {m->group, m->cfg.num_index_heads};
    for (int list = 0; list < CU_PFA_LISTS; ++list) {
        h->hdr->n_pf_tiles[list] = 0;
        if (sz->pf_tiles_cap[list] <= 0 || heads_per_list[list] <= 0)
            continue;
        const int32_t tile_tokens = cu_pfa_tile_tokens(heads_per_list[list]);
        int32_t n = 0;
        for (int32_t r = 0; r < plan->num_requests; ++r) {
            const int32_t ql = plan->q_len[r];
            if (ql <= CU_DEC_MAX_Q)
                continue;
            const int32_t pos0 = plan->kv_len[r] - ql;
            for (int32_t i = (ql - 1) / tile_tokens; i >= 0 && n < sz->pf_tiles_cap[list]; --i) {
                cu_pf_tile *t = &h->pf_tiles[list][n++];
                t->r = r;
                t->t0 = (int32_t)plan->q_start[r] + i * tile_tokens;
                t->ntok = ql - i * tile_tokens < tile_tokens ? ql - i * tile_tokens : tile_tokens;
                t->pos0 = pos0 + i * tile_tokens;
            }
        }
        h->hdr->n_pf_tiles[list] = n;
    }
}
