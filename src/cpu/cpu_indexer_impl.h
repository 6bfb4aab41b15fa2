/* The index scan's block scores of one chunk (SPEC section 4), compiled
 * once per instruction-set level: included by cpu_level.h only.  The
 * driver (waves, tasks, selection) is in cpu_indexer.c. */

/* Running block score of one (token, index head) row over sub-tiles. */
typedef struct score_acc {
    float mx;
    float sum; /* lse only: sum of exp(x - mx) */
    int nan;
} score_acc;

/* The block score of a finished row: NaN when any of its scores was (ranked
 * below every number), else the max, or ln(sum exp) for lse. */
static inline float score_acc_value(const score_acc *a, int lse)
{
    if (a->nan)
        return NAN;
    if (!lse || isinf(a->mx))
        return a->mx;
    return a->mx + logf(a->sum);
}

#if MSA_CPU_DR_FP8_DOT
/* Raw scores sr[r * ld + j] of the nk nvfp4 index keys from position j0
 * (keys of page table pt) for the rows of qr, 16 keys at a time: each
 * group widened to bf16 in the first-level cache
 * (level_nvfp4_rows_bf16), its products by vdpbf16ps, the plane's global
 * scale on the sums.  Codes and group scales two groups ahead are
 * prefetched, up to position last. */
static void nv_scores_tile(float *sr, int64_t ld, const dr_qrows *qr, const cpu_plane *ik,
                           const int32_t *pt, int64_t j0, int32_t nk, int64_t last)
{
    const int32_t dim = ik->dim, P = ik->page_size;
    for (int32_t jj = 0; jj < nk; jj += 16) {
        const int64_t ja = j0 + jj + 32;
        if (ja <= last) { /* up to 16 rows, inside ja's page */
            const int32_t off = (int32_t)(ja % P);
            int32_t na = last - ja + 1 < 16 ? (int32_t)(last - ja + 1) : 16;
            na = off + na <= P ? na : P - off;
            const uint8_t *codes, *gs;
            cpu_plane_nvfp4_row(ik, pt[ja / P], 0, off, &codes, &gs);
            for (int64_t b = 0; b < (int64_t)na * dim / 2; b += 64)
                __builtin_prefetch(codes + b, 0, 2);
            for (int64_t b = 0; b < (int64_t)na * dim / 16; b += 64)
                __builtin_prefetch(gs + b, 0, 2);
        }
        const int32_t ng = nk - jj < 16 ? nk - jj : 16;
        uint16_t kb[16 * DR_MAX_DIM];
        level_nvfp4_rows_bf16(kb, ik, pt, 0, j0 + jj, ng);
        dr_dot_keys(sr + jj, ld, qr, kb, dim, ng, ik->scale);
    }
}
#endif

