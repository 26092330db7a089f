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

struct seen_data {
    time_t lastread;
    uint32_t lastuid;
    time_t lastchange;
    struct buf seenuids;    /* the sequence set text */
};

/* Open (creating) the seen file of `userid`.  STORE_OK, STORE_BADNAME
 * (userid empty, with '/', or control bytes), STORE_IOERROR. */
int seen_open(const struct imapconf *conf, const char *userid,
              struct seen_db **s_r);
void seen_close(struct seen_db **sp);

/* Read a mailbox's state.  Unknown mailbox: STORE_OK with everything
 * zero and an empty set.  STORE_CORRUPT for a value that does not parse. */
int seen_read(struct seen_db *s, const char *uniqueid, struct seen_data *d);
/* Write it (one committed transaction). */
int seen_write(struct seen_db *s, const char *uniqueid,
               const struct seen_data *d);
/* Remove a mailbox's state. */
int seen_delete(struct seen_db *s, const char *uniqueid);
void seen_data_free(struct seen_data *d);

/* Sequence sets: 1 when uid is in set (well-formed sets only, as written
 * by seen_set_add; any malformed set contains nothing). */
int seen_set_contains(const char *set, uint32_t uid);
/* Add (add != 0) or remove uid to/from the set in buf, keeping it sorted
 * and merged into ranges.  STORE_OK, STORE_NOMEM. */
int seen_set_update(struct buf *set, uint32_t uid, int add);

/* Remove the seen file of a user (user deletion), and rename it (user
 * rename).  STORE_OK, STORE_NOTFOUND, STORE_IOERROR. */
int seen_delete_user(const struct imapconf *conf, const char *userid);
int seen_rename_user(const struct imapconf *conf, const char *olduser,
                     const char *newuser);

#endif
