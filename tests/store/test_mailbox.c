/*
 * test_mailbox.c - the mailbox spool and index (store/mailbox.c), every
 * case once per cyrusdb backend (the backend is the quota database's).
 *
 * Real files, real fcntl locks, real forked processes: create / open /
 * header; append (reserve, sync round, finish) with staged files written
 * here; the visible prefix under out-of-order finishes and cancels; flags,
 * user flags, expunge and the counters; cleanup and compaction; a reader
 * in a forked child that checks the index while the parent writes;
 * recovery of appends whose process died (file intact: committed; file
 * damaged: aborted); damaged records and header slots detected by
 * mailbox_check()/mailbox_open() and repaired by mailbox_reconstruct();
 * mailbox_reconstruct_verified() taking only files vouched for;
 * torn trailing records cut off; quota usage following the header.
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
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/evp.h>

#include "lib/buf.h"
#include "lib/fsutil.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "store/commit.h"
#include "store/mailbox.h"
#include "store/quota.h"
#include "store/store.h"
#include "tests/testhelp.h"

#define HDR_AREA 4096
#define REC_SIZE 128

struct fx {
    const char *backend;
    char *dir;
    char *spool;
    struct imapconf *conf;
    unsigned seq;
};

static void fx_open(struct fx *fx, void **state, const char *extra)
{
    memset(fx, 0, sizeof(*fx));
    log_init("test_mailbox", getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
    fx->backend = (const char *)*state;
    fx->dir = th_mkdtemp("mailbox");
    fx->conf = th_store_conf(fx->dir, fx->backend, extra);
    fx->spool = th_path(fx->dir, "spool");
}

static void fx_close(struct fx *fx)
{
    imapconf_free(&fx->conf);
    th_rmrf(fx->dir);
    free(fx->dir);
    free(fx->spool);
}

/* A message text of about `len` bytes, deterministic from seed. */
static void make_message(struct buf *m, unsigned seed, size_t len)
{
    buf_reset(m);
    buf_printf(m, "From: a@example.org\r\nSubject: test %u\r\n"
               "Message-ID: <%u@example.org>\r\n\r\n", seed, seed);
    while (m->len < len)
        buf_printf(m, "line %u of message %u\r\n", (unsigned)m->len, seed);
}

/* Write a staging file holding msg; its info computed independently. */
static char *stage(struct fx *fx, const struct buf *msg,
                   struct mailbox_msginfo *info)
{
    struct buf path = BUF_INITIALIZER;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    const char *sep;
    size_t i;
    int fd;

    buf_printf(&path, "%s/stage.test", fx->spool);
    assert_int_equal(fs_mkdir_p(buf_cstring(&path), 0750), 0);
    buf_printf(&path, "/%u", fx->seq++);
    fd = open(buf_cstring(&path), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(fs_write_all(fd, msg->s, msg->len), 0);
    assert_int_equal(close(fd), 0);
    memset(info, 0, sizeof(*info));
    info->size = (uint32_t)msg->len;
    sep = NULL;
    for (i = 0; i + 3 < msg->len; i++) {
        if (!memcmp(msg->s + i, "\r\n\r\n", 4)) {
            sep = msg->s + i + 4;
            break;
        }
    }
    info->header_size = sep ? (uint32_t)(sep - msg->s) : (uint32_t)msg->len;
    assert_int_equal(EVP_Digest(msg->s, msg->len, md, &mdlen, EVP_sha1(),
                                NULL), 1);
    assert_int_equal(mdlen, MAILBOX_DIGEST_LEN);
    memcpy(info->digest, md, MAILBOX_DIGEST_LEN);
    return buf_release(&path);
}

/* Reserve msg in mb with a real sync round; the uid. */
static uint32_t reserve(struct fx *fx, struct mailbox *mb,
                        const struct buf *msg, uint32_t sysflags)
{
    struct mailbox_msginfo info;
    struct commit_batch *b = NULL;
    char *sp = stage(fx, msg, &info);
    uint32_t uid = 0;

    assert_int_equal(commit_batch_new(fx->conf, &b), STORE_OK);
    assert_int_equal(mailbox_append_reserve(mb, sp, &info, 1234567,
                                            sysflags, b, &uid), STORE_OK);
    assert_true(uid > 0);
    assert_int_equal(commit_batch_sync(b), STORE_OK);
    commit_batch_free(&b);
    unlink(sp);   /* the mailbox keeps its own link */
    free(sp);
    return uid;
}

static uint32_t append(struct fx *fx, struct mailbox *mb, unsigned seed,
                       size_t len)
{
    struct buf m = BUF_INITIALIZER;
    uint32_t uid;

    make_message(&m, seed, len);
    uid = reserve(fx, mb, &m, 0);
    assert_int_equal(mailbox_append_finish(mb, uid), STORE_OK);
    buf_free(&m);
    return uid;
}

static struct mailbox *open_mb(struct fx *fx, const char *name)
{
    struct mailbox *mb = NULL;

    assert_int_equal(mailbox_open(fx->conf, name, NULL, &mb), STORE_OK);
    assert_non_null(mb);
    return mb;
}

static void create_mb(struct fx *fx, const char *name)
{
    assert_int_equal(mailbox_create(fx->conf, name, NULL, "uid-1", 777),
                     STORE_OK);
}

static struct mailbox_header header_of(struct mailbox *mb)
{
    struct mailbox_header h;

    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    h = *mailbox_get_header(mb);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    return h;
}

static void expect_check_ok(struct mailbox *mb)
{
    struct buf problem = BUF_INITIALIZER;
    int r = mailbox_check(mb, &problem);

    if (r != STORE_OK)
        fail_msg("mailbox_check: %s: %s", store_strerror(r),
                 buf_cstring(&problem));
    buf_free(&problem);
}

static void file_content(const char *path, struct buf *out)
{
    char b[4096];
    ssize_t n;
    int fd = open(path, O_RDONLY);

    buf_reset(out);
    assert_true(fd >= 0);
    while ((n = read(fd, b, sizeof(b))) > 0)
        buf_append(out, b, (size_t)n);
    close(fd);
}

static char *index_path(struct mailbox *mb)
{
    return th_path(mailbox_dir(mb), MAILBOX_INDEX_FNAME);
}

static void flip_byte(const char *path, off_t off)
{
    unsigned char c;
    int fd = open(path, O_RDWR);

    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &c, 1, off), 1);
    c ^= 0x5a;
    assert_int_equal(pwrite(fd, &c, 1, off), 1);
    close(fd);
}

