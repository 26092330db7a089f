/*
 * quota.c - quota roots and their usage, in CONFIGDIR/quotas.db.
 *
 * ON-DISK FORMAT (cyrusdb backend `quota_db`, opened with CYRUSDB_MBOXSORT
 * since the keys are mailbox names behind a one-byte tag):
 *
 *   "R" ROOT     -> "STORAGE_LIMIT_KB MESSAGE_LIMIT USED_BYTES USED_MESSAGES"
 *   "M" MAILBOX  -> "ROOT USED_BYTES USED_MESSAGES"
 *
 * Numbers are plain decimal (a limit may be "-1", no limit), fields are
 * separated by one space.  An M record is split from the right, so a root
 * name holding a space still parses.  The tag byte comes first, so all R
 * records and all M records each form one run in either key order, and the
 * records of a name and of the names below it ("M" NAME, "M" NAME ".x")
 * form one run too: walks by prefix work in mailbox order.
 *
 * INVARIANT: the usage of a root equals the sum of the M records that name
 * it.  Every change that moves usage (quota_update_mailbox,
 * quota_update_many, quota_remove_mailbox, quota_remove) changes the M
 * records and the R records together in one cyrusdb transaction, so a
 * crash at any point leaves either the old or the new records, never some
 * without the others.  The M
 * record holds the mailbox's contribution as last reported, not a delta:
 * reporting the same values again changes nothing (the transaction is
 * aborted), and after a crash between an index change and its quota
 * update, the next report moves the root by the full difference.  A
 * mailbox whose nearest root changed (a root created below, or removed)
 * moves its contribution from the old root to the new one at its next
 * report.
 *
 * A damaged value never turns into a number: reads give STORE_CORRUPT and
 * a log line.  quota_set() rewrites a damaged R record (usage restarts at
 * zero, logged) and quota_update_mailbox() replaces a damaged M record
 * (its old contribution is unknown, logged), which are the ways out.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/log.h"
#include "lib/procid.h"
#include "lib/strarray.h"
#include "store/mboxname.h"
#include "store/quota.h"
#include "store/store.h"

#define QUOTA_RETRIES 5   /* transactions retried after CYRUSDB_AGAIN */
#define QUOTA_DBFLAGS (CYRUSDB_CREATE | CYRUSDB_MBOXSORT)

struct quota_db {
    struct cyrusdb *db;
    char *fname;
    long warnpct;
    int last_dbr;         /* the last cyrusdb error, to retry on AGAIN */
};

/* ---- encoding --------------------------------------------------------- */

/* A limit: "-1" or a number up to max. */
static int quota_parse_limit(const char *p, size_t len, long long max,
                             long long *v_r)
{
    uint64_t v;

    if (len == 2 && p[0] == '-' && p[1] == '1') {
        *v_r = QUOTA_UNLIMITED;
        return 0;
    }
    if (store_parse_u64(p, len, (uint64_t)max, &v) < 0)
        return -1;
    *v_r = (long long)v;
    return 0;
}

/* Split (p, len) at single spaces into exactly n fields. */
static int quota_split(const char *p, size_t len, size_t n,
                       const char **f, size_t *fl)
{
    size_t i = 0, start = 0, pos;

    for (pos = 0; pos <= len; pos++) {
        if (pos == len || p[pos] == ' ') {
            if (i >= n || pos == start)
                return -1;
            f[i] = p + start;
            fl[i] = pos - start;
            i++;
            start = pos + 1;
        }
    }
    return i == n ? 0 : -1;
}

