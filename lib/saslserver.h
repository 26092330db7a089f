/*
 * saslserver.h - server-side authentication through Cyrus SASL 2.1, for
 * lmtpd's AUTH (RFC 4954) and imapd's AUTHENTICATE / LOGIN.
 *
 * saslserver_init() once per process (after fork; it calls
 * sasl_server_init with an option callback that answers SASL's option
 * queries from imapd.conf's sasl_* keys: "pwcheck_method" is looked up as
 * imapd.conf's "sasl_pwcheck_method", and so on; a service-specific key
 * "SERVICE_sasl_KEY" is not supported).  Then one struct saslserver per
 * connection.  The service name given to SASL is "lmtp" or "imap".
 *
 * Security layers are never negotiated (max_ssf 0): TLS is the protection.
 * Plaintext mechanisms (PLAIN, LOGIN) are offered only when the connection
 * is under TLS or imapd.conf allows plaintext (allowplaintext: yes), as
 * SASL's SASL_SEC_NOPLAINTEXT property decides.
 */
#ifndef LIB_SASLSERVER_H
#define LIB_SASLSERVER_H

#include <stddef.h>

#include "lib/buf.h"
#include "lib/imapconf.h"

/* Once per process.  0, or -1 with a logged reason (then AUTH is not
 * offered).  conf must stay alive while SASL is used. */
int saslserver_init(const struct imapconf *conf, const char *appname);
/* At exit (sasl_server_done). */
void saslserver_done(void);

struct saslserver;

/* A SASL connection for service "lmtp"/"imap".  localaddr / remoteaddr:
 * "a.b.c.d;port" as SASL wants, or NULL (UNIX sockets).  tls_ssf: bits of
 * the TLS layer (0 = none); external_id: unused (NULL).  NULL on failure
 * (logged). */
struct saslserver *saslserver_new(const char *service, const char *localaddr,
                                  const char *remoteaddr, int tls_ssf);
/* The same with a canon function: every user id the client gives (the
 * authentication id and an authorization id), as `len` bytes at `in`,
 * goes through canon before SASL's own canonicalization and before the
 * password check, so the password is checked for canon's result and
 * saslserver_user() is that result.  canon returns 0 with the id in out,
 * or -1 with a reason in *error_r (static text): the exchange then fails
 * as SASLSERVER_FAIL and saslserver_error() is "user id refused:
 * REASON".  rock is passed to canon and must outlive the connection. */
typedef int saslserver_canon_fn(void *rock, const char *in, size_t len,
                                struct buf *out, const char **error_r);
struct saslserver *saslserver_new_canon(const char *service,
                                        const char *localaddr,
                                        const char *remoteaddr, int tls_ssf,
                                        saslserver_canon_fn *canon,
                                        void *rock);
void saslserver_free(struct saslserver **sp);
/* The "a.b.c.d;port" forms SASL wants of a connection's local and remote
 * addresses (IPv6 too), or "" for both on a UNIX socket.  Buffers of at
 * least SASLSERVER_ADDRLEN bytes.  Returns 1 for a TCP connection, else
 * 0. */
#define SASLSERVER_ADDRLEN 64
int saslserver_sockaddrs(int fd, char *local, char *remote);
/* Tell SASL that TLS is now on (after STARTTLS): the mechanism list
 * changes.  0 or -1. */
int saslserver_set_tls(struct saslserver *s, int tls_ssf);

/* The mechanisms to offer, space-separated ("PLAIN LOGIN SCRAM-SHA-256"),
 * into out.  0, or -1 when none is available. */
int saslserver_mechs(struct saslserver *s, struct buf *out);

enum saslserver_result {
    SASLSERVER_DONE = 0,      /* authenticated: saslserver_user() is valid */
    SASLSERVER_CONTINUE = 1,  /* send *challenge (base64, may be empty)
                                 as "334 ..." / "+ ..." and call step */
    SASLSERVER_FAIL = -1,     /* authentication failed (wrong password,
                                 unknown user): 535 5.7.8 / NO */
    SASLSERVER_NOMECH = -2,   /* mechanism unknown or not allowed here:
                                 504 5.5.4 / NO */
    SASLSERVER_BADB64 = -3,   /* the client's response is not base64:
                                 501 5.5.2 / BAD */
    SASLSERVER_CANCEL = -4,   /* the client sent "*": 501 5.0.0 / BAD */
    SASLSERVER_ERROR = -5     /* SASL internal trouble: 454 4.7.0 / NO */
};

/* Start mechanism mech with an optional initial response (base64 text as
 * the client sent it, "=" meaning empty; NULL = none).  On CONTINUE the
 * base64 challenge is put in challenge.  After DONE the connection stays
 * authenticated: a further start gives SASLSERVER_ERROR (the front end
 * answers a second AUTH with 503 before getting here).  After FAIL,
 * CANCEL or BADB64 a new start is fine. */
int saslserver_start(struct saslserver *s, const char *mech,
                     const char *initial_b64, struct buf *challenge);
/* The next client response (one base64 line, "*" to cancel). */
int saslserver_step(struct saslserver *s, const char *response_b64,
                    struct buf *challenge);
/* The authenticated (authorization) user id after DONE, else NULL. */
const char *saslserver_user(const struct saslserver *s);
/* After DONE with an authorization id other than the authentication id
 * (allowed only for imapd.conf's proxyservers, each entry canonicalized
 * as a login): the authentication id (the frontend's own), else NULL. */
const char *saslserver_proxy(const struct saslserver *s);
/* SASL's text for the last failure, for logs. */
const char *saslserver_error(const struct saslserver *s);

#endif
