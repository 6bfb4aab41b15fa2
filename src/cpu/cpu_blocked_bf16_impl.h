/* bf16 micro-kernels of the blocked prefill products on levels with
 * AVX512-BF16 (vdpbf16ps), included by cpu_blocked_impl.h only.
 *
 * vdpbf16ps multiplies pairs of bf16 values exactly and adds both
 * products to an fp32 lane, so an operand is read as pairs of adjacent
 * elements along the summed axis.  Each kernel keeps the fp32 kernel's
 * register block (BK_MR x BK_NR) and walks the summed axis two elements
 * a step:
 *
 * - S = Q K^T (index scan) and S^T = K Q^T (attention) sum over the head
 *   dimension; the packed operand holds, per column, the pair (x[2p],
 *   x[2p + 1]) as one 32-bit word, laid out [dim / 2][width]; the
 *   broadcast operand is read straight from its bf16 rows, where a pair
 *   is already one 32-bit word.
 * - O += P V sums over keys: values are packed as pairs of key rows
 *   (v[2j][c], v[2j + 1][c]) laid out [keys / 2][columns], the softmax
 *   weights rounded to bf16 as pairs (p[2j][r], p[2j + 1][r]).
 *
 * Products of bf16 values are exact and every sum is in fp32; only the
 * weights of P V are rounded (to bf16, as in the GPU kernels and the bf16
 * decode kernel), which keeps the results inside SPEC section 11's bound
 * for bf16 paths (the cpf sweep cases check it). */

#if BK_VN != 16
#error "the bf16 blocked kernels are written for 16-lane vectors"
#endif

/* The 32-bit word of the bf16 pair at p (any alignment), in every lane. */
static inline __m512bh bk16_bcast(const uint16_t *p)
{
    uint32_t w;
    memcpy(&w, p, sizeof w);
    return (__m512bh)_mm512_set1_epi32((int)w);
}

/* Packs rows idx[0 .. n) (rows 0 .. n when idx is NULL) of the bf16
 * matrix src[][dim] (dim even) into panels of w rows: dst[panel][dim /
 * 2][w], each word the pair (row[2p], row[2p + 1]); rows from n up to the
 * next multiple of w are zero. */
static void bk16_pack(uint32_t *restrict dst, const uint16_t *restrict src, const int32_t *idx,
                      int32_t n, int32_t dim, int32_t w)
{
    const int32_t dh = dim / 2, np = bk_round_up(n, w);
    for (int32_t p0 = 0; p0 < np; p0 += w) {
        uint32_t *panel = dst + (int64_t)p0 * dh;
        for (int32_t c = 0; c < w; c++) {
            const int32_t i = p0 + c;
            if (i < n) {
                const uint16_t *row = src + (int64_t)(idx ? idx[i] : i) * dim;
                for (int32_t p = 0; p < dh; p++) {
                    uint32_t v;
                    memcpy(&v, row + 2 * p, sizeof v);
                    panel[(int64_t)p * w + c] = v;
                }
            } else {
                for (int32_t p = 0; p < dh; p++)
                    panel[(int64_t)p * w + c] = 0u;
            }
        }
    }
}

/* s[r * lds + c] = sum over d of q[r][d] * k[c][d] for r < BK_MR, c <
 * BK_NR: qp a panel of query pairs [dim / 2][BK_MR], kp a strip of key
 * pairs [dim / 2][BK_NR].  Each step loads BK_NV key vectors and
 * broadcasts BK_MR query pairs into BK_MR * BK_NV independent chains. */
static inline void bk16_kernel_qk(float *restrict s, int64_t lds, const uint32_t *restrict qp,
                                  const uint32_t *restrict kp, int32_t dim)
{
    __m512 acc[BK_MR][BK_NV];
    for (int r = 0; r < BK_MR; r++)
        for (int v = 0; v < BK_NV; v++)
            acc[r][v] = _mm512_setzero_ps();
    for (int32_t p = 0; p < dim / 2; p++) {
        __m512bh k[BK_NV];
        for (int v = 0; v < BK_NV; v++)
            k[v] = (__m512bh)_mm512_loadu_si512((const void *)(kp + (int64_t)p * BK_NR + v * 16));
        for (int r = 0; r < BK_MR; r++) {
            const __m512bh q = (__m512bh)_mm512_set1_epi32((int)qp[(int64_t)p * BK_MR + r]);
            for (int v = 0; v < BK_NV; v++)
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], q, k[v]);
        }
    }
    for (int r = 0; r < BK_MR; r++)
        for (int v = 0; v < BK_NV; v++)
            _mm512_storeu_ps(s + (int64_t)r * lds + v * 16, acc[r][v]);
}

/* bk_scores on pair-packed panels and strips (bk16_pack). */
static void bk16_scores(float *s, int64_t lds, const uint32_t *qp, int32_t rows, const uint32_t *kp,
                        int32_t nkp, int32_t dim)
{
    const int32_t rp = bk_round_up(rows, BK_MR), dh = dim / 2;
    for (int32_t p0 = 0; p0 < rp; p0 += BK_MR)
        for (int32_t c0 = 0; c0 < nkp; c0 += BK_NR)
            bk16_kernel_qk(s + (int64_t)p0 * lds + c0, lds, qp + (int64_t)p0 * dh,
                           kp + (int64_t)c0 * dh, dim);
}

/* st[i * ldr + c] = scale * sum over d of k[i][d] * q[c][d], keys i <
 * BK_MR (bf16 rows of k, stride dim), query rows c < BK_NR (a strip of
 * pairs [dim / 2][BK_NR]): bk_kernel_kq with the key pairs broadcast
 * straight from their rows and the softmax scale applied to the sums. */
