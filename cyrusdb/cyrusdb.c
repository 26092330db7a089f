/*
 * cyrusdb.c - the backend registry and the API entry points.
 *
 * Each public call checks what every backend would otherwise check again
 * (read-only handles, empty or over-long keys, fetchlock without a
 * transaction handle), then dispatches through the handle's backend table.
 * cyrusdb_open() also refuses a file written by another backend, naming
 * both, before any backend code touches it, and flag bits it does not
 * know; the known flags (CYRUSDB_NOSYNC included) go to the backend's open
 * unchanged and stay in the handle header.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "cyrusdb/cyrusdb_backends.h"
#include "lib/buf.h"
#include "lib/log.h"
#include "lib/metrics.h"

const struct cyrusdb_registry_entry cyrusdb_registry[] = {
    { .name = "flat",            .format = "flat",     .backend = &cyrusdb_flat,     .variant = 0 },
    { .name = "skiplist",        .format = "skiplist", .backend = &cyrusdb_skiplist, .variant = 0 },
    { .name = "db3",             .format = "db3",      .backend = &cyrusdb_db3,      .variant = 0 },
    { .name = "db3-nosync",      .format = "db3",      .backend = &cyrusdb_db3,      .variant = CYRUSDB_VARIANT_NOSYNC },
    { .name = "berkeley",        .format = "db3",      .backend = &cyrusdb_db3,      .variant = 0 },
    { .name = "berkeley-nosync", .format = "db3",      .backend = &cyrusdb_db3,      .variant = CYRUSDB_VARIANT_NOSYNC },
    { .name = "lmdb",            .format = "lmdb",     .backend = &cyrusdb_lmdb,     .variant = 0 },
    { .name = "etcd",            .format = "etcd",     .backend = &cyrusdb_etcd,     .variant = 0, .nofile = 1 },
    { .name = NULL, .format = NULL, .backend = NULL, .variant = 0 }
};

/* Formats we recognise but cannot open, so the error can name them. */
static const struct {
    const char *format;
    const char *magic;
    size_t len;
} cyrusdb_foreign[] = {
    { "twoskip", "\241\002\213\015twoskip file\0\0\0\0", 20 },
    { "twom", "\241\002\213\015twom file\0\0\0\0\0\0\0", 20 },
    { "sqlite", "SQLite format 3\0", 16 },
};

static char cyrusdb_errbuf[1024];

#define CYRUSDB_OPEN_FLAGS (CYRUSDB_CREATE | CYRUSDB_MBOXSORT | CYRUSDB_RDONLY | \
                            CYRUSDB_NOCOMPACT | CYRUSDB_NOSYNC | \
                            CYRUSDB_ORDERED)

const struct cyrusdb_registry_entry *cyrusdb_lookup(const char *name)
{
    const struct cyrusdb_registry_entry *e;

    if (!name)
        return NULL;
    for (e = cyrusdb_registry; e->name; e++)
        if (!strcmp(e->name, name))
            return e;
    return NULL;
}

const char *cyrusdb_names(void)
{
    static char names[256];
    const struct cyrusdb_registry_entry *e;
    size_t n = 0;

    if (names[0])
        return names;
    for (e = cyrusdb_registry; e->name; e++) {
        int w = snprintf(names + n, sizeof(names) - n, "%s%s",
                         n ? " " : "", e->name);
        if (w < 0 || (size_t)w >= sizeof(names) - n)
            break;
        n += (size_t)w;
    }
    return names;
}

const char *cyrusdb_strerror(int r)
{
    switch (r) {
    case CYRUSDB_OK:             return "ok";
    case CYRUSDB_DONE:           return "done";
    case CYRUSDB_IOERROR:        return "I/O error or damaged database file";
    case CYRUSDB_AGAIN:          return "temporary failure (deadlock or busy), try again";
    case CYRUSDB_EXISTS:         return "key already exists";
    case CYRUSDB_INTERNAL:       return "internal error or API misuse";
    case CYRUSDB_NOTFOUND:       return "not found";
    case CYRUSDB_LOCKED:         return "database handle busy in another transaction";
    case CYRUSDB_NOTIMPLEMENTED: return "operation not implemented by this backend";
    case CYRUSDB_FULL:           return "no space left (disk or map full)";
    case CYRUSDB_READONLY:       return "database opened read-only";
    case CYRUSDB_BADFORMAT:      return "file is not a database of this backend";
    default:                     return "unknown cyrusdb error";
    }
}

