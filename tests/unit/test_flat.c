/*
 * test_flat.c - the flat format engine (cyrusdb/flat.c) and the flat
 * backend: exact bytes on disk against Cyrus's encoding, files written by
 * hand in Cyrus's format, order on disk, stray FNAME.NEW files, damaged
 * files, transactions, and several fork()ed processes on one file.
 * Everything runs on real files in a temporary directory on disk.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
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
#include "cyrusdb/cyrusdb_backends.h"
#include "cyrusdb/flat.h"
#include "lib/buf.h"
#include "lib/fsutil.h"
#include "lib/log.h"
#include "tests/testhelp.h"

static char *tmpdir;

/* ---- helpers ------------------------------------------------------------ */

static char *path_of(const char *name)
{
    return th_path(tmpdir, name);
}

static void write_file(const char *path, const char *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    close(fd);
}

/* The whole file in b (b reset first). */
static void read_file(const char *path, struct buf *b)
{
    char chunk[4096];
    ssize_t n;
    int fd = open(path, O_RDONLY);

    assert_true(fd >= 0);
    buf_reset(b);
    while ((n = read(fd, chunk, sizeof(chunk))) > 0)
        assert_int_equal(buf_append(b, chunk, (size_t)n), 0);
    assert_int_equal(n, 0);
    close(fd);
}

static void assert_file_bytes(const char *path, const char *want, size_t len)
{
    struct buf b = BUF_INITIALIZER;

    read_file(path, &b);
    assert_int_equal(b.len, len);
    assert_memory_equal(b.s, want, len);
    buf_free(&b);
}

static struct cyrusdb *open_db(const char *path, int flags)
{
    struct cyrusdb *db = NULL;
    const char *err = NULL;
    int r = cyrusdb_open("flat", path, flags, &db, &err);

    if (r != CYRUSDB_OK)
        fail_msg("open %s: %s (%d)", path, err ? err : "?", r);
    return db;
}

static void put(struct cyrusdb *db, const char *k, size_t kl,
                const char *v, size_t vl, struct cyrusdb_txn **tid)
{
    assert_int_equal(cyrusdb_store(db, k, kl, v, vl, tid), CYRUSDB_OK);
}

static void put_s(struct cyrusdb *db, const char *k, const char *v,
                  struct cyrusdb_txn **tid)
{
    put(db, k, strlen(k), v, strlen(v), tid);
}

/* Fetch k and compare with want (NULL: must be absent). */
static void expect(struct cyrusdb *db, const char *k, size_t kl,
                   const char *want, size_t wl, struct cyrusdb_txn **tid)
{
    const char *data = (const char *)0x1;
    size_t len = 12345;
    int r = cyrusdb_fetch(db, k, kl, &data, &len, tid);

    if (!want) {
        assert_int_equal(r, CYRUSDB_NOTFOUND);
        return;
    }
    assert_int_equal(r, CYRUSDB_OK);
    assert_int_equal(len, wl);
    assert_memory_equal(data, want, wl);
}

static void expect_s(struct cyrusdb *db, const char *k, const char *want,
                     struct cyrusdb_txn **tid)
{
    expect(db, k, strlen(k), want, want ? strlen(want) : 0, tid);
}

/* foreach collector: "key=value;" for each record */
static int collect_cb(void *rock, const char *key, size_t keylen,
                      const char *data, size_t datalen)
{
    struct buf *b = rock;

    buf_append(b, key, keylen);
    buf_putc(b, '=');
    buf_append(b, data, datalen);
    buf_putc(b, ';');
    return 0;
}

static void expect_walk(struct cyrusdb *db, const char *prefix,
                        const char *want, struct cyrusdb_txn **tid)
{
    struct buf b = BUF_INITIALIZER;

    assert_int_equal(cyrusdb_foreach(db, prefix, prefix ? strlen(prefix) : 0,
                                     NULL, collect_cb, &b, tid), CYRUSDB_OK);
    assert_string_equal(buf_cstring(&b), want);
    buf_free(&b);
}

/* The same for walks whose keys hold NUL bytes. */
static void expect_walk_bytes(struct cyrusdb *db, const char *prefix,
                              const char *want, size_t wantlen)
{
    struct buf b = BUF_INITIALIZER;

    assert_int_equal(cyrusdb_foreach(db, prefix, strlen(prefix),
                                     NULL, collect_cb, &b, NULL), CYRUSDB_OK);
    assert_int_equal(b.len, wantlen);
    assert_memory_equal(b.s, want, wantlen);
    buf_free(&b);
}

