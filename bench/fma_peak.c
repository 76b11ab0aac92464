/*
 * bench/fma_peak.c: the machine's compute peaks (tools/peaks.c: F32 FMA in
 * AVX-512 and AVX2, and VDPBF16PS where the CPU has AVX512_BF16), with 1
 * thread and with one thread per CPU, the best of three: the ceilings the
 * engine's matmuls are measured against (docs/benchmarks.md). Whether all
 * threads give n times one thread's rate tells whether the CPUs are real
 * cores or hyperthreads of one core sharing its units. `gpt2d bench`
 * measures the same peaks beside its own figures.
 */
#include "peaks.h"

#include <stdio.h>
#include <unistd.h>

int main(void)
{
    static const struct {
        peak_kind kind;
        const char *name;
    } kinds[] = {{PEAK_FMA512, "avx512"}, {PEAK_FMA256, "avx2"}, {PEAK_DPBF16, "avx512_bf16_dot"}};
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    size_t n = ncpu > 0 && ncpu <= 64 ? (size_t)ncpu : 1;
    printf("{\"cpus\": %zu", n);
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        double one = peak_rate(kinds[i].kind, 1, 3);
        if (one == 0) continue; /* the CPU lacks it */
        printf(", \"%s_gflops_1_thread\": %.1f, \"%s_gflops_%zu_threads\": %.1f", kinds[i].name,
               one, kinds[i].name, n, peak_rate(kinds[i].kind, n, 3));
    }
    printf("}\n");
    return 0;
}
