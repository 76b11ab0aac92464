/*
 * bench/bench_dnnl_shared.c: the clocks and the generated data both sides
 * of bench_dnnl use (bench_dnnl_shared.h).
 */
#include "bench_dnnl_shared.h"

#include <math.h>
#include <time.h>

/* ---- Data ---------------------------------------------------------------- */

float bd_unit(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return (float)(*seed >> 9) / (float)(1u << 22) - 1.0f; /* [-1, 1) */
}

void gen_plain(float *w, const bd_shape *s, size_t c)
{
    unsigned seed = 1000u + 17u * (unsigned)c + (unsigned)s->K + 3u * (unsigned)s->N;
    float scale = 1.0f / sqrtf((float)s->K);
    for (size_t i = 0; i < s->K * s->N; i++) w[i] = bd_unit(&seed) * scale;
}

void to_bf16(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = op_f32_to_bf16_dp(src[i]);
}

/* ---- Clocks ---------------------------------------------------------------- */

bd_time bd_now(void)
{
    struct timespec w, c;
    clock_gettime(CLOCK_MONOTONIC, &w);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c);
    return (bd_time){(double)w.tv_sec + (double)w.tv_nsec / 1e9,
                     (double)c.tv_sec + (double)c.tv_nsec / 1e9};
}

bd_time bd_since(bd_time t0)
{
    bd_time t1 = bd_now();
    return (bd_time){t1.wall - t0.wall, t1.cpu - t0.cpu};
}
