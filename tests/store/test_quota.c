/*
 * test_quota.c - quota roots (store/quota.c) against every cyrusdb
 * backend: set/get and refused limits, the nearest root, the over-quota
 * and warning checks (storage in KiB against usage in bytes, message
 * counts), idempotent and self-correcting mailbox updates, moves between
 * roots, removal, damaged records, and concurrent updates from forked
 * processes that must leave the root's usage equal to the sum of its
 * mailboxes.
 *
 * A plain group first checks store.c: error texts, the temporary/permanent
 * split, the cyrusdb and errno mappings, and the strict number parser.
 *
 * Records are read back through the public API, and where the test needs
 * to see the M records themselves, through cyrusdb with the documented
 * key format (the quota handle is closed first, so that no two handles of
 * this process share a lock on the file).
 */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "store/quota.h"
#include "store/store.h"
#include "tests/testhelp.h"

/* ---- fixture ----------------------------------------------------------- */

struct fx {
    const char *backend;
    char *dir;
    struct imapconf *conf;
    struct quota_db *q;
};

static void fx_init(struct fx *f, void **state, const char *extra)
{
    memset(f, 0, sizeof(*f));
    f->backend = *state;
    f->dir = th_mkdtemp("quota");
    assert_non_null(f->dir);
    f->conf = th_store_conf(f->dir, f->backend, extra);
    assert_int_equal(quota_open(f->conf, &f->q), STORE_OK);
    assert_non_null(f->q);
}

static void fx_done(struct fx *f)
{
    quota_close(&f->q);
    assert_null(f->q);
    imapconf_free(&f->conf);
    th_rmrf(f->dir);
    free(f->dir);
}

static char *fx_dbpath(struct fx *f)
{
    char *conf = th_path(f->dir, "conf");
    char *p = th_path(conf, QUOTA_FNAME);

    free(conf);
    return p;
}

/* Store a raw record (quota handle closed meanwhile). */
static void fx_raw_store(struct fx *f, const char *key, const char *val)
{
    struct cyrusdb *db = NULL;
    char *path = fx_dbpath(f);

    quota_close(&f->q);
    assert_int_equal(cyrusdb_open(f->backend, path,
                                  CYRUSDB_CREATE | CYRUSDB_MBOXSORT, &db, NULL),
                     CYRUSDB_OK);
    assert_int_equal(cyrusdb_store(db, key, strlen(key), val, strlen(val),
                                   NULL), CYRUSDB_OK);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    free(path);
    assert_int_equal(quota_open(f->conf, &f->q), STORE_OK);
}

struct msum {
    const char *root;
    uint64_t bytes, msgs;
    unsigned long n, bad;
};

static int msum_cb(void *rock, const char *key, size_t keylen,
                   const char *data, size_t datalen)
{
    struct msum *m = rock;
    char val[1024], root[600];
    unsigned long long b, c;

    (void)key;
    (void)keylen;
    if (datalen >= sizeof(val)) {
        m->bad++;
        return 0;
    }
    memcpy(val, data, datalen);
    val[datalen] = '\0';
    if (sscanf(val, "%599s %llu %llu", root, &b, &c) != 3) {
        m->bad++;
        return 0;
    }
    if (!strcmp(root, m->root)) {
        m->bytes += b;
        m->msgs += c;
        m->n++;
    }
    return 0;
}

/* Sum the M records naming root (quota handle closed meanwhile). */
static void fx_sum_mrecords(struct fx *f, struct msum *m)
{
    struct cyrusdb *db = NULL;
    char *path = fx_dbpath(f);

    quota_close(&f->q);
    assert_int_equal(cyrusdb_open(f->backend, path, CYRUSDB_MBOXSORT, &db,
                                  NULL), CYRUSDB_OK);
    assert_int_equal(cyrusdb_foreach(db, "M", 1, NULL, msum_cb, m, NULL),
                     CYRUSDB_OK);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    free(path);
    assert_int_equal(m->bad, 0);
    assert_int_equal(quota_open(f->conf, &f->q), STORE_OK);
}

static void expect_usage(struct fx *f, const char *root, uint64_t bytes,
                         uint64_t msgs)
{
    struct quota qr;

    memset(&qr, 0x5a, sizeof(qr));
    assert_int_equal(quota_get(f->q, root, &qr), STORE_OK);
    assert_int_equal(qr.used_bytes, bytes);
    assert_int_equal(qr.used_messages, msgs);
}

static void expect_root(struct fx *f, const char *mailbox, const char *root)
{
    struct buf b = BUF_INITIALIZER;

    buf_setcstr(&b, "poison");
    if (root) {
        assert_int_equal(quota_findroot(f->q, mailbox, &b), STORE_OK);
        assert_string_equal(buf_cstring(&b), root);
    } else {
        assert_int_equal(quota_findroot(f->q, mailbox, &b), STORE_NOTFOUND);
    }
    buf_free(&b);
}