static int quota_parse_root(const char *p, size_t len, struct quota *qr)
{
    const char *f[4];
    size_t fl[4];
    struct quota v;

    if (quota_split(p, len, 4, f, fl) < 0 ||
        quota_parse_limit(f[0], fl[0], QUOTA_STORAGE_MAX_KB,
                          &v.storage_limit_kb) < 0 ||
        quota_parse_limit(f[1], fl[1], QUOTA_MESSAGE_MAX,
                          &v.message_limit) < 0 ||
        store_parse_u64(f[2], fl[2], UINT64_MAX, &v.used_bytes) < 0 ||
        store_parse_u64(f[3], fl[3], UINT64_MAX, &v.used_messages) < 0)
        return -1;
    *qr = v;
    return 0;
}

static int quota_format_root(struct buf *out, const struct quota *qr)
{
    buf_reset(out);
    return buf_printf(out, "%lld %lld %llu %llu", qr->storage_limit_kb,
                      qr->message_limit,
                      (unsigned long long)qr->used_bytes,
                      (unsigned long long)qr->used_messages);
}

/* "ROOT BYTES MESSAGES", split from the right. */
static int quota_parse_mbox(const char *p, size_t len, struct buf *root,
                            uint64_t *bytes_r, uint64_t *msgs_r)
{
    size_t s2, s1;

    for (s2 = len; s2 > 0 && p[s2 - 1] != ' '; s2--)
        ;
    if (s2 == 0)
        return -1;
    for (s1 = s2 - 1; s1 > 0 && p[s1 - 1] != ' '; s1--)
        ;
    if (s1 < 2)    /* a root of at least one byte, then a space */
        return -1;
    if (memchr(p, '\0', s1 - 1))
        return -1;
    if (store_parse_u64(p + s1, s2 - 1 - s1, UINT64_MAX, bytes_r) < 0 ||
        store_parse_u64(p + s2, len - s2, UINT64_MAX, msgs_r) < 0)
        return -1;
    return buf_setmap(root, p, s1 - 1) < 0 ? -2 : 0;
}

/* ---- helpers ---------------------------------------------------------- */

static void quota_logname(const char *s, size_t len, char *out, size_t outlen)
{
    log_sanitize(s, len, out, outlen);
}

static int quota_dberr(struct quota_db *q, int r, const char *what,
                       const char *key, size_t keylen)
{
    char safe[128];

    q->last_dbr = r;
    quota_logname(key, keylen, safe, sizeof(safe));
    log_error("quota: %s failed file=<%s> key=<%s> error=<%s>", what,
              q->fname, safe, cyrusdb_strerror(r));
    return store_from_cyrusdb(r);
}

static int quota_corrupt(struct quota_db *q, const char *key, size_t keylen)
{
    char safe[128];

    quota_logname(key, keylen, safe, sizeof(safe));
    log_error("quota: damaged record file=<%s> key=<%s>", q->fname, safe);
    return STORE_CORRUPT;
}

/* A mailbox or root name from the caller: 1..MBOXNAME_MAX bytes. */
static int quota_namelen(const char *name, size_t *len_r)
{
    size_t len = name ? strnlen(name, MBOXNAME_MAX + 1) : 0;

    if (len == 0 || len > MBOXNAME_MAX)
        return STORE_BADNAME;
    *len_r = len;
    return STORE_OK;
}

static int quota_key(struct buf *key, char tag, const char *name, size_t len)
{
    buf_reset(key);
    if (buf_putc(key, tag) < 0 || buf_append(key, name, len) < 0)
        return STORE_NOMEM;
    return STORE_OK;
}

static uint64_t quota_add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* used - old + new, clamped at 0 (logged: the invariant was broken). */
static uint64_t quota_move(struct quota_db *q, const char *root, uint64_t used,
                           uint64_t old, uint64_t new_, const char *what)
{
    uint64_t sum = quota_add_sat(used, new_);

    if (sum < old) {
        log_warning("quota: usage below zero clamped file=<%s> root=<%s> "
                    "resource=<%s> used=<%llu> removing=<%llu>",
                    q->fname, root, what, (unsigned long long)used,
                    (unsigned long long)(old - new_));
        return 0;
    }
    return sum - old;
}

