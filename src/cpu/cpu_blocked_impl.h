/* Prefill kernels as blocked matrix products, compiled once per
 * instruction-set level: included by cpu_level.h only.
 *
 * A request's prefill rows (q_len above the decode range) are computed as
 * small matrix products instead of row by row.  Both stages follow the
 * same scheme: a tile of keys is packed once per work item into strips of
 * BK_NR keys laid out [dim][BK_NR], the query rows into panels of BK_MR
 * rows laid out [dim][BK_MR], and a micro-kernel keeps a BK_MR x BK_NR
 * block of scores in registers while it walks the head dimension.  The
 * scores of a tile go to a small buffer that is reduced at once (block
 * score of the index scan; online softmax of the attention), so no full
 * score matrix is stored.  The attention turns the product around
 * (S^T = K Q^T: keys broadcast straight from their rows, query rows
 * packed once per block along the lanes), which spares the packing of
 * every key tile when few rows use a block, and multiplies the softmax
 * weights by the value tile with a second micro-kernel (BK_MR rows x
 * BK_NR output columns in registers, walking the keys).
 *
 * Only planes in an activation format (fp32, bf16, fp16) come here; the
 * drivers (cpu_indexer.c, cpu_attention.c) route every other plane format
 * to the row kernels.  Every sum is in fp32, as on the row path. */

/* Register blocking per target: accumulators BK_MR x BK_NV vectors plus
 * BK_NV key (or value) vectors and one broadcast fit the register file
 * (AVX-512: 16 + 3 of 32; AVX2 and SSE: 12 + 3 of 16; NEON: 12 + 3 of 32). */
#if defined(__AVX512F__)
#define BK_VN 16
#define BK_MR 8
#define BK_BLOCK_TEXT "8 x 32"
#elif defined(__AVX__)
#define BK_VN 8
#define BK_MR 6
#define BK_BLOCK_TEXT "6 x 16"
#else
#define BK_VN 4
#define BK_MR 6
#define BK_BLOCK_TEXT "6 x 8"
#endif
#define BK_NV 2
#define BK_NR (BK_VN * BK_NV)

#if BK_MR > MSA_CPU_BK_MR_MAX || BK_NR > MSA_CPU_BK_NR_MAX
#error "the blocked kernels' scratch bounds (cpu_kernels.h) are too small for this level"
#endif

typedef float bk_vec __attribute__((vector_size(4 * BK_VN)));
typedef float bk_vecu __attribute__((vector_size(4 * BK_VN), aligned(4)));
#define BK_LOAD(p) (*(const bk_vecu *)(p))
#define BK_STORE(p, v) (*(bk_vecu *)(p) = (v))

static inline int32_t bk_round_up(int32_t x, int32_t m)
{
    return (x + m - 1) / m * m;
}

/* s[r * lds + c] = sum over d of qp[d][r] * kp[d][c], r < BK_MR, c < BK_NR:
 * each step loads BK_NV key vectors and broadcasts BK_MR query values into
 * BK_MR * BK_NV independent fused multiply-add chains.  Every score sums
 * over d in order, whatever its place in the block. */
static inline void bk_kernel_qk(float *restrict s, int64_t lds, const float *restrict qp,
                                const float *restrict kp, int32_t dim)
{
    bk_vec acc[BK_MR][BK_NV];
    for (int r = 0; r < BK_MR; r++)
        for (int v = 0; v < BK_NV; v++)
            acc[r][v] = (bk_vec){0};
    for (int32_t d = 0; d < dim; d++) {
        bk_vec k[BK_NV];
        for (int v = 0; v < BK_NV; v++)
            k[v] = BK_LOAD(kp + (int64_t)d * BK_NR + v * BK_VN);
        for (int r = 0; r < BK_MR; r++) {
            const float q = qp[(int64_t)d * BK_MR + r];
            for (int v = 0; v < BK_NV; v++)
                acc[r][v] += q * k[v];
        }
    }
    for (int r = 0; r < BK_MR; r++)
        for (int v = 0; v < BK_NV; v++)
            BK_STORE(s + (int64_t)r * lds + v * BK_VN, acc[r][v]);
}

/* Packs rows [0, n) of src[n][dim] (fp32) into strips of BK_NR rows,
 * dst[strip][dim][BK_NR]; rows from n up to the next multiple of BK_NR
 * are zero. */
