/* common/errbuf.c: the caller's message buffer (include/errbuf.h). */
#include "errbuf.h"

#include <stdio.h>
#include <string.h>

void errbuf_vset(char *err, size_t errlen, const char *fmt, va_list ap)
{
    if (err == NULL || errlen == 0) return;
    vsnprintf(err, errlen, fmt, ap);
}

void errbuf_set(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    errbuf_vset(err, errlen, fmt, ap);
    va_end(ap);
}

void errbuf_vappend(char *err, size_t errlen, const char *fmt, va_list ap)
{
    if (err == NULL || errlen == 0) return;
    size_t used = strnlen(err, errlen);
    if (used < errlen) vsnprintf(err + used, errlen - used, fmt, ap);
}

void errbuf_oneline(char *err, size_t errlen)
{
    if (err == NULL) return;
    for (size_t i = 0; i < errlen && err[i] != '\0'; i++)
        if ((unsigned char)err[i] < 0x20 || err[i] == 0x7F) err[i] = '?';
}
