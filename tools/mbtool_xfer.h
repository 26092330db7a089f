/*
 * mbtool_xfer.h - mbtool's commands for moving a user between backends
 * (the frontend tier's moves, driven by cyr_user move):
 *
 *   mbtool user-dump [-n] USER      mark USER "moving" (store/userstate.h;
 *                                   -n: do not) and write USER's dump to
 *                                   stdout
 *   mbtool user-load USER           create USER from a dump on stdin; on
 *                                   success print "loaded USER mailboxes=N
 *                                   messages=M stamp=S"
 *   mbtool user-mark USER here|moving|moved BACKEND
 *   mbtool user-purge [-s STAMP] USER
 *                                   remove USER's mailboxes, quota roots,
 *                                   seen state, subscriptions and Sieve
 *                                   scripts; the mark stays; with -s only
 *                                   when the mailboxes are as the dump
 *                                   with that stamp saw them
 *   mbtool user-stamp USER          print the stamp of USER's mailboxes
 *
 * The dump format (version 2, lines end in LF, numbers decimal; user-load
 * reads version 1, which has no DUPLICATE lines, too):
 *   CYRUSDELIVER-XFER 2 USER
 *   QUOTA ROOT STORAGE_KB MESSAGES           (-1: no limit) per root
 *   MAILBOX NAME UIDVALIDITY UIDNEXT HIGHESTMODSEQ
 *   ACL TEXT                                 (the list entry's ACL)
 *   SPECIALUSE TEXT                          (may be empty)
 *   MESSAGE UID INTERNALDATE SYSFLAGS SIZE [KEYWORD ...]
 *   <SIZE bytes of the message> LF
 *   SEEN LASTREAD LASTUID LASTCHANGE SEENUIDS (the user's seen state of
 *                                             the mailbox, if any)
 *   ... (MAILBOX blocks in mailbox order, the INBOX first)
 *   SUBSCRIBE NAME                           per subscription
 *   SIEVE NAME ACTIVE SIZE  <SIZE bytes> LF  per script (ACTIVE 0 or 1)
 *   DUPLICATE TIME UID MAILBOX IDLEN  <IDLEN bytes: the Message-ID> LF
 *                                   per duplicate-delivery record of the
 *                                   user's mailboxes (store/duplicate.h):
 *                                   a message stored here whose 250 was
 *                                   lost is a duplicate after the move
 *   END MAILBOXES MESSAGES STAMP
 * Names are internal names (no spaces, store/mboxname.h).  Expunged
 * messages are not dumped.  STAMP is the CRC-32C of the lines "NAME
 * HIGHESTMODSEQ LF" of the mailboxes, in hex: user-purge -s compares it
 * with the mailboxes as they are, so a message that reached the old
 * backend after the dump is never removed with it (every visible change
 * raises HIGHESTMODSEQ; a reservation aborted after the dump, which
 * consumes a UID and stores nothing, does not).
 */
#ifndef TOOLS_MBTOOL_XFER_H
#define TOOLS_MBTOOL_XFER_H

#include "lib/imapconf.h"

/* Each returns mbtool's exit status (0 done, 1 failed, 2 usage); argv[0]
 * is the command's name. */
int mbtool_user_dump(const struct imapconf *conf, int argc, char **argv);
int mbtool_user_load(const struct imapconf *conf, int argc, char **argv);
int mbtool_user_mark(const struct imapconf *conf, int argc, char **argv);
int mbtool_user_purge(const struct imapconf *conf, int argc, char **argv);
int mbtool_user_stamp(const struct imapconf *conf, int argc, char **argv);

#endif
