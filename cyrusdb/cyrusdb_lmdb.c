/*
 * cyrusdb_lmdb.c - the cyrusdb backend over LMDB (liblmdb).
 *
 * PURPOSE
 * An adapter: LMDB is the storage engine; this file absorbs its quirks so
 * that the cyrusdb contract holds (implicit one-call transactions, a
 * foreach whose callback writes, a map that fills up, fork()ed workers).
 *
 * ON-DISK FORMAT
 * A plain LMDB environment opened with MDB_NOSUBDIR: the data file is
 * exactly `fname`, the lock file is `fname` + "-lock" (reader table and the
 * process-shared robust writer mutex; it holds no data and may be deleted
 * while no process has the database open).  Records live in LMDB's main
 * (unnamed) database.  The key is stored as given; the stored value is the
 * caller's value bytes followed by a 4-byte checksum: CRC-32C (Castagnoli
 * polynomial, reflected, initial value and final xor 0xFFFFFFFF) over the
 * key bytes and then the value bytes, written little-endian.  A stored
 * value shorter than 4 bytes or with a wrong checksum is damage.  The LMDB
 * tools (mdb_stat, mdb_dump, mdb_copy -c) work on the file, but mdb_dump
 * shows the checksum as the last 4 bytes of every value, and a file
 * written by mdb_load (or any other LMDB writer) must carry the checksum
 * too, or every record reads as damaged.  The first page is
 * LMDB's meta page: after the page header (pgno, pad, flags, bounds:
 * sizeof(size_t) + 8 bytes) comes the magic 0xBEEFC0DE as a native uint32;
 * lmdb_detect() looks for it (and the P_META page flag).  Key order: LMDB's
 * default order (memcmp, shorter prefix first) is exactly
 * cyrusdb_compare() without CYRUSDB_MBOXSORT; with CYRUSDB_MBOXSORT the
 * main database gets a comparator built on cyrusdb_compare(), installed
 * every time the database is opened, in every process.  The order is not
 * recorded in the file: a file must always be opened with the same
 * CYRUSDB_MBOXSORT setting (as with every backend); open and consistent()
 * refuse a file whose pages are out of order for the flags given.
 *
 * DAMAGED FILES
 * LMDB trusts its file: a damaged page can make it read past the end of
 * the file (SIGBUS), follow a wild pointer or loop.  So before LMDB walks a
 * file, every process verifies it when it opens it (the meta pages and the
 * file length, then every page of both trees with all offsets, sizes and
 * page numbers bounds-checked, each page used once, all pages accounted
 * for: see lmdb_verify()), and consistent() does again.  This costs one
 * pass over the used part of the file per open.  LMDB keeps no checksums
 * of its own, so every record carries the CRC-32C described above, checked
 * on every read of a record (fetch, fetchlock, foreach before the filter,
 * dump, consistent): a changed byte inside a key or value that leaves the
 * structure valid gives CYRUSDB_IOERROR and one log line naming the file
 * and key, never the changed data.  Damage outside the records that
 * leaves a valid structure (say, a meta page pointing at an older but
 * intact tree) is not detectable this way.
 *
 * CRASH SAFETY (LMDB's argument, which this adapter keeps intact)
 * LMDB never overwrites a page that the last committed state uses: a write
 * transaction copies pages and writes new ones, fdatasync()s them, then
 * writes the meta page (one of two, alternating) naming the new root and
 * syncs again.  A crash at any point leaves the older meta page and the
 * tree it names intact; there is no recovery step.  We open with LMDB's
 * default flags (no MDB_NOSYNC / MDB_NOMETASYNC / MDB_WRITEMAP), so a
 * commit that returned CYRUSDB_OK is on disk.  Except for a handle opened
 * with CYRUSDB_NOSYNC: the environment is shared by every handle of the
 * process on the file (below), so MDB_NOSYNC cannot be given at
 * mdb_env_open; instead every write transaction sets the environment's
 * MDB_NOSYNC flag (mdb_env_set_flags) to its handle's choice when it
 * begins and again just before mdb_txn_commit.  Only one write transaction
 * per environment is live in a process (see the invariants), so the flag
 * always belongs to the handle that commits: a CYRUSDB_NOSYNC handle's
 * commits skip LMDB's fdatasync and write the meta page through the plain
 * descriptor, and the next commit of a durable handle syncs the whole data
 * file (its own pages and any earlier unsynced ones) as usual.  Pages are
 * still written with pwrite() before commit returns, so a killed process
 * loses nothing; a machine crash may lose the last commits, or on a file
 * system that reorders writes leave a meta page naming unwritten pages
 * (lmdb_verify() then reports the damage at open).  When the file is created,
 * its first meta pages are synced and the directory is fsync()ed.  A writer
 * killed mid-transaction (SIGKILL) holds the writer mutex, which is a
 * robust pthread mutex: the next writer gets EOWNERDEAD, LMDB repairs the
 * mutex, and since the dead writer never wrote a meta page, nothing it did
 * is visible.  Reader slots of dead processes are cleared by
 * mdb_reader_check() at every open (they would otherwise pin old pages).
 *
 * INVARIANTS OF THE ADAPTER
 * - One LMDB environment per database file per process: a process-wide
 *   table (lmdb_envs) keyed by device, inode and pid shares one MDB_env
 *   between all handles of the process on that file.  Two environments on
 *   one file in one process would break LMDB's fcntl() lock on the lock
 *   file (closing either releases both) and could re-initialise a lock file
 *   in use.  Entries inherited across fork() belong to the parent and are
 *   never used or closed by the child; a handle used in another process
 *   than the one that opened it fails with CYRUSDB_INTERNAL.
 * - Never two write transactions on one environment in a process: LMDB's
 *   writer mutex would deadlock the thread.  A handle asking for a write
 *   transaction while another handle of the same process holds the file's
 *   write transaction gets CYRUSDB_LOCKED.
 * - MDB_NOTLS: every handle keeps its own read-only transaction (reset
 *   between calls, renewed for the next read: cheap, and a reset
 *   transaction pins no pages).  Without MDB_NOTLS a reader slot belongs to
 *   the thread, and two handles on one file in one process (sharing one
 *   environment) would share a slot, each resetting the other's snapshot.
 *   With it the slot belongs to the MDB_txn object.  Handles are
 *   single-threaded, so nothing else changes.
 * - No LMDB cursor and no pointer into the map survives a return from this
 *   file or a call of a user callback: values are copied into the
 *   handle's buffers, foreach copies the current key, closes its cursor
 *   before calling filter/callback, and re-positions with MDB_SET_RANGE
 *   afterwards.  So the map may be replaced (grown) at any write, even
 *   while a read transaction of this process is live (a tid == NULL
 *   foreach whose callback writes): a read transaction keeps no pointer
 *   into the map, LMDB computes page addresses from the map base.
 * - A full map grows itself.  Each write transaction keeps a replay log of
 *   its successful writes (store, create, delete, in order).  On
 *   MDB_MAP_FULL, at any call or at commit, the LMDB transaction is
 *   aborted, the map doubled (mdb_env_set_mapsize, no transaction of this
 *   process on the file is live then), a new write transaction begun and
 *   the log replayed.  Aborting releases LMDB's writer mutex for a moment:
 *   a "growth gate" (an fcntl lock on byte 0 of the data file, see
 *   lmdb_gate()) held across the abort, the growth and the replay (and
 *   across every commit, since a failed commit releases the mutex itself)
 *   keeps the other writers out, so the replay is the same transaction.
 *   As a last defence (a writer outside this adapter, such as mdb_load):
 *   if the new LMDB transaction id shows that somebody committed meanwhile
 *   and our transaction has read anything (fetch, foreach, create,
 *   non-forced delete), the call returns CYRUSDB_AGAIN rather than replay
 *   over a state it never saw.  The map is also doubled before a write
 *   transaction begins when three quarters of it are in use, so small
 *   transactions rarely meet a full map.  The map has no limit but the disk
 *   (and address space); ENOSPC and a failing mmap give CYRUSDB_FULL.
 *   When another process grew the map past our mapping, LMDB returns
 *   MDB_MAP_RESIZED at begin: we adopt the size (mdb_env_set_mapsize(0))
 *   and retry.
 * - fetchlock begins the write transaction: LMDB's writer mutex is the
 *   lock.  Readers never block writers nor the other way round.
 *
 * checkpoint() is mdb_reader_check() plus a forced sync; it does not
 * compact: a compacting copy renamed over the file would need every other
 * process to reopen, and LMDB's lock file (which records the last
 * transaction id and chooses the meta page readers use) would then no
 * longer match the data file for processes that opened it meanwhile.  LMDB
 * reuses freed pages, so the file does not grow without bound; to shrink
 * it, run `mdb_copy -n -c` while no process uses the database.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <lmdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "cyrusdb/cyrusdb_backends.h"
#include "lib/buf.h"
#include "lib/crc32c.h"
#include "lib/fsutil.h"
#include "lib/log.h"
#include "lib/procid.h"

/* The map of a new database; grows by doubling (tests rely on a 1 MiB
 * value or 100,000 keys forcing growth). */
#define LMDB_INITIAL_MAPSIZE ((size_t)1 << 20)
/* Doublings tried for one write before giving up (2^48 MiB is past any
 * address space: the limit is a safety net against a loop, not a quota). */
#define LMDB_MAX_GROWS 48
/* Retries of a begin that keeps answering MDB_MAP_RESIZED. */
#define LMDB_MAX_RESIZED 16
/* Reader slots in the lock file (fixed when the lock file is created):
 * one per handle of every process using the file. */
#define LMDB_MAXREADERS 1024

/* LMDB's on-disk meta page, as laid out by liblmdb 0.9 (pgno_t, txnid_t
 * and pointers are size_t wide): a page header of sizeof(size_t) + 8
 * bytes (pgno, pad, flags, lower/upper), then MDB_meta: magic, version,
 * address, mapsize, two MDB_db records (the free-page db, whose first field
 * holds the page size, and the main db), last page number, transaction id. */
#define LMDB_MAGIC 0xBEEFC0DEu
#define LMDB_DATA_VERSION 1u
#define LMDB_P_META 0x08u
#define LMDB_W ((size_t)sizeof(size_t))
#define LMDB_PAGEHDR (LMDB_W + 8)
#define LMDB_DBREC (8 + 5 * LMDB_W)                 /* sizeof(MDB_db) */
#define LMDB_META_PSIZE 8                           /* within MDB_meta... */
#define LMDB_META_DBS (8 + 2 * LMDB_W)              /* ...after the header */
#define LMDB_META_LASTPG (LMDB_META_DBS + 2 * LMDB_DBREC)
#define LMDB_META_TXNID (LMDB_META_LASTPG + LMDB_W)
#define LMDB_META_END (LMDB_META_TXNID + LMDB_W)
#define LMDB_MIN_PSIZE 256u
#define LMDB_MAX_PSIZE 65536u

