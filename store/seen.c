/*
 * seen.c - per-user seen state, CONFIGDIR/user/H/USER.seen.
 *
 * ON-DISK FORMAT (cyrusdb backend `seenstate_db`, plain byte order; Cyrus
 * 2.x's layout):
 *
 *   UNIQUEID  ->  "1 LASTREAD LASTUID LASTCHANGE SEENUIDS"
 *
 * 1 is the record version; LASTREAD and LASTCHANGE are decimal seconds,
 * LASTUID a decimal uid; SEENUIDS is a sequence set of uids, "" for none
 * (the space before it is then optional on reading, always written).
 *
 * SEQUENCE SETS as stored: items separated by ',', an item "N" or "N:M"
 * with 1 <= N <= M <= 4294967295, numbers without leading zeros, items in
 * ascending order and not overlapping.  seen_set_update() writes the
 * canonical form (adjacent ranges merged, "N" for a one-uid range); the
 * readers also accept adjacent items ("1:3,4") and "N:N".  Anything else
 * is malformed: seen_read() reports STORE_CORRUPT, seen_set_contains()
 * finds nothing in it.
 *
 * CRASH SAFETY: each write is one cyrusdb transaction replacing one
 * record, so a crash leaves the old or the new state of a mailbox.  A
 * user rename copies every record into the new file in one transaction
 * before removing the old file, so a crash in between leaves both, and the
 * rename can be run again.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/fsutil.h"
#include "lib/log.h"
#include "store/seen.h"
#include "store/store.h"

#define SEEN_SUFFIX "seen"
#define SEEN_DBFLAGS 0
#define SEEN_VERSION "1"

/* The last record seen_read() fetched, kept while the database's stamp
 * (cyrusdb_stamp()) says no commit happened since: a session reads its
 * mailbox's state before every reply, and most of the time nothing
 * changed.  Any write through the handle drops it. */
struct seen_cache {
    int valid;
    int found;                  /* the key was present */
    struct buf key;
    struct buf val;
    struct cyrusdb_stamp stamp; /* of the database when it was read */
};

struct seen_db {
    struct cyrusdb *db;
    char *fname;
    struct seen_cache cache;
};

/* ---- sequence sets ---------------------------------------------------- */

struct seen_iter {
    const char *p;
    size_t len;
    size_t pos;
    uint64_t prev_hi;   /* 0 before the first item */
};

static void seen_iter_init(struct seen_iter *it, const char *p, size_t len)
{
    it->p = p;
    it->len = len;
    it->pos = 0;
    it->prev_hi = 0;
}

static int seen_iter_num(struct seen_iter *it, uint32_t *v_r)
{
    size_t start = it->pos;
    uint64_t v;

    while (it->pos < it->len && it->p[it->pos] >= '0' &&
           it->p[it->pos] <= '9' && it->pos - start <= 10)
        it->pos++;
    if (store_parse_u64(it->p + start, it->pos - start, UINT32_MAX, &v) < 0 ||
        v == 0)
        return -1;
    *v_r = (uint32_t)v;
    return 0;
}

/* The next item: 1 with [*lo, *hi], 0 at the end, -1 when malformed. */
static int seen_iter_next(struct seen_iter *it, uint32_t *lo, uint32_t *hi)
{
    if (it->pos >= it->len)
        return 0;
    if (it->pos > 0) {
        if (it->p[it->pos] != ',')
            return -1;
        it->pos++;
    }
    if (seen_iter_num(it, lo) < 0)
        return -1;
    *hi = *lo;
    if (it->pos < it->len && it->p[it->pos] == ':') {
        it->pos++;
        if (seen_iter_num(it, hi) < 0 || *hi < *lo)
            return -1;
    }
    if (it->pos < it->len && it->p[it->pos] != ',')
        return -1;
    if (*lo <= it->prev_hi)
        return -1;    /* out of order or overlapping */
    it->prev_hi = *hi;
    return 1;
}