static void bk_pack_keys(float *restrict dst, const float *restrict src, int32_t n, int32_t dim)
{
    const int32_t np = bk_round_up(n, BK_NR);
    for (int32_t s0 = 0; s0 < np; s0 += BK_NR) {
        float *strip = dst + (int64_t)s0 * dim;
        for (int32_t c = 0; c < BK_NR; c++) {
            if (s0 + c < n) {
                const float *row = src + (int64_t)(s0 + c) * dim;
                for (int32_t d = 0; d < dim; d++)
                    strip[(int64_t)d * BK_NR + c] = row[d];
            } else {
                for (int32_t d = 0; d < dim; d++)
                    strip[(int64_t)d * BK_NR + c] = 0.0f;
            }
        }
    }
}

/* Packs rows idx[0 .. n) of src (row stride dim) into panels of BK_MR
 * rows, dst[panel][dim][BK_MR]; missing rows of the last panel are zero. */
static void bk_pack_rows(float *restrict dst, const float *restrict src, const int32_t *idx,
                         int32_t n, int32_t dim)
{
    const int32_t np = bk_round_up(n, BK_MR);
    for (int32_t p0 = 0; p0 < np; p0 += BK_MR) {
        float *panel = dst + (int64_t)p0 * dim;
        for (int32_t r = 0; r < BK_MR; r++) {
            if (p0 + r < n) {
                const float *row = src + (int64_t)idx[p0 + r] * dim;
                for (int32_t d = 0; d < dim; d++)
                    panel[(int64_t)d * BK_MR + r] = row[d];
            } else {
                for (int32_t d = 0; d < dim; d++)
                    panel[(int64_t)d * BK_MR + r] = 0.0f;
            }
        }
    }
}

/* Scores of every packed row panel against every packed key strip:
 * s[row][key] for rows < rows rounded up to BK_MR, keys < nkp (a multiple
 * of BK_NR); row stride lds. */
static void bk_scores(float *s, int64_t lds, const float *qp, int32_t rows, const float *kp,
                      int32_t nkp, int32_t dim)
{
    const int32_t rp = bk_round_up(rows, BK_MR);
    for (int32_t p0 = 0; p0 < rp; p0 += BK_MR)
        for (int32_t c0 = 0; c0 < nkp; c0 += BK_NR)
            bk_kernel_qk(s + (int64_t)p0 * lds + c0, lds, qp + (int64_t)p0 * dim,
                         kp + (int64_t)c0 * dim, dim);
}

typedef int32_t bk_veci __attribute__((vector_size(4 * BK_VN)));
typedef int32_t bk_veciu __attribute__((vector_size(4 * BK_VN), aligned(4)));

/* Largest element of x[0 .. n) (n a multiple of BK_VN), NaNs ignored, and
 * whether there is a NaN: lane-wise on vectors (a compare and a blend per
 * step), then over the lanes. */
static float bk_row_max(const float *x, int32_t n, int *has_nan)
{
    bk_vec mv = (bk_vec){0} - INFINITY;
    bk_veci nan = (bk_veci){0};
    for (int32_t j = 0; j < n; j += BK_VN) {
        const bk_vec y = BK_LOAD(x + j);
        const bk_veci gt = y > mv; /* false for a NaN */
        nan |= y != y;
        mv = (bk_vec)(((bk_veci)y & gt) | ((bk_veci)mv & ~gt));
    }
    float m = -INFINITY;
    int any = 0;
    for (int l = 0; l < BK_VN; l++) {
        m = mv[l] > m ? mv[l] : m;
        any |= nan[l] != 0;
    }
    *has_nan = any;
    return m;
}

/* x[0 .. BK_VN) = exp(x - m) lane by lane on one vector: msa_exp_neg's steps (clamp at
 * -87, n = round(x / ln 2), degree-7 Taylor polynomial of the remainder,
 * times 2^n; 0 below -87, so -inf gives 0) written on vectors, since the
 * compilers leave the scalar function's loop scalar here.  Rounding to
 * the nearest integer adds and subtracts 1.5 * 2^23, exact for |t| < 2^22
 * (here |t| < 126). */
