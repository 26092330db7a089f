/*
 * test_mboxlist.c - the mailbox list (store/mboxlist.c) against every
 * cyrusdb backend: create and lookup, refused names and partitions,
 * delete with and without children, rename of trees (plain and hashed
 * spool, children on another partition, targets already on disk), ACLs,
 * LIST patterns, damaged entries, and concurrent creators in forked
 * processes.
 *
 * Every case gets a fresh directory with th_store_conf(); spool effects are
 * checked on the real file system (a marker file is put in each spool and
 * looked for after a rename).  List callbacks never assert: they record
 * what they saw and the case checks afterwards.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "store/acl.h"
#include "store/mailbox.h"
#include "store/mboxlist.h"
#include "store/mboxname.h"
#include "store/store.h"
#include "tests/testhelp.h"

/* Log to stderr when $TEST_LOG is set, else nowhere. */
static void log_default(void)
{
    log_init("test_mboxlist",
             getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
}

/* ---- fixture ----------------------------------------------------------- */

struct fx {
    const char *backend;
    char *dir;
    struct imapconf *conf;
    struct mboxlist *ml;
};

static void fx_open(struct fx *fx, void **state, const char *extra)
{
    memset(fx, 0, sizeof(*fx));
    fx->backend = (const char *)*state;
    fx->dir = th_mkdtemp("mboxlist");
    fx->conf = th_store_conf(fx->dir, fx->backend, extra);
    assert_int_equal(mboxlist_open(fx->conf, &fx->ml), STORE_OK);
    assert_non_null(fx->ml);
    assert_ptr_equal(mboxlist_conf(fx->ml), fx->conf);
}

static void fx_close(struct fx *fx)
{
    mboxlist_close(&fx->ml);
    assert_null(fx->ml);
    imapconf_free(&fx->conf);
    th_rmrf(fx->dir);
    free(fx->dir);
}

/* "partition-other: DIR\n" for a second partition; DIR into *dir_r. */
static char *other_partition_text(const char *tag, char **dir_r)
{
    char *text = NULL;

    *dir_r = th_mkdtemp(tag);
    assert_true(asprintf(&text, "partition-other: %s\n", *dir_r) > 0);
    return text;
}

static void create_ok(struct fx *fx, const char *name, const char *part)
{
    int r = mboxlist_create(fx->ml, name, part, NULL, NULL);

    if (r != STORE_OK)
        fail_msg("create %s: %s", name, store_strerror(r));
}

static char *spool_dir(struct fx *fx, const char *name, const char *part)
{
    struct buf b = BUF_INITIALIZER;

    assert_int_equal(mailbox_spool_dir(fx->conf, name, part, &b), STORE_OK);
    return buf_release(&b);
}

static int is_dir(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int exists(const char *path)
{
    struct stat st;

    return lstat(path, &st) == 0;
}

/* Put a marker file "1." holding the mailbox name in its spool. */
static void put_marker(struct fx *fx, const char *name, const char *part)
{
    char *dir = spool_dir(fx, name, part);
    char *path = th_path(dir, "1.");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

    assert_true(fd >= 0);
    assert_int_equal(write(fd, name, strlen(name)), (ssize_t)strlen(name));
    assert_int_equal(close(fd), 0);
    free(path);
    free(dir);
}

/* The marker of `oldname` must now be in the spool of `name`, with the
 * mailbox's index beside it. */
static void expect_marker(struct fx *fx, const char *name, const char *part,
                          const char *oldname)
{
    char *dir = spool_dir(fx, name, part);
    char *path = th_path(dir, "1.");
    char *idx = th_path(dir, MAILBOX_INDEX_FNAME);
    char got[600];
    int fd = open(path, O_RDONLY);
    ssize_t n;

    if (fd < 0)
        fail_msg("marker missing: %s", path);
    n = read(fd, got, sizeof(got) - 1);
    assert_true(n >= 0);
    got[n] = '\0';
    close(fd);
    assert_string_equal(got, oldname);
    if (!exists(idx))
        fail_msg("index missing: %s", idx);
    free(idx);
    free(path);
    free(dir);
}

static struct mboxlist_entry *lookup_ok(struct fx *fx, const char *name)
{
    struct mboxlist_entry *e = (struct mboxlist_entry *)0x1;
    int r = mboxlist_lookup(fx->ml, name, &e);

    if (r != STORE_OK)
        fail_msg("lookup %s: %s", name, store_strerror(r));
    assert_non_null(e);
    assert_string_equal(e->name, name);
    return e;
}

static void expect_notfound(struct fx *fx, const char *name)
{
    struct mboxlist_entry *e = (struct mboxlist_entry *)0x1;

    assert_int_equal(mboxlist_lookup(fx->ml, name, &e), STORE_NOTFOUND);
    assert_null(e);
}

static int is_uniqueid(const char *u)
{
    size_t i;

    if (strlen(u) != 24)
        return 0;
    for (i = 0; i < 24; i++)
        if (!strchr("0123456789abcdef", u[i]))
            return 0;
    return 1;
}

/* ---- list recording ---------------------------------------------------- */

#define REC_MAX 64

struct seen {
    char *names[REC_MAX];
    size_t n;
    int stop_at;       /* return 99 at this call (1-based), 0 = never */
    struct fx *fx;     /* when set, each name is looked up during the walk */
    int lookup_fail;
};

static int record_cb(void *rock, const struct mboxlist_entry *e)
{
    struct seen *s = rock;

    if (s->n < REC_MAX)
        s->names[s->n] = strdup(e->name);
    s->n++;
    if (s->fx) {
        struct mboxlist_entry *x = NULL;

        if (mboxlist_lookup(s->fx->ml, e->name, &x) != STORE_OK ||
            strcmp(x->uniqueid, e->uniqueid) != 0)
            s->lookup_fail++;
        mboxlist_entry_free(&x);
    }
    if (s->stop_at && (int)s->n == s->stop_at)
        return 99;
    return 0;
}

static void seen_free(struct seen *s)
{
    size_t i;

    for (i = 0; i < s->n && i < REC_MAX; i++)
        free(s->names[i]);
    memset(s, 0, sizeof(*s));
}

/* List `pattern` and compare with the NULL-terminated expected names. */
static void expect_list(struct fx *fx, const char *pattern,
                        const char *const *want)
{
    struct seen s;
    size_t i, nwant = 0;

    memset(&s, 0, sizeof(s));
    assert_int_equal(mboxlist_list(fx->ml, pattern, record_cb, &s), STORE_OK);
    while (want[nwant])
        nwant++;
    for (i = 0; i < s.n && i < nwant; i++)
        if (strcmp(s.names[i], want[i]) != 0)
            fail_msg("list %s: item %zu is %s, expected %s", pattern, i,
                     s.names[i], want[i]);
    if (s.n != nwant)
        fail_msg("list %s: %zu names, expected %zu", pattern, s.n, nwant);
    seen_free(&s);
}

/* ---- cases ------------------------------------------------------------- */

static void test_create_lookup(void **state)
{
    struct fx fx;
    struct buf uid = BUF_INITIALIZER;
    struct mboxlist_entry *e, *e2;
    char *dir, *idx;

    fx_open(&fx, state, NULL);
    buf_setcstr(&uid, "poison");
    assert_int_equal(mboxlist_create(fx.ml, TH_D "user.alice", NULL, NULL, &uid),
                     STORE_OK);
    assert_true(is_uniqueid(buf_cstring(&uid)));

    e = lookup_ok(&fx, TH_D "user.alice");
    assert_int_equal(e->type, MBOXLIST_TYPE_EMAIL);
    assert_string_equal(e->partition, "default");
    assert_string_equal(e->uniqueid, buf_cstring(&uid));
    assert_string_equal(e->acl, "alice" TH_U "\t" ACL_OWNER_DEFAULT "\t");
    assert_int_equal(acl_rights(e->acl, "alice" TH_U, NULL), ACL_ALL);
    assert_int_equal(acl_rights(e->acl, "bob", NULL), 0);
    mboxlist_entry_free(&e);
    assert_null(e);

    /* the spool exists, with its index */
    dir = spool_dir(&fx, TH_D "user.alice", NULL);
    idx = th_path(dir, MAILBOX_INDEX_FNAME);
    assert_true(is_dir(dir));
    assert_true(exists(idx));
    free(idx);
    free(dir);

    /* a user's folder gets the owner's ACL; other names none */
    create_ok(&fx, TH_D "user.alice.Sent", NULL);
    e = lookup_ok(&fx, TH_D "user.alice.Sent");
    assert_string_equal(e->acl, "alice" TH_U "\tlrswipkxtea\t");
    assert_true(is_uniqueid(e->uniqueid));
    assert_string_not_equal(e->uniqueid, buf_cstring(&uid));
    mboxlist_entry_free(&e);
    /* the owner of TH_D "user.a^b" logs in as "a.b" */
    create_ok(&fx, TH_D "user.a^b.Sent", NULL);
    e = lookup_ok(&fx, TH_D "user.a^b.Sent");
    assert_string_equal(e->acl, "a.b" TH_U "\tlrswipkxtea\t");
    assert_int_equal(acl_rights(e->acl, "a.b" TH_U, NULL), ACL_ALL);
    mboxlist_entry_free(&e);
    create_ok(&fx, TH_D "shared", NULL);
    e = lookup_ok(&fx, TH_D "shared");
    assert_string_equal(e->acl, "");
    mboxlist_entry_free(&e);

    /* explicit partition and ACL */
    assert_int_equal(mboxlist_create(fx.ml, TH_D "shared.lists", "default",
                                     "anyone\tlrp\t", NULL), STORE_OK);
    e = lookup_ok(&fx, TH_D "shared.lists");
    assert_string_equal(e->acl, "anyone\tlrp\t");
    mboxlist_entry_free(&e);

    /* missing and invalid names */
    expect_notfound(&fx, TH_D "user.bob");
    expect_notfound(&fx, TH_D "user.alic");
    e = (struct mboxlist_entry *)0x1;
    assert_int_equal(mboxlist_lookup(fx.ml, TH_D "user..x", &e), STORE_BADNAME);
    assert_null(e);

    /* durable across handles */
    mboxlist_close(&fx.ml);
    assert_int_equal(mboxlist_open(fx.conf, &fx.ml), STORE_OK);
    e = lookup_ok(&fx, TH_D "user.alice");
    assert_string_equal(e->uniqueid, buf_cstring(&uid));
    mboxlist_entry_free(&e);
    e2 = lookup_ok(&fx, TH_D "shared.lists");
    mboxlist_entry_free(&e2);

    buf_free(&uid);
    fx_close(&fx);
}

static void test_create_exists(void **state)
{
    struct fx fx;
    struct buf uid = BUF_INITIALIZER, uid2 = BUF_INITIALIZER;
    struct mboxlist_entry *e;

    fx_open(&fx, state, NULL);
    assert_int_equal(mboxlist_create(fx.ml, TH_D "user.alice", NULL, NULL, &uid),
                     STORE_OK);
    put_marker(&fx, TH_D "user.alice", NULL);
    buf_setcstr(&uid2, "untouched");
    assert_int_equal(mboxlist_create(fx.ml, TH_D "user.alice", NULL, "x\tl\t",
                                     &uid2), STORE_EXISTS);
    assert_string_equal(buf_cstring(&uid2), "untouched");
    e = lookup_ok(&fx, TH_D "user.alice");
    assert_string_equal(e->uniqueid, buf_cstring(&uid));
    assert_string_equal(e->acl, "alice" TH_U "\tlrswipkxtea\t");
    mboxlist_entry_free(&e);
    /* the spool was left alone */
    expect_marker(&fx, TH_D "user.alice", NULL, TH_D "user.alice");
    buf_free(&uid);
    buf_free(&uid2);
    fx_close(&fx);
}

static void test_create_refused(void **state)
{
    static const char *const bad[] = {
        "", TH_D "user.", TH_D "user..x", ".x", "x.", "a/b", TH_D "user.*", TH_D "user.%",
        TH_D "user.^", "a\x01" "b", "caf\xc3\xa9", NULL
    };
    const char *const none[] = { NULL };
    struct fx fx;
    char *dir;
    int i;

    fx_open(&fx, state, NULL);
    log_init("test_mboxlist", LOG_TO_NONE);   /* errors on purpose */
    for (i = 0; bad[i]; i++)
        assert_int_equal(mboxlist_create(fx.ml, bad[i], NULL, NULL, NULL),
                         STORE_BADNAME);
    /* unknown partition: refused, and no spool anywhere */
    assert_int_equal(mboxlist_create(fx.ml, TH_D "user.alice", "nope", NULL, NULL),
                     STORE_BADPARTITION);
    assert_int_equal(mboxlist_create(fx.ml, TH_D "user.alice", "a b", NULL, NULL),
                     STORE_BADPARTITION);
    expect_notfound(&fx, TH_D "user.alice");
    dir = spool_dir(&fx, TH_D "user.alice", NULL);
    assert_false(exists(dir));
    free(dir);
    /* a malformed ACL is a caller's error */
    assert_int_equal(mboxlist_create(fx.ml, TH_D "user.alice", NULL, "alice" TH_U "\tlz\t",
                                     NULL), STORE_INTERNAL);
    expect_notfound(&fx, TH_D "user.alice");
    expect_list(&fx, "*", none);
    log_default();
    fx_close(&fx);
}

static void test_create_replaces_orphan(void **state)
{
    struct fx fx;
    struct mboxlist_entry *e;

    fx_open(&fx, state, NULL);
    log_init("test_mboxlist", LOG_TO_NONE);   /* errors on purpose */
    /* the spool of a create that died before its commit */
    assert_int_equal(mailbox_create(fx.conf, TH_D "user.orphan", "default",
                                    "0123456789abcdef01234567", 0), STORE_OK);
    put_marker(&fx, TH_D "user.orphan", NULL);
    expect_notfound(&fx, TH_D "user.orphan");
    create_ok(&fx, TH_D "user.orphan", NULL);
    e = lookup_ok(&fx, TH_D "user.orphan");
    assert_string_not_equal(e->uniqueid, "0123456789abcdef01234567");
    mboxlist_entry_free(&e);
    {
        char *dir = spool_dir(&fx, TH_D "user.orphan", NULL);
        char *marker = th_path(dir, "1.");
        char *idx = th_path(dir, MAILBOX_INDEX_FNAME);

        assert_false(exists(marker));   /* old messages went */
        assert_true(exists(idx));
        free(idx);
        free(marker);
        free(dir);
    }
    log_default();
    fx_close(&fx);
}

static void test_delete(void **state)
{
    struct fx fx;
    struct mboxlist_entry *e;
    char *pdir, *cdir, *pidx;
    const char *const rest[] = { TH_D "user.alice.Sent", TH_D "user.bob", NULL };
    const char *const bob[] = { TH_D "user.bob", NULL };

    fx_open(&fx, state, NULL);
    create_ok(&fx, TH_D "user.alice", NULL);
    create_ok(&fx, TH_D "user.alice.Sent", NULL);
    create_ok(&fx, TH_D "user.bob", NULL);
    put_marker(&fx, TH_D "user.alice", NULL);
    put_marker(&fx, TH_D "user.alice.Sent", NULL);
    pdir = spool_dir(&fx, TH_D "user.alice", NULL);
    cdir = spool_dir(&fx, TH_D "user.alice.Sent", NULL);
    pidx = th_path(pdir, MAILBOX_INDEX_FNAME);

    /* without the flag: the parent alone goes */
    assert_int_equal(mboxlist_delete(fx.ml, TH_D "user.alice", 0), STORE_OK);
    expect_notfound(&fx, TH_D "user.alice");
    e = lookup_ok(&fx, TH_D "user.alice.Sent");
    mboxlist_entry_free(&e);
    assert_false(exists(pidx));
    expect_marker(&fx, TH_D "user.alice.Sent", NULL, TH_D "user.alice.Sent");
    expect_list(&fx, "*", rest);
    assert_int_equal(mboxlist_delete(fx.ml, TH_D "user.alice", 0),
                     STORE_NOTFOUND);

    /* the name can be created again, below the surviving child */
    create_ok(&fx, TH_D "user.alice", NULL);
    /* recursive: the whole tree and its spools */
    assert_int_equal(mboxlist_delete(fx.ml, TH_D "user.alice", MBOXLIST_RECURSIVE),
                     STORE_OK);
    expect_notfound(&fx, TH_D "user.alice");
    expect_notfound(&fx, TH_D "user.alice.Sent");
    assert_false(exists(cdir));
    assert_false(exists(pdir));
    expect_list(&fx, "*", bob);
    e = lookup_ok(&fx, TH_D "user.bob");
    mboxlist_entry_free(&e);

    assert_int_equal(mboxlist_delete(fx.ml, TH_D "user.nobody",
                                     MBOXLIST_RECURSIVE), STORE_NOTFOUND);
    assert_int_equal(mboxlist_delete(fx.ml, TH_D "user..x", 0), STORE_BADNAME);
    free(pidx);
    free(pdir);
    free(cdir);
    fx_close(&fx);
}

static const char *const alice_tree[] = {
    TH_D "user.alice", TH_D "user.alice.Sent", TH_D "user.alice.Sent.2024",
    TH_D "user.alice.Trash", NULL
};

static void make_tree(struct fx *fx, const char *const *names,
                      char uids[][25])
{
    size_t i;

    for (i = 0; names[i]; i++) {
        struct buf u = BUF_INITIALIZER;

        assert_int_equal(mboxlist_create(fx->ml, names[i], NULL, NULL, &u),
                         STORE_OK);
        put_marker(fx, names[i], NULL);
        if (uids)
            snprintf(uids[i], 25, "%s", buf_cstring(&u));
        buf_free(&u);
    }
}

/* Each name of the tree, `from` prefix replaced by `to`, exists with the
 * old unique id and ACL, and holds the old marker; the old names are gone. */
static void expect_renamed(struct fx *fx, const char *const *names,
                           char uids[][25], const char *from, const char *to,
                           const char *part)
{
    size_t i, flen = strlen(from);

    for (i = 0; names[i]; i++) {
        char newname[256];
        struct mboxlist_entry *e;

        snprintf(newname, sizeof(newname), "%s%s", to, names[i] + flen);
        e = lookup_ok(fx, newname);
        assert_string_equal(e->uniqueid, uids[i]);
        if (strncmp(names[i], TH_D "user.alice", sizeof(TH_D "user.alice") - 1) == 0)
            assert_string_equal(e->acl, "alice" TH_U "\tlrswipkxtea\t");
        assert_string_equal(e->partition, part ? part : "default");
        mboxlist_entry_free(&e);
        if (strcmp(from, to) != 0)
            expect_notfound(fx, names[i]);
        expect_marker(fx, newname, part, names[i]);
    }
}

static void test_rename_children(void **state)
{
    struct fx fx;
    char uids[8][25];
    char *olddir;
    const char *const all[] = {
        TH_D "user.alicex", TH_D "user.bob", TH_D "user.bob.Sent", TH_D "user.bob.Sent.2024",
        TH_D "user.bob.Trash", NULL
    };

    fx_open(&fx, state, NULL);
    make_tree(&fx, alice_tree, uids);
    create_ok(&fx, TH_D "user.alicex", NULL);   /* not below " TH_D "user.alice */
    put_marker(&fx, TH_D "user.alicex", NULL);
    olddir = spool_dir(&fx, TH_D "user.alice", NULL);

    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.alice", TH_D "user.bob", NULL),
                     STORE_OK);
    expect_renamed(&fx, alice_tree, uids, TH_D "user.alice", TH_D "user.bob", NULL);
    expect_marker(&fx, TH_D "user.alicex", NULL, TH_D "user.alicex");
    assert_false(exists(olddir));
    expect_list(&fx, "*", all);

    /* a leaf alone, into another hierarchy */
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.bob.Trash", TH_D "shared.trash",
                                     "default"), STORE_OK);
    expect_marker(&fx, TH_D "shared.trash", NULL, TH_D "user.alice.Trash");
    expect_notfound(&fx, TH_D "user.bob.Trash");
    free(olddir);
    fx_close(&fx);
}

