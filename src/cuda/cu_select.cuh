/*
 * Exact top-k selection of one (token, index head) row, by one warp (SPEC 4).
 *
 * Forced blocks (init, local) are always in; among the other reachable
 * blocks the (K - forced) best by score, ties toward the lower id, NaN below
 * every number.  Four 8-bit histogram passes over order-preserving 32-bit
 * keys find the threshold value; one ballot pass in id order then emits the
 * chosen ids already ascending, taking the lowest ids among keys equal to
 * the threshold.  Deterministic, no sort, no data-dependent memory.
 */
#ifndef MSA_CU_SELECT_CUH
#define MSA_CU_SELECT_CUH

#include "cu_plan.cuh"

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

/* Selection when at most CU_SEL_SMALL blocks are chosen by score and K <= 32
 * (M3: 15 and 16).  One pass: each lane keeps the best CU_SEL_SMALL of its
 * strided candidates in registers, as keys (score key << 32 | ~id) that are
 * all distinct and order exactly as SPEC 4 ranks (ties to the lower id);
 * then `need` rounds of a warp maximum pop the winners.  The K ids (chosen
 * and forced) sit one per lane and are ranked into ascending order.  About
 * a tenth of the radix passes' time at a few thousand blocks.
 *
 * The insertion is a serial chain per candidate, so the candidates are first
 * filtered: each lane keeps its two largest score keys, and with T the
 * need-th largest of those 64 values at least `need` candidates have a key
 * >= T, so every winner does too.  Only those (usually need plus a few)
 * enter the list; when more than CU_SEL_LIST pass the filter (many equal
 * scores), all candidates do.  When at most 32 pass, each lane ranks one of
 * them against the others instead (independent shuffles in place of the
 * `need` dependent maximum rounds).  (With a lane's maximum alone, 32
 * values, more than 32 candidates passed on the benchmark's 1024-block
 * rows, and the rounds took most of the selection's instructions.) */
#define CU_SEL_SMALL 16
#define CU_SEL_LIST 256

/* Unrolling of a row's fixed 32-step shuffle loops (the threshold, the
 * candidates' rank, the final order).  Fully unrolled they are about 1200
 * straight-line instructions that a row's lone warp runs once each (bench/
 * RESULTS.md, v13: the selection's row work); MSA_SEL_UNROLL=4 at build
 * time keeps them rolled, for measuring whether that pays. */
#ifndef MSA_SEL_UNROLL
#define MSA_SEL_UNROLL 32
#endif
static constexpr int cu_sel_unroll = MSA_SEL_UNROLL; /* pragmas see no macros */

/* Candidates [I, c_end) whose score key is >= the need-th largest of the
 * lanes' two largest keys, ascending, into list[] (CU_SEL_LIST entries);
 * returns how many passed (more than CU_SEL_LIST: the list is incomplete,
 * do not use it).  need <= 64. */
__device__ __forceinline__ int32_t cu_select_prefilter(const float *scores, int32_t I, int32_t c_end,
                                                       int32_t need, int32_t *list)
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
    /* T = the need-th largest of the 64 values: fewer than `need` above it,
     * at least `need` at or above it (independent shuffles, no chain). */
    int32_t gta = 0, gea = 0, gtb = 0, geb = 0;
#pragma unroll cu_sel_unroll
    for (int j = 0; j < 32; ++j) {
        const uint32_t ya = __shfl_sync(0xffffffffu, a, j);
        const uint32_t yb = __shfl_sync(0xffffffffu, b, j);
        gta += (ya > a) + (yb > a);
        gea += (ya >= a) + (yb >= a);
        gtb += (ya > b) + (yb > b);
        geb += (ya >= b) + (yb >= b);
    }
    const uint32_t hit_a = __ballot_sync(0xffffffffu, gta < need && need <= gea);
    const uint32_t hit_b = __ballot_sync(0xffffffffu, gtb < need && need <= geb);
    const uint32_t T = hit_a ? __shfl_sync(0xffffffffu, a, __ffs(hit_a) - 1)
                             : __shfl_sync(0xffffffffu, b, __ffs(hit_b) - 1);
    int32_t count = 0;
    for (int32_t b0 = I; b0 < c_end; b0 += 32) {
        const int32_t n = b0 + lane;
        const bool pass = n < c_end && cu_score_key(scores[n]) >= T;
        const uint32_t bal = __ballot_sync(0xffffffffu, pass);
        const int32_t pos = count + __popc(bal & below);
        if (pass && pos < CU_SEL_LIST)
            list[pos] = n;
        count += __popc(bal);
    }
    __syncwarp();
    return count;
}