int cyrusdb_notimplemented(struct cyrusdb *db)
{
    (void)db;
    return CYRUSDB_NOTIMPLEMENTED;
}

int cyrusdb_stamp(struct cyrusdb *db, int now, struct cyrusdb_stamp *st)
{
    if (!db->backend->stamp)
        return CYRUSDB_NOTIMPLEMENTED;
    return db->backend->stamp(db, now, st);
}

int cyrusdb_stamp_equal(const struct cyrusdb_stamp *a,
                        const struct cyrusdb_stamp *b)
{
    return a->v[0] == b->v[0] && a->v[1] == b->v[1] && a->v[2] == b->v[2];
}

/* ---- key order ------------------------------------------------------- */

/* Mailbox order: '.' ranks below every other byte (including NUL), so
 * "user.alice" < "user.alice.Sent" < "user.alice-x" < "user.alice2". */
static inline int cyrusdb_mboxrank(unsigned char c)
{
    return c == '.' ? 0 : (int)c + 1;
}

int cyrusdb_compare(int flags, const char *a, size_t alen,
                    const char *b, size_t blen)
{
    size_t n = alen < blen ? alen : blen;
    size_t i;

    if (flags & CYRUSDB_MBOXSORT) {
        /* ranks only where the bytes differ (equal bytes, equal ranks):
         * the keys of one search share long prefixes ("user.") */
        for (i = 0; i < n && a[i] == b[i]; i++)
            ;
        if (i < n) {
            int ra = cyrusdb_mboxrank((unsigned char)a[i]);
            int rb = cyrusdb_mboxrank((unsigned char)b[i]);
            return ra < rb ? -1 : 1;   /* differ: a byte has one rank */
        }
    } else if (n) {
        int r = memcmp(a, b, n);
        if (r)
            return r < 0 ? -1 : 1;
    }
    if (alen == blen)
        return 0;
    return alen < blen ? -1 : 1;
}

int cyrusdb_has_prefix(const char *key, size_t keylen,
                       const char *prefix, size_t prefixlen)
{
    return keylen >= prefixlen &&
           (prefixlen == 0 || memcmp(key, prefix, prefixlen) == 0);
}

/* ---- detection ------------------------------------------------------- */

