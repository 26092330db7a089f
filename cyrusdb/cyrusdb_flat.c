/*
 * cyrusdb_flat.c - the "flat" cyrusdb backend: a sorted text file in
 * Cyrus IMAP's flat format (see flat.h), for small databases that admins
 * like to read and edit.
 *
 * On disk: FNAME holds the records, one "key<TAB>value<LF>" line each,
 * sorted in Cyrus's order (flat.h: the order of the encoded keys, which for
 * keys holding NUL, TAB, LF or CR differs from cyrusdb_compare(); a walk
 * over a range holding such a key sorts it, see flat_foreach); FNAME.NEW exists only while a writer is replacing FNAME
 * (or after a crash, as a stray).  No other file.
 *
 * Reads: the handle maps FNAME read-only and binary-searches the map.
 *
 * Writes: a write transaction collects its changes in memory, in a sorted
 * set (flat_changes); reads inside the transaction see those changes merged
 * over the map.  Commit writes the merge of the map and the changes into
 * FNAME.NEW, fsyncs it, renames it over FNAME and fsyncs the directory.  A
 * write without a transaction is a one-change transaction.
 *
 * Locking: fcntl locks on FNAME (the same locks Cyrus takes, so Cyrus tools
 * and this code exclude each other).  Readers take a shared lock, writers
 * an exclusive one for the whole transaction.  The lock is on a file that a
 * commit replaces, so after every lock the holder compares the inode of its
 * fd with stat(FNAME); if they differ it lets go, reopens FNAME and locks
 * again.  The writer locks FNAME.NEW before the rename, so when the old file
 * is released the new one is already held.  Locks are per process and not
 * counted: the handle keeps a depth (a fetch inside a foreach callback does
 * not release the walk's lock), and a small table of the handles open in
 * this process stops two handles on one file from undoing each other's
 * locks.
 *
 * Crash safety: FNAME is never written in place.  Until the rename FNAME is
 * the old complete file; rename(2) replaces it atomically by FNAME.NEW,
 * which was fsynced first, so after a crash at any moment FNAME is either
 * the old or the new complete file.  The directory fsync makes the rename
 * itself durable before commit returns.  A handle opened with
 * CYRUSDB_NOSYNC skips both fsyncs at commit (checkpoint keeps them): the
 * rename still replaces FNAME atomically for every process, and a killed
 * process loses nothing, but after a crash of the machine FNAME may be the
 * old file, or the new one with data blocks that never reached the disk
 * (empty or holding garbage: damage, found by the next reader or
 * consistent()).  A stray FNAME.NEW is never read;
 * the next writer (who holds the exclusive lock, so no other writer can be
 * using it) removes and recreates it.  A reader that mapped the old file
 * keeps a consistent view: that file is never changed, only unlinked.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "cyrusdb/cyrusdb_backends.h"
#include "cyrusdb/flat.h"
#include "lib/buf.h"
#include "lib/fsutil.h"
#include "lib/log.h"

struct flat_txn;

struct flat_db {
    struct cyrusdb hdr;        /* must be first: cyrusdb.c fills it */
    char *fname;
    char *fname_new;           /* FNAME.NEW */
    int flags;                 /* open flags (order, read-only) */
    int fd;                    /* the open FNAME (maybe replaced since) */
    dev_t dev;
    ino_t ino;
    struct flat_map map;       /* the whole of fd, read-only */
    unsigned long map_gen;     /* bumped whenever map changes */
    int lock_depth;            /* nested lock holders in this handle */
    int lock_type;             /* F_RDLCK / F_WRLCK while lock_depth > 0 */
    pid_t pid;                 /* the process that opened the handle */
    struct flat_txn *txn;      /* the open transaction, or NULL */
    struct buf fetchbuf;       /* value returned by fetch */
    struct buf eachkey;        /* record handed to foreach callbacks */
    struct buf eachval;
    struct flat_db *next_open; /* the process's open flat handles */
};

struct flat_txn {
    struct flat_db *db;
    struct flat_changes *changes;   /* NULL until the first write */
};

static struct flat_db *flat_open_handles;

#define FLAT_TID(t) ((struct cyrusdb_txn *)(void *)(t))
#define FLAT_TXN(t) ((struct flat_txn *)(void *)(t))

/* ---- errors ------------------------------------------------------------- */

static int flat_syserr(const char *what, const char *path)
{
    int e = errno;

    log_error("flat: %s failed file=<%s> error=<%s>", what, path, strerror(e));
    if (e == ENOSPC || e == EDQUOT)
        return CYRUSDB_FULL;
    return CYRUSDB_IOERROR;
}

static int flat_damaged(const struct flat_db *db, const char *what)
{
    log_error("flat: damaged database file=<%s> error=<%s>", db->fname, what);
    return CYRUSDB_IOERROR;
}

/* Map a FLAT_* engine code to a CYRUSDB_* one, logging the detail. */
static int flat_engine_error(const struct flat_db *db, int r, const char *what)
{
    switch (r) {
    case FLAT_OK:
    case FLAT_END:
        return CYRUSDB_OK;
    case FLAT_DAMAGED:
        return flat_damaged(db, what);
    default:
        return flat_syserr(what, db->fname);
    }
}

/* ---- handles of this process on the same file ---------------------------- */

/* Is p another handle of this process on the file (dev, ino) holding a
 * lock?  Handles a child inherited through fork() are not its own. */