__device__ __forceinline__ void cu_select_row_small(const float *scores, int32_t N, int32_t K,
                                                    int32_t I, int32_t Lc, int32_t *out, int32_t *list)
{
    const int lane = threadIdx.x & 31;
    const int32_t need = K - I - Lc;
    const int32_t c_end = N - Lc;
    int32_t i_begin = I + lane, i_end = c_end;
    const int32_t *ids = NULL; /* candidate i is block ids[i] (or i itself) */
    int32_t mine = INT32_MAX;
    bool ranked = false; /* warp-uniform: the winners are already in `mine` */
    if (need > 0) {
        const int32_t count = cu_select_prefilter(scores, I, c_end, need, list);
        if (count <= 32) {
            /* One candidate per lane: its rank among them picks it. */
            unsigned long long x = 0ull;
            if (lane < count) {
                const int32_t n = list[lane];
                x = ((unsigned long long)cu_score_key(scores[n]) << 32) |
                    (uint32_t)(0xffffffffu - (uint32_t)n);
            }
            int32_t rk = 0;
#pragma unroll cu_sel_unroll
            for (int j = 0; j < 32; ++j)
                rk += __shfl_sync(0xffffffffu, x, j) > x;
            if (lane < count && rk < need)
                out[rk] = (int32_t)(0xffffffffu - (uint32_t)(x & 0xffffffffull));
            __syncwarp();
            if (lane < need)
                mine = out[lane];
            __syncwarp();
            ranked = true;
        } else if (count <= CU_SEL_LIST) {
            i_begin = lane;
            i_end = count;
            ids = list;
        }
    }
    unsigned long long t[CU_SEL_SMALL];
#pragma unroll
    for (int i = 0; i < CU_SEL_SMALL; ++i)
        t[i] = 0ull; /* below every candidate (their low word is never 0) */
    for (int32_t i = i_begin; !ranked && i < i_end; i += 32) {
        const int32_t n = ids ? ids[i] : i;
        const unsigned long long x =
            ((unsigned long long)cu_score_key(scores[n]) << 32) | (uint32_t)(0xffffffffu - (uint32_t)n);
        if (x > t[CU_SEL_SMALL - 1]) {
            /* Insert into the descending list; computed from the old values. */
#pragma unroll
            for (int i = CU_SEL_SMALL - 1; i > 0; --i)
                t[i] = t[i] > x ? t[i] : (t[i - 1] > x ? x : t[i - 1]);
            t[0] = t[0] > x ? t[0] : x;
        }
    }
    for (int32_t r = 0; !ranked && r < need; ++r) {
        unsigned long long m = t[0];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const unsigned long long y = __shfl_xor_sync(0xffffffffu, m, o);
            m = y > m ? y : m;
        }
        if (t[0] == m) { /* keys are distinct: exactly one lane */
#pragma unroll
            for (int i = 0; i < CU_SEL_SMALL - 1; ++i)
                t[i] = t[i + 1];
            t[CU_SEL_SMALL - 1] = 0ull;
        }
        if (lane == r)
            mine = (int32_t)(0xffffffffu - (uint32_t)(m & 0xffffffffull));
    }
    /* Forced blocks on lanes need .. K-1: init blocks, then the local ones. */
    const int32_t f = lane - need;
    if (f >= 0 && lane < K)
        mine = f < I ? f : (N - Lc) + (f - I);
    /* Rank among the K ids (distinct) = number of smaller ones. */
    int32_t rank = 0;