/* One LMDB environment: one per database file and process. */
struct lmdb_env {
    struct lmdb_env *next;
    pid_t pid;                  /* the process that opened it */
    dev_t dev;
    ino_t ino;
    char *fname;
    MDB_env *env;
    MDB_dbi dbi;                /* the main database */
    unsigned psize;             /* LMDB page size */
    int mboxsort;               /* the comparator installed */
    int rdonly;                 /* opened with MDB_RDONLY */
    int broken;                 /* LMDB panicked or the map was lost */
    int refcount;               /* handles using it */
    int cursors;                /* cursors open right now (0 between calls) */
    struct lmdb_db *writer;     /* the handle whose write txn is live */
};

/* Process-wide table of environments. */
static struct lmdb_env *lmdb_envs;

/* A write transaction (struct cyrusdb_txn is opaque to callers). */
struct cyrusdb_txn {
    struct lmdb_db *db;
    MDB_txn *txn;               /* NULL after a failure */
    size_t txnid;               /* LMDB id of txn (detects commits of others) */
    struct buf log;             /* replay log: op, keylen, datalen, key, data */
    int observed;               /* it read the database: replay only if alone */
    int error;                  /* first failure: only abort is left */
};

/* Replay log operations. */
enum lmdb_op {
    LMDB_OP_STORE = 'S',
    LMDB_OP_CREATE = 'C',
    LMDB_OP_DELETE = 'D',       /* the key existed */
    LMDB_OP_DELFORCE = 'F'      /* force: absent is fine */
};

struct lmdb_db {
    struct cyrusdb header;      /* must be first */
    struct lmdb_env *e;
    int flags;
    pid_t pid;
    MDB_txn *rtxn;              /* the read txn, reset between calls */
    int rdepth;                 /* nesting of calls using rtxn */
    struct cyrusdb_txn *tid;    /* the open write transaction */
    struct buf data;            /* fetch result */
    struct buf cbkey;           /* foreach callback arguments */
    struct buf cbdata;
};

/* ---- record checksums ---------------------------------------------------- */

/* Bytes of the checksum after every stored value. */
#define LMDB_SUMLEN 4

/* The checksum of a record: CRC-32C over the key, then the value. */
static uint32_t lmdb_record_sum(const void *key, size_t keylen,
                                const void *data, size_t datalen)
{
    uint32_t crc = CRC32C_INIT;

    crc = crc32c_update(crc, key, keylen);
    crc = crc32c_update(crc, data, datalen);
    return crc32c_final(crc);
}

/* Write the record's checksum (little-endian) at out. */
static void lmdb_sum_put(unsigned char *out, const void *key, size_t keylen,
                         const void *data, size_t datalen)
{
    uint32_t sum = lmdb_record_sum(key, keylen, data, datalen);

    out[0] = (unsigned char)(sum & 0xffu);
    out[1] = (unsigned char)((sum >> 8) & 0xffu);
    out[2] = (unsigned char)((sum >> 16) & 0xffu);
    out[3] = (unsigned char)((sum >> 24) & 0xffu);
}

/*
 * Verify a stored record (k, v as LMDB holds them) and give the length of
 * the caller's value (v without the checksum).  Returns NULL if sound, else
 * what is wrong.
 */
static const char *lmdb_record_check(const MDB_val *k, const MDB_val *v,
                                     size_t *datalen_r)
{
    const unsigned char *p = v->mv_data;
    size_t len;
    uint32_t want;

    if (v->mv_size < LMDB_SUMLEN)
        return "stored value too short for its checksum";
    len = v->mv_size - LMDB_SUMLEN;
    want = (uint32_t)p[len] | (uint32_t)p[len + 1] << 8 |
           (uint32_t)p[len + 2] << 16 | (uint32_t)p[len + 3] << 24;
    if (lmdb_record_sum(k->mv_data, k->mv_size, p, len) != want)
        return "record checksum mismatch";
    *datalen_r = len;
    return NULL;
}

/* Log a damaged record: one line naming the file and the key. */
static void lmdb_record_damaged(const char *fname, const MDB_val *k,
                                const char *problem)
{
    char safe[512];

    log_error("lmdb: damaged record file=<%s> key=<%s> error=<%s>", fname,
              log_sanitize(k->mv_data, k->mv_size, safe, sizeof(safe)),
              problem);
}

/* Verify a record read by a call; CYRUSDB_OK or CYRUSDB_IOERROR (logged). */
static int lmdb_record_verify(struct lmdb_env *e, const MDB_val *k,
                              const MDB_val *v, size_t *datalen_r)
{
    const char *problem = lmdb_record_check(k, v, datalen_r);

    if (!problem)
        return CYRUSDB_OK;
    lmdb_record_damaged(e->fname, k, problem);
    return CYRUSDB_IOERROR;
}

/* ---- errors ------------------------------------------------------------ */

/* Map an LMDB (or errno) code to a CYRUSDB_* code, logging the detail. */
static int lmdb_error(struct lmdb_env *e, const char *fname, const char *what,
                      int rc)
{
    int r;

    switch (rc) {
    case MDB_SUCCESS:
        return CYRUSDB_OK;
    case MDB_NOTFOUND:
        return CYRUSDB_NOTFOUND;
    case MDB_KEYEXIST:
        return CYRUSDB_EXISTS;
    case MDB_MAP_FULL:
    case MDB_TXN_FULL:
    case MDB_CURSOR_FULL:
    case MDB_PAGE_FULL:
    case ENOSPC:
    case EDQUOT:
        r = CYRUSDB_FULL;
        break;
    case MDB_READERS_FULL:
    case EAGAIN:
        r = CYRUSDB_AGAIN;
        break;
    case MDB_BAD_VALSIZE:
    case MDB_BAD_TXN:
    case MDB_BAD_RSLOT:
    case MDB_BAD_DBI:
    case MDB_INCOMPATIBLE:
    case MDB_DBS_FULL:
    case MDB_TLS_FULL:
    case EINVAL:
    case ENOMEM:
        r = CYRUSDB_INTERNAL;
        break;
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
        r = CYRUSDB_BADFORMAT;
        break;
    case ENOENT:
        r = CYRUSDB_NOTFOUND;
        break;
    case MDB_PANIC:
        if (e)
            e->broken = 1;
        r = CYRUSDB_IOERROR;
        break;
    default:    /* MDB_CORRUPTED, MDB_PAGE_NOTFOUND, EIO, EACCES, ... */
        r = CYRUSDB_IOERROR;
        break;
    }
    log_error("lmdb: %s failed file=<%s> error=<%s>", what,
              e ? e->fname : fname, mdb_strerror(rc));
    return r;
}

/* Every call starts here: the handle must be used by the process that
 * opened it, and its environment must be usable. */
static int lmdb_check(struct lmdb_db *db)
{
    if (db->pid != procid_get()) {
        log_error("lmdb: handle used in another process than the one that "
                  "opened it file=<%s> pid=<%ld>", db->e->fname,
                  (long)procid_get());
        return CYRUSDB_INTERNAL;
    }
    if (db->e->broken) {
        log_error("lmdb: environment unusable after an earlier fatal error "
                  "file=<%s>", db->e->fname);
        return CYRUSDB_IOERROR;
    }
    return CYRUSDB_OK;
}

/* ---- the file's meta pages (before LMDB maps anything) ------------------ */

