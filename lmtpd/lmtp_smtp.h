/*
 * lmtp_smtp.h - Sieve's outgoing messages (redirect, vacation) handed to
 * the MTA over SMTP (smtp_backend: host) instead of a `sendmail` process.
 *
 * One connection per lmtpd process, opened at the first message and kept
 * open between messages (RSET before each transaction on a connection
 * already used); a connection that fails or was closed by the MTA is
 * dropped and, when nothing of the message was accepted yet, opened again
 * once for the same message.
 *
 *   struct lmtp_smtp *sm = lmtp_smtp_new(conf);
 *   if (lmtp_smtp_send(sm, "<>", "sender@example.net", head, hlen,
 *                      body, blen, timeout_s) == 0)
 *       ... the MTA answered 250 to the message's end of data ...
 *   lmtp_smtp_free(&sm);
 *
 * smtp_host (imapd.conf) names the MTA: HOST[:PORT] (port 587 when not
 * given; [ADDRESS]:PORT for IPv6) or the path of a UNIX socket (begins
 * with '/').  Cyrus's "/noauth" suffix is accepted (no authentication is
 * done in any case); "/tls" is refused (every send fails, logged).
 */
#ifndef LMTPD_LMTP_SMTP_H
#define LMTPD_LMTP_SMTP_H

#include <stddef.h>

#include "lib/imapconf.h"

struct lmtp_smtp;

/* A client for the configuration conf (kept: it must outlive the
 * client); NULL when out of memory.  Nothing is connected yet. */
struct lmtp_smtp *lmtp_smtp_new(const struct imapconf *conf);

/* Send one message from `from` ("<>" or "" for the null sender) to `to`,
 * the bytes head then body (line ends LF or CRLF; dot-stuffed here),
 * within timeout_s seconds.  0 when the MTA accepted it (250 after the
 * data), -1 otherwise (logged with the MTA's answer). */
int lmtp_smtp_send(struct lmtp_smtp *sm, const char *from, const char *to,
                   const char *head, size_t headlen, const char *body,
                   size_t bodylen, long timeout_s);

/* Messages sent and connections opened since lmtp_smtp_new(). */
unsigned long lmtp_smtp_sent(const struct lmtp_smtp *sm);
unsigned long lmtp_smtp_connects(const struct lmtp_smtp *sm);

/* QUIT (without waiting long) and close; *smp set to NULL. */
void lmtp_smtp_free(struct lmtp_smtp **smp);

#endif
