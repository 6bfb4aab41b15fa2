/* One attention work item (SPEC sections 5 and 6), compiled once per
 * instruction-set level: included by cpu_level.h only.  The driver (work
 * items, splits, the merge of split partials) is in cpu_attention.c. */

static int32_t chunk_block_count(const cpu_chunk *ch, int32_t B)
{
    return (int32_t)((ch->pos0 + ch->n - 1) / B) + 1;
}

/* Union of the tokens' selected blocks for KV head g, ascending. */
static int32_t sparse_union(const cpu_attention *a, const cpu_chunk *ch, int32_t g, int32_t *out,
                            int32_t *cursor)
{
    const int32_t W = a->sel_width;
    int32_t cnt = 0;
    for (int32_t t = 0; t < ch->n; t++)
        cursor[t] = 0;
    for (;;) {
        int32_t best = -1;
        for (int32_t t = 0; t < ch->n; t++) {
            const int32_t *row = a->sel + ((ch->row0 + t) * a->k.heads + g) * W;
            if (cursor[t] < W && row[cursor[t]] >= 0 && (best < 0 || row[cursor[t]] < best))
                best = row[cursor[t]];
        }
        if (best < 0)
            break;
        for (int32_t t = 0; t < ch->n; t++) {
            const int32_t *row = a->sel + ((ch->row0 + t) * a->k.heads + g) * W;
            if (cursor[t] < W && row[cursor[t]] == best)
                cursor[t]++;
        }
        out[cnt++] = best;
    }
    return cnt;
}

/* Prefetches the K and V rows of the first tile of a block (the hardware
 * prefetcher cannot guess the jump between selected blocks). */
static void prefetch_block(const cpu_attention *a, const int32_t *pt, int32_t g, int64_t j0,
                           int32_t B, int64_t p_last)
{
    const int32_t P = a->k.page_size;
    int32_t n = B < MSA_CPU_TILE ? B : MSA_CPU_TILE;
    if (j0 + n > p_last + 1) /* keys past the chunk's last token have no page */
        n = (int32_t)(p_last + 1 - j0);
    const int64_t row_bytes = (int64_t)a->k.dim * (int64_t)msa_dtype_size(a->k.dtype);
    const int packed = cpu_plane_packed(&a->k) && cpu_plane_packed(&a->v);
    const int64_t kstep = a->k.row_stride * (int64_t)msa_dtype_size(a->k.dtype);
    const int64_t vstep = a->v.row_stride * (int64_t)msa_dtype_size(a->v.dtype);
    for (int32_t i = 0; i < n;) {
        int64_t j = j0 + i;
        int32_t off = (int32_t)(j % P);
        int32_t run = P - off < n - i ? P - off : n - i;
        int32_t page = pt[j / P];
        if (a->k.dtype == MSA_DTYPE_NVFP4 && a->v.dtype == MSA_DTYPE_NVFP4) {
            /* The run's codes, then its group scales, in each region. */
            const uint8_t *kc, *ks, *vc, *vs;
            cpu_plane_nvfp4_row(&a->k, page, g, off, &kc, &ks);
            cpu_plane_nvfp4_row(&a->v, page, g, off, &vc, &vs);
            for (int64_t b = 0; b < (int64_t)run * a->k.dim / 2; b += 64) {
                __builtin_prefetch(kc + b);
                __builtin_prefetch(vc + b);
            }
            for (int64_t b = 0; b < (int64_t)run * a->k.dim / 16; b += 64) {
                __builtin_prefetch(ks + b);
                __builtin_prefetch(vs + b);
            }
            i += run;
            continue;
        }
        const char *k = cpu_plane_row(&a->k, page, g, off);
        const char *v = cpu_plane_row(&a->v, page, g, off);
        if (packed) {
            for (int64_t b = 0; b < run * row_bytes; b += 64) {
                __builtin_prefetch(k + b);
                __builtin_prefetch(v + b);
            }
        } else {
            for (int32_t r = 0; r < run; r++)
                for (int64_t b = 0; b < row_bytes; b += 64) {
                    __builtin_prefetch(k + r * kstep + b);
                    __builtin_prefetch(v + r * vstep + b);
                }
        }
        i += run;
    }
}