static void score_task(select_job *job, int64_t c, int32_t b0, int32_t b1, float *scratch)
{
    const msa_plan *p = job->plan;
    const msa_model *m = p->model;
    const msa_cache *cache = p->cache;
    cpu_plan *cp = p->backend;
    const cpu_chunk *ch = &cp->chunks[c];
    const int32_t Hi = m->cfg.num_index_heads, Di = m->cfg.index_dim, B = m->cfg.block_size;
    const int32_t TW = B < MSA_CPU_TILE ? B : MSA_CPU_TILE;
    const int lse = m->cfg.score_type == MSA_SCORE_LSE;
    const float c_scale = m->cfg.index_softmax_scale;
    const int32_t rows = ch->n * Hi;
    const cpu_plane ik = cpu_plane_of(cache, job->layer, MSA_PLANE_INDEX_K);
    const int32_t *pt = p->page_table + (int64_t)ch->request * p->cap_pages_per_request;

    /* scratch: q [rows][Di] | key tile [TW16][Di] | raw scores [rows][TW16] | acc [rows] |
     * (rows along the lanes) bf16 pairs [Di / 2][rows rounded up to 16] for vdpbf16ps, or
     * fp32 [Di][rows rounded up to 16] */
    float *q = scratch;
    float *tile = q + (int64_t)rows * Di;
    const int32_t TW16 = (TW + 15) & ~15;
    float *sr = tile + (int64_t)TW16 * Di;
    score_acc *acc = (score_acc *)(sr + (int64_t)rows * TW16);
    const char *q_src = (const char *)job->io->idx_q +
                        ch->row0 * Hi * Di * (int64_t)msa_dtype_size(job->io->act_dtype);
    /* bf16 queries and keys: dot products straight from the stored bf16
     * values (no conversion pass), where the level has no widening rows
     * (NEON-BF16: MSA_CPU_BF16_SCAN).  On AVX512-BF16 the widening rows
     * below, register-blocked, scan faster than that kernel (32K decode on
     * Zen 4: the sparse layer 0.6-0.75x the time), and their vdpbf16ps
     * form (dr_dot) faster still. */
    const int bf16_dot = MSA_CPU_BF16_SCAN && job->io->act_dtype == MSA_DTYPE_BF16 &&
                         ik.dtype == MSA_DTYPE_BF16 && Di % 32 == 0;
    if (!bf16_dot) {
        level_convert(q, q_src, job->io->act_dtype, (int64_t)rows * Di);
    }
    /* bf16 keys, and fp8 e4m3 keys whose 256 * scale is finite, on the AVX2
     * and AVX-512 levels: read in place, widened in registers
     * (cpu_decode_rows.h), the same sums as msa_dot16_rows on the fp32
     * rows (fp8: de-quantized by the scalar read rule, bit for bit),
     * except with bf16 queries on AVX512-BF16 (dr_dot below). */
#if MSA_CPU_DR_FP8
    const int dr_fp8 = ik.dtype == MSA_DTYPE_FP8_E4M3 && dq_fp8_fast_scale(ik.scale);
#else
    const int dr_fp8 = 0;
#endif
#if MSA_CPU_DECODE_ROWS
    const int dr_scan = !bf16_dot && (ik.dtype == MSA_DTYPE_BF16 || dr_fp8) && Di % 16 == 0 &&
                        Di <= DR_MAX_DIM;
    const int64_t key_bytes = (int64_t)msa_dtype_size(ik.dtype); /* per element, dr_scan */
#else
    const int dr_scan = 0;
    (void)dr_fp8;
#endif
    /* bf16 or fp8 keys and bf16 queries of a decode or verify step, or of
     * a prefill chunk whose index keys are quantized, on AVX512-BF16:
     * products of bf16 pairs (dr_dot_keys, dr_index_scores_fp8_dot). */
#if MSA_CPU_DR_FP8_DOT
    const int dot_rows = job->io->act_dtype == MSA_DTYPE_BF16 && Di % 32 == 0 && Di <= DR_MAX_DIM &&
                         rows <= DR_DOT_MAX_ROWS && dr_bf16_dot_exact(q, (int64_t)rows * Di);
    const int dr_dot = dr_scan && dot_rows;
    /* nvfp4 keys the same way: each group of 16 keys widened to bf16 (E2M1
     * value times group scale, exact: level_nvfp4_rows_bf16), the global
     * scale applied to the sums, as the attention does with nvfp4 K. */
    const int dr_nv = dot_rows && ik.dtype == MSA_DTYPE_NVFP4 && isfinite(ik.scale);
    uint16_t qb[DR_LANES_MIN_ROWS * DR_MAX_DIM];
    const int32_t rp = (rows + 15) & ~15;
    uint32_t *qt2 = (uint32_t *)(acc + rows); /* scratch past acc: [Di / 2][rp] */
    const dr_qrows qrows = {qb, rows >= DR_LANES_MIN_ROWS ? qt2 : NULL, rows, rp};
    __m512i lut[4];
    if ((dr_dot || dr_nv) && qrows.qt2)
        dr_pack_pairs(qt2, rp, q, rows, Di);
    else if (dr_dot || dr_nv)
        dr_pack_bf16(qb, q, (int64_t)rows * Di);
    if (dr_dot && dr_fp8)
        dq_fp8_bf16_tables(lut);
#else
    const int dr_nv = 0;
    const int dr_dot = 0;
#endif
#if MSA_CPU_DECODE_ROWS
    /* The AVX2 scan of a verify step's many rows: the rows along the lanes
     * (dr_index_scores_lanes), their queries transposed into the scratch
     * past acc ([Di][rows rounded up to 16]).  On AVX-512 the register
     * block reduces 16 lanes per sum and measured as fast as the lanes
     * pass (Zen 4: 89 against 87-97 GFLOP/s alone in L1, the 32K verify
     * step on two threads within the spread), so it keeps that block. */
    const int32_t rpl = (rows + 15) & ~15;
    const int dr_lanes = DR_LANES == 8 && dr_scan && !dr_dot && rows >= DR_ROWS_LANES_MIN &&
                         rpl <= DR_ROWS_LANES_MAX;
    float *qtl = (float *)(acc + rows);
    if (dr_lanes)
        dr_transpose_rows(qtl, rpl, q, rows, Di);
#else
    (void)dr_dot;
#endif
    const int64_t p_last = ch->pos0 + ch->n - 1;
    float *out = cp->scores + ch->score_off;

    /* The last key this task reads (prefetches stop there). */
    const int64_t blk_end = (int64_t)b1 * B - 1 < p_last ? (int64_t)b1 * B - 1 : p_last;
    (void)blk_end;
    for (int32_t n = b0; n < b1; n++) {
        int64_t blk0 = (int64_t)n * B;
        int64_t blk1 = blk0 + B - 1 < p_last ? blk0 + B - 1 : p_last; /* last key to read */
        for (int32_t rr = 0; rr < rows; rr++)
            acc[rr] = (score_acc){-INFINITY, 0.0f, 0};
        for (int64_t j0 = blk0; j0 <= blk1; j0 += TW) {
            int32_t nk = (int32_t)(blk1 - j0 + 1 < TW ? blk1 - j0 + 1 : TW);
            /* Zero the rows up to the next multiple of 16 keys: the
             * 16-key dot products read them (their scores are not used). */
            int32_t nk16 = (nk + 15) & ~15;
            const uint16_t *keys = (const uint16_t *)tile;
#if MSA_CPU_DR_FP8_DOT
            if (dr_nv) {
                nv_scores_tile(sr, TW16, &qrows, &ik, pt, j0, nk, blk_end);
            } else
#endif
#if MSA_CPU_DECODE_ROWS
                if (dr_scan) {
                const char *kd = (const char *)tile; /* bf16 or fp8 rows [nk][Di] */
                if (cpu_plane_packed(&ik) && (j0 % ik.page_size) + nk <= ik.page_size)
                    kd = cpu_plane_row(&ik, pt[j0 / ik.page_size], 0, (int32_t)(j0 % ik.page_size));
                else
                    msa_cpu_copy_rows(tile, &ik, pt, 0, j0, nk);
                for (int32_t jj = 0; jj < nk; jj += 16) {
                    /* Two groups ahead, across tiles and pages: the rows of
                     * the next page need not follow this one in memory. */
                    const int64_t ja = j0 + jj + 32;
                    if (ja <= blk_end) {
                        /* the 16 keys' rows in their first page (a page
                         * boundary inside the group only shortens a hint) */
                        const int32_t na = blk_end - ja + 1 < 16 ? (int32_t)(blk_end - ja + 1) : 16;
                        const int32_t off = (int32_t)(ja % ik.page_size);
                        const char *r = cpu_plane_row(&ik, pt[ja / ik.page_size], 0, off);
                        const int64_t step = ik.row_stride * key_bytes;
                        for (int32_t l = 0; l < na && off + l < ik.page_size; l++)
                            for (int64_t b = 0; b < Di * key_bytes; b += 64)
                                __builtin_prefetch(r + l * step + b, 0, 2);
                    }
                    const int32_t ng = nk - jj < 16 ? nk - jj : 16;
#if MSA_CPU_DR_FP8_DOT
                    if (dr_dot && dr_fp8) {
                        dr_index_scores_fp8_dot(sr + jj, TW16, &qrows,
                                                (const uint8_t *)kd + (int64_t)jj * Di, Di, ng,
                                                ik.scale, lut);
                        continue;
                    }
                    if (dr_dot) {
                        dr_dot_keys(sr + jj, TW16, &qrows, (const uint16_t *)kd + (int64_t)jj * Di,
                                    Di, ng, 1.0f);
                        continue;
                    }
#endif
                    if (dr_lanes)
                        dr_index_scores_lanes(sr + jj, TW16, qtl, rpl, rows,
                                              kd + (int64_t)jj * Di * key_bytes, Di, ng, dr_fp8,
                                              ik.scale);
                    else
                        dr_index_scores(sr + jj, TW16, q, rows, kd + (int64_t)jj * Di * key_bytes,
                                        Di, ng, dr_fp8, ik.scale);
                }
            } else
#endif
                if (bf16_dot && cpu_plane_packed(&ik) &&
                    (j0 % ik.page_size) + nk16 <= ik.page_size) {
                /* The 16-key groups lie inside one page: read them in place.
                 * Rows past the last key belong to the page too; their
                 * scores are never used. */
                keys = cpu_plane_row(&ik, pt[j0 / ik.page_size], 0, (int32_t)(j0 % ik.page_size));
            } else if (bf16_dot) {
                msa_cpu_copy_rows(tile, &ik, pt, 0, j0, nk);
                memset((uint16_t *)tile + (int64_t)nk * Di, 0, (size_t)(nk16 - nk) * Di * 2);
            } else {
                (void)keys; /* only the bf16 path reads keys in place */
                level_load_rows(tile, &ik, pt, 0, j0, nk);
                for (int64_t i = (int64_t)nk * Di; i < (int64_t)nk16 * Di; i++)
                    tile[i] = 0.0f;
            }
            /* Raw scores of every row, one group of 16 keys at a time so the
             * group stays in L1 while all rows use it. */
            for (int32_t jj = 0; jj < (dr_scan || dr_nv ? 0 : nk); jj += 16) {
                if (jj + 16 < nk) /* the next group, while this one computes */
                    for (int64_t b = 0; b < (int64_t)16 * Di * (bf16_dot ? 2 : 4); b += 64)
                        __builtin_prefetch(
                            (const char *)(bf16_dot
                                               ? (const void *)(keys + (int64_t)(jj + 16) * Di)
                                               : (const void *)(tile + (int64_t)(jj + 16) * Di)) +
                            b);
                for (int32_t rr = 0; rr < rows; rr++) {
                    if (ch->pos0 + rr / Hi < j0 + jj)
                        continue; /* keys after this token */
                    float *out16 = sr + (int64_t)rr * TW16 + jj;
                    const float *qr = q + (int64_t)rr * Di;
#if MSA_CPU_BF16_SCAN
                    if (bf16_dot)
                        msa_dot16_rows_bf16(out16, (const uint16_t *)q_src + (int64_t)rr * Di,
                                            keys + (int64_t)jj * Di, Di);
                    else
#endif
                        if (Di % 16 == 0)
                        msa_dot16_rows(out16, qr, tile + (int64_t)jj * Di, Di);
                    else
                        for (int32_t l = 0; l < 16; l++)
                            out16[l] = msa_dot_f32(qr, tile + (int64_t)(jj + l) * Di, Di);
                }
            }
            for (int32_t rr = 0; rr < rows; rr++) {
                int64_t pos = ch->pos0 + rr / Hi;
                if (pos < j0)
                    continue; /* keys after this token */
                int32_t vis = pos - j0 + 1 < nk ? (int32_t)(pos - j0 + 1) : nk;
                float *sr_row = sr + (int64_t)rr * TW16;
                score_acc *a = &acc[rr];
                if (lse)
                    for (int32_t jj = 0; jj < vis; jj++)
                        sr_row[jj] *= c_scale;
                float mx = -INFINITY;
#if MSA_CPU_DECODE_ROWS
                mx = dr_row_max(sr_row, vis, &a->nan);
#else
                for (int32_t jj = 0; jj < vis; jj++) {
                    if (isnan(sr_row[jj]))
                        a->nan = 1;
                    else if (sr_row[jj] > mx)
                        mx = sr_row[jj];
                }
#endif
                if (!lse || a->nan) {
                    if (mx > a->mx)
                        a->mx = mx;
                    continue;
                }
                /* lse: rescale the running sum when the maximum grows. */
                float nm = mx > a->mx ? mx : a->mx;
                if (isinf(nm)) {
                    a->mx = nm; /* +inf dominates; all -inf so far stays -inf */
                    continue;
                }
                float sum = a->sum * expf(a->mx - nm);
                for (int32_t jj = 0; jj < vis; jj++)
                    sum += expf(sr_row[jj] - nm);
                a->mx = nm;
                a->sum = sum;
            }
        }
        for (int32_t rr = 0; rr < rows; rr++) {
            if (ch->pos0 + rr / Hi < blk0)
                continue;
            out[(int64_t)rr * ch->blocks + n] = score_acc_value(&acc[rr], lse);
        }
    }
}
