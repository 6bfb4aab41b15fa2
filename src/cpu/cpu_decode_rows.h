/* Row kernels of the decode and verify steps that read bf16 keys and values
 * in place and widen them in vector registers (AVX2 and AVX-512 levels):
 * included by cpu_level.h only.
 *
 * A decode step reads every index key and every selected K/V row once, so
 * these loops run at the memory's pace only when no pass writes an fp32
 * copy of the rows and reads it back: an fp32 tile of 128 keys (64 KB) does
 * not fit the first-level cache, and the P.V loop used to read it once per
 * query head.  Here each 16-byte (AVX2) or 32-byte (AVX-512) piece of a row
 * is loaded, widened (a zero extension and a 16-bit shift: exact), and used
 * by every query row or head that needs it while it sits in a register.
 *
 * Every output keeps the order of its fp32 sums of the generic kernels
 * (msa_dot16_rows and msa_pv_tile in cpu_math.h), so the results are the
 * same bits: an index score sums per lane over the head dimension in
 * order and reduces the lanes with the same transposition; an output
 * element starts from acc * corr and adds the keys' products in order.
 *
 * fp8_e4m3 rows take the same kernels: each piece of 16 or 8 codes is
 * widened in registers by dq_fp8x16 / dq_fp8x8 (cpu_dequant_impl.h) to
 * the values code * scale that msa_fp8_dequantize computes, bit for bit,
 * so the sums are those of the fp32 tiles of de-quantized rows. */

#include "cpu/cpu_next_block.h"

#if defined(__AVX512F__)
#define MSA_CPU_DECODE_ROWS 1
#define DR_LANES 16
typedef __m512 dr_vec;
/* 16 bf16 at p as 16 fp32 lanes. */
static inline __m512 dr_widen(const uint16_t *p)
{
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
#define DR_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define DR_MUL(a, b) _mm512_mul_ps(a, b)
#define DR_SET1(x) _mm512_set1_ps(x)
#define DR_LOAD(p) _mm512_loadu_ps(p)
#define DR_STORE(p, v) _mm512_storeu_ps(p, v)
#define DR_ADD(a, b) _mm512_add_ps(a, b)
#define DR_SUB(a, b) _mm512_sub_ps(a, b)
#define DR_FNMA(a, b, c) _mm512_fnmadd_ps(a, b, c)
/* b > a ? b : a lane by lane (a NaN in b is not taken) */
#define DR_MAX_NEW(a, b) _mm512_max_ps(b, a)
/* a with the lanes where v is NaN set to all ones (a NaN) */
#define DR_OR_UNORD(a, v) \
    _mm512_or_ps(a, _mm512_castsi512_ps(_mm512_movm_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q))))
#define DR_ROUND(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define DR_LESS_SELECT(x, lo, a, b) \
    _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), a, b) /* x < lo ? b : a */
#define DR_EXP2I(n)      \
    _mm512_castsi512_ps( \
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23))
/* Index rows x keys per register block: 16 accumulators. */
#define DR_RB 4
#define DR_KB 4
/* Query heads x vectors of output columns per P.V pass (16 accumulators;
 * heads left over take blocks of DR_HB2). */
#define DR_HB 8
#define DR_HB2 4
#define DR_VB 2
#elif defined(__AVX2__)
#define MSA_CPU_DECODE_ROWS 1
#define DR_LANES 8
typedef __m256 dr_vec;
static inline __m256 dr_widen(const uint16_t *p)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
#define DR_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define DR_MUL(a, b) _mm256_mul_ps(a, b)
#define DR_SET1(x) _mm256_set1_ps(x)
#define DR_LOAD(p) _mm256_loadu_ps(p)
#define DR_STORE(p, v) _mm256_storeu_ps(p, v)
#define DR_ADD(a, b) _mm256_add_ps(a, b)
#define DR_SUB(a, b) _mm256_sub_ps(a, b)
#define DR_FNMA(a, b, c) _mm256_fnmadd_ps(a, b, c)
#define DR_MAX_NEW(a, b) _mm256_max_ps(b, a)
#define DR_OR_UNORD(a, v) _mm256_or_ps(a, _mm256_cmp_ps(v, v, _CMP_UNORD_Q))
#define DR_ROUND(x) _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define DR_LESS_SELECT(x, lo, a, b) _mm256_blendv_ps(a, b, _mm256_cmp_ps(x, lo, _CMP_LT_OQ))
#define DR_EXP2I(n)      \
    _mm256_castsi256_ps( \
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23))
/* 8 accumulators of 16 registers (index rows x keys). */
#define DR_RB 4
#define DR_KB 2
/* 12 accumulators: eight dependent chains of 4-cycle multiply-adds would
 * only just cover two pipes, and measured a third below their peak. */
#define DR_HB 6
#define DR_HB2 4
#define DR_VB 2
#else
#define MSA_CPU_DECODE_ROWS 0
#endif