static inline void bk_exp_neg_vec(float *x, const float *m)
{
    const bk_vec v = BK_LOAD(x) - BK_LOAD(m);
    const bk_vec lo = (bk_vec){0} - 87.0f;
    const bk_veci small = v < lo;
    const bk_vec xc = (bk_vec)(((bk_veci)lo & small) | ((bk_veci)v & ~small));
    const bk_vec t = xc * 1.44269504088896341f;
    const bk_vec n = (t + 12582912.0f) - 12582912.0f;
    bk_vec r = xc - n * 0.693145751953125f;
    r = r - n * 1.428606765330187e-06f;
    bk_vec p = (bk_vec){0} + 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const bk_veci e = (__builtin_convertvector(n, bk_veci) + 127) << 23;
    const bk_vec y = p * (bk_vec)e;
    BK_STORE(x, (bk_vec)((bk_veci)y & ~small));
}

/* x[j] = exp(x[j] - m) for j < n (n a multiple of BK_VN; -inf gives 0),
 * returns their sum (per lane, then over the lanes). */
static float bk_row_exp_sum(float *restrict x, int32_t n, float m)
{
    float mv[BK_VN];
    for (int l = 0; l < BK_VN; l++)
        mv[l] = m;
    bk_vec sv = (bk_vec){0};
    for (int32_t j = 0; j < n; j += BK_VN) {
        bk_exp_neg_vec(x + j, mv);
        sv += BK_LOAD(x + j);
    }
    float sum = 0.0f;
    for (int l = 0; l < BK_VN; l++)
        sum += sv[l];
    return sum;
}

#if MSA_CPU_HAVE_BF16_DOT
#include "cpu/cpu_blocked_bf16_impl.h"
#endif

/* ---- index scan ------------------------------------------------------ */

/* Block scores of chunk c, blocks [b0, b1), as blocked products of the
 * chunk's (token, index head) rows with each key tile; the block score
 * (max, or log-sum-exp of the scaled scores) is reduced from each tile's
 * scores while they are in cache.  Same results as score_task up to the
 * order of the fp32 sums (and the lse exponentials, computed here with
 * msa_exp_neg, relative error about 2e-7). */
static void score_blocked(select_job *job, int64_t c, int32_t b0, int32_t b1, float *scratch)
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
    const int32_t RP = bk_round_up(rows, BK_MR), TWP = bk_round_up(TW, BK_NR);
    const cpu_plane ik = cpu_plane_of(cache, job->layer, MSA_PLANE_INDEX_K);
    const int32_t *pt = p->page_table + (int64_t)ch->request * p->cap_pages_per_request;

    /* scratch: q [rows][Di] | q panels [RP][Di] | key tile [TW][Di] |
     *          key strips [TWP][Di] | scores [RP][TWP] | acc [rows] */
    float *q = scratch;
    float *qp = q + (int64_t)rows * Di;
    float *kt = qp + (int64_t)RP * Di;
    float *kp = kt + (int64_t)TW * Di;
    float *sb = kp + (int64_t)TWP * Di;
    score_acc *acc = (score_acc *)(sb + (int64_t)RP * TWP);
    int32_t *idx = (int32_t *)(acc + rows);

    const char *q_src = (const char *)job->io->idx_q +
                        ch->row0 * Hi * Di * (int64_t)msa_dtype_size(job->io->act_dtype);
    /* bf16 queries and index keys: bf16 dot products on pairs packed from
     * the stored values (q and kt then hold bf16, qp and kp pairs). */
    const int bf16 = MSA_CPU_HAVE_BF16_DOT && job->io->act_dtype == MSA_DTYPE_BF16 &&
                     ik.dtype == MSA_DTYPE_BF16 && Di % 2 == 0;
#if MSA_CPU_HAVE_BF16_DOT
    if (bf16)
        bk16_pack((uint32_t *)qp, (const uint16_t *)q_src, NULL, rows, Di, BK_MR);
