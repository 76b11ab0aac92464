/*
 * server/http/tls.c: HTTPS through libmicrohttpd's GnuTLS, with certificates
 * that rotate without a restart.
 *
 * libmicrohttpd reads a certificate given as an option once, at start.
 * Instead it is given a certificate callback (MHD_OPTION_HTTPS_CERT_CALLBACK,
 * GnuTLS's retrieve_function2): each handshake asks for the certificate
 * then, and gets the current one. SIGHUP loads the files again into a new
 * tls_cert and swaps it in (loop thread, where every handshake runs too);
 * a file that is missing, does not parse, or a key that does not match
 * the certificate leaves the current one serving.
 *
 * GnuTLS does not copy what the callback returns: a session keeps pointers
 * to the chain and key it was given, and frees nothing. So a certificate
 * swapped out is retired, not freed, until no connection can hold it. A
 * connection can hold only a certificate that was current at some moment
 * while it was open, so it is enough to know which connections were open
 * when the certificate was retired: each connection notes the generation
 * at its start (tls_conn_opened), each retired certificate counts the
 * connections open when it was retired (holders), and a closing
 * connection that started before a retirement lowers that count. The last
 * one frees it.
 *
 * GnuTLS's callback carries no pointer of ours: the state is reached
 * through one file-scope pointer, set while a server with HTTPS runs (one
 * server a process; docs/architecture.md lists it).
 *
 * Without GnuTLS at build time (meson's tls feature), tls_supported says
 * so and nothing else here is used.
 */
#include "http/http.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#ifdef GPT2D_HAVE_GNUTLS
#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <sys/stat.h>

/* A certificate chain longer than this is refused (a server's chain is
 * its certificate and an intermediate or two). */
#define TLS_MAX_CHAIN 16
/* PEM files larger than this are refused before they are read whole. */
#define TLS_MAX_FILE (1u << 20)

typedef struct tls_cert tls_cert;
struct tls_cert {
    gnutls_pcert_st chain[TLS_MAX_CHAIN];
    unsigned n; /* entries of chain in use */
    gnutls_privkey_t key;
    uint64_t retired_gen; /* the generation it served last (once retired) */
    size_t holders;       /* connections open when it was retired, still open */
    tls_cert *next;       /* the retired list */
};

struct tls_state {
    tls_cert *cur;     /* what new handshakes get */
    tls_cert *retired; /* swapped out, still possibly held */
    uint64_t gen;      /* bumped at every swap */
    size_t nretired;
};

/* The running server's state for the certificate callback (NULL: none). */
static tls_state *tls_active;

static void cert_free(tls_cert *c)
{
    if (c == NULL) return;
    for (unsigned i = 0; i < c->n; i++) gnutls_pcert_deinit(&c->chain[i]);
    if (c->key != NULL) gnutls_privkey_deinit(c->key);
    free(c);
}

/* The whole file at path into *out (gnutls_free's memory is not needed:
 * malloc, free with free). 0, or -1 with err naming the file. */
static int read_file(const char *what, const char *path, gnutls_datum_t *out, char *err,
                     size_t errlen)
{
    out->data = NULL;
    out->size = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "%s %s: cannot be read: %s", what, path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0
        || (uint64_t)st.st_size > TLS_MAX_FILE) {
        snprintf(err, errlen, "%s %s: not a regular file of 1 byte to %u KiB", what, path,
                 TLS_MAX_FILE >> 10);
        fclose(f);
        return -1;
    }
    size_t n = (size_t)st.st_size;
    unsigned char *buf = malloc(n + 1);
    if (buf == NULL || fread(buf, 1, n, f) != n) {
        snprintf(err, errlen, "%s %s: cannot be read whole", what, path);
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    buf[n] = '\0';
    out->data = buf;
    out->size = (unsigned)n;
    return 0;
}

/* Loads a PEM chain and key, and checks that the key is the first
 * certificate's (GnuTLS's own key-pair check, through a throwaway
 * credentials object). 0 with *out, or -1 with err naming the file. */