/* Read the R record of root (within *tid when tid is not NULL).
 * STORE_OK, STORE_NOTFOUND, STORE_CORRUPT, STORE_IOERROR... */
static int quota_read_root(struct quota_db *q, const char *root, size_t len,
                           struct quota *qr, struct cyrusdb_txn **tid)
{
    struct buf key = BUF_INITIALIZER;
    const char *data;
    size_t datalen;
    int r;

    if ((r = quota_key(&key, 'R', root, len)) != STORE_OK)
        return r;
    r = cyrusdb_fetch(q->db, key.s, key.len, &data, &datalen, tid);
    if (r == CYRUSDB_NOTFOUND)
        r = STORE_NOTFOUND;
    else if (r != CYRUSDB_OK)
        r = quota_dberr(q, r, "fetch", key.s, key.len);
    else if (quota_parse_root(data, datalen, qr) < 0)
        r = quota_corrupt(q, key.s, key.len);
    else
        r = STORE_OK;
    buf_free(&key);
    return r;
}

static int quota_write_root(struct quota_db *q, const char *root, size_t len,
                            const struct quota *qr, struct cyrusdb_txn **tid)
{
    struct buf key = BUF_INITIALIZER, val = BUF_INITIALIZER;
    int r;

    if ((r = quota_key(&key, 'R', root, len)) != STORE_OK)
        goto out;
    if (quota_format_root(&val, qr) < 0) {
        r = STORE_NOMEM;
        goto out;
    }
    r = cyrusdb_store(q->db, key.s, key.len, val.s, val.len, tid);
    r = r == CYRUSDB_OK ? STORE_OK : quota_dberr(q, r, "store", key.s, key.len);
out:
    buf_free(&key);
    buf_free(&val);
    return r;
}

/* The nearest root of mailbox, within *tid when tid is not NULL. */
static int quota_findroot_tid(struct quota_db *q, const char *mailbox,
                              size_t len, struct buf *root,
                              struct cyrusdb_txn **tid)
{
    struct buf key = BUF_INITIALIZER;
    const char *data;
    size_t datalen, floor = 1;
    int r;

    if ((r = quota_key(&key, 'R', mailbox, len)) != STORE_OK)
        return r;
    /* never cut into "DOMAIN!": a root of one domain (or of the default
     * namespace) never governs another's mailboxes */
    {
        const char *rest;
        size_t dlen;

        if (mboxname_domain(buf_cstring(&key) + 1, &dlen, &rest))
            floor = 1 + dlen + 1;
    }
    for (;;) {
        r = cyrusdb_fetch(q->db, key.s, key.len, &data, &datalen, tid);
        if (r == CYRUSDB_OK) {
            r = buf_setmap(root, key.s + 1, key.len - 1) < 0 ? STORE_NOMEM
                                                             : STORE_OK;
            break;
        }
        if (r != CYRUSDB_NOTFOUND) {
            r = quota_dberr(q, r, "fetch", key.s, key.len);
            break;
        }
        /* cut the last component: "Ruser.a.b" -> "Ruser.a" -> "Ruser" */
        while (key.len > floor && key.s[key.len - 1] != '.')
            key.len--;
        if (key.len <= floor) {
            r = STORE_NOTFOUND;
            break;
        }
        key.len--;   /* the '.' */
        if (key.len <= floor) {
            r = STORE_NOTFOUND;
            break;
        }
    }
    buf_free(&key);
    return r;
}

/* End a transaction the way r says; returns the final code. */
static int quota_finish(struct quota_db *q, struct cyrusdb_txn *tid, int r,
                        int changed)
{
    int cr;

    if (!tid)
        return r;
    if (r != STORE_OK || !changed) {
        cyrusdb_abort(q->db, tid);
        return r;
    }
    cr = cyrusdb_commit(q->db, tid);
    if (cr != CYRUSDB_OK)
        return quota_dberr(q, cr, "commit", "", 0);
    return STORE_OK;
}

