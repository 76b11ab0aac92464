/*
 * bench/fma_peak.c: the machine's compute peaks (tools/peaks.c: F32 FMA in
 * AVX-512 and AVX2, VDPBF16PS where the CPU has AVX512_BF16 and VPDPBUSD,
 * in giga int8 operations a second, where it has AVX512_VNNI), with 1
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
        const char *name, *unit;
    } kinds[] = {{PEAK_FMA512, "avx512", "gflops"},
                 {PEAK_FMA256, "avx2", "gflops"},
                 {PEAK_DPBF16, "avx512_bf16_dot", "gflops"},
                 {PEAK_DPBUSD, "avx512_vnni_dot", "gops"}};
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    size_t n = ncpu > 0 && ncpu <= 64 ? (size_t)ncpu : 1;
    printf("{\"cpus\": %zu", n);
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        double one = peak_rate(kinds[i].kind, 1, 3);
        if (one == 0) continue; /* the CPU lacks it */
        printf(", \"%s_%s_1_thread\": %.1f, \"%s_%s_%zu_threads\": %.1f", kinds[i].name,
               kinds[i].unit, one, kinds[i].name, kinds[i].unit, n, peak_rate(kinds[i].kind, n, 3));
    }
    printf("}\n");
    return 0;
}