/* ---- cases ------------------------------------------------------------- */

static void test_set_get(void **state)
{
    struct fx f;
    struct quota qr;

    fx_init(&f, state, NULL);
    assert_int_equal(quota_get(f.q, TH_D "user.a", &qr), STORE_NOTFOUND);
    assert_int_equal(quota_set(f.q, TH_D "user.a", 100, 10), STORE_OK);
    memset(&qr, 0x5a, sizeof(qr));
    assert_int_equal(quota_get(f.q, TH_D "user.a", &qr), STORE_OK);
    assert_int_equal(qr.storage_limit_kb, 100);
    assert_int_equal(qr.message_limit, 10);
    assert_int_equal(qr.used_bytes, 0);
    assert_int_equal(qr.used_messages, 0);

    /* changing limits keeps the usage */
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a", 5000, 3), STORE_OK);
    assert_int_equal(quota_set(f.q, TH_D "user.a", QUOTA_UNLIMITED, 20), STORE_OK);
    memset(&qr, 0x5a, sizeof(qr));
    assert_int_equal(quota_get(f.q, TH_D "user.a", &qr), STORE_OK);
    assert_true(qr.storage_limit_kb == QUOTA_UNLIMITED);
    assert_int_equal(qr.message_limit, 20);
    assert_int_equal(qr.used_bytes, 5000);
    assert_int_equal(qr.used_messages, 3);

    /* largest limits round-trip */
    assert_int_equal(quota_set(f.q, TH_D "user.big", QUOTA_STORAGE_MAX_KB,
                               QUOTA_MESSAGE_MAX), STORE_OK);
    assert_int_equal(quota_get(f.q, TH_D "user.big", &qr), STORE_OK);
    assert_true(qr.storage_limit_kb == QUOTA_STORAGE_MAX_KB);
    assert_true(qr.message_limit == QUOTA_MESSAGE_MAX);

    /* refused names and limits change nothing */
    assert_int_equal(quota_set(f.q, TH_D "user..x", 1, 1), STORE_BADNAME);
    assert_int_equal(quota_set(f.q, "", 1, 1), STORE_BADNAME);
    assert_int_equal(quota_set(f.q, TH_D "user.a", -2, 1), STORE_INTERNAL);
    assert_int_equal(quota_set(f.q, TH_D "user.a", 1, -5), STORE_INTERNAL);
    assert_int_equal(quota_set(f.q, TH_D "user.a", QUOTA_STORAGE_MAX_KB + 1, 1),
                     STORE_INTERNAL);
    assert_int_equal(quota_get(f.q, TH_D "user..x", &qr), STORE_NOTFOUND);
    assert_int_equal(quota_get(f.q, TH_D "user.a", &qr), STORE_OK);
    assert_int_equal(qr.message_limit, 20);
    fx_done(&f);
}

static void test_findroot(void **state)
{
    struct fx f;

    fx_init(&f, state, NULL);
    expect_root(&f, TH_D "user.a.b.c", NULL);
    assert_int_equal(quota_set(f.q, TH_D "user", 1000, -1), STORE_OK);
    assert_int_equal(quota_set(f.q, TH_D "user.a", 100, -1), STORE_OK);
    expect_root(&f, TH_D "user.a.b.c", TH_D "user.a");
    expect_root(&f, TH_D "user.a", TH_D "user.a");
    expect_root(&f, TH_D "user.ab", TH_D "user");      /* not below user.a */
    expect_root(&f, TH_D "user.a-b", TH_D "user");
    expect_root(&f, TH_D "user", TH_D "user");
    expect_root(&f, TH_D "shared.x", NULL);
    expect_root(&f, "use", NULL);
    assert_int_equal(quota_set(f.q, TH_D "user.a.b", 10, -1), STORE_OK);
    expect_root(&f, TH_D "user.a.b.c", TH_D "user.a.b");   /* the nearest wins */
    expect_root(&f, TH_D "user.a.b", TH_D "user.a.b");
    expect_root(&f, TH_D "user.a.bc", TH_D "user.a");
    expect_root(&f, TH_D "user.a", TH_D "user.a");
    assert_int_equal(quota_remove(f.q, TH_D "user.a"), STORE_OK);
    expect_root(&f, TH_D "user.a.x", TH_D "user");
    expect_root(&f, TH_D "user.a.b.c", TH_D "user.a.b");
    fx_done(&f);
}

/* Virtual domains: a root governs its own domain only.  The names of a
 * domain never fall back on a domain-less root that happens to spell a
 * prefix of the domain ("example", "example.com") nor on another
 * domain's root, and the same user in two domains has two roots. */
