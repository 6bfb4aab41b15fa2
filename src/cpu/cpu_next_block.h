/* The next selected block's K and V rows, prefetched while the decode
 * attention computes the current one: the stream the score passes of
 * cpu_decode_rows.h and cpu_bf16.h advance.  No instruction-set
 * dependence (__builtin_prefetch). */
#ifndef MSA_CPU_NEXT_BLOCK_H
#define MSA_CPU_NEXT_BLOCK_H

#include <stdint.h>

/* The K and V rows of the tile after this one, each a contiguous run of
 * memory (packed rows within one page): their lines are prefetched a few
 * at a time between the multiply-adds of the score passes
 * (dr_scores_heads, msa_scores8_pass_bf16), so that the memory streams
 * them while this tile computes.  Issued all at once, the
 * 64 KB of a tile's prefetches fill the core's miss buffers and stall it
 * until most lines arrive, which serialises the loads and the arithmetic;
 * the hardware prefetchers do not jump to the next selected block, and
 * touching one line in four and leaving the rest to them measured slower
 * (1.07 against 0.84 ms for the attention of a 32K step, one thread). */
typedef struct dr_next {
    const char *k, *v;
    int64_t left; /* bytes of each not yet prefetched */
} dr_next;

/* Prefetches the next line of K and of V into the second-level cache. */
static inline void dr_next_line(dr_next *nx)
{
    if (nx->left > 0) {
        __builtin_prefetch(nx->k, 0, 2);
        __builtin_prefetch(nx->v, 0, 2);
        nx->k += 64;
        nx->v += 64;
        nx->left -= 64;
    }
}

/* Prefetches the next n bytes of K and of V (all that is left: n < 0). */
static inline void dr_next_bytes(dr_next *nx, int64_t n)
{
    const int64_t end = n < 0 || n > nx->left ? nx->left : n;
    if (end <= 0) /* nothing left (k and v may then be NULL) */
        return;
    for (int64_t b = 0; b < end; b += 64) {
        __builtin_prefetch(nx->k + b, 0, 2);
        __builtin_prefetch(nx->v + b, 0, 2);
    }
    nx->k += end;
    nx->v += end;
    nx->left -= end;
}

#endif
