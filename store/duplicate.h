/*
 * duplicate.h - the duplicate delivery database: CONFIGDIR/deliver.db,
 * backend `duplicate_db`.
 *
 * Key: MESSAGE-ID NUL MAILBOX (the Message-ID as found in the header,
 * angle brackets included, and the internal mailbox name).  Value:
 * "TIME UID" (decimal seconds since the epoch, and the uid given in that
 * mailbox, 0 when unknown), or, for a record that names the copy being
 * stored (a delivery's, see duplicate_mark_copies()), "TIME UID
 * UIDVALIDITY GUID" (UID: the lowest uid the copy can get; GUID: the
 * message's SHA-1 in 40 lower-case hex digits).  A lost
 * record can only cause a second copy of a message, never a lost one;
 * that is why the file is opened with CYRUSDB_NOSYNC whatever the backend
 * (and why a no-sync backend such as db3-nosync was always a sound choice
 * here).
 */
#ifndef STORE_DUPLICATE_H
#define STORE_DUPLICATE_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "lib/imapconf.h"

#define DUPLICATE_FNAME "deliver.db"
#define DUPLICATE_ID_MAX 400   /* longer Message-IDs are not tracked */
/* Nor pairs whose key (id, NUL, mailbox) is longer than this: the longest
 * key every cyrusdb backend takes (LMDB's limit, applied to all). */
#define DUPLICATE_KEY_MAX 511
#define DUPLICATE_GUID_LEN 20  /* SHA-1, as MAILBOX_DIGEST_LEN */

/* The copy a delivery's record names: the lowest uid it can have in the
 * mailbox (its uidnext before the reservation), the mailbox's uidvalidity
 * and the message's GUID. */
struct duplicate_copy {
    uint32_t uid;
    uint32_t uidvalidity;
    unsigned char guid[DUPLICATE_GUID_LEN];
};

struct duplicate_db;

/* Open (creating) CONFIGDIR/deliver.db, plain byte order, with
 * CYRUSDB_NOSYNC: commits are not durable (a crash of the machine may lose
 * the last records; a killed process loses nothing).  A damaged file
 * (the open fails with an I/O or format error) is renamed to
 * deliver.db.damaged-YYYYMMDDTHHMMSSZ, logged, and replaced by a fresh
 * empty one; concurrent openers agree on one rename.  Per process, after
 * fork().  STORE_OK, STORE_IOERROR (also a file that cannot be read or set
 * aside: permissions), STORE_NOSPACE, STORE_BUSY, STORE_NOMEM. */
int duplicate_open(const struct imapconf *conf, struct duplicate_db **d_r);
void duplicate_close(struct duplicate_db **dp);

/* Was (id, mailbox) delivered?  STORE_OK with *time_r (and *uid_r when not
 * NULL) when yes, STORE_NOTFOUND when no (also for an id that is empty,
 * over DUPLICATE_ID_MAX or holds a NUL byte, for a mailbox that is empty,
 * when the key would pass DUPLICATE_KEY_MAX, and for a damaged record, which is
 * logged: a lost record may only cause a second copy), STORE_IOERROR,
 * STORE_BUSY. */
int duplicate_check(struct duplicate_db *d, const char *id, size_t idlen,
                    const char *mailbox, time_t *time_r, uint32_t *uid_r);

/* Record a delivery (replacing an older record).  STORE_OK, STORE_IOERROR;
 * an id or mailbox that duplicate_check() cannot track (see there) is
 * silently not recorded (STORE_OK): it cannot be checked either.
 * STORE_INTERNAL for when < 0. */
int duplicate_mark(struct duplicate_db *d, const char *id, size_t idlen,
                   const char *mailbox, time_t when, uint32_t uid);

/* duplicate_check() that also tells whether the record names its copy:
 * *named_r = 1 and *copy_r filled for a "TIME UID UIDVALIDITY GUID"
 * record, *named_r = 0 for the plain "TIME UID" form (a record of Sieve,
 * of a move, or of an older version: the delivery counts as done).
 * Same results as duplicate_check(). */
int duplicate_check_copy(struct duplicate_db *d, const char *id,
                         size_t idlen, const char *mailbox, time_t *time_r,
                         int *named_r, struct duplicate_copy *copy_r);

/* Record, in ONE transaction, that the message `id` is about to be stored
 * in n mailboxes, copies[i] in mailboxes[i] (written BEFORE it is
 * reserved: a reader of the record checks that the named copy was
 * committed, see store/deliver.c).  All or nothing, untrackable keys
 * skipped, results as duplicate_mark_many(). */
int duplicate_mark_copies(struct duplicate_db *d, const char *id,
                          size_t idlen, const char *const *mailboxes,
                          const struct duplicate_copy *copies, size_t n,
                          time_t when);

/* Record one message's delivery to n mailboxes (uids[i] in mailboxes[i])
 * in ONE transaction: one durable commit instead of n, which is what a
 * multi-recipient delivery needs.  All or nothing: on error no record of
 * the call is written.  Untrackable keys are skipped as in
 * duplicate_mark().  STORE_OK, STORE_IOERROR, STORE_BUSY, STORE_NOMEM. */
int duplicate_mark_many(struct duplicate_db *d, const char *id, size_t idlen,
                        const char *const *mailboxes, const uint32_t *uids,
                        size_t n, time_t when);

/* Call cb(rock, id, idlen, mailbox, mboxlen, when, uid, copy) for every
 * record of deliver.db in key order (damaged records are skipped; mailbox
 * is not NUL-terminated; copy is the copy a record of the long form
 * names, NULL for a short one); a non-zero return of cb ends the walk
 * (and is no error).  cb must not change the database (one read walk: a
 * move's dump carries a user's records to the new backend, so that a
 * message delivered before the move is still known there, and one never
 * stored is not taken for delivered).  STORE_OK, STORE_IOERROR,
 * STORE_BUSY. */
typedef int duplicate_foreach_cb(void *rock, const char *id, size_t idlen,
                                 const char *mailbox, size_t mboxlen,
                                 time_t when, uint32_t uid,
                                 const struct duplicate_copy *copy);
int duplicate_foreach(struct duplicate_db *d, duplicate_foreach_cb *cb,
                      void *rock);

/* The GUID as 40 lower-case hex digits and a NUL into out. */
void duplicate_guid_hex(const unsigned char *guid,
                        char out[2 * DUPLICATE_GUID_LEN + 1]);
/* 40 hex digits (lower case) at hex into guid: 0, or -1. */
int duplicate_guid_parse(const char *hex, size_t len, unsigned char *guid);

/* Delete every record older than `days` days (TIME < now - days * 86400),
 * and every damaged record; *pruned_r / *kept_r (may be NULL) get the
 * counts.  Deletes run in transactions of at most 1000 records, so
 * deliveries wait at most one batch, and memory is bounded (a few MiB of
 * keys at a time) whatever the size of the database.  A record marked
 * again while the prune runs is kept.  On error, the batches committed
 * before it stay pruned.  STORE_OK, STORE_IOERROR, STORE_BUSY, STORE_NOMEM,
 * STORE_INTERNAL (days < 0). */
int duplicate_prune(struct duplicate_db *d, int days,
                    unsigned long *pruned_r, unsigned long *kept_r);
/* duplicate_prune() with the age counted from `now` instead of the
 * current time (cyr_expire's clock). */
int duplicate_prune_at(struct duplicate_db *d, int days, time_t now,
                       unsigned long *pruned_r, unsigned long *kept_r);

#endif
