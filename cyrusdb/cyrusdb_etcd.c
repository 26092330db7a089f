/*
 * cyrusdb_etcd.c - the cyrusdb backend over an etcd cluster (etcd.c).
 *
 * Mapping.  A database named FNAME lives under the etcd key prefix
 * P = etcd_prefix + FNAME (without its leading '/') + "/".  The key P
 * itself is the database's marker (value "cyrusdeliver-etcd 1"): it is
 * put by an open with CYRUSDB_CREATE, and an open without it fails with
 * CYRUSDB_NOTFOUND when the marker is missing, as for a missing file.  A
 * record KEY is the etcd key P + enc(KEY), its value the value.  enc() is
 * the identity in byte order; with CYRUSDB_MBOXSORT it maps '.' to 0x00
 * and every byte below '.' to itself + 1 (a bijection that keeps the
 * order of all other bytes), so that etcd's byte order of the encoded keys
 * is mailbox order and a prefix stays a prefix.  As with the files, the
 * order is not recorded: open a database with the same setting always.
 *
 * Reads without a transaction are linearizable range reads.  A walk reads
 * pages of ETCD_PAGE keys, the first at the newest revision R and the
 * others at R, so it sees one snapshot of the store.
 *
 * Transactions are optimistic.  Writes are buffered in the transaction (a
 * sorted overlay that the transaction's own reads and walks see); every
 * read of etcd inside it records what it saw: the key's mod_revision (0
 * for an absent key) for fetches, and for walks the range with its
 * revision R plus every record handed to the callback.  Commit sends one
 * /v3/kv/txn: compares = mod_revision == seen for each fetched or walked
 * key (create_revision == 0 for a key seen absent), "every key in the
 * walked range has mod_revision <= R" for each walk (new or changed keys);
 * success ops = the buffered puts and deletes.  Either all writes apply or
 * none: a failed compare means another writer changed what this
 * transaction read, and commit returns CYRUSDB_AGAIN (the caller retries
 * the whole transaction, as after a db3 deadlock).  A transaction that
 * wrote nothing commits without a request.  So cyrusdb's "a transaction
 * holds the write lock" becomes "a transaction commits only if nothing it
 * read changed": no reader or writer ever waits, and serializability holds
 * for everything read through the handle.  etcd's --max-txn-ops (default
 * 128) bounds compares and writes of one transaction; past it etcd refuses
 * the commit and the caller gets CYRUSDB_IOERROR (logged as refused).
 *
 * Errors.  An unreachable cluster, no leader or no quorum (timeouts, HTTP
 * 5xx) and answers that are not etcd's JSON give CYRUSDB_IOERROR, never
 * "not found" and never data; etcd.c logs them once per burst.  A commit
 * that fails that way has an unknown outcome (as a local commit whose
 * fsync fails).  A walk whose snapshot revision was compacted meanwhile
 * gives CYRUSDB_AGAIN.
 *
 * No files: detect, recover and checkpoint_dir have nothing to do;
 * checkpoint returns CYRUSDB_OK (every commit is durable on a quorum;
 * compaction and defragmentation are the cluster's own business).
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cyrusdb/cyrusdb.h"
#include "cyrusdb/cyrusdb_backends.h"
#include "cyrusdb/cyrusdb_etcd.h"
#include "cyrusdb/etcd.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"

#define ETCD_PAGE 128
#define ETCD_MARKER "cyrusdeliver-etcd 1"

/* ---- settings ---------------------------------------------------------- */

static struct {
    char *endpoints, *prefix, *cacert, *cert, *key;
    long timeout_ms;
} etcd_conf;

static int etcd_setstr(char **dst, const char *v)
{
    char *n = strdup(v ? v : "");

    if (!n)
        return -1;
    free(*dst);
    *dst = n;
    return 0;
}

int cyrusdb_etcd_configure(const struct imapconf *conf)
{
    if (etcd_setstr(&etcd_conf.endpoints, imapconf_getstring(conf, "etcd_endpoints")) < 0 ||
        etcd_setstr(&etcd_conf.prefix, imapconf_getstring(conf, "etcd_prefix")) < 0 ||
        etcd_setstr(&etcd_conf.cacert, imapconf_getstring(conf, "etcd_cacert")) < 0 ||
        etcd_setstr(&etcd_conf.cert, imapconf_getstring(conf, "etcd_cert")) < 0 ||
        etcd_setstr(&etcd_conf.key, imapconf_getstring(conf, "etcd_key")) < 0) {
        log_error("cyrusdb etcd: out of memory copying the settings");
        return -1;
    }
    etcd_conf.timeout_ms = imapconf_getint(conf, "etcd_timeout");
    return 0;
}