/* The state after a refused rename is the state before it. */
static void test_rename_refused(void **state)
{
    struct fx fx;
    char uids[8][25], buids[4][25];
    static const char *const b_tree[] = { TH_D "user.carol", TH_D "user.carol.Trash",
                                          NULL };
    const char *const all[] = {
        TH_D "user.alice", TH_D "user.alice.Sent", TH_D "user.alice.Sent.2024",
        TH_D "user.alice.Trash", TH_D "user.carol", TH_D "user.carol.Trash", NULL
    };

    fx_open(&fx, state, NULL);
    log_init("test_mboxlist", LOG_TO_NONE);   /* errors on purpose */
    make_tree(&fx, alice_tree, uids);
    make_tree(&fx, b_tree, buids);

    /* onto an existing mailbox */
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.alice", TH_D "user.carol", NULL),
                     STORE_EXISTS);
    /* the top is free but a child's new name exists */
    create_ok(&fx, TH_D "user.dave.Trash", NULL);
    put_marker(&fx, TH_D "user.dave.Trash", NULL);
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.alice", TH_D "user.dave", NULL),
                     STORE_EXISTS);
    expect_notfound(&fx, TH_D "user.dave");
    assert_int_equal(mboxlist_delete(fx.ml, TH_D "user.dave.Trash", 0), STORE_OK);
    /* below itself, onto itself */
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.alice", TH_D "user.alice.x",
                                     NULL), STORE_BADNAME);
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.alice", TH_D "user.alice.Sent",
                                     NULL), STORE_BADNAME);
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.alice", TH_D "user.alice",
                                     NULL), STORE_EXISTS);
    /* invalid names, missing source */
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.alice", TH_D "user..x", NULL),
                     STORE_BADNAME);
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.alice", "a/b", NULL),
                     STORE_BADNAME);
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.nobody", TH_D "user.x", NULL),
                     STORE_NOTFOUND);
    /* partitions: unknown, or another one (not implemented) */
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.alice", TH_D "user.eve", "nope"),
                     STORE_BADPARTITION);
    {
        /* a child's new name over the length limit */
        char longname[MBOXNAME_MAX + 1];

        memset(longname, 'x', sizeof(longname));
        memcpy(longname, TH_D "user.", 5);
        for (size_t k = 100; k < MBOXNAME_MAX - 2; k += 101)
            longname[k] = '.';
        longname[MBOXNAME_MAX - 3] = '\0';   /* + ".Sent.2024" is too long */
        assert_int_equal(mboxname_check(longname, NULL), STORE_OK);
        assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.alice", longname, NULL),
                         STORE_BADNAME);
    }

    /* nothing changed */
    expect_list(&fx, "*", all);
    expect_renamed(&fx, alice_tree, uids, "", "", NULL);
    expect_renamed(&fx, b_tree, buids, "", "", NULL);
    {
        char *d = spool_dir(&fx, TH_D "user.dave", NULL);

        assert_false(exists(d));
        free(d);
    }
    log_default();
    fx_close(&fx);
}