#if MSA_CPU_DECODE_ROWS && MSA_CPU_DQ_FP8_LANES == DR_LANES
#define MSA_CPU_DR_FP8 1
/* DR_LANES e4m3 codes at p as the fp32 values code * scale, NaN codes as
 * the scalar NaN (nan == 0: the caller has seen that none is a NaN code,
 * and the patch is skipped); s256 = 256 * scale (finite:
 * dq_fp8_fast_scale).  The route is the half-precision converter's: the
 * code's bits as fp16 subnormals or normals are widened by vcvtph2ps at
 * full speed, whereas an fp32 subnormal operand (the code's bits placed
 * under fp32's exponent and multiplied by 2^120) costs a microcode assist
 * of about 60 ns per vector multiply on the Intel CPU of
 * bench/RESULTS.md, and subnormal codes are common in real keys. */
static inline __attribute__((always_inline)) dr_vec dr_widen_fp8(const uint8_t *p, dr_vec s256,
                                                                 const int nan)
{
#if DR_LANES == 16
    if (!nan)
        return dq_fp8x16_no_nan(_mm_loadu_si128((const __m128i *)p), s256);
    return dq_fp8x16(p, s256);
#else
    if (!nan)
        return dq_fp8x8_no_nan(_mm_loadl_epi64((const __m128i *)p), s256);
    return dq_fp8x8(p, s256);
#endif
}

/* dr_widen_fp8 in two steps: h[i] = the fp16 bits of codes[i] times 2^-8
 * for i < n (n a multiple of 8), then dr_widen_half.  A decode token's
 * index scan widens each key piece for only four rows, so the widening
 * costs more vector operations than the products; the first step runs 32
 * codes per operation on AVX-512, and the second reads the bits from
 * memory, where vcvtph2ps takes one vector operation instead of two.
 * Returns whether a NaN code is among the n (then h is not to be used:
 * its NaN lanes are not patched). */
static inline int dr_fp8_to_half(uint16_t *restrict h, const uint8_t *restrict codes, int64_t n)
{
    int64_t i = 0;
    int nan = 0;
#if DR_LANES == 16
    __mmask32 m = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(codes + i));
        const __m512i b = _mm512_slli_epi16(_mm512_cvtepi8_epi16(raw), 7);
        _mm512_storeu_si512(h + i, _mm512_and_si512(b, _mm512_set1_epi16((short)0xbfff)));
        m |= _mm256_cmpeq_epi8_mask(_mm256_or_si256(raw, _mm256_set1_epi8((char)0x80)),
                                    _mm256_set1_epi8((char)0xff));
    }
    nan = m != 0;
#endif
    for (; i < n; i += 8) {
        const __m128i raw = _mm_loadl_epi64((const __m128i *)(codes + i));
        const __m128i b = _mm_slli_epi16(_mm_cvtepi8_epi16(raw), 7);
        _mm_storeu_si128((__m128i *)(h + i), _mm_and_si128(b, _mm_set1_epi16((short)0xbfff)));
        nan |= _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_or_si128(raw, _mm_set1_epi8((char)0x80)),
                                                _mm_set1_epi8((char)0xff))) &
               0xff;
    }
    return nan;
}

/* DR_LANES fp16 bits at h (dr_fp8_to_half) as fp32 times s256: the
 * values code * scale. */
static inline __attribute__((always_inline)) dr_vec dr_widen_half(const uint16_t *h, dr_vec s256)
{
#if DR_LANES == 16
    return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)), s256);
#else
    return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)), s256);
#endif
}
#else
#define MSA_CPU_DR_FP8 0
#endif

/* Key formats of the row kernels (dr_widen_key): bf16; fp8 e4m3 codes
 * with no NaN code; fp8 codes, maybe with some; fp8 codes already turned
 * into fp16 bits by dr_fp8_to_half. */
#define DR_KEY_BF16 0
#define DR_KEY_FP8 1
#define DR_KEY_FP8_NAN 2
#define DR_KEY_FP8_HALF 3

#if MSA_CPU_DECODE_ROWS
/* The lane sums of DR_LANES accumulators, out[i] = sum of p[i]'s lanes,
 * by the same transposition as msa_dot16_rows on this level. */
static inline void dr_transpose_sum(float *out, const dr_vec *p)
{
#if DR_LANES == 16
    msa_v16 v[16];
    memcpy(v, p, sizeof v);
    msa_v16_transpose_sum(out, v);
#else
    msa_v8 v[8];
    memcpy(v, p, sizeof v);
    msa_v8_transpose_sum(out, v);
#endif
}

/* sr[r * ld + j] = t[j * rp + r] for r < rows, j < n: scores computed with
 * the rows along the lanes ([key][rp]) as the scan stores them (rows). */
static inline void dr_store_rows(float *sr, int64_t ld, const float *t, int rp, int rows, int n)
{
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n; j++)
            sr[(int64_t)r * ld + j] = t[j * rp + r];
}

/* The DR_LANES elements from element i of a row of format `kind`
 * (DR_KEY_*), widened to fp32: bf16 or fp16 bits at bf, or fp8 e4m3 codes
 * at codes; fp8 values are code times the scale of which s256 is 256
 * times. */
