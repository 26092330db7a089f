/*
 * autocreate.h - a user's INBOX made at its first use, with its standard
 * folders, as Cyrus's autocreate_* keys do (imapd.conf):
 *
 *   autocreate_quota          -1 = off (default); 0 = create, no quota
 *                             root; N > 0 = create and make the INBOX a
 *                             quota root of N KiB
 *   autocreate_post           yes (default): lmtpd creates a missing INBOX
 *                             it delivers to (imapd: at the login)
 *   autocreate_users          who: "anyone" (default) or user ids
 *                             separated by spaces or commas
 *   autocreate_inbox_folders  folders made below the INBOX, separated by
 *                             '|' ("Sent|Drafts|Trash|Junk|Archive"),
 *                             written as the client writes them
 *                             (unixhierarchysep)
 *   xlist-sent, xlist-drafts, xlist-trash, xlist-junk, xlist-archive,
 *   xlist-all, xlist-flagged
 *                             the folder name of autocreate_inbox_folders
 *                             that gets that special use (RFC 6154:
 *                             "xlist-sent: Sent" makes INBOX.Sent \Sent)
 *
 * The INBOX and every folder are subscribed.  Each mailbox is made with
 * mboxlist_create_special() (its special use in the same commit); a
 * folder that exists already is left alone; one that cannot be made is
 * logged and skipped (the INBOX is what matters).  Concurrent first uses
 * (two logins) are safe: mboxlist_create() lets one of them create.
 */
#ifndef STORE_AUTOCREATE_H
#define STORE_AUTOCREATE_H

#include "lib/imapconf.h"
#include "store/mboxlist.h"

/* Make `inbox` (the user's INBOX, "user.U" or "D!user.U") with its folders
 * when autocreate_quota >= 0, `userid` is in autocreate_users and the
 * INBOX does not exist.  *created_r (may be NULL) says whether this call
 * made it.  STORE_OK (also when nothing was to be done), or the error of
 * looking the INBOX up or of creating it (mboxlist_create()). */
int autocreate_inbox(const struct imapconf *conf, struct mboxlist *ml,
                     const char *userid, const char *inbox, int *created_r);

/* The special use autocreate gives a folder name (from the xlist-* keys),
 * "" for none, as a static string ("\Sent"). */
const char *autocreate_specialuse(const struct imapconf *conf,
                                  const char *folder);

#endif
