/*
 * tls.c - the server's TLS context, and the client context of a server
 * that connects to another (see tls.h).
 *
 * One SSL_CTX per process: TLS 1.2 minimum, OpenSSL's default cipher
 * lists for 1.2 and 1.3, no compression, no renegotiation, no session
 * tickets and no session cache (every worker is its own process: a
 * ticket issued by one could not be used by another).  A peer that
 * closes the connection without close_notify is treated as an ordinary
 * end of stream (SSL_OP_IGNORE_UNEXPECTED_EOF): the protocols above have
 * their own terminators, and truncation is no attack on them.
 *
 * The certificate file may hold the chain (leaf first).  The key is read
 * by us (never prompting for a passphrase: an encrypted key is an error)
 * and compared with the certificate before it is installed, so the three
 * failures "cannot read", "does not parse" and "does not match" each get
 * their own message naming the file(s).
 */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "lib/buf.h"
#include "lib/tls.h"

struct tls_server {
    SSL_CTX *ctx;
};

static void tls_seterror(char **error_r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void tls_seterror(char **error_r, const char *fmt, ...)
{
    struct buf b = BUF_INITIALIZER;
    va_list ap;

    if (!error_r)
        return;
    va_start(ap, fmt);
    if (buf_vprintf(&b, fmt, ap) == 0)
        *error_r = buf_release(&b);
    else
        *error_r = NULL;
    va_end(ap);
    buf_free(&b);
}

/* OpenSSL's reason for the most recent error (the queue is cleared). */
static const char *tls_reason(char *out, size_t outlen)
{
    unsigned long e = ERR_peek_last_error();
    const char *reason;

    if (e == 0) {
        snprintf(out, outlen, "unknown OpenSSL error");
    } else {
        reason = ERR_reason_error_string(e);
        if (reason)
            snprintf(out, outlen, "%s", reason);
        else
            ERR_error_string_n(e, out, outlen);
    }
    ERR_clear_error();
    return out;
}

/* Never ask for a passphrase. */
static int tls_no_password(char *buf, int size, int rwflag, void *u)
{
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)u;
    return -1;
}

int tls_server_new_files(const char *certfile, const char *keyfile,
                         struct tls_server **tls_r, char **error_r)
{
    struct tls_server *tls = NULL;
    SSL_CTX *ctx = NULL;
    EVP_PKEY *key = NULL;
    X509 *cert;
    FILE *f = NULL;
    char reason[256];

    *tls_r = NULL;
    if (error_r)
        *error_r = NULL;
    if (!certfile || !*certfile || !keyfile || !*keyfile) {
        tls_seterror(error_r, "TLS not configured"
                     " (tls_server_cert/tls_server_key unset)");
        return -1;
    }
    ERR_clear_error();

    ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        tls_seterror(error_r, "tls: cannot create context: %s",
                     tls_reason(reason, sizeof(reason)));
        goto fail;
    }
    if (!SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION)) {
        tls_seterror(error_r, "tls: cannot set minimum version TLS 1.2: %s",
                     tls_reason(reason, sizeof(reason)));
        goto fail;
    }
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_TICKET
                        | SSL_OP_NO_RENEGOTIATION
                        | SSL_OP_CIPHER_SERVER_PREFERENCE
                        | SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(ctx, 0);     /* TLS 1.3: no useless tickets */
    SSL_CTX_set_default_passwd_cb(ctx, tls_no_password);
    /* decrypt whole records into OpenSSL's buffer: fewer read calls */
    SSL_CTX_set_read_ahead(ctx, 1);

    /* the certificate (and chain) */
    f = fopen(certfile, "r");
    if (!f) {
        tls_seterror(error_r, "tls: cannot read certificate file=<%s>: %s",
                     certfile, strerror(errno));
        goto fail;
    }
    fclose(f);
    f = NULL;
    if (SSL_CTX_use_certificate_chain_file(ctx, certfile) != 1) {
        tls_seterror(error_r, "tls: bad certificate file=<%s>: %s",
                     certfile, tls_reason(reason, sizeof(reason)));
        goto fail;
    }

    /* the key */
    f = fopen(keyfile, "r");
    if (!f) {
        tls_seterror(error_r, "tls: cannot read private key file=<%s>: %s",
                     keyfile, strerror(errno));
        goto fail;
    }
    key = PEM_read_PrivateKey(f, NULL, tls_no_password, NULL);
    fclose(f);
    f = NULL;
    if (!key) {
        tls_seterror(error_r, "tls: bad private key file=<%s>"
                     " (not PEM, or encrypted): %s",
                     keyfile, tls_reason(reason, sizeof(reason)));
        goto fail;
    }
    cert = SSL_CTX_get0_certificate(ctx);
    if (!cert || X509_check_private_key(cert, key) != 1) {
        ERR_clear_error();
        tls_seterror(error_r, "tls: private key file=<%s> does not match"
                     " the certificate file=<%s>", keyfile, certfile);
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey(ctx, key) != 1
        || SSL_CTX_check_private_key(ctx) != 1) {
        tls_seterror(error_r, "tls: cannot use private key file=<%s>"
                     " with certificate file=<%s>: %s", keyfile, certfile,
                     tls_reason(reason, sizeof(reason)));
        goto fail;
    }
    EVP_PKEY_free(key);
    key = NULL;

    tls = calloc(1, sizeof(*tls));
    if (!tls) {
        tls_seterror(error_r, "tls: out of memory");
        goto fail;
    }
    tls->ctx = ctx;
    *tls_r = tls;
    return 0;

