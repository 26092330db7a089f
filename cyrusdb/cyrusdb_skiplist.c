/*
 * cyrusdb_skiplist.c - the cyrusdb adapter for the skiplist engine
 * (skiplist.c, which holds the file format and its crash-safety argument).
 *
 * This file maps the cyrusdb calling conventions onto the engine:
 *   - tid == NULL: a read runs under the shared lock (or inside the
 *     handle's open transaction, whose exclusive lock it already holds); a
 *     write runs in its own engine transaction, committed before return.
 *   - tid != NULL, *tid == NULL: the call begins the handle's transaction
 *     and hands back a struct cyrusdb_txn that names this handle.
 *   - tid != NULL, *tid != NULL: it must be this handle's open transaction
 *     (else CYRUSDB_INTERNAL).
 * Records are copied into handle-owned buffers before they are handed out:
 * the map they come from may move or be replaced on the next call.
 * foreach copies the current key and resumes at "first key greater than
 * it", so callbacks may write through the same handle and transaction.
 * Walks are in cyrusdb_compare() order although the file is in Cyrus's
 * signed-char order (files without MBOXSORT, see skiplist.c): a walk
 * streams the file until it meets a key holding a byte >= 0x80, and from
 * there sorts the rest of its range and visits it by lookup.
 * Engine codes become CYRUSDB_* codes in one place (the engine logged the
 * detail).
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "cyrusdb/cyrusdb_backends.h"
#include "cyrusdb/skiplist.h"
#include "lib/buf.h"
#include "lib/log.h"

struct cyrusdb_txn {
    struct cyrusdb_skiplist *owner;
};

struct cyrusdb_skiplist {
    struct cyrusdb db;             /* first: cyrusdb.c's view */
    struct skiplist *sl;
    struct cyrusdb_txn *txn;       /* the open transaction, or NULL */
    struct buf data;               /* fetch results */
};

static int cyrusdb_skiplist_code(int r)
{
    switch (r) {
    case SKIPLIST_OK:         return CYRUSDB_OK;
    case SKIPLIST_NOTFOUND:   return CYRUSDB_NOTFOUND;
    case SKIPLIST_EXISTS:     return CYRUSDB_EXISTS;
    case SKIPLIST_IOERROR:    return CYRUSDB_IOERROR;
    case SKIPLIST_FULL:       return CYRUSDB_FULL;
    case SKIPLIST_AGAIN:      return CYRUSDB_AGAIN;
    case SKIPLIST_READONLY:   return CYRUSDB_READONLY;
    case SKIPLIST_BADFORMAT:  return CYRUSDB_BADFORMAT;
    case SKIPLIST_NOTFILE:    return CYRUSDB_NOTFOUND;
    case SKIPLIST_MISUSE:
    default:                  return CYRUSDB_INTERNAL;
    }
}

static int cyrusdb_skiplist_detect(const char *head, size_t len)
{
    return skiplist_detect(head, len);
}

static int cyrusdb_skiplist_open(const char *fname, int flags, int variant,
                                 struct cyrusdb **db_r, const char **error_r)
{
    struct cyrusdb_skiplist *h;
    int slflags = 0, r;

    (void)variant;   /* no-sync variants exist for db3 only */
    *db_r = NULL;
    if (flags & CYRUSDB_CREATE)
        slflags |= SKIPLIST_CREATE;
    if (flags & CYRUSDB_RDONLY)
        slflags |= SKIPLIST_RDONLY;
    if (flags & CYRUSDB_MBOXSORT)
        slflags |= SKIPLIST_MBOXSORT;
    if (flags & CYRUSDB_NOCOMPACT)
        slflags |= SKIPLIST_NOCOMPACT;
    if (flags & CYRUSDB_NOSYNC)
        slflags |= SKIPLIST_NOSYNC;
    if (flags & CYRUSDB_ORDERED)
        slflags |= SKIPLIST_ORDERED;
    h = calloc(1, sizeof(*h));
    if (!h) {
        *error_r = "out of memory";
        return CYRUSDB_INTERNAL;
    }
    r = skiplist_open(fname, slflags, &h->sl, error_r);
    if (r != SKIPLIST_OK) {
        free(h);
        return cyrusdb_skiplist_code(r);
    }
    *db_r = &h->db;
    return CYRUSDB_OK;
}

