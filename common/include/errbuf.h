/*
 * common/include/errbuf.h: the caller's message buffer (STYLE.md G4). A
 * fallible call writes one line naming the culprit into the caller's
 * `char *err, size_t errlen`, then returns its module's status:
 *
 *     return ERRBUF_FAIL(err, errlen, CFG_EINVAL, "%s:%zu: unknown key", path, line);
 *
 * Prefix: errbuf_ (ERRBUF_ for the macro). The bottom module: it includes
 * nothing of gpt2d, and every module may include it. Thread: any (each
 * call touches only the buffer it is given).
 */
#ifndef GPT2D_COMMON_ERRBUF_H
#define GPT2D_COMMON_ERRBUF_H

#include <stdarg.h>
#include <stddef.h>

#if defined(__GNUC__)
#define ERRBUF_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define ERRBUF_PRINTF(f, a)
#endif

/* Writes the message into err[0 .. errlen), truncated and NUL-terminated
 * as vsnprintf does. Nothing when err is NULL or errlen is 0 (the caller
 * did not ask for words). */
void errbuf_set(char *err, size_t errlen, const char *fmt, ...) ERRBUF_PRINTF(3, 4);
void errbuf_vset(char *err, size_t errlen, const char *fmt, va_list ap) ERRBUF_PRINTF(3, 0);

/* Appends the message after what err holds (a NUL-terminated string from
 * errbuf_set), truncated at errlen as above. */
void errbuf_vappend(char *err, size_t errlen, const char *fmt, va_list ap) ERRBUF_PRINTF(3, 0);

/* Keeps the message one line whatever it quotes (file data, a path):
 * bytes below 0x20 and 0x7F become '?'. */
void errbuf_oneline(char *err, size_t errlen);

/* The message into err (errbuf_set), then the value status, of the
 * caller's own status type: the one expression a failing return needs. */
#define ERRBUF_FAIL(err, errlen, status, ...) (errbuf_set((err), (errlen), __VA_ARGS__), (status))

#endif