#endif
    if (!bf16) {
        level_convert(q, q_src, job->io->act_dtype, (int64_t)rows * Di);
        for (int32_t r = 0; r < rows; r++)
            idx[r] = r;
        bk_pack_rows(qp, q, idx, rows, Di);
    }
    const int64_t p_last = ch->pos0 + ch->n - 1;
    float *out = cp->scores + ch->score_off;

    for (int32_t n = b0; n < b1; n++) {
        const int64_t blk0 = (int64_t)n * B;
        const int64_t blk1 = blk0 + B - 1 < p_last ? blk0 + B - 1 : p_last; /* last key read */
        for (int32_t rr = 0; rr < rows; rr++)
            acc[rr] = (score_acc){-INFINITY, 0.0f, 0};
        for (int64_t j0 = blk0; j0 <= blk1; j0 += TW) {
            const int32_t nk = (int32_t)(blk1 - j0 + 1 < TW ? blk1 - j0 + 1 : TW);
            const int32_t nkp = bk_round_up(nk, BK_NR);
            if (!bf16) {
                level_load_rows(kt, &ik, pt, 0, j0, nk);
                bk_pack_keys(kp, kt, nk, Di);
            }
#if MSA_CPU_HAVE_BF16_DOT
            else {
                msa_cpu_copy_rows(kt, &ik, pt, 0, j0, nk);
                bk16_pack((uint32_t *)kp, (const uint16_t *)kt, NULL, nk, Di, BK_NR);
            }
#endif
            /* Rows of tokens before j0 see none of these keys; the first
             * token's rows are the first rows, so a prefix of panels can
             * be skipped. */
            int32_t r0 = 0;
            while (r0 < rows && ch->pos0 + r0 / Hi < j0)
                r0++;
            r0 = r0 / BK_MR * BK_MR;
#if MSA_CPU_HAVE_BF16_DOT
            if (bf16)
                bk16_scores(sb + (int64_t)r0 * TWP, TWP,
                            (const uint32_t *)qp + (int64_t)r0 * (Di / 2), rows - r0,
                            (const uint32_t *)kp, nkp, Di);
            else
#endif
                bk_scores(sb + (int64_t)r0 * TWP, TWP, qp + (int64_t)r0 * Di, rows - r0, kp, nkp,
                          Di);
            for (int32_t rr = r0; rr < rows; rr++) {
                const int64_t pos = ch->pos0 + rr / Hi;
                if (pos < j0)
                    continue; /* keys after this token */
                const int32_t vis = pos - j0 + 1 < nk ? (int32_t)(pos - j0 + 1) : nk;
                float *x = sb + (int64_t)rr * TWP;
                score_acc *a = &acc[rr];
                if (lse)
                    for (int32_t jj = 0; jj < vis; jj++)
                        x[jj] *= c_scale;
                for (int32_t jj = vis; jj < nkp; jj++)
                    x[jj] = -INFINITY; /* invisible keys weigh nothing */
                int has_nan;
                const float mx = bk_row_max(x, nkp, &has_nan);
                a->nan |= has_nan;
                if (!lse || a->nan) {
                    if (mx > a->mx)
                        a->mx = mx;
                    continue;
                }
                /* lse: rescale the running sum when the maximum grows. */
                const float nm = mx > a->mx ? mx : a->mx;
                if (isinf(nm)) {
                    a->mx = nm; /* +inf dominates; all -inf so far stays -inf */
                    continue;
                }
                const float sum = a->sum * expf(a->mx - nm);
                a->sum = sum + bk_row_exp_sum(x, nkp, nm);
                a->mx = nm;
            }
        }
        for (int32_t rr = 0; rr < rows; rr++) {
            if (ch->pos0 + rr / Hi < blk0)
                continue;
            out[(int64_t)rr * ch->blocks + n] = score_acc_value(&acc[rr], lse);
        }
    }
}

/* ---- attention ------------------------------------------------------- */

/* st[i * ldr + c] = sum over d of k[i][d] * qp[d][c], keys i < BK_MR (rows
 * of k, stride dim), query rows c < BK_NR (a packed strip): the scores
 * transposed, keys down and query rows along the lanes.  The keys are
 * broadcast straight from their fp32 rows, so a key tile needs no
 * packing, only the query rows that use a block do (once per block). */
static inline void bk_kernel_kq(float *restrict st, int64_t ldr, const float *restrict k,
                                const float *restrict qp, int32_t dim)
{
    bk_vec acc[BK_MR][BK_NV];
    for (int i = 0; i < BK_MR; i++)
        for (int v = 0; v < BK_NV; v++)
            acc[i][v] = (bk_vec){0};
    for (int32_t d = 0; d < dim; d++) {
        bk_vec q[BK_NV];
        for (int v = 0; v < BK_NV; v++)
            q[v] = BK_LOAD(qp + (int64_t)d * BK_NR + v * BK_VN);
        for (int i = 0; i < BK_MR; i++) {
            const float kv = k[(int64_t)i * dim + d];
            for (int v = 0; v < BK_NV; v++)
                acc[i][v] += kv * q[v];
        }
    }
    for (int i = 0; i < BK_MR; i++)
        for (int v = 0; v < BK_NV; v++)
            BK_STORE(st + (int64_t)i * ldr + v * BK_VN, acc[i][v]);
}

