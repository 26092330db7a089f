/*
 * lmtp.h - the LMTP session engine (RFC 2033 over RFC 5321 syntax, with
 * PIPELINING, 8BITMIME, ENHANCEDSTATUSCODES, SIZE, STARTTLS, AUTH and
 * CHUNKING), run over a struct prot (lib/prot.h).
 *
 * One struct lmtp_server per process (created after fork: it holds the
 * store handles), one lmtp_serve() call per connection.  Everything a
 * connection allocates is freed before lmtp_serve() returns; no client
 * input can end the process.
 *
 * Reply texts are fixed (doc: man/lmtpd.8).  A 250 for a recipient is
 * sent only after deliver_message() reported STORE_OK for it, i.e. after
 * the durable commit.
 */
#ifndef LMTPD_LMTP_H
#define LMTPD_LMTP_H

#include "lib/imapconf.h"

struct prot;
struct tls_server;
struct lmtp_server;

/* How a connection came in, for lmtp_serve(). */
struct lmtp_conn {
    const char *peer;        /* service_main's peer text: "unix", "stdin",
                                "1.2.3.4:port", "[::1]:port" */
    const char *localaddr;   /* "a.b.c.d;port" for SASL, or NULL */
    const char *remoteaddr;  /* "a.b.c.d;port" for SASL, or NULL */
    int trusted;             /* 1: UNIX socket / stdin, or TCP with -a:
                                MAIL needs no AUTH */
};

/* The per-process part.  tls may be NULL (no STARTTLS); sasl_ok says
 * whether saslserver_init() worked (else AUTH is never offered).  conf,
 * and tls must outlive the server.  0, or -1 when out of memory.  The
 * databases are opened here and, if that fails (a damaged or missing
 * mailbox list), again at each RCPT, which answers 451 4.3.0 meanwhile:
 * the worker stays up and the client is told to come back. */
int lmtp_server_new(const struct imapconf *conf, struct tls_server *tls,
                    int sasl_ok, struct lmtp_server **srv_r);
void lmtp_server_free(struct lmtp_server **srvp);

/* Serve one connection on p until QUIT, EOF, a timeout (421) or a fatal
 * stream error.  Does not free p. */
void lmtp_serve(struct lmtp_server *srv, struct prot *p,
                const struct lmtp_conn *conn);

#endif
