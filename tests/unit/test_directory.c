/*
 * test_directory.c - unit tests of store/directory.c over a flat file:
 * found / not found / damaged records, a database that is missing and
 * then appears, the cache (answers kept for directory_cache_ttl, found
 * and not found alike; TTL 0 reads every time; directory_flush), the
 * cache bound, backend names at their limits, and a bad directory_db.
 */
#include "config.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "store/directory.h"
#include "tests/testhelp.h"

static char *tmpdir;
static int seq;

struct fixture {
    char *dir;
    char *dbpath;
    struct imapconf *conf;
    struct directory *d;
};

static struct fixture *fixture_new(int ttl)
{
    struct fixture *f = calloc(1, sizeof(*f));
    char name[32], *text = NULL, *err = NULL;

    assert_non_null(f);
    snprintf(name, sizeof(name), "d%d", seq++);
    f->dir = th_path(tmpdir, name);
    assert_int_equal(mkdir(f->dir, 0700), 0);
    f->dbpath = th_path(f->dir, "directory.db");
    assert_true(asprintf(&text, "configdirectory: %s\ndirectory_db: flat\n"
                         "directory_cache_ttl: %d\n", f->dir, ttl) > 0);
    assert_int_equal(imapconf_load_string("test", text, strlen(text),
                                          &f->conf, &err), 0);
    free(text);
    return f;
}

static void fixture_free(struct fixture *f)
{
    directory_free(&f->d);
    assert_null(f->d);
    imapconf_free(&f->conf);
    free(f->dbpath);
    free(f->dir);
    free(f);
}

static void put(struct fixture *f, const char *key, const char *value)
{
    struct cyrusdb *db = NULL;

    assert_int_equal(cyrusdb_open("flat", f->dbpath, CYRUSDB_CREATE, &db,
                                  NULL), CYRUSDB_OK);
    if (value)
        assert_int_equal(cyrusdb_store(db, key, strlen(key), value,
                                       strlen(value), NULL), CYRUSDB_OK);
    else
        assert_int_equal(cyrusdb_delete(db, key, strlen(key), NULL, 0),
                         CYRUSDB_OK);
    assert_int_equal(cyrusdb_close(&db), CYRUSDB_OK);
}

static void expect(struct fixture *f, const char *user,
                   enum directory_result want, const char *backend)
{
    const char *got = (const char *)0x1;   /* poisoned */
    enum directory_result r = directory_lookup(f->d, user, &got);

    if (r != want)
        fail_msg("%s: result %d, want %d", user, (int)r, (int)want);
    if (backend) {
        assert_non_null(got);
        assert_string_equal(got, backend);
    } else if (want == DIRECTORY_NOTFOUND || want == DIRECTORY_UNAVAILABLE) {
        assert_null(got);
    }
}

static void test_lookup(void **state)
{
    struct fixture *f = fixture_new(0);
    const char *err = NULL;
    (void)state;

    assert_int_equal(directory_new(f->conf, &f->d, &err), 0);
    /* no database yet: unavailable, never "not found" */
    expect(f, "alice", DIRECTORY_UNAVAILABLE, NULL);
    put(f, "alice", "alpha");
    put(f, "bob@example.com", "beta-2.x_y");
    put(f, "carol", "bad name");
    put(f, "dave", "");
    put(f, "erin", "alpha\n");
    expect(f, "alice", DIRECTORY_OK, "alpha");
    expect(f, "bob@example.com", DIRECTORY_OK, "beta-2.x_y");
    expect(f, "bob", DIRECTORY_NOTFOUND, NULL);
    expect(f, "Alice", DIRECTORY_NOTFOUND, NULL);
    expect(f, "carol", DIRECTORY_BADRECORD, "bad name");
    expect(f, "dave", DIRECTORY_BADRECORD, "");
    expect(f, "erin", DIRECTORY_BADRECORD, "alpha?");   /* sanitized */
    fixture_free(f);
}

