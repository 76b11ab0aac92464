/*
 * server/http/error_json.c: see error_json.h.
 */
#include "http/error_json.h"

#include <jansson.h>
#include <string.h>

void http_error_sanitize(char *p)
{
    unsigned char *u = (unsigned char *)p;
    size_t n = strlen(p), i = 0;
    while (i < n) {
        unsigned c = u[i];
        size_t len = c < 0x80                 ? 1
                     : c >= 0xC2 && c <= 0xDF ? 2
                     : c >= 0xE0 && c <= 0xEF ? 3
                     : c >= 0xF0 && c <= 0xF4 ? 4
                                              : 0;
        int ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++) ok = (u[i + k] & 0xC0) == 0x80;
        if (ok && len == 3) ok = !(c == 0xE0 && u[i + 1] < 0xA0) && !(c == 0xED && u[i + 1] > 0x9F);
        if (ok && len == 4) ok = !(c == 0xF0 && u[i + 1] < 0x90) && !(c == 0xF4 && u[i + 1] > 0x8F);
        if (!ok) {
            u[i++] = '?';
            continue;
        }
        i += len;
    }
}

char *http_error_json(const char *type, const char *code, const char *param, const char *message)
{
    json_t *e = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", message, "type",
                          type ? type : "server_error", "param",
                          param[0] ? json_string(param) : json_null(), "code",
                          code ? json_string(code) : json_null());
    if (e == NULL) return NULL;
    char *s = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    return s;
}