static int wait_child(pid_t pid)
{
    char text[64];
    int status;

    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        print_message("child: %s\n", th_status_text(status, text, sizeof(text)));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

/* ---- cases -------------------------------------------------------------- */

static void test_create_open(void **state)
{
    struct fx fx;
    struct mailbox *mb, *mb2;
    struct mailbox_header h;
    struct buf dir = BUF_INITIALIZER, path = BUF_INITIALIZER;
    struct stat sb;

    fx_open(&fx, state, NULL);
    assert_int_equal(mailbox_open(fx.conf, TH_D "user.alice", NULL, &mb),
                     STORE_NOTFOUND);
    create_mb(&fx, TH_D "user.alice");
    create_mb(&fx, TH_D "user.alice.Sent");
    assert_int_equal(mailbox_create(fx.conf, TH_D "user.alice", NULL, "x", 0),
                     STORE_EXISTS);
    assert_int_equal(mailbox_create(fx.conf, TH_D "user.bob", "nopart", "x", 0),
                     STORE_BADPARTITION);
    assert_int_equal(mailbox_create(fx.conf, TH_D "user..bob", NULL, "x", 0),
                     STORE_BADNAME);
    assert_int_equal(mailbox_spool_dir(fx.conf, TH_D "user.alice.Sent", NULL,
                                       &dir), STORE_OK);
    buf_printf(&path, "%s/" TH_DPATH "user/alice/Sent", fx.spool);
    assert_string_equal(buf_cstring(&dir), buf_cstring(&path));
    buf_printf(&path, "/%s", MAILBOX_HEADER_FNAME);
    assert_int_equal(stat(buf_cstring(&path), &sb), 0);

    mb = open_mb(&fx, TH_D "user.alice");
    mb2 = open_mb(&fx, TH_D "user.alice");
    assert_ptr_equal(mb, mb2);   /* one handle per process */
    mailbox_close(&mb2);
    assert_null(mb2);
    assert_string_equal(mailbox_name(mb), TH_D "user.alice");
    assert_string_equal(mailbox_uniqueid(mb), "uid-1");
    assert_string_equal(mailbox_partition(mb), "default");
    h = header_of(mb);
    assert_int_equal(h.uidvalidity, 777);
    assert_int_equal(h.uidnext, 1);
    assert_int_equal(h.num_records, 0);
    assert_int_equal(h.exists, 0);
    assert_int_equal(mailbox_unlock(mb), STORE_INTERNAL);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_INTERNAL);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    expect_check_ok(mb);
    mailbox_close(&mb);

    /* deleting the parent keeps the child's spool */
    assert_int_equal(mailbox_delete_spool(fx.conf, TH_D "user.alice", NULL),
                     STORE_OK);
    assert_int_equal(mailbox_open(fx.conf, TH_D "user.alice", NULL, &mb),
                     STORE_NOTFOUND);
    mb = open_mb(&fx, TH_D "user.alice.Sent");
    mailbox_close(&mb);
    assert_int_equal(mailbox_delete_spool(fx.conf, TH_D "user.alice.Sent", NULL),
                     STORE_OK);
    buf_reset(&path);
    buf_printf(&path, "%s/" TH_DPATH "user/alice", fx.spool);
    assert_int_equal(stat(buf_cstring(&path), &sb), -1);
    /* a directory left without index is reused */
    buf_printf(&path, "/Drafts");
    assert_int_equal(fs_mkdir_p(buf_cstring(&path), 0750), 0);
    assert_int_equal(mailbox_create(fx.conf, TH_D "user.alice.Drafts", NULL, "d",
                                    0), STORE_OK);
    buf_free(&dir);
    buf_free(&path);
    fx_close(&fx);
}

static void test_hashed_spool(void **state)
{
    struct fx fx;
    struct buf dir = BUF_INITIALIZER, want = BUF_INITIALIZER;
    struct mailbox *mb;

    fx_open(&fx, state, "hashimapspool: yes\n");
    create_mb(&fx, TH_D "user.Zed");
    assert_int_equal(mailbox_spool_dir(fx.conf, TH_D "user.Zed", NULL, &dir),
                     STORE_OK);
    buf_printf(&want, "%s/" TH_DPATH_H "z/user/Zed", fx.spool);
    assert_string_equal(buf_cstring(&dir), buf_cstring(&want));
    mb = open_mb(&fx, TH_D "user.Zed");
    append(&fx, mb, 1, 300);
    assert_string_equal(mailbox_dir(mb), buf_cstring(&want));
    expect_check_ok(mb);
    mailbox_close(&mb);
    assert_int_equal(mailbox_delete_spool(fx.conf, TH_D "user.Zed", NULL),
                     STORE_OK);
    buf_reset(&want);
    buf_printf(&want, "%s/z", fx.spool);
    assert_int_equal(access(buf_cstring(&want), F_OK), -1);
    buf_free(&dir);
    buf_free(&want);
    fx_close(&fx);
}

static void test_append(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct mailbox_header h;
    struct mailbox_record rec;
    struct buf m = BUF_INITIALIZER, path = BUF_INITIALIZER;
    struct buf got = BUF_INITIALIZER;
    uint32_t uid, recno;
    int fd;

    fx_open(&fx, state, NULL);
    create_mb(&fx, TH_D "user.a");
    mb = open_mb(&fx, TH_D "user.a");
    make_message(&m, 7, 2000);
    uid = reserve(&fx, mb, &m, MAILBOX_FLAG_SEEN);
    assert_int_equal(uid, 1);
    h = header_of(mb);
    assert_int_equal(h.num_records, 1);
    assert_int_equal(h.visible, 0);
    assert_int_equal(h.uidnext, 2);
    assert_int_equal(mailbox_append_finish(mb, uid), STORE_OK);
    assert_int_equal(mailbox_append_finish(mb, uid), STORE_NOTFOUND);
    h = header_of(mb);
    assert_int_equal(h.visible, 1);
    assert_int_equal(h.exists, 1);
    assert_int_equal(h.quota_used, m.len);
    assert_int_equal(h.highestmodseq, 1);

    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    assert_int_equal(mailbox_find_uid(mb, 1, &recno), STORE_OK);
    assert_int_equal(recno, 0);
    assert_int_equal(mailbox_find_uid(mb, 2, &recno), STORE_NOTFOUND);
    assert_int_equal(mailbox_read_record(mb, 0, &rec), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, 1, &rec), STORE_NOTFOUND);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_int_equal(rec.uid, 1);
    assert_int_equal(rec.flags, MAILBOX_FLAG_SEEN);
    assert_int_equal(rec.size, m.len);
    assert_int_equal(rec.internaldate, 1234567);
    assert_int_equal(rec.modseq, 1);
    assert_int_equal(rec.header_size,
                     strstr(buf_cstring(&m), "\r\n\r\n") - m.s + 4);
    mailbox_message_path(mb, 1, &path);
    file_content(buf_cstring(&path), &got);
    assert_int_equal(got.len, m.len);
    assert_memory_equal(got.s, m.s, m.len);
    assert_int_equal(mailbox_open_message(mb, 1, &fd), STORE_OK);
    close(fd);
    assert_int_equal(mailbox_open_message(mb, 9, &fd), STORE_NOTFOUND);

    for (unsigned i = 0; i < 10; i++)
        assert_int_equal(append(&fx, mb, 100 + i, 100 + 50 * i), 2 + i);
    h = header_of(mb);
    assert_int_equal(h.exists, 11);
    assert_int_equal(h.visible, 11);
    assert_int_equal(h.highestmodseq, 11);
    expect_check_ok(mb);
    mailbox_close(&mb);

    /* a fresh process view (no handle left) sees the same */
    mb = open_mb(&fx, TH_D "user.a");
    h = header_of(mb);
    assert_int_equal(h.exists, 11);
    expect_check_ok(mb);
    mailbox_close(&mb);
    buf_free(&m);
    buf_free(&path);
    buf_free(&got);
    fx_close(&fx);
}

static void test_visible_order(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct mailbox_header h;
    struct mailbox_record rec;
    struct buf m = BUF_INITIALIZER, path = BUF_INITIALIZER;
    uint32_t a, b, c, d, recno;
    uint64_t sizes;

    fx_open(&fx, state, NULL);
    create_mb(&fx, TH_D "user.v");
    mb = open_mb(&fx, TH_D "user.v");
    make_message(&m, 1, 500);
    sizes = m.len;
    a = reserve(&fx, mb, &m, 0);
    make_message(&m, 2, 700);
    sizes += m.len;
    b = reserve(&fx, mb, &m, 0);
    assert_int_equal(mailbox_append_finish(mb, b), STORE_OK);
    h = header_of(mb);
    assert_int_equal(h.visible, 0);   /* B waits for A */
    assert_int_equal(h.exists, 0);
    assert_int_equal(h.num_records, 2);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    assert_int_equal(mailbox_find_uid(mb, b, &recno), STORE_NOTFOUND);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_int_equal(mailbox_append_finish(mb, a), STORE_OK);
    h = header_of(mb);
    assert_int_equal(h.visible, 2);
    assert_int_equal(h.exists, 2);
    assert_int_equal(h.quota_used, sizes);

    /* C reserved, D finished, C cancelled: D visible, C gone */
    make_message(&m, 3, 300);
    c = reserve(&fx, mb, &m, 0);
    make_message(&m, 4, 400);
    sizes += m.len;
    d = reserve(&fx, mb, &m, 0);
    assert_int_equal(mailbox_append_finish(mb, d), STORE_OK);
    assert_int_equal(header_of(mb).visible, 2);
    assert_int_equal(mailbox_append_cancel(mb, c), STORE_OK);
    assert_int_equal(mailbox_append_cancel(mb, c), STORE_NOTFOUND);
    h = header_of(mb);
    assert_int_equal(h.visible, 4);
    assert_int_equal(h.exists, 3);
    assert_int_equal(h.uidnext, 5);
    assert_int_equal(h.quota_used, sizes);
    mailbox_message_path(mb, c, &path);
    assert_int_equal(access(buf_cstring(&path), F_OK), -1);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, 2, &rec), STORE_OK);
    assert_int_equal(rec.uid, c);
    assert_true(rec.flags & MAILBOX_FLAG_ABORTED);
    assert_int_equal(mailbox_read_record(mb, 3, &rec), STORE_OK);
    assert_int_equal(rec.uid, d);
    assert_int_equal(rec.flags & (MAILBOX_FLAG_PENDING | MAILBOX_FLAG_ABORTED),
                     0);
    assert_int_equal(rec.modseq, h.highestmodseq);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    expect_check_ok(mb);
    mailbox_close(&mb);
    buf_free(&m);
    buf_free(&path);
    fx_close(&fx);
}

