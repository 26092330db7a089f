/*
 * test_duplicate.c - the duplicate delivery database (store/duplicate.c)
 * against every cyrusdb backend: check, mark and re-mark; records naming
 * their copy (the long form) and damaged ones of that form; ids and
 * mailboxes that cannot be tracked; prune by age with controlled times
 * (records marked with old `when` values) and its counts; damaged
 * records; a 20,000-record prune within a time bound; a prune racing
 * a process that marks records again, which must never lose a fresh mark;
 * and a damaged deliver.db (garbage written over it), which is set aside
 * for a fresh one, also when two processes find it at the same moment.
 *
 * Large data sets are loaded through cyrusdb in one transaction with the
 * documented record format (ID NUL MAILBOX -> "TIME UID"), with the
 * duplicate handle closed meanwhile.
 */
#include "config.h"

#include <dirent.h>
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
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "store/duplicate.h"
#include "store/store.h"
#include "tests/testhelp.h"

#define DAY 86400

struct fx {
    const char *backend;
    char *dir;
    struct imapconf *conf;
    struct duplicate_db *d;
};

static void fx_init(struct fx *f, void **state)
{
    memset(f, 0, sizeof(*f));
    f->backend = *state;
    f->dir = th_mkdtemp("duplicate");
    assert_non_null(f->dir);
    f->conf = th_store_conf(f->dir, f->backend, NULL);
    assert_int_equal(duplicate_open(f->conf, &f->d), STORE_OK);
    assert_non_null(f->d);
}

static void fx_done(struct fx *f)
{
    duplicate_close(&f->d);
    assert_null(f->d);
    imapconf_free(&f->conf);
    th_rmrf(f->dir);
    free(f->dir);
}

#define ID(s) (s), (sizeof(s) - 1)

static void expect_dup(struct fx *f, const char *id, size_t idlen,
                       const char *mbox, time_t when, uint32_t uid)
{
    time_t t = (time_t)-7;
    uint32_t u = 0xdeadbeef;

    assert_int_equal(duplicate_check(f->d, id, idlen, mbox, &t, &u), STORE_OK);
    assert_int_equal(t, when);
    assert_int_equal(u, uid);
}

static void expect_none(struct fx *f, const char *id, size_t idlen,
                        const char *mbox)
{
    time_t t = (time_t)-7;
    uint32_t u = 0xdeadbeef;

    assert_int_equal(duplicate_check(f->d, id, idlen, mbox, &t, &u),
                     STORE_NOTFOUND);
}

/* How many records are there?  (A prune that keeps everything counts.) */
static unsigned long count_records(struct fx *f)
{
    unsigned long pruned = 99, kept = 99;

    assert_int_equal(duplicate_prune(f->d, 3650, &pruned, &kept), STORE_OK);
    assert_int_equal(pruned, 0);
    return kept;
}

/* Load n records "<msg-I@test>" NUL TH_D "user.x" -> "when(I) I" in one
 * transaction; when(I) = old for I % 4 != 0, fresh otherwise. */
static void load_records(struct fx *f, unsigned n, time_t old, time_t fresh)
{
    struct cyrusdb *db = NULL;
    struct cyrusdb_txn *tid = NULL;
    char *conf = th_path(f->dir, "conf");
    char *path = th_path(conf, DUPLICATE_FNAME);
    char key[64], val[64];
    unsigned i;

    duplicate_close(&f->d);
    assert_int_equal(cyrusdb_open(f->backend, path, CYRUSDB_CREATE, &db, NULL),
                     CYRUSDB_OK);
    for (i = 0; i < n; i++) {
        int kl = snprintf(key, sizeof(key), "<msg-%u@test>", i);
        int vl = snprintf(val, sizeof(val), "%lld %u",
                          (long long)(i % 4 ? old : fresh), i);
        memcpy(key + kl, "\0" TH_D "user.x", sizeof("\0" TH_D "user.x") - 1);
        kl += (int)sizeof("\0" TH_D "user.x") - 1;
        assert_int_equal(cyrusdb_store(db, key, (size_t)kl, val, (size_t)vl,
                                       &tid), CYRUSDB_OK);
    }
    assert_int_equal(cyrusdb_commit(db, tid), CYRUSDB_OK);
    cyrusdb_close(&db);
    free(path);
    free(conf);
    assert_int_equal(duplicate_open(f->conf, &f->d), STORE_OK);
}