static uint32_t lmdb_get32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static size_t lmdb_getw(const unsigned char *p)
{
    size_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static int lmdb_detect(const char *head, size_t len)
{
    const unsigned char *h = (const unsigned char *)head;
    uint16_t flags;

    if (len < LMDB_PAGEHDR + 4)
        return 0;
    memcpy(&flags, h + LMDB_W + 2, sizeof(flags));
    return lmdb_get32(h + LMDB_PAGEHDR) == LMDB_MAGIC &&
           (flags & LMDB_P_META) != 0;
}

/*
 * Check the two meta pages of an existing non-empty file and that the file
 * holds every page the newer one refers to.  LMDB maps the file and trusts
 * it; a truncated file would make it touch pages past the end (SIGBUS).
 * Returns CYRUSDB_OK, or CYRUSDB_BADFORMAT / CYRUSDB_IOERROR with *error_r.
 */
static int lmdb_file_check(int fd, const char **error_r)
{
    unsigned char page[LMDB_PAGEHDR + LMDB_META_END];
    struct stat st;
    size_t psize = 0, lastpg = 0, best_txnid = 0;
    int i, valid = 0;

    if (fstat(fd, &st) < 0) {
        *error_r = "cannot stat the data file";
        return CYRUSDB_IOERROR;
    }
    for (i = 0; i < 2; i++) {
        off_t off = i == 0 ? 0 : (off_t)psize;
        uint32_t ps;
        uint16_t flags;

        if (fs_pread_all(fd, page, sizeof(page), off) < 0) {
            *error_r = "data file too short for LMDB's meta pages";
            return i == 0 ? CYRUSDB_BADFORMAT : CYRUSDB_IOERROR;
        }
        memcpy(&flags, page + LMDB_W + 2, sizeof(flags));
        if (lmdb_get32(page + LMDB_PAGEHDR) != LMDB_MAGIC ||
            !(flags & LMDB_P_META)) {
            *error_r = "bad LMDB meta page (magic)";
            return i == 0 ? CYRUSDB_BADFORMAT : CYRUSDB_IOERROR;
        }
        if (lmdb_get32(page + LMDB_PAGEHDR + 4) != LMDB_DATA_VERSION) {
            *error_r = "unsupported LMDB data format version";
            return CYRUSDB_BADFORMAT;
        }
        ps = lmdb_get32(page + LMDB_PAGEHDR + LMDB_META_DBS);
        if (i == 0) {
            if (ps < LMDB_MIN_PSIZE || ps > LMDB_MAX_PSIZE || (ps & (ps - 1))) {
                *error_r = "bad LMDB page size in the meta page";
                return CYRUSDB_IOERROR;
            }
            psize = ps;
        } else if (ps != psize) {
            *error_r = "LMDB meta pages disagree on the page size";
            return CYRUSDB_IOERROR;
        }
        if (i == 0 || lmdb_getw(page + LMDB_PAGEHDR + LMDB_META_TXNID) >
                      best_txnid) {
            best_txnid = lmdb_getw(page + LMDB_PAGEHDR + LMDB_META_TXNID);
            lastpg = lmdb_getw(page + LMDB_PAGEHDR + LMDB_META_LASTPG);
        }
        valid++;
    }
    if (valid != 2 || lastpg < 1 || lastpg > (size_t)INT64_MAX / psize) {
        *error_r = "bad last page number in the LMDB meta page";
        return CYRUSDB_IOERROR;
    }
    if ((uint64_t)st.st_size < (uint64_t)(lastpg + 1) * psize) {
        *error_r = "data file shorter than its LMDB meta page says "
                   "(truncated)";
        return CYRUSDB_IOERROR;
    }
    return CYRUSDB_OK;
}

/* ---- environments ------------------------------------------------------- */

/* MBOXSORT order for LMDB. */
static int lmdb_cmp_mbox(const MDB_val *a, const MDB_val *b)
{
    return cyrusdb_compare(CYRUSDB_MBOXSORT, a->mv_data, a->mv_size,
                           b->mv_data, b->mv_size);
}

/* Replace the map.  size 0 adopts the size another process recorded.  Only
 * called while this process has no live write txn and no cursor on e (see
 * the invariants above).  LMDB unmaps before it maps anew: when the new
 * mmap() fails (address space exhausted) the environment has no map left
 * and is marked unusable (every handle on it must be closed). */
static int lmdb_env_setsize(struct lmdb_env *e, size_t size)
{
    int rc;

    if (e->cursors) {
        log_error("lmdb: map change with a cursor open file=<%s>", e->fname);
        return CYRUSDB_INTERNAL;
    }
    rc = mdb_env_set_mapsize(e->env, size);
    if (rc == MDB_SUCCESS)
        return CYRUSDB_OK;
    log_error("lmdb: cannot map file=<%s> mapsize=<%zu> error=<%s>",
              e->fname, size, mdb_strerror(rc));
    if (rc == EINVAL)           /* a write txn is live: a bug of ours */
        return CYRUSDB_INTERNAL;
    e->broken = 1;
    return CYRUSDB_FULL;
}

/* Double the map. */
static int lmdb_env_grow(struct lmdb_env *e)
{
    MDB_envinfo info;
    size_t size;
    int r;

    mdb_env_info(e->env, &info);
    if (info.me_mapsize > SIZE_MAX / 2) {
        log_error("lmdb: map cannot grow further file=<%s> mapsize=<%zu>",
                  e->fname, info.me_mapsize);
        return CYRUSDB_FULL;
    }
    size = info.me_mapsize * 2;
    if (size < LMDB_INITIAL_MAPSIZE)
        size = LMDB_INITIAL_MAPSIZE;
    r = lmdb_env_setsize(e, size);
    if (r == CYRUSDB_OK)
        log_info("lmdb: map grown file=<%s> mapsize=<%zu>", e->fname, size);
    return r;
}

/* Grow ahead when three quarters of the map are in use, so that ordinary
 * transactions rarely meet MDB_MAP_FULL (whose cure releases the lock). */
static int lmdb_env_pregrow(struct lmdb_env *e)
{
    MDB_envinfo info;

    mdb_env_info(e->env, &info);
    if ((info.me_last_pgno + 1) * (size_t)e->psize <=
        info.me_mapsize / 4 * 3)
        return CYRUSDB_OK;
    return lmdb_env_grow(e);
}

/* Begin an LMDB txn, adopting a map grown by another process. */
static int lmdb_env_begin(struct lmdb_env *e, unsigned flags, MDB_txn **txn_r)
{
    int rc, tries;

    for (tries = 0;; tries++) {
        *txn_r = NULL;
        rc = mdb_txn_begin(e->env, NULL, flags, txn_r);
        if (rc != MDB_MAP_RESIZED || tries >= LMDB_MAX_RESIZED)
            break;
        if (lmdb_env_setsize(e, 0) != CYRUSDB_OK)
            break;
    }
    if (rc != MDB_SUCCESS)
        *txn_r = NULL;
    return rc;
}

/* ---- structural verification (before LMDB walks a file) ----------------- */

/*
 * LMDB trusts its file: a damaged page can send it past the end of the
 * file (SIGBUS), through a wild pointer (SIGSEGV) or round a cycle.  So
 * every environment is verified when a process opens it, and again by
 * consistent(): starting from the meta page of a read transaction's
 * snapshot (whose pages no writer may reuse while it lives), every page
 * of both trees (the main database and LMDB's free-page database) is
 * visited through the map, with every offset, length and page number
 * checked before use:
 *   - each page is used once (no cycles, no page in two places), lies
 *     within the used part of the file, and records its own number;
 *   - branch and leaf pages: header bounds, node offsets and sizes inside
 *     the page, child pages one level down (all leaves at the depth the
 *     meta page records), keys strictly increasing inside a page
 *     (cyrusdb_compare() order with this handle's flags; numeric for the
 *     free-page database), key lengths 1..511, no node flags we never
 *     write (duplicates, sub-databases);
 *   - big values: the overflow pages exist, are marked as such, hold the
 *     value, and lie inside the file;
 *   - free-page records: well formed, each free page inside the file and
 *     used nowhere else;
 *   - the page, record and depth counts of both trees equal those in the
 *     meta page, and the meta pages + tree pages + free pages are exactly
 *     the used pages.
 * Cost: one pass over the used part of the file per open.
 */
#define LMDB_P_BRANCH 0x01u
#define LMDB_P_LEAF 0x02u
#define LMDB_P_OVERFLOW 0x04u
#define LMDB_F_BIGDATA 0x01u
#define LMDB_NODESZ 8u
#define LMDB_MAX_DEPTH 32u                    /* LMDB's cursor stack */
#define LMDB_INVALID_PGNO (~(size_t)0)
#define LMDB_MAIN_FLAGS_OK 0u
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define LMDB_NODE_LO 2
#define LMDB_NODE_HI 0
#else
#define LMDB_NODE_LO 0
#define LMDB_NODE_HI 2
#endif

struct lmdb_verify {
    const unsigned char *map;
    size_t psize;
    size_t npages;              /* used pages: last page number + 1 */
    size_t marked;
    unsigned char *seen;        /* one bit per page */
    int flags;                  /* cyrusdb flags: key order */
    int freedb;                 /* walking the free-page database */
    size_t branch, leaf, overflow, entries, nfree;
    const char *problem;
};

static uint16_t lmdb_get16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static int lmdb_verify_fail(struct lmdb_verify *v, const char *problem)
{
    if (!v->problem)
        v->problem = problem;
    return -1;
}

/* Claim pages [pgno, pgno + n) for one use. */
static int lmdb_verify_mark(struct lmdb_verify *v, size_t pgno, size_t n)
{
    size_t i;

    if (pgno < 2 || n == 0 || pgno >= v->npages || n > v->npages - pgno)
        return lmdb_verify_fail(v, "page number out of range");
    for (i = pgno; i < pgno + n; i++) {
        if (v->seen[i / 8] & (1u << (i % 8)))
            return lmdb_verify_fail(v, "page used twice (or a cycle)");
        v->seen[i / 8] |= (unsigned char)(1u << (i % 8));
    }
    v->marked += n;
    return 0;
}

static int lmdb_verify_keycmp(struct lmdb_verify *v,
                              const unsigned char *a, size_t alen,
                              const unsigned char *b, size_t blen)
{
    if (v->freedb) {
        size_t x = lmdb_getw(a), y = lmdb_getw(b);
        return x < y ? -1 : x > y;
    }
    return cyrusdb_compare(v->flags, (const char *)a, alen,
                           (const char *)b, blen);
}

/* A free-page record: count, then that many page numbers. */
static int lmdb_verify_idl(struct lmdb_verify *v, const unsigned char *d,
                           size_t len)
{
    size_t n, i;

    if (len < LMDB_W || len % LMDB_W)
        return lmdb_verify_fail(v, "bad free-page record size");
    n = lmdb_getw(d);
    if (n != len / LMDB_W - 1)
        return lmdb_verify_fail(v, "bad free-page record count");
    for (i = 1; i <= n; i++)
        if (lmdb_verify_mark(v, lmdb_getw(d + i * LMDB_W), 1) < 0)
            return -1;
    v->nfree += n;
    return 0;
}

/* Verify the subtree at pgno, `level` levels below the root; the leaves
 * must be at level want_leaf. */
static int lmdb_verify_tree(struct lmdb_verify *v, size_t pgno,
                            unsigned level, unsigned want_leaf)
{
    const unsigned char *p, *prevkey = NULL;
    size_t prevlen = 0, n, i;
    unsigned flags, lower, upper;

    if (level > want_leaf || level >= LMDB_MAX_DEPTH)
        return lmdb_verify_fail(v, "tree deeper than the meta page says");
    if (lmdb_verify_mark(v, pgno, 1) < 0)
        return -1;
    p = v->map + pgno * v->psize;
    if (lmdb_getw(p) != pgno)
        return lmdb_verify_fail(v, "page does not carry its own number");
    flags = lmdb_get16(p + LMDB_W + 2);
    lower = lmdb_get16(p + LMDB_W + 4);
    upper = lmdb_get16(p + LMDB_W + 6);
    if (flags != LMDB_P_BRANCH && flags != LMDB_P_LEAF)
        return lmdb_verify_fail(v, "bad page type in a tree");
    if ((flags == LMDB_P_LEAF) != (level == want_leaf))
        return lmdb_verify_fail(v, "leaf page at the wrong depth");
    if (lower < LMDB_PAGEHDR || lower > upper || upper > v->psize ||
        (lower - LMDB_PAGEHDR) % 2)
        return lmdb_verify_fail(v, "bad page header bounds");
    n = (lower - LMDB_PAGEHDR) / 2;
    if (flags == LMDB_P_BRANCH ? n < 2 : n < 1)
        return lmdb_verify_fail(v, "too few entries in a page");
    if (flags == LMDB_P_BRANCH)
        v->branch++;
    else
        v->leaf++;

    for (i = 0; i < n; i++) {
        size_t off = lmdb_get16(p + LMDB_PAGEHDR + 2 * i);
        const unsigned char *node, *key;
        size_t ksize, lo, hi, nflags, end;

        if (off < upper || off % 2 || off + LMDB_NODESZ > v->psize)
            return lmdb_verify_fail(v, "node offset outside its page");
        node = p + off;
        lo = lmdb_get16(node + LMDB_NODE_LO);
        hi = lmdb_get16(node + LMDB_NODE_HI);
        nflags = lmdb_get16(node + 4);
        ksize = lmdb_get16(node + 6);
        key = node + LMDB_NODESZ;
        end = off + LMDB_NODESZ + ksize;
        if (end > v->psize)
            return lmdb_verify_fail(v, "key runs past its page");
        if (flags == LMDB_P_BRANCH) {
            size_t child = lo | (hi << 16) |
                           (LMDB_W > 4 ? nflags << 16 << 16 : 0);

            if (i > 0 && (v->freedb ? ksize != LMDB_W
                                    : ksize == 0 || ksize > 511))
                return lmdb_verify_fail(v, "bad key length");
            if (i > 1 && lmdb_verify_keycmp(v, prevkey, prevlen, key,
                                            ksize) >= 0)
                return lmdb_verify_fail(v, "branch keys out of order");
            prevkey = key;
            prevlen = ksize;
            if (lmdb_verify_tree(v, child, level + 1, want_leaf) < 0)
                return -1;
            continue;
        }

        /* leaf node */
        {
            size_t dsize = lo | (hi << 16);
            const unsigned char *data = key + ksize;

            if (v->freedb ? ksize != LMDB_W : ksize == 0 || ksize > 511)
                return lmdb_verify_fail(v, "bad key length");
            if (i > 0 && lmdb_verify_keycmp(v, prevkey, prevlen, key,
                                            ksize) >= 0)
                return lmdb_verify_fail(v, "keys out of order in a page "
                                           "(damage, or the wrong "
                                           "CYRUSDB_MBOXSORT setting)");
            prevkey = key;
            prevlen = ksize;
            if (nflags == LMDB_F_BIGDATA) {
                size_t ov, npg;
                const unsigned char *op;

                if (end + LMDB_W > v->psize)
                    return lmdb_verify_fail(v, "node runs past its page");
                ov = lmdb_getw(data);
                if (ov < 2 || ov >= v->npages)
                    return lmdb_verify_fail(v, "overflow page out of range");
                op = v->map + ov * v->psize;
                npg = lmdb_get32(op + LMDB_W + 4);
                if (lmdb_getw(op) != ov ||
                    lmdb_get16(op + LMDB_W + 2) != LMDB_P_OVERFLOW)
                    return lmdb_verify_fail(v, "bad overflow page");
                if (npg == 0 || npg > v->npages ||
                    dsize > npg * v->psize - LMDB_PAGEHDR)
                    return lmdb_verify_fail(v, "value larger than its "
                                               "overflow pages");
                if (lmdb_verify_mark(v, ov, npg) < 0)
                    return -1;
                v->overflow += npg;
                data = op + LMDB_PAGEHDR;
            } else if (nflags != 0) {
                return lmdb_verify_fail(v, "node flags this backend never "
                                           "writes");
            } else if (end + dsize > v->psize) {
                return lmdb_verify_fail(v, "value runs past its page");
            }
            if (v->freedb && lmdb_verify_idl(v, data, dsize) < 0)
                return -1;
            v->entries++;
        }
    }
    return 0;
}

/* Verify one tree against its MDB_db record (at rec) in the meta page. */
static int lmdb_verify_db(struct lmdb_verify *v, const unsigned char *rec,
                          int freedb)
{
    unsigned dbflags = lmdb_get16(rec + 4), depth = lmdb_get16(rec + 6);
    size_t root = lmdb_getw(rec + 8 + 4 * LMDB_W);

    v->freedb = freedb;
    v->branch = v->leaf = v->overflow = v->entries = 0;
    /* the free-page db's flags word holds the environment's flags */
    if (!freedb && dbflags != LMDB_MAIN_FLAGS_OK)
        return lmdb_verify_fail(v, "unexpected database flags");
    if (root == LMDB_INVALID_PGNO) {
        if (depth != 0)
            return lmdb_verify_fail(v, "empty tree with a depth");
    } else if (depth == 0 || depth > LMDB_MAX_DEPTH ||
               lmdb_verify_tree(v, root, 1, depth) < 0) {
        return lmdb_verify_fail(v, "bad tree depth");
    }
    if (v->branch != lmdb_getw(rec + 8) ||
        v->leaf != lmdb_getw(rec + 8 + LMDB_W) ||
        v->overflow != lmdb_getw(rec + 8 + 2 * LMDB_W) ||
        v->entries != lmdb_getw(rec + 8 + 3 * LMDB_W))
        return lmdb_verify_fail(v, "page or record counts differ from the "
                                   "meta page");
    return 0;
}

/*
 * Verify the snapshot of the live read transaction txn.  Returns
 * CYRUSDB_OK, CYRUSDB_IOERROR with *problem_r, or CYRUSDB_AGAIN when two
 * commits since the snapshot began overwrote its meta page (renew and
 * retry).
 */
static int lmdb_verify(struct lmdb_env *e, MDB_txn *txn, int flags,
                       const char **problem_r)
{
    struct lmdb_verify v;
    unsigned char metacopy[LMDB_META_END];
    const unsigned char *meta = NULL;
    mdb_filehandle_t fd;
    MDB_envinfo info;
    struct stat st;
    size_t txnid = mdb_txn_id(txn), lastpg, maplen;
    void *map;
    int i;

    memset(&v, 0, sizeof(v));
    v.psize = e->psize;
    v.flags = flags;
    /* our own read-only view of the file (LMDB does not tell where its map
     * is); every page read lies below the file size, so no SIGBUS */
    if (mdb_env_get_fd(e->env, &fd) != MDB_SUCCESS || fstat(fd, &st) < 0) {
        *problem_r = "cannot stat the data file";
        return CYRUSDB_IOERROR;
    }
    if ((uint64_t)st.st_size < 2 * (uint64_t)v.psize ||
        (uint64_t)st.st_size > SIZE_MAX) {
        *problem_r = "data file too short for its meta pages";
        return CYRUSDB_IOERROR;
    }
    maplen = (size_t)st.st_size;
    map = mmap(NULL, maplen, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        log_error("lmdb: mmap for verification failed file=<%s> error=<%s>",
                  e->fname, strerror(errno));
        *problem_r = "cannot map the data file";
        return errno == ENOMEM ? CYRUSDB_INTERNAL : CYRUSDB_IOERROR;
    }
    v.map = map;
    /* The reader pins the pages of its snapshot but not the meta page: a
     * writer may overwrite it (two commits later) while we look.  Work on a
     * copy, and make sure the copy was taken before any such overwrite. */
    for (i = 0; i < 2; i++) {
        const unsigned char *m = v.map + (size_t)i * v.psize + LMDB_PAGEHDR;
        if (lmdb_getw(m + LMDB_META_TXNID) == txnid) {
            memcpy(metacopy, m, sizeof(metacopy));
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            if (lmdb_getw(m + LMDB_META_TXNID) == txnid &&
                lmdb_getw(metacopy + LMDB_META_TXNID) == txnid)
                meta = metacopy;
        }
    }
    if (!meta) {
        munmap(map, maplen);
        return CYRUSDB_AGAIN;
    }
    lastpg = lmdb_getw(meta + LMDB_META_LASTPG);
    mdb_env_info(e->env, &info);
    if (lastpg < 1 || lastpg >= info.me_mapsize / v.psize ||
        lastpg >= maplen / v.psize) {
        munmap(map, maplen);
        *problem_r = "used pages beyond the file or the map";
        return CYRUSDB_IOERROR;
    }
    v.npages = lastpg + 1;
    v.seen = calloc(v.npages / 8 + 1, 1);
    if (!v.seen) {
        munmap(map, maplen);
        *problem_r = "out of memory";
        return CYRUSDB_INTERNAL;
    }
    v.seen[0] = 3;              /* the meta pages */
    v.marked = 2;
    if (lmdb_verify_db(&v, meta + LMDB_META_DBS, 1) == 0 &&
        lmdb_verify_db(&v, meta + LMDB_META_DBS + LMDB_DBREC, 0) == 0 &&
        v.marked != v.npages)
        lmdb_verify_fail(&v, "pages neither in a tree nor free");
    free(v.seen);
    munmap(map, maplen);
    if (v.problem) {
        *problem_r = v.problem;
        return CYRUSDB_IOERROR;
    }
    return CYRUSDB_OK;
}

/* Verify the current state with a read txn of its own (at open). */
static int lmdb_env_verify(struct lmdb_env *e, int flags,
                           const char **problem_r)
{
    MDB_txn *txn;
    int r = CYRUSDB_AGAIN, rc, tries;

    for (tries = 0; tries < 8 && r == CYRUSDB_AGAIN; tries++) {
        rc = lmdb_env_begin(e, MDB_RDONLY, &txn);
        if (rc != MDB_SUCCESS) {
            *problem_r = mdb_strerror(rc);
            return lmdb_error(e, NULL, "begin of a read transaction", rc);
        }
        r = lmdb_verify(e, txn, flags, problem_r);
        mdb_txn_abort(txn);
    }
    if (r == CYRUSDB_AGAIN)
        *problem_r = "the database changed too fast to be verified";
    return r;
}

static void lmdb_env_release(struct lmdb_env *e)
{
    struct lmdb_env **pp;

    if (--e->refcount > 0)
        return;
    for (pp = &lmdb_envs; *pp; pp = &(*pp)->next) {
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    }
    mdb_env_close(e->env);
    free(e->fname);
    free(e);
}

/*
 * Find this process's environment for fname, or open one.  `created`: the
 * file is new or empty (LMDB initialises it; we make that durable).
 */
static int lmdb_env_acquire(const char *fname, int flags, int created,
                            struct lmdb_env **e_r, const char **error_r)
{
    int rdonly = (flags & CYRUSDB_RDONLY) != 0;
    int mboxsort = (flags & CYRUSDB_MBOXSORT) != 0;
    struct lmdb_env *e;
    MDB_txn *txn = NULL;
    MDB_envinfo info;
    MDB_stat mst;
    mdb_filehandle_t fd;
    struct stat st;
    pid_t pid = procid_get();
    int rc, r, dead = 0;

    *e_r = NULL;
    if (!created && stat(fname, &st) == 0) {
        for (e = lmdb_envs; e; e = e->next) {
            if (e->pid != pid || e->dev != st.st_dev || e->ino != st.st_ino)
                continue;
            if (e->broken) {
                *error_r = "the LMDB environment of this process is unusable "
                           "after a fatal error; close every handle on it";
                return CYRUSDB_IOERROR;
            }
            if (e->mboxsort != mboxsort) {
                *error_r = "already open in this process with another key "
                           "order (CYRUSDB_MBOXSORT)";
                return CYRUSDB_INTERNAL;
            }
            if (e->rdonly && !rdonly) {
                *error_r = "already open read-only in this process";
                return CYRUSDB_LOCKED;
            }
            e->refcount++;
            *e_r = e;
            return CYRUSDB_OK;
        }
    }

    e = calloc(1, sizeof(*e));
    if (!e || !(e->fname = strdup(fname))) {
        free(e);
        *error_r = "out of memory";
        return CYRUSDB_INTERNAL;
    }
    e->pid = pid;
    e->mboxsort = mboxsort;
    e->rdonly = rdonly;
    e->refcount = 1;

    rc = mdb_env_create(&e->env);
    if (rc == MDB_SUCCESS)
        rc = mdb_env_set_maxreaders(e->env, LMDB_MAXREADERS);
    if (rc != MDB_SUCCESS) {
        r = lmdb_error(NULL, fname, "mdb_env_create", rc);
        *error_r = "cannot create an LMDB environment";
        goto fail;
    }
    rc = mdb_env_open(e->env, fname,
                      MDB_NOSUBDIR | MDB_NOTLS | (rdonly ? MDB_RDONLY : 0),
                      0644);
    if (rc != MDB_SUCCESS) {
        r = lmdb_error(NULL, fname, "mdb_env_open", rc);
        *error_r = r == CYRUSDB_BADFORMAT ? "not an LMDB database"
                                          : "cannot open the LMDB environment";
        goto fail;
    }
    if (mdb_env_get_fd(e->env, &fd) != MDB_SUCCESS || fstat(fd, &st) < 0) {
        r = CYRUSDB_IOERROR;
        *error_r = "cannot stat the data file";
        goto fail;
    }
    e->dev = st.st_dev;
    e->ino = st.st_ino;

    rc = mdb_reader_check(e->env, &dead);
    if (rc != MDB_SUCCESS)
        log_warning("lmdb: reader check failed file=<%s> error=<%s>",
                    fname, mdb_strerror(rc));
    else if (dead > 0)
        log_info("lmdb: cleared stale readers file=<%s> count=<%d>",
                 fname, dead);

    mdb_env_info(e->env, &info);
    if (info.me_mapsize < LMDB_INITIAL_MAPSIZE) {
        r = lmdb_env_setsize(e, LMDB_INITIAL_MAPSIZE);
        if (r != CYRUSDB_OK) {
            *error_r = "cannot map the data file";
            goto fail;
        }
    }
    if (mdb_env_stat(e->env, &mst) != MDB_SUCCESS) {
        r = CYRUSDB_IOERROR;
        *error_r = "cannot read LMDB statistics";
        goto fail;
    }
    e->psize = mst.ms_psize;

    /* the main database, with our order: a read txn suffices, so that an
     * open never waits for a writer */
    rc = lmdb_env_begin(e, MDB_RDONLY, &txn);
    if (rc == MDB_SUCCESS)
        rc = mdb_dbi_open(txn, NULL, 0, &e->dbi);
    if (rc == MDB_SUCCESS && mboxsort)
        rc = mdb_set_compare(txn, e->dbi, lmdb_cmp_mbox);
    if (rc == MDB_SUCCESS) {
        rc = mdb_txn_commit(txn);
        txn = NULL;
    }
    if (rc != MDB_SUCCESS) {
        if (txn)
            mdb_txn_abort(txn);
        r = lmdb_error(e, fname, "mdb_dbi_open", rc);
        *error_r = "cannot open the main LMDB database";
        goto fail;
    }

    r = lmdb_env_verify(e, flags, error_r);
    if (r != CYRUSDB_OK) {
        log_error("lmdb: damaged file file=<%s> error=<%s>", fname, *error_r);
        goto fail;
    }

    if (created && !rdonly) {
        /* LMDB wrote the meta pages with pwrite(): make them and the new
         * directory entry durable */
        rc = mdb_env_sync(e->env, 1);
        if (rc != MDB_SUCCESS || fs_fsync_parent(fname) < 0) {
            r = lmdb_error(e, fname, "sync of the new file",
                           rc != MDB_SUCCESS ? rc : errno);
            *error_r = "cannot sync the new database file";
            goto fail;
        }
    }

    e->next = lmdb_envs;
    lmdb_envs = e;
    *e_r = e;
    return CYRUSDB_OK;

fail:
    if (e->env)
        mdb_env_close(e->env);
    free(e->fname);
    free(e);
    return r;
}

/* ---- read transactions (tid == NULL) ------------------------------------ */

/*
 * LMDB 0.9 picks a reader's meta page by the parity of the transaction id
 * it read from the lock file and copies the roots from it without checking
 * that the page still holds that transaction: if two commits land in
 * between, the page already holds a later (or half-written) state.  Seen
 * here as a reader going back in time under load.  So after a read
 * transaction starts, the meta page it used must still carry its id; if not,
 * the transaction is started again.
 */
static int lmdb_read_snapshot_ok(struct lmdb_env *e, MDB_txn *txn)
{
    mdb_filehandle_t fd;
    size_t id = mdb_txn_id(txn);
    unsigned char w[LMDB_W];

    /* read through the descriptor (the page cache LMDB's map shares):
     * LMDB does not tell where its map is */
    if (!e->psize || mdb_env_get_fd(e->env, &fd) != MDB_SUCCESS ||
        fs_pread_all(fd, w, sizeof(w), (off_t)((id & 1) * (size_t)e->psize +
                                               LMDB_PAGEHDR + LMDB_META_TXNID)) < 0)
        return 1;
    return lmdb_getw(w) == id;
}

/* Make db->rtxn live (nested uses share it: a fetch inside a foreach
 * callback must not reset the foreach's snapshot). */
static int lmdb_read_begin(struct lmdb_db *db)
{
    struct lmdb_env *e = db->e;
    int rc = MDB_NOTFOUND, tries;

    if (db->rdepth > 0) {
        db->rdepth++;
        return CYRUSDB_OK;
    }
    if (db->rtxn) {
        rc = mdb_txn_renew(db->rtxn);
        if (rc != MDB_SUCCESS) {
            /* e.g. MDB_MAP_RESIZED: start afresh (lmdb_env_begin adopts) */
            mdb_txn_abort(db->rtxn);
            db->rtxn = NULL;
        }
    }
    if (rc != MDB_SUCCESS)
        rc = lmdb_env_begin(e, MDB_RDONLY, &db->rtxn);
    for (tries = 0; rc == MDB_SUCCESS && tries < 100 &&
                    !lmdb_read_snapshot_ok(e, db->rtxn); tries++) {
        mdb_txn_reset(db->rtxn);
        rc = mdb_txn_renew(db->rtxn);
    }
    if (rc != MDB_SUCCESS)
        return lmdb_error(e, NULL, "begin of a read transaction", rc);
    db->rdepth = 1;
    return CYRUSDB_OK;
}

static void lmdb_read_end(struct lmdb_db *db)
{
    if (db->rdepth > 0 && --db->rdepth == 0)
        mdb_txn_reset(db->rtxn);
}

/* ---- write transactions ------------------------------------------------- */

/*
 * The growth gate: an fcntl() lock on byte 0 of the data file (LMDB locks
 * only its lock file; the descriptor is LMDB's own, so no close() of ours
 * can drop it).  A writer that must grow the map holds it exclusively from
 * before it aborts its LMDB txn until the replay is done; every writer,
 * once it has LMDB's writer mutex, checks that no other process holds the
 * gate, and if one does, gives the mutex back and waits for the gate.  So
 * the aborted transaction's writer mutex passes to nobody else and the
 * replay is equivalent to the original transaction.  (A writer outside
 * this adapter, e.g. mdb_load, ignores the gate: the transaction id check
 * in lmdb_txn_regrow() still catches that.)  Returns 0, 1 (F_GETLK: held by
 * another process) or -1 with errno.
 */
static int lmdb_gate(struct lmdb_env *e, int cmd, short type)
{
    mdb_filehandle_t fd;
    struct flock fl;
    int rc;

    if (mdb_env_get_fd(e->env, &fd) != MDB_SUCCESS) {
        errno = EBADF;
        return -1;
    }
    memset(&fl, 0, sizeof(fl));
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = 0;
    fl.l_len = 1;
    do {
        rc = fcntl(fd, cmd, &fl);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0) {
        log_error("lmdb: growth gate lock failed file=<%s> error=<%s>",
                  e->fname, strerror(errno));
        return -1;
    }
    return cmd == F_GETLK && fl.l_type != F_UNLCK ? 1 : 0;
}

/* Set the environment's MDB_NOSYNC to db's CYRUSDB_NOSYNC, for the write
 * transaction db begins or commits now (see CRASH SAFETY at the top). */
static int lmdb_env_durability(struct lmdb_db *db)
{
    int rc = mdb_env_set_flags(db->e->env, MDB_NOSYNC,
                               (db->flags & CYRUSDB_NOSYNC) ? 1 : 0);

    if (rc != MDB_SUCCESS)
        return lmdb_error(db->e, NULL, "mdb_env_set_flags", rc);
    return CYRUSDB_OK;
}

/* Begin t->txn for db: the process-local writer check, LMDB's mutex, then
 * the growth gate. */
static int lmdb_txn_begin(struct lmdb_db *db, struct cyrusdb_txn *t)
{
    struct lmdb_env *e = db->e;
    int rc, r, busy;

    if (e->writer && e->writer != db) {
        log_warning("lmdb: another handle of this process holds the write "
                    "transaction file=<%s>", e->fname);
        return CYRUSDB_LOCKED;
    }
    if (e->rdonly)
        return CYRUSDB_READONLY;
    if ((r = lmdb_env_durability(db)) != CYRUSDB_OK)
        return r;
    for (;;) {
        if ((r = lmdb_env_pregrow(e)) != CYRUSDB_OK)
            return r;
        rc = lmdb_env_begin(e, 0, &t->txn);
        if (rc != MDB_SUCCESS)
            return lmdb_error(e, NULL, "begin of a write transaction", rc);
        busy = lmdb_gate(e, F_GETLK, F_RDLCK);
        if (busy == 0)
            break;
        mdb_txn_abort(t->txn);
        t->txn = NULL;
        if (busy < 0 || lmdb_gate(e, F_SETLKW, F_RDLCK) < 0 ||
            lmdb_gate(e, F_SETLK, F_UNLCK) < 0)
            return CYRUSDB_IOERROR;
    }
    t->txnid = mdb_txn_id(t->txn);
    e->writer = db;
    return CYRUSDB_OK;
}

/* Put key -> data + checksum: LMDB reserves the space, we fill it. */
static int lmdb_put(struct lmdb_env *e, MDB_txn *txn,
                    const char *key, size_t keylen,
                    const char *data, size_t datalen, unsigned flags)
{
    MDB_val k, v;
    int rc;

    if (datalen > SIZE_MAX - LMDB_SUMLEN)
        return MDB_BAD_VALSIZE;
    k.mv_size = keylen;
    k.mv_data = (void *)key;
    v.mv_size = datalen + LMDB_SUMLEN;
    v.mv_data = NULL;
    rc = mdb_put(txn, e->dbi, &k, &v, flags | MDB_RESERVE);
    if (rc != MDB_SUCCESS)
        return rc;      /* (on MDB_KEYEXIST v is the existing value) */
    if (datalen)
        memcpy(v.mv_data, data, datalen);
    lmdb_sum_put((unsigned char *)v.mv_data + datalen, key, keylen,
                 data, datalen);
    return MDB_SUCCESS;
}

/* Apply one operation to an LMDB txn (the replay log replays through here
 * too, so every stored value gets its checksum); returns an LMDB code. */
static int lmdb_op_apply(struct lmdb_env *e, MDB_txn *txn, int op,
                         const char *key, size_t keylen,
                         const char *data, size_t datalen)
{
    MDB_val k;
    int rc;

    k.mv_size = keylen;
    k.mv_data = (void *)key;
    switch (op) {
    case LMDB_OP_STORE:
        return lmdb_put(e, txn, key, keylen, data, datalen, 0);
    case LMDB_OP_CREATE:
        return lmdb_put(e, txn, key, keylen, data, datalen, MDB_NOOVERWRITE);
    case LMDB_OP_DELETE:
        return mdb_del(txn, e->dbi, &k, NULL);
    case LMDB_OP_DELFORCE:
        rc = mdb_del(txn, e->dbi, &k, NULL);
        return rc == MDB_NOTFOUND ? MDB_SUCCESS : rc;
    default:
        return EINVAL;
    }
}

static int lmdb_log_append(struct cyrusdb_txn *t, int op,
                           const char *key, size_t keylen,
                           const char *data, size_t datalen)
{
    unsigned char c = (unsigned char)op;

    if (buf_append(&t->log, &c, 1) < 0 ||
        buf_append(&t->log, &keylen, sizeof(keylen)) < 0 ||
        buf_append(&t->log, &datalen, sizeof(datalen)) < 0 ||
        buf_append(&t->log, key, keylen) < 0 ||
        buf_append(&t->log, data, datalen) < 0)
        return -1;
    return 0;
}

/* Replay the log into t->txn; returns an LMDB code. */
static int lmdb_log_replay(struct lmdb_env *e, struct cyrusdb_txn *t)
{
    size_t off = 0;

    while (off < t->log.len) {
        const char *p = t->log.s + off;
        size_t keylen, datalen;
        int op = (unsigned char)p[0], rc;

        memcpy(&keylen, p + 1, sizeof(keylen));
        memcpy(&datalen, p + 1 + sizeof(keylen), sizeof(datalen));
        p += 1 + 2 * sizeof(size_t);
        rc = lmdb_op_apply(e, t->txn, op, p, keylen, p + keylen, datalen);
        if (rc != MDB_SUCCESS)
            return rc;
        off += 1 + 2 * sizeof(size_t) + keylen + datalen;
    }
    return MDB_SUCCESS;
}

/* Record a failure: the transaction can only be aborted now. */
static int lmdb_txn_fail(struct cyrusdb_txn *t, int r)
{
    if (t->txn) {
        mdb_txn_abort(t->txn);
        t->txn = NULL;
    }
    if (!t->error)
        t->error = r;
    return r;
}

/*
 * MDB_MAP_FULL met: abort the LMDB txn, grow the map, begin again and
 * replay the log, repeating until the log fits.  The caller holds the
 * growth gate, so no writer of this adapter commits in between; if another
 * writer did (the LMDB txn id moved) and the transaction read anything,
 * the replay could lose that writer's update: CYRUSDB_AGAIN instead.
 */
static int lmdb_txn_regrow_gated(struct lmdb_db *db, struct cyrusdb_txn *t)
{
    struct lmdb_env *e = db->e;
    size_t oldid = t->txnid;
    int grows, rc, r;

    for (grows = 0; grows < LMDB_MAX_GROWS; grows++) {
        if (t->txn) {
            mdb_txn_abort(t->txn);
            t->txn = NULL;
        }
        if ((r = lmdb_env_grow(e)) != CYRUSDB_OK)
            return r;
        rc = lmdb_env_begin(e, 0, &t->txn);
        if (rc != MDB_SUCCESS)
            return lmdb_error(e, NULL, "begin after growing the map", rc);
        t->txnid = mdb_txn_id(t->txn);
        if (t->txnid != oldid && t->observed) {
            log_warning("lmdb: map grown, but another process committed "
                        "meanwhile; transaction must be retried file=<%s>",
                        e->fname);
            return CYRUSDB_AGAIN;
        }
        rc = lmdb_log_replay(e, t);
        if (rc == MDB_SUCCESS)
            return CYRUSDB_OK;
        if (rc == MDB_KEYEXIST || rc == MDB_NOTFOUND) {
            /* cannot happen: such writes set observed */
            log_error("lmdb: replay found another state file=<%s>", e->fname);
            return CYRUSDB_AGAIN;
        }
        if (rc != MDB_MAP_FULL)
            return lmdb_error(e, NULL, "replay after growing the map", rc);
    }
    log_error("lmdb: map still full after %d doublings file=<%s>",
              LMDB_MAX_GROWS, e->fname);
    return CYRUSDB_FULL;
}

static int lmdb_txn_regrow(struct lmdb_db *db, struct cyrusdb_txn *t)
{
    struct lmdb_env *e = db->e;
    int r;

    /* t->txn holds LMDB's writer mutex: the gate is only ever taken
     * exclusively by the holder of the mutex, so no other process holds
     * it now (or only for a moment, in lmdb_txn_begin's wait) */
    if (lmdb_gate(e, F_SETLKW, F_WRLCK) < 0)
        return CYRUSDB_IOERROR;
    r = lmdb_txn_regrow_gated(db, t);
    if (lmdb_gate(e, F_SETLK, F_UNLCK) < 0 && r == CYRUSDB_OK)
        r = CYRUSDB_IOERROR;
    return r;
}

/* One write inside t, growing the map as needed. */
static int lmdb_txn_write(struct lmdb_db *db, struct cyrusdb_txn *t, int op,
                          const char *key, size_t keylen,
                          const char *data, size_t datalen)
{
    struct lmdb_env *e = db->e;
    int rc, r;

    if (op == LMDB_OP_CREATE || op == LMDB_OP_DELETE)
        t->observed = 1;
    for (;;) {
        rc = lmdb_op_apply(e, t->txn, op, key, keylen, data, datalen);
        if (rc != MDB_MAP_FULL)
            break;
        if ((r = lmdb_txn_regrow(db, t)) != CYRUSDB_OK)
            return lmdb_txn_fail(t, r);
    }
    if (rc == MDB_KEYEXIST)
        return CYRUSDB_EXISTS;          /* nothing changed; txn still fine */
    if (rc == MDB_NOTFOUND)
        return CYRUSDB_NOTFOUND;
    if (rc != MDB_SUCCESS)
        return lmdb_txn_fail(t, lmdb_error(e, NULL, "write", rc));
    if (lmdb_log_append(t, op, key, keylen, data, datalen) < 0) {
        log_error("lmdb: out of memory for the transaction log file=<%s> "
                  "bytes=<%zu>", e->fname, t->log.len);
        return lmdb_txn_fail(t, CYRUSDB_INTERNAL);
    }
    return CYRUSDB_OK;
}

static struct cyrusdb_txn *lmdb_txn_new(struct lmdb_db *db)
{
    struct cyrusdb_txn *t = calloc(1, sizeof(*t));

    if (t) {
        t->db = db;
        buf_set_max(&t->log, SIZE_MAX);
    }
    return t;
}

/* End t (LMDB txn already committed or to abort) and free it. */
static void lmdb_txn_free(struct lmdb_db *db, struct cyrusdb_txn *t)
{
    if (t->txn)
        mdb_txn_abort(t->txn);
    if (db->e->writer == db)
        db->e->writer = NULL;
    if (db->tid == t)
        db->tid = NULL;
    buf_free(&t->log);
    free(t);
}

/* Commit t (retrying with a grown map) and free it. */
static int lmdb_txn_commit(struct lmdb_db *db, struct cyrusdb_txn *t)
{
    int rc, r;

    if (t->error) {
        r = t->error;
        lmdb_txn_free(db, t);
        return r;
    }
    /* MDB_NOSYNC as this handle wants it (set at begin; again here, so
     * that nothing in between can have left another handle's choice) */
    if ((r = lmdb_env_durability(db)) != CYRUSDB_OK) {
        lmdb_txn_free(db, t);
        return r;
    }
    /* a commit that fails releases the writer mutex at once: hold the
     * growth gate across it, so that the retry stays our transaction */
    if (lmdb_gate(db->e, F_SETLKW, F_WRLCK) < 0) {
        lmdb_txn_free(db, t);
        return CYRUSDB_IOERROR;
    }
    for (;;) {
        rc = mdb_txn_commit(t->txn);
        t->txn = NULL;                  /* freed by LMDB, success or not */
        if (rc != MDB_MAP_FULL)
            break;
        if ((r = lmdb_txn_regrow_gated(db, t)) != CYRUSDB_OK) {
            lmdb_gate(db->e, F_SETLK, F_UNLCK);
            lmdb_txn_free(db, t);
            return r;
        }
    }
    if (lmdb_gate(db->e, F_SETLK, F_UNLCK) < 0 && rc == MDB_SUCCESS) {
        /* committed; the gate goes with this process at the latest */
        log_warning("lmdb: growth gate not released file=<%s>", db->e->fname);
    }
    r = rc == MDB_SUCCESS ? CYRUSDB_OK : lmdb_error(db->e, NULL, "commit", rc);
    lmdb_txn_free(db, t);
    return r;
}

/*
 * Find the transaction of a call with tid != NULL: the handle's open one,
 * or a new one when *tid is NULL.
 */
static int lmdb_tid_get(struct lmdb_db *db, struct cyrusdb_txn **tid,
                        struct cyrusdb_txn **t_r)
{
    struct cyrusdb_txn *t;
    int r;

    if (*tid) {
        if (*tid != db->tid)
            return CYRUSDB_INTERNAL;
        if ((*tid)->error)
            return (*tid)->error;
        *t_r = *tid;
        return CYRUSDB_OK;
    }
    if (db->tid)
        return CYRUSDB_LOCKED;
    if (db->flags & CYRUSDB_RDONLY)
        return CYRUSDB_READONLY;
    if (!(t = lmdb_txn_new(db)))
        return CYRUSDB_INTERNAL;
    if ((r = lmdb_txn_begin(db, t)) != CYRUSDB_OK) {
        lmdb_txn_free(db, t);
        return r;
    }
    db->tid = t;
    *tid = t;
    *t_r = t;
    return CYRUSDB_OK;
}

/* store / create / delete */
static int lmdb_write(struct cyrusdb *cdb, int op, const char *key,
                      size_t keylen, const char *data, size_t datalen,
                      struct cyrusdb_txn **tid)
{
    struct lmdb_db *db = (struct lmdb_db *)cdb;
    struct cyrusdb_txn *t;
    int r;

    if ((r = lmdb_check(db)) != CYRUSDB_OK)
        return r;
    if (db->flags & CYRUSDB_RDONLY)
        return CYRUSDB_READONLY;
    if (tid)
        return (r = lmdb_tid_get(db, tid, &t)) != CYRUSDB_OK ? r :
               lmdb_txn_write(db, t, op, key, keylen, data, datalen);

    /* a transaction of its own */
    if (db->tid)
        return CYRUSDB_LOCKED;
    if (!(t = lmdb_txn_new(db)))
        return CYRUSDB_INTERNAL;
    if ((r = lmdb_txn_begin(db, t)) != CYRUSDB_OK) {
        lmdb_txn_free(db, t);
        return r;
    }
    r = lmdb_txn_write(db, t, op, key, keylen, data, datalen);
    if (r != CYRUSDB_OK) {
        lmdb_txn_free(db, t);
        return r;
    }
    return lmdb_txn_commit(db, t);
}

/* ---- the backend operations --------------------------------------------- */

static int lmdb_open(const char *fname, int flags, int variant,
                     struct cyrusdb **db_r, const char **error_r)
{
    struct lmdb_db *db;
    struct stat st;
    int created = 0, r;

    (void)variant;      /* no-sync variants are a db3 matter */
    *db_r = NULL;
    if (stat(fname, &st) < 0) {
        if (errno != ENOENT) {
            log_error("lmdb: stat failed file=<%s> error=<%s>", fname,
                      strerror(errno));
            *error_r = "cannot stat the database file";
            return CYRUSDB_IOERROR;
        }
        if (!(flags & CYRUSDB_CREATE) || (flags & CYRUSDB_RDONLY)) {
            *error_r = "no such database file";
            return CYRUSDB_NOTFOUND;
        }
        if (fs_mkdir_parent(fname, 0755) < 0) {
            log_error("lmdb: cannot create the directory file=<%s> "
                      "error=<%s>", fname, strerror(errno));
            *error_r = "cannot create the database directory";
            return errno == ENOSPC || errno == EDQUOT ? CYRUSDB_FULL
                                                      : CYRUSDB_IOERROR;
        }
        created = 1;
    } else if (!S_ISREG(st.st_mode)) {
        *error_r = "not a regular file";
        return CYRUSDB_IOERROR;
    } else if (st.st_size == 0) {
        /* LMDB syncs a new file's meta pages before open returns, so an
         * empty file is either damage (cut to nothing) or somebody else's
         * placeholder: initialise it only when asked to create. */
        if (!(flags & CYRUSDB_CREATE) || (flags & CYRUSDB_RDONLY)) {
            log_error("lmdb: empty file is not an LMDB database file=<%s>",
                      fname);
            *error_r = "empty file: not an LMDB database (open it with "
                       "CYRUSDB_CREATE to initialise it)";
            return CYRUSDB_IOERROR;
        }
        created = 1;    /* LMDB initialises an empty file */
    } else {
        int fd = open(fname, O_RDONLY | O_CLOEXEC);

        if (fd < 0) {
            log_error("lmdb: open failed file=<%s> error=<%s>", fname,
                      strerror(errno));
            *error_r = "cannot open the database file";
            return CYRUSDB_IOERROR;
        }
        /* LMDB takes its fcntl() locks on the lock file only, so opening
         * and closing the data file here is harmless even while this
         * process has it open. */
        r = lmdb_file_check(fd, error_r);
        close(fd);
        if (r != CYRUSDB_OK) {
            log_error("lmdb: damaged file file=<%s> error=<%s>", fname,
                      *error_r);
            return r;
        }
    }

    db = calloc(1, sizeof(*db));
    if (!db) {
        *error_r = "out of memory";
        return CYRUSDB_INTERNAL;
    }
    r = lmdb_env_acquire(fname, flags, created, &db->e, error_r);
    if (r != CYRUSDB_OK) {
        free(db);
        return r;
    }
    db->flags = flags;
    db->pid = procid_get();
    buf_set_max(&db->data, SIZE_MAX);
    buf_set_max(&db->cbdata, SIZE_MAX);
    *db_r = &db->header;
    return CYRUSDB_OK;
}

static int lmdb_close(struct cyrusdb *cdb)
{
    struct lmdb_db *db = (struct lmdb_db *)cdb;

    if (db->pid == procid_get()) {
        if (db->tid)
            lmdb_txn_free(db, db->tid);     /* aborts */
        if (db->rtxn)
            mdb_txn_abort(db->rtxn);
        lmdb_env_release(db->e);
    } else if (db->tid) {
        /* the parent's LMDB objects are not ours to touch */
        buf_free(&db->tid->log);
        free(db->tid);
    }
    buf_free(&db->data);
    buf_free(&db->cbkey);
    buf_free(&db->cbdata);
    free(db);
    return CYRUSDB_OK;
}

static int lmdb_fetch_common(struct lmdb_db *db, const char *key,
                             size_t keylen, const char **data_r,
                             size_t *datalen_r, struct cyrusdb_txn **tid)
{
    struct cyrusdb_txn *t = NULL;
    MDB_val k, v;
    int rc, r;

    if ((r = lmdb_check(db)) != CYRUSDB_OK)
        return r;
    if (tid) {
        if ((r = lmdb_tid_get(db, tid, &t)) != CYRUSDB_OK)
            return r;
        t->observed = 1;
    } else if ((r = lmdb_read_begin(db)) != CYRUSDB_OK) {
        return r;
    }
    k.mv_size = keylen;
    k.mv_data = (void *)key;
    rc = mdb_get(t ? t->txn : db->rtxn, db->e->dbi, &k, &v);
    if (rc == MDB_SUCCESS) {
        size_t len = 0;

        /* damage in one record is an error for this call only: the
         * transaction may still replace or delete the record */
        if ((r = lmdb_record_verify(db->e, &k, &v, &len)) != CYRUSDB_OK) {
            /* nothing to copy */
        } else if (buf_setmap(&db->data, v.mv_data, len) < 0) {
            log_error("lmdb: out of memory for a value file=<%s> bytes=<%zu>",
                      db->e->fname, len);
            r = CYRUSDB_INTERNAL;
        }
    } else if (rc == MDB_NOTFOUND) {
        r = CYRUSDB_NOTFOUND;
    } else {
        r = lmdb_error(db->e, NULL, "fetch", rc);
        if (t)
            lmdb_txn_fail(t, r);
    }
    if (!t)
        lmdb_read_end(db);
    if (r == CYRUSDB_OK) {
        if (data_r)
            *data_r = buf_cstring(&db->data);
        if (datalen_r)
            *datalen_r = db->data.len;
    }
    return r;
}

static int lmdb_fetch(struct cyrusdb *cdb, const char *key, size_t keylen,
                      const char **data_r, size_t *datalen_r,
                      struct cyrusdb_txn **tid)
{
    return lmdb_fetch_common((struct lmdb_db *)cdb, key, keylen, data_r,
                             datalen_r, tid);
}

/* The write transaction is the lock: begin it (if needed), then fetch. */
static int lmdb_fetchlock(struct cyrusdb *cdb, const char *key, size_t keylen,
                          const char **data_r, size_t *datalen_r,
                          struct cyrusdb_txn **tid)
{
    if (!tid)
        return CYRUSDB_INTERNAL;
    return lmdb_fetch_common((struct lmdb_db *)cdb, key, keylen, data_r,
                             datalen_r, tid);
}

/* Position a fresh cursor of txn: at the first key (resume == NULL, no
 * prefix), at the first key >= prefix, or at the first key > resume. */
static int lmdb_cursor_seek(struct lmdb_env *e, MDB_txn *txn,
                            const struct buf *resume,
                            const char *prefix, size_t prefixlen,
                            MDB_val *k, MDB_val *v)
{
    MDB_cursor *c;
    int rc;

    rc = mdb_cursor_open(txn, e->dbi, &c);
    if (rc != MDB_SUCCESS)
        return rc;
    e->cursors++;
    if (resume) {
        k->mv_size = resume->len;
        k->mv_data = resume->s;
        rc = mdb_cursor_get(c, k, v, MDB_SET_RANGE);
        if (rc == MDB_SUCCESS && k->mv_size == resume->len &&
            !memcmp(k->mv_data, resume->s, resume->len))
            rc = mdb_cursor_get(c, k, v, MDB_NEXT);
    } else if (prefixlen) {
        k->mv_size = prefixlen;
        k->mv_data = (void *)prefix;
        rc = mdb_cursor_get(c, k, v, MDB_SET_RANGE);
    } else {
        rc = mdb_cursor_get(c, k, v, MDB_FIRST);
    }
    mdb_cursor_close(c);
    e->cursors--;
    return rc;
}

static int lmdb_foreach(struct cyrusdb *cdb, const char *prefix,
                        size_t prefixlen, cyrusdb_filter_fn *filter,
                        cyrusdb_cb_fn *cb, void *rock,
                        struct cyrusdb_txn **tid)
{
    struct lmdb_db *db = (struct lmdb_db *)cdb;
    struct lmdb_env *e = db->e;
    struct buf resume = BUF_INITIALIZER;
    struct cyrusdb_txn *t = NULL;
    int started = 0, rc, r;

    if ((r = lmdb_check(db)) != CYRUSDB_OK)
        return r;
    if (tid) {
        if ((r = lmdb_tid_get(db, tid, &t)) != CYRUSDB_OK)
            return r;
        t->observed = 1;
    } else if ((r = lmdb_read_begin(db)) != CYRUSDB_OK) {
        return r;
    }

    for (;;) {
        MDB_val k, v;
        size_t vlen = 0;

        /* the cursor lives only inside lmdb_cursor_seek(): the callback may
         * write with t (moving pages, even replacing t->txn and the map) */
        rc = lmdb_cursor_seek(e, t ? t->txn : db->rtxn,
                              started ? &resume : NULL, prefix, prefixlen,
                              &k, &v);
        if (rc == MDB_NOTFOUND) {
            r = CYRUSDB_OK;
            break;
        }
        if (rc != MDB_SUCCESS) {
            r = lmdb_error(e, NULL, "foreach", rc);
            if (t)
                lmdb_txn_fail(t, r);
            break;
        }
        if (!cyrusdb_has_prefix(k.mv_data, k.mv_size, prefix, prefixlen)) {
            r = CYRUSDB_OK;
            break;
        }
        if ((r = lmdb_record_verify(e, &k, &v, &vlen)) != CYRUSDB_OK)
            break;
        if (buf_setmap(&resume, k.mv_data, k.mv_size) < 0 ||
            buf_setmap(&db->cbkey, k.mv_data, k.mv_size) < 0 ||
            buf_setmap(&db->cbdata, v.mv_data, vlen) < 0) {
            log_error("lmdb: out of memory in foreach file=<%s>", e->fname);
            r = CYRUSDB_INTERNAL;
            break;
        }
        started = 1;
        if (filter && !filter(rock, buf_cstring(&db->cbkey), db->cbkey.len,
                              buf_cstring(&db->cbdata), db->cbdata.len))
            continue;
        r = cb(rock, buf_cstring(&db->cbkey), db->cbkey.len,
               buf_cstring(&db->cbdata), db->cbdata.len);
        if (r)
            break;
        if (t && db->tid != t) {
            /* the callback ended our transaction: misuse */
            log_error("lmdb: transaction ended inside a foreach callback "
                      "file=<%s>", e->fname);
            t = NULL;
            r = CYRUSDB_INTERNAL;
            break;
        }
        if (t && t->error) {
            r = t->error;
            break;
        }
    }
    if (!t && !tid)
        lmdb_read_end(db);
    buf_free(&resume);
    return r;
}

static int lmdb_create(struct cyrusdb *cdb, const char *key, size_t keylen,
                       const char *data, size_t datalen,
                       struct cyrusdb_txn **tid)
{
    return lmdb_write(cdb, LMDB_OP_CREATE, key, keylen, data, datalen, tid);
}

static int lmdb_store(struct cyrusdb *cdb, const char *key, size_t keylen,
                      const char *data, size_t datalen,
                      struct cyrusdb_txn **tid)
{
    return lmdb_write(cdb, LMDB_OP_STORE, key, keylen, data, datalen, tid);
}

static int lmdb_delete(struct cyrusdb *cdb, const char *key, size_t keylen,
                       struct cyrusdb_txn **tid, int force)
{
    return lmdb_write(cdb, force ? LMDB_OP_DELFORCE : LMDB_OP_DELETE,
                      key, keylen, "", 0, tid);
}

static int lmdb_commit(struct cyrusdb *cdb, struct cyrusdb_txn *tid)
{
    struct lmdb_db *db = (struct lmdb_db *)cdb;
    int r;

    if ((r = lmdb_check(db)) != CYRUSDB_OK)
        return r;
    if (!tid || tid != db->tid)
        return CYRUSDB_INTERNAL;
    return lmdb_txn_commit(db, tid);
}

static int lmdb_abort(struct cyrusdb *cdb, struct cyrusdb_txn *tid)
{
    struct lmdb_db *db = (struct lmdb_db *)cdb;
    int r;

    if ((r = lmdb_check(db)) != CYRUSDB_OK)
        return r;
    if (!tid || tid != db->tid)
        return CYRUSDB_INTERNAL;
    lmdb_txn_free(db, tid);
    return CYRUSDB_OK;
}

/* ---- dump, consistency, checkpoint --------------------------------------- */

static int lmdb_dump_bytes(FILE *out, const unsigned char *p, size_t len)
{
    size_t i;

    for (i = 0; i < len; i++) {
        unsigned char c = p[i];
        int n;

        if (c < 0x20 || c == 0x7f || c == '\\' || c >= 0x80)
            n = fprintf(out, "\\x%02x", c);
        else
            n = putc(c, out) == EOF ? -1 : 1;
        if (n < 0)
            return -1;
    }
    return 0;
}

/*
 * Walk every record of a read txn in order with a cursor, calling fn for
 * each (fn must not call back into this handle).  Returns an LMDB code or
 * fn's non-zero value (fn returns -1 for "stop with an error").
 */
static int lmdb_walk(struct lmdb_db *db, MDB_txn *txn,
                     int (*fn)(void *rock, const MDB_val *k, const MDB_val *v),
                     void *rock)
{
    struct lmdb_env *e = db->e;
    MDB_cursor *c;
    MDB_val k, v;
    int rc;

    rc = mdb_cursor_open(txn, e->dbi, &c);
    if (rc != MDB_SUCCESS)
        return rc;
    e->cursors++;
    for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == MDB_SUCCESS;
         rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        int r = fn(rock, &k, &v);
        if (r) {
            rc = r;
            break;
        }
    }
    mdb_cursor_close(c);
    e->cursors--;
    return rc == MDB_NOTFOUND ? MDB_SUCCESS : rc;
}