/* Is (p, len) a well-formed set? */
static int seen_set_valid(const char *p, size_t len)
{
    struct seen_iter it;
    uint32_t lo, hi;
    int r;

    seen_iter_init(&it, p, len);
    while ((r = seen_iter_next(&it, &lo, &hi)) == 1)
        ;
    return r == 0;
}

int seen_set_contains(const char *set, uint32_t uid)
{
    struct seen_iter it;
    uint32_t lo, hi;
    int r, found = 0;

    if (!set)
        return 0;
    seen_iter_init(&it, set, strlen(set));
    while ((r = seen_iter_next(&it, &lo, &hi)) == 1) {
        if (uid >= lo && uid <= hi)
            found = 1;
    }
    return r == 0 && found;   /* a malformed set contains nothing */
}

/* Writes ranges in canonical form, merging each with the one before. */
struct seen_emit {
    struct buf out;
    uint32_t lo, hi;
    int pending;
    int nomem;
};

static void seen_emit_flush(struct seen_emit *e)
{
    if (!e->pending)
        return;
    if ((e->out.len && buf_putc(&e->out, ',') < 0) ||
        (e->lo == e->hi ? buf_printf(&e->out, "%u", e->lo)
                        : buf_printf(&e->out, "%u:%u", e->lo, e->hi)) < 0)
        e->nomem = 1;
    e->pending = 0;
}

/* Ranges arrive in ascending order of lo. */
static void seen_emit(struct seen_emit *e, uint32_t lo, uint32_t hi)
{
    if (e->pending && (uint64_t)lo <= (uint64_t)e->hi + 1) {
        if (hi > e->hi)
            e->hi = hi;
        return;
    }
    seen_emit_flush(e);
    e->lo = lo;
    e->hi = hi;
    e->pending = 1;
}

int seen_set_update(struct buf *set, uint32_t uid, int add)
{
    struct seen_emit e = { BUF_INITIALIZER, 0, 0, 0, 0 };
    struct seen_iter it;
    uint32_t lo, hi;
    int r, inserted = 0;

    if (uid == 0) {
        log_error("seen: uid 0 given to seen_set_update");
        return STORE_INTERNAL;
    }
    if (set->len && memchr(set->s, '\0', set->len))
        return STORE_CORRUPT;
    if (!seen_set_valid(set->s, set->len))
        return STORE_CORRUPT;
    seen_iter_init(&it, set->s, set->len);
    while ((r = seen_iter_next(&it, &lo, &hi)) == 1) {
        if (add) {
            if (!inserted && uid < lo) {
                seen_emit(&e, uid, uid);
                inserted = 1;
            }
            seen_emit(&e, lo, hi);
        } else if (uid >= lo && uid <= hi) {
            if (lo < uid)
                seen_emit(&e, lo, uid - 1);
            if (uid < hi)
                seen_emit(&e, uid + 1, hi);
        } else {
            seen_emit(&e, lo, hi);
        }
    }
    if (add && !inserted)
        seen_emit(&e, uid, uid);
    seen_emit_flush(&e);
    if (e.nomem || buf_setmap(set, e.out.s ? e.out.s : "", e.out.len) < 0) {
        buf_free(&e.out);
        return STORE_NOMEM;
    }
    buf_free(&e.out);
    return STORE_OK;
}

/* ---- records ---------------------------------------------------------- */

static int seen_keylen(const char *uniqueid, size_t *len_r)
{
    size_t len = uniqueid ? strnlen(uniqueid, SEEN_UNIQUEID_MAX + 1) : 0;

    if (len == 0 || len > SEEN_UNIQUEID_MAX)
        return STORE_BADNAME;
    *len_r = len;
    return STORE_OK;
}

static int seen_parse_time(const char *p, size_t len, time_t *t_r)
{
    uint64_t v;

    if (store_parse_u64(p, len, (uint64_t)INT64_MAX, &v) < 0 ||
        (uint64_t)(time_t)v != v)
        return -1;
    *t_r = (time_t)v;
    return 0;
}

