/*
 * managesieve.h - the ManageSieve protocol (RFC 5804) on one connection:
 * what timsieved runs for each client.  Scripts are stored through
 * store/sievedir.h and checked with sieve_compile() (sieve/sieve.h).
 *
 * Commands: CAPABILITY, STARTTLS, AUTHENTICATE (Cyrus SASL, initial
 * response), LOGOUT, NOOP in any state; once authenticated HAVESPACE,
 * PUTSCRIPT, CHECKSCRIPT, LISTSCRIPTS, SETACTIVE, GETSCRIPT,
 * DELETESCRIPT, RENAMESCRIPT, UNAUTHENTICATE.  The protocol details, the
 * limits and the imapd.conf keys are in man/timsieved.8.
 */
#ifndef TIMSIEVED_MANAGESIEVE_H
#define TIMSIEVED_MANAGESIEVE_H

#include "lib/imapconf.h"

struct prot;
struct tls_server;
struct managesieve_server;

/* How a connection came in. */
struct managesieve_conn {
    const char *peer;        /* service_main's peer text */
    const char *localaddr;   /* "a.b.c.d;port" for SASL, or NULL */
    const char *remoteaddr;  /* "a.b.c.d;port" for SASL, or NULL */
    int fd;                  /* the socket (virtdomains: on), or -1 */
};

/* The per-process part, from imapd.conf (conf must outlive it).  tls
 * may be NULL (no STARTTLS); sasl_ok: saslserver_init() succeeded.
 * 0, or -1 with the reason logged. */
int managesieve_server_new(const struct imapconf *conf,
                           struct tls_server *tls, int sasl_ok,
                           struct managesieve_server **srv_r);
void managesieve_server_free(struct managesieve_server **srvp);

/* Serve one connection on p from the greeting to LOGOUT, EOF, a
 * timeout, a fatal protocol error or the master's SIGTERM. */
void managesieve_serve(struct managesieve_server *srv, struct prot *p,
                       const struct managesieve_conn *conn);

#endif
