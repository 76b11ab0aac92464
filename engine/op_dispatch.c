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

/* The levels from lowest to highest; GPT2D_KERNELS names the highest that
 * may run (an unknown name caps nothing). The two matrix-unit levels are
 * for one format each (Q8 on VNNI, BF16 on VDPBF16PS); as a cap,
 * "avx512" turns both off and "avx512-vnni" keeps Q8 on VNNI with BF16
 * widened. */
static const char *const levels[] = {"portable", "avx2", "avx512", "avx512-vnni", "avx512-bf16"};

static int level_rank(const char *v)
{
    for (int i = 0; i < (int)(sizeof levels / sizeof levels[0]); i++)
        if (strcmp(v, levels[i]) == 0) return i;
    return (int)(sizeof levels / sizeof levels[0]);
}

/* Without GPT2D_KERNELS every level the CPU has may run, "avx512-vnni"
 * and "avx512-bf16" included: Q8 and BF16 projections read their quad and
 * pair copies (op_matmul_q8.c, op_matmul_bf16.c) and are faster than the
 * widening kernels at every row count measured, one row included
 * (docs/benchmarks.md, "The matrix units"). GPT2D_KERNELS=avx512 gives
 * the widening kernels (and the file's pages) back. */
#define DEFAULT_LEVEL "avx512-bf16"

static int kernels_allow(const char *level)
{
    const char *v = getenv("GPT2D_KERNELS");
    if (v == NULL || *v == '\0') v = DEFAULT_LEVEL;
    return level_rank(level) <= level_rank(v);
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

/* AVX512_BF16 from CPUID (leaf 7, subleaf 1, EAX bit 5): gcc 12's
 * __builtin_cpu_supports knows "avx512bf16", clang 14's does not. */
static int have_avx512bf16(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5)) != 0;
}

static int probe_avx512bf16(void)
{
    return kernels_allow("avx512-bf16") && probe_avx512bw() && have_avx512bf16();
}

/* AVX512_VNNI from CPUID (leaf 7, subleaf 0, ECX bit 11), as the BF16
 * flag: the same probe under gcc and clang. */
static int have_avx512vnni(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 11)) != 0;
}

static int probe_avx512vnni(void)
{
    return kernels_allow("avx512-vnni") && probe_avx512bw() && have_avx512vnni();
}

static atomic_int have_avx512 = -1, have_avx2 = -1, have_avx512bw = -1, have_bf16 = -1,
                  have_vnni = -1;

int op_use_avx512vnni(void)
{
    return cached(&have_vnni, probe_avx512vnni);
}

int op_use_avx512bf16(void)
{
    return cached(&have_bf16, probe_avx512bf16);
}

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

int op_use_avx512bf16(void)
{
    return 0;
}

int op_use_avx512vnni(void)
{
    return 0;
}
#endif

const char *const op_unbuilt_levels[] = {"amx-bf16: not built (no AMX machine to verify it on)",
                                         "amx-int8: not built (no AMX machine to verify it on)",
                                         NULL};

static const char *widening_level(void)
{
    return op_use_avx512() ? "avx512" : op_use_avx2() ? "avx2" : "portable";
}

/* The highest level that runs. */
const char *eng_kernels(void)
{
    return op_use_avx512bf16()   ? "avx512-bf16"
           : op_use_avx512vnni() ? "avx512-vnni"
                                 : widening_level();
}

/* The level a format's projections take: BF16 and Q8 have their own. */
const char *eng_kernels_for(const char *dtype)
{
    if (strcmp(dtype, "bf16") == 0 && op_use_avx512bf16()) return "avx512-bf16";
    if (strcmp(dtype, "q8") == 0 && op_use_avx512vnni()) return "avx512-vnni";
    return widening_level();
}
