/*
 * quota.h - quota roots: CONFIGDIR/quotas.db, backend `quota_db`.
 *
 * A quota root is a mailbox name; it covers that mailbox and every mailbox
 * below it, unless a deeper root covers them (the nearest root wins, as
 * in Cyrus).  Limits: storage in KiB and a message count, each -1 for "no
 * limit".  Usage is exact under concurrent appends and expunges, and
 * after a crash, because it is not kept as a running sum that a lost
 * update would skew.  Records (text values):
 *
 *   "R" ROOT             -> "STORAGE_LIMIT_KB MESSAGE_LIMIT USED_BYTES USED_MESSAGES"
 *   "M" MAILBOX          -> "ROOT USED_BYTES USED_MESSAGES"
 *
 * The M record is the mailbox's contribution as of its last update.
 * quota_update_mailbox() (quota_update_many() for several mailboxes)
 * sets it to the index header's current values and moves the root's usage
 * by the difference, in one cyrusdb transaction: idempotent, and
 * self-correcting after a crash between an index change and the quota
 * update (mailbox_lock(EXCLUSIVE) calls it when they differ).
 */
#ifndef STORE_QUOTA_H
#define STORE_QUOTA_H

#include <stddef.h>
#include <stdint.h>

#include "lib/buf.h"
#include "lib/imapconf.h"

#define QUOTA_FNAME "quotas.db"
#define QUOTA_UNLIMITED (-1LL)
/* Largest limits quota_set() takes (the storage limit in bytes then fits a
 * long long). */
#define QUOTA_STORAGE_MAX_KB (9223372036854775807LL / 1024)
#define QUOTA_MESSAGE_MAX 9223372036854775807LL

struct quota_db;

struct quota {
    long long storage_limit_kb;   /* QUOTA_UNLIMITED or >= 0 */
    long long message_limit;      /* QUOTA_UNLIMITED or >= 0 */
    uint64_t used_bytes;
    uint64_t used_messages;
};

/* Open (creating) the quota database, CYRUSDB_MBOXSORT order (the file is
 * always opened so).  Per process, after fork().  STORE_OK, STORE_IOERROR
 * (configdirectory unset, file unusable), STORE_NOMEM.
 *
 * Every function below takes names of 1..MBOXNAME_MAX bytes and gives
 * STORE_BADNAME for others; STORE_BUSY when the database stayed locked
 * (a transaction that lost a deadlock is retried a few times first). */
int quota_open(const struct imapconf *conf, struct quota_db **q_r);
void quota_close(struct quota_db **qp);

/* The process's shared handle, opened on first use: what the mailbox
 * engine and appends use, so that a process never has two handles on
 * quotas.db at once (LMDB in particular must not see one environment
 * opened twice in a process).  The caller must not close it.  Reopened
 * when the configuration (configdirectory, quota_db) differs from the
 * last call's, and in a child after fork() (the parent's handle is left
 * alone, never used).  STORE_OK, or quota_open()'s errors. */
int quota_shared(const struct imapconf *conf, struct quota_db **q_r);
/* Close the shared handle (no-op when none is open in this process). */
void quota_shared_close(void);

/* The nearest quota root of a mailbox into root (the name itself, or an
 * ancestor: "user.a.b", then "user.a", then "user").  STORE_OK,
 * STORE_NOTFOUND (no root covers it), STORE_IOERROR. */
int quota_findroot(struct quota_db *q, const char *mailbox, struct buf *root);

/* Read a root.  STORE_OK, STORE_NOTFOUND, STORE_CORRUPT, STORE_IOERROR. */
int quota_get(struct quota_db *q, const char *root, struct quota *quota_r);

/* Create a root or change its limits (usage kept).  A new root starts at
 * zero usage: callers (mbtool) then call quota_update_mailbox() for every
 * mailbox it covers (which moves each mailbox's usage over from the root
 * that covered it before).  A damaged R record is rewritten with zero
 * usage (logged).  STORE_OK, STORE_BADNAME (root fails mboxname_check),
 * STORE_INTERNAL (a limit below -1 or above QUOTA_STORAGE_MAX_KB /
 * QUOTA_MESSAGE_MAX: callers validate user input), STORE_IOERROR. */
int quota_set(struct quota_db *q, const char *root,
              long long storage_limit_kb, long long message_limit);

/* Remove a root and the M records that point at it, in one transaction.
 * The mailboxes it covered count toward the next root up (if any) from
 * their next quota_update_mailbox().  STORE_OK, STORE_NOTFOUND (no such
 * root), STORE_IOERROR. */
int quota_remove(struct quota_db *q, const char *root);

/* Would adding (bytes, messages) to the root covering `mailbox` pass a
 * limit?  STORE_OK (or no root), STORE_OVERQUOTA, STORE_CORRUPT (the root
 * record is damaged), STORE_IOERROR.  As in Cyrus, a resource is over
 * when the addition is positive and usage + addition is greater than the
 * limit (storage limit * 1024 bytes; message limit): reaching the limit
 * exactly is allowed, and an addition of zero never fails even when usage
 * is already above the limit.  A limit of -1 is never passed.  When not
 * NULL, *warn_r is set to 1 when usage after the addition reaches (>=)
 * `quotawarn` percent of a positive limit, else 0. */
int quota_check(struct quota_db *q, const char *mailbox, uint64_t bytes,
                uint64_t messages, int *warn_r);

/* Set mailbox's contribution to (used_bytes, used_messages), moving its
 * root's usage by the difference (one transaction); when the mailbox has
 * no root, any stale M record is removed.  Same values as last time: no
 * write at all.  When the M record names another root than the nearest
 * one now, its old contribution leaves that root and the new one joins
 * the nearest.  A usage that would go below zero is clamped (logged).  A
 * damaged M record is replaced (logged; its old share of the root is
 * unknown).  STORE_OK, STORE_CORRUPT (the root record is damaged),
 * STORE_IOERROR. */
int quota_update_mailbox(struct quota_db *q, const char *mailbox,
                         uint64_t used_bytes, uint64_t used_messages);

/* The same as quota_update_mailbox(mailboxes[i], used_bytes[i],
 * used_messages[i]) for i = 0 .. n-1 in that order, in ONE cyrusdb
 * transaction (one commit, however many roots it touches): all of the
 * updates or none (an error leaves the database as it was).  A name given
 * twice ends with its last values.  n == 0: STORE_OK, nothing done.  The
 * errors of quota_update_mailbox(), STORE_BADNAME for any bad name
 * (nothing done), STORE_NOMEM, STORE_INTERNAL (NULL arrays with n > 0).
 * A delivery to many mailboxes reports them all with one call
 * (mailbox_append_finish_many()). */
int quota_update_many(struct quota_db *q, const char *const *mailboxes,
                      const uint64_t *used_bytes,
                      const uint64_t *used_messages, size_t n);

/* Forget a mailbox (deleted or renamed away): its usage leaves its root.
 * STORE_OK (also when the mailbox had no M record), STORE_IOERROR. */
int quota_remove_mailbox(struct quota_db *q, const char *mailbox);

#endif
