/*
 * mboxlist.c - the mailbox list, CONFIGDIR/mailboxes.db.
 *
 * On-disk format: a cyrusdb database (backend `mboxlist_db`, always opened
 * with CYRUSDB_MBOXSORT so that "a.b" follows "a" and precedes "a-b").
 *   key    the internal mailbox name (mboxname.h), no terminating NUL
 *   value  "TYPE SP PARTITION SP UNIQUEID SP ACL *(LF FIELD)", no
 *          terminating NUL:
 *          TYPE one letter a..z ('e' ordinary mailbox), PARTITION 1..
 *          MBOXLIST_PART_MAX printable bytes without SP, UNIQUEID exactly
 *          24 lower-case hex digits, ACL up to the first LF or the end
 *          (acl.h, may be empty; it holds no control byte, so no LF).
 *          FIELD = NAME SP TEXT, optional, added after the first format:
 *            "specialuse SP \Sent SP \Drafts" the mailbox's RFC 6154
 *            special-use attributes (mboxlist_specialuse_check()).
 *          Fields of unknown name are skipped when read (and not kept by
 *          a rewrite), so a later format can add some.  An entry without
 *          fields is byte for byte the old format: old entries read as
 *          mailboxes without special use, and an older reader still
 *          reads every entry that has none (one that has some looks to
 *          it like a malformed ACL: no rights, fails closed, logged).
 * Every value read is parsed with explicit lengths; a value that does not
 * parse is STORE_CORRUPT and logged with the mailbox name.  A malformed ACL
 * alone is logged but not fatal: it grants no rights (acl_rights), so the
 * mailbox fails closed and an admin can repair it with mboxlist_setacl().
 *
 * Crash safety: the list and the spool agree through ordering (mboxlist.h):
 *   create  under the database write lock (a write transaction begun by
 *           cyrusdb_fetchlock on the name, so concurrent creators in other
 *           processes serialize): spool made and synced by mailbox_create,
 *           then the entry stored and committed.  Crash in between: an
 *           orphan spool, which the next create of the name replaces (an
 *           orphan still holding an index is removed first: no entry
 *           exists, and we hold the lock).
 *   delete  entries deleted and committed, then the spools removed,
 *           deepest first.  Crash in between: orphan directories only.
 *   rename  every spool directory of the tree moved and the directories
 *           synced, then one transaction replaces the old entries by the
 *           new ones.  A failure before the commit returns is undone by
 *           moving the directories back; a crash leaves entries pointing
 *           at missing directories (mboxlist.h says how that is repaired).
 *
 * Moving a tree: each mailbox m of the tree (mailbox order, parents first)
 * has an old directory O(m) and a new one N(m).  rename(2) of a directory
 * carries its subdirectories, i.e. the spools of m's descendants that lie
 * below O(m), along; a table of the moves made so far gives where O(x) of
 * a later mailbox x is now.  When that already is N(x) nothing is done
 * (the usual case: children follow their parent).  Otherwise (hashed
 * spool where the hash letter of a child differs from its parent's, a
 * child on another partition than its parent) x's directory is moved on
 * its own.  When N(x) already exists and is not empty (a directory kept
 * for the children of a mailbox deleted without them, or the orphan of a
 * crashed create), rename(2) cannot replace it: then only the files of
 * O(x) are moved into N(x), and its subdirectories stay to be handled as
 * the mailboxes they belong to.  Empty directories left behind are
 * removed at the end.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/fsutil.h"
#include "lib/log.h"
#include "lib/strarray.h"
#include "store/acl.h"
#include "store/mailbox.h"
#include "store/mboxlist.h"
#include "store/mboxname.h"
#include "store/store.h"

#define MBOXLIST_UNIQUEID_LEN 24
#define MBOXLIST_PART_MAX 256
#define MBOXLIST_DIR_MODE 0755

struct mboxlist {
    const struct imapconf *conf;
    struct cyrusdb *db;
    char *fname;
};

/* ---- values ------------------------------------------------------------ */

static char *mboxlist_strndup(const char *s, size_t len)
{
    char *p = malloc(len + 1);

    if (!p)
        return NULL;
    memcpy(p, s, len);
    p[len] = '\0';
    return p;
}

void mboxlist_entry_free(struct mboxlist_entry **ep)
{
    struct mboxlist_entry *e;

    if (!ep || !*ep)
        return;
    e = *ep;
    free(e->name);
    free(e->partition);
    free(e->uniqueid);
    free(e->acl);
    free(e->specialuse);
    free(e);
    *ep = NULL;
}

static void mboxlist_log_corrupt(const char *key, size_t keylen,
                                 const char *why)
{
    char name[MBOXNAME_MAX + 2];

    log_sanitize(key, keylen, name, sizeof(name));
    log_error("mboxlist: corrupt entry mailbox=<%s> error=<%s>", name, why);
}

/* Parse (key, value) into a new entry.  STORE_OK, STORE_CORRUPT (logged),
 * STORE_NOMEM. */
static int mboxlist_parse(const char *key, size_t keylen,
                          const char *data, size_t datalen,
                          struct mboxlist_entry **entry_r)
{
    struct mboxlist_entry *e;
    const char *why = NULL;
    size_t pos, part_start, part_len, uid_start, i, acl_end;
    size_t use_start = 0, use_len = 0;
    const char *nl;