static int wait_child(pid_t pid)
{
    int status;

    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int group_setup(void **state)
{
    (void)state;
    log_init("test_flat", LOG_TO_NONE);
    tmpdir = th_mkdtemp("flat");
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    th_rmrf(tmpdir);
    free(tmpdir);
    return 0;
}

/* ---- the encoding ------------------------------------------------------- */

static void test_encode_exact(void **state)
{
    static const char raw[] = "a\0b\tc\nd\re\377f\200";
    static const char enc[] = "a\377\200b\377\211c\377\212d\377\215e\377\377f\200";
    struct buf b = BUF_INITIALIZER;

    (void)state;
    assert_int_equal(flat_encode(&b, raw, sizeof(raw) - 1), FLAT_OK);
    assert_int_equal(b.len, sizeof(enc) - 1);
    assert_memory_equal(b.s, enc, sizeof(enc) - 1);
    buf_reset(&b);
    assert_int_equal(flat_decode(&b, enc, sizeof(enc) - 1), FLAT_OK);
    assert_int_equal(b.len, sizeof(raw) - 1);
    assert_memory_equal(b.s, raw, sizeof(raw) - 1);

    /* what the encoder never writes is damage */
    buf_reset(&b);
    assert_int_equal(flat_decode(&b, "ab\377", 3), FLAT_DAMAGED);
    assert_int_equal(flat_decode(&b, "a\377A", 3), FLAT_DAMAGED);
    assert_int_equal(flat_decode(&b, "a\377\201", 3), FLAT_DAMAGED);
    assert_int_equal(flat_decode(&b, "a\tb", 3), FLAT_DAMAGED);
    assert_int_equal(flat_decode(&b, "a\rb", 3), FLAT_DAMAGED);
    assert_int_equal(flat_decode(&b, "a\0b", 3), FLAT_DAMAGED);
    assert_int_equal(flat_decode(&b, "a\nb", 3), FLAT_DAMAGED);
    buf_free(&b);
}

static void test_encode_roundtrip_random(void **state)
{
    struct buf e = BUF_INITIALIZER, d = BUF_INITIALIZER;
    char raw[300];
    unsigned seed;

    (void)state;
    for (seed = 1; seed < 300; seed++) {
        size_t len = seed % sizeof(raw), i;
        th_fill(raw, len, seed);
        buf_reset(&e);
        buf_reset(&d);
        assert_int_equal(flat_encode(&e, raw, len), FLAT_OK);
        for (i = 0; i < e.len; i++) {
            unsigned char c = (unsigned char)e.s[i];
            assert_true(c != 0 && c != '\t' && c != '\n' && c != '\r');
        }
        assert_int_equal(flat_decode(&d, e.s, e.len), FLAT_OK);
        assert_int_equal(d.len, len);
        assert_memory_equal(d.s, raw, len);
    }
    buf_free(&e);
    buf_free(&d);
}

/* The file order is cyrusdb_compare() of the encoded keys, and
 * flat_compare_encoded / flat_compare_keys compute it. */
static void test_compare_agrees(void **state)
{
    static const char alphabet[] = { '.', '-', 'a', '\0', '\t', '\377',
                                     '\001', 'z', '\n', '\r', '/' };
    struct buf e = BUF_INITIALIZER, ea = BUF_INITIALIZER;
    char a[6], b[6];
    unsigned seed;
    int f;

    (void)state;
    for (f = 0; f < 2; f++) {
        int flags = f ? CYRUSDB_MBOXSORT : 0;
        for (seed = 0; seed < 4000; seed++) {
            unsigned char rnd[12];
            size_t al, bl, i;
            int cmp, want;

            th_fill(rnd, sizeof(rnd), seed + 1);
            al = rnd[0] % 6;
            bl = rnd[1] % 6;
            for (i = 0; i < 5; i++) {
                a[i] = alphabet[rnd[2 + i] % sizeof(alphabet)];
                b[i] = alphabet[rnd[7 + i] % sizeof(alphabet)];
            }
            if (seed % 3 == 0 && al <= bl)
                memcpy(b, a, al);   /* plenty of shared prefixes */
            buf_reset(&e);
            buf_reset(&ea);
            assert_int_equal(flat_encode(&e, b, bl), FLAT_OK);
            assert_int_equal(flat_encode(&ea, a, al), FLAT_OK);
            assert_int_equal(flat_compare_encoded(flags, a, al, e.s, e.len, &cmp),
                             FLAT_OK);
            want = cyrusdb_compare(flags, ea.s, ea.len, e.s, e.len);
            want = want < 0 ? -1 : want > 0;
            assert_int_equal(cmp < 0 ? -1 : cmp > 0, want);
            cmp = flat_compare_keys(flags, a, al, b, bl);
            assert_int_equal(cmp < 0 ? -1 : cmp > 0, want);
            /* where no NUL, TAB, LF or CR is involved, the plain order */
            if (!memchr(a, '\0', al) && !memchr(b, '\0', bl) &&
                !memchr(a, '\t', al) && !memchr(b, '\t', bl) &&
                !memchr(a, '\n', al) && !memchr(b, '\n', bl) &&
                !memchr(a, '\r', al) && !memchr(b, '\r', bl)) {
                int plain = cyrusdb_compare(flags, a, al, b, bl);
                assert_int_equal(plain < 0 ? -1 : plain > 0, want);
            }
        }
    }
    buf_free(&e);
    buf_free(&ea);
}

/* ---- exact bytes on disk ------------------------------------------------- */

static void test_exact_bytes_written(void **state)
{
    static const char key[] = "k\0\t\n\r\377";
    static const char val[] = "v\0\t\n\r\377z";
    static const char want[] =
        "k\377\200\377\211\377\212\377\215\377\377\t"
        "v\377\200\377\211\377\212\377\215\377\377z\n"
        "plain\tvalue\n";
    char *p = path_of("exact.db");
    struct cyrusdb *db = open_db(p, CYRUSDB_CREATE | CYRUSDB_MBOXSORT);

    (void)state;
    put(db, key, sizeof(key) - 1, val, sizeof(val) - 1, NULL);
    put_s(db, "plain", "value", NULL);
    assert_file_bytes(p, want, sizeof(want) - 1);
    expect(db, key, sizeof(key) - 1, val, sizeof(val) - 1, NULL);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);

    /* and a fresh handle reads the same */
    db = open_db(p, CYRUSDB_MBOXSORT);
    expect(db, key, sizeof(key) - 1, val, sizeof(val) - 1, NULL);
    expect_s(db, "plain", "value", NULL);
    cyrusdb_close(&db);
    free(p);
}