struct lmdb_dump_state {
    FILE *out;
    struct lmdb_env *e;
};

/* -1: output failed; -2: a damaged record (logged). */
static int lmdb_dump_one(void *rock, const MDB_val *k, const MDB_val *v)
{
    struct lmdb_dump_state *ds = rock;
    size_t len = 0;

    if (lmdb_record_verify(ds->e, k, v, &len) != CYRUSDB_OK)
        return -2;
    if (lmdb_dump_bytes(ds->out, k->mv_data, k->mv_size) < 0 ||
        putc('\t', ds->out) == EOF ||
        lmdb_dump_bytes(ds->out, v->mv_data, len) < 0 ||
        putc('\n', ds->out) == EOF)
        return -1;
    return 0;
}

static int lmdb_dump(struct cyrusdb *cdb, FILE *out, int detail)
{
    struct lmdb_db *db = (struct lmdb_db *)cdb;
    struct lmdb_env *e = db->e;
    struct lmdb_dump_state ds;
    int rc, r;

    if ((r = lmdb_check(db)) != CYRUSDB_OK)
        return r;
    if ((r = lmdb_read_begin(db)) != CYRUSDB_OK)
        return r;
    if (detail > 0) {
        MDB_envinfo info;
        MDB_stat st;

        mdb_env_info(e->env, &info);
        rc = mdb_stat(db->rtxn, e->dbi, &st);
        if (rc == MDB_SUCCESS &&
            fprintf(out, "# lmdb file=%s psize=%u depth=%u branch_pages=%zu "
                    "leaf_pages=%zu overflow_pages=%zu entries=%zu "
                    "mapsize=%zu last_pgno=%zu txnid=%zu readers=%u/%u\n",
                    e->fname, st.ms_psize, st.ms_depth, st.ms_branch_pages,
                    st.ms_leaf_pages, st.ms_overflow_pages, st.ms_entries,
                    info.me_mapsize, info.me_last_pgno,
                    mdb_txn_id(db->rtxn), info.me_numreaders,
                    info.me_maxreaders) < 0)
            rc = EIO;
        if (rc != MDB_SUCCESS) {
            lmdb_read_end(db);
            return lmdb_error(e, NULL, "dump", rc);
        }
    }
    ds.out = out;
    ds.e = e;
    rc = lmdb_walk(db, db->rtxn, lmdb_dump_one, &ds);
    lmdb_read_end(db);
    if (rc == -2)
        return CYRUSDB_IOERROR;
    if (rc == -1) {
        log_error("lmdb: dump output failed file=<%s> error=<%s>",
                  e->fname, strerror(errno));
        return CYRUSDB_IOERROR;
    }
    if (rc != MDB_SUCCESS)
        return lmdb_error(e, NULL, "dump", rc);
    return CYRUSDB_OK;
}