static int flat_is_peer(const struct flat_db *p, const struct flat_db *db,
                        dev_t dev, ino_t ino)
{
    return p != db && p->lock_depth > 0 && p->dev == dev && p->ino == ino &&
           p->pid == getpid();
}

/* The strongest lock another handle of this process holds on db's file:
 * F_WRLCK, F_RDLCK, or F_UNLCK for none. */
static int flat_peer_lock(const struct flat_db *db)
{
    const struct flat_db *p;
    int type = F_UNLCK;

    for (p = flat_open_handles; p; p = p->next_open) {
        if (!flat_is_peer(p, db, db->dev, db->ino))
            continue;
        if (p->lock_type == F_WRLCK)
            return F_WRLCK;
        type = F_RDLCK;
    }
    return type;
}

/* Closing any descriptor of a file drops every fcntl lock this process
 * holds on it: take the locks of the other handles on (dev, ino) again. */
static void flat_reassert_peers(const struct flat_db *db, dev_t dev, ino_t ino)
{
    struct flat_db *p;

    for (p = flat_open_handles; p; p = p->next_open) {
        if (!flat_is_peer(p, db, dev, ino))
            continue;
        if (fs_lock(p->fd, p->lock_type, 0) < 0)
            log_warning("flat: cannot take back lock file=<%s> error=<%s>",
                        p->fname, strerror(errno));
    }
}

/* Close fd, which belongs to the file (dev, ino). */
static void flat_close_fd(const struct flat_db *db, int fd, dev_t dev, ino_t ino)
{
    close(fd);
    flat_reassert_peers(db, dev, ino);
}

/* ---- the open file and its map ------------------------------------------- */

static int flat_remap(struct flat_db *db)
{
    struct stat st;

    if (fstat(db->fd, &st) < 0)
        return flat_syserr("fstat", db->fname);
    flat_map_release(&db->map);
    db->map_gen++;
    db->dev = st.st_dev;
    db->ino = st.st_ino;
    if (flat_map_fd(db->fd, (size_t)st.st_size, &db->map) != FLAT_OK)
        return flat_syserr("mmap", db->fname);
    return CYRUSDB_OK;
}

/* FNAME was replaced: open the file that now has the name. */
static int flat_reopen(struct flat_db *db)
{
    int mode = (db->flags & CYRUSDB_RDONLY) ? O_RDONLY : O_RDWR;
    int fd = open(db->fname, mode | O_CLOEXEC);

    if (fd < 0)
        return flat_syserr("reopen", db->fname);
    flat_map_release(&db->map);
    db->map_gen++;
    flat_close_fd(db, db->fd, db->dev, db->ino);
    db->fd = fd;
    return flat_remap(db);
}

static int flat_lock_failed(const struct flat_db *db)
{
    if (errno == EDEADLK) {
        log_warning("flat: lock deadlock, try again file=<%s>", db->fname);
        return CYRUSDB_AGAIN;
    }
    return flat_syserr("lock", db->fname);
}

/*
 * Take the lock (F_RDLCK or F_WRLCK) or one more level of it.  On return
 * with CYRUSDB_OK, fd is the file FNAME names and map is all of it.
 */
static int flat_lock(struct flat_db *db, int type)
{
    struct stat st;
    int r;

    if (type == F_WRLCK && (db->flags & CYRUSDB_RDONLY))
        return CYRUSDB_READONLY;
    if (db->lock_depth > 0) {
        if (type == F_WRLCK && db->lock_type != F_WRLCK) {
            /* upgrade; nobody replaced the file: we held it shared */
            if (flat_peer_lock(db) != F_UNLCK)
                return CYRUSDB_LOCKED;
            if (fs_lock(db->fd, F_WRLCK, 1) < 0)
                return flat_lock_failed(db);
            db->lock_type = F_WRLCK;
        }
        db->lock_depth++;
        return CYRUSDB_OK;
    }

    for (;;) {
        int peer = flat_peer_lock(db);

        /* another handle of this process holds the file: a writer
         * cannot wait for it (fcntl locks are the process's, not the
         * handle's); a reader shares it, without weakening its lock */
        if (peer != F_UNLCK && type == F_WRLCK)
            return CYRUSDB_LOCKED;
        /* under a peer's exclusive lock there is nothing to take (and a
         * shared request would weaken the process's lock) */
        if (peer != F_WRLCK && fs_lock(db->fd, type, 1) < 0)
            return flat_lock_failed(db);
        if (stat(db->fname, &st) < 0) {
            r = flat_syserr("stat", db->fname);
            if (peer == F_UNLCK)
                fs_lock(db->fd, F_UNLCK, 0);
            return r;
        }
        if (st.st_ino == db->ino && st.st_dev == db->dev)
            break;
        /* replaced while we waited: follow the name */
        if (peer == F_UNLCK)
            fs_lock(db->fd, F_UNLCK, 0);
        if ((r = flat_reopen(db)) != CYRUSDB_OK)
            return r;
    }
    if ((size_t)st.st_size != db->map.size &&
        (r = flat_remap(db)) != CYRUSDB_OK) {
        if (flat_peer_lock(db) == F_UNLCK)
            fs_lock(db->fd, F_UNLCK, 0);
        return r;
    }
    db->lock_type = type;
    db->lock_depth = 1;
    return CYRUSDB_OK;
}