/* ---- handles and transactions ------------------------------------------ */

struct etcd_write {           /* one buffered write of a transaction */
    char *key;                /* the user's key */
    size_t keylen;
    char *value;              /* NULL: deleted */
    size_t valuelen;
};

struct cyrusdb_txn {
    struct etcd_db *db;
    struct etcd_write *w;     /* sorted by the handle's key order */
    size_t nw, aw;
    struct etcd_cmp *cmps;    /* what the transaction's reads saw */
    size_t ncmps, acmps;
    int failed;               /* a read failed: commit refuses */
};

struct etcd_db {
    struct cyrusdb hdr;       /* must be first */
    struct etcd_client *c;
    int flags;
    char *prefix;             /* P, with its trailing '/' */
    size_t prefixlen;
    struct cyrusdb_txn *txn;
    struct buf fetched;       /* value handed out by fetch */
    struct buf ekey;          /* scratch: an encoded etcd key */
};

static int etcd_err(int r)
{
    switch (r) {
    case ETCD_OK:        return CYRUSDB_OK;
    case ETCD_COMPACTED: return CYRUSDB_AGAIN;
    case ETCD_NOMEM:     return CYRUSDB_INTERNAL;
    default:             return CYRUSDB_IOERROR;
    }
}

/* enc(): see the head of the file. */
static unsigned char etcd_enc(int flags, unsigned char c)
{
    if (!(flags & CYRUSDB_MBOXSORT))
        return c;
    if (c == '.')
        return 0;
    return c < '.' ? (unsigned char)(c + 1) : c;
}

static unsigned char etcd_dec(int flags, unsigned char c)
{
    if (!(flags & CYRUSDB_MBOXSORT))
        return c;
    if (c == 0)
        return '.';
    return c <= '.' ? (unsigned char)(c - 1) : c;
}

/* db->ekey = P + enc(key). */
static int etcd_key(struct etcd_db *db, const char *key, size_t keylen)
{
    size_t i;

    if (buf_setmap(&db->ekey, db->prefix, db->prefixlen) < 0 ||
        buf_ensure(&db->ekey, keylen) < 0)
        return CYRUSDB_INTERNAL;
    for (i = 0; i < keylen; i++)
        db->ekey.s[db->prefixlen + i] = (char)etcd_enc(db->flags, (unsigned char)key[i]);
    db->ekey.len = db->prefixlen + keylen;
    return CYRUSDB_OK;
}

/* Decode an etcd key of this database in place; -1 if it is not one. */
static int etcd_unkey(struct etcd_db *db, struct etcd_kv *kv)
{
    size_t i;

    if (kv->keylen < db->prefixlen || memcmp(kv->key, db->prefix, db->prefixlen))
        return -1;
    memmove(kv->key, kv->key + db->prefixlen, kv->keylen - db->prefixlen);
    kv->keylen -= db->prefixlen;
    for (i = 0; i < kv->keylen; i++)
        kv->key[i] = (char)etcd_dec(db->flags, (unsigned char)kv->key[i]);
    return 0;
}

static void etcd_txn_free(struct cyrusdb_txn *t)
{
    size_t i;

    if (!t)
        return;
    for (i = 0; i < t->nw; i++) {
        free(t->w[i].key);
        free(t->w[i].value);
    }
    free(t->w);
    for (i = 0; i < t->ncmps; i++) {
        free((char *)t->cmps[i].key);
        free((char *)t->cmps[i].end);
    }
    free(t->cmps);
    if (t->db && t->db->txn == t)
        t->db->txn = NULL;
    free(t);
}

/* Check tid and begin a transaction when asked.  *txn_r: the transaction
 * the call runs in, or NULL. */
static int etcd_enter(struct etcd_db *db, struct cyrusdb_txn **tid, int write,
                      struct cyrusdb_txn **txn_r)
{
    *txn_r = NULL;
    if (!tid)
        return write && db->txn ? CYRUSDB_LOCKED : CYRUSDB_OK;
    if (*tid) {
        if (*tid != db->txn || !db->txn)
            return CYRUSDB_INTERNAL;
        *txn_r = db->txn;
        return CYRUSDB_OK;
    }
    if (db->txn)
        return CYRUSDB_LOCKED;
    db->txn = calloc(1, sizeof(*db->txn));
    if (!db->txn)
        return CYRUSDB_INTERNAL;
    db->txn->db = db;
    *tid = db->txn;
    *txn_r = db->txn;
    return CYRUSDB_OK;
}