/* Hashed spool: a rename that changes the hash letter moves the directory
 * between hash directories; children whose letter differs from their
 * parent's move on their own. */
static void test_rename_hashed(void **state)
{
    struct fx fx;
    char uids[8][25], uuids[8][25];
    char *d;
    static const char *const u_tree[] = { TH_D "user", TH_D "user.carol",
                                          TH_D "user.carol.x", TH_D "user.uma", NULL };

    fx_open(&fx, state, "hashimapspool: yes\n");
    make_tree(&fx, alice_tree, uids);
    d = spool_dir(&fx, TH_D "user.alice.Sent", NULL);
    assert_non_null(strstr(d, "/spool/" TH_DPATH_H "a/user/alice/Sent"));
    free(d);

    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.alice", TH_D "user.bob", NULL),
                     STORE_OK);
    expect_renamed(&fx, alice_tree, uids, TH_D "user.alice", TH_D "user.bob", NULL);
    d = spool_dir(&fx, TH_D "user.bob.Sent.2024", NULL);
    assert_non_null(strstr(d, "/spool/" TH_DPATH_H "b/user/bob/Sent/2024"));
    free(d);
    d = th_path(fx.dir, "spool/a");   /* emptied hash directory pruned */
    assert_false(exists(d));
    free(d);

    /* TH_D "user" hashes to 'u', TH_D "user.carol" to 'c', TH_D "user.uma" to 'u' (its
     * directory lies inside TH_D "user"'s); all of TH_D "people.*" hash to 'p' */
    assert_int_equal(mboxlist_delete(fx.ml, TH_D "user.bob", MBOXLIST_RECURSIVE),
                     STORE_OK);
    make_tree(&fx, u_tree, uuids);
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user", TH_D "people", NULL),
                     STORE_OK);
    expect_renamed(&fx, u_tree, uuids, TH_D "user", TH_D "people", NULL);
    d = spool_dir(&fx, TH_D "people.carol.x", NULL);
    assert_non_null(strstr(d, "/spool/" TH_DPATH_H "p/people/carol/x"));
    free(d);
    d = th_path(fx.dir, "spool/" TH_DPATH_H "c/user/carol");
    assert_false(exists(d));
    free(d);
    d = th_path(fx.dir, "spool/u/user");
    assert_false(exists(d));
    free(d);

    /* and back, the other way round */
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "people", TH_D "user", NULL),
                     STORE_OK);
    expect_renamed(&fx, u_tree, uuids, TH_D "user", TH_D "user", NULL);
    fx_close(&fx);
}