static int flat_unlock(struct flat_db *db)
{
    if (db->lock_depth <= 0) {
        log_error("flat: unlock without lock file=<%s>", db->fname);
        return CYRUSDB_INTERNAL;
    }
    if (--db->lock_depth > 0)
        return CYRUSDB_OK;
    db->lock_type = F_UNLCK;
    if (flat_peer_lock(db) != F_UNLCK)
        return CYRUSDB_OK;      /* another handle here still needs it */
    if (fs_lock(db->fd, F_UNLCK, 0) < 0)
        return flat_syserr("unlock", db->fname);
    return CYRUSDB_OK;
}

/* ---- rewriting the file ------------------------------------------------- */

/*
 * Replace FNAME by the merge of the map and cs (cs may be NULL: a plain
 * rewrite).  The exclusive lock must be held.  On success the handle is on
 * the new file, still holding the exclusive lock (taken on FNAME.NEW before
 * the rename).  sync == 0 (a commit of a CYRUSDB_NOSYNC handle) skips the
 * fsync of FNAME.NEW and of the directory; the rename is the same.
 */
static int flat_rewrite(struct flat_db *db, const struct flat_changes *cs,
                        int sync)
{
    struct stat st;
    int fd, r;

    if (db->lock_depth == 0 || db->lock_type != F_WRLCK) {
        log_error("flat: write without exclusive lock file=<%s>", db->fname);
        return CYRUSDB_INTERNAL;
    }
    if (fstat(db->fd, &st) < 0)
        return flat_syserr("fstat", db->fname);

    /* a FNAME.NEW now is a stray of a crashed writer: we hold the lock */
    if (unlink(db->fname_new) < 0 && errno != ENOENT)
        return flat_syserr("unlink", db->fname_new);
    fd = open(db->fname_new, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
              st.st_mode & 0666);
    if (fd < 0)
        return flat_syserr("create", db->fname_new);
    /* the new file keeps the old one's mode (not umask's) ... */
    if (fchmod(fd, st.st_mode & 0777) < 0)
        log_debug("flat: cannot keep mode file=<%s> error=<%s>",
                  db->fname_new, strerror(errno));
    /* ... and its owner when a tool running as root rewrites a server's file
     * (only root may; for others the owner is already the same) */
    if ((st.st_uid != geteuid() || st.st_gid != getegid()) &&
        fchown(fd, st.st_uid, st.st_gid) < 0)
        log_debug("flat: cannot keep owner file=<%s> error=<%s>",
                  db->fname_new, strerror(errno));
    if (fs_lock(fd, F_WRLCK, 0) < 0) {
        r = flat_syserr("lock", db->fname_new);
        goto fail;
    }
    r = flat_write_merged(fd, &db->map, db->flags, cs);
    if (r != FLAT_OK) {
        r = r == FLAT_DAMAGED ? flat_damaged(db, "malformed line while rewriting")
                              : flat_syserr("write", db->fname_new);
        goto fail;
    }
    if (sync && fsync(fd) < 0) {
        r = flat_syserr("fsync", db->fname_new);
        goto fail;
    }
    if (rename(db->fname_new, db->fname) < 0) {
        r = flat_syserr("rename", db->fname_new);
        goto fail;
    }

    /* FNAME is the new file from here on, whatever happens next */
    r = CYRUSDB_OK;
    if (sync && fs_fsync_parent(db->fname) < 0)
        r = flat_syserr("fsync directory", db->fname);
    flat_map_release(&db->map);
    db->map_gen++;
    flat_close_fd(db, db->fd, db->dev, db->ino);
    db->fd = fd;
    if (flat_remap(db) != CYRUSDB_OK)
        r = CYRUSDB_IOERROR;
    return r;

fail:
    close(fd);
    unlink(db->fname_new);
    return r;
}

/* ---- transactions ----------------------------------------------------------- */

/*
 * Enter a call: check tid, begin a transaction if asked, or take the lock
 * for a call without one.  *txn_r is the transaction the call runs in
 * (NULL: none).  Every successful flat_enter is paired with flat_leave.
 */
static int flat_enter(struct flat_db *db, struct cyrusdb_txn **tid, int write,
                      struct flat_txn **txn_r)
{
    struct flat_txn *txn;
    int r;

    *txn_r = NULL;
    if (!tid) {
        if (write && db->txn)
            return CYRUSDB_LOCKED;
        return flat_lock(db, write ? F_WRLCK : F_RDLCK);
    }
    if (*tid) {
        if (FLAT_TXN(*tid) != db->txn || !db->txn)
            return CYRUSDB_INTERNAL;
        *txn_r = db->txn;
        return CYRUSDB_OK;
    }
    if (db->txn)
        return CYRUSDB_LOCKED;
    txn = calloc(1, sizeof(*txn));
    if (!txn)
        return flat_syserr("malloc", db->fname);
    r = flat_lock(db, (db->flags & CYRUSDB_RDONLY) ? F_RDLCK : F_WRLCK);
    if (r != CYRUSDB_OK) {
        free(txn);
        return r;
    }
    txn->db = db;
    db->txn = txn;
    *tid = FLAT_TID(txn);
    *txn_r = txn;
    return CYRUSDB_OK;
}

static int flat_leave(struct flat_db *db, struct cyrusdb_txn **tid, int r)
{
    if (!tid) {
        int u = flat_unlock(db);
        if (r == CYRUSDB_OK)
            r = u;
    }
    return r;
}

