/*
 * Exact top-k selection of one (token, index head) row (SPEC 4), by one
 * warp, or by a whole CTA when a step has few rows (cu_select_row_list).
 *
 * Forced blocks (init, local) are always in; among the other reachable
 * blocks the (K - forced) best by score, ties toward the lower id, NaN below
 * every number.  Four 8-bit histogram passes over order-preserving 32-bit
 * keys find the threshold value; one ballot pass in id order then emits the
 * chosen ids already ascending, taking the lowest ids among keys equal to
 * the threshold.  Deterministic, no sort, no data-dependent memory.
 */
#ifndef MSA_CUDA_KERNELS_SELECT_SELECT_ROW_CUH
#define MSA_CUDA_KERNELS_SELECT_SELECT_ROW_CUH

#include "cuda/plan.cuh"

/* Order-preserving key: larger score -> larger key; NaN lowest (0); -0 == +0. */
__device__ __forceinline__ uint32_t cu_score_key(float f)
{
    if (isnan(f))
        return 0u;
    if (f == 0.0f)
        f = 0.0f;
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Selection when at most SEL_SMALL blocks are chosen by score and K <= 32
 * (M3: 15 and 16).  One pass: each lane keeps the best SEL_SMALL of its
 * strided candidates in registers, as keys (score key << 32 | ~id) that are
 * all distinct and order exactly as SPEC 4 ranks (ties to the lower id);
 * then `need` rounds of a warp maximum pop the winners.  The K ids (chosen
 * and forced) sit one per lane and are sorted into ascending order.  About
 * a tenth of the radix passes' time at a few thousand blocks.
 *
 * The insertion is a serial chain per candidate, so the candidates are first
 * filtered: each lane keeps its two largest score keys, and with T the
 * need-th largest of those 64 values at least `need` candidates have a key
 * >= T, so every winner does too.  Only those (usually need plus a few)
 * enter the list; when more than SEL_LIST pass the filter (many equal
 * scores), all candidates do.  When at most 32 pass (nearly always), one
 * sort of their score keys, one per lane, gives the threshold, and the
 * winners go out in the list's id order: no insertion, no maximum rounds,
 * no sort of the ids; up to 64 (pairs of blocks of equal scores, as
 * repeated content gives) take two per lane the same way.
 * (With a lane's maximum alone, 32 values, more than 32 candidates passed
 * on the benchmark's 1024-block rows, and the rounds took most of the
 * selection's instructions.) */
#define SEL_SMALL 16
/* Bitonic merge across the warp, one value per lane: a bitonic sequence
 * over the 32 lanes comes out sorted, lane 0 the largest (DESC) or the
 * smallest.  Five compare-exchange steps. */
template <bool DESC, typename T>
__device__ __forceinline__ T cu_warp_bitonic_merge(T x)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 16; j > 0; j >>= 1) {
        const T y = __shfl_xor_sync(0xffffffffu, x, j);
        const bool keep_max = ((lane & j) == 0) == DESC;
        x = keep_max ? (x > y ? x : y) : (x < y ? x : y);
    }
    return x;
}

/* Bitonic sort of one value per lane across the warp (15 compare-exchange
 * steps, unrolled): lane 0 ends with the largest (DESC) or the smallest.
 * The selection's thresholds and ranks come from such sorts: the 32-step
 * loops they replace (each lane counting, by shuffles, the values above
 * its own) were 63% of the selection's instructions at batch 128, 5K, 8
 * tokens (per-instruction counts on the H200), and
 * at many rows per SM the kernel is bound by its instruction issue. */
template <bool DESC, typename T>
__device__ __forceinline__ T cu_warp_bitonic(T x)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 2; k < 32; k <<= 1) {
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1) {
            const T y = __shfl_xor_sync(0xffffffffu, x, j);
            /* Runs of k lanes alternate direction, the last merge's DESC. */
            const bool keep_max = (((lane & j) == 0) == ((lane & k) == 0)) == DESC;
            x = keep_max ? (x > y ? x : y) : (x < y ? x : y);
        }
    }
    return cu_warp_bitonic_merge<DESC>(x);
}

#define SEL_LIST 256

