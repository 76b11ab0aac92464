/*
 * bench/bench_dnnl_child.c: gpt2d's side of bench_dnnl: one round of
 * op_matmul / op_lm_head over a shape's weight copies, and the child
 * process that runs them at the "avx512-bf16" level (bench_dnnl_child.h).
 */
#include "bench_dnnl_child.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

void gpt2d_round(const bd_gpt2d *g, const bd_data *d, int bf16, float *out, const float *x,
                 size_t M)
{
    const bd_shape *s = d->s;
    for (size_t c = 0; c < d->copies; c++) {
        const void *w = bf16 ? (const void *)d->wb[c] : (const void *)d->wf[c];
        op_w W = {w, NULL, bf16 ? OP_BF16 : OP_F32, !s->lm, bf16 ? d->pairs[c] : NULL, NULL};
        if (s->lm) {
            op_lm_head(g->pool, g->scratch, out, x, &W, M, s->K, s->N);
        } else {
            op_w b = {d->bias, NULL, OP_F32, 0, NULL, NULL};
            op_matmul(g->pool, g->scratch, out, x, &W, &b, M, s->K, s->N);
        }
    }
}

typedef struct {
    int64_t shape; /* index into the data; -1: quit */
    uint64_t M;
} dp_cmd;

typedef struct {
    bd_time t;
    char level[32]; /* the hello: eng_kernels_for("bf16") */
} dp_reply;

/* All n bytes of p written to fd (writing) or read from it: 0, or -1 at an
 * error or the end of the pipe. */
static int full_io(int fd, void *p, size_t n, int writing)
{
    char *c = p;
    while (n > 0) {
        ssize_t k = writing ? write(fd, c, n) : read(fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* The child's loop: runs rounds on command until told to quit or the
 * parent goes away. Returns its exit status. */
static int child_main(int in, int out_fd, const bd_data *shared, const float *x, float *out,
                      size_t threads, size_t scratch_floats)
{
    int rc = 1;
    if (setenv("GPT2D_KERNELS", "avx512-bf16", 1) != 0) return 1;
    bd_data data[BD_NSHAPES];
    memcpy(data, shared, sizeof data);
    bd_gpt2d g = {op_pool_new(threads), aligned_alloc(64, scratch_floats * sizeof(float))};
    if (g.pool == NULL || g.scratch == NULL) goto done;
    for (size_t i = 0; i < BD_NSHAPES; i++)
        for (size_t c = 0; data[i].s != NULL && c < data[i].copies; c++) {
            const bd_shape *sh = data[i].s;
            op_w W = {data[i].wb[c], NULL, OP_BF16, !sh->lm, NULL, NULL};
            if ((sh->lm ? op_w_pairs_build_rows(&W, sh->N, sh->K)
                        : op_w_pairs_build(&W, sh->K, sh->N))
                != 0) {
                fprintf(stderr, "bench_dnnl: out of memory for a pair copy\n");
                goto done;
            }
            data[i].pairs[c] = W.pairs;
        }
    dp_reply hello = {{0, 0}, {0}};
    snprintf(hello.level, sizeof hello.level, "%s", eng_kernels_for("bf16"));
    if (full_io(out_fd, &hello, sizeof hello, 1) != 0) goto done;
    for (;;) {
        dp_cmd cmd;
        if (full_io(in, &cmd, sizeof cmd, 0) != 0) break;
        if (cmd.shape < 0) {
            rc = 0;
            break;
        }
        bd_time t0 = bd_now();
        gpt2d_round(&g, &data[cmd.shape], 1, out, x, (size_t)cmd.M);
        dp_reply r = {bd_since(t0), {0}};
        if (full_io(out_fd, &r, sizeof r, 1) != 0) break;
    }
done:
    for (size_t i = 0; i < BD_NSHAPES; i++)
        for (size_t c = 0; data[i].s != NULL && c < data[i].copies; c++) {
            op_w W = {NULL, NULL, OP_BF16, 0, data[i].pairs[c], NULL};
            op_w_pairs_free(&W, data[i].s->K, data[i].s->N);
        }
    free(g.scratch);
    op_pool_free(g.pool);
    return rc;
}

/* Forks the child before anything in this process has asked for a kernel
 * level. */
int child_start(bd_child *ch, const bd_data *data, const float *x, size_t threads,
                size_t scratch_floats)
{
    int down[2], up[2];
    if (pipe(down) != 0) {
        fprintf(stderr, "bench_dnnl: pipe: %s\n", strerror(errno));
        return -1;
    }
    if (pipe(up) != 0) {
        fprintf(stderr, "bench_dnnl: pipe: %s\n", strerror(errno));
        close(down[0]);
        close(down[1]);
        return -1;
    }
    fflush(NULL); /* nothing buffered to be written twice */
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "bench_dnnl: fork: %s\n", strerror(errno));
        close(down[0]);
        close(down[1]);
        close(up[0]);
        close(up[1]);
        return -1;
    }
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        int rc = child_main(down[0], up[1], data, x, ch->out, threads, scratch_floats);
        close(down[0]);
        close(up[1]);
        exit(rc);
    }
    close(down[0]);
    close(up[1]);
    ch->pid = pid;
    ch->to = down[1];
    ch->from = up[0];
    dp_reply hello;
    if (full_io(ch->from, &hello, sizeof hello, 0) != 0) {
        fprintf(stderr, "bench_dnnl: the avx512-bf16 child did not start\n");
        return -1;
    }
    hello.level[sizeof hello.level - 1] = '\0';
    memcpy(ch->level, hello.level, sizeof ch->level);
    return 0;
}

int child_round(bd_child *ch, int shape, size_t M, bd_time *t)
{
    dp_cmd cmd = {shape, M};
    dp_reply r;
    if (full_io(ch->to, &cmd, sizeof cmd, 1) != 0 || full_io(ch->from, &r, sizeof r, 0) != 0) {
        fprintf(stderr, "bench_dnnl: the avx512-bf16 child is gone\n");
        return -1;
    }
    *t = r.t;
    return 0;
}

int child_stop(bd_child *ch)
{
    if (ch->pid <= 0) return 0;
    dp_cmd quit = {-1, 0};
    (void)full_io(ch->to, &quit, sizeof quit, 1);
    close(ch->to);
    close(ch->from);
    int st = 0;
    pid_t r = waitpid(ch->pid, &st, 0);
    while (r < 0 && errno == EINTR) r = waitpid(ch->pid, &st, 0);
    ch->pid = 0;
    return r < 0 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
}