static inline __attribute__((always_inline)) dr_vec dr_widen_key(const uint16_t *bf,
                                                                 const uint8_t *codes, int64_t i,
                                                                 dr_vec s256, const int kind)
{
#if MSA_CPU_DR_FP8
    if (kind == DR_KEY_FP8 || kind == DR_KEY_FP8_NAN)
        return dr_widen_fp8(codes + i, s256, kind == DR_KEY_FP8_NAN);
    if (kind == DR_KEY_FP8_HALF)
        return dr_widen_half(bf + i, s256);
#else
    (void)codes, (void)s256, (void)kind;
#endif
    return dr_widen(bf + i);
}

/* out[r * ld + j] = q[r] . k[j] for DR_RB rows (row pointers, some of
 * which may repeat to fill the block) and DR_KB keys k[j]: bf16 rows at
 * keys + j * dim (or fp16 bits there) or fp8 rows at codes + j * dim
 * (kind: as dr_widen_key), widened here, or (kf != NULL) the same rows
 * already widened at kf + j * dim; dim a multiple of DR_LANES. */
static inline __attribute__((always_inline)) void dr_dot_block(
    float *out, int64_t ld, const float *const *q, const uint16_t *keys, const uint8_t *codes,
    dr_vec s256, const int kind, const float *kf, int dim)
{
    dr_vec acc[DR_RB * DR_KB];
    for (int i = 0; i < DR_RB * DR_KB; i++)
        acc[i] = DR_SET1(0.0f);
    for (int d = 0; d < dim; d += DR_LANES) {
        dr_vec k[DR_KB];
        for (int j = 0; j < DR_KB; j++)
            k[j] = kf ? DR_LOAD(kf + (int64_t)j * dim + d)
                      : dr_widen_key(keys, codes, (int64_t)j * dim + d, s256, kind);
        for (int r = 0; r < DR_RB; r++) {
            const dr_vec qr = DR_LOAD(q[r] + d);
            for (int j = 0; j < DR_KB; j++)
                acc[r * DR_KB + j] = DR_FMA(qr, k[j], acc[r * DR_KB + j]);
        }
    }
    float s[DR_RB * DR_KB];
    dr_transpose_sum(s, acc);
    for (int r = 0; r < DR_RB; r++)
        for (int j = 0; j < DR_KB; j++)
            out[r * ld + j] = s[r * DR_KB + j];
}

/* sr[r * ld + j] = q[r] . k[j] for rows r < rows of q ([rows][dim] fp32)
 * and the n keys at keys ([n][dim]) of format kind (DR_KEY_*; fp8 values
 * are code * scale); dim a multiple of DR_LANES and at most
 * DR_MAX_DIM (fp8: 256 * scale finite).  With one block of rows (a decode
 * token's index heads) each piece of a key is widened in registers; with
 * more (verify) the DR_KB keys are widened once into a buffer in the
 * first-level cache that every row block reads. */
static inline __attribute__((always_inline)) void dr_index_scores_of(float *sr, int64_t ld,
                                                                     const float *q, int rows,
                                                                     const void *keys, int dim,
                                                                     int n, const int kind,
                                                                     float scale)
{
    float kf[DR_KB * 512];
    const int many = rows > DR_RB;
    const int fp8 = kind == DR_KEY_FP8 || kind == DR_KEY_FP8_NAN; /* codes, one byte each */
    const size_t es = fp8 ? 1 : 2;                                /* bytes per element */
    const dr_vec s256 = DR_SET1(kind != DR_KEY_BF16 ? scale * 256.0f : 0.0f);
    for (int j0 = 0; j0 < n; j0 += DR_KB) {
        const char *kb = (const char *)keys + (int64_t)j0 * dim * (int64_t)es;
        uint16_t tail[DR_KB * 512];
        float out[DR_RB * DR_KB];
        const int whole = j0 + DR_KB <= n;
        if (!whole) { /* the last keys, padded with zero rows (code 0 is +0) */
            const int have = n - j0;
            memcpy(tail, kb, (size_t)have * (size_t)dim * es);
            memset((char *)tail + (size_t)have * (size_t)dim * es, 0,
                   (size_t)(DR_KB - have) * (size_t)dim * es);
            kb = (const char *)tail;
        }
        const uint16_t *kb16 = fp8 ? NULL : (const uint16_t *)kb;
        const uint8_t *kb8 = fp8 ? (const uint8_t *)kb : NULL;
        if (many)
            for (int i = 0; i < DR_KB * dim; i += DR_LANES)
                DR_STORE(kf + i, dr_widen_key(kb16, kb8, i, s256, kind));
        for (int r0 = 0; r0 < rows; r0 += DR_RB) {
            const float *qr[DR_RB];
            for (int r = 0; r < DR_RB; r++) /* rows past the last repeat it */
                qr[r] = q + (int64_t)(r0 + r < rows ? r0 + r : rows - 1) * dim;
            if (many)
                dr_dot_block(out, DR_KB, qr, NULL, NULL, s256, 0, kf, dim);
            else
                dr_dot_block(out, DR_KB, qr, kb16, kb8, s256, kind, NULL, dim);
            for (int r = 0; r < DR_RB && r0 + r < rows; r++)
                for (int j = 0; j < DR_KB && j0 + j < n; j++)
                    sr[(int64_t)(r0 + r) * ld + j0 + j] = out[r * DR_KB + j];
        }
    }
}

