/*
 * test_append.c - staging, append and the commit path (store/append.h,
 * store/commit.h).
 *
 * Two groups:
 *   "commit+stage" (once): the commit batch on its own (dedup of files and
 *     directories, counters, error mapping) and the staging file on its own
 *     (place, name, mode, size / header size / SHA-1 for messages fed in
 *     every chunking, limits);
 *   "append" (once per cyrusdb backend, which holds the quota database):
 *     real mailboxes (mailbox.c) in a fresh directory per case: one
 *     message read back, ten recipients sharing one staging file through
 *     hard links, a second partition getting one copy, quota refusal,
 *     maxmessagesize, one commit round per append_commit(), 8 fork()ed
 *     processes appending to the same mailbox at once, and a quota root
 *     on each of ten recipients (three of them under one root) with exact
 *     usage after multi-recipient appends from one and from 4 processes
 *     at once, and after a failed quota transaction.
 *
 * Expected values are computed here independently: the SHA-1 with a
 * one-shot EVP call over the whole message, the header size by searching
 * the whole message for the first empty line.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include <openssl/evp.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/buf.h"
#include "lib/fsutil.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "store/append.h"
#include "store/commit.h"
#include "store/mailbox.h"
#include "store/quota.h"
#include "store/store.h"
#include "tests/testhelp.h"

#define TA_PROCS 8
#define TA_PER_PROC 50

/* ---- helpers ------------------------------------------------------------ */

static void ta_sha1(const void *data, size_t len, unsigned char *out)
{
    unsigned int n = 0;

    assert_int_equal(EVP_Digest(data, len, out, &n, EVP_sha1(), NULL), 1);
    assert_int_equal(n, MAILBOX_DIGEST_LEN);
}

/* Header size by the definition: up to and including the first empty
 * line (a line end directly after a line end, or at the very start);
 * the whole message when there is none. */
static size_t ta_header_size(const char *m, size_t len)
{
    size_t i;

    for (i = 0; i < len; i++) {
        int at_start = (i == 0 || m[i - 1] == '\n');

        if (at_start && m[i] == '\n')
            return i + 1;
        if (at_start && m[i] == '\r' && i + 1 < len && m[i + 1] == '\n')
            return i + 2;
    }
    return len;
}

/* Message number `n` with a marker line in the body: deterministic bytes,
 * length varying with n. */
static void ta_message(struct buf *m, unsigned p, unsigned i)
{
    unsigned n = p * 1000 + i, k, len;

    buf_reset(m);
    buf_printf(m, "From: sender%u@example.org\r\n"
               "To: rcpt@example.org\r\n"
               "Subject: message %u.%u\r\n"
               "Message-ID: <%u.%u@test.example.org>\r\n"
               "\r\n"
               "MARKER p=%u i=%u\r\n", p, p, i, p, i, p, i);
    len = (n * 7919u) % 5000u;
    for (k = 0; k < len; k++) {
        if (k % 72 == 70)
            buf_append(m, "\r\n", 2);
        else
            buf_putc(m, 'a' + (int)((n + k * 31u) % 26u));
    }
    buf_append(m, "\r\nend\r\n", 7);
}

/* Stage `len` bytes of `data`, written in chunks of `chunk` bytes (0: all
 * at once), on `partition`. */
static struct append_stage *ta_stage(const struct imapconf *conf,
                                     const char *partition, const char *data,
                                     size_t len, size_t chunk)
{
    struct append_stage *st = NULL;
    size_t off = 0, n;

    assert_int_equal(append_stage_open(conf, partition, &st), STORE_OK);
    assert_non_null(st);
    while (off < len) {
        n = chunk && chunk < len - off ? chunk : len - off;
        assert_int_equal(append_stage_write(st, data + off, n), STORE_OK);
        off += n;
    }
    assert_int_equal(append_stage_close(st), STORE_OK);
    return st;
}

/* The staging directory of this process under partition root `root`. */
static char *ta_stage_dir(const char *root, long ndirs)
{
    char *p = NULL;

    assert_true(asprintf(&p, "%s/stage./%02lx", root,
                         (unsigned long)getpid() % (unsigned long)ndirs) > 0);
    return p;
}

/* Number of entries (other than . and ..) in dir; 0 when it is missing.
 * The name of the last one into name_r when not NULL. */
static int ta_count_files(const char *dir, char **name_r)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;

    if (name_r)
        *name_r = NULL;
    if (!d)
        return 0;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        n++;
        if (name_r) {
            free(*name_r);
            *name_r = strdup(de->d_name);
        }
    }
    closedir(d);
    return n;
}

static void ta_read_fd(int fd, struct buf *out)
{
    char chunk[8192];
    ssize_t n;

    buf_reset(out);
    while ((n = read(fd, chunk, sizeof(chunk))) > 0)
        assert_int_equal(buf_append(out, chunk, (size_t)n), 0);
    assert_true(n == 0);
}

/* Read message uid of mb into out. */
static void ta_read_message(struct mailbox *mb, uint32_t uid, struct buf *out)
{
    int fd = -1;

    assert_int_equal(mailbox_open_message(mb, uid, &fd), STORE_OK);
    ta_read_fd(fd, out);
    close(fd);
}

/* Under a shared lock: the record of uid, checked against the message. */
static void ta_check_record(struct mailbox *mb, uint32_t uid, const char *msg,
                            size_t len)
{
    struct mailbox_record rec;
    struct buf got = BUF_INITIALIZER;
    unsigned char dg[MAILBOX_DIGEST_LEN];
    uint32_t recno = 0;

    assert_int_equal(mailbox_find_uid(mb, uid, &recno), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, recno, &rec), STORE_OK);
    assert_int_equal(rec.uid, uid);
    assert_int_equal(rec.size, len);
    assert_int_equal(rec.header_size, ta_header_size(msg, len));
    assert_int_equal(rec.flags & (MAILBOX_FLAG_PENDING | MAILBOX_FLAG_ABORTED |
                                  MAILBOX_FLAG_EXPUNGED), 0);
    ta_sha1(msg, len, dg);
    assert_memory_equal(rec.digest, dg, MAILBOX_DIGEST_LEN);
    ta_read_message(mb, uid, &got);
    assert_int_equal(got.len, len);
    assert_memory_equal(got.s, msg, len);
    buf_free(&got);
}

