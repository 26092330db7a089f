/*
 * subs.c - per-user subscriptions, CONFIGDIR/user/H/USER.sub.
 *
 * ON-DISK FORMAT (cyrusdb backend `subscription_db`, CYRUSDB_MBOXSORT
 * order, as Cyrus keeps its .sub files):
 *
 *   INTERNAL-MAILBOX-NAME  ->  ""
 *
 * One record per subscribed name; the walk order is mailbox order, which
 * is the order LSUB answers in.
 *
 * CRASH SAFETY: each add or remove is one cyrusdb write.  A user rename
 * copies every record into the new file in one transaction before the old
 * file is removed, so a crash in between leaves both, and running the
 * rename again completes it.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/buf.h"
#include "lib/fsutil.h"
#include "lib/log.h"
#include "lib/strarray.h"
#include "store/mboxname.h"
#include "store/store.h"
#include "store/subs.h"
#include "store/userid.h"

#define SUBS_SUFFIX "sub"
#define SUBS_DBFLAGS CYRUSDB_MBOXSORT

struct subs_db {
    struct cyrusdb *db;
    char *fname;
};

int subs_open(const struct imapconf *conf, const char *userid,
              struct subs_db **s_r)
{
    struct subs_db *s;
    int r;

    *s_r = NULL;
    s = calloc(1, sizeof(*s));
    if (!s)
        return STORE_NOMEM;
    r = store_user_db_open(conf, userid, SUBS_SUFFIX, "subscription_db",
                           SUBS_DBFLAGS, &s->db, &s->fname);
    if (r != STORE_OK) {
        free(s);
        return r;
    }
    *s_r = s;
    return STORE_OK;
}

void subs_close(struct subs_db **sp)
{
    struct subs_db *s = sp ? *sp : NULL;

    if (!s)
        return;
    cyrusdb_close(&s->db);
    free(s->fname);
    free(s);
    *sp = NULL;
}

static int subs_dberr(struct subs_db *s, int r, const char *what,
                      const char *mailbox)
{
    char safe[128];

    log_error("subs: %s failed file=<%s> mailbox=<%s> error=<%s>", what,
              s->fname, log_sanitize(mailbox, strlen(mailbox), safe,
                                     sizeof(safe)),
              cyrusdb_strerror(r));
    return store_from_cyrusdb(r);
}

int subs_add(struct subs_db *s, const char *mailbox)
{
    int r;

    if (!mailbox || mboxname_check(mailbox, NULL) != STORE_OK)
        return STORE_BADNAME;
    r = cyrusdb_store(s->db, mailbox, strlen(mailbox), "", 0, NULL);
    if (r != CYRUSDB_OK)
        return subs_dberr(s, r, "store", mailbox);
    return STORE_OK;
}

int subs_remove(struct subs_db *s, const char *mailbox)
{
    size_t len = mailbox ? strnlen(mailbox, MBOXNAME_MAX + 1) : 0;
    int r;

    /* no name check: a name subscribed under older rules can go */
    if (len == 0 || len > MBOXNAME_MAX)
        return STORE_NOTFOUND;
    r = cyrusdb_delete(s->db, mailbox, len, NULL, 0);
    if (r == CYRUSDB_NOTFOUND)
        return STORE_NOTFOUND;
    if (r != CYRUSDB_OK)
        return subs_dberr(s, r, "delete", mailbox);
    return STORE_OK;
}

int subs_is_subscribed(struct subs_db *s, const char *mailbox)
{
    size_t len = mailbox ? strnlen(mailbox, MBOXNAME_MAX + 1) : 0;
    const char *data;
    size_t datalen;
    int r;

    if (len == 0 || len > MBOXNAME_MAX)
        return 0;
    r = cyrusdb_fetch(s->db, mailbox, len, &data, &datalen, NULL);
    if (r == CYRUSDB_OK)
        return 1;
    if (r == CYRUSDB_NOTFOUND)
        return 0;
    return -subs_dberr(s, r, "fetch", mailbox);
}