/* ---- cases -------------------------------------------------------------- */

static void test_check_mark(void **state)
{
    struct fx f;
    time_t t;

    fx_init(&f, state);
    expect_none(&f, ID("<a@b>"), TH_D "user.a");
    assert_int_equal(duplicate_mark(f.d, ID("<a@b>"), TH_D "user.a", 1000, 5),
                     STORE_OK);
    expect_dup(&f, ID("<a@b>"), TH_D "user.a", 1000, 5);
    /* uid_r may be NULL */
    t = 0;
    assert_int_equal(duplicate_check(f.d, ID("<a@b>"), TH_D "user.a", &t, NULL),
                     STORE_OK);
    assert_int_equal(t, 1000);
    /* other mailbox, prefix ids, longer mailbox: all distinct */
    expect_none(&f, ID("<a@b>"), TH_D "user.b");
    expect_none(&f, ID("<a@b"), TH_D "user.a");
    expect_none(&f, ID("<a@b>x"), TH_D "user.a");
    expect_none(&f, ID("<a@b>"), TH_D "user.a.x");
    /* re-mark replaces */
    assert_int_equal(duplicate_mark(f.d, ID("<a@b>"), TH_D "user.a", 2000, 6),
                     STORE_OK);
    expect_dup(&f, ID("<a@b>"), TH_D "user.a", 2000, 6);
    assert_int_equal(duplicate_mark(f.d, ID("<a@b>"), TH_D "user.b", 3000, 0),
                     STORE_OK);
    expect_dup(&f, ID("<a@b>"), TH_D "user.b", 3000, 0);
    expect_dup(&f, ID("<a@b>"), TH_D "user.a", 2000, 6);
    /* big values round-trip */
    assert_int_equal(duplicate_mark(f.d, ID("<big@x>"), TH_D "user.a",
                                    (time_t)4102444800LL, UINT32_MAX),
                     STORE_OK);
    expect_dup(&f, ID("<big@x>"), TH_D "user.a", (time_t)4102444800LL, UINT32_MAX);
    assert_int_equal(duplicate_mark(f.d, ID("<neg@x>"), TH_D "user.a", -1, 1),
                     STORE_INTERNAL);
    expect_none(&f, ID("<neg@x>"), TH_D "user.a");

    /* survives a reopen */
    duplicate_close(&f.d);
    assert_int_equal(duplicate_open(f.conf, &f.d), STORE_OK);
    expect_dup(&f, ID("<a@b>"), TH_D "user.a", 2000, 6);
    fx_done(&f);
}

static void test_mark_many(void **state)
{
    static const char *const boxes[] = { TH_D "user.a", TH_D "user.b", TH_D "user.c.d" };
    static const uint32_t uids[] = { 7, 8, 9 };
    const char *bad[2];
    uint32_t baduids[2] = { 1, 2 };
    char longbox[600];
    struct fx f;

    fx_init(&f, state);
    assert_int_equal(duplicate_mark_many(f.d, ID("<m@x>"), boxes, uids, 3,
                                         5000), STORE_OK);
    expect_dup(&f, ID("<m@x>"), TH_D "user.a", 5000, 7);
    expect_dup(&f, ID("<m@x>"), TH_D "user.b", 5000, 8);
    expect_dup(&f, ID("<m@x>"), TH_D "user.c.d", 5000, 9);
    expect_none(&f, ID("<m@x>"), TH_D "user.c");
    /* nothing to do is fine */
    assert_int_equal(duplicate_mark_many(f.d, ID("<m@x>"), boxes, uids, 0,
                                         5000), STORE_OK);
    /* an untrackable mailbox is skipped, the other one recorded */
    memset(longbox, 'x', sizeof(longbox) - 1);
    longbox[sizeof(longbox) - 1] = '\0';
    bad[0] = longbox;
    bad[1] = TH_D "user.e";
    assert_int_equal(duplicate_mark_many(f.d, ID("<n@x>"), bad, baduids, 2,
                                         6000), STORE_OK);
    expect_dup(&f, ID("<n@x>"), TH_D "user.e", 6000, 2);
    /* a negative time records nothing */
    assert_int_equal(duplicate_mark_many(f.d, ID("<o@x>"), boxes, uids, 3, -1),
                     STORE_INTERNAL);
    expect_none(&f, ID("<o@x>"), TH_D "user.a");
    fx_done(&f);
}

struct fx_seen {
    unsigned n;
    unsigned named;
    time_t when;
    uint32_t uid;
};