/* The widest key tile dr_index_scores pads (its tail buffer). */
#define DR_MAX_DIM 512

/* dr_index_scores_of for bf16 keys and (fp8 != 0, 256 * fp8_scale
 * finite) for fp8 e4m3 codes of that scale; only levels with
 * MSA_CPU_DR_FP8 take fp8 keys, at most 16 of them (n).  The codes are
 * turned into fp16 bits first (dr_fp8_to_half), which also finds NaN
 * codes: keys with some take the widening with the NaN patch instead. */
static void dr_index_scores(float *sr, int64_t ld, const float *q, int rows, const void *keys,
                            int dim, int n, int fp8, float fp8_scale)
{
#if MSA_CPU_DR_FP8
    if (fp8) {
        uint16_t h[16 * DR_MAX_DIM];
        if (dr_fp8_to_half(h, keys, (int64_t)n * dim))
            dr_index_scores_of(sr, ld, q, rows, keys, dim, n, DR_KEY_FP8_NAN, fp8_scale);
        else
            dr_index_scores_of(sr, ld, q, rows, h, dim, n, DR_KEY_FP8_HALF, fp8_scale);
        return;
    }
#else
    (void)fp8, (void)fp8_scale;
#endif
    dr_index_scores_of(sr, ld, q, rows, keys, dim, n, DR_KEY_BF16, 0.0f);
}

#if MSA_CPU_DR_FP8 && MSA_CPU_DQ_FP8_BF16 && DR_LANES == 16
#define MSA_CPU_DR_FP8_DOT 1
/* Most index rows (a chunk's tokens times index heads) that the
 * vdpbf16ps scan below takes, and the fewest that run along the lanes
 * (dr_dot_keys). */
#define DR_DOT_MAX_ROWS 64
#define DR_LANES_MIN_ROWS 16

/* Whether the n fp32 queries at q are all bf16 values without bf16
 * subnormals (which vdpbf16ps reads as zeros): true of every query of
 * bf16 activations but the subnormal ones. */
static inline int dr_bf16_dot_exact(const float *q, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, q + i, sizeof u);
        if ((u & 0xffffu) != 0u || ((u & 0x7f800000u) == 0u && (u & 0x7fffffffu) != 0u))
            return 0;
    }
    return 1;
}

/* The rows of q as bf16 (qb[rows][dim]; every value exact:
 * dr_bf16_dot_exact). */
static inline void dr_pack_bf16(uint16_t *qb, const float *q, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16)
        _mm256_storeu_si256((__m256i *)(qb + i),
                            _mm512_cvtepi32_epi16(
                                _mm512_srli_epi32(_mm512_castps_si512(_mm512_loadu_ps(q + i)),
                                                  16)));
}

/* sr[r * ld + j] = (qb[r] . k[j]) * mul for the keys k[j], j < n, of kb
 * ([n][dim] bf16) and the rows of qb ([rows][dim] bf16), dim a multiple
 * of 32: vdpbf16ps takes the products of pairs, exact in fp32, summed in
 * fp32. */
static inline __attribute__((always_inline)) void dr_dot_bf16_rows(float *sr, int64_t ld,
                                                                   const uint16_t *qb, int rows,
                                                                   const uint16_t *kb, int dim,
                                                                   int n, float mul)
{
    for (int j0 = 0; j0 < n; j0 += DR_KB) {
        const uint16_t *kr[DR_KB];
        for (int j = 0; j < DR_KB; j++) /* keys past the last repeat it */
            kr[j] = kb + (int64_t)(j0 + j < n ? j0 + j : n - 1) * dim;
        for (int r0 = 0; r0 < rows; r0 += DR_RB) {
            const uint16_t *qr[DR_RB];
            for (int r = 0; r < DR_RB; r++) /* rows past the last repeat it */
                qr[r] = qb + (int64_t)(r0 + r < rows ? r0 + r : rows - 1) * dim;
            __m512 acc[DR_RB * DR_KB];
            for (int i = 0; i < DR_RB * DR_KB; i++)
                acc[i] = _mm512_setzero_ps();
            for (int d = 0; d < dim; d += 32) {
                __m512bh k[DR_KB];
                for (int j = 0; j < DR_KB; j++)
                    k[j] = (__m512bh)_mm512_loadu_si512((const void *)(kr[j] + d));
                for (int r = 0; r < DR_RB; r++) {
                    const __m512bh qv = (__m512bh)_mm512_loadu_si512((const void *)(qr[r] + d));
                    for (int j = 0; j < DR_KB; j++)
                        acc[r * DR_KB + j] = _mm512_dpbf16_ps(acc[r * DR_KB + j], qv, k[j]);
                }
            }
            float out[DR_RB * DR_KB];
            dr_transpose_sum(out, acc);
            for (int r = 0; r < DR_RB && r0 + r < rows; r++)
                for (int j = 0; j < DR_KB && j0 + j < n; j++)
                    sr[(int64_t)(r0 + r) * ld + j0 + j] = out[r * DR_KB + j] * mul;
        }
    }
}