/* Children on another partition move within theirs; naming a partition
 * other than the tree's is not implemented. */
static void test_rename_partitions(void **state)
{
    struct fx fx;
    struct mboxlist_entry *e;
    char *odir = NULL;
    char *extra = other_partition_text("mboxlist-other", &odir);
    char *d;

    fx_open(&fx, state, extra);
    create_ok(&fx, TH_D "user.alice", NULL);
    create_ok(&fx, TH_D "user.alice.Arch", "other");
    create_ok(&fx, TH_D "user.alice.Arch.Old", "default");
    put_marker(&fx, TH_D "user.alice", NULL);
    put_marker(&fx, TH_D "user.alice.Arch", "other");
    put_marker(&fx, TH_D "user.alice.Arch.Old", NULL);
    d = spool_dir(&fx, TH_D "user.alice.Arch", "other");
    assert_int_equal(strncmp(d, odir, strlen(odir)), 0);
    free(d);

    log_init("test_mboxlist", LOG_TO_NONE);   /* errors on purpose */
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.alice", TH_D "user.bob",
                                     "other"), STORE_NOTIMPLEMENTED);
    log_default();
    e = lookup_ok(&fx, TH_D "user.alice.Arch");
    mboxlist_entry_free(&e);

    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.alice", TH_D "user.bob", NULL),
                     STORE_OK);
    expect_marker(&fx, TH_D "user.bob", NULL, TH_D "user.alice");
    expect_marker(&fx, TH_D "user.bob.Arch", "other", TH_D "user.alice.Arch");
    expect_marker(&fx, TH_D "user.bob.Arch.Old", NULL, TH_D "user.alice.Arch.Old");
    e = lookup_ok(&fx, TH_D "user.bob.Arch");
    assert_string_equal(e->partition, "other");
    mboxlist_entry_free(&e);
    d = spool_dir(&fx, TH_D "user.alice.Arch", "other");
    assert_false(exists(d));
    free(d);

    /* the whole tree on one partition: naming it is fine */
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.bob.Arch.Old", TH_D "user.x",
                                     "default"), STORE_OK);
    expect_marker(&fx, TH_D "user.x", "default", TH_D "user.alice.Arch.Old");
    fx_close(&fx);
    th_rmrf(odir);
    free(odir);
    free(extra);
}