/* A file as Cyrus 3.6's cyr_dbtool writes it (bytes taken from one). */
static const char cyrus_file[] =
    "k\377\211x\377\215y\377\212z\377\377w\t"
    "v\377\2111\377\2152\377\2123\377\3774\\\n"
    "user\tv4\n"
    "user.a\tv1\n"
    "user.a.b\tv3\n"
    "user-b\tv2\n";

static void test_read_cyrus_file(void **state)
{
    char *p = path_of("cyrus.db");
    struct cyrusdb *db;
    struct buf b = BUF_INITIALIZER;
    const char *format = NULL;
    static const char k1[] = "k\tx\ry\nz\377w";
    static const char v1[] = "v\t1\r2\n3\3774\\";

    (void)state;
    write_file(p, cyrus_file, sizeof(cyrus_file) - 1);
    assert_int_equal(cyrusdb_detect(p, &format), CYRUSDB_OK);
    assert_string_equal(format, "flat");

    db = open_db(p, CYRUSDB_MBOXSORT);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    expect(db, k1, sizeof(k1) - 1, v1, sizeof(v1) - 1, NULL);
    expect_s(db, "user", "v4", NULL);
    expect_s(db, "user.a", "v1", NULL);
    expect_s(db, "user.a.b", "v3", NULL);
    expect_s(db, "user-b", "v2", NULL);
    expect_s(db, "user.", NULL, NULL);
    expect_s(db, "aaa", NULL, NULL);
    expect_s(db, "zzz", NULL, NULL);
    expect_walk(db, "user", "user=v4;user.a=v1;user.a.b=v3;user-b=v2;", NULL);
    expect_walk(db, "user.", "user.a=v1;user.a.b=v3;", NULL);

    /* a change rewrites only its own line: the rest stays byte for byte */
    put_s(db, "user.a", "NEW", NULL);
    read_file(p, &b);
    {
        static const char want[] =
            "k\377\211x\377\215y\377\212z\377\377w\t"
            "v\377\2111\377\2152\377\2123\377\3774\\\n"
            "user\tv4\n"
            "user.a\tNEW\n"
            "user.a.b\tv3\n"
            "user-b\tv2\n";
        assert_int_equal(b.len, sizeof(want) - 1);
        assert_memory_equal(b.s, want, sizeof(want) - 1);
    }
    cyrusdb_close(&db);
    buf_free(&b);
    free(p);
}

/* Keys with control and high bytes, as Cyrus 3.6's cyr_dbtool orders them
 * (taken from a file it wrote with `cyr_dbtool -n FILE flat set` fed
 * KEY<TAB>VALUE lines): the order of the encoded keys, '.' first. */
static const char cyrus_high_file[] =
    "a\t1\n"
    "b\t4\n"
    "k\t11\n"
    "k.x\t12\n"
    "k\001\t10\n"
    "k-x\t13\n"
    "k\377\200\t9\n"
    "ne\t7\n"
    "n\377\200ul\t6\n"
    "\177\t5\n"
    "\200\t3\n"
    "\377\215k\t8\n"
    "\377\377z\t2\n";

static void test_cyrus_order_of_control_bytes(void **state)
{
    static const struct { const char *k; size_t kl; const char *v; } recs[] = {
        { "a", 1, "1" }, { "\377z", 2, "2" }, { "\200", 1, "3" },
        { "b", 1, "4" }, { "\177", 1, "5" }, { "n\0ul", 4, "6" },
        { "ne", 2, "7" }, { "\rk", 2, "8" }, { "k\0", 2, "9" },
        { "k\001", 2, "10" }, { "k", 1, "11" }, { "k.x", 3, "12" },
        { "k-x", 3, "13" },
    };
    char *pc = path_of("cyrus-high.db"), *po = path_of("ours-high.db");
    struct cyrusdb *db;
    struct cyrusdb_txn *tid = NULL;
    size_t i;

    (void)state;
    /* Cyrus's file: consistent, every key found; the file is in Cyrus's
     * order of escaped keys, the walk in the API's order of plain keys */
    write_file(pc, cyrus_high_file, sizeof(cyrus_high_file) - 1);
    db = open_db(pc, CYRUSDB_MBOXSORT);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    for (i = 0; i < sizeof(recs) / sizeof(recs[0]); i++)
        expect(db, recs[i].k, recs[i].kl, recs[i].v, strlen(recs[i].v), NULL);
    {
        static const char want[] = "k=11;k.x=12;k\0=9;k\001=10;k-x=13;";
        expect_walk_bytes(db, "k", want, sizeof(want) - 1);
    }
    cyrusdb_close(&db);

    /* ours, written in another order, is the same file byte for byte */
    db = open_db(po, CYRUSDB_CREATE | CYRUSDB_MBOXSORT);
    for (i = 0; i < sizeof(recs) / sizeof(recs[0]); i++) {
        size_t j = (i * 5) % (sizeof(recs) / sizeof(recs[0]));
        put(db, recs[j].k, recs[j].kl, recs[j].v, strlen(recs[j].v),
            i % 2 ? &tid : NULL);
        if (tid) {
            assert_int_equal(cyrusdb_commit(db, tid), CYRUSDB_OK);
            tid = NULL;
        }
    }
    assert_file_bytes(po, cyrus_high_file, sizeof(cyrus_high_file) - 1);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    free(pc);
    free(po);
}