/* The index rows of a vdpbf16ps scan, in one of two layouts: fewer than
 * DR_LANES_MIN_ROWS as bf16 rows (qb[rows][dim], dr_dot_bf16_rows: four
 * rows by four keys a block, each block's 16 sums reduced across lanes);
 * more as bf16 pairs along the head dimension with the rows along the
 * lanes (qt2[dim / 2][rp], rp = rows rounded up to 16, zero rows past
 * rows), where each key pair is a broadcast operand and the sums need no
 * reduction (msa_scores_heads_bf16, the attention's score kernel). */
typedef struct dr_qrows {
    const uint16_t *qb;
    const uint32_t *qt2;
    int rows, rp;
} dr_qrows;

/* qt2[d / 2][r] = (q[r][d], q[r][d + 1]) as bf16 bits (exact:
 * dr_bf16_dot_exact) for r < rows, 0 for rows up to rp. */
static inline void dr_pack_pairs(uint32_t *qt2, int rp, const float *q, int rows, int dim)
{
    for (int d = 0; d < dim; d += 2)
        for (int r = 0; r < rp; r++) {
            uint32_t lo = 0, hi = 0;
            if (r < rows) {
                memcpy(&lo, q + (int64_t)r * dim + d, sizeof lo);
                memcpy(&hi, q + (int64_t)r * dim + d + 1, sizeof hi);
            }
            qt2[(int64_t)(d / 2) * rp + r] = lo >> 16 | (hi & 0xffff0000u);
        }
}

/* sr[r * ld + j] = (q[r] . k[j]) * mul for the rows of qr and the n <= 16
 * keys of kb ([n][dim] bf16, dim a multiple of 32). */
static inline void dr_dot_keys(float *sr, int64_t ld, const dr_qrows *qr, const uint16_t *kb,
                               int dim, int n, float mul)
{
    if (!qr->qt2) {
        dr_dot_bf16_rows(sr, ld, qr->qb, qr->rows, kb, dim, n, mul);
        return;
    }
    float t[16 * DR_DOT_MAX_ROWS]; /* [key][rp] */
    msa_scores_heads_bf16(t, qr->qt2, qr->rp, kb, dim, n, mul);
    dr_store_rows(sr, ld, t, qr->rp, qr->rows, n);
}

/* The same for the n <= 16 fp8 keys at codes ([n][dim], dim at most
 * DR_MAX_DIM), times 256 * scale: the codes widen to the bf16 values
 * code * 2^-8 by table (dq_fp8x32_bf16_lut, tables t) and the scale
 * multiplies the sums.  A decode token's index scan widens each key piece
 * for only a few rows: the table takes eight instructions a 32-code
 * vector and vdpbf16ps one a row, where the fp32 route (dr_index_scores)
 * widens through fp16 and takes an FMA a row for every 16 codes.  NaN
 * codes widen to NaN and their scores are NaN. */
static void dr_index_scores_fp8_dot(float *sr, int64_t ld, const dr_qrows *qr, const uint8_t *codes,
                                    int dim, int n, float scale, const __m512i t[4])
{
    uint16_t kb[16 * DR_MAX_DIM];
    for (int64_t i = 0; i < (int64_t)n * dim; i += 32)
        _mm512_storeu_si512((void *)(kb + i), dq_fp8x32_bf16_lut(codes + i, t));
    dr_dot_keys(sr, ld, qr, kb, dim, n, scale * 256.0f);
}
#endif

/* acc[h][:] = acc[h][:] * c[h] + sum_j p[j * gp + h] * vf[j][:] for hb
 * heads h (a constant where this is inlined), DR_LANES * DR_VB columns from
 * d0 (c == NULL: no rescale), with vf the fp32 rows widened by
 * dr_pv_heads: the heads' accumulators stay in registers while the keys
 * pass, and each load of a value vector feeds all of them. */
static inline __attribute__((always_inline)) void dr_pv_block(float *acc, int64_t acc_ld,
                                                              const float *c, const float *p,
                                                              int gp, const float *vf, int dim,
                                                              int n, int d0, const int hb)
{
    dr_vec a[DR_HB][DR_VB];
    for (int h = 0; h < hb; h++)
        for (int k = 0; k < DR_VB; k++) {
            a[h][k] = DR_LOAD(acc + h * acc_ld + d0 + k * DR_LANES);
            if (c)
                a[h][k] = DR_MUL(a[h][k], DR_SET1(c[h]));
        }
    for (int j = 0; j < n; j++) {
        dr_vec x[DR_VB];
        for (int k = 0; k < DR_VB; k++)
            x[k] = DR_LOAD(vf + (int64_t)j * dim + d0 + k * DR_LANES);
        const float *pj = p + (int64_t)j * gp;
        for (int h = 0; h < hb; h++) {
            const dr_vec w = DR_SET1(pj[h]);
            for (int k = 0; k < DR_VB; k++)
                a[h][k] = DR_FMA(w, x[k], a[h][k]);
        }
    }
    for (int h = 0; h < hb; h++)
        for (int k = 0; k < DR_VB; k++)
            DR_STORE(acc + h * acc_ld + d0 + k * DR_LANES, a[h][k]);
}