    *entry_r = NULL;
    if (keylen == 0 || keylen > MBOXNAME_MAX || memchr(key, '\0', keylen)) {
        why = "bad key";
        goto corrupt;
    }
    if (datalen < 2 || data[0] < 'a' || data[0] > 'z' || data[1] != ' ') {
        why = "bad type";
        goto corrupt;
    }
    part_start = pos = 2;
    while (pos < datalen && data[pos] != ' ') {
        unsigned char c = (unsigned char)data[pos];

        if (c < 0x21 || c > 0x7e) {
            why = "bad partition";
            goto corrupt;
        }
        pos++;
    }
    part_len = pos - part_start;
    if (part_len == 0 || part_len > MBOXLIST_PART_MAX || pos >= datalen) {
        why = "bad partition";
        goto corrupt;
    }
    uid_start = ++pos;
    if (datalen - uid_start < MBOXLIST_UNIQUEID_LEN + 1 ||
        data[uid_start + MBOXLIST_UNIQUEID_LEN] != ' ') {
        why = "bad unique id";
        goto corrupt;
    }
    for (i = 0; i < MBOXLIST_UNIQUEID_LEN; i++) {
        char c = data[uid_start + i];

        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
            why = "bad unique id";
            goto corrupt;
        }
    }
    pos = uid_start + MBOXLIST_UNIQUEID_LEN + 1;
    if (memchr(data + pos, '\0', datalen - pos)) {
        why = "NUL in acl";
        goto corrupt;
    }
    nl = memchr(data + pos, '\n', datalen - pos);
    acl_end = nl ? (size_t)(nl - data) : datalen;
    /* the fields after the ACL */
    while (nl) {
        size_t fstart = (size_t)(nl - data) + 1, fend;
        const char *next = memchr(data + fstart, '\n', datalen - fstart);

        fend = next ? (size_t)(next - data) : datalen;
        if (fend - fstart > 11 && memcmp(data + fstart, "specialuse ", 11) == 0) {
            use_start = fstart + 11;
            use_len = fend - use_start;
        }
        nl = next;
    }

    e = calloc(1, sizeof(*e));
    if (!e)
        return STORE_NOMEM;
    e->type = data[0];
    e->name = mboxlist_strndup(key, keylen);
    e->partition = mboxlist_strndup(data + part_start, part_len);
    e->uniqueid = mboxlist_strndup(data + uid_start, MBOXLIST_UNIQUEID_LEN);
    e->acl = mboxlist_strndup(data + pos, acl_end - pos);
    e->specialuse = mboxlist_strndup(data + use_start, use_len);
    if (!e->name || !e->partition || !e->uniqueid || !e->acl ||
        !e->specialuse) {
        mboxlist_entry_free(&e);
        return STORE_NOMEM;
    }
    if (mboxname_check(e->name, &why) != STORE_OK) {
        mboxlist_entry_free(&e);
        goto corrupt;
    }
    if (acl_check(e->acl) < 0)
        log_warning("mboxlist: malformed acl mailbox=<%s> "
                    "(no rights granted until it is replaced)", e->name);
    if (mboxlist_specialuse_check(e->specialuse) < 0) {
        log_warning("mboxlist: malformed specialuse mailbox=<%s> "
                    "(ignored)", e->name);
        e->specialuse[0] = '\0';
    }
    *entry_r = e;
    return STORE_OK;

corrupt:
    mboxlist_log_corrupt(key, keylen, why);
    return STORE_CORRUPT;
}

static int mboxlist_format(struct buf *out, char type, const char *partition,
                           const char *uniqueid, const char *acl,
                           const char *specialuse)
{
    buf_reset(out);
    if (buf_printf(out, "%c %s %s %s", type, partition, uniqueid,
                   acl ? acl : "") < 0)
        return STORE_NOMEM;
    if (specialuse && *specialuse &&
        buf_printf(out, "\nspecialuse %s", specialuse) < 0)
        return STORE_NOMEM;
    return STORE_OK;
}

int mboxlist_specialuse_check(const char *uses)
{
    const char *p = uses;

    if (!uses)
        return -1;
    if (!*p)
        return 0;
    for (;;) {
        size_t n = 0;

        if (*p != '\\')
            return -1;
        p++;
        while (p[n] && p[n] != ' ') {
            unsigned char c = (unsigned char)p[n];

            if (c <= 0x20 || c >= 0x7f || strchr("(){%*\"\\]", c))
                return -1;
            n++;
        }
        if (n == 0 || n > MBOXLIST_SPECIALUSE_MAX)
            return -1;
        p += n;
        if (!*p)
            return 0;
        p++;   /* one SP */
    }
}

/* A partition name that can be stored: printable, no SP, bounded. */
static int mboxlist_partition_ok(const char *partition)
{
    size_t i;

    for (i = 0; partition[i]; i++) {
        unsigned char c = (unsigned char)partition[i];

        if (i >= MBOXLIST_PART_MAX || c < 0x21 || c > 0x7e)
            return 0;
    }
    return i > 0;
}

