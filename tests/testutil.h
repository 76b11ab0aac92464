/* tests/testutil.h: small helpers shared by the check test binaries. */
#ifndef GPT2D_TESTS_TESTUTIL_H
#define GPT2D_TESTS_TESTUTIL_H

#include <stdio.h>
#include <string.h>

/* mkdtemp's template: prefix plus the six placeholder characters it wants. */
static inline void mkdtemp_template(char *buf, size_t len, const char *prefix)
{
    size_t n = (size_t)snprintf(buf, len, "%s", prefix);
    if (n + 7 > len) n = len - 7;
    memset(buf + n, 'X', 6);
    buf[n + 6] = '\0';
}

#endif
