/*
 * test_seen.c - per-user seen state (store/seen.c).
 *
 * The sequence-set helpers are pure functions and run once, as plain
 * cmocka tests: membership, adding and removing uids with ranges joined
 * and split, the canonical output, malformed sets.  The database cases
 * run once per cyrusdb backend: unknown mailboxes, write/read, damaged
 * records, refused user ids, the file's place (CONFIGDIR/user/H/USER.seen),
 * the rename and deletion of a user, and that a kept record gives way
 * to what another process commits (changes, deletion, a file renamed
 * in place).
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "store/seen.h"
#include "store/store.h"
#include "tests/testhelp.h"

/* ---- sequence sets (pure) ---------------------------------------------- */

static void test_set_contains(void **state)
{
    (void)state;
    assert_false(seen_set_contains("", 1));
    assert_false(seen_set_contains(NULL, 1));
    assert_true(seen_set_contains("1", 1));
    assert_false(seen_set_contains("1", 2));
    assert_true(seen_set_contains("1:5,7,9:12", 3));
    assert_true(seen_set_contains("1:5,7,9:12", 5));
    assert_false(seen_set_contains("1:5,7,9:12", 6));
    assert_true(seen_set_contains("1:5,7,9:12", 7));
    assert_false(seen_set_contains("1:5,7,9:12", 8));
    assert_true(seen_set_contains("1:5,7,9:12", 9));
    assert_true(seen_set_contains("1:5,7,9:12", 12));
    assert_false(seen_set_contains("1:5,7,9:12", 13));
    assert_false(seen_set_contains("1:5,7,9:12", 0));
    assert_true(seen_set_contains("4294967295", UINT32_MAX));
    assert_true(seen_set_contains("1:4294967295", 77));
    /* accepted but not canonical */
    assert_true(seen_set_contains("1:3,4", 4));
    assert_true(seen_set_contains("3:3", 3));
}

static const char *const malformed[] = {
    "0", "0:3", "1:0", "5:3", "1,", ",1", "1,,2", "1::2", "1:", ":1", "a",
    "1 ", " 1", "1;2", "3,2", "1:5,5", "1:5,3:4", "01", "1:02",
    "4294967296", "1:4294967296", "99999999999999999999999", "1,2,3,2",
    "*", "1:*", "-1", "+1", NULL
};

static void test_set_malformed(void **state)
{
    struct buf b = BUF_INITIALIZER;
    int i;

    (void)state;
    for (i = 0; malformed[i]; i++) {
        /* a malformed set contains nothing, not even what it names */
        if (seen_set_contains(malformed[i], 1) ||
            seen_set_contains(malformed[i], 2) ||
            seen_set_contains(malformed[i], 3) ||
            seen_set_contains(malformed[i], 5))
            fail_msg("malformed set <%s> contains something", malformed[i]);
        buf_setcstr(&b, malformed[i]);
        if (seen_set_update(&b, 4, 1) != STORE_CORRUPT)
            fail_msg("update of malformed set <%s> did not fail",
                     malformed[i]);
        assert_string_equal(buf_cstring(&b), malformed[i]);   /* unchanged */
    }
    /* a NUL inside the buffer */
    buf_setmap(&b, "1\0" "2", 3);
    assert_int_equal(seen_set_update(&b, 4, 1), STORE_CORRUPT);
    buf_setcstr(&b, "1:3");
    assert_int_equal(seen_set_update(&b, 0, 1), STORE_INTERNAL);
    assert_string_equal(buf_cstring(&b), "1:3");
    buf_free(&b);
}

/* Apply add (+uid) / remove (-uid) to `from`, expect `to`. */
static void set_case(const char *from, uint32_t uid, int add, const char *to)
{
    struct buf b = BUF_INITIALIZER;

    buf_setcstr(&b, from);
    assert_int_equal(seen_set_update(&b, uid, add), STORE_OK);
    if (strcmp(buf_cstring(&b), to))
        fail_msg("%s %s %u: got <%s>, want <%s>", from, add ? "+" : "-", uid,
                 buf_cstring(&b), to);
    buf_free(&b);
}

