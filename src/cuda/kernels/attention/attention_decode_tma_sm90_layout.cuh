/*
 * What the Hopper sparse attention's producer warps (attention_decode_tma_sm90_producer.cuh)
 * and consumer warpgroups (attention_decode_tma_sm90.cu) share: the ring's sizes, the shared
 * memory layout, what a ring slot holds and what a unit is.
 */
#ifndef MSA_CUDA_KERNELS_ATTENTION_ATTENTION_DECODE_TMA_SM90_LAYOUT_CUH
#define MSA_CUDA_KERNELS_ATTENTION_ATTENTION_DECODE_TMA_SM90_LAYOUT_CUH

#include "cuda/kernels/attention/key_stream.cuh"
#include "cuda/arch/tma_sm90.cuh"
#include "cuda/arch/wgmma_sm90.cuh"
#include "cuda/kernels/attention/rows_mma.cuh"
#include "cuda/arch/smem.cuh"
#include "cuda/common/quant_widen.cuh"

/* Four 32 KB stages.  A deeper ring does not pay: on the H200, six stages
 * (as many as fit beside the merge scratch) were 0.2-5% slower than four
 * on twelve decode cases (batches of 8 to 128 requests), five 0.3-4% slower
 * on the H200, three about as fast as four; the stream is not
 * short of copies in flight. */
#define ATT_TMA_STAGES 4
/* A unit's tail tile is finished after its end's slot is claimed
 * (cu_attt_tail_finish): that claim must not wait for the tail's slot. */
static_assert(ATT_TMA_STAGES >= 2, "the attention ring needs two stages");
#define ATT_TMA_CONSUMERS 8
/* Producer warps: two take the CTA's units in turns (see cu_attt_turn), so
 * that one prepares its unit while the other issues. */
#define ATT_TMA_PRODUCERS 2
#define ATT_TMA_THREADS ((ATT_TMA_CONSUMERS + ATT_TMA_PRODUCERS) * 32)
/* The tile shapes: head dim ATT_TMA_HEAD_DIM (16-bit elements), a key
 * block is one page of ATT_TMA_PAGE_ROWS rows, streamed as tiles of
 * ATT_TMA_TILE keys; each K or V row is copied as two tensor-map boxes of
 * ATT_TMA_BOX_COLS columns (128-byte swizzle).  A consumer warpgroup is
 * ATT_TMA_GROUP_THREADS threads. */
#define ATT_TMA_HEAD_DIM 128
#define ATT_TMA_ROW_BYTES (ATT_TMA_HEAD_DIM * 2)
#define ATT_TMA_PAGE_ROWS 128
#define ATT_TMA_LOG_PAGE_ROWS 7
#define ATT_TMA_TILE 64
#define ATT_TMA_TILES_PER_PAGE (ATT_TMA_PAGE_ROWS / ATT_TMA_TILE)
#define ATT_TMA_BOX_COLS 64
#define ATT_TMA_GROUP_THREADS 128
#define ATT_TMA_HALF_BYTES (ATT_TMA_TILE * ATT_TMA_ROW_BYTES) /* K or V of one tile */
static_assert((1 << ATT_TMA_LOG_PAGE_ROWS) == ATT_TMA_PAGE_ROWS, "page rows: a power of two");
static_assert(ATT_TMA_TILES_PER_PAGE == 2, "two tiles per page: a union entry's tiles t and t + 1");
static_assert(ATT_TMA_TILE == CU_TILE_KEYS, "the plan's tile costs count tiles of CU_TILE_KEYS");
static_assert(2 * ATT_TMA_BOX_COLS == ATT_TMA_HEAD_DIM && ATT_TMA_BOX_COLS * 2 == 128,
              "a row is two boxes of one 128-byte swizzle span each");
static_assert(ATT_TMA_CONSUMERS * 32 == 2 * ATT_TMA_GROUP_THREADS, "two consumer warpgroups");
#define ATT_TMA_STAGE_BYTES (2 * ATT_TMA_HALF_BYTES)