static inline void bk16_kernel_kq(float *restrict st, int64_t ldr, const uint16_t *restrict k,
                                  const uint32_t *restrict qp, int32_t dim, float scale)
{
    __m512 acc[BK_MR][BK_NV];
    for (int i = 0; i < BK_MR; i++)
        for (int v = 0; v < BK_NV; v++)
            acc[i][v] = _mm512_setzero_ps();
    for (int32_t p = 0; p < dim / 2; p++) {
        __m512bh q[BK_NV];
        for (int v = 0; v < BK_NV; v++)
            q[v] = (__m512bh)_mm512_loadu_si512((const void *)(qp + (int64_t)p * BK_NR + v * 16));
        for (int i = 0; i < BK_MR; i++) {
            const __m512bh kv = bk16_bcast(k + (int64_t)i * dim + 2 * p);
            for (int v = 0; v < BK_NV; v++)
                acc[i][v] = _mm512_dpbf16_ps(acc[i][v], kv, q[v]);
        }
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int i = 0; i < BK_MR; i++)
        for (int v = 0; v < BK_NV; v++)
            _mm512_storeu_ps(st + (int64_t)i * ldr + v * 16, _mm512_mul_ps(acc[i][v], sc));
}

/* o[r][c0 + c] += sum over key pairs jp < npairs of the weights pp[jp *
 * ldr + r] (bf16 pair of keys 2jp, 2jp + 1) times the values vp[jp][c0 +
 * c] (bf16 pair of the same keys, row stride ldv), r < BK_MR, c < BK_NR:
 * bk_kernel_pv_t two keys a step. */
static inline void bk16_kernel_pv_t(float *const *o, int32_t c0, const uint32_t *restrict pp,
                                    int64_t ldr, const uint32_t *restrict vp, int64_t ldv,
                                    int32_t npairs)
{
    __m512 acc[BK_MR][BK_NV];
    for (int r = 0; r < BK_MR; r++)
        for (int x = 0; x < BK_NV; x++)
            acc[r][x] = _mm512_loadu_ps(o[r] + c0 + x * 16);
    for (int32_t jp = 0; jp < npairs; jp++) {
        __m512bh vv[BK_NV];
        for (int x = 0; x < BK_NV; x++)
            vv[x] =
                (__m512bh)_mm512_loadu_si512((const void *)(vp + (int64_t)jp * ldv + c0 + x * 16));
        for (int r = 0; r < BK_MR; r++) {
            const __m512bh p = (__m512bh)_mm512_set1_epi32((int)pp[(int64_t)jp * ldr + r]);
            for (int x = 0; x < BK_NV; x++)
                acc[r][x] = _mm512_dpbf16_ps(acc[r][x], p, vv[x]);
        }
    }
    for (int r = 0; r < BK_MR; r++)
        for (int x = 0; x < BK_NV; x++)
            _mm512_storeu_ps(o[r] + c0 + x * 16, acc[r][x]);
}

/* vp[jp][c] = (v[2jp][c], v[2jp + 1][c]) for pairs jp < (n + 1) / 2 and
 * columns c < ldv: v is n bf16 rows of dim; a missing second row of the
 * last pair and the columns from dim to ldv are zero. */
static void bk16_pack_value_pairs(uint32_t *restrict vp, int64_t ldv, const uint16_t *restrict v,
                                  int32_t n, int32_t dim)
{
    for (int32_t jp = 0; jp < (n + 1) / 2; jp++) {
        const uint16_t *r0 = v + (int64_t)(2 * jp) * dim;
        uint32_t *dst = vp + (int64_t)jp * ldv;
        if (2 * jp + 1 < n) {
            const uint16_t *r1 = r0 + dim;
            for (int32_t d = 0; d < dim; d++)
                dst[d] = (uint32_t)r0[d] | (uint32_t)r1[d] << 16;
        } else {
            for (int32_t d = 0; d < dim; d++)
                dst[d] = (uint32_t)r0[d];
        }
        for (int64_t d = dim; d < ldv; d++)
            dst[d] = 0u;
    }
}

/* The weights of st (keys j < n down, ldr lanes along) as bf16 pairs of
 * keys, in place: word jp of lane i becomes (bf16(st[2jp][i]),
 * bf16(st[2jp + 1][i])), a missing key nk weighing 0.  Row jp is written
 * after rows 2jp and 2jp + 1 are read and no later pair reads it (jp <
 * 2jp' for jp' > jp), so the packing needs no second buffer. */
static void bk16_pack_weight_pairs(float *st, int64_t ldr, int32_t n)
{
    for (int32_t jp = 0; jp < (n + 1) / 2; jp++) {
        const float *s0 = st + (int64_t)(2 * jp) * ldr;
        const float *s1 = s0 + ldr;
        uint32_t w[64];
        for (int64_t i0 = 0; i0 < ldr; i0 += 64) {
            const int32_t m = ldr - i0 < 64 ? (int32_t)(ldr - i0) : 64;
            if (2 * jp + 1 < n)
                for (int32_t i = 0; i < m; i++)
                    w[i] = (uint32_t)msa_bf16_round(s0[i0 + i]) |
                           (uint32_t)msa_bf16_round(s1[i0 + i]) << 16;
            else
                for (int32_t i = 0; i < m; i++)
                    w[i] = (uint32_t)msa_bf16_round(s0[i0 + i]);
            memcpy(st + (int64_t)jp * ldr + i0, w, (size_t)m * sizeof w[0]);
        }
    }
}