static void test_set_update(void **state)
{
    (void)state;
    /* adding */
    set_case("", 5, 1, "5");
    set_case("5", 5, 1, "5");
    set_case("5", 6, 1, "5:6");
    set_case("5", 4, 1, "4:5");
    set_case("5", 7, 1, "5,7");
    set_case("5", 3, 1, "3,5");
    set_case("1:3,5:7", 4, 1, "1:7");          /* the middle joins ranges */
    set_case("1:3,5", 4, 1, "1:5");
    set_case("1,3", 2, 1, "1:3");
    set_case("1:3,7:9", 5, 1, "1:3,5,7:9");
    set_case("1:3,7:9", 6, 1, "1:3,6:9");
    set_case("1:3,7:9", 2, 1, "1:3,7:9");
    set_case("1:3,7:9", 10, 1, "1:3,7:10");
    set_case("2:3", 1, 1, "1:3");
    set_case("1:5,7,9:12", 8, 1, "1:5,7:12");
    set_case("1:5,7,9:12", 6, 1, "1:7,9:12");
    set_case("4294967294", 4294967295u, 1, "4294967294:4294967295");
    set_case("1:4294967295", 4294967295u, 1, "1:4294967295");
    /* non-canonical input comes out canonical */
    set_case("1:3,4", 10, 1, "1:4,10");
    set_case("3:3", 1, 1, "1,3");
    /* removing */
    set_case("", 5, 0, "");
    set_case("5", 5, 0, "");
    set_case("5", 6, 0, "5");
    set_case("1:7", 4, 0, "1:3,5:7");          /* removing splits */
    set_case("1:7", 1, 0, "2:7");
    set_case("1:7", 7, 0, "1:6");
    set_case("1:2", 1, 0, "2");
    set_case("1:2", 2, 0, "1");
    set_case("1:3", 2, 0, "1,3");
    set_case("1:3,5,7:9", 5, 0, "1:3,7:9");
    set_case("1:3,5,7:9", 6, 0, "1:3,5,7:9");
    set_case("1:4294967295", 4294967295u, 0, "1:4294967294");
}

/* Random adds and removes against a bitmap model. */
static void test_set_model(void **state)
{
    struct buf b = BUF_INITIALIZER;
    unsigned char model[200];
    unsigned seed = 4242;
    uint32_t u;
    int i;

    (void)state;
    memset(model, 0, sizeof(model));
    for (i = 0; i < 3000; i++) {
        int add;
        seed = seed * 1103515245u + 12345u;
        u = 1 + (seed >> 16) % 199;
        add = (seed >> 8) % 3 != 0;
        assert_int_equal(seen_set_update(&b, u, add), STORE_OK);
        model[u] = (unsigned char)add;
        if (i % 97 == 0) {
            uint32_t v;
            for (v = 1; v < 200; v++)
                if (seen_set_contains(buf_cstring(&b), v) != model[v])
                    fail_msg("uid %u: set <%s>", v, buf_cstring(&b));
            assert_false(seen_set_contains(buf_cstring(&b), 200));
        }
    }
    buf_free(&b);
}

/* ---- the database, per backend ------------------------------------------ */

struct fx {
    const char *backend;
    char *dir;
    struct imapconf *conf;
};

static void fx_init(struct fx *f, void **state)
{
    memset(f, 0, sizeof(*f));
    f->backend = *state;
    f->dir = th_mkdtemp("seen");
    assert_non_null(f->dir);
    f->conf = th_store_conf(f->dir, f->backend, NULL);
}

static void fx_done(struct fx *f)
{
    imapconf_free(&f->conf);
    th_rmrf(f->dir);
    free(f->dir);
}

static int fx_exists(struct fx *f, const char *rel)
{
    struct stat st;
    char *p = th_path(f->dir, rel);
    int r = stat(p, &st) == 0;

    free(p);
    return r;
}

static void data_set(struct seen_data *d, time_t lr, uint32_t lu, time_t lc,
                     const char *set)
{
    d->lastread = lr;
    d->lastuid = lu;
    d->lastchange = lc;
    buf_setcstr(&d->seenuids, set);
}

static void expect_data(struct seen_db *s, const char *uid, time_t lr,
                        uint32_t lu, time_t lc, const char *set)
{
    struct seen_data d;

    memset(&d, 0, sizeof(d));
    data_set(&d, 11, 22, 33, "poison");
    assert_int_equal(seen_read(s, uid, &d), STORE_OK);
    assert_int_equal(d.lastread, lr);
    assert_int_equal(d.lastuid, lu);
    assert_int_equal(d.lastchange, lc);
    assert_string_equal(buf_cstring(&d.seenuids), set);
    seen_data_free(&d);
}