/* Quantized K/V planes: a ring slot holds a tile's K codes, then its V
 * codes, ATT_Q_HALF_BYTES apart.  fp8_e4m3: each one tensor-map box of
 * ATT_TMA_TILE rows x 128 bytes (128-byte swizzle).  nvfp4: the tile's
 * rows of 64 code bytes, then their 8-byte group-scale rows, as the page
 * region lays them out (plain bulk copies).  The four slots take the first
 * half of the 16-bit ring's bytes; in the second half each consumer
 * warpgroup has a pair of 16-bit tiles (K, then V, laid out as a 16-bit
 * slot), into which it widens the tiles it computes before its products
 * read them. */
#define ATT_Q_HALF_BYTES (ATT_TMA_TILE * 128)
#define ATT_Q_STAGE_BYTES (2 * ATT_Q_HALF_BYTES)
#define ATT_Q_WIDE_OFFSET (ATT_TMA_STAGES * ATT_Q_STAGE_BYTES)
#define ATT_NV_CODE_BYTES (ATT_TMA_TILE * 64)
#define ATT_NV_SCALE_BYTES (ATT_TMA_TILE * 8)
static_assert(ATT_Q_WIDE_OFFSET % 1024 == 0 && ATT_Q_HALF_BYTES % 1024 == 0,
              "fp8 boxes and the widened tiles on swizzle atoms");
static_assert(ATT_NV_CODE_BYTES + ATT_NV_SCALE_BYTES <= ATT_Q_HALF_BYTES,
              "an nvfp4 half tile fits its place");
static_assert(ATT_Q_WIDE_OFFSET + 2 * ATT_TMA_STAGE_BYTES <= ATT_TMA_STAGES * ATT_TMA_STAGE_BYTES,
              "the quantized ring and both groups' widened tiles fit the 16-bit ring's bytes");

/* Bytes of a ring slot, and from its K to its V: 16-bit rows or codes. */
template <int KF>
__host__ __device__ constexpr uint32_t cu_attt_stage_bytes()
{
    return KF == CU_PLANE_16 ? ATT_TMA_STAGE_BYTES : ATT_Q_STAGE_BYTES;
}
template <int KF>
__host__ __device__ constexpr uint32_t cu_attt_half_bytes()
{
    return KF == CU_PLANE_16 ? ATT_TMA_HALF_BYTES : ATT_Q_HALF_BYTES;
}

/* Partial state of a warp for the in-CTA merge: 16 x 128 O, then m, l.
 * Only the second group's warps save theirs (a single item): 4 slots. */
#define ATT_TMA_SCR_FLOATS CU_ROWS_SLOT_FLOATS
#define ATT_TMA_SCR_SLOTS 4
#define ATT_TMA_SMEM_BYTES                                                                      \
    (1024 + ATT_TMA_STAGES * ATT_TMA_STAGE_BYTES + ATT_TMA_SCR_SLOTS * ATT_TMA_SCR_FLOATS * 4 + \
     ATT_TMA_STAGES * 16 + (2 * ATT_TMA_STAGES + ATT_TMA_PRODUCERS) * 8 + 16)

/* Beyond ATT_TMA_SMEM_BYTES, when the kernel builds its own unions
 * (cu_attn_params.attention_union_blocks = U blocks, a multiple of 32): per producer, in this
 * order, a bitmap of a request's blocks (U words), its summary (a bit per
 * bitmap word in use, U / 32 words), the request's page-table row (U
 * words) and a list of CU_ATT_UNION_LIST ids, then as many membership
 * masks.  The offsets in words (cu_attt_uarea_of) and the size: */