static void test_findroot_domains(void **state)
{
    struct fx f;

    fx_init(&f, state, NULL);
    assert_int_equal(quota_set(f.q, "example", 1, -1), STORE_OK);
    assert_int_equal(quota_set(f.q, "example.com", 1, -1), STORE_OK);
    assert_int_equal(quota_set(f.q, "user", 1, -1), STORE_OK);
    expect_root(&f, "example.com!user.a", NULL);
    expect_root(&f, "example.com!user", NULL);
    expect_root(&f, "example.com!shared.x", NULL);
    expect_root(&f, "example.com.x", "example.com");
    assert_int_equal(quota_set(f.q, "example.com!user.a", 1, -1),
                     STORE_OK);    /* 1024 bytes */
    assert_int_equal(quota_set(f.q, "example.org!user.a", 1, -1),
                     STORE_OK);
    expect_root(&f, "example.com!user.a.Sent", "example.com!user.a");
    expect_root(&f, "example.org!user.a.Sent", "example.org!user.a");
    expect_root(&f, "example.net!user.a.Sent", NULL);
    expect_root(&f, "user.a.Sent", "user");
    /* usage is counted per domain user */
    assert_int_equal(quota_update_mailbox(f.q, "example.com!user.a.Sent",
                                          1000, 1), STORE_OK);
    assert_int_equal(quota_check(f.q, "example.com!user.a", 50, 1, NULL),
                     STORE_OVERQUOTA);
    assert_int_equal(quota_check(f.q, "example.org!user.a", 1000, 1, NULL),
                     STORE_OK);
    assert_int_equal(quota_check(f.q, "user.a", 1000, 1, NULL),
                     STORE_OK);
    fx_done(&f);
}

static void test_check(void **state)
{
    struct fx f;
    int warn;

    fx_init(&f, state, "quotawarn: 50\n");
    /* no root: always fine */
    warn = 7;
    assert_int_equal(quota_check(f.q, TH_D "user.a", 1ULL << 40, 1000000, &warn),
                     STORE_OK);
    assert_int_equal(warn, 0);

    /* 10 KiB and 5 messages */
    assert_int_equal(quota_set(f.q, TH_D "user.a", 10, 5), STORE_OK);
    warn = 7;
    assert_int_equal(quota_check(f.q, TH_D "user.a.x", 1000, 1, &warn), STORE_OK);
    assert_int_equal(warn, 0);
    /* exactly at the limit: allowed (10 KiB = 10240 bytes, not 10000) */
    assert_int_equal(quota_check(f.q, TH_D "user.a.x", 10240, 1, &warn), STORE_OK);
    assert_int_equal(warn, 1);
    assert_int_equal(quota_check(f.q, TH_D "user.a.x", 10001, 1, NULL), STORE_OK);
    assert_int_equal(quota_check(f.q, TH_D "user.a.x", 10241, 1, &warn),
                     STORE_OVERQUOTA);
    assert_int_equal(quota_check(f.q, TH_D "user.a", 0, 5, NULL), STORE_OK);
    assert_int_equal(quota_check(f.q, TH_D "user.a", 0, 6, NULL), STORE_OVERQUOTA);

    /* with usage: 10000 bytes and 4 messages */
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a.x", 10000, 4),
                     STORE_OK);
    assert_int_equal(quota_check(f.q, TH_D "user.a", 240, 1, &warn), STORE_OK);
    assert_int_equal(quota_check(f.q, TH_D "user.a", 241, 1, NULL),
                     STORE_OVERQUOTA);
    assert_int_equal(quota_check(f.q, TH_D "user.a", 1, 2, NULL), STORE_OVERQUOTA);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a.x", 20000, 9),
                     STORE_OK);
    /* over already: any positive addition fails, nothing added passes */
    assert_int_equal(quota_check(f.q, TH_D "user.a", 1, 0, NULL), STORE_OVERQUOTA);
    assert_int_equal(quota_check(f.q, TH_D "user.a", 0, 1, NULL), STORE_OVERQUOTA);
    assert_int_equal(quota_check(f.q, TH_D "user.a", 0, 0, NULL), STORE_OK);

    /* warning threshold, 50 %: 100 KiB, 10 messages, nothing used */
    assert_int_equal(quota_set(f.q, TH_D "user.w", 100, 10), STORE_OK);
    warn = 7;
    assert_int_equal(quota_check(f.q, TH_D "user.w", 50 * 1024 - 1, 1, &warn),
                     STORE_OK);
    assert_int_equal(warn, 0);
    assert_int_equal(quota_check(f.q, TH_D "user.w", 50 * 1024, 1, &warn),
                     STORE_OK);
    assert_int_equal(warn, 1);
    assert_int_equal(quota_check(f.q, TH_D "user.w", 10, 4, &warn), STORE_OK);
    assert_int_equal(warn, 0);
    assert_int_equal(quota_check(f.q, TH_D "user.w", 10, 5, &warn), STORE_OK);
    assert_int_equal(warn, 1);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.w", 40 * 1024, 1),
                     STORE_OK);
    assert_int_equal(quota_check(f.q, TH_D "user.w", 10 * 1024, 1, &warn),
                     STORE_OK);
    assert_int_equal(warn, 1);

    /* unlimited resources are never passed and never warned about */
    assert_int_equal(quota_set(f.q, TH_D "user.u", QUOTA_UNLIMITED,
                               QUOTA_UNLIMITED), STORE_OK);
    warn = 7;
    assert_int_equal(quota_check(f.q, TH_D "user.u", 1ULL << 50, 1ULL << 40,
                                 &warn), STORE_OK);
    assert_int_equal(warn, 0);
    /* a zero limit refuses everything */
    assert_int_equal(quota_set(f.q, TH_D "user.z", 0, QUOTA_UNLIMITED), STORE_OK);
    assert_int_equal(quota_check(f.q, TH_D "user.z", 1, 1, NULL), STORE_OVERQUOTA);
    fx_done(&f);
}