static void test_flags_expunge(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct mailbox_header h;
    struct mailbox_record rec;
    uint64_t size0, mod, used;
    int junk, work, n;

    fx_open(&fx, state, NULL);
    create_mb(&fx, TH_D "user.f");
    mb = open_mb(&fx, TH_D "user.f");
    append(&fx, mb, 1, 300);
    append(&fx, mb, 2, 600);
    append(&fx, mb, 3, 900);
    h = header_of(mb);
    mod = h.highestmodseq;
    used = h.quota_used;

    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, 1, &rec), STORE_OK);
    assert_int_equal(mailbox_rewrite_record(mb, 1, &rec), STORE_INTERNAL);
    assert_int_equal(mailbox_user_flag(mb, "$Junk", 1, &junk), STORE_INTERNAL);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);

    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_user_flag(mb, "$Junk", 0, &junk), STORE_NOTFOUND);
    assert_int_equal(mailbox_user_flag(mb, "$Junk", 1, &junk), STORE_OK);
    assert_int_equal(mailbox_user_flag(mb, "Work", 1, &work), STORE_OK);
    assert_int_equal(mailbox_user_flag(mb, "$junk", 0, &n), STORE_OK);
    assert_int_equal(n, junk);
    assert_int_not_equal(junk, work);
    assert_int_equal(mailbox_user_flag(mb, "bad flag", 1, &n), STORE_BADNAME);
    assert_int_equal(mailbox_user_flag(mb, "\\Seen", 1, &n), STORE_BADNAME);
    assert_int_equal(mailbox_read_record(mb, 1, &rec), STORE_OK);
    rec.flags = MAILBOX_FLAG_FLAGGED | MAILBOX_FLAG_PENDING;
    rec.user_flags[junk / 32] |= 1u << (junk % 32);
    assert_int_equal(mailbox_rewrite_record(mb, 1, &rec), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, 0, &rec), STORE_OK);
    size0 = rec.size;
    rec.flags |= MAILBOX_FLAG_DELETED | MAILBOX_FLAG_EXPUNGED;
    assert_int_equal(mailbox_rewrite_record(mb, 0, &rec), STORE_OK);
    /* EXPUNGED is never cleared */
    rec.flags = MAILBOX_FLAG_SEEN;
    assert_int_equal(mailbox_rewrite_record(mb, 0, &rec), STORE_OK);
    assert_int_equal(mailbox_rewrite_record(mb, 3, &rec), STORE_NOTFOUND);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);

    h = header_of(mb);
    assert_int_equal(h.exists, 2);
    assert_int_equal(h.highestmodseq, mod + 3);
    assert_int_equal(h.quota_used, used - size0);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, 0, &rec), STORE_OK);
    assert_true(rec.flags & MAILBOX_FLAG_EXPUNGED);
    assert_int_equal(rec.flags & MAILBOX_SYSTEM_FLAGS, MAILBOX_FLAG_SEEN);
    assert_int_equal(rec.modseq, mod + 3);
    assert_int_equal(mailbox_read_record(mb, 1, &rec), STORE_OK);
    assert_int_equal(rec.flags, MAILBOX_FLAG_FLAGGED);
    assert_true(rec.user_flags[junk / 32] & (1u << (junk % 32)));
    assert_int_equal(rec.modseq, mod + 1);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    expect_check_ok(mb);
    mailbox_close(&mb);

    /* another process sees the flag names and the counters */
    {
        pid_t pid = fork();

        assert_true(pid >= 0);
        if (pid == 0) {
            struct mailbox *cm = NULL;
            int ok;

            th_child_signals();
            if (mailbox_open(fx.conf, TH_D "user.f", NULL, &cm) != STORE_OK)
                _exit(1);
            ok = mailbox_user_flag(cm, "WORK", 0, &n) == STORE_OK &&
                 n == work && mailbox_user_flag_name(cm, junk) &&
                 !strcmp(mailbox_user_flag_name(cm, junk), "$Junk") &&
                 mailbox_lock(cm, MAILBOX_LOCK_SHARED) == STORE_OK &&
                 mailbox_get_header(cm)->exists == 2 &&
                 mailbox_get_header(cm)->quota_used == h.quota_used;
            _exit(ok ? 0 : 2);
        }
        assert_int_equal(wait_child(pid), 0);
    }
    fx_close(&fx);
}

static void test_cleanup(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct mailbox_header h;
    struct mailbox_record rec;
    struct buf p1 = BUF_INITIALIZER, p3 = BUF_INITIALIZER;
    struct buf m = BUF_INITIALIZER;
    uint32_t recno, pend;
    pid_t pid;
    int sync_pipe[2], go_pipe[2];
    char c;

    fx_open(&fx, state, NULL);
    create_mb(&fx, TH_D "user.c");
    mb = open_mb(&fx, TH_D "user.c");
    for (unsigned i = 0; i < 5; i++)
        append(&fx, mb, i, 200 + 10 * i);

    /* a child keeps a handle open across the compaction */
    assert_int_equal(pipe(sync_pipe), 0);
    assert_int_equal(pipe(go_pipe), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct mailbox *cm = NULL;
        struct buf problem = BUF_INITIALIZER;
        int ok;

        th_child_signals();
        if (mailbox_open(fx.conf, TH_D "user.c", NULL, &cm) != STORE_OK)
            _exit(1);
        if (write(sync_pipe[1], "r", 1) != 1 || read(go_pipe[0], &c, 1) != 1)
            _exit(2);
        ok = mailbox_lock(cm, MAILBOX_LOCK_SHARED) == STORE_OK &&
             mailbox_get_header(cm)->num_records == 3 &&
             mailbox_get_header(cm)->compactions == 1 &&
             mailbox_unlock(cm) == STORE_OK &&
             mailbox_check(cm, &problem) == STORE_OK;
        _exit(ok ? 0 : 3);
    }
    assert_int_equal(read(sync_pipe[0], &c, 1), 1);

    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    for (recno = 1; recno <= 3; recno += 2) {
        assert_int_equal(mailbox_read_record(mb, recno, &rec), STORE_OK);
        rec.flags |= MAILBOX_FLAG_EXPUNGED;
        assert_int_equal(mailbox_rewrite_record(mb, recno, &rec), STORE_OK);
    }
    assert_int_equal(mailbox_unlock(mb), STORE_OK);

    /* a pending append blocks compaction, not file removal */
    make_message(&m, 99, 100);
    pend = reserve(&fx, mb, &m, 0);
    mailbox_message_path(mb, 2, &p1);
    mailbox_message_path(mb, 4, &p3);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_cleanup(mb), STORE_OK);
    assert_int_equal(mailbox_get_header(mb)->num_records, 6);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_int_equal(access(buf_cstring(&p1), F_OK), -1);
    assert_int_equal(access(buf_cstring(&p3), F_OK), -1);
    assert_int_equal(mailbox_append_cancel(mb, pend), STORE_OK);

    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_cleanup(mb), STORE_OK);
    h = *mailbox_get_header(mb);
    assert_int_equal(mailbox_find_uid(mb, 5, &recno), STORE_OK);
    assert_int_equal(recno, 2);
    assert_int_equal(mailbox_find_uid(mb, 2, &recno), STORE_NOTFOUND);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_int_equal(h.num_records, 3);
    assert_int_equal(h.visible, 3);
    assert_int_equal(h.exists, 3);
    assert_int_equal(h.compactions, 1);
    assert_int_equal(h.uidnext, 7);
    expect_check_ok(mb);

    assert_int_equal(write(go_pipe[1], "g", 1), 1);
    assert_int_equal(wait_child(pid), 0);
    close(sync_pipe[0]);
    close(sync_pipe[1]);
    close(go_pipe[0]);
    close(go_pipe[1]);

    /* appends go on after the compaction */
    assert_int_equal(append(&fx, mb, 50, 100), 7);
    assert_int_equal(header_of(mb).exists, 4);
    expect_check_ok(mb);
    mailbox_close(&mb);
    buf_free(&p1);
    buf_free(&p3);
    buf_free(&m);
    fx_close(&fx);
}

