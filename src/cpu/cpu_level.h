/* The CPU kernels of one instruction-set level.  Each cpu_level_*.c file
 * defines MSA_CPU_LEVEL_ISA (an msa_cpu_isa), MSA_CPU_LEVEL_TABLE (the name
 * of its table) and MSA_CPU_LEVEL_NAME, and includes this file; CMake gives
 * that file the level's compiler flags, so the same source becomes
 * portable, AVX2, AVX-512 or NEON code (with or without BF16), and the
 * inline helpers of cpu_math.h and cpu_bf16.h follow.  Everything here is static but the
 * table, so the levels do not see each other's symbols. */
#ifndef MSA_CPU_LEVEL_ISA
#error "cpu_level.h is included by the cpu_level_*.c files only"
#endif

#include "cpu/cpu_kernels.h"
#include "cpu/cpu_bf16.h"
#include "cpu/cpu_math.h"
#include "core/quant.h"

#include <math.h>
#include <string.h>

#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif

/* The vector de-quantization of fp8 and nvfp4 rows (dq_fp8x16 / dq_fp8x8:
 * 16 or 8 e4m3 codes to fp32 lanes), which the decode rows use too. */
#include "cpu/cpu_dequant_impl.h"

/* The decode rows' vector helpers (dr_widen: 16 or 8 bf16 to fp32 lanes). */
#include "cpu/cpu_decode_rows.h"

/* The index scan of decode and verify rows takes bf16 dot products only
 * where the level has them and no widening rows (NEON-BF16); the widening
 * rows scan faster where both exist (cpu_indexer_impl.h). */
#define MSA_CPU_BF16_SCAN (MSA_CPU_HAVE_BF16_DOT && !MSA_CPU_DECODE_ROWS)

/* dst[i] = src[i] as fp32.  Widening is exact in every format, so each
 * level computes the same values as msa_convert_to_f32 (up to the payload
 * of a NaN: F16C quiets a signalling one); only the instructions differ:
 * bf16 is the high half of an fp32, so a zero-extension and a 16-bit shift
 * widen eight or sixteen of them at once; fp16 goes through F16C
 * (vcvtph2ps) or NEON's fcvtl. */
static void level_convert(float *restrict dst, const void *restrict src, msa_dtype dtype, int64_t n)
{
    int64_t i = 0;
    if (dtype == MSA_DTYPE_BF16) {
        const uint16_t *s = src;
#if MSA_CPU_DECODE_ROWS
        for (; i + DR_LANES <= n; i += DR_LANES)
            DR_STORE(dst + i, dr_widen(s + i));
#elif defined(__aarch64__) && defined(__ARM_NEON)
        for (; i + 4 <= n; i += 4)
            vst1q_f32(dst + i, vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(s + i), 16)));
#endif
        for (; i < n; i++)
            dst[i] = msa_bits_to_f32((uint32_t)s[i] << 16);
    } else if (dtype == MSA_DTYPE_FP16) {
        const uint16_t *s = src;
#if defined(__AVX512F__)
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(dst + i,
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
#elif defined(__F16C__)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#elif defined(__aarch64__) && defined(__ARM_NEON)
        for (; i + 4 <= n; i += 4)
            vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(s + i))));