static void test_update(void **state)
{
    struct fx f;
    struct msum m;

    fx_init(&f, state, NULL);
    assert_int_equal(quota_set(f.q, TH_D "user.a", QUOTA_UNLIMITED,
                               QUOTA_UNLIMITED), STORE_OK);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a", 1000, 2), STORE_OK);
    expect_usage(&f, TH_D "user.a", 1000, 2);
    /* idempotent */
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a", 1000, 2), STORE_OK);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a", 1000, 2), STORE_OK);
    expect_usage(&f, TH_D "user.a", 1000, 2);
    /* absolute values: the root moves by the difference */
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a", 500, 1), STORE_OK);
    expect_usage(&f, TH_D "user.a", 500, 1);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a", 700, 5), STORE_OK);
    expect_usage(&f, TH_D "user.a", 700, 5);
    /* two mailboxes under one root */
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a.x", 300, 3), STORE_OK);
    expect_usage(&f, TH_D "user.a", 1000, 8);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a.x", 100, 1), STORE_OK);
    expect_usage(&f, TH_D "user.a", 800, 6);
    memset(&m, 0, sizeof(m));
    m.root = TH_D "user.a";
    fx_sum_mrecords(&f, &m);
    assert_int_equal(m.n, 2);
    assert_int_equal(m.bytes, 800);
    assert_int_equal(m.msgs, 6);

    /* a crash lost an update: the next report corrects the root */
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a.x", 0, 0), STORE_OK);
    expect_usage(&f, TH_D "user.a", 700, 5);

    /* forget a mailbox; twice is fine */
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a.x", 250, 2), STORE_OK);
    assert_int_equal(quota_remove_mailbox(f.q, TH_D "user.a.x"), STORE_OK);
    expect_usage(&f, TH_D "user.a", 700, 5);
    assert_int_equal(quota_remove_mailbox(f.q, TH_D "user.a.x"), STORE_OK);
    expect_usage(&f, TH_D "user.a", 700, 5);

    /* no root: nothing to account, no record kept */
    assert_int_equal(quota_update_mailbox(f.q, TH_D "shared.x", 5, 5), STORE_OK);
    memset(&m, 0, sizeof(m));
    m.root = TH_D "shared.x";
    fx_sum_mrecords(&f, &m);
    assert_int_equal(m.n, 0);

    /* a root created below moves the mailbox at its next report */
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a.sub.m", 100, 1),
                     STORE_OK);
    expect_usage(&f, TH_D "user.a", 800, 6);
    assert_int_equal(quota_set(f.q, TH_D "user.a.sub", 1000, 100), STORE_OK);
    expect_usage(&f, TH_D "user.a.sub", 0, 0);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a.sub.m", 100, 1),
                     STORE_OK);
    expect_usage(&f, TH_D "user.a", 700, 5);
    expect_usage(&f, TH_D "user.a.sub", 100, 1);
    /* and back up when that root goes */
    assert_int_equal(quota_remove(f.q, TH_D "user.a.sub"), STORE_OK);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a.sub.m", 100, 1),
                     STORE_OK);
    expect_usage(&f, TH_D "user.a", 800, 6);

    /* a mailbox whose root vanished without its M records */
    assert_int_equal(quota_set(f.q, TH_D "user.b", 10, 10), STORE_OK);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.b", 40, 4), STORE_OK);
    fx_raw_store(&f, "M" TH_D "user.b.y", TH_D "user.gone 7 7");
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.b.y", 7, 7), STORE_OK);
    expect_usage(&f, TH_D "user.b", 47, 11);

    assert_int_equal(quota_update_mailbox(f.q, "", 1, 1), STORE_BADNAME);
    fx_done(&f);
}