/* fp32 floats of the value rows widened at a time (16 KB: they stay in the
 * first-level cache while every head block reads them). */
#define DR_PV_FLOATS 4096

/* P.V of `heads` query heads over n value rows v ([n][dim], dim a
 * multiple of DR_LANES * DR_VB and at most DR_MAX_DIM): bf16, or (v8 !=
 * NULL, v unused) fp8 codes of which s256 is 256 times the scale; acc[h * dim + :]
 * for h < heads, weights p[j * gp + h], rescale factors corr[h].  The rows
 * are widened a chunk at a time into an fp32 buffer, each element once
 * (widening them in every pass cost a fifth of the pass's issue slots);
 * the first chunk applies the rescale, the others continue the sums in key
 * order. */
static void dr_pv_heads(float *acc, const float *corr, const float *p, int gp, int heads,
                        const uint16_t *v, const uint8_t *v8, dr_vec s256, int dim, int n)
{
    float vf[DR_PV_FLOATS];
    const int chunk = DR_PV_FLOATS / dim;
    for (int j0 = 0; j0 < n; j0 += chunk) {
        const int nj = n - j0 < chunk ? n - j0 : chunk;
        if (v8)
            for (int i = 0; i < nj * dim; i += DR_LANES)
                DR_STORE(vf + i,
                         dr_widen_key(NULL, v8, (int64_t)j0 * dim + i, s256, DR_KEY_FP8_NAN));
        else
            for (int i = 0; i < nj * dim; i += DR_LANES)
                DR_STORE(vf + i, dr_widen(v + (int64_t)j0 * dim + i));
        const float *pj = p + (int64_t)j0 * gp;
        for (int d0 = 0; d0 < dim; d0 += DR_LANES * DR_VB) {
            int h = 0;
            for (; h + DR_HB <= heads; h += DR_HB)
                dr_pv_block(acc + (int64_t)h * dim, dim, j0 ? NULL : corr + h, pj + h, gp, vf, dim,
                            nj, d0, DR_HB);
            for (; h + DR_HB2 <= heads; h += DR_HB2)
                dr_pv_block(acc + (int64_t)h * dim, dim, j0 ? NULL : corr + h, pj + h, gp, vf, dim,
                            nj, d0, DR_HB2);
            for (; h < heads; h++)
                dr_pv_block(acc + (int64_t)h * dim, dim, j0 ? NULL : corr + h, pj + h, gp, vf, dim,
                            nj, d0, 1);
        }
    }
    if (n == 0) /* no key: the rescale alone */
        for (int h = 0; h < heads; h++)
            for (int d = 0; d < dim; d++)
                acc[(int64_t)h * dim + d] *= corr[h];
}

/* msa_exp_neg (cpu_math.h) on DR_LANES lanes: the same operations in the
 * same order (the two fused steps of the reduction, the fused polynomial
 * steps), so each lane gets the scalar function's bits. */
static inline dr_vec dr_exp_neg(dr_vec x)
{
    const dr_vec lo = DR_SET1(-87.0f);
    const dr_vec xc = DR_LESS_SELECT(x, lo, x, lo);
    const dr_vec n = DR_ROUND(DR_MUL(xc, DR_SET1(1.44269504088896341f)));
    dr_vec r = DR_FNMA(n, DR_SET1(0.693145751953125f), xc);
    r = DR_FNMA(n, DR_SET1(1.428606765330187e-06f), r);
    dr_vec p = DR_SET1(1.0f / 5040.0f);
    p = DR_FMA(p, r, DR_SET1(1.0f / 720.0f));
    p = DR_FMA(p, r, DR_SET1(1.0f / 120.0f));
    p = DR_FMA(p, r, DR_SET1(1.0f / 24.0f));
    p = DR_FMA(p, r, DR_SET1(1.0f / 6.0f));
    p = DR_FMA(p, r, DR_SET1(0.5f));
    p = DR_FMA(p, r, DR_SET1(1.0f));
    p = DR_FMA(p, r, DR_SET1(1.0f));
    const dr_vec y = DR_MUL(p, DR_EXP2I(n));
    return DR_LESS_SELECT(x, lo, y, DR_SET1(0.0f));
}

/* The online softmax of one token's 16 heads (lanes) over the scores s[j *
 * gp + l], j < n: the running maximum mt and sum lt are updated, the
 * scores become their weights exp(s - max), and corr gets each head's
 * rescale factor exp(old max - new max). */