/* End the transaction: free it and let go of its lock. */
static int flat_txn_end(struct flat_db *db)
{
    struct flat_txn *txn = db->txn;

    db->txn = NULL;
    flat_changes_free(&txn->changes);
    free(txn);
    return flat_unlock(db);
}

/* ---- lookups ------------------------------------------------------------ */

/*
 * Look key up in the file with txn's changes over it.  *found_r: 1 or 0.
 * When val is not NULL the value is decoded into it.
 */
static int flat_lookup(struct flat_db *db, struct flat_txn *txn,
                       const char *key, size_t keylen, int *found_r,
                       struct buf *val)
{
    struct flat_record rec;
    size_t offset;
    int r;

    *found_r = 0;
    if (txn && txn->changes) {
        const struct flat_change *c =
            flat_changes_find(txn->changes, key, keylen);
        if (c) {
            *found_r = !c->deleted;
            if (val && !c->deleted && buf_setmap(val, c->val, c->vallen) < 0)
                return flat_syserr("malloc", db->fname);
            return CYRUSDB_OK;
        }
    }
    r = flat_search(&db->map, db->flags, key, keylen, &offset, found_r);
    if (r != FLAT_OK)
        return flat_engine_error(db, r, "malformed line met by search");
    if (!*found_r || !val)
        return CYRUSDB_OK;
    r = flat_parse_line(&db->map, offset, &rec);
    if (r == FLAT_OK) {
        buf_reset(val);
        r = flat_decode(val, rec.val, rec.vallen);
    }
    return flat_engine_error(db, r, "malformed value");
}

/*
 * The first record of the merged view with a key > key (strict) or >= key,
 * decoded into db->eachkey / db->eachval.  keylen 0: the first record.
 * *hint is the map offset of the first line after the last record returned,
 * valid while *hint_gen == db->map_gen (pass *hint_gen = 0 for none).
 * CYRUSDB_OK, CYRUSDB_DONE at the end, or an error.
 */
static int flat_view_next(struct flat_db *db, struct flat_txn *txn,
                          const char *key, size_t keylen, int strict,
                          size_t *hint, unsigned long *hint_gen)
{
    const struct flat_change *c = NULL;
    size_t offset;
    int r;

    if (*hint_gen && *hint_gen == db->map_gen) {
        offset = *hint;
    } else {
        int found;
        r = flat_search(&db->map, db->flags, key, keylen, &offset, &found);
        if (r != FLAT_OK)
            return flat_engine_error(db, r, "malformed line met by search");
        if (found && strict) {
            struct flat_record rec;
            r = flat_parse_line(&db->map, offset, &rec);
            if (r != FLAT_OK)
                return flat_engine_error(db, r, "malformed line");
            offset = rec.next;
        }
    }
    if (txn && txn->changes)
        c = keylen ? flat_changes_seek(txn->changes, key, keylen, strict)
                   : flat_changes_seek(txn->changes, NULL, 0, 0);

    for (;;) {
        struct flat_record rec;
        int have_line, cmp = 0;

        r = flat_parse_line(&db->map, offset, &rec);
        if (r == FLAT_DAMAGED)
            return flat_damaged(db, "malformed line met by walk");
        have_line = r == FLAT_OK;
        if (!have_line && !c) {
            *hint = offset;
            *hint_gen = db->map_gen;
            return CYRUSDB_DONE;
        }
        if (have_line && c) {
            r = flat_compare_encoded(db->flags, c->key, c->keylen,
                                     rec.key, rec.keylen, &cmp);
            if (r != FLAT_OK)
                return flat_damaged(db, "malformed key met by walk");
        }
        if (have_line && (!c || cmp > 0)) {
            buf_reset(&db->eachkey);
            buf_reset(&db->eachval);
            r = flat_decode(&db->eachkey, rec.key, rec.keylen);
            if (r == FLAT_OK)
                r = flat_decode(&db->eachval, rec.val, rec.vallen);
            if (r != FLAT_OK)
                return flat_engine_error(db, r, "malformed record met by walk");
            *hint = rec.next;
            *hint_gen = db->map_gen;
            return CYRUSDB_OK;
        }
        if (have_line && cmp == 0)
            offset = rec.next;      /* the change overrides the line */
        if (c->deleted) {
            c = flat_changes_next(c);
            continue;
        }
        if (buf_setmap(&db->eachkey, c->key, c->keylen) < 0 ||
            buf_setmap(&db->eachval, c->val, c->vallen) < 0)
            return flat_syserr("malloc", db->fname);
        *hint = offset;
        *hint_gen = db->map_gen;
        return CYRUSDB_OK;
    }
}

/* ---- the backend operations ------------------------------------------------- */

static int flat_detect(const char *head, size_t len)
{
    const char *lf, *tab;
    size_t firstlen;

    if (len == 0)
        return 1;
    /* the encoding escapes NUL: a flat file never holds a raw one */
    if (memchr(head, '\0', len))
        return 0;
    lf = memchr(head, '\n', len);
    firstlen = lf ? (size_t)(lf - head) : len;
    tab = memchr(head, '\t', firstlen);
    return tab && tab != head;
}

static void flat_free_handle(struct flat_db *db)
{
    free(db->fname);
    free(db->fname_new);
    buf_free(&db->fetchbuf);
    buf_free(&db->eachkey);
    buf_free(&db->eachval);
    free(db);
}

static int flat_open(const char *fname, int flags, int variant,
                     struct cyrusdb **db_r, const char **error_r)
{
    struct flat_db *db;
    struct stat st;
    int rdonly = (flags & CYRUSDB_RDONLY) != 0;
    int created = 0;
    int r;