static void ta_assert_check(struct mailbox *mb)
{
    struct buf problem = BUF_INITIALIZER;
    int r;

    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    r = mailbox_check(mb, &problem);
    if (r != STORE_OK)
        fail_msg("mailbox_check: %s", buf_cstring(&problem));
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    buf_free(&problem);
}

/* A fixture: temp dir, configuration, spool root path. */
struct ta_fix {
    char *dir;
    char *spool;
    struct imapconf *conf;
};

static void ta_setup(struct ta_fix *f, const char *backend, const char *tag,
                     const char *extra)
{
    f->dir = th_mkdtemp(tag);
    f->spool = th_path(f->dir, "spool");
    f->conf = th_store_conf(f->dir, backend, extra);
}

static void ta_teardown(struct ta_fix *f)
{
    imapconf_free(&f->conf);
    th_rmrf(f->dir);
    free(f->dir);
    free(f->spool);
}

static struct mailbox *ta_create_open(struct ta_fix *f, const char *name,
                                      const char *partition)
{
    struct mailbox *mb = NULL;
    char uniq[64];

    snprintf(uniq, sizeof(uniq), "u%08lx%s", (unsigned long)random(), name);
    assert_int_equal(mailbox_create(f->conf, name, partition, uniq, 0),
                     STORE_OK);
    assert_int_equal(mailbox_open(f->conf, name, partition, &mb), STORE_OK);
    assert_non_null(mb);
    return mb;
}

static const struct mailbox_header *ta_header(struct mailbox *mb)
{
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    return mailbox_get_header(mb);
}

/* ---- commit batch on its own -------------------------------------------- */