static int cyrusdb_skiplist_abort(struct cyrusdb *db, struct cyrusdb_txn *tid);

static int cyrusdb_skiplist_close(struct cyrusdb *db)
{
    struct cyrusdb_skiplist *h = (struct cyrusdb_skiplist *)db;

    if (h->txn)
        cyrusdb_skiplist_abort(db, h->txn);
    skiplist_close(&h->sl);
    buf_free(&h->data);
    free(h);
    return CYRUSDB_OK;
}

/* ---- entering and leaving a call ------------------------------------- */

enum cyrusdb_skiplist_how {
    CYRUSDB_SKIPLIST_READ,      /* holds a read lock (or nests in the txn) */
    CYRUSDB_SKIPLIST_TXN,       /* in the caller's transaction */
    CYRUSDB_SKIPLIST_IMPLICIT   /* in a transaction of this call only */
};

/* Begin the handle's transaction for a call with *tid == NULL. */
static int cyrusdb_skiplist_begin(struct cyrusdb_skiplist *h, struct cyrusdb_txn **tid)
{
    struct cyrusdb_txn *t;
    int r;

    if (h->txn)
        return CYRUSDB_LOCKED;
    if (h->db.flags & CYRUSDB_RDONLY)
        return CYRUSDB_READONLY;
    t = calloc(1, sizeof(*t));
    if (!t)
        return CYRUSDB_INTERNAL;
    r = skiplist_txn_begin(h->sl);
    if (r != SKIPLIST_OK) {
        free(t);
        return cyrusdb_skiplist_code(r);
    }
    t->owner = h;
    h->txn = t;
    *tid = t;
    return CYRUSDB_OK;
}

static int cyrusdb_skiplist_enter(struct cyrusdb_skiplist *h, struct cyrusdb_txn **tid,
                                  int write, enum cyrusdb_skiplist_how *how_r)
{
    int r;

    if (tid && *tid) {
        if (*tid != h->txn || (*tid)->owner != h)
            return CYRUSDB_INTERNAL;
        *how_r = CYRUSDB_SKIPLIST_TXN;
        return CYRUSDB_OK;
    }
    if (tid) {
        *how_r = CYRUSDB_SKIPLIST_TXN;
        return cyrusdb_skiplist_begin(h, tid);
    }
    if (write) {
        if (h->txn)
            return CYRUSDB_LOCKED;
        r = skiplist_txn_begin(h->sl);
        *how_r = CYRUSDB_SKIPLIST_IMPLICIT;
        return cyrusdb_skiplist_code(r);
    }
    r = skiplist_read_lock(h->sl);
    *how_r = CYRUSDB_SKIPLIST_READ;
    return cyrusdb_skiplist_code(r);
}

/* Leave a call; r is its result so far (an implicit transaction commits
 * when r is OK or one of the non-error outcomes, else aborts). */
static int cyrusdb_skiplist_leave(struct cyrusdb_skiplist *h,
                                  enum cyrusdb_skiplist_how how, int r)
{
    switch (how) {
    case CYRUSDB_SKIPLIST_READ:
        skiplist_read_unlock(h->sl);
        break;
    case CYRUSDB_SKIPLIST_TXN:
        break;
    case CYRUSDB_SKIPLIST_IMPLICIT:
        if (r == CYRUSDB_OK) {
            r = cyrusdb_skiplist_code(skiplist_txn_commit(h->sl));
        } else {
            int r2 = skiplist_txn_abort(h->sl);
            if (r2 != SKIPLIST_OK && r >= 0)
                r = cyrusdb_skiplist_code(r2);
        }
        break;
    }
    return r;
}

/* ---- data calls ---------------------------------------------------- */

static int cyrusdb_skiplist_fetch(struct cyrusdb *db, const char *key, size_t keylen,
                                  const char **data_r, size_t *datalen_r,
                                  struct cyrusdb_txn **tid)
{
    struct cyrusdb_skiplist *h = (struct cyrusdb_skiplist *)db;
    struct skiplist_record rec;
    enum cyrusdb_skiplist_how how;
    int r;