static inline void dr_softmax16(float *mt, float *lt, float *s, int gp, int n, float *corr)
{
    for (int c = 0; c < 16; c += DR_LANES) {
        const dr_vec mold = DR_LOAD(mt + c);
        dr_vec mx = mold;
        for (int j = 0; j < n; j++)
            mx = DR_MAX_NEW(mx, DR_LOAD(s + (int64_t)j * gp + c));
        const dr_vec cr = dr_exp_neg(DR_SUB(mold, mx));
        DR_STORE(corr + c, cr);
        DR_STORE(mt + c, mx);
        dr_vec sum = DR_MUL(DR_LOAD(lt + c), cr);
        for (int j = 0; j < n; j++) {
            float *sj = s + (int64_t)j * gp + c;
            const dr_vec e = dr_exp_neg(DR_SUB(DR_LOAD(sj), mx));
            DR_STORE(sj, e);
            sum = DR_ADD(sum, e);
        }
        DR_STORE(lt + c, sum);
    }
}

/* Keys widened per pass of dr_scores_heads and the vectors of 16 heads:
 * 16 accumulators (AVX-512) or 12 (AVX2), more independent chains than
 * the multiply-add latency times its pipes. */
#define DR_SK (DR_LANES == 16 ? 16 : 6)
/* One line of the next tile's K and V per this many steps over d: about a
 * pass's own rows of each (DR_SK * dim * 2 bytes, dim / DR_PF_EVERY
 * lines). */
#define DR_PF_EVERY (DR_LANES == 16 ? 2 : 4)
#define DR_SV (16 / DR_LANES)

/* s[i * gp + v * DR_LANES + l] = kf[i] . qt[:, v * DR_LANES + l] for the
 * first nk of sk keys widened at kf ([sk][dim], sk <= DR_SK a constant
 * where this is inlined) and the 16 heads of qt ([dim][gp] from the first
 * head): each element of a key is broadcast against the heads' vectors,
 * and one line of the next tile goes out every DR_PF_EVERY steps over d. */
static inline __attribute__((always_inline)) void dr_scores_pass(float *s, const float *qt, int gp,
                                                                 const float *kf, const int dim,
                                                                 int nk, const int sk, dr_next *nx)
{
    dr_vec a[DR_SK][DR_SV];
    for (int i = 0; i < sk; i++)
        for (int v = 0; v < DR_SV; v++)
            a[i][v] = DR_SET1(0.0f);
    for (int d = 0; d < dim; d++) {
        if (d % DR_PF_EVERY == 0)
            dr_next_line(nx);
        dr_vec q[DR_SV];
        for (int v = 0; v < DR_SV; v++)
            q[v] = DR_LOAD(qt + (int64_t)d * gp + v * DR_LANES);
        for (int i = 0; i < sk; i++) {
            const dr_vec kd = DR_SET1(kf[i * dim + d]);
            for (int v = 0; v < DR_SV; v++)
                a[i][v] = DR_FMA(kd, q[v], a[i][v]);
        }
    }
    for (int i = 0; i < sk; i++)
        if (i < nk)
            for (int v = 0; v < DR_SV; v++)
                DR_STORE(s + (int64_t)i * gp + v * DR_LANES, a[i][v]);
}

/* s[j * gp + h] = k[j] . qt[:, h] for the n keys k ([n][dim]: bf16, or
 * (k8 != NULL, k unused) fp8 codes of which s256 is 256 times the scale)
 * and heads h < gp (a multiple of 16); qt is [dim][gp] fp32; nx: the rows to
 * prefetch meanwhile (nothing when nx->left is 0).  DR_SK keys at a
 * time are widened into a small buffer in the first-level cache, then
 * each of their elements is broadcast against the heads' query vectors;
 * every lane sums over d in order, as msa_scores_heads. */
static inline __attribute__((always_inline)) void dr_scores_heads_dim(
    float *restrict s, const float *restrict qt, int gp, const uint16_t *restrict k,
    const uint8_t *restrict k8, dr_vec s256, const int dim, int n, dr_next *nx)
{
    float kf[DR_SK * DR_MAX_DIM];
    for (int j0 = 0; j0 < n; j0 += DR_SK) {
        const int nk = n - j0 < DR_SK ? n - j0 : DR_SK;
        if (k8)
            for (int i = 0; i < nk; i++)
                for (int d = 0; d < dim; d += DR_LANES)
                    DR_STORE(kf + i * dim + d, dr_widen_key(NULL, k8, (int64_t)(j0 + i) * dim + d,
                                                            s256, DR_KEY_FP8_NAN));
        else
            for (int i = 0; i < nk; i++)
                for (int d = 0; d < dim; d += DR_LANES)
                    DR_STORE(kf + i * dim + d, dr_widen(k + (int64_t)(j0 + i) * dim + d));
        /* Fewer keys than a pass takes (the end of the tile): zero rows fill
         * the pass, whose sums are not stored; on AVX2 four keys or fewer
         * take a pass of four (eight accumulators).  Each lane sums over d
         * in the same order either way; one key at a time, two
         * accumulators waited on the multiply-add latency. */
        const int sk = DR_LANES == 8 && nk <= 4 ? 4 : DR_SK;
        if (nk < sk)
            memset(kf + nk * dim, 0, sizeof(float) * (size_t)(sk - nk) * (size_t)dim);
        for (int h0 = 0; h0 < gp; h0 += 16) {
            if (sk == DR_SK)
                dr_scores_pass(s + (int64_t)j0 * gp + h0, qt + h0, gp, kf, dim, nk, DR_SK, nx);
            else
                dr_scores_pass(s + (int64_t)j0 * gp + h0, qt + h0, gp, kf, dim, nk, 4, nx);
        }
    }
    dr_next_bytes(nx, -1); /* what this tile's keys did not cover */
}

