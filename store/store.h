/*
 * store.h - error codes shared by every module of the mailbox store.
 *
 * Every store function returns one of these.  The front ends map them to
 * protocol replies: store_is_temporary() tells a 4xx ("try later") from a
 * 5xx ("this will never work"), so "not found" and "busy" are never
 * confused.  Detail goes to the log where the error happens; the codes
 * carry only the class.
 */
#ifndef STORE_STORE_H
#define STORE_STORE_H

enum store_error {
    STORE_OK = 0,
    STORE_NOTFOUND,        /* no such mailbox / record / user (permanent) */
    STORE_EXISTS,          /* create of something that exists (permanent) */
    STORE_BADNAME,         /* a mailbox name the rules refuse (permanent) */
    STORE_BADPARTITION,    /* partition not configured (permanent) */
    STORE_PERMISSION,      /* the ACL does not allow it (permanent) */
    STORE_OVERQUOTA,       /* the quota root would be exceeded */
    STORE_TOOBIG,          /* message larger than allowed (permanent) */
    STORE_BADMESSAGE,      /* message malformed for the store (permanent) */
    STORE_BUSY,            /* a lock could not be had in time (temporary) */
    STORE_IOERROR,         /* read/write/sync/database failure (temporary) */
    STORE_NOSPACE,         /* disk or inodes full (temporary) */
    STORE_CORRUPT,         /* a checksum or structure check failed; the
                              index needs reconstruct (temporary for
                              delivery: mail must not bounce over it) */
    STORE_NOMEM,           /* out of memory (temporary) */
    STORE_NOTIMPLEMENTED,  /* an operation this build does not do */
    STORE_INTERNAL         /* a programming error (temporary) */
};

/* A short English text for a code ("mailbox does not exist", ...); never
 * NULL, static storage. */
const char *store_strerror(int r);

/* 1 when the error is temporary (a 4xx reply: BUSY, IOERROR, NOSPACE,
 * CORRUPT, NOMEM, INTERNAL, and OVERQUOTA unless the admin configured
 * over-quota as permanent, which the caller decides), 0 when permanent. */
int store_is_temporary(int r);

/* Map a cyrusdb return code to a store code (CYRUSDB_OK and CYRUSDB_DONE
 * -> STORE_OK, CYRUSDB_NOTFOUND -> STORE_NOTFOUND, CYRUSDB_EXISTS ->
 * STORE_EXISTS, CYRUSDB_AGAIN/LOCKED -> STORE_BUSY, CYRUSDB_FULL (disk or
 * map space) -> STORE_NOSPACE, everything else IOERROR).  cyrusdb has no
 * out-of-memory code: its backends report allocation failure as IOERROR or
 * INTERNAL, which both map to STORE_IOERROR. */
int store_from_cyrusdb(int r);

/* Map an errno value to a store code (ENOSPC/EDQUOT -> STORE_NOSPACE,
 * ENOMEM -> STORE_NOMEM, ENOENT -> STORE_NOTFOUND, EEXIST -> STORE_EXISTS,
 * EAGAIN/EWOULDBLOCK/EINTR -> STORE_BUSY, everything else IOERROR). */
int store_from_errno(int e);

/* ---- helpers shared by the store's small databases ------------------- */

#include <stddef.h>
#include <stdint.h>

#include "lib/buf.h"
#include "lib/imapconf.h"

/* Parse the decimal number that is exactly the bytes (p, len): 1 to 20
 * digits, no sign, no space, no leading zero (except "0" itself), value at
 * most `max`.  Returns 0 and *v_r, or -1 (nothing stored) for anything
 * else.  Never reads past p + len. */
int store_parse_u64(const char *p, size_t len, uint64_t max, uint64_t *v_r);

/* Longest user id accepted for a per-user file name. */
#define STORE_USERID_MAX 200

/* The per-user database file CONFIGDIR/user/H/USERID.SUFFIX into path
 * (replacing its contents), H = mboxname_hash_letter() of the user's INBOX
 * "user.USERID", i.e. the first letter of the user id lower-cased, 'q' for
 * a non-letter (Cyrus's layout for .seen and .sub files).  The user id must
 * be 1..STORE_USERID_MAX bytes without '/' or control bytes and not "." or
 * "..".  A user id of a virtual domain, "alice@example.com", has its files
 * under the domain as in Cyrus: CONFIGDIR/domain/E/example.com/user/H/
 * alice.SUFFIX (E = mboxname_domain_hash_letter(), H of "user.alice");
 * its domain must be a valid lower-case domain and its local part
 * non-empty.  STORE_OK, STORE_BADNAME (userid refused, logged),
 * STORE_IOERROR (configdirectory not set), STORE_NOMEM. */
int store_user_path(const struct imapconf *conf, const char *userid,
                    const char *suffix, struct buf *path);

/* Remove a database file and the files a backend keeps beside it (the
 * "-lock" file of lmdb), as Cyrus does when a user is deleted.  No process
 * may have the file open.  STORE_OK, STORE_NOTFOUND (no such file),
 * STORE_IOERROR. */
int store_db_unlink(const char *fname);

/* Copy every record of database `from` into database `to` (created when
 * missing; records of the same key are replaced), both opened with
 * `backend` and `flags` (CYRUSDB_MBOXSORT or 0; CYRUSDB_CREATE is added
 * for `to`), in one transaction on `to`.  When rekey is not NULL it is
 * called for every key and puts the key to write into *newkey (it starts
 * as a copy of the key); it returns 0, or -1 to fail the copy
 * (STORE_NOMEM).  The caller then removes `from`: a crash in between
 * leaves both files, and copying again is harmless, which makes a user
 * rename restartable.  STORE_OK, STORE_NOTFOUND (`from` does not exist),
 * STORE_IOERROR, STORE_NOMEM. */
typedef int store_rekey_fn(void *rock, const char *key, size_t keylen,
                           struct buf *newkey);
int store_db_copy(const char *backend, int flags, const char *from,
                  const char *to, store_rekey_fn *rekey, void *rekey_rock);

/* The per-user databases (seen state, subscriptions) share these three.
 * Open (creating it and its directory) the database USERID.SUFFIX with the
 * backend the configuration key `backend_key` names, opened with `flags`
 * (always the same for a given suffix); on STORE_OK *db_r is open and
 * *fname_r its path (the caller frees it).  STORE_BADNAME (user id),
 * STORE_IOERROR, STORE_NOMEM. */
struct cyrusdb;
int store_user_db_open(const struct imapconf *conf, const char *userid,
                       const char *suffix, const char *backend_key, int flags,
                       struct cyrusdb **db_r, char **fname_r);
/* Remove a user's database (store_db_unlink()). */
int store_user_db_delete(const struct imapconf *conf, const char *userid,
                         const char *suffix);
/* Move a user's database to another user: store_db_copy() (merging into an
 * existing one, keys passed through rekey when not NULL), then the old file
 * is removed; restartable after a crash.  Same user: nothing done.
 * STORE_OK, STORE_NOTFOUND (no old file), STORE_IOERROR, STORE_NOMEM. */
int store_user_db_rename(const struct imapconf *conf, const char *olduser,
                         const char *newuser, const char *suffix,
                         const char *backend_key, int flags,
                         store_rekey_fn *rekey, void *rekey_rock);

#endif
