/*
 * skiplist.h - the skiplist storage engine: Cyrus IMAP's "skiplist" file
 * format (version 1.2), byte-compatible with the files Cyrus 3.x reads and
 * writes.  The cyrusdb adapter is cyrusdb_skiplist.c; this engine knows
 * nothing of cyrusdb transaction handles, only of one file and its locks.
 *
 * Key order in the file.  Without SKIPLIST_MBOXSORT it is Cyrus's: bytes
 * compared as signed chars, so keys holding bytes >= 0x80 sort before their
 * 0x00..0x7f neighbours ("\x80" < "\x01" < "a").  This is not the API's
 * cyrusdb_compare() order; seek() follows the file, and callers that must
 * present API order (the cyrusdb adapter's foreach) re-sort ranges where
 * skiplist_key_reorders() says a key is affected.  With SKIPLIST_MBOXSORT
 * the order is cyrusdb_compare(CYRUSDB_MBOXSORT) in the file as in the API.
 * Cyrus opened with CYRUSDB_MBOXSORT orders skiplist files by its mailbox
 * table instead: NUL, then TAB and LF (which it ranks equal), then '.', then
 * 0x01..0x08, then every other byte by unsigned value.  For keys holding
 * no byte 0x00..0x0a (every printable mailbox name) the two orders agree.
 * A file in another order is reported by skiplist_consistent(); recovery
 * or a checkpoint re-sorts it.
 *
 * A handle belongs to one process and is not thread-safe.  Open it after
 * fork().  fcntl locks belong to the process, not to the handle: two handles
 * on the same file in one process do not exclude each other, and closing one
 * of them drops the locks of the other.  Use one handle per file per process.
 *
 * Locking model.  Every data call runs under a lock taken by the caller:
 *   - skiplist_read_lock() / skiplist_read_unlock(): a shared lock; calls
 *     nest (a depth is kept), only the outermost takes and drops the lock.
 *   - skiplist_txn_begin() / skiplist_txn_commit() / skiplist_txn_abort():
 *     the exclusive lock for the whole write transaction.  A transaction may
 *     begin while a read lock is held (the lock is upgraded and downgraded
 *     again at the end; SKIPLIST_AGAIN when fcntl reports a deadlock).  Read
 *     locks taken inside a transaction just nest.
 * Taking a lock notices other processes' work: appended commits, a file
 * replaced by a checkpoint (new inode), and a crashed writer's uncommitted
 * tail (see skiplist.c for what is done about it).
 *
 * Records handed back (struct skiplist_record) point into the file map and
 * stay valid only until the next call on the handle that takes a lock,
 * writes, or ends a transaction.  Copy them before calling anything else.
 */
#ifndef CYRUSDB_SKIPLIST_H
#define CYRUSDB_SKIPLIST_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Engine return codes; the adapter maps them to CYRUSDB_* codes. */
enum skiplist_status {
    SKIPLIST_OK = 0,
    SKIPLIST_NOTFOUND = -1,   /* no such key / no further key */
    SKIPLIST_EXISTS = -2,     /* store without overwrite found the key */
    SKIPLIST_IOERROR = -3,    /* I/O failed or the file is damaged (logged) */
    SKIPLIST_FULL = -4,       /* ENOSPC / EDQUOT, or the 4 GiB format limit */
    SKIPLIST_AGAIN = -5,      /* lock deadlock detected; retry */
    SKIPLIST_READONLY = -6,   /* write on a handle opened read-only */
    SKIPLIST_MISUSE = -7,     /* call out of order (no lock, no transaction) */
    SKIPLIST_BADFORMAT = -8,  /* not a skiplist file */
    SKIPLIST_NOTFILE = -9     /* the file does not exist (open without CREATE) */
};

/* skiplist_open() flags */
#define SKIPLIST_CREATE    0x01  /* create the file and missing parent dirs */
#define SKIPLIST_RDONLY    0x02  /* never write; open the file O_RDONLY */
#define SKIPLIST_MBOXSORT  0x04  /* key order: cyrusdb_compare(CYRUSDB_MBOXSORT) */
#define SKIPLIST_NOCOMPACT 0x08  /* never checkpoint after a commit */
#define SKIPLIST_NOSYNC    0x10  /* commits skip both fdatasync()s: see
                                  * skiplist_txn_commit() */
#define SKIPLIST_ORDERED   0x20  /* commits skip the fdatasync() after the
                                  * COMMIT record (skiplist.c) */

/* Largest key and value lengths the format can hold in one file. */
#define SKIPLIST_MAX_KEYLEN  (1u << 20)
#define SKIPLIST_MAX_DATALEN (1u << 30)

/* The 20-byte magic at offset 0. */
#define SKIPLIST_MAGIC "\241\002\213\015skiplist file\0\0\0"
#define SKIPLIST_MAGIC_LEN 20

struct skiplist;   /* an open file: opaque */

/* One record as stored; pointers into the map, see above. */
struct skiplist_record {
    const char *key;
    size_t keylen;
    const char *data;
    size_t datalen;
};

