/*
 * bench/fma_peak.c [SECONDS]: the machine's peak single-precision FMA rate,
 * with 1 thread and with one thread per CPU, in AVX-512 (when the CPU has
 * it) and AVX2. Twelve independent accumulators per thread hide the FMA
 * latency, and nothing touches memory, so this is the ceiling the engine's
 * matmuls are measured against (docs/benchmarks.md). Whether two threads
 * double the rate tells whether the CPUs are real cores or hyperthreads of
 * one core sharing its FMA units.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#define ITERS 20000000L

__attribute__((target("avx512f"))) static float run512(float seed)
{
    __m512 a[12], m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps(seed + (float)i);
    for (long it = 0; it < ITERS; it++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], m, c);
    __m512 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float run256(float seed)
{
    __m256 a[12], m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps(seed + (float)i);
    for (long it = 0; it < ITERS; it++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], m, c);
    __m256 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, a[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[7];
}

typedef struct {
    int wide;
    float result;
} job;

static void *worker(void *p)
{
    job *j = p;
    j->result = j->wide ? run512(1.0f) : run256(1.0f);
    return NULL;
}

/* GFLOP/s with n threads (2 flops per lane per FMA). */
static double rate(int n, int wide)
{
    pthread_t t[64];
    job j[64];
    double t0 = now();
    for (int i = 0; i < n; i++) {
        j[i].wide = wide;
        pthread_create(&t[i], NULL, worker, &j[i]);
    }
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    double dt = now() - t0;
    volatile float sink = j[0].result;
    (void)sink;
    return (double)n * ITERS * 12 * (wide ? 16 : 8) * 2 / dt / 1e9;
}

int main(void)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int n = ncpu > 0 && ncpu <= 64 ? (int)ncpu : 1;
    __builtin_cpu_init();
    int has512 = __builtin_cpu_supports("avx512f") != 0;
    printf("{\"cpus\": %d", n);
    for (int wide = has512; wide >= 0; wide--) {
        double r1[3], rn[3];
        for (int k = 0; k < 3; k++) {
            r1[k] = rate(1, wide);
            rn[k] = rate(n, wide);
        }
        /* the best of three: interference only ever lowers a peak */
        double b1 = r1[0], bn = rn[0];
        for (int k = 1; k < 3; k++) {
            if (r1[k] > b1) b1 = r1[k];
            if (rn[k] > bn) bn = rn[k];
        }
        printf(", \"%s_gflops_1_thread\": %.1f, \"%s_gflops_%d_threads\": %.1f",
               wide ? "avx512" : "avx2", b1, wide ? "avx512" : "avx2", n, bn);
    }
    printf("}\n");
    return 0;
}
