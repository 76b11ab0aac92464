/*
 * server/router.c: the route table lookup and the API key check. Pure: the
 * daemon builds the table (daemon.c) and hands it over, so nothing here
 * names a handler.
 */
#include "internal.h"

#include <string.h>

http_route_result http_route_find(const http_route *table, size_t n, const char *method,
                                  const char *path, const http_route **out)
{
    const http_route *path_match = NULL;
    for (size_t i = 0; i < n; i++) {
        size_t plen = strlen(table[i].path);
        int match = table[i].prefix ? strncmp(table[i].path, path, plen) == 0 && path[plen] != '\0'
                                    : strcmp(table[i].path, path) == 0;
        if (!match) continue;
        if (strcmp(table[i].method, method) == 0) {
            *out = &table[i];
            return HTTP_ROUTE_FOUND;
        }
        if (path_match == NULL) path_match = &table[i];
    }
    *out = path_match;
    return path_match ? HTTP_ROUTE_BAD_METHOD : HTTP_ROUTE_NOT_FOUND;
}

int http_key_ok(const cfg_config *cfg, const char *auth)
{
    if (cfg->n_api_keys == 0) return 1;
    if (auth == NULL || strncmp(auth, "Bearer ", 7) != 0) return 0;
    const char *k = auth + 7;
    size_t klen = strlen(k);
    int ok = 0;
    for (size_t i = 0; i < cfg->n_api_keys; i++) {
        const char *want = cfg->api_keys[i];
        size_t wlen = strlen(want);
        unsigned diff = (unsigned)(klen ^ wlen);
        for (size_t j = 0; j < wlen; j++)
            diff |= (unsigned char)want[j] ^ (unsigned char)(j < klen ? k[j] : 0);
        ok |= diff == 0;
    }
    return ok;
}
