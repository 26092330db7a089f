/*
 * quotacmd.h - the RFC 9208 QUOTA commands of imapd: GETQUOTA,
 * GETQUOTAROOT, SETQUOTA, over store/quota.h.
 *
 * Resources: STORAGE (KiB: usage shown rounded down, as Cyrus does) and
 * MESSAGE (messages).  A "* QUOTA root (...)" response lists the
 * resources of the root that have a limit, each as "NAME usage limit",
 * in one parenthesized list.  Quota roots are mailbox names written as
 * the client writes names (INBOX for the user's own).
 *
 * Permissions: SETQUOTA is for admins (of the root's domain) only, and
 * the root must be an existing mailbox.  SETQUOTA replaces every limit
 * of the root: a resource left out has no limit, and an empty list "()"
 * (cyradm "setquota MAILBOX none") removes the root.  GETQUOTAROOT needs
 * the r right on the mailbox (an admin: l); GETQUOTA an admin, the r right on the
 * root's mailbox, or a root at or below the user's own INBOX.
 */
#ifndef IMAPD_QUOTACMD_H
#define IMAPD_QUOTACMD_H

struct imap_session;

/* The capabilities the commands below implement. */
#define QUOTACMD_CAPABILITIES \
    "QUOTA QUOTA=RES-STORAGE QUOTA=RES-MESSAGE QUOTASET"

void quotacmd_getquota(struct imap_session *s);
void quotacmd_getquotaroot(struct imap_session *s);
void quotacmd_setquota(struct imap_session *s);

/* Bring the usage recorded for quota root `root` (an internal name) and
 * every mailbox below it in line with their index headers (each read
 * under its shared lock).  Mailboxes deleted meanwhile are skipped.
 * STORE_OK, or the first store error (logged). */
int quotacmd_recount(struct imap_session *s, const char *root);

#endif
