/*
 * bench/bench_util.h: what the benchmark programs share: the monotonic
 * clock in seconds and qsort's order of doubles (for medians). Header-only,
 * benchmarks only.
 */
#ifndef GPT2D_BENCH_UTIL_H
#define GPT2D_BENCH_UTIL_H

#include <time.h>

static inline double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
