/* tests/utf8_filter.c: for tests/test_utf8_python.py. Each stdin line is
 * "HEX CUT..." : the bytes in hex and the offsets where the stream is cut
 * into feeds; each stdout line is the decoded output in hex. */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void)
{
    static char line[1 << 16];
    static unsigned char in[1 << 15];
    static char out[UTF8_STREAM_MAX_OUT(1 << 15)];
    while (fgets(line, sizeof line, stdin) != NULL) {
        char *p = line;
        size_t n = 0;
        while (p[0] && p[1] && p[0] != ' ' && p[0] != '\n' && n < sizeof in) {
            char hex[3] = {p[0], p[1], 0};
            in[n++] = (unsigned char)strtoul(hex, NULL, 16);
            p += 2;
        }
        utf8_stream s;
        utf8_stream_init(&s);
        size_t o = 0, prev = 0;
        for (;;) {
            char *end;
            unsigned long cut = strtoul(p, &end, 10);
            if (end == p) break;
            p = end;
            if (cut < prev || cut > n) return 2;
            o += utf8_stream_feed(&s, (const char *)in + prev, cut - prev, out + o);
            prev = cut;
        }
        o += utf8_stream_feed(&s, (const char *)in + prev, n - prev, out + o);
        o += utf8_stream_flush(&s, out + o);
        if (!utf8_valid(out, o)) return 3;
        for (size_t i = 0; i < o; i++) printf("%02x", (unsigned char)out[i]);
        putchar('\n');
    }
    return 0;
}
