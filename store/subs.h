/*
 * subs.h - per-user subscriptions: CONFIGDIR/user/H/USER.sub, backend
 * `subscription_db`.  Key: internal mailbox name; value: empty.
 * Subscribing to a name that does not exist is allowed (RFC 3501 6.3.6).
 */
#ifndef STORE_SUBS_H
#define STORE_SUBS_H

#include "lib/imapconf.h"

struct subs_db;

int subs_open(const struct imapconf *conf, const char *userid,
              struct subs_db **s_r);
void subs_close(struct subs_db **sp);

/* STORE_OK (also when already subscribed), STORE_BADNAME, STORE_IOERROR. */
int subs_add(struct subs_db *s, const char *mailbox);
/* STORE_OK, STORE_NOTFOUND (was not subscribed), STORE_IOERROR. */
int subs_remove(struct subs_db *s, const char *mailbox);
/* 1 subscribed, 0 not, negative store code on error. */
int subs_is_subscribed(struct subs_db *s, const char *mailbox);

/* Every subscribed name matching the IMAP pattern (mboxname_match, '.'),
 * in mailbox order; cb returning non-zero stops and is returned. */
typedef int subs_cb_fn(void *rock, const char *mailbox);
int subs_list(struct subs_db *s, const char *pattern, subs_cb_fn *cb,
              void *rock);

int subs_delete_user(const struct imapconf *conf, const char *userid);
int subs_rename_user(const struct imapconf *conf, const char *olduser,
                     const char *newuser);

#endif