    (void)variant;
    *db_r = NULL;
    db = calloc(1, sizeof(*db));
    if (!db || !(db->fname = strdup(fname)) ||
        asprintf(&db->fname_new, "%s.NEW", fname) < 0) {
        if (db) {
            db->fname_new = NULL;
            flat_free_handle(db);
        }
        *error_r = "out of memory";
        return CYRUSDB_INTERNAL;
    }
    db->flags = flags;
    db->lock_type = F_UNLCK;
    db->pid = getpid();
    db->fd = open(fname, (rdonly ? O_RDONLY : O_RDWR) | O_CLOEXEC);
    if (db->fd < 0 && errno == ENOENT) {
        if (!(flags & CYRUSDB_CREATE) || rdonly) {
            flat_free_handle(db);
            *error_r = "no such database file";
            return CYRUSDB_NOTFOUND;
        }
        if (fs_mkdir_parent(fname, 0755) < 0) {
            r = flat_syserr("mkdir", fname);
            flat_free_handle(db);
            *error_r = "cannot create the directory";
            return r;
        }
        db->fd = open(fname, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        created = 1;
    }
    if (db->fd < 0) {
        r = flat_syserr("open", fname);
        flat_free_handle(db);
        *error_r = "cannot open the file";
        return r;
    }
    if (fstat(db->fd, &st) < 0) {
        r = flat_syserr("fstat", fname);
        close(db->fd);
        flat_free_handle(db);
        *error_r = "cannot stat the file";
        return r;
    }
    if (!S_ISREG(st.st_mode)) {
        log_error("flat: open failed file=<%s> error=<not a regular file>",
                  fname);
        flat_close_fd(db, db->fd, st.st_dev, st.st_ino);
        flat_free_handle(db);
        *error_r = "not a regular file";
        return CYRUSDB_IOERROR;
    }
    if (created && fs_fsync_parent(fname) < 0) {
        r = flat_syserr("fsync directory", fname);
        flat_close_fd(db, db->fd, st.st_dev, st.st_ino);
        flat_free_handle(db);
        *error_r = "cannot sync the directory";
        return r;
    }
    r = flat_remap(db);
    if (r != CYRUSDB_OK) {
        flat_close_fd(db, db->fd, st.st_dev, st.st_ino);
        flat_free_handle(db);
        *error_r = "cannot map the file";
        return r;
    }
    db->next_open = flat_open_handles;
    flat_open_handles = db;
    /* cyrusdb_open() read the file's head through a descriptor of its own
     * and closed it, which dropped this process's locks on the file */
    flat_reassert_peers(db, db->dev, db->ino);
    *db_r = &db->hdr;
    return CYRUSDB_OK;
}

static int flat_close(struct cyrusdb *cdb)
{
    struct flat_db *db = (struct flat_db *)cdb;
    struct flat_db **pp;
    int r = CYRUSDB_OK;

    if (db->txn)
        r = flat_txn_end(db);
    for (pp = &flat_open_handles; *pp; pp = &(*pp)->next_open) {
        if (*pp == db) {
            *pp = db->next_open;
            break;
        }
    }
    db->lock_depth = 0;
    flat_map_release(&db->map);
    flat_close_fd(db, db->fd, db->dev, db->ino);
    flat_free_handle(db);
    return r;
}

static int flat_fetch(struct cyrusdb *cdb, const char *key, size_t keylen,
                      const char **data_r, size_t *datalen_r,
                      struct cyrusdb_txn **tid)
{
    struct flat_db *db = (struct flat_db *)cdb;
    struct flat_txn *txn;
    int found = 0;
    int r;

    if (data_r)
        *data_r = NULL;
    if (datalen_r)
        *datalen_r = 0;
    r = flat_enter(db, tid, 0, &txn);
    if (r != CYRUSDB_OK)
        return r;
    r = flat_lookup(db, txn, key, keylen, &found, &db->fetchbuf);
    r = flat_leave(db, tid, r);
    if (r != CYRUSDB_OK)
        return r;
    if (!found)
        return CYRUSDB_NOTFOUND;
    if (data_r)
        *data_r = buf_cstring(&db->fetchbuf);
    if (datalen_r)
        *datalen_r = db->fetchbuf.len;
    return CYRUSDB_OK;
}

static int flat_fetchlock(struct cyrusdb *cdb, const char *key, size_t keylen,
                          const char **data_r, size_t *datalen_r,
                          struct cyrusdb_txn **tid)
{
    if (!tid)
        return CYRUSDB_INTERNAL;
    /* fetch with a tid begins the write transaction, found or not */
    return flat_fetch(cdb, key, keylen, data_r, datalen_r, tid);
}

/* A walk over the keys with a prefix, in file order.  The current key is
 * copied into `cur` because a callback may change the handle; the next
 * step resumes after that copy. */
struct flat_range {
    struct buf cur;
    int have;
    size_t hint;
    unsigned long hint_gen;
};

#define FLAT_RANGE_INITIALIZER { BUF_INITIALIZER, 0, 0, 0 }

/* The next record of the range into db->eachkey / db->eachval: OK, DONE at
 * the end of the range, or an error. */
static int flat_range_next(struct flat_db *db, struct flat_txn *txn,
                           const char *prefix, size_t prefixlen,
                           struct flat_range *w)
{
    int r;

