/*
 * tools/peaks.c: register-only loops, 12 independent accumulators a thread
 * (the latency hidden, no memory touched): the ceilings the engine's
 * figures are given as fractions of. Whether n threads give n times one
 * thread's rate tells whether the CPUs are cores or hyperthreads sharing
 * one core's units.
 */
#include "peaks.h"

#include <pthread.h>
#include <time.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#define PEAK_ITERS 4000000L

typedef struct {
    peak_kind kind;
    float sink;
} peak_arg;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#if defined(__x86_64__)
/* Twelve accumulators of type vec, each updated by step (a[i] in it) per
 * iteration, then summed into s: one body for every kind, the instruction
 * alone differing. */
#define PEAK_LOOP(vec, set1, add, step)                                                            \
    vec a[12];                                                                                     \
    for (int i = 0; i < 12; i++) a[i] = set1((float)i);                                            \
    for (long it = 0; it < PEAK_ITERS; it++) {                                                     \
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = step;                         \
    }                                                                                              \
    vec s = a[0];                                                                                  \
    for (int i = 1; i < 12; i++) s = add(s, a[i])

__attribute__((target("avx512f"))) static float loop_fma512(void)
{
    __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    PEAK_LOOP(__m512, _mm512_set1_ps, _mm512_add_ps, _mm512_fmadd_ps(a[i], m, c));
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float loop_fma256(void)
{
    __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    PEAK_LOOP(__m256, _mm256_set1_ps, _mm256_add_ps, _mm256_fmadd_ps(a[i], m, c));
    float v[8];
    _mm256_storeu_ps(v, s);
    return v[0] + v[7];
}

__attribute__((target("avx512f,avx512bf16"))) static float loop_dpbf16(void)
{
    __m512bh x = (__m512bh)_mm512_set1_epi32(0x3F803F80),
             y = (__m512bh)_mm512_set1_epi32(0x33803380);
    PEAK_LOOP(__m512, _mm512_set1_ps, _mm512_add_ps, _mm512_dpbf16_ps(a[i], x, y));
    return _mm512_reduce_add_ps(s);
}

/* The integer peak: the accumulators are int32 lanes, each gaining 4 a
 * step (four products of 1 x 1): 16 M after PEAK_ITERS, 192 M summed over
 * the twelve, so one lane of the sum is returned (the sixteen lanes' total
 * would overflow an int). */
#define PEAK_SET1_EPI32(f) _mm512_set1_epi32((int)(f))
__attribute__((target("avx512f,avx512vnni"))) static float loop_dpbusd(void)
{
    __m512i x = _mm512_set1_epi8(1), y = _mm512_set1_epi8(1);
    PEAK_LOOP(__m512i, PEAK_SET1_EPI32, _mm512_add_epi32, _mm512_dpbusd_epi32(a[i], x, y));
    return (float)_mm_cvtsi128_si32(_mm512_castsi512_si128(s));
}

static int cpu_has(peak_kind kind)
{
    unsigned a, b, c, d;
    switch (kind) {
    case PEAK_FMA512: return __builtin_cpu_supports("avx512f");
    case PEAK_FMA256: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case PEAK_DPBF16:
        return __builtin_cpu_supports("avx512f") && __get_cpuid_count(7, 1, &a, &b, &c, &d)
               && (a & (1u << 5)) != 0;
    case PEAK_DPBUSD:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni");
    }
    return 0;
}
#endif

static void *peak_run(void *arg)
{
    peak_arg *a = arg;
#if defined(__x86_64__)
    switch (a->kind) {
    case PEAK_FMA512: a->sink = loop_fma512(); break;
    case PEAK_FMA256: a->sink = loop_fma256(); break;
    case PEAK_DPBF16: a->sink = loop_dpbf16(); break;
    case PEAK_DPBUSD: a->sink = loop_dpbusd(); break;
    }
#endif
    return NULL;
}

double peak_rate(peak_kind kind, size_t nthreads, int passes)
{
#if defined(__x86_64__)
    if (!cpu_has(kind)) return 0;
    pthread_t th[64];
    peak_arg args[64];
    if (nthreads == 0) nthreads = 1;
    if (nthreads > 64) nthreads = 64;
    static const double flop[] = {
        [PEAK_FMA512] = 32, [PEAK_FMA256] = 16, [PEAK_DPBF16] = 64, [PEAK_DPBUSD] = 128};
    double best = 0;
    for (int pass = 0; pass < passes; pass++) {
        double t0 = now_s();
        size_t started = 0;
        for (size_t k = 0; k < nthreads; k++) {
            args[k] = (peak_arg){kind, 0};
            if (pthread_create(&th[k], NULL, peak_run, &args[k]) != 0) break;
            started++;
        }
        for (size_t k = 0; k < started; k++) pthread_join(th[k], NULL);
        if (started == 0) return 0;
        double g = flop[kind] * 12.0 * PEAK_ITERS * (double)started / (now_s() - t0) / 1e9;
        if (g > best) best = g;
    }
    return best;
#else
    (void)kind;
    (void)nthreads;
    (void)passes;
    return 0;
#endif
}