/* Candidates [I, c_end) whose score key is >= the need-th largest of the
 * lanes' two largest keys, ascending, into list[] (SEL_LIST entries);
 * returns how many passed (more than SEL_LIST: the list is incomplete,
 * do not use it).  1 <= need <= 32. */
__device__ __forceinline__ int32_t cu_select_prefilter(const float *scores, int32_t I,
                                                       int32_t c_end, int32_t need, int32_t *list)
{
    const int lane = threadIdx.x & 31;
    const uint32_t below = (1u << lane) - 1u;
    /* a >= b: this lane's two largest keys (0, NaN's key, when absent:
     * below or equal to every candidate, so T stays a bound). */
    uint32_t a = 0u, b = 0u;
#pragma unroll 4
    for (int32_t n = I + lane; n < c_end; n += 32) {
        const uint32_t k = cu_score_key(scores[n]);
        b = max(b, min(a, k));
        a = max(a, k);
    }
    /* T = the need-th largest of the 64 values.  With the a's sorted
     * descending and the b's ascending, the lane-wise maxima are the 32
     * largest of the 64 as a bitonic sequence; five merge steps sort them. */
    const uint32_t c =
        cu_warp_bitonic_merge<true>(max(cu_warp_bitonic<true>(a), cu_warp_bitonic<false>(b)));
    const uint32_t T = __shfl_sync(0xffffffffu, c, need - 1);
    int32_t count = 0;
    for (int32_t b0 = I; b0 < c_end; b0 += 32) {
        const int32_t n = b0 + lane;
        const bool pass = n < c_end && cu_score_key(scores[n]) >= T;
        const uint32_t bal = __ballot_sync(0xffffffffu, pass);
        const int32_t pos = count + __popc(bal & below);
        if (pass && pos < SEL_LIST)
            list[pos] = n;
        count += __popc(bal);
    }
    __syncwarp();
    return count;
}

/* The lone warp's one-sort paths, after their winners: the forced ids
 * around them, init blocks 0 .. I-1 first and the local blocks c_end ..
 * c_end + Lc - 1 after the `need` winners; then the row is the warp's. */
__device__ __forceinline__ void cu_select_forced_ids(int32_t I, int32_t Lc, int32_t need,
                                                     int32_t c_end, int32_t *out)
{
    const int lane = threadIdx.x & 31;
    if (lane < I)
        out[lane] = lane;
    if (lane < Lc)
        out[I + need + lane] = c_end + lane;
    __syncwarp();
}

/* cu_select_row_small's case of 33 to 64 candidates in list[] (ascending
 * ids, at least `need` of them), two per lane: list[lane] and list[lane +
 * 32], the second half's ids above the first's.  More than 32 pass where
 * blocks score the same (repeated content), which before went to the
 * insertion path.  Not inlined: the two sorts inlined into the row took
 * the kernel from 94 to 157 registers. */
static __device__ __noinline__ void cu_select_list64(const float *scores, int32_t count, int32_t I,
                                                     int32_t Lc, int32_t need, int32_t c_end,
                                                     const int32_t *list, int32_t *out)
{
    const int lane = threadIdx.x & 31;
    const uint32_t below = (1u << lane) - 1u;
    const bool valid1 = lane + 32 < count; /* every lane holds a first one */
    const int32_t n0 = list[lane], n1 = valid1 ? list[lane + 32] : 0;
    const uint32_t key0 = cu_score_key(scores[n0]);
    const uint32_t key1 = valid1 ? cu_score_key(scores[n1]) : 0u;
    /* The 32 largest of the 64 as a bitonic sequence, merged. */
    const uint32_t top =
        cu_warp_bitonic_merge<true>(max(cu_warp_bitonic<true>(key0), cu_warp_bitonic<false>(key1)));
    const uint32_t kth = __shfl_sync(0xffffffffu, top, need - 1);
    const uint32_t eq0 = __ballot_sync(0xffffffffu, key0 == kth);
    const uint32_t eq1 = __ballot_sync(0xffffffffu, valid1 && key1 == kth);
    const int32_t missing = need - __popc(__ballot_sync(0xffffffffu, key0 > kth)) -
                            __popc(__ballot_sync(0xffffffffu, valid1 && key1 > kth));
    const bool win0 = key0 > kth || (key0 == kth && __popc(eq0 & below) < missing);
    const bool win1 = valid1 &&
                      (key1 > kth || (key1 == kth && __popc(eq0) + __popc(eq1 & below) < missing));
    const uint32_t wins0 = __ballot_sync(0xffffffffu, win0);
    const uint32_t wins1 = __ballot_sync(0xffffffffu, win1);
    if (win0)
        out[I + __popc(wins0 & below)] = n0;
    if (win1)
        out[I + __popc(wins0) + __popc(wins1 & below)] = n1;
    cu_select_forced_ids(I, Lc, need, c_end, out);
}