static void test_remove(void **state)
{
    struct fx f;
    struct msum m;
    struct quota qr;

    fx_init(&f, state, NULL);
    assert_int_equal(quota_remove(f.q, TH_D "user.a"), STORE_NOTFOUND);
    assert_int_equal(quota_set(f.q, TH_D "user", -1, -1), STORE_OK);
    assert_int_equal(quota_set(f.q, TH_D "user.a", -1, -1), STORE_OK);
    /* names that sort between the records of user.a in one order or the
     * other: TH_D "user.a-b" and TH_D "user.ab" belong to root TH_D "user" */
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a", 10, 1), STORE_OK);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a-b", 20, 1), STORE_OK);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a.x", 30, 1), STORE_OK);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.ab", 40, 1), STORE_OK);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a.x.y", 50, 1),
                     STORE_OK);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a.x-y", 60, 1),
                     STORE_OK);
    expect_usage(&f, TH_D "user.a", 150, 4);
    expect_usage(&f, TH_D "user", 60, 2);

    assert_int_equal(quota_remove(f.q, TH_D "user.a"), STORE_OK);
    assert_int_equal(quota_get(f.q, TH_D "user.a", &qr), STORE_NOTFOUND);
    assert_int_equal(quota_remove(f.q, TH_D "user.a"), STORE_NOTFOUND);
    memset(&m, 0, sizeof(m));
    m.root = TH_D "user.a";
    fx_sum_mrecords(&f, &m);
    assert_int_equal(m.n, 0);           /* all four M records went */
    memset(&m, 0, sizeof(m));
    m.root = TH_D "user";
    fx_sum_mrecords(&f, &m);
    assert_int_equal(m.n, 2);           /* the others stayed */
    assert_int_equal(m.bytes, 60);
    expect_usage(&f, TH_D "user", 60, 2);

    /* their next reports count toward TH_D "user" in full */
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a.x", 30, 1), STORE_OK);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a", 10, 1), STORE_OK);
    expect_usage(&f, TH_D "user", 100, 4);
    assert_int_equal(quota_remove_mailbox(f.q, TH_D "user.a"), STORE_OK);
    expect_usage(&f, TH_D "user", 90, 3);
    fx_done(&f);
}

static void test_corrupt(void **state)
{
    struct fx f;
    struct quota qr;
    static const char *const bad[] = {
        "10 x 0 0", "10 5 0", "10 5 0 0 0", "10  5 0 0", "-2 5 0 0",
        "10 5 -1 0", "010 5 0 0", "10 5 0 99999999999999999999", "", " 1 1 1 1",
        NULL
    };
    int i;

    fx_init(&f, state, NULL);
    for (i = 0; bad[i]; i++) {
        fx_raw_store(&f, "R" TH_D "user.z", bad[i]);
        assert_int_equal(quota_get(f.q, TH_D "user.z", &qr), STORE_CORRUPT);
        assert_int_equal(quota_check(f.q, TH_D "user.z.y", 1, 1, NULL),
                         STORE_CORRUPT);
        assert_int_equal(quota_update_mailbox(f.q, TH_D "user.z.y", 1, 1),
                         STORE_CORRUPT);
    }
    /* quota_set repairs it, usage from zero */
    assert_int_equal(quota_set(f.q, TH_D "user.z", 10, 10), STORE_OK);
    expect_usage(&f, TH_D "user.z", 0, 0);
    /* a damaged M record is replaced */
    fx_raw_store(&f, "M" TH_D "user.z", "garbage");
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.z", 10, 1), STORE_OK);
    expect_usage(&f, TH_D "user.z", 10, 1);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.z", 10, 1), STORE_OK);
    expect_usage(&f, TH_D "user.z", 10, 1);
    fx_raw_store(&f, "M" TH_D "user.z", TH_D "user.z 5");
    assert_int_equal(quota_remove_mailbox(f.q, TH_D "user.z"), STORE_OK);
    expect_usage(&f, TH_D "user.z", 10, 1);
    fx_done(&f);
}

/* The whole database as "KEY=VALUE\n" lines, in key order (quota handle
 * closed meanwhile). */
static int dump_cb(void *rock, const char *key, size_t keylen,
                   const char *data, size_t datalen)
{
    struct buf *b = rock;

    buf_append(b, key, keylen);
    buf_putc(b, '=');
    buf_append(b, data, datalen);
    buf_putc(b, '\n');
    return 0;
}

static char *fx_dump(struct fx *f)
{
    struct cyrusdb *db = NULL;
    struct buf b = BUF_INITIALIZER;
    char *path = fx_dbpath(f);

    quota_close(&f->q);
    assert_int_equal(cyrusdb_open(f->backend, path, CYRUSDB_MBOXSORT, &db,
                                  NULL), CYRUSDB_OK);
    assert_int_equal(cyrusdb_foreach(db, "", 0, NULL, dump_cb, &b, NULL),
                     CYRUSDB_OK);
    cyrusdb_close(&db);
    free(path);
    assert_int_equal(quota_open(f->conf, &f->q), STORE_OK);
    buf_putc(&b, '\0');
    return buf_release(&b);
}