static void test_commit_batch(void **state)
{
    struct commit_batch *b = NULL;
    struct commit_stats s0, s1;
    char *dir = th_mkdtemp("commit");
    char *f1 = th_path(dir, "one"), *f2 = th_path(dir, "two");
    char *missing = th_path(dir, "missing");
    int fd1, fd2, fd3;

    (void)state;
    fd1 = open(f1, O_RDWR | O_CREAT | O_EXCL, 0600);
    fd2 = open(f2, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd1 >= 0 && fd2 >= 0);
    assert_int_equal(write(fd1, "x", 1), 1);

    assert_int_equal(commit_batch_new(NULL, &b), STORE_OK);
    /* an empty batch: no round */
    commit_stats_get(&s0);
    assert_int_equal(commit_batch_sync(b), STORE_OK);
    commit_stats_get(&s1);
    assert_int_equal(s1.rounds, s0.rounds);

    /* duplicates kept once */
    assert_int_equal(commit_batch_add_fd(b, fd1), STORE_OK);
    assert_int_equal(commit_batch_add_fd(b, fd2), STORE_OK);
    assert_int_equal(commit_batch_add_fd(b, fd1), STORE_OK);
    assert_int_equal(commit_batch_add_dir(b, dir), STORE_OK);
    assert_int_equal(commit_batch_add_dir(b, dir), STORE_OK);
    assert_int_equal(commit_batch_add_fd(b, -1), STORE_INTERNAL);
    assert_int_equal(commit_batch_add_dir(b, ""), STORE_INTERNAL);
    commit_stats_get(&s0);
    assert_int_equal(commit_batch_sync(b), STORE_OK);
    commit_stats_get(&s1);
    assert_int_equal(s1.rounds - s0.rounds, 1);
    assert_int_equal(s1.file_syncs - s0.file_syncs, 2);
    assert_int_equal(s1.dir_syncs - s0.dir_syncs, 1);

    /* emptied: syncing again does nothing */
    assert_int_equal(commit_batch_sync(b), STORE_OK);
    commit_stats_get(&s0);
    assert_int_equal(s0.rounds, s1.rounds);

    /* many entries (growth) */
    for (fd3 = 0; fd3 < 40; fd3++)
        assert_int_equal(commit_batch_add_fd(b, fd3 % 2 ? fd1 : fd2),
                         STORE_OK);
    assert_int_equal(commit_batch_add_dir(b, dir), STORE_OK);
    assert_int_equal(commit_batch_add_dir(b, "/"), STORE_OK);
    commit_stats_get(&s0);
    assert_int_equal(commit_batch_sync(b), STORE_OK);
    commit_stats_get(&s1);
    assert_int_equal(s1.file_syncs - s0.file_syncs, 2);
    assert_int_equal(s1.dir_syncs - s0.dir_syncs, 2);

    /* errors: a closed descriptor, a directory that does not exist */
    log_init("test_append", LOG_TO_NONE);
    fd3 = open(f1, O_RDONLY);
    assert_true(fd3 >= 0);
    close(fd3);
    assert_int_equal(commit_batch_add_fd(b, fd3), STORE_OK);
    assert_int_equal(commit_batch_sync(b), STORE_IOERROR);
    assert_int_equal(commit_batch_add_fd(b, fd1), STORE_OK);
    assert_int_equal(commit_batch_add_dir(b, missing), STORE_OK);
    assert_int_equal(commit_batch_sync(b), STORE_IOERROR);
    log_init("test_append", getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
    /* the failed batch was emptied too */
    commit_stats_get(&s0);
    assert_int_equal(commit_batch_sync(b), STORE_OK);
    commit_stats_get(&s1);
    assert_int_equal(s1.rounds, s0.rounds);

    commit_batch_free(&b);
    assert_null(b);
    commit_batch_free(&b);
    close(fd1);
    close(fd2);
    th_rmrf(dir);
    free(dir);
    free(f1);
    free(f2);
    free(missing);
}

/* ---- staging on its own --------------------------------------------------- */

static void ta_check_stage_info(const struct append_stage *st, const char *m,
                                size_t len)
{
    const struct mailbox_msginfo *info = append_stage_info(st);
    unsigned char dg[MAILBOX_DIGEST_LEN];

    ta_sha1(m, len, dg);
    assert_int_equal(info->size, len);
    assert_int_equal(info->header_size, ta_header_size(m, len));
    assert_memory_equal(info->digest, dg, MAILBOX_DIGEST_LEN);
}

static void test_stage_info(void **state)
{
    static const char *const msgs[] = {
        "Subject: a\r\nFrom: b\r\n\r\nbody\r\n",
        "Subject: a\nFrom: b\n\nbody\n",           /* LF LF */
        "Subject: a\r\nFrom: b\r\n",               /* no empty line */
        "\r\nbody only\r\n",                       /* empty header */
        "\nbody only\n",
        "Subject: \r\r\n\r\nx",                    /* CR inside a line */
        "Subject: a\r\n\r\nbody\r\n\r\nmore\r\n",  /* second empty line */
        "",                                        /* nothing */
        "X",
    };
    struct ta_fix f;
    struct buf big = BUF_INITIALIZER;
    size_t i, chunk;
    struct append_stage *st;
    char *sdir, *name = NULL, *path;
    struct stat sb;
    struct buf got = BUF_INITIALIZER;
    int fd;

    (void)state;
    ta_setup(&f, "flat", "stage", NULL);
    for (i = 0; i < sizeof(msgs) / sizeof(msgs[0]); i++) {
        size_t len = strlen(msgs[i]);

        for (chunk = 0; chunk <= len + 1; chunk++) {   /* 0: one write */
            st = ta_stage(f.conf, NULL, msgs[i], len, chunk);
            ta_check_stage_info(st, msgs[i], len);
            append_stage_free(&st);
            assert_null(st);
        }
    }

    /* a large message in odd chunks, across the write buffer */
    ta_message(&big, 3, 3);
    while (big.len < 300000)
        buf_append(&big, "0123456789abcdefghijklmnopqrstuvwxyz\r\n", 38);
    st = ta_stage(f.conf, NULL, big.s, big.len, 7777);
    ta_check_stage_info(st, big.s, big.len);

    /* the staging file: PARTITION/stage./NN/PID-SEQ-TIME, 0600, complete */
    sdir = ta_stage_dir(f.spool, imapconf_getint(f.conf, "stage_dirs"));
    assert_int_equal(ta_count_files(sdir, &name), 1);
    {
        long pid = 0, t = 0;
        unsigned long seq = 0;
        char tail = 0;

        assert_int_equal(sscanf(name, "%ld-%lu-%ld%c", &pid, &seq, &t, &tail),
                         3);
        assert_int_equal(pid, (long)getpid());
        assert_true(t > 1000000000L);
    }
    path = th_path(sdir, name);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    ta_read_fd(fd, &got);
    close(fd);
    assert_int_equal(got.len, big.len);
    assert_memory_equal(got.s, big.s, big.len);
    append_stage_free(&st);
    assert_int_equal(ta_count_files(sdir, NULL), 0);

    /* an unknown partition */
    st = NULL;
    assert_int_equal(append_stage_open(f.conf, "nosuch", &st),
                     STORE_BADPARTITION);
    assert_null(st);
    /* a write after close is a programming error */
    st = ta_stage(f.conf, "default", "a\r\n\r\nb", 6, 0);
    assert_int_equal(append_stage_write(st, "x", 1), STORE_INTERNAL);
    assert_int_equal(append_stage_close(st), STORE_INTERNAL);
    append_stage_free(&st);

    buf_free(&big);
    buf_free(&got);
    free(name);
    free(path);
    free(sdir);
    ta_teardown(&f);
}

static void test_stage_toobig(void **state)
{
    struct ta_fix f;
    struct append_stage *st = NULL;
    char block[100];
    char *sdir;

    (void)state;
    memset(block, 'x', sizeof(block));
    ta_setup(&f, "flat", "toobig", "maxmessagesize: 250\nstage_dirs: 3\n");
    /* exactly the limit passes */
    assert_int_equal(append_stage_open(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(append_stage_write(st, block, 100), STORE_OK);
    assert_int_equal(append_stage_write(st, block, 100), STORE_OK);
    assert_int_equal(append_stage_write(st, block, 50), STORE_OK);
    assert_int_equal(append_stage_close(st), STORE_OK);
    assert_int_equal(append_stage_info(st)->size, 250);
    append_stage_free(&st);
    /* one byte more does not, and the stage stays refused */
    log_init("test_append", LOG_TO_NONE);
    assert_int_equal(append_stage_open(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(append_stage_write(st, block, 100), STORE_OK);
    assert_int_equal(append_stage_write(st, block, 100), STORE_OK);
    assert_int_equal(append_stage_write(st, block, 51), STORE_TOOBIG);
    assert_int_equal(append_stage_write(st, block, 1), STORE_TOOBIG);
    assert_int_equal(append_stage_close(st), STORE_TOOBIG);
    log_init("test_append", getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
    /* stage_dirs: 3 -> directory getpid() % 3 */
    sdir = ta_stage_dir(f.spool, 3);
    assert_int_equal(ta_count_files(sdir, NULL), 1);
    append_stage_free(&st);
    assert_int_equal(ta_count_files(sdir, NULL), 0);
    free(sdir);
    ta_teardown(&f);
}

/* ---- append, per backend -------------------------------------------------- */

static void test_append_one(void **state)
{
    const char *backend = *state;
    struct ta_fix f;
    struct mailbox *mb;
    struct append_stage *st;
    struct append_txn *t = NULL;
    struct commit_stats s0, s1;
    struct buf m = BUF_INITIALIZER;
    const struct mailbox_header *h;
    uint32_t uid = 0, uid2 = 0;

    /* the per-file sync round, whose fsyncs this case counts */
    ta_setup(&f, backend, "one", "spool_sync: file\n");
    mb = ta_create_open(&f, TH_D "user.alice", "default");
    ta_message(&m, 1, 1);
    st = ta_stage(f.conf, NULL, m.s, m.len, 13);

    assert_int_equal(append_begin(f.conf, &t), STORE_OK);
    assert_int_equal(append_add(t, mb, st, 1700000000, MAILBOX_FLAG_SEEN, 0,
                                &uid), STORE_OK);
    assert_int_equal(uid, 1);
    commit_stats_get(&s0);
    assert_int_equal(append_commit(t), STORE_OK);
    commit_stats_get(&s1);
    assert_int_equal(s1.rounds - s0.rounds, 1);
    assert_true(s1.file_syncs - s0.file_syncs >= 2);   /* message, index */
    assert_true(s1.dir_syncs - s0.dir_syncs >= 1);     /* spool directory */

    /* the txn is reusable: a second message */
    assert_int_equal(append_add(t, mb, st, 0, 0, 0, &uid2), STORE_OK);
    assert_int_equal(uid2, 2);
    commit_stats_get(&s0);
    assert_int_equal(append_commit(t), STORE_OK);
    commit_stats_get(&s1);
    assert_int_equal(s1.rounds - s0.rounds, 1);
    /* a commit with nothing reserved syncs nothing */
    assert_int_equal(append_commit(t), STORE_OK);
    commit_stats_get(&s0);
    assert_int_equal(s1.rounds, s0.rounds);
    append_free(&t);
    assert_null(t);
    append_stage_free(&st);

    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    h = mailbox_get_header(mb);
    assert_int_equal(h->exists, 2);
    assert_int_equal(h->uidnext, 3);
    assert_int_equal(h->quota_used, 2 * m.len);
    ta_check_record(mb, 1, m.s, m.len);
    ta_check_record(mb, 2, m.s, m.len);
    {
        struct mailbox_record rec;
        uint32_t recno;

        assert_int_equal(mailbox_find_uid(mb, 1, &recno), STORE_OK);
        assert_int_equal(mailbox_read_record(mb, recno, &rec), STORE_OK);
        assert_int_equal(rec.internaldate, 1700000000);
        assert_int_equal(rec.flags & MAILBOX_SYSTEM_FLAGS, MAILBOX_FLAG_SEEN);
        assert_int_equal(mailbox_find_uid(mb, 2, &recno), STORE_OK);
        assert_int_equal(mailbox_read_record(mb, recno, &rec), STORE_OK);
        assert_true(rec.internaldate > 1700000000);   /* 0 = now */
    }
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    ta_assert_check(mb);

    /* abort: nothing becomes visible, the uid is not reused */
    st = ta_stage(f.conf, NULL, m.s, m.len, 0);
    assert_int_equal(append_begin(f.conf, &t), STORE_OK);
    assert_int_equal(append_add(t, mb, st, 0, 0, 0, &uid), STORE_OK);
    assert_int_equal(uid, 3);
    append_abort(t);
    append_free(&t);
    /* free without commit aborts too */
    assert_int_equal(append_begin(f.conf, &t), STORE_OK);
    assert_int_equal(append_add(t, mb, st, 0, 0, 0, &uid), STORE_OK);
    assert_int_equal(uid, 4);
    append_free(&t);
    append_stage_free(&st);
    h = ta_header(mb);
    assert_int_equal(h->exists, 2);
    assert_int_equal(h->uidnext, 5);
    ta_assert_check(mb);

    mailbox_close(&mb);
    buf_free(&m);
    ta_teardown(&f);
}

static void test_append_many_rcpts(void **state)
{
    const char *backend = *state;
    struct ta_fix f;
    struct mailbox *mbs[10];
    struct append_stage *st;
    struct append_txn *t = NULL;
    struct commit_stats s0, s1;
    struct buf m = BUF_INITIALIZER, path = BUF_INITIALIZER;
    char name[32], *sdir, *sname = NULL, *spath;
    struct stat stage_sb, sb;
    uint32_t uid;
    int i;

    /* the per-file sync round, whose fsyncs this case counts */
    ta_setup(&f, backend, "rcpts", "spool_sync: file\n");
    for (i = 0; i < 10; i++) {
        snprintf(name, sizeof(name), TH_D "user.r%d", i);
        mbs[i] = ta_create_open(&f, name, "default");
    }
    ta_message(&m, 2, 5);
    st = ta_stage(f.conf, NULL, m.s, m.len, 0);
    sdir = ta_stage_dir(f.spool, imapconf_getint(f.conf, "stage_dirs"));
    assert_int_equal(ta_count_files(sdir, &sname), 1);
    spath = th_path(sdir, sname);
    assert_int_equal(stat(spath, &stage_sb), 0);

    assert_int_equal(append_begin(f.conf, &t), STORE_OK);
    for (i = 0; i < 10; i++) {
        assert_int_equal(append_add(t, mbs[i], st, 0, 0, 0, &uid), STORE_OK);
        assert_int_equal(uid, 1);
    }
    commit_stats_get(&s0);
    assert_int_equal(append_commit(t), STORE_OK);
    commit_stats_get(&s1);
    assert_int_equal(s1.rounds - s0.rounds, 1);
    /* the message once plus ten indexes; ten directories */
    assert_int_equal(s1.file_syncs - s0.file_syncs, 11);
    assert_int_equal(s1.dir_syncs - s0.dir_syncs, 10);
    append_free(&t);

    /* still one staging file; every mailbox has a hard link to it */
    assert_int_equal(ta_count_files(sdir, NULL), 1);
    for (i = 0; i < 10; i++) {
        mailbox_message_path(mbs[i], 1, &path);
        assert_int_equal(stat(buf_cstring(&path), &sb), 0);
        assert_true(sb.st_ino == stage_sb.st_ino);
        assert_true(sb.st_dev == stage_sb.st_dev);
        assert_int_equal(sb.st_nlink, 11);
    }
    append_stage_free(&st);
    assert_int_equal(ta_count_files(sdir, NULL), 0);
    for (i = 0; i < 10; i++) {
        mailbox_message_path(mbs[i], 1, &path);
        assert_int_equal(stat(buf_cstring(&path), &sb), 0);
        assert_int_equal(sb.st_nlink, 10);
        assert_int_equal(mailbox_lock(mbs[i], MAILBOX_LOCK_SHARED), STORE_OK);
        assert_int_equal(mailbox_get_header(mbs[i])->exists, 1);
        ta_check_record(mbs[i], 1, m.s, m.len);
        assert_int_equal(mailbox_unlock(mbs[i]), STORE_OK);
        ta_assert_check(mbs[i]);
        mailbox_close(&mbs[i]);
    }
    buf_free(&m);
    buf_free(&path);
    free(sdir);
    free(sname);
    free(spath);
    ta_teardown(&f);
}

static void test_append_partitions(void **state)
{
    const char *backend = *state;
    struct ta_fix f;
    struct mailbox *home, *o1, *o2;
    struct append_stage *st;
    struct append_txn *t = NULL;
    struct buf m = BUF_INITIALIZER, extra = BUF_INITIALIZER;
    struct buf p0 = BUF_INITIALIZER, p1 = BUF_INITIALIZER, p2 = BUF_INITIALIZER;
    char *dir = th_mkdtemp("other"), *sdir, *odir;
    struct stat s0, s1, s2;
    uint32_t uid;
    long nd;

    buf_printf(&extra, "partition-other: %s\n", dir);
    ta_setup(&f, backend, "parts", buf_cstring(&extra));
    home = ta_create_open(&f, TH_D "user.home", "default");
    o1 = ta_create_open(&f, TH_D "user.away1", "other");
    o2 = ta_create_open(&f, TH_D "user.away2", "other");
    assert_string_equal(mailbox_partition(o1), "other");

    ta_message(&m, 4, 2);
    st = ta_stage(f.conf, NULL, m.s, m.len, 100);
    nd = imapconf_getint(f.conf, "stage_dirs");
    sdir = ta_stage_dir(f.spool, nd);
    odir = ta_stage_dir(dir, nd);
    assert_int_equal(append_begin(f.conf, &t), STORE_OK);
    assert_int_equal(append_add(t, o1, st, 0, 0, 0, &uid), STORE_OK);
    assert_int_equal(append_add(t, home, st, 0, 0, 0, &uid), STORE_OK);
    assert_int_equal(append_add(t, o2, st, 0, 0, 0, &uid), STORE_OK);
    assert_int_equal(append_commit(t), STORE_OK);
    append_free(&t);

    /* one staging file on each partition */
    assert_int_equal(ta_count_files(sdir, NULL), 1);
    assert_int_equal(ta_count_files(odir, NULL), 1);
    mailbox_message_path(home, 1, &p0);
    mailbox_message_path(o1, 1, &p1);
    mailbox_message_path(o2, 1, &p2);
    assert_int_equal(stat(buf_cstring(&p0), &s0), 0);
    assert_int_equal(stat(buf_cstring(&p1), &s1), 0);
    assert_int_equal(stat(buf_cstring(&p2), &s2), 0);
    assert_true(s1.st_ino == s2.st_ino && s1.st_dev == s2.st_dev);
    assert_false(s0.st_ino == s1.st_ino && s0.st_dev == s1.st_dev);
    assert_int_equal(s0.st_nlink, 2);   /* home + stage */
    assert_int_equal(s1.st_nlink, 3);   /* away1 + away2 + copy */
    append_stage_free(&st);
    assert_int_equal(ta_count_files(sdir, NULL), 0);
    assert_int_equal(ta_count_files(odir, NULL), 0);

    assert_int_equal(mailbox_lock(home, MAILBOX_LOCK_SHARED), STORE_OK);
    ta_check_record(home, 1, m.s, m.len);
    assert_int_equal(mailbox_unlock(home), STORE_OK);
    assert_int_equal(mailbox_lock(o1, MAILBOX_LOCK_SHARED), STORE_OK);
    ta_check_record(o1, 1, m.s, m.len);
    assert_int_equal(mailbox_unlock(o1), STORE_OK);
    assert_int_equal(mailbox_lock(o2, MAILBOX_LOCK_SHARED), STORE_OK);
    ta_check_record(o2, 1, m.s, m.len);
    assert_int_equal(mailbox_unlock(o2), STORE_OK);
    ta_assert_check(home);
    ta_assert_check(o1);
    ta_assert_check(o2);

    /* staged on the other partition from the start: no copy for o1 */
    st = ta_stage(f.conf, "other", m.s, m.len, 0);
    assert_int_equal(append_begin(f.conf, &t), STORE_OK);
    assert_int_equal(append_add(t, o1, st, 0, 0, 0, &uid), STORE_OK);
    assert_int_equal(uid, 2);
    assert_int_equal(ta_count_files(odir, NULL), 1);
    assert_int_equal(ta_count_files(sdir, NULL), 0);
    assert_int_equal(append_commit(t), STORE_OK);
    append_free(&t);
    append_stage_free(&st);

    mailbox_close(&home);
    mailbox_close(&o1);
    mailbox_close(&o2);
    buf_free(&m);
    buf_free(&extra);
    buf_free(&p0);
    buf_free(&p1);
    buf_free(&p2);
    free(sdir);
    free(odir);
    th_rmrf(dir);
    free(dir);
    ta_teardown(&f);
}

static void test_append_quota(void **state)
{
    const char *backend = *state;
    struct ta_fix f;
    struct mailbox *small, *counted, *free_mb;
    struct append_stage *st;
    struct append_txn *t = NULL;
    struct quota_db *q = NULL;
    struct quota qv;
    struct buf m = BUF_INITIALIZER;
    const struct mailbox_header *h;
    uint32_t uid = 77;

    ta_setup(&f, backend, "quota", NULL);
    small = ta_create_open(&f, TH_D "user.small", "default");
    counted = ta_create_open(&f, TH_D "user.counted", "default");
    free_mb = ta_create_open(&f, TH_D "user.free", "default");
    assert_int_equal(quota_open(f.conf, &q), STORE_OK);
    assert_int_equal(quota_set(q, TH_D "user.small", 1, QUOTA_UNLIMITED), STORE_OK);
    assert_int_equal(quota_set(q, TH_D "user.counted", QUOTA_UNLIMITED, 1),
                     STORE_OK);
    quota_close(&q);

    ta_message(&m, 5, 1);
    while (m.len < 2048)
        buf_append(&m, "padding padding padding\r\n", 26);
    st = ta_stage(f.conf, NULL, m.s, m.len, 0);

    assert_int_equal(append_begin(f.conf, &t), STORE_OK);
    /* 2 KiB into 1 KiB: refused, nothing reserved */
    assert_int_equal(append_add(t, small, st, 0, 0, 0, &uid),
                     STORE_OVERQUOTA);
    assert_int_equal(uid, 0);
    /* a mailbox without quota root passes; a count limit of 1 lets one in */
    assert_int_equal(append_add(t, free_mb, st, 0, 0, 0, &uid), STORE_OK);
    assert_int_equal(append_add(t, counted, st, 0, 0, 0, &uid), STORE_OK);
    assert_int_equal(append_commit(t), STORE_OK);
    h = ta_header(small);
    assert_int_equal(h->uidnext, 1);
    assert_int_equal(h->num_records, 0);
    assert_int_equal(h->exists, 0);

    /* the count limit is reached now */
    assert_int_equal(append_add(t, counted, st, 0, 0, 0, &uid),
                     STORE_OVERQUOTA);
    /* APPEND_IGNORE_QUOTA goes past both */
    assert_int_equal(append_add(t, small, st, 0, 0, APPEND_IGNORE_QUOTA, &uid),
                     STORE_OK);
    assert_int_equal(uid, 1);
    assert_int_equal(append_add(t, counted, st, 0, 0, APPEND_IGNORE_QUOTA,
                                &uid), STORE_OK);
    assert_int_equal(uid, 2);
    assert_int_equal(append_commit(t), STORE_OK);
    append_free(&t);
    append_stage_free(&st);

    h = ta_header(counted);
    assert_int_equal(h->exists, 2);
    assert_int_equal(quota_open(f.conf, &q), STORE_OK);
    assert_int_equal(quota_get(q, TH_D "user.counted", &qv), STORE_OK);
    assert_int_equal(qv.used_messages, 2);
    assert_int_equal(qv.used_bytes, 2 * m.len);
    assert_int_equal(quota_get(q, TH_D "user.small", &qv), STORE_OK);
    assert_int_equal(qv.used_messages, 1);
    quota_close(&q);
    ta_assert_check(small);
    ta_assert_check(counted);

    mailbox_close(&small);
    mailbox_close(&counted);
    mailbox_close(&free_mb);
    buf_free(&m);
    ta_teardown(&f);
}

static void test_append_toobig(void **state)
{
    const char *backend = *state;
    struct ta_fix f;
    struct mailbox *mb;
    struct append_stage *st = NULL;
    struct append_txn *t = NULL;
    struct buf m = BUF_INITIALIZER;
    uint32_t uid = 5;

    ta_setup(&f, backend, "toobig", "maxmessagesize: 1000\n");
    mb = ta_create_open(&f, TH_D "user.big", "default");
    ta_message(&m, 0, 1);   /* body longer than 1000 bytes */
    assert_true(m.len > 1000);
    log_init("test_append", LOG_TO_NONE);
    assert_int_equal(append_stage_open(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(append_stage_write(st, m.s, 600), STORE_OK);
    assert_int_equal(append_stage_write(st, m.s + 600, m.len - 600),
                     STORE_TOOBIG);
    assert_int_equal(append_stage_close(st), STORE_TOOBIG);
    assert_int_equal(append_begin(f.conf, &t), STORE_OK);
    assert_int_equal(append_add(t, mb, st, 0, 0, 0, &uid), STORE_TOOBIG);
    assert_int_equal(uid, 0);
    log_init("test_append", getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
    append_free(&t);
    append_stage_free(&st);
    assert_int_equal(ta_header(mb)->uidnext, 1);
    mailbox_close(&mb);
    buf_free(&m);
    ta_teardown(&f);
}

/* ---- 8 processes, one mailbox --------------------------------------------- */

struct ta_shared {
    uint32_t uid[TA_PROCS][TA_PER_PROC];
};

static void ta_child_fail(unsigned p, const char *what, int r)
{
    fprintf(stderr, "test_append: child %u: %s: %s\n", p, what,
            store_strerror(r));
    _exit(1);
}

static void ta_child(const struct imapconf *conf, unsigned p, int barrier,
                     struct ta_shared *sh)
{
    struct mailbox *mb = NULL;
    struct buf m = BUF_INITIALIZER;
    struct append_stage *st;
    struct append_txn *t;
    char c;
    unsigned i;
    int r;

    th_child_signals();
    alarm(60);
    r = mailbox_open(conf, TH_D "user.shared", "default", &mb);
    if (r)
        ta_child_fail(p, "mailbox_open", r);
    if (read(barrier, &c, 1) < 0)
        _exit(1);
    for (i = 0; i < TA_PER_PROC; i++) {
        ta_message(&m, p + 1, i);
        st = NULL;
        t = NULL;
        if ((r = append_stage_open(conf, NULL, &st)) ||
            (r = append_stage_write(st, m.s, m.len)) ||
            (r = append_stage_close(st)))
            ta_child_fail(p, "stage", r);
        if ((r = append_begin(conf, &t)) ||
            (r = append_add(t, mb, st, 0, 0, 0, &sh->uid[p][i])) ||
            (r = append_commit(t)))
            ta_child_fail(p, "append", r);
        append_free(&t);
        append_stage_free(&st);
    }
    mailbox_close(&mb);
    buf_free(&m);
    _exit(0);
}

/* "MARKER p=P i=I" of a message body: 0 and *p_r, *i_r, or -1. */
static int ta_parse_marker(const struct buf *msg, unsigned *p_r, unsigned *i_r)
{
    size_t hs = ta_header_size(msg->s, msg->len);
    char tmp[64];
    size_t n = msg->len - hs < sizeof(tmp) - 1 ? msg->len - hs : sizeof(tmp) - 1;

    memcpy(tmp, msg->s + hs, n);
    tmp[n] = '\0';
    if (sscanf(tmp, "MARKER p=%u i=%u", p_r, i_r) != 2)
        return -1;
    return 0;
}

static void test_append_concurrent(void **state)
{
    const char *backend = *state;
    struct ta_fix f;
    struct mailbox *mb;
    struct ta_shared *sh;
    struct buf got = BUF_INITIALIZER, want = BUF_INITIALIZER;
    struct mailbox_record rec;
    const struct mailbox_header *h;
    pid_t pids[TA_PROCS];
    int barrier[2], status, failed = 0;
    unsigned p, i, seen[TA_PROCS][TA_PER_PROC];
    uint32_t recno, prev = 0, exists = 0;
    char sbuf[64];

    ta_setup(&f, backend, "conc", NULL);
    mb = ta_create_open(&f, TH_D "user.shared", "default");
    mailbox_close(&mb);   /* handles are per process: none across fork */
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(sh != MAP_FAILED);
    memset(sh, 0, sizeof(*sh));
    memset(seen, 0, sizeof(seen));
    assert_int_equal(pipe(barrier), 0);
    for (p = 0; p < TA_PROCS; p++) {
        pids[p] = fork();
        assert_true(pids[p] >= 0);
        if (pids[p] == 0) {
            close(barrier[1]);
            ta_child(f.conf, p, barrier[0], sh);
        }
    }
    close(barrier[0]);
    close(barrier[1]);   /* go */
    for (p = 0; p < TA_PROCS; p++) {
        assert_int_equal(waitpid(pids[p], &status, 0), pids[p]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            print_message("child %u: %s\n", p,
                          th_status_text(status, sbuf, sizeof(sbuf)));
            failed = 1;
        }
    }
    assert_false(failed);

    assert_int_equal(mailbox_open(f.conf, TH_D "user.shared", "default", &mb),
                     STORE_OK);
    ta_assert_check(mb);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    h = mailbox_get_header(mb);
    assert_int_equal(h->exists, TA_PROCS * TA_PER_PROC);
    for (recno = 0; recno < h->visible; recno++) {
        assert_int_equal(mailbox_read_record(mb, recno, &rec), STORE_OK);
        assert_true(rec.uid > prev);   /* unique, strictly increasing */
        prev = rec.uid;
        if (rec.flags & (MAILBOX_FLAG_EXPUNGED | MAILBOX_FLAG_ABORTED))
            continue;
        assert_int_equal(rec.flags & MAILBOX_FLAG_PENDING, 0);
        exists++;
        ta_read_message(mb, rec.uid, &got);
        assert_int_equal(ta_parse_marker(&got, &p, &i), 0);
        assert_true(p >= 1 && p <= TA_PROCS && i < TA_PER_PROC);
        p--;
        assert_int_equal(seen[p][i], 0);
        seen[p][i] = 1;
        assert_int_equal(sh->uid[p][i], rec.uid);   /* the uid it was told */
        ta_message(&want, p + 1, i);
        assert_int_equal(got.len, want.len);
        assert_memory_equal(got.s, want.s, want.len);
        assert_int_equal(rec.size, want.len);
    }
    assert_int_equal(exists, TA_PROCS * TA_PER_PROC);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    mailbox_close(&mb);
    munmap(sh, sizeof(*sh));
    buf_free(&got);
    buf_free(&want);
    ta_teardown(&f);
}

/* ---- quota roots on every recipient ------------------------------------ */

/* Ten recipient mailboxes: seven are quota roots of their own, three sit
 * under one root TH_D "user.grp" (which is not a mailbox).  Each message goes
 * to all ten, in an order that depends on the sender (forward or
 * backward, rotated), and every fourth one to its first recipient twice:
 * append_commit() finishes them all with one mailbox_append_finish_many()
 * and one quota transaction. */
#define TQ_NMB 10
#define TQ_OWN 7
#define TQ_PROCS 4
#define TQ_PER_PROC 12
#define TQ_SINGLE 12

static const char *const tq_names[TQ_NMB] = {
    TH_D "user.q0", TH_D "user.q1", TH_D "user.q2", TH_D "user.q3", TH_D "user.q4", TH_D "user.q5",
    TH_D "user.q6", TH_D "user.grp.a", TH_D "user.grp.b", TH_D "user.grp.c"
};

struct tq_usage {
    uint64_t bytes[TQ_NMB];
    uint64_t msgs[TQ_NMB];
};

/* Recipients of message (p, i), as indexes into tq_names. */
static size_t tq_rcpts(unsigned p, unsigned i, unsigned *idx)
{
    unsigned start = (p * 3 + i) % TQ_NMB, k;
    size_t n = 0;

    for (k = 0; k < TQ_NMB; k++)
        idx[n++] = (p & 1) ? (start + TQ_NMB - k) % TQ_NMB
                           : (start + k) % TQ_NMB;
    if (i % 4 == 0)
        idx[n++] = start;   /* the same mailbox twice */
    return n;
}

/* What messages (p, 0 .. count-1) add to each mailbox. */
static void tq_expect(unsigned p, unsigned count, struct tq_usage *u)
{
    struct buf m = BUF_INITIALIZER;
    unsigned idx[TQ_NMB + 1], i;
    size_t n, k;

    for (i = 0; i < count; i++) {
        ta_message(&m, p, i);
        n = tq_rcpts(p, i, idx);
        for (k = 0; k < n; k++) {
            u->bytes[idx[k]] += m.len;
            u->msgs[idx[k]]++;
        }
    }
    buf_free(&m);
}

/* Deliver messages (p, 0 .. count-1); flags for append_add().  0 or the
 * first error. */
static int tq_deliver(const struct imapconf *conf, struct mailbox **mbs,
                      unsigned p, unsigned count, int flags)
{
    struct buf m = BUF_INITIALIZER;
    struct append_stage *st;
    struct append_txn *t;
    unsigned idx[TQ_NMB + 1], i;
    size_t n, k;
    int r = STORE_OK;

    for (i = 0; r == STORE_OK && i < count; i++) {
        ta_message(&m, p, i);
        st = NULL;
        t = NULL;
        if ((r = append_stage_open(conf, NULL, &st)) ||
            (r = append_stage_write(st, m.s, m.len)) ||
            (r = append_stage_close(st)) ||
            (r = append_begin(conf, &t)))
            goto next;
        n = tq_rcpts(p, i, idx);
        for (k = 0; r == STORE_OK && k < n; k++)
            r = append_add(t, mbs[idx[k]], st, 0, 0, flags, NULL);
        if (r == STORE_OK)
            r = append_commit(t);
    next:
        append_free(&t);
        append_stage_free(&st);
    }
    buf_free(&m);
    return r;
}

static void tq_open_all(struct ta_fix *f, struct mailbox **mbs)
{
    unsigned k;

    for (k = 0; k < TQ_NMB; k++) {
        mbs[k] = NULL;
        assert_int_equal(mailbox_open(f->conf, tq_names[k], "default",
                                      &mbs[k]), STORE_OK);
    }
}

static void tq_close_all(struct mailbox **mbs)
{
    unsigned k;

    for (k = 0; k < TQ_NMB; k++)
        mailbox_close(&mbs[k]);
    quota_shared_close();   /* nothing shared across fork() */
}

/* Headers and quota roots equal the expected usage exactly.  When
 * quota_too is 0 only the headers are compared. */
static void tq_verify(struct ta_fix *f, struct mailbox **mbs,
                      const struct tq_usage *u, int quota_too)
{
    struct quota_db *q = NULL;
    struct quota qv;
    uint64_t gb = 0, gm = 0;
    unsigned k;

    for (k = 0; k < TQ_NMB; k++) {
        const struct mailbox_header *h = ta_header(mbs[k]);

        assert_int_equal(h->exists, u->msgs[k]);
        assert_int_equal(h->quota_used, u->bytes[k]);
        assert_int_equal(h->visible, h->num_records);
        if (k >= TQ_OWN) {
            gb += u->bytes[k];
            gm += u->msgs[k];
        }
        ta_assert_check(mbs[k]);
    }
    if (!quota_too)
        return;
    assert_int_equal(quota_shared(f->conf, &q), STORE_OK);
    for (k = 0; k < TQ_OWN; k++) {
        assert_int_equal(quota_get(q, tq_names[k], &qv), STORE_OK);
        assert_int_equal(qv.used_bytes, u->bytes[k]);
        assert_int_equal(qv.used_messages, u->msgs[k]);
    }
    assert_int_equal(quota_get(q, TH_D "user.grp", &qv), STORE_OK);
    assert_int_equal(qv.used_bytes, gb);
    assert_int_equal(qv.used_messages, gm);
}

/* Replace the R record of root by raw bytes (no quota handle open). */
static void tq_raw_root(struct ta_fix *f, const char *backend,
                        const char *root, const char *val)
{
    struct cyrusdb *db = NULL;
    char *path = th_path(imapconf_getstring(f->conf, "configdirectory"),
                         QUOTA_FNAME);
    char key[64];

    snprintf(key, sizeof(key), "R%s", root);
    quota_shared_close();
    assert_int_equal(cyrusdb_open(backend, path, CYRUSDB_MBOXSORT, &db, NULL),
                     CYRUSDB_OK);
    assert_int_equal(cyrusdb_store(db, key, strlen(key), val, strlen(val),
                                   NULL), CYRUSDB_OK);
    cyrusdb_close(&db);
    free(path);
}

static void test_append_quota_rcpts(void **state)
{
    const char *backend = *state;
    struct ta_fix f;
    struct mailbox *mbs[TQ_NMB];
    struct tq_usage u;
    struct quota_db *q = NULL;
    struct quota grp;
    pid_t pids[TQ_PROCS];
    int barrier[2], status, failed = 0;
    unsigned k, p;
    char sbuf[64], val[128];

    ta_setup(&f, backend, "qrcpts", NULL);
    for (k = 0; k < TQ_NMB; k++) {
        mbs[k] = ta_create_open(&f, tq_names[k], "default");
        mailbox_close(&mbs[k]);
    }
    assert_int_equal(quota_open(f.conf, &q), STORE_OK);
    for (k = 0; k < TQ_OWN; k++)
        assert_int_equal(quota_set(q, tq_names[k], QUOTA_UNLIMITED,
                                   QUOTA_UNLIMITED), STORE_OK);
    assert_int_equal(quota_set(q, TH_D "user.grp", 1LL << 30, 1000000), STORE_OK);
    quota_close(&q);
    memset(&u, 0, sizeof(u));

    /* one process */
    tq_open_all(&f, mbs);
    assert_int_equal(tq_deliver(f.conf, mbs, 0, TQ_SINGLE, 0), STORE_OK);
    tq_expect(0, TQ_SINGLE, &u);
    tq_verify(&f, mbs, &u, 1);
    tq_close_all(mbs);

    /* four processes at once, recipients in different orders */
    assert_int_equal(pipe(barrier), 0);
    for (p = 1; p <= TQ_PROCS; p++) {
        pids[p - 1] = fork();
        assert_true(pids[p - 1] >= 0);
        if (pids[p - 1] == 0) {
            struct mailbox *cm[TQ_NMB];
            char c;
            int r = STORE_OK;

            th_child_signals();
            alarm(60);
            close(barrier[1]);
            for (k = 0; r == STORE_OK && k < TQ_NMB; k++)
                r = mailbox_open(f.conf, tq_names[k], "default", &cm[k]);
            if (r || read(barrier[0], &c, 1) < 0)
                ta_child_fail(p, "open", r);
            r = tq_deliver(f.conf, cm, p, TQ_PER_PROC, 0);
            if (r)
                ta_child_fail(p, "deliver", r);
            for (k = 0; k < TQ_NMB; k++)
                mailbox_close(&cm[k]);
            _exit(0);
        }
    }
    close(barrier[0]);
    close(barrier[1]);   /* go */
    for (p = 0; p < TQ_PROCS; p++) {
        assert_int_equal(waitpid(pids[p], &status, 0), pids[p]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            print_message("child %u: %s\n", p + 1,
                          th_status_text(status, sbuf, sizeof(sbuf)));
            failed = 1;
        }
    }
    assert_false(failed);
    for (p = 1; p <= TQ_PROCS; p++)
        tq_expect(p, TQ_PER_PROC, &u);
    tq_open_all(&f, mbs);
    tq_verify(&f, mbs, &u, 1);

    /* a quota transaction that fails (one damaged root) changes no root,
     * the messages still become visible, and every mailbox keeps "quota
     * not yet told" for its next exclusive locker */
    assert_int_equal(quota_shared(f.conf, &q), STORE_OK);
    assert_int_equal(quota_get(q, TH_D "user.grp", &grp), STORE_OK);
    tq_raw_root(&f, backend, TH_D "user.grp", "garbage");
    log_init("test_append", LOG_TO_NONE);
    assert_int_equal(tq_deliver(f.conf, mbs, TQ_PROCS + 1, 1,
                                APPEND_IGNORE_QUOTA), STORE_OK);
    log_init("test_append", getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
    {
        struct tq_usage before = u;

        tq_expect(TQ_PROCS + 1, 1, &u);
        tq_verify(&f, mbs, &u, 0);
        /* the roots still show the usage before the message */
        assert_int_equal(quota_shared(f.conf, &q), STORE_OK);
        for (k = 0; k < TQ_OWN; k++) {
            struct quota qv;

            assert_int_equal(quota_get(q, tq_names[k], &qv), STORE_OK);
            assert_int_equal(qv.used_bytes, before.bytes[k]);
            assert_int_equal(qv.used_messages, before.msgs[k]);
        }
    }
    /* repaired as it was; each mailbox's next exclusive lock reports */
    snprintf(val, sizeof(val), "%lld %lld %llu %llu", grp.storage_limit_kb,
             grp.message_limit, (unsigned long long)grp.used_bytes,
             (unsigned long long)grp.used_messages);
    tq_raw_root(&f, backend, TH_D "user.grp", val);
    for (k = 0; k < TQ_NMB; k++) {
        assert_int_equal(mailbox_lock(mbs[k], MAILBOX_LOCK_EXCLUSIVE),
                         STORE_OK);
        assert_int_equal(mailbox_unlock(mbs[k]), STORE_OK);
    }
    tq_verify(&f, mbs, &u, 1);
    tq_close_all(mbs);
    ta_teardown(&f);
}

int main(void)
{
    static const struct CMUnitTest once[] = {
        cmocka_unit_test(test_commit_batch),
        cmocka_unit_test(test_stage_info),
        cmocka_unit_test(test_stage_toobig),
    };
    static const struct th_case cases[] = {
        { "append_one", test_append_one },
        { "many_rcpts", test_append_many_rcpts },
        { "partitions", test_append_partitions },
        { "quota", test_append_quota },
        { "toobig", test_append_toobig },
        { "concurrent", test_append_concurrent },
        { "quota_rcpts", test_append_quota_rcpts },
    };
    int rc;

    log_init("test_append", getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
    signal(SIGPIPE, SIG_IGN);
    srandom((unsigned)getpid());
    rc = cmocka_run_group_tests_name("commit+stage", once, NULL, NULL);
    rc += th_run_per_backend("append", cases, sizeof(cases) / sizeof(cases[0]));
    return rc;
}
