/*
 * duplicate.c - the duplicate delivery database, CONFIGDIR/deliver.db.
 *
 * ON-DISK FORMAT (cyrusdb backend `duplicate_db`, plain byte order):
 *
 *   MESSAGE-ID NUL MAILBOX  ->  "TIME UID"
 *                           or  "TIME UID UIDVALIDITY GUID"
 *
 * TIME is decimal seconds since the epoch, UID the decimal uid the message
 * got in MAILBOX (0 when unknown), one space between.  The long form
 * (deliveries, duplicate_mark_copies()) adds the mailbox's uidvalidity and
 * the message's SHA-1 (40 lower-case hex digits): it is written before
 * the message is committed and names the copy, which the reader checks
 * (store/deliver.c).  The Message-ID is
 * 1..DUPLICATE_ID_MAX bytes without NUL, so the first NUL of a key ends
 * it; the mailbox is at least one byte, the whole key at most
 * DUPLICATE_KEY_MAX bytes.
 *
 * CRASH SAFETY: every mark is one cyrusdb write of its own, so a crash
 * leaves a record either written or not; a record lost (a no-sync backend,
 * a crash) can only let a second copy of a message through, never lose
 * one.  For the same reason a damaged record reads as absent (logged), and
 * prune deletes it.
 *
 * NO SYNC: the file is opened with CYRUSDB_NOSYNC whatever the backend.
 * The durability contract (DESIGN.md) lets the duplicate database lose
 * records: a lost record means at worst a second copy.  deliver.c writes
 * its records before it reserves the message, and believes one only after
 * finding the copy it names committed, so a record whose message never
 * got stored suppresses nothing.  A
 * durable commit would instead hold the file's write lock across one or two
 * fdatasync()s per delivery, and every concurrent worker would queue
 * behind it.  A killed worker loses nothing it committed (the page cache
 * keeps it); a crash of the machine may lose the last records or leave
 * the file damaged, which the open below repairs.
 *
 * DAMAGED FILE AT OPEN: when cyrusdb_open() fails with CYRUSDB_IOERROR or
 * CYRUSDB_BADFORMAT (not a missing file, a permission problem or a full
 * disk), the file is set aside as deliver.db.damaged-YYYYMMDDTHHMMSSZ (an
 * error names both files) and a fresh, empty database is created: losing
 * the records only risks second copies, while refusing to open would fail
 * every delivery.  Only the duplicate database does this; every other
 * database keeps failing loudly.  A file must fail twice in a row, with
 * the same inode, before it is set aside (a file another process is still
 * creating may look damaged for a moment).  Several processes may find the
 * same damaged file at once; each takes an exclusive fcntl lock on the
 * damaged file itself (through its own descriptor), and under the lock
 * renames it only if the name still leads to the inode that failed.  The
 * others, getting the lock after the rename, see another inode (or none)
 * and simply open again, so exactly one rename happens and everybody ends
 * up on the same fresh file.  For lmdb the lock file (NAME-lock) is set
 * aside with it, so that processes still holding the old environment keep
 * theirs and the fresh file gets a fresh one.  An lmdb open takes the two
 * files one after the other (lock file, then data file), so an open
 * running across the two renames could pair the old lock file with the
 * fresh data file, and two writers would then share a data file without
 * sharing its writer lock.  So for lmdb every open holds a shared flock()
 * on NAME.gate and the set-aside an exclusive one: the renames happen
 * between opens, never inside one.
 *
 * PRUNE: one read-only walk collects the keys of expired (and damaged)
 * records into a buffer of at most DUPLICATE_PRUNE_MEM bytes; they are
 * then deleted in transactions of at most DUPLICATE_PRUNE_BATCH deletes
 * each, every record re-read under the write lock first so that a record
 * marked again since the walk is kept.  So the write lock is never held
 * for more than one batch, and memory stays bounded however large the
 * database: when the buffer fills, the walk stops, the batch is deleted
 * and a new walk starts (it meets fewer expired records each time).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/buf.h"
#include "lib/fmt.h"
#include "lib/fsutil.h"
#include "lib/log.h"
#include "store/duplicate.h"
#include "store/store.h"

#define DUPLICATE_PRUNE_BATCH 1000
#define DUPLICATE_PRUNE_MEM (4u << 20)
#define DUPLICATE_RETRIES 5
#define DUPLICATE_TIME_MAX ((uint64_t)INT64_MAX)
#define DUPLICATE_OPEN_TRIES 6          /* opens before giving up */
#define DUPLICATE_RETRY_USEC 20000      /* pause before a second look */
#define DUPLICATE_DBFLAGS (CYRUSDB_CREATE | CYRUSDB_NOSYNC)