static int quota_retry(struct quota_db *q, int r, int attempt)
{
    return r == STORE_BUSY && q->last_dbr == CYRUSDB_AGAIN &&
           attempt < QUOTA_RETRIES;
}

/* ---- open / close ----------------------------------------------------- */

int quota_open(const struct imapconf *conf, struct quota_db **q_r)
{
    const char *confdir = imapconf_getstring(conf, "configdirectory");
    const char *backend = imapconf_getstring(conf, "quota_db");
    struct quota_db *q;
    struct buf fname = BUF_INITIALIZER;
    int r;

    *q_r = NULL;
    if (!confdir || !*confdir || !backend) {
        log_error("quota: configdirectory or quota_db not set");
        return STORE_IOERROR;
    }
    q = calloc(1, sizeof(*q));
    if (!q || buf_printf(&fname, "%s/%s", confdir, QUOTA_FNAME) < 0) {
        free(q);
        buf_free(&fname);
        return STORE_NOMEM;
    }
    q->fname = buf_release(&fname);
    q->warnpct = imapconf_getint(conf, "quotawarn");
    r = cyrusdb_open(backend, q->fname, QUOTA_DBFLAGS, &q->db, NULL);
    if (r != CYRUSDB_OK) {
        free(q->fname);
        free(q);
        return store_from_cyrusdb(r) == STORE_NOTFOUND
                   ? STORE_IOERROR : store_from_cyrusdb(r);
    }
    *q_r = q;
    return STORE_OK;
}

void quota_close(struct quota_db **qp)
{
    struct quota_db *q = qp ? *qp : NULL;

    if (!q)
        return;
    cyrusdb_close(&q->db);
    free(q->fname);
    free(q);
    *qp = NULL;
}

/* The process-wide handle of quota_shared(): which process opened it, and
 * for which configuration ("CONFIGDIR\nBACKEND"). */
static struct quota_db *quota_shared_db;
static pid_t quota_shared_pid;
static char *quota_shared_key;

/* Is the open shared handle the one for (configdir, backend)?  Compared
 * in place: quota_shared() runs several times per delivery. */
static int quota_shared_key_is(const char *configdir, const char *backend)
{
    size_t n = strlen(configdir);

    return quota_shared_key && strncmp(quota_shared_key, configdir, n) == 0 &&
           quota_shared_key[n] == '\n' &&
           strcmp(quota_shared_key + n + 1, backend) == 0;
}

int quota_shared(const struct imapconf *conf, struct quota_db **q_r)
{
    struct buf key = BUF_INITIALIZER;
    const char *configdir = imapconf_getstring(conf, "configdirectory"),
               *backend = imapconf_getstring(conf, "quota_db");
    pid_t pid;
    int r;

    *q_r = NULL;
    if (!configdir)
        configdir = "";
    if (!backend)
        backend = "";
    pid = procid_get();
    if (quota_shared_db && quota_shared_pid == pid &&
        quota_shared_key_is(configdir, backend)) {
        *q_r = quota_shared_db;   /* the usual case: nothing to build */
        return STORE_OK;
    }
    if (buf_printf(&key, "%s\n%s", configdir, backend) < 0)
        return STORE_NOMEM;
    if (quota_shared_db && quota_shared_pid == procid_get() &&
        strcmp(quota_shared_key, buf_cstring(&key)) != 0)
        quota_shared_close();   /* another configuration */
    if (!quota_shared_db || quota_shared_pid != procid_get()) {
        /* one inherited over fork() belongs to the parent: leave it */
        quota_shared_db = NULL;
        quota_shared_key = NULL;
        r = quota_open(conf, &quota_shared_db);
        if (r) {
            quota_shared_db = NULL;
            buf_free(&key);
            return r;
        }
        quota_shared_pid = procid_get();
        quota_shared_key = buf_release(&key);
    }
    buf_free(&key);
    *q_r = quota_shared_db;
    return STORE_OK;
}