/* A child checks the index over and over while the parent appends,
 * flags, expunges and compacts. */
static void test_concurrent_reader(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct mailbox_record rec;
    int stop_pipe[2];
    pid_t pid;

    fx_open(&fx, state, NULL);
    create_mb(&fx, TH_D "user.r");
    mb = open_mb(&fx, TH_D "user.r");
    append(&fx, mb, 0, 100);
    assert_int_equal(pipe(stop_pipe), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct mailbox *cm = NULL;
        struct buf problem = BUF_INITIALIZER;
        struct mailbox_record crec;
        int rounds = 0, r;
        char c;

        th_child_signals();
        close(stop_pipe[1]);
        if (fcntl(stop_pipe[0], F_SETFL, O_NONBLOCK) < 0)
            _exit(1);
        if (mailbox_open(fx.conf, TH_D "user.r", NULL, &cm) != STORE_OK)
            _exit(1);
        for (;;) {
            const struct mailbox_header *h;
            uint32_t i, exists = 0;
            uint64_t used = 0;

            r = mailbox_check(cm, &problem);
            if (r != STORE_OK) {
                fprintf(stderr, "reader: %s\n", buf_cstring(&problem));
                _exit(2);
            }
            if (mailbox_lock(cm, MAILBOX_LOCK_SHARED) != STORE_OK)
                _exit(3);
            h = mailbox_get_header(cm);
            for (i = 0; i < h->visible; i++) {
                if (mailbox_read_record(cm, i, &crec) != STORE_OK)
                    _exit(4);
                if (crec.flags & (MAILBOX_FLAG_PENDING))
                    _exit(5);
                if (crec.flags & (MAILBOX_FLAG_EXPUNGED | MAILBOX_FLAG_ABORTED))
                    continue;
                exists++;
                used += crec.size;
            }
            if (exists != h->exists || used != h->quota_used)
                _exit(6);
            mailbox_unlock(cm);
            rounds++;
            if (read(stop_pipe[0], &c, 1) == 0)
                break;
        }
        _exit(rounds > 0 ? 0 : 7);
    }
    close(stop_pipe[0]);
    for (unsigned i = 1; i <= 30; i++) {
        append(&fx, mb, i, 100 + 7 * i);
        if (i % 5 == 0) {
            assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE),
                             STORE_OK);
            assert_int_equal(mailbox_read_record(mb, 1, &rec), STORE_OK);
            rec.flags |= MAILBOX_FLAG_EXPUNGED;
            assert_int_equal(mailbox_rewrite_record(mb, 1, &rec), STORE_OK);
            assert_int_equal(mailbox_read_record(mb, 0, &rec), STORE_OK);
            rec.flags ^= MAILBOX_FLAG_SEEN;
            assert_int_equal(mailbox_rewrite_record(mb, 0, &rec), STORE_OK);
            if (i % 10 == 0)
                assert_int_equal(mailbox_cleanup(mb), STORE_OK);
            assert_int_equal(mailbox_unlock(mb), STORE_OK);
        }
    }
    close(stop_pipe[1]);
    assert_int_equal(wait_child(pid), 0);
    expect_check_ok(mb);
    mailbox_close(&mb);
    fx_close(&fx);
}

/* A child reserves and dies; damage = 1 truncates the message file first. */
static void dead_appender(struct fx *fx, int damage)
{
    struct mailbox *mb;
    struct mailbox_header h;
    struct mailbox_record rec;
    struct buf path = BUF_INITIALIZER;
    pid_t pid;

    create_mb(fx, TH_D "user.d");
    mb = open_mb(fx, TH_D "user.d");
    append(fx, mb, 1, 300);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct mailbox *cm = NULL;
        struct buf m = BUF_INITIALIZER;

        th_child_signals();
        if (mailbox_open(fx->conf, TH_D "user.d", NULL, &cm) != STORE_OK)
            _exit(1);
        make_message(&m, 2, 5000);
        reserve(fx, cm, &m, MAILBOX_FLAG_FLAGGED);
        _exit(0);   /* no finish */
    }
    assert_int_equal(wait_child(pid), 0);
    mailbox_message_path(mb, 2, &path);
    if (damage)
        assert_int_equal(truncate(buf_cstring(&path), 1000), 0);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    h = *mailbox_get_header(mb);
    assert_int_equal(mailbox_read_record(mb, 1, &rec), STORE_OK);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_int_equal(h.visible, 2);
    assert_int_equal(rec.uid, 2);
    if (damage) {
        assert_int_equal(h.exists, 1);
        assert_true(rec.flags & MAILBOX_FLAG_ABORTED);
        assert_int_equal(access(buf_cstring(&path), F_OK), -1);
    } else {
        assert_int_equal(h.exists, 2);
        assert_int_equal(rec.flags, MAILBOX_FLAG_FLAGGED);
        assert_int_equal(rec.modseq, h.highestmodseq);
        assert_int_equal(access(buf_cstring(&path), F_OK), 0);
    }
    expect_check_ok(mb);
    /* a further append takes the next uid */
    assert_int_equal(append(fx, mb, 3, 100), 3);
    expect_check_ok(mb);
    mailbox_close(&mb);
    buf_free(&path);
}

static void test_recover_commit(void **state)
{
    struct fx fx;

    fx_open(&fx, state, NULL);
    dead_appender(&fx, 0);
    fx_close(&fx);
}

static void test_recover_abort(void **state)
{
    struct fx fx;

    fx_open(&fx, state, NULL);
    dead_appender(&fx, 1);
    fx_close(&fx);
}

/* A live appender in another process is left alone by recovery. */
static void test_live_appender(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    int up[2], down[2];
    pid_t pid;
    char c;

    fx_open(&fx, state, NULL);
    create_mb(&fx, TH_D "user.l");
    mb = open_mb(&fx, TH_D "user.l");
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct mailbox *cm = NULL;
        struct buf m = BUF_INITIALIZER;
        uint32_t uid;

        th_child_signals();
        if (mailbox_open(fx.conf, TH_D "user.l", NULL, &cm) != STORE_OK)
            _exit(1);
        make_message(&m, 5, 800);
        uid = reserve(&fx, cm, &m, 0);
        if (write(up[1], "r", 1) != 1 || read(down[0], &c, 1) != 1)
            _exit(2);
        _exit(mailbox_append_finish(cm, uid) == STORE_OK ? 0 : 3);
    }
    assert_int_equal(read(up[0], &c, 1), 1);
    append(&fx, mb, 6, 300);   /* uid 2, waits behind the child's uid 1 */
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_get_header(mb)->visible, 0);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_int_equal(write(down[1], "g", 1), 1);
    assert_int_equal(wait_child(pid), 0);
    assert_int_equal(header_of(mb).visible, 2);
    assert_int_equal(header_of(mb).exists, 2);
    expect_check_ok(mb);
    mailbox_close(&mb);
    close(up[0]);
    close(up[1]);
    close(down[0]);
    close(down[1]);
    fx_close(&fx);
}

/* An appender killed between its reservation and its finish, after a
 * later append finished behind it: a reader (shared lock) sees the later
 * message without waiting for the next append; the dead one's complete
 * file is committed. */