/*
 * Open (and with SKIPLIST_CREATE create) `fname`.  An existing 0-byte file
 * is a new empty database (the header is written on first use unless
 * RDONLY).  A writable open runs recovery when the file needs it (a crashed
 * writer's tail, or not recovered since the system booted).
 * Returns SKIPLIST_OK and *sl_r; or NOTFILE, BADFORMAT, IOERROR, FULL, AGAIN
 * with a constant message in *error_r.
 */
int skiplist_open(const char *fname, int flags, struct skiplist **sl_r,
                  const char **error_r);

/* Close and free; an open transaction is aborted.  Sets *slp to NULL. */
void skiplist_close(struct skiplist **slp);

/* Shared lock (nesting).  OK, IOERROR, AGAIN. */
int skiplist_read_lock(struct skiplist *sl);
/* Drop one level of read lock. */
void skiplist_read_unlock(struct skiplist *sl);

/* Write transactions, one at a time per handle.
 * begin: OK, READONLY, MISUSE (one already open), IOERROR, FULL, AGAIN.
 * commit: durable when OK (records fsync'ed, then the COMMIT record
 *   fsync'ed); may checkpoint afterwards unless SKIPLIST_NOCOMPACT.
 *   With SKIPLIST_NOSYNC neither fdatasync is done: the commit is in the
 *   page cache (survives the process, visible to every other process) but
 *   a crash of the machine may lose it or, the COMMIT record reaching the
 *   disk before the records it vouches for, leave a file that recovery
 *   finds damaged (SKIPLIST_IOERROR).  Checkpoints and recovery still sync
 *   the rewritten file and the directory.  On an
 *   error the transaction is rolled back.  Either way it is over.
 * abort: undo every change; the file returns to its state at begin. */
int skiplist_txn_begin(struct skiplist *sl);
int skiplist_txn_commit(struct skiplist *sl);
int skiplist_txn_abort(struct skiplist *sl);
int skiplist_in_txn(const struct skiplist *sl);

/*
 * Under a lock: the first record whose key is >= key (after == 0) or
 * > key (after != 0), in the file's key order (see above).  key may be
 * NULL with keylen 0 for the first record.
 * OK with *rec_r filled, NOTFOUND past the last record, IOERROR, MISUSE.
 */
int skiplist_seek(struct skiplist *sl, const char *key, size_t keylen,
                  int after, struct skiplist_record *rec_r);

/* Does the file order place this key differently from cyrusdb_compare()?
 * Nonzero for a key holding a byte >= 0x80 in a file opened without
 * SKIPLIST_MBOXSORT; a range of keys for which it is 0 everywhere is in
 * the same order in the file and in the API. */
int skiplist_key_reorders(const struct skiplist *sl, const char *key, size_t keylen);

/* Under a lock: exact lookup.  OK, NOTFOUND, IOERROR, MISUSE. */
int skiplist_fetch(struct skiplist *sl, const char *key, size_t keylen,
                   struct skiplist_record *rec_r);

/* Inside a transaction: insert or (overwrite != 0) replace.
 * OK, EXISTS (overwrite == 0 and the key is present), IOERROR, FULL,
 * MISUSE.  After IOERROR/FULL the transaction can only be aborted. */
int skiplist_store(struct skiplist *sl, const char *key, size_t keylen,
                   const char *data, size_t datalen, int overwrite);

/* Inside a transaction: remove a key.  OK, NOTFOUND, IOERROR, FULL. */
int skiplist_delete(struct skiplist *sl, const char *key, size_t keylen);

/* Rewrite the file in key order into "<fname>.NEW", fsync it, rename it
 * over fname and fsync the directory.  Not inside a transaction (MISUSE);
 * takes the exclusive lock itself.  OK, READONLY, IOERROR, FULL, AGAIN. */
int skiplist_checkpoint(struct skiplist *sl);

/* A stamp of the file: its device, inode and size.  now == 0: as the
 * last lock of this handle found them (no system call); now != 0: as
 * they are on disk now (one stat() of the path).  Every commit appends
 * to the file (its size grows), an abort truncates it back, and a
 * rewrite (checkpoint, recovery) replaces it by rename (its inode
 * changes; while this handle keeps its descriptor open, the old inode's
 * number names no other file): a stamp taken now that equals the one of
 * the last lock proves that nothing was committed since.  OK; IOERROR
 * (stat failed); MISUSE with no lock taken yet or inside a transaction. */
int skiplist_stamp(struct skiplist *sl, int now, uint64_t stamp[3]);

/* Verify the whole file: header, every record, every forward pointer at
 * every level, key order, and that the linked list equals the records a
 * replay of the log yields.  OK or IOERROR (details logged). */
int skiplist_consistent(struct skiplist *sl);

/* detail 0: "KEY\tVALUE\n" per record in cyrusdb_compare() order, bytes
 * < 0x20, 0x7f, '\\' and >= 0x80 as \xNN.  detail 1: the header and
 * every record in file order with its offsets.  OK, IOERROR. */
int skiplist_dump(struct skiplist *sl, FILE *out, int detail);

/* Recover one file now (rewrite from its committed records), whatever its
 * state; for the directory-wide recovery run when no process uses it.  The
 * file is rewritten in the order its checkpointed records are in (plain or
 * mailbox order), never re-sorted into the other. */
int skiplist_recover_file(const char *fname);

/* Is this the start of a skiplist file? */
int skiplist_detect(const char *head, size_t len);

#endif
