/*
 * server/http/router.c: the route table lookup, the Allow list of a path and the
 * API key check (and the key's prefix cache salt). Pure: the daemon builds
 * the table (daemon.c) and hands it over, so nothing here names a handler.
 * Paths are the undecoded request target (http.c keeps libmicrohttpd from
 * unescaping it), so "/v1%2fx" is never "/v1/x".
 */
#include "http/http.h"

#include <arpa/inet.h>
#include <string.h>
#include <strings.h>

/* Whether entry e's path matches path: whole, or as a prefix followed by at
 * least one byte. */
static int path_matches(const http_route *e, const char *path)
{
    if (!e->prefix) return strcmp(e->path, path) == 0;
    size_t n = strlen(e->path);
    return strncmp(e->path, path, n) == 0 && path[n] != '\0';
}

http_route_result http_route_find(const http_route *table, size_t n, const char *method,
                                  const char *path, const http_route **out)
{
    /* HEAD is served wherever GET is (libmicrohttpd sends no body for it). */
    int head = strcmp(method, "HEAD") == 0;
    const http_route *path_match = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!path_matches(&table[i], path)) continue;
        if (strcmp(table[i].method, method) == 0 || (head && strcmp(table[i].method, "GET") == 0)) {
            *out = &table[i];
            return HTTP_ROUTE_FOUND;
        }
        if (path_match == NULL) path_match = &table[i];
    }
    *out = path_match;
    return path_match ? HTTP_ROUTE_BAD_METHOD : HTTP_ROUTE_NOT_FOUND;
}

void http_route_allow(const http_route *table, size_t n, const char *path, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (!path_matches(&table[i], path)) continue;
        int get = strcmp(table[i].method, "GET") == 0;
        int w = snprintf(buf + used, len - used, "%s%s%s", used ? ", " : "", table[i].method,
                         get ? ", HEAD" : "");
        if (w < 0 || (size_t)w >= len - used) break;
        used += (size_t)w;
    }
    snprintf(buf + used, len - used, "%sOPTIONS", used ? ", " : "");
}

int http_key_ok(const cfg_config *cfg, const char *auth)
{
    if (cfg->n_api_keys == 0) return 1;
    /* RFC 9110 11.1: the scheme is case-insensitive; 1*SP before the token. */
    if (auth == NULL || strncasecmp(auth, "Bearer ", 7) != 0) return 0;
    const char *k = auth + 7;
    while (*k == ' ') k++;
    size_t klen = strlen(k);
    /* RFC 9110 5.5: a field value's trailing whitespace is not part of it. */
    while (klen > 0 && (k[klen - 1] == ' ' || k[klen - 1] == '\t')) klen--;
    int ok = 0;
    for (size_t i = 0; i < cfg->n_api_keys; i++) {
        const char *want = cfg->api_keys[i];
        size_t wlen = strlen(want);
        unsigned diff = (unsigned)(klen ^ wlen);
        for (size_t j = 0; j < wlen; j++)
            diff |= (unsigned char)want[j] ^ (unsigned char)(j < klen ? k[j] : 0);
        /* ok = i + 1 where the key matched, without a branch on it */
        unsigned hit = 0u - (unsigned)(diff == 0);
        ok = (int)(((unsigned)ok & ~hit) | ((unsigned)(i + 1) & hit));
    }
    return ok;
}

/* ---- Prefix cache salts (issue 24) ---------------------------------------
 *
 * The engine shares cached prompt blocks only among requests of one salt
 * (eng_request.cache_salt). A tenant's salt is SipHash-2-4 (Aumasson and
 * Bernstein, "SipHash: a fast short-input PRF", 2012) under a secret drawn
 * at start-up (srv.salt_secret): it says nothing about the key it came
 * from, nobody can pick a message that lands on another tenant's salt, and
 * a restart gives new ones. The first byte separates the two uses. */

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

static void sip_round(uint64_t v[4])
{
    v[0] += v[1];
    v[1] = ROTL(v[1], 13);
    v[1] ^= v[0];
    v[0] = ROTL(v[0], 32);
    v[2] += v[3];
    v[3] = ROTL(v[3], 16);
    v[3] ^= v[2];
    v[0] += v[3];
    v[3] = ROTL(v[3], 21);
    v[3] ^= v[0];
    v[2] += v[1];
    v[1] = ROTL(v[1], 17);
    v[1] ^= v[2];
    v[2] = ROTL(v[2], 32);
}