static int mboxlist_new_uniqueid(char out[MBOXLIST_UNIQUEID_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char rnd[MBOXLIST_UNIQUEID_LEN / 2];
    size_t got = 0, i;

    while (got < sizeof(rnd)) {
        ssize_t n = getrandom(rnd + got, sizeof(rnd) - got, 0);

        if (n < 0) {
            if (errno == EINTR)
                continue;
            log_error("mboxlist: getrandom failed error=<%s>",
                      strerror(errno));
            return STORE_IOERROR;
        }
        got += (size_t)n;
    }
    for (i = 0; i < sizeof(rnd); i++) {
        out[2 * i] = hex[rnd[i] >> 4];
        out[2 * i + 1] = hex[rnd[i] & 15];
    }
    out[MBOXLIST_UNIQUEID_LEN] = '\0';
    return STORE_OK;
}

static int mboxlist_dberr(const char *op, const char *name, int r)
{
    log_error("mboxlist: database %s failed mailbox=<%s> error=<%s>", op,
              name ? name : "", cyrusdb_strerror(r));
    return store_from_cyrusdb(r);
}

/* Begin the write transaction by fetching `name` under the lock.  A
 * backend that reports a deadlock (CYRUSDB_AGAIN: nothing was done yet)
 * gets a few more tries.  Returns a cyrusdb code; *tid is set whenever a
 * transaction was begun. */
#define MBOXLIST_LOCK_TRIES 5

static int mboxlist_fetchlock(struct mboxlist *ml, const char *name,
                              const char **data_r, size_t *datalen_r,
                              struct cyrusdb_txn **tid)
{
    int r = CYRUSDB_AGAIN, tries;

    for (tries = 0; tries < MBOXLIST_LOCK_TRIES; tries++) {
        r = cyrusdb_fetchlock(ml->db, name, strlen(name), data_r, datalen_r,
                              tid);
        if (r != CYRUSDB_AGAIN)
            break;
        if (*tid) {
            cyrusdb_abort(ml->db, *tid);
            *tid = NULL;
        }
        usleep(1000u << tries);
    }
    return r;
}

/* ---- open / close ------------------------------------------------------ */

int mboxlist_open(const struct imapconf *conf, struct mboxlist **ml_r)
{
    struct mboxlist *ml;
    const char *configdir, *backend, *error = NULL;
    struct buf path = BUF_INITIALIZER;
    int r;

    *ml_r = NULL;
    configdir = imapconf_getstring(conf, "configdirectory");
    backend = imapconf_getstring(conf, "mboxlist_db");
    if (!configdir || !configdir[0] || !backend) {
        log_error("mboxlist: configdirectory or mboxlist_db not set");
        return STORE_IOERROR;
    }
    ml = calloc(1, sizeof(*ml));
    if (!ml)
        return STORE_NOMEM;
    if (buf_printf(&path, "%s/%s", configdir, MBOXLIST_FNAME) < 0) {
        free(ml);
        return STORE_NOMEM;
    }
    ml->fname = buf_release(&path);
    ml->conf = conf;
    r = cyrusdb_open(backend, ml->fname, CYRUSDB_CREATE | CYRUSDB_MBOXSORT,
                     &ml->db, &error);
    if (r != CYRUSDB_OK) {
        log_error("mboxlist: open failed file=<%s> backend=<%s> error=<%s>",
                  ml->fname, backend, error ? error : cyrusdb_strerror(r));
        free(ml->fname);
        free(ml);
        return STORE_IOERROR;
    }
    *ml_r = ml;
    return STORE_OK;
}

void mboxlist_close(struct mboxlist **mlp)
{
    struct mboxlist *ml;

    if (!mlp || !*mlp)
        return;
    ml = *mlp;
    if (ml->db)
        cyrusdb_close(&ml->db);
    free(ml->fname);
    free(ml);
    *mlp = NULL;
}

const struct imapconf *mboxlist_conf(const struct mboxlist *ml)
{
    return ml->conf;
}

/* ---- lookup ------------------------------------------------------------ */

int mboxlist_stamp(struct mboxlist *ml, int now, struct cyrusdb_stamp *st)
{
    int r = cyrusdb_stamp(ml->db, now, st);

    if (r == CYRUSDB_OK)
        return STORE_OK;
    return r == CYRUSDB_IOERROR ? STORE_IOERROR : STORE_NOTFOUND;
}

int mboxlist_lookup(struct mboxlist *ml, const char *name,
                    struct mboxlist_entry **entry_r)
{
    const char *data = NULL;
    size_t datalen = 0;
    int r;

    *entry_r = NULL;
    if (mboxname_check(name, NULL) != STORE_OK)
        return STORE_BADNAME;
    r = cyrusdb_fetch(ml->db, name, strlen(name), &data, &datalen, NULL);
    if (r == CYRUSDB_NOTFOUND)
        return STORE_NOTFOUND;
    if (r != CYRUSDB_OK)
        return mboxlist_dberr("fetch", name, r);
    return mboxlist_parse(name, strlen(name), data, datalen, entry_r);
}

/* ---- create ------------------------------------------------------------ */

int mboxlist_create(struct mboxlist *ml, const char *name,
                    const char *partition, const char *acl,
                    struct buf *uniqueid_r)
{
    return mboxlist_create_special(ml, name, partition, acl, NULL,
                                   uniqueid_r);
}

int mboxlist_create_special(struct mboxlist *ml, const char *name,
                            const char *partition, const char *acl,
                            const char *specialuse, struct buf *uniqueid_r)
{
    struct cyrusdb_txn *tid = NULL;
    struct buf value = BUF_INITIALIZER, defacl = BUF_INITIALIZER;
    struct buf userid = BUF_INITIALIZER;
    char uniqueid[MBOXLIST_UNIQUEID_LEN + 1];
    const char *data, *error = NULL;
    size_t datalen;
    int r, spool_made = 0, attempts = 0;

    if (mboxname_check(name, &error) != STORE_OK)
        return STORE_BADNAME;
    if (specialuse && mboxlist_specialuse_check(specialuse) < 0) {
        log_error("mboxlist: create with malformed specialuse "
                  "mailbox=<%s>", name);
        return STORE_INTERNAL;
    }
    if (!partition)
        partition = imapconf_getstring(ml->conf, "defaultpartition");
    if (!partition || !mboxlist_partition_ok(partition) ||
        !imapconf_partition(ml->conf, partition))
        return STORE_BADPARTITION;
    if (!acl) {
        if (mboxname_userid(name, &userid)) {
            size_t k;

            /* the owner's login name: '^' in a name stands for '.' */
            for (k = 0; k < userid.len; k++)
                if (userid.s[k] == '^')
                    userid.s[k] = '.';
            if (acl_parse_rights(ACL_OWNER_DEFAULT, &r) < 0 ||
                acl_set(NULL, buf_cstring(&userid), r, &defacl) < 0) {
                buf_free(&userid);
                buf_free(&defacl);
                return STORE_INTERNAL;
            }
        }
        acl = buf_cstring(&defacl);
    } else if (acl_check(acl) < 0) {
        log_error("mboxlist: create with malformed acl mailbox=<%s>", name);
        return STORE_INTERNAL;
    }
    r = mboxlist_new_uniqueid(uniqueid);
    if (r == STORE_OK)
        r = mboxlist_format(&value, MBOXLIST_TYPE_EMAIL, partition, uniqueid,
                            acl, specialuse);
    buf_free(&userid);
    buf_free(&defacl);
    if (r != STORE_OK)
        goto out;

    /* the write lock: every creator of any name serializes here */
retry:
    r = mboxlist_fetchlock(ml, name, &data, &datalen, &tid);
    if (r == CYRUSDB_OK) {
        r = STORE_EXISTS;
        goto fail;
    }
    if (r != CYRUSDB_NOTFOUND) {
        r = mboxlist_dberr("fetchlock", name, r);
        goto fail;
    }

    r = mailbox_create(ml->conf, name, partition, uniqueid, 0);
    if (r == STORE_EXISTS) {
        /* an index without an entry: the orphan of a create that crashed
         * before its commit.  No entry exists and we hold the lock. */
        log_warning("mboxlist: replacing orphan spool mailbox=<%s> "
                    "partition=<%s>", name, partition);
        r = mailbox_delete_spool(ml->conf, name, partition);
        if (r == STORE_OK)
            r = mailbox_create(ml->conf, name, partition, uniqueid, 0);
        if (r == STORE_EXISTS)
            r = STORE_IOERROR;   /* the orphan would not go */
    }
    if (r != STORE_OK) {
        if (r == STORE_IOERROR || r == STORE_NOSPACE || r == STORE_NOMEM)
            spool_made = 1;   /* a partial spool may be there */
        goto fail;
    }
    spool_made = 1;

    r = cyrusdb_store(ml->db, name, strlen(name), value.s, value.len, &tid);
    if (r == CYRUSDB_AGAIN && ++attempts < MBOXLIST_LOCK_TRIES) {
        /* a deadlock victim (db3: page locks of concurrent creators):
         * undo while still holding the lock, then the whole transaction
         * again */
        if (mailbox_delete_spool(ml->conf, name, partition) == STORE_OK) {
            cyrusdb_abort(ml->db, tid);
            tid = NULL;
            spool_made = 0;
            usleep(1000u << attempts);
            goto retry;
        }
    }
    if (r != CYRUSDB_OK) {
        r = mboxlist_dberr("store", name, r);
        goto fail;
    }
    r = cyrusdb_commit(ml->db, tid);
    tid = NULL;
    if (r != CYRUSDB_OK) {
        r = mboxlist_dberr("commit", name, r);
        goto fail;
    }
    log_info("mboxlist: created mailbox=<%s> partition=<%s> uniqueid=<%s>"
             " specialuse=<%s>", name, partition, uniqueid,
             specialuse ? specialuse : "");
    if (uniqueid_r && buf_setcstr(uniqueid_r, uniqueid) < 0)
        log_warning("mboxlist: out of memory copying uniqueid mailbox=<%s>",
                    name);
    r = STORE_OK;
    goto out;

fail:
    /* the spool goes while we still hold the lock, so no other creator
     * of the name can have made it meanwhile */
    if (spool_made && mailbox_delete_spool(ml->conf, name, partition) !=
        STORE_OK)
        log_warning("mboxlist: could not remove spool of failed create "
                    "mailbox=<%s>", name);
    if (tid)
        cyrusdb_abort(ml->db, tid);
out:
    buf_free(&value);
    return r;
}

/* ---- collecting a tree ------------------------------------------------- */

struct mboxlist_item {
    char *oldname;
    char *newname;
    char *partition;
    char *value;
    size_t valuelen;
    char *olddir;
    char *newdir;
};

struct mboxlist_tree {
    struct mboxlist_item *items;
    size_t count;
    size_t alloc;
    int error;          /* STORE_* met while collecting */
    int keep_corrupt;   /* collect entries whose value does not parse */
};

static void mboxlist_tree_free(struct mboxlist_tree *t)
{
    size_t i;

    for (i = 0; i < t->count; i++) {
        free(t->items[i].oldname);
        free(t->items[i].newname);
        free(t->items[i].partition);
        free(t->items[i].value);
        free(t->items[i].olddir);
        free(t->items[i].newdir);
    }
    free(t->items);
    memset(t, 0, sizeof(*t));
}

/* Add (key, value) to the tree; the value is parsed for the partition.
 * A value that does not parse is STORE_CORRUPT, unless t->keep_corrupt:
 * then the item has no partition (delete removes the entry only). */
static int mboxlist_tree_add(struct mboxlist_tree *t, const char *key,
                             size_t keylen, const char *data, size_t datalen)
{
    struct mboxlist_entry *e = NULL;
    struct mboxlist_item *it;
    int r;

    r = mboxlist_parse(key, keylen, data, datalen, &e);
    if (r == STORE_CORRUPT && t->keep_corrupt && keylen > 0 &&
        keylen <= MBOXNAME_MAX && !memchr(key, '\0', keylen)) {
        e = calloc(1, sizeof(*e));
        if (!e || !(e->name = mboxlist_strndup(key, keylen))) {
            mboxlist_entry_free(&e);
            return STORE_NOMEM;
        }
    } else if (r != STORE_OK) {
        return r;
    }
    if (t->count == t->alloc) {
        size_t n = t->alloc ? 2 * t->alloc : 8;
        struct mboxlist_item *p = realloc(t->items, n * sizeof(*p));

        if (!p) {
            mboxlist_entry_free(&e);
            return STORE_NOMEM;
        }
        t->items = p;
        t->alloc = n;
    }
    it = &t->items[t->count];
    memset(it, 0, sizeof(*it));
    it->oldname = e->name;
    it->partition = e->partition;
    e->name = NULL;
    e->partition = NULL;
    mboxlist_entry_free(&e);
    it->value = mboxlist_strndup(data, datalen);
    it->valuelen = datalen;
    t->count++;
    if (!it->value)
        return STORE_NOMEM;
    return STORE_OK;
}

static int mboxlist_tree_cb(void *rock, const char *key, size_t keylen,
                            const char *data, size_t datalen)
{
    struct mboxlist_tree *t = rock;

    t->error = mboxlist_tree_add(t, key, keylen, data, datalen);
    return t->error != STORE_OK;
}

/* Inside the transaction *tid: the entry of `name` (already fetched into
 * data/datalen) and, when `children`, every entry below it, in mailbox
 * order. */
static int mboxlist_tree_collect(struct mboxlist *ml, const char *name,
                                 const char *data, size_t datalen,
                                 int children, struct cyrusdb_txn **tid,
                                 struct mboxlist_tree *t)
{
    struct buf prefix = BUF_INITIALIZER;
    int r;

    r = mboxlist_tree_add(t, name, strlen(name), data, datalen);
    if (r != STORE_OK || !children)
        return r;
    if (buf_printf(&prefix, "%s.", name) < 0)
        return STORE_NOMEM;
    t->error = STORE_OK;
    r = cyrusdb_foreach(ml->db, prefix.s, prefix.len, NULL, mboxlist_tree_cb,
                        t, tid);
    buf_free(&prefix);
    if (r < 0)
        return mboxlist_dberr("foreach", name, r);
    if (r > 0)
        return t->error;
    return STORE_OK;
}

/* ---- deleted mailboxes (delete_mode: delayed) --------------------------- */

/* Length of the "DOMAIN!" prefix of an internal name (0 without one). */
static size_t mboxlist_domain_len(const char *name)
{
    const char *bang = strchr(name, '!');

    return bang ? (size_t)(bang - name) + 1 : 0;
}

int mboxlist_is_deleted(const char *name)
{
    const char *p = name + mboxlist_domain_len(name);

    return strncmp(p, MBOXLIST_DELETED_PREFIX ".",
                   sizeof(MBOXLIST_DELETED_PREFIX)) == 0;
}

int mboxlist_deleted_name(const char *name, time_t when, struct buf *out)
{
    size_t dl = mboxlist_domain_len(name);

    buf_reset(out);
    buf_append(out, name, dl);
    buf_printf(out, "%s.%s.%08llX", MBOXLIST_DELETED_PREFIX, name + dl,
               (unsigned long long)when);
    return buf_cstring(out) ? STORE_OK : STORE_NOMEM;
}

int mboxlist_deleted_parse(const char *dname, struct buf *orig_r,
                           time_t *when_r)
{
    size_t dl = mboxlist_domain_len(dname), pl;
    const char *rest, *dot, *h;
    unsigned long long t = 0;

    if (!mboxlist_is_deleted(dname))
        return STORE_BADNAME;
    pl = sizeof(MBOXLIST_DELETED_PREFIX);           /* "DELETED." */
    rest = dname + dl + pl;
    dot = strrchr(rest, '.');
    if (!dot || dot == rest || !dot[1] || strlen(dot + 1) > 16)
        return STORE_BADNAME;
    for (h = dot + 1; *h; h++) {
        int v;

        if (*h >= '0' && *h <= '9') v = *h - '0';
        else if (*h >= 'A' && *h <= 'F') v = *h - 'A' + 10;
        else return STORE_BADNAME;
        t = t * 16 + (unsigned)v;
    }
    if (orig_r) {
        buf_reset(orig_r);
        buf_append(orig_r, dname, dl);
        buf_append(orig_r, rest, (size_t)(dot - rest));
        if (!buf_cstring(orig_r))
            return STORE_NOMEM;
    }
    if (when_r)
        *when_r = (time_t)t;
    return STORE_OK;
}

static int mboxlist_count_cb(void *rock, const struct mboxlist_entry *e)
{
    (void)e;
    (*(size_t *)rock)++;
    return 1;   /* one is enough */
}

/* delete_mode: delayed: move name (and, recursive, its children) to
 * DELETED.NAME.HEXTIME.  1 when it was not moved and the caller deletes
 * for good (a mailbox deleted alone that has children: a rename would
 * take them along), else a store code. */
static int mboxlist_delete_delayed(struct mboxlist *ml, const char *name,
                                   int flags)
{
    struct buf pat = BUF_INITIALIZER, dname = BUF_INITIALIZER;
    size_t children = 0;
    time_t now = time(NULL);
    int r, tries;

    if (!(flags & MBOXLIST_RECURSIVE)) {
        buf_printf(&pat, "%s.*", name);
        r = mboxlist_list(ml, buf_cstring(&pat), mboxlist_count_cb,
                          &children);
        buf_free(&pat);
        if (r != STORE_OK && r != 1)
            return r;
        if (children) {
            log_info("mboxlist: mailbox with children deleted at once "
                     "mailbox=<%s> delete_mode=<delayed>", name);
            return 1;
        }
    }
    for (tries = 0; tries < 8; tries++) {
        r = mboxlist_deleted_name(name, now + tries, &dname);
        if (r == STORE_OK)
            r = mboxlist_rename(ml, name, buf_cstring(&dname), NULL);
        if (r != STORE_EXISTS)
            break;
    }
    if (r == STORE_OK)
        log_info("mboxlist: deleted mailbox=<%s> kept=<%s>", name,
                 buf_cstring(&dname));
    buf_free(&dname);
    return r;
}

/* ---- delete ------------------------------------------------------------ */

int mboxlist_delete(struct mboxlist *ml, const char *name, int flags)
{
    struct cyrusdb_txn *tid = NULL;
    struct mboxlist_tree tree;
    const char *data;
    size_t datalen, i;
    int r;

    memset(&tree, 0, sizeof(tree));
    tree.keep_corrupt = 1;   /* a damaged entry can still be deleted */
    if (mboxname_check(name, NULL) != STORE_OK)
        return STORE_BADNAME;
    if (!(flags & MBOXLIST_IMMEDIATE) && !mboxlist_is_deleted(name) &&
        imapconf_getenum(ml->conf, "delete_mode") == MBOXLIST_DELETE_DELAYED) {
        r = mboxlist_delete_delayed(ml, name, flags);
        if (r != 1)
            return r;
    }
    r = mboxlist_fetchlock(ml, name, &data, &datalen, &tid);
    if (r == CYRUSDB_NOTFOUND) {
        r = STORE_NOTFOUND;
        goto fail;
    }
    if (r != CYRUSDB_OK) {
        r = mboxlist_dberr("fetchlock", name, r);
        goto fail;
    }
    r = mboxlist_tree_collect(ml, name, data, datalen,
                              flags & MBOXLIST_RECURSIVE, &tid, &tree);
    if (r != STORE_OK)
        goto fail;
    for (i = 0; i < tree.count; i++) {
        const char *n = tree.items[i].oldname;

        r = cyrusdb_delete(ml->db, n, strlen(n), &tid, 0);
        if (r != CYRUSDB_OK) {
            r = mboxlist_dberr("delete", n, r);
            goto fail;
        }
    }
    r = cyrusdb_commit(ml->db, tid);
    tid = NULL;
    if (r != CYRUSDB_OK) {
        r = mboxlist_dberr("commit", name, r);
        goto fail;
    }

    /* The entries are gone for good; now the spools, deepest first so that
     * a parent's directory is empty of its children's when it goes.  A
     * spool that cannot be removed is an orphan, harmless (a later create
     * replaces it): logged, not an error of the delete. */
    for (i = tree.count; i-- > 0;) {
        const struct mboxlist_item *it = &tree.items[i];

        if (!it->partition)
            log_warning("mboxlist: deleted damaged entry, spool unknown "
                        "mailbox=<%s>", it->oldname);
        else if (mailbox_delete_spool(ml->conf, it->oldname,
                                      it->partition) != STORE_OK)
            log_warning("mboxlist: spool left behind mailbox=<%s> "
                        "partition=<%s>", it->oldname, it->partition);
        log_info("mboxlist: deleted mailbox=<%s>", it->oldname);
    }
    mboxlist_tree_free(&tree);
    return STORE_OK;

fail:
    if (tid)
        cyrusdb_abort(ml->db, tid);
    mboxlist_tree_free(&tree);
    return r;
}

/* ---- rename ------------------------------------------------------------ */

/* One rename(2) made, to be undone on failure. */
struct mboxlist_move {
    char *from;
    char *to;
};

/* A directory move: the spool directory originally at `orig` is now at
 * `to` (with everything below it). */
struct mboxlist_dirmap {
    const char *orig;
    const char *to;
};

struct mboxlist_moves {
    struct mboxlist_move *ops;
    size_t nops, aops;
    struct mboxlist_dirmap *maps;
    size_t nmaps, amaps;
};

static int mboxlist_moves_add(struct mboxlist_moves *mv, const char *from,
                              const char *to)
{
    struct mboxlist_move *op;

    if (mv->nops == mv->aops) {
        size_t n = mv->aops ? 2 * mv->aops : 16;
        struct mboxlist_move *p = realloc(mv->ops, n * sizeof(*p));

        if (!p)
            return -1;
        mv->ops = p;
        mv->aops = n;
    }
    op = &mv->ops[mv->nops];
    op->from = strdup(from);
    op->to = strdup(to);
    if (!op->from || !op->to) {
        free(op->from);
        free(op->to);
        return -1;
    }
    mv->nops++;
    return 0;
}

static int mboxlist_moves_map(struct mboxlist_moves *mv, const char *orig,
                              const char *to)
{
    if (mv->nmaps == mv->amaps) {
        size_t n = mv->amaps ? 2 * mv->amaps : 16;
        struct mboxlist_dirmap *p = realloc(mv->maps, n * sizeof(*p));

        if (!p)
            return -1;
        mv->maps = p;
        mv->amaps = n;
    }
    mv->maps[mv->nmaps].orig = orig;
    mv->maps[mv->nmaps].to = to;
    mv->nmaps++;
    return 0;
}

static void mboxlist_moves_free(struct mboxlist_moves *mv)
{
    size_t i;

    for (i = 0; i < mv->nops; i++) {
        free(mv->ops[i].from);
        free(mv->ops[i].to);
    }
    free(mv->ops);
    free(mv->maps);
    memset(mv, 0, sizeof(*mv));
}

/* Where the directory originally at `path` is now, into out. */
static int mboxlist_moves_where(const struct mboxlist_moves *mv,
                                const char *path, struct buf *out)
{
    size_t i, best = 0, bestlen = 0;
    int found = 0;

    for (i = 0; i < mv->nmaps; i++) {
        size_t l = strlen(mv->maps[i].orig);

        if (strncmp(mv->maps[i].orig, path, l) == 0 &&
            (path[l] == '\0' || path[l] == '/') &&
            (!found || l > bestlen)) {
            found = 1;
            best = i;
            bestlen = l;
        }
    }
    buf_reset(out);
    if (!found)
        return buf_setcstr(out, path);
    if (buf_appendcstr(out, mv->maps[best].to) < 0 ||
        buf_appendcstr(out, path + bestlen) < 0)
        return -1;
    return 0;
}

/* Undo every rename made, newest first. */
static void mboxlist_moves_undo(struct mboxlist_moves *mv)
{
    size_t i;

    for (i = mv->nops; i-- > 0;) {
        if (rename(mv->ops[i].to, mv->ops[i].from) < 0)
            log_error("mboxlist: rename undo failed from=<%s> to=<%s> "
                      "error=<%s>", mv->ops[i].to, mv->ops[i].from,
                      strerror(errno));
        else {
            (void)fs_fsync_parent(mv->ops[i].from);
            (void)fs_fsync_parent(mv->ops[i].to);
        }
    }
}

/* Move the files (not the subdirectories) of directory `from` into `to`,
 * which exists. */
static int mboxlist_move_files(struct mboxlist_moves *mv, const char *from,
                               const char *to)
{
    struct buf src = BUF_INITIALIZER, dst = BUF_INITIALIZER;
    struct dirent *de;
    const char *sp, *dp;
    DIR *d;
    int r = STORE_OK;

    d = opendir(from);
    if (!d) {
        log_error("mboxlist: opendir failed dir=<%s> error=<%s>", from,
                  strerror(errno));
        return store_from_errno(errno) == STORE_NOSPACE ? STORE_NOSPACE
                                                        : STORE_IOERROR;
    }
    while ((errno = 0, de = readdir(d)) != NULL) {
        struct stat st;

        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        buf_reset(&src);
        buf_reset(&dst);
        if (buf_printf(&src, "%s/%s", from, de->d_name) < 0 ||
            buf_printf(&dst, "%s/%s", to, de->d_name) < 0) {
            r = STORE_NOMEM;
            break;
        }
        sp = buf_cstring(&src);
        dp = buf_cstring(&dst);
        if (lstat(sp, &st) < 0) {
            log_error("mboxlist: lstat failed file=<%s> error=<%s>", sp,
                      strerror(errno));
            r = STORE_IOERROR;
            break;
        }
        if (S_ISDIR(st.st_mode))
            continue;
        if (rename(sp, dp) < 0) {
            int e = errno;

            log_error("mboxlist: rename failed from=<%s> to=<%s> error=<%s>",
                      sp, dp, strerror(e));
            r = e == ENOSPC || e == EDQUOT ? STORE_NOSPACE : STORE_IOERROR;
            break;
        }
        if (mboxlist_moves_add(mv, sp, dp) < 0) {
            /* cannot record it: put it back at once */
            if (rename(dp, sp) < 0)
                log_error("mboxlist: rename undo failed from=<%s> "
                          "to=<%s>", dp, sp);
            r = STORE_NOMEM;
            break;
        }
    }
    if (r == STORE_OK && errno != 0) {
        log_error("mboxlist: readdir failed dir=<%s> error=<%s>", from,
                  strerror(errno));
        r = STORE_IOERROR;
    }
    closedir(d);
    buf_free(&src);
    buf_free(&dst);
    return r;
}

/* Move the spool directory of one mailbox of the tree. */
static int mboxlist_move_one(struct mboxlist_moves *mv,
                             const struct mboxlist_item *it)
{
    struct buf cur = BUF_INITIALIZER;
    struct stat st;
    int r = STORE_OK, e;

    const char *curp;

    if (mboxlist_moves_where(mv, it->olddir, &cur) < 0) {
        buf_free(&cur);
        return STORE_NOMEM;
    }
    curp = buf_cstring(&cur);
    if (strcmp(curp, it->newdir) == 0)
        goto out;   /* carried along by an ancestor's move */
    e = stat(curp, &st) < 0 ? errno : 0;
    if (e != 0 || !S_ISDIR(st.st_mode)) {
        int missing = e == ENOENT;

        /* already at the new place: a rename interrupted by a crash after
         * its moves and before its commit, now being repeated */
        if (missing && stat(it->newdir, &st) == 0 &&
            S_ISDIR(st.st_mode)) {
            log_warning("mboxlist: spool already moved mailbox=<%s> "
                        "dir=<%s>", it->oldname, it->newdir);
            goto out;
        }
        log_error("mboxlist: spool directory missing mailbox=<%s> "
                  "dir=<%s>", it->oldname, curp);
        r = STORE_IOERROR;
        goto out;
    }
    if (fs_mkdir_parent(it->newdir, MBOXLIST_DIR_MODE) < 0) {
        e = errno;
        log_error("mboxlist: mkdir failed dir=<%s> error=<%s>", it->newdir,
                  strerror(e));
        r = e == ENOSPC || e == EDQUOT ? STORE_NOSPACE : STORE_IOERROR;
        goto out;
    }
    if (rename(curp, it->newdir) == 0) {
        if (mboxlist_moves_add(mv, curp, it->newdir) < 0 ||
            mboxlist_moves_map(mv, it->olddir, it->newdir) < 0) {
            if (rename(it->newdir, curp) < 0)
                log_error("mboxlist: rename undo failed from=<%s> to=<%s>",
                          it->newdir, curp);
            r = STORE_NOMEM;
        }
        goto out;
    }
    e = errno;
    if (e != ENOTEMPTY && e != EEXIST && e != EINVAL) {
        log_error("mboxlist: rename failed from=<%s> to=<%s> error=<%s>",
                  curp, it->newdir, strerror(e));
        r = e == ENOSPC || e == EDQUOT ? STORE_NOSPACE : STORE_IOERROR;
        goto out;
    }
    /* the target is a directory in use (children's spools, an orphan):
     * move this mailbox's files only */
    if (stat(it->newdir, &st) < 0 || !S_ISDIR(st.st_mode)) {
        log_error("mboxlist: rename target is not a directory dir=<%s>",
                  it->newdir);
        r = STORE_IOERROR;
        goto out;
    }
    r = mboxlist_move_files(mv, curp, it->newdir);
out:
    buf_free(&cur);
    return r;
}

/* Make every move durable: the directories on both sides of each rename. */
static int mboxlist_moves_sync(const struct mboxlist_moves *mv)
{
    size_t i;

    for (i = 0; i < mv->nops; i++) {
        if (fs_fsync_parent(mv->ops[i].from) < 0 ||
            fs_fsync_parent(mv->ops[i].to) < 0) {
            log_error("mboxlist: directory sync failed path=<%s> "
                      "error=<%s>", mv->ops[i].to, strerror(errno));
            return STORE_IOERROR;
        }
    }
    return STORE_OK;
}

/* After a successful rename: remove the directories the moves left empty
 * where the old spool of `it` was: that spool itself when it was not
 * carried to its new place, and its parents up to the partition root (a
 * hashed spool leaves "ROOT/a/user" behind when "user.alice" moves to
 * "ROOT/b/user/bob").  rmdir removes only empty directories and a live
 * spool always holds its index, so nothing in use goes.  Best effort. */
static void mboxlist_prune(struct mboxlist *ml,
                           const struct mboxlist_moves *mv,
                           const struct mboxlist_item *it)
{
    struct buf path = BUF_INITIALIZER;
    const char *root = imapconf_partition(ml->conf, it->partition);
    const char *p, *slash;
    size_t rootlen;

    if (!root || mboxlist_moves_where(mv, it->olddir, &path) < 0)
        goto out;
    if (strcmp(buf_cstring(&path), it->newdir) == 0) {
        /* moved as a whole: start at the old parent, wherever it is now */
        slash = strrchr(it->olddir, '/');
        if (!slash || buf_setmap(&path, it->olddir,
                                 (size_t)(slash - it->olddir)) < 0)
            goto out;
        p = buf_cstring(&path);
        {
            struct buf where = BUF_INITIALIZER;

            if (mboxlist_moves_where(mv, p, &where) < 0) {
                buf_free(&where);
                goto out;
            }
            buf_free(&path);
            path = where;
        }
    }
    rootlen = strlen(root);
    while (rootlen > 1 && root[rootlen - 1] == '/')
        rootlen--;
    for (;;) {
        p = buf_cstring(&path);
        if (path.len <= rootlen || strncmp(p, root, rootlen) != 0 ||
            p[rootlen] != '/')
            break;
        if (rmdir(p) < 0)
            break;
        (void)fs_fsync_parent(p);
        slash = strrchr(p, '/');
        if (!slash)
            break;
        buf_truncate(&path, (size_t)(slash - p));
    }
out:
    buf_free(&path);
}

int mboxlist_rename(struct mboxlist *ml, const char *oldname,
                    const char *newname, const char *newpartition)
{
    struct cyrusdb_txn *tid = NULL;
    struct mboxlist_tree tree;
    struct mboxlist_moves mv;
    struct buf nb = BUF_INITIALIZER, dir = BUF_INITIALIZER;
    const char *data;
    size_t datalen, oldlen, i;
    int r;

    memset(&tree, 0, sizeof(tree));
    memset(&mv, 0, sizeof(mv));
    if (mboxname_check(oldname, NULL) != STORE_OK ||
        mboxname_check(newname, NULL) != STORE_OK)
        return STORE_BADNAME;
    if (strcmp(oldname, newname) != 0 &&
        mboxname_is_self_or_child(oldname, newname))
        return STORE_BADNAME;
    if (newpartition && (!mboxlist_partition_ok(newpartition) ||
                         !imapconf_partition(ml->conf, newpartition)))
        return STORE_BADPARTITION;
    oldlen = strlen(oldname);

    r = mboxlist_fetchlock(ml, oldname, &data, &datalen, &tid);
    if (r == CYRUSDB_NOTFOUND) {
        r = STORE_NOTFOUND;
        goto fail;
    }
    if (r != CYRUSDB_OK) {
        r = mboxlist_dberr("fetchlock", oldname, r);
        goto fail;
    }
    r = mboxlist_tree_collect(ml, oldname, data, datalen, 1, &tid, &tree);
    if (r != STORE_OK)
        goto fail;

    /* every check before anything moves */
    for (i = 0; i < tree.count; i++) {
        struct mboxlist_item *it = &tree.items[i];

        if (newpartition && strcmp(it->partition, newpartition) != 0) {
            r = STORE_NOTIMPLEMENTED;
            goto fail;
        }
    }
    for (i = 0; i < tree.count; i++) {
        struct mboxlist_item *it = &tree.items[i];

        buf_reset(&nb);
        if (buf_appendcstr(&nb, newname) < 0 ||
            buf_appendcstr(&nb, it->oldname + oldlen) < 0) {
            r = STORE_NOMEM;
            goto fail;
        }
        if (mboxname_check(buf_cstring(&nb), NULL) != STORE_OK) {
            r = STORE_BADNAME;
            goto fail;
        }
        it->newname = buf_release(&nb);
        if (!it->newname) {
            r = STORE_NOMEM;
            goto fail;
        }
        r = cyrusdb_fetch(ml->db, it->newname, strlen(it->newname), &data,
                          &datalen, &tid);
        if (r == CYRUSDB_OK) {
            r = STORE_EXISTS;
            goto fail;
        }
        if (r != CYRUSDB_NOTFOUND) {
            r = mboxlist_dberr("fetch", it->newname, r);
            goto fail;
        }
        r = mailbox_spool_dir(ml->conf, it->oldname, it->partition, &dir);
        if (r == STORE_OK) {
            it->olddir = buf_release(&dir);
            r = mailbox_spool_dir(ml->conf, it->newname, it->partition,
                                  &dir);
        }
        if (r == STORE_OK)
            it->newdir = buf_release(&dir);
        if (r != STORE_OK)
            goto fail;
        if (!it->olddir || !it->newdir) {
            r = STORE_NOMEM;
            goto fail;
        }
    }

    /* the spools first ... */
    for (i = 0; i < tree.count; i++) {
        r = mboxlist_move_one(&mv, &tree.items[i]);
        if (r != STORE_OK)
            goto undo;
    }
    r = mboxlist_moves_sync(&mv);
    if (r != STORE_OK)
        goto undo;

    /* ... then the entries, in one transaction */
    for (i = 0; i < tree.count; i++) {
        const struct mboxlist_item *it = &tree.items[i];

        r = cyrusdb_delete(ml->db, it->oldname, strlen(it->oldname), &tid, 0);
        if (r != CYRUSDB_OK) {
            r = mboxlist_dberr("delete", it->oldname, r);
            goto undo;
        }
    }
    for (i = 0; i < tree.count; i++) {
        const struct mboxlist_item *it = &tree.items[i];

        r = cyrusdb_store(ml->db, it->newname, strlen(it->newname),
                          it->value, it->valuelen, &tid);
        if (r != CYRUSDB_OK) {
            r = mboxlist_dberr("store", it->newname, r);
            goto undo;
        }
    }
    r = cyrusdb_commit(ml->db, tid);
    tid = NULL;
    if (r != CYRUSDB_OK) {
        r = mboxlist_dberr("commit", newname, r);
        goto undo;
    }

    /* leftovers: directories emptied by the moves (deepest first) */
    for (i = tree.count; i-- > 0;)
        mboxlist_prune(ml, &mv, &tree.items[i]);
    log_info("mboxlist: renamed mailbox=<%s> to=<%s> mailboxes=<%zu>",
             oldname, newname, tree.count);
    r = STORE_OK;
    goto out;

undo:
    mboxlist_moves_undo(&mv);
fail:
    if (tid)
        cyrusdb_abort(ml->db, tid);
out:
    mboxlist_moves_free(&mv);
    mboxlist_tree_free(&tree);
    buf_free(&nb);
    buf_free(&dir);
    return r;
}

/* ---- setacl, setspecialuse -------------------------------------------- */

static int mboxlist_update(struct mboxlist *ml, const char *name,
                           const char *acl, const char *specialuse);

int mboxlist_setacl(struct mboxlist *ml, const char *name, const char *acl)
{
    if (!acl || acl_check(acl) < 0) {
        log_error("mboxlist: setacl with malformed acl mailbox=<%s>", name);
        return STORE_INTERNAL;
    }
    return mboxlist_update(ml, name, acl, NULL);
}

int mboxlist_setspecialuse(struct mboxlist *ml, const char *name,
                           const char *specialuse)
{
    if (!specialuse || mboxlist_specialuse_check(specialuse) < 0) {
        log_error("mboxlist: malformed specialuse mailbox=<%s>", name);
        return STORE_INTERNAL;
    }
    return mboxlist_update(ml, name, NULL, specialuse);
}

/* Rewrite an entry with a new ACL and/or special use (NULL: keep). */
static int mboxlist_update(struct mboxlist *ml, const char *name,
                           const char *acl, const char *specialuse)
{
    struct cyrusdb_txn *tid = NULL;
    struct mboxlist_entry *e = NULL;
    struct buf value = BUF_INITIALIZER;
    const char *data;
    size_t datalen;
    int r;

    if (mboxname_check(name, NULL) != STORE_OK)
        return STORE_BADNAME;
    r = mboxlist_fetchlock(ml, name, &data, &datalen, &tid);
    if (r == CYRUSDB_NOTFOUND) {
        r = STORE_NOTFOUND;
        goto fail;
    }
    if (r != CYRUSDB_OK) {
        r = mboxlist_dberr("fetchlock", name, r);
        goto fail;
    }
    r = mboxlist_parse(name, strlen(name), data, datalen, &e);
    if (r != STORE_OK)
        goto fail;
    r = mboxlist_format(&value, e->type, e->partition, e->uniqueid,
                        acl ? acl : e->acl,
                        specialuse ? specialuse : e->specialuse);
    if (r != STORE_OK)
        goto fail;
    r = cyrusdb_store(ml->db, name, strlen(name), value.s, value.len, &tid);
    if (r != CYRUSDB_OK) {
        r = mboxlist_dberr("store", name, r);
        goto fail;
    }
    r = cyrusdb_commit(ml->db, tid);
    tid = NULL;
    if (r != CYRUSDB_OK) {
        r = mboxlist_dberr("commit", name, r);
        goto fail;
    }
    r = STORE_OK;
    goto out;

fail:
    if (tid)
        cyrusdb_abort(ml->db, tid);
out:
    mboxlist_entry_free(&e);
    buf_free(&value);
    return r;
}

/* ---- list -------------------------------------------------------------- */

struct mboxlist_list_rock {
    const char *pattern;
    int show_deleted;   /* the pattern asks for DELETED. names */
    mboxlist_cb_fn *cb;
    void *rock;
    struct buf key;
    int result;     /* cb's non-zero value, or a store error of ours */
};

static int mboxlist_list_filter(void *rock, const char *key, size_t keylen,
                                const char *data, size_t datalen)
{
    struct mboxlist_list_rock *lr = rock;

    (void)data; (void)datalen;
    if (keylen > MBOXNAME_MAX || memchr(key, '\0', keylen))
        return 0;
    if (buf_setmap(&lr->key, key, keylen) < 0)
        return 1;   /* let the callback report the shortage */
    if (!lr->show_deleted && mboxlist_is_deleted(buf_cstring(&lr->key)))
        return 0;
    return mboxname_match(lr->pattern, buf_cstring(&lr->key), '.');
}

static int mboxlist_list_cb(void *rock, const char *key, size_t keylen,
                            const char *data, size_t datalen)
{
    struct mboxlist_list_rock *lr = rock;
    struct mboxlist_entry *e = NULL;
    int r;

    /* a copy: the entry stays valid even if cb looks names up */
    r = mboxlist_parse(key, keylen, data, datalen, &e);
    if (r == STORE_CORRUPT)
        return 0;   /* logged; the rest of the list is still served */
    if (r != STORE_OK) {
        lr->result = r;
        return 1;
    }
    r = lr->cb(lr->rock, e);
    mboxlist_entry_free(&e);
    if (r) {
        lr->result = r;
        return 1;
    }
    return 0;
}

int mboxlist_list(struct mboxlist *ml, const char *pattern,
                  mboxlist_cb_fn *cb, void *rock)
{
    struct mboxlist_list_rock lr;
    size_t prefixlen;
    int r;

    if (!pattern || !cb)
        return STORE_INTERNAL;
    prefixlen = strcspn(pattern, "*%");
    lr.pattern = pattern;
    lr.show_deleted = mboxlist_is_deleted(pattern);
    lr.cb = cb;
    lr.rock = rock;
    memset(&lr.key, 0, sizeof(lr.key));
    lr.result = STORE_OK;
    r = cyrusdb_foreach(ml->db, pattern, prefixlen, mboxlist_list_filter,
                        mboxlist_list_cb, &lr, NULL);
    buf_free(&lr.key);
    if (lr.result != STORE_OK)
        return lr.result;
    if (r < 0)
        return mboxlist_dberr("foreach", pattern, r);
    return STORE_OK;
}
