/*
 * lmtp_proxy.h - the LMTP client of a frontend lmtpd (lmtp_proxy: yes):
 * the backends it knows, one pooled connection per backend per process,
 * and one pipelined transaction per backend and message.
 *
 * Backends come from imapd.conf's proxy_backends: space-separated
 * NAME=ADDRESS, NAME as store/directory.h's backend names, ADDRESS
 * "host:port", "[v6addr]:port" or "/path" (a UNIX socket).  The backend's
 * LMTP service must let this client send MAIL without AUTH (a UNIX socket,
 * or a TCP service run with lmtpd -a) and offer PIPELINING.
 *
 * A transaction (lmtp_proxy_send, one per backend and message, all of a
 * message's backends at once) on a connection kept from an earlier one
 * starts with RSET; then MAIL, every RCPT and DATA go out in one
 * write, the replies are read in order, and after 354 the message follows
 * (dot-stuffed) and one reply per accepted recipient is read.  Every
 * recipient gets a reply of its own: the backend's reply to its RCPT
 * when that was not 2xx, the backend's reply to MAIL or DATA when those
 * failed, else the backend's reply after the message: the code, enhanced
 * code and text the backend sent (control bytes replaced by '?').  When
 * the backend cannot be reached, stops answering for proxy_timeout
 * seconds, closes the connection, or answers something that is not an
 * LMTP reply, every recipient still without a reply gets
 *   451 4.4.1 Backend not reachable, try again later   (connect failed)
 *   451 4.4.2 Backend connection lost, try again later (EOF, timeout)
 *   451 4.4.0 Backend protocol error, try again later  (garbage)
 * and the connection is closed.  A backend that made a transaction wait
 * proxy_timeout (connect, or any reply) is held down for 5 seconds: its
 * recipients get the 4.4.1 reply at once, so a backend that swallows
 * packets costs one wait per 5 seconds, not one per message.  A kept
 * connection that turns out to be
 * closed before its RSET was answered is replaced once by a new one (the
 * backend's idle timeout), invisible to the client.
 *
 * Per process (after fork), not thread-safe.  Timeouts and errors live
 * here; the caller sees a call that fills one reply per recipient.
 */
#ifndef LMTPD_LMTP_PROXY_H
#define LMTPD_LMTP_PROXY_H

#include <stddef.h>
#include <stdint.h>

#include "lib/imapconf.h"

struct lmtp_proxy;

/* The backends of conf's proxy_backends (conf must outlive the proxy);
 * no connection is made yet.  0, or -1 with *error_r (static text) for
 * a malformed list (an entry without '=', a bad name, a name twice, an
 * empty address) or out of memory. */
int lmtp_proxy_new(const struct imapconf *conf, struct lmtp_proxy **px_r,
                   const char **error_r);
/* Closes every pooled connection (QUIT sent, not waited for). */
void lmtp_proxy_free(struct lmtp_proxy **pxp);

/* The index of the backend called name, or -1 when there is none. */
int lmtp_proxy_find(const struct lmtp_proxy *px, const char *name);
/* The name of backend index i. */
const char *lmtp_proxy_name(const struct lmtp_proxy *px, int i);

/* One backend's share of a message: its recipients (the forward-paths
 * as the client wrote them, without <>) and, filled in by
 * lmtp_proxy_send(), one reply each (malloc'd, the caller frees; lines
 * joined by CRLF, no final CRLF; NULL when memory ran out: the caller
 * answers 451 4.3.0 then). */
struct lmtp_proxy_group {
    int backend;                 /* lmtp_proxy_find()'s index */
    const char *const *rcpts;
    size_t n;
    char **replies;
};

/* One message for the backends of groups[0..ngroups) (each backend at
 * most once).  sender: the reverse-path without <>; smtputf8: the
 * client's MAIL had SMTPUTF8; path: the message file (CRLF line ends),
 * size its bytes.  Every backend gets its commands and then its message
 * before any final reply is awaited, so the backends store in parallel;
 * a failing backend affects only its own group. */
void lmtp_proxy_send(struct lmtp_proxy *px, const char *sender,
                     int smtputf8, const char *path, uint64_t size,
                     struct lmtp_proxy_group *groups, size_t ngroups);

#endif