    if (w->have)
        r = flat_view_next(db, txn, w->cur.s, w->cur.len, 1, &w->hint, &w->hint_gen);
    else
        r = flat_view_next(db, txn, prefix, prefixlen, 0, &w->hint, &w->hint_gen);
    if (r != CYRUSDB_OK)
        return r;
    if (!cyrusdb_has_prefix(db->eachkey.s, db->eachkey.len, prefix, prefixlen))
        return CYRUSDB_DONE;
    if (buf_setmap(&w->cur, db->eachkey.s, db->eachkey.len) < 0)
        return flat_syserr("malloc", db->fname);
    w->have = 1;
    return CYRUSDB_OK;
}

/*
 * Keys holding NUL, TAB, LF or CR are escaped in the file, and the file is
 * ordered by the escaped bytes (Cyrus's order, kept for compatibility), so
 * such keys sit elsewhere in the file than cyrusdb_compare() puts them.  A
 * walk whose range holds one collects the range's keys, sorts them in the
 * API's order and visits each by lookup; every other walk streams the file.
 */
static int flat_key_escaped(const char *key, size_t keylen)
{
    size_t i;

    for (i = 0; i < keylen; i++)
        if (key[i] == '\0' || key[i] == '\t' || key[i] == '\n' || key[i] == '\r')
            return 1;
    return 0;
}

struct flat_sortkey {
    char *key;
    size_t keylen;
};

static int flat_sort_flags;

static int flat_sortkey_cmp(const void *a, const void *b)
{
    const struct flat_sortkey *ka = a, *kb = b;

    return cyrusdb_compare(flat_sort_flags, ka->key, ka->keylen,
                           kb->key, kb->keylen);
}

/* Collect the keys of the range.  *keys_r is NULL when no key is escaped
 * (the walk can stream); otherwise the caller frees the array. */
static int flat_collect_escaped(struct flat_db *db, struct flat_txn *txn,
                                const char *prefix, size_t prefixlen,
                                struct flat_sortkey **keys_r, size_t *count_r)
{
    struct flat_sortkey *keys = NULL;
    size_t count = 0, alloc = 0, i;
    struct flat_range w = FLAT_RANGE_INITIALIZER;
    int escaped = 0, r;

    *keys_r = NULL;
    *count_r = 0;
    for (;;) {
        r = flat_range_next(db, txn, prefix, prefixlen, &w);
        if (r != CYRUSDB_OK) {
            if (r == CYRUSDB_DONE)
                r = CYRUSDB_OK;
            break;
        }
        escaped |= flat_key_escaped(w.cur.s, w.cur.len);
        if (count == alloc) {
            size_t n = alloc ? alloc * 2 : 64;
            struct flat_sortkey *k = realloc(keys, n * sizeof(*keys));
            if (!k) {
                r = flat_syserr("malloc", db->fname);
                break;
            }
            keys = k;
            alloc = n;
        }
        keys[count].key = malloc(w.cur.len ? w.cur.len : 1);
        if (!keys[count].key) {
            r = flat_syserr("malloc", db->fname);
            break;
        }
        memcpy(keys[count].key, w.cur.s, w.cur.len);
        keys[count].keylen = w.cur.len;
        count++;
    }
    buf_free(&w.cur);
    if (r != CYRUSDB_OK || !escaped) {
        for (i = 0; i < count; i++)
            free(keys[i].key);
        free(keys);
        return r;
    }
    flat_sort_flags = db->flags;
    qsort(keys, count, sizeof(*keys), flat_sortkey_cmp);
    *keys_r = keys;
    *count_r = count;
    return CYRUSDB_OK;
}

static int flat_foreach_sorted(struct flat_db *db, struct flat_txn *txn,
                               struct flat_sortkey *keys, size_t count,
                               cyrusdb_filter_fn *filter, cyrusdb_cb_fn *cb,
                               void *rock, struct cyrusdb_txn **tid)
{
    size_t i;
    int r = CYRUSDB_OK;

    for (i = 0; i < count; i++) {
        int found;

        r = flat_lookup(db, txn, keys[i].key, keys[i].keylen, &found,
                        &db->eachval);
        if (r != CYRUSDB_OK)
            break;
        if (!found)
            continue;   /* deleted by an earlier callback */
        if (buf_setmap(&db->eachkey, keys[i].key, keys[i].keylen) < 0) {
            r = flat_syserr("malloc", db->fname);
            break;
        }
        if (filter && !filter(rock, buf_cstring(&db->eachkey), db->eachkey.len,
                              buf_cstring(&db->eachval), db->eachval.len))
            continue;
        r = cb(rock, buf_cstring(&db->eachkey), db->eachkey.len,
               buf_cstring(&db->eachval), db->eachval.len);
        if (r)
            break;
        if (tid && !db->txn) {
            r = CYRUSDB_INTERNAL;   /* the callback ended our transaction */
            break;
        }
        txn = db->txn;
    }
    return r;
}

static int flat_foreach(struct cyrusdb *cdb, const char *prefix,
                        size_t prefixlen, cyrusdb_filter_fn *filter,
                        cyrusdb_cb_fn *cb, void *rock,
                        struct cyrusdb_txn **tid)
{
    struct flat_db *db = (struct flat_db *)cdb;
    struct flat_range w = FLAT_RANGE_INITIALIZER;
    struct flat_txn *txn;
    struct flat_sortkey *sorted = NULL;
    size_t nsorted = 0, i;
    int r;