/* Binary search of the overlay: index of key, or where it would go. */
static size_t etcd_wfind(struct cyrusdb_txn *t, const char *key, size_t keylen,
                         int *found_r)
{
    size_t lo = 0, hi = t->nw;

    *found_r = 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = cyrusdb_compare(t->db->flags, t->w[mid].key, t->w[mid].keylen,
                                key, keylen);
        if (c == 0) {
            *found_r = 1;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Buffer a put (value != NULL) or a delete. */
static int etcd_wset(struct cyrusdb_txn *t, const char *key, size_t keylen,
                     const char *value, size_t valuelen)
{
    int found;
    size_t i = etcd_wfind(t, key, keylen, &found);
    char *v = NULL;

    if (value) {
        v = malloc(valuelen + 1);
        if (!v)
            return CYRUSDB_INTERNAL;
        memcpy(v, value, valuelen);
    }
    if (!found) {
        char *k = malloc(keylen);
        if (!k) {
            free(v);
            return CYRUSDB_INTERNAL;
        }
        memcpy(k, key, keylen);
        if (t->nw == t->aw) {
            size_t na = t->aw ? 2 * t->aw : 16;
            struct etcd_write *nw = realloc(t->w, na * sizeof(*nw));
            if (!nw) {
                free(k);
                free(v);
                return CYRUSDB_INTERNAL;
            }
            t->w = nw;
            t->aw = na;
        }
        memmove(&t->w[i + 1], &t->w[i], (t->nw - i) * sizeof(*t->w));
        t->nw++;
        t->w[i].key = k;
        t->w[i].keylen = keylen;
        t->w[i].value = NULL;
    }
    free(t->w[i].value);
    t->w[i].value = v;
    t->w[i].valuelen = valuelen;
    return CYRUSDB_OK;
}

/* Record a compare for commit; single-key compares once per key (the
 * first read is what the transaction's decisions rest on). */
static int etcd_record(struct cyrusdb_txn *t, enum etcd_cmp_kind kind,
                       const char *key, size_t keylen, const char *end,
                       size_t endlen, int64_t rev)
{
    struct etcd_cmp *c;
    size_t i;

    if (kind == ETCD_CMP_MOD_EQUAL) {
        for (i = 0; i < t->ncmps; i++)
            if (t->cmps[i].kind == kind && t->cmps[i].keylen == keylen &&
                !memcmp(t->cmps[i].key, key, keylen)) {
                if (t->cmps[i].rev != rev)
                    t->failed = CYRUSDB_AGAIN;   /* changed under us */
                return CYRUSDB_OK;
            }
    }
    if (t->ncmps == t->acmps) {
        size_t na = t->acmps ? 2 * t->acmps : 16;
        struct etcd_cmp *nc = realloc(t->cmps, na * sizeof(*nc));
        if (!nc)
            return CYRUSDB_INTERNAL;
        t->cmps = nc;
        t->acmps = na;
    }
    c = &t->cmps[t->ncmps];
    memset(c, 0, sizeof(*c));
    c->kind = kind;
    c->rev = rev;
    c->key = malloc(keylen ? keylen : 1);
    c->end = endlen ? malloc(endlen) : NULL;
    if (!c->key || (endlen && !c->end)) {
        free((char *)c->key);
        free((char *)c->end);
        return CYRUSDB_INTERNAL;
    }
    memcpy((char *)c->key, key, keylen);
    c->keylen = keylen;
    if (endlen)
        memcpy((char *)c->end, end, endlen);
    c->endlen = endlen;
    t->ncmps++;
    return CYRUSDB_OK;
}

/* ---- open / close ------------------------------------------------------- */

static int etcd_close(struct cyrusdb *cdb)
{
    struct etcd_db *db = (struct etcd_db *)cdb;

    etcd_txn_free(db->txn);
    etcd_client_free(&db->c);
    buf_free(&db->fetched);
    buf_free(&db->ekey);
    free(db->prefix);
    free(db);
    return CYRUSDB_OK;
}

static int etcd_open(const char *fname, int flags, int variant,
                     struct cyrusdb **db_r, const char **error_r)
{
    struct etcd_settings s = {
        .endpoints = etcd_conf.endpoints ? etcd_conf.endpoints : "http://127.0.0.1:2379",
        .timeout_ms = etcd_conf.timeout_ms > 0 ? etcd_conf.timeout_ms : 5000,
        .cacert = etcd_conf.cacert, .cert = etcd_conf.cert, .key = etcd_conf.key,
    };
    const char *pfx = etcd_conf.prefix ? etcd_conf.prefix : "/cyrusdeliver/";
    struct etcd_db *db;
    struct etcd_range rr;
    struct buf p = BUF_INITIALIZER;
    int r;

    (void)variant;
    *db_r = NULL;
    db = calloc(1, sizeof(*db));
    if (!db) {
        *error_r = "out of memory";
        return CYRUSDB_INTERNAL;
    }
    db->flags = flags;
    while (*fname == '/')
        fname++;
    if (buf_appendcstr(&p, pfx) < 0 || buf_appendcstr(&p, fname) < 0 ||
        buf_putc(&p, '/') < 0) {
        buf_free(&p);
        free(db);
        *error_r = "out of memory";
        return CYRUSDB_INTERNAL;
    }
    db->prefixlen = p.len;
    db->prefix = buf_release(&p);
    if (etcd_client_new(&s, &db->c, error_r) < 0) {
        etcd_close(&db->hdr);
        return CYRUSDB_INTERNAL;
    }
    r = etcd_range(db->c, db->prefix, db->prefixlen, NULL, 0, 0, 0, &rr);
    if (r != ETCD_OK) {
        *error_r = NULL;   /* the code's text; etcd.c logged why */
        etcd_close(&db->hdr);
        return etcd_err(r);
    }
    if (rr.n == 0) {
        struct etcd_cmp absent = { .kind = ETCD_CMP_ABSENT, .key = db->prefix,
                                   .keylen = db->prefixlen };
        struct etcd_op put = { .delete = 0, .key = db->prefix,
                               .keylen = db->prefixlen, .value = ETCD_MARKER,
                               .valuelen = sizeof(ETCD_MARKER) - 1 };
        int ok;

        if (!(flags & CYRUSDB_CREATE) || (flags & CYRUSDB_RDONLY)) {
            etcd_range_free(&rr);
            etcd_close(&db->hdr);
            *error_r = "no such database in etcd";
            return CYRUSDB_NOTFOUND;
        }
        /* another process may create it at the same time: fine */
        r = etcd_txn(db->c, &absent, 1, &put, 1, &ok);
        if (r != ETCD_OK) {
            etcd_range_free(&rr);
            etcd_close(&db->hdr);
            *error_r = NULL;   /* the code's text; etcd.c logged why */
            return etcd_err(r);
        }
    } else if (rr.kvs[0].valuelen != sizeof(ETCD_MARKER) - 1 ||
               memcmp(rr.kvs[0].value, ETCD_MARKER, rr.kvs[0].valuelen)) {
        etcd_range_free(&rr);
        etcd_close(&db->hdr);
        *error_r = "the etcd key of the database holds no cyrusdeliver marker";
        return CYRUSDB_BADFORMAT;
    }
    etcd_range_free(&rr);
    *db_r = &db->hdr;
    return CYRUSDB_OK;
}

/* ---- reads -------------------------------------------------------------- */

/* Read one key from etcd into db->fetched; inside t, record what was seen. */
static int etcd_read(struct etcd_db *db, struct cyrusdb_txn *t,
                     const char *key, size_t keylen)
{
    struct etcd_range rr;
    int r;

    if ((r = etcd_key(db, key, keylen)) != CYRUSDB_OK)
        return r;
    r = etcd_err(etcd_range(db->c, db->ekey.s, db->ekey.len, NULL, 0, 0, 0, &rr));
    if (r != CYRUSDB_OK) {
        if (t)
            t->failed = r;
        return r;
    }
    if (rr.n > 1 || (rr.n == 1 && (rr.kvs[0].keylen != db->ekey.len ||
                                   memcmp(rr.kvs[0].key, db->ekey.s, db->ekey.len)))) {
        log_error("cyrusdb etcd: range of one key answered another key");
        etcd_range_free(&rr);
        if (t)
            t->failed = CYRUSDB_IOERROR;
        return CYRUSDB_IOERROR;
    }
    if (t)
        r = etcd_record(t, ETCD_CMP_MOD_EQUAL, db->ekey.s, db->ekey.len, NULL, 0,
                        rr.n ? rr.kvs[0].mod_revision : 0);
    if (r == CYRUSDB_OK && rr.n &&
        buf_setmap(&db->fetched, rr.kvs[0].value, rr.kvs[0].valuelen) < 0)
        r = CYRUSDB_INTERNAL;
    if (r == CYRUSDB_OK && !rr.n)
        r = CYRUSDB_NOTFOUND;
    etcd_range_free(&rr);
    return r;
}

/* The value of key as the call sees it: the transaction's own write first. */
static int etcd_lookup(struct etcd_db *db, struct cyrusdb_txn *t,
                       const char *key, size_t keylen,
                       const char **data_r, size_t *datalen_r)
{
    int r;

    if (t) {
        int found;
        size_t i = etcd_wfind(t, key, keylen, &found);
        if (found) {
            if (!t->w[i].value)
                return CYRUSDB_NOTFOUND;
            if (data_r) {
                if (buf_setmap(&db->fetched, t->w[i].value, t->w[i].valuelen) < 0)
                    return CYRUSDB_INTERNAL;
            }
            goto give;
        }
    }
    r = etcd_read(db, t, key, keylen);
    if (r != CYRUSDB_OK)
        return r;
give:
    if (data_r) {
        *data_r = db->fetched.s ? db->fetched.s : "";
        *datalen_r = db->fetched.len;
    }
    return CYRUSDB_OK;
}

static int etcd_fetch(struct cyrusdb *cdb, const char *key, size_t keylen,
                      const char **data_r, size_t *datalen_r,
                      struct cyrusdb_txn **tid)
{
    struct etcd_db *db = (struct etcd_db *)cdb;
    struct cyrusdb_txn *t;
    int r = etcd_enter(db, tid, 0, &t);

    if (r != CYRUSDB_OK)
        return r;
    return etcd_lookup(db, t, key, keylen, data_r, datalen_r);
}

/* Decode the keys of a page to the user's keys (the marker becomes the
 * empty key); CYRUSDB_IOERROR for a key outside the database. */
static int etcd_page_decode(struct etcd_db *db, struct etcd_range *page)
{
    size_t i;

    for (i = 0; i < page->n; i++)
        if (etcd_unkey(db, &page->kvs[i]) < 0) {
            log_error("cyrusdb etcd: a walk met a key outside its prefix "
                      "prefix=<%s>", db->prefix);
            return CYRUSDB_IOERROR;
        }
    return CYRUSDB_OK;
}

/* The walk: etcd's pages merged with the transaction's overlay. */
static int etcd_foreach(struct cyrusdb *cdb, const char *prefix, size_t prefixlen,
                        cyrusdb_filter_fn *filter, cyrusdb_cb_fn *cb, void *rock,
                        struct cyrusdb_txn **tid)
{
    struct etcd_db *db = (struct etcd_db *)cdb;
    struct cyrusdb_txn *t;
    struct etcd_range page = { 0 };
    struct buf start = BUF_INITIALIZER, cursor = BUF_INITIALIZER;
    char *end = NULL;
    size_t endlen = 0, idx = 0;
    int64_t rev = 0;
    int have_cursor = 0, r;

    if ((r = etcd_enter(db, tid, 0, &t)) != CYRUSDB_OK)
        return r;
    if ((r = etcd_key(db, prefix, prefixlen)) != CYRUSDB_OK)
        return r;
    if (buf_setmap(&start, db->ekey.s, db->ekey.len) < 0 ||
        !(end = malloc(start.len + 1))) {
        r = CYRUSDB_INTERNAL;
        goto done;
    }
    etcd_prefix_end(start.s, start.len, end, &endlen);
    if (endlen == 0) {
        end[0] = '\0';
        endlen = 1;
    }
    r = etcd_err(etcd_range(db->c, start.s, start.len, end, endlen, ETCD_PAGE, 0, &page));
    if (r != CYRUSDB_OK)
        goto failed;
    rev = page.revision;
    if ((r = etcd_page_decode(db, &page)) != CYRUSDB_OK)
        goto failed;
    if (t && (r = etcd_record(t, ETCD_CMP_RANGE_OLDER, start.s, start.len, end,
                              endlen, rev)) != CYRUSDB_OK)
        goto failed;
    for (;;) {
        struct etcd_kv *kv = NULL;
        struct etcd_write *w = NULL;
        const char *key, *data;
        size_t keylen, datalen;
        int c;

        /* the next etcd record after the cursor */
        while (!kv) {
            if (idx == page.n) {
                struct buf from = BUF_INITIALIZER;
                int more = page.more;
                char *lastkey = page.n ? page.kvs[page.n - 1].key : NULL;
                size_t lastlen = page.n ? page.kvs[page.n - 1].keylen : 0;

                if (!more)
                    break;
                /* the page's keys were decoded in place: encode again */
                if (etcd_key(db, lastkey, lastlen) != CYRUSDB_OK ||
                    buf_setmap(&from, db->ekey.s, db->ekey.len) < 0 ||
                    buf_putc(&from, '\0') < 0) {
                    buf_free(&from);
                    r = CYRUSDB_INTERNAL;
                    goto failed;
                }
                etcd_range_free(&page);
                idx = 0;
                r = etcd_err(etcd_range(db->c, from.s, from.len, end, endlen,
                                        ETCD_PAGE, rev, &page));
                buf_free(&from);
                if (r == CYRUSDB_OK)
                    r = etcd_page_decode(db, &page);
                if (r != CYRUSDB_OK)
                    goto failed;
                continue;
            }
            kv = &page.kvs[idx];
            if (kv->keylen == 0 ||
                (have_cursor && cyrusdb_compare(db->flags, kv->key, kv->keylen,
                                                cursor.s, cursor.len) <= 0)) {
                kv = NULL;   /* the marker, or already walked */
                idx++;
            }
        }
        /* the next overlay record after the cursor, within the prefix */
        if (t && t->nw) {
            int found;
            size_t i = have_cursor ? etcd_wfind(t, cursor.s, cursor.len, &found)
                                   : etcd_wfind(t, prefix, prefixlen, &found);
            if (have_cursor && found)
                i++;
            if (i < t->nw && cyrusdb_has_prefix(t->w[i].key, t->w[i].keylen,
                                                prefix, prefixlen))
                w = &t->w[i];
        }
        if (!kv && !w)
            break;
        c = !kv ? 1 : !w ? -1 : cyrusdb_compare(db->flags, kv->key, kv->keylen,
                                                w->key, w->keylen);
        if (c >= 0) {   /* the overlay decides for its key */
            if (c == 0)
                idx++;
            if (buf_setmap(&cursor, w->key, w->keylen) < 0) {
                r = CYRUSDB_INTERNAL;
                goto failed;
            }
            have_cursor = 1;
            if (!w->value)
                continue;
            key = cursor.s;
            keylen = cursor.len;
            data = w->value;
            datalen = w->valuelen;
        } else {
            idx++;
            if (buf_setmap(&cursor, kv->key, kv->keylen) < 0) {
                r = CYRUSDB_INTERNAL;
                goto failed;
            }
            have_cursor = 1;
            key = cursor.s;
            keylen = cursor.len;
            data = kv->value;
            datalen = kv->valuelen;
            if (t) {
                if ((r = etcd_key(db, kv->key, kv->keylen)) != CYRUSDB_OK ||
                    (r = etcd_record(t, ETCD_CMP_MOD_EQUAL, db->ekey.s,
                                     db->ekey.len, NULL, 0,
                                     kv->mod_revision)) != CYRUSDB_OK)
                    goto failed;
            }
        }
        if (filter && !filter(rock, key, keylen, data, datalen))
            continue;
        r = cb(rock, key, keylen, data, datalen);
        if (r != 0)
            goto done;
    }
    r = CYRUSDB_OK;
    goto done;

failed:
    if (t)
        t->failed = r;
done:
    etcd_range_free(&page);
    buf_free(&start);
    buf_free(&cursor);
    free(end);
    return r;
}

/* ---- writes ------------------------------------------------------------- */

static int etcd_create(struct cyrusdb *cdb, const char *key, size_t keylen,
                       const char *data, size_t datalen, struct cyrusdb_txn **tid)
{
    struct etcd_db *db = (struct etcd_db *)cdb;
    struct cyrusdb_txn *t;
    int r = etcd_enter(db, tid, 1, &t), ok;

    if (r != CYRUSDB_OK)
        return r;
    if (t) {
        r = etcd_lookup(db, t, key, keylen, NULL, NULL);
        if (r == CYRUSDB_OK)
            return CYRUSDB_EXISTS;
        if (r != CYRUSDB_NOTFOUND)
            return r;
        return etcd_wset(t, key, keylen, data, datalen);
    }
    if ((r = etcd_key(db, key, keylen)) != CYRUSDB_OK)
        return r;
    {
        struct etcd_cmp absent = { .kind = ETCD_CMP_ABSENT, .key = db->ekey.s,
                                   .keylen = db->ekey.len };
        struct etcd_op put = { .delete = 0, .key = db->ekey.s, .keylen = db->ekey.len,
                               .value = data, .valuelen = datalen };
        r = etcd_err(etcd_txn(db->c, &absent, 1, &put, 1, &ok));
    }
    if (r != CYRUSDB_OK)
        return r;
    return ok ? CYRUSDB_OK : CYRUSDB_EXISTS;
}

static int etcd_store(struct cyrusdb *cdb, const char *key, size_t keylen,
                      const char *data, size_t datalen, struct cyrusdb_txn **tid)
{
    struct etcd_db *db = (struct etcd_db *)cdb;
    struct cyrusdb_txn *t;
    int r = etcd_enter(db, tid, 1, &t);

    if (r != CYRUSDB_OK)
        return r;
    if (t)
        return etcd_wset(t, key, keylen, data, datalen);
    if ((r = etcd_key(db, key, keylen)) != CYRUSDB_OK)
        return r;
    return etcd_err(etcd_put(db->c, db->ekey.s, db->ekey.len, data, datalen));
}

static int etcd_delete_(struct cyrusdb *cdb, const char *key, size_t keylen,
                        struct cyrusdb_txn **tid, int force)
{
    struct etcd_db *db = (struct etcd_db *)cdb;
    struct cyrusdb_txn *t;
    long deleted = 0;
    int r = etcd_enter(db, tid, 1, &t);

    if (r != CYRUSDB_OK)
        return r;
    if (t) {
        if (!force) {
            r = etcd_lookup(db, t, key, keylen, NULL, NULL);
            if (r != CYRUSDB_OK)
                return r;
        }
        return etcd_wset(t, key, keylen, NULL, 0);
    }
    if ((r = etcd_key(db, key, keylen)) != CYRUSDB_OK)
        return r;
    r = etcd_err(etcd_delete(db->c, db->ekey.s, db->ekey.len, &deleted));
    if (r != CYRUSDB_OK)
        return r;
    return deleted || force ? CYRUSDB_OK : CYRUSDB_NOTFOUND;
}

static int etcd_commit(struct cyrusdb *cdb, struct cyrusdb_txn *tid)
{
    struct etcd_db *db = (struct etcd_db *)cdb;
    struct cyrusdb_txn *t = tid;
    struct etcd_op *ops = NULL;
    struct buf keys = BUF_INITIALIZER;
    size_t *offs = NULL, i;
    int r, ok = 0;

    if (t != db->txn || !t)
        return CYRUSDB_INTERNAL;
    if (t->failed) {
        r = t->failed;
        goto done;
    }
    if (t->nw == 0) {
        r = CYRUSDB_OK;
        goto done;
    }
    ops = calloc(t->nw, sizeof(*ops));
    offs = calloc(t->nw, sizeof(*offs));
    if (!ops || !offs) {
        r = CYRUSDB_INTERNAL;
        goto done;
    }
    /* encode every key into one buffer first (it may move while growing) */
    for (i = 0; i < t->nw; i++) {
        offs[i] = keys.len;
        if ((r = etcd_key(db, t->w[i].key, t->w[i].keylen)) != CYRUSDB_OK)
            goto done;
        if (buf_append(&keys, db->ekey.s, db->ekey.len) < 0) {
            r = CYRUSDB_INTERNAL;
            goto done;
        }
    }
    for (i = 0; i < t->nw; i++) {
        ops[i].delete = t->w[i].value == NULL;
        ops[i].key = keys.s + offs[i];
        ops[i].keylen = (i + 1 < t->nw ? offs[i + 1] : keys.len) - offs[i];
        ops[i].value = t->w[i].value;
        ops[i].valuelen = t->w[i].valuelen;
    }
    r = etcd_err(etcd_txn(db->c, t->cmps, t->ncmps, ops, t->nw, &ok));
    if (r == CYRUSDB_OK && !ok) {
        log_info("cyrusdb etcd: commit conflict prefix=<%s> reads=<%zu> "
                 "writes=<%zu> error=<a key read by the transaction changed; "
                 "nothing written, retry>", db->prefix, t->ncmps, t->nw);
        r = CYRUSDB_AGAIN;
    }
done:
    free(ops);
    free(offs);
    buf_free(&keys);
    etcd_txn_free(t);
    return r;
}

static int etcd_abort(struct cyrusdb *cdb, struct cyrusdb_txn *tid)
{
    struct etcd_db *db = (struct etcd_db *)cdb;

    if (tid != db->txn || !tid)
        return CYRUSDB_INTERNAL;
    etcd_txn_free(tid);
    return CYRUSDB_OK;
}

/* ---- tools -------------------------------------------------------------- */

static void etcd_dump_bytes(FILE *out, const char *s, size_t len)
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

static int etcd_dump_cb(void *rock, const char *key, size_t keylen,
                        const char *data, size_t datalen)
{
    FILE *out = rock;

    etcd_dump_bytes(out, key, keylen);
    putc('\t', out);
    etcd_dump_bytes(out, data, datalen);
    putc('\n', out);
    return 0;
}

static int etcd_dump(struct cyrusdb *cdb, FILE *out, int detail)
{
    struct etcd_db *db = (struct etcd_db *)cdb;
    int r;

    if (detail) {
        fprintf(out, "etcd prefix=");
        etcd_dump_bytes(out, db->prefix, db->prefixlen);
        fprintf(out, " order=%s\n", (db->flags & CYRUSDB_MBOXSORT) ? "mbox" : "raw");
    }
    r = etcd_foreach(cdb, NULL, 0, NULL, etcd_dump_cb, out, NULL);
    if (ferror(out) && r == CYRUSDB_OK)
        r = CYRUSDB_IOERROR;
    return r;
}

/* The cluster keeps its own consistency; this checks it answers, that
 * every key under the prefix decodes and that the walk order holds
 * (cyrusdb_foreach's guard). */
static int etcd_noop_cb(void *rock, const char *key, size_t keylen,
                        const char *data, size_t datalen)
{
    (void)rock; (void)key; (void)keylen; (void)data; (void)datalen;
    return 0;
}

static int etcd_consistent(struct cyrusdb *cdb)
{
    return cyrusdb_foreach(cdb, NULL, 0, NULL, etcd_noop_cb, NULL, NULL);
}

/* Nothing to rewrite here (compaction and defragmentation are the
 * cluster's), and every commit is already durable on a quorum. */
static int etcd_checkpoint(struct cyrusdb *cdb)
{
    struct etcd_db *db = (struct etcd_db *)cdb;

    return db->txn ? CYRUSDB_LOCKED : CYRUSDB_OK;
}

const struct cyrusdb_backend cyrusdb_etcd = {
    .name = "etcd",
    .recover = NULL,
    .checkpoint_dir = NULL,
    .detect = NULL,
    .open = etcd_open,
    .close = etcd_close,
    .fetch = etcd_fetch,
    .fetchlock = etcd_fetch,
    .foreach = etcd_foreach,
    .create = etcd_create,
    .store = etcd_store,
    .delete = etcd_delete_,
    .commit = etcd_commit,
    .abort = etcd_abort,
    .dump = etcd_dump,
    .consistent = etcd_consistent,
    .checkpoint = etcd_checkpoint,
};

/* ---- watch ------------------------------------------------------------- */

struct etcd_watch_rock {
    cyrusdb_etcd_watch_fn *cb;
    int (*stop)(void *rock);
    void *rock;
    size_t prefixlen;
};

static int etcd_watch_stop(void *rock)
{
    struct etcd_watch_rock *wr = rock;

    return wr->stop(wr->rock);
}

static void etcd_watch_event(void *rock, enum etcd_watch_event ev,
                             const char *key, size_t keylen)
{
    struct etcd_watch_rock *wr = rock;

    if (ev == ETCD_WATCH_CREATED) {
        wr->cb(wr->rock, 1, NULL, 0);
        return;
    }
    /* the marker (the prefix itself) is no record */
    if (keylen > wr->prefixlen)
        wr->cb(wr->rock, 0, key + wr->prefixlen, keylen - wr->prefixlen);
}

int cyrusdb_etcd_watch(const char *fname, cyrusdb_etcd_watch_fn *cb,
                       int (*stop)(void *rock), void *rock,
                       const char **why_r)
{
    struct etcd_settings s = {
        .endpoints = etcd_conf.endpoints ? etcd_conf.endpoints : "http://127.0.0.1:2379",
        .timeout_ms = etcd_conf.timeout_ms > 0 ? etcd_conf.timeout_ms : 5000,
        .cacert = etcd_conf.cacert, .cert = etcd_conf.cert, .key = etcd_conf.key,
    };
    const char *pfx = etcd_conf.prefix ? etcd_conf.prefix : "/cyrusdeliver/";
    struct etcd_watch_rock wr = { .cb = cb, .stop = stop, .rock = rock };
    struct etcd_client *c = NULL;
    struct buf p = BUF_INITIALIZER;
    char *end = NULL;
    size_t endlen = 0;
    int r;

    while (*fname == '/')
        fname++;
    if (buf_appendcstr(&p, pfx) < 0 || buf_appendcstr(&p, fname) < 0 ||
        buf_putc(&p, '/') < 0 || !(end = malloc(p.len + 1))) {
        buf_free(&p);
        *why_r = "out of memory";
        return -1;
    }
    etcd_prefix_end(p.s, p.len, end, &endlen);
    wr.prefixlen = p.len;
    if (etcd_client_new(&s, &c, why_r) < 0) {
        free(end);
        buf_free(&p);
        return -1;
    }
    r = etcd_watch(c, p.s, p.len, endlen ? end : "\0", endlen ? endlen : 1,
                   etcd_watch_event, etcd_watch_stop, &wr, why_r);
    etcd_client_free(&c);
    free(end);
    buf_free(&p);
    return r == ETCD_OK ? 0 : -1;
}
