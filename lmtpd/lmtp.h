/*
 * lmtp.h - the LMTP session engine (RFC 2033 over RFC 5321 syntax, with
 * PIPELINING, 8BITMIME, ENHANCEDSTATUSCODES, SIZE, STARTTLS, AUTH and
 * CHUNKING), run over a struct prot (lib/prot.h).
 *
 * One struct lmtp_server per process (created after fork: it holds the
 * store handles), and per connection either one lmtp_serve() call (the
 * connection has the process to itself) or a struct lmtp_session fed by
 * lmtp_session_input() whenever its socket polls readable (the process
 * holds several connections and serves whichever has a command).
 * Everything a connection allocates is freed when it ends; no client
 * input can end the process.
 *
 * Reply texts are fixed (doc: man/lmtpd.8).  A 250 for a recipient is
 * sent only after deliver_message() reported STORE_OK for it, i.e. after
 * the durable commit; with lmtp_proxy (a frontend: lmtp_proxy.h) only
 * after the recipient's backend answered 250, whose reply is relayed.
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

/* A session a process serves among others (lmtpd's worker waits for
 * all its connections in one poll(): lib/service.h service_main_mux()).
 * lmtp_session_new() sends the greeting; 0, or -1 (out of memory, or the
 * greeting could not be sent: the connection is over).  conn must
 * outlive the session. */
struct lmtp_session;
int lmtp_session_new(struct lmtp_server *srv, struct prot *p,
                     const struct lmtp_conn *conn, struct lmtp_session **s_r);

enum lmtp_session_state {
    LMTP_SESSION_IDLE = 0,   /* waits for its next command line */
    LMTP_SESSION_DONE = 1    /* over: lmtp_session_free() */
};
/* The connection polled readable: read what is there without waiting and
 * serve every whole command line buffered (a command itself, DATA, BDAT,
 * AUTH, STARTTLS, reads and waits as in lmtp_serve(), with the
 * lmtp_timeout).  LMTP_SESSION_IDLE once no whole line is left (replies
 * flushed), or LMTP_SESSION_DONE (QUIT, EOF, a timeout inside a command,
 * an error, SIGTERM). */
int lmtp_session_input(struct lmtp_session *s);
/* 1 between MAIL and the end of its transaction. */
int lmtp_session_in_transaction(const struct lmtp_session *s);

enum lmtp_session_end {
    LMTP_END_TIMEOUT,        /* 421 4.4.2 Timeout (lmtp_timeout) */
    LMTP_END_IDLE,           /* 421 4.4.2 Idle too long (lmtp_idle_timeout) */
    LMTP_END_STOP            /* 421 4.3.2 Service shutting down */
};
/* End an idle session: the 421 for why, then lmtp_session_free(). */
void lmtp_session_end(struct lmtp_session **sp, enum lmtp_session_end why);
/* Free the session (not the prot); sets *sp NULL; no-op on NULL. */
void lmtp_session_free(struct lmtp_session **sp);

#endif