static int fx_seen_cb(void *rock, const char *id, size_t idlen,
                      const char *mailbox, size_t mboxlen, time_t when,
                      uint32_t uid, const struct duplicate_copy *copy)
{
    struct fx_seen *s = rock;

    s->named += copy != NULL;
    (void)id;
    (void)idlen;
    (void)mailbox;
    (void)mboxlen;
    s->n++;
    s->when = when;
    s->uid = uid;
    return 0;
}

/* Records naming their copy (deliveries): written in one transaction,
 * read back with every field, read as plain records by duplicate_check()
 * (Sieve), handed to duplicate_foreach()'s callback with their copy (a
 * move's dump carries it), pruned by age; a plain record reads as not
 * naming a copy. */
static void test_copies(void **state)
{
    static const char *const boxes[] = { TH_D "user.a", TH_D "user.b" };
    struct duplicate_copy c[2], got;
    struct fx_seen seen = { 0, 0, 0, 0 };
    unsigned long pruned = 0, kept = 0;
    time_t t = 0, now = time(NULL);
    int named = -1, i;
    struct fx f;

    fx_init(&f, state);
    memset(c, 0, sizeof(c));
    for (i = 0; i < DUPLICATE_GUID_LEN; i++) {
        c[0].guid[i] = (unsigned char)(i * 13 + 1);
        c[1].guid[i] = (unsigned char)(255 - i);
    }
    c[0].uid = 7;
    c[0].uidvalidity = 4000000000u;
    c[1].uid = 1;
    c[1].uidvalidity = 1;
    assert_int_equal(duplicate_mark_copies(f.d, ID("<c@x>"), boxes, c, 2,
                                           now), STORE_OK);
    for (i = 0; i < 2; i++) {
        memset(&got, 0, sizeof(got));
        assert_int_equal(duplicate_check_copy(f.d, ID("<c@x>"), boxes[i], &t,
                                              &named, &got), STORE_OK);
        assert_int_equal(named, 1);
        assert_int_equal(t, now);
        assert_int_equal(got.uid, c[i].uid);
        assert_int_equal(got.uidvalidity, c[i].uidvalidity);
        assert_memory_equal(got.guid, c[i].guid, DUPLICATE_GUID_LEN);
    }
    expect_dup(&f, ID("<c@x>"), TH_D "user.a", now, 7);
    /* a plain record names no copy */
    assert_int_equal(duplicate_mark(f.d, ID("<p@x>"), TH_D "user.a", now, 3),
                     STORE_OK);
    assert_int_equal(duplicate_check_copy(f.d, ID("<p@x>"), TH_D "user.a",
                                          &t, &named, &got), STORE_OK);
    assert_int_equal(named, 0);
    assert_int_equal(got.uid, 3);
    assert_int_equal(duplicate_check_copy(f.d, ID("<none@x>"), TH_D "user.a",
                                          &t, &named, &got), STORE_NOTFOUND);
    assert_int_equal(named, 0);
    assert_int_equal(duplicate_foreach(f.d, fx_seen_cb, &seen), STORE_OK);
    assert_int_equal(seen.n, 3);
    assert_int_equal(seen.named, 2);
    /* old records of the long form go by age as the others */
    assert_int_equal(duplicate_mark_copies(f.d, ID("<old@x>"), boxes, c, 1,
                                           now - 10 * 86400), STORE_OK);
    assert_int_equal(duplicate_prune(f.d, 3, &pruned, &kept), STORE_OK);
    assert_int_equal(pruned, 1);
    assert_int_equal(kept, 3);
    /* a negative time records nothing */
    assert_int_equal(duplicate_mark_copies(f.d, ID("<n@x>"), boxes, c, 2, -1),
                     STORE_INTERNAL);
    expect_none(&f, ID("<n@x>"), TH_D "user.a");
    fx_done(&f);
}

