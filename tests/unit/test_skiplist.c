/*
 * test_skiplist.c - the skiplist file format byte for byte, exchange with
 * Cyrus 3.6's own cyr_dbtool, recovery of an uncommitted tail, checkpoint,
 * other processes following commits and checkpoints, and damage detection.
 *
 * The Cyrus cases need /usr/lib/cyrus/bin/cyr_dbtool (skipped without it).
 * cyr_dbtool switches to the "cyrus" user when run as root, so the test
 * directory is made world-writable and our files are handed to that user.
 * A skipstamp of 1 in the Cyrus config directory keeps cyr_dbtool from
 * recovering (rewriting) our files on open, so it reads our bytes as is.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
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
#include "lib/buf.h"
#include "lib/log.h"
#include "tests/testhelp.h"

#define CYR_DBTOOL "/usr/lib/cyrus/bin/cyr_dbtool"
#define HEADER_SIZE 48
#define DUMMY_SIZE 96
#define FIRST_REC (HEADER_SIZE + DUMMY_SIZE)

struct fixture {
    char *dir;
    char *db;       /* dir/x.db */
    char *conf;     /* dir/imapd.conf for cyr_dbtool */
    char *stamp;    /* Cyrus's skipstamp in its config directory */
};

static void write_stamp(struct fixture *f);

/* ---- helpers -------------------------------------------------------- */

static uint32_t get32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static unsigned char *slurp(const char *path, size_t *len_r)
{
    struct stat st;
    unsigned char *p;
    int fd = open(path, O_RDONLY);

    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &st), 0);
    p = malloc((size_t)st.st_size + 1);
    assert_non_null(p);
    assert_int_equal(read(fd, p, (size_t)st.st_size), st.st_size);
    close(fd);
    *len_r = (size_t)st.st_size;
    return p;
}

static void write_at(const char *path, off_t off, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY);

    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, data, len, off), (ssize_t)len);
    close(fd);
}

static off_t file_size(const char *path)
{
    struct stat st;

    assert_int_equal(stat(path, &st), 0);
    return st.st_size;
}

static ino_t file_ino(const char *path)
{
    struct stat st;

    assert_int_equal(stat(path, &st), 0);
    return st.st_ino;
}

static struct cyrusdb *open_db(const char *path, int flags)
{
    struct cyrusdb *db = NULL;
    const char *err = NULL;
    int r = cyrusdb_open("skiplist", path, flags, &db, &err);

    if (r != CYRUSDB_OK)
        fail_msg("open %s: %s (%s)", path, cyrusdb_strerror(r), err ? err : "");
    return db;
}

static void put(struct cyrusdb *db, const char *k, const char *v)
{
    assert_int_equal(cyrusdb_store(db, k, strlen(k), v, strlen(v), NULL), CYRUSDB_OK);
}

static void check_value(struct cyrusdb *db, const char *k, const char *v)
{
    const char *data = NULL;
    size_t len = 0;
    int r = cyrusdb_fetch(db, k, strlen(k), &data, &len, NULL);

    if (!v) {
        assert_int_equal(r, CYRUSDB_NOTFOUND);
        return;
    }
    if (r != CYRUSDB_OK)
        fail_msg("fetch %s: %s", k, cyrusdb_strerror(r));
    assert_int_equal(len, strlen(v));
    assert_memory_equal(data, v, len);
}

static int collect_cb(void *rock, const char *k, size_t kl, const char *d, size_t dl)
{
    struct buf *b = rock;

    buf_append(b, k, kl);
    buf_putc(b, '=');
    buf_append(b, d, dl);
    buf_putc(b, '\n');
    return 0;
}

/* All records as "k=v\n" lines; returns the foreach result. */
static int collect(struct cyrusdb *db, const char *prefix, struct buf *out)
{
    buf_reset(out);
    return cyrusdb_foreach(db, prefix, prefix ? strlen(prefix) : 0, NULL,
                           collect_cb, out, NULL);
}

static int have_cyrus(void)
{
    return access(CYR_DBTOOL, X_OK) == 0;
}

/* Hand a path to the cyrus user when we are root (cyr_dbtool runs as it). */
static void give_to_cyrus(const char *path)
{
    struct passwd *pw;

    if (geteuid() != 0)
        return;
    pw = getpwnam("cyrus");
    if (pw && chown(path, pw->pw_uid, pw->pw_gid) < 0)
        fail_msg("chown %s: %s", path, strerror(errno));
}

/* Run cyr_dbtool with the fixture's config; stdout into out (if given).
 * Returns the exit status. */