struct subs_collect {
    const char *pattern;
    struct strarray names;
    struct buf name;
    int nomem;
};

static int subs_collect_cb(void *rock, const char *key, size_t keylen,
                           const char *data, size_t datalen)
{
    struct subs_collect *c = rock;

    (void)data;
    (void)datalen;
    if (keylen > MBOXNAME_MAX || memchr(key, '\0', keylen))
        return 0;   /* not a name we could have written */
    if (buf_setmap(&c->name, key, keylen) < 0) {
        c->nomem = 1;
        return 1;
    }
    if (mboxname_match(c->pattern, buf_cstring(&c->name), '.') &&
        strarray_append(&c->names, buf_cstring(&c->name)) < 0) {
        c->nomem = 1;
        return 1;
    }
    return 0;
}

int subs_list(struct subs_db *s, const char *pattern, subs_cb_fn *cb,
              void *rock)
{
    struct subs_collect c = { pattern, STRARRAY_INITIALIZER, BUF_INITIALIZER,
                              0 };
    size_t prefixlen, i;
    int r;

    if (!pattern)
        return STORE_INTERNAL;
    /* only names starting with the pattern's literal head can match; the
     * records of one prefix are one run in mailbox order too */
    prefixlen = strcspn(pattern, "*%");
    r = cyrusdb_foreach(s->db, pattern, prefixlen, NULL, subs_collect_cb, &c,
                        NULL);
    if (c.nomem) {
        r = STORE_NOMEM;
    } else if (r != CYRUSDB_OK) {
        log_error("subs: walk failed file=<%s> error=<%s>", s->fname,
                  cyrusdb_strerror(r));
        r = store_from_cyrusdb(r);
    } else {
        /* the callbacks run after the walk: they may use this handle */
        for (i = 0; i < c.names.count; i++) {
            r = cb(rock, strarray_nth(&c.names, i));
            if (r)
                break;
        }
    }
    strarray_fini(&c.names);
    buf_free(&c.name);
    return r;
}

int subs_delete_user(const struct imapconf *conf, const char *userid)
{
    return store_user_db_delete(conf, userid, SUBS_SUFFIX);
}

struct subs_rename {
    struct buf oldinbox;
    struct buf newinbox;
};

/* "user.OLD" and "user.OLD.X" become "user.NEW" and "user.NEW.X". */
static int subs_rekey(void *rock, const char *key, size_t keylen,
                      struct buf *newkey)
{
    struct subs_rename *rr = rock;
    size_t n = rr->oldinbox.len;

    if (keylen < n || memcmp(key, rr->oldinbox.s, n) ||
        (keylen > n && key[n] != '.'))
        return 0;
    buf_reset(newkey);
    if (buf_append(newkey, rr->newinbox.s, rr->newinbox.len) < 0 ||
        buf_append(newkey, key + n, keylen - n) < 0)
        return -1;
    return 0;
}

int subs_rename_user(const struct imapconf *conf, const char *olduser,
                     const char *newuser)
{
    struct subs_rename rr = { BUF_INITIALIZER, BUF_INITIALIZER };
    int r = STORE_OK;

    /* subscriptions to the old user's mailboxes follow them */
    /* "alice@D" -> "D!user.alice"; a user id that has no INBOX (a space
     * in it, say) has no mailboxes to follow */
    r = userid_inbox(olduser, &rr.oldinbox);
    if (r == STORE_OK)
        r = userid_inbox(newuser, &rr.newinbox);
    if (r == STORE_OK || r == STORE_BADNAME)
        r = store_user_db_rename(conf, olduser, newuser, SUBS_SUFFIX,
                                 "subscription_db", SUBS_DBFLAGS,
                                 r == STORE_OK ? subs_rekey : NULL, &rr);
    buf_free(&rr.oldinbox);
    buf_free(&rr.newinbox);
    return r;
}