static void test_bad_ids(void **state)
{
    struct fx f;
    char id[DUPLICATE_ID_MAX + 2];
    char mbox[DUPLICATE_KEY_MAX + 2];
    time_t now = time(NULL);

    fx_init(&f, state);
    memset(id, 'i', sizeof(id));
    id[0] = '<';
    memset(mbox, 'm', sizeof(mbox));
    mbox[sizeof(mbox) - 1] = '\0';

    /* empty: not tracked */
    assert_int_equal(duplicate_mark(f.d, "", 0, TH_D "user.a", now, 1), STORE_OK);
    expect_none(&f, "", 0, TH_D "user.a");
    /* exactly the maximum: tracked */
    assert_int_equal(duplicate_mark(f.d, id, DUPLICATE_ID_MAX, TH_D "user.a", now,
                                    2), STORE_OK);
    expect_dup(&f, id, DUPLICATE_ID_MAX, TH_D "user.a", now, 2);
    /* one more: not tracked, and not confused with the shorter one */
    assert_int_equal(duplicate_mark(f.d, id, DUPLICATE_ID_MAX + 1, TH_D "user.a",
                                    now, 3), STORE_OK);
    expect_none(&f, id, DUPLICATE_ID_MAX + 1, TH_D "user.a");
    /* a NUL inside the id: not tracked */
    assert_int_equal(duplicate_mark(f.d, ID("<a\0b>"), TH_D "user.a", now, 4),
                     STORE_OK);
    expect_none(&f, ID("<a\0b>"), TH_D "user.a");
    expect_none(&f, ID("<a"), TH_D "user.a");
    /* mailbox empty or too long: not tracked */
    assert_int_equal(duplicate_mark(f.d, ID("<m@x>"), "", now, 5), STORE_OK);
    expect_none(&f, ID("<m@x>"), "");
    assert_int_equal(duplicate_mark(f.d, ID("<m@x>"), mbox, now, 6), STORE_OK);
    expect_none(&f, ID("<m@x>"), mbox);
    /* the longest key: id + NUL + mailbox = DUPLICATE_KEY_MAX */
    mbox[DUPLICATE_KEY_MAX - 6] = '\0';
    assert_int_equal(duplicate_mark(f.d, ID("<m@x>"), mbox, now, 7), STORE_OK);
    expect_dup(&f, ID("<m@x>"), mbox, now, 7);
    /* one byte more, or the longest id with a long mailbox: not tracked */
    assert_int_equal(duplicate_mark(f.d, ID("<m@xy>"), mbox, now, 8),
                     STORE_OK);
    expect_none(&f, ID("<m@xy>"), mbox);
    mbox[DUPLICATE_KEY_MAX - DUPLICATE_ID_MAX - 1] = '\0';
    assert_int_equal(duplicate_mark(f.d, id, DUPLICATE_ID_MAX, mbox, now, 9),
                     STORE_OK);
    expect_dup(&f, id, DUPLICATE_ID_MAX, mbox, now, 9);
    mbox[DUPLICATE_KEY_MAX - DUPLICATE_ID_MAX - 1] = 'm';
    mbox[DUPLICATE_KEY_MAX - DUPLICATE_ID_MAX] = '\0';
    assert_int_equal(duplicate_mark(f.d, id, DUPLICATE_ID_MAX, mbox, now, 10),
                     STORE_OK);
    expect_none(&f, id, DUPLICATE_ID_MAX, mbox);

    assert_int_equal(count_records(&f), 3);
    fx_done(&f);
}