#define MANY_MAX 8

struct many_step {
    const char *set_root;      /* quota_set() before the batch, or NULL */
    size_t n;
    const char *names[MANY_MAX];
    uint64_t bytes[MANY_MAX];
    uint64_t msgs[MANY_MAX];
};

/* Batches covering: several mailboxes of one root, several roots, a
 * mailbox without root, a name given twice, unchanged values, a root
 * created below (the mailbox moves), an M record to drop. */
static const struct many_step many_steps[] = {
    { TH_D "user", 6,
      { TH_D "user.a", TH_D "user.a.x", TH_D "user.b", TH_D "user.b.sub.m", TH_D "shared.x", TH_D "user" },
      { 100, 200, 300, 400, 9, 50 }, { 1, 2, 3, 4, 9, 5 } },
    { TH_D "user.b", 5,
      { TH_D "user.a", TH_D "user.b.sub.m", TH_D "user.a", TH_D "user.b", TH_D "user.a.x" },
      { 150, 400, 120, 310, 200 }, { 2, 4, 1, 4, 2 } },
    { TH_D "user.b.sub", 3,
      { TH_D "user.b.sub.m", TH_D "user.b.sub.m", TH_D "user.b.sub" },
      { 400, 0, 7 }, { 4, 0, 1 } },
    { NULL, 4,
      { TH_D "user.a.x", TH_D "user.a", TH_D "user", TH_D "user.b.sub.m" },
      { 200, 120, 50, 1000 }, { 2, 1, 5, 10 } },
};

static char *many_run(void **state, int batched)
{
    struct fx f;
    size_t i, j;
    char *dump;

    fx_init(&f, state, NULL);
    for (i = 0; i < sizeof(many_steps) / sizeof(many_steps[0]); i++) {
        const struct many_step *st = &many_steps[i];

        if (st->set_root)
            assert_int_equal(quota_set(f.q, st->set_root, 1000, 100),
                             STORE_OK);
        if (batched) {
            assert_int_equal(quota_update_many(f.q, st->names, st->bytes,
                                               st->msgs, st->n), STORE_OK);
        } else {
            for (j = 0; j < st->n; j++)
                assert_int_equal(quota_update_mailbox(f.q, st->names[j],
                                                      st->bytes[j],
                                                      st->msgs[j]),
                                 STORE_OK);
        }
    }
    /* last step's view, through the API */
    expect_usage(&f, TH_D "user", 50 + 120 + 200, 5 + 1 + 2);
    expect_usage(&f, TH_D "user.b", 310, 4);
    expect_usage(&f, TH_D "user.b.sub", 1000 + 7, 10 + 1);
    dump = fx_dump(&f);
    fx_done(&f);
    return dump;
}

static void test_update_many(void **state)
{
    char *batched = many_run(state, 1);
    char *single = many_run(state, 0);
    struct fx f;
    struct msum m;
    const char *names[3] = { TH_D "user.a", TH_D "user.z.y", TH_D "user.a.x" };
    uint64_t bytes[3] = { 1, 2, 3 }, msgs[3] = { 1, 1, 1 };
    const char *bad[2] = { TH_D "user.a", "" };
    char *before, *after;

    /* the same database, byte for byte, as the single updates */
    assert_string_equal(batched, single);
    assert_non_null(strstr(batched, "M" TH_D "user.a=" TH_D "user 120 1\n"));
    assert_null(strstr(batched, "M" TH_D "shared.x="));
    free(batched);
    free(single);

    /* all or nothing: one damaged root fails the whole batch */
    fx_init(&f, state, NULL);
    assert_int_equal(quota_update_many(f.q, names, bytes, msgs, 0),
                     STORE_OK);
    assert_int_equal(quota_set(f.q, TH_D "user.a", -1, -1), STORE_OK);
    assert_int_equal(quota_set(f.q, TH_D "user.z", -1, -1), STORE_OK);
    assert_int_equal(quota_update_mailbox(f.q, TH_D "user.a", 10, 1), STORE_OK);
    fx_raw_store(&f, "R" TH_D "user.z", "garbage");
    before = fx_dump(&f);
    assert_int_equal(quota_update_many(f.q, names, bytes, msgs, 3),
                     STORE_CORRUPT);
    after = fx_dump(&f);
    assert_string_equal(before, after);
    free(after);
    /* a bad name anywhere: nothing done */
    assert_int_equal(quota_update_many(f.q, bad, bytes, msgs, 2),
                     STORE_BADNAME);
    after = fx_dump(&f);
    assert_string_equal(before, after);
    free(after);
    free(before);
    expect_usage(&f, TH_D "user.a", 10, 1);
    /* repaired, the same batch goes through whole */
    assert_int_equal(quota_set(f.q, TH_D "user.z", -1, -1), STORE_OK);
    assert_int_equal(quota_update_many(f.q, names, bytes, msgs, 3),
                     STORE_OK);
    expect_usage(&f, TH_D "user.a", 1 + 3, 2);
    expect_usage(&f, TH_D "user.z", 2, 1);
    memset(&m, 0, sizeof(m));
    m.root = TH_D "user.a";
    fx_sum_mrecords(&f, &m);
    assert_int_equal(m.n, 2);
    assert_int_equal(m.bytes, 4);
    fx_done(&f);
}

