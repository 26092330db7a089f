/*
 * proxy.h - imapd as a frontend (imap_proxy: yes): after a user logs in
 * here, the session is opened on the user's backend and relayed.
 *
 * The backend comes from the directory (store/directory.h: user id ->
 * backend name) and proxy_imap_backends (NAME=HOST:PORT of each
 * backend's IMAP service).  The frontend connects, reads the greeting,
 * runs STARTTLS when proxy_starttls is on (the backend's certificate is
 * verified against tls_client_ca_file and must name HOST), and
 * authenticates with SASL PLAIN as proxy_authname / proxy_password with
 * the user as authorization id; the backend allows that only for the
 * names in its proxyservers.  From then on the frontend copies bytes
 * both ways and interprets nothing: every command, literal, IDLE and
 * COMPRESS is the backend's business.
 *
 * Replies the client sees when the session cannot be opened (its login
 * was right, so the text says what is wrong and that it is temporary):
 *   NO [UNAVAILABLE] Mail directory not reachable, try again later
 *   NO [UNAVAILABLE] No mail server known for this user
 *   NO [UNAVAILABLE] Mail server not reachable, try again later
 * and the details go to the log.  When the backend goes away during the
 * session the client gets "* BYE Mail server connection lost" (unless
 * the backend said BYE itself, or COMPRESS made the stream opaque) and
 * the connection is closed; a new login tries again.
 *
 * Per process (after fork), not thread-safe; one session at a time.
 */
#ifndef IMAPD_PROXY_H
#define IMAPD_PROXY_H

#include <stddef.h>

#include "lib/buf.h"
#include "lib/imapconf.h"

struct prot;
struct imap_proxy;

/* The frontend's state from conf (which must outlive it): the backend
 * list, the directory, the TLS client context.  0, or -1 with
 * *error_r (static text). */
int imap_proxy_new(const struct imapconf *conf, struct imap_proxy **px_r,
                   const char **error_r);
void imap_proxy_free(struct imap_proxy **pxp);

/* Open userid's session on its backend.  0: caps holds the backend's
 * capability list after its login, *backend_r its name (owned by px).
 * -1: reply holds the text of the tagged NO for the client (logged
 * here). */
int imap_proxy_open(struct imap_proxy *px, const char *userid,
                    struct buf *caps, const char **backend_r,
                    struct buf *reply);

/* Relay between client (its socket client_fd) and the open backend
 * session until one of them
 * ends it, the session is silent both ways for timeout seconds, or the
 * process is told to stop; the backend connection is closed afterwards.
 * Returns the session's end reason: "logout" (the backend closed after
 * its BYE), "disconnect" (the client went away), "backend" (the backend
 * went away without BYE), "autologout", "shutdown", "error". */
const char *imap_proxy_relay(struct imap_proxy *px, struct prot *client,
                             int client_fd, int timeout);

#endif
