/*
 * server/tokpool.c (prefix tpool_): the threads that tokenize large bodies. Not libuv's work
 * queue: its threads also run the engine step, whose calling thread computes
 * a share of every matmul, so they must keep their priority; these run at
 * nice TOKPOOL_NICE, so that on a machine with few cores a flood of bodies
 * to tokenize takes the cores the engine leaves idle, not the engine's
 * share (tokenizing is throughput, a stream's next token is latency).
 *
 * tokenize_concurrency threads (named gpt2d-tok) take requests from a FIFO; a finished one is
 * handed back to the loop thread through a uv_async and its done callback
 * runs there. Thread: tpool_submit, tpool_close on the loop thread; the
 * run callback on a pool thread, the done callback on the loop thread.
 */
#include "api/api.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* Linux's per-thread nice, added to the process's own: 10 more gets about
 * a tenth of a core against a thread of the process that wants it, and all
 * of an idle one. Relative, so that a server started under nice (or with
 * the unit's Nice=) keeps the same distance; 19 is the most. */
#define TOKPOOL_NICE 10
#define TOKPOOL_NICE_MAX 19

struct tokpool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_req *todo_head, *todo_tail; /* protected by mu */
    srv_req *done_head, *done_tail; /* protected by mu */
    int stop;                       /* protected by mu */
    tpool_fn run, done;
    uv_async_t async;
    pthread_t *threads;
    size_t nthreads;
};

static void push(srv_req **head, srv_req **tail, srv_req *r)
{
    r->tok->qnext = NULL;
    if (*tail)
        (*tail)->tok->qnext = r;
    else
        *head = r;
    *tail = r;
}

static void *worker_main(void *arg)
{
    tokpool *p = arg;
    /* The name shows in top -H and /proc (tests find the threads by it). */
    (void)pthread_setname_np(pthread_self(), "gpt2d-tok");
    /* A new thread starts at its creator's nice (the loop thread's). Failure
     * leaves it there: still correct. */
    errno = 0;
    int base = getpriority(PRIO_PROCESS, (id_t)gettid());
    if (base == -1 && errno != 0) base = 0;
    int nice = base + TOKPOOL_NICE > TOKPOOL_NICE_MAX ? TOKPOOL_NICE_MAX : base + TOKPOOL_NICE;
    (void)setpriority(PRIO_PROCESS, (id_t)gettid(), nice);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->todo_head == NULL && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) break;
        srv_req *r = p->todo_head;
        p->todo_head = r->tok->qnext;
        if (p->todo_head == NULL) p->todo_tail = NULL;
        pthread_mutex_unlock(&p->mu);
        p->run(r);
        pthread_mutex_lock(&p->mu);
        push(&p->done_head, &p->done_tail, r);
        if (!p->stop) uv_async_send(&p->async); /* closed once stop is set */
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void on_async(uv_async_t *a)
{
    tokpool *p = a->data;
    pthread_mutex_lock(&p->mu);
    srv_req *r = p->done_head;
    p->done_head = p->done_tail = NULL;
    pthread_mutex_unlock(&p->mu);
    while (r != NULL) {
        srv_req *next = r->tok->qnext;
        r->tok->qnext = NULL;
        p->done(r);
        r = next;
    }
}

int tpool_new(uv_loop_t *loop, size_t nthreads, tpool_fn run, tpool_fn done, tokpool **out,
              char *err, size_t errlen)
{
    *out = NULL;
    tokpool *p = calloc(1, sizeof *p);
    if (p == NULL || (p->threads = calloc(nthreads, sizeof *p->threads)) == NULL) {
        free(p);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->run = run;
    p->done = done;
    p->async.data = p;
    if (uv_async_init(loop, &p->async, on_async) != 0) {
        snprintf(err, errlen, "cannot set up the tokenizer threads' wake-up");
        free(p->threads);
        free(p);
        return -1;
    }
    for (; p->nthreads < nthreads; p->nthreads++) {
        int rc = pthread_create(&p->threads[p->nthreads], NULL, worker_main, p);
        if (rc != 0) {
            snprintf(err, errlen, "cannot start tokenizer thread %zu of %zu: %s", p->nthreads + 1,
                     nthreads, strerror(rc));
            *out = p; /* tpool_close + tpool_free undo the rest */
            return -1;
        }
    }
    *out = p;
    return 0;
}

void tpool_submit(tokpool *p, srv_req *r)
{
    pthread_mutex_lock(&p->mu);
    push(&p->todo_head, &p->todo_tail, r);
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void tpool_close(tokpool *p)
{
    /* Twice is harmless: libuv aborts on a second uv_close of one handle
     * (the drain closes the pool, and an exit path may ask again; #24). */
    /* Once is enough: libuv says whether the wake-up handle is closing. */
    if (p == NULL || uv_is_closing((uv_handle_t *)&p->async)) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    uv_close((uv_handle_t *)&p->async, NULL);
}

/* Calls drop for every request of list r. */
static void drop_all(srv_req *r, tpool_fn drop)
{
    while (r != NULL) {
        srv_req *next = r->tok->qnext;
        r->tok->qnext = NULL;
        drop(r);
        r = next;
    }
}

void tpool_free(tokpool *p, tpool_fn drop)
{
    if (p == NULL) return;
    for (size_t i = 0; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
    /* The threads are gone: what they left (queued, or done but not
     * delivered once the loop stopped) is the caller's again. */
    drop_all(p->todo_head, drop);
    drop_all(p->done_head, drop);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}