struct duplicate_db {
    struct cyrusdb *db;
    char *fname;
};

/* ---- encoding --------------------------------------------------------- */

/* id NUL mailbox into key; -1 when the pair cannot be tracked. */
static int duplicate_key(struct buf *key, const char *id, size_t idlen,
                         const char *mailbox)
{
    size_t mlen;

    if (!id || idlen == 0 || idlen > DUPLICATE_ID_MAX ||
        memchr(id, '\0', idlen))
        return -1;
    mlen = mailbox ? strnlen(mailbox, DUPLICATE_KEY_MAX) : 0;
    if (mlen == 0 || idlen + 1 + mlen > DUPLICATE_KEY_MAX)
        return -1;
    buf_reset(key);
    if (buf_append(key, id, idlen) < 0 || buf_putc(key, '\0') < 0 ||
        buf_append(key, mailbox, mlen) < 0)
        return -2;
    return 0;
}

void duplicate_guid_hex(const unsigned char *guid,
                        char out[2 * DUPLICATE_GUID_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    size_t i;

    for (i = 0; i < DUPLICATE_GUID_LEN; i++) {
        out[2 * i] = hex[guid[i] >> 4];
        out[2 * i + 1] = hex[guid[i] & 15];
    }
    out[2 * DUPLICATE_GUID_LEN] = '\0';
}

int duplicate_guid_parse(const char *hex, size_t len, unsigned char *guid)
{
    size_t i;

    if (len != 2 * DUPLICATE_GUID_LEN)
        return -1;
    for (i = 0; i < len; i++) {
        char c = hex[i];
        int x = c >= '0' && c <= '9' ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;

        if (x < 0)
            return -1;
        if (i % 2 == 0)
            guid[i / 2] = (unsigned char)(x << 4);
        else
            guid[i / 2] |= (unsigned char)x;
    }
    return 0;
}

/* "TIME UID", or "TIME UID UIDVALIDITY GUID" (*named_r = 1, *copy_r). */
static int duplicate_parse_copy(const char *p, size_t len, time_t *time_r,
                                uint32_t *uid_r, int *named_r,
                                struct duplicate_copy *copy_r)
{
    const char *end = p + len, *f[4], *fe[4];
    uint64_t t, u, v = 0;
    unsigned char guid[DUPLICATE_GUID_LEN];
    size_t nf = 0;
    const char *q = p;

    /* split at single spaces into at most 4 fields */
    while (nf < 4) {
        const char *sp = memchr(q, ' ', (size_t)(end - q));

        f[nf] = q;
        fe[nf] = sp ? sp : end;
        nf++;
        if (!sp)
            break;
        q = sp + 1;
    }
    if ((nf != 2 && nf != 4) || fe[nf - 1] != end)
        return -1;
    if (store_parse_u64(f[0], (size_t)(fe[0] - f[0]), DUPLICATE_TIME_MAX,
                        &t) < 0 ||
        store_parse_u64(f[1], (size_t)(fe[1] - f[1]), UINT32_MAX, &u) < 0)
        return -1;
    if ((uint64_t)(time_t)t != t)
        return -1;
    if (nf == 4) {
        if (store_parse_u64(f[2], (size_t)(fe[2] - f[2]), UINT32_MAX,
                            &v) < 0)
            return -1;
        if (duplicate_guid_parse(f[3], (size_t)(fe[3] - f[3]),
                                 copy_r ? copy_r->guid : guid) < 0)
            return -1;
        if (copy_r) {
            copy_r->uid = (uint32_t)u;
            copy_r->uidvalidity = (uint32_t)v;
        }
    }
    *time_r = (time_t)t;
    *uid_r = (uint32_t)u;
    if (named_r)
        *named_r = nf == 4;
    return 0;
}

static int duplicate_parse(const char *p, size_t len, time_t *time_r,
                           uint32_t *uid_r)
{
    return duplicate_parse_copy(p, len, time_r, uid_r, NULL, NULL);
}

/* The value of a record naming its copy into val (at least 96 bytes). */
static int duplicate_format_copy(char *val, size_t size, time_t when,
                                 const struct duplicate_copy *c)
{
    char hex[2 * DUPLICATE_GUID_LEN + 1];
    int n;

    duplicate_guid_hex(c->guid, hex);
    n = fmt_snprintf(val, size, "%lld %u %u %s", (long long)when, c->uid,
                     c->uidvalidity, hex);
    return n < 0 || (size_t)n >= size ? -1 : n;
}

/* A key for a log line: the Message-ID part, sanitized. */
static const char *duplicate_logkey(const char *key, size_t keylen,
                                    char *out, size_t outlen)
{
    const char *nul = memchr(key, '\0', keylen);

    return log_sanitize(key, nul ? (size_t)(nul - key) : keylen, out, outlen);
}

/* ---- open / close ----------------------------------------------------- */

/* Can a damaged file explain this cyrusdb_open() failure? */
static int duplicate_damage_code(int r)
{
    return r == CYRUSDB_IOERROR || r == CYRUSDB_BADFORMAT;
}

/* NAME.damaged-YYYYMMDDTHHMMSSZ, or with -2, -3 ... when taken. */
static int duplicate_aside_name(const char *fname, struct buf *aside)
{
    char stamp[32];
    struct stat st;
    struct tm tm;
    time_t now = time(NULL);
    int n;

    if (!gmtime_r(&now, &tm) ||
        strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm) == 0)
        return -1;
    for (n = 1; n < 1000; n++) {
        buf_reset(aside);
        if (buf_printf(aside, n == 1 ? "%s.damaged-%s" : "%s.damaged-%s-%d",
                       fname, stamp, n) < 0)
            return -1;
        if (lstat(aside->s, &st) < 0 && errno == ENOENT)
            return 0;
    }
    return -1;
}