struct lmdb_check_state {
    struct lmdb_db *db;
    struct buf prev;
    size_t count;
    size_t maxkey;
    const char *problem;
    int logged;                 /* problem already logged (with the key) */
};

static int lmdb_check_one(void *rock, const MDB_val *k, const MDB_val *v)
{
    struct lmdb_check_state *cs = rock;
    size_t len = 0;

    if (k->mv_size == 0 || k->mv_size > cs->maxkey) {
        cs->problem = "key length out of range";
        return -1;
    }
    if ((cs->problem = lmdb_record_check(k, v, &len)) != NULL) {
        lmdb_record_damaged(cs->db->e->fname, k, cs->problem);
        cs->logged = 1;
        return -1;
    }
    if (cs->count > 0 &&
        cyrusdb_compare(cs->db->flags, cs->prev.s, cs->prev.len,
                        k->mv_data, k->mv_size) >= 0) {
        cs->problem = "keys out of order (or opened with the wrong "
                      "CYRUSDB_MBOXSORT setting)";
        return -1;
    }
    if (buf_setmap(&cs->prev, k->mv_data, k->mv_size) < 0) {
        cs->problem = "out of memory";
        return -1;
    }
    cs->count++;
    return 0;
}

/*
 * What is checked, on the snapshot of one read transaction: the meta pages
 * and the file length (as at open); the whole structure (see "structural
 * verification" above: every page of both trees, overflow and free pages,
 * counts, page accounting); then every record through an LMDB cursor: key
 * lengths 1..511, keys strictly increasing by cyrusdb_compare() with this
 * handle's flags across pages (a file opened with the wrong
 * CYRUSDB_MBOXSORT setting fails here), every record's checksum, as many
 * records as LMDB's statistics count; any LMDB error met on the way is
 * damage.
 */