    if (data_r)
        *data_r = NULL;
    if (datalen_r)
        *datalen_r = 0;
    if ((r = cyrusdb_skiplist_enter(h, tid, 0, &how)) != CYRUSDB_OK)
        return r;
    r = cyrusdb_skiplist_code(skiplist_fetch(h->sl, key, keylen, &rec));
    if (r == CYRUSDB_OK) {
        if (buf_setmap(&h->data, rec.data, rec.datalen) < 0) {
            r = CYRUSDB_INTERNAL;
        } else {
            if (data_r)
                *data_r = h->data.s ? h->data.s : "";
            if (datalen_r)
                *datalen_r = h->data.len;
        }
    }
    return cyrusdb_skiplist_leave(h, how, r);
}

/* A transaction is begun by any call given a tid, so fetchlock is fetch
 * with the tid cyrusdb.c insists on. */
static int cyrusdb_skiplist_fetchlock(struct cyrusdb *db, const char *key, size_t keylen,
                                      const char **data_r, size_t *datalen_r,
                                      struct cyrusdb_txn **tid)
{
    if (!tid)
        return CYRUSDB_INTERNAL;
    return cyrusdb_skiplist_fetch(db, key, keylen, data_r, datalen_r, tid);
}

/*
 * Walks.  The file is in the engine's order (Cyrus's signed chars unless
 * MBOXSORT), the walk must be in cyrusdb_compare() order.  The two agree
 * on every key for which skiplist_key_reorders() is 0, so a walk streams
 * the file while it meets only such keys: each key visited then is below,
 * in both orders, every key after it in the file.  At the first key that
 * the orders place differently, the rest of the walk collects the range's
 * keys above the last one visited, sorts them with cyrusdb_compare() and
 * visits each by lookup (skipping keys a callback deleted meanwhile).
 */
static int cyrusdb_skiplist_nomem(void)
{
    log_error("skiplist: walk failed error=<out of memory>");
    return SKIPLIST_IOERROR;
}

struct cyrusdb_skiplist_key {
    char *key;
    size_t keylen;
};

/* qsort order: keys re-sorted here come from files without MBOXSORT (the
 * only ones whose order differs), so the API's order is plain bytes. */
static int cyrusdb_skiplist_keycmp(const void *a, const void *b)
{
    const struct cyrusdb_skiplist_key *ka = a, *kb = b;

    return cyrusdb_compare(0, ka->key, ka->keylen, kb->key, kb->keylen);
}

/* The keys of the range above `after` (all of them when after is NULL),
 * in file order; the caller sorts and frees them. */
static int cyrusdb_skiplist_collect(struct cyrusdb_skiplist *h,
                                    const char *prefix, size_t prefixlen,
                                    const struct buf *after,
                                    struct cyrusdb_skiplist_key **keys_r,
                                    size_t *count_r)
{
    struct cyrusdb_skiplist_key *keys = NULL;
    size_t count = 0, alloc = 0;
    struct buf cur = BUF_INITIALIZER;
    struct skiplist_record rec;
    int r;

    r = skiplist_seek(h->sl, prefix, prefixlen, 0, &rec);
    while (r == SKIPLIST_OK) {
        if (!cyrusdb_has_prefix(rec.key, rec.keylen, prefix, prefixlen))
            break;
        if (buf_setmap(&cur, rec.key, rec.keylen) < 0) {
            r = cyrusdb_skiplist_nomem();
            break;
        }
        if (!after || cyrusdb_compare(0, cur.s, cur.len, after->s, after->len) > 0) {
            if (count == alloc) {
                size_t na = alloc ? alloc * 2 : 64;
                struct cyrusdb_skiplist_key *nk = realloc(keys, na * sizeof(*keys));

                if (!nk) {
                    r = cyrusdb_skiplist_nomem();
                    break;
                }
                keys = nk;
                alloc = na;
            }
            keys[count].key = malloc(cur.len ? cur.len : 1);
            if (!keys[count].key) {
                r = cyrusdb_skiplist_nomem();
                break;
            }
            memcpy(keys[count].key, cur.s, cur.len);
            keys[count].keylen = cur.len;
            count++;
        }
        r = skiplist_seek(h->sl, cur.s, cur.len, 1, &rec);
    }
    buf_free(&cur);
    *keys_r = keys;
    *count_r = count;
    if (r == SKIPLIST_NOTFOUND)
        r = SKIPLIST_OK;
    return r;
}