int cyrusdb_detect(const char *fname, const char **format_r)
{
    char head[4096];
    ssize_t n;
    size_t i;
    int fd;
    const struct cyrusdb_registry_entry *e;

    fd = open(fname, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? CYRUSDB_NOTFOUND : CYRUSDB_IOERROR;
    do {
        n = pread(fd, head, sizeof(head), 0);
    } while (n < 0 && errno == EINTR);
    close(fd);
    if (n < 0)
        return CYRUSDB_IOERROR;
    if (n == 0) {
        *format_r = "flat";
        return CYRUSDB_OK;
    }
    for (i = 0; i < sizeof(cyrusdb_foreign) / sizeof(cyrusdb_foreign[0]); i++) {
        if ((size_t)n >= cyrusdb_foreign[i].len &&
            !memcmp(head, cyrusdb_foreign[i].magic, cyrusdb_foreign[i].len)) {
            *format_r = cyrusdb_foreign[i].format;
            return CYRUSDB_OK;
        }
    }
    /* binary formats first; flat (text) accepts the most and goes last */
    for (e = cyrusdb_registry; e->name; e++) {
        if (e->backend == &cyrusdb_flat || !e->backend->detect)
            continue;
        if (e->backend->detect(head, (size_t)n)) {
            *format_r = e->format;
            return CYRUSDB_OK;
        }
    }
    if (cyrusdb_flat.detect && cyrusdb_flat.detect(head, (size_t)n)) {
        *format_r = "flat";
        return CYRUSDB_OK;
    }
    return CYRUSDB_BADFORMAT;
}

/* ---- open / close ---------------------------------------------------- */

static int cyrusdb_counted(int dbindex, const char *backend, int r)
{
    if (r == CYRUSDB_IOERROR || r == CYRUSDB_INTERNAL || r == CYRUSDB_FULL
        || r == CYRUSDB_BADFORMAT)
        metrics_db_error(dbindex, backend);
    return r;
}

int cyrusdb_open(const char *backend, const char *fname, int flags,
                 struct cyrusdb **db_r, const char **error_r)
{
    const struct cyrusdb_registry_entry *e = cyrusdb_lookup(backend);
    const char *format = NULL;
    const char *err = NULL;
    struct stat st;
    int r;

    *db_r = NULL;
    cyrusdb_errbuf[0] = '\0';
    if (error_r)
        *error_r = cyrusdb_errbuf;
    if (!e) {
        snprintf(cyrusdb_errbuf, sizeof(cyrusdb_errbuf),
                 "unknown cyrusdb backend \"%s\" (known: %s)",
                 backend ? backend : "(null)", cyrusdb_names());
        log_error("cyrusdb: open failed file=<%s> error=<%s>", fname, cyrusdb_errbuf);
        return CYRUSDB_INTERNAL;
    }
    if (flags & ~CYRUSDB_OPEN_FLAGS) {
        snprintf(cyrusdb_errbuf, sizeof(cyrusdb_errbuf),
                 "%s: unknown cyrusdb_open flags 0x%x", fname,
                 (unsigned)(flags & ~CYRUSDB_OPEN_FLAGS));
        log_error("cyrusdb: open failed file=<%s> error=<%s>", fname, cyrusdb_errbuf);
        return CYRUSDB_INTERNAL;
    }
    if (e->nofile) {
        /* nothing at the name to look at: the backend decides */
    } else if (stat(fname, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        r = cyrusdb_detect(fname, &format);
        if (r == CYRUSDB_BADFORMAT) {
            snprintf(cyrusdb_errbuf, sizeof(cyrusdb_errbuf),
                     "%s: not a database file of any known backend "
                     "(tried to open it as %s)", fname, e->name);
            log_error("cyrusdb: open failed file=<%s> backend=<%s> error=<%s>",
                      fname, e->name, cyrusdb_errbuf);
            return CYRUSDB_BADFORMAT;
        }
        if (r == CYRUSDB_OK && strcmp(format, e->format) != 0) {
            snprintf(cyrusdb_errbuf, sizeof(cyrusdb_errbuf),
                     "%s: file was written by backend %s, "
                     "but was opened as %s", fname, format, e->name);
            log_error("cyrusdb: open failed file=<%s> backend=<%s> found=<%s>",
                      fname, e->name, format);
            return CYRUSDB_BADFORMAT;
        }
    } else if (!(flags & CYRUSDB_CREATE) && stat(fname, &st) < 0) {
        snprintf(cyrusdb_errbuf, sizeof(cyrusdb_errbuf),
                 "%s: no such database file", fname);
        return CYRUSDB_NOTFOUND;
    }

    r = e->backend->open(fname, flags, e->variant, db_r, &err);
    if (r != CYRUSDB_OK) {
        snprintf(cyrusdb_errbuf, sizeof(cyrusdb_errbuf), "%s: %s (%s)",
                 fname, err ? err : cyrusdb_strerror(r), e->name);
        log_error("cyrusdb: open failed file=<%s> backend=<%s> error=<%s>",
                  fname, e->name, cyrusdb_errbuf);
        cyrusdb_counted(metrics_db_index(fname), e->name, r);
        *db_r = NULL;
        return r;
    }
    (*db_r)->backend = e->backend;
    (*db_r)->flags = flags;
    (*db_r)->metrics_db = metrics_db_index(fname);
    return CYRUSDB_OK;
}

int cyrusdb_close(struct cyrusdb **dbp)
{
    struct cyrusdb *db = *dbp;

    if (!db)
        return CYRUSDB_OK;
    *dbp = NULL;
    return db->backend->close(db);
}

/* ---- data calls ------------------------------------------------------ */

#define CYRUSDB_MAX_KEYLEN 511   /* LMDB's limit, applied to all backends */

/* r of a backend call, counted for the metrics when it is an error of
 * the engine or the file (not "not found", "exists", "again"). */
#define CYRUSDB_COUNTED(db, call) \
    cyrusdb_counted((db)->metrics_db, (db)->backend->name, (call))

static int cyrusdb_check_write(struct cyrusdb *db, size_t keylen)
{
    if (db->flags & CYRUSDB_RDONLY)
        return CYRUSDB_READONLY;
    if (keylen == 0 || keylen > CYRUSDB_MAX_KEYLEN)
        return CYRUSDB_INTERNAL;
    return CYRUSDB_OK;
}

int cyrusdb_fetch(struct cyrusdb *db, const char *key, size_t keylen,
                  const char **data_r, size_t *datalen_r,
                  struct cyrusdb_txn **tid)
{
    if (keylen == 0 || keylen > CYRUSDB_MAX_KEYLEN)
        return CYRUSDB_NOTFOUND;
    return CYRUSDB_COUNTED(db, db->backend->fetch(db, key, keylen, data_r, datalen_r, tid));
}

int cyrusdb_fetchlock(struct cyrusdb *db, const char *key, size_t keylen,
                      const char **data_r, size_t *datalen_r,
                      struct cyrusdb_txn **tid)
{
    int r;

    if (!tid)
        return CYRUSDB_INTERNAL;
    if ((r = cyrusdb_check_write(db, keylen)) != CYRUSDB_OK)
        return r;
    return CYRUSDB_COUNTED(db, db->backend->fetchlock(db, key, keylen, data_r, datalen_r, tid));
}

/*
 * Every walk passes through this guard: each record must come after the one
 * before it in the handle's order.  A file opened with another sort order
 * than it was written in (flat and skiplist files do not record it) or a
 * damaged file could otherwise send a backend's "resume after this key"
 * round in circles; the guard turns that into CYRUSDB_IOERROR.
 */
struct cyrusdb_walk {
    struct cyrusdb *db;
    cyrusdb_filter_fn *filter;
    cyrusdb_cb_fn *cb;
    void *rock;
    struct buf prev;
    int have_prev;
    int disorder;
};

static int cyrusdb_walk_filter(void *rock, const char *key, size_t keylen,
                               const char *data, size_t datalen)
{
    struct cyrusdb_walk *w = rock;

    if (w->have_prev &&
        cyrusdb_compare(w->db->flags, w->prev.s, w->prev.len, key, keylen) >= 0) {
        w->disorder = 1;
        return 1;   /* let the callback wrapper stop the walk */
    }
    if (buf_setmap(&w->prev, key, keylen) < 0) {
        w->disorder = -1;
        return 1;
    }
    w->have_prev = 1;
    return w->filter ? w->filter(w->rock, key, keylen, data, datalen) : 1;
}

static int cyrusdb_walk_cb(void *rock, const char *key, size_t keylen,
                           const char *data, size_t datalen)
{
    struct cyrusdb_walk *w = rock;

    if (w->disorder)
        return CYRUSDB_IOERROR;
    return w->cb(w->rock, key, keylen, data, datalen);
}

int cyrusdb_foreach(struct cyrusdb *db, const char *prefix, size_t prefixlen,
                    cyrusdb_filter_fn *filter, cyrusdb_cb_fn *cb, void *rock,
                    struct cyrusdb_txn **tid)
{
    struct cyrusdb_walk w = {
        .db = db, .filter = filter, .cb = cb, .rock = rock,
        .prev = BUF_INITIALIZER, .have_prev = 0, .disorder = 0
    };
    int r;

    if (!cb)
        return CYRUSDB_INTERNAL;
    if (!prefix)
        prefixlen = 0;
    r = db->backend->foreach(db, prefix, prefixlen, cyrusdb_walk_filter,
                             cyrusdb_walk_cb, &w, tid);
    if (w.disorder > 0) {
        log_error("cyrusdb: walk met keys out of order backend=<%s> "
                  "error=<damaged file, or opened with another sort order "
                  "(CYRUSDB_MBOXSORT) than it was written with>",
                  db->backend->name);
        r = CYRUSDB_IOERROR;
    } else if (w.disorder < 0) {
        r = CYRUSDB_INTERNAL;
    }
    buf_free(&w.prev);
    return CYRUSDB_COUNTED(db, r);
}

int cyrusdb_create(struct cyrusdb *db, const char *key, size_t keylen,
                   const char *data, size_t datalen, struct cyrusdb_txn **tid)
{
    int r = cyrusdb_check_write(db, keylen);

    if (r != CYRUSDB_OK)
        return r;
    if (!data)
        data = "", datalen = 0;
    return CYRUSDB_COUNTED(db, db->backend->create(db, key, keylen, data, datalen, tid));
}

int cyrusdb_store(struct cyrusdb *db, const char *key, size_t keylen,
                  const char *data, size_t datalen, struct cyrusdb_txn **tid)
{
    int r = cyrusdb_check_write(db, keylen);

    if (r != CYRUSDB_OK)
        return r;
    if (!data)
        data = "", datalen = 0;
    return CYRUSDB_COUNTED(db, db->backend->store(db, key, keylen, data, datalen, tid));
}

int cyrusdb_delete(struct cyrusdb *db, const char *key, size_t keylen,
                   struct cyrusdb_txn **tid, int force)
{
    int r = cyrusdb_check_write(db, keylen);

    if (r != CYRUSDB_OK)
        return r;
    return CYRUSDB_COUNTED(db, db->backend->delete(db, key, keylen, tid, force));
}

int cyrusdb_commit(struct cyrusdb *db, struct cyrusdb_txn *tid)
{
    if (!tid)
        return CYRUSDB_INTERNAL;
    return CYRUSDB_COUNTED(db, db->backend->commit(db, tid));
}

int cyrusdb_abort(struct cyrusdb *db, struct cyrusdb_txn *tid)
{
    if (!tid)
        return CYRUSDB_INTERNAL;
    return CYRUSDB_COUNTED(db, db->backend->abort(db, tid));
}

int cyrusdb_dump(struct cyrusdb *db, FILE *out, int detail)
{
    if (!db->backend->dump)
        return CYRUSDB_NOTIMPLEMENTED;
    return db->backend->dump(db, out, detail);
}

int cyrusdb_consistent(struct cyrusdb *db)
{
    if (!db->backend->consistent)
        return CYRUSDB_NOTIMPLEMENTED;
    return db->backend->consistent(db);
}

int cyrusdb_checkpoint(struct cyrusdb *db)
{
    if (db->flags & CYRUSDB_RDONLY)
        return CYRUSDB_READONLY;
    if (!db->backend->checkpoint)
        return CYRUSDB_NOTIMPLEMENTED;
    return db->backend->checkpoint(db);
}

/* ---- key order ---------------------------------------------------------- */

/* Open fname in `order` read-only and check it; CYRUSDB_OK when it opens
 * and is consistent (or the backend has no check), else the error. */
static int cyrusdb_try_order(const char *backend, const char *fname,
                             int order)
{
    struct cyrusdb *db = NULL;
    int r;

    r = cyrusdb_open(backend, fname,
                     CYRUSDB_RDONLY | CYRUSDB_NOCOMPACT | order, &db, NULL);
    if (r != CYRUSDB_OK)
        return r;
    r = cyrusdb_consistent(db);
    cyrusdb_close(&db);
    return r == CYRUSDB_NOTIMPLEMENTED ? CYRUSDB_OK : r;
}

int cyrusdb_detect_order(const char *backend, const char *fname, int flags,
                         int *order_r)
{
    enum log_target saved = log_get_target();
    int first = flags & CYRUSDB_MBOXSORT;
    int r;

    *order_r = first;
    log_init(NULL, LOG_TO_NONE);
    r = cyrusdb_try_order(backend, fname, first);
    if (r == CYRUSDB_IOERROR || r == CYRUSDB_INTERNAL) {
        if (cyrusdb_try_order(backend, fname, first ^ CYRUSDB_MBOXSORT)
            == CYRUSDB_OK) {
            *order_r = first ^ CYRUSDB_MBOXSORT;
            r = CYRUSDB_OK;
        } else {
            r = CYRUSDB_IOERROR;
        }
    }
    log_init(NULL, saved);
    return r;
}

/* ---- whole-directory calls ------------------------------------------- */

static int cyrusdb_each_backend(const char *dir, int checkpoint)
{
    const struct cyrusdb_registry_entry *e;
    int ret = CYRUSDB_OK;

    for (e = cyrusdb_registry; e->name; e++) {
        int (*fn)(const char *, int);
        int r;

        /* run each distinct backend once (aliases share a table) */
        if (e != cyrusdb_registry && e->backend == (e - 1)->backend)
            continue;
        fn = checkpoint ? e->backend->checkpoint_dir : e->backend->recover;
        if (!fn)
            continue;
        r = fn(dir, e->variant);
        if (r != CYRUSDB_OK) {
            log_error("cyrusdb: %s failed dir=<%s> backend=<%s> error=<%s>",
                      checkpoint ? "checkpoint" : "recovery", dir, e->name,
                      cyrusdb_strerror(r));
            ret = r;
        }
    }
    return ret;
}

int cyrusdb_recover(const char *dir)
{
    return cyrusdb_each_backend(dir, 0);
}

int cyrusdb_checkpoint_dir(const char *dir)
{
    return cyrusdb_each_backend(dir, 1);
}