/* The new directory already exists: the spool of children whose parent
 * was deleted alone, or a directory the new name's children need. */
static void test_rename_target_dir_exists(void **state)
{
    struct fx fx;
    char uids[8][25];
    struct mboxlist_entry *e;

    fx_open(&fx, state, NULL);
    create_ok(&fx, TH_D "user.bob.Keep", NULL);
    put_marker(&fx, TH_D "user.bob.Keep", NULL);
    make_tree(&fx, alice_tree, uids);
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.alice", TH_D "user.bob", NULL),
                     STORE_OK);
    expect_renamed(&fx, alice_tree, uids, TH_D "user.alice", TH_D "user.bob", NULL);
    expect_marker(&fx, TH_D "user.bob.Keep", NULL, TH_D "user.bob.Keep");
    e = lookup_ok(&fx, TH_D "user.bob.Keep");
    mboxlist_entry_free(&e);
    {
        char *d = th_path(fx.dir, "spool/" TH_DPATH "user/alice");

        assert_false(exists(d));
        free(d);
    }

    /* the whole tree, the kept child included, elsewhere */
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.bob", TH_D "shared", NULL),
                     STORE_OK);
    expect_marker(&fx, TH_D "shared", NULL, TH_D "user.alice");
    expect_marker(&fx, TH_D "shared.Keep", NULL, TH_D "user.bob.Keep");
    expect_marker(&fx, TH_D "shared.Sent.2024", NULL, TH_D "user.alice.Sent.2024");
    fx_close(&fx);
}

/* A move that fails halfway (here: a child's spool is missing) puts back
 * what was moved, and the list is unchanged. */
static void test_rename_rollback(void **state)
{
    struct fx fx;
    char uuids[8][25];
    char *carol;
    static const char *const u_tree[] = { TH_D "user", TH_D "user.uma",
                                          TH_D "user.uma.x", NULL };
    const char *const all[] = { TH_D "user", TH_D "user.carol", TH_D "user.uma",
                                TH_D "user.uma.x", NULL };

    fx_open(&fx, state, "hashimapspool: yes\n");
    make_tree(&fx, u_tree, uuids);
    create_ok(&fx, TH_D "user.carol", NULL);
    carol = spool_dir(&fx, TH_D "user.carol", NULL);
    th_rmrf(carol);
    log_init("test_mboxlist", LOG_TO_NONE);   /* errors on purpose */
    /* TH_D "user" and TH_D "user.uma" move first (hash 'u' -> 'p'), then
     * TH_D "user.carol" fails */
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user", TH_D "people", NULL),
                     STORE_IOERROR);
    log_default();
    expect_list(&fx, "*", all);
    expect_renamed(&fx, u_tree, uuids, "", "", NULL);
    {
        char *d = spool_dir(&fx, TH_D "people", NULL);

        assert_false(exists(d));
        free(d);
    }
    free(carol);
    fx_close(&fx);
}

/* A rename that crashed after moving the spools and before its commit
 * left the old entries and the new directories: repeating it repairs. */
static void test_rename_repeat_after_crash(void **state)
{
    struct fx fx;
    char uids[8][25];
    char *from, *to;

    fx_open(&fx, state, NULL);
    make_tree(&fx, alice_tree, uids);
    from = spool_dir(&fx, TH_D "user.alice", NULL);
    to = spool_dir(&fx, TH_D "user.bob", NULL);
    assert_int_equal(rename(from, to), 0);
    log_init("test_mboxlist", LOG_TO_NONE);   /* warnings on purpose */
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.alice", TH_D "user.bob", NULL),
                     STORE_OK);
    log_default();
    expect_renamed(&fx, alice_tree, uids, TH_D "user.alice", TH_D "user.bob", NULL);
    assert_false(exists(from));
    free(from);
    free(to);
    fx_close(&fx);
}

static void test_setacl(void **state)
{
    struct fx fx;
    struct mboxlist_entry *e;
    struct buf acl = BUF_INITIALIZER;
    char uid[25];

    fx_open(&fx, state, NULL);
    create_ok(&fx, TH_D "user.alice", NULL);
    e = lookup_ok(&fx, TH_D "user.alice");
    snprintf(uid, sizeof(uid), "%s", e->uniqueid);
    assert_int_equal(acl_set(e->acl, "bob", ACL_LOOKUP | ACL_READ, &acl), 0);
    mboxlist_entry_free(&e);
    assert_int_equal(mboxlist_setacl(fx.ml, TH_D "user.alice", buf_cstring(&acl)),
                     STORE_OK);
    e = lookup_ok(&fx, TH_D "user.alice");
    assert_string_equal(e->acl, "alice" TH_U "\tlrswipkxtea\tbob\tlr\t");
    assert_string_equal(e->uniqueid, uid);
    assert_string_equal(e->partition, "default");
    assert_int_equal(acl_rights(e->acl, "bob", NULL), ACL_LOOKUP | ACL_READ);
    mboxlist_entry_free(&e);
    /* empty ACL: admins only */
    assert_int_equal(mboxlist_setacl(fx.ml, TH_D "user.alice", ""), STORE_OK);
    e = lookup_ok(&fx, TH_D "user.alice");
    assert_string_equal(e->acl, "");
    mboxlist_entry_free(&e);

    log_init("test_mboxlist", LOG_TO_NONE);   /* errors on purpose */
    assert_int_equal(mboxlist_setacl(fx.ml, TH_D "user.alice", "bob" TH_U "\tlz\t"),
                     STORE_INTERNAL);
    assert_int_equal(mboxlist_setacl(fx.ml, TH_D "user.nobody", "bob" TH_U "\tl\t"),
                     STORE_NOTFOUND);
    assert_int_equal(mboxlist_setacl(fx.ml, TH_D "user..x", "bob" TH_U "\tl\t"),
                     STORE_BADNAME);
    log_default();
    e = lookup_ok(&fx, TH_D "user.alice");
    assert_string_equal(e->acl, "");
    mboxlist_entry_free(&e);
    buf_free(&acl);
    fx_close(&fx);
}