/* The rest of a walk in API order, by lookups.  Engine code; the callback's
 * non-zero return goes to *cb_r. */
static int cyrusdb_skiplist_walk_sorted(struct cyrusdb_skiplist *h,
                                        const char *prefix, size_t prefixlen,
                                        const struct buf *after,
                                        cyrusdb_filter_fn *filter, cyrusdb_cb_fn *cb,
                                        void *rock, int *cb_r)
{
    struct cyrusdb_skiplist_key *keys = NULL;
    struct buf data = BUF_INITIALIZER;
    struct skiplist_record rec;
    size_t count = 0, i;
    int r;

    r = cyrusdb_skiplist_collect(h, prefix, prefixlen, after, &keys, &count);
    if (r == SKIPLIST_OK)
        qsort(keys, count, sizeof(*keys), cyrusdb_skiplist_keycmp);
    for (i = 0; r == SKIPLIST_OK && i < count; i++) {
        r = skiplist_fetch(h->sl, keys[i].key, keys[i].keylen, &rec);
        if (r == SKIPLIST_NOTFOUND) {
            r = SKIPLIST_OK;    /* deleted by an earlier callback */
            continue;
        }
        if (r != SKIPLIST_OK)
            break;
        if (buf_setmap(&data, rec.data, rec.datalen) < 0) {
            r = cyrusdb_skiplist_nomem();
            break;
        }
        if (filter && !filter(rock, keys[i].key, keys[i].keylen,
                              data.s ? data.s : "", data.len))
            continue;
        *cb_r = cb(rock, keys[i].key, keys[i].keylen, data.s ? data.s : "", data.len);
        if (*cb_r)
            break;
    }
    for (i = 0; i < count; i++)
        free(keys[i].key);
    free(keys);
    buf_free(&data);
    return r;
}

static int cyrusdb_skiplist_foreach(struct cyrusdb *db, const char *prefix, size_t prefixlen,
                                    cyrusdb_filter_fn *filter, cyrusdb_cb_fn *cb, void *rock,
                                    struct cyrusdb_txn **tid)
{
    struct cyrusdb_skiplist *h = (struct cyrusdb_skiplist *)db;
    struct buf key = BUF_INITIALIZER, data = BUF_INITIALIZER;
    struct skiplist_record rec;
    enum cyrusdb_skiplist_how how;
    int r, cb_r = 0, have = 0;

    if (!prefix)
        prefixlen = 0;
    if ((r = cyrusdb_skiplist_enter(h, tid, 0, &how)) != CYRUSDB_OK)
        return r;
    r = skiplist_seek(h->sl, prefix, prefixlen, 0, &rec);
    while (r == SKIPLIST_OK) {
        if (!cyrusdb_has_prefix(rec.key, rec.keylen, prefix, prefixlen))
            break;
        if (skiplist_key_reorders(h->sl, rec.key, rec.keylen)) {
            r = cyrusdb_skiplist_walk_sorted(h, prefix, prefixlen, have ? &key : NULL,
                                             filter, cb, rock, &cb_r);
            break;
        }
        /* copies: the callback may write through this handle */
        if (buf_setmap(&key, rec.key, rec.keylen) < 0 ||
            buf_setmap(&data, rec.data, rec.datalen) < 0) {
            r = cyrusdb_skiplist_nomem();
            break;
        }
        have = 1;
        if (!filter || filter(rock, key.s, key.len, data.s ? data.s : "", data.len)) {
            cb_r = cb(rock, key.s, key.len, data.s ? data.s : "", data.len);
            if (cb_r)
                break;
        }
        r = skiplist_seek(h->sl, key.s, key.len, 1, &rec);
    }
    if (r == SKIPLIST_NOTFOUND)
        r = SKIPLIST_OK;
    r = cyrusdb_skiplist_code(r);
    buf_free(&key);
    buf_free(&data);
    r = cyrusdb_skiplist_leave(h, how, r);
    return r != CYRUSDB_OK ? r : cb_r;
}