static void attn_item(attn_job *job, int64_t item, float *scratch)
{
    const msa_plan *p = job->plan;
    const cpu_attention *a = job->a;
    cpu_plan *cp = p->backend;
    const int32_t S = job->splits, Hkv = job->kv_heads;
    const int64_t pair = item / S;
    const int32_t split = (int32_t)(item % S);
    const cpu_chunk *ch = &job->chunks[pair / Hkv];
    const int32_t g = (int32_t)(pair % Hkv);
    const int32_t G = a->group, D = a->k.dim, B = a->block;
    const int32_t TW = B < MSA_CPU_TILE ? B : MSA_CPU_TILE;
    const int32_t rows = ch->n * G;
    const int32_t *pt = p->page_table + (int64_t)ch->request * p->cap_pages_per_request;

    /* Heads run along vector lanes: the G query heads of the group, padded
     * to GP = a multiple of 16, share every K row and every V row.
     * scratch: qt [n][D][GP] | acc [rows][D] | m, l [n][GP] | K, V tiles
     *          [TILE][D] | s [GROUP][TILE][GP] | union ids | cursors */
    const int32_t GP = (G + 15) & ~15;
    float *qt = scratch;
    float *acc = qt + (int64_t)ch->n * D * GP;
    float *mrow = acc + (int64_t)rows * D;
    float *lrow = mrow + (int64_t)ch->n * GP;
    float *kt = lrow + (int64_t)ch->n * GP;
    float *vt = kt + (int64_t)MSA_CPU_TILE * D;
    float *sbuf = vt + (int64_t)MSA_CPU_TILE * D; /* MSA_CPU_ATTN_GROUP score tiles */
    int32_t *uni = (int32_t *)(sbuf + (int64_t)MSA_CPU_ATTN_GROUP * MSA_CPU_TILE * GP);
    int32_t *cursor = uni + (int64_t)MSA_CPU_ATTN_ROWS * a->sel_width;
    uint32_t *pp = (uint32_t *)(cursor + MSA_CPU_ATTN_ROWS); /* [TILE/2][16] weight pairs */
    (void)pp;                                                /* used by the bf16 levels only */

    /* fp8 K and V with bf16 queries: the codes become bf16 exactly (code
     * times 2^-8, cpu_dequant_impl.h) and take the bf16 kernels below;
     * 256 times each plane's scale multiplies the fp32 sums (scores) and
     * the accumulators (outputs) instead of every element. */
    const float qk_scale_fp8 = a->scale * (256.0f * a->k.scale);
    /* nvfp4 K and V the same way: E2M1 values times their group scales
     * are exact in bf16 (cpu_dequant_impl.h); the planes' global scales
     * multiply the sums and the accumulators. */
    const float qk_scale_nv = a->scale * a->k.scale;
#if MSA_CPU_DQ_FP8_BF16
    const int fp8_kv = a->act == MSA_DTYPE_BF16 && a->k.dtype == MSA_DTYPE_FP8_E4M3 &&
                       a->v.dtype == MSA_DTYPE_FP8_E4M3 && D % 16 == 0 &&
                       dq_fp8_fast_scale(a->k.scale) && dq_fp8_fast_scale(a->v.scale) &&
                       isfinite(qk_scale_fp8);
    const int nv_kv = a->act == MSA_DTYPE_BF16 && a->k.dtype == MSA_DTYPE_NVFP4 &&
                      a->v.dtype == MSA_DTYPE_NVFP4 && D % 16 == 0 && isfinite(qk_scale_nv);
#else
    const int fp8_kv = 0, nv_kv = 0;
#endif
    /* Key and value tiles widened from codes to bf16 (fp8 or nvfp4). */
    const int q_kv = fp8_kv || nv_kv;
    /* bf16 queries and keys: q.k with bf16 dot products straight from the
     * stored values; the scale is applied to the fp32 sums. */
    const int bf16_dot = MSA_CPU_HAVE_BF16_DOT && a->act == MSA_DTYPE_BF16 &&
                         ((a->k.dtype == MSA_DTYPE_BF16 && D % 2 == 0) || q_kv);
    const float qk_scale = fp8_kv ? qk_scale_fp8 : nv_kv ? qk_scale_nv : a->scale;
    (void)qk_scale; /* bf16 levels only */
    /* bf16 values too: P.V with bf16 products (the weights rounded to bf16,
     * sums in fp32, as in the GPU kernels). */
    const int bf16_pv = bf16_dot && D % 16 == 0;
    /* fp32 levels with bf16 values, or fp8 values whose 256 * scale is
     * finite: P.V reads the value rows in place and widens them in
     * registers (cpu_decode_rows.h; fp8 to the values of the scalar read
     * rule, bit for bit). */
#if MSA_CPU_DR_FP8
    const int k_fp8 = a->k.dtype == MSA_DTYPE_FP8_E4M3 && dq_fp8_fast_scale(a->k.scale);
    const int v_fp8 = a->v.dtype == MSA_DTYPE_FP8_E4M3 && dq_fp8_fast_scale(a->v.scale);
#else
    const int k_fp8 = 0, v_fp8 = 0;
#endif
#if MSA_CPU_DECODE_ROWS
    const int dr_pv = !bf16_pv && (a->v.dtype == MSA_DTYPE_BF16 || v_fp8) &&
                      D % (DR_LANES * DR_VB) == 0;
    const dr_vec k_s256 = DR_SET1(k_fp8 ? 256.0f * a->k.scale : 0.0f);
    const dr_vec v_s256 = DR_SET1(v_fp8 ? 256.0f * a->v.scale : 0.0f);
#else
    const int dr_pv = 0;
#endif
    /* ... and with such keys the scores read the key rows in place too. */
#if MSA_CPU_DECODE_ROWS
    const int dr_qk = !bf16_dot && (a->k.dtype == MSA_DTYPE_BF16 || k_fp8) && D % DR_LANES == 0 &&
                      D <= DR_MAX_DIM;
#else
    const int dr_qk = 0;
    (void)k_fp8, (void)v_fp8;
#endif
    const void *vrows_dr = NULL; /* this tile's value rows, dr_pv only */
    (void)vrows_dr;
    /* Keys and values of one page are read in place only where their rows
     * are packed; other strided planes go through the copying gather. */
    const int k_packed = cpu_plane_packed(&a->k), v_packed = cpu_plane_packed(&a->v);
    size_t es = msa_dtype_size(a->act);
    for (int32_t t = 0; t < ch->n; t++) {
        const char *src =
            (const char *)a->q + ((ch->row0 + t) * a->q_row + (int64_t)g * G * D) * (int64_t)es;
        if (bf16_dot) {
            /* [D/2][GP] bf16 pairs along the head dimension */
            const uint16_t *qb = (const uint16_t *)src;
            uint32_t *dst = (uint32_t *)qt + (int64_t)t * (D / 2) * GP;
            for (int32_t d = 0; d < D; d += 2)
                for (int32_t h = 0; h < GP; h++)
                    dst[(int64_t)(d / 2) * GP + h] =
                        h < G ? (uint32_t)qb[(int64_t)h * D + d] |
                                    (uint32_t)qb[(int64_t)h * D + d + 1] << 16
                              : 0u;
            continue;
        }
        /* Pre-scaled by the softmax scale, transposed to [D][GP] (padding
         * heads are zero). */
        float *tmp = acc; /* acc is initialised below */
        level_convert(tmp, src, a->act, (int64_t)G * D);
        float *dst = qt + (int64_t)t * D * GP;
        for (int32_t d = 0; d < D; d++)
            for (int32_t h = 0; h < GP; h++)
                dst[(int64_t)d * GP + h] = h < G ? tmp[(int64_t)h * D + d] * a->scale : 0.0f;
    }
    for (int64_t i = 0; i < (int64_t)rows * D; i++)
        acc[i] = 0.0f;
    for (int64_t r = 0; r < (int64_t)ch->n * GP; r++) {
        mrow[r] = -INFINITY;
        lrow[r] = 0.0f;
    }

    /* This split's slice of the item's blocks. */
    int32_t nblocks = a->sel ? sparse_union(a, ch, g, uni, cursor) : chunk_block_count(ch, B);
    int32_t u0 = (int32_t)((int64_t)nblocks * split / S),
            u1 = (int32_t)((int64_t)nblocks * (split + 1) / S);
    if (a->sel) /* cursors track each token's position in its own row */
        for (int32_t t = 0; t < ch->n; t++)
            cursor[t] = 0;

    for (int32_t u = u0; u < u1; u++) {
        int32_t n = a->sel ? uni[u] : u;
        int64_t blk0 = (int64_t)n * B;
#if MSA_CPU_DECODE_ROWS
        dr_next nx = {0};
#endif
        if (u + 1 < u1) { /* the next block sits elsewhere: start its loads now */
            const int64_t j1 = (int64_t)(a->sel ? uni[u + 1] : u + 1) * B;
            const int64_t p_last = ch->pos0 + ch->n - 1;
            const int32_t P = a->k.page_size;
            const int32_t n1 = (int32_t)(p_last + 1 - j1 < TW ? p_last + 1 - j1 : TW);
            (void)P, (void)n1;
#if MSA_CPU_DECODE_ROWS
            const int bf16_rows = bf16_pv && GP == 16; /* bf16 or fp8 K and V */
            (void)bf16_rows;
            if (((dr_qk && dr_pv) || bf16_rows) && !nv_kv && k_packed && v_packed &&
                (j1 % P) + n1 <= P && msa_dtype_size(a->k.dtype) == msa_dtype_size(a->v.dtype)) {
                /* spread over this block's score passes */
                nx.k = cpu_plane_row(&a->k, pt[j1 / P], g, (int32_t)(j1 % P));
                nx.v = cpu_plane_row(&a->v, pt[j1 / P], g, (int32_t)(j1 % P));
                nx.left = (int64_t)n1 * D * (int64_t)msa_dtype_size(a->k.dtype);
            } else
#endif
                prefetch_block(a, pt, g, j1, B, p_last);
        }
        /* tokens that use this block */
        uint8_t uses[MSA_CPU_ATTN_ROWS];
        int64_t last = -1;
        for (int32_t t = 0; t < ch->n; t++) {
            int64_t pos = ch->pos0 + t;
            int use = pos >= blk0;
            if (a->sel && use) {
                const int32_t *row = a->sel + ((ch->row0 + t) * Hkv + g) * a->sel_width;
                while (cursor[t] < a->sel_width && row[cursor[t]] >= 0 && row[cursor[t]] < n)
                    cursor[t]++;
                use = cursor[t] < a->sel_width && row[cursor[t]] == n;
            }
            uses[t] = (uint8_t)use;
            if (use)
                last = pos;
        }
        if (last < 0)
            continue;
        int64_t blk1 = blk0 + B - 1 < last ? blk0 + B - 1 : last;
        for (int64_t j0 = blk0; j0 <= blk1; j0 += TW) {
            int32_t nk = (int32_t)(blk1 - j0 + 1 < TW ? blk1 - j0 + 1 : TW);
            const void *keys = kt;
#if MSA_CPU_DQ_FP8_BF16
            if (fp8_kv)
                level_fp8_rows_bf16((uint16_t *)kt, &a->k, pt, g, j0, nk);
            else if (nv_kv)
                level_nvfp4_rows_bf16((uint16_t *)kt, &a->k, pt, g, j0, nk);
            else
#endif
                if ((bf16_dot || dr_qk) && k_packed && (j0 % a->k.page_size) + nk <= a->k.page_size)
                keys = cpu_plane_row(&a->k, pt[j0 / a->k.page_size], g,
                                     (int32_t)(j0 % a->k.page_size));
            else if (bf16_dot || dr_qk)
                msa_cpu_copy_rows(kt, &a->k, pt, g, j0, nk);
            else
                level_load_rows(kt, &a->k, pt, g, j0, nk);
            const int32_t npairs = (nk + 1) / 2;
            if (bf16_pv) {
                /* vt[0 .. npairs * D) as uint32 pairs (v[2jp][d], v[2jp+1][d]);
                 * rows copied to the second half of vt when not in one page. */
                const uint16_t *vrows;
                if (q_kv) {
#if MSA_CPU_DQ_FP8_BF16
                    uint16_t *conv = (uint16_t *)(vt + (int64_t)MSA_CPU_TILE * D / 2);
                    if (fp8_kv)
                        level_fp8_rows_bf16(conv, &a->v, pt, g, j0, nk);
                    else
                        level_nvfp4_rows_bf16(conv, &a->v, pt, g, j0, nk);
                    vrows = conv;
#endif
                } else if (v_packed && (j0 % a->v.page_size) + nk <= a->v.page_size) {
                    vrows = cpu_plane_row(&a->v, pt[j0 / a->v.page_size], g,
                                          (int32_t)(j0 % a->v.page_size));
                } else {
                    uint16_t *copy = (uint16_t *)(vt + (int64_t)MSA_CPU_TILE * D / 2);
                    msa_cpu_copy_rows(copy, &a->v, pt, g, j0, nk);
                    vrows = copy;
                }
                uint32_t *vp = (uint32_t *)vt;
                for (int32_t jp = 0; jp < npairs; jp++) {
                    const uint16_t *r0 = vrows + (int64_t)(2 * jp) * D;
                    const uint16_t *r1 = 2 * jp + 1 < nk ? r0 + D : NULL;
                    uint32_t *dst = vp + (int64_t)jp * D;
                    if (r1)
                        for (int32_t d = 0; d < D; d++)
                            dst[d] = (uint32_t)r0[d] | (uint32_t)r1[d] << 16;
                    else
                        for (int32_t d = 0; d < D; d++)
                            dst[d] = (uint32_t)r0[d];
                }
            } else if (dr_pv) {
                if (v_packed && (j0 % a->v.page_size) + nk <= a->v.page_size) {
                    vrows_dr = cpu_plane_row(&a->v, pt[j0 / a->v.page_size], g,
                                             (int32_t)(j0 % a->v.page_size));
                } else {
                    msa_cpu_copy_rows(vt, &a->v, pt, g, j0, nk);
                    vrows_dr = vt;
                }
            } else {
                level_load_rows(vt, &a->v, pt, g, j0, nk);
            }
            /* Tokens whose scores of this tile were computed together:
             * grp[0 .. ngrp), the next one to use is grp[gi]. */
            int32_t grp[MSA_CPU_ATTN_GROUP], ngrp = 0, gi = 0;
            (void)grp, (void)ngrp, (void)gi; /* bf16 levels only */
            for (int32_t t = 0; t < ch->n; t++) {
                int64_t pos = ch->pos0 + t;
                if (!uses[t] || pos < j0)
                    continue;
                int32_t vis = pos - j0 + 1 < nk ? (int32_t)(pos - j0 + 1) : nk;
                float *mt = mrow + (int64_t)t * GP, *lt = lrow + (int64_t)t * GP;
                float *s = sbuf;
#if MSA_CPU_HAVE_BF16_DOT
                if (bf16_dot && GP == 16) {
                    /* Scores of up to four tokens that use this tile in one
                     * pass over its keys (the keys visible to the last,
                     * which sees the most; each token reads only its own
                     * visible ones). */
                    if (gi == ngrp) {
                        ngrp = gi = 0;
                        for (int32_t tu = t; tu < ch->n && ngrp < MSA_CPU_ATTN_GROUP; tu++)
                            if (uses[tu] && ch->pos0 + tu >= j0)
                                grp[ngrp++] = tu;
                        const int64_t pl = ch->pos0 + grp[ngrp - 1];
                        const int32_t nv = pl - j0 + 1 < nk ? (int32_t)(pl - j0 + 1) : nk;
                        const uint32_t *qs[MSA_CPU_ATTN_GROUP];
                        for (int i = 0; i < MSA_CPU_ATTN_GROUP; i++)
                            qs[i] = (const uint32_t *)qt +
                                    (int64_t)grp[i < ngrp ? i : 0] * (D / 2) * GP;
                        /* 16 keys at a time, the next block's rows
                         * prefetched in between (dr_next) */
                        for (int32_t c = 0; c < nv; c += 16) {
                            const int32_t nc = nv - c < 16 ? nv - c : 16;
                            const uint16_t *kc = (const uint16_t *)keys + (int64_t)c * D;
#if MSA_CPU_DECODE_ROWS
                            /* A single token's passes prefetch their share
                             * themselves (msa_scores16_bf16_prefetch). */
                            if (ngrp > 1 || !MSA_CPU_SCORES_PREFETCH)
                                dr_next_bytes(&nx, (int64_t)nc * D *
                                                       (int64_t)msa_dtype_size(a->k.dtype));
#endif
                            if (ngrp > 1)
                                msa_scores_heads_bf16_x4(sbuf + (int64_t)c * GP,
                                                         (int64_t)MSA_CPU_TILE * GP, qs, kc, D, nc,
                                                         qk_scale);
                            else
#if MSA_CPU_DECODE_ROWS && MSA_CPU_SCORES_PREFETCH
                                msa_scores16_bf16_prefetch(sbuf + (int64_t)c * GP, qs[0], kc, D, nc,
                                                           qk_scale, &nx);
#else
                                msa_scores_heads_bf16(sbuf + (int64_t)c * GP, qs[0], GP, kc, D, nc,
                                                      qk_scale);
#endif
                        }
                    }
                    s = sbuf + (int64_t)gi++ * MSA_CPU_TILE * GP;
                } else if (bf16_dot)
                    msa_scores_heads_bf16(s, (const uint32_t *)qt + (int64_t)t * (D / 2) * GP, GP,
                                          (const uint16_t *)keys, D, vis, qk_scale);
                else
#endif
#if MSA_CPU_DECODE_ROWS
                    if (dr_qk)
                    dr_scores_heads(s, qt + (int64_t)t * D * GP, GP,
                                    k_fp8 ? NULL : (const uint16_t *)keys,
                                    k_fp8 ? (const uint8_t *)keys : NULL, k_s256, D, vis, &nx);
                else
#endif
                    msa_scores_heads(s, qt + (int64_t)t * D * GP, GP, (const float *)keys, D, vis);
                for (int32_t h0 = 0; h0 < GP; h0 += 16) {
#if MSA_CPU_DECODE_ROWS
                    if (dr_pv) {
                        float corr[16];
                        dr_softmax16(mt + h0, lt + h0, s + h0, GP, vis, corr);
                        dr_pv_heads(acc + ((int64_t)t * G + h0) * D, corr, s + h0, GP,
                                    G - h0 < 16 ? G - h0 : 16,
                                    v_fp8 ? NULL : (const uint16_t *)vrows_dr,
                                    v_fp8 ? (const uint8_t *)vrows_dr : NULL, v_s256, D, vis);
                        continue;
                    }
#endif
#if MSA_CPU_WIDE
                    const msa_v16 mold = MSA_V16_LOAD(mt + h0);
                    msa_v16 mx = mold;
                    for (int32_t jj = 0; jj < vis; jj++)
                        msa_v16_max(&mx, s + (int64_t)jj * GP + h0);
                    MSA_V16_STORE(mt + h0, mx);
                    float corr[16], mxs[16], mos[16];
                    MSA_V16_STORE(mxs, mx);
                    MSA_V16_STORE(mos, mold);
                    for (int l = 0; l < 16; l++)
                        corr[l] = msa_exp_neg(mos[l] - mxs[l]);
                    msa_v16 sum = MSA_V16_LOAD(lt + h0) * MSA_V16_LOAD(corr);
                    for (int32_t jj = 0; jj < vis; jj++) {
                        float *sj = s + (int64_t)jj * GP + h0;
                        for (int l = 0; l < 16; l++)
                            sj[l] = msa_exp_neg(sj[l] - mxs[l]);
                        sum += MSA_V16_LOAD(sj);
                    }
                    MSA_V16_STORE(lt + h0, sum);
#else
                    /* The same operations lane by lane on arrays, which the
                     * vectorizer maps onto registers of any width (a 64-byte
                     * vector value would go through memory here). */
                    float corr[16], mxs[16], sum[16];
                    for (int l = 0; l < 16; l++)
                        mxs[l] = mt[h0 + l];
                    for (int32_t jj = 0; jj < vis; jj++) {
                        const float *sj = s + (int64_t)jj * GP + h0;
                        for (int l = 0; l < 16; l++)
                            mxs[l] = sj[l] > mxs[l] ? sj[l] : mxs[l];
                    }
                    for (int l = 0; l < 16; l++) {
                        corr[l] = msa_exp_neg(mt[h0 + l] - mxs[l]);
                        sum[l] = lt[h0 + l] * corr[l];
                        mt[h0 + l] = mxs[l];
                    }
                    for (int32_t jj = 0; jj < vis; jj++) {
                        float *sj = s + (int64_t)jj * GP + h0;
                        for (int l = 0; l < 16; l++) {
                            sj[l] = msa_exp_neg(sj[l] - mxs[l]);
                            sum[l] += sj[l];
                        }
                    }
                    for (int l = 0; l < 16; l++)
                        lt[h0 + l] = sum[l];
#endif
#if MSA_CPU_HAVE_BF16_DOT
                    if (bf16_pv) {
                        /* weights of keys 2jp, 2jp+1 as bf16 pairs; a key
                         * past `vis` weighs 0 */
                        int32_t vp_pairs = (vis + 1) / 2;
                        for (int32_t jp = 0; jp < vp_pairs; jp++) {
                            const float *s0 = s + (int64_t)(2 * jp) * GP + h0;
                            const float *s1 = s0 + GP;
                            int has1 = 2 * jp + 1 < vis;
                            for (int l = 0; l < 16; l++)
                                pp[jp * 16 + l] = (uint32_t)msa_bf16_round(s0[l]) |
                                                  (uint32_t)(has1 ? msa_bf16_round(s1[l]) : 0u)
                                                      << 16;
                        }
                        int l = 0;
#ifdef MSA_CPU_HAVE_PV_TILE4
                        if (D % 64 == 0)
                            for (; l + 4 <= 16 && h0 + l + 4 <= G; l += 4)
                                msa_pv_tile4_bf16(acc + ((int64_t)t * G + h0 + l) * D, corr + l,
                                                  pp + l, 16, (const uint32_t *)vt, D, vp_pairs,
                                                  &nx); /* the row kernels' levels only */
#endif
                        for (; l < 16 && h0 + l < G; l++)
                            msa_pv_tile_bf16(acc + ((int64_t)t * G + h0 + l) * D, corr[l], pp + l,
                                             16, (const uint32_t *)vt, D, vp_pairs);
                        continue;
                    }
#endif
                    for (int l = 0; l < 16 && h0 + l < G; l++)
                        msa_pv_tile(acc + ((int64_t)t * G + h0 + l) * D, corr[l], s + h0 + l, GP,
                                    vt, D, vis);
                }
            }
        }
#if MSA_CPU_DECODE_ROWS
        dr_next_bytes(&nx, -1); /* what this block's passes did not cover */
#endif
    }

    if (q_kv) { /* the values' scale (the weights summed to l unscaled) */
        const float vs = fp8_kv ? 256.0f * a->v.scale : a->v.scale;
        for (int64_t i = 0; i < (int64_t)rows * D; i++)
            acc[i] *= vs;
    }
    if (S == 1) {
        for (int32_t t = 0; t < ch->n; t++)
            for (int32_t h = 0; h < G; h++) {
                int32_t r = t * G + h;
                msa_cpu_attn_store(a, ch, g, t, h, acc + (int64_t)r * D, mrow[(int64_t)t * GP + h],
                                   lrow[(int64_t)t * GP + h]);
            }
        return;
    }
    /* Partial of this split: [rows][D + 2] = acc, m, l. */
    float *part = cp->partials + item * cp->partial_rows * (D + 2);
    for (int32_t r = 0; r < rows; r++) {
        float *pr = part + (int64_t)r * (D + 2);
        for (int32_t d = 0; d < D; d++)
            pr[d] = acc[(int64_t)r * D + d];
        pr[D] = mrow[(int64_t)(r / G) * GP + r % G];
        pr[D + 1] = lrow[(int64_t)(r / G) * GP + r % G];
    }
}