/* Virtual domains: the same local parts in two domains and the default
 * namespace are distinct mailboxes with distinct spools (Cyrus's layout,
 * hashed and not), an owner of the domain, and a listing by prefix that
 * never crosses domains. */
static void test_domains(void **state)
{
    static const char *const names[] = {
        "user.alice", "example.com!user.alice", "example.org!user.alice",
        "example.com!shared.news", "example.com!user.alice.Sent", NULL
    };
    const char *const com[] = { "example.com!shared.news",
                                "example.com!user.alice",
                                "example.com!user.alice.Sent", NULL };
    const char *const org[] = { "example.org!user.alice", NULL };
    const char *const plain[] = { "user.alice", NULL };
    const char *const com_users[] = { "example.com!user.alice", NULL };
    struct mboxlist_entry *e;
    struct fx fx;
    char *d;
    int hashed, i;

    for (hashed = 0; hashed <= 1; hashed++) {
        fx_open(&fx, state, hashed ? "hashimapspool: yes\n" : NULL);
        for (i = 0; names[i]; i++)
            create_ok(&fx, names[i], NULL);
        expect_list(&fx, "example.com!*", com);
        expect_list(&fx, "example.org!*", org);
        expect_list(&fx, "user.*", plain);
        expect_list(&fx, "example.com!user.%", com_users);
        d = spool_dir(&fx, "example.com!user.alice.Sent", NULL);
        assert_non_null(strstr(d, hashed
            ? "/spool/domain/e/example.com/a/user/alice/Sent"
            : "/spool/domain/example.com/user/alice/Sent"));
        assert_true(is_dir(d));
        free(d);
        d = spool_dir(&fx, "example.org!user.alice", NULL);
        assert_non_null(strstr(d, hashed
            ? "/spool/domain/e/example.org/a/user/alice"
            : "/spool/domain/example.org/user/alice"));
        assert_true(is_dir(d));
        free(d);
        /* the owner of a domain user's mailboxes is the domain user */
        e = lookup_ok(&fx, "example.com!user.alice.Sent");
        assert_string_equal(e->acl, "alice@example.com\tlrswipkxtea\t");
        assert_int_equal(acl_rights(e->acl, "alice", NULL), 0);
        mboxlist_entry_free(&e);
        e = lookup_ok(&fx, "user.alice");
        assert_int_equal(acl_rights(e->acl, "alice@example.com", NULL), 0);
        mboxlist_entry_free(&e);
        /* deleting one domain's user leaves the others */
        assert_int_equal(mboxlist_delete(fx.ml, "example.com!user.alice.Sent",
                                         0), STORE_OK);
        assert_int_equal(mboxlist_delete(fx.ml, "example.com!user.alice", 0),
                         STORE_OK);
        e = lookup_ok(&fx, "example.org!user.alice");
        mboxlist_entry_free(&e);
        e = lookup_ok(&fx, "user.alice");
        mboxlist_entry_free(&e);
        /* names outside the rules are refused */
        assert_int_equal(mboxlist_create(fx.ml, "Example.com!user.bob", NULL,
                                         NULL, NULL), STORE_BADNAME);
        assert_int_equal(mboxlist_create(fx.ml, "example.com!user.b!x", NULL,
                                         NULL, NULL), STORE_BADNAME);
        assert_int_equal(mboxlist_create(fx.ml, "a..b!user.bob", NULL, NULL,
                                         NULL), STORE_BADNAME);
        fx_close(&fx);
    }
}

static void test_list(void **state)
{
    /* created out of order on purpose */
    static const char *const names[] = {
        TH_D "user.b", TH_D "user.a-b", TH_D "user.a.b", TH_D "shared", TH_D "user.a", TH_D "user.ab",
        TH_D "user.a.b.c", TH_D "shared.x", TH_D "top", NULL
    };
    const char *const all[] = {
        TH_D "shared", TH_D "shared.x", TH_D "top", TH_D "user.a", TH_D "user.a.b", TH_D "user.a.b.c",
        TH_D "user.a-b", TH_D "user.ab", TH_D "user.b", NULL
    };
    const char *const top[] = { TH_D "shared", TH_D "top", NULL };
    const char *const users[] = { TH_D "user.a", TH_D "user.a-b", TH_D "user.ab", TH_D "user.b",
                                  NULL };
    const char *const ua_star[] = { TH_D "user.a", TH_D "user.a.b", TH_D "user.a.b.c",
                                    TH_D "user.a-b", TH_D "user.ab", NULL };
    const char *const ua_pct[] = { TH_D "user.a", TH_D "user.a-b", TH_D "user.ab", NULL };
    const char *const ua_kids[] = { TH_D "user.a.b", TH_D "user.a.b.c", NULL };
    const char *const two[] = { TH_D "shared.x", TH_D "user.a", TH_D "user.a-b", TH_D "user.ab",
                                TH_D "user.b", NULL };
    const char *const exact[] = { TH_D "user.a.b", NULL };
    const char *const none[] = { NULL };
    const char *const ends_b[] = { TH_D "user.a.b", TH_D "user.a-b", TH_D "user.ab",
                                   TH_D "user.b", NULL };
    struct fx fx;
    struct seen s;
    size_t i;

    fx_open(&fx, state, NULL);
    expect_list(&fx, "*", none);
    for (i = 0; names[i]; i++)
        create_ok(&fx, names[i], NULL);
    expect_list(&fx, "*", all);
    expect_list(&fx, TH_D "%", top);
    expect_list(&fx, TH_D "user.%", users);
    expect_list(&fx, TH_D "user.a*", ua_star);
    expect_list(&fx, TH_D "user.a%", ua_pct);
    expect_list(&fx, TH_D "user.a.*", ua_kids);
    expect_list(&fx, TH_D "%.%", two);
    expect_list(&fx, TH_D "user.a.b", exact);
    expect_list(&fx, TH_D "user.zz*", none);
    expect_list(&fx, TH_D "user.a.b.c.d", none);
    expect_list(&fx, "*b", ends_b);

    /* the callback's value stops the walk and is returned; names can be
     * looked up from inside the walk */
    memset(&s, 0, sizeof(s));
    s.stop_at = 3;
    s.fx = &fx;
    assert_int_equal(mboxlist_list(fx.ml, "*", record_cb, &s), 99);
    assert_int_equal(s.n, 3);
    assert_string_equal(s.names[2], TH_D "top");
    assert_int_equal(s.lookup_fail, 0);
    seen_free(&s);
    fx_close(&fx);
}

/* A value that does not parse: lookup says CORRUPT, list goes on without
 * it, setacl refuses, delete still removes the entry. */