__device__ __forceinline__ void cu_select_row_small(const float *scores, int32_t N, int32_t K,
                                                    int32_t I, int32_t Lc, int32_t *out,
                                                    int32_t *list)
{
    const int lane = threadIdx.x & 31;
    const uint32_t below = (1u << lane) - 1u;
    const int32_t need = K - I - Lc;
    const int32_t c_end = N - Lc;
    int32_t i_begin = I + lane, i_end = c_end;
    const int32_t *ids = NULL; /* candidate i is block ids[i] (or i itself) */
    int32_t mine = INT32_MAX;
    if (need > 0) {
        const int32_t count = cu_select_prefilter(scores, I, c_end, need, list);
        if (count <= 32) {
            /* One candidate per lane, in the list's (ascending id) order.
             * The need-th largest score key, kth, from one 32-bit sort (the
             * empty lanes' 0 is below or equal to every key, and at least
             * `need` candidates passed: N > K); the winners are the keys
             * above kth and, of those equal to it, the lowest ids, as many
             * as are missing.  They stay in id order, so their place in the
             * row is a count of the winners on lower lanes, between the
             * init blocks (below every candidate) and the local ones
             * (above): no ranking sort and no sort of the ids (those were
             * a third of the instructions left after the earlier sorts).  Every
             * lane takes part in every ballot. */
            const bool valid = lane < count;
            const int32_t n = valid ? list[lane] : 0;
            const uint32_t key = valid ? cu_score_key(scores[n]) : 0u;
            const uint32_t kth = __shfl_sync(0xffffffffu, cu_warp_bitonic<true>(key), need - 1);
            const uint32_t above = __ballot_sync(0xffffffffu, valid && key > kth);
            const uint32_t equal = __ballot_sync(0xffffffffu, valid && key == kth);
            const int32_t missing = need - __popc(above);
            const bool win = valid &&
                             (key > kth || (key == kth && __popc(equal & below) < missing));
            const uint32_t wins = __ballot_sync(0xffffffffu, win);
            if (win)
                out[I + __popc(wins & below)] = n;
            cu_select_forced_ids(I, Lc, need, c_end, out);
            return;
        } else if (count <= 64) {
            cu_select_list64(scores, count, I, Lc, need, c_end, list, out);
            return;
        } else if (count <= SEL_LIST) {
            i_begin = lane;
            i_end = count;
            ids = list;
        }
    }
    unsigned long long t[SEL_SMALL];
#pragma unroll
    for (int i = 0; i < SEL_SMALL; ++i)
        t[i] = 0ull; /* below every candidate (their low word is never 0) */
    for (int32_t i = i_begin; i < i_end; i += 32) {
        const int32_t n = ids ? ids[i] : i;
        const unsigned long long x = ((unsigned long long)cu_score_key(scores[n]) << 32) |
                                     (uint32_t)(0xffffffffu - (uint32_t)n);
        if (x > t[SEL_SMALL - 1]) {
            /* Insert into the descending list; computed from the old values. */
#pragma unroll
            for (int i = SEL_SMALL - 1; i > 0; --i)
                t[i] = t[i] > x ? t[i] : (t[i - 1] > x ? x : t[i - 1]);
            t[0] = t[0] > x ? t[0] : x;
        }
    }
    for (int32_t r = 0; r < need; ++r) {
        unsigned long long m = t[0];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const unsigned long long y = __shfl_xor_sync(0xffffffffu, m, o);
            m = y > m ? y : m;
        }
        if (t[0] == m) { /* keys are distinct: exactly one lane */
#pragma unroll
            for (int i = 0; i < SEL_SMALL - 1; ++i)
                t[i] = t[i + 1];
            t[SEL_SMALL - 1] = 0ull;
        }
        if (lane == r)
            mine = (int32_t)(0xffffffffu - (uint32_t)(m & 0xffffffffull));
    }
    /* Forced blocks on lanes need .. K-1: init blocks, then the local ones. */
    const int32_t f = lane - need;
    if (f >= 0 && lane < K)
        mine = f < I ? f : (N - Lc) + (f - I);
    /* The K ids (distinct; INT32_MAX on lanes K..31) ascending. */
    const int32_t sorted = cu_warp_bitonic<false>(mine);
    if (lane < K)
        out[lane] = sorted;
    __syncwarp();
}

