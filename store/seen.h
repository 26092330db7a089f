/*
 * seen.h - per-user seen state: CONFIGDIR/user/H/USER.seen, backend
 * `seenstate_db` (H = the user's hash letter, as mboxname_hash_letter()).
 *
 * Key: the mailbox's unique id.  Value (Cyrus 2.x layout):
 *   "VERSION LASTREAD LASTUID LASTCHANGE SEENUIDS"
 * VERSION 1; times in seconds; SEENUIDS an IMAP sequence set of uids
 * ("1:5,7,9:12", "" for none).
 */
#ifndef STORE_SEEN_H
#define STORE_SEEN_H

#include <stdint.h>
#include <time.h>

#include "lib/buf.h"
#include "lib/imapconf.h"

struct seen_db;

#define SEEN_UNIQUEID_MAX 255   /* bytes of a mailbox unique id (the key) */

/* Initialise with memset(0) (or { 0, 0, 0, BUF_INITIALIZER }) before the
 * first seen_read(); free with seen_data_free(). */
struct seen_data {
    time_t lastread;
    uint32_t lastuid;
    time_t lastchange;
    struct buf seenuids;    /* the sequence set text */
};

/* Open (creating, with its directory) the seen file of `userid`, plain
 * byte order.  Per process, after fork().  With imapd.conf's
 * spool_sync_flags off (the default) the handle commits with
 * CYRUSDB_ORDERED: a power loss may undo the last changes of the seen
 * state (as it may undo the last flag changes of an index, mailbox.h),
 * never damage the file.  STORE_OK, STORE_BADNAME (userid
 * empty, longer than STORE_USERID_MAX, "." or "..", with '/' or control
 * bytes), STORE_IOERROR. */
int seen_open(const struct imapconf *conf, const char *userid,
              struct seen_db **s_r);
void seen_close(struct seen_db **sp);

/* Read a mailbox's state into *d (replacing what it held).  Unknown
 * mailbox: STORE_OK with everything zero and an empty set.  STORE_CORRUPT
 * (logged; *d zeroed) for a value that does not parse: a version other
 * than 1, a malformed number or a malformed sequence set.  STORE_BADNAME
 * for a uniqueid that is empty or over SEEN_UNIQUEID_MAX bytes (all
 * functions taking a uniqueid).  STORE_IOERROR. */
int seen_read(struct seen_db *s, const char *uniqueid, struct seen_data *d);
/* Write it (one committed transaction).  STORE_INTERNAL (logged, nothing
 * written) when the set is malformed or a time is negative: the reader
 * would refuse it.  STORE_IOERROR. */
int seen_write(struct seen_db *s, const char *uniqueid,
               const struct seen_data *d);
/* Read-modify-write of a mailbox's state in ONE transaction, under the
 * seen file's write lock, so that concurrent sessions of the user never
 * lose each other's changes: reads the state (a damaged one counts as
 * empty, logged), calls apply(d, rock) to change it (apply's non-zero
 * STORE_* code aborts; nothing written; SEEN_UPDATE_UNCHANGED ends the
 * transaction without a write and returns STORE_OK, *result untouched),
 * writes and commits.  On STORE_OK
 * the state written is moved into *result (when not NULL; what *result
 * held is freed).  Errors as seen_read()/seen_write(). */
#define SEEN_UPDATE_UNCHANGED (-1)
int seen_update(struct seen_db *s, const char *uniqueid,
                int (*apply)(struct seen_data *d, void *rock), void *rock,
                struct seen_data *result);
/* Remove a mailbox's state (STORE_OK also when there was none). */
int seen_delete(struct seen_db *s, const char *uniqueid);
void seen_data_free(struct seen_data *d);

/* Sequence sets: items "N" or "N:M" separated by ',', 1 <= N <= M <=
 * 4294967295, no leading zeros, ascending and not overlapping; "" is the
 * empty set.  seen_set_contains(): 1 when uid is in set (well-formed sets
 * only; any malformed set contains nothing). */
int seen_set_contains(const char *set, uint32_t uid);
/* Add (add != 0) or remove uid to/from the set in buf, keeping it sorted
 * and merged into ranges; the result is canonical (adjacent ranges joined,
 * "N" for a single uid).  STORE_OK, STORE_NOMEM, STORE_CORRUPT (the set
 * in buf is malformed; left unchanged), STORE_INTERNAL (uid 0). */
int seen_set_update(struct buf *set, uint32_t uid, int add);

/* Remove the seen file of a user (user deletion), and rename it (user
 * rename).  No process may have the files open.  Rename copies every
 * record into the new user's file (created if missing; records of the same
 * uniqueid replaced) in one transaction, then removes the old file: after
 * a crash in between, running it again finishes the job.  STORE_OK,
 * STORE_NOTFOUND (the old user has no seen file), STORE_BADNAME,
 * STORE_IOERROR. */
int seen_delete_user(const struct imapconf *conf, const char *userid);
int seen_rename_user(const struct imapconf *conf, const char *olduser,
                     const char *newuser);

#endif