#endif
        for (; i < n; i++)
            dst[i] = msa_f16_to_f32(s[i]);
    } else {
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

/* The gather: key rows [j0, j0 + n) of one head, from their pages, into
 * dst[n][dim] as fp32.  Rows of one page and head that are packed (no gap
 * between them) are converted in one go, others one row at a time.  Quantized planes are de-quantized here, so every
 * kernel that reads keys or values through this gather (index scan,
 * attention, index value; decode, verify and prefill rows) sees the values
 * of SPEC 8's read rule. */
static void level_load_rows(float *dst, const cpu_plane *plane, const int32_t *page_row,
                            int32_t head, int64_t j0, int32_t n)
{
    const int32_t P = plane->page_size, dim = plane->dim;
    if (cpu_plane_quantized(plane)) { /* the same rows, de-quantized */
        level_dequant_rows(dst, plane, page_row, head, j0, n);
        return;
    }
    const int packed = cpu_plane_packed(plane);
    const int64_t step = plane->row_stride * (int64_t)msa_dtype_size(plane->dtype);
    int32_t i = 0;
    while (i < n) {
        int64_t j = j0 + i;
        int32_t off = (int32_t)(j % P);
        int32_t run = P - off < n - i ? P - off : n - i;
        const char *src = cpu_plane_row(plane, page_row[j / P], head, off);
        if (packed) /* the run is one block */
            level_convert(dst + (int64_t)i * dim, src, plane->dtype, (int64_t)run * dim);
        else
            for (int32_t k = 0; k < run; k++)
                level_convert(dst + (int64_t)(i + k) * dim, src + k * step, plane->dtype, dim);
        i += run;
    }
}

#include "cpu/cpu_attention_impl.h"
#include "cpu/cpu_indexer_impl.h"
#include "cpu/cpu_blocked_impl.h"

#if MSA_CPU_HAVE_BF16_DOT
#define MSA_CPU_LEVEL_DOT "bf16 dot products (" MSA_CPU_BF16_DOT_INSN ") on bf16 data, else fp32"
#else
#define MSA_CPU_LEVEL_DOT "fp32 dot products on widened keys"
#endif
/* The index scan of decode and verify rows (MSA_CPU_BF16_SCAN above): the
 * widening rows where the level has them, else the level's products. */
#if MSA_CPU_DECODE_ROWS
#define MSA_CPU_LEVEL_INDEX_DOT "fp32 dot products on keys widened in registers"
#else
#define MSA_CPU_LEVEL_INDEX_DOT MSA_CPU_LEVEL_DOT
#endif
/* What prefill rows run (cpu_blocked_impl.h) and their register block. */
#define MSA_CPU_STR2(x) #x
#define MSA_CPU_STR(x) MSA_CPU_STR2(x)
#if MSA_CPU_HAVE_BF16_DOT
#define MSA_CPU_LEVEL_BLOCKED \
    "bf16 (" MSA_CPU_BF16_DOT_INSN ") blocked products on bf16 data, else fp32"
#else
#define MSA_CPU_LEVEL_BLOCKED "fp32 blocked products"
#endif
#define MSA_CPU_LEVEL_PREFILL                                                                  \
    "; prefill rows (q_len >= " MSA_CPU_STR(MSA_CPU_BLOCKED_MIN_Q) "): " MSA_CPU_LEVEL_BLOCKED \
                                                                   ", " BK_BLOCK_TEXT          \
                                                                   " register block"

/* Prefill attention on the row kernels (msa_cpu_attn_blocked): every
 * layer on AVX512-BF16 (cpu_bf16.h); sparse layers on the fp32 AVX-512
 * level, where the 66 representative prefill cases scaled to 8K (Zen 4, 2
 * threads, bf16 data) ran the sparse layer at 77% of the FMA peak against
 * 66% on the blocked kernels.  On AVX2 the two were level (0.158 against
 * 0.154 TFLOP/s, one run each, within the runs' spread), and the blocked
 * kernels stay. */
#if MSA_CPU_BF16_ROWS_PREFILL
#define MSA_CPU_LEVEL_ROWS_PREFILL (MSA_CPU_ROWS_SPARSE | MSA_CPU_ROWS_DENSE)
#elif MSA_CPU_DECODE_ROWS && DR_LANES == 16
#define MSA_CPU_LEVEL_ROWS_PREFILL MSA_CPU_ROWS_SPARSE
#else
#define MSA_CPU_LEVEL_ROWS_PREFILL 0
#endif

#if MSA_CPU_BF16_ROWS_PREFILL
#define MSA_CPU_ROWS_TEXT "the row kernels on bf16 data with groups of 16 heads, else "
#elif MSA_CPU_LEVEL_ROWS_PREFILL
#define MSA_CPU_ROWS_TEXT \
    "the row kernels on sparse layers of bf16 data with groups of 16 heads, else "
#endif
#ifdef MSA_CPU_ROWS_TEXT
#define MSA_CPU_LEVEL_ATTN_PREFILL                                                              \
    "; prefill rows (q_len >= " MSA_CPU_STR(                                                    \
        MSA_CPU_BLOCKED_MIN_Q) "): " MSA_CPU_ROWS_TEXT MSA_CPU_LEVEL_BLOCKED ", " BK_BLOCK_TEXT \
                               " register block"
#else
#define MSA_CPU_LEVEL_ATTN_PREFILL MSA_CPU_LEVEL_PREFILL
#endif

const msa_cpu_kernels MSA_CPU_LEVEL_TABLE = {
    .isa = MSA_CPU_LEVEL_ISA,
    .indexer = MSA_CPU_LEVEL_NAME ": " MSA_CPU_LEVEL_INDEX_DOT MSA_CPU_LEVEL_PREFILL,
    .attention = MSA_CPU_LEVEL_NAME ": " MSA_CPU_LEVEL_DOT MSA_CPU_LEVEL_ATTN_PREFILL,
    .gather = MSA_CPU_LEVEL_NAME ": vector widening of bf16/fp16 rows, next block prefetched",
    .score_task = score_task,
    .attn_item = attn_item,
    .score_blocked = score_blocked,
    .attn_blocked = attn_blocked,
    .rows_prefill = MSA_CPU_LEVEL_ROWS_PREFILL,
    .load_rows = level_load_rows,
};
