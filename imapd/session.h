/*
 * session.h - the IMAP session engine (RFC 3501 over lib/prot.h, commands
 * read by imapd/imapparse.c), run once per connection by imapd.c.
 *
 * One struct imap_server per process (created after fork: it holds the
 * mailbox list handle), one imap_serve() call per connection.  Everything
 * a connection allocates is freed before imap_serve() returns; no client
 * input can end the process.
 *
 * What is implemented and what answers "NO [CANNOT] ... not implemented
 * yet" is listed at the top of session.c and in man/imapd.8.
 */
#ifndef IMAPD_SESSION_H
#define IMAPD_SESSION_H

#include "lib/imapconf.h"

struct prot;
struct tls_server;
struct imap_server;

/* How a connection came in, for imap_serve(). */
struct imap_conn {
    const char *peer;        /* service_main's peer text */
    const char *localaddr;   /* "a.b.c.d;port" for SASL, or NULL */
    const char *remoteaddr;  /* "a.b.c.d;port" for SASL, or NULL */
    int implicit_tls;        /* 1: imaps, the handshake comes first */
    int fd;                  /* the connection's socket (its local
                                address names the server domain with
                                virtdomains: on), or -1 */
};

/* The per-process part.  tls may be NULL (no STARTTLS, no imaps);
 * sasl_ok says whether saslserver_init() worked.  conf and tls must
 * outlive the server.  0, or -1 (logged) when out of memory or when
 * virtdomains / defaultdomain are not valid (store/userid.h).  A mailbox list that
 * does not open is retried at each command that needs it (which answers
 * NO [UNAVAILABLE] meanwhile). */
int imap_server_new(const struct imapconf *conf, struct tls_server *tls,
                    int sasl_ok, struct imap_server **srv_r);
void imap_server_free(struct imap_server **srvp);

/* Serve one connection on p until LOGOUT, EOF, the autologout, a
 * shutdown (SIGTERM between commands) or a fatal stream error.  Does not
 * free p. */
void imap_serve(struct imap_server *srv, struct prot *p,
                const struct imap_conn *conn);

#endif