/* ---- concurrency -------------------------------------------------------- */

#define CONC_PROCS 4
#define CONC_OPS 200

/* A child: 200 random changes to its two mailboxes, each reported with
 * quota_update_mailbox; the final totals go to the parent over fd. */
static int conc_child(const struct imapconf *conf, int idx, int fd)
{
    struct quota_db *q = NULL;
    uint64_t bytes[2] = { 0, 0 }, msgs[2] = { 0, 0 };
    unsigned seed = 12345u + (unsigned)idx * 7919u;
    char name[2][64];
    char line[128];
    int i, n, r;

    for (i = 0; i < 2; i++)
        snprintf(name[i], sizeof(name[i]), TH_D "user.c.p%d.m%d", idx, i);
    if (quota_open(conf, &q) != STORE_OK)
        return 2;
    for (i = 0; i < CONC_OPS; i++) {
        int mb, delta_b, delta_m;
        seed = seed * 1103515245u + 12345u;
        mb = (int)((seed >> 16) & 1);
        delta_b = (int)((seed >> 8) % 2001) - 900;   /* -900 .. +1100 */
        delta_m = (int)((seed >> 4) % 5) - 2;        /* -2 .. +2 */
        if (delta_b < 0 && (uint64_t)-delta_b > bytes[mb])
            delta_b = -(int)bytes[mb];
        if (delta_m < 0 && (uint64_t)-delta_m > msgs[mb])
            delta_m = -(int)msgs[mb];
        bytes[mb] = (uint64_t)((int64_t)bytes[mb] + delta_b);
        msgs[mb] = (uint64_t)((int64_t)msgs[mb] + delta_m);
        r = quota_update_mailbox(q, name[mb], bytes[mb], msgs[mb]);
        if (r != STORE_OK) {
            fprintf(stderr, "child %d: update %d: %s\n", idx, i,
                    store_strerror(r));
            quota_close(&q);
            return 3;
        }
    }
    quota_close(&q);
    n = snprintf(line, sizeof(line), "%llu %llu\n",
                 (unsigned long long)(bytes[0] + bytes[1]),
                 (unsigned long long)(msgs[0] + msgs[1]));
    if (write(fd, line, (size_t)n) != n)
        return 4;
    return 0;
}

static void test_concurrent(void **state)
{
    struct fx f;
    struct msum m;
    pid_t pids[CONC_PROCS];
    int fds[CONC_PROCS];
    uint64_t want_b = 0, want_m = 0;
    int i;

    fx_init(&f, state, NULL);
    assert_int_equal(quota_set(f.q, TH_D "user.c", QUOTA_UNLIMITED, 1000000),
                     STORE_OK);
    quota_close(&f.q);    /* children open their own, after fork */
    for (i = 0; i < CONC_PROCS; i++) {
        int p[2];
        assert_int_equal(pipe(p), 0);
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            th_child_signals();
            close(p[0]);
            _exit(conc_child(f.conf, i, p[1]));
        }
        close(p[1]);
        fds[i] = p[0];
    }
    for (i = 0; i < CONC_PROCS; i++) {
        char line[128], st[64];
        ssize_t n;
        size_t got = 0;
        unsigned long long b, c;
        int status;

        while ((n = read(fds[i], line + got, sizeof(line) - 1 - got)) > 0)
            got += (size_t)n;
        line[got] = '\0';
        close(fds[i]);
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail_msg("child %d: %s", i,
                     th_status_text(status, st, sizeof(st)));
        assert_int_equal(sscanf(line, "%llu %llu", &b, &c), 2);
        want_b += b;
        want_m += c;
    }
    assert_int_equal(quota_open(f.conf, &f.q), STORE_OK);
    expect_usage(&f, TH_D "user.c", want_b, want_m);
    memset(&m, 0, sizeof(m));
    m.root = TH_D "user.c";
    fx_sum_mrecords(&f, &m);
    assert_int_equal(m.n, 2 * CONC_PROCS);
    assert_int_equal(m.bytes, want_b);
    assert_int_equal(m.msgs, want_m);
    fx_done(&f);
}

/* ---- store.c: codes and shared helpers (pure, run once) ---------------- */

