/*
 * tls.h - the server's TLS context (OpenSSL 3), made once per process from
 * imapd.conf's tls_server_cert and tls_server_key, and used by
 * prot_starttls() for each connection.
 *
 * Protocol versions: TLS 1.2 and 1.3 only; OpenSSL's default ciphers for
 * those; no compression; no session tickets across processes (each worker
 * has its own context, so cross-process resumption would not work anyway).
 */
#ifndef LIB_TLS_H
#define LIB_TLS_H

#include "lib/imapconf.h"

struct tls_server;

/* Load certificate and key from the files imapd.conf names.  Returns 0
 * and *tls_r; or -1 with *error_r (caller frees): "TLS not configured
 * (tls_server_cert/tls_server_key unset)" when either key is empty (a
 * front end then does not offer STARTTLS), or a message naming the file
 * and OpenSSL's reason when a file cannot be read, does not parse, or
 * the key does not match the certificate. */
int tls_server_new(const struct imapconf *conf, struct tls_server **tls_r,
                   char **error_r);
/* The same from explicit files (tests). */
int tls_server_new_files(const char *certfile, const char *keyfile,
                         struct tls_server **tls_r, char **error_r);
void tls_server_free(struct tls_server **tlsp);

/* The OpenSSL context (an SSL_CTX *), for prot_starttls(); owned by tls.
 * Declared with OpenSSL's struct tag so that this header needs no OpenSSL
 * include. */
struct ssl_ctx_st;
struct ssl_ctx_st *tls_server_ssl_ctx(const struct tls_server *tls);

/* The client side, for a server that connects to another (a frontend
 * to its backends): TLS 1.2 minimum, the peer's certificate verified
 * against cafile (PEM; NULL or "" = OpenSSL's default trust store) and,
 * by prot_starttls_client(), its name.  0 and *tls_r, or -1 with
 * *error_r (caller frees) naming the file and OpenSSL's reason. */
struct tls_client;
int tls_client_new(const char *cafile, struct tls_client **tls_r,
                   char **error_r);
void tls_client_free(struct tls_client **tlsp);
struct ssl_ctx_st *tls_client_ssl_ctx(const struct tls_client *tls);

#endif
