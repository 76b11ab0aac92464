/* tools/rng.c: xoshiro256** (Blackman and Vigna), seeded with splitmix64. */
#include "tools.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void tool_rng_seed(tool_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

uint64_t tool_rng_next(tool_rng *r)
{
    uint64_t *s = r->s;
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

double tool_rng_uniform(tool_rng *r)
{
    return (double)(tool_rng_next(r) >> 11) * 0x1.0p-53;
}

double tool_rng_normal(tool_rng *r)
{
    double u1 = tool_rng_uniform(r);
    double u2 = tool_rng_uniform(r);
    /* 1 - u1 is in (0, 1], so the log is finite. */
    return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
}