/* ---- Rows shared by the whole CTA (NT = blockDim.x threads) ----
 *
 * The lone-warp paths above are a serial instruction stream: about 3200
 * instructions for a row of 1024 blocks, 8 µs on the H200, while at
 * batch 1-8 the other warps of the GPU idle.
 * This path needs few dependent steps and spreads them over NT threads:
 *   1. every thread stages its strided scores as keys (shared memory),
 *      keeping its largest candidate key;
 *   2. T, the need-th largest of the NT threads' largest keys (each warp
 *      sorts its 32, the warps' 16 largest are merged; with need > 16 or
 *      at most 2 * NT blocks, the largest of the warps' need-th): at least
 *      `need` threads hold a candidate key >= T, so the winners all are
 *      >= T;
 *   3. the candidates >= T go into a list (usually need + a few; with the
 *      largest of the warps' thresholds, as once taken, about four times
 *      need, and twice that again where pairs of blocks score the same),
 *      as distinct 64-bit keys (score key << 32 | ~id: SPEC 4's order,
 *      ties to the lower id);
 *   4. each list entry's rank is the number of larger entries; the
 *      `need` first are the winners;
 *   5. the K ids go out ascending: the init blocks (below every
 *      candidate), the winners ordered by id, the local blocks (above).
 * When more than the list holds pass the filter (many equal scores) it
 * returns false with nothing written, and the caller takes the old path. */

/* The CTA's shared scratch: the list (capacity `cap` 64-bit entries), the
 * warps' SEL_TOP largest keys (or thresholds), the list's fill counter
 * and the winners by rank. */
typedef struct cu_sel_grp {
    unsigned long long *xs;
    uint32_t *tw;
    uint32_t *cnt;
    int32_t *win;
    int32_t cap;
} cu_sel_grp;

#define SEL_XS 128 /* list entries per warp of the CTA */
#define SEL_TOP \
    16 /* keys per warp in the CTA's threshold (the list path's tw words: SEL_TOP a warp) */

/* The need-th largest (1 <= need <= SEL_TOP) of the NW * SEL_TOP
 * keys in top[] (NW >= 2, a power of two: each warp's SEL_TOP largest,
 * descending), the same in every lane of the calling warp.  Two warps'
 * lists, the second reversed, make a bitonic sequence of 32; merged, and
 * the running 32 largest kept by a lane-wise maximum against the next pair
 * reversed (again bitonic), five compare-exchange steps a merge. */
template <int NW>
__device__ __forceinline__ uint32_t cu_sel_top_threshold(const uint32_t *top, int32_t need)
{
    const int lane = threadIdx.x & 31;
    const int r = lane < SEL_TOP ? lane : 2 * SEL_TOP - 1 - lane; /* rank in its warp's list */
    const int half = lane < SEL_TOP ? 0 : 1;
    uint32_t best = cu_warp_bitonic_merge<true>(top[half * SEL_TOP + r]);
#pragma unroll
    for (int w = 2; w < NW; w += 2) {
        const uint32_t y = cu_warp_bitonic_merge<true>(top[(w + half) * SEL_TOP + r]);
        best = cu_warp_bitonic_merge<true>(max(best, __shfl_sync(0xffffffffu, y, 31 - lane)));
    }
    return __shfl_sync(0xffffffffu, best, need - 1);
}

/* keys: N words of shared memory; N > K, 1 <= need <= 32; NT = blockDim.x,
 * every thread calls. */