static void test_corrupt_entry(void **state)
{
    struct fx fx;
    struct cyrusdb *db = NULL;
    struct mboxlist_entry *e = (struct mboxlist_entry *)0x1;
    char *fname;
    const char *const good[] = { TH_D "user.a", TH_D "user.c", NULL };
    static const char *const values[] = {
        "e default 0123", "e default 0123456789ABCDEF01234567 ",
        "e  0123456789abcdef01234567 ", "E default 0123456789abcdef01234567 ",
        "", "e", "e default", "e default 0123456789abcdef01234567",
        NULL
    };
    int i;

    fx_open(&fx, state, NULL);
    create_ok(&fx, TH_D "user.a", NULL);
    create_ok(&fx, TH_D "user.c", NULL);
    fname = th_path(fx.dir, "conf/" MBOXLIST_FNAME);
    log_init("test_mboxlist", LOG_TO_NONE);   /* errors on purpose */
    for (i = 0; values[i]; i++) {
        /* one handle per process on the file: close ours meanwhile */
        mboxlist_close(&fx.ml);
        assert_int_equal(cyrusdb_open(fx.backend, fname,
                                      CYRUSDB_MBOXSORT, &db, NULL),
                         CYRUSDB_OK);
        assert_int_equal(cyrusdb_store(db, TH_D "user.b", sizeof(TH_D "user.b") - 1, values[i],
                                       strlen(values[i]), NULL), CYRUSDB_OK);
        cyrusdb_close(&db);
        assert_int_equal(mboxlist_open(fx.conf, &fx.ml), STORE_OK);
        e = (struct mboxlist_entry *)0x1;
        if (mboxlist_lookup(fx.ml, TH_D "user.b", &e) != STORE_CORRUPT)
            fail_msg("value \"%s\" accepted", values[i]);
        assert_null(e);
        expect_list(&fx, "*", good);
        assert_int_equal(mboxlist_setacl(fx.ml, TH_D "user.b", ""), STORE_CORRUPT);
    }
    /* a malformed ACL alone is served (it grants nothing) */
    mboxlist_close(&fx.ml);
    assert_int_equal(cyrusdb_open(fx.backend, fname, CYRUSDB_MBOXSORT, &db,
                                  NULL), CYRUSDB_OK);
    assert_int_equal(cyrusdb_store(db, TH_D "user.b", sizeof(TH_D "user.b") - 1,
                                   "e default 0123456789abcdef01234567 x",
                                   36, NULL), CYRUSDB_OK);
    cyrusdb_close(&db);
    assert_int_equal(mboxlist_open(fx.conf, &fx.ml), STORE_OK);
    e = lookup_ok(&fx, TH_D "user.b");
    assert_string_equal(e->acl, "x");
    assert_int_equal(acl_rights(e->acl, "x", NULL), 0);
    mboxlist_entry_free(&e);
    /* a damaged entry can be deleted */
    assert_int_equal(mboxlist_delete(fx.ml, TH_D "user.b", 0), STORE_OK);
    expect_notfound(&fx, TH_D "user.b");
    log_default();
    free(fname);
    fx_close(&fx);
}

/* Special use (RFC 6154) in the entry: stored by create and setspecialuse,
 * kept by setacl and rename; the value is the old format when there is
 * none; old values read as none; unknown fields are skipped; a malformed
 * list is ignored (logged) without losing the entry. */
static void test_specialuse(void **state)
{
    struct fx fx;
    struct cyrusdb *db = NULL;
    struct mboxlist_entry *e;
    const char *data;
    size_t datalen;
    char *fname;
    char value[128];
    int i;
    static const struct {
        const char *tail;       /* after "e default UNIQUEID " */
        const char *acl, *use;
    } reads[] = {
        { "a\tlr\t", "a\tlr\t", "" },                            /* old */
        { "a\tlr\t\nspecialuse \\Sent", "a\tlr\t", "\\Sent" },
        { "\nspecialuse \\Sent \\Junk", "", "\\Sent \\Junk" },
        { "a\tlr\t\nfuture x y\nspecialuse \\Trash", "a\tlr\t",
          "\\Trash" },                                    /* field skipped */
        { "a\tlr\t\nspecialuse Sent", "a\tlr\t", "" },            /* bad */
        { "a\tlr\t\nspecialuse \\Sent  \\Junk", "a\tlr\t", "" },   /* bad */
    };

    fx_open(&fx, state, NULL);
    fname = th_path(fx.dir, "conf/" MBOXLIST_FNAME);
    assert_int_equal(mboxlist_specialuse_check(""), 0);
    assert_int_equal(mboxlist_specialuse_check("\\Sent \\Drafts"), 0);
    assert_int_equal(mboxlist_specialuse_check(NULL), -1);
    assert_int_equal(mboxlist_specialuse_check("Sent"), -1);
    assert_int_equal(mboxlist_specialuse_check("\\Sent "), -1);
    assert_int_equal(mboxlist_specialuse_check("\\"), -1);
    assert_int_equal(mboxlist_specialuse_check("\\Se(nt"), -1);
    assert_int_equal(mboxlist_specialuse_check("\\Sent\n"), -1);

    assert_int_equal(mboxlist_create_special(fx.ml, TH_D "user.a.Sent", NULL,
                                             NULL, "\\Sent", NULL),
                     STORE_OK);
    create_ok(&fx, TH_D "user.a.Plain", NULL);
    e = lookup_ok(&fx, TH_D "user.a.Sent");
    assert_string_equal(e->specialuse, "\\Sent");
    mboxlist_entry_free(&e);
    e = lookup_ok(&fx, TH_D "user.a.Plain");
    assert_string_equal(e->specialuse, "");
    mboxlist_entry_free(&e);
    /* kept by setacl and rename; changed by setspecialuse */
    assert_int_equal(mboxlist_setacl(fx.ml, TH_D "user.a.Sent", "b\tl\t"),
                     STORE_OK);
    assert_int_equal(mboxlist_rename(fx.ml, TH_D "user.a.Sent",
                                     TH_D "user.a.Sent2", NULL), STORE_OK);
    e = lookup_ok(&fx, TH_D "user.a.Sent2");
    assert_string_equal(e->specialuse, "\\Sent");
    assert_string_equal(e->acl, "b\tl\t");
    mboxlist_entry_free(&e);
    assert_int_equal(mboxlist_setspecialuse(fx.ml, TH_D "user.a.Sent2",
                                            "\\Archive \\All"), STORE_OK);
    e = lookup_ok(&fx, TH_D "user.a.Sent2");
    assert_string_equal(e->specialuse, "\\Archive \\All");
    assert_string_equal(e->acl, "b\tl\t");
    mboxlist_entry_free(&e);
    log_init("test_mboxlist", LOG_TO_NONE);   /* errors on purpose */
    assert_int_equal(mboxlist_setspecialuse(fx.ml, TH_D "user.a.Sent2",
                                            "Sent"), STORE_INTERNAL);
    assert_int_equal(mboxlist_create_special(fx.ml, TH_D "user.a.X", NULL,
                                             NULL, "x y", NULL),
                     STORE_INTERNAL);
    log_default();
    assert_int_equal(mboxlist_setspecialuse(fx.ml, TH_D "user.a.Sent2", ""),
                     STORE_OK);

    /* the stored value: the old format without special use */
    mboxlist_close(&fx.ml);
    assert_int_equal(cyrusdb_open(fx.backend, fname, CYRUSDB_MBOXSORT, &db,
                                  NULL), CYRUSDB_OK);
    assert_int_equal(cyrusdb_fetch(db, TH_D "user.a.Sent2",
                                   sizeof(TH_D "user.a.Sent2") - 1, &data,
                                   &datalen, NULL), CYRUSDB_OK);
    assert_null(memchr(data, '\n', datalen));
    assert_int_equal(data[datalen - 1], '\t');
    cyrusdb_close(&db);

    /* values written by hand: old ones, fields, damaged lists */
    log_init("test_mboxlist", LOG_TO_NONE);
    for (i = 0; i < (int)(sizeof(reads) / sizeof(reads[0])); i++) {
        snprintf(value, sizeof(value), "e default 0123456789abcdef01234567 %s",
                 reads[i].tail);
        assert_int_equal(cyrusdb_open(fx.backend, fname, CYRUSDB_MBOXSORT,
                                      &db, NULL), CYRUSDB_OK);
        assert_int_equal(cyrusdb_store(db, TH_D "user.b",
                                       sizeof(TH_D "user.b") - 1, value,
                                       strlen(value), NULL), CYRUSDB_OK);
        cyrusdb_close(&db);
        assert_int_equal(mboxlist_open(fx.conf, &fx.ml), STORE_OK);
        e = lookup_ok(&fx, TH_D "user.b");
        if (strcmp(e->acl, reads[i].acl) != 0 ||
            strcmp(e->specialuse, reads[i].use) != 0)
            fail_msg("value %d read as acl \"%s\" use \"%s\"", i, e->acl,
                     e->specialuse);
        mboxlist_entry_free(&e);
        mboxlist_close(&fx.ml);
    }
    log_default();
    assert_int_equal(mboxlist_open(fx.conf, &fx.ml), STORE_OK);
    free(fname);
    fx_close(&fx);
}