/*
 * Set the damaged file aside (see the top): `failed` is what stat(fname)
 * said just before the open that failed twice.  Returns 0 when the caller
 * should open again (set aside now, or already replaced by somebody else),
 * -1 when the file cannot be set aside (logged; the open fails).
 */
static int duplicate_set_aside(const char *fname, const char *backend,
                               const struct stat *failed, const char *why)
{
    struct buf aside = BUF_INITIALIZER, lockname = BUF_INITIALIZER;
    struct buf asidelock = BUF_INITIALIZER;
    struct stat st, cur;
    int fd, ret = -1;

    fd = open(fname, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return 0;           /* gone: somebody set it aside */
        log_error("duplicate: cannot set the damaged database aside "
                  "file=<%s> error=<%s>", fname, strerror(errno));
        return -1;
    }
    if (fs_fstat_id(fd, &st) < 0) {
        log_error("duplicate: fstat failed file=<%s> error=<%s>", fname,
                  strerror(errno));
        goto out;
    }
    if (st.st_dev != failed->st_dev || st.st_ino != failed->st_ino) {
        ret = 0;                /* replaced since it failed: look again */
        goto out;
    }
    /* the damaged file's own lock orders the processes that found it */
    if (fs_lock(fd, F_WRLCK, 1) < 0) {
        log_error("duplicate: lock failed file=<%s> error=<%s>", fname,
                  strerror(errno));
        goto out;
    }
    if (fs_stat_id(fname, &cur) < 0 || cur.st_dev != st.st_dev ||
        cur.st_ino != st.st_ino) {
        ret = 0;                /* another process set it aside first */
        goto out;
    }
    if (duplicate_aside_name(fname, &aside) < 0) {
        log_error("duplicate: no name to set the damaged database aside "
                  "file=<%s>", fname);
        goto out;
    }
    if (rename(fname, aside.s) < 0) {
        log_error("duplicate: cannot set the damaged database aside "
                  "file=<%s> aside=<%s> error=<%s>", fname, aside.s,
                  strerror(errno));
        goto out;
    }
    if (!strcmp(backend, "lmdb") &&
        buf_printf(&lockname, "%s-lock", fname) == 0 &&
        buf_printf(&asidelock, "%s-lock", aside.s) == 0 &&
        rename(lockname.s, asidelock.s) < 0 && errno != ENOENT)
        log_warning("duplicate: cannot set the lock file aside file=<%s> "
                    "error=<%s>", lockname.s, strerror(errno));
    log_error("duplicate: damaged database set aside, starting a fresh one "
              "(duplicate records lost: some messages may be delivered "
              "twice) file=<%s> aside=<%s> backend=<%s> error=<%s>",
              fname, aside.s, backend, why && *why ? why : "?");
    ret = 0;
out:
    close(fd);                  /* drops the lock */
    buf_free(&aside);
    buf_free(&lockname);
    buf_free(&asidelock);
    return ret;
}

