/*
 * directory.h - where a user's mail lives: the frontend tier's map from
 * a user id to the name of the backend that holds the user's mailboxes.
 *
 * The map is a cyrusdb database (any backend, etcd included):
 *   directory_db        its backend ("etcd" for a cluster-wide map)
 *   directory_db_path   its file name (etcd: the name under etcd_prefix);
 *                       empty = CONFIGDIR/directory.db
 *   directory_cache_ttl seconds a looked-up answer is reused (0: never)
 * Record: key = the internal user id ("alice", "alice@example.com",
 * store/userid.h), value = the backend's name, 1..DIRECTORY_NAME_MAX
 * bytes of letters, digits, '.', '_' and '-', nothing else (no line end).
 * A value of another shape is a damaged record, never a guess.  Admins
 * write records with cyr_dbtool (man/lmtpd.8, PROXY MODE).
 *
 * Lookups are served from a per-process cache (answers "found" and "not
 * found" alike, each for directory_cache_ttl seconds, at most
 * DIRECTORY_CACHE_MAX entries); a miss reads the database (with etcd a
 * linearizable read: the answer is at least as new as any write that
 * finished before the read began).  So a change of a record is seen by
 * every frontend at most directory_cache_ttl seconds after it was
 * written.  With etcd (and a TTL above 0) a thread started at the first
 * successful open watches the directory's keys and drops a changed
 * user's cached answer at once (directory.c); the TTL still bounds an
 * answer's life when the watch is broken.  When the database cannot be read the answer is
 * DIRECTORY_UNAVAILABLE: never a cached answer past its time, never
 * "not found".
 *
 * Every lookup is counted once in the process's metrics slot
 * (lib/metrics.h): METRICS_DIRECTORY_CACHED when the cache answered,
 * METRICS_DIRECTORY_READS when the database was asked (opened and read;
 * a failed attempt too).
 *
 * A directory belongs to one process (open it after fork()); not
 * thread-safe (its watch thread shares only a queue under a mutex with
 * it).  directory_free() stops and joins that thread (within about a
 * second).
 */
#ifndef STORE_DIRECTORY_H
#define STORE_DIRECTORY_H

#include "lib/imapconf.h"

#define DIRECTORY_NAME_MAX 64
#define DIRECTORY_CACHE_MAX 20000

enum directory_result {
    DIRECTORY_OK = 0,          /* *backend_r names the user's backend */
    DIRECTORY_NOTFOUND,        /* the user has no record */
    DIRECTORY_UNAVAILABLE,     /* the database could not be read (opened) */
    DIRECTORY_BADRECORD        /* the record is not a backend name */
};

struct directory;

/* A directory for the configuration conf (which must outlive it).  The
 * database is opened at the first lookup (and again after a failure), so
 * a cluster that is down at start only makes lookups fail.  0, or -1
 * with *error_r (static text): directory_db names no known backend,
 * or out of memory. */
int directory_new(const struct imapconf *conf, struct directory **dir_r,
                  const char **error_r);
void directory_free(struct directory **dirp);

/* The backend of userid (NUL-terminated).  On DIRECTORY_OK *backend_r
 * points at the name, owned by the directory and valid until the next
 * call.  On DIRECTORY_BADRECORD *backend_r points at the record,
 * sanitized for a log line (same lifetime).  Failures of the database
 * are logged here, once per streak. */
enum directory_result directory_lookup(struct directory *dir,
                                       const char *userid,
                                       const char **backend_r);

/* 1 when (s, len) is a valid backend name (see above). */
int directory_valid_name(const char *s, size_t len);

/* Forget every cached answer (tests, reload). */
void directory_flush(struct directory *dir);

/* A backend of a frontend's list (proxy_backends, proxy_imap_backends):
 * space- or comma-separated NAME=ADDRESS entries, NAME a valid backend
 * name, ADDRESS not empty, no NAME twice. */
struct directory_peer {
    char *name;
    char *addr;
};
/* Parse list into *peers_r[0 .. *n_r) (the caller frees them with
 * directory_peers_free()).  0, or -1 with *error_r (static text) and
 * nothing to free. */
int directory_peers_parse(const char *list, struct directory_peer **peers_r,
                          size_t *n_r, const char **error_r);
void directory_peers_free(struct directory_peer *peers, size_t n);
/* The index of name in peers[0 .. n), or -1. */
int directory_peers_find(const struct directory_peer *peers, size_t n,
                         const char *name);

#endif