static void test_order_on_disk(void **state)
{
    static const char *keys[] = { "b", "a.b", "a", "a-b", "a.b.c", "a\001", "a0" };
    static const char want_mbox[] =
        "a\t1\na.b\t1\na.b.c\t1\na\001\t1\na-b\t1\na0\t1\nb\t1\n";
    static const char want_raw[] =
        "a\t1\na\001\t1\na-b\t1\na.b\t1\na.b.c\t1\na0\t1\nb\t1\n";
    char *pm = path_of("order-mbox.db"), *pr = path_of("order-raw.db");
    struct cyrusdb *dm = open_db(pm, CYRUSDB_CREATE | CYRUSDB_MBOXSORT);
    struct cyrusdb *dr = open_db(pr, CYRUSDB_CREATE);
    struct cyrusdb_txn *tid = NULL;
    size_t i;

    (void)state;
    /* half one at a time, half in one transaction */
    for (i = 0; i < 7; i++) {
        if (i % 2)
            put_s(dm, keys[i], "1", NULL);
        put_s(dr, keys[i], "1", NULL);
    }
    for (i = 0; i < 7; i += 2)
        put_s(dm, keys[i], "1", &tid);
    assert_int_equal(cyrusdb_commit(dm, tid), CYRUSDB_OK);
    assert_file_bytes(pm, want_mbox, sizeof(want_mbox) - 1);
    assert_file_bytes(pr, want_raw, sizeof(want_raw) - 1);
    assert_int_equal(cyrusdb_consistent(dm), CYRUSDB_OK);
    assert_int_equal(cyrusdb_consistent(dr), CYRUSDB_OK);
    for (i = 0; i < 7; i++) {
        expect_s(dm, keys[i], "1", NULL);
        expect_s(dr, keys[i], "1", NULL);
    }
    expect_walk(dm, "a", "a=1;a.b=1;a.b.c=1;a\001=1;a-b=1;a0=1;", NULL);
    expect_walk(dr, "a.", "a.b=1;a.b.c=1;", NULL);
    cyrusdb_close(&dm);
    cyrusdb_close(&dr);

    /* a file in one order is not consistent in the other */
    dr = open_db(pm, 0);
    assert_int_equal(cyrusdb_consistent(dr), CYRUSDB_IOERROR);
    cyrusdb_close(&dr);
    dm = open_db(pr, CYRUSDB_MBOXSORT);
    assert_int_equal(cyrusdb_consistent(dm), CYRUSDB_IOERROR);
    cyrusdb_close(&dm);
    free(pm);
    free(pr);
}

/* ---- crash leftovers and damage ----------------------------------------- */

static void test_stale_new_file(void **state)
{
    char *p = path_of("stale.db"), *pn = path_of("stale.db.NEW");
    static const char junk[] = "half\twritten\nzz\tby a writer that";
    struct cyrusdb *db;
    struct stat st;

    (void)state;
    write_file(p, "a\t1\nc\t3\n", 8);
    write_file(pn, junk, sizeof(junk) - 1);    /* a crash before rename */
    db = open_db(p, 0);
    expect_s(db, "a", "1", NULL);
    expect_s(db, "half", NULL, NULL);
    expect_walk(db, NULL, "a=1;c=3;", NULL);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);

    /* the next write replaces the stray and leaves none */
    put_s(db, "b", "2", NULL);
    assert_int_equal(stat(pn, &st), -1);
    assert_int_equal(errno, ENOENT);
    assert_file_bytes(p, "a\t1\nb\t2\nc\t3\n", 12);
    cyrusdb_close(&db);

    /* recovery removes a stray next to a flat file */
    write_file(pn, junk, sizeof(junk) - 1);
    assert_int_equal(cyrusdb_flat.recover(tmpdir, 0), CYRUSDB_OK);
    assert_int_equal(stat(pn, &st), -1);
    assert_file_bytes(p, "a\t1\nb\t2\nc\t3\n", 12);
    free(p);
    free(pn);
}

struct damage_case {
    const char *name;
    const char *bytes;
    size_t len;
    const char *probe;      /* a fetch that must report the damage */
};

static int any_cb(void *rock, const char *k, size_t kl, const char *d, size_t dl)
{
    (void)k; (void)kl; (void)d; (void)dl;
    ++*(int *)rock;
    return 0;
}

static void test_malformed_files(void **state)
{
    static const struct damage_case cases[] = {
#define C(n, s, probe) { n, s, sizeof(s) - 1, probe }
        C("notab", "a\t1\nno tab on this line, which is a long one\n", "b"),
        C("midnotab", "a\t1\nbroken line\nc\t3\n", NULL),
        C("nolf", "a\t1\nb\t2", "b"),
        C("emptykey", "a\t1\n\tvalue of a line without a key\n", "b"),
        C("badescape", "a\t\377A\n", "a"),
        C("trailingesc", "a\tv\377\n", "a"),
        C("rawcr", "a\tv\r\n", "a"),
        C("badkeyescape", "a\377Q\t1\n", "a"),
        C("order", "b\t1\na\t2\n", NULL),
        C("dup", "a\t1\na\t2\n", NULL),
#undef C
    };
    static const char *probes[] = { "a", "b", "c", "broken line", "zzz", "0" };
    size_t i, j;

    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *p = path_of(cases[i].name);
        struct cyrusdb *db = NULL;
        const char *err;
        const char *data;
        size_t len;
        int n = 0, r;

        write_file(p, cases[i].bytes, cases[i].len);
        r = cyrusdb_open("flat", p, CYRUSDB_MBOXSORT, &db, &err);
        if (r != CYRUSDB_OK) {
            /* detect may refuse a file whose first line has no key */
            assert_int_equal(r, CYRUSDB_BADFORMAT);
            free(p);
            continue;
        }
        assert_int_equal(cyrusdb_consistent(db), CYRUSDB_IOERROR);
        for (j = 0; j < sizeof(probes) / sizeof(probes[0]); j++) {
            r = cyrusdb_fetch(db, probes[j], strlen(probes[j]), &data, &len, NULL);
            assert_true(r == CYRUSDB_OK || r == CYRUSDB_NOTFOUND ||
                        r == CYRUSDB_IOERROR);
        }
        if (cases[i].probe)
            assert_int_equal(cyrusdb_fetch(db, cases[i].probe,
                                           strlen(cases[i].probe),
                                           &data, &len, NULL),
                             CYRUSDB_IOERROR);
        r = cyrusdb_foreach(db, NULL, 0, NULL, any_cb, &n, NULL);
        assert_true(r == CYRUSDB_OK || r == CYRUSDB_IOERROR);
        assert_int_equal(cyrusdb_checkpoint(db), CYRUSDB_IOERROR);
        /* the damaged file is left alone */
        assert_file_bytes(p, cases[i].bytes, cases[i].len);
        cyrusdb_close(&db);
        free(p);
    }
}