static int cert_load(const char *cert_path, const char *key_path, tls_cert **out, char *err,
                     size_t errlen)
{
    *out = NULL;
    gnutls_datum_t cd = {NULL, 0}, kd = {NULL, 0};
    gnutls_certificate_credentials_t check = NULL;
    tls_cert *c = calloc(1, sizeof *c);
    int rc = -1, g;
    if (c == NULL) {
        snprintf(err, errlen, "out of memory loading %s", cert_path);
        goto done;
    }
    if (read_file("tls_cert_file", cert_path, &cd, err, errlen) != 0
        || read_file("tls_key_file", key_path, &kd, err, errlen) != 0)
        goto done;
    c->n = TLS_MAX_CHAIN;
    g = gnutls_pcert_list_import_x509_raw(c->chain, &c->n, &cd, GNUTLS_X509_FMT_PEM,
                                          GNUTLS_X509_CRT_LIST_FAIL_IF_UNSORTED);
    if (g < 0 || c->n == 0) {
        if (g < 0) c->n = 0;
        snprintf(err, errlen, "tls_cert_file %s: not a PEM certificate chain (%s)", cert_path,
                 g < 0 ? gnutls_strerror(g) : "no certificate in it");
        goto done;
    }
    g = gnutls_privkey_init(&c->key);
    if (g >= 0) g = gnutls_privkey_import_x509_raw(c->key, &kd, GNUTLS_X509_FMT_PEM, NULL, 0);
    if (g < 0) {
        snprintf(err, errlen, "tls_key_file %s: not a PEM private key without a passphrase (%s)",
                 key_path, gnutls_strerror(g));
        goto done;
    }
    g = gnutls_certificate_allocate_credentials(&check);
    if (g >= 0)
        g = gnutls_certificate_set_x509_key_mem2(check, &cd, &kd, GNUTLS_X509_FMT_PEM, NULL, 0);
    if (g < 0) {
        snprintf(err, errlen, "tls_key_file %s does not go with tls_cert_file %s (%s)", key_path,
                 cert_path, gnutls_strerror(g));
        goto done;
    }
    *out = c;
    c = NULL;
    rc = 0;
done:
    if (check != NULL) gnutls_certificate_free_credentials(check);
    if (kd.data != NULL) {
        memset(kd.data, 0, kd.size); /* the key's bytes do not linger in the heap */
        free(kd.data);
    }
    free(cd.data);
    cert_free(c);
    return rc;
}

int tls_supported(char *err, size_t errlen)
{
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES
        || MHD_is_feature_supported(MHD_FEATURE_HTTPS_CERT_CALLBACK) != MHD_YES) {
        snprintf(err, errlen,
                 "this libmicrohttpd has no HTTPS (TLS or its certificate callback); "
                 "serve plain HTTP behind a TLS proxy (deploy/nginx/gpt2d.conf)");
        return 0;
    }
    return 1;
}

int tls_priorities_check(const char *prio, char *err, size_t errlen)
{
    gnutls_priority_t p = NULL;
    const char *at = NULL;
    int g = gnutls_priority_init(&p, prio, &at);
    if (g < 0) {
        /* at points into prio where GnuTLS stopped (for a syntax error). */
        if (at != NULL && at >= prio && at < prio + strlen(prio))
            snprintf(err, errlen, "tls_priorities '%s': GnuTLS refuses it at '%.60s' (%s)", prio,
                     at, gnutls_strerror(g));
        else
            snprintf(err, errlen, "tls_priorities '%s': GnuTLS refuses it (%s)", prio,
                     gnutls_strerror(g));
        return -1;
    }
    gnutls_priority_deinit(p);
    return 0;
}