static void test_reader_dead_appender(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct mailbox_header h;
    uint32_t recno;
    int up[2];
    pid_t pid;
    int status;
    char c;

    fx_open(&fx, state, NULL);
    create_mb(&fx, TH_D "user.k");
    mb = open_mb(&fx, TH_D "user.k");
    assert_int_equal(pipe(up), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct mailbox *cm = NULL;
        struct buf m = BUF_INITIALIZER;

        th_child_signals();
        if (mailbox_open(fx.conf, TH_D "user.k", NULL, &cm) != STORE_OK)
            _exit(1);
        make_message(&m, 5, 800);
        reserve(&fx, cm, &m, 0);
        if (write(up[1], "r", 1) != 1)
            _exit(2);
        for (;;)
            pause();   /* killed before its finish */
    }
    assert_int_equal(read(up[0], &c, 1), 1);
    assert_int_equal(append(&fx, mb, 6, 300), 2);  /* waits behind uid 1 */
    assert_int_equal(header_of(mb).visible, 0);    /* uid 1 is alive */
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    h = header_of(mb);
    assert_int_equal(h.visible, 2);
    assert_int_equal(h.exists, 2);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    assert_int_equal(mailbox_find_uid(mb, 2, &recno), STORE_OK);
    assert_int_equal(mailbox_find_uid(mb, 1, &recno), STORE_OK);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    expect_check_ok(mb);
    mailbox_close(&mb);
    close(up[0]);
    close(up[1]);
    fx_close(&fx);
}

static void fill3(struct fx *fx, const char *name)
{
    struct mailbox *mb;
    struct mailbox_record rec;

    create_mb(fx, name);
    mb = open_mb(fx, name);
    append(fx, mb, 1, 400);
    append(fx, mb, 2, 800);
    append(fx, mb, 3, 1200);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, 2, &rec), STORE_OK);
    rec.flags |= MAILBOX_FLAG_ANSWERED;
    assert_int_equal(mailbox_rewrite_record(mb, 2, &rec), STORE_OK);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    expect_check_ok(mb);
    mailbox_close(&mb);
}

static void expect_repaired(struct fx *fx, const char *name, int flags_kept)
{
    struct mailbox *mb;
    struct mailbox_header h;
    struct mailbox_record rec;
    struct buf report = BUF_INITIALIZER;

    assert_int_equal(mailbox_reconstruct(fx->conf, name, NULL, NULL,
                                         &report), STORE_OK);
    assert_non_null(strstr(buf_cstring(&report), "3 messages"));
    mb = open_mb(fx, name);
    expect_check_ok(mb);
    h = header_of(mb);
    assert_int_equal(h.exists, 3);
    assert_int_equal(h.visible, 3);
    assert_int_equal(h.uidnext, 4);
    assert_int_equal(h.uidvalidity, 777);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, 2, &rec), STORE_OK);
    assert_int_equal(rec.uid, 3);
    if (flags_kept)
        assert_int_equal(rec.flags, MAILBOX_FLAG_ANSWERED);
    assert_string_equal(mailbox_uniqueid(mb), "uid-1");
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_int_equal(append(fx, mb, 9, 100), 4);
    expect_check_ok(mb);
    mailbox_close(&mb);
    buf_free(&report);
}

static void test_damaged_record(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct buf problem = BUF_INITIALIZER;
    char *ip;

    fx_open(&fx, state, NULL);
    fill3(&fx, TH_D "user.x");
    mb = open_mb(&fx, TH_D "user.x");
    ip = index_path(mb);
    flip_byte(ip, HDR_AREA + REC_SIZE * 0 + 17);
    assert_int_equal(mailbox_check(mb, &problem), STORE_CORRUPT);
    assert_non_null(strstr(buf_cstring(&problem), "record 0"));
    mailbox_close(&mb);
    expect_repaired(&fx, TH_D "user.x", 1);
    free(ip);
    buf_free(&problem);
    fx_close(&fx);
}

static void test_damaged_slot(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct buf problem = BUF_INITIALIZER;
    char *ip;

    fx_open(&fx, state, NULL);
    fill3(&fx, TH_D "user.x");
    mb = open_mb(&fx, TH_D "user.x");
    ip = index_path(mb);
    /* one slot: the other (a generation older) still opens */
    flip_byte(ip, 30);
    assert_int_equal(mailbox_check(mb, &problem), STORE_CORRUPT);
    assert_non_null(strstr(buf_cstring(&problem), "slot"));
    mailbox_close(&mb);
    mb = open_mb(&fx, TH_D "user.x");
    mailbox_close(&mb);
    expect_repaired(&fx, TH_D "user.x", 1);

    /* both slots: open refuses, reconstruct rebuilds */
    flip_byte(ip, 30);
    flip_byte(ip, 2048 + 30);
    assert_int_equal(mailbox_open(fx.conf, TH_D "user.x", NULL, &mb),
                     STORE_CORRUPT);
    assert_null(mb);
    assert_int_equal(mailbox_reconstruct(fx.conf, TH_D "user.x", NULL, NULL, NULL),
                     STORE_OK);
    mb = open_mb(&fx, TH_D "user.x");
    expect_check_ok(mb);
    assert_int_equal(header_of(mb).exists, 4);
    /* uidvalidity is lost with both slots: a new one */
    mailbox_close(&mb);
    /* no spool directory at all */
    assert_int_equal(mailbox_reconstruct(fx.conf, TH_D "user.none", NULL, NULL,
                                         NULL), STORE_NOTFOUND);
    free(ip);
    buf_free(&problem);
    fx_close(&fx);
}

static void test_index_lost(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    char *ip;

    fx_open(&fx, state, NULL);
    fill3(&fx, TH_D "user.x");
    mb = open_mb(&fx, TH_D "user.x");
    ip = index_path(mb);
    mailbox_close(&mb);
    assert_int_equal(unlink(ip), 0);
    assert_int_equal(mailbox_open(fx.conf, TH_D "user.x", NULL, &mb),
                     STORE_NOTFOUND);
    assert_int_equal(mailbox_reconstruct(fx.conf, TH_D "user.x", NULL, "uid-1",
                                         NULL), STORE_OK);
    mb = open_mb(&fx, TH_D "user.x");
    expect_check_ok(mb);
    assert_int_equal(header_of(mb).exists, 3);
    assert_int_equal(header_of(mb).uidnext, 4);
    mailbox_close(&mb);
    free(ip);
    fx_close(&fx);
}

