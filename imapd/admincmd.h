/*
 * admincmd.h - what imapd's admins do to other users, as Cyrus allows:
 * deleting a user's INBOX deletes the user (imapd.conf `admins`; a
 * domain's admin in its domain only).
 *
 * Renaming a user's INBOX to another user's INBOX renames the user.
 * Creating a user is creating its INBOX ("user.bob", "user.bob@D" for a
 * global admin with virtual domains): plain CREATE, which gives the
 * owner the store's default rights (mboxlist_create).
 */
#ifndef IMAPD_ADMINCMD_H
#define IMAPD_ADMINCMD_H

#include "lib/buf.h"

struct imap_session;

/* Is internal name `name` a user's INBOX ("user.U" or "D!user.U")?  The
 * user id (internal form, '.' for '^') into userid when not NULL.  1 or
 * 0. */
int admincmd_is_user_inbox(const char *name, struct buf *userid);

/* DELETE of the user INBOX `inbox` (internal name, looked up, the
 * session an admin for it): the INBOX and every mailbox below it
 * (mboxlist_delete MBOXLIST_RECURSIVE, delete_mode applies), the quota
 * root of the INBOX, the user's seen state and subscriptions.  Answers
 * the command. */
void admincmd_delete_user(struct imap_session *s, const char *inbox);

/* RENAME of the user INBOX `oldinbox` (looked up, the session an admin
 * for it, `newinbox` free and creatable) to another user's INBOX: the
 * tree (mboxlist_rename), the quota root of the INBOX (limits kept,
 * usage recounted), the seen state and the subscriptions.  A new name
 * that is not a user's INBOX is refused (NO [CANNOT]).  Answers the
 * command. */
void admincmd_rename_user(struct imap_session *s, const char *oldinbox,
                          const char *newinbox);

#endif
