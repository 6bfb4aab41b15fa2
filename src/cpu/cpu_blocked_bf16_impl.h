/* bf16 micro-kernels of the blocked prefill products on levels with bf16
 * dot products (AVX512-BF16 vdpbf16ps, Arm BFDOT), included by
 * cpu_blocked_impl.h only.
 *
 * vdpbf16ps and BFDOT multiply pairs of bf16 values exactly and add both
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
 * Products of bf16 values are exact and every sum is in fp32 (BFDOT
 * rounds its sums to odd: cpu_bf16_neon.h); only the weights of P V are
 * rounded (to bf16, as in the GPU kernels and the bf16
 * decode kernel), which keeps the results inside SPEC section 11's bound
 * for bf16 paths (the cpf sweep cases check it). */

/* The three micro-kernels (bk16_kernel_qk, bk16_kernel_kq,
 * bk16_kernel_pv_t) per instruction set; the packing below is shared. */
#if defined(__aarch64__)
#include "cpu/cpu_blocked_bf16_neon.h"
#else
#include "cpu/cpu_blocked_bf16_avx512.h"
#endif

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