/* ---- concurrency ------------------------------------------------------- */

#define CC_PROCS 4
#define CC_NAMES 24

static void cc_name(int i, char *out, size_t len)
{
    /* some nested, so that parents and children are made at once */
    if (i % 3 == 2)
        snprintf(out, len, TH_D "user.u%d.sub", i - 1);
    else
        snprintf(out, len, TH_D "user.u%d", i);
}

static void test_concurrent_create(void **state)
{
    struct fx fx;
    pid_t pids[CC_PROCS];
    int pipes[CC_PROCS][2];
    int wins[CC_NAMES];
    struct seen s;
    int p, i;

    fx_open(&fx, state, NULL);
    /* the children open their own handles after fork */
    mboxlist_close(&fx.ml);
    memset(wins, 0, sizeof(wins));
    for (p = 0; p < CC_PROCS; p++) {
        assert_int_equal(pipe(pipes[p]), 0);
        pids[p] = fork();
        assert_true(pids[p] >= 0);
        if (pids[p] == 0) {
            struct mboxlist *ml = NULL;
            unsigned char res[CC_NAMES];
            int k;

            th_child_signals();
            close(pipes[p][0]);
            if (mboxlist_open(fx.conf, &ml) != STORE_OK)
                _exit(2);
            /* every child creates every name, each from its own start */
            for (k = 0; k < CC_NAMES; k++) {
                int n = (k + p * 5) % CC_NAMES;
                char name[64];
                int r;

                cc_name(n, name, sizeof(name));
                r = mboxlist_create(ml, name, NULL, NULL, NULL);
                res[n] = r == STORE_OK ? 1 : r == STORE_EXISTS ? 0 : 2;
            }
            mboxlist_close(&ml);
            if (write(pipes[p][1], res, sizeof(res)) != (ssize_t)sizeof(res))
                _exit(3);
            _exit(0);
        }
        close(pipes[p][1]);
    }
    for (p = 0; p < CC_PROCS; p++) {
        unsigned char res[CC_NAMES];
        char txt[64];
        int status;
        ssize_t n = read(pipes[p][0], res, sizeof(res));

        close(pipes[p][0]);
        assert_int_equal(waitpid(pids[p], &status, 0), pids[p]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail_msg("child %d: %s", p,
                     th_status_text(status, txt, sizeof(txt)));
        assert_int_equal(n, CC_NAMES);
        for (i = 0; i < CC_NAMES; i++) {
            if (res[i] == 2)
                fail_msg("child %d: create %d failed", p, i);
            wins[i] += res[i];
        }
    }
    assert_int_equal(mboxlist_open(fx.conf, &fx.ml), STORE_OK);
    for (i = 0; i < CC_NAMES; i++) {
        char name[64];
        struct mboxlist_entry *e;

        cc_name(i, name, sizeof(name));
        if (wins[i] != 1)
            fail_msg("%s created %d times", name, wins[i]);
        e = lookup_ok(&fx, name);
        mboxlist_entry_free(&e);
    }
    memset(&s, 0, sizeof(s));
    assert_int_equal(mboxlist_list(fx.ml, "*", record_cb, &s), STORE_OK);
    assert_int_equal(s.n, CC_NAMES);
    for (i = 1; i < CC_NAMES; i++)
        assert_true(strcmp(s.names[i - 1], s.names[i]) != 0);
    seen_free(&s);
    fx_close(&fx);
}

int main(void)
{
    static const struct th_case cases[] = {
        { "create_lookup", test_create_lookup },
        { "create_exists", test_create_exists },
        { "create_refused", test_create_refused },
        { "create_replaces_orphan", test_create_replaces_orphan },
        { "delete", test_delete },
        { "rename_children", test_rename_children },
        { "rename_refused", test_rename_refused },
        { "rename_hashed", test_rename_hashed },
        { "rename_partitions", test_rename_partitions },
        { "rename_target_dir_exists", test_rename_target_dir_exists },
        { "rename_rollback", test_rename_rollback },
        { "rename_repeat_after_crash", test_rename_repeat_after_crash },
        { "setacl", test_setacl },
        { "list", test_list },
        { "domains", test_domains },
        { "corrupt_entry", test_corrupt_entry },
        { "specialuse", test_specialuse },
        { "concurrent_create", test_concurrent_create },
    };

    log_default();
    return th_run_per_backend("mboxlist", cases,
                              sizeof(cases) / sizeof(cases[0]));
}