/* path DIR/UID. of mb holding the first `keep` bytes of msg. */
static void put_msgfile(struct mailbox *mb, uint32_t uid,
                        const struct buf *msg, size_t keep)
{
    struct buf path = BUF_INITIALIZER;
    int fd;

    mailbox_message_path(mb, uid, &path);
    fd = open(buf_cstring(&path), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(fs_write_all(fd, msg->s, keep), 0);
    close(fd);
    buf_free(&path);
}

static int msgfile_exists(struct mailbox *mb, uint32_t uid)
{
    struct buf path = BUF_INITIALIZER;
    int ok;

    mailbox_message_path(mb, uid, &path);
    ok = access(buf_cstring(&path), F_OK) == 0;
    buf_free(&path);
    return ok;
}

/* mailbox_reconstruct_verified(): the files vouched for by an intact old
 * record or a known message become records (flags kept), the others
 * (torn, empty, complete but unknown) are removed; plain reconstruct
 * still takes every file. */
static void test_reconstruct_verified(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct mailbox_record rec;
    struct mailbox_msginfo info;
    struct mailbox_known known;
    struct buf m4 = BUF_INITIALIZER, m5 = BUF_INITIALIZER;
    uint32_t recno;
    char *sp;

    fx_open(&fx, state, NULL);
    fill3(&fx, TH_D "user.x");
    mb = open_mb(&fx, TH_D "user.x");
    make_message(&m4, 4, 900);
    make_message(&m5, 5, 1500);
    sp = stage(&fx, &m4, &info);
    unlink(sp);
    free(sp);
    known.uid = 4;
    known.size = info.size;
    memcpy(known.digest, info.digest, MAILBOX_DIGEST_LEN);
    put_msgfile(mb, 4, &m4, m4.len);         /* known: taken */
    put_msgfile(mb, 5, &m5, 512);            /* torn */
    put_msgfile(mb, 6, &m5, 0);              /* empty */
    put_msgfile(mb, 7, &m5, m5.len);         /* whole, but nobody's */
    mailbox_close(&mb);

    assert_int_equal(mailbox_reconstruct_verified(fx.conf, TH_D "user.x", NULL,
                                                  &known, 1, NULL), STORE_OK);
    mb = open_mb(&fx, TH_D "user.x");
    expect_check_ok(mb);
    assert_int_equal(header_of(mb).exists, 4);
    assert_true(msgfile_exists(mb, 4));
    assert_false(msgfile_exists(mb, 5));
    assert_false(msgfile_exists(mb, 6));
    assert_false(msgfile_exists(mb, 7));
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    assert_int_equal(mailbox_find_uid(mb, 3, &recno), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, recno, &rec), STORE_OK);
    assert_true(rec.flags & MAILBOX_FLAG_ANSWERED);
    assert_int_equal(mailbox_find_uid(mb, 4, &recno), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, recno, &rec), STORE_OK);
    assert_int_equal(rec.size, m4.len);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);

    /* plain reconstruct: every file */
    put_msgfile(mb, 7, &m5, m5.len);
    mailbox_close(&mb);
    assert_int_equal(mailbox_reconstruct(fx.conf, TH_D "user.x", NULL, NULL,
                                         NULL), STORE_OK);
    mb = open_mb(&fx, TH_D "user.x");
    assert_int_equal(header_of(mb).exists, 5);
    mailbox_close(&mb);
    buf_free(&m4);
    buf_free(&m5);
    fx_close(&fx);
}

static void test_torn_tail(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct stat sb;
    unsigned char junk[REC_SIZE];
    char *ip;
    int fd;

    fx_open(&fx, state, NULL);
    fill3(&fx, TH_D "user.t");
    mb = open_mb(&fx, TH_D "user.t");
    ip = index_path(mb);

    /* a partial record */
    fd = open(ip, O_WRONLY | O_APPEND);
    assert_true(fd >= 0);
    th_fill(junk, sizeof(junk), 3);
    assert_int_equal(write(fd, junk, 60), 60);
    close(fd);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_int_equal(stat(ip, &sb), 0);
    assert_int_equal(sb.st_size, HDR_AREA + 3 * REC_SIZE);

    /* a whole record with a bad checksum beyond num_records */
    fd = open(ip, O_WRONLY | O_APPEND);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
    close(fd);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_get_header(mb)->num_records, 3);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_int_equal(stat(ip, &sb), 0);
    assert_int_equal(sb.st_size, HDR_AREA + 3 * REC_SIZE);
    expect_check_ok(mb);
    assert_int_equal(append(&fx, mb, 4, 100), 4);
    expect_check_ok(mb);
    mailbox_close(&mb);
    free(ip);
    fx_close(&fx);
}

/* A power loss that wrote back a later record's sector but not an
 * earlier one's (two dead appenders, neither synced): the damaged record
 * becomes an aborted placeholder, the intact one after it is verified
 * and committed, and the mailbox takes deliveries again (before: the
 * lock failed with STORE_CORRUPT until reconstruct). */
static void test_torn_gap(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct mailbox_record rec;
    struct buf path = BUF_INITIALIZER;
    unsigned char zero[REC_SIZE];
    char *ip;
    pid_t pid;
    int fd;

    fx_open(&fx, state, NULL);
    create_mb(&fx, TH_D "user.g");
    mb = open_mb(&fx, TH_D "user.g");
    append(&fx, mb, 1, 300);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct mailbox *cm = NULL;
        struct buf m = BUF_INITIALIZER;

        th_child_signals();
        if (mailbox_open(fx.conf, TH_D "user.g", NULL, &cm) != STORE_OK)
            _exit(1);
        make_message(&m, 2, 4000);
        reserve(&fx, cm, &m, 0);
        buf_reset(&m);
        make_message(&m, 3, 5000);
        reserve(&fx, cm, &m, MAILBOX_FLAG_FLAGGED);
        _exit(0);   /* no finish */
    }
    assert_int_equal(wait_child(pid), 0);
    ip = index_path(mb);
    /* uid 2's record never reached the disk */
    memset(zero, 0, sizeof(zero));
    fd = open(ip, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, zero, sizeof(zero), HDR_AREA + REC_SIZE * 1),
                     (ssize_t)sizeof(zero));
    close(fd);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, 1, &rec), STORE_OK);
    assert_int_equal(rec.uid, 2);
    assert_true(rec.flags & MAILBOX_FLAG_ABORTED);
    assert_int_equal(mailbox_read_record(mb, 2, &rec), STORE_OK);
    assert_int_equal(rec.uid, 3);
    assert_int_equal(rec.flags, MAILBOX_FLAG_FLAGGED);
    assert_int_equal(mailbox_get_header(mb)->exists, 2);
    assert_int_equal(mailbox_get_header(mb)->visible, 3);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    mailbox_message_path(mb, 2, &path);
    assert_int_equal(access(buf_cstring(&path), F_OK), -1);
    expect_check_ok(mb);
    assert_int_equal(append(&fx, mb, 4, 100), 4);
    expect_check_ok(mb);
    mailbox_close(&mb);
    buf_free(&path);
    free(ip);
    fx_close(&fx);
}

/* A reserve whose header write was lost: the record beyond num_records is
 * found by recovery (its appender dead) and committed. */
static void test_record_beyond_header(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct mailbox_header h;
    unsigned char area[HDR_AREA];
    char *ip;
    int fd;

    fx_open(&fx, state, NULL);
    create_mb(&fx, TH_D "user.b");
    mb = open_mb(&fx, TH_D "user.b");
    append(&fx, mb, 1, 300);
    ip = index_path(mb);
    fd = open(ip, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, area, sizeof(area), 0), (ssize_t)sizeof(area));
    mailbox_close(&mb);
    {
        pid_t pid = fork();

        assert_true(pid >= 0);
        if (pid == 0) {
            struct mailbox *cm = NULL;
            struct buf m = BUF_INITIALIZER;

            th_child_signals();
            if (mailbox_open(fx.conf, TH_D "user.b", NULL, &cm) != STORE_OK)
                _exit(1);
            make_message(&m, 2, 700);
            reserve(&fx, cm, &m, 0);
            _exit(0);
        }
        assert_int_equal(wait_child(pid), 0);
    }
    /* put the header area back as it was before the reservation */
    assert_int_equal(pwrite(fd, area, sizeof(area), 0), (ssize_t)sizeof(area));
    close(fd);
    mb = open_mb(&fx, TH_D "user.b");
    assert_int_equal(header_of(mb).num_records, 1);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    h = *mailbox_get_header(mb);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_int_equal(h.num_records, 2);
    assert_int_equal(h.visible, 2);
    assert_int_equal(h.exists, 2);
    assert_int_equal(h.uidnext, 3);
    expect_check_ok(mb);
    mailbox_close(&mb);
    free(ip);
    fx_close(&fx);
}

/* A writer dies in the middle of flag changes (exclusive lock, records
 * rewritten, no unlock): the next exclusive locker recomputes. */
static void test_dirty_recompute(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct mailbox_header h0, h;
    pid_t pid;

    fx_open(&fx, state, NULL);
    fill3(&fx, TH_D "user.y");
    mb = open_mb(&fx, TH_D "user.y");
    h0 = header_of(mb);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct mailbox *cm = NULL;
        struct mailbox_record rec;

        th_child_signals();
        if (mailbox_open(fx.conf, TH_D "user.y", NULL, &cm) != STORE_OK ||
            mailbox_lock(cm, MAILBOX_LOCK_EXCLUSIVE) != STORE_OK ||
            mailbox_read_record(cm, 1, &rec) != STORE_OK)
            _exit(1);
        rec.flags |= MAILBOX_FLAG_EXPUNGED;
        if (mailbox_rewrite_record(cm, 1, &rec) != STORE_OK)
            _exit(2);
        _exit(0);   /* no unlock: the header still counts 3 */
    }
    assert_int_equal(wait_child(pid), 0);
    assert_int_equal(header_of(mb).exists, 3);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    h = *mailbox_get_header(mb);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_int_equal(h.exists, 2);
    assert_true(h.quota_used < h0.quota_used);
    assert_true(h.highestmodseq > h0.highestmodseq);
    expect_check_ok(mb);
    mailbox_close(&mb);
    fx_close(&fx);
}