static void test_detect(void **state)
{
    (void)state;
    assert_true(cyrusdb_flat.detect("", 0));
    assert_true(cyrusdb_flat.detect("a\tb\n", 4));
    assert_true(cyrusdb_flat.detect("user.x\t\377\200\n", 10));
    assert_true(cyrusdb_flat.detect("longkey\tvalue without end", 25));
    assert_false(cyrusdb_flat.detect("a\tb\0\n", 5));
    assert_false(cyrusdb_flat.detect("\241\002\213\015skiplist file\0\0\0", 20));
    assert_false(cyrusdb_flat.detect("configdirectory: /x\n", 20));
    assert_false(cyrusdb_flat.detect("no tab\nb\tc\n", 11));
}

static void test_empty_file(void **state)
{
    char *p = path_of("empty.db");
    struct cyrusdb *db;

    (void)state;
    write_file(p, "", 0);
    db = open_db(p, 0);
    expect_s(db, "a", NULL, NULL);
    expect_walk(db, NULL, "", NULL);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    put_s(db, "a", "", NULL);                /* empty value */
    assert_file_bytes(p, "a\t\n", 3);
    expect_s(db, "a", "", NULL);
    assert_int_equal(cyrusdb_delete(db, "a", 1, NULL, 0), CYRUSDB_OK);
    assert_file_bytes(p, "", 0);
    assert_int_equal(cyrusdb_delete(db, "a", 1, NULL, 0), CYRUSDB_NOTFOUND);
    assert_int_equal(cyrusdb_delete(db, "a", 1, NULL, 1), CYRUSDB_OK);
    cyrusdb_close(&db);
    free(p);
}

/* ---- transactions --------------------------------------------------------- */

static int restore_cb(void *rock, const char *key, size_t keylen,
                      const char *data, size_t datalen)
{
    struct cyrusdb_txn **tid = ((void **)rock)[1];
    struct cyrusdb *db = ((void **)rock)[0];
    char newkey[64];

    (void)data; (void)datalen;
    /* rename "x.N" to "y.N" and drop "x.N", inside the walk */
    assert_true(keylen < sizeof(newkey));
    memcpy(newkey, key, keylen);
    newkey[0] = 'y';
    assert_int_equal(cyrusdb_store(db, newkey, keylen, "moved", 5, tid),
                     CYRUSDB_OK);
    assert_int_equal(cyrusdb_delete(db, key, keylen, tid, 0), CYRUSDB_OK);
    return 0;
}

static void test_transaction_view(void **state)
{
    char *p = path_of("txn.db");
    struct cyrusdb *db = open_db(p, CYRUSDB_CREATE | CYRUSDB_MBOXSORT);
    struct cyrusdb *other = open_db(p, CYRUSDB_MBOXSORT);
    struct cyrusdb_txn *tid = NULL, *bogus = (struct cyrusdb_txn *)&tid;
    struct buf before = BUF_INITIALIZER;
    void *rock[2];

    (void)state;
    put_s(db, "a", "1", NULL);
    put_s(db, "c", "3", NULL);
    put_s(db, "x.1", "x", NULL);
    put_s(db, "x.2", "x", NULL);
    read_file(p, &before);

    put_s(db, "b", "2", &tid);
    assert_non_null(tid);
    assert_int_equal(cyrusdb_delete(db, "a", 1, &tid, 0), CYRUSDB_OK);
    assert_int_equal(cyrusdb_create(db, "c", 1, "x", 1, &tid), CYRUSDB_EXISTS);
    assert_int_equal(cyrusdb_create(db, "a", 1, "again", 5, &tid), CYRUSDB_OK);
    assert_int_equal(cyrusdb_delete(db, "nope", 4, &tid, 0), CYRUSDB_NOTFOUND);
    expect_s(db, "a", "again", &tid);
    expect_s(db, "b", "2", &tid);
    expect_walk(db, NULL, "a=again;b=2;c=3;x.1=x;x.2=x;", &tid);

    /* misuse */
    assert_int_equal(cyrusdb_store(db, "q", 1, "", 0, NULL), CYRUSDB_LOCKED);
    assert_int_equal(cyrusdb_store(db, "q", 1, "", 0, &bogus), CYRUSDB_INTERNAL);

    /* outside the transaction: the committed state */
    expect_s(db, "a", "1", NULL);
    expect_s(other, "b", NULL, NULL);
    assert_file_bytes(p, before.s, before.len);

    /* changes made by a callback during the walk */
    rock[0] = db;
    rock[1] = &tid;
    assert_int_equal(cyrusdb_foreach(db, "x.", 2, NULL, restore_cb, rock, &tid),
                     CYRUSDB_OK);
    expect_walk(db, NULL, "a=again;b=2;c=3;y.1=moved;y.2=moved;", &tid);

    assert_int_equal(cyrusdb_abort(db, tid), CYRUSDB_OK);
    tid = NULL;
    assert_file_bytes(p, before.s, before.len);
    expect_walk(db, NULL, "a=1;c=3;x.1=x;x.2=x;", NULL);

    /* the same again, committed */
    put_s(db, "b", "2", &tid);
    assert_int_equal(cyrusdb_foreach(db, "x.", 2, NULL, restore_cb, rock, &tid),
                     CYRUSDB_OK);
    assert_int_equal(cyrusdb_commit(db, tid), CYRUSDB_OK);
    tid = NULL;
    assert_file_bytes(p, "a\t1\nb\t2\nc\t3\ny.1\tmoved\ny.2\tmoved\n", 32);
    expect_walk(other, NULL, "a=1;b=2;c=3;y.1=moved;y.2=moved;", NULL);

    /* fetchlock of a missing key begins the transaction */
    assert_int_equal(cyrusdb_fetchlock(db, "zz", 2, NULL, NULL, &tid),
                     CYRUSDB_NOTFOUND);
    assert_non_null(tid);
    assert_int_equal(cyrusdb_commit(db, tid), CYRUSDB_OK);
    tid = NULL;

    /* close with an open transaction aborts it */
    put_s(db, "w", "1", &tid);
    cyrusdb_close(&db);
    expect_s(other, "w", NULL, NULL);
    cyrusdb_close(&other);
    buf_free(&before);
    free(p);
}