int tls_open(srv *s, char *err, size_t errlen)
{
    if (!tls_supported(err, errlen)) return -1;
    tls_state *t = calloc(1, sizeof *t);
    if (t == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (cert_load(s->cfg.tls_cert_file, s->cfg.tls_key_file, &t->cur, err, errlen) != 0) {
        free(t);
        return -1;
    }
    s->tls = t;
    tls_active = t;
    return 0;
}

int tls_reload(srv *s, char *err, size_t errlen)
{
    tls_state *t = s->tls;
    assert(t != NULL);
    tls_cert *next = NULL;
    if (cert_load(s->cfg.tls_cert_file, s->cfg.tls_key_file, &next, err, errlen) != 0) return -1;
    tls_cert *old = t->cur;
    old->retired_gen = t->gen;
    old->holders = s->nconns;
    t->cur = next;
    t->gen++;
    if (old->holders == 0) {
        cert_free(old);
    } else {
        old->next = t->retired;
        t->retired = old;
        t->nretired++;
    }
    return 0;
}

void tls_conn_opened(srv *s, srv_conn *c)
{
    if (s->tls != NULL) c->tls_gen = s->tls->gen;
}

void tls_conn_closed(srv *s, const srv_conn *c)
{
    tls_state *t = s->tls;
    if (t == NULL) return;
    for (tls_cert **p = &t->retired; *p != NULL;) {
        tls_cert *r = *p;
        if (c->tls_gen <= r->retired_gen && r->holders > 0 && --r->holders == 0) {
            *p = r->next;
            t->nretired--;
            cert_free(r);
            continue;
        }
        p = &r->next;
    }
}

size_t tls_retired(const srv *s)
{
    return s->tls != NULL ? s->tls->nretired : 0;
}

void tls_close(srv *s)
{
    tls_state *t = s->tls;
    if (t == NULL) return;
    while (t->retired != NULL) {
        tls_cert *r = t->retired;
        t->retired = r->next;
        cert_free(r);
    }
    cert_free(t->cur);
    if (tls_active == t) tls_active = NULL;
    free(t);
    s->tls = NULL;
}

int tls_pick(gnutls_session_t session, const gnutls_datum_t *req_ca_rdn, int nreqs,
             const gnutls_pk_algorithm_t *pk_algos, int pk_algos_length, gnutls_pcert_st **pcert,
             unsigned int *pcert_length, gnutls_privkey_t *privkey)
{
    (void)session;
    (void)req_ca_rdn;
    (void)nreqs;
    (void)pk_algos;
    (void)pk_algos_length;
    tls_state *t = tls_active;
    if (t == NULL || t->cur == NULL) return -1; /* the handshake fails; nothing to serve */
    *pcert = t->cur->chain;
    *pcert_length = t->cur->n;
    *privkey = t->cur->key;
    return 0;
}

#else /* no GnuTLS at build time */

int tls_supported(char *err, size_t errlen)
{
    snprintf(err, errlen,
             "this gpt2d was built without GnuTLS (libgnutls28-dev), so it cannot serve HTTPS; "
             "rebuild with it, or serve plain HTTP behind a TLS proxy (deploy/nginx/gpt2d.conf)");
    return 0;
}

int tls_priorities_check(const char *prio, char *err, size_t errlen)
{
    (void)prio; /* nothing reads it: HTTPS cannot be served (tls_supported) */
    (void)err;
    (void)errlen;
    return 0;
}

int tls_open(srv *s, char *err, size_t errlen)
{
    (void)s;
    tls_supported(err, errlen);
    return -1;
}

int tls_reload(srv *s, char *err, size_t errlen)
{
    (void)s;
    tls_supported(err, errlen);
    return -1;
}

void tls_conn_opened(srv *s, srv_conn *c)
{
    (void)s;
    (void)c;
}

void tls_conn_closed(srv *s, const srv_conn *c)
{
    (void)s;
    (void)c;
}

size_t tls_retired(const srv *s)
{
    (void)s;
    return 0;
}

void tls_close(srv *s)
{
    (void)s;
}
#endif

int tls_built(void)
{
#ifdef GPT2D_HAVE_GNUTLS
    return 1;
#else
    return 0;
#endif
}