/* The header of a finish reached the disk, the record rewrite did not:
 * the record inside the visible prefix still says PENDING (modseq 0). */
static void test_lost_finish_write(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct mailbox_record rec;
    struct buf m = BUF_INITIALIZER;
    unsigned char saved[REC_SIZE];
    uint32_t uid;
    char *ip;
    int fd;

    fx_open(&fx, state, NULL);
    create_mb(&fx, TH_D "user.w");
    mb = open_mb(&fx, TH_D "user.w");
    append(&fx, mb, 1, 200);
    make_message(&m, 2, 300);
    uid = reserve(&fx, mb, &m, 0);
    ip = index_path(mb);
    fd = open(ip, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, saved, sizeof(saved), HDR_AREA + REC_SIZE),
                     (ssize_t)sizeof(saved));
    assert_int_equal(mailbox_append_finish(mb, uid), STORE_OK);
    assert_int_equal(pwrite(fd, saved, sizeof(saved), HDR_AREA + REC_SIZE),
                     (ssize_t)sizeof(saved));
    close(fd);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, 1, &rec), STORE_OK);
    assert_int_equal(rec.flags & MAILBOX_FLAG_PENDING, 0);
    assert_int_equal(rec.modseq, 0);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    expect_check_ok(mb);   /* tolerated beyond `synced` */
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_get_header(mb)->exists, 2);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    fd = open(ip, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, saved, sizeof(saved), HDR_AREA + REC_SIZE),
                     (ssize_t)sizeof(saved));
    close(fd);
    /* repaired on disk: PENDING gone, a modseq given */
    assert_int_equal(saved[4 + 2] & 0x02, 0);
    assert_true(saved[40] != 0);
    expect_check_ok(mb);
    mailbox_close(&mb);
    buf_free(&m);
    free(ip);
    fx_close(&fx);
}

static void test_quota(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct mailbox_record rec;
    struct quota_db *q = NULL;
    struct quota qt;
    uint64_t total = 0;

    fx_open(&fx, state, NULL);
    create_mb(&fx, TH_D "user.q");
    create_mb(&fx, TH_D "user.q.sub");
    assert_int_equal(quota_open(fx.conf, &q), STORE_OK);
    assert_int_equal(quota_set(q, TH_D "user.q", 1000, 100), STORE_OK);
    mb = open_mb(&fx, TH_D "user.q.sub");
    append(&fx, mb, 1, 500);
    append(&fx, mb, 2, 700);
    total = header_of(mb).quota_used;
    assert_int_equal(quota_get(q, TH_D "user.q", &qt), STORE_OK);
    assert_int_equal(qt.used_messages, 2);
    assert_int_equal(qt.used_bytes, total);

    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, 0, &rec), STORE_OK);
    rec.flags |= MAILBOX_FLAG_EXPUNGED;
    assert_int_equal(mailbox_rewrite_record(mb, 0, &rec), STORE_OK);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_int_equal(quota_get(q, TH_D "user.q", &qt), STORE_OK);
    assert_int_equal(qt.used_messages, 1);
    assert_int_equal(qt.used_bytes, total - rec.size);

    /* reconstruct recomputes the mailbox's usage */
    mailbox_close(&mb);
    assert_int_equal(mailbox_reconstruct(fx.conf, TH_D "user.q.sub", NULL, NULL,
                                         NULL), STORE_OK);
    assert_int_equal(quota_get(q, TH_D "user.q", &qt), STORE_OK);
    assert_int_equal(qt.used_messages, 1);
    quota_close(&q);
    fx_close(&fx);
}

/* mailbox_append_finish_many(): several mailboxes, one of them twice, a
 * bad pair that does not stop the others, quota told for all. */
static void test_finish_many(void **state)
{
    struct fx fx;
    struct mailbox *m1, *m2, *m3, *mbs[6];
    struct buf m = BUF_INITIALIZER;
    struct quota_db *q = NULL;
    struct quota qt;
    uint32_t uids[6], x;
    uint64_t s1 = 0, s2 = 0;
    int rs[6], i;

    fx_open(&fx, state, NULL);
    create_mb(&fx, TH_D "user.m1");
    create_mb(&fx, TH_D "user.m2");
    create_mb(&fx, TH_D "shared.m3");
    assert_int_equal(quota_shared(fx.conf, &q), STORE_OK);
    assert_int_equal(quota_set(q, TH_D "user", -1, -1), STORE_OK);
    m1 = open_mb(&fx, TH_D "user.m1");
    m2 = open_mb(&fx, TH_D "user.m2");
    m3 = open_mb(&fx, TH_D "shared.m3");

    make_message(&m, 10, 300);
    x = reserve(&fx, m2, &m, 0);   /* older pending append, not finished */
    s2 += m.len;
    make_message(&m, 11, 400);
    mbs[0] = m1;
    uids[0] = reserve(&fx, m1, &m, 0);
    s1 += m.len;
    make_message(&m, 12, 500);
    mbs[1] = m2;
    uids[1] = reserve(&fx, m2, &m, 0);
    s2 += m.len;
    make_message(&m, 13, 600);
    mbs[2] = m1;
    uids[2] = reserve(&fx, m1, &m, 0);
    s1 += m.len;
    make_message(&m, 14, 700);
    mbs[3] = m3;
    uids[3] = reserve(&fx, m3, &m, 0);
    mbs[4] = NULL;
    uids[4] = 1;
    mbs[5] = m2;
    uids[5] = 999;   /* not a pending append of ours */

    assert_int_equal(mailbox_append_finish_many(mbs, uids, 0, rs), STORE_OK);
    for (i = 0; i < 6; i++)
        rs[i] = -12345;
    assert_int_equal(mailbox_append_finish_many(mbs, uids, 6, rs),
                     STORE_INTERNAL);
    assert_int_equal(rs[0], STORE_OK);
    assert_int_equal(rs[1], STORE_OK);
    assert_int_equal(rs[2], STORE_OK);
    assert_int_equal(rs[3], STORE_OK);
    assert_int_equal(rs[4], STORE_INTERNAL);
    assert_int_equal(rs[5], STORE_NOTFOUND);
    assert_int_equal(header_of(m1).exists, 2);
    assert_int_equal(header_of(m1).quota_used, s1);
    assert_int_equal(header_of(m1).visible, 2);
    assert_int_equal(header_of(m3).exists, 1);
    assert_int_equal(header_of(m2).visible, 0);   /* behind x */
    assert_int_equal(quota_get(q, TH_D "user", &qt), STORE_OK);
    assert_int_equal(qt.used_bytes, s1);
    assert_int_equal(qt.used_messages, 2);
    /* finished twice: the second time it is no longer pending */
    assert_int_equal(mailbox_append_finish_many(mbs, uids, 1, rs),
                     STORE_NOTFOUND);

    /* x through the same call: both of m2's messages enter quota */
    mbs[0] = m2;
    uids[0] = x;
    assert_int_equal(mailbox_append_finish_many(mbs, uids, 1, NULL),
                     STORE_OK);
    assert_int_equal(header_of(m2).exists, 2);
    assert_int_equal(header_of(m2).quota_used, s2);
    assert_int_equal(quota_shared(fx.conf, &q), STORE_OK);
    assert_int_equal(quota_get(q, TH_D "user", &qt), STORE_OK);
    assert_int_equal(qt.used_bytes, s1 + s2);
    assert_int_equal(qt.used_messages, 4);

    /* a handle the caller holds locked is refused, nothing happens */
    make_message(&m, 15, 300);
    uids[0] = reserve(&fx, m2, &m, 0);
    assert_int_equal(mailbox_lock(m2, MAILBOX_LOCK_SHARED), STORE_OK);
    assert_int_equal(mailbox_append_finish_many(mbs, uids, 1, rs),
                     STORE_INTERNAL);
    assert_int_equal(mailbox_unlock(m2), STORE_OK);
    assert_int_equal(mailbox_append_finish_many(mbs, uids, 1, rs), STORE_OK);
    assert_int_equal(header_of(m2).exists, 3);

    for (i = 0; i < 3; i++) {
        struct mailbox *mb = i == 0 ? m1 : i == 1 ? m2 : m3;

        assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
        expect_check_ok(mb);
        assert_int_equal(mailbox_unlock(mb), STORE_OK);
    }
    mailbox_close(&m1);
    mailbox_close(&m2);
    mailbox_close(&m3);
    buf_free(&m);
    fx_close(&fx);
}