/* o[r][c0 + c] += sum over j < n of pt[j * ldr + r] * v[j][c0 + c], r <
 * BK_MR, c < BK_NR: as bk_kernel_pv with the weights transposed (keys
 * down, rows along), so the BK_MR weights of a key are adjacent. */
static inline void bk_kernel_pv_t(float *const *o, int32_t c0, const float *restrict pt,
                                  int64_t ldr, const float *restrict v, int64_t ldv, int32_t n)
{
    bk_vec acc[BK_MR][BK_NV];
    for (int r = 0; r < BK_MR; r++)
        for (int x = 0; x < BK_NV; x++)
            acc[r][x] = BK_LOAD(o[r] + c0 + x * BK_VN);
    for (int32_t j = 0; j < n; j++) {
        bk_vec vv[BK_NV];
        for (int x = 0; x < BK_NV; x++)
            vv[x] = BK_LOAD(v + (int64_t)j * ldv + c0 + x * BK_VN);
        for (int r = 0; r < BK_MR; r++) {
            const float p = pt[(int64_t)j * ldr + r];
            for (int x = 0; x < BK_NV; x++)
                acc[r][x] += p * vv[x];
        }
    }
    for (int r = 0; r < BK_MR; r++)
        for (int x = 0; x < BK_NV; x++)
            BK_STORE(o[r] + c0 + x * BK_VN, acc[r][x]);
}

/* Packs rows idx[0 .. n) of src (row stride dim) into strips of BK_NR
 * rows, dst[strip][dim][BK_NR]; missing rows of the last strip are zero. */
static void bk_pack_strips(float *restrict dst, const float *restrict src, const int32_t *idx,
                           int32_t n, int32_t dim)
{
    const int32_t np = bk_round_up(n, BK_NR);
    for (int32_t s0 = 0; s0 < np; s0 += BK_NR) {
        float *strip = dst + (int64_t)s0 * dim;
        for (int32_t c = 0; c < BK_NR; c++) {
            if (s0 + c < n) {
                const float *row = src + (int64_t)idx[s0 + c] * dim;
                for (int32_t d = 0; d < dim; d++)
                    strip[(int64_t)d * BK_NR + c] = row[d];
            } else {
                for (int32_t d = 0; d < dim; d++)
                    strip[(int64_t)d * BK_NR + c] = 0.0f;
            }
        }
    }
}

/* Online softmax of one tile for BK_VN rows (lanes), keys j < nk down
 * st (stride ldr): keys at or past vis[lane] are masked out; the running
 * maximum m and sum l of each lane are updated, st becomes the weights
 * exp(s - m) and corr the factor of the lane's accumulator.  A lane that
 * has seen no key yet keeps m = -inf and gets zero weights (its exponent
 * is taken against 0 instead of -inf, which would give NaN). */
static void bk_softmax_lanes(float *st, int64_t ldr, int32_t nk, const int32_t *vis, float *m,
                             float *l, float *corr)
{
    const bk_veci visv = *(const bk_veciu *)vis;
    const bk_vec ninf = (bk_vec){0} - INFINITY;
    bk_vec mv = BK_LOAD(m);
    for (int32_t j = 0; j < nk; j++) {
        float *x = st + (int64_t)j * ldr;
        const bk_veci ok = ((bk_veci){0} + j) < visv;
        const bk_vec y = (bk_vec)(((bk_veci)BK_LOAD(x) & ok) | ((bk_veci)ninf & ~ok));
        BK_STORE(x, y);
        const bk_veci gt = y > mv; /* a NaN score does not raise the maximum */
        mv = (bk_vec)(((bk_veci)y & gt) | ((bk_veci)mv & ~gt));
    }
    const bk_veci none = mv == ninf;
    float msub[BK_VN];
    BK_STORE(msub, (bk_vec)((bk_veci)mv & ~none)); /* -inf -> 0 */
    float c[BK_VN];
    BK_STORE(c, BK_LOAD(m));
    bk_exp_neg_vec(c, msub);
    bk_vec sum = (bk_vec){0};
    for (int32_t j = 0; j < nk; j++) {
        float *x = st + (int64_t)j * ldr;
        bk_exp_neg_vec(x, msub);
        sum += BK_LOAD(x);
    }
    BK_STORE(l, BK_LOAD(l) * BK_LOAD(c) + sum);
    BK_STORE(m, mv);
    BK_STORE(corr, BK_LOAD(c));
}