    r = flat_enter(db, tid, 0, &txn);
    if (r != CYRUSDB_OK)
        return r;
    r = flat_collect_escaped(db, txn, prefix, prefixlen, &sorted, &nsorted);
    if (r != CYRUSDB_OK || sorted) {
        if (sorted)
            r = flat_foreach_sorted(db, txn, sorted, nsorted, filter, cb,
                                    rock, tid);
        for (i = 0; i < nsorted; i++)
            free(sorted[i].key);
        free(sorted);
        return flat_leave(db, tid, r);
    }
    for (;;) {
        r = flat_range_next(db, txn, prefix, prefixlen, &w);
        if (r != CYRUSDB_OK) {
            if (r == CYRUSDB_DONE)
                r = CYRUSDB_OK;
            break;
        }
        if (filter && !filter(rock, buf_cstring(&db->eachkey), db->eachkey.len,
                              buf_cstring(&db->eachval), db->eachval.len))
            continue;
        r = cb(rock, buf_cstring(&db->eachkey), db->eachkey.len,
               buf_cstring(&db->eachval), db->eachval.len);
        if (r)
            break;
        if (tid && !db->txn) {
            r = CYRUSDB_INTERNAL;   /* the callback ended our transaction */
            break;
        }
    }
    buf_free(&w.cur);
    return flat_leave(db, tid, r);
}

enum flat_op { FLAT_OP_CREATE, FLAT_OP_STORE, FLAT_OP_DELETE };

static int flat_write_op(struct flat_db *db, enum flat_op op,
                         const char *key, size_t keylen,
                         const char *data, size_t datalen,
                         struct cyrusdb_txn **tid, int force)
{
    struct flat_changes *single = NULL;
    struct flat_changes *cs;
    struct flat_txn *txn;
    int r;

    r = flat_enter(db, tid, 1, &txn);
    if (r != CYRUSDB_OK)
        return r;
    if (op != FLAT_OP_STORE) {
        int found;
        r = flat_lookup(db, txn, key, keylen, &found, NULL);
        if (r != CYRUSDB_OK)
            return flat_leave(db, tid, r);
        if (op == FLAT_OP_CREATE && found)
            return flat_leave(db, tid, CYRUSDB_EXISTS);
        if (op == FLAT_OP_DELETE && !found)
            return flat_leave(db, tid, force ? CYRUSDB_OK : CYRUSDB_NOTFOUND);
    }
    if (txn) {
        if (!txn->changes && !(txn->changes = flat_changes_new(db->flags)))
            return flat_leave(db, tid, flat_syserr("malloc", db->fname));
        cs = txn->changes;
    } else {
        if (!(single = flat_changes_new(db->flags)))
            return flat_leave(db, tid, flat_syserr("malloc", db->fname));
        cs = single;
    }
    if (flat_changes_put(cs, key, keylen, data, datalen,
                         op == FLAT_OP_DELETE) != FLAT_OK)
        r = flat_syserr("malloc", db->fname);
    else if (single)
        r = flat_rewrite(db, single, !(db->flags & CYRUSDB_NOSYNC));
    flat_changes_free(&single);
    return flat_leave(db, tid, r);
}

static int flat_create(struct cyrusdb *cdb, const char *key, size_t keylen,
                       const char *data, size_t datalen,
                       struct cyrusdb_txn **tid)
{
    return flat_write_op((struct flat_db *)cdb, FLAT_OP_CREATE, key, keylen,
                         data, datalen, tid, 0);
}

static int flat_store(struct cyrusdb *cdb, const char *key, size_t keylen,
                      const char *data, size_t datalen,
                      struct cyrusdb_txn **tid)
{
    return flat_write_op((struct flat_db *)cdb, FLAT_OP_STORE, key, keylen,
                         data, datalen, tid, 0);
}

static int flat_delete(struct cyrusdb *cdb, const char *key, size_t keylen,
                       struct cyrusdb_txn **tid, int force)
{
    return flat_write_op((struct flat_db *)cdb, FLAT_OP_DELETE, key, keylen,
                         NULL, 0, tid, force);
}

static int flat_commit(struct cyrusdb *cdb, struct cyrusdb_txn *tid)
{
    struct flat_db *db = (struct flat_db *)cdb;
    struct flat_txn *txn = FLAT_TXN(tid);
    int r = CYRUSDB_OK, u;

    if (!txn || txn != db->txn)
        return CYRUSDB_INTERNAL;
    if (flat_changes_count(txn->changes))
        r = flat_rewrite(db, txn->changes, !(db->flags & CYRUSDB_NOSYNC));
    u = flat_txn_end(db);
    return r != CYRUSDB_OK ? r : u;
}

static int flat_abort(struct cyrusdb *cdb, struct cyrusdb_txn *tid)
{
    struct flat_db *db = (struct flat_db *)cdb;
    struct flat_txn *txn = FLAT_TXN(tid);

    if (!txn || txn != db->txn)
        return CYRUSDB_INTERNAL;
    /* nothing reached the disk: dropping the changes is the whole abort */
    return flat_txn_end(db);
}

/* Write (s, len) with bytes < 0x20, 0x7f, '\\' and >= 0x80 as \xNN. */
static void flat_dump_bytes(FILE *out, const char *s, size_t len)
{
    size_t i;

    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c >= 0x7f || c == '\\')
            fprintf(out, "\\x%02x", c);
        else
            putc(c, out);
    }
}