static int cyr_dbtool(struct fixture *f, struct buf *out, ...)
{
    const char *argv[16];
    int n = 0, pfd[2], status;
    pid_t pid;
    va_list ap;
    const char *a;
    char chunk[4096];
    ssize_t got;

    argv[n++] = CYR_DBTOOL;
    argv[n++] = "-C";
    argv[n++] = f->conf;
    va_start(ap, out);
    while ((a = va_arg(ap, const char *)) != NULL && n < 15)
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    assert_int_equal(pipe(pfd), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_RDWR);
        dup2(pfd[1], 1);
        dup2(devnull, 0);
        dup2(devnull, 2);
        close(pfd[0]);
        execv(CYR_DBTOOL, (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    if (out)
        buf_reset(out);
    while ((got = read(pfd[0], chunk, sizeof(chunk))) > 0)
        if (out)
            buf_append(out, chunk, (size_t)got);
    close(pfd[0]);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* ---- fixture -------------------------------------------------------- */

/* skipstamp 1: Cyrus runs no recovery on files recovered after 1970 */
static void write_stamp(struct fixture *f)
{
    FILE *fp = fopen(f->stamp, "w");

    assert_non_null(fp);
    fwrite("\0\0\0\1", 1, 4, fp);
    fclose(fp);
    give_to_cyrus(f->stamp);
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    char *cdir, *dbdir, *text;
    FILE *fp;

    f->dir = th_mkdtemp("skiplist");
    f->db = th_path(f->dir, "x.db");
    f->conf = th_path(f->dir, "imapd.conf");
    cdir = th_path(f->dir, "conf");
    dbdir = th_path(cdir, "db");
    f->stamp = th_path(dbdir, "skipstamp");
    chmod(f->dir, 0777);
    mkdir(cdir, 0777);
    mkdir(dbdir, 0777);
    chmod(cdir, 0777);
    chmod(dbdir, 0777);
    write_stamp(f);
    fp = fopen(f->conf, "w");
    assert_non_null(fp);
    if (asprintf(&text, "configdirectory: %s\n", cdir) < 0)
        abort();
    fputs(text, fp);
    fclose(fp);
    free(text);
    free(cdir);
    free(dbdir);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;

    th_rmrf(f->dir);
    free(f->dir);
    free(f->db);
    free(f->conf);
    free(f->stamp);
    free(f);
    return 0;
}

/* ---- the format, byte for byte -------------------------------------- */

static void test_header_bytes(void **state)
{
    struct fixture *f = *state;
    struct cyrusdb *db = open_db(f->db, CYRUSDB_CREATE | CYRUSDB_NOCOMPACT);
    unsigned char *p;
    size_t len, i, off, lvl;
    time_t now = time(NULL);

    cyrusdb_close(&db);
    p = slurp(f->db, &len);
    assert_int_equal(len, FIRST_REC);
    assert_memory_equal(p, "\241\002\213\015skiplist file\0\0\0", 20);
    assert_int_equal(get32(p + 20), 1);     /* version */
    assert_int_equal(get32(p + 24), 2);     /* minor */
    assert_int_equal(get32(p + 28), 20);    /* maxlevel */
    assert_int_equal(get32(p + 32), 1);     /* curlevel */
    assert_int_equal(get32(p + 36), 0);     /* listsize */
    assert_int_equal(get32(p + 40), FIRST_REC);  /* logstart */
    assert_true(get32(p + 44) <= (uint32_t)now && get32(p + 44) + 60 >= (uint32_t)now);
    assert_int_equal(get32(p + 48), 257);   /* DUMMY */
    assert_int_equal(get32(p + 52), 0);
    assert_int_equal(get32(p + 56), 0);
    for (i = 0; i < 20; i++)
        assert_int_equal(get32(p + 60 + 4 * i), 0);
    assert_int_equal(get32(p + 140), 0xFFFFFFFFu);
    free(p);

    /* one ADD and its COMMIT */
    db = open_db(f->db, CYRUSDB_NOCOMPACT);
    put(db, "abc", "defgh");
    cyrusdb_close(&db);
    p = slurp(f->db, &len);
    off = FIRST_REC;
    assert_int_equal(get32(p + off), 2);            /* ADD */
    assert_int_equal(get32(p + off + 4), 3);
    assert_memory_equal(p + off + 8, "abc\0", 4);   /* padded to 4 */
    assert_int_equal(get32(p + off + 12), 5);
    assert_memory_equal(p + off + 16, "defgh\0\0\0", 8);
    for (lvl = 0; get32(p + off + 24 + 4 * lvl) != 0xFFFFFFFFu; lvl++)
        assert_int_equal(get32(p + off + 24 + 4 * lvl), 0);   /* last node */
    assert_true(lvl >= 1 && lvl <= 20);
    assert_int_equal(get32(p + 32), lvl > 1 ? lvl : 1);      /* curlevel */
    for (i = 0; i < lvl; i++)                                /* dummy -> it */
        assert_int_equal(get32(p + 60 + 4 * i), off);
    assert_int_equal(len, off + 24 + 4 * lvl + 4 + 4);
    assert_int_equal(get32(p + len - 4), 255);               /* COMMIT */
    free(p);

    /* replace: DELETE old + ADD new (same level) + COMMIT; delete: DELETE */
    db = open_db(f->db, CYRUSDB_NOCOMPACT);
    put(db, "abc", "x");
    assert_int_equal(cyrusdb_delete(db, "abc", 3, NULL, 0), CYRUSDB_OK);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    {
        size_t plen;
        unsigned char *q = slurp(f->db, &plen);
        size_t o = off + 24 + 4 * lvl + 4 + 4;

        assert_int_equal(get32(q + o), 4);          /* DELETE */
        assert_int_equal(get32(q + o + 4), off);
        assert_int_equal(get32(q + o + 8), 2);      /* ADD */
        assert_int_equal(get32(q + o + 12), 3);
        assert_int_equal(get32(q + o + 20), 1);
        assert_memory_equal(q + o + 24, "x\0\0\0", 4);
        assert_int_equal(get32(q + o + 28 + 4 * lvl), 0xFFFFFFFFu);
        o += 28 + 4 * lvl + 4;
        assert_int_equal(get32(q + o), 255);
        assert_int_equal(get32(q + o + 4), 4);      /* DELETE of the new ADD */
        assert_int_equal(get32(q + o + 8), off + 24 + 4 * lvl + 4 + 4 + 8);
        assert_int_equal(get32(q + o + 12), 255);
        assert_int_equal(plen, o + 16);
        for (i = 0; i < 20; i++)                    /* list empty again */
            assert_int_equal(get32(q + 60 + 4 * i), 0);
        free(q);
    }
}

static void test_empty_file(void **state)
{
    struct fixture *f = *state;
    struct cyrusdb *db;
    struct buf b = BUF_INITIALIZER;
    int fd = open(f->db, O_CREAT | O_WRONLY, 0644);

    assert_true(fd >= 0);
    close(fd);
    db = open_db(f->db, CYRUSDB_RDONLY);
    assert_int_equal(collect(db, NULL, &b), CYRUSDB_OK);
    assert_int_equal(b.len, 0);
    check_value(db, "k", NULL);
    cyrusdb_close(&db);
    assert_int_equal(file_size(f->db), 0);     /* read-only never writes */
    db = open_db(f->db, 0);
    put(db, "k", "v");
    check_value(db, "k", "v");
    cyrusdb_close(&db);
    buf_free(&b);
}

static void test_mboxsort_order(void **state)
{
    struct fixture *f = *state;
    struct cyrusdb *db = open_db(f->db, CYRUSDB_CREATE | CYRUSDB_MBOXSORT);
    struct buf b = BUF_INITIALIZER;

    put(db, "user.a-b", "3");
    put(db, "user.ab", "4");
    put(db, "user.a", "1");
    put(db, "user.a.b", "2");
    put(db, "user.\xff", "5");
    assert_int_equal(collect(db, "user.a", &b), CYRUSDB_OK);
    assert_string_equal(buf_cstring(&b), "user.a=1\nuser.a.b=2\nuser.a-b=3\nuser.ab=4\n");
    assert_int_equal(cyrusdb_checkpoint(db), CYRUSDB_OK);
    assert_int_equal(collect(db, NULL, &b), CYRUSDB_OK);
    assert_string_equal(buf_cstring(&b),
                        "user.a=1\nuser.a.b=2\nuser.a-b=3\nuser.ab=4\nuser.\xff=5\n");
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    buf_free(&b);
}

/*
 * Without MBOXSORT the file is in Cyrus's order, bytes compared as signed
 * chars; walks and dump are in the API's order (unsigned bytes).  The
 * INORDER records a checkpoint writes are read straight from the file.
 */
static void test_high_bytes_signed_order(void **state)
{
    struct fixture *f = *state;
    struct cyrusdb *db = open_db(f->db, CYRUSDB_CREATE | CYRUSDB_NOCOMPACT);
    /* in signed order, as the file must hold them */
    static const char *const signed_keys[] = {
        "\x80", "\xff", "\x01", "a", "b", "b\x80", "b\x7f", "c"
    };
    enum { NK = sizeof(signed_keys) / sizeof(signed_keys[0]) };
    static const char *const insert[NK] = {
        "b\x7f", "\xff", "a", "c", "b\x80", "\x01", "b", "\x80"
    };
    struct buf b = BUF_INITIALIZER;
    unsigned char *p;
    char *out = NULL;
    size_t len = 0, off, i;
    uint32_t logstart;
    FILE *fp;

    for (i = 0; i < NK; i++) {
        char v[2] = { (char)('0' + i), 0 };
        put(db, insert[i], v);
    }
    for (i = 0; i < NK; i++) {
        char v[2] = { (char)('0' + i), 0 };
        check_value(db, insert[i], v);
    }
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    assert_int_equal(cyrusdb_checkpoint(db), CYRUSDB_OK);
    cyrusdb_close(&db);

    /* the checkpointed part: INORDER records in signed-char key order */
    p = slurp(f->db, &len);
    logstart = get32(p + 40);
    assert_int_equal(get32(p + 36), NK);
    assert_int_equal(logstart, len);
    for (off = FIRST_REC, i = 0; off < logstart; i++) {
        uint32_t kl, dl;

        assert_true(i < NK);
        assert_int_equal(get32(p + off), 1);            /* INORDER */
        kl = get32(p + off + 4);
        assert_int_equal(kl, strlen(signed_keys[i]));
        assert_memory_equal(p + off + 8, signed_keys[i], kl);
        off += 8 + ((kl + 3) & ~3u);
        dl = get32(p + off);
        off += 4 + ((dl + 3) & ~3u);
        while (get32(p + off) != 0xFFFFFFFFu)           /* forward pointers */
            off += 4;
        off += 4;
    }
    assert_int_equal(i, NK);
    assert_int_equal(off, logstart);
    free(p);

    /* walks: API order, for the whole file and for a prefix range that
     * starts with keys below 0x80 and goes on into high ones */
    db = open_db(f->db, 0);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    assert_int_equal(collect(db, NULL, &b), CYRUSDB_OK);
    assert_string_equal(buf_cstring(&b),
                        "\x01=5\na=2\nb=6\nb\x7f=0\nb\x80=4\nc=3\n\x80=7\n\xff=1\n");
    assert_int_equal(collect(db, "b", &b), CYRUSDB_OK);
    assert_string_equal(buf_cstring(&b), "b=6\nb\x7f=0\nb\x80=4\n");
    assert_int_equal(collect(db, "\xff", &b), CYRUSDB_OK);
    assert_string_equal(buf_cstring(&b), "\xff=1\n");

    /* dump detail 0 in API order too */
    fp = open_memstream(&out, &len);
    assert_non_null(fp);
    assert_int_equal(cyrusdb_dump(db, fp, 0), CYRUSDB_OK);
    fclose(fp);
    assert_string_equal(out, "\\x01\t5\na\t2\nb\t6\nb\\x7f\t0\nb\\x80\t4\nc\t3\n"
                             "\\x80\t7\n\\xff\t1\n");
    free(out);

    /* a log on top of the checkpoint: still found, still walked in order */
    put(db, "\xfe", "8");
    assert_int_equal(cyrusdb_delete(db, "b\x7f", 2, NULL, 0), CYRUSDB_OK);
    check_value(db, "\xfe", "8");
    check_value(db, "b\x7f", NULL);
    assert_int_equal(collect(db, NULL, &b), CYRUSDB_OK);
    assert_string_equal(buf_cstring(&b),
                        "\x01=5\na=2\nb=6\nb\x80=4\nc=3\n\x80=7\n\xfe=8\n\xff=1\n");
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    buf_free(&b);
}

/* ---- Cyrus 3.6 interoperation --------------------------------------- */

static void test_cyrus_writes_we_read(void **state)
{
    struct fixture *f = *state;
    struct cyrusdb *db;
    struct buf b = BUF_INITIALIZER;

    if (!have_cyrus())
        skip();
    assert_int_equal(cyr_dbtool(f, NULL, "-n", f->db, "skiplist", "set", "k1", "v1", NULL), 0);
    assert_int_equal(cyr_dbtool(f, NULL, f->db, "skiplist", "set", "k2", "v 2", NULL), 0);
    assert_int_equal(cyr_dbtool(f, NULL, f->db, "skiplist", "set", "k3", "v3", NULL), 0);
    assert_int_equal(cyr_dbtool(f, NULL, f->db, "skiplist", "delete", "k2", NULL), 0);
    assert_int_equal(cyr_dbtool(f, NULL, f->db, "skiplist", "set", "k1", "v1b", NULL), 0);
    assert_int_equal(cyr_dbtool(f, NULL, f->db, "skiplist", "set", "a", "first", NULL), 0);

    db = open_db(f->db, CYRUSDB_RDONLY);
    assert_int_equal(collect(db, NULL, &b), CYRUSDB_OK);
    assert_string_equal(buf_cstring(&b), "a=first\nk1=v1b\nk3=v3\n");
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);

    /* Cyrus's recovery on open (no skipstamp) checkpoints the file into
     * INORDER records: read that form too ("repack" asserts in 3.6) */
    assert_int_equal(unlink(f->stamp), 0);
    assert_int_equal(cyr_dbtool(f, &b, f->db, "skiplist", "show", NULL), 0);
    assert_string_equal(buf_cstring(&b), "a\tfirst\nk1\tv1b\nk3\tv3\n");
    write_stamp(f);
    {
        size_t len;
        unsigned char *p = slurp(f->db, &len);
        assert_int_equal(get32(p + FIRST_REC), 1);
        assert_int_equal(get32(p + 40), len);
        free(p);
    }
    db = open_db(f->db, CYRUSDB_NOCOMPACT);
    assert_int_equal(collect(db, NULL, &b), CYRUSDB_OK);
    assert_string_equal(buf_cstring(&b), "a=first\nk1=v1b\nk3=v3\n");
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    /* and append our own log after Cyrus's checkpoint */
    put(db, "k2", "again");
    assert_int_equal(cyrusdb_delete(db, "a", 1, NULL, 0), CYRUSDB_OK);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    give_to_cyrus(f->db);
    assert_int_equal(cyr_dbtool(f, &b, f->db, "skiplist", "show", NULL), 0);
    assert_string_equal(buf_cstring(&b), "k1\tv1b\nk2\tagain\nk3\tv3\n");
    buf_free(&b);
}

static void test_we_write_cyrus_reads(void **state)
{
    struct fixture *f = *state;
    struct cyrusdb *db;
    struct buf b = BUF_INITIALIZER, want = BUF_INITIALIZER;
    char k[32], v[64];
    int i;

    if (!have_cyrus())
        skip();
    db = open_db(f->db, CYRUSDB_CREATE | CYRUSDB_NOCOMPACT);
    for (i = 0; i < 60; i++) {
        snprintf(k, sizeof(k), "key%03d", i);
        snprintf(v, sizeof(v), "value %d", i);
        put(db, k, v);
    }
    for (i = 0; i < 60; i += 3) {              /* replacements: DELETE+ADD */
        snprintf(k, sizeof(k), "key%03d", i);
        snprintf(v, sizeof(v), "new %d", i);
        put(db, k, v);
    }
    for (i = 1; i < 60; i += 5) {              /* deletions */
        snprintf(k, sizeof(k), "key%03d", i);
        assert_int_equal(cyrusdb_delete(db, k, strlen(k), NULL, 0), CYRUSDB_OK);
    }
    for (i = 0; i < 60; i++) {
        if (i % 5 == 1)
            continue;
        snprintf(k, sizeof(k), "key%03d", i);
        buf_printf(&want, "%s\t", k);
        if (i % 3 == 0)
            buf_printf(&want, "new %d\n", i);
        else
            buf_printf(&want, "value %d\n", i);
    }
    cyrusdb_close(&db);
    give_to_cyrus(f->db);

    assert_int_equal(cyr_dbtool(f, &b, f->db, "skiplist", "show", NULL), 0);
    assert_string_equal(buf_cstring(&b), buf_cstring(&want));
    assert_int_equal(cyr_dbtool(f, &b, f->db, "skiplist", "get", "key003", NULL), 0);
    assert_string_equal(buf_cstring(&b), "new 3\n");
    assert_int_equal(cyr_dbtool(f, &b, f->db, "skiplist", "consistent", NULL), 0);
    assert_non_null(strstr(buf_cstring(&b), "Yes, consistent"));

    /* after our checkpoint (INORDER records) too */
    db = open_db(f->db, 0);
    assert_int_equal(cyrusdb_checkpoint(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    give_to_cyrus(f->db);
    assert_int_equal(cyr_dbtool(f, &b, f->db, "skiplist", "show", NULL), 0);
    assert_string_equal(buf_cstring(&b), buf_cstring(&want));
    assert_int_equal(cyr_dbtool(f, &b, f->db, "skiplist", "consistent", NULL), 0);
    assert_non_null(strstr(buf_cstring(&b), "Yes, consistent"));

    /* Cyrus appends to our checkpointed file; we read its log */
    assert_int_equal(cyr_dbtool(f, NULL, f->db, "skiplist", "set", "key000", "cyrus", NULL), 0);
    db = open_db(f->db, 0);
    check_value(db, "key000", "cyrus");
    check_value(db, "key001", NULL);
    check_value(db, "key002", "value 2");
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    buf_free(&b);
    buf_free(&want);
}

/* cyr_dbtool's "damage" leaves a transaction without COMMIT whose
 * pointers are already linked in: never show it, and recover it. */
static void test_cyrus_damage_recovered(void **state)
{
    struct fixture *f = *state;
    struct cyrusdb *db;
    struct buf b = BUF_INITIALIZER;
    off_t before;

    if (!have_cyrus())
        skip();
    assert_int_equal(cyr_dbtool(f, NULL, "-n", f->db, "skiplist", "set", "a", "1", NULL), 0);
    assert_int_equal(cyr_dbtool(f, NULL, f->db, "skiplist", "set", "b", "2", NULL), 0);
    before = file_size(f->db);
    assert_true(cyr_dbtool(f, NULL, f->db, "skiplist", "damage", NULL) != 0);
    assert_true(file_size(f->db) > before);

    db = open_db(f->db, CYRUSDB_RDONLY);           /* cannot repair: replays */
    assert_int_equal(collect(db, NULL, &b), CYRUSDB_OK);
    assert_string_equal(buf_cstring(&b), "a=1\nb=2\n");
    check_value(db, "INVALID", NULL);
    cyrusdb_close(&db);

    db = open_db(f->db, 0);                        /* repairs on open */
    assert_int_equal(collect(db, NULL, &b), CYRUSDB_OK);
    assert_string_equal(buf_cstring(&b), "a=1\nb=2\n");
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    give_to_cyrus(f->db);
    assert_int_equal(cyr_dbtool(f, &b, f->db, "skiplist", "show", NULL), 0);
    assert_string_equal(buf_cstring(&b), "a\t1\nb\t2\n");
    buf_free(&b);
}

/* ---- recovery --------------------------------------------------------- */

static void test_truncated_tail_discarded(void **state)
{
    struct fixture *f = *state;
    struct cyrusdb *db = open_db(f->db, CYRUSDB_CREATE | CYRUSDB_NOCOMPACT);
    unsigned char rec[64];
    struct buf b = BUF_INITIALIZER;
    off_t committed, len;

    put(db, "a", "1");
    put(db, "c", "3");
    cyrusdb_close(&db);
    committed = file_size(f->db);

    /* an ADD of "b" with no COMMIT, cut in the middle of its value */
    memset(rec, 0, sizeof(rec));
    put32(rec, 2);
    put32(rec + 4, 1);
    rec[8] = 'b';
    put32(rec + 12, 16);
    memcpy(rec + 16, "0123456789abcdef", 16);
    put32(rec + 32, 0);
    put32(rec + 36, 0xFFFFFFFFu);
    write_at(f->db, committed, rec, 24);
    assert_int_equal(file_size(f->db), committed + 24);

    db = open_db(f->db, CYRUSDB_RDONLY);
    check_value(db, "b", NULL);
    check_value(db, "a", "1");
    cyrusdb_close(&db);
    assert_int_equal(file_size(f->db), committed + 24);

    db = open_db(f->db, CYRUSDB_NOCOMPACT);        /* writable: recovers */
    assert_int_equal(collect(db, NULL, &b), CYRUSDB_OK);
    assert_string_equal(buf_cstring(&b), "a=1\nc=3\n");
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    len = file_size(f->db);
    assert_true(len < committed + 24);

    /* the whole record but no COMMIT: also discarded */
    write_at(f->db, len, rec, 40);
    db = open_db(f->db, CYRUSDB_NOCOMPACT);
    check_value(db, "b", NULL);
    put(db, "d", "4");
    assert_int_equal(collect(db, NULL, &b), CYRUSDB_OK);
    assert_string_equal(buf_cstring(&b), "a=1\nc=3\nd=4\n");
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    buf_free(&b);
}

/* A writer SIGKILLed inside its transaction (pointers already rewritten in
 * place) while this process keeps its handle open. */
static void test_killed_writer(void **state)
{
    struct fixture *f = *state;
    struct cyrusdb *db = open_db(f->db, CYRUSDB_CREATE | CYRUSDB_NOCOMPACT);
    struct buf b = BUF_INITIALIZER;
    char k[16];
    pid_t pid;
    int i, status;

    for (i = 0; i < 20; i++) {
        snprintf(k, sizeof(k), "k%02d", i);
        put(db, k, "old");
    }
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct cyrusdb *cdb = NULL;
        struct cyrusdb_txn *tid = NULL;
        const char *err;

        if (cyrusdb_open("skiplist", f->db, CYRUSDB_NOCOMPACT, &cdb, &err) != CYRUSDB_OK)
            _exit(2);
        for (i = 0; i < 20; i += 2) {
            snprintf(k, sizeof(k), "k%02d", i);
            if (cyrusdb_store(cdb, k, 3, "new", 3, &tid) != CYRUSDB_OK)
                _exit(3);
        }
        cyrusdb_delete(cdb, "k05", 3, &tid, 0);
        cyrusdb_store(cdb, "zz", 2, "uncommitted", 11, &tid);
        raise(SIGKILL);
        _exit(4);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    /* our open handle: reads see only committed states */
    check_value(db, "zz", NULL);
    check_value(db, "k00", "old");
    check_value(db, "k05", "old");
    assert_int_equal(collect(db, NULL, &b), CYRUSDB_OK);
    for (i = 0; i < 20; i++) {
        char line[32];
        snprintf(line, sizeof(line), "k%02d=old\n", i);
        assert_non_null(strstr(buf_cstring(&b), line));
    }
    assert_int_equal(b.len, 20 * 8);
    /* our next write recovers under the exclusive lock */
    put(db, "k01", "mine");
    check_value(db, "zz", NULL);
    check_value(db, "k01", "mine");
    check_value(db, "k02", "old");
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    buf_free(&b);
}

/* Abort leaves the bytes as they were. */
static void test_abort_restores_bytes(void **state)
{
    struct fixture *f = *state;
    struct cyrusdb *db = open_db(f->db, CYRUSDB_CREATE | CYRUSDB_NOCOMPACT);
    struct cyrusdb_txn *tid = NULL;
    unsigned char *before, *after;
    size_t blen, alen;
    char k[16];
    int i;

    for (i = 0; i < 40; i++) {
        snprintf(k, sizeof(k), "k%02d", i);
        put(db, k, "v");
    }
    before = slurp(f->db, &blen);
    for (i = 0; i < 40; i += 3) {
        snprintf(k, sizeof(k), "k%02d", i);
        assert_int_equal(cyrusdb_store(db, k, 3, "w", 1, &tid), CYRUSDB_OK);
    }
    for (i = 1; i < 40; i += 4) {
        snprintf(k, sizeof(k), "k%02d", i);
        assert_int_equal(cyrusdb_delete(db, k, 3, &tid, 0), CYRUSDB_OK);
    }
    for (i = 0; i < 30; i++) {
        snprintf(k, sizeof(k), "n%02d", i);
        assert_int_equal(cyrusdb_store(db, k, 3, "x", 1, &tid), CYRUSDB_OK);
    }
    assert_int_equal(cyrusdb_abort(db, tid), CYRUSDB_OK);
    after = slurp(f->db, &alen);
    assert_int_equal(alen, blen);
    assert_memory_equal(after, before, blen);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    free(before);
    free(after);
}

/* ---- checkpoint --------------------------------------------------------- */

static void test_checkpoint_shrinks(void **state)
{
    struct fixture *f = *state;
    struct cyrusdb *db = open_db(f->db, CYRUSDB_CREATE | CYRUSDB_NOCOMPACT);
    char k[16], v[32];
    off_t s1, s2;
    ino_t ino;
    unsigned char *p;
    size_t len;
    int i, round;

    for (round = 0; round < 3; round++) {
        for (i = 0; i < 300; i++) {
            snprintf(k, sizeof(k), "key%04d", i);
            snprintf(v, sizeof(v), "r%d-%d", round, i);
            put(db, k, v);
        }
    }
    for (i = 0; i < 300; i += 3) {
        snprintf(k, sizeof(k), "key%04d", i);
        assert_int_equal(cyrusdb_delete(db, k, strlen(k), NULL, 0), CYRUSDB_OK);
    }
    s1 = file_size(f->db);
    ino = file_ino(f->db);
    assert_int_equal(cyrusdb_checkpoint(db), CYRUSDB_OK);
    s2 = file_size(f->db);
    assert_true(s2 < s1 / 3);
    assert_true(file_ino(f->db) != ino);
    for (i = 0; i < 300; i++) {
        snprintf(k, sizeof(k), "key%04d", i);
        snprintf(v, sizeof(v), "r2-%d", i);
        check_value(db, k, i % 3 ? v : NULL);
    }
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    p = slurp(f->db, &len);
    assert_int_equal(get32(p + 36), 200);        /* listsize */
    assert_int_equal(get32(p + 40), len);        /* logstart = end */
    assert_int_equal(get32(p + FIRST_REC), 1);   /* INORDER */
    free(p);
}

static void test_auto_checkpoint(void **state)
{
    struct fixture *f = *state;
    struct cyrusdb *db = open_db(f->db, CYRUSDB_CREATE);
    char v[128];
    ino_t ino;
    unsigned char head[FIRST_REC + 4];
    int i, fd;

    memset(v, 'v', sizeof(v));
    for (i = 0; i < 2000; i++) {
        v[0] = (char)('a' + i % 26);
        assert_int_equal(cyrusdb_store(db, "hot", 3, v, sizeof(v), NULL), CYRUSDB_OK);
        put(db, i % 2 ? "odd" : "even", "x");
    }
    /* 2000 x ~190 bytes of log, but bounded by checkpoints (which leave
     * INORDER records and logstart past them) */
    assert_true(file_size(f->db) < 64 * 1024);
    fd = open(f->db, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(read(fd, head, sizeof(head)), sizeof(head));
    close(fd);
    assert_true(get32(head + 40) > FIRST_REC);
    assert_int_equal(get32(head + FIRST_REC), 1);
    v[0] = (char)('a' + 1999 % 26);
    {
        const char *d;
        size_t dl;
        assert_int_equal(cyrusdb_fetch(db, "hot", 3, &d, &dl, NULL), CYRUSDB_OK);
        assert_int_equal(dl, sizeof(v));
        assert_memory_equal(d, v, dl);
    }
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);

    /* NOCOMPACT: never */
    ino = file_ino(f->db);
    db = open_db(f->db, CYRUSDB_NOCOMPACT);
    for (i = 0; i < 500; i++)
        assert_int_equal(cyrusdb_store(db, "hot", 3, v, sizeof(v), NULL), CYRUSDB_OK);
    assert_true(file_ino(f->db) == ino);
    assert_true(file_size(f->db) > 500 * 150);
    cyrusdb_close(&db);
}

/* ---- another process ------------------------------------------------------ */

static void sync_write(int fd, char c)
{
    assert_int_equal(write(fd, &c, 1), 1);
}

static char sync_read(int fd)
{
    char c = 0;

    if (read(fd, &c, 1) != 1)
        return 0;
    return c;
}

static int child_fetch_is(struct cyrusdb *db, const char *k, const char *v)
{
    const char *d;
    size_t dl;
    int r = cyrusdb_fetch(db, k, strlen(k), &d, &dl, NULL);

    if (!v)
        return r == CYRUSDB_NOTFOUND;
    return r == CYRUSDB_OK && dl == strlen(v) && !memcmp(d, v, dl);
}

static void test_other_process_follows(void **state)
{
    struct fixture *f = *state;
    struct cyrusdb *db = open_db(f->db, CYRUSDB_CREATE | CYRUSDB_NOCOMPACT);
    int to_child[2], to_parent[2], status;
    pid_t pid;
    ino_t ino;

    assert_int_equal(pipe(to_child), 0);
    assert_int_equal(pipe(to_parent), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct cyrusdb *cdb = NULL;
        const char *err;
        int bad = 0;

        close(to_child[1]);
        close(to_parent[0]);
        if (cyrusdb_open("skiplist", f->db, CYRUSDB_NOCOMPACT, &cdb, &err) != CYRUSDB_OK)
            _exit(10);
        sync_write(to_parent[1], 'r');
        if (sync_read(to_child[0]) != '1')
            _exit(11);
        bad |= !child_fetch_is(cdb, "k1", "v1");
        sync_write(to_parent[1], '1');
        if (sync_read(to_child[0]) != '2')
            _exit(12);
        /* the parent checkpointed (new inode) and wrote again */
        bad |= !child_fetch_is(cdb, "k1", "v1b") << 1;
        bad |= !child_fetch_is(cdb, "k2", "v2") << 2;
        bad |= (cyrusdb_consistent(cdb) != CYRUSDB_OK) << 3;
        /* a write of ours goes to the new file */
        bad |= (cyrusdb_store(cdb, "k3", 2, "child", 5, NULL) != CYRUSDB_OK) << 4;
        sync_write(to_parent[1], '2');
        cyrusdb_close(&cdb);
        _exit(bad ? 20 + bad : 0);
    }
    close(to_child[0]);
    close(to_parent[1]);
    assert_int_equal(sync_read(to_parent[0]), 'r');
    put(db, "k1", "v1");
    sync_write(to_child[1], '1');
    assert_int_equal(sync_read(to_parent[0]), '1');
    ino = file_ino(f->db);
    put(db, "k1", "v1b");
    assert_int_equal(cyrusdb_checkpoint(db), CYRUSDB_OK);
    assert_true(file_ino(f->db) != ino);
    put(db, "k2", "v2");
    sync_write(to_child[1], '2');
    assert_int_equal(sync_read(to_parent[0]), '2');
    check_value(db, "k3", "child");
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    close(to_child[1]);
    close(to_parent[0]);
    cyrusdb_close(&db);
}

/* ---- damage ---------------------------------------------------------- */

static void test_consistent_catches_pointer_flip(void **state)
{
    struct fixture *f = *state;
    struct cyrusdb *db = open_db(f->db, CYRUSDB_CREATE | CYRUSDB_NOCOMPACT);
    unsigned char *orig, *p, byte;
    size_t len, fwd0;
    char k[16];
    int i, r;
    const char *d;
    size_t dl;

    for (i = 0; i < 50; i++) {
        snprintf(k, sizeof(k), "k%02d", i);
        put(db, k, "value");
    }
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    orig = slurp(f->db, &len);
    log_init("test_skiplist", LOG_TO_NONE);

    /* a flipped byte in the dummy's level-0 pointer */
    byte = orig[60 + 3] ^ 0x10;
    write_at(f->db, 60 + 3, &byte, 1);
    db = open_db(f->db, CYRUSDB_RDONLY);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_IOERROR);
    r = cyrusdb_fetch(db, "k49", 3, &d, &dl, NULL);
    assert_true(r == CYRUSDB_IOERROR || (r == CYRUSDB_OK && dl == 5));
    cyrusdb_close(&db);
    write_at(f->db, 0, orig, len);

    /* a flipped byte in the first record's pointers: every level, every bit
     * position of the low byte */
    p = orig + FIRST_REC;
    fwd0 = FIRST_REC + 8 + ((get32(p + 4) + 3) & ~3u) + 4 + ((get32(p + 8 + ((get32(p + 4) + 3) & ~3u)) + 3) & ~3u);
    for (i = 0; i < 8; i++) {
        byte = orig[fwd0 + 3] ^ (unsigned char)(1u << i);
        write_at(f->db, (off_t)fwd0 + 3, &byte, 1);
        db = open_db(f->db, CYRUSDB_RDONLY);
        assert_int_equal(cyrusdb_consistent(db), CYRUSDB_IOERROR);
        cyrusdb_close(&db);
        write_at(f->db, 0, orig, len);
    }

    /* a pointer loop: the first record points at itself; no hang */
    {
        unsigned char self[4];
        struct buf b = BUF_INITIALIZER;

        put32(self, FIRST_REC);
        write_at(f->db, (off_t)fwd0, self, 4);
        db = open_db(f->db, CYRUSDB_RDONLY);
        assert_int_equal(cyrusdb_consistent(db), CYRUSDB_IOERROR);
        r = cyrusdb_fetch(db, "k49", 3, &d, &dl, NULL);
        assert_true(r == CYRUSDB_IOERROR || (r == CYRUSDB_OK && dl == 5));
        assert_int_equal(collect(db, NULL, &b), CYRUSDB_IOERROR);
        cyrusdb_close(&db);
        buf_free(&b);
        write_at(f->db, 0, orig, len);
    }

    /* a pointer past the end of the file */
    {
        unsigned char far[4];

        put32(far, (uint32_t)len + 64);
        write_at(f->db, (off_t)fwd0, far, 4);
        db = open_db(f->db, CYRUSDB_RDONLY);
        assert_int_equal(cyrusdb_consistent(db), CYRUSDB_IOERROR);
        cyrusdb_close(&db);
        write_at(f->db, 0, orig, len);
    }

    db = open_db(f->db, CYRUSDB_RDONLY);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    log_init("test_skiplist", getenv("TEST_VERBOSE") ? LOG_TO_STDERR : LOG_TO_NONE);
    free(orig);
}

/* Every single-byte truncation point and a flip of every byte of a small
 * file: an error or a recovery, never a crash or a hang. */
static void test_damage_sweep(void **state)
{
    struct fixture *f = *state;
    struct cyrusdb *db = open_db(f->db, CYRUSDB_CREATE | CYRUSDB_NOCOMPACT);
    struct buf b = BUF_INITIALIZER;
    unsigned char *orig;
    size_t len, i;
    char k[16];
    int n;

    for (n = 0; n < 8; n++) {
        snprintf(k, sizeof(k), "k%d", n);
        put(db, k, "vv");
    }
    assert_int_equal(cyrusdb_delete(db, "k3", 2, NULL, 0), CYRUSDB_OK);
    cyrusdb_close(&db);
    orig = slurp(f->db, &len);
    if (!getenv("TEST_VERBOSE"))
        log_init("test_skiplist", LOG_TO_NONE);
    for (i = 0; i < len; i++) {
        unsigned char flipped = orig[i] ^ 0x41;
        int fd = open(f->db, O_WRONLY | O_TRUNC);

        assert_true(fd >= 0);
        assert_int_equal(write(fd, orig, len), (ssize_t)len);
        assert_int_equal(pwrite(fd, &flipped, 1, (off_t)i), 1);
        close(fd);
        db = NULL;
        {
            const char *err;
            if (cyrusdb_open("skiplist", f->db, CYRUSDB_RDONLY, &db, &err) == CYRUSDB_OK) {
                (void)collect(db, NULL, &b);
                (void)cyrusdb_consistent(db);
                cyrusdb_close(&db);
            }
        }
    }
    /* a power loss: the file cut at any 4-byte boundary (in-place pointer
     * writes of the cut transactions may survive) and then a reboot, i.e.
     * "last recovery" older than the boot time.  The replay (read-only) and
     * the recovery (writable open) agree and see only what was written. */
    for (i = FIRST_REC; i < len; i += 4) {
        struct buf ro = BUF_INITIALIZER;
        int fd = open(f->db, O_WRONLY | O_TRUNC);
        const char *line;
        static const unsigned char zero[4];

        assert_true(fd >= 0);
        assert_int_equal(write(fd, orig, i), (ssize_t)i);
        assert_int_equal(pwrite(fd, zero, 4, 44), 4);
        close(fd);
        db = open_db(f->db, CYRUSDB_RDONLY);
        if (collect(db, NULL, &ro) != CYRUSDB_OK)
            fail_msg("cut at %zu of %zu: read-only walk fails", i, len);
        cyrusdb_close(&db);
        db = open_db(f->db, CYRUSDB_NOCOMPACT);
        if (collect(db, NULL, &b) != CYRUSDB_OK)
            fail_msg("cut at %zu of %zu: walk fails", i, len);
        if (cyrusdb_consistent(db) != CYRUSDB_OK)
            fail_msg("cut at %zu of %zu: inconsistent", i, len);
        assert_string_equal(buf_cstring(&ro), buf_cstring(&b));
        for (line = buf_cstring(&b); *line; line = strchr(line, '\n') + 1) {
            assert_true(line[0] == 'k' && line[1] >= '0' && line[1] <= '7');
            assert_memory_equal(line + 2, "=vv\n", 4);
        }
        cyrusdb_close(&db);
        buf_free(&ro);
    }
    /* the same cut without a reboot (a file damaged behind our back): an
     * error or the right answer; cyrusdb_recover() then repairs it */
    for (i = FIRST_REC; i < len; i += 4) {
        int fd = open(f->db, O_WRONLY | O_TRUNC);

        assert_true(fd >= 0);
        assert_int_equal(write(fd, orig, i), (ssize_t)i);
        close(fd);
        db = open_db(f->db, CYRUSDB_NOCOMPACT);
        n = collect(db, NULL, &b);
        assert_true(n == CYRUSDB_OK || n == CYRUSDB_IOERROR);
        if (n != CYRUSDB_OK || cyrusdb_consistent(db) != CYRUSDB_OK) {
            cyrusdb_close(&db);
            assert_int_equal(cyrusdb_recover(f->dir), CYRUSDB_OK);
            db = open_db(f->db, CYRUSDB_NOCOMPACT);
            assert_int_equal(collect(db, NULL, &b), CYRUSDB_OK);
            assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
        }
        cyrusdb_close(&db);
    }
    log_init("test_skiplist", getenv("TEST_VERBOSE") ? LOG_TO_STDERR : LOG_TO_NONE);
    free(orig);
    buf_free(&b);
}

/* The sort order is not recorded in the file: recovery must keep a
 * mailbox-ordered file in mailbox order, and a handle opened with the other
 * order must not rewrite it. */
static void test_recovery_keeps_sort_order(void **state)
{
    struct fixture *f = *state;
    static const char want[] =
        "user.alice=1\nuser.alice.Sent=2\nuser.alice-old=3\nuser.bob=4\n";
    struct buf b = BUF_INITIALIZER;
    struct cyrusdb *db;
    struct stat before, after;

    db = open_db(f->db, CYRUSDB_CREATE | CYRUSDB_MBOXSORT | CYRUSDB_NOCOMPACT);
    assert_int_equal(cyrusdb_store(db, "user.bob", 8, "4", 1, NULL), CYRUSDB_OK);
    assert_int_equal(cyrusdb_store(db, "user.alice-old", 14, "3", 1, NULL), CYRUSDB_OK);
    assert_int_equal(cyrusdb_store(db, "user.alice.Sent", 15, "2", 1, NULL), CYRUSDB_OK);
    assert_int_equal(cyrusdb_store(db, "user.alice", 10, "1", 1, NULL), CYRUSDB_OK);
    cyrusdb_close(&db);

    /* the directory-wide recovery (ctl_cyrusdb -r) keeps mailbox order */
    assert_int_equal(cyrusdb_recover(f->dir), CYRUSDB_OK);
    db = open_db(f->db, CYRUSDB_MBOXSORT);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    assert_int_equal(collect(db, NULL, &b), CYRUSDB_OK);
    assert_string_equal(buf_cstring(&b), want);
    cyrusdb_close(&db);

    /* a handle in plain order may not rewrite it */
    assert_int_equal(stat(f->db, &before), 0);
    db = open_db(f->db, 0);
    assert_int_equal(cyrusdb_checkpoint(db), CYRUSDB_IOERROR);
    cyrusdb_close(&db);
    assert_int_equal(stat(f->db, &after), 0);
    assert_true(before.st_ino == after.st_ino && before.st_size == after.st_size);
    db = open_db(f->db, CYRUSDB_MBOXSORT);
    assert_int_equal(cyrusdb_consistent(db), CYRUSDB_OK);
    cyrusdb_close(&db);
    buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_header_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mboxsort_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_high_bytes_signed_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recovery_keeps_sort_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cyrus_writes_we_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_we_write_cyrus_reads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cyrus_damage_recovered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_tail_discarded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_killed_writer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_restores_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_shrinks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_auto_checkpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_process_follows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_consistent_catches_pointer_flip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damage_sweep, setup, teardown),
    };

    /* the damage cases log on purpose; TEST_VERBOSE=1 shows every line */
    log_init("test_skiplist", getenv("TEST_VERBOSE") ? LOG_TO_STDERR : LOG_TO_NONE);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