/* flock() NAME.gate (created if missing): shared around an open,
 * exclusive around a set-aside.  The descriptor (close it to unlock), or
 * -1 (logged). */
static int duplicate_gate(const char *fname, int exclusive)
{
    struct buf gate = BUF_INITIALIZER;
    int fd = -1;

    if (buf_printf(&gate, "%s.gate", fname) < 0)
        return -1;
    fd = open(gate.s, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        log_error("duplicate: cannot open the gate file=<%s> error=<%s>",
                  gate.s, strerror(errno));
    while (fd >= 0 && flock(fd, exclusive ? LOCK_EX : LOCK_SH) < 0) {
        if (errno == EINTR)
            continue;
        log_error("duplicate: cannot lock the gate file=<%s> error=<%s>",
                  gate.s, strerror(errno));
        close(fd);
        fd = -1;
    }
    buf_free(&gate);
    return fd;
}

/*
 * cyrusdb_open() of deliver.db, setting a damaged file aside (see the top).
 * A file counts as damaged when two opens in a row fail on the same inode.
 */
static int duplicate_open_db(const char *fname, const char *backend,
                             struct cyrusdb **db_r)
{
    struct stat st, prev;
    int have_prev = 0, tries, r = CYRUSDB_IOERROR, gfd = -1, aside;
    int gated = strcmp(backend, "lmdb") == 0;
    const char *err = NULL;

    for (tries = 0; tries < DUPLICATE_OPEN_TRIES; tries++) {
        int have = fs_stat_id(fname, &st) == 0;

        if (gated && (gfd = duplicate_gate(fname, 0)) < 0)
            return CYRUSDB_IOERROR;
        r = cyrusdb_open(backend, fname, DUPLICATE_DBFLAGS, db_r, &err);
        if (gfd >= 0)
            close(gfd);
        gfd = -1;
        if (r == CYRUSDB_OK || !duplicate_damage_code(r))
            return r;
        if (!have) {
            have_prev = 0;      /* created meanwhile: look again */
            usleep(DUPLICATE_RETRY_USEC);
            continue;
        }
        if (!have_prev || prev.st_dev != st.st_dev ||
            prev.st_ino != st.st_ino) {
            prev = st;          /* first failure of this file */
            have_prev = 1;
            usleep(DUPLICATE_RETRY_USEC);
            continue;
        }
        if (gated && (gfd = duplicate_gate(fname, 1)) < 0)
            return r;
        aside = duplicate_set_aside(fname, backend, &st, err);
        if (gfd >= 0)
            close(gfd);
        gfd = -1;
        if (aside < 0)
            return r;
        have_prev = 0;
    }
    return r;
}

int duplicate_open(const struct imapconf *conf, struct duplicate_db **d_r)
{
    const char *confdir = imapconf_getstring(conf, "configdirectory");
    const char *backend = imapconf_getstring(conf, "duplicate_db");
    struct duplicate_db *d;
    struct buf fname = BUF_INITIALIZER;
    int r;

    *d_r = NULL;
    if (!confdir || !*confdir || !backend) {
        log_error("duplicate: configdirectory or duplicate_db not set");
        return STORE_IOERROR;
    }
    d = calloc(1, sizeof(*d));
    if (!d || buf_printf(&fname, "%s/%s", confdir, DUPLICATE_FNAME) < 0) {
        free(d);
        buf_free(&fname);
        return STORE_NOMEM;
    }
    d->fname = buf_release(&fname);
    r = duplicate_open_db(d->fname, backend, &d->db);
    if (r != CYRUSDB_OK) {
        free(d->fname);
        free(d);
        return r == CYRUSDB_NOTFOUND ? STORE_IOERROR : store_from_cyrusdb(r);
    }
    *d_r = d;
    return STORE_OK;
}

void duplicate_close(struct duplicate_db **dp)
{
    struct duplicate_db *d = dp ? *dp : NULL;

    if (!d)
        return;
    cyrusdb_close(&d->db);
    free(d->fname);
    free(d);
    *dp = NULL;
}

/* ---- check / mark ----------------------------------------------------- */

int duplicate_check(struct duplicate_db *d, const char *id, size_t idlen,
                    const char *mailbox, time_t *time_r, uint32_t *uid_r)
{
    struct duplicate_copy c;
    int named, r;

    r = duplicate_check_copy(d, id, idlen, mailbox, time_r, &named, &c);
    if (r == STORE_OK && uid_r)
        *uid_r = c.uid;
    return r;
}

int duplicate_check_copy(struct duplicate_db *d, const char *id,
                         size_t idlen, const char *mailbox, time_t *time_r,
                         int *named_r, struct duplicate_copy *copy_r)
{
    struct buf key = BUF_INITIALIZER;
    const char *data;
    size_t datalen;
    time_t t;
    uint32_t uid;
    char safe[128];
    int r, named = 0;

    *named_r = 0;
    r = duplicate_key(&key, id, idlen, mailbox);
    if (r < 0) {
        buf_free(&key);
        return r == -2 ? STORE_NOMEM : STORE_NOTFOUND;
    }
    r = cyrusdb_fetch(d->db, key.s, key.len, &data, &datalen, NULL);
    if (r == CYRUSDB_NOTFOUND) {
        r = STORE_NOTFOUND;
    } else if (r != CYRUSDB_OK) {
        log_error("duplicate: fetch failed file=<%s> id=<%s> error=<%s>",
                  d->fname, duplicate_logkey(key.s, key.len, safe,
                                             sizeof(safe)),
                  cyrusdb_strerror(r));
        r = store_from_cyrusdb(r);
    } else if (duplicate_parse_copy(data, datalen, &t, &uid, &named,
                                    copy_r) < 0) {
        log_error("duplicate: damaged record read as absent file=<%s> "
                  "id=<%s>", d->fname,
                  duplicate_logkey(key.s, key.len, safe, sizeof(safe)));
        r = STORE_NOTFOUND;
    } else {
        if (time_r)
            *time_r = t;
        if (!named)
            memset(copy_r, 0, sizeof(*copy_r));
        copy_r->uid = uid;
        *named_r = named;
        r = STORE_OK;
    }
    buf_free(&key);
    return r;
}

int duplicate_mark(struct duplicate_db *d, const char *id, size_t idlen,
                   const char *mailbox, time_t when, uint32_t uid)
{
    struct buf key = BUF_INITIALIZER;
    char val[48];
    char safe[128];
    int r, n;

    if (when < 0) {
        log_error("duplicate: negative time refused file=<%s>", d->fname);
        return STORE_INTERNAL;
    }
    r = duplicate_key(&key, id, idlen, mailbox);
    if (r < 0) {
        buf_free(&key);
        return r == -2 ? STORE_NOMEM : STORE_OK;   /* not trackable */
    }
    n = fmt_snprintf(val, sizeof(val), "%lld %u", (long long)when, uid);
    r = cyrusdb_store(d->db, key.s, key.len, val, (size_t)n, NULL);
    if (r != CYRUSDB_OK) {
        log_error("duplicate: store failed file=<%s> id=<%s> error=<%s>",
                  d->fname, duplicate_logkey(key.s, key.len, safe,
                                             sizeof(safe)),
                  cyrusdb_strerror(r));
        r = store_from_cyrusdb(r);
    }
    buf_free(&key);
    return r;
}

/* duplicate_mark_many() (copies NULL) and duplicate_mark_copies() (uids
 * NULL). */
static int duplicate_mark_n(struct duplicate_db *d, const char *id,
                            size_t idlen, const char *const *mailboxes,
                            const uint32_t *uids,
                            const struct duplicate_copy *copies, size_t n,
                            time_t when)
{
    struct cyrusdb_txn *tid = NULL;
    struct buf key = BUF_INITIALIZER;
    char val[96];
    char safe[128];
    size_t i;
    int r = STORE_OK, k, len;

    if (when < 0) {
        log_error("duplicate: negative time refused file=<%s>", d->fname);
        return STORE_INTERNAL;
    }
    for (i = 0; i < n && r == STORE_OK; i++) {
        k = duplicate_key(&key, id, idlen, mailboxes[i]);
        if (k == -2)
            r = STORE_NOMEM;
        if (k < 0)
            continue;   /* not trackable */
        if (copies)
            len = duplicate_format_copy(val, sizeof(val), when, &copies[i]);
        else
            len = fmt_snprintf(val, sizeof(val), "%lld %u",
                               (long long)when, uids[i]);
        if (len < 0) {
            r = STORE_INTERNAL;
            continue;
        }
        k = cyrusdb_store(d->db, key.s, key.len, val, (size_t)len, &tid);
        if (k != CYRUSDB_OK) {
            log_error("duplicate: store failed file=<%s> id=<%s> error=<%s>",
                      d->fname, duplicate_logkey(key.s, key.len, safe,
                                                 sizeof(safe)),
                      cyrusdb_strerror(k));
            r = store_from_cyrusdb(k);
        }
    }
    if (tid && r == STORE_OK) {
        k = cyrusdb_commit(d->db, tid);
        if (k != CYRUSDB_OK) {
            log_error("duplicate: commit failed file=<%s> error=<%s>",
                      d->fname, cyrusdb_strerror(k));
            r = store_from_cyrusdb(k);
        }
    } else if (tid) {
        cyrusdb_abort(d->db, tid);
    }
    buf_free(&key);
    return r;
}

int duplicate_mark_many(struct duplicate_db *d, const char *id, size_t idlen,
                        const char *const *mailboxes, const uint32_t *uids,
                        size_t n, time_t when)
{
    return duplicate_mark_n(d, id, idlen, mailboxes, uids, NULL, n, when);
}

int duplicate_mark_copies(struct duplicate_db *d, const char *id,
                          size_t idlen, const char *const *mailboxes,
                          const struct duplicate_copy *copies, size_t n,
                          time_t when)
{
    return duplicate_mark_n(d, id, idlen, mailboxes, NULL, copies, n, when);
}

/* ---- prune ------------------------------------------------------------ */

struct duplicate_walk {
    time_t cutoff;
    struct buf keys;          /* collected keys: size_t length, then bytes */
    unsigned long nkeys;
    unsigned long kept;
    unsigned long damaged;
    int full;                 /* the walk stopped on the memory bound */
    int nomem;
};

/* Is the record (data, datalen) to be pruned?  *damaged_r for bad ones. */
static int duplicate_expired(time_t cutoff, const char *key, size_t keylen,
                             const char *data, size_t datalen, int *damaged_r)
{
    const char *nul = memchr(key, '\0', keylen);
    time_t t;
    uint32_t uid;

    *damaged_r = 0;
    if (!nul || nul == key || (size_t)(nul - key) == keylen - 1 ||
        duplicate_parse(data, datalen, &t, &uid) < 0) {
        *damaged_r = 1;
        return 1;
    }
    return t < cutoff;
}

static int duplicate_walk_cb(void *rock, const char *key, size_t keylen,
                             const char *data, size_t datalen)
{
    struct duplicate_walk *w = rock;
    int damaged;

    if (!duplicate_expired(w->cutoff, key, keylen, data, datalen, &damaged)) {
        w->kept++;
        return 0;
    }
    if (buf_append(&w->keys, &keylen, sizeof(keylen)) < 0 ||
        buf_append(&w->keys, key, keylen) < 0) {
        w->nomem = 1;
        return 1;
    }
    w->nkeys++;
    w->damaged += (unsigned long)damaged;
    if (w->keys.len >= DUPLICATE_PRUNE_MEM) {
        w->full = 1;
        return 1;
    }
    return 0;
}

struct duplicate_each {
    duplicate_foreach_cb *cb;
    void *rock;
};

static int duplicate_each_cb(void *rock, const char *key, size_t keylen,
                             const char *data, size_t datalen)
{
    struct duplicate_each *e = rock;
    const char *nul = memchr(key, '\0', keylen);
    struct duplicate_copy c;
    time_t t;
    uint32_t uid;
    int named;

    if (!nul || nul == key || (size_t)(nul - key) == keylen - 1 ||
        duplicate_parse_copy(data, datalen, &t, &uid, &named, &c) < 0)
        return 0;   /* damaged: not handed on (prune removes it) */
    return e->cb(e->rock, key, (size_t)(nul - key), nul + 1,
                 keylen - (size_t)(nul - key) - 1, t, uid,
                 named ? &c : NULL) != 0;
}

int duplicate_foreach(struct duplicate_db *d, duplicate_foreach_cb *cb,
                      void *rock)
{
    struct duplicate_each e = { cb, rock };
    int r = cyrusdb_foreach(d->db, NULL, 0, NULL, duplicate_each_cb, &e,
                            NULL);

    if (r < 0) {
        log_error("duplicate: walk failed file=<%s> error=<%s>", d->fname,
                  cyrusdb_strerror(r));
        return store_from_cyrusdb(r);
    }
    return STORE_OK;
}

/* Delete the collected keys from *pos on, at most one batch, in one
 * transaction.  Adds to *pruned / *kept. */
static int duplicate_delete_batch(struct duplicate_db *d,
                                  const struct duplicate_walk *w, size_t *pos,
                                  unsigned long *pruned, unsigned long *kept)
{
    struct cyrusdb_txn *tid = NULL;
    size_t p = *pos;
    unsigned long n = 0, del = 0, keep = 0;
    int r = CYRUSDB_OK, damaged;

    while (p < w->keys.len && n < DUPLICATE_PRUNE_BATCH) {
        size_t keylen;
        const char *key, *data;
        size_t datalen;

        memcpy(&keylen, w->keys.s + p, sizeof(keylen));
        key = w->keys.s + p + sizeof(keylen);
        p += sizeof(keylen) + keylen;
        n++;
        r = cyrusdb_fetchlock(d->db, key, keylen, &data, &datalen, &tid);
        if (r == CYRUSDB_NOTFOUND) {
            r = CYRUSDB_OK;    /* gone already */
            continue;
        }
        if (r != CYRUSDB_OK)
            break;
        if (!duplicate_expired(w->cutoff, key, keylen, data, datalen,
                               &damaged)) {
            keep++;            /* marked again since the walk */
            continue;
        }
        r = cyrusdb_delete(d->db, key, keylen, &tid, 1);
        if (r != CYRUSDB_OK)
            break;
        del++;
    }
    if (r == CYRUSDB_OK && tid)
        r = cyrusdb_commit(d->db, tid);
    else if (tid)
        cyrusdb_abort(d->db, tid);
    if (r != CYRUSDB_OK)
        return r;
    *pos = p;
    *pruned += del;
    *kept += keep;
    return CYRUSDB_OK;
}

int duplicate_prune(struct duplicate_db *d, int days,
                    unsigned long *pruned_r, unsigned long *kept_r)
{
    return duplicate_prune_at(d, days, time(NULL), pruned_r, kept_r);
}

int duplicate_prune_at(struct duplicate_db *d, int days, time_t now,
                       unsigned long *pruned_r, unsigned long *kept_r)
{
    struct duplicate_walk w;
    unsigned long pruned = 0, kept_late = 0, damaged = 0;
    int r, attempt;

    if (pruned_r)
        *pruned_r = 0;
    if (kept_r)
        *kept_r = 0;
    if (days < 0) {
        log_error("duplicate: prune with negative age days=<%d>", days);
        return STORE_INTERNAL;
    }
    memset(&w, 0, sizeof(w));
    w.cutoff = now - (time_t)days * 86400;
    for (;;) {
        size_t pos = 0;

        buf_reset(&w.keys);
        kept_late = 0;   /* the last (complete) walk counts what is kept */
        w.nkeys = w.kept = 0;
        w.full = w.nomem = 0;
        w.damaged = 0;
        r = cyrusdb_foreach(d->db, NULL, 0, NULL, duplicate_walk_cb, &w, NULL);
        if (w.nomem) {
            buf_free(&w.keys);
            return STORE_NOMEM;
        }
        if (r < 0) {
            log_error("duplicate: prune walk failed file=<%s> error=<%s>",
                      d->fname, cyrusdb_strerror(r));
            buf_free(&w.keys);
            return store_from_cyrusdb(r);
        }
        damaged += w.damaged;
        while (pos < w.keys.len) {
            for (attempt = 0;; attempt++) {
                r = duplicate_delete_batch(d, &w, &pos, &pruned, &kept_late);
                if (r != CYRUSDB_AGAIN || attempt >= DUPLICATE_RETRIES)
                    break;
            }
            if (r != CYRUSDB_OK) {
                log_error("duplicate: prune delete failed file=<%s> "
                          "error=<%s>", d->fname, cyrusdb_strerror(r));
                buf_free(&w.keys);
                return store_from_cyrusdb(r);
            }
        }
        if (!w.full)
            break;
    }
    buf_free(&w.keys);
    if (damaged)
        log_warning("duplicate: damaged records pruned file=<%s> count=<%lu>",
                    d->fname, damaged);
    log_info("duplicate: pruned file=<%s> days=<%d> pruned=<%lu> kept=<%lu>",
             d->fname, days, pruned, w.kept + kept_late);
    if (pruned_r)
        *pruned_r = pruned;
    if (kept_r)
        *kept_r = w.kept + kept_late;
    return STORE_OK;
}