static int store_in_walk_cb(void *rock, const char *key, size_t keylen,
                            const char *data, size_t datalen)
{
    struct cyrusdb *db = rock;
    char k[64];

    (void)data; (void)datalen;
    if (keylen + 2 > sizeof(k) || key[0] != 'm')
        return 0;
    memcpy(k, key, keylen);
    k[0] = 'n';
    /* a write of its own (no transaction) from inside a plain walk */
    assert_int_equal(cyrusdb_store(db, k, keylen, "n", 1, NULL), CYRUSDB_OK);
    return 0;
}

static void test_write_inside_plain_walk(void **state)
{
    char *p = path_of("walkwrite.db");
    struct cyrusdb *db = open_db(p, CYRUSDB_CREATE);
    struct buf b = BUF_INITIALIZER;

    (void)state;
    put_s(db, "m1", "m", NULL);
    put_s(db, "m2", "m", NULL);
    put_s(db, "m3", "m", NULL);
    assert_int_equal(cyrusdb_foreach(db, NULL, 0, NULL, store_in_walk_cb, db,
                                     NULL), CYRUSDB_OK);
    expect_walk(db, NULL, "m1=m;m2=m;m3=m;n1=n;n2=n;n3=n;", NULL);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    buf_free(&b);
    cyrusdb_close(&db);
    free(p);
}

struct peer_walk {
    struct cyrusdb *h2;
    const char *path;
    int checked;
};

/* Can another process take the write lock now?  1 yes, 0 no. */
static int other_process_can_write(const char *path)
{
    pid_t pid = fork();

    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(path, O_RDWR);
        _exit(fd >= 0 && fs_lock(fd, F_WRLCK, 0) == 0 ? 1 : 0);
    }
    return wait_child(pid);
}

static int peer_walk_cb(void *rock, const char *key, size_t keylen,
                        const char *data, size_t datalen)
{
    struct peer_walk *pw = rock;

    (void)key; (void)keylen; (void)data; (void)datalen;
    if (pw->checked++)
        return 0;
    /* the second handle reads (its lock and unlock must not drop the
     * walk's shared lock) and cannot write */
    expect_s(pw->h2, "a", "1", NULL);
    assert_int_equal(cyrusdb_store(pw->h2, "z", 1, "1", 1, NULL),
                     CYRUSDB_LOCKED);
    assert_int_equal(other_process_can_write(pw->path), 0);
    return 0;
}

static void test_two_handles_one_process(void **state)
{
    char *p = path_of("twohandles.db");
    struct cyrusdb *h1 = open_db(p, CYRUSDB_CREATE);
    struct cyrusdb *h2 = open_db(p, 0);
    struct cyrusdb_txn *tid = NULL;

    (void)state;
    put_s(h1, "a", "1", NULL);
    put_s(h1, "b", "1", &tid);
    /* h2 cannot wait for a lock its own process holds: it must not
     * write behind h1's back (h1's commit would undo it) */
    assert_int_equal(cyrusdb_store(h2, "c", 1, "1", 1, NULL), CYRUSDB_LOCKED);
    expect_s(h2, "a", "1", NULL);
    {
        /* a read-only handle reads beside the writer without weakening
         * the process's exclusive lock */
        struct cyrusdb *h3 = open_db(p, CYRUSDB_RDONLY);
        expect_s(h3, "a", "1", NULL);
        expect_s(h3, "b", NULL, NULL);
        assert_int_equal(other_process_can_write(p), 0);
        cyrusdb_close(&h3);
        assert_int_equal(other_process_can_write(p), 0);
    }
    assert_int_equal(cyrusdb_commit(h1, tid), CYRUSDB_OK);
    put_s(h2, "c", "1", NULL);
    expect_walk(h1, NULL, "a=1;b=1;c=1;", NULL);

    {
        struct peer_walk pw = { h2, p, 0 };
        assert_int_equal(other_process_can_write(p), 1);
        assert_int_equal(cyrusdb_foreach(h1, NULL, 0, NULL, peer_walk_cb, &pw,
                                         NULL), CYRUSDB_OK);
        assert_int_equal(pw.checked, 3);
        assert_int_equal(other_process_can_write(p), 1);
    }
    cyrusdb_close(&h2);
    put_s(h1, "d", "1", NULL);
    cyrusdb_close(&h1);
    free(p);
}

