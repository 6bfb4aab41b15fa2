/*
 * Seeded synthetic data: a small, fast, portable PRNG so the demo and the
 * benchmarks produce the same tensors on every machine and every run.
 */
#ifndef MSA_TOOLS_SYNTH_H
#define MSA_TOOLS_SYNTH_H

#include <stdint.h>

typedef struct synth_rng {
    uint64_t s[4]; /* xoshiro256** state */
} synth_rng;

void synth_seed(synth_rng *rng, uint64_t seed);
uint64_t synth_next(synth_rng *rng);
/* Uniform in [0, 1). */
double synth_uniform(synth_rng *rng);
/* Uniform integer in [0, n), n > 0. */
uint64_t synth_below(synth_rng *rng, uint64_t n);
/* Standard normal (Box-Muller). */
double synth_normal(synth_rng *rng);
/* n normal values with standard deviation `sigma`. */
void synth_fill_normal(synth_rng *rng, float *x, int64_t n, float sigma);

/* n values uniform in [-sigma*sqrt(3), sigma*sqrt(3)] (standard deviation
 * sigma): an order of magnitude cheaper than normals, for bulk tensors. */
void synth_fill_uniform(synth_rng *rng, float *x, int64_t n, float sigma);

#endif
