/* The bf16 micro-kernels of the blocked prefill products on Arm64 with
 * FEAT_BF16 (BFDOT, 4 lanes): included by cpu_blocked_bf16_impl.h, which
 * describes the packed layouts they read; the rounding of BFDOT's sums is
 * described in cpu_bf16_neon.h.  The register block is the fp32 NEON
 * kernels' 6 x 8 (12 accumulators of 32 registers).  The broadcast
 * operand's pairs are loaded four (or two) at a time and picked by lane
 * (vbfdotq_laneq_f32), which multiplies as a broadcast pair would. */

#if BK_VN != 4 || BK_MR != 6 || BK_NV != 2
#error "the NEON bf16 blocked kernels are written for a 6 x 8 block of 4-lane vectors"
#endif

/* acc[r][v] += pair r of the six at p (four in lo, two in hi) times x[v]:
 * r < 4 from a 128-bit load, r = 4, 5 from a 64-bit one. */
#define NB_SIX_PAIRS(acc, x, lo, hi)                                  \
    do {                                                              \
        for (int v_ = 0; v_ < BK_NV; v_++) {                          \
            acc[0][v_] = vbfdotq_laneq_f32(acc[0][v_], x[v_], lo, 0); \
            acc[1][v_] = vbfdotq_laneq_f32(acc[1][v_], x[v_], lo, 1); \
            acc[2][v_] = vbfdotq_laneq_f32(acc[2][v_], x[v_], lo, 2); \
            acc[3][v_] = vbfdotq_laneq_f32(acc[3][v_], x[v_], lo, 3); \
            acc[4][v_] = vbfdotq_lane_f32(acc[4][v_], x[v_], hi, 0);  \
            acc[5][v_] = vbfdotq_lane_f32(acc[5][v_], x[v_], hi, 1);  \
        }                                                             \
    } while (0)

/* The six pairs at p: the first four, and the last two. */
static inline bfloat16x8_t nb_six_lo(const uint32_t *p)
{
    return vreinterpretq_bf16_u32(vld1q_u32(p));
}
static inline bfloat16x4_t nb_six_hi(const uint32_t *p)
{
    return vreinterpret_bf16_u32(vld1_u32(p + 4));
}

/* s[r * lds + c] = sum over d of q[r][d] * k[c][d] for r < BK_MR, c <
 * BK_NR: qp a panel of query pairs [dim / 2][BK_MR], kp a strip of key
 * pairs [dim / 2][BK_NR]. */
static inline void bk16_kernel_qk(float *restrict s, int64_t lds, const uint32_t *restrict qp,
                                  const uint32_t *restrict kp, int32_t dim)
{
    float32x4_t acc[BK_MR][BK_NV];
    for (int r = 0; r < BK_MR; r++)
        for (int v = 0; v < BK_NV; v++)
            acc[r][v] = vdupq_n_f32(0.0f);
    for (int32_t p = 0; p < dim / 2; p++) {
        bfloat16x8_t k[BK_NV];
        for (int v = 0; v < BK_NV; v++)
            k[v] = nb_load32(kp + (int64_t)p * BK_NR + v * 4);
        const uint32_t *q = qp + (int64_t)p * BK_MR;
        NB_SIX_PAIRS(acc, k, nb_six_lo(q), nb_six_hi(q));
    }
    for (int r = 0; r < BK_MR; r++)
        for (int v = 0; v < BK_NV; v++)
            vst1q_f32(s + (int64_t)r * lds + v * 4, acc[r][v]);
}

/* One step of bk16_kernel_kq: pair l of the four loaded from each key row
 * (kv) against the query pairs of row p + l of the strip. */
#define NB_KQ_LANE(l)                                                     \
    do {                                                                  \
        bfloat16x8_t q[BK_NV];                                            \
        for (int v = 0; v < BK_NV; v++)                                   \
            q[v] = nb_load32(qp + (int64_t)(p + (l)) * BK_NR + v * 4);    \
        for (int i = 0; i < BK_MR; i++)                                   \
            for (int v = 0; v < BK_NV; v++)                               \
                acc[i][v] = vbfdotq_laneq_f32(acc[i][v], q[v], kv[i], l); \
    } while (0)

/* st[i * ldr + c] = scale * sum over d of k[i][d] * q[c][d], keys i <
 * BK_MR (bf16 rows of k, stride dim), query rows c < BK_NR (a strip of
 * pairs [dim / 2][BK_NR]).  Four pairs of every key row are loaded at a
 * time; the pairs past the last multiple of 8 are broadcast one by one. */
static inline void bk16_kernel_kq(float *restrict st, int64_t ldr, const uint16_t *restrict k,
                                  const uint32_t *restrict qp, int32_t dim, float scale)
{
    float32x4_t acc[BK_MR][BK_NV];
    for (int i = 0; i < BK_MR; i++)
        for (int v = 0; v < BK_NV; v++)
            acc[i][v] = vdupq_n_f32(0.0f);
    int32_t p = 0;
    for (; 2 * p + 8 <= dim; p += 4) {
        bfloat16x8_t kv[BK_MR];
        for (int i = 0; i < BK_MR; i++)
            kv[i] = nb_load16(k + (int64_t)i * dim + 2 * p);
        NB_KQ_LANE(0);
        NB_KQ_LANE(1);
        NB_KQ_LANE(2);
        NB_KQ_LANE(3);
    }
    for (; p < dim / 2; p++) {
        bfloat16x8_t q[BK_NV];
        for (int v = 0; v < BK_NV; v++)
            q[v] = nb_load32(qp + (int64_t)p * BK_NR + v * 4);
        for (int i = 0; i < BK_MR; i++) {
            const bfloat16x8_t kw = nb_bcast(k + (int64_t)i * dim + 2 * p);
            for (int v = 0; v < BK_NV; v++)
                acc[i][v] = vbfdotq_f32(acc[i][v], q[v], kw);
        }
    }
    const float32x4_t sc = vdupq_n_f32(scale);
    for (int i = 0; i < BK_MR; i++)
        for (int v = 0; v < BK_NV; v++)
            vst1q_f32(st + (int64_t)i * ldr + v * 4, vmulq_f32(acc[i][v], sc));
}

/* o[r][c0 + c] += sum over key pairs jp < npairs of the weights pp[jp *
 * ldr + r] (bf16 pair of keys 2jp, 2jp + 1) times the values vp[jp][c0 +
 * c] (bf16 pair of the same keys, row stride ldv), r < BK_MR, c < BK_NR. */
static inline void bk16_kernel_pv_t(float *const *o, int32_t c0, const uint32_t *restrict pp,
                                    int64_t ldr, const uint32_t *restrict vp, int64_t ldv,
                                    int32_t npairs)
{
    float32x4_t acc[BK_MR][BK_NV];
    for (int r = 0; r < BK_MR; r++)
        for (int x = 0; x < BK_NV; x++)
            acc[r][x] = vld1q_f32(o[r] + c0 + x * 4);
    for (int32_t jp = 0; jp < npairs; jp++) {
        bfloat16x8_t vv[BK_NV];
        for (int x = 0; x < BK_NV; x++)
            vv[x] = nb_load32(vp + (int64_t)jp * ldv + c0 + x * 4);
        const uint32_t *w = pp + (int64_t)jp * ldr;
        NB_SIX_PAIRS(acc, vv, nb_six_lo(w), nb_six_hi(w));
    }
    for (int r = 0; r < BK_MR; r++)
        for (int x = 0; x < BK_NV; x++)
            vst1q_f32(o[r] + c0 + x * 4, acc[r][x]);
}