template <int NT>
__device__ __forceinline__ bool cu_select_row_list(const float *scores, int32_t N, int32_t K,
                                                   int32_t I, int32_t Lc, int32_t *out,
                                                   uint32_t *keys, const cu_sel_grp &g)
{
    constexpr int PER = 1024 / NT; /* loads in flight per thread: one L2 round trip per 1024 */
    const int tid = threadIdx.x;
    const int32_t need = K - I - Lc, c_end = N - Lc;
    /* 1. keys, and this thread's largest candidate key (0, NaN's key: none). */
    uint32_t a = 0u;
    for (int32_t n0 = 0; n0 < N; n0 += 1024) {
        float v[PER];
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int32_t n = n0 + j * NT + tid;
            v[j] = n < N ? scores[n] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int32_t n = n0 + j * NT + tid;
            if (n < N) {
                const uint32_t k = cu_score_key(v[j]);
                keys[n] = k;
                if (n >= I && n < c_end)
                    a = max(a, k);
            }
        }
    }
    /* 2. T: the need-th largest of the CTA's NT values (need <= SEL_TOP:
     * from the warps' sorted values), else the largest of the warps'
     * need-th.  The tighter threshold keeps the list near `need` entries:
     * the list's fill and the ranks below cost a step per entry. */
    const int lane = tid & 31, warp = tid >> 5;
    constexpr int NW = NT / 32;
    /* CTA-uniform.  Rows of at most 2 * NT blocks keep the warps' largest
     * threshold: the merge's latency (about 400 cycles) is more than its
     * shorter list saves there (measured on the H200). */
    const bool top = need <= SEL_TOP && NW >= 2 && N > 2 * NT;
    const uint32_t sorted = cu_warp_bitonic<true>(a);
    if (top) {
        if (lane < SEL_TOP)
            g.tw[warp * SEL_TOP + lane] = sorted;
    } else {
        const uint32_t tw =
            __shfl_sync(0xffffffffu, sorted, need - 1); /* the whole warp: `top` is uniform */
        if (lane == 0)
            g.tw[warp * SEL_TOP] = tw;
    }
    if (tid == 0)
        *g.cnt = 0u;
    __syncthreads(); /* keys, thresholds and the counter visible */
    uint32_t T = 0u;
    if (top) {
        T = cu_sel_top_threshold < NW < 2 ? 2 : NW > (g.tw, need);
    } else {
#pragma unroll
        for (int w = 0; w < NW; ++w)
            T = max(T, g.tw[w * SEL_TOP]);
    }
    /* 3. The list, in any order. */
#pragma unroll 4
    for (int32_t n = I + tid; n < c_end; n += NT) {
        const uint32_t k = keys[n];
        if (k >= T) {
            const uint32_t p = atomicAdd(g.cnt, 1u);
            if (p < (uint32_t)g.cap)
                g.xs[p] = ((unsigned long long)k << 32) | (uint32_t)(0xffffffffu - (uint32_t)n);
        }
    }
    __syncthreads();
    const uint32_t count = *g.cnt;
    if (count > (uint32_t)g.cap)
        return false; /* uniform: every thread read the same count */
    /* 4. Ranks; winners by rank. */
    for (uint32_t i = tid; i < count; i += NT) {
        const unsigned long long x = g.xs[i];
        int32_t rk = 0;
#pragma unroll 4
        for (uint32_t j = 0; j < count; ++j)
            rk += g.xs[j] > x;
        if (rk < need)
            g.win[rk] = (int32_t)(0xffffffffu - (uint32_t)(x & 0xffffffffull));
    }
    __syncthreads();
    /* 5. Ascending ids. */
    for (int32_t i = tid; i < K; i += NT) {
        int32_t id, pos;
        if (i < need) {
            id = g.win[i];
            pos = I;
            for (int32_t j = 0; j < need; ++j)
                pos += g.win[j] < id;
        } else {
            const int32_t f = i - need;
            id = f < I ? f : c_end + (f - I);
            pos = f < I ? f : I + need + (f - I);
        }
        out[pos] = id;
    }
    __syncthreads();
    return true;
}

/* Copies n scores of a row from src to dst (shared), W loads in flight per
 * lane, then stores them. */