/* "1 LASTREAD LASTUID LASTCHANGE SEENUIDS" */
static int seen_parse(const char *p, size_t len, struct seen_data *d)
{
    const char *f[4];
    size_t fl[4], pos = 0, i;
    uint64_t uid;
    const char *set = "";
    size_t setlen = 0;

    for (i = 0; i < 4; i++) {
        const char *sp;
        if (pos > len)
            return -1;
        f[i] = p + pos;
        sp = memchr(p + pos, ' ', len - pos);
        fl[i] = sp ? (size_t)(sp - (p + pos)) : len - pos;
        if (fl[i] == 0)
            return -1;
        pos += fl[i] + 1;     /* past the space (or past the end) */
        if (!sp && i < 3)
            return -1;
    }
    if (pos <= len) {         /* a space followed the fourth field */
        set = p + pos;
        setlen = len - pos;
    }
    if (fl[0] != 1 || f[0][0] != '1')
        return -1;
    if (seen_parse_time(f[1], fl[1], &d->lastread) < 0 ||
        store_parse_u64(f[2], fl[2], UINT32_MAX, &uid) < 0 ||
        seen_parse_time(f[3], fl[3], &d->lastchange) < 0)
        return -1;
    d->lastuid = (uint32_t)uid;
    if (!seen_set_valid(set, setlen))
        return -1;
    return buf_setmap(&d->seenuids, set, setlen) < 0 ? -2 : 0;
}

static void seen_data_clear(struct seen_data *d)
{
    d->lastread = 0;
    d->lastuid = 0;
    d->lastchange = 0;
    buf_reset(&d->seenuids);
}

/* ---- open / close ----------------------------------------------------- */

int seen_open(const struct imapconf *conf, const char *userid,
              struct seen_db **s_r)
{
    struct seen_db *s;
    int r;

    *s_r = NULL;
    s = calloc(1, sizeof(*s));
    if (!s)
        return STORE_NOMEM;
    /* the seen state is flag state: with spool_sync_flags off (as
     * mailbox.h's flag changes) its commits are ordered, the last ones
     * may be lost by a power loss, the file is never damaged */
    r = store_user_db_open(conf, userid, SEEN_SUFFIX, "seenstate_db",
                           SEEN_DBFLAGS |
                           (conf && !imapconf_getswitch(conf,
                                                        "spool_sync_flags")
                            ? CYRUSDB_ORDERED : 0),
                           &s->db, &s->fname);
    if (r != STORE_OK) {
        free(s);
        return r;
    }
    *s_r = s;
    return STORE_OK;
}

void seen_close(struct seen_db **sp)
{
    struct seen_db *s = sp ? *sp : NULL;

    if (!s)
        return;
    cyrusdb_close(&s->db);
    free(s->fname);
    buf_free(&s->cache.key);
    buf_free(&s->cache.val);
    free(s);
    *sp = NULL;
}

/* ---- read / write ----------------------------------------------------- */

/* The cached record of key, when the database has not changed since it
 * was read: 1 with *r_r CYRUSDB_OK (*data_r, *datalen_r) or
 * CYRUSDB_NOTFOUND; 0 to fetch it. */
static int seen_cache_get(struct seen_db *s, const char *key, size_t keylen,
                          const char **data_r, size_t *datalen_r, int *r_r)
{
    struct cyrusdb_stamp now;

    if (!s->cache.valid || s->cache.key.len != keylen ||
        memcmp(s->cache.key.s, key, keylen) != 0)
        return 0;
    if (cyrusdb_stamp(s->db, 1, &now) != CYRUSDB_OK ||
        !cyrusdb_stamp_equal(&now, &s->cache.stamp)) {
        s->cache.valid = 0;
        return 0;
    }
    *data_r = s->cache.val.s ? s->cache.val.s : "";
    *datalen_r = s->cache.val.len;
    *r_r = s->cache.found ? CYRUSDB_OK : CYRUSDB_NOTFOUND;
    return 1;
}