fail:
    if (f)
        fclose(f);
    EVP_PKEY_free(key);
    SSL_CTX_free(ctx);
    ERR_clear_error();
    return -1;
}

int tls_server_new(const struct imapconf *conf, struct tls_server **tls_r,
                   char **error_r)
{
    return tls_server_new_files(imapconf_getstring(conf, "tls_server_cert"),
                                imapconf_getstring(conf, "tls_server_key"),
                                tls_r, error_r);
}

void tls_server_free(struct tls_server **tlsp)
{
    if (!tlsp || !*tlsp)
        return;
    SSL_CTX_free((*tlsp)->ctx);
    free(*tlsp);
    *tlsp = NULL;
}

struct ssl_ctx_st *tls_server_ssl_ctx(const struct tls_server *tls)
{
    return tls->ctx;
}

/* ---- the client side ------------------------------------------------ */

struct tls_client {
    SSL_CTX *ctx;
};

int tls_client_new(const char *cafile, struct tls_client **tls_r,
                   char **error_r)
{
    struct tls_client *tls;
    SSL_CTX *ctx;
    char reason[256];

    *tls_r = NULL;
    if (error_r)
        *error_r = NULL;
    ERR_clear_error();
    ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        tls_seterror(error_r, "tls: cannot create client context: %s",
                     tls_reason(reason, sizeof(reason)));
        return -1;
    }
    if (!SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION)) {
        tls_seterror(error_r, "tls: cannot set minimum version TLS 1.2: %s",
                     tls_reason(reason, sizeof(reason)));
        goto fail;
    }
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION
                        | SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (cafile && *cafile) {
        if (SSL_CTX_load_verify_locations(ctx, cafile, NULL) != 1) {
            tls_seterror(error_r, "tls: cannot load CA file=<%s>: %s",
                         cafile, tls_reason(reason, sizeof(reason)));
            goto fail;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        tls_seterror(error_r, "tls: cannot load the default trust store: %s",
                     tls_reason(reason, sizeof(reason)));
        goto fail;
    }
    tls = calloc(1, sizeof(*tls));
    if (!tls) {
        tls_seterror(error_r, "tls: out of memory");
        goto fail;
    }
    tls->ctx = ctx;
    *tls_r = tls;
    return 0;

fail:
    SSL_CTX_free(ctx);
    ERR_clear_error();
    return -1;
}

void tls_client_free(struct tls_client **tlsp)
{
    if (!tlsp || !*tlsp)
        return;
    SSL_CTX_free((*tlsp)->ctx);
    free(*tlsp);
    *tlsp = NULL;
}

struct ssl_ctx_st *tls_client_ssl_ctx(const struct tls_client *tls)
{
    return tls->ctx;
}