static int cyrusdb_skiplist_put(struct cyrusdb *db, const char *key, size_t keylen,
                                const char *data, size_t datalen,
                                struct cyrusdb_txn **tid, int overwrite)
{
    struct cyrusdb_skiplist *h = (struct cyrusdb_skiplist *)db;
    enum cyrusdb_skiplist_how how;
    int r;

    if ((r = cyrusdb_skiplist_enter(h, tid, 1, &how)) != CYRUSDB_OK)
        return r;
    r = cyrusdb_skiplist_code(skiplist_store(h->sl, key, keylen, data, datalen, overwrite));
    return cyrusdb_skiplist_leave(h, how, r);
}

static int cyrusdb_skiplist_create(struct cyrusdb *db, const char *key, size_t keylen,
                                   const char *data, size_t datalen,
                                   struct cyrusdb_txn **tid)
{
    return cyrusdb_skiplist_put(db, key, keylen, data, datalen, tid, 0);
}

static int cyrusdb_skiplist_store(struct cyrusdb *db, const char *key, size_t keylen,
                                  const char *data, size_t datalen,
                                  struct cyrusdb_txn **tid)
{
    return cyrusdb_skiplist_put(db, key, keylen, data, datalen, tid, 1);
}

static int cyrusdb_skiplist_delete(struct cyrusdb *db, const char *key, size_t keylen,
                                   struct cyrusdb_txn **tid, int force)
{
    struct cyrusdb_skiplist *h = (struct cyrusdb_skiplist *)db;
    enum cyrusdb_skiplist_how how;
    int r;

    if ((r = cyrusdb_skiplist_enter(h, tid, 1, &how)) != CYRUSDB_OK)
        return r;
    r = cyrusdb_skiplist_code(skiplist_delete(h->sl, key, keylen));
    if (r == CYRUSDB_NOTFOUND && force)
        r = CYRUSDB_OK;
    return cyrusdb_skiplist_leave(h, how, r);
}

static int cyrusdb_skiplist_commit(struct cyrusdb *db, struct cyrusdb_txn *tid)
{
    struct cyrusdb_skiplist *h = (struct cyrusdb_skiplist *)db;
    int r;

    if (!tid || tid != h->txn || tid->owner != h)
        return CYRUSDB_INTERNAL;
    r = skiplist_txn_commit(h->sl);
    h->txn = NULL;
    free(tid);
    return cyrusdb_skiplist_code(r);
}

static int cyrusdb_skiplist_abort(struct cyrusdb *db, struct cyrusdb_txn *tid)
{
    struct cyrusdb_skiplist *h = (struct cyrusdb_skiplist *)db;
    int r;

    if (!tid || tid != h->txn || tid->owner != h)
        return CYRUSDB_INTERNAL;
    r = skiplist_txn_abort(h->sl);
    h->txn = NULL;
    free(tid);
    return cyrusdb_skiplist_code(r);
}

/* ---- whole-file calls ---------------------------------------------- */

static int cyrusdb_skiplist_dump(struct cyrusdb *db, FILE *out, int detail)
{
    struct cyrusdb_skiplist *h = (struct cyrusdb_skiplist *)db;

    return cyrusdb_skiplist_code(skiplist_dump(h->sl, out, detail));
}

static int cyrusdb_skiplist_consistent(struct cyrusdb *db)
{
    struct cyrusdb_skiplist *h = (struct cyrusdb_skiplist *)db;

    return cyrusdb_skiplist_code(skiplist_consistent(h->sl));
}

static int cyrusdb_skiplist_stamp(struct cyrusdb *db, int now,
                                  struct cyrusdb_stamp *st)
{
    struct cyrusdb_skiplist *h = (struct cyrusdb_skiplist *)db;