uint64_t http_siphash(const uint64_t k[2], const void *p, size_t n)
{
    const unsigned char *in = p;
    uint64_t v[4] = {k[0] ^ UINT64_C(0x736f6d6570736575), k[1] ^ UINT64_C(0x646f72616e646f6d),
                     k[0] ^ UINT64_C(0x6c7967656e657261), k[1] ^ UINT64_C(0x7465646279746573)};
    size_t whole = n - n % 8;
    for (size_t i = 0; i < whole; i += 8) {
        uint64_t m = 0;
        for (int j = 7; j >= 0; j--) m = (m << 8) | in[i + (size_t)j]; /* little-endian */
        v[3] ^= m;
        sip_round(v);
        sip_round(v);
        v[0] ^= m;
    }
    uint64_t b = (uint64_t)(n & 0xff) << 56;
    for (size_t j = 0; j < n % 8; j++) b |= (uint64_t)in[whole + j] << (8 * j);
    v[3] ^= b;
    sip_round(v);
    sip_round(v);
    v[0] ^= b;
    v[2] ^= 0xff;
    for (int r = 0; r < 4; r++) sip_round(v);
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}

/* 0 is the engine's common partition: a salt is never 0. */
static uint64_t nonzero(uint64_t h)
{
    return h != 0 ? h : 1;
}

uint64_t http_key_salt(const uint64_t secret[2], const char *key)
{
    unsigned char m[1 + sizeof((cfg_config *)0)->api_keys[0]];
    size_t n = strlen(key);
    if (n > sizeof m - 1) n = sizeof m - 1; /* cfg bounds keys below this */
    m[0] = 'k';
    memcpy(m + 1, key, n);
    uint64_t h = nonzero(http_siphash(secret, m, 1 + n));
    memset(m, 0, sizeof m); /* no copy of the key left on the stack */
    return h;
}

uint64_t http_cache_salt(const uint64_t secret[2], uint64_t tenant, const char *salt, size_t n)
{
    if (salt == NULL) return tenant;
    unsigned char m[1 + 8 + HTTP_MAX_CACHE_SALT];
    if (n > HTTP_MAX_CACHE_SALT) n = HTTP_MAX_CACHE_SALT; /* oai.c refuses longer ones */
    m[0] = 'c';
    for (int j = 0; j < 8; j++) m[1 + j] = (unsigned char)(tenant >> (8 * j));
    memcpy(m + 9, salt, n);
    return nonzero(http_siphash(secret, m, 9 + n));
}

int http_origin_allowed(const char *list, const char *origin)
{
    size_t olen = strlen(origin);
    const char *p = list;
    while (*p != '\0') {
        while (*p == ' ' || *p == ',') p++;
        const char *e = p;
        while (*e != '\0' && *e != ',') e++;
        const char *end = e;
        while (end > p && end[-1] == ' ') end--;
        size_t n = (size_t)(end - p);
        if ((n == 1 && *p == '*') || (n > 0 && n == olen && memcmp(p, origin, n) == 0)) return 1;
        p = e;
    }
    return 0;
}

int http_origin_same_host(const char *origin, const char *host)
{
    static const char scheme[] = "http://";
    if (origin == NULL || host == NULL || strncmp(origin, scheme, sizeof scheme - 1) != 0
        || strcmp(origin + sizeof scheme - 1, host) != 0)
        return 0;
    /* The host's name without its port: an IP literal or localhost. A
     * name (evil.example) could be rebound to this machine, so it must be
     * listed in cors_origins. */
    char name[64];
    size_t n = strlen(host);
    const char *end = host + n;
    if (host[0] == '[') { /* [v6]:port */
        const char *close = strchr(host, ']');
        if (close == NULL) return 0;
        host++;
        end = close;
    } else {
        const char *colon = strrchr(host, ':');
        if (colon != NULL) end = colon;
    }
    if ((size_t)(end - host) >= sizeof name || end == host) return 0;
    memcpy(name, host, (size_t)(end - host));
    name[end - host] = '\0';
    unsigned char addr[16];
    return strcmp(name, "localhost") == 0 || inet_pton(AF_INET, name, addr) == 1
           || inet_pton(AF_INET6, name, addr) == 1;
}

int http_host_allowed(const char *list, int loopback_bind, const char *host)
{
    static const char loopback_names[] = "localhost, 127.0.0.1, [::1]";
    if (host == NULL) return 1; /* HTTP/1.0 without Host: no browser sends that */
    if (list[0] == '\0') {
        if (!loopback_bind) return 1;
        list = loopback_names;
    }
    /* The name: "[v6]" with its brackets, else up to the port's colon. */
    size_t n = strlen(host);
    if (host[0] == '[') {
        const char *close = strchr(host, ']');
        if (close == NULL) return 0;
        n = (size_t)(close - host) + 1;
        if (host[n] != '\0' && host[n] != ':') return 0;
    } else {
        const char *colon = strchr(host, ':');
        if (colon != NULL) n = (size_t)(colon - host);
    }
    const char *port = host + n;
    if (*port == ':')
        for (const char *p = port + 1; *p; p++)
            if (*p < '0' || *p > '9') return 0;
    const char *p = list;
    while (*p != '\0') {
        while (*p == ' ' || *p == ',') p++;
        const char *e = p;
        while (*e != '\0' && *e != ',' && *e != ' ') e++;
        size_t len = (size_t)(e - p);
        if ((len == 1 && *p == '*') || (len > 0 && len == n && strncasecmp(p, host, n) == 0))
            return 1;
        p = e;
    }
    return 0;
}