/* mailbox_restore_counters(): the uidvalidity of an empty mailbox, uidnext
 * and highestmodseq raised (never lowered), durable; appends continue
 * from there */
static void test_restore_counters(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct mailbox_header h;
    struct mailbox_record rec;

    fx_open(&fx, state, NULL);
    create_mb(&fx, TH_D "user.a");
    mb = open_mb(&fx, TH_D "user.a");
    assert_int_equal(mailbox_restore_counters(mb, 4242, 50, 900),
                     STORE_INTERNAL);              /* not locked */
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_restore_counters(mb, 4242, 50, 900), STORE_OK);
    assert_int_equal(mailbox_restore_counters(mb, 0, 10, 5), STORE_OK);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    mailbox_close(&mb);
    mb = open_mb(&fx, TH_D "user.a");             /* from the file */
    h = header_of(mb);
    assert_int_equal(h.uidvalidity, 4242);
    assert_int_equal(h.uidnext, 50);
    assert_int_equal(h.highestmodseq, 900);
    assert_int_equal(h.deletedmodseq, 900);
    assert_int_equal(append(&fx, mb, 1, 300), 50);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, 0, &rec), STORE_OK);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_int_equal(rec.uid, 50);
    assert_int_equal(rec.modseq, 901);
    /* a gap: uidnext raised between two appends */
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_restore_counters(mb, 4242, 60, 0), STORE_OK);
    assert_int_equal(mailbox_restore_counters(mb, 7, 0, 0), STORE_EXISTS);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_int_equal(append(&fx, mb, 2, 300), 60);
    h = header_of(mb);
    assert_int_equal(h.uidvalidity, 4242);
    assert_int_equal(h.exists, 2);
    expect_check_ok(mb);
    mailbox_close(&mb);
    fx_close(&fx);
}

/* Flag changes without a sync (spool_sync_flags off, the default), then a
 * power loss that kept a record rewrite but not the header written after
 * it: the index header predates the record's modseq.  A locker of the
 * same boot finds no trace of it (the page cache is never like that); a
 * locker of the next boot (CYRUSDELIVER_BOOT_ID stands for the kernel's)
 * sees the boot stamp of the unsynced changes and recomputes. */
static int flag_child(struct fx *fx, const char *name, const char *boot,
                      uint32_t recno, int *unsynced_r)
{
    struct mailbox *cm = NULL;
    struct mailbox_record rec;
    int r;

    setenv("CYRUSDELIVER_BOOT_ID", boot, 1);
    if (mailbox_open(fx->conf, name, NULL, &cm) != STORE_OK ||
        mailbox_lock(cm, MAILBOX_LOCK_EXCLUSIVE) != STORE_OK ||
        mailbox_read_record(cm, recno, &rec) != STORE_OK)
        return 1;
    rec.flags ^= MAILBOX_FLAG_FLAGGED;
    if (mailbox_rewrite_record(cm, recno, &rec) != STORE_OK)
        return 2;
    r = mailbox_unlock(cm);
    if (r != STORE_OK)
        return 3;
    if (unsynced_r)
        *unsynced_r = mailbox_unsynced(cm);
    return 0;
}

static void test_flag_restart(void **state)
{
    struct fx fx;
    struct mailbox *mb;
    struct mailbox_header h1, h;
    unsigned char area[HDR_AREA];
    char *ipath;
    pid_t pid;
    int fd;

    fx_open(&fx, state, NULL);
    fill3(&fx, TH_D "user.fr");
    mb = open_mb(&fx, TH_D "user.fr");
    ipath = index_path(mb);
    /* the first change of the boot: the stamp, synced */
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int unsynced = 0;

        th_child_signals();
        if (flag_child(&fx, TH_D "user.fr", "boot-a", 0, &unsynced))
            _exit(1);
        _exit(unsynced ? 0 : 4);   /* left for the next sync */
    }
    assert_int_equal(wait_child(pid), 0);
    h1 = header_of(mb);
    fd = open(ipath, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, area, sizeof(area), 0), (ssize_t)sizeof(area));
    /* a second change of the same boot: record and header in the page
     * cache only */
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        th_child_signals();
        _exit(flag_child(&fx, TH_D "user.fr", "boot-a", 2, NULL));
    }
    assert_int_equal(wait_child(pid), 0);
    assert_true(header_of(mb).highestmodseq > h1.highestmodseq);
    /* the power loss: the header writes of the second change are lost,
     * its record write is not */
    assert_int_equal(pwrite(fd, area, sizeof(area), 0), (ssize_t)sizeof(area));
    close(fd);
    mailbox_close(&mb);
    /* the next boot: the first exclusive lock recomputes */
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct mailbox *cm = NULL;
        struct buf problem = BUF_INITIALIZER;

        th_child_signals();
        setenv("CYRUSDELIVER_BOOT_ID", "boot-b", 1);
        if (mailbox_open(fx.conf, TH_D "user.fr", NULL, &cm) != STORE_OK)
            _exit(1);
        if (mailbox_check(cm, &problem) == STORE_OK)
            _exit(2);   /* the simulated loss did not happen */
        if (mailbox_lock(cm, MAILBOX_LOCK_EXCLUSIVE) != STORE_OK)
            _exit(3);
        h = *mailbox_get_header(cm);
        if (mailbox_unlock(cm) != STORE_OK)
            _exit(4);
        if (h.highestmodseq <= h1.highestmodseq || h.exists != 3) {
            print_message("highestmodseq %llu (before %llu) exists %u\n",
                          (unsigned long long)h.highestmodseq,
                          (unsigned long long)h1.highestmodseq, h.exists);
            _exit(5);
        }
        buf_reset(&problem);
        if (mailbox_check(cm, &problem) != STORE_OK) {
            print_message("check: %s\n", buf_cstring(&problem));
            _exit(6);
        }
        _exit(0);
    }
    assert_int_equal(wait_child(pid), 0);
    free(ipath);
    fx_close(&fx);
}

int main(void)
{
    static const struct th_case cases[] = {
        { "create_open", test_create_open },
        { "hashed_spool", test_hashed_spool },
        { "append", test_append },
        { "visible_order", test_visible_order },
        { "flags_expunge", test_flags_expunge },
        { "cleanup", test_cleanup },
        { "concurrent_reader", test_concurrent_reader },
        { "recover_commit", test_recover_commit },
        { "recover_abort", test_recover_abort },
        { "live_appender", test_live_appender },
        { "damaged_record", test_damaged_record },
        { "damaged_slot", test_damaged_slot },
        { "index_lost", test_index_lost },
        { "reconstruct_verified", test_reconstruct_verified },
        { "torn_tail", test_torn_tail },
        { "torn_gap", test_torn_gap },
        { "record_beyond_header", test_record_beyond_header },
        { "dirty_recompute", test_dirty_recompute },
        { "lost_finish_write", test_lost_finish_write },
        { "quota", test_quota },
        { "finish_many", test_finish_many },
        { "restore_counters", test_restore_counters },
        { "reader_dead_appender", test_reader_dead_appender },
        { "flag_restart", test_flag_restart },
    };

    return th_run_per_backend("mailbox", cases,
                              sizeof(cases) / sizeof(cases[0]));
}