void quota_shared_close(void)
{
    if (quota_shared_db && quota_shared_pid == procid_get()) {
        quota_close(&quota_shared_db);
        free(quota_shared_key);
    }
    quota_shared_db = NULL;
    quota_shared_key = NULL;
}

/* ---- reads ------------------------------------------------------------ */

int quota_findroot(struct quota_db *q, const char *mailbox, struct buf *root)
{
    size_t len;
    int r;

    if ((r = quota_namelen(mailbox, &len)) != STORE_OK)
        return r;
    return quota_findroot_tid(q, mailbox, len, root, NULL);
}

int quota_get(struct quota_db *q, const char *root, struct quota *quota_r)
{
    size_t len;
    int r;

    if ((r = quota_namelen(root, &len)) != STORE_OK)
        return r;
    return quota_read_root(q, root, len, quota_r, NULL);
}

/* Does used + add pass limit (add > 0 only)?  Sets *warn when the usage
 * after the addition reaches warnpct percent of a positive limit. */
static int quota_over(uint64_t used, uint64_t add, uint64_t limit,
                      long warnpct, int *warn)
{
    uint64_t after = quota_add_sat(used, add);

    if (limit > 0 && warnpct >= 0 &&
        (long double)after * 100.0L >= (long double)limit * (long double)warnpct)
        *warn = 1;
    return add > 0 && after > limit;
}

int quota_check(struct quota_db *q, const char *mailbox, uint64_t bytes,
                uint64_t messages, int *warn_r)
{
    struct buf root = BUF_INITIALIZER;
    struct quota qr;
    int r, warn = 0, over = 0;

    if (warn_r)
        *warn_r = 0;
    r = quota_findroot(q, mailbox, &root);
    if (r == STORE_NOTFOUND) {
        buf_free(&root);
        return STORE_OK;
    }
    if (r == STORE_OK)
        r = quota_read_root(q, root.s, root.len, &qr, NULL);
    if (r == STORE_NOTFOUND)   /* removed between the two reads */
        r = STORE_OK;
    else if (r == STORE_OK) {
        if (qr.storage_limit_kb >= 0 &&
            quota_over(qr.used_bytes, bytes,
                       (uint64_t)qr.storage_limit_kb * 1024, q->warnpct, &warn))
            over = 1;
        if (qr.message_limit >= 0 &&
            quota_over(qr.used_messages, messages,
                       (uint64_t)qr.message_limit, q->warnpct, &warn))
            over = 1;
        if (over) {
            char safe[128];
            log_info("quota: over quota mailbox=<%s> root=<%s>",
                     log_sanitize(mailbox, strlen(mailbox), safe, sizeof(safe)),
                     buf_cstring(&root));
            r = STORE_OVERQUOTA;
        }
        if (warn_r)
            *warn_r = warn;
    }
    buf_free(&root);
    return r;
}

/* ---- writes ----------------------------------------------------------- */