/* One attention work item (chunk of a request's tokens, KV head, split)
 * as blocked products.  For each block the item uses (dense: every block
 * up to its last token; sparse: the union of its tokens' selections), the
 * rows of the tokens that use the block are packed into strips, and per
 * key tile: S^T = K Q^T (scaled queries; keys down, rows along the
 * lanes), the causal mask, the online softmax of every row at once along
 * the lanes, O = O * corr + P V.  Rows of tokens that do not use a block
 * take no part in it, so no work is spent on them. */
static void attn_blocked(attn_job *job, int64_t item, float *scratch)
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
    /* Row stride of S^T: the rows rounded up to strips, plus room for the
     * last panel of the P V kernel. */
    const int32_t LDR = bk_round_up(rows, BK_NR) + BK_MR;
    const int32_t DP = bk_round_up(D, BK_NR); /* accumulator and value columns */
    const int32_t *pt = p->page_table + (int64_t)ch->request * p->cap_pages_per_request;

    /* scratch: qs [rows][D] | acc [rows][DP] | m, l [rows] | kt [TW+MR][D]
     *          | vt [TW][DP] | qp [LDR][D] | st [TW+MR][LDR] | mc, lc, corr,
     *          vis [LDR] | dummy [DP] | act [LDR] | union ids | cursors
     * (bf16 products use the same regions for narrower data: see below) */
    float *qs = scratch;
    float *acc = qs + (int64_t)rows * D;
    float *mrow = acc + (int64_t)rows * DP;
    float *lrow = mrow + rows;
    float *kt = lrow + rows;
    float *vt = kt + (int64_t)(TW + BK_MR) * D;
    float *qp = vt + (int64_t)TW * DP;
    float *st = qp + (int64_t)LDR * D;
    float *mc = st + (int64_t)(TW + BK_MR) * LDR; /* key panels may pass TW */
    float *lc = mc + LDR;
    float *corr = lc + LDR;
    int32_t *vis = (int32_t *)(corr + LDR);
    float *dummy = (float *)(vis + LDR);
    int32_t *act = (int32_t *)(dummy + DP);
    int32_t *uni = act + LDR;
    int32_t *cursor = uni + (int64_t)ch->n * a->sel_width;

    /* bf16 queries, keys and values: the products on bf16 pairs (the
     * kernels of cpu_blocked_bf16_impl.h).  qs then holds the bf16 query
     * rows, qp pairs of them, kt bf16 key rows (and a copy of the value
     * rows after them where those are not read in place), vt value pairs
     * and st, after the softmax, weight pairs. */
    const int bf16 = MSA_CPU_HAVE_BF16_DOT && a->act == MSA_DTYPE_BF16 &&
                     a->k.dtype == MSA_DTYPE_BF16 && a->v.dtype == MSA_DTYPE_BF16 && D % 2 == 0;
    const int k_packed = cpu_plane_packed(&a->k), v_packed = cpu_plane_packed(&a->v);
    (void)k_packed, (void)v_packed; /* bf16 levels only */
    /* Queries as fp32, pre-scaled by the softmax scale (bf16: as stored,
     * the scale applied to the sums). */
    const size_t es = msa_dtype_size(a->act);
    for (int32_t t = 0; t < ch->n; t++) {
        const char *src =
            (const char *)a->q + ((ch->row0 + t) * a->q_row + (int64_t)g * G * D) * (int64_t)es;
        if (bf16) {
            memcpy((uint16_t *)qs + (int64_t)t * G * D, src, (size_t)G * D * 2);
            continue;
        }
        float *dst = qs + (int64_t)t * G * D;
        level_convert(dst, src, a->act, (int64_t)G * D);
        for (int64_t i = 0; i < (int64_t)G * D; i++)
            dst[i] *= a->scale;
    }
    for (int64_t i = 0; i < (int64_t)rows * DP; i++)
        acc[i] = 0.0f;
    for (int32_t r = 0; r < rows; r++) {
        mrow[r] = -INFINITY;
        lrow[r] = 0.0f;
    }
    for (int32_t d = 0; d < DP; d++) /* the target of padding rows, never read */
        dummy[d] = 0.0f;
    for (int64_t i = (int64_t)TW * D; i < (int64_t)(TW + BK_MR) * D; i++)
        kt[i] = 0.0f; /* keys past a full tile: read by the last key panel */

    /* This split's slice of the item's blocks. */
    const int32_t nblocks = a->sel ? sparse_union(a, ch, g, uni, cursor) : chunk_block_count(ch, B);
    const int32_t u0 = (int32_t)((int64_t)nblocks * split / S),
                  u1 = (int32_t)((int64_t)nblocks * (split + 1) / S);
    if (a->sel) /* cursors track each token's position in its own row */
        for (int32_t t = 0; t < ch->n; t++)
            cursor[t] = 0;

    for (int32_t u = u0; u < u1; u++) {
        const int32_t n = a->sel ? uni[u] : u;
        const int64_t blk0 = (int64_t)n * B;
        /* Tokens that use this block, and the rows they own. */
        int64_t last = -1;
        int32_t nact = 0;
        for (int32_t t = 0; t < ch->n; t++) {
            const int64_t pos = ch->pos0 + t;
            int use = pos >= blk0;
            if (a->sel && use) {
                const int32_t *row = a->sel + ((ch->row0 + t) * Hkv + g) * a->sel_width;
                while (cursor[t] < a->sel_width && row[cursor[t]] >= 0 && row[cursor[t]] < n)
                    cursor[t]++;
                use = cursor[t] < a->sel_width && row[cursor[t]] == n;
            }
            if (use) {
                last = pos;
                for (int32_t h = 0; h < G; h++)
                    act[nact++] = t * G + h;
            }
        }
        if (last < 0)
            continue;
        if (u + 1 < u1) /* the next block's first tile, while this one computes */
            prefetch_block(a, pt, g, (int64_t)(a->sel ? uni[u + 1] : u + 1) * B, B,
                           ch->pos0 + ch->n - 1);
        const int32_t nrp = bk_round_up(nact, BK_NR), nap = bk_round_up(nact, BK_MR);
#if MSA_CPU_HAVE_BF16_DOT
        if (bf16)
            bk16_pack((uint32_t *)qp, (const uint16_t *)qs, act, nact, D, BK_NR);
        else
#endif
            bk_pack_strips(qp, qs, act, nact, D);
        for (int32_t i = 0; i < nrp; i++) {
            mc[i] = i < nact ? mrow[act[i]] : -INFINITY;
            lc[i] = i < nact ? lrow[act[i]] : 0.0f;
        }
        const int64_t blk1 = blk0 + B - 1 < last ? blk0 + B - 1 : last;
        for (int64_t j0 = blk0; j0 <= blk1; j0 += TW) {
            const int32_t nk = (int32_t)(blk1 - j0 + 1 < TW ? blk1 - j0 + 1 : TW);
            const int32_t nkm = bk_round_up(nk, BK_MR);
            const int32_t npairs = (nk + 1) / 2;
            const uint16_t *k16 = (const uint16_t *)kt;
            (void)npairs, (void)k16; /* bf16 levels only */
#if MSA_CPU_HAVE_BF16_DOT
            if (bf16) {
                /* Key rows in place where the tile's key panels lie in one
                 * page (rows past nk are read, their scores never used),
                 * else copied, the rows from nk to nkm zero. */
                const int32_t P = a->k.page_size, off = (int32_t)(j0 % P);
                if (k_packed && off + nkm <= P) {
                    k16 = cpu_plane_row(&a->k, pt[j0 / P], g, off);
                } else {
                    msa_cpu_copy_rows(kt, &a->k, pt, g, j0, nk);
                    memset((uint16_t *)kt + (int64_t)nk * D, 0, (size_t)(nkm - nk) * D * 2);
                }
                const int32_t Pv = a->v.page_size, offv = (int32_t)(j0 % Pv);
                const uint16_t *v16;
                if (v_packed && offv + nk <= Pv) {
                    v16 = cpu_plane_row(&a->v, pt[j0 / Pv], g, offv);
                } else { /* after the key rows, (TW + BK_MR) * D bf16 */
                    uint16_t *copy = (uint16_t *)kt + (int64_t)(TW + BK_MR) * D;
                    msa_cpu_copy_rows(copy, &a->v, pt, g, j0, nk);
                    v16 = copy;
                }
                bk16_pack_value_pairs((uint32_t *)vt, DP, v16, nk, D);
            } else
#endif
            {
                level_load_rows(kt, &a->k, pt, g, j0, nk);
                for (int64_t i = (int64_t)nk * D; i < (int64_t)nkm * D; i++)
                    kt[i] = 0.0f;
            }
            if (bf16) {
                /* values packed above */
            } else if (DP == D) {
                level_load_rows(vt, &a->v, pt, g, j0, nk);
            } else { /* value rows at stride DP, the extra columns zero */
                for (int32_t j = 0; j < nk; j++) {
                    level_load_rows(vt + (int64_t)j * DP, &a->v, pt, g, j0 + j, 1);
                    for (int32_t d = D; d < DP; d++)
                        vt[(int64_t)j * DP + d] = 0.0f;
                }
            }
            /* Keys each row sees in this tile (0 for padding lanes). */
            for (int32_t i = 0; i < nrp; i++) {
                const int64_t pos = i < nact ? ch->pos0 + act[i] / G : -1;
                vis[i] = pos < j0 ? 0 : pos - j0 + 1 < nk ? (int32_t)(pos - j0 + 1) : nk;
            }
            /* A strip of query rows stays in L1 while the key rows go by
             * (they come from L2: 4 * BK_MR bytes a step against 4 *
             * BK_NR for the strip). */
            for (int32_t r0 = 0; r0 < nrp; r0 += BK_NR)
                for (int32_t k0 = 0; k0 < nkm; k0 += BK_MR) {
#if MSA_CPU_HAVE_BF16_DOT
                    if (bf16) {
                        bk16_kernel_kq(st + (int64_t)k0 * LDR + r0, LDR, k16 + (int64_t)k0 * D,
                                       (const uint32_t *)qp + (int64_t)r0 * (D / 2), D, a->scale);
                        continue;
                    }
#endif
                    bk_kernel_kq(st + (int64_t)k0 * LDR + r0, LDR, kt + (int64_t)k0 * D,
                                 qp + (int64_t)r0 * D, D);
                }
            for (int32_t l0 = 0; l0 < nrp; l0 += BK_VN)
                bk_softmax_lanes(st + l0, LDR, nk, vis + l0, mc + l0, lc + l0, corr + l0);
            for (int32_t j = 0; j < nk; j++) /* lanes the last P V panel reads */
                for (int32_t i = nrp; i < LDR; i++)
                    st[(int64_t)j * LDR + i] = 0.0f;
#if MSA_CPU_HAVE_BF16_DOT
            if (bf16)
                bk16_pack_weight_pairs(st, LDR, nk);
#endif
            for (int32_t i = 0; i < nact; i++)
                if (corr[i] != 1.0f) {
                    float *o = acc + (int64_t)act[i] * DP;
                    for (int32_t d = 0; d < DP; d++)
                        o[d] *= corr[i];
                }
            /* O += P V: a strip of BK_NR value columns stays in L1 while
             * the panels of rows go by. */
            for (int32_t c0 = 0; c0 < DP; c0 += BK_NR)
                for (int32_t p0 = 0; p0 < nap; p0 += BK_MR) {
                    float *o[BK_MR];
                    for (int r = 0; r < BK_MR; r++)
                        o[r] = p0 + r < nact ? acc + (int64_t)act[p0 + r] * DP : dummy;
#if MSA_CPU_HAVE_BF16_DOT
                    if (bf16) {
                        bk16_kernel_pv_t(o, c0, (const uint32_t *)st + p0, LDR,
                                         (const uint32_t *)vt, DP, npairs);
                        continue;
                    }
#endif
                    bk_kernel_pv_t(o, c0, st + p0, LDR, vt, DP, nk);
                }
        }
        for (int32_t i = 0; i < nact; i++) {
            mrow[act[i]] = mc[i];
            lrow[act[i]] = lc[i];
        }
    }

    if (S == 1) {
        for (int32_t r = 0; r < rows; r++)
            msa_cpu_attn_store(a, ch, g, r / G, r % G, acc + (int64_t)r * DP, mrow[r], lrow[r]);
        return;
    }
    /* Partial of this split: [rows][D + 2] = acc, m, l. */
    float *part = cp->partials + item * cp->partial_rows * (D + 2);
    for (int32_t r = 0; r < rows; r++) {
        float *pr = part + (int64_t)r * (D + 2);
        for (int32_t d = 0; d < D; d++)
            pr[d] = acc[(int64_t)r * DP + d];
        pr[D] = mrow[r];
        pr[D + 1] = lrow[r];
    }
}
