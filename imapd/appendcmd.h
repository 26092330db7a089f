/*
 * appendcmd.h - imapd's APPEND command: RFC 3501 APPEND with MULTIAPPEND
 * (RFC 3502), CATENATE (RFC 4469), literal8 (RFC 3516 BINARY), UTF8
 * data (RFC 6855) and APPENDLIMIT (RFC 7889, maxmessagesize).
 *
 * appendcmd_append() runs one APPEND (imapcmd.h) in the authenticated or
 * selected state: it reads the command's events (imapparse.h) one by
 * one, the first read with the command, stages each message, and at the
 * line's end stores all of them in one append transaction or none; it
 * sends the tagged reply ("OK [APPENDUID v set]", or the first failure:
 * NO [TRYCREATE], [TOOBIG], [LIMIT], [BADURL ...], [OVERQUOTA], ..., or
 * BAD), or ends the session when the client is gone.
 *
 * While it reads the data, the session's continuation callback asks
 * appendcmd_more() whether a further data literal of `size` octets may
 * come: 0 yes; 1 (a NO) or 2 (a BAD) no, *error_r the reply text.  The
 * command holds its state in a struct appendcmd it hands the session
 * (imap_set_append()) for that time.
 */
#ifndef IMAPD_APPENDCMD_H
#define IMAPD_APPENDCMD_H

#include <stddef.h>

struct imap_session;
struct imapparse_cmd;
struct appendcmd;

/* Messages in one APPEND: each holds a staging file open until the
 * commit. */
#define APPENDCMD_MAX_MESSAGES 200

void appendcmd_append(struct imap_session *s);

int appendcmd_more(struct appendcmd *a, const struct imapparse_cmd *c,
                   int utf8_accept, size_t size, const char **error_r);

#endif