#pragma unroll cu_sel_unroll
    for (int j = 0; j < 32; ++j) {
        const int32_t y = __shfl_sync(0xffffffffu, mine, j);
        rank += y < mine;
    }
    if (lane < K)
        out[rank] = mine;
    __syncwarp();
}

/* Scores n0 + lane + 32 j of a row (0 past N), j < 32: 32 loads in
 * flight per lane. */
__device__ __forceinline__ void cu_load_row_chunk(const float *scores, int32_t N, int32_t n0,
                                                  float (&v)[32])
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
        const int32_t n = n0 + 32 * j + lane;
        v[j] = n < N ? scores[n] : 0.0f;
    }
}

#ifndef MSA_SEL_FAST
#define MSA_SEL_FAST 0
#endif
#if MSA_SEL_FAST
/* Build-time alternative of the small path for rows that fit in the
 * warp's shared memory (MSA_SEL_FAST=1; not yet measured or run on a GPU):
 * fewer instructions per row for the lone warp that runs it (bench/
 * RESULTS.md, v13).  The same result as cu_select_row_small:
 *   - the staging computes each score's key once, keeps the keys (not the
 *     scores) and each lane's two largest candidate keys on the way;
 *   - the threshold comes from a bitonic sort of those 64 values (20
 *     shuffle rounds instead of 32 rounds of all-pairs counting); any
 *     value at or below the need-th largest candidate key is a valid
 *     filter, so the lane partition does not change the result;
 *   - the filter pass and the ranking read the kept keys.
 * Its ranking and placement repeat cu_select_row_small's on purpose: the
 * default build keeps the measured code byte for byte; if this path pays,
 * it replaces that one. */

/* The need-th largest (1 <= need <= 64) of the 64 values x0 (element
 * lane) and x1 (element lane + 32): bitonic sort, ascending by element. */
__device__ __forceinline__ uint32_t cu_sel_kth_of_64(uint32_t x0, uint32_t x1, int32_t need)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 2; k <= 64; k <<= 1) {
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1) {
            if (j == 32) { /* elements lane and lane + 32, one ascending run */
                const uint32_t lo = min(x0, x1);
                x1 = max(x0, x1);
                x0 = lo;
                continue;
            }
            const uint32_t y0 = __shfl_xor_sync(0xffffffffu, x0, j);
            const uint32_t y1 = __shfl_xor_sync(0xffffffffu, x1, j);
            /* The lower element of a pair keeps the min in an ascending
             * run (bit k of the element clear), the upper one the max. */
            const bool lower = (lane & j) == 0;
            const bool up0 = (lane & k) == 0;
            const bool up1 = ((lane + 32) & k) == 0;
            x0 = lower == up0 ? min(x0, y0) : max(x0, y0);
            x1 = lower == up1 ? min(x1, y1) : max(x1, y1);
        }
    }
    const int32_t e = 64 - need;
    return __shfl_sync(0xffffffffu, e < 32 ? x0 : x1, e & 31);
}

/* Returns false, with nothing written, when more than 32 candidates pass
 * the filter (many equal keys): the caller then takes the general path. */
__device__ __forceinline__ bool cu_select_row_keys(const float *scores, int32_t N, int32_t K,
                                                   int32_t I, int32_t Lc, int32_t *out,
                                                   int32_t *list, uint32_t *keys)
{
    const int lane = threadIdx.x & 31;
    const uint32_t below = (1u << lane) - 1u;
    const int32_t need = K - I - Lc;
    const int32_t c_end = N - Lc;
    uint32_t a = 0u, b = 0u; /* this lane's two largest candidate keys (0: absent) */
    for (int32_t n0 = 0; n0 < N; n0 += 1024) {
        float v[32];
        cu_load_row_chunk(scores, N, n0, v);
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            const int32_t n = n0 + 32 * j + lane;
            if (n < N) {
                const uint32_t k = cu_score_key(v[j]);
                keys[n] = k;
                if (n >= I && n < c_end) {
                    b = max(b, min(a, k));
                    a = max(a, k);
                }
            }
        }
    }
    const uint32_t T = cu_sel_kth_of_64(a, b, need);
    __syncwarp();
    int32_t count = 0;