static void test_checkpoint_rewrites(void **state)
{
    char *p = path_of("ckpt.db");
    struct cyrusdb *db;
    struct stat st1, st2;

    (void)state;
    write_file(p, cyrus_file, sizeof(cyrus_file) - 1);
    db = open_db(p, CYRUSDB_MBOXSORT);
    assert_int_equal(stat(p, &st1), 0);
    assert_int_equal(cyrusdb_checkpoint(db), CYRUSDB_OK);
    assert_int_equal(stat(p, &st2), 0);
    assert_true(st1.st_ino != st2.st_ino);
    assert_file_bytes(p, cyrus_file, sizeof(cyrus_file) - 1);
    expect_s(db, "user.a.b", "v3", NULL);
    cyrusdb_close(&db);
    free(p);
}

/* ---- several processes ----------------------------------------------------- */

static void test_fork_sees_commit(void **state)
{
    char *p = path_of("fork.db");
    struct cyrusdb *db = open_db(p, CYRUSDB_CREATE);
    pid_t pid;

    (void)state;
    put_s(db, "k", "old", NULL);
    expect_s(db, "k", "old", NULL);

    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct cyrusdb *c = NULL;
        struct cyrusdb_txn *tid = NULL;
        const char *err;
        int ok = cyrusdb_open("flat", p, 0, &c, &err) == CYRUSDB_OK &&
                 cyrusdb_store(c, "k", 1, "new", 3, &tid) == CYRUSDB_OK &&
                 cyrusdb_store(c, "k2", 2, "v2", 2, &tid) == CYRUSDB_OK &&
                 cyrusdb_commit(c, tid) == CYRUSDB_OK &&
                 cyrusdb_close(&c) == CYRUSDB_OK;
        _exit(ok ? 0 : 1);
    }
    assert_int_equal(wait_child(pid), 0);
    /* the old handle follows the rename */
    expect_s(db, "k", "new", NULL);
    expect_walk(db, NULL, "k=new;k2=v2;", NULL);
    put_s(db, "k3", "v3", NULL);
    expect_walk(db, NULL, "k=new;k2=v2;k3=v3;", NULL);
    cyrusdb_close(&db);
    free(p);
}

/* A reader holding the map of the old file while a writer replaces it. */
static void test_old_map_stays_consistent(void **state)
{
    char *p = path_of("oldmap.db");
    struct cyrusdb *db = open_db(p, CYRUSDB_CREATE);
    struct cyrusdb_txn *tid = NULL;
    struct flat_map map = FLAT_MAP_INITIALIZER;
    struct buf before = BUF_INITIALIZER;
    const char *why;
    size_t off, count;
    struct stat st;
    char key[16];
    int i, fd, found;
    pid_t pid;

    (void)state;
    for (i = 0; i < 200; i++) {
        snprintf(key, sizeof(key), "key%03d", i);
        put_s(db, key, "old", &tid);
    }
    assert_int_equal(cyrusdb_commit(db, tid), CYRUSDB_OK);
    read_file(p, &before);

    fd = open(p, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(flat_map_fd(fd, (size_t)st.st_size, &map), FLAT_OK);

    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct cyrusdb *c = NULL;
        struct cyrusdb_txn *t = NULL;
        const char *err;
        int ok = cyrusdb_open("flat", p, 0, &c, &err) == CYRUSDB_OK;
        for (i = 0; ok && i < 200; i += 2) {
            char k[16];
            snprintf(k, sizeof(k), "key%03d", i);
            ok = cyrusdb_store(c, k, strlen(k), "new-and-longer", 14, &t) ==
                     CYRUSDB_OK &&
                 cyrusdb_delete(c, k + 0, strlen(k), NULL, 0) == CYRUSDB_LOCKED;
        }
        ok = ok && cyrusdb_commit(c, t) == CYRUSDB_OK;
        _exit(ok ? 0 : 1);
    }
    assert_int_equal(wait_child(pid), 0);

    /* the old map: unchanged, complete, in order */
    assert_int_equal(map.size, before.len);
    assert_memory_equal(map.base, before.s, before.len);
    assert_int_equal(flat_check(&map, 0, &count, &off, &why), FLAT_OK);
    assert_int_equal(count, 200);
    assert_int_equal(flat_search(&map, 0, "key100", 6, &off, &found), FLAT_OK);
    assert_true(found);
    flat_map_release(&map);
    close(fd);

    /* the handle sees the new state */
    expect_s(db, "key100", "new-and-longer", NULL);
    expect_s(db, "key101", "old", NULL);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    buf_free(&before);
    free(p);
}

struct walk_state {
    const char *path;
    pid_t writer;
    int seen;
    int all_old;
    int writer_blocked;
};