static void test_store_codes(void **state)
{
    int r;

    (void)state;
    for (r = STORE_OK; r <= STORE_INTERNAL + 1; r++) {
        assert_non_null(store_strerror(r));
        assert_true(store_strerror(r)[0] != '\0');
    }
    assert_string_not_equal(store_strerror(STORE_NOTFOUND),
                            store_strerror(STORE_BUSY));
    /* 4xx versus 5xx */
    assert_false(store_is_temporary(STORE_NOTFOUND));
    assert_false(store_is_temporary(STORE_EXISTS));
    assert_false(store_is_temporary(STORE_BADNAME));
    assert_false(store_is_temporary(STORE_PERMISSION));
    assert_false(store_is_temporary(STORE_TOOBIG));
    assert_false(store_is_temporary(STORE_BADMESSAGE));
    assert_true(store_is_temporary(STORE_BUSY));
    assert_true(store_is_temporary(STORE_IOERROR));
    assert_true(store_is_temporary(STORE_NOSPACE));
    assert_true(store_is_temporary(STORE_CORRUPT));
    assert_true(store_is_temporary(STORE_NOMEM));
    assert_true(store_is_temporary(STORE_INTERNAL));
    assert_true(store_is_temporary(STORE_OVERQUOTA));
    assert_true(store_is_temporary(9999));
    /* cyrusdb */
    assert_int_equal(store_from_cyrusdb(CYRUSDB_OK), STORE_OK);
    assert_int_equal(store_from_cyrusdb(CYRUSDB_NOTFOUND), STORE_NOTFOUND);
    assert_int_equal(store_from_cyrusdb(CYRUSDB_EXISTS), STORE_EXISTS);
    assert_int_equal(store_from_cyrusdb(CYRUSDB_AGAIN), STORE_BUSY);
    assert_int_equal(store_from_cyrusdb(CYRUSDB_LOCKED), STORE_BUSY);
    assert_int_equal(store_from_cyrusdb(CYRUSDB_FULL), STORE_NOSPACE);
    assert_int_equal(store_from_cyrusdb(CYRUSDB_IOERROR), STORE_IOERROR);
    assert_int_equal(store_from_cyrusdb(CYRUSDB_INTERNAL), STORE_IOERROR);
    assert_int_equal(store_from_cyrusdb(CYRUSDB_BADFORMAT), STORE_IOERROR);
    /* errno */
    assert_int_equal(store_from_errno(ENOSPC), STORE_NOSPACE);
    assert_int_equal(store_from_errno(EDQUOT), STORE_NOSPACE);
    assert_int_equal(store_from_errno(ENOMEM), STORE_NOMEM);
    assert_int_equal(store_from_errno(ENOENT), STORE_NOTFOUND);
    assert_int_equal(store_from_errno(EEXIST), STORE_EXISTS);
    assert_int_equal(store_from_errno(EAGAIN), STORE_BUSY);
    assert_int_equal(store_from_errno(EWOULDBLOCK), STORE_BUSY);
    assert_int_equal(store_from_errno(EINTR), STORE_BUSY);
    assert_int_equal(store_from_errno(EIO), STORE_IOERROR);
    assert_int_equal(store_from_errno(EACCES), STORE_IOERROR);
}

static void test_store_parse(void **state)
{
    static const char *const bad[] = {
        "", "-1", "+1", " 1", "1 ", "01", "00", "1a", "0x10",
        "18446744073709551616", "99999999999999999999", "123456789012345678901",
        NULL
    };
    uint64_t v;
    int i;

    (void)state;
    assert_int_equal(store_parse_u64("0", 1, 10, &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(store_parse_u64("10", 2, 10, &v), 0);
    assert_int_equal(v, 10);
    assert_int_equal(store_parse_u64("11", 2, 10, &v), -1);
    assert_int_equal(store_parse_u64("18446744073709551615", 20, UINT64_MAX,
                                     &v), 0);
    assert_true(v == UINT64_MAX);
    /* only the bytes given count */
    assert_int_equal(store_parse_u64("123xyz", 3, 1000, &v), 0);
    assert_int_equal(v, 123);
    for (i = 0; bad[i]; i++) {
        v = 77;
        if (store_parse_u64(bad[i], strlen(bad[i]), UINT64_MAX, &v) != -1)
            fail_msg("<%s> parsed", bad[i]);
        assert_int_equal(v, 77);
    }
}

static const struct th_case cases[] = {
    { "set_get", test_set_get },
    { "findroot", test_findroot },
    { "findroot_domains", test_findroot_domains },
    { "check", test_check },
    { "update", test_update },
    { "update_many", test_update_many },
    { "remove", test_remove },
    { "corrupt", test_corrupt },
    { "concurrent", test_concurrent },
};

int main(void)
{
    const struct CMUnitTest pure[] = {
        cmocka_unit_test(test_store_codes),
        cmocka_unit_test(test_store_parse),
    };
    int rc;

    log_init("test_quota", getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
    rc = cmocka_run_group_tests_name("store", pure, NULL, NULL);
    rc += th_run_per_backend("quota", cases,
                             sizeof(cases) / sizeof(cases[0]));
    return rc;
}