#pragma unroll 4
    for (int32_t b0 = I; b0 < c_end; b0 += 32) {
        const int32_t n = b0 + lane;
        const bool pass = n < c_end && keys[n] >= T;
        const uint32_t bal = __ballot_sync(0xffffffffu, pass);
        const int32_t pos = count + __popc(bal & below);
        if (pass && pos < 32)
            list[pos] = n;
        count += __popc(bal);
    }
    __syncwarp();
    if (count > 32)
        return false;
    /* One candidate per lane: its rank among them picks it. */
    unsigned long long x = 0ull;
    if (lane < count) {
        const int32_t n = list[lane];
        x = ((unsigned long long)keys[n] << 32) | (uint32_t)(0xffffffffu - (uint32_t)n);
    }
    int32_t rk = 0;
#pragma unroll cu_sel_unroll
    for (int j = 0; j < 32; ++j)
        rk += __shfl_sync(0xffffffffu, x, j) > x;
    /* Winner r to lane r, through out[] (overwritten below). */
    if (lane < count && rk < need)
        out[rk] = (int32_t)(0xffffffffu - (uint32_t)(x & 0xffffffffull));
    __syncwarp();
    int32_t mine = lane < need ? out[lane] : INT32_MAX;
    __syncwarp();
    /* Forced blocks on lanes need .. K-1: init blocks, then the local ones. */
    const int32_t f = lane - need;
    if (f >= 0 && lane < K)
        mine = f < I ? f : (N - Lc) + (f - I);
    /* Rank among the K ids (distinct) = number of smaller ones. */
    int32_t rank = 0;
#pragma unroll cu_sel_unroll
    for (int j = 0; j < 32; ++j)
        rank += __shfl_sync(0xffffffffu, mine, j) < mine;
    if (lane < K)
        out[rank] = mine;
    __syncwarp();
    return true;
}
#endif /* MSA_SEL_FAST */

/* Copies a score row into this warp's shared memory, 32 loads in flight
 * per lane: the row sits in L2 (the indexer just wrote it), and one load per
 * loop iteration would pay an L2 round trip per 32 blocks (a 128K context
 * is one round). */
__device__ __forceinline__ void cu_stage_scores(const float *scores, int32_t N, float *cache)
{
    const int lane = threadIdx.x & 31;
    for (int32_t n0 = 0; n0 < N; n0 += 1024) {
        float v[32];
        cu_load_row_chunk(scores, N, n0, v);
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            const int32_t n = n0 + 32 * j + lane;
            if (n < N)
                cache[n] = v[j];
        }
    }
    __syncwarp();
}

/* Writes min(K, N) ids ascending then -1 up to K into out[] (shared).
 * The five passes read the scores from `cache` (this warp's shared memory,
 * cache_cap floats) when they fit, else from global memory. */
__device__ __forceinline__ void cu_select_row(const float *scores, int32_t N, int32_t K, int32_t I,
                                              int32_t Lc, int32_t *out, uint32_t *hist, float *cache,
                                              int32_t cache_cap)
{
    const int lane = threadIdx.x & 31;
    const uint32_t below = (1u << lane) - 1u;
    if (N <= K) {
        for (int32_t j = lane; j < K; j += 32)
            out[j] = j < N ? j : -1;
        __syncwarp();
        return;
    }
#if MSA_SEL_FAST
    if (N <= cache_cap && K - I - Lc > 0 && K - I - Lc <= CU_SEL_SMALL && K <= 32 &&
        cu_select_row_keys(scores, N, K, I, Lc, out, (int32_t *)hist, (uint32_t *)cache))
        return;
#endif
    if (N <= cache_cap) {
        cu_stage_scores(scores, N, cache);
        scores = cache;
    }
    if (K - I - Lc <= CU_SEL_SMALL && K <= 32) {
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

/* Union of `nl` ascending lists (each K wide, -1 padded) into row[W]. */
__device__ __forceinline__ void cu_union_lists(const int32_t *lists, int nl, int32_t K, int32_t W, int32_t *row)
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

#endif /* MSA_CU_SELECT_CUH */