int quota_set(struct quota_db *q, const char *root,
              long long storage_limit_kb, long long message_limit)
{
    struct buf key = BUF_INITIALIZER;
    struct cyrusdb_txn *tid = NULL;
    struct quota qr;
    const char *data;
    size_t datalen, len;
    int r, attempt;

    if (mboxname_check(root, NULL) != STORE_OK)
        return STORE_BADNAME;
    if ((r = quota_namelen(root, &len)) != STORE_OK)
        return r;
    if (storage_limit_kb < QUOTA_UNLIMITED ||
        storage_limit_kb > QUOTA_STORAGE_MAX_KB ||
        message_limit < QUOTA_UNLIMITED || message_limit > QUOTA_MESSAGE_MAX) {
        log_error("quota: limit out of range root=<%s> storage=<%lld> "
                  "messages=<%lld>", root, storage_limit_kb, message_limit);
        return STORE_INTERNAL;
    }
    if ((r = quota_key(&key, 'R', root, len)) != STORE_OK)
        return r;
    for (attempt = 0;; attempt++) {
        tid = NULL;
        q->last_dbr = CYRUSDB_OK;
        memset(&qr, 0, sizeof(qr));
        r = cyrusdb_fetchlock(q->db, key.s, key.len, &data, &datalen, &tid);
        if (r == CYRUSDB_OK) {
            if (quota_parse_root(data, datalen, &qr) < 0) {
                quota_corrupt(q, key.s, key.len);
                log_warning("quota: damaged root rewritten, usage restarts "
                            "at zero root=<%s>", root);
                memset(&qr, 0, sizeof(qr));
            }
            r = STORE_OK;
        } else if (r == CYRUSDB_NOTFOUND) {
            r = STORE_OK;
        } else {
            r = quota_dberr(q, r, "fetchlock", key.s, key.len);
        }
        if (r == STORE_OK) {
            qr.storage_limit_kb = storage_limit_kb;
            qr.message_limit = message_limit;
            r = quota_write_root(q, root, len, &qr, &tid);
        }
        r = quota_finish(q, tid, r, 1);
        if (!quota_retry(q, r, attempt))
            break;
    }
    buf_free(&key);
    if (r == STORE_OK)
        log_info("quota: set root=<%s> storage_kb=<%lld> messages=<%lld>",
                 root, storage_limit_kb, message_limit);
    return r;
}

struct quota_collect {
    const char *root;
    size_t rootlen;
    struct strarray keys;
    int nomem;
};

static int quota_collect_cb(void *rock, const char *key, size_t keylen,
                            const char *data, size_t datalen)
{
    struct quota_collect *c = rock;
    struct buf root = BUF_INITIALIZER, k = BUF_INITIALIZER;
    uint64_t b, m;

    if (quota_parse_mbox(data, datalen, &root, &b, &m) == 0 &&
        root.len == c->rootlen && !memcmp(root.s, c->root, c->rootlen) &&
        !memchr(key, '\0', keylen)) {
        if (buf_setmap(&k, key, keylen) < 0 ||
            strarray_append(&c->keys, buf_cstring(&k)) < 0)
            c->nomem = 1;
    }
    buf_free(&root);
    buf_free(&k);
    return c->nomem;
}

int quota_remove(struct quota_db *q, const char *root)
{
    struct buf key = BUF_INITIALIZER;
    struct cyrusdb_txn *tid;
    const char *data;
    size_t datalen, len, i;
    int r, attempt;

    if ((r = quota_namelen(root, &len)) != STORE_OK)
        return r;
    if ((r = quota_key(&key, 'R', root, len)) != STORE_OK)
        return r;
    for (attempt = 0;; attempt++) {
        struct quota_collect c = { root, len, STRARRAY_INITIALIZER, 0 };

        tid = NULL;
        q->last_dbr = CYRUSDB_OK;
        r = cyrusdb_fetchlock(q->db, key.s, key.len, &data, &datalen, &tid);
        if (r == CYRUSDB_NOTFOUND)
            r = STORE_NOTFOUND;
        else if (r != CYRUSDB_OK)
            r = quota_dberr(q, r, "fetchlock", key.s, key.len);
        else {
            /* the M records of the root itself and of names below it */
            key.s[0] = 'M';
            r = cyrusdb_foreach(q->db, key.s, key.len, NULL, quota_collect_cb,
                                &c, &tid);
            key.s[0] = 'R';
            if (c.nomem)
                r = STORE_NOMEM;
            else if (r != CYRUSDB_OK)
                r = quota_dberr(q, r, "foreach", key.s, key.len);
            for (i = 0; r == STORE_OK && i < c.keys.count; i++) {
                const char *k = strarray_nth(&c.keys, i);
                r = cyrusdb_delete(q->db, k, strlen(k), &tid, 1);
                if (r != CYRUSDB_OK)
                    r = quota_dberr(q, r, "delete", k, strlen(k));
            }
            if (r == STORE_OK) {
                r = cyrusdb_delete(q->db, key.s, key.len, &tid, 0);
                if (r != CYRUSDB_OK)
                    r = quota_dberr(q, r, "delete", key.s, key.len);
            }
        }
        r = quota_finish(q, tid, r, 1);
        strarray_fini(&c.keys);
        if (!quota_retry(q, r, attempt))
            break;
    }
    buf_free(&key);
    if (r == STORE_OK)
        log_info("quota: removed root=<%s>", root);
    return r;
}