static void test_prune(void **state)
{
    struct fx f;
    time_t now = time(NULL);
    unsigned long pruned = 99, kept = 99;
    char id[32];
    int i, n;

    fx_init(&f, state);
    for (i = 0; i < 5; i++) {
        n = snprintf(id, sizeof(id), "<old-%d>", i);
        assert_int_equal(duplicate_mark(f.d, id, (size_t)n, TH_D "user.a",
                                        now - 10 * DAY, (uint32_t)i),
                         STORE_OK);
    }
    for (i = 0; i < 3; i++) {
        n = snprintf(id, sizeof(id), "<mid-%d>", i);
        assert_int_equal(duplicate_mark(f.d, id, (size_t)n, TH_D "user.a",
                                        now - 2 * DAY, (uint32_t)i),
                         STORE_OK);
    }
    for (i = 0; i < 2; i++) {
        n = snprintf(id, sizeof(id), "<new-%d>", i);
        assert_int_equal(duplicate_mark(f.d, id, (size_t)n, TH_D "user.a",
                                        now + DAY, (uint32_t)i), STORE_OK);
    }
    /* re-marking an old one makes it fresh */
    assert_int_equal(duplicate_mark(f.d, ID("<old-4>"), TH_D "user.a", now, 44),
                     STORE_OK);

    assert_int_equal(duplicate_prune(f.d, 5, &pruned, &kept), STORE_OK);
    assert_int_equal(pruned, 4);
    assert_int_equal(kept, 6);
    expect_none(&f, ID("<old-0>"), TH_D "user.a");
    expect_none(&f, ID("<old-3>"), TH_D "user.a");
    expect_dup(&f, ID("<old-4>"), TH_D "user.a", now, 44);
    expect_dup(&f, ID("<mid-2>"), TH_D "user.a", now - 2 * DAY, 2);

    /* again: nothing more */
    assert_int_equal(duplicate_prune(f.d, 5, &pruned, &kept), STORE_OK);
    assert_int_equal(pruned, 0);
    assert_int_equal(kept, 6);
    /* NULL counters allowed */
    assert_int_equal(duplicate_prune(f.d, 5, NULL, NULL), STORE_OK);

    assert_int_equal(duplicate_prune(f.d, 1, &pruned, &kept), STORE_OK);
    assert_int_equal(pruned, 3);
    assert_int_equal(kept, 3);
    expect_none(&f, ID("<mid-0>"), TH_D "user.a");
    /* days 0: everything before now goes, the future stays */
    assert_int_equal(duplicate_mark(f.d, ID("<past>"), TH_D "user.a", now - 10, 1),
                     STORE_OK);
    assert_int_equal(duplicate_prune(f.d, 0, &pruned, &kept), STORE_OK);
    assert_int_equal(pruned >= 1 && pruned <= 2, 1);   /* "<old-4>" at now */
    assert_int_equal(pruned + kept, 4);
    expect_none(&f, ID("<past>"), TH_D "user.a");
    expect_dup(&f, ID("<new-1>"), TH_D "user.a", now + DAY, 1);

    assert_int_equal(duplicate_prune(f.d, -1, &pruned, &kept), STORE_INTERNAL);
    fx_done(&f);
}

static void test_damaged(void **state)
{
    struct fx f;
    struct cyrusdb *db = NULL;
    char *conf, *path;
    unsigned long pruned = 99, kept = 99;
    time_t now = time(NULL);
    static const char *const bad[] = {
        "", "x", "12", "12 ", " 12 3", "12 3 4", "12 -3", "12 4294967296",
        "012 3", "-5 3",
        /* the long form: GUID of 39, 41 digits, upper case, not hex; a
         * fifth field; uidvalidity out of range */
        "12 3 4 0123456789abcdef0123456789abcdef0123456",
        "12 3 4 0123456789abcdef0123456789abcdef012345678",
        "12 3 4 0123456789ABCDEF0123456789abcdef01234567",
        "12 3 4 0123456789abcdefg123456789abcdef01234567",
        "12 3 4 0123456789abcdef0123456789abcdef01234567 5",
        "12 3 4294967296 0123456789abcdef0123456789abcdef01234567",
        NULL
    };
    char key[32];
    int i, kl;

    fx_init(&f, state);
    assert_int_equal(duplicate_mark(f.d, ID("<good>"), TH_D "user.a", now, 1),
                     STORE_OK);
    duplicate_close(&f.d);
    conf = th_path(f.dir, "conf");
    path = th_path(conf, DUPLICATE_FNAME);
    assert_int_equal(cyrusdb_open(f.backend, path, 0, &db, NULL), CYRUSDB_OK);
    for (i = 0; bad[i]; i++) {
        kl = snprintf(key, sizeof(key), "<bad-%d>", i);
        memcpy(key + kl, "\0user.a", 7);
        assert_int_equal(cyrusdb_store(db, key, (size_t)kl + 7, bad[i],
                                       strlen(bad[i]), NULL), CYRUSDB_OK);
    }
    /* a key without the NUL separator is not ours either */
    assert_int_equal(cyrusdb_store(db, "nonul", 5, "1 1", 3, NULL),
                     CYRUSDB_OK);
    cyrusdb_close(&db);
    free(path);
    free(conf);
    assert_int_equal(duplicate_open(f.conf, &f.d), STORE_OK);

    for (i = 0; bad[i]; i++) {
        kl = snprintf(key, sizeof(key), "<bad-%d>", i);
        expect_none(&f, key, (size_t)kl, TH_D "user.a");   /* read as absent */
    }
    assert_int_equal(duplicate_prune(f.d, 3, &pruned, &kept), STORE_OK);
    assert_int_equal(pruned, 17);
    assert_int_equal(kept, 1);
    expect_dup(&f, ID("<good>"), TH_D "user.a", now, 1);
    fx_done(&f);
}

