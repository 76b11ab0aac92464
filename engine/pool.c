/*
 * engine/pool.c: the step's worker threads.
 *
 * op_pool_run splits [0, n) into one contiguous range per thread and runs
 * fn on each, the calling thread taking the first range; it returns when
 * all are done. op_pool_run_chunks instead lets every thread claim chunks
 * of `grain` items from a shared counter until none are left: for work
 * whose cost varies along [0, n) (causal attention), and so that a thread
 * that lost its core to another process does not hold up the others.
 * Workers spin briefly on a generation counter (a step runs dozens of
 * parallel regions back to back, microseconds apart) and then sleep on a
 * condition variable, so an idle server burns no CPU.
 *
 * The split never changes a result: every kernel computes each output
 * element in one fixed order, whichever thread owns it.
 */
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Spin iterations before a worker sleeps (~50-100 us). */
#define SPIN_LIMIT 20000

struct op_pool {
    size_t nthreads; /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_ulong generation; /* bumped per job; protected by mu for sleepers */
    atomic_size_t pending;   /* workers still running the current job */
    int stop;                /* protected by mu */
    op_task fn;
    void *ctx;
    size_t n;
    size_t grain;       /* 0: one contiguous range per thread */
    atomic_size_t next; /* the next unclaimed item when grain > 0 */
};

typedef struct {
    op_pool *p;
    size_t index;
} worker_arg;

static void run_share(op_pool *p, size_t index)
{
    if (p->grain > 0) {
        for (;;) {
            size_t b = atomic_fetch_add_explicit(&p->next, p->grain, memory_order_relaxed);
            if (b >= p->n) return;
            p->fn(p->ctx, b, p->n - b > p->grain ? b + p->grain : p->n, index);
        }
    }
    size_t per = (p->n + p->nthreads - 1) / p->nthreads;
    size_t begin = index * per, end = begin + per;
    if (end > p->n) end = p->n;
    if (begin < end) p->fn(p->ctx, begin, end, index);
}

static void *worker_main(void *arg)
{
    worker_arg *wa = arg;
    op_pool *p = wa->p;
    size_t index = wa->index;
    free(wa);
    unsigned long seen = 0;
    for (;;) {
        unsigned long gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen
               && spins < SPIN_LIMIT)
            spins++;
        if (gen == seen) {
            pthread_mutex_lock(&p->mu);
            while ((gen = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen
                   && !p->stop)
                pthread_cond_wait(&p->cv, &p->mu);
            int stop = p->stop;
            pthread_mutex_unlock(&p->mu);
            if (stop && gen == seen) return NULL;
        }
        seen = gen;
        run_share(p, index);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    }
}

op_pool *op_pool_new(size_t nthreads)
{
    if (nthreads == 0) nthreads = 1;
    op_pool *p = calloc(1, sizeof *p);
    if (p == NULL) return NULL;
    p->nthreads = nthreads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->next, 0);
    p->threads = calloc(nthreads, sizeof *p->threads);
    if (p->threads == NULL) {
        op_pool_free(p);
        return NULL;
    }
    for (size_t i = 1; i < nthreads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa != NULL) *wa = (worker_arg){.p = p, .index = i};
        if (wa == NULL || pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            p->nthreads = i; /* only these exist; op_pool_free joins them */
            op_pool_free(p);
            return NULL;
        }
    }
    return p;
}

void op_pool_free(op_pool *p)
{
    if (p == NULL) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 1; p->threads != NULL && i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}

size_t op_pool_size(const op_pool *p)
{
    return p->nthreads;
}

static void run(op_pool *p, size_t n, size_t grain, op_task fn, void *ctx)
{
    if (p->nthreads == 1 || n <= 1) {
        if (n > 0) fn(ctx, 0, n, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->grain = grain;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->nthreads - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    run_share(p, 0);
    /* Spin briefly, then yield: if a worker lost its core to another
     * process, spinning here would hold the core it needs. */
    for (unsigned spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) != 0;)
        if (++spins > 2000) sched_yield();
}

void op_pool_run(op_pool *p, size_t n, op_task fn, void *ctx)
{
    run(p, n, 0, fn, ctx);
}

void op_pool_run_chunks(op_pool *p, size_t n, size_t grain, op_task fn, void *ctx)
{
    run(p, n, grain > 0 ? grain : 1, fn, ctx);
}
