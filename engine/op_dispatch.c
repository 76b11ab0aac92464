/*
 * engine/op_dispatch.c: which kernels run. Every kernel family has a
 * portable C reference and AVX2 and AVX-512 versions that give the same
 * bits (see kernels.h); this file only says which of them this CPU may run.
 *
 * GPT2D_KERNELS=portable or =avx2 caps the instruction set, for the tests
 * that compare the paths bit for bit and for benchmarks. The answer is
 * cached in two relaxed atomics: every thread that races to fill one
 * computes the same value.
 */
#include "engine.h"
#include "kernels.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if HAVE_X86
#include <cpuid.h>

static int kernels_allow(const char *level)
{
    const char *v = getenv("GPT2D_KERNELS");
    if (v == NULL || *v == '\0') return 1;
    if (strcmp(v, "portable") == 0) return 0;
    return strcmp(v, "avx2") != 0 || strcmp(level, "avx2") == 0;
}

/* F16C from CPUID (leaf 1, ECX bit 29): clang 14's __builtin_cpu_supports
 * does not know "f16c". */
static int have_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

static int probe_avx2(void)
{
    return kernels_allow("avx2") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
           && have_f16c();
}

/* AVX-512 tiles fall back to AVX2 code for their tails, so they need it. */
static int probe_avx512(void)
{
    return kernels_allow("avx512") && probe_avx2() && __builtin_cpu_supports("avx512f");
}

static int cached(atomic_int *cache, int (*probe)(void))
{
    int v = atomic_load_explicit(cache, memory_order_relaxed);
    if (v < 0) {
        v = probe();
        atomic_store_explicit(cache, v, memory_order_relaxed);
    }
    return v;
}

static int probe_avx512bw(void)
{
    return probe_avx512() && __builtin_cpu_supports("avx512bw");
}

static atomic_int have_avx512 = -1, have_avx2 = -1, have_avx512bw = -1;

int op_use_avx512bw(void)
{
    return cached(&have_avx512bw, probe_avx512bw);
}

int op_use_avx512(void)
{
    return cached(&have_avx512, probe_avx512);
}

int op_use_avx2(void)
{
    return cached(&have_avx2, probe_avx2);
}
#else
int op_use_avx512(void)
{
    return 0;
}

int op_use_avx512bw(void)
{
    return 0;
}

int op_use_avx2(void)
{
    return 0;
}
#endif

const char *eng_kernels(void)
{
    return op_use_avx512() ? "avx512" : op_use_avx2() ? "avx2" : "portable";
}