#define BIG 20000

static void test_prune_big(void **state)
{
    struct fx f;
    time_t now = time(NULL);
    unsigned long pruned = 0, kept = 0;
    double t0, t1, t_load;
    char id[32];
    int n;

    fx_init(&f, state);
    t0 = th_now();
    load_records(&f, BIG, now - 30 * DAY, now - DAY);
    t_load = th_now() - t0;
    t0 = th_now();
    assert_int_equal(duplicate_prune(f.d, 3, &pruned, &kept), STORE_OK);
    t1 = th_now();
    assert_int_equal(pruned, BIG / 4 * 3);
    assert_int_equal(kept, BIG / 4);
    /* measured against the load of the same records (one transaction)
     * on this machine, in this build: a prune that costs a sync or a
     * rewrite per record is far beyond, a loaded machine slows both */
    print_message("prune of %d records: %.3f s, their load %.3f s\n", BIG,
                  t1 - t0, t_load);
    if (t1 - t0 > 1.0 + 20 * t_load)
        fail_msg("prune of %d records took %.2f s, more than 20 times "
                 "their load (%.2f s)", BIG, t1 - t0, t_load);
    n = snprintf(id, sizeof(id), "<msg-%u@test>", 0u);
    expect_dup(&f, id, (size_t)n, TH_D "user.x", now - DAY, 0);
    n = snprintf(id, sizeof(id), "<msg-%u@test>", (unsigned)BIG - 4);
    expect_dup(&f, id, (size_t)n, TH_D "user.x", now - DAY, BIG - 4);
    n = snprintf(id, sizeof(id), "<msg-%u@test>", 1u);
    expect_none(&f, id, (size_t)n, TH_D "user.x");
    n = snprintf(id, sizeof(id), "<msg-%u@test>", (unsigned)BIG - 1);
    expect_none(&f, id, (size_t)n, TH_D "user.x");
    assert_int_equal(count_records(&f), BIG / 4);
    fx_done(&f);
}

/* While the parent prunes, a child marks old records again (with the
 * current time); every record it marked must survive. */
#define RACE_N 4000
#define RACE_MARK 1200

static void test_prune_race(void **state)
{
    struct fx f;
    time_t now = time(NULL);
    unsigned long pruned = 0, kept = 0;
    pid_t pid;
    int status, i, p[2];
    char st[64], c;

    fx_init(&f, state);
    load_records(&f, RACE_N, now - 30 * DAY, now - DAY);
    duplicate_close(&f.d);
    assert_int_equal(pipe(p), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct duplicate_db *d = NULL;
        char id[32];
        int n, rc = 0;

        th_child_signals();
        close(p[0]);
        if (duplicate_open(f.conf, &d) != STORE_OK)
            _exit(2);
        if (write(p[1], "g", 1) != 1)
            _exit(3);
        for (i = 0; i < RACE_MARK && !rc; i++) {
            /* only the old ones: I % 4 != 0 */
            unsigned k = (unsigned)(i / 3) * 4u + (unsigned)(i % 3) + 1u;
            n = snprintf(id, sizeof(id), "<msg-%u@test>", k);
            if (duplicate_mark(d, id, (size_t)n, TH_D "user.x", time(NULL),
                               900000u + k) != STORE_OK)
                rc = 4;
        }
        duplicate_close(&d);
        _exit(rc);
    }
    close(p[1]);
    assert_int_equal(read(p[0], &c, 1), 1);   /* the child is running */
    close(p[0]);
    assert_int_equal(duplicate_open(f.conf, &f.d), STORE_OK);
    assert_int_equal(duplicate_prune(f.d, 3, &pruned, &kept), STORE_OK);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("child: %s", th_status_text(status, st, sizeof(st)));
    for (i = 0; i < RACE_MARK; i++) {
        unsigned k = (unsigned)(i / 3) * 4u + (unsigned)(i % 3) + 1u;
        char id[32];
        time_t t = 0;
        uint32_t uid = 0;
        int n = snprintf(id, sizeof(id), "<msg-%u@test>", k);
        int r = duplicate_check(f.d, id, (size_t)n, TH_D "user.x", &t, &uid);
        if (r != STORE_OK)
            fail_msg("fresh mark of %s lost by prune", id);
        assert_int_equal(uid, 900000u + k);
    }
    /* everything old the child did not touch is gone */
    assert_int_equal(count_records(&f), RACE_N / 4 + RACE_MARK);
    fx_done(&f);
}

