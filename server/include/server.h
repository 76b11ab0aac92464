/*
 * server/include/server.h: `gpt2d serve`, the OpenAI-compatible HTTP daemon.
 *
 * One libuv loop thread owns everything mutable: libmicrohttpd runs inside it
 * in external-event mode (uv_poll on its epoll descriptor plus a uv_timer for
 * its timeouts), the scheduler is planned and completed on it, and each
 * engine step runs on the libuv work queue. See docs/architecture.md; the
 * pieces and what they share are in internal.h.
 *
 * Prefix: srv_ (internal: http_, loop_, cmpl_, lp_, tok_, probe_, met_,
 * log_, sse_, oai_).
 */
#ifndef GPT2D_SERVER_SERVER_H
#define GPT2D_SERVER_SERVER_H

/* `gpt2d serve [options]`: argv[0] is "serve". Returns the exit status:
 * 0 after a clean shutdown, 1 when start-up fails (one line on stderr), 2
 * on a usage error. Thread: main. */
int srv_main(int argc, char **argv);

/* The version line of `gpt2d --version` and `gpt2d serve --version`:
 * "gpt2d VERSION (COMMIT, BUILDTYPE)" and a newline, on stdout. */
void srv_print_version(void);

#endif