/* Keep what a fetch outside a transaction returned (r: its code), when
 * the backend gives stamps. */
static void seen_cache_put(struct seen_db *s, const char *key, size_t keylen,
                           const char *data, size_t datalen, int r)
{
    s->cache.valid = 0;
    if (r != CYRUSDB_OK && r != CYRUSDB_NOTFOUND)
        return;
    if (cyrusdb_stamp(s->db, 0, &s->cache.stamp) != CYRUSDB_OK)
        return;
    buf_reset(&s->cache.key);
    buf_reset(&s->cache.val);
    if (buf_append(&s->cache.key, key, keylen) < 0 ||
        (r == CYRUSDB_OK && buf_append(&s->cache.val, data, datalen) < 0))
        return;
    s->cache.found = r == CYRUSDB_OK;
    s->cache.valid = 1;
}

/* seen_read() inside transaction *tid (NULL: its own); with lock set the
 * record is read under the write lock (cyrusdb_fetchlock). */
static int seen_read_tid(struct seen_db *s, const char *uniqueid,
                         struct seen_data *d, struct cyrusdb_txn **tid,
                         int lock)
{
    const char *data;
    size_t datalen, keylen;
    char safe[80];
    int r;

    seen_data_clear(d);
    if ((r = seen_keylen(uniqueid, &keylen)) != STORE_OK)
        return r;
    if (!tid && seen_cache_get(s, uniqueid, keylen, &data, &datalen, &r)) {
        /* r, data, datalen: as the fetch gave them */
    } else if (lock) {
        s->cache.valid = 0;
        r = cyrusdb_fetchlock(s->db, uniqueid, keylen, &data, &datalen, tid);
    } else {
        r = cyrusdb_fetch(s->db, uniqueid, keylen, &data, &datalen, tid);
        if (!tid)
            seen_cache_put(s, uniqueid, keylen, data, datalen, r);
    }
    if (r == CYRUSDB_NOTFOUND)
        return STORE_OK;
    if (r != CYRUSDB_OK) {
        log_error("seen: fetch failed file=<%s> uniqueid=<%s> error=<%s>",
                  s->fname, log_sanitize(uniqueid, keylen, safe, sizeof(safe)),
                  cyrusdb_strerror(r));
        return store_from_cyrusdb(r);
    }
    r = seen_parse(data, datalen, d);
    if (r < 0) {
        seen_data_clear(d);
        if (r == -2)
            return STORE_NOMEM;
        log_error("seen: damaged record file=<%s> uniqueid=<%s>", s->fname,
                  log_sanitize(uniqueid, keylen, safe, sizeof(safe)));
        return STORE_CORRUPT;
    }
    return STORE_OK;
}

int seen_read(struct seen_db *s, const char *uniqueid, struct seen_data *d)
{
    return seen_read_tid(s, uniqueid, d, NULL, 0);
}