static int walk_with_writer_cb(void *rock, const char *key, size_t keylen,
                               const char *data, size_t datalen)
{
    struct walk_state *ws = rock;

    (void)key; (void)keylen;
    if (datalen != 3 || memcmp(data, "old", 3) != 0)
        ws->all_old = 0;
    if (ws->seen++ == 0) {
        int status;
        ws->writer = fork();
        if (ws->writer == 0) {
            struct cyrusdb *c = NULL;
            struct cyrusdb_txn *t = NULL;
            const char *err;
            int ok = cyrusdb_open("flat", ws->path, 0, &c, &err) == CYRUSDB_OK &&
                     cyrusdb_store(c, "k0", 2, "new", 3, &t) == CYRUSDB_OK &&
                     cyrusdb_store(c, "k5", 2, "new", 3, &t) == CYRUSDB_OK &&
                     cyrusdb_delete(c, "k9", 2, &t, 0) == CYRUSDB_OK &&
                     cyrusdb_commit(c, t) == CYRUSDB_OK;
            _exit(ok ? 0 : 1);
        }
        /* the writer must wait for our shared lock */
        sleep_ms(300);
        ws->writer_blocked = waitpid(ws->writer, &status, WNOHANG) == 0;
    }
    return 0;
}

static void test_reader_lock_holds_writer(void **state)
{
    char *p = path_of("readlock.db");
    struct cyrusdb *db = open_db(p, CYRUSDB_CREATE);
    struct cyrusdb_txn *tid = NULL;
    struct walk_state ws = { p, -1, 0, 1, 0 };
    char key[8];
    int i;

    (void)state;
    for (i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        put_s(db, key, "old", &tid);
    }
    assert_int_equal(cyrusdb_commit(db, tid), CYRUSDB_OK);

    assert_int_equal(cyrusdb_foreach(db, NULL, 0, NULL, walk_with_writer_cb,
                                     &ws, NULL), CYRUSDB_OK);
    assert_true(ws.writer > 0);
    assert_int_equal(ws.seen, 10);
    assert_true(ws.all_old);
    assert_true(ws.writer_blocked);
    assert_int_equal(wait_child(ws.writer), 0);
    expect_s(db, "k0", "new", NULL);
    expect_s(db, "k9", NULL, NULL);
    cyrusdb_close(&db);
    free(p);
}

#define INCR_CHILDREN 3
#define INCR_ROUNDS 40

/* Read-modify-write from several processes at once: no lost update. */
static void test_concurrent_increments(void **state)
{
    char *p = path_of("counter.db");
    struct cyrusdb *db = open_db(p, CYRUSDB_CREATE);
    pid_t pids[INCR_CHILDREN];
    char want[16];
    int i;

    (void)state;
    put_s(db, "counter", "0", NULL);
    for (i = 0; i < INCR_CHILDREN; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            struct cyrusdb *c = NULL;
            const char *err;
            int n, ok = cyrusdb_open("flat", p, 0, &c, &err) == CYRUSDB_OK;
            for (n = 0; ok && n < INCR_ROUNDS; n++) {
                struct cyrusdb_txn *t = NULL;
                const char *data;
                size_t len;
                char num[32];
                ok = cyrusdb_fetchlock(c, "counter", 7, &data, &len, &t) ==
                     CYRUSDB_OK && len < sizeof(num);
                if (!ok)
                    break;
                memcpy(num, data, len);
                num[len] = '\0';
                snprintf(num, sizeof(num), "%ld", strtol(num, NULL, 10) + 1);
                ok = cyrusdb_store(c, "counter", 7, num, strlen(num), &t) ==
                         CYRUSDB_OK &&
                     cyrusdb_commit(c, t) == CYRUSDB_OK;
            }
            if (c)
                cyrusdb_close(&c);
            _exit(ok ? 0 : 1);
        }
    }
    for (i = 0; i < INCR_CHILDREN; i++)
        assert_int_equal(wait_child(pids[i]), 0);
    snprintf(want, sizeof(want), "%d", INCR_CHILDREN * INCR_ROUNDS);
    expect_s(db, "counter", want, NULL);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    free(p);
}

static void test_large_value(void **state)
{
    char *p = path_of("large.db");
    struct cyrusdb *db = open_db(p, CYRUSDB_CREATE);
    size_t len = (1u << 20) + 17;
    char *v = malloc(len);

    (void)state;
    assert_non_null(v);
    th_fill(v, len, 7);
    put_s(db, "a", "1", NULL);
    put(db, "big", 3, v, len, NULL);
    put_s(db, "c", "3", NULL);
    cyrusdb_close(&db);
    db = open_db(p, 0);
    expect(db, "big", 3, v, len, NULL);
    expect_s(db, "c", "3", NULL);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    free(v);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode_exact),
        cmocka_unit_test(test_encode_roundtrip_random),
        cmocka_unit_test(test_compare_agrees),
        cmocka_unit_test(test_exact_bytes_written),
        cmocka_unit_test(test_read_cyrus_file),
        cmocka_unit_test(test_cyrus_order_of_control_bytes),
        cmocka_unit_test(test_order_on_disk),
        cmocka_unit_test(test_stale_new_file),
        cmocka_unit_test(test_malformed_files),
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_empty_file),
        cmocka_unit_test(test_transaction_view),
        cmocka_unit_test(test_write_inside_plain_walk),
        cmocka_unit_test(test_two_handles_one_process),
        cmocka_unit_test(test_checkpoint_rewrites),
        cmocka_unit_test(test_fork_sees_commit),
        cmocka_unit_test(test_old_map_stays_consistent),
        cmocka_unit_test(test_reader_lock_holds_writer),
        cmocka_unit_test(test_concurrent_increments),
        cmocka_unit_test(test_large_value),
    };

    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