template <int W>
__device__ __forceinline__ void cu_stage_chunk(const float *src, int32_t n, float *dst)
{
    const int lane = threadIdx.x & 31;
    float v[W];
#pragma unroll
    for (int j = 0; j < W; ++j)
        v[j] = 32 * j + lane < n ? src[32 * j + lane] : 0.0f;
#pragma unroll
    for (int j = 0; j < W; ++j)
        if (32 * j + lane < n)
            dst[32 * j + lane] = v[j];
}

/* Copies a score row into this warp's shared memory, up to 32 loads in
 * flight per lane: the row sits in L2 (the indexer just wrote it), and one
 * load per loop iteration would pay an L2 round trip per 32 blocks (a 128K
 * context is one round).  Rows of at most 256 blocks (32K context) take 8
 * per lane: the predicated-off loads of a 32-wide pass were most of the
 * staging's 10% of the selection's instructions at 5K context
 * (per-instruction counts on the H200). */
__device__ __forceinline__ void cu_stage_scores(const float *scores, int32_t N, float *cache)
{
    for (int32_t n0 = 0; n0 < N;) {
        if (N - n0 > 256) {
            cu_stage_chunk<32>(scores + n0, N - n0, cache + n0);
            n0 += 1024;
        } else {
            cu_stage_chunk<8>(scores + n0, N - n0, cache + n0);
            n0 += 256;
        }
    }
    __syncwarp();
}

/* Writes min(K, N) ids ascending then -1 up to K into out[] (shared).
 * The five passes read the scores from `cache` (this warp's shared memory,
 * cache_cap floats) when they fit, else from global memory. */
__device__ __forceinline__ void cu_select_row(const float *scores, int32_t N, int32_t K, int32_t I,
                                              int32_t Lc, int32_t *out, uint32_t *hist,
                                              float *cache, int32_t cache_cap)
{
    const int lane = threadIdx.x & 31;
    const uint32_t below = (1u << lane) - 1u;
    if (N <= K) {
        for (int32_t j = lane; j < K; j += 32)
            out[j] = j < N ? j : -1;
        __syncwarp();
        return;
    }
    if (N <= cache_cap) {
        cu_stage_scores(scores, N, cache);
        scores = cache;
    }
    if (K - I - Lc <= SEL_SMALL && K <= 32) {
        cu_select_row_small(scores, N, K, I, Lc, out, (int32_t *)hist);
        return;
    }
    const int32_t c_begin = I, c_end = N - Lc; /* non-forced candidates */
    uint32_t prefix = 0u, mask = 0u;
    const int32_t need = K - I - Lc; /* blocks chosen by score */
    int32_t remaining = need;
    if (need > 0) {
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = lane; b < 256; b += 32)
                hist[b] = 0u;
            __syncwarp();
            for (int32_t b0 = c_begin; b0 < c_end; b0 += 32) {
                const int32_t n = b0 + lane;
                bool part = false;
                uint32_t digit = 0u;
                if (n < c_end) {
                    const uint32_t key = cu_score_key(scores[n]);
                    part = (key & mask) == prefix;
                    digit = (key >> shift) & 255u;
                }
                const uint32_t peers = __match_any_sync(0xffffffffu, part ? digit : 256u + lane);
                if (part && (__ffs(peers) - 1) == lane)
                    atomicAdd(&hist[digit], (uint32_t)__popc(peers));
            }
            __syncwarp();
            /* Lane owns bins [8*lane, 8*lane+8); find the bin where the count
             * of keys with a larger digit reaches `remaining`. */
            uint32_t local = 0u;
            for (int b = 0; b < 8; ++b)
                local += hist[lane * 8 + b];
            uint32_t incl = local; /* sum over lanes >= lane */
            for (int o = 1; o < 32; o <<= 1) {
                const uint32_t v = __shfl_down_sync(0xffffffffu, incl, o);
                if (lane + o < 32)
                    incl += v;
            }
            const uint32_t above = incl - local; /* keys in higher lanes' bins */
            const bool mine = above < (uint32_t)remaining && (uint32_t)remaining <= incl;
            const uint32_t who = __ballot_sync(0xffffffffu, mine);
            const int owner = __ffs(who) - 1;
            uint32_t sel_digit = 0u, sel_above = 0u;
            if (lane == owner) {
                uint32_t acc = above;
                for (int b = 7; b >= 0; --b) {
                    const uint32_t h = hist[lane * 8 + b];
                    if (acc + h >= (uint32_t)remaining) {
                        sel_digit = (uint32_t)(lane * 8 + b);
                        break;
                    }
                    acc += h;
                }
                sel_above = acc;
            }
            sel_digit = __shfl_sync(0xffffffffu, sel_digit, owner);
            sel_above = __shfl_sync(0xffffffffu, sel_above, owner);
            prefix |= sel_digit << shift;
            mask |= 255u << shift;
            remaining -= (int32_t)sel_above;
            __syncwarp();
        }
    }
    /* Emit in id order: forced, keys above the threshold, and the first
     * `remaining` keys equal to it. */
    const uint32_t thr = prefix;
    int32_t count = 0, eq_seen = 0;
    for (int32_t b0 = 0; b0 < N; b0 += 32) {
        const int32_t n = b0 + lane;
        bool sel = false, eq = false;
        if (n < N) {
            const bool forced = n < c_begin || n >= c_end;
            if (forced) {
                sel = true;
            } else if (need > 0) {
                const uint32_t key = cu_score_key(scores[n]);
                sel = key > thr;
                eq = key == thr;
            }
        }
        const uint32_t eq_b = __ballot_sync(0xffffffffu, eq);
        if (eq) {
            const int32_t rank = eq_seen + __popc(eq_b & below);
            sel = rank < remaining;
        }
        eq_seen += __popc(eq_b);
        const uint32_t sel_b = __ballot_sync(0xffffffffu, sel);
        if (sel)
            out[count + __popc(sel_b & below)] = n;
        count += __popc(sel_b);
    }
    for (int32_t j = count + lane; j < K; j += 32)
        out[j] = -1;
    __syncwarp();
}