/* seen_write() inside transaction *tid (NULL: its own). */
static int seen_write_tid(struct seen_db *s, const char *uniqueid,
                          const struct seen_data *d, struct cyrusdb_txn **tid)
{
    struct buf val = BUF_INITIALIZER;
    size_t keylen;
    char safe[80];
    int r;

    if ((r = seen_keylen(uniqueid, &keylen)) != STORE_OK)
        return r;
    if (d->lastread < 0 || d->lastchange < 0 ||
        (d->seenuids.len && memchr(d->seenuids.s, '\0', d->seenuids.len)) ||
        !seen_set_valid(d->seenuids.s, d->seenuids.len)) {
        log_error("seen: refusing to write a malformed state file=<%s> "
                  "uniqueid=<%s>", s->fname,
                  log_sanitize(uniqueid, keylen, safe, sizeof(safe)));
        return STORE_INTERNAL;
    }
    if (buf_printf(&val, SEEN_VERSION " %lld %u %lld ",
                   (long long)d->lastread, d->lastuid,
                   (long long)d->lastchange) < 0 ||
        buf_append(&val, d->seenuids.s, d->seenuids.len) < 0) {
        buf_free(&val);
        return STORE_NOMEM;
    }
    s->cache.valid = 0;
    r = cyrusdb_store(s->db, uniqueid, keylen, val.s, val.len, tid);
    buf_free(&val);
    if (r != CYRUSDB_OK) {
        log_error("seen: store failed file=<%s> uniqueid=<%s> error=<%s>",
                  s->fname, log_sanitize(uniqueid, keylen, safe, sizeof(safe)),
                  cyrusdb_strerror(r));
        return store_from_cyrusdb(r);
    }
    return STORE_OK;
}

int seen_write(struct seen_db *s, const char *uniqueid,
               const struct seen_data *d)
{
    return seen_write_tid(s, uniqueid, d, NULL);
}

int seen_update(struct seen_db *s, const char *uniqueid,
                int (*apply)(struct seen_data *d, void *rock), void *rock,
                struct seen_data *result)
{
    struct cyrusdb_txn *tid = NULL;
    struct seen_data d;
    int r, cr;

    memset(&d, 0, sizeof(d));
    r = seen_read_tid(s, uniqueid, &d, &tid, 1);
    if (r == STORE_CORRUPT) {
        seen_data_clear(&d);    /* logged: start afresh */
        r = STORE_OK;
    }
    if (r == STORE_OK) {
        r = apply(&d, rock);
        if (r == SEEN_UPDATE_UNCHANGED) {
            if (tid)
                cyrusdb_abort(s->db, tid);
            seen_data_free(&d);
            return STORE_OK;
        }
    }
    if (r == STORE_OK)
        r = seen_write_tid(s, uniqueid, &d, &tid);
    if (tid) {
        if (r == STORE_OK) {
            cr = cyrusdb_commit(s->db, tid);
            if (cr != CYRUSDB_OK) {
                log_error("seen: commit failed file=<%s> error=<%s>",
                          s->fname, cyrusdb_strerror(cr));
                r = store_from_cyrusdb(cr);
            }
        } else {
            cyrusdb_abort(s->db, tid);
        }
    }
    if (r == STORE_OK && result) {
        seen_data_free(result);
        *result = d;
    } else {
        seen_data_free(&d);
    }
    return r;
}

int seen_delete(struct seen_db *s, const char *uniqueid)
{
    size_t keylen;
    char safe[80];
    int r;

    if ((r = seen_keylen(uniqueid, &keylen)) != STORE_OK)
        return r;
    s->cache.valid = 0;
    r = cyrusdb_delete(s->db, uniqueid, keylen, NULL, 1);
    if (r != CYRUSDB_OK) {
        log_error("seen: delete failed file=<%s> uniqueid=<%s> error=<%s>",
                  s->fname, log_sanitize(uniqueid, keylen, safe, sizeof(safe)),
                  cyrusdb_strerror(r));
        return store_from_cyrusdb(r);
    }
    return STORE_OK;
}

void seen_data_free(struct seen_data *d)
{
    buf_free(&d->seenuids);
    d->lastread = 0;
    d->lastuid = 0;
    d->lastchange = 0;
}

/* ---- users ------------------------------------------------------------ */

int seen_delete_user(const struct imapconf *conf, const char *userid)
{
    return store_user_db_delete(conf, userid, SEEN_SUFFIX);
}

int seen_rename_user(const struct imapconf *conf, const char *olduser,
                     const char *newuser)
{
    return store_user_db_rename(conf, olduser, newuser, SEEN_SUFFIX,
                                "seenstate_db", SEEN_DBFLAGS, NULL, NULL);
}