static int lmdb_consistent(struct cyrusdb *cdb)
{
    struct lmdb_db *db = (struct lmdb_db *)cdb;
    struct lmdb_env *e = db->e;
    struct lmdb_check_state cs;
    const char *problem = NULL;
    mdb_filehandle_t fd;
    MDB_stat st;
    int rc, r;

    if ((r = lmdb_check(db)) != CYRUSDB_OK)
        return r;
    if (mdb_env_get_fd(e->env, &fd) != MDB_SUCCESS) {
        log_error("lmdb: no data file descriptor file=<%s>", e->fname);
        return CYRUSDB_IOERROR;
    }
    if (lmdb_file_check(fd, &problem) != CYRUSDB_OK ||
        (r = lmdb_env_verify(e, db->flags, &problem)) != CYRUSDB_OK) {
        log_error("lmdb: inconsistent file=<%s> error=<%s>", e->fname,
                  problem);
        return r == CYRUSDB_AGAIN ? r : CYRUSDB_IOERROR;
    }

    /* the structure is sound: now walk the records through LMDB */
    if ((r = lmdb_read_begin(db)) != CYRUSDB_OK)
        return r;
    memset(&cs, 0, sizeof(cs));
    cs.db = db;
    cs.maxkey = (size_t)mdb_env_get_maxkeysize(e->env);
    if (cs.maxkey > 511)
        cs.maxkey = 511;
    rc = mdb_stat(db->rtxn, e->dbi, &st);
    if (rc != MDB_SUCCESS)
        problem = mdb_strerror(rc);
    else if ((st.ms_depth == 0) != (st.ms_entries == 0))
        problem = "tree depth does not match the record count";
    if (!problem) {
        rc = lmdb_walk(db, db->rtxn, lmdb_check_one, &cs);
        if (rc == -1)
            problem = cs.problem;
        else if (rc != MDB_SUCCESS)
            problem = mdb_strerror(rc);
        else if (cs.count != st.ms_entries)
            problem = "record count differs from the statistics";
    }
    lmdb_read_end(db);
    buf_free(&cs.prev);
    if (problem && cs.logged)
        return CYRUSDB_IOERROR;
    if (problem) {
        log_error("lmdb: inconsistent file=<%s> error=<%s>", e->fname,
                  problem);
        return CYRUSDB_IOERROR;
    }
    return CYRUSDB_OK;
}

