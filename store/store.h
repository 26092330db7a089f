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

/* Map a cyrusdb return code to a store code (CYRUSDB_NOTFOUND ->
 * STORE_NOTFOUND, CYRUSDB_EXISTS -> STORE_EXISTS, CYRUSDB_AGAIN/LOCKED ->
 * STORE_BUSY, CYRUSDB_NOMEM -> STORE_NOMEM, everything else IOERROR). */
int store_from_cyrusdb(int r);

/* Map an errno value to a store code (ENOSPC/EDQUOT -> STORE_NOSPACE,
 * ENOMEM -> STORE_NOMEM, ENOENT -> STORE_NOTFOUND, EEXIST -> STORE_EXISTS,
 * EAGAIN/EWOULDBLOCK/EINTR -> STORE_BUSY, everything else IOERROR). */
int store_from_errno(int e);

#endif