    if (h->txn)
        return CYRUSDB_INTERNAL;
    return cyrusdb_skiplist_code(skiplist_stamp(h->sl, now, st->v));
}

static int cyrusdb_skiplist_checkpoint(struct cyrusdb *db)
{
    struct cyrusdb_skiplist *h = (struct cyrusdb_skiplist *)db;

    if (h->txn)
        return CYRUSDB_LOCKED;
    return cyrusdb_skiplist_code(skiplist_checkpoint(h->sl));
}

/* Recover every skiplist file under dir (recursively; symbolic links,
 * checkpoint leftovers "*.NEW" and files set aside as damaged are
 * skipped). */
static int cyrusdb_skiplist_recover_tree(const char *dir, int depth)
{
    DIR *d;
    struct dirent *de;
    int ret = CYRUSDB_OK;

    if (depth > 8)
        return CYRUSDB_OK;
    d = opendir(dir);
    if (!d) {
        if (errno == ENOENT)
            return CYRUSDB_OK;
        log_error("skiplist: opendir failed dir=<%s> error=<%s>", dir, strerror(errno));
        return CYRUSDB_IOERROR;
    }
    while ((de = readdir(d)) != NULL) {
        struct stat st;
        char *path;
        size_t nl = strlen(de->d_name);

        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (nl > 4 && !strcmp(de->d_name + nl - 4, ".NEW"))
            continue;
        /* a file set aside as damaged (NAME.damaged-TIME, see
         * store/duplicate.c) is kept for inspection, not recovered */
        if (strstr(de->d_name, ".damaged-"))
            continue;
        if (asprintf(&path, "%s/%s", dir, de->d_name) < 0) {
            ret = CYRUSDB_INTERNAL;
            break;
        }
        if (lstat(path, &st) == 0) {
            if (S_ISDIR(st.st_mode)) {
                int r = cyrusdb_skiplist_recover_tree(path, depth + 1);
                if (r != CYRUSDB_OK)
                    ret = r;
            } else if (S_ISREG(st.st_mode) && st.st_size >= SKIPLIST_MAGIC_LEN) {
                char head[SKIPLIST_MAGIC_LEN];
                FILE *f = fopen(path, "re");
                int is_ours = f && fread(head, 1, sizeof(head), f) == sizeof(head) &&
                              skiplist_detect(head, sizeof(head));

                if (f)
                    fclose(f);
                if (is_ours) {
                    int r = cyrusdb_skiplist_code(skiplist_recover_file(path));
                    if (r != CYRUSDB_OK)
                        ret = r;
                }
            }
        }
        free(path);
    }
    closedir(d);
    return ret;
}

static int cyrusdb_skiplist_recover(const char *dir, int variant)
{
    (void)variant;
    return cyrusdb_skiplist_recover_tree(dir, 0);
}

/* Skiplist keeps no per-directory logs: each file bounds its own log by
 * checkpointing after commits, so there is nothing to flush here. */
static int cyrusdb_skiplist_checkpoint_dir(const char *dir, int variant)
{
    (void)dir;
    (void)variant;
    return CYRUSDB_OK;
}

const struct cyrusdb_backend cyrusdb_skiplist = {
    .name = "skiplist",
    .recover = cyrusdb_skiplist_recover,
    .checkpoint_dir = cyrusdb_skiplist_checkpoint_dir,
    .detect = cyrusdb_skiplist_detect,
    .open = cyrusdb_skiplist_open,
    .close = cyrusdb_skiplist_close,
    .fetch = cyrusdb_skiplist_fetch,
    .fetchlock = cyrusdb_skiplist_fetchlock,
    .foreach = cyrusdb_skiplist_foreach,
    .create = cyrusdb_skiplist_create,
    .store = cyrusdb_skiplist_store,
    .delete = cyrusdb_skiplist_delete,
    .commit = cyrusdb_skiplist_commit,
    .abort = cyrusdb_skiplist_abort,
    .dump = cyrusdb_skiplist_dump,
    .consistent = cyrusdb_skiplist_consistent,
    .checkpoint = cyrusdb_skiplist_checkpoint,
    .stamp = cyrusdb_skiplist_stamp,
};