/* The body of quota_update_mailbox / quota_remove_mailbox (remove != 0):
 * everything inside *tid; *changed_r = 0 when nothing needs writing. */
static int quota_update_txn(struct quota_db *q, const char *mailbox,
                            size_t len, uint64_t bytes, uint64_t msgs,
                            int remove, struct cyrusdb_txn **tid,
                            int *changed_r)
{
    struct buf mkey = BUF_INITIALIZER, oldroot = BUF_INITIALIZER;
    struct buf newroot = BUF_INITIALIZER, val = BUF_INITIALIZER;
    uint64_t ob = 0, om = 0;
    int have_old = 0, have_new = 0, same_root, r;
    const char *data;
    size_t datalen;
    struct quota qr;

    *changed_r = 0;
    if ((r = quota_key(&mkey, 'M', mailbox, len)) != STORE_OK)
        goto out;
    r = cyrusdb_fetchlock(q->db, mkey.s, mkey.len, &data, &datalen, tid);
    if (r == CYRUSDB_OK) {
        int pr = quota_parse_mbox(data, datalen, &oldroot, &ob, &om);
        if (pr == -2) {
            r = STORE_NOMEM;
            goto out;
        }
        if (pr < 0) {
            quota_corrupt(q, mkey.s, mkey.len);
            log_warning("quota: damaged mailbox record replaced, its old "
                        "usage is unknown mailbox=<%s>", mailbox);
            *changed_r = 1;   /* rewrite it whatever happens */
        } else {
            have_old = 1;
        }
    } else if (r != CYRUSDB_NOTFOUND) {
        r = quota_dberr(q, r, "fetchlock", mkey.s, mkey.len);
        goto out;
    }

    if (!remove) {
        r = quota_findroot_tid(q, mailbox, len, &newroot, tid);
        if (r == STORE_OK)
            have_new = 1;
        else if (r != STORE_NOTFOUND)
            goto out;
    }
    same_root = have_old && have_new && oldroot.len == newroot.len &&
                !memcmp(oldroot.s, newroot.s, oldroot.len);
    if (same_root && ob == bytes && om == msgs && !*changed_r) {
        r = STORE_OK;     /* idempotent: nothing to write */
        goto out;
    }
    if (!have_old && !have_new && !*changed_r) {
        r = STORE_OK;     /* no root, no stale record */
        goto out;
    }
    *changed_r = 1;

    /* take the old contribution away from a root that no longer covers
     * the mailbox */
    if (have_old && !same_root) {
        r = quota_read_root(q, buf_cstring(&oldroot), oldroot.len, &qr, tid);
        if (r == STORE_OK) {
            qr.used_bytes = quota_move(q, buf_cstring(&oldroot),
                                       qr.used_bytes, ob, 0, "storage");
            qr.used_messages = quota_move(q, buf_cstring(&oldroot),
                                          qr.used_messages, om, 0, "messages");
            r = quota_write_root(q, oldroot.s, oldroot.len, &qr, tid);
        } else if (r == STORE_NOTFOUND) {
            r = STORE_OK;   /* the old root is gone: nothing to move */
        }
        if (r != STORE_OK)
            goto out;
    }

    if (have_new) {
        r = quota_read_root(q, buf_cstring(&newroot), newroot.len, &qr, tid);
        if (r != STORE_OK) {
            if (r == STORE_NOTFOUND)   /* findroot just saw it: damage */
                r = STORE_IOERROR;
            goto out;
        }
        qr.used_bytes = quota_move(q, buf_cstring(&newroot), qr.used_bytes,
                                   same_root ? ob : 0, bytes, "storage");
        qr.used_messages = quota_move(q, buf_cstring(&newroot),
                                      qr.used_messages, same_root ? om : 0,
                                      msgs, "messages");
        if ((r = quota_write_root(q, newroot.s, newroot.len, &qr, tid)) !=
            STORE_OK)
            goto out;
        if (buf_append(&val, newroot.s, newroot.len) < 0 ||
            buf_printf(&val, " %llu %llu", (unsigned long long)bytes,
                       (unsigned long long)msgs) < 0) {
            r = STORE_NOMEM;
            goto out;
        }
        r = cyrusdb_store(q->db, mkey.s, mkey.len, val.s, val.len, tid);
        r = r == CYRUSDB_OK ? STORE_OK
                            : quota_dberr(q, r, "store", mkey.s, mkey.len);
    } else {
        r = cyrusdb_delete(q->db, mkey.s, mkey.len, tid, 1);
        r = r == CYRUSDB_OK ? STORE_OK
                            : quota_dberr(q, r, "delete", mkey.s, mkey.len);
    }
out:
    buf_free(&mkey);
    buf_free(&oldroot);
    buf_free(&newroot);
    buf_free(&val);
    return r;
}