/* ---- a damaged deliver.db ------------------------------------------------ */

static char *dup_path(const struct fx *f)
{
    char *conf = th_path(f->dir, "conf");
    char *path = th_path(conf, DUPLICATE_FNAME);

    free(conf);
    return path;
}

/* Files set aside as damaged in CONFIGDIR (lmdb's lock files not counted). */
static int count_aside(const struct fx *f)
{
    char *conf = th_path(f->dir, "conf");
    DIR *d = opendir(conf);
    struct dirent *de;
    size_t plen = strlen(DUPLICATE_FNAME ".damaged-");
    int n = 0;

    assert_non_null(d);
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (!strncmp(de->d_name, DUPLICATE_FNAME ".damaged-", plen) &&
            !(len > 5 && !strcmp(de->d_name + len - 5, "-lock")))
            n++;
    }
    closedir(d);
    free(conf);
    return n;
}

#define GARBAGE 8192

/* Write garbage over the file from offset `keep` on, to at least GARBAGE
 * bytes; the garbage holds NUL bytes, so not even flat takes it for its
 * own.  The bytes written go to *g (GARBAGE bytes). */
static void write_garbage(const char *path, size_t keep, unsigned seed,
                          char *g)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);

    assert_true(fd >= 0);
    th_fill(g, GARBAGE, seed);
    g[keep + 100] = '\0';
    assert_int_equal(pwrite(fd, g + keep, GARBAGE - keep, (off_t)keep),
                     (ssize_t)(GARBAGE - keep));
    close(fd);
}

/* The only file set aside holds exactly what was written over the database
 * from `from` on. */
static void expect_aside_holds(const struct fx *f, const char *g, size_t from)
{
    char *conf = th_path(f->dir, "conf");
    DIR *d = opendir(conf);
    struct dirent *de;
    char *found = NULL;
    char buf[GARBAGE];
    int fd;

    assert_non_null(d);
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (!strncmp(de->d_name, DUPLICATE_FNAME ".damaged-",
                     strlen(DUPLICATE_FNAME ".damaged-")) &&
            !(len > 5 && !strcmp(de->d_name + len - 5, "-lock")))
            found = th_path(conf, de->d_name);
    }
    closedir(d);
    assert_non_null(found);
    fd = open(found, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, buf, GARBAGE - from, (off_t)from),
                     (ssize_t)(GARBAGE - from));
    close(fd);
    assert_memory_equal(buf, g + from, GARBAGE - from);
    free(found);
    free(conf);
}

static int backend_is_db3(const struct fx *f)
{
    return !strncmp(f->backend, "db3", 3);
}

static void test_damaged_file(void **state)
{
    struct fx f;
    time_t now = time(NULL);
    char *path, *g = malloc(GARBAGE);
    struct stat st;

    assert_non_null(g);
    fx_init(&f, state);
    path = dup_path(&f);
    assert_int_equal(duplicate_mark(f.d, ID("<old>"), TH_D "user.a", now, 1),
                     STORE_OK);
    duplicate_close(&f.d);

    /* garbage over the whole file: set aside, a fresh file works */
    write_garbage(path, 0, 1, g);
    assert_int_equal(duplicate_open(f.conf, &f.d), STORE_OK);
    assert_int_equal(count_aside(&f), 1);
    expect_aside_holds(&f, g, 0);
    expect_none(&f, ID("<old>"), TH_D "user.a");
    assert_int_equal(duplicate_mark(f.d, ID("<new>"), TH_D "user.a", now, 2),
                     STORE_OK);
    expect_dup(&f, ID("<new>"), TH_D "user.a", now, 2);
    duplicate_close(&f.d);
    /* the fresh file is a good one: reopened, nothing more set aside */
    assert_int_equal(duplicate_open(f.conf, &f.d), STORE_OK);
    assert_int_equal(count_aside(&f), 1);
    expect_dup(&f, ID("<new>"), TH_D "user.a", now, 2);
    duplicate_close(&f.d);

    /* garbage behind an intact header (Berkeley DB is left out: a page
     * that fails its checksum panics the whole shared environment) */
    if (!backend_is_db3(&f)) {
        write_garbage(path, 64, 2, g);
        assert_int_equal(duplicate_open(f.conf, &f.d), STORE_OK);
        assert_int_equal(count_aside(&f), 2);
        expect_none(&f, ID("<new>"), TH_D "user.a");
        assert_int_equal(duplicate_mark(f.d, ID("<newer>"), TH_D "user.a", now, 3),
                         STORE_OK);
        expect_dup(&f, ID("<newer>"), TH_D "user.a", now, 3);
        duplicate_close(&f.d);
    }

    /* not damage: a directory in the file's place is left alone */
    {
        char *moved = th_path(f.dir, "moved.db");

        assert_int_equal(rename(path, moved), 0);
        assert_int_equal(mkdir(path, 0755), 0);
        assert_int_not_equal(duplicate_open(f.conf, &f.d), STORE_OK);
        assert_null(f.d);
        assert_int_equal(stat(path, &st), 0);
        assert_true(S_ISDIR(st.st_mode));
        assert_int_equal(count_aside(&f), backend_is_db3(&f) ? 1 : 2);
        assert_int_equal(rmdir(path), 0);
        assert_int_equal(rename(moved, path), 0);
        free(moved);
    }
    /* nor a file this process may not read (root reads anything) */
    if (geteuid() != 0) {
        assert_int_equal(chmod(path, 0), 0);
        assert_int_not_equal(duplicate_open(f.conf, &f.d), STORE_OK);
        assert_int_equal(count_aside(&f), backend_is_db3(&f) ? 1 : 2);
        assert_int_equal(chmod(path, 0644), 0);
    } else {
        print_message("damaged_file/%s: running as root: the unreadable "
                      "file case is skipped\n", f.backend);
    }
    assert_int_equal(duplicate_open(f.conf, &f.d), STORE_OK);
    free(path);
    free(g);
    fx_done(&f);
}