/* One row, by the whole CTA (cta: NT = blockDim.x threads, every one
 * calls) or by one warp: for a CTA the list path when it applies, else the
 * lone-warp paths by the CTA's first warp.  hist, cache: that warp's
 * shared memory.  (A warp alone keeps the lone-warp paths: with a row per
 * warp, as at batch 32-128 with 8 tokens, the list path run by one warp
 * made the selection slower on the H200.)  The mode
 * is a run-time flag, not a template: the lone-warp paths are large, and
 * a second inlined copy made the whole kernel slower. */
template <int NT>
__device__ __forceinline__ void cu_select_row_by(bool cta, const float *scores, int32_t N,
                                                 int32_t K, int32_t I, int32_t Lc, int32_t *out,
                                                 uint32_t *hist, float *cache, int32_t cache_cap,
                                                 const cu_sel_grp &g)
{
    const int32_t need = K - I - Lc;
    if (cta && N > K && need >= 1 && need <= 32 && N <= cache_cap &&
        cu_select_row_list<NT>(scores, N, K, I, Lc, out, (uint32_t *)cache, g))
        return;
    if (!cta || threadIdx.x < 32)
        cu_select_row(scores, N, K, I, Lc, out, hist, cache, cache_cap);
    if (cta)
        __syncthreads();
}

/* Union of `nl` ascending lists (each K wide, -1 padded) into row[W]. */
__device__ __forceinline__ void cu_union_lists(const int32_t *lists, int nl, int32_t K, int32_t W,
                                               int32_t *row)
{
    const int lane = threadIdx.x & 31;
    int32_t ptr = 0;
    int32_t count = 0;
    for (;;) {
        int32_t v = INT32_MAX;
        if (lane < nl && ptr < K) {
            const int32_t x = lists[lane * K + ptr];
            if (x >= 0)
                v = x;
        }
        const int32_t m = cu_warp_min_int(v);
        if (m == INT32_MAX)
            break;
        if (lane == 0)
            row[count] = m;
        ++count;
        if (v == m)
            ++ptr;
    }
    __syncwarp();
    for (int32_t j = count + lane; j < W; j += 32)
        row[j] = -1;
    __syncwarp();
}

#endif /* MSA_CUDA_KERNELS_SELECT_SELECT_ROW_CUH */