static void test_read_write(void **state)
{
    struct fx f;
    struct seen_db *s = NULL;
    struct seen_data d;

    fx_init(&f, state);
    assert_int_equal(seen_open(f.conf, "alice" TH_U, &s), STORE_OK);
    assert_true(fx_exists(&f, "conf/" TH_DPATH_H "user/a/alice.seen"));
    expect_data(s, "uid-unknown", 0, 0, 0, "");

    memset(&d, 0, sizeof(d));
    data_set(&d, 1700000000, 42, 1700000100, "1:5,7,9:12");
    assert_int_equal(seen_write(s, "uid-1", &d), STORE_OK);
    data_set(&d, 5, 1, 6, "");
    assert_int_equal(seen_write(s, "uid-2", &d), STORE_OK);
    data_set(&d, (time_t)4102444800LL, UINT32_MAX, 0, "1:4294967295");
    assert_int_equal(seen_write(s, "uid-3", &d), STORE_OK);
    expect_data(s, "uid-1", 1700000000, 42, 1700000100, "1:5,7,9:12");
    expect_data(s, "uid-2", 5, 1, 6, "");
    expect_data(s, "uid-3", (time_t)4102444800LL, UINT32_MAX, 0,
                "1:4294967295");

    /* overwrite */
    data_set(&d, 9, 43, 10, "1:13");
    assert_int_equal(seen_write(s, "uid-1", &d), STORE_OK);
    expect_data(s, "uid-1", 9, 43, 10, "1:13");

    /* refused: malformed set, negative time, bad keys */
    data_set(&d, 9, 43, 10, "3,1");
    assert_int_equal(seen_write(s, "uid-1", &d), STORE_INTERNAL);
    data_set(&d, -1, 43, 10, "1");
    assert_int_equal(seen_write(s, "uid-1", &d), STORE_INTERNAL);
    expect_data(s, "uid-1", 9, 43, 10, "1:13");
    data_set(&d, 1, 1, 1, "1");
    assert_int_equal(seen_write(s, "", &d), STORE_BADNAME);
    assert_int_equal(seen_read(s, "", &d), STORE_BADNAME);

    /* delete: gone, twice is fine */
    assert_int_equal(seen_delete(s, "uid-2"), STORE_OK);
    expect_data(s, "uid-2", 0, 0, 0, "");
    assert_int_equal(seen_delete(s, "uid-2"), STORE_OK);

    /* survives a reopen */
    seen_close(&s);
    assert_null(s);
    assert_int_equal(seen_open(f.conf, "alice" TH_U, &s), STORE_OK);
    expect_data(s, "uid-1", 9, 43, 10, "1:13");
    expect_data(s, "uid-3", (time_t)4102444800LL, UINT32_MAX, 0,
                "1:4294967295");
    seen_close(&s);
    seen_data_free(&d);
    fx_done(&f);
}

/* seen_update() callbacks */
static int add_uid_cb(struct seen_data *d, void *rock)
{
    return seen_set_update(&d->seenuids, *(const uint32_t *)rock, 1);
}

static int unchanged_cb(struct seen_data *d, void *rock)
{
    (void)d;
    (void)rock;
    return SEEN_UPDATE_UNCHANGED;
}

static int fail_cb(struct seen_data *d, void *rock)
{
    (void)rock;
    d->lastuid = 99;
    return STORE_NOMEM;
}

#define UPDATE_ROUNDS 150

/* Two processes add disjoint uids to one record at the same time, each
 * through seen_update(): no addition is lost (a plain read, then write,
 * of the whole state would lose some).  Apply's UNCHANGED writes
 * nothing; an apply error writes nothing and is returned. */