/* Two processes open the same damaged file at once: one rename, and both
 * end up on the same fresh file. */
static void test_damaged_file_race(void **state)
{
    struct fx f;
    time_t now = time(NULL);
    char *path, *g = malloc(GARBAGE);
    pid_t pids[2];
    int go[2], i, status;
    char st[64];

    assert_non_null(g);
    fx_init(&f, state);
    path = dup_path(&f);
    assert_int_equal(duplicate_mark(f.d, ID("<old>"), TH_D "user.a", now, 1),
                     STORE_OK);
    duplicate_close(&f.d);
    write_garbage(path, 0, 3, g);

    assert_int_equal(pipe(go), 0);
    for (i = 0; i < 2; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            struct duplicate_db *d = NULL;
            char id[32], c;
            int n;

            th_child_signals();
            alarm(60);
            close(go[1]);
            if (read(go[0], &c, 1) != 0)    /* EOF: go */
                _exit(2);
            if (duplicate_open(f.conf, &d) != STORE_OK)
                _exit(3);
            n = snprintf(id, sizeof(id), "<child-%d>", i);
            if (duplicate_mark(d, id, (size_t)n, TH_D "user.a", now,
                               (uint32_t)i + 10) != STORE_OK)
                _exit(4);
            if (duplicate_check(d, id, (size_t)n, TH_D "user.a", NULL, NULL) !=
                STORE_OK)
                _exit(5);
            duplicate_close(&d);
            _exit(0);
        }
    }
    close(go[0]);
    close(go[1]);   /* both children start now */
    for (i = 0; i < 2; i++) {
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail_msg("child %d: %s", i, th_status_text(status, st, sizeof(st)));
    }
    assert_int_equal(count_aside(&f), 1);
    expect_aside_holds(&f, g, 0);
    assert_int_equal(duplicate_open(f.conf, &f.d), STORE_OK);
    expect_dup(&f, ID("<child-0>"), TH_D "user.a", now, 10);
    expect_dup(&f, ID("<child-1>"), TH_D "user.a", now, 11);
    expect_none(&f, ID("<old>"), TH_D "user.a");
    free(path);
    free(g);
    fx_done(&f);
}

static const struct th_case cases[] = {
    { "check_mark", test_check_mark },
    { "mark_many", test_mark_many },
    { "copies", test_copies },
    { "bad_ids", test_bad_ids },
    { "prune", test_prune },
    { "damaged", test_damaged },
    { "prune_big", test_prune_big },
    { "prune_race", test_prune_race },
    { "damaged_file", test_damaged_file },
    { "damaged_file_race", test_damaged_file_race },
};

int main(void)
{
    log_init("test_duplicate",
             getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
    return th_run_per_backend("duplicate", cases,
                              sizeof(cases) / sizeof(cases[0]));
}
