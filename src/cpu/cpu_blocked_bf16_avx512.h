/* The bf16 micro-kernels of the blocked prefill products on AVX512-BF16
 * (vdpbf16ps), 16 lanes: included by cpu_blocked_bf16_impl.h, which
 * describes the packed layouts they read. */

#if BK_VN != 16
#error "the AVX512-BF16 blocked kernels are written for 16-lane vectors"
#endif

/* The 32-bit word of the bf16 pair at p (any alignment), in every lane. */
static inline __m512bh bk16_bcast(const uint16_t *p)
{
    uint32_t w;
    memcpy(&w, p, sizeof w);
    return (__m512bh)_mm512_set1_epi32((int)w);
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