static void test_cache_ttl(void **state)
{
    struct fixture *f = fixture_new(3600);
    const char *err = NULL;
    (void)state;

    put(f, "alice", "alpha");
    assert_int_equal(directory_new(f->conf, &f->d, &err), 0);
    expect(f, "alice", DIRECTORY_OK, "alpha");
    expect(f, "bob", DIRECTORY_NOTFOUND, NULL);
    put(f, "alice", "beta");
    put(f, "bob", "beta");
    /* both answers are kept for the TTL */
    expect(f, "alice", DIRECTORY_OK, "alpha");
    expect(f, "bob", DIRECTORY_NOTFOUND, NULL);
    directory_flush(f->d);
    expect(f, "alice", DIRECTORY_OK, "beta");
    expect(f, "bob", DIRECTORY_OK, "beta");
    fixture_free(f);
}

static void test_no_cache(void **state)
{
    struct fixture *f = fixture_new(0);
    const char *err = NULL;
    (void)state;

    put(f, "alice", "alpha");
    assert_int_equal(directory_new(f->conf, &f->d, &err), 0);
    expect(f, "alice", DIRECTORY_OK, "alpha");
    put(f, "alice", "beta");
    expect(f, "alice", DIRECTORY_OK, "beta");
    put(f, "alice", NULL);
    expect(f, "alice", DIRECTORY_NOTFOUND, NULL);
    fixture_free(f);
}

static void test_cache_bound(void **state)
{
    struct fixture *f = fixture_new(3600);
    const char *err = NULL;
    char user[32];
    int i;
    (void)state;

    put(f, "alice", "alpha");
    assert_int_equal(directory_new(f->conf, &f->d, &err), 0);
    expect(f, "alice", DIRECTORY_OK, "alpha");
    put(f, "alice", "beta");
    /* more users than the cache holds: it is emptied once, so alice is
     * read again */
    for (i = 0; i < DIRECTORY_CACHE_MAX + 10; i++) {
        snprintf(user, sizeof(user), "u%d", i);
        expect(f, user, DIRECTORY_NOTFOUND, NULL);
    }
    expect(f, "alice", DIRECTORY_OK, "beta");
    fixture_free(f);
}

static void test_names(void **state)
{
    char name[DIRECTORY_NAME_MAX + 2];
    (void)state;

    memset(name, 'a', sizeof(name));
    assert_true(directory_valid_name(name, DIRECTORY_NAME_MAX));
    assert_false(directory_valid_name(name, DIRECTORY_NAME_MAX + 1));
    assert_false(directory_valid_name(name, 0));
    assert_true(directory_valid_name("A-z.0_9", 7));
    assert_false(directory_valid_name("a b", 3));
    assert_false(directory_valid_name("a/b", 3));
    assert_false(directory_valid_name("a\0b", 3));
    assert_false(directory_valid_name("\xc3\xa9", 2));
}

static void test_bad_backend(void **state)
{
    struct imapconf *conf = NULL;
    struct directory *d = (struct directory *)0x1;
    const char *err = NULL;
    char *cerr = NULL;
    const char *text = "directory_db: nosuch\n";
    (void)state;

    /* refused by the configuration reader already */
    assert_int_equal(imapconf_load_string("test", text, strlen(text), &conf,
                                          &cerr), -1);
    free(cerr);
    conf = imapconf_defaults();
    assert_non_null(conf);
    assert_int_equal(directory_new(conf, &d, &err), 0);
    directory_free(&d);
    imapconf_free(&conf);
}

static int group_setup(void **state)
{
    (void)state;
    log_init("test_directory", LOG_TO_STDERR);
    tmpdir = th_mkdtemp("directory");
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    th_rmrf(tmpdir);
    free(tmpdir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup),
        cmocka_unit_test(test_cache_ttl),
        cmocka_unit_test(test_no_cache),
        cmocka_unit_test(test_cache_bound),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_bad_backend),
    };

    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
