/*
 * cyrusdb.h - the pluggable key-value layer.
 *
 * Every database of the system (mailbox list, duplicate suppression, seen
 * state, subscriptions) is kept through this interface.  A database is a
 * file; it is opened by backend name ("flat", "skiplist", "db3",
 * "db3-nosync", "lmdb") and file name.  The "etcd" backend keeps a
 * database in an etcd cluster instead, under a key prefix made from the
 * name (cyrusdb_etcd.c); its transactions are optimistic: commit may
 * return CYRUSDB_AGAIN when another writer changed what the transaction
 * read, and nothing of it is then written.  Keys and values are byte strings
 * given as (pointer, length): they may contain NUL bytes; a key is at least
 * one byte, a value may be empty and may be at least 1 MiB long.
 *
 * Concurrency: every backend is safe for several processes using the same
 * file at once (the prefork workers), each with its own handle.  A handle
 * belongs to one process: do not use a handle across fork(); open databases
 * after fork() in the process that uses them.  Handles are not thread-safe.
 *
 * Transactions: every data call takes "struct cyrusdb_txn **tid".
 *   - tid == NULL: the call runs in its own transaction and commits before it
 *     returns (reads see the last committed state).
 *   - tid != NULL and *tid == NULL: a write transaction is begun by this call
 *     and handed back in *tid; it holds the database's write lock until
 *     cyrusdb_commit() or cyrusdb_abort().
 *   - tid != NULL and *tid != NULL: the call runs inside that transaction and
 *     sees its uncommitted changes.
 * One handle has at most one transaction open at a time.  A transaction must
 * be ended on the handle that began it.  After an error inside a transaction
 * the caller must call cyrusdb_abort().
 *
 * Memory returned by fetch calls and passed to foreach callbacks belongs to
 * the handle and stays valid until the next call on that handle.
 */
#ifndef CYRUSDB_CYRUSDB_H
#define CYRUSDB_CYRUSDB_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Return codes.  Negative values are errors; DONE is a non-error status. */
enum {
    CYRUSDB_OK = 0,
    CYRUSDB_DONE = 1,             /* walk stopped early / nothing to do */
    CYRUSDB_IOERROR = -1,         /* the file system failed or the file is damaged */
    CYRUSDB_AGAIN = -2,           /* temporary: deadlock or busy, retry the transaction
                                   * (etcd: commit conflict, nothing written) */
    CYRUSDB_EXISTS = -3,          /* cyrusdb_create() on an existing key */
    CYRUSDB_INTERNAL = -4,        /* misuse of the API or an engine failure */
    CYRUSDB_NOTFOUND = -5,        /* no such key (or no such file without CREATE) */
    CYRUSDB_LOCKED = -6,          /* the handle is busy in another transaction */
    CYRUSDB_NOTIMPLEMENTED = -7,  /* the backend does not offer this operation */
    CYRUSDB_FULL = -8,            /* out of disk space or map space */
    CYRUSDB_READONLY = -9,        /* write on a database opened read-only */
    CYRUSDB_BADFORMAT = -10,      /* the file was written by another backend or is not a database */
};