static void test_update(void **state)
{
    struct fx f;
    struct seen_db *s = NULL;
    struct seen_data d;
    pid_t pid[2];
    int status;

    fx_init(&f, state);
    for (int k = 0; k < 2; k++) {
        pid[k] = fork();
        assert_true(pid[k] >= 0);
        if (pid[k] == 0) {
            struct seen_db *cs = NULL;
            int bad = 0;

            if (seen_open(f.conf, "frank" TH_U, &cs) != STORE_OK)
                _exit(2);
            for (uint32_t u = (uint32_t)k + 1; u <= 2 * UPDATE_ROUNDS;
                 u += 2)
                if (seen_update(cs, "uid-c", add_uid_cb, &u, NULL)
                        != STORE_OK)
                    bad++;
            seen_close(&cs);
            _exit(bad ? 1 : 0);
        }
    }
    for (int k = 0; k < 2; k++) {
        assert_int_equal(waitpid(pid[k], &status, 0), pid[k]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    assert_int_equal(seen_open(f.conf, "frank" TH_U, &s), STORE_OK);
    expect_data(s, "uid-c", 0, 0, 0, "1:300");

    /* the result comes back; UNCHANGED and errors write nothing */
    memset(&d, 0, sizeof(d));
    {
        uint32_t u = 400;

        assert_int_equal(seen_update(s, "uid-c", add_uid_cb, &u, &d),
                         STORE_OK);
        assert_string_equal(buf_cstring(&d.seenuids), "1:300,400");
    }
    assert_int_equal(seen_update(s, "uid-c", unchanged_cb, NULL, NULL),
                     STORE_OK);
    assert_int_equal(seen_update(s, "uid-c", fail_cb, NULL, NULL),
                     STORE_NOMEM);
    expect_data(s, "uid-c", 0, 0, 0, "1:300,400");
    seen_close(&s);
    seen_data_free(&d);
    fx_done(&f);
}

/* Run fn(conf) in a child process (another session of the user). */
static void in_child(struct fx *f, void (*fn)(struct fx *f))
{
    pid_t pid = fork();
    int status;

    assert_true(pid >= 0);
    if (pid == 0) {
        fn(f);
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void child_write(struct fx *f, const char *set)
{
    struct seen_db *cs = NULL;
    struct seen_data d;

    memset(&d, 0, sizeof(d));
    data_set(&d, 1, 2, 3, set);
    if (seen_open(f->conf, "gina" TH_U, &cs) != STORE_OK ||
        seen_write(cs, "uid-k", &d) != STORE_OK)
        _exit(1);
    seen_close(&cs);
    seen_data_free(&d);
}

static void child_write_15(struct fx *f) { child_write(f, "1:5"); }
static void child_write_16(struct fx *f) { child_write(f, "1:6"); }

static void child_delete(struct fx *f)
{
    struct seen_db *cs = NULL;

    if (seen_open(f->conf, "gina" TH_U, &cs) != STORE_OK ||
        seen_delete(cs, "uid-k") != STORE_OK)
        _exit(1);
    seen_close(&cs);
}

/* Put a copy of file path in its place through a temporary file and
 * rename(): another inode, the same size, with the last `from` in it
 * replaced by `to` (as long). */
static void replace_patched(const char *path, const char *from,
                            const char *to)
{
    char tmp[4096];
    char *buf, *hit = NULL;
    FILE *in, *out;
    size_t n, k, len = strlen(from);

    assert_int_equal(strlen(to), len);
    snprintf(tmp, sizeof(tmp), "%s.repl", path);
    in = fopen(path, "rb");
    assert_non_null(in);
    buf = malloc(1 << 20);
    assert_non_null(buf);
    n = fread(buf, 1, 1 << 20, in);
    fclose(in);
    for (k = 0; k + len <= n; k++)
        if (memcmp(buf + k, from, len) == 0)
            hit = buf + k;
    assert_non_null(hit);
    memcpy(hit, to, len);
    out = fopen(tmp, "wb");
    assert_non_null(out);
    assert_int_equal(fwrite(buf, 1, n, out), n);
    assert_int_equal(fclose(out), 0);
    free(buf);
    assert_int_equal(rename(tmp, path), 0);
}

/* seen_read() keeps the last record while the file is unchanged: what
 * another process commits (a change, a deletion, a whole file put in
 * place by rename with the very same size) is read at the next call. */
static void test_cache(void **state)
{
    struct fx f;
    struct seen_db *s = NULL;
    char *path;

    fx_init(&f, state);
    path = th_path(f.dir, "conf/" TH_DPATH_H "user/g/gina.seen");
    assert_int_equal(seen_open(f.conf, "gina" TH_U, &s), STORE_OK);
    expect_data(s, "uid-k", 0, 0, 0, "");
    expect_data(s, "uid-k", 0, 0, 0, "");
    in_child(&f, child_write_15);
    expect_data(s, "uid-k", 1, 2, 3, "1:5");
    expect_data(s, "uid-k", 1, 2, 3, "1:5");
    expect_data(s, "uid-other", 0, 0, 0, "");
    expect_data(s, "uid-k", 1, 2, 3, "1:5");
    in_child(&f, child_write_16);       /* a value as long as before */
    expect_data(s, "uid-k", 1, 2, 3, "1:6");
    expect_data(s, "uid-k", 1, 2, 3, "1:6");
    if (strcmp(f.backend, "skiplist") == 0 ||
        strcmp(f.backend, "flat") == 0) {
        /* formats without checksums: the file edited in a copy */
        replace_patched(path, "1:6", "2:6");
        expect_data(s, "uid-k", 1, 2, 3, "2:6");
    }
    in_child(&f, child_delete);
    expect_data(s, "uid-k", 0, 0, 0, "");
    in_child(&f, child_write_16);
    expect_data(s, "uid-k", 1, 2, 3, "1:6");
    seen_close(&s);
    free(path);
    fx_done(&f);
}

static void test_damaged(void **state)
{
    static const char *const bad[] = {
        "", "1", "1 2 3", "2 1 1 1 1", "1 x 1 1 1", "1 1 1 1 3,2",
        "1 1 4294967296 1 1", "1  1 1 1", "1 1 1 1 1 2", "1 -1 1 1 1",
        "01 1 1 1 1", NULL
    };
    static const char *const good[][2] = {
        { "1 1 2 3", "" }, { "1 1 2 3 ", "" }, { "1 1 2 3 1:3,4", "1:3,4" },
        { NULL, NULL }
    };
    struct fx f;
    struct seen_db *s = NULL;
    struct cyrusdb *db = NULL;
    struct seen_data d;
    char *path, key[16];
    int i;

    fx_init(&f, state);
    assert_int_equal(seen_open(f.conf, "bob" TH_U, &s), STORE_OK);
    seen_close(&s);
    path = th_path(f.dir, "conf/" TH_DPATH_H "user/b/bob.seen");
    assert_int_equal(cyrusdb_open(f.backend, path, 0, &db, NULL), CYRUSDB_OK);
    for (i = 0; bad[i]; i++) {
        snprintf(key, sizeof(key), "bad%d", i);
        assert_int_equal(cyrusdb_store(db, key, strlen(key), bad[i],
                                       strlen(bad[i]), NULL), CYRUSDB_OK);
    }
    for (i = 0; good[i][0]; i++) {
        snprintf(key, sizeof(key), "good%d", i);
        assert_int_equal(cyrusdb_store(db, key, strlen(key), good[i][0],
                                       strlen(good[i][0]), NULL), CYRUSDB_OK);
    }
    cyrusdb_close(&db);
    free(path);

    assert_int_equal(seen_open(f.conf, "bob" TH_U, &s), STORE_OK);
    memset(&d, 0, sizeof(d));
    for (i = 0; bad[i]; i++) {
        snprintf(key, sizeof(key), "bad%d", i);
        data_set(&d, 1, 1, 1, "1");
        if (seen_read(s, key, &d) != STORE_CORRUPT)
            fail_msg("damaged value <%s> was read", bad[i]);
        assert_int_equal(d.lastuid, 0);
        assert_string_equal(buf_cstring(&d.seenuids), "");
    }
    for (i = 0; good[i][0]; i++) {
        snprintf(key, sizeof(key), "good%d", i);
        expect_data(s, key, 1, 2, 3, good[i][1]);
    }
    seen_data_free(&d);
    seen_close(&s);
    fx_done(&f);
}

static void test_userids(void **state)
{
    struct fx f;
    struct seen_db *s = NULL;
    char longid[STORE_USERID_MAX + 2];
    static const char *const bad[] = {
        "", "a/b", "..", ".", "a\nb", "a\tb", "a\x7f", NULL
    };
    int i;

    fx_init(&f, state);
    for (i = 0; bad[i]; i++) {
        s = (struct seen_db *)&f;   /* poison */
        assert_int_equal(seen_open(f.conf, bad[i], &s), STORE_BADNAME);
        assert_null(s);
    }
    memset(longid, 'x', sizeof(longid));
    longid[STORE_USERID_MAX + 1] = '\0';
    assert_int_equal(seen_open(f.conf, longid, &s), STORE_BADNAME);
    longid[STORE_USERID_MAX] = '\0';
    assert_int_equal(seen_open(f.conf, longid, &s), STORE_OK);
    seen_close(&s);
    /* hash directories: first letter lower-cased, 'q' for the rest */
    assert_int_equal(seen_open(f.conf, "Zed" TH_U, &s), STORE_OK);
    seen_close(&s);
    assert_true(fx_exists(&f, "conf/" TH_DPATH_H "user/z/Zed.seen"));
    assert_int_equal(seen_open(f.conf, "9lives" TH_U, &s), STORE_OK);
    seen_close(&s);
    assert_true(fx_exists(&f, "conf/" TH_DPATH_H "user/q/9lives.seen"));
    assert_int_equal(seen_open(f.conf, "john.doe" TH_U, &s), STORE_OK);
    seen_close(&s);
    assert_true(fx_exists(&f, "conf/" TH_DPATH_H "user/j/john.doe.seen"));
    assert_int_equal(seen_delete_user(f.conf, "a/b"), STORE_BADNAME);
    fx_done(&f);
}

static void test_users(void **state)
{
    struct fx f;
    struct seen_db *s = NULL;
    struct seen_data d;

    fx_init(&f, state);
    memset(&d, 0, sizeof(d));
    assert_int_equal(seen_open(f.conf, "carol" TH_U, &s), STORE_OK);
    data_set(&d, 1, 2, 3, "1:2");
    assert_int_equal(seen_write(s, "u1", &d), STORE_OK);
    data_set(&d, 4, 5, 6, "5");
    assert_int_equal(seen_write(s, "u2", &d), STORE_OK);
    seen_close(&s);

    /* rename: the records move, the old file goes */
    assert_int_equal(seen_rename_user(f.conf, "carol" TH_U, "dave" TH_U), STORE_OK);
    assert_false(fx_exists(&f, "conf/" TH_DPATH_H "user/c/carol.seen"));
    assert_true(fx_exists(&f, "conf/" TH_DPATH_H "user/d/dave.seen"));
    assert_int_equal(seen_open(f.conf, "dave" TH_U, &s), STORE_OK);
    expect_data(s, "u1", 1, 2, 3, "1:2");
    expect_data(s, "u2", 4, 5, 6, "5");
    seen_close(&s);
    assert_int_equal(seen_rename_user(f.conf, "carol" TH_U, "dave" TH_U),
                     STORE_NOTFOUND);
    assert_int_equal(seen_rename_user(f.conf, "dave" TH_U, "dave" TH_U), STORE_OK);
    assert_int_equal(seen_rename_user(f.conf, "dave" TH_U, "x/y"), STORE_BADNAME);

    /* into a user who already has state: merged, the moved records win */
    assert_int_equal(seen_open(f.conf, "erin" TH_U, &s), STORE_OK);
    data_set(&d, 7, 8, 9, "8");
    assert_int_equal(seen_write(s, "u2", &d), STORE_OK);
    assert_int_equal(seen_write(s, "u9", &d), STORE_OK);
    seen_close(&s);
    assert_int_equal(seen_rename_user(f.conf, "dave" TH_U, "erin" TH_U), STORE_OK);
    assert_int_equal(seen_open(f.conf, "erin" TH_U, &s), STORE_OK);
    expect_data(s, "u1", 1, 2, 3, "1:2");
    expect_data(s, "u2", 4, 5, 6, "5");
    expect_data(s, "u9", 7, 8, 9, "8");
    seen_close(&s);

    /* delete */
    assert_int_equal(seen_delete_user(f.conf, "erin" TH_U), STORE_OK);
    assert_false(fx_exists(&f, "conf/" TH_DPATH_H "user/e/erin.seen"));
    assert_false(fx_exists(&f, "conf/" TH_DPATH_H "user/e/erin.seen-lock"));
    assert_int_equal(seen_delete_user(f.conf, "erin" TH_U), STORE_NOTFOUND);
    /* a new user of the same name starts empty */
    assert_int_equal(seen_open(f.conf, "erin" TH_U, &s), STORE_OK);
    expect_data(s, "u1", 0, 0, 0, "");
    seen_close(&s);
    seen_data_free(&d);
    fx_done(&f);
}

static const struct th_case cases[] = {
    { "read_write", test_read_write },
    { "damaged", test_damaged },
    { "userids", test_userids },
    { "users", test_users },
    { "update", test_update },
    { "cache", test_cache },
};

int main(void)
{
    const struct CMUnitTest pure[] = {
        cmocka_unit_test(test_set_contains),
        cmocka_unit_test(test_set_malformed),
        cmocka_unit_test(test_set_update),
        cmocka_unit_test(test_set_model),
    };
    int rc;

    log_init("test_seen", getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
    rc = cmocka_run_group_tests_name("seen_set", pure, NULL, NULL);
    rc += th_run_per_backend("seen", cases, sizeof(cases) / sizeof(cases[0]));
    return rc;
}
