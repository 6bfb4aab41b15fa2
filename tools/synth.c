#include "synth.h"

#include <math.h>

/* splitmix64 spreads one seed over the four state words, as the xoshiro
 * authors recommend (an all-zero state would never leave zero). */
static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void synth_seed(synth_rng *rng, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t synth_next(synth_rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double synth_uniform(synth_rng *rng)
{
    return (double)(synth_next(rng) >> 11) * 0x1p-53;
}

uint64_t synth_below(synth_rng *rng, uint64_t n)
{
    /* Rejection keeps the result unbiased for any n. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do {
        r = synth_next(rng);
    } while (r >= limit);
    return r % n;
}

double synth_normal(synth_rng *rng)
{
    double u1 = 1.0 - synth_uniform(rng); /* (0, 1]: log stays finite */
    double u2 = synth_uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void synth_fill_normal(synth_rng *rng, float *x, int64_t n, float sigma)
{
    /* Both Box-Muller outputs are used: bulk fills of hundreds of MB for the
     * benchmarks are dominated by the transcendental calls. */
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
        double u1 = 1.0 - synth_uniform(rng);
        double u2 = synth_uniform(rng);
        double r = sqrt(-2.0 * log(u1)) * sigma;
        double a = 6.283185307179586 * u2;
        x[i] = (float)(r * cos(a));
        x[i + 1] = (float)(r * sin(a));
    }
    if (i < n)
        x[i] = (float)(synth_normal(rng) * sigma);
}

void synth_fill_uniform(synth_rng *rng, float *x, int64_t n, float sigma)
{
    const float a = sigma * 1.7320508f;
    int64_t i = 0;
    /* Two 24-bit draws per 64-bit output. */
    for (; i + 1 < n; i += 2) {
        uint64_t r = synth_next(rng);
        x[i] = a * ((float)(r >> 40) * 0x1p-23f - 1.0f);
        x[i + 1] = a * ((float)((r >> 8) & 0xffffffu) * 0x1p-23f - 1.0f);
    }
    if (i < n)
        x[i] = a * ((float)(synth_next(rng) >> 40) * 0x1p-23f - 1.0f);
}