/* cyrusdb_open() flags */
#define CYRUSDB_CREATE    0x01  /* create the file (and its directory) if missing */
#define CYRUSDB_MBOXSORT  0x02  /* mailbox-name order: '.' sorts before every other byte.
                                 * The order is part of the file but not recorded
                                 * in it (Cyrus's formats have no room for it):
                                 * always open a database with the same setting.
                                 * A walk that meets keys out of the handle's
                                 * order stops with CYRUSDB_IOERROR. */
#define CYRUSDB_RDONLY    0x04  /* open for reading only */
#define CYRUSDB_NOCOMPACT 0x08  /* never checkpoint automatically (tests, tools) */
#define CYRUSDB_NOSYNC    0x10  /* commits of this handle need not be durable.
                                 * A commit still reaches the kernel before
                                 * cyrusdb_commit() returns, so a killed process
                                 * loses nothing committed (it is in the page
                                 * cache), and readers and writers in other
                                 * processes see it as usual.  A crash of the
                                 * machine may lose the last commits and, for
                                 * some backends (skiplist, flat; lmdb on file
                                 * systems that reorder writes; db3 keeps its
                                 * write-ahead order and only loses commits),
                                 * damage the file: open then fails with
                                 * CYRUSDB_IOERROR or CYRUSDB_BADFORMAT.  Only
                                 * for data whose loss is harmless (the
                                 * duplicate database).  The flag belongs to the
                                 * handle: other handles on the same file keep
                                 * their durability.  What each backend skips:
                                 *   skiplist: both fdatasync()s of a commit
                                 *     (checkpoints and recovery still sync the
                                 *     rewritten file and the directory before
                                 *     and after the rename);
                                 *   flat: the fsync of FNAME.NEW and of the
                                 *     directory at commit (the rename stays;
                                 *     cyrusdb_checkpoint() still syncs);
                                 *   lmdb: LMDB's data sync and synchronous
                                 *     meta-page write (MDB_NOSYNC, set on the
                                 *     process's shared environment for this
                                 *     handle's write transactions only);
                                 *   db3: the log flush at commit
                                 *     (DB_TXN_WRITE_NOSYNC, as db3-nosync).
                                 * cyrusdb_checkpoint() of every backend still
                                 * makes everything committed so far durable. */
#define CYRUSDB_ORDERED   0x20  /* commits of this handle are kept in order
                                 * but the last ones need not be durable when
                                 * cyrusdb_commit() returns: a crash of the
                                 * machine may lose the last commits (as if
                                 * they had not happened), never damage the
                                 * file or keep a later commit without an
                                 * earlier one; a later commit of any handle
                                 * makes the earlier ones durable.  For data
                                 * that must stay consistent but whose last
                                 * moments may be lost (the seen state).
                                 * Backends that cannot do it commit durably:
                                 *   skiplist: skips the fdatasync() after the
                                 *     COMMIT record (the one before it, which
                                 *     orders the records before their COMMIT,
                                 *     stays);
                                 *   flat, lmdb, db3: durable as without it.
                                 * CYRUSDB_NOSYNC wins over it. */

struct cyrusdb;       /* an open database: opaque */

/* A database's change stamp (cyrusdb_stamp()); compare with
 * cyrusdb_stamp_equal(). */
struct cyrusdb_stamp {
    uint64_t v[3];
};
struct cyrusdb_txn;   /* a write transaction: opaque */

/*
 * Callback types for cyrusdb_foreach().
 * filter: return non-zero to pass the record to the callback, 0 to skip it.
 * cb: return 0 to go on, non-zero to stop the walk; that value is returned by
 * cyrusdb_foreach().  Both may be called while the backend holds a lock: a
 * callback may call cyrusdb_fetch/store/delete on the same handle only with
 * the same tid that was given to cyrusdb_foreach() (never with NULL when a
 * transaction is open).  Records changed by the callback at or before the
 * current key are not revisited; the walk goes on after the current key.
 */
typedef int cyrusdb_filter_fn(void *rock,
                              const char *key, size_t keylen,
                              const char *data, size_t datalen);
typedef int cyrusdb_cb_fn(void *rock,
                          const char *key, size_t keylen,
                          const char *data, size_t datalen);

/* A backend's table of operations.  See cyrusdb.c for the registry. */
struct cyrusdb_backend {
    const char *name;

    /* Whole-directory operations (may be NULL: nothing to do).
     * recover: make every database of this backend under `dir` consistent
     * after a crash; must run while no other process uses them.
     * checkpoint_dir: flush logs and remove those no longer needed. */
    int (*recover)(const char *dir, int variant);
    int (*checkpoint_dir)(const char *dir, int variant);

    /* Does this header belong to a file of this backend?  `head` holds the
     * first `len` bytes of the file (len may be less than 4096). */
    int (*detect)(const char *head, size_t len);

    int (*open)(const char *fname, int flags, int variant,
                struct cyrusdb **db_r, const char **error_r);
    int (*close)(struct cyrusdb *db);

    int (*fetch)(struct cyrusdb *db, const char *key, size_t keylen,
                 const char **data_r, size_t *datalen_r,
                 struct cyrusdb_txn **tid);
    int (*fetchlock)(struct cyrusdb *db, const char *key, size_t keylen,
                     const char **data_r, size_t *datalen_r,
                     struct cyrusdb_txn **tid);
    int (*foreach)(struct cyrusdb *db, const char *prefix, size_t prefixlen,
                   cyrusdb_filter_fn *filter, cyrusdb_cb_fn *cb, void *rock,
                   struct cyrusdb_txn **tid);
    int (*create)(struct cyrusdb *db, const char *key, size_t keylen,
                  const char *data, size_t datalen, struct cyrusdb_txn **tid);
    int (*store)(struct cyrusdb *db, const char *key, size_t keylen,
                 const char *data, size_t datalen, struct cyrusdb_txn **tid);
    int (*delete)(struct cyrusdb *db, const char *key, size_t keylen,
                  struct cyrusdb_txn **tid, int force);
    int (*commit)(struct cyrusdb *db, struct cyrusdb_txn *tid);
    int (*abort)(struct cyrusdb *db, struct cyrusdb_txn *tid);

    int (*dump)(struct cyrusdb *db, FILE *out, int detail);
    int (*consistent)(struct cyrusdb *db);
    int (*checkpoint)(struct cyrusdb *db);
    /* may be NULL: cyrusdb_stamp() is then NOTIMPLEMENTED */
    int (*stamp)(struct cyrusdb *db, int now, struct cyrusdb_stamp *st);
};

/* Every handle starts with this header so that cyrusdb.c can find the
 * backend; backends embed it as their first member. */
struct cyrusdb {
    const struct cyrusdb_backend *backend;
    int flags;
    int metrics_db;             /* the database's metrics label (metrics.h) */
};

/* ---- registry --------------------------------------------------------- */

/* The registry: one row per backend name.  `variant` is handed to the
 * backend's open (db3-nosync is db3 with CYRUSDB_VARIANT_NOSYNC).
 * `format` names the on-disk format: names with the same format can open
 * each other's files (db3 and db3-nosync). */
#define CYRUSDB_VARIANT_NOSYNC 0x01

struct cyrusdb_registry_entry {
    const char *name;
    const char *format;
    const struct cyrusdb_backend *backend;
    int variant;
    int nofile;     /* keeps no file at the name (etcd): cyrusdb_open()
                     * neither looks at nor creates a file there, and the
                     * test suites run it only when named in $TEST_BACKENDS */
};

/* The table, terminated by an entry with name == NULL. */
extern const struct cyrusdb_registry_entry cyrusdb_registry[];

/* Look up a backend name; NULL if unknown. */
const struct cyrusdb_registry_entry *cyrusdb_lookup(const char *name);

/* A space-separated list of the backend names, for messages. */
const char *cyrusdb_names(void);

/* ---- the API ---------------------------------------------------------- */

/* Text for a return code; never NULL. */
const char *cyrusdb_strerror(int r);

/*
 * Open `fname` with backend `backend`.  If the file exists and was written by
 * another backend, fails with CYRUSDB_BADFORMAT and an error naming both.
 * Without CYRUSDB_CREATE a missing file gives CYRUSDB_NOTFOUND.
 * Returns CYRUSDB_OK and the handle in *db_r, or an error code; *error_r (if
 * not NULL) then points at a message valid until the next cyrusdb_open().
 * Errors are also logged.
 */
int cyrusdb_open(const char *backend, const char *fname, int flags,
                 struct cyrusdb **db_r, const char **error_r);

/* Close a handle and set *dbp to NULL.  An open transaction is aborted. */
int cyrusdb_close(struct cyrusdb **dbp);

/* Fetch a key.  CYRUSDB_NOTFOUND if absent. */
int cyrusdb_fetch(struct cyrusdb *db, const char *key, size_t keylen,
                  const char **data_r, size_t *datalen_r,
                  struct cyrusdb_txn **tid);

/* Fetch under the write lock, for read-modify-write; tid must not be NULL.
 * The transaction is begun if *tid is NULL, even when the key is absent
 * (CYRUSDB_NOTFOUND is returned, the lock is held). */
int cyrusdb_fetchlock(struct cyrusdb *db, const char *key, size_t keylen,
                      const char **data_r, size_t *datalen_r,
                      struct cyrusdb_txn **tid);

/* Walk the records whose key starts with prefix (prefixlen 0: all) in key
 * order.  Returns CYRUSDB_OK after a full walk, the callback's non-zero
 * value if it stopped the walk, or an error code. */
int cyrusdb_foreach(struct cyrusdb *db, const char *prefix, size_t prefixlen,
                    cyrusdb_filter_fn *filter, cyrusdb_cb_fn *cb, void *rock,
                    struct cyrusdb_txn **tid);

/* Insert a new key; CYRUSDB_EXISTS if present (nothing changed). */
int cyrusdb_create(struct cyrusdb *db, const char *key, size_t keylen,
                   const char *data, size_t datalen, struct cyrusdb_txn **tid);

/* Insert or replace. */
int cyrusdb_store(struct cyrusdb *db, const char *key, size_t keylen,
                  const char *data, size_t datalen, struct cyrusdb_txn **tid);

/* Delete a key.  A missing key gives CYRUSDB_NOTFOUND, or CYRUSDB_OK when
 * force is non-zero. */
int cyrusdb_delete(struct cyrusdb *db, const char *key, size_t keylen,
                   struct cyrusdb_txn **tid, int force);

/* End a transaction.  Commit is durable when it returns OK (except for
 * no-sync variants and handles opened with CYRUSDB_NOSYNC).  Abort leaves
 * no trace.  Both free the transaction. */
int cyrusdb_commit(struct cyrusdb *db, struct cyrusdb_txn *tid);
int cyrusdb_abort(struct cyrusdb *db, struct cyrusdb_txn *tid);

/* Print every record (detail 0) or the internal structure (detail 1). */
int cyrusdb_dump(struct cyrusdb *db, FILE *out, int detail);

/* Check the whole file; CYRUSDB_OK or CYRUSDB_IOERROR with details logged. */
int cyrusdb_consistent(struct cyrusdb *db);

/* Rewrite / compact the file (skiplist repack, flat rewrite, db3 log
 * checkpoint, lmdb copy); NOTIMPLEMENTED where meaningless. */
int cyrusdb_checkpoint(struct cyrusdb *db);

/*
 * A change stamp, for a cache of what was read: now == 0 gives the stamp
 * of the database as this handle's last read (outside a transaction)
 * saw it, without any system call; now != 0 the stamp as the database is
 * now, cheaply (skiplist: one stat() of the file, no lock).  When a stamp
 * taken now equals one taken (now == 0) right after a read, no commit of
 * any process changed the database in between, and what that read
 * returned is still what a read would return.  CYRUSDB_OK;
 * CYRUSDB_NOTIMPLEMENTED for backends that cannot tell cheaply (flat,
 * db3, lmdb, etcd: read again every time); CYRUSDB_INTERNAL inside a
 * transaction or before the first read; CYRUSDB_IOERROR.
 */
int cyrusdb_stamp(struct cyrusdb *db, int now, struct cyrusdb_stamp *st);
int cyrusdb_stamp_equal(const struct cyrusdb_stamp *a,
                        const struct cyrusdb_stamp *b);

/*
 * Which backend format wrote `fname`?  *format_r gets "flat", "skiplist",
 * "db3", "lmdb", or another known name such as "twoskip" for files we
 * recognise but cannot open.  CYRUSDB_NOTFOUND if the file is missing,
 * CYRUSDB_BADFORMAT if it is not recognised.  An empty file is "flat".
 */
int cyrusdb_detect(const char *fname, const char **format_r);

/*
 * In which key order was `fname` written?  The order is not recorded in
 * the files (CYRUSDB_MBOXSORT above), so this opens the file read-only
 * with `backend` in the order `flags` says (CYRUSDB_MBOXSORT or not),
 * checks it with the backend's consistency check, and when that fails
 * tries the other order.  Nothing is logged while probing.
 * CYRUSDB_OK with *order_r = the order it is consistent in (the one
 * asked for when both fit: then the keys do not tell the orders apart);
 * CYRUSDB_IOERROR when it is consistent in neither (damaged; open it
 * again to see the details logged); CYRUSDB_NOTFOUND, CYRUSDB_BADFORMAT
 * and other open errors as cyrusdb_open() gives them.  Reads the whole
 * file; the caller must not hold it open in a write transaction.
 */
int cyrusdb_detect_order(const char *backend, const char *fname, int flags,
                         int *order_r);

/* Run every backend's recover (resp. checkpoint_dir) over `dir`. */
int cyrusdb_recover(const char *dir);
int cyrusdb_checkpoint_dir(const char *dir);

/* Key comparison used by all backends: plain byte order, or mailbox order
 * when CYRUSDB_MBOXSORT is set.  A shorter key that is a prefix of a longer
 * one sorts first. */
int cyrusdb_compare(int flags, const char *a, size_t alen,
                    const char *b, size_t blen);

/* Does key start with prefix? */
int cyrusdb_has_prefix(const char *key, size_t keylen,
                       const char *prefix, size_t prefixlen);

#endif