/* A sync (and stale-reader cleanup); no compaction -- see the top. */
static int lmdb_checkpoint(struct cyrusdb *cdb)
{
    struct lmdb_db *db = (struct lmdb_db *)cdb;
    int dead = 0, rc, r;

    if ((r = lmdb_check(db)) != CYRUSDB_OK)
        return r;
    rc = mdb_reader_check(db->e->env, &dead);
    if (rc == MDB_SUCCESS && dead > 0)
        log_info("lmdb: cleared stale readers file=<%s> count=<%d>",
                 db->e->fname, dead);
    rc = mdb_env_sync(db->e->env, 1);
    if (rc != MDB_SUCCESS)
        return lmdb_error(db->e, NULL, "checkpoint sync", rc);
    return CYRUSDB_OK;
}

const struct cyrusdb_backend cyrusdb_lmdb = {
    .name = "lmdb",
    .recover = NULL,            /* LMDB needs no recovery */
    .checkpoint_dir = NULL,     /* no logs to remove */
    .detect = lmdb_detect,
    .open = lmdb_open,
    .close = lmdb_close,
    .fetch = lmdb_fetch,
    .fetchlock = lmdb_fetchlock,
    .foreach = lmdb_foreach,
    .create = lmdb_create,
    .store = lmdb_store,
    .delete = lmdb_delete,
    .commit = lmdb_commit,
    .abort = lmdb_abort,
    .dump = lmdb_dump,
    .consistent = lmdb_consistent,
    .checkpoint = lmdb_checkpoint,
};
