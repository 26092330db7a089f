/*
 * subs.h - per-user subscriptions: CONFIGDIR/user/H/USER.sub, backend
 * `subscription_db`.  Key: internal mailbox name; value: empty.
 * Subscribing to a name that does not exist is allowed (RFC 3501 6.3.6).
 */
#ifndef STORE_SUBS_H
#define STORE_SUBS_H

#include "lib/imapconf.h"

struct subs_db;

/* Open (creating, with its directory) the subscription file of `userid`,
 * CYRUSDB_MBOXSORT order.  Per process, after fork().  STORE_OK,
 * STORE_BADNAME (userid refused as by seen_open()), STORE_IOERROR. */
int subs_open(const struct imapconf *conf, const char *userid,
              struct subs_db **s_r);
void subs_close(struct subs_db **sp);

/* STORE_OK (also when already subscribed), STORE_BADNAME (the name fails
 * mboxname_check), STORE_IOERROR. */
int subs_add(struct subs_db *s, const char *mailbox);
/* STORE_OK, STORE_NOTFOUND (was not subscribed), STORE_IOERROR.  The name
 * is not checked, so that a name subscribed under older rules can go. */
int subs_remove(struct subs_db *s, const char *mailbox);
/* 1 subscribed, 0 not, negative store code on error. */
int subs_is_subscribed(struct subs_db *s, const char *mailbox);

/* Every subscribed name matching the IMAP pattern (mboxname_match, '.'),
 * in mailbox order ('.' before every other byte: "user.a", "user.a.x",
 * "user.a-b"); cb returning non-zero stops and is returned.  The names
 * are collected first and cb is called after the walk, so cb may call
 * subs_* on the same handle.  Returns 0, cb's value, or a store code
 * (STORE_IOERROR, STORE_NOMEM). */
typedef int subs_cb_fn(void *rock, const char *mailbox);
int subs_list(struct subs_db *s, const char *pattern, subs_cb_fn *cb,
              void *rock);

/* Remove a user's subscription file (user deletion), or move it to another
 * user (user rename: records copied in one transaction into the new
 * user's file, created if missing, then the old file removed; names
 * "user.OLD" and "user.OLD.*" become "user.NEW" and "user.NEW.*", as Cyrus
 * does; rerunning after a crash completes it).  No process may have the
 * files open.  STORE_OK, STORE_NOTFOUND (no file for the old user),
 * STORE_BADNAME, STORE_IOERROR. */
int subs_delete_user(const struct imapconf *conf, const char *userid);
int subs_rename_user(const struct imapconf *conf, const char *olduser,
                     const char *newuser);

#endif