__host__ __device__ constexpr int32_t cu_attt_union_sum_off(int32_t U)
{
    return U;
}
__host__ __device__ constexpr int32_t cu_attt_union_pages_off(int32_t U)
{
    return U + U / 32;
}
__host__ __device__ constexpr int32_t cu_attt_union_list_off(int32_t U)
{
    return 2 * U + U / 32;
}
__host__ __device__ constexpr int32_t cu_attt_union_words(int32_t U)
{
    return U > 0 ? cu_attt_union_list_off(U) + 2 * CU_ATT_UNION_LIST : 0;
}
#define ATT_TMA_UNION_MAX_BYTES (ATT_TMA_PRODUCERS * 4 * cu_attt_union_words(CU_ATT_UNION_BLOCKS))
__host__ __device__ __forceinline__ size_t cu_attt_union_bytes(const cu_attn_params &params)
{
    return (size_t)ATT_TMA_PRODUCERS * 4 *
           (size_t)cu_attt_union_words(params.attention_union_blocks);
}

static_assert(ATT_TMA_SMEM_BYTES + ATT_TMA_UNION_MAX_BYTES <= 227 * 1024,
              "attention ring, scratch and unions exceed shared memory");
static_assert((ATT_TMA_SMEM_BYTES - 1024) % 16 == 0,
              "the union area after the ring's is 16-byte aligned");

/* Every lane of a consumer warp reads a slot's meta (below) and every
 * lane arrives on the slot's empty barrier: each lane's arrival releases
 * its own reads, as racecheck requires.  (All lanes reading and lane 0
 * alone arriving after a warp barrier is ordered as well under the PTX
 * memory model, but racecheck reports it; lane 0 alone reading, passing
 * the meta on by shuffle and arriving was 1-2% slower on the
 * H200.) */
#define ATT_TMA_EMPTY_ARRIVALS (ATT_TMA_CONSUMERS * 32)

/* What the producer tells the consumers about a ring slot. */
typedef struct cu_attt_meta {
    int32_t pos0;  /* position of the tile's first key; -1: end of the item */
    uint32_t bits; /* item tokens (request-local bit) that use any key of it */
    int32_t pad0, pad1;
} cu_attt_meta;

#ifdef CU_HAVE_WGMMA

typedef struct cu_attt_smem {
    unsigned char *ring;
    float *scr;
    cu_attt_meta *meta;
    uint64_t *full, *empty;
    uint64_t *tail;    /* a barrier per producer for the tiles it finishes itself */
    uint32_t *handoff; /* the ring's slot count, from one producer to the next */
    /* Producer j's own union (attention_union_blocks): its area, uwords words
     * from uarea + j * uwords: bitmap, summary (both all zero between
     * uses), pages, ids, masks (cu_attt_union_words). */
    uint32_t *uarea;
    int32_t uwords;
} cu_attt_smem;

/* Tokens of an item: bits [tok0, tok0 + units). */
__device__ __forceinline__ uint32_t cu_attt_item_bits(int32_t tok0, int32_t units)
{
    const uint32_t m = units >= 32 ? 0xffffffffu : ((1u << units) - 1u);
    return m << tok0;
}

/* One unit: item `first` and, for a pair, the next one; their key stream
 * is the same, their tokens follow each other.  The items themselves are
 * read where needed (an L1 hit), not kept in registers through the loop. */
typedef struct cu_attt_unit {
    int32_t first;
    int32_t ntok[2]; /* tokens of each item (ntok[1] = 0: single item) */
#ifdef MSA_TIMELINE
    bool first_of_cta; /* the CTA's first unit (timeline marks) */
#endif
} cu_attt_unit;

__device__ __forceinline__ cu_attt_unit cu_attt_unit_of(const cu_attn_params &params, int32_t u,
                                                        bool first_of_cta)
{
    cu_attt_unit un;
    const cu_att_item *items = params.meta.att[CU_KIND_SPARSE];
    un.first = params.meta.att_units[u];
    const cu_att_item it = items[un.first];
    un.ntok[0] = (it.nrows + 15) / 16;
    un.ntok[1] = it.unit_len == 2 ? (items[un.first + 1].nrows + 15) / 16 : 0;
#ifdef MSA_TIMELINE
    un.first_of_cta = first_of_cta;
#else
    (void)first_of_cta;
#endif
    return un;
}

#endif /* CU_HAVE_WGMMA */

#endif /* MSA_CUDA_KERNELS_ATTENTION_ATTENTION_DECODE_TMA_SM90_LAYOUT_CUH */