static int flat_dump(struct cyrusdb *cdb, FILE *out, int detail)
{
    struct flat_db *db = (struct flat_db *)cdb;
    struct buf key = BUF_INITIALIZER, val = BUF_INITIALIZER;
    size_t offset = 0;
    int r;

    if ((r = flat_lock(db, F_RDLCK)) != CYRUSDB_OK)
        return r;
    if (detail)
        fprintf(out, "flat file=%s size=%zu order=%s\n", db->fname,
                db->map.size, (db->flags & CYRUSDB_MBOXSORT) ? "mbox" : "raw");
    for (;;) {
        struct flat_record rec;

        r = flat_parse_line(&db->map, offset, &rec);
        if (r == FLAT_END) {
            r = CYRUSDB_OK;
            break;
        }
        buf_reset(&key);
        buf_reset(&val);
        if (r == FLAT_OK)
            r = flat_decode(&key, rec.key, rec.keylen);
        if (r == FLAT_OK)
            r = flat_decode(&val, rec.val, rec.vallen);
        if (r != FLAT_OK) {
            if (detail)
                fprintf(out, "@%zu DAMAGED\n", offset);
            r = flat_engine_error(db, r, "malformed line met by dump");
            break;
        }
        if (detail)
            fprintf(out, "@%zu len=%zu ", offset, rec.next - offset);
        flat_dump_bytes(out, key.s, key.len);
        putc('\t', out);
        flat_dump_bytes(out, val.s, val.len);
        putc('\n', out);
        offset = rec.next;
    }
    buf_free(&key);
    buf_free(&val);
    if (ferror(out) && r == CYRUSDB_OK)
        r = CYRUSDB_IOERROR;
    return flat_leave(db, NULL, r);
}

static int flat_consistent(struct cyrusdb *cdb)
{
    struct flat_db *db = (struct flat_db *)cdb;
    const char *why;
    size_t offset, count;
    int r;

    if ((r = flat_lock(db, F_RDLCK)) != CYRUSDB_OK)
        return r;
    r = flat_check(&db->map, db->flags, &count, &offset, &why);
    if (r != FLAT_OK) {
        log_error("flat: inconsistent database file=<%s> offset=<%zu> "
                  "error=<%s>", db->fname, offset, why ? why : "?");
        r = CYRUSDB_IOERROR;
    }
    return flat_leave(db, NULL, r);
}

static int flat_checkpoint(struct cyrusdb *cdb)
{
    struct flat_db *db = (struct flat_db *)cdb;
    const char *why;
    size_t offset;
    int r;

    if (db->txn)
        return CYRUSDB_LOCKED;
    if ((r = flat_lock(db, F_WRLCK)) != CYRUSDB_OK)
        return r;
    /* never copy damage into a fresh file */
    r = flat_check(&db->map, db->flags, NULL, &offset, &why);
    if (r != FLAT_OK) {
        log_error("flat: checkpoint refused file=<%s> offset=<%zu> error=<%s>",
                  db->fname, offset, why ? why : "?");
        r = CYRUSDB_IOERROR;
    } else {
        r = flat_rewrite(db, NULL, 1);   /* durable, NOSYNC or not */
    }
    return flat_leave(db, NULL, r);
}

/*
 * Recovery: FNAME is always complete; only a stray FNAME.NEW can be left.
 * Remove those next to flat files (no process uses the directory now).
 */
static int flat_recover(const char *dir, int variant)
{
    DIR *d;
    struct dirent *de;
    int r = CYRUSDB_OK;

    (void)variant;
    d = opendir(dir);
    if (!d)
        return errno == ENOENT ? CYRUSDB_OK : flat_syserr("opendir", dir);
    while ((de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        const char *format = NULL;
        char *stray, *base;

        if (n <= 4 || strcmp(de->d_name + n - 4, ".NEW") != 0)
            continue;
        if (asprintf(&stray, "%s/%s", dir, de->d_name) < 0) {
            r = CYRUSDB_INTERNAL;
            break;
        }
        base = strdup(stray);
        if (!base) {
            free(stray);
            r = CYRUSDB_INTERNAL;
            break;
        }
        base[strlen(base) - 4] = '\0';
        if (cyrusdb_detect(base, &format) == CYRUSDB_OK &&
            !strcmp(format, "flat")) {
            if (unlink(stray) < 0 && errno != ENOENT)
                r = flat_syserr("unlink", stray);
            else
                log_info("flat: removed stray file=<%s>", stray);
        }
        free(stray);
        free(base);
    }
    closedir(d);
    return r;
}

/* flat keeps no logs: nothing to checkpoint across a directory. */
static int flat_checkpoint_dir(const char *dir, int variant)
{
    (void)dir;
    (void)variant;
    return CYRUSDB_OK;
}

const struct cyrusdb_backend cyrusdb_flat = {
    .name = "flat",
    .recover = flat_recover,
    .checkpoint_dir = flat_checkpoint_dir,
    .detect = flat_detect,
    .open = flat_open,
    .close = flat_close,
    .fetch = flat_fetch,
    .fetchlock = flat_fetchlock,
    .foreach = flat_foreach,
    .create = flat_create,
    .store = flat_store,
    .delete = flat_delete,
    .commit = flat_commit,
    .abort = flat_abort,
    .dump = flat_dump,
    .consistent = flat_consistent,
    .checkpoint = flat_checkpoint,
};