/* dr_scores_heads_dim, with the head dimension of M3 (128) a constant:
 * the widened keys then sit at fixed offsets from one base register (with
 * 16 keys and a variable stride the compiler kept 16 pointers and moved
 * them in and out of vector registers every step). */
static void dr_scores_heads(float *restrict s, const float *restrict qt, int gp,
                            const uint16_t *restrict k, const uint8_t *restrict k8, dr_vec s256,
                            int dim, int n, dr_next *nx)
{
    if (dim == 128)
        dr_scores_heads_dim(s, qt, gp, k, k8, s256, 128, n, nx);
    else
        dr_scores_heads_dim(s, qt, gp, k, k8, s256, dim, n, nx);
}

/* Index rows from which an AVX2 verify step's scan takes the rows along
 * the lanes (dr_index_scores_lanes), and the most it takes so. */
#define DR_ROWS_LANES_MIN 16
#define DR_ROWS_LANES_MAX 64

/* qt[d * rp + r] = q[r][d] for r < rows (q: [rows][dim]), 0 for rows up to
 * rp, a multiple of 16. */
static inline void dr_transpose_rows(float *qt, int rp, const float *q, int rows, int dim)
{
    for (int d = 0; d < dim; d++)
        for (int r = 0; r < rp; r++)
            qt[(int64_t)d * rp + r] = r < rows ? q[(int64_t)r * dim + d] : 0.0f;
}

/* sr[r * ld + j] = q[r] . k[j] for the rows r < rows of a verify step's
 * scan and the n <= 16 keys at keys ([n][dim]: bf16, or (fp8 != 0) fp8
 * e4m3 codes of that scale, 256 * fp8_scale finite), with the rows along
 * the lanes: qt is dr_transpose_rows's [dim][rp] (rp <=
 * DR_ROWS_LANES_MAX), each key element is broadcast against the rows'
 * vectors (dr_scores_heads), and every sum runs over d in order, with no
 * reduction across lanes.  The register block of dr_index_scores (rows x
 * keys) spends as many shuffles and adds as a fifth of its multiply-adds
 * on reducing its lanes: alone in L1 on Zen 4 capped to avx2, 32 rows by
 * 16 keys, it ran at 74 GFLOP/s and this pass at 96 (one core's FMA peak:
 * about 116). */
static void dr_index_scores_lanes(float *sr, int64_t ld, const float *qt, int rp, int rows,
                                  const void *keys, int dim, int n, int fp8, float fp8_scale)
{
    float t[16 * DR_ROWS_LANES_MAX]; /* [key][rp] */
    dr_next nx = {0};                /* nothing to prefetch */
    const dr_vec s256 = DR_SET1(fp8 ? fp8_scale * 256.0f : 0.0f);
    dr_scores_heads(t, qt, rp, fp8 ? NULL : (const uint16_t *)keys,
                    fp8 ? (const uint8_t *)keys : NULL, s256, dim, n, &nx);
    dr_store_rows(sr, ld, t, rp, rows, n);
}

/* The largest of x[0 .. n) that is a number (-inf when none is), and *nan
 * set when some x[j] is NaN: the index scan's max block score of one row
 * over a tile, lane by lane (the maximum of a set does not depend on the
 * order it is taken in). */
static inline float dr_row_max(const float *x, int n, int *nan)
{
    dr_vec m = DR_SET1(-INFINITY);
    dr_vec bad = DR_SET1(0.0f);
    int j = 0;
    for (; j + DR_LANES <= n; j += DR_LANES) {
        const dr_vec v = DR_LOAD(x + j);
        m = DR_MAX_NEW(m, v);
        bad = DR_OR_UNORD(bad, v);
    }
    float ml[DR_LANES], bl[DR_LANES];
    DR_STORE(ml, m);
    DR_STORE(bl, bad);
    float mx = -INFINITY;
    for (int l = 0; l < DR_LANES; l++) {
        mx = ml[l] > mx ? ml[l] : mx;
        if (bl[l] != 0.0f)
            *nan = 1;
    }
    for (; j < n; j++) {
        if (isnan(x[j]))
            *nan = 1;
        else if (x[j] > mx)
            mx = x[j];
    }
    return mx;
}
#endif

/* Levels without the bf16 dot-product index scan (all but AVX512-BF16). */
#ifndef MSA_CPU_DR_FP8_DOT
#define MSA_CPU_DR_FP8_DOT 0
#endif