static int quota_update(struct quota_db *q, const char *mailbox,
                        uint64_t bytes, uint64_t msgs, int remove)
{
    struct cyrusdb_txn *tid;
    size_t len;
    int r, changed, attempt;

    if ((r = quota_namelen(mailbox, &len)) != STORE_OK)
        return r;
    for (attempt = 0;; attempt++) {
        tid = NULL;
        q->last_dbr = CYRUSDB_OK;
        r = quota_update_txn(q, mailbox, len, bytes, msgs, remove, &tid,
                             &changed);
        r = quota_finish(q, tid, r, changed);
        if (!quota_retry(q, r, attempt))
            return r;
    }
}

int quota_update_many(struct quota_db *q, const char *const *mailboxes,
                      const uint64_t *used_bytes,
                      const uint64_t *used_messages, size_t n)
{
    struct cyrusdb_txn *tid;
    size_t *lens, i;
    int r = STORE_OK, changed, any, attempt;

    if (n == 0)
        return STORE_OK;
    if (!mailboxes || !used_bytes || !used_messages)
        return STORE_INTERNAL;
    lens = calloc(n, sizeof(*lens));
    if (!lens)
        return STORE_NOMEM;
    for (i = 0; i < n && r == STORE_OK; i++)
        r = quota_namelen(mailboxes[i], &lens[i]);
    for (attempt = 0; r == STORE_OK; attempt++) {
        tid = NULL;
        any = 0;
        q->last_dbr = CYRUSDB_OK;
        /* in order: a name given twice ends with its last values, and
         * each update sees the ones before it (same transaction) */
        for (i = 0; i < n && r == STORE_OK; i++) {
            r = quota_update_txn(q, mailboxes[i], lens[i], used_bytes[i],
                                 used_messages[i], 0, &tid, &changed);
            any |= changed;
        }
        r = quota_finish(q, tid, r, any);
        if (!quota_retry(q, r, attempt))
            break;
        r = STORE_OK;
    }
    free(lens);
    return r;
}

int quota_update_mailbox(struct quota_db *q, const char *mailbox,
                         uint64_t used_bytes, uint64_t used_messages)
{
    return quota_update_many(q, &mailbox, &used_bytes, &used_messages, 1);
}

int quota_remove_mailbox(struct quota_db *q, const char *mailbox)
{
    return quota_update(q, mailbox, 0, 0, 1);
}
