/*
 * received.h - what lmtpd reads from the client's Received header fields
 * for its log lines.
 */
#ifndef LMTPD_RECEIVED_H
#define LMTPD_RECEIVED_H

#include <stddef.h>

#define RECEIVED_QID_MAX 64     /* a queue id longer than this is cut */

/* The queue id the sending MTA gave the message: the token after the
 * word "id" in the topmost Received field of the header (hdr, len: the
 * client's header bytes or the whole message; the search stops at the
 * first empty line).  Postfix writes "with LMTP id 4ABC123" or "with
 * ESMTP id 4ABC123;"; sendmail, Exim and cyrusdeliver itself write an id
 * clause too.  The field name matches case-insensitively and folded
 * lines are joined; the token ends at white space, ';', '(' or ')' and
 * holds only letters, digits and "._-+=@/" (anything else ends it too),
 * at most RECEIVED_QID_MAX bytes.  The id is copied NUL-terminated into
 * out (outsize >= 1).  Returns 1 when an id was found, else 0 with out
 * "" (no Received field, no id clause in the topmost one, or an empty
 * token).  Reads nothing beyond hdr + len. */
int received_queue_id(const char *hdr, size_t len, char *out,
                      size_t outsize);

#endif
